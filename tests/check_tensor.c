/* check_tensor.c: dtypes and half conversions, views and their bounds,
 * strided conversion copies, the state_dict map, the arena, statuses. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "testutil.h"

START_TEST(test_status_names) {
  ck_assert_str_eq(grove_status_name(GROVE_E_TRUNCATED), "GROVE_E_TRUNCATED");
  ck_assert_str_eq(grove_strerror(GROVE_OK), "ok");
  ck_assert_str_eq(grove_status_name((grove_status)999), "GROVE_E_UNKNOWN");
  grove_err err = {0};
  ck_assert_int_eq(grove_err_set(&err, GROVE_E_SHAPE, "x %d", 3), GROVE_E_SHAPE);
  grove_err_prefix(&err, "file.safetensors");
  ck_assert_str_eq(err.msg, "file.safetensors: x 3");
  /* A message longer than the buffer is cut and says so. */
  char big[3000];
  memset(big, 'a', sizeof big - 1);
  big[sizeof big - 1] = '\0';
  grove_err_set(&err, GROVE_E_IO, "%s", big);
  ck_assert_uint_eq(strlen(err.msg), GROVE_ERR_MSG_MAX - 1);
  ck_assert_str_eq(err.msg + GROVE_ERR_MSG_MAX - 4, "...");
  ck_assert_int_eq(grove_err_set(NULL, GROVE_E_IO, "ignored"), GROVE_E_IO);
}
END_TEST

START_TEST(test_dtype_names) {
  grove_dtype dt;
  ck_assert(grove_dtype_from_name("torch.bfloat16", &dt) && dt == GROVE_BF16);
  ck_assert(grove_dtype_from_name("long", &dt) && dt == GROVE_I64);
  ck_assert(!grove_dtype_from_name("complex64", &dt));
  ck_assert(grove_dtype_from_st_name("BOOL", &dt) && dt == GROVE_BOOL);
  ck_assert_uint_eq(grove_dtype_size(GROVE_BF16), 2);
  ck_assert_uint_eq(grove_dtype_size((grove_dtype)77), 0);
}
END_TEST

START_TEST(test_half_conversions_exact) {
  /* Every f16 value round-trips through f32 exactly. */
  for (uint32_t h = 0; h < 0x10000; h++) {
    float f = grove_f16_to_f32((uint16_t)h);
    if (isnan(f)) continue;
    ck_assert_uint_eq(grove_f32_to_f16(f), h);
  }
  ck_assert_float_eq(grove_f16_to_f32(0x3c00), 1.0f);
  ck_assert_float_eq(grove_f16_to_f32(0x0001), ldexpf(1, -24)); /* smallest subnormal */
  ck_assert_uint_eq(grove_f32_to_f16(65520.0f), 0x7c00);       /* rounds to inf */
  ck_assert_uint_eq(grove_f32_to_f16(1.0f + ldexpf(1, -11)), 0x3c00); /* tie to even */
  for (uint32_t h = 0; h < 0x10000; h++) {
    float f = grove_bf16_to_f32((uint16_t)h);
    if (isnan(f)) continue;
    ck_assert_uint_eq(grove_f32_to_bf16(f), h);
  }
  ck_assert_uint_eq(grove_f32_to_bf16(1.0f + ldexpf(1, -8)), 0x3f80); /* tie to even */
  ck_assert(isnan(grove_bf16_to_f32(grove_f32_to_bf16(NAN))));
}
END_TEST

START_TEST(test_view_bounds_and_strided_copy) {
  grove_err err = {0};
  grove_storage *st = grove_storage_new(6 * sizeof(float));
  float *d = grove_storage_data(st);
  for (int i = 0; i < 6; i++) d[i] = (float)i;
  /* A transposed [3,2] view of a [2,3] matrix. */
  grove_tensor *t = grove_tensor_view_new(st, 0, GROVE_F32, 2, (int64_t[]){3, 2},
                                          (int64_t[]){1, 3}, &err);
  ck_assert_ptr_nonnull(t);
  ck_assert(!grove_tensor_is_contiguous(t));
  grove_tensor *c = grove_tensor_clone(t, GROVE_F64, &err);
  const double want[] = {0, 3, 1, 4, 2, 5};
  for (int i = 0; i < 6; i++) ck_assert_double_eq(((double *)c->data)[i], want[i]);
  /* Views that reach past the storage are refused. */
  ck_assert_ptr_null(grove_tensor_view_new(st, 4, GROVE_F32, 1, (int64_t[]){6}, NULL, &err));
  ck_assert_int_eq(err.code, GROVE_E_BAD_OFFSETS);
  ck_assert_ptr_null(
      grove_tensor_view_new(st, 0, GROVE_F32, 2, (int64_t[]){2, 3}, (int64_t[]){4, 1}, &err));
  ck_assert_ptr_null(grove_tensor_view_new(st, 0, GROVE_F32, 2, (int64_t[]){INT64_MAX / 2, 3},
                                           (int64_t[]){INT64_MAX / 4, 1}, &err));
  /* A furthest element of exactly 2^64 - 1 (2 * (2^63 - 1) + 1): "+ 1"
   * wrapped the check to 0 and the view was handed out (issue 15, through
   * an optimizer checkpoint). */
  ck_assert_ptr_null(grove_tensor_view_new(st, 0, GROVE_F32, 2, (int64_t[]){3, 2},
                                           (int64_t[]){INT64_MAX, 1}, &err));
  ck_assert_int_eq(err.code, GROVE_E_BAD_OFFSETS);
  ck_assert_ptr_null(grove_tensor_view_new(st, 0, GROVE_F32, 1, (int64_t[]){2},
                                           (int64_t[]){-1}, &err));
  ck_assert_int_eq(err.code, GROVE_E_RANGE);
  /* An empty view anywhere inside is fine. */
  grove_tensor *e = grove_tensor_view_new(st, 24, GROVE_F32, 1, (int64_t[]){0}, NULL, &err);
  ck_assert_ptr_nonnull(e);
  grove_tensor_release(e);
  grove_storage_release(st); /* the views keep it alive */
  ck_assert_float_eq(((float *)t->data)[3], 3.0f);
  /* Float into integer is refused; integer into float converts. */
  grove_tensor *i64 = grove_tensor_new(GROVE_I64, 2, (int64_t[]){3, 2}, &err);
  ck_assert_status(grove_tensor_copy(i64, t, &err), GROVE_E_DTYPE);
  ((int64_t *)i64->data)[5] = -7;
  grove_tensor *f = grove_tensor_clone(i64, GROVE_F32, &err);
  ck_assert_float_eq(((float *)f->data)[5], -7.0f);
  /* Shapes must agree. */
  grove_tensor *wrong = grove_tensor_new(GROVE_F32, 1, (int64_t[]){6}, &err);
  ck_assert_status(grove_tensor_copy(wrong, t, &err), GROVE_E_SHAPE);
  ck_assert_str_eq(err.msg, "cannot copy a tensor of shape [3, 2] into shape [6]");
  /* Bad shapes are refused up front. */
  ck_assert_ptr_null(grove_tensor_new(GROVE_F32, 1, (int64_t[]){-1}, &err));
  ck_assert_int_eq(err.code, GROVE_E_RANGE);
  ck_assert_ptr_null(grove_tensor_new(GROVE_F32, 9, (int64_t[9]){0}, &err));
  ck_assert_int_eq(err.code, GROVE_E_LIMIT);
  grove_tensor_release(wrong);
  grove_tensor_release(f);
  grove_tensor_release(i64);
  grove_tensor_release(c);
  grove_tensor_release(t);
}
END_TEST

static int released;
static void on_release(void *ctx) { released += *(int *)ctx; }

START_TEST(test_wrapped_storage_release) {
  static float region[4];
  int one = 1;
  released = 0;
  grove_storage *st = grove_storage_wrap(region, sizeof region, on_release, &one);
  grove_tensor *t = grove_tensor_view_new(st, 0, GROVE_F32, 1, (int64_t[]){4}, NULL, NULL);
  grove_storage_release(st);
  ck_assert_int_eq(released, 0);
  grove_tensor_release(t);
  ck_assert_int_eq(released, 1);
}
END_TEST

START_TEST(test_state_dict_map) {
  grove_err err = {0};
  grove_state_dict *sd = grove_sd_new();
  grove_tensor *a = grove_tensor_new(GROVE_F32, 1, (int64_t[]){2}, &err);
  grove_tensor *b = grove_tensor_new(GROVE_I64, 0, NULL, &err);
  char key[32];
  for (int i = 0; i < 1000; i++) {
    snprintf(key, sizeof key, "layer.%d.weight", i);
    ck_assert_ok(grove_sd_add(sd, key, (i % 2) ? a : b, &err), &err);
  }
  ck_assert_status(grove_sd_add(sd, "layer.5.weight", a, &err), GROVE_E_DUPLICATE_KEY);
  ck_assert_ok(grove_sd_set(sd, "layer.4.weight", a, &err), &err); /* replace, same place */
  ck_assert_str_eq(grove_sd_key(sd, 4), "layer.4.weight");
  ck_assert_ptr_eq(grove_sd_tensor(sd, 4), a);
  ck_assert(grove_sd_remove(sd, "layer.0.weight"));
  ck_assert(!grove_sd_remove(sd, "layer.0.weight"));
  ck_assert_uint_eq(grove_sd_count(sd), 999);
  ck_assert_str_eq(grove_sd_key(sd, 0), "layer.1.weight");
  ck_assert_ptr_eq(grove_sd_get(sd, "layer.999.weight"), a);
  ck_assert_ptr_null(grove_sd_get(sd, "layer.1000.weight"));
  /* 499 two-float tensors and 500 int64 scalars (layer.4 now holds a). */
  ck_assert_uint_eq(grove_sd_nbytes(sd), 500 * 8 + 499 * 8);
  ck_assert_ok(grove_sd_set_version(sd, "bn", 2, &err), &err);
  int v = 0;
  ck_assert(grove_sd_get_version(sd, "bn", &v) && v == 2);
  ck_assert(!grove_sd_get_version(sd, "", &v));
  grove_sd_free(sd);
  grove_tensor_release(a);
  grove_tensor_release(b);
}
END_TEST

START_TEST(test_arena_stops_growing) {
  grove_arena *a = grove_arena_new(100);
  ck_assert_uint_eq(grove_arena_capacity(a), 128);
  for (int pass = 0; pass < 3; pass++) {
    for (int i = 0; i < 10; i++) {
      unsigned char *p = grove_arena_alloc(a, 1000);
      ck_assert_ptr_nonnull(p);
      ck_assert_uint_eq((uintptr_t)p % 64, 0);
      memset(p, i, 1000);
    }
    grove_arena_reset(a);
  }
  /* Only the first pass grew; it then became one block of the high water. */
  ck_assert_uint_eq(grove_arena_grow_count(a), 10);
  ck_assert_uint_eq(grove_arena_capacity(a), 10 * 1024);
  ck_assert_uint_eq(grove_arena_high_water(a), 10 * 1024);
  grove_arena_free(a);
  grove_arena_free(NULL);
}
END_TEST

Suite *tensor_suite(void) {
  Suite *s = suite_create("tensor");
  TCase *tc = tcase_create("core");
  tcase_add_test(tc, test_status_names);
  tcase_add_test(tc, test_dtype_names);
  tcase_add_test(tc, test_half_conversions_exact);
  tcase_add_test(tc, test_view_bounds_and_strided_copy);
  tcase_add_test(tc, test_wrapped_storage_release);
  tcase_add_test(tc, test_state_dict_map);
  tcase_add_test(tc, test_arena_stops_growing);
  suite_add_tcase(s, tc);
  return s;
}

GROVE_TEST_MAIN(tensor_suite)
