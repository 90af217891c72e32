#define _XOPEN_SOURCE 700 /* nftw */
#include "testutil.h"

#include <ftw.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ------------------------------------------------------------ temporary directories
 *
 * Every directory grove_test_tmpdir() makes lies in one directory of the
 * run, $TMPDIR/grove-test-XXXXXX, which grove_test_run() makes before the
 * suite starts and removes with all it holds when the suite is done.  The
 * removal is the parent's job because only Check's parent process sees every
 * way a test ends: each test runs in a forked child, a failing assertion ends
 * that child with _exit() (so neither an atexit handler nor a checked
 * teardown runs in it), a test past its timeout is killed with SIGKILL, and
 * an unchecked setup that fails skips its teardown.  The atexit handler
 * covers the parent's own exit() (Check's internal errors); children inherit
 * it, so it acts only in the process that made the directory.  A parent
 * killed by a signal (Ctrl-C) still leaves the run's directory behind. */
static char run_dir[256];
static pid_t run_dir_owner;

static int remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
  remove(path);
  return 0; /* go on: what cannot be removed is reported once, below */
}

/* Removes path and all below it (links removed, not followed); 0 when
 * nothing is left there. */
static int remove_tree(const char *path) {
  nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
  struct stat sb;
  return lstat(path, &sb) == 0 ? -1 : 0;
}

static void remove_run_dir(void) {
  if (!run_dir[0] || getpid() != run_dir_owner) return;
  if (remove_tree(run_dir) != 0) fprintf(stderr, "could not remove %s\n", run_dir);
  run_dir[0] = '\0';
}

int grove_test_run(Suite *s) {
  const char *base = getenv("TMPDIR");
  snprintf(run_dir, sizeof run_dir, "%s/grove-test-XXXXXX", base && *base ? base : "/tmp");
  if (mkdtemp(run_dir)) {
    run_dir_owner = getpid();
    atexit(remove_run_dir);
  } else {
    run_dir[0] = '\0'; /* grove_test_tmpdir() then tries $TMPDIR itself */
  }
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  remove_run_dir();
  return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}

const char *grove_fixture(const char *name) {
  static char buf[4096];
  const char *dir = getenv("GROVE_FIXTURES");
  if (!dir || !*dir) dir = "tests/fixtures";
  snprintf(buf, sizeof buf, "%s/%s", dir, name);
  return buf;
}

char *grove_test_read_file(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  if (fseek(f, 0, SEEK_END) != 0) { fclose(f); return NULL; }
  long n = ftell(f);
  if (n < 0) { fclose(f); return NULL; }
  rewind(f);
  char *buf = malloc((size_t)n + 1);
  if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) { free(buf); buf = NULL; }
  fclose(f);
  if (!buf) return NULL;
  buf[n] = '\0';
  if (len) *len = (size_t)n;
  return buf;
}

int grove_test_write_file(const char *path, const void *data, size_t len) {
  FILE *f = fopen(path, "wb");
  if (!f) return -1;
  size_t w = fwrite(data, 1, len, f);
  return (fclose(f) == 0 && w == len) ? 0 : -1;
}

const char *grove_test_tmpdir(void) {
  static char buf[sizeof run_dir + 8];
  const char *base = getenv("TMPDIR");
  if (run_dir[0])
    snprintf(buf, sizeof buf, "%s/XXXXXX", run_dir);
  else
    snprintf(buf, sizeof buf, "%s/grove-test-XXXXXX", base && *base ? base : "/tmp");
  return mkdtemp(buf);
}

long grove_test_allclose(const float *a, const float *b, size_t n, double rtol, double atol) {
  for (size_t i = 0; i < n; i++) {
    double x = a[i], y = b[i];
    if (isnan(x) && isnan(y)) continue;
    if (!(fabs(x - y) <= atol + rtol * fabs(y))) return (long)i;
  }
  return -1;
}
