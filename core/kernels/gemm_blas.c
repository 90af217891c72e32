/* gemm_blas.c: the GEMM's OpenBLAS path (gemm_internal.h says how the GEMM's
 * files share the work), for a CPU without AVX2 or AVX-512, GROVE_GEMM=blas,
 * and a general product without a workspace.  The only file of core/ that
 * calls OpenBLAS's GEMM.
 *
 * A Linear layer's W is kept as it is ([N, K] row-major) and the product goes
 * through cblas_sgemv (one row) or cblas_sgemm, followed by one pass of bias
 * and ReLU over the cache-hot output. */
#include <cblas.h>
#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "gemm_internal.h"

/* openblas_set_num_threads is an OpenBLAS extension that cblas.h from
 * libopenblas-dev declares; declare it again so a generic cblas.h also
 * compiles (the link still needs OpenBLAS). */
void openblas_set_num_threads(int num_threads);

void grove__gemm_blas_linear(const grove__linear_pack *p, const float *x, int64_t M,
                             const float *bias, float *y, bool relu) {
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

void grove__gemm_blas(int flags, int64_t M, int64_t N, int64_t K, const float *A, int64_t lda,
                      const float *B, int64_t ldb, float *C, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, flags & GROVE__GEMM_TRANS_A ? CblasTrans : CblasNoTrans,
              flags & GROVE__GEMM_TRANS_B ? CblasTrans : CblasNoTrans, (blasint)M, (blasint)N,
              (blasint)K, 1.0f, A, (blasint)lda, B, (blasint)ldb,
              flags & GROVE__GEMM_ACCUMULATE ? 1.0f : 0.0f, C, (blasint)ldc);
}

void grove__gemm_blas_threads(int n) {
  openblas_set_num_threads(n);
}
