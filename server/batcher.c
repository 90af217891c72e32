/* batcher.c: the libuv loop's side of groved.
 *
 * The loop thread owns every model's queue and the list of idle workers.
 * Two kinds of event reach it through the inbox (loop.c): a validated
 * predict to queue, and a worker that finished its batch; lifecycle.c's
 * wake-up hands them to grove__batcher_take_inbox.  After each, and when the
 * hold timer fires, schedule() hands batches to idle workers.
 *
 * The dispatch rule: an idle worker takes a model's queue (models taken
 * round-robin, up to batching.max_batch_size rows) once it holds the rows
 * the model's clients can be expected to add to one batch, or once its
 * oldest request has been held long enough.  The rows expected are the
 * model's share of one worker of what its clients keep in flight: the most
 * rows seen in groved at once (queued plus running) over the last
 * BATCH_PEAK_WINDOW_NS, divided by the workers, and never more than what is
 * not running already.  With one client that is one row, so a lone request
 * goes at once; with 32 clients and one worker it is 32, so a worker back
 * from its batch waits for the rows it just answered to come back rather
 * than starting a batch of the few that arrived meanwhile (measured:
 * batches of about 16 where 32 were in reach, docs/performance.md, "One
 * worker over every core, and the batch hold").  A worker takes no more
 * than that share.  The hold is at most the model's
 * batching.max_queue_delay_us, at most one forward of a lone request (the
 * time a batch started too small costs anyway, so waiting longer cannot
 * pay) and at most one forward of a batch; a hold under HOLD_MIN_NS is not
 * held.  While every worker is busy requests accumulate, and the
 * next free worker takes its share of them.  A batch takes whole
 * requests in arrival order whose non-batch dimensions equal the first
 * one's (different shapes cannot be concatenated; they wait for a batch of
 * their own).  A request past its deadline is answered DEADLINE_EXCEEDED
 * instead of being computed.  A model paused by an in-place reload waits
 * (reload.c reschedules).  A draining server holds nothing.
 *
 * A lone request (a batch of one request, nothing else queued, every worker
 * idle) is computed by the loop itself, on an idle worker's arena, when a
 * forward of one request of the model was measured shorter than its
 * max_queue_delay_us: waking a worker and being woken back cost a lone
 * request more than its forward in the VMs we serve on (docs/performance.md,
 * "A lone request on the loop"), and what the loop delays meanwhile (a
 * request arriving during that forward) waits less than the delay the model
 * accepts.  The first forwards, and any longer ones, go to workers.
 *
 * The hold timer is a timerfd polled by the loop, because libuv's timers
 * count in milliseconds and the holds are microseconds. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include "server.h"

/* How long a peak of rows in flight is remembered at least: long against a
 * batch cycle (a millisecond or so), short against a change of load. */
#define BATCH_PEAK_WINDOW_NS (50 * 1000000LL)

/* Shorter holds are not held at all: a timer's wake-up in the VMs groved
 * runs on comes tens of microseconds late, so a model whose forward is that
 * short lost more to the timer than batching gained (a 100 KB MLP at 32
 * clients: 160k samples/s with holds of 10 us, 190-207k without). */
#define HOLD_MIN_NS (50 * 1000LL)

/* ------------------------------------------------------------ timer */

static void arm_timer(srv_server *srv, int64_t at) {
  if (at == srv->hold_at) return;
  struct itimerspec its = {0};
  if (at > 0) {
    its.it_value.tv_sec = at / 1000000000;
    its.it_value.tv_nsec = at % 1000000000;
    if (its.it_value.tv_sec == 0 && its.it_value.tv_nsec == 0) its.it_value.tv_nsec = 1;
  }
  if (timerfd_settime(srv->hold_fd, TFD_TIMER_ABSTIME, &its, NULL) != 0)
    grove__slog(GROVE_LOG_ERROR, "batch.timer", "timerfd_settime: %s", strerror(errno));
  srv->hold_at = at;
}

/* ------------------------------------------------------------ queues */

/* Starts a new peak window when the current one is over (a window with no
 * request at all leaves nothing to remember).  A window is
 * BATCH_PEAK_WINDOW_NS, or four batches of a slower model. */
static void roll_peak(srv_model *m, int64_t now) {
  int64_t window = 4 * atomic_load_explicit(&m->batch_ns, memory_order_relaxed);
  if (window < BATCH_PEAK_WINDOW_NS) window = BATCH_PEAK_WINDOW_NS;
  int64_t age = now - m->peak_window_start;
  if (age <= window) return;
  m->peak_rows_prev = age <= 2 * window ? m->peak_rows : 0;
  m->peak_rows = 0;
  m->peak_window_start = now;
}

static void note_peak(srv_model *m, int64_t now) {
  roll_peak(m, now);
  int64_t in = m->queued_rows + atomic_load(&m->running_rows);
  if (in > m->peak_rows) m->peak_rows = in;
}

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
  note_peak(m, grove__now_ns());
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

/* Forms a batch of m for worker w from the head of m's queue, of at most
 * take rows (a larger first request goes alone).  Returns false
 * when nothing was left to run (every candidate had expired). */
static bool form_batch(srv_server *srv, srv_model *m, srv_worker *w, int64_t take, int64_t now) {
  srv_version *v = m->current;
  /* Unbatched (max_batch_size 0): every request is a batch of one. */
  int64_t max_rows = take > 0 ? take : 1;
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
  atomic_fetch_add(&m->running_rows, b->rows);
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
  w->idle_since = grove__now_ns();
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

/* Whether an idle worker takes m's queue now (the rule at the top of the
 * file), and then at most how many rows (*take); when not, *due is when the
 * hold ends. */
static bool ready(srv_server *srv, srv_model *m, int64_t now, int64_t idle_since, int64_t *take,
                  int64_t *due) {
  const grove_batching *bc = &m->current->model->batching;
  *take = bc->max_batch_size;
  if (bc->max_batch_size == 0 || atomic_load(&srv->draining)) return true; /* unbatched */
  roll_peak(m, now);
  int64_t peak = m->peak_rows > m->peak_rows_prev ? m->peak_rows : m->peak_rows_prev;
  /* One worker's share of what is in flight; a worker takes no more, so
   * that the next idle one gets a batch as large rather than the rest. */
  int64_t share = (peak + srv->workers - 1) / srv->workers;
  if (share >= 1 && share < *take) *take = share;
  int64_t want = share;
  int64_t running = atomic_load(&m->running_rows);
  if (want > peak - running) want = peak - running;
  if (m->queued_rows >= want || m->queued_rows >= *take) return true;
  int64_t hold = bc->max_queue_delay_us * 1000;
  /* No longer than a forward: of a lone request (what a batch started too
   * small costs anyway), nor of a batch (time enough to have run one). */
  int64_t lone = atomic_load_explicit(&m->lone_ns, memory_order_relaxed);
  int64_t batch = atomic_load_explicit(&m->batch_ns, memory_order_relaxed);
  if (lone > 0 && lone < hold) hold = lone;
  if (batch > 0 && batch < hold) hold = batch;
  if (hold < HOLD_MIN_NS) return true;
  if (m->head->deadline - hold <= now) return true; /* it cannot afford the hold */
  /* Held from when the request arrived or a worker became idle to take it,
   * whichever is later: the time a request waited for a busy worker was
   * not held on purpose, and it is the idle worker's time that a hold
   * spends. */
  int64_t from = m->head->t_recv;
  if (idle_since > from) from = idle_since;
  *due = from + hold;
  return now >= *due;
}

static void schedule(srv_server *srv) {
  int64_t now = grove__now_ns(), next_at = 0;
  while (srv->idle) {
    srv_model *pick = NULL;
    int64_t take = 0;
    next_at = 0;
    int64_t idle_since = INT64_MAX; /* the longest-idle worker's */
    for (const srv_worker *w = srv->idle; w; w = w->next)
      if (w->idle_since < idle_since) idle_since = w->idle_since;
    for (size_t k = 0; k < srv->nmodels; k++) {
      size_t i = (srv->rr + k) % srv->nmodels;
      srv_model *m = &srv->models[i];
      if (!m->head || !m->current || m->paused) continue; /* paused: an in-place reload */
      int64_t due = 0;
      if (ready(srv, m, now, idle_since, &take, &due)) {
        pick = m;
        srv->rr = i + 1;
        break;
      }
      if (!next_at || due < next_at) next_at = due;
    }
    if (!pick) break;
    srv_worker *w = srv->idle;
    if (form_batch(srv, pick, w, take, now)) {
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
  /* The hold only matters while a worker could take what it waits for; a
   * worker coming back reschedules anyway. */
  arm_timer(srv, srv->idle ? next_at : 0);
}

static void on_timer(uv_poll_t *h, int status, int events) {
  srv_server *srv = h->data;
  uint64_t ticks;
  while (read(srv->hold_fd, &ticks, sizeof ticks) > 0) {
  }
  srv->hold_at = 0;
  if (!srv->stopped) schedule(srv);
}

static void on_closed(uv_handle_t *h) {
  (void)h;
}

grove_status grove__batcher_init(srv_server *srv, grove_err *err) {
  int rv;
  srv->hold_fd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
  if (srv->hold_fd < 0)
    return grove_err_set(err, GROVE_E_INTERNAL, "timerfd_create: %s", strerror(errno));
  srv->hold_poll.data = srv;
  if ((rv = uv_poll_init(&srv->loop, &srv->hold_poll, srv->hold_fd)) ||
      (rv = uv_poll_start(&srv->hold_poll, UV_READABLE, on_timer)))
    return grove_err_set(err, GROVE_E_INTERNAL, "uv_poll: %s", uv_strerror(rv));
  return GROVE_OK;
}

void grove__batcher_stop(srv_server *srv) {
  uv_close((uv_handle_t *)&srv->hold_poll, on_closed);
}

void grove__batcher_close(srv_server *srv) {
  if (srv->hold_fd >= 0) close(srv->hold_fd);
  srv->hold_fd = -1;
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
