/* check_reload.c: hot reload against a live groved.
 *
 * The model is tests/fixtures_gen/reload.py's reload_mlp: small integer
 * weights and inputs, so every output is an exact integer and a reply can be
 * compared bit for bit with the output of the version it names: version 1 is
 * weights A (the directory's), and the tests keep odd versions on A and even
 * ones on B.
 *
 *   - basic: reload B, the directory again, formats, status and metrics;
 *   - storm: four clients predict in loops while the model reloads dozens of
 *     times between A and B (full and in place): no request fails, every
 *     reply equals its version's output exactly, versions never go back;
 *   - refusals: every way a checkpoint can fail changes nothing (the lists
 *     of what did not fit come back), and the bad requests;
 *   - busy: a second reload while one is in progress is refused
 *     (UNAVAILABLE), and so is an export while an in-place reload holds the
 *     model (a batch held by --test-batch-delay-ms keeps it in progress);
 *   - another model directory; SIGHUP; --watch.
 *
 * No assertion depends on timing; waits are polls with a bound. */
#include <pthread.h>
#include <stdatomic.h>

#include "groved_harness.h"
#include "reload_fixtures.h"

/* ============================================================ fixtures */

/* out equals rows [r0, r0 + n) of y bit for bit. */
static bool same_rows(const grove_tensor *out, const grove_tensor *y, int64_t r0, int64_t n) {
  grove_tensor want = h_rows(y, r0, n);
  return out->dtype == GROVE_F32 && grove_tensor_same_shape(out, &want) &&
         memcmp(out->data, want.data, grove_tensor_nbytes(&want)) == 0;
}

/* One predict of rows [r0, r0 + n); returns the version, checking the output
 * is exactly that version's. */
static int64_t predict_check(grove_client *c, const expected *e, int64_t r0, int64_t n) {
  grove_tensor in = h_rows(e->x, r0, n);
  grove_prediction p;
  grove_err err = {0};
  ck_assert_ok(grove_client_predict(c, "reload_mlp", &in, 1, 20000, &p, &err), &err);
  const grove_tensor *want = p.version % 2 ? e->ya : e->yb;
  ck_assert_msg(same_rows(p.outputs[0], want, r0, n), "version %lld: rows %lld..+%lld differ",
                (long long)p.version, (long long)r0, (long long)n);
  int64_t v = p.version;
  grove_prediction_fini(&p);
  return v;
}

static grove_status reload(grove_client *c, const char *ck, bool in_place, bool non_strict,
                           grove_reload_result *res, grove_err *err) {
  grove_reload_opts o = {.checkpoint = ck, .in_place = in_place, .non_strict = non_strict};
  return grove_client_reload(c, "reload_mlp", &o, 30000, res, err);
}

/* Reloads ck and checks the new version number. */
static void reload_ok(grove_client *c, const char *ck, bool in_place, int64_t want_version) {
  grove_reload_result res;
  grove_err err = {0};
  ck_assert_ok(reload(c, ck, in_place, false, &res, &err), &err);
  ck_assert_int_eq(res.version, want_version);
  ck_assert_int_eq(res.previous_version, want_version - 1);
  ck_assert_int_eq(res.in_place, in_place);
  ck_assert_int_eq(res.n_missing + res.n_unexpected + res.n_errors, 0);
  if (ck) ck_assert_str_eq(res.weights_path, ck);
  grove_reload_result_fini(&res);
}

static char model_arg[4200];

static void start_mlp(hserver *s, const char *dir, const char *const *more) {
  snprintf(model_arg, sizeof model_arg, "reload_mlp=%s", dir ? dir : grove_fixture("reload_mlp"));
  const char *extra[24] = {"--model", model_arg, "--workers", "2"};
  int n = 4;
  for (int i = 0; more && more[i] && n < 23; i++) extra[n++] = more[i];
  extra[n] = NULL;
  h_start(s, extra);
}

/* ============================================================ basic */

START_TEST(reload_basic) {
  hserver s;
  start_mlp(&s, NULL, NULL);
  expected e;
  expected_load(&e);
  grove_client *c = h_connect(s.tcp);
  ck_assert_int_eq(predict_check(c, &e, 0, 8), 1);
  reload_ok(c, ckpt("b.safetensors"), false, 2);
  ck_assert_int_eq(predict_check(c, &e, 0, 8), 2);
  reload_ok(c, NULL, false, 3); /* the directory's weights: A */
  ck_assert_int_eq(predict_check(c, &e, 8, 5), 3);
  reload_ok(c, ckpt("b.pt"), false, 4);
  ck_assert_int_eq(predict_check(c, &e, 13, 1), 4);
  reload_ok(c, ckpt("a.pt"), true, 5);
  ck_assert_int_eq(predict_check(c, &e, 0, 8), 5);
  /* float16 into the float32 tree, in place: converted first. */
  reload_ok(c, ckpt("b_f16.safetensors"), true, 6);
  ck_assert_int_eq(predict_check(c, &e, 0, 8), 6);
  reload_ok(c, NULL, true, 7);
  ck_assert_int_eq(predict_check(c, &e, 3, 4), 7);

  grove_err err = {0};
  grove_model_info *mi = NULL;
  ck_assert_ok(grove_client_model_info(c, "reload_mlp", 5000, &mi, &err), &err);
  ck_assert_int_eq(mi->version, 7);
  ck_assert_msg(strstr(mi->weights_path, "reload_mlp/weights.safetensors"), "%s", mi->weights_path);
  grove_model_info_free(mi);
  grove_client_close(c);

  ck_assert(h_metric(&s, "grove_model_version{model=\"reload_mlp\"}") == 7);
  ck_assert(h_metric(&s, "grove_reloads_total{model=\"reload_mlp\",result=\"ok\"}") == 6);
  ck_assert(h_metric(&s, "grove_reloads_total{model=\"reload_mlp\",result=\"failed\"}") == 0);
  ck_assert(h_metric(&s, "grove_reload_duration_seconds_count{model=\"reload_mlp\"}") == 6);
  ck_assert(h_metric(&s, "grove_reload_pause_seconds_count{model=\"reload_mlp\"}") == 3);
  ck_assert(h_log_contains(&s, "reload.ok: model reload_mlp version 2 (was 1) from"));
  ck_assert(h_log_contains(&s, "in place (paused"));
  /* With one compute thread the builds run where they take only idle CPU:
   * the log says the policy the build thread read back from the kernel. */
  ck_assert(h_log_contains(&s, ", built at SCHED_IDLE, "));
  /* ... as a background thread, which yields its core every 100 us of its
   * work (server/reload.c, "priority"; core/base/yield.c). */
  ck_assert(h_log_contains(&s, ", built at SCHED_IDLE, yielding every 100 us ("));
  ck_assert(!h_log_contains(&s, ", built at nice 10, "));
  ck_assert(!h_log_contains(&s, ", built at normal priority, "));
  grove_sd_free(e.sd);
  ck_assert_int_eq(h_stop(&s), 0);
}
END_TEST

/* ============================================================ storm */

typedef struct storm_client {
  const char *url;
  const expected *e;
  atomic_bool *stop;
  int id;
  /* requests is read by the main thread while the client counts (the
   * storm waits on it); the others only after the join. */
  atomic_long requests;
  long failures, mismatches, regressions;
  int64_t last_version;
  char first_error[512];
} storm_client;

static void *storm_loop(void *arg) {
  storm_client *sc = arg;
  grove_client *c = NULL;
  grove_err err = {0};
  const char *urls[] = {sc->url};
  if (grove_client_open(urls, 1, NULL, &c, &err)) {
    snprintf(sc->first_error, sizeof sc->first_error, "open: %s", grove_err_msg(&err));
    sc->failures++;
    return NULL;
  }
  /* Bounded in count as well as by the storm. */
  for (long i = 0; i < 200000 && !atomic_load(sc->stop); i++) {
    int64_t n = 1 + (i + sc->id) % 3, r0 = (i * 7 + sc->id * 5) % (32 - n);
    grove_tensor in = h_rows(sc->e->x, r0, n);
    grove_prediction p;
    grove_status st = grove_client_predict(c, "reload_mlp", &in, 1, 20000, &p, &err);
    atomic_fetch_add(&sc->requests, 1);
    if (st) {
      if (!sc->failures)
        snprintf(sc->first_error, sizeof sc->first_error, "%s: %s", grove_status_name(st),
                 grove_err_msg(&err));
      sc->failures++;
      continue;
    }
    const grove_tensor *want = p.version % 2 ? sc->e->ya : sc->e->yb;
    if (!same_rows(p.outputs[0], want, r0, n)) sc->mismatches++;
    if (p.version < sc->last_version) sc->regressions++;
    sc->last_version = p.version;
    grove_prediction_fini(&p);
  }
  grove_client_close(c);
  return NULL;
}

/* The most times one build yielded, from the reload.ok lines of s's log
 * ("yielding every US us (N times)"); -1 when no line says. */
static long max_yields_every(const hserver *s, int us) {
  char *text = grove_test_read_file(s->log, NULL);
  long most = -1;
  char key[64];
  snprintf(key, sizeof key, "yielding every %d us (", us);
  for (const char *p = text; p && (p = strstr(p, key)); p += strlen(key)) {
    long n = strtol(p + strlen(key), NULL, 10);
    if (n > most) most = n;
  }
  free(text);
  return most;
}

START_TEST(reload_storm) {
  hserver s;
  /* Every yield point a build passes yields (1 us), so that the log's
   * counts show the builds are background threads whatever this machine's
   * speed. */
  static const char *const yield_often[] = {"--background-yield-us", "1", NULL};
  start_mlp(&s, NULL, yield_often);
  expected e;
  expected_load(&e);
  enum { NCLIENTS = 4, NRELOADS = 36 };
  atomic_bool stop = false;
  storm_client sc[NCLIENTS];
  pthread_t th[NCLIENTS];
  for (int i = 0; i < NCLIENTS; i++) {
    sc[i] = (storm_client){.url = i % 2 ? s.ipc : s.tcp, .e = &e, .stop = &stop, .id = i};
    ck_assert_int_eq(pthread_create(&th[i], NULL, storm_loop, &sc[i]), 0);
  }
  grove_client *c = h_connect(s.tcp);
  /* Version v serves A when odd, B when even; formats and modes rotate. */
  static const char *const b_files[] = {"b.safetensors", "b.pt", "b_f16.safetensors"};
  static const char *const a_files[] = {"a.safetensors", "a.pt", NULL};
  for (int k = 0; k < NRELOADS; k++) {
    int64_t v = 2 + k;
    const char *name = v % 2 ? a_files[(k / 2) % 3] : b_files[(k / 2) % 3];
    bool in_place = k % 3 == 2;
    reload_ok(c, name ? ckpt(name) : NULL, in_place, v);
    /* Let the clients see this version before the next one. */
    long before = 0, after = 0;
    for (int i = 0; i < NCLIENTS; i++) before += atomic_load(&sc[i].requests);
    for (int t = 0; t < 2000 && after < before + 3 * NCLIENTS; t++) {
      h_sleep_ms(1);
      after = 0;
      for (int i = 0; i < NCLIENTS; i++) after += atomic_load(&sc[i].requests);
    }
  }
  atomic_store(&stop, true);
  long total = 0;
  for (int i = 0; i < NCLIENTS; i++) {
    pthread_join(th[i], NULL);
    ck_assert_msg(sc[i].failures == 0, "client %d: %ld of %ld requests failed; first: %s", i,
                  sc[i].failures, atomic_load(&sc[i].requests), sc[i].first_error);
    ck_assert_msg(sc[i].mismatches == 0, "client %d: %ld replies differ from their version's", i,
                  sc[i].mismatches);
    ck_assert_msg(sc[i].regressions == 0, "client %d: versions went back", i);
    total += atomic_load(&sc[i].requests);
  }
  ck_assert_int_gt(total, NRELOADS);
  fprintf(stderr, "reload_storm: %ld requests over %d reloads\n", total, NRELOADS);
  ck_assert_int_eq(predict_check(c, &e, 0, 8), 1 + NRELOADS);
  grove_client_close(c);
  ck_assert(h_metric(&s, "grove_reloads_total{model=\"reload_mlp\",result=\"ok\"}") == NRELOADS);
  ck_assert(h_metric(&s, "grove_requests_total{model=\"reload_mlp\",status=\"OK\",protocol=\"grove\"}") ==
            (double)total + 1);
  /* Each build packs and runs a trial forward, whose products and modules
   * are yield points (core/base/yield.c). */
  ck_assert_msg(max_yields_every(&s, 1) > 0, "no build yielded: are builds background threads?");
  grove_sd_free(e.sd);
  ck_assert_int_eq(h_stop(&s), 0);
}
END_TEST

/* ============================================================ refusals */

static void refused(grove_client *c, const char *ck, bool in_place, grove_status want,
                    const char *needle, grove_reload_result *res) {
  grove_err err = {0};
  grove_status st = reload(c, ck, in_place, false, res, &err);
  ck_assert_msg(st == want, "%s%s: got %s, expected %s: %s", ck ? ck : "(dir)",
                in_place ? " in place" : "", grove_status_name(st), grove_status_name(want),
                grove_err_msg(&err));
  if (needle) ck_assert_msg(strstr(grove_err_msg(&err), needle), "%s", grove_err_msg(&err));
}

START_TEST(reload_refusals) {
  hserver s;
  static char tied[4200];
  snprintf(tied, sizeof tied, "tied=%s", grove_fixture("models_tied"));
  const char *more[] = {"--model", tied, NULL};
  start_mlp(&s, NULL, more);
  expected e;
  expected_load(&e);
  grove_client *c = h_connect(s.tcp);
  grove_reload_result res;
  for (int mode = 0; mode < 2; mode++) {
    bool ip = mode == 1;
    refused(c, ckpt("missing.safetensors"), ip, GROVE_E_STATE_DICT, "Missing key(s)", &res);
    ck_assert_int_eq(res.n_missing, 1);
    ck_assert_str_eq(res.missing[0], "2.bias");
    ck_assert_int_eq(res.n_unexpected + res.n_errors, 0);
    ck_assert_int_eq(res.version, 1);
    grove_reload_result_fini(&res);
    refused(c, ckpt("unexpected.safetensors"), ip, GROVE_E_STATE_DICT, "Unexpected key(s)", &res);
    ck_assert_int_eq(res.n_unexpected, 1);
    ck_assert_str_eq(res.unexpected[0], "3.weight");
    grove_reload_result_fini(&res);
    refused(c, ckpt("shape.safetensors"), ip, GROVE_E_STATE_DICT, "size mismatch for 0.weight",
            &res);
    ck_assert_int_eq(res.n_errors, 1);
    ck_assert_msg(strstr(res.errors[0], "torch.Size([16, 9])"), "%s", res.errors[0]);
    grove_reload_result_fini(&res);
    refused(c, ckpt("garbage.safetensors"), ip, GROVE_E_HEADER_TOO_LARGE, "garbage", &res);
    grove_reload_result_fini(&res);
    refused(c, ckpt("truncated.pt"), ip, GROVE_E_FORMAT, "truncated.pt", &res);
    grove_reload_result_fini(&res);
    refused(c, ckpt("hostile.pt"), ip, GROVE_E_REFUSED, "os", &res);
    grove_reload_result_fini(&res);
    refused(c, ckpt("no-such-file.pt"), ip, GROVE_E_NOT_FOUND, "no-such-file.pt", &res);
    grove_reload_result_fini(&res);
    /* Nothing changed: version 1, A's outputs. */
    ck_assert_int_eq(predict_check(c, &e, 0, 8), 1);
  }
  ck_assert(h_metric(&s, "grove_reloads_total{model=\"reload_mlp\",result=\"failed\"}") == 14);
  ck_assert(h_metric(&s, "grove_model_version{model=\"reload_mlp\"}") == 1);
  ck_assert(h_log_contains(&s, "reload.failed: model reload_mlp"));

  /* Non-strict accepts the missing key (it keeps the fresh tree's zeros). */
  grove_err err = {0};
  ck_assert_ok(reload(c, ckpt("missing.safetensors"), false, true, &res, &err), &err);
  ck_assert_int_eq(res.version, 2);
  grove_reload_result_fini(&res);
  ck_assert_ok(reload(c, ckpt("unexpected.safetensors"), true, true, &res, &err), &err);
  ck_assert_int_eq(res.version, 3);
  grove_reload_result_fini(&res);

  /* Bad requests. */
  grove_reload_opts o = {.model_dir = grove_fixture("reload_other"), .in_place = true};
  ck_assert_status(grove_client_reload(c, "reload_mlp", &o, 5000, &res, &err),
                   GROVE_E_INVALID_ARGUMENT);
  grove_reload_result_fini(&res);
  ck_assert_status(grove_client_reload(c, "nope", NULL, 5000, &res, &err), GROVE_E_NOT_FOUND);
  grove_reload_result_fini(&res);
  o = (grove_reload_opts){.model_dir = grove_fixture("no_such_model_dir")};
  ck_assert_status(grove_client_reload(c, "reload_mlp", &o, 5000, &res, &err), GROVE_E_NOT_FOUND);
  ck_assert_msg(strstr(grove_err_msg(&err), "no_such_model_dir"), "%s", grove_err_msg(&err));
  grove_reload_result_fini(&res);
  /* Outside the model's directory and every --checkpoint-dir: refused
   * before anything looks at it (server/admin.c). */
  o = (grove_reload_opts){.model_dir = "/nonexistent/dir"};
  ck_assert_status(grove_client_reload(c, "reload_mlp", &o, 5000, &res, &err),
                   GROVE_E_PERMISSION_DENIED);
  ck_assert_msg(strstr(grove_err_msg(&err), "/nonexistent/dir"), "%s", grove_err_msg(&err));
  grove_reload_result_fini(&res);
  /* Tied parameters: in place would untie them, so only a full reload. */
  grove_reload_opts t = {.in_place = true};
  ck_assert_status(grove_client_reload(c, "tied", &t, 5000, &res, &err), GROVE_E_UNSUPPORTED);
  ck_assert_msg(strstr(grove_err_msg(&err), "ties parameters"), "%s", grove_err_msg(&err));
  grove_reload_result_fini(&res);
  t.in_place = false;
  ck_assert_ok(grove_client_reload(c, "tied", &t, 5000, &res, &err), &err);
  ck_assert_int_eq(res.version, 2);
  grove_reload_result_fini(&res);
  /* Version 3 holds all of B (the in-place load filled the bias in). */
  grove_tensor in = h_rows(e.x, 0, 8);
  grove_prediction p;
  ck_assert_ok(grove_client_predict(c, "reload_mlp", &in, 1, 20000, &p, &err), &err);
  ck_assert_int_eq(p.version, 3);
  ck_assert(same_rows(p.outputs[0], e.yb, 0, 8));
  grove_prediction_fini(&p);
  grove_client_close(c);
  grove_sd_free(e.sd);
  ck_assert_int_eq(h_stop(&s), 0);
}
END_TEST

/* ============================================================ busy */

typedef struct bg_reload {
  const char *url, *ck;
  bool in_place;
  grove_status st;
  int64_t version, pause_us;
} bg_reload;

static void *bg_reload_main(void *arg) {
  bg_reload *b = arg;
  grove_client *c = h_connect(b->url);
  grove_reload_result res;
  grove_err err = {0};
  b->st = reload(c, b->ck, b->in_place, false, &res, &err);
  b->version = res.version;
  b->pause_us = (int64_t)res.pause_us;
  grove_reload_result_fini(&res);
  grove_client_close(c);
  return NULL;
}

static void *bg_predict_main(void *arg) {
  const char *url = arg;
  grove_client *c = h_connect(url);
  expected e;
  expected_load(&e);
  predict_check(c, &e, 0, 1);
  grove_sd_free(e.sd);
  grove_client_close(c);
  return NULL;
}

/* Waits (bounded) until groved runs a batch: one predict accepted, none
 * queued. */
static void wait_batch_running(grove_client *c) {
  grove_err err = {0};
  for (int i = 0; i < 1000; i++) {
    grove_server_status *st = NULL;
    ck_assert_ok(grove_client_status(c, 5000, &st, &err), &err);
    bool running = st->inflight == 1 && st->models[0].queue_depth == 0;
    grove_server_status_free(st);
    if (running) return;
    h_sleep_ms(5);
  }
  ck_abort_msg("no batch started");
}

START_TEST(reload_busy) {
  hserver s;
  const char *more[] = {"--test-batch-delay-ms", "1500", NULL};
  start_mlp(&s, NULL, more);
  grove_client *c = h_connect(s.tcp);
  /* A batch that sleeps 1.5 s holds an in-place reload in progress. */
  pthread_t pt, rt;
  ck_assert_int_eq(pthread_create(&pt, NULL, bg_predict_main, s.tcp), 0);
  wait_batch_running(c);
  bg_reload b = {.url = s.tcp, .ck = ckpt("b.safetensors"), .in_place = true};
  ck_assert_int_eq(pthread_create(&rt, NULL, bg_reload_main, &b), 0);
  ck_assert(h_wait_metric(&s, "grove_reload_in_progress{model=\"reload_mlp\"}", 1, 10) == 1);
  /* The model is paused now, or about to be: a second reload is refused
   * whatever its mode, and an export cannot start. */
  grove_reload_result res;
  grove_err err = {0};
  ck_assert_status(reload(c, ckpt("a.safetensors"), false, false, &res, &err), GROVE_E_UNAVAILABLE);
  ck_assert_msg(strstr(grove_err_msg(&err), "another reload"), "%s", grove_err_msg(&err));
  grove_reload_result_fini(&res);
  ck_assert_status(reload(c, NULL, true, false, &res, &err), GROVE_E_UNAVAILABLE);
  grove_reload_result_fini(&res);
  ck_assert(h_wait_metric(&s, "grove_reload_paused{model=\"reload_mlp\"}", 1, 10) == 1);
  Grove__ExportStateDictRequest q = GROVE__EXPORT_STATE_DICT_REQUEST__INIT;
  q.model = "reload_mlp";
  q.format = GROVE_CKPT_SAFETENSORS;
  q.length = 100;
  Grove__Request req = GROVE__REQUEST__INIT;
  req.body_case = GROVE__REQUEST__BODY_EXPORT_STATE_DICT;
  req.export_state_dict = &q;
  Grove__Reply *rep = h_raw(s.ipc, &req);
  ck_assert_ptr_nonnull(rep);
  ck_assert_int_eq(rep->status, GROVE_E_UNAVAILABLE);
  ck_assert_msg(strstr(rep->message, "in-place reload"), "%s", rep->message);
  grove__reply__free_unpacked(rep, NULL);
  pthread_join(pt, NULL);
  pthread_join(rt, NULL);
  ck_assert_status(b.st, GROVE_OK);
  ck_assert_int_eq(b.version, 2);
  ck_assert_int_gt(b.pause_us, 0);
  ck_assert(h_metric(&s, "grove_reloads_total{model=\"reload_mlp\",result=\"refused\"}") == 2);
  expected e;
  expected_load(&e);
  ck_assert_int_eq(predict_check(c, &e, 0, 2), 2);
  grove_sd_free(e.sd);
  grove_client_close(c);
  ck_assert_int_eq(h_stop(&s), 0);
}
END_TEST

/* SIGHUP with --reload-in-place while a batch holds the model: the reload
 * waits (paused); a second SIGHUP meanwhile is not lost but runs after it. */
START_TEST(reload_sighup_queued) {
  hserver s;
  /* 3 s: the second SIGHUP must come while the first reload still waits,
   * after a /metrics poll that a loaded machine can make slow. */
  const char *more[] = {"--test-batch-delay-ms", "3000", "--reload-in-place", NULL};
  start_mlp(&s, NULL, more);
  grove_client *c = h_connect(s.tcp);
  pthread_t pt;
  ck_assert_int_eq(pthread_create(&pt, NULL, bg_predict_main, s.tcp), 0);
  wait_batch_running(c);
  kill(s.pid, SIGHUP);
  ck_assert(h_wait_metric(&s, "grove_reload_paused{model=\"reload_mlp\"}", 1, 10) == 1);
  kill(s.pid, SIGHUP);
  ck_assert(h_wait_metric(&s, "grove_model_version{model=\"reload_mlp\"}", 3, 20) == 3);
  pthread_join(pt, NULL);
  ck_assert(h_log_contains(&s, "reload.queued: model reload_mlp"));
  ck_assert(h_log_contains(&s, "in place (paused"));
  ck_assert(h_wait_log(&s, ", again, ", 10));
  ck_assert(h_metric(&s, "grove_reload_pause_seconds_count{model=\"reload_mlp\"}") == 2);
  grove_client_close(c);
  ck_assert_int_eq(h_stop(&s), 0);
}
END_TEST

/* ============================================================ model_dir */

START_TEST(reload_model_dir) {
  hserver s;
  start_mlp(&s, NULL, NULL);
  grove_client *c = h_connect(s.ipc);
  grove_reload_result res;
  grove_err err = {0};
  grove_reload_opts o = {.model_dir = grove_fixture("reload_other")};
  ck_assert_ok(grove_client_reload(c, "reload_mlp", &o, 30000, &res, &err), &err);
  ck_assert_int_eq(res.version, 2);
  ck_assert_msg(strstr(res.dir, "reload_other"), "%s", res.dir);
  grove_reload_result_fini(&res);
  /* The other architecture answers now: 3 outputs per row. */
  char path[4096];
  snprintf(path, sizeof path, "%s/io.safetensors", grove_fixture("reload_other"));
  grove_state_dict *io = NULL;
  ck_assert_ok(grove_safetensors_read(path, &io, &err), &err);
  grove_tensor in = h_rows(grove_sd_get(io, "x"), 0, 4);
  grove_prediction p;
  ck_assert_ok(grove_client_predict(c, "reload_mlp", &in, 1, 10000, &p, &err), &err);
  ck_assert_int_eq(p.version, 2);
  ck_assert(same_rows(p.outputs[0], grove_sd_get(io, "y"), 0, 4));
  grove_prediction_fini(&p);
  grove_model_info *mi = NULL;
  ck_assert_ok(grove_client_model_info(c, "reload_mlp", 5000, &mi, &err), &err);
  ck_assert_msg(strstr(mi->dir, "reload_other"), "%s", mi->dir);
  ck_assert_int_eq(mi->outputs[0].shape[1], 3);
  grove_model_info_free(mi);
  /* A reload without arguments reads the new directory again. */
  ck_assert_ok(grove_client_reload(c, "reload_mlp", NULL, 30000, &res, &err), &err);
  ck_assert_int_eq(res.version, 3);
  ck_assert_msg(strstr(res.weights_path, "reload_other"), "%s", res.weights_path);
  grove_reload_result_fini(&res);
  grove_sd_free(io);
  grove_client_close(c);
  ck_assert_int_eq(h_stop(&s), 0);
}
END_TEST

/* ============================================================ SIGHUP, --watch */

/* A private copy of reload_mlp that the test may change. */
static void copy_model(const char *dst) {
  ck_assert_int_eq(mkdir(dst, 0755), 0);
  const char *files[] = {"model.json", "weights.safetensors", "io.safetensors"};
  for (int i = 0; i < 3; i++) {
    char a[4096], b[4096];
    snprintf(a, sizeof a, "%s/%s", grove_fixture("reload_mlp"), files[i]);
    snprintf(b, sizeof b, "%s/%s", dst, files[i]);
    ck_assert_int_eq(h_copy(a, b), 0);
  }
}

/* Replaces dir/weights.safetensors with src the way deployments do: written
 * to a temporary name, then renamed in. */
static void replace_weights(const char *dir, const char *src) {
  char tmp[4200], dst[4200];
  snprintf(tmp, sizeof tmp, "%s/.weights.tmp", dir);
  snprintf(dst, sizeof dst, "%s/weights.safetensors", dir);
  ck_assert_int_eq(h_copy(src, tmp), 0);
  ck_assert_int_eq(rename(tmp, dst), 0);
}

START_TEST(reload_sighup) {
  char dir[300];
  snprintf(dir, sizeof dir, "%s/m", grove_test_tmpdir());
  copy_model(dir);
  hserver s;
  start_mlp(&s, dir, NULL);
  expected e;
  expected_load(&e);
  replace_weights(dir, ckpt("b.safetensors"));
  kill(s.pid, SIGHUP);
  ck_assert(h_wait_metric(&s, "grove_model_version{model=\"reload_mlp\"}", 2, 20) == 2);
  grove_client *c = h_connect(s.tcp);
  ck_assert_int_eq(predict_check(c, &e, 0, 8), 2);
  /* A broken file: SIGHUP changes nothing, and says so. */
  replace_weights(dir, ckpt("shape.safetensors"));
  kill(s.pid, SIGHUP);
  ck_assert(
      h_wait_metric(&s, "grove_reloads_total{model=\"reload_mlp\",result=\"failed\"}", 1, 20) == 1);
  ck_assert_int_eq(predict_check(c, &e, 0, 8), 2);
  ck_assert(h_log_contains(&s, "reload.signal: SIGHUP"));
  grove_client_close(c);
  grove_sd_free(e.sd);
  ck_assert_int_eq(h_stop(&s), 0);
  h_rm_rf(dir);
  *strrchr(dir, '/') = 0;
  rmdir(dir);
}
END_TEST

START_TEST(reload_watch) {
  char dir[300];
  snprintf(dir, sizeof dir, "%s/m", grove_test_tmpdir());
  copy_model(dir);
  hserver s;
  const char *more[] = {"--watch", "--watch-debounce-ms", "50", NULL};
  start_mlp(&s, dir, more);
  expected e;
  expected_load(&e);
  /* A file the model does not use: no reload. */
  char other[400];
  snprintf(other, sizeof other, "%s/notes.txt", dir);
  ck_assert_int_eq(grove_test_write_file(other, "x", 1), 0);
  replace_weights(dir, ckpt("b.safetensors"));
  ck_assert(h_wait_metric(&s, "grove_model_version{model=\"reload_mlp\"}", 2, 20) == 2);
  grove_client *c = h_connect(s.tcp);
  ck_assert_int_eq(predict_check(c, &e, 0, 8), 2);
  replace_weights(dir, ckpt("a.safetensors"));
  ck_assert(h_wait_metric(&s, "grove_model_version{model=\"reload_mlp\"}", 3, 20) == 3);
  ck_assert_int_eq(predict_check(c, &e, 0, 8), 3);
  /* The non-persistent buffers' values (model.c, buffers.safetensors) are
   * part of the model too: replacing them reloads. */
  char bufs[400], btmp[400];
  snprintf(bufs, sizeof bufs, "%s/buffers.safetensors", dir);
  snprintf(btmp, sizeof btmp, "%s/.buffers.tmp", dir);
  ck_assert_int_eq(h_copy(ckpt("a.safetensors"), btmp), 0);
  ck_assert_int_eq(rename(btmp, bufs), 0);
  ck_assert(h_wait_metric(&s, "grove_model_version{model=\"reload_mlp\"}", 4, 20) == 4);
  ck_assert(h_log_contains(&s, ", watch, "));
  ck_assert(h_metric(&s, "grove_reloads_total{model=\"reload_mlp\",result=\"ok\"}") == 3);
  grove_client_close(c);
  grove_sd_free(e.sd);
  ck_assert_int_eq(h_stop(&s), 0);
  h_rm_rf(dir);
  *strrchr(dir, '/') = 0;
  rmdir(dir);
}
END_TEST

static Suite *reload_suite(void) {
  Suite *s = suite_create("reload");
  TCase *tc = tcase_create("reload");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, reload_basic);
  tcase_add_test(tc, reload_storm);
  tcase_add_test(tc, reload_refusals);
  tcase_add_test(tc, reload_busy);
  tcase_add_test(tc, reload_sighup_queued);
  tcase_add_test(tc, reload_model_dir);
  tcase_add_test(tc, reload_sighup);
  tcase_add_test(tc, reload_watch);
  suite_add_tcase(s, tc);
  return s;
}

GROVE_TEST_MAIN(reload_suite)
