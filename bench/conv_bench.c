/* conv_bench.c: one Conv2d at a time, two lowerings side by side, in the
 * same process: the default choice (Winograd for a 3x3 stride-1 layer)
 * and GROVE_CONV=rows (the patch rows through the packed GEMM).
 *
 *   make conv-bench && build/release/bench/conv_bench [--threads T] [--iters N]
 *        [--copies C] [--layers CIN:COUT:K:STRIDE:HW:BATCH,...]
 *
 * Each layer is built twice (GROVE_CONV set while the second packs), with
 * C copies of each so that the weights come from beyond L2, as they do in
 * a whole network's forward.  The two alternate forward by forward and the
 * smallest per-forward time of each is printed (time on a shared host only
 * grows with the load, so the minimum is the least disturbed figure), as
 * GFLOP/s of the direct convolution's multiply-adds and the ratio.  The
 * default layers are ResNet-50's 3x3 stride-1 convolutions at 224x224.
 * Figures only, no assertions. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_time.h"
#include "internal.h"

#define MAXC 16

typedef struct layer {
  long long cin, cout, k, stride, hw, batch;
  grove_module *m[2][MAXC];
  grove_tensor *x;
} layer;

static grove_module *make(const layer *l, bool rows, unsigned *seed, grove_err *err) {
  if (rows)
    setenv("GROVE_CONV", "rows", 1);
  else
    unsetenv("GROVE_CONV");
  grove_conv_opts o = {.kernel_size = {l->k, l->k}, .stride = {l->stride, l->stride},
                       .padding = {l->k / 2, l->k / 2}, .dilation = {1, 1}, .groups = 1};
  grove_module *m = NULL;
  if (grove_conv2d_new(l->cin, l->cout, &o, &m, err)) return NULL;
  grove_tensor *w = grove_module_param(m, "weight");
  float *d = w->data;
  for (int64_t i = 0; i < grove_tensor_numel(w); i++) {
    *seed = *seed * 1664525u + 1013904223u;
    d[i] = ((float)(*seed >> 8) / 16777216.0f - 0.5f) * 0.1f;
  }
  if (m->type->refresh && m->type->refresh(m, err)) return NULL;
  unsetenv("GROVE_CONV");
  return m;
}

static const char *DEFAULT_LAYERS =
    "64:64:3:1:56:1,128:128:3:1:28:1,256:256:3:1:14:1,512:512:3:1:7:1";

int main(int argc, char **argv) {
  int threads = 1, iters = 20, copies = 4;
  const char *spec = DEFAULT_LAYERS;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--threads") && i + 1 < argc)
      threads = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--iters") && i + 1 < argc)
      iters = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--copies") && i + 1 < argc)
      copies = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--layers") && i + 1 < argc)
      spec = argv[++i];
    else {
      fprintf(stderr,
              "usage: %s [--threads T] [--iters N] [--copies C] "
              "[--layers CIN:COUT:K:STRIDE:HW:BATCH,...]\n",
              argv[0]);
      return 2;
    }
  }
  if (copies < 1) copies = 1;
  if (copies > MAXC) copies = MAXC;
  if (iters < 1) iters = 1;
  grove_set_compute_threads(threads);
  grove_err err = {0};
  grove_arena *arena = grove_arena_new(0);
  unsigned seed = 5;
  printf("# conv_bench: %d thread(s), kernel %s, %d copies, min of %d forwards\n", threads,
         grove_compute_kernel(), copies, iters);
  char *list = strdup(spec);
  for (char *tok = strtok(list, ","); tok; tok = strtok(NULL, ",")) {
    layer l = {0};
    if (sscanf(tok, "%lld:%lld:%lld:%lld:%lld:%lld", &l.cin, &l.cout, &l.k, &l.stride, &l.hw,
               &l.batch) != 6 ||
        l.cin < 1 || l.cout < 1 || l.k < 1 || l.stride < 1 || l.hw < l.k || l.batch < 1 ||
        l.cin > 4096 || l.cout > 4096 || l.hw > 1024 || l.batch > 256) {
      fprintf(stderr, "conv_bench: bad layer '%s' (CIN:COUT:K:STRIDE:HW:BATCH)\n", tok);
      return 2;
    }
    for (int v = 0; v < 2; v++)
      for (int c = 0; c < copies; c++)
        if (!(l.m[v][c] = make(&l, v == 1, &seed, &err))) {
          fprintf(stderr, "conv_bench: %s\n", err.msg);
          return 1;
        }
    int64_t shape[4] = {l.batch, l.cin, l.hw, l.hw};
    if (!(l.x = grove_tensor_new(GROVE_F32, 4, shape, &err))) return 1;
    float *xd = l.x->data;
    for (int64_t i = 0; i < grove_tensor_numel(l.x); i++) {
      seed = seed * 1664525u + 1013904223u;
      xd[i] = (float)(seed >> 8) / 16777216.0f - 0.5f;
    }
    double best[2] = {1e30, 1e30};
    for (int it = -1; it < iters; it++)
      for (int v = 0; v < 2; v++)
        for (int c = 0; c < copies; c++) {
          grove_fwd f = {.arena = arena, .err = &err};
          grove_tensor y;
          double t0 = bench_now();
          if (grove_module_call(l.m[v][c], &f, l.x, &y)) {
            fprintf(stderr, "conv_bench: %s\n", err.msg);
            return 1;
          }
          double t = bench_now() - t0;
          grove_arena_reset(arena);
          if (it >= 0 && t < best[v]) best[v] = t;
        }
    const long long o = (l.hw + 2 * (l.k / 2) - l.k) / l.stride + 1;
    const double flop = 2.0 * (double)(l.batch * o * o * l.cout * l.cin * l.k * l.k);
    printf("cin=%-4lld cout=%-4lld k=%lld s=%lld %3lldx%-3lld batch=%-3lld default %7.1f GFLOP/s "
           "(%.3f ms)  rows %7.1f GFLOP/s (%.3f ms)  default/rows time %.2f\n",
           l.cin, l.cout, l.k, l.stride, l.hw, l.hw, l.batch, flop / best[0] * 1e-9,
           best[0] * 1e3, flop / best[1] * 1e-9, best[1] * 1e3, best[0] / best[1]);
    for (int v = 0; v < 2; v++)
      for (int c = 0; c < copies; c++) grove_module_release(l.m[v][c]);
    grove_tensor_release(l.x);
  }
  free(list);
  grove_arena_free(arena);
  return 0;
}
