/* tape.c: the training tape (backward.h): its vars and nodes, its arena
 * allocations and gradients, the replica's random numbers, and the dispatch
 * of a module's training forward through its settings (grove__tinfo.fn, set
 * by train.c when it decodes the module).  Split out of train.c so that the
 * ops of backward_*.c, which record on the tape, do not call up into the
 * replica that drives them.  The replica's thread. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backward.h"

/* ------------------------------------------------------------ generator */

static inline uint64_t rotl(uint64_t x, int k) {
  return (x << k) | (x >> (64 - k));
}

/* xoshiro256**: small, fast, and the same numbers on every platform. */
static uint64_t rng_next(uint64_t s[4]) {
  const uint64_t result = rotl(s[1] * 5, 7) * 9;
  const uint64_t t = s[1] << 17;
  s[2] ^= s[0];
  s[3] ^= s[1];
  s[1] ^= s[2];
  s[0] ^= s[3];
  s[2] ^= t;
  s[3] = rotl(s[3], 45);
  return result;
}

double grove__tape_uniform(grove__tape *t) {
  return (double)(rng_next(t->r->rng) >> 11) * 0x1.0p-53;
}

/* ============================================================ the tape */

int grove__var_new(grove__tape *t, const grove_tensor *value, bool requires_grad) {
  if (t->nvars == t->vars_cap) {
    size_t cap = t->vars_cap ? t->vars_cap * 2 : 64;
    grove__var *v = realloc(t->vars, cap * sizeof *v);
    if (!v) {
      grove_err_set(t->err, GROVE_E_NOMEM, "out of memory recording the training forward");
      return -1;
    }
    t->vars = v;
    t->vars_cap = cap;
  }
  grove__var *v = &t->vars[t->nvars];
  v->t = *value;
  v->grad = NULL;
  v->requires_grad = requires_grad;
  return (int)t->nvars++;
}

grove_status grove__node_add(grove__tape *t, const grove__node *n) {
  if (t->nnodes == t->nodes_cap) {
    size_t cap = t->nodes_cap ? t->nodes_cap * 2 : 64;
    grove__node *v = realloc(t->nodes, cap * sizeof *v);
    if (!v)
      return grove_err_set(t->err, GROVE_E_NOMEM, "out of memory recording the training forward");
    t->nodes = v;
    t->nodes_cap = cap;
  }
  t->nodes[t->nnodes++] = *n;
  return GROVE_OK;
}

grove_status grove__talloc(grove__tape *t, grove_tensor *out, grove_dtype dt, int ndim,
                           const int64_t *shape) {
  int64_t n = 1;
  for (int i = 0; i < ndim; i++) n *= shape[i];
  void *p = grove_arena_alloc(t->arena, (size_t)n * grove_dtype_size(dt));
  if (!p) return grove_err_set(t->err, GROVE_E_NOMEM, "out of memory for training activations");
  grove_tensor_init(out, dt, ndim, shape, p);
  return GROVE_OK;
}

void *grove__tscratch(grove__tape *t, size_t n, bool zero) {
  void *p = grove_arena_alloc(t->arena, n);
  if (!p) {
    grove_err_set(t->err, GROVE_E_NOMEM, "out of memory for training scratch");
    return NULL;
  }
  if (zero && n) memset(p, 0, n);
  return p;
}

int grove__var_alloc(grove__tape *t, grove_dtype dt, int ndim, const int64_t *shape,
                     bool requires_grad, float **data) {
  grove_tensor y;
  if (grove__talloc(t, &y, dt, ndim, shape)) return -1;
  if (data) *data = y.data;
  return grove__var_new(t, &y, requires_grad);
}

float *grove__grad(grove__tape *t, int v) {
  grove__var *var = &t->vars[v];
  if (!var->grad) {
    size_t n = (size_t)grove_tensor_numel(&var->t);
    var->grad = grove__tscratch(t, n * sizeof(float), true);
  }
  return var->grad;
}

float *grove__grad_fresh(grove__tape *t, int v, bool *fresh) {
  grove__var *var = &t->vars[v];
  *fresh = !var->grad;
  if (!var->grad) {
    size_t n = (size_t)grove_tensor_numel(&var->t);
    var->grad = grove__tscratch(t, n * sizeof(float), false);
  }
  return var->grad;
}

void *grove__tape_ws(grove__tape *t, size_t n) {
  if (n > t->ws_cap) {
    /* Freed first: the old contents are dead, and the peak stays one block. */
    free(t->ws);
    t->ws_cap = 0;
    size_t size = (n + 63) / 64 * 64;
    t->ws = aligned_alloc(64, size);
    if (!t->ws) {
      grove_err_set(t->err, GROVE_E_NOMEM, "out of memory for a training product's workspace");
      return NULL;
    }
    t->ws_cap = size;
  }
  return t->ws ? t->ws : (void *)t; /* n = 0: any non-NULL pointer (never written) */
}

grove_status grove__tape_gemm(grove__tape *t, int flags, int64_t M, int64_t N, int64_t K,
                              const float *A, int64_t lda, const float *B, int64_t ldb, float *C,
                              int64_t ldc) {
  const size_t wsn = grove__gemm_ws_size(flags, M, N, K);
  void *ws = grove__tape_ws(t, wsn);
  if (!ws) return GROVE_E_NOMEM;
  grove__gemm(flags, M, N, K, A, lda, B, ldb, C, ldc, ws, wsn);
  return GROVE_OK;
}

grove_status grove__tape_linear(grove__tape *t, const float *x, int64_t M, int64_t K,
                                const float *W, int64_t N, float *y) {
  return grove__tape_gemm(t, GROVE__GEMM_TRANS_B, M, N, K, x, K, W, K, y, N);
}

bool grove__any_requires(grove__tape *t, const int *in, int n) {
  for (int i = 0; i < n; i++)
    if (in[i] >= 0 && t->vars[in[i]].requires_grad) return true;
  return false;
}

grove_status grove__param_grad_fresh(grove__tape *t, const grove_tensor *param, float **g,
                                     bool *fresh) {
  grove_replica *r = t->r;
  bool found;
  size_t idx = (size_t)(uintptr_t)grove__pmap_get(&r->param_index, param, &found);
  *g = NULL;
  *fresh = false;
  if (!found) return GROVE_OK;
  idx -= 1;
  if (!r->grads[idx] && r->spare[idx]) {
    /* The memory of a .grad zero_grad dropped: reusing it is cheaper than
     * the page faults of a fresh allocation of the same size every step. */
    r->grads[idx] = r->spare[idx];
    r->spare[idx] = NULL;
    *fresh = true;
  }
  if (!r->grads[idx]) {
    r->grads[idx] = grove_tensor_new(GROVE_F32, param->ndim, param->shape, t->err);
    if (!r->grads[idx]) return t->err && t->err->code ? t->err->code : GROVE_E_NOMEM;
    *fresh = true;
  }
  *g = r->grads[idx]->data;
  return GROVE_OK;
}

grove_status grove__param_grad(grove__tape *t, const grove_tensor *param, float **g) {
  bool fresh;
  grove_status s = grove__param_grad_fresh(t, param, g, &fresh);
  if (!s && fresh) memset(*g, 0, (size_t)grove_tensor_numel(param) * sizeof(float));
  return s;
}

grove_status grove__param_f32(grove__tape *t, const grove_module *m, const char *name, int64_t n,
                              const grove_tensor **out) {
  const grove_tensor *p = grove_module_param(m, name);
  *out = p;
  if (!p) return GROVE_OK;
  if (p->dtype != GROVE_F32 || !grove_tensor_is_contiguous(p))
    return grove_err_set(t->err, GROVE_E_DTYPE,
                         "%s: parameter %s must be a contiguous float32 tensor to train",
                         m->type->name, name);
  if (n >= 0 && grove_tensor_numel(p) != n) {
    char sh[128];
    grove_shape_str(p->ndim, p->shape, sh, sizeof sh);
    return grove_err_set(t->err, GROVE_E_SHAPE,
                         "%s: parameter %s has shape %s, expected %lld elements", m->type->name,
                         name, sh, (long long)n);
  }
  return GROVE_OK;
}

const grove__tinfo *grove__tinfo_of(grove__tape *t, const grove_module *m) {
  return grove__pmap_get(&t->r->infos, m, NULL);
}

/* ============================================================ dispatch */

grove_status grove__train_call(grove__tape *t, const grove_module *m, const int *in, int nin,
                               int *out, int *nout) {
  const grove__tinfo *info = grove__tinfo_of(t, m);
  if (!info)
    return grove_err_set(t->err, GROVE_E_INTERNAL, "training: %s has no training settings",
                         m->type->name);
  grove_status s = GROVE_OK;
  if (info->kind == GROVE__TK_SEQUENTIAL) {
    int cur[GROVE_MAX_VALUES], ncur = nin;
    memcpy(cur, in, (size_t)nin * sizeof(int));
    for (size_t i = 0; i < m->nchildren; i++) {
      const grove_module *c = m->children[i].module;
      if (!c)
        return grove_err_set(t->err, GROVE_E_NOT_CALLABLE,
                             "Sequential: child '%s' is None and cannot be called",
                             m->children[i].name);
      int next[GROVE_MAX_VALUES], nnext = 0;
      if ((s = grove__train_call(t, c, cur, ncur, next, &nnext))) return s;
      memcpy(cur, next, sizeof next);
      ncur = nnext;
    }
    memcpy(out, cur, (size_t)ncur * sizeof(int));
    *nout = ncur;
    return GROVE_OK;
  }
  if (info->kind == GROVE__TK_IDENTITY) {
    memcpy(out, in, (size_t)nin * sizeof(int));
    *nout = nin;
    return GROVE_OK;
  }
  grove__train_fn fn = info->fn;
  if (!fn)
    return grove_err_set(t->err, GROVE_E_NOT_CALLABLE,
                         "%s is not callable: it holds modules but has no forward", m->type->name);
  s = fn(t, m, info, in, nin, out, nout);
  /* The innermost failing module names itself; its parents leave it be. */
  if (s && t->err && t->err->code == s && strncmp(t->err->msg, "training: ", 10) != 0) {
    grove_err_prefix(t->err, "training: %s%s%s (%s)", *info->path ? "'" : "",
                     *info->path ? info->path : "the root module", *info->path ? "'" : "",
                     m->type->name);
  }
  return s;
}
