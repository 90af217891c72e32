/* check_torch.c: torch.save checkpoints (core/io/torch_zip.c, core/io/pickle.c,
 * core/io/torch_load.c, core/io/torch_save.c).
 *
 * - Files written by real torch.save (tests/fixtures_gen/torch_ckpt.py) read
 *   by Grove and compared bit for bit with the same tensors saved as
 *   safetensors; shared storages and _metadata versions checked.
 * - Round trips through grove_torch_write (stored, deflated, ZIP64, tied,
 *   non-contiguous, every dtype, thousands of keys).  With GROVE_PT_OUT set,
 *   the files are also left there for tests/py/test_torch_ckpt.py, which
 *   loads them with torch.load(weights_only=True).
 * - Every refusal path with its exact status, from archives and pickles
 *   built here byte by byte, and the os.system exploit fixture (its command
 *   must never run).
 * - Regressions found by the fuzzers (fuzz/), as bytes.
 */
#include <dirent.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "internal.h"
#include "testutil.h"
#include "torch_craft.h"
#include "fileio.h"
#include "torch_internal.h"

/* ================================================================ helpers */

static char tmpdir[256];

static const char *tmp_path(const char *name) {
  static char buf[512];
  snprintf(buf, sizeof buf, "%s/%s", tmpdir, name);
  return buf;
}

static void rm_tree(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    char p[1024];
    snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
    struct stat sb;
    if (lstat(p, &sb) == 0 && S_ISDIR(sb.st_mode))
      rm_tree(p);
    else
      unlink(p);
  }
  closedir(d);
  rmdir(dir);
}

static void setup_tmp(void) {
  const char *d = grove_test_tmpdir();
  ck_assert_ptr_nonnull(d);
  snprintf(tmpdir, sizeof tmpdir, "%s", d);
}

static void teardown_tmp(void) {
  rm_tree(tmpdir);
}

/* A heap tensor filled with distinctive bytes; floats stay finite so that
 * no conversion could quieten a NaN. */
static grove_tensor *patterned(grove_dtype dt, int ndim, const int64_t *shape, unsigned seed) {
  grove_err err = {0};
  grove_tensor *t = grove_tensor_new(dt, ndim, shape, &err);
  ck_assert_msg(t != NULL, "grove_tensor_new: %s", grove_err_msg(&err));
  uint8_t *p = t->data;
  size_t n = grove_tensor_nbytes(t);
  for (size_t i = 0; i < n; i++) p[i] = (uint8_t)(i * 37u + 11u + seed);
  if (dt == GROVE_BOOL)
    for (size_t i = 0; i < n; i++) p[i] &= 1;
  size_t es = grove_dtype_size(dt);
  if (grove_dtype_is_float(dt))
    for (size_t i = es - 1; i < n; i += es) p[i] &= 0x3F;
  return t;
}

static void sd_put(grove_state_dict *sd, const char *key, grove_tensor *t) {
  grove_err err = {0};
  ck_assert_ok(grove_sd_add(sd, key, t, &err), &err);
  grove_tensor_release(t);
}

/* Asserts a and b hold the same keys in the same order with the same
 * dtypes, shapes and element bits. */
static void assert_same_sd(const grove_state_dict *a, const grove_state_dict *b, const char *what) {
  ck_assert_msg(grove_sd_count(a) == grove_sd_count(b), "%s: %zu keys vs %zu", what,
                grove_sd_count(a), grove_sd_count(b));
  for (size_t i = 0; i < grove_sd_count(a); i++) {
    const char *k = grove_sd_key(a, i);
    ck_assert_msg(strcmp(k, grove_sd_key(b, i)) == 0, "%s: key %zu is '%s' vs '%s'", what, i, k,
                  grove_sd_key(b, i));
    const grove_tensor *x = grove_sd_tensor(a, i), *y = grove_sd_tensor(b, i);
    ck_assert_msg(x->dtype == y->dtype, "%s: '%s': dtype %s vs %s", what, k,
                  grove_dtype_name(x->dtype), grove_dtype_name(y->dtype));
    ck_assert_msg(grove_tensor_same_shape(x, y), "%s: '%s': shapes differ", what, k);
    size_t n = grove_tensor_nbytes(x);
    uint8_t *bx = malloc(n + 1), *by = malloc(n + 1);
    grove__tensor_gather(x, bx);
    grove__tensor_gather(y, by);
    ck_assert_msg(memcmp(bx, by, n) == 0, "%s: '%s': the bytes differ", what, k);
    free(bx);
    free(by);
  }
}

static void assert_same_meta(const grove_state_dict *a, const grove_state_dict *b) {
  ck_assert_uint_eq(grove_sd_meta_count(a), grove_sd_meta_count(b));
  for (size_t i = 0; i < grove_sd_meta_count(a); i++) {
    int v;
    ck_assert(grove_sd_get_version(b, grove_sd_meta_prefix(a, i), &v));
    ck_assert_int_eq(v, grove_sd_meta_version(a, i));
  }
}

static bool status_from_name(const char *name, grove_status *out) {
  for (int i = 0; i < 100; i++)
    if (name && strcmp(grove_status_name((grove_status)i), name) == 0) {
      *out = (grove_status)i;
      return true;
    }
  return false;
}

/* Unpickles raw bytes (no archive). */
static grove_status unpickle(const void *p, size_t n, grove_err *err) {
  grove__pickle *pk = NULL;
  const grove__pk *root = NULL;
  grove_status st = grove__pickle_load(p, n, "test.pkl", &pk, &root, err);
  grove__pickle_free(pk);
  return st;
}

/* ================================================================ fixtures */

static json_t *load_expected(void) {
  json_error_t je;
  json_t *doc = json_load_file(grove_fixture("torch_ckpt.json"), 0, &je);
  ck_assert_msg(doc != NULL, "torch_ckpt.json: %s", je.text);
  return doc;
}

START_TEST(test_torch_fixtures_read) {
  json_t *doc = load_expected();
  json_t *reads = json_object_get(doc, "read");
  ck_assert_uint_ge(json_object_size(reads), 10);
  const char *file;
  json_t *exp;
  json_object_foreach(reads, file, exp) {
    char path[1024], st_path[1024];
    snprintf(path, sizeof path, "%s", grove_fixture(file));
    snprintf(st_path, sizeof st_path, "%s",
             grove_fixture(json_string_value(json_object_get(exp, "safetensors"))));
    grove_err err = {0};
    grove_state_dict *pt = NULL, *st = NULL, *any = NULL;
    ck_assert_ok(grove_torch_read(path, &pt, &err), &err);
    ck_assert_ok(grove_safetensors_read(st_path, &st, &err), &err);
    assert_same_sd(pt, st, file);
    /* The dispatcher takes the same path. */
    ck_assert_ok(grove_checkpoint_read(path, &any, &err), &err);
    assert_same_sd(any, pt, file);

    /* Contiguous views of one torch storage share one grove_storage; other
     * tensors do not share theirs with them. */
    size_t gi;
    json_t *group;
    json_array_foreach(json_object_get(exp, "shared"), gi, group) {
      const grove_tensor *first = grove_sd_get(pt, json_string_value(json_array_get(group, 0)));
      ck_assert_ptr_nonnull(first);
      for (size_t k = 1; k < json_array_size(group); k++) {
        const char *key = json_string_value(json_array_get(group, k));
        const grove_tensor *t = grove_sd_get(pt, key);
        ck_assert_msg(t && t->storage == first->storage, "%s: '%s' does not share its storage",
                      file, key);
      }
    }

    /* _metadata: exactly the versions torch's state_dict carried. */
    json_t *meta = json_object_get(exp, "metadata");
    ck_assert_msg(grove_sd_meta_count(pt) == json_object_size(meta), "%s: %zu metadata entries",
                  file, grove_sd_meta_count(pt));
    const char *prefix;
    json_t *ver;
    json_object_foreach(meta, prefix, ver) {
      int v = -1;
      ck_assert_msg(grove_sd_get_version(pt, prefix, &v), "%s: no version for '%s'", file, prefix);
      ck_assert_int_eq(v, (int)json_integer_value(ver));
    }
    grove_sd_free(any);
    grove_sd_free(pt);
    grove_sd_free(st);
  }
  json_decref(doc);
}
END_TEST

START_TEST(test_torch_fixture_details) {
  grove_err err = {0};
  grove_state_dict *sd = NULL;
  /* Tied weights: the Embedding's weight and the Linear's are one storage;
   * BatchNorm's version 2 is read; _metadata is not a key. */
  ck_assert_ok(grove_torch_read(grove_fixture("torch_tied.pt"), &sd, &err), &err);
  grove_tensor *emb = grove_sd_get(sd, "emb.weight"), *out = grove_sd_get(sd, "out.weight");
  ck_assert(emb && out && emb->storage == out->storage && emb->data == out->data);
  int v = 0;
  ck_assert(grove_sd_get_version(sd, "norm", &v));
  ck_assert_int_eq(v, 2);
  ck_assert(!grove_sd_contains(sd, "_metadata"));
  grove_sd_free(sd);

  /* A transposed view comes back as a view (strides kept, as torch.load
   * gives it) with the transposed values. */
  ck_assert_ok(grove_torch_read(grove_fixture("torch_views.pt"), &sd, &err), &err);
  grove_tensor *t = grove_sd_get(sd, "transposed");
  ck_assert(t && t->ndim == 2 && t->shape[0] == 6 && t->shape[1] == 4);
  ck_assert(!grove_tensor_is_contiguous(t) && t->strides[0] == 1 && t->strides[1] == 6);
  float f[24];
  grove__tensor_gather(t, f);
  ck_assert(f[0] == 0.0f && f[1] == 6.0f && f[4] == 1.0f && f[23] == 23.0f);
  grove_tensor *narrow = grove_sd_get(sd, "narrow"), *base = grove_sd_get(sd, "base");
  ck_assert(narrow->storage == base->storage);
  ck_assert_ptr_eq(narrow->data, (float *)base->data + 6);
  grove_sd_free(sd);

  /* A nested checkpoint: only the state_dict's tensors, in order. */
  ck_assert_ok(grove_torch_read(grove_fixture("torch_nested.pt"), &sd, &err), &err);
  ck_assert_str_eq(grove_sd_key(sd, 0), "0.weight");
  ck_assert(!grove_sd_contains(sd, "epoch") && !grove_sd_contains(sd, "optimizer"));
  ck_assert(grove_sd_get_version(sd, "1", &v) && v == 2);
  grove_sd_free(sd);

  ck_assert_ok(grove_torch_read(grove_fixture("torch_many.pt"), &sd, &err), &err);
  ck_assert_uint_eq(grove_sd_count(sd), 420);
  ck_assert_str_eq(grove_sd_key(sd, 419), "59.1.num_batches_tracked");
  grove_sd_free(sd);
}
END_TEST

START_TEST(test_torch_fixtures_refused) {
  json_t *doc = load_expected();
  json_t *refused = json_object_get(doc, "refused");
  ck_assert_uint_ge(json_object_size(refused), 7);
  /* The exploit's command touches $GROVE_PWNED_MARKER when run. */
  char marker[600];
  snprintf(marker, sizeof marker, "%s/pwned.marker", tmpdir);
  setenv("GROVE_PWNED_MARKER", marker, 1);
  const char *file;
  json_t *exp;
  json_object_foreach(refused, file, exp) {
    grove_err err = {0};
    grove_state_dict *sd = (grove_state_dict *)1;
    grove_status want;
    ck_assert(status_from_name(json_string_value(json_object_get(exp, "status")), &want));
    ck_assert_status(grove_checkpoint_read(grove_fixture(file), &sd, &err), want);
    ck_assert_ptr_null(sd);
    size_t i;
    json_t *m;
    json_array_foreach(json_object_get(exp, "mentions"), i, m)
        assert_mentions(&err, json_string_value(m));
    assert_mentions(&err, file);
  }
  struct stat sb;
  ck_assert_msg(stat(marker, &sb) != 0, "the exploit's command ran: %s exists", marker);
  unsetenv("GROVE_PWNED_MARKER");
  json_decref(doc);
}
END_TEST

/* ================================================================ round trips */

/* Every dtype, a scalar, an empty tensor, a non-contiguous view, a tensor
 * under two keys, and module versions. */
static grove_state_dict *sample_sd(void) {
  grove_state_dict *sd = grove_sd_new();
  static const grove_dtype dts[] = {GROVE_F32, GROVE_F16, GROVE_BF16, GROVE_F64, GROVE_I64,
                                    GROVE_I32, GROVE_I16, GROVE_I8,   GROVE_U8,  GROVE_BOOL};
  static const char *names[] = {"f32", "f16", "bf16", "f64", "i64",
                                "i32", "i16", "i8",   "u8",  "bool"};
  for (size_t i = 0; i < sizeof dts / sizeof dts[0]; i++) {
    int64_t shape[2] = {3, (int64_t)i + 1};
    sd_put(sd, names[i], patterned(dts[i], 2, shape, (unsigned)i));
  }
  sd_put(sd, "scalar", patterned(GROVE_F32, 0, NULL, 99));
  int64_t zero[2] = {0, 4};
  sd_put(sd, "empty", patterned(GROVE_F32, 2, zero, 1));
  /* A transposed view of a 4x5 weight (strides 1, 5). */
  int64_t s45[2] = {4, 5}, s54[2] = {5, 4}, tstr[2] = {1, 5};
  grove_tensor *w = patterned(GROVE_F32, 2, s45, 7);
  grove_err err = {0};
  grove_tensor *wt = grove_tensor_view_new(w->storage, 0, GROVE_F32, 2, s54, tstr, &err);
  ck_assert_ptr_nonnull(wt);
  grove_tensor_release(w);
  sd_put(sd, "weight_t", wt);
  /* Tied: one tensor, two keys. */
  int64_t s3[1] = {3};
  grove_tensor *tie = patterned(GROVE_F32, 1, s3, 5);
  ck_assert_ok(grove_sd_add(sd, "tie.a", tie, &err), &err);
  ck_assert_ok(grove_sd_add(sd, "tie.b", tie, &err), &err);
  grove_tensor_release(tie);
  sd_put(sd, "emb.\xc3\xb1", patterned(GROVE_F32, 1, s3, 3));

  ck_assert_ok(grove_sd_set_version(sd, "", 1, &err), &err);
  ck_assert_ok(grove_sd_set_version(sd, "bn", 2, &err), &err);
  return sd;
}

/* A state_dict past the thresholds of the pickle (SETITEMS batches of 1000,
 * memo indexes past 255) and of the storage list. */
static grove_state_dict *many_sd(void) {
  grove_state_dict *sd = grove_sd_new();
  grove_err err = {0};
  for (int i = 0; i < 2500; i++) {
    char key[64];
    snprintf(key, sizeof key, "layers.%d.weight", i);
    int64_t shape[1] = {1 + i % 3};
    sd_put(sd, key, patterned(i % 2 ? GROVE_F32 : GROVE_I64, 1, shape, (unsigned)i));
    snprintf(key, sizeof key, "layers.%d", i);
    ck_assert_ok(grove_sd_set_version(sd, key, 1 + i % 5, &err), &err);
  }
  return sd;
}

static const char *pt_out_dir(void) {
  const char *d = getenv("GROVE_PT_OUT");
  return d && *d ? d : NULL;
}

/* Writes sd to path, reads it back and compares; when GROVE_PT_OUT is set,
 * also leaves NAME.pt and NAME.safetensors there for the Python test. */
static void round_trip(grove_state_dict *sd, const char *name,
                       const grove__torch_write_opts *opts) {
  grove_err err = {0};
  char path[600];
  snprintf(path, sizeof path, "%s/%s.pt", tmpdir, name);
  ck_assert_ok(grove__torch_write(path, sd, opts, &err), &err);
  grove_state_dict *back = NULL;
  ck_assert_ok(grove_torch_read(path, &back, &err), &err);
  assert_same_sd(sd, back, name);
  assert_same_meta(sd, back);
  grove_sd_free(back);
  const char *out = pt_out_dir();
  if (out) {
    snprintf(path, sizeof path, "%s/%s.pt", out, name);
    ck_assert_ok(grove__torch_write(path, sd, opts, &err), &err);
    snprintf(path, sizeof path, "%s/%s.safetensors", out, name);
    ck_assert_ok(grove_safetensors_write(path, sd, &err), &err);
  }
}

START_TEST(test_round_trip) {
  grove_state_dict *sd = sample_sd();
  round_trip(sd, "grove_sample", NULL);
  /* The tied pair comes back on one storage. */
  grove_err err = {0};
  grove_state_dict *back = NULL;
  ck_assert_ok(grove_torch_read(tmp_path("grove_sample.pt"), &back, &err), &err);
  ck_assert_ptr_eq(grove_sd_get(back, "tie.a")->storage, grove_sd_get(back, "tie.b")->storage);
  ck_assert_ptr_ne(grove_sd_get(back, "f32")->storage, grove_sd_get(back, "tie.a")->storage);
  grove_sd_free(back);
  grove_sd_free(sd);
}
END_TEST

START_TEST(test_round_trip_zip64_deflate) {
  grove_state_dict *sd = sample_sd();
  grove__torch_write_opts z64 = {.zip = {.force_zip64 = true}};
  round_trip(sd, "grove_zip64", &z64);
  grove__torch_write_opts defl = {.zip = {.deflate = true}};
  round_trip(sd, "grove_deflated", &defl);
  grove__torch_write_opts both = {.zip = {.deflate = true, .force_zip64 = true}};
  round_trip(sd, "grove_zip64_deflated", &both);
  grove_sd_free(sd);
}
END_TEST

START_TEST(test_round_trip_many) {
  grove_state_dict *sd = many_sd();
  round_trip(sd, "grove_many", NULL);
  grove_sd_free(sd);
  sd = grove_sd_new();
  round_trip(sd, "grove_empty", NULL);
  grove_sd_free(sd);
}
END_TEST

/* torch's fixtures written back by Grove (the Python test loads these with
 * torch and compares them with torch's own load of the originals). */
START_TEST(test_resave_torch_fixtures) {
  json_t *doc = load_expected();
  const char *file;
  json_t *exp;
  json_object_foreach(json_object_get(doc, "read"), file, exp) {
    grove_err err = {0};
    grove_state_dict *sd = NULL;
    ck_assert_ok(grove_torch_read(grove_fixture(file), &sd, &err), &err);
    char name[256];
    snprintf(name, sizeof name, "resaved_%.*s", (int)(strlen(file) - 3), file);
    round_trip(sd, name, NULL);
    grove_sd_free(sd);
  }
  json_decref(doc);
}
END_TEST

START_TEST(test_written_layout) {
  grove_state_dict *sd = sample_sd();
  grove_err err = {0};
  const char *path = tmp_path("my.model.pt");
  ck_assert_ok(grove_torch_write(path, sd, &err), &err);
  size_t len;
  char *buf = grove_test_read_file(path, &len);
  ck_assert_ptr_nonnull(buf);
  grove__zip z;
  ck_assert_ok(grove__zip_open(&z, buf, len, path, &err), &err);
  /* One folder named after the file without its last extension; records
   * stored, data 64-byte aligned; version and byteorder present. */
  for (size_t i = 0; i < z.count; i++) {
    ck_assert_msg(strncmp(z.entries[i].name, "my.model/", 9) == 0, "%s", z.entries[i].name);
    ck_assert_uint_eq(z.entries[i].method, 0);
    ck_assert_uint_eq(z.entries[i].data_offset % 64, 0);
  }
  ck_assert_str_eq(z.entries[0].name, "my.model/data.pkl");
  const grove__zip_entry *v = grove__zip_find(&z, "my.model/version");
  const grove__zip_entry *bo = grove__zip_find(&z, "my.model/byteorder");
  ck_assert(v && v->size == 2 && memcmp(buf + v->data_offset, "3\n", 2) == 0);
  ck_assert(bo && bo->size == 6 && memcmp(buf + bo->data_offset, "little", 6) == 0);
  /* The tied tensor is written once: 15 storages for 16 keys. */
  ck_assert_ptr_nonnull(grove__zip_find(&z, "my.model/data/14"));
  ck_assert_ptr_null(grove__zip_find(&z, "my.model/data/15"));
  grove__zip_close(&z);
  free(buf);

  /* A file name with no stem gets "archive". */
  path = tmp_path(".pt");
  ck_assert_ok(grove_torch_write(path, sd, &err), &err);
  buf = grove_test_read_file(path, &len);
  ck_assert_ok(grove__zip_open(&z, buf, len, path, &err), &err);
  ck_assert_str_eq(z.entries[0].name, "archive/data.pkl");
  grove__zip_close(&z);
  free(buf);
  grove_sd_free(sd);
}
END_TEST

/* Whether p lies in a mapping of a file whose path ends in name
 * (/proc/self/maps). */
static bool in_file_mapping(uintptr_t p, const char *name) {
  FILE *f = fopen("/proc/self/maps", "r");
  if (!f) return false;
  char line[1024];
  bool found = false;
  while (!found && fgets(line, sizeof line, f)) {
    unsigned long lo, hi;
    line[strcspn(line, "\n")] = '\0';
    size_t n = strlen(line), k = strlen(name);
    if (sscanf(line, "%lx-%lx", &lo, &hi) == 2 && n >= k && strcmp(line + n - k, name) == 0)
      found = p >= lo && p < hi;
  }
  fclose(f);
  return found;
}

START_TEST(test_zero_copy) {
  /* Stored f32 storages are used in place, in the reader's copy of the file
   * (never a mapping of it: a write to the file must not reach them); other
   * dtypes are copied.  The copy lives as long as a tensor does. */
  grove_state_dict *sd = sample_sd();
  grove_err err = {0};
  ck_assert_ok(grove_torch_write(tmp_path("zc.pt"), sd, &err), &err);
  grove_state_dict *back = NULL;
  ck_assert_ok(grove_torch_read(tmp_path("zc.pt"), &back, &err), &err);
  grove_tensor *f = grove_sd_get(back, "f32"), *h = grove_sd_get(back, "f16");
  uintptr_t addr = (uintptr_t)f->data;
  ck_assert(!in_file_mapping(addr, "/zc.pt"));
  ck_assert(!in_file_mapping((uintptr_t)h->data, "/zc.pt"));
  ck_assert_uint_eq(grove_storage_nbytes(f->storage), 12);
  grove_tensor_retain(f);
  grove_sd_free(back);
  ck_assert_uint_eq(((uint8_t *)f->data)[0], (uint8_t)(0 * 37u + 11u));
  grove_tensor_release(f);
  grove_sd_free(sd);
}
END_TEST

START_TEST(test_surrogate_key) {
  /* A lone surrogate, which a Python str (so a torch key) may hold: pickle
   * writes it with "surrogatepass"; Grove reads and writes it back.  (Not
   * left for the Python test: safetensors' JSON cannot hold it.) */
  grove_state_dict *sd = grove_sd_new();
  int64_t s3[1] = {3};
  sd_put(sd, "lone.\xed\xa0\x80", patterned(GROVE_I8, 1, s3, 4));
  grove_err err = {0};
  ck_assert_ok(grove_torch_write(tmp_path("lone.pt"), sd, &err), &err);
  grove_state_dict *back = NULL;
  ck_assert_ok(grove_torch_read(tmp_path("lone.pt"), &back, &err), &err);
  assert_same_sd(sd, back, "lone");
  grove_sd_free(back);
  grove_sd_free(sd);
}
END_TEST

START_TEST(test_write_refusals) {
  grove_err err = {0};
  grove_state_dict *sd = grove_sd_new();
  int64_t s1[1] = {1};
  sd_put(sd, "bad\xff", patterned(GROVE_F32, 1, s1, 0));
  ck_assert_status(grove_torch_write(tmp_path("x.pt"), sd, &err), GROVE_E_BAD_UTF8);
  ck_assert_int_ne(access(tmp_path("x.pt"), F_OK), 0);
  grove_sd_free(sd);
  /* A missing directory: GROVE_E_IO and no file. */
  sd = sample_sd();
  ck_assert_status(grove_torch_write(tmp_path("no/such/dir/x.pt"), sd, &err), GROVE_E_IO);
  ck_assert_status(grove_torch_write(NULL, sd, &err), GROVE_E_INVALID_ARGUMENT);
  grove_sd_free(sd);
}
END_TEST

/* ================================================================ crafted: OK */

START_TEST(test_crafted_variants_ok) {
  grove_err err = {0};
  grove_state_dict *sd = NULL;
  int64_t shape[2] = {2, 3}, stride[2] = {3, 1};

  /* _rebuild_tensor_v3 on an UntypedStorage with dtype float32, wrapped in
   * _rebuild_from_type_v2(func, torch.Tensor, args, {}), plus a Parameter
   * NEWOBJ and torch.Size in a non-tensor value, in a {"module": ...}. */
  bytes b = {0};
  b_op(&b, 0x80);
  b_op(&b, 2);
  b_op(&b, '}');
  b_str(&b, "module");
  b_op(&b, '}');
  b_op(&b, '(');
  b_str(&b, "v3");
  b_global(&b, "torch._tensor", "_rebuild_from_type_v2");
  b_op(&b, '(');
  b_global(&b, "torch._utils", "_rebuild_tensor_v3");
  b_global(&b, "torch", "Tensor");
  b_op(&b, '(');
  b_op(&b, '(');
  b_str(&b, "storage");
  b_global(&b, "torch.storage", "UntypedStorage");
  b_str(&b, "0");
  b_str(&b, "cpu");
  b_int(&b, 24);
  b_op(&b, 't');
  b_op(&b, 'Q');
  b_int(&b, 0);
  b_tuple(&b, 2, shape);
  b_tuple(&b, 2, stride);
  b_op(&b, 0x89);
  b_global(&b, "collections", "OrderedDict");
  b_op(&b, ')');
  b_op(&b, 'R');
  b_global(&b, "torch", "float32");
  b_op(&b, 't');
  b_op(&b, '}');
  b_op(&b, 't');
  b_op(&b, 'R');
  b_str(&b, "param");
  b_global(&b, "torch.nn.parameter", "Parameter");
  b_op(&b, '(');
  b_tensor(&b, "FloatStorage", "0x", 6, 0, 2, shape, stride);
  b_op(&b, 0x88);
  b_op(&b, 't');
  b_op(&b, 0x81); /* NEWOBJ */
  b_str(&b, "size");
  b_global(&b, "torch", "Size");
  int64_t sz[2] = {2, 3};
  b_tuple(&b, 2, sz);
  b_op(&b, 0x85);
  b_op(&b, 'R');
  b_str(&b, "blob");
  b_global(&b, "_codecs", "encode");
  b_str(&b, "\xc3\xbf\x01");
  b_str(&b, "latin1");
  b_op(&b, 0x86);
  b_op(&b, 'R');
  b_str(&b, "labels");
  b_global(&b, "__builtin__", "set");
  b_op(&b, ']');
  b_op(&b, '(');
  b_int(&b, 1);
  b_int(&b, 2);
  b_op(&b, 'e');
  b_op(&b, 0x85);
  b_op(&b, 'R');
  b_str(&b, "lr");
  uint8_t binfloat[9] = {'G', 0x3f, 0xf8, 0, 0, 0, 0, 0, 0};
  b_put(&b, binfloat, 9);
  b_op(&b, 'u');
  b_op(&b, 's');
  b_op(&b, '.');
  /* Two storages: "0" (24 bytes = 6 floats) and "0x" are both data/<key>:
   * read_crafted names them data/0 and data/1, so rename the second. */
  rec recs[4];
  float d0[6] = {0, 1, 2, 3, 4, 5}, d1[6] = {6, 7, 8, 9, 10, 11};
  recs[0] = (rec){"a/data.pkl", b.p, b.n};
  recs[1] = (rec){"a/data/0", d0, sizeof d0};
  recs[2] = (rec){"a/data/0x", d1, sizeof d1};
  recs[3] = (rec){"a/version", "3\n", 2};
  size_t len;
  uint8_t *zip = make_zip(recs, 4, NULL, &len);
  ck_assert_ok(grove__torch_read_buffer(zip, len, "crafted.pt", NULL, &sd, &err), &err);
  ck_assert_uint_eq(grove_sd_count(sd), 2);
  ck_assert_str_eq(grove_sd_key(sd, 0), "v3");
  ck_assert_str_eq(grove_sd_key(sd, 1), "param");
  ck_assert(((float *)grove_sd_tensor(sd, 0)->data)[5] == 5.0f);
  ck_assert(((float *)grove_sd_tensor(sd, 1)->data)[0] == 6.0f);
  grove_sd_free(sd);
  free(zip);
  b_free(&b);
}
END_TEST

/* ================================================================ crafted: refused */

/* A one-tensor state_dict with the given storage class, offset, shape and
 * stride over a storage of numel floats whose record holds rec_numel. */
static grove_status one_tensor_nd(const char *cls, int64_t numel, int64_t rec_numel, int64_t offset,
                                  int nd, const int64_t *shape, int nds, const int64_t *stride,
                                  grove_err *err) {
  bytes b = {0};
  b_begin_sd(&b);
  b_str(&b, "w");
  b_global(&b, "torch._utils", "_rebuild_tensor_v2");
  b_op(&b, '(');
  b_op(&b, '(');
  b_str(&b, "storage");
  b_global(&b, "torch", cls);
  b_str(&b, "0");
  b_str(&b, "cpu");
  b_int(&b, numel);
  b_op(&b, 't');
  b_op(&b, 'Q');
  b_int(&b, offset);
  b_tuple(&b, nd, shape);
  b_tuple(&b, nds, stride);
  b_op(&b, 0x89);
  b_op(&b, '}');
  b_op(&b, 't');
  b_op(&b, 'R');
  b_end_sd(&b);
  grove_state_dict *sd = NULL;
  grove_status st = read_crafted(&b, &rec_numel, 1, &sd, err);
  grove_sd_free(sd);
  b_free(&b);
  return st;
}

static grove_status one_tensor(const char *cls, int64_t numel, int64_t rec_numel, int64_t offset,
                               int nd, const int64_t *shape, const int64_t *stride,
                               grove_err *err) {
  return one_tensor_nd(cls, numel, rec_numel, offset, nd, shape, nd, stride, err);
}

/* Views whose last index, offset + sum((shape_i - 1) * stride_i), is
 * exactly 2^64 - 1: "+ 1" wrapped the bounds check to 0 and the reader then
 * gathered from outside the storage (a segfault in grove inspect and groved;
 * the second shape served bytes of the zip header as a bias).  torch
 * refuses both. */
START_TEST(test_view_bounds_wrap) {
  grove_err err = {0};
  int64_t s3[1] = {3}, huge[1] = {INT64_MAX};
  ck_assert_status(one_tensor("FloatStorage", 6, 6, 1, 1, s3, huge, &err), GROVE_E_BAD_OFFSETS);
  assert_mentions(&err, "crafted.pt");
  assert_mentions(&err, "'w'");
  assert_mentions(&err, "out of bounds");
  int64_t s5[1] = {5}, st62[1] = {(INT64_C(1) << 62) - 1};
  ck_assert_status(one_tensor("FloatStorage", 6, 6, 3, 1, s5, st62, &err), GROVE_E_BAD_OFFSETS);
  assert_mentions(&err, "'w'");
  /* In two dimensions, and with the largest offset. */
  int64_t s22[2] = {2, 2}, st2[2] = {INT64_MAX, 1};
  ck_assert_status(one_tensor("FloatStorage", 6, 6, 0, 2, s22, st2, &err), GROVE_E_BAD_OFFSETS);
  int64_t s1[1] = {1}, one[1] = {1};
  ck_assert_status(one_tensor("FloatStorage", 6, 6, INT64_MAX, 1, s1, one, &err),
                   GROVE_E_BAD_OFFSETS);
  /* An empty view far past the end is refused as torch does; at the end it
   * is fine. */
  int64_t s0[1] = {0};
  ck_assert_status(one_tensor("FloatStorage", 6, 6, INT64_MAX, 1, s0, one, &err),
                   GROVE_E_BAD_OFFSETS);
  ck_assert_ok(one_tensor("FloatStorage", 6, 6, 6, 1, s0, one, &err), &err);

  /* The helper itself: the wrap, the empty case, negative strides. */
  uint64_t end = 0;
  ck_assert(!grove__view_end(1, 4, 1, s3, huge, &end));
  ck_assert(!grove__view_end(3, 4, 1, s5, st62, &end));
  ck_assert(!grove__view_end(0, 4, 1, s1, (int64_t[]){-1}, &end));
  ck_assert(grove__view_end(5, 4, 1, s0, huge, &end) && end == 20);
  ck_assert(grove__view_end(2, 4, 2, (int64_t[]){2, 3}, (int64_t[]){3, 1}, &end) && end == 32);
  ck_assert(grove__view_end(0, 4, 1, (int64_t[]){1 << 24}, (int64_t[]){0}, &end) && end == 4);
}
END_TEST

/* torch.save of zeros(1).expand(2**24), eight times: a file of a few KB that
 * torch.load reads into 32 bytes of storage.  The reader keeps the views
 * (stride 0) instead of gathering 512 MiB of copies. */
START_TEST(test_expanded_views_stay_small) {
  grove_err err = {0};
  bytes b = {0};
  b_begin_sd(&b);
  int64_t shape[1] = {INT64_C(1) << 24}, stride[1] = {0}, numels[8];
  for (int i = 0; i < 8; i++) {
    char key[16], skey[16];
    snprintf(key, sizeof key, "e%d", i);
    snprintf(skey, sizeof skey, "%d", i);
    b_str(&b, key);
    b_tensor(&b, "FloatStorage", skey, 1, 0, 1, shape, stride);
    numels[i] = 1;
  }
  b_end_sd(&b);
  grove_state_dict *sd = NULL;
  uint64_t before = grove__storage_bytes_allocated();
  ck_assert_ok(read_crafted(&b, numels, 8, &sd, &err), &err);
  uint64_t cost = grove__storage_bytes_allocated() - before;
  ck_assert_msg(cost < 4096, "reading eight expanded views allocated %llu bytes",
                (unsigned long long)cost);
  ck_assert_uint_eq(grove_sd_count(sd), 8);
  grove_tensor *t = grove_sd_get(sd, "e7");
  ck_assert(t && t->shape[0] == shape[0] && t->strides[0] == 0);
  /* The view reads as torch's does: every element is the one stored. */
  ck_assert(((const float *)t->data)[0] == 0.0f);
  grove_tensor *c = grove_tensor_clone(grove_sd_get(sd, "e0"), GROVE_F32, &err);
  ck_assert_ptr_nonnull(c);
  ck_assert(((const float *)c->data)[(1 << 24) - 1] == 0.0f);
  grove_tensor_release(c);
  /* Writing them out (grove convert) would copy 64 MiB each: refused,
   * naming the key, before any copy. */
  uint8_t *out = NULL;
  size_t len = 0;
  before = grove__storage_bytes_allocated();
  ck_assert_status(grove__torch_write_buffer(sd, "archive", NULL, &out, &len, &err), GROVE_E_LIMIT);
  assert_mentions(&err, "key 'e1'"); /* the one past the limit */
  assert_mentions(&err, "expanded");
  ck_assert_uint_lt(grove__storage_bytes_allocated() - before, 4096);
  ck_assert_ptr_null(out);
  grove_sd_free(sd);
  b_free(&b);
}
END_TEST

START_TEST(test_tensor_refusals) {
  grove_err err = {0};
  int64_t shape[2] = {2, 3}, stride[2] = {3, 1};
  ck_assert_ok(one_tensor("FloatStorage", 6, 6, 0, 2, shape, stride, &err), &err);
  /* The view reaches past the storage: by offset, by stride. */
  ck_assert_status(one_tensor("FloatStorage", 6, 6, 1, 2, shape, stride, &err),
                   GROVE_E_BAD_OFFSETS);
  assert_mentions(&err, "'w'");
  int64_t wide[2] = {4, 1};
  ck_assert_status(one_tensor("FloatStorage", 6, 6, 0, 2, shape, wide, &err), GROVE_E_BAD_OFFSETS);
  /* Strides whose products overflow 64 bits. */
  int64_t huge[2] = {INT64_C(1) << 62, 1};
  ck_assert_status(one_tensor("FloatStorage", 6, 6, 0, 2, shape, huge, &err), GROVE_E_BAD_OFFSETS);
  int64_t big[2] = {INT64_C(1) << 40, INT64_C(1) << 40};
  ck_assert_status(one_tensor("FloatStorage", 6, 6, 0, 2, big, stride, &err), GROVE_E_BAD_SIZE);
  /* The record does not hold what the pickle says. */
  ck_assert_status(one_tensor("FloatStorage", 6, 5, 0, 2, shape, stride, &err), GROVE_E_BAD_SIZE);
  ck_assert_status(one_tensor("FloatStorage", INT64_C(1) << 62, 6, 0, 2, shape, stride, &err),
                   GROVE_E_BAD_SIZE);
  /* A dtype Grove lacks. */
  ck_assert_status(one_tensor("ComplexDoubleStorage", 6, 6, 0, 2, shape, stride, &err),
                   GROVE_E_BAD_DTYPE);
  /* Nine dimensions. */
  int64_t s9[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
  ck_assert_status(one_tensor("FloatStorage", 6, 6, 0, 9, s9, s9, &err), GROVE_E_LIMIT);
  /* Size and stride of different lengths; a negative dimension. */
  ck_assert_status(one_tensor_nd("FloatStorage", 6, 6, 0, 2, shape, 1, stride, &err),
                   GROVE_E_FORMAT);
  int64_t neg[2] = {-2, 3};
  ck_assert_status(one_tensor("FloatStorage", 6, 6, 0, 2, neg, stride, &err), GROVE_E_FORMAT);

  /* A missing storage record; one storage described as two dtypes; a
   * duplicate key; a tensor under an int key; a list at the top. */
  bytes b = {0};
  int64_t n6 = 6;
  grove_state_dict *sd = NULL;
  b_begin_sd(&b);
  b_str(&b, "w");
  b_tensor(&b, "FloatStorage", "7", 6, 0, 2, shape, stride);
  b_end_sd(&b);
  ck_assert_status(read_crafted(&b, &n6, 1, &sd, &err), GROVE_E_FORMAT);
  assert_mentions(&err, "archive/data/7");
  b_free(&b);

  memset(&b, 0, sizeof b);
  b_begin_sd(&b);
  b_str(&b, "a");
  b_tensor(&b, "FloatStorage", "0", 6, 0, 2, shape, stride);
  b_str(&b, "b");
  b_tensor(&b, "IntStorage", "0", 6, 0, 2, shape, stride);
  b_end_sd(&b);
  ck_assert_status(read_crafted(&b, &n6, 1, &sd, &err), GROVE_E_FORMAT);
  assert_mentions(&err, "'b'");
  b_free(&b);

  memset(&b, 0, sizeof b);
  b_begin_sd(&b);
  b_str(&b, "a");
  b_tensor(&b, "FloatStorage", "0", 6, 0, 2, shape, stride);
  b_str(&b, "a");
  b_tensor(&b, "FloatStorage", "0", 6, 0, 2, shape, stride);
  b_end_sd(&b);
  ck_assert_status(read_crafted(&b, &n6, 1, &sd, &err), GROVE_E_DUPLICATE_KEY);
  b_free(&b);

  memset(&b, 0, sizeof b);
  b_begin_sd(&b);
  b_int(&b, 5);
  b_tensor(&b, "FloatStorage", "0", 6, 0, 2, shape, stride);
  b_end_sd(&b);
  ck_assert_status(read_crafted(&b, &n6, 1, &sd, &err), GROVE_E_FORMAT);
  b_free(&b);

  memset(&b, 0, sizeof b);
  b_op(&b, 0x80);
  b_op(&b, 2);
  b_op(&b, ']');
  b_op(&b, '.');
  ck_assert_status(read_crafted(&b, &n6, 1, &sd, &err), GROVE_E_FORMAT);
  assert_mentions(&err, "a list");
  b_free(&b);

  /* A tensor subclass through _rebuild_from_type_v2. */
  memset(&b, 0, sizeof b);
  b_begin_sd(&b);
  b_str(&b, "sub");
  b_global(&b, "torch._tensor", "_rebuild_from_type_v2");
  b_op(&b, '(');
  b_global(&b, "torch._utils", "_rebuild_tensor_v2");
  b_global(&b, "torch", "Size");
  b_op(&b, ')');
  b_op(&b, '}');
  b_op(&b, 't');
  b_op(&b, 'R');
  b_end_sd(&b);
  ck_assert_status(read_crafted(&b, &n6, 1, &sd, &err), GROVE_E_UNSUPPORTED);
  assert_mentions(&err, "'sub'");
  b_free(&b);

  /* A storage reference that is not ('storage', ...). */
  memset(&b, 0, sizeof b);
  b_begin_sd(&b);
  b_str(&b, "w");
  b_global(&b, "torch._utils", "_rebuild_tensor_v2");
  b_op(&b, '(');
  b_op(&b, '(');
  b_str(&b, "module");
  b_op(&b, 0x85);
  b_op(&b, 'Q');
  b_int(&b, 0);
  b_tuple(&b, 2, shape);
  b_tuple(&b, 2, stride);
  b_op(&b, 0x89);
  b_op(&b, 'N');
  b_op(&b, 't');
  b_op(&b, 'R');
  b_end_sd(&b);
  ck_assert_status(read_crafted(&b, &n6, 1, &sd, &err), GROVE_E_FORMAT);
  b_free(&b);
}
END_TEST

START_TEST(test_pickle_refusals) {
  grove_err err = {0};
  /* GLOBAL and STACK_GLOBAL of os.system. */
  static const uint8_t os_system[] =
      "\x80\x02"
      "cos\nsystem\n"
      "X\x04\x00\x00\x00true"
      "\x85R.";
  ck_assert_status(unpickle(os_system, sizeof os_system - 1, &err), GROVE_E_REFUSED);
  assert_mentions(&err, "'os.system'");
  static const uint8_t stack_global[] =
      "\x80\x04\x8c\x02os\x8c\x06system\x93"
      "\x8c\x04true\x85R.";
  ck_assert_status(unpickle(stack_global, sizeof stack_global - 1, &err), GROVE_E_REFUSED);
  assert_mentions(&err, "'os.system'");
  static const uint8_t builtins_eval[] =
      "\x80\x02"
      "c__builtin__\neval\n"
      "X\x01\x00\x00\x00"
      "1\x85R.";
  ck_assert_status(unpickle(builtins_eval, sizeof builtins_eval - 1, &err), GROVE_E_REFUSED);

  /* Opcodes outside the allow-list, each by name. */
  static const struct {
    const char *bytes;
    size_t n;
    const char *name;
  } ops[] = {
      {LIT("\x80\x02(ios\nsystem\n."), "INST"},
      {LIT("\x80\x02(o."), "OBJ"},
      {LIT("\x80\x02\x82\x01."), "EXT1"},
      {LIT("\x80\x02Pfoo\n."), "PERSID"},
      {LIT("\x80\x02N0."), "POP"},
      {LIT("\x80\x02N2."), "DUP"},
      {LIT("\x80\x02I42\n."), "INT"},
      {LIT("\x80\x02g1\n."), "GET"},
      {LIT("\x80\x02Np0\n."), "PUT"},
      {LIT("\x80\x05\x97."), "NEXT_BUFFER"},
  };
  for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++) {
    ck_assert_status(unpickle(ops[i].bytes, ops[i].n, &err), GROVE_E_REFUSED);
    assert_mentions(&err, ops[i].name);
  }
  /* NEWOBJ of anything but Parameter; BUILD on a list; calling a storage. */
  static const uint8_t newobj[] =
      "\x80\x02"
      "ccollections\nOrderedDict\n"
      ")\x81.";
  ck_assert_status(unpickle(newobj, sizeof newobj - 1, &err), GROVE_E_REFUSED);
  static const uint8_t build[] = "\x80\x02]}b.";
  ck_assert_status(unpickle(build, sizeof build - 1, &err), GROVE_E_REFUSED);
  /* BUILD on a plain dict (torch builds OrderedDicts only) and on a call
   * that makes no tensor. */
  static const uint8_t build_dict[] = "\x80\x02}}b.";
  ck_assert_status(unpickle(build_dict, sizeof build_dict - 1, &err), GROVE_E_REFUSED);
  static const uint8_t build_od[] =
      "\x80\x02"
      "ccollections\nOrderedDict\n"
      ")R}b.";
  ck_assert_ok(unpickle(build_od, sizeof build_od - 1, &err), &err);
  static const uint8_t build_dev[] =
      "\x80\x02"
      "ctorch\ndevice\n"
      "X\x03\x00\x00\x00"
      "cpu\x85R}b.";
  ck_assert_status(unpickle(build_dev, sizeof build_dev - 1, &err), GROVE_E_REFUSED);
  static const uint8_t call_storage[] =
      "\x80\x02"
      "ctorch\nFloatStorage\n"
      "K\x05\x85R.";
  ck_assert_status(unpickle(call_storage, sizeof call_storage - 1, &err), GROVE_E_REFUSED);

  /* Malformed: stack underflow, TUPLE without MARK, SETITEM on a list, a
   * memo index never set, APPEND to a dict, odd SETITEMS, not an opcode. */
  static const struct {
    const char *bytes;
    size_t n;
  } bad[] = {
      {LIT("\x80\x02R.")},       {LIT("\x80\x02t.")},   {LIT("\x80\x02]K\x01K\x02s.")},
      {LIT("\x80\x02h\x07.")},   {LIT("\x80\x02}Na.")}, {LIT("\x80\x02}(Nu.")},
      {LIT("\x80\x02\xff.")},    {LIT("\x80\x02.")},    {LIT("\x80\x02(N\x86.")},
      {LIT("\x80\x02K\x01)R.")},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    ck_assert_msg(unpickle(bad[i].bytes, bad[i].n, &err) == GROVE_E_FORMAT, "case %zu: %s", i,
                  err.msg);

  /* Protocol 6; invalid UTF-8 in a string. */
  ck_assert_status(unpickle("\x80\x06N.", 4, &err), GROVE_E_UNSUPPORTED);
  ck_assert_status(unpickle("\x80\x02X\x02\x00\x00\x00\xc3\x28.", 10, &err), GROVE_E_BAD_UTF8);

  /* Limits: nested MARKs, a huge memo index, a huge string, a huge LONG4. */
  size_t n = GROVE_PKL_MAX_MARKS + 10;
  uint8_t *marks = malloc(n + 3);
  marks[0] = 0x80;
  marks[1] = 2;
  memset(marks + 2, '(', n);
  marks[n + 2] = '.';
  ck_assert_status(unpickle(marks, n + 3, &err), GROVE_E_LIMIT);
  free(marks);
  ck_assert_status(unpickle("\x80\x02Nr\xff\xff\xff\xff.", 9, &err), GROVE_E_LIMIT);
  ck_assert_status(unpickle("\x80\x04\x8d\x00\x00\x00\x00\x01\x00\x00\x00.", 12, &err),
                   GROVE_E_LIMIT);
  ck_assert_status(unpickle("\x80\x02\x8b\x00\x00\x00\x70.", 8, &err), GROVE_E_LIMIT);
}
END_TEST

static grove_status unpickle_lim(const char *p, size_t n, const grove__pkl_limits *lim,
                                 grove_err *err) {
  grove__pickle *pk = NULL;
  const grove__pk *root = NULL;
  grove_status st = grove__pickle_load_limited(p, n, "test.pkl", lim, &pk, &root, err);
  grove__pickle_free(pk);
  return st;
}

START_TEST(test_pickle_limits) {
  /* Each limit, lowered so that a small pickle reaches it; the same pickle
   * passes with the limit one higher. */
  grove_err err = {0};
  grove__pkl_limits lim = grove__pkl_default_limits;
  static const char stack[] = "\x80\x02(NNNNt."; /* at most 4 values on the stack */
  lim.max_stack = 3;
  ck_assert_status(unpickle_lim(LIT(stack), &lim, &err), GROVE_E_LIMIT);
  lim.max_stack = 4;
  ck_assert_ok(unpickle_lim(LIT(stack), &lim, &err), &err);
  lim = grove__pkl_default_limits;
  lim.max_container = 3;
  ck_assert_status(unpickle_lim(LIT(stack), &lim, &err), GROVE_E_LIMIT);
  assert_mentions(&err, "container");
  lim.max_container = 4;
  ck_assert_ok(unpickle_lim(LIT(stack), &lim, &err), &err);
  lim = grove__pkl_default_limits;
  lim.max_values = 4; /* four Nones and the tuple */
  ck_assert_status(unpickle_lim(LIT(stack), &lim, &err), GROVE_E_LIMIT);
  lim.max_values = 5;
  ck_assert_ok(unpickle_lim(LIT(stack), &lim, &err), &err);
  lim = grove__pkl_default_limits;
  static const char marks[] = "\x80\x02(((Nttt.";
  lim.max_marks = 2;
  ck_assert_status(unpickle_lim(LIT(marks), &lim, &err), GROVE_E_LIMIT);
  lim.max_marks = 3;
  ck_assert_ok(unpickle_lim(LIT(marks), &lim, &err), &err);
  lim = grove__pkl_default_limits;
  static const char str[] = "\x80\x02X\x05\x00\x00\x00hello.";
  lim.max_str = 4;
  ck_assert_status(unpickle_lim(LIT(str), &lim, &err), GROVE_E_LIMIT);
  lim.max_str = 5;
  ck_assert_ok(unpickle_lim(LIT(str), &lim, &err), &err);
  lim = grove__pkl_default_limits;
  static const char memo[] = "\x80\x02Nq\x09.";
  lim.max_memo = 9;
  ck_assert_status(unpickle_lim(LIT(memo), &lim, &err), GROVE_E_LIMIT);
  lim.max_memo = 10;
  ck_assert_ok(unpickle_lim(LIT(memo), &lim, &err), &err);
  lim = grove__pkl_default_limits;
  lim.max_bytes = sizeof str - 2;
  ck_assert_status(unpickle_lim(LIT(str), &lim, &err), GROVE_E_LIMIT);
}
END_TEST

START_TEST(test_pickle_truncations) {
  /* Every strict prefix of a valid pickle is GROVE_E_TRUNCATED. */
  bytes b = {0};
  int64_t shape[2] = {2, 3}, stride[2] = {3, 1};
  b_begin_sd(&b);
  b_str(&b, "w");
  b_tensor(&b, "FloatStorage", "0", 6, 0, 2, shape, stride);
  b_str(&b, "big");
  b_int(&b, INT64_C(1) << 50);
  b_end_sd(&b);
  grove_err err = {0};
  ck_assert_ok(unpickle(b.p, b.n, &err), &err);
  for (size_t cut = 0; cut < b.n; cut++)
    ck_assert_msg(unpickle(b.p, cut, &err) == GROVE_E_TRUNCATED, "cut at %zu: %s", cut, err.msg);
  b_free(&b);
}
END_TEST

START_TEST(test_pickle_values) {
  /* Integers of every width, LONG1 sign handling, memo sharing. */
  static const uint8_t p[] =
      "\x80\x02(J\xff\xff\xff\xff"
      "M\xff\xff"
      "\x8a\x01\x80"
      "\x8a\x02\x00\x80"
      "\x8a\x00"
      "\x8a\x09\xff\xff\xff\xff\xff\xff\xff\xff\x00"
      "\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x80\xff"
      "]q\x00h\x00t.";
  grove__pickle *pk = NULL;
  const grove__pk *root = NULL;
  grove_err err = {0};
  ck_assert_ok(grove__pickle_load(p, sizeof p - 1, "t", &pk, &root, &err), &err);
  ck_assert_int_eq(root->kind, GROVE__PK_TUPLE);
  ck_assert_uint_eq(root->u.seq.n, 9);
  grove__pk *const *it = root->u.seq.items;
  ck_assert(it[0]->kind == GROVE__PK_INT && it[0]->u.i == -1);
  ck_assert(it[1]->kind == GROVE__PK_INT && it[1]->u.i == 65535);
  ck_assert(it[2]->kind == GROVE__PK_INT && it[2]->u.i == -128);
  ck_assert(it[3]->kind == GROVE__PK_INT && it[3]->u.i == -32768);
  ck_assert(it[4]->kind == GROVE__PK_INT && it[4]->u.i == 0);
  ck_assert_int_eq(it[5]->kind, GROVE__PK_BIGINT); /* 2**64 - 1 */
  ck_assert(it[6]->kind == GROVE__PK_INT && it[6]->u.i == INT64_MIN);
  ck_assert(it[7] == it[8] && it[7]->kind == GROVE__PK_LIST);
  grove__pickle_free(pk);
}
END_TEST

/* An OrderedDict with no items whose _metadata lists n modules "m0".. at
 * version 2, plus the entries torch tolerates and Grove skips. */
static void b_metadata_sd(bytes *b, int n) {
  b_begin_sd(b);
  b_op(b, 'u');
  b_op(b, '}');
  b_str(b, "_metadata");
  b_global(b, "collections", "OrderedDict");
  b_op(b, ')');
  b_op(b, 'R');
  b_op(b, '(');
  for (int i = 0; i < n; i++) {
    char prefix[32];
    snprintf(prefix, sizeof prefix, "m%d", i);
    b_str(b, prefix);
    b_op(b, '}');
    b_str(b, "version");
    b_int(b, 2);
    b_op(b, 's');
  }
  b_str(b, "no_version"); /* skipped: no "version" */
  b_op(b, '}');
  b_str(b, "huge"); /* skipped: a version that is no int */
  b_op(b, '}');
  b_str(b, "version");
  b_int(b, INT64_C(1) << 40);
  b_op(b, 's');
  b_int(b, 7); /* skipped: not a prefix */
  b_op(b, '}');
  b_op(b, 'u');
  b_op(b, 's');
  b_op(b, 'b');
  b_op(b, '.');
}

START_TEST(test_metadata) {
  grove_err err = {0};
  grove_state_dict *sd = NULL;
  int64_t none = 0;
  bytes b = {0};
  b_metadata_sd(&b, 3);
  ck_assert_ok(read_crafted(&b, &none, 0, &sd, &err), &err);
  ck_assert_uint_eq(grove_sd_count(sd), 0);
  ck_assert_uint_eq(grove_sd_meta_count(sd), 3);
  int v = 0;
  ck_assert(grove_sd_get_version(sd, "m2", &v) && v == 2);
  ck_assert(!grove_sd_get_version(sd, "huge", &v));
  grove_sd_free(sd);
  b_free(&b);
  memset(&b, 0, sizeof b);
  b_metadata_sd(&b, (int)GROVE_TORCH_MAX_META + 1);
  ck_assert_status(read_crafted(&b, &none, 0, &sd, &err), GROVE_E_LIMIT);
  assert_mentions(&err, "_metadata");
  b_free(&b);
}
END_TEST

/* ================================================================ crafted archives */

static grove_status read_bytes(const uint8_t *buf, size_t len, grove_err *err) {
  grove_state_dict *sd = (grove_state_dict *)1;
  grove_status st = grove__torch_read_buffer(buf, len, "crafted.pt", NULL, &sd, err);
  if (st != GROVE_OK) ck_assert_ptr_null(sd);
  grove_sd_free(sd);
  return st;
}

/* A valid small archive in memory: { "w": f32[2, 3] }. */
static uint8_t *small_archive(size_t *len, const grove__zipw_opts *opts) {
  grove_state_dict *sd = grove_sd_new();
  int64_t shape[2] = {2, 3};
  sd_put(sd, "w", patterned(GROVE_F32, 2, shape, 1));
  grove_err err = {0};
  uint8_t *out = NULL;
  grove__torch_write_opts o = {0};
  if (opts) o.zip = *opts;
  ck_assert_ok(grove__torch_write_buffer(sd, "archive", &o, &out, len, &err), &err);
  grove_sd_free(sd);
  return out;
}

static size_t find_sig(const uint8_t *buf, size_t len, uint32_t sig, size_t from) {
  for (size_t i = from; i + 4 <= len; i++)
    if ((uint32_t)(buf[i] | buf[i + 1] << 8 | buf[i + 2] << 16 | (uint32_t)buf[i + 3] << 24) == sig)
      return i;
  return SIZE_MAX;
}

START_TEST(test_archive_refusals) {
  grove_err err = {0};
  size_t len;
  uint8_t *a = small_archive(&len, NULL);
  ck_assert_ok(read_bytes(a, len, &err), &err);

  /* Not an archive; a legacy file's magic number alone; a bare pickle; a
   * tar. */
  ck_assert_status(read_bytes((const uint8_t *)"hello world", 11, &err), GROVE_E_FORMAT);
  static const uint8_t legacy[] = {0x80, 0x02, 0x8a, 0x0a, 0x6c, 0xfc, 0x9c, 0x46,
                                   0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19, 0x2e};
  ck_assert_status(read_bytes(legacy, sizeof legacy, &err), GROVE_E_TRUNCATED);
  assert_mentions(&err, "legacy");
  ck_assert_status(read_bytes((const uint8_t *)"\x80\x02}.", 4, &err), GROVE_E_UNSUPPORTED);
  uint8_t tar[600] = {0};
  memcpy(tar + 257, "ustar", 5);
  ck_assert_status(read_bytes(tar, sizeof tar, &err), GROVE_E_UNSUPPORTED);

  /* Every truncation of a valid archive is refused (never a crash). */
  for (size_t cut = 0; cut < len; cut++) {
    grove_status st = read_bytes(a, cut, &err);
    ck_assert_msg(st == GROVE_E_FORMAT || st == GROVE_E_TRUNCATED, "cut %zu: %s", cut,
                  grove_status_name(st));
  }

  /* A damaged data byte: CRC mismatch. */
  uint8_t *c = malloc(len);
  memcpy(c, a, len);
  grove__zip z;
  ck_assert_ok(grove__zip_open(&z, a, len, "a", &err), &err);
  const grove__zip_entry *d0 = grove__zip_find(&z, "archive/data/0");
  c[d0->data_offset + 3] ^= 0x40;
  ck_assert_status(read_bytes(c, len, &err), GROVE_E_FORMAT);
  assert_mentions(&err, "CRC");
  memcpy(c, a, len);

  /* Central directory fields: encryption, method 12, a size past the end,
   * an impossible deflate ratio. */
  size_t cd = find_sig(a, len, 0x02014b50u, 0), cd1 = find_sig(a, len, 0x02014b50u, cd + 4);
  c[cd + 8] |= 1;
  ck_assert_status(read_bytes(c, len, &err), GROVE_E_UNSUPPORTED);
  memcpy(c, a, len);
  c[cd + 10] = 12;
  ck_assert_status(read_bytes(c, len, &err), GROVE_E_UNSUPPORTED);
  memcpy(c, a, len);
  /* Stored sizes both large: reaches past the end. */
  for (int k = 0; k < 2; k++) c[cd1 + 20 + 4 * k + 2] = 0x7f;
  ck_assert_status(read_bytes(c, len, &err), GROVE_E_TRUNCATED);
  memcpy(c, a, len);
  c[cd + 10] = 8; /* deflated, 100-odd bytes claiming... */
  c[cd + 24 + 3] = 0x10;
  ck_assert_status(read_bytes(c, len, &err), GROVE_E_FORMAT);
  memcpy(c, a, len);
  /* Stored with differing sizes. */
  c[cd1 + 24] ^= 1;
  ck_assert_status(read_bytes(c, len, &err), GROVE_E_FORMAT);
  memcpy(c, a, len);
  /* The padding of the local extra field is not checked; its name is. */
  c[d0->data_offset - 1] = 'x';
  ck_assert_ok(read_bytes(c, len, &err), &err);
  memcpy(c, a, len);
  size_t lh = find_sig(a, len, 0x04034b50u, 0);
  c[lh + 30] ^= 0x20; /* first letter of the local name */
  ck_assert_status(read_bytes(c, len, &err), GROVE_E_FORMAT);
  memcpy(c, a, len);
  /* A multi-disk archive. */
  size_t eocd = find_sig(a, len, 0x06054b50u, 0);
  c[eocd + 4] = 1;
  ck_assert_status(read_bytes(c, len, &err), GROVE_E_UNSUPPORTED);
  memcpy(c, a, len);
  /* More entries than the directory can hold. */
  c[eocd + 10] = 0xF0;
  c[eocd + 8] = 0xF0;
  ck_assert_status(read_bytes(c, len, &err), GROVE_E_FORMAT);
  grove__zip_close(&z);
  free(c);
  free(a);

  /* Deflated and ZIP64 variants read. */
  grove__zipw_opts o = {.deflate = true, .force_zip64 = true};
  a = small_archive(&len, &o);
  ck_assert_ok(read_bytes(a, len, &err), &err);
  free(a);
}
END_TEST

/* The first offset at or after from where needle (n bytes) is, or SIZE_MAX. */
static size_t find_bytes(const uint8_t *buf, size_t len, const void *needle, size_t n,
                         size_t from) {
  for (size_t i = from; i + n <= len; i++)
    if (memcmp(buf + i, needle, n) == 0) return i;
  return SIZE_MAX;
}

/* A legacy torch.save file (torch_legacy.pt, written by torch with
 * _use_new_zipfile_serialization=False) damaged every way its layout can
 * be: each is refused with its status, none crashes or reads past the end. */
START_TEST(test_legacy_refusals) {
  grove_err err = {0};
  grove_storage *map = NULL;
  ck_assert_ok(grove__read_file(grove_fixture("torch_legacy.pt"), &map, &err), &err);
  const size_t len = grove_storage_nbytes(map);
  uint8_t *a = malloc(len);
  memcpy(a, grove_storage_data(map), len);
  grove_storage_release(map);
  ck_assert_ok(read_bytes(a, len, &err), &err);

  /* Every cut: inside a pickle, between them, inside a storage's count or
   * its bytes. */
  for (size_t cut = 0; cut < len; cut++) {
    grove_status st = read_bytes(a, cut, &err);
    /* Two bytes or fewer do not say what the file is. */
    ck_assert_msg(st == GROVE_E_TRUNCATED || (cut <= 2 && st != GROVE_OK), "cut %zu: %s: %s", cut,
                  grove_status_name(st), grove_err_msg(&err));
  }

  uint8_t *c = malloc(len);
  /* The protocol version: BININT2 1001 -> 1002. */
  memcpy(c, a, len);
  static const uint8_t v1001[] = {0x4d, 0xe9, 0x03, 0x2e};
  size_t at = find_bytes(c, len, v1001, sizeof v1001, 15);
  ck_assert_uint_eq(at, 17);
  c[at + 1] = 0xea;
  ck_assert_status(read_bytes(c, len, &err), GROVE_E_UNSUPPORTED);
  assert_mentions(&err, "protocol version");

  /* Find the storage key list: the last pickle, a LIST of BINUNICODE keys;
   * the storages' bytes follow its STOP.  Key 0's name is all zeros. */
  size_t stop = SIZE_MAX;
  for (size_t i = len; i-- > 0 && stop == SIZE_MAX;) {
    if (a[i] != '.') continue;
    /* The key list ends with APPENDS (or APPEND), then STOP. */
    if (i >= 1 && (a[i - 1] == 'e' || a[i - 1] == 'a')) stop = i;
  }
  ck_assert_uint_ne(stop, SIZE_MAX);
  /* The keys' bytes follow: the first is an 8-byte count. */
  const size_t first = stop + 1;
  uint64_t n0 = 0;
  for (int i = 7; i >= 0; i--) n0 = n0 << 8 | a[first + (size_t)i];
  ck_assert_uint_gt(n0, 0);

  /* A count other than the persistent id's; a count whose bytes overflow. */
  memcpy(c, a, len);
  c[first] ^= 1;
  ck_assert_status(read_bytes(c, len, &err), GROVE_E_BAD_SIZE);
  assert_mentions(&err, "elements");
  memcpy(c, a, len);
  memset(c + first, 0xff, 8);
  ck_assert_status(read_bytes(c, len, &err), GROVE_E_BAD_SIZE);

  /* A key of the list that no tensor names. */
  memcpy(c, a, len);
  size_t k = stop;
  while (k > 0 && c[k] != 'X') k--; /* the last key's BINUNICODE */
  ck_assert_uint_gt(k, 0);
  c[k + 5] = c[k + 5] == '9' ? '8' : '9';
  ck_assert_status(read_bytes(c, len, &err), GROVE_E_FORMAT);
  assert_mentions(&err, "no tensor");

  /* Trailing bytes after the last storage are what torch ignores too. */
  uint8_t *t = malloc(len + 3);
  memcpy(t, a, len);
  memcpy(t + len, "xyz", 3);
  ck_assert_ok(read_bytes(t, len + 3, &err), &err);
  free(t);
  free(c);
  free(a);
}
END_TEST

START_TEST(test_layout_refusals) {
  grove_err err = {0};
  bytes b = {0};
  b_begin_sd(&b);
  b_end_sd(&b);
  size_t len;
  uint8_t *zip;

  /* Records outside a folder, in two folders, duplicated; no data.pkl; a
   * TorchScript archive; bad byteorder and version records. */
  struct {
    rec r[3];
    size_t n;
    grove_status want;
    const char *mention;
  } cases[] = {
      {{{"data.pkl", b.p, b.n}}, 1, GROVE_E_FORMAT, "folder"},
      {{{"a/data.pkl", b.p, b.n}, {"b/version", "3", 1}}, 2, GROVE_E_FORMAT, "outside"},
      {{{"a/data.pkl", b.p, b.n}, {"a/data.pkl", b.p, b.n}},
       2,
       GROVE_E_DUPLICATE_KEY,
       "two records"},
      {{{"a/version", "3", 1}}, 1, GROVE_E_FORMAT, "data.pkl"},
      {{{"a/data.pkl", b.p, b.n}, {"a/constants.pkl", b.p, b.n}},
       2,
       GROVE_E_UNSUPPORTED,
       "TorchScript"},
      {{{"a/data.pkl", b.p, b.n}, {"a/byteorder", "middle", 6}}, 2, GROVE_E_FORMAT, "byteorder"},
      {{{"a/data.pkl", b.p, b.n}, {"a/version", "x3", 2}}, 2, GROVE_E_FORMAT, "version"},
      {{{"a/data.pkl", b.p, b.n}, {"a/byteorder", "big", 3}, {"a/.data/version", "3\n", 2}},
       3,
       GROVE_OK,
       NULL},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    zip = make_zip(cases[i].r, cases[i].n, NULL, &len);
    grove_status st = read_bytes(zip, len, &err);
    ck_assert_msg(st == cases[i].want, "case %zu: %s: %s", i, grove_status_name(st), err.msg);
    if (cases[i].mention) assert_mentions(&err, cases[i].mention);
    free(zip);
  }
  /* An empty archive. */
  zip = make_zip(NULL, 0, NULL, &len);
  ck_assert_status(read_bytes(zip, len, &err), GROVE_E_FORMAT);
  free(zip);
  b_free(&b);

  /* An empty file on disk. */
  grove_state_dict *sd = NULL;
  ck_assert_int_eq(grove_test_write_file(tmp_path("empty.pt"), "", 0), 0);
  ck_assert_status(grove_torch_read(tmp_path("empty.pt"), &sd, &err), GROVE_E_TRUNCATED);
  ck_assert_status(grove_torch_read(tmp_path("absent.pt"), &sd, &err), GROVE_E_IO);
  ck_assert_status(grove_torch_read(tmpdir, &sd, &err), GROVE_E_IO);
}
END_TEST

START_TEST(test_big_endian_crafted) {
  /* An i32 and an f16 storage written byte-swapped with byteorder "big". */
  bytes b = {0};
  int64_t s2[1] = {2}, st1[1] = {1};
  b_begin_sd(&b);
  b_str(&b, "i");
  b_tensor(&b, "IntStorage", "0", 2, 0, 1, s2, st1);
  b_str(&b, "h");
  b_tensor(&b, "HalfStorage", "1", 2, 0, 1, s2, st1);
  b_str(&b, "f");
  b_tensor(&b, "FloatStorage", "2", 2, 0, 1, s2, st1);
  b_end_sd(&b);
  static const uint8_t i32be[8] = {0x01, 0x02, 0x03, 0x04, 0xff, 0xff, 0xff, 0xfe};
  static const uint8_t f16be[4] = {0x3c, 0x00, 0xc0, 0x00};
  static const uint8_t f32be[8] = {0x3f, 0x80, 0, 0, 0x40, 0x49, 0x0f, 0xdb};
  rec recs[] = {{"a/data.pkl", b.p, b.n}, {"a/byteorder", "big", 3}, {"a/data/0", i32be, 8},
                {"a/data/1", f16be, 4},   {"a/data/2", f32be, 8},    {"a/version", "3\n", 2}};
  size_t len;
  uint8_t *zip = make_zip(recs, 6, NULL, &len);
  /* Through a file, so that the zero-copy path is offered and refused. */
  ck_assert_int_eq(grove_test_write_file(tmp_path("be.pt"), zip, len), 0);
  grove_state_dict *sd = NULL;
  grove_err err = {0};
  ck_assert_ok(grove_torch_read(tmp_path("be.pt"), &sd, &err), &err);
  const int32_t *i = grove_sd_get(sd, "i")->data;
  const uint16_t *h = grove_sd_get(sd, "h")->data;
  const float *f = grove_sd_get(sd, "f")->data;
  ck_assert_int_eq(i[0], 0x01020304);
  ck_assert_int_eq(i[1], -2);
  ck_assert_uint_eq(h[0], 0x3c00);
  ck_assert_uint_eq(h[1], 0xc000);
  ck_assert(f[0] == 1.0f && f[1] > 3.14159f && f[1] < 3.1416f);
  grove_sd_free(sd);
  free(zip);
  b_free(&b);
}
END_TEST

/* ================================================================ fuzz regressions */

/* Inputs the fuzzers (fuzz/) once crashed or hung on, kept as bytes. */
START_TEST(test_fuzz_regressions) {
  grove_err err = {0};
  /* Empty input and one-byte inputs. */
  ck_assert_status(unpickle("", 0, &err), GROVE_E_TRUNCATED);
  ck_assert_status(read_bytes((const uint8_t *)"P", 1, &err), GROVE_E_FORMAT);
  ck_assert_status(read_bytes((const uint8_t *)"PK\x05\x06", 4, &err), GROVE_E_FORMAT);
  /* fuzz_pickle: MARK then APPENDS before anything was ever pushed (UBSan:
   * an offset applied to the still-NULL stack). */
  ck_assert_status(unpickle("(e", 2, &err), GROVE_E_FORMAT);
  ck_assert_ok(unpickle("(t.", 3, &err), &err);

  /* fuzz_zip (after views were kept as views): a transposed float16 view
   * over a storage holding a NaN with a payload (0xfe3a) changed in the
   * round trip: the writer's contiguous copy went through float.  Copies of
   * one dtype are bit for bit now. */
  bytes b = {0};
  b_begin_sd(&b);
  b_str(&b, "half_t");
  b_tensor(&b, "HalfStorage", "0", 6, 0, 2, (int64_t[]){2, 3}, (int64_t[]){1, 2});
  b_end_sd(&b);
  static const uint8_t halves[12] = {0x3c, 0x09, 0xb6, 0x5c, 0x38, 0x62,
                                     0x3a, 0x0b, 0x3a, 0xfe, 0x39, 0x50};
  rec recs[3] = {{"archive/data.pkl", b.p, b.n},
                 {"archive/data/0", halves, sizeof halves},
                 {"archive/version", "3\n", 2}};
  size_t len, len2;
  uint8_t *zip = make_zip(recs, 3, NULL, &len), *out = NULL;
  grove_state_dict *sd = NULL, *back = NULL;
  ck_assert_ok(grove__torch_read_buffer(zip, len, "crafted.pt", NULL, &sd, &err), &err);
  ck_assert_ok(grove__torch_write_buffer(sd, "archive", NULL, &out, &len2, &err), &err);
  ck_assert_ok(grove__torch_read_buffer(out, len2, "back.pt", NULL, &back, &err), &err);
  uint16_t want[6], got[6];
  grove__tensor_gather(grove_sd_get(sd, "half_t"), want);
  grove__tensor_gather(grove_sd_get(back, "half_t"), got);
  ck_assert_uint_eq(want[2], 0xfe3a); /* element [0, 2]: the NaN */
  ck_assert_mem_eq(got, want, sizeof want);
  grove_sd_free(back);
  grove_sd_free(sd);
  free(out);
  free(zip);
  b_free(&b);
}
END_TEST

Suite *torch_suite(void) {
  Suite *s = suite_create("torch");
  TCase *tc = tcase_create("core");
  tcase_add_checked_fixture(tc, setup_tmp, teardown_tmp);
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_torch_fixtures_read);
  tcase_add_test(tc, test_torch_fixture_details);
  tcase_add_test(tc, test_torch_fixtures_refused);
  tcase_add_test(tc, test_round_trip);
  tcase_add_test(tc, test_round_trip_zip64_deflate);
  tcase_add_test(tc, test_round_trip_many);
  tcase_add_test(tc, test_resave_torch_fixtures);
  tcase_add_test(tc, test_written_layout);
  tcase_add_test(tc, test_zero_copy);
  tcase_add_test(tc, test_surrogate_key);
  tcase_add_test(tc, test_write_refusals);
  tcase_add_test(tc, test_crafted_variants_ok);
  tcase_add_test(tc, test_view_bounds_wrap);
  tcase_add_test(tc, test_expanded_views_stay_small);
  tcase_add_test(tc, test_tensor_refusals);
  tcase_add_test(tc, test_pickle_refusals);
  tcase_add_test(tc, test_pickle_limits);
  tcase_add_test(tc, test_pickle_truncations);
  tcase_add_test(tc, test_pickle_values);
  tcase_add_test(tc, test_metadata);
  tcase_add_test(tc, test_archive_refusals);
  tcase_add_test(tc, test_legacy_refusals);
  tcase_add_test(tc, test_layout_refusals);
  tcase_add_test(tc, test_big_endian_crafted);
  tcase_add_test(tc, test_fuzz_regressions);
  suite_add_tcase(s, tc);
  return s;
}

GROVE_TEST_MAIN(torch_suite)
