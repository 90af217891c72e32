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
 * BatchNorm's scale and shift, then a clamp: ReLU, ReLU6; or Hardswish,
 * Hardsigmoid: MobileNetV3's) is applied before the one store.
 *
 * Every kernel (AVX-512, AVX2, scalar) accumulates each output as
 * fma(x, w, acc) over the taps in the same (ki, kj) order from zero, and
 * applies fma(acc, scale, shift) then max(lo) and min(hi), then post (with
 * grove__act_apply's bits: simd_act.h): the same bits on every CPU and
 * thread count. */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>

#include "kernels.h"
#include "simd_act.h"

#if GROVE__X86_SIMD
#include <immintrin.h>

/* The epilogue's last step on a vector: a->post (simd_act.h), P the
 * intrinsics' prefix. */
#define DW_POST(P, a, v)                                            \
  ((a)->post == GROVE__ACT_HARDSWISH     ? GROVE__HARDSWISH(P, v)   \
   : (a)->post == GROVE__ACT_HARDSIGMOID ? GROVE__HARDSIGMOID(P, v) \
                                         : (v))
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

/* The interior: the output columns [*o0, *o1) whose taps all lie inside
 * the input row. */
static inline void interior_cols(const grove__dw_args *a, int64_t *o0, int64_t *o1) {
  int64_t l = a->pw > 0 ? (a->pw + a->sw - 1) / a->sw : 0;
  const int64_t span = a->W + a->pw - (a->kw - 1) * a->dw; /* iw0 + (kw-1)dw < W */
  int64_t h = span > 0 ? (span - 1) / a->sw + 1 : 0;
  if (h > a->OW) h = a->OW;
  if (l > h) l = h;
  *o0 = l;
  *o1 = h;
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
  grove__act_apply(a->post, y + ow * C + c0, y + ow * C + c0, C - c0);
}

#if GROVE__X86_SIMD
/* One output row on L lanes of vector type VT (AVX2: 8; P is the
 * intrinsics' prefix), compiled in its target region below (AVX-512 has a
 * row function of its own, further down).  Columns whose taps all lie
 * inside the input row (the interior) go four at a time, each weight vector
 * loaded once for the four; the edge columns one at a time with their taps
 * clipped.  Channels past the last whole vector take TAIL (the scalar
 * loop).  Each output still sums its taps in (ki, kj) order from zero: the
 * same bits. */
#define DW_ROW(SUF, VT, L, P, TAIL)                                                          \
  static inline VT dw_ep_##SUF(const grove__dw_args *a, VT acc, int64_t c, VT lo, VT hi) {   \
    VT v = P##_fmadd_ps(acc, P##_loadu_ps(a->scale + c), P##_loadu_ps(a->shift + c));        \
    /* max/min return their second operand for a NaN: v stays NaN. */                        \
    v = P##_min_ps(hi, P##_max_ps(lo, v));                                                   \
    return DW_POST(P, a, v);                                                                 \
  }                                                                                          \
                                                                                             \
  static void dw_row_##SUF(const grove__dw_args *a, const float *x, int64_t oh, float *y) {  \
    const int64_t C = a->C, W = a->W, ih0 = oh * a->sh - a->ph, Cv = C / L * L;              \
    const int64_t sx = a->sw * C, tx = a->dw * C; /* floats between columns, between taps */ \
    const VT lo = P##_set1_ps(a->lo), hi = P##_set1_ps(a->hi);                               \
    int64_t kil = 0, kih = a->kh;                                                            \
    while (kil < kih && ih0 + kil * a->dh < 0) kil++;                                        \
    while (kih > kil && ih0 + (kih - 1) * a->dh >= a->H) kih--;                              \
    int64_t o0, o1; /* the interior */                                                       \
    interior_cols(a, &o0, &o1);                                                              \
    for (int64_t ow = 0; ow < a->OW; ow++) {                                                 \
      if (ow == o0) {                                                                        \
        for (; ow + 4 <= o1; ow += 4) {                                                      \
          const float *xb = x + (ow * a->sw - a->pw) * C;                                    \
          for (int64_t c = 0; c < Cv; c += L) {                                              \
            VT s0 = P##_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;                             \
            for (int64_t ki = kil; ki < kih; ki++) {                                         \
              const float *xr = xb + (ih0 + ki * a->dh) * W * C + c;                         \
              const float *wr = a->w + ki * a->kw * C + c;                                   \
              for (int64_t kj = 0; kj < a->kw; kj++, xr += tx) {                             \
                const VT wv = P##_loadu_ps(wr + kj * C);                                     \
                s0 = P##_fmadd_ps(P##_loadu_ps(xr), wv, s0);                                 \
                s1 = P##_fmadd_ps(P##_loadu_ps(xr + sx), wv, s1);                            \
                s2 = P##_fmadd_ps(P##_loadu_ps(xr + 2 * sx), wv, s2);                        \
                s3 = P##_fmadd_ps(P##_loadu_ps(xr + 3 * sx), wv, s3);                        \
              }                                                                              \
            }                                                                                \
            float *yo = y + ow * C + c;                                                      \
            P##_storeu_ps(yo, dw_ep_##SUF(a, s0, c, lo, hi));                                \
            P##_storeu_ps(yo + C, dw_ep_##SUF(a, s1, c, lo, hi));                            \
            P##_storeu_ps(yo + 2 * C, dw_ep_##SUF(a, s2, c, lo, hi));                        \
            P##_storeu_ps(yo + 3 * C, dw_ep_##SUF(a, s3, c, lo, hi));                        \
          }                                                                                  \
          for (int q = 0; q < 4 && Cv < C; q++) TAIL(a, x, oh, ow + q, Cv, y);               \
        }                                                                                    \
        if (ow >= a->OW) break;                                                              \
      }                                                                                      \
      const int64_t iw0 = ow * a->sw - a->pw;                                                \
      int64_t jl, jh;                                                                        \
      col_taps(a, ow, &jl, &jh);                                                             \
      for (int64_t c = 0; c < Cv; c += L) {                                                  \
        VT acc = P##_setzero_ps();                                                           \
        for (int64_t ki = kil; ki < kih; ki++) {                                             \
          const float *xr = x + ((ih0 + ki * a->dh) * W + iw0) * C + c;                      \
          const float *wr = a->w + ki * a->kw * C + c;                                       \
          for (int64_t kj = jl; kj < jh; kj++)                                               \
            acc = P##_fmadd_ps(P##_loadu_ps(xr + kj * tx), P##_loadu_ps(wr + kj * C), acc);  \
        }                                                                                    \
        P##_storeu_ps(y + ow * C + c, dw_ep_##SUF(a, acc, c, lo, hi));                       \
      }                                                                                      \
      if (Cv < C) TAIL(a, x, oh, ow, Cv, y);                                                 \
    }                                                                                        \
  }

GROVE__TARGET_PUSH("avx512f")
/* A vector of channels: a plain load when all 16 lanes are wanted (FULL,
 * a constant in each caller), else the masked one.  Masked loads on every
 * vector made MobileNet's 56 x 56 x 144 layer 10-20% slower. */
#define DW_LD(m, p) (full ? _mm512_loadu_ps(p) : _mm512_maskz_loadu_ps(m, p))

/* Output columns [ow, ow + T) of one vector of channels (mask m) whose
 * taps all lie inside the input row, T accumulators at once (T is 4 or 8,
 * a constant in each caller, so that the arrays live in registers).  Each
 * output is fma(x, w, acc) over (ki, kj) in order from zero, as in the
 * scalar loop. */
static inline __attribute__((always_inline)) void
dw_cols_avx512(const grove__dw_args *a, const float *x, int64_t ih0, int64_t kil, int64_t kih,
               int64_t ow, int64_t c, __mmask16 m, __m512 sc, __m512 sh, __m512 lo, __m512 hi,
               float *y, const int T, const bool full) {
  const int64_t C = a->C, W = a->W, sx = a->sw * C, tx = a->dw * C;
  const float *xb = x + (ow * a->sw - a->pw) * C + c;
  __m512 s[8];
#pragma GCC unroll 8
  for (int q = 0; q < T; q++) s[q] = _mm512_setzero_ps();
  for (int64_t ki = kil; ki < kih; ki++) {
    const float *xr = xb + (ih0 + ki * a->dh) * W * C;
    const float *wr = a->w + ki * a->kw * C + c;
    for (int64_t kj = 0; kj < a->kw; kj++, xr += tx) {
      const __m512 wv = DW_LD(m, wr + kj * C);
#pragma GCC unroll 8
      for (int q = 0; q < T; q++)
        s[q] = _mm512_fmadd_ps(DW_LD(m, xr + q * sx), wv, s[q]);
    }
  }
  float *yo = y + ow * C + c;
#pragma GCC unroll 8
  for (int q = 0; q < T; q++) {
    const __m512 v = _mm512_min_ps(hi, _mm512_max_ps(lo, _mm512_fmadd_ps(s[q], sc, sh)));
    _mm512_mask_storeu_ps(yo + q * C, m, DW_POST(_mm512, a, v));
  }
}

/* Output column ow of NV vectors of channels from c (a compile-time 1 to 4
 * in each caller), its taps kj in [jl, jh); the last vector masked by m
 * unless full.  The vectors' sums are independent chains of FMAs: one
 * vector alone waited on each FMA's latency, and a row as narrow as 7 x 7
 * with a 5x5 kernel has no interior block, so every column came here. */
static inline __attribute__((always_inline)) void dw_edge_avx512(
    const grove__dw_args *a, const float *x, int64_t ih0, int64_t kil, int64_t kih, int64_t ow,
    int64_t jl, int64_t jh, int64_t c, const int NV, __mmask16 m, __m512 lo, __m512 hi, float *y,
    const bool full) {
  const int64_t C = a->C, tx = a->dw * C;
  __m512 acc[4];
#pragma GCC unroll 4
  for (int v = 0; v < NV; v++) acc[v] = _mm512_setzero_ps();
  for (int64_t ki = kil; ki < kih; ki++) {
    const float *xr = x + ((ih0 + ki * a->dh) * a->W + ow * a->sw - a->pw) * C + c;
    const float *wr = a->w + ki * a->kw * C + c;
    for (int64_t kj = jl; kj < jh; kj++) {
#pragma GCC unroll 4
      for (int v = 0; v < NV; v++) {
        const bool whole = full || v < NV - 1;
        const float *xp = xr + kj * tx + 16 * v, *wp = wr + kj * C + 16 * v;
        acc[v] =
            _mm512_fmadd_ps(whole ? _mm512_loadu_ps(xp) : _mm512_maskz_loadu_ps(m, xp),
                            whole ? _mm512_loadu_ps(wp) : _mm512_maskz_loadu_ps(m, wp), acc[v]);
      }
    }
  }
#pragma GCC unroll 4
  for (int v = 0; v < NV; v++) {
    const __mmask16 mv = full || v < NV - 1 ? (__mmask16)0xFFFF : m;
    const int64_t cv = c + 16 * v;
    __m512 r = _mm512_fmadd_ps(acc[v], _mm512_maskz_loadu_ps(mv, a->scale + cv),
                               _mm512_maskz_loadu_ps(mv, a->shift + cv));
    r = _mm512_min_ps(hi, _mm512_max_ps(lo, r));
    _mm512_mask_storeu_ps(y + ow * C + cv, mv, DW_POST(_mm512, a, r));
  }
}

/* Channels per block of dw_row_avx512: a multiple of 16 such that the
 * input one block of eight columns reads (kh rows of 8 * sw + (kw - 1) * dw
 * + 1 pixels, CB floats each) stays within half of a 48 KB L1, so that the
 * next block of columns finds the pixels it shares with this one still
 * there.  With every channel at once, a 5x5 over 672 channels at 14 x 14
 * read 170 KB per block of columns and took its input from L2 again each
 * time; in blocks, MobileNetV3's and EfficientNet's 5x5 layers over 480 to
 * 1152 channels take 25-40% less time (a one-layer timing loop, smallest
 * of 60 runs), the 3x3 layers over 16 to 144 channels (one block) the
 * same. */
static int64_t dw_chan_block(const grove__dw_args *a) {
  const int64_t px = a->kh * (8 * a->sw + (a->kw - 1) * a->dw + 1);
  int64_t cb = (int64_t)(24 << 10) / (px * (int64_t)sizeof(float)) / 16 * 16;
  if (cb < 16) cb = 16;
  return cb >= a->C ? a->C : cb;
}

/* One output row, AVX-512: the channels in blocks (dw_chan_block), each
 * block along the whole row; within it, each vector of channels (the last
 * one of the row masked: no scalar tail) of a block of columns in turn. */
static void dw_row_part(const grove__dw_args *a, const float *x, int64_t oh, float *y,
                        int64_t done) {
  const int64_t C = a->C, ih0 = oh * a->sh - a->ph;
  const __m512 lo = _mm512_set1_ps(a->lo), hi = _mm512_set1_ps(a->hi);
  int64_t kil = 0, kih = a->kh;
  while (kil < kih && ih0 + kil * a->dh < 0) kil++;
  while (kih > kil && ih0 + (kih - 1) * a->dh >= a->H) kih--;
  int64_t o0, o1; /* the interior */
  interior_cols(a, &o0, &o1);
  const int64_t cb = dw_chan_block(a);
#define DW_MASK(c) (C - (c) >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (C - (c))) - 1))
#define DW_COLS(T)                                                                           \
  for (int64_t c = c0; c < c1; c += 16) {                                                     \
    const __mmask16 m = DW_MASK(c);                                                           \
    const __m512 sc = _mm512_maskz_loadu_ps(m, a->scale + c);                                 \
    const __m512 sh = _mm512_maskz_loadu_ps(m, a->shift + c);                                 \
    if (m == (__mmask16)0xFFFF)                                                               \
      dw_cols_avx512(a, x, ih0, kil, kih, ow, c, m, sc, sh, lo, hi, y, T, true);              \
    else                                                                                      \
      dw_cols_avx512(a, x, ih0, kil, kih, ow, c, m, sc, sh, lo, hi, y, T, false);             \
  }
  for (int64_t c0 = 0; c0 < C; c0 += cb) {
    const int64_t c1 = C - c0 < cb ? C : c0 + cb;
    for (int64_t ow = 0; ow < a->OW; ow++) {
      if (ow == o0) {
        if (done > ow) ow = done; /* dw_rows2_avx512 wrote them */
        /* Eight columns at a time at stride 1 (at stride 2 they spread over
         * 16 pixels of every row and ran slower than four). */
        for (; a->sw == 1 && ow + 8 <= o1; ow += 8) DW_COLS(8)
        for (; ow + 4 <= o1; ow += 4) DW_COLS(4)
        if (ow >= a->OW) break;
      }
      /* An edge column (or the last few of the interior): its taps clipped. */
      int64_t jl, jh;
      col_taps(a, ow, &jl, &jh);
      /* Four vectors at a time, then what is left of the block. */
      for (int64_t c = c0; c < c1;) {
        const int64_t left = (c1 - c + 15) / 16;
        const __mmask16 m = DW_MASK(c + 16 * (left < 4 ? left - 1 : 3));
        const bool full = m == (__mmask16)0xFFFF;
#define DW_EDGE(NV)                                                                \
  do {                                                                             \
    if (full)                                                                      \
      dw_edge_avx512(a, x, ih0, kil, kih, ow, jl, jh, c, NV, m, lo, hi, y, true);  \
    else                                                                           \
      dw_edge_avx512(a, x, ih0, kil, kih, ow, jl, jh, c, NV, m, lo, hi, y, false); \
  } while (0)
        if (left >= 4)
          DW_EDGE(4);
        else if (left == 3)
          DW_EDGE(3);
        else if (left == 2)
          DW_EDGE(2);
        else
          DW_EDGE(1);
#undef DW_EDGE
        c += 16 * (left < 4 ? left : 4);
      }
    }
  }
#undef DW_COLS
#undef DW_MASK
}

static void dw_row_avx512(const grove__dw_args *a, const float *x, int64_t oh, float *y) {
  dw_row_part(a, x, oh, y, 0);
}

/* Output rows oh and oh + 1, columns [ow, ow + 8), one vector of channels
 * (mask m), for stride and dilation 1 and a kernel KW wide (3 or 5, a
 * constant in each caller): the kh + 1 input rows they read are walked
 * once, each row's 7 + KW pixel vectors loaded once and added into both
 * output rows where they are taps.  A row at a time loaded every input
 * vector once per tap (81 loads for 72 FMAs a block of a 3x3), which bound
 * the kernel by the loads.  Each output still sums its taps in (ki, kj)
 * order from zero, input rows outside the image skipped: the same bits as
 * dw_cols_avx512. */
static inline __attribute__((always_inline)) void dw_cols2_avx512(
    const grove__dw_args *a, const float *x, int64_t oh, int64_t ow, int64_t c, __mmask16 m,
    __m512 sc, __m512 sh, __m512 lo, __m512 hi, float *y0, float *y1, const int KW,
    const bool full) {
  const int64_t C = a->C, W = a->W, kh = a->kh, ih0 = oh - a->ph;
  __m512 s0[8], s1[8];
#pragma GCC unroll 8
  for (int q = 0; q < 8; q++) s0[q] = s1[q] = _mm512_setzero_ps();
  for (int64_t r = 0; r <= kh; r++) {
    const int64_t ih = ih0 + r;
    if (ih < 0 || ih >= a->H) continue;
    const float *xr = x + (ih * W + ow - a->pw) * C + c;
    __m512 px[12];
#pragma GCC unroll 12
    for (int j = 0; j < 7 + KW; j++) px[j] = DW_LD(m, xr + j * C);
    if (r < kh) { /* tap row r of output row oh */
      const float *wr = a->w + r * KW * C + c;
#pragma GCC unroll 5
      for (int kj = 0; kj < KW; kj++) {
        const __m512 wv = DW_LD(m, wr + kj * C);
#pragma GCC unroll 8
        for (int q = 0; q < 8; q++) s0[q] = _mm512_fmadd_ps(px[q + kj], wv, s0[q]);
      }
    }
    if (r >= 1) { /* tap row r - 1 of output row oh + 1 */
      const float *wr = a->w + (r - 1) * KW * C + c;
#pragma GCC unroll 5
      for (int kj = 0; kj < KW; kj++) {
        const __m512 wv = DW_LD(m, wr + kj * C);
#pragma GCC unroll 8
        for (int q = 0; q < 8; q++) s1[q] = _mm512_fmadd_ps(px[q + kj], wv, s1[q]);
      }
    }
  }
#pragma GCC unroll 8
  for (int q = 0; q < 8; q++) {
    const __m512 v0 = _mm512_min_ps(hi, _mm512_max_ps(lo, _mm512_fmadd_ps(s0[q], sc, sh)));
    const __m512 v1 = _mm512_min_ps(hi, _mm512_max_ps(lo, _mm512_fmadd_ps(s1[q], sc, sh)));
    _mm512_mask_storeu_ps(y0 + (ow + q) * C + c, m, DW_POST(_mm512, a, v0));
    _mm512_mask_storeu_ps(y1 + (ow + q) * C + c, m, DW_POST(_mm512, a, v1));
  }
}

/* Output rows oh and oh + 1 into y0 and y1 (stride and dilation 1, a 3 or
 * 5 wide kernel): the interior's blocks of eight columns two rows at once
 * (dw_cols2_avx512), the rest of each row as dw_row_avx512 does it. */
static void dw_rows2_avx512(const grove__dw_args *a, const float *x, int64_t oh, float *y0,
                            float *y1) {
  const int64_t C = a->C;
  const __m512 lo = _mm512_set1_ps(a->lo), hi = _mm512_set1_ps(a->hi);
  int64_t o0, o1; /* the interior */
  interior_cols(a, &o0, &o1);
  const int64_t nb = (o1 - o0) / 8, cb = dw_chan_block(a);
  for (int64_t c0 = 0; c0 < C; c0 += cb) {
    const int64_t c1 = C - c0 < cb ? C : c0 + cb;
    for (int64_t b = 0; b < nb; b++)
      for (int64_t c = c0; c < c1; c += 16) {
        const __mmask16 m = C - c >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (C - c)) - 1);
        const __m512 sc = _mm512_maskz_loadu_ps(m, a->scale + c);
        const __m512 sh = _mm512_maskz_loadu_ps(m, a->shift + c);
        const int64_t ow = o0 + 8 * b;
#define DW_COLS2(KW)                                                          \
  do {                                                                        \
    if (m == (__mmask16)0xFFFF)                                               \
      dw_cols2_avx512(a, x, oh, ow, c, m, sc, sh, lo, hi, y0, y1, KW, true);  \
    else                                                                      \
      dw_cols2_avx512(a, x, oh, ow, c, m, sc, sh, lo, hi, y0, y1, KW, false); \
  } while (0)
        if (a->kw == 3)
          DW_COLS2(3);
        else
          DW_COLS2(5);
#undef DW_COLS2
      }
  }
  dw_row_part(a, x, oh, y0, o0 + 8 * nb);
  dw_row_part(a, x, oh + 1, y1, o0 + 8 * nb);
}
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

bool grove__depthwise_pairs(const grove__dw_args *a) {
#if GROVE__X86_SIMD
  return grove__cpu_avx512() && a->sh == 1 && a->sw == 1 && a->dh == 1 && a->dw == 1 &&
         (a->kw == 3 || a->kw == 5) && a->OH >= 2;
#else
  (void)a;
  return false;
#endif
}

void grove__depthwise_rows2(const grove__dw_args *a, const float *x, int64_t oh, float *y0,
                            float *y1) {
#if GROVE__X86_SIMD
  if (grove__depthwise_pairs(a)) {
    dw_rows2_avx512(a, x, oh, y0, y1);
    return;
  }
#endif
  grove__depthwise_row(a, x, oh, y0);
  grove__depthwise_row(a, x, oh + 1, y1);
}
