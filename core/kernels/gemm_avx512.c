/* gemm_avx512.c: the AVX-512 register tiles of the GEMM (gemm_internal.h
 * says how the GEMM's files share the work).
 *
 * A tile keeps an MR x 64 block of the output (6 rows x 4 zmm = 24
 * accumulators) in registers over the whole K loop of a packed panel, k-major
 * so that one k step is 4 aligned zmm loads, broadcasting one element of A
 * per row and k.  Linear's tile (tile) applies bias and ReLU, ReLU6,
 * Hardswish or Hardsigmoid (a separate pass over y was 4.7% of
 * MobileNetV2, 5-6% of MobileNetV3) while the block
 * is still in registers, so y is written exactly once; the general products'
 * tile (gtile) adds C at the end instead.  Each (rows, width) pair is its own
 * function with compile-time sizes, reached through the tables gemm.c reads.
 * Compiled for avx512f only inside GROVE__TARGET_PUSH, so the file builds
 * with the rest's flags; only a CPU that grove__gemm_kind() found runs it. */
#include <stdbool.h>
#include <stdint.h>

#include "gemm_internal.h"
#include "simd_act.h"

#if GROVE__X86_SIMD
#include <immintrin.h>

#define MR GROVE__GEMM_MR

GROVE__TARGET_PUSH("avx512f,avx512vl,fma")

/* The column masks of a tile ncols wide over NV 16-float vectors. */
static inline __attribute__((always_inline)) void tile_masks(const int NV, int ncols,
                                                             __mmask16 mask[4]) {
#pragma GCC unroll 4
  for (int j = 0; j < NV; j++) {
    int valid = ncols - 16 * j;
    valid = valid < 0 ? 0 : valid > 16 ? 16 : valid;
    mask[j] = (__mmask16)((1u << valid) - 1u);
  }
}

/* acc[0..mr)[0..NV) += A[0..mr, 0..K) . B, B one packed panel NV * 16 wide:
 * per k, NV aligned loads of the panel, mr broadcasts, mr * NV FMAs, and
 * with prefetch (a compile-time constant) the line at pf + 64 k brought
 * towards L2 (the next block of the panels, gemm.c packed_part).  The
 * shared inner loop of tile() and gtile(); always inlined with
 * compile-time mr and NV, so acc stays in registers. */
static inline __attribute__((always_inline)) void tile_fma(const int mr, const int NV, int64_t K,
                                                           const float *A, int64_t lda,
                                                           const float *B, const bool prefetch,
                                                           const char *pf, __m512 acc[MR][4]) {
  for (int64_t k = 0; k < K; k++) {
    __m512 b[4];
    if (prefetch) _mm_prefetch(pf + k * 64, _MM_HINT_T1);
#pragma GCC unroll 4
    for (int j = 0; j < NV; j++) b[j] = _mm512_load_ps(B + k * (NV * 16) + j * 16);
#pragma GCC unroll 6
    for (int i = 0; i < mr; i++) {
      __m512 a = _mm512_set1_ps(A[i * lda + k]);
#pragma GCC unroll 4
      for (int j = 0; j < NV; j++) acc[i][j] = _mm512_fmadd_ps(a, b[j], acc[i][j]);
    }
  }
}

/* One tile: y[0..mr, 0..ncols) = act(A[0..mr, 0..K) . B + bias), B one
 * packed panel of width NV*16.  mr and NV are compile-time constants at
 * every call (the wrappers below), so the accumulator array lives in
 * registers and the loops unroll. */
static inline __attribute__((always_inline)) void tile(const int mr, const int NV,
                                                       const bool prefetch, int64_t K,
                                                       const float *A, int64_t lda, const float *B,
                                                       const char *pf, const float *bias, float *y,
                                                       int64_t ldy, int ncols, int flags) {
  __m512 acc[MR][4];
  __mmask16 mask[4];
  tile_masks(NV, ncols, mask);
  if (flags & GROVE__TILE_ACCUMULATE) {
#pragma GCC unroll 6
    for (int i = 0; i < mr; i++)
#pragma GCC unroll 4
      for (int j = 0; j < NV; j++) acc[i][j] = _mm512_maskz_loadu_ps(mask[j], y + i * ldy + 16 * j);
  } else {
#pragma GCC unroll 6
    for (int i = 0; i < mr; i++)
#pragma GCC unroll 4
      for (int j = 0; j < NV; j++) acc[i][j] = _mm512_setzero_ps();
  }

  tile_fma(mr, NV, K, A, lda, B, prefetch, pf, acc);

  __m512 bv[4];
#pragma GCC unroll 4
  for (int j = 0; j < NV; j++)
    bv[j] = bias ? _mm512_maskz_loadu_ps(mask[j], bias + 16 * j) : _mm512_setzero_ps();
  const int relu = flags & GROVE__TILE_RELU, relu6 = flags & GROVE__TILE_RELU6;
  const int hswish = flags & GROVE__TILE_HARDSWISH, hsig = flags & GROVE__TILE_HARDSIGMOID;
  const __m512 zero = _mm512_setzero_ps(), six = _mm512_set1_ps(6.0f);
#pragma GCC unroll 6
  for (int i = 0; i < mr; i++) {
#pragma GCC unroll 4
    for (int j = 0; j < NV; j++) {
      __m512 v = _mm512_add_ps(acc[i][j], bv[j]);
      if (relu) v = _mm512_max_ps(v, zero);
      /* max and min return their second operand when either is NaN: v
       * second lets a NaN through, as clampf does. */
      if (relu6) v = _mm512_min_ps(six, _mm512_max_ps(zero, v));
      if (hswish) v = GROVE__HARDSWISH(_mm512, v);
      if (hsig) v = GROVE__HARDSIGMOID(_mm512, v);
      if (mask[j] == 0xFFFF)
        _mm512_storeu_ps(y + i * ldy + 16 * j, v);
      else
        _mm512_mask_storeu_ps(y + i * ldy + 16 * j, mask[j], v);
    }
  }
}

#define TILE_FN(R, V)                                                                    \
  static void tile_##R##_##V(int64_t K, const float *A, int64_t lda, const float *B,     \
                             const char *pf, const float *bias, float *y, int64_t ldy,   \
                             int ncols, int flags) {                                     \
    tile(R, V, false, K, A, lda, B, pf, bias, y, ldy, ncols, flags);                     \
  }                                                                                      \
  static void tile_pf_##R##_##V(int64_t K, const float *A, int64_t lda, const float *B,  \
                                const char *pf, const float *bias, float *y, int64_t ldy, \
                                int ncols, int flags) {                                  \
    tile(R, V, true, K, A, lda, B, pf, bias, y, ldy, ncols, flags);                      \
  }
#define TILE_ROW(R) TILE_FN(R, 1) TILE_FN(R, 2) TILE_FN(R, 3) TILE_FN(R, 4)
TILE_ROW(1)
TILE_ROW(2)
TILE_ROW(3)
TILE_ROW(4)
TILE_ROW(5)
TILE_ROW(6)
#define TILE_REF(P, R) \
  { P##R##_1, P##R##_2, P##R##_3, P##R##_4 }
const grove__tile_fn grove__gemm_tiles512[2][MR][4] = {
    {TILE_REF(tile_, 1), TILE_REF(tile_, 2), TILE_REF(tile_, 3), TILE_REF(tile_, 4),
     TILE_REF(tile_, 5), TILE_REF(tile_, 6)},
    {TILE_REF(tile_pf_, 1), TILE_REF(tile_pf_, 2), TILE_REF(tile_pf_, 3), TILE_REF(tile_pf_, 4),
     TILE_REF(tile_pf_, 5), TILE_REF(tile_pf_, 6)}};

/* One tile of a general product: c[0..mr, 0..ncols) = A . B, or c + A . B
 * when add.  Unlike tile() above, the sum over this K block starts from zero
 * and c is added once at the end, so that accumulating a product into c
 * gives c + (the product computed alone), whatever c holds: a second
 * identical backward doubles a gradient exactly, as with BLAS.  It also
 * keeps c's loads away from the previous tile's stores (rows of c 4 KB
 * apart would alias them). */
static inline __attribute__((always_inline)) void gtile(const int mr, const int NV, int64_t K,
                                                        const float *A, int64_t lda, const float *B,
                                                        float *c, int64_t ldc, int ncols,
                                                        bool add) {
  __m512 acc[MR][4];
  __mmask16 mask[4];
  tile_masks(NV, ncols, mask);
#pragma GCC unroll 6
  for (int i = 0; i < mr; i++)
#pragma GCC unroll 4
    for (int j = 0; j < NV; j++) acc[i][j] = _mm512_setzero_ps();
  tile_fma(mr, NV, K, A, lda, B, false, NULL, acc);
#pragma GCC unroll 6
  for (int i = 0; i < mr; i++) {
#pragma GCC unroll 4
    for (int j = 0; j < NV; j++) {
      __m512 v = acc[i][j];
      if (add) v = _mm512_add_ps(_mm512_maskz_loadu_ps(mask[j], c + i * ldc + 16 * j), v);
      if (mask[j] == 0xFFFF)
        _mm512_storeu_ps(c + i * ldc + 16 * j, v);
      else
        _mm512_mask_storeu_ps(c + i * ldc + 16 * j, mask[j], v);
    }
  }
}

#define GTILE_FN(R, V)                                                                          \
  static void gtile_##R##_##V(int64_t K, const float *A, int64_t lda, const float *B, float *c, \
                              int64_t ldc, int ncols, bool add) {                               \
    gtile(R, V, K, A, lda, B, c, ldc, ncols, add);                                              \
  }
#define GTILE_ROW(R) GTILE_FN(R, 1) GTILE_FN(R, 2) GTILE_FN(R, 3) GTILE_FN(R, 4)
GTILE_ROW(1)
GTILE_ROW(2)
GTILE_ROW(3)
GTILE_ROW(4)
GTILE_ROW(5)
GTILE_ROW(6)
#define GTILE_REF(R) \
  { gtile_##R##_1, gtile_##R##_2, gtile_##R##_3, gtile_##R##_4 }
const grove__gtile_fn grove__gemm_gtiles[MR][4] = {GTILE_REF(1), GTILE_REF(2), GTILE_REF(3),
                                                   GTILE_REF(4), GTILE_REF(5), GTILE_REF(6)};

GROVE__TARGET_POP

#endif /* GROVE__X86_SIMD */
