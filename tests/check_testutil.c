/* check_testutil.c: the promises of tests/testutil.c that every suite leans
 * on.  The run's directory going away however a run ends (a failure, a
 * timeout, a signal) is seen from outside, by tests/py/test_testutil.py,
 * which runs this suite with GROVE_TESTUTIL_FAIL or GROVE_TESTUTIL_STALL. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "testutil.h"

START_TEST(tmpdir_lies_in_the_run_dir) {
  const char *d = grove_test_tmpdir();
  ck_assert_ptr_nonnull(d);
  char path[PATH_MAX];
  snprintf(path, sizeof path, "%s", d);
  char *slash = strrchr(path, '/');
  ck_assert_ptr_nonnull(slash);
  *slash = '\0';
  const char *run = strrchr(path, '/');
  ck_assert_ptr_nonnull(run);
  ck_assert_msg(strncmp(run + 1, "grove-test-", 11) == 0, "%s is not in a run directory", d);
  const char *base = getenv("TMPDIR");
  if (base && *base) ck_assert_msg(strncmp(d, base, strlen(base)) == 0, "%s not under %s", d, base);
  char *again = strdup(grove_test_tmpdir());
  ck_assert_str_ne(again, path);
  free(again);
}
END_TEST

START_TEST(allclose_as_torch) {
  const float a[] = {1.0f, 2.0f, 3.0f}, b[] = {1.0f, 2.0f + 1e-6f, 3.5f};
  ck_assert_int_eq(grove_test_allclose(a, b, 2, 1e-4, 1e-5), -1);
  ck_assert_int_eq(grove_test_allclose(a, b, 3, 1e-4, 1e-5), 2);
}
END_TEST

/* A test that fails with a directory of its own full. */
START_TEST(fails_with_files_left) {
  const char *d = grove_test_tmpdir();
  ck_assert_ptr_nonnull(d);
  char path[PATH_MAX];
  snprintf(path, sizeof path, "%s/left", d);
  ck_assert_int_eq(grove_test_write_file(path, "x", 1), 0);
  ck_abort_msg("failing on purpose (GROVE_TESTUTIL_FAIL)");
}
END_TEST

/* Fills a directory, writes its pid to $GROVE_TESTUTIL_STALL and waits to
 * be stopped (a signal, or Check's timeout). */
START_TEST(stalls) {
  const char *d = grove_test_tmpdir();
  ck_assert_ptr_nonnull(d);
  char path[PATH_MAX], pid[32];
  snprintf(path, sizeof path, "%s/left", d);
  ck_assert_int_eq(grove_test_write_file(path, "x", 1), 0);
  int n = snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
  ck_assert_int_eq(grove_test_write_file(getenv("GROVE_TESTUTIL_STALL"), pid, (size_t)n), 0);
  for (;;) pause();
}
END_TEST

static Suite *testutil_suite(void) {
  Suite *s = suite_create("testutil");
  TCase *tc = tcase_create("testutil");
  tcase_add_test(tc, tmpdir_lies_in_the_run_dir);
  tcase_add_test(tc, allclose_as_torch);
  suite_add_tcase(s, tc);
  if (getenv("GROVE_TESTUTIL_FAIL")) {
    TCase *f = tcase_create("fail");
    tcase_add_test(f, fails_with_files_left);
    suite_add_tcase(s, f);
  }
  if (getenv("GROVE_TESTUTIL_STALL")) {
    TCase *st = tcase_create("stall");
    tcase_add_test(st, stalls);
    suite_add_tcase(s, st);
  }
  return s;
}

GROVE_TEST_MAIN(testutil_suite)
