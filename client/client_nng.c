/* client_nng.c: libgrove-client's calls carried by an NNG req0 socket
 * (client_impl.h's client_io; GROVE_CLIENT_IO=nng, docs/operations.md,
 * "The client's transport").
 *
 * One NNG req0 socket per client, dialed to every URL: NNG spreads requests
 * over the connected pipes.  Every call runs on a context of its own
 * (nng_ctx, pooled), so calls from many threads run concurrently on one
 * client without a lock.  A pipe counter (nng_pipe_notify) tells "no
 * connection" from "slow server" when a call times out, and when the last
 * connection goes away (the server exited, was killed or closed it) every
 * call in flight fails at once with UNAVAILABLE instead of waiting out its
 * timeout: no other pipe can take it.  A call made while no connection is
 * back waits REDIAL_GRACE_MS for the redial, not its whole timeout.
 *
 * Costs (docs/performance.md, "The client's transport"): every call crosses
 * NNG's I/O and task threads, ~7 context switches per lone request. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>

#include "client_impl.h"
#include "nng_close.h"

/* How long closing the socket may take (grove__nng_close_bounded: NNG
 * 1.5.2's close can deadlock while connected, nanomsg/nng#1543). */
#define CLOSE_WAIT_MS 2000

typedef struct acall acall;
typedef struct sslot sslot;

typedef struct nng_io {
  grove_client *c;
  nng_socket sock;
  pthread_mutex_t mu; /* guards the pools below */
  acall *free_calls, *all_calls;
  sslot *free_slots, *all_slots; /* contexts for synchronous calls */
  atomic_int pipes; /* connected right now */
  atomic_uint lost; /* times the last pipe went away (calls in flight were failed) */
} nng_io;

/* One asynchronous call: a context and an aio of its own, kept on the
 * free list between calls so that a steady stream of calls allocates
 * nothing but messages. */
struct acall {
  nng_io *n;
  nng_ctx ctx;
  nng_aio *aio;
  bool receiving;
  bool busy; /* a call is using it (n->mu) */
  int timeout_ms;
  int64_t t0;
  unsigned lost0; /* n->lost when the call began */
  int send_ms;    /* the send's timeout (send_timeout) */
  unsigned seq;   /* calls made with it so far (n->mu): tells this call from the next */
  client_io_cb cb;
  void *arg;
  struct acall *next;     /* free list */
  struct acall *all_next; /* every call, for close */
};

/* A context and an aio (no callback) for synchronous calls, pooled like the
 * asynchronous ones: opening a context takes the socket's lock and
 * allocating an aio the heap, on every call otherwise. */
struct sslot {
  nng_ctx ctx;
  nng_aio *aio;
  bool busy; /* a call is using it (n->mu) */
  struct sslot *next;     /* free list */
  struct sslot *all_next; /* every slot, for close */
};

/* Fails every call in flight with NNG_ECONNRESET (n->mu held).  NNG 1.5.2
 * fails a request already sent on the pipe that closed, but one that was
 * queued, or sent while its pipe was going, waits for a pipe that is not
 * coming back: its whole timeout. */
static void abort_in_flight(nng_io *n) {
  for (sslot *sl = n->all_slots; sl; sl = sl->all_next)
    if (sl->busy) nng_aio_abort(sl->aio, NNG_ECONNRESET);
  for (acall *a = n->all_calls; a; a = a->all_next)
    if (a->busy) nng_aio_abort(a->aio, NNG_ECONNRESET);
}

static void pipe_cb(nng_pipe p, nng_pipe_ev ev, void *arg) {
  (void)p;
  nng_io *n = arg;
  if (ev == NNG_PIPE_EV_ADD_POST) {
    atomic_fetch_add(&n->pipes, 1);
  } else if (ev == NNG_PIPE_EV_REM_POST && atomic_fetch_sub(&n->pipes, 1) == 1) {
    /* The last connection is gone: no other replica can take what is in
     * flight.  (Calls that start from now on wait REDIAL_GRACE_MS for a
     * redial: send_timeout.) */
    pthread_mutex_lock(&n->mu);
    atomic_fetch_add(&n->lost, 1);
    abort_in_flight(n);
    pthread_mutex_unlock(&n->mu);
  }
}

/* After a call's operation was started on aio: when the last pipe went away
 * since the call began (lost0), the abort in pipe_cb may have come before
 * the operation started and missed it.  For a synchronous call, whose
 * thread owns its slot. */
static void abort_if_lost(nng_io *n, unsigned lost0, nng_aio *aio) {
  if (atomic_load(&n->lost) != lost0 && atomic_load(&n->pipes) <= 0)
    nng_aio_abort(aio, NNG_ECONNRESET);
}

/* abort_if_lost for an asynchronous call, which may have completed and been
 * reused by the next call by now: seq tells. */
static void acall_abort_if_lost(nng_io *n, acall *a, unsigned seq, unsigned lost0) {
  if (atomic_load(&n->lost) == lost0) return;
  pthread_mutex_lock(&n->mu);
  if (a->busy && a->seq == seq && atomic_load(&n->pipes) <= 0) nng_aio_abort(a->aio, NNG_ECONNRESET);
  pthread_mutex_unlock(&n->mu);
}

static void io_free(nng_io *n) {
  for (acall *a = n->all_calls, *next; a; a = next) {
    next = a->all_next;
    nng_aio_free(a->aio);
    free(a);
  }
  for (sslot *sl = n->all_slots, *next; sl; sl = next) {
    next = sl->all_next;
    nng_aio_free(sl->aio);
    free(sl);
  }
  pthread_mutex_destroy(&n->mu);
  free(n);
}

static grove_status nng_open(grove_client *c, const char *const *urls, size_t nurls,
                             grove_err *err) {
  nng_io *n = calloc(1, sizeof *n);
  if (!n) return grove__client_nomem(err);
  n->c = c;
  pthread_mutex_init(&n->mu, NULL);
  atomic_init(&n->pipes, 0);
  atomic_init(&n->lost, 0);
  int rv = nng_req0_open(&n->sock);
  if (rv) {
    io_free(n);
    return grove_err_set(err, GROVE_E_INTERNAL, LOCAL_PREFIX "cannot open a req socket: %s",
                         nng_strerror(rv));
  }
  /* Replies are as large as the server makes them: the client trusts its
   * server.  A lost connection is redialed quickly; a request is sent again
   * only when its connection drops (no timer: predict has a deadline, and a
   * timed resend would compute it twice). */
  nng_socket_set_size(n->sock, NNG_OPT_RECVMAXSZ, 0);
  nng_socket_set_ms(n->sock, NNG_OPT_RECONNMINT, 50);
  nng_socket_set_ms(n->sock, NNG_OPT_RECONNMAXT, 1000);
  nng_socket_set_ms(n->sock, NNG_OPT_REQ_RESENDTIME, NNG_DURATION_INFINITE);
  nng_pipe_notify(n->sock, NNG_PIPE_EV_ADD_POST, pipe_cb, n);
  nng_pipe_notify(n->sock, NNG_PIPE_EV_REM_POST, pipe_cb, n);
  size_t connected = 0;
  char why[1024] = "";
  size_t wused = 0;
  for (size_t i = 0; i < nurls; i++) {
    if (!urls[i] || !*urls[i]) continue;
    /* A synchronous dial first: it says at once why a server cannot be
     * reached.  A URL that fails is dialed again in the background (NNG
     * retries it), so a replica that comes up later joins. */
    rv = nng_dial(n->sock, urls[i], NULL, 0);
    if (rv == 0) {
      connected++;
      continue;
    }
    int w = snprintf(why + wused, sizeof why - wused, "%s%s: %s", wused ? "; " : "", urls[i],
                     nng_strerror(rv));
    if (w > 0 && (size_t)w < sizeof why - wused) wused += (size_t)w;
    if (rv != NNG_EADDRINVAL && rv != NNG_ENOTSUP)
      nng_dial(n->sock, urls[i], NULL, NNG_FLAG_NONBLOCK);
  }
  if (connected == 0) {
    /* A stuck close may still call pipe_cb with n: n is left to it. */
    if (grove__nng_close_bounded(n->sock, CLOSE_WAIT_MS)) io_free(n);
    return grove_err_set(err, GROVE_E_UNAVAILABLE, LOCAL_PREFIX "cannot reach the server: %s",
                         why[0] ? why : "no URL");
  }
  c->t = n;
  return GROVE_OK;
}

static bool nng_io_close(grove_client *c) {
  nng_io *n = c->t;
  /* NNG's close stuck: the caller gets its thread back, and n, its contexts
   * and aios, which NNG may still call back, are left to the close (a leak
   * instead of a hang). */
  if (!grove__nng_close_bounded(n->sock, CLOSE_WAIT_MS)) return false;
  io_free(n);
  return true;
}

static int nng_connected(grove_client *c) {
  return atomic_load(&((nng_io *)c->t)->pipes);
}

/* The timeout for a call's send: the call's own, or REDIAL_GRACE_MS when
 * the client has lost its every connection (a pipe was there and went). */
static int send_timeout(nng_io *n, int timeout_ms) {
  if (atomic_load(&n->pipes) <= 0 && atomic_load(&n->lost) > 0 && timeout_ms > REDIAL_GRACE_MS)
    return REDIAL_GRACE_MS;
  return timeout_ms;
}

/* What a failed NNG operation means for the caller. */
static grove_status transport_error(nng_io *n, int rv, int timeout_ms, grove_err *err) {
  grove_client *c = n->c;
  if (rv == NNG_ETIMEDOUT)
    return grove__client_err_timeout(c, atomic_load(&n->pipes) > 0, timeout_ms, err);
  if (rv == NNG_ECONNRESET) return grove__client_err_lost(c, err);
  return grove_err_set(err, rv == NNG_ENOMEM ? GROVE_E_NOMEM : GROVE_E_UNAVAILABLE,
                       LOCAL_PREFIX "%s: %s", c->urls, nng_strerror(rv));
}

static sslot *sslot_get(nng_io *n, grove_err *err) {
  pthread_mutex_lock(&n->mu);
  sslot *sl = n->free_slots;
  if (sl) {
    n->free_slots = sl->next;
    sl->busy = true;
  }
  pthread_mutex_unlock(&n->mu);
  if (sl) return sl;
  if (!(sl = calloc(1, sizeof *sl))) {
    grove__client_nomem(err);
    return NULL;
  }
  int rv = nng_aio_alloc(&sl->aio, NULL, NULL);
  if (rv == 0 && (rv = nng_ctx_open(&sl->ctx, n->sock)) != 0) nng_aio_free(sl->aio);
  if (rv) {
    free(sl);
    grove_err_set(err, GROVE_E_INTERNAL, LOCAL_PREFIX "cannot open a context: %s",
                  nng_strerror(rv));
    return NULL;
  }
  pthread_mutex_lock(&n->mu);
  sl->busy = true;
  sl->all_next = n->all_slots;
  n->all_slots = sl;
  pthread_mutex_unlock(&n->mu);
  return sl;
}

static void sslot_put(nng_io *n, sslot *sl) {
  pthread_mutex_lock(&n->mu);
  sl->busy = false;
  sl->next = n->free_slots;
  n->free_slots = sl;
  pthread_mutex_unlock(&n->mu);
}

static grove_status nng_exchange(grove_client *c, nng_msg *m, int timeout_ms, nng_msg **out,
                                 grove_err *err) {
  nng_io *n = c->t;
  *out = NULL;
  unsigned lost0 = atomic_load(&n->lost);
  sslot *sl = sslot_get(n, err);
  if (!sl) {
    nng_msg_free(m);
    return err ? err->code : GROVE_E_NOMEM;
  }
  /* NNG 1.5 has no nng_ctx_sendmsg: an aio waited on does the same.  A
   * send on a req context also abandons whatever request the context sent
   * before (a call that timed out), so a reused context is clean. */
  nng_msg *rep = NULL;
  int64_t t0 = grove__client_now_ms();
  int send_ms = send_timeout(n, timeout_ms);
  nng_aio_set_timeout(sl->aio, send_ms);
  nng_aio_set_msg(sl->aio, m);
  nng_ctx_send(sl->ctx, sl->aio);
  abort_if_lost(n, lost0, sl->aio);
  nng_aio_wait(sl->aio);
  int rv = nng_aio_result(sl->aio);
  if (rv) {
    nng_msg_free(nng_aio_get_msg(sl->aio)); /* still ours when the send failed */
    timeout_ms = send_ms;                   /* for the message */
  } else {
    /* The timeout covers the whole call: the receive gets what is left. */
    int64_t left = (int64_t)timeout_ms - (grove__client_now_ms() - t0);
    nng_aio_set_timeout(sl->aio, left > 0 ? (nng_duration)left : 1);
    nng_ctx_recv(sl->ctx, sl->aio);
    abort_if_lost(n, lost0, sl->aio);
    nng_aio_wait(sl->aio);
    if (!(rv = nng_aio_result(sl->aio))) rep = nng_aio_get_msg(sl->aio);
  }
  nng_aio_set_msg(sl->aio, NULL);
  sslot_put(n, sl);
  if (rv) return transport_error(n, rv, timeout_ms, err);
  *out = rep;
  return GROVE_OK;
}

/* Back on the free list: the callback about to run may reuse it at once. */
static void acall_put(acall *a) {
  nng_io *n = a->n;
  pthread_mutex_lock(&n->mu);
  a->busy = false;
  a->next = n->free_calls;
  n->free_calls = a;
  pthread_mutex_unlock(&n->mu);
}

static void acall_cb(void *arg) {
  acall *a = arg;
  nng_io *n = a->n;
  int rv = nng_aio_result(a->aio);
  if (!rv && !a->receiving) {
    a->receiving = true;
    int64_t left = (int64_t)a->timeout_ms - (grove__client_now_ms() - a->t0);
    nng_aio_set_timeout(a->aio, left > 0 ? (nng_duration)left : 1);
    unsigned seq = a->seq, lost0 = a->lost0;
    nng_ctx_recv(a->ctx, a->aio);
    acall_abort_if_lost(n, a, seq, lost0);
    return;
  }
  grove_err err = {0};
  grove_status s = GROVE_OK;
  nng_msg *rep = NULL;
  if (rv) {
    if (!a->receiving) nng_msg_free(nng_aio_get_msg(a->aio));
    s = transport_error(n, rv, a->receiving ? a->timeout_ms : a->send_ms, &err);
  } else {
    rep = nng_aio_get_msg(a->aio);
  }
  nng_aio_set_msg(a->aio, NULL);
  client_io_cb cb = a->cb;
  void *cb_arg = a->arg;
  /* The call goes back on the free list before the callback, which may
   * start the next call at once and reuse it. */
  acall_put(a);
  cb(cb_arg, s, rep, &err);
}

static grove_status nng_exchange_async(grove_client *c, nng_msg *m, int timeout_ms, bool resend,
                                       client_io_cb cb, void *arg, grove_err *err) {
  (void)resend; /* NNG fails a request whose pipe closed (ECONNRESET) */
  nng_io *n = c->t;
  unsigned lost0 = atomic_load(&n->lost);
  pthread_mutex_lock(&n->mu);
  acall *a = n->free_calls;
  if (a) {
    n->free_calls = a->next;
    a->busy = true;
    a->seq++;
  }
  pthread_mutex_unlock(&n->mu);
  if (!a) {
    int rv = -1;
    if ((a = calloc(1, sizeof *a))) {
      a->n = n;
      if ((rv = nng_aio_alloc(&a->aio, acall_cb, a)) == 0 &&
          (rv = nng_ctx_open(&a->ctx, n->sock)) != 0) {
        nng_aio_free(a->aio);
      }
    }
    if (rv) {
      free(a);
      nng_msg_free(m);
      return rv > 0 ? grove_err_set(err, GROVE_E_INTERNAL, LOCAL_PREFIX "%s", nng_strerror(rv))
                    : grove__client_nomem(err);
    }
    pthread_mutex_lock(&n->mu);
    a->busy = true;
    a->all_next = n->all_calls;
    n->all_calls = a;
    pthread_mutex_unlock(&n->mu);
  }
  a->receiving = false;
  a->lost0 = lost0;
  unsigned seq = a->seq; /* read by this thread only until the send below */
  a->timeout_ms = timeout_ms;
  a->t0 = grove__client_now_ms();
  a->cb = cb;
  a->arg = arg;
  a->send_ms = send_timeout(n, timeout_ms);
  nng_aio_set_timeout(a->aio, a->send_ms);
  nng_aio_set_msg(a->aio, m);
  nng_ctx_send(a->ctx, a->aio);
  acall_abort_if_lost(n, a, seq, lost0);
  return GROVE_OK;
}

const client_io grove__client_io_nng = {
    .name = "nng",
    .open = nng_open,
    .close = nng_io_close,
    .exchange = nng_exchange,
    .exchange_async = nng_exchange_async,
    .connected = nng_connected,
};
