/* groved_harness.h: starting and talking to a real groved from a Check
 * suite (tests/check_server.c, check_replicas.c, check_reload.c,
 * check_export.c, check_train_server.c).  Static functions in a header, so
 * each suite gets its own copy.
 *
 * groved runs as a child process on 127.0.0.1 (free ports) and, unless the
 * suite asks otherwise (hstart_opts), an ipc socket in a temporary
 * directory; its log goes to a file there.  Its admin plane (reload, export,
 * hooks, training) listens on another ipc socket there (hserver.admin), and
 * it may read and write checkpoints anywhere in the run's directory and the
 * fixtures (--checkpoint-dir); h_connect and h_raw send admin calls to the
 * admin socket of the groved whose URL they are given.  h_stop removes that directory;
 * when a test fails before it, the directory goes with the run's
 * (grove_test_run, tests/testutil.c).  Readiness is polled over HTTP, not
 * NNG: an unchecked fixture runs in Check's parent process, and NNG refuses
 * to run in a child forked after it started.  Every wait is bounded. */
#ifndef GROVE_TESTS_GROVED_HARNESS_H
#define GROVE_TESTS_GROVED_HARNESS_H

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>

#include "grove.pb-c.h"
#include "grove/client.h"
#include "grove/grove.h"
#include "testutil.h"

static inline void h_sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

static inline double h_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ------------------------------------------------------------ ports
 *
 * A port from bind(0) comes from the kernel's ephemeral range, the range
 * every outgoing connection on the machine takes its local port from:
 * between the moment the probe socket closes and the moment groved binds, a
 * client anywhere on the machine (a redialing NNG client of an earlier test,
 * say) may take it, and groved then exits "address in use".  So
 * h_free_port() hands out ports below that range, which only listeners use,
 * each bound once to check that nobody holds it, and never the same one twice
 * in a process.  tests/py/netutil.py does the same for the Python tests. */

/* The low end of /proc/sys/net/ipv4/ip_local_port_range; 32768 (Linux's
 * default) when it cannot be read. */
static inline int h_ephemeral_low(void) {
  int low = 0, high = 0;
  FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
  if (f) {
    if (fscanf(f, "%d %d", &low, &high) != 2) low = 0;
    fclose(f);
  }
  return low > 0 ? low : 32768;
}

/* Whether a plain bind of 127.0.0.1:port succeeds now.  No SO_REUSEADDR:
 * with it a bind succeeds beside sockets in TIME_WAIT, and the probe is meant
 * to be stricter than groved's own listener. */
static inline bool h_bindable(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  struct sockaddr_in a = {.sin_family = AF_INET,
                          .sin_port = htons((uint16_t)port),
                          .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  bool ok = bind(fd, (struct sockaddr *)&a, sizeof a) == 0;
  close(fd);
  return ok;
}

/* A random number (splitmix64), seeded afresh in every process: Check forks
 * each test from one parent, and children that inherited one state would
 * all draw the same ports. */
static inline uint64_t h_random(void) {
  static uint64_t state;
  static pid_t seeded_in;
  if (seeded_in != getpid()) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    seeded_in = getpid();
    state =
        ((uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec) ^ ((uint64_t)seeded_in << 32);
  }
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* A TCP port on 127.0.0.1 that nobody holds now: random in [10000, low of
 * the ephemeral range) when that leaves room (low > 12000), else the
 * kernel's choice.  A forked test inherits the ports its parent was given
 * (an unchecked fixture's server), not those of earlier sibling tests. */
static inline int h_free_port(void) {
  static int given[256];
  static int ngiven;
  ck_assert_msg(ngiven < (int)(sizeof given / sizeof given[0]),
                "h_free_port: more than %d ports in one process", ngiven);
  int low = h_ephemeral_low(), port = 0;
  for (int tries = 0; low > 12000 && tries < 200 && !port; tries++) {
    int p = 10000 + (int)(h_random() % (uint64_t)(low - 10000));
    bool seen = false;
    for (int i = 0; i < ngiven && !seen; i++) seen = given[i] == p;
    if (!seen && h_bindable(p)) port = p;
  }
  if (!port) {
    /* No room below the range (or all tried were taken). */
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    ck_assert_int_ge(fd, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    ck_assert_int_eq(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    socklen_t len = sizeof a;
    ck_assert_int_eq(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    close(fd);
    port = ntohs(a.sin_port);
  }
  given[ngiven++] = port;
  return port;
}

/* ------------------------------------------------------------ groved */

static inline const char *h_groved_path(void) {
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

/* A TCP connection to 127.0.0.1:port whose reads and writes give up after
 * seconds; -1 when the connect fails. */
static inline int h_tcp_dial(int port, int seconds) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  struct timeval tv = {seconds, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  struct sockaddr_in a = {.sin_family = AF_INET,
                          .sin_port = htons((uint16_t)port),
                          .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

/* GET path on 127.0.0.1:port; returns the HTTP status and the body
 * (malloc'd) in *body, or -1 (and *body NULL) when nothing answers. */
static inline int h_http(int port, const char *path, char **body) {
  *body = NULL;
  int fd = h_tcp_dial(port, 10);
  if (fd < 0) return -1;
  char req[256];
  int n = snprintf(req, sizeof req,
                   "GET %s HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n", path);
  if (write(fd, req, (size_t)n) != n) {
    close(fd);
    return -1;
  }
  size_t cap = 65536, len = 0;
  char *buf = malloc(cap);
  for (;;) {
    if (!buf) break;
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
  if (!buf) return -1;
  buf[len] = 0;
  int code = -1;
  sscanf(buf, "HTTP/1.%*d %d", &code);
  char *start = strstr(buf, "\r\n\r\n");
  *body = strdup(start ? start + 4 : "");
  free(buf);
  return code;
}

/* h_http, failing the test when nothing answers. */
static inline int h_http_get(int port, const char *path, char **body) {
  int code = h_http(port, path, body);
  ck_assert_msg(code > 0, "no HTTP answer on port %d for %s", port, path);
  return code;
}

typedef struct hserver {
  pid_t pid;
  char dir[256];
  char tcp[128], ipc[384], log[384]; /* ipc is "" with hstart_opts.no_ipc */
  char admin[384];                   /* ipc://DIR/admin.sock; "" with no_admin */
  int http_port;
} hserver;

/* The admin URL of every groved this process started (or inherited from the
 * parent that did), by data URL: h_connect and h_raw look it up. */
typedef struct hplane {
  char url[384], admin[384];
} hplane;
static hplane h_planes[64];
static int h_nplanes;

static inline void h_plane_add(const char *url, const char *admin) {
  if (!url[0] || !admin[0]) return;
  hplane *p = NULL;
  for (int i = 0; i < h_nplanes && !p; i++)
    if (strcmp(h_planes[i].url, url) == 0) p = &h_planes[i];
  if (!p && h_nplanes < (int)(sizeof h_planes / sizeof h_planes[0])) p = &h_planes[h_nplanes++];
  if (!p) return;
  snprintf(p->url, sizeof p->url, "%s", url);
  snprintf(p->admin, sizeof p->admin, "%s", admin);
}

/* The admin URL of the groved listening on url (its data or admin URL);
 * NULL when this process started none there. */
static inline const char *h_admin_of(const char *url) {
  for (int i = 0; i < h_nplanes; i++)
    if (strcmp(h_planes[i].url, url) == 0 || strcmp(h_planes[i].admin, url) == 0)
      return h_planes[i].admin;
  return NULL;
}

/* What h_start_with leaves out of groved's command line.  Every groved gets
 * --listen tcp://127.0.0.1:PORT and --http 127.0.0.1:PORT; the zero value
 * (h_start's) adds all three of the flags below. */
typedef struct hstart_opts {
  bool no_ipc;       /* no --listen ipc://DIR/groved.sock */
  bool no_pub;       /* no --pub ipc://DIR/pub.sock: extra's, or groved's default */
  bool no_debug_log; /* no --log-level debug: extra's, or groved's default (info) */
  bool no_admin;     /* no --admin-listen ipc://DIR/admin.sock: extra's, or groved's default */
  bool no_checkpoint_dirs; /* no --checkpoint-dir for the run's directory and the fixtures */
  int nofile;        /* > 0: groved's RLIMIT_NOFILE, soft and hard (set before exec) */
  bool die_with_test; /* groved gets SIGKILL when the thread that started it ends
                       * (PR_SET_PDEATHSIG): a failed assertion leaves no groved */
} hstart_opts;

static inline void h_show_log(const hserver *s) {
  char *text = grove_test_read_file(s->log, NULL);
  fprintf(stderr, "---- groved log (%s) ----\n%s---- end ----\n", s->log, text ? text : "");
  free(text);
}

/* Starts groved with the harness's flags (as opts says; NULL: all of them)
 * followed by those in extra (NULL-terminated), and waits at most 30 s for
 * its HTTP /healthz. */
static inline void h_start_with(hserver *s, const hstart_opts *opts, const char *const *extra) {
  const hstart_opts none = {0};
  if (!opts) opts = &none;
  memset(s, 0, sizeof *s);
  const char *tmp = grove_test_tmpdir();
  ck_assert_ptr_nonnull(tmp);
  snprintf(s->dir, sizeof s->dir, "%s", tmp);
  int port = h_free_port(), hport = h_free_port();
  snprintf(s->tcp, sizeof s->tcp, "tcp://127.0.0.1:%d", port);
  if (!opts->no_ipc) snprintf(s->ipc, sizeof s->ipc, "ipc://%s/groved.sock", s->dir);
  char http[64];
  snprintf(http, sizeof http, "127.0.0.1:%d", hport);
  s->http_port = hport;
  snprintf(s->log, sizeof s->log, "%s/groved.log", s->dir);
  char pub[320];
  snprintf(pub, sizeof pub, "ipc://%s/pub.sock", s->dir);
  if (!opts->no_admin) snprintf(s->admin, sizeof s->admin, "ipc://%s/admin.sock", s->dir);
  /* The run's directory (every grove_test_tmpdir() is in it) and the
   * fixtures: where the suites keep the checkpoints they reload. */
  char run_root[256], fixtures[4096];
  snprintf(run_root, sizeof run_root, "%s", s->dir);
  char *slash = strrchr(run_root, '/');
  if (slash && slash != run_root) *slash = '\0';
  snprintf(fixtures, sizeof fixtures, "%s", grove_fixture(""));
  const char *argv[64];
  int n = 0;
  argv[n++] = h_groved_path();
  argv[n++] = "--listen";
  argv[n++] = s->tcp;
  if (!opts->no_ipc) {
    argv[n++] = "--listen";
    argv[n++] = s->ipc;
  }
  argv[n++] = "--http";
  argv[n++] = http;
  if (!opts->no_pub) {
    argv[n++] = "--pub";
    argv[n++] = pub;
  }
  if (!opts->no_debug_log) {
    argv[n++] = "--log-level";
    argv[n++] = "debug";
  }
  if (!opts->no_admin) {
    argv[n++] = "--admin-listen";
    argv[n++] = s->admin;
  }
  if (!opts->no_checkpoint_dirs) {
    argv[n++] = "--checkpoint-dir";
    argv[n++] = run_root;
    if (access(fixtures, F_OK) == 0) {
      argv[n++] = "--checkpoint-dir";
      argv[n++] = fixtures;
    }
  }
  for (int i = 0; extra && extra[i] && n < 62; i++) argv[n++] = extra[i];
  argv[n] = NULL;
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    if (opts->die_with_test) prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (opts->nofile > 0) {
      struct rlimit rl = {(rlim_t)opts->nofile, (rlim_t)opts->nofile};
      if (setrlimit(RLIMIT_NOFILE, &rl) != 0) _exit(126);
    }
    int fd = open(s->log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      dup2(fd, STDERR_FILENO);
      dup2(fd, STDOUT_FILENO);
      close(fd);
    }
    execv(argv[0], (char *const *)argv);
    fprintf(stderr, "exec %s: %s\n", argv[0], strerror(errno));
    _exit(127);
  }
  s->pid = pid;
  h_plane_add(s->tcp, s->admin);
  h_plane_add(s->ipc, s->admin);
  double deadline = h_now() + 30.0;
  for (;;) {
    int st;
    if (waitpid(pid, &st, WNOHANG) == pid) {
      s->pid = 0;
      h_show_log(s);
      ck_abort_msg("groved exited during start (status %d)", st);
    }
    /* groved opens HTTP after its NNG listeners, so an answer here means
     * both are up. */
    char *body = NULL;
    int code = h_http(s->http_port, "/healthz", &body);
    free(body);
    if (code == 200) return;
    if (h_now() > deadline) {
      h_show_log(s);
      ck_abort_msg("groved did not come up within 30 s");
    }
    h_sleep_ms(20);
  }
}

/* Runs groved with args (NULL-terminated; its output thrown away) and
 * returns its wait status: for flags it must refuse at once. */
static inline int h_groved_exit(const char *const *args) {
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    int fd = open("/dev/null", O_WRONLY);
    dup2(fd, STDERR_FILENO);
    dup2(fd, STDOUT_FILENO);
    const char *argv[32];
    int n = 0;
    argv[n++] = h_groved_path();
    for (int i = 0; args[i] && n < 31; i++) argv[n++] = args[i];
    argv[n] = NULL;
    execv(argv[0], (char *const *)argv);
    _exit(127);
  }
  int st;
  ck_assert_int_eq(waitpid(pid, &st, 0), pid);
  return st;
}

static inline void h_start(hserver *s, const char *const *extra) {
  h_start_with(s, NULL, extra);
}

/* Waits at most timeout_s for s to exit; returns its wait status, or -1
 * (also when it was reaped before). */
static inline int h_wait(hserver *s, double timeout_s) {
  double deadline = h_now() + timeout_s;
  while (s->pid > 0) {
    int st;
    if (waitpid(s->pid, &st, WNOHANG) == s->pid) {
      s->pid = 0;
      return st;
    }
    if (h_now() > deadline) return -1;
    h_sleep_ms(10);
  }
  return -1;
}

static inline void h_rm_rf(const char *dir) {
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
}

/* Prints where every thread of a groved that does not exit is: gdb's
 * backtraces when gdb is installed, else each thread's name and kernel wait
 * channel from /proc.  For the failure message of a hang that is rare. */
static inline void h_show_stacks(const hserver *s) {
  if (s->pid <= 0) return;
  char cmd[512];
  if (access("/usr/bin/gdb", X_OK) == 0)
    snprintf(cmd, sizeof cmd,
             "gdb -p %d -batch -nx -ex 'thread apply all bt' 2>/dev/null | grep -v '^\\[' >&2",
             (int)s->pid);
  else
    snprintf(cmd, sizeof cmd,
             "for t in /proc/%d/task/*; do echo \"$(cat $t/comm) $(cat $t/wchan)\"; done >&2",
             (int)s->pid);
  fprintf(stderr, "---- groved %d's threads ----\n", (int)s->pid);
  fflush(stderr);
  if (system(cmd) != 0) fprintf(stderr, "(could not list them)\n");
  fprintf(stderr, "---- end ----\n");
}

/* SIGTERM (SIGKILL after 20 s), then removes s->dir; returns the wait
 * status, or -1 when groved had already been reaped (h_wait) or had to be
 * killed.  A groved stopped here that did not exit 0 has its log printed. */
static inline int h_stop(hserver *s) {
  int st = -1;
  if (s->pid > 0) {
    kill(s->pid, SIGTERM);
    st = h_wait(s, 20.0);
    if (st == -1 && s->pid > 0) {
      h_show_stacks(s);
      kill(s->pid, SIGKILL);
      h_wait(s, 5.0);
    }
    if (!(st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 0)) {
      fprintf(stderr, "groved did not exit 0 (wait status %d)\n", st);
      h_show_log(s);
    }
  }
  if (s->dir[0]) h_rm_rf(s->dir);
  return st;
}

static inline bool h_log_contains(const hserver *s, const char *needle) {
  char *text = grove_test_read_file(s->log, NULL);
  bool found = text && strstr(text, needle);
  free(text);
  return found;
}

/* Whether needle reaches s's log within timeout_s: a line logged after
 * what the test saw (a reload logs its result after publishing it). */
static inline bool h_wait_log(const hserver *s, const char *needle, double timeout_s) {
  double deadline = h_now() + timeout_s;
  while (!h_log_contains(s, needle))
    if (h_now() > deadline) return false;
    else h_sleep_ms(10);
  return true;
}

/* A client of url whose admin calls go to the admin listener of the groved
 * there (h_admin_of), never to the default admin address. */
static inline grove_client *h_connect(const char *url) {
  grove_client *c = NULL;
  grove_err err = {0};
  const char *urls[] = {url};
  const char *admin = h_admin_of(url);
  grove_client_opts o = {.admin_url = admin ? admin : "ipc:///nonexistent/grove-admin.sock",
                         .admin_token = ""};
  ck_assert_ok(grove_client_open(urls, 1, &o, &c, &err), &err);
  return c;
}

/* The value of the first line of /metrics text that is prefix (a name and
 * its labels), a space and a number; -1 when there is none. */
static inline double h_metric_in(const char *text, const char *prefix) {
  size_t n = strlen(prefix);
  for (const char *p = text; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
    if (strncmp(p, prefix, n) == 0 && p[n] == ' ') return strtod(p + n + 1, NULL);
  return -1.0;
}

/* h_metric_in of s's /metrics now. */
static inline double h_metric(const hserver *s, const char *prefix) {
  char *text = NULL;
  ck_assert_int_eq(h_http(s->http_port, "/metrics", &text), 200);
  double v = h_metric_in(text, prefix);
  free(text);
  return v;
}

/* Polls metric prefix until it equals want (at most timeout_s); returns the
 * last value. */
static inline double h_wait_metric(const hserver *s, const char *prefix, double want,
                                   double timeout_s) {
  double deadline = h_now() + timeout_s, v = -1;
  while ((v = h_metric(s, prefix)) != want && h_now() < deadline) h_sleep_ms(20);
  return v;
}

/* Sends the bytes (any, not only a request) on a fresh req socket to url
 * and waits at most timeout_ms for the reply, which must decode; returns
 * nng_recv's code, and the reply (caller frees) in *out when it is 0. */
static inline int h_raw_call(const char *url, const void *bytes, size_t len, int timeout_ms,
                             Grove__Reply **out) {
  nng_socket sock;
  ck_assert_int_eq(nng_req0_open(&sock), 0);
  nng_socket_set_ms(sock, NNG_OPT_RECVTIMEO, timeout_ms);
  nng_socket_set_ms(sock, NNG_OPT_SENDTIMEO, timeout_ms);
  int rv = nng_dial(sock, url, NULL, 0);
  ck_assert_msg(rv == 0, "dial %s: %s", url, nng_strerror(rv));
  rv = nng_send(sock, (void *)bytes, len, 0);
  ck_assert_msg(rv == 0, "send: %s", nng_strerror(rv));
  void *buf = NULL;
  size_t n = 0;
  rv = nng_recv(sock, &buf, &n, NNG_FLAG_ALLOC);
  if (rv == 0) {
    *out = grove__reply__unpack(NULL, n, buf);
    nng_free(buf, n);
    ck_assert_ptr_nonnull(*out);
  }
  nng_close(sock);
  return rv;
}

/* Sends req as it is (protocol field included) to url, exactly there, and
 * returns the reply's status (failing the test when none came within
 * timeout_ms); its message is copied into msg (may be NULL). */
static inline grove_status h_raw_status(const char *url, Grove__Request *req, int timeout_ms,
                                        char *msg, size_t msgn) {
  size_t n = grove__request__get_packed_size(req);
  uint8_t *buf = malloc(n ? n : 1);
  grove__request__pack(req, buf);
  Grove__Reply *rep = NULL;
  int rv = h_raw_call(url, buf, n, timeout_ms, &rep);
  free(buf);
  ck_assert_msg(rv == 0, "no reply from %s: %s", url, nng_strerror(rv));
  grove_status s = (grove_status)rep->status;
  if (msg) snprintf(msg, msgn, "%s", rep->message ? rep->message : "");
  grove__reply__free_unpacked(rep, NULL);
  return s;
}

/* Sends req (as protocol 1) to url, or an admin RPC (anything but predict,
 * status and metadata) to the admin listener of the groved at url; the
 * decoded reply (caller frees) or NULL when none came within 10 s. */
static inline Grove__Reply *h_raw(const char *url, Grove__Request *req) {
  req->protocol = 1;
  const char *admin = h_admin_of(url);
  if (admin && req->body_case != GROVE__REQUEST__BODY_PREDICT &&
      req->body_case != GROVE__REQUEST__BODY_STATUS &&
      req->body_case != GROVE__REQUEST__BODY_MODEL_METADATA)
    url = admin;
  size_t n = grove__request__get_packed_size(req);
  uint8_t *buf = malloc(n ? n : 1);
  grove__request__pack(req, buf);
  Grove__Reply *rep = NULL;
  if (h_raw_call(url, buf, n, 10000, &rep) != 0) rep = NULL;
  free(buf);
  return rep;
}

/* ------------------------------------------------------------ raw sockets */

static inline int h_tcp_connect(int port) {
  return h_tcp_dial(port, 2);
}

/* A TCP connection to port that has done the SP handshake of a req0 peer
 * (0, 'S', 'P', 0, protocol 0x30 big-endian, 0, 0) and then stays quiet.
 * The server's header is read (at most 2 s; not at all once a server has
 * not sent one: *answering false) so that the pipe exists on groved's side
 * before the next one; -1 when even the connect failed. */
static inline int h_sp_connect(int port, bool *answering) {
  int fd = h_tcp_connect(port);
  if (fd < 0) return -1;
  static const unsigned char hdr[8] = {0, 'S', 'P', 0, 0x00, 0x30, 0, 0};
  if (write(fd, hdr, sizeof hdr) != (ssize_t)sizeof hdr || !*answering) return fd;
  unsigned char got[8];
  size_t n = 0;
  while (n < sizeof got) {
    ssize_t r = read(fd, got + n, sizeof got - n);
    if (r <= 0) break;
    n += (size_t)r;
  }
  if (n < sizeof got) *answering = false;
  return fd;
}

/* Whether the peer has closed fd (EOF or a reset is waiting). */
static inline bool h_peer_closed(int fd) {
  struct pollfd p = {.fd = fd, .events = POLLIN};
  if (poll(&p, 1, 0) <= 0) return false;
  if (p.revents & (POLLHUP | POLLERR)) return true;
  char b[64];
  for (;;) {
    ssize_t r = recv(fd, b, sizeof b, MSG_DONTWAIT);
    if (r == 0) return true;
    if (r < 0) return errno != EAGAIN && errno != EWOULDBLOCK;
    /* Data (the SP header, read already; or anything): keep draining. */
  }
}

/* Copies file src to dst (0 on success). */
static inline int h_copy(const char *src, const char *dst) {
  size_t len = 0;
  char *data = grove_test_read_file(src, &len);
  if (!data) return -1;
  int rc = grove_test_write_file(dst, data, len);
  free(data);
  return rc;
}

/* Rows [r0, r0 + n) of t as a plain view. */
static inline grove_tensor h_rows(const grove_tensor *t, int64_t r0, int64_t n) {
  int64_t shape[GROVE_MAX_DIMS];
  memcpy(shape, t->shape, sizeof shape);
  shape[0] = n;
  size_t row = grove_tensor_nbytes(t) / (size_t)t->shape[0];
  grove_tensor v;
  grove_tensor_init(&v, t->dtype, t->ndim, shape, (char *)t->data + row * (size_t)r0);
  return v;
}

/* A grove.Request (protocol 1, id) predicting model on the one input in,
 * packed into a malloc'd buffer of *len bytes (the caller frees). */
static inline uint8_t *h_pack_predict(const char *model, const grove_tensor *in, uint64_t id,
                                      size_t *len) {
  Grove__Tensor t = GROVE__TENSOR__INIT;
  t.dtype = (int32_t)in->dtype;
  t.n_shape = (size_t)in->ndim;
  t.shape = (int64_t *)in->shape;
  t.data.len = grove_tensor_nbytes(in);
  t.data.data = in->data;
  Grove__Tensor *tp = &t;
  Grove__PredictRequest pr = GROVE__PREDICT_REQUEST__INIT;
  pr.model = (char *)model;
  pr.n_inputs = 1;
  pr.inputs = &tp;
  Grove__Request req = GROVE__REQUEST__INIT;
  req.protocol = 1;
  req.id = id;
  req.body_case = GROVE__REQUEST__BODY_PREDICT;
  req.predict = &pr;
  *len = grove__request__get_packed_size(&req);
  uint8_t *buf = malloc(*len ? *len : 1);
  ck_assert_ptr_nonnull(buf);
  grove__request__pack(&req, buf);
  return buf;
}

/* A model fixture's io.safetensors: inputs x and torch's outputs y. */
typedef struct hio {
  grove_state_dict *sd; /* owns x and y */
  grove_tensor *x, *y;
} hio;

static inline void h_io_load(const char *model, hio *o) {
  char path[4096];
  snprintf(path, sizeof path, "%s/io.safetensors", grove_fixture(model));
  grove_err err = {0};
  ck_assert_ok(grove_safetensors_read(path, &o->sd, &err), &err);
  o->x = grove_sd_get(o->sd, "x");
  o->y = grove_sd_get(o->sd, "y");
  ck_assert_ptr_nonnull(o->x);
  ck_assert_ptr_nonnull(o->y);
}

static inline void h_io_free(hio *o) {
  grove_sd_free(o->sd);
}

/* out equals rows [r0, r0 + n) of y (torch's), within 1e-4 / 1e-5. */
static inline bool h_rows_match(const grove_tensor *out, const grove_tensor *y, int64_t r0,
                                int64_t n) {
  grove_tensor want = h_rows(y, r0, n);
  if (!grove_tensor_same_shape(out, &want) || out->dtype != GROVE_F32) return false;
  return grove_test_allclose(out->data, want.data, (size_t)grove_tensor_numel(&want), 1e-4, 1e-5) <
         0;
}

#endif
