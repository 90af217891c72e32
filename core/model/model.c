/* model.c: a model directory opened into a ready, eval-mode Module tree.
 *
 *   DIR/model.json          the spec (spec.c builds the tree from it)
 *   DIR/weights.safetensors or weights.pt / .pth / .bin
 *
 * Opening is all or nothing: the tree is built, the checkpoint read and
 * loaded (checked completely before anything is copied), and trial
 * forwards at batch 2 and 4 prove that the model runs and measure the
 * scratch a worker's arena needs at max_batch_size (size_scratch).  Only then, and only if model.json and
 * the checkpoint are still what they were when the build began, does the
 * caller get a model.
 *
 * The tree is built with the large layers' refresh deferred (module_internal.h):
 * their weights are packed once, by the load, from the checkpoint's values,
 * and never from the constructors' zeros.
 *
 * Weights are loaded with assign semantics (torch's assign=True): a tensor
 * whose dtype already matches is shared with the checkpoint instead of copied,
 * so an aligned f32 safetensors file stays zero-copy in the copy of the file
 * that the reader made (fileio.c: never a mapping).  Assigning
 * per key would split tied parameters (decoder.weight = embed.weight) into two
 * tensors; they are tied again afterwards, to the value torch's copying load
 * would have left in the one shared tensor.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "grove/grove.h"
#include "model_internal.h"
#include "module_internal.h"

/* model.json is architecture, not weights: anything this large is not one. */
#define MAX_SPEC_BYTES (64u << 20)

const char *const grove__model_weight_names[] = {"weights.safetensors", "weights.pt", "weights.pth",
                                                 "weights.bin", NULL};

static grove_status nomem(grove_err *err) {
  return grove_err_set(err, GROVE_E_NOMEM, "out of memory");
}

static char *join(const char *dir, const char *name) {
  size_t a = strlen(dir), b = strlen(name);
  char *s = malloc(a + b + 2);
  if (!s) return NULL;
  memcpy(s, dir, a);
  size_t n = a;
  if (a && dir[a - 1] != '/') s[n++] = '/';
  memcpy(s + n, name, b + 1);
  return s;
}

static bool is_file(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* ------------------------------------------------------------ reading */

static grove_status read_text(const char *path, char **out, grove_err *err) {
  *out = NULL;
  FILE *f = fopen(path, "rb");
  if (!f)
    return grove_err_set(err, errno == ENOENT ? GROVE_E_NOT_FOUND : GROVE_E_IO,
                         "%s: cannot open: %s", path, strerror(errno));
  grove_status s = GROVE_OK;
  size_t cap = 4096, len = 0;
  char *buf = malloc(cap);
  while (buf) {
    if (len + 1 == cap) {
      if (cap >= MAX_SPEC_BYTES) {
        s = grove_err_set(err, GROVE_E_LIMIT, "%s: larger than %u bytes: not a model.json", path,
                          MAX_SPEC_BYTES);
        break;
      }
      char *nb = realloc(buf, cap * 2);
      if (!nb) break;
      buf = nb;
      cap *= 2;
    }
    size_t got = fread(buf + len, 1, cap - 1 - len, f);
    len += got;
    if (got == 0) {
      if (ferror(f))
        s = grove_err_set(err, GROVE_E_IO, "%s: cannot read: %s", path, strerror(errno));
      break;
    }
  }
  fclose(f);
  if (!buf) return nomem(err);
  if (s) {
    free(buf);
    return s;
  }
  if (memchr(buf, '\0', len)) {
    free(buf);
    return grove_err_set(err, GROVE_E_SPEC, "%s: contains a NUL byte: not a JSON text", path);
  }
  buf[len] = '\0';
  *out = buf;
  return GROVE_OK;
}

/* The "weights" key of the spec, already validated by spec.c; NULL when
 * absent.  Read here (the struct has no place for it: weights_path is the
 * file actually loaded). */
static char *weights_key(const char *text) {
  json_t *doc = json_loads(text, 0, NULL);
  const json_t *w = doc ? json_object_get(doc, "weights") : NULL;
  char *s = json_is_string(w) ? grove__strdup(json_string_value(w)) : NULL;
  json_decref(doc);
  return s;
}

/* Picks the checkpoint: opts->weights, else the spec's "weights", else the
 * first of grove__model_weight_names that exists.  *path NULL (and OK) when there is none
 * and none is needed (the tree has no state at all). */
static grove_status choose_weights(const char *dir, const char *text, const grove_model_opts *opts,
                                   bool needs_weights, char **path, grove_err *err) {
  *path = NULL;
  if (opts && opts->weights) {
    if (!is_file(opts->weights))
      return grove_err_set(err, GROVE_E_NOT_FOUND, "%s: no such checkpoint file", opts->weights);
    return (*path = grove__strdup(opts->weights)) ? GROVE_OK : nomem(err);
  }
  char *key = weights_key(text);
  if (key) {
    char *p = join(dir, key);
    free(key);
    if (!p) return nomem(err);
    if (!is_file(p)) {
      grove_status s = grove_err_set(err, GROVE_E_NOT_FOUND,
                                     "%s: the weights file model.json names (\"weights\") does "
                                     "not exist",
                                     p);
      free(p);
      return s;
    }
    *path = p;
    return GROVE_OK;
  }
  for (int i = 0; grove__model_weight_names[i]; i++) {
    char *p = join(dir, grove__model_weight_names[i]);
    if (!p) return nomem(err);
    if (is_file(p)) {
      *path = p;
      return GROVE_OK;
    }
    free(p);
  }
  if (!needs_weights) return GROVE_OK;
  return grove_err_set(err, GROVE_E_NOT_FOUND,
                       "%s: no weights file (tried weights.safetensors, weights.pt, weights.pth, "
                       "weights.bin)",
                       dir);
}

grove_status grove__model_dir_weights(const char *dir, char **path, grove_err *err) {
  *path = NULL;
  char *spec = join(dir, "model.json");
  if (!spec) return nomem(err);
  /* A model.json that cannot be read names nothing: the usual names apply
   * (grove_model_open reports the model.json itself). */
  char *text = NULL;
  grove_err ignore = {0};
  if (read_text(spec, &text, &ignore)) text = NULL;
  free(spec);
  grove_status s = choose_weights(dir, text ? text : "{}", NULL, true, path, err);
  free(text);
  return s;
}

/* ------------------------------------------------------------ ties */

/* One parameter slot and the state_dict key it is loaded from. */
typedef struct member {
  grove_module *m;
  char *pname; /* owned: the slot's name */
  char *key;   /* owned */
} member;

/* A set of slots that hold one tensor object (tied parameters). */
typedef struct tie_group {
  member *items;
  size_t n;
} tie_group;

typedef struct ties {
  tie_group *groups;
  size_t n;
} ties;

static void ties_fini(ties *t) {
  for (size_t i = 0; i < t->n; i++) {
    for (size_t j = 0; j < t->groups[i].n; j++) {
      free(t->groups[i].items[j].key);
      free(t->groups[i].items[j].pname);
    }
    free(t->groups[i].items);
  }
  free(t->groups);
  *t = (ties){0};
}

static grove_slot *slot_of(grove_module *m, const char *pname) {
  for (size_t i = 0; i < m->nparams; i++)
    if (strcmp(m->params[i].name, pname) == 0) return &m->params[i];
  return NULL;
}

/* Finds, before loading, every tensor object that sits in two or more
 * parameter slots: named_parameters(remove_duplicate=False) lists it under
 * each key. */
static grove_status collect_ties(grove_module *root, ties *out, grove_err *err) {
  grove_named_tensors all = {0};
  grove_status s = grove_module_named_parameters(root, "", true, false, &all, err);
  bool *done = s ? NULL : calloc(all.n + 1, sizeof *done);
  if (!s && !done) s = nomem(err);
  for (size_t i = 0; !s && i < all.n; i++) {
    if (done[i]) continue;
    size_t count = 0;
    for (size_t j = i; j < all.n; j++) count += all.items[j].tensor == all.items[i].tensor;
    if (count < 2) continue;
    tie_group g = {calloc(count, sizeof(member)), 0};
    if (!g.items) {
      s = nomem(err);
      break;
    }
    for (size_t j = i; j < all.n && !s; j++) {
      if (all.items[j].tensor != all.items[i].tensor) continue;
      done[j] = true;
      const char *key = all.items[j].name;
      const char *dot = strrchr(key, '.');
      char *mp = dot ? strndup(key, (size_t)(dot - key)) : grove__strdup("");
      grove_module *m = mp ? grove_module_find(root, mp) : NULL;
      free(mp);
      grove_slot *slot = m ? slot_of(m, dot ? dot + 1 : key) : NULL;
      char *k = grove__strdup(key), *pn = slot ? grove__strdup(slot->name) : NULL;
      if (!slot || !k || !pn) {
        free(k);
        free(pn);
        s = slot ? nomem(err)
                 : grove_err_set(err, GROVE_E_INTERNAL, "tied parameter %s: no slot", key);
        break;
      }
      g.items[g.n++] = (member){m, pn, k};
    }
    tie_group *ng = realloc(out->groups, (out->n + 1) * sizeof *ng);
    if (!ng) {
      s = s ? s : nomem(err);
      for (size_t j = 0; j < g.n; j++) {
        free(g.items[j].key);
        free(g.items[j].pname);
      }
      free(g.items);
      break;
    }
    out->groups = ng;
    out->groups[out->n++] = g;
  }
  free(done);
  grove_named_tensors_fini(&all);
  return s;
}

/* After an assign-load each slot of a group holds its own checkpoint tensor:
 * make them one tensor again.  torch's copying load writes every key into the
 * one shared tensor in state_dict order, so the last key present in the
 * checkpoint wins; the same is chosen here.  Modules whose slot changed
 * recompute their derived data. */
static grove_status retie(const ties *t, const grove_state_dict *sd, grove_err *err) {
  for (size_t i = 0; i < t->n; i++) {
    const tie_group *g = &t->groups[i];
    const member *src = &g->items[0];
    for (size_t j = 0; j < g->n; j++)
      if (grove_sd_contains(sd, g->items[j].key)) src = &g->items[j];
    grove_tensor *value = grove_module_param(src->m, src->pname);
    if (!value) continue;
    for (size_t j = 0; j < g->n; j++) {
      const member *d = &g->items[j];
      if (grove_module_param(d->m, d->pname) == value) continue;
      grove_status s = grove_module_register_parameter(d->m, d->pname, value, err);
      if (!s && d->m->type->refresh) s = d->m->type->refresh(d->m, err);
      if (s) return s;
    }
  }
  return GROVE_OK;
}

/* ------------------------------------------------------------ sizes */

static int cmp_ptr(const void *a, const void *b) {
  uintptr_t x = (uintptr_t) * (void *const *)a, y = (uintptr_t) * (void *const *)b;
  return x < y ? -1 : x > y;
}

/* Bytes of the state_dict's tensors, each tensor object counted once (a tied
 * weight is held once in memory). */
static grove_status weight_bytes(const grove_module *root, size_t *out, grove_err *err) {
  *out = 0;
  grove_state_dict *sd = grove_sd_new();
  if (!sd) return nomem(err);
  grove_status s = grove_module_state_dict(root, NULL, sd, err);
  size_t n = grove_sd_count(sd);
  grove_tensor **ts = s ? NULL : malloc((n + 1) * sizeof *ts);
  if (!s && !ts) s = nomem(err);
  if (!s) {
    for (size_t i = 0; i < n; i++) ts[i] = grove_sd_tensor(sd, i);
    qsort(ts, n, sizeof *ts, cmp_ptr);
    for (size_t i = 0; i < n; i++)
      if (i == 0 || ts[i] != ts[i - 1]) *out += grove_tensor_nbytes(ts[i]);
  }
  free(ts);
  grove_sd_free(sd);
  return s;
}

static grove_status count_state(const grove_module *root, size_t *n, grove_err *err) {
  grove_state_dict *sd = grove_sd_new();
  if (!sd) return nomem(err);
  grove_status s = grove_module_state_dict(root, NULL, sd, err);
  *n = grove_sd_count(sd);
  grove_sd_free(sd);
  return s;
}

/* Zero inputs of the spec's dtypes at batch rows; every -1 non-batch
 * dimension is free_dim.  bufs[i] is the caller's to free. */
static grove_status zero_inputs(const grove_model *m, int64_t batch, int64_t free_dim,
                                grove_values *in, void **bufs, grove_err *err) {
  in->n = (int)m->ninputs;
  for (size_t i = 0; i < m->ninputs; i++) {
    const grove_io_spec *spec = &m->inputs[i];
    int64_t shape[GROVE_MAX_DIMS];
    uint64_t bytes = grove_dtype_size(spec->dtype);
    bool overflow = false;
    for (int d = 0; d < spec->ndim; d++) {
      shape[d] = spec->shape[d] != -1 ? spec->shape[d] : d == 0 ? batch : free_dim;
      overflow |= grove__mul_overflow_u64(bytes, (uint64_t)shape[d], &bytes);
    }
    if (overflow || bytes > SIZE_MAX / 2)
      return grove_err_set(err, GROVE_E_LIMIT, "input '%s' at batch %" PRId64 " is too large",
                           spec->name, batch);
    bufs[i] = calloc(1, bytes ? (size_t)bytes : 1);
    if (!bufs[i]) return nomem(err);
    grove_tensor_init(&in->v[i], spec->dtype, spec->ndim, shape, bufs[i]);
  }
  return GROVE_OK;
}

static grove_status trial_forward(grove_model *m, grove_arena *arena, int64_t batch,
                                  int64_t free_dim, grove_values *out, grove_err *err) {
  void *bufs[GROVE_MAX_VALUES] = {0};
  grove_values in = {0};
  grove_status s = zero_inputs(m, batch, free_dim, &in, bufs, err);
  if (!s) {
    grove_arena_reset(arena);
    grove_fwd f = {.arena = arena, .err = err};
    *out = (grove_values){0};
    s = grove_module_forward(m->root, &f, &in, out);
    if (s)
      grove_err_prefix(err, "a trial forward on zero inputs (batch %" PRId64 ") failed", batch);
  }
  for (size_t i = 0; i < GROVE_MAX_VALUES; i++) free(bufs[i]);
  return s;
}

/* The outputs the model produced must be those the spec lists. */
static grove_status check_outputs(const grove_model *m, const grove_values *out, grove_err *err) {
  if ((size_t)out->n != m->noutputs)
    return grove_err_set(err, GROVE_E_SPEC,
                         "$.outputs: the model returns %d tensor(s), the spec lists %zu", out->n,
                         m->noutputs);
  for (size_t i = 0; i < m->noutputs; i++) {
    const grove_io_spec *sp = &m->outputs[i];
    const grove_tensor *t = &out->v[i];
    bool ok = t->dtype == sp->dtype && t->ndim == sp->ndim;
    for (int d = 0; ok && d < sp->ndim; d++) ok = sp->shape[d] == -1 || sp->shape[d] == t->shape[d];
    if (!ok) {
      char a[160], b[160];
      return grove_err_set(err, GROVE_E_SPEC,
                           "$.outputs[%zu]: output '%s' is %s %s in the spec, but the model "
                           "produces %s %s",
                           i, sp->name, grove_dtype_name(sp->dtype),
                           grove_shape_str(sp->ndim, sp->shape, a, sizeof a),
                           grove_dtype_name(t->dtype),
                           grove_shape_str(t->ndim, t->shape, b, sizeof b));
    }
  }
  return GROVE_OK;
}

/* A spec without "outputs" gets them from two trial forwards: dimensions
 * that differ between them follow the input's free dimensions (-1). */
static grove_status derive_outputs(grove_model *m, const grove_values *a, const grove_values *b,
                                   int64_t batch_a, grove_err *err) {
  size_t n = (size_t)a->n;
  if (n == 0) return GROVE_OK;
  m->outputs = calloc(n, sizeof *m->outputs);
  if (!m->outputs) return nomem(err);
  m->noutputs = n;
  for (size_t i = 0; i < n; i++) {
    grove_io_spec *sp = &m->outputs[i];
    const grove_tensor *x = &a->v[i], *y = &b->v[i];
    char name[32];
    if (n == 1)
      snprintf(name, sizeof name, "y");
    else
      snprintf(name, sizeof name, "y%zu", i);
    if (!(sp->name = grove__strdup(name))) return nomem(err);
    sp->dtype = x->dtype;
    sp->ndim = x->ndim;
    for (int d = 0; d < x->ndim; d++)
      sp->shape[d] = (y->ndim != x->ndim || y->shape[d] != x->shape[d]) ? -1 : x->shape[d];
    if (x->ndim > 0 && x->shape[0] == batch_a) sp->shape[0] = -1;
  }
  return GROVE_OK;
}

/* The scratch of a forward at max_batch_size, from the high waters hw1 at
 * batch b1 and hw2 at batch b2 > b1.  A pass's peak is the largest, over
 * its nodes, of what is live there: a constant (packs, tables, a
 * convolution's chunk buffers, which stop growing at their budget) plus a
 * per-row part, so the peak grows piecewise linearly and ever more steeply
 * with the batch, towards the node whose activations are largest.  Between
 * batch 1 and 2 the constant parts still decide the peak (ResNet-50: 11.2
 * MB a row there, 13.65 from batch 2 on); from 2 to 4 the slope is the
 * largest node's, which the line then follows.  A sixteenth more and 64 KB
 * cover the arena's rounding of every allocation to 64 bytes (a 70-byte
 * row is 128 bytes at batch 1, 192 at 2, 1152 at 16: 64 above the line)
 * and what is left of the bend; a pass larger still grows the arena once.
 * The pages of a worker's arena are touched only as far as a pass
 * reaches, so the margin costs address space, not memory.  Saturates
 * instead of overflowing. */
static size_t extrapolate(size_t hw1, int64_t b1, size_t hw2, int64_t b2, int64_t batch) {
  enum { SLACK = 64 << 10 };
  uint64_t line = hw2 > hw1 ? hw2 : hw1;
  if (b2 > b1 && hw2 > hw1 && batch > b2) {
    const uint64_t per = ((uint64_t)(hw2 - hw1) + (uint64_t)(b2 - b1) - 1) / (uint64_t)(b2 - b1);
    uint64_t more;
    if (grove__mul_overflow_u64(per, (uint64_t)(batch - b2), &more) || more > SIZE_MAX / 4)
      return SIZE_MAX / 2;
    line += more;
  }
  if (line > SIZE_MAX / 4) return SIZE_MAX / 2;
  return (size_t)(line + line / 16 + SLACK);
}

/* What a trial forward's arena reserves at least: address space, not
 * memory (see size_scratch). */
#define TRIAL_RESERVE ((size_t)256 << 20)

/* An arena of one block of `reserve` bytes, or a growing one where that is
 * refused. */
static grove_arena *trial_arena(size_t reserve) {
  grove_arena *a = grove_arena_new(reserve);
  return a ? a : grove_arena_new(0);
}

/* Sizes a worker's scratch without running a forward at max_batch_size
 * (at the default 64 a 224 x 224 ResNet-50's touched 9.2 GB of RSS, all of
 * it given back after the open): forwards on zeros at batch 2 and 4 (1 and
 * 2 or 3 for a smaller max_batch_size; every -1 non-batch dimension at 1)
 * prove that the model runs, check its outputs, and measure their arenas'
 * high waters, from which extrapolate() takes the figure for
 * max_batch_size.  A worker's arena is made that large but
 * its pages are touched only by the batches that need them; a pass larger
 * than the figure (a longer sequence, a batch whose layers keep more than
 * the line says) takes overflow chunks once, and the arena keeps the
 * larger size from then on (arena.h).  So the open's memory is that of a
 * batch of 4, whatever max_batch_size is. */
static grove_status size_scratch(grove_model *m, grove_err *err) {
  /* max_batch_size 0 (unbatched): dimension 0 is the model's own, sized 1. */
  const int64_t maxb = m->batching.max_batch_size ? m->batching.max_batch_size : 1;
  const int64_t b2 = maxb < 4 ? maxb : 4, b1 = b2 >= 4 ? 2 : 1;
  /* Each trial's arena is one block reserved large enough for its pass:
   * its pages are touched only as far as the pass's peak reaches.  A fresh
   * arena would take every allocation from overflow chunks, which a first
   * pass cannot reuse (arena.c): the memory of everything the pass ever
   * allocated, not of its peak (ResNet-50 at batch 64: 9.2 GB of RSS for a
   * peak of 0.87 GB).  Where the reservation is refused, chunks it is. */
  grove_arena *a1 = trial_arena(TRIAL_RESERVE), *a2 = NULL;
  grove_values out1 = {0}, out2 = {0};
  grove_status s = a1 ? trial_forward(m, a1, b1, 1, &out1, err) : nomem(err);
  size_t hw1 = s ? 0 : grove_arena_high_water(a1), hw2 = hw1;
  if (!s && b2 > b1) {
    const size_t want = hw1 < SIZE_MAX / 8 ? hw1 / (size_t)b1 * (size_t)b2 * 2 : 0;
    a2 = trial_arena(want > TRIAL_RESERVE ? want : TRIAL_RESERVE);
    s = a2 ? trial_forward(m, a2, b2, 1, &out2, err) : nomem(err);
    if (!s) hw2 = grove_arena_high_water(a2);
  } else {
    a2 = a1;
  }
  if (b2 == b1) out2 = out1;
  if (!s && m->noutputs > 0) {
    s = check_outputs(m, &out1, err);
    if (!s && b2 > b1) s = check_outputs(m, &out2, err);
  } else if (!s) {
    /* The outputs from the pass at batch b2 against one at another batch
     * with every free dimension at 2.  The first's live in its arena,
     * which the second pass does not touch: keep their shapes only. */
    grove_values first = out2, second = {0};
    for (int i = 0; i < first.n; i++) first.v[i].data = NULL;
    grove_arena *a3 = trial_arena(TRIAL_RESERVE);
    s = a3 ? trial_forward(m, a3, b2 == 1 ? 2 : 1, 2, &second, err) : nomem(err);
    if (!s) s = derive_outputs(m, &first, &second, b2, err);
    grove_arena_free(a3);
  }
  if (!s) m->arena_bytes = extrapolate(hw1, b1, hw2, b2, maxb);
  if (a2 != a1) grove_arena_free(a2);
  grove_arena_free(a1);
  return s;
}

/* ------------------------------------------------------------ open */

static char *base_name(const char *dir) {
  char *real = realpath(dir, NULL);
  const char *p = real ? real : dir;
  size_t n = strlen(p);
  while (n > 1 && p[n - 1] == '/') n--;
  size_t start = n;
  while (start > 0 && p[start - 1] != '/') start--;
  char *s = strndup(p + start, n - start);
  free(real);
  return s;
}

/* Testing aid (tests/check_files.c): with GROVE_TEST_LOAD_PAUSE=PREFIX in
 * the environment, a load that has read its checkpoint and built nothing
 * from it yet creates PREFIX.paused and waits, at most 60 s, until PREFIX.go
 * exists (no wait while it does), so that a test writes to the file at
 * exactly that moment.  Unset, this costs one getenv per load. */
static void test_pause(void) {
  const char *p = getenv("GROVE_TEST_LOAD_PAUSE");
  if (!p || !*p) return;
  char go[4096], paused[4096];
  snprintf(go, sizeof go, "%s.go", p);
  snprintf(paused, sizeof paused, "%s.paused", p);
  if (access(go, F_OK) == 0) return;
  int fd = open(paused, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  if (fd >= 0) close(fd);
  for (int i = 0; i < 6000 && access(go, F_OK) != 0; i++) {
    struct timespec ts = {0, 10 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  unlink(paused);
}

static grove_status load_weights(grove_model *m, const grove_model_opts *opts, grove_err *err) {
  grove_state_dict *sd = NULL;
  grove_status s = grove_checkpoint_read(m->weights_path, &sd, err);
  if (s) return s;
  test_pause();
  ties t = {0};
  s = collect_ties(m->root, &t, err);
  if (!s) {
    grove_load_opts lo = {.strict = !(opts && opts->non_strict), .assign = true};
    grove_load_report rep = {0};
    s = grove_module_load_state_dict(m->root, sd, &lo, &rep, err);
    if (s == GROVE_E_STATE_DICT) {
      grove_err_prefix(err, "%s", m->weights_path);
    } else if (!s) {
      for (size_t i = 0; i < rep.n_missing; i++)
        grove__log(GROVE_LOG_WARN, "model.missing_key",
                   "%s: %s: key missing from the checkpoint "
                   "(non-strict load keeps the module's initial value)",
                   m->weights_path, rep.missing[i]);
      for (size_t i = 0; i < rep.n_unexpected; i++)
        grove__log(GROVE_LOG_WARN, "model.unexpected_key",
                   "%s: %s: key not in the model "
                   "(ignored by the non-strict load)",
                   m->weights_path, rep.unexpected[i]);
      s = retie(&t, sd, err);
    }
    grove_load_report_fini(&rep);
  }
  ties_fini(&t);
  grove_sd_free(sd); /* the tree holds what it shares */
  return s;
}

/* Non-persistent buffers (torch's register_buffer(..., persistent=False):
 * position_ids, a causal mask, rotary inv_freq) are not in the state_dict, so
 * the exporter stores their values beside it, in DIR/buffers.safetensors,
 * under their dotted paths.  Each one the tree declares takes its value from
 * there (same shape and dtype, or the open fails naming it); state_dict()
 * still leaves them out, as torch does. */
const char grove__model_buffers_name[] = "buffers.safetensors";
#define BUFFERS_FILE grove__model_buffers_name

static grove_status set_buffers_rec(grove_module *mod, const char *prefix,
                                    const grove_state_dict *sd, const char *path, grove_err *err) {
  char key[4096];
  for (size_t i = 0; i < mod->nbuffers; i++) {
    grove_slot *b = &mod->buffers[i];
    if (!b->tensor || b->persistent) continue;
    snprintf(key, sizeof key, "%s%s", prefix, b->name);
    if (!sd)
      return grove_err_set(err, GROVE_E_SPEC,
                           "%s: no such file (it holds the value of the "
                           "non-persistent buffer '%s')",
                           path, key);
    grove_tensor *v = grove_sd_get(sd, key);
    if (!v)
      return grove_err_set(err, GROVE_E_STATE_DICT,
                           "%s: no value for the non-persistent "
                           "buffer '%s'",
                           path, key);
    bool same = v->dtype == b->tensor->dtype && v->ndim == b->tensor->ndim;
    for (int d = 0; same && d < v->ndim; d++) same = v->shape[d] == b->tensor->shape[d];
    if (!same) {
      char want[128], got[128];
      grove_shape_str(b->tensor->ndim, b->tensor->shape, want, sizeof want);
      grove_shape_str(v->ndim, v->shape, got, sizeof got);
      return grove_err_set(err, GROVE_E_STATE_DICT,
                           "%s: non-persistent buffer '%s' is %s %s, model.json declares %s %s",
                           path, key, grove_dtype_name(v->dtype), got,
                           grove_dtype_name(b->tensor->dtype), want);
    }
    grove_status s = grove_module_register_buffer(mod, b->name, v, false, err);
    if (s) return s;
  }
  for (size_t i = 0; i < mod->nchildren; i++) {
    if (!mod->children[i].module) continue;
    snprintf(key, sizeof key, "%s%s.", prefix, mod->children[i].name);
    grove_status s = set_buffers_rec(mod->children[i].module, key, sd, path, err);
    if (s) return s;
  }
  return GROVE_OK;
}

static bool has_extra_buffers(const grove_module *mod) {
  for (size_t i = 0; i < mod->nbuffers; i++)
    if (mod->buffers[i].tensor && !mod->buffers[i].persistent) return true;
  for (size_t i = 0; i < mod->nchildren; i++)
    if (mod->children[i].module && has_extra_buffers(mod->children[i].module)) return true;
  return false;
}

static grove_status load_extra_buffers(grove_model *m, const char *dir, grove_err *err) {
  if (!has_extra_buffers(m->root)) return GROVE_OK;
  char *path = join(dir, BUFFERS_FILE);
  if (!path) return nomem(err);
  grove_state_dict *sd = NULL;
  grove_status s = GROVE_OK;
  if (access(path, F_OK) == 0) s = grove_checkpoint_read(path, &sd, err);
  if (!s) s = set_buffers_rec(m->root, "", sd, path, err);
  grove_sd_free(sd);
  free(path);
  return s;
}

grove_status grove_model_open(const char *dir, const grove_model_opts *opts, grove_model **out,
                              grove_err *err) {
  if (out) *out = NULL;
  if (!dir || !*dir || !out)
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT, "grove_model_open: no directory or no out");
  char *spec_path = join(dir, "model.json");
  if (!spec_path) return nomem(err);
  char *text = NULL;
  grove_model *m = NULL;
  /* What the spec and the checkpoint were when this build began: a model is
   * only handed out if both are still the same when it is complete (below). */
  grove_file_stamp spec_id = {0}, weights_id = {0};
  grove_err ignore = {0};
  bool have_spec_id = grove_file_stamp_of(spec_path, &spec_id, &ignore) == GROVE_OK;
  bool have_weights_id = false;
  grove_status s = read_text(spec_path, &text, err);
  /* The checkpoint replaces the constructors' zero weights: packing those
   * first would cost a packed copy of the weights on top of old + new during
   * every reload (module_module_internal.h, "deferred refresh"). */
  grove__refresh_defer_begin();
  if (!s) s = grove_model_from_spec(text, spec_path, &m, err);
  grove__refresh_defer_end();
  if (!s && !(m->dir = grove__strdup(dir))) s = nomem(err);
  if (!s && !m->name && !(m->name = base_name(dir))) s = nomem(err);
  size_t nstate = 0;
  if (!s) s = count_state(m->root, &nstate, err);
  if (!s) s = choose_weights(dir, text, opts, nstate > 0, &m->weights_path, err);
  if (!s && m->weights_path) {
    have_weights_id = grove_file_stamp_of(m->weights_path, &weights_id, &ignore) == GROVE_OK;
    s = load_weights(m, opts, err);
  }
  if (!s) s = load_extra_buffers(m, dir, err);
  /* The load refreshed the whole tree; without one (a tree with no state)
   * the deferred refreshes run now.  Either way forward may run from here. */
  if (!s) s = grove__refresh_pending(m->root, err);
  if (!s) {
    m->param_count = grove_module_param_count(m->root);
    s = weight_bytes(m->root, &m->weight_bytes, err);
  }
  if (!s) {
    s = size_scratch(m, err);
    /* Outputs that disagree with the spec are the spec's fault. */
    if (s) grove_err_prefix(err, "%s", s == GROVE_E_SPEC ? spec_path : dir);
  }
  /* Each file was read whole, and refused if written meanwhile (fileio.c),
   * so the model is one state of each.  A write since (a `cp` over the
   * weights, the write --watch reacts to) makes it a model of a file that
   * no longer exists: refused, so that the caller keeps what it serves and
   * the write's own reload brings the new file in. */
  if (!s && have_spec_id) s = grove_file_stamp_check(spec_path, &spec_id, err);
  if (!s && have_weights_id) s = grove_file_stamp_check(m->weights_path, &weights_id, err);
  free(text);
  free(spec_path);
  if (s) {
    grove_model_free(m);
    return s;
  }
  *out = m;
  return GROVE_OK;
}

/* ------------------------------------------------------------ forward */

grove_status grove_model_check_inputs(const grove_model *m, const grove_tensor *inputs, size_t n,
                                      grove_err *err) {
  if (n != m->ninputs) {
    char names[256] = "";
    size_t used = 0;
    for (size_t i = 0; i < m->ninputs && used < sizeof names; i++)
      used += (size_t)snprintf(names + used, sizeof names - used, "%s'%s'", i ? ", " : "",
                               m->inputs[i].name);
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT, "expected %zu input(s) (%s), got %zu",
                         m->ninputs, names, n);
  }
  for (size_t i = 0; i < n; i++) {
    const grove_io_spec *sp = &m->inputs[i];
    const grove_tensor *t = &inputs[i];
    bool rank_ok = t->ndim == sp->ndim;
    bool dims_ok = rank_ok;
    for (int d = 0; dims_ok && d < sp->ndim; d++)
      dims_ok = sp->shape[d] == -1 || sp->shape[d] == t->shape[d];
    if (t->dtype != sp->dtype || !dims_ok) {
      char a[160], b[160];
      return grove_err_set(
          err, t->dtype != sp->dtype ? GROVE_E_DTYPE : GROVE_E_SHAPE,
          "input '%s': expected %s %s, got %s %s", sp->name, grove_dtype_name(sp->dtype),
          grove_shape_str(sp->ndim, sp->shape, a, sizeof a), grove_dtype_name(t->dtype),
          grove_shape_str(t->ndim < 0 || t->ndim > GROVE_MAX_DIMS ? 0 : t->ndim, t->shape, b,
                          sizeof b));
    }
    if (!t->data && grove_tensor_numel(t) > 0)
      return grove_err_set(err, GROVE_E_INVALID_ARGUMENT, "input '%s': no data", sp->name);
  }
  return GROVE_OK;
}

grove_status grove_model_forward(const grove_model *m, grove_arena *arena,
                                 const grove_tensor *inputs, size_t n, grove_values *out,
                                 grove_err *err) {
  grove_status s = grove_model_check_inputs(m, inputs, n, err);
  if (s) return s;
  grove_values in = {.n = (int)n};
  for (size_t i = 0; i < n; i++) in.v[i] = inputs[i];
  grove_fwd f = {.arena = arena, .err = err};
  *out = (grove_values){0};
  return grove_module_forward(m->root, &f, &in, out);
}
