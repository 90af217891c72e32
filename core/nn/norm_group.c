/* norm_group.c: the normalisations other than BatchNorm and LayerNorm
 * (layers_norm.c): GroupNorm, InstanceNorm in eval, LocalResponseNorm
 * (tensor_ops.h).  The modules (nn.GroupNorm, nn.InstanceNorm2d with
 * affine) pass their weight and bias to the same functions as the
 * functional forms.
 *
 * Statistics are accumulated in double over each group's contiguous block
 * (a channels-last input is made contiguous first: a group spans channels
 * and every pixel), the variance biased as torch's. */
#include <math.h>
#include <string.h>

#include "layers_internal.h"
#include "tensor_ops.h"

/* Checks a per-channel parameter (NULL allowed) and gives its floats. */
static grove_status channel_param(grove_fwd *f, const char *op, const char *what,
                                  const grove_tensor *t, int64_t C, const float **out) {
  *out = NULL;
  if (!t) return GROVE_OK;
  if (t->dtype != GROVE_F32 || grove_tensor_numel(t) != C)
    return grove_err_set(f->err, GROVE_E_SHAPE,
                         "%s: %s must be %lld float32 numbers (one per channel), got %lld %s", op,
                         what, (long long)C, (long long)grove_tensor_numel(t),
                         grove_dtype_name(t->dtype));
  grove_tensor c;
  grove_status s = grove__fwd_contig(f, t, &c);
  if (s) return s;
  *out = c.data;
  return GROVE_OK;
}

static grove_status norm_input(grove_fwd *f, const char *op, const grove_tensor *x, int min_nd,
                               grove_tensor *c) {
  if (x->dtype != GROVE_F32)
    return grove_err_set(f->err, GROVE_E_DTYPE, "%s: expected a float32 input, got %s", op,
                         grove_dtype_name(x->dtype));
  if (x->ndim < min_nd) {
    char b[128];
    return grove_err_set(f->err, GROVE_E_SHAPE,
                         "%s: expected an input of at least %d dimensions [N, C, ...], got %s", op,
                         min_nd, grove_shape_str(x->ndim, x->shape, b, sizeof b));
  }
  return grove__fwd_contig(f, x, c);
}

typedef struct gn_par {
  const float *x;
  float *y;
  const float *w, *b;
  int64_t G, cpg, S; /* groups, channels per group, elements per channel */
  int64_t C;
  double eps;
} gn_par;

static void gn_chunk(void *ctx, int64_t lo, int64_t hi) {
  const gn_par *c = ctx;
  const int64_t block = c->cpg * c->S;
  for (int64_t ng = lo; ng < hi; ng++) {
    const float *x = c->x + ng * block;
    float *y = c->y + ng * block;
    double sum = 0, sq = 0;
    for (int64_t i = 0; i < block; i++) sum += x[i];
    const double mean = block ? sum / (double)block : 0;
    for (int64_t i = 0; i < block; i++) {
      const double d = x[i] - mean;
      sq += d * d;
    }
    const double rstd = 1.0 / sqrt((block ? sq / (double)block : 0) + c->eps);
    const int64_t c0 = (ng % c->G) * c->cpg;
    for (int64_t k = 0; k < c->cpg; k++) {
      const int64_t ch = c0 + k;
      const float sc = (float)(rstd * (c->w ? c->w[ch] : 1.0f));
      const float sh = (float)((c->b ? c->b[ch] : 0.0f) - mean * rstd * (c->w ? c->w[ch] : 1.0f));
      const float *xs = x + k * c->S;
      float *ys = y + k * c->S;
      for (int64_t i = 0; i < c->S; i++) ys[i] = xs[i] * sc + sh;
    }
  }
}

grove_status grove__op_group_norm(grove_fwd *f, const grove_tensor *x0, int64_t groups,
                                  const grove_tensor *weight, const grove_tensor *bias, double eps,
                                  grove_tensor *out) {
  grove_tensor x;
  grove_status s = norm_input(f, "group_norm", x0, 2, &x);
  if (s) return s;
  const int64_t N = x.shape[0], C = x.shape[1];
  if (groups <= 0 || C % groups)
    return grove_err_set(f->err, GROVE_E_SHAPE,
                         "group_norm: %lld channels are not divisible into %lld groups",
                         (long long)C, (long long)groups);
  gn_par c = {.G = groups, .cpg = C / groups, .C = C, .eps = eps};
  if ((s = channel_param(f, "group_norm", "weight", weight, C, &c.w)) ||
      (s = channel_param(f, "group_norm", "bias", bias, C, &c.b)))
    return s;
  c.S = 1;
  for (int d = 2; d < x.ndim; d++) c.S *= x.shape[d];
  if ((s = grove_fwd_alloc(f, out, GROVE_F32, x.ndim, x.shape))) return s;
  c.x = x.data;
  c.y = out->data;
  grove__parallel_for(N * groups, grove__par_grain(3 * c.cpg * c.S), gn_chunk, &c);
  return GROVE_OK;
}

grove_status grove__op_instance_norm(grove_fwd *f, const grove_tensor *x0,
                                     const grove_tensor *running_mean,
                                     const grove_tensor *running_var, const grove_tensor *weight,
                                     const grove_tensor *bias, bool use_input_stats, double eps,
                                     grove_tensor *out) {
  if (use_input_stats) {
    /* Each (sample, channel) alone: a group norm of one channel per group. */
    if (x0->ndim < 2) return norm_input(f, "instance_norm", x0, 2, out);
    grove_status s = grove__op_group_norm(f, x0, x0->shape[1], weight, bias, eps, out);
    return s ? grove_err_prefix(f->err, "instance_norm") : s;
  }
  grove_tensor x;
  grove_status s = norm_input(f, "instance_norm", x0, 2, &x);
  if (s) return s;
  const int64_t N = x.shape[0], C = x.shape[1];
  const float *rm, *rv, *w, *b;
  if (!running_mean || !running_var)
    return grove_err_set(f->err, GROVE_E_INVALID_ARGUMENT,
                         "instance_norm: use_input_stats=False needs running_mean and running_var");
  if ((s = channel_param(f, "instance_norm", "running_mean", running_mean, C, &rm)) ||
      (s = channel_param(f, "instance_norm", "running_var", running_var, C, &rv)) ||
      (s = channel_param(f, "instance_norm", "weight", weight, C, &w)) ||
      (s = channel_param(f, "instance_norm", "bias", bias, C, &b)))
    return s;
  int64_t S = 1;
  for (int d = 2; d < x.ndim; d++) S *= x.shape[d];
  if ((s = grove_fwd_alloc(f, out, GROVE_F32, x.ndim, x.shape))) return s;
  const float *xv = x.data;
  float *y = out->data;
  for (int64_t n = 0; n < N; n++)
    for (int64_t ch = 0; ch < C; ch++) {
      const double rstd = 1.0 / sqrt((double)rv[ch] + eps);
      const float sc = (float)(rstd * (w ? w[ch] : 1.0f));
      const float sh = (float)((b ? b[ch] : 0.0f) - rm[ch] * rstd * (w ? w[ch] : 1.0f));
      const int64_t o = (n * C + ch) * S;
      for (int64_t i = 0; i < S; i++) y[o + i] = xv[o + i] * sc + sh;
    }
  return GROVE_OK;
}

grove_status grove__op_local_response_norm(grove_fwd *f, const grove_tensor *x0, int64_t size,
                                           double alpha, double beta, double k,
                                           grove_tensor *out) {
  grove_tensor x;
  grove_status s = norm_input(f, "local_response_norm", x0, 3, &x);
  if (s) return s;
  if (size <= 0)
    return grove_err_set(f->err, GROVE_E_INVALID_ARGUMENT,
                         "local_response_norm: size must be positive, got %lld", (long long)size);
  const int64_t N = x.shape[0], C = x.shape[1];
  int64_t S = 1;
  for (int d = 2; d < x.ndim; d++) S *= x.shape[d];
  if ((s = grove_fwd_alloc(f, out, GROVE_F32, x.ndim, x.shape))) return s;
  /* torch: the squares averaged over a window of `size` channels, padded
   * with size / 2 zeros before and (size - 1) / 2 after, the padding
   * counted (avg_pool's count_include_pad). */
  const int64_t before = size / 2, after = (size - 1) / 2;
  const float *xv = x.data;
  float *y = out->data;
  for (int64_t n = 0; n < N; n++)
    for (int64_t c = 0; c < C; c++) {
      const int64_t lo = c - before < 0 ? 0 : c - before;
      const int64_t hi = c + after >= C ? C - 1 : c + after;
      const float *xc = xv + (n * C + c) * S;
      float *yc = y + (n * C + c) * S;
      for (int64_t i = 0; i < S; i++) {
        float sum = 0;
        for (int64_t j = lo; j <= hi; j++) {
          const float v = xv[(n * C + j) * S + i];
          sum += v * v;
        }
        yc[i] = xc[i] / powf((float)(sum / (float)size * alpha + k), (float)beta);
      }
    }
  return GROVE_OK;
}
