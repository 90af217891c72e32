/* im2col.c: a convolution's patches as the rows of a matrix (im2col), and
 * the adjoint that adds such rows back into planes (col2im), which serving's
 * columns path (core/nn/layers_conv.c) and training's forward and backward
 * (core/train/backward_conv.c) share, so that both read an input the same
 * way.  Plain loops over NCHW planes; the callers spread channels or images
 * over the compute threads. */
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
