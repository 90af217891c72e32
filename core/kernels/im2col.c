/* im2col.c: a convolution's patches as the rows of a matrix (im2col), and
 * the adjoint that adds such rows back into planes (col2im), which serving's
 * columns path (core/nn/layers_conv.c) and training's forward and backward
 * (core/train/backward_conv.c) share, so that both read an input the same
 * way.  Plain loops over NCHW planes; the callers spread channels or images
 * over the compute threads.  Also the rows path's patch rows for a stem's
 * short kernel rows over an NHWC input (grove__patch_rows_short, below). */
#include <string.h>

#include "kernels.h"

/* The output columns ow whose input column iw = ow * sw - pw + j * dw lies
 * inside the row, [*lo, *hi): the patch rows copy those and are zero
 * elsewhere, so the loops below test no bounds per element (a test per
 * element made im2col and col2im a third of a CNN's training step). */
static void ow_range(const grove__conv_geom *g, int64_t j, int64_t *lo, int64_t *hi) {
  const int64_t a = g->pw - j * g->dw;            /* ow * sw >= a */
  const int64_t b = g->W - 1 + g->pw - j * g->dw; /* ow * sw <= b */
  *lo = a > 0 ? (a + g->sw - 1) / g->sw : 0;
  *hi = b < 0 ? 0 : b / g->sw + 1;
  if (*hi > g->Wo) *hi = g->Wo;
  if (*lo > *hi) *lo = *hi;
}

/* GCC turns the short zero loops below back into memset calls unless told
 * not to. */
#if defined(__GNUC__) && !defined(__clang__)
#define NO_LIBC_LOOPS __attribute__((optimize("no-tree-loop-distribute-patterns")))
#else
#define NO_LIBC_LOOPS
#endif

NO_LIBC_LOOPS void grove__im2col(const grove__conv_geom *g, const float *x, int64_t c0, int64_t c1,
                                 float *col, int64_t ldc) {
  for (int64_t c = c0; c < c1; c++)
    for (int64_t i = 0; i < g->kh; i++)
      for (int64_t j = 0; j < g->kw; j++) {
        float *row = col + ((c * g->kh + i) * g->kw + j) * ldc;
        const float *xc = x + c * g->H * g->W;
        int64_t lo, hi;
        ow_range(g, j, &lo, &hi);
        const int64_t off = j * g->dw - g->pw, sw = g->sw;
        for (int64_t oh = 0; oh < g->Ho; oh++) {
          const int64_t ih = oh * g->sh - g->ph + i * g->dh;
          float *r = row + oh * g->Wo;
          if (ih < 0 || ih >= g->H) {
            memset(r, 0, (size_t)g->Wo * sizeof(float));
            continue;
          }
          /* Loops, not memset / memcpy: a row's pieces are a few floats (a
           * 3 x 3 kernel's padding is one), and the calls cost more than the
           * copying.  Indices, not a pointer moved by off, which may point
           * before the row. */
          const float *xr = xc + ih * g->W;
          for (int64_t ow = 0; ow < lo; ow++) r[ow] = 0.0f;
          if (sw == 1)
            for (int64_t ow = lo; ow < hi; ow++) r[ow] = xr[ow + off];
          else
            for (int64_t ow = lo; ow < hi; ow++) r[ow] = xr[ow * sw + off];
          for (int64_t ow = hi; ow < g->Wo; ow++) r[ow] = 0.0f;
        }
      }
}

void grove__col2im(const grove__conv_geom *g, const float *col, int64_t ldc, float *dx, int64_t c0,
                   int64_t c1) {
  for (int64_t c = c0; c < c1; c++)
    for (int64_t i = 0; i < g->kh; i++)
      for (int64_t j = 0; j < g->kw; j++) {
        const float *row = col + ((c * g->kh + i) * g->kw + j) * ldc;
        float *dc = dx + c * g->H * g->W;
        int64_t lo, hi;
        ow_range(g, j, &lo, &hi);
        const int64_t off = j * g->dw - g->pw, sw = g->sw;
        for (int64_t oh = 0; oh < g->Ho; oh++) {
          const int64_t ih = oh * g->sh - g->ph + i * g->dh;
          if (ih < 0 || ih >= g->H) continue;
          const float *r = row + oh * g->Wo;
          float *dr = dc + ih * g->W;
          if (sw == 1)
            for (int64_t ow = lo; ow < hi; ow++) dr[ow + off] += r[ow];
          else
            for (int64_t ow = lo; ow < hi; ow++) dr[ow * sw + off] += r[ow];
        }
      }
}

/* ------------------------------------------------------------ short rows
 *
 * The serving rows path's patch rows (layers_conv.c par_rows) for a
 * kernel row of at most 16 floats of an NHWC input (kw * C <= 16, one
 * group, no dilation along W): a stem's 3x3 over RGB is three runs of 9
 * floats per row, and a call of memcpy per run (37,632 for a 224 x 224
 * image) with the loop around it was 40-45% of the stem's time.  With
 * AVX-512 each run is one masked load and one masked store, the lanes of
 * pixels in the padding zero.  The rows are exactly those par_rows writes;
 * without AVX-512 par_rows writes them itself. */

#if GROVE__X86_SIMD
#include <immintrin.h>

GROVE__TARGET_PUSH("avx512f")
static void short_rows_avx512(const grove__conv_geom *g, int64_t C, const float *x, int64_t b,
                              int64_t e, float *dst) {
  const int64_t n = g->kw * C, K = g->kh * n, OW = g->Wo, OH = g->Ho;
  const __mmask16 all = (__mmask16)((1u << n) - 1u);
  int64_t i = b / (OH * OW), oh = b / OW % OH, ow = b % OW - 1;
  for (int64_t row = b; row < e; row++, dst += K) {
    if (++ow == OW) {
      ow = 0;
      if (++oh == OH) {
        oh = 0;
        i++;
      }
    }
    const float *xi = x + i * g->H * g->W * C;
    const int64_t iw0 = ow * g->sw - g->pw;
    /* The pixels kj in [lo, hi) lie inside the row: lanes [lo C, hi C). */
    const int64_t lo = iw0 < 0 ? -iw0 : 0;
    const int64_t hi = iw0 + g->kw > g->W ? g->W - iw0 : g->kw;
    const __mmask16 m =
        hi <= lo ? 0 : (__mmask16)(all & ~((1u << (lo * C)) - 1u) & ((1u << (hi * C)) - 1u));
    for (int64_t ki = 0; ki < g->kh; ki++) {
      const int64_t ih = oh * g->sh - g->ph + ki * g->dh;
      __m512 v = _mm512_setzero_ps();
      /* Lanes off the mask are neither read nor faulted on; the address
       * of lane 0 is formed from integers, never dereferenced itself. */
      if (ih >= 0 && ih < g->H && m)
        v = _mm512_maskz_loadu_ps(
            m, (const void *)((uintptr_t)(xi + ih * g->W * C) + (uintptr_t)(iw0 * C * 4)));
      _mm512_mask_storeu_ps(dst + ki * n, all, v);
    }
  }
}
GROVE__TARGET_POP
#endif

bool grove__patch_rows_short(const grove__conv_geom *g, int64_t C, const float *x, int64_t b,
                             int64_t e, float *dst) {
#if GROVE__X86_SIMD
  if (grove__cpu_avx512()) {
    short_rows_avx512(g, C, x, b, e, dst);
    return true;
  }
#else
  (void)g, (void)C, (void)x, (void)b, (void)e, (void)dst;
#endif
  return false;
}
