/* lifecycle.c: groved's life, the one owner of its start order, signals,
 * drain and stop.
 *
 * Start-up order: the connection budget (before any model opens a file),
 * the admin plane's configuration, the models, the loop, the batcher's
 * hold timer, the signals, the
 * loop-job queue, the features (reload, export, training, workers,
 * telemetry), the RPC sockets and their listeners (NNG's, or sp.c's on the
 * loop), HTTP, the idle sweeper; then the loop runs until SIGTERM/SIGINT has drained
 * everything.  Each part's start registers what the layers below it call
 * back (RPC handlers, metric families), so that rpc.c, metrics.c and loop.c
 * never call a feature by name.
 *
 * The drain (SIGTERM/SIGINT): new predicts get UNAVAILABLE, the queued ones
 * are answered; once nothing is queued, running, in flight, being sent or
 * in a loop job, the loop's handles close and uv_run returns.  After
 * --drain-timeout the same happens anyway, with exit status 1.  Loop thread,
 * but for grove__server_run's own start and clean-up (the main thread,
 * before and after the loop runs).
 *
 * Layer: the top one below main.c (docs/architecture.md, "server/"). */
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>

#include "server.h"

/* ------------------------------------------------------------ drain */

static void on_closed(uv_handle_t *h) {
  (void)h;
}

/* Everything answered and sent: stop NNG, then close the loop's handles so
 * that uv_run returns. */
static void shut_down(srv_server *srv) {
  grove__workers_stop(srv);
  /* Training threads may still be answering through NNG: join them before
   * the sockets and their contexts go. */
  grove__training_stop(srv);
  grove__sp_stop(srv);
  grove__rpc_stop(srv);
  grove__loopjob_close(srv);
  grove__reload_close(srv);
  grove__export_close(srv);
  grove__loop_stop(srv);
  uv_close((uv_handle_t *)&srv->sig_term, on_closed);
  uv_close((uv_handle_t *)&srv->sig_int, on_closed);
  uv_close((uv_handle_t *)&srv->sig_hup, on_closed);
  grove__batcher_stop(srv);
  uv_close((uv_handle_t *)&srv->drain_timer, on_closed);
}

static bool quiescent(srv_server *srv) {
  return grove__batcher_idle(srv) && atomic_load(&srv->inflight) == 0 &&
         atomic_load(&srv->sending) == 0 && grove__loopjob_idle(srv);
}

static void check_drained(srv_server *srv) {
  if (srv->stopped || !quiescent(srv)) return;
  srv->stopped = true;
  grove__slog(GROVE_LOG_INFO, "server.drained", "every queued request is answered; exiting");
  shut_down(srv);
}

/* How long the replies to the requests a timed-out drain answered get to go
 * out before the sockets close. */
#define DRAIN_REPLY_GRACE_MS 200

static void on_drain_timeout(uv_timer_t *t) {
  srv_server *srv = t->data;
  if (srv->stopped) return;
  if (!srv->drain_expired) {
    /* First the queued requests, which nothing computes any more, hear why;
     * what is computing gets the grace too, then the sockets close. */
    srv->drain_expired = true;
    srv->exit_code = 1;
    size_t n = grove__batcher_fail_queued(srv, srv->cfg.drain_timeout_ms);
    grove__slog(GROVE_LOG_ERROR, "server.drain_timeout",
                "the drain passed %d ms: %zu queued requests answered UNAVAILABLE; "
                "exiting in %d ms",
                srv->cfg.drain_timeout_ms, n, DRAIN_REPLY_GRACE_MS);
    uv_timer_start(&srv->drain_timer, on_drain_timeout, DRAIN_REPLY_GRACE_MS, 0);
    check_drained(srv);
    return;
  }
  srv->stopped = true;
  grove__slog(GROVE_LOG_ERROR, "server.drain_timeout",
              "still %" PRId64 " requests unanswered and %" PRId64
              " replies unsent after %d ms; "
              "exiting anyway",
              atomic_load(&srv->inflight), atomic_load(&srv->sending),
              srv->cfg.drain_timeout_ms + DRAIN_REPLY_GRACE_MS);
  shut_down(srv);
}

/* Starts the drain (SIGTERM, SIGINT). */
static void drain(srv_server *srv) {
  if (atomic_exchange(&srv->draining, true)) {
    grove__slog(GROVE_LOG_WARN, "server.drain_again",
                "already draining (%" PRId64 " requests in flight)", atomic_load(&srv->inflight));
    return;
  }
  grove__slog(GROVE_LOG_INFO, "server.drain",
              "draining: %" PRId64 " requests in flight are answered, new ones get UNAVAILABLE",
              atomic_load(&srv->inflight));
  uv_timer_start(&srv->drain_timer, on_drain_timeout, (uint64_t)srv->cfg.drain_timeout_ms, 0);
  grove__batcher_schedule(srv);
  check_drained(srv);
}

/* ------------------------------------------------------------ the loop's events */

/* The inbox's wake-up (loop.c): predicts and finished batches for the
 * batcher, then whatever waits on idle workers, then the drain. */
static void on_wake(srv_server *srv) {
  grove__batcher_take_inbox(srv);
  if (!srv->stopped) grove__reload_poll(srv); /* an in-place reload waiting for idle workers */
  if (!srv->stopped) grove__batcher_schedule(srv);
  if (atomic_load(&srv->draining)) check_drained(srv);
}

static void on_signal(uv_signal_t *h, int signum) {
  srv_server *srv = h->data;
  if (signum == SIGHUP) {
    grove__reload_all(srv, "SIGHUP");
    return;
  }
  grove__slog(GROVE_LOG_INFO, "server.signal", "%s received",
              signum == SIGTERM ? "SIGTERM" : "SIGINT");
  drain(srv);
}

static grove_status signals_init(srv_server *srv, grove_err *err) {
  uv_timer_init(&srv->loop, &srv->drain_timer);
  srv->drain_timer.data = srv;
  uv_signal_t *sigs[] = {&srv->sig_term, &srv->sig_int, &srv->sig_hup};
  int nums[] = {SIGTERM, SIGINT, SIGHUP};
  for (int i = 0; i < 3; i++) {
    uv_signal_init(&srv->loop, sigs[i]);
    sigs[i]->data = srv;
    int rv = uv_signal_start(sigs[i], on_signal, nums[i]);
    if (rv) return grove_err_set(err, GROVE_E_INTERNAL, "uv_signal_start: %s", uv_strerror(rv));
  }
  return GROVE_OK;
}

/* ------------------------------------------------------------ start, run, stop */

/* What rpc.c calls back that is no feature's: waking the loop so that the
 * drain re-checks when a reply went out. */
static grove_status rpc_hooks(srv_server *srv, grove_err *err) {
  (void)err;
  grove__rpc_set_wake(srv, grove__loop_wake);
  return GROVE_OK;
}

/* Weights from which one forward over every core beats a forward per core
 * (settle_threads): well past a core's L2 (1-2 MB on the servers groved
 * runs on), concurrent forwards each stream all of the weights from L3 or
 * memory, where one forward's threads share them out. */
#define SPLIT_WEIGHT_BYTES (1u << 20)

/* Neither --workers nor --blas-threads: one worker whose forwards use every
 * core when every loaded model's weights reach SPLIT_WEIGHT_BYTES, else
 * (forwards too small to split well, where a second worker overlaps one
 * batch's replies with the next forward) a worker per core.  Measured on
 * the 2-core VMs (docs/performance.md, "One worker over every core"): the
 * reference MLP's 7.4 MB served 32 clients 30% faster on one worker x 2
 * threads than on two x 1, and a lone request's forward took half the
 * time; a 100 KB MLP went 40% slower.  Every model, not the largest: the
 * workers are shared, and a small model served beside a large one lost a
 * third of its rate on one worker (bench/hooks_bench.sh), where the large
 * one on two workers still gains from the batch hold.  Main thread, before
 * the workers start. */
static void settle_threads(srv_server *srv) {
  if (!srv->threads_auto) return;
  size_t loaded = 0, small = 0;
  for (size_t i = 0; i < srv->nmodels; i++) {
    if (!srv->models[i].current) continue;
    loaded++;
    small += srv->models[i].current->model->weight_bytes < SPLIT_WEIGHT_BYTES;
  }
  int cores = grove_available_cores();
  if (!loaded || small || cores < 2) return;
  srv->workers = 1;
  srv->blas_threads = cores;
  grove_set_compute_threads(cores);
}

int grove__server_run(srv_server *srv) {
  int rc;
  srv->hold_fd = -1;
  grove_err err = {0};
  /* Before the models open their files: the descriptor budget is set first. */
  grove_status s = grove__conns_init(srv, &err);
  if (s) {
    grove__slog(GROVE_LOG_ERROR, "server.start_failed", "%s", grove_err_msg(&err));
    rc = 1;
    goto out;
  }
  s = grove__admin_plane_init(srv, &err);
  if (!s) s = grove__registry_load(srv, &err);
  if (s) {
    grove__slog(GROVE_LOG_ERROR, "server.config", "%s", grove_err_msg(&err));
    rc = s == GROVE_E_INVALID_ARGUMENT ? 2 : 1;
    goto out;
  }
  settle_threads(srv);
  if (srv->nmodels == 0)
    grove__slog(GROVE_LOG_WARN, "server.no_models",
                "no model configured (--model, --model-repo): every predict gets NOT_FOUND");
  if ((s = grove__loop_init(srv, on_wake, &err)) || (s = grove__batcher_init(srv, &err)) ||
      (s = signals_init(srv, &err)) || (s = grove__loopjob_start(srv, &err)) ||
      (s = rpc_hooks(srv, &err)) || (s = grove__predict_start(srv, &err)) ||
      (s = grove__status_start(srv, &err)) || (s = grove__reload_start(srv, &err)) ||
      (s = grove__export_start(srv, &err)) || (s = grove__training_start(srv, &err)) ||
      (s = grove__workers_start(srv, &err)) || (s = grove__telemetry_start(srv, &err)) ||
      (s = grove__telemetry_rpc_start(srv, &err)) || (s = grove__rpc_start(srv, &err)) ||
      (s = grove__admin_plane_listen(srv, &err)) || (s = grove__rpc_serve(srv, &err)) ||
      (s = grove__sp_start(srv, &err)) || (s = grove__oip_start(srv, &err)) ||
      (s = grove__http_start(srv, &err)) || (s = grove__conns_start(srv, &err))) {
    grove__slog(GROVE_LOG_ERROR, "server.start_failed", "%s", grove_err_msg(&err));
    rc = 1;
    goto out;
  }
  size_t loaded = 0;
  for (size_t i = 0; i < srv->nmodels; i++) loaded += srv->models[i].current != NULL;
  grove__slog(GROVE_LOG_INFO, "server.ready",
              "serving %zu of %zu models with %d worker%s x %d compute thread%s, %s kernel%s",
              loaded, srv->nmodels, srv->workers, srv->workers == 1 ? "" : "s", srv->blas_threads,
              srv->blas_threads == 1 ? "" : "s", grove_compute_kernel(),
              loaded == srv->nmodels ? "" : " (not ready: see model.load_failed)");
  uv_run(&srv->loop, UV_RUN_DEFAULT);
  rc = srv->exit_code;
  grove__slog(GROVE_LOG_INFO, "server.exit", "exit %d", rc);

out:
  srv->exit_code = rc; /* what a close that hangs exits with (grove__nng_close_or_exit) */
  grove__workers_stop(srv);
  grove__training_stop(srv);
  grove__conns_stop(srv);
  grove__rpc_stop(srv);
  grove__http_stop(srv);
  grove__telemetry_stop(srv);
  grove__loop_close(srv);
  grove__sp_free(srv);
  grove__batcher_close(srv);
  grove__workers_free(srv);
  grove__telemetry_free(srv);
  grove__export_free(srv);
  grove__training_free(srv);
  grove__reload_free(srv);
  grove__loopjob_free(srv);
  grove__registry_free(srv);
  grove__admin_plane_free(srv);
  grove__conns_free(srv);
  return rc;
}
