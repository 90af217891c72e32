/* loss.c: torch.nn.MSELoss, CrossEntropyLoss (class indices, ignore_index,
 * label_smoothing) and BCEWithLogitsLoss (pos_weight), each giving the
 * loss and the gradient of its input for a loss of 1 (loss.backward()).
 *
 * The formulas are torch 1.13's (aten/src/ATen/native/Loss.cpp,
 * LossNLL.cpp): reductions are summed in double; cross entropy with label
 * smoothing is (1 - ls) * nll + ls * smooth / C, the smooth part being
 * -sum_c log p_c over the non-ignored targets and, with reduction mean,
 * divided by their count as nll is. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "grove/train.h"
#include "base.h"

grove_loss grove_loss_default(grove_loss_kind kind) {
  return (grove_loss){.kind = kind, .reduction = GROVE_REDUCTION_MEAN, .ignore_index = -100};
}

bool grove_loss_kind_from_name(const char *name, grove_loss_kind *out) {
  static const struct {
    const char *name;
    grove_loss_kind kind;
  } names[] = {{"MSELoss", GROVE_LOSS_MSE},
               {"CrossEntropyLoss", GROVE_LOSS_CROSS_ENTROPY},
               {"BCEWithLogitsLoss", GROVE_LOSS_BCE_WITH_LOGITS}};
  for (size_t i = 0; name && i < sizeof names / sizeof names[0]; i++)
    if (strcmp(name, names[i].name) == 0) {
      *out = names[i].kind;
      return true;
    }
  return false;
}

/* The element offset of t's flat (row-major) index, whatever its strides. */
static int64_t flat_offset(const grove_tensor *t, int64_t flat) {
  int64_t off = 0;
  for (int d = t->ndim - 1; d >= 0; d--) {
    int64_t i = t->shape[d] ? flat % t->shape[d] : 0;
    flat = t->shape[d] ? flat / t->shape[d] : 0;
    off += i * t->strides[d];
  }
  return off;
}

/* Elements of t in row-major order, as float or int64. */
static float at_f32(const grove_tensor *t, int64_t flat) {
  return ((const float *)t->data)[flat_offset(t, flat)];
}

static int64_t at_i64(const grove_tensor *t, int64_t flat) {
  return ((const int64_t *)t->data)[flat_offset(t, flat)];
}

static grove_status check_same(const char *what, const grove_tensor *input,
                               const grove_tensor *target, grove_err *err) {
  if (input->dtype != GROVE_F32 || target->dtype != GROVE_F32)
    return grove_err_set(err, GROVE_E_DTYPE, "%s: input and target must be float32, got %s and %s",
                         what, grove_dtype_name(input->dtype), grove_dtype_name(target->dtype));
  if (!grove_tensor_same_shape(input, target)) {
    char a[128], b[128];
    return grove_err_set(err, GROVE_E_SHAPE, "%s: target size %s must be the same as input size %s",
                         what, grove_shape_str(target->ndim, target->shape, a, sizeof a),
                         grove_shape_str(input->ndim, input->shape, b, sizeof b));
  }
  return GROVE_OK;
}

/* ------------------------------------------------------------ MSE */

static grove_status mse(const grove_loss *l, const grove_tensor *x, const grove_tensor *y,
                        double *value, float *g, grove_err *err) {
  grove_status s = check_same("MSELoss", x, y, err);
  if (s) return s;
  const int64_t n = grove_tensor_numel(x);
  const bool mean = l->reduction == GROVE_REDUCTION_MEAN;
  double sum = 0;
  /* mse_loss_backward: 2 / numel (mean) or 2, times (input - target). */
  const float norm = (float)(mean ? 2.0 / (double)n : 2.0);
  for (int64_t i = 0; i < n; i++) {
    const float d = at_f32(x, i) - at_f32(y, i);
    sum += (double)d * d;
    if (g) g[i] = d * norm;
  }
  *value = mean ? sum / (double)n : sum;
  return GROVE_OK;
}

/* ------------------------------------------------------------ cross entropy */

static grove_status cross_entropy(const grove_loss *l, const grove_tensor *x, const grove_tensor *y,
                                  double *value, float *g, grove_err *err) {
  const char *T = "CrossEntropyLoss";
  if (x->dtype != GROVE_F32)
    return grove_err_set(err, GROVE_E_DTYPE, "%s: input must be float32 logits, got %s", T,
                         grove_dtype_name(x->dtype));
  if (y->dtype != GROVE_I64)
    return grove_err_set(err, GROVE_E_DTYPE,
                         "%s: target must be int64 class indices, got %s (class probabilities "
                         "are not supported)",
                         T, grove_dtype_name(y->dtype));
  if (!(l->label_smoothing >= 0.0 && l->label_smoothing <= 1.0))
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT,
                         "%s: label_smoothing must be between 0.0 and 1.0. Got: %g", T,
                         l->label_smoothing);
  /* [C] with a 0-d target, or [N, C, d...] with target [N, d...]. */
  const bool unbatched = x->ndim == 1;
  bool ok = unbatched ? y->ndim == 0 : x->ndim >= 2 && y->ndim == x->ndim - 1;
  for (int d = 0; ok && !unbatched && d < y->ndim; d++)
    ok = y->shape[d] == x->shape[d == 0 ? 0 : d + 1];
  if (!ok) {
    char a[128], b[128];
    return grove_err_set(err, GROVE_E_SHAPE,
                         "%s: input %s and target %s do not fit ([N, C, d...] logits with [N, "
                         "d...] class indices, or [C] with [])",
                         T, grove_shape_str(x->ndim, x->shape, a, sizeof a),
                         grove_shape_str(y->ndim, y->shape, b, sizeof b));
  }
  const int64_t C = unbatched ? x->shape[0] : x->shape[1];
  const int64_t N = unbatched ? 1 : x->shape[0];
  int64_t inner = 1;
  for (int d = 2; d < x->ndim; d++) inner *= x->shape[d];
  const double ls = l->label_smoothing;
  double nll = 0, smooth = 0;
  int64_t count = 0;
  /* Validate every target before writing anything. */
  for (int64_t i = 0; i < N * inner; i++) {
    const int64_t t = at_i64(y, i);
    if (t != l->ignore_index && (t < 0 || t >= C))
      return grove_err_set(err, GROVE_E_RANGE,
                           "%s: target %" PRId64 " (at flat position %" PRId64
                           ") is out of bounds: %" PRId64 " classes",
                           T, t, i, C);
    count += t != l->ignore_index;
  }
  /* Contiguous logits [N, C, inner]: flat index (n * C + c) * inner + k. */
  for (int64_t n = 0; n < N; n++) {
    for (int64_t k = 0; k < inner; k++) {
      const int64_t t = at_i64(y, n * inner + k);
      const int64_t base = n * C * inner + k;
      float mx = -INFINITY;
      for (int64_t c = 0; c < C; c++) {
        float v = at_f32(x, base + c * inner);
        mx = v > mx ? v : mx;
      }
      double se = 0;
      for (int64_t c = 0; c < C; c++) se += expf(at_f32(x, base + c * inner) - mx);
      const double lse = log(se) + mx;
      if (t == l->ignore_index) {
        for (int64_t c = 0; g && c < C; c++) g[base + c * inner] = 0.0f;
        continue;
      }
      nll -= at_f32(x, base + t * inner) - lse;
      if (ls > 0)
        for (int64_t c = 0; c < C; c++) smooth -= at_f32(x, base + c * inner) - lse;
      for (int64_t c = 0; g && c < C; c++) {
        const double p = exp(at_f32(x, base + c * inner) - lse);
        g[base + c * inner] = (float)(p - (c == t ? 1.0 - ls : 0.0) - ls / (double)C);
      }
    }
  }
  const bool mean = l->reduction == GROVE_REDUCTION_MEAN;
  const double div = mean ? (double)count : 1.0; /* 0 / 0 = NaN when all are ignored */
  *value = ((1.0 - ls) * nll + (ls > 0 ? ls * smooth / (double)C : 0.0)) / div;
  if (g && mean) {
    const int64_t total = N * C * inner;
    const float inv = (float)(1.0 / div);
    for (int64_t i = 0; i < total; i++) g[i] *= inv;
  }
  return GROVE_OK;
}

/* ------------------------------------------------------------ BCE with logits */

static grove_status bce_logits(const grove_loss *l, const grove_tensor *x, const grove_tensor *y,
                               double *value, float *g, grove_err *err) {
  const char *T = "BCEWithLogitsLoss";
  grove_status s = check_same(T, x, y, err);
  if (s) return s;
  const grove_tensor *pw = l->pos_weight;
  /* pos_weight broadcasts against the input, aligned on the right. */
  int64_t pws[GROVE_MAX_DIMS] = {0};
  if (pw) {
    if (pw->dtype != GROVE_F32)
      return grove_err_set(err, GROVE_E_DTYPE, "%s: pos_weight must be float32, got %s", T,
                           grove_dtype_name(pw->dtype));
    bool ok = pw->ndim <= x->ndim;
    for (int d = 0; ok && d < pw->ndim; d++) {
      int xd = x->ndim - pw->ndim + d;
      ok = pw->shape[d] == 1 || pw->shape[d] == x->shape[xd];
      pws[xd] = pw->shape[d] == 1 ? 0 : pw->strides[d];
    }
    if (!ok) {
      char a[128], b[128];
      return grove_err_set(err, GROVE_E_SHAPE, "%s: pos_weight %s does not broadcast to input %s",
                           T, grove_shape_str(pw->ndim, pw->shape, a, sizeof a),
                           grove_shape_str(x->ndim, x->shape, b, sizeof b));
    }
  }
  const int64_t n = grove_tensor_numel(x);
  const bool mean = l->reduction == GROVE_REDUCTION_MEAN;
  const float inv = mean ? (float)(1.0 / (double)n) : 1.0f;
  double sum = 0;
  for (int64_t i = 0; i < n; i++) {
    const float v = at_f32(x, i), t = at_f32(y, i);
    float w = 1.0f;
    if (pw) {
      int64_t off = 0, f = i;
      for (int d = x->ndim - 1; d >= 0; d--) {
        off += (f % x->shape[d]) * pws[d];
        f /= x->shape[d];
      }
      w = ((const float *)pw->data)[off];
    }
    /* softplus(-x) = max(-x, 0) + log1p(exp(-|x|)) */
    const double sp = fmax(-(double)v, 0.0) + log1p(exp(-fabs((double)v)));
    const double lw = pw ? ((double)w - 1.0) * t + 1.0 : 1.0;
    sum += (1.0 - t) * v + lw * sp;
    if (g) {
      const float sig = 1.0f / (1.0f + expf(-v));
      float gi;
      if (pw) {
        const float pt = w * t;
        gi = ((pt + 1.0f - t) * sig - pt);
      } else {
        gi = sig - t;
      }
      g[i] = gi * inv;
    }
  }
  *value = mean ? sum / (double)n : sum;
  return GROVE_OK;
}

grove_status grove_loss_compute(const grove_loss *loss, const grove_tensor *input,
                                const grove_tensor *target, double *value, grove_tensor *grad,
                                grove_err *err) {
  if (loss->reduction != GROVE_REDUCTION_MEAN && loss->reduction != GROVE_REDUCTION_SUM)
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT,
                         "loss: reduction must be mean or sum (a training loss is a scalar)");
  float *g = NULL;
  if (grad) {
    if (grad->dtype != GROVE_F32 || !grove_tensor_same_shape(grad, input) ||
        !grove_tensor_is_contiguous(grad))
      return grove_err_set(err, GROVE_E_SHAPE,
                           "loss: grad must be a contiguous float32 tensor of the input's shape");
    g = grad->data;
  }
  switch (loss->kind) {
    case GROVE_LOSS_MSE:
      return mse(loss, input, target, value, g, err);
    case GROVE_LOSS_CROSS_ENTROPY:
      return cross_entropy(loss, input, target, value, g, err);
    case GROVE_LOSS_BCE_WITH_LOGITS:
      return bce_logits(loss, input, target, value, g, err);
  }
  return grove_err_set(err, GROVE_E_INVALID_ARGUMENT, "loss: unknown kind %d", (int)loss->kind);
}
