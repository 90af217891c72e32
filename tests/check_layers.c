/* check_layers.c: every layer of layers.h against PyTorch, plus the paths
 * around them.
 *
 * Parity: tests/fixtures_gen/layers.py writes layers_<case>.safetensors (the
 * torch layer's state_dict under "w.", the input "x", torch's output "y").
 * Each case here builds the same layer with the C constructor, loads the
 * weights with load_state_dict(strict), runs forward in an arena and compares
 * with torch (rtol 1e-4, atol 1e-5); then runs forward a second time after an
 * arena reset and checks that the arena did not grow and the output is
 * bit-identical.
 *
 * Also: fused Linear+ReLU vs the unfused (hooked) path, strided inputs,
 * Embedding range and padding, BatchNorm's num_batches_tracked fixup and
 * training refusal, shape errors, containers, state_dict order, and every
 * model.json error path of the builders. */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "layers_internal.h"
#include "testutil.h"

#define RTOL 1e-4
#define ATOL 1e-5

/* ------------------------------------------------------------ case table */

/* Mirrors _cases() in tests/fixtures_gen/layers.py. */
static const char *const cases[] = {
    "linear_b1",
    "linear_odd",
    "linear_nobias",
    "linear_3d",
    "linear_1d",
    "linear_big",
    "mlp",
    "mlp_b1",
    "mlp_mixed",
    "identity",
    "flatten_default",
    "flatten_0_2",
    "flatten_neg",
    "flatten_0d",
    "dropout",
    "relu",
    "leaky_relu",
    "leaky_relu_02",
    "gelu",
    "gelu_tanh",
    "silu",
    "sigmoid",
    "tanh",
    "relu_3d_b1",
    "softmax_1",
    "softmax_neg",
    "softmax_0",
    "softmax_mid",
    "softmax_neg2",
    "softmax_none_1d",
    "softmax_none_2d",
    "softmax_none_3d",
    "softmax_none_4d",
    "softmax_large",
    "softmax_b1",
    "log_softmax_1",
    "log_softmax_mid",
    "log_softmax_none_3d",
    "log_softmax_large",
    "log_softmax_offset",
    "log_softmax_lanes_offset",
    "softmax_wide",
    "bn_2d",
    "bn_3d",
    "bn_b1",
    "bn_noaffine",
    "bn_eps",
    "bn_nostats_2d",
    "bn_nostats_3d",
    "bn_nostats_noaffine",
    "ln_1",
    "ln_2",
    "ln_noaffine",
    "ln_eps",
    "ln_offset",
    "ln_1d",
    "ln_wide",
    "emb",
    "emb_pad",
    "emb_i32",
    "emb_0d",
};
#define NCASES ((int)(sizeof cases / sizeof cases[0]))

/* Adds *child (built by the call that gave s) to seq and drops our
 * reference.  child is read here, after s was computed: C leaves the order of
 * argument evaluation open. */
static void add(grove_module *seq, const char *name, grove_status s, grove_module **child,
                grove_err *err) {
  ck_assert_ok(s, err);
  ck_assert_ok(grove_module_add_module(seq, name, *child, err), err);
  grove_module_release(*child);
}

static grove_module *build_mlp(grove_err *err) {
  grove_module *seq, *c;
  ck_assert_ok(grove_sequential_new(&seq, err), err);
  grove_status s = grove_linear_new(20, 17, true, &c, err);
  add(seq, "0", s, &c, err);
  s = grove_relu_new(&c, err);
  add(seq, "1", s, &c, err);
  s = grove_linear_new(17, 9, true, &c, err);
  add(seq, "2", s, &c, err);
  s = grove_relu_new(&c, err);
  add(seq, "3", s, &c, err);
  s = grove_linear_new(9, 4, true, &c, err);
  add(seq, "4", s, &c, err);
  return seq;
}

static grove_module *build_mlp_mixed(grove_err *err) {
  grove_module *seq, *c;
  int64_t ns = 16;
  ck_assert_ok(grove_sequential_new(&seq, err), err);
  add(seq, "fc1", grove_linear_new(8, 16, true, &c, err), &c, err);
  add(seq, "act1", grove_gelu_new("none", &c, err), &c, err);
  add(seq, "drop", grove_dropout_new(0.2, &c, err), &c, err);
  add(seq, "norm", grove_layer_norm_new(1, &ns, 1e-5, true, &c, err), &c, err);
  add(seq, "fc2", grove_linear_new(16, 5, true, &c, err), &c, err);
  add(seq, "act2", grove_relu_new(&c, err), &c, err);
  add(seq, "out", grove_log_softmax_new(true, -1, &c, err), &c, err);
  return seq;
}

/* The C constructor call for each case, with the arguments layers.py uses. */
static grove_module *build_case(const char *name, grove_err *err) {
  grove_module *m = NULL;
  grove_status s = GROVE_E_NOT_FOUND;
#define CASE(n, call) else if (strcmp(name, n) == 0) s = (call)
  int64_t sh35[2] = {3, 5}, n8 = 8, n7 = 7, n16 = 16, n32 = 32, n9 = 9, n301 = 301;
  if (strcmp(name, "mlp") == 0 || strcmp(name, "mlp_b1") == 0) return build_mlp(err);
  if (strcmp(name, "mlp_mixed") == 0) return build_mlp_mixed(err);
  if (0) {
  }
  CASE("linear_b1", grove_linear_new(64, 32, true, &m, err));
  CASE("linear_odd", grove_linear_new(13, 7, true, &m, err));
  CASE("linear_nobias", grove_linear_new(10, 3, false, &m, err));
  CASE("linear_3d", grove_linear_new(6, 5, true, &m, err));
  CASE("linear_1d", grove_linear_new(6, 5, true, &m, err));
  CASE("linear_big", grove_linear_new(100, 67, true, &m, err));
  CASE("identity", grove_identity_new(&m, err));
  CASE("flatten_default", grove_flatten_new(1, -1, &m, err));
  CASE("flatten_0_2", grove_flatten_new(0, 2, &m, err));
  CASE("flatten_neg", grove_flatten_new(-3, -2, &m, err));
  CASE("flatten_0d", grove_flatten_new(0, -1, &m, err));
  CASE("dropout", grove_dropout_new(0.3, &m, err));
  CASE("relu", grove_relu_new(&m, err));
  CASE("relu_3d_b1", grove_relu_new(&m, err));
  CASE("leaky_relu", grove_leaky_relu_new(0.01, &m, err));
  CASE("leaky_relu_02", grove_leaky_relu_new(0.2, &m, err));
  CASE("gelu", grove_gelu_new("none", &m, err));
  CASE("gelu_tanh", grove_gelu_new("tanh", &m, err));
  CASE("silu", grove_silu_new(&m, err));
  CASE("sigmoid", grove_sigmoid_new(&m, err));
  CASE("tanh", grove_tanh_new(&m, err));
  CASE("softmax_1", grove_softmax_new(true, 1, &m, err));
  CASE("softmax_neg", grove_softmax_new(true, -1, &m, err));
  CASE("softmax_0", grove_softmax_new(true, 0, &m, err));
  CASE("softmax_mid", grove_softmax_new(true, 1, &m, err));
  CASE("softmax_neg2", grove_softmax_new(true, -2, &m, err));
  CASE("softmax_none_1d", grove_softmax_new(false, 0, &m, err));
  CASE("softmax_none_2d", grove_softmax_new(false, 0, &m, err));
  CASE("softmax_none_3d", grove_softmax_new(false, 0, &m, err));
  CASE("softmax_none_4d", grove_softmax_new(false, 0, &m, err));
  CASE("softmax_large", grove_softmax_new(true, 1, &m, err));
  CASE("softmax_b1", grove_softmax_new(true, -1, &m, err));
  CASE("log_softmax_1", grove_log_softmax_new(true, 1, &m, err));
  CASE("log_softmax_mid", grove_log_softmax_new(true, 1, &m, err));
  CASE("log_softmax_none_3d", grove_log_softmax_new(false, 0, &m, err));
  CASE("log_softmax_large", grove_log_softmax_new(true, -1, &m, err));
  CASE("log_softmax_offset", grove_log_softmax_new(true, 1, &m, err));
  CASE("log_softmax_lanes_offset", grove_log_softmax_new(true, 0, &m, err));
  CASE("softmax_wide", grove_softmax_new(true, -1, &m, err));
  CASE("bn_2d", grove_batch_norm1d_new(6, 1e-5, 0.1, true, true, &m, err));
  CASE("bn_3d", grove_batch_norm1d_new(4, 1e-5, 0.1, true, true, &m, err));
  CASE("bn_b1", grove_batch_norm1d_new(6, 1e-5, 0.1, true, true, &m, err));
  CASE("bn_noaffine", grove_batch_norm1d_new(5, 1e-5, 0.1, false, true, &m, err));
  CASE("bn_eps", grove_batch_norm1d_new(3, 1e-2, NAN, true, true, &m, err));
  CASE("bn_nostats_2d", grove_batch_norm1d_new(6, 1e-5, 0.1, true, false, &m, err));
  CASE("bn_nostats_3d", grove_batch_norm1d_new(4, 1e-5, 0.1, true, false, &m, err));
  CASE("bn_nostats_noaffine", grove_batch_norm1d_new(4, 1e-5, 0.1, false, false, &m, err));
  CASE("ln_1", grove_layer_norm_new(1, &n8, 1e-5, true, &m, err));
  CASE("ln_2", grove_layer_norm_new(2, sh35, 1e-5, true, &m, err));
  CASE("ln_noaffine", grove_layer_norm_new(1, &n7, 1e-5, false, &m, err));
  CASE("ln_eps", grove_layer_norm_new(1, &n16, 1e-3, true, &m, err));
  CASE("ln_offset", grove_layer_norm_new(1, &n32, 1e-5, true, &m, err));
  CASE("ln_1d", grove_layer_norm_new(1, &n9, 1e-5, true, &m, err));
  CASE("ln_wide", grove_layer_norm_new(1, &n301, 1e-5, true, &m, err));
  CASE("emb", grove_embedding_new(10, 4, -1, &m, err));
  CASE("emb_pad", grove_embedding_new(10, 4, 2, &m, err));
  CASE("emb_i32", grove_embedding_new(7, 3, -1, &m, err));
  CASE("emb_0d", grove_embedding_new(5, 6, -1, &m, err));
#undef CASE
  ck_assert_msg(s != GROVE_E_NOT_FOUND, "no C constructor for case %s", name);
  ck_assert_ok(s, err);
  return m;
}

/* ------------------------------------------------------------ fixtures */

typedef struct fixture {
  grove_state_dict *file;    /* the whole file */
  grove_state_dict *weights; /* the w.* entries, prefix stripped */
  grove_tensor *x, *y;       /* borrowed from file */
} fixture;

static void fixture_load(fixture *fx, const char *name) {
  grove_err err = {0};
  char fname[256];
  snprintf(fname, sizeof fname, "layers_%s.safetensors", name);
  ck_assert_ok(grove_safetensors_read(grove_fixture(fname), &fx->file, &err), &err);
  fx->weights = grove_sd_new();
  ck_assert_ptr_nonnull(fx->weights);
  for (size_t i = 0; i < grove_sd_count(fx->file); i++) {
    const char *k = grove_sd_key(fx->file, i);
    if (strncmp(k, "w.", 2) == 0)
      ck_assert_ok(grove_sd_set(fx->weights, k + 2, grove_sd_tensor(fx->file, i), &err), &err);
  }
  fx->x = grove_sd_get(fx->file, "x");
  fx->y = grove_sd_get(fx->file, "y");
  ck_assert_ptr_nonnull(fx->x);
  ck_assert_ptr_nonnull(fx->y);
}

static void fixture_fini(fixture *fx) {
  grove_sd_free(fx->weights);
  grove_sd_free(fx->file);
}

/* Builds, loads (strict) and puts the case's module in eval mode. */
static grove_module *loaded_case(const char *name, fixture *fx) {
  grove_err err = {0};
  fixture_load(fx, name);
  grove_module *m = build_case(name, &err);
  grove_module_eval(m);
  ck_assert_ok(grove_module_load_state_dict(m, fx->weights, NULL, NULL, &err), &err);
  return m;
}

static void assert_close(const char *what, const grove_tensor *got, const grove_tensor *want) {
  char a[128], b[128];
  ck_assert_msg(grove_tensor_same_shape(got, want), "%s: shape %s, torch %s", what,
                grove_shape_str(got->ndim, got->shape, a, sizeof a),
                grove_shape_str(want->ndim, want->shape, b, sizeof b));
  ck_assert_int_eq(got->dtype, GROVE_F32);
  ck_assert(grove_tensor_is_contiguous(got));
  size_t n = (size_t)grove_tensor_numel(want);
  const float *g = got->data, *w = want->data;
  long bad = grove_test_allclose(g, w, n, RTOL, ATOL);
  ck_assert_msg(bad < 0, "%s: element %ld is %.9g, torch says %.9g", what, bad,
                bad >= 0 ? g[bad] : 0.0, bad >= 0 ? w[bad] : 0.0);
}

/* ------------------------------------------------------------ parity */

START_TEST(test_parity) {
  const char *name = cases[_i];
  fixture fx = {0};
  grove_err err = {0};
  grove_module *m = loaded_case(name, &fx);
  grove_arena *arena = grove_arena_new(0);
  ck_assert_ptr_nonnull(arena);
  grove_fwd f = {.arena = arena, .err = &err};
  grove_tensor y;
  ck_assert_ok(grove_module_call(m, &f, fx.x, &y), &err);
  assert_close(name, &y, fx.y);

  /* Warm-up done: the same size again takes nothing from the heap and gives
   * the same bits. */
  size_t n = grove_tensor_nbytes(&y);
  float *first = malloc(n ? n : 1);
  memcpy(first, y.data, n);
  grove_arena_reset(arena);
  size_t grows = grove_arena_grow_count(arena);
  grove_tensor y2;
  ck_assert_ok(grove_module_call(m, &f, fx.x, &y2), &err);
  ck_assert_uint_eq(grove_arena_grow_count(arena), grows);
  ck_assert(memcmp(first, y2.data, n) == 0);
  free(first);

  grove_arena_free(arena);
  grove_module_release(m);
  fixture_fini(&fx);
}
END_TEST

/* ------------------------------------------------------------ fusion */

static int hook_calls;
static grove_status noop_hook(void *user, const grove_module *m, grove_fwd *f,
                              const grove_values *in, grove_values *out) {
  hook_calls++;
  return GROVE_OK;
}

/* Linear+ReLU fused (no hooks) and unfused (a no-op hook anywhere) give the
 * same bits; with the hook the ReLUs really run on their own (their hooks
 * see them). */
static void check_fusion(const char *name, int relus) {
  fixture fx = {0};
  grove_err err = {0};
  grove_module *m = loaded_case(name, &fx);
  grove_arena *arena = grove_arena_new(0);
  grove_fwd f = {.arena = arena, .err = &err};
  grove_tensor fused, unfused;
  ck_assert_ok(grove_module_call(m, &f, fx.x, &fused), &err);
  assert_close(name, &fused, fx.y);

  grove_module *relu = grove_module_find(m, "1");
  if (!relu) relu = grove_module_find(m, "act2");
  ck_assert_ptr_nonnull(relu);
  uint64_t id;
  hook_calls = 0;
  ck_assert_ok(grove_module_register_forward_hook(relu, noop_hook, NULL, false, &id), &err);
  ck_assert_ok(grove_module_call(m, &f, fx.x, &unfused), &err);
  ck_assert_int_eq(hook_calls, 1);
  ck_assert(grove_tensor_same_shape(&fused, &unfused));
  ck_assert(memcmp(fused.data, unfused.data, grove_tensor_nbytes(&fused)) == 0);
  ck_assert(grove_module_remove_hook(relu, id));

  /* And with the hook gone, fused again: the hook is not called. */
  hook_calls = 0;
  ck_assert_ok(grove_module_call(m, &f, fx.x, &fused), &err);
  ck_assert_int_eq(hook_calls, 0);
  ck_assert(memcmp(fused.data, unfused.data, grove_tensor_nbytes(&fused)) == 0);
  (void)relus;
  grove_arena_free(arena);
  grove_module_release(m);
  fixture_fini(&fx);
}

START_TEST(test_fused_matches_unfused) {
  check_fusion("mlp", 2);
  check_fusion("mlp_b1", 2);
  check_fusion("mlp_mixed", 1);
}
END_TEST

/* A global hook also disables fusion and sees every child: 5 children and
 * the Sequential itself. */
START_TEST(test_global_hook_sees_every_child) {
  fixture fx = {0};
  grove_err err = {0};
  grove_module *m = loaded_case("mlp", &fx);
  grove_arena *arena = grove_arena_new(0);
  grove_fwd f = {.arena = arena, .err = &err};
  uint64_t id;
  hook_calls = 0;
  ck_assert_ok(grove_register_global_forward_hook(noop_hook, NULL, &id), &err);
  grove_tensor y;
  ck_assert_ok(grove_module_call(m, &f, fx.x, &y), &err);
  ck_assert_int_eq(hook_calls, 6);
  assert_close("mlp hooked", &y, fx.y);
  ck_assert(grove_remove_global_hook(id));
  grove_arena_free(arena);
  grove_module_release(m);
  fixture_fini(&fx);
}
END_TEST

/* ------------------------------------------------------------ strided inputs */

/* A user's transposed view gives the same result as its contiguous copy. */
static void check_strided(const char *name) {
  fixture fx = {0};
  grove_err err = {0};
  grove_module *m = loaded_case(name, &fx);
  ck_assert_int_eq(fx.x->ndim, 2);
  int64_t R = fx.x->shape[0], C = fx.x->shape[1];
  /* Store x transposed ([C, R] contiguous), then view it as [R, C]. */
  int64_t tshape[2] = {C, R};
  grove_tensor *xt = grove_tensor_new(GROVE_F32, 2, tshape, &err);
  ck_assert_ptr_nonnull(xt);
  const float *xs = fx.x->data;
  float *xd = xt->data;
  for (int64_t r = 0; r < R; r++)
    for (int64_t c = 0; c < C; c++) xd[c * R + r] = xs[r * C + c];
  int64_t shape[2] = {R, C}, strides[2] = {1, R};
  grove_tensor *v = grove_tensor_view_new(xt->storage, 0, GROVE_F32, 2, shape, strides, &err);
  ck_assert_ptr_nonnull(v);
  ck_assert(!grove_tensor_is_contiguous(v));
  grove_arena *arena = grove_arena_new(0);
  grove_fwd f = {.arena = arena, .err = &err};
  grove_tensor y;
  ck_assert_ok(grove_module_call(m, &f, v, &y), &err);
  assert_close(name, &y, fx.y);
  grove_arena_free(arena);
  grove_tensor_release(v);
  grove_tensor_release(xt);
  grove_module_release(m);
  fixture_fini(&fx);
}

START_TEST(test_strided_inputs) {
  check_strided("linear_odd");
  check_strided("relu");
  check_strided("softmax_1");
  check_strided("bn_2d");
  check_strided("ln_1");
  check_strided("mlp");
}
END_TEST

/* ------------------------------------------------------------ errors at forward */

static grove_status call1(grove_module *m, grove_arena *a, grove_err *err, grove_dtype dt, int nd,
                          const int64_t *shape, void *data) {
  grove_fwd f = {.arena = a, .err = err};
  grove_tensor x, y;
  grove_tensor_init(&x, dt, nd, shape, data);
  return grove_module_call(m, &f, &x, &y);
}

static float zeros[4096];

START_TEST(test_shape_errors) {
  grove_err err = {0};
  grove_arena *a = grove_arena_new(0);
  grove_module *m;

  ck_assert_ok(grove_linear_new(4, 3, true, &m, &err), &err);
  grove_module_eval(m);
  int64_t s25[2] = {2, 5};
  ck_assert_status(call1(m, a, &err, GROVE_F32, 2, s25, zeros), GROVE_E_SHAPE);
  ck_assert_ptr_nonnull(strstr(err.msg, "Linear"));
  ck_assert_ptr_nonnull(strstr(err.msg, "(2x5 and 4x3)"));
  ck_assert_ptr_nonnull(strstr(err.msg, "[2, 5]"));
  ck_assert_status(call1(m, a, &err, GROVE_F32, 0, NULL, zeros), GROVE_E_SHAPE);
  int64_t s24[2] = {2, 4};
  ck_assert_status(call1(m, a, &err, GROVE_F64, 2, s24, zeros), GROVE_E_DTYPE);
  ck_assert_ptr_nonnull(strstr(err.msg, "float64"));
  /* Batch 0 is fine and gives [0, 3]. */
  int64_t s04[2] = {0, 4};
  ck_assert_ok(call1(m, a, &err, GROVE_F32, 2, s04, zeros), &err);
  grove_module_release(m);

  ck_assert_ok(grove_batch_norm1d_new(3, 1e-5, 0.1, true, true, &m, &err), &err);
  grove_module_eval(m);
  ck_assert_status(call1(m, a, &err, GROVE_F32, 2, s24, zeros), GROVE_E_SHAPE);
  ck_assert_ptr_nonnull(strstr(err.msg, "BatchNorm1d"));
  ck_assert_ptr_nonnull(strstr(err.msg, "[2, 4]"));
  ck_assert_ptr_nonnull(strstr(err.msg, "[N, 3]"));
  int64_t s4d[4] = {2, 3, 2, 2};
  ck_assert_status(call1(m, a, &err, GROVE_F32, 4, s4d, zeros), GROVE_E_SHAPE);
  int64_t s3[1] = {3};
  ck_assert_status(call1(m, a, &err, GROVE_F32, 1, s3, zeros), GROVE_E_SHAPE);
  grove_module_release(m);

  int64_t ns[2] = {3, 4};
  ck_assert_ok(grove_layer_norm_new(2, ns, 1e-5, true, &m, &err), &err);
  grove_module_eval(m);
  int64_t s234[3] = {2, 3, 5};
  ck_assert_status(call1(m, a, &err, GROVE_F32, 3, s234, zeros), GROVE_E_SHAPE);
  ck_assert_ptr_nonnull(strstr(err.msg, "LayerNorm"));
  ck_assert_ptr_nonnull(strstr(err.msg, "[*, 3, 4]"));
  ck_assert_ptr_nonnull(strstr(err.msg, "[2, 3, 5]"));
  int64_t s4[1] = {4};
  ck_assert_status(call1(m, a, &err, GROVE_F32, 1, s4, zeros), GROVE_E_SHAPE);
  grove_module_release(m);

  ck_assert_ok(grove_softmax_new(true, 2, &m, &err), &err);
  ck_assert_status(call1(m, a, &err, GROVE_F32, 2, s24, zeros), GROVE_E_SHAPE);
  ck_assert_ptr_nonnull(strstr(err.msg, "Softmax: dim 2 is out of range for a 2-d input"));
  grove_module_release(m);

  ck_assert_ok(grove_flatten_new(1, -1, &m, &err), &err);
  ck_assert_status(call1(m, a, &err, GROVE_F32, 1, s4, zeros), GROVE_E_SHAPE);
  ck_assert_ptr_nonnull(strstr(err.msg, "Flatten: start_dim 1"));
  grove_module_release(m);
  ck_assert_ok(grove_flatten_new(2, 1, &m, &err), &err);
  int64_t s222[3] = {2, 2, 2};
  ck_assert_status(call1(m, a, &err, GROVE_F32, 3, s222, zeros), GROVE_E_SHAPE);
  grove_module_release(m);

  ck_assert_ok(grove_relu_new(&m, &err), &err);
  ck_assert_status(call1(m, a, &err, GROVE_I64, 1, s4, zeros), GROVE_E_DTYPE);
  grove_fwd f = {.arena = a, .err = &err};
  grove_values two = {.n = 2}, out;
  grove_tensor_init(&two.v[0], GROVE_F32, 1, s4, zeros);
  grove_tensor_init(&two.v[1], GROVE_F32, 1, s4, zeros);
  ck_assert_status(grove_module_forward(m, &f, &two, &out), GROVE_E_INVALID_ARGUMENT);
  grove_module_release(m);
  grove_arena_free(a);
}
END_TEST

START_TEST(test_training_refused) {
  grove_err err = {0};
  grove_arena *a = grove_arena_new(0);
  grove_module *m;
  int64_t s23[2] = {2, 3};
  ck_assert_ok(grove_dropout_new(0.5, &m, &err), &err);
  ck_assert(m->training); /* torch's default */
  ck_assert_status(call1(m, a, &err, GROVE_F32, 2, s23, zeros), GROVE_E_UNSUPPORTED);
  ck_assert_str_eq(err.msg, "Dropout: training-mode forward is not available on a serving tree");
  grove_module_eval(m);
  ck_assert_ok(call1(m, a, &err, GROVE_F32, 2, s23, zeros), &err);
  grove_module_release(m);

  ck_assert_ok(grove_batch_norm1d_new(3, 1e-5, 0.1, true, true, &m, &err), &err);
  ck_assert_status(call1(m, a, &err, GROVE_F32, 2, s23, zeros), GROVE_E_UNSUPPORTED);
  ck_assert_ptr_nonnull(strstr(err.msg, "BatchNorm1d: training-mode forward"));
  grove_module_eval(m);
  ck_assert_ok(call1(m, a, &err, GROVE_F32, 2, s23, zeros), &err);
  grove_module_release(m);

  /* Batch statistics over one value per channel, like torch's ValueError. */
  ck_assert_ok(grove_batch_norm1d_new(3, 1e-5, 0.1, true, false, &m, &err), &err);
  grove_module_eval(m);
  int64_t s13[2] = {1, 3};
  ck_assert_status(call1(m, a, &err, GROVE_F32, 2, s13, zeros), GROVE_E_SHAPE);
  ck_assert_ptr_nonnull(strstr(err.msg, "more than 1 value per channel"));
  grove_module_release(m);
  grove_arena_free(a);
}
END_TEST

/* ------------------------------------------------------------ Embedding */

START_TEST(test_embedding_range_and_padding) {
  fixture fx = {0};
  grove_err err = {0};
  grove_module *m = loaded_case("emb_pad", &fx);
  ck_assert_int_eq(grove__embedding_padding_idx(m), 2);
  grove_arena *a = grove_arena_new(0);

  /* The padding row is torch's zero row, whatever index asks for it. */
  int64_t idx[3] = {2, 1, 2};
  int64_t s3[1] = {3};
  grove_fwd f = {.arena = a, .err = &err};
  grove_tensor x, y;
  grove_tensor_init(&x, GROVE_I64, 1, s3, idx);
  ck_assert_ok(grove_module_call(m, &f, &x, &y), &err);
  ck_assert_int_eq(y.ndim, 2);
  ck_assert_int_eq(y.shape[1], 4);
  const float *yd = y.data;
  for (int j = 0; j < 4; j++) {
    ck_assert(yd[j] == 0.0f);
    ck_assert(yd[8 + j] == 0.0f);
  }
  ck_assert(yd[4] != 0.0f);

  /* Out of range, either side, int64 and int32: an error naming both. */
  int64_t bad[3] = {0, 10, 1};
  grove_tensor_init(&x, GROVE_I64, 1, s3, bad);
  ck_assert_status(grove_module_call(m, &f, &x, &y), GROVE_E_RANGE);
  ck_assert_ptr_nonnull(strstr(err.msg, "index 10"));
  ck_assert_ptr_nonnull(strstr(err.msg, "num_embeddings is 10"));
  ck_assert_ptr_nonnull(strstr(err.msg, "position 1"));
  int64_t neg[1] = {-1};
  grove_tensor_init(&x, GROVE_I64, 1, s3, neg);
  x.shape[0] = 1;
  ck_assert_status(grove_module_call(m, &f, &x, &y), GROVE_E_RANGE);
  ck_assert_ptr_nonnull(strstr(err.msg, "index -1"));
  int32_t big32[2] = {3, 2147483647};
  int64_t s2[1] = {2};
  grove_tensor_init(&x, GROVE_I32, 1, s2, big32);
  ck_assert_status(grove_module_call(m, &f, &x, &y), GROVE_E_RANGE);
  ck_assert_ptr_nonnull(strstr(err.msg, "index 2147483647"));
  int64_t huge[1] = {INT64_MIN};
  grove_tensor_init(&x, GROVE_I64, 1, s2, huge);
  x.shape[0] = 1;
  ck_assert_status(grove_module_call(m, &f, &x, &y), GROVE_E_RANGE);

  /* Float indices are a dtype error, as in torch. */
  float fi[3] = {0, 1, 2};
  grove_tensor_init(&x, GROVE_F32, 1, s3, fi);
  ck_assert_status(grove_module_call(m, &f, &x, &y), GROVE_E_DTYPE);
  ck_assert_ptr_nonnull(strstr(err.msg, "int64 or int32"));

  /* Indices of 8 dims would need a 9-d output. */
  int64_t s8[8] = {1, 1, 1, 1, 1, 1, 1, 1};
  int64_t one[1] = {1};
  grove_tensor_init(&x, GROVE_I64, 8, s8, one);
  ck_assert_status(grove_module_call(m, &f, &x, &y), GROVE_E_SHAPE);

  grove_arena_free(a);
  grove_module_release(m);
  fixture_fini(&fx);

  grove_module *e;
  ck_assert_status(grove_embedding_new(10, 4, 10, &e, &err), GROVE_E_INVALID_ARGUMENT);
  ck_assert_ptr_null(e);
  ck_assert_status(grove_embedding_new(0, 4, -1, &e, &err), GROVE_E_INVALID_ARGUMENT);
}
END_TEST

/* ------------------------------------------------------------ BatchNorm loading */

static grove_state_dict *bn_sd(bool with_nbt, int version) {
  grove_err err = {0};
  grove_module *m;
  ck_assert_ok(grove_batch_norm1d_new(3, 1e-5, 0.1, true, true, &m, &err), &err);
  grove_state_dict *sd = grove_sd_new();
  ck_assert_ok(grove_module_state_dict(m, NULL, sd, &err), &err);
  grove_module_release(m);
  if (!with_nbt) ck_assert(grove_sd_remove(sd, "num_batches_tracked"));
  /* Replace the recorded version (2) with the one asked for; -1: none.  A
   * fresh map keeps only the tensors. */
  grove_state_dict *out = grove_sd_new();
  for (size_t i = 0; i < grove_sd_count(sd); i++)
    ck_assert_ok(grove_sd_set(out, grove_sd_key(sd, i), grove_sd_tensor(sd, i), &err), &err);
  if (version >= 0) ck_assert_ok(grove_sd_set_version(out, "", version, &err), &err);
  grove_sd_free(sd);
  return out;
}

START_TEST(test_batchnorm_num_batches_tracked) {
  grove_err err = {0};
  grove_module *m;
  ck_assert_ok(grove_batch_norm1d_new(3, 1e-5, 0.1, true, true, &m, &err), &err);
  ck_assert_int_eq(m->type->version, 2);
  grove_load_opts strict = {.strict = true}, lax = {.strict = false};

  /* No metadata (a safetensors file) or version 1: the key is added. */
  int versions[2] = {-1, 1};
  for (int i = 0; i < 2; i++) {
    grove_state_dict *sd = bn_sd(false, versions[i]);
    grove_load_report rep = {0};
    ck_assert_ok(grove_module_load_state_dict(m, sd, &strict, &rep, &err), &err);
    ck_assert_uint_eq(rep.n_missing, 0);
    grove_load_report_fini(&rep);
    ck_assert_ok(grove_module_load_state_dict(m, sd, &lax, &rep, &err), &err);
    ck_assert_uint_eq(rep.n_missing, 0);
    grove_load_report_fini(&rep);
    grove_sd_free(sd);
  }
  /* The caller's map is not modified by the fixup. */
  grove_state_dict *sd = bn_sd(false, -1);
  ck_assert_ok(grove_module_load_state_dict(m, sd, NULL, NULL, &err), &err);
  ck_assert(!grove_sd_contains(sd, "num_batches_tracked"));
  grove_sd_free(sd);

  /* Version 2 says the key should be there: missing under strict, as torch. */
  sd = bn_sd(false, 2);
  grove_load_report rep = {0};
  ck_assert_status(grove_module_load_state_dict(m, sd, &strict, &rep, &err), GROVE_E_STATE_DICT);
  ck_assert_uint_eq(rep.n_missing, 1);
  ck_assert_str_eq(rep.missing[0], "num_batches_tracked");
  grove_load_report_fini(&rep);
  ck_assert_ok(grove_module_load_state_dict(m, sd, &lax, &rep, &err), &err);
  grove_load_report_fini(&rep);
  grove_sd_free(sd);

  /* Nested: the fixup uses the module's prefix. */
  grove_module *seq;
  ck_assert_ok(grove_sequential_new(&seq, &err), &err);
  grove_module_retain(m);
  add(seq, "bn", GROVE_OK, &m, &err);
  grove_state_dict *flat = bn_sd(false, -1), *nested = grove_sd_new();
  for (size_t i = 0; i < grove_sd_count(flat); i++) {
    char key[64];
    snprintf(key, sizeof key, "bn.%s", grove_sd_key(flat, i));
    ck_assert_ok(grove_sd_set(nested, key, grove_sd_tensor(flat, i), &err), &err);
  }
  ck_assert_ok(grove_module_load_state_dict(seq, nested, &strict, NULL, &err), &err);
  grove_sd_free(flat);
  grove_sd_free(nested);
  grove_module_release(seq);
  grove_module_release(m);

  /* track_running_stats=False: nothing to add, nothing expected. */
  ck_assert_ok(grove_batch_norm1d_new(3, 1e-5, 0.1, true, false, &m, &err), &err);
  sd = grove_sd_new();
  ck_assert_ok(grove_module_state_dict(m, NULL, sd, &err), &err);
  ck_assert_uint_eq(grove_sd_count(sd), 2);
  ck_assert_ok(grove_module_load_state_dict(m, sd, &strict, NULL, &err), &err);
  grove_sd_free(sd);
  grove_module_release(m);
}
END_TEST

/* ------------------------------------------------------------ state_dict layout */

static void assert_keys(grove_module *m, const char *const *want) {
  grove_err err = {0};
  grove_state_dict *sd = grove_sd_new();
  ck_assert_ok(grove_module_state_dict(m, NULL, sd, &err), &err);
  size_t n = 0;
  while (want[n]) n++;
  ck_assert_uint_eq(grove_sd_count(sd), n);
  for (size_t i = 0; i < n; i++) ck_assert_str_eq(grove_sd_key(sd, i), want[i]);
  grove_sd_free(sd);
  grove_module_release(m);
}

START_TEST(test_state_dict_layout) {
  grove_err err = {0};
  grove_module *m;
  ck_assert_ok(grove_linear_new(3, 2, true, &m, &err), &err);
  ck_assert_str_eq(grove_module_type_name(m), "Linear");
  assert_keys(m, (const char *const[]){"weight", "bias", NULL});
  ck_assert_ok(grove_linear_new(3, 2, false, &m, &err), &err);
  ck_assert_uint_eq(m->nparams, 2); /* bias registered as None */
  ck_assert_ptr_null(m->params[1].tensor);
  assert_keys(m, (const char *const[]){"weight", NULL});
  ck_assert_ok(grove_batch_norm1d_new(4, 1e-5, 0.1, true, true, &m, &err), &err);
  grove_tensor *nbt = grove_module_buffer(m, "num_batches_tracked");
  ck_assert_int_eq(nbt->dtype, GROVE_I64);
  ck_assert_int_eq(nbt->ndim, 0);
  ck_assert_float_eq(((float *)grove_module_buffer(m, "running_var")->data)[3], 1.0f);
  ck_assert_float_eq(((float *)grove_module_param(m, "weight")->data)[0], 1.0f);
  assert_keys(m, (const char *const[]){"weight", "bias", "running_mean", "running_var",
                                       "num_batches_tracked", NULL});
  ck_assert_ok(grove_batch_norm1d_new(4, 1e-5, 0.1, false, true, &m, &err), &err);
  assert_keys(m, (const char *const[]){"running_mean", "running_var", "num_batches_tracked", NULL});
  ck_assert_ok(grove_batch_norm1d_new(4, 1e-5, 0.1, false, false, &m, &err), &err);
  ck_assert_uint_eq(m->nbuffers, 3);
  assert_keys(m, (const char *const[]){NULL});
  int64_t ns[2] = {2, 3};
  ck_assert_ok(grove_layer_norm_new(2, ns, 1e-5, true, &m, &err), &err);
  ck_assert_int_eq(grove_module_param(m, "weight")->ndim, 2);
  assert_keys(m, (const char *const[]){"weight", "bias", NULL});
  ck_assert_ok(grove_embedding_new(5, 2, -1, &m, &err), &err);
  assert_keys(m, (const char *const[]){"weight", NULL});
  ck_assert_ok(grove_relu_new(&m, &err), &err);
  assert_keys(m, (const char *const[]){NULL});
}
END_TEST

/* ------------------------------------------------------------ containers */

START_TEST(test_containers) {
  grove_err err = {0};
  grove_arena *a = grove_arena_new(0);
  grove_fwd f = {.arena = a, .err = &err};
  grove_module *m;
  float data[3] = {1, -2, 3};
  int64_t s3[1] = {3};
  grove_tensor x, y;
  grove_tensor_init(&x, GROVE_F32, 1, s3, data);

  /* An empty Sequential returns its input itself. */
  ck_assert_ok(grove_sequential_new(&m, &err), &err);
  ck_assert_ok(grove_module_call(m, &f, &x, &y), &err);
  ck_assert_ptr_eq(y.data, data);
  /* A None child cannot be called. */
  ck_assert_ok(grove_module_add_module(m, "0", NULL, &err), &err);
  ck_assert_status(grove_module_call(m, &f, &x, &y), GROVE_E_NOT_CALLABLE);
  grove_module_release(m);

  /* Identity and eval Dropout pass the input itself through. */
  ck_assert_ok(grove_identity_new(&m, &err), &err);
  ck_assert_ok(grove_module_call(m, &f, &x, &y), &err);
  ck_assert_ptr_eq(y.data, data);
  grove_module_release(m);

  /* Activations never write into their input. */
  ck_assert_ok(grove_relu_new(&m, &err), &err);
  ck_assert_ok(grove_module_call(m, &f, &x, &y), &err);
  ck_assert_ptr_ne(y.data, data);
  ck_assert_float_eq(data[1], -2.0f);
  ck_assert_float_eq(((float *)y.data)[1], 0.0f);
  grove_module_release(m);

  ck_assert_ok(grove_module_list_new(&m, &err), &err);
  ck_assert_str_eq(grove_module_type_name(m), "ModuleList");
  ck_assert_status(grove_module_call(m, &f, &x, &y), GROVE_E_NOT_CALLABLE);
  grove_module_release(m);
  ck_assert_ok(grove_module_dict_new(&m, &err), &err);
  ck_assert_status(grove_module_call(m, &f, &x, &y), GROVE_E_NOT_CALLABLE);
  grove_module_release(m);

  /* A Linear as the last child (nothing to fuse with) and a ReLU first. */
  ck_assert_ok(grove_sequential_new(&m, &err), &err);
  grove_module *c;
  add(m, "0", grove_relu_new(&c, &err), &c, &err);
  add(m, "1", grove_linear_new(3, 2, true, &c, &err), &c, &err);
  ck_assert_ok(grove_module_call(m, &f, &x, &y), &err);
  ck_assert_int_eq(y.shape[0], 2);
  ck_assert_float_eq(((float *)y.data)[0], 0.0f); /* zero weights */
  grove_module_release(m);
  grove_arena_free(a);
}
END_TEST

START_TEST(test_constructor_errors) {
  grove_err err = {0};
  grove_module *m = (grove_module *)&err; /* must be reset to NULL */
  ck_assert_status(grove_linear_new(0, 3, true, &m, &err), GROVE_E_INVALID_ARGUMENT);
  ck_assert_ptr_null(m);
  ck_assert_status(grove_linear_new(3, -1, true, &m, &err), GROVE_E_INVALID_ARGUMENT);
  ck_assert_status(grove_dropout_new(1.5, &m, &err), GROVE_E_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(err.msg, "between 0 and 1"));
  ck_assert_status(grove_dropout_new(NAN, &m, &err), GROVE_E_INVALID_ARGUMENT);
  ck_assert_status(grove_gelu_new("erf", &m, &err), GROVE_E_INVALID_ARGUMENT);
  ck_assert_status(grove_leaky_relu_new(INFINITY, &m, &err), GROVE_E_INVALID_ARGUMENT);
  ck_assert_status(grove_batch_norm1d_new(0, 1e-5, 0.1, true, true, &m, &err),
                   GROVE_E_INVALID_ARGUMENT);
  ck_assert_status(grove_batch_norm1d_new(3, -1, 0.1, true, true, &m, &err),
                   GROVE_E_INVALID_ARGUMENT);
  int64_t bad[2] = {3, 0};
  ck_assert_status(grove_layer_norm_new(2, bad, 1e-5, true, &m, &err), GROVE_E_INVALID_ARGUMENT);
  ck_assert_status(grove_layer_norm_new(0, bad, 1e-5, true, &m, &err), GROVE_E_INVALID_ARGUMENT);
  ck_assert_ptr_null(m);
}
END_TEST

/* ------------------------------------------------------------ model.json builders */

/* Builds from a JSON text through the registry at path "$.module". */
static grove_status from_json(const char *text, grove_module **m, grove_err *err) {
  json_error_t jerr;
  json_t *obj = json_loads(text, 0, &jerr);
  ck_assert_msg(obj != NULL, "bad test JSON %s: %s", text, jerr.text);
  const char *type = json_string_value(json_object_get(obj, "type"));
  const grove__layer_def *def = grove__layer_find(type);
  ck_assert_msg(def != NULL, "no def for %s", type);
  *m = NULL;
  grove_status s = def->from_json(obj, "$.module", m, err);
  json_decref(obj);
  return s;
}

static void json_ok(const char *text, const char *type) {
  grove_err err = {0};
  grove_module *m;
  ck_assert_ok(from_json(text, &m, &err), &err);
  ck_assert_str_eq(grove_module_type_name(m), type);
  grove_module_release(m);
}

static void json_err(const char *text, grove_status code, const char *msg) {
  grove_err err = {0};
  grove_module *m;
  ck_assert_status(from_json(text, &m, &err), code);
  ck_assert_ptr_null(m);
  ck_assert_msg(strcmp(err.msg, msg) == 0, "%s:\n got  \"%s\"\n want \"%s\"", text, err.msg, msg);
}

START_TEST(test_registry) {
  size_t n;
  const grove__layer_def *defs = grove__layer_defs(&n);
  ck_assert_uint_eq(n, 89);
  for (size_t i = 0; i < n; i++) ck_assert_ptr_eq(grove__layer_find(defs[i].type), &defs[i]);
  ck_assert_ptr_null(grove__layer_find("Conv3d"));
  ck_assert_ptr_null(grove__layer_find("linear"));
  ck_assert_ptr_null(grove__layer_find(NULL));

  /* Minimal and full argument sets of every type; spec.c's keys pass. */
  json_ok("{\"type\": \"Sequential\", \"children\": []}", "Sequential");
  json_ok("{\"type\": \"ModuleList\", \"children\": []}", "ModuleList");
  json_ok("{\"type\": \"ModuleDict\", \"children\": {}}", "ModuleDict");
  json_ok("{\"type\": \"Linear\", \"in_features\": 3, \"out_features\": 2}", "Linear");
  json_ok(
      "{\"type\": \"Linear\", \"in_features\": 3, \"out_features\": 2, \"bias\": false, "
      "\"tied\": {\"weight\": \"x.weight\"}}",
      "Linear");
  json_ok("{\"type\": \"Identity\"}", "Identity");
  json_ok("{\"type\": \"LSTM\", \"input_size\": 3, \"hidden_size\": 4}", "LSTM");
  json_ok(
      "{\"type\": \"LSTM\", \"input_size\": 3, \"hidden_size\": 4, \"num_layers\": 2, "
      "\"bias\": false, \"batch_first\": true, \"dropout\": 0.5, \"bidirectional\": true, "
      "\"proj_size\": 2}",
      "LSTM");
  json_ok("{\"type\": \"GRU\", \"input_size\": 3, \"hidden_size\": 4}", "GRU");
  json_ok("{\"type\": \"RNN\", \"input_size\": 3, \"hidden_size\": 4, \"nonlinearity\": "
          "\"relu\"}",
          "RNN");
  json_ok("{\"type\": \"EmbeddingBag\", \"num_embeddings\": 5, \"embedding_dim\": 2, "
          "\"mode\": \"max\", \"include_last_offset\": true, \"padding_idx\": -1}",
          "EmbeddingBag");
  json_ok("{\"type\": \"Flatten\", \"start_dim\": 0, \"end_dim\": -2}", "Flatten");
  json_ok("{\"type\": \"Dropout\", \"p\": 0, \"inplace\": true}", "Dropout");
  json_ok("{\"type\": \"Dropout\", \"p\": 1.0}", "Dropout");
  json_ok("{\"type\": \"ReLU\", \"inplace\": true}", "ReLU");
  json_ok("{\"type\": \"LeakyReLU\", \"negative_slope\": 0.2, \"inplace\": false}", "LeakyReLU");
  json_ok("{\"type\": \"GELU\", \"approximate\": \"tanh\"}", "GELU");
  json_ok("{\"type\": \"SiLU\"}", "SiLU");
  json_ok("{\"type\": \"Sigmoid\"}", "Sigmoid");
  json_ok("{\"type\": \"Tanh\"}", "Tanh");
  /* The zoo's layers (#18). */
  json_ok("{\"type\": \"ReLU6\", \"inplace\": true}", "ReLU6");
  json_ok("{\"type\": \"Hardswish\"}", "Hardswish");
  json_ok("{\"type\": \"Hardsigmoid\"}", "Hardsigmoid");
  json_ok("{\"type\": \"Hardtanh\", \"min_val\": -2, \"max_val\": 2.5}", "Hardtanh");
  json_ok("{\"type\": \"ELU\", \"alpha\": 0.5}", "ELU");
  json_ok("{\"type\": \"SELU\"}", "SELU");
  json_ok("{\"type\": \"CELU\", \"alpha\": 2}", "CELU");
  json_ok("{\"type\": \"Softplus\", \"beta\": 2, \"threshold\": 10}", "Softplus");
  json_ok("{\"type\": \"Mish\"}", "Mish");
  json_ok("{\"type\": \"PixelShuffle\", \"upscale_factor\": 3}", "PixelShuffle");
  json_ok("{\"type\": \"LocalResponseNorm\", \"size\": 5, \"alpha\": 1e-3}",
          "LocalResponseNorm");
  json_ok(
      "{\"type\": \"Upsample\", \"size\": [4, 6], \"mode\": \"bilinear\", "
      "\"align_corners\": false}",
      "Upsample");
  json_ok("{\"type\": \"Upsample\", \"scale_factor\": 2}", "Upsample");
  json_ok("{\"type\": \"ConstantPad1d\", \"padding\": [1, 2], \"value\": 0.5}", "ConstantPad1d");
  json_ok("{\"type\": \"ConstantPad2d\", \"padding\": [1, 2, 0, 0], \"value\": -1}",
          "ConstantPad2d");
  json_ok("{\"type\": \"ConstantPad3d\", \"padding\": [1, 1, 1, 1, 1, 1], \"value\": 0}",
          "ConstantPad3d");
  json_ok("{\"type\": \"ZeroPad2d\", \"padding\": [1, 1, 2, 2]}", "ZeroPad2d");
  json_err("{\"type\": \"ZeroPad2d\", \"padding\": [1, 1], \"value\": 1}", GROVE_E_SPEC,
           "$.module.value: unknown argument of ZeroPad2d (it takes: padding)");
  json_ok("{\"type\": \"GroupNorm\", \"num_groups\": 2, \"num_channels\": 6}", "GroupNorm");
  json_ok("{\"type\": \"GroupNorm\", \"num_groups\": 3, \"num_channels\": 6, \"eps\": 1e-6, "
          "\"affine\": false}",
          "GroupNorm");
  json_ok("{\"type\": \"InstanceNorm2d\", \"num_features\": 4}", "InstanceNorm2d");
  json_ok("{\"type\": \"InstanceNorm1d\", \"num_features\": 4, \"affine\": true, "
          "\"track_running_stats\": true, \"momentum\": null}",
          "InstanceNorm1d");
  json_ok("{\"type\": \"PReLU\", \"num_parameters\": 8, \"init\": 0.1}", "PReLU");
  json_err("{\"type\": \"GroupNorm\", \"num_groups\": 4, \"num_channels\": 6}", GROVE_E_SPEC,
           "$.module: GroupNorm: num_channels (6) must be divisible by num_groups (4)");
  json_ok("{\"type\": \"Softmax\", \"dim\": -1}", "Softmax");
  json_ok("{\"type\": \"Softmax\", \"dim\": null}", "Softmax");
  json_ok("{\"type\": \"LogSoftmax\"}", "LogSoftmax");
  json_ok(
      "{\"type\": \"BatchNorm1d\", \"num_features\": 4, \"eps\": 0.001, \"momentum\": null, "
      "\"affine\": false, \"track_running_stats\": false}",
      "BatchNorm1d");
  json_ok(
      "{\"type\": \"LayerNorm\", \"normalized_shape\": [2, 3], \"eps\": 1e-6, "
      "\"elementwise_affine\": true}",
      "LayerNorm");
  json_ok("{\"type\": \"LayerNorm\", \"normalized_shape\": 5}", "LayerNorm");
  json_ok(
      "{\"type\": \"Embedding\", \"num_embeddings\": 5, \"embedding_dim\": 2, "
      "\"padding_idx\": null, \"max_norm\": null, \"norm_type\": 2.0, "
      "\"scale_grad_by_freq\": false, \"sparse\": true}",
      "Embedding");
}
END_TEST

START_TEST(test_json_values) {
  grove_err err = {0};
  grove_module *m;
  /* Defaults are torch's. */
  ck_assert_ok(
      from_json("{\"type\": \"Linear\", \"in_features\": 3, \"out_features\": 2}", &m, &err), &err);
  ck_assert_ptr_nonnull(grove_module_param(m, "bias"));
  grove_module_release(m);
  ck_assert_ok(from_json("{\"type\": \"BatchNorm1d\", \"num_features\": 3}", &m, &err), &err);
  ck_assert_ptr_nonnull(grove_module_param(m, "weight"));
  ck_assert_ptr_nonnull(grove_module_buffer(m, "num_batches_tracked"));
  grove_module_release(m);
  /* A negative padding_idx counts from the end, as in torch. */
  ck_assert_ok(from_json("{\"type\": \"Embedding\", \"num_embeddings\": 10, \"embedding_dim\": 2, "
                         "\"padding_idx\": -1}",
                         &m, &err),
               &err);
  ck_assert_int_eq(grove__embedding_padding_idx(m), 9);
  grove_module_release(m);
  ck_assert_ok(from_json("{\"type\": \"Embedding\", \"num_embeddings\": 10, \"embedding_dim\": 2}",
                         &m, &err),
               &err);
  ck_assert_int_eq(grove__embedding_padding_idx(m), -1);
  grove_module_release(m);
  /* torch >= 2.1's LayerNorm(bias=False). */
  ck_assert_ok(
      from_json("{\"type\": \"LayerNorm\", \"normalized_shape\": [4], \"bias\": false}", &m, &err),
      &err);
  ck_assert_ptr_nonnull(grove_module_param(m, "weight"));
  ck_assert_ptr_null(grove_module_param(m, "bias"));
  ck_assert_uint_eq(m->nparams, 2);
  grove_module_release(m);
}
END_TEST

START_TEST(test_json_errors) {
  /* Wrong type of argument. */
  json_err("{\"type\": \"Linear\", \"in_features\": \"3\", \"out_features\": 2}", GROVE_E_SPEC,
           "$.module.in_features: expected a positive integer, got \"3\"");
  json_err("{\"type\": \"Linear\", \"in_features\": 3, \"out_features\": -3}", GROVE_E_SPEC,
           "$.module.out_features: expected a positive integer, got -3");
  json_err("{\"type\": \"Linear\", \"in_features\": 3.5, \"out_features\": 3}", GROVE_E_SPEC,
           "$.module.in_features: expected a positive integer, got 3.5");
  json_err("{\"type\": \"Linear\", \"in_features\": 3, \"out_features\": 2, \"bias\": 1}",
           GROVE_E_SPEC, "$.module.bias: expected true or false, got 1");
  json_err("{\"type\": \"Dropout\", \"p\": 1.5}", GROVE_E_SPEC,
           "$.module.p: expected a number in [0, 1], got 1.5");
  json_err("{\"type\": \"Dropout\", \"p\": \"high\"}", GROVE_E_SPEC,
           "$.module.p: expected a number in [0, 1], got \"high\"");
  json_err("{\"type\": \"ReLU\", \"inplace\": null}", GROVE_E_SPEC,
           "$.module.inplace: expected true or false, got null");
  json_err("{\"type\": \"LeakyReLU\", \"negative_slope\": [0.1]}", GROVE_E_SPEC,
           "$.module.negative_slope: expected a number, got an array of 1 item");
  json_err("{\"type\": \"GELU\", \"approximate\": \"erf\"}", GROVE_E_SPEC,
           "$.module.approximate: expected one of \"none\", \"tanh\", got \"erf\"");
  json_err("{\"type\": \"GELU\", \"approximate\": true}", GROVE_E_SPEC,
           "$.module.approximate: expected one of \"none\", \"tanh\", got true");
  json_err("{\"type\": \"Softmax\", \"dim\": 1.0}", GROVE_E_SPEC,
           "$.module.dim: expected an integer in [-8, 7] or null, got 1.0");
  json_err("{\"type\": \"LogSoftmax\", \"dim\": 9}", GROVE_E_SPEC,
           "$.module.dim: expected an integer in [-8, 7] or null, got 9");
  json_err("{\"type\": \"Flatten\", \"start_dim\": 8}", GROVE_E_SPEC,
           "$.module.start_dim: expected an integer in [-8, 7], got 8");
  json_err("{\"type\": \"Flatten\", \"end_dim\": {}}", GROVE_E_SPEC,
           "$.module.end_dim: expected an integer in [-8, 7], got an object");
  json_err("{\"type\": \"BatchNorm1d\", \"num_features\": 0}", GROVE_E_SPEC,
           "$.module.num_features: expected a positive integer, got 0");
  json_err("{\"type\": \"BatchNorm1d\", \"num_features\": 3, \"eps\": -1}", GROVE_E_SPEC,
           "$.module.eps: expected a non-negative number, got -1");
  json_err("{\"type\": \"BatchNorm1d\", \"num_features\": 3, \"momentum\": \"0.1\"}", GROVE_E_SPEC,
           "$.module.momentum: expected a number or null, got \"0.1\"");
  json_err("{\"type\": \"BatchNorm1d\", \"num_features\": 3, \"affine\": \"yes\"}", GROVE_E_SPEC,
           "$.module.affine: expected true or false, got \"yes\"");
  json_err("{\"type\": \"LayerNorm\", \"normalized_shape\": [4, 0]}", GROVE_E_SPEC,
           "$.module.normalized_shape[1]: expected a positive integer, got 0");
  json_err("{\"type\": \"LayerNorm\", \"normalized_shape\": []}", GROVE_E_SPEC,
           "$.module.normalized_shape: expected a positive integer or a list of 1 to 8 positive "
           "integers, got an array of 0 items");
  json_err("{\"type\": \"LayerNorm\", \"normalized_shape\": \"4\"}", GROVE_E_SPEC,
           "$.module.normalized_shape: expected a positive integer or a list of 1 to 8 positive "
           "integers, got \"4\"");
  json_err("{\"type\": \"LayerNorm\", \"normalized_shape\": -4}", GROVE_E_SPEC,
           "$.module.normalized_shape: expected a positive integer, got -4");
  json_err("{\"type\": \"LayerNorm\", \"normalized_shape\": 4, \"elementwise_affine\": 0}",
           GROVE_E_SPEC, "$.module.elementwise_affine: expected true or false, got 0");
  json_err(
      "{\"type\": \"Embedding\", \"num_embeddings\": 10, \"embedding_dim\": 2, "
      "\"padding_idx\": 10}",
      GROVE_E_SPEC, "$.module.padding_idx: expected an integer in [-10, 9] or null, got 10");
  json_err(
      "{\"type\": \"Embedding\", \"num_embeddings\": 10, \"embedding_dim\": 2, "
      "\"padding_idx\": -11}",
      GROVE_E_SPEC, "$.module.padding_idx: expected an integer in [-10, 9] or null, got -11");
  json_err(
      "{\"type\": \"Embedding\", \"num_embeddings\": 10, \"embedding_dim\": 2, "
      "\"sparse\": \"no\"}",
      GROVE_E_SPEC, "$.module.sparse: expected true or false, got \"no\"");
  json_err(
      "{\"type\": \"Embedding\", \"num_embeddings\": 10, \"embedding_dim\": 2, "
      "\"norm_type\": null}",
      GROVE_E_SPEC, "$.module.norm_type: expected a number, got null");
  json_err(
      "{\"type\": \"Embedding\", \"num_embeddings\": 10, \"embedding_dim\": 2, "
      "\"scale_grad_by_freq\": 1}",
      GROVE_E_SPEC, "$.module.scale_grad_by_freq: expected true or false, got 1");

  /* Unknown keys, with and without arguments to suggest. */
  json_err("{\"type\": \"Linear\", \"in_features\": 3, \"out_feature\": 2}", GROVE_E_SPEC,
           "$.module.out_feature: unknown argument of Linear (it takes: in_features, "
           "out_features, bias)");
  json_err("{\"type\": \"Sigmoid\", \"inplace\": true}", GROVE_E_SPEC,
           "$.module.inplace: unknown argument (Sigmoid takes no arguments)");
  json_err("{\"type\": \"Sequential\", \"dim\": 1}", GROVE_E_SPEC,
           "$.module.dim: unknown argument (Sequential takes no arguments)");
  json_err(
      "{\"type\": \"Embedding\", \"num_embeddings\": 10, \"embedding_dim\": 2, "
      "\"_weight\": null}",
      GROVE_E_SPEC,
      "$.module._weight: unknown argument of Embedding (it takes: num_embeddings, "
      "embedding_dim, padding_idx, max_norm, norm_type, scale_grad_by_freq, sparse)");

  /* Missing required arguments. */
  json_err("{\"type\": \"Linear\", \"in_features\": 3}", GROVE_E_SPEC,
           "$.module.out_features: missing required argument of Linear");
  json_err("{\"type\": \"BatchNorm1d\"}", GROVE_E_SPEC,
           "$.module.num_features: missing required argument of BatchNorm1d");
  json_err("{\"type\": \"LayerNorm\"}", GROVE_E_SPEC,
           "$.module.normalized_shape: missing required argument of LayerNorm");
  json_err("{\"type\": \"Embedding\", \"embedding_dim\": 2}", GROVE_E_SPEC,
           "$.module.num_embeddings: missing required argument of Embedding");
  json_err("{\"type\": \"LSTM\", \"input_size\": 2}", GROVE_E_SPEC,
           "$.module.hidden_size: missing required argument of LSTM");
  json_err("{\"type\": \"LSTM\", \"input_size\": 2, \"hidden_size\": 3, \"proj_size\": 3}",
           GROVE_E_SPEC,
           "$.module: LSTM: proj_size must be 0, or (LSTM only) positive and smaller than "
           "hidden_size 3, got 3");
  json_err("{\"type\": \"EmbeddingBag\", \"num_embeddings\": 4, \"embedding_dim\": 2, "
           "\"max_norm\": 1.0}",
           GROVE_E_UNSUPPORTED,
           "$.module.max_norm: EmbeddingBag with max_norm is not supported (it renormalises the "
           "weight during forward); export with max_norm=None");

  /* Values each reader accepts but the constructor cannot build. */
  json_err(
      "{\"type\": \"Linear\", \"in_features\": 1099511627776, "
      "\"out_features\": 1099511627776}",
      GROVE_E_SPEC, "$.module: Linear: 1099511627776 x 1099511627776 weights are too many");
  json_err("{\"type\": \"BatchNorm1d\", \"num_features\": 9223372036854775807}", GROVE_E_SPEC,
           "$.module: BatchNorm1d: num_features 9223372036854775807 is too large");

  /* Known but refused. */
  json_err(
      "{\"type\": \"Embedding\", \"num_embeddings\": 10, \"embedding_dim\": 2, "
      "\"max_norm\": 1.0}",
      GROVE_E_UNSUPPORTED,
      "$.module.max_norm: Embedding with max_norm is not supported (it renormalises the "
      "weight during forward); export with max_norm=None");
}
END_TEST

START_TEST(test_json_not_an_object) {
  grove_err err = {0};
  grove_module *m = NULL;
  json_t *arr = json_array();
  ck_assert_status(grove__layer_find("Linear")->from_json(arr, "$.module.children[1]", &m, &err),
                   GROVE_E_SPEC);
  ck_assert_str_eq(err.msg, "$.module.children[1]: expected an object describing a Linear");
  ck_assert_ptr_null(m);
  json_decref(arr);
}
END_TEST

/* The exact GELU (grove__elementwise, the transformers' feed-forward path:
 * a vector erfc where the CPU has AVX2 or AVX-512) against
 * 0.5 x (1 + erf(x / sqrt 2)) in double, on a dense grid of [-10, 10]
 * (200,001 points: vector tails and thread chunks included) and the
 * special values: within 3e-7 + 2e-7 |y|, about what torch's own float
 * formula with erff reaches (4.5e-7 at x = 3.2). */
START_TEST(test_gelu_dense) {
  enum { N = 200001 };
  float *x = malloc(N * sizeof(float)), *y = malloc(N * sizeof(float));
  ck_assert(x && y);
  for (int i = 0; i < N; i++) x[i] = -10.0f + 20.0f * (float)i / (float)(N - 1);
  grove__elementwise(GROVE__ELT_GELU, 0.0f, x, y, N);
  for (int i = 0; i < N; i++) {
    const double want = 0.5 * x[i] * (1.0 + erf(x[i] / sqrt(2.0)));
    ck_assert_msg(fabs(y[i] - want) <= 3e-7 + 2e-7 * fabs(want), "gelu(%.9g) = %.9g, want %.9g",
                  x[i], y[i], want);
  }
  const float sp[7] = {NAN, INFINITY, -INFINITY, 0.0f, -0.0f, 1e30f, -1e30f};
  float o[7];
  grove__elementwise(GROVE__ELT_GELU, 0.0f, sp, o, 7);
  ck_assert(isnan(o[0]));
  ck_assert(o[1] == INFINITY);
  ck_assert(isnan(o[2])); /* torch: -inf * 0.5 * (1 + erf(-inf)) = -inf * 0 */
  ck_assert(o[3] == 0.0f && !signbit(o[3]));
  ck_assert(o[4] == 0.0f && signbit(o[4]));
  ck_assert(o[5] == 1e30f);
  ck_assert(o[6] == 0.0f);
  free(x);
  free(y);
}
END_TEST

/* ------------------------------------------------------------ suite */

Suite *layers_suite(void) {
  Suite *s = suite_create("layers");
  TCase *tc = tcase_create("parity");
  tcase_add_loop_test(tc, test_parity, 0, NCASES);
  tcase_add_test(tc, test_fused_matches_unfused);
  tcase_add_test(tc, test_global_hook_sees_every_child);
  tcase_add_test(tc, test_strided_inputs);
  tcase_add_test(tc, test_gelu_dense);
  suite_add_tcase(s, tc);
  tc = tcase_create("behaviour");
  tcase_add_test(tc, test_shape_errors);
  tcase_add_test(tc, test_training_refused);
  tcase_add_test(tc, test_embedding_range_and_padding);
  tcase_add_test(tc, test_batchnorm_num_batches_tracked);
  tcase_add_test(tc, test_state_dict_layout);
  tcase_add_test(tc, test_containers);
  tcase_add_test(tc, test_constructor_errors);
  suite_add_tcase(s, tc);
  tc = tcase_create("model.json");
  tcase_add_test(tc, test_registry);
  tcase_add_test(tc, test_json_values);
  tcase_add_test(tc, test_json_errors);
  tcase_add_test(tc, test_json_not_an_object);
  suite_add_tcase(s, tc);
  return s;
}

GROVE_TEST_MAIN(layers_suite)
