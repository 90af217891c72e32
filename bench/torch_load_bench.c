/* torch_load_bench.c: how fast Grove reads a checkpoint.
 *
 *   torch_load_bench FILE [ROUNDS]
 *
 * Each round reads FILE with grove_checkpoint_read (safetensors or
 * torch.save zip, by content), then reads every byte of every tensor (a
 * running XOR, so that lazily faulted memory is paid for too), then frees it.
 * Prints one JSON line: the best and median seconds of "read" (the call
 * alone) and "read_touch" (the call plus touching every byte), the tensor
 * bytes, and MB/s (10^6 bytes) of the median read_touch.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "grove/grove.h"

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* XOR of every 8-byte word of every contiguous tensor (others: of every
 * byte), which forces each page in. */
static uint64_t touch(const grove_state_dict *sd) {
  uint64_t acc = 0;
  for (size_t i = 0; i < grove_sd_count(sd); i++) {
    const grove_tensor *t = grove_sd_tensor(sd, i);
    size_t n = grove_tensor_nbytes(t);
    const uint8_t *p = t->data;
    size_t k = 0;
    if (grove_tensor_is_contiguous(t)) {
      for (; k + 8 <= n; k += 8) {
        uint64_t w;
        memcpy(&w, p + k, 8);
        acc ^= w;
      }
    }
    for (; k < n; k++) acc ^= p[k];
  }
  return acc;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s FILE [ROUNDS]\n", argv[0]);
    return 2;
  }
  const char *path = argv[1];
  int rounds = argc > 2 ? atoi(argv[2]) : 5;
  if (rounds < 1) rounds = 1;
  double *rd = calloc((size_t)rounds, sizeof *rd), *rt = calloc((size_t)rounds, sizeof *rt);
  size_t bytes = 0, count = 0;
  uint64_t sink = 0;
  for (int r = 0; r < rounds; r++) {
    grove_err err = {0};
    grove_state_dict *sd = NULL;
    double t0 = now();
    if (grove_checkpoint_read(path, &sd, &err) != GROVE_OK) {
      fprintf(stderr, "%s\n", grove_err_msg(&err));
      return 1;
    }
    double t1 = now();
    sink ^= touch(sd);
    double t2 = now();
    bytes = grove_sd_nbytes(sd);
    count = grove_sd_count(sd);
    grove_sd_free(sd);
    rd[r] = t1 - t0;
    rt[r] = t2 - t0;
  }
  qsort(rd, (size_t)rounds, sizeof *rd, cmp_double);
  qsort(rt, (size_t)rounds, sizeof *rt, cmp_double);
  double med = rt[rounds / 2];
  printf(
      "{\"engine\": \"grove\", \"file\": \"%s\", \"tensors\": %zu, \"bytes\": %zu, "
      "\"rounds\": %d, \"read_best_s\": %.4f, \"read_median_s\": %.4f, "
      "\"read_touch_best_s\": %.4f, \"read_touch_median_s\": %.4f, \"mb_per_s\": %.1f, "
      "\"sink\": %llu}\n",
      path, count, bytes, rounds, rd[0], rd[rounds / 2], rt[0], med,
      med > 0 ? (double)bytes / med / 1e6 : 0.0, (unsigned long long)(sink & 1));
  free(rd);
  free(rt);
  return 0;
}
