/* gemm.c: the matrix product behind Linear, y = act(x . W^T + b), and the
 * process-wide compute-thread setting.
 *
 * Two kernels, chosen once per pack when weights are loaded:
 *
 *  - AVX-512 (x86-64 with avx512f, checked at run time): W is repacked into
 *    column panels of up to NR = 64 output features, k-major, so that one
 *    k step of a panel is 4 aligned zmm loads.  A register-blocked
 *    microkernel keeps an MR x 64 tile of y (6 rows x 4 zmm = 24
 *    accumulators) in registers over the whole K loop, broadcasting one x
 *    element per row and k, and applies bias and ReLU while the tile is
 *    still in registers, so y is written exactly once.  The same kernel
 *    serves batch 1 (one row; the weights then stream from cache once per
 *    forward, which is all a matrix-vector product can do).  A narrow last
 *    panel (N % 64) is packed 16, 32 or 48 wide so Linear(1024, 10) does not
 *    compute 64 columns.
 *  - AVX2 (x86-64 with avx2 and fma but not avx512f, or GROVE_GEMM=avx2):
 *    the same panels, computed in strips of 16 columns: an MR x 16 tile (6
 *    rows x 2 ymm = 12 of the 16 ymm registers) per strip, with the same
 *    epilogue, on panels packed strip by strip (each strip's k steps
 *    contiguous).  Without it such a CPU (AMD Zen 2 and 3, Intel client
 *    parts) fell back to OpenBLAS, which on the reference MLP is 1.05 to
 *    1.4 times slower at batch 1, 64 and 256, and 4 to 7 times at batches
 *    of 2 to 6 (docs/performance.md, "AVX2").
 *  - BLAS (anything else, or GROVE_GEMM=blas): W is kept as is and the
 *    product goes through cblas_sgemv (one row) or cblas_sgemm, followed by
 *    one pass of bias and ReLU over the cache-hot output.
 *
 * Threads: grove_set_compute_threads(n) with n > 1 starts n - 1 helper
 * threads (a small persistent pool).  A run cuts its output into chunks
 * (panels, or for a narrow layer groups of rows) that the caller and the
 * helpers claim one at a time, so a helper that is late or whose core was
 * taken never holds the caller up.  Helpers spin for a short while after
 * each job, because the next layer of the same forward follows within
 * microseconds and waking a sleeping thread costs more than a whole
 * batch-1 layer, then sleep on a condition variable.  One run at a time
 * owns a pool; when several worker threads run at once, further pools are
 * started on demand up to cores / n of them (see g_pools), and a run that
 * finds none free computes on its own thread, so concurrent runs are
 * correct and never use more than workers x n threads.  The same pools
 * run grove__parallel_for, the convolutions' transforms and patch rows
 * (layers_conv.c), as chunks of an index range.  Pools are joined
 * at exit (atexit) and when the thread count changes, and dropped in the
 * child of a fork.
 */
#define _GNU_SOURCE /* sched_getaffinity, CPU_COUNT */
#include <assert.h>
#include <cblas.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kernels.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define GEMM_HAVE_AVX512 1
#include <immintrin.h>
#else
#define GEMM_HAVE_AVX512 0
#endif

/* openblas_set_num_threads is an OpenBLAS extension that cblas.h from
 * libopenblas-dev declares; declare it again so a generic cblas.h also
 * compiles (the link still needs OpenBLAS). */
void openblas_set_num_threads(int num_threads);

/* ================================================================ packs */

enum { KIND_BLAS = 0, KIND_AVX512 = 1, KIND_AVX2 = 2 };

/* Output features per panel of the AVX-512 layout (4 zmm), and rows per
 * microkernel call. */
#define NR 64
#define MR 6
/* Longest stretch of K one tile covers (see packed_part). */
#define KC 1024

struct grove__linear_pack {
  int64_t N, K;
  int kind;
  int64_t npanels; /* AVX-512: ceil(N / NR) */
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
static inline int panel_width(int64_t N, int64_t p) {
  int64_t left = N - p * NR;
  if (left >= NR) return NR;
  return (int)((left + 15) / 16 * 16);
}

/* GROVE_GEMM=blas forces the BLAS path and GROVE_GEMM=avx2 the AVX2
 * kernel (where the CPU has it: tests and benchmarks of it on an AVX-512
 * machine); otherwise the widest kernel the CPU runs. */
static int choose_kind(void) {
  const char *force = getenv("GROVE_GEMM");
  if (force && strcmp(force, "blas") == 0) return KIND_BLAS;
#if GEMM_HAVE_AVX512
  __builtin_cpu_init();
  const bool avx2 = grove__cpu_avx2();
  if (force && strcmp(force, "avx2") == 0 && avx2) return KIND_AVX2;
  if (__builtin_cpu_supports("avx512f")) return KIND_AVX512;
  if (avx2) return KIND_AVX2;
#endif
  return KIND_BLAS;
}

grove__linear_pack *grove__linear_pack_new(const float *W, int64_t N, int64_t K) {
  if (N < 0 || K < 0 || (N > 0 && K > 0 && !W)) return NULL;
  grove__linear_pack *p = calloc(1, sizeof *p);
  if (!p) return NULL;
  p->N = N;
  p->K = K;
  p->kind = choose_kind();
  p->npanels = (N + NR - 1) / NR;
  /* BLAS takes int sizes; a layer that large is refused rather than cut. */
  if (p->kind == KIND_BLAS && (N > INT_MAX || K > INT_MAX)) {
    free(p);
    return NULL;
  }

  uint64_t cols = p->kind != KIND_BLAS ? (uint64_t)p->npanels * NR : (uint64_t)N;
  uint64_t elems, bytes;
  if (grove__mul_overflow_u64(cols, (uint64_t)K, &elems) ||
      grove__mul_overflow_u64(elems, sizeof(float), &bytes) || bytes > SIZE_MAX - 64) {
    free(p);
    return NULL;
  }
  /* aligned_alloc wants a size that is a multiple of the alignment; the
   * panels' k rows are 64-byte multiples, so panel starts stay aligned. */
  size_t size = ((size_t)bytes + 63) / 64 * 64;
  p->data = aligned_alloc(64, size ? size : 64);
  if (!p->data) {
    free(p);
    return NULL;
  }
  if (p->kind == KIND_BLAS) {
    if (bytes) memcpy(p->data, W, (size_t)bytes);
    grove__yield_point();
    return p;
  }
  /* A transpose of each panel's rows, in blocks of 64 k: a block reads 64
   * contiguous floats of each row (16 KB in all, in L1) and writes them as
   * 64 rows of the panel.  Walking k for all rows at once instead read one
   * float per row and k, 4 KB apart for K = 1024, which the cache's sets
   * cannot hold: 3 to 5 times slower, and the pack is most of a reload's
   * CPU time and all of an in-place reload's pause. */
  enum { KB = 64 };
  const bool strips = p->kind == KIND_AVX2;
  for (int64_t pi = 0; pi < p->npanels; pi++) {
    grove__yield_point(); /* a background build packs (core/base/yield.c) */
    int w = panel_width(N, pi);
    float *dst = p->data + pi * K * NR;
    int64_t n0 = pi * NR;
    int rows = N - n0 < w ? (int)(N - n0) : w;
    for (int64_t k0 = 0; k0 < K; k0 += KB) {
      int64_t k1 = k0 + KB < K ? k0 + KB : K;
      for (int j = 0; j < w; j++) {
        /* Where (k, j) goes: k * ks + j's column offset (the layouts above). */
        float *d = strips ? dst + (int64_t)(j / 16) * K * 16 + j % 16 : dst + j;
        const int64_t ks = strips ? 16 : w;
        if (j < rows) {
          const float *src = W + (n0 + j) * K;
          for (int64_t k = k0; k < k1; k++) d[k * ks] = src[k];
        } else {
          for (int64_t k = k0; k < k1; k++) d[k * ks] = 0.0f;
        }
      }
    }
  }
  return p;
}

void grove__linear_pack_free(grove__linear_pack *p) {
  if (!p) return;
  free(p->data);
  free(p);
}

/* ================================================================ AVX-512 kernel */

#if GEMM_HAVE_AVX512

GROVE__TARGET_PUSH("avx512f,avx512vl,fma")

/* Tile flags: start from the values in y (a later block of K), apply ReLU. */
#define TILE_ACCUMULATE 1
#define TILE_RELU 2

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
 * per k, NV aligned loads of the panel, mr broadcasts, mr * NV FMAs.  The
 * shared inner loop of tile() and gtile(); always inlined with
 * compile-time mr and NV, so acc stays in registers. */
static inline __attribute__((always_inline)) void tile_fma(const int mr, const int NV, int64_t K,
                                                           const float *A, int64_t lda,
                                                           const float *B, __m512 acc[MR][4]) {
  for (int64_t k = 0; k < K; k++) {
    __m512 b[4];
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
static inline __attribute__((always_inline)) void tile(const int mr, const int NV, int64_t K,
                                                       const float *A, int64_t lda, const float *B,
                                                       const float *bias, float *y, int64_t ldy,
                                                       int ncols, int flags) {
  __m512 acc[MR][4];
  __mmask16 mask[4];
  tile_masks(NV, ncols, mask);
  if (flags & TILE_ACCUMULATE) {
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

  tile_fma(mr, NV, K, A, lda, B, acc);

  __m512 bv[4];
#pragma GCC unroll 4
  for (int j = 0; j < NV; j++)
    bv[j] = bias ? _mm512_maskz_loadu_ps(mask[j], bias + 16 * j) : _mm512_setzero_ps();
  const int relu = flags & TILE_RELU;
  const __m512 zero = _mm512_setzero_ps();
#pragma GCC unroll 6
  for (int i = 0; i < mr; i++) {
#pragma GCC unroll 4
    for (int j = 0; j < NV; j++) {
      __m512 v = _mm512_add_ps(acc[i][j], bv[j]);
      if (relu) v = _mm512_max_ps(v, zero);
      if (mask[j] == 0xFFFF)
        _mm512_storeu_ps(y + i * ldy + 16 * j, v);
      else
        _mm512_mask_storeu_ps(y + i * ldy + 16 * j, mask[j], v);
    }
  }
}

typedef void (*tile_fn)(int64_t K, const float *A, int64_t lda, const float *B, const float *bias,
                        float *y, int64_t ldy, int ncols, int flags);

#define TILE_FN(R, V)                                                                          \
  static void tile_##R##_##V(int64_t K, const float *A, int64_t lda, const float *B,           \
                             const float *bias, float *y, int64_t ldy, int ncols, int flags) { \
    tile(R, V, K, A, lda, B, bias, y, ldy, ncols, flags);                                      \
  }
#define TILE_ROW(R) TILE_FN(R, 1) TILE_FN(R, 2) TILE_FN(R, 3) TILE_FN(R, 4)
TILE_ROW(1)
TILE_ROW(2)
TILE_ROW(3)
TILE_ROW(4)
TILE_ROW(5)
TILE_ROW(6)
#define TILE_REF(R) \
  { tile_##R##_1, tile_##R##_2, tile_##R##_3, tile_##R##_4 }
static const tile_fn tiles[MR][4] = {TILE_REF(1), TILE_REF(2), TILE_REF(3),
                                     TILE_REF(4), TILE_REF(5), TILE_REF(6)};

GROVE__TARGET_POP

/* ================================================================ AVX2 kernel */

GROVE__TARGET_PUSH("avx2,fma")

/* One strip: y[0..mr, 0..ncols) = act(A[0..mr, 0..K) . B + bias) with B
 * the first of the strip's NY / 2 16-column strips of an AVX2 panel (see
 * grove__linear_pack), the next one ss floats further, each k step of one
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
      acc[i][j] = !(flags & TILE_ACCUMULATE) ? _mm256_setzero_ps()
                  : full                     ? _mm256_loadu_ps(yp)
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
  const __m256 zero = _mm256_setzero_ps();
#pragma GCC unroll 8
  for (int j = 0; j < NY; j++) {
    const __m256 bv = !bias  ? zero
                      : full ? _mm256_loadu_ps(bias + 8 * j)
                             : _mm256_maskload_ps(bias + 8 * j, m[j]);
#pragma GCC unroll 6
    for (int i = 0; i < mr; i++) {
      __m256 v = _mm256_add_ps(acc[i][j], bv);
      if (flags & TILE_RELU) v = _mm256_max_ps(v, zero);
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

typedef void (*tile2_fn)(int64_t K, const float *A, int64_t lda, const float *B, int64_t ss,
                         const float *bias, float *y, int64_t ldy, int ncols, int flags);

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
static const tile2_fn tiles2[MR][4] = {TILE2_REF(1), TILE2_REF(2), TILE2_REF(3),
                                       TILE2_REF(4), TILE2_REF(5), TILE2_REF(6)};

GROVE__TARGET_POP

/* Rows [r0, r1) x panels [p0, p1) of one product.  A long K is cut into
 * blocks of at most KC, so that the block of a panel (KC x 64 floats,
 * 256 KB) stays in L2 while every row block of x passes over it; the
 * partial sums go through y, and bias and ReLU come with the last block. */
static void packed_part(const grove__linear_pack *p, const float *x, const float *bias, float *y,
                        int relu, int64_t r0, int64_t r1, int64_t p0, int64_t p1) {
  const int64_t N = p->N, K = p->K;
  const bool avx2 = p->kind == KIND_AVX2;
  const int64_t kblocks = K > KC ? (K + KC - 1) / KC : 1;
  const int64_t kc = (K + kblocks - 1) / kblocks;
  for (int64_t pi = p0; pi < p1; pi++) {
    grove__yield_point();
    int w = panel_width(N, pi);
    int64_t n0 = pi * NR;
    int ncols = (int)(N - n0 < NR ? N - n0 : NR);
    const float *B = p->data + pi * K * NR;
    for (int64_t kb = 0; kb < kblocks; kb++) {
      int64_t k0 = kb * kc, kn = K - k0 < kc ? K - k0 : kc;
      bool last = kb == kblocks - 1;
      const float *bp = bias && last ? bias + n0 : NULL;
      int flags = (kb > 0 ? TILE_ACCUMULATE : 0) | (relu && last ? TILE_RELU : 0);
      for (int64_t i = r0; i < r1; i += MR) {
        int mr = (int)(r1 - i < MR ? r1 - i : MR);
        if (avx2)
          tiles2[mr - 1][w / 16 - 1](kn, x + i * K + k0, K, B + k0 * 16, K * 16, bp, y + i * N + n0,
                                     N, ncols, flags);
        else
          tiles[mr - 1][w / 16 - 1](kn, x + i * K + k0, K, B + k0 * w, bp, y + i * N + n0, N, ncols,
                                    flags);
      }
    }
  }
}

#endif /* GEMM_HAVE_AVX512 */

/* ================================================================ BLAS path */

static void blas_run(const grove__linear_pack *p, const float *x, int64_t M, const float *bias,
                     float *y, int relu) {
  const int64_t N = p->N, K = p->K;
  if (K == 0) {
    memset(y, 0, (size_t)(M * N) * sizeof(float));
  } else if (M == 1) {
    cblas_sgemv(CblasRowMajor, CblasNoTrans, (blasint)N, (blasint)K, 1.0f, p->data, (blasint)K, x,
                1, 0.0f, y, 1);
  } else {
    /* N and K fit an int (pack_new); M is cut if it does not, and into
     * blocks of 32 rows on a background thread, whose yield points are
     * between OpenBLAS's calls (core/base/yield.c). */
    const int64_t step = grove__yield_every_ns ? 32 : INT_MAX;
    for (int64_t r = 0; r < M; r += step) {
      int64_t m = M - r < step ? M - r : step;
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (blasint)m, (blasint)N, (blasint)K, 1.0f,
                  x + r * K, (blasint)K, p->data, (blasint)K, 0.0f, y + r * N, (blasint)N);
      grove__yield_point();
    }
  }
  if (!bias && !relu) return;
  for (int64_t i = 0; i < M; i++) {
    float *row = y + i * N;
    if (bias)
      for (int64_t j = 0; j < N; j++) row[j] += bias[j];
    if (relu)
      for (int64_t j = 0; j < N; j++) row[j] = row[j] > 0.0f ? row[j] : 0.0f;
  }
}

/* ================================================================ thread pool */

/* How long a helper spins for the next job before it sleeps, and how long
 * a caller spins for chunks still in flight before it yields its core. */
#define HELPER_SPIN_NS 500000
#define CALLER_SPIN_NS 20000

/* One product, cut into chunks that threads claim one at a time: a chunk
 * is a run of panels over all rows, or, for a layer with fewer panels than
 * threads, a group of rows over all panels. */
typedef struct job {
  /* grove__parallel_for: chunk c is fn(ctx, c * grain, min(n, (c+1) * grain)).
   * NULL for a product. */
  void (*fn)(void *ctx, int64_t begin, int64_t end);
  void *ctx;
  int64_t n, grain;
  const grove__linear_pack *p;
  const float *x, *bias;
  float *y;
  int64_t M;
  int relu;
  bool by_rows;
  int64_t rows_per_chunk;   /* by_rows: a multiple of MR */
  int64_t panels_per_chunk; /* otherwise */
} job;

/* The claim word: generation (32 bits) | chunks in the job (16) | next
 * chunk (16).  Threads claim a chunk by a compare-and-swap on the whole
 * word, so a helper that comes late (asleep, or its core taken by another
 * process) can never claim a chunk of a job that has moved on, and the
 * caller never waits for a helper that has not started: it claims what
 * nobody took and waits only for chunks already being computed.  Job
 * fields are read only after a successful claim, and a job ends only when
 * every claimed chunk is done, so they are stable while read. */
#define MAX_CHUNKS 0xFFFF
static inline uint64_t word_make(uint32_t gen, uint32_t total, uint32_t next) {
  return (uint64_t)gen << 32 | (uint64_t)total << 16 | next;
}
static inline uint32_t word_gen(uint64_t w) {
  return (uint32_t)(w >> 32);
}
static inline uint32_t word_total(uint64_t w) {
  return (uint32_t)(w >> 16) & 0xFFFF;
}
static inline uint32_t word_next(uint64_t w) {
  return (uint32_t)w & 0xFFFF;
}

typedef struct pool {
  int nhelpers;
  pthread_t *threads;
  atomic_flag busy; /* held by the run that owns the pool */
  _Alignas(64) _Atomic uint64_t work;
  _Alignas(64) atomic_int done;     /* chunks finished in the current job */
  _Alignas(64) atomic_int sleepers; /* helpers waiting on cv */
  atomic_bool stop;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  job cur;
} pool;

/* The pools: g_pools[0 .. g_npools) are published and never change until
 * grove_set_compute_threads (or exit, or fork) replaces them all, which
 * must not race with forwards (grove.h).  There is one pool to begin with;
 * when several worker threads run products at once, each run takes a free
 * pool, and a run that finds none starts one more, up to g_pool_cap =
 * cores / threads, so that W workers with T threads each end up with W
 * pools of T - 1 helpers: W x T threads, never more than the cores.  Pools
 * are added under g_cfg_mu (tried, never waited for: a run that cannot get
 * it computes alone). */
#define MAX_POOLS 64
static atomic_int g_threads = 1;
static _Atomic(pool *) g_pools[MAX_POOLS];
static atomic_int g_npools;
static atomic_int g_pool_cap;
static pthread_mutex_t g_cfg_mu = PTHREAD_MUTEX_INITIALIZER;
static bool g_atexit_done, g_atfork_done; /* handlers registered; g_cfg_mu */

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

static void run_chunk(const job *jb, int64_t c) {
  if (jb->fn) {
    int64_t b = c * jb->grain;
    jb->fn(jb->ctx, b, jb->n - b < jb->grain ? jb->n : b + jb->grain);
    return;
  }
#if GEMM_HAVE_AVX512
  const grove__linear_pack *p = jb->p;
  if (jb->by_rows) {
    int64_t r0 = c * jb->rows_per_chunk;
    int64_t r1 = r0 + jb->rows_per_chunk < jb->M ? r0 + jb->rows_per_chunk : jb->M;
    packed_part(p, jb->x, jb->bias, jb->y, jb->relu, r0, r1, 0, p->npanels);
  } else {
    int64_t q0 = c * jb->panels_per_chunk;
    int64_t q1 = q0 + jb->panels_per_chunk < p->npanels ? q0 + jb->panels_per_chunk : p->npanels;
    packed_part(p, jb->x, jb->bias, jb->y, jb->relu, 0, jb->M, q0, q1);
  }
#else
  (void)jb;
  (void)c;
  assert(!"the pool only runs packed (AVX-512 or AVX2) products");
#endif
}

/* Claims and runs chunks of generation gen until none is left. */
static void claim_chunks(pool *pl, uint32_t gen) {
  uint64_t w = atomic_load_explicit(&pl->work, memory_order_acquire);
  for (;;) {
    if (word_gen(w) != gen || word_next(w) >= word_total(w)) return;
    if (!atomic_compare_exchange_weak_explicit(&pl->work, &w, w + 1, memory_order_acq_rel,
                                               memory_order_acquire))
      continue; /* w now holds the current word */
    run_chunk(&pl->cur, word_next(w));
    atomic_fetch_add_explicit(&pl->done, 1, memory_order_release);
    grove__yield_point(); /* a background caller's, between its chunks (core/base/yield.c) */
    w = atomic_load_explicit(&pl->work, memory_order_acquire);
  }
}

static inline uint32_t current_gen(pool *pl) {
  return word_gen(atomic_load_explicit(&pl->work, memory_order_acquire));
}

static void *helper_main(void *arg) {
  pool *pl = arg;
  uint32_t seen = 0; /* the pool starts at generation 0 with no chunks */
  for (;;) {
    int64_t t0 = grove__clock_ns();
    uint32_t g;
    int spins = 0;
    while ((g = current_gen(pl)) == seen) {
      cpu_relax();
      if (++spins % 256 == 0 && grove__clock_ns() - t0 > HELPER_SPIN_NS) {
        /* Dekker pairing with post_job: we publish sleepers before
         * re-reading work, it publishes work before reading sleepers (all
         * seq_cst), so at least one of us sees the other. */
        pthread_mutex_lock(&pl->mu);
        atomic_fetch_add(&pl->sleepers, 1);
        while (word_gen(atomic_load(&pl->work)) == seen) pthread_cond_wait(&pl->cv, &pl->mu);
        atomic_fetch_sub(&pl->sleepers, 1);
        pthread_mutex_unlock(&pl->mu);
        t0 = grove__clock_ns();
      }
    }
    seen = g;
    if (atomic_load(&pl->stop)) return NULL;
    claim_chunks(pl, g);
  }
}

/* Publishes a new generation with `total` chunks (the caller, owning the
 * pool, has filled pl->cur) and wakes sleeping helpers; returns the
 * generation. */
static uint32_t post_job(pool *pl, uint32_t total) {
  uint32_t g = current_gen(pl) + 1;
  atomic_store_explicit(&pl->done, 0, memory_order_relaxed);
  atomic_store(&pl->work, word_make(g, total, 0)); /* seq_cst: see helper_main */
  if (atomic_load(&pl->sleepers) > 0) {
    pthread_mutex_lock(&pl->mu);
    pthread_cond_broadcast(&pl->cv);
    pthread_mutex_unlock(&pl->mu);
  }
  return g;
}

/* Stops and joins every helper, frees the pool.  Takes the busy flag
 * first, so a run still using the pool finishes. */
static void pool_free(pool *pl) {
  if (!pl) return;
  while (atomic_flag_test_and_set_explicit(&pl->busy, memory_order_acquire)) sched_yield();
  atomic_store(&pl->stop, true);
  post_job(pl, 0);
  for (int i = 0; i < pl->nhelpers; i++) pthread_join(pl->threads[i], NULL);
  pthread_cond_destroy(&pl->cv);
  pthread_mutex_destroy(&pl->mu);
  free(pl->threads);
  free(pl);
}

/* A pool with up to nhelpers helpers (fewer when thread creation fails),
 * or NULL when none could start. */
static pool *pool_new(int nhelpers) {
  /* Aligned so that the claim word, the done counter and the sleepers
   * count sit on cache lines of their own. */
  pool *pl = aligned_alloc(_Alignof(pool), sizeof *pl);
  if (!pl) return NULL;
  memset(pl, 0, sizeof *pl);
  pl->threads = calloc((size_t)nhelpers, sizeof *pl->threads);
  if (!pl->threads || pthread_mutex_init(&pl->mu, NULL) != 0) {
    free(pl->threads);
    free(pl);
    return NULL;
  }
  if (pthread_cond_init(&pl->cv, NULL) != 0) {
    pthread_mutex_destroy(&pl->mu);
    free(pl->threads);
    free(pl);
    return NULL;
  }
  atomic_flag_clear(&pl->busy);
  atomic_init(&pl->work, word_make(0, 0, 0));
  atomic_init(&pl->done, 0);
  atomic_init(&pl->sleepers, 0);
  atomic_init(&pl->stop, false);
  /* Helpers start with every signal blocked (they inherit the mask), so
   * that a process-directed signal is never handled on a compute thread. */
  sigset_t all, old;
  sigfillset(&all);
  bool masked = pthread_sigmask(SIG_SETMASK, &all, &old) == 0;
  for (int i = 0; i < nhelpers; i++) {
    if (pthread_create(&pl->threads[i], NULL, helper_main, pl) != 0) break;
    pl->nhelpers++;
  }
  if (masked) pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (pl->nhelpers == 0) {
    pool_free(pl);
    return NULL;
  }
  return pl;
}

/* Unpublishes and frees every pool; g_cfg_mu is held. */
static void pools_free_all(void) {
  int n = atomic_exchange(&g_npools, 0);
  for (int i = 0; i < n; i++) pool_free(atomic_exchange(&g_pools[i], NULL));
}

/* fork() copies only the calling thread: in the child the helpers are
 * gone, so the pools are dropped (their memory freed, nothing joined) and
 * runs compute on their own thread until grove_set_compute_threads is
 * called again.  g_cfg_mu is held across fork so that the child never
 * inherits it locked. */
static void fork_prepare(void) {
  pthread_mutex_lock(&g_cfg_mu);
}
static void fork_parent(void) {
  pthread_mutex_unlock(&g_cfg_mu);
}
static void fork_child(void) {
  int n = atomic_exchange(&g_npools, 0);
  for (int i = 0; i < n; i++) {
    pool *pl = atomic_exchange(&g_pools[i], NULL);
    free(pl->threads);
    free(pl);
  }
  atomic_store(&g_threads, 1);
  pthread_mutex_unlock(&g_cfg_mu);
}

static void pools_atexit(void) {
  pthread_mutex_lock(&g_cfg_mu);
  pools_free_all();
  atomic_store(&g_threads, 1);
  pthread_mutex_unlock(&g_cfg_mu);
}

int grove_available_cores(void) {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? (int)n : 1;
}

void grove_set_compute_threads(int n) {
  if (n < 1) n = 1;
  openblas_set_num_threads(n);
  pthread_mutex_lock(&g_cfg_mu);
  if (!g_atexit_done) g_atexit_done = atexit(pools_atexit) == 0;
  if (!g_atfork_done) g_atfork_done = pthread_atfork(fork_prepare, fork_parent, fork_child) == 0;
  /* GROVE_GEMM_POOLS overrides the cap (tests use it to grow pools on a
   * small machine). */
  long cores = grove_available_cores();
  long cap = cores > n ? cores / n : 1;
  const char *env = getenv("GROVE_GEMM_POOLS");
  if (env && atol(env) > 0) cap = atol(env);
  atomic_store(&g_pool_cap, (int)(cap < MAX_POOLS ? cap : MAX_POOLS));
  pool *first = atomic_load(&g_pools[0]);
  int have = atomic_load(&g_npools) > 0 ? first->nhelpers + 1 : 1;
  if (have != n || atomic_load(&g_threads) != n) {
    pools_free_all();
    first = n > 1 ? pool_new(n - 1) : NULL;
    if (first) {
      atomic_store(&g_pools[0], first);
      atomic_store(&g_npools, 1);
    }
  }
  int got = first ? first->nhelpers + 1 : 1;
  atomic_store(&g_threads, got);
  pthread_mutex_unlock(&g_cfg_mu);
  if (got < n)
    grove__log(GROVE_LOG_WARN, "gemm.threads", "could start only %d of %d compute threads", got, n);
}

int grove_compute_threads(void) {
  return atomic_load(&g_threads);
}

/* ================================================================ run */

/* Below this many multiply-adds a product is not worth a hand-off (about a
 * microsecond when the helper is spinning). */
#define MIN_THREADED_MACS (128 * 1024)

/* A pool this run now owns (its busy flag set), or NULL: compute alone. */
static pool *pool_acquire(int threads) {
  int n = atomic_load_explicit(&g_npools, memory_order_acquire);
  for (int i = 0; i < n; i++) {
    pool *pl = atomic_load_explicit(&g_pools[i], memory_order_relaxed);
    if (!atomic_flag_test_and_set_explicit(&pl->busy, memory_order_acquire)) return pl;
  }
  if (n >= atomic_load(&g_pool_cap) || pthread_mutex_trylock(&g_cfg_mu) != 0) return NULL;
  /* Once per extra concurrent worker, not per run: starts threads. */
  pool *pl = NULL;
  n = atomic_load(&g_npools);
  if (n > 0 && n < atomic_load(&g_pool_cap) && atomic_load(&g_threads) == threads &&
      (pl = pool_new(threads - 1)) != NULL) {
    atomic_flag_test_and_set(&pl->busy);
    atomic_store_explicit(&g_pools[n], pl, memory_order_relaxed);
    atomic_store_explicit(&g_npools, n + 1, memory_order_release);
  }
  pthread_mutex_unlock(&g_cfg_mu);
  return pl;
}

/* Posts the job the caller has filled into pl->cur as `chunks` chunks,
 * computes what it can claim and returns when every chunk is done. */
static void pool_go(pool *pl, int64_t chunks) {
  assert(chunks >= 1 && chunks <= MAX_CHUNKS);
  uint32_t g = post_job(pl, (uint32_t)chunks);
  claim_chunks(pl, g);
  int64_t t0 = 0;
  int spins = 0;
  while (atomic_load_explicit(&pl->done, memory_order_acquire) < chunks) {
    /* Only chunks a helper is computing right now are left.  Should its
     * core have been taken (by another process, or by the hypervisor), give
     * ours up so that it can finish. */
    cpu_relax();
    if (++spins % 256 == 0) {
      if (!t0)
        t0 = grove__clock_ns();
      else if (grove__clock_ns() - t0 > CALLER_SPIN_NS)
        sched_yield();
    }
  }
}

#if GEMM_HAVE_AVX512
/* Runs one product on the pool, which the caller has just taken. */
static void pool_run(pool *pl, int threads, const grove__linear_pack *p, const float *x, int64_t M,
                     const float *bias, float *y, int relu) {
  job *jb = &pl->cur;
  *jb = (job){.p = p, .x = x, .bias = bias, .y = y, .M = M, .relu = relu};
  int64_t chunks;
  if (p->npanels >= threads) {
    jb->panels_per_chunk = (p->npanels + MAX_CHUNKS - 1) / MAX_CHUNKS;
    chunks = (p->npanels + jb->panels_per_chunk - 1) / jb->panels_per_chunk;
  } else {
    /* About four row groups per thread, so that a late helper still finds
     * work and a slow one does not hold up the end. */
    int64_t blocks = (M + MR - 1) / MR;
    int64_t per = (blocks + 4 * threads - 1) / (4 * threads);
    jb->by_rows = true;
    jb->rows_per_chunk = per * MR;
    chunks = (blocks + per - 1) / per;
  }
  pool_go(pl, chunks);
}
#endif

void grove__linear_run(const grove__linear_pack *p, const float *x, int64_t M, const float *bias,
                       float *y, grove__act act) {
  assert(p && M >= 0);
  const int relu = act == GROVE__ACT_RELU;
  if (M == 0 || p->N == 0) return;
  if (p->kind == KIND_BLAS) {
    blas_run(p, x, M, bias, y, relu);
    return;
  }
#if GEMM_HAVE_AVX512
  int threads = atomic_load_explicit(&g_threads, memory_order_relaxed);
  double macs = (double)M * (double)p->N * (double)p->K;
  if (threads > 1 && macs >= MIN_THREADED_MACS && (p->npanels > 1 || M > MR)) {
    pool *pl = pool_acquire(threads);
    if (pl) {
      pool_run(pl, pl->nhelpers + 1, p, x, M, bias, y, relu);
      atomic_flag_clear_explicit(&pl->busy, memory_order_release);
      return;
    }
  }
  packed_part(p, x, bias, y, relu, 0, M, 0, p->npanels);
#endif
}

void grove__linear_run_alone(const grove__linear_pack *p, const float *x, int64_t M,
                             const float *bias, float *y, grove__act act) {
  assert(p && M >= 0);
  if (M == 0 || p->N == 0) return;
  if (p->kind == KIND_BLAS) {
    blas_run(p, x, M, bias, y, act == GROVE__ACT_RELU);
    return;
  }
#if GEMM_HAVE_AVX512
  packed_part(p, x, bias, y, act == GROVE__ACT_RELU, 0, M, 0, p->npanels);
#endif
}

bool grove__linear_pack_native(const grove__linear_pack *p) {
  return p && p->kind != KIND_BLAS;
}

static const char *kind_name(int kind) {
  return kind == KIND_AVX512 ? "avx512" : kind == KIND_AVX2 ? "avx2" : "blas";
}

const char *grove__linear_pack_kernel(const grove__linear_pack *p) {
  return kind_name(p->kind);
}

const char *grove_compute_kernel(void) {
  return kind_name(choose_kind());
}

/* ================================================================ parallel for */

void grove__parallel_for(int64_t n, int64_t grain, void (*fn)(void *ctx, int64_t begin, int64_t end),
                         void *ctx) {
  assert(fn);
  if (n <= 0) return;
  if (grain < 1) grain = 1;
  int threads = atomic_load_explicit(&g_threads, memory_order_relaxed);
  if (threads > 1 && n > grain) {
    /* The claim word counts at most MAX_CHUNKS chunks. */
    if ((n + grain - 1) / grain > MAX_CHUNKS) grain = (n + MAX_CHUNKS - 1) / MAX_CHUNKS;
    pool *pl = pool_acquire(threads);
    if (pl) {
      pl->cur = (job){.fn = fn, .ctx = ctx, .n = n, .grain = grain};
      pool_go(pl, (n + grain - 1) / grain);
      atomic_flag_clear_explicit(&pl->busy, memory_order_release);
      return;
    }
  }
  if (grove__yield_every_ns) {
    /* A background thread (core/base/yield.c): the chunks' ends are its yield
     * points, as they would be a pool's hand-offs. */
    for (int64_t b = 0; b < n; b += grain) {
      fn(ctx, b, n - b < grain ? n : b + grain);
      grove__yield_point();
    }
    return;
  }
  fn(ctx, 0, n);
}

/* ================================================================ general products */

/* grove__gemm (kernels.h): C = op(A) . op(B) (+ C) for operands that change
 * at every call, as training's do.  The AVX-512 path packs op(B) into the
 * panels of the Linear kernel (into the caller's workspace, so nothing is
 * allocated) and runs the same register tiles over it (gtile: tile() without
 * bias and ReLU, adding C at the end), giving op(A) to them as rows,
 * transposed first when its rows are not contiguous; the packing is
 * O(NK + MK) against O(MNK) of arithmetic.  When op(B) is the large operand
 * and would need a transposing pack (y = x . W^T: B is the weight, M the
 * batch), the product is computed the other way round, C^T = op(B)^T .
 * op(A)^T: W's rows are then the tiles' rows as they are, only x is packed,
 * and the [N, M] result is transposed into C.  The BLAS path is one
 * cblas_sgemm. */

/* Rows of the tiles' output per chunk (at most: gemm_avx512 halves it for a
 * product with few chunks), and rows of op(B) per unit of a transposing
 * pack. */
enum { GEMM_ROWS_PER_CHUNK = 16 * MR, PACK_T_ROWS = 64 };

static int gemm_kind(void) {
  return choose_kind();
}

/* What the AVX-512 path does for these arguments. */
typedef struct gemm_plan {
  bool swap;          /* computes C^T = op(B)^T . op(A)^T into scratch */
  bool pack_a;        /* the tiles' rows need a transposed copy */
  int64_t rows, cols; /* the tiles' product: [rows, cols] over depth */
  int64_t depth;
  int64_t npanels;
  size_t pack_floats; /* the packed right-hand side */
  size_t a_floats;    /* the rows' copy, when pack_a */
  size_t out_floats;  /* the [N, M] result, when swap */
} gemm_plan;

static gemm_plan gemm_plan_make(int flags, int64_t M, int64_t N, int64_t K) {
  gemm_plan pl = {0};
  const bool ta = flags & GROVE__GEMM_TRANS_A, tb = flags & GROVE__GEMM_TRANS_B;
  /* Swapped, op(B)^T is B as stored when tb, and op(A)^T packs from A
   * whatever ta is; so swapping pays when tb and B is the larger side. */
  pl.swap = tb && N > M;
  pl.rows = pl.swap ? N : M;
  pl.cols = pl.swap ? M : N;
  pl.depth = K;
  pl.pack_a = !pl.swap && ta;
  pl.npanels = (pl.cols + NR - 1) / NR;
  pl.pack_floats = (size_t)pl.npanels * NR * (size_t)K;
  pl.a_floats = pl.pack_a ? (size_t)M * (size_t)K : 0;
  pl.out_floats = pl.swap ? (size_t)M * (size_t)N : 0;
  return pl;
}

/* Floats rounded up to whole 64-byte lines, so that each region of the
 * workspace starts aligned. */
static size_t gemm_lines(size_t floats) {
  return (floats + 15) / 16 * 16;
}

size_t grove__gemm_ws_size(int flags, int64_t M, int64_t N, int64_t K) {
  if (M <= 0 || N <= 0 || K <= 0 || gemm_kind() != KIND_AVX512) return 0;
  gemm_plan pl = gemm_plan_make(flags, M, N, K);
  return (gemm_lines(pl.pack_floats) + gemm_lines(pl.a_floats) + gemm_lines(pl.out_floats)) *
         sizeof(float);
}

#if GEMM_HAVE_AVX512

GROVE__TARGET_PUSH("avx512f,avx512vl,fma")

/* dst[c * ldd + r] (+)= src[r * lds + c] for r < nr, c < nc (both <= 16):
 * one 16 x 16 block through registers.  Rows past nr and columns past nc
 * read as zero; the block writes out_rows rows of out_cols floats (the
 * caller asks for more than nc x nr to zero-fill a panel's padding). */
static inline void t16(const float *src, int64_t lds, int nr, int nc, float *dst, int64_t ldd,
                       int out_rows, int out_cols, bool accumulate) {
  __m512 r[16], t[16];
  const __mmask16 cm = (__mmask16)((1u << nc) - 1u);
#pragma GCC unroll 16
  for (int i = 0; i < 16; i++)
    r[i] = i < nr ? _mm512_maskz_loadu_ps(cm, src + i * lds) : _mm512_setzero_ps();
#pragma GCC unroll 8
  for (int i = 0; i < 8; i++) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
#pragma GCC unroll 4
  for (int i = 0; i < 4; i++) {
    r[4 * i + 0] = _mm512_shuffle_ps(t[4 * i + 0], t[4 * i + 2], 0x44);
    r[4 * i + 1] = _mm512_shuffle_ps(t[4 * i + 0], t[4 * i + 2], 0xEE);
    r[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
    r[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
  }
  /* r[4i + c], lane L: column 4L + c of rows 4i .. 4i + 3. */
#pragma GCC unroll 4
  for (int c = 0; c < 4; c++) {
    __m512 v0 = _mm512_shuffle_f32x4(r[c], r[4 + c], 0x88);
    __m512 v1 = _mm512_shuffle_f32x4(r[c], r[4 + c], 0xDD);
    __m512 v2 = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0x88);
    __m512 v3 = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0xDD);
    t[c] = _mm512_shuffle_f32x4(v0, v2, 0x88);
    t[8 + c] = _mm512_shuffle_f32x4(v0, v2, 0xDD);
    t[4 + c] = _mm512_shuffle_f32x4(v1, v3, 0x88);
    t[12 + c] = _mm512_shuffle_f32x4(v1, v3, 0xDD);
  }
  const __mmask16 om = (__mmask16)((1u << out_cols) - 1u);
#pragma GCC unroll 16
  for (int c = 0; c < 16; c++) {
    if (c >= out_rows) break;
    __m512 v = t[c];
    if (accumulate) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(om, dst + c * ldd));
    _mm512_mask_storeu_ps(dst + c * ldd, om, v);
  }
}

/* dst[c * ldd + r] (+)= src[r * lds + c] over rows [r0, r1) of src and all
 * its cols. */
static void transpose_rows(const float *src, int64_t lds, int64_t r0, int64_t r1, int64_t cols,
                           float *dst, int64_t ldd, bool accumulate) {
  for (int64_t r = r0; r < r1; r += 16) {
    int nr = (int)(r1 - r < 16 ? r1 - r : 16);
    for (int64_t c = 0; c < cols; c += 16) {
      int nc = (int)(cols - c < 16 ? cols - c : 16);
      t16(src + r * lds + c, lds, nr, nc, dst + c * ldd + r, ldd, nc, nr, accumulate);
    }
  }
}

/* Rows [k0, k1) of op(B) [K, N], op(B)[k, n] = B[k * ldb + n], into every
 * panel of pack (layout of grove__linear_pack: panel pi at pi * K * NR, K
 * rows of its width w, zero past N).  Row by row, so that B is read in
 * order: a panel at a time would read 256 bytes per 4 KB page of a
 * 1024-wide B, which the prefetchers do not follow. */
static void pack_rows(const float *B, int64_t ldb, int64_t N, int64_t K, int64_t npanels,
                      int64_t k0, int64_t k1, float *pack) {
  for (int64_t k = k0; k < k1; k++) {
    const float *s = B + k * ldb;
    for (int64_t pi = 0; pi < npanels; pi++) {
      const int w = panel_width(N, pi);
      const int64_t n0 = pi * NR;
      const int ncols = (int)(N - n0 < NR ? N - n0 : NR);
      float *dst = pack + pi * K * NR + k * w;
      for (int j = 0; j < w; j += 16) {
        int v = ncols - j;
        v = v < 0 ? 0 : v > 16 ? 16 : v;
        _mm512_store_ps(dst + j, _mm512_maskz_loadu_ps((__mmask16)((1u << v) - 1u), s + n0 + j));
      }
    }
  }
}

/* Rows [k0, k1) (multiples of 16 but for K) of panel pi of op(B) [K, N],
 * op(B)[k, n] = B[n * ldb + k], into their place in pack (as pack_rows): the
 * rows n0 + j of B are the panel's columns j, through 16 x 16 transposes. */
static void pack_panel_t(const float *B, int64_t ldb, int64_t N, int64_t K, int64_t pi, int64_t k0,
                         int64_t k1, float *pack) {
  const int w = panel_width(N, pi);
  const int64_t n0 = pi * NR;
  const int ncols = (int)(N - n0 < NR ? N - n0 : NR);
  float *dst = pack + pi * K * NR;
  for (int j = 0; j < w; j += 16) {
    int nr = ncols - j;
    nr = nr < 0 ? 0 : nr > 16 ? 16 : nr;
    for (int64_t k = k0; k < k1; k += 16) {
      int nk = (int)(K - k < 16 ? K - k : 16);
      t16(B + (n0 + j) * ldb + k, ldb, nr, nk, dst + k * w + j, w, nk, 16, false);
    }
  }
}

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
  tile_fma(mr, NV, K, A, lda, B, acc);
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

typedef void (*gtile_fn)(int64_t K, const float *A, int64_t lda, const float *B, float *c,
                         int64_t ldc, int ncols, bool add);

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
static const gtile_fn gtiles[MR][4] = {GTILE_REF(1), GTILE_REF(2), GTILE_REF(3),
                                       GTILE_REF(4), GTILE_REF(5), GTILE_REF(6)};

typedef struct gemm_job {
  gemm_plan pl;
  /* The tiles' operands: rows of a (row i at a + i * lda, contiguous over
   * depth), the packed right-hand side, the output c (row i at c + i * ldc). */
  const float *a;
  int64_t lda;
  float *pack;
  float *c;
  int64_t ldc;
  bool accumulate;
  /* Packing: op(B) as given (pack_rows, or pack_panel_t when tb) in bunits
   * units (16 rows, or panels), then op(A) when pack_a. */
  const float *b;
  int64_t ldb;
  bool tb;
  const float *a_src;
  int64_t a_src_ld;
  float *a_copy;
  int64_t bunits;
  int64_t rpc; /* rows per chunk, a multiple of MR */
} gemm_job;

static void gemm_pack_fn(void *ctx, int64_t begin, int64_t end) {
  gemm_job *j = ctx;
  const int64_t K = j->pl.depth;
  for (int64_t i = begin; i < end; i++) {
    grove__yield_point();
    if (i < j->bunits && j->tb) {
      /* Units of PACK_T_ROWS rows of a panel, so that a batch's one panel
       * (y = x W^T swapped) still spreads over the threads. */
      const int64_t per = (K + PACK_T_ROWS - 1) / PACK_T_ROWS;
      const int64_t k0 = i % per * PACK_T_ROWS, k1 = k0 + PACK_T_ROWS < K ? k0 + PACK_T_ROWS : K;
      pack_panel_t(j->b, j->ldb, j->pl.cols, K, i / per, k0, k1, j->pack);
    } else if (i < j->bunits) {
      int64_t k0 = i * 16, k1 = k0 + 16 < K ? k0 + 16 : K;
      pack_rows(j->b, j->ldb, j->pl.cols, K, j->pl.npanels, k0, k1, j->pack);
    } else {
      /* op(A) = A^T, A stored [K, M]: its rows 16 (i - bunits) .. as
       * columns of the copy [M, K]. */
      int64_t k0 = (i - j->bunits) * 16;
      int64_t k1 = k0 + 16 < j->pl.depth ? k0 + 16 : j->pl.depth;
      transpose_rows(j->a_src, j->a_src_ld, k0, k1, j->pl.rows, j->a_copy, j->pl.depth, false);
    }
  }
}

/* Chunk c: rows [rpc * (c / npanels), ...) x panel c % npanels, so that
 * consecutive chunks on one thread reuse the same rows of a from L2.  K is
 * cut into blocks as in packed_part. */
static void gemm_tiles_fn(void *ctx, int64_t begin, int64_t end) {
  const gemm_job *j = ctx;
  const int64_t R = j->pl.rows, N = j->pl.cols, K = j->pl.depth;
  const int64_t kblocks = K > KC ? (K + KC - 1) / KC : 1;
  const int64_t kc = (K + kblocks - 1) / kblocks;
  for (int64_t c = begin; c < end; c++) {
    grove__yield_point();
    const int64_t pi = c % j->pl.npanels;
    const int64_t r0 = c / j->pl.npanels * j->rpc;
    const int64_t r1 = r0 + j->rpc < R ? r0 + j->rpc : R;
    const int w = panel_width(N, pi);
    const int64_t n0 = pi * NR;
    const int ncols = (int)(N - n0 < NR ? N - n0 : NR);
    const float *B = j->pack + pi * K * NR;
    for (int64_t kb = 0; kb < kblocks; kb++) {
      const int64_t k0 = kb * kc, kn = K - k0 < kc ? K - k0 : kc;
      const bool add = kb > 0 || j->accumulate;
      for (int64_t i = r0; i < r1; i += MR) {
        int mr = (int)(r1 - i < MR ? r1 - i : MR);
        gtiles[mr - 1][w / 16 - 1](kn, j->a + i * j->lda + k0, j->lda, B + k0 * w,
                                   j->c + i * j->ldc + n0, j->ldc, ncols, add);
      }
    }
  }
}

typedef struct gemm_out_job {
  const float *src; /* [N, M] */
  float *c;
  int64_t M, N, ldc;
  bool accumulate;
} gemm_out_job;

/* Rows [begin, end) of the [N, M] result into columns of C. */
static void gemm_out_fn(void *ctx, int64_t begin, int64_t end) {
  const gemm_out_job *o = ctx;
  transpose_rows(o->src, o->M, begin, end, o->M, o->c, o->ldc, o->accumulate);
}

static void gemm_avx512(int flags, int64_t M, int64_t N, int64_t K, const float *A, int64_t lda,
                        const float *B, int64_t ldb, float *C, int64_t ldc, void *ws) {
  const bool ta = flags & GROVE__GEMM_TRANS_A, tb = flags & GROVE__GEMM_TRANS_B;
  const bool acc = flags & GROVE__GEMM_ACCUMULATE;
  gemm_job j = {.pl = gemm_plan_make(flags, M, N, K)};
  float *p = ws;
  j.pack = p;
  p += gemm_lines(j.pl.pack_floats);
  if (j.pl.swap) {
    /* C^T [N, M] = op(B)^T . op(A)^T: the tiles' rows are B's rows as
     * stored (tb), the right-hand side is op(A)^T, whose element (k, m) is
     * A[m * lda + k] (a transposing pack) or, with ta, A[k * lda + m]. */
    j.a = B;
    j.lda = ldb;
    j.b = A;
    j.ldb = lda;
    j.tb = !ta;
    j.c = p + gemm_lines(j.pl.a_floats);
    j.ldc = M;
    j.accumulate = false;
  } else {
    j.b = B;
    j.ldb = ldb;
    j.tb = tb;
    j.c = C;
    j.ldc = ldc;
    j.accumulate = acc;
    if (j.pl.pack_a) {
      j.a_src = A;
      j.a_src_ld = lda;
      j.a_copy = p;
      j.a = p;
      j.lda = K;
    } else {
      j.a = A;
      j.lda = lda;
    }
  }
  const int threads = atomic_load_explicit(&g_threads, memory_order_relaxed);
  const bool par = threads > 1 && (double)M * (double)N * (double)K >= MIN_THREADED_MACS;
  j.bunits = j.tb ? j.pl.npanels * ((K + PACK_T_ROWS - 1) / PACK_T_ROWS) : (K + 15) / 16;
  const int64_t packs = j.bunits + (j.pl.pack_a ? (K + 15) / 16 : 0);
  /* Fewer rows per chunk when the product has few chunks (one panel, or
   * few rows), so that about eight per thread keep the threads even. */
  j.rpc = GEMM_ROWS_PER_CHUNK;
  while (par && j.rpc > MR && (j.pl.rows + j.rpc - 1) / j.rpc * j.pl.npanels < 8 * threads)
    j.rpc /= 2;
  const int64_t chunks = (j.pl.rows + j.rpc - 1) / j.rpc * j.pl.npanels;
  if (par) {
    grove__parallel_for(packs, 1, gemm_pack_fn, &j);
    grove__parallel_for(chunks, 1, gemm_tiles_fn, &j);
  } else {
    gemm_pack_fn(&j, 0, packs);
    gemm_tiles_fn(&j, 0, chunks);
  }
  if (j.pl.swap) {
    gemm_out_job o = {.src = j.c, .c = C, .M = M, .N = N, .ldc = ldc, .accumulate = acc};
    if (par)
      grove__parallel_for(N, 64, gemm_out_fn, &o);
    else
      gemm_out_fn(&o, 0, N);
  }
}

GROVE__TARGET_POP

#endif /* GEMM_HAVE_AVX512 */

void grove__gemm(int flags, int64_t M, int64_t N, int64_t K, const float *A, int64_t lda,
                 const float *B, int64_t ldb, float *C, int64_t ldc, void *ws, size_t ws_bytes) {
  assert(M >= 0 && N >= 0 && K >= 0);
  const bool acc = flags & GROVE__GEMM_ACCUMULATE;
  if (M == 0 || N == 0) return;
  if (K == 0) {
    if (!acc)
      for (int64_t i = 0; i < M; i++) memset(C + i * ldc, 0, (size_t)N * sizeof(float));
    return;
  }
#if GEMM_HAVE_AVX512
  /* The size is checked rather than trusted: GROVE_GEMM may have changed
   * since the caller asked for it. */
  const size_t need = grove__gemm_ws_size(flags, M, N, K);
  if (ws && need > 0 && ws_bytes >= need) {
    gemm_avx512(flags, M, N, K, A, lda, B, ldb, C, ldc, ws);
    return;
  }
#endif
  (void)ws;
  (void)ws_bytes;
  cblas_sgemm(CblasRowMajor, flags & GROVE__GEMM_TRANS_A ? CblasTrans : CblasNoTrans,
              flags & GROVE__GEMM_TRANS_B ? CblasTrans : CblasNoTrans, (blasint)M, (blasint)N,
              (blasint)K, 1.0f, A, (blasint)lda, B, (blasint)ldb, acc ? 1.0f : 0.0f, C,
              (blasint)ldc);
}
