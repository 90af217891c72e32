/* simd_exp.h: core/kernels/, exp(x) on 8 (AVX2+FMA) and 16 (AVX-512F) float
 * lanes, for the layers that need a vector exp inside their own kernels
 * (the recurrent gates' sigmoid/tanh in layers_rnn.c, attention's softmax in
 * layers_attention.c).  One range reduction and one polynomial (Cephes'
 * expf: x = n ln2 + r, |r| <= ln2 / 2, exp(r) by a degree-7 polynomial,
 * times 2^n, within 2 ulp) written once for both widths.  Header-only:
 * static inline, pure, any thread; callers check grove__cpu_avx2 /
 * grove__cpu_avx512 before calling.  Never installed. */
#ifndef GROVE_CORE_SIMD_EXP_H
#define GROVE_CORE_SIMD_EXP_H

#include "kernels.h"

#if GROVE__X86_SIMD
#include <immintrin.h>

/* exp(r) of the reduced argument, with V the intrinsics' prefix and T the
 * vector type (_mm256 and __m256, or _mm512 and __m512): r = x - n ln2 in
 * two parts (ln2's high part has few bits, so n * hi is exact), then the
 * polynomial; leaves exp(r) in q. */
#define GROVE__EXP_POLY(V, T, x, n, q)                                              \
  do {                                                                              \
    T r_ = V##_fnmadd_ps((n), V##_set1_ps(0.693359375f), (x));                      \
    r_ = V##_fnmadd_ps((n), V##_set1_ps(-2.12194440e-4f), r_);                      \
    (q) = V##_set1_ps(1.9875691500E-4f);                                            \
    (q) = V##_fmadd_ps((q), r_, V##_set1_ps(1.3981999507E-3f));                     \
    (q) = V##_fmadd_ps((q), r_, V##_set1_ps(8.3334519073E-3f));                     \
    (q) = V##_fmadd_ps((q), r_, V##_set1_ps(4.1665795894E-2f));                     \
    (q) = V##_fmadd_ps((q), r_, V##_set1_ps(1.6666665459E-1f));                     \
    (q) = V##_fmadd_ps((q), r_, V##_set1_ps(5.0000001201E-1f));                     \
    (q) = V##_fmadd_ps((q), V##_mul_ps(r_, r_), V##_add_ps(r_, V##_set1_ps(1.0f))); \
  } while (0)

#define GROVE__EXP_HI 88.3762626647949f
#define GROVE__LOG2E 1.44269504088896341f

GROVE__TARGET_PUSH("avx2,fma")
/* 8 lanes.  2^n is built from the exponent bits, so n must stay in
 * [-126, 127]: the low clamp is -87.34 (exp(-87.34) is about 2^-126). */
static inline __m256 grove__exp8(__m256 x) {
  x = _mm256_max_ps(_mm256_min_ps(x, _mm256_set1_ps(GROVE__EXP_HI)),
                    _mm256_set1_ps(-87.3365447504f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(GROVE__LOG2E)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 q;
  GROVE__EXP_POLY(_mm256, __m256, x, n, q);
  const __m256i e =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(q, _mm256_castsi256_ps(e));
}
GROVE__TARGET_POP

GROVE__TARGET_PUSH("avx512f")
/* 16 lanes.  scalef takes any n, so the clamp is symmetric (exp(-88.38)
 * is 2^-127.5, a denormal: a caller that needs an exact 0 masks it). */
static inline __m512 grove__exp16(__m512 x) {
  x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(GROVE__EXP_HI)),
                    _mm512_set1_ps(-GROVE__EXP_HI));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(GROVE__LOG2E)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 q;
  GROVE__EXP_POLY(_mm512, __m512, x, n, q);
  return _mm512_scalef_ps(q, n);
}
GROVE__TARGET_POP

#endif /* GROVE__X86_SIMD */
#endif /* GROVE_CORE_SIMD_EXP_H */
