/* check_sp.c: groved's data plane read on its own loop (--data-io loop,
 * server/sp.c), which speaks NNG's SP protocol itself.
 *
 *   - real NNG req0 sockets (libgrove-client, and raw nng_req0 sockets)
 *     over tcp:// and ipc:// get their answers, rows equal to torch's;
 *   - one connection with hundreds of requests in flight (NNG contexts on
 *     one req0 socket) gets every reply, each with its own request id;
 *   - hostile peers are closed with a log line, and the others unaffected:
 *     a bad SP header, a peer of another protocol, a message length over the
 *     limit (closed before the body is sent), a message without its request
 *     id, a bad IPC message type; a half-written message holds only its own
 *     connection; a request a little over --max-request-bytes is answered
 *     INVALID_ARGUMENT;
 *   - a thousand connections at once leave predict answering, and each
 *     closed one leaves conns.c's count;
 *   - a peer that sends requests and never reads its replies is closed after
 *     the send timeout, while others are answered meanwhile.
 *
 * The other guarantees (deadlines, queue limits, drain, reload, hooks, the
 * connection caps) are the other groved suites', which run on the loop's
 * listener (the default) and, in `make sp-test`, again on NNG's
 * (GROVED_DATA_IO=nng).  Every wait is bounded; nothing
 * here times anything. */
#include <sys/un.h>

#include "groved_harness.h"

/* ============================================================ helpers */

static const char *model_arg(void) {
  static char buf[4200];
  snprintf(buf, sizeof buf, "server_mlp=%s", grove_fixture("server_mlp"));
  return buf;
}

/* groved with --data-io loop and extra (NULL-terminated, at most 12). */
static void start_loop(hserver *s, const char *const *extra) {
  const char *argv[16] = {"--data-io", "loop", "--model", model_arg()};
  int n = 4;
  for (int i = 0; extra && extra[i] && n < 15; i++) argv[n++] = extra[i];
  argv[n] = NULL;
  const hstart_opts opts = {.die_with_test = true};
  h_start_with(s, &opts, argv);
}

static int port_of(const hserver *s) {
  return atoi(strrchr(s->tcp, ':') + 1);
}

/* A predict of row `row` of the fixture, packed, with request id id. */
static uint8_t *pack_predict(const hio *o, int64_t row, uint64_t id, size_t *len) {
  grove_tensor in = h_rows(o->x, row, 1);
  return h_pack_predict("server_mlp", &in, id, len);
}

/* Whether reply rep answers row `row` of o with torch's numbers. */
static bool reply_matches(const Grove__Reply *rep, const hio *o, int64_t row) {
  if (rep->status != 0 || rep->body_case != GROVE__REPLY__BODY_PREDICT ||
      rep->predict->n_outputs != 1)
    return false;
  const Grove__Tensor *t = rep->predict->outputs[0];
  grove_tensor want = h_rows(o->y, row, 1);
  if (t->data.len != grove_tensor_nbytes(&want)) return false;
  return grove_test_allclose((const float *)t->data.data, want.data,
                             (size_t)grove_tensor_numel(&want), 1e-4, 1e-5) < 0;
}

static grove_status predict_one(const char *url, const hio *o, int64_t row) {
  grove_client *c = h_connect(url);
  grove_tensor in = h_rows(o->x, row, 1);
  grove_prediction p;
  grove_err err = {0};
  grove_status s = grove_client_predict(c, "server_mlp", &in, 1, 10000, &p, &err);
  if (s == GROVE_OK) {
    ck_assert_msg(p.noutputs == 1 && h_rows_match(p.outputs[0], o->y, row, 1),
                  "predict over %s answered rows that are not torch's", url);
    grove_prediction_fini(&p);
  }
  grove_client_close(c);
  return s;
}

/* Reads until fd is closed by the peer or timeout_s passes; whether it was. */
static bool wait_closed(int fd, double timeout_s) {
  double deadline = h_now() + timeout_s;
  while (h_now() < deadline) {
    if (h_peer_closed(fd)) return true;
    h_sleep_ms(10);
  }
  return false;
}

/* A figure of groved's memory in MiB from /proc/PID/status: field "VmRSS:"
 * (resident) or "VmSize:" (mapped, touched or not). */
static double status_mib(pid_t pid, const char *field) {
  char path[64], line[256], fmt[32];
  snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
  snprintf(fmt, sizeof fmt, "%s %%lf", field);
  FILE *f = fopen(path, "r");
  ck_assert_ptr_nonnull(f);
  double kib = -1;
  while (fgets(line, sizeof line, f))
    if (sscanf(line, fmt, &kib) == 1) break;
  fclose(f);
  ck_assert(kib >= 0);
  return kib / 1024.0;
}

static double rss_mib(pid_t pid) {
  return status_mib(pid, "VmRSS:");
}

static bool write_all(int fd, const void *p, size_t n) {
  const uint8_t *b = p;
  while (n) {
    ssize_t w = write(fd, b, n);
    if (w <= 0) return false;
    b += w;
    n -= (size_t)w;
  }
  return true;
}

static void put64be(uint8_t *p, uint64_t v) {
  for (int i = 7; i >= 0; i--, v >>= 8) p[i] = (uint8_t)v;
}

static int unix_connect(const char *url) {
  int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  ck_assert_int_ge(fd, 0);
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  const char *path = url + strlen("ipc://");
  ck_assert_uint_lt(strlen(path), sizeof a.sun_path);
  memcpy(a.sun_path, path, strlen(path) + 1);
  ck_assert_int_eq(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
  struct timeval tv = {2, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return fd;
}

/* ============================================================ tests */

START_TEST(nng_req0_clients_get_torchs_rows_over_tcp_and_ipc) {
  hserver s;
  start_loop(&s, NULL);
  ck_assert_msg(h_log_contains(&s, "on the loop: --data-io loop"), "not the loop's listener");
  hio o;
  h_io_load("server_mlp", &o);
  const char *urls[] = {s.tcp, s.ipc};
  for (int u = 0; u < 2; u++) {
    for (int64_t row = 0; row < 3; row++)
      ck_assert_int_eq(predict_one(urls[u], &o, row), GROVE_OK);
    /* A raw req0 socket of NNG's own (no client library): status. */
    Grove__Request req = GROVE__REQUEST__INIT;
    Grove__StatusRequest st = GROVE__STATUS_REQUEST__INIT;
    req.protocol = 1;
    req.id = 7;
    req.body_case = GROVE__REQUEST__BODY_STATUS;
    req.status = &st;
    Grove__Reply *rep = h_raw(urls[u], &req);
    ck_assert_msg(rep != NULL, "no status reply over %s", urls[u]);
    ck_assert_int_eq(rep->status, 0);
    ck_assert_uint_eq(rep->id, 7);
    ck_assert_int_eq(rep->body_case, GROVE__REPLY__BODY_STATUS_REPLY);
    grove__reply__free_unpacked(rep, NULL);
  }
  h_io_free(&o);
  ck_assert_int_eq(h_stop(&s), 0);
}
END_TEST

START_TEST(groved_data_io_env_is_the_flags_default) {
  hio o;
  h_io_load("server_mlp", &o);
  const hstart_opts opts = {.die_with_test = true};
  const char *extra[] = {"--model", model_arg(), NULL};
  /* Neither: the loop's listener, the default. */
  hserver s;
  h_start_with(&s, &opts, extra);
  ck_assert_msg(h_log_contains(&s, "on the loop: --data-io loop"), "not the loop's listener");
  ck_assert_int_eq(predict_one(s.tcp, &o, 0), GROVE_OK);
  ck_assert_int_eq(h_stop(&s), 0);
  /* $GROVED_DATA_IO=nng without the flag: NNG's, which serves as well. */
  setenv("GROVED_DATA_IO", "nng", 1);
  h_start_with(&s, &opts, extra);
  unsetenv("GROVED_DATA_IO");
  ck_assert_msg(h_log_contains(&s, "listening on tcp://"), "no server.listen line");
  ck_assert_msg(!h_log_contains(&s, "on the loop"), "GROVED_DATA_IO=nng served on the loop");
  ck_assert_int_eq(predict_one(s.tcp, &o, 0), GROVE_OK);
  ck_assert_int_eq(predict_one(s.ipc, &o, 1), GROVE_OK);
  ck_assert_int_eq(h_stop(&s), 0);
  h_io_free(&o);
  /* A value that is neither: a usage error (2), as a bad flag is. */
  setenv("GROVED_DATA_IO", "epoll", 1);
  const char *args[] = {"--listen", "tcp://127.0.0.1:1", "--http", "none", NULL};
  int st = h_groved_exit(args);
  unsetenv("GROVED_DATA_IO");
  ck_assert(WIFEXITED(st));
  ck_assert_int_eq(WEXITSTATUS(st), 2);
  const char *bad[] = {"--data-io", "epoll", "--http", "none", NULL};
  st = h_groved_exit(bad);
  ck_assert(WIFEXITED(st));
  ck_assert_int_eq(WEXITSTATUS(st), 2);
}
END_TEST

/* A unix socket bound at path: listening (live) or closed, leaving its file
 * behind as a killed server's would (stale).  Returns the descriptor of a
 * live one (the caller closes it), -1 for a stale one. */
static int unix_bound(const char *path, bool live) {
  int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  ck_assert_int_ge(fd, 0);
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  ck_assert_uint_lt(strlen(path), sizeof a.sun_path);
  memcpy(a.sun_path, path, strlen(path) + 1);
  ck_assert_int_eq(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
  if (live) {
    ck_assert_int_eq(listen(fd, 4), 0);
    return fd;
  }
  close(fd);
  return -1;
}

START_TEST(ipc_paths_stale_replaced_live_refused_removed_at_exit) {
  const char *dir = grove_test_tmpdir();
  ck_assert_ptr_nonnull(dir);
  char path[200], url[220];
  snprintf(path, sizeof path, "%s/d.sock", dir);
  snprintf(url, sizeof url, "ipc://%s", path);
  /* Another server listening there: groved does not start (status 1). */
  int live = unix_bound(path, true);
  const char *args[] = {"--data-io", "loop", "--listen", url,  "--http",
                        "none",      "--pub", "none",   "--admin-listen", "none", NULL};
  int st = h_groved_exit(args);
  ck_assert(WIFEXITED(st));
  ck_assert_int_eq(WEXITSTATUS(st), 1);
  close(live);
  unlink(path);
  /* A start that fails after the data plane listens (its HTTP port taken)
   * leaves no socket file behind. */
  int port = h_free_port();
  int taken = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in ta = {.sin_family = AF_INET,
                           .sin_port = htons((uint16_t)port),
                           .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  ck_assert_int_eq(bind(taken, (struct sockaddr *)&ta, sizeof ta), 0);
  ck_assert_int_eq(listen(taken, 4), 0);
  char http[64];
  snprintf(http, sizeof http, "127.0.0.1:%d", port);
  const char *failing[] = {"--data-io", "loop", "--listen", url,    "--http",
                           http,        "--pub", "none",   "--admin-listen", "none", NULL};
  st = h_groved_exit(failing);
  close(taken);
  ck_assert(WIFEXITED(st));
  ck_assert_int_eq(WEXITSTATUS(st), 1);
  ck_assert_msg(access(path, F_OK) != 0, "a failed start left %s behind", path);
  /* A file left by a server that died: replaced. */
  unix_bound(path, false);
  hserver s;
  const hstart_opts opts = {.die_with_test = true, .no_ipc = true};
  const char *extra[] = {"--data-io", "loop", "--model", model_arg(), "--listen", url, NULL};
  h_start_with(&s, &opts, extra);
  hio o;
  h_io_load("server_mlp", &o);
  ck_assert_int_eq(predict_one(url, &o, 0), GROVE_OK);
  h_io_free(&o);
  ck_assert_int_eq(h_stop(&s), 0);
  ck_assert_msg(access(path, F_OK) != 0, "groved left %s behind", path);
}
END_TEST

#define DEEP 400

START_TEST(one_connection_with_hundreds_in_flight_gets_every_reply) {
  /* NNG 1.5.2's raw rep0 dropped replies past 64 queued per connection
   * (docs/performance.md); the loop's listener must lose none. */
  hserver s;
  start_loop(&s, NULL);
  hio o;
  h_io_load("server_mlp", &o);
  const char *urls[] = {s.tcp, s.ipc};
  for (int u = 0; u < 2; u++) {
    nng_socket sock;
    ck_assert_int_eq(nng_req0_open(&sock), 0);
    ck_assert_int_eq(nng_dial(sock, urls[u], NULL, 0), 0);
    static nng_ctx ctx[DEEP];
    static nng_aio *aio[DEEP];
    for (int i = 0; i < DEEP; i++) {
      ck_assert_int_eq(nng_ctx_open(&ctx[i], sock), 0);
      ck_assert_int_eq(nng_aio_alloc(&aio[i], NULL, NULL), 0);
      nng_aio_set_timeout(aio[i], 30000);
      size_t len;
      uint8_t *b = pack_predict(&o, i % 4, 1000 + (uint64_t)i, &len);
      nng_msg *m;
      ck_assert_int_eq(nng_msg_alloc(&m, 0), 0);
      ck_assert_int_eq(nng_msg_append(m, b, len), 0);
      free(b);
      nng_aio_set_msg(aio[i], m);
      nng_ctx_send(ctx[i], aio[i]);
    }
    for (int i = 0; i < DEEP; i++) {
      nng_aio_wait(aio[i]);
      ck_assert_int_eq(nng_aio_result(aio[i]), 0);
      nng_ctx_recv(ctx[i], aio[i]);
    }
    int full = 0;
    for (int i = 0; i < DEEP; i++) {
      nng_aio_wait(aio[i]);
      ck_assert_msg(nng_aio_result(aio[i]) == 0, "reply %d of %d over %s: %s", i, DEEP, urls[u],
                    nng_strerror(nng_aio_result(aio[i])));
      nng_msg *m = nng_aio_get_msg(aio[i]);
      Grove__Reply *rep = grove__reply__unpack(NULL, nng_msg_len(m), nng_msg_body(m));
      ck_assert_ptr_nonnull(rep);
      ck_assert_uint_eq(rep->id, 1000 + (uint64_t)i);
      /* The model's queue holds 64: the rest are refused, never lost. */
      if (rep->status == GROVE_E_RESOURCE_EXHAUSTED)
        full++;
      else
        ck_assert_msg(reply_matches(rep, &o, i % 4), "reply %d: status %d, not torch's rows", i,
                      rep->status);
      grove__reply__free_unpacked(rep, NULL);
      nng_msg_free(m);
      nng_ctx_close(ctx[i]);
      nng_aio_free(aio[i]);
    }
    ck_assert_msg(full < DEEP - 64, "only %d of %d answered with rows", DEEP - full, DEEP);
    nng_close(sock);
  }
  h_io_free(&o);
  ck_assert_int_eq(h_stop(&s), 0);
}
END_TEST

START_TEST(hostile_peers_are_closed_and_logged_others_unaffected) {
  hserver s;
  const char *extra[] = {"--max-request-bytes", "8192", NULL};
  start_loop(&s, extra);
  int port = port_of(&s);
  hio o;
  h_io_load("server_mlp", &o);
  static const uint8_t req0[8] = {0, 'S', 'P', 0, 0x00, 0x30, 0, 0};

  /* A half-written message first: it must hold nothing but itself. */
  int half = h_tcp_connect(port);
  ck_assert_int_ge(half, 0);
  uint8_t head[8];
  put64be(head, 4000);
  ck_assert(write_all(half, req0, 8) && write_all(half, head, 8) && write_all(half, "\x80\0\0\1", 4));

  struct {
    const char *what, *log;
    uint8_t bytes[24];
    size_t n;
  } cases[] = {
      {"not an SP header", "sp.bad_handshake", {'G', 'E', 'T', ' ', '/', ' ', 'H', 'T'}, 8},
      {"a pair0 peer", "sp.bad_protocol", {0, 'S', 'P', 0, 0x00, 0x10, 0, 0}, 8},
      {"a length of 2^40", "sp.too_large", {0, 'S', 'P', 0, 0x00, 0x30, 0, 0, 0, 0, 1}, 16},
      {"no request id", "sp.no_request_id",
       {0, 'S', 'P', 0, 0x00, 0x30, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2, 'h', 'i'}, 18},
  };
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    int fd = h_tcp_connect(port);
    ck_assert_int_ge(fd, 0);
    ck_assert(write_all(fd, cases[k].bytes, cases[k].n));
    ck_assert_msg(wait_closed(fd, 5.0), "%s: the connection stayed open", cases[k].what);
    close(fd);
    double deadline = h_now() + 5.0;
    while (!h_log_contains(&s, cases[k].log) && h_now() < deadline) h_sleep_ms(20);
    ck_assert_msg(h_log_contains(&s, cases[k].log), "%s: no %s log line", cases[k].what,
                  cases[k].log);
    ck_assert_int_eq(predict_one(s.tcp, &o, 0), GROVE_OK);
  }
  /* IPC: its messages carry a type byte, 1. */
  int fd = unix_connect(s.ipc);
  const uint8_t bad_type[17] = {0, 'S', 'P', 0, 0x00, 0x30, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 4};
  ck_assert(write_all(fd, bad_type, sizeof bad_type));
  ck_assert_msg(wait_closed(fd, 5.0), "an IPC message of type 2 left its connection open");
  close(fd);
  ck_assert_int_eq(predict_one(s.ipc, &o, 1), GROVE_OK);

  /* Over --max-request-bytes but within the slack: answered, not dropped. */
  uint8_t *big = calloc(1, 9000);
  Grove__Reply *rep = NULL;
  ck_assert_int_eq(h_raw_call(s.tcp, big, 9000, 10000, &rep), 0);
  ck_assert_int_eq(rep->status, GROVE_E_INVALID_ARGUMENT);
  ck_assert_msg(strstr(rep->message, "--max-request-bytes"), "%s", rep->message);
  grove__reply__free_unpacked(rep, NULL);
  free(big);

  /* The half-written message is still pending, its connection open. */
  ck_assert_msg(!h_peer_closed(half), "the half-written message's connection was closed");
  close(half);
  h_io_free(&o);
  ck_assert_int_eq(h_stop(&s), 0);
}
END_TEST

/* A peer that announces a message of 60 MiB (under the default 64 MiB limit)
 * and sends 1 KiB of it makes groved hold about what it sent, not what it
 * announced: 40 such peers once mapped 2.4 GB. */
START_TEST(announced_lengths_are_not_reserved) {
  hserver s;
  start_loop(&s, NULL);
  int port = port_of(&s);
  static const uint8_t req0[8] = {0, 'S', 'P', 0, 0x00, 0x30, 0, 0};
  enum { PEERS = 40 };
  int fds[PEERS];
  double before = status_mib(s.pid, "VmSize:");
  uint8_t head[8], body[1024] = {0x80, 0, 0, 1};
  put64be(head, (uint64_t)60 << 20);
  for (int k = 0; k < PEERS; k++) {
    fds[k] = h_tcp_connect(port);
    ck_assert_int_ge(fds[k], 0);
    ck_assert(write_all(fds[k], req0, 8) && write_all(fds[k], head, 8) &&
              write_all(fds[k], body, sizeof body));
  }
  h_sleep_ms(300);
  hio o;
  h_io_load("server_mlp", &o);
  ck_assert_int_eq(predict_one(s.tcp, &o, 0), GROVE_OK); /* the loop has read them all */
  double grown = status_mib(s.pid, "VmSize:") - before;
  printf("announced 60 MiB x %d, sent 1 KiB each: groved mapped %.1f MiB more\n", PEERS, grown);
  ck_assert_msg(grown < 256, "groved mapped %.0f MiB for %d peers' 1 KiB each", grown, PEERS);
  for (int k = 0; k < PEERS; k++) close(fds[k]);
  h_io_free(&o);
  ck_assert_int_eq(h_stop(&s), 0);
}
END_TEST

#define MANY 1000

START_TEST(a_thousand_connections_leave_predict_answering) {
  struct rlimit rl;
  ck_assert_int_eq(getrlimit(RLIMIT_NOFILE, &rl), 0);
  if (rl.rlim_cur < MANY + 200 && rl.rlim_max >= MANY + 200) {
    rl.rlim_cur = MANY + 200;
    ck_assert_int_eq(setrlimit(RLIMIT_NOFILE, &rl), 0);
  }
  ck_assert_msg(rl.rlim_cur >= MANY + 200, "the test needs %d descriptors", MANY + 200);
  hserver s;
  start_loop(&s, NULL);
  int port = port_of(&s);
  hio o;
  h_io_load("server_mlp", &o);
  static int fds[MANY];
  bool answering = true;
  for (int i = 0; i < MANY; i++) {
    fds[i] = h_sp_connect(port, &answering);
    ck_assert_int_ge(fds[i], 0);
  }
  ck_assert_msg(answering, "groved stopped answering SP handshakes");
  ck_assert_int_eq(predict_one(s.tcp, &o, 2), GROVE_OK);
  ck_assert_int_eq(predict_one(s.ipc, &o, 3), GROVE_OK);
  ck_assert(h_wait_metric(&s, "groved_connections{listener=\"data\"}", MANY, 10.0) >= MANY);
  for (int i = 0; i < MANY; i++) close(fds[i]);
  double left = h_metric(&s, "groved_connections{listener=\"data\"}");
  double deadline = h_now() + 10.0;
  while (left > 0 && h_now() < deadline) {
    h_sleep_ms(50);
    left = h_metric(&s, "groved_connections{listener=\"data\"}");
  }
  ck_assert_msg(left == 0, "%.0f closed connections still counted", left);
  h_io_free(&o);
  ck_assert_int_eq(h_stop(&s), 0);
}
END_TEST

START_TEST(a_peer_that_never_reads_is_closed_others_answered) {
  hserver s;
  start_loop(&s, NULL);
  hio o;
  h_io_load("server_mlp", &o);
  /* A small receive buffer, set before the connect so that the window
   * stays small: groved's writes block soon. */
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  ck_assert_int_ge(fd, 0);
  int small = 4096;
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
  struct timeval tv = {0, 200000};
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  struct sockaddr_in a = {.sin_family = AF_INET,
                          .sin_port = htons((uint16_t)port_of(&s)),
                          .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  ck_assert_int_eq(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
  static const uint8_t req0[8] = {0, 'S', 'P', 0, 0x00, 0x30, 0, 0};
  ck_assert(write_all(fd, req0, 8));
  /* Status requests (answered on the loop, each reply a few hundred
   * bytes), written and never read: the replies fill the socket, then
   * groved's queue, then groved stops reading and this write blocks. */
  Grove__Request req = GROVE__REQUEST__INIT;
  Grove__StatusRequest st = GROVE__STATUS_REQUEST__INIT;
  req.protocol = 1;
  req.body_case = GROVE__REQUEST__BODY_STATUS;
  req.status = &st;
  size_t len = grove__request__get_packed_size(&req);
  uint8_t frame[64];
  ck_assert_uint_le(len, sizeof frame - 12);
  put64be(frame, 4 + len);
  memcpy(frame + 8, "\x80\0\0\1", 4);
  grove__request__pack(&req, frame + 12);
  enum { CHUNK = 256 };
  static uint8_t chunk[CHUNK * 64];
  for (int i = 0; i < CHUNK; i++) memcpy(chunk + (size_t)i * (12 + len), frame, 12 + len);
  double rss0 = rss_mib(s.pid);
  int sent = 0;
  double until = h_now() + 10.0;
  /* What groved holds for it is bounded (its queue stops at 4 MiB, then
   * the connection is not read), however long the peer keeps sending: its
   * memory is sampled while the peer sends (the send timeout frees it all
   * once it closes the connection). */
  double grown = 0, next_look = h_now();
  while (h_now() < until && write_all(fd, chunk, CHUNK * (12 + len))) {
    sent += CHUNK;
    if (h_now() >= next_look) {
      double g = rss_mib(s.pid) - rss0;
      if (g > grown) grown = g;
      next_look = h_now() + 0.2;
    }
  }
  ck_assert_int_gt(sent, 1000);
  printf("stalled reader: %d requests sent unread, groved grew by at most %.1f MiB\n", sent,
         grown);
  ck_assert_msg(grown < 64, "groved grew by %.0f MiB for %d unread replies", grown, sent);
  /* Meanwhile everyone else is answered. */
  ck_assert_int_eq(predict_one(s.tcp, &o, 1), GROVE_OK);
  ck_assert_int_eq(predict_one(s.ipc, &o, 2), GROVE_OK);
  /* The send timeout (10 s without progress) closes it. */
  double deadline = h_now() + 30.0;
  while (!h_log_contains(&s, "sp.send_stalled") && h_now() < deadline) h_sleep_ms(100);
  ck_assert_msg(h_log_contains(&s, "sp.send_stalled"),
                "a peer that never read %d replies was not closed", sent);
  close(fd);
  ck_assert_int_eq(predict_one(s.tcp, &o, 3), GROVE_OK);
  h_io_free(&o);
  ck_assert_int_eq(h_stop(&s), 0);
}
END_TEST

Suite *sp_suite(void) {
  Suite *s = suite_create("sp");
  TCase *t = tcase_create("sp");
  tcase_set_timeout(t, 120);
  tcase_add_test(t, nng_req0_clients_get_torchs_rows_over_tcp_and_ipc);
  tcase_add_test(t, groved_data_io_env_is_the_flags_default);
  tcase_add_test(t, ipc_paths_stale_replaced_live_refused_removed_at_exit);
  tcase_add_test(t, one_connection_with_hundreds_in_flight_gets_every_reply);
  tcase_add_test(t, hostile_peers_are_closed_and_logged_others_unaffected);
  tcase_add_test(t, a_thousand_connections_leave_predict_answering);
  tcase_add_test(t, announced_lengths_are_not_reserved);
  tcase_add_test(t, a_peer_that_never_reads_is_closed_others_answered);
  suite_add_tcase(s, t);
  return s;
}

GROVE_TEST_MAIN(sp_suite)
