/* loop.c: the libuv loop and its inbox.
 *
 * NNG's threads (a validated predict) and workers (a finished batch) hand
 * work to the loop thread through the inbox: a mutex-guarded list they
 * append to, then uv_async_send.  On the loop, the callback lifecycle.c
 * registered at start takes what came (grove__inbox_take) and decides what
 * to do with it; this file calls nothing above it.
 *
 * Layer: the loop's (docs/architecture.md, "server/"), below the models and
 * the features, above rpc.c/metrics.c/slog.c. */
#include "server.h"

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

void grove__inbox_take(srv_server *srv, srv_req **reqs, srv_worker **done) {
  pthread_mutex_lock(&srv->inbox_mu);
  *reqs = srv->inbox_head;
  *done = srv->done_head;
  srv->inbox_head = srv->inbox_tail = NULL;
  srv->done_head = NULL;
  pthread_mutex_unlock(&srv->inbox_mu);
}

static void on_async(uv_async_t *h) {
  srv_server *srv = h->data;
  srv->on_wake(srv);
}

grove_status grove__loop_init(srv_server *srv, void (*on_wake)(srv_server *), grove_err *err) {
  int rv;
  if ((rv = uv_loop_init(&srv->loop)))
    return grove_err_set(err, GROVE_E_INTERNAL, "uv_loop_init: %s", uv_strerror(rv));
  srv->loop_started = true;
  pthread_mutex_init(&srv->inbox_mu, NULL);
  srv->on_wake = on_wake;
  srv->async.data = srv;
  if ((rv = uv_async_init(&srv->loop, &srv->async, on_async)))
    return grove_err_set(err, GROVE_E_INTERNAL, "uv_async_init: %s", uv_strerror(rv));
  return GROVE_OK;
}

static void on_closed(uv_handle_t *h) {
  (void)h;
}

void grove__loop_stop(srv_server *srv) {
  uv_close((uv_handle_t *)&srv->async, on_closed);
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
  pthread_mutex_destroy(&srv->inbox_mu);
  srv->loop_started = false;
}
