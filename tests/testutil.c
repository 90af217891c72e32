#define _XOPEN_SOURCE 700 /* nftw */
#include "testutil.h"

#include <dirent.h>
#include <errno.h>
#include <ftw.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* ------------------------------------------------------------ temporary directories
 *
 * Every directory grove_test_tmpdir() makes lies in one directory of the
 * run, $TMPDIR/grove-test-XXXXXX, which grove_test_run() makes before the
 * suite starts and removes with all it holds however the run ends.
 *
 * Check runs each test in a forked child: a failing assertion ends that
 * child with _exit() (no atexit handler, no checked teardown), a test past
 * its timeout is killed with SIGKILL, an unchecked setup that fails skips
 * its teardown; and Check's own process, on SIGINT or SIGTERM, kills what
 * it runs and then itself.  So the removal belongs to a process that Check
 * never touches: grove_test_run() forks the runner (Check's parent) into a
 * process group of its own and stays outside it, waiting.  When the runner
 * ends, by any means, the waiting process removes the run's directory.  A
 * SIGINT, SIGTERM, SIGHUP or SIGALRM sent to it is passed on to the runner
 * (SIGINT as SIGINT, the others as SIGTERM: Check takes SIGALRM for its own
 * timeouts), which stops its test as Check does; then the directory goes,
 * and the waiting process dies of the signal it was sent, so that the shell
 * or make sees it.  Only a SIGKILL of the waiting process itself leaves the
 * directory behind.  CK_FORK=no (to debug a test in gdb) runs the suite in
 * the process itself; an atexit handler removes the directory then. */
static char run_dir[256];
static pid_t run_dir_owner;
static volatile pid_t runner_pid;
static volatile sig_atomic_t run_signal;

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

static void pass_on(int sig) {
  if (!run_signal) run_signal = sig;
  if (runner_pid > 0) kill(runner_pid, sig == SIGINT ? SIGINT : SIGTERM);
}

static const int passed_on[] = {SIGINT, SIGTERM, SIGHUP, SIGALRM};
enum { NPASSED = sizeof passed_on / sizeof passed_on[0] };

static int run_suite(Suite *s) {
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}

int grove_test_run(Suite *s) {
  const char *base = getenv("TMPDIR");
  snprintf(run_dir, sizeof run_dir, "%s/grove-test-XXXXXX", base && *base ? base : "/tmp");
  if (!mkdtemp(run_dir)) {
    fprintf(stderr, "cannot make the run's directory %s: %s\n", run_dir, strerror(errno));
    run_dir[0] = '\0';
    return EXIT_FAILURE;
  }
  run_dir_owner = getpid();
  atexit(remove_run_dir);
  const char *fork_mode = getenv("CK_FORK");
  if (fork_mode && strcmp(fork_mode, "no") == 0) {
    int rc = run_suite(s);
    remove_run_dir();
    return rc;
  }
  /* Signals wait until the runner's pid is known, and the handlers are
   * only the waiting process's. */
  sigset_t block, old;
  sigemptyset(&block);
  for (int i = 0; i < NPASSED; i++) sigaddset(&block, passed_on[i]);
  sigprocmask(SIG_BLOCK, &block, &old);
  fflush(NULL);
  pid_t pid = fork();
  if (pid < 0) {
    fprintf(stderr, "cannot fork the test runner: %s\n", strerror(errno));
    sigprocmask(SIG_SETMASK, &old, NULL);
    remove_run_dir();
    return EXIT_FAILURE;
  }
  if (pid == 0) {
    setpgid(0, 0);
    sigprocmask(SIG_SETMASK, &old, NULL);
    exit(run_suite(s)); /* exit(), not _exit(): stdout is flushed */
  }
  setpgid(pid, pid); /* too, against the race with the child's own call */
  runner_pid = pid;
  /* The suite is the runner's; this process's copy goes (Check frees a
   * suite only with its runner). */
  srunner_free(srunner_create(s));
  struct sigaction sa = {.sa_handler = pass_on};
  sigemptyset(&sa.sa_mask);
  for (int i = 0; i < NPASSED; i++) sigaction(passed_on[i], &sa, NULL);
  sigprocmask(SIG_SETMASK, &old, NULL);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  runner_pid = 0;
  remove_run_dir();
  if (run_signal) {
    signal(run_signal, SIG_DFL);
    raise(run_signal);
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  fprintf(stderr, "the test runner died of signal %d\n", WTERMSIG(status));
  return EXIT_FAILURE;
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
  /* Outside grove_test_run() there is no run directory: nothing would
   * remove what this made, so it makes nothing. */
  if (!run_dir[0]) return NULL;
  snprintf(buf, sizeof buf, "%s/XXXXXX", run_dir);
  return mkdtemp(buf);
}

int grove_test_dir_entries(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return -1;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)))
    if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
  closedir(d);
  return n;
}

grove_state_dict *grove_test_sd_under(const grove_state_dict *sd, const char *prefix) {
  grove_err err = {0};
  grove_state_dict *out = grove_sd_new();
  ck_assert_ptr_nonnull(out);
  const size_t n = strlen(prefix);
  for (size_t i = 0; i < grove_sd_count(sd); i++) {
    const char *k = grove_sd_key(sd, i);
    if (strncmp(k, prefix, n) == 0)
      ck_assert_msg(grove_sd_set(out, k + n, grove_sd_tensor(sd, i), &err) == GROVE_OK, "%s",
                    err.msg);
  }
  return out;
}

long grove_test_allclose(const float *a, const float *b, size_t n, double rtol, double atol) {
  for (size_t i = 0; i < n; i++) {
    double x = a[i], y = b[i];
    if (isnan(x) && isnan(y)) continue;
    if (!(fabs(x - y) <= atol + rtol * fabs(y))) return (long)i;
  }
  return -1;
}
