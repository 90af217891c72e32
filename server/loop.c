/* loop.c: the libuv loop and its inbox.
 *
 * NNG's threads (a validated predict) and workers (a finished batch) hand
 * work to the loop thread through the inbox: a mutex-guarded list they
 * append to, then a wake-up (srv_waker: an eventfd the loop polls).  The
 * loop's own predicts (sp.c reads the data plane on the loop) wake
 * nothing: a uv_check takes them once per iteration, after every readable
 * connection was read.  On the loop, the callback lifecycle.c
 * registered at start takes what came (grove__inbox_take) and decides what
 * to do with it; this file calls nothing above it.
 *
 * Layer: the loop's (docs/architecture.md, "server/"), below the models and
 * the features, above rpc.c/metrics.c/slog.c. */
#include <errno.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "server.h"

/* ------------------------------------------------------------ wakers */

/* Every waker shares the loop's one eventfd: a worker's batch (its replies
 * in sp.c's outbox, itself in the inbox) costs one write and one wake-up.
 * With a descriptor each, the loop, woken by the first write, preempted the
 * worker before its second and slept and woke again: two more context
 * switches per lone request. */
static void wakers_io(uv_poll_t *h, int status, int events) {
  (void)status;
  (void)events;
  srv_server *srv = h->data;
  uint64_t v;
  while (read(srv->wake_fd, &v, sizeof v) < 0 && errno == EINTR) {
  }
  /* Cleared before the wakers are looked at: a sender that finds it set
   * marked its waker before this store, so its callback runs below; one
   * that finds it clear writes again (at worst a wake-up that finds
   * nothing). */
  atomic_store(&srv->wake_armed, false);
  for (size_t i = 0; i < srv->nwakers; i++) {
    srv_waker *w = srv->wakers[i];
    if (w && atomic_exchange(&w->armed, false)) w->cb(w);
  }
}

static grove_status wakers_init(srv_server *srv, grove_err *err) {
  atomic_init(&srv->wake_armed, false);
  srv->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (srv->wake_fd < 0) return grove_err_set(err, GROVE_E_INTERNAL, "eventfd: %s", strerror(errno));
  srv->wake_poll.data = srv;
  int rv;
  if ((rv = uv_poll_init(&srv->loop, &srv->wake_poll, srv->wake_fd)) ||
      (rv = uv_poll_start(&srv->wake_poll, UV_READABLE, wakers_io)))
    return grove_err_set(err, GROVE_E_INTERNAL, "uv_poll: %s", uv_strerror(rv));
  return GROVE_OK;
}

grove_status grove__waker_init(srv_server *srv, srv_waker *w, void (*cb)(srv_waker *), void *data,
                               grove_err *err) {
  if (srv->nwakers == sizeof srv->wakers / sizeof srv->wakers[0])
    return grove_err_set(err, GROVE_E_INTERNAL, "too many wakers of the loop");
  w->cb = cb;
  w->data = data;
  w->srv = srv;
  atomic_init(&w->armed, false);
  srv->wakers[srv->nwakers++] = w;
  return GROVE_OK;
}

static void write_fd(srv_server *srv) {
  uint64_t one = 1;
  while (write(srv->wake_fd, &one, sizeof one) < 0 && errno == EINTR) {
  }
}

/* The loop a holding thread has yet to write to (a worker's batch). */
static _Thread_local bool held;
static _Thread_local srv_server *held_srv;

void grove__waker_send(srv_waker *w) {
  if (atomic_exchange(&w->armed, true)) return; /* its callback is due */
  srv_server *srv = w->srv;
  if (atomic_exchange(&srv->wake_armed, true)) return; /* a write is on its way or unread */
  if (held) {
    held_srv = srv;
    return;
  }
  write_fd(srv);
}

void grove__wakers_hold(void) {
  held = true;
}

void grove__wakers_release(void) {
  held = false;
  if (held_srv) write_fd(held_srv);
  held_srv = NULL;
}

void grove__waker_close(srv_waker *w) {
  srv_server *srv = w->srv;
  if (!srv) return;
  for (size_t i = 0; i < srv->nwakers; i++)
    if (srv->wakers[i] == w) srv->wakers[i] = NULL;
}

/* ------------------------------------------------------------ inbox */

void grove__loop_wake(srv_server *srv) {
  grove__waker_send(&srv->wake);
}

void grove__inbox_push_req(srv_server *srv, srv_req *r) {
  r->next = NULL;
  bool own = pthread_equal(pthread_self(), srv->loop_tid);
  pthread_mutex_lock(&srv->inbox_mu);
  if (srv->inbox_tail)
    srv->inbox_tail->next = r;
  else
    srv->inbox_head = r;
  srv->inbox_tail = r;
  pthread_mutex_unlock(&srv->inbox_mu);
  if (own)
    srv->inbox_dirty = true; /* on_check takes it after this iteration's reads */
  else
    grove__waker_send(&srv->wake);
}

void grove__inbox_push_done(srv_server *srv, srv_worker *w) {
  pthread_mutex_lock(&srv->inbox_mu);
  w->next = srv->done_head;
  srv->done_head = w;
  pthread_mutex_unlock(&srv->inbox_mu);
  grove__waker_send(&srv->wake);
}

void grove__inbox_take(srv_server *srv, srv_req **reqs, srv_worker **done) {
  pthread_mutex_lock(&srv->inbox_mu);
  *reqs = srv->inbox_head;
  *done = srv->done_head;
  srv->inbox_head = srv->inbox_tail = NULL;
  srv->done_head = NULL;
  pthread_mutex_unlock(&srv->inbox_mu);
}

static void on_inbox(srv_waker *w) {
  srv_server *srv = w->data;
  srv->inbox_dirty = false;
  srv->on_wake(srv);
}

/* The predicts the loop read itself.  After the I/O callbacks of each
 * iteration (uv_check: every readable connection was read by now), and
 * before the loop blocks (uv_prepare: a push from a timer's callback); in a
 * loop, since taking them may answer requests and so read more (a paused
 * connection resumes). */
static void take_own(srv_server *srv) {
  while (srv->inbox_dirty) {
    srv->inbox_dirty = false;
    srv->on_wake(srv);
  }
}

static void on_check(uv_check_t *h) {
  take_own(h->data);
}

static void on_prepare(uv_prepare_t *h) {
  take_own(h->data);
}

grove_status grove__loop_init(srv_server *srv, void (*on_wake)(srv_server *), grove_err *err) {
  int rv;
  srv->wake_fd = -1;
  if ((rv = uv_loop_init(&srv->loop)))
    return grove_err_set(err, GROVE_E_INTERNAL, "uv_loop_init: %s", uv_strerror(rv));
  srv->loop_started = true;
  pthread_mutex_init(&srv->inbox_mu, NULL);
  srv->on_wake = on_wake;
  srv->loop_tid = pthread_self();
  grove_status s = wakers_init(srv, err);
  if (!s) s = grove__waker_init(srv, &srv->wake, on_inbox, srv, err);
  if (s) return s;
  srv->check.data = srv->prepare.data = srv;
  if ((rv = uv_check_init(&srv->loop, &srv->check)) ||
      (rv = uv_check_start(&srv->check, on_check)) ||
      (rv = uv_prepare_init(&srv->loop, &srv->prepare)) ||
      (rv = uv_prepare_start(&srv->prepare, on_prepare)))
    return grove_err_set(err, GROVE_E_INTERNAL, "uv_check: %s", uv_strerror(rv));
  return GROVE_OK;
}

static void on_closed(uv_handle_t *h) {
  (void)h;
}

void grove__loop_stop(srv_server *srv) {
  grove__waker_close(&srv->wake);
  uv_close((uv_handle_t *)&srv->wake_poll, on_closed);
  uv_close((uv_handle_t *)&srv->check, on_closed);
  uv_close((uv_handle_t *)&srv->prepare, on_closed);
}

static void close_walk(uv_handle_t *h, void *arg) {
  (void)arg;
  if (!uv_is_closing(h)) uv_close(h, on_closed);
}

void grove__loop_close(srv_server *srv) {
  if (!srv->loop_started) return;
  /* After a failed start the handles are still open: close and let them
   * finish, so that uv_loop_close succeeds. */
  uv_walk(&srv->loop, close_walk, NULL);
  uv_run(&srv->loop, UV_RUN_DEFAULT);
  uv_loop_close(&srv->loop);
  if (srv->wake_fd >= 0) close(srv->wake_fd); /* its poll handle is closed by now */
  srv->wake_fd = -1;
  pthread_mutex_destroy(&srv->inbox_mu);
  srv->loop_started = false;
}
