/* check_admin.c: groved's admin plane (server/admin.c; docs/operations.md,
 * "Security").  A real groved (tests/groved_harness.h) serving
 * tests/fixtures_gen's train_server_mlp:
 *
 *   planes   every admin RPC sent to the data listener is PERMISSION_DENIED,
 *            naming the admin listener, and runs on the admin listener;
 *            predict is refused there; status answers on both and lists both
 *   token    with --admin-token-file, an admin RPC without the token, with a
 *            wrong one, a prefix of it or it plus more is UNAUTHENTICATED;
 *            the right one runs; neither the log nor a reply holds it
 *   compare  grove__secret_equal, the constant-time compare the token uses
 *   paths    reload's checkpoint, promote's path and the training optimizer
 *            files outside the model's directory and --checkpoint-dir
 *            (absolute, "..", a symlink pointing out) are refused before
 *            anything opens them and nothing is written; a missing file
 *            inside stays NOT_FOUND, outside it gets the same refusal as an
 *            existing one
 *   defaults libgrove-client's admin calls reach the admin listener that
 *            $GROVE_ADMIN names, with $GROVE_ADMIN_TOKEN. */
#include <limits.h>

#include "groved_harness.h"
#include <nng/protocol/reqrep0/rep.h>
#include "internal.h" /* grove__secret_equal */

#define MODEL "train_server_mlp"
#define TOKEN "an-admin-token-of-some-length"

static char model_arg[4400];

/* groved serving MODEL with the harness's flags (opts) and extra. */
static void start(hserver *s, const hstart_opts *opts, const char *const *extra) {
  snprintf(model_arg, sizeof model_arg, MODEL "=%s", grove_fixture(MODEL));
  const char *argv[24];
  int n = 0;
  argv[n++] = "--model";
  argv[n++] = model_arg;
  argv[n++] = "--workers";
  argv[n++] = "1";
  for (int i = 0; extra && extra[i] && n < 23; i++) argv[n++] = extra[i];
  argv[n] = NULL;
  h_start_with(s, opts, argv);
}

/* Sends req to url exactly there (no routing by h_raw); the reply's status,
 * its message copied into msg. */
static grove_status send_to(const char *url, Grove__Request *req, const char *token, char *msg,
                            size_t msgn) {
  req->protocol = 1;
  req->admin_token = (char *)(token ? token : "");
  return h_raw_status(url, req, 20000, msg, msgn);
}

/* One request of every admin RPC (each naming MODEL, or nothing to act on:
 * the handler's own answer is not what is tested). */
typedef struct admin_reqs {
  Grove__ReloadRequest reload;
  Grove__ExportStateDictRequest export_;
  Grove__HookSpec spec;
  Grove__RegisterHookRequest reg;
  Grove__RemoveHookRequest rm;
  Grove__ListHooksRequest ls;
  Grove__StartTrainingRequest start;
  Grove__TrainStepRequest step;
  Grove__EvaluateRequest eval;
  Grove__PromoteRequest promote;
  Grove__StopTrainingRequest stop;
  Grove__Request req[10];
  const char *names[10];
} admin_reqs;

static void admin_reqs_init(admin_reqs *a) {
  grove__reload_request__init(&a->reload);
  a->reload.model = MODEL;
  grove__export_state_dict_request__init(&a->export_);
  a->export_.model = "nope";
  grove__hook_spec__init(&a->spec);
  a->spec.model = "nope";
  a->spec.pattern = "*";
  grove__register_hook_request__init(&a->reg);
  a->reg.spec = &a->spec;
  grove__remove_hook_request__init(&a->rm);
  a->rm.hook_id = 12345;
  grove__list_hooks_request__init(&a->ls);
  grove__start_training_request__init(&a->start);
  a->start.model = "nope";
  grove__train_step_request__init(&a->step);
  a->step.model = "nope";
  grove__evaluate_request__init(&a->eval);
  a->eval.model = "nope";
  grove__promote_request__init(&a->promote);
  a->promote.model = "nope";
  grove__stop_training_request__init(&a->stop);
  a->stop.model = "nope";
  for (int i = 0; i < 10; i++) grove__request__init(&a->req[i]);
  int i = 0;
  a->req[i].body_case = GROVE__REQUEST__BODY_RELOAD, a->req[i].reload = &a->reload;
  a->names[i++] = "Reload";
  a->req[i].body_case = GROVE__REQUEST__BODY_EXPORT_STATE_DICT;
  a->req[i].export_state_dict = &a->export_;
  a->names[i++] = "ExportStateDict";
  a->req[i].body_case = GROVE__REQUEST__BODY_REGISTER_HOOK, a->req[i].register_hook = &a->reg;
  a->names[i++] = "RegisterHook";
  a->req[i].body_case = GROVE__REQUEST__BODY_REMOVE_HOOK, a->req[i].remove_hook = &a->rm;
  a->names[i++] = "RemoveHook";
  a->req[i].body_case = GROVE__REQUEST__BODY_LIST_HOOKS, a->req[i].list_hooks = &a->ls;
  a->names[i++] = "ListHooks";
  a->req[i].body_case = GROVE__REQUEST__BODY_START_TRAINING;
  a->req[i].start_training = &a->start;
  a->names[i++] = "StartTraining";
  a->req[i].body_case = GROVE__REQUEST__BODY_TRAIN_STEP, a->req[i].train_step = &a->step;
  a->names[i++] = "TrainStep";
  a->req[i].body_case = GROVE__REQUEST__BODY_EVALUATE, a->req[i].evaluate = &a->eval;
  a->names[i++] = "Evaluate";
  a->req[i].body_case = GROVE__REQUEST__BODY_PROMOTE, a->req[i].promote = &a->promote;
  a->names[i++] = "Promote";
  a->req[i].body_case = GROVE__REQUEST__BODY_STOP_TRAINING;
  a->req[i].stop_training = &a->stop;
  a->names[i++] = "StopTraining";
}

/* ============================================================ planes */

START_TEST(admin_rpcs_only_on_the_admin_listener) {
  hserver s;
  start(&s, NULL, NULL);
  admin_reqs a;
  admin_reqs_init(&a);
  char msg[GROVE_ERR_MSG_MAX];
  const char *data[] = {s.tcp, s.ipc};
  for (int i = 0; i < 10; i++) {
    for (int d = 0; d < 2; d++) {
      grove_status st = send_to(data[d], &a.req[i], NULL, msg, sizeof msg);
      ck_assert_msg(st == GROVE_E_PERMISSION_DENIED, "%s on %s: %s %s", a.names[i], data[d],
                    grove_status_name(st), msg);
      ck_assert_msg(strstr(msg, s.admin) && strstr(msg, a.names[i]), "%s", msg);
    }
    /* On the admin listener the handler itself answers. */
    grove_status st = send_to(s.admin, &a.req[i], NULL, msg, sizeof msg);
    ck_assert_msg(st != GROVE_E_PERMISSION_DENIED && st != GROVE_E_UNAUTHENTICATED,
                  "%s on the admin listener: %s %s", a.names[i], grove_status_name(st), msg);
  }
  /* The reload on the data listeners changed nothing; the one on the admin
   * listener made version 2. */
  grove_client *c = h_connect(s.tcp);
  grove_err err = {0};
  grove_model_info *mi = NULL;
  ck_assert_ok(grove_client_model_info(c, MODEL, 5000, &mi, &err), &err);
  ck_assert_int_eq(mi->version, 2);
  grove_model_info_free(mi);

  /* Predict belongs to the data plane; status and metadata answer on both,
   * and status lists both planes. */
  Grove__Tensor t = GROVE__TENSOR__INIT;
  Grove__Tensor *tp = &t;
  int64_t shape[2] = {1, 12}; /* MODEL's x: float32 [-1, 12] */
  float x[12] = {0};
  t.dtype = GROVE_F32;
  t.n_shape = 2;
  t.shape = shape;
  t.data.len = sizeof x;
  t.data.data = (uint8_t *)x;
  Grove__PredictRequest pr = GROVE__PREDICT_REQUEST__INIT;
  pr.model = MODEL;
  pr.n_inputs = 1;
  pr.inputs = &tp;
  Grove__Request req = GROVE__REQUEST__INIT;
  req.body_case = GROVE__REQUEST__BODY_PREDICT;
  req.predict = &pr;
  ck_assert_int_eq(send_to(s.admin, &req, NULL, msg, sizeof msg), GROVE_E_PERMISSION_DENIED);
  ck_assert_msg(strstr(msg, s.tcp), "%s", msg);
  ck_assert_msg(send_to(s.tcp, &req, NULL, msg, sizeof msg) == GROVE_OK, "%s", msg);
  const char *urls[] = {s.admin};
  grove_client *ac = NULL;
  grove_client_opts o = {.admin_url = s.admin, .admin_token = ""};
  ck_assert_ok(grove_client_open(urls, 1, &o, &ac, &err), &err);
  grove_server_status *st = NULL;
  ck_assert_ok(grove_client_status(ac, 5000, &st, &err), &err);
  ck_assert_uint_eq(st->nadmin, 1);
  ck_assert_str_eq(st->admin_urls[0], s.admin);
  ck_assert_uint_eq(st->nlisten, 2);
  ck_assert_str_eq(st->listen_urls[0], s.tcp);
  ck_assert_str_eq(st->listen_urls[1], s.ipc);
  grove_server_status_free(st);
  grove_client_close(ac);

  /* A client told that the admin plane is the data listener gets the
   * refusal as a server status, not a local one. */
  const char *durls[] = {s.tcp};
  grove_client *bad = NULL;
  grove_client_opts bo = {.admin_url = s.ipc, .admin_token = ""};
  ck_assert_ok(grove_client_open(durls, 1, &bo, &bad, &err), &err);
  grove_reload_result res;
  grove_status rs = grove_client_reload(bad, MODEL, NULL, 5000, &res, &err);
  ck_assert_status(rs, GROVE_E_PERMISSION_DENIED);
  ck_assert(!grove_client_failed_locally(rs, &err));
  grove_reload_result_fini(&res);
  grove_client_close(bad);
  grove_client_close(c);
  h_stop(&s);
}
END_TEST

START_TEST(default_admin_address_taken_stops_groved) {
  /* Without --admin-listen groved takes the default, local address.  When
   * it is taken (here by this test; if another process holds it, the same
   * holds), groved must not start: a second groved without an admin plane
   * of its own would leave `grove reload` reaching the first one. */
  ck_assert(strncmp(GROVE_DEFAULT_ADMIN_URL, "tcp://127.0.0.1:", 16) == 0);
  nng_socket holder;
  ck_assert_int_eq(nng_rep0_open(&holder), 0);
  int lrv = nng_listen(holder, GROVE_DEFAULT_ADMIN_URL, NULL, 0);
  ck_assert_msg(lrv == 0 || lrv == NNG_EADDRINUSE, "listen: %s", nng_strerror(lrv));
  const char *dir = grove_test_tmpdir();
  ck_assert_ptr_nonnull(dir);
  char sock[4200], log[4200];
  snprintf(sock, sizeof sock, "ipc://%s/data.sock", dir);
  snprintf(log, sizeof log, "%s/groved.log", dir);
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, STDERR_FILENO);
    dup2(fd, STDOUT_FILENO);
    alarm(60); /* a groved that started anyway is killed, and fails below */
    execl(h_groved_path(), h_groved_path(), "--http", "none", "--pub", "none", "--listen", sock,
          (char *)NULL);
    _exit(127);
  }
  int st;
  ck_assert_int_eq(waitpid(pid, &st, 0), pid);
  char *text = grove_test_read_file(log, NULL);
  ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 1, "wait status %d; log:\n%s", st,
                text ? text : "");
  ck_assert_msg(text && strstr(text, "the default admin address " GROVE_DEFAULT_ADMIN_URL) &&
                    strstr(text, "--admin-listen"),
                "log:\n%s", text ? text : "");
  free(text);
  nng_close(holder);

  /* --admin-listen none: no admin plane at all, said in the refusal. */
  hstart_opts opts = {.no_admin = true};
  hserver s;
  admin_reqs a;
  admin_reqs_init(&a);
  char msg[GROVE_ERR_MSG_MAX];
  const char *extra[] = {"--admin-listen", "none", NULL};
  start(&s, &opts, extra);
  ck_assert_int_eq(send_to(s.tcp, &a.req[0], NULL, msg, sizeof msg), GROVE_E_PERMISSION_DENIED);
  ck_assert_msg(strstr(msg, "(none;"), "%s", msg);
  h_stop(&s);
}
END_TEST

/* ============================================================ token */

START_TEST(secret_compare) {
  const char *k = TOKEN;
  size_t n = strlen(k);
  ck_assert(grove__secret_equal(k, n, TOKEN, n));
  ck_assert(grove__secret_equal("", 0, "", 0));
  char other[64];
  for (size_t i = 0; i < n; i++) { /* a difference anywhere, first to last byte */
    memcpy(other, k, n);
    other[i] ^= 1;
    ck_assert_msg(!grove__secret_equal(k, n, other, n), "byte %zu", i);
  }
  ck_assert(!grove__secret_equal(k, n, k, n - 1));    /* a prefix */
  ck_assert(!grove__secret_equal(k, n, "", 0));       /* none */
  ck_assert(!grove__secret_equal(k, n - 1, k, n));    /* more */
  memcpy(other, k, n);
  other[n] = 'x';
  ck_assert(!grove__secret_equal(k, n, other, n + 1));
  /* Embedded zeros are bytes like any other. */
  ck_assert(grove__secret_equal("a\0b", 3, "a\0b", 3));
  ck_assert(!grove__secret_equal("a\0b", 3, "a\0c", 3));
}
END_TEST

START_TEST(token_required_on_the_admin_plane) {
  const char *dir = grove_test_tmpdir();
  ck_assert_ptr_nonnull(dir);
  char tok[4096];
  snprintf(tok, sizeof tok, "%s/token", dir);
  ck_assert_int_eq(grove_test_write_file(tok, TOKEN "\n", strlen(TOKEN) + 1), 0);
  chmod(tok, 0600);
  const char *extra[] = {"--admin-token-file", tok, NULL};
  hserver s;
  start(&s, NULL, extra);
  admin_reqs a;
  admin_reqs_init(&a);
  char msg[GROVE_ERR_MSG_MAX];
  char longer[128], prefix[128], flipped[128];
  snprintf(longer, sizeof longer, "%s!", TOKEN);
  snprintf(prefix, sizeof prefix, "%.*s", (int)strlen(TOKEN) - 1, TOKEN);
  snprintf(flipped, sizeof flipped, "%s", TOKEN);
  flipped[0] ^= 1;
  const char *wrong[] = {NULL, "", "x", prefix, longer, flipped, TOKEN "\n"};
  for (int i = 0; i < 10; i++) {
    for (size_t w = 0; w < sizeof wrong / sizeof wrong[0]; w++) {
      grove_status st = send_to(s.admin, &a.req[i], wrong[w], msg, sizeof msg);
      ck_assert_msg(st == GROVE_E_UNAUTHENTICATED, "%s with token %zu: %s %s", a.names[i], w,
                    grove_status_name(st), msg);
      ck_assert_msg(!strstr(msg, TOKEN) && !strstr(msg, prefix), "%s", msg);
    }
    grove_status st = send_to(s.admin, &a.req[i], TOKEN, msg, sizeof msg);
    ck_assert_msg(st != GROVE_E_UNAUTHENTICATED && st != GROVE_E_PERMISSION_DENIED,
                  "%s with the token: %s %s", a.names[i], grove_status_name(st), msg);
  }
  /* The data plane needs no token; the token does not open the admin RPCs
   * there. */
  ck_assert_int_eq(send_to(s.tcp, &a.req[0], TOKEN, msg, sizeof msg), GROVE_E_PERMISSION_DENIED);
  grove_client *c = h_connect(s.tcp);
  grove_err err = {0};
  grove_model_info *mi = NULL;
  ck_assert_ok(grove_client_model_info(c, MODEL, 5000, &mi, &err), &err);
  ck_assert_int_eq(mi->version, 2); /* only the reload with the token ran */
  grove_model_info_free(mi);
  grove_client_close(c);

  /* libgrove-client: the token from the options, else $GROVE_ADMIN_TOKEN,
   * and the admin URL from $GROVE_ADMIN. */
  setenv("GROVE_ADMIN", s.admin, 1);
  setenv("GROVE_ADMIN_TOKEN", TOKEN, 1);
  const char *urls[] = {s.tcp};
  ck_assert_ok(grove_client_open(urls, 1, NULL, &c, &err), &err);
  grove_reload_result res;
  ck_assert_ok(grove_client_reload(c, MODEL, NULL, 10000, &res, &err), &err);
  ck_assert_int_eq(res.version, 3);
  grove_reload_result_fini(&res);
  grove_client_close(c);
  unsetenv("GROVE_ADMIN_TOKEN");
  ck_assert_ok(grove_client_open(urls, 1, NULL, &c, &err), &err);
  ck_assert_status(grove_client_reload(c, MODEL, NULL, 10000, &res, &err),
                   GROVE_E_UNAUTHENTICATED);
  grove_reload_result_fini(&res);
  grove_client_close(c);
  unsetenv("GROVE_ADMIN");

  /* Refusals are logged as they happen, naming no token. */
  char *log = grove_test_read_file(s.log, NULL);
  ck_assert_ptr_nonnull(log);
  ck_assert_msg(strstr(log, "admin.unauthenticated"), "no refusal logged");
  ck_assert_msg(!strstr(log, TOKEN) && !strstr(log, prefix), "the token is in the log");
  free(log);
  h_stop(&s);
  h_rm_rf(dir);
}
END_TEST

START_TEST(bad_token_files_are_usage_errors) {
  const char *dir = grove_test_tmpdir();
  ck_assert_ptr_nonnull(dir);
  char empty[4096], missing[4096];
  snprintf(empty, sizeof empty, "%s/empty", dir);
  snprintf(missing, sizeof missing, "%s/missing", dir);
  ck_assert_int_eq(grove_test_write_file(empty, "\n", 1), 0);
  const char *cases[][2] = {{"--admin-token-file", empty},
                            {"--admin-token-file", missing},
                            {"--checkpoint-dir", missing},
                            {"--admin-listen", "http://x"}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    const char *args[] = {"--http", "none", "--listen", "ipc:///nonexistent-dir/x.sock",
                          cases[i][0], cases[i][1], NULL};
    int st = h_groved_exit(args);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 2, "case %zu: wait status %d", i, st);
  }
  h_rm_rf(dir);
}
END_TEST

/* ============================================================ paths */

static bool exists(const char *path) {
  struct stat st;
  return lstat(path, &st) == 0;
}

START_TEST(paths_outside_are_refused) {
  const char *t = grove_test_tmpdir();
  ck_assert_ptr_nonnull(t);
  char allowed[512], outside[512];
  snprintf(allowed, sizeof allowed, "%s/allowed", t);
  snprintf(outside, sizeof outside, "%s/outside", t);
  ck_assert_int_eq(mkdir(allowed, 0755), 0);
  ck_assert_int_eq(mkdir(outside, 0755), 0);
  /* A file outside that must stay as it is, and links pointing out. */
  char victim[600], link_file[600], link_dir[600], secret[600];
  snprintf(victim, sizeof victim, "%s/victim.safetensors", outside);
  snprintf(secret, sizeof secret, "%s/secret.safetensors", outside);
  ck_assert_int_eq(grove_test_write_file(victim, "keep me", 7), 0);
  ck_assert_int_eq(h_copy(grove_fixture(MODEL "/weights.safetensors"), secret), 0);
  snprintf(link_file, sizeof link_file, "%s/link.safetensors", allowed);
  snprintf(link_dir, sizeof link_dir, "%s/out", allowed);
  ck_assert_int_eq(symlink(victim, link_file), 0);
  ck_assert_int_eq(symlink(outside, link_dir), 0);

  hstart_opts opts = {.no_checkpoint_dirs = true};
  const char *extra[] = {"--checkpoint-dir", allowed, NULL};
  hserver s;
  start(&s, &opts, extra);
  grove_client *c = h_connect(s.tcp);
  grove_err err = {0};
  grove_train_opts to = {.optimizer = GROVE_OPTIM_SGD,
                         .h = grove_optim_defaults(GROVE_OPTIM_SGD),
                         .loss = grove_loss_default(GROVE_LOSS_CROSS_ENTROPY)};
  grove_train_info info;
  ck_assert_ok(grove_client_start_training(c, MODEL, &to, 10000, &info, &err), &err);
  grove_train_info_fini(&info);

  char dotdot[700], dotdot_new[700], via_link_dir[700], new_out[700], missing_out[700];
  snprintf(dotdot, sizeof dotdot, "%s/../outside/victim.safetensors", allowed);
  snprintf(dotdot_new, sizeof dotdot_new, "%s/../outside/new.safetensors", allowed);
  snprintf(via_link_dir, sizeof via_link_dir, "%s/new.safetensors", link_dir);
  snprintf(new_out, sizeof new_out, "%s/new.safetensors", outside);
  snprintf(missing_out, sizeof missing_out, "%s/missing.safetensors", outside);
  const char *bad[] = {victim, new_out, dotdot, dotdot_new, link_file, via_link_dir,
                       "/etc/passwd", "relative-outside.safetensors"};
  grove_reload_result res;
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    grove_status st = grove_client_promote(c, MODEL, bad[i], false, 10000, &res, &err);
    ck_assert_msg(st == GROVE_E_PERMISSION_DENIED, "promote to %s: %s %s", bad[i],
                  grove_status_name(st), grove_err_msg(&err));
    ck_assert_msg(strstr(grove_err_msg(&err), allowed), "%s", grove_err_msg(&err));
    grove_reload_result_fini(&res);
    st = grove_client_stop_training(c, MODEL, bad[i], 10000, NULL, &err);
    ck_assert_msg(st == GROVE_E_PERMISSION_DENIED, "stop saving to %s: %s %s", bad[i],
                  grove_status_name(st), grove_err_msg(&err));
  }
  /* Nothing was written outside. */
  size_t len = 0;
  char *kept = grove_test_read_file(victim, &len);
  ck_assert_ptr_nonnull(kept);
  ck_assert(len == 7 && memcmp(kept, "keep me", 7) == 0);
  free(kept);
  ck_assert(!exists(new_out));
  ck_assert(!exists("relative-outside.safetensors"));

  /* Reload from outside: one refusal whatever the file is (a checkpoint, a
   * missing file, a link), and the model goes on at version 1.  Inside, a
   * missing file is still NOT_FOUND. */
  const char *bad_reads[] = {secret, missing_out, dotdot, link_file, "/etc/passwd"};
  char first[GROVE_ERR_MSG_MAX] = "";
  for (size_t i = 0; i < sizeof bad_reads / sizeof bad_reads[0]; i++) {
    grove_reload_opts ro = {.checkpoint = bad_reads[i]};
    grove_status st = grove_client_reload(c, MODEL, &ro, 10000, &res, &err);
    ck_assert_msg(st == GROVE_E_PERMISSION_DENIED, "reload from %s: %s %s", bad_reads[i],
                  grove_status_name(st), grove_err_msg(&err));
    grove_reload_result_fini(&res);
    /* The message with the path taken out is the same for every file. */
    char m[GROVE_ERR_MSG_MAX];
    const char *msg = grove_err_msg(&err), *at = strstr(msg, bad_reads[i]);
    ck_assert_ptr_nonnull(at);
    snprintf(m, sizeof m, "%.*s%s", (int)(at - msg), msg, at + strlen(bad_reads[i]));
    if (!first[0]) snprintf(first, sizeof first, "%s", m);
    ck_assert_str_eq(m, first);
  }
  char missing_in[700];
  snprintf(missing_in, sizeof missing_in, "%s/missing.safetensors", allowed);
  grove_reload_opts ro = {.checkpoint = missing_in};
  ck_assert_status(grove_client_reload(c, MODEL, &ro, 10000, &res, &err), GROVE_E_NOT_FOUND);
  grove_reload_result_fini(&res);
  grove_model_info *mi = NULL;
  ck_assert_ok(grove_client_model_info(c, MODEL, 5000, &mi, &err), &err);
  ck_assert_int_eq(mi->version, 1);
  grove_model_info_free(mi);

  /* Inside: the allowed directory and the model's own. */
  char good[700], opt[700];
  snprintf(good, sizeof good, "%s/promoted.safetensors", allowed);
  snprintf(opt, sizeof opt, "%s/optim.pt", allowed);
  ck_assert_ok(grove_client_promote(c, MODEL, good, false, 10000, &res, &err), &err);
  ck_assert_int_eq(res.version, 2);
  grove_reload_result_fini(&res);
  ck_assert(exists(good));
  ck_assert_ok(grove_client_stop_training(c, MODEL, opt, 10000, NULL, &err), &err);
  ck_assert(exists(opt));
  ro.checkpoint = grove_fixture(MODEL "/weights.safetensors");
  ck_assert_ok(grove_client_reload(c, MODEL, &ro, 10000, &res, &err), &err);
  ck_assert_int_eq(res.version, 3);
  grove_reload_result_fini(&res);
  /* Resuming from an optimizer state outside is refused as well. */
  to.optimizer_state = secret;
  ck_assert_status(grove_client_start_training(c, MODEL, &to, 10000, &info, &err),
                   GROVE_E_PERMISSION_DENIED);
  grove_train_info_fini(&info);
  to.optimizer_state = opt;
  ck_assert_ok(grove_client_start_training(c, MODEL, &to, 10000, &info, &err), &err);
  grove_train_info_fini(&info);
  grove_client_close(c);
  h_stop(&s);
  h_rm_rf(t);
}
END_TEST

Suite *admin_suite(void) {
  Suite *s = suite_create("admin");
  TCase *p = tcase_create("planes");
  tcase_set_timeout(p, 120);
  tcase_add_test(p, admin_rpcs_only_on_the_admin_listener);
  tcase_add_test(p, default_admin_address_taken_stops_groved);
  suite_add_tcase(s, p);
  TCase *t = tcase_create("token");
  tcase_set_timeout(t, 120);
  tcase_add_test(t, secret_compare);
  tcase_add_test(t, token_required_on_the_admin_plane);
  tcase_add_test(t, bad_token_files_are_usage_errors);
  suite_add_tcase(s, t);
  TCase *q = tcase_create("paths");
  tcase_set_timeout(q, 120);
  tcase_add_test(q, paths_outside_are_refused);
  suite_add_tcase(s, q);
  return s;
}

GROVE_TEST_MAIN(admin_suite)
