/* gemm_avx2.c: the AVX2 register tiles of the GEMM (gemm_internal.h says how
 * the GEMM's files share the work), for x86-64 CPUs with avx2 and fma but not
 * avx512f (AMD Zen 2 and 3, Intel client parts), or GROVE_GEMM=avx2.
 *
 * The panels are those of the AVX-512 kernel, packed strip by strip (each
 * 16-column strip's k steps contiguous) and computed in strips: an MR x 16
 * tile (6 rows x 2 ymm = 12 of the 16 ymm registers) per strip, or wider
 * strips for fewer rows, with the same epilogue (bias, ReLU or ReLU6).  Without it
 * such a CPU fell back to OpenBLAS, which on the reference MLP is 1.05 to
 * 1.4 times slower at batch 1, 64 and 256, and 4 to 7 times at batches of 2
 * to 6 (docs/performance.md, "AVX2").  Compiled for avx2 only inside
 * GROVE__TARGET_PUSH, reached through the table gemm.c reads. */
#include <stdbool.h>
#include <stdint.h>

#include "gemm_internal.h"
#include "simd_act.h"

#if GROVE__X86_SIMD
#include <immintrin.h>

#define MR GROVE__GEMM_MR

GROVE__TARGET_PUSH("avx2,fma")

/* One strip: y[0..mr, 0..ncols) = act(A[0..mr, 0..K) . B + bias) with B
 * the first of the strip's NY / 2 16-column strips of an AVX2 panel (see
 * struct grove__linear_pack), the next one ss floats further, each k step of one
 * 16 floats on (32-byte aligned: panels start 64-byte aligned and strips
 * are multiples of 64 bytes long).  ncols is 1..NY * 8; mr and NY are compile-time
 * constants at every call, so acc lives in registers.  Short tiles take
 * wide strips: an FMA's result is ready 4 cycles later and two FMAs issue
 * per cycle, so a k step needs 8 independent accumulators to keep the units
 * busy; one row over 16 columns had 2 (batch 1 ran at a quarter of the
 * FMA rate, slower than OpenBLAS's GEMV). */
static inline __attribute__((always_inline)) void strip(const int mr, const int NY, int64_t K,
                                                        const float *A, int64_t lda, const float *B,
                                                        int64_t ss, const float *bias, float *y,
                                                        int64_t ldy, int ncols, int flags) {
  __m256 acc[MR][8];
  __m256i m[8];
  const bool full = ncols == NY * 8;
  const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
#pragma GCC unroll 8
  for (int j = 0; j < NY; j++) m[j] = _mm256_cmpgt_epi32(_mm256_set1_epi32(ncols - 8 * j), idx);
#pragma GCC unroll 6
  for (int i = 0; i < mr; i++)
#pragma GCC unroll 8
    for (int j = 0; j < NY; j++) {
      const float *yp = y + i * ldy + 8 * j;
      acc[i][j] = !(flags & GROVE__TILE_ACCUMULATE) ? _mm256_setzero_ps()
                  : full                            ? _mm256_loadu_ps(yp)
                                                    : _mm256_maskload_ps(yp, m[j]);
    }
  for (int64_t k = 0; k < K; k++) {
#pragma GCC unroll 6
    for (int i = 0; i < mr; i++) {
      const __m256 a = _mm256_broadcast_ss(A + i * lda + k);
#pragma GCC unroll 8
      for (int j = 0; j < NY; j++)
        acc[i][j] =
            _mm256_fmadd_ps(a, _mm256_load_ps(B + (j / 2) * ss + k * 16 + (j % 2) * 8), acc[i][j]);
    }
  }
  const __m256 zero = _mm256_setzero_ps(), six = _mm256_set1_ps(6.0f);
#pragma GCC unroll 8
  for (int j = 0; j < NY; j++) {
    const __m256 bv = !bias  ? zero
                      : full ? _mm256_loadu_ps(bias + 8 * j)
                             : _mm256_maskload_ps(bias + 8 * j, m[j]);
#pragma GCC unroll 6
    for (int i = 0; i < mr; i++) {
      __m256 v = _mm256_add_ps(acc[i][j], bv);
      if (flags & GROVE__TILE_RELU) v = _mm256_max_ps(v, zero);
      /* v second: a NaN passes, as in grove__act_apply (gemm_avx512.c). */
      if (flags & GROVE__TILE_RELU6) v = _mm256_min_ps(six, _mm256_max_ps(zero, v));
      if (flags & GROVE__TILE_HARDSWISH) v = GROVE__HARDSWISH(_mm256, v);
      if (flags & GROVE__TILE_HARDSIGMOID) v = GROVE__HARDSIGMOID(_mm256, v);
      if (full)
        _mm256_storeu_ps(y + i * ldy + 8 * j, v);
      else
        _mm256_maskstore_ps(y + i * ldy + 8 * j, m[j], v);
    }
  }
}

/* The AVX-512 tile's contract (tile_fn) over an AVX2 panel NV * 16 wide
 * whose 16-column strips are ss floats apart (the pack's K * 16): strips of
 * 64, 32 or 16 columns (one, two or three to six rows), one after another,
 * the rows of A staying in L1 between them. */
static inline __attribute__((always_inline)) void tile2(const int mr, const int NV, int64_t K,
                                                        const float *A, int64_t lda, const float *B,
                                                        int64_t ss, const float *bias, float *y,
                                                        int64_t ldy, int ncols, int flags) {
  const int sw = mr == 1 ? 64 : mr == 2 ? 32 : 16; /* strip width, a multiple of 16 */
  for (int c = 0; c < NV * 16 && c < ncols; c += sw) {
    const int left = NV * 16 - c, width = left < sw ? left : sw; /* 16, 32, 48 or 64 */
    const int nc = ncols - c < width ? ncols - c : width;
    const float *bc = bias ? bias + c : NULL, *bs = B + (c / 16) * ss;
    if (width == 64)
      strip(mr, 8, K, A, lda, bs, ss, bc, y + c, ldy, nc, flags);
    else if (width == 48)
      strip(mr, 6, K, A, lda, bs, ss, bc, y + c, ldy, nc, flags);
    else if (width == 32)
      strip(mr, 4, K, A, lda, bs, ss, bc, y + c, ldy, nc, flags);
    else
      strip(mr, 2, K, A, lda, bs, ss, bc, y + c, ldy, nc, flags);
  }
}

#define TILE2_FN(R, V)                                                                            \
  static void tile2_##R##_##V(int64_t K, const float *A, int64_t lda, const float *B, int64_t ss, \
                              const float *bias, float *y, int64_t ldy, int ncols, int flags) {   \
    tile2(R, V, K, A, lda, B, ss, bias, y, ldy, ncols, flags);                                    \
  }
#define TILE2_ROW(R) TILE2_FN(R, 1) TILE2_FN(R, 2) TILE2_FN(R, 3) TILE2_FN(R, 4)
TILE2_ROW(1)
TILE2_ROW(2)
TILE2_ROW(3)
TILE2_ROW(4)
TILE2_ROW(5)
TILE2_ROW(6)
#define TILE2_REF(R) \
  { tile2_##R##_1, tile2_##R##_2, tile2_##R##_3, tile2_##R##_4 }
const grove__tile2_fn grove__gemm_tiles2[MR][4] = {TILE2_REF(1), TILE2_REF(2), TILE2_REF(3),
                                                   TILE2_REF(4), TILE2_REF(5), TILE2_REF(6)};

GROVE__TARGET_POP

#endif /* GROVE__X86_SIMD */
