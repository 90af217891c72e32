/* gemm_shapes.c: the packed GEMM's achieved FLOP/s on the products the
 * convolutions issue, against this core's peak measured in the same run.
 *
 *   make gemm-shapes && build/release/bench/gemm_shapes [--seconds S] [--rounds R]
 *        [--calls M:N:K:ROWS,...]
 *
 * The peak is a register-only loop of 24 independent AVX-512 FMAs (what
 * tile_6_4's inner loop would reach with every operand in L1 and no
 * loads): 2 x 16 x 2 FLOP per FMA pipe and cycle.  Each shape is a product
 * of M rows of K floats by a packed [N, K] weight, issued as the
 * convolution path issues it: grove__linear_run_alone over ROWS rows at a
 * time (the fused chunk's step, core/nn/layers_conv.c), one thread.  The
 * default list is ResNet-50's 1x1 and Winograd products at batch 1, 224x224
 * (docs/performance-models.md, "The torchvision zoo").  Peak and shapes alternate
 * round by round and the median round of each is printed, so the ratio
 * ("of peak") compares like with like on a shared host; absolute figures
 * are the host's weather.  Figures only, no assertions. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_time.h"
#include "internal.h"

#if GROVE__X86_SIMD
#include <immintrin.h>
#endif

#if GROVE__X86_SIMD
GROVE__TARGET_PUSH("avx512f,fma")
/* GFLOP/s of 24 independent FMA chains for about `seconds`. */
static double peak_gflops(double seconds) {
  __m512 acc[24];
  for (int i = 0; i < 24; i++) acc[i] = _mm512_set1_ps((float)i * 1e-3f);
  const __m512 a = _mm512_set1_ps(0.999f), b = _mm512_set1_ps(1e-4f);
  long iters = 0;
  double t0 = bench_now(), t;
  do {
    for (int r = 0; r < 4096; r++) {
#pragma GCC unroll 24
      for (int i = 0; i < 24; i++) acc[i] = _mm512_fmadd_ps(acc[i], a, b);
    }
    iters += 4096;
    t = bench_now();
  } while (t - t0 < seconds);
  float sink = 0;
  for (int i = 0; i < 24; i++) sink += _mm512_reduce_add_ps(acc[i]);
  if (sink == 12345.0f) printf("#\n");
  return (double)iters * 24 * 32 / (t - t0) * 1e-9;
}
GROVE__TARGET_POP
#else
static double peak_gflops(double seconds) {
  (void)seconds;
  return 0;
}
#endif

typedef struct shape {
  int64_t M, N, K, rows;
  grove__linear_pack *pk;
  float *x, *y;
} shape;

/* Seconds per whole product (all M rows, ROWS at a time). */
static double time_shape(shape *s, double seconds) {
  long iters = 0;
  double t0 = bench_now(), t;
  do {
    for (int64_t r = 0; r < s->M; r += s->rows) {
      int64_t n = s->M - r < s->rows ? s->M - r : s->rows;
      grove__linear_run_alone(s->pk, s->x + r * s->K, n, NULL, s->y + r * s->N, GROVE__ACT_NONE);
    }
    iters++;
    t = bench_now();
  } while (t - t0 < seconds);
  return (t - t0) / (double)iters;
}

/* ResNet-50 at batch 1 (M:N:K:ROWS): layer4's 1x1 products (49 positions),
 * layer3's (196), layer2's (784), and the Winograd products of layer4's and
 * layer3's 3x3 convolutions (16 and 49 tiles); ROWS as the rows path cuts
 * them. */
static const char *DEFAULT_CALLS =
    "49:512:2048:16,49:2048:512:16,196:256:1024:48,196:1024:256:48,784:128:512:96,"
    "16:512:512:4,49:256:256:8";

#define MAXS 32
#define MAXR 32

int main(int argc, char **argv) {
  double seconds = 4.0;
  int rounds = 5;
  const char *calls = DEFAULT_CALLS;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--seconds") && i + 1 < argc)
      seconds = atof(argv[++i]);
    else if (!strcmp(argv[i], "--rounds") && i + 1 < argc)
      rounds = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--calls") && i + 1 < argc)
      calls = argv[++i];
    else {
      fprintf(stderr, "usage: %s [--seconds S] [--rounds R] [--calls M:N:K:ROWS,...]\n", argv[0]);
      return 2;
    }
  }
  if (rounds < 1) rounds = 1;
  if (rounds > MAXR) rounds = MAXR;
  grove_set_compute_threads(1);

  shape sh[MAXS];
  int ns = 0;
  unsigned seed = 7;
  char *list = strdup(calls);
  for (char *tok = strtok(list, ","); tok && ns < MAXS; tok = strtok(NULL, ",")) {
    long long M, N, K, R;
    if (sscanf(tok, "%lld:%lld:%lld:%lld", &M, &N, &K, &R) != 4 || M < 1 || N < 1 || K < 1 ||
        R < 1 || M > (1 << 20) || N > (1 << 16) || K > (1 << 16)) {
      fprintf(stderr, "gemm_shapes: bad call '%s' (M:N:K:ROWS, each >= 1)\n", tok);
      return 2;
    }
    shape *s = &sh[ns++];
    *s = (shape){.M = M, .N = N, .K = K, .rows = R};
    float *W = malloc((size_t)(N * K) * sizeof(float));
    s->x = malloc((size_t)(M * K) * sizeof(float));
    s->y = malloc((size_t)(M * N) * sizeof(float));
    if (!W || !s->x || !s->y) return 1;
    for (int64_t i = 0; i < N * K; i++) W[i] = (float)((seed = seed * 1664525u + 1013904223u) >> 9) * 1e-8f;
    for (int64_t i = 0; i < M * K; i++) s->x[i] = (float)((seed = seed * 1664525u + 1013904223u) >> 9) * 1e-8f;
    s->pk = grove__linear_pack_new(W, N, K);
    free(W);
    if (!s->pk) return 1;
  }
  free(list);

  static double tp[MAXR], ts[MAXS][MAXR];
  const double slice = seconds / rounds / (ns + 1);
  for (int r = 0; r < rounds; r++) {
    tp[r] = peak_gflops(slice);
    for (int i = 0; i < ns; i++) {
      double t = time_shape(&sh[i], slice);
      ts[i][r] = 2.0 * (double)(sh[i].M * sh[i].N * sh[i].K) / t * 1e-9;
    }
  }
  double peak = bench_median(tp, rounds);
  printf("# gemm_shapes: one thread, kernel %s, %d rounds, median round\n",
         grove_compute_kernel(), rounds);
  printf("peak fma loop            %7.1f GFLOP/s\n", peak);
  for (int i = 0; i < ns; i++) {
    double g = bench_median(ts[i], rounds);
    printf("M=%-5lld N=%-5lld K=%-5lld rows=%-4lld %7.1f GFLOP/s  %5.1f%% of peak\n",
           (long long)sh[i].M, (long long)sh[i].N, (long long)sh[i].K, (long long)sh[i].rows, g,
           peak > 0 ? 100.0 * g / peak : 0.0);
    grove__linear_pack_free(sh[i].pk);
    free(sh[i].x);
    free(sh[i].y);
  }
  return 0;
}
