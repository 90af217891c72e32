/* testutil.h: shared helpers for Grove's Check suites.  Each tests/check_X.c
 * defines `Suite *X_suite(void)` and ends with GROVE_TEST_MAIN(X_suite). */
#ifndef GROVE_TESTUTIL_H
#define GROVE_TESTUTIL_H

#include <check.h>
#include <stddef.h>

#include "grove/grove.h"

/* Runs the suite, prints Check's summary line, exits 0 only when all passed.
 * Removes every directory grove_test_tmpdir() made during the run, however
 * its test ended, and when the run is stopped by SIGINT, SIGTERM, SIGHUP or
 * SIGALRM (testutil.c says how); fails at once when the run's directory
 * cannot be made.  Call it once, from main. */
int grove_test_run(Suite *s);
#define GROVE_TEST_MAIN(suite_fn) \
  int main(void) { return grove_test_run(suite_fn()); }

/* The fixtures folder ($GROVE_FIXTURES, else tests/fixtures) joined with
 * name, in a static buffer (one at a time). */
const char *grove_fixture(const char *name);
/* Reads a whole file into a malloc'd buffer (NUL-terminated); NULL if it
 * cannot.  *len may be NULL. */
char *grove_test_read_file(const char *path, size_t *len);
/* Writes len bytes to path; returns 0 on success. */
int grove_test_write_file(const char *path, const void *data, size_t len);
/* The number of entries of directory dir other than . and ..; -1 if it
 * cannot be read. */
int grove_test_dir_entries(const char *dir);
/* A fresh temporary directory (mkdtemp) path in a static buffer; NULL if it
 * cannot be made, and outside grove_test_run().  It lies in the run's
 * directory and goes with it at the end, so a test need not remove it
 * (removing it early keeps a long run small). */
const char *grove_test_tmpdir(void);

/* A new state_dict (the caller's) of sd's entries whose key starts with
 * prefix, under the key without it ("w.weight" -> "weight" for prefix "w."):
 * the weights of a parity fixture that also holds inputs and outputs.  The
 * tensors are sd's, retained.  Fails the test when it cannot be made. */
grove_state_dict *grove_test_sd_under(const grove_state_dict *sd, const char *prefix);

/* Element-wise closeness, as torch.allclose: |a-b| <= atol + rtol*|b|.
 * Returns the index of the first bad element, or -1 when all are close. */
long grove_test_allclose(const float *a, const float *b, size_t n, double rtol, double atol);

#define ck_assert_status(expr, expected)                                          \
  do {                                                                            \
    grove_status _s = (expr);                                                     \
    ck_assert_msg(_s == (expected), "%s: got %s, expected %s", #expr,             \
                  grove_status_name(_s), grove_status_name(expected));            \
  } while (0)

#define ck_assert_ok(expr, errp)                                                  \
  do {                                                                            \
    grove_status _s = (expr);                                                     \
    ck_assert_msg(_s == GROVE_OK, "%s: %s: %s", #expr, grove_status_name(_s),     \
                  grove_err_msg(errp));                                           \
  } while (0)

#endif
