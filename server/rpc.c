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
 * The receive callback (an NNG thread) decodes the protobuf and checks a
 * predict completely against the model's input spec; anything wrong is
 * answered there and never reaches the loop.  Status and metadata are
 * answered there too.  A good predict goes to the loop's inbox.
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
 * false (and puts the context back to receiving) when there is no message
 * to send. */
static bool finish(srv_req *r, nng_msg *msg, grove_status s) {
  srv_server *srv = r->srv;
  if (r->msg) {
    grove__request__free_unpacked(r->msg, NULL);
    r->msg = NULL;
  }
  if (r->counted) grove__metrics_count(r->model ? &r->model->metrics : &srv->unrouted, s);
  bool was_inflight = r->accepted;
  if (was_inflight)
    grove__hist_observe_ns(&r->model->metrics.total_lat, grove__now_ns() - r->t_recv);
  r->model = NULL;
  r->accepted = false;
  grove__conns_busy(srv, r->pipe_id, -1); /* answered: the connection may go idle */
  if (!msg) {
    /* Out of memory for the reply: the client will time out; the context
     * goes on serving. */
    grove__slog(GROVE_LOG_ERROR, "rpc.reply_nomem", "no memory to encode a reply (status %s)",
                grove__status_label(s));
    if (was_inflight) atomic_fetch_sub(&srv->inflight, 1);
    post_recv(r);
    if (was_inflight && atomic_load(&srv->draining)) grove__loop_wake(srv);
    return false;
  }
  /* sending rises before inflight falls, so that the drain never sees both
   * at zero while this reply is still on its way. */
  atomic_fetch_add(&srv->sending, 1);
  if (was_inflight) atomic_fetch_sub(&srv->inflight, 1);
  r->reply = msg;
  return true;
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
  if (finish(r, msg, s)) start_send(r);
}

void grove__rpc_send_chain(srv_req *first) {
  /* One chain per connection: a client that stops reading holds up its own
   * replies (its connection is serialised anyway), never another's.  The
   * heads are linked through next_head; a batch has few connections, so a
   * linear search is fine and allocates nothing. */
  srv_req *heads = NULL;
  while (first) {
    srv_req *r = first;
    first = r->next;
    r->next = NULL;
    r->chain = NULL;
    r->next_head = NULL;
    nng_msg *msg = r->reply;
    r->reply = NULL;
    if (!finish(r, msg, r->reply_status)) continue;
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
  reply_errorv(r, s, fmt, ap);
  va_end(ap);
}

/* ------------------------------------------------------------ status */

typedef struct meta_tmp {
  Grove__IoSpec *specs;
  Grove__IoSpec **ptrs;
  Grove__Batching batching;
  srv_version *v;
} meta_tmp;

/* Fills md for m.  Strings point into m and its version, which tmp->v keeps
 * alive until meta_done. */
static bool meta_fill(srv_model *m, Grove__ModelMetadata *md, meta_tmp *tmp) {
  grove__model_metadata__init(md);
  memset(tmp, 0, sizeof *tmp);
  md->name = m->name;
  md->dir = m->dir;
  md->queue_depth = atomic_load(&m->queue_depth);
  srv_version *v = grove__model_acquire(m);
  tmp->v = v;
  if (!v) {
    md->ready = false;
    md->error = m->error ? m->error : "not loaded";
    return true;
  }
  const grove_model *gm = v->model;
  md->ready = true;
  md->version = v->number;
  md->param_count = gm->param_count;
  md->weight_bytes = gm->weight_bytes;
  md->dir = gm->dir ? gm->dir : m->dir; /* a reload may serve another directory */
  /* An in-place reload names its own weights file on the version. */
  md->weights_path = v->weights_path ? v->weights_path : gm->weights_path ? gm->weights_path : "";
  grove__batching__init(&tmp->batching);
  tmp->batching.max_batch_size = gm->batching.max_batch_size;
  tmp->batching.max_queue_delay_us = gm->batching.max_queue_delay_us;
  tmp->batching.max_queue_size = gm->batching.max_queue_size;
  md->batching = &tmp->batching;
  size_t n = gm->ninputs + gm->noutputs;
  if (n) {
    tmp->specs = calloc(n, sizeof *tmp->specs);
    tmp->ptrs = calloc(n, sizeof *tmp->ptrs);
    if (!tmp->specs || !tmp->ptrs) return false;
  }
  for (size_t i = 0; i < n; i++) {
    const grove_io_spec *sp = i < gm->ninputs ? &gm->inputs[i] : &gm->outputs[i - gm->ninputs];
    Grove__IoSpec *o = &tmp->specs[i];
    grove__io_spec__init(o);
    o->name = sp->name ? sp->name : "";
    o->dtype = (int32_t)sp->dtype;
    o->n_shape = (size_t)sp->ndim;
    o->shape = (int64_t *)sp->shape;
    tmp->ptrs[i] = o;
  }
  md->n_inputs = gm->ninputs;
  md->inputs = tmp->ptrs;
  md->n_outputs = gm->noutputs;
  md->outputs = tmp->ptrs ? tmp->ptrs + gm->ninputs : NULL;
  return true;
}

static void meta_done(meta_tmp *tmp) {
  free(tmp->specs);
  free(tmp->ptrs);
  grove__version_release(tmp->v);
}

static void reply_status(srv_req *r) {
  srv_server *srv = r->srv;
  Grove__StatusReply st = GROVE__STATUS_REPLY__INIT;
  st.server_version = GROVE_VERSION;
  st.protocol = GROVE__PROTOCOL_VERSION__PROTOCOL_VERSION;
  st.draining = atomic_load(&srv->draining);
  st.ready = grove__registry_ready(srv) && !st.draining;
  st.uptime_ms = (uint64_t)((grove__now_ns() - srv->t_start) / 1000000);
  st.workers = (uint32_t)srv->workers;
  st.blas_threads = (uint32_t)srv->blas_threads;
  st.inflight = (uint64_t)atomic_load(&srv->inflight);
  st.admin_listen = grove__admin_urls(srv, &st.n_admin_listen);
  st.listen = (char **)srv->cfg.listen;
  st.n_listen = srv->cfg.nlisten;
  size_t n = srv->nmodels;
  Grove__ModelMetadata *mds = n ? calloc(n, sizeof *mds) : NULL;
  Grove__ModelMetadata **ptrs = n ? calloc(n, sizeof *ptrs) : NULL;
  meta_tmp *tmps = n ? calloc(n, sizeof *tmps) : NULL;
  bool ok = !n || (mds && ptrs && tmps);
  size_t filled = 0;
  for (size_t i = 0; ok && i < n; i++) {
    ok = meta_fill(&srv->models[i], &mds[i], &tmps[i]);
    filled = i + 1;
    ptrs[i] = &mds[i];
  }
  if (ok) {
    st.n_models = n;
    st.models = ptrs;
    Grove__Reply rep = GROVE__REPLY__INIT;
    rep.protocol = GROVE__PROTOCOL_VERSION__PROTOCOL_VERSION;
    rep.id = r->id;
    rep.body_case = GROVE__REPLY__BODY_STATUS_REPLY;
    rep.status_reply = &st;
    grove__rpc_send(r, grove__rpc_pack(&rep), GROVE_OK);
  }
  for (size_t i = 0; i < filled; i++) meta_done(&tmps[i]);
  free(mds);
  free(ptrs);
  free(tmps);
  if (!ok) grove__rpc_reply_error(r, GROVE_E_NOMEM, "out of memory building the status reply");
}

static void reply_metadata(srv_req *r) {
  const char *name = r->msg->model_metadata->model;
  srv_model *m = grove__registry_find(r->srv, name);
  if (!m) {
    grove__rpc_reply_error(r, GROVE_E_NOT_FOUND, "model '%s' is not served here", name);
    return;
  }
  Grove__ModelMetadata md;
  meta_tmp tmp;
  if (!meta_fill(m, &md, &tmp)) {
    meta_done(&tmp);
    grove__rpc_reply_error(r, GROVE_E_NOMEM, "out of memory building the metadata reply");
    return;
  }
  Grove__Reply rep = GROVE__REPLY__INIT;
  rep.protocol = GROVE__PROTOCOL_VERSION__PROTOCOL_VERSION;
  rep.id = r->id;
  rep.body_case = GROVE__REPLY__BODY_MODEL_METADATA;
  rep.model_metadata = &md;
  grove__rpc_send(r, grove__rpc_pack(&rep), GROVE_OK);
  meta_done(&tmp);
}

/* ------------------------------------------------------------ predict */

static void served_names(srv_server *srv, char *buf, size_t n) {
  size_t used = 0;
  buf[0] = 0;
  for (size_t i = 0; i < srv->nmodels && used + 1 < n; i++) {
    int w = snprintf(buf + used, n - used, "%s%s", i ? ", " : "", srv->models[i].name);
    if (w < 0) break;
    used += (size_t)w;
  }
  if (srv->nmodels == 0) snprintf(buf, n, "none");
}

/* Checks the decoded predict against the model and fills r->inputs.
 * Returns GROVE_OK, or GROVE_E_INVALID_ARGUMENT with err naming the field,
 * what came and what was expected. */
static grove_status check_predict(srv_req *r, const grove_model *gm, grove_err *err) {
  const Grove__PredictRequest *p = r->msg->predict;
  const char *mname = r->model->name;
  if (p->n_inputs != gm->ninputs) {
    char names[256] = "";
    size_t used = 0;
    for (size_t i = 0; i < gm->ninputs && used < sizeof names; i++)
      used += (size_t)snprintf(names + used, sizeof names - used, "%s'%s'", i ? ", " : "",
                               gm->inputs[i].name);
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT,
                         "inputs: model '%s' takes %zu input%s (%s), the request has %zu", mname,
                         gm->ninputs, gm->ninputs == 1 ? "" : "s", names, p->n_inputs);
  }
  for (size_t i = 0; i < p->n_inputs; i++) {
    const Grove__Tensor *t = p->inputs[i];
    const grove_io_spec *sp = &gm->inputs[i];
    char want[160], got[160]; /* formatted only for a message */
    if (t->dtype < 0 || t->dtype >= GROVE_DTYPE_COUNT || grove_dtype_size(t->dtype) == 0)
      return grove_err_set(err, GROVE_E_INVALID_ARGUMENT,
                           "inputs[%zu] ('%s').dtype: %d is not a grove_dtype value; expected %d "
                           "(%s)",
                           i, sp->name, t->dtype, (int)sp->dtype, grove_dtype_name(sp->dtype));
    if (t->n_shape > GROVE_MAX_DIMS || (int)t->n_shape != sp->ndim) {
      grove_shape_str(sp->ndim, sp->shape, want, sizeof want);
      return grove_err_set(err, GROVE_E_INVALID_ARGUMENT,
                           "inputs[%zu] ('%s').shape: %zu dimensions; expected %d (%s %s)", i,
                           sp->name, t->n_shape, sp->ndim, grove_dtype_name(sp->dtype), want);
    }
    uint64_t numel = 1;
    for (size_t d = 0; d < t->n_shape; d++) {
      if (t->shape[d] < 0)
        return grove_err_set(err, GROVE_E_INVALID_ARGUMENT,
                             "inputs[%zu] ('%s').shape[%zu] is %" PRId64 "; dimensions are >= 0", i,
                             sp->name, d, t->shape[d]);
      if (__builtin_mul_overflow(numel, (uint64_t)t->shape[d], &numel))
        return grove_err_set(err, GROVE_E_INVALID_ARGUMENT,
                             "inputs[%zu] ('%s').shape: the element count overflows", i, sp->name);
    }
    uint64_t bytes;
    if (__builtin_mul_overflow(numel, (uint64_t)grove_dtype_size(t->dtype), &bytes) ||
        bytes != (uint64_t)t->data.len) {
      grove_shape_str((int)t->n_shape, t->shape, got, sizeof got);
      return grove_err_set(err, GROVE_E_INVALID_ARGUMENT,
                           "inputs[%zu] ('%s').data: %zu bytes, but %s %s takes %" PRIu64
                           " bytes (%" PRIu64 " elements of %zu bytes)",
                           i, sp->name, t->data.len, grove_dtype_name(t->dtype), got, bytes, numel,
                           grove_dtype_size(t->dtype));
    }
    grove_tensor_init(&r->inputs[i], (grove_dtype)t->dtype, (int)t->n_shape, t->shape,
                      t->data.data);
  }
  r->ninputs = p->n_inputs;
  grove_status s = grove_model_check_inputs(gm, r->inputs, r->ninputs, err);
  if (s) {
    /* grove_model_check_inputs says E_DTYPE or E_SHAPE; on the wire a request
     * that does not fit is INVALID_ARGUMENT, its message says which part. */
    grove_err_prefix(err, "model '%s'", mname);
    err->code = GROVE_E_INVALID_ARGUMENT;
    return GROVE_E_INVALID_ARGUMENT;
  }
  int64_t rows = r->inputs[0].shape[0];
  for (size_t i = 1; i < r->ninputs; i++)
    if (r->inputs[i].shape[0] != rows)
      return grove_err_set(err, GROVE_E_INVALID_ARGUMENT,
                           "inputs[%zu] ('%s') has %" PRId64 " rows, inputs[0] ('%s') has %" PRId64
                           "; every input has the same rows (dimension 0)",
                           i, gm->inputs[i].name, r->inputs[i].shape[0], gm->inputs[0].name, rows);
  if (rows == 0)
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT,
                         "inputs[0] ('%s') has 0 rows; send at least one", gm->inputs[0].name);
  if (rows > gm->batching.max_batch_size)
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT,
                         "inputs[0] ('%s') has %" PRId64
                         " rows, more than model '%s' runs at once "
                         "(batching.max_batch_size %" PRId64 "); split the request",
                         gm->inputs[0].name, rows, mname, gm->batching.max_batch_size);
  r->rows = rows;
  return GROVE_OK;
}

static void handle_predict(srv_req *r) {
  srv_server *srv = r->srv;
  const Grove__PredictRequest *p = r->msg->predict;
  srv_model *m = grove__registry_find(srv, p->model);
  if (!m) {
    char names[512];
    served_names(srv, names, sizeof names);
    grove__rpc_reply_error(r, GROVE_E_NOT_FOUND, "model '%s' is not served here (models: %s)",
                           p->model, names);
    return;
  }
  r->model = m;
  if (atomic_load(&srv->draining)) {
    grove__rpc_reply_error(r, GROVE_E_UNAVAILABLE,
                           "groved is shutting down; send the request to another replica");
    return;
  }
  srv_version *v = grove__model_acquire(m);
  if (!v) {
    grove__rpc_reply_error(r, GROVE_E_UNAVAILABLE, "model '%s' is not loaded: %s", m->name,
                           m->error ? m->error : "unknown error");
    return;
  }
  grove_err err = {0};
  grove_status s = check_predict(r, v->model, &err);
  grove__version_release(v);
  if (s) {
    grove__rpc_reply_error(r, s, "%s", grove_err_msg(&err));
    return;
  }
  r->deadline = p->timeout_us ? r->t_recv + (int64_t)(p->timeout_us > (uint64_t)INT64_MAX / 2000
                                                          ? INT64_MAX / 2
                                                          : p->timeout_us * 1000)
                              : INT64_MAX;
  r->accepted = true;
  atomic_fetch_add(&srv->inflight, 1);
  grove__inbox_push_req(srv, r);
}

/* ------------------------------------------------------------ receive */

static void handle(srv_req *r, nng_msg *msg) {
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
  size_t len = nng_msg_len(msg);
  if (len > srv->cfg.max_request_bytes) {
    nng_msg_free(msg);
    grove__rpc_reply_error(r, GROVE_E_INVALID_ARGUMENT,
                           "request of %zu bytes is over this server's limit of %zu bytes "
                           "(groved --max-request-bytes)",
                           len, srv->cfg.max_request_bytes);
    return;
  }
  r->msg = grove__request__unpack(NULL, len, nng_msg_body(msg));
  nng_msg_free(msg);
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
  if (!grove__admin_gate(r)) return; /* the wrong plane, no token, a path outside */
  switch (r->msg->body_case) {
    case GROVE__REQUEST__BODY_PREDICT:
      handle_predict(r);
      return;
    case GROVE__REQUEST__BODY_STATUS:
      r->counted = false;
      reply_status(r);
      return;
    case GROVE__REQUEST__BODY_MODEL_METADATA:
      r->counted = false;
      reply_metadata(r);
      return;
    case GROVE__REQUEST__BODY_RELOAD: /* reload.c */
      r->counted = false;
      grove__reload_handle(r);
      return;
    case GROVE__REQUEST__BODY_EXPORT_STATE_DICT: /* export.c */
      r->counted = false;
      grove__export_handle(r);
      return;
    case GROVE__REQUEST__BODY_REGISTER_HOOK: /* telemetry.c */
    case GROVE__REQUEST__BODY_REMOVE_HOOK:
    case GROVE__REQUEST__BODY_LIST_HOOKS:
      r->counted = false;
      grove__telemetry_handle(r);
      return;
    case GROVE__REQUEST__BODY_START_TRAINING: /* train.c */
    case GROVE__REQUEST__BODY_TRAIN_STEP:
    case GROVE__REQUEST__BODY_EVALUATE:
    case GROVE__REQUEST__BODY_PROMOTE:
    case GROVE__REQUEST__BODY_STOP_TRAINING:
      r->counted = false;
      grove__training_handle(r);
      return;
    default:
      grove__rpc_reply_error(r, GROVE_E_UNSUPPORTED,
                             "the request carries no RPC that groved %s knows (protocol %d)",
                             GROVE_VERSION, GROVE__PROTOCOL_VERSION__PROTOCOL_VERSION);
      return;
  }
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
    grove__conns_busy(srv, r->pipe_id, +1); /* not idle until answered (finish) */
    handle(r, msg);
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
    if (atomic_load(&srv->draining)) grove__loop_wake(srv);
  }
}

/* ------------------------------------------------------------ start/stop */

static size_t context_count(srv_server *srv) {
  /* Enough for every queue to fill (so that RESOURCE_EXHAUSTED, not NNG's
   * back-pressure, is what a client sees when a model is overloaded), every
   * worker to hold a full batch of one-row requests, and some status calls. */
  uint64_t n = MIN_CONTEXTS;
  for (size_t i = 0; i < srv->nmodels; i++) {
    srv_version *v = srv->models[i].current;
    if (!v) continue;
    n += (uint64_t)v->model->batching.max_queue_size +
         (uint64_t)srv->workers * (uint64_t)v->model->batching.max_batch_size;
  }
  return n > MAX_CONTEXTS ? MAX_CONTEXTS : (size_t)n;
}

grove_status grove__rpc_start(srv_server *srv, grove_err *err) {
  int rv = nng_rep0_open(&srv->sock);
  if (rv) return grove_err_set(err, GROVE_E_IO, "cannot open the rep socket: %s", nng_strerror(rv));
  srv->sock_open = true;
  size_t hard = srv->cfg.max_request_bytes + HARD_SLACK;
  if (hard < srv->cfg.max_request_bytes) hard = SIZE_MAX;
  if ((rv = nng_socket_set_size(srv->sock, NNG_OPT_RECVMAXSZ, hard)))
    return grove_err_set(err, GROVE_E_IO, "cannot set the receive limit: %s", nng_strerror(rv));
  if ((rv = nng_rep0_open(&srv->admin_sock)))
    return grove_err_set(err, GROVE_E_IO, "cannot open the admin rep socket: %s",
                         nng_strerror(rv));
  srv->admin_sock_open = true;
  if ((rv = nng_socket_set_size(srv->admin_sock, NNG_OPT_RECVMAXSZ, hard)))
    return grove_err_set(err, GROVE_E_IO, "cannot set the receive limit: %s", nng_strerror(rv));
  size_t ndata = context_count(srv), n = ndata + ADMIN_CONTEXTS;
  srv->reqs = calloc(n, sizeof *srv->reqs);
  if (!srv->reqs) return grove_err_set(err, GROVE_E_NOMEM, "out of memory for %zu contexts", n);
  for (size_t i = 0; i < n; i++) {
    srv_req *r = &srv->reqs[i];
    r->srv = srv;
    r->admin_plane = i >= ndata;
    if ((rv = nng_aio_alloc(&r->aio, req_cb, r)))
      return grove_err_set(err, GROVE_E_NOMEM, "cannot allocate an aio: %s", nng_strerror(rv));
    srv->nreqs = i + 1;
    if ((rv = nng_ctx_open(&r->ctx, r->admin_plane ? srv->admin_sock : srv->sock)))
      return grove_err_set(err, GROVE_E_IO, "cannot open a context: %s", nng_strerror(rv));
  }
  /* Every --listen URL shares the data plane's cap (conns.c). */
  grove_status cs = grove__conns_watch(srv, srv->sock, "data", grove__conns_default_cap(srv, true),
                                       true, NULL, NULL, err);
  if (cs) return cs;
  for (size_t i = 0; i < srv->cfg.nlisten; i++) {
    const char *url = srv->cfg.listen[i];
    if ((rv = nng_listen(srv->sock, url, NULL, 0)))
      return grove_err_set(err, GROVE_E_IO, "cannot listen on %s: %s", url, nng_strerror(rv));
    grove__slog(GROVE_LOG_INFO, "server.listen", "listening on %s", url);
  }
  grove_status s = grove__admin_plane_listen(srv, err);
  if (s) return s;
  for (size_t i = 0; i < n; i++) post_recv(&srv->reqs[i]);
  grove__slog(GROVE_LOG_DEBUG, "rpc.contexts", "%zu requests may be in flight at once", n);
  return GROVE_OK;
}

/* A close on a thread of its own, so that its caller can stop waiting. */
typedef struct closer {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  nng_socket s;
  bool done;
  int refs; /* the closer thread's and the waiter's */
} closer;

static void closer_put(closer *c) {
  pthread_mutex_lock(&c->mu);
  bool last = --c->refs == 0;
  pthread_mutex_unlock(&c->mu);
  if (!last) return;
  pthread_mutex_destroy(&c->mu);
  pthread_cond_destroy(&c->cv);
  free(c);
}

static void *closer_main(void *arg) {
  closer *c = arg;
  nng_close(c->s);
  pthread_mutex_lock(&c->mu);
  c->done = true;
  pthread_cond_signal(&c->cv);
  pthread_mutex_unlock(&c->mu);
  closer_put(c);
  return NULL;
}

void grove__nng_close_or_exit(srv_server *srv, nng_socket s, const char *what) {
  closer *c = calloc(1, sizeof *c);
  pthread_t th;
  if (c) {
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    c->s = s;
    c->refs = 2;
  }
  if (!c || pthread_create(&th, NULL, closer_main, c) != 0) {
    /* No thread to spare: close here, unbounded, as before. */
    if (c) {
      c->refs = 1;
      closer_put(c);
    }
    nng_close(s);
    return;
  }
  pthread_detach(th);
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_sec += CLOSE_WAIT_MS / 1000;
  until.tv_nsec += (long)(CLOSE_WAIT_MS % 1000) * 1000000L;
  if (until.tv_nsec >= 1000000000L) {
    until.tv_sec++;
    until.tv_nsec -= 1000000000L;
  }
  pthread_mutex_lock(&c->mu);
  int rv = 0;
  while (!c->done && rv != ETIMEDOUT) rv = pthread_cond_timedwait(&c->cv, &c->mu, &until);
  const bool done = c->done;
  pthread_mutex_unlock(&c->mu);
  if (done) {
    closer_put(c);
    return;
  }
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
