/* main.c: groved, Grove's model server.
 *
 *   groved [--model-repo DIR] [--model [NAME=]DIR]... [--listen URL]...
 *          [--admin-listen URL|none]... [--admin-token-file FILE] [--checkpoint-dir DIR]...
 *          [--pub URL|none] [--http HOST:PORT|none] [--workers N] [--blas-threads N]
 *          [--log-level LEVEL] [--max-request-bytes N] [--drain-timeout SECONDS]
 *          [--watch] [--watch-debounce-ms N] [--reload-in-place] [--background-yield-us N]
 *          [--max-connections N] [--idle-timeout SECONDS] [--data-io loop|nng]
 *
 * Start-up order: flags, compute threads (before any model opens: opening
 * runs a trial forward), models, the loop, workers, the NNG socket, HTTP,
 * then the loop runs until SIGTERM/SIGINT has drained everything.
 *
 * Exit status: 0 after a drain, 1 when start-up fails (a port in use, out of
 * memory) or the drain timed out, 2 for a usage error. */
#define _GNU_SOURCE /* getopt_long */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "server.h"

#define DEFAULT_LISTEN "tcp://127.0.0.1:7700"
#define DEFAULT_HTTP "127.0.0.1:7701"
#define DEFAULT_PUB "tcp://127.0.0.1:7702"
#define DEFAULT_ADMIN "tcp://127.0.0.1:7703" /* = GROVE_DEFAULT_ADMIN_URL (grove/client.h) */
#define DEFAULT_MAX_REQUEST ((size_t)64 << 20)
/* Long enough that a client that calls now and then keeps its connection
 * (the clients redial anyway), short enough that a descriptor left behind by
 * a peer that went away without closing comes back within minutes. */
#define DEFAULT_IDLE_TIMEOUT_S 300

static const char usage_text[] =
    "usage: groved [OPTIONS]\n"
    "Serves Grove model directories over NNG (protobuf RPCs) and the Open Inference\n"
    "Protocol (KServe V2 REST, on --http) with dynamic batching.\n"
    "\n"
    "  --model [NAME=]DIR      serve the model directory DIR (repeatable); NAME defaults to\n"
    "                          model.json's \"name\", else the directory's name\n"
    "  --model-repo DIR        serve every subdirectory of DIR holding a model.json, each\n"
    "                          named after its subdirectory\n"
    "  --listen URL            tcp://HOST:PORT or ipc:///PATH (repeatable;\n"
    "                          default " DEFAULT_LISTEN
    ")\n"
    "                          the data plane: predict, status, model metadata\n"
    "  --admin-listen URL|none the admin plane: reload, export, hooks, training, promote\n"
    "                          (repeatable; default " DEFAULT_ADMIN
    ";\n"
    "                          taken, groved does not start; none: no admin plane)\n"
    "  --admin-token-file FILE every admin RPC must carry the token in FILE (one line;\n"
    "                          clients read $GROVE_ADMIN_TOKEN or --token-file)\n"
    "  --checkpoint-dir DIR    admin RPCs may also name files in DIR (reload's checkpoint,\n"
    "                          promote's path, optimizer files; repeatable); besides it,\n"
    "                          only files inside the model's own directory\n"
    "  --http HOST:PORT|none   /healthz /readyz /metrics and the Open Inference Protocol\n"
    "                          (/v2/...; default " DEFAULT_HTTP
    ")\n"
    "  --pub URL|none          PUB socket of forward-hook telemetry (default " DEFAULT_PUB
    ";\n"
    "                          the default is best effort: taken, telemetry is off)\n"
    "  --workers N             worker threads (default: cores / blas threads; neither\n"
    "                          given: from the models' weights, docs/operations.md)\n"
    "  --blas-threads N        compute threads per forward (default: cores / workers);\n"
    "                          workers x blas threads never exceeds the cores\n"
    "  --log-level LEVEL       debug, info (default), warn, error\n"
    "  --max-request-bytes N   refuse larger requests with INVALID_ARGUMENT, larger HTTP\n"
    "                          bodies with 413 (default 64 MiB)\n"
    "  --drain-timeout S       on SIGTERM, answer what is queued for at most S seconds\n"
    "                          (default 30)\n"
    "  --watch                 reload a model when its weights file (or model.json) is\n"
    "                          replaced, e.g. written to a temporary name and renamed in\n"
    "  --watch-debounce-ms N   wait for N ms without changes before reloading (default 500)\n"
    "  --reload-in-place       SIGHUP and --watch load new weights into the serving tree\n"
    "                          (the model pauses) instead of building a second one\n"
    "  --background-yield-us N reload builds and training sessions yield their core every\n"
    "                          N us of their work (default 100; 0: never)\n"
    "  --max-connections N     keep at most N RPC connections on the --listen URLs; a new\n"
    "                          one closes the quietest (default: what the descriptor\n"
    "                          limit leaves beside a reserve for files, HTTP, PUB, admin)\n"
    "  --idle-timeout S        close an RPC or HTTP connection with no request for S\n"
    "                          seconds (default 300; 0: never); clients redial themselves\n"
    "  --data-io loop|nng      who reads the --listen connections: groved's own loop,\n"
    "                          speaking NNG's SP protocol over tcp:// and ipc:// (loop,\n"
    "                          the default), or NNG's threads (nng; every NNG transport);\n"
    "                          $GROVED_DATA_IO sets the default\n"
    "  --version, -h/--help\n"
    "\n"
    "Signals: SIGTERM/SIGINT drain (queued requests are answered, new ones get UNAVAILABLE)\n"
    "and exit 0; SIGHUP reloads every model from its directory (docs/operations.md).\n"
    "See docs/operations.md.\n";

static bool parse_data_io(const char *s, srv_config *cfg) {
  if (strcmp(s, "loop") != 0 && strcmp(s, "nng") != 0) return false;
  cfg->data_io_loop = s[0] == 'l';
  return true;
}

static int usage(const char *fmt, const char *arg) {
  fputs("groved: ", stderr);
  fprintf(stderr, fmt, arg);
  fputs("\nTry 'groved --help'.\n", stderr);
  return 2;
}

static bool parse_long(const char *s, long long lo, long long hi, long long *out) {
  if (!s || !*s) return false;
  errno = 0;
  char *end;
  long long v = strtoll(s, &end, 10);
  if (errno || *end || v < lo || v > hi) return false;
  *out = v;
  return true;
}

enum {
  OPT_MODEL = 256,
  OPT_REPO,
  OPT_LISTEN,
  OPT_HTTP,
  OPT_PUB,
  OPT_WORKERS,
  OPT_BLAS,
  OPT_LOG,
  OPT_MAXREQ,
  OPT_DRAIN,
  OPT_TEST_DELAY,
  OPT_VERSION,
  OPT_WATCH,
  OPT_WATCH_DEBOUNCE,
  OPT_YIELD,
  OPT_RELOAD_IN_PLACE,
  OPT_ADMIN_LISTEN,
  OPT_ADMIN_TOKEN_FILE,
  OPT_CHECKPOINT_DIR,
  OPT_MAX_CONNS,
  OPT_IDLE_TIMEOUT,
  OPT_DATA_IO,
};

static bool nng_url_ok(const char *u) {
  return !strncmp(u, "tcp://", 6) || !strncmp(u, "ipc://", 6) || !strncmp(u, "tcp4://", 7) ||
         !strncmp(u, "tcp6://", 7);
}

static int parse_flags(int argc, char **argv, srv_config *cfg) {
  static const struct option opts[] = {
      {"model", required_argument, NULL, OPT_MODEL},
      {"model-repo", required_argument, NULL, OPT_REPO},
      {"listen", required_argument, NULL, OPT_LISTEN},
      {"admin-listen", required_argument, NULL, OPT_ADMIN_LISTEN},
      {"admin-token-file", required_argument, NULL, OPT_ADMIN_TOKEN_FILE},
      {"checkpoint-dir", required_argument, NULL, OPT_CHECKPOINT_DIR},
      {"http", required_argument, NULL, OPT_HTTP},
      {"pub", required_argument, NULL, OPT_PUB},
      {"workers", required_argument, NULL, OPT_WORKERS},
      {"blas-threads", required_argument, NULL, OPT_BLAS},
      {"log-level", required_argument, NULL, OPT_LOG},
      {"max-request-bytes", required_argument, NULL, OPT_MAXREQ},
      {"drain-timeout", required_argument, NULL, OPT_DRAIN},
      /* Testing aid, not in --help: every batch sleeps this long before its
       * forward, so tests can fill a queue or catch requests in flight
       * without racing the clock.  docs/operations.md says so. */
      {"test-batch-delay-ms", required_argument, NULL, OPT_TEST_DELAY},
      {"version", no_argument, NULL, OPT_VERSION},
      {"watch", no_argument, NULL, OPT_WATCH},
      {"watch-debounce-ms", required_argument, NULL, OPT_WATCH_DEBOUNCE},
      {"background-yield-us", required_argument, NULL, OPT_YIELD},
      {"reload-in-place", no_argument, NULL, OPT_RELOAD_IN_PLACE},
      {"max-connections", required_argument, NULL, OPT_MAX_CONNS},
      {"idle-timeout", required_argument, NULL, OPT_IDLE_TIMEOUT},
      {"data-io", required_argument, NULL, OPT_DATA_IO},
      {"help", no_argument, NULL, 'h'},
      {NULL, 0, NULL, 0}};
  cfg->http = DEFAULT_HTTP;
  cfg->pub = DEFAULT_PUB;
  cfg->max_request_bytes = DEFAULT_MAX_REQUEST;
  cfg->drain_timeout_ms = 30000;
  cfg->watch_debounce_ms = 500;
  cfg->background_yield_us = 100;
  cfg->log_level = GROVE_LOG_INFO;
  cfg->idle_timeout_s = DEFAULT_IDLE_TIMEOUT_S;
  /* The loop's listener measured better than NNG's (docs/performance.md,
   * "The request path (#20)"); NNG's stays for its other transports. */
  cfg->data_io_loop = true;
  /* $GROVED_DATA_IO: --data-io's default, so that a deployment (or a test
   * run: mk/sp.mk) switches every groved it starts at once. */
  const char *data_io = getenv("GROVED_DATA_IO");
  if (data_io && data_io[0] && !parse_data_io(data_io, cfg))
    return usage("GROVED_DATA_IO wants loop or nng, not '%s'", data_io);
  opterr = 0;
  int c;
  long long v;
  bool admin_none = false;
  while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
    switch (c) {
      case OPT_MODEL: {
        if (cfg->nmodels == SRV_MAX_MODELS) return usage("too many --model (at most %s)", "256");
        char *eq = strchr(optarg, '=');
        srv_model_arg *ma = &cfg->models[cfg->nmodels++];
        if (eq) {
          if (eq == optarg || !eq[1])
            return usage("--model wants NAME=DIR or DIR, not '%s'", optarg);
          ma->name = strndup(optarg, (size_t)(eq - optarg));
          ma->dir = strdup(eq + 1);
        } else {
          ma->dir = strdup(optarg);
        }
        if (!ma->dir || (eq && !ma->name)) return usage("%s", "out of memory");
        break;
      }
      case OPT_REPO:
        if (cfg->model_repo) return usage("--model-repo given twice%s", "");
        cfg->model_repo = optarg;
        break;
      case OPT_LISTEN:
        if (cfg->nlisten == SRV_MAX_URLS) return usage("too many --listen (at most %s)", "16");
        if (!nng_url_ok(optarg))
          return usage("--listen wants tcp://HOST:PORT or ipc:///PATH, not '%s'", optarg);
        cfg->listen[cfg->nlisten++] = optarg;
        break;
      case OPT_ADMIN_LISTEN:
        if (strcmp(optarg, "none") == 0) {
          admin_none = true;
          break;
        }
        if (cfg->nadmin_listen == SRV_MAX_URLS)
          return usage("too many --admin-listen (at most %s)", "16");
        if (!nng_url_ok(optarg))
          return usage("--admin-listen wants tcp://HOST:PORT, ipc:///PATH or none, not '%s'",
                       optarg);
        cfg->admin_listen[cfg->nadmin_listen++] = optarg;
        break;
      case OPT_ADMIN_TOKEN_FILE:
        if (cfg->admin_token_file) return usage("--admin-token-file given twice%s", "");
        cfg->admin_token_file = optarg;
        break;
      case OPT_CHECKPOINT_DIR:
        if (cfg->ncheckpoint_dirs == SRV_MAX_URLS)
          return usage("too many --checkpoint-dir (at most %s)", "16");
        cfg->checkpoint_dirs[cfg->ncheckpoint_dirs++] = optarg;
        break;
      case OPT_HTTP:
        cfg->http = (strcmp(optarg, "none") == 0 || !*optarg) ? NULL : optarg;
        if (cfg->http && !strchr(cfg->http, ':'))
          return usage("--http wants HOST:PORT or none, not '%s'", optarg);
        break;
      case OPT_PUB:
        cfg->pub = (strcmp(optarg, "none") == 0 || !*optarg) ? NULL : optarg;
        if (cfg->pub && strncmp(optarg, "tcp://", 6) && strncmp(optarg, "ipc://", 6) &&
            strncmp(optarg, "tcp4://", 7) && strncmp(optarg, "tcp6://", 7))
          return usage("--pub wants tcp://HOST:PORT, ipc:///PATH or none, not '%s'", optarg);
        break;
      case OPT_WORKERS:
        if (!parse_long(optarg, 1, 1024, &v))
          return usage("--workers wants an integer from 1 to 1024, not '%s'", optarg);
        cfg->workers = (int)v;
        break;
      case OPT_BLAS:
        if (!parse_long(optarg, 1, 1024, &v))
          return usage("--blas-threads wants an integer from 1 to 1024, not '%s'", optarg);
        cfg->blas_threads = (int)v;
        break;
      case OPT_LOG: {
        static const char *const names[] = {"debug", "info", "warn", "error"};
        int found = -1;
        for (int i = 0; i < 4; i++)
          if (strcmp(optarg, names[i]) == 0) found = i;
        if (strcmp(optarg, "warning") == 0) found = 2;
        if (found < 0)
          return usage("--log-level wants debug, info, warn or error, not '%s'", optarg);
        cfg->log_level = (grove_log_level)found;
        break;
      }
      case OPT_MAXREQ:
        if (!parse_long(optarg, 1024, (long long)1 << 40, &v))
          return usage("--max-request-bytes wants an integer from 1024 to 2^40, not '%s'", optarg);
        cfg->max_request_bytes = (size_t)v;
        break;
      case OPT_DRAIN:
        if (!parse_long(optarg, 1, 86400, &v))
          return usage("--drain-timeout wants seconds from 1 to 86400, not '%s'", optarg);
        cfg->drain_timeout_ms = (int)v * 1000;
        break;
      case OPT_TEST_DELAY:
        if (!parse_long(optarg, 0, 60000, &v))
          return usage("--test-batch-delay-ms wants 0 to 60000, not '%s'", optarg);
        cfg->test_batch_delay_ms = (int)v;
        break;
      case OPT_WATCH:
        cfg->watch = true;
        break;
      case OPT_WATCH_DEBOUNCE:
        if (!parse_long(optarg, 0, 600000, &v))
          return usage("--watch-debounce-ms wants 0 to 600000, not '%s'", optarg);
        cfg->watch_debounce_ms = (int)v;
        break;
      case OPT_YIELD:
        if (!parse_long(optarg, 0, 1000000, &v))
          return usage("--background-yield-us wants 0 to 1000000, not '%s'", optarg);
        cfg->background_yield_us = (int)v;
        break;
      case OPT_RELOAD_IN_PLACE:
        cfg->reload_in_place = true;
        break;
      case OPT_MAX_CONNS:
        if (!parse_long(optarg, 1, 1 << 24, &v))
          return usage("--max-connections wants an integer from 1 to 16777216, not '%s'", optarg);
        cfg->max_connections = (size_t)v;
        break;
      case OPT_IDLE_TIMEOUT:
        if (!parse_long(optarg, 0, 86400, &v))
          return usage("--idle-timeout wants seconds from 0 to 86400, not '%s'", optarg);
        cfg->idle_timeout_s = (int)v;
        break;
      case OPT_DATA_IO:
        if (!parse_data_io(optarg, cfg)) return usage("--data-io wants loop or nng, not '%s'", optarg);
        break;
      case OPT_VERSION:
        printf("groved %s (protocol %d)\n", GROVE_VERSION,
               GROVE__PROTOCOL_VERSION__PROTOCOL_VERSION);
        return -1;
      case 'h':
        fputs(usage_text, stdout);
        return -1;
      case ':':
        return usage("option '%s' needs a value", argv[optind - 1]);
      default:
        return usage("unknown option '%s'", argv[optind - 1]);
    }
  }
  if (optind < argc) return usage("unexpected argument '%s'", argv[optind]);
  if (cfg->nlisten == 0) cfg->listen[cfg->nlisten++] = DEFAULT_LISTEN;
  if (admin_none && cfg->nadmin_listen)
    return usage("--admin-listen none and --admin-listen %s", cfg->admin_listen[0]);
  if (!admin_none && cfg->nadmin_listen == 0) {
    cfg->admin_listen[cfg->nadmin_listen++] = DEFAULT_ADMIN;
    cfg->admin_default = true;
  }
  return 0;
}

static void free_flags(srv_config *cfg) {
  for (size_t i = 0; i < cfg->nmodels; i++) {
    free(cfg->models[i].name);
    free(cfg->models[i].dir);
  }
}

/* workers x blas threads never exceeds the cores given: clamp, and say so.
 * Neither given: decided once the models are loaded, by their weights
 * (lifecycle.c's settle_threads); until then a worker per core of one
 * thread each, which the trial forwards of the load run on. */
static void choose_threads(srv_server *srv) {
  int cores = grove_available_cores();
  int t = srv->cfg.blas_threads;
  srv->threads_auto = !t && !srv->cfg.workers;
  if (!t) t = srv->cfg.workers ? cores / srv->cfg.workers : 1;
  if (t < 1) t = 1;
  if (t > cores) {
    grove__slog(GROVE_LOG_WARN, "server.threads_clamped",
                "--blas-threads %d is more than the %d cores this process may use; using %d", t,
                cores, cores);
    t = cores;
  }
  int w = srv->cfg.workers ? srv->cfg.workers : cores / t;
  if (w < 1) w = 1;
  if (w * t > cores) {
    int nw = cores / t > 0 ? cores / t : 1;
    grove__slog(GROVE_LOG_WARN, "server.workers_clamped",
                "--workers %d x --blas-threads %d would run %d threads on %d cores; using %d "
                "worker%s",
                w, t, w * t, cores, nw, nw == 1 ? "" : "s");
    w = nw;
  }
  srv->workers = w;
  srv->blas_threads = t;
  grove_set_compute_threads(t);
}

int main(int argc, char **argv) {
  static srv_server srv; /* static: large, and one per process */
  int rc = parse_flags(argc, argv, &srv.cfg);
  if (rc) {
    free_flags(&srv.cfg);
    return rc < 0 ? 0 : rc;
  }
  signal(SIGPIPE, SIG_IGN);
  grove__slog_init(srv.cfg.log_level);
  grove_set_log(grove__slog_core, NULL);
  srv.t_start = grove__now_ns();
  grove__slog(GROVE_LOG_INFO, "server.start", "groved %s (protocol %d), pid %d", GROVE_VERSION,
              GROVE__PROTOCOL_VERSION__PROTOCOL_VERSION, (int)getpid());
  if (srv.cfg.test_batch_delay_ms)
    grove__slog(GROVE_LOG_WARN, "server.test_delay",
                "--test-batch-delay-ms %d: every batch sleeps first (a testing aid)",
                srv.cfg.test_batch_delay_ms);
  choose_threads(&srv);

  rc = grove__server_run(&srv);
  free_flags(&srv.cfg);
  return rc;
}
