/* torch_craft.h: building torch.save archives byte by byte for the Check
 * suites that test the readers' refusals (check_torch.c, check_optim.c):
 * pickle opcodes, _rebuild_tensor_v2 calls, zip archives in memory.  Header-only (static inline) so
 * that each suite links alone, as the Makefile builds them. */
#ifndef GROVE_TESTS_TORCH_CRAFT_H
#define GROVE_TESTS_TORCH_CRAFT_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"
#include "torch_internal.h"

/* A string literal and its length without the NUL. */
#define LIT(s) s, sizeof(s) - 1

/* ------------------------------------------------------------ pickle bytes */

typedef struct bytes {
  uint8_t *p;
  size_t n, cap;
} bytes;

static inline void b_put(bytes *b, const void *d, size_t n) {
  if (b->n + n > b->cap) {
    b->cap = (b->n + n) * 2 + 64;
    b->p = realloc(b->p, b->cap);
    ck_assert_ptr_nonnull(b->p);
  }
  memcpy(b->p + b->n, d, n);
  b->n += n;
}
static inline void b_op(bytes *b, uint8_t o) {
  b_put(b, &o, 1);
}
static inline void b_u32(bytes *b, uint32_t v) {
  uint8_t x[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
  b_put(b, x, 4);
}
static inline void b_str(bytes *b, const char *s) {
  b_op(b, 'X');
  b_u32(b, (uint32_t)strlen(s));
  b_put(b, s, strlen(s));
}
static inline void b_int(bytes *b, int64_t v) {
  if (v >= 0 && v < 256) {
    b_op(b, 'K');
    b_op(b, (uint8_t)v);
  } else {
    uint8_t x[10] = {0x8a, 8};
    for (int i = 0; i < 8; i++) x[2 + i] = (uint8_t)((uint64_t)v >> (8 * i));
    b_put(b, x, 10);
  }
}
static inline void b_global(bytes *b, const char *mod, const char *name) {
  b_op(b, 'c');
  b_put(b, mod, strlen(mod));
  b_op(b, '\n');
  b_put(b, name, strlen(name));
  b_op(b, '\n');
}
static inline void b_tuple(bytes *b, int n, const int64_t *v) {
  b_op(b, '(');
  for (int i = 0; i < n; i++) b_int(b, v[i]);
  b_op(b, 't');
}
static inline void b_free(bytes *b) {
  free(b->p);
}

/* Emits _rebuild_tensor_v2(('storage', torch.<cls>, key, 'cpu', numel),
 * offset, size, stride, False, OrderedDict()). */
static inline void b_tensor(bytes *b, const char *cls, const char *key, int64_t numel,
                            int64_t offset, int nd, const int64_t *shape, const int64_t *stride) {
  b_global(b, "torch._utils", "_rebuild_tensor_v2");
  b_op(b, '(');
  b_op(b, '(');
  b_str(b, "storage");
  b_global(b, "torch", cls);
  b_str(b, key);
  b_str(b, "cpu");
  b_int(b, numel);
  b_op(b, 't');
  b_op(b, 'Q');
  b_int(b, offset);
  b_tuple(b, nd, shape);
  b_tuple(b, nd, stride);
  b_op(b, 0x89);
  b_global(b, "collections", "OrderedDict");
  b_op(b, ')');
  b_op(b, 'R');
  b_op(b, 't');
  b_op(b, 'R');
}

/* Starts an OrderedDict and a MARK for its items. */
static inline void b_begin_sd(bytes *b) {
  b_op(b, 0x80);
  b_op(b, 2);
  b_global(b, "collections", "OrderedDict");
  b_op(b, ')');
  b_op(b, 'R');
  b_op(b, '(');
}
static inline void b_end_sd(bytes *b) {
  b_op(b, 'u');
  b_op(b, '.');
}

/* ------------------------------------------------------------ archives */

typedef struct rec {
  const char *name;
  const void *data;
  size_t len;
} rec;

/* A zip archive (in memory, malloc'd) of the given records. */
static inline uint8_t *make_zip(const rec *recs, size_t n, const grove__zipw_opts *opts,
                                size_t *len) {
  grove_err err = {0};
  grove__zipw *w = grove__zipw_new(-1, "test", opts);
  ck_assert_ptr_nonnull(w);
  for (size_t i = 0; i < n; i++)
    ck_assert_ok(grove__zipw_add(w, recs[i].name, recs[i].data, recs[i].len, &err), &err);
  ck_assert_ok(grove__zipw_finish(w, &err), &err);
  const uint8_t *d = grove__zipw_data(w, len);
  uint8_t *copy = malloc(*len);
  memcpy(copy, d, *len);
  grove__zipw_free(w);
  return copy;
}

/* An archive of data.pkl = pkl plus storage records data/0.. (f32 arange
 * of the given element counts), read back from memory. */
static inline grove_status read_crafted(const bytes *pkl, const int64_t *numels, size_t nstorages,
                                        grove_state_dict **out, grove_err *err) {
  rec recs[10];
  float *data[8] = {0};
  char names[8][48];
  size_t n = 0;
  recs[n++] = (rec){"archive/data.pkl", pkl->p, pkl->n};
  for (size_t s = 0; s < nstorages; s++) {
    data[s] = malloc((size_t)numels[s] * sizeof(float) + 1);
    for (int64_t i = 0; i < numels[s]; i++) data[s][i] = (float)i;
    snprintf(names[s], sizeof names[s], "archive/data/%zu", s);
    recs[n++] = (rec){names[s], data[s], (size_t)numels[s] * sizeof(float)};
  }
  recs[n++] = (rec){"archive/version", "3\n", 2};
  size_t len;
  uint8_t *zip = make_zip(recs, n, NULL, &len);
  for (size_t s = 0; s < nstorages; s++) free(data[s]);
  grove_status st = grove__torch_read_buffer(zip, len, "crafted.pt", NULL, out, err);
  free(zip);
  return st;
}

static inline void assert_mentions(const grove_err *err, const char *text) {
  ck_assert_msg(strstr(err->msg, text) != NULL, "message '%s' does not mention '%s'", err->msg,
                text);
}

#endif
