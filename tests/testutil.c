#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int grove_test_run(Suite *s) {
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
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
  static char buf[256];
  const char *base = getenv("TMPDIR");
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
