/* check_optim.c: SGD, Adam and AdamW against torch.optim, their state_dict
 * files both ways, and whole training runs of a replica against torch.
 *
 * Fixtures (tests/fixtures_gen/training.py):
 *   train_optim_NAME: initial parameters, a gradient per step (some None),
 *     torch's parameters after each step, torch's optimizer state_dict
 *     before the last step and after it (.pt);
 *   train_run_NAME: a model.json and initial weights, the batches of a few
 *     steps with torch's loss at each, the state_dict after the last step
 *     and torch's optimizer state_dict.
 * Steps are compared within rtol 1e-4, atol 1e-5 (the brief's 1e-4); the
 * optimizers order their float32 operations as torch does, so in practice
 * they agree to a few ulps. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "grove/train.h"
#include "optim_internal.h"
#include "testutil.h"
#include "torch_craft.h"

#define RTOL 1e-4
#define ATOL 1e-5

static void expect_close(const char *what, const grove_tensor *got, const grove_tensor *want,
                         double rtol, double atol) {
  ck_assert_msg(grove_tensor_numel(got) == grove_tensor_numel(want), "%s: size", what);
  long bad =
      grove_test_allclose(got->data, want->data, (size_t)grove_tensor_numel(want), rtol, atol);
  ck_assert_msg(bad < 0, "%s: element %ld is %.9g, torch says %.9g", what, bad,
                bad < 0 ? 0.0 : ((const float *)got->data)[bad],
                bad < 0 ? 0.0 : ((const float *)want->data)[bad]);
}

/* ------------------------------------------------------------ configs */

static grove_optim_hparams hp_from(grove_optim_kind kind, const json_t *g) {
  grove_optim_hparams h = grove_optim_defaults(kind);
  const json_t *v;
  if ((v = json_object_get(g, "lr"))) h.lr = json_number_value(v);
  if ((v = json_object_get(g, "momentum"))) h.momentum = json_number_value(v);
  if ((v = json_object_get(g, "dampening"))) h.dampening = json_number_value(v);
  if ((v = json_object_get(g, "weight_decay"))) h.weight_decay = json_number_value(v);
  if ((v = json_object_get(g, "eps"))) h.eps = json_number_value(v);
  if ((v = json_object_get(g, "nesterov"))) h.nesterov = json_is_true(v);
  if ((v = json_object_get(g, "amsgrad"))) h.amsgrad = json_is_true(v);
  if ((v = json_object_get(g, "maximize"))) h.maximize = json_is_true(v);
  if ((v = json_object_get(g, "betas"))) {
    h.beta1 = json_number_value(json_array_get(v, 0));
    h.beta2 = json_number_value(json_array_get(v, 1));
  }
  return h;
}

static grove_optim *make_optim(const json_t *cfg, grove_tensor **params) {
  grove_optim_kind kind;
  ck_assert(grove_optim_kind_from_name(json_string_value(json_object_get(cfg, "kind")), &kind));
  const json_t *gs = json_object_get(cfg, "groups");
  size_t ng = json_array_size(gs);
  grove_param_group groups[4];
  size_t idx[4][8];
  for (size_t g = 0; g < ng; g++) {
    const json_t *gj = json_array_get(gs, g), *ps = json_object_get(gj, "params");
    groups[g].h = hp_from(kind, gj);
    groups[g].nparams = json_array_size(ps);
    for (size_t k = 0; k < groups[g].nparams; k++)
      idx[g][k] = (size_t)json_integer_value(json_array_get(ps, k));
    groups[g].params = idx[g];
  }
  grove_optim *o = NULL;
  grove_err err = {0};
  size_t np = (size_t)json_integer_value(json_object_get(cfg, "nparams"));
  ck_assert_ok(grove_optim_new(kind, params, np, groups, ng, NULL, &o, &err), &err);
  return o;
}

static void expect_same_state(const char *what, const grove_optim *a, const grove_optim *b,
                              double rtol, double atol) {
  ck_assert_uint_eq(a->nparams, b->nparams);
  ck_assert_uint_eq(a->norder, b->norder);
  for (size_t k = 0; k < a->norder; k++) ck_assert_uint_eq(a->order[k], b->order[k]);
  for (size_t g = 0; g < a->ngroups; g++) {
    const grove_optim_hparams *x = &a->groups[g].h, *y = &b->groups[g].h;
    ck_assert(x->lr == y->lr && x->weight_decay == y->weight_decay && x->momentum == y->momentum &&
              x->dampening == y->dampening && x->nesterov == y->nesterov &&
              x->maximize == y->maximize && x->amsgrad == y->amsgrad);
    if (a->kind != GROVE_OPTIM_SGD)
      ck_assert(x->beta1 == y->beta1 && x->beta2 == y->beta2 && x->eps == y->eps);
  }
  for (size_t i = 0; i < a->nparams; i++) {
    const grove__pstate *s = &a->state[i], *t = &b->state[i];
    ck_assert_msg(s->has == t->has, "%s: parameter %zu: state present %d vs %d", what, i, s->has,
                  t->has);
    ck_assert(s->step == t->step);
    ck_assert(!s->buf == !t->buf && !s->sq == !t->sq && !s->maxsq == !t->maxsq);
    char w[160];
    snprintf(w, sizeof w, "%s: parameter %zu buffer", what, i);
    if (s->buf) expect_close(w, s->buf, t->buf, rtol, atol);
    if (s->sq) expect_close(w, s->sq, t->sq, rtol, atol);
    if (s->maxsq) expect_close(w, s->maxsq, t->maxsq, rtol, atol);
  }
}

/* ------------------------------------------------------------ optimizer parity */

static const char *const optim_cases[] = {
    "sgd",   "sgd_momentum", "sgd_nesterov",   "sgd_maximize", "adam", "adam_wd_amsgrad",
    "adamw", "adamw_groups", "adamw_maximize",
};
#define NOPTIM ((int)(sizeof optim_cases / sizeof optim_cases[0]))

static grove_tensor *clone_of(const grove_state_dict *sd, const char *key) {
  grove_err err = {0};
  const grove_tensor *t = grove_sd_get(sd, key);
  ck_assert_msg(t != NULL, "fixture has no %s", key);
  grove_tensor *c = grove_tensor_clone(t, GROVE_F32, &err);
  ck_assert_ok(c ? GROVE_OK : GROVE_E_NOMEM, &err);
  return c;
}

START_TEST(test_optim_parity) {
  const char *name = optim_cases[_i];
  char p[256];
  grove_err err = {0};
  grove_state_dict *sd = NULL;
  snprintf(p, sizeof p, "train_optim_%s.safetensors", name);
  ck_assert_ok(grove_safetensors_read(grove_fixture(p), &sd, &err), &err);
  snprintf(p, sizeof p, "train_optim_%s.json", name);
  json_error_t je;
  json_t *cfg = json_load_file(grove_fixture(p), 0, &je);
  ck_assert_msg(cfg != NULL, "%s", je.text);
  const size_t np = (size_t)json_integer_value(json_object_get(cfg, "nparams"));
  const int steps = (int)json_integer_value(json_object_get(cfg, "steps"));
  grove_tensor *params[8], *grads[8];
  char k[64];
  for (size_t i = 0; i < np; i++) {
    snprintf(k, sizeof k, "p.%zu", i);
    params[i] = clone_of(sd, k);
  }
  grove_optim *o = make_optim(cfg, params);
  for (int s = 0; s < steps; s++) {
    for (size_t i = 0; i < np; i++) {
      snprintf(k, sizeof k, "g.%d.%zu", s, i);
      grads[i] = grove_sd_get(sd, k);
    }
    ck_assert_ok(grove_optim_step(o, grads, &err), &err);
    for (size_t i = 0; i < np; i++) {
      snprintf(k, sizeof k, "p.%d.%zu", s, i);
      char what[128];
      snprintf(what, sizeof what, "%s: step %d parameter %zu", name, s, i);
      expect_close(what, params[i], grove_sd_get(sd, k), RTOL, ATOL);
    }
  }

  /* torch's final state_dict loads into a fresh optimizer as ours. */
  grove_tensor *p2[8];
  for (size_t i = 0; i < np; i++) {
    snprintf(k, sizeof k, "p.%zu", i);
    p2[i] = clone_of(sd, k);
  }
  grove_optim *o2 = make_optim(cfg, p2);
  snprintf(p, sizeof p, "train_optim_%s_final.pt", name);
  ck_assert_ok(grove_optim_load(o2, grove_fixture(p), &err), &err);
  expect_same_state(name, o, o2, 1e-6, 1e-7);

  /* Ours round-trips bit for bit. */
  char path[600];
  snprintf(path, sizeof path, "%s/%s.pt", grove_test_tmpdir(), name);
  ck_assert_ok(grove_optim_save(o, path, &err), &err);
  grove_optim *o3 = make_optim(cfg, p2);
  ck_assert_ok(grove_optim_load(o3, path, &err), &err);
  expect_same_state(name, o, o3, 0, 0);
  grove_optim_free(o3);
  remove(path);

  /* torch's state before the last step, then our last step, is torch's. */
  for (size_t i = 0; i < np; i++) {
    if (steps >= 2)
      snprintf(k, sizeof k, "p.%d.%zu", steps - 2, i);
    else
      snprintf(k, sizeof k, "p.%zu", i);
    memcpy(p2[i]->data, grove_sd_get(sd, k)->data, grove_tensor_nbytes(p2[i]));
  }
  grove_optim *o4 = make_optim(cfg, p2);
  snprintf(p, sizeof p, "train_optim_%s.pt", name);
  ck_assert_ok(grove_optim_load(o4, grove_fixture(p), &err), &err);
  for (size_t i = 0; i < np; i++) {
    snprintf(k, sizeof k, "g.%d.%zu", steps - 1, i);
    grads[i] = grove_sd_get(sd, k);
  }
  ck_assert_ok(grove_optim_step(o4, grads, &err), &err);
  for (size_t i = 0; i < np; i++) {
    snprintf(k, sizeof k, "p.%d.%zu", steps - 1, i);
    char what[128];
    snprintf(what, sizeof what, "%s: last step after load, parameter %zu", name, i);
    expect_close(what, p2[i], grove_sd_get(sd, k), RTOL, ATOL);
  }
  grove_optim_free(o4);
  grove_optim_free(o2);
  grove_optim_free(o);
  for (size_t i = 0; i < np; i++) {
    grove_tensor_release(params[i]);
    grove_tensor_release(p2[i]);
  }
  json_decref(cfg);
  grove_sd_free(sd);
}
END_TEST

/* torch.load reads what Grove saves, equal to what torch itself saved (a
 * group's keys in any order: torch puts the ones its caller named first).
 * Needs a python3 with torch (scripts/torch-python.sh).  weights_only=False:
 * torch 1.13's weights-only unpickler has no BINFLOAT, so it refuses every
 * optimizer state_dict, torch's own included (newer torch reads them). */
/* An SGD state_dict written by hand whose momentum buffer is a view with
 * the given offset, shape and strides: {'state': {0: {'momentum_buffer':
 * tensor}}, 'param_groups': [{'params': [0]}]}, storage of 5 floats. */
static void write_sgd_view(const char *path, int64_t offset, int nd, const int64_t *shape,
                           const int64_t *stride) {
  bytes b = {0};
  b_op(&b, 0x80);
  b_op(&b, 2);
  b_op(&b, '}');
  b_op(&b, '(');
  b_str(&b, "state");
  b_op(&b, '}');
  b_op(&b, '(');
  b_int(&b, 0);
  b_op(&b, '}');
  b_op(&b, '(');
  b_str(&b, "momentum_buffer");
  b_tensor(&b, "FloatStorage", "0", 5, offset, nd, shape, stride);
  b_op(&b, 'u');
  b_op(&b, 'u');
  b_str(&b, "param_groups");
  b_op(&b, ']');
  b_op(&b, '(');
  b_op(&b, '}');
  b_op(&b, '(');
  b_str(&b, "params");
  b_op(&b, ']');
  b_op(&b, '(');
  b_int(&b, 0);
  b_op(&b, 'e');
  b_op(&b, 'u');
  b_op(&b, 'e');
  b_op(&b, 'u');
  b_op(&b, '.');
  float data[5] = {1, 2, 3, 4, 5};
  rec recs[3] = {{"archive/data.pkl", b.p, b.n},
                 {"archive/data/0", data, sizeof data},
                 {"archive/version", "3\n", 2}};
  size_t len;
  uint8_t *zip = make_zip(recs, 3, NULL, &len);
  FILE *f = fopen(path, "wb");
  ck_assert_ptr_nonnull(f);
  ck_assert_uint_eq(fwrite(zip, 1, len, f), len);
  ck_assert_int_eq(fclose(f), 0);
  free(zip);
  b_free(&b);
}

/* Optimizer files (grove train start --resume) whose momentum buffer's
 * last index is 2^64 - 1: grove_tensor_view_new's "+ 1" wrapped to 0 and
 * the copy read outside the storage (groved segfaulted).  Refused, naming
 * the file and the key, the optimizer untouched. */
START_TEST(test_optim_view_bounds_wrap) {
  grove_err err = {0};
  int64_t sh[1] = {5};
  grove_tensor *p = grove_tensor_new(GROVE_F32, 1, sh, &err);
  grove_optim_hparams h = grove_optim_defaults(GROVE_OPTIM_SGD);
  h.lr = 0.1;
  h.momentum = 0.9;
  grove_optim *o = NULL;
  ck_assert_ok(grove_optim_new(GROVE_OPTIM_SGD, &p, 1, NULL, 0, &h, &o, &err), &err);
  char path[600];
  snprintf(path, sizeof path, "%s/wrap.pt", grove_test_tmpdir());
  /* The sane file loads: the harness builds what the reader accepts. */
  write_sgd_view(path, 0, 1, sh, (int64_t[]){1});
  ck_assert_ok(grove_optim_load(o, path, &err), &err);
  ck_assert(((const float *)o->state[0].buf->data)[4] == 5.0f);
  grove_optim_free(o);
  o = NULL;
  ck_assert_ok(grove_optim_new(GROVE_OPTIM_SGD, &p, 1, NULL, 0, &h, &o, &err), &err);
  /* Last index 2^64 - 1 without the offset (2 * (2^63 - 1) + 1), with it
   * (the bias: shape [5], offset 3, stride 2^62 - 1), and an
   * offset whose byte count overflows. */
  struct {
    int64_t offset;
    int nd;
    int64_t shape[2], stride[2];
  } cases[] = {{0, 2, {3, 2}, {INT64_MAX, 1}},
               {3, 1, {5}, {(INT64_C(1) << 62) - 1}},
               {INT64_MAX / 2, 1, {1}, {1}}};
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    write_sgd_view(path, cases[c].offset, cases[c].nd, cases[c].shape, cases[c].stride);
    ck_assert_status(grove_optim_load(o, path, &err), GROVE_E_BAD_OFFSETS);
    ck_assert_msg(strstr(err.msg, path) && strstr(err.msg, "momentum_buffer"), "%s", err.msg);
    ck_assert_ptr_null(o->state[0].buf);
  }
  unlink(path);
  grove_optim_free(o);
  grove_tensor_release(p);
}
END_TEST

START_TEST(test_torch_reads_ours) {
  FILE *pf = popen("scripts/torch-python.sh 2>/dev/null", "r");
  char py[512] = "";
  if (!pf || !fgets(py, sizeof py, pf)) {
    if (pf) pclose(pf);
    fprintf(stderr, "check_optim: no python3 with torch; torch.load of Grove's files not tested\n");
    return;
  }
  pclose(pf);
  py[strcspn(py, "\n")] = '\0';
  const char *dir = grove_test_tmpdir();
  grove_err err = {0};
  /* Grove's final state for each case, beside torch's. */
  for (int c = 0; c < NOPTIM; c++) {
    char p[256], out[700];
    snprintf(p, sizeof p, "train_optim_%s.json", optim_cases[c]);
    json_error_t je;
    json_t *cfg = json_load_file(grove_fixture(p), 0, &je);
    ck_assert(cfg != NULL);
    grove_state_dict *sd = NULL;
    snprintf(p, sizeof p, "train_optim_%s.safetensors", optim_cases[c]);
    ck_assert_ok(grove_safetensors_read(grove_fixture(p), &sd, &err), &err);
    size_t np = (size_t)json_integer_value(json_object_get(cfg, "nparams"));
    int steps = (int)json_integer_value(json_object_get(cfg, "steps"));
    grove_tensor *params[8], *grads[8];
    char k[64];
    for (size_t i = 0; i < np; i++) {
      snprintf(k, sizeof k, "p.%zu", i);
      params[i] = clone_of(sd, k);
    }
    grove_optim *o = make_optim(cfg, params);
    for (int s = 0; s < steps; s++) {
      for (size_t i = 0; i < np; i++) {
        snprintf(k, sizeof k, "g.%d.%zu", s, i);
        grads[i] = grove_sd_get(sd, k);
      }
      ck_assert_ok(grove_optim_step(o, grads, &err), &err);
    }
    snprintf(out, sizeof out, "%s/%s.pt", dir, optim_cases[c]);
    ck_assert_ok(grove_optim_save(o, out, &err), &err);
    grove_optim_free(o);
    for (size_t i = 0; i < np; i++) grove_tensor_release(params[i]);
    grove_sd_free(sd);
    json_decref(cfg);
  }
  char script[600], cmd[2400];
  snprintf(script, sizeof script, "%s/cmp.py", dir);
  const char *src =
      "import sys, torch\n"
      "def same(a, b, path):\n"
      "    if isinstance(a, torch.Tensor):\n"
      "        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape, "
      "path\n"
      "        assert torch.allclose(a, b, rtol=1e-5, atol=1e-7), path\n"
      "    elif isinstance(a, dict):\n"
      "        assert isinstance(b, dict) and set(a) == set(b), (path, list(a), list(b))\n"
      "        for k in a: same(a[k], b[k], f'{path}[{k!r}]')\n"
      "    elif isinstance(a, (list, tuple)):\n"
      "        assert type(a) == type(b) and len(a) == len(b), path\n"
      "        for i, (x, y) in enumerate(zip(a, b)): same(x, y, f'{path}[{i}]')\n"
      "    else:\n"
      "        assert a == b, (path, a, b)\n"
      "fx, out = sys.argv[1], sys.argv[2]\n"
      "for name in sys.argv[3:]:\n"
      "    ours = torch.load(f'{out}/{name}.pt', weights_only=False)\n"
      "    theirs = torch.load(f'{fx}/train_optim_{name}_final.pt', weights_only=False)\n"
      "    same(ours, theirs, name)\n"
      "    assert list(ours['state']) == list(theirs['state']), name\n";
  ck_assert_int_eq(grove_test_write_file(script, src, strlen(src)), 0);
  char fxdir[512];
  snprintf(fxdir, sizeof fxdir, "%s", grove_fixture(""));
  int n = snprintf(cmd, sizeof cmd, "'%s' '%s' '%s' '%s'", py, script, fxdir, dir);
  for (int c = 0; c < NOPTIM; c++)
    n += snprintf(cmd + n, sizeof cmd - (size_t)n, " %s", optim_cases[c]);
  ck_assert_msg(system(cmd) == 0, "torch did not read Grove's optimizer files as its own: %s", cmd);
}
END_TEST

START_TEST(test_optim_errors) {
  grove_err err = {0};
  int64_t sh[1] = {3};
  grove_tensor *p[2] = {grove_tensor_new(GROVE_F32, 1, sh, &err),
                        grove_tensor_new(GROVE_F32, 1, sh, &err)};
  grove_optim *o = NULL;
  grove_optim_hparams h = grove_optim_defaults(GROVE_OPTIM_SGD);
  h.lr = -1;
  ck_assert_status(grove_optim_new(GROVE_OPTIM_SGD, p, 2, NULL, 0, &h, &o, &err),
                   GROVE_E_INVALID_ARGUMENT);
  ck_assert_msg(strstr(err.msg, "Invalid learning rate") != NULL, "%s", err.msg);
  h.lr = 0.1;
  h.nesterov = true;
  ck_assert_status(grove_optim_new(GROVE_OPTIM_SGD, p, 2, NULL, 0, &h, &o, &err),
                   GROVE_E_INVALID_ARGUMENT);
  ck_assert_msg(strstr(err.msg, "Nesterov") != NULL, "%s", err.msg);
  grove_optim_hparams a = grove_optim_defaults(GROVE_OPTIM_ADAM);
  a.beta2 = 1.0;
  ck_assert_status(grove_optim_new(GROVE_OPTIM_ADAM, p, 2, NULL, 0, &a, &o, &err),
                   GROVE_E_INVALID_ARGUMENT);
  ck_assert_msg(strstr(err.msg, "beta parameter at index 1") != NULL, "%s", err.msg);
  a = grove_optim_defaults(GROVE_OPTIM_ADAMW);
  ck_assert(a.weight_decay == 1e-2 && a.lr == 1e-3 && a.eps == 1e-8);
  size_t g0[2] = {0, 1}, g1[1] = {1}, g2[1] = {5};
  grove_param_group gs[2] = {{.h = a, .params = g0, .nparams = 2},
                             {.h = a, .params = g1, .nparams = 1}};
  ck_assert_status(grove_optim_new(GROVE_OPTIM_ADAMW, p, 2, gs, 2, NULL, &o, &err),
                   GROVE_E_INVALID_ARGUMENT);
  ck_assert_msg(strstr(err.msg, "more than one parameter group") != NULL, "%s", err.msg);
  gs[1].params = g2;
  gs[0].nparams = 1;
  ck_assert_status(grove_optim_new(GROVE_OPTIM_ADAMW, p, 2, gs, 2, NULL, &o, &err),
                   GROVE_E_INVALID_ARGUMENT);
  ck_assert_ptr_null(o);

  /* A parameter in no group is never updated; a bad gradient changes nothing. */
  gs[1].params = g1;
  gs[0].h.lr = 0.5;
  gs[1].h.lr = 0.5;
  ck_assert_ok(grove_optim_new(GROVE_OPTIM_ADAMW, p, 2, gs, 1, NULL, &o, &err), &err);
  ck_assert_uint_eq(grove_optim_num_groups(o), 1);
  ck_assert_ptr_null(grove_optim_group(o, 1));
  grove_optim_group(o, 0)->lr = 0.25; /* a scheduler's change */
  int64_t sh2[1] = {4};
  grove_tensor *gbad = grove_tensor_new(GROVE_F32, 1, sh2, &err),
               *gok = grove_tensor_new(GROVE_F32, 1, sh, &err);
  ((float *)gok->data)[0] = 1.0f;
  grove_tensor *grads[2] = {gbad, gok};
  ck_assert_status(grove_optim_step(o, grads, &err), GROVE_E_SHAPE);
  ck_assert(((float *)p[0]->data)[0] == 0.0f);
  grads[0] = gok;
  ck_assert_ok(grove_optim_step(o, grads, &err), &err);
  ck_assert(((float *)p[0]->data)[0] != 0.0f);
  ck_assert(((float *)p[1]->data)[0] == 0.0f);

  /* Loading: wrong group count or size, another optimizer's state, no file. */
  const char *dir = grove_test_tmpdir();
  char path[600];
  snprintf(path, sizeof path, "%s/o.pt", dir);
  ck_assert_ok(grove_optim_save(o, path, &err), &err);
  grove_optim *o2 = NULL;
  ck_assert_ok(grove_optim_new(GROVE_OPTIM_ADAMW, p, 2, NULL, 0, NULL, &o2, &err), &err);
  ck_assert_status(grove_optim_load(o2, path, &err), GROVE_E_STATE_DICT);
  ck_assert_msg(strstr(err.msg, "doesn't match the size of optimizer's group") != NULL, "%s",
                err.msg);
  grove_optim_free(o2);
  ck_assert_ok(grove_optim_new(GROVE_OPTIM_ADAMW, p, 2, gs, 2, NULL, &o2, &err), &err);
  ck_assert_status(grove_optim_load(o2, path, &err), GROVE_E_STATE_DICT);
  ck_assert_msg(strstr(err.msg, "different number of parameter groups") != NULL, "%s", err.msg);
  grove_optim_free(o2);
  grove_optim_hparams sg = grove_optim_defaults(GROVE_OPTIM_SGD);
  sg.lr = 0.1;
  ck_assert_ok(grove_optim_new(GROVE_OPTIM_SGD, p, 2, NULL, 0, &sg, &o2, &err), &err);
  ck_assert_ok(grove_optim_step(o2, grads, &err), &err);
  char spath[600];
  snprintf(spath, sizeof spath, "%s/sgd.pt", dir);
  ck_assert_ok(grove_optim_save(o2, spath, &err), &err);
  grove_optim *o3 = NULL;
  ck_assert_ok(grove_optim_new(GROVE_OPTIM_ADAM, p, 2, NULL, 0, NULL, &o3, &err), &err);
  ck_assert_status(grove_optim_load(o3, spath, &err), GROVE_E_FORMAT);
  grove_optim_free(o3);
  snprintf(spath, sizeof spath, "%s/none.pt", dir);
  ck_assert_status(grove_optim_load(o2, spath, &err), GROVE_E_IO);
  ck_assert_ptr_eq(o2->state[0].buf, NULL);
  grove_optim_free(o2);
  grove_optim_free(o);
  grove_tensor_release(gbad);
  grove_tensor_release(gok);
  grove_tensor_release(p[0]);
  grove_tensor_release(p[1]);
  remove(path);
}
END_TEST

/* ------------------------------------------------------------ training runs */

typedef struct run_case {
  const char *name;
  grove_optim_kind kind;
  bool two_groups;
  int steps;
} run_case;

/* Mirrors RUNS in training.py. */
static const run_case run_cases[] = {
    {"sgd_mlp", GROVE_OPTIM_SGD, false, 5},
    {"adamw_mlp", GROVE_OPTIM_ADAMW, true, 5},
    {"sgd_cnn", GROVE_OPTIM_SGD, false, 4},
};
#define NRUNS ((int)(sizeof run_cases / sizeof run_cases[0]))

START_TEST(test_run_parity) {
  const run_case *rc = &run_cases[_i];
  char p[256];
  grove_err err = {0};
  grove_state_dict *sd = NULL;
  snprintf(p, sizeof p, "train_run_%s.safetensors", rc->name);
  ck_assert_ok(grove_safetensors_read(grove_fixture(p), &sd, &err), &err);
  snprintf(p, sizeof p, "train_run_%s.json", rc->name);
  char *json = grove_test_read_file(grove_fixture(p), NULL);
  ck_assert(json != NULL);
  grove_state_dict *w = grove_sd_new();
  for (size_t i = 0; i < grove_sd_count(sd); i++)
    if (strncmp(grove_sd_key(sd, i), "w.", 2) == 0)
      ck_assert_ok(grove_sd_set(w, grove_sd_key(sd, i) + 2, grove_sd_tensor(sd, i), &err), &err);
  grove_replica *r = NULL;
  ck_assert_ok(grove_replica_new(json, rc->name, w, NULL, &r, &err), &err);
  const size_t np = grove_replica_num_params(r);
  grove_tensor **params = malloc(np * sizeof *params);
  size_t *wi = malloc(np * sizeof *wi), *oi = malloc(np * sizeof *oi), nw = 0, no = 0;
  for (size_t i = 0; i < np; i++) {
    params[i] = grove_replica_param(r, i);
    if (params[i]->ndim > 1)
      wi[nw++] = i;
    else
      oi[no++] = i;
  }
  grove_optim *o = NULL;
  if (rc->two_groups) {
    /* training.py's _two_groups. */
    grove_optim_hparams a = grove_optim_defaults(GROVE_OPTIM_ADAMW), b = a;
    a.lr = 3e-3, a.weight_decay = 0.05, a.beta2 = 0.99;
    b.lr = 1e-2, b.weight_decay = 0.0, b.beta2 = 0.99;
    grove_param_group gs[2] = {{a, wi, nw}, {b, oi, no}};
    ck_assert_ok(grove_optim_new(rc->kind, params, np, gs, 2, NULL, &o, &err), &err);
  } else {
    grove_optim_hparams h = grove_optim_defaults(GROVE_OPTIM_SGD);
    h.lr = 0.05, h.momentum = 0.9;
    h.weight_decay = strcmp(rc->name, "sgd_mlp") == 0 ? 1e-3 : 0.0;
    ck_assert_ok(grove_optim_new(rc->kind, params, np, NULL, 0, &h, &o, &err), &err);
  }
  grove_loss l = grove_loss_default(GROVE_LOSS_CROSS_ENTROPY);
  for (int s = 0; s < rc->steps; s++) {
    char kx[32], kt[32], kl[32];
    snprintf(kx, sizeof kx, "x.%d", s);
    snprintf(kt, sizeof kt, "t.%d", s);
    snprintf(kl, sizeof kl, "loss.%d", s);
    double loss, norm;
    ck_assert_ok(grove_replica_train_step(r, o, &l, grove_sd_get(sd, kx), 1, grove_sd_get(sd, kt),
                                          &loss, &norm, &err),
                 &err);
    const double want = *(const float *)grove_sd_get(sd, kl)->data;
    ck_assert_msg(fabs(loss - want) <= 1e-4 * fabs(want) + 1e-5,
                  "%s: step %d loss %.8g, torch %.8g", rc->name, s, loss, want);
  }
  grove_state_dict *now = grove_sd_new();
  ck_assert_ok(grove_module_state_dict(grove_replica_root(r), "", now, &err), &err);
  for (size_t i = 0; i < grove_sd_count(now); i++) {
    char k[300];
    snprintf(k, sizeof k, "final.%s", grove_sd_key(now, i));
    const grove_tensor *want = grove_sd_get(sd, k), *got = grove_sd_tensor(now, i);
    ck_assert_msg(want != NULL, "no %s", k);
    if (got->dtype == GROVE_I64) {
      ck_assert(*(int64_t *)got->data == *(int64_t *)want->data);
      continue;
    }
    char what[400];
    snprintf(what, sizeof what, "%s: %s after %d steps", rc->name, grove_sd_key(now, i), rc->steps);
    expect_close(what, got, want, RTOL, ATOL);
  }
  /* torch's optimizer state after the run is ours. */
  grove_optim *o2 = NULL;
  grove_tensor **copies = malloc(np * sizeof *copies);
  for (size_t i = 0; i < np; i++) copies[i] = grove_tensor_clone(params[i], GROVE_F32, &err);
  if (rc->two_groups) {
    grove_param_group gs[2] = {{o->groups[0].h, wi, nw}, {o->groups[1].h, oi, no}};
    ck_assert_ok(grove_optim_new(rc->kind, copies, np, gs, 2, NULL, &o2, &err), &err);
  } else {
    ck_assert_ok(grove_optim_new(rc->kind, copies, np, NULL, 0, &o->groups[0].h, &o2, &err), &err);
  }
  snprintf(p, sizeof p, "train_run_%s_optim.pt", rc->name);
  ck_assert_ok(grove_optim_load(o2, grove_fixture(p), &err), &err);
  expect_same_state(rc->name, o, o2, 1e-3, 1e-5);
  grove_optim_free(o2);
  for (size_t i = 0; i < np; i++) grove_tensor_release(copies[i]);
  free(copies);
  grove_sd_free(now);
  grove_optim_free(o);
  free(params);
  free(wi);
  free(oi);
  grove_replica_free(r);
  grove_sd_free(w);
  free(json);
  grove_sd_free(sd);
}
END_TEST

static Suite *optim_suite(void) {
  Suite *s = suite_create("optim");
  TCase *tc = tcase_create("parity");
  tcase_add_loop_test(tc, test_optim_parity, 0, NOPTIM);
  tcase_add_loop_test(tc, test_run_parity, 0, NRUNS);
  tcase_add_test(tc, test_optim_errors);
  tcase_add_test(tc, test_optim_view_bounds_wrap);
  tcase_add_test(tc, test_torch_reads_ours);
  tcase_set_timeout(tc, 120);
  suite_add_tcase(s, tc);
  return s;
}

GROVE_TEST_MAIN(optim_suite)
