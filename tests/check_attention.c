/* check_attention.c: MultiheadAttention, TransformerEncoderLayer and
 * TransformerEncoder against PyTorch, plus their errors.
 *
 * Parity: tests/fixtures_gen/attention.py writes attn_<case>.safetensors
 * (state_dict under "w.", inputs q[, k, v], torch's output y and, when asked,
 * the attention weights a) and attn_<case>.json (the exporter's model.json
 * object).  Each case is built with the C constructor (the table mirrors
 * CASES) and from the JSON, loaded strictly and compared with torch (rtol
 * 1e-4, atol 1e-5). */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph.h"
#include "layers_internal.h"
#include "testutil.h"

#define RTOL 1e-4
#define ATOL 1e-5

typedef struct acase {
  const char *name;
  bool need_weights, average; /* MultiheadAttention's call */
} acase;

static const acase cases[] = {
    {"mha_self_seq", true, true},  {"mha_self_bf", false, true}, {"mha_cross_bf", true, false},
    {"mha_cross_seq", true, true}, {"mha_b1", true, true},       {"mha_nobias", true, true},
    {"mha_unbatched", true, true}, {"mha_big", true, true},      {"tel_relu_bf", 0, 0},
    {"tel_gelu_normfirst", 0, 0},  {"tel_odd_b1", 0, 0},         {"tel_unbatched", 0, 0},
    {"te_2_norm", 0, 0},           {"te_3_gelu", 0, 0},
};
#define NCASES ((int)(sizeof cases / sizeof cases[0]))

static grove_encoder_layer_opts lo(int64_t d, int64_t h, int64_t ff, const char *act, bool bf,
                                   bool nf, double eps) {
  return (grove_encoder_layer_opts){.d_model = d,
                                    .nhead = h,
                                    .dim_feedforward = ff,
                                    .dropout = 0.1,
                                    .activation = act,
                                    .layer_norm_eps = eps,
                                    .batch_first = bf,
                                    .norm_first = nf};
}

static grove_module *build_case(const char *name, grove_err *err) {
  grove_module *m = NULL, *norm = NULL;
  grove_status s = GROVE_E_NOT_FOUND;
  grove_encoder_layer_opts o;
  int64_t n16 = 16;
#define CASE(n, call) else if (strcmp(name, n) == 0) s = (call)
  if (0) {
  }
  CASE("mha_self_seq", grove_multihead_attention_new(8, 2, true, false, &m, err));
  CASE("mha_self_bf", grove_multihead_attention_new(8, 4, true, true, &m, err));
  CASE("mha_cross_bf", grove_multihead_attention_new(12, 3, true, true, &m, err));
  CASE("mha_cross_seq", grove_multihead_attention_new(6, 2, true, false, &m, err));
  CASE("mha_b1", grove_multihead_attention_new(6, 1, true, false, &m, err));
  CASE("mha_nobias", grove_multihead_attention_new(8, 2, false, false, &m, err));
  CASE("mha_unbatched", grove_multihead_attention_new(8, 2, true, false, &m, err));
  CASE("mha_big", grove_multihead_attention_new(128, 2, true, true, &m, err));
  CASE("tel_relu_bf", (o = lo(16, 4, 32, "relu", true, false, 1e-5),
                       grove_transformer_encoder_layer_new(&o, &m, err)));
  CASE("tel_gelu_normfirst", (o = lo(16, 2, 24, "gelu", false, true, 1e-5),
                              grove_transformer_encoder_layer_new(&o, &m, err)));
  CASE("tel_odd_b1", (o = lo(12, 3, 20, NULL, true, false, 1e-3),
                      grove_transformer_encoder_layer_new(&o, &m, err)));
  CASE("tel_unbatched", (o = lo(8, 2, 16, "relu", false, false, 1e-5),
                         grove_transformer_encoder_layer_new(&o, &m, err)));
  else if (strcmp(name, "te_2_norm") == 0) {
    ck_assert_ok(grove_layer_norm_new(1, &n16, 1e-5, true, &norm, err), err);
    o = lo(16, 4, 32, "relu", true, false, 1e-5);
    s = grove_transformer_encoder_new(&o, 2, norm, &m, err);
    grove_module_release(norm);
  }
  CASE("te_3_gelu", (o = lo(8, 2, 16, "gelu", false, false, 1e-5),
                     grove_transformer_encoder_new(&o, 3, NULL, &m, err)));
#undef CASE
  ck_assert_msg(s != GROVE_E_NOT_FOUND, "no C constructor for case %s", name);
  ck_assert_ok(s, err);
  return m;
}

typedef struct fixture {
  grove_state_dict *file, *weights;
  grove_values in;
  grove_tensor *y, *a;
  char *json;
} fixture;

static void fixture_load(fixture *fx, const char *name) {
  grove_err err = {0};
  char fname[256];
  snprintf(fname, sizeof fname, "attn_%s.safetensors", name);
  ck_assert_ok(grove_safetensors_read(grove_fixture(fname), &fx->file, &err), &err);
  fx->weights = grove_sd_new();
  for (size_t i = 0; i < grove_sd_count(fx->file); i++) {
    const char *k = grove_sd_key(fx->file, i);
    if (strncmp(k, "w.", 2) == 0)
      ck_assert_ok(grove_sd_set(fx->weights, k + 2, grove_sd_tensor(fx->file, i), &err), &err);
  }
  static const char *const in_keys[] = {"q", "k", "v"};
  fx->in.n = 0;
  for (int i = 0; i < 3; i++) {
    grove_tensor *t = grove_sd_get(fx->file, in_keys[i]);
    if (t) fx->in.v[fx->in.n++] = *t;
  }
  fx->y = grove_sd_get(fx->file, "y");
  fx->a = grove_sd_get(fx->file, "a");
  ck_assert_ptr_nonnull(fx->y);
  snprintf(fname, sizeof fname, "attn_%s.json", name);
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

static void run_case(const acase *c, grove_module *m, fixture *fx, const char *what) {
  grove_err err = {0};
  ck_assert_ok(grove_module_load_state_dict(m, fx->weights, NULL, NULL, &err), &err);
  grove_arena *arena = grove_arena_new(0);
  grove_fwd f = {.arena = arena, .err = &err};
  for (int pass = 0; pass < 2; pass++) {
    grove_values out = {0};
    bool mha = m->type == &grove__mha_type;
    if (mha) grove__mha_next_call(&f, m, c->need_weights, c->average);
    size_t grows = grove_arena_grow_count(arena);
    ck_assert_ok(grove_module_forward(m, &f, &fx->in, &out), &err);
    if (pass == 1) ck_assert_uint_eq(grove_arena_grow_count(arena), grows);
    assert_close(what, &out.v[0], fx->y);
    if (mha) {
      ck_assert_int_eq(out.n, c->need_weights ? 2 : 1);
      if (c->need_weights) assert_close("attention weights", &out.v[1], fx->a);
    } else {
      ck_assert_int_eq(out.n, 1);
    }
    grove_arena_reset(arena);
  }
  grove_arena_free(arena);
}

START_TEST(test_parity) {
  const acase *c = &cases[_i];
  fixture fx = {0};
  grove_err err = {0};
  fixture_load(&fx, c->name);
  grove_module *m = build_case(c->name, &err);
  grove_module_eval(m);
  run_case(c, m, &fx, c->name);
  grove_module_release(m);

  size_t n = strlen(fx.json) + 256;
  char *doc = malloc(n);
  snprintf(doc, n,
           "{\"format\": \"grove.model/1\", \"inputs\": [{\"name\": \"x\", \"dtype\": "
           "\"float32\", \"shape\": [-1]}], \"module\": %s}",
           fx.json);
  grove_model *model = NULL;
  ck_assert_ok(grove_model_from_spec(doc, "attn.json", &model, &err), &err);
  free(doc);
  char what[256];
  snprintf(what, sizeof what, "%s (from model.json)", c->name);
  run_case(c, model->root, &fx, what);
  grove_model_free(model);
  fixture_fini(&fx);
}
END_TEST

/* Without a call of its own, MultiheadAttention returns torch's defaults:
 * the output and the weights averaged over heads; one tensor is q = k = v. */
START_TEST(test_mha_defaults) {
  fixture fx = {0};
  grove_err err = {0};
  fixture_load(&fx, "mha_self_seq");
  grove_module *m = build_case("mha_self_seq", &err);
  grove_module_eval(m);
  ck_assert_ok(grove_module_load_state_dict(m, fx.weights, NULL, NULL, &err), &err);
  grove_arena *a = grove_arena_new(0);
  grove_fwd f = {.arena = a, .err = &err};
  grove_values in = {.n = 3}, out = {0};
  in.v[0] = in.v[1] = in.v[2] = fx.in.v[0];
  ck_assert_ok(grove_module_forward(m, &f, &in, &out), &err);
  ck_assert_int_eq(out.n, 2);
  assert_close("mha", &out.v[0], fx.y);
  assert_close("mha weights", &out.v[1], fx.a);
  /* A call set for another module does not apply. */
  grove__mha_next_call(&f, NULL, false, false);
  in.n = 1;
  ck_assert_ok(grove_module_forward(m, &f, &in, &out), &err);
  ck_assert_int_eq(out.n, 2);
  assert_close("mha (one input)", &out.v[0], fx.y);
  grove_arena_free(a);
  grove_module_release(m);
  fixture_fini(&fx);
}
END_TEST

/* Hooks on the layer's children fire (torch's slow path calls them as
 * modules), and the result stays torch's. */
static int hook_calls;
static grove_status count_hook(void *user, const grove_module *m, grove_fwd *f,
                               const grove_values *in, grove_values *out) {
  hook_calls++;
  return GROVE_OK;
}

START_TEST(test_encoder_hooks) {
  fixture fx = {0};
  grove_err err = {0};
  fixture_load(&fx, "te_2_norm");
  grove_module *m = build_case("te_2_norm", &err);
  grove_module_eval(m);
  ck_assert_ok(grove_module_load_state_dict(m, fx.weights, NULL, NULL, &err), &err);
  grove_module *lin = grove_module_find(m, "layers.1.linear1");
  grove_module *sa = grove_module_find(m, "layers.0.self_attn");
  ck_assert_ptr_nonnull(lin);
  ck_assert_ptr_nonnull(sa);
  uint64_t id1, id2;
  ck_assert_ok(grove_module_register_forward_hook(lin, count_hook, NULL, false, &id1), &err);
  ck_assert_ok(grove_module_register_forward_hook(sa, count_hook, NULL, false, &id2), &err);
  grove_arena *a = grove_arena_new(0);
  grove_fwd f = {.arena = a, .err = &err};
  grove_values out = {0};
  hook_calls = 0;
  ck_assert_ok(grove_module_forward(m, &f, &fx.in, &out), &err);
  ck_assert_int_eq(hook_calls, 2);
  assert_close("hooked encoder", &out.v[0], fx.y);
  ck_assert(grove_module_remove_hook(lin, id1));
  ck_assert(grove_module_remove_hook(sa, id2));
  grove_arena_free(a);
  grove_module_release(m);
  fixture_fini(&fx);
}
END_TEST

/* An encoder gives its scratch back between layers: a deep one needs about
 * the scratch of one layer. */
START_TEST(test_encoder_scratch) {
  grove_err err = {0};
  grove_encoder_layer_opts o = lo(32, 4, 64, "relu", true, false, 1e-5);
  grove_module *one, *deep;
  ck_assert_ok(grove_transformer_encoder_new(&o, 1, NULL, &one, &err), &err);
  ck_assert_ok(grove_transformer_encoder_new(&o, 12, NULL, &deep, &err), &err);
  grove_module_eval(one);
  grove_module_eval(deep);
  int64_t shape[3] = {4, 10, 32};
  float *buf = calloc(4 * 10 * 32, sizeof(float));
  for (int i = 0; i < 4 * 10 * 32; i++) buf[i] = (float)(i % 7) * 0.1f;
  grove_tensor x, y;
  grove_tensor_init(&x, GROVE_F32, 3, shape, buf);
  size_t hw[2];
  grove_module *ms[2] = {one, deep};
  for (int k = 0; k < 2; k++) {
    grove_arena *a = grove_arena_new(0);
    grove_fwd f = {.arena = a, .err = &err};
    ck_assert_ok(grove_module_call(ms[k], &f, &x, &y), &err);
    hw[k] = grove_arena_high_water(a);
    grove_arena_free(a);
  }
  ck_assert_msg(hw[1] < hw[0] + 4 * 10 * 32 * sizeof(float) * 2,
                "12 layers took %zu bytes of scratch, 1 layer %zu", hw[1], hw[0]);
  free(buf);
  grove_module_release(one);
  grove_module_release(deep);
}
END_TEST

static grove_status call_mha(grove_module *m, int n, const int64_t *qs, int qnd, const int64_t *ks,
                             int knd) {
  grove_err err = {0};
  float *buf = calloc(4096, sizeof(float));
  grove_values in = {.n = n}, out = {0};
  grove_tensor_init(&in.v[0], GROVE_F32, qnd, qs, buf);
  for (int i = 1; i < n; i++) grove_tensor_init(&in.v[i], GROVE_F32, knd, ks, buf);
  grove_arena *a = grove_arena_new(0);
  grove_fwd f = {.arena = a, .err = &err};
  grove_status s = grove_module_forward(m, &f, &in, &out);
  grove_arena_free(a);
  free(buf);
  return s;
}

START_TEST(test_errors) {
  grove_err err = {0};
  grove_module *m = NULL;
  ck_assert_status(grove_multihead_attention_new(10, 3, true, false, &m, &err),
                   GROVE_E_INVALID_ARGUMENT);
  ck_assert_ptr_null(m);
  ck_assert_ok(grove_multihead_attention_new(8, 2, true, true, &m, &err), &err);
  grove_module_eval(m);
  ck_assert_status(call_mha(m, 2, (int64_t[]){2, 3, 8}, 3, (int64_t[]){2, 3, 8}, 3),
                   GROVE_E_INVALID_ARGUMENT);
  ck_assert_status(call_mha(m, 3, (int64_t[]){2, 3, 6}, 3, (int64_t[]){2, 3, 6}, 3), GROVE_E_SHAPE);
  ck_assert_status(call_mha(m, 3, (int64_t[]){2, 3, 8}, 3, (int64_t[]){4, 3, 8}, 3), GROVE_E_SHAPE);
  ck_assert_status(call_mha(m, 3, (int64_t[]){2, 3, 8}, 3, (int64_t[]){3, 8}, 2), GROVE_E_SHAPE);
  ck_assert_status(call_mha(m, 3, (int64_t[]){2, 3, 8}, 3, (int64_t[]){2, 5, 8}, 3), GROVE_OK);
  grove_module_release(m);
  grove_encoder_layer_opts o = lo(8, 2, 16, "tanh", false, false, 1e-5);
  ck_assert_status(grove_transformer_encoder_layer_new(&o, &m, &err), GROVE_E_INVALID_ARGUMENT);
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
  json_err("{\"type\": \"MultiheadAttention\", \"embed_dim\": 8, \"num_heads\": 2, \"kdim\": 0}",
           GROVE_E_SPEC, "$.module.kdim");
  json_err(
      "{\"type\": \"Transformer\", \"d_model\": 8, \"nhead\": 2, "
      "\"custom_encoder\": {\"type\": \"Linear\"}}",
      GROVE_E_UNSUPPORTED, "$.module.custom_encoder: a custom encoder or decoder");
  json_err(
      "{\"type\": \"TransformerDecoder\", \"num_layers\": 2, \"decoder_layer\": {\"type\": "
      "\"TransformerEncoderLayer\", \"d_model\": 8, \"nhead\": 2}}",
      GROVE_E_SPEC, "$.module.decoder_layer: expected a {\"type\": \"TransformerDecoderLayer\"");
  json_err(
      "{\"type\": \"TransformerDecoderLayer\", \"d_model\": 8, \"nhead\": 3}",
      GROVE_E_SPEC, "$.module.nhead: d_model (8) must be divisible by nhead (3)");
  json_err("{\"type\": \"MultiheadAttention\", \"embed_dim\": 8, \"num_heads\": 3}", GROVE_E_SPEC,
           "$.module.num_heads: embed_dim (8) must be divisible by num_heads (3)");
  json_err(
      "{\"type\": \"TransformerEncoderLayer\", \"d_model\": 8, \"nhead\": 2, "
      "\"activation\": \"tanh\"}",
      GROVE_E_SPEC, "$.module.activation: expected one of \"relu\", \"gelu\"");
  json_err(
      "{\"type\": \"TransformerEncoder\", \"num_layers\": 2, \"encoder_layer\": {\"type\": "
      "\"Linear\"}}",
      GROVE_E_SPEC, "$.module.encoder_layer: expected a {\"type\": \"TransformerEncoderLayer\"");
  json_err(
      "{\"type\": \"TransformerEncoder\", \"num_layers\": 2, \"encoder_layer\": {\"type\": "
      "\"TransformerEncoderLayer\", \"d_model\": 8}}",
      GROVE_E_SPEC, "$.module.encoder_layer.nhead: missing required argument");
  json_err(
      "{\"type\": \"TransformerEncoder\", \"num_layers\": 2, \"norm\": {\"type\": "
      "\"BatchNorm1d\"}, \"encoder_layer\": {\"type\": \"TransformerEncoderLayer\", "
      "\"d_model\": 8, \"nhead\": 2}}",
      GROVE_E_SPEC, "$.module.norm: expected null or a {\"type\": \"LayerNorm\"");
}
END_TEST

/* torch's state_dict layout, keys and order. */
START_TEST(test_state_dict_layout) {
  grove_err err = {0};
  grove_encoder_layer_opts o = lo(8, 2, 16, "relu", false, false, 1e-5);
  grove_module *m;
  ck_assert_ok(grove_transformer_encoder_new(&o, 2, NULL, &m, &err), &err);
  grove_state_dict *sd = grove_sd_new();
  ck_assert_ok(grove_module_state_dict(m, NULL, sd, &err), &err);
  static const char *const keys[] = {"layers.0.self_attn.in_proj_weight",
                                     "layers.0.self_attn.in_proj_bias",
                                     "layers.0.self_attn.out_proj.weight",
                                     "layers.0.self_attn.out_proj.bias",
                                     "layers.0.linear1.weight",
                                     "layers.0.linear1.bias",
                                     "layers.0.linear2.weight",
                                     "layers.0.linear2.bias",
                                     "layers.0.norm1.weight",
                                     "layers.0.norm1.bias",
                                     "layers.0.norm2.weight",
                                     "layers.0.norm2.bias"};
  ck_assert_uint_eq(grove_sd_count(sd), 24);
  for (size_t i = 0; i < 12; i++) ck_assert_str_eq(grove_sd_key(sd, i), keys[i]);
  ck_assert_str_eq(grove_sd_key(sd, 12), "layers.1.self_attn.in_proj_weight");
  grove_sd_free(sd);
  grove_module_release(m);
}
END_TEST

/* ------------------------------------------------------------ masks, decoders */

/* tests/fixtures_gen/attention_masks.py: each case built from the
 * exporter's JSON, its masks set in the forward's context (slot i = the i-th
 * mask argument of torch's forward), compared with torch, NaN where torch
 * gives NaN (rows whose every key is masked). */
static void mask_case(const char *name, bool threads) {
  grove_err err = {0};
  char fname[256];
  snprintf(fname, sizeof fname, "attnm_%s.safetensors", name);
  grove_state_dict *file = NULL;
  ck_assert_ok(grove_safetensors_read(grove_fixture(fname), &file, &err), &err);
  snprintf(fname, sizeof fname, "attnm_%s.json", name);
  char *text = grove_test_read_file(grove_fixture(fname), NULL);
  ck_assert_ptr_nonnull(text);
  json_error_t je;
  json_t *meta = json_loads(text, 0, &je);
  ck_assert_ptr_nonnull(meta);
  char *module = json_dumps(json_object_get(meta, "module"), JSON_COMPACT);
  const int nmasks = (int)json_integer_value(json_object_get(meta, "nmasks"));
  const bool need = json_is_true(json_object_get(meta, "need_weights"));
  const bool avg = json_is_true(json_object_get(meta, "average"));
  size_t n = strlen(module) + 256;
  char *doc = malloc(n);
  snprintf(doc, n,
           "{\"format\": \"grove.model/1\", \"inputs\": [{\"name\": \"x\", \"dtype\": "
           "\"float32\", \"shape\": [-1]}], \"module\": %s}",
           module);
  grove_model *model = NULL;
  ck_assert_ok(grove_model_from_spec(doc, fname, &model, &err), &err);
  grove_state_dict *w = grove_sd_new();
  for (size_t i = 0; i < grove_sd_count(file); i++) {
    const char *k = grove_sd_key(file, i);
    if (strncmp(k, "w.", 2) == 0)
      ck_assert_ok(grove_sd_set(w, k + 2, grove_sd_tensor(file, i), &err), &err);
  }
  grove_module *m = model->root;
  ck_assert_ok(grove_module_load_state_dict(m, w, NULL, NULL, &err), &err);
  /* torch's state_dict keys, in torch's order. */
  grove_state_dict *sd = grove_sd_new();
  ck_assert_ok(grove_module_state_dict(m, NULL, sd, &err), &err);
  const json_t *keys = json_object_get(meta, "keys");
  ck_assert_uint_eq(grove_sd_count(sd), json_array_size(keys));
  for (size_t i = 0; i < grove_sd_count(sd); i++)
    ck_assert_msg(strcmp(grove_sd_key(sd, i), json_string_value(json_array_get(keys, i))) == 0,
                  "%s: state_dict key %zu is %s, torch's %s", name, i, grove_sd_key(sd, i),
                  json_string_value(json_array_get(keys, i)));
  grove_sd_free(sd);
  grove_values in = {0}, out = {0};
  for (int i = 0; i < 3; i++) {
    char k[8];
    snprintf(k, sizeof k, "x%d", i);
    grove_tensor *t = grove_sd_get(file, k);
    if (t) in.v[in.n++] = *t;
  }
  const grove_tensor *masks[6] = {NULL};
  for (int i = 0; i < nmasks; i++) {
    char k[8];
    snprintf(k, sizeof k, "m%d", i);
    masks[i] = grove_sd_get(file, k);
  }
  grove_tensor *y = grove_sd_get(file, "y"), *a = grove_sd_get(file, "a");
  grove_arena *arena = grove_arena_new(0);
  grove_fwd f = {.arena = arena, .err = &err};
  if (m->type == &grove__mha_type) grove__mha_next_call(&f, m, need, avg);
  grove__next_call_masks(&f, m, nmasks, masks);
  grove_status s = grove_module_forward(m, &f, &in, &out);
  ck_assert_msg(s == GROVE_OK, "%s: %s", name, err.msg);
  ck_assert_ptr_null(f.mha.m); /* the callee took its call */
  char what[256];
  snprintf(what, sizeof what, "%s: output", name);
  assert_close(what, &out.v[0], y);
  ck_assert_int_eq(out.n, a ? 2 : 1);
  snprintf(what, sizeof what, "%s: attention weights", name);
  if (a) assert_close(what, &out.v[1], a);
  if (threads) {
    /* The heads run on the compute threads: the same bits on 1 and 2.  Not
     * where a head's products go to OpenBLAS (no AVX-512, or GROVE_GEMM=avx2,
     * and a large head): OpenBLAS splits one product over its own threads,
     * and its Haswell and Zen kernels (0.3.21) then give other bits than on
     * one thread; the torch comparison above still holds there. */
    const json_t *mj = json_object_get(meta, "module");
    const bool bf = json_is_true(json_object_get(mj, "batch_first"));
    const int64_t H = json_integer_value(json_object_get(mj, "num_heads"));
    const int64_t d = json_integer_value(json_object_get(mj, "embed_dim")) / H;
    const grove_tensor *qt = &in.v[0], *kt = in.n > 1 ? &in.v[1] : &in.v[0];
    const int seq = qt->ndim == 3 && bf ? 1 : 0;
    threads = grove__attend_head_threads(qt->shape[seq], kt->shape[seq], d);
  }
  if (threads) {
    grove_values o1 = {0}, o2 = {0};
    grove_arena *a1 = grove_arena_new(0), *a2 = grove_arena_new(0);
    grove_fwd f1 = {.arena = a1, .err = &err}, f2 = {.arena = a2, .err = &err};
    grove_set_compute_threads(1);
    if (m->type == &grove__mha_type) grove__mha_next_call(&f1, m, need, avg);
    grove__next_call_masks(&f1, m, nmasks, masks);
    ck_assert_ok(grove_module_forward(m, &f1, &in, &o1), &err);
    grove_set_compute_threads(2);
    if (m->type == &grove__mha_type) grove__mha_next_call(&f2, m, need, avg);
    grove__next_call_masks(&f2, m, nmasks, masks);
    ck_assert_ok(grove_module_forward(m, &f2, &in, &o2), &err);
    grove_set_compute_threads(1);
    ck_assert_int_eq(o1.n, o2.n);
    for (int k = 0; k < o1.n; k++)
      ck_assert_msg(memcmp(o1.v[k].data, o2.v[k].data, grove_tensor_nbytes(&o1.v[k])) == 0,
                    "%s: output %d differs between 1 and 2 compute threads", name, k);
    grove_arena_free(a1);
    grove_arena_free(a2);
  }
  grove_arena_free(arena);
  grove_sd_free(w);
  grove_model_free(model);
  free(doc);
  free(module);
  json_decref(meta);
  free(text);
  grove_sd_free(file);
}

START_TEST(test_mask_parity) {
  char *text = grove_test_read_file(grove_fixture("attnm_index.json"), NULL);
  ck_assert_ptr_nonnull(text);
  json_error_t je;
  json_t *names = json_loads(text, 0, &je);
  ck_assert(json_array_size(names) >= 30);
  for (size_t i = 0; i < json_array_size(names); i++)
    mask_case(json_string_value(json_array_get(names, i)), false);
  json_decref(names);
  free(text);
}
END_TEST

/* Long sequences (more than 64 keys, every mask kind) give the same bits on
 * one compute thread and on two: the heads are independent units whatever
 * thread takes them. */
START_TEST(test_long_threads_bitwise) {
  mask_case("mha_long_kpm_bf", true);
  mask_case("mha_long_causal_avg", true);
  mask_case("mha_long_am3_kpm", true);
}
END_TEST

/* A fully masked row is NaN, as torch 1.13 computes it; the other rows are
 * finite.  (The parity cases cover it too; this says it outright.) */
START_TEST(test_mask_full_row_nan) {
  grove_err err = {0};
  grove_module *m;
  ck_assert_ok(grove_multihead_attention_new(4, 2, true, false, &m, &err), &err);
  grove_module_eval(m);
  float x[3 * 1 * 4];
  for (int i = 0; i < 12; i++) x[i] = (float)i * 0.1f;
  bool am[9] = {false, true, true, true, true, true, false, false, false};
  grove_values in = {.n = 1}, out = {0};
  grove_tensor_init(&in.v[0], GROVE_F32, 3, (int64_t[]){3, 1, 4}, x);
  grove_tensor mask;
  grove_tensor_init(&mask, GROVE_BOOL, 2, (int64_t[]){3, 3}, am);
  const grove_tensor *masks[2] = {NULL, &mask};
  grove_arena *a = grove_arena_new(0);
  grove_fwd f = {.arena = a, .err = &err};
  grove__next_call_masks(&f, m, 2, masks);
  ck_assert_ok(grove_module_forward(m, &f, &in, &out), &err);
  const float *y = out.v[0].data, *w = out.v[1].data;
  for (int j = 0; j < 4; j++) {
    ck_assert(isfinite(y[j]) && isnan(y[4 + j]) && isfinite(y[8 + j]));
  }
  ck_assert(w[0] == 1.0f && w[1] == 0.0f && isnan(w[3]));
  /* A wrong mask shape is an error naming the mask, and so is an int mask. */
  grove_tensor_init(&mask, GROVE_BOOL, 2, (int64_t[]){3, 2}, am);
  grove__next_call_masks(&f, m, 2, masks);
  ck_assert_status(grove_module_forward(m, &f, &in, &out), GROVE_E_SHAPE);
  ck_assert_msg(strstr(err.msg, "2D attn_mask"), "%s", err.msg);
  int64_t im[3] = {0};
  grove_tensor_init(&mask, GROVE_I64, 2, (int64_t[]){1, 3}, im);
  masks[0] = &mask;
  masks[1] = NULL;
  grove__next_call_masks(&f, m, 2, masks);
  ck_assert_status(grove_module_forward(m, &f, &in, &out), GROVE_E_DTYPE);
  ck_assert_msg(strstr(err.msg, "key_padding_mask"), "%s", err.msg);
  grove_arena_free(a);
  grove_module_release(m);
}
END_TEST

/* A weight that would be subnormal is 0 (AVX-512 path: every FMA of the mix
 * reading one takes a microcode assist, which made Swin's shifted windows,
 * masked with -100, run their mix at a fifth of its speed); a tiny normal
 * one stays.  Equal scores, keys 0-9 unmasked, key 10 at -80 (exp 1.8e-35,
 * normal), keys 11-19 at -100 (Swin's mask: exp 3.7e-44, subnormal). */
START_TEST(test_subnormal_weights_zero) {
  enum { L = 3, S = 20, D = 16 };
  float q[L * D] = {0}, k[S * D] = {0}, v[S * D], o[L * D], madd[S], sc[L * S], kt[D * S];
  for (int i = 0; i < S * D; i++) v[i] = (float)(i % 7) - 3.0f;
  for (int s = 0; s < S; s++) madd[s] = s < 10 ? 0.0f : s == 10 ? -80.0f : -100.0f;
  grove__attend_head(q, D, k, D, v, D, o, D, L, S, D, 0.125f, madd, 0, sc, kt);
  for (int l = 0; l < L; l++) {
    for (int s = 0; s < 10; s++) ck_assert_float_eq_tol(sc[l * S + s], 0.1f, 1e-6f);
    ck_assert(sc[l * S + 10] > 0.0f && sc[l * S + 10] < 1e-35f);
    if (grove__cpu_avx512())
      for (int s = 11; s < S; s++)
        ck_assert_msg(sc[l * S + s] == 0.0f, "weight %d is %g, not 0", s, sc[l * S + s]);
    for (int t = 0; t < D; t++) {
      double want = 0;
      for (int s = 0; s < 10; s++) want += 0.1 * v[s * D + t];
      ck_assert_float_eq_tol(o[l * D + t], (float)want, 1e-5f);
    }
  }
}
END_TEST

static Suite *attention_suite(void) {
  Suite *s = suite_create("attention");
  TCase *tc = tcase_create("parity");
  tcase_add_loop_test(tc, test_parity, 0, NCASES);
  tcase_add_test(tc, test_mha_defaults);
  tcase_add_test(tc, test_encoder_hooks);
  tcase_add_test(tc, test_encoder_scratch);
  tcase_add_test(tc, test_mask_parity);
  tcase_add_test(tc, test_mask_full_row_nan);
  tcase_add_test(tc, test_subnormal_weights_zero);
  tcase_add_test(tc, test_long_threads_bitwise);
  suite_add_tcase(s, tc);
  tc = tcase_create("errors");
  tcase_add_test(tc, test_errors);
  tcase_add_test(tc, test_json_errors);
  tcase_add_test(tc, test_state_dict_layout);
  suite_add_tcase(s, tc);
  return s;
}

GROVE_TEST_MAIN(attention_suite)
