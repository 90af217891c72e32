/* batcher.c: the libuv loop's side of groved.
 *
 * The loop thread owns every model's queue and the list of idle workers.
 * Two kinds of event reach it through the inbox (a mutex-guarded list that
 * NNG threads and workers append to, then uv_async_send): a validated
 * predict to queue, and a worker that finished its batch.  After each, and
 * when the batch timer fires, schedule() hands batches to idle workers.
 *
 * When a batch is dispatched (per model, models taken round-robin):
 *   - its queued rows reach batching.max_batch_size, or
 *   - its oldest request has waited batching.max_queue_delay_us, or
 *   - no batch of the model is running at all: waiting only pays while
 *     another batch computes (clients are active and more requests are on
 *     their way); an idle model answers a lone request at once, so a single
 *     client never pays the delay, or
 *   - the server is draining.
 * and only while a worker is idle: while every worker is busy, requests
 * accumulate and the next free worker takes up to max_batch_size rows of
 * them.  A batch takes whole requests in arrival order whose non-batch
 * dimensions equal the first one's (different shapes cannot be
 * concatenated; they wait for a batch of their own).  A request past its
 * deadline is answered DEADLINE_EXCEEDED instead of being computed.
 *
 * The delay timer is a timerfd polled by the loop, because libuv's timers
 * count in milliseconds and the delays are microseconds. */
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include "server.h"

/* ------------------------------------------------------------ inbox */

void grove__loop_wake(srv_server *srv) {
  uv_async_send(&srv->async);
}

void grove__inbox_push_req(srv_server *srv, srv_req *r) {
  r->next = NULL;
  pthread_mutex_lock(&srv->inbox_mu);
  if (srv->inbox_tail)
    srv->inbox_tail->next = r;
  else
    srv->inbox_head = r;
  srv->inbox_tail = r;
  pthread_mutex_unlock(&srv->inbox_mu);
  uv_async_send(&srv->async);
}

void grove__inbox_push_done(srv_server *srv, srv_worker *w) {
  pthread_mutex_lock(&srv->inbox_mu);
  w->next = srv->done_head;
  srv->done_head = w;
  pthread_mutex_unlock(&srv->inbox_mu);
  uv_async_send(&srv->async);
}

/* ------------------------------------------------------------ timer */

static void arm_timer(srv_server *srv, int64_t at) {
  if (at == srv->timer_at) return;
  struct itimerspec its = {0};
  if (at > 0) {
    its.it_value.tv_sec = at / 1000000000;
    its.it_value.tv_nsec = at % 1000000000;
    if (its.it_value.tv_sec == 0 && its.it_value.tv_nsec == 0) its.it_value.tv_nsec = 1;
  }
  if (timerfd_settime(srv->timer_fd, TFD_TIMER_ABSTIME, &its, NULL) != 0)
    grove__slog(GROVE_LOG_ERROR, "batch.timer", "timerfd_settime: %s", strerror(errno));
  srv->timer_at = at;
}

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
  int64_t max_rows = v->model->batching.max_batch_size;
  srv_batch *b = &w->batch;
  *b = (srv_batch){.model = m};
  srv_req *btail = NULL, *first = NULL, *prev = NULL, *r = m->head;
  while (r) {
    srv_req *next = r->next;
    bool expired = r->deadline <= now;
    bool fits = !first || (same_tail(first, r) && b->rows + r->rows <= max_rows);
    if (!expired && !fits) {
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
    if (expired) {
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

static void schedule(srv_server *srv) {
  int64_t now = grove__now_ns();
  bool draining = atomic_load(&srv->draining);
  int64_t next_at = 0;
  while (srv->idle) {
    srv_model *pick = NULL;
    next_at = 0;
    for (size_t k = 0; k < srv->nmodels; k++) {
      size_t i = (srv->rr + k) % srv->nmodels;
      srv_model *m = &srv->models[i];
      if (!m->head || !m->current || m->paused) continue; /* paused: an in-place reload */
      const grove_batching *bc = &m->current->model->batching;
      int64_t due = m->head->t_recv + bc->max_queue_delay_us * 1000;
      if (draining || m->queued_rows >= bc->max_batch_size || m->running == 0 || now >= due) {
        pick = m;
        srv->rr = i + 1;
        break;
      }
      if (!next_at || due < next_at) next_at = due;
    }
    if (!pick) break;
    srv_worker *w = srv->idle;
    if (form_batch(srv, pick, w, now)) {
      srv->idle = w->next;
      srv->nidle--;
      w->next = NULL;
      grove__worker_assign(w);
    }
    now = grove__now_ns();
  }
  /* The timer only matters while a worker could take the batch it waits
   * for; a worker coming back reschedules anyway. */
  arm_timer(srv, srv->idle ? next_at : 0);
}

/* ------------------------------------------------------------ drain */

static void on_closed(uv_handle_t *h) {
  (void)h;
}

/* Everything answered and sent: stop NNG, then close the loop's handles so
 * that uv_run returns. */
static void shut_down(srv_server *srv) {
  grove__workers_stop(srv);
  /* Training threads may still be answering through NNG: join them before
   * the sockets and their contexts go. */
  grove__training_stop(srv);
  grove__rpc_stop(srv);
  grove__reload_close(srv);
  grove__export_close(srv);
  uv_close((uv_handle_t *)&srv->async, on_closed);
  uv_close((uv_handle_t *)&srv->sig_term, on_closed);
  uv_close((uv_handle_t *)&srv->sig_int, on_closed);
  uv_close((uv_handle_t *)&srv->sig_hup, on_closed);
  uv_close((uv_handle_t *)&srv->timer_poll, on_closed);
  uv_close((uv_handle_t *)&srv->drain_timer, on_closed);
}

static bool quiescent(srv_server *srv) {
  for (size_t i = 0; i < srv->nmodels; i++)
    if (srv->models[i].head || srv->models[i].running) return false;
  return atomic_load(&srv->inflight) == 0 && atomic_load(&srv->sending) == 0 &&
         srv->nidle == (size_t)srv->workers && grove__admin_idle(srv);
}

static bool stopped;

static void check_drained(srv_server *srv) {
  if (stopped || !quiescent(srv)) return;
  stopped = true;
  grove__slog(GROVE_LOG_INFO, "server.drained", "every queued request is answered; exiting");
  shut_down(srv);
}

static void on_drain_timeout(uv_timer_t *t) {
  srv_server *srv = t->data;
  if (stopped) return;
  stopped = true;
  grove__slog(GROVE_LOG_ERROR, "server.drain_timeout",
              "still %" PRId64 " requests unanswered and %" PRId64
              " replies unsent after %d ms; "
              "exiting anyway",
              atomic_load(&srv->inflight), atomic_load(&srv->sending), srv->cfg.drain_timeout_ms);
  srv->exit_code = 1;
  shut_down(srv);
}

void grove__batcher_drain(srv_server *srv) {
  if (atomic_exchange(&srv->draining, true)) {
    grove__slog(GROVE_LOG_WARN, "server.drain_again",
                "already draining (%" PRId64 " requests in flight)", atomic_load(&srv->inflight));
    return;
  }
  grove__slog(GROVE_LOG_INFO, "server.drain",
              "draining: %" PRId64 " requests in flight are answered, new ones get UNAVAILABLE",
              atomic_load(&srv->inflight));
  uv_timer_start(&srv->drain_timer, on_drain_timeout, (uint64_t)srv->cfg.drain_timeout_ms, 0);
  schedule(srv);
  check_drained(srv);
}

/* ------------------------------------------------------------ callbacks */

static void on_async(uv_async_t *h) {
  srv_server *srv = h->data;
  pthread_mutex_lock(&srv->inbox_mu);
  srv_req *reqs = srv->inbox_head;
  srv_worker *done = srv->done_head;
  srv->inbox_head = srv->inbox_tail = NULL;
  srv->done_head = NULL;
  pthread_mutex_unlock(&srv->inbox_mu);
  while (done) {
    srv_worker *w = done;
    done = w->next;
    w->batch.model->running--;
    grove__version_release_off_loop(srv, w->batch.version);
    w->batch = (srv_batch){0};
    w->next = srv->idle;
    srv->idle = w;
    srv->nidle++;
  }
  while (reqs) {
    srv_req *r = reqs;
    reqs = r->next;
    enqueue(srv, r);
  }
  if (!stopped) grove__reload_poll(srv); /* an in-place reload waiting for idle workers */
  if (!stopped) schedule(srv);
  if (atomic_load(&srv->draining)) check_drained(srv);
}

static void on_timer(uv_poll_t *h, int status, int events) {
  srv_server *srv = h->data;
  uint64_t ticks;
  while (read(srv->timer_fd, &ticks, sizeof ticks) > 0) {
  }
  srv->timer_at = 0;
  if (!stopped) schedule(srv);
}

static void on_signal(uv_signal_t *h, int signum) {
  srv_server *srv = h->data;
  if (signum == SIGHUP) {
    grove__reload_all(srv, "SIGHUP");
    return;
  }
  grove__slog(GROVE_LOG_INFO, "server.signal", "%s received",
              signum == SIGTERM ? "SIGTERM" : "SIGINT");
  grove__batcher_drain(srv);
}

grove_status grove__batcher_init(srv_server *srv, grove_err *err) {
  int rv;
  srv->timer_fd = -1;
  if ((rv = uv_loop_init(&srv->loop)))
    return grove_err_set(err, GROVE_E_INTERNAL, "uv_loop_init: %s", uv_strerror(rv));
  srv->loop_started = true;
  pthread_mutex_init(&srv->inbox_mu, NULL);
  srv->async.data = srv;
  if ((rv = uv_async_init(&srv->loop, &srv->async, on_async)))
    return grove_err_set(err, GROVE_E_INTERNAL, "uv_async_init: %s", uv_strerror(rv));
  srv->timer_fd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
  if (srv->timer_fd < 0)
    return grove_err_set(err, GROVE_E_INTERNAL, "timerfd_create: %s", strerror(errno));
  srv->timer_poll.data = srv;
  if ((rv = uv_poll_init(&srv->loop, &srv->timer_poll, srv->timer_fd)) ||
      (rv = uv_poll_start(&srv->timer_poll, UV_READABLE, on_timer)))
    return grove_err_set(err, GROVE_E_INTERNAL, "uv_poll: %s", uv_strerror(rv));
  uv_timer_init(&srv->loop, &srv->drain_timer);
  srv->drain_timer.data = srv;
  uv_signal_t *sigs[] = {&srv->sig_term, &srv->sig_int, &srv->sig_hup};
  int nums[] = {SIGTERM, SIGINT, SIGHUP};
  for (int i = 0; i < 3; i++) {
    uv_signal_init(&srv->loop, sigs[i]);
    sigs[i]->data = srv;
    if ((rv = uv_signal_start(sigs[i], on_signal, nums[i])))
      return grove_err_set(err, GROVE_E_INTERNAL, "uv_signal_start: %s", uv_strerror(rv));
  }
  return GROVE_OK;
}

static void close_walk(uv_handle_t *h, void *arg) {
  (void)arg;
  if (!uv_is_closing(h)) uv_close(h, on_closed);
}

void grove__batcher_close(srv_server *srv) {
  if (srv->loop_started) {
    /* After a failed start the handles are still open: close and let them
     * finish, so that uv_loop_close succeeds. */
    uv_walk(&srv->loop, close_walk, NULL);
    uv_run(&srv->loop, UV_RUN_DEFAULT);
    uv_loop_close(&srv->loop);
    pthread_mutex_destroy(&srv->inbox_mu);
    srv->loop_started = false;
  }
  if (srv->timer_fd >= 0) close(srv->timer_fd);
  srv->timer_fd = -1;
}
