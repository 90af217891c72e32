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
 * being computed or written: then the new one is closed at once), one idle for --idle-timeout (or holding half
 * a request that long) is closed, and libuv's accept keeps a spare descriptor for EMFILE (it
 * accepts and drops the backlog instead of spinning).
 *
 * The server is what its endpoints need: GET, HEAD and POST, keep-alive
 * (HTTP/1.1's default; "Connection: close" and HTTP/1.0 close after the
 * answer), one request at a time per connection (pipelined ones wait their
 * turn, so answers come in order; while they fill the buffer, reading stops
 * until the answer is out), a request head of at most HEAD_MAX bytes
 * (431 beyond), a body by Content-Length of at most --max-request-bytes, the
 * RPC's limit (413 from the headers alone, before any of it is read; a
 * chunked body is refused with 411), "Expect: 100-continue" answered with
 * 100 once the headers were accepted.  Other parts register a route for a
 * path prefix (oip.c: /v2) whose requests they answer now or later
 * (grove__http_answer, on this thread: a worker's answer comes through
 * grove__http_post's queue and a uv_async). */
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
  uv_async_t jobs_async; /* grove__http_post's wake-up */
  pthread_mutex_t jobs_mu;
  srv_http_job *jobs_head, *jobs_tail; /* guarded by jobs_mu */
} srv_http;

/* One connection: two handles (the socket and its idle timer), freed when
 * both have closed. */
struct hconn {
  uv_tcp_t tcp;
  uv_timer_t timer;
  srv_http *h;
  hconn *prev, *next;
  int refs; /* open handles, +1 while a route's answer is pending */
  bool counted, closing, writing, close_after;
  bool pending;   /* a route answers the current request later */
  bool in_body;   /* reading the current request's body */
  bool head_only; /* the current request is a HEAD */
  bool req_close; /* close after the current request's answer */
  bool read_stopped; /* buf is full of pipelined requests: reading waits for the answer */
  size_t len;       /* bytes in buf */
  size_t head_used; /* the current request's head, at the start of buf (0: none) */
  char buf[HEAD_MAX];
  char *body; /* the current request's body: body_len bytes + NUL, body_got read */
  size_t body_len, body_got;
  uv_write_t wr, wr100;
  char top[512]; /* the answer's status line and headers */
  char *out;     /* the answer's body being written (malloc'd), or NULL */
  void (*done)(void *arg); /* the answer's srv_hres.done */
  void *done_arg;
};

typedef srv_hres hres;

static void respond(hres *res, uint16_t code, const char *ctype, const char *body, size_t len) {
  res->code = code;
  res->ctype = ctype;
  res->static_body = body;
  res->body = NULL;
  res->len = len;
  res->extra[0] = 0;
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

static void conn_unref(hconn *c) {
  if (--c->refs > 0) return;
  free(c->out);
  free(c->body);
  free(c);
}

static void conn_handle_closed(uv_handle_t *hd) {
  conn_unref(hd->data);
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
    case 411:
      return "Length Required";
    case 429:
      return "Too Many Requests";
    case 504:
      return "Gateway Timeout";
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
static void on_alloc(uv_handle_t *hd, size_t suggested, uv_buf_t *b);
static void on_read(uv_stream_t *st, ssize_t n, const uv_buf_t *b);

/* Reading again once the answer made room in buf. */
static void resume_read(hconn *c) {
  if (!c->read_stopped || c->closing || c->len == sizeof c->buf) return;
  c->read_stopped = false;
  if (uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read) != 0) conn_close(c);
}

static void call_done(hconn *c) {
  void (*done)(void *) = c->done;
  c->done = NULL;
  if (done) done(c->done_arg);
}

static void on_written(uv_write_t *wr, int status) {
  hconn *c = wr->data;
  c->writing = false;
  free(c->out);
  c->out = NULL;
  call_done(c);
  if (c->closing) return;
  if (status < 0 || c->close_after) {
    conn_close(c);
    return;
  }
  arm_idle(c);
  process(c); /* a pipelined request may be waiting in buf */
  resume_read(c);
}

/* The current request is answered: its head and body go. */
static void end_request(hconn *c) {
  memmove(c->buf, c->buf + c->head_used, c->len - c->head_used);
  c->len -= c->head_used;
  c->head_used = 0;
  free(c->body);
  c->body = NULL;
  c->body_len = c->body_got = 0;
  c->in_body = false;
}

/* Writes res (taking its body) and, with close_after, closes afterwards. */
static void send_res(hconn *c, hres *res, bool head_only, bool close_after) {
  end_request(c);
  const char *body = res->body ? res->body : res->static_body ? res->static_body : "";
  int n = snprintf(c->top, sizeof c->top,
                   "HTTP/1.1 %u %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n%s%s"
                   "Connection: %s\r\n\r\n",
                   (unsigned)res->code, reason(res->code), res->ctype, res->len,
                   res->code == 405 && !res->extra[0] ? "Allow: GET, HEAD\r\n" : "", res->extra,
                   close_after ? "close" : "keep-alive");
  if (n < 0 || (size_t)n >= sizeof c->top) n = 0; /* our bug: extra too long */
  c->out = res->body;
  res->body = NULL;
  c->done = res->done;
  c->done_arg = res->done_arg;
  uv_buf_t b[2] = {uv_buf_init(c->top, (unsigned)n),
                   uv_buf_init((char *)body, head_only ? 0 : (unsigned)res->len)};
  c->writing = true;
  c->close_after = close_after;
  c->wr.data = c;
  /* The idle timeout also bounds the write: a peer that stops reading
   * cannot hold its connection (and the cap) forever. */
  arm_idle(c);
  if (uv_write(&c->wr, (uv_stream_t *)&c->tcp, b, 2, on_written) != 0) {
    c->writing = false;
    free(c->out);
    c->out = NULL;
    call_done(c);
    conn_close(c);
  }
}

void grove__http_answer(hconn *c, srv_hres *res) {
  c->pending = false;
  if (c->closing) { /* the peer went away while the answer was computed */
    free(res->body);
    res->body = NULL;
    if (res->done) res->done(res->done_arg);
    conn_unref(c);
    return;
  }
  conn_unref(c); /* the pending reference; the handles still hold c */
  send_res(c, res, c->head_only, c->req_close);
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

/* The values of header name in [p, end): the first in buf (trimmed, cut to
 * n bytes); returns how many lines carry it. */
static int header_get(const char *p, const char *end, const char *name, char *buf, size_t n) {
  size_t nl = strlen(name);
  int count = 0;
  for (const char *line = p; line < end;) {
    const char *eol = memchr(line, '\n', (size_t)(end - line));
    if (!eol) eol = end;
    if ((size_t)(eol - line) > nl && strncasecmp(line, name, nl) == 0 && line[nl] == ':') {
      const char *v = line + nl + 1, *e = eol;
      while (v < e && (*v == ' ' || *v == '\t')) v++;
      while (e > v && (e[-1] == '\r' || e[-1] == ' ' || e[-1] == '\t')) e--;
      if (count++ == 0 && n) {
        size_t l = (size_t)(e - v) < n - 1 ? (size_t)(e - v) : n - 1;
        memcpy(buf, v, l);
        buf[l] = 0;
      }
    }
    line = eol + 1;
  }
  return count;
}

bool grove__http_header(const srv_hreq *q, const char *name, char *buf, size_t n) {
  return header_get(q->head, q->head + q->head_len, name, buf, n) > 0;
}

/* The request line and headers of the head in buf[0, used) checked: the
 * method, target, body length and whether to close afterwards; false (res
 * filled, the connection to close) when they do not make a request. */
static bool parse_head(hconn *c, size_t used, char *method, char *target, size_t *clen,
                       bool *expect100, hres *res) {
  const char *end = c->buf + used;
  char version[16] = "";
  char line[1024 + 64];
  const char *eol = memchr(c->buf, '\r', used);
  size_t ll = eol ? (size_t)(eol - c->buf) : 0;
  if (ll >= sizeof line) ll = sizeof line - 1;
  memcpy(line, c->buf, ll);
  line[ll] = 0;
  bool parsed = sscanf(line, "%15s %1023s %15s", method, target, version) == 3 &&
                strncmp(version, "HTTP/1.", 7) == 0;
  c->req_close = !parsed || strcmp(version, "HTTP/1.0") == 0
                     ? !header_has(c->buf, end, "Connection", "keep-alive")
                     : header_has(c->buf, end, "Connection", "close");
  c->head_only = strcmp(method, "HEAD") == 0;
  if (!parsed) {
    respond(res, 400, "text/plain; charset=utf-8", "bad request line\n", 17);
    return false;
  }
  /* Every header line is "name: value". */
  const char *hl = memchr(c->buf, '\n', used);
  for (hl = hl ? hl + 1 : end; hl < end - 2;) {
    const char *e = memchr(hl, '\n', (size_t)(end - hl));
    const char *colon = memchr(hl, ':', (size_t)((e ? e : end) - hl));
    if (!colon || colon == hl) {
      respond(res, 400, "text/plain; charset=utf-8", "malformed header line (no 'name:')\n", 35);
      return false;
    }
    hl = e ? e + 1 : end;
  }
  char v[64];
  if (header_get(c->buf, end, "Transfer-Encoding", v, sizeof v) > 0) {
    static const char m[] =
        "Transfer-Encoding is not supported: send the body with a Content-Length\n";
    respond(res, 411, "text/plain; charset=utf-8", m, sizeof m - 1);
    return false;
  }
  *clen = 0;
  int ncl = header_get(c->buf, end, "Content-Length", v, sizeof v);
  if (ncl > 1) {
    static const char m[] = "more than one Content-Length header\n";
    respond(res, 400, "text/plain; charset=utf-8", m, sizeof m - 1);
    return false;
  }
  if (ncl == 1) {
    size_t n = 0;
    bool ok = v[0] != 0;
    for (const char *d = v; *d && ok; d++)
      ok = *d >= '0' && *d <= '9' && !__builtin_mul_overflow(n, 10, &n) &&
           !__builtin_add_overflow(n, (size_t)(*d - '0'), &n);
    if (!ok) {
      static const char m[] = "Content-Length is not a byte count\n";
      respond(res, 400, "text/plain; charset=utf-8", m, sizeof m - 1);
      return false;
    }
    size_t limit = c->h->srv->cfg.max_request_bytes;
    if (n > limit) {
      /* Refused from the headers: nothing of the body is read. */
      char *msg = malloc(256);
      respond(res, 413, "text/plain; charset=utf-8", "request body too large\n", 23);
      if (msg) {
        res->len = (size_t)snprintf(msg, 256,
                                    "request body of %zu bytes is over this server's limit of "
                                    "%zu bytes (groved --max-request-bytes)\n",
                                    n, limit);
        res->body = msg;
      }
      return false;
    }
    *clen = n;
  }
  *expect100 = header_has(c->buf, end, "Expect", "100-continue");
  return true;
}

/* Whether target is under the registered route's prefix. */
static bool under_route(const srv_server *srv, const char *target) {
  size_t n = srv->http_route ? strlen(srv->http_prefix) : 0;
  return n && strncmp(target, srv->http_prefix, n) == 0 && (target[n] == 0 || target[n] == '/' ||
                                                           target[n] == '?');
}

/* A transport error of a route's request in the route's form, {"error":
 * "..."} (the Open Inference Protocol's; these messages hold no character
 * JSON would escape but the newline, which goes). */
static void as_json_error(hres *res) {
  const char *text = res->body ? res->body : res->static_body ? res->static_body : "";
  size_t n = res->len;
  while (n && text[n - 1] == '\n') n--;
  char *j = malloc(n + 16);
  if (!j) return; /* the plain text goes out instead */
  int len = snprintf(j, n + 16, "{\"error\":\"%.*s\"}", (int)n, text);
  free(res->body);
  res->body = j;
  res->static_body = NULL;
  res->len = (size_t)len;
  res->ctype = "application/json";
}

static const char continue_100[] = "HTTP/1.1 100 Continue\r\n\r\n";

static void on_written_100(uv_write_t *wr, int status) {
  (void)wr;
  (void)status; /* a failure shows on the connection's next read or write */
}

/* The current request, head and body complete: to its route or endpoint. */
static void dispatch(hconn *c, const char *method, char *target) {
  hres res = {0};
  srv_server *srv = c->h->srv;
  char *q = strchr(target, '?');
  if (q) *q = 0;
  if (under_route(srv, target)) {
    srv_hreq hq = {.method = method,
                   .path = target,
                   .head = c->buf,
                   .head_len = c->head_used,
                   .body = c->body,
                   .body_len = c->body_len,
                   .conn = c};
    c->pending = true;
    c->refs++;
    if (!srv->http_route(srv, &hq, &res)) return; /* answered later: grove__http_answer */
    grove__http_answer(c, &res);
    return;
  }
  if (strcmp(method, "GET") != 0 && !c->head_only) {
    respond(&res, 405, "text/plain; charset=utf-8", "only GET and HEAD\n", 18);
  } else {
    static const struct {
      const char *path;
      void (*cb)(srv_server *, hres *);
    } routes[] = {{"/healthz", on_healthz}, {"/readyz", on_readyz}, {"/metrics", on_metrics}};
    bool found = false;
    for (size_t i = 0; i < sizeof routes / sizeof routes[0] && !found; i++)
      if (strcmp(target, routes[i].path) == 0) {
        routes[i].cb(srv, &res);
        found = true;
      }
    if (!found) respond(&res, 404, "text/plain; charset=utf-8", "not found\n", 10);
  }
  send_res(c, &res, c->head_only, c->req_close);
}

/* Moves the current request on: its head parsed, its body read, then its
 * answer; and the next pipelined one after it. */
static void process(hconn *c) {
  if (c->writing || c->closing || c->pending) return;
  if (c->in_body) {
    if (c->body_got < c->body_len) return;
    c->in_body = false;
    dispatch(c, c->body + c->body_len + 1, c->body + c->body_len + 1 + 16);
    return;
  }
  char *end = NULL;
  for (size_t i = 3; i < c->len && !end; i++)
    if (c->buf[i] == '\n' && c->buf[i - 1] == '\r' && c->buf[i - 2] == '\n' &&
        c->buf[i - 3] == '\r')
      end = c->buf + i + 1;
  hres res = {0};
  if (!end) {
    if (c->len == sizeof c->buf) {
      respond(&res, 431, "text/plain; charset=utf-8", "request head too large\n", 23);
      c->head_used = c->len;
      send_res(c, &res, false, true);
    }
    return;
  }
  size_t used = (size_t)(end - c->buf);
  c->head_used = used;
  char method[16] = "", target[1024] = "";
  size_t clen = 0;
  bool expect100 = false;
  if (!parse_head(c, used, method, target, &clen, &expect100, &res)) {
    if (under_route(c->h->srv, target)) as_json_error(&res);
    send_res(c, &res, c->head_only, true);
    return;
  }
  if (clen == 0) {
    dispatch(c, method, target);
    return;
  }
  /* The body, with the method and target kept after it (the head's buffer
   * holds pipelined bytes meanwhile): body_len + NUL, method[16], target. */
  size_t tl = strlen(target) + 1;
  c->body = malloc(clen + 1 + 16 + tl);
  if (!c->body) {
    respond(&res, 500, "text/plain; charset=utf-8", "out of memory\n", 14);
    send_res(c, &res, c->head_only, true);
    return;
  }
  c->body_len = clen;
  c->body[clen] = 0;
  memcpy(c->body + clen + 1, method, 16);
  memcpy(c->body + clen + 1 + 16, target, tl);
  size_t avail = c->len - used, take = avail < clen ? avail : clen;
  memcpy(c->body, c->buf + used, take);
  memmove(c->buf + used, c->buf + used + take, avail - take);
  c->len -= take;
  c->body_got = take;
  c->in_body = true;
  if (c->body_got < c->body_len && expect100) {
    uv_buf_t b = uv_buf_init((char *)continue_100, sizeof continue_100 - 1);
    c->wr100.data = c;
    if (uv_write(&c->wr100, (uv_stream_t *)&c->tcp, &b, 1, on_written_100) != 0) {
      conn_close(c);
      return;
    }
  }
  process(c);
}

static void on_alloc(uv_handle_t *hd, size_t suggested, uv_buf_t *b) {
  (void)suggested;
  hconn *c = hd->data;
  /* A body is read straight into its buffer, never past its end: what
   * follows it is the next request's, for buf. */
  size_t want = c->body_len - c->body_got;
  if (c->in_body && want)
    *b = uv_buf_init(c->body + c->body_got, want > (1u << 30) ? 1u << 30 : (unsigned)want);
  else
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
  if (c->in_body && c->body_got < c->body_len)
    c->body_got += (size_t)n;
  else
    c->len += (size_t)n;
  touch(c);
  arm_idle(c); /* also bounds how long half a request may take */
  process(c);
  /* Pipelined requests filled buf while one is computed or written: stop
   * reading (TCP holds the peer back) until its answer makes room. */
  if (!c->closing && !c->in_body && c->len == sizeof c->buf && (c->writing || c->pending)) {
    uv_read_stop(st);
    c->read_stopped = true;
  }
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
  c->refs = 2;
  if (uv_accept(server, (uv_stream_t *)&c->tcp) != 0) {
    push_conn(c);
    conn_close(c);
    return;
  }
  if (atomic_load(&h->plane->open) >= h->plane->cap && h->tail && !h->tail->writing &&
      !h->tail->pending) {
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

/* Runs the jobs posted so far (the HTTP thread, or http_free's caller once
 * the thread is gone). */
static void run_jobs(srv_http *h) {
  pthread_mutex_lock(&h->jobs_mu);
  srv_http_job *j = h->jobs_head;
  h->jobs_head = h->jobs_tail = NULL;
  pthread_mutex_unlock(&h->jobs_mu);
  while (j) {
    srv_http_job *next = j->next;
    j->fn(j);
    j = next;
  }
}

static void on_jobs(uv_async_t *a) {
  run_jobs(a->data);
}

void grove__http_post(srv_server *srv, srv_http_job *job) {
  srv_http *h = srv->http;
  job->next = NULL;
  pthread_mutex_lock(&h->jobs_mu);
  if (h->jobs_tail)
    h->jobs_tail->next = job;
  else
    h->jobs_head = job;
  h->jobs_tail = job;
  pthread_mutex_unlock(&h->jobs_mu);
  uv_async_send(&h->jobs_async);
}

void grove__http_set_route(srv_server *srv, const char *prefix, srv_http_route fn) {
  srv->http_prefix = prefix;
  srv->http_route = fn;
}

static void on_stop(uv_async_t *a) {
  srv_http *h = a->data;
  while (h->head) conn_close(h->head);
  uv_close((uv_handle_t *)&h->listener, NULL);
  uv_close((uv_handle_t *)&h->stop, NULL);
  uv_close((uv_handle_t *)&h->jobs_async, NULL);
}

static void *http_main(void *arg) {
  srv_http *h = arg;
  uv_run(&h->loop, UV_RUN_DEFAULT);
  return NULL;
}

static void http_free(srv_http *h) {
  /* Answers a worker posted after the thread stopped find their
   * connections closed and free them; whatever is still open (a start that
   * failed half-way) closes here. */
  run_jobs(h);
  uv_walk(&h->loop, close_walk, NULL);
  uv_run(&h->loop, UV_RUN_DEFAULT);
  uv_loop_close(&h->loop);
  pthread_mutex_destroy(&h->jobs_mu);
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
  pthread_mutex_init(&h->jobs_mu, NULL);
  int rv = uv_loop_init(&h->loop);
  if (rv) {
    pthread_mutex_destroy(&h->jobs_mu);
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
  uv_async_init(&h->loop, &h->jobs_async, on_jobs);
  h->jobs_async.data = h;
  /* Set before the thread starts: a worker may post as soon as a request
   * was routed. */
  srv->http = h;
  if ((rv = pthread_create(&h->thread, NULL, http_main, h)) != 0) {
    srv->http = NULL;
    http_free(h);
    return grove_err_set(err, GROVE_E_INTERNAL, "cannot start the HTTP thread: %s", strerror(rv));
  }
  h->thread_started = true;
  grove__slog(GROVE_LOG_INFO, "server.http", "HTTP on http://%s (/healthz /readyz /metrics%s)", spec,
              srv->http_route ? " /v2" : "");
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
