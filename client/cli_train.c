/* cli_train.c: the grove CLI's training commands, on libgrove-client
 * (grove_client_start_training, _train_step, _evaluate, _promote,
 * _stop_training).  Same conventions as cli_remote.c and cli_hooks.c
 * (docs/cli.md): options anywhere after the command as `--name value` or
 * `--name=value`, `--` ends them; "grove: <reason>" on stderr; exit 0 ok,
 * 1 the server said no, 2 usage, 3 cannot reach the server. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_train.h"
#include "grove/client.h"
#include "grove/grove.h"
#include "npy.h"

enum { EXIT_OK = 0, EXIT_REFUSED = 1, EXIT_USAGE = 2, EXIT_UNREACHABLE = 3 };

#define DEFAULT_SERVER "tcp://127.0.0.1:7700"
#define MAX_ARGS 64
#define MAX_URLS 16
#define MAX_GROUPS 16

static const char train_help[] =
    "usage: grove train start MODEL --optimizer SGD|Adam|AdamW --loss LOSS [OPTIONS]\n"
    "       grove train step MODEL INPUT.npy... --target TARGET.npy [--steps N] [--json]\n"
    "       grove train eval MODEL INPUT.npy... [--target TARGET.npy] [-o OUTPUT.npy]...\n"
    "       grove train promote MODEL [--path FILE.safetensors] [--in-place]\n"
    "       grove train stop MODEL [--save-optimizer FILE.pt]\n"
    "A training session trains a private replica of MODEL's serving version (train\n"
    "mode: BatchNorm batch statistics, Dropout active); serving is untouched until\n"
    "`promote` makes the replica's weights the next serving version through the\n"
    "reload path.  One session per model (docs/training.md).\n"
    "start options, torch's names and defaults:\n"
    "  --lr X  --momentum X  --dampening X  --nesterov  (SGD: --lr is required)\n"
    "  --betas B1,B2  --eps X  --amsgrad  (Adam, AdamW)   --weight-decay X  --maximize\n"
    "  --group PREFIX[,PREFIX...][:lr=X][:weight_decay=Y]  a param_group of the\n"
    "      parameters whose names start with a PREFIX ('*' alone: every parameter no\n"
    "      earlier group took); repeatable, in order\n"
    "  --loss MSELoss|CrossEntropyLoss|BCEWithLogitsLoss  --reduction mean|sum\n"
    "  --ignore-index N  --label-smoothing X  --pos-weight W.npy  --seed N\n"
    "  --resume OPTIM.pt  (a torch.save'd optimizer state_dict on the server)\n"
    "step: one optimizer step per call (--steps N repeats the batch), printing the\n"
    "loss and the gradients' norm.  eval: the replica in eval mode (and the loss\n"
    "with --target).  --timeout-ms N for any of them (default 30000).\n"
    "Exit 0 ok, 1 the server said no, 2 usage, 3 unreachable.\n";

/* ============================================================ helpers */

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

static int usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int usage_error(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs("grove train: ", stderr);
  vfprintf(stderr, fmt, ap);
  fputs("\nTry 'grove train --help'.\n", stderr);
  va_end(ap);
  return EXIT_USAGE;
}

static int call_failed(grove_status s, const grove_err *err) {
  bool local = grove_client_failed_locally(s, err);
  int code = local && (s == GROVE_E_UNAVAILABLE || s == GROVE_E_DEADLINE_EXCEEDED)
                 ? EXIT_UNREACHABLE
                 : EXIT_REFUSED;
  if (local) return fail(code, "%s", grove_err_msg(err) + strlen("grove client: "));
  return fail(code, "%s: %s", grove_status_name(s), grove_err_msg(err));
}

typedef struct opt_def {
  const char *name;
  bool has_value;
  bool repeat;
} opt_def;

typedef struct parsed {
  int npos;
  const char *pos[MAX_ARGS];
  const char *val[32];             /* per def: the last value ("" for a flag), NULL when absent */
  const char *all[32][MAX_GROUPS]; /* repeatable options: every value */
  int count[32];
} parsed;

static int parse_args(int argc, char **argv, const opt_def *defs, parsed *p) {
  memset(p, 0, sizeof *p);
  bool only_pos = false;
  for (int i = 0; i < argc; i++) {
    const char *a = argv[i];
    if (only_pos || a[0] != '-' || a[1] == 0) {
      if (p->npos == MAX_ARGS) return usage_error("too many arguments");
      p->pos[p->npos++] = a;
      continue;
    }
    if (strcmp(a, "--") == 0) {
      only_pos = true;
      continue;
    }
    const char *name = a[1] == '-'            ? a + 2
                       : strcmp(a, "-h") == 0 ? "help"
                       : strcmp(a, "-o") == 0 ? "o"
                                              : NULL;
    if (!name) return usage_error("unknown option '%s'", a);
    const char *eq = strchr(name, '=');
    size_t len = eq ? (size_t)(eq - name) : strlen(name);
    int d = -1;
    for (int k = 0; defs[k].name; k++)
      if (strlen(defs[k].name) == len && strncmp(defs[k].name, name, len) == 0) d = k;
    if (d < 0) return usage_error("unknown option '%s'", a);
    if (p->val[d] && !defs[d].repeat) return usage_error("option '--%s' given twice", defs[d].name);
    const char *v;
    if (!defs[d].has_value) {
      if (eq) return usage_error("option '--%s' takes no value", defs[d].name);
      v = "";
    } else if (eq) {
      v = eq + 1;
    } else {
      if (i + 1 == argc) return usage_error("option '%s' needs a value", a);
      v = argv[++i];
    }
    p->val[d] = v;
    if (defs[d].repeat) {
      if (p->count[d] == MAX_GROUPS) return usage_error("too many '--%s'", defs[d].name);
      p->all[d][p->count[d]++] = v;
    }
  }
  return 0;
}

static bool parse_double(const char *s, double *out) {
  if (!s || !*s) return false;
  errno = 0;
  char *end;
  double v = strtod(s, &end);
  if (errno || *end || !isfinite(v)) return false;
  *out = v;
  return true;
}

static bool parse_i64(const char *s, long long lo, long long hi, long long *out) {
  if (!s || !*s) return false;
  errno = 0;
  char *end;
  long long v = strtoll(s, &end, 10);
  if (errno || *end || v < lo || v > hi) return false;
  *out = v;
  return true;
}

static int connect_to(const char *server_url, int timeout_ms, grove_client **out) {
  const char *spec = server_url;
  if (!spec || !*spec) spec = getenv("GROVE_SERVER");
  if (!spec || !*spec) spec = DEFAULT_SERVER;
  char buf[2048];
  snprintf(buf, sizeof buf, "%s", spec);
  const char *urls[MAX_URLS];
  size_t n = 0;
  for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok && n < MAX_URLS;
       tok = strtok_r(NULL, ",", &save))
    if (*tok) urls[n++] = tok;
  if (n == 0) return fail(EXIT_USAGE, "--server: no URL in '%s'", spec);
  grove_client_opts o = {.default_timeout_ms = timeout_ms};
  grove_err err = {0};
  grove_status s = grove_client_open(urls, n, &o, out, &err);
  if (s) return call_failed(s, &err);
  return 0;
}

static int timeout_of(const char *v, long long *ms) {
  *ms = 30000;
  if (v && !parse_i64(v, 1, 86400000, ms))
    return usage_error("--timeout-ms wants milliseconds, not '%s'", v);
  return 0;
}

/* Reads the .npy files into tensors (release them). */
static int read_npys(const char *const *paths, int n, grove_tensor **out) {
  for (int i = 0; i < n; i++) {
    grove_err err = {0};
    if (grove_npy_read(paths[i], &out[i], &err)) {
      for (int k = 0; k < i; k++) grove_tensor_release(out[k]);
      return fail(EXIT_REFUSED, "%s", grove_err_msg(&err));
    }
  }
  return 0;
}

/* ============================================================ start */

enum {
  S_OPTIM,
  S_LOSS,
  S_LR,
  S_MOM,
  S_DAMP,
  S_NEST,
  S_BETAS,
  S_EPS,
  S_AMS,
  S_WD,
  S_MAX,
  S_GROUP,
  S_RED,
  S_IGN,
  S_LS,
  S_PW,
  S_SEED,
  S_RESUME,
  S_TIMEOUT,
  S_HELP,
};

/* "PREFIX[,PREFIX...][:lr=X][:weight_decay=Y]" into g (prefixes point into
 * buf, which must outlive g). */
static int parse_group(const char *spec, char *buf, size_t bufn, grove_param_group_spec *g,
                       const char **prefixes, size_t *nprefixes) {
  snprintf(buf, bufn, "%s", spec);
  memset(g, 0, sizeof *g);
  char *colon = strchr(buf, ':');
  char *rest = colon ? colon + 1 : NULL;
  if (colon) *colon = '\0';
  *nprefixes = 0;
  if (strcmp(buf, "*") != 0)
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok && *nprefixes < MAX_ARGS;
         tok = strtok_r(NULL, ",", &save))
      prefixes[(*nprefixes)++] = tok;
  for (char *save = NULL, *kv = rest ? strtok_r(rest, ":", &save) : NULL; kv;
       kv = strtok_r(NULL, ":", &save)) {
    if (strncmp(kv, "lr=", 3) == 0 && parse_double(kv + 3, &g->lr)) {
      g->has_lr = true;
    } else if (strncmp(kv, "weight_decay=", 13) == 0 && parse_double(kv + 13, &g->weight_decay)) {
      g->has_weight_decay = true;
    } else {
      return usage_error("--group '%s': '%s' is not lr=X or weight_decay=Y", spec, kv);
    }
  }
  g->prefixes = prefixes;
  g->nprefixes = *nprefixes;
  return 0;
}

static int cmd_start(const char *server_url, int argc, char **argv) {
  static const opt_def defs[] = {[S_OPTIM] = {"optimizer", true, false},
                                 [S_LOSS] = {"loss", true, false},
                                 [S_LR] = {"lr", true, false},
                                 [S_MOM] = {"momentum", true, false},
                                 [S_DAMP] = {"dampening", true, false},
                                 [S_NEST] = {"nesterov", false, false},
                                 [S_BETAS] = {"betas", true, false},
                                 [S_EPS] = {"eps", true, false},
                                 [S_AMS] = {"amsgrad", false, false},
                                 [S_WD] = {"weight-decay", true, false},
                                 [S_MAX] = {"maximize", false, false},
                                 [S_GROUP] = {"group", true, true},
                                 [S_RED] = {"reduction", true, false},
                                 [S_IGN] = {"ignore-index", true, false},
                                 [S_LS] = {"label-smoothing", true, false},
                                 [S_PW] = {"pos-weight", true, false},
                                 [S_SEED] = {"seed", true, false},
                                 [S_RESUME] = {"resume", true, false},
                                 [S_TIMEOUT] = {"timeout-ms", true, false},
                                 [S_HELP] = {"help", false, false},
                                 {NULL, false, false}};
  static parsed p;
  int rc = parse_args(argc, argv, defs, &p);
  if (rc) return rc;
  if (p.val[S_HELP]) {
    fputs(train_help, stdout);
    return EXIT_OK;
  }
  if (p.npos != 1) return usage_error("start takes one MODEL");
  grove_train_opts o = {0};
  if (!p.val[S_OPTIM] || !grove_optim_kind_from_name(p.val[S_OPTIM], &o.optimizer))
    return usage_error("start needs --optimizer SGD, Adam or AdamW");
  o.h = grove_optim_defaults(o.optimizer);
  if (o.optimizer == GROVE_OPTIM_SGD && !p.val[S_LR])
    return usage_error("SGD needs --lr (torch.optim.SGD has no default learning rate)");
  struct {
    int opt;
    double *dst;
  } nums[] = {{S_LR, &o.h.lr},
              {S_MOM, &o.h.momentum},
              {S_DAMP, &o.h.dampening},
              {S_EPS, &o.h.eps},
              {S_WD, &o.h.weight_decay}};
  for (size_t i = 0; i < sizeof nums / sizeof nums[0]; i++)
    if (p.val[nums[i].opt] && !parse_double(p.val[nums[i].opt], nums[i].dst))
      return usage_error("--%s wants a number, not '%s'", defs[nums[i].opt].name,
                         p.val[nums[i].opt]);
  if (p.val[S_BETAS] && sscanf(p.val[S_BETAS], "%lf,%lf", &o.h.beta1, &o.h.beta2) != 2)
    return usage_error("--betas wants B1,B2, not '%s'", p.val[S_BETAS]);
  o.h.nesterov = p.val[S_NEST] != NULL;
  o.h.amsgrad = p.val[S_AMS] != NULL;
  o.h.maximize = p.val[S_MAX] != NULL;
  if (!p.val[S_LOSS] || !grove_loss_kind_from_name(p.val[S_LOSS], &o.loss.kind))
    return usage_error("start needs --loss MSELoss, CrossEntropyLoss or BCEWithLogitsLoss");
  o.loss = grove_loss_default(o.loss.kind);
  if (p.val[S_RED]) {
    if (strcmp(p.val[S_RED], "sum") == 0)
      o.loss.reduction = GROVE_REDUCTION_SUM;
    else if (strcmp(p.val[S_RED], "mean") != 0)
      return usage_error("--reduction wants mean or sum, not '%s'", p.val[S_RED]);
  }
  long long ll;
  if (p.val[S_IGN]) {
    if (!parse_i64(p.val[S_IGN], INT64_MIN, INT64_MAX, &ll))
      return usage_error("--ignore-index wants an integer, not '%s'", p.val[S_IGN]);
    o.loss.ignore_index = ll;
  }
  if (p.val[S_LS] && !parse_double(p.val[S_LS], &o.loss.label_smoothing))
    return usage_error("--label-smoothing wants a number, not '%s'", p.val[S_LS]);
  if (p.val[S_SEED]) {
    if (!parse_i64(p.val[S_SEED], 0, INT64_MAX, &ll))
      return usage_error("--seed wants a non-negative integer, not '%s'", p.val[S_SEED]);
    o.seed = (uint64_t)ll;
  }
  static char gbuf[MAX_GROUPS][1024];
  static const char *gprefixes[MAX_GROUPS][MAX_ARGS];
  grove_param_group_spec groups[MAX_GROUPS];
  for (int g = 0; g < p.count[S_GROUP]; g++) {
    size_t np;
    if ((rc = parse_group(p.all[S_GROUP][g], gbuf[g], sizeof gbuf[g], &groups[g], gprefixes[g],
                          &np)))
      return rc;
  }
  o.groups = groups;
  o.ngroups = (size_t)p.count[S_GROUP];
  o.optimizer_state = p.val[S_RESUME];
  long long timeout;
  if ((rc = timeout_of(p.val[S_TIMEOUT], &timeout))) return rc;
  grove_tensor *pw = NULL;
  if (p.val[S_PW]) {
    if ((rc = read_npys(&p.val[S_PW], 1, &pw))) return rc;
    o.loss.pos_weight = pw;
  }
  grove_client *c = NULL;
  if ((rc = connect_to(server_url, (int)timeout, &c))) {
    grove_tensor_release(pw);
    return rc;
  }
  grove_err err = {0};
  grove_train_info info;
  grove_status s = grove_client_start_training(c, p.pos[0], &o, (int)timeout, &info, &err);
  if (s) {
    rc = call_failed(s, &err);
  } else {
    printf("model %s: training from version %" PRId64 ", %zu parameters (%" PRId64
           " elements) in %zu group%s:",
           p.pos[0], info.base_version, info.nparams, info.param_count, info.ngroups,
           info.ngroups == 1 ? "" : "s");
    for (size_t g = 0; g < info.ngroups; g++) printf(" %u", info.group_sizes[g]);
    printf("\n");
  }
  grove_train_info_fini(&info);
  grove_client_close(c);
  grove_tensor_release(pw);
  return rc;
}

/* ============================================================ step, eval */

static int cmd_step_eval(const char *server_url, int argc, char **argv, bool eval) {
  enum { O_TARGET, O_STEPS, O_OUT, O_JSON, O_TIMEOUT, O_HELP };
  static const opt_def defs[] = {[O_TARGET] = {"target", true, false},
                                 [O_STEPS] = {"steps", true, false},
                                 [O_OUT] = {"o", true, true},
                                 [O_JSON] = {"json", false, false},
                                 [O_TIMEOUT] = {"timeout-ms", true, false},
                                 [O_HELP] = {"help", false, false},
                                 {NULL, false, false}};
  static parsed p;
  int rc = parse_args(argc, argv, defs, &p);
  if (rc) return rc;
  if (p.val[O_HELP]) {
    fputs(train_help, stdout);
    return EXIT_OK;
  }
  if (p.npos < 2) return usage_error("%s needs a MODEL and an INPUT.npy", eval ? "eval" : "step");
  if (p.npos - 1 > GROVE_MAX_VALUES) return usage_error("at most %d inputs", GROVE_MAX_VALUES);
  if (!eval && !p.val[O_TARGET]) return usage_error("step needs --target TARGET.npy");
  if (!eval && p.count[O_OUT]) return usage_error("step takes no -o");
  if (eval && p.val[O_STEPS]) return usage_error("eval takes no --steps");
  long long steps = 1, timeout;
  if (p.val[O_STEPS] && !parse_i64(p.val[O_STEPS], 1, 1000000000, &steps))
    return usage_error("--steps wants a positive integer, not '%s'", p.val[O_STEPS]);
  if ((rc = timeout_of(p.val[O_TIMEOUT], &timeout))) return rc;
  const char *model = p.pos[0];
  grove_tensor *ins[GROVE_MAX_VALUES] = {0}, *target = NULL;
  const int nin = p.npos - 1;
  if ((rc = read_npys(&p.pos[1], nin, ins))) return rc;
  if (p.val[O_TARGET] && (rc = read_npys(&p.val[O_TARGET], 1, &target))) {
    for (int i = 0; i < nin; i++) grove_tensor_release(ins[i]);
    return rc;
  }
  grove_tensor in[GROVE_MAX_VALUES];
  for (int i = 0; i < nin; i++) in[i] = *ins[i];
  grove_client *c = NULL;
  if (!(rc = connect_to(server_url, (int)timeout, &c))) {
    grove_err err = {0};
    if (!eval) {
      for (long long k = 0; k < steps && !rc; k++) {
        grove_train_step_result res;
        grove_status s =
            grove_client_train_step(c, model, in, (size_t)nin, target, (int)timeout, &res, &err);
        if (s) {
          rc = call_failed(s, &err);
        } else if (p.val[O_JSON]) {
          printf("{\"step\": %" PRIu64
                 ", \"loss\": %.9g, \"grad_norm\": %.9g, \"compute_us\": %" PRIu64 "}\n",
                 res.step, res.loss, res.grad_norm, res.compute_us);
        } else {
          printf("step %" PRIu64 "  loss %.6g  grad_norm %.6g  (%.1f ms)\n", res.step, res.loss,
                 res.grad_norm, (double)res.compute_us / 1000.0);
        }
        fflush(stdout);
      }
    } else {
      grove_prediction pred;
      double loss;
      grove_status s = grove_client_evaluate(c, model, in, (size_t)nin, target, (int)timeout, &pred,
                                             &loss, &err);
      if (s) {
        rc = call_failed(s, &err);
      } else {
        if (target) printf("loss %.9g\n", loss);
        for (size_t i = 0; i < pred.noutputs && !rc; i++) {
          const grove_tensor *y = pred.outputs[i];
          if ((int)i < p.count[O_OUT]) {
            grove_err werr = {0};
            if (grove_npy_write(p.all[O_OUT][i], y, &werr))
              rc = fail(EXIT_REFUSED, "%s", grove_err_msg(&werr));
            continue;
          }
          char sh[128];
          printf("output %zu %s %s\n", i, grove_dtype_name(y->dtype),
                 grove_shape_str(y->ndim, y->shape, sh, sizeof sh));
          if (y->dtype == GROVE_F32) {
            const int64_t n = grove_tensor_numel(y);
            for (int64_t k = 0; k < n && k < 16; k++)
              printf("%s%.6g", k ? " " : "  ", ((const float *)y->data)[k]);
            printf("%s\n", n > 16 ? " ..." : "");
          }
        }
        grove_prediction_fini(&pred);
      }
    }
    grove_client_close(c);
  }
  for (int i = 0; i < nin; i++) grove_tensor_release(ins[i]);
  grove_tensor_release(target);
  return rc;
}

/* ============================================================ promote, stop */

static int cmd_promote(const char *server_url, int argc, char **argv) {
  enum { O_PATH, O_INPLACE, O_TIMEOUT, O_HELP };
  static const opt_def defs[] = {[O_PATH] = {"path", true, false},
                                 [O_INPLACE] = {"in-place", false, false},
                                 [O_TIMEOUT] = {"timeout-ms", true, false},
                                 [O_HELP] = {"help", false, false},
                                 {NULL, false, false}};
  static parsed p;
  int rc = parse_args(argc, argv, defs, &p);
  if (rc) return rc;
  if (p.val[O_HELP]) {
    fputs(train_help, stdout);
    return EXIT_OK;
  }
  if (p.npos != 1) return usage_error("promote takes one MODEL");
  long long timeout;
  if ((rc = timeout_of(p.val[O_TIMEOUT], &timeout))) return rc;
  grove_client *c = NULL;
  if ((rc = connect_to(server_url, (int)timeout, &c))) return rc;
  grove_err err = {0};
  grove_reload_result res;
  grove_status s = grove_client_promote(c, p.pos[0], p.val[O_PATH], p.val[O_INPLACE] != NULL,
                                        (int)timeout, &res, &err);
  if (s) {
    rc = call_failed(s, &err);
    for (size_t i = 0; i < res.n_errors; i++) fprintf(stderr, "  %s\n", res.errors[i]);
  } else {
    printf("model %s: version %" PRId64 " serving (was %" PRId64 "), weights %s, %.1f ms\n",
           p.pos[0], res.version, res.previous_version, res.weights_path,
           (double)res.duration_us / 1000.0);
  }
  grove_reload_result_fini(&res);
  grove_client_close(c);
  return rc;
}

static int cmd_stop(const char *server_url, int argc, char **argv) {
  enum { O_SAVE, O_TIMEOUT, O_HELP };
  static const opt_def defs[] = {[O_SAVE] = {"save-optimizer", true, false},
                                 [O_TIMEOUT] = {"timeout-ms", true, false},
                                 [O_HELP] = {"help", false, false},
                                 {NULL, false, false}};
  static parsed p;
  int rc = parse_args(argc, argv, defs, &p);
  if (rc) return rc;
  if (p.val[O_HELP]) {
    fputs(train_help, stdout);
    return EXIT_OK;
  }
  if (p.npos != 1) return usage_error("stop takes one MODEL");
  long long timeout;
  if ((rc = timeout_of(p.val[O_TIMEOUT], &timeout))) return rc;
  grove_client *c = NULL;
  if ((rc = connect_to(server_url, (int)timeout, &c))) return rc;
  grove_err err = {0};
  uint64_t steps = 0;
  grove_status s =
      grove_client_stop_training(c, p.pos[0], p.val[O_SAVE], (int)timeout, &steps, &err);
  if (s)
    rc = call_failed(s, &err);
  else
    printf("model %s: training session stopped after %" PRIu64 " steps\n", p.pos[0], steps);
  grove_client_close(c);
  return rc;
}

int grove__cli_train(const char *server_url, int argc, char **argv) {
  if (argc < 1 || strcmp(argv[0], "--help") == 0 || strcmp(argv[0], "-h") == 0) {
    fputs(train_help, argc < 1 ? stderr : stdout);
    return argc < 1 ? EXIT_USAGE : EXIT_OK;
  }
  const char *sub = argv[0];
  if (strcmp(sub, "start") == 0) return cmd_start(server_url, argc - 1, argv + 1);
  if (strcmp(sub, "step") == 0) return cmd_step_eval(server_url, argc - 1, argv + 1, false);
  if (strcmp(sub, "eval") == 0) return cmd_step_eval(server_url, argc - 1, argv + 1, true);
  if (strcmp(sub, "promote") == 0) return cmd_promote(server_url, argc - 1, argv + 1);
  if (strcmp(sub, "stop") == 0) return cmd_stop(server_url, argc - 1, argv + 1);
  return usage_error("no subcommand '%s' (start, step, eval, promote, stop)", sub);
}
