/* check_files.c: files that change underneath a running groved.
 *
 *   - a `cp` over a model's weights while a reload is building from them:
 *     the reload is refused, the old version keeps serving its exact
 *     outputs, groved lives on, and the next reload takes the new file;
 *     and one over the checkpoint of an in-place reload waiting to change
 *     the tree;
 *   - `truncate -s 0` of a serving model's weights: export and a training
 *     session still work from the weights being served, predict is right;
 *   - --watch and a slow writer (half the file, a pause longer than the
 *     debounce, the rest): one reload, to the final file; and a write that
 *     starts while a --watch build is in progress makes that build refuse,
 *     the write's close reloads the final file;
 *   - a promote that fails leaves no file; groved removes at start the
 *     temporaries a killed writer left in a model directory;
 *   - `grove export` killed part way leaves no file.
 *
 * The moment of a write inside a build is made exact by groved's testing aid
 * GROVE_TEST_LOAD_PAUSE (core/model/model.c): the build waits, between reading the
 * checkpoint and building from it, until the test says go.  The model is
 * tests/fixtures_gen/reload.py's reload_mlp, whose outputs are exact
 * integers (A: ya, B: yb), and training.py's train_server_mlp.  No assertion
 * depends on timing; waits are polls with a bound. */
#include <dirent.h>
#include <pthread.h>

#include "groved_harness.h"
#include "reload_fixtures.h"

#include <nng/protocol/reqrep0/rep.h>
#include "grove/train.h"

/* ============================================================ helpers */


/* One predict of the first 8 rows: the version, checked to serve exactly
 * want's outputs. */
static int64_t predict_is(grove_client *c, const expected *e, const grove_tensor *want) {
  grove_tensor in = h_rows(e->x, 0, 8);
  grove_prediction p;
  grove_err err = {0};
  ck_assert_ok(grove_client_predict(c, "reload_mlp", &in, 1, 20000, &p, &err), &err);
  grove_tensor w = h_rows(want, 0, 8);
  ck_assert_msg(p.outputs[0]->dtype == GROVE_F32 && grove_tensor_same_shape(p.outputs[0], &w) &&
                    memcmp(p.outputs[0]->data, w.data, grove_tensor_nbytes(&w)) == 0,
                "version %lld serves outputs of neither the old nor the new file",
                (long long)p.version);
  int64_t v = p.version;
  grove_prediction_fini(&p);
  return v;
}

/* A private copy of fixture model name in dir. */
static void copy_model(const char *name, const char *dir) {
  ck_assert_int_eq(mkdir(dir, 0755), 0);
  const char *files[] = {"model.json", "weights.safetensors", "io.safetensors"};
  for (int i = 0; i < 3; i++) {
    char a[4096], b[4096];
    snprintf(a, sizeof a, "%s/%s", grove_fixture(name), files[i]);
    snprintf(b, sizeof b, "%s/%s", dir, files[i]);
    if (access(a, F_OK) == 0) ck_assert_int_eq(h_copy(a, b), 0);
  }
}

/* dir = TMP/sub, a private copy of fixture model name; weights = its
 * weights file. */
static void private_model(const char *name, const char *sub, char dir[400], char weights[500]) {
  snprintf(dir, 400, "%s/%s", grove_test_tmpdir(), sub);
  copy_model(name, dir);
  snprintf(weights, 500, "%s/weights.safetensors", dir);
}

/* The training session the tests start: plain SGD, as check_train_server. */
static grove_train_opts sgd_opts(void) {
  return (grove_train_opts){.optimizer = GROVE_OPTIM_SGD,
                            .h = grove_optim_defaults(GROVE_OPTIM_SGD),
                            .loss = grove_loss_default(GROVE_LOSS_CROSS_ENTROPY),
                            .seed = 3};
}

static char model_arg[4400];

static void start_model(hserver *s, const char *name, const char *dir, const char *const *more) {
  snprintf(model_arg, sizeof model_arg, "%s=%s", name, dir);
  const char *extra[24] = {"--model", model_arg, "--workers", "1"};
  int n = 4;
  for (int i = 0; more && more[i] && n < 23; i++) extra[n++] = more[i];
  extra[n] = NULL;
  h_start(s, extra);
}

/* The load pause (GROVE_TEST_LOAD_PAUSE=prefix): "prefix.go" lets builds
 * through, "prefix.paused" says one is waiting. */
typedef struct pause_ctl {
  char prefix[600], go[640], paused[640];
} pause_ctl;

static void pause_init(pause_ctl *p, const char *dir) {
  snprintf(p->prefix, sizeof p->prefix, "%s/pause", dir);
  snprintf(p->go, sizeof p->go, "%s.go", p->prefix);
  snprintf(p->paused, sizeof p->paused, "%s.paused", p->prefix);
  ck_assert_int_eq(grove_test_write_file(p->go, "", 0), 0); /* start-up loads pass */
  ck_assert_int_eq(setenv("GROVE_TEST_LOAD_PAUSE", p->prefix, 1), 0);
}

static void pause_arm(pause_ctl *p) {
  ck_assert_int_eq(unlink(p->go), 0);
}

static void pause_wait(const pause_ctl *p, const hserver *s) {
  double deadline = h_now() + 30;
  while (access(p->paused, F_OK) != 0) {
    if (h_now() > deadline) {
      h_show_log(s);
      ck_abort_msg("no build paused within 30 s");
    }
    h_sleep_ms(5);
  }
}

static void pause_release(pause_ctl *p) {
  ck_assert_int_eq(grove_test_write_file(p->go, "", 0), 0);
}

static void write_all(int fd, const char *data, size_t n) {
  while (n > 0) {
    ssize_t w = write(fd, data, n);
    ck_assert_int_gt(w, 0);
    data += w;
    n -= (size_t)w;
  }
}

static void rm_dir(const char *dir) {
  h_rm_rf(dir);
}

/* A reload on a thread of its own, while the test writes to the file. */
typedef struct bg_reload {
  const char *url;
  const char *checkpoint; /* NULL: the directory's */
  bool in_place;
  grove_status st;
  grove_err err;
  pthread_t t;
} bg_reload;

static void *bg_reload_main(void *arg) {
  bg_reload *b = arg;
  grove_client *c = NULL;
  /* Reload is an admin RPC: to the admin listener of that groved. */
  const char *admin = h_admin_of(b->url);
  grove_client_opts co = {.admin_url = admin ? admin : "ipc:///nonexistent/grove-admin.sock",
                          .admin_token = ""};
  b->st = grove_client_open(&b->url, 1, &co, &c, &b->err);
  if (!b->st) {
    grove_reload_result res;
    grove_reload_opts o = {.checkpoint = b->checkpoint, .in_place = b->in_place};
    b->st = grove_client_reload(c, "reload_mlp", &o, 60000, &res, &b->err);
    grove_reload_result_fini(&res); /* a refusal fills it too */
  }
  grove_client_close(c);
  return NULL;
}

/* ============================================================ cp over a reload */

START_TEST(files_overwrite_during_reload) {
  char dir[400], weights[500];
  private_model("reload_mlp", "m", dir, weights);
  pause_ctl pc;
  pause_init(&pc, grove_test_tmpdir());
  hserver s;
  start_model(&s, "reload_mlp", dir, NULL);
  expected e;
  expected_load(&e);
  grove_client *c = h_connect(s.tcp);
  ck_assert_int_eq(predict_is(c, &e, e.ya), 1);

  /* The reload has read A and waits; `cp b.safetensors weights.safetensors`
   * starts: the file is truncated, and the new bytes have not come yet. */
  pause_arm(&pc);
  bg_reload b = {.url = s.tcp};
  ck_assert_int_eq(pthread_create(&b.t, NULL, bg_reload_main, &b), 0);
  pause_wait(&pc, &s);
  int fd = open(weights, O_WRONLY | O_TRUNC);
  ck_assert_int_ge(fd, 0);
  pause_release(&pc);
  ck_assert_int_eq(pthread_join(b.t, NULL), 0);
  ck_assert_status(b.st, GROVE_E_IO);
  ck_assert_msg(strstr(b.err.msg, "changed while the model was being built"), "%s", b.err.msg);
  ck_assert_msg(strstr(b.err.msg, weights), "%s", b.err.msg);

  /* groved lives, the old version serves A exactly. */
  ck_assert_int_eq(predict_is(c, &e, e.ya), 1);
  /* The cp completes; a reload now takes B. */
  size_t len = 0;
  char *bb = grove_test_read_file(ckpt("b.safetensors"), &len);
  ck_assert_ptr_nonnull(bb);
  write_all(fd, bb, len);
  ck_assert_int_eq(close(fd), 0);
  free(bb);
  grove_reload_result res;
  grove_reload_opts o = {0};
  grove_err err = {0};
  ck_assert_ok(grove_client_reload(c, "reload_mlp", &o, 30000, &res, &err), &err);
  ck_assert_int_eq(res.version, 2);
  grove_reload_result_fini(&res);
  ck_assert_int_eq(predict_is(c, &e, e.yb), 2);
  ck_assert(h_metric(&s, "grove_reloads_total{model=\"reload_mlp\",result=\"failed\"}") == 1);

  grove_client_close(c);
  grove_sd_free(e.sd);
  ck_assert_int_eq(h_stop(&s), 0);
  rm_dir(dir);
}
END_TEST

/* The same for an in-place reload: the checkpoint is read, the reload waits
 * for a running batch (held by --test-batch-delay-ms) before it changes the
 * tree, and the file is written over meanwhile. */
static void *bg_predict_main(void *arg) {
  grove_client *c = h_connect(arg);
  expected e;
  expected_load(&e);
  predict_is(c, &e, e.ya);
  grove_sd_free(e.sd);
  grove_client_close(c);
  return NULL;
}

START_TEST(files_overwrite_during_in_place_reload) {
  char ck[500];
  snprintf(ck, sizeof ck, "%s/new.safetensors", grove_test_tmpdir());
  ck_assert_int_eq(h_copy(ckpt("b.safetensors"), ck), 0);
  hserver s;
  const char *more[] = {"--test-batch-delay-ms", "5000", NULL};
  start_model(&s, "reload_mlp", grove_fixture("reload_mlp"), more);
  grove_client *c = h_connect(s.tcp);
  pthread_t pt;
  ck_assert_int_eq(pthread_create(&pt, NULL, bg_predict_main, s.tcp), 0);
  grove_err err = {0};
  for (int i = 0;; i++) {
    ck_assert_msg(i < 2000, "no batch started");
    grove_server_status *st = NULL;
    ck_assert_ok(grove_client_status(c, 5000, &st, &err), &err);
    bool running = st->inflight == 1 && st->models[0].queue_depth == 0;
    grove_server_status_free(st);
    if (running) break;
    h_sleep_ms(5);
  }
  bg_reload b = {.url = s.tcp, .checkpoint = ck, .in_place = true};
  ck_assert_int_eq(pthread_create(&b.t, NULL, bg_reload_main, &b), 0);
  /* Paused: the checkpoint is read, the tree not yet changed. */
  ck_assert(h_wait_metric(&s, "grove_reload_paused{model=\"reload_mlp\"}", 1, 20) == 1);
  ck_assert_int_eq(h_copy(ckpt("a.safetensors"), ck), 0); /* cp a.safetensors over it */
  ck_assert_int_eq(pthread_join(b.t, NULL), 0);
  ck_assert_int_eq(pthread_join(pt, NULL), 0);
  ck_assert_status(b.st, GROVE_E_IO);
  ck_assert_msg(strstr(b.err.msg, "changed while the model was being built"), "%s", b.err.msg);
  expected e;
  expected_load(&e);
  ck_assert_int_eq(predict_is(c, &e, e.ya), 1);
  ck_assert(!h_log_contains(&s, "reload.in_place_broken"));
  grove_sd_free(e.sd);
  grove_client_close(c);
  ck_assert_int_eq(h_stop(&s), 0);
  unlink(ck);
}
END_TEST

/* ============================================================ truncate -s 0 */

START_TEST(files_truncated_while_serving) {
  char dir[400], weights[500];
  private_model("train_server_mlp", "t", dir, weights);
  grove_err err = {0};
  grove_state_dict *want = NULL;
  ck_assert_ok(grove_safetensors_read(weights, &want, &err), &err);
  grove_state_dict *ref = NULL;
  ck_assert_ok(grove_safetensors_read(grove_fixture("train_server_ref.safetensors"), &ref, &err),
               &err);
  const grove_tensor *xe = grove_sd_get(ref, "xe"), *before = grove_sd_get(ref, "eval.before");
  ck_assert(xe && before);

  hserver s;
  start_model(&s, "train_server_mlp", dir, NULL);
  grove_client *c = h_connect(s.tcp);
  ck_assert_int_eq(truncate(weights, 0), 0);

  /* Export: the weights being served, bit for bit. */
  char out[600];
  snprintf(out, sizeof out, "%s/export.safetensors", s.dir);
  grove_export_info info;
  ck_assert_ok(
      grove_client_export_file(c, "train_server_mlp", out, false, NULL, 20000, &info, &err), &err);
  ck_assert_int_eq(info.version, 1);
  grove_state_dict *got = NULL;
  ck_assert_ok(grove_safetensors_read(out, &got, &err), &err);
  ck_assert_uint_eq(grove_sd_count(got), grove_sd_count(want));
  for (size_t i = 0; i < grove_sd_count(want); i++) {
    const grove_tensor *w = grove_sd_tensor(want, i);
    const grove_tensor *g = grove_sd_get(got, grove_sd_key(want, i));
    ck_assert_msg(g && grove_tensor_nbytes(g) == grove_tensor_nbytes(w) &&
                      memcmp(g->data, w->data, grove_tensor_nbytes(w)) == 0,
                  "%s differs from the served weights", grove_sd_key(want, i));
  }
  grove_sd_free(got);
  unlink(out);

  /* A training session copies the served weights into its replica. */
  grove_train_opts o = sgd_opts();
  grove_train_info ti;
  ck_assert_ok(grove_client_start_training(c, "train_server_mlp", &o, 10000, &ti, &err), &err);
  grove_train_info_fini(&ti);
  grove_prediction pe;
  double loss;
  ck_assert_ok(grove_client_evaluate(c, "train_server_mlp", xe, 1, NULL, 5000, &pe, &loss, &err),
               &err);
  ck_assert(grove_test_allclose(pe.outputs[0]->data, before->data,
                                (size_t)grove_tensor_numel(before), 1e-4, 1e-5) < 0);
  grove_prediction_fini(&pe);
  uint64_t steps = 1;
  ck_assert_ok(grove_client_stop_training(c, "train_server_mlp", NULL, 5000, &steps, &err), &err);
  ck_assert_uint_eq(steps, 0);

  /* Serving is as it was. */
  grove_prediction p;
  ck_assert_ok(grove_client_predict(c, "train_server_mlp", xe, 1, 5000, &p, &err), &err);
  ck_assert_int_eq(p.version, 1);
  ck_assert(grove_test_allclose(p.outputs[0]->data, before->data,
                                (size_t)grove_tensor_numel(before), 1e-4, 1e-5) < 0);
  grove_prediction_fini(&p);

  grove_client_close(c);
  grove_sd_free(want);
  grove_sd_free(ref);
  ck_assert_int_eq(h_stop(&s), 0);
  rm_dir(dir);
}
END_TEST

/* ============================================================ --watch */

START_TEST(files_watch_slow_writer) {
  char dir[400], weights[500];
  private_model("reload_mlp", "w", dir, weights);
  pause_ctl pc;
  pause_init(&pc, grove_test_tmpdir());
  hserver s;
  const char *more[] = {"--watch", "--watch-debounce-ms", "50", NULL};
  start_model(&s, "reload_mlp", dir, more);
  expected e;
  expected_load(&e);
  grove_client *c = h_connect(s.tcp);
  size_t alen = 0, blen = 0;
  char *a = grove_test_read_file(ckpt("a.safetensors"), &alen);
  char *b = grove_test_read_file(ckpt("b.safetensors"), &blen);
  ck_assert(a && b);

  /* A slow copy of B over the file: half, a pause ten debounces long, the
   * rest.  One reload, once the writer closes, to B. */
  int fd = open(weights, O_WRONLY | O_TRUNC);
  ck_assert_int_ge(fd, 0);
  write_all(fd, b, blen / 2);
  h_sleep_ms(500);
  ck_assert_int_eq(predict_is(c, &e, e.ya), 1);
  write_all(fd, b + blen / 2, blen - blen / 2);
  ck_assert_int_eq(close(fd), 0);
  ck_assert(h_wait_metric(&s, "grove_model_version{model=\"reload_mlp\"}", 2, 20) == 2);
  ck_assert_int_eq(predict_is(c, &e, e.yb), 2);
  ck_assert(h_metric(&s, "grove_reloads_total{model=\"reload_mlp\",result=\"failed\"}") == 0);

  /* A is renamed in; while its build waits, a slow in-place copy of A
   * begins: that build must refuse, and the copy's close reload A. */
  pause_arm(&pc);
  char tmp[500];
  snprintf(tmp, sizeof tmp, "%s/.incoming", dir);
  ck_assert_int_eq(grove_test_write_file(tmp, a, alen), 0);
  ck_assert_int_eq(rename(tmp, weights), 0);
  pause_wait(&pc, &s);
  fd = open(weights, O_WRONLY | O_TRUNC);
  ck_assert_int_ge(fd, 0);
  write_all(fd, a, alen / 2);
  pause_release(&pc);
  ck_assert(
      h_wait_metric(&s, "grove_reloads_total{model=\"reload_mlp\",result=\"failed\"}", 1, 20) == 1);
  ck_assert_int_eq(predict_is(c, &e, e.yb), 2);
  write_all(fd, a + alen / 2, alen - alen / 2);
  ck_assert_int_eq(close(fd), 0);
  ck_assert(h_wait_metric(&s, "grove_model_version{model=\"reload_mlp\"}", 3, 20) == 3);
  ck_assert_int_eq(predict_is(c, &e, e.ya), 3);
  ck_assert(h_metric(&s, "grove_reloads_total{model=\"reload_mlp\",result=\"failed\"}") == 1);
  ck_assert(h_metric(&s, "grove_reloads_total{model=\"reload_mlp\",result=\"ok\"}") == 2);
  ck_assert(h_log_contains(&s, "changed while the model was being built"));

  free(a);
  free(b);
  grove_client_close(c);
  grove_sd_free(e.sd);
  ck_assert_int_eq(h_stop(&s), 0);
  rm_dir(dir);
}
END_TEST

/* ============================================================ temporary files */

/* A promote whose write fails leaves nothing in $TMPDIR.  The failure: a
 * $TMPDIR so deep that promote's own file (grove-promote-NAME-step0-XXXXXX
 * .safetensors, NAME cut to 64 bytes) still fits in PATH_MAX, 4090 bytes,
 * but the writer's temporary beside it (".BASE.grove-tmp.PID.N", 14 or more
 * bytes longer) does not: mkstemps creates the file, the write fails. */
START_TEST(files_failed_promote_leaves_nothing) {
  enum { PROMOTE_BASE = 14 + 64 + 7 + 6 + 12, PATH_LEN = 4090 };
  char tmpd[PATH_MAX];
  int len = snprintf(tmpd, sizeof tmpd, "%s/tmpdir", grove_test_tmpdir());
  ck_assert_int_eq(mkdir(tmpd, 0755), 0);
  const int want = PATH_LEN - 1 - PROMOTE_BASE;
  ck_assert_int_lt(len, want - 2);
  while (len < want) { /* "/" and at most 200 bytes a component */
    int rest = want - len - 1, add = rest > 200 ? 200 : rest;
    if (rest - add == 1) add--; /* never leave a "/" of its own for last */
    tmpd[len++] = '/';
    memset(tmpd + len, 'd', (size_t)add);
    len += add;
    tmpd[len] = '\0';
    ck_assert_msg(mkdir(tmpd, 0755) == 0, "mkdir of %d bytes: %s", len, strerror(errno));
  }
  ck_assert_int_eq(len, want);
  ck_assert_int_eq(setenv("TMPDIR", tmpd, 1), 0);
  char name[256];
  memset(name, 'n', 205);
  name[205] = 0;
  hserver s;
  start_model(&s, name, grove_fixture("train_server_mlp"), NULL);
  grove_client *c = h_connect(s.tcp);
  grove_err err = {0};
  grove_train_opts o = sgd_opts();
  grove_train_info ti;
  ck_assert_ok(grove_client_start_training(c, name, &o, 10000, &ti, &err), &err);
  grove_train_info_fini(&ti);
  grove_reload_result rr = {0};
  grove_status st = grove_client_promote(c, name, NULL, false, 20000, &rr, &err);
  grove_reload_result_fini(&rr);
  ck_assert_msg(st == GROVE_E_IO, "promote: %s (%s)", grove_status_name(st), err.msg);
  ck_assert_msg(grove_test_dir_entries(tmpd) == 0, "the failed promote left a file in %s", tmpd);
  uint64_t steps = 0;
  ck_assert_ok(grove_client_stop_training(c, name, NULL, 5000, &steps, &err), &err);
  grove_client_close(c);
  ck_assert_int_eq(h_stop(&s), 0);
  /* The chain of directories, deepest first. */
  char *cut;
  while ((cut = strrchr(tmpd, '/')) && strcmp(cut, "/tmpdir") != 0) {
    rmdir(tmpd);
    *cut = '\0';
  }
  rmdir(tmpd);
}
END_TEST

/* At start, groved removes the temporaries of killed writers from a model's
 * directory (hidden ".NAME.grove-tmp.PID.N", and the visible
 * "weights.safetensors.tmp.PID.N" older groveds wrote), and only those. */
START_TEST(files_stale_temps_removed_at_start) {
  char dir[400];
  snprintf(dir, sizeof dir, "%s/st", grove_test_tmpdir());
  copy_model("reload_mlp", dir);
  pid_t dead = fork();
  ck_assert_int_ge(dead, 0);
  if (dead == 0) _exit(0);
  ck_assert_int_eq(waitpid(dead, NULL, 0), dead);
  char p1[600], p2[600], live[600], other[600];
  snprintf(p1, sizeof p1, "%s/.weights.safetensors.grove-tmp.%ld.0", dir, (long)dead);
  snprintf(p2, sizeof p2, "%s/weights.safetensors.tmp.%ld.7", dir, (long)dead);
  snprintf(live, sizeof live, "%s/.weights.safetensors.grove-tmp.%ld.0", dir, (long)getpid());
  snprintf(other, sizeof other, "%s/notes.tmp.1.2", dir);
  const char *paths[] = {p1, p2, live, other};
  for (int i = 0; i < 4; i++) ck_assert_int_eq(grove_test_write_file(paths[i], "x", 1), 0);
  hserver s;
  start_model(&s, "reload_mlp", dir, NULL);
  ck_assert_int_eq(access(p1, F_OK), -1);
  ck_assert_int_eq(access(p2, F_OK), -1);
  ck_assert_int_eq(access(live, F_OK), 0); /* this test's: alive */
  ck_assert_int_eq(access(other, F_OK), 0);
  ck_assert(h_log_contains(&s, "removed 2 temporary files"));
  ck_assert_int_eq(h_stop(&s), 0);
  rm_dir(dir);
}
END_TEST

/* `grove export` interrupted while it waits for the server (Ctrl-C,
 * SIGTERM, even SIGKILL) leaves no file, partial or temporary.  The
 * "server" is a socket that takes the request and never answers. */
START_TEST(files_export_interrupted_leaves_nothing) {
  const char *bin = getenv("GROVE_BIN");
  if (!bin || !*bin) bin = "build/release/grove";
  char dir[400];
  snprintf(dir, sizeof dir, "%s/out", grove_test_tmpdir());
  ck_assert_int_eq(mkdir(dir, 0755), 0);
  char out[500];
  snprintf(out, sizeof out, "%s/x.safetensors", dir);
  const int sigs[] = {SIGINT, SIGTERM, SIGKILL};
  for (int k = 0; k < 3; k++) {
    char url[64];
    snprintf(url, sizeof url, "tcp://127.0.0.1:%d", h_free_port());
    nng_socket rep;
    ck_assert_int_eq(nng_rep0_open(&rep), 0);
    ck_assert_int_eq(nng_listen(rep, url, NULL, 0), 0);
    nng_setopt_ms(rep, NNG_OPT_RECVTIMEO, 20000);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
      int devnull = open("/dev/null", O_WRONLY);
      if (devnull >= 0) {
        dup2(devnull, STDOUT_FILENO);
        dup2(devnull, STDERR_FILENO);
      }
      /* Export is an admin RPC: the stand-in server is the admin listener. */
      execl(bin, bin, "--server", url, "--admin", url, "export", "reload_mlp", "-o", out,
            "--timeout-ms", "60000", (char *)NULL);
      _exit(127);
    }
    /* The export's first request has come: the file is being written. */
    char *buf = NULL;
    size_t n = 0;
    ck_assert_int_eq(nng_recv(rep, &buf, &n, NNG_FLAG_ALLOC), 0);
    nng_free(buf, n);
    kill(pid, sigs[k]);
    int st;
    ck_assert_int_eq(waitpid(pid, &st, 0), pid);
    ck_assert_msg(grove_test_dir_entries(dir) == 0, "grove export killed by signal %d left a file in %s",
                  sigs[k], dir);
    nng_close(rep);
  }
  rmdir(dir);
}
END_TEST

static Suite *files_suite(void) {
  Suite *s = suite_create("files");
  TCase *tc = tcase_create("files");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, files_overwrite_during_reload);
  tcase_add_test(tc, files_overwrite_during_in_place_reload);
  tcase_add_test(tc, files_truncated_while_serving);
  tcase_add_test(tc, files_watch_slow_writer);
  tcase_add_test(tc, files_failed_promote_leaves_nothing);
  tcase_add_test(tc, files_stale_temps_removed_at_start);
  tcase_add_test(tc, files_export_interrupted_leaves_nothing);
  suite_add_tcase(s, tc);
  return s;
}

GROVE_TEST_MAIN(files_suite)
