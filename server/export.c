/* export.c: ExportStateDict, the serving state_dict as a file.
 *
 * A client pulls the exact weights being served as the bytes of a
 * .safetensors or torch.save (.pt) file, in byte ranges, so that a model of
 * any size exports in bounded memory on both sides:
 *
 *   1. open (export_id 0), on the loop: the model's current version is
 *      pinned (a reference) and its tree's state_dict taken (parameters and
 *      persistent buffers, torch's order, the dtypes as loaded); then, in
 *      libuv's pool, grove_safetensors_plan / grove_torch_plan describe the
 *      file as segments (core/io/export_plan.c: headers built, tensor data
 *      referenced in place; the .pt plan reads every tensor once for the zip
 *      CRCs).  The export is registered and the reply carries its id, the
 *      version, the file's size and the first range asked for.
 *   2. fetch (export_id set), on the NNG thread that received it: the range
 *      is copied from the plan into the reply.  Nothing else is built, so a
 *      fetch costs a memcpy of at most CHUNK_LIMIT bytes.
 *   3. close: with the last fetch (close = true), or by itself; an export
 *      idle for IDLE_S seconds is released by a timer on the loop.
 *
 * One version per export: every byte comes from the version pinned at open,
 * however many reloads happen meanwhile (the plan holds the tensors; a full
 * reload builds new ones, an in-place reload swaps new ones in without
 * writing into the old).  The pinned version stays in memory until the
 * export closes.  An export cannot open while an in-place reload is changing
 * the model's tree (UNAVAILABLE: retry).
 *
 * Threads: the table of open exports is guarded by a mutex; an export in
 * use by a fetch is kept alive by its reference count even if it is closed
 * or expires meanwhile. */
#define _GNU_SOURCE
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server.h"

#define MAX_EXPORTS 16
#define CHUNK_LIMIT ((uint64_t)16 << 20)
#define IDLE_S 60
#define SWEEP_MS 1000

typedef struct session {
  uint64_t id;
  srv_model *m;
  srv_version *v; /* pinned */
  grove_file_plan *plan;
  int32_t format;
  atomic_int refs;           /* the table's, plus one per fetch running */
  _Atomic int64_t last_used; /* ns */
  struct session *next;
} session;

typedef struct mcount {
  _Atomic uint64_t ok, failed, bytes;
} mcount;

struct srv_exports {
  pthread_mutex_t mu; /* guards the list and next_id */
  session *head;
  size_t n;
  uint64_t next_id;
  uv_timer_t sweep;
  bool sweep_init;
  mcount *counts; /* per model */
  _Atomic int64_t open;
};

static void session_release(session *s) {
  if (!s || atomic_fetch_sub(&s->refs, 1) != 1) return;
  grove_file_plan_free(s->plan);
  grove__version_release(s->v);
  free(s);
}

/* Unlinks and returns the export with that id (the table's reference moves
 * to the caller), or NULL. */
static session *take(struct srv_exports *x, uint64_t id) {
  session *found = NULL;
  pthread_mutex_lock(&x->mu);
  for (session **pp = &x->head; *pp; pp = &(*pp)->next)
    if ((*pp)->id == id) {
      found = *pp;
      *pp = found->next;
      x->n--;
      break;
    }
  pthread_mutex_unlock(&x->mu);
  if (found) atomic_fetch_sub(&x->open, 1);
  return found;
}

/* A new reference to the export with that id, or NULL. */
static session *find(struct srv_exports *x, uint64_t id) {
  session *found = NULL;
  pthread_mutex_lock(&x->mu);
  for (session *s = x->head; s; s = s->next)
    if (s->id == id) {
      found = s;
      atomic_fetch_add(&s->refs, 1);
      atomic_store(&s->last_used, grove__now_ns());
      break;
    }
  pthread_mutex_unlock(&x->mu);
  return found;
}

static const char *format_name(int32_t f) {
  return f == GROVE_CKPT_SAFETENSORS ? "safetensors" : f == GROVE_CKPT_TORCH_ZIP ? "pt" : "?";
}

/* ================================================================ replies */

static size_t varint_len(uint64_t v) {
  size_t n = 1;
  while (v >= 0x80) {
    v >>= 7;
    n++;
  }
  return n;
}

static uint8_t *put_varint(uint8_t *p, uint64_t v) {
  while (v >= 0x80) {
    *p++ = (uint8_t)(v | 0x80);
    v >>= 7;
  }
  *p++ = (uint8_t)v;
  return p;
}

/* The reply for bytes [offset, offset + n) of s, with the range copied from
 * the plan straight into the message: protobuf-c would want the bytes in a
 * buffer of their own first, doubling what a fetch holds.  The fields are
 * encoded by protobuf-c without the data, and the data field (and then the
 * body, field 17, around them) is appended by hand: the wire format allows
 * fields in any order.  NULL when out of memory. */
static nng_msg *encode_range(srv_req *r, session *s, uint64_t offset, uint64_t n, bool closed,
                             grove_status *st, grove_err *err) {
  Grove__ExportStateDictReply er = GROVE__EXPORT_STATE_DICT_REPLY__INIT;
  er.export_id = s->id;
  er.version = s->v->number;
  er.total_size = grove_file_plan_size(s->plan);
  er.format = s->format;
  er.offset = offset;
  er.tensors = (uint32_t)grove_file_plan_tensors(s->plan);
  er.chunk_limit = CHUNK_LIMIT;
  er.closed = closed;
  Grove__Reply rep = GROVE__REPLY__INIT;
  rep.protocol = GROVE__PROTOCOL_VERSION__PROTOCOL_VERSION;
  rep.id = r->id;
  size_t head = grove__reply__get_packed_size(&rep);
  size_t fields = grove__export_state_dict_reply__get_packed_size(&er);
  size_t data_field = n ? 1 + varint_len(n) + (size_t)n : 0; /* tag 6, wire type 2 */
  size_t body = fields + data_field;
  size_t total = head + 2 + varint_len(body) + body; /* tag 17, wire type 2: 0x8a 0x01 */
  nng_msg *m;
  if (nng_msg_alloc(&m, total) != 0) return NULL;
  uint8_t *p = nng_msg_body(m);
  p += grove__reply__pack(&rep, p);
  *p++ = 0x8a;
  *p++ = 0x01;
  p = put_varint(p, body);
  p += grove__export_state_dict_reply__pack(&er, p);
  if (n) {
    *p++ = (6 << 3) | 2;
    p = put_varint(p, n);
    *st = grove_file_plan_read(s->plan, offset, p, (size_t)n, err);
    p += n;
  }
  if ((size_t)(p - (uint8_t *)nng_msg_body(m)) != total && !*st)
    *st = grove_err_set(err, GROVE_E_INTERNAL, "export reply: %zu bytes encoded, %zu planned",
                        (size_t)(p - (uint8_t *)nng_msg_body(m)), total);
  return m;
}

/* Answers r with the range [offset, offset + length) of s (length capped),
 * closing s first when asked. */
static void send_range(srv_server *srv, srv_req *r, session *s, uint64_t offset, uint64_t length,
                       bool close) {
  struct srv_exports *x = srv->exports;
  uint64_t total = grove_file_plan_size(s->plan);
  if (offset > total) {
    grove__rpc_reply_error(r, GROVE_E_INVALID_ARGUMENT,
                           "export %" PRIu64 ": offset %" PRIu64
                           " is past the end of the file (%" PRIu64 " bytes)",
                           s->id, offset, total);
    return;
  }
  uint64_t n = length < CHUNK_LIMIT ? length : CHUNK_LIMIT;
  if (n > total - offset) n = total - offset;
  grove_err err = {0};
  grove_status st = GROVE_OK;
  nng_msg *msg = encode_range(r, s, offset, n, close, &st, &err);
  if (!msg) {
    grove__rpc_reply_error(r, GROVE_E_NOMEM, "out of memory for %" PRIu64 " bytes", n);
    return;
  }
  if (st) {
    nng_msg_free(msg);
    grove__rpc_reply_error(r, st, "export %" PRIu64 ": %s", s->id, grove_err_msg(&err));
    return;
  }
  if (close) {
    session *t = take(x, s->id);
    if (t) {
      grove__slog(GROVE_LOG_DEBUG, "export.closed", "export %" PRIu64 " of model %s closed", t->id,
                  t->m->name);
      session_release(t);
    }
  }
  atomic_fetch_add(&x->counts[s->m->index].bytes, n);
  grove__rpc_send(r, msg, GROVE_OK);
}

/* ================================================================ open */

typedef struct ojob {
  srv_server *srv;
  srv_req *r;
  srv_model *m;
  int32_t format;
  char *prefix, *archive;
  uint64_t offset, length;
  bool close;
  srv_version *v;
  grove_state_dict *sd;
  grove_file_plan *plan;
  grove_status s;
  grove_err err;
  int64_t t0;
  uv_work_t work;
} ojob;

static void ojob_free(ojob *j) {
  if (!j) return;
  free(j->prefix);
  free(j->archive);
  grove_sd_free(j->sd);
  grove_file_plan_free(j->plan);
  grove__version_release(j->v);
  free(j);
}

static void open_fail(ojob *j, grove_status s, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void open_fail(ojob *j, grove_status s, const char *fmt, ...) {
  /* The arguments may point into j->err: format elsewhere first. */
  grove_err e = {0};
  va_list ap;
  va_start(ap, fmt);
  grove_err_setv(&e, s, fmt, ap);
  va_end(ap);
  j->err = e;
  atomic_fetch_add(&j->srv->exports->counts[j->m->index].failed, 1);
  grove__rpc_reply_error(j->r, s, "%s", grove_err_msg(&j->err));
  j->r = NULL;
}

static void plan_work(uv_work_t *w) {
  ojob *j = w->data;
  if (j->format == GROVE_CKPT_SAFETENSORS)
    j->s = grove_safetensors_plan(j->sd, &j->plan, &j->err);
  else
    j->s = grove_torch_plan(j->sd, j->archive, &j->plan, &j->err);
  grove_sd_free(j->sd);
  j->sd = NULL;
}

static void plan_done(uv_work_t *w, int status) {
  ojob *j = w->data;
  srv_server *srv = j->srv;
  struct srv_exports *x = srv->exports;
  if (grove__loopjob_closing(srv)) {
    ojob_free(j);
    grove__loopjob_done(srv);
    return;
  }
  if (status && !j->s)
    j->s = grove_err_set(&j->err, GROVE_E_INTERNAL, "cancelled: %s", uv_strerror(status));
  session *s = NULL;
  if (!j->s && !(s = calloc(1, sizeof *s)))
    j->s = grove_err_set(&j->err, GROVE_E_NOMEM, "out of memory");
  if (j->s) {
    open_fail(j, j->s, "model '%s' version %" PRId64 ": %s", j->m->name, j->v->number,
              grove_err_msg(&j->err));
    ojob_free(j);
    grove__loopjob_done(srv);
    return;
  }
  s->m = j->m;
  s->v = j->v;
  j->v = NULL;
  s->plan = j->plan;
  j->plan = NULL;
  s->format = j->format;
  atomic_init(&s->refs, 2); /* the table's and this reply's */
  atomic_init(&s->last_used, grove__now_ns());
  pthread_mutex_lock(&x->mu);
  s->id = x->next_id++;
  s->next = x->head;
  x->head = s;
  x->n++;
  pthread_mutex_unlock(&x->mu);
  atomic_fetch_add(&x->open, 1);
  atomic_fetch_add(&x->counts[j->m->index].ok, 1);
  grove__slog(GROVE_LOG_INFO, "export.open",
              "model %s version %" PRId64 ": export %" PRIu64 " as %s, %zu tensors, %" PRIu64
              " bytes (%.1f ms to plan)",
              j->m->name, s->v->number, s->id, format_name(s->format),
              grove_file_plan_tensors(s->plan), grove_file_plan_size(s->plan),
              (double)(grove__now_ns() - j->t0) / 1e6);
  send_range(srv, j->r, s, j->offset, j->length, j->close);
  j->r = NULL;
  session_release(s);
  ojob_free(j);
  grove__loopjob_done(srv);
}

/* Loop: pin the version, take its state_dict, plan in the pool. */
static void open_on_loop(srv_server *srv, void *arg) {
  ojob *j = arg;
  struct srv_exports *x = srv->exports;
  srv_model *m = j->m;
  size_t n;
  pthread_mutex_lock(&x->mu);
  n = x->n;
  pthread_mutex_unlock(&x->mu);
  if (atomic_load(&srv->draining)) {
    open_fail(j, GROVE_E_UNAVAILABLE, "groved is shutting down; export refused");
  } else if (grove__reload_in_place_active(srv, m)) {
    open_fail(j, GROVE_E_UNAVAILABLE,
              "model '%s': an in-place reload is changing its weights; retry once it has "
              "answered",
              m->name);
  } else if (n >= MAX_EXPORTS) {
    open_fail(j, GROVE_E_RESOURCE_EXHAUSTED,
              "%zu exports are open (at most %d); close one or wait %d s for an idle one to "
              "expire",
              n, MAX_EXPORTS, IDLE_S);
  } else if (!(j->v = grove__model_acquire(m))) {
    open_fail(j, GROVE_E_UNAVAILABLE, "model '%s' is not loaded: %s", m->name,
              m->error ? m->error : "no version");
  }
  if (!j->r) {
    ojob_free(j);
    grove__loopjob_done(srv);
    return;
  }
  /* The state_dict is taken here, on the loop, because an in-place reload
   * changes the tree only from the loop's own schedule (never while this
   * runs); the plan then holds the tensors themselves. */
  grove_state_dict *all = grove_sd_new();
  j->sd = grove_sd_new();
  grove_status s = all && j->sd ? grove_module_state_dict(j->v->model->root, NULL, all, &j->err)
                                : grove_err_set(&j->err, GROVE_E_NOMEM, "out of memory");
  size_t plen = j->prefix ? strlen(j->prefix) : 0;
  for (size_t i = 0; !s && i < grove_sd_count(all); i++)
    if (!plen || strncmp(grove_sd_key(all, i), j->prefix, plen) == 0)
      s = grove_sd_set(j->sd, grove_sd_key(all, i), grove_sd_tensor(all, i), &j->err);
  for (size_t i = 0; !s && i < grove_sd_meta_count(all); i++)
    s = grove_sd_set_version(j->sd, grove_sd_meta_prefix(all, i), grove_sd_meta_version(all, i),
                             &j->err);
  size_t nall = grove_sd_count(all);
  grove_sd_free(all);
  if (!s && plen && grove_sd_count(j->sd) == 0)
    s = grove_err_set(&j->err, GROVE_E_NOT_FOUND,
                      "no key starts with '%s' (the state_dict has %zu)", j->prefix, nall);
  if (s) {
    open_fail(j, s, "model '%s' version %" PRId64 ": %s", m->name, j->v->number,
              grove_err_msg(&j->err));
    ojob_free(j);
    grove__loopjob_done(srv);
    return;
  }
  j->work.data = j;
  int rv = uv_queue_work(&srv->loop, &j->work, plan_work, plan_done);
  if (rv) {
    open_fail(j, GROVE_E_INTERNAL, "uv_queue_work: %s", uv_strerror(rv));
    ojob_free(j);
    grove__loopjob_done(srv);
  }
}

static void open_cancel(void *arg) {
  ojob_free(arg);
}

/* ================================================================ the RPC */

void grove__export_handle(srv_req *r) {
  srv_server *srv = r->srv;
  struct srv_exports *x = srv->exports;
  const Grove__ExportStateDictRequest *q = r->msg->export_state_dict;
  if (q->export_id) {
    session *s = find(x, q->export_id);
    if (!s) {
      grove__rpc_reply_error(r, GROVE_E_NOT_FOUND,
                             "export %" PRIu64
                             " is not open (closed, idle for more than %d s, or groved "
                             "restarted); start a new one",
                             q->export_id, IDLE_S);
      return;
    }
    if (q->model && *q->model && strcmp(q->model, s->m->name) != 0) {
      grove__rpc_reply_error(r, GROVE_E_INVALID_ARGUMENT,
                             "export %" PRIu64 " is of model '%s', not '%s'", s->id, s->m->name,
                             q->model);
    } else if (!q->length && q->close) {
      /* A close alone: an empty range, and the export released. */
      send_range(srv, r, s, 0, 0, true);
    } else {
      send_range(srv, r, s, q->offset, q->length, q->close);
    }
    session_release(s);
    return;
  }
  srv_model *m = grove__registry_find(srv, q->model);
  if (!m) {
    grove__rpc_reply_error(r, GROVE_E_NOT_FOUND, "model '%s' is not served here",
                           q->model ? q->model : "");
    return;
  }
  if (q->format != GROVE_CKPT_SAFETENSORS && q->format != GROVE_CKPT_TORCH_ZIP) {
    grove__rpc_reply_error(r, GROVE_E_INVALID_ARGUMENT,
                           "format %d: export writes 1 (safetensors) or 2 (torch.save zip, .pt)",
                           q->format);
    return;
  }
  if (q->archive_name && strchr(q->archive_name, '/')) {
    grove__rpc_reply_error(r, GROVE_E_INVALID_ARGUMENT,
                           "archive_name '%s': a folder name, without '/'", q->archive_name);
    return;
  }
  if (atomic_load(&srv->draining)) {
    grove__rpc_reply_error(r, GROVE_E_UNAVAILABLE, "groved is shutting down; export refused");
    return;
  }
  ojob *j = calloc(1, sizeof *j);
  if (j) {
    j->srv = srv;
    j->r = r;
    j->m = m;
    j->format = q->format;
    j->offset = q->offset;
    j->length = q->length;
    j->close = q->close;
    j->t0 = grove__now_ns();
    j->prefix = q->prefix && *q->prefix ? strdup(q->prefix) : NULL;
    j->archive = q->archive_name && *q->archive_name ? strdup(q->archive_name) : NULL;
  }
  if (!j || (q->prefix && *q->prefix && !j->prefix) ||
      (q->archive_name && *q->archive_name && !j->archive) ||
      !grove__loopjob_post(srv, open_on_loop, open_cancel, j)) {
    ojob_free(j);
    grove__rpc_reply_error(r, GROVE_E_NOMEM, "out of memory starting the export");
  }
}

/* ================================================================ lifetime */

static void on_sweep(uv_timer_t *t) {
  srv_server *srv = t->data;
  struct srv_exports *x = srv->exports;
  int64_t now = grove__now_ns();
  session *expired = NULL;
  pthread_mutex_lock(&x->mu);
  for (session **pp = &x->head; *pp;) {
    session *s = *pp;
    if (now - atomic_load(&s->last_used) > (int64_t)IDLE_S * 1000000000) {
      *pp = s->next;
      x->n--;
      s->next = expired;
      expired = s;
    } else {
      pp = &s->next;
    }
  }
  pthread_mutex_unlock(&x->mu);
  while (expired) {
    session *s = expired;
    expired = s->next;
    atomic_fetch_sub(&x->open, 1);
    grove__slog(GROVE_LOG_INFO, "export.expired",
                "export %" PRIu64 " of model %s version %" PRId64 " idle for %d s: released", s->id,
                s->m->name, s->v->number, IDLE_S);
    session_release(s);
  }
}

grove_status grove__export_start(srv_server *srv, grove_err *err) {
  struct srv_exports *x = calloc(1, sizeof *x);
  if (!x) return grove_err_set(err, GROVE_E_NOMEM, "out of memory");
  srv->exports = x;
  pthread_mutex_init(&x->mu, NULL);
  grove__rpc_set_handler(srv, GROVE__REQUEST__BODY_EXPORT_STATE_DICT, grove__export_handle, false);
  grove__metrics_add_family(srv, grove__export_metrics);
  /* Ids differ from one run to the next, so an id from before a restart is
   * not mistaken for a new export. */
  x->next_id = ((uint64_t)grove__now_ns() << 16) | 1;
  x->counts = calloc(srv->nmodels ? srv->nmodels : 1, sizeof *x->counts);
  if (!x->counts) return grove_err_set(err, GROVE_E_NOMEM, "out of memory");
  uv_timer_init(&srv->loop, &x->sweep);
  x->sweep.data = srv;
  x->sweep_init = true;
  uv_timer_start(&x->sweep, on_sweep, SWEEP_MS, SWEEP_MS);
  return GROVE_OK;
}

static void on_closed(uv_handle_t *h) {
  (void)h;
}

void grove__export_close(srv_server *srv) {
  struct srv_exports *x = srv->exports;
  if (x && x->sweep_init && !uv_is_closing((uv_handle_t *)&x->sweep))
    uv_close((uv_handle_t *)&x->sweep, on_closed);
}

void grove__export_free(srv_server *srv) {
  struct srv_exports *x = srv->exports;
  if (!x) return;
  for (session *s = x->head, *next; s; s = next) {
    next = s->next;
    session_release(s);
  }
  free(x->counts);
  pthread_mutex_destroy(&x->mu);
  free(x);
  srv->exports = NULL;
}

/* ================================================================ metrics */

void grove__export_metrics(srv_server *srv, srv_text *b) {
  struct srv_exports *x = srv->exports;
  if (!x) return;
  char lab[512];
  grove__text_printf(b,
                     "# HELP grove_exports_total state_dict exports started, by model and result "
                     "(ok: the file was planned and its first range sent; failed: refused or "
                     "could not be planned).\n"
                     "# TYPE grove_exports_total counter\n");
  for (size_t i = 0; i < srv->nmodels; i++) {
    grove__prom_label(srv->models[i].name, lab, sizeof lab);
    grove__text_printf(b, "grove_exports_total{model=\"%s\",result=\"ok\"} %" PRIu64 "\n", lab,
                       atomic_load(&x->counts[i].ok));
    grove__text_printf(b, "grove_exports_total{model=\"%s\",result=\"failed\"} %" PRIu64 "\n", lab,
                       atomic_load(&x->counts[i].failed));
  }
  grove__text_printf(b,
                     "# HELP grove_export_bytes_total File bytes sent by exports.\n"
                     "# TYPE grove_export_bytes_total counter\n");
  for (size_t i = 0; i < srv->nmodels; i++)
    grove__text_printf(b, "grove_export_bytes_total{model=\"%s\"} %" PRIu64 "\n",
                       grove__prom_label(srv->models[i].name, lab, sizeof lab),
                       atomic_load(&x->counts[i].bytes));
  grove__text_printf(b,
                     "# HELP grove_exports_open Exports open now (each pins the version it "
                     "exports).\n"
                     "# TYPE grove_exports_open gauge\ngrove_exports_open %" PRId64 "\n",
                     atomic_load(&x->open));
}
