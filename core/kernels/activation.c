/* activation.c: the elementwise activations a convolution's or a Linear's
 * epilogue can apply (grove__act_apply): ReLU, ReLU6, Hardswish,
 * Hardsigmoid, SiLU, Sigmoid and the exact GELU, once for both the op
 * entries (nn/ops_activation.c, nn/pointwise.c) and the fused layers
 * (nn/layers_conv.c; a Linear's tiles in gemm.c), so a value computes alike
 * whether its activation ran as a node of its own or in the layer's pass
 * over its output.  A kernel, no layer: pure, any thread.
 *
 * Why a vector exp: SiLU and Sigmoid through libm's scalar expf were 40% of
 * EfficientNet-B0's forward (docs/performance-models.md, "The torchvision zoo").
 * simd_exp.h's exp is within 2 ulp of expf; SiLU's x / (1 + exp(-x)) and
 * Sigmoid's 1 / (1 + exp(-x)) are torch's formulas (aten's vectorised CPU
 * kernels use a polynomial exp too), the reciprocal by the CPU's estimate
 * and one Newton step (a few ulp in all).  NaN stays NaN, as in torch. */
#include <math.h>
#include <string.h>

#include "kernels.h"
#include "simd_exp.h"

/* Comparisons written so that a NaN passes through, as torch's clamp and
 * hardtanh let it. */
static inline float clampf(float v, float lo, float hi) {
  return v < lo ? lo : (v > hi ? hi : v);
}

/* The clamp-based ones: GCC vectorises these plain loops 16 or 8 wide. */
GROVE__CHANNEL_LOOP static void clamp_kind(grove__act act, const float *x, float *y, int64_t n) {
  switch (act) {
    case GROVE__ACT_RELU:
      for (int64_t i = 0; i < n; i++) y[i] = x[i] < 0.0f ? 0.0f : x[i];
      break;
    case GROVE__ACT_RELU6:
      for (int64_t i = 0; i < n; i++) y[i] = clampf(x[i], 0.0f, 6.0f);
      break;
    case GROVE__ACT_HARDSWISH:
      for (int64_t i = 0; i < n; i++) y[i] = x[i] * clampf(x[i] + 3.0f, 0.0f, 6.0f) / 6.0f;
      break;
    case GROVE__ACT_HARDSIGMOID:
      for (int64_t i = 0; i < n; i++) y[i] = clampf(x[i] + 3.0f, 0.0f, 6.0f) / 6.0f;
      break;
    default:
      break;
  }
}

/* SiLU and Sigmoid on a CPU without AVX2: libm's expf.  The vector loops
 * take every element, a partial last vector too, so an element's value does
 * not depend on where it falls in the run. */
static void exp_kind_scalar(grove__act act, const float *x, float *y, int64_t n) {
  if (act == GROVE__ACT_SILU)
    for (int64_t i = 0; i < n; i++) y[i] = x[i] / (1.0f + expf(-x[i]));
  else
    for (int64_t i = 0; i < n; i++) y[i] = 1.0f / (1.0f + expf(-x[i]));
}

#if GROVE__X86_SIMD
GROVE__TARGET_PUSH("avx512f")
static void exp_kind_avx512(grove__act act, const float *x, float *y, int64_t n) {
  const __m512 one = _mm512_set1_ps(1.0f), zero = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1);
    const __m512 v = _mm512_maskz_loadu_ps(m, x + i);
    const __m512 d = _mm512_add_ps(one, grove__exp16(_mm512_sub_ps(zero, v)));
    /* 1 / d by rcp14 and one Newton step (within about 1 ulp), a quarter
     * of a division's time. */
    __m512 q = _mm512_rcp14_ps(d);
    q = _mm512_mul_ps(q, _mm512_fnmadd_ps(d, q, _mm512_set1_ps(2.0f)));
    __m512 r;
    if (act == GROVE__ACT_SILU) {
      r = _mm512_mul_ps(v, q); /* NaN in, NaN out */
    } else {
      r = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), q, v);
    }
    _mm512_mask_storeu_ps(y + i, m, r);
  }
}
GROVE__TARGET_POP

GROVE__TARGET_PUSH("avx2,fma")
static void exp_kind_avx2(grove__act act, const float *x, float *y, int64_t n) {
  const __m256 one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps();
  for (int64_t i = 0; i < n; i += 8) {
    /* The last partial vector goes through a padded copy, so that every
     * element is computed by the same vector code wherever it falls. */
    float in[8] = {0}, out[8];
    const int64_t k = n - i < 8 ? n - i : 8;
    const float *src = x + i;
    if (k < 8) {
      for (int64_t j = 0; j < k; j++) in[j] = x[i + j];
      src = in;
    }
    const __m256 v = _mm256_loadu_ps(src);
    const __m256 d = _mm256_add_ps(one, grove__exp8(_mm256_sub_ps(zero, v)));
    /* 1 / d by rcp (12 bits) and one Newton step (about 23 bits). */
    __m256 q = _mm256_rcp_ps(d);
    q = _mm256_mul_ps(q, _mm256_fnmadd_ps(d, q, _mm256_set1_ps(2.0f)));
    __m256 r;
    if (act == GROVE__ACT_SILU) {
      r = _mm256_mul_ps(v, q);
    } else {
      r = _mm256_blendv_ps(q, v, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    }
    if (k == 8) {
      _mm256_storeu_ps(y + i, r);
    } else {
      _mm256_storeu_ps(out, r);
      for (int64_t j = 0; j < k; j++) y[i + j] = out[j];
    }
  }
}
GROVE__TARGET_POP
#endif

/* The exact GELU on vectors, for the transformers' feed-forward blocks (a
 * node of its own, or a Linear's epilogue: gemm.c):
 * 0.5 x (1 + erf(x / sqrt 2)) with erf(z) = 1 - erfc(z) and erfc(|z|) from
 * Abramowitz & Stegun 7.1.26, t (a1 + t (a2 + ... + t a5)) exp(-z^2) with
 * t = 1 / (1 + p |z|), absolute error at most 1.5e-7 (erff's own float
 * rounding is 6e-8).  For x < 0 the factor is erfc(|z|) itself, so the
 * tail keeps its relative accuracy instead of cancelling in 1 - erf.
 * NaN stays NaN and +inf stays +inf; -inf gives NaN, as torch's
 * -inf * 0.5 * (1 + erf(-inf)) does. */
#define GELU_P 0.3275911f
#define GELU_A1 0.254829592f
#define GELU_A2 -0.284496736f
#define GELU_A3 1.421413741f
#define GELU_A4 -1.453152027f
#define GELU_A5 1.061405429f
#define GELU_R 0.7071067811865476f /* 1 / sqrt(2) */

#if GROVE__X86_SIMD
/* erfc(z) for z = |x| / sqrt 2 >= 0, with V the intrinsics' prefix, T the
 * vector type and EXP the vector exp of that width. */
#define GELU_ERFC(V, T, EXP, z, c)                                                                 \
  do {                                                                                             \
    const T one_ = V##_set1_ps(1.0f);                                                              \
    const T t_ = V##_div_ps(one_, V##_fmadd_ps(V##_set1_ps(GELU_P), (z), one_));                   \
    T q_ = V##_fmadd_ps(V##_set1_ps(GELU_A5), t_, V##_set1_ps(GELU_A4));                           \
    q_ = V##_fmadd_ps(q_, t_, V##_set1_ps(GELU_A3));                                               \
    q_ = V##_fmadd_ps(q_, t_, V##_set1_ps(GELU_A2));                                               \
    q_ = V##_fmadd_ps(q_, t_, V##_set1_ps(GELU_A1));                                               \
    (c) = V##_mul_ps(V##_mul_ps(q_, t_), EXP(V##_mul_ps(V##_sub_ps(V##_setzero_ps(), (z)), (z)))); \
  } while (0)

GROVE__TARGET_PUSH("avx512f")
static void gelu_avx512(const float *x, float *y, int64_t n) {
  const __m512 half = _mm512_set1_ps(0.5f), two = _mm512_set1_ps(2.0f);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = n - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - i)) - 1u);
    const __m512 v = _mm512_maskz_loadu_ps(m, x + i);
    const __m512 z = _mm512_mul_ps(_mm512_abs_ps(v), _mm512_set1_ps(GELU_R));
    __m512 c;
    GELU_ERFC(_mm512, __m512, grove__exp16, z, c);
    /* 1 + erf(x / sqrt 2): 2 - erfc for x >= 0, erfc for x < 0. */
    const __mmask16 neg = _mm512_cmp_ps_mask(v, _mm512_setzero_ps(), _CMP_LT_OQ);
    const __m512 f = _mm512_mask_blend_ps(neg, _mm512_sub_ps(two, c), c);
    _mm512_mask_storeu_ps(y + i, m, _mm512_mul_ps(_mm512_mul_ps(half, v), f));
  }
}
GROVE__TARGET_POP

GROVE__TARGET_PUSH("avx2,fma")
static void gelu_avx2(const float *x, float *y, int64_t n) {
  const __m256 half = _mm256_set1_ps(0.5f), two = _mm256_set1_ps(2.0f);
  const __m256 sign = _mm256_set1_ps(-0.0f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    const __m256 z = _mm256_mul_ps(_mm256_andnot_ps(sign, v), _mm256_set1_ps(GELU_R));
    __m256 c;
    GELU_ERFC(_mm256, __m256, grove__exp8, z, c);
    const __m256 neg = _mm256_cmp_ps(v, _mm256_setzero_ps(), _CMP_LT_OQ);
    const __m256 f = _mm256_blendv_ps(_mm256_sub_ps(two, c), c, neg);
    _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_mul_ps(half, v), f));
  }
  if (i < n) { /* the tail through a zero-padded block */
    float bx[8] = {0}, by[8];
    memcpy(bx, x + i, (size_t)(n - i) * sizeof(float));
    gelu_avx2(bx, by, 8);
    memcpy(y + i, by, (size_t)(n - i) * sizeof(float));
  }
}
GROVE__TARGET_POP
#endif /* GROVE__X86_SIMD */

/* GELU on a CPU without AVX2: libm's erff. */
static void gelu_scalar(const float *x, float *y, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    float v = x[i];
    y[i] = 0.5f * v * (1.0f + erff(v * GELU_R));
  }
}

static void gelu_run(const float *x, float *y, int64_t n) {
#if GROVE__X86_SIMD
  if (grove__cpu_avx512()) {
    gelu_avx512(x, y, n);
    return;
  }
  if (grove__cpu_avx2()) {
    gelu_avx2(x, y, n);
    return;
  }
#endif
  gelu_scalar(x, y, n);
}

void grove__act_apply(grove__act act, const float *x, float *y, int64_t n) {
  if (act == GROVE__ACT_NONE || n <= 0) return;
  if (act == GROVE__ACT_GELU) {
    gelu_run(x, y, n);
    return;
  }
  if (act != GROVE__ACT_SILU && act != GROVE__ACT_SIGMOID) {
    clamp_kind(act, x, y, n);
    return;
  }
#if GROVE__X86_SIMD
  if (grove__cpu_avx512()) {
    exp_kind_avx512(act, x, y, n);
    return;
  }
  if (grove__cpu_avx2()) {
    exp_kind_avx2(act, x, y, n);
    return;
  }
#endif
  exp_kind_scalar(act, x, y, n);
}

/* The residual add: a plain loop GCC vectorises; the activation then runs
 * over the same floats while they are in cache. */
GROVE__CHANNEL_LOOP static void add_into(float *y, const float *res, int64_t n) {
  for (int64_t i = 0; i < n; i++) y[i] += res[i];
}

void grove__act_add(grove__act act, float *y, const float *res, int64_t n) {
  if (n <= 0) return;
  add_into(y, res, n);
  grove__act_apply(act, y, y, n);
}

/* Elements [b, e) of grove__act_inplace_par. */
typedef struct act_par {
  grove__act act;
  float *y;
} act_par;

static void act_chunk(void *ctx, int64_t b, int64_t e) {
  const act_par *c = ctx;
  grove__act_apply(c->act, c->y + b, c->y + b, e - b);
}

void grove__act_inplace_par(grove__act act, float *y, int64_t n) {
  if (act == GROVE__ACT_NONE || n <= 0) return;
  act_par c = {act, y};
  grove__parallel_for(n, (int64_t)16 << 10, act_chunk, &c);
}
