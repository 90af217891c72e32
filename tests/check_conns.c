/* check_conns.c: groved's connections (server/conns.c, server/http.c) and
 * libgrove-client's handling of a connection that drops (client/client.c).
 *
 *   - a flood of idle connections, more than the descriptor limit allows,
 *     leaves predict and /healthz answering and groved's CPU quiet;
 *   - --idle-timeout closes idle connections on the data listener and on
 *     HTTP, never one with a request in flight;
 *   - at --max-connections a new connection closes the quietest, and is
 *     refused when every connection has a request in flight;
 *   - calls in flight when groved is killed fail with UNAVAILABLE at once,
 *     not when their timeout runs out.
 *
 * Idle connections are made by hand: a TCP connection that sends the SP
 * header of a req0 socket (what NNG's tcp transport expects) and nothing
 * else, so it is a full NNG pipe on groved's side and never redials when
 * groved closes it.  Every wait is bounded; no assertion is about speed: the
 * CPU check compares with a busy core, and the prompt failure with half the
 * call's timeout. */
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>

#include "groved_harness.h"

/* ============================================================ helpers */

/* h_start, with groved killed when the test ends however it ends (a
 * failed assertion included: a groved left behind could spin). */
static void start(hserver *s, const char *const *extra) {
  const hstart_opts opts = {.die_with_test = true};
  h_start_with(s, &opts, extra);
}

/* A model fixture as NAME=DIR for --model. */
static const char *model_arg(void) {
  static char buf[4200];
  snprintf(buf, sizeof buf, "server_mlp=%s", grove_fixture("server_mlp"));
  return buf;
}

/* The status of GET path on a new connection to port, every step bounded
 * (2 s for the connect, 2 s per read: h_http's connect is not); -1 when
 * nothing answers. */
static int http_status(int port, const char *path) {
  int fd = h_tcp_connect(port);
  if (fd < 0) return -1;
  char req[256], buf[512];
  int n =
      snprintf(req, sizeof req, "GET %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", path);
  int code = -1;
  if (write(fd, req, (size_t)n) == n) {
    ssize_t r = read(fd, buf, sizeof buf - 1);
    if (r > 0) {
      buf[r] = 0;
      sscanf(buf, "HTTP/1.%*d %d", &code);
    }
  }
  close(fd);
  return code;
}

/* User plus system CPU seconds of process pid so far. */
static double cpu_seconds(pid_t pid) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  /* Read by hand: /proc files have no size for grove_test_read_file. */
  FILE *f = fopen(path, "r");
  ck_assert_ptr_nonnull(f);
  char text[2048];
  size_t len = fread(text, 1, sizeof text - 1, f);
  fclose(f);
  text[len] = 0;
  /* Fields after the command name (which may hold spaces, in parentheses):
   * state is field 3, utime 14, stime 15. */
  char *p = strrchr(text, ')');
  ck_assert_ptr_nonnull(p);
  unsigned long long ut = 0, st = 0;
  int n = sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st);
  ck_assert_int_eq(n, 2);
  return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

static grove_status predict_one(grove_client *c, const hio *o, int timeout_ms, grove_err *err) {
  grove_tensor in = h_rows(o->x, 0, 1);
  grove_prediction p;
  grove_status s = grove_client_predict(c, "server_mlp", &in, 1, timeout_ms, &p, err);
  if (s == GROVE_OK) {
    ck_assert_msg(p.noutputs == 1 && h_rows_match(p.outputs[0], o->y, 0, 1),
                  "predict answered rows that are not torch's");
    grove_prediction_fini(&p);
  }
  return s;
}

/* ============================================================ tests */

#define NOFILE 256
#define FLOOD 300 /* per listener: more than NOFILE on each alone */

START_TEST(idle_flood_leaves_predict_and_healthz_answering) {
  /* groved with 256 descriptors, then 300 idle SP connections to its data
   * listener and 300 idle TCP connections to its HTTP port.  Before
   * conns.c, about 239 of them used every descriptor: predict and /healthz
   * failed and groved spun at 100% CPU on accept's EMFILE. */
  hserver s;
  const hstart_opts opts = {.nofile = NOFILE, .die_with_test = true};
  const char *extra[] = {"--model", model_arg(), NULL};
  h_start_with(&s, &opts, extra);
  int port = atoi(strrchr(s.tcp, ':') + 1);
  static int data_fds[FLOOD], http_fds[FLOOD];
  int ndata = 0, nhttp = 0;
  bool answering = true;
  /* A listener that stops accepting (groved out of descriptors) fills its
   * backlog and then connects time out: the flood of that listener stops at
   * the first that does. */
  bool data_up = true, http_up = true;
  for (int i = 0; i < FLOOD && (data_up || http_up); i++) {
    int fd = data_up ? h_sp_connect(port, &answering) : -1;
    if (fd >= 0)
      data_fds[ndata++] = fd;
    else
      data_up = false;
    fd = http_up ? h_tcp_connect(s.http_port) : -1;
    if (fd >= 0)
      http_fds[nhttp++] = fd;
    else
      http_up = false;
  }
  /* The kernel completes the flood's handshakes before groved takes them
   * from its backlog: wait until groved has (its evictions stop moving), so
   * that the client below is not one that a later flood connection evicts
   * as the quietest before its first request (docs/operations.md,
   * "Connections": a flood still arriving can close a quiet client's
   * connection, and its request in flight fails with UNAVAILABLE). */
  double ev = -1, ev_now = h_metric(&s, "groved_connections_evicted_total{listener=\"data\"}");
  for (int k = 0; k < 100 && ev_now != ev; k++) {
    ev = ev_now;
    h_sleep_ms(300);
    ev_now = h_metric(&s, "groved_connections_evicted_total{listener=\"data\"}");
  }
  /* /healthz answers on a new connection (the quietest idle one makes
   * room), and so does a new client. */
  int code = http_status(s.http_port, "/healthz");
  ck_assert_msg(code == 200, "/healthz under the flood answered %d", code);
  hio o;
  h_io_load("server_mlp", &o);
  grove_err err = {0};
  grove_client *c = NULL;
  const char *urls[] = {s.tcp};
  grove_status os = grove_client_open(urls, 1, NULL, &c, &err);
  ck_assert_msg(os == GROVE_OK, "cannot connect to groved under the flood: %s",
                grove_err_msg(&err));
  ck_assert_ok(predict_one(c, &o, 10000, &err), &err);
  /* Quiet: over 3 s, far less CPU than a core spinning (3 s). */
  double c0 = cpu_seconds(s.pid), t0 = h_now();
  h_sleep_ms(3000);
  double used = cpu_seconds(s.pid) - c0, wall = h_now() - t0;
  ck_assert_msg(used < 0.25 * wall, "groved used %.2f s of CPU in %.2f s with idle connections",
                used, wall);
  /* Still answering after the interval, and within its caps. */
  ck_assert_ok(predict_one(c, &o, 10000, &err), &err);
  double open = h_metric(&s, "groved_connections{listener=\"data\"}");
  double cap = h_metric(&s, "groved_connections_max{listener=\"data\"}");
  ck_assert_msg(cap > 0 && cap < NOFILE, "data cap %.0f with %d descriptors", cap, NOFILE);
  ck_assert_msg(open <= cap + cap / 8 + 8, "%.0f data connections open, cap %.0f", open, cap);
  ck_assert_msg(h_metric(&s, "groved_connections_evicted_total{listener=\"data\"}") > 0,
                "no idle data connection made room for a new one");
  ck_assert_msg(h_metric(&s, "groved_connections_evicted_total{listener=\"http\"}") > 0,
                "no idle HTTP connection made room for a new one");
  ck_assert_msg(h_metric(&s, "groved_fd_limit") == NOFILE, "groved_fd_limit is not %d", NOFILE);
  grove_client_close(c);
  for (int i = 0; i < ndata; i++) close(data_fds[i]);
  for (int i = 0; i < nhttp; i++) close(http_fds[i]);
  h_io_free(&o);
  ck_assert_int_eq(h_stop(&s), 0);
}
END_TEST

START_TEST(idle_connections_close_after_the_timeout) {
  /* --idle-timeout 1: quiet connections on the data listener and on HTTP
   * are closed; a predict that takes 3 s (the batch delay) keeps its
   * connection and is answered. */
  hserver s;
  const char *extra[] = {"--model",   model_arg(), "--idle-timeout",        "1",
                         "--workers", "1",         "--test-batch-delay-ms", "3000",
                         NULL};
  start(&s, extra);
  int port = atoi(strrchr(s.tcp, ':') + 1);
  enum { N = 5 };
  int fds[2 * N];
  bool answering = true;
  for (int i = 0; i < N; i++) {
    fds[i] = h_sp_connect(port, &answering);
    fds[N + i] = h_tcp_connect(s.http_port);
    ck_assert_int_ge(fds[i], 0);
    ck_assert_int_ge(fds[N + i], 0);
  }
  hio o;
  h_io_load("server_mlp", &o);
  grove_client *c = h_connect(s.tcp);
  grove_err err = {0};
  ck_assert_ok(predict_one(c, &o, 20000, &err), &err);
  double deadline = h_now() + 20;
  int closed = 0;
  while (closed < 2 * N && h_now() < deadline) {
    closed = 0;
    for (int i = 0; i < 2 * N; i++) closed += h_peer_closed(fds[i]);
    if (closed < 2 * N) h_sleep_ms(50);
  }
  ck_assert_msg(closed == 2 * N, "%d of %d idle connections closed after 20 s", closed, 2 * N);
  ck_assert_msg(h_metric(&s, "groved_connections_idle_closed_total{listener=\"data\"}") >= N,
                "fewer than %d idle data connections counted", N);
  ck_assert_msg(h_metric(&s, "groved_connections_idle_closed_total{listener=\"http\"}") >= N,
                "fewer than %d idle HTTP connections counted", N);
  /* The client's own connection was closed too while it was quiet; it
   * redials, and the next predict is answered. */
  ck_assert_ok(predict_one(c, &o, 20000, &err), &err);
  grove_client_close(c);
  for (int i = 0; i < 2 * N; i++) close(fds[i]);
  h_io_free(&o);
  ck_assert_int_eq(h_stop(&s), 0);
}
END_TEST

typedef struct call_result {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int done;
  grove_status status[4];
  char msg[4][256];
  double at[4];
} call_result;

static call_result results = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};

static void record(int i, grove_status s, const grove_err *err) {
  pthread_mutex_lock(&results.mu);
  results.status[i] = s;
  snprintf(results.msg[i], sizeof results.msg[i], "%s", err ? grove_err_msg(err) : "");
  results.at[i] = h_now();
  results.done++;
  pthread_cond_broadcast(&results.cv);
  pthread_mutex_unlock(&results.mu);
}

static void async_cb(void *arg, grove_status s, grove_prediction *p, const grove_err *err) {
  if (p) grove_prediction_fini(p);
  record((int)(intptr_t)arg, s, err);
}

typedef struct sync_call {
  grove_client *c;
  const hio *o;
} sync_call;

static void *sync_main(void *arg) {
  sync_call *sc = arg;
  grove_err err = {0};
  grove_tensor in = h_rows(sc->o->x, 0, 1);
  grove_prediction p;
  grove_status s = grove_client_predict(sc->c, "server_mlp", &in, 1, 20000, &p, &err);
  if (s == GROVE_OK) grove_prediction_fini(&p);
  record(0, s, &err);
  return NULL;
}

START_TEST(max_connections_evicts_the_quietest_and_refuses_when_all_busy) {
  /* --max-connections 2: a third connection closes the quietest (an idle
   * hand-made one, the oldest); with both connections holding a predict in
   * flight (the batch sleeps 3 s), a new one is refused, and the predicts
   * are answered. */
  hserver s;
  const char *extra[] = {"--model",   model_arg(), "--max-connections",     "2",
                         "--workers", "1",         "--test-batch-delay-ms", "3000",
                         NULL};
  start(&s, extra);
  int port = atoi(strrchr(s.tcp, ':') + 1);
  bool answering = true;
  int idle = h_sp_connect(port, &answering);
  ck_assert_int_ge(idle, 0);
  ck_assert_msg(h_wait_metric(&s, "groved_connections{listener=\"data\"}", 1, 10) == 1,
                "the idle connection is not counted");
  grove_client *c1 = h_connect(s.tcp);
  grove_client *c2 = h_connect(s.tcp);
  double deadline = h_now() + 10;
  while (!h_peer_closed(idle) && h_now() < deadline) h_sleep_ms(20);
  ck_assert_msg(h_peer_closed(idle), "the quietest connection was not closed for a new one");
  ck_assert_msg(h_metric(&s, "groved_connections_evicted_total{listener=\"data\"}") >= 1,
                "no eviction counted");
  hio o;
  h_io_load("server_mlp", &o);
  grove_tensor in = h_rows(o.x, 0, 1);
  grove_err err = {0};
  results.done = 0;
  ck_assert_ok(grove_client_predict_async(c1, "server_mlp", &in, 1, 30000, async_cb,
                                          (void *)(intptr_t)0, &err),
               &err);
  ck_assert_ok(grove_client_predict_async(c2, "server_mlp", &in, 1, 30000, async_cb,
                                          (void *)(intptr_t)1, &err),
               &err);
  ck_assert_msg(h_wait_metric(&s, "grove_inflight_requests", 2, 10) == 2,
                "the two predicts did not reach groved");
  int late = h_sp_connect(port, &answering);
  ck_assert_int_ge(late, 0);
  deadline = h_now() + 10;
  while (!h_peer_closed(late) && h_now() < deadline) h_sleep_ms(20);
  ck_assert_msg(h_peer_closed(late), "a connection over the cap was let in with every one busy");
  ck_assert_msg(h_metric(&s, "groved_connections_refused_total{listener=\"data\"}") >= 1,
                "no refusal counted");
  grove_client_wait_idle(c1);
  grove_client_wait_idle(c2);
  ck_assert_int_eq(results.done, 2);
  for (int i = 0; i < 2; i++)
    ck_assert_msg(results.status[i] == GROVE_OK, "predict %d: %s (%s)", i,
                  grove_status_name(results.status[i]), results.msg[i]);
  close(idle);
  close(late);
  grove_client_close(c1);
  grove_client_close(c2);
  h_io_free(&o);
  ck_assert_int_eq(h_stop(&s), 0);
}
END_TEST

START_TEST(killed_server_fails_calls_in_flight_at_once) {
  /* One synchronous and three asynchronous predicts, each with a 20 s
   * timeout, sit in a batch that sleeps 30 s when groved is killed: all four
   * fail with UNAVAILABLE, found on the client side, well within half their
   * timeout (NNG 1.5.2 fails most such requests itself; the client now
   * fails every call in flight when its last connection goes).  Calls made
   * afterwards fail as promptly. */
  hserver s;
  const char *extra[] = {"--model", model_arg(), "--workers", "1", "--test-batch-delay-ms",
                         "30000",   NULL};
  start(&s, extra);
  hio o;
  h_io_load("server_mlp", &o);
  grove_client *c = h_connect(s.tcp);
  grove_client *watcher = h_connect(s.tcp);
  results.done = 0;
  sync_call sc = {c, &o};
  pthread_t th;
  ck_assert_int_eq(pthread_create(&th, NULL, sync_main, &sc), 0);
  grove_err err = {0};
  grove_tensor in = h_rows(o.x, 0, 1);
  for (int i = 1; i < 4; i++)
    ck_assert_ok(grove_client_predict_async(c, "server_mlp", &in, 1, 20000, async_cb,
                                            (void *)(intptr_t)i, &err),
                 &err);
  /* All four reached groved (in flight there) before the kill. */
  double deadline = h_now() + 15;
  for (;;) {
    grove_server_status *st = NULL;
    ck_assert_ok(grove_client_status(watcher, 5000, &st, &err), &err);
    uint64_t inflight = st->inflight;
    grove_server_status_free(st);
    if (inflight == 4) break;
    ck_assert_msg(h_now() < deadline, "only %llu of 4 predicts reached groved",
                  (unsigned long long)inflight);
    h_sleep_ms(10);
  }
  double t_kill = h_now();
  ck_assert_int_eq(kill(s.pid, SIGKILL), 0);
  h_wait(&s, 10);
  pthread_mutex_lock(&results.mu);
  while (results.done < 4 && h_now() < t_kill + 30) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += 1;
    pthread_cond_timedwait(&results.cv, &results.mu, &ts);
  }
  int done = results.done;
  pthread_mutex_unlock(&results.mu);
  pthread_join(th, NULL);
  ck_assert_int_eq(done, 4);
  for (int i = 0; i < 4; i++) {
    ck_assert_msg(results.status[i] == GROVE_E_UNAVAILABLE, "call %d: %s (%s)", i,
                  grove_status_name(results.status[i]), results.msg[i]);
    ck_assert_msg(results.at[i] - t_kill < 10.0,
                  "call %d failed %.1f s after the kill (timeout 20 s): %s", i,
                  results.at[i] - t_kill, results.msg[i]);
    grove_err e = {.code = results.status[i]};
    snprintf(e.msg, sizeof e.msg, "%s", results.msg[i]);
    ck_assert(grove_client_failed_locally(results.status[i], &e));
  }
  /* Calls made now, with groved gone, fail as promptly (they wait a short
   * grace for the redial, not their 20 s): before, each waited 20 s. */
  results.done = 0;
  double t1 = h_now();
  grove_prediction p;
  grove_status rs = grove_client_predict(c, "server_mlp", &in, 1, 20000, &p, &err);
  ck_assert_status(rs, GROVE_E_UNAVAILABLE);
  ck_assert(grove_client_failed_locally(rs, &err));
  ck_assert_msg(h_now() - t1 < 10.0, "a predict with groved gone failed after %.1f s: %s",
                h_now() - t1, grove_err_msg(&err));
  grove_server_status *st = NULL;
  t1 = h_now();
  ck_assert_status(grove_client_status(c, 20000, &st, &err), GROVE_E_UNAVAILABLE);
  ck_assert_msg(h_now() - t1 < 10.0, "status with groved gone failed after %.1f s: %s",
                h_now() - t1, grove_err_msg(&err));
  t1 = h_now();
  ck_assert_ok(grove_client_predict_async(c, "server_mlp", &in, 1, 20000, async_cb,
                                          (void *)(intptr_t)1, &err),
               &err);
  grove_client_wait_idle(c);
  ck_assert_int_eq(results.done, 1);
  ck_assert_status(results.status[1], GROVE_E_UNAVAILABLE);
  ck_assert_msg(results.at[1] - t1 < 10.0, "an async predict with groved gone failed after %.1f s",
                results.at[1] - t1);
  grove_client_close(watcher);
  grove_client_close(c);
  h_io_free(&o);
  h_stop(&s);
}
END_TEST

Suite *conns_suite(void) {
  Suite *s = suite_create("conns");
  TCase *t = tcase_create("conns");
  tcase_set_timeout(t, 120);
  tcase_add_test(t, idle_flood_leaves_predict_and_healthz_answering);
  tcase_add_test(t, idle_connections_close_after_the_timeout);
  tcase_add_test(t, max_connections_evicts_the_quietest_and_refuses_when_all_busy);
  tcase_add_test(t, killed_server_fails_calls_in_flight_at_once);
  suite_add_tcase(s, t);
  return s;
}

GROVE_TEST_MAIN(conns_suite)
