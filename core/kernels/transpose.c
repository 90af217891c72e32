/* transpose.c: the float32 transposes between NCHW and NHWC that the
 * convolution's rows path and the channels-last layout need (layers_conv.c,
 * grove__fwd_contig) and attention's keys (layers_attention.c), and the NHWC
 * epilogue (scale, shift, ReLU per channel on the way back to NCHW).  Split out of layers_conv.c: a kernel, no layer.
 * Pure functions of their arguments: any thread. */
#include <stdbool.h>
#include <stdint.h>

#include "kernels.h"

/* ------------------------------------------------------------ transposes */

/* The rows path moves an NCHW activation into NHWC and back (when the
 * layers around it do not take channels last), so these transposes matter:
 * 16 x 16 blocks go through AVX-512 registers (16 loads, 64 shuffles, 16
 * stores) where the CPU has it; edges and other CPUs take the scalar
 * loops. */
#if GROVE__X86_SIMD
#include <immintrin.h>
#endif

#if GROVE__X86_SIMD
GROVE__TARGET_PUSH("avx512f")

/* out[j] = column j of the 16 x 16 block at src (rows lds floats apart). */
static inline __attribute__((always_inline)) void tr16(const float *src, int64_t lds,
                                                       __m512 out[16]) {
  __m512 r[16], t[16];
  for (int i = 0; i < 16; i++) r[i] = _mm512_loadu_ps(src + i * lds);
  for (int i = 0; i < 8; i++) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  /* u[4g + k]: columns k, k+4, k+8, k+12 of rows 4g..4g+3, one per lane. */
  __m512 *u = r;
  for (int g = 0; g < 4; g++) {
    __m512d a = _mm512_castps_pd(t[4 * g]), b = _mm512_castps_pd(t[4 * g + 1]);
    __m512d c = _mm512_castps_pd(t[4 * g + 2]), d = _mm512_castps_pd(t[4 * g + 3]);
    u[4 * g + 0] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
    u[4 * g + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
    u[4 * g + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
    u[4 * g + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
  }
  for (int k = 0; k < 4; k++) {
    __m512 a = _mm512_shuffle_f32x4(u[k], u[4 + k], 0x88);
    __m512 b = _mm512_shuffle_f32x4(u[8 + k], u[12 + k], 0x88);
    __m512 c = _mm512_shuffle_f32x4(u[k], u[4 + k], 0xdd);
    __m512 d = _mm512_shuffle_f32x4(u[8 + k], u[12 + k], 0xdd);
    out[k] = _mm512_shuffle_f32x4(a, b, 0x88);
    out[k + 8] = _mm512_shuffle_f32x4(a, b, 0xdd);
    out[k + 4] = _mm512_shuffle_f32x4(c, d, 0x88);
    out[k + 12] = _mm512_shuffle_f32x4(c, d, 0xdd);
  }
}

static void tr16_store(const float *src, int64_t lds, float *dst, int64_t ldd) {
  __m512 o[16];
  tr16(src, lds, o);
  for (int j = 0; j < 16; j++) _mm512_storeu_ps(dst + j * ldd, o[j]);
}

/* dst row j (16 floats) = act(column j of src * scale[j] + shift[j]). */
static void tr16_epilogue(const float *src, int64_t lds, float *dst, int64_t ldd,
                          const float *scale, const float *shift, bool relu) {
  __m512 o[16];
  tr16(src, lds, o);
  const __m512 zero = _mm512_setzero_ps();
  for (int j = 0; j < 16; j++) {
    __m512 v = _mm512_fmadd_ps(o[j], _mm512_set1_ps(scale[j]), _mm512_set1_ps(shift[j]));
    if (relu) v = _mm512_max_ps(v, zero);
    _mm512_storeu_ps(dst + j * ldd, v);
  }
}

/* dst[i * 3 + c] = src[c * lds + i] for i in [0, n): three planes (an RGB
 * image) interleaved 16 positions at a time, two permutes per output vector
 * (the first takes channels 0 and 1, the second puts channel 2 in).  The
 * 16 x 16 blocks never apply to 3 rows, and the element loop took 18% of a
 * MobileNet stem convolution. */
static void tr3_avx512(const float *restrict src, int64_t lds, float *restrict dst, int64_t n) {
  int32_t i01[3][16], i2[3][16];
  for (int v = 0; v < 3; v++)
    for (int e = 0; e < 16; e++) {
      const int j = 16 * v + e, pos = j / 3, ch = j % 3;
      /* pos is within the block's 16 lanes; bit 4 picks the second source. */
      i01[v][e] = ch == 1 ? 16 + pos : pos;
      i2[v][e] = ch == 2 ? 16 + pos : e;
    }
  __m512i a01[3], a2[3];
  for (int v = 0; v < 3; v++) {
    a01[v] = _mm512_loadu_si512(i01[v]);
    a2[v] = _mm512_loadu_si512(i2[v]);
  }
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 x0 = _mm512_loadu_ps(src + i), x1 = _mm512_loadu_ps(src + lds + i);
    const __m512 x2 = _mm512_loadu_ps(src + 2 * lds + i);
    for (int v = 0; v < 3; v++) {
      const __m512 t = _mm512_permutex2var_ps(x0, a01[v], x1);
      _mm512_storeu_ps(dst + 3 * i + 16 * v, _mm512_permutex2var_ps(t, a2[v], x2));
    }
  }
  for (; i < n; i++)
    for (int c = 0; c < 3; c++) dst[3 * i + c] = src[c * lds + i];
}
GROVE__TARGET_POP
#endif /* GROVE__X86_SIMD */

/* dst[j * ldd + r] = src[r * lds + j] for the R rows of src and its columns
 * [j0, j1): 16 x 16 blocks through registers, the ragged edges one by one.
 * The one transpose of this file, which the three entries below cut. */
static void tr_cols(const float *restrict src, int64_t lds, float *restrict dst, int64_t ldd,
                    int64_t R, int64_t j0, int64_t j1) {
  enum { T = 16 };
  const bool fast = grove__cpu_avx512();
#if GROVE__X86_SIMD
  if (fast && R == 3 && ldd == 3) {
    tr3_avx512(src + j0, lds, dst + j0 * 3, j1 - j0);
    return;
  }
#endif
  for (int64_t i0 = j0; i0 < j1; i0 += T) {
    const int64_t ni = j1 - i0 < T ? j1 - i0 : T;
    for (int64_t c0 = 0; c0 < R; c0 += T) {
      const int64_t nc = R - c0 < T ? R - c0 : T;
#if GROVE__X86_SIMD
      if (fast && ni == T && nc == T) {
        tr16_store(src + c0 * lds + i0, lds, dst + i0 * ldd + c0, ldd);
        continue;
      }
#endif
      for (int64_t i = 0; i < ni; i++)
        for (int64_t c = 0; c < nc; c++)
          dst[(i0 + i) * ldd + c0 + c] = src[(c0 + c) * lds + i0 + i];
    }
  }
  (void)fast;
}

/* dst[i][c] = src[c][i] for a [C, HW] plane block, positions [b0 * 16,
 * b1 * 16) (clipped to HW). */
void grove__nchw_to_nhwc(const float *restrict src, float *restrict dst, int64_t C, int64_t HW,
                         int64_t b0, int64_t b1) {
  tr_cols(src, HW, dst, C, C, b0 * 16, b1 * 16 < HW ? b1 * 16 : HW);
}

void grove__transpose_f32(const float *src, float *dst, int64_t R, int64_t C) {
  tr_cols(src, C, dst, R, R, 0, C);
}

void grove__transpose_f32_ld(const float *src, int64_t lds, float *dst, int64_t ldd, int64_t R,
                             int64_t C) {
  tr_cols(src, lds, dst, ldd, R, 0, C);
}

/* y[c][p] = act(acc[p][c] * scale[c] + shift[c]) for positions [b0 * 16,
 * b1 * 16) of P and n channels (acc rows lda floats apart, y rows P floats apart). */
void grove__nhwc_epilogue(const float *acc, int64_t lda, float *y, int64_t P, int64_t n,
                          const float *scale, const float *shift, bool relu, int64_t b0,
                          int64_t b1) {
  enum { T = 16 };
  const bool fast = grove__cpu_avx512();
  const int64_t end = b1 * T < P ? b1 * T : P;
  for (int64_t p0 = b0 * T; p0 < end; p0 += T) {
    const int64_t pn = P - p0 < T ? P - p0 : T;
    for (int64_t c0 = 0; c0 < n; c0 += T) {
      const int64_t cn = n - c0 < T ? n - c0 : T;
#if GROVE__X86_SIMD
      if (fast && pn == T && cn == T) {
        tr16_epilogue(acc + p0 * lda + c0, lda, y + c0 * P + p0, P, scale + c0, shift + c0, relu);
        continue;
      }
#endif
      for (int64_t c = c0; c < c0 + cn; c++) {
        const float a = scale[c], b = shift[c];
        float *yr = y + c * P + p0;
        const float *ar = acc + p0 * lda + c;
        for (int64_t q = 0; q < pn; q++) {
          float v = ar[q * lda] * a + b;
          yr[q] = relu && v < 0.0f ? 0.0f : v;
        }
      }
    }
  }
  (void)fast;
}
