/* metrics.c: counters and histograms (atomics: any thread bumps them, the
 * HTTP thread reads them) and their Prometheus text exposition (format
 * 0.0.4).  docs/operations.md lists every metric. */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server.h"

/* Latency bucket bounds in ns: 50 us .. 5 s. */
static const int64_t lat_bounds_ns[SRV_LAT_BUCKETS] = {
    50000,    100000,   250000,    500000,    1000000,   2500000,    5000000,    10000000,
    25000000, 50000000, 100000000, 250000000, 500000000, 1000000000, 2500000000, 5000000000};
static const int64_t batch_bounds[SRV_BATCH_BUCKETS] = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512};

static void observe(srv_hist *h, const int64_t *bounds, int nb, int64_t v) {
  if (v < 0) v = 0;
  int i = 0;
  while (i < nb && v > bounds[i]) i++;
  atomic_fetch_add_explicit(&h->buckets[i], 1, memory_order_relaxed);
  atomic_fetch_add_explicit(&h->count, 1, memory_order_relaxed);
  atomic_fetch_add_explicit(&h->sum, (uint64_t)v, memory_order_relaxed);
}

void grove__hist_observe_ns(srv_hist *h, int64_t ns) {
  observe(h, lat_bounds_ns, SRV_LAT_BUCKETS, ns);
}

void grove__hist_observe_rows(srv_hist *h, int64_t rows) {
  observe(h, batch_bounds, SRV_BATCH_BUCKETS, rows);
}

void grove__metrics_count(srv_metrics *m, grove_status s) {
  unsigned i = (unsigned)s < SRV_NSTATUS ? (unsigned)s : SRV_NSTATUS - 1;
  atomic_fetch_add_explicit(&m->requests[i], 1, memory_order_relaxed);
}

const char *grove__status_label(grove_status s) {
  const char *n = grove_status_name(s);
  if (strncmp(n, "GROVE_E_", 8) == 0) return n + 8;
  if (strncmp(n, "GROVE_", 6) == 0) return n + 6;
  return n;
}

/* ------------------------------------------------------------ text */

void grove__text_printf(srv_text *b, const char *fmt, ...) {
  if (b->oom) return;
  for (;;) {
    va_list ap;
    va_start(ap, fmt);
    /* Before the first allocation p is NULL: measure only. */
    int n = vsnprintf(b->p ? b->p + b->len : NULL, b->p ? b->cap - b->len : 0, fmt, ap);
    va_end(ap);
    if (n < 0) {
      b->oom = true;
      return;
    }
    if (b->p && (size_t)n < b->cap - b->len) {
      b->len += (size_t)n;
      return;
    }
    size_t cap = b->cap * 2 + (size_t)n + 256;
    char *g = realloc(b->p, cap);
    if (!g) {
      b->oom = true;
      return;
    }
    b->p = g;
    b->cap = cap;
  }
}

const char *grove__prom_label(const char *s, char *buf, size_t n) {
  size_t j = 0;
  for (; *s && j + 3 < n; s++) {
    if (*s == '\\' || *s == '"') {
      buf[j++] = '\\';
      buf[j++] = *s;
    } else if (*s == '\n') {
      buf[j++] = '\\';
      buf[j++] = 'n';
    } else {
      buf[j++] = *s;
    }
  }
  buf[j] = 0;
  return buf;
}

static void hist_lines(srv_text *b, const char *name, const char *label, const srv_hist *h,
                       const int64_t *bounds, int nb, double scale) {
  uint64_t cum = 0;
  for (int i = 0; i < nb; i++) {
    cum += atomic_load_explicit(&h->buckets[i], memory_order_relaxed);
    grove__text_printf(b, "%s_bucket{model=\"%s\",le=\"%g\"} %" PRIu64 "\n", name, label,
                       (double)bounds[i] * scale, cum);
  }
  cum += atomic_load_explicit(&h->buckets[nb], memory_order_relaxed);
  grove__text_printf(b, "%s_bucket{model=\"%s\",le=\"+Inf\"} %" PRIu64 "\n", name, label, cum);
  grove__text_printf(b, "%s_sum{model=\"%s\"} %.9g\n", name, label,
                     (double)atomic_load_explicit(&h->sum, memory_order_relaxed) * scale);
  /* _count equals the +Inf bucket, as the format requires, even while other
   * threads are observing. */
  grove__text_printf(b, "%s_count{model=\"%s\"} %" PRIu64 "\n", name, label, cum);
}

static void requests_lines(srv_text *b, const char *label, const srv_metrics *m, bool always_ok) {
  for (unsigned s = 0; s < SRV_NSTATUS; s++) {
    uint64_t v = atomic_load_explicit(&m->requests[s], memory_order_relaxed);
    if (v == 0 && !(s == 0 && always_ok)) continue;
    grove__text_printf(b, "grove_requests_total{model=\"%s\",status=\"%s\"} %" PRIu64 "\n", label,
                       grove__status_label((grove_status)s), v);
  }
}

typedef enum { H_QUEUE, H_COMPUTE, H_TOTAL, H_BATCH } hist_kind;

static const srv_hist *pick(const srv_metrics *m, hist_kind k) {
  switch (k) {
    case H_QUEUE:
      return &m->queue_lat;
    case H_COMPUTE:
      return &m->compute_lat;
    case H_TOTAL:
      return &m->total_lat;
    case H_BATCH:
      return &m->batch_size;
  }
  return NULL;
}

grove_status grove__metrics_render(srv_server *srv, char **out, size_t *len) {
  srv_text b = {0};
  b.cap = 16384;
  if (!(b.p = malloc(b.cap))) return GROVE_E_NOMEM;
  b.p[0] = 0;
  char lab[512];

  grove__text_printf(&b,
                     "# HELP grove_build_info groved's version.\n# TYPE grove_build_info gauge\n"
                     "grove_build_info{version=\"%s\"} 1\n",
                     GROVE_VERSION);
  grove__text_printf(&b,
                     "# HELP grove_uptime_seconds Seconds since groved started.\n"
                     "# TYPE grove_uptime_seconds gauge\ngrove_uptime_seconds %.3f\n",
                     (double)(grove__now_ns() - srv->t_start) / 1e9);
  grove__text_printf(&b,
                     "# HELP grove_ready 1 when every configured model is loaded and groved is not "
                     "draining.\n# TYPE grove_ready gauge\ngrove_ready %d\n",
                     grove__registry_ready(srv) && !atomic_load(&srv->draining));
  grove__text_printf(&b,
                     "# HELP grove_draining 1 after SIGTERM/SIGINT, while queued requests are "
                     "answered.\n# TYPE grove_draining gauge\ngrove_draining %d\n",
                     (int)atomic_load(&srv->draining));
  grove__text_printf(&b,
                     "# HELP grove_workers Worker threads.\n# TYPE grove_workers gauge\n"
                     "grove_workers %d\n",
                     srv->workers);
  grove__text_printf(&b,
                     "# HELP grove_blas_threads Compute threads per forward.\n"
                     "# TYPE grove_blas_threads gauge\ngrove_blas_threads %d\n",
                     srv->blas_threads);
  grove__text_printf(
      &b,
      "# HELP grove_inflight_requests Predict requests accepted and not yet "
      "answered.\n# TYPE grove_inflight_requests gauge\ngrove_inflight_requests %" PRId64 "\n",
      atomic_load(&srv->inflight));

  grove__text_printf(
      &b,
      "# HELP grove_requests_total Requests answered, by model and status (model=\"\": "
      "the request named no served model or could not be decoded).\n"
      "# TYPE grove_requests_total counter\n");
  for (size_t i = 0; i < srv->nmodels; i++)
    requests_lines(&b, grove__prom_label(srv->models[i].name, lab, sizeof lab),
                   &srv->models[i].metrics, true);
  requests_lines(&b, "", &srv->unrouted, false);

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
    grove__text_printf(&b, "# HELP %s %s\n# TYPE %s histogram\n", hists[k].name, hists[k].help,
                       hists[k].name);
    for (size_t i = 0; i < srv->nmodels; i++) {
      const srv_hist *h = pick(&srv->models[i].metrics, hists[k].kind);
      grove__prom_label(srv->models[i].name, lab, sizeof lab);
      if (hists[k].kind == H_BATCH)
        hist_lines(&b, hists[k].name, lab, h, batch_bounds, SRV_BATCH_BUCKETS, 1.0);
      else
        hist_lines(&b, hists[k].name, lab, h, lat_bounds_ns, SRV_LAT_BUCKETS, 1e-9);
    }
  }

  grove__text_printf(&b,
                     "# HELP grove_queue_depth Predict requests waiting in the model's queue.\n"
                     "# TYPE grove_queue_depth gauge\n");
  for (size_t i = 0; i < srv->nmodels; i++)
    grove__text_printf(&b, "grove_queue_depth{model=\"%s\"} %" PRIu64 "\n",
                       grove__prom_label(srv->models[i].name, lab, sizeof lab),
                       atomic_load(&srv->models[i].queue_depth));
  grove__text_printf(&b,
                     "# HELP grove_model_version The version serving (0: not loaded).\n"
                     "# TYPE grove_model_version gauge\n");
  for (size_t i = 0; i < srv->nmodels; i++)
    grove__text_printf(&b, "grove_model_version{model=\"%s\"} %" PRId64 "\n",
                       grove__prom_label(srv->models[i].name, lab, sizeof lab),
                       atomic_load(&srv->models[i].version_number));
  grove__text_printf(&b,
                     "# HELP grove_model_ready 1 when the model is loaded and serving.\n"
                     "# TYPE grove_model_ready gauge\n");
  for (size_t i = 0; i < srv->nmodels; i++)
    grove__text_printf(&b, "grove_model_ready{model=\"%s\"} %d\n",
                       grove__prom_label(srv->models[i].name, lab, sizeof lab),
                       atomic_load(&srv->models[i].version_number) > 0);

  /* Hot reload, export and hooks render their own families (reload.c,
   * export.c, telemetry_rpc.c). */
  grove__reload_metrics(srv, &b);
  grove__export_metrics(srv, &b);
  grove__telemetry_metrics(srv, &b);
  grove__conns_metrics(srv, &b);

  if (b.oom) {
    free(b.p);
    return GROVE_E_NOMEM;
  }
  *out = b.p;
  *len = b.len;
  return GROVE_OK;
}
