/* status.c: what groved says about itself and its models: the Status and
 * ModelMetadata RPCs, answered on the NNG thread that received them (rpc.c
 * hands them over through its handler table), and the first metric families
 * of /metrics (the HTTP thread renders them through metrics.c's table).
 *
 * Layer: a feature (docs/architecture.md, "server/"): it reads the models
 * (registry.c) and the admin plane's URLs (admin.c) and replies through
 * rpc.c. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "server.h"

typedef struct meta_tmp {
  Grove__IoSpec *specs;
  Grove__IoSpec **ptrs;
  Grove__Batching batching;
  srv_version *v;
} meta_tmp;

/* Fills md for m.  Strings point into m and its version, which tmp->v keeps
 * alive until meta_done. */
static bool meta_fill(srv_model *m, Grove__ModelMetadata *md, meta_tmp *tmp) {
  grove__model_metadata__init(md);
  memset(tmp, 0, sizeof *tmp);
  md->name = m->name;
  md->dir = m->dir;
  md->queue_depth = atomic_load(&m->queue_depth);
  srv_version *v = grove__model_acquire(m);
  tmp->v = v;
  if (!v) {
    md->ready = false;
    md->error = m->error ? m->error : "not loaded";
    return true;
  }
  const grove_model *gm = v->model;
  md->ready = true;
  md->version = v->number;
  md->param_count = gm->param_count;
  md->weight_bytes = gm->weight_bytes;
  md->dir = gm->dir ? gm->dir : m->dir; /* a reload may serve another directory */
  /* An in-place reload names its own weights file on the version. */
  md->weights_path = v->weights_path ? v->weights_path : gm->weights_path ? gm->weights_path : "";
  grove__batching__init(&tmp->batching);
  tmp->batching.max_batch_size = gm->batching.max_batch_size;
  tmp->batching.max_queue_delay_us = gm->batching.max_queue_delay_us;
  tmp->batching.max_queue_size = gm->batching.max_queue_size;
  md->batching = &tmp->batching;
  size_t n = gm->ninputs + gm->noutputs;
  if (n) {
    tmp->specs = calloc(n, sizeof *tmp->specs);
    tmp->ptrs = calloc(n, sizeof *tmp->ptrs);
    if (!tmp->specs || !tmp->ptrs) return false;
  }
  for (size_t i = 0; i < n; i++) {
    const grove_io_spec *sp = i < gm->ninputs ? &gm->inputs[i] : &gm->outputs[i - gm->ninputs];
    Grove__IoSpec *o = &tmp->specs[i];
    grove__io_spec__init(o);
    o->name = sp->name ? sp->name : "";
    o->dtype = (int32_t)sp->dtype;
    o->n_shape = (size_t)sp->ndim;
    o->shape = (int64_t *)sp->shape;
    tmp->ptrs[i] = o;
  }
  md->n_inputs = gm->ninputs;
  md->inputs = tmp->ptrs;
  md->n_outputs = gm->noutputs;
  md->outputs = tmp->ptrs ? tmp->ptrs + gm->ninputs : NULL;
  return true;
}

static void meta_done(meta_tmp *tmp) {
  free(tmp->specs);
  free(tmp->ptrs);
  grove__version_release(tmp->v);
}

static void reply_status(srv_req *r) {
  srv_server *srv = r->srv;
  Grove__StatusReply st = GROVE__STATUS_REPLY__INIT;
  st.server_version = GROVE_VERSION;
  st.protocol = GROVE__PROTOCOL_VERSION__PROTOCOL_VERSION;
  st.draining = atomic_load(&srv->draining);
  st.ready = grove__registry_ready(srv) && !st.draining;
  st.uptime_ms = (uint64_t)((grove__now_ns() - srv->t_start) / 1000000);
  st.workers = (uint32_t)srv->workers;
  st.blas_threads = (uint32_t)srv->blas_threads;
  st.inflight = (uint64_t)atomic_load(&srv->inflight);
  st.admin_listen = grove__admin_urls(srv, &st.n_admin_listen);
  st.listen = (char **)srv->cfg.listen;
  st.n_listen = srv->cfg.nlisten;
  size_t n = srv->nmodels;
  Grove__ModelMetadata *mds = n ? calloc(n, sizeof *mds) : NULL;
  Grove__ModelMetadata **ptrs = n ? calloc(n, sizeof *ptrs) : NULL;
  meta_tmp *tmps = n ? calloc(n, sizeof *tmps) : NULL;
  bool ok = !n || (mds && ptrs && tmps);
  size_t filled = 0;
  for (size_t i = 0; ok && i < n; i++) {
    ok = meta_fill(&srv->models[i], &mds[i], &tmps[i]);
    filled = i + 1;
    ptrs[i] = &mds[i];
  }
  if (ok) {
    st.n_models = n;
    st.models = ptrs;
    Grove__Reply rep = GROVE__REPLY__INIT;
    rep.protocol = GROVE__PROTOCOL_VERSION__PROTOCOL_VERSION;
    rep.id = r->id;
    rep.body_case = GROVE__REPLY__BODY_STATUS_REPLY;
    rep.status_reply = &st;
    grove__rpc_send(r, grove__rpc_pack(&rep), GROVE_OK);
  }
  for (size_t i = 0; i < filled; i++) meta_done(&tmps[i]);
  free(mds);
  free(ptrs);
  free(tmps);
  if (!ok) grove__rpc_reply_error(r, GROVE_E_NOMEM, "out of memory building the status reply");
}

static void reply_metadata(srv_req *r) {
  const char *name = r->msg->model_metadata->model;
  srv_model *m = grove__registry_find(r->srv, name);
  if (!m) {
    grove__rpc_reply_error(r, GROVE_E_NOT_FOUND, "model '%s' is not served here", name);
    return;
  }
  Grove__ModelMetadata md;
  meta_tmp tmp;
  if (!meta_fill(m, &md, &tmp)) {
    meta_done(&tmp);
    grove__rpc_reply_error(r, GROVE_E_NOMEM, "out of memory building the metadata reply");
    return;
  }
  Grove__Reply rep = GROVE__REPLY__INIT;
  rep.protocol = GROVE__PROTOCOL_VERSION__PROTOCOL_VERSION;
  rep.id = r->id;
  rep.body_case = GROVE__REPLY__BODY_MODEL_METADATA;
  rep.model_metadata = &md;
  grove__rpc_send(r, grove__rpc_pack(&rep), GROVE_OK);
  meta_done(&tmp);
}

/* ------------------------------------------------------------ /metrics */

static void requests_lines(srv_text *b, const char *label, const srv_metrics *m, bool always_ok) {
  for (int p = 0; p < SRV_NPROTO; p++)
    for (unsigned s = 0; s < SRV_NSTATUS; s++) {
      uint64_t v = atomic_load_explicit(&m->requests[p][s], memory_order_relaxed);
      if (v == 0 && !(s == 0 && always_ok)) continue;
      grove__text_printf(b,
                         "grove_requests_total{model=\"%s\",status=\"%s\",protocol=\"%s\"} %" PRIu64
                         "\n",
                         label, grove__status_label((grove_status)s),
                         grove__proto_label((srv_proto)p), v);
    }
}

typedef enum { H_QUEUE, H_COMPUTE, H_TOTAL, H_BATCH } hist_kind;

static const srv_hist *pick(const srv_metrics *m, hist_kind k, srv_proto p) {
  switch (k) {
    case H_QUEUE:
      return &m->queue_lat;
    case H_COMPUTE:
      return &m->compute_lat;
    case H_TOTAL:
      return &m->total_lat[p];
    case H_BATCH:
      return &m->batch_size;
  }
  return NULL;
}

/* groved's own families and its models' (docs/operations.md lists them),
 * the first of /metrics. */
static void server_metrics(srv_server *srv, srv_text *b) {
  char lab[512];

  grove__text_printf(b,
                     "# HELP grove_build_info groved's version.\n# TYPE grove_build_info gauge\n"
                     "grove_build_info{version=\"%s\"} 1\n",
                     GROVE_VERSION);
  grove__text_printf(b,
                     "# HELP grove_uptime_seconds Seconds since groved started.\n"
                     "# TYPE grove_uptime_seconds gauge\ngrove_uptime_seconds %.3f\n",
                     (double)(grove__now_ns() - srv->t_start) / 1e9);
  grove__text_printf(b,
                     "# HELP grove_ready 1 when every configured model is loaded and groved is not "
                     "draining.\n# TYPE grove_ready gauge\ngrove_ready %d\n",
                     grove__registry_ready(srv) && !atomic_load(&srv->draining));
  grove__text_printf(b,
                     "# HELP grove_draining 1 after SIGTERM/SIGINT, while queued requests are "
                     "answered.\n# TYPE grove_draining gauge\ngrove_draining %d\n",
                     (int)atomic_load(&srv->draining));
  grove__text_printf(b,
                     "# HELP grove_workers Worker threads.\n# TYPE grove_workers gauge\n"
                     "grove_workers %d\n",
                     srv->workers);
  grove__text_printf(b,
                     "# HELP grove_blas_threads Compute threads per forward.\n"
                     "# TYPE grove_blas_threads gauge\ngrove_blas_threads %d\n",
                     srv->blas_threads);
  grove__text_printf(
      b,
      "# HELP grove_inflight_requests Predict requests accepted and not yet "
      "answered.\n# TYPE grove_inflight_requests gauge\ngrove_inflight_requests %" PRId64 "\n",
      atomic_load(&srv->inflight));

  grove__text_printf(
      b,
      "# HELP grove_requests_total Requests answered, by model and status (model=\"\": "
      "the request named no served model or could not be decoded).\n"
      "# TYPE grove_requests_total counter\n");
  for (size_t i = 0; i < srv->nmodels; i++)
    requests_lines(b, grove__prom_label(srv->models[i].name, lab, sizeof lab),
                   &srv->models[i].metrics, true);
  requests_lines(b, "", &srv->unrouted, false);

  static const struct {
    const char *name, *help;
    hist_kind kind;
  } hists[] = {
      {"grove_queue_latency_seconds", "Time a predict waited in its model's queue.", H_QUEUE},
      {"grove_compute_latency_seconds", "Time of one batch's forward (one observation per batch).",
       H_COMPUTE},
      {"grove_request_latency_seconds", "Time from receiving a predict to sending its reply.",
       H_TOTAL},
      {"grove_batch_size", "Rows per batch.", H_BATCH},
  };
  for (size_t k = 0; k < sizeof hists / sizeof hists[0]; k++) {
    grove__text_printf(b, "# HELP %s %s\n# TYPE %s histogram\n", hists[k].name, hists[k].help,
                       hists[k].name);
    for (size_t i = 0; i < srv->nmodels; i++) {
      /* The request latency is the protocol's (its decoding and encoding
       * differ); queue, compute and batch are the batch's, whoever sent it. */
      int np = hists[k].kind == H_TOTAL ? SRV_NPROTO : 1;
      for (int p = 0; p < np; p++) {
        const srv_hist *h = pick(&srv->models[i].metrics, hists[k].kind, (srv_proto)p);
        char labels[600];
        grove__prom_label(srv->models[i].name, lab, sizeof lab);
        if (hists[k].kind == H_TOTAL)
          snprintf(labels, sizeof labels, "model=\"%s\",protocol=\"%s\"", lab,
                   grove__proto_label((srv_proto)p));
        else
          snprintf(labels, sizeof labels, "model=\"%s\"", lab);
        grove__hist_render(b, hists[k].name, labels, h, hists[k].kind == H_BATCH);
      }
    }
  }

  grove__text_printf(b,
                     "# HELP grove_queue_depth Predict requests waiting in the model's queue.\n"
                     "# TYPE grove_queue_depth gauge\n");
  for (size_t i = 0; i < srv->nmodels; i++)
    grove__text_printf(b, "grove_queue_depth{model=\"%s\"} %" PRIu64 "\n",
                       grove__prom_label(srv->models[i].name, lab, sizeof lab),
                       atomic_load(&srv->models[i].queue_depth));
  grove__text_printf(b,
                     "# HELP grove_model_version The version serving (0: not loaded).\n"
                     "# TYPE grove_model_version gauge\n");
  for (size_t i = 0; i < srv->nmodels; i++)
    grove__text_printf(b, "grove_model_version{model=\"%s\"} %" PRId64 "\n",
                       grove__prom_label(srv->models[i].name, lab, sizeof lab),
                       atomic_load(&srv->models[i].version_number));
  grove__text_printf(b,
                     "# HELP grove_model_ready 1 when the model is loaded and serving.\n"
                     "# TYPE grove_model_ready gauge\n");
  for (size_t i = 0; i < srv->nmodels; i++)
    grove__text_printf(b, "grove_model_ready{model=\"%s\"} %d\n",
                       grove__prom_label(srv->models[i].name, lab, sizeof lab),
                       atomic_load(&srv->models[i].version_number) > 0);
}

grove_status grove__status_start(srv_server *srv, grove_err *err) {
  (void)err;
  /* Neither is counted in grove_requests_total (predicts and garbage are). */
  grove__rpc_set_handler(srv, GROVE__REQUEST__BODY_STATUS, reply_status, false);
  grove__rpc_set_handler(srv, GROVE__REQUEST__BODY_MODEL_METADATA, reply_metadata, false);
  grove__metrics_add_family(srv, server_metrics);
  return GROVE_OK;
}
