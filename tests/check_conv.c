/* check_conv.c: Conv1d, Conv2d, BatchNorm2d and the 2-d pools against
 * PyTorch, plus their errors.
 *
 * Parity: tests/fixtures_gen/conv.py writes conv_<case>.safetensors (the torch
 * layer's state_dict under "w.", the input "x", torch's output "y") and
 * conv_<case>.json (the model.json object the exporter writes for it).  Each
 * case builds the layer twice, with the C constructor (the table below
 * mirrors CASES in conv.py) and from the JSON through grove_model_from_spec,
 * loads the weights strictly and compares both outputs with torch (rtol 1e-4,
 * atol 1e-5); a second forward after an arena reset must not grow the arena
 * and must give the same bits, and a forward on 2 compute threads must give
 * the same bits again.  test_threads_bitwise runs larger random layers
 * (enough work for the transforms, patch rows, transposes and pools to be
 * cut between threads) on 1, 2 and 3 compute threads and wants identical
 * bits. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "graph.h"
#include "layers_internal.h"
#include "testutil.h"

#define RTOL 1e-4
#define ATOL 1e-5

static const char *const cases[] = {
    "conv2d_basic",
    "conv2d_b1_pad",
    "conv2d_stride",
    "conv2d_dil",
    "conv2d_groups",
    "conv2d_dw",
    "conv2d_1x1",
    "conv2d_1x1_stride",
    "conv2d_same_even",
    "conv2d_same_dil",
    "conv2d_valid",
    "conv2d_unbatched",
    "conv2d_many",
    "conv2d_chunked",
    "conv2d_wide",
    "conv2d_groups_rows",
    "conv2d_1x1_rows",
    "conv2d_stride_rows",
    "conv1d_rows",
    "conv2d_dw_s1",
    "conv2d_dw5_s2",
    "conv2d_dw_dil",
    "conv2d_dw_rect",
    "conv2d_dw_same",
    "conv2d_dw_unbatched",
    "conv2d_dw_mult",
    "conv2d_dw_wide",
    "conv1d_basic",
    "conv1d_stride_pad",
    "conv1d_groups_dil",
    "conv1d_same",
    "conv1d_unbatched",
    "bn2d",
    "bn2d_b1",
    "bn2d_noaffine",
    "bn2d_nostats",
    "maxpool_2",
    "maxpool_odd",
    "maxpool_ceil",
    "maxpool_dil",
    "maxpool_unbatched",
    "avgpool_2",
    "avgpool_pad",
    "avgpool_pad_excl",
    "avgpool_ceil",
    "avgpool_div",
    "adapt_1",
    "adapt_odd",
    "adapt_none",
    "adapt_up",
    "maxpool1d",
    "maxpool1d_unbatched",
    "avgpool1d",
    "avgpool1d_incl",
    "adapt1d_avg",
    "adapt1d_max",
    "adaptmax",
    "adaptmax_none",
    "adaptmax_1",
    "avgpool_ceil_excl",
    "avgpool_div_ceil",
    "maxpool_ceil_pad_dil",
    "convt_basic",
    "convt_stride_opad",
    "convt_groups_dil",
    "convt_rect_opad",
    "convt_1x1",
    "convt_unbatched",
    "convt1d_basic",
    "convt1d_stride_opad",
    "convt1d_groups_dil",
    "convt1d_unbatched",
};
#define NCASES ((int)(sizeof cases / sizeof cases[0]))

static grove_conv_opts co(int64_t k0, int64_t k1, int64_t s0, int64_t s1, int64_t p0, int64_t p1,
                          int64_t d0, int64_t d1, int64_t groups, bool bias) {
  return (grove_conv_opts){.kernel_size = {k0, k1},
                           .stride = {s0, s1},
                           .padding = {p0, p1},
                           .dilation = {d0, d1},
                           .groups = groups,
                           .bias = bias};
}

static grove_module *build_case(const char *name, grove_err *err) {
  grove_module *m = NULL;
  grove_status s = GROVE_E_NOT_FOUND;
  grove_conv_opts o;
  const int64_t k2[2] = {2, 2}, k3[2] = {3, 3}, s1[2] = {1, 1}, s2[2] = {2, 2}, p1[2] = {1, 1};
  const int64_t k23[2] = {2, 3}, d2[2] = {2, 2};
#define CASE(n, call) else if (strcmp(name, n) == 0) s = (call)
  if (0) {
  }
  CASE("conv2d_basic",
       (o = co(3, 3, 1, 1, 0, 0, 1, 1, 1, true), grove_conv2d_new(3, 8, &o, &m, err)));
  CASE("conv2d_b1_pad",
       (o = co(3, 3, 1, 1, 1, 1, 1, 1, 1, true), grove_conv2d_new(3, 5, &o, &m, err)));
  CASE("conv2d_stride",
       (o = co(3, 5, 2, 1, 1, 2, 1, 1, 1, true), grove_conv2d_new(4, 6, &o, &m, err)));
  CASE("conv2d_dil",
       (o = co(3, 3, 1, 1, 2, 2, 2, 2, 1, true), grove_conv2d_new(2, 4, &o, &m, err)));
  CASE("conv2d_groups",
       (o = co(3, 3, 1, 1, 1, 1, 1, 1, 3, false), grove_conv2d_new(6, 9, &o, &m, err)));
  CASE("conv2d_dw", (o = co(3, 3, 2, 2, 0, 0, 1, 1, 4, true), grove_conv2d_new(4, 4, &o, &m, err)));
  CASE("conv2d_1x1",
       (o = co(1, 1, 1, 1, 0, 0, 1, 1, 1, true), grove_conv2d_new(8, 5, &o, &m, err)));
  CASE("conv2d_1x1_stride",
       (o = co(1, 1, 2, 2, 0, 0, 1, 1, 1, true), grove_conv2d_new(8, 5, &o, &m, err)));
  CASE("conv2d_same_even", (o = co(4, 4, 0, 0, 0, 0, 0, 0, 0, true), o.padding_same = true,
                            grove_conv2d_new(3, 4, &o, &m, err)));
  CASE("conv2d_same_dil", (o = co(3, 3, 1, 1, 0, 0, 2, 2, 1, true), o.padding_same = true,
                           grove_conv2d_new(3, 4, &o, &m, err)));
  CASE("conv2d_valid", (o = co(2, 2, 1, 1, 0, 0, 1, 1, 1, true), o.padding_valid = true,
                        grove_conv2d_new(3, 4, &o, &m, err)));
  CASE("conv2d_unbatched",
       (o = co(3, 3, 1, 1, 0, 0, 1, 1, 1, true), grove_conv2d_new(2, 3, &o, &m, err)));
  CASE("conv2d_many",
       (o = co(3, 3, 1, 1, 1, 1, 1, 1, 1, true), grove_conv2d_new(16, 12, &o, &m, err)));
  CASE("conv2d_chunked",
       (o = co(3, 3, 1, 1, 1, 1, 1, 1, 1, true), grove_conv2d_new(32, 4, &o, &m, err)));
  CASE("conv2d_wide",
       (o = co(3, 3, 1, 1, 1, 1, 1, 1, 1, true), grove_conv2d_new(16, 32, &o, &m, err)));
  CASE("conv2d_groups_rows",
       (o = co(3, 3, 1, 1, 1, 1, 1, 1, 2, false), grove_conv2d_new(16, 16, &o, &m, err)));
  CASE("conv2d_1x1_rows",
       (o = co(1, 1, 1, 1, 0, 0, 1, 1, 1, true), grove_conv2d_new(16, 32, &o, &m, err)));
  CASE("conv2d_stride_rows",
       (o = co(3, 3, 2, 2, 1, 1, 1, 1, 1, true), grove_conv2d_new(16, 16, &o, &m, err)));
  CASE("conv1d_rows",
       (o = co(3, 0, 1, 0, 2, 0, 2, 0, 1, true), grove_conv1d_new(16, 24, &o, &m, err)));
  CASE("conv2d_dw_s1",
       (o = co(3, 3, 1, 1, 1, 1, 1, 1, 20, true), grove_conv2d_new(20, 20, &o, &m, err)));
  CASE("conv2d_dw5_s2",
       (o = co(5, 5, 2, 2, 2, 2, 1, 1, 40, false), grove_conv2d_new(40, 40, &o, &m, err)));
  CASE("conv2d_dw_dil",
       (o = co(3, 3, 1, 1, 2, 2, 2, 2, 24, true), grove_conv2d_new(24, 24, &o, &m, err)));
  CASE("conv2d_dw_rect",
       (o = co(3, 5, 1, 2, 0, 1, 1, 1, 17, true), grove_conv2d_new(17, 17, &o, &m, err)));
  CASE("conv2d_dw_same", (o = co(4, 4, 1, 1, 0, 0, 1, 1, 16, true), o.padding_same = true,
                          grove_conv2d_new(16, 16, &o, &m, err)));
  CASE("conv2d_dw_unbatched",
       (o = co(3, 3, 2, 2, 1, 1, 1, 1, 9, true), grove_conv2d_new(9, 9, &o, &m, err)));
  CASE("conv2d_dw_mult",
       (o = co(3, 3, 1, 1, 1, 1, 1, 1, 8, true), grove_conv2d_new(8, 16, &o, &m, err)));
  CASE("conv2d_dw_wide",
       (o = co(5, 5, 1, 1, 2, 2, 1, 1, 200, true), grove_conv2d_new(200, 200, &o, &m, err)));
  CASE("conv1d_basic",
       (o = co(3, 0, 1, 0, 0, 0, 1, 0, 1, true), grove_conv1d_new(4, 6, &o, &m, err)));
  CASE("conv1d_stride_pad",
       (o = co(5, 0, 2, 0, 2, 0, 1, 0, 1, true), grove_conv1d_new(3, 5, &o, &m, err)));
  CASE("conv1d_groups_dil",
       (o = co(3, 0, 1, 0, 3, 0, 3, 0, 2, true), grove_conv1d_new(4, 8, &o, &m, err)));
  CASE("conv1d_same", (o = co(4, 0, 1, 0, 0, 0, 1, 0, 1, true), o.padding_same = true,
                       grove_conv1d_new(2, 3, &o, &m, err)));
  CASE("conv1d_unbatched",
       (o = co(1, 0, 1, 0, 0, 0, 1, 0, 1, true), grove_conv1d_new(3, 2, &o, &m, err)));
  CASE("bn2d", grove_batch_norm2d_new(5, 1e-5, 0.1, true, true, &m, err));
  CASE("bn2d_b1", grove_batch_norm2d_new(5, 1e-3, 0.1, true, true, &m, err));
  CASE("bn2d_noaffine", grove_batch_norm2d_new(3, 1e-5, 0.1, false, true, &m, err));
  CASE("bn2d_nostats", grove_batch_norm2d_new(4, 1e-5, 0.1, true, false, &m, err));
  CASE("maxpool_2", grove_max_pool2d_new(k2, NULL, NULL, NULL, false, &m, err));
  CASE("maxpool_odd", grove_max_pool2d_new(k3, s2, p1, NULL, false, &m, err));
  CASE("maxpool_ceil", grove_max_pool2d_new(k3, s2, NULL, NULL, true, &m, err));
  CASE("maxpool_dil", grove_max_pool2d_new(k23, s1, NULL, d2, false, &m, err));
  CASE("maxpool_unbatched", grove_max_pool2d_new(k2, s1, NULL, NULL, false, &m, err));
  CASE("avgpool_2", grove_avg_pool2d_new(k2, NULL, NULL, false, true, 0, &m, err));
  CASE("avgpool_pad", grove_avg_pool2d_new(k3, s2, p1, false, true, 0, &m, err));
  CASE("avgpool_pad_excl", grove_avg_pool2d_new(k3, s2, p1, false, false, 0, &m, err));
  CASE("avgpool_ceil", grove_avg_pool2d_new(k3, s2, p1, true, true, 0, &m, err));
  CASE("avgpool_div", grove_avg_pool2d_new(k2, NULL, NULL, false, true, 3, &m, err));
  CASE("adapt_1", grove_adaptive_avg_pool2d_new((int64_t[2]){1, 1}, &m, err));
  CASE("adapt_odd", grove_adaptive_avg_pool2d_new((int64_t[2]){3, 2}, &m, err));
  CASE("adapt_none", grove_adaptive_avg_pool2d_new((int64_t[2]){-1, 3}, &m, err));
  CASE("adapt_up", grove_adaptive_avg_pool2d_new((int64_t[2]){4, 4}, &m, err));
  CASE("maxpool1d", grove_max_pool1d_new(3, 2, 1, 2, true, &m, err));
  CASE("maxpool1d_unbatched", grove_max_pool1d_new(2, 0, 0, 1, false, &m, err));
  CASE("avgpool1d", grove_avg_pool1d_new(4, 3, 2, true, false, &m, err));
  CASE("avgpool1d_incl", grove_avg_pool1d_new(3, 0, 1, false, true, &m, err));
  CASE("adapt1d_avg", grove_adaptive_avg_pool1d_new(5, &m, err));
  CASE("adapt1d_max", grove_adaptive_max_pool1d_new(4, &m, err));
  CASE("adaptmax", grove_adaptive_max_pool2d_new((int64_t[2]){3, 5}, &m, err));
  CASE("adaptmax_none", grove_adaptive_max_pool2d_new((int64_t[2]){-1, 2}, &m, err));
  CASE("adaptmax_1", grove_adaptive_max_pool2d_new((int64_t[2]){1, 1}, &m, err));
  CASE("avgpool_ceil_excl", grove_avg_pool2d_new(k3, s2, p1, true, false, 0, &m, err));
  CASE("avgpool_div_ceil", grove_avg_pool2d_new(k3, s2, p1, true, true, 5, &m, err));
  CASE("maxpool_ceil_pad_dil", grove_max_pool2d_new(k3, s2, p1, d2, true, &m, err));
  CASE("convt_basic",
       (o = co(3, 3, 1, 1, 0, 0, 1, 1, 1, true), grove_conv_transpose2d_new(4, 6, &o, &m, err)));
  CASE("convt_stride_opad",
       (o = co(3, 3, 2, 2, 1, 1, 1, 1, 1, true), o.output_padding[0] = o.output_padding[1] = 1,
        grove_conv_transpose2d_new(8, 5, &o, &m, err)));
  CASE("convt_groups_dil", (o = co(3, 2, 2, 1, 2, 0, 2, 2, 3, false),
                            grove_conv_transpose2d_new(6, 9, &o, &m, err)));
  CASE("convt_rect_opad",
       (o = co(4, 4, 2, 3, 1, 1, 1, 1, 1, true), o.output_padding[0] = 1, o.output_padding[1] = 2,
        grove_conv_transpose2d_new(16, 16, &o, &m, err)));
  CASE("convt_1x1",
       (o = co(1, 1, 1, 1, 0, 0, 1, 1, 1, true), grove_conv_transpose2d_new(5, 7, &o, &m, err)));
  CASE("convt_unbatched",
       (o = co(2, 2, 2, 2, 0, 0, 1, 1, 1, true), grove_conv_transpose2d_new(3, 2, &o, &m, err)));
  CASE("convt1d_basic",
       (o = co(3, 0, 1, 0, 0, 0, 1, 0, 1, true), grove_conv_transpose1d_new(4, 6, &o, &m, err)));
  CASE("convt1d_stride_opad", (o = co(4, 0, 3, 0, 1, 0, 1, 0, 1, true), o.output_padding[0] = 2,
                               grove_conv_transpose1d_new(8, 5, &o, &m, err)));
  CASE("convt1d_groups_dil",
       (o = co(3, 0, 2, 0, 2, 0, 2, 0, 3, false), grove_conv_transpose1d_new(6, 9, &o, &m, err)));
  CASE("convt1d_unbatched",
       (o = co(2, 0, 2, 0, 0, 0, 1, 0, 1, true), grove_conv_transpose1d_new(3, 2, &o, &m, err)));
#undef CASE
  ck_assert_msg(s != GROVE_E_NOT_FOUND, "no C constructor for case %s", name);
  ck_assert_ok(s, err);
  return m;
}

/* ------------------------------------------------------------ fixtures */

typedef struct fixture {
  grove_state_dict *file, *weights;
  grove_tensor *x, *y;
  char *json; /* the module object */
} fixture;

static void fixture_load(fixture *fx, const char *name) {
  grove_err err = {0};
  char fname[256];
  snprintf(fname, sizeof fname, "conv_%s.safetensors", name);
  ck_assert_ok(grove_safetensors_read(grove_fixture(fname), &fx->file, &err), &err);
  fx->weights = grove_sd_new();
  for (size_t i = 0; i < grove_sd_count(fx->file); i++) {
    const char *k = grove_sd_key(fx->file, i);
    if (strncmp(k, "w.", 2) == 0)
      ck_assert_ok(grove_sd_set(fx->weights, k + 2, grove_sd_tensor(fx->file, i), &err), &err);
  }
  fx->x = grove_sd_get(fx->file, "x");
  fx->y = grove_sd_get(fx->file, "y");
  ck_assert_ptr_nonnull(fx->x);
  ck_assert_ptr_nonnull(fx->y);
  snprintf(fname, sizeof fname, "conv_%s.json", name);
  fx->json = grove_test_read_file(grove_fixture(fname), NULL);
  ck_assert_ptr_nonnull(fx->json);
}

static void fixture_fini(fixture *fx) {
  free(fx->json);
  grove_sd_free(fx->weights);
  grove_sd_free(fx->file);
}

static void assert_close(const char *what, const grove_tensor *got, const grove_tensor *want) {
  char a[128], b[128];
  ck_assert_msg(grove_tensor_same_shape(got, want), "%s: shape %s, torch %s", what,
                grove_shape_str(got->ndim, got->shape, a, sizeof a),
                grove_shape_str(want->ndim, want->shape, b, sizeof b));
  ck_assert(grove_tensor_is_contiguous(got));
  const float *g = got->data, *w = want->data;
  long bad = grove_test_allclose(g, w, (size_t)grove_tensor_numel(want), RTOL, ATOL);
  ck_assert_msg(bad < 0, "%s: element %ld is %.9g, torch says %.9g", what, bad,
                bad >= 0 ? g[bad] : 0.0, bad >= 0 ? w[bad] : 0.0);
}

/* The model.json document around one module object (the input spec is not
 * used: the tree is called directly). */
static grove_model *from_json(const char *module_json, grove_err *err) {
  size_t n = strlen(module_json) + 256;
  char *doc = malloc(n);
  snprintf(doc, n,
           "{\"format\": \"grove.model/1\", \"inputs\": [{\"name\": \"x\", \"dtype\": "
           "\"float32\", \"shape\": [-1]}], \"module\": %s}",
           module_json);
  grove_model *m = NULL;
  grove_status s = grove_model_from_spec(doc, "conv.json", &m, err);
  free(doc);
  ck_assert_ok(s, err);
  return m;
}

static void run_and_compare(const char *what, grove_module *m, fixture *fx) {
  grove_err err = {0};
  ck_assert_ok(grove_module_load_state_dict(m, fx->weights, NULL, NULL, &err), &err);
  grove_arena *arena = grove_arena_new(0);
  grove_fwd f = {.arena = arena, .err = &err};
  grove_tensor y;
  ck_assert_ok(grove_module_call(m, &f, fx->x, &y), &err);
  assert_close(what, &y, fx->y);
  size_t n = grove_tensor_nbytes(&y);
  float *first = malloc(n ? n : 1);
  memcpy(first, y.data, n);
  grove_arena_reset(arena);
  size_t grows = grove_arena_grow_count(arena);
  ck_assert_ok(grove_module_call(m, &f, fx->x, &y), &err);
  ck_assert_uint_eq(grove_arena_grow_count(arena), grows);
  ck_assert(memcmp(first, y.data, n) == 0);
  /* Grove's own threads never change the bits; OpenBLAS's (the columns
   * path) may, so there the result is only compared with torch again. */
  grove_set_compute_threads(2);
  grove_arena_reset(arena);
  ck_assert_ok(grove_module_call(m, &f, fx->x, &y), &err);
  assert_close(what, &y, fx->y);
  bool conv = strncmp(m->type->name, "Conv", 4) == 0;
  bool transposed = strncmp(m->type->name, "ConvTranspose", 13) == 0;
  const char *gemm = getenv("GROVE_GEMM");
  bool blas = gemm && strcmp(gemm, "blas") == 0;
  if (!conv || ((grove__conv_rows_path(m) || transposed) && !blas) ||
      grove__conv_depthwise_path(m))
    ck_assert_msg(memcmp(first, y.data, n) == 0, "%s: 2 compute threads changed the result", what);
  grove_set_compute_threads(1);
  free(first);
  grove_arena_free(arena);
}

START_TEST(test_parity) {
  const char *name = cases[_i];
  fixture fx = {0};
  grove_err err = {0};
  fixture_load(&fx, name);
  /* Every lowering of a convolution (chosen when the weight is packed):
   * Grove's own choice, and each one forced (winograd falls back to rows
   * where it does not apply); then rows and winograd again on OpenBLAS
   * packs (GROVE_GEMM=blas), whose products run between the stages rather
   * than inside fused chunks. */
  static const char *const modes[] = {NULL, "rows", "columns", "winograd", "rows", "winograd"};
  for (int k = 0; k < 6; k++) {
    if (modes[k])
      setenv("GROVE_CONV", modes[k], 1);
    else
      unsetenv("GROVE_CONV");
    if (k >= 4) setenv("GROVE_GEMM", "blas", 1);
    grove_module *m = build_case(name, &err);
    grove_module_eval(m);
    char what[300];
    snprintf(what, sizeof what, "%s (%s%s)", name, modes[k] ? modes[k] : "default",
             k >= 4 ? ", OpenBLAS packs" : "");
    run_and_compare(what, m, &fx);
    grove_module_release(m);
    unsetenv("GROVE_GEMM");
  }
  unsetenv("GROVE_CONV");

  grove_model *model = from_json(fx.json, &err);
  char what[300];
  snprintf(what, sizeof what, "%s (from model.json)", name);
  run_and_compare(what, model->root, &fx);
  grove_model_free(model);
  fixture_fini(&fx);
}
END_TEST

/* A user's strided (transposed) input gives the contiguous result. */
START_TEST(test_strided_input) {
  fixture fx = {0};
  grove_err err = {0};
  fixture_load(&fx, "conv2d_basic");
  grove_module *m = build_case("conv2d_basic", &err);
  grove_module_eval(m);
  ck_assert_ok(grove_module_load_state_dict(m, fx.weights, NULL, NULL, &err), &err);
  /* x [2, 3, 9, 9] stored as [9, 9, 3, 2] and viewed back. */
  const grove_tensor *x = fx.x;
  int64_t ts[4] = {9, 9, 3, 2};
  grove_tensor *t = grove_tensor_new(GROVE_F32, 4, ts, &err);
  const float *xs = x->data;
  float *td = t->data;
  for (int n = 0; n < 2; n++)
    for (int c = 0; c < 3; c++)
      for (int h = 0; h < 9; h++)
        for (int w = 0; w < 9; w++)
          td[((h * 9 + w) * 3 + c) * 2 + n] = xs[((n * 3 + c) * 9 + h) * 9 + w];
  int64_t strides[4] = {1, 2, 9 * 3 * 2, 3 * 2};
  grove_tensor *v = grove_tensor_view_new(t->storage, 0, GROVE_F32, 4, x->shape, strides, &err);
  ck_assert_ptr_nonnull(v);
  grove_arena *a = grove_arena_new(0);
  grove_fwd f = {.arena = a, .err = &err};
  grove_tensor y;
  ck_assert_ok(grove_module_call(m, &f, v, &y), &err);
  assert_close("strided conv2d", &y, fx.y);
  grove_arena_free(a);
  grove_tensor_release(v);
  grove_tensor_release(t);
  grove_module_release(m);
  fixture_fini(&fx);
}
END_TEST

/* The fused epilogue (scale, shift, relu) as a graph uses it equals the
 * plain convolution followed by the same affine map and clamp. */
START_TEST(test_epilogue) {
  fixture fx = {0};
  grove_err err = {0};
  fixture_load(&fx, "conv2d_many");
  grove_module *m = build_case("conv2d_many", &err);
  grove_module_eval(m);
  ck_assert_ok(grove_module_load_state_dict(m, fx.weights, NULL, NULL, &err), &err);
  float scale[12], shift[12];
  const float *bias = grove__conv_bias(m);
  for (int c = 0; c < 12; c++) {
    scale[c] = 0.5f + 0.1f * (float)c;
    shift[c] = bias[c] * scale[c] - 0.3f;
  }
  grove_arena *a = grove_arena_new(0);
  grove_fwd f = {.arena = a, .err = &err};
  grove_values in = {.n = 1}, out = {0};
  in.v[0] = *fx.x;
  ck_assert_ok(grove__conv_forward_ex(m, &f, &in, &out, scale, shift, true, false), &err);
  const float *y = out.v[0].data, *ref = fx.y->data;
  const int64_t P = 36;
  for (int64_t i = 0; i < grove_tensor_numel(fx.y); i++) {
    int64_t c = (i / P) % 12;
    float want = ref[i] * scale[c] - 0.3f;
    want = want < 0 ? 0 : want;
    ck_assert_msg(grove_test_allclose(&y[i], &want, 1, RTOL, ATOL) < 0, "element %lld: %g vs %g",
                  (long long)i, y[i], want);
  }
  grove_arena_free(a);
  grove_module_release(m);
  fixture_fini(&fx);
}
END_TEST

/* ------------------------------------------------------------ errors */

static grove_status call_shape(grove_module *m, int nd, const int64_t *shape) {
  grove_err err = {0};
  int64_t n = 1;
  for (int i = 0; i < nd; i++) n *= shape[i];
  float *buf = calloc((size_t)(n ? n : 1), sizeof(float));
  grove_tensor x, y;
  grove_tensor_init(&x, GROVE_F32, nd, shape, buf);
  grove_arena *a = grove_arena_new(0);
  grove_fwd f = {.arena = a, .err = &err};
  grove_status s = grove_module_call(m, &f, &x, &y);
  grove_arena_free(a);
  free(buf);
  return s;
}

START_TEST(test_shape_errors) {
  grove_err err = {0};
  grove_module *m;
  grove_conv_opts o = co(3, 3, 1, 1, 0, 0, 1, 1, 1, true);
  ck_assert_ok(grove_conv2d_new(3, 4, &o, &m, &err), &err);
  grove_module_eval(m);
  ck_assert_status(call_shape(m, 4, (int64_t[]){1, 2, 5, 5}), GROVE_E_SHAPE);
  ck_assert_status(call_shape(m, 4, (int64_t[]){1, 3, 2, 5}), GROVE_E_SHAPE);
  ck_assert_status(call_shape(m, 2, (int64_t[]){3, 5}), GROVE_E_SHAPE);
  ck_assert_status(call_shape(m, 4, (int64_t[]){0, 3, 5, 5}), GROVE_OK);
  ck_assert_status(call_shape(m, 3, (int64_t[]){3, 3, 3}), GROVE_OK);
  grove_module_release(m);
  ck_assert_ok(grove_batch_norm2d_new(3, 1e-5, 0.1, true, true, &m, &err), &err);
  ck_assert_status(call_shape(m, 4, (int64_t[]){1, 3, 2, 2}), GROVE_E_UNSUPPORTED); /* training */
  grove_module_eval(m);
  ck_assert_status(call_shape(m, 3, (int64_t[]){3, 2, 2}), GROVE_E_SHAPE);
  ck_assert_status(call_shape(m, 4, (int64_t[]){1, 4, 2, 2}), GROVE_E_SHAPE);
  grove_module_release(m);
  ck_assert_ok(grove_max_pool2d_new((int64_t[]){3, 3}, NULL, NULL, NULL, false, &m, &err), &err);
  ck_assert_status(call_shape(m, 4, (int64_t[]){1, 1, 2, 2}), GROVE_E_SHAPE);
  ck_assert_status(call_shape(m, 2, (int64_t[]){4, 4}), GROVE_E_SHAPE);
  grove_module_release(m);
}
END_TEST

START_TEST(test_constructor_errors) {
  grove_err err = {0};
  grove_module *m = NULL;
  grove_conv_opts o = co(3, 3, 1, 1, 0, 0, 1, 1, 2, true);
  ck_assert_status(grove_conv2d_new(3, 4, &o, &m, &err), GROVE_E_INVALID_ARGUMENT);
  ck_assert_ptr_null(m);
  o = co(3, 3, 2, 2, 0, 0, 1, 1, 1, true);
  o.padding_same = true;
  ck_assert_status(grove_conv2d_new(3, 4, &o, &m, &err), GROVE_E_INVALID_ARGUMENT);
  ck_assert(strstr(err.msg, "strided"));
  o = co(0, 3, 1, 1, 0, 0, 1, 1, 1, true);
  ck_assert_status(grove_conv2d_new(3, 4, &o, &m, &err), GROVE_E_INVALID_ARGUMENT);
  ck_assert_status(
      grove_max_pool2d_new((int64_t[]){2, 2}, NULL, (int64_t[]){2, 0}, NULL, false, &m, &err),
      GROVE_E_INVALID_ARGUMENT);
  ck_assert(strstr(err.msg, "half of effective kernel size"));
  ck_assert_status(grove_adaptive_avg_pool2d_new((int64_t[]){0, 1}, &m, &err),
                   GROVE_E_INVALID_ARGUMENT);
  ck_assert_status(grove_batch_norm2d_new(0, 1e-5, 0.1, true, true, &m, &err),
                   GROVE_E_INVALID_ARGUMENT);
  ck_assert_ptr_null(m);
}
END_TEST

static void json_err(const char *module_json, grove_status code, const char *needle) {
  grove_err err = {0};
  char doc[2048];
  snprintf(doc, sizeof doc,
           "{\"format\": \"grove.model/1\", \"inputs\": [{\"name\": \"x\", \"dtype\": "
           "\"float32\", \"shape\": [-1]}], \"module\": %s}",
           module_json);
  grove_model *m = NULL;
  ck_assert_status(grove_model_from_spec(doc, "model.json", &m, &err), code);
  ck_assert_ptr_null(m);
  ck_assert_msg(strstr(err.msg, needle), "%s:\n got  \"%s\"\n want \"%s\"", module_json, err.msg,
                needle);
}

START_TEST(test_json_errors) {
  json_err(
      "{\"type\": \"Conv2d\", \"in_channels\": 3, \"out_channels\": 4, \"kernel_size\": 3, "
      "\"padding_mode\": \"reflect\"}",
      GROVE_E_UNSUPPORTED, "$.module.padding_mode: only padding_mode=\"zeros\"");
  json_err("{\"type\": \"Conv2d\", \"in_channels\": 3, \"out_channels\": 4}", GROVE_E_SPEC,
           "$.module.kernel_size: missing required argument of Conv2d");
  json_err("{\"type\": \"Conv2d\", \"in_channels\": 3, \"out_channels\": 4, \"kernel_size\": [3]}",
           GROVE_E_SPEC,
           "$.module.kernel_size: expected an integer in [1, 1048576] or a list of 2");
  json_err(
      "{\"type\": \"Conv1d\", \"in_channels\": 3, \"out_channels\": 4, \"kernel_size\": 3, "
      "\"groups\": 2}",
      GROVE_E_SPEC, "$.module.groups: in_channels (3) and out_channels (4) must both be");
  json_err(
      "{\"type\": \"Conv2d\", \"in_channels\": 3, \"out_channels\": 4, \"kernel_size\": 3, "
      "\"padding\": \"full\"}",
      GROVE_E_SPEC, "$.module.padding: expected one of \"same\", \"valid\"");
  json_err(
      "{\"type\": \"Conv2d\", \"in_channels\": 3, \"out_channels\": 4, \"kernel_size\": 3, "
      "\"stride\": 2, \"padding\": \"same\"}",
      GROVE_E_SPEC, "$.module: Conv2d: padding='same' is not supported for strided");
  json_err("{\"type\": \"MaxPool2d\", \"kernel_size\": 2, \"return_indices\": true}",
           GROVE_E_UNSUPPORTED, "$.module.return_indices");
  json_err("{\"type\": \"MaxPool2d\", \"kernel_size\": 2, \"padding\": 2}", GROVE_E_SPEC,
           "pad should be at most half");
  json_err("{\"type\": \"AvgPool2d\", \"kernel_size\": 2, \"divisor_override\": 0}", GROVE_E_SPEC,
           "$.module.divisor_override: expected an integer in [1, 2147483647] or null, got 0");
  json_err("{\"type\": \"AdaptiveAvgPool2d\", \"output_size\": [2, 0]}", GROVE_E_SPEC,
           "$.module.output_size: expected a positive integer or a list of 2");
  json_err("{\"type\": \"AdaptiveMaxPool2d\", \"output_size\": 2, \"return_indices\": true}",
           GROVE_E_UNSUPPORTED, "$.module.return_indices: AdaptiveMaxPool2d(return_indices=True)");
  json_err("{\"type\": \"AdaptiveAvgPool1d\", \"output_size\": [2, 2]}", GROVE_E_SPEC,
           "$.module.output_size: expected a positive integer or a list of 1");
  json_err("{\"type\": \"AvgPool1d\", \"kernel_size\": 2, \"divisor_override\": 2}",
           GROVE_E_SPEC, "$.module.divisor_override");
  json_err(
      "{\"type\": \"ConvTranspose2d\", \"in_channels\": 2, \"out_channels\": 2, "
      "\"kernel_size\": 3, \"stride\": 2, \"output_padding\": 2}",
      GROVE_E_SPEC, "output padding must be smaller than either stride or dilation, but got "
                    "output_padding=2, stride=2, dilation=1");
  json_err(
      "{\"type\": \"ConvTranspose2d\", \"in_channels\": 2, \"out_channels\": 2, "
      "\"kernel_size\": 3, \"padding\": \"same\"}",
      GROVE_E_SPEC, "$.module.padding: expected an integer");
  json_err(
      "{\"type\": \"ConvTranspose2d\", \"in_channels\": 3, \"out_channels\": 4, "
      "\"kernel_size\": 3, \"groups\": 2}",
      GROVE_E_SPEC, "$.module.groups: in_channels (3) and out_channels (4) must both be");
  json_err("{\"type\": \"MaxPool1d\", \"kernel_size\": [2, 2]}", GROVE_E_SPEC,
           "$.module.kernel_size: expected an integer in [1, 1048576] or a list of 1");
  json_err("{\"type\": \"BatchNorm2d\", \"num_features\": 4, \"eps\": -1}", GROVE_E_SPEC,
           "$.module.eps: expected a non-negative number, got -1");
  json_err(
      "{\"type\": \"Conv2d\", \"in_channels\": 3, \"out_channels\": 4, \"kernel_size\": 3, "
      "\"children\": []}",
      GROVE_E_SPEC, "$.module.children: a Conv2d has no children");
}
END_TEST

/* state_dict keys in torch's order; BatchNorm2d loads a checkpoint without
 * num_batches_tracked (as from old torch or any safetensors file). */
START_TEST(test_state_dict_layout) {
  grove_err err = {0};
  grove_module *m;
  grove_conv_opts o = co(3, 3, 1, 1, 0, 0, 1, 1, 1, false);
  ck_assert_ok(grove_conv2d_new(3, 4, &o, &m, &err), &err);
  grove_state_dict *sd = grove_sd_new();
  ck_assert_ok(grove_module_state_dict(m, NULL, sd, &err), &err);
  ck_assert_uint_eq(grove_sd_count(sd), 1);
  ck_assert_str_eq(grove_sd_key(sd, 0), "weight");
  ck_assert_int_eq(grove_sd_tensor(sd, 0)->ndim, 4);
  grove_sd_free(sd);
  grove_module_release(m);

  ck_assert_ok(grove_batch_norm2d_new(3, 1e-5, 0.1, true, true, &m, &err), &err);
  sd = grove_sd_new();
  ck_assert_ok(grove_module_state_dict(m, NULL, sd, &err), &err);
  static const char *const keys[] = {"weight", "bias", "running_mean", "running_var",
                                     "num_batches_tracked"};
  ck_assert_uint_eq(grove_sd_count(sd), 5);
  for (int i = 0; i < 5; i++) ck_assert_str_eq(grove_sd_key(sd, (size_t)i), keys[i]);
  /* Without metadata (a safetensors file): version unknown, so the key may
   * be missing. */
  grove_state_dict *bare = grove_sd_new();
  for (size_t i = 0; i + 1 < grove_sd_count(sd); i++)
    ck_assert_ok(grove_sd_set(bare, grove_sd_key(sd, i), grove_sd_tensor(sd, i), &err), &err);
  ck_assert_ok(grove_module_load_state_dict(m, bare, NULL, NULL, &err), &err);
  grove_sd_free(bare);
  grove_sd_free(sd);
  grove_module_release(m);
}
END_TEST

/* ------------------------------------------------------------ threads */

static float lcg(unsigned *st) {
  *st = *st * 1664525u + 1013904223u;
  return (float)((*st >> 8) & 0xFFFF) / 32768.0f - 1.0f;
}

static grove_tensor *rand_tensor(int ndim, const int64_t *shape, unsigned seed) {
  grove_tensor *t = grove_tensor_new(GROVE_F32, ndim, shape, NULL);
  ck_assert_ptr_nonnull(t);
  float *d = t->data;
  for (int64_t i = 0; i < grove_tensor_numel(t); i++) d[i] = lcg(&seed);
  return t;
}

/* Output of m on x with `threads` compute threads (malloc'd copy); through
 * grove__conv_forward_ex with a fused ReLU and out_nhwc when conv. */
static float *run_threads(grove_module *m, const grove_tensor *x, int threads, bool conv,
                          bool nhwc, size_t *nbytes) {
  grove_err err = {0};
  grove_set_compute_threads(threads);
  grove_arena *a = grove_arena_new(0);
  grove_fwd f = {.arena = a, .err = &err};
  grove_values in = {.n = 1}, out = {0};
  in.v[0] = *x;
  if (conv)
    ck_assert_ok(grove__conv_forward_ex(m, &f, &in, &out, NULL, NULL, true, nhwc), &err);
  else
    ck_assert_ok(m->type->forward(m, &f, &in, &out), &err);
  *nbytes = (size_t)grove_tensor_numel(&out.v[0]) * sizeof(float);
  float *copy = malloc(*nbytes);
  memcpy(copy, out.v[0].data, *nbytes);
  grove_arena_free(a);
  grove_set_compute_threads(1);
  return copy;
}

static void check_threads(const char *what, grove_module *m, const grove_tensor *x, bool conv,
                          bool nhwc) {
  size_t n1, n;
  float *one = run_threads(m, x, 1, conv, nhwc, &n1);
  for (int t = 2; t <= 3; t++) {
    float *many = run_threads(m, x, t, conv, nhwc, &n);
    ck_assert_uint_eq(n, n1);
    ck_assert_msg(memcmp(one, many, n) == 0, "%s: %d compute threads changed the result", what, t);
    free(many);
  }
  free(one);
}

START_TEST(test_threads_bitwise) {
  grove_err err = {0};
  const int64_t xs[4] = {8, 32, 20, 19}, ss[4] = {1, 32, 7, 6};
  grove_tensor *x = rand_tensor(4, xs, 7), *small = rand_tensor(4, ss, 8);
  /* Winograd (3x3 stride 1), patch rows (stride 2; grouped 5x5; dilated),
   * and the direct 1x1, each with NCHW and NHWC output. */
  const grove_conv_opts opts[] = {co(3, 3, 1, 1, 1, 1, 1, 1, 1, true),
                                  co(3, 3, 2, 2, 1, 1, 1, 1, 1, true),
                                  co(5, 5, 1, 1, 2, 2, 1, 1, 2, false),
                                  co(3, 3, 1, 1, 2, 2, 2, 2, 1, true),
                                  co(1, 1, 1, 1, 0, 0, 1, 1, 1, true)};
  for (size_t k = 0; k < sizeof opts / sizeof opts[0]; k++) {
    grove_module *m = NULL;
    ck_assert_ok(grove_conv2d_new(32, 24, &opts[k], &m, &err), &err);
    grove_module_eval(m);
    grove_tensor *w = grove_module_param(m, "weight");
    grove_tensor *r = rand_tensor(w->ndim, w->shape, 100 + (unsigned)k);
    memcpy(w->data, r->data, grove_tensor_nbytes(w));
    grove_tensor_release(r);
    ck_assert_ok(m->type->refresh(m, &err), &err);
    for (int nhwc = 0; nhwc < 2; nhwc++) {
      char what[64];
      snprintf(what, sizeof what, "conv case %zu%s", k, nhwc ? " (nhwc out)" : "");
      check_threads(what, m, x, true, nhwc);
      /* One small image: too few Winograd tiles for chunks of tiles, so
       * the threads share out the 16 products instead.  An image this
       * small takes the plain rows by default (wino_pays), so Winograd is
       * forced for case 0 to keep that path covered. */
      snprintf(what, sizeof what, "conv case %zu, small%s", k, nhwc ? " (nhwc out)" : "");
      if (k == 0) setenv("GROVE_CONV", "winograd", 1);
      check_threads(what, m, small, true, nhwc);
      unsetenv("GROVE_CONV");
    }
    grove_module_release(m);
  }
  /* The depthwise kernel (3x3 stride 1, 5x5 stride 2), NCHW and NHWC out. */
  const grove_conv_opts dws[] = {co(3, 3, 1, 1, 1, 1, 1, 1, 32, true),
                                 co(5, 5, 2, 2, 2, 2, 1, 1, 32, false)};
  for (size_t k = 0; k < sizeof dws / sizeof dws[0]; k++) {
    grove_module *m = NULL;
    ck_assert_ok(grove_conv2d_new(32, 32, &dws[k], &m, &err), &err);
    grove_module_eval(m);
    ck_assert(grove__conv_depthwise_path(m));
    grove_tensor *w = grove_module_param(m, "weight");
    grove_tensor *r = rand_tensor(w->ndim, w->shape, 150 + (unsigned)k);
    memcpy(w->data, r->data, grove_tensor_nbytes(w));
    grove_tensor_release(r);
    ck_assert_ok(m->type->refresh(m, &err), &err);
    for (int nhwc = 0; nhwc < 2; nhwc++) {
      char what[64];
      snprintf(what, sizeof what, "depthwise case %zu%s", k, nhwc ? " (nhwc out)" : "");
      check_threads(what, m, x, true, nhwc);
    }
    grove_module_release(m);
  }
  const int64_t k3[2] = {3, 3}, s2[2] = {2, 2}, p1[2] = {1, 1}, o5[2] = {5, 3};
  grove_module *pools[3] = {NULL};
  ck_assert_ok(grove_max_pool2d_new(k3, s2, p1, NULL, false, &pools[0], &err), &err);
  ck_assert_ok(grove_avg_pool2d_new(k3, s2, p1, true, false, 0, &pools[1], &err), &err);
  ck_assert_ok(grove_adaptive_avg_pool2d_new(o5, &pools[2], &err), &err);
  for (int k = 0; k < 3; k++) {
    check_threads(pools[k]->type->name, pools[k], x, false, false);
    grove_module_release(pools[k]);
  }
  /* BatchNorm2d on its own (not fused into a convolution), with running
   * statistics and with batch statistics. */
  for (int track = 0; track < 2; track++) {
    grove_module *bn = NULL;
    ck_assert_ok(grove_batch_norm2d_new(32, 1e-5, 0.1, true, track, &bn, &err), &err);
    grove_module_eval(bn);
    const char *names[] = {"weight", "bias"};
    for (int k = 0; k < 2; k++) {
      grove_tensor *t = grove_module_param(bn, names[k]);
      grove_tensor *r = rand_tensor(t->ndim, t->shape, 200 + (unsigned)k);
      memcpy(t->data, r->data, grove_tensor_nbytes(t));
      grove_tensor_release(r);
    }
    ck_assert_ok(bn->type->refresh(bn, &err), &err);
    check_threads(track ? "BatchNorm2d (running stats)" : "BatchNorm2d (batch stats)", bn, x,
                  false, false);
    grove_module_release(bn);
  }
  grove_tensor_release(x);
  grove_tensor_release(small);
}
END_TEST

/* dst (channels last, of x's shape) = the contiguous NCHW x. */
static void copy_to_nhwc(const grove_tensor *x, grove_tensor *dst) {
  const int64_t C = x->shape[1], HW = x->shape[2] * x->shape[3];
  for (int64_t k = 0; k < grove_tensor_numel(x); k++)
    ((float *)dst->data)[(k / (C * HW)) * C * HW + (k % HW) * C + k / HW % C] =
        ((const float *)x->data)[k];
}

/* The 2-d pools on a channels-last input with too few output rows for the
 * threads (a global pool at batch 1, squeeze-excitation's): the channels
 * are cut in blocks between the threads (layers_pool.c), and the result is
 * the same bits on 1, 2 and 3 compute threads, and the bits of the NCHW
 * path on the same values. */
START_TEST(test_pool_nhwc_channel_blocks) {
  grove_err err = {0};
  const int64_t xs[4] = {1, 200, 28, 28}, C = 200;
  grove_tensor *x = rand_tensor(4, xs, 41);
  grove_tensor *xl = grove_tensor_new(GROVE_F32, 4, xs, NULL);
  ck_assert_ptr_nonnull(xl);
  grove__set_nhwc(xl);
  copy_to_nhwc(x, xl);
  const int64_t one[2] = {1, 1}, two[2] = {2, 2};
  grove_module *pools[3] = {NULL};
  ck_assert_ok(grove_adaptive_avg_pool2d_new(one, &pools[0], &err), &err);
  ck_assert_ok(grove_adaptive_max_pool2d_new(one, &pools[1], &err), &err);
  ck_assert_ok(grove_adaptive_avg_pool2d_new(two, &pools[2], &err), &err);
  for (int k = 0; k < 3; k++) {
    char what[96];
    snprintf(what, sizeof what, "%s %s (channels last)", pools[k]->type->name,
             k == 2 ? "2x2" : "1x1");
    check_threads(what, pools[k], xl, false, false);
    /* The same values through the NCHW path: [1, C, OH, OW] from either
     * layout, compared element by element. */
    size_t n1, n2;
    float *planes = run_threads(pools[k], x, 1, false, false, &n1);
    grove_set_compute_threads(2);
    grove_arena *a = grove_arena_new(0);
    grove_fwd f = {.arena = a, .err = &err};
    grove_tensor y;
    ck_assert_ok(grove_module_call(pools[k], &f, xl, &y), &err);
    n2 = (size_t)grove_tensor_numel(&y) * sizeof(float);
    ck_assert_uint_eq(n1, n2);
    const int64_t OHW = y.shape[2] * y.shape[3];
    for (int64_t c = 0; c < C; c++)
      for (int64_t q = 0; q < OHW; q++) {
        const float got =
            ((const float *)y.data)[c * y.strides[1] + (q / y.shape[3]) * y.strides[2] +
                                    (q % y.shape[3]) * y.strides[3]];
        ck_assert_msg(memcmp(&got, &planes[c * OHW + q], sizeof got) == 0,
                      "%s: channel %lld position %lld is %.9g, the NCHW path gives %.9g", what,
                      (long long)c, (long long)q, got, planes[c * OHW + q]);
      }
    grove_arena_free(a);
    grove_set_compute_threads(1);
    free(planes);
    grove_module_release(pools[k]);
  }
  grove_tensor_release(xl);
  grove_tensor_release(x);
}
END_TEST

/* ------------------------------------------------------------ channels last */

/* Random values into every parameter and buffer of m named in names. */
static void randomize(grove_module *m, const char *const *names, int n, unsigned seed, float lo) {
  for (int k = 0; k < n; k++) {
    grove_tensor *t = grove_module_param(m, names[k]);
    if (!t) t = grove_module_buffer(m, names[k]);
    ck_assert_ptr_nonnull(t);
    grove_tensor *r = rand_tensor(t->ndim, t->shape, seed + (unsigned)k);
    float *d = t->data;
    const float *v = r->data;
    for (int64_t i = 0; i < grove_tensor_numel(t); i++) d[i] = lo + (v[i] + 1.0f) * 0.5f;
    grove_tensor_release(r);
  }
}

/* got (any layout) against want (contiguous), element by element. */
static void assert_close_strided(const char *what, const grove_tensor *got,
                                 const grove_tensor *want) {
  ck_assert(grove_tensor_same_shape(got, want));
  const float *w = want->data;
  int64_t idx[4] = {0}, n = grove_tensor_numel(want);
  for (int64_t k = 0; k < n; k++) {
    int64_t off = 0;
    for (int d = 0; d < 4; d++) off += idx[d] * got->strides[d];
    const float g = ((const float *)got->data)[off];
    ck_assert_msg(fabsf(g - w[k]) <= ATOL + RTOL * fabsf(w[k]),
                  "%s: element %lld is %.9g, want %.9g", what, (long long)k, g, w[k]);
    for (int d = 3; d >= 0; d--) {
      if (++idx[d] < want->shape[d]) break;
      idx[d] = 0;
    }
  }
}

/* A convolution's fused activation (grove__conv_bn_act_forward: what a
 * Sequential or a graph runs for Conv2d [+ BatchNorm2d] + ReLU, ReLU6,
 * Hardswish, Hardsigmoid, SiLU or Sigmoid) equals the layers one after the
 * other, on every path (patch rows, the direct 1x1 product writing the
 * output, Winograd, depthwise 3x3 and 5x5, grouped columns), with and
 * without a folded BatchNorm, into an NCHW or an NHWC output, from an NCHW
 * or an NHWC input.  The reference applies torch's formulas in the test. */
static float ref_act(grove__act act, float v) {
  const float h = v + 3.0f < 0.0f ? 0.0f : (v + 3.0f > 6.0f ? 6.0f : v + 3.0f);
  switch (act) {
    case GROVE__ACT_RELU: return v < 0.0f ? 0.0f : v;
    case GROVE__ACT_RELU6: return v < 0.0f ? 0.0f : (v > 6.0f ? 6.0f : v);
    case GROVE__ACT_HARDSWISH: return v * h / 6.0f;
    case GROVE__ACT_HARDSIGMOID: return h / 6.0f;
    case GROVE__ACT_SILU: return (float)((double)v / (1.0 + exp(-(double)v)));
    case GROVE__ACT_SIGMOID: return (float)(1.0 / (1.0 + exp(-(double)v)));
    default: return v;
  }
}

START_TEST(test_fused_act) {
  grove_err err = {0};
  const int64_t xs[4] = {2, 16, 9, 11};
  grove_tensor *x = rand_tensor(4, xs, 21);
  static const char *const cw[] = {"weight", "bias"};
  static const char *const bw[] = {"weight", "bias", "running_mean", "running_var"};
  struct {
    grove_conv_opts o;
    int64_t cout;
  } cc[] = {
      {co(3, 3, 2, 2, 1, 1, 1, 1, 1, true), 40},   /* patch rows */
      {co(1, 1, 1, 1, 0, 0, 1, 1, 1, false), 40},  /* direct 1x1 */
      {co(3, 3, 1, 1, 1, 1, 1, 1, 1, true), 24},   /* Winograd */
      {co(3, 3, 1, 1, 1, 1, 1, 1, 16, false), 16}, /* depthwise */
      {co(5, 5, 2, 2, 2, 2, 1, 1, 16, true), 16},  /* depthwise 5x5, stride 2 */
      {co(3, 3, 1, 1, 1, 1, 1, 1, 4, true), 16},   /* grouped: columns */
  };
  grove_arena *a = grove_arena_new(0);
  grove_fwd f = {.arena = a, .err = &err};
  grove_values in = {.n = 1}, out = {0};
  int over6 = 0; /* ReLU6's upper clamp is exercised */
  /* The input channels last too (the layout a convolution hands the next). */
  grove_tensor xl;
  ck_assert_ok(grove_fwd_alloc(&f, &xl, GROVE_F32, 4, xs), &err);
  grove__set_nhwc(&xl);
  copy_to_nhwc(x, &xl);
  for (size_t k = 0; k < sizeof cc / sizeof cc[0]; k++) {
    grove_module *conv = NULL, *bn = NULL;
    ck_assert_ok(grove_conv2d_new(16, cc[k].cout, &cc[k].o, &conv, &err), &err);
    ck_assert_ok(grove_batch_norm2d_new(cc[k].cout, 1e-5, 0.1, true, true, &bn, &err), &err);
    randomize(conv, cw, cc[k].o.bias ? 2 : 1, 900 + 10 * (unsigned)k, -0.5f);
    randomize(bn, bw, 4, 905 + 10 * (unsigned)k, 0.1f);
    ck_assert_ok(conv->type->refresh(conv, &err), &err);
    ck_assert_ok(bn->type->refresh(bn, &err), &err);
    grove_module_eval(conv);
    grove_module_eval(bn);
    ck_assert(k != 3 || grove__conv_depthwise_path(conv));
    ck_assert(k != 5 || !grove__conv_rows_path(conv));
    for (int with_bn = 0; with_bn < 2; with_bn++) {
      grove_tensor c, pre;
      ck_assert_ok(grove_module_call(conv, &f, x, &c), &err);
      if (with_bn)
        ck_assert_ok(grove_module_call(bn, &f, &c, &pre), &err);
      else
        pre = c;
      const float *pv = pre.data;
      for (int64_t i = 0; i < grove_tensor_numel(&pre); i++) over6 += pv[i] > 6.0f;
      for (int act = GROVE__ACT_NONE; act <= GROVE__ACT_SIGMOID; act++) {
        grove_tensor want;
        ck_assert_ok(grove_fwd_alloc(&f, &want, GROVE_F32, 4, pre.shape), &err);
        for (int64_t i = 0; i < grove_tensor_numel(&pre); i++)
          ((float *)want.data)[i] = ref_act((grove__act)act, pv[i]);
        for (int lay = 0; lay < 4; lay++) {
          in.v[0] = lay & 1 ? xl : *x;
          const bool nhwc_out = lay & 2;
          ck_assert_ok(grove__conv_bn_act_forward(conv, with_bn ? bn : NULL, (grove__act)act, &f,
                                                  &in, &out, nhwc_out),
                       &err);
          ck_assert(nhwc_out == grove__is_nhwc(&out.v[0]) || k == 5);
          char what[128];
          snprintf(what, sizeof what, "conv case %zu%s, activation %d, %s in, %s out", k,
                   with_bn ? " + BatchNorm2d" : "", act, lay & 1 ? "NHWC" : "NCHW",
                   nhwc_out ? "NHWC" : "NCHW");
          assert_close_strided(what, &out.v[0], &want);
        }
      }
    }
    grove_module_release(conv);
    grove_module_release(bn);
  }
  ck_assert_int_gt(over6, 10);
  grove_arena_free(a);
  grove_tensor_release(x);
}
END_TEST

/* A residual block's add and activation applied by the convolution
 * (grove_fwd.res, what a graph runs for relu(bn(conv(x)) + identity)):
 * on the rows path's NHWC output (patch rows, the direct 1x1 product,
 * Winograd) it sets done and equals act(bn(conv(x)) + res); a residual in
 * another layout, an NCHW output, the depthwise and grouped paths leave it
 * undone and return the plain bn(conv(x)), without the activation (the
 * graph then runs the add). */
START_TEST(test_conv_residual) {
  grove_err err = {0};
  const int64_t xs[4] = {2, 16, 9, 11};
  grove_tensor *x = rand_tensor(4, xs, 31);
  static const char *const cw[] = {"weight", "bias"};
  static const char *const bw[] = {"weight", "bias", "running_mean", "running_var"};
  struct {
    grove_conv_opts o;
    int64_t cout;
    bool fuses;
  } cc[] = {
      {co(3, 3, 2, 2, 1, 1, 1, 1, 1, true), 40, true},    /* patch rows */
      {co(1, 1, 1, 1, 0, 0, 1, 1, 1, false), 40, true},   /* direct 1x1 */
      {co(3, 3, 1, 1, 1, 1, 1, 1, 1, true), 24, true},    /* Winograd */
      {co(3, 3, 1, 1, 1, 1, 1, 1, 16, false), 16, false}, /* depthwise */
      {co(3, 3, 1, 1, 1, 1, 1, 1, 4, true), 16, false},   /* grouped: columns */
  };
  grove_arena *a = grove_arena_new(0);
  grove_fwd f = {.arena = a, .err = &err};
  grove_values in = {.n = 1, .v = {*x}}, out = {0};
  for (size_t k = 0; k < sizeof cc / sizeof cc[0]; k++) {
    grove_module *conv = NULL, *bn = NULL;
    ck_assert_ok(grove_conv2d_new(16, cc[k].cout, &cc[k].o, &conv, &err), &err);
    ck_assert_ok(grove_batch_norm2d_new(cc[k].cout, 1e-5, 0.1, true, true, &bn, &err), &err);
    randomize(conv, cw, cc[k].o.bias ? 2 : 1, 700 + 10 * (unsigned)k, -0.5f);
    randomize(bn, bw, 4, 705 + 10 * (unsigned)k, 0.1f);
    ck_assert_ok(conv->type->refresh(conv, &err), &err);
    ck_assert_ok(bn->type->refresh(bn, &err), &err);
    grove_module_eval(conv);
    grove_module_eval(bn);
    grove_tensor c, pre;
    ck_assert_ok(grove_module_call(conv, &f, x, &c), &err);
    ck_assert_ok(grove_module_call(bn, &f, &c, &pre), &err);
    /* The residual, NCHW and channels last, of the output's shape. */
    grove_tensor rn, rl;
    ck_assert_ok(grove_fwd_alloc(&f, &rn, GROVE_F32, 4, pre.shape), &err);
    ck_assert_ok(grove_fwd_alloc(&f, &rl, GROVE_F32, 4, pre.shape), &err);
    grove__set_nhwc(&rl);
    for (int64_t i = 0; i < grove_tensor_numel(&pre); i++)
      ((float *)rn.data)[i] = (float)((i * 7919) % 1000) / 200.0f - 2.5f;
    copy_to_nhwc(&rn, &rl);
    const float *pv = pre.data;
    for (int act = GROVE__ACT_RELU; act <= GROVE__ACT_HARDSWISH; act += 2) {
      grove_tensor sum, plain;
      ck_assert_ok(grove_fwd_alloc(&f, &sum, GROVE_F32, 4, pre.shape), &err);
      for (int64_t i = 0; i < grove_tensor_numel(&pre); i++)
        ((float *)sum.data)[i] = ref_act((grove__act)act, pv[i] + ((const float *)rn.data)[i]);
      plain = pre;
      for (int lay = 0; lay < 4; lay++) {
        const bool nhwc_out = lay & 1, res_nhwc = lay & 2;
        f.res.t = res_nhwc ? &rl : &rn;
        f.res.act = act;
        f.res.done = true; /* the convolution sets it either way */
        ck_assert_ok(grove__conv_bn_act_forward(conv, bn, GROVE__ACT_NONE, &f, &in, &out, nhwc_out),
                     &err);
        ck_assert_ptr_null(f.res.t);
        const bool want_done = cc[k].fuses && nhwc_out && res_nhwc;
        char what[128];
        snprintf(what, sizeof what, "conv case %zu, activation %d, %s out, %s residual", k, act,
                 nhwc_out ? "NHWC" : "NCHW", res_nhwc ? "NHWC" : "NCHW");
        ck_assert_msg(f.res.done == want_done, "%s: done %d", what, f.res.done);
        assert_close_strided(what, &out.v[0], want_done ? &sum : &plain);
      }
    }
    grove_module_release(conv);
    grove_module_release(bn);
  }
  grove_arena_free(a);
  grove_tensor_release(x);
}
END_TEST

/* A BatchNorm2d folded into the packed weight of the Conv2d before it
 * (grove__conv_fold_bn: a Sequential's refresh does it on every load)
 * follows the weights: the fused Sequential equals the layers one after
 * the other after a load, after a second load of other weights into the
 * same tree, after a load into the BatchNorm alone (the stale fold is not
 * used), and after the conv's own refresh (which drops it). */
static grove_state_dict *fold_sd(grove_module *seq, unsigned seed) {
  grove_err err = {0};
  grove_state_dict *own = grove_sd_new(), *sd = grove_sd_new();
  ck_assert_ok(grove_module_state_dict(seq, NULL, own, &err), &err);
  for (size_t i = 0; i < grove_sd_count(own); i++) {
    grove_tensor *t = grove_sd_tensor(own, i);
    const char *key = grove_sd_key(own, i);
    if (t->dtype != GROVE_F32) { /* num_batches_tracked */
      ck_assert_ok(grove_sd_set(sd, key, t, &err), &err);
      continue;
    }
    grove_tensor *r = rand_tensor(t->ndim, t->shape, seed + (unsigned)i);
    float *d = r->data;
    /* Variances and the BatchNorm's weight well away from zero. */
    const bool pos = strstr(key, "running_var") || strcmp(key, "1.weight") == 0;
    for (int64_t k = 0; k < grove_tensor_numel(r); k++) d[k] = pos ? 0.2f + fabsf(d[k]) : d[k];
    ck_assert_ok(grove_sd_set(sd, key, r, &err), &err);
    grove_tensor_release(r);
  }
  grove_sd_free(own);
  return sd;
}

static void fold_check(const char *what, grove_module *seq, grove_fwd *f, const grove_tensor *x) {
  grove_err err = {0};
  grove_tensor c, b, want;
  grove_module *conv = seq->children[0].module, *bn = seq->children[1].module;
  ck_assert_ok(grove_module_call(conv, f, x, &c), &err);
  ck_assert_ok(grove_module_call(bn, f, &c, &b), &err);
  ck_assert_ok(grove_fwd_alloc(f, &want, GROVE_F32, 4, b.shape), &err);
  for (int64_t i = 0; i < grove_tensor_numel(&b); i++)
    ((float *)want.data)[i] = ref_act(GROVE__ACT_SILU, ((const float *)b.data)[i]);
  for (int nhwc = 0; nhwc < 2; nhwc++) {
    grove_values in = {.n = 1}, out = {0};
    in.v[0] = *x;
    f->channels_last_ok = nhwc;
    ck_assert_ok(grove_module_forward(seq, f, &in, &out), &err);
    char msg[128];
    snprintf(msg, sizeof msg, "%s, %s out", what, nhwc ? "NHWC" : "NCHW");
    assert_close_strided(msg, &out.v[0], &want);
  }
}

/* Whether packs made now run Grove's own kernels.  GROVE_GEMM=blas (or a CPU
 * without AVX2) packs for OpenBLAS: there a BatchNorm is not folded into the
 * weight (the fold only pays where Grove's tiles write the output, see
 * grove__conv_fold_bn), and an image's rows-path result may depend on the
 * batch it is in, since OpenBLAS cuts a product by its row count. */
static bool native_kernel(void) {
  const float w[2] = {1, 2};
  grove__linear_pack *p = grove__linear_pack_new(w, 1, 2);
  ck_assert_ptr_nonnull(p);
  const bool native = grove__linear_pack_native(p);
  grove__linear_pack_free(p);
  return native;
}

START_TEST(test_bn_fold) {
  grove_err err = {0};
  const int64_t xs[4] = {2, 16, 7, 9};
  grove_tensor *x = rand_tensor(4, xs, 31);
  grove_module *seq = NULL, *conv = NULL, *bn = NULL, *act = NULL;
  const grove_conv_opts o[] = {co(1, 1, 1, 1, 0, 0, 1, 1, 1, true),
                               co(3, 3, 2, 2, 1, 1, 1, 1, 1, false)};
  for (size_t k = 0; k < sizeof o / sizeof o[0]; k++) {
    ck_assert_ok(grove_sequential_new(&seq, &err), &err);
    ck_assert_ok(grove_conv2d_new(16, 40, &o[k], &conv, &err), &err);
    ck_assert_ok(grove_batch_norm2d_new(40, 1e-5, 0.1, true, true, &bn, &err), &err);
    ck_assert_ok(grove_silu_new(&act, &err), &err);
    ck_assert_ok(grove_module_add_module(seq, "0", conv, &err), &err);
    ck_assert_ok(grove_module_add_module(seq, "1", bn, &err), &err);
    ck_assert_ok(grove_module_add_module(seq, "2", act, &err), &err);
    /* seq holds its own references; conv and bn stay valid while it lives. */
    grove_module_release(conv);
    grove_module_release(bn);
    grove_module_release(act);
    grove_module_eval(seq);
    grove_arena *a = grove_arena_new(0);
    grove_fwd f = {.arena = a, .err = &err};

    grove_state_dict *sd1 = fold_sd(seq, 1000 + 100 * (unsigned)k);
    ck_assert_ok(grove_module_load_state_dict(seq, sd1, NULL, NULL, &err), &err);
    ck_assert(grove__conv_rows_path(conv));
    const bool native = native_kernel();
    ck_assert(grove__conv_fold_active(conv, bn) == native);
    fold_check("folded, first load", seq, &f, x);

    grove_state_dict *sd2 = fold_sd(seq, 2000 + 100 * (unsigned)k);
    ck_assert_ok(grove_module_load_state_dict(seq, sd2, NULL, NULL, &err), &err);
    ck_assert(grove__conv_fold_active(conv, bn) == native);
    fold_check("folded, second load", seq, &f, x);

    /* The BatchNorm alone gets the first weights back: its parent is not
     * refreshed, the fold is stale and must not be used. */
    grove_state_dict *bsd = grove_sd_new();
    static const char *const bk[] = {"weight", "bias", "running_mean", "running_var"};
    for (int i = 0; i < 4; i++) {
      char key[32];
      snprintf(key, sizeof key, "1.%s", bk[i]);
      ck_assert_ok(grove_sd_set(bsd, bk[i], grove_sd_get(sd1, key), &err), &err);
    }
    grove_load_opts lax = {.strict = false};
    ck_assert_ok(grove_module_load_state_dict(bn, bsd, &lax, NULL, &err), &err);
    fold_check("stale fold (the BatchNorm reloaded alone)", seq, &f, x);

    /* The conv's own refresh drops the fold; the parent's makes it again. */
    ck_assert_ok(conv->type->refresh(conv, &err), &err);
    ck_assert(!grove__conv_fold_active(conv, bn));
    fold_check("fold dropped by the conv's refresh", seq, &f, x);
    ck_assert_ok(seq->type->refresh(seq, &err), &err);
    ck_assert(grove__conv_fold_active(conv, bn) == native);
    fold_check("folded again", seq, &f, x);

    grove_sd_free(sd1);
    grove_sd_free(sd2);
    grove_sd_free(bsd);
    grove_arena_free(a);
    grove_module_release(seq);
  }
  grove_tensor_release(x);
}
END_TEST

static int hook_calls, hook_strided;
static grove_status see_layout(void *user, const grove_module *m, grove_fwd *f,
                               const grove_values *in, grove_values *out) {
  hook_calls++;
  for (int k = 0; k < in->n; k++) hook_strided += !grove_tensor_is_contiguous(&in->v[k]);
  for (int k = 0; k < out->n; k++) hook_strided += !grove_tensor_is_contiguous(&out->v[k]);
  return GROVE_OK;
}

/* A Sequential [Conv2d, BatchNorm2d, ReLU] (fused) hands its result on
 * channels last exactly when its caller allows (grove_fwd.channels_last_ok);
 * BatchNorm2d, ReLU, MaxPool2d and AdaptiveAvgPool2d read that layout as it is; a
 * public call and every hook see contiguous tensors; values agree with the
 * layers run one by one. */
/* A 3x3 stride-1 convolution takes Winograd only on an image with 64 or
 * more 2x2 output tiles (layers_conv.c, wino_pays): a 7x7 output gives the
 * plain rows' bits, a 16x16 one Winograd's, and an image's result is the
 * same whatever batch it comes in. */
static float *conv_out(grove_module *m, const grove_tensor *x, size_t *n) {
  return run_threads(m, x, 1, true, false, n);
}

START_TEST(test_winograd_by_image) {
  grove_err err = {0};
  const grove_conv_opts o = co(3, 3, 1, 1, 1, 1, 1, 1, 1, true);
  grove_module *dflt = NULL, *rows = NULL;
  ck_assert_ok(grove_conv2d_new(16, 24, &o, &dflt, &err), &err);
  setenv("GROVE_CONV", "rows", 1);
  ck_assert_ok(grove_conv2d_new(16, 24, &o, &rows, &err), &err);
  unsetenv("GROVE_CONV");
  grove_module *ms[2] = {dflt, rows};
  for (int i = 0; i < 2; i++) {
    grove_module_eval(ms[i]);
    grove_tensor *w = grove_module_param(ms[i], "weight");
    grove_tensor *r = rand_tensor(w->ndim, w->shape, 300);
    memcpy(w->data, r->data, grove_tensor_nbytes(w));
    grove_tensor_release(r);
    if (i == 1) setenv("GROVE_CONV", "rows", 1);
    ck_assert_ok(ms[i]->type->refresh(ms[i], &err), &err);
    unsetenv("GROVE_CONV");
  }
  /* 7 x 7 and 12 x 12 (16 and 36 tiles) take the rows, 13 x 13 (49 tiles,
   * the smallest that does) and 16 x 16 Winograd (wino_pays). */
  const int64_t sizes[4] = {7, 12, 13, 16};
  for (int k = 0; k < 4; k++) {
    const bool wino = sizes[k] >= 13;
    const int64_t xs[4] = {3, 16, sizes[k], sizes[k]};
    grove_tensor *x = rand_tensor(4, xs, 301 + (unsigned)k);
    size_t n, nr, nw;
    float *d = conv_out(dflt, x, &n);
    float *r = conv_out(rows, x, &nr);
    setenv("GROVE_CONV", "winograd", 1);
    float *wg = conv_out(dflt, x, &nw);
    unsetenv("GROVE_CONV");
    ck_assert(n == nr && n == nw);
    /* The two lowerings round differently, so the comparison tells them
     * apart. */
    ck_assert_msg(memcmp(r, wg, n) != 0, "rows and Winograd gave the same bits");
    ck_assert_msg(memcmp(d, wino ? wg : r, n) == 0, "%lldx%lld: the default is not %s",
                  (long long)sizes[k], (long long)sizes[k], wino ? "Winograd" : "the rows");
    /* The first image alone: the same bits as in the batch of three. */
    const int64_t x1s[4] = {1, 16, sizes[k], sizes[k]};
    grove_tensor *x1 = grove_tensor_new(GROVE_F32, 4, x1s, NULL);
    memcpy(x1->data, x->data, grove_tensor_nbytes(x1));
    size_t n1;
    float *d1 = conv_out(dflt, x1, &n1);
    ck_assert_uint_eq(n1 * 3, n);
    /* Winograd is Grove's own on every kernel; the rows path is OpenBLAS's
     * product under GROVE_GEMM=blas (see native_kernel). */
    if (wino || native_kernel())
      ck_assert_msg(memcmp(d1, d, n1) == 0, "%lldx%lld: batch 1 and batch 3 differ",
                    (long long)sizes[k], (long long)sizes[k]);
    free(d);
    free(r);
    free(wg);
    free(d1);
    grove_tensor_release(x1);
    grove_tensor_release(x);
  }
  grove_module_release(dflt);
  grove_module_release(rows);
}
END_TEST

START_TEST(test_channels_last) {
  grove_err err = {0};
  const int64_t xs[4] = {3, 16, 9, 7};
  grove_tensor *x = rand_tensor(4, xs, 11);
  grove_module *seq = NULL, *conv = NULL, *bn = NULL, *relu = NULL, *gap = NULL;
  const grove_conv_opts o = co(3, 3, 1, 1, 1, 1, 1, 1, 1, true);
  ck_assert_ok(grove_sequential_new(&seq, &err), &err);
  ck_assert_ok(grove_conv2d_new(16, 24, &o, &conv, &err), &err);
  ck_assert_ok(grove_batch_norm2d_new(24, 1e-5, 0.1, true, true, &bn, &err), &err);
  ck_assert_ok(grove_relu_new(&relu, &err), &err);
  const int64_t one[2] = {1, 1};
  ck_assert_ok(grove_adaptive_avg_pool2d_new(one, &gap, &err), &err);
  static const char *const cw[] = {"weight", "bias"};
  static const char *const bw[] = {"weight", "bias", "running_mean", "running_var"};
  randomize(conv, cw, 2, 300, -0.5f);
  randomize(bn, bw, 4, 400, 0.1f);
  ck_assert_ok(conv->type->refresh(conv, &err), &err);
  ck_assert_ok(bn->type->refresh(bn, &err), &err);
  ck_assert_ok(grove_module_add_module(seq, "0", conv, &err), &err);
  ck_assert_ok(grove_module_add_module(seq, "1", bn, &err), &err);
  ck_assert_ok(grove_module_add_module(seq, "2", relu, &err), &err);
  grove_module_eval(seq);
  grove_module_eval(gap);
  ck_assert(grove__conv_rows_path(conv));

  grove_arena *a = grove_arena_new(0);
  grove_fwd f = {.arena = a, .err = &err};
  /* The reference: each layer on its own, contiguous tensors throughout. */
  grove_tensor c, b, want, pooled;
  ck_assert_ok(grove_module_call(conv, &f, x, &c), &err);
  ck_assert_ok(grove_module_call(bn, &f, &c, &b), &err);
  ck_assert_ok(grove_module_call(relu, &f, &b, &want), &err);
  ck_assert_ok(grove_module_call(gap, &f, &want, &pooled), &err);
  ck_assert(grove_tensor_is_contiguous(&c) && grove_tensor_is_contiguous(&want));

  /* A caller that takes channels last gets it. */
  grove_values in = {.n = 1}, out = {0};
  in.v[0] = *x;
  f.channels_last_ok = true;
  ck_assert_ok(grove_module_forward(seq, &f, &in, &out), &err);
  ck_assert_msg(grove__is_nhwc(&out.v[0]), "Sequential: result not channels last");
  assert_close_strided("Sequential, channels last", &out.v[0], &want);
  const grove_tensor nhwc = out.v[0];
  /* Layers that read channels last as it is, and keep it. */
  grove_values in2 = {.n = 1}, o2 = {0};
  in2.v[0] = nhwc;
  f.channels_last_ok = true;
  ck_assert_ok(grove_module_forward(relu, &f, &in2, &o2), &err);
  ck_assert(grove__is_nhwc(&o2.v[0]));
  assert_close_strided("ReLU, channels last", &o2.v[0], &want);
  f.channels_last_ok = true;
  ck_assert_ok(grove_module_forward(gap, &f, &in2, &o2), &err);
  assert_close_strided("AdaptiveAvgPool2d, channels last", &o2.v[0], &pooled);
  {
    const int64_t k3[2] = {3, 3}, s2[2] = {2, 2}, p1[2] = {1, 1};
    grove_module *mp = NULL;
    ck_assert_ok(grove_max_pool2d_new(k3, s2, p1, NULL, true, &mp, &err), &err);
    grove_tensor pw;
    ck_assert_ok(grove_module_call(mp, &f, &want, &pw), &err);
    f.channels_last_ok = true;
    ck_assert_ok(grove_module_forward(mp, &f, &in2, &o2), &err);
    ck_assert(grove__is_nhwc(&o2.v[0]));
    assert_close_strided("MaxPool2d, channels last", &o2.v[0], &pw);
    grove_module_release(mp);
  }
  /* Every 2-d pool reads channels last as it is and keeps it (but for a
   * 1 x 1 result, contiguous in either layout), with the values of the
   * contiguous call: averages (padding, ceil_mode, count_include_pad=False,
   * a divisor), adaptive averages and maxima to other sizes. */
  {
    const int64_t k3[2] = {3, 3}, s2[2] = {2, 2}, p1[2] = {1, 1}, o32[2] = {3, 2};
    const int64_t o45[2] = {4, 5}, o11[2] = {1, 1};
    grove_module *pl[6] = {NULL};
    ck_assert_ok(grove_avg_pool2d_new(k3, s2, p1, true, false, 0, &pl[0], &err), &err);
    ck_assert_ok(grove_avg_pool2d_new(k3, s2, p1, true, true, 7, &pl[1], &err), &err);
    ck_assert_ok(grove_adaptive_avg_pool2d_new(o32, &pl[2], &err), &err);
    ck_assert_ok(grove_adaptive_max_pool2d_new(o45, &pl[3], &err), &err);
    ck_assert_ok(grove_adaptive_max_pool2d_new(o11, &pl[4], &err), &err);
    ck_assert_ok(grove_max_pool2d_new(k3, s2, p1, (int64_t[2]){2, 1}, true, &pl[5], &err), &err);
    for (int k = 0; k < 6; k++) {
      grove_tensor ref;
      ck_assert_ok(grove_module_call(pl[k], &f, &want, &ref), &err);
      in2.v[0] = nhwc;
      f.channels_last_ok = true;
      ck_assert_ok(grove_module_forward(pl[k], &f, &in2, &o2), &err);
      const bool unit = ref.shape[2] * ref.shape[3] == 1;
      ck_assert_msg(unit ? grove_tensor_is_contiguous(&o2.v[0]) : grove__is_nhwc(&o2.v[0]),
                    "%s (pool %d): channels last not kept", pl[k]->type->name, k);
      char what[96];
      snprintf(what, sizeof what, "%s (pool %d), channels last", pl[k]->type->name, k);
      assert_close_strided(what, &o2.v[0], &ref);
      grove_module_release(pl[k]);
    }
  }
  f.channels_last_ok = true;
  ck_assert_ok(grove_module_forward(conv, &f, &in, &o2), &err);
  ck_assert(grove__is_nhwc(&o2.v[0]));
  in2.v[0] = o2.v[0];
  f.channels_last_ok = true;
  ck_assert_ok(grove_module_forward(bn, &f, &in2, &o2), &err);
  ck_assert(grove__is_nhwc(&o2.v[0]));
  assert_close_strided("BatchNorm2d, channels last", &o2.v[0], &b);

  /* A channels-last result of the patch rows and the direct 1x1 path (the
   * product writing the output itself, bias and ReLU fused, when no
   * BatchNorm is folded in) has the values of the contiguous one. */
  {
    const grove_conv_opts ro[] = {co(1, 1, 1, 1, 0, 0, 1, 1, 1, true),
                                  co(3, 3, 2, 2, 1, 1, 1, 1, 1, true),
                                  co(3, 3, 1, 1, 2, 2, 2, 2, 1, false)};
    for (size_t k = 0; k < sizeof ro / sizeof ro[0]; k++) {
      grove_module *rc = NULL;
      ck_assert_ok(grove_conv2d_new(16, 40, &ro[k], &rc, &err), &err);
      randomize(rc, cw, ro[k].bias ? 2 : 1, 700 + (unsigned)k, -0.5f);
      ck_assert_ok(rc->type->refresh(rc, &err), &err);
      grove_module_eval(rc);
      for (int relu_on = 0; relu_on < 2; relu_on++) {
        grove_values o3 = {0};
        ck_assert_ok(grove__conv_forward_ex(rc, &f, &in, &o3, NULL, NULL, relu_on, false), &err);
        const grove_tensor ref = o3.v[0];
        ck_assert_ok(grove__conv_forward_ex(rc, &f, &in, &o2, NULL, NULL, relu_on, true), &err);
        ck_assert(grove__is_nhwc(&o2.v[0]));
        char what[80];
        snprintf(what, sizeof what, "rows conv %zu%s, channels last", k, relu_on ? " + ReLU" : "");
        assert_close_strided(what, &o2.v[0], &ref);
      }
      grove_module_release(rc);
    }
  }

  /* The depthwise kernel reads and writes channels last too, with a fused
   * BatchNorm2d and ReLU as well. */
  {
    grove_module *dw = NULL, *dbn = NULL;
    const grove_conv_opts od = co(3, 3, 2, 2, 1, 1, 1, 1, 24, true);
    ck_assert_ok(grove_conv2d_new(24, 24, &od, &dw, &err), &err);
    ck_assert_ok(grove_batch_norm2d_new(24, 1e-5, 0.1, true, true, &dbn, &err), &err);
    randomize(dw, cw, 2, 500, -0.5f);
    randomize(dbn, bw, 4, 600, 0.1f);
    ck_assert_ok(dw->type->refresh(dw, &err), &err);
    ck_assert_ok(dbn->type->refresh(dbn, &err), &err);
    grove_module_eval(dw);
    grove_module_eval(dbn);
    ck_assert(grove__conv_depthwise_path(dw));
    grove_tensor dref, bref, rref;
    ck_assert_ok(grove_module_call(dw, &f, &want, &dref), &err);
    ck_assert_ok(grove_module_call(dbn, &f, &dref, &bref), &err);
    ck_assert_ok(grove_module_call(relu, &f, &bref, &rref), &err);
    in2.v[0] = nhwc;
    f.channels_last_ok = true;
    ck_assert_ok(grove_module_forward(dw, &f, &in2, &o2), &err);
    ck_assert(grove__is_nhwc(&o2.v[0]));
    assert_close_strided("depthwise Conv2d, channels last", &o2.v[0], &dref);
    ck_assert_ok(grove__conv_bn_act_forward(dw, dbn, true, &f, &in2, &o2, true), &err);
    ck_assert(grove__is_nhwc(&o2.v[0]));
    assert_close_strided("depthwise Conv2d + BatchNorm2d + ReLU, channels last", &o2.v[0], &rref);
    ck_assert_ok(grove__conv_bn_act_forward(dw, dbn, true, &f, &in2, &o2, false), &err);
    ck_assert(grove_tensor_is_contiguous(&o2.v[0]));
    assert_close_strided("depthwise Conv2d + BatchNorm2d + ReLU, from channels last", &o2.v[0],
                         &rref);
    grove_module_release(dw);
    grove_module_release(dbn);
  }

  /* Arithmetic on channels last (graph_ops.c): with a number, in place,
   * the layout stays; with a per-channel operand ([C, 1, 1], [1, C, 1, 1],
   * [N, C, 1, 1]: a bias, squeeze-excitation's scale * input, either
   * order) it stays too, in place when offered the channels-last operand's
   * memory; with any other broadcast operand the result is contiguous. */
  {
    const int64_t C = want.shape[1], n = grove_tensor_numel(&want);
    grove_tensor cl, y, half, bias;
    ck_assert_ok(grove_fwd_alloc(&f, &cl, GROVE_F32, 4, nhwc.shape), &err);
    grove__set_nhwc(&cl);
    memcpy(cl.data, nhwc.data, (size_t)n * sizeof(float));
    float h = 0.5f;
    grove_tensor_init(&half, GROVE_F32, 0, NULL, &h);
    ck_assert_ok(grove__op_binary(&f, GROVE__BIN_MUL, &cl, &half, 1.0, &y, &cl), &err);
    ck_assert(grove__is_nhwc(&y) && y.data == cl.data);
    grove_tensor halved;
    ck_assert_ok(grove_fwd_alloc(&f, &halved, GROVE_F32, 4, want.shape), &err);
    for (int64_t k = 0; k < n; k++) ((float *)halved.data)[k] = ((const float *)want.data)[k] * h;
    assert_close_strided("NHWC * 0.5 in place", &y, &halved);
    const int64_t bs[3] = {C, 1, 1};
    ck_assert_ok(grove_fwd_alloc(&f, &bias, GROVE_F32, 3, bs), &err);
    for (int64_t k = 0; k < C; k++) ((float *)bias.data)[k] = (float)k;
    ck_assert_ok(grove__op_binary(&f, GROVE__BIN_ADD, &y, &bias, 1.0, &o2.v[0], &y), &err);
    ck_assert(grove__is_nhwc(&o2.v[0]) && o2.v[0].data == y.data);
    const int64_t HW = want.shape[2] * want.shape[3], N = want.shape[0];
    for (int64_t k = 0; k < n; k++) ((float *)halved.data)[k] += (float)(k / HW % C);
    assert_close_strided("NHWC + bias[C, 1, 1]", &o2.v[0], &halved);
    /* scale[N, C, 1, 1] - x and x / scale, one scale per image and channel:
     * the order of the operands holds. */
    const int64_t ss[4] = {N, C, 1, 1};
    grove_tensor sc, r1, r2, ref1, ref2;
    ck_assert_ok(grove_fwd_alloc(&f, &sc, GROVE_F32, 4, ss), &err);
    for (int64_t k = 0; k < N * C; k++) ((float *)sc.data)[k] = 0.25f + (float)k;
    ck_assert_ok(grove__op_binary(&f, GROVE__BIN_SUB, &sc, &o2.v[0], 1.0, &r1, NULL), &err);
    ck_assert_ok(grove__op_binary(&f, GROVE__BIN_DIV, &o2.v[0], &sc, 1.0, &r2, NULL), &err);
    ck_assert(grove__is_nhwc(&r1) && grove__is_nhwc(&r2));
    ck_assert_ok(grove_fwd_alloc(&f, &ref1, GROVE_F32, 4, want.shape), &err);
    ck_assert_ok(grove_fwd_alloc(&f, &ref2, GROVE_F32, 4, want.shape), &err);
    for (int64_t k = 0; k < n; k++) {
      const float v = ((const float *)halved.data)[k], w = ((const float *)sc.data)[k / HW];
      ((float *)ref1.data)[k] = w - v;
      ((float *)ref2.data)[k] = v / w;
    }
    assert_close_strided("scale[N, C, 1, 1] - NHWC", &r1, &ref1);
    assert_close_strided("NHWC / scale[N, C, 1, 1]", &r2, &ref2);
    /* A broadcast along the positions (a [1, 1, H, W] operand) makes it
     * contiguous. */
    const int64_t ps[4] = {1, 1, want.shape[2], want.shape[3]};
    grove_tensor pl, r3;
    ck_assert_ok(grove_fwd_alloc(&f, &pl, GROVE_F32, 4, ps), &err);
    for (int64_t k = 0; k < HW; k++) ((float *)pl.data)[k] = (float)k;
    ck_assert_ok(grove__op_binary(&f, GROVE__BIN_ADD, &o2.v[0], &pl, 1.0, &r3, NULL), &err);
    ck_assert(grove_tensor_is_contiguous(&r3));
    for (int64_t k = 0; k < n; k++) ((float *)ref1.data)[k] = ((const float *)halved.data)[k] +
                                                           (float)(k % HW);
    assert_close_strided("NHWC + plane[1, 1, H, W]", &r3, &ref1);
  }

  /* cat along channels of channels-last tensors stays channels last (no
   * transpose per input); with a contiguous operand the result is
   * contiguous; the values are torch.cat's either way. */
  {
    const int64_t C = want.shape[1], HW = want.shape[2] * want.shape[3];
    const grove_tensor two_cl[2] = {nhwc, nhwc}, mixed[2] = {nhwc, want};
    grove_tensor cat, twice;
    int64_t cs[4] = {want.shape[0], 2 * C, want.shape[2], want.shape[3]};
    ck_assert_ok(grove_fwd_alloc(&f, &twice, GROVE_F32, 4, cs), &err);
    for (int64_t i = 0; i < grove_tensor_numel(&twice); i++) {
      const int64_t img = i / (2 * C * HW), ch = i / HW % (2 * C), q = i % HW;
      ((float *)twice.data)[i] = ((const float *)want.data)[(img * C + ch % C) * HW + q];
    }
    ck_assert_ok(grove__op_cat(&f, two_cl, 2, 1, &cat), &err);
    ck_assert_msg(grove__is_nhwc(&cat), "cat of channels-last tensors: result not channels last");
    assert_close_strided("cat, channels last", &cat, &twice);
    ck_assert_ok(grove__op_cat(&f, mixed, 2, -3, &cat), &err);
    ck_assert(grove_tensor_is_contiguous(&cat));
    assert_close_strided("cat, channels last and contiguous", &cat, &twice);
  }

  /* A caller that did not ask (a zeroed flag: every public call) gets a
   * contiguous tensor, from a channels-last input too. */
  f.channels_last_ok = false;
  ck_assert_ok(grove_module_forward(seq, &f, &in, &out), &err);
  ck_assert(grove_tensor_is_contiguous(&out.v[0]));
  assert_close_strided("Sequential, contiguous", &out.v[0], &want);
  in2.v[0] = nhwc;
  f.channels_last_ok = false;
  ck_assert_ok(grove_module_forward(relu, &f, &in2, &o2), &err);
  ck_assert(grove_tensor_is_contiguous(&o2.v[0]));
  assert_close_strided("ReLU, contiguous", &o2.v[0], &want);
  grove_tensor plain;
  ck_assert_ok(grove__fwd_contig(&f, &nhwc, &plain), &err);
  ck_assert(grove_tensor_is_contiguous(&plain));
  assert_close_strided("a contiguous copy", &plain, &want);

  /* Hooks see contiguous tensors (and unfuse the chain). */
  uint64_t id;
  hook_calls = hook_strided = 0;
  ck_assert_ok(grove_module_register_forward_hook(relu, see_layout, NULL, false, &id), &err);
  f.channels_last_ok = true;
  ck_assert_ok(grove_module_forward(seq, &f, &in, &out), &err);
  ck_assert_int_eq(hook_calls, 1);
  ck_assert_int_eq(hook_strided, 0);
  assert_close_strided("Sequential, hooked", &out.v[0], &want);
  ck_assert(grove_module_remove_hook(relu, id));

  grove_arena_free(a);
  grove_module_release(conv);
  grove_module_release(bn);
  grove_module_release(relu);
  grove_module_release(seq);
  grove_module_release(gap);
  grove_tensor_release(x);
}
END_TEST

static Suite *conv_suite(void) {
  Suite *s = suite_create("conv");
  TCase *tc = tcase_create("parity");
  tcase_add_loop_test(tc, test_parity, 0, NCASES);
  tcase_add_test(tc, test_strided_input);
  tcase_add_test(tc, test_epilogue);
  tcase_add_test(tc, test_threads_bitwise);
  tcase_add_test(tc, test_pool_nhwc_channel_blocks);
  tcase_add_test(tc, test_winograd_by_image);
  tcase_add_test(tc, test_channels_last);
  tcase_add_test(tc, test_fused_act);
  tcase_add_test(tc, test_conv_residual);
  tcase_add_test(tc, test_bn_fold);
  suite_add_tcase(s, tc);
  tc = tcase_create("errors");
  tcase_add_test(tc, test_shape_errors);
  tcase_add_test(tc, test_constructor_errors);
  tcase_add_test(tc, test_json_errors);
  tcase_add_test(tc, test_state_dict_layout);
  suite_add_tcase(s, tc);
  return s;
}

GROVE_TEST_MAIN(conv_suite)
