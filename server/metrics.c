/* metrics.c: counters and histograms (atomics: any thread bumps them, the
 * HTTP thread reads them), the Prometheus text exposition (format 0.0.4:
 * the text buffer, label escaping, the one histogram renderer) and the
 * table of metric families, which their owners fill in at start (status.c
 * first; this file renders them in that order and calls no feature).
 * docs/operations.md lists every metric. */
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

void grove__metrics_count(srv_metrics *m, srv_proto p, grove_status s) {
  unsigned i = (unsigned)s < SRV_NSTATUS ? (unsigned)s : SRV_NSTATUS - 1;
  atomic_fetch_add_explicit(&m->requests[p][i], 1, memory_order_relaxed);
}

const char *grove__proto_label(srv_proto p) {
  return p == SRV_PROTO_OIP ? "oip" : "grove";
}

void grove__metrics_answer(srv_server *srv, const srv_req *r, grove_status s) {
  srv_proto p = r->origin ? r->origin->protocol : SRV_PROTO_GROVE;
  if (r->counted) grove__metrics_count(r->model ? &r->model->metrics : &srv->unrouted, p, s);
  if (r->accepted)
    grove__hist_observe_ns(&r->model->metrics.total_lat[p], grove__now_ns() - r->t_recv);
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

void grove__text_append(srv_text *b, const void *p, size_t n) {
  if (b->oom || n == 0) return;
  if (b->cap - b->len < n + 1) {
    size_t cap = b->cap * 2 + n + 256;
    char *g = cap > b->cap ? realloc(b->p, cap) : NULL;
    if (!g) {
      b->oom = true;
      return;
    }
    b->p = g;
    b->cap = cap;
  }
  memcpy(b->p + b->len, p, n);
  b->len += n;
  b->p[b->len] = 0;
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

void grove__prom_histogram(srv_text *b, const char *name, const char *labels, const double *le,
                           int nb, const _Atomic uint64_t *buckets, double sum) {
  uint64_t cum = 0;
  for (int i = 0; i < nb; i++) {
    cum += atomic_load_explicit(&buckets[i], memory_order_relaxed);
    grove__text_printf(b, "%s_bucket{%s,le=\"%g\"} %" PRIu64 "\n", name, labels, le[i], cum);
  }
  cum += atomic_load_explicit(&buckets[nb], memory_order_relaxed);
  grove__text_printf(b, "%s_bucket{%s,le=\"+Inf\"} %" PRIu64 "\n", name, labels, cum);
  grove__text_printf(b, "%s_sum{%s} %.9g\n", name, labels, sum);
  /* _count equals the +Inf bucket, as the format requires, even while other
   * threads are observing. */
  grove__text_printf(b, "%s_count{%s} %" PRIu64 "\n", name, labels, cum);
}

static void hist_lines(srv_text *b, const char *name, const char *labels, const srv_hist *h,
                       const int64_t *bounds, int nb, double scale) {
  double le[SRV_LAT_BUCKETS > SRV_BATCH_BUCKETS ? SRV_LAT_BUCKETS : SRV_BATCH_BUCKETS];
  for (int i = 0; i < nb; i++) le[i] = (double)bounds[i] * scale;
  grove__prom_histogram(b, name, labels, le, nb, h->buckets,
                        (double)atomic_load_explicit(&h->sum, memory_order_relaxed) * scale);
}

void grove__hist_render(srv_text *b, const char *name, const char *labels, const srv_hist *h,
                        bool rows) {
  if (rows)
    hist_lines(b, name, labels, h, batch_bounds, SRV_BATCH_BUCKETS, 1.0);
  else
    hist_lines(b, name, labels, h, lat_bounds_ns, SRV_LAT_BUCKETS, 1e-9);
}

grove_status grove__metrics_render(srv_server *srv, char **out, size_t *len) {
  srv_text b = {0};
  b.cap = 16384;
  if (!(b.p = malloc(b.cap))) return GROVE_E_NOMEM;
  b.p[0] = 0;
  /* Every family is rendered by its owner, registered at start: groved's
   * own and its models' (status.c), then hot reload, export, hooks and
   * connections, in that order. */
  size_t nf = atomic_load_explicit(&srv->nfamilies, memory_order_acquire);
  for (size_t i = 0; i < nf; i++) srv->families[i](srv, &b);

  if (b.oom) {
    free(b.p);
    return GROVE_E_NOMEM;
  }
  *out = b.p;
  *len = b.len;
  return GROVE_OK;
}

void grove__metrics_add_family(srv_server *srv, srv_metrics_fn fn) {
  size_t n = atomic_load_explicit(&srv->nfamilies, memory_order_relaxed);
  /* Our bug if not: every owner registers once, at start. */
  if (n >= SRV_MAX_FAMILIES) abort();
  srv->families[n] = fn;
  /* The HTTP thread may be rendering already (conns.c registers after
   * grove__http_start): the entry is written before the count says so. */
  atomic_store_explicit(&srv->nfamilies, n + 1, memory_order_release);
}
