/* client_sp.c: libgrove-client's calls carried over NNG's SP protocol
 * (req0), spoken on the client's own sockets (client_impl.h's client_io;
 * the default transport, docs/operations.md, "The client's transport").
 *
 * Why: NNG's req0 socket moves every message through its I/O and task
 * threads: ~7 context switches and ~100 µs of client CPU for a lone call,
 * ~25 µs per call at 32 in flight (docs/performance.md, "The client's
 * transport").  Here the thread that makes a call writes it, and a reply is
 * read by a thread that was going to wait anyway.
 *
 * The wire (sp_wire.h, the codec groved's loop listener shares): tcp:// and
 * ipc:// connections, the 8-byte handshake (the peer must be rep0, 0x31),
 * each request framed with a 32-bit request id, high bit set, before its
 * body; a reply carries the id back and is matched by it.  Any SP rep0
 * server works: groved with either listener (--data-io loop or nng), its
 * admin listener (NNG rep0), a plain NNG rep0 socket.
 *
 * Connections: one per URL, spread round-robin.  One that fails, or that
 * the server closes, is dialed again in the background (a dialer thread
 * that runs while any is down, every 50 ms growing to 1 s, as NNG's
 * redial).  When a connection drops, the calls on it fail with
 * UNAVAILABLE (predict's retry in client.c sends a synchronous one again on
 * another replica; an asynchronous predict is sent again here, on another
 * connection when one is up); when the last goes, that is every call in
 * flight.  A call made while no connection is up waits REDIAL_GRACE_MS for
 * the redial (a synchronous one on its thread, an asynchronous one on the
 * reader thread: grove_client_predict_async never blocks), then fails with
 * UNAVAILABLE ("no connection", told from DEADLINE_EXCEEDED, "no reply").
 * An asynchronous call's every failure reaches its callback.
 *
 * Threads (io->mu guards everything but the sockets' bytes):
 *   - writes: on the caller's thread, one sendmsg per request under the
 *     connection's wmu (whole messages never interleave);
 *   - a synchronous call then waits for its reply as leader or follower:
 *     when nobody is reading its connection it reads it itself (a lone
 *     call costs no hand-off at all), delivering any other call's reply it
 *     finds (a follower's: its condition variable; an asynchronous one's: to
 *     the reader thread), and on leaving it promotes a waiting follower;
 *   - one reader thread per client reads the connections that carry
 *     asynchronous calls, in bursts (a batch's replies arrive together: one
 *     wake-up for many), runs their callbacks and their timeouts, and
 *     watches idle connections for the server closing them (POLLRDHUP: data
 *     does not wake it).
 *
 * Hostile or broken server: a handshake that is not SP rep0, a reply
 * longer than MAX_REPLY, a reply without its request id or a connection
 * closed mid-frame close the connection and fail the calls on it with a
 * message that says which; a reply of an id nobody asked (a call that timed
 * out) is dropped, as NNG does.  A reply's memory grows with the bytes
 * that arrived, never with the length announced.  Every wait is bounded by
 * its call's timeout; close waits for the dialer's current dial at most
 * (DIAL_MS). */
#define _GNU_SOURCE /* POLLRDHUP */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include "client_impl.h"
#include "sp_wire.h"

#define MAX_REPLY ((uint64_t)1 << 30) /* bytes: a reply announcing more breaks the protocol */
#define OPEN_DIAL_MS 5000             /* open's dial and handshake */
#define DIAL_MS 2000                  /* a background redial's */
#define REDIAL_MIN_MS 50
#define REDIAL_MAX_MS 1000
#define NBUCKETS 256
#define READ_MIN 65536
#define READ_BURST ((size_t)1 << 20) /* bytes read before the whole messages are delivered */

typedef struct spcall spcall;

typedef struct spconn {
  char *url;
  bool ipc, bad_url; /* bad_url: never dialed again */
  int fd;            /* -1: down */
  unsigned gen;      /* bumped at each connect */
  pthread_mutex_t wmu;
  bool reading, bg_reading; /* a thread reads fd; that thread is the reader thread */
  bool rdhup;               /* the reader thread saw the peer close while another read */
  int async_n;              /* asynchronous calls in flight on it */
  spcall *followers;        /* synchronous calls waiting for its reader */
  uint8_t *buf;             /* the reader's */
  size_t len, cap;
  int64_t next_dial;
  int backoff_ms;
  char why[256]; /* why the last dial failed, or the connection broke */
} spconn;

struct spcall {
  uint32_t id;
  spconn *conn;
  bool async, done, resend, in_table;
  grove_status s;
  nng_msg *req; /* asynchronous resendable calls: kept until the reply */
  nng_msg *rep;
  pthread_cond_t cv; /* synchronous */
  int64_t deadline;
  int64_t wait_until; /* asynchronous, waiting for a connection: until then */
  int tries;          /* asynchronous: sends whose connection failed */
  int timeout_ms;
  client_io_cb cb;
  void *arg;
  spcall *hnext, *fnext, *qnext;
  grove_err err; /* last: written only on failure (2 KiB not cleared per call: spcall_init) */
};

/* k's fields cleared but err's message (every failure sets it). */
static void spcall_init(spcall *k) {
  memset(k, 0, offsetof(spcall, err));
  k->err.code = GROVE_OK;
  k->err.msg[0] = 0;
}

typedef struct sp_io {
  grove_client *c;
  pthread_mutex_t mu;
  pthread_cond_t up_cv; /* a connection came up */
  spconn *conns;
  size_t nconns, rr;
  int up;
  unsigned lost;
  spcall *tab[NBUCKETS];
  uint32_t next_id;
  size_t nasync;
  int64_t poll_until; /* the reader thread's next timeout (INT64_MAX: none) */
  spcall *doneq, *doneq_tail; /* asynchronous completions for the reader thread */
  spcall *resendq;            /* asynchronous calls to send again */
  spcall *waitq;              /* asynchronous calls waiting for a connection to come up */
  bool stop;
  int efd;
  bool efd_armed;
  pthread_t reader;
  bool reader_started;
  pthread_t dialer;
  bool dialing, dialer_joinable;
  pthread_cond_t dial_cv;
  uint64_t unknown_ids; /* replies nobody asked for (dropped) */
} sp_io;

/* ------------------------------------------------------------ helpers */

static void wake_reader(sp_io *io) {
  /* mu held: one write per burst of news. */
  if (io->efd_armed) return;
  io->efd_armed = true;
  uint64_t one = 1;
  ssize_t w = write(io->efd, &one, sizeof one);
  (void)w;
}

static void abstime(int64_t deadline_ms, struct timespec *ts) {
  ts->tv_sec = (time_t)(deadline_ms / 1000);
  ts->tv_nsec = (long)(deadline_ms % 1000) * 1000000L;
}

static void tab_put(sp_io *io, spcall *k) {
  spcall **b = &io->tab[k->id % NBUCKETS];
  k->hnext = *b;
  *b = k;
  k->in_table = true;
  if (k->async) {
    io->nasync++;
    k->conn->async_n++;
  }
}

static spcall *tab_find(sp_io *io, uint32_t id) {
  for (spcall *k = io->tab[id % NBUCKETS]; k; k = k->hnext)
    if (k->id == id) return k;
  return NULL;
}

static void tab_del(sp_io *io, spcall *k) {
  if (!k->in_table) return;
  spcall **p = &io->tab[k->id % NBUCKETS];
  while (*p != k) p = &(*p)->hnext;
  *p = k->hnext;
  k->in_table = false;
  if (k->async) {
    io->nasync--;
    k->conn->async_n--;
  }
}

static void follower_del(spconn *cn, spcall *k) {
  for (spcall **p = &cn->followers; *p; p = &(*p)->fnext)
    if (*p == k) {
      *p = k->fnext;
      return;
    }
}

/* An asynchronous call whose callback is due, for the reader thread (mu
 * held). */
static void doneq_push(sp_io *io, spcall *k) {
  k->qnext = NULL;
  if (io->doneq_tail)
    io->doneq_tail->qnext = k;
  else
    io->doneq = k;
  io->doneq_tail = k;
}

/* k is answered (rep) or failed (s, err set): mu held. */
static void complete(sp_io *io, spcall *k) {
  tab_del(io, k);
  k->done = true;
  if (!k->async) {
    pthread_cond_signal(&k->cv);
    return;
  }
  doneq_push(io, k);
}

static void fail(sp_io *io, spcall *k, grove_status s, const char *why) {
  k->s = s;
  if (why)
    grove_err_set(&k->err, s, LOCAL_PREFIX "%s", why);
  else
    grove__client_err_lost(io->c, &k->err);
  complete(io, k);
}

static void start_dialer(sp_io *io);

/* cn is down (mu held; nobody else reads it): its socket closed, the calls
 * on it failed (why: the protocol broke; NULL: the connection was lost), or
 * queued to be sent again. */
static void conn_down(sp_io *io, spconn *cn, const char *why) {
  if (cn->fd < 0) return;
  shutdown(cn->fd, SHUT_RDWR); /* a writer blocked in poll wakes */
  pthread_mutex_lock(&cn->wmu);
  close(cn->fd);
  cn->fd = -1;
  pthread_mutex_unlock(&cn->wmu);
  cn->len = 0;
  cn->rdhup = false;
  cn->backoff_ms = REDIAL_MIN_MS;
  cn->next_dial = grove__client_now_ms() + REDIAL_MIN_MS;
  snprintf(cn->why, sizeof cn->why, "%s", why ? why : "the connection was lost");
  if (--io->up == 0) io->lost++;
  for (size_t b = 0; b < NBUCKETS; b++)
    for (spcall *k = io->tab[b], *next; k; k = next) {
      next = k->hnext;
      if (k->conn != cn) continue;
      if (k->async && k->resend && k->req && io->up > 0) {
        tab_del(io, k);
        k->qnext = io->resendq;
        io->resendq = k;
        continue;
      }
      char msg[512];
      if (why) snprintf(msg, sizeof msg, "%s: %s; connection closed", cn->url, why);
      fail(io, k, GROVE_E_UNAVAILABLE, why ? msg : NULL);
    }
  /* Followers of a lost connection were failed above; none waits on it. */
  cn->followers = NULL;
  start_dialer(io);
  wake_reader(io);
}

/* ------------------------------------------------------------ dialing */

static int set_nonblock(int fd) {
  int fl = fcntl(fd, F_GETFL);
  return fl < 0 ? -1 : fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

/* Waits for fd to be ready for events until deadline; 1 ready, 0 timed
 * out, -1 error. */
static int wait_fd(int fd, short events, int64_t deadline) {
  for (;;) {
    int64_t left = deadline - grove__client_now_ms();
    if (left <= 0) return 0;
    struct pollfd p = {.fd = fd, .events = events};
    int r = poll(&p, 1, left > 1000000 ? 1000000 : (int)left);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return -1;
    if (r > 0) return 1;
  }
}

/* A connected, handshaken socket to url (non-blocking), or -1 with why. */
static int dial(const char *url, bool *ipc, bool *bad_url, int ms, char *why, size_t nwhy) {
  int64_t deadline = grove__client_now_ms() + ms;
  int fd = -1;
  *bad_url = false;
  if (strncmp(url, "ipc://", 6) == 0) {
    *ipc = true;
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    if (!url[6] || strlen(url + 6) >= sizeof a.sun_path) {
      *bad_url = true;
      snprintf(why, nwhy, "an IPC path of 1 to %zu bytes wanted", sizeof a.sun_path - 1);
      return -1;
    }
    memcpy(a.sun_path, url + 6, strlen(url + 6));
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
      snprintf(why, nwhy, "%s", strerror(errno));
      if (fd >= 0) close(fd);
      return -1;
    }
    set_nonblock(fd);
  } else if (strncmp(url, "tcp://", 6) == 0) {
    *ipc = false;
    const char *hp = url + 6, *colon = strrchr(hp, ':');
    char host[256];
    size_t hl = colon ? (size_t)(colon - hp) : 0;
    if (!colon || !colon[1] || hl >= sizeof host) {
      *bad_url = true;
      snprintf(why, nwhy, "tcp://HOST:PORT wanted");
      return -1;
    }
    memcpy(host, hp, hl);
    host[hl] = 0;
    if (hl >= 2 && host[0] == '[' && host[hl - 1] == ']') {
      memmove(host, host + 1, hl - 2);
      host[hl - 2] = 0;
    }
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *ai = NULL;
    int g = getaddrinfo(host[0] ? host : NULL, colon + 1, &hints, &ai);
    if (g) {
      snprintf(why, nwhy, "%s", gai_strerror(g));
      *bad_url = g == EAI_SERVICE;
      return -1;
    }
    snprintf(why, nwhy, "Connection refused");
    for (struct addrinfo *a = ai; a && fd < 0; a = a->ai_next) {
      fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
      if (fd < 0) continue;
      set_nonblock(fd);
      int r = connect(fd, a->ai_addr, a->ai_addrlen);
      if (r != 0 && errno == EINPROGRESS) {
        int e = 0;
        socklen_t el = sizeof e;
        if (wait_fd(fd, POLLOUT, deadline) != 1)
          e = ETIMEDOUT;
        else if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &el) != 0)
          e = errno;
        r = e ? -1 : 0;
        errno = e;
      }
      if (r != 0) {
        snprintf(why, nwhy, "%s", strerror(errno));
        close(fd);
        fd = -1;
      }
    }
    freeaddrinfo(ai);
    if (fd < 0) return -1;
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  } else {
    *bad_url = true;
    snprintf(why, nwhy,
             "the SP transport speaks tcp:// and ipc:// (GROVE_CLIENT_IO=nng for NNG's others)");
    return -1;
  }
  uint8_t hs[SP_HANDSHAKE_LEN];
  grove__sp_handshake(hs, SP_PROTO_REQ0);
  if (send(fd, hs, sizeof hs, MSG_NOSIGNAL) != (ssize_t)sizeof hs) {
    snprintf(why, nwhy, "handshake: %s", strerror(errno));
    close(fd);
    return -1;
  }
  size_t got = 0;
  while (got < sizeof hs) {
    ssize_t r = recv(fd, hs + got, sizeof hs - got, 0);
    if (r > 0) {
      got += (size_t)r;
      continue;
    }
    if (r < 0 && (errno == EAGAIN || errno == EINTR)) {
      if (wait_fd(fd, POLLIN, deadline) == 1) continue;
      snprintf(why, nwhy, "no SP handshake from the server within %d ms", ms);
    } else {
      snprintf(why, nwhy, "the server closed the connection during the SP handshake");
    }
    close(fd);
    return -1;
  }
  unsigned proto = 0;
  sp_hs v = grove__sp_handshake_check(hs, SP_PROTO_REP0, &proto);
  if (v != SP_HS_OK) {
    if (v == SP_HS_NOT_SP)
      snprintf(why, nwhy, "not an SP server (its first bytes are no SP handshake)");
    else
      snprintf(why, nwhy, "an SP server of protocol 0x%02x, not rep0 (0x%02x)", proto,
               SP_PROTO_REP0);
    close(fd);
    return -1;
  }
  return fd;
}

/* A connection that came up (mu held). */
static void conn_up(sp_io *io, spconn *cn, int fd) {
  pthread_mutex_lock(&cn->wmu); /* a writer reads fd and gen under it */
  cn->fd = fd;
  cn->gen++;
  pthread_mutex_unlock(&cn->wmu);
  cn->len = 0;
  cn->rdhup = false;
  cn->why[0] = 0;
  io->up++;
  pthread_cond_broadcast(&io->up_cv);
  wake_reader(io);
}

static void *dialer_main(void *arg) {
  sp_io *io = arg;
  pthread_mutex_lock(&io->mu);
  while (!io->stop) {
    int64_t now = grove__client_now_ms(), next = INT64_MAX;
    bool any = false;
    for (size_t i = 0; i < io->nconns && !io->stop; i++) {
      spconn *cn = &io->conns[i];
      if (cn->fd >= 0 || cn->bad_url) continue;
      any = true;
      if (cn->next_dial > now) {
        if (cn->next_dial < next) next = cn->next_dial;
        continue;
      }
      pthread_mutex_unlock(&io->mu);
      char why[256];
      bool ipc = cn->ipc, bad = false;
      int fd = dial(cn->url, &ipc, &bad, DIAL_MS, why, sizeof why);
      pthread_mutex_lock(&io->mu);
      now = grove__client_now_ms();
      if (fd >= 0 && !io->stop) {
        conn_up(io, cn, fd);
        continue;
      }
      if (fd >= 0) close(fd);
      snprintf(cn->why, sizeof cn->why, "%s", why);
      cn->next_dial = now + cn->backoff_ms;
      if (cn->next_dial < next) next = cn->next_dial;
      cn->backoff_ms = cn->backoff_ms * 2 > REDIAL_MAX_MS ? REDIAL_MAX_MS : cn->backoff_ms * 2;
    }
    if (!any) break;
    if (next != INT64_MAX && !io->stop) {
      struct timespec ts;
      abstime(next, &ts);
      pthread_cond_timedwait(&io->dial_cv, &io->mu, &ts);
    }
  }
  io->dialing = false;
  pthread_mutex_unlock(&io->mu);
  return NULL;
}

/* mu held. */
static void start_dialer(sp_io *io) {
  if (io->dialing || io->stop) return;
  if (io->dialer_joinable) {
    /* The last one has left (dialing false): reaped before the next. */
    pthread_mutex_unlock(&io->mu);
    pthread_join(io->dialer, NULL);
    pthread_mutex_lock(&io->mu);
    io->dialer_joinable = false;
    if (io->dialing || io->stop) return;
  }
  io->dialing = true;
  if (pthread_create(&io->dialer, NULL, dialer_main, io) != 0) {
    io->dialing = false; /* tried again at the next drop */
    return;
  }
  io->dialer_joinable = true;
}

/* ------------------------------------------------------------ reading */

/* Delivers the message p[0..n) read on cn (mu held); false when it breaks
 * the protocol (why set). */
static bool deliver(sp_io *io, spconn *cn, const uint8_t *p, size_t n, char *why, size_t nwhy) {
  long bt = grove__sp_backtrace_len(p, n, 1);
  if (bt <= 0) {
    snprintf(why, nwhy, "the server broke the SP protocol (a reply of %zu bytes without its "
                        "request id)", n);
    return false;
  }
  uint32_t id = grove__sp_get32(p);
  spcall *k = tab_find(io, id);
  if (!k || k->conn != cn) {
    io->unknown_ids++; /* a call that timed out, or a server's mistake: dropped */
    return true;
  }
  if (nng_msg_alloc(&k->rep, n - 4) != 0) {
    fail(io, k, GROVE_E_NOMEM, "out of memory for a reply");
    return true;
  }
  memcpy(nng_msg_body(k->rep), p + 4, n - 4);
  k->s = GROVE_OK;
  complete(io, k);
  return true;
}

/* Reads what cn has (its reader, mu not held) and delivers every whole
 * message.  0: go on; -1: the connection is done (why set; NULL-why:
 * closed by the peer). */
static int read_burst(sp_io *io, spconn *cn, char *why, size_t nwhy, bool *eof) {
  *eof = false;
  size_t hl = grove__sp_head_len(cn->ipc);
  for (;;) {
    if (cn->cap - cn->len < READ_MIN / 4) {
      size_t want = cn->cap ? cn->cap * 2 : READ_MIN;
      uint8_t *nb = realloc(cn->buf, want);
      if (!nb) {
        snprintf(why, nwhy, "out of memory for a reply");
        return -1;
      }
      cn->buf = nb;
      cn->cap = want;
    }
    ssize_t r = recv(cn->fd, cn->buf + cn->len, cn->cap - cn->len, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && errno == EAGAIN) break;
    if (r <= 0) {
      *eof = true;
      if (r < 0)
        snprintf(why, nwhy, "%s", strerror(errno));
      else if (cn->len)
        snprintf(why, nwhy, "the server closed the connection in the middle of a reply");
      else
        why[0] = 0;
      break;
    }
    cn->len += (size_t)r;
    if ((size_t)r < cn->cap - cn->len + (size_t)r) break; /* drained */
    if (cn->len >= READ_BURST) break; /* the rest at the next call: memory stays bounded */
  }
  /* Whole messages. */
  size_t off = 0;
  int rc = 0;
  pthread_mutex_lock(&io->mu);
  while (cn->len - off >= hl) {
    uint64_t len;
    unsigned type;
    if (!grove__sp_head_get(cn->buf + off, cn->ipc, &len, &type)) {
      snprintf(why, nwhy, "the server broke the SP protocol (IPC message type %u, not 1)", type);
      rc = -1;
      break;
    }
    if (len > MAX_REPLY) {
      snprintf(why, nwhy,
               "the server broke the SP protocol (a reply of %" PRIu64 " bytes, over the "
               "client's limit of %" PRIu64 ")",
               len, MAX_REPLY);
      rc = -1;
      break;
    }
    if (cn->len - off - hl < len) break;
    if (!deliver(io, cn, cn->buf + off + hl, (size_t)len, why, nwhy)) {
      rc = -1;
      break;
    }
    off += hl + (size_t)len;
  }
  pthread_mutex_unlock(&io->mu);
  if (rc == 0 && off) {
    memmove(cn->buf, cn->buf + off, cn->len - off);
    cn->len -= off;
  }
  if (cn->len == 0 && cn->cap > READ_BURST) { /* a large reply's room is not kept */
    free(cn->buf);
    cn->buf = NULL;
    cn->cap = 0;
  }
  if (rc == 0 && *eof) rc = -1;
  return rc;
}

/* Runs the queued asynchronous completions (mu held; released around the
 * callbacks). */
static void run_done(sp_io *io) {
  while (io->doneq) {
    spcall *list = io->doneq;
    io->doneq = io->doneq_tail = NULL;
    pthread_mutex_unlock(&io->mu);
    while (list) {
      spcall *k = list;
      list = k->qnext;
      nng_msg_free(k->req);
      k->cb(k->arg, k->s, k->s ? NULL : k->rep, &k->err);
      free(k);
    }
    pthread_mutex_lock(&io->mu);
  }
}

static grove_status send_call(sp_io *io, spcall *k, nng_msg *m, grove_err *err);

/* Sends the queued resends (mu held; released around them). */
static void run_resends(sp_io *io) {
  while (io->resendq) {
    spcall *k = io->resendq;
    io->resendq = k->qnext;
    pthread_mutex_unlock(&io->mu);
    grove_err e = {0};
    grove_status s = send_call(io, k, k->req, &e);
    pthread_mutex_lock(&io->mu);
    if (s) {
      k->s = s;
      k->err = e;
      k->done = true;
      doneq_push(io, k);
    }
  }
}

static void *reader_main(void *arg) {
  sp_io *io = arg;
  pthread_mutex_lock(&io->mu);
  struct pollfd *pf = calloc(io->nconns + 1, sizeof *pf);
  size_t *which = calloc(io->nconns + 1, sizeof *which);
  while (!io->stop) {
    run_resends(io);
    run_done(io);
    if (io->stop) break;
    /* Asynchronous calls past their deadline. */
    int64_t now = grove__client_now_ms(), next = INT64_MAX;
    if (io->nasync)
      for (size_t b = 0; b < NBUCKETS; b++)
        for (spcall *k = io->tab[b], *nx; k; k = nx) {
          nx = k->hnext;
          if (!k->async) continue;
          if (k->deadline <= now) {
            k->s = grove__client_err_timeout(io->c, io->up > 0, k->timeout_ms, &k->err);
            complete(io, k);
          } else if (k->deadline < next) {
            next = k->deadline;
          }
        }
    /* Asynchronous calls that wait for a connection: sent when one is up,
     * failed when the redial grace is spent. */
    for (spcall **pp = &io->waitq; *pp;) {
      spcall *k = *pp;
      if (io->up > 0) {
        *pp = k->qnext;
        k->qnext = io->resendq;
        io->resendq = k;
      } else if (k->wait_until <= now) {
        *pp = k->qnext;
        int ms = (int)(k->wait_until - (k->deadline - k->timeout_ms));
        k->s = grove__client_err_timeout(io->c, false, ms > 0 ? ms : 1, &k->err);
        k->done = true;
        doneq_push(io, k);
      } else {
        if (k->wait_until < next) next = k->wait_until;
        pp = &k->qnext;
      }
    }
    if (io->resendq) continue;
    if (io->doneq) continue;
    io->poll_until = next;
    if (!pf || !which) { /* no memory for the poll set: timeouts only */
      struct timespec ts;
      abstime(grove__client_now_ms() + 10, &ts);
      pthread_cond_timedwait(&io->dial_cv, &io->mu, &ts);
      continue;
    }
    size_t n = 0;
    pf[n] = (struct pollfd){.fd = io->efd, .events = POLLIN};
    which[n++] = SIZE_MAX;
    for (size_t i = 0; i < io->nconns; i++) {
      spconn *cn = &io->conns[i];
      if (cn->fd < 0) continue;
      if (!cn->reading && (cn->async_n > 0 || cn->rdhup)) cn->reading = cn->bg_reading = true;
      if (cn->bg_reading) {
        pf[n] = (struct pollfd){.fd = cn->fd, .events = POLLIN};
      } else if (!cn->rdhup) {
        pf[n] = (struct pollfd){.fd = cn->fd, .events = POLLRDHUP};
      } else {
        continue;
      }
      which[n++] = i;
    }
    io->efd_armed = false;
    pthread_mutex_unlock(&io->mu);
    int64_t wait = next == INT64_MAX ? -1 : next - now;
    int r = poll(pf, (nfds_t)n, wait < 0 ? -1 : wait > 1000000 ? 1000000 : (int)wait);
    if (r > 0 && (pf[0].revents & POLLIN)) {
      uint64_t v;
      ssize_t rr = read(io->efd, &v, sizeof v);
      (void)rr;
    }
    pthread_mutex_lock(&io->mu);
    for (size_t j = 1; r > 0 && j < n; j++) {
      if (!pf[j].revents) continue;
      spconn *cn = &io->conns[which[j]];
      if (cn->fd != pf[j].fd) continue; /* went down and came back meanwhile */
      if (cn->reading && !cn->bg_reading) {
        cn->rdhup = true; /* its reader will see the close; told again when it leaves */
        continue;
      }
      cn->reading = cn->bg_reading = true;
      pthread_mutex_unlock(&io->mu);
      char why[300];
      bool eof;
      int rc = read_burst(io, cn, why, sizeof why, &eof);
      pthread_mutex_lock(&io->mu);
      if (rc < 0) conn_down(io, cn, why[0] ? why : NULL);
    }
    /* Let go of the connections with no asynchronous call left, so that a
     * synchronous call reads its own reply. */
    for (size_t i = 0; i < io->nconns; i++) {
      spconn *cn = &io->conns[i];
      if (cn->bg_reading && ((cn->async_n == 0 && !cn->rdhup) || cn->fd < 0)) {
        cn->reading = cn->bg_reading = false;
        if (cn->followers) pthread_cond_signal(&cn->followers->cv);
      }
    }
  }
  pthread_mutex_unlock(&io->mu);
  free(pf);
  free(which);
  return NULL;
}

/* ------------------------------------------------------------ sending */

/* Picks a connection for k, waiting for one to come up while k's time and
 * the redial grace allow, registers k on it and writes m (kept by the
 * caller).  Fails with k unregistered. */
static grove_status send_call(sp_io *io, spcall *k, nng_msg *m, grove_err *err) {
  pthread_mutex_lock(&io->mu);
  if (io->up <= 0 && k->async) {
    /* Never blocks its caller (a callback on the reader thread, say): the
     * reader thread sends it when a connection comes up, or fails it. */
    if (!k->wait_until) {
      int64_t grace = grove__client_now_ms() + REDIAL_GRACE_MS;
      k->wait_until = k->deadline < grace ? k->deadline : grace;
    }
    k->qnext = io->waitq;
    io->waitq = k;
    wake_reader(io);
    pthread_mutex_unlock(&io->mu);
    return GROVE_OK;
  }
  if (io->up <= 0) {
    int64_t grace = grove__client_now_ms() + REDIAL_GRACE_MS;
    int64_t until = k->deadline < grace ? k->deadline : grace;
    struct timespec ts;
    abstime(until, &ts);
    while (io->up <= 0 && !io->stop && grove__client_now_ms() < until)
      pthread_cond_timedwait(&io->up_cv, &io->mu, &ts);
    if (io->up <= 0) {
      pthread_mutex_unlock(&io->mu);
      int ms = (int)(until - (k->deadline - k->timeout_ms));
      return grove__client_err_timeout(io->c, false, ms > 0 ? ms : 1, err);
    }
  }
  spconn *cn = NULL;
  for (size_t i = 0; i < io->nconns && !cn; i++) {
    spconn *x = &io->conns[(io->rr + i) % io->nconns];
    if (x->fd >= 0) cn = x;
  }
  io->rr = (size_t)(cn - io->conns) + 1;
  do k->id = 0x80000000u | (io->next_id++ & 0x7fffffff);
  while (tab_find(io, k->id));
  k->conn = cn;
  k->done = false;
  tab_put(io, k);
  unsigned gen = cn->gen;
  /* On the reader thread, an asynchronous call's connection is read by
   * that thread from now on (its reply is due there anyway). */
  bool on_reader = io->reader_started && pthread_equal(pthread_self(), io->reader);
  if (k->async && on_reader && !cn->reading) cn->reading = cn->bg_reading = true;
  bool reader_here = on_reader && cn->bg_reading;
  /* An asynchronous call's reply is read by the reader thread: woken when
   * it does not read this connection yet (the first call of a burst) or
   * sleeps past this call's deadline.  After this, k may be completed and
   * freed by another thread at any moment: not touched again on success. */
  if (k->async && (!cn->reading || k->deadline < io->poll_until)) wake_reader(io);
  bool async = k->async;
  pthread_mutex_unlock(&io->mu);

  size_t body = nng_msg_len(m);
  uint8_t head[SP_HEAD_MAX + 4];
  size_t hl = grove__sp_head_put(head, cn->ipc, (uint64_t)body + 4);
  grove__sp_put32(head + hl, k->id);
  hl += 4;
  struct iovec iov[2] = {{head, hl}, {nng_msg_body(m), body}};
  size_t total = hl + body, sent = 0;
  int e = 0;
  pthread_mutex_lock(&cn->wmu);
  if (cn->fd < 0 || cn->gen != gen) e = ECONNRESET;
  while (!e && sent < total) {
    struct iovec v[2];
    int nv = 0;
    if (sent < hl) v[nv++] = (struct iovec){head + sent, hl - sent};
    size_t bo = sent > hl ? sent - hl : 0;
    if (body > bo) v[nv++] = (struct iovec){(uint8_t *)iov[1].iov_base + bo, body - bo};
    struct msghdr mh = {.msg_iov = v, .msg_iovlen = (size_t)nv};
    ssize_t w = sendmsg(cn->fd, &mh, MSG_NOSIGNAL);
    if (w > 0) {
      sent += (size_t)w;
    } else if (w < 0 && errno == EINTR) {
    } else if (w < 0 && errno == EAGAIN && reader_here) {
      /* The reader thread (a callback's next call, a resend) writing a
       * connection it reads: it reads while it waits, or a server that
       * stops reading until its replies are read would wait for it. */
      struct pollfd pw = {.fd = cn->fd, .events = POLLOUT | POLLIN};
      int64_t left = k->deadline - grove__client_now_ms();
      int r = left > 0 ? poll(&pw, 1, left > 1000000 ? 1000000 : (int)left) : 0;
      if (r < 0 && errno != EINTR) e = errno;
      if (r == 0) e = ETIMEDOUT;
      if (r > 0 && (pw.revents & POLLIN)) {
        char why[300];
        bool eof;
        if (read_burst(io, cn, why, sizeof why, &eof) < 0) e = ECONNRESET; /* the loop closes it */
      }
    } else if (w < 0 && errno == EAGAIN) {
      int r = wait_fd(cn->fd, POLLOUT, k->deadline);
      if (r <= 0) e = r == 0 ? ETIMEDOUT : errno;
    } else {
      e = errno ? errno : EPIPE;
    }
  }
  /* Half a message would desynchronise the stream: the connection goes. */
  if (e && sent && cn->fd >= 0) shutdown(cn->fd, SHUT_RDWR);
  pthread_mutex_unlock(&cn->wmu);
  if (!e) return GROVE_OK;
  pthread_mutex_lock(&io->mu);
  bool mine = k->in_table;
  if (mine) tab_del(io, k);
  if (cn->gen == gen && cn->fd >= 0 && !cn->reading && (sent || e != ETIMEDOUT))
    conn_down(io, cn, NULL);
  pthread_mutex_unlock(&io->mu);
  /* Failed meanwhile by conn_down (or queued to be sent again): its verdict
   * stands; an asynchronous call's is delivered by its callback. */
  if (!mine && async) return GROVE_OK;
  if (!mine) {
    *err = k->err;
    return k->s ? k->s : GROVE_E_UNAVAILABLE;
  }
  grove_status s = e == ETIMEDOUT ? grove__client_err_timeout(io->c, true, k->timeout_ms, err)
                                  : grove__client_err_lost(io->c, err);
  if (!async) return s;
  /* An asynchronous call's failure goes to its callback, as one found
   * later would; a resendable one whose connection failed goes to another
   * (a few times at most: each try took a connection down). */
  pthread_mutex_lock(&io->mu);
  if (k->resend && e != ETIMEDOUT && io->up > 0 && ++k->tries < 4) {
    k->qnext = io->resendq;
    io->resendq = k;
  } else {
    k->s = s;
    k->err = *err;
    k->done = true;
    doneq_push(io, k);
  }
  wake_reader(io);
  pthread_mutex_unlock(&io->mu);
  return GROVE_OK;
}

/* ------------------------------------------------------------ the calls */

static grove_status sp_exchange(grove_client *c, nng_msg *m, int timeout_ms, nng_msg **out,
                                grove_err *err) {
  sp_io *io = c->t;
  *out = NULL;
  spcall k;
  spcall_init(&k);
  k.timeout_ms = timeout_ms;
  k.deadline = grove__client_now_ms() + timeout_ms;
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&k.cv, &ca);
  pthread_condattr_destroy(&ca);
  grove_status s = send_call(io, &k, m, err);
  nng_msg_free(m);
  if (s) {
    pthread_cond_destroy(&k.cv);
    return s;
  }
  spconn *cn = k.conn;
  pthread_mutex_lock(&io->mu);
  bool follower = false;
  while (!k.done) {
    int64_t now = grove__client_now_ms();
    if (now >= k.deadline) break;
    if (!cn->reading && cn->fd >= 0) {
      /* Leader: reads until its own reply is in. */
      if (follower) follower_del(cn, &k);
      follower = false;
      cn->reading = true;
      cn->bg_reading = false;
      int fd = cn->fd;
      pthread_mutex_unlock(&io->mu);
      char why[300] = "";
      bool eof = false;
      int rc = 0;
      int r = wait_fd(fd, POLLIN, k.deadline);
      if (r != 0) rc = read_burst(io, cn, why, sizeof why, &eof);
      pthread_mutex_lock(&io->mu);
      cn->reading = false;
      if (rc < 0) conn_down(io, cn, why[0] ? why : NULL);
      if (io->doneq) wake_reader(io); /* asynchronous replies it read */
      continue;
    }
    if (!follower) {
      k.fnext = cn->followers;
      cn->followers = &k;
      follower = true;
    }
    struct timespec ts;
    abstime(k.deadline, &ts);
    pthread_cond_timedwait(&k.cv, &io->mu, &ts);
  }
  if (follower) follower_del(cn, &k);
  /* On leaving: the next waiting call reads (it was a follower), or the
   * reader thread, for asynchronous calls or a close it saw. */
  if (!cn->reading && cn->fd >= 0) {
    if (cn->followers)
      pthread_cond_signal(&cn->followers->cv);
    else if (cn->async_n > 0 || cn->rdhup)
      wake_reader(io);
  }
  if (!k.done) {
    tab_del(io, &k);
    s = grove__client_err_timeout(c, io->up > 0, timeout_ms, err);
  } else if (k.s) {
    s = k.s;
    *err = k.err;
  } else {
    *out = k.rep;
  }
  pthread_mutex_unlock(&io->mu);
  pthread_cond_destroy(&k.cv);
  return s;
}

static grove_status sp_exchange_async(grove_client *c, nng_msg *m, int timeout_ms, bool resend,
                                      client_io_cb cb, void *arg, grove_err *err) {
  sp_io *io = c->t;
  spcall *k = malloc(sizeof *k);
  if (!k) {
    nng_msg_free(m);
    return grove__client_nomem(err);
  }
  spcall_init(k);
  k->async = true;
  k->resend = resend;
  k->timeout_ms = timeout_ms;
  k->deadline = grove__client_now_ms() + timeout_ms;
  k->cb = cb;
  k->arg = arg;
  k->req = resend ? m : NULL;
  grove_status s = send_call(io, k, m, err);
  if (!resend) nng_msg_free(m);
  if (s) {
    if (resend) nng_msg_free(m);
    free(k);
    return s;
  }
  return GROVE_OK;
}

static int sp_connected(grove_client *c) {
  sp_io *io = c->t;
  pthread_mutex_lock(&io->mu);
  int up = io->up;
  pthread_mutex_unlock(&io->mu);
  return up;
}

/* ------------------------------------------------------------ open/close */

static void io_free(sp_io *io) {
  for (size_t i = 0; i < io->nconns; i++) {
    spconn *cn = &io->conns[i];
    if (cn->fd >= 0) close(cn->fd);
    free(cn->url);
    free(cn->buf);
    pthread_mutex_destroy(&cn->wmu);
  }
  free(io->conns);
  if (io->efd >= 0) close(io->efd);
  pthread_mutex_destroy(&io->mu);
  pthread_cond_destroy(&io->up_cv);
  pthread_cond_destroy(&io->dial_cv);
  free(io);
}

static bool sp_close(grove_client *c) {
  sp_io *io = c->t;
  pthread_mutex_lock(&io->mu);
  io->stop = true;
  wake_reader(io);
  pthread_cond_broadcast(&io->dial_cv);
  pthread_cond_broadcast(&io->up_cv);
  bool dj = io->dialer_joinable;
  io->dialer_joinable = false;
  pthread_mutex_unlock(&io->mu);
  if (io->reader_started) pthread_join(io->reader, NULL);
  if (dj) pthread_join(io->dialer, NULL);
  io_free(io);
  return true;
}

static grove_status sp_open(grove_client *c, const char *const *urls, size_t nurls,
                            grove_err *err) {
  sp_io *io = calloc(1, sizeof *io);
  if (!io) return grove__client_nomem(err);
  io->c = c;
  io->efd = -1;
  io->poll_until = INT64_MAX;
  pthread_mutex_init(&io->mu, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&io->up_cv, &ca);
  pthread_cond_init(&io->dial_cv, &ca);
  pthread_condattr_destroy(&ca);
  io->conns = calloc(nurls, sizeof *io->conns);
  io->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (!io->conns || io->efd < 0) {
    io_free(io);
    return grove__client_nomem(err);
  }
  char why[1024] = "";
  size_t wused = 0;
  for (size_t i = 0; i < nurls; i++) {
    spconn *cn = &io->conns[io->nconns];
    pthread_mutex_init(&cn->wmu, NULL);
    cn->fd = -1;
    cn->backoff_ms = REDIAL_MIN_MS;
    io->nconns++;
    cn->url = strdup(urls[i] ? urls[i] : "");
    if (!cn->url) {
      io_free(io);
      return grove__client_nomem(err);
    }
    if (!*cn->url) {
      cn->bad_url = true;
      continue;
    }
    /* A synchronous dial first: it says at once why a server cannot be
     * reached.  One that fails is dialed again in the background, so a
     * replica that comes up later joins. */
    char w1[256];
    int fd = dial(cn->url, &cn->ipc, &cn->bad_url, OPEN_DIAL_MS, w1, sizeof w1);
    if (fd >= 0) {
      conn_up(io, cn, fd);
      continue;
    }
    snprintf(cn->why, sizeof cn->why, "%s", w1);
    cn->next_dial = grove__client_now_ms() + REDIAL_MIN_MS;
    int w = snprintf(why + wused, sizeof why - wused, "%s%s: %s", wused ? "; " : "", cn->url, w1);
    if (w > 0 && (size_t)w < sizeof why - wused) wused += (size_t)w;
  }
  if (io->up == 0) {
    io_free(io);
    return grove_err_set(err, GROVE_E_UNAVAILABLE, LOCAL_PREFIX "cannot reach the server: %s",
                         why[0] ? why : "no URL");
  }
  io->efd_armed = false;
  /* Under mu: the reader thread starts by taking it, and finds reader and
   * reader_started set. */
  pthread_mutex_lock(&io->mu);
  if (pthread_create(&io->reader, NULL, reader_main, io) != 0) {
    pthread_mutex_unlock(&io->mu);
    io_free(io);
    return grove_err_set(err, GROVE_E_INTERNAL, LOCAL_PREFIX "cannot start the reader thread");
  }
  io->reader_started = true;
  for (size_t i = 0; i < io->nconns; i++)
    if (io->conns[i].fd < 0 && !io->conns[i].bad_url) start_dialer(io);
  pthread_mutex_unlock(&io->mu);
  c->t = io;
  return GROVE_OK;
}

const client_io grove__client_io_sp = {
    .name = "sp",
    .open = sp_open,
    .close = sp_close,
    .exchange = sp_exchange,
    .exchange_async = sp_exchange_async,
    .connected = sp_connected,
};
