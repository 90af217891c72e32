/* check_spclient.c: libgrove-client's SP transport (client/client_sp.c,
 * the default; docs/operations.md, "The client's transport").
 *
 *   - against groved on both listeners (--data-io loop and nng), over
 *     tcp:// and ipc://: predicts answered with torch's rows, synchronous
 *     from many threads and asynchronous from many threads at once, every
 *     callback run; a call past its timeout is DEADLINE_EXCEEDED ("no
 *     reply"); the admin plane (NNG rep0) answers through the same client;
 *   - against a plain NNG rep0 socket (tcp and ipc): a call answered;
 *   - a server killed with asynchronous calls in flight: each fails with
 *     UNAVAILABLE at once, a call with no server is UNAVAILABLE ("not back
 *     within"), and a groved started again on the URL is redialed;
 *   - two replicas, one killed under asynchronous load: every call answered
 *     (sent again on the other); a replica down at open joins when it is up;
 *   - a tiny fake server for the hostile cases: a handshake that is not SP,
 *     one of another protocol (open fails saying which), a reply longer
 *     than the client's bound, one without its request id, a connection
 *     closed in the middle of a reply (the call fails saying which), a
 *     reply of an id nobody asked (dropped; the real one is taken);
 *   - GROVE_CLIENT_IO names the transport, and a bad value is refused.
 * Every wait is bounded; nothing times anything. */
#include <pthread.h>
#include <stdatomic.h>
#include <sys/un.h>

#include "groved_harness.h"

#include <nng/protocol/reqrep0/rep.h>

/* ============================================================ helpers */

static const char *model_arg(void) {
  static char buf[4200];
  snprintf(buf, sizeof buf, "server_mlp=%s", grove_fixture("server_mlp"));
  return buf;
}

static void start_io(hserver *s, const char *io, const char *const *extra) {
  const char *argv[20] = {"--data-io", io, "--model", model_arg(), "--workers", "1", "--pub", "none"};
  int n = 8;
  for (int i = 0; extra && extra[i] && n < 19; i++) argv[n++] = extra[i];
  argv[n] = NULL;
  const hstart_opts o = {.no_pub = true, .no_debug_log = true, .die_with_test = true};
  h_start_with(s, &o, argv);
}

static grove_client *open_url(const char *url) {
  return h_connect(url);
}

/* One synchronous predict of row r: true when torch's row came back. */
static bool predict_row(grove_client *c, const hio *o, int64_t r, grove_err *err) {
  grove_tensor in = h_rows(o->x, r, 1);
  grove_prediction p;
  grove_status s = grove_client_predict(c, "server_mlp", &in, 1, 20000, &p, err);
  if (s) return false;
  bool ok = p.noutputs == 1 && h_rows_match(p.outputs[0], o->y, r, 1);
  grove_prediction_fini(&p);
  return ok;
}

/* Asynchronous predicts: the callbacks' tally. */
typedef struct tally {
  const hio *o;
  atomic_int ok, wrong, failed, done, sent;
  atomic_int first; /* the first failure's status */
  char why[512];
  atomic_flag why_set;
} tally;

typedef struct acall_arg {
  tally *t;
  int64_t row;
} acall_arg;

static void on_reply(void *arg, grove_status s, grove_prediction *p, const grove_err *err) {
  acall_arg *a = arg;
  tally *t = a->t;
  if (s) {
    atomic_fetch_add(&t->failed, 1);
    int zero = 0;
    atomic_compare_exchange_strong(&t->first, &zero, (int)s);
    if (!atomic_flag_test_and_set(&t->why_set))
      snprintf(t->why, sizeof t->why, "%s", grove_err_msg(err));
  } else {
    if (p->noutputs == 1 && h_rows_match(p->outputs[0], t->o->y, a->row, 1))
      atomic_fetch_add(&t->ok, 1);
    else
      atomic_fetch_add(&t->wrong, 1);
    grove_prediction_fini(p);
  }
  free(a);
  atomic_fetch_add(&t->done, 1);
}

static grove_status send_async(grove_client *c, tally *t, int64_t row, int timeout_ms,
                               grove_err *err) {
  acall_arg *a = malloc(sizeof *a);
  ck_assert_ptr_nonnull(a);
  *a = (acall_arg){t, row};
  grove_tensor in = h_rows(t->o->x, row, 1);
  grove_status s =
      grove_client_predict_async(c, "server_mlp", &in, 1, timeout_ms, on_reply, a, err);
  if (s) free(a);
  return s;
}

typedef struct athread {
  grove_client *c;
  tally *t;
  int index, n, sent, refused;
} athread;

/* n asynchronous calls, 48 outstanding at most on the tally (groved's
 * queue holds 64). */
static void *async_main(void *arg) {
  athread *w = arg;
  int64_t rows = w->t->o->x->shape[0];
  for (int i = 0; i < w->n; i++) {
    double until = h_now() + 30.0;
    while (atomic_load(&w->t->sent) - atomic_load(&w->t->done) >= 48 && h_now() < until)
      h_sleep_ms(1);
    grove_err err = {0};
    atomic_fetch_add(&w->t->sent, 1);
    if (send_async(w->c, w->t, (w->index * w->n + i) % rows, 20000, &err)) {
      w->refused++;
      atomic_fetch_add(&w->t->done, 1);
    } else {
      w->sent++;
    }
  }
  return NULL;
}

static void *sync_main(void *arg) {
  athread *w = arg;
  int64_t rows = w->t->o->x->shape[0];
  for (int i = 0; i < w->n; i++) {
    grove_err err = {0};
    if (predict_row(w->c, w->t->o, (w->index * w->n + i) % rows, &err))
      atomic_fetch_add(&w->t->ok, 1);
    else
      atomic_fetch_add(&w->t->failed, 1);
  }
  return NULL;
}

/* Threads x (sync, async) calls on one client of url: every one answered
 * with its row. */
static void load_one(const char *url, const hio *o) {
  grove_client *c = open_url(url);
  enum { T = 4, N = 150 };
  tally ta = {.o = o}, ts = {.o = o};
  athread wa[T], ws[T];
  pthread_t tha[T], ths[T];
  for (int i = 0; i < T; i++) {
    wa[i] = (athread){.c = c, .t = &ta, .index = i, .n = N};
    ws[i] = (athread){.c = c, .t = &ts, .index = i, .n = N / 3};
    ck_assert_int_eq(pthread_create(&tha[i], NULL, async_main, &wa[i]), 0);
    ck_assert_int_eq(pthread_create(&ths[i], NULL, sync_main, &ws[i]), 0);
  }
  for (int i = 0; i < T; i++) {
    pthread_join(tha[i], NULL);
    pthread_join(ths[i], NULL);
  }
  grove_client_wait_idle(c);
  ck_assert_msg(atomic_load(&ta.failed) == 0, "%s: %d async calls failed: %s", url,
                atomic_load(&ta.failed), ta.why);
  ck_assert_int_eq(atomic_load(&ta.wrong), 0);
  ck_assert_int_eq(atomic_load(&ta.ok), T * N);
  ck_assert_int_eq(atomic_load(&ts.failed), 0);
  ck_assert_int_eq(atomic_load(&ts.ok), T * (N / 3));
  grove_client_close(c);
}

/* ============================================================ groved */

static void groved_case(const char *io) {
  hserver s;
  start_io(&s, io, NULL);
  hio o;
  h_io_load("server_mlp", &o);
  load_one(s.tcp, &o);
  load_one(s.ipc, &o);

  /* The admin plane (NNG rep0 on groved's admin listener) through the
   * same transport. */
  grove_client *c = open_url(s.ipc);
  grove_err err = {0};
  grove_hook_info *hooks = NULL;
  size_t nh = 9;
  ck_assert_ok(grove_client_list_hooks(c, "server_mlp", 10000, &hooks, &nh, &err), &err);
  ck_assert_uint_eq(nh, 0);
  grove_hook_infos_free(hooks, nh);
  grove_server_status *st = NULL;
  ck_assert_ok(grove_client_status(c, 10000, &st, &err), &err);
  ck_assert(st->ready);
  grove_server_status_free(st);
  grove_client_close(c);
  h_io_free(&o);
  h_stop(&s);
}

START_TEST(groved_loop_listener) {
  groved_case("loop");
}
END_TEST

START_TEST(groved_nng_listener) {
  groved_case("nng");
}
END_TEST

/* A call past its timeout on a slow server: DEADLINE_EXCEEDED, said by the
 * client; the connection serves the next call (its late reply dropped). */
START_TEST(timeout_is_no_reply) {
  hserver s;
  const char *extra[] = {"--test-batch-delay-ms", "400", NULL};
  start_io(&s, "loop", extra);
  hio o;
  h_io_load("server_mlp", &o);
  grove_client *c = open_url(s.ipc);
  grove_tensor in = h_rows(o.x, 0, 1);
  grove_prediction p;
  grove_err err = {0};
  double t0 = h_now();
  grove_status st = grove_client_predict(c, "server_mlp", &in, 1, 100, &p, &err);
  ck_assert_int_eq(st, GROVE_E_DEADLINE_EXCEEDED);
  ck_assert(grove_client_failed_locally(st, &err));
  ck_assert_msg(strstr(grove_err_msg(&err), "no reply"), "%s", grove_err_msg(&err));
  ck_assert_msg(h_now() - t0 < 5.0, "the timeout took %.1f s", h_now() - t0);
  /* An asynchronous one likewise. */
  tally t = {.o = &o};
  ck_assert_ok(send_async(c, &t, 1, 100, &err), &err);
  grove_client_wait_idle(c);
  ck_assert_int_eq(atomic_load(&t.failed), 1);
  ck_assert_int_eq(atomic_load(&t.first), GROVE_E_DEADLINE_EXCEEDED);
  /* The late replies are dropped; the next call gets its own. */
  ck_assert_msg(predict_row(c, &o, 2, &err), "%s", grove_err_msg(&err));
  grove_client_close(c);
  h_io_free(&o);
  h_stop(&s);
}
END_TEST

/* groved killed with asynchronous calls in flight: every one fails with
 * UNAVAILABLE at once; a call while it is gone is UNAVAILABLE after the
 * redial grace; a groved started again on the URL is redialed. */
START_TEST(server_killed_and_back) {
  const char *tmp = grove_test_tmpdir();
  char url[400];
  snprintf(url, sizeof url, "ipc://%s/again.sock", tmp);
  const char *extra[] = {"--listen", url, "--test-batch-delay-ms", "300", NULL};
  hserver s;
  start_io(&s, "loop", extra);
  hio o;
  h_io_load("server_mlp", &o);
  grove_client *c = open_url(url);
  tally t = {.o = &o};
  grove_err err = {0};
  for (int i = 0; i < 20; i++) ck_assert_ok(send_async(c, &t, i, 30000, &err), &err);
  h_sleep_ms(100);
  double t0 = h_now();
  kill(s.pid, SIGKILL);
  h_wait(&s, 10.0);
  grove_client_wait_idle(c);
  ck_assert_msg(h_now() - t0 < 10.0, "the calls waited %.1f s", h_now() - t0);
  ck_assert_int_eq(atomic_load(&t.failed) + atomic_load(&t.ok), 20);
  ck_assert_int_eq(atomic_load(&t.ok), 0);
  ck_assert_int_eq(atomic_load(&t.first), GROVE_E_UNAVAILABLE);
  grove_tensor in = h_rows(o.x, 0, 1);
  grove_prediction p;
  grove_status st = grove_client_predict(c, "server_mlp", &in, 1, 30000, &p, &err);
  ck_assert_int_eq(st, GROVE_E_UNAVAILABLE);
  ck_assert_msg(strstr(grove_err_msg(&err), "not back within"), "%s", grove_err_msg(&err));
  /* Back on the same URL: redialed in the background. */
  hserver s2;
  const char *extra2[] = {"--listen", url, NULL};
  start_io(&s2, "loop", extra2);
  bool ok = false;
  for (int i = 0; i < 100 && !ok; i++) {
    ok = predict_row(c, &o, 3, &err);
    if (!ok) h_sleep_ms(50);
  }
  ck_assert_msg(ok, "not redialed: %s", grove_err_msg(&err));
  grove_client_close(c);
  h_io_free(&o);
  h_stop(&s);
  h_stop(&s2);
}
END_TEST

/* Two replicas, one killed under asynchronous load: every call answered. */
START_TEST(replica_killed_under_async_load) {
  hserver r[2];
  const char *extra[] = {"--test-batch-delay-ms", "2", NULL};
  start_io(&r[0], "loop", extra);
  start_io(&r[1], "loop", extra);
  hio o;
  h_io_load("server_mlp", &o);
  const char *urls[] = {r[0].tcp, r[1].tcp};
  grove_client *c = NULL;
  grove_err err = {0};
  grove_client_opts opts = {.admin_url = r[0].admin};
  ck_assert_ok(grove_client_open(urls, 2, &opts, &c, &err), &err);
  enum { T = 2, N = 300 };
  tally t = {.o = &o};
  athread w[T];
  pthread_t th[T];
  for (int i = 0; i < T; i++) {
    w[i] = (athread){.c = c, .t = &t, .index = i, .n = N};
    ck_assert_int_eq(pthread_create(&th[i], NULL, async_main, &w[i]), 0);
  }
  double until = h_now() + 60.0;
  while (atomic_load(&t.done) < T * N / 3 && h_now() < until) h_sleep_ms(1);
  kill(r[1].pid, SIGKILL);
  for (int i = 0; i < T; i++) pthread_join(th[i], NULL);
  grove_client_wait_idle(c);
  int refused = 0;
  for (int i = 0; i < T; i++) refused += w[i].refused;
  ck_assert_int_eq(refused, 0);
  ck_assert_msg(atomic_load(&t.failed) == 0, "%d calls failed: %s", atomic_load(&t.failed), t.why);
  ck_assert_int_eq(atomic_load(&t.ok), T * N);
  grove_client_close(c);
  h_io_free(&o);
  h_stop(&r[0]);
  h_stop(&r[1]);
}
END_TEST

/* A replica down at open is dialed in the background and joins: requests
 * reach it once it is up. */
START_TEST(replica_up_later_joins) {
  hserver a, b;
  start_io(&a, "loop", NULL);
  char later[400];
  snprintf(later, sizeof later, "ipc://%s/later.sock", grove_test_tmpdir());
  const char *urls[] = {a.tcp, later};
  grove_client *c = NULL;
  grove_err err = {0};
  grove_client_opts opts = {.admin_url = a.admin};
  ck_assert_ok(grove_client_open(urls, 2, &opts, &c, &err), &err);
  hio o;
  h_io_load("server_mlp", &o);
  ck_assert_msg(predict_row(c, &o, 0, &err), "%s", grove_err_msg(&err));
  const char *extra[] = {"--listen", later, NULL};
  start_io(&b, "loop", extra);
  const char *ok_b = "grove_requests_total{model=\"server_mlp\",status=\"OK\",protocol=\"grove\"}";
  double deadline = h_now() + 20.0;
  while (h_metric(&b, ok_b) <= 0 && h_now() < deadline) {
    ck_assert_msg(predict_row(c, &o, 1, &err), "%s", grove_err_msg(&err));
    h_sleep_ms(5);
  }
  ck_assert_msg(h_metric(&b, ok_b) > 0, "the replica that came up later got no request");
  grove_client_close(c);
  h_io_free(&o);
  h_stop(&a);
  h_stop(&b);
}
END_TEST

/* ============================================================ NNG rep0 */

/* A Grove reply holding a status whose server_version is version, packed
 * into a new buffer (*n bytes). */
static uint8_t *status_reply(const char *version, size_t *n) {
  Grove__StatusReply sr = GROVE__STATUS_REPLY__INIT;
  sr.server_version = (char *)version;
  sr.ready = true;
  Grove__Reply r = GROVE__REPLY__INIT;
  r.body_case = GROVE__REPLY__BODY_STATUS_REPLY;
  r.status_reply = &sr;
  *n = grove__reply__get_packed_size(&r);
  uint8_t *b = malloc(*n ? *n : 1);
  ck_assert_ptr_nonnull(b);
  grove__reply__pack(&r, b);
  return b;
}

static void *rep0_main(void *arg) {
  nng_socket *s = arg;
  for (;;) {
    nng_msg *m;
    if (nng_recvmsg(*s, &m, 0) != 0) return NULL;
    size_t n;
    uint8_t *b = status_reply("nng-rep0", &n);
    nng_msg_clear(m);
    nng_msg_append(m, b, n);
    free(b);
    if (nng_sendmsg(*s, m, 0) != 0) nng_msg_free(m);
  }
}

START_TEST(plain_nng_rep0) {
  nng_socket s;
  ck_assert_int_eq(nng_rep0_open(&s), 0);
  char ipc[400], tcp[64];
  snprintf(ipc, sizeof ipc, "ipc://%s/rep0.sock", grove_test_tmpdir());
  snprintf(tcp, sizeof tcp, "tcp://127.0.0.1:%d", h_free_port());
  ck_assert_int_eq(nng_listen(s, ipc, NULL, 0), 0);
  ck_assert_int_eq(nng_listen(s, tcp, NULL, 0), 0);
  pthread_t th;
  ck_assert_int_eq(pthread_create(&th, NULL, rep0_main, &s), 0);
  const char *urls[] = {ipc, tcp};
  for (int i = 0; i < 2; i++) {
    grove_client *c = NULL;
    grove_err err = {0};
    ck_assert_ok(grove_client_open(&urls[i], 1, NULL, &c, &err), &err);
    for (int k = 0; k < 50; k++) {
      grove_server_status *st = NULL;
      ck_assert_ok(grove_client_status(c, 10000, &st, &err), &err);
      ck_assert_str_eq(st->server_version, "nng-rep0");
      grove_server_status_free(st);
    }
    grove_client_close(c);
  }
  nng_close(s);
  pthread_join(th, NULL);
}
END_TEST

/* ============================================================ hostile */

typedef enum fake_kind {
  FAKE_NOT_SP,
  FAKE_REQ0,
  FAKE_TOO_LONG,
  FAKE_NO_ID,
  FAKE_MID_FRAME,
  FAKE_UNKNOWN_ID,
} fake_kind;

typedef struct fake {
  fake_kind kind;
  int lfd;
  char path[100];
} fake;

static bool read_full(int fd, uint8_t *p, size_t n) {
  while (n) {
    ssize_t r = read(fd, p, n);
    if (r <= 0) return false;
    p += r;
    n -= (size_t)r;
  }
  return true;
}

static void write_full(int fd, const void *p, size_t n) {
  const uint8_t *b = p;
  while (n) {
    ssize_t w = send(fd, b, n, MSG_NOSIGNAL);
    if (w <= 0) return;
    b += w;
    n -= (size_t)w;
  }
}

/* An IPC head: type 1, then the 64-bit big-endian length. */
static void put_head(uint8_t *h, uint64_t len) {
  h[0] = 1;
  for (int i = 8; i >= 1; i--, len >>= 8) h[i] = (uint8_t)len;
}

static void *fake_main(void *arg) {
  fake *f = arg;
  int fd = accept(f->lfd, NULL, NULL);
  if (fd < 0) return NULL;
  uint8_t hs[8] = {0, 'S', 'P', 0, 0, 0x31, 0, 0};
  if (f->kind == FAKE_NOT_SP) memcpy(hs, "HTTP/1.1", 8);
  if (f->kind == FAKE_REQ0) hs[5] = 0x30;
  write_full(fd, hs, 8);
  uint8_t peer[8];
  if (!read_full(fd, peer, 8) || f->kind == FAKE_NOT_SP || f->kind == FAKE_REQ0) {
    h_sleep_ms(200);
    close(fd);
    return NULL;
  }
  /* One request: head, id, body. */
  uint8_t head[9];
  if (!read_full(fd, head, 9)) {
    close(fd);
    return NULL;
  }
  uint64_t len = 0;
  for (int i = 1; i <= 8; i++) len = len << 8 | head[i];
  uint8_t *req = malloc(len ? len : 1);
  if (!req || !read_full(fd, req, len)) {
    free(req);
    close(fd);
    return NULL;
  }
  uint8_t id[4];
  memcpy(id, req, 4);
  free(req);
  size_t n;
  uint8_t *body = status_reply("fake", &n);
  uint8_t h[9];
  switch (f->kind) {
  case FAKE_TOO_LONG:
    put_head(h, (uint64_t)1 << 40);
    write_full(fd, h, 9);
    write_full(fd, id, 4);
    break;
  case FAKE_NO_ID: {
    uint8_t noid[4] = {0, 0, 0, 1};
    put_head(h, 4 + n);
    write_full(fd, h, 9);
    write_full(fd, noid, 4);
    write_full(fd, body, n);
    break;
  }
  case FAKE_MID_FRAME:
    put_head(h, 4 + n + 100);
    write_full(fd, h, 9);
    write_full(fd, id, 4);
    write_full(fd, body, n);
    break;
  case FAKE_UNKNOWN_ID: {
    uint8_t other[4] = {id[0], id[1], id[2], (uint8_t)(id[3] ^ 1)};
    put_head(h, 4 + n);
    write_full(fd, h, 9);
    write_full(fd, other, 4);
    write_full(fd, body, n);
    write_full(fd, h, 9);
    write_full(fd, id, 4);
    write_full(fd, body, n);
    h_sleep_ms(200);
    break;
  }
  default:
    break;
  }
  free(body);
  close(fd);
  return NULL;
}

static void fake_start(fake *f, fake_kind k, pthread_t *th) {
  f->kind = k;
  snprintf(f->path, sizeof f->path, "%s/fake%d.sock", grove_test_tmpdir(), (int)k);
  f->lfd = socket(AF_UNIX, SOCK_STREAM, 0);
  ck_assert_int_ge(f->lfd, 0);
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  snprintf(a.sun_path, sizeof a.sun_path, "%s", f->path);
  unlink(f->path);
  ck_assert_int_eq(bind(f->lfd, (struct sockaddr *)&a, sizeof a), 0);
  ck_assert_int_eq(listen(f->lfd, 4), 0);
  ck_assert_int_eq(pthread_create(th, NULL, fake_main, f), 0);
}

static void fake_stop(fake *f, pthread_t th) {
  shutdown(f->lfd, SHUT_RDWR);
  pthread_join(th, NULL);
  close(f->lfd);
  unlink(f->path);
}

/* A client of the fake server of kind k, one status call: its status and
 * message. */
static grove_status fake_call(fake_kind k, bool *opened, char *msg, size_t nmsg) {
  fake f;
  pthread_t th;
  fake_start(&f, k, &th);
  char url[320];
  snprintf(url, sizeof url, "ipc://%s", f.path);
  const char *urls[] = {url};
  grove_client *c = NULL;
  grove_err err = {0};
  double t0 = h_now();
  grove_status s = grove_client_open(urls, 1, NULL, &c, &err);
  *opened = s == GROVE_OK;
  if (!s) {
    grove_server_status *st = NULL;
    s = grove_client_status(c, 3000, &st, &err);
    if (!s) {
      ck_assert_str_eq(st->server_version, "fake");
      grove_server_status_free(st);
    }
    grove_client_close(c);
  }
  ck_assert_msg(h_now() - t0 < 10.0, "took %.1f s", h_now() - t0);
  snprintf(msg, nmsg, "%s", grove_err_msg(&err));
  fake_stop(&f, th);
  return s;
}

START_TEST(hostile_handshakes) {
  bool opened;
  char msg[512];
  grove_status s = fake_call(FAKE_NOT_SP, &opened, msg, sizeof msg);
  ck_assert(!opened);
  ck_assert_int_eq(s, GROVE_E_UNAVAILABLE);
  ck_assert_msg(strstr(msg, "not an SP server"), "%s", msg);
  s = fake_call(FAKE_REQ0, &opened, msg, sizeof msg);
  ck_assert(!opened);
  ck_assert_msg(strstr(msg, "protocol 0x30, not rep0"), "%s", msg);
}
END_TEST

START_TEST(hostile_replies) {
  bool opened;
  char msg[512];
  grove_status s = fake_call(FAKE_TOO_LONG, &opened, msg, sizeof msg);
  ck_assert(opened);
  ck_assert_int_eq(s, GROVE_E_UNAVAILABLE);
  ck_assert_msg(strstr(msg, "over the client's limit"), "%s", msg);
  s = fake_call(FAKE_NO_ID, &opened, msg, sizeof msg);
  ck_assert_int_eq(s, GROVE_E_UNAVAILABLE);
  ck_assert_msg(strstr(msg, "without its request id"), "%s", msg);
  s = fake_call(FAKE_MID_FRAME, &opened, msg, sizeof msg);
  ck_assert_int_eq(s, GROVE_E_UNAVAILABLE);
  ck_assert_msg(strstr(msg, "in the middle of a reply"), "%s", msg);
  s = fake_call(FAKE_UNKNOWN_ID, &opened, msg, sizeof msg);
  ck_assert_msg(s == GROVE_OK, "the reply after one of an unknown id: %s", msg);
}
END_TEST

START_TEST(transport_selected_by_env) {
  const char *urls[] = {"ipc:///nonexistent/x.sock"};
  grove_client *c = NULL;
  grove_err err = {0};
  setenv("GROVE_CLIENT_IO", "carrier-pigeon", 1);
  grove_status s = grove_client_open(urls, 1, NULL, &c, &err);
  unsetenv("GROVE_CLIENT_IO");
  ck_assert_int_eq(s, GROVE_E_INVALID_ARGUMENT);
  ck_assert_msg(strstr(grove_err_msg(&err), "GROVE_CLIENT_IO"), "%s", grove_err_msg(&err));
  /* The SP transport names the URL and the reason it failed. */
  s = grove_client_open(urls, 1, NULL, &c, &err);
  ck_assert_int_eq(s, GROVE_E_UNAVAILABLE);
  ck_assert_msg(strstr(grove_err_msg(&err), "ipc:///nonexistent/x.sock: "), "%s",
                grove_err_msg(&err));
}
END_TEST

static Suite *spclient_suite(void) {
  Suite *s = suite_create("spclient");
  TCase *t = tcase_create("spclient");
  tcase_set_timeout(t, 240);
  tcase_add_test(t, groved_loop_listener);
  tcase_add_test(t, groved_nng_listener);
  tcase_add_test(t, timeout_is_no_reply);
  tcase_add_test(t, server_killed_and_back);
  tcase_add_test(t, replica_killed_under_async_load);
  tcase_add_test(t, replica_up_later_joins);
  tcase_add_test(t, plain_nng_rep0);
  tcase_add_test(t, hostile_handshakes);
  tcase_add_test(t, hostile_replies);
  tcase_add_test(t, transport_selected_by_env);
  suite_add_tcase(s, t);
  return s;
}

GROVE_TEST_MAIN(spclient_suite)
