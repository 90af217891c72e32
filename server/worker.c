/* worker.c: groved's worker threads.
 *
 * A worker sleeps until the loop hands it a batch (srv_worker.batch, under
 * its mutex), then:
 *   1. copies each request's rows, in order, into one input per model input
 *      in its own arena (one arena per model, sized when the model loaded:
 *      the model's forward scratch at max_batch_size plus the inputs);
 *   2. runs one grove_model_forward on the batch's version (const tree);
 *   3. splits every output by rows and replies to each request from this
 *      thread (the output rows are encoded straight from the arena into the
 *      reply message);
 *   4. resets the arena and posts itself back to the loop, which drops the
 *      batch's version reference (and, when it was the last, frees the
 *      version off the loop and off the workers).
 * Nothing here allocates except NNG's reply messages: the arena was sized
 * at start (it grows once if a batch is larger than any before, e.g. a
 * longer sequence, and keeps that size). */
#define _GNU_SOURCE /* pthread_setname_np */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "server.h"

static grove_status wire_status(grove_status s) {
  /* A forward refuses inputs with E_SHAPE/E_DTYPE only when a reload changed
   * the spec between validation and dispatch: still the request's fault. */
  return (s == GROVE_E_SHAPE || s == GROVE_E_DTYPE) ? GROVE_E_INVALID_ARGUMENT : s;
}

/* A running mean over about the last 8 values (workers race on it: an
 * estimate). */
static void mean8(_Atomic int64_t *mean, int64_t v) {
  int64_t old = atomic_load_explicit(mean, memory_order_relaxed);
  atomic_store_explicit(mean, old ? old + (v - old) / 8 : v, memory_order_relaxed);
}

/* Before a batch's first reply: its rows stop counting as running
 * (batcher.c's rows in flight), once. */
static void answering(srv_batch *b) {
  if (b->answered) return;
  b->answered = true;
  atomic_fetch_sub(&b->model->running_rows, b->rows);
}

static void fail_batch(srv_batch *b, grove_status s, const char *msg) {
  answering(b);
  srv_req *r = b->reqs;
  while (r) {
    srv_req *next = r->next; /* r is NNG's once replied */
    grove__rpc_reply_error(r, wire_status(s), "model '%s' version %" PRId64 ": %s", b->model->name,
                           b->version->number, msg);
    r = next;
  }
  b->reqs = NULL;
}

/* Encodes r's rows of the outputs into r->reply (sent later, in a chain). */
static bool unbatched(const srv_batch *b) {
  return b->version->model->batching.max_batch_size == 0;
}

const void *grove__batch_slice(const srv_batch *b, const srv_req *r, const grove_tensor *t,
                               int64_t row0, size_t *nbytes, int64_t *dim0) {
  if (unbatched(b)) {
    *nbytes = grove_tensor_nbytes(t);
    *dim0 = t->ndim > 0 ? t->shape[0] : 0;
    return t->data;
  }
  size_t row_bytes = grove_tensor_nbytes(t) / (size_t)b->rows;
  *nbytes = row_bytes * (size_t)r->rows;
  *dim0 = r->rows;
  return (const unsigned char *)t->data + row_bytes * (size_t)row0;
}

static void encode_rows(srv_req *r, const srv_batch *b, const grove_values *out, int64_t row0,
                        int64_t compute_ns) {
  const grove_model *gm = b->version->model;
  Grove__Tensor tens[GROVE_MAX_VALUES];
  Grove__Tensor *ptrs[GROVE_MAX_VALUES];
  int64_t shapes[GROVE_MAX_VALUES][GROVE_MAX_DIMS];
  for (int k = 0; k < out->n; k++) {
    const grove_tensor *t = &out->v[k];
    size_t nbytes;
    int64_t dim0;
    const void *p = grove__batch_slice(b, r, t, row0, &nbytes, &dim0);
    grove__tensor__init(&tens[k]);
    tens[k].dtype = (int32_t)t->dtype;
    tens[k].n_shape = (size_t)t->ndim;
    memcpy(shapes[k], t->shape, sizeof(int64_t) * (size_t)t->ndim);
    if (t->ndim > 0) shapes[k][0] = dim0;
    tens[k].shape = shapes[k];
    tens[k].data.len = nbytes;
    tens[k].data.data = (uint8_t *)p;
    tens[k].name = (size_t)k < gm->noutputs && gm->outputs[k].name ? gm->outputs[k].name : "";
    ptrs[k] = &tens[k];
  }
  Grove__PredictReply pr = GROVE__PREDICT_REPLY__INIT;
  pr.n_outputs = (size_t)out->n;
  pr.outputs = ptrs;
  pr.version = b->version->number;
  pr.queue_us = (uint64_t)((r->t_dispatch - r->t_recv) / 1000);
  pr.compute_us = (uint64_t)(compute_ns / 1000);
  pr.batch_rows = (uint32_t)b->rows;
  Grove__Reply rep = GROVE__REPLY__INIT;
  rep.protocol = GROVE__PROTOCOL_VERSION__PROTOCOL_VERSION;
  rep.id = r->id;
  rep.body_case = GROVE__REPLY__BODY_PREDICT;
  rep.predict = &pr;
  r->reply = grove__rpc_pack(&rep);
  r->reply_status = GROVE_OK;
}

static void run_batch(srv_worker *w) {
  srv_server *srv = w->srv;
  srv_batch *b = &w->batch;
  srv_model *m = b->model;
  const grove_model *gm = b->version->model;
  char msg[GROVE_ERR_MSG_MAX];

  if (srv->cfg.test_batch_delay_ms > 0) {
    struct timespec ts = {srv->cfg.test_batch_delay_ms / 1000,
                          (long)(srv->cfg.test_batch_delay_ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0) {
    }
  }
  for (srv_req *r = b->reqs; r; r = r->next)
    grove__hist_observe_ns(&m->metrics.queue_lat, r->t_dispatch - r->t_recv);

  grove_arena *a = w->arenas[m->index];
  if (!a && !(a = w->arenas[m->index] = grove_arena_new(gm->arena_bytes))) {
    fail_batch(b, GROVE_E_NOMEM, "out of memory for the worker's scratch");
    return;
  }
  int64_t t0 = grove__now_ns();
  const srv_req *first = b->reqs;
  grove_tensor in[GROVE_MAX_VALUES];
  /* Every request's rows, in order, copied into the arena (64-byte aligned,
   * as the kernels are given everything).  Unbatched (max_batch_size 0),
   * the batch is one request and its inputs go whole, dimension 0 as sent. */
  for (size_t i = 0; i < first->ninputs; i++) {
    const grove_tensor *f = &first->inputs[i];
    size_t row_bytes = grove_tensor_nbytes(f) / (size_t)first->rows;
    unsigned char *p = grove_arena_alloc(a, row_bytes * (size_t)b->rows);
    if (!p) {
      grove_arena_reset(a);
      fail_batch(b, GROVE_E_NOMEM, "out of memory for the batch's inputs");
      return;
    }
    size_t off = 0;
    for (const srv_req *r = b->reqs; r; r = r->next) {
      size_t n = row_bytes * (size_t)r->rows;
      if (n) memcpy(p + off, r->inputs[i].data, n);
      off += n;
    }
    int64_t shape[GROVE_MAX_DIMS];
    memcpy(shape, f->shape, sizeof(int64_t) * (size_t)f->ndim);
    if (!unbatched(b)) shape[0] = b->rows;
    grove_tensor_init(&in[i], f->dtype, f->ndim, shape, p);
  }

  grove_err err = {0};
  grove_values out = {0};
  grove_status s = grove__telemetry_forward(w, b, a, in, first->ninputs, &out, &err);
  /* Outputs are split by rows: each must have the batch as dimension 0 and
   * be contiguous (a view is copied once into the arena). */
  for (int k = 0; !s && k < out.n; k++) {
    grove_tensor *t = &out.v[k];
    if (!unbatched(b) && (t->ndim < 1 || t->shape[0] != b->rows)) {
      char sh[160];
      s = grove_err_set(&err, GROVE_E_INTERNAL,
                        "output %d has shape %s: its dimension 0 is not the batch of %" PRId64
                        " rows, so groved cannot split it per request",
                        k, grove_shape_str(t->ndim, t->shape, sh, sizeof sh), b->rows);
      break;
    }
    if (!grove_tensor_is_contiguous(t)) {
      grove_tensor c;
      void *p = grove_arena_alloc(a, grove_tensor_nbytes(t));
      if (!p) {
        s = grove_err_set(&err, GROVE_E_NOMEM, "out of memory for output %d", k);
        break;
      }
      grove_tensor_init(&c, t->dtype, t->ndim, t->shape, p);
      if ((s = grove_tensor_copy(&c, t, &err))) break;
      *t = c;
    }
  }
  int64_t compute_ns = grove__now_ns() - t0;
  grove__hist_observe_ns(&m->metrics.compute_lat, compute_ns);
  if (!s) {
    /* The tests' --test-batch-delay-ms stands for a slow forward, so it
     * counts here (batcher.c's hold is bounded by these); run_here never
     * runs a batch on the loop with it set. */
    int64_t ns = compute_ns + (int64_t)srv->cfg.test_batch_delay_ms * 1000000;
    mean8(&m->batch_ns, ns);
    if (b->nreqs == 1) mean8(&m->lone_ns, ns);
  }
  grove__hist_observe_rows(&m->metrics.batch_size, b->rows);

  if (s) {
    snprintf(msg, sizeof msg, "forward failed: %s", grove_err_msg(&err));
    grove__slog(GROVE_LOG_ERROR, "batch.forward_failed", "model %s: %s", m->name, msg);
    fail_batch(b, s, msg);
  } else {
    /* NNG's requests get their replies encoded and chained; another
     * protocol's (srv_req.origin) take their rows here, from the arena. */
    answering(b);
    int64_t row0 = 0;
    srv_req *nng = NULL, **tail = &nng;
    for (srv_req *r = b->reqs, *next; r; r = next) {
      next = r->next;
      int64_t rows = r->rows; /* r is its origin's once handed over */
      if (r->origin) {
        r->origin->outputs(r, b, &out, row0, compute_ns);
      } else {
        encode_rows(r, b, &out, row0, compute_ns);
        *tail = r;
        tail = &r->next;
      }
      row0 += rows;
    }
    *tail = NULL;
    b->reqs = NULL;
    grove__rpc_send_chain(nng);
  }
  grove_arena_reset(a);
}

static void *worker_main(void *arg) {
  srv_worker *w = arg;
  char name[16];
  snprintf(name, sizeof name, "groved-w%d", w->id);
  pthread_setname_np(pthread_self(), name);
  for (;;) {
    pthread_mutex_lock(&w->mu);
    while (!w->assigned && !w->stop) pthread_cond_wait(&w->cv, &w->mu);
    bool run = w->assigned;
    pthread_mutex_unlock(&w->mu);
    if (!run) break;
    /* The batch's replies (sp.c's outbox) and this worker's return wake
     * the loop once, together, at the release below: apart, the loop woke
     * for the replies and again for the worker. */
    grove__wakers_hold();
    run_batch(w);
    /* The batch's version reference goes back to the loop with the worker
     * (batcher.c): when it is the last one, freeing the version must not
     * delay this worker's next batch. */
    grove__telemetry_release(w->batch.hooks);
    w->batch.hooks = NULL;
    pthread_mutex_lock(&w->mu);
    w->assigned = false;
    pthread_mutex_unlock(&w->mu);
    grove__inbox_push_done(w->srv, w);
    grove__wakers_release();
  }
  return NULL;
}

void grove__worker_run_here(srv_worker *w) {
  run_batch(w);
  grove__telemetry_release(w->batch.hooks);
  w->batch.hooks = NULL;
}

void grove__worker_assign(srv_worker *w) {
  pthread_mutex_lock(&w->mu);
  w->assigned = true;
  pthread_mutex_unlock(&w->mu);
  /* Signalled after the unlock: a worker woken while the loop still held
   * mu went straight back to sleep on it, and the loop's unlock had to wake
   * it a second time (perf: a fifth of the loop's time in the futex wake).
   * The worker re-checks assigned under mu, so nothing is missed. */
  pthread_cond_signal(&w->cv);
}

/* Scratch for one batch of m at max_batch_size: the forward's (measured by
 * grove_model_open) plus the concatenated inputs (a free dimension counted
 * as 1; a longer input grows the arena once). */
static size_t arena_size(const grove_model *m) {
  size_t n = m->arena_bytes;
  for (size_t i = 0; i < m->ninputs; i++) {
    const grove_io_spec *sp = &m->inputs[i];
    /* Unbatched: one request, its dimension 0 counted as 1 like a free one. */
    size_t rows = m->batching.max_batch_size ? (size_t)m->batching.max_batch_size : 1;
    size_t b = grove_dtype_size(sp->dtype) * rows;
    for (int d = 1; d < sp->ndim; d++) b *= sp->shape[d] > 0 ? (size_t)sp->shape[d] : 1;
    n += (b + 63) & ~(size_t)63;
  }
  return n;
}

grove_status grove__workers_start(srv_server *srv, grove_err *err) {
  int n = srv->workers;
  srv->worker_array = calloc((size_t)n, sizeof *srv->worker_array);
  if (!srv->worker_array) return grove_err_set(err, GROVE_E_NOMEM, "out of memory");
  for (int i = 0; i < n; i++) {
    srv_worker *w = &srv->worker_array[i];
    w->srv = srv;
    w->id = i;
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    w->arenas = calloc(srv->nmodels ? srv->nmodels : 1, sizeof *w->arenas);
    if (!w->arenas) return grove_err_set(err, GROVE_E_NOMEM, "out of memory");
    for (size_t k = 0; k < srv->nmodels; k++) {
      srv_version *v = srv->models[k].current;
      if (!v) continue;
      size_t sz = arena_size(v->model);
      if (!(w->arenas[k] = grove_arena_new(sz)))
        return grove_err_set(err, GROVE_E_NOMEM,
                             "out of memory for %zu bytes of scratch for "
                             "model %s",
                             sz, srv->models[k].name);
    }
    int rv = pthread_create(&w->thread, NULL, worker_main, w);
    if (rv)
      return grove_err_set(err, GROVE_E_INTERNAL, "cannot start a worker thread: %s", strerror(rv));
    w->started = true;
    w->next = srv->idle;
    srv->idle = w;
    srv->nidle++;
  }
  return GROVE_OK;
}

void grove__workers_stop(srv_server *srv) {
  if (!srv->worker_array) return;
  for (int i = 0; i < srv->workers; i++) {
    srv_worker *w = &srv->worker_array[i];
    if (!w->started) continue;
    pthread_mutex_lock(&w->mu);
    w->stop = true;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
  }
  for (int i = 0; i < srv->workers; i++) {
    srv_worker *w = &srv->worker_array[i];
    if (w->started) pthread_join(w->thread, NULL);
    w->started = false;
  }
}

/* Frees what workers_start made (after workers_stop). */
void grove__workers_free(srv_server *srv) {
  if (!srv->worker_array) return;
  for (int i = 0; i < srv->workers; i++) {
    srv_worker *w = &srv->worker_array[i];
    if (w->arenas)
      for (size_t k = 0; k < srv->nmodels; k++) grove_arena_free(w->arenas[k]);
    free(w->arenas);
    grove__version_release(w->batch.version);
    grove__telemetry_release(w->batch.hooks);
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
  }
  free(srv->worker_array);
  srv->worker_array = NULL;
}
