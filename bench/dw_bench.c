/* dw_bench.c: the depthwise kernel (core/kernels/depthwise.c) alone, one
 * layer at a time, on the shapes MobileNetV2, MobileNetV3-Large and
 * EfficientNet-B0 run at 224x224 (channels, input size, kernel, stride).
 *
 *   make dw-bench && build/release/bench/dw_bench [--iters N] [--layers C:HW:K:S,...]
 *
 * Each layer's rows are computed one after another on one thread (in
 * pairs where grove__depthwise_pairs says the kernel takes them), N times
 * (default 60); the smallest time is printed (on a shared host time only
 * grows with the load, so the minimum is the least disturbed figure), with
 * GFLOP/s of its multiply-adds and a checksum of the output (the same
 * checksum from two builds says the same results).  The input and output
 * of the larger layers are beyond L2, as in a whole network's forward where
 * the layer before wrote them.  Figures only, no assertions. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_time.h"
#include "internal.h"

static const char *DEFAULT_LAYERS =
    "32:112:3:1,96:112:3:2,144:56:3:1,72:56:3:1,64:112:3:2,144:56:5:2,240:28:5:1,120:28:5:1,"
    "480:14:3:1,672:14:5:1,672:14:5:2,960:7:5:1,1152:7:5:1";

int main(int argc, char **argv) {
  int iters = 60;
  const char *spec = DEFAULT_LAYERS;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--iters") && i + 1 < argc)
      iters = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--layers") && i + 1 < argc)
      spec = argv[++i];
    else {
      fprintf(stderr, "usage: %s [--iters N] [--layers C:HW:K:S,...]\n", argv[0]);
      return 2;
    }
  }
  if (iters < 1) iters = 1;
  double total = 0;
  for (const char *s = spec; *s;) {
    long long C, H, k, st;
    int used = 0;
    if (sscanf(s, "%lld:%lld:%lld:%lld%n", &C, &H, &k, &st, &used) != 4 || C < 1 || H < 1 ||
        k < 1 || st < 1 || C > 4096 || H > 1024 || k > 11) {
      fprintf(stderr, "dw_bench: bad layer '%s' (want C:HW:K:STRIDE)\n", s);
      return 2;
    }
    s += used;
    if (*s == ',') s++;
    const int64_t p = k / 2, OH = (H + 2 * p - k) / st + 1;
    float *x = malloc(sizeof(float) * (size_t)(H * H * C));
    float *y = malloc(sizeof(float) * (size_t)(OH * OH * C));
    float *w = malloc(sizeof(float) * (size_t)(k * k * C));
    float *sc = malloc(sizeof(float) * (size_t)C), *sh = malloc(sizeof(float) * (size_t)C);
    if (!x || !y || !w || !sc || !sh) {
      fprintf(stderr, "dw_bench: out of memory\n");
      return 1;
    }
    for (int64_t i = 0; i < H * H * C; i++) x[i] = (float)((i * 7919) % 1000) / 1000.0f - 0.5f;
    for (int64_t i = 0; i < k * k * C; i++) w[i] = (float)((i * 31) % 100) / 100.0f - 0.5f;
    for (int64_t i = 0; i < C; i++) {
      sc[i] = 1.0f;
      sh[i] = 0.1f;
    }
    const grove__dw_args a = {.H = H, .W = H, .C = C, .OH = OH, .OW = OH, .kh = k, .kw = k,
                              .sh = st, .sw = st, .dh = 1, .dw = 1, .ph = p, .pw = p, .w = w,
                              .scale = sc, .shift = sh, .lo = 0.0f, .hi = 6.0f};
    double best = 1e30;
    for (int r = 0; r < iters; r++) {
      const double t0 = bench_now();
      /* Rows in pairs where the kernel computes two at once, as layers_conv.c
       * hands them to it. */
      const bool pairs = grove__depthwise_pairs(&a);
      for (int64_t oh = 0; oh < OH;) {
        if (pairs && oh + 1 < OH) {
          grove__depthwise_rows2(&a, x, oh, y + oh * OH * C, y + (oh + 1) * OH * C);
          oh += 2;
        } else {
          grove__depthwise_row(&a, x, oh, y + oh * OH * C);
          oh++;
        }
      }
      const double t = bench_now() - t0;
      if (t < best) best = t;
    }
    double sum = 0;
    for (int64_t i = 0; i < OH * OH * C; i++) sum += y[i];
    const double flops = 2.0 * (double)(OH * OH * C * k * k);
    printf("C %4lld  %3lldx%-3lld  %lldx%lld stride %lld  %8.1f us  %6.1f GFLOP/s", C, H, H, k, k,
           st, best * 1e6, flops / best * 1e-9);
    printf("  (checksum %.6g)\n", sum);
    total += best;
    free(x);
    free(y);
    free(w);
    free(sc);
    free(sh);
  }
  printf("total %.1f us\n", total * 1e6);
  return 0;
}
