/* fuzz_common.h: what every fuzz target checks beyond "no crash": a file
 * that reads must hold tensors whose every byte is readable, and must come
 * back identical through Grove's own writer.  A violated expectation is a
 * bug: __builtin_trap makes libFuzzer report it with the input. */
#ifndef GROVE_FUZZ_COMMON_H
#define GROVE_FUZZ_COMMON_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "grove/grove.h"
#include "torch_internal.h"

#define FUZZ_CHECK(cond)           \
  do {                             \
    if (!(cond)) __builtin_trap(); \
  } while (0)

/* Tensors up to this size are gathered whole by the checks below; larger
 * ones (expanded views: the reader keeps stride 0, so a tiny file can hold
 * a view of 2^40 elements) have their first and last elements read. */
#define FUZZ_GATHER_MAX ((size_t)16 << 20)

/* Reads every element of every tensor, or the two ends of the bytes a big
 * view reaches (ASan catches a view that reaches outside its storage). */
static void fuzz_touch(const grove_state_dict *sd) {
  for (size_t i = 0; i < grove_sd_count(sd); i++) {
    const grove_tensor *t = grove_sd_tensor(sd, i);
    size_t n = grove_tensor_nbytes(t), es = grove_dtype_size(t->dtype);
    if (n == 0) continue;
    uint64_t last = 0;
    for (int d = 0; d < t->ndim; d++) last += (uint64_t)(t->shape[d] - 1) * (uint64_t)t->strides[d];
    volatile uint8_t sink = ((const uint8_t *)t->data)[0];
    sink ^= ((const uint8_t *)t->data)[last * es + es - 1];
    (void)sink;
    if (n > FUZZ_GATHER_MAX) continue;
    uint8_t *buf = malloc(n);
    FUZZ_CHECK(buf != NULL);
    grove__tensor_gather(t, buf);
    free(buf);
  }
}

static void fuzz_same(const grove_state_dict *a, const grove_state_dict *b) {
  FUZZ_CHECK(grove_sd_count(a) == grove_sd_count(b));
  for (size_t i = 0; i < grove_sd_count(a); i++) {
    FUZZ_CHECK(strcmp(grove_sd_key(a, i), grove_sd_key(b, i)) == 0);
    const grove_tensor *x = grove_sd_tensor(a, i), *y = grove_sd_tensor(b, i);
    FUZZ_CHECK(x->dtype == y->dtype && grove_tensor_same_shape(x, y));
    size_t n = grove_tensor_nbytes(x);
    uint8_t *bx = malloc(n ? n : 1), *by = malloc(n ? n : 1);
    FUZZ_CHECK(bx && by);
    grove__tensor_gather(x, bx);
    grove__tensor_gather(y, by);
    FUZZ_CHECK(memcmp(bx, by, n) == 0);
    free(bx);
    free(by);
  }
  FUZZ_CHECK(grove_sd_meta_count(a) == grove_sd_meta_count(b));
}

/* Reads an archive; when it reads, touches it and round-trips it through
 * grove__torch_write_buffer. */
static void fuzz_torch_archive(const uint8_t *data, size_t size) {
  grove_err err = {0};
  grove_state_dict *sd = NULL;
  grove_status st = grove__torch_read_buffer(data, size, "fuzz.pt", NULL, &sd, &err);
  FUZZ_CHECK((st == GROVE_OK) == (sd != NULL));
  FUZZ_CHECK(st == GROVE_OK || err.code == st);
  if (st != GROVE_OK) return;
  fuzz_touch(sd);
  size_t total = 0;
  for (size_t i = 0; i < grove_sd_count(sd); i++)
    total += grove_tensor_nbytes(grove_sd_tensor(sd, i));
  if (total > FUZZ_GATHER_MAX) { /* written out, too big to compare quickly */
    grove_sd_free(sd);
    return;
  }
  uint8_t *out = NULL;
  size_t len = 0;
  FUZZ_CHECK(grove__torch_write_buffer(sd, "archive", NULL, &out, &len, &err) == GROVE_OK);
  grove_state_dict *back = NULL;
  FUZZ_CHECK(grove__torch_read_buffer(out, len, "fuzz-back.pt", NULL, &back, &err) == GROVE_OK);
  fuzz_same(sd, back);
  grove_sd_free(back);
  free(out);
  grove_sd_free(sd);
}

#endif
