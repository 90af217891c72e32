/* check_zip.c: hostile zip archives for the torch.save reader
 * (core/io/torch_zip.c), built here byte by byte: records that overlap one
 * another or the central directory (the zip bombs that made a 24.5 KB file
 * inflate to 512 MiB), and deflate streams that end before their record.
 * The well-formed archives and the other refusals are in check_torch.c. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "testutil.h"
#include "torch_craft.h"
#include "torch_internal.h"

/* ------------------------------------------------------------ builder */

typedef struct zrec {
  const char *name;
  uint16_t method;
  uint64_t lho;        /* local header offset the central entry names */
  uint32_t comp, size; /* as the central entry claims them */
} zrec;

static void put16(bytes *b, uint16_t v) {
  uint8_t x[2] = {(uint8_t)v, (uint8_t)(v >> 8)};
  b_put(b, x, 2);
}

/* A local header (sizes as given, CRC 0: not checked) and its name. */
static void local_header(bytes *b, const char *name, uint16_t method, uint32_t comp,
                         uint32_t size) {
  b_u32(b, 0x04034b50u);
  put16(b, 20);
  put16(b, 0);
  put16(b, method);
  put16(b, 0);
  put16(b, 0);
  b_u32(b, 0);
  b_u32(b, comp);
  b_u32(b, size);
  put16(b, (uint16_t)strlen(name));
  put16(b, 0);
  b_put(b, name, strlen(name));
}

/* The central directory of the records and the end record, appended. */
static void directory(bytes *b, const zrec *r, size_t n) {
  size_t cd_off = b->n;
  for (size_t i = 0; i < n; i++) {
    b_u32(b, 0x02014b50u);
    put16(b, 20);
    put16(b, 20);
    put16(b, 0);
    put16(b, r[i].method);
    put16(b, 0);
    put16(b, 0);
    b_u32(b, 0);
    b_u32(b, r[i].comp);
    b_u32(b, r[i].size);
    put16(b, (uint16_t)strlen(r[i].name));
    put16(b, 0);
    put16(b, 0);
    put16(b, 0);
    put16(b, 0);
    b_u32(b, 0);
    b_u32(b, (uint32_t)r[i].lho);
    b_put(b, r[i].name, strlen(r[i].name));
  }
  size_t cd_size = b->n - cd_off;
  b_u32(b, 0x06054b50u);
  put16(b, 0);
  put16(b, 0);
  put16(b, (uint16_t)n);
  put16(b, (uint16_t)n);
  b_u32(b, (uint32_t)cd_size);
  b_u32(b, (uint32_t)cd_off);
  put16(b, 0);
}

static grove_status open_zip(const bytes *b, grove_err *err) {
  grove__zip z;
  grove_status st = grove__zip_open(&z, b->p, b->n, "crafted.pt", err);
  grove__zip_close(&z);
  return st;
}

static void assert_says(const grove_err *err, const char *text) {
  ck_assert_msg(strstr(err->msg, text) != NULL, "message '%s' does not mention '%s'", err->msg,
                text);
}

/* ------------------------------------------------------------ tests */

/* The harness first builds a valid two-record archive (the reader accepts
 * it), then the same bytes with the records' ranges overlapping. */
START_TEST(test_zip_overlapping_records) {
  grove_err err = {0};
  bytes b = {0};
  local_header(&b, "a", 0, 4, 4);
  b_put(&b, "abcd", 4);
  size_t lb = b.n;
  local_header(&b, "b", 0, 4, 4);
  b_put(&b, "efgh", 4);
  zrec ok[2] = {{"a", 0, 0, 4, 4}, {"b", 0, lb, 4, 4}};
  directory(&b, ok, 2);
  ck_assert_ok(open_zip(&b, &err), &err);
  b_free(&b);

  /* "a" is stored and its data is the whole of "b" (header and data): the
   * classic overlapping bomb, "b"'s bytes counted twice. */
  memset(&b, 0, sizeof b);
  uint32_t inner = 30 + 1 + 4;
  local_header(&b, "a", 0, inner, inner);
  size_t lb2 = b.n;
  local_header(&b, "b", 0, 4, 4);
  b_put(&b, "efgh", 4);
  zrec nested[2] = {{"a", 0, 0, inner, inner}, {"b", 0, lb2, 4, 4}};
  directory(&b, nested, 2);
  ck_assert_status(open_zip(&b, &err), GROVE_E_FORMAT);
  assert_says(&err, "crafted.pt");
  assert_says(&err, "'a' and 'b' overlap");
  b_free(&b);

  /* A record whose claimed size runs over the central directory. */
  memset(&b, 0, sizeof b);
  local_header(&b, "a", 0, 4 + 47, 4 + 47);
  b_put(&b, "abcd", 4);
  zrec over[1] = {{"a", 0, 0, 4 + 47, 4 + 47}};
  directory(&b, over, 1);
  ck_assert_status(open_zip(&b, &err), GROVE_E_FORMAT);
  assert_says(&err, "overlaps the central directory");
  b_free(&b);
}
END_TEST

/* Many deflated entries whose claimed compressed ranges all cover one
 * stream (through nested local headers): each claims up to 1032 times its
 * compressed size, so that their sum is many times what the file can
 * honestly hold.  Refused before anything is inflated. */
START_TEST(test_zip_bomb_refused) {
  grove_err err = {0};
  size_t zlen = 1 << 20;
  uint8_t *zeros = calloc(1, zlen), *def = NULL;
  size_t dlen = 0;
  ck_assert_ok(grove__zip_deflate(zeros, zlen, &def, &dlen, &err), &err);
  free(zeros);
  /* Records r0..r7: each one's data is the next one's local header and so
   * on, the last one's data the deflate stream; all deflated (a header
   * inside a deflated range is just bytes to the reader). */
  enum { N = 8 };
  char names[N][16];
  zrec r[N];
  bytes b = {0};
  uint64_t total = 0;
  for (int i = 0; i < N; i++) {
    snprintf(names[i], sizeof names[i], "r%d", i);
    uint32_t comp = (uint32_t)((N - 1 - i) * (30 + 2) + dlen);
    r[i] = (zrec){names[i], 8, b.n, comp, (uint32_t)zlen};
    total += zlen;
    local_header(&b, names[i], 8, comp, (uint32_t)zlen);
  }
  b_put(&b, def, dlen);
  free(def);
  directory(&b, r, N);
  ck_assert_status(open_zip(&b, &err), GROVE_E_FORMAT);
  assert_says(&err, "overlap");
  ck_assert(total > 1032 * (uint64_t)b.n / 2); /* the bomb would have been one */
  b_free(&b);
}
END_TEST

/* The ratio check uses the compressed size the entry claims; a stream that
 * ends early would let the claim cover bytes the record does not use. */
START_TEST(test_zip_stream_ends_early) {
  grove_err err = {0};
  const char text[] = "grove grove grove grove";
  uint8_t *def = NULL;
  size_t dlen = 0;
  ck_assert_ok(grove__zip_deflate(text, sizeof text, &def, &dlen, &err), &err);
  for (int pad = 0; pad <= 1; pad++) {
    bytes b = {0};
    uint32_t comp = (uint32_t)dlen + (pad ? 64u : 0u);
    local_header(&b, "a", 8, comp, sizeof text);
    b_put(&b, def, dlen);
    for (int i = 0; i < (pad ? 64 : 0); i++) b_op(&b, 0);
    zrec r[1] = {{"a", 8, 0, comp, sizeof text}};
    directory(&b, r, 1);
    grove__zip z;
    ck_assert_ok(grove__zip_open(&z, b.p, b.n, "crafted.pt", &err), &err);
    char out[sizeof text];
    grove_status st = grove__zip_extract(&z, &z.entries[0], out, &err);
    if (pad) {
      ck_assert_status(st, GROVE_E_FORMAT);
      assert_says(&err, "ends its deflate stream before the record's last byte");
    } else {
      ck_assert_ok(st, &err);
      ck_assert_mem_eq(out, text, sizeof text);
    }
    grove__zip_close(&z);
    b_free(&b);
  }
  free(def);
}
END_TEST

Suite *zip_suite(void) {
  Suite *s = suite_create("zip");
  TCase *tc = tcase_create("core");
  tcase_add_test(tc, test_zip_overlapping_records);
  tcase_add_test(tc, test_zip_bomb_refused);
  tcase_add_test(tc, test_zip_stream_ends_early);
  suite_add_tcase(s, tc);
  return s;
}

GROVE_TEST_MAIN(zip_suite)
