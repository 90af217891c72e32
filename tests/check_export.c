/* check_export.c: exporting a state_dict.
 *
 * Two parts:
 *   - plan: grove_safetensors_plan / grove_torch_plan (core/io/export_plan.c)
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
#define _GNU_SOURCE /* memmem */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <pthread.h>
#include <stdatomic.h>

#include "export_plan.h"
#include "groved_harness.h"
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
    if (got[i] != want[i])
      ck_abort_msg("byte %zu of %zu differs: %02x, want %02x", i, len, got[i], want[i]);
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
  ck_assert_ok(grove__torch_plan_ex(sd, archive, &o.zip, &p, &err), &err);
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

/* ============================================================ server */

typedef struct membuf {
  uint8_t *p;
  size_t n, cap;
  size_t calls;
} membuf;

static grove_status mem_sink(void *user, const void *data, size_t len, grove_err *err) {
  membuf *b = user;
  if (b->n + len > b->cap) {
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->n + len) cap *= 2;
    uint8_t *g = realloc(b->p, cap);
    if (!g) return grove_err_set(err, GROVE_E_NOMEM, "test sink: out of memory");
    b->p = g;
    b->cap = cap;
  }
  memcpy(b->p + b->n, data, len);
  b->n += len;
  b->calls++;
  return GROVE_OK;
}

static hserver X;
static char x_models[2][4200];

static void x_setup(void) {
  snprintf(x_models[0], sizeof x_models[0], "export_bn=%s", grove_fixture("export_bn"));
  snprintf(x_models[1], sizeof x_models[1], "reload_mlp=%s", grove_fixture("reload_mlp"));
  const char *extra[] = {"--model", x_models[0], "--model", x_models[1], "--workers", "2", NULL};
  h_start(&X, extra);
}

static void x_teardown(void) {
  h_stop(&X);
}

/* The file grove_*_write writes for the state_dict of dir's model as
 * grove_model_open loads it: what an export of that version must equal. */
static uint8_t *local_file(const char *dir, grove_ckpt_format f, size_t *len) {
  grove_model *m = NULL;
  grove_err err = {0};
  ck_assert_ok(grove_model_open(dir, NULL, &m, &err), &err);
  grove_state_dict *sd = grove_sd_new();
  ck_assert_ok(grove_module_state_dict(m->root, NULL, sd, &err), &err);
  const char *tmp = grove_test_tmpdir();
  char path[512];
  snprintf(path, sizeof path, "%s/weights.%s", tmp,
           f == GROVE_CKPT_SAFETENSORS ? "safetensors" : "pt");
  if (f == GROVE_CKPT_SAFETENSORS)
    ck_assert_ok(grove_safetensors_write(path, sd, &err), &err);
  else
    ck_assert_ok(grove_torch_write(path, sd, &err), &err);
  uint8_t *data = (uint8_t *)grove_test_read_file(path, len);
  ck_assert_ptr_nonnull(data);
  unlink(path);
  rmdir(tmp);
  grove_sd_free(sd);
  grove_model_free(m);
  return data;
}

static membuf export_mem(grove_client *c, const char *model, grove_ckpt_format f,
                         const char *prefix, size_t chunk, grove_export_info *info) {
  membuf b = {0};
  grove_err err = {0};
  grove_export_opts o = {.prefix = prefix, .chunk_bytes = chunk, .archive_name = "weights"};
  ck_assert_ok(grove_client_export(c, model, f, &o, 10000, mem_sink, &b, info, &err), &err);
  ck_assert_uint_eq(b.n, info->total_size);
  return b;
}

START_TEST(export_equals_writer) {
  grove_client *c = h_connect(X.tcp);
  const char *models[] = {"export_bn", "reload_mlp"};
  grove_ckpt_format fmts[] = {GROVE_CKPT_SAFETENSORS, GROVE_CKPT_TORCH_ZIP};
  size_t chunks[] = {0, 7, 1000};
  for (int mi = 0; mi < 2; mi++)
    for (int fi = 0; fi < 2; fi++) {
      size_t len = 0;
      uint8_t *want = local_file(grove_fixture(models[mi]), fmts[fi], &len);
      for (int ci = 0; ci < 3; ci++) {
        grove_export_info info;
        membuf b = export_mem(c, models[mi], fmts[fi], NULL, chunks[ci], &info);
        ck_assert_int_eq(info.version, 1);
        ck_assert_uint_eq(b.n, len);
        ck_assert_msg(memcmp(b.p, want, len) == 0, "%s as %d (chunk %zu): bytes differ", models[mi],
                      fmts[fi], chunks[ci]);
        if (chunks[ci] == 7) ck_assert_uint_eq(b.calls, (len + 6) / 7);
        free(b.p);
      }
      free(want);
    }
  /* What came back: num_batches_tracked stays int64, the keys in torch's
   * order. */
  grove_export_info info;
  membuf b = export_mem(c, "export_bn", GROVE_CKPT_TORCH_ZIP, NULL, 0, &info);
  grove_state_dict *sd = NULL;
  grove_err err = {0};
  ck_assert_ok(grove__torch_read_buffer(b.p, b.n, "export", NULL, &sd, &err), &err);
  const char *keys[] = {"0.weight",
                        "0.bias",
                        "1.weight",
                        "1.bias",
                        "1.running_mean",
                        "1.running_var",
                        "1.num_batches_tracked",
                        "3.weight",
                        "3.bias"};
  ck_assert_uint_eq(grove_sd_count(sd), 9);
  ck_assert_uint_eq(info.tensors, 9);
  for (size_t i = 0; i < 9; i++) ck_assert_str_eq(grove_sd_key(sd, i), keys[i]);
  ck_assert_int_eq(grove_sd_get(sd, "1.num_batches_tracked")->dtype, GROVE_I64);
  grove_sd_free(sd);
  free(b.p);
  grove_client_close(c);
  ck_assert(h_metric(&X, "grove_exports_open") == 0);
}
END_TEST

START_TEST(export_prefix) {
  grove_client *c = h_connect(X.ipc);
  grove_export_info info;
  membuf b = export_mem(c, "export_bn", GROVE_CKPT_SAFETENSORS, "1.", 0, &info);
  grove_state_dict *sd = NULL;
  grove_err err = {0};
  ck_assert_ok(grove_safetensors_read_buffer(b.p, b.n, "export", &sd, &err), &err);
  ck_assert_uint_eq(grove_sd_count(sd), 5);
  for (size_t i = 0; i < 5; i++) ck_assert(strncmp(grove_sd_key(sd, i), "1.", 2) == 0);
  grove_sd_free(sd);
  free(b.p);
  b = (membuf){0};
  grove_export_opts o = {.prefix = "nope."};
  ck_assert_status(grove_client_export(c, "export_bn", GROVE_CKPT_TORCH_ZIP, &o, 5000, mem_sink, &b,
                                       &info, &err),
                   GROVE_E_NOT_FOUND);
  ck_assert_msg(strstr(grove_err_msg(&err), "nope."), "%s", grove_err_msg(&err));
  ck_assert_uint_eq(b.n, 0);
  grove_client_close(c);
}
END_TEST

static bool dir_has_temp(const char *dir) {
  char cmd[600];
  snprintf(cmd, sizeof cmd, "ls -A '%s' | grep -q tmp", dir);
  return system(cmd) == 0;
}

START_TEST(export_file_rules) {
  grove_client *c = h_connect(X.tcp);
  const char *dir = grove_test_tmpdir();
  char path[512], bad[512];
  snprintf(path, sizeof path, "%s/bn.pt", dir);
  snprintf(bad, sizeof bad, "%s/bn.npy", dir);
  grove_err err = {0};
  grove_export_info info;
  ck_assert_ok(grove_client_export_file(c, "export_bn", path, false, NULL, 10000, &info, &err),
               &err);
  grove_state_dict *sd = NULL;
  ck_assert_ok(grove_torch_read(path, &sd, &err), &err);
  ck_assert_uint_eq(grove_sd_count(sd), 9);
  grove_sd_free(sd);
  /* The archive is named after the file, as torch.save names it. */
  size_t len = 0;
  char *data = grove_test_read_file(path, &len);
  ck_assert(memmem(data, len, "bn/data.pkl", 11) != NULL);
  free(data);
  ck_assert_status(grove_client_export_file(c, "export_bn", path, false, NULL, 10000, &info, &err),
                   GROVE_E_ALREADY_EXISTS);
  ck_assert(grove_client_failed_locally(GROVE_E_ALREADY_EXISTS, &err));
  ck_assert_ok(grove_client_export_file(c, "reload_mlp", path, true, NULL, 10000, &info, &err),
               &err);
  ck_assert_ok(grove_torch_read(path, &sd, &err), &err);
  ck_assert_uint_eq(grove_sd_count(sd), 4);
  grove_sd_free(sd);
  ck_assert_status(grove_client_export_file(c, "export_bn", bad, false, NULL, 10000, &info, &err),
                   GROVE_E_INVALID_ARGUMENT);
  /* A refused export leaves nothing behind. */
  char none[512];
  snprintf(none, sizeof none, "%s/none.safetensors", dir);
  ck_assert_status(grove_client_export_file(c, "nope", none, false, NULL, 10000, &info, &err),
                   GROVE_E_NOT_FOUND);
  ck_assert_int_ne(access(none, F_OK), 0);
  ck_assert(!dir_has_temp(dir));
  unlink(path);
  rmdir(dir);
  grove_client_close(c);
}
END_TEST

static Grove__Reply *raw_export(const char *url, const char *model, int format, uint64_t id,
                                uint64_t offset, uint64_t length, bool close, const char *archive) {
  Grove__ExportStateDictRequest q = GROVE__EXPORT_STATE_DICT_REQUEST__INIT;
  q.model = (char *)model;
  q.format = format;
  q.export_id = id;
  q.offset = offset;
  q.length = length;
  q.close = close;
  if (archive) q.archive_name = (char *)archive;
  Grove__Request req = GROVE__REQUEST__INIT;
  req.body_case = GROVE__REQUEST__BODY_EXPORT_STATE_DICT;
  req.export_state_dict = &q;
  Grove__Reply *rep = h_raw(url, &req);
  ck_assert_ptr_nonnull(rep);
  return rep;
}

static int raw_status(Grove__Reply *rep, const char *needle) {
  int s = rep->status;
  if (needle) ck_assert_msg(strstr(rep->message, needle), "%s", rep->message);
  grove__reply__free_unpacked(rep, NULL);
  return s;
}

START_TEST(export_refusals) {
  const char *u = X.ipc;
  ck_assert_int_eq(raw_status(raw_export(u, "export_bn", 3, 0, 0, 10, false, NULL), "format 3"),
                   GROVE_E_INVALID_ARGUMENT);
  ck_assert_int_eq(raw_status(raw_export(u, "nope", 1, 0, 0, 10, false, NULL), "'nope'"),
                   GROVE_E_NOT_FOUND);
  ck_assert_int_eq(raw_status(raw_export(u, "export_bn", 2, 0, 0, 10, false, "a/b"), "a/b"),
                   GROVE_E_INVALID_ARGUMENT);
  ck_assert_int_eq(raw_status(raw_export(u, "", 0, 12345, 0, 10, false, NULL), "12345"),
                   GROVE_E_NOT_FOUND);
  /* Open 16 exports (the limit) and keep them open. */
  uint64_t ids[16];
  uint64_t total = 0;
  for (int i = 0; i < 16; i++) {
    Grove__Reply *r = raw_export(u, "export_bn", 1 + i % 2, 0, 0, 10, false, NULL);
    ck_assert_int_eq(r->status, 0);
    ck_assert_int_eq(r->body_case, GROVE__REPLY__BODY_EXPORT_STATE_DICT);
    ids[i] = r->export_state_dict->export_id;
    if (i == 0) total = r->export_state_dict->total_size;
    ck_assert_uint_eq(r->export_state_dict->data.len, 10);
    ck_assert(!r->export_state_dict->closed);
    grove__reply__free_unpacked(r, NULL);
  }
  ck_assert(h_metric(&X, "grove_exports_open") == 16);
  ck_assert_int_eq(raw_status(raw_export(u, "export_bn", 1, 0, 0, 10, false, NULL), "16 exports"),
                   GROVE_E_RESOURCE_EXHAUSTED);
  /* Fetches: past the end, another model's name, the last byte. */
  ck_assert_int_eq(
      raw_status(raw_export(u, "", 0, ids[0], total + 1, 10, false, NULL), "past the end"),
      GROVE_E_INVALID_ARGUMENT);
  ck_assert_int_eq(
      raw_status(raw_export(u, "reload_mlp", 0, ids[0], 0, 10, false, NULL), "export_bn"),
      GROVE_E_INVALID_ARGUMENT);
  Grove__Reply *r = raw_export(u, "export_bn", 0, ids[0], total - 1, 100, false, NULL);
  ck_assert_int_eq(r->status, 0);
  ck_assert_uint_eq(r->export_state_dict->data.len, 1);
  ck_assert_uint_eq(r->export_state_dict->offset, total - 1);
  grove__reply__free_unpacked(r, NULL);
  /* Close them all: with a fetch, or alone. */
  for (int i = 0; i < 16; i++) {
    r = raw_export(u, "", 0, ids[i], 0, i % 2 ? 5 : 0, true, NULL);
    ck_assert_int_eq(r->status, 0);
    ck_assert(r->export_state_dict->closed);
    grove__reply__free_unpacked(r, NULL);
  }
  ck_assert(h_metric(&X, "grove_exports_open") == 0);
  ck_assert_int_eq(raw_status(raw_export(u, "", 0, ids[3], 0, 10, false, NULL), "not open"),
                   GROVE_E_NOT_FOUND);
}
END_TEST

/* ---------------------------------------------------------- during reloads */

typedef struct storm {
  const char *url;
  atomic_bool stop;
  int reloads;
  grove_status st;
  char msg[512];
} storm;

static void *storm_main(void *arg) {
  storm *s = arg;
  grove_client *c = h_connect(s->url);
  char a[4096], b[4096];
  snprintf(a, sizeof a, "%s/a.safetensors", grove_fixture("reload_ckpt"));
  snprintf(b, sizeof b, "%s/b.pt", grove_fixture("reload_ckpt"));
  /* Version v holds A when odd, B when even. */
  for (int k = 0; k < 200 && !atomic_load(&s->stop); k++) {
    grove_reload_opts o = {.checkpoint = k % 2 ? a : b};
    grove_reload_result res;
    grove_err err = {0};
    grove_status st = grove_client_reload(c, "reload_mlp", &o, 20000, &res, &err);
    grove_reload_result_fini(&res);
    if (st) {
      s->st = st;
      snprintf(s->msg, sizeof s->msg, "%s", grove_err_msg(&err));
      break;
    }
    s->reloads++;
  }
  grove_client_close(c);
  return NULL;
}

/* Every tensor of got equals want's bit for bit, same keys, same order. */
static void same_sd(const grove_state_dict *got, const grove_state_dict *want) {
  ck_assert_uint_eq(grove_sd_count(got), grove_sd_count(want));
  for (size_t i = 0; i < grove_sd_count(want); i++) {
    ck_assert_str_eq(grove_sd_key(got, i), grove_sd_key(want, i));
    const grove_tensor *g = grove_sd_tensor(got, i), *w = grove_sd_tensor(want, i);
    ck_assert(g->dtype == w->dtype && grove_tensor_same_shape(g, w));
    ck_assert(memcmp(g->data, w->data, grove_tensor_nbytes(w)) == 0);
  }
}

START_TEST(export_during_reloads) {
  /* A server of its own: the storm moves reload_mlp's version. */
  hserver s;
  char arg[4200];
  snprintf(arg, sizeof arg, "reload_mlp=%s", grove_fixture("reload_mlp"));
  const char *extra[] = {"--model", arg, NULL};
  h_start(&s, extra);
  grove_err err = {0};
  grove_state_dict *A = NULL, *B = NULL;
  char path[4096];
  snprintf(path, sizeof path, "%s/a.safetensors", grove_fixture("reload_ckpt"));
  ck_assert_ok(grove_safetensors_read(path, &A, &err), &err);
  snprintf(path, sizeof path, "%s/b.safetensors", grove_fixture("reload_ckpt"));
  ck_assert_ok(grove_safetensors_read(path, &B, &err), &err);
  storm st = {.url = s.tcp};
  pthread_t th;
  ck_assert_int_eq(pthread_create(&th, NULL, storm_main, &st), 0);
  grove_client *c = h_connect(s.ipc);
  int64_t last = 0;
  int versions_seen = 0;
  for (int i = 0; i < 24; i++) {
    grove_ckpt_format f = i % 2 ? GROVE_CKPT_TORCH_ZIP : GROVE_CKPT_SAFETENSORS;
    grove_export_info info;
    /* Small chunks: many round trips, during which versions change. */
    membuf b = export_mem(c, "reload_mlp", f, NULL, 64, &info);
    grove_state_dict *sd = NULL;
    if (f == GROVE_CKPT_SAFETENSORS)
      ck_assert_ok(grove_safetensors_read_buffer(b.p, b.n, "export", &sd, &err), &err);
    else
      ck_assert_ok(grove__torch_read_buffer(b.p, b.n, "export", NULL, &sd, &err), &err);
    same_sd(sd, info.version % 2 ? A : B);
    if (info.version != last) versions_seen++;
    ck_assert_int_ge(info.version, last);
    last = info.version;
    grove_sd_free(sd);
    free(b.p);
  }
  atomic_store(&st.stop, true);
  pthread_join(th, NULL);
  ck_assert_msg(st.st == GROVE_OK, "a reload failed: %s", st.msg);
  ck_assert_int_gt(st.reloads, 0);
  fprintf(stderr, "export_during_reloads: %d reloads, %d versions exported\n", st.reloads,
          versions_seen);
  grove_client_close(c);
  grove_sd_free(A);
  grove_sd_free(B);
  ck_assert_int_eq(h_stop(&s), 0);
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
  TCase *sv = tcase_create("server");
  tcase_add_unchecked_fixture(sv, x_setup, x_teardown);
  tcase_set_timeout(sv, 120);
  tcase_add_test(sv, export_equals_writer);
  tcase_add_test(sv, export_prefix);
  tcase_add_test(sv, export_file_rules);
  tcase_add_test(sv, export_refusals);
  tcase_add_test(sv, export_during_reloads);
  suite_add_tcase(s, sv);
  return s;
}

GROVE_TEST_MAIN(export_suite)
