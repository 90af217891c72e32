/* model_probe.c: is dimension 0 of a model's inputs a batch of independent
 * rows?
 *
 * groved concatenates requests along dimension 0 and splits every output
 * along it again (server/worker.c).  That is right for the models that treat
 * dimension 0 as torch's batch: each row's result depends on that row alone.
 * It is wrong for models that PyTorch users write every day with another
 * meaning there: an LSTM, GRU or Transformer layer with batch_first=False
 * reads dimension 0 as time, and a recurrent net's h_n / c_n have the batch
 * in dimension 1 ([layers * directions, N, H]).  Batched, the first would mix
 * two clients' sequences into one (a silently wrong answer), the second
 * could not be split at all.
 *
 * So groved asks the model itself, once per version before serving it
 * (grove_model_probe_batching, include/grove/model.h): three
 * small forwards on the same random inputs, row A alone, row B alone, and A
 * and B as one batch of two.  The rows are independent when every output has
 * 1, 1 and 2 in dimension 0 (the rest equal) and the batch's rows equal the
 * lone forwards' within the parity tolerance.  Otherwise the model is served
 * as Triton serves max_batch_size 0: one request per forward, its inputs and
 * outputs whole (batching.max_batch_size becomes 0, and a warning names the
 * output and the reason).  A spec that says max_batch_size 0 is not probed.
 *
 * The probe proves nothing when it cannot run (a value-dependent failure on
 * random inputs, an input with a fixed dimension 0, integer inputs that only
 * take 0 and 1): the model is then served as its spec says, as before. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grove/grove.h"
#include "module_internal.h"

/* The lone rows' free (-1) non-batch dimensions: 2, so that a dimension
 * that mixes positions (time, tokens) has two of them to mix. */
#define PROBE_FREE_DIM 2
/* The parity tolerance of the test suites (rtol 1e-3, atol 1e-4): a batch of
 * two may take other kernel paths than a row alone, never other values. */
#define PROBE_RTOL 1e-3
#define PROBE_ATOL 1e-4

typedef struct {
  grove_arena *arena;
  void *bufs[GROVE_MAX_VALUES];
  grove_values in, out;
} probe_run;

static void run_fini(probe_run *r) {
  for (size_t i = 0; i < GROVE_MAX_VALUES; i++) free(r->bufs[i]);
  grove_arena_free(r->arena);
}

/* xorshift64*: the same inputs on every open, no global state. */
static uint64_t next_rand(uint64_t *s) {
  *s ^= *s >> 12;
  *s ^= *s << 25;
  *s ^= *s >> 27;
  return *s * 2685821657736338717ull;
}

static void fill(grove_tensor *t, uint64_t seed) {
  uint64_t st = seed * 0x9E3779B97F4A7C15ull + 1;
  size_t n = (size_t)grove_tensor_numel(t);
  for (size_t j = 0; j < n; j++) {
    uint64_t u = next_rand(&st);
    switch (t->dtype) {
    case GROVE_F32: ((float *)t->data)[j] = (float)((double)(u >> 11) / 9007199254740992.0 * 2 - 1); break;
    case GROVE_F64: ((double *)t->data)[j] = (double)(u >> 11) / 9007199254740992.0 * 2 - 1; break;
    case GROVE_I64: ((int64_t *)t->data)[j] = (int64_t)(u >> 63); break;
    case GROVE_I32: ((int32_t *)t->data)[j] = (int32_t)(u >> 63); break;
    case GROVE_BOOL: ((uint8_t *)t->data)[j] = (uint8_t)(u >> 63); break;
    default: memset((unsigned char *)t->data + j * grove_dtype_size(t->dtype), 0,
                    grove_dtype_size(t->dtype));
    }
  }
}

/* Inputs of `rows` rows (every free dimension PROBE_FREE_DIM); row k of them
 * is filled from seed k + first, so that the batch of two holds exactly the
 * rows the lone runs held. */
static grove_status make_inputs(const grove_model *m, int64_t rows, int64_t first, probe_run *r,
                                grove_err *err) {
  r->in.n = (int)m->ninputs;
  for (size_t i = 0; i < m->ninputs; i++) {
    const grove_io_spec *sp = &m->inputs[i];
    int64_t shape[GROVE_MAX_DIMS];
    size_t row_elems = 1;
    shape[0] = rows;
    for (int d = 1; d < sp->ndim; d++) {
      shape[d] = sp->shape[d] == -1 ? PROBE_FREE_DIM : sp->shape[d];
      if (shape[d] > 0 && row_elems > SIZE_MAX / 64 / (size_t)shape[d])
        return grove_err_set(err, GROVE_E_LIMIT, "input '%s' is too large to probe", sp->name);
      row_elems *= (size_t)shape[d];
    }
    size_t esz = grove_dtype_size(sp->dtype);
    if (!(r->bufs[i] = calloc(1, row_elems * esz * (size_t)rows + 1)))
      return grove_err_set(err, GROVE_E_NOMEM, "out of memory");
    grove_tensor_init(&r->in.v[i], sp->dtype, sp->ndim, shape, r->bufs[i]);
    for (int64_t k = 0; k < rows; k++) {
      int64_t one[GROVE_MAX_DIMS];
      memcpy(one, shape, sizeof one);
      one[0] = 1;
      grove_tensor row;
      grove_tensor_init(&row, sp->dtype, sp->ndim, one,
                        (unsigned char *)r->bufs[i] + (size_t)k * row_elems * esz);
      fill(&row, (uint64_t)(first + k) * 131 + i);
    }
  }
  return GROVE_OK;
}

static grove_status run(const grove_model *m, int64_t rows, int64_t first, probe_run *r,
                        grove_err *err) {
  grove_status s = make_inputs(m, rows, first, r, err);
  if (!s && !(r->arena = grove_arena_new(0))) s = grove_err_set(err, GROVE_E_NOMEM, "out of memory");
  if (!s) {
    grove_fwd f = {.arena = r->arena, .err = err};
    s = grove_module_forward(m->root, &f, &r->in, &r->out);
  }
  return s;
}

/* Element j of t as a double (t any layout). */
static double at(const grove_tensor *t, const int64_t *idx) {
  int64_t off = 0;
  for (int d = 0; d < t->ndim; d++) off += idx[d] * t->strides[d];
  const unsigned char *p = (const unsigned char *)t->data + (size_t)off * grove_dtype_size(t->dtype);
  switch (t->dtype) {
  case GROVE_F32: return *(const float *)p;
  case GROVE_F64: return *(const double *)p;
  case GROVE_I64: return (double)*(const int64_t *)p;
  case GROVE_I32: return *(const int32_t *)p;
  case GROVE_BOOL:
  case GROVE_U8: return *p;
  case GROVE_I8: return *(const int8_t *)p;
  default: return 0; /* half types: not compared */
  }
}

static bool close_enough(double a, double b) {
  if (isnan(a) || isnan(b)) return isnan(a) && isnan(b);
  if (isinf(a) || isinf(b)) return a == b;
  return fabs(a - b) <= PROBE_ATOL + PROBE_RTOL * fabs(b);
}

/* Row `row` of the batch's output against the lone run's whole output;
 * *worst: the largest difference seen. */
static bool rows_match(const grove_tensor *batch, int64_t row, const grove_tensor *lone,
                       double *worst) {
  int64_t idx[GROVE_MAX_DIMS] = {0}, bidx[GROVE_MAX_DIMS];
  int64_t n = grove_tensor_numel(lone);
  bool ok = true;
  for (int64_t j = 0; j < n; j++) {
    memcpy(bidx, idx, sizeof bidx);
    bidx[0] = row;
    double a = at(batch, bidx), b = at(lone, idx);
    if (!close_enough(a, b)) {
      ok = false;
      double d = isfinite(a - b) ? fabs(a - b) : INFINITY;
      if (d > *worst) *worst = d;
    }
    for (int d = lone->ndim - 1; d >= 0; d--) {
      if (++idx[d] < lone->shape[d]) break;
      idx[d] = 0;
    }
  }
  return ok;
}

static const char *out_name(const grove_model *m, int k, char *buf, size_t cap) {
  if ((size_t)k < m->noutputs && m->outputs[k].name) return m->outputs[k].name;
  snprintf(buf, cap, "%d", k);
  return buf;
}

/* Why the outputs say the rows are not independent, or "" when they are. */
static void judge(const grove_model *m, const probe_run *a, const probe_run *b,
                  const probe_run *ab, char *why, size_t cap) {
  why[0] = '\0';
  char nb[16], s1[160], s2[160];
  for (int k = 0; k < ab->out.n; k++) {
    const grove_tensor *x = &a->out.v[k], *y = &b->out.v[k], *z = &ab->out.v[k];
    const char *name = out_name(m, k, nb, sizeof nb);
    bool shapes = x->ndim >= 1 && x->ndim == y->ndim && x->ndim == z->ndim && x->shape[0] == 1 &&
                  y->shape[0] == 1 && z->shape[0] == 2 && x->dtype == z->dtype;
    for (int d = 1; shapes && d < x->ndim; d++)
      shapes = x->shape[d] == y->shape[d] && x->shape[d] == z->shape[d];
    if (!shapes) {
      snprintf(why, cap,
               "output '%s' is %s for one row and %s for two: dimension 0 is not the batch", name,
               grove_shape_str(x->ndim, x->shape, s1, sizeof s1),
               grove_shape_str(z->ndim, z->shape, s2, sizeof s2));
      return;
    }
    double worst = 0;
    bool first_ok = rows_match(z, 0, x, &worst);
    bool second_ok = rows_match(z, 1, y, &worst);
    if (!first_ok || !second_ok) {
      snprintf(why, cap,
               "output '%s': rows computed in one batch differ from the same rows computed alone "
               "(by up to %g): the rows of dimension 0 are not independent (a sequence-first "
               "recurrent or attention layer reads it as time)",
               name, worst);
      return;
    }
  }
}

grove_status grove_model_probe_batching(grove_model *m, grove_err *err) {
  if (m->batching.max_batch_size == 0 || m->ninputs == 0) return GROVE_OK;
  for (size_t i = 0; i < m->ninputs; i++)
    if (m->inputs[i].ndim < 1 || m->inputs[i].shape[0] != -1) return GROVE_OK;
  probe_run a = {0}, b = {0}, ab = {0};
  grove_err perr = {0};
  grove_status s = run(m, 1, 0, &a, &perr);
  if (!s) s = run(m, 1, 1, &b, &perr);
  if (!s) s = run(m, 2, 0, &ab, &perr);
  if (s == GROVE_E_NOMEM) {
    grove_err_set(err, GROVE_E_NOMEM, "out of memory");
  } else if (s) {
    grove__log(GROVE_LOG_DEBUG, "model.probe_skipped",
               "model '%s': the batch probe on random inputs did not run (%s); served as its "
               "spec says",
               m->name ? m->name : "?", grove_err_msg(&perr));
    s = GROVE_OK;
  } else {
    char why[512];
    judge(m, &a, &b, &ab, why, sizeof why);
    if (why[0]) {
      grove__log(GROVE_LOG_WARN, "model.unbatched",
                 "model '%s': %s; groved runs it one request per forward, its inputs and "
                 "outputs whole (as batching.max_batch_size 0)",
                 m->name ? m->name : "?", why);
      m->batching.max_batch_size = 0;
    }
  }
  run_fini(&a);
  run_fini(&b);
  run_fini(&ab);
  return s;
}
