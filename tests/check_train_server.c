/* check_train_server.c: training sessions in a live groved (server/train.c)
 * through libgrove-client and the grove CLI: start, steps against torch,
 * evaluate, promote into serving, predict from the promoted version, stop
 * with the optimizer's state saved; the refusals; predicts going on while a
 * session trains.
 *
 * Fixture: tests/fixtures_gen/training.py's train_server_mlp (a model
 * directory) and train_server_ref.safetensors (three batches, torch's loss at
 * each SGD step, eval-mode outputs before and after, the final state_dict).
 * Losses and outputs within rtol 1e-4, atol 1e-5. */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>

#include "groved_harness.h"
#include "grove/train.h"
#include "npy.h"

#define MODEL "train_server_mlp"

static grove_state_dict *ref_load(void) {
  grove_err err = {0};
  grove_state_dict *sd = NULL;
  ck_assert_ok(grove_safetensors_read(grove_fixture("train_server_ref.safetensors"), &sd, &err),
               &err);
  return sd;
}

static const grove_tensor *ref(const grove_state_dict *sd, const char *key) {
  const grove_tensor *t = grove_sd_get(sd, key);
  ck_assert_msg(t != NULL, "train_server_ref has no %s", key);
  return t;
}

static void expect_close(const char *what, const grove_tensor *got, const grove_tensor *want) {
  ck_assert_int_eq(grove_tensor_numel(got), grove_tensor_numel(want));
  long bad =
      grove_test_allclose(got->data, want->data, (size_t)grove_tensor_numel(want), 1e-4, 1e-5);
  ck_assert_msg(bad < 0, "%s: element %ld is %g, torch says %g", what, bad,
                bad < 0 ? 0.0 : ((const float *)got->data)[bad],
                bad < 0 ? 0.0 : ((const float *)want->data)[bad]);
}

static char model_arg[4400];

static void start_server(hserver *s) {
  snprintf(model_arg, sizeof model_arg, MODEL "=%s", grove_fixture(MODEL));
  const char *extra[] = {"--model", model_arg, "--workers", "1", NULL};
  h_start(s, extra);
}

static grove_train_opts sgd_opts(void) {
  grove_train_opts o = {.optimizer = GROVE_OPTIM_SGD,
                        .h = grove_optim_defaults(GROVE_OPTIM_SGD),
                        .loss = grove_loss_default(GROVE_LOSS_CROSS_ENTROPY),
                        .seed = 3};
  o.h.lr = 0.05;
  o.h.momentum = 0.9;
  return o;
}

START_TEST(train_promote_predict) {
  hserver s;
  start_server(&s);
  grove_state_dict *sd = ref_load();
  grove_client *c = h_connect(s.tcp);
  grove_err err = {0};
  const grove_tensor *xe = ref(sd, "xe");

  /* Nothing to step before a session exists. */
  grove_train_step_result st;
  ck_assert_status(
      grove_client_train_step(c, MODEL, ref(sd, "x.0"), 1, ref(sd, "t.0"), 5000, &st, &err),
      GROVE_E_NOT_FOUND);
  ck_assert_msg(strstr(err.msg, "StartTraining"), "%s", err.msg);

  grove_train_opts o = sgd_opts();
  grove_train_info info;
  ck_assert_ok(grove_client_start_training(c, MODEL, &o, 10000, &info, &err), &err);
  ck_assert_int_eq(info.base_version, 1);
  ck_assert_uint_eq(info.nparams, 6);
  ck_assert_str_eq(info.param_names[0], "0.weight");
  ck_assert_str_eq(info.param_names[5], "4.bias");
  ck_assert_uint_eq(info.ngroups, 1);
  ck_assert_uint_eq(info.group_sizes[0], 6);
  grove_train_info_fini(&info);
  ck_assert_status(grove_client_start_training(c, MODEL, &o, 10000, &info, &err),
                   GROVE_E_ALREADY_EXISTS);
  grove_train_info_fini(&info);

  /* Evaluate before training: the serving model's outputs. */
  grove_prediction pe;
  double loss;
  ck_assert_ok(grove_client_evaluate(c, MODEL, xe, 1, NULL, 5000, &pe, &loss, &err), &err);
  ck_assert(isnan(loss));
  expect_close("evaluate before training", pe.outputs[0], ref(sd, "eval.before"));
  grove_prediction_fini(&pe);

  for (int k = 0; k < 3; k++) {
    char kx[32], kt[32], kl[32];
    snprintf(kx, sizeof kx, "x.%d", k);
    snprintf(kt, sizeof kt, "t.%d", k);
    snprintf(kl, sizeof kl, "loss.%d", k);
    ck_assert_ok(grove_client_train_step(c, MODEL, ref(sd, kx), 1, ref(sd, kt), 10000, &st, &err),
                 &err);
    const double want = *(const float *)ref(sd, kl)->data;
    ck_assert_msg(fabs(st.loss - want) <= 1e-4 * fabs(want) + 1e-5, "step %d: loss %g, torch %g", k,
                  st.loss, want);
    ck_assert_uint_eq(st.step, (uint64_t)k + 1);
    ck_assert(st.grad_norm > 0);
  }
  /* A bad batch is refused and changes nothing. */
  float bad[3] = {1, 2, 3};
  grove_tensor xb;
  grove_tensor_init(&xb, GROVE_F32, 2, (int64_t[]){1, 3}, bad);
  ck_assert_status(grove_client_train_step(c, MODEL, &xb, 1, ref(sd, "t.0"), 5000, &st, &err),
                   GROVE_E_SHAPE);

  /* Serving is untouched until promote. */
  grove_prediction p;
  ck_assert_ok(grove_client_predict(c, MODEL, xe, 1, 5000, &p, &err), &err);
  ck_assert_int_eq(p.version, 1);
  expect_close("serving before promote", p.outputs[0], ref(sd, "eval.before"));
  grove_prediction_fini(&p);

  /* Evaluate after training, with a target: the replica in eval mode. */
  int64_t tl[5] = {0, 1, 2, 3, 0};
  grove_tensor te;
  grove_tensor_init(&te, GROVE_I64, 1, (int64_t[]){5}, tl);
  ck_assert_ok(grove_client_evaluate(c, MODEL, xe, 1, &te, 5000, &pe, &loss, &err), &err);
  ck_assert(isfinite(loss) && loss > 0);
  expect_close("evaluate after training", pe.outputs[0], ref(sd, "eval.after"));
  grove_prediction_fini(&pe);

  /* Promote: a new serving version, through the reload path. */
  char path[600];
  snprintf(path, sizeof path, "%s/promoted.safetensors", s.dir);
  grove_reload_result rr;
  ck_assert_ok(grove_client_promote(c, MODEL, path, false, 20000, &rr, &err), &err);
  ck_assert_int_eq(rr.version, 2);
  ck_assert_int_eq(rr.previous_version, 1);
  ck_assert_str_eq(rr.weights_path, path);
  grove_reload_result_fini(&rr);
  ck_assert_ok(grove_client_predict(c, MODEL, xe, 1, 5000, &p, &err), &err);
  ck_assert_int_eq(p.version, 2);
  expect_close("serving after promote", p.outputs[0], ref(sd, "eval.after"));
  grove_prediction_fini(&p);
  /* The promoted file is the replica's state_dict, running statistics too. */
  grove_state_dict *prom = NULL;
  ck_assert_ok(grove_safetensors_read(path, &prom, &err), &err);
  for (size_t i = 0; i < grove_sd_count(prom); i++) {
    char k[300];
    snprintf(k, sizeof k, "final.%s", grove_sd_key(prom, i));
    const grove_tensor *got = grove_sd_tensor(prom, i);
    if (got->dtype == GROVE_I64) {
      ck_assert(*(int64_t *)got->data == *(int64_t *)ref(sd, k)->data);
      continue;
    }
    expect_close(k, got, ref(sd, k));
  }
  grove_sd_free(prom);

  /* Promote without a path: a new file in groved's temporary directory. */
  ck_assert_ok(grove_client_promote(c, MODEL, NULL, true, 20000, &rr, &err), &err);
  ck_assert_int_eq(rr.version, 3);
  ck_assert(rr.in_place);
  ck_assert_msg(strstr(rr.weights_path, "grove-promote-" MODEL "-step3-"), "%s", rr.weights_path);
  remove(rr.weights_path);
  grove_reload_result_fini(&rr);

  /* Stop, saving the optimizer's state; then nothing is left to step. */
  char opath[600];
  snprintf(opath, sizeof opath, "%s/optim.pt", s.dir);
  uint64_t steps = 0;
  ck_assert_ok(grove_client_stop_training(c, MODEL, opath, 5000, &steps, &err), &err);
  ck_assert_uint_eq(steps, 3);
  ck_assert_status(
      grove_client_train_step(c, MODEL, ref(sd, "x.0"), 1, ref(sd, "t.0"), 5000, &st, &err),
      GROVE_E_NOT_FOUND);
  ck_assert_status(grove_client_stop_training(c, MODEL, NULL, 5000, &steps, &err),
                   GROVE_E_NOT_FOUND);
  /* The saved state loads into an SGD over the same parameters. */
  {
    char mpath[4200];
    snprintf(mpath, sizeof mpath, "%s/model.json", grove_fixture(MODEL));
    char *json = grove_test_read_file(mpath, NULL);
    grove_replica *r = NULL;
    ck_assert_ok(grove_replica_new(json, mpath, NULL, NULL, &r, &err), &err);
    grove_tensor *ps[8];
    for (size_t i = 0; i < grove_replica_num_params(r); i++) ps[i] = grove_replica_param(r, i);
    grove_optim *op = NULL;
    ck_assert_ok(
        grove_optim_new(GROVE_OPTIM_SGD, ps, grove_replica_num_params(r), NULL, 0, &o.h, &op, &err),
        &err);
    ck_assert_ok(grove_optim_load(op, opath, &err), &err);
    grove_optim_free(op);
    grove_replica_free(r);
    free(json);
  }
  /* A new session starts from the serving version (now 3). */
  o = sgd_opts();
  ck_assert_ok(grove_client_start_training(c, MODEL, &o, 10000, &info, &err), &err);
  ck_assert_int_eq(info.base_version, 3);
  grove_train_info_fini(&info);
  ck_assert(h_log_contains(&s, "train.promote: model " MODEL));

  grove_client_close(c);
  grove_sd_free(sd);
  /* A session still open at shutdown stops with groved. */
  ck_assert_int_eq(h_stop(&s), 0);
}
END_TEST

/* UNAVAILABLE is groved's "try again": the previous (failed) start's work on
 * the loop may not have finished yet on a slow (sanitizer) build.  Retries
 * for up to 10 s, then returns what StartTraining said. */
static grove_status start_retrying(grove_client *c, const grove_train_opts *o,
                                   grove_train_info *info, grove_err *err) {
  grove_status s = GROVE_E_UNAVAILABLE;
  for (int i = 0; i < 100; i++) {
    s = grove_client_start_training(c, MODEL, o, 5000, info, err);
    if (s != GROVE_E_UNAVAILABLE) break;
    /* Said, so that a run that needed it shows why (not seen since). */
    fprintf(stderr, "check_train_server: StartTraining try %d: %s; retrying\n", i + 1, err->msg);
    grove_train_info_fini(info);
    struct timespec ts = {0, 100 * 1000000L};
    nanosleep(&ts, NULL);
  }
  return s;
}

START_TEST(train_refusals) {
  hserver s;
  start_server(&s);
  grove_client *c = h_connect(s.tcp);
  grove_err err = {0};
  grove_train_info info;
  grove_train_opts o = sgd_opts();
  ck_assert_status(grove_client_start_training(c, "nope", &o, 5000, &info, &err),
                   GROVE_E_NOT_FOUND);
  grove_train_info_fini(&info);
  o.h.lr = -1;
  ck_assert_status(grove_client_start_training(c, MODEL, &o, 5000, &info, &err),
                   GROVE_E_INVALID_ARGUMENT);
  ck_assert_msg(strstr(err.msg, "Invalid learning rate"), "%s", err.msg);
  grove_train_info_fini(&info);
  /* A failed start leaves no session: a good one may follow at once. */
  o = sgd_opts();
  o.loss.label_smoothing = 2;
  ck_assert_status(grove_client_start_training(c, MODEL, &o, 5000, &info, &err),
                   GROVE_E_INVALID_ARGUMENT);
  grove_train_info_fini(&info);
  /* Param groups by name: weights and the rest. */
  const char *w[] = {"0.weight", "4.weight"};
  grove_param_group_spec g[2] = {
      {.prefixes = w, .nprefixes = 2, .has_weight_decay = true, .weight_decay = 0.01},
      {.has_lr = true, .lr = 0.01}};
  o = sgd_opts();
  o.optimizer = GROVE_OPTIM_ADAMW;
  o.h = grove_optim_defaults(GROVE_OPTIM_ADAMW);
  o.groups = g;
  o.ngroups = 2;
  char missing[4096];
  snprintf(missing, sizeof missing, "%s/nonexistent-optim.pt", s.dir);
  o.optimizer_state = missing;
  ck_assert_status(start_retrying(c, &o, &info, &err), GROVE_E_IO);
  grove_train_info_fini(&info);
  /* Outside the model's directory and every --checkpoint-dir: refused
   * before it is opened (server/admin.c). */
  o.optimizer_state = "/nonexistent/optim.pt";
  ck_assert_status(start_retrying(c, &o, &info, &err), GROVE_E_PERMISSION_DENIED);
  grove_train_info_fini(&info);
  o.optimizer_state = NULL;
  ck_assert_ok(start_retrying(c, &o, &info, &err), &err);
  ck_assert_uint_eq(info.ngroups, 2);
  ck_assert_uint_eq(info.group_sizes[0], 2);
  ck_assert_uint_eq(info.group_sizes[1], 4);
  grove_train_info_fini(&info);
  /* The target's dtype is the loss's business. */
  grove_state_dict *sd = ref_load();
  grove_train_step_result st;
  ck_assert_status(
      grove_client_train_step(c, MODEL, ref(sd, "x.0"), 1, ref(sd, "x.0"), 5000, &st, &err),
      GROVE_E_DTYPE);
  ck_assert_ok(
      grove_client_train_step(c, MODEL, ref(sd, "x.0"), 1, ref(sd, "t.0"), 5000, &st, &err), &err);
  grove_sd_free(sd);
  grove_client_close(c);
  ck_assert_int_eq(h_stop(&s), 0);
}
END_TEST

/* ------------------------------------------------------------ while training */

typedef struct trainer_arg {
  const char *url;
  const grove_state_dict *sd;
  /* Both shared with the main thread while the trainer runs. */
  atomic_bool stop;
  atomic_int steps;
} trainer_arg;

static void *trainer(void *p) {
  trainer_arg *a = p;
  grove_client *c = h_connect(a->url);
  grove_err err = {0};
  grove_train_step_result st;
  while (!atomic_load(&a->stop)) {
    if (grove_client_train_step(c, MODEL, grove_sd_get(a->sd, "x.0"), 1, grove_sd_get(a->sd, "t.0"),
                                10000, &st, &err) == GROVE_OK)
      atomic_fetch_add(&a->steps, 1);
  }
  grove_client_close(c);
  return NULL;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* Predicts keep being answered, from the serving version, while a session
 * trains flat out; the latencies are printed for the record (no timed
 * assertion). */
START_TEST(predict_while_training) {
  hserver s;
  start_server(&s);
  grove_state_dict *sd = ref_load();
  grove_client *c = h_connect(s.tcp);
  grove_err err = {0};
  enum { N = 200 };
  double idle[N], busy[N];
  grove_prediction p;
  for (int i = 0; i < N; i++) {
    double t0 = h_now();
    ck_assert_ok(grove_client_predict(c, MODEL, ref(sd, "xe"), 1, 5000, &p, &err), &err);
    idle[i] = h_now() - t0;
    grove_prediction_fini(&p);
  }
  grove_train_opts o = sgd_opts();
  grove_train_info info;
  ck_assert_ok(grove_client_start_training(c, MODEL, &o, 10000, &info, &err), &err);
  grove_train_info_fini(&info);
  trainer_arg a = {.url = s.tcp, .sd = sd};
  pthread_t th;
  ck_assert_int_eq(pthread_create(&th, NULL, trainer, &a), 0);
  while (atomic_load(&a.steps) < 3) h_sleep_ms(5);
  for (int i = 0; i < N; i++) {
    double t0 = h_now();
    ck_assert_ok(grove_client_predict(c, MODEL, ref(sd, "xe"), 1, 5000, &p, &err), &err);
    busy[i] = h_now() - t0;
    ck_assert_int_eq(p.version, 1);
    expect_close("serving while training", p.outputs[0], ref(sd, "eval.before"));
    grove_prediction_fini(&p);
  }
  atomic_store(&a.stop, true);
  pthread_join(th, NULL);
  ck_assert_int_gt(atomic_load(&a.steps), 3);
  qsort(idle, N, sizeof idle[0], cmp_double);
  qsort(busy, N, sizeof busy[0], cmp_double);
  fprintf(stderr,
          "predict_while_training: p50 %.0f us, p99 %.0f us idle; p50 %.0f us, p99 %.0f us while "
          "training (%d steps)\n",
          idle[N / 2] * 1e6, idle[N * 99 / 100] * 1e6, busy[N / 2] * 1e6, busy[N * 99 / 100] * 1e6,
          atomic_load(&a.steps));
  grove_client_close(c);
  grove_sd_free(sd);
  ck_assert_int_eq(h_stop(&s), 0);
}
END_TEST

/* ------------------------------------------------------------ the CLI */

static int run_cli(const char *url, const char *args, char *out, size_t n) {
  const char *bin = getenv("GROVE_BIN");
  char cmd[8192];
  const char *admin = h_admin_of(url); /* train goes to groved's admin plane */
  snprintf(cmd, sizeof cmd, "'%s' --server '%s' --admin '%s' %s 2>&1",
           bin && *bin ? bin : "build/release/grove", url, admin ? admin : url, args);
  FILE *f = popen(cmd, "r");
  ck_assert_ptr_nonnull(f);
  size_t got = fread(out, 1, n - 1, f);
  out[got] = '\0';
  int st = pclose(f);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

START_TEST(cli_train) {
  hserver s;
  start_server(&s);
  grove_state_dict *sd = ref_load();
  grove_err err = {0};
  char x[600], t[600], o[600], args[4096], out[8192];
  snprintf(x, sizeof x, "%s/x.npy", s.dir);
  snprintf(t, sizeof t, "%s/t.npy", s.dir);
  snprintf(o, sizeof o, "%s/y.npy", s.dir);
  ck_assert_ok(grove_npy_write(x, ref(sd, "x.0"), &err), &err);
  ck_assert_ok(grove_npy_write(t, ref(sd, "t.0"), &err), &err);
  snprintf(args, sizeof args, "train step " MODEL " %s --target %s", x, t);
  ck_assert_int_eq(run_cli(s.tcp, args, out, sizeof out), 1);
  ck_assert_msg(strstr(out, "NOT_FOUND"), "%s", out);
  ck_assert_int_eq(run_cli(s.tcp, "train start " MODEL " --optimizer SGD --loss CrossEntropyLoss",
                           out, sizeof out),
                   2);
  ck_assert_msg(strstr(out, "--lr"), "%s", out);
  ck_assert_int_eq(run_cli(s.tcp,
                           "train start " MODEL " --optimizer SGD --lr 0.05 --momentum 0.9 "
                           "--loss CrossEntropyLoss --group 0.,4.weight:weight_decay=0.001 "
                           "--group '*'",
                           out, sizeof out),
                   0);
  ck_assert_msg(strstr(out, "training from version 1") && strstr(out, "2 groups: 3 3"), "%s", out);
  snprintf(args, sizeof args, "train step " MODEL " %s --target %s --steps 2", x, t);
  ck_assert_int_eq(run_cli(s.tcp, args, out, sizeof out), 0);
  ck_assert_msg(strstr(out, "step 1  loss") && strstr(out, "step 2  loss"), "%s", out);
  snprintf(args, sizeof args, "train eval " MODEL " %s -o %s", x, o);
  ck_assert_int_eq(run_cli(s.tcp, args, out, sizeof out), 0);
  ck_assert_int_eq(access(o, F_OK), 0);
  snprintf(args, sizeof args, "train promote " MODEL " --path %s/p.safetensors", s.dir);
  ck_assert_int_eq(run_cli(s.tcp, args, out, sizeof out), 0);
  ck_assert_msg(strstr(out, "version 2 serving (was 1)"), "%s", out);
  ck_assert_int_eq(run_cli(s.tcp, "train stop " MODEL, out, sizeof out), 0);
  ck_assert_msg(strstr(out, "stopped after 2 steps"), "%s", out);
  ck_assert_int_eq(run_cli(s.tcp, "train frobnicate " MODEL, out, sizeof out), 2);
  grove_sd_free(sd);
  ck_assert_int_eq(h_stop(&s), 0);
}
END_TEST

/* A model's name is any string: promote's own file (no path given) must not
 * put a '/' or 255 bytes of it into the file name. */
START_TEST(train_promote_odd_name) {
  char name[260];
  memset(name, 'n', sizeof name - 1);
  name[sizeof name - 1] = '\0';
  memcpy(name, "../a b/", 7);
  snprintf(model_arg, sizeof model_arg, "%s=%s", name, grove_fixture(MODEL));
  const char *extra[] = {"--model", model_arg, "--workers", "1", NULL};
  hserver s;
  h_start(&s, extra);
  grove_client *c = h_connect(s.tcp);
  grove_err err = {0};
  grove_train_opts o = sgd_opts();
  grove_train_info info;
  ck_assert_ok(grove_client_start_training(c, name, &o, 10000, &info, &err), &err);
  grove_train_info_fini(&info);
  grove_reload_result rr;
  ck_assert_ok(grove_client_promote(c, name, NULL, true, 20000, &rr, &err), &err);
  ck_assert_int_eq(rr.version, 2);
  const char *base = strrchr(rr.weights_path, '/');
  ck_assert_msg(base && strncmp(base, "/grove-promote-.._a_b_nnn", 25) == 0 && strlen(base) < 120,
                "%s", rr.weights_path);
  remove(rr.weights_path);
  grove_reload_result_fini(&rr);
  uint64_t steps = 0;
  ck_assert_ok(grove_client_stop_training(c, name, NULL, 5000, &steps, &err), &err);
  grove_client_close(c);
  ck_assert_int_eq(h_stop(&s), 0);
}
END_TEST

static Suite *train_server_suite(void) {
  Suite *s = suite_create("train_server");
  TCase *tc = tcase_create("sessions");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, train_promote_predict);
  tcase_add_test(tc, train_refusals);
  tcase_add_test(tc, predict_while_training);
  tcase_add_test(tc, cli_train);
  tcase_add_test(tc, train_promote_odd_name);
  suite_add_tcase(s, tc);
  return s;
}

GROVE_TEST_MAIN(train_server_suite)
