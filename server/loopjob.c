/* loopjob.c: the loop-job queue, work that another thread hands to the
 * libuv loop thread ("run fn on the loop soon").
 *
 * reload.c (a Reload RPC, SIGHUP, --watch), export.c (opening an export)
 * and train.c (a snapshot of the serving weights) post jobs here from NNG's
 * threads or their own; each job counts as in progress until its owner says
 * grove__loopjob_done, and the drain waits until none is (lifecycle.c).  A
 * mutex-guarded list and a uv_async_t of this file's own carry them; at
 * shutdown the jobs not yet run are cancelled instead.
 *
 * Layer: the loop's (docs/architecture.md, "server/").  It calls only
 * loop.c (to wake the drain); the features call it. */
#include <stdlib.h>

#include "server.h"

typedef struct post {
  void (*fn)(srv_server *, void *);
  void (*cancel)(void *);
  void *arg;
  struct post *next;
} post;

struct srv_loopjobs {
  uv_async_t async;
  bool async_init;
  pthread_mutex_t mu; /* guards the post list */
  post *head, *tail;
  _Atomic int64_t jobs; /* posted or running, not done */
  atomic_bool closing;
};

static void on_async(uv_async_t *h) {
  srv_server *srv = h->data;
  struct srv_loopjobs *q = srv->loopjobs;
  pthread_mutex_lock(&q->mu);
  post *p = q->head;
  q->head = q->tail = NULL;
  pthread_mutex_unlock(&q->mu);
  while (p) {
    post *next = p->next;
    if (atomic_load(&q->closing)) {
      if (p->cancel) p->cancel(p->arg);
      grove__loopjob_done(srv);
    } else {
      p->fn(srv, p->arg);
    }
    free(p);
    p = next;
  }
}

grove_status grove__loopjob_start(srv_server *srv, grove_err *err) {
  struct srv_loopjobs *q = calloc(1, sizeof *q);
  if (!q) return grove_err_set(err, GROVE_E_NOMEM, "out of memory");
  pthread_mutex_init(&q->mu, NULL);
  srv->loopjobs = q;
  q->async.data = srv;
  int rv = uv_async_init(&srv->loop, &q->async, on_async);
  if (rv) return grove_err_set(err, GROVE_E_INTERNAL, "uv_async_init: %s", uv_strerror(rv));
  q->async_init = true;
  return GROVE_OK;
}

bool grove__loopjob_post(srv_server *srv, void (*fn)(srv_server *, void *), void (*cancel)(void *),
                         void *arg) {
  struct srv_loopjobs *q = srv->loopjobs;
  post *p = calloc(1, sizeof *p);
  if (!p) return false;
  p->fn = fn;
  p->cancel = cancel;
  p->arg = arg;
  atomic_fetch_add(&q->jobs, 1);
  pthread_mutex_lock(&q->mu);
  if (q->tail)
    q->tail->next = p;
  else
    q->head = p;
  q->tail = p;
  pthread_mutex_unlock(&q->mu);
  uv_async_send(&q->async);
  return true;
}

void grove__loopjob_begin(srv_server *srv) {
  atomic_fetch_add(&srv->loopjobs->jobs, 1);
}

void grove__loopjob_done(srv_server *srv) {
  atomic_fetch_sub(&srv->loopjobs->jobs, 1);
  /* The drain re-checks on every wake-up. */
  if (atomic_load(&srv->draining)) grove__loop_wake(srv);
}

bool grove__loopjob_idle(srv_server *srv) {
  return !srv->loopjobs || atomic_load(&srv->loopjobs->jobs) == 0;
}

bool grove__loopjob_closing(srv_server *srv) {
  return srv->loopjobs && atomic_load(&srv->loopjobs->closing);
}

static void on_closed(uv_handle_t *h) {
  (void)h;
}

void grove__loopjob_close(srv_server *srv) {
  struct srv_loopjobs *q = srv->loopjobs;
  if (!q) return;
  atomic_store(&q->closing, true);
  /* Jobs still posted will never run: cancel them now. */
  if (q->async_init) on_async(&q->async);
  if (q->async_init && !uv_is_closing((uv_handle_t *)&q->async))
    uv_close((uv_handle_t *)&q->async, on_closed);
}

void grove__loopjob_free(srv_server *srv) {
  struct srv_loopjobs *q = srv->loopjobs;
  if (!q) return;
  for (post *p = q->head, *next; p; p = next) {
    next = p->next;
    if (p->cancel) p->cancel(p->arg);
    free(p);
  }
  pthread_mutex_destroy(&q->mu);
  free(q);
  srv->loopjobs = NULL;
}
