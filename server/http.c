/* http.c: groved's HTTP endpoints (--http HOST:PORT), served by a small
 * HTTP/1.1 server on a libuv loop of its own thread.
 *
 *   GET /healthz   200 "ok": the process is up and its loop answers HTTP
 *   GET /readyz    200 "ready" when every configured model is loaded and
 *                  groved is not draining; otherwise 503 with one line per
 *                  reason ("model digits: not loaded: ...", "draining")
 *   GET /metrics   Prometheus text (metrics.c)
 *
 * Handlers run on the HTTP thread and read only atomics and the immutable
 * model table, so they never wait for groved's loop: /metrics answers even
 * when the loop is busy.
 *
 * Not NNG's HTTP server: NNG 1.5.2's retries a failed accept at once, so at
 * EMFILE it spins at 100% CPU, and it can neither cap its connections nor
 * close idle ones.  Here a connection over the HTTP plane's cap (conns.c) is
 * accepted after closing the connection quiet longest (none with an answer
 * being written: then the new one is closed at once), one idle for --idle-timeout (or holding half
 * a request that long) is closed, and libuv's accept keeps a spare descriptor for EMFILE (it
 * accepts and drops the backlog instead of spinning).
 *
 * The server is what the three endpoints need: GET and HEAD, keep-alive
 * (HTTP/1.1's default; "Connection: close" and HTTP/1.0 close after the
 * answer), one request at a time per connection (pipelined ones wait their
 * turn), a request head of at most HEAD_MAX bytes (431 beyond), no request
 * bodies (413). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <inttypes.h>
#include <netdb.h>
#include <pthread.h>
#include <strings.h>

#include <uv.h>

#include "server.h"

#define HEAD_MAX 8192

typedef struct hconn hconn;

/* The HTTP thread's state (srv->http). */
typedef struct srv_http {
  srv_server *srv;
  uv_loop_t loop;
  uv_tcp_t listener;
  uv_async_t stop;
  pthread_t thread;
  bool thread_started;
  srv_plane *plane;
  uint64_t idle_ms;   /* 0: never */
  hconn *head, *tail; /* every open connection, most recently active first */
} srv_http;

/* One connection: two handles (the socket and its idle timer), freed when
 * both have closed. */
struct hconn {
  uv_tcp_t tcp;
  uv_timer_t timer;
  srv_http *h;
  hconn *prev, *next;
  int handles; /* open handles */
  bool counted, closing, writing, close_after;
  size_t len;
  char buf[HEAD_MAX];
  uv_write_t wr;
  char *out; /* the answer being written */
};

/* What a handler answers. */
typedef struct hres {
  uint16_t code;
  const char *ctype;
  char *body; /* malloc'd, or NULL with static_body */
  const char *static_body;
  size_t len;
} hres;

static void respond(hres *res, uint16_t code, const char *ctype, const char *body, size_t len) {
  res->code = code;
  res->ctype = ctype;
  res->static_body = body;
  res->body = NULL;
  res->len = len;
}

static void on_healthz(srv_server *srv, hres *res) {
  (void)srv;
  respond(res, 200, "text/plain; charset=utf-8", "ok\n", 3);
}

static void on_readyz(srv_server *srv, hres *res) {
  char body[8192];
  size_t used = 0;
  bool ready = true;
  for (size_t i = 0; i < srv->nmodels; i++) {
    srv_model *m = &srv->models[i];
    if (atomic_load(&m->version_number) > 0) continue;
    ready = false;
    int w = snprintf(body + used, sizeof body - used, "model %s: not loaded: %s\n", m->name,
                     m->error ? m->error : "unknown error");
    if (w > 0) used += (size_t)w < sizeof body - used ? (size_t)w : sizeof body - used - 1;
  }
  if (atomic_load(&srv->draining)) {
    ready = false;
    int w = snprintf(body + used, sizeof body - used, "draining: groved is shutting down\n");
    if (w > 0) used += (size_t)w < sizeof body - used ? (size_t)w : sizeof body - used - 1;
  }
  if (ready) {
    respond(res, 200, "text/plain; charset=utf-8", "ready\n", 6);
    return;
  }
  respond(res, 503, "text/plain; charset=utf-8", NULL, used);
  res->body = malloc(used ? used : 1);
  if (res->body)
    memcpy(res->body, body, used);
  else
    respond(res, 500, "text/plain; charset=utf-8", "out of memory\n", 14);
}

static void on_metrics(srv_server *srv, hres *res) {
  char *text = NULL;
  size_t len = 0;
  if (grove__metrics_render(srv, &text, &len)) {
    respond(res, 500, "text/plain; charset=utf-8", "out of memory\n", 14);
    return;
  }
  respond(res, 200, "text/plain; version=0.0.4; charset=utf-8", NULL, len);
  res->body = text;
}

/* ------------------------------------------------------------ connections */

static void unlink_conn(hconn *c) {
  srv_http *h = c->h;
  if (c->prev)
    c->prev->next = c->next;
  else if (h->head == c)
    h->head = c->next;
  if (c->next)
    c->next->prev = c->prev;
  else if (h->tail == c)
    h->tail = c->prev;
  c->prev = c->next = NULL;
}

static void push_conn(hconn *c) {
  srv_http *h = c->h;
  c->prev = NULL;
  c->next = h->head;
  if (h->head)
    h->head->prev = c;
  else
    h->tail = c;
  h->head = c;
}

/* c carried something: to the front, away from eviction. */
static void touch(hconn *c) {
  if (c->closing || c->h->head == c) return;
  unlink_conn(c);
  push_conn(c);
}

static void conn_handle_closed(uv_handle_t *hd) {
  hconn *c = hd->data;
  if (--c->handles > 0) return;
  free(c->out);
  free(c);
}

static void conn_close(hconn *c) {
  if (c->closing) return;
  c->closing = true;
  unlink_conn(c);
  if (c->counted) atomic_fetch_sub(&c->h->plane->open, 1);
  uv_close((uv_handle_t *)&c->tcp, conn_handle_closed);
  uv_close((uv_handle_t *)&c->timer, conn_handle_closed);
}

static void on_idle(uv_timer_t *t) {
  hconn *c = t->data;
  atomic_fetch_add(&c->h->plane->idle_closed, 1);
  conn_close(c);
}

static void arm_idle(hconn *c) {
  if (c->h->idle_ms) uv_timer_start(&c->timer, on_idle, c->h->idle_ms, 0);
}

static const char *reason(uint16_t code) {
  switch (code) {
    case 200:
      return "OK";
    case 400:
      return "Bad Request";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 413:
      return "Content Too Large";
    case 431:
      return "Request Header Fields Too Large";
    case 500:
      return "Internal Server Error";
    case 503:
      return "Service Unavailable";
    default:
      return "Unknown";
  }
}

static void process(hconn *c);

static void on_written(uv_write_t *wr, int status) {
  hconn *c = wr->data;
  c->writing = false;
  free(c->out);
  c->out = NULL;
  if (c->closing) return;
  if (status < 0 || c->close_after) {
    conn_close(c);
    return;
  }
  arm_idle(c);
  process(c); /* a pipelined request may be waiting in buf */
}

/* Writes res (taking its body) and, with close_after, closes afterwards. */
static void send_res(hconn *c, hres *res, bool head_only, bool close_after) {
  const char *body = res->body ? res->body : res->static_body ? res->static_body : "";
  char top[320];
  int n = snprintf(top, sizeof top,
                   "HTTP/1.1 %u %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n%s"
                   "Connection: %s\r\n\r\n",
                   (unsigned)res->code, reason(res->code), res->ctype, res->len,
                   res->code == 405 ? "Allow: GET, HEAD\r\n" : "",
                   close_after ? "close" : "keep-alive");
  size_t blen = head_only ? 0 : res->len;
  c->out = malloc((size_t)n + blen);
  if (!c->out) {
    free(res->body);
    conn_close(c);
    return;
  }
  memcpy(c->out, top, (size_t)n);
  memcpy(c->out + n, body, blen);
  free(res->body);
  res->body = NULL;
  uv_buf_t b = uv_buf_init(c->out, (unsigned)((size_t)n + blen));
  c->writing = true;
  c->close_after = close_after;
  c->wr.data = c;
  /* The idle timeout also bounds the write: a peer that stops reading
   * cannot hold its connection (and the cap) forever. */
  arm_idle(c);
  if (uv_write(&c->wr, (uv_stream_t *)&c->tcp, &b, 1, on_written) != 0) {
    c->writing = false;
    conn_close(c);
  }
}

/* Case-insensitive search for a header line "name: value" holding token in
 * the head [p, end). */
static bool header_has(const char *p, const char *end, const char *name, const char *token) {
  size_t nl = strlen(name), tl = strlen(token);
  for (const char *line = p; line < end;) {
    const char *eol = memchr(line, '\n', (size_t)(end - line));
    if (!eol) eol = end;
    if ((size_t)(eol - line) > nl && strncasecmp(line, name, nl) == 0 && line[nl] == ':') {
      for (const char *v = line + nl + 1; v + tl <= eol; v++)
        if (strncasecmp(v, token, tl) == 0) return true;
    }
    line = eol + 1;
  }
  return false;
}

/* Answers the first complete request in c->buf, if there is one. */
static void process(hconn *c) {
  if (c->writing || c->closing) return;
  char *end = NULL;
  for (size_t i = 3; i < c->len && !end; i++)
    if (c->buf[i] == '\n' && c->buf[i - 1] == '\r' && c->buf[i - 2] == '\n' &&
        c->buf[i - 3] == '\r')
      end = c->buf + i + 1;
  hres res = {0};
  if (!end) {
    if (c->len == sizeof c->buf) {
      respond(&res, 431, "text/plain; charset=utf-8", "request head too large\n", 23);
      send_res(c, &res, false, true);
    }
    return;
  }
  size_t used = (size_t)(end - c->buf);
  /* The request line: METHOD SP TARGET SP HTTP/1.x */
  char method[16] = "", target[1024] = "", version[16] = "";
  char line[sizeof target + 64];
  const char *eol = memchr(c->buf, '\r', used);
  size_t ll = eol ? (size_t)(eol - c->buf) : 0;
  if (ll >= sizeof line) ll = sizeof line - 1;
  memcpy(line, c->buf, ll);
  line[ll] = 0;
  bool parsed = sscanf(line, "%15s %1023s %15s", method, target, version) == 3 &&
                strncmp(version, "HTTP/1.", 7) == 0;
  bool close_after = !parsed || strcmp(version, "HTTP/1.0") == 0
                         ? !header_has(c->buf, end, "Connection", "keep-alive")
                         : header_has(c->buf, end, "Connection", "close");
  bool head_only = strcmp(method, "HEAD") == 0;
  if (!parsed) {
    respond(&res, 400, "text/plain; charset=utf-8", "bad request line\n", 17);
    close_after = true;
  } else if (header_has(c->buf, end, "Transfer-Encoding", "chunked") ||
             (header_has(c->buf, end, "Content-Length", "") &&
              !header_has(c->buf, end, "Content-Length", " 0"))) {
    /* No endpoint takes a body, and skipping one is not worth the code. */
    respond(&res, 413, "text/plain; charset=utf-8", "no endpoint takes a request body\n", 33);
    close_after = true;
  } else if (strcmp(method, "GET") != 0 && !head_only) {
    respond(&res, 405, "text/plain; charset=utf-8", "only GET and HEAD\n", 18);
  } else {
    char *q = strchr(target, '?');
    if (q) *q = 0;
    static const struct {
      const char *path;
      void (*cb)(srv_server *, hres *);
    } routes[] = {{"/healthz", on_healthz}, {"/readyz", on_readyz}, {"/metrics", on_metrics}};
    bool found = false;
    for (size_t i = 0; i < sizeof routes / sizeof routes[0] && !found; i++)
      if (strcmp(target, routes[i].path) == 0) {
        routes[i].cb(c->h->srv, &res);
        found = true;
      }
    if (!found) respond(&res, 404, "text/plain; charset=utf-8", "not found\n", 10);
  }
  memmove(c->buf, end, c->len - used);
  c->len -= used;
  send_res(c, &res, head_only, close_after);
}

static void on_alloc(uv_handle_t *hd, size_t suggested, uv_buf_t *b) {
  (void)suggested;
  hconn *c = hd->data;
  *b = uv_buf_init(c->buf + c->len, (unsigned)(sizeof c->buf - c->len));
}

static void on_read(uv_stream_t *st, ssize_t n, const uv_buf_t *b) {
  (void)b;
  hconn *c = st->data;
  if (n < 0) {
    conn_close(c);
    return;
  }
  if (n == 0) return;
  c->len += (size_t)n;
  touch(c);
  arm_idle(c); /* also bounds how long half a request may take */
  /* A peer that fills the buffer with pipelined requests while an answer
   * is being written gets no more room (on_alloc): libuv reports
   * UV_ENOBUFS and the connection closes. */
  process(c);
}

static void on_connection(uv_stream_t *server, int status) {
  srv_http *h = server->data;
  /* UV_EMFILE: libuv already accepted and dropped the backlog with its
   * spare descriptor; there is nothing to accept. */
  if (status < 0) return;
  hconn *c = calloc(1, sizeof *c);
  if (!c) return; /* left in the backlog: the next connection tries again */
  c->h = h;
  uv_tcp_init(&h->loop, &c->tcp);
  uv_timer_init(&h->loop, &c->timer);
  c->tcp.data = c->timer.data = c;
  c->handles = 2;
  if (uv_accept(server, (uv_stream_t *)&c->tcp) != 0) {
    push_conn(c);
    conn_close(c);
    return;
  }
  if (atomic_load(&h->plane->open) >= h->plane->cap && h->tail && !h->tail->writing) {
    /* Make room: the quietest goes (conns.c does the same for NNG's). */
    atomic_fetch_add(&h->plane->evicted, 1);
    conn_close(h->tail);
  }
  push_conn(c);
  if (atomic_load(&h->plane->open) >= h->plane->cap) {
    uint64_t n = atomic_fetch_add(&h->plane->refused, 1);
    if (n % 1000 == 0)
      grove__slog(GROVE_LOG_WARN, "server.connection_refused",
                  "http listener: %zu connections open, its cap, each being answered; "
                  "refusing new ones "
                  "(%" PRIu64 " refused so far)",
                  h->plane->cap, n + 1);
    conn_close(c);
    return;
  }
  atomic_fetch_add(&h->plane->open, 1);
  c->counted = true;
  uv_tcp_nodelay(&c->tcp, 1);
  arm_idle(c);
  if (uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read) != 0) conn_close(c);
}

/* ------------------------------------------------------------ thread */

static void close_walk(uv_handle_t *hd, void *arg) {
  (void)arg;
  if (!uv_is_closing(hd)) uv_close(hd, NULL);
}

static void on_stop(uv_async_t *a) {
  srv_http *h = a->data;
  while (h->head) conn_close(h->head);
  uv_close((uv_handle_t *)&h->listener, NULL);
  uv_close((uv_handle_t *)&h->stop, NULL);
}

static void *http_main(void *arg) {
  srv_http *h = arg;
  uv_run(&h->loop, UV_RUN_DEFAULT);
  return NULL;
}

static void http_free(srv_http *h) {
  /* Whatever is still open (a start that failed half-way) closes here. */
  uv_walk(&h->loop, close_walk, NULL);
  uv_run(&h->loop, UV_RUN_DEFAULT);
  uv_loop_close(&h->loop);
  free(h);
}

grove_status grove__http_start(srv_server *srv, grove_err *err) {
  if (!srv->cfg.http) return GROVE_OK;
  const char *spec = srv->cfg.http;
  const char *colon = strrchr(spec, ':');
  char host[256];
  size_t hl = colon ? (size_t)(colon - spec) : 0;
  if (!colon || hl >= sizeof host || !colon[1])
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT, "--http %s: wants HOST:PORT", spec);
  memcpy(host, spec, hl);
  host[hl] = 0;
  /* [::1]:7701 */
  if (hl >= 2 && host[0] == '[' && host[hl - 1] == ']') {
    memmove(host, host + 1, hl - 2);
    host[hl - 2] = 0;
  }
  srv_http *h = calloc(1, sizeof *h);
  if (!h) return grove_err_set(err, GROVE_E_NOMEM, "out of memory");
  h->srv = srv;
  h->idle_ms = (uint64_t)srv->cfg.idle_timeout_s * 1000;
  h->plane = grove__conns_plane(srv, "http", grove__conns_default_cap(srv, false), true);
  if (!h->plane) {
    free(h);
    return grove_err_set(err, GROVE_E_INTERNAL, "too many listeners for conns.c");
  }
  int rv = uv_loop_init(&h->loop);
  if (rv) {
    free(h);
    return grove_err_set(err, GROVE_E_INTERNAL, "HTTP loop: %s", uv_strerror(rv));
  }
  struct addrinfo hints = {
      .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV | AI_PASSIVE};
  uv_getaddrinfo_t gai;
  rv = uv_getaddrinfo(&h->loop, &gai, NULL, host[0] ? host : NULL, colon + 1, &hints);
  if (rv) {
    http_free(h);
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT, "--http %s: %s", spec, uv_strerror(rv));
  }
  uv_tcp_init(&h->loop, &h->listener);
  h->listener.data = h;
  rv = uv_tcp_bind(&h->listener, gai.addrinfo->ai_addr, 0);
  uv_freeaddrinfo(gai.addrinfo);
  if (!rv) rv = uv_listen((uv_stream_t *)&h->listener, 128, on_connection);
  if (rv) {
    http_free(h);
    return grove_err_set(err, GROVE_E_IO, "cannot serve HTTP on %s: %s", spec, uv_strerror(rv));
  }
  uv_async_init(&h->loop, &h->stop, on_stop);
  h->stop.data = h;
  if ((rv = pthread_create(&h->thread, NULL, http_main, h)) != 0) {
    http_free(h);
    return grove_err_set(err, GROVE_E_INTERNAL, "cannot start the HTTP thread: %s", strerror(rv));
  }
  h->thread_started = true;
  srv->http = h;
  grove__slog(GROVE_LOG_INFO, "server.http", "HTTP on http://%s (/healthz /readyz /metrics)", spec);
  return GROVE_OK;
}

void grove__http_stop(srv_server *srv) {
  srv_http *h = srv->http;
  if (!h) return;
  uv_async_send(&h->stop);
  pthread_join(h->thread, NULL);
  http_free(h);
  srv->http = NULL;
}
