/* winograd.c: the input and output transforms of Winograd F(2x2, 3x3)
 * that layers_conv.c's conv_winograd runs between its 16 packed products.
 * Split out of layers_conv.c: a kernel, no layer.  Pure functions of their
 * arguments: any thread. */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>

#include "kernels.h"

#if GROVE__X86_SIMD
#include <immintrin.h>
#endif

/* ------------------------------------------------------------ Winograd */

/* Winograd F(2x2, 3x3) (Lavin and Gray, 2015): a 2x2 block of outputs of a
 * 3x3 convolution is A^T [(G g G^T) . (B^T d B)] A over the 4x4 input tile d,
 * so one tile costs 16 products per (in, out) channel pair instead of 36:
 * the 16 element positions become 16 matrix products [tiles, cin] x [cin,
 * cout] through the packed GEMM kernel, 2.25 times fewer multiply-adds than
 * the patch rows.  The transforms are additions along channels (NHWC), 16
 * channels per AVX-512 register where the CPU has it. */

/* V[k][c] (k = 4r + q, rows vs floats apart) = (B^T d B)[r][q] for channels
 * [c0, c1) of the tile whose 16 input pixels (NHWC) d[i] points at (zeros
 * where the tile overhangs the padding). */
static void wino_in_scalar(const float *const d[16], int64_t c0, int64_t c1, float *V, int64_t vs) {
  for (int64_t c = c0; c < c1; c++) {
    float t[4][4];
    for (int j = 0; j < 4; j++) {
      const float d0 = d[j][c], d1 = d[4 + j][c], d2 = d[8 + j][c], d3 = d[12 + j][c];
      t[0][j] = d0 - d2;
      t[1][j] = d1 + d2;
      t[2][j] = d2 - d1;
      t[3][j] = d1 - d3;
    }
    for (int r = 0; r < 4; r++) {
      V[(4 * r + 0) * vs + c] = t[r][0] - t[r][2];
      V[(4 * r + 1) * vs + c] = t[r][1] + t[r][2];
      V[(4 * r + 2) * vs + c] = t[r][2] - t[r][1];
      V[(4 * r + 3) * vs + c] = t[r][1] - t[r][3];
    }
  }
}

/* y[2a + b][c] = (A^T m A)[a][b] for the 16 products m[k] (rows ms floats
 * apart), A^T = [1 1 1 0; 0 1 -1 -1]; y[i] NULL for an output past the
 * edge. */
static inline float ep_apply(const grove__wino_ep *ep, int64_t c, float v) {
  if (!ep) return v;
  v = fmaf(v, ep->scale[c], ep->shift[c]);
  return ep->relu && v < 0.0f ? 0.0f : v;
}

static void wino_out_scalar(const float *M, int64_t ms, int64_t c0, int64_t c1, float *const y[4],
                            const grove__wino_ep *ep) {
  for (int64_t c = c0; c < c1; c++) {
    float s[2][4];
    for (int q = 0; q < 4; q++) {
      const float m0 = M[q * ms + c], m1 = M[(4 + q) * ms + c], m2 = M[(8 + q) * ms + c],
                  m3 = M[(12 + q) * ms + c];
      s[0][q] = m0 + m1 + m2;
      s[1][q] = m1 - m2 - m3;
    }
    for (int a = 0; a < 2; a++) {
      if (y[2 * a]) y[2 * a][c] = ep_apply(ep, c, s[a][0] + s[a][1] + s[a][2]);
      if (y[2 * a + 1]) y[2 * a + 1][c] = ep_apply(ep, c, s[a][1] - s[a][2] - s[a][3]);
    }
  }
}

#if GROVE__X86_SIMD
/* The transforms on W lanes of vector type VT, written once for both
 * widths (AVX-512: 16, AVX2: 8; P is the intrinsics' prefix) and compiled
 * in each one's target region below.  The same operations in the same
 * order as the scalar loops (the epilogue's fused multiply-add is fmaf's),
 * so every kernel gives the same bits.  The 4 x 4 loops are unrolled by
 * pragma: at -O2 GCC does not unroll them, and a t[][] indexed by a loop
 * variable lives on the stack (its stores and reloads were most of the
 * AVX-512 function's time). */
#define WINO_TRANSFORMS(SUF, VT, W, P)                                                       \
  static void wino_in_##SUF(const float *const d[16], int64_t C, float *V, int64_t vs) {     \
    int64_t c = 0;                                                                           \
    for (; c + W <= C; c += W) {                                                             \
      VT t[4][4];                                                                            \
      _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) {                                  \
        const VT d0 = P##_loadu_ps(d[j] + c), d1 = P##_loadu_ps(d[4 + j] + c);               \
        const VT d2 = P##_loadu_ps(d[8 + j] + c), d3 = P##_loadu_ps(d[12 + j] + c);          \
        t[0][j] = P##_sub_ps(d0, d2);                                                        \
        t[1][j] = P##_add_ps(d1, d2);                                                        \
        t[2][j] = P##_sub_ps(d2, d1);                                                        \
        t[3][j] = P##_sub_ps(d1, d3);                                                        \
      }                                                                                      \
      _Pragma("GCC unroll 4") for (int r = 0; r < 4; r++) {                                  \
        P##_storeu_ps(V + (4 * r + 0) * vs + c, P##_sub_ps(t[r][0], t[r][2]));               \
        P##_storeu_ps(V + (4 * r + 1) * vs + c, P##_add_ps(t[r][1], t[r][2]));               \
        P##_storeu_ps(V + (4 * r + 2) * vs + c, P##_sub_ps(t[r][2], t[r][1]));               \
        P##_storeu_ps(V + (4 * r + 3) * vs + c, P##_sub_ps(t[r][1], t[r][3]));               \
      }                                                                                      \
    }                                                                                        \
    if (c < C) wino_in_scalar(d, c, C, V, vs);                                               \
  }                                                                                          \
                                                                                             \
  static inline VT ep_apply_##SUF(const grove__wino_ep *ep, int64_t c, VT v) {               \
    if (!ep) return v;                                                                       \
    v = P##_fmadd_ps(v, P##_loadu_ps(ep->scale + c), P##_loadu_ps(ep->shift + c));           \
    return ep->relu ? P##_max_ps(v, P##_setzero_ps()) : v;                                   \
  }                                                                                          \
                                                                                             \
  static void wino_out_##SUF(const float *M, int64_t ms, int64_t Co, float *const y[4],      \
                             const grove__wino_ep *ep) {                                     \
    int64_t c = 0;                                                                           \
    for (; c + W <= Co; c += W) {                                                            \
      VT s[2][4];                                                                            \
      _Pragma("GCC unroll 4") for (int q = 0; q < 4; q++) {                                  \
        const VT m0 = P##_loadu_ps(M + q * ms + c), m1 = P##_loadu_ps(M + (4 + q) * ms + c); \
        const VT m2 = P##_loadu_ps(M + (8 + q) * ms + c);                                    \
        const VT m3 = P##_loadu_ps(M + (12 + q) * ms + c);                                   \
        s[0][q] = P##_add_ps(P##_add_ps(m0, m1), m2);                                        \
        s[1][q] = P##_sub_ps(P##_sub_ps(m1, m2), m3);                                        \
      }                                                                                      \
      _Pragma("GCC unroll 2") for (int a = 0; a < 2; a++) {                                  \
        const VT lo = P##_add_ps(P##_add_ps(s[a][0], s[a][1]), s[a][2]);                     \
        const VT hi = P##_sub_ps(P##_sub_ps(s[a][1], s[a][2]), s[a][3]);                     \
        if (y[2 * a]) P##_storeu_ps(y[2 * a] + c, ep_apply_##SUF(ep, c, lo));                \
        if (y[2 * a + 1]) P##_storeu_ps(y[2 * a + 1] + c, ep_apply_##SUF(ep, c, hi));        \
      }                                                                                      \
    }                                                                                        \
    if (c < Co) wino_out_scalar(M, ms, c, Co, y, ep);                                        \
  }

GROVE__TARGET_PUSH("avx512f")
WINO_TRANSFORMS(avx512, __m512, 16, _mm512)
GROVE__TARGET_POP

/* For CPUs with AVX2 but not AVX-512, where the scalar loops were 60% of a
 * CNN's forward. */
GROVE__TARGET_PUSH("avx2,fma")
WINO_TRANSFORMS(avx2, __m256, 8, _mm256)
GROVE__TARGET_POP

#endif /* GROVE__X86_SIMD */

void grove__wino_in(const float *const d[16], int64_t C, float *V, int64_t vs) {
#if GROVE__X86_SIMD
  if (grove__cpu_avx512()) {
    wino_in_avx512(d, C, V, vs);
    return;
  }
  if (grove__cpu_avx2()) {
    wino_in_avx2(d, C, V, vs);
    return;
  }
#endif
  wino_in_scalar(d, 0, C, V, vs);
}

void grove__wino_out(const float *M, int64_t ms, int64_t Co, float *const y[4],
                     const grove__wino_ep *ep) {
#if GROVE__X86_SIMD
  if (grove__cpu_avx512()) {
    wino_out_avx512(M, ms, Co, y, ep);
    return;
  }
  if (grove__cpu_avx2()) {
    wino_out_avx2(M, ms, Co, y, ep);
    return;
  }
#endif
  wino_out_scalar(M, ms, 0, Co, y, ep);
}
