/* nng_close.c: grove__nng_close_bounded (nng_close.h). */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <time.h>

#include "nng_close.h"

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

bool grove__nng_close_bounded(nng_socket s, int wait_ms) {
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
    return true;
  }
  pthread_detach(th);
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_sec += wait_ms / 1000;
  until.tv_nsec += (long)(wait_ms % 1000) * 1000000L;
  if (until.tv_nsec >= 1000000000L) {
    until.tv_sec++;
    until.tv_nsec -= 1000000000L;
  }
  pthread_mutex_lock(&c->mu);
  int rv = 0;
  while (!c->done && rv != ETIMEDOUT) rv = pthread_cond_timedwait(&c->cv, &c->mu, &until);
  const bool done = c->done;
  pthread_mutex_unlock(&c->mu);
  closer_put(c);
  return done;
}
