/* grove.c: the `grove` command-line tool.
 *
 * This file holds main, the argument parser, the help texts and the local
 * commands, which run libgrove in this process:
 *
 *   grove inspect FILE|MODEL_DIR
 *   grove predict --local MODEL_DIR INPUT.npy... [-o OUTPUT.npy]...
 *   grove bench --local MODEL_DIR --batch B [--seconds S] [--threads N]
 *
 * The server commands (status, predict MODEL, reload, export, hook, watch,
 * bench MODEL --concurrency) arrive with groved; until then they are unknown
 * commands, i.e. usage errors.
 *
 * Exit status: 0 ok, 1 the file or the model said no (the reason on stderr),
 * 2 usage error, 3 cannot reach the server (not used yet).
 */
#define _GNU_SOURCE /* sched_getaffinity, to count the cores we may use */

#include <errno.h>
#include <math.h>
#include <sched.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "grove/grove.h"
#include "cli_remote.h"
#include "npy.h"

enum { EXIT_OK = 0, EXIT_REFUSED = 1, EXIT_USAGE = 2, EXIT_UNREACHABLE = 3 };

/* ============================================================ messages */

static grove_log_level log_threshold = GROVE_LOG_WARN;

/* libgrove may log from any thread; one fprintf is one locked stdio call, so
 * lines never interleave. */
static void log_to_stderr(void *user, grove_log_level level, const char *id, const char *msg) {
  (void)user;
  if (level < log_threshold) return;
  fprintf(stderr, "grove: %s %s: %s\n", grove_log_level_name(level), id, msg);
}

/* "grove: <message>" on stderr; returns EXIT_REFUSED for `return fail(...)`. */
static int fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int fail(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs("grove: ", stderr);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
  return EXIT_REFUSED;
}

/* A library error: its message, which names the file, key or shape.  When
 * it does not name `what` (the path the user gave), that goes in front. */
static int fail_err(const grove_err *err, const char *what) {
  const char *msg = grove_err_msg(err);
  if (what && !strstr(msg, what)) return fail("%s: %s", what, msg);
  return fail("%s", msg);
}

/* A usage error: the message and where to read more; exit status 2. */
static int usage_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int usage_error(const char *cmd, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs(cmd ? "grove " : "grove", stderr);
  if (cmd) fputs(cmd, stderr);
  fputs(": ", stderr);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
  if (cmd)
    fprintf(stderr, "Try 'grove %s --help'.\n", cmd);
  else
    fputs("Try 'grove --help'.\n", stderr);
  return EXIT_USAGE;
}

/* ============================================================ help texts */

static const char main_help_head[] =
    "usage: grove [-v] [--server URL] [--pub URL] COMMAND [ARGS...]\n"
    "\n"
    "The command-line tool of Grove, a model server for PyTorch models.\n"
    "\n"
    "Server commands (groved at --server URL; default $GROVE_SERVER, else\n"
    "tcp://127.0.0.1:7700; several URLs separated by commas):\n";

static const char main_help[] =
    "\n"
    "Local commands:\n"
    "  inspect FILE|MODEL_DIR    keys, dtypes, shapes and sizes of a checkpoint\n"
    "                            (.safetensors, .pt), a .npy file or a model directory\n"
    "  predict --local MODEL_DIR INPUT.npy [-o OUTPUT.npy]\n"
    "                            run a model directory on an input, in this process\n"
    "  bench --local MODEL_DIR --batch B [--seconds S] [--threads N]\n"
    "                            measure forward throughput, in this process\n"
    "  convert IN OUT [--force]  rewrite a checkpoint as .safetensors or .pt\n"
    "  help [COMMAND]            this text, or a command's\n"
    "\n"
    "Options:\n"
    "  -v, --verbose   also print libgrove's info messages (warnings always show)\n"
    "  --server URL    the groved to talk to (server commands)\n"
    "  --pub URL       groved's telemetry PUB socket (watch; default $GROVE_PUB, else\n"
    "                  tcp://127.0.0.1:7702)\n"
    "  --version       print the version and exit\n"
    "  -h, --help      print this help and exit\n"
    "\n"
    "'grove COMMAND --help' describes a command.  Tensors are NumPy .npy files.\n"
    "Exit status: 0 ok, 1 the server, the file or the model said no (the reason is\n"
    "on stderr), 2 usage error, 3 cannot reach the server.\n";

/* The whole help: server commands (from cli_remote.c), then the local ones. */
static void print_main_help(FILE *f) {
  fputs(main_help_head, f);
  fputs(grove_cli_remote_usage, f);
  fputs(main_help, f);
}

static const char inspect_help[] =
    "usage: grove inspect FILE|MODEL_DIR\n"
    "\n"
    "Prints what a file holds, without running anything:\n"
    "  - a checkpoint (.safetensors, or a torch.save .pt/.pth/.bin archive): each\n"
    "    key with its dtype, shape and bytes, and the totals;\n"
    "  - a .npy file: its format version, dtype, shape and bytes;\n"
    "  - a model directory (or its model.json): the model's name, inputs and\n"
    "    outputs, parameter count, batching settings and scratch size, then its\n"
    "    state_dict as above.  The model is opened as the server would open it,\n"
    "    so anything the server would refuse is refused here.\n"
    "\n"
    "A file that cannot be read exits with status 1 and the reason on stderr.\n";

static const char predict_help[] =
    "usage: grove predict --local MODEL_DIR INPUT.npy... [-o OUTPUT.npy]...\n"
    "\n"
    "Opens the model directory in this process, runs one forward pass on the\n"
    "inputs (one .npy file per model input, batch dimension first) and writes\n"
    "the outputs.\n"
    "\n"
    "Options:\n"
    "  --local MODEL_DIR   the model directory (model.json + weights); required\n"
    "                      until groved serves predictions\n"
    "  -o, --output FILE   write the output as a .npy file (repeat for a model with\n"
    "                      several outputs).  Without -o the output's dtype and\n"
    "                      shape are printed with the first values of the first rows.\n"
    "  --threads N         compute threads (default: the number of cores)\n"
    "\n"
    "An input whose dtype differs from the model's is converted only when no value\n"
    "changes (float64 0.5 -> float32; int32 -> int64); otherwise it is refused.\n"
    "Floats are never turned into indices.\n";

static const char bench_help[] =
    "usage: grove bench --local MODEL_DIR --batch B [--seconds S] [--threads N]\n"
    "\n"
    "Opens the model directory in this process and runs forward repeatedly on\n"
    "random input (floats uniform in [-1, 1), integer inputs zero) of batch B:\n"
    "first a short warm-up, then for S seconds.  Dimensions the model leaves\n"
    "free besides the batch are set to 16.  The last line is\n"
    "\n"
    "  batch=B samples_per_s=X ms_per_batch=X\n"
    "\n"
    "Options:\n"
    "  --local MODEL_DIR   the model directory; required until groved serves\n"
    "  --batch B           rows per forward (>= 1)\n"
    "  --seconds S         how long to measure (default 3)\n"
    "  --threads N         compute threads (default: the number of cores)\n";

/* ============================================================ argument parsing */

typedef struct opt_def {
  const char *long_name; /* without "--" */
  char short_name;       /* 0 for none */
  bool takes_value;
  int id;
} opt_def;

typedef struct parsed_opt {
  int id;
  const char *name; /* as the user wrote it, for messages */
  const char *value;
} parsed_opt;

#define MAX_ARGS 64

typedef struct parsed {
  parsed_opt opts[MAX_ARGS];
  int nopts;
  const char *pos[MAX_ARGS];
  int npos;
} parsed;

enum { OPT_HELP = 1, OPT_LOCAL, OPT_OUTPUT, OPT_BATCH, OPT_SECONDS, OPT_THREADS, OPT_FORCE };

/* Parses argv[0..argc) of a command: options anywhere ("--name value",
 * "--name=value", "-x value"), "--" ends them.  Returns 0, or EXIT_USAGE
 * after printing why. */
static int parse_args(const char *cmd, int argc, char **argv, const opt_def *defs, parsed *p) {
  memset(p, 0, sizeof *p);
  bool only_pos = false;
  for (int i = 0; i < argc; i++) {
    const char *a = argv[i];
    if (only_pos || a[0] != '-' || a[1] == '\0') {
      if (p->npos == MAX_ARGS) return usage_error(cmd, "too many arguments");
      p->pos[p->npos++] = a;
      continue;
    }
    if (strcmp(a, "--") == 0) {
      only_pos = true;
      continue;
    }
    const opt_def *d = NULL;
    const char *inline_value = NULL;
    if (a[1] == '-') {
      const char *name = a + 2;
      const char *eq = strchr(name, '=');
      size_t n = eq ? (size_t)(eq - name) : strlen(name);
      for (const opt_def *o = defs; o->long_name; o++)
        if (strlen(o->long_name) == n && strncmp(o->long_name, name, n) == 0) d = o;
      if (d && eq) inline_value = eq + 1;
    } else if (a[2] == '\0') {
      for (const opt_def *o = defs; o->long_name; o++)
        if (o->short_name && o->short_name == a[1]) d = o;
    } else {
      /* "-ofile": a short option with its value attached. */
      for (const opt_def *o = defs; o->long_name; o++)
        if (o->short_name && o->short_name == a[1] && o->takes_value) d = o;
      if (d) inline_value = a + 2;
    }
    if (!d) return usage_error(cmd, "unknown option '%s'", a);
    if (p->nopts == MAX_ARGS) return usage_error(cmd, "too many options");
    parsed_opt *po = &p->opts[p->nopts++];
    po->id = d->id;
    po->name = a;
    if (d->takes_value) {
      if (inline_value)
        po->value = inline_value;
      else if (i + 1 < argc)
        po->value = argv[++i];
      else
        return usage_error(cmd, "option '%s' needs a value", a);
    } else if (inline_value) {
      return usage_error(cmd, "option '--%s' takes no value", d->long_name);
    }
  }
  return 0;
}

static bool has_opt(const parsed *p, int id) {
  for (int i = 0; i < p->nopts; i++)
    if (p->opts[i].id == id) return true;
  return false;
}

/* The value of an option that may appear once: NULL when absent;
 * *dup set when it appears twice. */
static const parsed_opt *single_opt(const parsed *p, int id, bool *dup) {
  const parsed_opt *found = NULL;
  for (int i = 0; i < p->nopts; i++) {
    if (p->opts[i].id != id) continue;
    if (found) *dup = true;
    found = &p->opts[i];
  }
  return found;
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

/* The cores this process may run on (its affinity mask), else online ones. */
static int available_cores(void) {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? (int)n : 1;
}

/* --threads N, or the number of cores.  Returns 0 or EXIT_USAGE. */
static int threads_option(const char *cmd, const parsed *p, int *threads) {
  bool dup = false;
  const parsed_opt *o = single_opt(p, OPT_THREADS, &dup);
  if (dup) return usage_error(cmd, "--threads given twice");
  *threads = available_cores();
  if (o) {
    long long v;
    if (!parse_int(o->value, 1, 1024, &v))
      return usage_error(cmd, "--threads wants an integer from 1 to 1024, not '%s'", o->value);
    *threads = (int)v;
  }
  return 0;
}

/* ============================================================ printing */

static char *shape_text(int ndim, const int64_t *shape, char *buf, size_t n) {
  return grove_shape_str(ndim, shape, buf, n);
}

/* Offset in elements of the k-th element in C order, following strides. */
static int64_t elem_offset(const grove_tensor *t, int64_t k) {
  int64_t off = 0;
  for (int i = t->ndim - 1; i >= 0; i--) {
    int64_t n = t->shape[i] > 0 ? t->shape[i] : 1;
    off += (k % n) * t->strides[i];
    k /= n;
  }
  return off;
}

/* One element as a number: an integer or a double (every float dtype widens
 * exactly to double). */
typedef struct num {
  bool is_int;
  int64_t i;
  double d;
} num;

static num elem(const grove_tensor *t, int64_t k) {
  size_t es = grove_dtype_size(t->dtype);
  const unsigned char *p = (const unsigned char *)t->data + elem_offset(t, k) * (int64_t)es;
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

static void print_num(num v) {
  if (v.is_int)
    printf(" %lld", (long long)v.i);
  else
    printf(" %.7g", v.d);
}

enum { SHOW_ROWS = 8, SHOW_COLS = 10 };

/* "NAME DTYPE SHAPE" then the first values of the first rows: a row is an
 * index of dimension 0 (the batch), its values the rest, flattened. */
static void print_tensor(const char *name, const grove_tensor *t) {
  char sh[256];
  printf("%s %s %s\n", name, grove_dtype_name(t->dtype),
         shape_text(t->ndim, t->shape, sh, sizeof sh));
  int64_t numel = grove_tensor_numel(t);
  if (numel == 0) return;
  int64_t rows = t->ndim ? t->shape[0] : 1;
  int64_t cols = numel / rows;
  for (int64_t r = 0; r < rows && r < SHOW_ROWS; r++) {
    printf("  [%lld]", (long long)r);
    for (int64_t c = 0; c < cols && c < SHOW_COLS; c++) print_num(elem(t, r * cols + c));
    if (cols > SHOW_COLS) printf(" ... (%lld values)", (long long)cols);
    putchar('\n');
  }
  if (rows > SHOW_ROWS) printf("  ... (%lld rows)\n", (long long)rows);
}

/* ============================================================ inspect */

static void print_state_dict(const grove_state_dict *sd) {
  size_t n = grove_sd_count(sd);
  int kw = 3, dw = 5, sw = 5;
  char sh[256];
  for (size_t i = 0; i < n; i++) {
    const grove_tensor *t = grove_sd_tensor(sd, i);
    int k = (int)strlen(grove_sd_key(sd, i));
    int d = (int)strlen(grove_dtype_name(t->dtype));
    int s = (int)strlen(shape_text(t->ndim, t->shape, sh, sizeof sh));
    if (k > kw) kw = k < 72 ? k : 72;
    if (d > dw) dw = d;
    if (s > sw) sw = s < 40 ? s : 40;
  }
  printf("  %-*s  %-*s  %-*s  %s\n", kw, "key", dw, "dtype", sw, "shape", "bytes");
  int64_t elements = 0;
  for (size_t i = 0; i < n; i++) {
    const grove_tensor *t = grove_sd_tensor(sd, i);
    printf("  %-*s  %-*s  %-*s  %zu\n", kw, grove_sd_key(sd, i), dw, grove_dtype_name(t->dtype), sw,
           shape_text(t->ndim, t->shape, sh, sizeof sh), grove_tensor_nbytes(t));
    elements += grove_tensor_numel(t);
  }
  printf("total: %zu tensors, %lld elements, %zu bytes\n", n, (long long)elements,
         grove_sd_nbytes(sd));
}

static void print_io(const char *title, const grove_io_spec *io, size_t n) {
  printf("%s:\n", title);
  if (n == 0) printf("  (none declared)\n");
  char sh[256];
  for (size_t i = 0; i < n; i++)
    printf("  %s %s %s\n", io[i].name ? io[i].name : "?", grove_dtype_name(io[i].dtype),
           shape_text(io[i].ndim, io[i].shape, sh, sizeof sh));
}

static int inspect_model(const char *dir) {
  grove_err err = {0};
  grove_model *m = NULL;
  if (grove_model_open(dir, NULL, &m, &err)) return fail_err(&err, dir);
  printf("model: %s\n", m->name ? m->name : "?");
  printf("directory: %s\n", m->dir ? m->dir : dir);
  printf("weights: %s\n", m->weights_path ? m->weights_path : "(none)");
  printf("module: %s\n", m->root ? grove_module_type_name(m->root) : "?");
  print_io("inputs", m->inputs, m->ninputs);
  print_io("outputs", m->outputs, m->noutputs);
  printf("parameters: %lld (%zu bytes of weights)\n", (long long)m->param_count, m->weight_bytes);
  printf("batching: max_batch_size=%lld max_queue_delay_us=%lld max_queue_size=%lld\n",
         (long long)m->batching.max_batch_size, (long long)m->batching.max_queue_delay_us,
         (long long)m->batching.max_queue_size);
  printf("scratch: %zu bytes per worker (one forward at batch %lld)\n", m->arena_bytes,
         (long long)m->batching.max_batch_size);
  int rc = EXIT_OK;
  grove_state_dict *sd = grove_sd_new();
  if (!sd)
    rc = fail("out of memory");
  else if (grove_module_state_dict(m->root, NULL, sd, &err))
    rc = fail_err(&err, dir);
  else {
    printf("state_dict:\n");
    print_state_dict(sd);
  }
  grove_sd_free(sd);
  grove_model_free(m);
  return rc;
}

static int inspect_npy(const char *path) {
  grove_err err = {0};
  grove_tensor *t = NULL;
  if (grove_npy_read(path, &t, &err)) return fail_err(&err, path);
  /* The read validated everything; the header is read again only to report
   * the format version. */
  unsigned char head[12] = {0};
  FILE *f = fopen(path, "rb");
  size_t n = f ? fread(head, 1, sizeof head, f) : 0;
  if (f) fclose(f);
  char sh[256];
  printf("%s: NumPy .npy version %d.%d\n", path, n >= 8 ? head[6] : 0, n >= 8 ? head[7] : 0);
  printf("  dtype %s, shape %s, %lld elements, %zu bytes\n", grove_dtype_name(t->dtype),
         shape_text(t->ndim, t->shape, sh, sizeof sh), (long long)grove_tensor_numel(t),
         grove_tensor_nbytes(t));
  grove_tensor_release(t);
  return EXIT_OK;
}

static int inspect_checkpoint(const char *path) {
  unsigned char head[64];
  FILE *f = fopen(path, "rb");
  if (!f) return fail("%s: cannot open: %s", path, strerror(errno));
  size_t n = fread(head, 1, sizeof head, f);
  fclose(f);
  if (n >= 6 && memcmp(head, "\x93NUMPY", 6) == 0) return inspect_npy(path);

  grove_err err = {0};
  grove_state_dict *sd = NULL;
  if (grove_checkpoint_read(path, &sd, &err)) return fail_err(&err, path);
  const char *format = "checkpoint";
  switch (grove_ckpt_detect(path, head, n)) {
    case GROVE_CKPT_SAFETENSORS:
      format = "safetensors";
      break;
    case GROVE_CKPT_TORCH_ZIP:
      format = "torch.save zip archive";
      break;
    default:
      break;
  }
  printf("%s: %s, %zu tensors\n", path, format, grove_sd_count(sd));
  print_state_dict(sd);
  grove_sd_free(sd);
  return EXIT_OK;
}

static int cmd_inspect(int argc, char **argv) {
  static const opt_def defs[] = {{"help", 'h', false, OPT_HELP}, {0}};
  parsed p;
  int rc = parse_args("inspect", argc, argv, defs, &p);
  if (rc) return rc;
  if (has_opt(&p, OPT_HELP)) {
    fputs(inspect_help, stdout);
    return EXIT_OK;
  }
  if (p.npos == 0) return usage_error("inspect", "needs a FILE or MODEL_DIR");
  if (p.npos > 1) return usage_error("inspect", "takes one FILE or MODEL_DIR, got %d", p.npos);
  const char *path = p.pos[0];
  struct stat st;
  if (stat(path, &st) != 0) return fail("%s: %s", path, strerror(errno));
  if (S_ISDIR(st.st_mode)) {
    size_t n = strlen(path);
    char *spec = malloc(n + sizeof "/model.json");
    if (!spec) return fail("out of memory");
    memcpy(spec, path, n);
    memcpy(spec + n, "/model.json", sizeof "/model.json");
    bool has_spec = access(spec, F_OK) == 0;
    free(spec);
    if (!has_spec)
      return fail("%s: a directory without model.json, so not a model directory", path);
    return inspect_model(path);
  }
  /* model.json stands for its directory. */
  const char *base = strrchr(path, '/');
  base = base ? base + 1 : path;
  if (strcmp(base, "model.json") == 0) {
    size_t dn = (size_t)(base - path);
    char *dir = dn ? strndup(path, dn) : strdup(".");
    if (!dir) return fail("out of memory");
    rc = inspect_model(dir);
    free(dir);
    return rc;
  }
  return inspect_checkpoint(path);
}

/* ============================================================ predict */

static bool same_value(num a, num b) {
  if (a.is_int && b.is_int) return a.i == b.i;
  if (!a.is_int && !b.is_int) return a.d == b.d || (isnan(a.d) && isnan(b.d));
  num f = a.is_int ? b : a, n = a.is_int ? a : b;
  if (!(f.d >= -9223372036854775808.0 && f.d < 9223372036854775808.0)) return false;
  return (double)(int64_t)f.d == f.d && (int64_t)f.d == n.i;
}

/* *out becomes src in dtype want when no element changes; otherwise err says
 * which element would.  Floats never become integers (they are indices). */
static grove_status convert_lossless(const grove_tensor *src, grove_dtype want, const char *path,
                                     const grove_io_spec *spec, grove_tensor **out,
                                     grove_err *err) {
  const char *iname = spec->name ? spec->name : "?";
  if (grove_dtype_is_float(src->dtype) && !grove_dtype_is_float(want))
    return grove_err_set(
        err, GROVE_E_DTYPE, "%s holds %s, but input '%s' takes %s (indices): save it as %s", path,
        grove_dtype_name(src->dtype), iname, grove_dtype_name(want), grove_dtype_name(want));
  grove_err cerr = {0};
  grove_tensor *t = grove_tensor_clone(src, want, &cerr);
  if (!t)
    return grove_err_set(err, cerr.code == GROVE_E_NOMEM ? GROVE_E_NOMEM : GROVE_E_DTYPE,
                         "%s: %s does not convert to %s, which input '%s' takes: %s", path,
                         grove_dtype_name(src->dtype), grove_dtype_name(want), iname,
                         grove_err_msg(&cerr));
  int64_t n = grove_tensor_numel(src);
  for (int64_t k = 0; k < n; k++) {
    num a = elem(src, k), b = elem(t, k);
    if (same_value(a, b)) continue;
    char v[64];
    if (a.is_int)
      snprintf(v, sizeof v, "%lld", (long long)a.i);
    else
      for (int prec = 9; prec <= 17; prec++) { /* the shortest text that reads back */
        snprintf(v, sizeof v, "%.*g", prec, a.d);
        if (strtod(v, NULL) == a.d) break;
      }
    grove_tensor_release(t);
    return grove_err_set(err, GROVE_E_DTYPE,
                         "%s: input '%s' takes %s, and element %lld of this %s array (%s) has "
                         "no exact %s value; convert it yourself if rounding is acceptable",
                         path, iname, grove_dtype_name(want), (long long)k,
                         grove_dtype_name(src->dtype), v, grove_dtype_name(want));
  }
  *out = t;
  return GROVE_OK;
}

static int cmd_predict(int argc, char **argv) {
  static const opt_def defs[] = {{"help", 'h', false, OPT_HELP},
                                 {"local", 0, true, OPT_LOCAL},
                                 {"output", 'o', true, OPT_OUTPUT},
                                 {"threads", 0, true, OPT_THREADS},
                                 {0}};
  parsed p;
  int rc = parse_args("predict", argc, argv, defs, &p);
  if (rc) return rc;
  if (has_opt(&p, OPT_HELP)) {
    fputs(predict_help, stdout);
    return EXIT_OK;
  }
  bool dup = false;
  const parsed_opt *local = single_opt(&p, OPT_LOCAL, &dup);
  if (dup) return usage_error("predict", "--local given twice");
  if (!local)
    return usage_error("predict",
                       "needs --local MODEL_DIR (predicting through groved is not "
                       "available yet)");
  if (p.npos == 0) return usage_error("predict", "needs an INPUT.npy");
  const char *outputs[MAX_ARGS];
  size_t nout = 0;
  for (int i = 0; i < p.nopts; i++)
    if (p.opts[i].id == OPT_OUTPUT) outputs[nout++] = p.opts[i].value;
  for (size_t i = 0; i < nout; i++)
    for (size_t j = 0; j < i; j++)
      if (strcmp(outputs[i], outputs[j]) == 0)
        return usage_error("predict", "-o %s given twice", outputs[i]);
  int threads;
  if ((rc = threads_option("predict", &p, &threads))) return rc;
  grove_set_compute_threads(threads);

  const char *dir = local->value;
  size_t nin = (size_t)p.npos;
  grove_tensor *in[MAX_ARGS] = {0};
  grove_tensor args[MAX_ARGS];
  grove_model *m = NULL;
  grove_arena *arena = NULL;
  grove_err err = {0};
  rc = EXIT_OK;

  /* Inputs first: a wrong file is found before the model is loaded. */
  for (size_t i = 0; i < nin; i++)
    if (grove_npy_read(p.pos[i], &in[i], &err)) {
      rc = fail_err(&err, p.pos[i]);
      goto done;
    }
  if (grove_model_open(dir, NULL, &m, &err)) {
    rc = fail_err(&err, dir);
    goto done;
  }
  if (m->ninputs && nin != m->ninputs) {
    rc = fail("model %s takes %zu input%s, %zu .npy file%s given", m->name, m->ninputs,
              m->ninputs == 1 ? "" : "s", nin, nin == 1 ? " was" : "s were");
    goto done;
  }
  if (m->noutputs && nout > m->noutputs) {
    rc = fail("model %s has %zu output%s, %zu -o files were given", m->name, m->noutputs,
              m->noutputs == 1 ? "" : "s", nout);
    goto done;
  }
  for (size_t i = 0; i < nin && i < m->ninputs; i++) {
    grove_dtype want = m->inputs[i].dtype;
    if (in[i]->dtype == want) continue;
    grove_tensor *c = NULL;
    if (convert_lossless(in[i], want, p.pos[i], &m->inputs[i], &c, &err)) {
      rc = fail_err(&err, p.pos[i]);
      goto done;
    }
    grove_tensor_release(in[i]);
    in[i] = c;
  }
  for (size_t i = 0; i < nin; i++) args[i] = *in[i];
  arena = grove_arena_new(m->arena_bytes);
  if (!arena) {
    rc = fail("out of memory for %zu bytes of scratch", m->arena_bytes);
    goto done;
  }
  grove_values out = {0};
  if (grove_model_forward(m, arena, args, nin, &out, &err)) {
    rc = fail_err(&err, NULL);
    goto done;
  }
  if (nout > (size_t)out.n) {
    rc = fail("model %s gave %d output%s, %zu -o files were given", m->name, out.n,
              out.n == 1 ? "" : "s", nout);
    goto done;
  }
  for (int k = 0; k < out.n; k++) {
    if ((size_t)k < nout) {
      if (grove_npy_write(outputs[k], &out.v[k], &err)) {
        rc = fail_err(&err, outputs[k]);
        goto done;
      }
      continue;
    }
    char fallback[32];
    snprintf(fallback, sizeof fallback, "output%d", k);
    const char *name =
        (size_t)k < m->noutputs && m->outputs[k].name ? m->outputs[k].name : fallback;
    print_tensor(name, &out.v[k]);
  }
done:
  grove_arena_free(arena);
  grove_model_free(m);
  for (size_t i = 0; i < nin; i++) grove_tensor_release(in[i]);
  return rc;
}

/* ============================================================ bench */

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

enum { FREE_DIM = 16 };

/* Deterministic inputs (xorshift64*), so two runs do the same work. */
static void fill_random(grove_tensor *t, uint64_t *state) {
  int64_t n = grove_tensor_numel(t);
  if (t->dtype != GROVE_F32 && t->dtype != GROVE_F64) return; /* integers stay 0 */
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

static int cmd_bench(int argc, char **argv) {
  static const opt_def defs[] = {
      {"help", 'h', false, OPT_HELP},    {"local", 0, true, OPT_LOCAL},
      {"batch", 0, true, OPT_BATCH},     {"seconds", 0, true, OPT_SECONDS},
      {"threads", 0, true, OPT_THREADS}, {0}};
  parsed p;
  int rc = parse_args("bench", argc, argv, defs, &p);
  if (rc) return rc;
  if (has_opt(&p, OPT_HELP)) {
    fputs(bench_help, stdout);
    return EXIT_OK;
  }
  bool dup = false;
  const parsed_opt *local = single_opt(&p, OPT_LOCAL, &dup);
  const parsed_opt *batch_o = single_opt(&p, OPT_BATCH, &dup);
  const parsed_opt *seconds_o = single_opt(&p, OPT_SECONDS, &dup);
  if (dup) return usage_error("bench", "an option was given twice");
  if (!local)
    return usage_error("bench",
                       "needs --local MODEL_DIR (benchmarking groved is not available "
                       "yet)");
  if (p.npos) return usage_error("bench", "unexpected argument '%s'", p.pos[0]);
  if (!batch_o) return usage_error("bench", "needs --batch B");
  long long batch;
  if (!parse_int(batch_o->value, 1, 1 << 24, &batch))
    return usage_error("bench", "--batch wants a positive integer, not '%s'", batch_o->value);
  double seconds = 3.0;
  if (seconds_o && !parse_seconds(seconds_o->value, &seconds))
    return usage_error("bench", "--seconds wants a positive number, not '%s'", seconds_o->value);
  int threads;
  if ((rc = threads_option("bench", &p, &threads))) return rc;
  /* Before the model is opened: opening runs a forward to size the scratch. */
  grove_set_compute_threads(threads);

  const char *dir = local->value;
  grove_err err = {0};
  grove_model *m = NULL;
  grove_arena *arena = NULL;
  grove_tensor *in[GROVE_MAX_VALUES] = {0};
  grove_tensor args[GROVE_MAX_VALUES];
  size_t nin = 0;
  rc = EXIT_OK;
  if (grove_model_open(dir, NULL, &m, &err)) {
    rc = fail_err(&err, dir);
    goto done;
  }
  if (m->ninputs == 0 || m->ninputs > GROVE_MAX_VALUES) {
    rc = fail("model %s declares %zu inputs; bench needs the inputs in model.json", m->name,
              m->ninputs);
    goto done;
  }
  uint64_t state = 0x9E3779B97F4A7C15ull;
  nin = m->ninputs;
  for (size_t i = 0; i < nin; i++) {
    const grove_io_spec *s = &m->inputs[i];
    int64_t shape[GROVE_MAX_DIMS];
    for (int d = 0; d < s->ndim; d++)
      shape[d] = d == 0 ? batch : s->shape[d] < 0 ? FREE_DIM : s->shape[d];
    if (s->ndim == 0) {
      rc = fail("model %s: input '%s' has no batch dimension", m->name, s->name);
      goto done;
    }
    in[i] = grove_tensor_new(s->dtype, s->ndim, shape, &err);
    if (!in[i]) {
      rc = fail_err(&err, NULL);
      goto done;
    }
    fill_random(in[i], &state);
    args[i] = *in[i];
    char sh[256];
    printf("input %s: %s %s\n", s->name, grove_dtype_name(s->dtype),
           shape_text(s->ndim, shape, sh, sizeof sh));
  }
  arena = grove_arena_new(m->arena_bytes);
  if (!arena) {
    rc = fail("out of memory for %zu bytes of scratch", m->arena_bytes);
    goto done;
  }

  /* Warm-up: caches, page faults, the arena growing to this batch's size
   * (it consolidates at the first reset, then never allocates again). */
  double warm = seconds / 5 < 0.5 ? seconds / 5 : 0.5;
  long warm_batches = 0;
  double t0 = now_s();
  do {
    grove_values out;
    if (grove_model_forward(m, arena, args, nin, &out, &err)) {
      rc = fail_err(&err, NULL);
      goto done;
    }
    grove_arena_reset(arena);
    warm_batches++;
  } while (warm_batches < 2 || now_s() - t0 < warm);

  long batches = 0;
  double start = now_s(), elapsed;
  do {
    grove_values out;
    if (grove_model_forward(m, arena, args, nin, &out, &err)) {
      rc = fail_err(&err, NULL);
      goto done;
    }
    grove_arena_reset(arena);
    batches++;
    elapsed = now_s() - start;
  } while (elapsed < seconds);

  printf("model %s: %d compute thread%s, %ld warm-up batches, %ld batches in %.3f s\n", m->name,
         threads, threads == 1 ? "" : "s", warm_batches, batches, elapsed);
  printf("batch=%lld samples_per_s=%.1f ms_per_batch=%.6f\n", batch,
         (double)batches * (double)batch / elapsed, elapsed * 1000.0 / (double)batches);
done:
  grove_arena_free(arena);
  for (size_t i = 0; i < nin; i++) grove_tensor_release(in[i]);
  grove_model_free(m);
  return rc;
}

/* ============================================================ convert */

static const char convert_help[] =
    "usage: grove convert IN OUT [--force]\n"
    "\n"
    "Rewrites a checkpoint in the other format: the format of OUT comes from its\n"
    "extension (.safetensors, or .pt/.pth/.bin for torch.save).  Keys keep their\n"
    "order, tensors their dtype and bits; a .pt written here loads with\n"
    "torch.load(path, weights_only=True).  OUT is written to a temporary name and\n"
    "renamed, so a failure leaves no half file; an existing OUT needs --force.\n";

static bool has_suffix(const char *s, const char *suffix) {
  size_t n = strlen(s), m = strlen(suffix);
  return n >= m && strcmp(s + n - m, suffix) == 0;
}

static int cmd_convert(int argc, char **argv) {
  static const opt_def defs[] = {
      {"help", 'h', false, OPT_HELP}, {"force", 'f', false, OPT_FORCE}, {0}};
  parsed p;
  int rc = parse_args("convert", argc, argv, defs, &p);
  if (rc) return rc;
  if (has_opt(&p, OPT_HELP)) {
    fputs(convert_help, stdout);
    return EXIT_OK;
  }
  if (p.npos != 2) return usage_error("convert", "takes IN and OUT, got %d paths", p.npos);
  const char *in = p.pos[0], *out = p.pos[1];
  bool to_pt = has_suffix(out, ".pt") || has_suffix(out, ".pth") || has_suffix(out, ".bin");
  if (!to_pt && !has_suffix(out, ".safetensors"))
    return usage_error("convert", "%s: the output's extension must be .safetensors, .pt, .pth or .bin",
                       out);
  if (!has_opt(&p, OPT_FORCE) && access(out, F_OK) == 0)
    return fail("%s exists; pass --force to replace it", out);
  grove_err err = {0};
  grove_state_dict *sd = NULL;
  if (grove_checkpoint_read(in, &sd, &err) != GROVE_OK) return fail("%s", grove_err_msg(&err));
  grove_status s = to_pt ? grove_torch_write(out, sd, &err) : grove_safetensors_write(out, sd, &err);
  size_t n = grove_sd_count(sd);
  grove_sd_free(sd);
  if (s != GROVE_OK) return fail("%s", grove_err_msg(&err));
  printf("%s: %zu tensors written\n", out, n);
  return EXIT_OK;
}

/* ============================================================ main */

typedef struct command {
  const char *name;
  int (*run)(int argc, char **argv);
  const char *help;
} command;

static const command commands[] = {
    {"inspect", cmd_inspect, inspect_help},
    {"predict", cmd_predict, predict_help},
    {"bench", cmd_bench, bench_help},
    {"convert", cmd_convert, convert_help},
};
#define N_COMMANDS (sizeof commands / sizeof commands[0])

static const command *find_command(const char *name) {
  for (size_t i = 0; i < N_COMMANDS; i++)
    if (strcmp(commands[i].name, name) == 0) return &commands[i];
  return NULL;
}

int main(int argc, char **argv) {
  grove_set_log(log_to_stderr, NULL);
  const char *server_url = NULL;
  int i = 1;
  for (; i < argc && argv[i][0] == '-'; i++) {
    const char *a = argv[i];
    if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
      print_main_help(stdout);
      return EXIT_OK;
    }
    if (strcmp(a, "--version") == 0) {
      printf("grove %s\n", GROVE_VERSION);
      return EXIT_OK;
    }
    if (strcmp(a, "-v") == 0 || strcmp(a, "--verbose") == 0) {
      log_threshold = GROVE_LOG_INFO;
      continue;
    }
    if (strcmp(a, "--server") == 0) {
      if (i + 1 == argc) return usage_error(NULL, "--server needs a URL");
      server_url = argv[++i];
      continue;
    }
    if (strcmp(a, "--pub") == 0) { /* groved's telemetry PUB socket, for watch */
      if (i + 1 == argc) return usage_error(NULL, "--pub needs a URL");
      grove_cli_remote_set_pub(argv[++i]);
      continue;
    }
    return usage_error(NULL, "unknown option '%s'", a);
  }
  if (i == argc) {
    print_main_help(stderr);
    return EXIT_USAGE;
  }
  const char *name = argv[i];
  if (strcmp(name, "help") == 0) {
    if (i + 1 == argc) {
      print_main_help(stdout);
      return EXIT_OK;
    }
    const command *c = find_command(argv[i + 1]);
    if (!c) return usage_error(NULL, "no command '%s'", argv[i + 1]);
    fputs(c->help, stdout);
    return EXIT_OK;
  }
  /* Server commands first: they answer -1 for what is not theirs, including
   * `predict --local` and `bench --local`. */
  int rrc = grove_cli_remote(server_url, name, argc - i - 1, argv + i + 1);
  if (rrc >= 0) {
    fflush(stdout);
    return rrc;
  }
  const command *c = find_command(name);
  if (!c) return usage_error(NULL, "unknown command '%s'", name);
  int rc = c->run(argc - i - 1, argv + i + 1);
  if (fflush(stdout) != 0 && rc == EXIT_OK)
    rc = fail("cannot write the output: %s", strerror(errno));
  return rc;
}
