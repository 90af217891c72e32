/* gemm_internal.h: what the GEMM files share, and nothing else includes.
 *
 * The GEMM is cut along its jobs, as ONNX Runtime's MLAS cuts sgemm:
 *
 *   gemm.c        dispatch and the public entries: grove__linear_run (the
 *                 chunks of a product over the compute threads),
 *                 grove__gemm and its workspace plan
 *   gemm_pack.c   the packs: choosing a kernel, the Linear weights' panels
 *                 (at load), the general products' operand packs (per call)
 *   gemm_avx512.c the AVX-512 register tiles (Linear's, and the general
 *                 products')
 *   gemm_avx2.c   the AVX2 register tiles
 *   gemm_blas.c   the OpenBLAS path (and OpenBLAS's own thread count)
 *   threadpool.c  the compute threads: grove__parallel_for and their setting
 *
 * The tiles are reached through tables of function pointers (one entry per
 * row count and panel width, each compiled with compile-time sizes), so
 * cutting them into files of their own moved no call that was inlined
 * before. */
#ifndef GROVE_CORE_KERNELS_GEMM_INTERNAL_H
#define GROVE_CORE_KERNELS_GEMM_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels.h"

/* The kernel a pack runs. */
enum { GROVE__GEMM_KIND_BLAS = 0, GROVE__GEMM_KIND_AVX512 = 1, GROVE__GEMM_KIND_AVX2 = 2 };

/* Output features per panel of the AVX-512 layout (4 zmm), and rows per
 * microkernel call. */
#define GROVE__GEMM_NR 64
#define GROVE__GEMM_MR 6
/* Longest stretch of K one tile covers (see gemm.c, packed_part). */
#define GROVE__GEMM_KC 1024

struct grove__linear_pack {
  int64_t N, K;
  int kind;
  int64_t npanels; /* AVX-512 and AVX2: ceil(N / NR) */
  /* BLAS: W as given, [N,K] row-major.  AVX-512 and AVX2: panel p (columns
   * p*NR ..) starts at data + p*K*NR and holds K rows of its width w (a
   * multiple of 16, zero-padded past N).  AVX-512: element (k, j) at
   * [k*w + j], a k step of the panel one run of w floats.  AVX2: the panel
   * is w / 16 strips of 16 columns one after the other, element (k, j) at
   * [(j / 16) * K * 16 + k * 16 + j % 16], so that a 16-column strip's k
   * steps are one contiguous run (read 64 bytes w * 4 apart, the strips ran
   * at two thirds of the FMA rate). */
  float *data;
};

/* Width, in floats, of panel p: NR except possibly for the last one. */
static inline int grove__gemm_panel_width(int64_t N, int64_t p) {
  int64_t left = N - p * GROVE__GEMM_NR;
  if (left >= GROVE__GEMM_NR) return GROVE__GEMM_NR;
  return (int)((left + 15) / 16 * 16);
}

/* The kernel this process runs now (gemm_pack.c): GROVE_GEMM=blas forces
 * the BLAS path and GROVE_GEMM=avx2 the AVX2 kernel (where the CPU has it);
 * otherwise the widest kernel the CPU runs.  Reads the environment at each
 * call.  Any thread. */
int grove__gemm_kind(void);

/* ------------------------------------------------------------ tiles */

/* Tile flags: start from the values in y (a later block of K), apply ReLU,
 * apply ReLU6 (clamp to [0, 6] with grove__act_apply's comparisons, so a
 * NaN passes and the bits are those of the separate pass it replaces),
 * apply Hardswish or Hardsigmoid (simd_act.h: grove__act_apply's bits). */
#define GROVE__TILE_ACCUMULATE 1
#define GROVE__TILE_RELU 2
#define GROVE__TILE_RELU6 4
#define GROVE__TILE_HARDSWISH 8
#define GROVE__TILE_HARDSIGMOID 16

/* y[0..mr, 0..ncols) = act(A[0..mr, 0..K) . B + bias) (+ y with
 * ACCUMULATE), B one packed AVX-512 panel 16 * (v + 1) wide:
 * grove__gemm_tiles512[pf][mr - 1][v] (gemm_avx512.c).  With pf = 1 the
 * tile also prefetches, towards L2, the K cache lines from pf on (one per
 * k step; never dereferenced, so any address will do); pf = 0 ignores it.
 * A hint only: both compute the same bits. */
typedef void (*grove__tile_fn)(int64_t K, const float *A, int64_t lda, const float *B,
                               const char *pf, const float *bias, float *y, int64_t ldy,
                               int ncols, int flags);
/* The same over an AVX2 panel whose 16-column strips are ss floats apart:
 * grove__gemm_tiles2[mr - 1][v] (gemm_avx2.c). */
typedef void (*grove__tile2_fn)(int64_t K, const float *A, int64_t lda, const float *B, int64_t ss,
                                const float *bias, float *y, int64_t ldy, int ncols, int flags);
/* A general product's tile: c[0..mr, 0..ncols) = A . B, or c + A . B when
 * add (the sum over this K block starts from zero and c is added once at the
 * end): grove__gemm_gtiles[mr - 1][v] (gemm_avx512.c). */
typedef void (*grove__gtile_fn)(int64_t K, const float *A, int64_t lda, const float *B, float *c,
                                int64_t ldc, int ncols, bool add);

#if GROVE__X86_SIMD
extern const grove__tile_fn grove__gemm_tiles512[2][GROVE__GEMM_MR][4];
extern const grove__tile2_fn grove__gemm_tiles2[GROVE__GEMM_MR][4];
extern const grove__gtile_fn grove__gemm_gtiles[GROVE__GEMM_MR][4];

/* ------------------------------------------------------------ operand packs */

/* The general products' packs (gemm_pack.c; AVX-512, so only where
 * grove__gemm_kind() is AVX512).  The pack has the layout of an AVX-512
 * grove__linear_pack's data: panel pi at pi * K * NR, K rows of its width,
 * zero past N. */

/* dst[c * ldd + r] (+)= src[r * lds + c] over rows [r0, r1) of src and all
 * its cols. */
void grove__gemm_transpose_rows(const float *src, int64_t lds, int64_t r0, int64_t r1, int64_t cols,
                                float *dst, int64_t ldd, bool accumulate);
/* Rows [k0, k1) of op(B) [K, N], op(B)[k, n] = B[k * ldb + n], into every
 * panel of pack. */
void grove__gemm_pack_rows(const float *B, int64_t ldb, int64_t N, int64_t K, int64_t npanels,
                           int64_t k0, int64_t k1, float *pack);
/* Rows [k0, k1) (multiples of 16 but for K) of panel pi of op(B) [K, N],
 * op(B)[k, n] = B[n * ldb + k], into their place in pack. */
void grove__gemm_pack_panel_t(const float *B, int64_t ldb, int64_t N, int64_t K, int64_t pi,
                              int64_t k0, int64_t k1, float *pack);
#endif

/* ------------------------------------------------------------ BLAS */

/* grove__linear_run on a BLAS pack (gemm_blas.c): cblas_sgemv for one row,
 * cblas_sgemm otherwise, then one pass of bias and ReLU. */
void grove__gemm_blas_linear(const grove__linear_pack *p, const float *x, int64_t M,
                             const float *bias, float *y, bool relu);
/* grove__gemm through cblas_sgemm (gemm_blas.c; sizes fit an int). */
void grove__gemm_blas(int flags, int64_t M, int64_t N, int64_t K, const float *A, int64_t lda,
                      const float *B, int64_t ldb, float *C, int64_t ldc);
/* OpenBLAS's own thread count, set with the compute threads (threadpool.c
 * calls it from grove_set_compute_threads). */
void grove__gemm_blas_threads(int n);

#endif
