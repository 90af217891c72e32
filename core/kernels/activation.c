/* activation.c: the elementwise activations a convolution's epilogue can
 * apply (grove__act_apply): ReLU, ReLU6, Hardswish, Hardsigmoid, SiLU and
 * Sigmoid, once for both the op entries (nn/ops_activation.c,
 * nn/pointwise.c) and the fused convolution (nn/layers_conv.c), so a value
 * computes alike whether its activation ran as a node of its own or in the
 * convolution's pass over its output.  A kernel, no layer: pure, any thread.
 *
 * Why a vector exp: SiLU and Sigmoid through libm's scalar expf were 40% of
 * EfficientNet-B0's forward (docs/performance-models.md, "The torchvision zoo").
 * simd_exp.h's exp is within 2 ulp of expf; SiLU's x / (1 + exp(-x)) and
 * Sigmoid's 1 / (1 + exp(-x)) are torch's formulas (aten's vectorised CPU
 * kernels use a polynomial exp too), the reciprocal by the CPU's estimate
 * and one Newton step (a few ulp in all).  NaN stays NaN, as in torch. */
#include <math.h>

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

void grove__act_apply(grove__act act, const float *x, float *y, int64_t n) {
  if (act == GROVE__ACT_NONE || n <= 0) return;
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
