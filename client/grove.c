/* grove.c: the `grove` command-line tool.
 *
 * This file holds main, the global options, the help texts and the local
 * commands, which run libgrove in this process (options, messages and exit
 * statuses as cli_args.h has them; outputs printed and inputs converted by
 * cli_tensor.c, as for the server commands):
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

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "grove/grove.h"
#include "cli_args.h"
#include "cli_remote.h"
#include "cli_tensor.h"
#include "npy.h"

/* ============================================================ messages */

static grove_log_level log_threshold = GROVE_LOG_WARN;

/* libgrove may log from any thread; one fprintf is one locked stdio call, so
 * lines never interleave. */
static void log_to_stderr(void *user, grove_log_level level, const char *id, const char *msg) {
  (void)user;
  if (level < log_threshold) return;
  fprintf(stderr, "grove: %s %s: %s\n", grove_log_level_name(level), id, msg);
}

/* A library error: its message, which names the file, key or shape.  When
 * it does not name `what` (the path the user gave), that goes in front. */
static int fail_err(const grove_err *err, const char *what) {
  const char *msg = grove_err_msg(err);
  if (what && !strstr(msg, what)) return grove__cli_fail(EXIT_REFUSED, "%s: %s", what, msg);
  return grove__cli_fail(EXIT_REFUSED, "%s", msg);
}

/* ============================================================ help texts */

static const char main_help_head[] =
    "usage: grove [-v] [--server URL] [--admin URL] [--token-file FILE] [--pub URL]\n"
    "             COMMAND [ARGS...]\n"
    "\n"
    "The command-line tool of Grove, a model server for PyTorch models.\n"
    "\n"
    "Server commands (groved's data plane at --server URL: default $GROVE_SERVER, else\n"
    "tcp://127.0.0.1:7700; its admin plane at --admin URL: default $GROVE_ADMIN, else\n"
    "tcp://127.0.0.1:7703; several URLs separated by commas):\n";

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
    "  --server URL    the groved to talk to (status, predict, bench)\n"
    "  --admin URL     groved's admin listener (reload, export, hook, train; default\n"
    "                  $GROVE_ADMIN, else " GROVE_DEFAULT_ADMIN_URL ")\n"
    "  --token-file FILE  the admin token (groved --admin-token-file; default\n"
    "                  $GROVE_ADMIN_TOKEN)\n"
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
    "inputs (one .npy file per model input, batch dimension first, in the\n"
    "model's order or each as NAME=FILE.npy naming its input) and writes the\n"
    "outputs.\n"
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

/* --threads N (entry def of p's table), or the number of cores.  Returns 0
 * or EXIT_USAGE. */
static int threads_option(const char *cmd, const grove__cli_args *p, int def, int *threads) {
  bool dup = false;
  const char *v = grove__cli_value(p, def, &dup);
  if (dup) return grove__cli_usage(cmd, "--threads given twice");
  *threads = grove_available_cores();
  if (v) {
    long long n;
    if (!grove__cli_int(v, 1, 1024, &n))
      return grove__cli_usage(cmd, "--threads wants an integer from 1 to 1024, not '%s'", v);
    *threads = (int)n;
  }
  return 0;
}

/* ============================================================ printing */

static char *shape_text(int ndim, const int64_t *shape, char *buf, size_t n) {
  return grove_shape_str(ndim, shape, buf, n);
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
  /* The batching groved would serve it with (max_batch_size 0: unbatched). */
  if (grove_model_probe_batching(m, &err)) {
    grove_model_free(m);
    return fail_err(&err, dir);
  }
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
  printf("scratch: %zu bytes per worker (for a batch of %lld, from the open's trial forwards)\n",
         m->arena_bytes,
         (long long)(m->batching.max_batch_size ? m->batching.max_batch_size : 1));
  int rc = EXIT_OK;
  grove_state_dict *sd = grove_sd_new();
  if (!sd)
    rc = grove__cli_fail(EXIT_REFUSED, "out of memory");
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
  if (!f) return grove__cli_fail(EXIT_REFUSED, "%s: cannot open: %s", path, strerror(errno));
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
      /* A pickle first: the legacy layout (checkpoint.c). */
      format =
          n >= 1 && head[0] == 0x80 ? "torch.save file (legacy format)" : "torch.save zip archive";
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
  static const grove__cli_opt defs[] = {{"help", 'h', 0}, {NULL}};
  grove__cli_args p;
  int rc = grove__cli_parse("inspect", argc, argv, defs, inspect_help, &p);
  if (rc >= 0) return rc;
  if (p.npos == 0) return grove__cli_usage("inspect", "needs a FILE or MODEL_DIR");
  if (p.npos > 1) return grove__cli_usage("inspect", "takes one FILE or MODEL_DIR, got %d", p.npos);
  const char *path = p.pos[0];
  struct stat st;
  if (stat(path, &st) != 0) return grove__cli_fail(EXIT_REFUSED, "%s: %s", path, strerror(errno));
  if (S_ISDIR(st.st_mode)) {
    size_t n = strlen(path);
    char *spec = malloc(n + sizeof "/model.json");
    if (!spec) return grove__cli_fail(EXIT_REFUSED, "out of memory");
    memcpy(spec, path, n);
    memcpy(spec + n, "/model.json", sizeof "/model.json");
    bool has_spec = access(spec, F_OK) == 0;
    free(spec);
    if (!has_spec)
      return grove__cli_fail(EXIT_REFUSED,
                             "%s: a directory without model.json, so not a model directory", path);
    return inspect_model(path);
  }
  /* model.json stands for its directory. */
  const char *base = strrchr(path, '/');
  base = base ? base + 1 : path;
  if (strcmp(base, "model.json") == 0) {
    size_t dn = (size_t)(base - path);
    char *dir = dn ? strndup(path, dn) : strdup(".");
    if (!dir) return grove__cli_fail(EXIT_REFUSED, "out of memory");
    rc = inspect_model(dir);
    free(dir);
    return rc;
  }
  return inspect_checkpoint(path);
}

/* ============================================================ predict */

static int cmd_predict(int argc, char **argv) {
  enum { O_HELP, O_LOCAL, O_OUTPUT, O_THREADS };
  static const grove__cli_opt defs[] = {[O_HELP] = {"help", 'h', 0},
                                        [O_LOCAL] = {"local", 0, GROVE__CLI_VALUE},
                                        [O_OUTPUT] = {"output", 'o', GROVE__CLI_VALUE},
                                        [O_THREADS] = {"threads", 0, GROVE__CLI_VALUE},
                                        {NULL}};
  grove__cli_args p;
  int rc = grove__cli_parse("predict", argc, argv, defs, predict_help, &p);
  if (rc >= 0) return rc;
  bool dup = false;
  const char *dir = grove__cli_value(&p, O_LOCAL, &dup);
  if (dup) return grove__cli_usage("predict", "--local given twice");
  if (!dir)
    return grove__cli_usage("predict",
                            "needs --local MODEL_DIR (predicting through groved is not "
                            "available yet)");
  if (p.npos == 0) return grove__cli_usage("predict", "needs an INPUT.npy");
  const char *outputs[GROVE__CLI_MAX_ARGS];
  size_t nout;
  if ((rc = grove__cli_outputs("predict", &p, O_OUTPUT, outputs, &nout))) return rc;
  int threads;
  if ((rc = threads_option("predict", &p, O_THREADS, &threads))) return rc;
  grove_set_compute_threads(threads);

  size_t nin = (size_t)p.npos;
  grove_tensor *in[GROVE__CLI_MAX_ARGS] = {0};
  grove_tensor args[GROVE__CLI_MAX_ARGS];
  grove_model *m = NULL;
  grove_arena *arena = NULL;
  grove_err err = {0};
  rc = EXIT_OK;

  const char *files[GROVE__CLI_MAX_ARGS];
  size_t order[GROVE__CLI_MAX_ARGS];
  char iname[256];
  /* Inputs first: a wrong file is found before the model is loaded. */
  for (size_t i = 0; i < nin; i++) {
    files[i] = grove__cli_input_file(p.pos[i], iname, sizeof iname);
    if (grove_npy_read(files[i], &in[i], &err)) {
      rc = fail_err(&err, files[i]);
      goto done;
    }
  }
  if (grove_model_open(dir, NULL, &m, &err)) {
    rc = fail_err(&err, dir);
    goto done;
  }
  for (size_t i = 0; i < nin; i++) order[i] = i;
  if (m->ninputs && (rc = grove__cli_order_inputs(m->name, p.pos, nin, m->inputs, m->ninputs,
                                                   order)))
    goto done;
  if (m->noutputs && nout > m->noutputs) {
    rc = grove__cli_fail(EXIT_REFUSED, "model %s has %zu output%s, %zu -o files were given",
                         m->name, m->noutputs, m->noutputs == 1 ? "" : "s", nout);
    goto done;
  }
  for (size_t i = 0; i < nin && i < m->ninputs; i++) {
    const size_t k = order[i];
    grove_dtype want = m->inputs[i].dtype;
    if (in[k]->dtype == want) continue;
    grove_tensor *c = NULL;
    const char *mname = m->inputs[i].name ? m->inputs[i].name : "?";
    if (grove__cli_convert(in[k], want, files[k], mname, &c, &err)) {
      rc = fail_err(&err, files[k]);
      goto done;
    }
    grove_tensor_release(in[k]);
    in[k] = c;
  }
  for (size_t i = 0; i < nin; i++) args[i] = *in[order[i]];
  arena = grove_arena_new(m->arena_bytes);
  if (!arena) {
    rc = grove__cli_fail(EXIT_REFUSED, "out of memory for %zu bytes of scratch", m->arena_bytes);
    goto done;
  }
  grove_values out = {0};
  if (grove_model_forward(m, arena, args, nin, &out, &err)) {
    rc = fail_err(&err, NULL);
    goto done;
  }
  if (nout > (size_t)out.n) {
    rc = grove__cli_fail(EXIT_REFUSED, "model %s gave %d output%s, %zu -o files were given",
                         m->name, out.n, out.n == 1 ? "" : "s", nout);
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
    grove__cli_print_tensor(name, &out.v[k]);
  }
done:
  grove_arena_free(arena);
  grove_model_free(m);
  for (size_t i = 0; i < nin; i++) grove_tensor_release(in[i]);
  return rc;
}

/* ============================================================ bench */

/* One forward of bench, its scratch handed back for the next.  0, or the
 * exit status after the message. */
static int bench_forward(grove_model *m, grove_arena *arena, const grove_tensor *args, size_t nin) {
  grove_values out;
  grove_err err = {0};
  if (grove_model_forward(m, arena, args, nin, &out, &err)) return fail_err(&err, NULL);
  grove_arena_reset(arena);
  return 0;
}

static int cmd_bench(int argc, char **argv) {
  enum { O_HELP, O_LOCAL, O_BATCH, O_SECONDS, O_THREADS };
  static const grove__cli_opt defs[] = {[O_HELP] = {"help", 'h', 0},
                                        [O_LOCAL] = {"local", 0, GROVE__CLI_VALUE},
                                        [O_BATCH] = {"batch", 0, GROVE__CLI_VALUE},
                                        [O_SECONDS] = {"seconds", 0, GROVE__CLI_VALUE},
                                        [O_THREADS] = {"threads", 0, GROVE__CLI_VALUE},
                                        {NULL}};
  grove__cli_args p;
  int rc = grove__cli_parse("bench", argc, argv, defs, bench_help, &p);
  if (rc >= 0) return rc;
  bool dup = false;
  const char *dir = grove__cli_value(&p, O_LOCAL, &dup);
  const char *bv = grove__cli_value(&p, O_BATCH, &dup);
  const char *sv = grove__cli_value(&p, O_SECONDS, &dup);
  if (dup) return grove__cli_usage("bench", "an option was given twice");
  if (!dir)
    return grove__cli_usage("bench",
                            "needs --local MODEL_DIR (benchmarking groved is not available "
                            "yet)");
  if (p.npos) return grove__cli_usage("bench", "unexpected argument '%s'", p.pos[0]);
  if (!bv) return grove__cli_usage("bench", "needs --batch B");
  long long batch;
  if (!grove__cli_int(bv, 1, 1 << 24, &batch))
    return grove__cli_usage("bench", "--batch wants a positive integer, not '%s'", bv);
  double seconds = 3.0;
  if (sv && !grove__cli_seconds(sv, &seconds))
    return grove__cli_usage("bench", "--seconds wants a positive number, not '%s'", sv);
  int threads;
  if ((rc = threads_option("bench", &p, O_THREADS, &threads))) return rc;
  /* Before the model is opened: opening runs a forward to size the scratch. */
  grove_set_compute_threads(threads);

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
    rc = grove__cli_fail(EXIT_REFUSED,
                         "model %s declares %zu inputs; bench needs the inputs in model.json",
                         m->name, m->ninputs);
    goto done;
  }
  uint64_t state = GROVE__CLI_BENCH_SEED;
  nin = m->ninputs;
  for (size_t i = 0; i < nin; i++) {
    const grove_io_spec *s = &m->inputs[i];
    if (s->ndim == 0) {
      rc = grove__cli_fail(EXIT_REFUSED, "model %s: input '%s' has no batch dimension", m->name,
                           s->name);
      goto done;
    }
    if (!(in[i] = grove__cli_bench_input(s, batch, &state, &err))) {
      rc = fail_err(&err, NULL);
      goto done;
    }
    args[i] = *in[i];
  }
  arena = grove_arena_new(m->arena_bytes);
  if (!arena) {
    rc = grove__cli_fail(EXIT_REFUSED, "out of memory for %zu bytes of scratch", m->arena_bytes);
    goto done;
  }

  /* Warm-up: caches, page faults, the arena growing to this batch's size
   * (it consolidates at the first reset, then never allocates again). */
  double warm = seconds / 5 < 0.5 ? seconds / 5 : 0.5;
  long warm_batches = 0;
  double t0 = grove__cli_now_s();
  do {
    if ((rc = bench_forward(m, arena, args, nin))) goto done;
    warm_batches++;
  } while (warm_batches < 2 || grove__cli_now_s() - t0 < warm);

  long batches = 0;
  double start = grove__cli_now_s(), elapsed;
  do {
    if ((rc = bench_forward(m, arena, args, nin))) goto done;
    batches++;
    elapsed = grove__cli_now_s() - start;
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
  enum { O_HELP, O_FORCE };
  static const grove__cli_opt defs[] = {
      [O_HELP] = {"help", 'h', 0}, [O_FORCE] = {"force", 'f', 0}, {NULL}};
  grove__cli_args p;
  int rc = grove__cli_parse("convert", argc, argv, defs, convert_help, &p);
  if (rc >= 0) return rc;
  if (p.npos != 2) return grove__cli_usage("convert", "takes IN and OUT, got %d paths", p.npos);
  const char *in = p.pos[0], *out = p.pos[1];
  bool to_pt = has_suffix(out, ".pt") || has_suffix(out, ".pth") || has_suffix(out, ".bin");
  if (!to_pt && !has_suffix(out, ".safetensors"))
    return grove__cli_usage(
        "convert", "%s: the output's extension must be .safetensors, .pt, .pth or .bin", out);
  if (!p.val[O_FORCE] && access(out, F_OK) == 0)
    return grove__cli_fail(EXIT_REFUSED, "%s exists; pass --force to replace it", out);
  grove_err err = {0};
  grove_state_dict *sd = NULL;
  if (grove_checkpoint_read(in, &sd, &err) != GROVE_OK)
    return grove__cli_fail(EXIT_REFUSED, "%s", grove_err_msg(&err));
  grove_status s = to_pt ? grove_torch_write(out, sd, &err) : grove_safetensors_write(out, sd, &err);
  size_t n = grove_sd_count(sd);
  grove_sd_free(sd);
  if (s != GROVE_OK) return grove__cli_fail(EXIT_REFUSED, "%s", grove_err_msg(&err));
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
      if (i + 1 == argc) return grove__cli_usage(NULL, "--server needs a URL");
      server_url = argv[++i];
      continue;
    }
    if (strcmp(a, "--admin") == 0) { /* groved's admin listener */
      if (i + 1 == argc) return grove__cli_usage(NULL, "--admin needs a URL");
      grove_cli_remote_set_admin(argv[++i], NULL);
      continue;
    }
    if (strcmp(a, "--token-file") == 0) { /* the admin plane's token */
      if (i + 1 == argc) return grove__cli_usage(NULL, "--token-file needs a FILE");
      grove_cli_remote_set_admin(NULL, argv[++i]);
      continue;
    }
    if (strcmp(a, "--pub") == 0) { /* groved's telemetry PUB socket, for watch */
      if (i + 1 == argc) return grove__cli_usage(NULL, "--pub needs a URL");
      grove_cli_remote_set_pub(argv[++i]);
      continue;
    }
    return grove__cli_usage(NULL, "unknown option '%s'", a);
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
    if (!c) return grove__cli_usage(NULL, "no command '%s'", argv[i + 1]);
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
  if (!c) return grove__cli_usage(NULL, "unknown command '%s'", name);
  int rc = c->run(argc - i - 1, argv + i + 1);
  if (fflush(stdout) != 0 && rc == EXIT_OK)
    rc = grove__cli_fail(EXIT_REFUSED, "cannot write the output: %s", strerror(errno));
  return rc;
}
