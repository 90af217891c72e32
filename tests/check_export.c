/* check_export.c: exporting a state_dict.
 *
 * Two parts:
 *   - plan: grove_safetensors_plan / grove_torch_plan (core/export_plan.c)
 *     produce, byte for byte, the files grove_safetensors_write and
 *     grove_torch_write write, over state_dicts that reach every branch of
 *     the writers (dtypes, empty and scalar tensors, tied tensors, strided
 *     views, module metadata, more than 256 memo entries and 1000 keys,
 *     ZIP64 fields), read whole and in ranges;
 *   - server: the ExportStateDict RPC of a live groved (the harness in
 *     tests/groved_harness.h): the bytes equal grove_*_write of the served
 *     tree's state_dict, chunked fetches, prefixes, refusals, one version per
 *     export while the model reloads, and grove_client_export_file's
 *     no-overwrite rule. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "export_plan.h"
#include "grove/grove.h"
#include "testutil.h"
#include "torch_internal.h"

/* ============================================================ helpers */

static grove_tensor *tensor(grove_dtype dt, int ndim, const int64_t *shape, unsigned seed) {
  grove_err err = {0};
  grove_tensor *t = grove_tensor_new(dt, ndim, shape, &err);
  ck_assert_msg(t != NULL, "%s", grove_err_msg(&err));
  uint8_t *p = t->data;
  uint32_t x = seed * 2654435761u + 1;
  for (size_t i = 0; i < grove_tensor_nbytes(t); i++) {
    x = x * 1103515245u + 12345u;
    p[i] = (uint8_t)(x >> 16);
  }
  if (dt == GROVE_BOOL)
    for (size_t i = 0; i < grove_tensor_nbytes(t); i++) p[i] &= 1;
  return t;
}

static void add(grove_state_dict *sd, const char *key, grove_tensor *t) {
  grove_err err = {0};
  ck_assert_ok(grove_sd_set(sd, key, t, &err), &err);
  grove_tensor_release(t);
}

/* Mixed dtypes, an empty tensor, a scalar, module versions. */
static grove_state_dict *sd_mixed(void) {
  grove_state_dict *sd = grove_sd_new();
  int64_t s34[] = {3, 4}, s5[] = {5}, s7[] = {7}, s0[] = {0}, s22[] = {2, 2}, s6[] = {3, 1, 2};
  add(sd, "0.weight", tensor(GROVE_F32, 2, s34, 1));
  add(sd, "0.bias", tensor(GROVE_F16, 1, s5, 2));
  add(sd, "1.running_mean", tensor(GROVE_BF16, 1, s7, 3));
  add(sd, "1.num_batches_tracked", tensor(GROVE_I64, 0, NULL, 4));
  add(sd, "2.mask", tensor(GROVE_BOOL, 1, s7, 5));
  add(sd, "2.empty", tensor(GROVE_U8, 1, s0, 6));
  add(sd, "3.double", tensor(GROVE_F64, 2, s22, 7));
  add(sd, "3.i32", tensor(GROVE_I32, 3, s6, 8));
  add(sd, "3.i16", tensor(GROVE_I16, 1, s5, 9));
  add(sd, "3.i8", tensor(GROVE_I8, 1, s7, 10));
  add(sd, "ünïcode.wéight", tensor(GROVE_F32, 1, s5, 11));
  grove_err err = {0};
  ck_assert_ok(grove_sd_set_version(sd, "", 1, &err), &err);
  ck_assert_ok(grove_sd_set_version(sd, "1", 2, &err), &err);
  return sd;
}

/* One tensor under two keys (tied), a transposed view and a second view of
 * the same storage at an offset. */
static grove_state_dict *sd_views(void) {
  grove_state_dict *sd = grove_sd_new();
  int64_t s[] = {6, 4};
  grove_tensor *w = tensor(GROVE_F32, 2, s, 21);
  grove_err err = {0};
  ck_assert_ok(grove_sd_set(sd, "embed.weight", w, &err), &err);
  ck_assert_ok(grove_sd_set(sd, "head.weight", w, &err), &err);
  int64_t ts[] = {4, 6}, tst[] = {1, 4};
  grove_tensor *tv = grove_tensor_view_new(w->storage, 0, GROVE_F32, 2, ts, tst, &err);
  ck_assert_msg(tv != NULL, "%s", grove_err_msg(&err));
  add(sd, "head.transposed", tv);
  int64_t rs[] = {2, 4};
  grove_tensor *rv = grove_tensor_view_new(w->storage, 16 * 4, GROVE_F32, 2, rs, NULL, &err);
  ck_assert_msg(rv != NULL, "%s", grove_err_msg(&err));
  add(sd, "head.rows", rv);
  grove_tensor_release(w);
  return sd;
}

/* 1100 keys (two SETITEMS batches, memo indexes past 255) and 1001 module
 * versions. */
static grove_state_dict *sd_many(void) {
  grove_state_dict *sd = grove_sd_new();
  grove_err err = {0};
  for (int i = 0; i < 1100; i++) {
    char key[64];
    snprintf(key, sizeof key, "layers.%d.weight", i);
    int64_t s[] = {(i % 5) + 1};
    add(sd, key, tensor(i % 3 == 0 ? GROVE_F16 : GROVE_F32, 1, s, (unsigned)i));
  }
  for (int i = 0; i < 1001; i++) {
    char pfx[64];
    snprintf(pfx, sizeof pfx, "layers.%d", i);
    ck_assert_ok(grove_sd_set_version(sd, pfx, 1 + i % 3, &err), &err);
  }
  return sd;
}

static uint8_t *plan_bytes(const grove_file_plan *p) {
  uint64_t n = grove_file_plan_size(p);
  uint8_t *buf = malloc(n ? n : 1);
  grove_err err = {0};
  ck_assert_ok(grove_file_plan_read(p, 0, buf, n, &err), &err);
  return buf;
}

/* The plan equals want, whole and in ranges of several sizes. */
static void check_plan(const grove_file_plan *p, const uint8_t *want, size_t len) {
  ck_assert_uint_eq(grove_file_plan_size(p), len);
  uint8_t *got = plan_bytes(p);
  for (size_t i = 0; i < len; i++)
    if (got[i] != want[i]) ck_abort_msg("byte %zu of %zu differs: %02x, want %02x", i, len,
                                        got[i], want[i]);
  free(got);
  uint8_t buf[257];
  grove_err err = {0};
  size_t steps[] = {1, 7, 64, 257};
  for (size_t k = 0; k < 4; k++)
    for (size_t off = 0; off < len; off += steps[k]) {
      size_t n = len - off < steps[k] ? len - off : steps[k];
      ck_assert_ok(grove_file_plan_read(p, off, buf, n, &err), &err);
      ck_assert_msg(memcmp(buf, want + off, n) == 0, "range [%zu, +%zu) differs", off, n);
    }
  ck_assert_status(grove_file_plan_read(p, len, buf, 1, &err), GROVE_E_RANGE);
  ck_assert_status(grove_file_plan_read(p, len - 1, buf, 2, &err), GROVE_E_RANGE);
  ck_assert_ok(grove_file_plan_read(p, len, buf, 0, &err), &err);
}

static void check_both(grove_state_dict *sd, const char *stem) {
  const char *dir = grove_test_tmpdir();
  char path[512];
  grove_err err = {0};
  size_t len = 0;

  snprintf(path, sizeof path, "%s/%s.safetensors", dir, stem);
  ck_assert_ok(grove_safetensors_write(path, sd, &err), &err);
  uint8_t *want = (uint8_t *)grove_test_read_file(path, &len);
  ck_assert_ptr_nonnull(want);
  grove_file_plan *p = NULL;
  ck_assert_ok(grove_safetensors_plan(sd, &p, &err), &err);
  ck_assert_int_eq(grove_file_plan_format(p), GROVE_CKPT_SAFETENSORS);
  ck_assert_uint_eq(grove_file_plan_tensors(p), grove_sd_count(sd));
  check_plan(p, want, len);
  grove_file_plan_free(p);
  free(want);
  unlink(path);

  snprintf(path, sizeof path, "%s/%s.pt", dir, stem);
  ck_assert_ok(grove_torch_write(path, sd, &err), &err);
  want = (uint8_t *)grove_test_read_file(path, &len);
  ck_assert_ptr_nonnull(want);
  char *archive = grove_torch_archive_name(path);
  ck_assert_str_eq(archive, stem);
  ck_assert_ok(grove_torch_plan(sd, archive, &p, &err), &err);
  ck_assert_int_eq(grove_file_plan_format(p), GROVE_CKPT_TORCH_ZIP);
  check_plan(p, want, len);
  grove_file_plan_free(p);
  free(want);
  unlink(path);

  /* ZIP64 fields everywhere, against the writer's test option. */
  grove__torch_write_opts o = {.zip = {.force_zip64 = true}};
  uint8_t *buf = NULL;
  ck_assert_ok(grove__torch_write_buffer(sd, archive, &o, &buf, &len, &err), &err);
  ck_assert_ok(grove__torch_plan_ex(sd, archive, true, &p, &err), &err);
  check_plan(p, buf, len);
  grove_file_plan_free(p);
  free(buf);
  free(archive);
  rmdir(dir);
}

/* ============================================================ plan tests */

START_TEST(plan_mixed) {
  grove_state_dict *sd = sd_mixed();
  check_both(sd, "mixed");
  grove_sd_free(sd);
}
END_TEST

START_TEST(plan_views) {
  grove_state_dict *sd = sd_views();
  check_both(sd, "views");
  grove_sd_free(sd);
}
END_TEST

START_TEST(plan_many) {
  grove_state_dict *sd = sd_many();
  check_both(sd, "many");
  grove_sd_free(sd);
}
END_TEST

START_TEST(plan_empty) {
  grove_state_dict *sd = grove_sd_new();
  check_both(sd, "empty");
  grove_sd_free(sd);
}
END_TEST

/* The plan keeps what it refers to: the state_dict (and every other
 * reference) may go first. */
START_TEST(plan_outlives_sd) {
  grove_state_dict *sd = sd_views();
  grove_err err = {0};
  uint8_t *want = NULL;
  size_t len = 0;
  ck_assert_ok(grove__torch_write_buffer(sd, "archive", NULL, &want, &len, &err), &err);
  grove_file_plan *pt = NULL, *st = NULL;
  ck_assert_ok(grove_torch_plan(sd, NULL, &pt, &err), &err);
  ck_assert_ok(grove_safetensors_plan(sd, &st, &err), &err);
  grove_sd_free(sd);
  check_plan(pt, want, len);
  ck_assert_uint_gt(grove_file_plan_size(st), 8);
  uint8_t *b = plan_bytes(st);
  free(b);
  grove_file_plan_free(pt);
  grove_file_plan_free(st);
  free(want);
}
END_TEST

START_TEST(plan_refusals) {
  grove_err err = {0};
  grove_file_plan *p = NULL;
  grove_state_dict *sd = grove_sd_new();
  int64_t s[] = {2};
  add(sd, "__metadata__", tensor(GROVE_F32, 1, s, 1));
  ck_assert_status(grove_safetensors_plan(sd, &p, &err), GROVE_E_KEY);
  ck_assert_ptr_null(p);
  grove_sd_free(sd);
  sd = grove_sd_new();
  add(sd, "bad\xff", tensor(GROVE_F32, 1, s, 1));
  ck_assert_status(grove_safetensors_plan(sd, &p, &err), GROVE_E_BAD_UTF8);
  ck_assert_status(grove_torch_plan(sd, NULL, &p, &err), GROVE_E_BAD_UTF8);
  grove_sd_free(sd);
  ck_assert_status(grove_safetensors_plan(NULL, &p, &err), GROVE_E_INVALID_ARGUMENT);
  ck_assert_status(grove_torch_plan(NULL, NULL, &p, &err), GROVE_E_INVALID_ARGUMENT);
  ck_assert_status(grove_file_plan_read(NULL, 0, NULL, 0, &err), GROVE_E_INVALID_ARGUMENT);
  grove_file_plan_free(NULL);
  char *a = grove_torch_archive_name("/x/y/.pt");
  ck_assert_str_eq(a, "archive");
  free(a);
  a = grove_torch_archive_name("model.tar.pt");
  ck_assert_str_eq(a, "model.tar");
  free(a);
}
END_TEST

/* ============================================================ suite */

static Suite *export_suite(void) {
  Suite *s = suite_create("export");
  TCase *tc = tcase_create("plan");
  tcase_add_test(tc, plan_mixed);
  tcase_add_test(tc, plan_views);
  tcase_add_test(tc, plan_many);
  tcase_add_test(tc, plan_empty);
  tcase_add_test(tc, plan_outlives_sd);
  tcase_add_test(tc, plan_refusals);
  suite_add_tcase(s, tc);
  return s;
}

GROVE_TEST_MAIN(export_suite)
