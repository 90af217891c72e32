/* check_npy.c: client/npy.c, the .npy reader and writer of the grove CLI.
 *
 *   - round trips of every dtype and of 0-d, 1-d, empty and strided tensors,
 *     through memory and through files;
 *   - files written by numpy itself (tests/fixtures_gen/npy.py: versions 1.0,
 *     2.0, 3.0, every dtype, Fortran order, big-endian, structured), read
 *     element for element and, for numpy.save's own layout, re-encoded byte
 *     for byte;
 *   - malformed files built here, each answered with its exact status and a
 *     message naming the file. */
#include "npy.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "testutil.h"

/* ------------------------------------------------------------ helpers */

/* A .npy image with the given version, header text (padded to 64 bytes with
 * spaces and '\n', unless raw) and data_len bytes of data (0x11 each). */
typedef struct image {
  unsigned char *buf;
  size_t len;
} image;

static image make_npy(int major, int minor, const char *header, size_t data_len) {
  size_t lenbytes = major == 1 ? 2 : 4;
  size_t hn = strlen(header);
  size_t pre = 8 + lenbytes;
  size_t padded = hn + 1;
  while ((pre + padded) % 64) padded++;
  image im;
  im.len = pre + padded + data_len;
  im.buf = malloc(im.len);
  ck_assert_ptr_nonnull(im.buf);
  memcpy(im.buf, "\x93NUMPY", 6);
  im.buf[6] = (unsigned char)major;
  im.buf[7] = (unsigned char)minor;
  im.buf[8] = (unsigned char)(padded & 0xff);
  im.buf[9] = (unsigned char)((padded >> 8) & 0xff);
  if (lenbytes == 4) {
    im.buf[10] = (unsigned char)((padded >> 16) & 0xff);
    im.buf[11] = (unsigned char)(padded >> 24);
  }
  memcpy(im.buf + pre, header, hn);
  memset(im.buf + pre + hn, ' ', padded - hn - 1);
  im.buf[pre + padded - 1] = '\n';
  memset(im.buf + pre + padded, 0x11, data_len);
  return im;
}

/* Decodes im and expects status; for a failure, the message must name the
 * file.  Also writes it to a file and expects the same from grove_npy_read. */
static void expect_status(image im, grove_status want, const char *what) {
  grove_err err = {0};
  grove_tensor *t = (grove_tensor *)1;
  grove_status s = grove_npy_decode(im.buf, im.len, "case.npy", &t, &err);
  ck_assert_msg(s == want, "%s: decode gave %s (%s), expected %s", what, grove_status_name(s),
                grove_err_msg(&err), grove_status_name(want));
  if (want != GROVE_OK) {
    ck_assert_ptr_null(t);
    ck_assert_msg(strstr(err.msg, "case.npy") != NULL, "%s: message does not name the file: %s",
                  what, err.msg);
  }
  grove_tensor_release(t);

  const char *dir = grove_test_tmpdir();
  ck_assert_ptr_nonnull(dir);
  char path[512];
  snprintf(path, sizeof path, "%s/case.npy", dir);
  ck_assert_int_eq(grove_test_write_file(path, im.buf, im.len), 0);
  grove_err err2 = {0};
  t = (grove_tensor *)1;
  s = grove_npy_read(path, &t, &err2);
  ck_assert_msg(s == want, "%s: read gave %s (%s), expected %s", what, grove_status_name(s),
                grove_err_msg(&err2), grove_status_name(want));
  if (want != GROVE_OK) {
    ck_assert_ptr_null(t);
    ck_assert_msg(strstr(err2.msg, path) != NULL, "%s: message does not name the file: %s", what,
                  err2.msg);
  }
  grove_tensor_release(t);
  unlink(path);
  rmdir(dir);
  free(im.buf);
}

static void expect_header(const char *header, size_t data_len, grove_status want) {
  expect_status(make_npy(1, 0, header, data_len), want, header);
}

static grove_tensor *filled(grove_dtype dt, int ndim, const int64_t *shape) {
  grove_err err = {0};
  grove_tensor *t = grove_tensor_new(dt, ndim, shape, &err);
  ck_assert_msg(t != NULL, "%s", grove_err_msg(&err));
  unsigned char *p = t->data;
  size_t n = grove_tensor_nbytes(t);
  for (size_t i = 0; i < n; i++) p[i] = (unsigned char)(i * 37 + 11);
  if (dt == GROVE_BOOL)
    for (size_t i = 0; i < n; i++) p[i] &= 1;
  /* Keep floats finite and halves normal-ish: the bytes are only compared,
   * but NaN payloads would be as well, so any bytes would do. */
  return t;
}

static void assert_same(const grove_tensor *a, const grove_tensor *b) {
  ck_assert_int_eq(a->dtype, b->dtype);
  ck_assert_int_eq(a->ndim, b->ndim);
  for (int i = 0; i < a->ndim; i++) ck_assert_int_eq(a->shape[i], b->shape[i]);
  ck_assert(grove_tensor_is_contiguous(b));
  size_t n = grove_tensor_nbytes(a);
  ck_assert_uint_eq(n, grove_tensor_nbytes(b));
  if (n) ck_assert(memcmp(a->data, b->data, n) == 0);
}

/* ------------------------------------------------------------ round trips */

static const grove_dtype all_dtypes[] = {GROVE_F32, GROVE_F64, GROVE_F16, GROVE_I64, GROVE_I32,
                                         GROVE_I16, GROVE_I8,  GROVE_U8,  GROVE_BOOL};

START_TEST(test_roundtrip_memory) {
  static const struct {
    int ndim;
    int64_t shape[4];
  } shapes[] = {{0, {0}}, {1, {1}}, {1, {7}}, {2, {3, 5}}, {3, {2, 0, 4}}, {4, {2, 1, 3, 2}}};
  for (size_t d = 0; d < sizeof all_dtypes / sizeof all_dtypes[0]; d++) {
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
      grove_tensor *t = filled(all_dtypes[d], shapes[k].ndim, shapes[k].shape);
      void *buf;
      size_t len;
      grove_err err = {0};
      ck_assert_ok(grove_npy_encode(t, &buf, &len, &err), &err);
      /* numpy's layout: the data starts on a 64-byte boundary. */
      grove_npy_info info;
      ck_assert_ok(grove_npy_parse_header(buf, len, "rt", &info, &err), &err);
      ck_assert_uint_eq(info.data_offset % 64, 0);
      ck_assert_uint_eq(len, info.data_offset + grove_tensor_nbytes(t));
      ck_assert_int_eq(info.major, 1);
      grove_tensor *back = NULL;
      ck_assert_ok(grove_npy_decode(buf, len, "rt", &back, &err), &err);
      assert_same(t, back);
      grove_tensor_release(back);
      grove_tensor_release(t);
      free(buf);
    }
  }
}
END_TEST

START_TEST(test_roundtrip_file) {
  const char *dir = grove_test_tmpdir();
  ck_assert_ptr_nonnull(dir);
  char path[512];
  snprintf(path, sizeof path, "%s/x.npy", dir);
  int64_t shape[2] = {4, 6};
  grove_tensor *t = filled(GROVE_F32, 2, shape);
  grove_err err = {0};
  ck_assert_ok(grove_npy_write(path, t, &err), &err);
  grove_tensor *back = NULL;
  ck_assert_ok(grove_npy_read(path, &back, &err), &err);
  assert_same(t, back);
  grove_tensor_release(back);

  /* Overwriting replaces the file and leaves no temporary behind. */
  int64_t shape2[1] = {3};
  grove_tensor *u = filled(GROVE_I64, 1, shape2);
  ck_assert_ok(grove_npy_write(path, u, &err), &err);
  ck_assert_ok(grove_npy_read(path, &back, &err), &err);
  assert_same(u, back);
  grove_tensor_release(back);
  grove_tensor_release(u);
  grove_tensor_release(t);
  unlink(path);
  ck_assert_int_eq(rmdir(dir), 0); /* fails if a temporary was left */

  /* A directory that does not exist: GROVE_E_IO naming the path. */
  snprintf(path, sizeof path, "%s/no/such/dir/x.npy", dir);
  t = filled(GROVE_F32, 2, shape);
  ck_assert_status(grove_npy_write(path, t, &err), GROVE_E_IO);
  ck_assert_ptr_nonnull(strstr(err.msg, path));
  grove_tensor_release(t);
}
END_TEST

START_TEST(test_write_strided) {
  /* A transposed view is written in C order of its own shape. */
  int64_t shape[2] = {2, 3};
  grove_tensor *t = grove_tensor_new(GROVE_F32, 2, shape, NULL);
  ck_assert_ptr_nonnull(t);
  float *p = t->data;
  for (int i = 0; i < 6; i++) p[i] = (float)i; /* [[0 1 2] [3 4 5]] */
  grove_tensor v;
  int64_t vshape[2] = {3, 2};
  grove_tensor_init(&v, GROVE_F32, 2, vshape, t->data);
  v.strides[0] = 1;
  v.strides[1] = 3;
  void *buf;
  size_t len;
  grove_err err = {0};
  ck_assert_ok(grove_npy_encode(&v, &buf, &len, &err), &err);
  grove_tensor *back = NULL;
  ck_assert_ok(grove_npy_decode(buf, len, "t", &back, &err), &err);
  ck_assert_int_eq(back->shape[0], 3);
  ck_assert_int_eq(back->shape[1], 2);
  const float want[6] = {0, 3, 1, 4, 2, 5};
  ck_assert(memcmp(back->data, want, sizeof want) == 0);
  grove_tensor_release(back);
  grove_tensor_release(t);
  free(buf);
}
END_TEST

START_TEST(test_encode_header_text) {
  int64_t shape[2] = {2, 3};
  grove_tensor *t = filled(GROVE_F32, 2, shape);
  void *buf;
  size_t len;
  grove_err err = {0};
  ck_assert_ok(grove_npy_encode(t, &buf, &len, &err), &err);
  /* numpy.save: the dict, 20 spaces of room for shape[0] to grow to 21
   * digits, then padding to 128 bytes with a final newline. */
  const char *dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
  ck_assert_uint_eq(len, 128 + 24);
  const unsigned char *b = buf;
  ck_assert(memcmp(b, "\x93NUMPY\x01\x00", 8) == 0);
  ck_assert_int_eq(b[8] | b[9] << 8, 118);
  ck_assert(memcmp(b + 10, dict, strlen(dict)) == 0);
  for (size_t i = 10 + strlen(dict); i < 127; i++) ck_assert_int_eq(b[i], ' ');
  ck_assert_int_eq(b[127], '\n');
  free(buf);
  grove_tensor_release(t);

  /* bfloat16 has no numpy dtype. */
  grove_tensor *h = grove_tensor_new(GROVE_BF16, 1, shape, NULL);
  ck_assert_status(grove_npy_encode(h, &buf, &len, &err), GROVE_E_BAD_DTYPE);
  ck_assert_ptr_null(buf);
  grove_tensor_release(h);
  ck_assert_str_eq(grove_npy_descr(GROVE_F32), "<f4");
  ck_assert_str_eq(grove_npy_descr(GROVE_BOOL), "|b1");
  ck_assert_ptr_null(grove_npy_descr(GROVE_BF16));
}
END_TEST

/* ------------------------------------------------------------ numpy's files */

static grove_status status_by_name(const char *name) {
#define GROVE__BY_NAME(n, v, m) \
  if (strcmp(name, "GROVE_" #n) == 0) return GROVE_##n;
  GROVE_STATUS_LIST(GROVE__BY_NAME)
#undef GROVE__BY_NAME
  ck_abort_msg("unknown status %s in index.txt", name);
  return GROVE_E_INTERNAL;
}

START_TEST(test_numpy_files) {
  char index_path[4096];
  snprintf(index_path, sizeof index_path, "%s", grove_fixture("npy/index.txt"));
  FILE *f = fopen(index_path, "r");
  ck_assert_msg(f != NULL, "%s missing: run make fixtures", index_path);
  char line[512];
  int checked = 0, identical = 0;
  while (fgets(line, sizeof line, f)) {
    char name[128], status[64], dtype[32], shape[128];
    int ident;
    if (sscanf(line, "%127s %63s %31s %d %127s", name, status, dtype, &ident, shape) != 5) continue;
    char path[4096];
    snprintf(path, sizeof path, "%s", grove_fixture("npy/"));
    strncat(path, name, sizeof path - strlen(path) - 1);
    grove_status want = status_by_name(status);
    grove_err err = {0};
    grove_tensor *t = NULL;
    grove_status s = grove_npy_read(path, &t, &err);
    ck_assert_msg(s == want, "%s: got %s (%s), expected %s", name, grove_status_name(s),
                  grove_err_msg(&err), status);
    checked++;
    if (want != GROVE_OK) {
      ck_assert_ptr_null(t);
      ck_assert_msg(strstr(err.msg, name) != NULL, "%s: message does not name it: %s", name,
                    err.msg);
      continue;
    }
    ck_assert_str_eq(grove_dtype_name(t->dtype), dtype);
    char got[128] = "()";
    if (t->ndim) {
      got[0] = '\0';
      for (int i = 0; i < t->ndim; i++)
        snprintf(got + strlen(got), sizeof got - strlen(got), "%s%lld", i ? "," : "",
                 (long long)t->shape[i]);
    }
    ck_assert_str_eq(got, shape);

    char raw_path[4200];
    snprintf(raw_path, sizeof raw_path, "%s.raw", path);
    size_t raw_len;
    char *raw = grove_test_read_file(raw_path, &raw_len);
    ck_assert_ptr_nonnull(raw);
    ck_assert_uint_eq(raw_len, grove_tensor_nbytes(t));
    ck_assert_msg(raw_len == 0 || memcmp(raw, t->data, raw_len) == 0, "%s: elements differ", name);
    free(raw);

    if (ident) {
      size_t file_len;
      char *file = grove_test_read_file(path, &file_len);
      ck_assert_ptr_nonnull(file);
      void *buf;
      size_t len;
      ck_assert_ok(grove_npy_encode(t, &buf, &len, &err), &err);
      ck_assert_msg(len == file_len && memcmp(buf, file, len) == 0,
                    "%s: grove_npy_encode differs from numpy.save", name);
      free(buf);
      free(file);
      identical++;
    }
    grove_tensor_release(t);
  }
  fclose(f);
  ck_assert_int_ge(checked, 15);
  ck_assert_int_ge(identical, 1);
}
END_TEST

/* ------------------------------------------------------------ malformed */

START_TEST(test_bad_preamble) {
  image im;
  /* Not .npy at all. */
  im = make_npy(1, 0, "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }", 4);
  im.buf[1] = 'X';
  expect_status(im, GROVE_E_FORMAT, "bad magic");
  im = make_npy(1, 0, "{}", 0);
  memcpy(im.buf, "PK\x03\x04", 4);
  expect_status(im, GROVE_E_FORMAT, "a zip file");
  /* Files that end inside the preamble. */
  for (size_t cut = 0; cut < 10; cut++) {
    im = make_npy(1, 0, "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }", 4);
    im.len = cut;
    expect_status(im, GROVE_E_TRUNCATED, "short preamble");
  }
  im = make_npy(2, 0, "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }", 4);
  im.len = 11;
  expect_status(im, GROVE_E_TRUNCATED, "short v2 length");
  /* Versions. */
  expect_status(make_npy(4, 0, "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }", 4),
                GROVE_E_UNSUPPORTED, "version 4.0");
  expect_status(make_npy(1, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }", 4),
                GROVE_E_UNSUPPORTED, "version 1.1");
  expect_status(make_npy(2, 0, "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }", 4),
                GROVE_OK, "version 2.0");
  expect_status(make_npy(3, 0, "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }", 4),
                GROVE_OK, "version 3.0");
}
END_TEST

START_TEST(test_truncated_header) {
  image im = make_npy(1, 0, "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }", 4);
  im.len = 40; /* the header length says 118 */
  expect_status(im, GROVE_E_TRUNCATED, "truncated header");
  /* A header longer than numpy accepts, before anything is read. */
  im = make_npy(2, 0, "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }", 4);
  im.buf[8] = 0x20;
  im.buf[9] = 0x4e; /* 20000 */
  expect_status(im, GROVE_E_HEADER_TOO_LARGE, "huge header");
  im = make_npy(2, 0, "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }", 4);
  im.buf[11] = 0xff;
  expect_status(im, GROVE_E_HEADER_TOO_LARGE, "4 GB header");
}
END_TEST

START_TEST(test_truncated_and_long_data) {
  const char *h = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
  expect_header(h, 24, GROVE_OK);
  expect_header(h, 23, GROVE_E_TRUNCATED);
  expect_header(h, 0, GROVE_E_TRUNCATED);
  expect_header(h, 25, GROVE_E_BAD_SIZE);
  expect_header(h, 48, GROVE_E_BAD_SIZE);
  /* A header claiming far more than is there is refused before allocating. */
  expect_header("{'descr': '<f8', 'fortran_order': False, 'shape': (100000, 100000, 100), }", 8,
                GROVE_E_TRUNCATED);
  /* Empty arrays have no data at all. */
  expect_header("{'descr': '<f4', 'fortran_order': False, 'shape': (0, 3), }", 0, GROVE_OK);
  expect_header("{'descr': '<f4', 'fortran_order': False, 'shape': (0, 3), }", 1, GROVE_E_BAD_SIZE);
  /* libgrove refuses a shape whose nonzero dimensions overflow, even when
   * another is 0. */
  expect_header("{'descr': '<f4', 'fortran_order': False, 'shape': (9223372036854775807, 4, 0), }",
                0, GROVE_E_RANGE);
}
END_TEST

START_TEST(test_bad_dict) {
  static const char *bad[] = {
      "",
      "[1, 2]",
      "{'descr': '<f4', 'fortran_order': False}",                        /* no shape */
      "{'descr': '<f4', 'shape': (1,)}",                                 /* no fortran_order */
      "{'fortran_order': False, 'shape': (1,)}",                         /* no descr */
      "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), 'x': 1}", /* extra key */
      "{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (1,)}", /* twice */
      "{'descr': '<f4', 'fortran_order': False, 'shape': (1)}",                  /* not a tuple */
      "{'descr': '<f4', 'fortran_order': False, 'shape': [1]}",                  /* a list */
      "{'descr': '<f4', 'fortran_order': False, 'shape': (-1,)}",
      "{'descr': '<f4', 'fortran_order': False, 'shape': (1.5,)}",
      "{'descr': '<f4', 'fortran_order': False, 'shape': (,)}",
      "{'descr': '<f4', 'fortran_order': False, 'shape': (01,)}",
      "{'descr': '<f4', 'fortran_order': False, 'shape': (1,) 'x'}",
      "{'descr': '<f4', 'fortran_order': 0, 'shape': (1,)}",
      "{'descr': '<f4', 'fortran_order': Falsey, 'shape': (1,)}",
      "{'descr': <f4, 'fortran_order': False, 'shape': (1,)}",
      "{'descr': '<f4", /* unterminated */
      "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), } x",
      "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), ",
      "{'descr': '<f4' 'fortran_order': False, 'shape': (1,)}",
      "{descr: '<f4', 'fortran_order': False, 'shape': (1,)}",
      "{'des\\cr': '<f4', 'fortran_order': False, 'shape': (1,)}",
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) expect_header(bad[i], 4, GROVE_E_FORMAT);

  /* What numpy and Python accept. */
  static const char *good[] = {
      "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }",
      "{\"descr\": \"<f4\", \"fortran_order\": False, \"shape\": (1,)}",
      "{ 'shape' : ( 1 , ) , 'fortran_order' : False , 'descr' : '<f4' }",
      "{'descr': '<f4', 'fortran_order': False, 'shape': (1L,), }",
      "{'descr': '=f4', 'fortran_order': False, 'shape': (1,), }",
      "{'descr': '<f4', 'fortran_order': True, 'shape': (1,), }",
  };
  for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) expect_header(good[i], 4, GROVE_OK);
  expect_header("{'descr': '<f4', 'fortran_order': False, 'shape': (), }", 4, GROVE_OK);
  expect_header("{'descr': '<f4', 'fortran_order': False, 'shape': (1, 1, 1, 1, 1, 1, 1, 1), }", 4,
                GROVE_OK);
}
END_TEST

START_TEST(test_unsupported) {
  static const char *dtypes[] = {"'<c8'", "'>f4'",  "'>i8'",    "'|O'", "'<U5'", "'|S3'",
                                 "'<u4'", "'<f16'", "'<M8[s]'", "'f4'", "''",    "[('a', '<f4')]"};
  for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++) {
    char h[256];
    snprintf(h, sizeof h, "{'descr': %s, 'fortran_order': False, 'shape': (1,), }", dtypes[i]);
    expect_header(h, 4, GROVE_E_BAD_DTYPE);
  }
  /* One-byte types do not care about the byte order character. */
  expect_header("{'descr': '>u1', 'fortran_order': False, 'shape': (4,), }", 4, GROVE_OK);
  expect_header("{'descr': '<b1', 'fortran_order': False, 'shape': (4,), }", 4, GROVE_E_FORMAT);
  /* Fortran order with two dimensions above 1. */
  expect_header("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }", 24,
                GROVE_E_UNSUPPORTED);
  expect_header("{'descr': '<f4', 'fortran_order': True, 'shape': (1, 6, 1), }", 24, GROVE_OK);
  /* Limits. */
  expect_header("{'descr': '<f4', 'fortran_order': False, 'shape': (1, 1, 1, 1, 1, 1, 1, 1, 1), }",
                4, GROVE_E_LIMIT);
  expect_header("{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,), }", 4,
                GROVE_E_RANGE);
  expect_header("{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296), }", 4,
                GROVE_E_RANGE);
}
END_TEST

START_TEST(test_bools) {
  image im = make_npy(1, 0, "{'descr': '|b1', 'fortran_order': False, 'shape': (3,), }", 3);
  size_t off = im.len - 3;
  im.buf[off] = 0;
  im.buf[off + 1] = 1;
  im.buf[off + 2] = 1;
  expect_status(im, GROVE_OK, "bools");
  im = make_npy(1, 0, "{'descr': '|b1', 'fortran_order': False, 'shape': (3,), }", 3);
  im.buf[im.len - 3] = 0; /* the other two are 0x11 */
  expect_status(im, GROVE_E_FORMAT, "bool byte 0x11");
}
END_TEST

START_TEST(test_not_files) {
  grove_err err = {0};
  grove_tensor *t = (grove_tensor *)1;
  ck_assert_status(grove_npy_read("/nonexistent/x.npy", &t, &err), GROVE_E_IO);
  ck_assert_ptr_null(t);
  ck_assert_ptr_nonnull(strstr(err.msg, "/nonexistent/x.npy"));
  const char *dir = grove_test_tmpdir();
  ck_assert_status(grove_npy_read(dir, &t, &err), GROVE_E_IO);
  ck_assert_ptr_nonnull(strstr(err.msg, "directory"));
  rmdir(dir);
}
END_TEST

START_TEST(test_pipe) {
  /* Not a regular file: the length is found by reading to the end. */
  int fds[2];
  ck_assert_int_eq(pipe(fds), 0);
  image im = make_npy(1, 0, "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", 8);
  ck_assert_int_eq(write(fds[1], im.buf, im.len), (ssize_t)im.len);
  close(fds[1]);
  char path[64];
  snprintf(path, sizeof path, "/dev/fd/%d", fds[0]);
  grove_err err = {0};
  grove_tensor *t = NULL;
  ck_assert_ok(grove_npy_read(path, &t, &err), &err);
  ck_assert_int_eq(t->shape[0], 2);
  grove_tensor_release(t);
  close(fds[0]);

  ck_assert_int_eq(pipe(fds), 0);
  ck_assert_int_eq(write(fds[1], im.buf, im.len), (ssize_t)im.len);
  ck_assert_int_eq(write(fds[1], "x", 1), 1);
  close(fds[1]);
  snprintf(path, sizeof path, "/dev/fd/%d", fds[0]);
  ck_assert_status(grove_npy_read(path, &t, &err), GROVE_E_BAD_SIZE);
  close(fds[0]);

  ck_assert_int_eq(pipe(fds), 0);
  ck_assert_int_eq(write(fds[1], im.buf, im.len - 1), (ssize_t)im.len - 1);
  close(fds[1]);
  snprintf(path, sizeof path, "/dev/fd/%d", fds[0]);
  ck_assert_status(grove_npy_read(path, &t, &err), GROVE_E_TRUNCATED);
  close(fds[0]);
  free(im.buf);
}
END_TEST

Suite *npy_suite(void) {
  Suite *s = suite_create("npy");
  TCase *tc = tcase_create("roundtrip");
  tcase_add_test(tc, test_roundtrip_memory);
  tcase_add_test(tc, test_roundtrip_file);
  tcase_add_test(tc, test_write_strided);
  tcase_add_test(tc, test_encode_header_text);
  suite_add_tcase(s, tc);
  tc = tcase_create("numpy");
  tcase_add_test(tc, test_numpy_files);
  suite_add_tcase(s, tc);
  tc = tcase_create("malformed");
  tcase_add_test(tc, test_bad_preamble);
  tcase_add_test(tc, test_truncated_header);
  tcase_add_test(tc, test_truncated_and_long_data);
  tcase_add_test(tc, test_bad_dict);
  tcase_add_test(tc, test_unsupported);
  tcase_add_test(tc, test_bools);
  tcase_add_test(tc, test_not_files);
  tcase_add_test(tc, test_pipe);
  suite_add_tcase(s, tc);
  return s;
}

GROVE_TEST_MAIN(npy_suite)
