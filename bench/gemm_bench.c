/* gemm_bench.c: micro-benchmark of grove__linear_run on the reference MLP
 * (Linear(784,1024) ReLU Linear(1024,1024) ReLU Linear(1024,10), see
 * /work/shared/peers/models.py), layers chained with ReLU fused, against
 * the same chain through plain cblas (sgemv at batch 1, sgemm otherwise,
 * then one bias+ReLU pass).
 *
 * Build and run (bench/gemm.mk has the rule; `make -f bench/gemm.mk` or):
 *   cc -O2 -std=c11 -D_DEFAULT_SOURCE -pthread -Iinclude -Icore \
 *      $(pkg-config --cflags openblas) bench/gemm_bench.c core/gemm.c core/log.c \
 *      -o build/gemm_bench $(pkg-config --libs openblas) -lm
 *   build/gemm_bench [--threads T] [--seconds S] [--batches 1,64,256] [--layers]
 *
 * Prints one line per engine and batch: samples/s, ms per batch, GFLOP/s.
 * --layers also times each layer shape alone.  Figures, not assertions.
 */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "internal.h"

void openblas_set_num_threads(int num_threads);

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

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
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)B, (int)N, (int)K, 1.0f, x, (int)K,
                W, (int)K, 0.0f, y, (int)N);
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
  for (int i = 0; i < 5; i++) fn(arg, B);
  long iters = 0;
  double t0 = now(), t;
  do {
    for (int i = 0; i < 4; i++) fn(arg, B);
    iters += 4;
    t = now();
  } while (t - t0 < seconds);
  return (t - t0) / (double)iters;
}

static void call_grove(void *n, int64_t B) { mlp_grove(n, B); }
static void call_blas(void *n, int64_t B) { mlp_blas(n, B); }

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

int main(int argc, char **argv) {
  int threads = 2, layers = 0, with_blas = 1;
  double seconds = 1.0;
  const char *batches = "1,64,256";
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--seconds") && i + 1 < argc) seconds = atof(argv[++i]);
    else if (!strcmp(argv[i], "--batches") && i + 1 < argc) batches = argv[++i];
    else if (!strcmp(argv[i], "--layers")) layers = 1;
    else if (!strcmp(argv[i], "--no-blas")) with_blas = 0;
    else {
      fprintf(stderr, "usage: %s [--threads T] [--seconds S] [--batches 1,64,256] [--layers] [--no-blas]\n",
              argv[0]);
      return 2;
    }
  }
  grove_set_compute_threads(threads);

  net n = {.maxb = 1024};
  unsigned seed = 1;
  for (int l = 0; l < NL; l++) {
    n.W[l] = malloc((size_t)(IN[l] * OUT[l]) * sizeof(float));
    n.b[l] = malloc((size_t)OUT[l] * sizeof(float));
    for (int64_t i = 0; i < IN[l] * OUT[l]; i++) n.W[l][i] = frand(&seed) * 0.07f;
    for (int64_t i = 0; i < OUT[l]; i++) n.b[l][i] = frand(&seed) * 0.1f;
    n.pk[l] = grove__linear_pack_new(n.W[l], OUT[l], IN[l]);
    if (!n.pk[l]) {
      fprintf(stderr, "out of memory\n");
      return 1;
    }
  }
  n.x = malloc((size_t)(n.maxb * 1024) * sizeof(float));
  n.h1 = malloc((size_t)(n.maxb * 1024) * sizeof(float));
  n.h2 = malloc((size_t)(n.maxb * 1024) * sizeof(float));
  n.y = malloc((size_t)(n.maxb * 1024) * sizeof(float));
  for (int64_t i = 0; i < n.maxb * 1024; i++) n.x[i] = frand(&seed);

  double flops_per_sample = 0;
  for (int l = 0; l < NL; l++) flops_per_sample += 2.0 * (double)(IN[l] * OUT[l]);
  const char *ct = getenv("OPENBLAS_CORETYPE");
  printf("# reference MLP 784-1024-1024-10, threads=%d, OPENBLAS_CORETYPE=%s, GROVE_GEMM=%s\n",
         threads, ct ? ct : "(unset)", getenv("GROVE_GEMM") ? getenv("GROVE_GEMM") : "(auto)");

  /* Grove's figures first, then cblas's: OpenBLAS's own threads keep
   * spinning for a while after each call and would steal the core Grove's
   * helper runs on if the two were interleaved. */
  int64_t bs[16];
  int nb = 0;
  char *list = strdup(batches);
  for (char *tok = strtok(list, ","); tok && nb < 16; tok = strtok(NULL, ",")) {
    int64_t B = atoll(tok);
    if (B >= 1 && B <= n.maxb) bs[nb++] = B;
  }
  double tg[16], tb[16];
  for (int i = 0; i < nb; i++) {
    tg[i] = time_it(call_grove, &n, bs[i], seconds);
    if (layers) {
      for (int l = 0; l < NL; l++) {
        one_layer o = {&n, l};
        double a = time_it(call_grove_layer, &o, bs[i], seconds / 3);
        double f = 2.0 * (double)(IN[l] * OUT[l] * bs[i]);
        printf("  grove layer %d (%lldx%lld) batch=%-4lld %7.1f GFLOP/s %8.2f us\n", l,
               (long long)IN[l], (long long)OUT[l], (long long)bs[i], f / a * 1e-9, a * 1e6);
      }
    }
  }
  for (int i = 0; i < nb && with_blas; i++) {
    tb[i] = time_it(call_blas, &n, bs[i], seconds);
    if (layers) {
      for (int l = 0; l < NL; l++) {
        one_layer o = {&n, l};
        double c = time_it(call_blas_layer, &o, bs[i], seconds / 3);
        double f = 2.0 * (double)(IN[l] * OUT[l] * bs[i]);
        printf("  cblas layer %d (%lldx%lld) batch=%-4lld %7.1f GFLOP/s %8.2f us\n", l,
               (long long)IN[l], (long long)OUT[l], (long long)bs[i], f / c * 1e-9, c * 1e6);
      }
    }
  }
  for (int i = 0; i < nb; i++) {
    long long B = (long long)bs[i];
    printf("grove  mlp batch=%-4lld samples_per_s=%9.1f ms_per_batch=%8.4f gflops=%6.1f\n", B,
           (double)B / tg[i], tg[i] * 1e3, flops_per_sample * (double)B / tg[i] * 1e-9);
    if (!with_blas) continue;
    printf("cblas  mlp batch=%-4lld samples_per_s=%9.1f ms_per_batch=%8.4f gflops=%6.1f\n", B,
           (double)B / tb[i], tb[i] * 1e3, flops_per_sample * (double)B / tb[i] * 1e-9);
    printf("ratio  mlp batch=%-4lld grove/cblas=%.2f\n", B, tb[i] / tg[i]);
  }
  free(list);
  for (int l = 0; l < NL; l++) {
    grove__linear_pack_free(n.pk[l]);
    free(n.W[l]);
    free(n.b[l]);
  }
  free(n.x);
  free(n.h1);
  free(n.h2);
  free(n.y);
  return 0;
}
