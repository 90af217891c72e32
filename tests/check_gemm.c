/* check_gemm.c: grove__linear_pack / grove__linear_run against a naive
 * double-precision reference (rtol 1e-4, atol 1e-5), on odd and real
 * shapes, both activations, with and without bias, with 1 and 2 compute
 * threads, on every kernel (the AVX-512 one where the CPU has it, the AVX2
 * one forced by GROVE_GEMM=avx2, and the BLAS one forced by
 * GROVE_GEMM=blas), and with two threads running the
 * same pack at once.  grove__parallel_for, on the same pools: every index
 * exactly once, in chunks of the grain, on 1, 2 and 3 compute threads, and
 * from two threads at once.  grove__gemm, the general product training
 * uses: every transpose and accumulate combination on odd and real shapes,
 * padded leading dimensions, K over several blocks, 1 and 2 threads, both
 * kernels, against a double-precision reference. */
#include <dirent.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "gemm_internal.h"
#include "internal.h"
#include "testutil.h"

#define RTOL 1e-4
#define ATOL 1e-5

static float frand(unsigned *s) {
  *s = *s * 1664525u + 1013904223u;
  return (float)((*s >> 8) & 0xFFFF) / 32768.0f - 1.0f;
}

static float *rand_buf(int64_t n, unsigned seed, float scale) {
  float *p = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
  ck_assert_ptr_nonnull(p);
  for (int64_t i = 0; i < n; i++) p[i] = frand(&seed) * scale;
  return p;
}

/* y = act(x . W^T + b) in double, rounded to float at the end. */
static void reference(const float *W, const float *x, const float *b, int64_t M, int64_t N,
                      int64_t K, grove__act act, float *y) {
  for (int64_t i = 0; i < M; i++)
    for (int64_t j = 0; j < N; j++) {
      double s = b ? b[j] : 0.0;
      for (int64_t k = 0; k < K; k++) s += (double)x[i * K + k] * (double)W[j * K + k];
      if (act == GROVE__ACT_RELU && s < 0) s = 0;
      y[i * N + j] = (float)s;
    }
}

/* Runs one shape and compares; a sentinel past the end of y catches
 * writes beyond M*N (ASan catches the rest). */
static void check_shape(int64_t M, int64_t N, int64_t K, bool with_bias, grove__act act) {
  unsigned seed = (unsigned)(M * 7919 + N * 131 + K * 17 + with_bias * 3 + act);
  /* Scaled so that every output is O(1) whatever K is. */
  float wscale = K > 0 ? 1.0f / (float)K : 1.0f;
  float *W = rand_buf(N * K, seed, wscale * 4.0f);
  float *x = rand_buf(M * K, seed + 1, 1.0f);
  float *b = with_bias ? rand_buf(N, seed + 2, 0.5f) : NULL;
  float *want = malloc((size_t)(M * N > 0 ? M * N : 1) * sizeof(float));
  float *got = malloc((size_t)(M * N + 16) * sizeof(float));
  ck_assert_ptr_nonnull(want);
  ck_assert_ptr_nonnull(got);
  for (int64_t i = 0; i < M * N + 16; i++) got[i] = -12345.0f;
  reference(W, x, b, M, N, K, act, want);

  grove__linear_pack *p = grove__linear_pack_new(W, N, K);
  ck_assert_ptr_nonnull(p);
  /* The pack owns a copy: scribbling on W afterwards must not matter. */
  for (int64_t i = 0; i < N * K; i++) W[i] = 1e30f;
  grove__linear_run(p, x, M, b, got, act);
  long bad = grove_test_allclose(got, want, (size_t)(M * N), RTOL, ATOL);
  ck_assert_msg(bad < 0, "M=%lld N=%lld K=%lld bias=%d act=%d threads=%d: y[%ld] = %g, want %g",
                (long long)M, (long long)N, (long long)K, with_bias, act, grove_compute_threads(),
                bad, bad < 0 ? 0.0 : got[bad], bad < 0 ? 0.0 : want[bad]);
  for (int i = 0; i < 16; i++) ck_assert_float_eq(got[M * N + i], -12345.0f);
  grove__linear_pack_free(p);
  free(W);
  free(x);
  free(b);
  free(want);
  free(got);
}

static const int64_t Ms[] = {1, 2, 3, 7, 33, 64, 257};
static const int64_t KNs[] = {1, 3, 17, 784, 1024, 10};
#define COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))

/* Every M against every (N, K) pair would take minutes under ASan for the
 * large pairs; all small pairs run with every M, the large ones with a
 * spread of M that still covers 1, a tail and a multi-block batch. */
static void check_all_shapes(bool with_bias, grove__act act) {
  for (int a = 0; a < COUNT(KNs); a++)
    for (int c = 0; c < COUNT(KNs); c++) {
      int64_t N = KNs[a], K = KNs[c];
      for (int m = 0; m < COUNT(Ms); m++) {
        int64_t M = Ms[m];
        if (N * K >= 784 * 784 && M != 1 && M != 7 && M != 64) continue;
        check_shape(M, N, K, with_bias, act);
      }
    }
}

/* _i (the loop index of a Check loop test) picks the case: bit 0 bias, bit
 * 1 ReLU, bit 2 two threads. */
static void run_case(int i) {
  grove_set_compute_threads(i & 4 ? 2 : 1);
  ck_assert_int_eq(grove_compute_threads(), i & 4 ? 2 : 1);
  check_all_shapes(i & 1, i & 2 ? GROVE__ACT_RELU : GROVE__ACT_NONE);
  grove_set_compute_threads(1);
}

START_TEST(test_shapes_default_kernel) {
  unsetenv("GROVE_GEMM");
  run_case(_i);
}
END_TEST

START_TEST(test_shapes_blas_kernel) {
  setenv("GROVE_GEMM", "blas", 1);
  run_case(_i);
  unsetenv("GROVE_GEMM");
}
END_TEST

/* The AVX2 kernel, forced (GROVE_GEMM=avx2) on a CPU that also has
 * AVX-512; what an AVX2-only CPU (AMD Zen 2 and 3) runs by default.
 * Skipped, said so, on a CPU without AVX2. */
static bool have_avx2(void) {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return true;
  fprintf(stderr, "check_gemm: no AVX2 on this CPU; the AVX2 kernel is not tested\n");
  return false;
}

START_TEST(test_shapes_avx2_kernel) {
  if (!have_avx2()) return;
  setenv("GROVE_GEMM", "avx2", 1);
  float w[6] = {1, 2, 3, 4, 5, 6};
  grove__linear_pack *p = grove__linear_pack_new(w, 2, 3);
  ck_assert_str_eq(grove__linear_pack_kernel(p), "avx2");
  ck_assert(grove__linear_pack_native(p));
  grove__linear_pack_free(p);
  run_case(_i);
  unsetenv("GROVE_GEMM");
}
END_TEST

/* K longer than one block of the packed kernels (1024): partial sums go
 * through y, and bias and ReLU must come only with the last block.  _i:
 * bit 0 two threads, bit 1 the AVX2 kernel. */
START_TEST(test_long_k) {
  unsetenv("GROVE_GEMM");
  if (_i & 2) {
    if (!have_avx2()) return;
    setenv("GROVE_GEMM", "avx2", 1);
  }
  grove_set_compute_threads(_i & 1 ? 2 : 1);
  static const int64_t shapes[][3] = {
      {1, 17, 1025}, {7, 70, 2500}, {33, 130, 2049}, {64, 10, 3000}, {3, 1, 4097}};
  for (int s = 0; s < COUNT(shapes); s++) {
    check_shape(shapes[s][0], shapes[s][1], shapes[s][2], true, GROVE__ACT_RELU);
    check_shape(shapes[s][0], shapes[s][1], shapes[s][2], false, GROVE__ACT_NONE);
  }
  grove_set_compute_threads(1);
  unsetenv("GROVE_GEMM");
}
END_TEST

#if GROVE__X86_SIMD
/* One register tile with GROVE__TILE_RELU6 (kind: 0 AVX-512 plain, 1
 * AVX-512 prefetching, 2 AVX2), mr rows over a panel 16 * nv wide of which
 * ncols are written, K steps, from zero or (acc) from y: every output is
 * the reference clamped to [0, 6], the NaN of column 0's bias passes as in
 * grove__act_apply, and nothing past ncols is written. */
/* Bk ([K][w], element (k, j) at [k * w + j]) as one packed panel for a
 * tile of kind (check_tile_relu6): AVX-512's k-major rows of w, or AVX2's
 * 16-column strips K * 16 apart.  64-byte aligned; the caller frees it. */
static float *tile_panel(int kind, const float *Bk, int64_t K, int w) {
  float *B = aligned_alloc(64, (size_t)(K * w) * sizeof(float));
  ck_assert_ptr_nonnull(B);
  for (int64_t k = 0; k < K; k++)
    for (int j = 0; j < w; j++)
      B[kind == 2 ? (j / 16) * K * 16 + k * 16 + j % 16 : k * w + j] = Bk[k * w + j];
  return B;
}

static int at_six, at_zero; /* outputs clamped to either end, over the calls */
static void check_tile_relu6(int kind, int mr, int nv, int ncols, int64_t K, bool acc) {
  const int w = 16 * nv;
  const int64_t ldy = w + 8;
  unsigned seed = (unsigned)(kind * 1000 + mr * 100 + nv * 10 + ncols + K * 7 + acc);
  float *A = rand_buf(GROVE__GEMM_MR * K, seed, 1.0f);
  float *Bk = rand_buf(K * w, seed + 1, 12.0f / (float)K); /* element (k, j) at [k * w + j] */
  float *bias = rand_buf(w, seed + 2, 3.0f);
  float *B = tile_panel(kind, Bk, K, w);
  float *y = malloc((size_t)(GROVE__GEMM_MR * ldy) * sizeof(float));
  ck_assert_ptr_nonnull(y);
  bias[0] = NAN;
  for (int64_t i = 0; i < GROVE__GEMM_MR * ldy; i++) y[i] = acc ? 2.0f : -12345.0f;
  const int flags = GROVE__TILE_RELU6 | (acc ? GROVE__TILE_ACCUMULATE : 0);
  if (kind == 2)
    grove__gemm_tiles2[mr - 1][nv - 1](K, A, K, B, K * 16, bias, y, ldy, ncols, flags);
  else
    grove__gemm_tiles512[kind][mr - 1][nv - 1](K, A, K, B, (const char *)B, bias, y, ldy, ncols,
                                               flags);
  for (int i = 0; i < GROVE__GEMM_MR; i++)
    for (int j = 0; j < ldy; j++) {
      const float got = y[i * ldy + j];
      if (i >= mr || j >= ncols) {
        ck_assert_msg(got == (acc ? 2.0f : -12345.0f), "kind %d %dx%d: y[%d][%d] written", kind, mr,
                      ncols, i, j);
        continue;
      }
      if (j == 0) {
        ck_assert_msg(isnan(got), "kind %d %dx%d: NaN did not pass (%g)", kind, mr, ncols, got);
        continue;
      }
      double s = (acc ? 2.0 : 0.0) + bias[j];
      for (int64_t k = 0; k < K; k++) s += (double)A[i * K + k] * (double)Bk[k * w + j];
      const double want = s < 0 ? 0 : s > 6 ? 6 : s;
      ck_assert_msg(got >= 0.0f && got <= 6.0f && fabs(got - want) <= 1e-4 + 1e-4 * fabs(want),
                    "kind %d mr %d nv %d ncols %d K %lld acc %d: y[%d][%d] = %g, want %g", kind, mr,
                    nv, ncols, (long long)K, acc, i, j, got, want);
      at_six += got == 6.0f;
      at_zero += got == 0.0f;
    }
  free(A);
  free(Bk);
  free(bias);
  free(B);
  free(y);
}

/* Hardswish and Hardsigmoid inside a tile (act_flag, kind as in
 * check_tile_relu6) give the bits of the same tile without them followed by
 * grove__act_apply: values on both sides of -3 and 3, a NaN from column 0's
 * bias, from zero and accumulating; nothing past ncols is written. */
static int hard_lo, hard_hi; /* pre-activation values past either end of the gate */
static void check_tile_hard(int kind, int mr, int nv, int ncols, int64_t K, bool acc, int act_flag,
                            grove__act act) {
  const int w = 16 * nv;
  const int64_t ldy = w + 8, ny = GROVE__GEMM_MR * ldy;
  unsigned seed = (unsigned)(kind * 1000 + mr * 100 + nv * 10 + ncols + K * 7 + acc);
  float *A = rand_buf(GROVE__GEMM_MR * K, seed, 1.0f);
  float *Bk = rand_buf(K * w, seed + 1, 10.0f / (float)K);
  float *bias = rand_buf(w, seed + 2, 4.0f);
  float *B = tile_panel(kind, Bk, K, w);
  float *plain = malloc((size_t)ny * sizeof(float)), *fused = malloc((size_t)ny * sizeof(float));
  ck_assert_ptr_nonnull(plain);
  ck_assert_ptr_nonnull(fused);
  bias[0] = NAN;
  for (int pass = 0; pass < 2; pass++) {
    float *y = pass ? fused : plain;
    for (int64_t i = 0; i < ny; i++) y[i] = acc ? 1.5f : -12345.0f;
    const int flags = (pass ? act_flag : 0) | (acc ? GROVE__TILE_ACCUMULATE : 0);
    if (kind == 2)
      grove__gemm_tiles2[mr - 1][nv - 1](K, A, K, B, K * 16, bias, y, ldy, ncols, flags);
    else
      grove__gemm_tiles512[kind][mr - 1][nv - 1](K, A, K, B, (const char *)B, bias, y, ldy, ncols,
                                                 flags);
  }
  for (int i = 0; i < mr; i++) {
    for (int j = 0; j < ncols; j++) {
      hard_lo += plain[i * ldy + j] < -3.0f;
      hard_hi += plain[i * ldy + j] > 3.0f;
    }
    grove__act_apply(act, plain + i * ldy, plain + i * ldy, ncols);
  }
  for (int i = 0; i < GROVE__GEMM_MR; i++)
    for (int j = 0; j < ldy; j++) {
      const float got = fused[i * ldy + j], want = plain[i * ldy + j];
      if (i >= mr || j >= ncols) {
        ck_assert_msg(got == (acc ? 1.5f : -12345.0f), "kind %d: y[%d][%d] written", kind, i, j);
        continue;
      }
      ck_assert_msg(memcmp(&got, &want, sizeof got) == 0,
                    "kind %d mr %d nv %d ncols %d K %lld acc %d act %d: y[%d][%d] = %a, want %a",
                    kind, mr, nv, ncols, (long long)K, acc, (int)act, i, j, got, want);
    }
  float *bufs[] = {A, Bk, bias, B, plain, fused};
  for (int i = 0; i < COUNT(bufs); i++) free(bufs[i]);
}
#endif

/* ReLU6, Hardswish and Hardsigmoid inside the tiles (a 1x1 convolution's
 * ReLU6 was a pass of its own, 4.7% of MobileNetV2; Hardswish 5-6% of
 * MobileNetV3): every row count, panel width, a masked last vector, one and
 * several k steps, from zero and accumulating, on each kernel the CPU runs;
 * then through grove__linear_run over K blocks and thread counts, the same
 * bits as the product followed by grove__act_apply. */
START_TEST(test_act_in_tile) {
#if GROVE__X86_SIMD
  for (int kind = 0; kind < 3; kind++) {
    if (kind < 2 ? !grove__cpu_avx512() : !grove__cpu_avx2()) continue;
    for (int mr = 1; mr <= GROVE__GEMM_MR; mr++)
      for (int nv = 1; nv <= 4; nv++)
        for (int cut = 0; cut < 2; cut++)
          for (int K = 1; K <= 9; K += 8)
            for (int acc = 0; acc < 2; acc++)
              check_tile_relu6(kind, mr, nv, 16 * nv - (cut ? 5 : 0), K, acc);
  }
  /* Both clamps were exercised (the reference lands past 6 and below 0). */
  ck_assert(at_six > 100 && at_zero > 100);
  for (int kind = 0; kind < 3; kind++) {
    if (kind < 2 ? !grove__cpu_avx512() : !grove__cpu_avx2()) continue;
    for (int h = 0; h < 2; h++)
      for (int mr = 1; mr <= GROVE__GEMM_MR; mr++)
        for (int nv = 1; nv <= 4; nv++)
          for (int cut = 0; cut < 2; cut++)
            for (int K = 1; K <= 9; K += 8)
              for (int acc = 0; acc < 2; acc++)
                check_tile_hard(kind, mr, nv, 16 * nv - (cut ? 5 : 0), K, acc,
                                h ? GROVE__TILE_HARDSIGMOID : GROVE__TILE_HARDSWISH,
                                h ? GROVE__ACT_HARDSIGMOID : GROVE__ACT_HARDSWISH);
  }
  ck_assert(hard_lo > 100 && hard_hi > 100);
#endif
  static const int64_t shapes[][3] = {{257, 100, 1500}, {7, 24, 96}, {1, 48, 1100}};
  for (int s = 0; s < COUNT(shapes); s++) {
    const int64_t M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
    float *W = rand_buf(N * K, 11, 24.0f / (float)K), *x = rand_buf(M * K, 12, 1.0f);
    float *b = rand_buf(N, 13, 3.0f);
    float *want = malloc((size_t)(M * N) * sizeof(float));
    float *got = malloc((size_t)(M * N) * sizeof(float));
    ck_assert_ptr_nonnull(want);
    ck_assert_ptr_nonnull(got);
    grove__linear_pack *p = grove__linear_pack_new(W, N, K);
    ck_assert_ptr_nonnull(p);
    grove_set_compute_threads(1);
    static const grove__act acts[] = {GROVE__ACT_RELU6, GROVE__ACT_HARDSWISH,
                                      GROVE__ACT_HARDSIGMOID};
    for (int k = 0; k < COUNT(acts); k++) {
      grove_set_compute_threads(1);
      grove__linear_run(p, x, M, b, want, GROVE__ACT_NONE);
      grove__act_apply(acts[k], want, want, M * N);
      for (int t = 1; t <= 2; t++) {
        grove_set_compute_threads(t);
        grove__linear_run(p, x, M, b, got, acts[k]);
        ck_assert_msg(memcmp(got, want, (size_t)(M * N) * sizeof(float)) == 0,
                      "M=%lld N=%lld K=%lld threads %d: activation %d differs from the separate "
                      "pass",
                      (long long)M, (long long)N, (long long)K, t, (int)acts[k]);
      }
    }
    grove_set_compute_threads(1);
    grove__linear_pack_free(p);
    float *bufs[] = {W, x, b, want, got};
    for (int i = 0; i < COUNT(bufs); i++) free(bufs[i]);
  }
}
END_TEST

/* Products whose K spans several blocks and whose rows span several row
 * blocks (packed_part: the weight read once per block of rows, every panel
 * over a block's k range before the next k range): each row comes out bit
 * for bit as it does when it is the only row, on 1 and 2 threads, and
 * within tolerance of the reference.  A convolution's image must not depend
 * on the batch it came in (check_conv test_winograd_by_image), and this is
 * what that rests on in the kernel.  The first weight (20 x 2,500, 200 KB)
 * runs the plain tiles; the second (130 x 2,500, 1.3 MB) the tiles that
 * prefetch the next block (a weight of 256 KB or more): in the 200-row
 * product only the first tiles of each block prefetch, and a row alone is
 * a prefetching tile, so the two kinds of tile must give the same bits. */
static void check_row_blocks(int64_t M, int64_t N, int64_t K) {
  float *W = rand_buf(N * K, 5, 4.0f / (float)K);
  float *x = rand_buf(M * K, 6, 1.0f);
  float *b = rand_buf(N, 7, 0.5f);
  float *want = malloc((size_t)(M * N) * sizeof(float));
  float *all = malloc((size_t)(M * N) * sizeof(float));
  float *one = malloc((size_t)N * sizeof(float));
  ck_assert_ptr_nonnull(want);
  ck_assert_ptr_nonnull(all);
  ck_assert_ptr_nonnull(one);
  reference(W, x, b, M, N, K, GROVE__ACT_RELU, want);
  grove__linear_pack *p = grove__linear_pack_new(W, N, K);
  ck_assert_ptr_nonnull(p);
  for (int t = 1; t <= 2; t++) {
    grove_set_compute_threads(t);
    grove__linear_run(p, x, M, b, all, GROVE__ACT_RELU);
    ck_assert_int_eq(grove_test_allclose(all, want, (size_t)(M * N), RTOL, ATOL), -1);
    for (int64_t i = 0; i < M; i += 13) {
      grove__linear_run(p, x + i * K, 1, b, one, GROVE__ACT_RELU);
      ck_assert_msg(memcmp(one, all + i * N, (size_t)N * sizeof(float)) == 0,
                    "N=%lld K=%lld: row %lld of %lld differs from the row alone (threads %d)",
                    (long long)N, (long long)K, (long long)i, (long long)M, t);
    }
  }
  grove_set_compute_threads(1);
  grove__linear_pack_free(p);
  free(W);
  free(x);
  free(b);
  free(want);
  free(all);
  free(one);
}

START_TEST(test_row_blocks_bitwise) {
  unsetenv("GROVE_GEMM");
  check_row_blocks(200, 20, 2500);
  check_row_blocks(200, 130, 2500);
}
END_TEST

START_TEST(test_empty_and_degenerate) {
  /* K = 0 is Linear(0, N): the output is the bias (or zeros). */
  float b[3] = {1.0f, -2.0f, 3.0f}, y[6];
  grove__linear_pack *p = grove__linear_pack_new(NULL, 3, 0);
  ck_assert_ptr_nonnull(p);
  grove__linear_run(p, NULL, 2, b, y, GROVE__ACT_RELU);
  const float want[6] = {1, 0, 3, 1, 0, 3};
  ck_assert_int_eq(grove_test_allclose(y, want, 6, 0, 0), -1);
  grove__linear_run(p, NULL, 2, NULL, y, GROVE__ACT_NONE);
  for (int i = 0; i < 6; i++) ck_assert_float_eq(y[i], 0.0f);
  grove__linear_pack_free(p);
  /* M = 0 and N = 0 write nothing. */
  float W[4] = {1, 2, 3, 4};
  p = grove__linear_pack_new(W, 2, 2);
  ck_assert_ptr_nonnull(p);
  y[0] = 7.0f;
  grove__linear_run(p, W, 0, NULL, y, GROVE__ACT_NONE);
  ck_assert_float_eq(y[0], 7.0f);
  grove__linear_pack_free(p);
  p = grove__linear_pack_new(W, 0, 2);
  ck_assert_ptr_nonnull(p);
  grove__linear_run(p, W, 3, NULL, y, GROVE__ACT_NONE);
  ck_assert_float_eq(y[0], 7.0f);
  grove__linear_pack_free(p);
  grove__linear_pack_free(NULL);
  /* Negative sizes are refused. */
  ck_assert_ptr_null(grove__linear_pack_new(W, -1, 2));
  ck_assert_ptr_null(grove__linear_pack_new(W, 2, -1));
}
END_TEST

START_TEST(test_thread_setting) {
  grove_set_compute_threads(0);
  ck_assert_int_eq(grove_compute_threads(), 1);
  grove_set_compute_threads(-5);
  ck_assert_int_eq(grove_compute_threads(), 1);
  grove_set_compute_threads(3);
  ck_assert_int_eq(grove_compute_threads(), 3);
  grove_set_compute_threads(2);
  ck_assert_int_eq(grove_compute_threads(), 2);
  grove_set_compute_threads(2);
  ck_assert_int_eq(grove_compute_threads(), 2);
  /* Three threads on a product with few panels and many rows. */
  grove_set_compute_threads(3);
  check_shape(257, 10, 1024, true, GROVE__ACT_RELU);
  check_shape(64, 130, 17, true, GROVE__ACT_NONE);
  grove_set_compute_threads(1);
  ck_assert_int_eq(grove_compute_threads(), 1);
}
END_TEST

/* y of one product on `threads` compute threads (malloc'd). */
static float *run_on(const grove__linear_pack *p, const float *x, int64_t M, int64_t N,
                     const float *b, int threads) {
  grove_set_compute_threads(threads);
  float *y = malloc((size_t)(M * N) * sizeof(float));
  ck_assert_ptr_nonnull(y);
  grove__linear_run(p, x, M, b, y, GROVE__ACT_RELU);
  grove_set_compute_threads(1);
  return y;
}

/* A product with few panels is also cut by rows, so that every thread gets
 * about four chunks (Linear(384, 96), a 64- and a 32-wide panel, went to
 * two threads as 2:1), and the cut never changes a bit. */
START_TEST(test_cut_few_panels) {
  static const struct { int64_t M, N, K; } cases[] = {
      {3136, 96, 40}, {257, 192, 33}, {100, 10, 17}, {49, 128, 300}};
  for (int c = 0; c < COUNT(cases); c++) {
    const int64_t M = cases[c].M, N = cases[c].N, K = cases[c].K;
    float *W = rand_buf(N * K, 40 + (unsigned)c, 1.0f / (float)K);
    float *x = rand_buf(M * K, 50 + (unsigned)c, 1.0f);
    float *b = rand_buf(N, 60 + (unsigned)c, 0.5f);
    grove__linear_pack *p = grove__linear_pack_new(W, N, K);
    ck_assert_ptr_nonnull(p);
    const int64_t npanels = (N + 63) / 64, blocks = (M + 5) / 6;
    for (int t = 2; t <= 3; t++) {
      grove__linear_cut cut = grove__linear_cut_plan(p, M, t);
      ck_assert_msg(cut.row_groups > 0, "M=%lld N=%lld: not cut by rows", (long long)M,
                    (long long)N);
      ck_assert_int_eq(cut.chunks, cut.row_groups * npanels);
      /* About four a thread (fewer by the rounding of rows to groups), and
       * never fewer than two a thread unless every group is one tile. */
      ck_assert_msg(cut.chunks >= 2 * t || cut.row_groups == blocks,
                    "M=%lld N=%lld threads=%d: %lld chunks", (long long)M, (long long)N, t,
                    (long long)cut.chunks);
      ck_assert_int_eq(cut.rows_per_chunk % 6, 0);
      ck_assert(cut.row_groups * cut.rows_per_chunk >= M);
      ck_assert((cut.row_groups - 1) * cut.rows_per_chunk < M);
      float *one = run_on(p, x, M, N, b, 1), *many = run_on(p, x, M, N, b, t);
      ck_assert_msg(memcmp(one, many, (size_t)(M * N) * sizeof(float)) == 0,
                    "M=%lld N=%lld: %d threads changed the result", (long long)M, (long long)N, t);
      free(one);
      free(many);
    }
    grove__linear_pack_free(p);
    free(W);
    free(x);
    free(b);
  }
  /* Panels enough for four chunks a thread, or one row block: runs of
   * panels over all rows. */
  float *W = rand_buf(1024 * 8, 70, 0.1f);
  grove__linear_pack *p = grove__linear_pack_new(W, 1024, 8);
  ck_assert_ptr_nonnull(p);
  grove__linear_cut cut = grove__linear_cut_plan(p, 256, 2);
  ck_assert_int_eq(cut.row_groups, 0);
  ck_assert_int_eq(cut.chunks, 16);
  ck_assert_int_eq(cut.panels_per_chunk, 1);
  grove__linear_pack_free(p);
  p = grove__linear_pack_new(W, 100, 8);
  cut = grove__linear_cut_plan(p, 6, 2);
  ck_assert_int_eq(cut.row_groups, 0);
  ck_assert_int_eq(cut.chunks, 2);
  /* A panel per thread and a few rows: panels kept whole, so that each
   * weight is read once; with more threads than panels, cut by rows. */
  cut = grove__linear_cut_plan(p, 7, 2);
  ck_assert_int_eq(cut.row_groups, 0);
  ck_assert_int_eq(cut.chunks, 2);
  cut = grove__linear_cut_plan(p, 7, 3);
  ck_assert_int_eq(cut.row_groups, 2);
  ck_assert_int_eq(cut.chunks, 4);
  grove__linear_pack_free(p);
  free(W);
}
END_TEST

/* ---------------------------------------------------------- concurrency */

typedef struct conc_arg {
  const grove__linear_pack *p;
  const float *x, *b;
  int64_t M, N;
  float *y;
  int rounds;
} conc_arg;

static void *conc_main(void *argp) {
  conc_arg *a = argp;
  for (int r = 0; r < a->rounds; r++)
    grove__linear_run(a->p, a->x, a->M, a->b, a->y + (size_t)(r % 2) * (size_t)(a->M * a->N),
                      GROVE__ACT_RELU);
  return NULL;
}

/* Two threads hammer one pack (one of them, at a time, gets the pool); every
 * result must equal the single-threaded one. */
static void check_concurrent(int threads, int64_t M, int64_t N, int64_t K) {
  grove_set_compute_threads(threads);
  float *W = rand_buf(N * K, 11, 4.0f / (float)K);
  float *b = rand_buf(N, 12, 0.5f);
  float *x[2] = {rand_buf(M * K, 13, 1.0f), rand_buf(M * K, 14, 1.0f)};
  float *want[2], *got[2];
  grove__linear_pack *p = grove__linear_pack_new(W, N, K);
  ck_assert_ptr_nonnull(p);
  for (int t = 0; t < 2; t++) {
    want[t] = malloc((size_t)(M * N) * sizeof(float));
    got[t] = calloc((size_t)(2 * M * N), sizeof(float));
    reference(W, x[t], b, M, N, K, GROVE__ACT_RELU, want[t]);
  }
  pthread_t th[2];
  conc_arg args[2];
  for (int t = 0; t < 2; t++) {
    args[t] = (conc_arg){.p = p, .x = x[t], .b = b, .M = M, .N = N, .y = got[t], .rounds = 40};
    ck_assert_int_eq(pthread_create(&th[t], NULL, conc_main, &args[t]), 0);
  }
  for (int t = 0; t < 2; t++) ck_assert_int_eq(pthread_join(th[t], NULL), 0);
  for (int t = 0; t < 2; t++)
    for (int h = 0; h < 2; h++) {
      long bad = grove_test_allclose(got[t] + h * M * N, want[t], (size_t)(M * N), RTOL, ATOL);
      ck_assert_msg(bad < 0, "thread %d half %d: y[%ld] differs", t, h, bad);
    }
  for (int t = 0; t < 2; t++) {
    free(want[t]);
    free(got[t]);
    free(x[t]);
  }
  free(W);
  free(b);
  grove__linear_pack_free(p);
  grove_set_compute_threads(1);
}

START_TEST(test_concurrent_runs) {
  unsetenv("GROVE_GEMM");
  check_concurrent(1, 7, 300, 200);
  check_concurrent(2, 7, 300, 200);
  check_concurrent(2, 64, 1024, 784);
  check_concurrent(2, 1, 1024, 1024);
}
END_TEST

/* With room for two pools, the second concurrent run starts its own. */
START_TEST(test_concurrent_runs_two_pools) {
  unsetenv("GROVE_GEMM");
  setenv("GROVE_GEMM_POOLS", "2", 1);
  check_concurrent(2, 7, 300, 200);
  check_concurrent(2, 64, 1024, 784);
  check_concurrent(3, 33, 1024, 17);
  unsetenv("GROVE_GEMM_POOLS");
}
END_TEST

START_TEST(test_concurrent_runs_avx2) {
  if (!have_avx2()) return;
  setenv("GROVE_GEMM", "avx2", 1);
  check_concurrent(2, 7, 300, 200);
  check_concurrent(2, 64, 1024, 784);
  check_concurrent(2, 1, 1024, 1024);
  unsetenv("GROVE_GEMM");
}
END_TEST

START_TEST(test_concurrent_runs_blas) {
  setenv("GROVE_GEMM", "blas", 1);
  check_concurrent(1, 7, 300, 200);
  check_concurrent(2, 64, 1024, 784);
  check_concurrent(2, 1, 1024, 1024);
  unsetenv("GROVE_GEMM");
}
END_TEST

/* fork() keeps only the calling thread: the child must still compute the
 * right thing (on its own thread) and exit cleanly, and may start a pool of
 * its own. */
START_TEST(test_fork_with_pool) {
  unsetenv("GROVE_GEMM");
  grove_set_compute_threads(2);
  const int64_t M = 64, N = 300, K = 200;
  float *W = rand_buf(N * K, 21, 4.0f / (float)K);
  float *x = rand_buf(M * K, 22, 1.0f);
  float *want = malloc((size_t)(M * N) * sizeof(float));
  float *got = malloc((size_t)(M * N) * sizeof(float));
  reference(W, x, NULL, M, N, K, GROVE__ACT_RELU, want);
  grove__linear_pack *p = grove__linear_pack_new(W, N, K);
  ck_assert_ptr_nonnull(p);
  grove__linear_run(p, x, M, NULL, got, GROVE__ACT_RELU); /* the pool is warm */
  fflush(NULL);
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    int code = 0;
    if (grove_compute_threads() != 1) code |= 1;
    memset(got, 0, (size_t)(M * N) * sizeof(float));
    grove__linear_run(p, x, M, NULL, got, GROVE__ACT_RELU);
    if (grove_test_allclose(got, want, (size_t)(M * N), RTOL, ATOL) >= 0) code |= 2;
    grove_set_compute_threads(2);
    if (grove_compute_threads() != 2) code |= 4;
    memset(got, 0, (size_t)(M * N) * sizeof(float));
    grove__linear_run(p, x, M, NULL, got, GROVE__ACT_RELU);
    if (grove_test_allclose(got, want, (size_t)(M * N), RTOL, ATOL) >= 0) code |= 8;
    grove__linear_pack_free(p);
    free(W);
    free(x);
    free(want);
    free(got);
    grove_set_compute_threads(1); /* joins the child's own pool */
    /* _exit: the child's copy of the sanitizers' thread list still names
     * the parent's helpers, and a leak check there would only warn. */
    _exit(code);
  }
  int status = 0;
  ck_assert_int_eq(waitpid(pid, &status, 0), pid);
  ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child status %d", status);
  ck_assert_int_eq(grove_compute_threads(), 2);
  grove__linear_run(p, x, M, NULL, got, GROVE__ACT_RELU);
  ck_assert_int_eq(grove_test_allclose(got, want, (size_t)(M * N), RTOL, ATOL), -1);
  grove__linear_pack_free(p);
  free(W);
  free(x);
  free(want);
  free(got);
  grove_set_compute_threads(1);
}
END_TEST

/* ---------------------------------------------------------- parallel for */

typedef struct pf_ctx {
  int64_t n, grain;
  _Atomic int *hits;      /* per index */
  atomic_int calls, bad;  /* chunks run; chunks not on the grain */
} pf_ctx;

static void pf_fn(void *ctxp, int64_t b, int64_t e) {
  pf_ctx *c = ctxp;
  atomic_fetch_add(&c->calls, 1);
  /* A chunk is [k * grain, min(n, (k + 1) * grain)) or, computed alone,
   * the whole range. */
  bool whole = b == 0 && e == c->n;
  bool chunk = b % c->grain == 0 && e == (b + c->grain < c->n ? b + c->grain : c->n);
  if (!(b < e && (whole || chunk))) atomic_fetch_add(&c->bad, 1);
  for (int64_t i = b; i < e; i++) atomic_fetch_add_explicit(&c->hits[i], 1, memory_order_relaxed);
  /* Some work, so that helpers get to claim chunks too. */
  volatile double sink = 0;
  for (int64_t i = b; i < e; i++)
    for (int k = 0; k < 200; k++) sink += (double)k * (double)i;
}

/* Runs one parallel_for and checks coverage; returns the chunks run. */
static int pf_check(int64_t n, int64_t grain) {
  /* The grain parallel_for uses: at least 1, and raised so that there are
   * at most 0xFFFF chunks. */
  int64_t g = grain < 1 ? 1 : grain;
  if ((n + g - 1) / g > 0xFFFF) g = (n + 0xFFFF - 1) / 0xFFFF;
  pf_ctx c = {.n = n, .grain = g};
  c.hits = calloc((size_t)(n > 0 ? n : 1), sizeof *c.hits);
  ck_assert_ptr_nonnull(c.hits);
  grove__parallel_for(n, grain, pf_fn, &c);
  for (int64_t i = 0; i < n; i++)
    ck_assert_msg(atomic_load(&c.hits[i]) == 1, "n %lld grain %lld: index %lld ran %d times",
                  (long long)n, (long long)grain, (long long)i, atomic_load(&c.hits[i]));
  ck_assert_int_eq(atomic_load(&c.bad), 0);
  free(c.hits);
  return atomic_load(&c.calls);
}

START_TEST(test_parallel_for) {
  static const int64_t cases[][2] = {{0, 4},   {1, 1},    {5, 0},      {7, 3},   {64, 1},
                                     {100, 7}, {1000, 1}, {4096, 100}, {33, 64}, {200000, 1}};
  for (int threads = 1; threads <= 3; threads++) {
    grove_set_compute_threads(threads);
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
      int calls = pf_check(cases[k][0], cases[k][1]);
      /* One thread, or a range within one grain: a single plain call. */
      if (cases[k][0] > 0 && (threads == 1 || cases[k][0] <= cases[k][1]))
        ck_assert_int_eq(calls, 1);
      if (cases[k][0] == 0) ck_assert_int_eq(calls, 0);
    }
  }
  grove_set_compute_threads(1);
}
END_TEST

/* With two threads the caller claims chunks from the front of the range
 * and the helper from the back (threadpool.c, the claim word), so that
 * each thread takes one end and, layer after layer, reads mostly what it
 * wrote: whichever thread ran chunk c, the caller's chunks are a prefix and
 * the helper's the rest, however the timing falls (the old single counter
 * dealt them out alternately). */
static pthread_t pf_caller;
static _Atomic int pf_owner[256]; /* 1: the caller ran the chunk, 2: another thread */
static void pf_mark(void *ctx, int64_t b, int64_t e) {
  (void)ctx;
  const int who = pthread_equal(pthread_self(), pf_caller) ? 1 : 2;
  for (int64_t i = b; i < e; i++) atomic_store(&pf_owner[i], who);
  /* Long enough (about 20 us) that the helper, spinning, gets chunks. */
  const int64_t t0 = grove__clock_ns();
  while (grove__clock_ns() - t0 < 20000) {
  }
}

START_TEST(test_parallel_for_ends) {
  grove_set_compute_threads(2);
  pf_caller = pthread_self();
  int helper_ran = 0;
  for (int round = 0; round < 20; round++) {
    for (int i = 0; i < 256; i++) atomic_store(&pf_owner[i], 0);
    grove__parallel_for(256, 1, pf_mark, NULL);
    int first_helper = 256;
    for (int i = 0; i < 256; i++) {
      const int w = atomic_load(&pf_owner[i]);
      ck_assert_msg(w != 0, "round %d: chunk %d never ran", round, i);
      if (w == 2 && first_helper == 256) first_helper = i;
      ck_assert_msg(!(w == 1 && first_helper < i), "round %d: the caller ran chunk %d after the helper ran %d", round, i, first_helper);
    }
    helper_ran += first_helper < 256;
  }
  /* The split is what is tested; a helper that got nothing in 20 rounds of
   * 5 ms would mean it never ran. */
  ck_assert_int_gt(helper_ran, 0);
  grove_set_compute_threads(1);
}
END_TEST

/* A helper spins only briefly after a job before it sleeps
 * (threadpool.c, HELPER_SPIN_NS): between a server's batches the spin is
 * CPU the loop and the clients need.  100 empty jobs 1 ms apart: at 500 us a
 * spin the helper burns about 50 ms of CPU, at 50 us about 5 ms (and its
 * wake-ups). */
static void pf_noop(void *ctx, int64_t b, int64_t e) {
  (void)ctx, (void)b, (void)e;
}

/* CPU time (ms) of this process's threads named grove-compute. */
static double helpers_cpu_ms(void) {
  DIR *d = opendir("/proc/self/task");
  ck_assert_ptr_nonnull(d);
  double ms = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (e->d_name[0] == '.') continue;
    char path[300], comm[64] = "";
    snprintf(path, sizeof path, "/proc/self/task/%s/comm", e->d_name);
    FILE *f = fopen(path, "r");
    if (!f) continue;
    if (!fgets(comm, sizeof comm, f)) comm[0] = 0;
    fclose(f);
    if (strncmp(comm, "grove-compute", 13) != 0) continue;
    snprintf(path, sizeof path, "/proc/self/task/%s/schedstat", e->d_name);
    unsigned long long ns = 0;
    if ((f = fopen(path, "r"))) {
      if (fscanf(f, "%llu", &ns) != 1) ns = 0;
      fclose(f);
    }
    ms += (double)ns / 1e6;
  }
  closedir(d);
  return ms;
}

START_TEST(test_helpers_sleep_soon_after_a_job) {
  grove_set_compute_threads(2);
  grove__parallel_for(64, 1, pf_noop, NULL); /* the pool's threads started */
  struct timespec gap = {0, 1000000};
  double before = helpers_cpu_ms();
  for (int i = 0; i < 100; i++) {
    grove__parallel_for(64, 1, pf_noop, NULL);
    nanosleep(&gap, NULL);
  }
  double spent = helpers_cpu_ms() - before;
  ck_assert_msg(spent > 0, "no thread named grove-compute");
  ck_assert_msg(spent < 25.0, "the helper spent %.1f ms of CPU over 100 jobs 1 ms apart", spent);
  grove_set_compute_threads(1);
}
END_TEST

/* A background thread (grove_thread_yield_every; core/base/yield.c) yields at
 * the products' and the parallel loops' yield points once its interval has
 * passed, and computes the same bits; a foreground thread never yields. */
START_TEST(test_background_yields) {
  grove_set_compute_threads(1);
  const int64_t M = 64, N = 1024, K = 784;
  float *W = rand_buf(N * K, 7, 1.0f / (float)K);
  float *x = rand_buf(M * K, 8, 1.0f);
  float *fg = rand_buf(M * N, 0, 0.0f), *bg = rand_buf(M * N, 0, 0.0f); /* zeroed outputs */

  long before = grove_thread_yields();
  grove__linear_pack *p = grove__linear_pack_new(W, N, K);
  ck_assert_ptr_nonnull(p);
  grove__linear_run(p, x, M, NULL, fg, GROVE__ACT_RELU);
  grove__linear_pack_free(p);
  ck_assert_int_eq(pf_check(1000, 7), 1); /* one plain call on one thread */
  ck_assert_int_eq(grove_thread_yields(), before);

  /* 1 us: every yield point after the first microsecond yields (a panel of
   * this pack or product takes longer than that). */
  grove_thread_yield_every(1);
  p = grove__linear_pack_new(W, N, K);
  ck_assert_ptr_nonnull(p);
  long packed = grove_thread_yields();
  ck_assert_int_gt(packed, before);
  grove__linear_run(p, x, M, NULL, bg, GROVE__ACT_RELU);
  ck_assert_int_gt(grove_thread_yields(), packed);
  ck_assert_int_eq(memcmp(fg, bg, (size_t)(M * N) * sizeof(float)), 0);
  /* The parallel loop runs its grains as yield points: ceil(1000 / 7)
   * calls, each index once (pf_check). */
  ck_assert_int_eq(pf_check(1000, 7), 143);

  grove_thread_yield_every(0);
  long after = grove_thread_yields();
  grove__linear_run(p, x, M, NULL, bg, GROVE__ACT_RELU);
  ck_assert_int_eq(pf_check(1000, 7), 1);
  ck_assert_int_eq(grove_thread_yields(), after);
  grove__linear_pack_free(p);
  free(W);
  free(x);
  free(fg);
  free(bg);
}
END_TEST

static void *pf_main(void *arg) {
  for (int r = 0; r < 30; r++) pf_check(1000 + 37 * r + (int)(intptr_t)arg, 1 + r % 9);
  return NULL;
}

/* Two callers at once (with one pool, and with room for two), also mixed
 * with products on the same pools. */
START_TEST(test_parallel_for_concurrent) {
  unsetenv("GROVE_GEMM");
  for (int pools = 1; pools <= 2; pools++) {
    setenv("GROVE_GEMM_POOLS", pools == 1 ? "1" : "2", 1);
    grove_set_compute_threads(1); /* the cap is read when threads change */
    grove_set_compute_threads(2);
    pthread_t th[2];
    for (intptr_t t = 0; t < 2; t++)
      ck_assert_int_eq(pthread_create(&th[t], NULL, pf_main, (void *)t), 0);
    for (int t = 0; t < 2; t++) ck_assert_int_eq(pthread_join(th[t], NULL), 0);
    /* A product beside a parallel_for. */
    const int64_t M = 64, N = 300, K = 200;
    float *W = rand_buf(N * K, 31, 4.0f / (float)K), *x = rand_buf(M * K, 32, 1.0f);
    float *want = malloc((size_t)(M * N) * sizeof(float));
    float *got = calloc((size_t)(2 * M * N), sizeof(float));
    reference(W, x, NULL, M, N, K, GROVE__ACT_RELU, want);
    grove__linear_pack *p = grove__linear_pack_new(W, N, K);
    ck_assert_ptr_nonnull(p);
    conc_arg a = {.p = p, .x = x, .M = M, .N = N, .y = got, .rounds = 40};
    ck_assert_int_eq(pthread_create(&th[0], NULL, pf_main, (void *)0), 0);
    ck_assert_int_eq(pthread_create(&th[1], NULL, conc_main, &a), 0);
    for (int t = 0; t < 2; t++) ck_assert_int_eq(pthread_join(th[t], NULL), 0);
    for (int h = 0; h < 2; h++)
      ck_assert_int_eq(grove_test_allclose(got + h * M * N, want, (size_t)(M * N), RTOL, ATOL), -1);
    grove__linear_pack_free(p);
    free(W);
    free(x);
    free(want);
    free(got);
  }
  unsetenv("GROVE_GEMM_POOLS");
  grove_set_compute_threads(1);
}
END_TEST

/* ---------------------------------------------------------- general products */

/* C = op(A) . op(B) (+ C) in double; lda, ldb, ldc as grove__gemm's. */
static void gemm_reference(int flags, int64_t M, int64_t N, int64_t K, const float *A, int64_t lda,
                           const float *B, int64_t ldb, const float *C0, int64_t ldc, float *want) {
  for (int64_t i = 0; i < M; i++)
    for (int64_t n = 0; n < N; n++) {
      double s = flags & GROVE__GEMM_ACCUMULATE ? C0[i * ldc + n] : 0.0;
      for (int64_t k = 0; k < K; k++) {
        double a = flags & GROVE__GEMM_TRANS_A ? A[k * lda + i] : A[i * lda + k];
        double b = flags & GROVE__GEMM_TRANS_B ? B[n * ldb + k] : B[k * ldb + n];
        s += a * b;
      }
      want[i * N + n] = (float)s;
    }
}

/* One product with leading dimensions pad floats wider than needed.  The
 * padding of C, a sentinel past C and one past the workspace must come back
 * untouched. */
static void check_gemm(int flags, int64_t M, int64_t N, int64_t K, int64_t pad) {
  const bool ta = flags & GROVE__GEMM_TRANS_A, tb = flags & GROVE__GEMM_TRANS_B;
  const int64_t arows = ta ? K : M, acols = ta ? M : K, lda = acols + pad;
  const int64_t brows = tb ? N : K, bcols = tb ? K : N, ldb = bcols + pad;
  const int64_t ldc = N + pad;
  unsigned seed = (unsigned)(flags * 100003 + M * 7919 + N * 131 + K * 17 + pad);
  float *A = rand_buf(arows * lda, seed, 1.0f);
  float *B = rand_buf(brows * ldb, seed + 1, K > 0 ? 4.0f / (float)K : 1.0f);
  float *C0 = rand_buf(M * ldc, seed + 2, 1.0f);
  float *C = malloc((size_t)(M * ldc + 16) * sizeof(float));
  float *want = malloc((size_t)(M * N > 0 ? M * N : 1) * sizeof(float));
  float *got = malloc((size_t)(M * N > 0 ? M * N : 1) * sizeof(float));
  ck_assert_ptr_nonnull(C);
  ck_assert_ptr_nonnull(want);
  ck_assert_ptr_nonnull(got);
  memcpy(C, C0, (size_t)(M * ldc) * sizeof(float));
  for (int i = 0; i < 16; i++) C[M * ldc + i] = -12345.0f;
  gemm_reference(flags, M, N, K, A, lda, B, ldb, C0, ldc, want);

  size_t ws_bytes = grove__gemm_ws_size(flags, M, N, K);
  ck_assert_uint_eq(ws_bytes % 64, 0);
  float *ws = aligned_alloc(64, ws_bytes + 64);
  ck_assert_ptr_nonnull(ws);
  for (int i = 0; i < 16; i++) ws[ws_bytes / sizeof(float) + i] = -777.0f;
  grove__gemm(flags, M, N, K, A, lda, B, ldb, C, ldc, ws, ws_bytes);
  for (int64_t i = 0; i < M; i++) {
    memcpy(got + i * N, C + i * ldc, (size_t)N * sizeof(float));
    for (int64_t n = N; n < ldc; n++) ck_assert_float_eq(C[i * ldc + n], C0[i * ldc + n]);
  }
  long bad = grove_test_allclose(got, want, (size_t)(M * N), RTOL, ATOL);
  ck_assert_msg(
      bad < 0, "flags=%d M=%lld N=%lld K=%lld pad=%lld threads=%d kernel=%s: C[%ld] = %g, want %g",
      flags, (long long)M, (long long)N, (long long)K, (long long)pad, grove_compute_threads(),
      ws_bytes ? "avx512" : "blas", bad, bad < 0 ? 0.0 : got[bad], bad < 0 ? 0.0 : want[bad]);
  for (int i = 0; i < 16; i++) ck_assert_float_eq(C[M * ldc + i], -12345.0f);
  for (int i = 0; i < 16; i++) ck_assert_float_eq(ws[ws_bytes / sizeof(float) + i], -777.0f);
  free(ws);
  free(A);
  free(B);
  free(C0);
  free(C);
  free(want);
  free(got);
}

static const int64_t GS[] = {1, 2, 7, 16, 17, 64, 65, 100};

/* _i: bit 0 two threads, bit 1 the BLAS kernel.  Every flag combination
 * (transposes, accumulate) on every small (M, N, K), with and without
 * padded leading dimensions; then the training shapes of the reference MLP
 * (forward, dX, dW at batch 1, 64 and 257) and K beyond one block. */
START_TEST(test_gemm_general) {
  if (_i & 2)
    setenv("GROVE_GEMM", "blas", 1);
  else
    unsetenv("GROVE_GEMM");
  grove_set_compute_threads(_i & 1 ? 2 : 1);
  for (int f = 0; f < 8; f++)
    for (int a = 0; a < COUNT(GS); a++)
      for (int b = 0; b < COUNT(GS); b++)
        for (int c = 0; c < COUNT(GS); c++) check_gemm(f, GS[a], GS[b], GS[c], (a + b + c) % 3);
  static const int64_t mlp[][2] = {{784, 1024}, {1024, 1024}, {1024, 10}};
  static const int64_t batches[] = {1, 64, 257};
  for (int l = 0; l < COUNT(mlp); l++)
    for (int bi = 0; bi < COUNT(batches); bi++) {
      const int64_t K = mlp[l][0], N = mlp[l][1], M = batches[bi];
      check_gemm(GROVE__GEMM_TRANS_B, M, N, K, 0);                          /* y = x W^T */
      check_gemm(GROVE__GEMM_ACCUMULATE, M, K, N, 0);                       /* dX += dY W */
      check_gemm(GROVE__GEMM_TRANS_A, N, K, M, 0);                          /* dW = dY^T X */
      check_gemm(GROVE__GEMM_TRANS_A | GROVE__GEMM_ACCUMULATE, N, K, M, 3); /* dW += */
    }
  static const int64_t longk[][3] = {{7, 70, 2500}, {33, 130, 2049}, {3, 1, 4097}, {1, 200, 1025}};
  for (int s = 0; s < COUNT(longk); s++)
    for (int f = 0; f < 8; f++) check_gemm(f, longk[s][0], longk[s][1], longk[s][2], 1);
  grove_set_compute_threads(1);
  unsetenv("GROVE_GEMM");
}
END_TEST

START_TEST(test_gemm_degenerate) {
  unsetenv("GROVE_GEMM");
  /* Nothing to compute needs no workspace. */
  ck_assert_uint_eq(grove__gemm_ws_size(0, 0, 5, 5), 0);
  ck_assert_uint_eq(grove__gemm_ws_size(0, 5, 0, 5), 0);
  ck_assert_uint_eq(grove__gemm_ws_size(0, 5, 5, 0), 0);
  /* K = 0: C = 0, or C unchanged when accumulating. */
  float C[6] = {1, 2, 3, 4, 5, 6};
  grove__gemm(GROVE__GEMM_ACCUMULATE, 2, 3, 0, NULL, 1, NULL, 3, C, 3, NULL, 0);
  for (int i = 0; i < 6; i++) ck_assert_float_eq(C[i], (float)(i + 1));
  grove__gemm(0, 2, 3, 0, NULL, 1, NULL, 3, C, 3, NULL, 0);
  for (int i = 0; i < 6; i++) ck_assert_float_eq(C[i], 0.0f);
  /* M = 0 and N = 0 write nothing. */
  C[0] = 7.0f;
  grove__gemm(0, 0, 3, 2, C, 2, C, 3, C, 3, NULL, 0);
  grove__gemm(0, 2, 0, 2, C, 2, C, 3, C, 3, NULL, 0);
  ck_assert_float_eq(C[0], 7.0f);
  /* Without a workspace the BLAS path computes the same product. */
  float A[6] = {1, 2, 3, 4, 5, 6}, B[6] = {1, 0, -1, 2, 0.5f, 1}, want[4];
  gemm_reference(GROVE__GEMM_TRANS_B, 2, 2, 3, A, 3, B, 3, NULL, 2, want);
  grove__gemm(GROVE__GEMM_TRANS_B, 2, 2, 3, A, 3, B, 3, C, 2, NULL, 0);
  ck_assert_int_eq(grove_test_allclose(C, want, 4, RTOL, ATOL), -1);
  /* A workspace too small for the AVX-512 path (GROVE_GEMM changed since
   * its size was asked for, say) is not used: BLAS computes the product. */
  size_t need = grove__gemm_ws_size(GROVE__GEMM_TRANS_B, 2, 2, 3);
  if (need > 0) {
    float *small = aligned_alloc(64, 64);
    ck_assert_ptr_nonnull(small);
    memset(C, 0, sizeof C);
    grove__gemm(GROVE__GEMM_TRANS_B, 2, 2, 3, A, 3, B, 3, C, 2, small, need - 1);
    ck_assert_int_eq(grove_test_allclose(C, want, 4, RTOL, ATOL), -1);
    free(small);
  }
  /* GROVE_GEMM=blas needs none. */
  setenv("GROVE_GEMM", "blas", 1);
  ck_assert_uint_eq(grove__gemm_ws_size(0, 64, 64, 64), 0);
  unsetenv("GROVE_GEMM");
}
END_TEST

Suite *gemm_suite(void) {
  Suite *s = suite_create("gemm");
  TCase *tc = tcase_create("shapes");
  tcase_set_timeout(tc, 600);
  tcase_add_loop_test(tc, test_shapes_default_kernel, 0, 8);
  tcase_add_loop_test(tc, test_shapes_blas_kernel, 0, 8);
  tcase_add_loop_test(tc, test_shapes_avx2_kernel, 0, 8);
  tcase_add_loop_test(tc, test_long_k, 0, 4);
  tcase_add_test(tc, test_row_blocks_bitwise);
  tcase_add_test(tc, test_act_in_tile);
  tcase_add_test(tc, test_empty_and_degenerate);
  tcase_add_test(tc, test_thread_setting);
  tcase_add_test(tc, test_cut_few_panels);
  tcase_add_test(tc, test_concurrent_runs);
  tcase_add_test(tc, test_concurrent_runs_two_pools);
  tcase_add_test(tc, test_concurrent_runs_blas);
  tcase_add_test(tc, test_concurrent_runs_avx2);
  tcase_add_test(tc, test_fork_with_pool);
  tcase_add_test(tc, test_parallel_for);
  tcase_add_test(tc, test_parallel_for_ends);
  tcase_add_test(tc, test_parallel_for_concurrent);
  tcase_add_test(tc, test_background_yields);
  tcase_add_test(tc, test_helpers_sleep_soon_after_a_job);
  tcase_add_loop_test(tc, test_gemm_general, 0, 4);
  tcase_add_test(tc, test_gemm_degenerate);
  suite_add_tcase(s, tc);
  return s;
}

GROVE_TEST_MAIN(gemm_suite)
