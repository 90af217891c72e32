/* check_ptrmap.c: core/base/ptrmap.c, Grove's one hash table (grove__pmap)
 * and its string hash.
 *
 *   - pointer keys: put, add, get, replace, growth past many doublings,
 *     against a plain array that says what must be there;
 *   - deletion without tombstones: random puts and deletes on a small table,
 *     whose clusters wrap around its end, checked after every step;
 *   - reserve: once reserved, adding up to n never moves the arrays;
 *   - string keys: compared by content, not by address;
 *   - clear and fini leave an empty map of the same kind. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "testutil.h"

/* Keys: addresses inside one array, so that they are distinct and
 * neighbouring (the hard case for a pointer hash). */
static char pool[4096];

START_TEST(test_pointer_keys) {
  grove__pmap m = {0};
  bool found = true;
  ck_assert_ptr_null(grove__pmap_get(&m, &pool[0], &found));
  ck_assert(!found);
  for (size_t i = 0; i < 3000; i++)
    ck_assert(grove__pmap_put(&m, &pool[i], (void *)(uintptr_t)(i + 1)));
  ck_assert_uint_eq(m.n, 3000);
  ck_assert_uint_ge(m.cap, 2 * m.n);
  for (size_t i = 0; i < 3000; i++) {
    ck_assert_uint_eq((uintptr_t)grove__pmap_get(&m, &pool[i], &found), i + 1);
    ck_assert(found);
  }
  ck_assert_ptr_null(grove__pmap_get(&m, &pool[3000], &found));
  ck_assert(!found);
  /* put replaces; add leaves an existing value alone. */
  ck_assert(grove__pmap_put(&m, &pool[7], (void *)(uintptr_t)77));
  ck_assert_int_eq(grove__pmap_add(&m, &pool[7], (void *)(uintptr_t)99), 0);
  ck_assert_uint_eq((uintptr_t)grove__pmap_get(&m, &pool[7], NULL), 77);
  ck_assert_int_eq(grove__pmap_add(&m, &pool[3000], NULL), 1);
  ck_assert_uint_eq(m.n, 3001);
  /* A key mapped to NULL is there (a set's members). */
  ck_assert_ptr_null(grove__pmap_get(&m, &pool[3000], &found));
  ck_assert(found);
  grove__pmap_fini(&m);
  ck_assert_uint_eq(m.n, 0);
  ck_assert_uint_eq(m.cap, 0);
  ck_assert_ptr_null(grove__pmap_get(&m, &pool[1], NULL));
}
END_TEST

START_TEST(test_delete) {
  enum { KEYS = 40, STEPS = 20000 };
  grove__pmap m = {0};
  /* 40 keys at most in a table of 128 slots: deletions inside clusters and
   * across the wrap are the common case. */
  ck_assert(grove__pmap_reserve(&m, 64));
  const size_t cap = m.cap;
  bool in[KEYS] = {0};
  size_t n = 0;
  unsigned seed = 12345;
  for (int step = 0; step < STEPS; step++) {
    seed = seed * 1103515245u + 12345u;
    int k = (int)((seed >> 8) % KEYS);
    bool del = (seed >> 20) & 1;
    if (del) {
      ck_assert_int_eq(grove__pmap_del(&m, &pool[k]), in[k]);
      if (in[k]) n--;
      in[k] = false;
    } else {
      ck_assert(grove__pmap_put(&m, &pool[k], &pool[k + 1000]));
      if (!in[k]) n++;
      in[k] = true;
    }
    ck_assert_uint_eq(m.n, n);
    for (int j = 0; j < KEYS; j++) {
      bool found;
      void *v = grove__pmap_get(&m, &pool[j], &found);
      ck_assert_int_eq(found, in[j]);
      ck_assert_ptr_eq(v, in[j] ? &pool[j + 1000] : NULL);
    }
  }
  ck_assert_uint_eq(m.cap, cap); /* emptied and refilled, never grown */
  ck_assert(!grove__pmap_del(&m, &pool[KEYS + 1]));
  grove__pmap_fini(&m);
  ck_assert(!grove__pmap_del(&m, &pool[0]));
}
END_TEST

START_TEST(test_reserve) {
  grove__pmap m = {0};
  ck_assert(grove__pmap_reserve(&m, 1000));
  const void **keys = m.keys;
  const size_t cap = m.cap;
  ck_assert_uint_ge(cap, 2000);
  for (size_t i = 0; i < 1000; i++) ck_assert_int_eq(grove__pmap_add(&m, &pool[i], NULL), 1);
  ck_assert_ptr_eq(m.keys, keys);
  ck_assert_uint_eq(m.cap, cap);
  /* A smaller reservation keeps what is there. */
  ck_assert(grove__pmap_reserve(&m, 10));
  ck_assert_uint_eq(m.cap, cap);
  ck_assert(!grove__pmap_reserve(&m, SIZE_MAX / 2));
  ck_assert_uint_eq(m.n, 1000);
  grove__pmap_fini(&m);
}
END_TEST

START_TEST(test_string_keys) {
  grove__pmap m = {.strkeys = true};
  char names[500][24];
  for (int i = 0; i < 500; i++) {
    snprintf(names[i], sizeof names[i], "layer%d.weight", i);
    ck_assert_int_eq(grove__pmap_add(&m, names[i], (void *)(uintptr_t)(i + 1)), 1);
  }
  /* Looked up through other copies of the same text. */
  for (int i = 0; i < 500; i++) {
    char copy[24];
    snprintf(copy, sizeof copy, "layer%d.weight", i);
    ck_assert_uint_eq((uintptr_t)grove__pmap_get(&m, copy, NULL), (uintptr_t)(i + 1));
    ck_assert_int_eq(grove__pmap_add(&m, copy, NULL), 0);
  }
  ck_assert_ptr_null(grove__pmap_get(&m, "layer500.weight", NULL));
  ck_assert(grove__pmap_del(&m, "layer3.weight"));
  ck_assert_ptr_null(grove__pmap_get(&m, names[3], NULL));
  ck_assert_uint_eq(m.n, 499);
  /* The walk sees every entry once. */
  size_t seen = 0;
  for (size_t i = 0; i < m.cap; i++) seen += m.keys[i] != NULL;
  ck_assert_uint_eq(seen, 499);
  grove__pmap_clear(&m);
  ck_assert_uint_eq(m.n, 0);
  ck_assert_ptr_null(grove__pmap_get(&m, names[4], NULL));
  grove__pmap_fini(&m);
  ck_assert(m.strkeys);
  /* A pointer map compares addresses only. */
  grove__pmap p = {0};
  char a[] = "same", b[] = "same";
  ck_assert(grove__pmap_put(&p, a, a));
  ck_assert_ptr_null(grove__pmap_get(&p, b, NULL));
  grove__pmap_fini(&p);
  /* FNV-1a's published values. */
  ck_assert_uint_eq(grove__hash_str(""), 0xcbf29ce484222325ull);
  ck_assert_uint_eq(grove__hash_str("a"), 0xaf63dc4c8601ec8cull);
}
END_TEST

Suite *ptrmap_suite(void) {
  Suite *s = suite_create("ptrmap");
  TCase *tc = tcase_create("pmap");
  tcase_add_test(tc, test_pointer_keys);
  tcase_add_test(tc, test_delete);
  tcase_add_test(tc, test_reserve);
  tcase_add_test(tc, test_string_keys);
  suite_add_tcase(s, tc);
  return s;
}

GROVE_TEST_MAIN(ptrmap_suite)
