/* client.c: libgrove-client's calls (include/grove/client.h): requests
 * encoded, replies decoded, predict's retry across replicas, the admin
 * plane.  The messages travel by a transport (client_impl.h's client_io):
 * client_sp.c, NNG's SP protocol spoken on the client's own sockets (the
 * default), or client_nng.c, NNG's req0 socket (GROVE_CLIENT_IO=nng);
 * docs/operations.md, "The client's transport".
 *
 * Messages of failures found on the client side begin with "grove client: "
 * (grove_client_failed_locally reads that); everything else in err is the
 * server's own message. */
#define _GNU_SOURCE /* O_TMPFILE */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <nng/nng.h>

#include "client_impl.h"

#define DEFAULT_TIMEOUT_MS 30000

bool grove_client_failed_locally(grove_status s, const grove_err *err) {
  if (s == GROVE_OK) return false;
  return err && strncmp(err->msg, LOCAL_PREFIX, strlen(LOCAL_PREFIX)) == 0;
}

/* ------------------------------------------------------------ open/close */

/* Frees c's memory (its transport is closed or was never opened). */
static void client_free(grove_client *c) {
  pthread_mutex_destroy(&c->mu);
  pthread_cond_destroy(&c->idle_cv);
  pthread_mutex_destroy(&c->admin_mu);
  free(c->admin_url);
  if (c->token) {
    explicit_bzero(c->token, strlen(c->token));
    free(c->token);
  }
  free(c);
}

grove_status grove_client_open(const char *const *urls, size_t nurls, const grove_client_opts *opts,
                               grove_client **out, grove_err *err) {
  if (out) *out = NULL;
  if (!out || !urls || nurls == 0)
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT, LOCAL_PREFIX "no server URL");
  grove_client *c = calloc(1, sizeof *c);
  if (!c) return grove__client_nomem(err);
  c->default_timeout_ms =
      opts && opts->default_timeout_ms > 0 ? opts->default_timeout_ms : DEFAULT_TIMEOUT_MS;
  pthread_mutex_init(&c->mu, NULL);
  pthread_cond_init(&c->idle_cv, NULL);
  atomic_init(&c->next_id, 1);
  c->nurls = nurls;
  pthread_mutex_init(&c->admin_mu, NULL);
  if (opts) c->opts = *opts;
  const char *admin = opts && opts->admin_url && *opts->admin_url ? opts->admin_url
                                                                   : getenv("GROVE_ADMIN");
  c->admin_url_given = admin && *admin;
  const char *token = opts && opts->admin_token ? opts->admin_token : getenv("GROVE_ADMIN_TOKEN");
  c->admin_url = strdup(c->admin_url_given ? admin : GROVE_DEFAULT_ADMIN_URL);
  c->token = token && *token ? strdup(token) : NULL;
  if (!c->admin_url || (token && *token && !c->token)) {
    client_free(c);
    return grove__client_nomem(err);
  }
  /* A client opened on the admin URL is its own admin plane. */
  if (nurls == 1 && urls[0] && strcmp(urls[0], c->admin_url) == 0) c->admin = c;
  size_t used = 0;
  for (size_t i = 0; i < nurls && used < sizeof c->urls; i++) {
    int w = snprintf(c->urls + used, sizeof c->urls - used, "%s%s", i ? "," : "",
                     urls[i] ? urls[i] : "(null)");
    if (w > 0) used += (size_t)w;
  }
  /* GROVE_CLIENT_IO=nng: NNG's req0 socket instead of the SP transport
   * (docs/operations.md, "The client's transport"). */
  const char *io = getenv("GROVE_CLIENT_IO");
  if (io && *io && strcmp(io, "nng") != 0 && strcmp(io, "sp") != 0) {
    client_free(c);
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT,
                         LOCAL_PREFIX "GROVE_CLIENT_IO=%s: \"sp\" (the default) or \"nng\"", io);
  }
  c->io = io && strcmp(io, "nng") == 0 ? &grove__client_io_nng : &grove__client_io_sp;
  grove_status s = c->io->open(c, urls, nurls, err);
  if (s) {
    client_free(c);
    return s;
  }
  *out = c;
  return GROVE_OK;
}

void grove_client_close(grove_client *c) {
  if (!c) return;
  if (c->admin && c->admin != c) grove_client_close(c->admin);
  grove_client_wait_idle(c);
  if (c->io->close(c)) client_free(c);
}

/* ------------------------------------------------------------ one call */

#define now_ms grove__client_now_ms

int grove__client_timeout_of(const grove_client *c, int timeout_ms) {
  return timeout_ms > 0 ? timeout_ms : c->default_timeout_ms;
}

static void sleep_ms(int64_t ms) {
  if (ms <= 0) return;
  struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

/* With several replicas, whether a predict that failed with s may be sent
 * again: its connection was lost (the replica died: NNG 1.5 fails the
 * request with "Connection reset", since timed resends are off), or the
 * replica answered UNAVAILABLE itself (draining, or the model not loaded
 * there).  A timeout is not retried: its time is spent. */
static bool retry_predict(grove_client *c, grove_status s, const grove_err *err) {
  if (c->nurls < 2 || s != GROVE_E_UNAVAILABLE) return false;
  /* Every connection lost: no replica to send it to. */
  if (c->io->connected(c) <= 0) return false;
  if (!grove_client_failed_locally(s, err)) return true;
  return !strstr(err->msg, "not back within");
}

/* Reload, export, hooks and training act on the one server they reach and
 * are not safe to send again to another.  They go to the admin URL; with
 * several data URLs and only the default admin URL, which replica that is
 * would be a guess, so they are refused (give the admin URL of the replica
 * meant, or open a client with that replica's URL alone). */
grove_status grove__client_admin_plane(grove_client **cp, const char *what, grove_err *err) {
  grove_client *c = *cp;
  if (c->nurls > 1 && !c->admin_url_given)
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT,
                         LOCAL_PREFIX "%s acts on one replica; this client has %zu URLs (%s): "
                                      "give it that replica's admin URL (admin_url, grove --admin, "
                                      "$GROVE_ADMIN) or open one with that replica's URL alone",
                         what, c->nurls, c->urls);
  pthread_mutex_lock(&c->admin_mu);
  grove_status s = GROVE_OK;
  if (!c->admin) {
    grove_client_opts o = c->opts;
    o.admin_url = c->admin_url;
    o.admin_token = c->token ? c->token : "";
    const char *urls[] = {c->admin_url};
    grove_err why = {0};
    s = grove_client_open(urls, 1, &o, &c->admin, &why);
    if (s)
      grove_err_set(err, s,
                    LOCAL_PREFIX "%s is served on groved's admin listener, and %s cannot be "
                                 "reached (groved --admin-listen; grove --admin URL or "
                                 "$GROVE_ADMIN): %s",
                    what, c->admin_url, why.msg + strlen(LOCAL_PREFIX));
  }
  pthread_mutex_unlock(&c->admin_mu);
  if (!s) *cp = c->admin;
  return s;
}

/* Whether a request of this body belongs to the admin plane (it then
 * carries the token). */
static bool admin_body(Grove__Request__BodyCase b) {
  return b != GROVE__REQUEST__BODY_PREDICT && b != GROVE__REQUEST__BODY_STATUS &&
         b != GROVE__REQUEST__BODY_MODEL_METADATA;
}

/* req as a new message; NULL when out of memory. */
static nng_msg *encode(grove_client *c, Grove__Request *req) {
  req->protocol = GROVE__PROTOCOL_VERSION__PROTOCOL_VERSION;
  req->id = (uint64_t)atomic_fetch_add(&c->next_id, 1);
  /* The token goes to the admin plane only, never with a predict. */
  if (c->token && admin_body(req->body_case)) req->admin_token = c->token;
  size_t n = grove__request__get_packed_size(req);
  nng_msg *m;
  if (nng_msg_alloc(&m, n) != 0) return NULL;
  grove__request__pack(req, nng_msg_body(m));
  return m;
}

/* Decodes rep (taken) into *out, the caller's to free; a status other than
 * OK becomes the return value with the server's message, and the reply is
 * kept in *out all the same: a failed Reload carries the lists of what did
 * not fit.  *out is NULL only when rep is not a reply at all. */
static grove_status decode_keep(grove_client *c, nng_msg *rep, Grove__Reply **out, grove_err *err) {
  *out = NULL;
  size_t len = nng_msg_len(rep);
  Grove__Reply *r = grove__reply__unpack(NULL, len, nng_msg_body(rep));
  nng_msg_free(rep);
  if (!r)
    return grove_err_set(err, GROVE_E_FORMAT,
                         LOCAL_PREFIX "%s answered %zu bytes that are not a grove.Reply", c->urls,
                         len);
  *out = r;
  if (r->status == 0) return GROVE_OK;
  grove_status s = (grove_status)r->status;
  return grove_err_set(err, s, "%s", r->message && *r->message ? r->message : grove_strerror(s));
}

/* decode_keep for the calls that need nothing of a failed reply: *out is
 * set only on success. */
static grove_status decode(grove_client *c, nng_msg *rep, Grove__Reply **out, grove_err *err) {
  grove_status s = decode_keep(c, rep, out, err);
  if (s && *out) {
    grove__reply__free_unpacked(*out, NULL);
    *out = NULL;
  }
  return s;
}

/* Sends m (taken) and waits at most timeout_ms for the reply, decoded. */
static grove_status roundtrip(grove_client *c, nng_msg *m, int timeout_ms, Grove__Reply **out,
                              grove_err *err) {
  *out = NULL;
  nng_msg *rep = NULL;
  grove_status s = c->io->exchange(c, m, timeout_ms, &rep, err);
  return s ? s : decode(c, rep, out, err);
}

grove_status grove__client_call(grove_client *c, Grove__Request *req, int timeout_ms,
                                Grove__Reply **out, grove_err *err) {
  *out = NULL;
  nng_msg *m = encode(c, req);
  if (!m) return grove__client_nomem(err);
  return roundtrip(c, m, timeout_ms, out, err);
}

/* call, for a reply that must carry body; one that does not is
 * GROVE_E_FORMAT with missing as the message ("the reply to status holds
 * no status").  *out is set only on success. */
grove_status grove__client_call_for(grove_client *c, Grove__Request *req, int timeout_ms,
                             Grove__Reply__BodyCase body, const char *missing, Grove__Reply **out,
                             grove_err *err) {
  grove_status s = grove__client_call(c, req, timeout_ms, out, err);
  if (s) return s;
  if ((*out)->body_case != body) {
    grove__reply__free_unpacked(*out, NULL);
    *out = NULL;
    return grove_err_set(err, GROVE_E_FORMAT, LOCAL_PREFIX "%s", missing);
  }
  return GROVE_OK;
}

/* ------------------------------------------------------------ predict */

void grove_prediction_fini(grove_prediction *p) {
  if (!p) return;
  for (size_t i = 0; i < p->noutputs; i++) {
    if (p->outputs) grove_tensor_release(p->outputs[i]);
    if (p->names) free(p->names[i]);
  }
  free(p->outputs);
  free(p->names);
  memset(p, 0, sizeof *p);
}

/* A new heap tensor from a wire tensor, every size checked. */
static grove_status tensor_from_wire(const Grove__Tensor *t, const char *what, grove_tensor **out,
                                     grove_err *err) {
  *out = NULL;
  if (t->dtype < 0 || t->dtype >= GROVE_DTYPE_COUNT || grove_dtype_size(t->dtype) == 0 ||
      t->n_shape > GROVE_MAX_DIMS)
    return grove_err_set(err, GROVE_E_FORMAT, LOCAL_PREFIX "%s: dtype %d, %zu dimensions", what,
                         t->dtype, t->n_shape);
  uint64_t numel = 1;
  for (size_t d = 0; d < t->n_shape; d++)
    if (t->shape[d] < 0 || __builtin_mul_overflow(numel, (uint64_t)t->shape[d], &numel))
      return grove_err_set(err, GROVE_E_FORMAT, LOCAL_PREFIX "%s: bad shape", what);
  uint64_t bytes;
  if (__builtin_mul_overflow(numel, (uint64_t)grove_dtype_size(t->dtype), &bytes) ||
      bytes != t->data.len)
    return grove_err_set(err, GROVE_E_FORMAT,
                         LOCAL_PREFIX "%s: %zu bytes of data for %" PRIu64 " elements", what,
                         t->data.len, numel);
  grove_err terr = {0};
  grove_tensor *x = grove_tensor_new((grove_dtype)t->dtype, (int)t->n_shape, t->shape, &terr);
  if (!x) return grove_err_set(err, terr.code, LOCAL_PREFIX "%s: %s", what, grove_err_msg(&terr));
  if (bytes) memcpy(x->data, t->data.data, (size_t)bytes);
  *out = x;
  return GROVE_OK;
}

/* A wire view of t (contiguous: t's data, else a copy kept in *copy, the
 * caller's to release).  shape must hold GROVE_MAX_DIMS. */
grove_status grove__client_wire_of(const grove_tensor *t, const char *what, Grove__Tensor *w,
                            int64_t *shape, grove_tensor **copy, grove_err *err) {
  *copy = NULL;
  if (t->ndim < 0 || t->ndim > GROVE_MAX_DIMS || grove_dtype_size(t->dtype) == 0)
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT, LOCAL_PREFIX "%s: bad tensor", what);
  if (!grove_tensor_is_contiguous(t)) {
    grove_err cerr = {0};
    if (!(*copy = grove_tensor_clone(t, t->dtype, &cerr)))
      return grove_err_set(err, cerr.code, LOCAL_PREFIX "%s: %s", what, grove_err_msg(&cerr));
    t = *copy;
  }
  grove__tensor__init(w);
  w->dtype = (int32_t)t->dtype;
  w->n_shape = (size_t)t->ndim;
  memcpy(shape, t->shape, sizeof(int64_t) * (size_t)t->ndim);
  w->shape = shape;
  w->data.len = grove_tensor_nbytes(t);
  w->data.data = t->data;
  return GROVE_OK;
}


/* Fills b with inputs[0..n) (at most max, itself at most MAX_INPUTS) and
 * target when not NULL.  wire_batch_fini releases it, also after a
 * failure. */
grove_status grove__client_wire_batch_init(wire_batch *b, const grove_tensor *inputs, size_t n,
                                    const grove_tensor *target, size_t max, grove_err *err) {
  memset(b->copies, 0, sizeof b->copies);
  if (n > max || (n && !inputs))
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT, LOCAL_PREFIX "at most %zu inputs", max);
  for (size_t i = 0; i <= n; i++) {
    const grove_tensor *t = i < n ? &inputs[i] : target;
    if (!t) break;
    char what[32];
    snprintf(what, sizeof what, i < n ? "inputs[%zu]" : "target", i);
    grove_status s = grove__client_wire_of(t, what, &b->t[i], b->shapes[i], &b->copies[i], err);
    if (s) return s;
    b->ptrs[i] = &b->t[i];
  }
  return GROVE_OK;
}

void grove__client_wire_batch_fini(wire_batch *b) {
  for (size_t i = 0; i <= MAX_INPUTS; i++) grove_tensor_release(b->copies[i]);
}

/* The predict request for inputs as a new message (*out). */
static grove_status encode_predict(grove_client *c, const char *model, const grove_tensor *inputs,
                                   size_t ninputs, int ms, nng_msg **out, grove_err *err) {
  *out = NULL;
  if (!model || (ninputs && !inputs) || ninputs > MAX_INPUTS)
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT,
                         LOCAL_PREFIX "predict: needs a model name and at most %d inputs",
                         MAX_INPUTS);
  wire_batch b;
  grove_status s = grove__client_wire_batch_init(&b, inputs, ninputs, NULL, MAX_INPUTS, err);
  if (!s) {
    Grove__PredictRequest pr = GROVE__PREDICT_REQUEST__INIT;
    pr.model = (char *)model;
    pr.n_inputs = ninputs;
    pr.inputs = b.ptrs;
    pr.timeout_us = (uint64_t)ms * 1000;
    Grove__Request req = GROVE__REQUEST__INIT;
    req.body_case = GROVE__REQUEST__BODY_PREDICT;
    req.predict = &pr;
    if (!(*out = encode(c, &req))) s = grove__client_nomem(err);
  }
  grove__client_wire_batch_fini(&b);
  return s;
}

/* The tensors w[0..n) of a reply into out's outputs and names; out is
 * empty again after a failure. */
grove_status grove__client_outputs_from_wire(Grove__Tensor **w, size_t n, grove_prediction *out,
                                      grove_err *err) {
  grove_status s = GROVE_OK;
  out->outputs = calloc(n ? n : 1, sizeof *out->outputs);
  out->names = calloc(n ? n : 1, sizeof *out->names);
  if (!out->outputs || !out->names) s = grove__client_nomem(err);
  for (size_t i = 0; i < n && !s; i++) {
    char what[64];
    snprintf(what, sizeof what, "output %zu", i);
    s = tensor_from_wire(w[i], what, &out->outputs[i], err);
    out->noutputs = i + 1;
    if (!s && !(out->names[i] = strdup(w[i]->name ? w[i]->name : ""))) s = grove__client_nomem(err);
  }
  if (s) grove_prediction_fini(out);
  return s;
}

/* The outputs of a predict reply (taken) into *out. */
static grove_status prediction_from_reply(Grove__Reply *rep, grove_prediction *out,
                                          grove_err *err) {
  if (rep->body_case != GROVE__REPLY__BODY_PREDICT) {
    grove__reply__free_unpacked(rep, NULL);
    return grove_err_set(err, GROVE_E_FORMAT, LOCAL_PREFIX "the reply to predict holds no outputs");
  }
  const Grove__PredictReply *pr = rep->predict;
  grove_status s = grove__client_outputs_from_wire(pr->outputs, pr->n_outputs, out, err);
  if (!s) {
    out->version = pr->version;
    out->queue_us = pr->queue_us;
    out->compute_us = pr->compute_us;
    out->batch_rows = pr->batch_rows;
  }
  grove__reply__free_unpacked(rep, NULL);
  return s;
}

grove_status grove_client_predict(grove_client *c, const char *model, const grove_tensor *inputs,
                                  size_t ninputs, int timeout_ms, grove_prediction *out,
                                  grove_err *err) {
  if (out) memset(out, 0, sizeof *out);
  if (!c || !out)
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT,
                         LOCAL_PREFIX "predict: needs a client and somewhere to put the outputs");
  int ms = grove__client_timeout_of(c, timeout_ms);
  nng_msg *m = NULL;
  grove_status s = encode_predict(c, model, inputs, ninputs, ms, &m, err);
  if (s) return s;
  Grove__Reply *r = NULL;
  int64_t t0 = now_ms();
  for (int attempt = 0;; attempt++) {
    /* Predict is idempotent, so with several replicas a request that one
     * of them could not answer goes to another (docs/operations.md,
     * "Several replicas").  The copy is made before the send takes m. */
    nng_msg *again = NULL;
    if (c->nurls > 1 && nng_msg_dup(&again, m) != 0) again = NULL;
    int64_t left = (int64_t)ms - (now_ms() - t0);
    s = roundtrip(c, m, left > 0 ? (int)left : 1, &r, err);
    if (!s || !again || !retry_predict(c, s, err) || now_ms() - t0 >= ms) {
      nng_msg_free(again);
      return s ? s : prediction_from_reply(r, out, err);
    }
    /* A short pause, growing: a draining replica leaves the rotation when
     * it exits, a dead one at once. */
    int64_t pause = attempt < 6 ? (int64_t)1 << attempt : 100;
    left = (int64_t)ms - (now_ms() - t0);
    sleep_ms(pause < left ? pause : left);
    m = again;
  }
}

/* ------------------------------------------------------------ async predict */

/* A call counts as outstanding until its callback has returned, so that
 * grove_client_wait_idle never returns while a callback still runs. */
static void outstanding_done(grove_client *c) {
  pthread_mutex_lock(&c->mu);
  if (--c->outstanding == 0) pthread_cond_broadcast(&c->idle_cv);
  pthread_mutex_unlock(&c->mu);
}

typedef struct acb {
  grove_client *c;
  grove_predict_cb cb;
  void *arg;
} acb;

/* The transport's completion of a predict: decoded, then the caller's
 * callback. */
static void predict_done(void *arg, grove_status s, nng_msg *rep, const grove_err *ioerr) {
  acb a = *(acb *)arg;
  free(arg);
  grove_err err; /* 2 KiB: only what a failure reads is set */
  err.code = GROVE_OK;
  err.msg[0] = 0;
  grove_prediction pred = {0};
  if (s) {
    err = *ioerr;
  } else {
    Grove__Reply *r = NULL;
    s = decode(a.c, rep, &r, &err);
    if (!s) s = prediction_from_reply(r, &pred, &err);
  }
  a.cb(a.arg, s, s ? NULL : &pred, &err);
  outstanding_done(a.c);
}

grove_status grove_client_predict_async(grove_client *c, const char *model,
                                        const grove_tensor *inputs, size_t ninputs, int timeout_ms,
                                        grove_predict_cb cb, void *arg, grove_err *err) {
  if (!c || !cb)
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT,
                         LOCAL_PREFIX "predict_async: needs a client and a callback");
  int ms = grove__client_timeout_of(c, timeout_ms);
  nng_msg *m = NULL;
  grove_status s = encode_predict(c, model, inputs, ninputs, ms, &m, err);
  if (s) return s;
  acb *a = malloc(sizeof *a);
  if (!a) {
    nng_msg_free(m);
    return grove__client_nomem(err);
  }
  *a = (acb){c, cb, arg};
  pthread_mutex_lock(&c->mu);
  c->outstanding++;
  pthread_mutex_unlock(&c->mu);
  /* Predict is idempotent: sent again on another replica if its
   * connection drops. */
  s = c->io->exchange_async(c, m, ms, c->nurls > 1, predict_done, a, err);
  if (s) {
    free(a);
    outstanding_done(c);
  }
  return s;
}

void grove_client_wait_idle(grove_client *c) {
  if (!c) return;
  pthread_mutex_lock(&c->mu);
  while (c->outstanding > 0) pthread_cond_wait(&c->idle_cv, &c->mu);
  pthread_mutex_unlock(&c->mu);
}

/* ------------------------------------------------------------ status */

static char *dup_str(const char *s) {
  return strdup(s ? s : "");
}

static void info_fini(grove_model_info *m) {
  free(m->name);
  free(m->dir);
  free(m->weights_path);
  free(m->error);
  for (size_t i = 0; m->inputs && i < m->ninputs; i++) free(m->inputs[i].name);
  for (size_t i = 0; m->outputs && i < m->noutputs; i++) free(m->outputs[i].name);
  free(m->inputs);
  free(m->outputs);
  memset(m, 0, sizeof *m);
}

void grove_model_info_free(grove_model_info *m) {
  if (!m) return;
  info_fini(m);
  free(m);
}

static grove_status specs_from_wire(Grove__IoSpec **w, size_t n, grove_io_spec **out, size_t *nout,
                                    grove_err *err) {
  *out = calloc(n ? n : 1, sizeof **out);
  if (!*out) return grove__client_nomem(err);
  for (size_t i = 0; i < n; i++) {
    if (w[i]->n_shape > GROVE_MAX_DIMS)
      return grove_err_set(err, GROVE_E_FORMAT, LOCAL_PREFIX "an io spec with %zu dimensions",
                           w[i]->n_shape);
    grove_io_spec *s = &(*out)[i];
    *nout = i + 1;
    if (!(s->name = dup_str(w[i]->name))) return grove__client_nomem(err);
    s->dtype = (grove_dtype)w[i]->dtype;
    s->ndim = (int)w[i]->n_shape;
    memcpy(s->shape, w[i]->shape, sizeof(int64_t) * w[i]->n_shape);
  }
  return GROVE_OK;
}

static grove_status info_from_wire(const Grove__ModelMetadata *w, grove_model_info *m,
                                   grove_err *err) {
  memset(m, 0, sizeof *m);
  if (!(m->name = dup_str(w->name)) || !(m->dir = dup_str(w->dir)) ||
      !(m->weights_path = dup_str(w->weights_path)) || !(m->error = dup_str(w->error)))
    return grove__client_nomem(err);
  m->ready = w->ready;
  m->version = w->version;
  m->param_count = w->param_count;
  m->weight_bytes = w->weight_bytes;
  m->queue_depth = w->queue_depth;
  if (w->batching) {
    m->batching.max_batch_size = w->batching->max_batch_size;
    m->batching.max_queue_delay_us = w->batching->max_queue_delay_us;
    m->batching.max_queue_size = w->batching->max_queue_size;
  }
  grove_status s = specs_from_wire(w->inputs, w->n_inputs, &m->inputs, &m->ninputs, err);
  if (!s) s = specs_from_wire(w->outputs, w->n_outputs, &m->outputs, &m->noutputs, err);
  return s;
}

void grove_server_status_free(grove_server_status *s) {
  if (!s) return;
  for (size_t i = 0; s->models && i < s->nmodels; i++) info_fini(&s->models[i]);
  free(s->models);
  grove__client_strv_free(s->admin_urls, s->nadmin);
  grove__client_strv_free(s->listen_urls, s->nlisten);
  free(s->server_version);
  free(s);
}

grove_status grove_client_status(grove_client *c, int timeout_ms, grove_server_status **out,
                                 grove_err *err) {
  if (out) *out = NULL;
  if (!c || !out)
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT, LOCAL_PREFIX "status: no client or out");
  Grove__StatusRequest sr = GROVE__STATUS_REQUEST__INIT;
  Grove__Request req = GROVE__REQUEST__INIT;
  req.body_case = GROVE__REQUEST__BODY_STATUS;
  req.status = &sr;
  Grove__Reply *rep = NULL;
  grove_status s = grove__client_call_for(c, &req, grove__client_timeout_of(c, timeout_ms),
                                          GROVE__REPLY__BODY_STATUS_REPLY,
                                          "the reply to status holds no status", &rep, err);
  if (s) return s;
  const Grove__StatusReply *w = rep->status_reply;
  grove_server_status *st = calloc(1, sizeof *st);
  if (!st) s = grove__client_nomem(err);
  if (!s && !(st->server_version = dup_str(w->server_version))) s = grove__client_nomem(err);
  if (!s) {
    st->protocol = w->protocol;
    st->ready = w->ready;
    st->draining = w->draining;
    st->uptime_ms = w->uptime_ms;
    st->workers = w->workers;
    st->blas_threads = w->blas_threads;
    st->inflight = w->inflight;
    if (!(st->models = calloc(w->n_models ? w->n_models : 1, sizeof *st->models)))
      s = grove__client_nomem(err);
  }
  for (size_t i = 0; !s && i < w->n_models; i++) {
    st->nmodels = i + 1;
    s = info_from_wire(w->models[i], &st->models[i], err);
  }
  if (!s) {
    bool oom = false;
    st->admin_urls = grove__client_strv_dup(w->admin_listen, w->n_admin_listen, &oom);
    st->nadmin = st->admin_urls ? w->n_admin_listen : 0;
    st->listen_urls = grove__client_strv_dup(w->listen, w->n_listen, &oom);
    st->nlisten = st->listen_urls ? w->n_listen : 0;
    if (oom) s = grove__client_nomem(err);
  }
  grove__reply__free_unpacked(rep, NULL);
  if (s) {
    grove_server_status_free(st);
    return s;
  }
  *out = st;
  return GROVE_OK;
}

grove_status grove_client_model_info(grove_client *c, const char *model, int timeout_ms,
                                     grove_model_info **out, grove_err *err) {
  if (out) *out = NULL;
  if (!c || !model || !out)
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT,
                         LOCAL_PREFIX "model_info: no client, model or out");
  Grove__ModelMetadataRequest mr = GROVE__MODEL_METADATA_REQUEST__INIT;
  mr.model = (char *)model;
  Grove__Request req = GROVE__REQUEST__INIT;
  req.body_case = GROVE__REQUEST__BODY_MODEL_METADATA;
  req.model_metadata = &mr;
  Grove__Reply *rep = NULL;
  grove_status s = grove__client_call_for(c, &req, grove__client_timeout_of(c, timeout_ms),
                                          GROVE__REPLY__BODY_MODEL_METADATA,
                                          "the reply holds no model metadata", &rep, err);
  if (s) return s;
  grove_model_info *m = calloc(1, sizeof *m);
  if (!m)
    s = grove__client_nomem(err);
  else
    s = info_from_wire(rep->model_metadata, m, err);
  grove__reply__free_unpacked(rep, NULL);
  if (s) {
    grove_model_info_free(m);
    return s;
  }
  *out = m;
  return GROVE_OK;
}

/* ------------------------------------------------------------ reload */

void grove__client_strv_free(char **v, size_t n) {
  for (size_t i = 0; v && i < n; i++) free(v[i]);
  free(v);
}

char **grove__client_strv_dup(char **w, size_t n, bool *oom) {
  char **v = calloc(n ? n : 1, sizeof *v);
  if (!v) {
    *oom = true;
    return NULL;
  }
  for (size_t i = 0; i < n; i++)
    if (!(v[i] = dup_str(w[i]))) *oom = true;
  return v;
}

void grove_reload_result_fini(grove_reload_result *r) {
  if (!r) return;
  free(r->weights_path);
  free(r->dir);
  grove__client_strv_free(r->missing, r->n_missing);
  grove__client_strv_free(r->unexpected, r->n_unexpected);
  grove__client_strv_free(r->errors, r->n_errors);
  memset(r, 0, sizeof *r);
}

/* Sends req (a Reload, or a Promote, which answers with its reload's
 * reply; what names it for a message) and fills *out from the reply, also
 * when the server refused: a refusal lists what did not fit. */
grove_status grove__client_reload_call(grove_client *c, Grove__Request *req, int timeout_ms,
                                const char *what, grove_reload_result *out, grove_err *err) {
  nng_msg *m = encode(c, req), *rep = NULL;
  if (!m) return grove__client_nomem(err);
  grove_status s = c->io->exchange(c, m, timeout_ms, &rep, err);
  if (s) return s;
  Grove__Reply *r = NULL;
  s = decode_keep(c, rep, &r, err);
  if (!r) return s;
  if (r->body_case == GROVE__REPLY__BODY_RELOAD) {
    const Grove__ReloadReply *w = r->reload;
    bool oom = false;
    out->version = w->version;
    out->previous_version = w->previous_version;
    out->duration_us = w->duration_us;
    out->pause_us = w->pause_us;
    out->in_place = w->in_place;
    if (!(out->weights_path = dup_str(w->weights_path)) || !(out->dir = dup_str(w->dir)))
      oom = true;
    out->missing = grove__client_strv_dup(w->missing_keys, w->n_missing_keys, &oom);
    out->n_missing = out->missing ? w->n_missing_keys : 0;
    out->unexpected = grove__client_strv_dup(w->unexpected_keys, w->n_unexpected_keys, &oom);
    out->n_unexpected = out->unexpected ? w->n_unexpected_keys : 0;
    out->errors = grove__client_strv_dup(w->errors, w->n_errors, &oom);
    out->n_errors = out->errors ? w->n_errors : 0;
    if (oom && !s) s = grove__client_nomem(err);
  } else if (!s) {
    s = grove_err_set(err, GROVE_E_FORMAT, LOCAL_PREFIX "the reply to %s holds no result", what);
  }
  grove__reply__free_unpacked(r, NULL);
  return s;
}

grove_status grove_client_reload(grove_client *c, const char *model, const grove_reload_opts *opts,
                                 int timeout_ms, grove_reload_result *out, grove_err *err) {
  if (out) memset(out, 0, sizeof *out);
  if (!c || !model || !out)
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT,
                         LOCAL_PREFIX
                         "reload: needs a client, a model and somewhere for the result");
  grove_status refused = grove__client_admin_plane(&c, "reload", err);
  if (refused) return refused;
  Grove__ReloadRequest rq = GROVE__RELOAD_REQUEST__INIT;
  rq.model = (char *)model;
  if (opts) {
    rq.checkpoint = (char *)(opts->checkpoint ? opts->checkpoint : "");
    rq.model_dir = (char *)(opts->model_dir ? opts->model_dir : "");
    rq.non_strict = opts->non_strict;
    rq.in_place = opts->in_place;
  }
  Grove__Request req = GROVE__REQUEST__INIT;
  req.body_case = GROVE__REQUEST__BODY_RELOAD;
  req.reload = &rq;
  return grove__client_reload_call(c, &req, grove__client_timeout_of(c, timeout_ms), "reload", out,
                                   err);
}

/* ------------------------------------------------------------ export */

#define EXPORT_CHUNK ((size_t)8 << 20)

/* One ExportStateDict round trip; *out is the caller's. */
static grove_status export_call(grove_client *c, Grove__ExportStateDictRequest *q, int timeout_ms,
                                Grove__Reply **out, grove_err *err) {
  Grove__Request req = GROVE__REQUEST__INIT;
  req.body_case = GROVE__REQUEST__BODY_EXPORT_STATE_DICT;
  req.export_state_dict = q;
  return grove__client_call_for(c, &req, timeout_ms, GROVE__REPLY__BODY_EXPORT_STATE_DICT,
                  "the reply to export holds no data", out, err);
}

/* Releases export id on the server (best effort: an export left open
 * expires there anyway). */
static void export_abandon(grove_client *c, uint64_t id, int timeout_ms) {
  Grove__ExportStateDictRequest q = GROVE__EXPORT_STATE_DICT_REQUEST__INIT;
  q.export_id = id;
  q.close = true;
  Grove__Reply *r = NULL;
  grove_err ignore = {0};
  if (!export_call(c, &q, timeout_ms, &r, &ignore)) grove__reply__free_unpacked(r, NULL);
}

grove_status grove_client_export(grove_client *c, const char *model, grove_ckpt_format format,
                                 const grove_export_opts *opts, int timeout_ms,
                                 grove_export_sink sink, void *user, grove_export_info *info,
                                 grove_err *err) {
  if (info) memset(info, 0, sizeof *info);
  if (!c || !model || !sink || (format != GROVE_CKPT_SAFETENSORS && format != GROVE_CKPT_TORCH_ZIP))
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT,
                         LOCAL_PREFIX
                         "export: needs a client, a model, a sink and the format "
                         "safetensors or pt");
  grove_status refused = grove__client_admin_plane(&c, "export", err);
  if (refused) return refused;
  int ms = grove__client_timeout_of(c, timeout_ms);
  size_t chunk = opts && opts->chunk_bytes ? opts->chunk_bytes : EXPORT_CHUNK;
  Grove__ExportStateDictRequest q = GROVE__EXPORT_STATE_DICT_REQUEST__INIT;
  q.model = (char *)model;
  q.format = (int32_t)format;
  q.prefix = (char *)(opts && opts->prefix ? opts->prefix : "");
  q.archive_name = (char *)(opts && opts->archive_name ? opts->archive_name : "");
  q.length = chunk;
  Grove__Reply *r = NULL;
  grove_status s = export_call(c, &q, ms, &r, err);
  if (s) return s;
  const Grove__ExportStateDictReply *e = r->export_state_dict;
  uint64_t id = e->export_id, total = e->total_size, offset = 0;
  int64_t version = e->version;
  /* Ask for no more than the server sends in one reply, so that the range
   * that carries close is really the last one. */
  if (e->chunk_limit && chunk > e->chunk_limit) chunk = (size_t)e->chunk_limit;
  if (info) {
    info->version = version;
    info->total_size = total;
    info->tensors = e->tensors;
  }
  bool closed = e->closed;
  for (;;) {
    const Grove__ExportStateDictReply *x = r->export_state_dict;
    if (x->export_id != id || x->version != version || x->total_size != total ||
        x->offset != offset || x->data.len > total - offset || (x->data.len == 0 && offset < total))
      s = grove_err_set(err, GROVE_E_FORMAT,
                        LOCAL_PREFIX "export %" PRIu64 ": the server sent bytes [%" PRIu64
                                     ", +%zu) of version %" PRId64 " where [%" PRIu64
                                     ", ...) of version %" PRId64 " was due",
                        id, x->offset, x->data.len, x->version, offset, version);
    if (!s && x->data.len) s = sink(user, x->data.data, x->data.len, err);
    if (!s) offset += x->data.len;
    closed = x->closed;
    grove__reply__free_unpacked(r, NULL);
    r = NULL;
    if (s || offset == total) break;
    Grove__ExportStateDictRequest f = GROVE__EXPORT_STATE_DICT_REQUEST__INIT;
    f.model = (char *)model;
    f.export_id = id;
    f.offset = offset;
    f.length = total - offset < chunk ? total - offset : chunk;
    f.close = offset + f.length >= total;
    if ((s = export_call(c, &f, ms, &r, err))) break;
  }
  if (!closed) export_abandon(c, id, ms);
  return s;
}

typedef struct file_sink {
  int fd;
  const char *path;
} file_sink;

static grove_status write_sink(void *user, const void *data, size_t len, grove_err *err) {
  file_sink *f = user;
  const uint8_t *p = data;
  while (len > 0) {
    ssize_t w = write(f->fd, p, len);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0)
      return grove_err_set(err, GROVE_E_IO, LOCAL_PREFIX "%s: write failed: %s", f->path,
                           strerror(errno));
    p += w;
    len -= (size_t)w;
  }
  return GROVE_OK;
}

static bool ends_with(const char *s, const char *suffix) {
  size_t a = strlen(s), b = strlen(suffix);
  return a >= b && strcmp(s + a - b, suffix) == 0;
}

grove_status grove_client_export_file(grove_client *c, const char *model, const char *path,
                                      bool overwrite, const grove_export_opts *opts, int timeout_ms,
                                      grove_export_info *info, grove_err *err) {
  if (info) memset(info, 0, sizeof *info);
  if (!c || !model || !path || !*path)
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT,
                         LOCAL_PREFIX "export: needs a client, a model and a file name");
  grove_status refused = grove__client_admin_plane(&c, "export", err);
  if (refused) return refused;
  grove_ckpt_format format;
  if (ends_with(path, ".safetensors"))
    format = GROVE_CKPT_SAFETENSORS;
  else if (ends_with(path, ".pt") || ends_with(path, ".pth") || ends_with(path, ".bin"))
    format = GROVE_CKPT_TORCH_ZIP;
  else
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT,
                         LOCAL_PREFIX
                         "%s: the name must end in .safetensors, .pt, .pth or .bin "
                         "(it says which format to write)",
                         path);
  struct stat st;
  if (!overwrite && lstat(path, &st) == 0)
    return grove_err_set(err, GROVE_E_ALREADY_EXISTS,
                         LOCAL_PREFIX "%s exists; --force overwrites it", path);
  /* A temporary sibling (hidden, so a model repository scan skips it). */
  const char *slash = strrchr(path, '/');
  size_t dlen = slash ? (size_t)(slash - path) : 0;
  const char *base = slash ? slash + 1 : path;
  size_t tn = dlen + strlen(base) + 48;
  char *tmp = malloc(tn);
  char *dir = malloc(dlen + 2);
  char *archive = grove_torch_archive_name(path);
  if (!tmp || !dir || !archive) {
    free(tmp);
    free(dir);
    free(archive);
    return grove__client_nomem(err);
  }
  if (slash) {
    memcpy(dir, path, dlen ? dlen : 1);
    dir[dlen ? dlen : 1] = 0;
  } else {
    strcpy(dir, ".");
  }
  snprintf(tmp, tn, "%.*s%s.%s.tmp-XXXXXX", (int)dlen, path, slash ? "/" : "", base);
  grove_status s = GROVE_OK;
  /* The bytes go to a file with no name (O_TMPFILE), named (as tmp, below)
   * only when complete: an export ended by an error, Ctrl-C, SIGTERM or even
   * SIGKILL leaves nothing, as the kernel frees a nameless file with its last
   * descriptor.  It is named through /proc/self/fd (AT_EMPTY_PATH needs a
   * privilege); without O_TMPFILE or /proc, a named temporary from the start. */
  int fd = -1;
#ifdef O_TMPFILE
  if (access("/proc/self/fd", F_OK) == 0) fd = open(dir, O_TMPFILE | O_WRONLY | O_CLOEXEC, 0644);
#endif
  bool named = fd < 0; /* tmp is a file */
  if (fd < 0) fd = mkstemp(tmp);
  if (fd < 0) {
    s = grove_err_set(err, GROVE_E_IO, LOCAL_PREFIX "%s: cannot create a temporary file: %s", tmp,
                      strerror(errno));
  } else {
    fchmod(fd, 0644);
    grove_export_opts o = opts ? *opts : (grove_export_opts){0};
    o.archive_name = archive;
    file_sink f = {fd, path};
    s = grove_client_export(c, model, format, &o, timeout_ms, write_sink, &f, info, err);
    if (!s && fsync(fd) != 0)
      s = grove_err_set(err, GROVE_E_IO, LOCAL_PREFIX "%s: fsync: %s", path, strerror(errno));
    static atomic_uint seq; /* two threads of one process, one path */
    char fdpath[64];
    snprintf(fdpath, sizeof fdpath, "/proc/self/fd/%d", fd);
    if (!s && !named) {
      snprintf(tmp, tn, "%.*s%s.%s.tmp-%ld-%u", (int)dlen, path, slash ? "/" : "", base,
               (long)getpid(), atomic_fetch_add(&seq, 1u));
      unlink(tmp); /* this pid's, from a run killed in the instant it was named */
      if (linkat(AT_FDCWD, fdpath, AT_FDCWD, tmp, AT_SYMLINK_FOLLOW) != 0)
        s = grove_err_set(err, GROVE_E_IO, LOCAL_PREFIX "%s: %s", tmp, strerror(errno));
      named = !s;
    }
    if (close(fd) != 0 && !s)
      s = grove_err_set(err, GROVE_E_IO, LOCAL_PREFIX "%s: close: %s", path, strerror(errno));
    if (!s && !overwrite) {
      /* link() refuses an existing name: a file that appeared meanwhile is
       * not replaced. */
      if (link(tmp, path) != 0)
        s = errno == EEXIST
                ? grove_err_set(err, GROVE_E_ALREADY_EXISTS,
                                LOCAL_PREFIX "%s exists; --force overwrites it", path)
                : grove_err_set(err, GROVE_E_IO, LOCAL_PREFIX "%s: %s", path, strerror(errno));
    } else if (!s && rename(tmp, path) != 0) {
      s = grove_err_set(err, GROVE_E_IO, LOCAL_PREFIX "%s: rename: %s", path, strerror(errno));
    }
    if (named && (s || !overwrite)) unlink(tmp); /* after link(), or after a failure */
    if (!s) {
      int dfd = open(dir, O_RDONLY | O_DIRECTORY);
      if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
      }
    }
  }
  free(tmp);
  free(dir);
  free(archive);
  return s;
}

/* ------------------------------------------------------------ hooks */

void grove_hook_infos_free(grove_hook_info *hooks, size_t n) {
  if (!hooks) return;
  for (size_t i = 0; i < n; i++) {
    grove_hook_info *h = &hooks[i];
    free(h->model);
    free(h->pattern);
    free(h->note);
    for (size_t k = 0; h->modules && k < h->nmodules; k++) free(h->modules[k]);
    free(h->modules);
  }
  free(hooks);
}

void grove_hook_info_free(grove_hook_info *h) {
  grove_hook_infos_free(h, h ? 1 : 0);
}

static grove_status hook_from_wire(const Grove__HookInfo *w, grove_hook_info *h, grove_err *err) {
  memset(h, 0, sizeof *h);
  const Grove__HookSpec *sp = w->spec;
  h->id = w->id;
  if (!(h->model = dup_str(sp ? sp->model : "")) ||
      !(h->pattern = dup_str(sp ? sp->pattern : "")) || !(h->note = dup_str(w->note)))
    return grove__client_nomem(err);
  if (sp) {
    h->kind = sp->kind == GROVE__HOOK_KIND__HOOK_FORWARD_PRE ? GROVE_HOOK_FORWARD_PRE
                                                             : GROVE_HOOK_FORWARD;
    h->every = sp->every;
    h->sample_rate = sp->sample_rate;
    h->histogram_bins = sp->histogram_bins;
    h->histogram_min = sp->histogram_min;
    h->histogram_max = sp->histogram_max;
    h->per_feature = sp->per_feature;
  }
  h->version = w->version;
  h->events_published = w->events_published;
  h->events_dropped = w->events_dropped;
  if (!(h->modules = calloc(w->n_modules ? w->n_modules : 1, sizeof *h->modules)))
    return grove__client_nomem(err);
  for (size_t i = 0; i < w->n_modules; i++) {
    h->nmodules = i + 1;
    if (!(h->modules[i] = dup_str(w->modules[i]))) return grove__client_nomem(err);
  }
  return GROVE_OK;
}

/* One hook of a reply (taken) into a new *out (when out is not NULL). */
static grove_status hook_reply(Grove__Reply *rep, const Grove__HookInfo *w, uint64_t *id,
                               grove_hook_info **out, grove_err *err) {
  grove_status s = GROVE_OK;
  if (!w) s = grove_err_set(err, GROVE_E_FORMAT, LOCAL_PREFIX "the reply holds no hook");
  if (!s && id) *id = w->id;
  if (!s && out) {
    grove_hook_info *h = calloc(1, sizeof *h);
    if (!h) s = grove__client_nomem(err);
    if (!s && (s = hook_from_wire(w, h, err))) grove_hook_info_free(h);
    if (!s) *out = h;
  }
  grove__reply__free_unpacked(rep, NULL);
  return s;
}

grove_status grove_client_register_hook(grove_client *c, const grove_hook_spec *spec,
                                        int timeout_ms, uint64_t *id, grove_hook_info **info,
                                        grove_err *err) {
  if (id) *id = 0;
  if (info) *info = NULL;
  if (!c || !spec || !spec->model || !spec->pattern)
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT,
                         LOCAL_PREFIX "register_hook: needs a client, a model and a pattern");
  grove_status refused = grove__client_admin_plane(&c, "a hook", err);
  if (refused) return refused;
  Grove__HookSpec sp = GROVE__HOOK_SPEC__INIT;
  sp.model = (char *)spec->model;
  sp.pattern = (char *)spec->pattern;
  sp.kind = spec->kind == GROVE_HOOK_FORWARD_PRE ? GROVE__HOOK_KIND__HOOK_FORWARD_PRE
                                                 : GROVE__HOOK_KIND__HOOK_FORWARD;
  sp.every = spec->every;
  sp.sample_rate = spec->sample_rate;
  sp.histogram_bins = spec->histogram_bins;
  sp.histogram_min = spec->histogram_min;
  sp.histogram_max = spec->histogram_max;
  sp.per_feature = spec->per_feature;
  Grove__RegisterHookRequest rr = GROVE__REGISTER_HOOK_REQUEST__INIT;
  rr.spec = &sp;
  Grove__Request req = GROVE__REQUEST__INIT;
  req.body_case = GROVE__REQUEST__BODY_REGISTER_HOOK;
  req.register_hook = &rr;
  Grove__Reply *rep = NULL;
  grove_status s = grove__client_call(c, &req, grove__client_timeout_of(c, timeout_ms), &rep, err);
  if (s) return s;
  const Grove__HookInfo *w =
      rep->body_case == GROVE__REPLY__BODY_REGISTER_HOOK && rep->register_hook
          ? rep->register_hook->hook
          : NULL;
  return hook_reply(rep, w, id, info, err);
}

grove_status grove_client_remove_hook(grove_client *c, uint64_t id, int timeout_ms,
                                      grove_hook_info **removed, grove_err *err) {
  if (removed) *removed = NULL;
  if (!c)
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT, LOCAL_PREFIX "remove_hook: no client");
  grove_status refused = grove__client_admin_plane(&c, "a hook", err);
  if (refused) return refused;
  Grove__RemoveHookRequest rr = GROVE__REMOVE_HOOK_REQUEST__INIT;
  rr.hook_id = id;
  Grove__Request req = GROVE__REQUEST__INIT;
  req.body_case = GROVE__REQUEST__BODY_REMOVE_HOOK;
  req.remove_hook = &rr;
  Grove__Reply *rep = NULL;
  grove_status s = grove__client_call(c, &req, grove__client_timeout_of(c, timeout_ms), &rep, err);
  if (s) return s;
  const Grove__HookInfo *w =
      rep->body_case == GROVE__REPLY__BODY_REMOVE_HOOK && rep->remove_hook ? rep->remove_hook->hook
                                                                           : NULL;
  return hook_reply(rep, w, NULL, removed, err);
}

grove_status grove_client_list_hooks(grove_client *c, const char *model, int timeout_ms,
                                     grove_hook_info **hooks, size_t *n, grove_err *err) {
  if (hooks) *hooks = NULL;
  if (n) *n = 0;
  if (!c || !hooks || !n)
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT,
                         LOCAL_PREFIX "list_hooks: no client or nowhere to put the hooks");
  grove_status refused = grove__client_admin_plane(&c, "a hook", err);
  if (refused) return refused;
  Grove__ListHooksRequest lr = GROVE__LIST_HOOKS_REQUEST__INIT;
  lr.model = (char *)(model ? model : "");
  Grove__Request req = GROVE__REQUEST__INIT;
  req.body_case = GROVE__REQUEST__BODY_LIST_HOOKS;
  req.list_hooks = &lr;
  Grove__Reply *rep = NULL;
  grove_status s = grove__client_call_for(c, &req, grove__client_timeout_of(c, timeout_ms),
                                          GROVE__REPLY__BODY_LIST_HOOKS,
                                          "the reply holds no hook list", &rep, err);
  if (s) return s;
  const Grove__ListHooksReply *w = rep->list_hooks;
  grove_hook_info *h = calloc(w->n_hooks ? w->n_hooks : 1, sizeof *h);
  size_t got = 0;
  if (!h) s = grove__client_nomem(err);
  for (size_t i = 0; !s && i < w->n_hooks; i++) {
    got = i + 1;
    s = hook_from_wire(w->hooks[i], &h[i], err);
  }
  grove__reply__free_unpacked(rep, NULL);
  if (s) {
    grove_hook_infos_free(h, got);
    return s;
  }
  *hooks = h;
  *n = got;
  return GROVE_OK;
}

