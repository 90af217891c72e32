/* layers_norm.c: torch.nn.BatchNorm1d, BatchNorm2d and LayerNorm, eval mode.
 *
 * The two BatchNorms share their impl, refresh, checkpoint fixup,
 * constructor and model.json builder; only their forwards differ (BatchNorm2d
 * reads a channels-last input from a convolution as it is, and cuts its rows
 * between the compute threads).  A BatchNorm with running statistics folds them, in refresh, into
 * one scale and one shift per channel (y = x * scale + shift, torch's own eval formulation);
 * without them (track_running_stats=False) it normalises with the batch's statistics even in eval,
 * as torch does.  LayerNorm computes each row's mean and variance in two passes in double, so that
 * rows with a large mean lose nothing to cancellation.
 *
 * Both copy their (small, per-channel) parameters into impl in refresh, so
 * forward reads nothing but impl and its input.  A strided input is copied
 * into the arena first (grove__layer_input). */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "layers_internal.h"
#include "tensor_ops.h"

/* ------------------------------------------------------------ BatchNorm1d and BatchNorm2d */

typedef struct bn_impl {
  int64_t C;
  double eps;
  double momentum; /* NaN for None; kept for the exporter, unused in eval */
  bool affine, track_running_stats;
  bool use_running;     /* running_mean and running_var are not None */
  float *scale, *shift; /* folded running statistics (use_running) */
  float *weight, *bias; /* the affine parameters, 1 and 0 when None */
  float data[];         /* 4 * C floats behind the four pointers */
} bn_impl;

/* BatchNorm1d and BatchNorm2d (T, the type's name, in messages). */
static grove_status bn_refresh(grove_module *m, grove_err *err) {
  bn_impl *p = m->impl;
  const char *T = m->type->name;
  const int64_t C = p->C;
  const grove_tensor *w = grove_module_param(m, "weight");
  const grove_tensor *b = grove_module_param(m, "bias");
  const grove_tensor *rm = grove_module_buffer(m, "running_mean");
  const grove_tensor *rv = grove_module_buffer(m, "running_var");
  if (!rm != !rv)
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT,
                         "%s: running_mean and running_var must both be tensors or both "
                         "be None",
                         T);
  /* Validate everything before writing, so a failure leaves impl as it was. */
  const grove_tensor *all[4] = {w, b, rm, rv};
  static const char *const names[4] = {"weight", "bias", "running_mean", "running_var"};
  for (int i = 0; i < 4; i++) {
    if (!all[i]) continue;
    if (grove_tensor_numel(all[i]) != C || all[i]->ndim != 1) {
      char got[128];
      grove_shape_str(all[i]->ndim, all[i]->shape, got, sizeof got);
      return grove_err_set(err, GROVE_E_SHAPE, "%s: %s has shape %s, expected [%lld]", T, names[i],
                           got, (long long)C);
    }
    if (!grove_dtype_is_float(all[i]->dtype))
      return grove_err_set(err, GROVE_E_DTYPE, "%s: %s is %s, expected floating point", T, names[i],
                           grove_dtype_name(all[i]->dtype));
  }
  grove_status s = GROVE_OK;
  if (w)
    s = grove__copy_f32(p->weight, C, w, T, "weight", err);
  else
    for (int64_t c = 0; c < C; c++) p->weight[c] = 1.0f;
  if (s != GROVE_OK) return s;
  if (b)
    s = grove__copy_f32(p->bias, C, b, T, "bias", err);
  else
    memset(p->bias, 0, (size_t)C * sizeof(float));
  if (s != GROVE_OK) return s;
  p->use_running = rm != NULL;
  if (!p->use_running) return GROVE_OK;
  /* scale and shift serve as scratch for the running stats, then are
   * overwritten in place by the folded values. */
  s = grove__copy_f32(p->scale, C, rm, T, "running_mean", err);
  if (!s) s = grove__copy_f32(p->shift, C, rv, T, "running_var", err);
  if (s != GROVE_OK) return s;
  for (int64_t c = 0; c < C; c++) {
    double mean = p->scale[c], var = p->shift[c];
    double a = (double)p->weight[c] / sqrt(var + p->eps);
    p->scale[c] = (float)a;
    p->shift[c] = (float)((double)p->bias[c] - mean * a);
  }
  return GROVE_OK;
}

/* y[n, c, l] = x[n, c, l] * a[c] + b[c] over a (N, C, L) block. */
static void bn_apply(const float *restrict x, float *restrict y, int64_t N, int64_t C, int64_t L,
                     const float *restrict a, const float *restrict b) {
  if (L == 1) {
    for (int64_t n = 0; n < N; n++) {
      const float *xr = x + n * C;
      float *yr = y + n * C;
      for (int64_t c = 0; c < C; c++) yr[c] = xr[c] * a[c] + b[c];
    }
    return;
  }
  for (int64_t n = 0; n < N; n++) {
    for (int64_t c = 0; c < C; c++) {
      const float *xr = x + (n * C + c) * L;
      float *yr = y + (n * C + c) * L;
      const float ac = a[c], bc = b[c];
      for (int64_t l = 0; l < L; l++) yr[l] = xr[l] * ac + bc;
    }
  }
}

/* Batch statistics (track_running_stats=False): mean and biased variance
 * per channel over N and L, in double, two passes.  a and b get the folded
 * scale and shift; sum and sq are C doubles of scratch. */
static void bn_batch_stats(const bn_impl *p, const float *restrict x, int64_t N, int64_t L,
                           double *restrict mean, double *restrict sq, float *restrict a,
                           float *restrict b) {
  const int64_t C = p->C;
  for (int64_t c = 0; c < C; c++) mean[c] = sq[c] = 0;
  for (int64_t n = 0; n < N; n++)
    for (int64_t c = 0; c < C; c++)
      for (int64_t l = 0; l < L; l++) mean[c] += x[(n * C + c) * L + l];
  const double count = (double)(N * L);
  for (int64_t c = 0; c < C; c++) mean[c] /= count;
  for (int64_t n = 0; n < N; n++)
    for (int64_t c = 0; c < C; c++)
      for (int64_t l = 0; l < L; l++) {
        double d = x[(n * C + c) * L + l] - mean[c];
        sq[c] += d * d;
      }
  for (int64_t c = 0; c < C; c++) {
    double inv = 1.0 / sqrt(sq[c] / count + p->eps);
    double ac = p->weight[c] * inv;
    a[c] = (float)ac;
    b[c] = (float)(p->bias[c] - mean[c] * ac);
  }
}

static grove_status bn1d_forward(const grove_module *m, grove_fwd *f, const grove_values *in,
                                 grove_values *out) {
  const bn_impl *p = m->impl;
  if (m->training)
    return grove_err_set(f->err, GROVE_E_UNSUPPORTED,
                         "BatchNorm1d: training-mode forward is not available on a serving tree");
  grove_tensor x;
  grove_status s = grove__layer_input("BatchNorm1d", f, in, GROVE_F32, &x);
  if (s != GROVE_OK) return s;
  const int64_t C = p->C;
  if ((x.ndim != 2 && x.ndim != 3) || x.shape[1] != C) {
    char got[128];
    grove_shape_str(x.ndim, x.shape, got, sizeof got);
    return grove_err_set(f->err, GROVE_E_SHAPE,
                         "BatchNorm1d: expected input of shape [N, %lld] or [N, %lld, L] "
                         "(num_features = %lld), got %s",
                         (long long)C, (long long)C, (long long)C, got);
  }
  const int64_t N = x.shape[0], L = x.ndim == 3 ? x.shape[2] : 1;
  s = grove_fwd_alloc(f, &out->v[0], GROVE_F32, x.ndim, x.shape);
  if (s != GROVE_OK) return s;
  out->n = 1;
  if (N * L == 0) return GROVE_OK;
  if (p->use_running) {
    bn_apply(x.data, out->v[0].data, N, C, L, p->scale, p->shift);
    return GROVE_OK;
  }
  /* torch's F.batch_norm refuses batch statistics over a single value. */
  if (N * L == 1) {
    char got[128];
    grove_shape_str(x.ndim, x.shape, got, sizeof got);
    return grove_err_set(f->err, GROVE_E_SHAPE,
                         "BatchNorm1d: expected more than 1 value per channel to compute batch "
                         "statistics (track_running_stats=False), got input size %s",
                         got);
  }
  double *mean = grove_arena_alloc(f->arena, (size_t)C * 2 * sizeof(double));
  float *ab = grove_arena_alloc(f->arena, (size_t)C * 2 * sizeof(float));
  if (!mean || !ab)
    return grove_err_set(f->err, GROVE_E_NOMEM, "BatchNorm1d: scratch arena is exhausted");
  bn_batch_stats(p, x.data, N, L, mean, mean + C, ab, ab + C);
  bn_apply(x.data, out->v[0].data, N, C, L, ab, ab + C);
  return GROVE_OK;
}

/* ------------------------------------------------------------ BatchNorm2d */

bool grove__bn2d_affine(const grove_module *m, const float **scale, const float **shift) {
  const bn_impl *p = m->impl;
  if (m->type != &grove__batch_norm2d_type || !p->use_running || m->training) return false;
  *scale = p->scale;
  *shift = p->shift;
  return true;
}

int64_t grove__bn2d_channels(const grove_module *m) {
  return ((const bn_impl *)m->impl)->C;
}

/* y row r = x row r * a[c] + b[c], c = r % C, for rows [b, e) of L floats. */
typedef struct bn2d_par {
  const float *x;
  float *y;
  int64_t C, L;
  const float *a, *b;
  int64_t ld; /* NHWC: floats from one position of x to the next */
  grove__act act; /* applied to each run just written (NONE: none) */
} bn2d_par;

/* The floats between positions of a channels-last [N, C, H, W] x whose
 * positions may hold more than its C channels (the first channels of a
 * concatenation's buffer: core/graph/graph.c, DenseNet's growing
 * features), or 0 when x is not laid out so. */
static int64_t nhwc_ld(const grove_tensor *x) {
  if (x->ndim != 4 || x->strides[1] != 1) return 0;
  const int64_t ld = x->strides[3], H = x->shape[2], W = x->shape[3];
  if (ld < x->shape[1] || x->strides[2] != W * ld || x->strides[0] != H * W * ld) return 0;
  return ld > x->shape[1] || grove__is_nhwc(x) ? ld : 0;
}

static void bn2d_rows(void *ctx, int64_t b, int64_t e) {
  const bn2d_par *c = ctx;
  for (int64_t r = b; r < e; r++) {
    const int64_t ch = r % c->C;
    const float a = c->a[ch], bb = c->b[ch];
    const float *restrict x = c->x + r * c->L;
    float *restrict y = c->y + r * c->L;
    for (int64_t l = 0; l < c->L; l++) y[l] = x[l] * a + bb;
    grove__act_apply(c->act, y, y, c->L);
  }
}

/* NHWC: y position r = x position r * a + b (C channels each; x's
 * positions ld floats apart), r in [b, e). */
static void bn2d_positions(void *ctx, int64_t b, int64_t e) {
  const bn2d_par *c = ctx;
  const int64_t C = c->C;
  for (int64_t r = b; r < e; r++) {
    const float *restrict x = c->x + r * c->ld;
    float *restrict y = c->y + r * C;
    for (int64_t k = 0; k < C; k++) y[k] = x[k] * c->a[k] + c->b[k];
    grove__act_apply(c->act, y, y, C);
  }
}

static grove_status bn2d_forward(const grove_module *m, grove_fwd *f, const grove_values *in,
                                 grove_values *out) {
  return grove__bn2d_act_forward(m, f, in, out, GROVE__ACT_NONE);
}

grove_status grove__bn2d_act_forward(const grove_module *m, grove_fwd *f, const grove_values *in,
                                     grove_values *out, grove__act act) {
  const bn_impl *p = m->impl;
  if (m->training)
    return grove_err_set(f->err, GROVE_E_UNSUPPORTED,
                         "BatchNorm2d: training-mode forward is not available on a serving tree");
  grove_tensor x;
  grove_status s;
  /* Channels last (from a convolution) is read as it is when running
   * statistics are used: the same scale and shift per element. */
  const int64_t ld = in->n == 1 && p->use_running && in->v[0].dtype == GROVE_F32 &&
                             in->v[0].ndim == 4 && in->v[0].shape[1] == p->C
                         ? nhwc_ld(&in->v[0])
                         : 0;
  const bool nhwc = ld > 0;
  if (nhwc)
    x = in->v[0];
  else if ((s = grove__layer_input("BatchNorm2d", f, in, GROVE_F32, &x)) != GROVE_OK)
    return s;
  const int64_t C = p->C;
  if (x.ndim != 4 || x.shape[1] != C) {
    char want[96];
    snprintf(want, sizeof want, "a 4-d input [N, %lld, H, W] (num_features = %lld)", (long long)C,
             (long long)C);
    return grove__shape_error(f, "BatchNorm2d", want, &x);
  }
  const int64_t N = x.shape[0], L = x.shape[2] * x.shape[3];
  s = grove_fwd_alloc(f, &out->v[0], GROVE_F32, 4, x.shape);
  if (s != GROVE_OK) return s;
  out->n = 1;
  if (N * L == 0) return GROVE_OK;
  const float *a = p->scale, *b = p->shift;
  if (nhwc) {
    /* Positions of C floats: y = x * a + b per channel, same layout. */
    grove__set_nhwc(&out->v[0]);
    bn2d_par c = {.x = x.data, .y = out->v[0].data, .C = C, .L = L, .a = a, .b = b, .ld = ld,
                  .act = act};
    grove__parallel_for(N * L, grove__par_grain(2 * C), bn2d_positions, &c);
    return GROVE_OK;
  }
  if (!p->use_running) {
    /* Batch statistics, as torch does in eval without running stats. */
    if (N * L == 1)
      return grove__shape_error(f, "BatchNorm2d",
                                "more than 1 value per channel to compute batch statistics "
                                "(track_running_stats=False)",
                                &x);
    double *st = grove_arena_alloc(f->arena, (size_t)C * 2 * sizeof(double));
    float *ab = grove_arena_alloc(f->arena, (size_t)C * 2 * sizeof(float));
    if (!st || !ab) return grove__scratch_error(f, "BatchNorm2d");
    const float *xd = x.data;
    for (int64_t c = 0; c < C; c++) {
      double sum = 0, sq = 0;
      for (int64_t n = 0; n < N; n++) {
        const float *r = xd + (n * C + c) * L;
        for (int64_t l = 0; l < L; l++) sum += r[l];
      }
      const double mean = sum / (double)(N * L);
      for (int64_t n = 0; n < N; n++) {
        const float *r = xd + (n * C + c) * L;
        for (int64_t l = 0; l < L; l++) {
          double d = r[l] - mean;
          sq += d * d;
        }
      }
      double ac = p->weight[c] / sqrt(sq / (double)(N * L) + p->eps);
      ab[c] = (float)ac;
      ab[C + c] = (float)(p->bias[c] - mean * ac);
    }
    a = ab;
    b = ab + C;
  }
  /* Rows (n, c) of L floats, taken by the compute threads in runs. */
  bn2d_par c = {.x = x.data, .y = out->v[0].data, .C = C, .L = L, .a = a, .b = b, .act = act};
  grove__parallel_for(N * C, grove__par_grain(2 * L), bn2d_rows, &c);
  return GROVE_OK;
}

/* ------------------------------------------------------------ both BatchNorms */

/* torch's _NormBase._load_from_state_dict: checkpoints from before version 2
 * (or without metadata, as every safetensors file) may lack
 * num_batches_tracked; it is added as 0 so that a strict load succeeds. */
static grove_status bn_load_fixup(grove_module *m, grove_state_dict *sd, const char *prefix,
                                  int version, grove_err *err) {
  const bn_impl *p = m->impl;
  if (version >= 2 || !p->track_running_stats) return GROVE_OK;
  if (!prefix) prefix = "";
  size_t n = strlen(prefix) + sizeof "num_batches_tracked";
  char *key = malloc(n);
  if (!key) return grove_err_set(err, GROVE_E_NOMEM, "%s: out of memory", m->type->name);
  snprintf(key, n, "%snum_batches_tracked", prefix);
  grove_status s = GROVE_OK;
  if (!grove_sd_contains(sd, key)) {
    grove_tensor *t = grove_tensor_new(GROVE_I64, 0, NULL, err);
    if (!t)
      s = err && err->code != GROVE_OK ? err->code : GROVE_E_NOMEM;
    else
      s = grove_sd_set(sd, key, t, err);
    grove_tensor_release(t);
  }
  free(key);
  return s;
}

const grove_module_type grove__batch_norm1d_type = {
    .name = "BatchNorm1d",
    .forward = bn1d_forward,
    .refresh = bn_refresh,
    .load_fixup = bn_load_fixup,
    .version = 2, /* torch's _NormBase._version */
};

const grove_module_type grove__batch_norm2d_type = {
    .name = "BatchNorm2d",
    .forward = bn2d_forward,
    .refresh = bn_refresh,
    .load_fixup = bn_load_fixup,
    .version = 2,
};

/* Both BatchNorms: type's name in messages, num_features at most max. */
void grove__bn_settings(const grove_module *m, grove__layer_settings *s) {
  const bn_impl *p = m->impl;
  s->conv_dims = m->type == &grove__batch_norm1d_type ? 1 : 2;
  s->eps = p->eps;
  s->momentum = p->momentum;
  s->affine = p->affine;
  s->track = p->track_running_stats;
}

grove_status grove__norm_affine(grove_module *m, int ndim, const int64_t *shape, bool affine,
                                grove_err *err) {
  if (!affine) {
    grove_status s = grove_module_register_parameter(m, "weight", NULL, err);
    return s ? s : grove_module_register_parameter(m, "bias", NULL, err);
  }
  grove_status s = grove__layer_param(m, "weight", false, ndim, shape, GROVE_F32, 1.0f, err);
  return s ? s : grove__layer_param(m, "bias", false, ndim, shape, GROVE_F32, 0.0f, err);
}

grove_status grove__norm_running(grove_module *m, int64_t C, bool running, grove_err *err) {
  grove_status s;
  if (running) {
    s = grove__layer_param(m, "running_mean", true, 1, &C, GROVE_F32, 0.0f, err);
    if (!s) s = grove__layer_param(m, "running_var", true, 1, &C, GROVE_F32, 1.0f, err);
    if (!s) s = grove__layer_param(m, "num_batches_tracked", true, 0, NULL, GROVE_I64, 0.0f, err);
    return s;
  }
  s = grove_module_register_buffer(m, "running_mean", NULL, true, err);
  if (!s) s = grove_module_register_buffer(m, "running_var", NULL, true, err);
  if (!s) s = grove_module_register_buffer(m, "num_batches_tracked", NULL, true, err);
  return s;
}

static grove_status bn_new(const grove_module_type *type, int64_t max, int64_t num_features,
                           double eps, double momentum, bool affine, bool track_running_stats,
                           grove_module **out, grove_err *err) {
  const char *T = type->name;
  *out = NULL;
  if (num_features <= 0 || num_features > max)
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT, "%s: num_features %lld is %s", T,
                         (long long)num_features, num_features <= 0 ? "not positive" : "too large");
  if (!(eps >= 0.0) || isinf(eps))
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT,
                         "%s: eps must be a finite non-negative number, got %g", T, eps);
  const int64_t C = num_features;
  bn_impl *p = calloc(1, sizeof *p + 4 * (size_t)C * sizeof(float));
  if (!p) return grove_err_set(err, GROVE_E_NOMEM, "%s: out of memory", T);
  p->C = C;
  p->eps = eps;
  p->momentum = momentum;
  p->affine = affine;
  p->track_running_stats = track_running_stats;
  p->scale = p->data;
  p->shift = p->data + C;
  p->weight = p->data + 2 * C;
  p->bias = p->data + 3 * C;
  grove_module *m = grove_module_new(type, p, err);
  if (!m) return err && err->code != GROVE_OK ? err->code : GROVE_E_NOMEM;

  /* torch's registration order: weight, bias, then running_mean,
   * running_var, num_batches_tracked; None where the flags say so. */
  grove_status s = grove__norm_affine(m, 1, &C, affine, err);
  if (!s) s = grove__norm_running(m, C, track_running_stats, err);
  if (!s) s = bn_refresh(m, err);
  if (s != GROVE_OK) {
    grove_module_release(m);
    return s;
  }
  *out = m;
  return GROVE_OK;
}

grove_status grove_batch_norm1d_new(int64_t num_features, double eps, double momentum, bool affine,
                                    bool track_running_stats, grove_module **out, grove_err *err) {
  return bn_new(&grove__batch_norm1d_type, INT64_MAX / 64, num_features, eps, momentum, affine,
                track_running_stats, out, err);
}

grove_status grove_batch_norm2d_new(int64_t num_features, double eps, double momentum, bool affine,
                                    bool track_running_stats, grove_module **out, grove_err *err) {
  return bn_new(&grove__batch_norm2d_type, INT32_MAX, num_features, eps, momentum, affine,
                track_running_stats, out, err);
}

/* Both BatchNorms' model.json arguments (num_features at most max). */
typedef grove_status (*bn_new_fn)(int64_t, double, double, bool, bool, grove_module **,
                                  grove_err *);

static grove_status bn_from_json(const char *T, int64_t max, bn_new_fn make_bn, const json_t *obj,
                                 const char *path, grove_module **out, grove_err *err) {
  static const char *const keys[] = {"num_features",        "eps", "momentum", "affine",
                                     "track_running_stats", NULL};
  int64_t C;
  double eps, momentum;
  bool momentum_null, affine, track;
  grove_status s = grove__json_check_keys(obj, path, T, keys, err);
  if (!s) s = grove__json_int(obj, path, T, "num_features", true, 0, 1, max, &C, err);
  if (!s) s = grove__json_number(obj, path, T, "eps", 1e-5, 0.0, INFINITY, &eps, err);
  if (!s)
    s = grove__json_number_or_null(obj, path, T, "momentum", false, 0.1, -INFINITY, INFINITY,
                                   &momentum, &momentum_null, err);
  if (!s) s = grove__json_bool(obj, path, T, "affine", true, &affine, err);
  if (!s) s = grove__json_bool(obj, path, T, "track_running_stats", true, &track, err);
  if (s != GROVE_OK) return s;
  return grove__json_built(
      path, make_bn(C, eps, momentum_null ? NAN : momentum, affine, track, out, err), err);
}

grove_status grove__batch_norm1d_from_json(const json_t *obj, const char *path, grove_module **out,
                                           grove_err *err) {
  return bn_from_json("BatchNorm1d", INT64_MAX, grove_batch_norm1d_new, obj, path, out, err);
}

grove_status grove__batch_norm2d_from_json(const json_t *obj, const char *path, grove_module **out,
                                           grove_err *err) {
  return bn_from_json("BatchNorm2d", INT32_MAX, grove_batch_norm2d_new, obj, path, out, err);
}

/* ------------------------------------------------------------ LayerNorm */

typedef struct ln_impl {
  int ndim;
  int64_t shape[GROVE_MAX_DIMS]; /* normalized_shape */
  int64_t D;                     /* its element count */
  double eps;
  bool use_weight, use_bias; /* the parameters are not None */
  bool affine;               /* elementwise_affine */
  float *weight, *bias;
  float data[]; /* 2 * D floats */
} ln_impl;

void grove__ln_settings(const grove_module *m, grove__layer_settings *s) {
  const ln_impl *p = m->impl;
  s->eps = p->eps;
  s->affine = p->affine;
  s->ln_ndim = p->ndim;
  memcpy(s->ln_shape, p->shape, sizeof s->ln_shape);
}

static grove_status ln_refresh(grove_module *m, grove_err *err) {
  ln_impl *p = m->impl;
  const grove_tensor *w = grove_module_param(m, "weight");
  const grove_tensor *b = grove_module_param(m, "bias");
  const grove_tensor *all[2] = {w, b};
  static const char *const names[2] = {"weight", "bias"};
  for (int i = 0; i < 2; i++) {
    if (!all[i]) continue;
    bool same = all[i]->ndim == p->ndim;
    for (int d = 0; same && d < p->ndim; d++) same = all[i]->shape[d] == p->shape[d];
    if (!same) {
      char got[128], want[128];
      grove_shape_str(all[i]->ndim, all[i]->shape, got, sizeof got);
      grove_shape_str(p->ndim, p->shape, want, sizeof want);
      return grove_err_set(err, GROVE_E_SHAPE, "LayerNorm: %s has shape %s, expected %s", names[i],
                           got, want);
    }
    if (!grove_dtype_is_float(all[i]->dtype))
      return grove_err_set(err, GROVE_E_DTYPE, "LayerNorm: %s is %s, expected floating point",
                           names[i], grove_dtype_name(all[i]->dtype));
  }
  grove_status s = GROVE_OK;
  if (w) s = grove__copy_f32(p->weight, p->D, w, "LayerNorm", "weight", err);
  if (!s && b) s = grove__copy_f32(p->bias, p->D, b, "LayerNorm", "bias", err);
  if (s != GROVE_OK) return s;
  p->use_weight = w != NULL;
  p->use_bias = b != NULL;
  return GROVE_OK;
}

/* Sum of n floats in double, four chains to hide the add latency. */
static double sum_f64(const float *x, int64_t n) {
  double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  int64_t j = 0;
  for (; j + 4 <= n; j += 4) {
    s0 += x[j];
    s1 += x[j + 1];
    s2 += x[j + 2];
    s3 += x[j + 3];
  }
  for (; j < n; j++) s0 += x[j];
  return (s0 + s1) + (s2 + s3);
}

static double sq_dev_f64(const float *x, int64_t n, double mean) {
  double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  int64_t j = 0;
  for (; j + 4 <= n; j += 4) {
    double d0 = x[j] - mean, d1 = x[j + 1] - mean, d2 = x[j + 2] - mean, d3 = x[j + 3] - mean;
    s0 += d0 * d0;
    s1 += d1 * d1;
    s2 += d2 * d2;
    s3 += d3 * d3;
  }
  for (; j < n; j++) {
    double d = x[j] - mean;
    s0 += d * d;
  }
  return (s0 + s1) + (s2 + s3);
}

#if GROVE__X86_SIMD
#include <immintrin.h>

GROVE__TARGET_PUSH("avx512f")
/* One row of LayerNorm on 8 double lanes: the sums of the mean and of the
 * squared deviations in double as the scalar loop below keeps them (in
 * another order: 16 chains, then the lanes), then (x - mean) * rstd in
 * double, rounded to float, times w plus b in float, as the scalar loop
 * computes every element. */
static void ln_row_avx512(const float *restrict xr, float *restrict yr, int64_t D,
                          const float *restrict w, const float *restrict b, double eps) {
  __m512d s0 = _mm512_setzero_pd(), s1 = s0;
  int64_t j = 0;
  for (; j + 16 <= D; j += 16) {
    s0 = _mm512_add_pd(s0, _mm512_cvtps_pd(_mm256_loadu_ps(xr + j)));
    s1 = _mm512_add_pd(s1, _mm512_cvtps_pd(_mm256_loadu_ps(xr + j + 8)));
  }
  double sum = _mm512_reduce_add_pd(_mm512_add_pd(s0, s1));
  for (int64_t t = j; t < D; t++) sum += xr[t];
  const double mean = sum / (double)D;
  const __m512d mv = _mm512_set1_pd(mean);
  s0 = s1 = _mm512_setzero_pd();
  for (j = 0; j + 16 <= D; j += 16) {
    const __m512d d0 = _mm512_sub_pd(_mm512_cvtps_pd(_mm256_loadu_ps(xr + j)), mv);
    const __m512d d1 = _mm512_sub_pd(_mm512_cvtps_pd(_mm256_loadu_ps(xr + j + 8)), mv);
    s0 = _mm512_add_pd(s0, _mm512_mul_pd(d0, d0));
    s1 = _mm512_add_pd(s1, _mm512_mul_pd(d1, d1));
  }
  double sq = _mm512_reduce_add_pd(_mm512_add_pd(s0, s1));
  for (int64_t t = j; t < D; t++) sq += (xr[t] - mean) * (xr[t] - mean);
  const double rstd = 1.0 / sqrt(sq / (double)D + eps);
  const __m512d rv = _mm512_set1_pd(rstd);
  for (j = 0; j + 8 <= D; j += 8) {
    __m256 v = _mm512_cvtpd_ps(
        _mm512_mul_pd(_mm512_sub_pd(_mm512_cvtps_pd(_mm256_loadu_ps(xr + j)), mv), rv));
    if (w) v = _mm256_mul_ps(v, _mm256_loadu_ps(w + j));
    if (b) v = _mm256_add_ps(v, _mm256_loadu_ps(b + j));
    _mm256_storeu_ps(yr + j, v);
  }
  for (; j < D; j++) {
    float v = (float)((xr[j] - mean) * rstd);
    if (w) v *= w[j];
    if (b) v += b[j];
    yr[j] = v;
  }
}
GROVE__TARGET_POP
#endif

/* Rows [r0, r1) of grove__layer_norm_rows, on one thread. */
typedef struct ln_par {
  const float *x, *w, *b;
  float *y;
  int64_t D;
  double eps;
} ln_par;

GROVE__CHANNEL_LOOP static void ln_chunk(void *ctx, int64_t r0, int64_t r1) {
  const ln_par *c = ctx;
  const float *restrict x = c->x, *restrict w = c->w, *restrict b = c->b;
  float *restrict y = c->y;
  const int64_t D = c->D;
  const double eps = c->eps;
#if GROVE__X86_SIMD
  if (grove__cpu_avx512()) {
    for (int64_t r = r0; r < r1; r++) ln_row_avx512(x + r * D, y + r * D, D, w, b, eps);
    return;
  }
#endif
  for (int64_t r = r0; r < r1; r++) {
    const float *xr = x + r * D;
    float *yr = y + r * D;
    const double mean = sum_f64(xr, D) / (double)D;
    const double rstd = 1.0 / sqrt(sq_dev_f64(xr, D, mean) / (double)D + eps);
    /* The centring stays in double: in float, rounding the mean of a row
     * around 1e3 would cost ~1e-4 of the output. */
    if (w && b) {
      for (int64_t j = 0; j < D; j++) yr[j] = (float)((xr[j] - mean) * rstd) * w[j] + b[j];
    } else if (w) {
      for (int64_t j = 0; j < D; j++) yr[j] = (float)((xr[j] - mean) * rstd) * w[j];
    } else if (b) {
      for (int64_t j = 0; j < D; j++) yr[j] = (float)((xr[j] - mean) * rstd) + b[j];
    } else {
      for (int64_t j = 0; j < D; j++) yr[j] = (float)((xr[j] - mean) * rstd);
    }
  }
}

/* Rows are independent: they run in chunks on the compute threads, each
 * with the same arithmetic, so any cut gives the same bits. */
void grove__layer_norm_rows(const float *restrict x, float *restrict y, int64_t rows, int64_t D,
                            const float *restrict w, const float *restrict b, double eps) {
  ln_par p = {x, w, b, y, D, eps};
  grove__parallel_for(rows, grove__par_grain(2 * D), ln_chunk, &p);
}

static grove_status ln_forward(const grove_module *m, grove_fwd *f, const grove_values *in,
                               grove_values *out) {
  const ln_impl *p = m->impl;
  grove_tensor x;
  grove_status s = grove__layer_input("LayerNorm", f, in, GROVE_F32, &x);
  if (s != GROVE_OK) return s;
  bool ok = x.ndim >= p->ndim;
  for (int d = 0; ok && d < p->ndim; d++) ok = x.shape[x.ndim - p->ndim + d] == p->shape[d];
  if (!ok) {
    char got[128], want[128];
    grove_shape_str(x.ndim, x.shape, got, sizeof got);
    grove_shape_str(p->ndim, p->shape, want, sizeof want);
    /* want is "[3, 4]": torch says "expected input with shape [*, 3, 4]". */
    return grove_err_set(f->err, GROVE_E_SHAPE,
                         "LayerNorm: given normalized_shape=%s, expected input with shape [*, %s, "
                         "but got input of size %s",
                         want, want + 1, got);
  }
  s = grove_fwd_alloc(f, &out->v[0], GROVE_F32, x.ndim, x.shape);
  if (s != GROVE_OK) return s;
  out->n = 1;
  grove__layer_norm_rows(x.data, out->v[0].data, grove_tensor_numel(&x) / p->D, p->D,
                         p->use_weight ? p->weight : NULL, p->use_bias ? p->bias : NULL, p->eps);
  return GROVE_OK;
}

const grove_module_type grove__layer_norm_type = {
    .name = "LayerNorm",
    .forward = ln_forward,
    .refresh = ln_refresh,
};

grove_status grove_layer_norm_new(int ndim, const int64_t *normalized_shape, double eps,
                                  bool elementwise_affine, grove_module **out, grove_err *err) {
  *out = NULL;
  if (ndim < 1 || ndim > GROVE_MAX_DIMS || !normalized_shape)
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT,
                         "LayerNorm: normalized_shape must have 1 to %d dimensions, got %d",
                         GROVE_MAX_DIMS, ndim);
  int64_t D = 1;
  for (int d = 0; d < ndim; d++) {
    if (normalized_shape[d] <= 0 || normalized_shape[d] > INT64_MAX / 64 / D) {
      char sh[128];
      grove_shape_str(ndim, normalized_shape, sh, sizeof sh);
      return grove_err_set(err, GROVE_E_INVALID_ARGUMENT,
                           "LayerNorm: normalized_shape %s must hold positive sizes", sh);
    }
    D *= normalized_shape[d];
  }
  if (!(eps >= 0.0) || isinf(eps))
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT,
                         "LayerNorm: eps must be a finite non-negative number, got %g", eps);
  ln_impl *p = calloc(1, sizeof *p + 2 * (size_t)D * sizeof(float));
  if (!p) return grove_err_set(err, GROVE_E_NOMEM, "LayerNorm: out of memory");
  p->ndim = ndim;
  memcpy(p->shape, normalized_shape, (size_t)ndim * sizeof(int64_t));
  p->D = D;
  p->eps = eps;
  p->affine = elementwise_affine;
  p->weight = p->data;
  p->bias = p->data + D;
  grove_module *m = grove_module_new(&grove__layer_norm_type, p, err);
  if (!m) return err && err->code != GROVE_OK ? err->code : GROVE_E_NOMEM;
  grove_status s = grove__norm_affine(m, ndim, normalized_shape, elementwise_affine, err);
  if (!s) s = ln_refresh(m, err);
  if (s != GROVE_OK) {
    grove_module_release(m);
    return s;
  }
  *out = m;
  return GROVE_OK;
}

/* "bias" is torch >= 2.1's LayerNorm(bias=False): accepted so that an
 * exporter on a newer torch round-trips; bias is then None. */
grove_status grove__layer_norm_from_json(const json_t *obj, const char *path, grove_module **out,
                                         grove_err *err) {
  static const char *const keys[] = {"normalized_shape", "eps", "elementwise_affine", "bias", NULL};
  const char *T = "LayerNorm";
  int ndim = 0;
  int64_t shape[GROVE_MAX_DIMS];
  double eps;
  bool affine, bias;
  grove_status s = grove__json_check_keys(obj, path, T, keys, err);
  if (!s)
    s = grove__json_shape(obj, path, T, "normalized_shape", GROVE_MAX_DIMS, &ndim, shape, err);
  if (!s) s = grove__json_number(obj, path, T, "eps", 1e-5, 0.0, INFINITY, &eps, err);
  if (!s) s = grove__json_bool(obj, path, T, "elementwise_affine", true, &affine, err);
  if (!s) s = grove__json_bool(obj, path, T, "bias", true, &bias, err);
  if (!s)
    s = grove__json_built(path, grove_layer_norm_new(ndim, shape, eps, affine, out, err), err);
  if (s != GROVE_OK) return s;
  if (affine && !bias) {
    s = grove_module_register_parameter(*out, "bias", NULL, err);
    if (!s) s = ln_refresh(*out, err);
    if (s != GROVE_OK) {
      grove_module_release(*out);
      *out = NULL;
    }
  }
  return s;
}
