/* check_gemm.c: grove__linear_pack / grove__linear_run against a naive
 * double-precision reference (rtol 1e-4, atol 1e-5), on odd and real
 * shapes, both activations, with and without bias, with 1 and 2 compute
 * threads, on both kernels (the AVX-512 one where the CPU has it, and the
 * BLAS one forced by GROVE_GEMM=blas), and with two threads running the
 * same pack at once. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

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

/* K longer than one block of the AVX-512 kernel (1024): partial sums go
 * through y, and bias and ReLU must come only with the last block. */
START_TEST(test_long_k) {
  unsetenv("GROVE_GEMM");
  grove_set_compute_threads(_i ? 2 : 1);
  static const int64_t shapes[][3] = {
      {1, 17, 1025}, {7, 70, 2500}, {33, 130, 2049}, {64, 10, 3000}, {3, 1, 4097}};
  for (int s = 0; s < COUNT(shapes); s++) {
    check_shape(shapes[s][0], shapes[s][1], shapes[s][2], true, GROVE__ACT_RELU);
    check_shape(shapes[s][0], shapes[s][1], shapes[s][2], false, GROVE__ACT_NONE);
  }
  grove_set_compute_threads(1);
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

Suite *gemm_suite(void) {
  Suite *s = suite_create("gemm");
  TCase *tc = tcase_create("shapes");
  tcase_set_timeout(tc, 600);
  tcase_add_loop_test(tc, test_shapes_default_kernel, 0, 8);
  tcase_add_loop_test(tc, test_shapes_blas_kernel, 0, 8);
  tcase_add_loop_test(tc, test_long_k, 0, 2);
  tcase_add_test(tc, test_empty_and_degenerate);
  tcase_add_test(tc, test_thread_setting);
  tcase_add_test(tc, test_concurrent_runs);
  tcase_add_test(tc, test_concurrent_runs_two_pools);
  tcase_add_test(tc, test_concurrent_runs_blas);
  tcase_add_test(tc, test_fork_with_pool);
  suite_add_tcase(s, tc);
  return s;
}

GROVE_TEST_MAIN(gemm_suite)
