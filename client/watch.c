/* watch.c: libgrove-client's subscriber to groved's hook telemetry
 * (grove_watch_*, include/grove/client.h; docs/telemetry.md).
 *
 * groved publishes each HookEvent on an NNG PUB socket as the bytes
 * "MODEL/MODULE.PATH", one 0 byte, then the protobuf.  NNG's SUB filters by
 * prefix, so "MODEL/" selects a model, "MODEL/PATH" plus the 0 byte exactly
 * one module, and "" everything. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <nng/nng.h>
#include <nng/protocol/pubsub0/sub.h>

#include "grove.pb-c.h"
#include "grove/client.h"
#include "nng_close.h"

#define LOCAL_PREFIX "grove client: "

struct grove_watch {
  nng_socket sock;
  char url[512];
};

grove_status grove_watch_open(const char *url, const char *model, const char *module,
                              grove_watch **out, grove_err *err) {
  if (out) *out = NULL;
  if (!url || !*url || !out || (module && !model))
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT,
                         LOCAL_PREFIX "watch: needs a URL (and a model for a module)");
  grove_watch *w = calloc(1, sizeof *w);
  if (!w) return grove_err_set(err, GROVE_E_NOMEM, LOCAL_PREFIX "out of memory");
  snprintf(w->url, sizeof w->url, "%s", url);
  int rv = nng_sub0_open(&w->sock);
  if (rv) {
    free(w);
    return grove_err_set(err, GROVE_E_INTERNAL, LOCAL_PREFIX "cannot open a sub socket: %s",
                         nng_strerror(rv));
  }
  /* A subscriber that reads slowly loses the oldest events in its own
   * queue; the server never waits for it. */
  nng_socket_set_int(w->sock, NNG_OPT_RECVBUF, 1024);
  nng_socket_set_size(w->sock, NNG_OPT_RECVMAXSZ, 0);
  nng_socket_set_ms(w->sock, NNG_OPT_RECONNMINT, 50);
  nng_socket_set_ms(w->sock, NNG_OPT_RECONNMAXT, 1000);
  char topic[1024];
  size_t tl = 0;
  if (model) {
    int n = module ? snprintf(topic, sizeof topic, "%s/%s", model, module)
                   : snprintf(topic, sizeof topic, "%s/", model);
    if (n < 0 || (size_t)n + 1 >= sizeof topic) {
      nng_close(w->sock);
      free(w);
      return grove_err_set(err, GROVE_E_INVALID_ARGUMENT, LOCAL_PREFIX "watch: topic too long");
    }
    tl = (size_t)n + (module ? 1 : 0); /* the 0 byte ends an exact path */
  }
  if ((rv = nng_socket_set(w->sock, NNG_OPT_SUB_SUBSCRIBE, topic, tl)) != 0) {
    nng_close(w->sock);
    free(w);
    return grove_err_set(err, GROVE_E_INTERNAL, LOCAL_PREFIX "cannot subscribe: %s",
                         nng_strerror(rv));
  }
  if ((rv = nng_dial(w->sock, url, NULL, 0)) != 0) {
    nng_close(w->sock);
    free(w);
    return grove_err_set(err, GROVE_E_UNAVAILABLE, LOCAL_PREFIX "cannot reach %s: %s", url,
                         nng_strerror(rv));
  }
  *out = w;
  return GROVE_OK;
}

void grove_watch_close(grove_watch *w) {
  if (!w) return;
  /* NNG 1.5.2's close can hang while connected (nanomsg/nng#1543): w is
   * left to a close that is stuck. */
  if (grove__nng_close_bounded(w->sock, 2000)) free(w);
}

void grove_hook_event_fini(grove_hook_event *ev) {
  if (!ev) return;
  free(ev->model);
  free(ev->module);
  free(ev->histogram);
  free(ev->feature_mean);
  free(ev->feature_std);
  memset(ev, 0, sizeof *ev);
}

static void *dup_mem(const void *p, size_t n, bool *oom) {
  if (n == 0) return NULL;
  void *q = malloc(n);
  if (!q) {
    *oom = true;
    return NULL;
  }
  memcpy(q, p, n);
  return q;
}

static grove_status event_from_wire(const Grove__HookEvent *w, grove_hook_event *ev,
                                    grove_err *err) {
  memset(ev, 0, sizeof *ev);
  bool oom = false;
  ev->model = strdup(w->model ? w->model : "");
  ev->module = strdup(w->module ? w->module : "");
  oom = !ev->model || !ev->module;
  ev->version = w->version;
  ev->hook_id = w->hook_id;
  ev->kind =
      w->kind == GROVE__HOOK_KIND__HOOK_FORWARD_PRE ? GROVE_HOOK_FORWARD_PRE : GROVE_HOOK_FORWARD;
  ev->batches = w->batches;
  ev->rows = w->rows;
  ev->count = w->count;
  ev->mean = w->mean;
  ev->std = w->std;
  ev->min = w->min;
  ev->max = w->max;
  ev->abs_mean = w->abs_mean;
  ev->zero_fraction = w->zero_fraction;
  ev->nan_count = w->nan_count;
  ev->inf_count = w->inf_count;
  ev->nbins = w->n_histogram;
  ev->histogram = dup_mem(w->histogram, w->n_histogram * sizeof(uint64_t), &oom);
  ev->histogram_min = w->histogram_min;
  ev->histogram_max = w->histogram_max;
  ev->histogram_below = w->histogram_below;
  ev->histogram_above = w->histogram_above;
  ev->nfeatures = w->n_feature_mean < w->n_feature_std ? w->n_feature_mean : w->n_feature_std;
  ev->feature_mean = dup_mem(w->feature_mean, ev->nfeatures * sizeof(double), &oom);
  ev->feature_std = dup_mem(w->feature_std, ev->nfeatures * sizeof(double), &oom);
  ev->start_unix_us = w->start_unix_us;
  ev->end_unix_us = w->end_unix_us;
  ev->sequence = w->sequence;
  ev->worker = w->worker;
  ev->ndim = w->n_shape <= GROVE_MAX_DIMS ? (int)w->n_shape : GROVE_MAX_DIMS;
  for (int d = 0; d < ev->ndim; d++) ev->shape[d] = w->shape[d];
  if (oom) {
    grove_hook_event_fini(ev);
    return grove_err_set(err, GROVE_E_NOMEM, LOCAL_PREFIX "out of memory");
  }
  return GROVE_OK;
}

grove_status grove_watch_next(grove_watch *w, int timeout_ms, grove_hook_event *ev,
                              grove_err *err) {
  if (ev) memset(ev, 0, sizeof *ev);
  if (!w || !ev)
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT, LOCAL_PREFIX "watch_next: no watch");
  nng_socket_set_ms(w->sock, NNG_OPT_RECVTIMEO,
                    timeout_ms < 0 ? NNG_DURATION_INFINITE : timeout_ms);
  nng_msg *msg;
  int rv = nng_recvmsg(w->sock, &msg, 0);
  if (rv == NNG_ETIMEDOUT)
    return grove_err_set(err, GROVE_E_DEADLINE_EXCEEDED,
                         LOCAL_PREFIX "no hook event from %s within %d ms", w->url, timeout_ms);
  if (rv)
    return grove_err_set(err, GROVE_E_UNAVAILABLE, LOCAL_PREFIX "%s: %s", w->url, nng_strerror(rv));
  const unsigned char *p = nng_msg_body(msg);
  size_t len = nng_msg_len(msg);
  const unsigned char *nul = memchr(p, 0, len);
  grove_status s;
  if (!nul) {
    s = grove_err_set(err, GROVE_E_FORMAT, LOCAL_PREFIX "%s sent %zu bytes without a topic", w->url,
                      len);
  } else {
    size_t off = (size_t)(nul - p) + 1;
    Grove__HookEvent *e = grove__hook_event__unpack(NULL, len - off, p + off);
    if (!e) {
      s = grove_err_set(err, GROVE_E_FORMAT,
                        LOCAL_PREFIX "%s sent a message that is not a grove.HookEvent", w->url);
    } else {
      s = event_from_wire(e, ev, err);
      grove__hook_event__free_unpacked(e, NULL);
    }
  }
  nng_msg_free(msg);
  return s;
}
