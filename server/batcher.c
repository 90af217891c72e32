/* batcher.c: the libuv loop's side of groved.
 *
 * The loop thread owns every model's queue and the list of idle workers.
 * Two kinds of event reach it through the inbox (loop.c): a validated
 * predict to queue, and a worker that finished its batch; lifecycle.c's
 * wake-up hands them to grove__batcher_take_inbox.  After each, schedule()
 * hands batches to idle workers.
 *
 * The dispatch rule: whenever a worker is idle and a model has requests
 * queued, the worker takes them at once (models taken round-robin), up to
 * batching.max_batch_size rows.  Nothing waits on a timer while a worker
 * is idle: waiting for a batch to fill only paid when one core computed at
 * a time; with a worker per core, a second batch started at once keeps the
 * other core busy, and the requests that arrive meanwhile accumulate for
 * the next worker to come back (docs/performance.md, "An idle worker takes
 * what is queued").  Batches grow by themselves under load: while every
 * worker is busy, requests accumulate, and the next free worker takes up
 * to max_batch_size rows of them.  A batch takes whole requests in arrival
 * order whose non-batch dimensions equal the first one's (different shapes
 * cannot be concatenated; they wait for a batch of their own).  A request
 * past its deadline is answered DEADLINE_EXCEEDED instead of being
 * computed.  A model paused by an in-place reload waits (reload.c
 * reschedules).
 *
 * batching.max_queue_delay_us is therefore no timer any more: it is the
 * longest a model lets groved hold a request back on purpose, and the one
 * hold left is the loop's own forward below, which delays a request that
 * arrives meanwhile by at most that forward.
 *
 * A lone request (a batch of one request, nothing else queued, every worker
 * idle) is computed by the loop itself, on an idle worker's arena, when a
 * forward of one request of the model was measured shorter than its
 * max_queue_delay_us: waking a worker and being woken back cost a lone
 * request more than its forward in the VMs we serve on (docs/performance.md,
 * "A lone request on the loop"), and what the loop delays meanwhile (a
 * request arriving during that forward) waits less than the delay the model
 * accepts.  The first forwards, and any longer ones, go to workers. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server.h"

/* ------------------------------------------------------------ queues */

static void set_depth(srv_model *m) {
  atomic_store(&m->queue_depth, (uint64_t)m->queued);
}

static void enqueue(srv_server *srv, srv_req *r) {
  srv_model *m = r->model;
  srv_version *v = m->current;
  if (!v) { /* cannot happen before reloads exist; answer rather than assert */
    grove__rpc_reply_error(r, GROVE_E_UNAVAILABLE, "model '%s' is not loaded", m->name);
    return;
  }
  const grove_batching *bc = &v->model->batching;
  if ((int64_t)m->queued >= bc->max_queue_size) {
    grove__rpc_reply_error(r, GROVE_E_RESOURCE_EXHAUSTED,
                           "model '%s': queue full (%zu requests waiting, "
                           "batching.max_queue_size %" PRId64 "); retry later",
                           m->name, m->queued, bc->max_queue_size);
    return;
  }
  r->next = NULL;
  if (m->tail)
    m->tail->next = r;
  else
    m->head = r;
  m->tail = r;
  m->queued++;
  m->queued_rows += r->rows;
  set_depth(m);
  (void)srv;
}

static bool same_tail(const srv_req *a, const srv_req *b) {
  for (size_t i = 0; i < a->ninputs; i++) {
    const grove_tensor *x = &a->inputs[i], *y = &b->inputs[i];
    if (x->ndim != y->ndim) return false;
    for (int d = 1; d < x->ndim; d++)
      if (x->shape[d] != y->shape[d]) return false;
  }
  return true;
}

/* Forms a batch of m for worker w from the head of m's queue.  Returns false
 * when nothing was left to run (every candidate had expired). */
static bool form_batch(srv_server *srv, srv_model *m, srv_worker *w, int64_t now) {
  srv_version *v = m->current;
  /* Unbatched (max_batch_size 0): every request is a batch of one. */
  int64_t max_rows = v->model->batching.max_batch_size ? v->model->batching.max_batch_size : 1;
  srv_batch *b = &w->batch;
  *b = (srv_batch){.model = m};
  srv_req *btail = NULL, *first = NULL, *prev = NULL, *r = m->head;
  while (r) {
    srv_req *next = r->next;
    bool expired = r->deadline <= now;
    /* Admitted while an unbatched version served (rows 1, dimension 0 the
     * model's own), now before a batched one: its rows are not known. */
    bool stale = v->model->batching.max_batch_size > 0 && r->ninputs > 0 &&
                 r->inputs[0].ndim > 0 && r->inputs[0].shape[0] != r->rows;
    bool fits = !first || (same_tail(first, r) && b->rows + r->rows <= max_rows);
    if (!expired && !stale && !fits) {
      if (first && same_tail(first, r)) break; /* full: keep arrival order */
      prev = r;                                /* another shape: it waits for a batch of its own */
      r = next;
      continue;
    }
    /* unlink r */
    if (prev)
      prev->next = next;
    else
      m->head = next;
    if (m->tail == r) m->tail = prev;
    m->queued--;
    m->queued_rows -= r->rows;
    r->next = NULL;
    if (stale) {
      grove__rpc_reply_error(r, GROVE_E_UNAVAILABLE,
                             "model '%s': a reload changed how the model batches while the "
                             "request was queued; send it again",
                             m->name);
    } else if (expired) {
      grove__rpc_reply_error(r, GROVE_E_DEADLINE_EXCEEDED,
                             "model '%s': the request waited %.3f ms in the queue, past its "
                             "timeout; it was not computed",
                             m->name, (double)(now - r->t_recv) / 1e6);
    } else {
      if (btail)
        btail->next = r;
      else
        b->reqs = r;
      btail = r;
      if (!first) first = r;
      b->nreqs++;
      b->rows += r->rows;
      r->t_dispatch = now;
      if (b->rows >= max_rows) break;
    }
    r = next;
  }
  set_depth(m);
  if (b->nreqs == 0) return false;
  grove__version_retain(v);
  b->version = v;
  b->hooks = grove__telemetry_acquire(srv, m);
  m->running++;
  (void)srv;
  return true;
}

/* A worker back from its batch (the inbox's, or the loop's own run):
 * idle again, the batch's version reference dropped off the loop. */
static void worker_back(srv_server *srv, srv_worker *w) {
  w->batch.model->running--;
  grove__version_release_off_loop(srv, w->batch.version);
  w->batch = (srv_batch){0};
  w->next = srv->idle;
  srv->idle = w;
  srv->nidle++;
}

/* Whether the loop runs w's batch itself (see the top of the file): one
 * request, nothing else queued anywhere, every other worker idle, and a
 * forward of one request measured shorter than the model's batch delay. */
static bool run_here(srv_server *srv, const srv_worker *w) {
  const srv_batch *b = &w->batch;
  if (b->nreqs != 1 || srv->nidle + 1 != (size_t)srv->workers || srv->cfg.test_batch_delay_ms > 0)
    return false;
  for (size_t i = 0; i < srv->nmodels; i++)
    if (srv->models[i].head) return false;
  int64_t est = atomic_load_explicit(&b->model->lone_ns, memory_order_relaxed);
  return est > 0 && est <= b->version->model->batching.max_queue_delay_us * 1000;
}

static void schedule(srv_server *srv) {
  int64_t now = grove__now_ns();
  while (srv->idle) {
    srv_model *pick = NULL;
    for (size_t k = 0; k < srv->nmodels; k++) {
      size_t i = (srv->rr + k) % srv->nmodels;
      srv_model *m = &srv->models[i];
      if (!m->head || !m->current || m->paused) continue; /* paused: an in-place reload */
      pick = m;
      srv->rr = i + 1;
      break;
    }
    if (!pick) break;
    srv_worker *w = srv->idle;
    if (form_batch(srv, pick, w, now)) {
      srv->idle = w->next;
      srv->nidle--;
      w->next = NULL;
      if (run_here(srv, w)) {
        grove__worker_run_here(w);
        worker_back(srv, w);
      } else {
        grove__worker_assign(w);
      }
    }
    now = grove__now_ns();
  }
}

/* ------------------------------------------------------------ the loop's side */

void grove__batcher_take_inbox(srv_server *srv) {
  srv_req *reqs;
  srv_worker *done;
  grove__inbox_take(srv, &reqs, &done);
  while (done) {
    srv_worker *w = done;
    done = w->next;
    worker_back(srv, w);
  }
  while (reqs) {
    srv_req *r = reqs;
    reqs = r->next;
    enqueue(srv, r);
  }
}

void grove__batcher_schedule(srv_server *srv) {
  schedule(srv);
}

bool grove__batcher_idle(srv_server *srv) {
  for (size_t i = 0; i < srv->nmodels; i++)
    if (srv->models[i].head || srv->models[i].running) return false;
  return srv->nidle == (size_t)srv->workers;
}

size_t grove__batcher_fail_queued(srv_server *srv, int drain_timeout_ms) {
  size_t n = 0;
  for (size_t i = 0; i < srv->nmodels; i++) {
    srv_model *m = &srv->models[i];
    srv_req *r = m->head;
    m->head = m->tail = NULL;
    m->queued = 0;
    m->queued_rows = 0;
    set_depth(m);
    while (r) {
      srv_req *next = r->next;
      r->next = NULL;
      grove__rpc_reply_error(r, GROVE_E_UNAVAILABLE,
                             "model '%s': groved is shutting down and its drain timed out "
                             "(--drain-timeout %d s) before this request was computed; send it "
                             "to another replica",
                             m->name, drain_timeout_ms / 1000);
      n++;
      r = next;
    }
  }
  return n;
}
