/* check_graph.c: modules with a custom forward (torch.fx graphs, graph.c).
 *
 * Parity: tests/fixtures_gen/graphs.py exports small modules (every graph
 * operation, module calls returning tuples, nested graphs, parameters read by
 * get_attr, several inputs and outputs, fused conv/BatchNorm/ReLU chains)
 * with tools/grove_export.py and writes graph_<case>.json (model.json) and
 * graph_<case>.safetensors (w.* weights, inputs x0.., torch's outputs y0..).
 * Each case is built from the JSON, loaded strictly and run on three input
 * sets (another batch than the export's example, batch 1 and batch 7, one
 * after another on the same arena); every output is
 * compared with torch (rtol 1e-4, atol 1e-5), again after an arena reset
 * (no growth, same bits), and with a global forward hook registered (which
 * turns fusion off and must see every module call).
 *
 * Also: the arena's liveness (a long chain needs about two buffers), spec
 * errors naming the JSON path of the node, runtime errors naming the node and
 * its line of forward, holders that cannot be called, and the arena plans
 * (graph_plan.c) as the input signature changes and outgrows their cache. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph.h"
#include "graph_internal.h" /* GROVE__MAX_PLANS */
#include "layers_internal.h"
#include "testutil.h"

#define RTOL 1e-4
#define ATOL 1e-5

static const char *const cases[] = {
    "add_tensor",
    "add_broadcast",
    "sub_scalar",
    "mul_div",
    "matmul",
    "activations",
    "softmax",
    "dropout_flatten",
    "reshape_view",
    "permute_transpose",
    "cat",
    "mean_sum",
    "getitem",
    "sizes",
    "attn_tuple",
    "get_attr",
    "multi_io",
    "nested",
    "resnet_fused",
    "resnet_b1",
    "linear_relu",
    "holder",
    "embed_mean",
    "seq_masks",
    "seq_linalg",
    "functional_pools",
    "functional_pools1d",
    /* The zoo's operations (#18): tests/fixtures_gen/zoo_ops.py. */
    "zoo_acts",
    "zoo_conv_acts",
    "zoo_math",
    "zoo_compare",
    "zoo_shapes",
    "zoo_tensor_index",
    "zoo_picks",
    "zoo_resample",
    "zoo_pad_shuffle",
    "zoo_norms",
    "zoo_param_norms",
    "zoo_convert",
    "zoo_depth",
    "zoo_resample_modules",
    "zoo_pad_modules",
    "zoo_edge_pads",
    "zoo_unshuffle",
    "zoo_dropouts",
    "zoo_bicubic",
    "zoo_bilinear",
};
#define NCASES ((int)(sizeof cases / sizeof cases[0]))

/* One set of inputs and torch's outputs on them.  Set 0 is x0.. / y0..; the
 * generator adds s1.* (batch 1) and s2.* (batch 7). */
typedef struct io_set {
  grove_tensor x[GROVE_MAX_VALUES], y[GROVE_MAX_VALUES];
  int nx, ny;
} io_set;

#define NSETS 3

typedef struct fixture {
  grove_model *model;
  grove_state_dict *file;
  io_set set[NSETS];
  int nsets;
} fixture;

/* free_from > 0: the inputs' declared dimensions from that one on become
 * free (-1), for a model that runs at other sizes than its export's (a CNN
 * past an adaptive pool). */
static void fixture_load_free(fixture *fx, const char *name, int free_from) {
  grove_err err = {0};
  char fname[256];
  snprintf(fname, sizeof fname, "graph_%s.json", name);
  char *text = grove_test_read_file(grove_fixture(fname), NULL);
  ck_assert_ptr_nonnull(text);
  if (free_from > 0) {
    json_t *doc = json_loads(text, 0, NULL);
    ck_assert_ptr_nonnull(doc);
    size_t i;
    json_t *in;
    json_array_foreach(json_object_get(doc, "inputs"), i, in) {
      json_t *shape = json_object_get(in, "shape");
      for (size_t d = (size_t)free_from; d < json_array_size(shape); d++)
        json_array_set_new(shape, d, json_integer(-1));
    }
    free(text);
    text = json_dumps(doc, 0);
    json_decref(doc);
    ck_assert_ptr_nonnull(text);
  }
  ck_assert_ok(grove_model_from_spec(text, fname, &fx->model, &err), &err);
  free(text);
  snprintf(fname, sizeof fname, "graph_%s.safetensors", name);
  ck_assert_ok(grove_safetensors_read(grove_fixture(fname), &fx->file, &err), &err);
  grove_state_dict *w = grove_sd_new();
  for (size_t i = 0; i < grove_sd_count(fx->file); i++) {
    const char *k = grove_sd_key(fx->file, i);
    if (strncmp(k, "w.", 2) == 0)
      ck_assert_ok(grove_sd_set(w, k + 2, grove_sd_tensor(fx->file, i), &err), &err);
  }
  ck_assert_ok(grove_module_load_state_dict(fx->model->root, w, NULL, NULL, &err), &err);
  grove_sd_free(w);
  for (int j = 0; j < NSETS; j++) {
    char pre[8] = "";
    if (j > 0) snprintf(pre, sizeof pre, "s%d.", j);
    io_set *s = &fx->set[j];
    for (int i = 0; i < GROVE_MAX_VALUES; i++) {
      char k[32];
      snprintf(k, sizeof k, "%sx%d", pre, i);
      if (grove_sd_get(fx->file, k)) s->x[s->nx++] = *grove_sd_get(fx->file, k);
      snprintf(k, sizeof k, "%sy%d", pre, i);
      if (grove_sd_get(fx->file, k)) s->y[s->ny++] = *grove_sd_get(fx->file, k);
    }
    ck_assert_msg(s->nx > 0 && s->ny > 0, "graph_%s: input set %d is missing", name, j);
  }
  fx->nsets = NSETS;
}

static void fixture_load(fixture *fx, const char *name) {
  fixture_load_free(fx, name, 0);
}

static void fixture_fini(fixture *fx) {
  grove_model_free(fx->model);
  grove_sd_free(fx->file);
}

static void assert_close(const char *what, int k, const grove_tensor *got,
                         const grove_tensor *want) {
  char a[128], b[128];
  ck_assert_msg(grove_tensor_same_shape(got, want), "%s output %d: shape %s, torch %s", what, k,
                grove_shape_str(got->ndim, got->shape, a, sizeof a),
                grove_shape_str(want->ndim, want->shape, b, sizeof b));
  ck_assert_int_eq(got->dtype, GROVE_F32);
  grove_tensor c = *got;
  float *tmp = NULL;
  if (!grove_tensor_is_contiguous(got)) {
    tmp = malloc(grove_tensor_nbytes(got) + 1);
    grove_tensor_init(&c, GROVE_F32, got->ndim, got->shape, tmp);
    grove_err err = {0};
    ck_assert_ok(grove_tensor_copy(&c, got, &err), &err);
  }
  const float *g = c.data, *w = want->data;
  long bad = grove_test_allclose(g, w, (size_t)grove_tensor_numel(want), RTOL, ATOL);
  ck_assert_msg(bad < 0, "%s output %d: element %ld is %.9g, torch says %.9g", what, k, bad,
                bad >= 0 ? g[bad] : 0.0, bad >= 0 ? w[bad] : 0.0);
  free(tmp);
}

static int hook_calls;
static grove_status count_hook(void *user, const grove_module *m, grove_fwd *f,
                               const grove_values *in, grove_values *out) {
  hook_calls++;
  return GROVE_OK;
}

/* One input set through the model: torch's outputs, the same bits after an
 * arena reset with no growth, and with a hook registered. */
static void run_set(fixture *fx, grove_arena *arena, const char *name, int j) {
  const io_set *s = &fx->set[j];
  char what[96];
  snprintf(what, sizeof what, "%s, set %d (batch %lld)", name, j, (long long)s->x[0].shape[0]);
  grove_err err = {0};
  grove_values out;
  grove_arena_reset(arena);
  ck_assert_ok(grove_model_forward(fx->model, arena, s->x, (size_t)s->nx, &out, &err), &err);
  ck_assert_int_eq(out.n, s->ny);
  for (int k = 0; k < out.n; k++) assert_close(what, k, &out.v[k], &s->y[k]);
  /* Outputs are contiguous copies of arena memory; keep them to compare. */
  size_t total = 0;
  for (int k = 0; k < out.n; k++) total += grove_tensor_nbytes(&out.v[k]);
  char *first = malloc(total + 1), *p = first;
  for (int k = 0; k < out.n; k++) {
    ck_assert(grove_tensor_is_contiguous(&out.v[k]));
    memcpy(p, out.v[k].data, grove_tensor_nbytes(&out.v[k]));
    p += grove_tensor_nbytes(&out.v[k]);
  }
  grove_arena_reset(arena);
  size_t grows = grove_arena_grow_count(arena);
  ck_assert_ok(grove_model_forward(fx->model, arena, s->x, (size_t)s->nx, &out, &err), &err);
  ck_assert_uint_eq(grove_arena_grow_count(arena), grows);
  p = first;
  for (int k = 0; k < out.n; k++) {
    ck_assert_msg(memcmp(p, out.v[k].data, grove_tensor_nbytes(&out.v[k])) == 0,
                  "%s: output %d differs on the second pass", what, k);
    p += grove_tensor_nbytes(&out.v[k]);
  }
  free(first);

  /* With a hook registered anywhere nothing is fused and every module call
   * (the root included) is seen. */
  uint64_t id;
  ck_assert_ok(grove_register_global_forward_hook(count_hook, NULL, &id), &err);
  hook_calls = 0;
  grove_arena_reset(arena);
  ck_assert_ok(grove_model_forward(fx->model, arena, s->x, (size_t)s->nx, &out, &err), &err);
  ck_assert(grove_remove_global_hook(id));
  ck_assert_int_ge(hook_calls, 1);
  for (int k = 0; k < out.n; k++) assert_close(what, k, &out.v[k], &s->y[k]);
}

START_TEST(test_parity) {
  const char *name = cases[_i];
  fixture fx = {0};
  fixture_load(&fx, name);
  grove_arena *arena = grove_arena_new(0);
  /* Every set on one model and one arena, as a server's worker sees batches
   * of several sizes in turn. */
  for (int j = 0; j < fx.nsets; j++) run_set(&fx, arena, name, j);
  grove_arena_free(arena);
  fixture_fini(&fx);
}
END_TEST

/* grove_arena_rewind (arena.h), which the graphs' liveness rests on: a
 * rewind hands the same memory out again, the high water counts what was
 * live, forgotten bytes stay readable until reused (also in overflow chunks,
 * kept until the reset), and grove__arena_keep moves blocks down. */
START_TEST(test_arena_rewind) {
  grove_arena *a = grove_arena_new(4096);
  grove_arena_mark m0 = grove_arena_mark_get(a);
  char *p1 = grove_arena_alloc(a, 1000);
  grove_arena_rewind(a, m0);
  char *p2 = grove_arena_alloc(a, 1000);
  ck_assert_ptr_eq(p1, p2);
  grove_arena_rewind(a, m0);
  for (int i = 0; i < 10; i++) {
    grove_arena_alloc(a, 1000);
    grove_arena_rewind(a, m0);
  }
  ck_assert_uint_eq(grove_arena_high_water(a), 1024);
  /* Overflow: a block larger than the arena goes to a chunk; rewinding past
   * it keeps its bytes readable. */
  grove_arena_mark m1 = grove_arena_mark_get(a);
  char *big = grove_arena_alloc(a, 10000);
  memset(big, 7, 10000);
  size_t grows = grove_arena_grow_count(a);
  ck_assert_uint_eq(grows, 1);
  grove_arena_rewind(a, m1);
  ck_assert_int_eq(big[9999], 7);
  /* grove__arena_keep: two blocks made after m0 end up right above it, in
   * order, with their bytes. */
  char *x = grove_arena_alloc(a, 64), *scratch = grove_arena_alloc(a, 512),
       *y = grove_arena_alloc(a, 128);
  memset(x, 1, 64);
  memset(scratch, 9, 512);
  memset(y, 2, 128);
  grove__keep keep[2] = {{x, 64, NULL, {0}}, {y, 128, NULL, {0}}};
  grove_err err = {0};
  ck_assert_ok(grove__arena_keep(a, m0, keep, 2, &err), &err);
  ck_assert_ptr_eq(keep[0].moved, p1);
  ck_assert_int_eq(((char *)keep[0].moved)[63], 1);
  ck_assert_int_eq(((char *)keep[1].moved)[0], 2);
  ck_assert_int_eq(((char *)keep[1].moved)[127], 2);
  ck_assert_ptr_eq(grove_arena_alloc(a, 1), (char *)keep[1].moved + 128);
  /* The reset consolidates into one block of the high water; the same pass
   * then fits. */
  grove_arena_reset(a);
  ck_assert_uint_eq(grove_arena_capacity(a), grove_arena_high_water(a));
  m0 = grove_arena_mark_get(a);
  grove_arena_alloc(a, 10000);
  grove_arena_rewind(a, m0);
  ck_assert_uint_eq(grove_arena_grow_count(a), grows);
  grove_arena_free(a);
}
END_TEST

/* A forward's observer (module.h) watching modules of a fused chain turns
 * that fusion off: it sees the BatchNorm's own output, and the result stays
 * torch's. */
static int observed;
static int64_t observed_c;
static void observe(void *ctx, size_t index, grove_observe_kind kind, const grove_module *m,
                    const grove_values *values) {
  observed++;
  observed_c = values->v[0].shape[1];
}

START_TEST(test_observer_unfuses) {
  fixture fx = {0};
  grove_err err = {0};
  fixture_load(&fx, "resnet_fused");
  const grove_module *bn = grove_module_find(fx.model->root, "blocks.1.bn1");
  ck_assert_ptr_nonnull(bn);
  const grove_module *mods[1] = {bn};
  const unsigned char kinds[1] = {GROVE_OBSERVE_POST};
  grove_observer obs = {.modules = mods, .kinds = kinds, .n = 1, .fn = observe, .ctx = NULL};
  grove_arena *arena = grove_arena_new(0);
  grove_fwd f = {.arena = arena, .err = &err, .observer = &obs};
  grove_values in = {.n = fx.set[0].nx}, out = {0};
  for (int k = 0; k < fx.set[0].nx; k++) in.v[k] = fx.set[0].x[k];
  observed = 0;
  ck_assert_ok(grove_module_forward(fx.model->root, &f, &in, &out), &err);
  ck_assert_int_eq(observed, 1);
  ck_assert_int_eq(observed_c, 16);
  assert_close("observed resnet", 0, &out.v[0], &fx.set[0].y[0]);
  grove_arena_free(arena);
  fixture_fini(&fx);
}
END_TEST

/* ------------------------------------------------------------ hand-written graphs */

#define DOC_HEAD                                                                            \
  "{\"format\": \"grove.model/1\", \"inputs\": [{\"name\": \"x\", \"dtype\": \"float32\", " \
  "\"shape\": [-1, 4]}], \"module\": "

static grove_status from_module(const char *module, grove_model **m, grove_err *err) {
  size_t n = strlen(module) + 256;
  char *doc = malloc(n);
  snprintf(doc, n, DOC_HEAD "%s}", module);
  grove_status s = grove_model_from_spec(doc, "model.json", m, err);
  free(doc);
  return s;
}

static void spec_err(const char *module, grove_status code, const char *needle) {
  grove_err err = {0};
  grove_model *m = NULL;
  ck_assert_status(from_module(module, &m, &err), code);
  ck_assert_ptr_null(m);
  ck_assert_msg(strstr(err.msg, needle), "%s:\n got  \"%s\"\n want \"%s\"", module, err.msg,
                needle);
}

#define PH "{\"op\": \"placeholder\", \"name\": \"x\"}"
#define OUT(n) "{\"op\": \"output\", \"name\": \"output\", \"args\": [{\"node\": \"" n "\"}]}"
#define FN(name, target, args)                                                \
  "{\"op\": \"call_function\", \"name\": \"" name "\", \"target\": \"" target \
  "\", \"args\": " args "}"
#define G(nodes) "{\"type\": \"Net\", \"graph\": [" nodes "]}"
#define GC(children, nodes) \
  "{\"type\": \"Net\", \"children\": " children ", \"graph\": [" nodes "]}"

START_TEST(test_spec_errors) {
  spec_err(G(PH "," FN("s", "digamma", "[{\"node\": \"x\"}]") "," OUT("s")), GROVE_E_UNSUPPORTED,
           "$.module.graph[1].target: \"digamma\" is not an operation Grove runs (supported: add,");
  spec_err(G(PH "," FN("a", "add", "[{\"node\": \"y\"}, 1]") "," OUT("a")), GROVE_E_SPEC,
           "$.module.graph[1].args[0].node: \"y\" names no node of the graph");
  spec_err(G(PH "," FN("a", "add", "[{\"node\": \"b\"}, 1]") "," FN(
               "b", "relu", "[{\"node\": \"x\"}]") "," OUT("a")),
           GROVE_E_SPEC, "$.module.graph[1].args[0].node: \"b\" is defined after this node");
  spec_err(G(PH "," FN("x", "relu", "[{\"node\": \"x\"}]") "," OUT("x")), GROVE_E_SPEC,
           "$.module.graph[1].name: \"x\" is the name of an earlier node");
  spec_err(G(PH "," FN("a", "relu", "[{\"node\": \"x\"}]")), GROVE_E_SPEC,
           "$.module.graph: no output node");
  spec_err(G(PH "," OUT("x") "," FN("a", "relu", "[{\"node\": \"x\"}]")), GROVE_E_SPEC,
           "$.module.graph[1]: the output node must be the last node");
  spec_err(G(PH ",{\"op\": \"call_module\", \"name\": \"fc\", \"target\": \"fc\", \"args\": "
                "[{\"node\": \"x\"}]}," OUT("fc")),
           GROVE_E_SPEC, "$.module.graph[1].target: \"fc\" names no submodule of this module");
  spec_err(G(PH ",{\"op\": \"get_attr\", \"name\": \"w\", \"target\": \"w\"}," OUT("w")),
           GROVE_E_SPEC, "$.module.graph[1].target: \"w\": the Net has no parameter or buffer");
  spec_err(G(PH "," FN("d", "dropout", "[{\"node\": \"x\"}, 0.1, true]") "," OUT("d")),
           GROVE_E_UNSUPPORTED, "$.module.graph[1]: dropout with training=True");
  spec_err(G(PH ",{\"op\": \"call_function\", \"name\": \"s\", \"target\": \"softmax\", "
                "\"args\": [{\"node\": \"x\"}], \"kwargs\": {\"axis\": 1}}," OUT("s")),
           GROVE_E_SPEC, "$.module.graph[1].kwargs.axis: softmax has no argument \"axis\"");
  spec_err(G(PH "," FN("a", "add", "[{\"node\": \"x\"}]") "," OUT("a")), GROVE_E_SPEC,
           "$.module.graph[1]: add is missing its argument \"other\"");
  spec_err(G(PH "," FN("a", "div", "[{\"node\": \"x\"}, 2, \"round\"]") "," OUT("a")), GROVE_E_SPEC,
           "$.module.graph[1]: div's rounding_mode must be null, \"floor\" or \"trunc\"");
  spec_err(G(PH ",{\"op\": \"output\", \"name\": \"output\", \"args\": [3]}"), GROVE_E_UNSUPPORTED,
           "$.module.graph[1].args[0]: the output must be a tensor");
  spec_err(G(PH ",{\"op\": \"call_op\", \"name\": \"a\", \"target\": \"relu\"}," OUT("a")),
           GROVE_E_SPEC, "$.module.graph[1].op: \"call_op\" is not a torch.fx node kind");
  spec_err(G(PH "," FN("a", "add", "[{\"node\": \"x\"}, {\"tensor\": 1}]") "," OUT("a")),
           GROVE_E_SPEC,
           "$.module.graph[1].args[1]: expected a constant, a list, {\"node\": NAME}");
  spec_err("{\"type\": \"Net\", \"grap\": []}", GROVE_E_SPEC,
           "$.module.type: \"Net\" is not a module type");
  spec_err("{\"type\": \"Net\", \"graph\": [], \"bias\": 1}", GROVE_E_SPEC,
           "$.module.bias: unknown key of a module with a graph");
  spec_err("{\"type\": \"my-net\", \"graph\": []}", GROVE_E_SPEC,
           "$.module.type: expected the "
           "module's Python class name");
  spec_err(
      "{\"type\": \"Net\", \"graph\": [], \"buffers\": {\"b\": {\"shape\": [2], "
      "\"persistent\": \"no\"}}}",
      GROVE_E_SPEC, "$.module.buffers.b.persistent: expected true or false");
  spec_err("{\"type\": \"Net\", \"graph\": [], \"parameters\": {\"p\": {\"shape\": [-2]}}}",
           GROVE_E_SPEC, "$.module.parameters.p.shape: expected a list of at most 8");
  /* call_module: constant masks and constants are refused, naming the node. */
  spec_err(GC("{\"attn\": {\"type\": \"MultiheadAttention\", \"embed_dim\": 4, \"num_heads\": 2}}",
              PH ",{\"op\": \"call_module\", \"name\": \"a\", \"target\": \"attn\", \"args\": "
                 "[{\"node\": \"x\"}, {\"node\": \"x\"}, {\"node\": \"x\"}], \"kwargs\": "
                 "{\"attn_mask\": 0.5}}," OUT("a")),
           GROVE_E_SPEC,
           "$.module.graph[1]: argument \"attn_mask\" of MultiheadAttention must be a tensor or "
           "None");
  spec_err(GC("{\"enc\": {\"type\": \"TransformerEncoderLayer\", \"d_model\": 4, \"nhead\": 2}}",
              PH ",{\"op\": \"call_module\", \"name\": \"a\", \"target\": \"enc\", \"args\": "
                 "[{\"node\": \"x\"}], \"kwargs\": {\"is_causal\": true}}," OUT("a")),
           GROVE_E_UNSUPPORTED, "$.module.graph[1]: is_causal=True is not supported");
  spec_err(GC("{\"fc\": {\"type\": \"Linear\", \"in_features\": 4, \"out_features\": 2}}",
              PH ",{\"op\": \"call_module\", \"name\": \"a\", \"target\": \"fc\", \"args\": "
                 "[{\"node\": \"x\"}, 3]}," OUT("a")),
           GROVE_E_UNSUPPORTED, "$.module.graph[1].args[1]: a constant argument to a Linear");
  spec_err(GC("{\"l\": {\"type\": \"ModuleList\", \"children\": []}}",
              PH ",{\"op\": \"call_module\", \"name\": \"a\", \"target\": \"l\", \"args\": "
                 "[{\"node\": \"x\"}]}," OUT("a")),
           GROVE_E_SPEC, "$.module.graph[1].target: \"l\" is a ModuleList, which has no forward");
  /* A list argument whose later item is refused after its first was
   * parsed: the list already holds memory, which the failed node must
   * still own (LeakSanitizer under SAN=1 saw it lost).  As one of an op's
   * *varargs (view(x, 2, ["a", bad])) and as a module call's argument. */
  spec_err(
      G(PH "," FN("v", "view", "[{\"node\": \"x\"}, 2, [\"a\", {\"tensor\": 1}]]") "," OUT("v")),
      GROVE_E_SPEC, "$.module.graph[1].args[2][1]: expected a constant");
  spec_err(GC("{\"fc\": {\"type\": \"Linear\", \"in_features\": 4, \"out_features\": 2}}",
              PH ",{\"op\": \"call_module\", \"name\": \"a\", \"target\": \"fc\", \"args\": "
                 "[{\"node\": \"x\"}, [\"a\", {\"tensor\": 1}]]}," OUT("a")),
           GROVE_E_SPEC, "$.module.graph[1].args[1][1]: expected a constant");
}
END_TEST

/* Runtime errors name the module, the node, its op and its line. */
START_TEST(test_runtime_errors) {
  grove_err err = {0};
  grove_model *m = NULL;
  ck_assert_ok(
      from_module(
          G(PH "," FN(
              "t", "transpose",
              "[{\"node\": \"x\"}, 0, 1]") ","
                                           "{\"op\": \"call_function\", \"name\": \"bad_add\", "
                                           "\"target\": "
                                           "\"add\", \"args\": [{\"node\": \"x\"}, {\"node\": "
                                           "\"t\"}], "
                                           "\"source\": \"net.py:12: y = x + t\"}," OUT("bad_add")),
          &m, &err),
      &err);
  float buf[12] = {0};
  int64_t shape[2] = {3, 4};
  grove_tensor x;
  grove_tensor_init(&x, GROVE_F32, 2, shape, buf);
  grove_arena *a = grove_arena_new(0);
  grove_values out;
  ck_assert_status(grove_model_forward(m, a, &x, 1, &out, &err), GROVE_E_SHAPE);
  ck_assert_msg(strstr(err.msg,
                       "the root module (Net): graph node 'bad_add' (add, net.py:12: y = "
                       "x + t): the shapes [3, 4] and [4, 3] cannot be broadcast"),
                "%s", err.msg);
  grove_arena_free(a);
  grove_model_free(m);
}
END_TEST

/* Users' own models' ops where the C side decides (tests/py/test_user_ops.py
 * runs them against torch): int64 arithmetic stays int64 and wraps,
 * maximum lets a NaN win, new_tensor refuses ragged data, leaky_relu wants
 * a constant slope. */
static grove_status run1(const char *module, float *buf, grove_arena *a, grove_values *out,
                         grove_err *err, grove_model **m) {
  grove_status s = from_module(module, m, err);
  if (s) return s;
  int64_t shape[2] = {2, 4};
  grove_tensor x;
  grove_tensor_init(&x, GROVE_F32, 2, shape, buf);
  return grove_model_forward(*m, a, &x, 1, out, err);
}

START_TEST(test_user_ops_edges) {
  grove_err err = {0};
  grove_model *m = NULL;
  grove_arena *a = grove_arena_new(0);
  grove_values out;
  float buf[8] = {1.5f, -2.5f, 3, NAN, 0, 7, -1, 2};
  /* long(x) * long(x) + 1: int64, NaN's cast aside (torch's is undefined too) */
  ck_assert_ok(
      run1(G(PH "," FN("l", "long", "[{\"node\": \"x\"}]") "," FN(
               "p", "mul", "[{\"node\": \"l\"}, {\"node\": \"l\"}]") "," FN("q", "add",
                                                                            "[{\"node\": \"p\"}, "
                                                                            "1]") "," OUT("q")),
           buf, a, &out, &err, &m),
      &err);
  ck_assert_int_eq(out.v[0].dtype, GROVE_I64);
  const int64_t *q = out.v[0].data;
  ck_assert_int_eq(q[0], 2);
  ck_assert_int_eq(q[1], 5);
  ck_assert_int_eq(q[5], 50);
  grove_model_free(m);
  /* maximum(x, -x): |x|, NaN kept */
  ck_assert_ok(run1(G(PH "," FN("n", "neg", "[{\"node\": \"x\"}]") "," FN(
                        "mx", "maximum", "[{\"node\": \"x\"}, {\"node\": \"n\"}]") "," OUT("mx")),
                    buf, a, &out, &err, &m),
               &err);
  const float *mx = out.v[0].data;
  ck_assert(mx[1] == 2.5f && isnan(mx[3]) && mx[6] == 1);
  grove_model_free(m);
  /* long(x) // -2 and long(x) % -2, floored as Python: 1 // -2 = -1, 1 % -2 = -1 */
  ck_assert_ok(
      run1(
          G(PH "," FN("l", "long", "[{\"node\": \"x\"}]") "," FN(
              "q", "floordiv",
              "[{\"node\": \"l\"}, -2]") "," FN("r", "remainder",
                                                "[{\"node\": \"l\"}, -2]") "," FN("t", "mul",
                                                                                  "[{\"node\": "
                                                                                  "\"q\"}, "
                                                                                  "100]") "," FN("u",
                                                                                                 "a"
                                                                                                 "d"
                                                                                                 "d",
                                                                                                 "["
                                                                                                 "{"
                                                                                                 "\"node\": \"t\"}, {\"node\": \"r\"}]") "," OUT("u")),
          buf, a, &out, &err, &m),
      &err);
  q = out.v[0].data; /* x = 1.5, -2.5, 3, NaN, 0, 7, -1, 2 -> long 1, -2, 3, ?, 0, 7, -1, 2 */
  ck_assert_int_eq(q[0], -100 - 1);
  ck_assert_int_eq(q[1], 100 + 0);
  ck_assert_int_eq(q[2], -200 - 1);
  ck_assert_int_eq(q[5], -400 - 1);
  ck_assert_int_eq(q[6], 0 - 1);
  grove_model_free(m);
  /* ... and by zero: torch's ZeroDivisionError */
  ck_assert_status(run1(G(PH "," FN("l", "long", "[{\"node\": \"x\"}]") "," FN(
                            "q", "floordiv", "[{\"node\": \"l\"}, 0]") "," OUT("q")),
                        buf, a, &out, &err, &m),
                   GROVE_E_RANGE);
  ck_assert_msg(strstr(err.msg, "integer division by zero"), "%s", err.msg);
  grove_model_free(m);
  /* new_tensor([[1, 2], [3]]): ragged */
  ck_assert_status(
      run1(G(PH "," FN("t", "new_tensor", "[{\"node\": \"x\"}, [[1, 2], [3]]]") "," OUT("t")), buf,
           a, &out, &err, &m),
      GROVE_E_INVALID_ARGUMENT);
  ck_assert_msg(strstr(err.msg, "data of nested lists of one length per level"), "%s", err.msg);
  grove_model_free(m);
  /* gather(x, 1, long(x)): long(-2.5) is -2, which torch.gather refuses too */
  ck_assert_status(
      run1(G(PH "," FN("l", "long", "[{\"node\": \"x\"}]") "," FN(
               "g", "gather", "[{\"node\": \"x\"}, 1, {\"node\": \"l\"}]") "," OUT("g")),
           buf, a, &out, &err, &m),
      GROVE_E_RANGE);
  ck_assert_msg(strstr(err.msg, "gather: index -2 is out of bounds for dimension 1 with size 4"),
                "%s", err.msg);
  grove_model_free(m);
  /* flip(x, [1, -1]): the same dim twice */
  ck_assert_status(run1(G(PH "," FN("r", "flip", "[{\"node\": \"x\"}, [1, -1]]") "," OUT("r")), buf,
                        a, &out, &err, &m),
                   GROVE_E_INVALID_ARGUMENT);
  ck_assert_msg(strstr(err.msg, "flip: dim 1 appears multiple times"), "%s", err.msg);
  grove_model_free(m);
  /* max_pool1d(x, x.size()): a computed kernel of 2 sizes for 1 dim */
  ck_assert_status(
      run1(G(PH "," FN("s", "size", "[{\"node\": \"x\"}]") "," FN(
               "p", "max_pool1d", "[{\"node\": \"x\"}, {\"node\": \"s\"}]") "," OUT("p")),
           buf, a, &out, &err, &m),
      GROVE_E_INVALID_ARGUMENT);
  ck_assert_msg(strstr(err.msg,
                       "max_pool1d: kernel_size must be one integer or a list of 1, got 2 "
                       "values"),
                "%s", err.msg);
  grove_model_free(m);
  m = NULL;
  spec_err(G(PH "," FN("s", "size", "[{\"node\": \"x\"}, 1]") "," FN(
               "r", "leaky_relu", "[{\"node\": \"x\"}, {\"node\": \"s\"}]") "," OUT("r")),
           GROVE_E_SPEC, "a finite constant number (negative_slope)");
  grove_arena_free(a);
}
END_TEST

/* sort / argsort / topk of a dtype Grove does not sort (bool: torch sorts
 * it, its topk refuses it) name the dtype; a dim past int's range is out
 * of range as itself, not as its low 32 bits (2^32 was dim 0: accepted). */
static void sort_refused(const char *nodes, const char *want) {
  grove_err err = {0};
  grove_model *m = NULL;
  char module[1024];
  snprintf(module, sizeof module, G(PH ",%s," OUT("s")), nodes);
  ck_assert_ok(from_module(module, &m, &err), &err);
  float buf[8] = {1, -2, 3, -4, 5, -6, 7, -8};
  int64_t shape[2] = {2, 4};
  grove_tensor x;
  grove_tensor_init(&x, GROVE_F32, 2, shape, buf);
  grove_arena *a = grove_arena_new(0);
  grove_values out;
  ck_assert_int_ne(grove_model_forward(m, a, &x, 1, &out, &err), GROVE_OK);
  ck_assert_msg(strstr(err.msg, want), "%s:\n got  \"%s\"\n want \"%s\"", nodes, err.msg, want);
  grove_arena_free(a);
  grove_model_free(m);
}

START_TEST(test_sort_refusals) {
  sort_refused(FN("b", "gt", "[{\"node\": \"x\"}, 0.0]") "," FN("s", "sort", "[{\"node\": \"b\"}]"),
               "graph node 's' (sort): sort: expected a float32 or int64 tensor, got bool");
  sort_refused(
      FN("b", "gt", "[{\"node\": \"x\"}, 0.0]") "," FN("s", "argsort", "[{\"node\": \"b\"}]"),
      "argsort: expected a float32 or int64 tensor, got bool");
  sort_refused(
      FN("b", "gt", "[{\"node\": \"x\"}, 0.0]") "," FN("s", "topk", "[{\"node\": \"b\"}, 2]"),
      "topk: expected a float32 or int64 tensor, got bool");
  sort_refused(FN("s", "sort", "[{\"node\": \"x\"}, 4294967296]"),
               "sort: dim 4294967296 is out of range for a 2-d input (expected in [-2, 1])");
  sort_refused(FN("s", "topk", "[{\"node\": \"x\"}, 1, -4294967295]"),
               "topk: dim -4294967295 is out of range for a 2-d input");
  /* The other ops that read a dim through grove__op_wrap_dim. */
  sort_refused(FN("s", "cumsum", "[{\"node\": \"x\"}, 4294967296]"),
               "cumsum: dim 4294967296 is out of range");
  sort_refused(FN("s", "repeat_interleave", "[{\"node\": \"x\"}, 2, 4294967297]"),
               "repeat_interleave: dim 4294967297 is out of range");
  sort_refused(FN("s", "unflatten", "[{\"node\": \"x\"}, 4294967296, [2, 2]]"),
               "Unflatten: dim 4294967296 is out of range");
  /* softmax's and flatten's constant dims are refused when the graph loads
   * (their forwards read them as int64 too, whose low 32 bits were 0). */
  const char *at_load[][2] = {
      {FN("s", "softmax", "[{\"node\": \"x\"}, 4294967296]"), "dim 4294967296 is out of range"},
      {FN("s", "flatten", "[{\"node\": \"x\"}, 4294967296, -1]"), "start_dim"},
  };
  for (size_t i = 0; i < sizeof at_load / sizeof at_load[0]; i++) {
    grove_err err = {0};
    grove_model *m = NULL;
    char module[1024];
    snprintf(module, sizeof module, G(PH ",%s," OUT("s")), at_load[i][0]);
    ck_assert_int_ne(from_module(module, &m, &err), GROVE_OK);
    ck_assert_msg(strstr(err.msg, at_load[i][1]), "%s: got \"%s\"", at_load[i][0], err.msg);
  }
}
END_TEST

/* A graph that returns its input returns it itself (as torch does): no
 * copy, nothing left in the arena. */
START_TEST(test_identity_graph) {
  grove_err err = {0};
  grove_model *m = NULL;
  ck_assert_ok(from_module(G(PH "," OUT("x")), &m, &err), &err);
  float buf[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  int64_t shape[2] = {2, 4};
  grove_tensor x;
  grove_tensor_init(&x, GROVE_F32, 2, shape, buf);
  grove_arena *a = grove_arena_new(0);
  grove_values out;
  ck_assert_ok(grove_model_forward(m, a, &x, 1, &out, &err), &err);
  ck_assert_ptr_eq(out.v[0].data, buf); /* the input itself, as torch returns it */
  grove_arena_free(a);
  grove_model_free(m);
}
END_TEST

/* A chain of 40 elementwise operations on a 1 MB tensor runs in a few
 * buffers: liveness gives each one back as soon as its reader ran. */
START_TEST(test_liveness) {
  char *nodes = malloc(1 << 16), *p = nodes;
  p += sprintf(p, "%s", PH);
  const char *prev = "x";
  char names[40][8];
  for (int i = 0; i < 40; i++) {
    snprintf(names[i], sizeof names[i], "n%d", i & 63);
    p += sprintf(p,
                 ",{\"op\": \"call_function\", \"name\": \"%s\", \"target\": \"%s\", \"args\": "
                 "[{\"node\": \"%s\"}%s]}",
                 names[i], i % 2 ? "tanh" : "mul", prev, i % 2 ? "" : ", 0.5");
    prev = names[i];
  }
  p += sprintf(p, ",{\"op\": \"output\", \"name\": \"output\", \"args\": [{\"node\": \"%s\"}]}",
               prev);
  char *module = malloc(1 << 16);
  snprintf(module, 1 << 16, "{\"type\": \"Chain\", \"graph\": [%s]}", nodes);
  grove_err err = {0};
  grove_model *m = NULL;
  ck_assert_ok(from_module(module, &m, &err), &err);
  int64_t shape[2] = {65536, 4}; /* 1 MiB */
  float *buf = calloc(65536 * 4, sizeof(float));
  for (int i = 0; i < 65536 * 4; i++) buf[i] = (float)(i % 13) - 6.0f;
  grove_tensor x;
  grove_tensor_init(&x, GROVE_F32, 2, shape, buf);
  grove_arena *a = grove_arena_new(0);
  grove_values out;
  ck_assert_ok(grove_model_forward(m, a, &x, 1, &out, &err), &err);
  const size_t mb = 65536 * 4 * sizeof(float);
  ck_assert_msg(grove_arena_high_water(a) <= 3 * mb + 65536,
                "40 chained ops took %zu bytes of scratch for a %zu-byte tensor",
                grove_arena_high_water(a), mb);
  /* The graph leaves only its output in the arena. */
  float want = buf[5];
  for (int i = 0; i < 40; i++) want = i % 2 ? tanhf(want) : want * 0.5f;
  ck_assert(fabsf(((float *)out.v[0].data)[5] - want) < 1e-6f);
  grove_arena_free(a);
  grove_model_free(m);
  free(buf);
  free(module);
  free(nodes);
}
END_TEST

/* A module whose forward was traced into its parent's graph has state but
 * cannot be called itself. */
START_TEST(test_holder_not_callable) {
  grove_err err = {0};
  grove_model *m = NULL;
  ck_assert_ok(from_module(GC("{\"sub\": {\"type\": \"Inner\", \"graph\": null, \"children\": "
                              "{\"fc\": {\"type\": \"Linear\", \"in_features\": 4, "
                              "\"out_features\": 4}}}}",
                              PH ",{\"op\": \"call_module\", \"name\": \"fc\", \"target\": "
                                 "\"sub.fc\", \"args\": [{\"node\": \"x\"}]}," OUT("fc")),
                           &m, &err),
               &err);
  grove_module *sub = grove_module_find(m->root, "sub");
  ck_assert_ptr_nonnull(sub);
  ck_assert(grove__is_graph(sub));
  ck_assert_str_eq(grove_module_type_name(sub), "Inner");
  float buf[4] = {0};
  int64_t shape[2] = {1, 4};
  grove_tensor x, y;
  grove_tensor_init(&x, GROVE_F32, 2, shape, buf);
  grove_arena *a = grove_arena_new(0);
  grove_fwd f = {.arena = a, .err = &err};
  ck_assert_status(grove_module_call(sub, &f, &x, &y), GROVE_E_NOT_CALLABLE);
  ck_assert_status(grove_module_call(m->root, &f, &x, &y), GROVE_OK);
  grove_arena_free(a);
  grove_model_free(m);
  /* Calling a holder from a graph is refused when the graph is built. */
  spec_err(GC("{\"sub\": {\"type\": \"Inner\", \"graph\": null}}",
              PH ",{\"op\": \"call_module\", \"name\": \"s\", \"target\": \"sub\", \"args\": "
                 "[{\"node\": \"x\"}]}," OUT("s")),
           GROVE_E_SPEC, "$.module.graph[1].target: \"sub\" is a Inner, which has no forward");
}
END_TEST

/* A module whose forward the exporter traced into its caller's graph
 * ("inlined": true, a DenseNet _DenseLayer called with a list): no node
 * calls it, so a forward hook on it could never fire and is refused at
 * registration; its leaves, which the caller's graph calls, take hooks, and
 * a holder that is merely never called (no "inlined") still takes them, as
 * in torch. */
static grove_status count_calls(void *user, const grove_module *mod, grove_fwd *f,
                                const grove_values *in, grove_values *out) {
  (*(int *)user)++;
  return GROVE_OK;
}

START_TEST(test_inlined_module_hooks) {
  grove_err err = {0};
  grove_model *m = NULL;
  ck_assert_ok(
      from_module(GC("{\"layer\": {\"type\": \"_DenseLayer\", \"graph\": null, "
                     "\"inlined\": true, \"children\": {\"fc\": {\"type\": \"Linear\", "
                     "\"in_features\": 4, \"out_features\": 4}}}, "
                     "\"holder\": {\"type\": \"Holder\", \"graph\": null, \"inlined\": false}}",
                     PH ",{\"op\": \"call_module\", \"name\": \"fc\", \"target\": "
                        "\"layer.fc\", \"args\": [{\"node\": \"x\"}]}," OUT("fc")),
                  &m, &err),
      &err);
  grove_module *layer = grove_module_find(m->root, "layer");
  grove_module *fc = grove_module_find(m->root, "layer.fc");
  grove_module *holder = grove_module_find(m->root, "holder");
  ck_assert(layer && fc && holder);
  ck_assert(layer->inlined && !fc->inlined && !holder->inlined);
  int fired = 0;
  uint64_t id = 0;
  ck_assert_int_eq(grove_module_register_forward_hook(layer, count_calls, &fired, false, &id),
                   GROVE_E_UNSUPPORTED);
  ck_assert_int_eq(grove_module_register_forward_pre_hook(layer, NULL, NULL, false, &id),
                   GROVE_E_UNSUPPORTED);
  ck_assert_int_eq(grove_module_register_forward_hook(holder, count_calls, &fired, false, &id),
                   GROVE_OK);
  ck_assert(grove_module_remove_hook(holder, id));
  ck_assert_int_eq(grove_module_register_forward_hook(fc, count_calls, &fired, false, &id),
                   GROVE_OK);
  float buf[4] = {0};
  int64_t shape[2] = {1, 4};
  grove_tensor x, y;
  grove_tensor_init(&x, GROVE_F32, 2, shape, buf);
  grove_arena *a = grove_arena_new(0);
  grove_fwd f = {.arena = a, .err = &err};
  ck_assert_ok(grove_module_call(m->root, &f, &x, &y), &err);
  ck_assert_int_eq(fired, 1);
  ck_assert(grove_module_remove_hook(fc, id));
  grove_arena_free(a);
  grove_model_free(m);
  spec_err(GC("{\"sub\": {\"type\": \"Inner\", \"graph\": [" PH "," OUT("x") "], "
                                                                             "\"inlined\": true}}",
              PH "," OUT("x")),
           GROVE_E_SPEC, "$.module.children.sub.inlined: expected true (with \"graph\": null)");
}
END_TEST

/* The state_dict of a graph module: its own parameters, then buffers, then
 * its children, as torch; the load error names the Python class. */
START_TEST(test_state_dict) {
  grove_err err = {0};
  grove_model *m = NULL;
  ck_assert_ok(
      from_module(
          "{\"type\": \"Net\", \"parameters\": {\"cls\": {\"shape\": [1, 4]}, "
          "\"none\": null}, \"buffers\": {\"ids\": {\"shape\": [3], \"dtype\": "
          "\"int64\"}}, \"children\": {\"fc\": {\"type\": \"Linear\", "
          "\"in_features\": 4, \"out_features\": 2}}, \"graph\": [" PH ","
          "{\"op\": \"get_attr\", \"name\": \"c\", \"target\": \"cls\"}," FN(
              "a", "add",
              "[{\"node\": \"x\"}, {\"node\": \"c\"}]") ","
                                                        "{\"op\": \"call_module\", \"name\": "
                                                        "\"fc\", \"target\": \"fc\", "
                                                        "\"args\": [{\"node\": \"a\"}]}," OUT(
                                                            "fc") "]}",
          &m, &err),
      &err);
  grove_state_dict *sd = grove_sd_new();
  ck_assert_ok(grove_module_state_dict(m->root, NULL, sd, &err), &err);
  ck_assert_uint_eq(grove_sd_count(sd), 4);
  ck_assert_str_eq(grove_sd_key(sd, 0), "cls");
  ck_assert_str_eq(grove_sd_key(sd, 1), "ids");
  ck_assert_int_eq(grove_sd_tensor(sd, 1)->dtype, GROVE_I64);
  ck_assert_str_eq(grove_sd_key(sd, 2), "fc.weight");
  ck_assert(grove_sd_remove(sd, "cls"));
  ck_assert_status(grove_module_load_state_dict(m->root, sd, NULL, NULL, &err), GROVE_E_STATE_DICT);
  ck_assert_msg(strstr(err.msg,
                       "Error(s) in loading state_dict for Net:\n\tMissing key(s) in "
                       "state_dict: \"cls\""),
                "%s", err.msg);
  grove_sd_free(sd);
  grove_model_free(m);
}
END_TEST

/* A generated model.json of 50,000 nodes (a chain of relu) compiles: node
 * names were found by a linear scan per argument, O(N^2) (over 30 s); now
 * hashed.  No timing assertion here (bench/ is for figures); the test
 * asserts that the compile succeeds and that the graph runs. */
START_TEST(test_large_graph_compiles) {
  enum { N = 50000 };
  size_t cap = (size_t)N * 96 + 256, used = 0;
  char *mod = malloc(cap);
  ck_assert_ptr_nonnull(mod);
  used += (size_t)snprintf(mod + used, cap - used,
                           "{\"type\": \"Deep\", \"graph\": [{\"op\": \"placeholder\", "
                           "\"name\": \"x\"}");
  for (int i = 1; i < N; i++) {
    char prev[16];
    if (i == 1)
      snprintf(prev, sizeof prev, "x");
    else
      snprintf(prev, sizeof prev, "r%d", i - 1);
    used += (size_t)snprintf(mod + used, cap - used,
                             ", {\"op\": \"call_function\", \"name\": \"r%d\", \"target\": "
                             "\"relu\", \"args\": [{\"node\": \"%s\"}]}",
                             i, prev);
  }
  snprintf(mod + used, cap - used,
           ", {\"op\": \"output\", \"name\": \"output\", \"args\": [{\"node\": \"r%d\"}]}]}",
           N - 1);
  grove_model *m = NULL;
  grove_err err = {0};
  ck_assert_ok(from_module(mod, &m, &err), &err);
  free(mod);
  grove_arena *arena = grove_arena_new(0);
  const float xs[8] = {-1, 2, -3, 4, 5, -6, 7, -8};
  grove_tensor *x = grove_tensor_new(GROVE_F32, 2, (int64_t[]){2, 4}, &err);
  ck_assert_ptr_nonnull(x);
  memcpy(x->data, xs, sizeof xs);
  grove_values out;
  ck_assert_ok(grove_model_forward(m, arena, x, 1, &out, &err), &err);
  ck_assert_int_eq(out.n, 1);
  const float *o = out.v[0].data;
  ck_assert(o[0] == 0 && o[1] == 2 && o[6] == 7 && o[7] == 0);
  grove_tensor_release(x);
  grove_arena_free(arena);
  grove_model_free(m);
}
END_TEST


/* ------------------------------------------------------------ squeeze-excitation */

static grove_status se_noop(void *user, const grove_module *m, grove_fwd *f,
                            const grove_values *in, grove_values *out) {
  (void)user, (void)m, (void)f, (void)in, (void)out;
  return GROVE_OK;
}

static void se_fill(grove_module *conv, unsigned seed) {
  grove_err err = {0};
  grove_tensor *w = grove_module_param(conv, "weight");
  float *d = w->data;
  for (int64_t i = 0; i < grove_tensor_numel(w); i++) {
    seed = seed * 1664525u + 1013904223u;
    d[i] = ((float)(seed >> 8) / 16777216.0f - 0.5f) * 0.5f;
  }
  ck_assert_ok(conv->type->refresh(conv, &err), &err);
}

/* A Sequential of a convolution, a graph ending in squeeze-excitation's
 * `sigmoid(...) * x` and a 1x1 convolution (torchvision's MBConv block): the
 * graph leaves the multiply to the convolution (grove_fwd.se), so the
 * forward never writes the scaled copy of x (its arena's high-water mark is
 * lower by about that much), and the result is the same bits as with the
 * multiply, which a forward hook anywhere (here on the Sigmoid, whose
 * output is 64 numbers an image) brings back. */
START_TEST(test_se_scale_taken_by_conv) {
#define SE_CONV(ci, co, k, p)                                                                  \
  "{\"type\": \"Conv2d\", \"in_channels\": " #ci ", \"out_channels\": " #co                    \
  ", \"kernel_size\": [" #k ", " #k "], \"stride\": [1, 1], \"padding\": [" #p ", " #p "], "    \
  "\"dilation\": [1, 1], \"groups\": 1, \"bias\": true, \"padding_mode\": \"zeros\"}"
#define SE_CALL(n, t, a)                                                                        \
  "{\"op\": \"call_module\", \"name\": \"" n "\", \"target\": \"" t "\", \"args\": [{\"node\": \"" a \
  "\"}]}"
  const char *doc =
      "{\"format\": \"grove.model/1\", \"inputs\": [{\"name\": \"x\", \"dtype\": \"float32\", "
      "\"shape\": [-1, 8, 20, 21]}], \"module\": {\"type\": \"Sequential\", \"children\": ["
      SE_CONV(8, 64, 3, 1) ", {\"type\": \"SqueezeExcitation\", \"children\": {"
      "\"avgpool\": {\"type\": \"AdaptiveAvgPool2d\", \"output_size\": 1}, "
      "\"fc1\": " SE_CONV(64, 16, 1, 0) ", \"act\": {\"type\": \"ReLU\"}, "
      "\"fc2\": " SE_CONV(16, 64, 1, 0) ", \"sig\": {\"type\": \"Sigmoid\"}}, \"graph\": ["
      PH "," SE_CALL("avgpool", "avgpool", "x") "," SE_CALL("fc1", "fc1", "avgpool") ","
      SE_CALL("act", "act", "fc1") "," SE_CALL("fc2", "fc2", "act") ","
      SE_CALL("sig", "sig", "fc2") ","
      FN("mul", "mul", "[{\"node\": \"sig\"}, {\"node\": \"x\"}]") "," OUT("mul") "]}, "
      SE_CONV(64, 24, 1, 0) "]}}";
#undef SE_CONV
#undef SE_CALL
  grove_err err = {0};
  grove_model *model = NULL;
  ck_assert_ok(grove_model_from_spec(doc, "model.json", &model, &err), &err);
  grove_module *root = model->root, *se = root->children[1].module;
  se_fill(root->children[0].module, 1);
  se_fill(root->children[2].module, 2);
  for (size_t k = 0; k < se->nchildren; k++)
    if (se->children[k].module->type == root->children[0].module->type)
      se_fill(se->children[k].module, 3 + (unsigned)k);
  const int64_t xs[4] = {3, 8, 20, 21};
  grove_tensor *x = grove_tensor_new(GROVE_F32, 4, xs, &err);
  ck_assert_msg(x != NULL, "%s", err.msg);
  for (int64_t i = 0; i < grove_tensor_numel(x); i++)
    ((float *)x->data)[i] = (float)((i * 7919) % 1000) / 250.0f - 2.0f + (float)(i / 3360);
  grove_module *sig = NULL;
  for (size_t k = 0; k < se->nchildren; k++)
    if (strcmp(se->children[k].name, "sig") == 0) sig = se->children[k].module;
  ck_assert_ptr_nonnull(sig);
  size_t high[2];
  float *res[2];
  size_t nbytes = 0;
  for (int run = 0; run < 2; run++) {
    uint64_t id = 0;
    if (run) ck_assert_ok(grove_module_register_forward_hook(sig, se_noop, NULL, false, &id), &err);
    grove_arena *a = grove_arena_new(0);
    grove_fwd f = {.arena = a, .err = &err};
    grove_tensor y;
    ck_assert_ok(grove_module_call(root, &f, x, &y), &err);
    if (run) ck_assert(grove_module_remove_hook(sig, id));
    nbytes = grove_tensor_nbytes(&y);
    res[run] = malloc(nbytes);
    memcpy(res[run], y.data, nbytes);
    high[run] = grove_arena_high_water(a);
    grove_arena_free(a);
  }
  ck_assert_msg(memcmp(res[0], res[1], nbytes) == 0,
                "the scale taken by the convolution changed the result");
  /* The scaled copy of x: 3 x 64 x 20 x 21 floats, less the buffers the
   * convolution makes its scaled rows in (here about half of it: a real
   * model's layers are larger beside them). */
  const size_t copy = (size_t)3 * 64 * 20 * 21 * sizeof(float);
  /* With OpenBLAS's packs the rows are a whole scaled copy, as big. */
  const char *gemm = getenv("GROVE_GEMM");
  if (!gemm || strcmp(gemm, "blas") != 0)
    ck_assert_msg(high[0] + copy / 4 < high[1],
                  "high-water %zu with the scale in the convolution, %zu with the multiply",
                  high[0], high[1]);
  free(res[0]);
  free(res[1]);
  grove_tensor_release(x);
  grove_model_free(model);
}
END_TEST

/* relu(c(s(x)) + s(x)) and relu(c(s(x)) + x) (a residual block; the second
 * identity is the NCHW input): c applies the first add and its ReLU in its
 * output stage (grove_fwd.res); the second add, whose operands differ in
 * layout, runs as a node.  The results match those with a hook registered
 * (nothing fused); check_conv's test_conv_residual shows the conv applies
 * the add. */
START_TEST(test_residual_add_in_conv) {
#define RC(ci, co, k, p)                                                               \
  "{\"type\": \"Conv2d\", \"in_channels\": " #ci ", \"out_channels\": " #co            \
  ", \"kernel_size\": [" #k ", " #k "], \"stride\": [1, 1], \"padding\": [" #p ", " #p \
  "], "                                                                                \
  "\"dilation\": [1, 1], \"groups\": 1, \"bias\": true, \"padding_mode\": \"zeros\"}"
#define RCALL(n, t, a)                                              \
  "{\"op\": \"call_module\", \"name\": \"" n "\", \"target\": \"" t \
  "\", \"args\": [{\"node\": \"" a "\"}]}"
  const char *doc =
      "{\"format\": \"grove.model/1\", \"inputs\": [{\"name\": \"x\", \"dtype\": \"float32\", "
      "\"shape\": [-1, 64, 20, 21]}], \"module\": " GC(
          "{\"s\": " RC(64, 64, 3, 1) ", \"c\": " RC(64, 64, 1, 0) ", \"d\": " RC(64, 64, 1, 0)
          ", \"relu\": {\"type\": \"ReLU\"}}",
          PH "," RCALL("s", "s", "x") "," RCALL("c", "c", "s") ","
          FN("add", "add", "[{\"node\": \"c\"}, {\"node\": \"s\"}]") ","
          RCALL("relu", "relu", "add") "," RCALL("d", "d", "relu") ","
          FN("add2", "add", "[{\"node\": \"d\"}, {\"node\": \"x\"}]") ","
          RCALL("relu2", "relu", "add2") "," OUT("relu2")) "}";
#undef RC
#undef RCALL
  grove_err err = {0};
  grove_model *model = NULL;
  ck_assert_ok(grove_model_from_spec(doc, "model.json", &model, &err), &err);
  grove_module *root = model->root, *relu = NULL;
  for (size_t k = 0; k < root->nchildren; k++) {
    grove_module *c = root->children[k].module;
    if (strcmp(root->children[k].name, "relu") == 0)
      relu = c;
    else
      se_fill(c, 7 + (unsigned)k);
  }
  ck_assert_ptr_nonnull(relu);
  const int64_t xs[4] = {3, 64, 20, 21};
  grove_tensor *x = grove_tensor_new(GROVE_F32, 4, xs, &err);
  ck_assert_msg(x != NULL, "%s", err.msg);
  for (int64_t i = 0; i < grove_tensor_numel(x); i++)
    ((float *)x->data)[i] = (float)((i * 7919) % 1000) / 250.0f - 2.0f;
  size_t nbytes = 0;
  float *res[2];
  for (int run = 0; run < 2; run++) {
    uint64_t id = 0;
    if (run)
      ck_assert_ok(grove_module_register_forward_hook(relu, se_noop, NULL, false, &id), &err);
    grove_arena *a = grove_arena_new(0);
    grove_fwd f = {.arena = a, .err = &err, .channels_last_ok = true};
    grove_values in = {.n = 1, .v = {*x}}, out = {0};
    ck_assert_ok(grove_module_forward(root, &f, &in, &out), &err);
    if (run) ck_assert(grove_module_remove_hook(relu, id));
    const grove_tensor *y = &out.v[0];
    ck_assert_int_eq(y->shape[1], 64);
    nbytes = grove_tensor_nbytes(y);
    res[run] = malloc(nbytes);
    /* In NCHW order, whatever the layout. */
    float *o = res[run];
    for (int64_t i = 0; i < 3; i++)
      for (int64_t c = 0; c < 64; c++)
        for (int64_t q = 0; q < 20 * 21; q++)
          *o++ = ((const float *)y->data)[i * y->strides[0] + c * y->strides[1] +
                                          q / 21 * y->strides[2] + q % 21 * y->strides[3]];
    grove_arena_free(a);
  }
  const size_t n = nbytes / sizeof(float);
  for (size_t i = 0; i < n; i++)
    ck_assert_msg(fabsf(res[0][i] - res[1][i]) <= 1e-5f * (1.0f + fabsf(res[1][i])),
                  "element %zu: fused %g, unfused %g", i, (double)res[0][i], (double)res[1][i]);
  free(res[0]);
  free(res[1]);
  grove_tensor_release(x);
  grove_model_free(model);
}
END_TEST

/* torch.cat((relu(a(x)), b(x)), 1) of two convolutions that nothing else
 * reads (SqueezeNet's Fire), called as a container calls a child whose
 * result stays in the model (channels last allowed): each convolution
 * writes its slice of the cat's buffer, so the cat copies nothing and the
 * parts never exist on their own.  The scratch's peak shows it: the buffer
 * and one product's accumulator, under 1.75 cat outputs; the two parts
 * beside the cat's own result took 2.  The biases (zero weights) tell every
 * channel where it came from, at batch 1 and 3 and odd channel counts. */
START_TEST(test_cat_slices_copy_nothing) {
  const char *doc =
      "{\"format\": \"grove.model/1\", \"inputs\": [{\"name\": \"x\", \"dtype\": \"float32\", "
      "\"shape\": [-1, 4, 32, 32]}], \"module\": " GC(
          "{\"a\": {\"type\": \"Conv2d\", \"in_channels\": 4, \"out_channels\": 301, "
          "\"kernel_size\": [1, 1]}, \"a_act\": {\"type\": \"ReLU\"}, "
          "\"b\": {\"type\": \"Conv2d\", \"in_channels\": 4, \"out_channels\": 299, "
          "\"kernel_size\": [1, 1]}}",
          PH ",{\"op\": \"call_module\", \"name\": \"a\", \"target\": \"a\", \"args\": "
             "[{\"node\": \"x\"}]},"
             "{\"op\": \"call_module\", \"name\": \"a_act\", \"target\": \"a_act\", \"args\": "
             "[{\"node\": \"a\"}]},"
             "{\"op\": \"call_module\", \"name\": \"b\", \"target\": \"b\", \"args\": "
             "[{\"node\": \"x\"}]}," FN("cat", "cat",
                                        "[[{\"node\": \"a_act\"}, {\"node\": \"b\"}], 1]") ","
                                        OUT("cat")) "}";
  grove_err err = {0};
  grove_model *m = NULL;
  ck_assert_ok(grove_model_from_spec(doc, "model.json", &m, &err), &err);
  grove_state_dict *sd = grove_sd_new();
  ck_assert_ok(grove_module_state_dict(m->root, NULL, sd, &err), &err);
  grove_tensor *ba = grove_sd_get(sd, "a.bias"), *bb = grove_sd_get(sd, "b.bias");
  ck_assert(ba && bb);
  for (int c = 0; c < 301; c++) ((float *)ba->data)[c] = (float)(c + 1);
  for (int c = 0; c < 299; c++) ((float *)bb->data)[c] = (float)-(c + 1);
  ck_assert_ok(grove_module_load_state_dict(m->root, sd, NULL, NULL, &err), &err);
  grove_sd_free(sd);
  for (int64_t n = 1; n <= 3; n += 2) {
    const int64_t shape[4] = {n, 4, 32, 32}, P = 32 * 32;
    float *buf = calloc((size_t)(n * 4 * P), sizeof(float));
    grove_tensor x;
    grove_tensor_init(&x, GROVE_F32, 4, shape, buf);
    grove_arena *a = grove_arena_new(0);
    grove_fwd f = {.arena = a, .err = &err, .channels_last_ok = true};
    grove_values in = {.n = 1, .v = {x}}, out = {0};
    ck_assert_ok(grove_module_forward(m->root, &f, &in, &out), &err);
    const size_t cat_bytes = (size_t)(n * 600 * P) * sizeof(float);
    ck_assert_msg(grove_arena_high_water(a) < cat_bytes * 7 / 4,
                  "batch %lld: %zu bytes of scratch for a %zu-byte concatenation", (long long)n,
                  grove_arena_high_water(a), cat_bytes);
    const grove_tensor *t = &out.v[0];
    ck_assert_int_eq(t->shape[0], n);
    ck_assert_int_eq(t->shape[1], 600);
    const float *y = t->data;
    for (int64_t i = 0; i < n; i++)
      for (int64_t c = 0; c < 600; c++) {
        const float want = c < 301 ? (float)(c + 1) : (float)-(c - 301 + 1);
        for (int64_t q = 0; q < P; q += 97) {
          const float got =
              y[i * t->strides[0] + c * t->strides[1] + q / 32 * t->strides[2] + q % 32 * t->strides[3]];
          ck_assert_msg(got == want, "batch %lld image %lld channel %lld: %g", (long long)n,
                        (long long)i, (long long)c, (double)got);
        }
      }
    grove_arena_free(a);
    free(buf);
  }
  grove_model_free(m);
}
END_TEST

/* Arena plans (graph_plan.c, issue #18): the second forward of a residual
 * CNN at a signature runs on the plan recorded by the first, moving no
 * byte, and its output is bit-identical to the unplanned first's.  Each
 * new batch size gets a plan of its own, up to 8; past them forwards run
 * unplanned (they move again), still identical. */
static void forward_copy(fixture *fx, grove_arena *a, const grove_tensor *x, float **copy,
                         size_t *bytes, uint64_t *moved) {
  grove_err err = {0};
  grove_values out;
  grove_arena_reset(a);
  const uint64_t m0 = grove__arena_moves(a);
  ck_assert_ok(grove_model_forward(fx->model, a, x, 1, &out, &err), &err);
  *moved = grove__arena_moves(a) - m0;
  ck_assert_int_eq(out.n, 1);
  ck_assert(grove_tensor_is_contiguous(&out.v[0]));
  *bytes = grove_tensor_nbytes(&out.v[0]);
  *copy = malloc(*bytes + 1);
  memcpy(*copy, out.v[0].data, *bytes);
}

/* Graphs with chains of cats in place (SqueezeNet's Fire blocks) called
 * from a root graph: under a root plan they would run passthru, their
 * chains and scratch never moved down (DenseNet-121 at batch 1 ran 17%
 * slower planned), so the root's recording is kept bad and every forward
 * runs unplanned: it moves blocks down, and matches torch. */
START_TEST(test_no_plan_over_nested_cat_chains) {
  fixture fx = {0};
  fixture_load(&fx, "fire_nested");
  grove_arena *a = grove_arena_new(0);
  for (int pass = 0; pass < 3; pass++) {
    grove_err err = {0};
    grove_values out;
    grove_arena_reset(a);
    const uint64_t m0 = grove__arena_moves(a);
    ck_assert_ok(grove_model_forward(fx.model, a, &fx.set[0].x[0], 1, &out, &err), &err);
    ck_assert_msg(grove__arena_moves(a) - m0 > 0, "forward %d moved nothing: it ran planned", pass);
    assert_close("fire_nested", 0, &out.v[0], &fx.set[0].y[0]);
  }
  grove_arena_free(a);
  fixture_fini(&fx);
}
END_TEST

START_TEST(test_plan_moves_nothing) {
  fixture fx = {0};
  fixture_load(&fx, "resnet_fused");
  const grove_tensor *x0 = &fx.set[0].x[0];
  ck_assert_int_eq(x0->ndim, 4);
  grove_arena *a = grove_arena_new(0);
  /* The fixture's own input first: the plan's output matches torch too. */
  for (int pass = 0; pass < 2; pass++) {
    grove_err err = {0};
    grove_values out;
    grove_arena_reset(a);
    const uint64_t m0 = grove__arena_moves(a);
    ck_assert_ok(grove_model_forward(fx.model, a, x0, 1, &out, &err), &err);
    if (pass == 0)
      ck_assert_uint_gt(grove__arena_moves(a) - m0, 0); /* else the test tests nothing */
    if (pass == 1) ck_assert_uint_eq(grove__arena_moves(a) - m0, 0);
    assert_close("resnet_fused planned", 0, &out.v[0], &fx.set[0].y[0]);
  }
  const int64_t per = x0->shape[1] * x0->shape[2] * x0->shape[3];
  for (int b = 2; b <= 12; b++) {
    int64_t shape[4] = {b, x0->shape[1], x0->shape[2], x0->shape[3]};
    float *buf = malloc((size_t)(b * per) * sizeof(float));
    for (int64_t k = 0; k < b * per; k++) buf[k] = (float)((k * 7919 + b) % 101) / 50.0f - 1.0f;
    grove_tensor x;
    grove_tensor_init(&x, GROVE_F32, 4, shape, buf);
    float *first, *second;
    size_t n1, n2;
    uint64_t mv1, mv2;
    forward_copy(&fx, a, &x, &first, &n1, &mv1);
    forward_copy(&fx, a, &x, &second, &n2, &mv2);
    ck_assert_uint_eq(n1, n2);
    ck_assert_msg(memcmp(first, second, n1) == 0, "batch %d: the planned output differs", b);
    /* Batches 2..8 have plans 2..8 (1: the fixture's); 9.. run unplanned. */
    if (b <= 8 && x0->shape[0] != b)
      ck_assert_msg(mv2 == 0, "batch %d: the planned forward moved %llu bytes", b,
                    (unsigned long long)mv2);
    if (b > 9) ck_assert_uint_gt(mv2, 0);
    free(first);
    free(second);
    free(buf);
  }
  grove_arena_free(a);
  fixture_fini(&fx);
}
END_TEST

/* Plans when the signature changes (graph_plan.c): a forward at a new
 * signature (another batch, another free dimension: a CNN's H and W past
 * its adaptive pool, a sequence model's length; or other strides) records
 * a plan of its own or, past GROVE__MAX_PLANS, runs unplanned.  A model
 * serves signature A, B, A, B, then more signatures than the cache holds,
 * then all of them again on one arena; every output must be bit-identical
 * to a freshly loaded model's first (unplanned) forward at that signature,
 * a signature with a plan must move nothing the second time, and the
 * arena's high water must stay within the largest a fresh model needs for
 * one of them (the plans' blocks are not added up), with no growth on the
 * second round. */
typedef struct sig {
  int64_t shape[4];
  bool nhwc; /* resnet: channels-last strides (same shape, another signature) */
} sig;

typedef struct sig_out {
  char *bytes;
  size_t n;
} sig_out;

/* x for signature s: deterministic values; *buf is to free. */
static void sig_input(const sig *s, int ndim, grove_tensor *x, float **buf) {
  int64_t numel = 1;
  for (int d = 0; d < ndim; d++) numel *= s->shape[d];
  *buf = malloc((size_t)numel * sizeof(float));
  for (int64_t k = 0; k < numel; k++)
    (*buf)[k] = (float)((k * 7919 + s->shape[0] * 31 + s->shape[ndim - 1]) % 101) / 50.0f - 1.0f;
  grove_tensor_init(x, GROVE_F32, ndim, s->shape, *buf);
  if (s->nhwc) { /* the same values' positions, laid out N, H, W, C */
    const int64_t C = s->shape[1], H = s->shape[2], W = s->shape[3];
    x->strides[0] = H * W * C;
    x->strides[1] = 1;
    x->strides[2] = W * C;
    x->strides[3] = C;
  }
}

/* All outputs of one forward, concatenated. */
static sig_out sig_forward(grove_model *m, grove_arena *a, const grove_tensor *x, uint64_t *moved) {
  grove_err err = {0};
  grove_values out;
  grove_arena_reset(a);
  const uint64_t m0 = grove__arena_moves(a);
  ck_assert_ok(grove_model_forward(m, a, x, 1, &out, &err), &err);
  if (moved) *moved = grove__arena_moves(a) - m0;
  sig_out o = {0};
  for (int k = 0; k < out.n; k++) o.n += grove_tensor_nbytes(&out.v[k]);
  o.bytes = malloc(o.n + 1);
  char *p = o.bytes;
  for (int k = 0; k < out.n; k++) {
    ck_assert(grove_tensor_is_contiguous(&out.v[k]));
    memcpy(p, out.v[k].data, grove_tensor_nbytes(&out.v[k]));
    p += grove_tensor_nbytes(&out.v[k]);
  }
  return o;
}

static void plan_signatures(const char *name, int free_from, int ndim, const sig *sigs, int nsigs) {
  /* The references: a fresh model and arena per signature. */
  sig_out *want = calloc((size_t)nsigs, sizeof *want);
  size_t fresh_high = 0;
  for (int i = 0; i < nsigs; i++) {
    fixture fx = {0};
    fixture_load_free(&fx, name, free_from);
    grove_arena *a = grove_arena_new(0);
    grove_tensor x;
    float *buf;
    sig_input(&sigs[i], ndim, &x, &buf);
    want[i] = sig_forward(fx.model, a, &x, NULL);
    if (grove_arena_high_water(a) > fresh_high) fresh_high = grove_arena_high_water(a);
    free(buf);
    grove_arena_free(a);
    fixture_fini(&fx);
  }
  /* One model, one arena: A, B, A, B, then every signature, twice. */
  int order[64], n = 0;
  const int head[4] = {0, 1, 0, 1};
  for (int k = 0; k < 4; k++) order[n++] = head[k];
  for (int round = 0; round < 2; round++)
    for (int i = 0; i < nsigs; i++) order[n++] = i;
  ck_assert_int_le(n, 64);
  fixture fx = {0};
  fixture_load_free(&fx, name, free_from);
  grove_arena *a = grove_arena_new(0);
  int seen[64] = {0}; /* forwards so far at each signature */
  int first_new = -1; /* the first signature past the cache: sigs [0, first_new) have plans */
  int nplanned = 0;
  size_t grows_round2 = 0;
  for (int k = 0; k < n; k++) {
    const int i = order[k];
    if (k == 4 + nsigs) grows_round2 = grove_arena_grow_count(a);
    if (seen[i] == 0 && nplanned == GROVE__MAX_PLANS && first_new < 0) first_new = i;
    if (seen[i] == 0 && nplanned < GROVE__MAX_PLANS) nplanned++;
    grove_tensor x;
    float *buf;
    sig_input(&sigs[i], ndim, &x, &buf);
    uint64_t moved;
    sig_out got = sig_forward(fx.model, a, &x, &moved);
    ck_assert_uint_eq(got.n, want[i].n);
    ck_assert_msg(memcmp(got.bytes, want[i].bytes, got.n) == 0,
                  "%s: forward %d (signature %d, its forward %d) differs from a fresh model's",
                  name, k, i, seen[i] + 1);
    const bool planned = first_new < 0 || i < first_new;
    if (seen[i] > 0 && planned)
      ck_assert_msg(moved == 0, "%s: signature %d has a plan, yet forward %d moved %llu bytes",
                    name, i, k, (unsigned long long)moved);
    if (seen[i] > 0 && !planned && grove_tensor_numel(&x) > 0) /* empty: nothing to move */
      ck_assert_msg(moved > 0,
                    "%s: signature %d is past the %d plans, yet forward %d moved nothing", name, i,
                    GROVE__MAX_PLANS, k);
    seen[i]++;
    ck_assert_msg(grove_arena_high_water(a) <= fresh_high,
                  "%s: after forward %d (signature %d) the arena's high water is %zu bytes, "
                  "a fresh model needs at most %zu for one signature",
                  name, k, i, grove_arena_high_water(a), fresh_high);
    free(got.bytes);
    free(buf);
  }
  ck_assert_msg(first_new >= 0, "%s: only %d signatures, the cache holds %d", name, nsigs,
                GROVE__MAX_PLANS);
  ck_assert_uint_eq(grove_arena_grow_count(a), grows_round2); /* settled after round one */
  grove_arena_free(a);
  fixture_fini(&fx);
  for (int i = 0; i < nsigs; i++) free(want[i].bytes);
  free(want);
}

START_TEST(test_plan_signatures_cnn) {
  /* B has another batch and another H, W; then batches and sizes, and A's
   * shape with channels-last strides. */
  static const sig sigs[] = {
      {{2, 3, 12, 12}, false}, {{3, 3, 16, 20}, false}, {{1, 3, 12, 12}, false},
      {{2, 3, 8, 8}, false},   {{2, 3, 12, 12}, true},  {{4, 3, 10, 14}, false},
      {{1, 3, 24, 24}, false}, {{5, 3, 12, 12}, false}, {{2, 3, 13, 11}, false},
      {{3, 3, 12, 12}, false}, {{1, 3, 6, 30}, false},  {{6, 3, 16, 16}, false},
      {{0, 3, 12, 12}, false}, /* an empty batch: a plan of nothing (its block of 64) */
  };
  plan_signatures("resnet_fused", 2, 4, sigs, (int)(sizeof sigs / sizeof sigs[0]));
}
END_TEST

START_TEST(test_plan_signatures_seq) {
  /* [batch, sequence length, 8]: attention, masks made from the length. */
  static const sig sigs[] = {
      {{2, 5, 8}, false}, {{3, 9, 8}, false},  {{1, 5, 8}, false},  {{2, 1, 8}, false},
      {{4, 7, 8}, false}, {{2, 16, 8}, false}, {{1, 3, 8}, false},  {{5, 5, 8}, false},
      {{2, 6, 8}, false}, {{3, 12, 8}, false}, {{1, 20, 8}, false}, {{6, 2, 8}, false},
      {{2, 0, 8}, false}, /* an empty sequence */
  };
  plan_signatures("seq_masks", 0, 3, sigs, (int)(sizeof sigs / sizeof sigs[0]));
}
END_TEST

/* A forward that fails (an id past the embedding) while recording a plan
 * publishes none, and while on a plan leaves it good: the next forwards
 * at that signature record / use it and give a fresh model's bits. */
static sig_out ids_forward(grove_model *m, grove_arena *a, int64_t n, int64_t t, int64_t bad,
                           grove_status want, uint64_t *moved) {
  int64_t ids[64], shape[2] = {n, t};
  for (int64_t k = 0; k < n * t; k++) ids[k] = (k * 7 + n) % 20;
  if (bad) ids[n * t - 1] = bad;
  grove_tensor x;
  grove_tensor_init(&x, GROVE_I64, 2, shape, ids);
  if (want == GROVE_OK) return sig_forward(m, a, &x, moved);
  grove_err err = {0};
  grove_values out;
  grove_arena_reset(a);
  ck_assert_status(grove_model_forward(m, a, &x, 1, &out, &err), want);
  return (sig_out){0};
}

START_TEST(test_plan_after_error) {
  fixture ref = {0}, fx = {0};
  fixture_load(&ref, "embed_mean");
  fixture_load(&fx, "embed_mean");
  grove_arena *ra = grove_arena_new(0), *a = grove_arena_new(0);
  /* Signature [3, 4]: fails while recording, then records, then runs on
   * its plan, fails on it, and runs on it again. */
  static const int64_t bad[] = {20, 0, 0, 20, 0};
  static const int kind[] = {0, 1, 2, 0, 2}; /* 0 fails, 1 records, 2 planned */
  sig_out want = ids_forward(ref.model, ra, 3, 4, 0, GROVE_OK, NULL);
  for (int k = 0; k < 5; k++) {
    uint64_t moved = 0;
    sig_out got =
        ids_forward(fx.model, a, 3, 4, bad[k], kind[k] ? GROVE_OK : GROVE_E_RANGE, &moved);
    if (kind[k] == 0) continue;
    ck_assert_uint_eq(got.n, want.n);
    ck_assert_msg(memcmp(got.bytes, want.bytes, got.n) == 0, "forward %d differs", k);
    if (kind[k] == 2)
      ck_assert_msg(moved == 0, "forward %d moved %llu bytes", k, (unsigned long long)moved);
    if (kind[k] == 1) ck_assert_uint_gt(moved, 0); /* else the test tests nothing */
    free(got.bytes);
  }
  free(want.bytes);
  grove_arena_free(ra);
  grove_arena_free(a);
  fixture_fini(&ref);
  fixture_fini(&fx);
}
END_TEST

static Suite *graph_suite(void) {
  Suite *s = suite_create("graph");
  TCase *tc = tcase_create("parity");
  tcase_add_loop_test(tc, test_parity, 0, NCASES);
  tcase_add_test(tc, test_observer_unfuses);
  tcase_add_test(tc, test_residual_add_in_conv);
  suite_add_tcase(s, tc);
  tc = tcase_create("graphs");
  tcase_add_test(tc, test_arena_rewind);
  tcase_add_test(tc, test_spec_errors);
  tcase_add_test(tc, test_runtime_errors);
  tcase_add_test(tc, test_sort_refusals);
  tcase_add_test(tc, test_identity_graph);
  tcase_add_test(tc, test_user_ops_edges);
  tcase_add_test(tc, test_liveness);
  tcase_add_test(tc, test_holder_not_callable);
  tcase_add_test(tc, test_inlined_module_hooks);
  tcase_add_test(tc, test_state_dict);
  tcase_add_test(tc, test_large_graph_compiles);
  tcase_add_test(tc, test_se_scale_taken_by_conv);
  tcase_add_test(tc, test_cat_slices_copy_nothing);
  tcase_add_test(tc, test_plan_moves_nothing);
  tcase_add_test(tc, test_no_plan_over_nested_cat_chains);
  tcase_add_test(tc, test_plan_signatures_cnn);
  tcase_add_test(tc, test_plan_signatures_seq);
  tcase_add_test(tc, test_plan_after_error);
  suite_add_tcase(s, tc);
  return s;
}

GROVE_TEST_MAIN(graph_suite)
