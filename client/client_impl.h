/* client_impl.h: what client.c (the calls) shares with the other files of
 * libgrove-client: client_train.c (the training calls) and the transports
 * that carry the calls' messages (client_sp.c: NNG's SP protocol on the
 * client's own sockets, the default; client_nng.c: NNG's req0 socket,
 * GROVE_CLIENT_IO=nng).  Never installed.  Hidden from the shared library's
 * symbol table. */
#ifndef GROVE_CLIENT_IMPL_H
#define GROVE_CLIENT_IMPL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <nng/nng.h>

#include "grove.pb-c.h"
#include "grove/client.h"

/* Messages of failures found on the client side begin with this
 * (grove_client_failed_locally). */
#define LOCAL_PREFIX "grove client: "
#define MAX_INPUTS 64

#pragma GCC visibility push(hidden)

/* How long a call made while the connection is lost waits for the redial
 * (both transports redial every 50 ms to 1 s) before it fails with
 * UNAVAILABLE, rather than waiting out its whole timeout for a server that
 * is gone. */
#define REDIAL_GRACE_MS 2000

typedef struct client_io client_io;

struct grove_client {
  const client_io *io; /* the transport (client_sp.c or client_nng.c) */
  void *t;             /* its state */
  pthread_mutex_t mu;  /* guards outstanding */
  pthread_cond_t idle_cv;
  long outstanding; /* asynchronous calls whose callback has not returned */
  int default_timeout_ms;
  atomic_uint_fast64_t next_id;
  size_t nurls;   /* > 1: replicas (predict retried on another; one-replica calls refused) */
  char urls[512]; /* for messages */

  /* The admin plane (reload, export, hooks, training): groved serves them on
   * another listener.  admin is a client of admin_url alone, opened at the
   * first admin call (admin_mu guards that), or this client itself when it
   * was opened on admin_url. */
  char *admin_url;
  bool admin_url_given; /* opts or $GROVE_ADMIN, not the default */
  char *token;          /* sent with admin RPCs only; NULL: none */
  pthread_mutex_t admin_mu;
  grove_client *admin;
  grove_client_opts opts; /* for admin's open */
};

/* The completion of an asynchronous exchange, on the transport's thread:
 * s GROVE_OK and rep the reply (the callback's), or s and err (valid during
 * the call only) saying why there is none. */
typedef void (*client_io_cb)(void *arg, grove_status s, nng_msg *rep, const grove_err *err);

/* A transport: it moves encoded requests (nng_msg: a body, nothing in the
 * header) to the server and their replies back, and knows its connections.
 * Every function but open and close: any thread, concurrently. */
struct client_io {
  const char *name; /* "sp", "nng" */
  /* Connects to urls[0..n) (c->urls, c->nurls set) and sets c->t; a URL
   * that cannot be reached now is dialed again in the background.  Fails
   * (UNAVAILABLE, with every URL's reason) when none is reached. */
  grove_status (*open)(grove_client *c, const char *const *urls, size_t n, grove_err *err);
  /* Closes every connection (no call in flight: wait_idle ran).  false:
   * the close is stuck (NNG), and c must be left (leaked) to it. */
  bool (*close)(grove_client *c);
  /* Sends m (taken) and waits at most timeout_ms for the reply (*out, the
   * caller's). */
  grove_status (*exchange)(grove_client *c, nng_msg *m, int timeout_ms, nng_msg **out,
                           grove_err *err);
  /* Sends m (taken) and returns; cb(arg, ...) runs once with the reply or
   * the failure (never when this returns an error).  resend: the request
   * is idempotent, and is sent again on another connection if its own
   * drops. */
  grove_status (*exchange_async)(grove_client *c, nng_msg *m, int timeout_ms, bool resend,
                                 client_io_cb cb, void *arg, grove_err *err);
  /* Connections up right now. */
  int (*connected)(grove_client *c);
};

extern const client_io grove__client_io_sp, grove__client_io_nng;

static inline grove_status grove__client_nomem(grove_err *err) {
  return grove_err_set(err, GROVE_E_NOMEM, LOCAL_PREFIX "out of memory");
}

static inline int64_t grove__client_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* The failures both transports report, worded alike (the predict retry,
 * retry_predict in client.c, reads "not back within"). */
static inline grove_status grove__client_err_timeout(const grove_client *c, bool connected,
                                                     int timeout_ms, grove_err *err) {
  if (!connected)
    return grove_err_set(err, GROVE_E_UNAVAILABLE,
                         LOCAL_PREFIX "no connection to %s (lost, and not back within %d ms)",
                         c->urls, timeout_ms);
  return grove_err_set(err, GROVE_E_DEADLINE_EXCEEDED,
                       LOCAL_PREFIX "no reply from %s within %d ms", c->urls, timeout_ms);
}

static inline grove_status grove__client_err_lost(const grove_client *c, grove_err *err) {
  return grove_err_set(err, GROVE_E_UNAVAILABLE,
                       LOCAL_PREFIX "the connection to %s was lost with the request in flight "
                                    "(the server closed it, exited or was killed)",
                       c->urls);
}

/* A batch of tensors as wire tensors: t[i] views inputs[i] (its data, or a
 * contiguous copy kept in copies[i]) and the target comes last; ptrs[i] is
 * &t[i], for the request's repeated field.  Large: on the stack of one
 * call. */
typedef struct wire_batch {
  Grove__Tensor t[MAX_INPUTS + 1];
  Grove__Tensor *ptrs[MAX_INPUTS + 1];
  int64_t shapes[MAX_INPUTS + 1][GROVE_MAX_DIMS];
  grove_tensor *copies[MAX_INPUTS + 1];
} wire_batch;

int grove__client_timeout_of(const grove_client *c, int timeout_ms);
grove_status grove__client_call(grove_client *c, Grove__Request *req, int timeout_ms,
                                Grove__Reply **out, grove_err *err);
grove_status grove__client_call_for(grove_client *c, Grove__Request *req, int timeout_ms,
                                    Grove__Reply__BodyCase body, const char *missing,
                                    Grove__Reply **out, grove_err *err);
grove_status grove__client_wire_of(const grove_tensor *t, const char *what, Grove__Tensor *w,
                                   int64_t *shape, grove_tensor **copy, grove_err *err);
grove_status grove__client_wire_batch_init(wire_batch *b, const grove_tensor *inputs, size_t n,
                                           const grove_tensor *target, size_t max, grove_err *err);
void grove__client_wire_batch_fini(wire_batch *b);
grove_status grove__client_outputs_from_wire(Grove__Tensor **w, size_t n, grove_prediction *out,
                                             grove_err *err);
void grove__client_strv_free(char **v, size_t n);
char **grove__client_strv_dup(char **w, size_t n, bool *oom);
/* An admin call (what names it for a message) goes to the admin plane:
 * *c becomes the client's connection to groved's admin listener (opened at
 * the first admin call: grove_client_opts.admin_url), or the call is refused
 * (a client of several replicas and no admin URL; the admin listener cannot
 * be reached) with err set. */
grove_status grove__client_admin_plane(grove_client **c, const char *what, grove_err *err);
grove_status grove__client_reload_call(grove_client *c, Grove__Request *req, int timeout_ms,
                                       const char *what, grove_reload_result *out, grove_err *err);

#pragma GCC visibility pop
#endif
