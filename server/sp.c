/* sp.c: the data plane's connections read and written on the libuv loop
 * (--data-io loop), speaking NNG's wire protocol so that every NNG req0
 * client (libgrove-client, the Python client, the grove CLI) works as it is.
 *
 * Why: with NNG's own listener a lone request crosses NNG's I/O and task
 * threads, the loop and a worker, 8-10 context switches and 40-60 µs of CPU
 * (docs/performance.md, "The request path (#20)").  Here the loop reads the
 * socket, decodes and dispatches (grove__rpc_dispatch, the same entry as
 * NNG's contexts and the HTTP front end), and writes the replies.
 *
 * The wire is NNG's SP (client/sp_wire.h, the codec this file and
 * libgrove-client's SP transport share): the 8-byte handshake (a peer
 * whose bytes are not SP with req0's id is closed), 64-bit framing (IPC's
 * type byte first), and the backtrace each request begins with, echoed on
 * its reply.  More than SP_MAX_HOPS words: the message is dropped (rep0's
 * TTL); a message that ends before its request id: the connection is
 * closed, as NNG does.
 *
 * Hostile peers: a length over grove__rpc_recv_max closes the connection
 * before anything of the message is buffered (one log line per
 * LOG_EVERY); a peer that does not complete the handshake in
 * HANDSHAKE_MS is closed; a half-written message is idle as far as conns.c
 * is concerned (--idle-timeout closes it, and at the cap it is the first to
 * go: every connection is admitted at accept); a peer that stops reading
 * its replies holds at most OUT_HIGH bytes before its connection stops
 * being read, and is closed when a write makes no progress for SEND_MS.
 * Requests in flight on all connections together are capped at
 * grove__rpc_max_inflight (NNG's context count): past it, connections stop
 * being read until replies go out.  No call here blocks.
 *
 * Replies: a worker (or any thread that answers) writes its reply itself,
 * one non-blocking writev, when the connection has nothing queued and its
 * lock is free (never waiting for it); what it cannot write is queued for
 * the loop.  Either way the request then goes to the outbox, one
 * mutex-guarded list, for the loop's bookkeeping (its connection's
 * reference, the window), and the loop is woken only when the list was
 * empty: a batch's replies cost one wake-up.  A reply the worker did not
 * write goes out from the loop: uv_try_write first (a whole reply in one
 * writev), the rest queued and written with uv_write.  Writing from the
 * worker measured better than handing every reply to the loop: at 32
 * clients it halved the context switches per request, client and server
 * together (docs/performance.md, "The request path (#20)"), since the
 * replies go out as the batch finishes instead of when the loop wakes.
 *
 * Threads: everything here is the loop thread's but sp_deliver (any thread:
 * worker_write under the connection's wmu, then the outbox) and sp_close_id
 * (conns.c's sweeper, the outbox).  A request
 * holds a reference to its connection, so a connection that closes while
 * its requests are on workers lives until their replies come back (and are
 * dropped).
 *
 * Layer: beside rpc.c (it dispatches through rpc.c and tells conns.c);
 * lifecycle.c starts and stops it. */
#include <errno.h>
#include <inttypes.h>
#include <netdb.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include "base.h"
#include "server.h"
#include "sp_wire.h"

#define MAX_HOPS SP_MAX_HOPS
#define HANDSHAKE_MS 10000 /* NNG's negotiation timeout */
#define SEND_MS 10000      /* rpc.c's SEND_TIMEOUT_MS: a reply's write may stall that long */
#define READ_BUF (16 * 1024)
#define BIG_FIRST ((size_t)256 << 10) /* a large message's first buffer; doubles as it fills */
#define OUT_HIGH ((size_t)4 << 20) /* queued reply bytes past which reading stops */
#define OUT_LOW ((size_t)1 << 20)  /* ... and below which it resumes */
#define LOG_EVERY 1000
#define BACKLOG 511

enum { PAUSE_WINDOW = 1, PAUSE_OUT = 2 };

/* What a closed peer did wrong: each kind logged the first time and then
 * once in LOG_EVERY, so that a flood of one kind hides no other. */
enum {
  BAD_HANDSHAKE,
  BAD_PROTOCOL,
  BAD_TOO_LARGE,
  BAD_NO_ID,
  BAD_FRAME,
  BAD_HS_TIMEOUT,
  BAD_STALLED,
  BAD_KINDS
};
static const char *const bad_ids[BAD_KINDS] = {
    "sp.bad_handshake", "sp.bad_protocol",       "sp.too_large",   "sp.no_request_id",
    "sp.bad_frame",     "sp.handshake_timeout", "sp.send_stalled"};

typedef struct srv_sp srv_sp;
typedef struct sp_conn sp_conn;

/* One request: the srv_req rpc.c and the features see (first, so that a
 * srv_req * is an sp_req *), its connection and the backtrace to echo. */
typedef struct sp_req {
  srv_req r;
  sp_conn *c;
  uint8_t bt[4 * MAX_HOPS];
  uint8_t btlen;
  /* The worker wrote the reply (whole, or the rest is queued: kick), or
   * failed to queue its rest (cut: the connection must close). */
  bool written, kick, cut;
  struct sp_req *onext; /* the outbox or the free list */
} sp_req;

typedef struct sp_listener {
  union {
    uv_tcp_t tcp;
    uv_pipe_t pipe;
    uv_stream_t stream;
  } h;
  srv_sp *sp;
  bool ipc;
  char *url;
  char *path; /* IPC: removed at stop */
  /* A connection taken off the backlog and closed when there is no memory
   * for it (libuv stops polling a listener whose connection was not
   * accepted). */
  union {
    uv_tcp_t tcp;
    uv_pipe_t pipe;
    uv_stream_t stream;
  } drop;
  bool drop_busy;
} sp_listener;

struct sp_conn {
  union {
    uv_tcp_t tcp;
    uv_pipe_t pipe;
    uv_stream_t stream;
  } h;
  uv_timer_t timer; /* the handshake's, then a stalled write's */
  srv_sp *sp;
  uint32_t id;
  bool ipc, shook, closing, writing;
  int paused; /* PAUSE_* bits; reading stops while any is set */
  bool on_paused;
  sp_conn *pnext; /* sp->paused list (PAUSE_WINDOW) */
  int refs;       /* open handles (2) + requests in flight */
  uint8_t hs[8];  /* our handshake, while it is being written */
  uv_write_t hs_wr;
  uint8_t *buf; /* READ_BUF bytes: handshake, heads, small messages */
  size_t len;
  uint8_t *big; /* a message larger than buf, read into its own buffer */
  size_t big_len, big_got;
  size_t big_cap; /* big's size: grows with what arrived, up to big_len */
  uv_write_t wr;
  uint8_t *wbuf, *qbuf; /* being written; queued behind it */
  size_t wlen, wcap, qlen, qcap;
  uint32_t wreplies, qreplies; /* replies (srv->sending) in each */
  /* A worker writes a reply itself when nothing is queued (worker_write):
   * wmu (recursive: the loop's writes nest) guards closing, writing and
   * the queue, which the loop changes only under it. */
  pthread_mutex_t wmu;
  int fd;
};

struct srv_sp {
  srv_server *srv;
  sp_listener *ls;
  size_t nls;
  srv_plane *plane;
  pthread_t loop_tid;
  srv_waker wake; /* the outbox's (loop.c) */
  bool async_open, stopped;
  size_t maxmsg;
  /* outbox: any thread -> loop */
  pthread_mutex_t mu;
  sp_req *out_head, *out_tail;
  uint32_t *close_ids; /* conns.c's evictions and idle closes */
  size_t nclose, capclose;
  /* loop thread */
  grove__pmap conns; /* id -> sp_conn */
  uint32_t next_id;
  size_t inflight, window;
  sp_conn *paused;
  bool unpausing;
  sp_req *free_reqs;
  size_t nfree;
  uint64_t bad[BAD_KINDS]; /* hostile peers by kind, for the log's rate limit */
};

/* ------------------------------------------------------------ helpers */

static bool on_loop(const srv_sp *sp) {
  return pthread_equal(pthread_self(), sp->loop_tid);
}

/* A bad peer of kind k (loop thread): logged, rate-limited; the caller
 * closes it. */
static void bad_peer(sp_conn *c, int k, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void bad_peer(sp_conn *c, int k, const char *fmt, ...) {
  uint64_t n = c->sp->bad[k]++;
  if (n % LOG_EVERY) return;
  const char *id = bad_ids[k];
  char text[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(text, sizeof text, fmt, ap);
  va_end(ap);
  grove__slog(GROVE_LOG_WARN, id, "connection %" PRIu32 " (%s): %s; closed (%" PRIu64 " so far)",
              c->id & 0x7fffffff, c->ipc ? "ipc" : "tcp", text, n + 1);
}

static void sending_done(srv_sp *sp, uint32_t n) {
  if (!n) return;
  srv_server *srv = sp->srv;
  atomic_fetch_sub(&srv->sending, n);
  if (atomic_load(&srv->draining)) srv->rpc.wake(srv);
}

/* ------------------------------------------------------------ connections */

static void conn_unref(sp_conn *c) {
  if (--c->refs > 0) return;
  pthread_mutex_destroy(&c->wmu);
  free(c->wbuf);
  free(c);
}

static void conn_handle_closed(uv_handle_t *h) {
  conn_unref(h->data);
}

static void unpause_window(srv_sp *sp);

static void conn_close(sp_conn *c) {
  if (c->closing) return;
  pthread_mutex_lock(&c->wmu);
  c->closing = true;
  srv_sp *sp = c->sp;
  if (c->on_paused) {
    sp_conn **pp = &sp->paused;
    while (*pp != c) pp = &(*pp)->pnext;
    *pp = c->pnext;
    c->on_paused = false;
  }
  grove__pmap_del(&sp->conns, (const void *)(uintptr_t)c->id);
  grove__conns_forget(sp->plane, c->id);
  /* The queued replies will never be written; the one being written
   * fails in on_written. */
  sending_done(sp, c->qreplies);
  c->qreplies = 0;
  free(c->qbuf);
  c->qbuf = NULL;
  c->qlen = c->qcap = 0;
  free(c->buf);
  c->buf = NULL;
  free(c->big);
  c->big = NULL;
  uv_close((uv_handle_t *)&c->h.stream, conn_handle_closed);
  pthread_mutex_unlock(&c->wmu);
  uv_close((uv_handle_t *)&c->timer, conn_handle_closed);
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *b);
static void on_read(uv_stream_t *st, ssize_t n, const uv_buf_t *b);
static void parse(sp_conn *c);

static void pause_conn(sp_conn *c, int why) {
  if (c->closing) return;
  if (!c->paused) uv_read_stop(&c->h.stream);
  c->paused |= why;
  if (why == PAUSE_WINDOW && !c->on_paused) {
    c->on_paused = true;
    c->pnext = c->sp->paused;
    c->sp->paused = c;
  }
}

static void resume_conn(sp_conn *c, int why) {
  if (c->closing || !(c->paused & why)) return;
  c->paused &= ~why;
  if (c->paused) return;
  parse(c); /* what was read before the pause */
  if (!c->closing && !c->paused && uv_read_start(&c->h.stream, on_alloc, on_read) != 0)
    conn_close(c);
}

static void unpause_window(srv_sp *sp) {
  /* A resumed connection's requests may be answered at once (status),
   * which comes back here: the outer call goes on resuming, so the stack
   * does not grow with the number of paused connections. */
  if (sp->unpausing) return;
  sp->unpausing = true;
  while (sp->paused && sp->inflight < sp->window) {
    sp_conn *c = sp->paused;
    sp->paused = c->pnext;
    c->on_paused = false;
    resume_conn(c, PAUSE_WINDOW);
  }
  sp->unpausing = false;
}

static void on_timer(uv_timer_t *t) {
  sp_conn *c = t->data;
  if (!c->shook)
    bad_peer(c, BAD_HS_TIMEOUT, "no SP handshake within %d ms", HANDSHAKE_MS);
  else
    bad_peer(c, BAD_STALLED, "the peer read none of its replies for %d ms", SEND_MS);
  conn_close(c);
}

/* ------------------------------------------------------------ replies */

static bool append(uint8_t **buf, size_t *len, size_t *cap, const void *p, size_t n) {
  if (n > SIZE_MAX - *len) return false;
  if (*len + n > *cap) {
    size_t want = *cap ? *cap : 4096;
    while (want < *len + n) want = want > SIZE_MAX / 2 ? *len + n : want * 2;
    uint8_t *nb = realloc(*buf, want);
    if (!nb) return false;
    *buf = nb;
    *cap = want;
  }
  memcpy(*buf + *len, p, n);
  *len += n;
  return true;
}

static void start_write(sp_conn *c);
static void on_written_locked(sp_conn *c, int status);

static void on_written(uv_write_t *wr, int status) {
  sp_conn *c = wr->data;
  pthread_mutex_lock(&c->wmu);
  on_written_locked(c, status);
  pthread_mutex_unlock(&c->wmu);
}

static void on_written_locked(sp_conn *c, int status) {
  c->writing = false;
  c->wlen = 0;
  uint32_t done = c->wreplies;
  c->wreplies = 0;
  sending_done(c->sp, done);
  if (c->closing) return;
  if (status < 0) {
    grove__slog(GROVE_LOG_DEBUG, "sp.send_failed", "connection %" PRIu32 ": %s",
                c->id & 0x7fffffff, uv_strerror(status));
    conn_close(c);
    return;
  }
  if (c->qlen)
    start_write(c);
  else
    uv_timer_stop(&c->timer);
  if ((c->paused & PAUSE_OUT) && c->qlen + c->wlen < OUT_LOW) resume_conn(c, PAUSE_OUT);
}

/* Writes what is queued (c->qbuf) with uv_write; nothing is being written. */
static void start_write(sp_conn *c) {
  uint8_t *b = c->wbuf;
  size_t cap = c->wcap;
  c->wbuf = c->qbuf;
  c->wcap = c->qcap;
  c->wlen = c->qlen;
  c->wreplies = c->qreplies;
  c->qbuf = b;
  c->qcap = cap;
  c->qlen = 0;
  c->qreplies = 0;
  c->wr.data = c;
  uv_buf_t ub = uv_buf_init((char *)c->wbuf, (unsigned)c->wlen);
  c->writing = true;
  if (uv_write(&c->wr, &c->h.stream, &ub, 1, on_written) != 0) {
    c->writing = false;
    sending_done(c->sp, c->wreplies);
    c->wreplies = 0;
    conn_close(c);
    return;
  }
  uv_timer_start(&c->timer, on_timer, SEND_MS, 0);
}

/* One reply (the request's backtrace and body) on c; counted in
 * srv->sending until it is in the kernel's hands. */
static size_t frame_head(const sp_conn *c, const sp_req *sr, size_t n, uint8_t *head) {
  size_t hl = grove__sp_head_put(head, c->ipc, (uint64_t)sr->btlen + n);
  memcpy(head + hl, sr->bt, sr->btlen);
  return hl + sr->btlen;
}

static void send_reply_locked(sp_conn *c, const sp_req *sr, const void *body, size_t n);

static void send_reply(sp_conn *c, const sp_req *sr, const void *body, size_t n) {
  pthread_mutex_lock(&c->wmu);
  send_reply_locked(c, sr, body, n);
  pthread_mutex_unlock(&c->wmu);
}

static void send_reply_locked(sp_conn *c, const sp_req *sr, const void *body, size_t n) {
  uint8_t head[SP_HEAD_MAX + 4 * MAX_HOPS];
  size_t hl = frame_head(c, sr, n, head);
  size_t total = hl + n, off = 0;
  /* Nothing queued: a worker may have left the rest of its reply in qbuf
   * without writing (worker_write's kick, still on its way here). */
  if (!c->writing && c->qlen == 0) {
    uv_buf_t b[2] = {uv_buf_init((char *)head, (unsigned)hl), uv_buf_init((char *)body, (unsigned)n)};
    int w = uv_try_write(&c->h.stream, b, 2);
    if (w == (int)total) {
      sending_done(c->sp, 1);
      return;
    }
    if (w < 0 && w != UV_EAGAIN) {
      sending_done(c->sp, 1);
      grove__slog(GROVE_LOG_DEBUG, "sp.send_failed", "connection %" PRIu32 ": %s",
                  c->id & 0x7fffffff, uv_strerror(w));
      conn_close(c);
      return;
    }
    off = w > 0 ? (size_t)w : 0;
  }
  bool ok = true;
  if (off < hl) ok = append(&c->qbuf, &c->qlen, &c->qcap, head + off, hl - off);
  size_t boff = off > hl ? off - hl : 0;
  if (ok) ok = append(&c->qbuf, &c->qlen, &c->qcap, (const uint8_t *)body + boff, n - boff);
  if (!ok) {
    /* A reply cut in the middle would desynchronise the stream. */
    sending_done(c->sp, 1);
    grove__slog(GROVE_LOG_ERROR, "sp.reply_nomem",
                "no memory to queue a reply of %zu bytes; closing connection %" PRIu32, total,
                c->id & 0x7fffffff);
    conn_close(c);
    return;
  }
  c->qreplies++;
  if (!c->writing) start_write(c);
  if (c->qlen + c->wlen > OUT_HIGH) pause_conn(c, PAUSE_OUT);
}

static void req_put(srv_sp *sp, sp_req *sr) {
  if (sp->nfree >= 1024) {
    free(sr);
    return;
  }
  sr->onext = sp->free_reqs;
  sp->free_reqs = sr;
  sp->nfree++;
}

/* An answered request back on the loop: its reply written (or dropped with
 * its closed connection), the request freed. */
static void reply_now(sp_req *sr) {
  sp_conn *c = sr->c;
  srv_sp *sp = c->sp;
  nng_msg *m = sr->r.reply;
  sr->r.reply = NULL;
  if (sr->written) sending_done(sp, 1);
  if (sr->cut) {
    sending_done(sp, 1);
    conn_close(c);
  }
  if (sr->kick && !c->closing) {
    pthread_mutex_lock(&c->wmu);
    if (!c->writing && c->qlen) start_write(c);
    pthread_mutex_unlock(&c->wmu);
  }
  if (m) {
    if (c->closing)
      sending_done(sp, 1);
    else
      send_reply(c, sr, nng_msg_body(m), nng_msg_len(m));
    nng_msg_free(m);
  }
  sp->inflight--;
  req_put(sp, sr);
  conn_unref(c);
  if (sp->paused) unpause_window(sp);
}

/* A worker writes sr's reply itself when its connection has nothing queued
 * (never waiting for the lock); what it cannot write is queued for the
 * loop. */
static void worker_write(sp_req *sr) {
  sp_conn *c = sr->c;
  if (pthread_mutex_trylock(&c->wmu) != 0) return;
  if (c->fd >= 0 && !c->closing && !c->writing && c->qlen == 0) {
    nng_msg *m = sr->r.reply;
    size_t n = nng_msg_len(m);
    uint8_t head[SP_HEAD_MAX + 4 * MAX_HOPS];
    size_t hl = frame_head(c, sr, n, head);
    struct iovec iov[2] = {{head, hl}, {nng_msg_body(m), n}};
    ssize_t w = writev(c->fd, iov, 2);
    if (w > 0) {
      size_t off = (size_t)w;
      if (off < hl + n) {
        bool ok = true;
        if (off < hl) ok = append(&c->qbuf, &c->qlen, &c->qcap, head + off, hl - off);
        size_t boff = off > hl ? off - hl : 0;
        if (ok) ok = append(&c->qbuf, &c->qlen, &c->qcap, (uint8_t *)nng_msg_body(m) + boff, n - boff);
        if (ok) {
          c->qreplies++;
          sr->kick = true;
        } else {
          sr->cut = true;
        }
      } else {
        sr->written = true;
      }
      nng_msg_free(m);
      sr->r.reply = NULL;
    }
  }
  pthread_mutex_unlock(&c->wmu);
}

/* srv_req.deliver of sp.c's requests (any thread; never blocks). */
static void sp_deliver(srv_req *r) {
  sp_req *sr = (sp_req *)r;
  srv_sp *sp = sr->c->sp;
  /* rpc.c drops srv->sending when this returns: the reply is ours until it
   * is written. */
  if (r->reply) atomic_fetch_add(&sp->srv->sending, 1);
  if (on_loop(sp)) {
    reply_now(sr);
    return;
  }
  if (r->reply) worker_write(sr);
  sr->onext = NULL;
  pthread_mutex_lock(&sp->mu);
  bool was_empty = !sp->out_head && !sp->nclose;
  if (sp->out_tail)
    sp->out_tail->onext = sr;
  else
    sp->out_head = sr;
  sp->out_tail = sr;
  bool wake = was_empty && sp->async_open;
  pthread_mutex_unlock(&sp->mu);
  if (wake) grove__waker_send(&sp->wake); /* a worker's: at its release (worker.c) */
}

/* conns.c's closer for this plane (an eviction at the cap, an idle close). */
static void sp_close_id(void *arg, uint32_t id) {
  srv_sp *sp = arg;
  if (on_loop(sp)) {
    sp_conn *c = grove__pmap_get(&sp->conns, (const void *)(uintptr_t)id, NULL);
    if (c) conn_close(c);
    return;
  }
  pthread_mutex_lock(&sp->mu);
  bool was_empty = !sp->out_head && !sp->nclose;
  bool ok = sp->nclose < sp->capclose;
  if (!ok) {
    size_t want = sp->capclose ? sp->capclose * 2 : 64;
    uint32_t *n = realloc(sp->close_ids, want * sizeof *n);
    if (n) {
      sp->close_ids = n;
      sp->capclose = want;
      ok = true;
    }
  }
  if (ok) sp->close_ids[sp->nclose++] = id;
  bool wake = ok && was_empty && sp->async_open;
  pthread_mutex_unlock(&sp->mu);
  if (wake) grove__waker_send(&sp->wake);
}

static void on_async(srv_waker *a) {
  srv_sp *sp = a->data;
  pthread_mutex_lock(&sp->mu);
  sp_req *list = sp->out_head;
  sp->out_head = sp->out_tail = NULL;
  uint32_t ids[64];
  size_t nids = sp->nclose < 64 ? sp->nclose : 64;
  if (nids) memcpy(ids, sp->close_ids + sp->nclose - nids, nids * sizeof *ids);
  sp->nclose -= nids;
  bool more = sp->nclose > 0;
  pthread_mutex_unlock(&sp->mu);
  while (list) {
    sp_req *sr = list;
    list = sr->onext;
    reply_now(sr);
  }
  for (size_t i = 0; i < nids; i++) sp_close_id(sp, ids[i]);
  if (more) grove__waker_send(&sp->wake);
}

/* ------------------------------------------------------------ requests */

static sp_req *req_get(srv_sp *sp) {
  sp_req *sr = sp->free_reqs;
  if (sr) {
    sp->free_reqs = sr->onext;
    sp->nfree--;
  } else {
    sr = malloc(sizeof *sr);
    if (!sr) return NULL;
  }
  memset(&sr->r, 0, sizeof sr->r);
  sr->written = sr->kick = sr->cut = false;
  return sr;
}

/* One message of c: p[0..n) (the caller keeps it). */
static void on_message(sp_conn *c, const uint8_t *p, size_t n) {
  srv_sp *sp = c->sp;
  long bt = grove__sp_backtrace_len(p, n, MAX_HOPS);
  if (bt == 0) {
    bad_peer(c, BAD_NO_ID, "a message of %zu bytes without its request id", n);
    conn_close(c);
    return;
  }
  if (bt < 0) {
    grove__slog(GROVE_LOG_DEBUG, "sp.too_many_hops",
                "connection %" PRIu32 ": a request through more than %d devices dropped",
                c->id & 0x7fffffff, MAX_HOPS);
    return;
  }
  size_t i = (size_t)bt;
  sp_req *sr = req_get(sp);
  if (!sr) {
    grove__slog(GROVE_LOG_ERROR, "sp.nomem", "no memory for a request; closing connection %" PRIu32,
                c->id & 0x7fffffff);
    conn_close(c);
    return;
  }
  sr->c = c;
  memcpy(sr->bt, p, i);
  sr->btlen = (uint8_t)i;
  srv_req *r = &sr->r;
  r->srv = sp->srv;
  r->deliver = sp_deliver;
  r->pipe_id = c->id;
  c->refs++;
  sp->inflight++;
  grove__conns_busy(sp->srv, &r->pipe_id, 1, +1); /* not idle until answered */
  grove__rpc_dispatch(r, p + i, n - i);
  if (sp->inflight >= sp->window) pause_conn(c, PAUSE_WINDOW);
}

/* Everything whole in c->buf: the handshake, then messages. */
static void parse(sp_conn *c) {
  size_t off = 0, hl = grove__sp_head_len(c->ipc);
  while (!c->closing && !c->paused && !c->big) {
    size_t avail = c->len - off;
    const uint8_t *p = c->buf + off;
    if (!c->shook) {
      if (avail < SP_HANDSHAKE_LEN) break;
      unsigned proto = 0;
      sp_hs hs = grove__sp_handshake_check(p, SP_PROTO_REQ0, &proto);
      if (hs == SP_HS_NOT_SP) {
        bad_peer(c, BAD_HANDSHAKE, "not an SP peer (its first bytes are no SP header)");
        conn_close(c);
        return;
      }
      if (hs == SP_HS_PROTOCOL) {
        bad_peer(c, BAD_PROTOCOL, "SP protocol 0x%02x, not req0 (0x%02x)", proto, SP_PROTO_REQ0);
        conn_close(c);
        return;
      }
      c->shook = true;
      uv_timer_stop(&c->timer);
      off += SP_HANDSHAKE_LEN;
      continue;
    }
    if (avail < hl) break;
    uint64_t len;
    unsigned type;
    if (!grove__sp_head_get(p, c->ipc, &len, &type)) {
      bad_peer(c, BAD_FRAME, "IPC message type %u, not 1", type);
      conn_close(c);
      return;
    }
    if (len > c->sp->maxmsg) {
      bad_peer(c, BAD_TOO_LARGE,
               "a message of %" PRIu64 " bytes, over the limit of %zu (--max-request-bytes + 1 MiB)",
               len, c->sp->maxmsg);
      conn_close(c);
      return;
    }
    if (avail - hl >= len) {
      off += hl + (size_t)len;
      on_message(c, p + hl, (size_t)len);
      continue;
    }
    if (hl + len <= READ_BUF) break; /* the rest comes into buf */
    /* A large message: its own buffer, filled straight from the socket.
     * It starts small and doubles as bytes arrive (on_alloc), so that what
     * a peer makes groved hold is what it sent, not what its head announced
     * (at most maxmsg on each of thousands of connections). */
    size_t cap = avail - hl > BIG_FIRST ? avail - hl : BIG_FIRST;
    if (cap > len) cap = (size_t)len;
    c->big = malloc(cap);
    if (!c->big) {
      grove__slog(GROVE_LOG_ERROR, "sp.nomem",
                  "no memory for a message of %" PRIu64 " bytes; closing connection %" PRIu32,
                  len, c->id & 0x7fffffff);
      conn_close(c);
      return;
    }
    c->big_len = (size_t)len;
    c->big_cap = cap;
    c->big_got = avail - hl;
    memcpy(c->big, p + hl, c->big_got);
    off = c->len;
  }
  if (c->closing) return;
  if (off) {
    memmove(c->buf, c->buf + off, c->len - off);
    c->len -= off;
  }
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *b) {
  (void)suggested;
  sp_conn *c = h->data;
  if (c->big) {
    if (c->big_got == c->big_cap) {
      size_t cap = c->big_cap > c->big_len / 2 ? c->big_len : 2 * c->big_cap;
      uint8_t *g = realloc(c->big, cap);
      if (!g) {
        /* on_read gets UV_ENOBUFS and closes the connection. */
        grove__slog(GROVE_LOG_ERROR, "sp.nomem",
                    "no memory for a message of %zu bytes; closing connection %" PRIu32,
                    c->big_len, c->id & 0x7fffffff);
        *b = uv_buf_init(NULL, 0);
        return;
      }
      c->big = g;
      c->big_cap = cap;
    }
    size_t want = c->big_cap - c->big_got;
    *b = uv_buf_init((char *)c->big + c->big_got, want > (1u << 30) ? 1u << 30 : (unsigned)want);
  } else {
    *b = uv_buf_init((char *)c->buf + c->len, (unsigned)(READ_BUF - c->len));
  }
}

static void on_read(uv_stream_t *st, ssize_t n, const uv_buf_t *b) {
  (void)b;
  sp_conn *c = st->data;
  if (n == 0 || c->closing) return;
  if (n < 0) {
    if (n != UV_EOF)
      grove__slog(GROVE_LOG_DEBUG, "sp.read_failed", "connection %" PRIu32 ": %s",
                  c->id & 0x7fffffff, uv_strerror((int)n));
    conn_close(c);
    return;
  }
  if (c->big) {
    c->big_got += (size_t)n;
    if (c->big_got < c->big_len) return;
    uint8_t *m = c->big;
    c->big = NULL;
    on_message(c, m, c->big_len);
    free(m);
    return;
  }
  c->len += (size_t)n;
  parse(c);
}

/* ------------------------------------------------------------ listeners */

static void drop_closed(uv_handle_t *h) {
  ((sp_listener *)h->data)->drop_busy = false;
}

static void on_connection(uv_stream_t *server, int status) {
  sp_listener *l = server->data;
  srv_sp *sp = l->sp;
  if (status < 0) {
    grove__slog(GROVE_LOG_WARN, "sp.accept_failed", "%s: %s", l->url, uv_strerror(status));
    return;
  }
  sp_conn *c = calloc(1, sizeof *c);
  uint8_t *buf = malloc(READ_BUF);
  if (!c || !buf) {
    free(c);
    free(buf);
    grove__slog(GROVE_LOG_ERROR, "sp.nomem", "%s: no memory for a connection; dropped", l->url);
    if (l->drop_busy) return;
    if (l->ipc)
      uv_pipe_init(&sp->srv->loop, &l->drop.pipe, 0);
    else
      uv_tcp_init(&sp->srv->loop, &l->drop.tcp);
    l->drop.stream.data = l;
    l->drop_busy = true;
    (void)uv_accept(server, &l->drop.stream);
    uv_close((uv_handle_t *)&l->drop.stream, drop_closed);
    return;
  }
  c->sp = sp;
  c->buf = buf;
  c->ipc = l->ipc;
  c->refs = 2;
  c->fd = -1;
  pthread_mutexattr_t ma;
  pthread_mutexattr_init(&ma);
  pthread_mutexattr_settype(&ma, PTHREAD_MUTEX_RECURSIVE);
  pthread_mutex_init(&c->wmu, &ma);
  pthread_mutexattr_destroy(&ma);
  if (l->ipc)
    uv_pipe_init(&sp->srv->loop, &c->h.pipe, 0);
  else
    uv_tcp_init(&sp->srv->loop, &c->h.tcp);
  uv_timer_init(&sp->srv->loop, &c->timer);
  c->h.stream.data = c;
  c->timer.data = c;
  c->closing = true; /* until admitted: conn_close's bookkeeping is not due */
  if (uv_accept(server, &c->h.stream) != 0) {
    free(c->buf);
    uv_close((uv_handle_t *)&c->h.stream, conn_handle_closed);
    uv_close((uv_handle_t *)&c->timer, conn_handle_closed);
    return;
  }
  /* Ids with the high bit set: never one of NNG's pipe ids (31 bits), which
   * share conns.c's table with them. */
  do c->id = 0x80000000u | (sp->next_id++ & 0x7fffffff);
  while (c->id == 0x80000000u || grove__pmap_get(&sp->conns, (const void *)(uintptr_t)c->id, NULL));
  if (!grove__pmap_put(&sp->conns, (const void *)(uintptr_t)c->id, c)) {
    grove__slog(GROVE_LOG_ERROR, "sp.nomem", "%s: no memory for a connection", l->url);
    free(c->buf);
    uv_close((uv_handle_t *)&c->h.stream, conn_handle_closed);
    uv_close((uv_handle_t *)&c->timer, conn_handle_closed);
    return;
  }
  if (!grove__conns_admit(sp->plane, c->id)) { /* logged by conns.c */
    grove__pmap_del(&sp->conns, (const void *)(uintptr_t)c->id);
    free(c->buf);
    uv_close((uv_handle_t *)&c->h.stream, conn_handle_closed);
    uv_close((uv_handle_t *)&c->timer, conn_handle_closed);
    return;
  }
  c->closing = false;
  uv_os_fd_t fd;
  if (uv_fileno((uv_handle_t *)&c->h.stream, &fd) == 0) c->fd = fd;
  if (!l->ipc) uv_tcp_nodelay(&c->h.tcp, 1);
  grove__sp_handshake(c->hs, SP_PROTO_REP0);
  uv_buf_t b = uv_buf_init((char *)c->hs, 8);
  int w = uv_try_write(&c->h.stream, &b, 1);
  if (w >= 0 && w < 8) {
    b = uv_buf_init((char *)c->hs + w, (unsigned)(8 - w));
    w = uv_write(&c->hs_wr, &c->h.stream, &b, 1, NULL);
  } else if (w == UV_EAGAIN) {
    w = uv_write(&c->hs_wr, &c->h.stream, &b, 1, NULL);
  }
  if (w < 0) {
    conn_close(c);
    return;
  }
  uv_timer_start(&c->timer, on_timer, HANDSHAKE_MS, 0);
  if (uv_read_start(&c->h.stream, on_alloc, on_read) != 0) conn_close(c);
}

/* An IPC path left by a groved that died: nobody accepts on it. */
static bool stale_socket(const char *path) {
  struct stat st;
  if (stat(path, &st) != 0 || !S_ISSOCK(st.st_mode)) return false;
  int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  if (fd < 0) return false;
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  snprintf(a.sun_path, sizeof a.sun_path, "%s", path);
  bool stale = connect(fd, (struct sockaddr *)&a, sizeof a) != 0 && errno == ECONNREFUSED;
  close(fd);
  return stale;
}

static grove_status listen_one(srv_sp *sp, sp_listener *l, const char *url, grove_err *err) {
  uv_loop_t *loop = &sp->srv->loop;
  l->sp = sp;
  l->url = strdup(url);
  if (!l->url) return grove_err_set(err, GROVE_E_NOMEM, "out of memory");
  int rv;
  if (strncmp(url, "ipc://", 6) == 0) {
    l->ipc = true;
    l->path = strdup(url + 6);
    if (!l->path) return grove_err_set(err, GROVE_E_NOMEM, "out of memory");
    /* Room for the temporary name's suffix (".PID~") too. */
    if (!l->path[0] || strlen(l->path) + 13 >= sizeof(((struct sockaddr_un *)0)->sun_path))
      return grove_err_set(err, GROVE_E_INVALID_ARGUMENT,
                           "cannot listen on %s: an IPC path of 1 to %zu bytes wanted", url,
                           sizeof(((struct sockaddr_un *)0)->sun_path) - 14);
    uv_pipe_init(loop, &l->h.pipe, 0);
    l->h.stream.data = l;
    /* Bound and listening under a temporary name, then renamed into place:
     * a client that sees the path can connect (NNG binds the path itself,
     * and a client quick enough is refused before its listen). */
    char tmp[sizeof(((struct sockaddr_un *)0)->sun_path)];
    struct stat st;
    rv = 0;
    if (lstat(l->path, &st) == 0) {
      if (stale_socket(l->path))
        unlink(l->path);
      else
        rv = UV_EADDRINUSE; /* another server's, or not a socket */
    }
    bool bound = false;
    if (!rv && snprintf(tmp, sizeof tmp, "%s.%ld~", l->path, (long)getpid()) >= (int)sizeof tmp)
      rv = UV_ENAMETOOLONG;
    if (!rv) bound = (rv = uv_pipe_bind(&l->h.pipe, tmp)) == 0;
    if (!rv) rv = uv_listen(&l->h.stream, BACKLOG, on_connection);
    if (!rv && rename(tmp, l->path) != 0) rv = -errno;
    if (rv && bound) unlink(tmp);
    if (rv) {
      free(l->path); /* not ours to remove */
      l->path = NULL;
      return grove_err_set(err, GROVE_E_IO, "cannot listen on %s: %s", url, uv_strerror(rv));
    }
  } else {
    const char *hp = NULL;
    if (strncmp(url, "tcp://", 6) == 0) hp = url + 6;
    const char *colon = hp ? strrchr(hp, ':') : NULL;
    if (!hp || !colon || !colon[1])
      return grove_err_set(err, GROVE_E_INVALID_ARGUMENT,
                           "cannot listen on %s: --data-io loop serves tcp://HOST:PORT and "
                           "ipc://PATH (--data-io nng serves NNG's other transports)",
                           url);
    char host[256];
    size_t hl = (size_t)(colon - hp);
    if (hl >= sizeof host)
      return grove_err_set(err, GROVE_E_INVALID_ARGUMENT, "cannot listen on %s: host too long",
                           url);
    memcpy(host, hp, hl);
    host[hl] = 0;
    if (hl >= 2 && host[0] == '[' && host[hl - 1] == ']') { /* tcp://[::1]:7700 */
      memmove(host, host + 1, hl - 2);
      host[hl - 2] = 0;
    }
    bool any = !host[0] || strcmp(host, "*") == 0;
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE};
    uv_getaddrinfo_t gai;
    rv = uv_getaddrinfo(loop, &gai, NULL, any ? NULL : host, colon + 1, &hints);
    if (rv)
      return grove_err_set(err, GROVE_E_INVALID_ARGUMENT, "cannot listen on %s: %s", url,
                           uv_strerror(rv));
    /* "*" and "": every IPv4 address, as NNG does. */
    struct addrinfo *ai = gai.addrinfo;
    if (any)
      for (struct addrinfo *a = gai.addrinfo; a; a = a->ai_next)
        if (a->ai_family == AF_INET) {
          ai = a;
          break;
        }
    uv_tcp_init(loop, &l->h.tcp);
    l->h.stream.data = l;
    rv = uv_tcp_bind(&l->h.tcp, ai->ai_addr, 0);
    uv_freeaddrinfo(gai.addrinfo);
    if (!rv) rv = uv_listen(&l->h.stream, BACKLOG, on_connection);
    if (rv) return grove_err_set(err, GROVE_E_IO, "cannot listen on %s: %s", url, uv_strerror(rv));
  }
  grove__slog(GROVE_LOG_INFO, "server.listen", "listening on %s (on the loop: --data-io loop)",
              url);
  return GROVE_OK;
}

grove_status grove__sp_start(srv_server *srv, grove_err *err) {
  if (!srv->cfg.data_io_loop) return GROVE_OK;
  srv_sp *sp = calloc(1, sizeof *sp);
  if (!sp) return grove_err_set(err, GROVE_E_NOMEM, "out of memory");
  srv->sp = sp;
  sp->srv = srv;
  sp->loop_tid = pthread_self();
  sp->maxmsg = grove__rpc_recv_max(srv);
  sp->window = grove__rpc_max_inflight(srv);
  pthread_mutex_init(&sp->mu, NULL);
  grove_status ws = grove__waker_init(srv, &sp->wake, on_async, sp, err);
  if (ws) return ws;
  sp->async_open = true;
  sp->plane = grove__conns_plane(srv, "data", grove__conns_default_cap(srv, true), true);
  if (!sp->plane) return grove_err_set(err, GROVE_E_INTERNAL, "too many listeners for conns.c");
  sp->plane->close_fn = sp_close_id;
  sp->plane->close_arg = sp;
  sp->ls = calloc(srv->cfg.nlisten ? srv->cfg.nlisten : 1, sizeof *sp->ls);
  if (!sp->ls) return grove_err_set(err, GROVE_E_NOMEM, "out of memory");
  for (size_t i = 0; i < srv->cfg.nlisten; i++) {
    grove_status s = listen_one(sp, &sp->ls[i], srv->cfg.listen[i], err);
    sp->nls = i + 1;
    if (s) return s;
  }
  return GROVE_OK;
}

static void closed_noop(uv_handle_t *h) {
  (void)h;
}

void grove__sp_stop(srv_server *srv) {
  srv_sp *sp = srv->sp;
  if (!sp || sp->stopped) return;
  sp->stopped = true;
  for (size_t i = 0; i < sp->nls; i++) {
    sp_listener *l = &sp->ls[i];
    if (!uv_is_closing((uv_handle_t *)&l->h.stream)) uv_close((uv_handle_t *)&l->h.stream, closed_noop);
    if (l->path) unlink(l->path);
  }
  /* Replies already handed over are written first (the drain waited for
   * them); then every connection closes. */
  on_async(&sp->wake);
  size_t n = 0;
  sp_conn **all = sp->conns.n ? malloc(sp->conns.n * sizeof *all) : NULL;
  for (size_t i = 0; all && i < sp->conns.cap; i++)
    if (sp->conns.keys[i]) all[n++] = sp->conns.vals[i];
  for (size_t i = 0; i < n; i++) conn_close(all[i]); /* each leaves the table */
  free(all);
  /* No memory for the list: one at a time (closing moves the table's entries). */
  while (sp->conns.n) {
    for (size_t i = 0; i < sp->conns.cap; i++)
      if (sp->conns.keys[i]) {
        conn_close(sp->conns.vals[i]);
        break;
      }
  }
  pthread_mutex_lock(&sp->mu);
  sp->async_open = false;
  pthread_mutex_unlock(&sp->mu);
  grove__waker_close(&sp->wake);
}

void grove__sp_free(srv_server *srv) {
  srv_sp *sp = srv->sp;
  if (!sp) return;
  /* Answers that came after the stop (a forced one): dropped. */
  while (sp->out_head) {
    sp_req *sr = sp->out_head;
    sp->out_head = sr->onext;
    if (sr->r.reply) {
      nng_msg_free(sr->r.reply);
      atomic_fetch_sub(&srv->sending, 1);
    }
    conn_unref(sr->c);
    free(sr);
  }
  while (sp->free_reqs) {
    sp_req *sr = sp->free_reqs;
    sp->free_reqs = sr->onext;
    free(sr);
  }
  for (size_t i = 0; i < sp->nls; i++) {
    if (!sp->stopped && sp->ls[i].path) unlink(sp->ls[i].path); /* a failed start */
    free(sp->ls[i].url);
    free(sp->ls[i].path);
  }
  free(sp->ls);
  free(sp->close_ids);
  grove__pmap_fini(&sp->conns);
  pthread_mutex_destroy(&sp->mu);
  free(sp);
  srv->sp = NULL;
}
