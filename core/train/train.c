/* train.c: the training replica (include/grove/train.h): a private tree
 * built from a model.json text and a copy of a state_dict, its parameters'
 * gradients, the tape of its training forward and the reverse walk over it.
 *
 * The training forward does not go through the serving forward of each
 * module: the ops in backward_*.c compute train-mode results (batch
 * statistics, active dropout) from the parameter tensors themselves and push
 * the nodes backward needs.  They read their settings (a LeakyReLU's slope,
 * a conv's padding) from a grove__tinfo per module, filled here once from
 * the module the serving builder made (grove__layer_settings_of: the layers'
 * accessors in nn/), so model.json is decoded once, by the builders.  The serving forward runs on the
 * replica only for grove_replica_evaluate, after every module's refresh
 * has re-derived its packed weights from the trained parameters.
 *
 * Memory: everything a step makes (activations, saved tensors, gradients of
 * activations) lives in the replica's arena, reset by the next forward; the
 * var and node lists are heap arrays that keep their capacity.  Parameter
 * gradients are heap tensors, allocated on first use and dropped by
 * zero_grad(set_to_none). */
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backward.h"
#include "graph.h"
#include "graph_internal.h"
#include "layers_internal.h"

/* ------------------------------------------------------------ generator */

/* Seeds the tape's xoshiro256** state (tape.c) from one 64-bit seed. */
static uint64_t splitmix64(uint64_t *x) {
  uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* ============================================================ settings */

static grove_status unsupported(const char *path, const char *type, const char *why,
                                grove_err *err) {
  return grove_err_set(err, GROVE_E_UNSUPPORTED, "training: %s%s%s (%s) %s", *path ? "'" : "",
                       *path ? path : "the root module", *path ? "'" : "", type, why);
}

static grove__train_fn train_fn(grove__tkind k);

static grove_status add_info(grove_replica *r, const grove_module *m, const grove__tinfo *src,
                             const char *path, grove_err *err) {
  if (r->nowned == r->owned_cap) {
    size_t cap = r->owned_cap ? r->owned_cap * 2 : 32;
    grove__tinfo **o = realloc(r->owned, cap * sizeof *o);
    if (!o) return grove_err_set(err, GROVE_E_NOMEM, "out of memory building the training replica");
    r->owned = o;
    r->owned_cap = cap;
  }
  grove__tinfo *info = malloc(sizeof *info);
  char *p = grove__strdup(path);
  if (!info || !p) {
    free(info);
    free(p);
    return grove_err_set(err, GROVE_E_NOMEM, "out of memory building the training replica");
  }
  *info = *src;
  info->path = p;
  info->fn = train_fn(info->kind);
  r->owned[r->nowned++] = info; /* owned from here on, graph included */
  if (!grove__pmap_put(&r->infos, m, info))
    return grove_err_set(err, GROVE_E_NOMEM, "out of memory building the training replica");
  return GROVE_OK;
}

static char *child_path(const char *path, const char *name) {
  return *path ? grove__asprintf("%s.%s", path, name) : grove__strdup(name);
}

static grove_status visit(grove_replica *r, const grove_module *m, const char *path,
                          grove_err *err);

/* Children built by a composite layer (no JSON of their own) get their
 * settings from the layer. */
static grove_status visit_fixed(grove_replica *r, const grove_module *m, const char *name,
                                const grove__tinfo *info, const char *path, grove_err *err) {
  const grove_module *c = grove_module_child(m, name);
  if (!c) return GROVE_OK;
  char *cp = child_path(path, name);
  if (!cp) return grove_err_set(err, GROVE_E_NOMEM, "out of memory");
  grove_status s = add_info(r, c, info, cp, err);
  if (!s && info->kind == GROVE__TK_MHA) {
    grove__tinfo lin = {.kind = GROVE__TK_LINEAR};
    s = visit_fixed(r, c, "out_proj", &lin, cp, err);
  }
  free(cp);
  return s;
}

static grove_status visit_tel(grove_replica *r, const grove_module *m, const grove__tinfo *tel,
                              const char *path, grove_err *err) {
  grove__tinfo mha = {.kind = GROVE__TK_MHA,
                      .embed_dim = tel->embed_dim,
                      .num_heads = tel->num_heads,
                      .p = tel->p,
                      .batch_first = tel->batch_first};
  grove__tinfo lin = {.kind = GROVE__TK_LINEAR};
  grove__tinfo ln = {.kind = GROVE__TK_LAYER_NORM,
                     .eps = tel->ln_eps,
                     .affine = true,
                     .ln_ndim = 1,
                     .ln_shape = {tel->embed_dim}};
  grove__tinfo drop = {.kind = GROVE__TK_DROPOUT, .p = tel->p};
  grove_status s = visit_fixed(r, m, "self_attn", &mha, path, err);
  if (!s) s = visit_fixed(r, m, "linear1", &lin, path, err);
  if (!s) s = visit_fixed(r, m, "dropout", &drop, path, err);
  if (!s) s = visit_fixed(r, m, "linear2", &lin, path, err);
  if (!s) s = visit_fixed(r, m, "norm1", &ln, path, err);
  if (!s) s = visit_fixed(r, m, "norm2", &ln, path, err);
  if (!s) s = visit_fixed(r, m, "dropout1", &drop, path, err);
  if (!s) s = visit_fixed(r, m, "dropout2", &drop, path, err);
  return s;
}

/* m's kind and settings: the settings are the ones m's builder read from
 * model.json and keeps in its impl (grove__layer_settings_of, nn/). */
static grove_status decode(const grove_module *m, const char *path, grove__tinfo *info,
                           grove_err *err) {
  const grove_module_type *ty = m->type;
  const char *T = ty->name;
  memset(info, 0, sizeof *info);
  grove__layer_settings_of(m, &info->set);
  static const struct {
    const grove_module_type *type;
    grove__tkind kind;
  } kinds[] = {
      {&grove__sequential_type, GROVE__TK_SEQUENTIAL},
      {&grove__module_list_type, GROVE__TK_HOLDER},
      {&grove__module_dict_type, GROVE__TK_HOLDER},
      {&grove__linear_type, GROVE__TK_LINEAR},
      {&grove__identity_type, GROVE__TK_IDENTITY},
      {&grove__flatten_type, GROVE__TK_FLATTEN},
      {&grove__dropout_type, GROVE__TK_DROPOUT},
      {&grove__relu_type, GROVE__TK_RELU},
      {&grove__leaky_relu_type, GROVE__TK_LEAKY_RELU},
      {&grove__gelu_type, GROVE__TK_GELU},
      {&grove__silu_type, GROVE__TK_SILU},
      {&grove__sigmoid_type, GROVE__TK_SIGMOID},
      {&grove__tanh_type, GROVE__TK_TANH},
      {&grove__softmax_type, GROVE__TK_SOFTMAX},
      {&grove__log_softmax_type, GROVE__TK_LOG_SOFTMAX},
      {&grove__batch_norm1d_type, GROVE__TK_BATCH_NORM},
      {&grove__batch_norm2d_type, GROVE__TK_BATCH_NORM},
      {&grove__layer_norm_type, GROVE__TK_LAYER_NORM},
      {&grove__embedding_type, GROVE__TK_EMBEDDING},
      {&grove__conv1d_type, GROVE__TK_CONV},
      {&grove__conv2d_type, GROVE__TK_CONV},
      {&grove__max_pool2d_type, GROVE__TK_MAX_POOL2D},
      {&grove__avg_pool2d_type, GROVE__TK_AVG_POOL2D},
      {&grove__adaptive_avg_pool2d_type, GROVE__TK_ADAPTIVE_AVG_POOL2D},
      {&grove__mha_type, GROVE__TK_MHA},
      {&grove__tel_type, GROVE__TK_TEL},
      {&grove__te_type, GROVE__TK_TE},
  };
  for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++)
    if (kinds[i].type == ty) info->kind = kinds[i].kind;
  if (grove__is_graph(m))
    info->kind = ((const graph_impl *)m->impl)->compiled ? GROVE__TK_GRAPH : GROVE__TK_HOLDER;
  if (!info->kind) return unsupported(path, T, "is not a module type Grove can train", err);
  if (info->kind == GROVE__TK_MHA && info->mha_extras)
    return unsupported(path, T,
                       "with add_bias_kv, add_zero_attn or kdim/vdim other than embed_dim "
                       "cannot be trained (serving runs it)",
                       err);
  if (info->kind == GROVE__TK_EMBEDDING && info->sparse)
    return unsupported(path, T,
                       "has sparse=True: Grove's gradients are dense (export with "
                       "sparse=False; the update is the same)",
                       err);
  return GROVE_OK;
}

static grove_status visit(grove_replica *r, const grove_module *m, const char *path,
                          grove_err *err) {
  if (!m) return GROVE_OK;
  bool found;
  grove__pmap_get(&r->infos, m, &found);
  if (found) return GROVE_OK; /* shared: seen at its first path */
  grove__tinfo info;
  grove_status s = decode(m, path, &info, err);
  if (!s && info.kind == GROVE__TK_GRAPH) {
    if ((s = grove__tgraph_compile(&info, m, err))) return s;
    if ((s = add_info(r, m, &info, path, err))) {
      /* add_info owns the graph only once it holds the copy. */
      bool held = r->nowned && r->owned[r->nowned - 1]->graph == info.graph;
      if (!held) grove__tgraph_free(info.graph);
      return s;
    }
  } else if (!s) {
    s = add_info(r, m, &info, path, err);
  }
  if (s) return s;
  switch (info.kind) {
    case GROVE__TK_MHA: {
      grove__tinfo lin = {.kind = GROVE__TK_LINEAR};
      return visit_fixed(r, m, "out_proj", &lin, path, err);
    }
    case GROVE__TK_TEL:
      return visit_tel(r, m, &info, path, err);
    case GROVE__TK_TE: {
      grove__tinfo holder = {.kind = GROVE__TK_HOLDER};
      const grove_module *layers = grove_module_child(m, "layers");
      char *lp = child_path(path, "layers");
      if (!lp) return grove_err_set(err, GROVE_E_NOMEM, "out of memory");
      s = layers ? add_info(r, layers, &holder, lp, err) : GROVE_OK;
      for (size_t i = 0; !s && layers && i < layers->nchildren; i++) {
        /* Each layer is a TransformerEncoderLayer its builder made. */
        const grove_module *lm = layers->children[i].module;
        grove__tinfo tel;
        char *cp = child_path(lp, layers->children[i].name);
        if (!cp) s = grove_err_set(err, GROVE_E_NOMEM, "out of memory");
        if (!s) s = decode(lm, cp, &tel, err);
        if (!s) s = add_info(r, lm, &tel, cp, err);
        if (!s) s = visit_tel(r, lm, &tel, cp, err);
        free(cp);
      }
      free(lp);
      const grove_module *norm = grove_module_child(m, "norm");
      if (!s && norm) {
        char *np = child_path(path, "norm");
        if (!np) return grove_err_set(err, GROVE_E_NOMEM, "out of memory");
        s = visit(r, norm, np, err);
        free(np);
      }
      return s;
    }
    default:
      break;
  }
  /* Containers and graphs: their children. */
  for (size_t i = 0; !s && i < m->nchildren; i++) {
    char *cp = child_path(path, m->children[i].name);
    if (!cp) return grove_err_set(err, GROVE_E_NOMEM, "out of memory");
    s = visit(r, m->children[i].module, cp, err);
    free(cp);
  }
  return s;
}

/* ============================================================ dispatch */

static grove__train_fn train_fn(grove__tkind k) {
  switch (k) {
    case GROVE__TK_LINEAR:
      return grove__tf_linear;
    case GROVE__TK_RELU:
    case GROVE__TK_LEAKY_RELU:
    case GROVE__TK_GELU:
    case GROVE__TK_SILU:
    case GROVE__TK_SIGMOID:
    case GROVE__TK_TANH:
      return grove__tf_activation;
    case GROVE__TK_SOFTMAX:
    case GROVE__TK_LOG_SOFTMAX:
      return grove__tf_softmax;
    case GROVE__TK_FLATTEN:
      return grove__tf_flatten;
    case GROVE__TK_DROPOUT:
      return grove__tf_dropout;
    case GROVE__TK_EMBEDDING:
      return grove__tf_embedding;
    case GROVE__TK_BATCH_NORM:
      return grove__tf_batch_norm;
    case GROVE__TK_LAYER_NORM:
      return grove__tf_layer_norm;
    case GROVE__TK_CONV:
      return grove__tf_conv;
    case GROVE__TK_MAX_POOL2D:
    case GROVE__TK_AVG_POOL2D:
    case GROVE__TK_ADAPTIVE_AVG_POOL2D:
      return grove__tf_pool;
    case GROVE__TK_MHA:
      return grove__tf_mha;
    case GROVE__TK_TEL:
      return grove__tf_tel;
    case GROVE__TK_TE:
      return grove__tf_te;
    case GROVE__TK_GRAPH:
      return grove__tf_graph;
    default:
      return NULL;
  }
}

/* ============================================================ lifecycle */

grove_status grove__refresh_tree(grove_module *root, grove_err *err) {
  grove_named_modules mods = {0};
  grove_status s = grove_module_named_modules(root, "", true, &mods, err);
  for (size_t i = mods.n; !s && i-- > 0;) {
    grove_module *mm = mods.items[i].module;
    if (mm->type->refresh) s = mm->type->refresh(mm, err);
  }
  grove_named_modules_fini(&mods);
  return s;
}

void grove_replica_free(grove_replica *r) {
  if (!r) return;
  for (size_t i = 0; i < r->nowned; i++) {
    if (r->owned[i]->kind == GROVE__TK_GRAPH) grove__tgraph_free(r->owned[i]->graph);
    free((char *)r->owned[i]->path);
    free(r->owned[i]);
  }
  free(r->owned);
  grove__pmap_fini(&r->infos);
  for (size_t i = 0; i < r->params.n; i++) {
    grove_tensor_release(r->grads[i]);
    if (r->spare) grove_tensor_release(r->spare[i]);
  }
  free(r->grads);
  free(r->spare);
  grove_named_tensors_fini(&r->params);
  grove__pmap_fini(&r->param_index);
  free(r->tape.vars);
  free(r->tape.nodes);
  free(r->tape.ws);
  grove_arena_free(r->tape.arena);
  grove_model_free(r->model);
  free(r);
}

grove_status grove_replica_new(const char *model_json, const char *origin,
                               const grove_state_dict *weights, const grove_replica_opts *opts,
                               grove_replica **out, grove_err *err) {
  *out = NULL;
  if (!origin) origin = "model.json";
  grove_replica *r = calloc(1, sizeof *r);
  if (!r) return grove_err_set(err, GROVE_E_NOMEM, "out of memory building the training replica");
  if (opts) r->opts = *opts;
  uint64_t sm = r->opts.seed;
  for (int i = 0; i < 4; i++) r->rng[i] = splitmix64(&sm);
  r->tape.r = r;
  grove_status s = grove_model_from_spec(model_json, origin, &r->model, err);
  if (!s && weights) {
    grove_load_opts lo = {.strict = !r->opts.non_strict, .assign = false};
    s = grove_module_load_state_dict(r->model->root, weights, &lo, NULL, err);
  }
  if (!s) s = visit(r, r->model->root, "", err);
  if (!s) s = grove_module_named_parameters(r->model->root, "", true, true, &r->params, err);
  if (!s && r->params.n &&
      (!(r->grads = calloc(r->params.n, sizeof *r->grads)) ||
       !(r->spare = calloc(r->params.n, sizeof *r->spare))))
    s = grove_err_set(err, GROVE_E_NOMEM, "out of memory building the training replica");
  for (size_t i = 0; !s && i < r->params.n; i++) {
    const grove_tensor *p = r->params.items[i].tensor;
    if (p->dtype != GROVE_F32 || !grove_tensor_is_contiguous(p))
      s = grove_err_set(err, GROVE_E_UNSUPPORTED,
                        "training: parameter %s is not a contiguous float32 tensor",
                        r->params.items[i].name);
    else if (!grove__pmap_put(&r->param_index, p, (void *)(uintptr_t)(i + 1)))
      s = grove_err_set(err, GROVE_E_NOMEM, "out of memory building the training replica");
  }
  if (!s && !(r->tape.arena = grove_arena_new(1 << 20)))
    s = grove_err_set(err, GROVE_E_NOMEM, "out of memory building the training replica");
  if (s) {
    grove_replica_free(r);
    return s;
  }
  grove_module_train(r->model->root, true);
  *out = r;
  return GROVE_OK;
}

grove_module *grove_replica_root(const grove_replica *r) {
  return r->model->root;
}
const grove_model *grove_replica_model(const grove_replica *r) {
  return r->model;
}
size_t grove_replica_num_params(const grove_replica *r) {
  return r->params.n;
}
const char *grove_replica_param_name(const grove_replica *r, size_t i) {
  return i < r->params.n ? r->params.items[i].name : NULL;
}
grove_tensor *grove_replica_param(const grove_replica *r, size_t i) {
  return i < r->params.n ? r->params.items[i].tensor : NULL;
}
grove_tensor *grove_replica_grad(const grove_replica *r, size_t i) {
  return i < r->params.n ? r->grads[i] : NULL;
}
grove_tensor *const *grove_replica_grads(const grove_replica *r) {
  return r->grads;
}

void grove_replica_zero_grad(grove_replica *r, bool set_to_none) {
  for (size_t i = 0; i < r->params.n; i++) {
    if (!r->grads[i]) continue;
    if (set_to_none) {
      /* None, as torch; the memory is kept for the next backward unless
       * someone else still holds the tensor. */
      if (__atomic_load_n(&r->grads[i]->refcount, __ATOMIC_ACQUIRE) == 1 && !r->spare[i]) {
        r->spare[i] = r->grads[i];
      } else {
        grove_tensor_release(r->grads[i]);
      }
      r->grads[i] = NULL;
    } else {
      memset(r->grads[i]->data, 0, grove_tensor_nbytes(r->grads[i]));
    }
  }
}

/* Sum of squares in double.  With AVX2 (checked at run time) four chains of
 * four doubles; the baseline SSE2 loop the compiler makes of the portable
 * one kept its partial sums in memory and took 5-8% of an MLP's step. */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
__attribute__((target("avx2,fma"))) static double sumsq_avx2(const float *g, int64_t n) {
  __m256d a0 = _mm256_setzero_pd(), a1 = a0, a2 = a0, a3 = a0;
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) {
    __m256d v0 = _mm256_cvtps_pd(_mm_loadu_ps(g + j));
    __m256d v1 = _mm256_cvtps_pd(_mm_loadu_ps(g + j + 4));
    __m256d v2 = _mm256_cvtps_pd(_mm_loadu_ps(g + j + 8));
    __m256d v3 = _mm256_cvtps_pd(_mm_loadu_ps(g + j + 12));
    a0 = _mm256_fmadd_pd(v0, v0, a0);
    a1 = _mm256_fmadd_pd(v1, v1, a1);
    a2 = _mm256_fmadd_pd(v2, v2, a2);
    a3 = _mm256_fmadd_pd(v3, v3, a3);
  }
  double lanes[4];
  _mm256_storeu_pd(lanes, _mm256_add_pd(_mm256_add_pd(a0, a1), _mm256_add_pd(a2, a3)));
  double sum = lanes[0] + lanes[1] + lanes[2] + lanes[3];
  for (; j < n; j++) sum += (double)g[j] * g[j];
  return sum;
}
#define HAVE_SUMSQ_AVX2 1
#endif

static double sumsq(const float *restrict g, int64_t n) {
#ifdef HAVE_SUMSQ_AVX2
  /* 0: not asked yet, 1: no, 2: yes (compute threads may ask at once: the
   * answer is the same for all). */
  static _Atomic int avx2;
  int have = atomic_load_explicit(&avx2, memory_order_relaxed);
  if (!have) {
    __builtin_cpu_init();
    have = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? 2 : 1;
    atomic_store_explicit(&avx2, have, memory_order_relaxed);
  }
  if (have == 2) return sumsq_avx2(g, n);
#endif
  /* Eight partial sums, so that the loop vectorises (one chain of double
   * adds cannot be reordered by the compiler). */
  double acc[8] = {0}, sum = 0;
  int64_t j = 0;
  for (; j + 8 <= n; j += 8)
    for (int k = 0; k < 8; k++) acc[k] += (double)g[j + k] * g[j + k];
  for (; j < n; j++) acc[0] += (double)g[j] * g[j];
  for (int k = 0; k < 8; k++) sum += acc[k];
  return sum;
}

/* A gradient's sum of squares in chunks of at least 64K elements, each on
 * whichever compute thread claims it; the chunks depend only on the size,
 * and their sums are added in order, so the norm does not depend on the
 * thread count. */
#define SUMSQ_CHUNKS 256
typedef struct sumsq_job {
  const float *g;
  int64_t n, grain;
  double part[SUMSQ_CHUNKS];
} sumsq_job;

static void sumsq_fn(void *ctx, int64_t begin, int64_t end) {
  sumsq_job *j = ctx;
  for (int64_t c = begin; c < end; c++) {
    const int64_t b = c * j->grain;
    j->part[c] = sumsq(j->g + b, j->n - b < j->grain ? j->n - b : j->grain);
  }
}

double grove_replica_grad_norm(const grove_replica *r) {
  double sum = 0;
  sumsq_job j;
  for (size_t i = 0; i < r->params.n; i++) {
    if (!r->grads[i]) continue;
    j.g = r->grads[i]->data;
    j.n = grove_tensor_numel(r->grads[i]);
    j.grain = (j.n + SUMSQ_CHUNKS - 1) / SUMSQ_CHUNKS;
    j.grain = j.grain < 65536 ? 65536 : (j.grain + 15) / 16 * 16;
    const int64_t chunks = (j.n + j.grain - 1) / j.grain;
    grove__parallel_for(chunks, 1, sumsq_fn, &j);
    for (int64_t c = 0; c < chunks; c++) sum += j.part[c];
  }
  return sqrt(sum);
}

/* ============================================================ forward, backward */

grove_status grove_replica_forward(grove_replica *r, const grove_tensor *inputs, size_t n,
                                   grove_values *out, grove_err *err) {
  grove__tape *t = &r->tape;
  out->n = 0;
  r->have_tape = false;
  grove_arena_reset(t->arena);
  t->nvars = t->nnodes = 0;
  t->err = err;
  grove_status s = grove_model_check_inputs(r->model, inputs, n, err);
  if (s) return s;
  if (n > GROVE_MAX_VALUES)
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT, "at most %d inputs", GROVE_MAX_VALUES);
  for (size_t i = 0; i < n; i++) {
    grove_tensor x;
    if ((s = grove__talloc(t, &x, inputs[i].dtype, inputs[i].ndim, inputs[i].shape))) return s;
    if ((s = grove_tensor_copy(&x, &inputs[i], err))) return s;
    bool rg = r->opts.inputs_require_grad && x.dtype == GROVE_F32;
    if ((r->in_vars[i] = grove__var_new(t, &x, rg)) < 0) return GROVE_E_NOMEM;
  }
  r->nin = (int)n;
  int nout = 0;
  s = grove__train_call(t, r->model->root, r->in_vars, (int)n, r->out_vars, &nout);
  if (s) return s;
  r->nout = nout;
  out->n = nout;
  for (int i = 0; i < nout; i++) out->v[i] = t->vars[r->out_vars[i]].t;
  r->have_tape = true;
  r->backward_done = false;
  return GROVE_OK;
}

grove_status grove_replica_backward(grove_replica *r, const grove_tensor *grad_outputs, size_t n,
                                    grove_err *err) {
  grove__tape *t = &r->tape;
  t->err = err;
  if (!r->have_tape)
    return grove_err_set(err, GROVE_E_FAILED_PRECONDITION,
                         "backward needs a training forward first");
  if (r->backward_done)
    return grove_err_set(err, GROVE_E_FAILED_PRECONDITION,
                         "Trying to backward through the graph a second time: run forward again");
  if (n != (size_t)r->nout)
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT,
                         "backward: expected %d output gradient(s), got %zu", r->nout, n);
  bool any = false;
  for (size_t i = 0; i < n; i++) {
    const grove_tensor *g = &grad_outputs[i];
    if (!g->data) continue;
    grove__var *v = &t->vars[r->out_vars[i]];
    if (g->dtype != GROVE_F32 || !grove_tensor_same_shape(g, &v->t)) {
      char a[128], b[128];
      return grove_err_set(err, g->dtype != GROVE_F32 ? GROVE_E_DTYPE : GROVE_E_SHAPE,
                           "backward: gradient of output %zu is %s %s, expected float32 %s", i,
                           grove_dtype_name(g->dtype),
                           grove_shape_str(g->ndim, g->shape, a, sizeof a),
                           grove_shape_str(v->t.ndim, v->t.shape, b, sizeof b));
    }
    if (v->t.dtype != GROVE_F32 || !v->requires_grad) continue;
    float *dst = grove__grad(t, r->out_vars[i]);
    if (!dst) return GROVE_E_NOMEM;
    grove_tensor d;
    grove_tensor_init(&d, GROVE_F32, g->ndim, g->shape, dst);
    /* Accumulate (one var may be two outputs): copy through a temporary
     * only when the var already had a gradient. */
    int64_t ne = grove_tensor_numel(g);
    if (grove_tensor_is_contiguous(g)) {
      const float *src = g->data;
      for (int64_t j = 0; j < ne; j++) dst[j] += src[j];
    } else {
      float *tmp = grove__tscratch(t, (size_t)ne * sizeof(float), false);
      if (!tmp) return GROVE_E_NOMEM;
      grove_tensor tt;
      grove_tensor_init(&tt, GROVE_F32, g->ndim, g->shape, tmp);
      grove_status s = grove_tensor_copy(&tt, g, err);
      if (s) return s;
      for (int64_t j = 0; j < ne; j++) dst[j] += tmp[j];
    }
    any = true;
  }
  r->backward_done = true;
  if (!any) return GROVE_OK;
  for (size_t k = t->nnodes; k-- > 0;) {
    const grove__node *nd = &t->nodes[k];
    bool has = false;
    for (int i = 0; i < nd->nout && !has; i++) has = nd->out[i] >= 0 && t->vars[nd->out[i]].grad;
    if (!has) continue;
    grove__yield_point(); /* a training session's step (core/base/yield.c) */
    grove_status s = nd->backward(t, nd);
    if (s) return s;
  }
  return GROVE_OK;
}

bool grove_replica_input_grad(const grove_replica *r, size_t i, grove_tensor *out) {
  if (!r->have_tape || i >= (size_t)r->nin) return false;
  const grove__var *v = &r->tape.vars[r->in_vars[i]];
  if (!v->grad) return false;
  grove_tensor_init(out, GROVE_F32, v->t.ndim, v->t.shape, v->grad);
  return true;
}

/* ============================================================ evaluate, snapshot */

grove_status grove_replica_evaluate(grove_replica *r, grove_arena *arena,
                                    const grove_tensor *inputs, size_t n, grove_values *out,
                                    grove_err *err) {
  grove_module *root = r->model->root;
  grove_module_eval(root);
  grove_status s = grove__refresh_tree(root, err);
  if (!s) s = grove_model_forward(r->model, arena, inputs, n, out, err);
  grove_module_train(root, true);
  return s;
}

grove_status grove_replica_state_dict(const grove_replica *r, grove_state_dict *dest,
                                      grove_err *err) {
  grove_state_dict *sd = grove_sd_new();
  if (!sd) return grove_err_set(err, GROVE_E_NOMEM, "out of memory");
  grove__pmap copies = {0};
  grove_status s = grove_module_state_dict(r->model->root, "", sd, err);
  for (size_t i = 0; !s && i < grove_sd_count(sd); i++) {
    grove_tensor *src = grove_sd_tensor(sd, i);
    grove_tensor *c = grove__pmap_get(&copies, src, NULL);
    if (!c) {
      c = grove_tensor_clone(src, src->dtype, err);
      if (!c) {
        s = err && err->code ? err->code : GROVE_E_NOMEM;
        break;
      }
      if (!grove__pmap_put(&copies, src, c)) {
        grove_tensor_release(c);
        s = grove_err_set(err, GROVE_E_NOMEM, "out of memory");
        break;
      }
    }
    s = grove_sd_set(dest, grove_sd_key(sd, i), c, err);
  }
  for (size_t i = 0; !s && i < grove_sd_meta_count(sd); i++)
    s = grove_sd_set_version(dest, grove_sd_meta_prefix(sd, i), grove_sd_meta_version(sd, i), err);
  /* The map holds the clones' only references now. */
  for (size_t i = 0; i < copies.cap; i++)
    if (copies.keys[i]) grove_tensor_release(copies.vals[i]);
  grove__pmap_fini(&copies);
  grove_sd_free(sd);
  return s;
}

/* ============================================================ one step */

grove_status grove_replica_train_step(grove_replica *r, grove_optim *o, const grove_loss *loss,
                                      const grove_tensor *inputs, size_t n,
                                      const grove_tensor *target, double *loss_value,
                                      double *grad_norm, grove_err *err) {
  grove_replica_zero_grad(r, true);
  grove_values out;
  grove_status s = grove_replica_forward(r, inputs, n, &out, err);
  if (s) return s;
  if (out.n < 1) return grove_err_set(err, GROVE_E_INTERNAL, "the model returned nothing");
  grove_tensor g[GROVE_MAX_VALUES];
  memset(g, 0, sizeof g);
  for (int i = 0; i < out.n; i++) {
    g[i] = out.v[i];
    g[i].data = NULL;
  }
  if ((s = grove__talloc(&r->tape, &g[0], GROVE_F32, out.v[0].ndim, out.v[0].shape))) return s;
  double value;
  if ((s = grove_loss_compute(loss, &out.v[0], target, &value, &g[0], err))) return s;
  if ((s = grove_replica_backward(r, g, (size_t)out.n, err))) return s;
  double norm = grove_replica_grad_norm(r);
  if (o && (s = grove_optim_step(o, r->grads, err))) return s;
  if (loss_value) *loss_value = value;
  if (grad_norm) *grad_norm = norm;
  return GROVE_OK;
}
