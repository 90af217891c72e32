/* http.c: groved's HTTP endpoints on NNG's HTTP server (--http HOST:PORT).
 *
 *   GET /healthz   200 "ok": the process is up and its loop answers HTTP
 *   GET /readyz    200 "ready" when every configured model is loaded and
 *                  groved is not draining; otherwise 503 with one line per
 *                  reason ("model digits: not loaded: ...", "draining")
 *   GET /metrics   Prometheus text (metrics.c)
 *
 * Handlers run on NNG's threads and read only atomics and the immutable
 * model table, so they never wait for the loop: /metrics answers even when
 * the loop is busy. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <nng/nng.h>
#include <nng/supplemental/http/http.h>

#include "server.h"

static srv_server *server_of(nng_aio *aio) {
  nng_http_handler *h = nng_aio_get_input(aio, 1);
  return nng_http_handler_get_data(h);
}

static void respond(nng_aio *aio, uint16_t code, const char *ctype, const char *body, size_t len) {
  nng_http_res *res;
  int rv = nng_http_res_alloc(&res);
  if (rv) {
    nng_aio_finish(aio, rv);
    return;
  }
  if ((rv = nng_http_res_set_status(res, code)) ||
      (rv = nng_http_res_set_header(res, "Content-Type", ctype)) ||
      (rv = nng_http_res_copy_data(res, body, len))) {
    nng_http_res_free(res);
    nng_aio_finish(aio, rv);
    return;
  }
  nng_aio_set_output(aio, 0, res);
  nng_aio_finish(aio, 0);
}

static void on_healthz(nng_aio *aio) {
  respond(aio, 200, "text/plain; charset=utf-8", "ok\n", 3);
}

static void on_readyz(nng_aio *aio) {
  srv_server *srv = server_of(aio);
  char body[8192];
  size_t used = 0;
  bool ready = true;
  for (size_t i = 0; i < srv->nmodels; i++) {
    srv_model *m = &srv->models[i];
    if (atomic_load(&m->version_number) > 0) continue;
    ready = false;
    int w = snprintf(body + used, sizeof body - used, "model %s: not loaded: %s\n", m->name,
                     m->error ? m->error : "unknown error");
    if (w > 0) used += (size_t)w < sizeof body - used ? (size_t)w : sizeof body - used - 1;
  }
  if (atomic_load(&srv->draining)) {
    ready = false;
    int w = snprintf(body + used, sizeof body - used, "draining: groved is shutting down\n");
    if (w > 0) used += (size_t)w < sizeof body - used ? (size_t)w : sizeof body - used - 1;
  }
  if (ready)
    respond(aio, 200, "text/plain; charset=utf-8", "ready\n", 6);
  else
    respond(aio, 503, "text/plain; charset=utf-8", body, used);
}

static void on_metrics(nng_aio *aio) {
  srv_server *srv = server_of(aio);
  char *text = NULL;
  size_t len = 0;
  if (grove__metrics_render(srv, &text, &len)) {
    respond(aio, 500, "text/plain; charset=utf-8", "out of memory\n", 14);
    return;
  }
  respond(aio, 200, "text/plain; version=0.0.4; charset=utf-8", text, len);
  free(text);
}

grove_status grove__http_start(srv_server *srv, grove_err *err) {
  if (!srv->cfg.http) return GROVE_OK;
  char url[512];
  snprintf(url, sizeof url, "http://%s", srv->cfg.http);
  nng_url *u = NULL;
  int rv = nng_url_parse(&u, url);
  if (rv)
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT, "--http %s: %s", srv->cfg.http,
                         nng_strerror(rv));
  nng_http_server *hs = NULL;
  rv = nng_http_server_hold(&hs, u);
  nng_url_free(u);
  if (rv) return grove_err_set(err, GROVE_E_IO, "--http %s: %s", srv->cfg.http, nng_strerror(rv));
  srv->http = hs;
  static const struct {
    const char *path;
    void (*cb)(nng_aio *);
  } routes[] = {{"/healthz", on_healthz}, {"/readyz", on_readyz}, {"/metrics", on_metrics}};
  for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++) {
    nng_http_handler *h;
    if ((rv = nng_http_handler_alloc(&h, routes[i].path, routes[i].cb)))
      return grove_err_set(err, GROVE_E_NOMEM, "HTTP handler: %s", nng_strerror(rv));
    nng_http_handler_set_data(h, srv, NULL);
    if ((rv = nng_http_server_add_handler(hs, h))) {
      nng_http_handler_free(h);
      return grove_err_set(err, GROVE_E_INTERNAL, "HTTP handler %s: %s", routes[i].path,
                           nng_strerror(rv));
    }
  }
  if ((rv = nng_http_server_start(hs)))
    return grove_err_set(err, GROVE_E_IO, "cannot serve HTTP on %s: %s", srv->cfg.http,
                         nng_strerror(rv));
  grove__slog(GROVE_LOG_INFO, "server.http", "HTTP on http://%s (/healthz /readyz /metrics)",
              srv->cfg.http);
  return GROVE_OK;
}

void grove__http_stop(srv_server *srv) {
  if (!srv->http) return;
  nng_http_server_stop(srv->http);
  nng_http_server_release(srv->http);
  srv->http = NULL;
}
