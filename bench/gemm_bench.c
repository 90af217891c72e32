/* gemm_bench.c: micro-benchmark of grove__linear_run on the reference MLP
 * (Linear(784,1024) ReLU Linear(1024,1024) ReLU Linear(1024,10), see
 * /work/shared/peers/models.py), layers chained with ReLU fused, against
 * the same chain through plain cblas (sgemv at batch 1, sgemm otherwise,
 * then one bias+ReLU pass).
 *
 * Build and run (`make gemm-bench` has the rule, in mk/gemm_bench.mk; or):
 *   cc -O2 -std=c11 -D_DEFAULT_SOURCE -pthread -Iinclude -Icore -Icore/base -Icore/nn \
 *      -Icore/tensor -Icore/kernels $(pkg-config --cflags openblas) bench/gemm_bench.c \
 *      build/release/libgrove.a -o build/gemm_bench $(pkg-config --libs jansson openblas zlib) -lm
 *   build/gemm_bench [--threads T] [--seconds S] [--batches 1,64,256] [--layers]
 *
 * The machine this was written on is a 2-vCPU VM whose host is shared, so
 * the two engines are measured in alternating rounds (--rounds, each
 * seconds/rounds long per engine and batch) and the median round is
 * reported: both engines see the same weather.  Prints one line per
 * engine and batch (samples/s, ms per batch, GFLOP/s) and the ratio.
 * --layers also times each layer shape alone (one round).  Figures, not
 * assertions; the output of both engines is compared once as a sanity
 * check (max |difference|).
 */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench_time.h"
#include "internal.h"

void openblas_set_num_threads(int num_threads);

static float frand(unsigned *s) {
  *s = *s * 1664525u + 1013904223u;
  return (float)((*s >> 8) & 0xFFFF) / 65536.0f - 0.5f;
}

#define NL 3
static const int64_t IN[NL] = {784, 1024, 1024};
static const int64_t OUT[NL] = {1024, 1024, 10};

typedef struct net {
  float *W[NL], *b[NL];
  grove__linear_pack *pk[NL];
  float *x, *h1, *h2, *y;
  int64_t maxb;
} net;

static void mlp_grove(net *n, int64_t B) {
  grove__linear_run(n->pk[0], n->x, B, n->b[0], n->h1, GROVE__ACT_RELU);
  grove__linear_run(n->pk[1], n->h1, B, n->b[1], n->h2, GROVE__ACT_RELU);
  grove__linear_run(n->pk[2], n->h2, B, n->b[2], n->y, GROVE__ACT_NONE);
}

static void blas_layer(const float *W, const float *b, const float *x, int64_t B, int64_t K,
                       int64_t N, float *y, int relu) {
  if (B == 1)
    cblas_sgemv(CblasRowMajor, CblasNoTrans, (int)N, (int)K, 1.0f, W, (int)K, x, 1, 0.0f, y, 1);
  else
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)B, (int)N, (int)K, 1.0f, x, (int)K, W,
                (int)K, 0.0f, y, (int)N);
  for (int64_t i = 0; i < B; i++)
    for (int64_t j = 0; j < N; j++) {
      float v = y[i * N + j] + b[j];
      y[i * N + j] = relu && v < 0.0f ? 0.0f : v;
    }
}

static void mlp_blas(net *n, int64_t B) {
  blas_layer(n->W[0], n->b[0], n->x, B, IN[0], OUT[0], n->h1, 1);
  blas_layer(n->W[1], n->b[1], n->h1, B, IN[1], OUT[1], n->h2, 1);
  blas_layer(n->W[2], n->b[2], n->h2, B, IN[2], OUT[2], n->y, 0);
}

/* Runs fn until `seconds` have passed (after a warm-up); seconds per call. */
static double time_it(void (*fn)(void *, int64_t), void *arg, int64_t B, double seconds) {
  for (int i = 0; i < 3; i++) fn(arg, B);
  long iters = 0;
  double t0 = bench_now(), t;
  do {
    fn(arg, B);
    iters++;
    t = bench_now();
  } while (t - t0 < seconds);
  return (t - t0) / (double)iters;
}

static void call_grove(void *n, int64_t B) {
  mlp_grove(n, B);
}
static void call_blas(void *n, int64_t B) {
  mlp_blas(n, B);
}

typedef struct one_layer {
  net *n;
  int l;
} one_layer;
static void call_grove_layer(void *a, int64_t B) {
  one_layer *o = a;
  grove__linear_run(o->n->pk[o->l], o->n->x, B, o->n->b[o->l], o->n->h1, GROVE__ACT_RELU);
}
static void call_blas_layer(void *a, int64_t B) {
  one_layer *o = a;
  blas_layer(o->n->W[o->l], o->n->b[o->l], o->n->x, B, IN[o->l], OUT[o->l], o->n->h1, 1);
}

static void print_layers(net *n, int64_t B, double seconds, int blas) {
  for (int l = 0; l < NL; l++) {
    one_layer o = {n, l};
    double t = time_it(blas ? call_blas_layer : call_grove_layer, &o, B, seconds);
    double f = 2.0 * (double)(IN[l] * OUT[l] * B);
    printf("  %s layer %d (%lldx%lld) batch=%-4lld %7.1f GFLOP/s %8.2f us\n",
           blas ? "cblas" : "grove", l, (long long)IN[l], (long long)OUT[l], (long long)B,
           f / t * 1e-9, t * 1e6);
  }
}

#define MAXB 16
#define MAXR 64

int main(int argc, char **argv) {
  int threads = 2, layers = 0, with_blas = 1, rounds = 5;
  double seconds = 2.0;
  const char *batches = "1,64,256";
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--threads") && i + 1 < argc)
      threads = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--seconds") && i + 1 < argc)
      seconds = atof(argv[++i]);
    else if (!strcmp(argv[i], "--rounds") && i + 1 < argc)
      rounds = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--batches") && i + 1 < argc)
      batches = argv[++i];
    else if (!strcmp(argv[i], "--layers"))
      layers = 1;
    else if (!strcmp(argv[i], "--no-blas"))
      with_blas = 0;
    else {
      fprintf(stderr,
              "usage: %s [--threads T] [--seconds S] [--rounds R] [--batches 1,64,256] "
              "[--layers] [--no-blas]\n",
              argv[0]);
      return 2;
    }
  }
  if (rounds < 1) rounds = 1;
  if (rounds > MAXR) rounds = MAXR;
  grove_set_compute_threads(threads);

  net n = {.maxb = 1024};
  unsigned seed = 1;
  for (int l = 0; l < NL; l++) {
    n.W[l] = malloc((size_t)(IN[l] * OUT[l]) * sizeof(float));
    n.b[l] = malloc((size_t)OUT[l] * sizeof(float));
    if (!n.W[l] || !n.b[l]) return 1;
    for (int64_t i = 0; i < IN[l] * OUT[l]; i++) n.W[l][i] = frand(&seed) * 0.07f;
    for (int64_t i = 0; i < OUT[l]; i++) n.b[l][i] = frand(&seed) * 0.1f;
    n.pk[l] = grove__linear_pack_new(n.W[l], OUT[l], IN[l]);
    if (!n.pk[l]) {
      fprintf(stderr, "out of memory\n");
      return 1;
    }
  }
  size_t act = (size_t)(n.maxb * 1024) * sizeof(float);
  n.x = malloc(act);
  n.h1 = malloc(act);
  n.h2 = malloc(act);
  n.y = malloc(act);
  float *yref = malloc(act);
  if (!n.x || !n.h1 || !n.h2 || !n.y || !yref) return 1;
  for (int64_t i = 0; i < n.maxb * 1024; i++) n.x[i] = frand(&seed);

  double flops_per_sample = 0;
  for (int l = 0; l < NL; l++) flops_per_sample += 2.0 * (double)(IN[l] * OUT[l]);
  const char *ct = getenv("OPENBLAS_CORETYPE");
  const char *gg = getenv("GROVE_GEMM");
  printf(
      "# reference MLP 784-1024-1024-10, threads=%d, rounds=%d, OPENBLAS_CORETYPE=%s, "
      "GROVE_GEMM=%s\n",
      threads, rounds, ct ? ct : "(unset)", gg ? gg : "(auto)");

  int64_t bs[MAXB];
  int nb = 0;
  char *list = strdup(batches);
  for (char *tok = strtok(list, ","); tok && nb < MAXB; tok = strtok(NULL, ",")) {
    int64_t B = atoll(tok);
    if (B >= 1 && B <= n.maxb) bs[nb++] = B;
  }
  free(list);

  /* Sanity: both engines compute the same thing. */
  for (int i = 0; i < nb && with_blas; i++) {
    mlp_grove(&n, bs[i]);
    memcpy(yref, n.y, (size_t)(bs[i] * 10) * sizeof(float));
    mlp_blas(&n, bs[i]);
    double d = 0;
    for (int64_t k = 0; k < bs[i] * 10; k++) {
      double e = yref[k] > n.y[k] ? yref[k] - n.y[k] : n.y[k] - yref[k];
      if (e > d) d = e;
    }
    printf("# batch=%lld max |grove - cblas| = %.3g\n", (long long)bs[i], d);
  }

  /* In each round, Grove's figures for every batch, then cblas's, then a
   * pause: OpenBLAS's own threads keep spinning for a while after a call
   * and would take the core Grove's helper runs on. */
  static double tg[MAXB][MAXR], tb[MAXB][MAXR];
  double slice = seconds / rounds;
  for (int r = 0; r < rounds; r++) {
    for (int i = 0; i < nb; i++) tg[i][r] = time_it(call_grove, &n, bs[i], slice);
    if (!with_blas) continue;
    for (int i = 0; i < nb; i++) tb[i][r] = time_it(call_blas, &n, bs[i], slice);
    usleep(200000);
  }
  if (layers) {
    for (int i = 0; i < nb; i++) print_layers(&n, bs[i], slice, 0);
    for (int i = 0; i < nb && with_blas; i++) print_layers(&n, bs[i], slice, 1);
  }
  for (int i = 0; i < nb; i++) {
    long long B = (long long)bs[i];
    double g = bench_median(tg[i], rounds);
    printf("grove  mlp batch=%-4lld samples_per_s=%9.1f ms_per_batch=%8.4f gflops=%6.1f\n", B,
           (double)B / g, g * 1e3, flops_per_sample * (double)B / g * 1e-9);
    if (!with_blas) continue;
    double c = bench_median(tb[i], rounds);
    printf("cblas  mlp batch=%-4lld samples_per_s=%9.1f ms_per_batch=%8.4f gflops=%6.1f\n", B,
           (double)B / c, c * 1e3, flops_per_sample * (double)B / c * 1e-9);
    printf("ratio  mlp batch=%-4lld grove/cblas=%.2f\n", B, c / g);
  }
  for (int l = 0; l < NL; l++) {
    grove__linear_pack_free(n.pk[l]);
    free(n.W[l]);
    free(n.b[l]);
  }
  free(n.x);
  free(n.h1);
  free(n.h2);
  free(n.y);
  free(yref);
  return 0;
}
