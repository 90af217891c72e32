/* cli_remote.c: the grove CLI's server commands, on libgrove-client.
 *
 *   grove [--server URL] status
 *   grove [--server URL] predict MODEL INPUT.npy... [-o OUTPUT.npy]... [--timeout-ms N]
 *   grove [--server URL] bench MODEL --concurrency C --batch B [--seconds S] [--timeout-ms N]
 *   grove [--server URL] reload MODEL [CHECKPOINT] [--non-strict] [--model-dir DIR] [--in-place]
 *   grove [--server URL] export MODEL -o FILE.safetensors|FILE.pt [--force] [--prefix P]
 *
 * Same conventions as client/grove.c (docs/cli.md): options anywhere after
 * the command as `--name value`, `--name=value`, `-o value`, `-ovalue`, `--`
 * ends them; "grove: <reason>" on stderr; exit 0 ok, 1 the server said no,
 * 2 usage (with "Try 'grove CMD --help'."), 3 cannot reach the server. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli_hooks.h"
#include "cli_train.h"
#include "cli_remote.h"
#include "grove/client.h"
#include "grove/grove.h"
#include "npy.h"

enum { EXIT_OK = 0, EXIT_REFUSED = 1, EXIT_USAGE = 2, EXIT_UNREACHABLE = 3 };

#define DEFAULT_SERVER "tcp://127.0.0.1:7700"
#define MAX_ARGS 64
#define MAX_URLS 16

const char grove_cli_remote_usage[] =
    "  [--server URL] status\n"
    "  [--server URL] predict MODEL INPUT.npy... [-o OUTPUT.npy]... [--timeout-ms N]\n"
    "  [--server URL] bench MODEL --concurrency C --batch B [--seconds S]\n"
    "  [--server URL] reload MODEL [CHECKPOINT] [--non-strict] [--model-dir DIR] [--in-place]\n"
    "  [--server URL] export MODEL -o FILE.safetensors|FILE.pt [--force] [--prefix P]\n"
    "  [--server URL] hook add MODEL PATTERN [--stats LIST] [--every N] [--kind K]\n"
    "  [--server URL] hook ls [MODEL] | hook rm ID\n"
    "  [--pub URL] watch [MODEL[:PATTERN]] [--count N] [--seconds S] [--json]\n"
    "  [--server URL] train start MODEL --optimizer SGD|Adam|AdamW --loss LOSS [...]\n"
    "  [--server URL] train step|eval MODEL INPUT.npy... [--target T.npy] | promote MODEL\n"
    "  [--server URL] train stop MODEL [--save-optimizer FILE.pt]\n";

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

/* ============================================================ messages */

static int fail(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs("grove: ", stderr);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
  return code;
}

static int usage_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int usage_error(const char *cmd, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "grove %s: ", cmd);
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\nTry 'grove %s --help'.\n", cmd);
  va_end(ap);
  return EXIT_USAGE;
}

/* The exit status for a failed call: 3 when the server could not be reached
 * (or never answered), 1 when it said no. */
static int call_failed(grove_status s, const grove_err *err, const char *what) {
  bool local = grove_client_failed_locally(s, err);
  int code = local && (s == GROVE_E_UNAVAILABLE || s == GROVE_E_DEADLINE_EXCEEDED)
                 ? EXIT_UNREACHABLE
                 : EXIT_REFUSED;
  if (local) return fail(code, "%s", grove_err_msg(err) + strlen("grove client: "));
  return fail(code, "%s%s%s: %s", what ? what : "", what ? ": " : "", grove_status_name(s),
              grove_err_msg(err));
}

/* ============================================================ options */

typedef struct opt_def {
  const char *long_name;
  char short_name;
  bool has_value;
} opt_def;

typedef struct parsed {
  int npos;
  const char *pos[MAX_ARGS];
  int nopts;
  struct {
    int def;
    const char *value;
  } opts[MAX_ARGS];
} parsed;

/* Fills p; returns 0 or EXIT_USAGE (message printed). */
static int parse_args(const char *cmd, int argc, char **argv, const opt_def *defs, parsed *p) {
  memset(p, 0, sizeof *p);
  bool only_pos = false;
  for (int i = 0; i < argc; i++) {
    const char *a = argv[i];
    if (only_pos || a[0] != '-' || a[1] == 0) {
      if (p->npos == MAX_ARGS) return usage_error(cmd, "too many arguments");
      p->pos[p->npos++] = a;
      continue;
    }
    if (strcmp(a, "--") == 0) {
      only_pos = true;
      continue;
    }
    int found = -1;
    const char *value = NULL;
    if (a[1] == '-') {
      const char *name = a + 2, *eq = strchr(name, '=');
      size_t len = eq ? (size_t)(eq - name) : strlen(name);
      for (int d = 0; defs[d].long_name; d++)
        if (strlen(defs[d].long_name) == len && strncmp(defs[d].long_name, name, len) == 0)
          found = d;
      if (found >= 0 && eq) {
        if (!defs[found].has_value)
          return usage_error(cmd, "option '--%s' takes no value", defs[found].long_name);
        value = eq + 1;
      }
    } else {
      for (int d = 0; defs[d].long_name; d++)
        if (defs[d].short_name && defs[d].short_name == a[1]) found = d;
      if (found >= 0 && a[2]) {
        if (!defs[found].has_value) return usage_error(cmd, "unknown option '%s'", a);
        value = a + 2;
      }
    }
    if (found < 0) return usage_error(cmd, "unknown option '%s'", a);
    if (defs[found].has_value && !value) {
      if (i + 1 == argc) return usage_error(cmd, "option '%s' needs a value", a);
      value = argv[++i];
    }
    if (p->nopts == MAX_ARGS) return usage_error(cmd, "too many options");
    p->opts[p->nopts].def = found;
    p->opts[p->nopts++].value = value;
  }
  return 0;
}

/* The one value of option def, or NULL; *dup set when given twice. */
static const char *opt_value(const parsed *p, int def, bool *dup) {
  const char *v = NULL;
  bool seen = false;
  for (int i = 0; i < p->nopts; i++)
    if (p->opts[i].def == def) {
      if (seen) *dup = true;
      seen = true;
      v = p->opts[i].value ? p->opts[i].value : "";
    }
  return v;
}

static bool parse_int(const char *s, long long lo, long long hi, long long *out) {
  if (!s || !*s) return false;
  errno = 0;
  char *end;
  long long v = strtoll(s, &end, 10);
  if (errno || *end || v < lo || v > hi) return false;
  *out = v;
  return true;
}

static bool parse_seconds(const char *s, double *out) {
  if (!s || !*s) return false;
  errno = 0;
  char *end;
  double v = strtod(s, &end);
  if (errno || *end || !isfinite(v) || v <= 0 || v > 86400.0) return false;
  *out = v;
  return true;
}

/* ============================================================ connecting */

/* The URLs of --server (else $GROVE_SERVER, else the default), split at
 * commas into buf; returns how many (at most MAX_URLS). */
static size_t server_urls(const char *server_url, char *buf, size_t bufn, const char **urls) {
  const char *spec = server_url;
  if (!spec || !*spec) spec = getenv("GROVE_SERVER");
  if (!spec || !*spec) spec = DEFAULT_SERVER;
  snprintf(buf, bufn, "%s", spec);
  size_t n = 0;
  for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok && n < MAX_URLS;
       tok = strtok_r(NULL, ",", &save))
    if (*tok) urls[n++] = tok;
  return n;
}

static int connect_to(const char *server_url, int timeout_ms, grove_client **out) {
  char buf[2048];
  const char *urls[MAX_URLS];
  size_t n = server_urls(server_url, buf, sizeof buf, urls);
  if (n == 0) return fail(EXIT_USAGE, "--server: no URL given");
  grove_client_opts o = {.default_timeout_ms = timeout_ms};
  grove_err err = {0};
  grove_status s = grove_client_open(urls, n, &o, out, &err);
  if (s) return call_failed(s, &err, NULL);
  return 0;
}

/* ============================================================ printing */

typedef struct num {
  bool is_int;
  int64_t i;
  double d;
} num;

static num elem(const grove_tensor *t, int64_t k) {
  /* Tensors here are contiguous (client outputs, .npy reads). */
  const unsigned char *p = (const unsigned char *)t->data + k * (int64_t)grove_dtype_size(t->dtype);
  num v = {0};
  switch (t->dtype) {
    case GROVE_F32: {
      float f;
      memcpy(&f, p, 4);
      v.d = f;
      break;
    }
    case GROVE_F64:
      memcpy(&v.d, p, 8);
      break;
    case GROVE_F16:
    case GROVE_BF16: {
      uint16_t h;
      memcpy(&h, p, 2);
      v.d = t->dtype == GROVE_F16 ? grove_f16_to_f32(h) : grove_bf16_to_f32(h);
      break;
    }
    case GROVE_I64:
      v.is_int = true;
      memcpy(&v.i, p, 8);
      break;
    case GROVE_I32: {
      int32_t x;
      memcpy(&x, p, 4);
      v.is_int = true;
      v.i = x;
      break;
    }
    case GROVE_I16: {
      int16_t x;
      memcpy(&x, p, 2);
      v.is_int = true;
      v.i = x;
      break;
    }
    case GROVE_I8:
      v.is_int = true;
      v.i = (int8_t)p[0];
      break;
    case GROVE_U8:
    case GROVE_BOOL:
      v.is_int = true;
      v.i = p[0];
      break;
    default:
      break;
  }
  return v;
}

enum { SHOW_ROWS = 8, SHOW_COLS = 10 };

/* As grove.c prints predict --local's outputs (docs/cli.md). */
static void print_tensor(const char *name, const grove_tensor *t) {
  char sh[256];
  printf("%s %s %s\n", name, grove_dtype_name(t->dtype),
         grove_shape_str(t->ndim, t->shape, sh, sizeof sh));
  int64_t numel = grove_tensor_numel(t);
  if (numel == 0) return;
  int64_t rows = t->ndim ? t->shape[0] : 1;
  int64_t cols = numel / rows;
  for (int64_t r = 0; r < rows && r < SHOW_ROWS; r++) {
    printf("  [%lld]", (long long)r);
    for (int64_t c = 0; c < cols && c < SHOW_COLS; c++) {
      num v = elem(t, r * cols + c);
      if (v.is_int)
        printf(" %lld", (long long)v.i);
      else
        printf(" %.7g", v.d);
    }
    if (cols > SHOW_COLS) printf(" ... (%lld values)", (long long)cols);
    putchar('\n');
  }
  if (rows > SHOW_ROWS) printf("  ... (%lld rows)\n", (long long)rows);
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
  if (s) return call_failed(s, &err, "status");
  printf("server: groved %s (protocol %u), up %.1f s, %u worker%s x %u compute thread%s, %s\n",
         st->server_version, st->protocol, (double)st->uptime_ms / 1000.0, st->workers,
         st->workers == 1 ? "" : "s", st->blas_threads, st->blas_threads == 1 ? "" : "s",
         st->draining ? "draining"
         : st->ready  ? "ready"
                      : "not ready");
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

static bool same_value(num a, num b) {
  if (a.is_int && b.is_int) return a.i == b.i;
  if (!a.is_int && !b.is_int) return a.d == b.d || (isnan(a.d) && isnan(b.d));
  num f = a.is_int ? b : a, n = a.is_int ? a : b;
  if (!(f.d >= -9223372036854775808.0 && f.d < 9223372036854775808.0)) return false;
  return (double)(int64_t)f.d == f.d && (int64_t)f.d == n.i;
}

/* src in dtype want when no element changes (the rule of predict --local);
 * floats never become integers (those are indices). */
static grove_status convert_lossless(const grove_tensor *src, grove_dtype want, const char *path,
                                     const char *iname, grove_tensor **out, grove_err *err) {
  if (grove_dtype_is_float(src->dtype) && !grove_dtype_is_float(want))
    return grove_err_set(
        err, GROVE_E_DTYPE, "%s holds %s, but input '%s' takes %s (indices): save it as %s", path,
        grove_dtype_name(src->dtype), iname, grove_dtype_name(want), grove_dtype_name(want));
  grove_err cerr = {0};
  grove_tensor *t = grove_tensor_clone(src, want, &cerr);
  if (!t)
    return grove_err_set(err, GROVE_E_DTYPE,
                         "%s: %s does not convert to %s, which input '%s' "
                         "takes: %s",
                         path, grove_dtype_name(src->dtype), grove_dtype_name(want), iname,
                         grove_err_msg(&cerr));
  int64_t n = grove_tensor_numel(src);
  for (int64_t k = 0; k < n; k++) {
    num a = elem(src, k), b = elem(t, k);
    if (same_value(a, b)) continue;
    grove_tensor_release(t);
    return grove_err_set(err, GROVE_E_DTYPE,
                         "%s: input '%s' takes %s, and element %lld of this %s array has no "
                         "exact %s value; convert it yourself if rounding is acceptable",
                         path, iname, grove_dtype_name(want), (long long)k,
                         grove_dtype_name(src->dtype), grove_dtype_name(want));
  }
  *out = t;
  return GROVE_OK;
}

enum { P_HELP, P_OUTPUT, P_TIMEOUT, P_LOCAL };

static int cmd_predict(const char *server, int argc, char **argv) {
  static const opt_def defs[] = {{"help", 'h', false},
                                 {"output", 'o', true},
                                 {"timeout-ms", 0, true},
                                 {"local", 0, true},
                                 {0}};
  parsed p;
  int rc = parse_args("predict", argc, argv, defs, &p);
  if (rc) return rc;
  bool dup = false;
  if (opt_value(&p, P_HELP, &dup)) {
    fputs(predict_help, stdout);
    return EXIT_OK;
  }
  long long timeout = 30000;
  const char *tv = opt_value(&p, P_TIMEOUT, &dup);
  if (dup) return usage_error("predict", "--timeout-ms given twice");
  if (tv && !parse_int(tv, 1, 86400000, &timeout))
    return usage_error("predict", "--timeout-ms wants milliseconds from 1 to 86400000, not '%s'",
                       tv);
  if (p.npos < 1) return usage_error("predict", "needs a MODEL and an INPUT.npy");
  if (p.npos < 2) return usage_error("predict", "needs an INPUT.npy after the model");
  const char *model = p.pos[0];
  const char *outputs[MAX_ARGS];
  size_t nout = 0;
  for (int i = 0; i < p.nopts; i++)
    if (p.opts[i].def == P_OUTPUT) outputs[nout++] = p.opts[i].value;
  for (size_t i = 0; i < nout; i++)
    for (size_t j = 0; j < i; j++)
      if (strcmp(outputs[i], outputs[j]) == 0)
        return usage_error("predict", "-o %s given twice", outputs[i]);

  size_t nin = (size_t)p.npos - 1;
  grove_tensor *in[MAX_ARGS] = {0};
  grove_tensor args[MAX_ARGS];
  grove_client *c = NULL;
  grove_model_info *mi = NULL;
  grove_prediction pred = {0};
  grove_err err = {0};
  grove_status s;
  rc = EXIT_OK;
  /* Inputs first: a wrong file is found before the server is asked. */
  for (size_t i = 0; i < nin; i++)
    if (grove_npy_read(p.pos[i + 1], &in[i], &err)) {
      rc = fail(EXIT_REFUSED, "%s", grove_err_msg(&err));
      goto done;
    }
  if ((rc = connect_to(server, (int)timeout, &c))) goto done;
  if ((s = grove_client_model_info(c, model, (int)timeout, &mi, &err))) {
    rc = call_failed(s, &err, NULL);
    goto done;
  }
  if (!mi->ready) {
    rc = fail(EXIT_REFUSED, "model %s is not loaded on the server: %s", model, mi->error);
    goto done;
  }
  if (nin != mi->ninputs) {
    rc = fail(EXIT_REFUSED, "model %s takes %zu input%s, %zu .npy file%s given", model, mi->ninputs,
              mi->ninputs == 1 ? "" : "s", nin, nin == 1 ? " was" : "s were");
    goto done;
  }
  if (nout > mi->noutputs) {
    rc = fail(EXIT_REFUSED, "model %s has %zu output%s, %zu -o files were given", model,
              mi->noutputs, mi->noutputs == 1 ? "" : "s", nout);
    goto done;
  }
  for (size_t i = 0; i < nin; i++) {
    grove_dtype want = mi->inputs[i].dtype;
    if (in[i]->dtype != want) {
      grove_tensor *cv = NULL;
      if (convert_lossless(in[i], want, p.pos[i + 1], mi->inputs[i].name, &cv, &err)) {
        rc = fail(EXIT_REFUSED, "%s", grove_err_msg(&err));
        goto done;
      }
      grove_tensor_release(in[i]);
      in[i] = cv;
    }
    args[i] = *in[i];
  }
  if ((s = grove_client_predict(c, model, args, nin, (int)timeout, &pred, &err))) {
    rc = call_failed(s, &err, NULL);
    goto done;
  }
  for (size_t k = 0; k < pred.noutputs; k++) {
    if (k < nout) {
      if (grove_npy_write(outputs[k], pred.outputs[k], &err)) {
        rc = fail(EXIT_REFUSED, "%s", grove_err_msg(&err));
        goto done;
      }
      continue;
    }
    char fallback[32];
    snprintf(fallback, sizeof fallback, "output%zu", k);
    print_tensor(pred.names[k] && *pred.names[k] ? pred.names[k] : fallback, pred.outputs[k]);
  }
done:
  grove_prediction_fini(&pred);
  grove_model_info_free(mi);
  grove_client_close(c);
  for (size_t i = 0; i < nin; i++) grove_tensor_release(in[i]);
  return rc;
}

/* ============================================================ bench */

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

enum { FREE_DIM = 16, MAX_SAMPLES_PER_THREAD = 4 << 20 };

/* The inputs of bench --local (xorshift64*, same seed). */
static void fill_random(grove_tensor *t, uint64_t *state) {
  int64_t n = grove_tensor_numel(t);
  if (t->dtype != GROVE_F32 && t->dtype != GROVE_F64) return;
  for (int64_t k = 0; k < n; k++) {
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    uint64_t r = *state * 2685821657736338717ull;
    double u = (double)(r >> 11) * (1.0 / 9007199254740992.0) * 2.0 - 1.0;
    if (t->dtype == GROVE_F32)
      ((float *)t->data)[k] = (float)u;
    else
      ((double *)t->data)[k] = u;
  }
}

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
  double t1 = now_s();
  if (p) grove_prediction_fini(p);
  vclient_record(v, s, err, t1);
  if (t1 < v->end) vclient_start(v);
}

static void vclient_start(vclient *v) {
  grove_err err = {0};
  v->t0 = now_s();
  grove_status s = grove_client_predict_async(v->c, v->model, v->args, v->nin, v->timeout_ms,
                                              vclient_done, v, &err);
  if (s) {
    /* Could not even send (out of memory): count it and stop this client. */
    v->t0 = v->warm_end;
    vclient_record(v, s, &err, now_s());
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
  static const opt_def defs[] = {{"help", 'h', false},
                                 {"concurrency", 0, true},
                                 {"batch", 0, true},
                                 {"seconds", 0, true},
                                 {"timeout-ms", 0, true},
                                 {"local", 0, true},
                                 {0}};
  parsed p;
  int rc = parse_args("bench", argc, argv, defs, &p);
  if (rc) return rc;
  bool dup = false;
  if (opt_value(&p, B_HELP, &dup)) {
    fputs(bench_help, stdout);
    return EXIT_OK;
  }
  const char *cv = opt_value(&p, B_CONC, &dup), *bv = opt_value(&p, B_BATCH, &dup),
             *sv = opt_value(&p, B_SECONDS, &dup), *tv = opt_value(&p, B_TIMEOUT, &dup);
  if (dup) return usage_error("bench", "an option was given twice");
  if (p.npos == 0) return usage_error("bench", "needs a MODEL (or --local MODEL_DIR)");
  if (p.npos > 1) return usage_error("bench", "unexpected argument '%s'", p.pos[1]);
  if (!cv) return usage_error("bench", "needs --concurrency C");
  if (!bv) return usage_error("bench", "needs --batch B");
  long long conc, batch, timeout = 30000;
  double seconds = 3.0;
  if (!parse_int(cv, 1, 4096, &conc))
    return usage_error("bench", "--concurrency wants an integer from 1 to 4096, not '%s'", cv);
  if (!parse_int(bv, 1, 1 << 24, &batch))
    return usage_error("bench", "--batch wants a positive integer, not '%s'", bv);
  if (sv && !parse_seconds(sv, &seconds))
    return usage_error("bench", "--seconds wants a positive number, not '%s'", sv);
  if (tv && !parse_int(tv, 1, 86400000, &timeout))
    return usage_error("bench", "--timeout-ms wants milliseconds from 1 to 86400000, not '%s'", tv);
  const char *model = p.pos[0];

  grove_client *c = NULL;
  grove_model_info *mi = NULL;
  grove_tensor *in[GROVE_MAX_VALUES] = {0};
  grove_tensor args[GROVE_MAX_VALUES];
  vclient *th = NULL;
  size_t nin = 0;
  grove_err err = {0};
  grove_status s;
  if ((rc = connect_to(server, (int)timeout, &c))) goto done;
  if ((s = grove_client_model_info(c, model, (int)timeout, &mi, &err))) {
    rc = call_failed(s, &err, NULL);
    goto done;
  }
  if (!mi->ready) {
    rc = fail(EXIT_REFUSED, "model %s is not loaded on the server: %s", model, mi->error);
    goto done;
  }
  if (mi->ninputs == 0 || mi->ninputs > GROVE_MAX_VALUES) {
    rc = fail(EXIT_REFUSED, "model %s declares %zu inputs", model, mi->ninputs);
    goto done;
  }
  uint64_t state = 0x9E3779B97F4A7C15ull;
  nin = mi->ninputs;
  for (size_t i = 0; i < nin; i++) {
    const grove_io_spec *sp = &mi->inputs[i];
    int64_t shape[GROVE_MAX_DIMS];
    for (int d = 0; d < sp->ndim; d++)
      shape[d] = d == 0 ? batch : sp->shape[d] < 0 ? FREE_DIM : sp->shape[d];
    if (!(in[i] = grove_tensor_new(sp->dtype, sp->ndim, shape, &err))) {
      rc = fail(EXIT_REFUSED, "%s", grove_err_msg(&err));
      goto done;
    }
    fill_random(in[i], &state);
    args[i] = *in[i];
    char sh[256];
    printf("input %s: %s %s\n", sp->name, grove_dtype_name(sp->dtype),
           grove_shape_str(sp->ndim, shape, sh, sizeof sh));
  }
  th = calloc((size_t)conc, sizeof *th);
  if (!th) {
    rc = fail(EXIT_REFUSED, "out of memory");
    goto done;
  }
  double warm = seconds / 5 < 0.5 ? seconds / 5 : 0.5;
  double start = now_s();
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
  for (double left; (left = start + warm + seconds - now_s()) > 0;) {
    struct timespec ts = {(time_t)left, (long)((left - (double)(time_t)left) * 1e9)};
    nanosleep(&ts, NULL);
  }
  grove_client_wait_idle(c);
  double elapsed = now_s() - (start + warm);
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
    "Asks groved to load new weights into MODEL while it serves (grove --server URL reload\n"
    "...).  CHECKPOINT is a .safetensors/.pt/.pth/.bin file on the server's machine (a\n"
    "relative name is made absolute with this directory); without it the model directory's\n"
    "weights file is read again.  --model-dir serves another model directory under the same\n"
    "name.  --non-strict allows missing and unexpected keys (load_state_dict(strict=False)).\n"
    "--in-place loads into the serving tree instead of building a second one, for models too\n"
    "large to hold twice: the model's requests wait during the swap (the pause is printed).\n"
    "The command returns once the new version serves and prints its number.  A checkpoint\n"
    "that does not fit changes nothing: the missing keys, unexpected keys and mismatches are\n"
    "printed and the exit status is 1 (also when another reload of MODEL is in progress).\n"
    "--timeout-ms: how long to wait (default 120000).  With several --server URLs\n"
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

static int reload_one(const char *server, const char *model, const grove_reload_opts *o,
                      int timeout);

static int cmd_reload(const char *server, int argc, char **argv) {
  static const opt_def defs[] = {{"help", 'h', false},    {"non-strict", 0, false},
                                 {"model-dir", 0, true},  {"in-place", 0, false},
                                 {"timeout-ms", 0, true}, {0}};
  parsed p;
  int rc = parse_args("reload", argc, argv, defs, &p);
  if (rc) return rc;
  bool dup = false;
  if (opt_value(&p, R_HELP, &dup)) {
    fputs(reload_help, stdout);
    return EXIT_OK;
  }
  long long timeout = 120000;
  const char *tv = opt_value(&p, R_TIMEOUT, &dup);
  const char *dir = opt_value(&p, R_MODELDIR, &dup);
  if (dup) return usage_error("reload", "an option given twice");
  if (tv && !parse_int(tv, 1, 86400000, &timeout))
    return usage_error("reload", "--timeout-ms wants milliseconds from 1 to 86400000, not '%s'",
                       tv);
  if (p.npos < 1) return usage_error("reload", "needs a MODEL");
  if (p.npos > 2) return usage_error("reload", "unexpected argument '%s'", p.pos[2]);
  bool in_place = opt_value(&p, R_INPLACE, &dup) != NULL;
  if (in_place && dir)
    return usage_error("reload", "--in-place keeps the architecture; it cannot take --model-dir");
  char *ckbuf = NULL, *dirbuf = NULL;
  grove_reload_opts o = {.checkpoint = server_path(p.npos > 1 ? p.pos[1] : NULL, &ckbuf),
                         .model_dir = server_path(dir, &dirbuf),
                         .non_strict = opt_value(&p, R_NONSTRICT, &dup) != NULL,
                         .in_place = in_place};
  /* Replicas are reloaded one after the other, each by a client of its own
   * (a client of several URLs refuses a reload: docs/operations.md). */
  char ubuf[2048];
  const char *urls[MAX_URLS];
  size_t nurls = server_urls(server, ubuf, sizeof ubuf, urls);
  int worst = nurls ? EXIT_OK : fail(EXIT_USAGE, "--server: no URL given");
  for (size_t u = 0; u < nurls; u++) {
    if (nurls > 1) printf("%s: ", urls[u]);
    fflush(stdout);
    rc = reload_one(nurls > 1 ? urls[u] : server, p.pos[0], &o, (int)timeout);
    if (nurls > 1 && rc) printf("failed (exit %d)\n", rc);
    if (rc > worst) worst = rc;
  }
  free(ckbuf);
  free(dirbuf);
  return worst;
}

/* One replica's reload, reported on stdout (stderr when it fails). */
static int reload_one(const char *server, const char *model, const grove_reload_opts *o,
                      int timeout) {
  grove_client *c = NULL;
  int rc = connect_to(server, timeout, &c);
  if (rc) return rc;
  grove_err err = {0};
  grove_reload_result res;
  grove_status s = grove_client_reload(c, model, o, timeout, &res, &err);
  if (s) {
    char what[300];
    snprintf(what, sizeof what, "reload of model '%s'", model);
    rc = call_failed(s, &err, what);
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
    "Writes the state_dict MODEL serves right now (grove --server URL export ...): its\n"
    "parameters and persistent buffers, dotted keys in PyTorch's order, the dtypes as\n"
    "loaded, all from one version (printed).  The format follows the extension: .safetensors,\n"
    "or .pt/.pth/.bin for a torch.save archive that torch.load(weights_only=True) reads.\n"
    "--prefix keeps only the keys that start with P.  The file is streamed in chunks to a\n"
    "temporary name beside FILE and renamed when complete, so a failed export leaves no\n"
    "file; an existing FILE is refused unless --force.  --timeout-ms bounds each round\n"
    "trip (default 60000).  Exit 0 ok, 1 refused, 2 usage, 3 the server cannot be reached.\n";

enum { E_HELP, E_OUTPUT, E_FORCE, E_PREFIX, E_TIMEOUT, E_CHUNK };

static int cmd_export(const char *server, int argc, char **argv) {
  static const opt_def defs[] = {{"help", 'h', false},
                                 {"output", 'o', true},
                                 {"force", 'f', false},
                                 {"prefix", 0, true},
                                 {"timeout-ms", 0, true},
                                 {"chunk-bytes", 0, true},
                                 {0}};
  parsed p;
  int rc = parse_args("export", argc, argv, defs, &p);
  if (rc) return rc;
  bool dup = false;
  if (opt_value(&p, E_HELP, &dup)) {
    fputs(export_help, stdout);
    return EXIT_OK;
  }
  long long timeout = 60000, chunk = 0;
  const char *out = opt_value(&p, E_OUTPUT, &dup);
  const char *tv = opt_value(&p, E_TIMEOUT, &dup);
  const char *cv = opt_value(&p, E_CHUNK, &dup);
  const char *prefix = opt_value(&p, E_PREFIX, &dup);
  if (dup) return usage_error("export", "an option given twice");
  if (tv && !parse_int(tv, 1, 86400000, &timeout))
    return usage_error("export", "--timeout-ms wants milliseconds from 1 to 86400000, not '%s'",
                       tv);
  if (cv && !parse_int(cv, 1, (long long)1 << 30, &chunk))
    return usage_error("export", "--chunk-bytes wants 1 to 2^30, not '%s'", cv);
  if (p.npos < 1) return usage_error("export", "needs a MODEL");
  if (p.npos > 1) return usage_error("export", "unexpected argument '%s'", p.pos[1]);
  if (!out || !*out) return usage_error("export", "needs -o FILE.safetensors or -o FILE.pt");
  grove_client *c = NULL;
  if ((rc = connect_to(server, (int)timeout, &c))) return rc;
  grove_err err = {0};
  grove_export_info info;
  grove_export_opts o = {.prefix = prefix, .chunk_bytes = (size_t)chunk};
  double t0 = now_s();
  grove_status s = grove_client_export_file(c, p.pos[0], out, opt_value(&p, E_FORCE, &dup) != NULL,
                                            &o, (int)timeout, &info, &err);
  if (s) {
    char what[300];
    snprintf(what, sizeof what, "export of model '%s'", p.pos[0]);
    rc = call_failed(s, &err, what);
  } else {
    double dt = now_s() - t0;
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
    static const opt_def defs[] = {{"help", 'h', false}, {"timeout-ms", 0, true}, {0}};
    parsed p;
    int rc = parse_args("status", argc, argv, defs, &p);
    if (rc) return rc;
    bool dup = false;
    if (opt_value(&p, 0, &dup)) {
      fputs(status_help, stdout);
      return EXIT_OK;
    }
    long long timeout = 10000;
    const char *tv = opt_value(&p, 1, &dup);
    if (dup) return usage_error("status", "--timeout-ms given twice");
    if (tv && !parse_int(tv, 1, 86400000, &timeout))
      return usage_error("status", "--timeout-ms wants milliseconds, not '%s'", tv);
    if (p.npos) return usage_error("status", "unexpected argument '%s'", p.pos[0]);
    grove_client *c = NULL;
    if ((rc = connect_to(server_url, (int)timeout, &c))) return rc;
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
