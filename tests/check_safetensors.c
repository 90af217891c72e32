/* check_safetensors.c: the safetensors reader and writer (core/io/safetensors.c)
 * and the checkpoint dispatcher (core/io/checkpoint.c).
 *
 * Round trips of every dtype, zero-copy observed through storage pointers, a
 * file written by the Python side (tests/fixtures_gen/safetensors.py), and
 * every malformed file the reader must refuse, built here byte by byte and
 * read both from memory and from disk with the exact status expected. */
#include <dirent.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "internal.h"
#include "testutil.h"

/* ------------------------------------------------------------ helpers */

/* A heap tensor of dtype dt and shape, filled with bytes i * 37 + 11 + seed
 * so that every byte is distinctive; the tests compare bits. */
static grove_tensor *patterned(grove_dtype dt, int ndim, const int64_t *shape, unsigned seed) {
  grove_err err = {0};
  grove_tensor *t = grove_tensor_new(dt, ndim, shape, &err);
  ck_assert_msg(t != NULL, "grove_tensor_new: %s", grove_err_msg(&err));
  uint8_t *p = t->data;
  size_t n = grove_tensor_nbytes(t);
  for (size_t i = 0; i < n; i++) p[i] = (uint8_t)(i * 37u + 11u + seed);
  if (dt == GROVE_BOOL)
    for (size_t i = 0; i < n; i++) p[i] &= 1;
  /* Floats stay finite (exponent not all ones), so that a conversion on the
   * way (a strided copy) cannot quieten a NaN and change bits. */
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

/* Path of name inside a fresh temporary directory (one per test). */
static char tmpdir[256];
static const char *tmp_path(const char *name) {
  static char buf[512];
  snprintf(buf, sizeof buf, "%s/%s", tmpdir, name);
  return buf;
}

static void setup_tmp(void) {
  const char *d = grove_test_tmpdir();
  ck_assert_ptr_nonnull(d);
  snprintf(tmpdir, sizeof tmpdir, "%s", d);
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

static void teardown_tmp(void) {
  rm_tree(tmpdir);
}

/* Whether path is mapped into this process (Linux: /proc/self/maps). */
static bool mapped(const char *path) {
  FILE *f = fopen("/proc/self/maps", "r");
  if (!f) return false;
  char line[4096];
  bool found = false;
  size_t n = strlen(path);
  while (!found && fgets(line, sizeof line, f)) {
    char *p = strstr(line, path);
    found = p && (p[n] == '\n' || p[n] == '\0');
  }
  fclose(f);
  return found;
}

/* Bytes of a tensor in contiguous order (the test's own strided walk, to
 * compare with what was written). */
static void contiguous_bytes(const grove_tensor *t, uint8_t *out) {
  size_t es = grove_dtype_size(t->dtype);
  int64_t n = grove_tensor_numel(t);
  int64_t idx[GROVE_MAX_DIMS] = {0};
  for (int64_t i = 0; i < n; i++) {
    int64_t off = 0;
    for (int d = 0; d < t->ndim; d++) off += idx[d] * t->strides[d];
    memcpy(out + (size_t)i * es, (const uint8_t *)t->data + (size_t)off * es, es);
    for (int d = t->ndim - 1; d >= 0; d--) {
      if (++idx[d] < t->shape[d]) break;
      idx[d] = 0;
    }
  }
}

static void assert_same_tensor(const char *key, const grove_tensor *got, const grove_tensor *want) {
  ck_assert_msg(got->dtype == want->dtype, "%s: dtype %s, expected %s", key,
                grove_dtype_name(got->dtype), grove_dtype_name(want->dtype));
  ck_assert_msg(grove_tensor_same_shape(got, want), "%s: shape differs", key);
  ck_assert_msg(grove_tensor_is_contiguous(got), "%s: read tensors are contiguous", key);
  size_t n = grove_tensor_nbytes(want);
  uint8_t *a = malloc(n + 1), *b = malloc(n + 1);
  contiguous_bytes(got, a);
  contiguous_bytes(want, b);
  ck_assert_msg(memcmp(a, b, n) == 0, "%s: bytes differ", key);
  free(a);
  free(b);
}

/* A safetensors file image: 8-byte length, header as given (no padding), then
 * dlen data bytes (a pattern).  *len receives the size; caller frees. */
static uint8_t *st_image(const char *header, size_t dlen, size_t *len) {
  size_t hl = strlen(header);
  *len = 8 + hl + dlen;
  uint8_t *buf = malloc(*len ? *len : 1);
  uint64_t n = hl;
  memcpy(buf, &n, 8);
  memcpy(buf + 8, header, hl);
  for (size_t i = 0; i < dlen; i++) buf[8 + hl + i] = (uint8_t)(i * 7u + 3u);
  return buf;
}

/* A non-NULL value the readers must overwrite with NULL on error. */
static grove_state_dict *const SENTINEL = (grove_state_dict *)&tmpdir;

/* Reads img from memory and from a file; both must fail with want, leave
 * *out NULL, and name the file and (when given) the key in the message. */
static void expect_refused(const char *what, const uint8_t *img, size_t len, grove_status want,
                           const char *needle) {
  grove_err err = {0};
  grove_state_dict *sd = SENTINEL;
  grove_status s = grove_safetensors_read_buffer(img, len, "mem.safetensors", &sd, &err);
  ck_assert_msg(s == want, "%s (buffer): got %s, expected %s: %s", what, grove_status_name(s),
                grove_status_name(want), grove_err_msg(&err));
  ck_assert_msg(sd == NULL, "%s (buffer): *out not NULL on error", what);
  ck_assert_msg(err.code == want, "%s: err.code %s", what, grove_status_name(err.code));
  ck_assert_msg(strstr(err.msg, "mem.safetensors") != NULL, "%s: message lacks the name: %s", what,
                err.msg);
  if (needle)
    ck_assert_msg(strstr(err.msg, needle) != NULL, "%s: message lacks '%s': %s", what, needle,
                  err.msg);

  const char *path = tmp_path("bad.safetensors");
  ck_assert_int_eq(grove_test_write_file(path, img, len), 0);
  grove_err_clear(&err);
  sd = SENTINEL;
  s = grove_safetensors_read(path, &sd, &err);
  ck_assert_msg(s == want, "%s (file): got %s, expected %s: %s", what, grove_status_name(s),
                grove_status_name(want), grove_err_msg(&err));
  ck_assert_msg(sd == NULL, "%s (file): *out not NULL on error", what);
  ck_assert_msg(!mapped(path), "%s: the file stays mapped after the error", what);
  ck_assert_msg(strstr(err.msg, path) != NULL, "%s: message lacks the path: %s", what, err.msg);
  if (needle)
    ck_assert_msg(strstr(err.msg, needle) != NULL, "%s: message lacks '%s': %s", what, needle,
                  err.msg);
  /* The dispatcher reaches the same reader (by content, or by extension
   * when the content is too short to tell). */
  grove_err_clear(&err);
  sd = SENTINEL;
  s = grove_checkpoint_read(path, &sd, &err);
  ck_assert_msg(s == want, "%s (checkpoint_read): got %s, expected %s: %s", what,
                grove_status_name(s), grove_status_name(want), grove_err_msg(&err));
  ck_assert_ptr_null(sd);
  /* And without err. */
  sd = SENTINEL;
  ck_assert_int_eq(grove_safetensors_read_buffer(img, len, NULL, &sd, NULL), want);
  ck_assert_ptr_null(sd);
}

static void expect_refused_header(const char *what, const char *header, size_t dlen,
                                  grove_status want, const char *needle) {
  size_t len;
  uint8_t *img = st_image(header, dlen, &len);
  expect_refused(what, img, len, want, needle);
  free(img);
}

/* ------------------------------------------------------------ round trip */

static grove_state_dict *every_dtype_sd(void) {
  grove_state_dict *sd = grove_sd_new();
  ck_assert_ptr_nonnull(sd);
  const int64_t s23[] = {2, 3}, s5[] = {5}, s04[] = {0, 4}, s3[] = {3}, s222[] = {2, 2, 2};
  sd_put(sd, "layer.weight", patterned(GROVE_F32, 2, s23, 0));
  sd_put(sd, "layer.bias", patterned(GROVE_F32, 1, s3, 1));
  sd_put(sd, "half", patterned(GROVE_F16, 1, s5, 2));
  sd_put(sd, "brain", patterned(GROVE_BF16, 2, s23, 3));
  sd_put(sd, "double", patterned(GROVE_F64, 1, s3, 4));
  sd_put(sd, "steps", patterned(GROVE_I64, 0, NULL, 5)); /* 0-d, like num_batches_tracked */
  sd_put(sd, "int", patterned(GROVE_I32, 1, s5, 6));
  sd_put(sd, "short", patterned(GROVE_I16, 1, s3, 7));
  sd_put(sd, "char", patterned(GROVE_I8, 1, s5, 8));
  sd_put(sd, "byte", patterned(GROVE_U8, 1, s3, 9));
  sd_put(sd, "mask", patterned(GROVE_BOOL, 2, s23, 10));
  sd_put(sd, "empty", patterned(GROVE_F32, 2, s04, 11));
  sd_put(sd, "scalar", patterned(GROVE_F32, 0, NULL, 12));
  sd_put(sd, "cube", patterned(GROVE_F32, 3, s222, 13));
  /* A transposed view of "layer.weight": written contiguous. */
  grove_tensor *w = grove_sd_get(sd, "layer.weight");
  const int64_t s32[] = {3, 2}, st32[] = {1, 3};
  grove_err err = {0};
  grove_tensor *tr = grove_tensor_view_new(w->storage, 0, GROVE_F32, 2, s32, st32, &err);
  ck_assert_msg(tr != NULL, "%s", grove_err_msg(&err));
  ck_assert(!grove_tensor_is_contiguous(tr));
  sd_put(sd, "layer.weight_t", tr);
  /* Keys in an order that is not sorted, and a non-ASCII one. */
  sd_put(sd, "a.z", patterned(GROVE_F32, 1, s3, 14));
  sd_put(sd, "emb.\xc3\xb1", patterned(GROVE_F32, 1, s3, 15));
  return sd;
}

static void assert_same_sd(const grove_state_dict *got, const grove_state_dict *want) {
  ck_assert_uint_eq(grove_sd_count(got), grove_sd_count(want));
  for (size_t i = 0; i < grove_sd_count(want); i++) {
    ck_assert_str_eq(grove_sd_key(got, i), grove_sd_key(want, i));
    assert_same_tensor(grove_sd_key(want, i), grove_sd_tensor(got, i), grove_sd_tensor(want, i));
  }
}

START_TEST(test_round_trip) {
  grove_state_dict *sd = every_dtype_sd();
  grove_err err = {0};
  const char *path = tmp_path("rt.safetensors");
  ck_assert_ok(grove_safetensors_write(path, sd, &err), &err);

  grove_state_dict *back = NULL;
  ck_assert_ok(grove_safetensors_read(path, &back, &err), &err);
  assert_same_sd(back, sd);
  grove_sd_free(back);

  /* From memory too, and through the dispatcher. */
  size_t len;
  char *img = grove_test_read_file(path, &len);
  ck_assert_ptr_nonnull(img);
  back = NULL;
  ck_assert_ok(grove_safetensors_read_buffer(img, len, "rt", &back, &err), &err);
  assert_same_sd(back, sd);
  grove_sd_free(back);
  back = NULL;
  ck_assert_ok(grove_checkpoint_read(path, &back, &err), &err);
  assert_same_sd(back, sd);
  grove_sd_free(back);
  free(img);

  /* Writing over an existing file replaces it. */
  grove_sd_remove(sd, "cube");
  ck_assert_ok(grove_safetensors_write(path, sd, &err), &err);
  back = NULL;
  ck_assert_ok(grove_safetensors_read(path, &back, &err), &err);
  assert_same_sd(back, sd);
  grove_sd_free(back);
  ck_assert_int_eq(grove_test_dir_entries(tmpdir), 1); /* no temporary left behind */
  grove_sd_free(sd);
}
END_TEST

START_TEST(test_empty_state_dict) {
  grove_state_dict *sd = grove_sd_new();
  grove_err err = {0};
  const char *path = tmp_path("empty.safetensors");
  ck_assert_ok(grove_safetensors_write(path, sd, &err), &err);
  grove_state_dict *back = NULL;
  ck_assert_ok(grove_safetensors_read(path, &back, &err), &err);
  ck_assert_uint_eq(grove_sd_count(back), 0);
  grove_sd_free(back);
  grove_sd_free(sd);

  /* The reference writer's output for no tensors: "{}" and six spaces. */
  static const uint8_t ref[] = {8, 0, 0, 0, 0, 0, 0, 0, '{', '}', ' ', ' ', ' ', ' ', ' ', ' '};
  back = NULL;
  ck_assert_ok(grove_safetensors_read_buffer(ref, sizeof ref, "ref", &back, &err), &err);
  ck_assert_uint_eq(grove_sd_count(back), 0);
  grove_sd_free(back);
}
END_TEST

/* The bytes of the header: {"format": "pt"} metadata first, keys in order,
 * padded with spaces to a multiple of 8. */
START_TEST(test_written_layout) {
  grove_state_dict *sd = every_dtype_sd();
  grove_err err = {0};
  const char *path = tmp_path("layout.safetensors");
  ck_assert_ok(grove_safetensors_write(path, sd, &err), &err);
  size_t len;
  uint8_t *img = (uint8_t *)grove_test_read_file(path, &len);
  ck_assert_ptr_nonnull(img);
  uint64_t n;
  memcpy(&n, img, 8);
  ck_assert_uint_eq(n % 8, 0);
  ck_assert_uint_eq(len, 8 + n + grove_sd_nbytes(sd));
  ck_assert_int_eq(img[8], '{');
  size_t end = 8 + (size_t)n;
  while (end > 8 && img[end - 1] == ' ') end--;
  ck_assert_int_eq(img[end - 1], '}');
  ck_assert_uint_lt(8 + n - end, 8);

  json_error_t je;
  json_t *h = json_loadb((const char *)img + 8, (size_t)n, JSON_REJECT_DUPLICATES, &je);
  ck_assert_msg(h != NULL, "%s", je.text);
  const char *first = json_object_iter_key(json_object_iter(h));
  ck_assert_str_eq(first, "__metadata__");
  json_t *meta = json_object_get(h, "__metadata__");
  ck_assert_uint_eq(json_object_size(meta), 1);
  ck_assert_str_eq(json_string_value(json_object_get(meta, "format")), "pt");
  void *it = json_object_iter_next(h, json_object_iter(h));
  for (size_t i = 0; i < grove_sd_count(sd); i++, it = json_object_iter_next(h, it)) {
    ck_assert_ptr_nonnull(it);
    ck_assert_str_eq(json_object_iter_key(it), grove_sd_key(sd, i));
  }
  /* Every tensor's data is aligned to its element size (the data goes in
   * order of decreasing element size, whatever the key order). */
  for (size_t i = 0; i < grove_sd_count(sd); i++) {
    json_t *ent = json_object_get(h, grove_sd_key(sd, i));
    json_int_t b = json_integer_value(json_array_get(json_object_get(ent, "data_offsets"), 0));
    ck_assert_msg((8 + n + (uint64_t)b) % grove_dtype_size(grove_sd_tensor(sd, i)->dtype) == 0,
                  "%s is not aligned", grove_sd_key(sd, i));
  }
  json_t *e = json_object_get(h, "layer.weight_t");
  ck_assert_str_eq(json_string_value(json_object_get(e, "dtype")), "F32");
  ck_assert_int_eq(json_integer_value(json_array_get(json_object_get(e, "shape"), 0)), 3);
  json_t *sc = json_object_get(h, "scalar");
  ck_assert_uint_eq(json_array_size(json_object_get(sc, "shape")), 0);
  json_decref(h);
  free(img);
  grove_sd_free(sd);
}
END_TEST

/* ------------------------------------------------------------ zero-copy */

static bool inside(const grove_tensor *t, const grove_storage *s) {
  const uint8_t *base = grove_storage_data(s);
  const uint8_t *p = t->data;
  return p >= base && p + grove_tensor_nbytes(t) <= base + grove_storage_nbytes(s);
}

START_TEST(test_zero_copy) {
  grove_state_dict *sd = every_dtype_sd();
  grove_err err = {0};
  const char *path = tmp_path("zc.safetensors");
  ck_assert_ok(grove_safetensors_write(path, sd, &err), &err);
  struct stat sb;
  ck_assert_int_eq(stat(path, &sb), 0);
  grove_sd_free(sd);

  grove_state_dict *back = NULL;
  ck_assert_ok(grove_safetensors_read(path, &back, &err), &err);
  grove_tensor *w = grove_sd_get(back, "layer.weight");
  grove_storage *map = w->storage;
  /* The f32 tensors share one storage: the copy of the whole file. */
  ck_assert_uint_eq(grove_storage_nbytes(map), (size_t)sb.st_size);
  const char *f32_keys[] = {"layer.weight",   "layer.bias", "scalar",      "cube",
                            "layer.weight_t", "a.z",        "emb.\xc3\xb1"};
  for (size_t i = 0; i < sizeof f32_keys / sizeof *f32_keys; i++) {
    grove_tensor *t = grove_sd_get(back, f32_keys[i]);
    ck_assert_ptr_nonnull(t);
    ck_assert_msg(t->storage == map, "%s is not a view of the file's copy", f32_keys[i]);
    ck_assert(inside(t, map));
  }
  /* Other dtypes are copies: their data lies outside the file's copy. */
  const char *copied[] = {"half",  "brain", "double", "steps", "int",
                          "short", "char",  "byte",   "mask"};
  for (size_t i = 0; i < sizeof copied / sizeof *copied; i++) {
    grove_tensor *t = grove_sd_get(back, copied[i]);
    ck_assert_msg(t->storage != map, "%s shares the file's copy", copied[i]);
    ck_assert(!inside(t, map));
  }
  /* The file's copy outlives the map while a tensor holds it; the file
   * itself is never mapped (a write to it would reach the tensors). */
  grove_tensor_retain(w);
  uint8_t before[24];
  memcpy(before, w->data, sizeof before);
  grove_sd_free(back);
  ck_assert_msg(!mapped(path), "the file is mapped");
  ck_assert_int_eq(memcmp(before, w->data, sizeof before), 0);
  grove_tensor_release(w);
}
END_TEST

/* f32 data that is not 4-byte aligned in the file is copied (and correct);
 * aligned f32 in the same file is still zero-copy. */
START_TEST(test_misaligned_f32_copied) {
  /* Header padded to 8 bytes so that the data section starts aligned. */
  char header[512];
  snprintf(header, sizeof header, "%s",
           "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
           "\"b\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[4,5]},"
           "\"c\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[5,13]},"
           "\"d\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[13,16]},"
           "\"e\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[16,20]}}");
  while (strlen(header) % 8) strcat(header, " ");
  size_t len;
  uint8_t *img = st_image(header, 20, &len);
  const uint8_t *data = img + 8 + strlen(header);
  const char *path = tmp_path("mis.safetensors");
  ck_assert_int_eq(grove_test_write_file(path, img, len), 0);

  grove_err err = {0};
  grove_state_dict *sd = NULL;
  ck_assert_ok(grove_safetensors_read(path, &sd, &err), &err);
  grove_tensor *a = grove_sd_get(sd, "a"), *c = grove_sd_get(sd, "c"), *e = grove_sd_get(sd, "e");
  ck_assert_ptr_eq(a->storage, e->storage);
  ck_assert(inside(e, a->storage));
  ck_assert_ptr_ne(c->storage, a->storage);
  ck_assert_uint_eq((uintptr_t)c->data % 4, 0);
  ck_assert_int_eq(memcmp(c->data, data + 5, 8), 0);
  ck_assert_int_eq(memcmp(a->data, data, 4), 0);
  ck_assert_int_eq(memcmp(e->data, data + 16, 4), 0);
  ck_assert_int_eq(memcmp(grove_sd_get(sd, "d")->data, data + 13, 3), 0);
  grove_sd_free(sd);
  free(img);
}
END_TEST

/* Offsets listed out of order in the header are fine (the reference sorts
 * them); the keys come back in header order. */
START_TEST(test_header_order_not_offset_order) {
  const char *header =
      "{\"z\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]},"
      "\"__metadata__\":{\"who\":\"me\"},"
      "\"y\":{\"dtype\":\"I32\",\"shape\":[],\"data_offsets\":[0,4]},"
      "\"x\":{\"dtype\":\"BF16\",\"shape\":[0],\"data_offsets\":[12,12],\"extra\":1}}";
  size_t len;
  uint8_t *img = st_image(header, 12, &len);
  grove_err err = {0};
  grove_state_dict *sd = NULL;
  ck_assert_ok(grove_safetensors_read_buffer(img, len, "order", &sd, &err), &err);
  ck_assert_uint_eq(grove_sd_count(sd), 3);
  ck_assert_str_eq(grove_sd_key(sd, 0), "z");
  ck_assert_str_eq(grove_sd_key(sd, 1), "y");
  ck_assert_str_eq(grove_sd_key(sd, 2), "x");
  ck_assert(!grove_sd_contains(sd, "__metadata__"));
  const uint8_t *data = img + 8 + strlen(header);
  ck_assert_int_eq(memcmp(grove_sd_get(sd, "z")->data, data + 4, 8), 0);
  ck_assert_int_eq(memcmp(grove_sd_get(sd, "y")->data, data, 4), 0);
  ck_assert_int_eq(grove_sd_get(sd, "y")->ndim, 0);
  ck_assert_int_eq(grove_tensor_numel(grove_sd_get(sd, "x")), 0);
  grove_sd_free(sd);
  free(img);

  /* "__metadata__": null is no metadata, as serde's Option reads it. */
  img = st_image("{\"__metadata__\":null}", 0, &len);
  sd = NULL;
  ck_assert_ok(grove_safetensors_read_buffer(img, len, "null-meta", &sd, &err), &err);
  ck_assert_uint_eq(grove_sd_count(sd), 0);
  grove_sd_free(sd);
  free(img);
}
END_TEST

/* ------------------------------------------------------------ Python fixture */

static int hexval(char c) {
  return c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10;
}

START_TEST(test_python_fixture) {
  char *side = grove_test_read_file(grove_fixture("safetensors_dtypes.json"), NULL);
  ck_assert_msg(side != NULL, "missing fixture %s (make fixtures)",
                grove_fixture("safetensors_dtypes.json"));
  json_error_t je;
  json_t *want = json_loads(side, 0, &je);
  ck_assert_msg(want != NULL, "%s", je.text);
  free(side);

  grove_err err = {0};
  grove_state_dict *sd = NULL;
  char path[4096];
  snprintf(path, sizeof path, "%s", grove_fixture("safetensors_dtypes.safetensors"));
  ck_assert_ok(grove_checkpoint_read(path, &sd, &err), &err);
  json_t *keys = json_object_get(want, "keys");
  ck_assert_uint_gt(json_array_size(keys), 10);
  ck_assert_uint_eq(grove_sd_count(sd), json_array_size(keys));
  size_t i;
  json_t *k;
  json_array_foreach(keys, i, k) {
    const char *key = json_string_value(json_object_get(k, "key"));
    ck_assert_str_eq(grove_sd_key(sd, i), key);
    const grove_tensor *t = grove_sd_tensor(sd, i);
    ck_assert_str_eq(grove_dtype_st_name(t->dtype), json_string_value(json_object_get(k, "dtype")));
    json_t *shape = json_object_get(k, "shape");
    ck_assert_int_eq(t->ndim, (int)json_array_size(shape));
    for (int d = 0; d < t->ndim; d++)
      ck_assert_int_eq(t->shape[d], json_integer_value(json_array_get(shape, (size_t)d)));
    const char *hex = json_string_value(json_object_get(k, "hex"));
    size_t nb = strlen(hex) / 2;
    ck_assert_uint_eq(grove_tensor_nbytes(t), nb);
    const uint8_t *p = t->data;
    for (size_t b = 0; b < nb; b++)
      ck_assert_msg(p[b] == (hexval(hex[2 * b]) << 4 | hexval(hex[2 * b + 1])),
                    "%s: byte %zu differs", key, b);
  }
  /* Spot checks that do not rely on the sidecar. */
  const grove_tensor *nbt = grove_sd_get(sd, "bn.num_batches_tracked");
  ck_assert_ptr_nonnull(nbt);
  ck_assert_int_eq(nbt->dtype, GROVE_I64);
  ck_assert_int_eq(nbt->ndim, 0);
  ck_assert_int_eq(*(const int64_t *)nbt->data, 0);
  const grove_tensor *rv = grove_sd_get(sd, "bn.running_var");
  ck_assert(((const float *)rv->data)[2] == 1.0f);
  const grove_tensor *tr = grove_sd_get(sd, "transposed");
  const float want_t[] = {0, 3, 1, 4, 2, 5};
  ck_assert_int_eq(grove_test_allclose(tr->data, want_t, 6, 0, 0), -1);
  ck_assert_ptr_nonnull(grove_sd_get(sd, "emb.\xc3\xb1"));
  json_decref(want);

  /* Written back by Grove and read again: the same map. */
  const char *out = tmp_path("again.safetensors");
  ck_assert_ok(grove_safetensors_write(out, sd, &err), &err);
  grove_state_dict *again = NULL;
  ck_assert_ok(grove_safetensors_read(out, &again, &err), &err);
  assert_same_sd(again, sd);
  grove_sd_free(again);
  grove_sd_free(sd);
}
END_TEST

/* ------------------------------------------------------------ malformed */

START_TEST(test_truncated) {
  static const uint8_t seven[7] = {8, 0, 0, 0, 0, 0, 0};
  expect_refused("empty file", seven, 0, GROVE_E_TRUNCATED, NULL);
  expect_refused("7 bytes", seven, 7, GROVE_E_TRUNCATED, NULL);
  /* Header length 8 with only "{}" after it. */
  static const uint8_t shortimg[] = {8, 0, 0, 0, 0, 0, 0, 0, '{', '}'};
  expect_refused("header longer than the file", shortimg, sizeof shortimg, GROVE_E_TRUNCATED, NULL);
  /* A real file cut short inside the header. */
  size_t len;
  uint8_t *img =
      st_image("{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, &len);
  expect_refused("cut in the header", img, 20, GROVE_E_TRUNCATED, NULL);
  free(img);
}
END_TEST

START_TEST(test_header_too_large) {
  uint8_t img[16] = {0};
  uint64_t n = (uint64_t)GROVE_ST_MAX_HEADER + 1;
  memcpy(img, &n, 8);
  memcpy(img + 8, "{}      ", 8);
  expect_refused("header length over the limit", img, sizeof img, GROVE_E_HEADER_TOO_LARGE, NULL);
  n = UINT64_MAX;
  memcpy(img, &n, 8);
  expect_refused("header length 2^64-1", img, sizeof img, GROVE_E_HEADER_TOO_LARGE, NULL);
}
END_TEST

START_TEST(test_bad_json) {
  expect_refused_header("header starting with a space", " {}", 0, GROVE_E_BAD_JSON, NULL);
  expect_refused_header("header that is an array", "[]", 0, GROVE_E_BAD_JSON, NULL);
  expect_refused_header("empty header", "", 0, GROVE_E_BAD_JSON, NULL);
  expect_refused_header("unterminated", "{\"w\":{\"dtype\":\"F32\"", 0, GROVE_E_BAD_JSON, NULL);
  expect_refused_header("trailing garbage", "{} x", 0, GROVE_E_BAD_JSON, NULL);
  expect_refused_header("integer past 2^63",
                        "{\"w\":{\"dtype\":\"F32\",\"shape\":[99999999999999999999],"
                        "\"data_offsets\":[0,4]}}",
                        4, GROVE_E_BAD_JSON, NULL);
  /* A NUL byte inside the header. */
  static const uint8_t nul[] = {4, 0, 0, 0, 0, 0, 0, 0, '{', '}', 0, ' '};
  expect_refused("NUL in the header", nul, sizeof nul, GROVE_E_BAD_JSON, NULL);
}
END_TEST

START_TEST(test_bad_utf8) {
  expect_refused_header("0xff in a key",
                        "{\"w\xff\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
                        GROVE_E_BAD_UTF8, NULL);
  expect_refused_header("overlong NUL", "{\"__metadata__\":{\"a\":\"\xc0\x80\"}}", 0,
                        GROVE_E_BAD_UTF8, NULL);
  expect_refused_header("UTF-16 surrogate", "{\"\xed\xa0\x80\":1}", 0, GROVE_E_BAD_UTF8, NULL);
  expect_refused_header("cut sequence at the end", "{}\xe2\x82", 0, GROVE_E_BAD_UTF8, NULL);
}
END_TEST

/* A header of n zero-size F32 tensors "t0".."t{n-1}", all at [0, 0]. */
static char *zero_size_header(size_t n) {
  size_t cap = n * 64 + 16, used = 0;
  char *h = malloc(cap);
  ck_assert_ptr_nonnull(h);
  h[used++] = '{';
  for (size_t i = 0; i < n; i++)
    used += (size_t)snprintf(h + used, cap - used,
                             "%s\"t%zu\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]}",
                             i ? "," : "", i);
  h[used++] = '}';
  h[used] = '\0';
  return h;
}

/* A million zero-size tensors took 16 s and 1.5 GB to inspect: the count is
 * bounded (GROVE_ST_MAX_TENSORS) before any JSON is built, and a file of
 * many small tensors costs no storage. */
START_TEST(test_tensor_count_bounded) {
  char *h = zero_size_header(GROVE_ST_MAX_TENSORS + 1u);
  char want[64];
  snprintf(want, sizeof want, "lists %u tensors", GROVE_ST_MAX_TENSORS + 1u);
  uint64_t before = grove__storage_bytes_allocated();
  expect_refused_header("one tensor over the limit", h, 0, GROVE_E_LIMIT, want);
  /* expect_refused reads the image twice, from memory and from a file; each
   * read's one storage is the image itself (grove__read_file: 8 bytes of
   * length and the header, rounded to 64), and nothing is per tensor. */
  ck_assert_uint_le(grove__storage_bytes_allocated() - before, 2 * (strlen(h) + 8 + 64));
  free(h);

  /* Under the limit it reads, metadata not counted as a tensor, and keys
   * holding colons, braces and escaped quotes are one member each. */
  h = zero_size_header(1000);
  size_t hl = strlen(h);
  char *h2 = malloc(hl + 200);
  snprintf(h2, hl + 200,
           "{\"__metadata__\":{\"a:b\":\"{[:\"},\"k:\\\":{\":{\"dtype\":\"F32\",\"shape\":[0],"
           "\"data_offsets\":[0,0]},%s",
           h + 1);
  size_t len;
  uint8_t *img = st_image(h2, 0, &len);
  grove_err err = {0};
  grove_state_dict *sd = NULL;
  before = grove__storage_bytes_allocated();
  ck_assert_ok(grove_safetensors_read_buffer(img, len, "mem.safetensors", &sd, &err), &err);
  ck_assert_uint_eq(grove_sd_count(sd), 1001);
  ck_assert(grove_sd_contains(sd, "k:\":{"));
  ck_assert_uint_eq(grove__storage_bytes_allocated(), before);
  grove_sd_free(sd);
  free(img);
  free(h2);
  free(h);
}
END_TEST

/* A file that is not safetensors (a secret behind a symlink named
 * x.safetensors) must not have its bytes quoted back: not its first 8 bytes
 * as a number, not the JSON text near an error, not a bad byte's value. */
START_TEST(test_messages_do_not_quote_bytes) {
  grove_err err = {0};
  grove_state_dict *sd = NULL;
  /* "TOKEN=hunter2" as a header length: over the limit. */
  static const char secret[] = "TOKEN=hunter2-very-secret\n";
  uint64_t n1;
  memcpy(&n1, secret, 8);
  char num[32];
  snprintf(num, sizeof num, "%llu", (unsigned long long)n1);
  ck_assert_status(
      grove_safetensors_read_buffer(secret, sizeof secret - 1, "s.safetensors", &sd, &err),
      GROVE_E_HEADER_TOO_LARGE);
  ck_assert_msg(strstr(err.msg, "not a safetensors file") && !strstr(err.msg, num) &&
                    !strstr(err.msg, "TOKEN"),
                "%s", err.msg);
  /* "pw:" then NULs: a length under the limit but past the file. */
  static const uint8_t pw[12] = {'p', 'w', ':', 0, 0, 0, 0, 0, 'x', 'y', 'z', '!'};
  uint64_t n2;
  memcpy(&n2, pw, 8);
  snprintf(num, sizeof num, "%llu", (unsigned long long)n2);
  ck_assert_status(grove_safetensors_read_buffer(pw, sizeof pw, "s.safetensors", &sd, &err),
                   GROVE_E_TRUNCATED);
  ck_assert_msg(strstr(err.msg, "header length exceeds the file") && !strstr(err.msg, num), "%s",
                err.msg);
  /* JSON text near an error, a bad byte's value. */
  size_t len;
  uint8_t *img = st_image("{\"password\": hunter2}", 0, &len);
  ck_assert_status(grove_safetensors_read_buffer(img, len, "s.safetensors", &sd, &err),
                   GROVE_E_BAD_JSON);
  ck_assert_msg(strstr(err.msg, "line 1, column") && !strstr(err.msg, "hunter2"), "%s", err.msg);
  free(img);
  img = st_image("{\"\xfe\":1}", 0, &len);
  ck_assert_status(grove_safetensors_read_buffer(img, len, "s.safetensors", &sd, &err),
                   GROVE_E_BAD_UTF8);
  ck_assert_msg(!strstr(err.msg, "0xfe") && !strstr(err.msg, "254"), "%s", err.msg);
  free(img);
}
END_TEST

START_TEST(test_duplicate_keys) {
  expect_refused_header("key twice",
                        "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                        "\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
                        8, GROVE_E_DUPLICATE_KEY, "\"w\"");
  expect_refused_header("field twice in an entry",
                        "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"shape\":[1],"
                        "\"data_offsets\":[0,4]}}",
                        4, GROVE_E_DUPLICATE_KEY, "\"shape\"");
  expect_refused_header("__metadata__ twice", "{\"__metadata__\":{},\"__metadata__\":{}}", 0,
                        GROVE_E_DUPLICATE_KEY, "__metadata__");
}
END_TEST

START_TEST(test_bad_offsets) {
  expect_refused_header("overlap",
                        "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
                        "\"b\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[8,24]}}",
                        24, GROVE_E_BAD_OFFSETS, "'b'");
  expect_refused_header("same range twice",
                        "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                        "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
                        8, GROVE_E_BAD_OFFSETS, "'b'");
  expect_refused_header("gap",
                        "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                        "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[12,20]}}",
                        20, GROVE_E_BAD_OFFSETS, "'b'");
  expect_refused_header("first tensor not at 0",
                        "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8,
                        GROVE_E_BAD_OFFSETS, "'a'");
  expect_refused_header("end beyond the data",
                        "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                        "\"b\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[8,24]}}",
                        16, GROVE_E_BAD_OFFSETS, "'b'");
  expect_refused_header("end far beyond the data",
                        "{\"a\":{\"dtype\":\"U8\",\"shape\":[1],"
                        "\"data_offsets\":[0,9223372036854775807]}}",
                        1, GROVE_E_BAD_OFFSETS, "'a'");
  expect_refused_header("begin after end",
                        "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                        "\"b\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,4]}}",
                        8, GROVE_E_BAD_OFFSETS, "'b'");
  /* Decision: bytes after the last tensor are E_BAD_OFFSETS (the reference's
   * MetadataIncompleteBuffer: the offsets do not cover the data). */
  expect_refused_header("trailing bytes",
                        "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 9,
                        GROVE_E_BAD_OFFSETS, "'a'");
  expect_refused_header("data but no tensor", "{}", 4, GROVE_E_BAD_OFFSETS, NULL);
}
END_TEST

START_TEST(test_bad_size) {
  expect_refused_header("byte size does not match",
                        "{\"w\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,20]}}", 20,
                        GROVE_E_BAD_SIZE, "'w'");
  expect_refused_header("dtype size ignored",
                        "{\"w\":{\"dtype\":\"F16\",\"shape\":[4],\"data_offsets\":[0,4]}}", 4,
                        GROVE_E_BAD_SIZE, "'w'");
  expect_refused_header("0-d needs one element",
                        "{\"w\":{\"dtype\":\"I64\",\"shape\":[],\"data_offsets\":[0,0]}}", 0,
                        GROVE_E_BAD_SIZE, "'w'");
  /* 2^32 x 2^32 elements overflow 64 bits (the reference's
   * ValidationOverflow). */
  expect_refused_header("shape product overflow",
                        "{\"w\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],"
                        "\"data_offsets\":[0,4]}}",
                        4, GROVE_E_BAD_SIZE, "'w'");
  expect_refused_header("bytes overflow",
                        "{\"w\":{\"dtype\":\"F64\",\"shape\":[4611686018427387904],"
                        "\"data_offsets\":[0,8]}}",
                        8, GROVE_E_BAD_SIZE, "'w'");
  /* Zero-size, but the other dimensions would overflow the strides. */
  expect_refused_header("empty tensor with absurd dims",
                        "{\"w\":{\"dtype\":\"F32\",\"shape\":[0,4294967296,4294967296],"
                        "\"data_offsets\":[0,0]}}",
                        0, GROVE_E_BAD_SIZE, "'w'");
}
END_TEST

START_TEST(test_bad_dtype) {
  expect_refused_header("unknown dtype",
                        "{\"w\":{\"dtype\":\"Q4\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1,
                        GROVE_E_BAD_DTYPE, "'w'");
  expect_refused_header("safetensors dtype Grove lacks",
                        "{\"w\":{\"dtype\":\"U16\",\"shape\":[1],\"data_offsets\":[0,2]}}", 2,
                        GROVE_E_BAD_DTYPE, "U16");
  expect_refused_header("lower-case dtype",
                        "{\"w\":{\"dtype\":\"f32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
                        GROVE_E_BAD_DTYPE, "'w'");
}
END_TEST

/* Valid JSON of the wrong shape.  Decision: E_FORMAT (the file is malformed,
 * the JSON itself is fine), including negative and fractional dimensions. */
START_TEST(test_bad_schema) {
  expect_refused_header("negative dimension",
                        "{\"w\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,0]}}", 0,
                        GROVE_E_FORMAT, "'w'");
  expect_refused_header("fractional dimension",
                        "{\"w\":{\"dtype\":\"F32\",\"shape\":[2.0],\"data_offsets\":[0,8]}}", 8,
                        GROVE_E_FORMAT, "'w'");
  expect_refused_header("string dimension",
                        "{\"w\":{\"dtype\":\"F32\",\"shape\":[\"2\"],\"data_offsets\":[0,8]}}", 8,
                        GROVE_E_FORMAT, "'w'");
  expect_refused_header("shape not an array",
                        "{\"w\":{\"dtype\":\"F32\",\"shape\":2,\"data_offsets\":[0,8]}}", 8,
                        GROVE_E_FORMAT, "'w'");
  expect_refused_header("dtype missing", "{\"w\":{\"shape\":[2],\"data_offsets\":[0,8]}}", 8,
                        GROVE_E_FORMAT, "'w'");
  expect_refused_header("data_offsets missing", "{\"w\":{\"dtype\":\"F32\",\"shape\":[2]}}", 8,
                        GROVE_E_FORMAT, "'w'");
  expect_refused_header("three offsets",
                        "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8,8]}}", 8,
                        GROVE_E_FORMAT, "'w'");
  expect_refused_header("negative offset",
                        "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[-8,0]}}", 8,
                        GROVE_E_FORMAT, "'w'");
  expect_refused_header("entry not an object", "{\"w\":[1,2]}", 0, GROVE_E_FORMAT, "'w'");
  expect_refused_header("metadata value not a string",
                        "{\"__metadata__\":{\"format\":\"pt\",\"step\":3}}", 0, GROVE_E_FORMAT,
                        "step");
  expect_refused_header("metadata not an object", "{\"__metadata__\":[\"pt\"]}", 0, GROVE_E_FORMAT,
                        "__metadata__");
  expect_refused_header("nine dimensions",
                        "{\"w\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],"
                        "\"data_offsets\":[0,1]}}",
                        1, GROVE_E_LIMIT, "'w'");
}
END_TEST

/* ------------------------------------------------------------ writer failures */

START_TEST(test_write_missing_dir) {
  grove_state_dict *sd = every_dtype_sd();
  grove_err err = {0};
  const char *path = tmp_path("no/such/dir/w.safetensors");
  char copy[512];
  snprintf(copy, sizeof copy, "%s", path);
  ck_assert_status(grove_safetensors_write(copy, sd, &err), GROVE_E_IO);
  ck_assert_msg(strstr(err.msg, copy) != NULL, "message lacks the path: %s", err.msg);
  ck_assert_int_eq(access(copy, F_OK), -1);
  ck_assert_int_eq(grove_test_dir_entries(tmpdir), 0);
  grove_sd_free(sd);
}
END_TEST

/* rename fails (the target is a non-empty directory): the temporary file is
 * removed and the target untouched. */
START_TEST(test_write_failure_leaves_nothing) {
  grove_state_dict *sd = every_dtype_sd();
  grove_err err = {0};
  char target[512];
  snprintf(target, sizeof target, "%s", tmp_path("taken.safetensors"));
  ck_assert_int_eq(mkdir(target, 0755), 0);
  char inner[600];
  snprintf(inner, sizeof inner, "%s/keep", target);
  ck_assert_int_eq(grove_test_write_file(inner, "x", 1), 0);
  ck_assert_status(grove_safetensors_write(target, sd, &err), GROVE_E_IO);
  ck_assert_msg(strstr(err.msg, target) != NULL, "message lacks the path: %s", err.msg);
  ck_assert_int_eq(grove_test_dir_entries(tmpdir), 1);
  ck_assert_int_eq(grove_test_dir_entries(target), 1);
  grove_sd_free(sd);
}
END_TEST

/* ------------------------------------------------------------ files that change */

/* A checkpoint read is a snapshot: truncating the file (truncate -s 0) or
 * writing other bytes over it in place (cp over it) afterwards changes none
 * of the tensors read, and reading them raises no SIGBUS.  Both formats, the
 * zero-copy f32 tensors included: with the file mapped, they were views of
 * the page cache. */
START_TEST(test_read_is_a_snapshot) {
  const char *names[] = {"snap.safetensors", "snap.pt"};
  for (int k = 0; k < 2; k++) {
    grove_state_dict *sd = every_dtype_sd();
    grove_err err = {0};
    char path[512], ref_path[600];
    snprintf(path, sizeof path, "%s", tmp_path(names[k]));
    snprintf(ref_path, sizeof ref_path, "%s.ref", path);
    grove_status (*write)(const char *, const grove_state_dict *, grove_err *) =
        k == 0 ? grove_safetensors_write : grove_torch_write;
    ck_assert_ok(write(path, sd, &err), &err);
    ck_assert_ok(write(ref_path, sd, &err), &err);
    grove_sd_free(sd);
    size_t len = 0;
    char *bytes = grove_test_read_file(path, &len);
    ck_assert_ptr_nonnull(bytes);
    grove_state_dict *back = NULL, *ref = NULL;
    ck_assert_ok(grove_checkpoint_read(path, &back, &err), &err);
    ck_assert_ok(grove_checkpoint_read(ref_path, &ref, &err), &err);
    for (int step = 0; step < 2; step++) {
      if (step == 0) {
        ck_assert_int_eq(truncate(path, 0), 0);
      } else {
        /* Same size, other bytes: what a cp of another checkpoint over it
         * leaves part way. */
        for (size_t i = 0; i < len; i++) bytes[i] = (char)~bytes[i];
        ck_assert_int_eq(grove_test_write_file(path, bytes, len), 0);
      }
      ck_assert_uint_eq(grove_sd_count(back), grove_sd_count(ref));
      for (size_t i = 0; i < grove_sd_count(ref); i++) {
        const grove_tensor *a = grove_sd_tensor(back, i), *b = grove_sd_tensor(ref, i);
        ck_assert_str_eq(grove_sd_key(back, i), grove_sd_key(ref, i));
        ck_assert_uint_eq(grove_tensor_nbytes(a), grove_tensor_nbytes(b));
        ck_assert_msg(memcmp(a->data, b->data, grove_tensor_nbytes(b)) == 0,
                      "%s: %s changed with the file", names[k], grove_sd_key(ref, i));
      }
    }
    free(bytes);
    grove_sd_free(back);
    grove_sd_free(ref);
    unlink(path);
    unlink(ref_path);
  }
}
END_TEST

/* The temporaries of a killed writer go; those of a live one stay; nothing
 * else is touched. */
START_TEST(test_remove_stale_temps) {
  pid_t dead = fork();
  ck_assert_int_ge(dead, 0);
  if (dead == 0) _exit(0);
  ck_assert_int_eq(waitpid(dead, NULL, 0), dead);
  /* The parent of this test (Check's runner) is alive and is not us. */
  long live = (long)getppid();
  char name[128];
  const char *stale_fmt[] = {".weights.safetensors.grove-tmp.%ld.0", ".optim.pt.grove-tmp.%ld.12",
                             "weights.safetensors.tmp.%ld.3"};
  for (int i = 0; i < 3; i++) {
    snprintf(name, sizeof name, stale_fmt[i], (long)dead);
    ck_assert_int_eq(grove_test_write_file(tmp_path(name), "x", 1), 0);
  }
  /* Ours counts as stale: a caller cleans up before writing anything. */
  snprintf(name, sizeof name, ".weights.pt.grove-tmp.%ld.1", (long)getpid());
  ck_assert_int_eq(grove_test_write_file(tmp_path(name), "x", 1), 0);
  const char *keep[] = {"weights.safetensors", "notes.tmp.1.2", ".hidden", NULL, NULL};
  char live_name[128];
  snprintf(live_name, sizeof live_name, ".weights.safetensors.grove-tmp.%ld.0", live);
  keep[3] = live_name;
  for (int i = 0; keep[i]; i++)
    ck_assert_int_eq(grove_test_write_file(tmp_path(keep[i]), "x", 1), 0);
  grove_err err = {0};
  size_t removed = 0;
  ck_assert_ok(grove_checkpoint_remove_stale_temps(tmpdir, &removed, &err), &err);
  ck_assert_uint_eq(removed, 4);
  ck_assert_int_eq(grove_test_dir_entries(tmpdir), 4);
  for (int i = 0; keep[i]; i++) ck_assert_int_eq(access(tmp_path(keep[i]), F_OK), 0);
  for (int i = 0; keep[i]; i++) unlink(tmp_path(keep[i]));
}
END_TEST

START_TEST(test_write_reserved_key) {
  grove_state_dict *sd = grove_sd_new();
  const int64_t s1[] = {1};
  sd_put(sd, "__metadata__", patterned(GROVE_F32, 1, s1, 0));
  grove_err err = {0};
  ck_assert_status(grove_safetensors_write(tmp_path("r.safetensors"), sd, &err), GROVE_E_KEY);
  ck_assert_int_eq(grove_test_dir_entries(tmpdir), 0);
  grove_sd_free(sd);
}
END_TEST

/* ------------------------------------------------------------ dispatcher */

START_TEST(test_detect) {
  static const uint8_t st[] = {16, 0, 0, 0, 0, 0, 0, 0, '{', '"'};
  ck_assert_int_eq(grove_ckpt_detect("weights", st, sizeof st), GROVE_CKPT_SAFETENSORS);
  ck_assert_int_eq(grove_ckpt_detect("weights.pt", st, sizeof st), GROVE_CKPT_SAFETENSORS);
  ck_assert_int_eq(grove_ckpt_detect("w.safetensors", "PK\x03\x04rest", 8), GROVE_CKPT_TORCH_ZIP);
  ck_assert_int_eq(grove_ckpt_detect("w", "PK\x03\x04", 4), GROVE_CKPT_TORCH_ZIP);
  /* A 640-byte header's length begins like a pickle's PROTO 2; '{' at byte 8
   * settles it.  A legacy torch file (PROTO 2, LONG1 magic) is a pickle. */
  static const uint8_t st640[9] = {0x80, 0x02, 0, 0, 0, 0, 0, 0, '{'};
  ck_assert_int_eq(grove_ckpt_detect("w", st640, sizeof st640), GROVE_CKPT_SAFETENSORS);
  static const uint8_t legacy[9] = {0x80, 0x02, 0x8a, 0x0a, 0x6c, 0xfc, 0x9c, 0x46, 0xf9};
  ck_assert_int_eq(grove_ckpt_detect("w", legacy, sizeof legacy), GROVE_CKPT_TORCH_ZIP);
  ck_assert_int_eq(grove_ckpt_detect("w.safetensors", NULL, 0), GROVE_CKPT_SAFETENSORS);
  ck_assert_int_eq(grove_ckpt_detect("dir/W.SAFETENSORS", "", 0), GROVE_CKPT_SAFETENSORS);
  ck_assert_int_eq(grove_ckpt_detect("w.pt", "\x80\x02", 2), GROVE_CKPT_TORCH_ZIP);
  ck_assert_int_eq(grove_ckpt_detect("w.pth", NULL, 0), GROVE_CKPT_TORCH_ZIP);
  ck_assert_int_eq(grove_ckpt_detect("pytorch_model.bin", NULL, 0), GROVE_CKPT_TORCH_ZIP);
  ck_assert_int_eq(grove_ckpt_detect("notes.txt", "hello world", 11), GROVE_CKPT_UNKNOWN);
  ck_assert_int_eq(grove_ckpt_detect(".pt", NULL, 0), GROVE_CKPT_UNKNOWN);
  ck_assert_int_eq(grove_ckpt_detect(NULL, NULL, 0), GROVE_CKPT_UNKNOWN);
  /* A header length past the limit is not a plausible safetensors file. */
  static const uint8_t huge[] = {0, 0, 0, 0, 0, 0, 0, 1, '{'};
  ck_assert_int_eq(grove_ckpt_detect("w", huge, sizeof huge), GROVE_CKPT_UNKNOWN);
}
END_TEST

START_TEST(test_checkpoint_read_dispatch) {
  grove_err err = {0};
  grove_state_dict *sd = SENTINEL;
  char path[512];

  snprintf(path, sizeof path, "%s", tmp_path("missing.safetensors"));
  ck_assert_status(grove_checkpoint_read(path, &sd, &err), GROVE_E_IO);
  ck_assert_ptr_null(sd);
  ck_assert_msg(strstr(err.msg, path) && strstr(err.msg, "No such file"), "%s", err.msg);

  sd = SENTINEL;
  grove_err_clear(&err);
  ck_assert_status(grove_safetensors_read(path, &sd, &err), GROVE_E_IO);
  ck_assert_ptr_null(sd);
  ck_assert_msg(strstr(err.msg, path) && strstr(err.msg, "No such file"), "%s", err.msg);

  /* A directory is not a checkpoint. */
  sd = SENTINEL;
  grove_err_clear(&err);
  ck_assert_status(grove_safetensors_read(tmpdir, &sd, &err), GROVE_E_IO);
  ck_assert_ptr_null(sd);
  sd = SENTINEL;
  ck_assert_status(grove_checkpoint_read(tmpdir, &sd, &err), GROVE_E_IO);
  ck_assert_ptr_null(sd);

  /* Zip magic goes to the torch reader, whatever the name: this one is no
   * archive, and the torch reader says so, naming the file. */
  snprintf(path, sizeof path, "%s", tmp_path("model.weights"));
  static const char zip[] = "PK\x03\x04 not really a zip";
  ck_assert_int_eq(grove_test_write_file(path, zip, sizeof zip - 1), 0);
  sd = SENTINEL;
  grove_err_clear(&err);
  ck_assert_status(grove_checkpoint_read(path, &sd, &err), GROVE_E_FORMAT);
  ck_assert_ptr_null(sd);
  ck_assert_msg(strstr(err.msg, path) && strstr(err.msg, "zip"), "%s", err.msg);

  /* Unrecognisable content and name. */
  snprintf(path, sizeof path, "%s", tmp_path("notes.txt"));
  ck_assert_int_eq(grove_test_write_file(path, "hello, world", 12), 0);
  sd = SENTINEL;
  grove_err_clear(&err);
  ck_assert_status(grove_checkpoint_read(path, &sd, &err), GROVE_E_FORMAT);
  ck_assert_ptr_null(sd);
  ck_assert_msg(strstr(err.msg, path) != NULL, "%s", err.msg);

  /* A safetensors file under a .pt name is read by content. */
  grove_state_dict *w = grove_sd_new();
  const int64_t s2[] = {2};
  sd_put(w, "x", patterned(GROVE_F32, 1, s2, 0));
  snprintf(path, sizeof path, "%s", tmp_path("weights.pt"));
  ck_assert_ok(grove_safetensors_write(path, w, &err), &err);
  sd = NULL;
  ck_assert_ok(grove_checkpoint_read(path, &sd, &err), &err);
  assert_same_sd(sd, w);
  grove_sd_free(sd);
  grove_sd_free(w);
}
END_TEST

Suite *safetensors_suite(void) {
  Suite *s = suite_create("safetensors");
  TCase *tc = tcase_create("core");
  tcase_add_checked_fixture(tc, setup_tmp, teardown_tmp);
  tcase_add_test(tc, test_round_trip);
  tcase_add_test(tc, test_empty_state_dict);
  tcase_add_test(tc, test_written_layout);
  tcase_add_test(tc, test_zero_copy);
  tcase_add_test(tc, test_misaligned_f32_copied);
  tcase_add_test(tc, test_header_order_not_offset_order);
  tcase_add_test(tc, test_python_fixture);
  tcase_add_test(tc, test_truncated);
  tcase_add_test(tc, test_header_too_large);
  tcase_add_test(tc, test_bad_json);
  tcase_add_test(tc, test_bad_utf8);
  tcase_add_test(tc, test_duplicate_keys);
  tcase_add_test(tc, test_tensor_count_bounded);
  tcase_add_test(tc, test_messages_do_not_quote_bytes);
  tcase_add_test(tc, test_bad_offsets);
  tcase_add_test(tc, test_bad_size);
  tcase_add_test(tc, test_bad_dtype);
  tcase_add_test(tc, test_bad_schema);
  tcase_add_test(tc, test_write_missing_dir);
  tcase_add_test(tc, test_write_failure_leaves_nothing);
  tcase_add_test(tc, test_write_reserved_key);
  tcase_add_test(tc, test_read_is_a_snapshot);
  tcase_add_test(tc, test_remove_stale_temps);
  tcase_add_test(tc, test_detect);
  tcase_add_test(tc, test_checkpoint_read_dispatch);
  suite_add_tcase(s, tc);
  return s;
}

GROVE_TEST_MAIN(safetensors_suite)
