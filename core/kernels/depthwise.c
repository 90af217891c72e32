/* depthwise.c: the depthwise convolution kernel (groups == in_channels ==
 * out_channels: MobileNet's and EfficientNet's 3x3 and 5x5 layers) that
 * layers_conv.c runs instead of lowering such a layer onto matrix products.
 * A kernel, no layer.  Pure functions of their arguments: any thread.
 *
 * Why its own kernel: a depthwise layer has one input channel per group, so
 * a matrix product per group is [positions, k*k] x [k*k, 1], a dot product
 * of 9 or 25 floats per output, and the columns path spent its time
 * unrolling patches and calling OpenBLAS once per channel.  Channels last,
 * the same tap of neighbouring channels is one contiguous vector of the
 * input and of the weight (repacked [kh][kw][C]), so a row of outputs is
 * kh * kw fused multiply-adds per vector of channels, 16 channels per
 * AVX-512 register (8 with AVX2), and the epilogue (the bias, or a fused
 * BatchNorm's scale and shift, then a clamp: ReLU, ReLU6) is applied before
 * the one store.
 *
 * Every kernel (AVX-512, AVX2, scalar) accumulates each output as
 * fma(x, w, acc) over the taps in the same (ki, kj) order from zero, and
 * applies fma(acc, scale, shift) then max(lo) and min(hi): the same bits on
 * every CPU and thread count. */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>

#include "kernels.h"

#if GROVE__X86_SIMD
#include <immintrin.h>
#endif

/* Taps of output column ow that fall inside the input row: kj in [*lo, *hi). */
static inline void col_taps(const grove__dw_args *a, int64_t ow, int64_t *lo, int64_t *hi) {
  const int64_t iw0 = ow * a->sw - a->pw;
  int64_t l = 0, h = a->kw;
  while (l < h && iw0 + l * a->dw < 0) l++;
  while (h > l && iw0 + (h - 1) * a->dw >= a->W) h--;
  *lo = l;
  *hi = h;
}

static inline float ep_scalar(const grove__dw_args *a, int64_t c, float v) {
  v = fmaf(v, a->scale[c], a->shift[c]);
  v = v < a->lo ? a->lo : v; /* fmaxf would turn NaN into lo; torch keeps NaN */
  return v > a->hi ? a->hi : v;
}

/* Channels [c0, C) of output row oh, column ow. */
static void dw_px_scalar(const grove__dw_args *a, const float *x, int64_t oh, int64_t ow,
                         int64_t c0, float *y) {
  const int64_t C = a->C, ih0 = oh * a->sh - a->ph, iw0 = ow * a->sw - a->pw;
  int64_t jl, jh;
  col_taps(a, ow, &jl, &jh);
  for (int64_t c = c0; c < C; c++) {
    float acc = 0.0f;
    for (int64_t ki = 0; ki < a->kh; ki++) {
      const int64_t ih = ih0 + ki * a->dh;
      if (ih < 0 || ih >= a->H) continue;
      for (int64_t kj = jl; kj < jh; kj++)
        acc = fmaf(x[(ih * a->W + iw0 + kj * a->dw) * C + c], a->w[(ki * a->kw + kj) * C + c],
                   acc);
    }
    y[ow * C + c] = ep_scalar(a, c, acc);
  }
}

#if GROVE__X86_SIMD
/* One output row on L lanes of vector type VT (AVX-512: 16, AVX2: 8; P is
 * the intrinsics' prefix), compiled in each one's target region below.
 * Columns whose taps all lie inside the input row (the interior) go four at
 * a time, each weight vector loaded once for the four; the edge columns one
 * at a time with their taps clipped.  Channels past the last whole vector
 * take TAIL (AVX-512: masked vectors; AVX2: the scalar loop).  Each output
 * still sums its taps in (ki, kj) order from zero: the same bits. */
#define DW_ROW(SUF, VT, L, P, TAIL)                                                           \
  static inline VT dw_ep_##SUF(const grove__dw_args *a, VT acc, int64_t c, VT lo, VT hi) {   \
    VT v = P##_fmadd_ps(acc, P##_loadu_ps(a->scale + c), P##_loadu_ps(a->shift + c));         \
    /* max/min return their second operand for a NaN: v stays NaN. */                        \
    return P##_min_ps(hi, P##_max_ps(lo, v));                                                 \
  }                                                                                           \
                                                                                              \
  static void dw_row_##SUF(const grove__dw_args *a, const float *x, int64_t oh, float *y) {  \
    const int64_t C = a->C, W = a->W, ih0 = oh * a->sh - a->ph, Cv = C / L * L;               \
    const int64_t sx = a->sw * C, tx = a->dw * C; /* floats between columns, between taps */  \
    const VT lo = P##_set1_ps(a->lo), hi = P##_set1_ps(a->hi);                                \
    int64_t kil = 0, kih = a->kh;                                                             \
    while (kil < kih && ih0 + kil * a->dh < 0) kil++;                                         \
    while (kih > kil && ih0 + (kih - 1) * a->dh >= a->H) kih--;                               \
    /* Interior: ow in [o0, o1). */                                                           \
    int64_t o0 = a->pw > 0 ? (a->pw + a->sw - 1) / a->sw : 0;                                 \
    const int64_t span = W + a->pw - (a->kw - 1) * a->dw; /* iw0 + (kw-1)dw < W */           \
    int64_t o1 = span > 0 ? (span - 1) / a->sw + 1 : 0;                                       \
    if (o1 > a->OW) o1 = a->OW;                                                               \
    if (o0 > o1) o0 = o1;                                                                     \
    for (int64_t ow = 0; ow < a->OW; ow++) {                                                  \
      if (ow == o0) {                                                                         \
        for (; ow + 4 <= o1; ow += 4) {                                                       \
          const float *xb = x + (ow * a->sw - a->pw) * C;                                     \
          for (int64_t c = 0; c < Cv; c += L) {                                               \
            VT s0 = P##_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;                              \
            for (int64_t ki = kil; ki < kih; ki++) {                                          \
              const float *xr = xb + (ih0 + ki * a->dh) * W * C + c;                          \
              const float *wr = a->w + ki * a->kw * C + c;                                    \
              for (int64_t kj = 0; kj < a->kw; kj++, xr += tx) {                              \
                const VT wv = P##_loadu_ps(wr + kj * C);                                      \
                s0 = P##_fmadd_ps(P##_loadu_ps(xr), wv, s0);                                  \
                s1 = P##_fmadd_ps(P##_loadu_ps(xr + sx), wv, s1);                             \
                s2 = P##_fmadd_ps(P##_loadu_ps(xr + 2 * sx), wv, s2);                         \
                s3 = P##_fmadd_ps(P##_loadu_ps(xr + 3 * sx), wv, s3);                         \
              }                                                                               \
            }                                                                                 \
            float *yo = y + ow * C + c;                                                       \
            P##_storeu_ps(yo, dw_ep_##SUF(a, s0, c, lo, hi));                                 \
            P##_storeu_ps(yo + C, dw_ep_##SUF(a, s1, c, lo, hi));                             \
            P##_storeu_ps(yo + 2 * C, dw_ep_##SUF(a, s2, c, lo, hi));                         \
            P##_storeu_ps(yo + 3 * C, dw_ep_##SUF(a, s3, c, lo, hi));                         \
          }                                                                                   \
          for (int q = 0; q < 4 && Cv < C; q++) TAIL(a, x, oh, ow + q, Cv, y);                \
        }                                                                                     \
        if (ow >= a->OW) break;                                                               \
      }                                                                                       \
      const int64_t iw0 = ow * a->sw - a->pw;                                                 \
      int64_t jl, jh;                                                                         \
      col_taps(a, ow, &jl, &jh);                                                              \
      for (int64_t c = 0; c < Cv; c += L) {                                                   \
        VT acc = P##_setzero_ps();                                                            \
        for (int64_t ki = kil; ki < kih; ki++) {                                              \
          const float *xr = x + ((ih0 + ki * a->dh) * W + iw0) * C + c;                       \
          const float *wr = a->w + ki * a->kw * C + c;                                        \
          for (int64_t kj = jl; kj < jh; kj++)                                                \
            acc = P##_fmadd_ps(P##_loadu_ps(xr + kj * tx), P##_loadu_ps(wr + kj * C), acc);   \
        }                                                                                     \
        P##_storeu_ps(y + ow * C + c, dw_ep_##SUF(a, acc, c, lo, hi));                        \
      }                                                                                       \
      if (Cv < C) TAIL(a, x, oh, ow, Cv, y);                                                  \
    }                                                                                         \
  }

GROVE__TARGET_PUSH("avx512f")
/* Channels [c0, C) (fewer than 16) of column ow, in one masked vector. */
static void dw_tail_avx512(const grove__dw_args *a, const float *x, int64_t oh, int64_t ow,
                           int64_t c0, float *y) {
  const int64_t C = a->C, ih0 = oh * a->sh - a->ph, iw0 = ow * a->sw - a->pw;
  const __mmask16 m = (__mmask16)((1u << (C - c0)) - 1);
  int64_t jl, jh;
  col_taps(a, ow, &jl, &jh);
  __m512 acc = _mm512_setzero_ps();
  for (int64_t ki = 0; ki < a->kh; ki++) {
    const int64_t ih = ih0 + ki * a->dh;
    if (ih < 0 || ih >= a->H) continue;
    for (int64_t kj = jl; kj < jh; kj++)
      acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, x + (ih * a->W + iw0 + kj * a->dw) * C + c0),
                            _mm512_maskz_loadu_ps(m, a->w + (ki * a->kw + kj) * C + c0), acc);
  }
  __m512 v = _mm512_fmadd_ps(acc, _mm512_maskz_loadu_ps(m, a->scale + c0),
                             _mm512_maskz_loadu_ps(m, a->shift + c0));
  v = _mm512_min_ps(_mm512_set1_ps(a->hi), _mm512_max_ps(_mm512_set1_ps(a->lo), v));
  _mm512_mask_storeu_ps(y + ow * C + c0, m, v);
}
DW_ROW(avx512, __m512, 16, _mm512, dw_tail_avx512)
GROVE__TARGET_POP

GROVE__TARGET_PUSH("avx2,fma")
DW_ROW(avx2, __m256, 8, _mm256, dw_px_scalar)
GROVE__TARGET_POP
#endif /* GROVE__X86_SIMD */

void grove__depthwise_row(const grove__dw_args *a, const float *x, int64_t oh, float *y) {
#if GROVE__X86_SIMD
  if (grove__cpu_avx512()) {
    dw_row_avx512(a, x, oh, y);
    return;
  }
  if (grove__cpu_avx2()) {
    dw_row_avx2(a, x, oh, y);
    return;
  }
#endif
  for (int64_t ow = 0; ow < a->OW; ow++) dw_px_scalar(a, x, oh, ow, 0, y);
}
