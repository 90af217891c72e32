/* pointwise.c: one-input elementwise functions (the torchvision zoo's
 * activations ReLU6, Hardswish, Hardsigmoid, Hardtanh, ELU, SELU, CELU,
 * Softplus, Mish, and clamp, exp, log, sqrt, rsqrt, abs, neg, pow), PReLU
 * and dtype conversion (tensor_ops.h).
 *
 * Every function runs over the input's memory as one dense run when it is
 * contiguous or channels last (an activation between convolutions keeps the
 * layout, so the next convolution reads it without a transpose), else over
 * a contiguous copy; the formulas are torch's (aten's CPU kernels), in
 * float32 with the C library's float functions. */
#include <math.h>
#include <string.h>

#include "graph_ops.h"
#include "layers_internal.h"
#include "tensor_ops.h"

static const char *const unary_names[GROVE__UN_COUNT] = {
    [GROVE__UN_RELU6] = "relu6",
    [GROVE__UN_HARDSWISH] = "hardswish",
    [GROVE__UN_HARDSIGMOID] = "hardsigmoid",
    [GROVE__UN_HARDTANH] = "hardtanh",
    [GROVE__UN_CLAMP] = "clamp",
    [GROVE__UN_ELU] = "elu",
    [GROVE__UN_SELU] = "selu",
    [GROVE__UN_CELU] = "celu",
    [GROVE__UN_SOFTPLUS] = "softplus",
    [GROVE__UN_MISH] = "mish",
    [GROVE__UN_EXP] = "exp",
    [GROVE__UN_LOG] = "log",
    [GROVE__UN_SQRT] = "sqrt",
    [GROVE__UN_RSQRT] = "rsqrt",
    [GROVE__UN_ABS] = "abs",
    [GROVE__UN_NEG] = "neg",
    [GROVE__UN_POW] = "pow",
    [GROVE__UN_SIN] = "sin",
    [GROVE__UN_COS] = "cos",
    [GROVE__UN_ERF] = "erf",
    [GROVE__UN_RECIPROCAL] = "reciprocal",
    [GROVE__UN_LOG1P] = "log1p",
    [GROVE__UN_EXPM1] = "expm1",
    [GROVE__UN_SOFTSIGN] = "softsign",
    [GROVE__UN_LOGSIGMOID] = "logsigmoid",
    [GROVE__UN_FLOOR] = "floor",
    [GROVE__UN_CEIL] = "ceil",
    [GROVE__UN_ROUND] = "round",
    [GROVE__UN_TRUNC] = "trunc",
    [GROVE__UN_SIGN] = "sign",
    [GROVE__UN_SQUARE] = "square",
    [GROVE__UN_LOG2] = "log2",
    [GROVE__UN_LOG10] = "log10",
    [GROVE__UN_EXP2] = "exp2",
    [GROVE__UN_TAN] = "tan",
    [GROVE__UN_ATAN] = "atan",
    [GROVE__UN_SINH] = "sinh",
    [GROVE__UN_COSH] = "cosh",
    [GROVE__UN_ASIN] = "asin",
    [GROVE__UN_ACOS] = "acos",
    [GROVE__UN_TANHSHRINK] = "tanhshrink",
    [GROVE__UN_HARDSHRINK] = "hardshrink",
    [GROVE__UN_SOFTSHRINK] = "softshrink",
    [GROVE__UN_THRESHOLD] = "threshold",
};

const char *grove__unary_name(int op) {
  return op >= 0 && op < GROVE__UN_COUNT ? unary_names[op] : "?";
}

/* torch's SELU constants (torch/nn/functional.py, aten Activation.cpp). */
#define SELU_ALPHA 1.6732632423543772848170429916717
#define SELU_SCALE 1.0507009873554804934193349852946

static inline float softplus1(float x, float beta, float threshold) {
  return x * beta > threshold ? x : log1pf(expf(x * beta)) / beta;
}

typedef struct unary_par {
  int op;
  float a, b;
  const float *x;
  float *y;
} unary_par;

/* Comparisons written so that a NaN passes through, as torch's clamp and
 * hardtanh let it. */
static inline float clampf(float v, float lo, float hi) {
  return v < lo ? lo : (v > hi ? hi : v);
}

static void unary_chunk(void *ctx, int64_t b, int64_t e) {
  const unary_par *c = ctx;
  const float *x = c->x;
  float *y = c->y;
  const float a = c->a, p = c->b;
  switch (c->op) {
    /* The three a convolution's epilogue can apply: one implementation
     * for both (kernels.h, grove__act_apply). */
    case GROVE__UN_RELU6:
      grove__act_apply(GROVE__ACT_RELU6, x + b, y + b, e - b);
      break;
    case GROVE__UN_HARDSWISH:
      grove__act_apply(GROVE__ACT_HARDSWISH, x + b, y + b, e - b);
      break;
    case GROVE__UN_HARDSIGMOID:
      grove__act_apply(GROVE__ACT_HARDSIGMOID, x + b, y + b, e - b);
      break;
    case GROVE__UN_HARDTANH:
    case GROVE__UN_CLAMP:
      for (int64_t i = b; i < e; i++) y[i] = clampf(x[i], a, p);
      break;
    case GROVE__UN_ELU:
      for (int64_t i = b; i < e; i++) y[i] = x[i] > 0 ? x[i] : a * expm1f(x[i]);
      break;
    case GROVE__UN_SELU:
      for (int64_t i = b; i < e; i++)
        y[i] = (float)SELU_SCALE * (x[i] > 0 ? x[i] : (float)SELU_ALPHA * expm1f(x[i]));
      break;
    case GROVE__UN_CELU:
      for (int64_t i = b; i < e; i++) y[i] = x[i] > 0 ? x[i] : a * expm1f(x[i] / a);
      break;
    case GROVE__UN_SOFTPLUS:
      for (int64_t i = b; i < e; i++) y[i] = softplus1(x[i], a, p);
      break;
    case GROVE__UN_MISH:
      for (int64_t i = b; i < e; i++) y[i] = x[i] * tanhf(softplus1(x[i], 1.0f, 20.0f));
      break;
    case GROVE__UN_EXP:
      for (int64_t i = b; i < e; i++) y[i] = expf(x[i]);
      break;
    case GROVE__UN_LOG:
      for (int64_t i = b; i < e; i++) y[i] = logf(x[i]);
      break;
    case GROVE__UN_SQRT:
      for (int64_t i = b; i < e; i++) y[i] = sqrtf(x[i]);
      break;
    case GROVE__UN_RSQRT:
      for (int64_t i = b; i < e; i++) y[i] = 1.0f / sqrtf(x[i]);
      break;
    case GROVE__UN_ABS:
      for (int64_t i = b; i < e; i++) y[i] = fabsf(x[i]);
      break;
    case GROVE__UN_NEG:
      for (int64_t i = b; i < e; i++) y[i] = -x[i];
      break;
    case GROVE__UN_SIN:
      for (int64_t i = b; i < e; i++) y[i] = sinf(x[i]);
      break;
    case GROVE__UN_COS:
      for (int64_t i = b; i < e; i++) y[i] = cosf(x[i]);
      break;
    case GROVE__UN_ERF:
      for (int64_t i = b; i < e; i++) y[i] = erff(x[i]);
      break;
    case GROVE__UN_RECIPROCAL:
      for (int64_t i = b; i < e; i++) y[i] = 1.0f / x[i];
      break;
    case GROVE__UN_LOG1P:
      for (int64_t i = b; i < e; i++) y[i] = log1pf(x[i]);
      break;
    case GROVE__UN_EXPM1:
      for (int64_t i = b; i < e; i++) y[i] = expm1f(x[i]);
      break;
    case GROVE__UN_SOFTSIGN: /* F.softsign: x / (1 + |x|) */
      for (int64_t i = b; i < e; i++) y[i] = x[i] / (1.0f + fabsf(x[i]));
      break;
    case GROVE__UN_LOGSIGMOID:
      /* aten's log_sigmoid: min(x, 0) - log1p(exp(-|x|)), which neither
       * overflows for large -x nor loses the tail for large x. */
      for (int64_t i = b; i < e; i++) y[i] = (x[i] < 0 ? x[i] : 0.0f) - log1pf(expf(-fabsf(x[i])));
      break;
    case GROVE__UN_FLOOR:
      for (int64_t i = b; i < e; i++) y[i] = floorf(x[i]);
      break;
    case GROVE__UN_CEIL:
      for (int64_t i = b; i < e; i++) y[i] = ceilf(x[i]);
      break;
    case GROVE__UN_ROUND:
      /* torch.round: half to even (nearbyint in the default rounding mode);
       * with decimals, scaled by 10^decimals first, as aten does. */
      if (a == 0) {
        for (int64_t i = b; i < e; i++) y[i] = nearbyintf(x[i]);
      } else if (a > 0) {
        const float t = powf(10.0f, a);
        for (int64_t i = b; i < e; i++) y[i] = nearbyintf(x[i] * t) / t;
      } else {
        const float t = powf(10.0f, -a);
        for (int64_t i = b; i < e; i++) y[i] = nearbyintf(x[i] / t) * t;
      }
      break;
    case GROVE__UN_TRUNC:
      for (int64_t i = b; i < e; i++) y[i] = truncf(x[i]);
      break;
    case GROVE__UN_SIGN: /* 0 for 0 and NaN, as torch */
      for (int64_t i = b; i < e; i++) y[i] = (float)((x[i] > 0) - (x[i] < 0));
      break;
    case GROVE__UN_SQUARE:
      for (int64_t i = b; i < e; i++) y[i] = x[i] * x[i];
      break;
    case GROVE__UN_LOG2:
      for (int64_t i = b; i < e; i++) y[i] = log2f(x[i]);
      break;
    case GROVE__UN_LOG10:
      for (int64_t i = b; i < e; i++) y[i] = log10f(x[i]);
      break;
    case GROVE__UN_EXP2:
      for (int64_t i = b; i < e; i++) y[i] = exp2f(x[i]);
      break;
    case GROVE__UN_TAN:
      for (int64_t i = b; i < e; i++) y[i] = tanf(x[i]);
      break;
    case GROVE__UN_ATAN:
      for (int64_t i = b; i < e; i++) y[i] = atanf(x[i]);
      break;
    case GROVE__UN_SINH:
      for (int64_t i = b; i < e; i++) y[i] = sinhf(x[i]);
      break;
    case GROVE__UN_COSH:
      for (int64_t i = b; i < e; i++) y[i] = coshf(x[i]);
      break;
    case GROVE__UN_ASIN:
      for (int64_t i = b; i < e; i++) y[i] = asinf(x[i]);
      break;
    case GROVE__UN_ACOS:
      for (int64_t i = b; i < e; i++) y[i] = acosf(x[i]);
      break;
    case GROVE__UN_TANHSHRINK:
      for (int64_t i = b; i < e; i++) y[i] = x[i] - tanhf(x[i]);
      break;
    case GROVE__UN_HARDSHRINK: /* torch: x outside [-lambd, lambd], else 0 */
      for (int64_t i = b; i < e; i++) y[i] = (x[i] >= -a && x[i] <= a) ? 0.0f : x[i];
      break;
    case GROVE__UN_SOFTSHRINK:
      for (int64_t i = b; i < e; i++) y[i] = x[i] > a ? x[i] - a : (x[i] < -a ? x[i] + a : 0.0f);
      break;
    case GROVE__UN_THRESHOLD: /* x > threshold ? x : value; NaN stays */
      for (int64_t i = b; i < e; i++) y[i] = x[i] <= a ? p : x[i];
      break;
    default: /* GROVE__UN_POW */
      if (a == 2.0f) {
        for (int64_t i = b; i < e; i++) y[i] = x[i] * x[i];
      } else if (a == 0.5f) {
        for (int64_t i = b; i < e; i++) y[i] = sqrtf(x[i]);
      } else {
        for (int64_t i = b; i < e; i++) y[i] = powf(x[i], a);
      }
      break;
  }
}

/* The int64 forms of abs, neg, clamp, floor, ceil, round, trunc, sign and
 * square (torch keeps the dtype). */
static grove_status unary_i64(grove_fwd *f, int op, const grove_tensor *x, double a, double b,
                              grove_tensor *out) {
  grove_tensor c;
  grove_status s = grove__fwd_contig(f, x, &c);
  if (!s) s = grove_fwd_alloc(f, out, GROVE_I64, c.ndim, c.shape);
  if (s) return s;
  const int64_t n = grove_tensor_numel(&c);
  const int64_t *xv = c.data;
  int64_t *y = out->data;
  /* The bounds as integers: a value v < a exactly when v < ceil(a). */
  const double lo = isinf(a) ? -9.2e18 : ceil(a), hi = isinf(b) ? 9.2e18 : floor(b);
  for (int64_t i = 0; i < n; i++) {
    const int64_t v = xv[i];
    if (op == GROVE__UN_ABS)
      y[i] = v < 0 ? -v : v;
    else if (op == GROVE__UN_NEG)
      y[i] = -v;
    else if (op == GROVE__UN_SIGN)
      y[i] = (v > 0) - (v < 0);
    else if (op == GROVE__UN_SQUARE)
      y[i] = (int64_t)((uint64_t)v * (uint64_t)v); /* wraps as torch's int64 */
    else if (op == GROVE__UN_FLOOR || op == GROVE__UN_CEIL || op == GROVE__UN_TRUNC ||
             (op == GROVE__UN_ROUND && a >= 0))
      y[i] = v; /* an integer is its own floor */
    else if (op == GROVE__UN_ROUND) {
      /* round(v, decimals < 0): to a multiple of 10^-decimals, half to even */
      const double t = pow(10.0, -a);
      y[i] = (int64_t)(nearbyint((double)v / t) * t);
    } else
      y[i] = (double)v < lo ? (int64_t)lo : ((double)v > hi ? (int64_t)hi : v);
  }
  return GROVE_OK;
}

grove_status grove__op_unary(grove_fwd *f, int op, const grove_tensor *x, double a, double b,
                             grove_tensor *out, const grove_tensor *into) {
  if (op < 0 || op >= GROVE__UN_COUNT)
    return grove_err_set(f->err, GROVE_E_INVALID_ARGUMENT, "unknown elementwise function %d", op);
  const bool keeps_int = op == GROVE__UN_ABS || op == GROVE__UN_NEG || op == GROVE__UN_CLAMP ||
                         op == GROVE__UN_FLOOR || op == GROVE__UN_CEIL || op == GROVE__UN_ROUND ||
                         op == GROVE__UN_TRUNC || op == GROVE__UN_SIGN || op == GROVE__UN_SQUARE;
  if (x->dtype == GROVE_I64 && keeps_int) return unary_i64(f, op, x, a, b, out);
  const bool promotes = op == GROVE__UN_EXP || op == GROVE__UN_LOG || op == GROVE__UN_SQRT ||
                        op == GROVE__UN_RSQRT || op == GROVE__UN_POW || op == GROVE__UN_SIN ||
                        op == GROVE__UN_COS || op == GROVE__UN_ERF || op == GROVE__UN_RECIPROCAL ||
                        op == GROVE__UN_LOG1P || op == GROVE__UN_EXPM1 ||
                        op == GROVE__UN_SOFTSIGN || (op >= GROVE__UN_LOG2 && op <= GROVE__UN_ACOS);
  if (x->dtype != GROVE_F32 && !promotes)
    return grove_err_set(f->err, GROVE_E_DTYPE, "%s: expected a float32 tensor, got %s",
                         unary_names[op], grove_dtype_name(x->dtype));
  if ((op == GROVE__UN_CELU && a == 0) || (op == GROVE__UN_SOFTPLUS && a == 0))
    return grove_err_set(f->err, GROVE_E_INVALID_ARGUMENT, "%s: %s must not be 0",
                         unary_names[op], op == GROVE__UN_CELU ? "alpha" : "beta");
  grove_tensor src;
  grove_status s;
  const bool nhwc = x->dtype == GROVE_F32 && grove__is_nhwc(x);
  if (nhwc || (x->dtype == GROVE_F32 && grove_tensor_is_contiguous(x)))
    src = *x;
  else if ((s = grove__contig_f32(f, x, &src)))
    return s;
  if (into && !nhwc && into->dtype == GROVE_F32 && grove_tensor_is_contiguous(into) &&
      grove_tensor_same_shape(into, &src))
    *out = *into;
  else if ((s = grove_fwd_alloc(f, out, GROVE_F32, src.ndim, src.shape)))
    return s;
  if (nhwc) grove__set_nhwc(out);
  unary_par c = {op, (float)a, (float)b, src.data, out->data};
  grove__parallel_for(grove_tensor_numel(&src), grove__par_grain(4), unary_chunk, &c);
  return GROVE_OK;
}

grove_status grove__op_pow_tensor(grove_fwd *f, const grove_tensor *x, const grove_tensor *e,
                                  grove_tensor *out) {
  grove_tensor xf, ef;
  grove_status s;
  if ((s = grove__contig_f32(f, x, &xf)) || (s = grove__contig_f32(f, e, &ef))) return s;
  int nd;
  int64_t shape[GROVE_MAX_DIMS], sx[GROVE_MAX_DIMS], se[GROVE_MAX_DIMS];
  if ((s = grove__broadcast_shape(f, &xf, &ef, &nd, shape))) return s;
  if ((s = grove_fwd_alloc(f, out, GROVE_F32, nd, shape))) return s;
  grove__broadcast_strides(&xf, nd, shape, sx);
  grove__broadcast_strides(&ef, nd, shape, se);
  const int64_t n = grove_tensor_numel(out);
  const float *px = xf.data, *pe = ef.data;
  float *y = out->data;
  int64_t idx[GROVE_MAX_DIMS] = {0}, ox = 0, oe = 0;
  for (int64_t i = 0; i < n; i++) {
    y[i] = powf(px[ox], pe[oe]);
    for (int d = nd - 1; d >= 0; d--) {
      if (++idx[d] < shape[d]) {
        ox += sx[d];
        oe += se[d];
        break;
      }
      ox -= sx[d] * (shape[d] - 1);
      oe -= se[d] * (shape[d] - 1);
      idx[d] = 0;
    }
  }
  return GROVE_OK;
}

grove_status grove__op_prelu(grove_fwd *f, const grove_tensor *x, const grove_tensor *weight,
                             grove_tensor *out) {
  if (x->dtype != GROVE_F32 || weight->dtype != GROVE_F32)
    return grove_err_set(f->err, GROVE_E_DTYPE,
                         "prelu: expected float32 tensors, got %s input and %s weight",
                         grove_dtype_name(x->dtype), grove_dtype_name(weight->dtype));
  const int64_t nw = grove_tensor_numel(weight);
  const int64_t C = x->ndim >= 2 ? x->shape[1] : (x->ndim == 1 ? x->shape[0] : 1);
  if (nw != 1 && nw != C) {
    char b[128];
    return grove_err_set(f->err, GROVE_E_SHAPE,
                         "prelu: the weight has %lld numbers, but the input %s has %lld "
                         "channels (dim 1): expected 1 or %lld",
                         (long long)nw, grove_shape_str(x->ndim, x->shape, b, sizeof b),
                         (long long)C, (long long)C);
  }
  grove_tensor w, src;
  grove_status s;
  if ((s = grove__fwd_contig(f, weight, &w))) return s;
  const bool nhwc = grove__is_nhwc(x);
  if (nhwc)
    src = *x;
  else if ((s = grove__fwd_contig(f, x, &src)))
    return s;
  if ((s = grove_fwd_alloc(f, out, GROVE_F32, src.ndim, src.shape))) return s;
  if (nhwc) grove__set_nhwc(out);
  const int64_t n = grove_tensor_numel(&src);
  const float *xv = src.data, *wv = w.data;
  float *y = out->data;
  if (nw == 1) {
    const float a = wv[0];
    for (int64_t i = 0; i < n; i++) y[i] = xv[i] > 0 ? xv[i] : a * xv[i];
    return GROVE_OK;
  }
  /* The channel of element i: (i / inner) % C, inner = the product of the
   * dims after 1 (contiguous), or 1 (channels last: C is the fastest). */
  int64_t inner = 1;
  if (!nhwc)
    for (int d = 2; d < src.ndim; d++) inner *= src.shape[d];
  if (src.ndim == 1) inner = 1;
  for (int64_t i = 0; i < n; i++) {
    const float a = wv[(i / inner) % C];
    y[i] = xv[i] > 0 ? xv[i] : a * xv[i];
  }
  return GROVE_OK;
}

grove_status grove__op_to_dtype(grove_fwd *f, const grove_tensor *x, grove_dtype dt,
                                grove_tensor *out) {
  if (x->dtype == dt) {
    *out = *x;
    return GROVE_OK;
  }
  grove_status s = grove_fwd_alloc(f, out, dt, x->ndim, x->shape);
  if (s) return s;
  const int64_t n = grove_tensor_numel(x);
  if (n == 0) return GROVE_OK;
  const bool xfloat = x->dtype == GROVE_F32 || x->dtype == GROVE_F64 || x->dtype == GROVE_F16 ||
                      x->dtype == GROVE_BF16;
  if (dt == GROVE_BOOL || (xfloat && dt != GROVE_F32 && dt != GROVE_F64 && dt != GROVE_F16 &&
                           dt != GROVE_BF16)) {
    /* float -> integer (truncation toward zero) and any -> bool (!= 0),
     * which grove_tensor_copy refuses or does otherwise: through float32. */
    grove_tensor c;
    if ((s = grove__contig_f32(f, x, &c))) return s;
    const float *v = c.data;
    for (int64_t i = 0; i < n; i++) {
      const float a = v[i];
      switch (dt) {
        case GROVE_BOOL: ((uint8_t *)out->data)[i] = a != 0; break;
        case GROVE_I64: ((int64_t *)out->data)[i] = (int64_t)a; break;
        case GROVE_I32: ((int32_t *)out->data)[i] = (int32_t)a; break;
        case GROVE_I16: ((int16_t *)out->data)[i] = (int16_t)a; break;
        case GROVE_I8: ((int8_t *)out->data)[i] = (int8_t)a; break;
        case GROVE_U8: ((uint8_t *)out->data)[i] = (uint8_t)(int64_t)a; break;
        default:
          return grove_err_set(f->err, GROVE_E_DTYPE, "to: cannot convert %s to %s",
                               grove_dtype_name(x->dtype), grove_dtype_name(dt));
      }
    }
    return GROVE_OK;
  }
  return grove_tensor_copy(out, x, f->err);
}
