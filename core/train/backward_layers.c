/* backward_layers.c: training forwards of the torch.nn layers without
 * convolutions or attention: Linear, the activations, Softmax / LogSoftmax,
 * Flatten, Dropout, Embedding, BatchNorm1d/2d and LayerNorm.
 *
 * Most are thin: they check the input as the serving forward does and hand
 * it to a functional op (backward_ops.c).  BatchNorm and Embedding keep their
 * own node here.  BatchNorm in training is torch's _BatchNorm.forward:
 * num_batches_tracked += 1, the factor is momentum (or 1 / num_batches_tracked
 * for momentum=None), the batch's mean and biased variance normalise, and
 * the running statistics take the mean and the *unbiased* variance, all in
 * double as torch's CPU kernel does (batch_norm_cpu_update_stats_template). */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "backward.h"
#include "ops.h"

static inline grove_tensor *val(grove__tape *t, int v) {
  return &t->vars[v].t;
}

static grove_status one_input(grove__tape *t, const char *layer, int nin, grove_dtype dt, int x) {
  if (nin != 1)
    return grove_err_set(t->err, GROVE_E_INVALID_ARGUMENT, "%s: expected 1 input tensor, got %d",
                         layer, nin);
  if (dt != GROVE_DTYPE_COUNT && val(t, x)->dtype != dt)
    return grove_err_set(t->err, GROVE_E_DTYPE, "%s: expected a %s input, got %s", layer,
                         grove_dtype_name(dt), grove_dtype_name(val(t, x)->dtype));
  return GROVE_OK;
}

/* Python's dim wrapping (a 0-d tensor counts as 1-d). */
static bool wrap_dim(int dim, int ndim, int *out) {
  int n = ndim == 0 ? 1 : ndim;
  if (dim < -n || dim >= n) return false;
  *out = dim < 0 ? dim + n : dim;
  return true;
}

/* ============================================================ Linear */

grove_status grove__tf_linear(grove__tape *t, const grove_module *m, const grove__tinfo *info,
                              const int *in, int nin, int *out, int *nout) {
  grove_status s = one_input(t, "Linear", nin, GROVE_F32, in[0]);
  const grove_tensor *W, *b;
  if (!s) s = grove__param_f32(t, m, "weight", -1, &W);
  if (!s && (!W || W->ndim != 2))
    s = grove_err_set(t->err, GROVE_E_SHAPE, "Linear: weight must be a 2-d tensor");
  if (!s) s = grove__param_f32(t, m, "bias", W->shape[0], &b);
  if (!s) s = grove__top_linear(t, in[0], W, b, &out[0]);
  if (!s) *nout = 1;
  return s;
}

/* ============================================================ activations */

grove_status grove__tf_activation(grove__tape *t, const grove_module *m, const grove__tinfo *info,
                                  const int *in, int nin, int *out, int *nout) {
  grove_status s = one_input(t, m->type->name, nin, GROVE_F32, in[0]);
  if (!s) s = grove__top_act(t, info->kind, info, in[0], &out[0]);
  if (!s) *nout = 1;
  return s;
}

grove_status grove__tf_softmax(grove__tape *t, const grove_module *m, const grove__tinfo *info,
                               const int *in, int nin, int *out, int *nout) {
  grove_status s = one_input(t, m->type->name, nin, GROVE_F32, in[0]);
  if (s) return s;
  const int nd = val(t, in[0])->ndim;
  /* torch's _get_softmax_dim for dim=None. */
  int dim = (int)grove__softmax_dim(info->has_dim, info->dim, nd), d; /* an int setting */
  if (!wrap_dim(dim, nd, &d))
    return grove_err_set(t->err, GROVE_E_SHAPE, "%s: dim %d is out of range for a %d-d input",
                         m->type->name, dim, nd);
  s = grove__top_softmax(t, in[0], nd == 0 ? 0 : d, info->kind == GROVE__TK_LOG_SOFTMAX, &out[0]);
  if (!s) *nout = 1;
  return s;
}

/* ============================================================ Flatten, Dropout */

grove_status grove__tf_flatten(grove__tape *t, const grove_module *m, const grove__tinfo *info,
                               const int *in, int nin, int *out, int *nout) {
  grove_status s = one_input(t, "Flatten", nin, GROVE_DTYPE_COUNT, in[0]);
  if (s) return s;
  const grove_tensor *x = val(t, in[0]);
  int sd, ed;
  if (!wrap_dim(info->start_dim, x->ndim, &sd) || !wrap_dim(info->end_dim, x->ndim, &ed) || sd > ed)
    return grove_err_set(t->err, GROVE_E_SHAPE,
                         "Flatten: start_dim %d and end_dim %d do not fit a %d-d input",
                         info->start_dim, info->end_dim, x->ndim);
  int64_t shape[GROVE_MAX_DIMS];
  const int nd = grove__flatten_shape(x, sd, ed, shape);
  s = grove__top_reshape(t, in[0], nd, shape, &out[0]);
  if (!s) *nout = 1;
  return s;
}

grove_status grove__tf_dropout(grove__tape *t, const grove_module *m, const grove__tinfo *info,
                               const int *in, int nin, int *out, int *nout) {
  grove_status s = one_input(t, "Dropout", nin, GROVE_F32, in[0]);
  if (!s) s = grove__top_dropout(t, in[0], info->p, &out[0]);
  if (!s) *nout = 1;
  return s;
}

/* ============================================================ Embedding */

static inline int64_t index_at(const grove_tensor *idx, int64_t i) {
  return idx->dtype == GROVE_I64 ? ((const int64_t *)idx->data)[i]
                                 : (int64_t)((const int32_t *)idx->data)[i];
}

/* torch's embedding_dense_backward: rows of the weight's gradient gather
 * the output's gradient; padding_idx's row gets none; with
 * scale_grad_by_freq each contribution is divided by how often its index
 * occurs in the batch. */
static grove_status embedding_backward(grove__tape *t, const grove__node *n) {
  const grove_tensor *W = n->p[0];
  float *dW;
  grove_status s = grove__param_grad(t, W, &dW);
  if (s || !dW) return s;
  const grove_tensor *idx = val(t, n->in[0]);
  const float *dy = grove__grad_in(t, n->out[0]);
  const int64_t V = W->shape[0], D = W->shape[1], cnt = grove_tensor_numel(idx);
  const int64_t pad = n->i[0];
  int64_t *freq = NULL;
  if (n->i[1]) {
    freq = grove__tscratch(t, (size_t)V * sizeof(int64_t), true);
    if (!freq) return GROVE_E_NOMEM;
    for (int64_t i = 0; i < cnt; i++) freq[index_at(idx, i)]++;
  }
  for (int64_t i = 0; i < cnt; i++) {
    const int64_t v = index_at(idx, i);
    if (v == pad) continue;
    const float scale = freq ? 1.0f / (float)freq[v] : 1.0f;
    float *row = dW + v * D;
    const float *g = dy + i * D;
    for (int64_t j = 0; j < D; j++) row[j] += g[j] * scale;
  }
  return GROVE_OK;
}

grove_status grove__tf_embedding(grove__tape *t, const grove_module *m, const grove__tinfo *info,
                                 const int *in, int nin, int *out, int *nout) {
  grove_status s = one_input(t, "Embedding", nin, GROVE_DTYPE_COUNT, in[0]);
  if (s) return s;
  const grove_tensor *idx = val(t, in[0]);
  if (idx->dtype != GROVE_I64 && idx->dtype != GROVE_I32)
    return grove_err_set(t->err, GROVE_E_DTYPE, "Embedding: indices must be int64 or int32, got %s",
                         grove_dtype_name(idx->dtype));
  if (idx->ndim + 1 > GROVE_MAX_DIMS)
    return grove_err_set(t->err, GROVE_E_SHAPE, "Embedding: indices have too many dimensions");
  const grove_tensor *W;
  if ((s = grove__param_f32(t, m, "weight", -1, &W))) return s;
  if (!W || W->ndim != 2)
    return grove_err_set(t->err, GROVE_E_SHAPE, "Embedding: weight must be a 2-d tensor");
  const int64_t V = W->shape[0], D = W->shape[1], cnt = grove_tensor_numel(idx);
  for (int64_t i = 0; i < cnt; i++) {
    const int64_t v = index_at(idx, i);
    if (v < 0 || v >= V)
      return grove_err_set(t->err, GROVE_E_RANGE,
                           "Embedding: index %" PRId64 " (at flat position %" PRId64
                           ") is out of range: num_embeddings is %" PRId64,
                           v, i, V);
  }
  int64_t shape[GROVE_MAX_DIMS];
  memcpy(shape, idx->shape, (size_t)idx->ndim * sizeof(int64_t));
  shape[idx->ndim] = D;
  float *yd;
  int yv = grove__var_alloc(t, GROVE_F32, idx->ndim + 1, shape, true, &yd);
  if (yv < 0) return GROVE_E_NOMEM;
  idx = val(t, in[0]);
  const float *wd = W->data;
  for (int64_t i = 0; i < cnt; i++)
    memcpy(yd + i * D, wd + index_at(idx, i) * D, (size_t)D * sizeof(float));
  out[0] = yv;
  *nout = 1;
  grove__node n = {
      .backward = embedding_backward, .m = m, .nin = 1, .nout = 1, .in = {in[0]}, .out = {yv}};
  n.p[0] = W;
  n.i[0] = info->padding_idx;
  n.i[1] = info->scale_grad_by_freq;
  return grove__node_add(t, &n);
}

/* ============================================================ BatchNorm */

/* The batch statistics are sums in double, as torch's CPU kernel keeps
 * them.  One accumulator made each sum a chain of dependent adds (4 cycles
 * each: BatchNorm was a tenth of a small ResNet's training step); BN_LANES
 * independent ones run as fast as the loads. */
#define BN_LANES 8

static inline double lanes_sum(const double *v) {
  double s = 0;
  for (int k = 0; k < BN_LANES; k++) s += v[k];
  return s;
}

/* The sum of x[0..L), and of (x[l] - m)^2, in double. */
static double sum_f32(const float *x, int64_t L) {
  double a[BN_LANES] = {0};
  int64_t l = 0;
  for (; l + BN_LANES <= L; l += BN_LANES)
    for (int k = 0; k < BN_LANES; k++) a[k] += x[l + k];
  for (; l < L; l++) a[0] += x[l];
  return lanes_sum(a);
}

static double sqdev_f32(const float *x, int64_t L, double m) {
  double q[BN_LANES] = {0};
  int64_t l = 0;
  for (; l + BN_LANES <= L; l += BN_LANES)
    for (int k = 0; k < BN_LANES; k++) {
      const double d = x[l + k] - m;
      q[k] += d * d;
    }
  for (; l < L; l++) {
    const double d = x[l] - m;
    q[0] += d * d;
  }
  return lanes_sum(q);
}

typedef struct bn_saved {
  int64_t N, C, L;
  double *mean, *invstd; /* per channel */
} bn_saved;

/* BatchNorm's loops run over the compute threads a chunk of channels at a
 * time: a channel's sums go over its N rows in order on one thread, so the
 * results do not depend on the thread count.  Within a chunk the loops go
 * row by row (i outer), in memory order: channel by channel they jumped
 * C * L floats every L, slower on small images. */
typedef struct bn_job {
  const bn_saved *sv;
  int64_t N, C, L;
  double M, eps;
  const float *x, *dy, *w, *b;
  float *y, *dx;
  double *var, *sdy, *sdyx;
} bn_job;

/* Channels per chunk: at least 16K elements of x. */
static int64_t bn_grain(const bn_job *j) {
  const int64_t per = j->N * j->L;
  return per >= 16384 ? 1 : 16384 / (per > 0 ? per : 1);
}

/* Two passes (the mean, then the squares about it), as torch does: a
 * one-pass E[x^2] - E[x]^2 loses digits when the mean is large. */
static void bn_stats_chunk(void *ctx, int64_t c0, int64_t c1) {
  const bn_job *j = ctx;
  const int64_t N = j->N, C = j->C, L = j->L;
  double *mean = j->sv->mean, *var = j->var; /* zeroed */
  for (int64_t i = 0; i < N; i++)
    for (int64_t c = c0; c < c1; c++) mean[c] += sum_f32(j->x + (i * C + c) * L, L);
  for (int64_t c = c0; c < c1; c++) mean[c] /= j->M;
  for (int64_t i = 0; i < N; i++)
    for (int64_t c = c0; c < c1; c++) var[c] += sqdev_f32(j->x + (i * C + c) * L, L, mean[c]);
  for (int64_t c = c0; c < c1; c++) {
    var[c] /= j->M;
    j->sv->invstd[c] = 1.0 / sqrt(var[c] + j->eps);
  }
}

static void bn_norm_chunk(void *ctx, int64_t c0, int64_t c1) {
  const bn_job *j = ctx;
  const int64_t N = j->N, C = j->C, L = j->L;
  for (int64_t i = 0; i < N; i++)
    for (int64_t c = c0; c < c1; c++) {
      const double a = (j->w ? j->w[c] : 1.0) * j->sv->invstd[c];
      const double sh = (j->b ? j->b[c] : 0.0) - j->sv->mean[c] * a;
      const float *xr = j->x + (i * C + c) * L;
      float *yr = j->y + (i * C + c) * L;
      for (int64_t l = 0; l < L; l++) yr[l] = (float)(xr[l] * a + sh);
    }
}

/* sdy[c] = sum dY, sdyx[c] = sum dY x-hat. */
static void bn_dsums_chunk(void *ctx, int64_t c0, int64_t c1) {
  const bn_job *j = ctx;
  const int64_t N = j->N, C = j->C, L = j->L;
  for (int64_t i = 0; i < N; i++)
    for (int64_t c = c0; c < c1; c++) {
      const double mean = j->sv->mean[c];
      const float *xr = j->x + (i * C + c) * L, *gr = j->dy + (i * C + c) * L;
      double a[BN_LANES] = {0}, bs[BN_LANES] = {0};
      int64_t l = 0;
      for (; l + BN_LANES <= L; l += BN_LANES)
        for (int k = 0; k < BN_LANES; k++) {
          a[k] += gr[l + k];
          bs[k] += gr[l + k] * (xr[l + k] - mean);
        }
      for (; l < L; l++) {
        a[0] += gr[l];
        bs[0] += gr[l] * (xr[l] - mean);
      }
      j->sdy[c] += lanes_sum(a); /* zeroed */
      j->sdyx[c] += lanes_sum(bs) * j->sv->invstd[c];
    }
}

static void bn_dx_chunk(void *ctx, int64_t c0, int64_t c1) {
  const bn_job *j = ctx;
  const int64_t N = j->N, C = j->C, L = j->L;
  for (int64_t i = 0; i < N; i++)
    for (int64_t c = c0; c < c1; c++) {
      const double mean = j->sv->mean[c], is = j->sv->invstd[c];
      const double k = (j->w ? j->w[c] : 1.0) * is, mdy = j->sdy[c] / j->M,
                   mdyx = j->sdyx[c] / j->M;
      const float *xr = j->x + (i * C + c) * L, *gr = j->dy + (i * C + c) * L;
      float *dr = j->dx + (i * C + c) * L;
      for (int64_t l = 0; l < L; l++) {
        const double xhat = (xr[l] - mean) * is;
        dr[l] += (float)(k * (gr[l] - mdy - xhat * mdyx));
      }
    }
}

static grove_status bn_backward(grove__tape *t, const grove__node *n) {
  const bn_saved *sv = n->saved;
  const int64_t N = sv->N, C = sv->C, L = sv->L;
  const double M = (double)(N * L);
  const int x = n->in[0];
  const float *xd = val(t, x)->data;
  const float *dy = grove__grad_in(t, n->out[0]);
  const grove_tensor *w = n->p[0], *b = n->p[1];
  float *dx = NULL, *dw = NULL, *db = NULL;
  grove_status s = GROVE_OK;
  if (grove__wants(t, x) && !(dx = grove__grad(t, x))) return GROVE_E_NOMEM;
  if (w) s = grove__param_grad(t, w, &dw);
  if (!s && b) s = grove__param_grad(t, b, &db);
  if (s) return s;
  double *sdy = grove__tscratch(t, 2 * (size_t)C * sizeof(double), true);
  if (!sdy) return GROVE_E_NOMEM;
  bn_job j = {.sv = sv,
              .N = N,
              .C = C,
              .L = L,
              .M = M,
              .x = xd,
              .dy = dy,
              .w = w ? w->data : NULL,
              .dx = dx,
              .sdy = sdy,
              .sdyx = sdy + C};
  grove__parallel_for(C, bn_grain(&j), bn_dsums_chunk, &j);
  for (int64_t c = 0; c < C; c++) {
    if (dw) dw[c] += (float)j.sdyx[c];
    if (db) db[c] += (float)j.sdy[c];
  }
  if (dx) grove__parallel_for(C, bn_grain(&j), bn_dx_chunk, &j);
  return GROVE_OK;
}

/* Writes a float buffer (f32 or another float dtype) from double values. */
static void store(grove_tensor *b, int64_t c, double v) {
  if (b->dtype == GROVE_F32)
    ((float *)b->data)[c] = (float)v;
  else if (b->dtype == GROVE_F64)
    ((double *)b->data)[c] = v;
}

static double load(const grove_tensor *b, int64_t c) {
  if (b->dtype == GROVE_F32) return ((const float *)b->data)[c];
  if (b->dtype == GROVE_F64) return ((const double *)b->data)[c];
  return 0;
}

grove_status grove__tf_batch_norm(grove__tape *t, const grove_module *m, const grove__tinfo *info,
                                  const int *in, int nin, int *out, int *nout) {
  const char *T = m->type->name;
  grove_status s = one_input(t, T, nin, GROVE_F32, in[0]);
  if (s) return s;
  const grove_tensor *x = val(t, in[0]);
  const bool two = info->conv_dims == 2;
  const grove_tensor *w, *b;
  if ((s = grove__param_f32(t, m, "weight", -1, &w)) ||
      (s = grove__param_f32(t, m, "bias", -1, &b)))
    return s;
  grove_tensor *rm = grove_module_buffer(m, "running_mean");
  grove_tensor *rv = grove_module_buffer(m, "running_var");
  grove_tensor *nbt = grove_module_buffer(m, "num_batches_tracked");
  int64_t C = w ? w->shape[0] : rm ? rm->shape[0] : x->ndim >= 2 ? x->shape[1] : 0;
  bool ok = two ? x->ndim == 4 : (x->ndim == 2 || x->ndim == 3);
  if (!ok || x->shape[1] != C) {
    char got[128];
    grove_shape_str(x->ndim, x->shape, got, sizeof got);
    return grove_err_set(t->err, GROVE_E_SHAPE, "%s: expected %s input with %lld channels, got %s",
                         T, two ? "a 4-d [N, C, H, W]" : "a 2-d or 3-d", (long long)C, got);
  }
  const int64_t N = x->shape[0];
  int64_t L = 1;
  for (int i = 2; i < x->ndim; i++) L *= x->shape[i];
  if (N * L <= 1) {
    char got[128];
    grove_shape_str(x->ndim, x->shape, got, sizeof got);
    return grove_err_set(t->err, GROVE_E_SHAPE,
                         "%s: Expected more than 1 value per channel when training, got input "
                         "size %s",
                         T, got);
  }
  bn_saved *sv = grove__tscratch(t, sizeof *sv, false);
  double *st = grove__tscratch(t, 2 * (size_t)C * sizeof(double), true);
  if (!sv || !st) return GROVE_E_NOMEM;
  *sv = (bn_saved){N, C, L, st, st + C};
  float *yd;
  int yv = grove__var_alloc(t, GROVE_F32, x->ndim, x->shape, true, &yd);
  if (yv < 0) return GROVE_E_NOMEM;
  x = val(t, in[0]);
  const float *xd = x->data;
  const double M = (double)(N * L);
  double *var = grove__tscratch(t, (size_t)C * sizeof(double), true);
  if (!var) return GROVE_E_NOMEM;
  bn_job j = {.sv = sv,
              .N = N,
              .C = C,
              .L = L,
              .M = M,
              .eps = info->eps,
              .x = xd,
              .w = w ? w->data : NULL,
              .b = b ? b->data : NULL,
              .y = yd,
              .var = var};
  grove__parallel_for(C, bn_grain(&j), bn_stats_chunk, &j);
  grove__parallel_for(C, bn_grain(&j), bn_norm_chunk, &j);
  /* The running statistics, as torch updates them in training. */
  if (info->track && rm && rv) {
    double f = info->momentum;
    if (nbt && nbt->dtype == GROVE_I64 && grove_tensor_numel(nbt) == 1) {
      int64_t *cnt = nbt->data;
      *cnt += 1;
      if (isnan(f)) f = 1.0 / (double)*cnt;
    } else if (isnan(f)) {
      f = 0.0; /* momentum=None without num_batches_tracked: torch would fail; keep */
    }
    for (int64_t c = 0; c < C; c++) {
      store(rm, c, f * sv->mean[c] + (1.0 - f) * load(rm, c));
      store(rv, c, f * (var[c] * M / (M - 1.0)) + (1.0 - f) * load(rv, c));
    }
  }
  out[0] = yv;
  *nout = 1;
  grove__node n = {
      .backward = bn_backward, .m = m, .nin = 1, .nout = 1, .in = {in[0]}, .out = {yv}};
  n.saved = sv;
  n.p[0] = w;
  n.p[1] = b;
  return grove__node_add(t, &n);
}

/* ============================================================ LayerNorm */

grove_status grove__tf_layer_norm(grove__tape *t, const grove_module *m, const grove__tinfo *info,
                                  const int *in, int nin, int *out, int *nout) {
  grove_status s = one_input(t, "LayerNorm", nin, GROVE_F32, in[0]);
  if (s) return s;
  const grove_tensor *x = val(t, in[0]);
  bool ok = x->ndim >= info->ln_ndim;
  int64_t D = 1;
  for (int d = 0; ok && d < info->ln_ndim; d++) {
    ok = x->shape[x->ndim - info->ln_ndim + d] == info->ln_shape[d];
    D *= info->ln_shape[d];
  }
  if (!ok) {
    char got[128], want[128];
    return grove_err_set(t->err, GROVE_E_SHAPE,
                         "LayerNorm: given normalized_shape=%s, got input of size %s",
                         grove_shape_str(info->ln_ndim, info->ln_shape, want, sizeof want),
                         grove_shape_str(x->ndim, x->shape, got, sizeof got));
  }
  const grove_tensor *w, *b;
  if ((s = grove__param_f32(t, m, "weight", D, &w)) || (s = grove__param_f32(t, m, "bias", D, &b)))
    return s;
  s = grove__top_layer_norm(t, in[0], D, info->eps, w, b, &out[0]);
  if (!s) *nout = 1;
  return s;
}
