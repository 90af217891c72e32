/* rpc.c: groved's NNG side.
 *
 * One rep0 socket listens on every --listen URL (tcp:// and ipc://), the
 * data plane; a second one on every --admin-listen URL, the admin plane
 * (admin.c decides what each plane may run: grove__admin_gate).  A pool
 * of contexts (nng_ctx), each with its own aio, keeps that many requests in
 * flight at once; a context is reused request after request:
 *
 *   REQ_RECV --(message)--> REQ_WORK --(reply sent by its owner)--> REQ_SEND
 *       ^                                                              |
 *       +----------------------(send completed or failed)-------------+
 *
 * The receive callback (an NNG thread) decodes the protobuf, asks the gate
 * (admin.c) whether it may run on this plane, and hands it to the handler
 * its body's owner registered at start (srv->rpc: predict.c, status.c,
 * reload.c, export.c, telemetry_rpc.c, train.c); a body nobody registered is
 * answered UNSUPPORTED.  This file calls none of them by name: it is below
 * every feature (docs/architecture.md, "server/").
 *
 * Two size limits: a request over --max-request-bytes is answered
 * INVALID_ARGUMENT; NNG itself drops the connection of a sender whose
 * message is over that limit plus HARD_SLACK, so a hostile peer cannot make
 * groved buffer an unbounded message just to refuse it.
 *
 * Whoever owns a request (NNG callback, loop, worker) replies with
 * grove__rpc_send; after that the request is NNG's until the send completes,
 * and only then does the context receive again.
 *
 * A worker's replies form one chain per connection (grove__rpc_send_chain):
 * the worker sends the first reply of each, and each send's completion, on an
 * NNG thread, sends the next.  Sending them all from the worker made it fight
 * NNG's threads for the socket's lock once per reply (a futex sleep each
 * time); chained, the replies flow the way an NNG echo server's do, and the
 * worker is free for its next batch at once. */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <nng/nng.h>
#include <nng/protocol/reqrep0/rep.h>

#include "../client/nng_close.h"
#include "server.h"

/* How long a reply may wait to be handed to the transport (a client that
 * stopped reading).  Afterwards it is dropped and the context freed. */
#define SEND_TIMEOUT_MS 10000
#define HARD_SLACK ((size_t)1 << 20)
#define MIN_CONTEXTS 64
#define MAX_CONTEXTS 65536
/* How long nng_close may take at shutdown (grove__nng_close_or_exit). */
#define CLOSE_WAIT_MS 5000
/* Contexts of the admin socket: admin RPCs are few and mostly handed to the
 * loop, so a few keep it answering whatever the data plane's load. */
#define ADMIN_CONTEXTS 16

static void req_cb(void *arg);
static void rpc_deliver(srv_req *r);
static void start_send(srv_req *r);

/* ------------------------------------------------------------ replies */

nng_msg *grove__rpc_pack(const Grove__Reply *reply) {
  size_t n = grove__reply__get_packed_size(reply);
  nng_msg *m;
  if (nng_msg_alloc(&m, n) != 0) return NULL;
  size_t w = grove__reply__pack(reply, nng_msg_body(m));
  if (w != n) { /* our bug: protobuf-c disagrees with itself */
    nng_msg_free(m);
    return NULL;
  }
  return m;
}

static void post_recv(srv_req *r) {
  r->state = REQ_RECV;
  nng_aio_set_timeout(r->aio, NNG_DURATION_INFINITE);
  nng_ctx_recv(r->ctx, r->aio);
}

/* Counts r's answer and releases its request; r->reply holds msg.  Returns
 * false (and gives r back to its origin: NNG's context receives again) when
 * there is no message to send.  The caller tells conns.c. */
static bool finish(srv_req *r, nng_msg *msg, grove_status s) {
  srv_server *srv = r->srv;
  if (r->msg) {
    grove__request__free_unpacked(r->msg, NULL);
    r->msg = NULL;
  }
  grove__metrics_answer(srv, r, s);
  bool was_inflight = r->accepted;
  r->model = NULL;
  r->accepted = false;
  if (!msg) {
    /* Out of memory for the reply: the client will time out; the origin
     * goes on serving (NNG's context receives again). */
    grove__slog(GROVE_LOG_ERROR, "rpc.reply_nomem", "no memory to encode a reply (status %s)",
                grove__status_label(s));
    if (was_inflight) atomic_fetch_sub(&srv->inflight, 1);
    r->reply = NULL;
    if (r->deliver == rpc_deliver)
      post_recv(r);
    else
      r->deliver(r);
    if (was_inflight && atomic_load(&srv->draining)) srv->rpc.wake(srv);
    return false;
  }
  /* sending rises before inflight falls, so that the drain never sees both
   * at zero while this reply is still on its way. */
  atomic_fetch_add(&srv->sending, 1);
  if (was_inflight) atomic_fetch_sub(&srv->inflight, 1);
  r->reply = msg;
  return true;
}

/* NNG's origin (srv_req.deliver): the context's aio sends r->reply; the
 * send's completion (req_cb) says it was sent. */
static void rpc_deliver(srv_req *r) {
  start_send(r);
}

/* Hands the answered r to its origin.  Another origin's deliver has sent
 * the reply (or taken it) when it returns: what the drain waits for is over
 * then. */
static void deliver(srv_req *r) {
  if (r->deliver == rpc_deliver) {
    start_send(r);
    return;
  }
  srv_server *srv = r->srv;
  r->deliver(r);
  atomic_fetch_sub(&srv->sending, 1);
  if (atomic_load(&srv->draining)) srv->rpc.wake(srv);
}

static void start_send(srv_req *r) {
  r->state = REQ_SEND;
  nng_aio_set_msg(r->aio, r->reply);
  r->reply = NULL;
  nng_aio_set_timeout(r->aio, SEND_TIMEOUT_MS);
  nng_ctx_send(r->ctx, r->aio);
}

void grove__rpc_send(srv_req *r, nng_msg *msg, grove_status s) {
  r->chain = NULL;
  uint32_t pipe_id = r->pipe_id;
  srv_server *srv = r->srv;
  bool ok = finish(r, msg, s);
  grove__conns_busy(srv, &pipe_id, 1, -1); /* answered: the connection may go idle */
  if (ok) deliver(r);
}

void grove__rpc_send_chain(srv_req *first) {
  /* One chain per connection: a client that stops reading holds up its own
   * replies (its connection is serialised anyway), never another's.  The
   * heads are linked through next_head; a batch has few connections, so a
   * linear search is fine and allocates nothing.  conns.c hears of the
   * whole batch under one lock. */
  srv_req *heads = NULL;
  srv_server *srv = first ? first->srv : NULL;
  uint32_t ids[64];
  size_t nids = 0;
  while (first) {
    srv_req *r = first;
    first = r->next;
    r->next = NULL;
    r->chain = NULL;
    r->next_head = NULL;
    nng_msg *msg = r->reply;
    r->reply = NULL;
    if (nids == sizeof ids / sizeof ids[0]) {
      grove__conns_busy(srv, ids, nids, -1);
      nids = 0;
    }
    ids[nids++] = r->pipe_id;
    if (!finish(r, msg, r->reply_status)) continue;
    if (r->deliver != rpc_deliver) { /* another origin's: no chain */
      deliver(r);
      continue;
    }
    srv_req *h = heads;
    while (h && h->pipe_id != r->pipe_id) h = h->next_head;
    if (h) {
      h->chain_tail->chain = r;
      h->chain_tail = r;
    } else {
      r->chain_tail = r;
      r->next_head = heads;
      heads = r;
    }
  }
  if (srv) grove__conns_busy(srv, ids, nids, -1);
  while (heads) {
    srv_req *h = heads;
    heads = h->next_head;
    start_send(h);
  }
}

static void reply_errorv(srv_req *r, grove_status s, const char *fmt, va_list ap) {
  char text[GROVE_ERR_MSG_MAX];
  vsnprintf(text, sizeof text, fmt, ap);
  Grove__Reply rep = GROVE__REPLY__INIT;
  rep.protocol = GROVE__PROTOCOL_VERSION__PROTOCOL_VERSION;
  rep.id = r->id;
  rep.status = (int32_t)s;
  rep.message = text;
  grove__rpc_send(r, grove__rpc_pack(&rep), s);
}

void grove__rpc_reply_error(srv_req *r, grove_status s, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  if (r->origin) { /* another protocol's request (oip.c): its own error reply */
    char text[GROVE_ERR_MSG_MAX];
    vsnprintf(text, sizeof text, fmt, ap);
    r->origin->error(r, s, text);
  } else {
    reply_errorv(r, s, fmt, ap);
  }
  va_end(ap);
}

/* ------------------------------------------------------------ receive */

void grove__rpc_dispatch(srv_req *r, const void *bytes, size_t len) {
  srv_server *srv = r->srv;
  r->t_recv = grove__now_ns();
  r->t_dispatch = 0;
  r->deadline = INT64_MAX;
  r->counted = true; /* a predict or garbage; status and metadata are not */
  r->accepted = false;
  r->model = NULL;
  r->id = 0;
  r->ninputs = 0;
  r->next = NULL;
  if (len > srv->cfg.max_request_bytes) {
    grove__rpc_reply_error(r, GROVE_E_INVALID_ARGUMENT,
                           "request of %zu bytes is over this server's limit of %zu bytes "
                           "(groved --max-request-bytes)",
                           len, srv->cfg.max_request_bytes);
    return;
  }
  r->msg = grove__request__unpack(NULL, len, bytes);
  if (!r->msg) {
    grove__rpc_reply_error(r, GROVE_E_INVALID_ARGUMENT,
                           "malformed request: %zu bytes that do not decode as a grove.Request "
                           "protobuf (proto/grove.proto)",
                           len);
    return;
  }
  r->id = r->msg->id;
  if (r->msg->protocol > GROVE__PROTOCOL_VERSION__PROTOCOL_VERSION) {
    grove__rpc_reply_error(
        r, GROVE_E_UNSUPPORTED, "request speaks protocol %u; groved %s speaks protocol %d",
        r->msg->protocol, GROVE_VERSION, GROVE__PROTOCOL_VERSION__PROTOCOL_VERSION);
    return;
  }
  if (srv->rpc.gate && !srv->rpc.gate(r)) return; /* admin.c: the wrong plane, no token, ... */
  int body = (int)r->msg->body_case;
  srv_rpc_handler fn = body > 0 && body < SRV_RPC_BODIES ? srv->rpc.handle[body] : NULL;
  if (!fn) {
    grove__rpc_reply_error(r, GROVE_E_UNSUPPORTED,
                           "the request carries no RPC that groved %s knows (protocol %d)",
                           GROVE_VERSION, GROVE__PROTOCOL_VERSION__PROTOCOL_VERSION);
    return;
  }
  r->counted = srv->rpc.counted[body];
  fn(r);
}

void grove__rpc_set_handler(srv_server *srv, int body, srv_rpc_handler fn, bool counted) {
  /* Our bug if not: the table is sized for proto/grove.proto's bodies. */
  if (body <= 0 || body >= SRV_RPC_BODIES) abort();
  srv->rpc.handle[body] = fn;
  srv->rpc.counted[body] = counted;
}

void grove__rpc_set_gate(srv_server *srv, bool (*gate)(srv_req *r)) {
  srv->rpc.gate = gate;
}

void grove__rpc_set_wake(srv_server *srv, void (*wake)(srv_server *srv)) {
  srv->rpc.wake = wake;
}

static void req_cb(void *arg) {
  srv_req *r = arg;
  srv_server *srv = r->srv;
  int rv = nng_aio_result(r->aio);
  if (r->state == REQ_RECV) {
    if (rv != 0) {
      if (rv == NNG_ECLOSED || rv == NNG_ECANCELED) {
        r->state = REQ_IDLE;
        return;
      }
      /* Anything else (out of memory, a protocol error) concerns that one
       * message: receive the next. */
      grove__slog(GROVE_LOG_WARN, "rpc.recv_failed", "receive failed: %s", nng_strerror(rv));
      post_recv(r);
      return;
    }
    nng_msg *msg = nng_aio_get_msg(r->aio);
    nng_aio_set_msg(r->aio, NULL);
    r->state = REQ_WORK;
    r->pipe_id = (uint32_t)nng_pipe_id(nng_msg_get_pipe(msg));
    grove__conns_busy(srv, &r->pipe_id, 1, +1); /* not idle until answered */
    grove__rpc_dispatch(r, nng_msg_body(msg), nng_msg_len(msg));
    nng_msg_free(msg);
    return;
  }
  if (r->state == REQ_SEND) {
    /* The next reply of r's batch goes out from here, on NNG's thread, as
     * soon as r's is handed over: see grove__rpc_send_chain. */
    srv_req *next = r->chain;
    r->chain = NULL;
    if (next) start_send(next);
    if (rv != 0) {
      /* The client went away or stopped reading: the reply is dropped. */
      nng_msg_free(nng_aio_get_msg(r->aio));
      nng_aio_set_msg(r->aio, NULL);
      if (rv != NNG_ECLOSED)
        grove__slog(GROVE_LOG_DEBUG, "rpc.send_failed", "reply not delivered: %s",
                    nng_strerror(rv));
    }
    if (rv == NNG_ECLOSED) {
      r->state = REQ_IDLE;
    } else {
      post_recv(r);
    }
    atomic_fetch_sub(&srv->sending, 1);
    if (atomic_load(&srv->draining)) srv->rpc.wake(srv);
  }
}

/* ------------------------------------------------------------ start/stop */

size_t grove__rpc_max_inflight(const srv_server *srv) {
  /* Enough for every queue to fill (so that RESOURCE_EXHAUSTED, not NNG's
   * back-pressure, is what a client sees when a model is overloaded), every
   * worker to hold a full batch of one-row requests, and some status calls. */
  uint64_t n = MIN_CONTEXTS;
  for (size_t i = 0; i < srv->nmodels; i++) {
    srv_version *v = srv->models[i].current;
    if (!v) continue;
    n += (uint64_t)v->model->batching.max_queue_size +
         (uint64_t)srv->workers * (uint64_t)(v->model->batching.max_batch_size
                                                  ? v->model->batching.max_batch_size
                                                  : 1);
  }
  return n > MAX_CONTEXTS ? MAX_CONTEXTS : (size_t)n;
}

size_t grove__rpc_recv_max(const srv_server *srv) {
  size_t hard = srv->cfg.max_request_bytes + HARD_SLACK;
  return hard < srv->cfg.max_request_bytes ? SIZE_MAX : hard;
}

grove_status grove__rpc_start(srv_server *srv, grove_err *err) {
  int rv = nng_rep0_open(&srv->sock);
  if (rv) return grove_err_set(err, GROVE_E_IO, "cannot open the rep socket: %s", nng_strerror(rv));
  srv->sock_open = true;
  size_t hard = grove__rpc_recv_max(srv);
  if ((rv = nng_socket_set_size(srv->sock, NNG_OPT_RECVMAXSZ, hard)))
    return grove_err_set(err, GROVE_E_IO, "cannot set the receive limit: %s", nng_strerror(rv));
  if ((rv = nng_rep0_open(&srv->admin_sock)))
    return grove_err_set(err, GROVE_E_IO, "cannot open the admin rep socket: %s",
                         nng_strerror(rv));
  srv->admin_sock_open = true;
  if ((rv = nng_socket_set_size(srv->admin_sock, NNG_OPT_RECVMAXSZ, hard)))
    return grove_err_set(err, GROVE_E_IO, "cannot set the receive limit: %s", nng_strerror(rv));
  /* --data-io loop: the data socket listens nowhere; sp.c's requests need
   * no context. */
  size_t ndata = srv->cfg.data_io_loop ? 0 : grove__rpc_max_inflight(srv), n = ndata + ADMIN_CONTEXTS;
  srv->reqs = calloc(n, sizeof *srv->reqs);
  if (!srv->reqs) return grove_err_set(err, GROVE_E_NOMEM, "out of memory for %zu contexts", n);
  for (size_t i = 0; i < n; i++) {
    srv_req *r = &srv->reqs[i];
    r->srv = srv;
    r->deliver = rpc_deliver;
    r->admin_plane = i >= ndata;
    if ((rv = nng_aio_alloc(&r->aio, req_cb, r)))
      return grove_err_set(err, GROVE_E_NOMEM, "cannot allocate an aio: %s", nng_strerror(rv));
    srv->nreqs = i + 1;
    if ((rv = nng_ctx_open(&r->ctx, r->admin_plane ? srv->admin_sock : srv->sock)))
      return grove_err_set(err, GROVE_E_IO, "cannot open a context: %s", nng_strerror(rv));
  }
  /* Every --listen URL shares the data plane's cap (conns.c). */
  if (!srv->cfg.data_io_loop) {
    grove_status cs = grove__conns_watch(srv, srv->sock, "data",
                                         grove__conns_default_cap(srv, true), true, NULL, NULL, err);
    if (cs) return cs;
  }
  /* --data-io loop: sp.c listens on the loop instead (lifecycle.c). */
  for (size_t i = 0; !srv->cfg.data_io_loop && i < srv->cfg.nlisten; i++) {
    const char *url = srv->cfg.listen[i];
    if ((rv = nng_listen(srv->sock, url, NULL, 0)))
      return grove_err_set(err, GROVE_E_IO, "cannot listen on %s: %s", url, nng_strerror(rv));
    grove__slog(GROVE_LOG_INFO, "server.listen", "listening on %s", url);
  }
  return GROVE_OK;
}

grove_status grove__rpc_serve(srv_server *srv, grove_err *err) {
  (void)err;
  for (size_t i = 0; i < srv->nreqs; i++) post_recv(&srv->reqs[i]);
  grove__slog(GROVE_LOG_DEBUG, "rpc.contexts", "%zu requests may be in flight at once", srv->nreqs);
  return GROVE_OK;
}

void grove__nng_close_or_exit(srv_server *srv, nng_socket s, const char *what) {
  if (grove__nng_close_bounded(s, CLOSE_WAIT_MS)) return;
  grove__slog(GROVE_LOG_ERROR, "server.close_stuck",
              "NNG did not close %s within %d ms (a deadlock of NNG 1.5.2, nanomsg/nng#1543); "
              "exiting now with status %d, the kernel closing the connections",
              what, CLOSE_WAIT_MS, srv->exit_code);
  fflush(NULL);
  _exit(srv->exit_code);
}

void grove__rpc_stop(srv_server *srv) {
  if (srv->admin_sock_open) {
    grove__nng_close_or_exit(srv, srv->admin_sock, "the admin RPC socket");
    srv->admin_sock_open = false;
  }
  if (srv->sock_open) {
    grove__nng_close_or_exit(srv, srv->sock, "the RPC socket");
    srv->sock_open = false;
    /* Replies still chained behind a send fail one after the other now
     * (NNG_ECLOSED); let every chain run out before the contexts go. */
    for (int i = 0; i < 5000 && atomic_load(&srv->sending) > 0; i++) {
      struct timespec ts = {0, 1000000};
      nanosleep(&ts, NULL);
    }
  }
  for (size_t i = 0; i < srv->nreqs; i++) {
    srv_req *r = &srv->reqs[i];
    if (!r->aio) continue;
    /* Waits for a callback that is running; none starts afterwards. */
    nng_aio_stop(r->aio);
    nng_msg *m = nng_aio_get_msg(r->aio);
    if (m && r->state == REQ_SEND) nng_msg_free(m);
    if (r->reply) nng_msg_free(r->reply);
    r->reply = NULL;
    nng_aio_free(r->aio);
    r->aio = NULL;
    if (r->msg) { /* still queued when a forced stop came */
      grove__request__free_unpacked(r->msg, NULL);
      r->msg = NULL;
    }
  }
  free(srv->reqs);
  srv->reqs = NULL;
  srv->nreqs = 0;
}
