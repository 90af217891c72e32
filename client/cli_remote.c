/* cli_remote.c: the grove CLI's server commands, on libgrove-client.
 *
 *   grove [--server URL] status
 *   grove [--server URL] predict MODEL INPUT.npy... [-o OUTPUT.npy]... [--timeout-ms N]
 *   grove [--server URL] bench MODEL --concurrency C --batch B [--seconds S] [--timeout-ms N]
 *   grove [--admin URL] reload MODEL [CHECKPOINT] [--non-strict] [--model-dir DIR] [--in-place]
 *   grove [--admin URL] export MODEL -o FILE.safetensors|FILE.pt [--force] [--prefix P]
 *
 * Same conventions as client/grove.c, from cli_args.c (docs/cli.md): options
 * anywhere after the command as `--name value`, `--name=value`, `-o value`,
 * `-ovalue`, `--` ends them; "grove: <reason>" on stderr; exit 0 ok, 1 the
 * server said no, 2 usage (with "Try 'grove CMD --help'."), 3 cannot reach
 * the server.  Outputs print and inputs convert as for predict --local
 * (cli_tensor.c). */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli_args.h"
#include "cli_connect.h"
#include "cli_hooks.h"
#include "cli_train.h"
#include "cli_remote.h"
#include "cli_tensor.h"
#include "grove/client.h"
#include "grove/grove.h"
#include "npy.h"

#define DEFAULT_SERVER GROVE__CLI_DEFAULT_SERVER

const char grove_cli_remote_usage[] =
    "  [--server URL] status\n"
    "  [--server URL] predict MODEL INPUT.npy... [-o OUTPUT.npy]... [--timeout-ms N]\n"
    "  [--server URL] bench MODEL --concurrency C --batch B [--seconds S]\n"
    "  [--admin URL] reload MODEL [CHECKPOINT] [--non-strict] [--model-dir DIR] [--in-place]\n"
    "  [--admin URL] export MODEL -o FILE.safetensors|FILE.pt [--force] [--prefix P]\n"
    "  [--admin URL] hook add MODEL PATTERN [--stats LIST] [--every N] [--kind K]\n"
    "  [--admin URL] hook ls [MODEL] | hook rm ID\n"
    "  [--pub URL] watch [MODEL[:PATTERN]] [--count N] [--seconds S] [--json]\n"
    "  [--admin URL] train start MODEL --optimizer SGD|Adam|AdamW --loss LOSS [...]\n"
    "  [--admin URL] train step|eval MODEL INPUT.npy... [--target T.npy] | promote MODEL\n"
    "  [--admin URL] train stop MODEL [--save-optimizer FILE.pt]\n";

static const char status_help[] =
    "usage: grove status [--timeout-ms N]        (global option: grove --server URL status)\n"
    "Prints groved's state and every model it serves: version, readiness (or why a\n"
    "model did not load), inputs, outputs, parameters, batching and queue depth.\n"
    "--server takes one URL or several separated by commas (default $GROVE_SERVER,\n"
    "else " DEFAULT_SERVER
    ").  Exit 0 when the server answered (ready or not),\n"
    "3 when it cannot be reached.\n";

static const char predict_help[] =
    "usage: grove predict MODEL INPUT.npy... [-o OUTPUT.npy]... [--timeout-ms N]\n"
    "       grove predict --local MODEL_DIR INPUT.npy... [-o OUTPUT.npy]... [--threads N]\n"
    "The first form asks groved (grove --server URL predict ...; default $GROVE_SERVER,\n"
    "else " DEFAULT_SERVER
    "): one .npy per model input goes to the served MODEL,\n"
    "in the model's order, or each as NAME=FILE.npy naming the input (ids=ids.npy),\n"
    "one -o file per output comes back (in order); without -o an output is printed as\n"
    "`NAME DTYPE SHAPE` and its first rows.  Inputs convert to the model's dtype only\n"
    "when no value changes.  --timeout-ms: how long to wait (default 30000); the\n"
    "server drops the request if it is still queued by then.\n"
    "The second form runs the model in this process (docs/cli.md).\n"
    "Exit 0 ok, 1 the server or the file said no (the reason on stderr), 2 usage,\n"
    "3 the server cannot be reached.\n";

static const char bench_help[] =
    "usage: grove bench MODEL --concurrency C --batch B [--seconds S] [--timeout-ms N]\n"
    "       grove bench --local MODEL_DIR --batch B [--seconds S] [--threads N]\n"
    "The first form loads groved (grove --server URL bench ...): C clients keep one\n"
    "predict of B rows each in flight, back to back, for S seconds (default 3;\n"
    "the first min(S/5, 0.5 s) warm up and are not counted).  Inputs as bench --local\n"
    "makes them (floats uniform in [-1, 1) from a fixed seed, integers 0, free\n"
    "dimensions 16).  The last line is exactly\n"
    "  requests=N errors=N samples_per_s=X p50_ms=X p99_ms=X\n"
    "(requests and errors counted after the warm-up; latency over successful requests).\n"
    "The second runs the model in this process (see docs/cli.md).\n";

/* --timeout-ms of predict, bench, reload and export (v may be NULL: *ms
 * keeps its default).  0 or EXIT_USAGE after the message. */
static int timeout_option(const char *cmd, const char *v, long long *ms) {
  if (v && !grove__cli_int(v, 1, 86400000, ms))
    return grove__cli_usage(cmd, "--timeout-ms wants milliseconds from 1 to 86400000, not '%s'", v);
  return 0;
}

/* ============================================================ status */

static void print_io(const char *title, const grove_io_spec *io, size_t n) {
  char sh[256];
  for (size_t i = 0; i < n; i++)
    printf("  %s %s %s %s\n", i == 0 ? title : "        ", io[i].name,
           grove_dtype_name(io[i].dtype), grove_shape_str(io[i].ndim, io[i].shape, sh, sizeof sh));
}

static int cmd_status(grove_client *c, int timeout_ms) {
  grove_err err = {0};
  grove_server_status *st = NULL;
  grove_status s = grove_client_status(c, timeout_ms, &st, &err);
  if (s) return grove__cli_call_failed(s, &err, "status");
  printf("server: groved %s (protocol %u), up %.1f s, %u worker%s x %u compute thread%s, %s\n",
         st->server_version, st->protocol, (double)st->uptime_ms / 1000.0, st->workers,
         st->workers == 1 ? "" : "s", st->blas_threads, st->blas_threads == 1 ? "" : "s",
         st->draining ? "draining"
         : st->ready  ? "ready"
                      : "not ready");
  /* Both planes: where predicts go, and where reload, export, hooks and
   * training go (docs/operations.md, "Security"). */
  printf("data plane:  ");
  for (size_t i = 0; i < st->nlisten; i++) printf("%s%s", i ? ", " : "", st->listen_urls[i]);
  printf("%s (predict, status, metadata)\n", st->nlisten ? "" : "?");
  printf("admin plane: ");
  for (size_t i = 0; i < st->nadmin; i++) printf("%s%s", i ? ", " : "", st->admin_urls[i]);
  printf("%s\n", st->nadmin ? " (reload, export, hooks, training)" : "none");
  printf("in flight: %" PRIu64 " predict%s\n", st->inflight, st->inflight == 1 ? "" : "s");
  printf("models: %zu\n", st->nmodels);
  for (size_t i = 0; i < st->nmodels; i++) {
    const grove_model_info *m = &st->models[i];
    if (!m->ready) {
      printf("model %s: NOT LOADED (%s)\n  error: %s\n", m->name, m->dir, m->error);
      continue;
    }
    printf("model %s: version %" PRId64 ", ready, %" PRIu64 " queued\n", m->name, m->version,
           m->queue_depth);
    printf("  dir:     %s\n  weights: %s\n", m->dir, m->weights_path);
    print_io("inputs: ", m->inputs, m->ninputs);
    print_io("outputs:", m->outputs, m->noutputs);
    printf("  parameters: %" PRId64 " (%" PRIu64 " bytes)\n", m->param_count, m->weight_bytes);
    printf("  batching: max_batch_size=%" PRId64 " max_queue_delay_us=%" PRId64
           " max_queue_size=%" PRId64 "\n",
           m->batching.max_batch_size, m->batching.max_queue_delay_us, m->batching.max_queue_size);
  }
  grove_server_status_free(st);
  return EXIT_OK;
}

/* ============================================================ predict */

/* What predict and bench begin with: a client on server in *c and what it
 * says of model in *mi (both the caller's, also after a failure), which
 * must be loaded.  0, or the exit status after the message. */
static int served_model(const char *server, const char *model, int timeout_ms, grove_client **c,
                        grove_model_info **mi) {
  int rc = grove__cli_connect(server, timeout_ms, c);
  if (rc) return rc;
  grove_err err = {0};
  grove_status s = grove_client_model_info(*c, model, timeout_ms, mi, &err);
  if (s) return grove__cli_call_failed(s, &err, NULL);
  if (!(*mi)->ready)
    return grove__cli_fail(EXIT_REFUSED, "model %s is not loaded on the server: %s", model,
                           (*mi)->error);
  return 0;
}

enum { P_HELP, P_OUTPUT, P_TIMEOUT, P_LOCAL };

static int cmd_predict(const char *server, int argc, char **argv) {
  static const grove__cli_opt defs[] = {[P_HELP] = {"help", 'h', 0},
                                        [P_OUTPUT] = {"output", 'o', GROVE__CLI_VALUE},
                                        [P_TIMEOUT] = {"timeout-ms", 0, GROVE__CLI_VALUE},
                                        [P_LOCAL] = {"local", 0, GROVE__CLI_VALUE},
                                        {NULL}};
  grove__cli_args p;
  int rc = grove__cli_parse("predict", argc, argv, defs, predict_help, &p);
  if (rc >= 0) return rc;
  bool dup = false;
  long long timeout = 30000;
  const char *tv = grove__cli_value(&p, P_TIMEOUT, &dup);
  if (dup) return grove__cli_usage("predict", "--timeout-ms given twice");
  if ((rc = timeout_option("predict", tv, &timeout))) return rc;
  if (p.npos < 1) return grove__cli_usage("predict", "needs a MODEL and an INPUT.npy");
  if (p.npos < 2) return grove__cli_usage("predict", "needs an INPUT.npy after the model");
  const char *model = p.pos[0];
  const char *outputs[GROVE__CLI_MAX_ARGS];
  size_t nout;
  if ((rc = grove__cli_outputs("predict", &p, P_OUTPUT, outputs, &nout))) return rc;

  size_t nin = (size_t)p.npos - 1;
  grove_tensor *in[GROVE__CLI_MAX_ARGS] = {0};
  grove_tensor args[GROVE__CLI_MAX_ARGS];
  grove_client *c = NULL;
  grove_model_info *mi = NULL;
  grove_prediction pred = {0};
  grove_err err = {0};
  grove_status s;
  rc = EXIT_OK;
  const char *files[GROVE__CLI_MAX_ARGS];
  size_t order[GROVE__CLI_MAX_ARGS];
  char iname[256];
  /* Inputs first: a wrong file is found before the server is asked. */
  for (size_t i = 0; i < nin; i++) {
    files[i] = grove__cli_input_file(p.pos[i + 1], iname, sizeof iname);
    if (grove_npy_read(files[i], &in[i], &err)) {
      rc = grove__cli_fail(EXIT_REFUSED, "%s", grove_err_msg(&err));
      goto done;
    }
  }
  if ((rc = served_model(server, model, (int)timeout, &c, &mi))) goto done;
  if ((rc = grove__cli_order_inputs(model, p.pos + 1, nin, mi->inputs, mi->ninputs, order)))
    goto done;
  if (nout > mi->noutputs) {
    rc = grove__cli_fail(EXIT_REFUSED, "model %s has %zu output%s, %zu -o files were given", model,
                         mi->noutputs, mi->noutputs == 1 ? "" : "s", nout);
    goto done;
  }
  for (size_t i = 0; i < nin; i++) {
    const size_t k = order[i];
    grove_dtype want = mi->inputs[i].dtype;
    if (in[k]->dtype != want) {
      grove_tensor *cv = NULL;
      if (grove__cli_convert(in[k], want, files[k], mi->inputs[i].name, &cv, &err)) {
        rc = grove__cli_fail(EXIT_REFUSED, "%s", grove_err_msg(&err));
        goto done;
      }
      grove_tensor_release(in[k]);
      in[k] = cv;
    }
    args[i] = *in[k];
  }
  if ((s = grove_client_predict(c, model, args, nin, (int)timeout, &pred, &err))) {
    rc = grove__cli_call_failed(s, &err, NULL);
    goto done;
  }
  for (size_t k = 0; k < pred.noutputs; k++) {
    if (k < nout) {
      if (grove_npy_write(outputs[k], pred.outputs[k], &err)) {
        rc = grove__cli_fail(EXIT_REFUSED, "%s", grove_err_msg(&err));
        goto done;
      }
      continue;
    }
    char fallback[32];
    snprintf(fallback, sizeof fallback, "output%zu", k);
    grove__cli_print_tensor(pred.names[k] && *pred.names[k] ? pred.names[k] : fallback,
                            pred.outputs[k]);
  }
done:
  grove_prediction_fini(&pred);
  grove_model_info_free(mi);
  grove_client_close(c);
  for (size_t i = 0; i < nin; i++) grove_tensor_release(in[i]);
  return rc;
}

/* ============================================================ bench */

enum { MAX_SAMPLES_PER_THREAD = 4 << 20 };

/* One of the C concurrent clients.  Its calls are asynchronous and chained:
 * each completion (on an NNG thread) records the latency and sends the next
 * request, so C requests are in flight at all times without C blocked
 * threads (which would cost the machine a context switch per request on
 * the client side, and a 2-core box cannot spare it).  One client has one
 * call outstanding at a time, so its counters need no lock. */
typedef struct vclient {
  grove_client *c;
  const char *model;
  const grove_tensor *args;
  size_t nin;
  int timeout_ms;
  double warm_end, end;
  double t0;
  long ok, errors;
  double *lat_ms;
  size_t nlat, cap;
  grove_status first_status;
  grove_err first_err;
} vclient;

static void vclient_start(vclient *v);

static void vclient_record(vclient *v, grove_status s, const grove_err *err, double t1) {
  if (v->t0 < v->warm_end) return;
  if (s) {
    if (v->errors++ == 0) {
      v->first_status = s;
      if (err) v->first_err = *err;
    }
    return;
  }
  v->ok++;
  if (v->nlat == v->cap && v->cap < MAX_SAMPLES_PER_THREAD) {
    size_t cap = v->cap ? 2 * v->cap : 4096;
    double *g = realloc(v->lat_ms, cap * sizeof *g);
    if (g) {
      v->lat_ms = g;
      v->cap = cap;
    }
  }
  if (v->nlat < v->cap) v->lat_ms[v->nlat++] = (t1 - v->t0) * 1000.0;
}

static void vclient_done(void *arg, grove_status s, grove_prediction *p, const grove_err *err) {
  vclient *v = arg;
  double t1 = grove__cli_now_s();
  if (p) grove_prediction_fini(p);
  vclient_record(v, s, err, t1);
  if (t1 < v->end) vclient_start(v);
}

static void vclient_start(vclient *v) {
  grove_err err = {0};
  v->t0 = grove__cli_now_s();
  grove_status s = grove_client_predict_async(v->c, v->model, v->args, v->nin, v->timeout_ms,
                                              vclient_done, v, &err);
  if (s) {
    /* Could not even send (out of memory): count it and stop this client. */
    v->t0 = v->warm_end;
    vclient_record(v, s, &err, grove__cli_now_s());
  }
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* Nearest-rank percentile of sorted v. */
static double percentile(const double *v, size_t n, double q) {
  if (n == 0) return 0.0;
  size_t k = (size_t)ceil(q * (double)n);
  if (k < 1) k = 1;
  return v[k - 1];
}

enum { B_HELP, B_CONC, B_BATCH, B_SECONDS, B_TIMEOUT, B_LOCAL };

static int cmd_bench(const char *server, int argc, char **argv) {
  static const grove__cli_opt defs[] = {[B_HELP] = {"help", 'h', 0},
                                        [B_CONC] = {"concurrency", 0, GROVE__CLI_VALUE},
                                        [B_BATCH] = {"batch", 0, GROVE__CLI_VALUE},
                                        [B_SECONDS] = {"seconds", 0, GROVE__CLI_VALUE},
                                        [B_TIMEOUT] = {"timeout-ms", 0, GROVE__CLI_VALUE},
                                        [B_LOCAL] = {"local", 0, GROVE__CLI_VALUE},
                                        {NULL}};
  grove__cli_args p;
  int rc = grove__cli_parse("bench", argc, argv, defs, bench_help, &p);
  if (rc >= 0) return rc;
  bool dup = false;
  const char *cv = grove__cli_value(&p, B_CONC, &dup), *bv = grove__cli_value(&p, B_BATCH, &dup),
             *sv = grove__cli_value(&p, B_SECONDS, &dup),
             *tv = grove__cli_value(&p, B_TIMEOUT, &dup);
  if (dup) return grove__cli_usage("bench", "an option was given twice");
  if (p.npos == 0) return grove__cli_usage("bench", "needs a MODEL (or --local MODEL_DIR)");
  if (p.npos > 1) return grove__cli_usage("bench", "unexpected argument '%s'", p.pos[1]);
  if (!cv) return grove__cli_usage("bench", "needs --concurrency C");
  if (!bv) return grove__cli_usage("bench", "needs --batch B");
  long long conc, batch, timeout = 30000;
  double seconds = 3.0;
  if (!grove__cli_int(cv, 1, 4096, &conc))
    return grove__cli_usage("bench", "--concurrency wants an integer from 1 to 4096, not '%s'", cv);
  if (!grove__cli_int(bv, 1, 1 << 24, &batch))
    return grove__cli_usage("bench", "--batch wants a positive integer, not '%s'", bv);
  if (sv && !grove__cli_seconds(sv, &seconds))
    return grove__cli_usage("bench", "--seconds wants a positive number, not '%s'", sv);
  if ((rc = timeout_option("bench", tv, &timeout))) return rc;
  const char *model = p.pos[0];

  grove_client *c = NULL;
  grove_model_info *mi = NULL;
  grove_tensor *in[GROVE_MAX_VALUES] = {0};
  grove_tensor args[GROVE_MAX_VALUES];
  vclient *th = NULL;
  size_t nin = 0;
  grove_err err = {0};
  if ((rc = served_model(server, model, (int)timeout, &c, &mi))) goto done;
  if (mi->ninputs == 0 || mi->ninputs > GROVE_MAX_VALUES) {
    rc = grove__cli_fail(EXIT_REFUSED, "model %s declares %zu inputs", model, mi->ninputs);
    goto done;
  }
  uint64_t state = GROVE__CLI_BENCH_SEED;
  nin = mi->ninputs;
  for (size_t i = 0; i < nin; i++) {
    if (!(in[i] = grove__cli_bench_input(&mi->inputs[i], batch, &state, &err))) {
      rc = grove__cli_fail(EXIT_REFUSED, "%s", grove_err_msg(&err));
      goto done;
    }
    args[i] = *in[i];
  }
  th = calloc((size_t)conc, sizeof *th);
  if (!th) {
    rc = grove__cli_fail(EXIT_REFUSED, "out of memory");
    goto done;
  }
  double warm = seconds / 5 < 0.5 ? seconds / 5 : 0.5;
  double start = grove__cli_now_s();
  for (long long i = 0; i < conc; i++) {
    th[i] = (vclient){.c = c,
                      .model = model,
                      .args = args,
                      .nin = nin,
                      .timeout_ms = (int)timeout,
                      .warm_end = start + warm,
                      .end = start + warm + seconds};
    vclient_start(&th[i]);
  }
  /* Every client stops sending at end; the last replies come within the
   * timeout at worst. */
  for (double left; (left = start + warm + seconds - grove__cli_now_s()) > 0;) {
    struct timespec ts = {(time_t)left, (long)((left - (double)(time_t)left) * 1e9)};
    nanosleep(&ts, NULL);
  }
  grove_client_wait_idle(c);
  double elapsed = grove__cli_now_s() - (start + warm);
  long ok = 0, errors = 0;
  size_t nlat = 0;
  for (long long i = 0; i < conc; i++) {
    ok += th[i].ok;
    errors += th[i].errors;
    nlat += th[i].nlat;
  }
  double *all = malloc((nlat ? nlat : 1) * sizeof *all);
  size_t k = 0;
  for (long long i = 0; all && i < conc; i++) {
    if (th[i].nlat) memcpy(all + k, th[i].lat_ms, th[i].nlat * sizeof *all);
    k += th[i].nlat;
  }
  if (all) qsort(all, k, sizeof *all, cmp_double);
  for (long long i = 0; i < conc; i++)
    if (th[i].errors) {
      fprintf(stderr, "grove: first error: %s: %s\n", grove_status_name(th[i].first_status),
              grove_err_msg(&th[i].first_err));
      break;
    }
  printf(
      "model %s: %lld concurrent client%s, batch %lld, %.3f s measured after %.3f s of "
      "warm-up\n",
      model, conc, conc == 1 ? "" : "s", batch, elapsed, warm);
  printf("requests=%ld errors=%ld samples_per_s=%.1f p50_ms=%.3f p99_ms=%.3f\n", ok + errors,
         errors, elapsed > 0 ? (double)ok * (double)batch / elapsed : 0.0,
         all ? percentile(all, k, 0.50) : 0.0, all ? percentile(all, k, 0.99) : 0.0);
  free(all);
  rc = ok > 0 ? EXIT_OK : EXIT_REFUSED;
  for (long long i = 0; i < conc; i++) free(th[i].lat_ms);
done:
  free(th);
  for (size_t i = 0; i < nin; i++) grove_tensor_release(in[i]);
  grove_model_info_free(mi);
  grove_client_close(c);
  return rc;
}

/* ============================================================ reload */

static const char reload_help[] =
    "usage: grove reload MODEL [CHECKPOINT] [--non-strict] [--model-dir DIR] [--in-place]\n"
    "                    [--timeout-ms N]\n"
    "Asks groved to load new weights into MODEL while it serves (grove --admin URL reload\n"
    "...; its admin listener: default $GROVE_ADMIN, else " GROVE_DEFAULT_ADMIN_URL ").  CHECKPOINT is a .safetensors/.pt/.pth/.bin file on the server's machine (a\n"
    "relative name is made absolute with this directory); without it the model directory's\n"
    "weights file is read again.  --model-dir serves another model directory under the same\n"
    "name.  --non-strict allows missing and unexpected keys (load_state_dict(strict=False)).\n"
    "--in-place loads into the serving tree instead of building a second one, for models too\n"
    "large to hold twice: the model's requests wait during the swap (the pause is printed).\n"
    "The command returns once the new version serves and prints its number.  A checkpoint\n"
    "that does not fit changes nothing: the missing keys, unexpected keys and mismatches are\n"
    "printed and the exit status is 1 (also when another reload of MODEL is in progress).\n"
    "--timeout-ms: how long to wait (default 120000).  With several --admin URLs\n"
    "(replicas) each is reloaded in turn, one line each.  Exit 0 ok, 1 refused, 2 usage,\n"
    "3 the server cannot be reached (with replicas: the worst of them).\n";

/* A path for the server: relative ones are made absolute here, since the
 * server's working directory is not the caller's.  *buf is malloc'd. */
static const char *server_path(const char *p, char **buf) {
  *buf = NULL;
  if (!p || p[0] == '/') return p;
  char cwd[4096];
  if (!getcwd(cwd, sizeof cwd)) return p;
  size_t n = strlen(cwd) + strlen(p) + 2;
  if (!(*buf = malloc(n))) return p;
  snprintf(*buf, n, "%s/%s", cwd, p);
  return *buf;
}

static void print_list(const char *title, char **v, size_t n) {
  if (!n) return;
  fprintf(stderr, "  %s (%zu):", title, n);
  for (size_t i = 0; i < n; i++) fprintf(stderr, "%s %s", i ? "," : "", v[i]);
  fputc('\n', stderr);
}

enum { R_HELP, R_NONSTRICT, R_MODELDIR, R_INPLACE, R_TIMEOUT };

static int reload_one(const char *admin, const char *model, const grove_reload_opts *o,
                      int timeout);

static int cmd_reload(const char *server, int argc, char **argv) {
  static const grove__cli_opt defs[] = {[R_HELP] = {"help", 'h', 0},
                                        [R_NONSTRICT] = {"non-strict", 0, 0},
                                        [R_MODELDIR] = {"model-dir", 0, GROVE__CLI_VALUE},
                                        [R_INPLACE] = {"in-place", 0, 0},
                                        [R_TIMEOUT] = {"timeout-ms", 0, GROVE__CLI_VALUE},
                                        {NULL}};
  grove__cli_args p;
  int rc = grove__cli_parse("reload", argc, argv, defs, reload_help, &p);
  if (rc >= 0) return rc;
  bool dup = false;
  long long timeout = 120000;
  const char *tv = grove__cli_value(&p, R_TIMEOUT, &dup);
  const char *dir = grove__cli_value(&p, R_MODELDIR, &dup);
  if (dup) return grove__cli_usage("reload", "an option given twice");
  if ((rc = timeout_option("reload", tv, &timeout))) return rc;
  if (p.npos < 1) return grove__cli_usage("reload", "needs a MODEL");
  if (p.npos > 2) return grove__cli_usage("reload", "unexpected argument '%s'", p.pos[2]);
  bool in_place = grove__cli_value(&p, R_INPLACE, &dup) != NULL;
  if (in_place && dir)
    return grove__cli_usage("reload",
                            "--in-place keeps the architecture; it cannot take --model-dir");
  char *ckbuf = NULL, *dirbuf = NULL;
  grove_reload_opts o = {.checkpoint = server_path(p.npos > 1 ? p.pos[1] : NULL, &ckbuf),
                         .model_dir = server_path(dir, &dirbuf),
                         .non_strict = grove__cli_value(&p, R_NONSTRICT, &dup) != NULL,
                         .in_place = in_place};
  /* Replicas are reloaded one after the other at their admin listeners
   * (--admin URL,URL...), each by a client of its own (a client of several
   * URLs refuses a reload: docs/operations.md). */
  char ubuf[2048];
  const char *urls[GROVE__CLI_MAX_URLS];
  int worst = EXIT_OK;
  size_t nurls = grove__cli_admin_targets(server, ubuf, sizeof ubuf, urls, &worst);
  for (size_t u = 0; u < nurls; u++) {
    if (nurls > 1) printf("%s: ", urls[u]);
    fflush(stdout);
    rc = reload_one(urls[u], p.pos[0], &o, (int)timeout);
    if (nurls > 1 && rc) printf("failed (exit %d)\n", rc);
    if (rc > worst) worst = rc;
  }
  free(ckbuf);
  free(dirbuf);
  return worst;
}

/* One replica's reload, reported on stdout (stderr when it fails). */
static int reload_one(const char *admin, const char *model, const grove_reload_opts *o,
                      int timeout) {
  grove_client *c = NULL;
  int rc = grove__cli_connect_admin_url(admin, timeout, &c);
  if (rc) return rc;
  grove_err err = {0};
  grove_reload_result res;
  grove_status s = grove_client_reload(c, model, o, timeout, &res, &err);
  if (s) {
    char what[300];
    snprintf(what, sizeof what, "reload of model '%s'", model);
    rc = grove__cli_call_failed(s, &err, what);
    print_list("missing keys", res.missing, res.n_missing);
    print_list("unexpected keys", res.unexpected, res.n_unexpected);
    print_list("errors", res.errors, res.n_errors);
    if (res.version > 0) fprintf(stderr, "  version %" PRId64 " keeps serving\n", res.version);
  } else {
    printf("model %s: version %" PRId64 " serving (was %" PRId64 "), weights %s, %.1f ms", model,
           res.version, res.previous_version, res.weights_path[0] ? res.weights_path : "(none)",
           (double)res.duration_us / 1000.0);
    if (res.in_place) printf(", in place (requests paused %.1f ms)", (double)res.pause_us / 1000.0);
    printf("\n");
    rc = EXIT_OK;
  }
  grove_reload_result_fini(&res);
  grove_client_close(c);
  return rc;
}

/* ============================================================ export */

static const char export_help[] =
    "usage: grove export MODEL -o FILE.safetensors|FILE.pt [--force] [--prefix P]\n"
    "                    [--timeout-ms N]\n"
    "Writes the state_dict MODEL serves right now (grove --admin URL export ...): its\n"
    "parameters and persistent buffers, dotted keys in PyTorch's order, the dtypes as\n"
    "loaded, all from one version (printed).  The format follows the extension: .safetensors,\n"
    "or .pt/.pth/.bin for a torch.save archive that torch.load(weights_only=True) reads.\n"
    "--prefix keeps only the keys that start with P.  The file is streamed in chunks to a\n"
    "file with no name beside FILE, named FILE when complete, so a failed or killed export\n"
    "leaves no file; an existing FILE is refused unless --force.  --timeout-ms bounds each round\n"
    "trip (default 60000).  Exit 0 ok, 1 refused, 2 usage, 3 the server cannot be reached.\n";

enum { E_HELP, E_OUTPUT, E_FORCE, E_PREFIX, E_TIMEOUT, E_CHUNK };

static int cmd_export(const char *server, int argc, char **argv) {
  static const grove__cli_opt defs[] = {[E_HELP] = {"help", 'h', 0},
                                        [E_OUTPUT] = {"output", 'o', GROVE__CLI_VALUE},
                                        [E_FORCE] = {"force", 'f', 0},
                                        [E_PREFIX] = {"prefix", 0, GROVE__CLI_VALUE},
                                        [E_TIMEOUT] = {"timeout-ms", 0, GROVE__CLI_VALUE},
                                        [E_CHUNK] = {"chunk-bytes", 0, GROVE__CLI_VALUE},
                                        {NULL}};
  grove__cli_args p;
  int rc = grove__cli_parse("export", argc, argv, defs, export_help, &p);
  if (rc >= 0) return rc;
  bool dup = false;
  long long timeout = 60000, chunk = 0;
  const char *out = grove__cli_value(&p, E_OUTPUT, &dup);
  const char *tv = grove__cli_value(&p, E_TIMEOUT, &dup);
  const char *cv = grove__cli_value(&p, E_CHUNK, &dup);
  const char *prefix = grove__cli_value(&p, E_PREFIX, &dup);
  if (dup) return grove__cli_usage("export", "an option given twice");
  if ((rc = timeout_option("export", tv, &timeout))) return rc;
  if (cv && !grove__cli_int(cv, 1, (long long)1 << 30, &chunk))
    return grove__cli_usage("export", "--chunk-bytes wants 1 to 2^30, not '%s'", cv);
  if (p.npos < 1) return grove__cli_usage("export", "needs a MODEL");
  if (p.npos > 1) return grove__cli_usage("export", "unexpected argument '%s'", p.pos[1]);
  if (!out || !*out) return grove__cli_usage("export", "needs -o FILE.safetensors or -o FILE.pt");
  grove_client *c = NULL;
  if ((rc = grove__cli_connect_admin(server, (int)timeout, &c))) return rc;
  grove_err err = {0};
  grove_export_info info;
  grove_export_opts o = {.prefix = prefix, .chunk_bytes = (size_t)chunk};
  double t0 = grove__cli_now_s();
  grove_status s = grove_client_export_file(
      c, p.pos[0], out, grove__cli_value(&p, E_FORCE, &dup) != NULL, &o, (int)timeout, &info, &err);
  if (s) {
    char what[300];
    snprintf(what, sizeof what, "export of model '%s'", p.pos[0]);
    rc = grove__cli_call_failed(s, &err, what);
  } else {
    double dt = grove__cli_now_s() - t0;
    printf("model %s version %" PRId64 ": %u tensors, %" PRIu64 " bytes -> %s (%.1f MB/s)\n",
           p.pos[0], info.version, info.tensors, info.total_size, out,
           dt > 0 ? (double)info.total_size / dt / 1e6 : 0.0);
    rc = EXIT_OK;
  }
  grove_client_close(c);
  return rc;
}

/* ============================================================ entry */

static bool has_local(int argc, char **argv) {
  for (int i = 0; i < argc; i++) {
    if (strcmp(argv[i], "--") == 0) return false;
    if (strcmp(argv[i], "--local") == 0 || strncmp(argv[i], "--local=", 8) == 0) return true;
  }
  return false;
}

int grove_cli_remote(const char *server_url, const char *cmd, int argc, char **argv) {
  if (!cmd) return -1;
  if (strcmp(cmd, "status") == 0) {
    enum { O_HELP, O_TIMEOUT };
    static const grove__cli_opt defs[] = {
        [O_HELP] = {"help", 'h', 0}, [O_TIMEOUT] = {"timeout-ms", 0, GROVE__CLI_VALUE}, {NULL}};
    grove__cli_args p;
    int rc = grove__cli_parse("status", argc, argv, defs, status_help, &p);
    if (rc >= 0) return rc;
    bool dup = false;
    long long timeout = 10000;
    const char *tv = grove__cli_value(&p, O_TIMEOUT, &dup);
    if (dup) return grove__cli_usage("status", "--timeout-ms given twice");
    if (tv && !grove__cli_int(tv, 1, 86400000, &timeout))
      return grove__cli_usage("status", "--timeout-ms wants milliseconds, not '%s'", tv);
    if (p.npos) return grove__cli_usage("status", "unexpected argument '%s'", p.pos[0]);
    grove_client *c = NULL;
    if ((rc = grove__cli_connect(server_url, (int)timeout, &c))) return rc;
    rc = cmd_status(c, (int)timeout);
    grove_client_close(c);
    return rc;
  }
  if (strcmp(cmd, "predict") == 0) {
    if (has_local(argc, argv)) return -1;
    return cmd_predict(server_url, argc, argv);
  }
  if (strcmp(cmd, "bench") == 0) {
    if (has_local(argc, argv)) return -1;
    return cmd_bench(server_url, argc, argv);
  }
  if (strcmp(cmd, "reload") == 0) return cmd_reload(server_url, argc, argv);
  if (strcmp(cmd, "export") == 0) return cmd_export(server_url, argc, argv);
  if (strcmp(cmd, "hook") == 0) return grove__cli_hook(server_url, argc, argv); /* cli_hooks.c */
  if (strcmp(cmd, "watch") == 0) return grove__cli_watch(argc, argv);
  if (strcmp(cmd, "train") == 0) return grove__cli_train(server_url, argc, argv); /* cli_train.c */
  return -1;
}
