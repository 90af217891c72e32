/* check_telemetry.c: forward-hook telemetry, from the core's observer to
 * groved's events on the PUB socket (docs/telemetry.md).
 *
 *   core      module-path patterns; the statistics functions of
 *             server/telemetry_stats.c; a forward with an observer sees every
 *             watched module (Sequential's Linear+ReLU unfused) and returns
 *             bit-identical outputs
 *   serve     a real groved serving tests/fixtures_gen/telemetry.py's model:
 *             every module's statistics (forward and forward_pre, histogram,
 *             per-feature) equal what torch hooks saw on the same input;
 *             predictions are bit-identical with and without hooks; globs,
 *             removal by id, every N batches, sampling, refusals
 *   reload    hooks survive a hot reload to another architecture: re-resolved,
 *             a pattern that no longer matches is reported, and matches
 *             again after reloading back
 *   slow      a subscriber that never reads: every predict is answered and
 *             the events it loses are counted
 *   off       groved --pub none refuses RegisterHook
 *
 * Every wait is bounded; nothing asserts on time. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../server/telemetry.h"
#include "grove/client.h"
#include "grove/grove.h"
#include "groved_harness.h" /* h_free_port; this groved (ipc only) has its own helpers below */
#include "testutil.h"

/* ============================================================ helpers */

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static const char *groved_path(void) {
  static char buf[4096];
  const char *env = getenv("GROVED_BIN");
  if (env && *env) return env;
  const char *grove = getenv("GROVE_BIN");
  if (grove && *grove) {
    snprintf(buf, sizeof buf, "%s", grove);
    char *slash = strrchr(buf, '/');
    if (slash) {
      snprintf(slash + 1, sizeof buf - (size_t)(slash + 1 - buf), "groved");
      if (access(buf, X_OK) == 0) return buf;
    }
  }
  return "build/release/groved";
}

/* GET path from 127.0.0.1:port; the body (malloc'd) or NULL. */
static char *http_body(int port, const char *path) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return NULL;
  struct timeval tv = {10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  struct sockaddr_in a = {.sin_family = AF_INET,
                          .sin_port = htons((uint16_t)port),
                          .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
    close(fd);
    return NULL;
  }
  char req[256];
  int n = snprintf(req, sizeof req,
                   "GET %s HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n", path);
  if (write(fd, req, (size_t)n) != n) {
    close(fd);
    return NULL;
  }
  size_t cap = 1 << 16, len = 0;
  char *buf = malloc(cap);
  while (buf) {
    if (len + 1 == cap) {
      char *g = realloc(buf, cap *= 2);
      if (!g) {
        free(buf);
        buf = NULL;
        break;
      }
      buf = g;
    }
    ssize_t r = read(fd, buf + len, cap - len - 1);
    if (r <= 0) break;
    len += (size_t)r;
  }
  close(fd);
  if (!buf) return NULL;
  buf[len] = 0;
  char *start = strstr(buf, "\r\n\r\n");
  char *body = strdup(start ? start + 4 : "");
  free(buf);
  return body;
}

/* The value of the metric line that starts with prefix (-1 when absent). */
static double metric(int port, const char *prefix) {
  char *text = http_body(port, "/metrics");
  double v = -1;
  for (char *line = text; line && *line;) {
    char *nl = strchr(line, '\n');
    if (strncmp(line, prefix, strlen(prefix)) == 0) {
      v = strtod(line + strlen(prefix), NULL);
      break;
    }
    line = nl ? nl + 1 : NULL;
  }
  free(text);
  return v;
}

typedef struct server {
  pid_t pid;
  char dir[256];
  char rpc[384], pub[384], log[384];
  char admin[384]; /* the admin plane, where the hook RPCs go */
  int http_port;
} server;

static void rm_rf(const char *dir) {
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
}

static void show_log(const server *s) {
  char *text = grove_test_read_file(s->log, NULL);
  fprintf(stderr, "---- groved log (%s) ----\n%s---- end ----\n", s->log, text ? text : "");
  free(text);
}

/* groved serving telemetry_net as "net", RPC and PUB on ipc sockets in a
 * temporary directory, HTTP on a free port; extra flags NULL-terminated.
 * Waits (at most 30 s) until HTTP answers. */
static void server_start(server *s, const char *const *extra) {
  memset(s, 0, sizeof *s);
  const char *tmp = grove_test_tmpdir();
  ck_assert_ptr_nonnull(tmp);
  snprintf(s->dir, sizeof s->dir, "%s", tmp);
  snprintf(s->rpc, sizeof s->rpc, "ipc://%s/rpc.sock", s->dir);
  snprintf(s->pub, sizeof s->pub, "ipc://%s/pub.sock", s->dir);
  snprintf(s->admin, sizeof s->admin, "ipc://%s/admin.sock", s->dir);
  snprintf(s->log, sizeof s->log, "%s/groved.log", s->dir);
  s->http_port = h_free_port();
  char http[64], model[4200];
  snprintf(http, sizeof http, "127.0.0.1:%d", s->http_port);
  snprintf(model, sizeof model, "net=%s", grove_fixture("telemetry_net"));
  char fixtures[4096];
  snprintf(fixtures, sizeof fixtures, "%s", grove_fixture(""));
  const char *argv[48];
  int n = 0;
  argv[n++] = groved_path();
  argv[n++] = "--model";
  argv[n++] = model;
  argv[n++] = "--listen";
  argv[n++] = s->rpc;
  argv[n++] = "--admin-listen";
  argv[n++] = s->admin;
  argv[n++] = "--checkpoint-dir"; /* reload's model_dir: another fixture */
  argv[n++] = fixtures;
  argv[n++] = "--pub";
  argv[n++] = s->pub;
  argv[n++] = "--http";
  argv[n++] = http;
  argv[n++] = "--log-level";
  argv[n++] = "debug";
  bool workers_given = false;
  for (int i = 0; extra && extra[i] && n < 44; i++) {
    workers_given |= strcmp(extra[i], "--workers") == 0;
    argv[n++] = extra[i];
  }
  if (!workers_given) {
    /* One worker: a request is one batch, and events come in order. */
    argv[n++] = "--workers";
    argv[n++] = "1";
  }
  argv[n] = NULL;
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    int fd = open(s->log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      dup2(fd, STDERR_FILENO);
      dup2(fd, STDOUT_FILENO);
      close(fd);
    }
    execv(argv[0], (char *const *)argv);
    _exit(127);
  }
  s->pid = pid;
  double deadline = now_s() + 30.0;
  for (;;) {
    int st;
    if (waitpid(pid, &st, WNOHANG) == pid) {
      s->pid = 0;
      show_log(s);
      ck_abort_msg("groved exited at start (status %d)", st);
    }
    char *b = http_body(s->http_port, "/healthz");
    free(b);
    if (b) break;
    if (now_s() > deadline) {
      show_log(s);
      ck_abort_msg("groved did not answer within 30 s");
    }
    sleep_ms(20);
  }
}

static int server_stop(server *s) {
  int st = -1;
  if (s->pid > 0) {
    kill(s->pid, SIGTERM);
    double deadline = now_s() + 20.0;
    while (now_s() < deadline) {
      if (waitpid(s->pid, &st, WNOHANG) == s->pid) break;
      sleep_ms(10);
    }
    if (now_s() >= deadline) {
      kill(s->pid, SIGKILL);
      waitpid(s->pid, &st, 0);
      st = -1;
    }
    s->pid = 0;
    if (st != 0) show_log(s);
  }
  if (s->dir[0]) rm_rf(s->dir);
  return st;
}

static bool log_contains(const server *s, const char *needle) {
  char *text = grove_test_read_file(s->log, NULL);
  bool found = text && strstr(text, needle);
  free(text);
  return found;
}

static grove_client *connect_rpc(const server *s) {
  const char *urls[] = {s->rpc};
  grove_client *c = NULL;
  grove_err err = {0};
  grove_client_opts o = {.admin_url = s->admin, .admin_token = ""};
  ck_assert_ok(grove_client_open(urls, 1, &o, &c, &err), &err);
  return c;
}

static uint64_t add_hook(grove_client *c, const char *pattern, grove_hook_kind kind,
                         grove_hook_info **info) {
  grove_hook_spec sp = {.model = "net", .pattern = pattern, .kind = kind};
  uint64_t id = 0;
  grove_err err = {0};
  ck_assert_ok(grove_client_register_hook(c, &sp, 10000, &id, info, &err), &err);
  ck_assert_uint_gt(id, 0);
  return id;
}

static void remove_all_hooks(grove_client *c) {
  grove_hook_info *hs = NULL;
  size_t n = 0;
  grove_err err = {0};
  ck_assert_ok(grove_client_list_hooks(c, NULL, 10000, &hs, &n, &err), &err);
  for (size_t i = 0; i < n; i++)
    ck_assert_ok(grove_client_remove_hook(c, hs[i].id, 10000, NULL, &err), &err);
  grove_hook_infos_free(hs, n);
}

/* The fixture's input (one batch of 16 rows). */
typedef struct io {
  grove_state_dict *sd;
  grove_tensor *x;
} io;

static void io_load(io *o) {
  char path[4096];
  snprintf(path, sizeof path, "%s/io.safetensors", grove_fixture("telemetry_net"));
  grove_err err = {0};
  ck_assert_ok(grove_safetensors_read(path, &o->sd, &err), &err);
  o->x = grove_sd_get(o->sd, "x");
  ck_assert_ptr_nonnull(o->x);
}

static void predict(grove_client *c, const io *o, grove_prediction *p) {
  grove_err err = {0};
  ck_assert_ok(grove_client_predict(c, "net", o->x, 1, 10000, p, &err), &err);
}

static grove_watch *watch_open(const server *s, const char *model, const char *module) {
  grove_watch *w = NULL;
  grove_err err = {0};
  ck_assert_ok(grove_watch_open(s->pub, model, module, &w, &err), &err);
  return w;
}

/* Up to max events, until n came or timeout_s passed; returns how many. */
static size_t collect(grove_watch *w, grove_hook_event *evs, size_t max, size_t n,
                      double timeout_s) {
  size_t got = 0;
  double deadline = now_s() + timeout_s;
  while (got < n && got < max && now_s() < deadline) {
    grove_err err = {0};
    grove_status s = grove_watch_next(w, 200, &evs[got], &err);
    if (s == GROVE_OK) got++;
  }
  return got;
}

static void fini_events(grove_hook_event *evs, size_t n) {
  for (size_t i = 0; i < n; i++) grove_hook_event_fini(&evs[i]);
}

/* A subscription is live once the dial is done, but NNG's subscribe can
 * still be on its way to the pipe: wait until one probe event arrives. */
static void watch_ready(grove_watch *w, grove_client *c, const io *o) {
  uint64_t id = add_hook(c, "5", GROVE_HOOK_FORWARD, NULL);
  bool ok = false;
  for (int i = 0; i < 100 && !ok; i++) {
    grove_prediction p;
    predict(c, o, &p);
    grove_prediction_fini(&p);
    grove_hook_event ev;
    grove_err err = {0};
    /* Any event says the pipe carries events; drain what is queued. */
    while (grove_watch_next(w, ok ? 50 : 100, &ev, &err) == GROVE_OK) {
      ok = true;
      grove_hook_event_fini(&ev);
    }
  }
  ck_assert_msg(ok, "no hook event reached the subscriber");
  grove_err err = {0};
  ck_assert_ok(grove_client_remove_hook(c, id, 10000, NULL, &err), &err);
}

/* ============================================================ core */

START_TEST(patterns) {
  static const struct {
    const char *pat, *path;
    bool match;
  } cases[] = {
      {"1", "1", true},
      {"1", "10", false},
      {"", "", true},
      {"*", "", false}, /* a glob never names the root */
      {"**", "", false},
      {"*", "encoder", true},
      {"*", "encoder.block", false},
      {"**", "encoder.block.0", true},
      {"encoder.layers.*.linear1", "encoder.layers.3.linear1", true},
      {"encoder.layers.*.linear1", "encoder.layers.3.x.linear1", false},
      {"encoder.**", "encoder.a.b", true},
      {"encoder.**", "encoder", false},
      {"**.linear1", "linear1", true}, /* a leading "**." may match nothing */
      {"**.linear1", "a.b.linear1", true},
      {"a.**.z", "a.z", true},
      {"a.**.z", "a.b.c.z", true},
      {"a.**.z", "a.bz", false},
      {"3.2.?", "3.2.1", true},
      {"3.2.?", "3.2.10", false},
      {"?", ".", false},
      {"[04]", "4", true},
      {"[04]", "3", false},
      {"[!0-2]", "3", true},
      {"[!0-2]", "1", false},
      {"[0-9]*", "12", true},
      {"a\\*", "a*", true},
      {"a\\*", "ab", false},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    ck_assert_msg(grove_module_pattern_match(cases[i].pat, cases[i].path) == cases[i].match,
                  "'%s' vs '%s': expected %s", cases[i].pat, cases[i].path,
                  cases[i].match ? "a match" : "no match");
  grove_err err = {0};
  ck_assert_status(grove_module_pattern_check("enc.[ab", &err), GROVE_E_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(err.msg, "'['"));
  ck_assert_status(grove_module_pattern_check("a\\", &err), GROVE_E_INVALID_ARGUMENT);
  char longp[600];
  memset(longp, 'a', sizeof longp - 1);
  longp[sizeof longp - 1] = 0;
  ck_assert_status(grove_module_pattern_check(longp, &err), GROVE_E_INVALID_ARGUMENT);
  ck_assert(!grove_module_pattern_match("enc.[ab", "enc.a"));
  ck_assert_status(grove_module_pattern_check("**.block.[0-3]", &err), GROVE_OK);
}
END_TEST

START_TEST(stats_math) {
  /* Known values. */
  const float x[] = {1, 2, 3, 4, 0, -2};
  tel_basic b;
  grove__tel_basic_init(&b);
  grove__tel_basic_add(&b, x, 6);
  ck_assert_uint_eq(b.count, 6);
  ck_assert_uint_eq(b.finite, 6);
  ck_assert_uint_eq(b.zeros, 1);
  ck_assert_double_eq_tol(b.mean, 8.0 / 6.0, 1e-12);
  double var = 0;
  for (int i = 0; i < 6; i++) var += (x[i] - 8.0 / 6.0) * (x[i] - 8.0 / 6.0);
  ck_assert_double_eq_tol(grove__tel_basic_std(&b), sqrt(var / 5), 1e-12);
  ck_assert_double_eq(b.min, -2);
  ck_assert_double_eq(b.max, 4);
  ck_assert_double_eq_tol(b.abs_sum / (double)b.finite, 12.0 / 6.0, 1e-12);

  /* NaN and infinities are counted apart; the rest is as without them. */
  const float y[] = {1, NAN, 2, INFINITY, 3, -INFINITY, 4, 0, -2};
  tel_basic c;
  grove__tel_basic_init(&c);
  grove__tel_basic_add(&c, y, 9);
  ck_assert_uint_eq(c.count, 9);
  ck_assert_uint_eq(c.nans, 1);
  ck_assert_uint_eq(c.infs, 2);
  ck_assert_uint_eq(c.finite, 6);
  ck_assert_double_eq_tol(c.mean, b.mean, 1e-12);
  ck_assert_double_eq_tol(c.m2, b.m2, 1e-9);
  ck_assert_double_eq(c.min, -2);
  ck_assert_double_eq(c.max, 4);

  /* Merging chunks equals one pass, even far from zero (the shifted sums
   * stay exact where a naive sum of squares would not). */
  enum { N = 10007 };
  static float big[N];
  uint64_t st = 12345;
  for (int i = 0; i < N; i++) {
    st = st * 6364136223846793005ull + 1442695040888963407ull;
    big[i] = 1000.0f + (float)((double)(st >> 40) / (double)(1 << 24)) * 0.01f;
  }
  tel_basic whole, parts, p2;
  grove__tel_basic_init(&whole);
  grove__tel_basic_add(&whole, big, N);
  grove__tel_basic_init(&parts);
  grove__tel_basic_init(&p2);
  grove__tel_basic_add(&parts, big, 3001);
  grove__tel_basic_add(&p2, big + 3001, N - 3001);
  grove__tel_basic_merge(&parts, &p2);
  double m = 0, v = 0;
  for (int i = 0; i < N; i++) m += big[i];
  m /= N;
  for (int i = 0; i < N; i++) v += (big[i] - m) * (big[i] - m);
  double sd = sqrt(v / (N - 1));
  ck_assert_double_eq_tol(whole.mean, m, 1e-9);
  ck_assert_double_eq_tol(parts.mean, m, 1e-9);
  ck_assert_msg(fabs(grove__tel_basic_std(&whole) - sd) < 1e-6 * sd, "std %g vs %g",
                grove__tel_basic_std(&whole), sd);
  ck_assert_msg(fabs(grove__tel_basic_std(&parts) - sd) < 1e-6 * sd, "merged std %g vs %g",
                grove__tel_basic_std(&parts), sd);

  /* Histogram over [lo, hi): below, above, NaN skipped, the top edge above. */
  const float h[] = {-3, -2, -1.5f, 0, 0.49f, 1.99f, 2, 5, NAN, -INFINITY, INFINITY};
  uint64_t counts[4] = {0}, below = 0, above = 0;
  grove__tel_hist_add(counts, 4, -2, 2, &below, &above, h, 11);
  ck_assert_uint_eq(below, 2); /* -3, -inf */
  ck_assert_uint_eq(above, 3); /* 2, 5, +inf */
  ck_assert_uint_eq(counts[0], 2);
  ck_assert_uint_eq(counts[1], 0);
  ck_assert_uint_eq(counts[2], 2);
  ck_assert_uint_eq(counts[3], 1);

  /* Per column: rows at once equals a value stream. */
  const float t[] = {1, 10, 2, 20, 3, 30, 4, 40};
  double mem[2][10];
  tel_feat fa = {.nfeat = 2,
                 .mean = mem[0],
                 .m2 = mem[0] + 2,
                 .s1 = mem[0] + 4,
                 .s2 = mem[0] + 6,
                 .k = mem[0] + 8};
  tel_feat fb = {.nfeat = 2,
                 .mean = mem[1],
                 .m2 = mem[1] + 2,
                 .s1 = mem[1] + 4,
                 .s2 = mem[1] + 6,
                 .k = mem[1] + 8};
  grove__tel_feat_add_rows(&fa, t, 2);
  grove__tel_feat_add_rows(&fa, t + 4, 2);
  grove__tel_feat_add_stream(&fb, t, 3, 0);
  grove__tel_feat_add_stream(&fb, t + 3, 5, 3);
  fb.rows = 4;
  for (int j = 0; j < 2; j++) {
    double want_m = j ? 25 : 2.5, want_s = sqrt((j ? 500.0 : 5.0) / 3.0);
    ck_assert_double_eq_tol(fa.mean[j], want_m, 1e-12);
    ck_assert_double_eq_tol(fb.mean[j], want_m, 1e-12);
    ck_assert_double_eq_tol(grove__tel_feat_std(&fa, j), want_s, 1e-12);
    ck_assert_double_eq_tol(grove__tel_feat_std(&fb, j), want_s, 1e-12);
  }
}
END_TEST

typedef struct obs_rec {
  const grove_named_modules *names;
  int calls[64][3];
  bool linear_negative; /* 3.2.0's output holds negatives: it ran unfused */
} obs_rec;

static void record(void *ctx, size_t index, grove_observe_kind kind, const grove_module *m,
                   const grove_values *v) {
  obs_rec *r = ctx;
  ck_assert_int_ge(v->n, 1);
  for (size_t i = 0; i < r->names->n; i++) {
    if (r->names->items[i].module != m) continue;
    r->calls[i][kind]++;
    if (strcmp(r->names->items[i].name, "3.2.0") == 0 && kind == GROVE_OBSERVE_POST) {
      const grove_tensor *t = &v->v[0];
      for (int64_t k = 0; k < grove_tensor_numel(t); k++)
        if (((const float *)t->data)[k] < 0) r->linear_negative = true;
    }
  }
  (void)index;
}

static int cmp_ptr(const void *a, const void *b) {
  uintptr_t x = (uintptr_t) * (const void *const *)a, y = (uintptr_t) * (const void *const *)b;
  return x < y ? -1 : x > y;
}

START_TEST(observer_sees_everything_and_changes_nothing) {
  grove_err err = {0};
  grove_model *m = NULL;
  ck_assert_ok(grove_model_open(grove_fixture("telemetry_net"), NULL, &m, &err), &err);
  io o;
  io_load(&o);
  grove_arena *a = grove_arena_new(m->arena_bytes);
  grove_values out = {0};
  ck_assert_ok(grove_model_forward(m, a, o.x, 1, &out, &err), &err);
  size_t nbytes = grove_tensor_nbytes(&out.v[0]);
  void *plain = malloc(nbytes);
  memcpy(plain, out.v[0].data, nbytes);
  grove_arena_reset(a);

  grove_named_modules names = {0};
  ck_assert_ok(grove_module_named_modules(m->root, "", true, &names, &err), &err);
  ck_assert_uint_le(names.n, 64);
  const grove_module *mods[64];
  unsigned char kinds[64];
  for (size_t i = 0; i < names.n; i++) {
    mods[i] = names.items[i].module;
    kinds[i] = GROVE_OBSERVE_PRE | GROVE_OBSERVE_POST;
  }
  qsort(mods, names.n, sizeof *mods, cmp_ptr);
  obs_rec rec = {.names = &names};
  grove_observer obs = {.modules = mods, .kinds = kinds, .n = names.n, .fn = record, .ctx = &rec};
  for (size_t i = 0; i < names.n; i++)
    ck_assert_int_eq(grove_observer_find(&obs, names.items[i].module),
                     (long)((const grove_module **)bsearch(&names.items[i].module, mods, names.n,
                                                           sizeof *mods, cmp_ptr) -
                            mods));
  ck_assert_int_eq(grove_observer_find(&obs, (const grove_module *)&obs), -1);
  ck_assert_int_eq(grove_observer_find(NULL, m->root), -1);

  grove_values in = {.n = 1};
  in.v[0] = *o.x;
  grove_fwd f = {.arena = a, .err = &err, .observer = &obs};
  grove_values out2 = {0};
  ck_assert_ok(grove_module_forward(m->root, &f, &in, &out2), &err);
  ck_assert_uint_eq(grove_tensor_nbytes(&out2.v[0]), nbytes);
  ck_assert_msg(memcmp(plain, out2.v[0].data, nbytes) == 0,
                "an observed forward changed the output");
  for (size_t i = 0; i < names.n; i++) {
    ck_assert_msg(rec.calls[i][GROVE_OBSERVE_PRE] == 1 && rec.calls[i][GROVE_OBSERVE_POST] == 1,
                  "module '%s' seen %d/%d times", names.items[i].name,
                  rec.calls[i][GROVE_OBSERVE_PRE], rec.calls[i][GROVE_OBSERVE_POST]);
  }
  ck_assert_msg(rec.linear_negative, "3.2.0 (a Linear before a ReLU) was seen fused");

  grove_named_modules_fini(&names);
  free(plain);
  grove_arena_free(a);
  grove_sd_free(o.sd);
  grove_model_free(m);
}
END_TEST

/* ============================================================ serve */

static server S;

static void s_setup(void) {
  server_start(&S, NULL);
}

/* A non-zero exit (a sanitizer's report) fails the suite: Check stops the
 * run when an unchecked fixture fails. */
static void s_teardown(void) {
  ck_assert_int_eq(server_stop(&S), 0);
}

/* |a - b| <= 1e-4 |b| + atol, with atol for values that are ~0. */
static void close_to(const char *what, const char *module, double got, double want, double atol) {
  ck_assert_msg(fabs(got - want) <= 1e-4 * fabs(want) + atol, "%s of '%s': %.9g, torch %.9g", what,
                module, got, want);
}

static void compare(const grove_hook_event *e, json_t *want) {
  const char *mod = e->module;
  ck_assert_uint_eq(e->count, (uint64_t)json_integer_value(json_object_get(want, "count")));
  close_to("mean", mod, e->mean, json_real_value(json_object_get(want, "mean")), 1e-6);
  close_to("std", mod, e->std, json_real_value(json_object_get(want, "std")), 1e-6);
  close_to("min", mod, e->min, json_number_value(json_object_get(want, "min")), 1e-6);
  close_to("max", mod, e->max, json_number_value(json_object_get(want, "max")), 1e-6);
  close_to("abs_mean", mod, e->abs_mean, json_number_value(json_object_get(want, "abs_mean")),
           1e-6);
  /* Zeros come from ReLU and are exact on both sides. */
  close_to("zero_fraction", mod, e->zero_fraction,
           json_number_value(json_object_get(want, "zero_fraction")), 1e-12);
  ck_assert_uint_eq(e->nan_count, 0);
  ck_assert_uint_eq(e->inf_count, 0);
  json_t *shape = json_object_get(want, "shape");
  ck_assert_int_eq(e->ndim, (int)json_array_size(shape));
  for (int d = 0; d < e->ndim; d++)
    ck_assert_int_eq(e->shape[d], json_integer_value(json_array_get(shape, (size_t)d)));
  /* A value within rounding of a bin edge may land on the other side in
   * Grove and torch: the totals agree, each bin within one. */
  json_t *hist = json_object_get(want, "histogram");
  ck_assert_uint_eq(e->nbins, json_array_size(hist));
  uint64_t total = e->histogram_below + e->histogram_above, want_total = 0;
  for (size_t i = 0; i < e->nbins; i++) {
    int64_t w = json_integer_value(json_array_get(hist, i));
    want_total += (uint64_t)w;
    total += e->histogram[i];
    ck_assert_msg(llabs((long long)e->histogram[i] - w) <= 1,
                  "bin %zu of '%s': %" PRIu64 " vs %lld", i, mod, e->histogram[i], (long long)w);
  }
  want_total += (uint64_t)json_integer_value(json_object_get(want, "histogram_below")) +
                (uint64_t)json_integer_value(json_object_get(want, "histogram_above"));
  ck_assert_uint_eq(total, want_total);
  json_t *fm = json_object_get(want, "feature_mean"), *fs = json_object_get(want, "feature_std");
  if (fm) {
    ck_assert_uint_eq(e->nfeatures, json_array_size(fm));
    for (size_t j = 0; j < e->nfeatures; j++) {
      close_to("feature_mean", mod, e->feature_mean[j], json_number_value(json_array_get(fm, j)),
               1e-6);
      close_to("feature_std", mod, e->feature_std[j], json_number_value(json_array_get(fs, j)),
               1e-6);
    }
  } else {
    ck_assert_uint_eq(e->nfeatures, 0);
  }
}

START_TEST(stats_equal_torch) {
  char path[4096];
  snprintf(path, sizeof path, "%s/stats.json", grove_fixture("telemetry_net"));
  json_error_t jerr;
  json_t *doc = json_load_file(path, 0, &jerr);
  ck_assert_msg(doc != NULL, "%s: %s", path, jerr.text);
  json_t *modules = json_object_get(doc, "modules");
  size_t nmod = json_object_size(modules);
  ck_assert_uint_eq(nmod, 13);

  grove_client *c = connect_rpc(&S);
  remove_all_hooks(c);
  io o;
  io_load(&o);
  grove_watch *w = watch_open(&S, "net", NULL);
  watch_ready(w, c, &o);
  /* Every module (the glob) and the model itself (""), both kinds, with a
   * histogram and per-feature statistics. */
  const char *pats[] = {"**", ""};
  grove_hook_kind kinds[] = {GROVE_HOOK_FORWARD, GROVE_HOOK_FORWARD_PRE};
  for (int p = 0; p < 2; p++)
    for (int k = 0; k < 2; k++) {
      grove_hook_spec sp = {.model = "net",
                            .pattern = pats[p],
                            .kind = kinds[k],
                            .histogram_bins = 10,
                            .histogram_min = -2,
                            .histogram_max = 2,
                            .per_feature = true};
      grove_hook_info *info = NULL;
      grove_err err = {0};
      ck_assert_ok(grove_client_register_hook(c, &sp, 10000, NULL, &info, &err), &err);
      ck_assert_uint_eq(info->nmodules, p == 0 ? nmod - 1 : 1);
      ck_assert_int_eq(info->version, 1);
      grove_hook_info_free(info);
    }
  grove_prediction pr;
  predict(c, &o, &pr);
  grove_prediction_fini(&pr);
  grove_hook_event evs[64];
  size_t got = collect(w, evs, 64, 2 * nmod, 20.0);
  ck_assert_uint_eq(got, 2 * nmod);
  bool seen[2][32] = {{false}};
  for (size_t i = 0; i < got; i++) {
    grove_hook_event *e = &evs[i];
    json_t *m = json_object_get(modules, e->module);
    ck_assert_msg(m != NULL, "an event for '%s', which is no module", e->module);
    json_t *want =
        json_object_get(m, e->kind == GROVE_HOOK_FORWARD_PRE ? "forward_pre" : "forward");
    ck_assert_ptr_nonnull(want);
    ck_assert_str_eq(e->model, "net");
    ck_assert_int_eq(e->version, 1);
    ck_assert_uint_eq(e->batches, 1);
    ck_assert_uint_eq(e->rows, 16);
    ck_assert_uint_eq(e->sequence, 1);
    ck_assert_int_le(e->start_unix_us, e->end_unix_us);
    compare(e, want);
    /* One event per (module, kind). */
    size_t idx = 0;
    const char *key;
    json_t *val;
    json_object_foreach(modules, key, val) {
      if (strcmp(key, e->module) == 0) break;
      idx++;
    }
    ck_assert_msg(!seen[e->kind][idx], "two events for '%s'", e->module);
    seen[e->kind][idx] = true;
  }
  fini_events(evs, got);
  remove_all_hooks(c);
  grove_watch_close(w);
  grove_client_close(c);
  grove_sd_free(o.sd);
  json_decref(doc);
}
END_TEST

START_TEST(predictions_unchanged) {
  grove_client *c = connect_rpc(&S);
  remove_all_hooks(c);
  io o;
  io_load(&o);
  grove_prediction before, with, after;
  predict(c, &o, &before);
  add_hook(c, "**", GROVE_HOOK_FORWARD, NULL);
  add_hook(c, "**", GROVE_HOOK_FORWARD_PRE, NULL);
  grove_hook_spec sp = {.model = "net",
                        .pattern = "3.*",
                        .per_feature = true,
                        .histogram_bins = 64,
                        .histogram_min = -1,
                        .histogram_max = 1};
  grove_err err = {0};
  ck_assert_ok(grove_client_register_hook(c, &sp, 10000, NULL, NULL, &err), &err);
  predict(c, &o, &with);
  remove_all_hooks(c);
  predict(c, &o, &after);
  size_t n = grove_tensor_nbytes(before.outputs[0]);
  ck_assert_uint_eq(grove_tensor_nbytes(with.outputs[0]), n);
  ck_assert_msg(memcmp(before.outputs[0]->data, with.outputs[0]->data, n) == 0,
                "a prediction changed while hooks watched every module");
  ck_assert_msg(memcmp(before.outputs[0]->data, after.outputs[0]->data, n) == 0,
                "a prediction changed after the hooks were removed");
  grove_prediction_fini(&before);
  grove_prediction_fini(&with);
  grove_prediction_fini(&after);
  grove_client_close(c);
  grove_sd_free(o.sd);
}
END_TEST

static bool has_module(const grove_hook_info *h, const char *name) {
  for (size_t i = 0; i < h->nmodules; i++)
    if (strcmp(h->modules[i], name) == 0) return true;
  return false;
}

START_TEST(globs_and_removal) {
  grove_client *c = connect_rpc(&S);
  remove_all_hooks(c);
  static const struct {
    const char *pat;
    const char *want[6];
  } cases[] = {
      {"3.*", {"3.0", "3.1", "3.2", "3.3"}}, {"**.0", {"0", "3.0", "3.2.0"}},
      {"3.2.?", {"3.2.0", "3.2.1"}},         {"[04]", {"0", "4"}},
      {"*", {"0", "1", "2", "3", "4", "5"}}, {"3.2", {"3.2"}},
  };
  uint64_t ids[6];
  for (size_t i = 0; i < 6; i++) {
    grove_hook_info *h = NULL;
    ids[i] = add_hook(c, cases[i].pat, GROVE_HOOK_FORWARD, &h);
    size_t n = 0;
    while (n < 6 && cases[i].want[n]) {
      ck_assert_msg(has_module(h, cases[i].want[n]), "'%s' does not match '%s'", cases[i].pat,
                    cases[i].want[n]);
      n++;
    }
    ck_assert_msg(h->nmodules == n, "'%s' matches %zu modules, expected %zu", cases[i].pat,
                  h->nmodules, n);
    grove_hook_info_free(h);
  }
  /* Refusals name what is wrong. */
  grove_err err = {0};
  grove_hook_spec sp = {.model = "net", .pattern = "3.[ab"};
  ck_assert_status(grove_client_register_hook(c, &sp, 10000, NULL, NULL, &err),
                   GROVE_E_INVALID_ARGUMENT);
  sp.pattern = "encoder.*";
  ck_assert_status(grove_client_register_hook(c, &sp, 10000, NULL, NULL, &err), GROVE_E_NOT_FOUND);
  ck_assert_ptr_nonnull(strstr(err.msg, "3.2.0"));
  sp.model = "nope";
  sp.pattern = "**";
  ck_assert_status(grove_client_register_hook(c, &sp, 10000, NULL, NULL, &err), GROVE_E_NOT_FOUND);
  sp.model = "net";
  sp.sample_rate = 1.5;
  ck_assert_status(grove_client_register_hook(c, &sp, 10000, NULL, NULL, &err),
                   GROVE_E_INVALID_ARGUMENT);
  sp.sample_rate = 0;
  sp.histogram_bins = 5000;
  ck_assert_status(grove_client_register_hook(c, &sp, 10000, NULL, NULL, &err),
                   GROVE_E_INVALID_ARGUMENT);
  sp.histogram_bins = 4;
  sp.histogram_min = 1;
  sp.histogram_max = 1;
  ck_assert_status(grove_client_register_hook(c, &sp, 10000, NULL, NULL, &err),
                   GROVE_E_INVALID_ARGUMENT);
  grove_hook_info *hs = NULL;
  size_t n = 0;
  ck_assert_status(grove_client_list_hooks(c, "nope", 10000, &hs, &n, &err), GROVE_E_NOT_FOUND);

  /* ListHooks: in registration order; removal by id. */
  ck_assert_ok(grove_client_list_hooks(c, "net", 10000, &hs, &n, &err), &err);
  ck_assert_uint_eq(n, 6);
  for (size_t i = 0; i < n; i++) ck_assert_uint_eq(hs[i].id, ids[i]);
  grove_hook_infos_free(hs, n);
  grove_hook_info *gone = NULL;
  ck_assert_ok(grove_client_remove_hook(c, ids[3], 10000, &gone, &err), &err);
  ck_assert_str_eq(gone->pattern, "[04]");
  grove_hook_info_free(gone);
  ck_assert_status(grove_client_remove_hook(c, ids[3], 10000, NULL, &err), GROVE_E_NOT_FOUND);
  ck_assert_ok(grove_client_list_hooks(c, NULL, 10000, &hs, &n, &err), &err);
  ck_assert_uint_eq(n, 5);
  for (size_t i = 0; i < n; i++) ck_assert_uint_ne(hs[i].id, ids[3]);
  grove_hook_infos_free(hs, n);

  /* After the removal only the others publish: watch module 4 (which only
   * "[04]" and "*" matched): one event, from "*". */
  io o;
  io_load(&o);
  grove_watch *w = watch_open(&S, "net", "4");
  grove_hook_event ev[8];
  size_t got = 0;
  for (int tries = 0; tries < 50 && got == 0; tries++) {
    grove_prediction p;
    predict(c, &o, &p);
    grove_prediction_fini(&p);
    got = collect(w, ev, 8, 1, 0.2);
  }
  ck_assert_uint_eq(got, 1);
  /* Events of one batch go out together: whatever else this batch made for
   * module 4 is here by the time a short wait runs out. */
  got += collect(w, ev + got, 8 - got, 8, 0.3);
  for (size_t i = 0; i < got; i++) {
    ck_assert_str_eq(ev[i].module, "4");
    ck_assert_uint_eq(ev[i].hook_id, ids[4]);
  }
  fini_events(ev, got);
  grove_watch_close(w);
  remove_all_hooks(c);
  grove_client_close(c);
  grove_sd_free(o.sd);
}
END_TEST

START_TEST(every_and_sampling) {
  grove_client *c = connect_rpc(&S);
  remove_all_hooks(c);
  io o;
  io_load(&o);
  grove_watch *w = watch_open(&S, "net", NULL);
  watch_ready(w, c, &o);
  grove_hook_spec every = {.model = "net", .pattern = "4", .every = 3};
  grove_hook_spec half = {.model = "net", .pattern = "5", .sample_rate = 0.5};
  uint64_t id_every = 0, id_half = 0;
  grove_err err = {0};
  ck_assert_ok(grove_client_register_hook(c, &every, 10000, &id_every, NULL, &err), &err);
  ck_assert_ok(grove_client_register_hook(c, &half, 10000, &id_half, NULL, &err), &err);
  for (int i = 0; i < 30; i++) {
    grove_prediction p;
    predict(c, &o, &p);
    grove_prediction_fini(&p);
  }
  /* 30 batches: 10 events of 3 batches from "4"; "5" in between. */
  grove_hook_event evs[64];
  size_t got = collect(w, evs, 64, 64, 3.0);
  size_t n_every = 0, n_half = 0;
  uint64_t last_seq = 0;
  for (size_t i = 0; i < got; i++) {
    if (evs[i].hook_id == id_every) {
      n_every++;
      ck_assert_uint_eq(evs[i].batches, 3);
      ck_assert_uint_eq(evs[i].rows, 48);
      ck_assert_uint_eq(evs[i].count, 48 * 6);
      ck_assert_uint_eq(evs[i].sequence, last_seq + 1);
      last_seq = evs[i].sequence;
    } else {
      ck_assert_uint_eq(evs[i].hook_id, id_half);
      ck_assert_uint_eq(evs[i].batches, 1);
      n_half++;
    }
  }
  ck_assert_uint_eq(n_every, 10);
  ck_assert_msg(n_half > 0 && n_half < 30, "sampling at 0.5 took %zu of 30 batches", n_half);
  fini_events(evs, got);
  /* ListHooks counts what was published. */
  grove_hook_info *hs = NULL;
  size_t n = 0;
  ck_assert_ok(grove_client_list_hooks(c, "net", 10000, &hs, &n, &err), &err);
  ck_assert_uint_eq(n, 2);
  ck_assert_uint_eq(hs[0].events_published, 10);
  ck_assert_uint_eq(hs[0].every, 3);
  ck_assert_double_eq(hs[1].sample_rate, 0.5);
  grove_hook_infos_free(hs, n);
  remove_all_hooks(c);
  grove_watch_close(w);
  grove_client_close(c);
  grove_sd_free(o.sd);
  ck_assert_double_gt(metric(S.http_port, "grove_hook_events_published_total{model=\"net\"} "), 10);
}
END_TEST

/* Two models on one worker, batches alternating: each keeps its own
 * intervals (a worker's accumulators are per model). */
START_TEST(two_models_keep_their_intervals) {
  server sv;
  char second[4200];
  snprintf(second, sizeof second, "net2=%s", grove_fixture("telemetry_net"));
  const char *extra[] = {"--model", second, NULL};
  server_start(&sv, extra);
  grove_client *c = connect_rpc(&sv);
  io o;
  io_load(&o);
  grove_watch *w = watch_open(&sv, NULL, NULL);
  watch_ready(w, c, &o);
  grove_err err = {0};
  uint64_t ids[2];
  const char *models[] = {"net", "net2"};
  for (int k = 0; k < 2; k++) {
    grove_hook_spec sp = {.model = models[k], .pattern = "4", .every = 2};
    ck_assert_ok(grove_client_register_hook(c, &sp, 10000, &ids[k], NULL, &err), &err);
  }
  for (int i = 0; i < 8; i++) {
    grove_prediction p;
    ck_assert_ok(grove_client_predict(c, models[i % 2], o.x, 1, 10000, &p, &err), &err);
    grove_prediction_fini(&p);
  }
  grove_hook_event evs[8];
  size_t got = collect(w, evs, 8, 4, 10.0);
  ck_assert_uint_eq(got, 4);
  int per[2] = {0, 0};
  for (size_t i = 0; i < got; i++) {
    int k = strcmp(evs[i].model, "net2") == 0;
    ck_assert_uint_eq(evs[i].hook_id, ids[k]);
    ck_assert_uint_eq(evs[i].batches, 2);
    ck_assert_uint_eq(evs[i].rows, 32);
    per[k]++;
  }
  ck_assert_int_eq(per[0], 2);
  ck_assert_int_eq(per[1], 2);
  fini_events(evs, got);
  grove_watch_close(w);
  grove_client_close(c);
  grove_sd_free(o.sd);
  ck_assert_int_eq(server_stop(&sv), 0);
}
END_TEST

/* ============================================================ reload */

static server R;

static grove_hook_info *find_hook(grove_hook_info *hs, size_t n, uint64_t id) {
  for (size_t i = 0; i < n; i++)
    if (hs[i].id == id) return &hs[i];
  return NULL;
}

START_TEST(hooks_survive_reload) {
  server_start(&R, NULL);
  grove_client *c = connect_rpc(&R);
  io o;
  io_load(&o);
  uint64_t exact = add_hook(c, "3.2.0", GROVE_HOOK_FORWARD, NULL);
  uint64_t glob = add_hook(c, "3.*", GROVE_HOOK_FORWARD, NULL);
  grove_watch *w = watch_open(&R, "net", NULL);
  watch_ready(w, c, &o);

  /* Another architecture under the same name: "3.2.0" is gone, "3.*"
   * matches two modules. */
  char v2[4096];
  snprintf(v2, sizeof v2, "%s", grove_fixture("telemetry_net_v2"));
  grove_reload_opts ro = {.model_dir = v2};
  grove_reload_result res;
  grove_err err = {0};
  ck_assert_ok(grove_client_reload(c, "net", &ro, 30000, &res, &err), &err);
  ck_assert_int_eq(res.version, 2);
  grove_reload_result_fini(&res);
  grove_hook_event evs[32];
  size_t got = 0;
  for (int tries = 0; tries < 50 && got < 2; tries++) {
    grove_prediction p;
    predict(c, &o, &p);
    grove_prediction_fini(&p);
    got += collect(w, evs + got, 32 - got, 2 - got, 0.2);
  }
  ck_assert_uint_eq(got, 2);
  got += collect(w, evs + got, 32 - got, 32, 0.3); /* anything else of that batch */
  for (size_t i = 0; i < got; i++) {
    ck_assert_int_eq(evs[i].version, 2);
    ck_assert_uint_eq(evs[i].hook_id, glob);
    ck_assert_msg(strcmp(evs[i].module, "3.0") == 0 || strcmp(evs[i].module, "3.1") == 0,
                  "an event for '%s' from version 2", evs[i].module);
  }
  fini_events(evs, got);
  grove_hook_info *hs = NULL;
  size_t n = 0;
  ck_assert_ok(grove_client_list_hooks(c, "net", 10000, &hs, &n, &err), &err);
  ck_assert_uint_eq(n, 2);
  grove_hook_info *he = find_hook(hs, n, exact), *hg = find_hook(hs, n, glob);
  ck_assert_ptr_nonnull(he);
  ck_assert_ptr_nonnull(hg);
  ck_assert_uint_eq(he->nmodules, 0);
  ck_assert_int_eq(he->version, 2);
  ck_assert_ptr_nonnull(strstr(he->note, "matches no module"));
  ck_assert_uint_eq(hg->nmodules, 2);
  grove_hook_infos_free(hs, n);
  ck_assert(log_contains(&R, "telemetry.unmatched"));

  /* Back to the first architecture: the exact path matches again. */
  char v1[4096];
  snprintf(v1, sizeof v1, "%s", grove_fixture("telemetry_net"));
  ro.model_dir = v1;
  ck_assert_ok(grove_client_reload(c, "net", &ro, 30000, &res, &err), &err);
  ck_assert_int_eq(res.version, 3);
  grove_reload_result_fini(&res);
  got = 0;
  bool exact_seen = false;
  for (int tries = 0; tries < 50 && !exact_seen; tries++) {
    grove_prediction p;
    predict(c, &o, &p);
    grove_prediction_fini(&p);
    size_t k = collect(w, evs, 32, 5, 0.2);
    for (size_t i = 0; i < k; i++) {
      ck_assert_int_eq(evs[i].version, 3);
      if (evs[i].hook_id == exact) {
        ck_assert_str_eq(evs[i].module, "3.2.0");
        exact_seen = true;
      }
    }
    fini_events(evs, k);
  }
  ck_assert(exact_seen);
  ck_assert_ok(grove_client_list_hooks(c, "net", 10000, &hs, &n, &err), &err);
  he = find_hook(hs, n, exact);
  ck_assert_uint_eq(he->nmodules, 1);
  ck_assert_int_eq(he->version, 3);
  ck_assert_str_eq(he->note, "");
  grove_hook_infos_free(hs, n);
  ck_assert(log_contains(&R, "telemetry.matched"));
  grove_watch_close(w);
  grove_client_close(c);
  grove_sd_free(o.sd);
  ck_assert_int_eq(server_stop(&R), 0);
}
END_TEST

/* ============================================================ slow */

/* A subscriber stuck for good: it connects to the PUB socket's ipc path,
 * says "I am an SP sub" (the 8-byte SP header: 0, 'S', 'P', 0, protocol 33
 * big-endian, 2 reserved bytes) and never reads a byte, so that the socket
 * buffers fill and groved's side of the connection stalls.  (An NNG SUB
 * socket whose owner never calls receive is no such test: it drops in its
 * own queue, which groved cannot see, and NNG 1.5.2's nng_close can hang on
 * it, nanomsg/nng#1543.) */
static int stuck_subscriber(const char *pub_url) {
  int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  ck_assert_int_ge(fd, 0);
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  snprintf(a.sun_path, sizeof a.sun_path, "%.100s", pub_url + strlen("ipc://"));
  ck_assert_int_eq(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
  static const unsigned char hello[8] = {0, 'S', 'P', 0, 0, 33, 0, 0};
  ck_assert_int_eq(write(fd, hello, sizeof hello), 8);
  return fd;
}

START_TEST(subscriber_that_never_reads) {
  server sv;
  const char *extra[] = {"--workers", "2", NULL};
  server_start(&sv, extra);
  int stuck = stuck_subscriber(sv.pub);
  for (int i = 0; i < 500 && metric(sv.http_port, "grove_hook_subscribers ") < 1; i++) sleep_ms(10);
  ck_assert_double_eq(metric(sv.http_port, "grove_hook_subscribers "), 1);

  grove_client *c = connect_rpc(&sv);
  io o;
  io_load(&o);
  grove_hook_spec sp = {.model = "net",
                        .pattern = "**",
                        .per_feature = true,
                        .histogram_bins = 256,
                        .histogram_min = -4,
                        .histogram_max = 4};
  grove_err err = {0};
  ck_assert_ok(grove_client_register_hook(c, &sp, 10000, NULL, NULL, &err), &err);
  sp.kind = GROVE_HOOK_FORWARD_PRE;
  ck_assert_ok(grove_client_register_hook(c, &sp, 10000, NULL, NULL, &err), &err);
  /* ~24 events of ~3 KB per predict: far more than the socket buffers and
   * NNG's queue hold.  Every predict must still be answered. */
  for (int i = 0; i < 1000; i++) {
    grove_prediction p;
    ck_assert_ok(grove_client_predict(c, "net", o.x, 1, 30000, &p, &err), &err);
    grove_prediction_fini(&p);
  }
  double dropped = 0;
  for (int i = 0; i < 100 && dropped <= 0; i++) {
    dropped = metric(sv.http_port, "grove_hook_events_dropped_total{reason=\"subscriber\"} ");
    if (dropped <= 0) sleep_ms(100);
  }
  double published = metric(sv.http_port, "grove_hook_events_published_total{model=\"net\"} ");
  ck_assert_msg(dropped > 0, "no event counted as dropped (published %g)", published);
  ck_assert_double_le(dropped, published);
  ck_assert_double_eq(metric(sv.http_port, "grove_requests_total{model=\"net\",status=\"OK\",protocol=\"grove\"} "),
                      1000);
  ck_assert(!log_contains(&sv, " error "));
  close(stuck);
  grove_client_close(c);
  grove_sd_free(o.sd);
  ck_assert_int_eq(server_stop(&sv), 0);
}
END_TEST

/* ============================================================ off */

START_TEST(pub_none_refuses_hooks) {
  server sv;
  const char *extra[] = {"--pub", "none", NULL};
  server_start(&sv, extra);
  grove_client *c = connect_rpc(&sv);
  grove_hook_spec sp = {.model = "net", .pattern = "**"};
  grove_err err = {0};
  ck_assert_status(grove_client_register_hook(c, &sp, 10000, NULL, NULL, &err),
                   GROVE_E_FAILED_PRECONDITION);
  ck_assert_ptr_nonnull(strstr(err.msg, "--pub none"));
  grove_hook_info *hs = NULL;
  size_t n = 9;
  ck_assert_ok(grove_client_list_hooks(c, NULL, 10000, &hs, &n, &err), &err);
  ck_assert_uint_eq(n, 0);
  grove_hook_infos_free(hs, n);
  ck_assert_status(grove_client_remove_hook(c, 1, 10000, NULL, &err), GROVE_E_NOT_FOUND);
  /* Predicts are served as ever. */
  io o;
  io_load(&o);
  grove_prediction p;
  predict(c, &o, &p);
  grove_prediction_fini(&p);
  grove_client_close(c);
  grove_sd_free(o.sd);
  ck_assert_int_eq(server_stop(&sv), 0);
}
END_TEST

static Suite *telemetry_suite(void) {
  Suite *s = suite_create("telemetry");
  TCase *core = tcase_create("core");
  tcase_add_test(core, patterns);
  tcase_add_test(core, stats_math);
  tcase_add_test(core, observer_sees_everything_and_changes_nothing);
  suite_add_tcase(s, core);

  TCase *serve = tcase_create("serve");
  tcase_add_unchecked_fixture(serve, s_setup, s_teardown);
  tcase_set_timeout(serve, 120);
  tcase_add_test(serve, stats_equal_torch);
  tcase_add_test(serve, predictions_unchanged);
  tcase_add_test(serve, globs_and_removal);
  tcase_add_test(serve, every_and_sampling);
  suite_add_tcase(s, serve);

  TCase *models = tcase_create("models");
  tcase_set_timeout(models, 60);
  tcase_add_test(models, two_models_keep_their_intervals);
  suite_add_tcase(s, models);

  TCase *reload = tcase_create("reload");
  tcase_set_timeout(reload, 120);
  tcase_add_test(reload, hooks_survive_reload);
  suite_add_tcase(s, reload);

  TCase *slow = tcase_create("slow");
  tcase_set_timeout(slow, 120);
  tcase_add_test(slow, subscriber_that_never_reads);
  suite_add_tcase(s, slow);

  TCase *off = tcase_create("off");
  tcase_set_timeout(off, 60);
  tcase_add_test(off, pub_none_refuses_hooks);
  suite_add_tcase(s, off);
  return s;
}

GROVE_TEST_MAIN(telemetry_suite)
