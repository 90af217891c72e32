/* cli_train.c: the grove CLI's training commands, on libgrove-client
 * (grove_client_start_training, _train_step, _evaluate, _promote,
 * _stop_training).  Same conventions as cli_remote.c and cli_hooks.c, from
 * cli_args.c (docs/cli.md): options anywhere after the command as `--name
 * value` or `--name=value` (each at most once but --group and -o), `--` ends
 * them; "grove: <reason>" on stderr; exit 0 ok, 1 the server said no, 2
 * usage, 3 cannot reach the server. */
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_args.h"
#include "cli_connect.h"
#include "cli_train.h"
#include "grove/client.h"
#include "grove/grove.h"
#include "npy.h"

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

/* The options of a train subcommand: cli_args.c's, but every one at most
 * once and a repeatable one (--group, -o) at most MAX_GROUPS times.  -1 to
 * go on, else the exit status (cli_args.h). */
static int parse_args(int argc, char **argv, const grove__cli_opt *defs, grove__cli_args *p) {
  int rc = grove__cli_parse("train", argc, argv, defs, train_help, p);
  if (rc >= 0) return rc;
  for (int d = 0; defs[d].name; d++)
    if (p->count[d] > MAX_GROUPS) return grove__cli_usage("train", "too many '--%s'", defs[d].name);
  return -1;
}

static int timeout_of(const char *v, long long *ms) {
  *ms = 30000;
  if (v && !grove__cli_int(v, 1, 86400000, ms))
    return grove__cli_usage("train", "--timeout-ms wants milliseconds, not '%s'", v);
  return 0;
}

/* Reads the .npy files into tensors (release them). */
static int read_npys(const char *const *paths, int n, grove_tensor **out) {
  for (int i = 0; i < n; i++) {
    grove_err err = {0};
    if (grove_npy_read(paths[i], &out[i], &err)) {
      for (int k = 0; k < i; k++) grove_tensor_release(out[k]);
      return grove__cli_fail(EXIT_REFUSED, "%s", grove_err_msg(&err));
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
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save);
         tok && *nprefixes < GROVE__CLI_MAX_ARGS; tok = strtok_r(NULL, ",", &save))
      prefixes[(*nprefixes)++] = tok;
  for (char *save = NULL, *kv = rest ? strtok_r(rest, ":", &save) : NULL; kv;
       kv = strtok_r(NULL, ":", &save)) {
    if (strncmp(kv, "lr=", 3) == 0 && grove__cli_double(kv + 3, &g->lr)) {
      g->has_lr = true;
    } else if (strncmp(kv, "weight_decay=", 13) == 0 &&
               grove__cli_double(kv + 13, &g->weight_decay)) {
      g->has_weight_decay = true;
    } else {
      return grove__cli_usage("train", "--group '%s': '%s' is not lr=X or weight_decay=Y", spec,
                              kv);
    }
  }
  g->prefixes = prefixes;
  g->nprefixes = *nprefixes;
  return 0;
}

static int cmd_start(const char *server_url, int argc, char **argv) {
  static const grove__cli_opt defs[] = {[S_OPTIM] = {"optimizer", 0, GROVE__CLI_VALUE_ONCE},
                                        [S_LOSS] = {"loss", 0, GROVE__CLI_VALUE_ONCE},
                                        [S_LR] = {"lr", 0, GROVE__CLI_VALUE_ONCE},
                                        [S_MOM] = {"momentum", 0, GROVE__CLI_VALUE_ONCE},
                                        [S_DAMP] = {"dampening", 0, GROVE__CLI_VALUE_ONCE},
                                        [S_NEST] = {"nesterov", 0, GROVE__CLI_ONCE},
                                        [S_BETAS] = {"betas", 0, GROVE__CLI_VALUE_ONCE},
                                        [S_EPS] = {"eps", 0, GROVE__CLI_VALUE_ONCE},
                                        [S_AMS] = {"amsgrad", 0, GROVE__CLI_ONCE},
                                        [S_WD] = {"weight-decay", 0, GROVE__CLI_VALUE_ONCE},
                                        [S_MAX] = {"maximize", 0, GROVE__CLI_ONCE},
                                        [S_GROUP] = {"group", 0, GROVE__CLI_VALUE},
                                        [S_RED] = {"reduction", 0, GROVE__CLI_VALUE_ONCE},
                                        [S_IGN] = {"ignore-index", 0, GROVE__CLI_VALUE_ONCE},
                                        [S_LS] = {"label-smoothing", 0, GROVE__CLI_VALUE_ONCE},
                                        [S_PW] = {"pos-weight", 0, GROVE__CLI_VALUE_ONCE},
                                        [S_SEED] = {"seed", 0, GROVE__CLI_VALUE_ONCE},
                                        [S_RESUME] = {"resume", 0, GROVE__CLI_VALUE_ONCE},
                                        [S_TIMEOUT] = {"timeout-ms", 0, GROVE__CLI_VALUE_ONCE},
                                        [S_HELP] = {"help", 'h', GROVE__CLI_ONCE},
                                        {NULL}};
  grove__cli_args p;
  int rc = parse_args(argc, argv, defs, &p);
  if (rc >= 0) return rc;
  if (p.npos != 1) return grove__cli_usage("train", "start takes one MODEL");
  grove_train_opts o = {0};
  if (!p.val[S_OPTIM] || !grove_optim_kind_from_name(p.val[S_OPTIM], &o.optimizer))
    return grove__cli_usage("train", "start needs --optimizer SGD, Adam or AdamW");
  o.h = grove_optim_defaults(o.optimizer);
  if (o.optimizer == GROVE_OPTIM_SGD && !p.val[S_LR])
    return grove__cli_usage("train",
                            "SGD needs --lr (torch.optim.SGD has no default learning rate)");
  struct {
    int opt;
    double *dst;
  } nums[] = {{S_LR, &o.h.lr},
              {S_MOM, &o.h.momentum},
              {S_DAMP, &o.h.dampening},
              {S_EPS, &o.h.eps},
              {S_WD, &o.h.weight_decay}};
  for (size_t i = 0; i < sizeof nums / sizeof nums[0]; i++)
    if (p.val[nums[i].opt] && !grove__cli_double(p.val[nums[i].opt], nums[i].dst))
      return grove__cli_usage("train", "--%s wants a number, not '%s'", defs[nums[i].opt].name,
                              p.val[nums[i].opt]);
  if (p.val[S_BETAS] && sscanf(p.val[S_BETAS], "%lf,%lf", &o.h.beta1, &o.h.beta2) != 2)
    return grove__cli_usage("train", "--betas wants B1,B2, not '%s'", p.val[S_BETAS]);
  o.h.nesterov = p.val[S_NEST] != NULL;
  o.h.amsgrad = p.val[S_AMS] != NULL;
  o.h.maximize = p.val[S_MAX] != NULL;
  if (!p.val[S_LOSS] || !grove_loss_kind_from_name(p.val[S_LOSS], &o.loss.kind))
    return grove__cli_usage("train",
                            "start needs --loss MSELoss, CrossEntropyLoss or BCEWithLogitsLoss");
  o.loss = grove_loss_default(o.loss.kind);
  if (p.val[S_RED]) {
    if (strcmp(p.val[S_RED], "sum") == 0)
      o.loss.reduction = GROVE_REDUCTION_SUM;
    else if (strcmp(p.val[S_RED], "mean") != 0)
      return grove__cli_usage("train", "--reduction wants mean or sum, not '%s'", p.val[S_RED]);
  }
  long long ll;
  if (p.val[S_IGN]) {
    if (!grove__cli_int(p.val[S_IGN], INT64_MIN, INT64_MAX, &ll))
      return grove__cli_usage("train", "--ignore-index wants an integer, not '%s'", p.val[S_IGN]);
    o.loss.ignore_index = ll;
  }
  if (p.val[S_LS] && !grove__cli_double(p.val[S_LS], &o.loss.label_smoothing))
    return grove__cli_usage("train", "--label-smoothing wants a number, not '%s'", p.val[S_LS]);
  if (p.val[S_SEED]) {
    if (!grove__cli_int(p.val[S_SEED], 0, INT64_MAX, &ll))
      return grove__cli_usage("train", "--seed wants a non-negative integer, not '%s'",
                              p.val[S_SEED]);
    o.seed = (uint64_t)ll;
  }
  static char gbuf[MAX_GROUPS][1024];
  static const char *gprefixes[MAX_GROUPS][GROVE__CLI_MAX_ARGS];
  grove_param_group_spec groups[MAX_GROUPS];
  const char *gspecs[GROVE__CLI_MAX_ARGS];
  size_t ngroups = grove__cli_values(&p, S_GROUP, gspecs);
  for (size_t g = 0; g < ngroups; g++) {
    size_t np;
    if ((rc = parse_group(gspecs[g], gbuf[g], sizeof gbuf[g], &groups[g], gprefixes[g], &np)))
      return rc;
  }
  o.groups = groups;
  o.ngroups = ngroups;
  o.optimizer_state = p.val[S_RESUME];
  long long timeout;
  if ((rc = timeout_of(p.val[S_TIMEOUT], &timeout))) return rc;
  grove_tensor *pw = NULL;
  if (p.val[S_PW]) {
    if ((rc = read_npys(&p.val[S_PW], 1, &pw))) return rc;
    o.loss.pos_weight = pw;
  }
  grove_client *c = NULL;
  if ((rc = grove__cli_connect_admin(server_url, (int)timeout, &c))) {
    grove_tensor_release(pw);
    return rc;
  }
  grove_err err = {0};
  grove_train_info info;
  grove_status s = grove_client_start_training(c, p.pos[0], &o, (int)timeout, &info, &err);
  if (s) {
    rc = grove__cli_call_failed(s, &err, NULL);
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
  static const grove__cli_opt defs[] = {[O_TARGET] = {"target", 0, GROVE__CLI_VALUE_ONCE},
                                        [O_STEPS] = {"steps", 0, GROVE__CLI_VALUE_ONCE},
                                        [O_OUT] = {"o", 'o', GROVE__CLI_VALUE},
                                        [O_JSON] = {"json", 0, GROVE__CLI_ONCE},
                                        [O_TIMEOUT] = {"timeout-ms", 0, GROVE__CLI_VALUE_ONCE},
                                        [O_HELP] = {"help", 'h', GROVE__CLI_ONCE},
                                        {NULL}};
  grove__cli_args p;
  int rc = parse_args(argc, argv, defs, &p);
  if (rc >= 0) return rc;
  if (p.npos < 2)
    return grove__cli_usage("train", "%s needs a MODEL and an INPUT.npy", eval ? "eval" : "step");
  if (p.npos - 1 > GROVE_MAX_VALUES)
    return grove__cli_usage("train", "at most %d inputs", GROVE_MAX_VALUES);
  if (!eval && !p.val[O_TARGET]) return grove__cli_usage("train", "step needs --target TARGET.npy");
  if (!eval && p.count[O_OUT]) return grove__cli_usage("train", "step takes no -o");
  if (eval && p.val[O_STEPS]) return grove__cli_usage("train", "eval takes no --steps");
  long long steps = 1, timeout;
  if (p.val[O_STEPS] && !grove__cli_int(p.val[O_STEPS], 1, 1000000000, &steps))
    return grove__cli_usage("train", "--steps wants a positive integer, not '%s'", p.val[O_STEPS]);
  if ((rc = timeout_of(p.val[O_TIMEOUT], &timeout))) return rc;
  const char *model = p.pos[0];
  grove_tensor *ins[GROVE_MAX_VALUES] = {0}, *target = NULL;
  const int nin = p.npos - 1;
  if ((rc = read_npys(&p.pos[1], nin, ins))) return rc;
  if (p.val[O_TARGET] && (rc = read_npys(&p.val[O_TARGET], 1, &target))) {
    for (int i = 0; i < nin; i++) grove_tensor_release(ins[i]);
    return rc;
  }
  const char *outputs[GROVE__CLI_MAX_ARGS];
  size_t nout = grove__cli_values(&p, O_OUT, outputs);
  grove_tensor in[GROVE_MAX_VALUES];
  for (int i = 0; i < nin; i++) in[i] = *ins[i];
  grove_client *c = NULL;
  if (!(rc = grove__cli_connect_admin(server_url, (int)timeout, &c))) {
    grove_err err = {0};
    if (!eval) {
      for (long long k = 0; k < steps && !rc; k++) {
        grove_train_step_result res;
        grove_status s =
            grove_client_train_step(c, model, in, (size_t)nin, target, (int)timeout, &res, &err);
        if (s) {
          rc = grove__cli_call_failed(s, &err, NULL);
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
        rc = grove__cli_call_failed(s, &err, NULL);
      } else {
        if (target) printf("loss %.9g\n", loss);
        for (size_t i = 0; i < pred.noutputs && !rc; i++) {
          const grove_tensor *y = pred.outputs[i];
          if (i < nout) {
            grove_err werr = {0};
            if (grove_npy_write(outputs[i], y, &werr))
              rc = grove__cli_fail(EXIT_REFUSED, "%s", grove_err_msg(&werr));
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

/* What promote and stop (sub) begin with: their options against defs into
 * *p, one MODEL, --timeout-ms (entry timeout_def) into *timeout and a
 * client on server_url in *c (the caller's to close).  -1 to go on, else
 * the exit status to return (the help printed, or the message). */
static int connect_for_model(const char *server_url, const char *sub, int argc, char **argv,
                             const grove__cli_opt *defs, int timeout_def, grove__cli_args *p,
                             long long *timeout, grove_client **c) {
  int rc = parse_args(argc, argv, defs, p);
  if (rc >= 0) return rc;
  if (p->npos != 1) return grove__cli_usage("train", "%s takes one MODEL", sub);
  if ((rc = timeout_of(p->val[timeout_def], timeout))) return rc;
  if ((rc = grove__cli_connect_admin(server_url, (int)*timeout, c))) return rc;
  return -1;
}

static int cmd_promote(const char *server_url, int argc, char **argv) {
  enum { O_PATH, O_INPLACE, O_TIMEOUT, O_HELP };
  static const grove__cli_opt defs[] = {[O_PATH] = {"path", 0, GROVE__CLI_VALUE_ONCE},
                                        [O_INPLACE] = {"in-place", 0, GROVE__CLI_ONCE},
                                        [O_TIMEOUT] = {"timeout-ms", 0, GROVE__CLI_VALUE_ONCE},
                                        [O_HELP] = {"help", 'h', GROVE__CLI_ONCE},
                                        {NULL}};
  grove__cli_args p;
  long long timeout;
  grove_client *c = NULL;
  int rc = connect_for_model(server_url, "promote", argc, argv, defs, O_TIMEOUT, &p, &timeout, &c);
  if (rc >= 0) return rc;
  grove_err err = {0};
  grove_reload_result res;
  grove_status s = grove_client_promote(c, p.pos[0], p.val[O_PATH], p.val[O_INPLACE] != NULL,
                                        (int)timeout, &res, &err);
  rc = s ? grove__cli_call_failed(s, &err, NULL) : EXIT_OK;
  if (s) {
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
  static const grove__cli_opt defs[] = {[O_SAVE] = {"save-optimizer", 0, GROVE__CLI_VALUE_ONCE},
                                        [O_TIMEOUT] = {"timeout-ms", 0, GROVE__CLI_VALUE_ONCE},
                                        [O_HELP] = {"help", 'h', GROVE__CLI_ONCE},
                                        {NULL}};
  grove__cli_args p;
  long long timeout;
  grove_client *c = NULL;
  int rc = connect_for_model(server_url, "stop", argc, argv, defs, O_TIMEOUT, &p, &timeout, &c);
  if (rc >= 0) return rc;
  grove_err err = {0};
  uint64_t steps = 0;
  grove_status s =
      grove_client_stop_training(c, p.pos[0], p.val[O_SAVE], (int)timeout, &steps, &err);
  rc = s ? grove__cli_call_failed(s, &err, NULL) : EXIT_OK;
  if (!s) printf("model %s: training session stopped after %" PRIu64 " steps\n", p.pos[0], steps);
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
  return grove__cli_usage("train", "no subcommand '%s' (start, step, eval, promote, stop)", sub);
}
