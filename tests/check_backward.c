/* check_backward.c: the training replica's train-mode forward and backward
 * against torch autograd, the losses, Dropout's generator, zero_grad and
 * the replica's errors.
 *
 * Parity: tests/fixtures_gen/training.py writes, per case, the model.json
 * and the state_dict before the forward, the inputs, an upstream gradient,
 * torch's train-mode output, the input and parameter gradients, and the
 * state_dict after the forward (BatchNorm's running statistics).  Each case
 * builds a replica from them, runs forward and backward and compares
 * everything (rtol 1e-4, atol 1e-5; the few looser cases say why). */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grove/train.h"
#include "testutil.h"

#define RTOL 1e-4
#define ATOL 1e-5

/* ------------------------------------------------------------ helpers */

static void expect_close(const char *what, const grove_tensor *got, const grove_tensor *want,
                         double rtol, double atol) {
  ck_assert_msg(got->dtype == GROVE_F32 && want->dtype == GROVE_F32, "%s: dtype", what);
  ck_assert_msg(grove_tensor_numel(got) == grove_tensor_numel(want), "%s: %lld elements, want %lld",
                what, (long long)grove_tensor_numel(got), (long long)grove_tensor_numel(want));
  long bad =
      grove_test_allclose(got->data, want->data, (size_t)grove_tensor_numel(want), rtol, atol);
  ck_assert_msg(bad < 0, "%s: element %ld is %.8g, torch says %.8g", what, bad,
                bad < 0 ? 0.0 : ((const float *)got->data)[bad],
                bad < 0 ? 0.0 : ((const float *)want->data)[bad]);
}

typedef struct fx {
  grove_state_dict *file;
  grove_state_dict *weights; /* the w.* entries, prefix removed */
  char *json;
} fx;

static void fx_load(fx *f, const char *prefix, const char *name) {
  grove_err err = {0};
  char p[256];
  snprintf(p, sizeof p, "%s%s.safetensors", prefix, name);
  ck_assert_ok(grove_safetensors_read(grove_fixture(p), &f->file, &err), &err);
  f->weights = grove_sd_new();
  for (size_t i = 0; i < grove_sd_count(f->file); i++) {
    const char *k = grove_sd_key(f->file, i);
    if (strncmp(k, "w.", 2) == 0)
      ck_assert_ok(grove_sd_set(f->weights, k + 2, grove_sd_tensor(f->file, i), &err), &err);
  }
  snprintf(p, sizeof p, "%s%s.json", prefix, name);
  f->json = grove_test_read_file(grove_fixture(p), NULL);
  ck_assert_msg(f->json != NULL, "cannot read %s", grove_fixture(p));
}

static void fx_free(fx *f) {
  grove_sd_free(f->file);
  grove_sd_free(f->weights);
  free(f->json);
}

static grove_tensor *get(const fx *f, const char *key) {
  return grove_sd_get(f->file, key);
}

/* ------------------------------------------------------------ layer parity */

typedef struct grad_case {
  const char *name;
  double rtol, atol;
} grad_case;

/* Mirrors GRAD_CASES in training.py. */
static const grad_case grad_cases[] = {
    {"linear", RTOL, ATOL},
    {"linear_3d", RTOL, ATOL},
    {"linear_nobias", RTOL, ATOL},
    {"relu", RTOL, ATOL},
    {"leaky_relu", RTOL, ATOL},
    {"gelu", RTOL, ATOL},
    {"gelu_tanh", RTOL, ATOL},
    {"silu", RTOL, ATOL},
    {"sigmoid", RTOL, ATOL},
    {"tanh", RTOL, ATOL},
    {"softmax", RTOL, ATOL},
    {"softmax_mid", RTOL, ATOL},
    {"log_softmax", RTOL, ATOL},
    {"log_softmax_mid", RTOL, ATOL},
    {"identity_flatten", RTOL, ATOL},
    {"dropout_p0", RTOL, ATOL},
    {"dropout_p1", RTOL, ATOL},
    {"bn1d", RTOL, ATOL},
    {"bn1d_3d", RTOL, ATOL},
    {"bn1d_noaffine", RTOL, ATOL},
    {"bn1d_cumulative", RTOL, ATOL},
    {"bn1d_nostats", RTOL, ATOL},
    {"bn2d", RTOL, ATOL},
    {"ln", RTOL, ATOL},
    {"ln_2", RTOL, ATOL},
    {"ln_noaffine", RTOL, ATOL},
    {"embedding", RTOL, ATOL},
    {"embedding_pad", RTOL, ATOL},
    {"embedding_freq", RTOL, ATOL},
    {"tied", RTOL, ATOL},
    {"mlp", RTOL, ATOL},
    {"conv2d", RTOL, ATOL},
    {"conv2d_pad_stride", RTOL, ATOL},
    {"conv2d_dil_groups", RTOL, ATOL},
    {"conv2d_same", RTOL, ATOL},
    {"conv1d", RTOL, ATOL},
    {"conv1d_groups", RTOL, ATOL},
    {"maxpool", RTOL, ATOL},
    {"maxpool_pad", RTOL, ATOL},
    {"maxpool_dil", RTOL, ATOL},
    {"avgpool", RTOL, ATOL},
    {"avgpool_pad", RTOL, ATOL},
    {"avgpool_div", RTOL, ATOL},
    {"adaptive", RTOL, ATOL},
    {"cnn", RTOL, ATOL},
    {"mha", RTOL, ATOL},
    {"mha_bf", RTOL, ATOL},
    {"tel", RTOL, ATOL},
    {"tel_gelu_nf", RTOL, ATOL},
    {"te", RTOL, ATOL},
    /* Graphs (graphs.py's models). */
    {"graph_add_tensor", RTOL, ATOL},
    {"graph_add_broadcast", RTOL, ATOL},
    {"graph_sub_scalar", RTOL, ATOL},
    {"graph_mul_div", RTOL, ATOL},
    {"graph_matmul", RTOL, ATOL},
    {"graph_activations", RTOL, ATOL},
    {"graph_softmax", RTOL, ATOL},
    {"graph_reshape_view", RTOL, ATOL},
    {"graph_permute_transpose", RTOL, ATOL},
    {"graph_cat", RTOL, ATOL},
    {"graph_mean_sum", RTOL, ATOL},
    {"graph_getitem", RTOL, ATOL},
    {"graph_sizes", RTOL, ATOL},
    {"graph_attn_tuple", RTOL, ATOL},
    {"graph_get_attr", RTOL, ATOL},
    {"graph_multi_io", RTOL, ATOL},
    {"graph_nested", RTOL, ATOL},
    {"graph_resnet_fused", RTOL, ATOL},
    {"graph_resnet_b1", RTOL, ATOL},
    {"graph_linear_relu", RTOL, ATOL},
    {"graph_holder", RTOL, ATOL},
    {"graph_embed_mean", RTOL, ATOL},
};
#define NGRAD ((int)(sizeof grad_cases / sizeof grad_cases[0]))

static void run_grad_case(const grad_case *c) {
  fx f = {0};
  fx_load(&f, "train_grad_", c->name);
  grove_err err = {0};
  grove_replica *r = NULL;
  grove_replica_opts opts = {.seed = 7, .inputs_require_grad = true};
  ck_assert_ok(grove_replica_new(f.json, c->name, f.weights, &opts, &r, &err), &err);

  grove_tensor xs[GROVE_MAX_VALUES];
  size_t n = 0;
  for (; n < GROVE_MAX_VALUES; n++) {
    char k[32];
    snprintf(k, sizeof k, "x.%zu", n);
    const grove_tensor *x = get(&f, k);
    if (!x) break;
    xs[n] = *x;
  }
  grove_values out;
  ck_assert_ok(grove_replica_forward(r, xs, n, &out, &err), &err);
  char what[512];
  grove_tensor g[GROVE_MAX_VALUES];
  int ny = 0;
  for (; ny < GROVE_MAX_VALUES; ny++) {
    char k[32];
    snprintf(k, sizeof k, "y.%d", ny);
    const grove_tensor *y = get(&f, k);
    if (!y) break;
    ck_assert_msg(ny < out.n, "%s: %d outputs, torch has more", c->name, out.n);
    snprintf(what, sizeof what, "%s: output %d", c->name, ny);
    expect_close(what, &out.v[ny], y, c->rtol, c->atol);
    snprintf(k, sizeof k, "g.%d", ny);
    g[ny] = *get(&f, k);
  }
  ck_assert_msg(ny == out.n, "%s: %d outputs, torch has %d", c->name, out.n, ny);
  ck_assert_ok(grove_replica_backward(r, g, (size_t)out.n, &err), &err);

  for (size_t i = 0; i < n; i++) {
    char k[32];
    snprintf(k, sizeof k, "dx.%zu", i);
    const grove_tensor *want = get(&f, k);
    grove_tensor dx;
    bool has = grove_replica_input_grad(r, i, &dx);
    if (!want) {
      ck_assert_msg(!has, "%s: input %zu has a gradient torch does not", c->name, i);
      continue;
    }
    ck_assert_msg(has, "%s: input %zu got no gradient", c->name, i);
    snprintf(what, sizeof what, "%s: input gradient %zu", c->name, i);
    expect_close(what, &dx, want, c->rtol, c->atol);
  }
  for (size_t i = 0; i < grove_replica_num_params(r); i++) {
    char k[300];
    snprintf(k, sizeof k, "grad.%s", grove_replica_param_name(r, i));
    const grove_tensor *want = get(&f, k);
    const grove_tensor *got = grove_replica_grad(r, i);
    if (!want) {
      ck_assert_msg(!got, "%s: %s has a gradient torch does not", c->name, k);
      continue;
    }
    ck_assert_msg(got != NULL, "%s: %s is None", c->name, k);
    snprintf(what, sizeof what, "%s: %s", c->name, k);
    expect_close(what, got, want, c->rtol, c->atol);
  }
  /* The state after the forward: running statistics and their count. */
  grove_state_dict *now = grove_sd_new();
  ck_assert_ok(grove_module_state_dict(grove_replica_root(r), "", now, &err), &err);
  for (size_t i = 0; i < grove_sd_count(f.file); i++) {
    const char *k = grove_sd_key(f.file, i);
    if (strncmp(k, "after.", 6) != 0) continue;
    const grove_tensor *want = grove_sd_tensor(f.file, i);
    const grove_tensor *got = grove_sd_get(now, k + 6);
    ck_assert_msg(got != NULL, "%s: no %s in the replica", c->name, k + 6);
    if (want->dtype == GROVE_I64) {
      ck_assert_msg(
          got->dtype == GROVE_I64 && *(const int64_t *)got->data == *(const int64_t *)want->data,
          "%s: %s is %lld, torch says %lld", c->name, k + 6, (long long)*(const int64_t *)got->data,
          (long long)*(const int64_t *)want->data);
    } else {
      snprintf(what, sizeof what, "%s: %s after the forward", c->name, k + 6);
      expect_close(what, got, want, c->rtol, c->atol);
    }
  }
  /* The state_dict it was built from is untouched. */
  for (size_t i = 0; i < grove_sd_count(f.weights); i++) {
    char k[300];
    snprintf(k, sizeof k, "w.%s", grove_sd_key(f.weights, i));
    ck_assert_ptr_eq(grove_sd_tensor(f.weights, i), get(&f, k));
  }
  grove_sd_free(now);
  grove_replica_free(r);
  fx_free(&f);
}

START_TEST(test_grad_parity) {
  run_grad_case(&grad_cases[_i]);
}
END_TEST

/* One forward and backward of a gradient fixture; every output, input
 * gradient and parameter gradient, concatenated (malloc'd, *len bytes). */
static char *step_bytes(const char *name, size_t *len) {
  fx f = {0};
  fx_load(&f, "train_grad_", name);
  grove_err err = {0};
  grove_replica *r = NULL;
  grove_replica_opts opts = {.seed = 7, .inputs_require_grad = true};
  ck_assert_ok(grove_replica_new(f.json, name, f.weights, &opts, &r, &err), &err);
  grove_tensor xs[GROVE_MAX_VALUES], g[GROVE_MAX_VALUES];
  size_t n = 0;
  for (; n < GROVE_MAX_VALUES; n++) {
    char k[32];
    snprintf(k, sizeof k, "x.%zu", n);
    if (!get(&f, k)) break;
    xs[n] = *get(&f, k);
  }
  grove_values out;
  ck_assert_ok(grove_replica_forward(r, xs, n, &out, &err), &err);
  for (int i = 0; i < out.n; i++) {
    char k[32];
    snprintf(k, sizeof k, "g.%d", i);
    g[i] = *get(&f, k);
  }
  char *buf = NULL;
  size_t used = 0;
  const grove_tensor *parts[64];
  grove_tensor dx[GROVE_MAX_VALUES];
  int np = 0;
  for (int i = 0; i < out.n; i++) parts[np++] = &out.v[i];
  /* The outputs live in the replica's arena until the next forward; copy
   * them before backward runs. */
  for (int i = 0; i < np; i++) {
    size_t b = grove_tensor_nbytes(parts[i]);
    buf = realloc(buf, used + b);
    memcpy(buf + used, parts[i]->data, b);
    used += b;
  }
  np = 0;
  ck_assert_ok(grove_replica_backward(r, g, (size_t)out.n, &err), &err);
  for (size_t i = 0; i < n; i++)
    if (grove_replica_input_grad(r, i, &dx[i])) parts[np++] = &dx[i];
  for (size_t i = 0; i < grove_replica_num_params(r) && np < 64; i++)
    if (grove_replica_grad(r, i)) parts[np++] = grove_replica_grad(r, i);
  for (int i = 0; i < np; i++) {
    size_t b = grove_tensor_nbytes(parts[i]);
    buf = realloc(buf, used + b);
    memcpy(buf + used, parts[i]->data, b);
    used += b;
  }
  grove_replica_free(r);
  fx_free(&f);
  *len = used;
  return buf;
}

/* The training forward and backward give the same bits on 1 and 2 compute
 * threads: the products, the patch rows of the convolutions and the
 * optimizer's loops are cut between threads, never within an element. */
START_TEST(test_threads_bitwise) {
  static const char *const names[] = {"cnn", "conv2d_dil_groups", "conv1d_groups", "mlp",
                                      "graph_resnet_fused"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    grove_set_compute_threads(1);
    size_t n1, n2;
    char *one = step_bytes(names[i], &n1);
    grove_set_compute_threads(2);
    char *two = step_bytes(names[i], &n2);
    grove_set_compute_threads(1);
    ck_assert_uint_eq(n1, n2);
    ck_assert_msg(memcmp(one, two, n1) == 0, "%s: 2 compute threads changed the gradients",
                  names[i]);
    free(one);
    free(two);
  }
}
END_TEST

/* ------------------------------------------------------------ losses */

static const char *const loss_cases[] = {
    "mse",           "mse_sum",    "ce",           "ce_sum", "ce_ignore", "ce_smooth",
    "ce_smooth_sum", "ce_spatial", "ce_unbatched", "bce",    "bce_sum",   "bce_pos_weight",
};
#define NLOSS ((int)(sizeof loss_cases / sizeof loss_cases[0]))

START_TEST(test_loss_parity) {
  const char *name = loss_cases[_i];
  char p[256];
  snprintf(p, sizeof p, "train_loss_%s.safetensors", name);
  grove_err err = {0};
  grove_state_dict *sd = NULL;
  ck_assert_ok(grove_safetensors_read(grove_fixture(p), &sd, &err), &err);
  snprintf(p, sizeof p, "train_loss_%s.json", name);
  json_error_t je;
  json_t *cfg = json_load_file(grove_fixture(p), 0, &je);
  ck_assert_msg(cfg != NULL, "%s: %s", p, je.text);
  grove_loss_kind kind;
  ck_assert(grove_loss_kind_from_name(json_string_value(json_object_get(cfg, "kind")), &kind));
  grove_loss l = grove_loss_default(kind);
  l.reduction = strcmp(json_string_value(json_object_get(cfg, "reduction")), "sum") == 0
                    ? GROVE_REDUCTION_SUM
                    : GROVE_REDUCTION_MEAN;
  l.ignore_index = json_integer_value(json_object_get(cfg, "ignore_index"));
  l.label_smoothing = json_number_value(json_object_get(cfg, "label_smoothing"));
  if (json_is_true(json_object_get(cfg, "pos_weight")))
    l.pos_weight = grove_sd_get(sd, "pos_weight");
  const grove_tensor *x = grove_sd_get(sd, "x");
  grove_tensor *grad = grove_tensor_new(GROVE_F32, x->ndim, x->shape, &err);
  double value = 0;
  ck_assert_ok(grove_loss_compute(&l, x, grove_sd_get(sd, "target"), &value, grad, &err), &err);
  const float want = *(const float *)grove_sd_get(sd, "loss")->data;
  ck_assert_msg(fabs(value - want) <= 1e-5 + 1e-5 * fabs(want), "%s: loss %.8g, torch says %.8g",
                name, value, (double)want);
  char what[128];
  snprintf(what, sizeof what, "%s: gradient", name);
  expect_close(what, grad, grove_sd_get(sd, "grad"), RTOL, ATOL);
  /* Without a gradient buffer: the value alone. */
  double v2 = 0;
  ck_assert_ok(grove_loss_compute(&l, x, grove_sd_get(sd, "target"), &v2, NULL, &err), &err);
  ck_assert(v2 == value);
  grove_tensor_release(grad);
  json_decref(cfg);
  grove_sd_free(sd);
}
END_TEST

START_TEST(test_loss_errors) {
  grove_err err = {0};
  float xd[6] = {0.1f, 0.2f, 0.3f, 0.4f, 0.5f, 0.6f}, gd[6];
  int64_t yd[2] = {1, 3};
  double v;
  grove_tensor x, y, g, yf;
  grove_tensor_init(&x, GROVE_F32, 2, (int64_t[]){2, 3}, xd);
  grove_tensor_init(&g, GROVE_F32, 2, (int64_t[]){2, 3}, gd);
  grove_tensor_init(&y, GROVE_I64, 1, (int64_t[]){2}, yd);
  grove_loss ce = grove_loss_default(GROVE_LOSS_CROSS_ENTROPY);
  ck_assert_status(grove_loss_compute(&ce, &x, &y, &v, &g, &err), GROVE_E_RANGE);
  ck_assert_msg(strstr(err.msg, "target 3") != NULL, "%s", err.msg);
  /* All ignored: NaN with mean, as torch; 0 with sum. */
  yd[0] = yd[1] = -100;
  ck_assert_ok(grove_loss_compute(&ce, &x, &y, &v, &g, &err), &err);
  ck_assert(isnan(v));
  ce.reduction = GROVE_REDUCTION_SUM;
  ck_assert_ok(grove_loss_compute(&ce, &x, &y, &v, &g, &err), &err);
  ck_assert(v == 0.0);
  grove_tensor_init(&y, GROVE_I64, 1, (int64_t[]){3}, yd);
  ck_assert_status(grove_loss_compute(&ce, &x, &y, &v, &g, &err), GROVE_E_SHAPE);
  ce.label_smoothing = 1.5;
  grove_tensor_init(&y, GROVE_I64, 1, (int64_t[]){2}, yd);
  ck_assert_status(grove_loss_compute(&ce, &x, &y, &v, &g, &err), GROVE_E_INVALID_ARGUMENT);
  grove_tensor_init(&yf, GROVE_F32, 1, (int64_t[]){2}, xd);
  ce.label_smoothing = 0;
  ck_assert_status(grove_loss_compute(&ce, &x, &yf, &v, &g, &err), GROVE_E_DTYPE);
  grove_loss mse = grove_loss_default(GROVE_LOSS_MSE);
  ck_assert_status(grove_loss_compute(&mse, &x, &yf, &v, &g, &err), GROVE_E_SHAPE);
  ck_assert_status(grove_loss_compute(&mse, &x, &y, &v, &g, &err), GROVE_E_DTYPE);
  grove_loss bce = grove_loss_default(GROVE_LOSS_BCE_WITH_LOGITS);
  float pwd[2] = {1, 2};
  grove_tensor pw;
  grove_tensor_init(&pw, GROVE_F32, 1, (int64_t[]){2}, pwd);
  bce.pos_weight = &pw;
  ck_assert_status(grove_loss_compute(&bce, &x, &x, &v, &g, &err), GROVE_E_SHAPE);
  grove_loss_kind k;
  ck_assert(grove_loss_kind_from_name("BCEWithLogitsLoss", &k) && k == GROVE_LOSS_BCE_WITH_LOGITS);
  ck_assert(!grove_loss_kind_from_name("NLLLoss", &k));
}
END_TEST

/* ------------------------------------------------------------ Dropout */

static const char *dropout_spec(double p, char *buf, size_t n) {
  snprintf(buf, n,
           "{\"format\": \"grove.model/1\", \"inputs\": [{\"name\": \"x\", \"dtype\": "
           "\"float32\", \"shape\": [-1, 100]}], \"module\": {\"type\": \"Sequential\", "
           "\"children\": [{\"type\": \"Dropout\", \"p\": %g}]}}",
           p);
  return buf;
}

/* Runs dropout(p) on ones [200, 100] with upstream gradient 2; returns the
 * fraction of zeros and checks every kept value and gradient. */
static double dropout_run(double p, uint64_t seed, float *first) {
  char spec[512];
  grove_err err = {0};
  grove_replica *r = NULL;
  grove_replica_opts o = {.seed = seed, .inputs_require_grad = true};
  ck_assert_ok(grove_replica_new(dropout_spec(p, spec, sizeof spec), "dropout", NULL, &o, &r, &err),
               &err);
  enum { N = 200 * 100 };
  float *ones = malloc(N * sizeof(float)), *twos = malloc(N * sizeof(float));
  for (int i = 0; i < N; i++) ones[i] = 1.0f, twos[i] = 2.0f;
  grove_tensor x, g;
  grove_tensor_init(&x, GROVE_F32, 2, (int64_t[]){200, 100}, ones);
  grove_tensor_init(&g, GROVE_F32, 2, (int64_t[]){200, 100}, twos);
  grove_values out;
  ck_assert_ok(grove_replica_forward(r, &x, 1, &out, &err), &err);
  ck_assert_ok(grove_replica_backward(r, &g, 1, &err), &err);
  grove_tensor dx;
  ck_assert(grove_replica_input_grad(r, 0, &dx));
  const float *y = out.v[0].data, *d = dx.data;
  const float scale = p < 1 ? (float)(1.0 / (1.0 - p)) : 0.0f;
  long zeros = 0;
  for (int i = 0; i < N; i++) {
    if (y[i] == 0.0f) {
      zeros++;
      ck_assert(d[i] == 0.0f);
    } else {
      ck_assert_msg(y[i] == scale, "kept value %g, expected %g", y[i], scale);
      ck_assert(d[i] == 2.0f * scale);
    }
  }
  if (first) memcpy(first, y, 100 * sizeof(float));
  free(ones);
  free(twos);
  grove_replica_free(r);
  return (double)zeros / N;
}

START_TEST(test_dropout) {
  /* 20000 Bernoulli draws: the fraction's standard deviation is below
   * 0.0035, so 0.02 is more than five of them. */
  double f = dropout_run(0.3, 1, NULL);
  ck_assert_msg(fabs(f - 0.3) < 0.02, "dropped %g, expected 0.3", f);
  f = dropout_run(0.75, 2, NULL);
  ck_assert_msg(fabs(f - 0.75) < 0.02, "dropped %g, expected 0.75", f);
  ck_assert(dropout_run(0.0, 3, NULL) == 0.0);
  ck_assert(dropout_run(1.0, 4, NULL) == 1.0);
  /* The replica's generator: the same seed gives the same mask. */
  float a[100], b[100], c[100];
  dropout_run(0.5, 42, a);
  dropout_run(0.5, 42, b);
  dropout_run(0.5, 43, c);
  ck_assert(memcmp(a, b, sizeof a) == 0);
  ck_assert(memcmp(a, c, sizeof a) != 0);
}
END_TEST

/* ------------------------------------------------------------ zero_grad, errors */

static const char *lin_spec =
    "{\"format\": \"grove.model/1\", \"inputs\": [{\"name\": \"x\", \"dtype\": \"float32\", "
    "\"shape\": [-1, 3]}], \"module\": {\"type\": \"Sequential\", \"children\": [{\"type\": "
    "\"Linear\", \"in_features\": 3, \"out_features\": 2}, {\"type\": \"BatchNorm1d\", "
    "\"num_features\": 2}]}}";

START_TEST(test_zero_grad) {
  grove_err err = {0};
  grove_replica *r = NULL;
  ck_assert_ok(grove_replica_new(lin_spec, "lin", NULL, NULL, &r, &err), &err);
  ck_assert_uint_eq(grove_replica_num_params(r), 4);
  ck_assert_str_eq(grove_replica_param_name(r, 0), "0.weight");
  ck_assert_str_eq(grove_replica_param_name(r, 3), "1.bias");
  for (size_t i = 0; i < 4; i++) ck_assert_ptr_null(grove_replica_grad(r, i));
  ck_assert(grove_replica_grad_norm(r) == 0.0);
  float xd[6] = {1, 2, 3, -1, 0.5f, 2}, gd[4] = {1, -2, 0.5f, 3};
  grove_tensor x, g;
  grove_tensor_init(&x, GROVE_F32, 2, (int64_t[]){2, 3}, xd);
  grove_tensor_init(&g, GROVE_F32, 2, (int64_t[]){2, 2}, gd);
  grove_values out;
  ck_assert_status(grove_replica_backward(r, &g, 1, &err), GROVE_E_FAILED_PRECONDITION);
  ck_assert_ok(grove_replica_forward(r, &x, 1, &out, &err), &err);
  ck_assert_ok(grove_replica_backward(r, &g, 1, &err), &err);
  ck_assert_status(grove_replica_backward(r, &g, 1, &err), GROVE_E_FAILED_PRECONDITION);
  float first[6];
  memcpy(first, grove_replica_grad(r, 0)->data, sizeof first);
  grove_tensor *g0 = grove_replica_grad(r, 0);
  /* A second backward accumulates into the same .grad. */
  ck_assert_ok(grove_replica_forward(r, &x, 1, &out, &err), &err);
  ck_assert_ok(grove_replica_backward(r, &g, 1, &err), &err);
  ck_assert_ptr_eq(grove_replica_grad(r, 0), g0);
  for (int i = 0; i < 6; i++) ck_assert_float_eq_tol(((float *)g0->data)[i], 2 * first[i], 1e-6);
  ck_assert(grove_replica_grad_norm(r) > 0.0);
  /* set_to_none=False zeroes in place; True drops them. */
  grove_replica_zero_grad(r, false);
  ck_assert_ptr_eq(grove_replica_grad(r, 0), g0);
  for (int i = 0; i < 6; i++) ck_assert(((float *)g0->data)[i] == 0.0f);
  grove_replica_zero_grad(r, true);
  for (size_t i = 0; i < 4; i++) ck_assert_ptr_null(grove_replica_grad(r, i));
  ck_assert_ptr_null(grove_replica_grads(r)[0]);
  /* Wrong gradient shapes and counts. */
  ck_assert_ok(grove_replica_forward(r, &x, 1, &out, &err), &err);
  ck_assert_status(grove_replica_backward(r, &x, 1, &err), GROVE_E_SHAPE);
  ck_assert_status(grove_replica_backward(r, &g, 2, &err), GROVE_E_INVALID_ARGUMENT);
  /* Batch statistics need more than one value per channel. */
  grove_tensor x1;
  grove_tensor_init(&x1, GROVE_F32, 2, (int64_t[]){1, 3}, xd);
  ck_assert_status(grove_replica_forward(r, &x1, 1, &out, &err), GROVE_E_SHAPE);
  ck_assert_msg(strstr(err.msg, "'1' (BatchNorm1d)") && strstr(err.msg, "more than 1 value"), "%s",
                err.msg);
  /* Inputs are checked against model.json. */
  grove_tensor_init(&x1, GROVE_F32, 2, (int64_t[]){2, 2}, xd);
  ck_assert_status(grove_replica_forward(r, &x1, 1, &out, &err), GROVE_E_SHAPE);
  grove_replica_free(r);
}
END_TEST

START_TEST(test_refusals) {
  grove_err err = {0};
  grove_replica *r = NULL;
  const char *sparse =
      "{\"format\": \"grove.model/1\", \"inputs\": [{\"name\": \"x\", \"dtype\": \"int64\", "
      "\"shape\": [-1]}], \"module\": {\"type\": \"Sequential\", \"children\": {\"emb\": "
      "{\"type\": \"Embedding\", \"num_embeddings\": 4, \"embedding_dim\": 2, \"sparse\": "
      "true}}}}";
  ck_assert_status(grove_replica_new(sparse, "m.json", NULL, NULL, &r, &err), GROVE_E_UNSUPPORTED);
  ck_assert_msg(strstr(err.msg, "'emb' (Embedding)") && strstr(err.msg, "sparse"), "%s", err.msg);
  ck_assert_ptr_null(r);
  /* #19's served-only modules and arguments are refused by name. */
  const char *bkv =
      "{\"format\": \"grove.model/1\", \"inputs\": [{\"name\": \"x\", \"dtype\": \"float32\", "
      "\"shape\": [-1, 3, 4]}], \"module\": {\"type\": \"MultiheadAttention\", \"embed_dim\": 4, "
      "\"num_heads\": 2, \"add_bias_kv\": true}}";
  ck_assert_status(grove_replica_new(bkv, "m.json", NULL, NULL, &r, &err), GROVE_E_UNSUPPORTED);
  ck_assert_msg(strstr(err.msg, "add_bias_kv"), "%s", err.msg);
  const char *dec =
      "{\"format\": \"grove.model/1\", \"inputs\": [{\"name\": \"x\", \"dtype\": \"float32\", "
      "\"shape\": [-1, 3, 4]}], \"module\": {\"type\": \"TransformerDecoderLayer\", \"d_model\": 4, "
      "\"nhead\": 2}}";
  ck_assert_status(grove_replica_new(dec, "m.json", NULL, NULL, &r, &err), GROVE_E_UNSUPPORTED);
  ck_assert_msg(strstr(err.msg, "TransformerDecoderLayer"), "%s", err.msg);
  const char *masked =
      "{\"format\": \"grove.model/1\", \"inputs\": [{\"name\": \"x\", \"dtype\": \"float32\", "
      "\"shape\": [-1, 3, 4]}, {\"name\": \"pad\", \"dtype\": \"bool\", \"shape\": [-1, 3]}], "
      "\"module\": {\"type\": \"Net\", \"children\": {\"attn\": {\"type\": "
      "\"MultiheadAttention\", \"embed_dim\": 4, \"num_heads\": 2, \"batch_first\": true}}, "
      "\"graph\": [{\"op\": \"placeholder\", \"name\": \"x\"}, {\"op\": \"placeholder\", "
      "\"name\": \"pad\"}, {\"op\": \"call_module\", \"name\": \"a\", \"target\": \"attn\", "
      "\"args\": [{\"node\": \"x\"}, {\"node\": \"x\"}, {\"node\": \"x\"}], \"kwargs\": "
      "{\"key_padding_mask\": {\"node\": \"pad\"}}}, {\"op\": \"call_function\", \"name\": "
      "\"g\", \"target\": \"getitem\", \"args\": [{\"node\": \"a\"}, 0]}, {\"op\": \"output\", "
      "\"name\": \"output\", \"args\": [{\"node\": \"g\"}]}]}}";
  grove_status ms = grove_replica_new(masked, "m.json", NULL, NULL, &r, &err);
  if (ms == GROVE_OK) {
    float xd[24] = {0};
    bool pd[6] = {false, false, true, false, true, true};
    grove_tensor xs[2];
    grove_values mout;
    grove_tensor_init(&xs[0], GROVE_F32, 3, (int64_t[]){2, 3, 4}, xd);
    grove_tensor_init(&xs[1], GROVE_BOOL, 2, (int64_t[]){2, 3}, pd);
    ms = grove_replica_forward(r, xs, 2, &mout, &err);
    grove_replica_free(r);
    r = NULL;
  }
  ck_assert_int_eq(ms, GROVE_E_UNSUPPORTED);
  ck_assert_msg(strstr(err.msg, "masks"), "%s", err.msg);
  /* A bad spec or state_dict is the spec's or the checkpoint's error. */
  ck_assert_status(grove_replica_new("{", "m.json", NULL, NULL, &r, &err), GROVE_E_SPEC);
  grove_state_dict *sd = grove_sd_new();
  int64_t shp[2] = {5, 5};
  grove_tensor *w = grove_tensor_new(GROVE_F32, 2, shp, &err);
  ck_assert_ok(grove_sd_set(sd, "0.weight", w, &err), &err);
  ck_assert_status(grove_replica_new(lin_spec, "m.json", sd, NULL, &r, &err), GROVE_E_STATE_DICT);
  grove_tensor_release(w);
  grove_sd_free(sd);
}
END_TEST

/* Evaluate: eval mode on the trained replica is the serving forward of a
 * tree loaded with the replica's state. */
START_TEST(test_evaluate) {
  fx f = {0};
  fx_load(&f, "train_grad_", "mlp");
  grove_err err = {0};
  grove_replica *r = NULL;
  ck_assert_ok(grove_replica_new(f.json, "mlp", f.weights, NULL, &r, &err), &err);
  grove_optim *o = NULL;
  grove_optim_hparams h = grove_optim_defaults(GROVE_OPTIM_SGD);
  h.lr = 0.1;
  ck_assert_ok(grove_optim_new(GROVE_OPTIM_SGD, (grove_tensor *const *)&(grove_tensor *){0}, 0,
                               NULL, 0, &h, &o, &err),
               &err);
  grove_optim_free(o);
  size_t np = grove_replica_num_params(r);
  grove_tensor **ps = malloc(np * sizeof *ps);
  for (size_t i = 0; i < np; i++) ps[i] = grove_replica_param(r, i);
  ck_assert_ok(grove_optim_new(GROVE_OPTIM_SGD, ps, np, NULL, 0, &h, &o, &err), &err);
  free(ps);
  const grove_tensor *x = get(&f, "x.0");
  float td[6] = {0.5f, -1, 0, 1, 2, 0.25f};
  grove_tensor target;
  /* MSE against a [6, 3] target of repeated values. */
  float tdat[18];
  for (int i = 0; i < 18; i++) tdat[i] = td[i % 6];
  grove_tensor_init(&target, GROVE_F32, 2, (int64_t[]){6, 3}, tdat);
  grove_loss l = grove_loss_default(GROVE_LOSS_MSE);
  double loss0, loss1, norm;
  ck_assert_ok(grove_replica_train_step(r, o, &l, x, 1, &target, &loss0, &norm, &err), &err);
  ck_assert(norm > 0);
  ck_assert_ok(grove_replica_train_step(r, o, &l, x, 1, &target, &loss1, &norm, &err), &err);
  ck_assert_msg(loss1 < loss0, "SGD did not lower the loss: %g then %g", loss0, loss1);

  grove_arena *a = grove_arena_new(0), *b = grove_arena_new(0);
  grove_values ev, sv;
  ck_assert_ok(grove_replica_evaluate(r, a, x, 1, &ev, &err), &err);
  ck_assert(grove_replica_root(r)->training);
  grove_state_dict *snap = grove_sd_new();
  ck_assert_ok(grove_replica_state_dict(r, snap, &err), &err);
  /* The snapshot is a copy. */
  grove_state_dict *live = grove_sd_new();
  ck_assert_ok(grove_module_state_dict(grove_replica_root(r), "", live, &err), &err);
  ck_assert_uint_eq(grove_sd_count(live), grove_sd_count(snap));
  for (size_t i = 0; i < grove_sd_count(live); i++) {
    ck_assert_str_eq(grove_sd_key(live, i), grove_sd_key(snap, i));
    ck_assert_ptr_ne(grove_sd_tensor(live, i)->data, grove_sd_tensor(snap, i)->data);
    ck_assert(memcmp(grove_sd_tensor(live, i)->data, grove_sd_tensor(snap, i)->data,
                     grove_tensor_nbytes(grove_sd_tensor(live, i))) == 0);
  }
  grove_model *m = NULL;
  ck_assert_ok(grove_model_from_spec(f.json, "mlp", &m, &err), &err);
  ck_assert_ok(grove_module_load_state_dict(m->root, snap, NULL, NULL, &err), &err);
  ck_assert_ok(grove_model_forward(m, b, x, 1, &sv, &err), &err);
  expect_close("evaluate vs serving", &ev.v[0], &sv.v[0], 1e-5, 1e-6);
  grove_model_free(m);
  grove_sd_free(snap);
  grove_sd_free(live);
  grove_arena_free(a);
  grove_arena_free(b);
  grove_optim_free(o);
  grove_replica_free(r);
  fx_free(&f);
}
END_TEST

static Suite *backward_suite(void) {
  Suite *s = suite_create("backward");
  TCase *tc = tcase_create("parity");
  tcase_add_loop_test(tc, test_grad_parity, 0, NGRAD);
  tcase_add_loop_test(tc, test_loss_parity, 0, NLOSS);
  suite_add_tcase(s, tc);
  TCase *t2 = tcase_create("replica");
  tcase_add_test(t2, test_loss_errors);
  tcase_add_test(t2, test_dropout);
  tcase_add_test(t2, test_zero_grad);
  tcase_add_test(t2, test_refusals);
  tcase_add_test(t2, test_evaluate);
  tcase_add_test(t2, test_threads_bitwise);
  suite_add_tcase(s, t2);
  return s;
}

GROVE_TEST_MAIN(backward_suite)
