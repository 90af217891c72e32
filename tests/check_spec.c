/* check_spec.c: model.json into a Module tree (spec.c) and model directories
 * opened, loaded and run (model.c).
 *
 * The spec half builds trees from JSON written here: nested and named
 * containers, shared modules ("ref"), tied parameters ("tied": one tensor
 * object), and every error with its exact status and the JSON path in the
 * message.  The directory half opens the fixtures that
 * tests/fixtures_gen/models.py exported from real torch models with
 * tools/grove_export.py, runs the saved input and compares with torch's
 * output (rtol 1e-4, atol 1e-5), and checks what open refuses: a missing
 * weights file, a checkpoint that does not fit (nothing is left behind),
 * outputs that disagree with the spec, an architecture that does not run. */
#define _XOPEN_SOURCE 700 /* nftw */
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "layers_internal.h" /* grove__linear_packed, deferred refresh */
#include "testutil.h"

#define RTOL 1e-4
#define ATOL 1e-5

/* ------------------------------------------------------------ helpers */

/* JSON with ' for " so that the specs below stay readable. */
static char *J(const char *s) {
  char *t = strdup(s);
  for (char *p = t; *p; p++)
    if (*p == '\'') *p = '"';
  return t;
}

#define HEAD \
  "'format': 'grove.model/1', 'inputs': [{'name': 'x', 'dtype': 'float32', 'shape': [-1, 4]}]"

/* A whole spec around a module value. */
static char *with_module(const char *module) {
  size_t n = strlen(HEAD) + strlen(module) + 32;
  char *s = malloc(n);
  snprintf(s, n, "{" HEAD ", 'module': %s}", module);
  char *j = J(s);
  free(s);
  return j;
}

static grove_model *spec_ok(const char *json_squoted) {
  char *text = J(json_squoted);
  grove_err err = {0};
  grove_model *m = NULL;
  ck_assert_ok(grove_model_from_spec(text, "model.json", &m, &err), &err);
  free(text);
  ck_assert_ptr_nonnull(m);
  return m;
}

static void expect_error(const char *text, grove_status want, const char *needle) {
  grove_err err = {0};
  grove_model *m = (grove_model *)1;
  grove_status s = grove_model_from_spec(text, "model.json", &m, &err);
  ck_assert_msg(s == want, "%s\n  got %s (%s), expected %s", text, grove_status_name(s), err.msg,
                grove_status_name(want));
  ck_assert_ptr_null(m);
  ck_assert_msg(strncmp(err.msg, "model.json: ", 12) == 0, "no origin in: %s", err.msg);
  ck_assert_msg(strstr(err.msg, needle) != NULL, "%s\n  message: %s\n  wanted: %s", text, err.msg,
                needle);
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
  return remove(path);
}

static void rm_rf(const char *dir) {
  nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

static void copy_file(const char *from, const char *to) {
  size_t len = 0;
  char *buf = grove_test_read_file(from, &len);
  ck_assert_msg(buf != NULL, "cannot read %s (run make fixtures)", from);
  ck_assert_int_eq(grove_test_write_file(to, buf, len), 0);
  free(buf);
}

static char *path2(const char *dir, const char *name) {
  size_t n = strlen(dir) + strlen(name) + 2;
  char *p = malloc(n);
  snprintf(p, n, "%s/%s", dir, name);
  return p;
}

static char *fixture_dir(const char *name) {
  char sub[128];
  snprintf(sub, sizeof sub, "models_%s", name);
  return strdup(grove_fixture(sub));
}

static grove_state_dict *read_st(const char *path) {
  grove_err err = {0};
  grove_state_dict *sd = NULL;
  ck_assert_ok(grove_safetensors_read(path, &sd, &err), &err);
  return sd;
}

static bool all_eval(const grove_module *root) {
  grove_named_modules mods = {0};
  grove_err err = {0};
  ck_assert_ok(grove_module_named_modules(root, "", false, &mods, &err), &err);
  bool ok = true;
  for (size_t i = 0; i < mods.n; i++) ok &= !mods.items[i].module->training;
  grove_named_modules_fini(&mods);
  return ok;
}

/* The tree's state_dict keys, in order, equal the file's. */
static void assert_keys_match_file(const grove_module *root, const char *weights) {
  grove_state_dict *file = read_st(weights);
  grove_state_dict *mine = grove_sd_new();
  grove_err err = {0};
  ck_assert_ok(grove_module_state_dict(root, NULL, mine, &err), &err);
  ck_assert_uint_eq(grove_sd_count(mine), grove_sd_count(file));
  for (size_t i = 0; i < grove_sd_count(file); i++)
    ck_assert_str_eq(grove_sd_key(mine, i), grove_sd_key(file, i));
  grove_sd_free(mine);
  grove_sd_free(file);
}

static void assert_close_tensor(const grove_tensor *got, const grove_tensor *want,
                                const char *what) {
  char a[128], b[128];
  ck_assert_msg(grove_tensor_same_shape(got, want), "%s: shape %s, torch %s", what,
                grove_shape_str(got->ndim, got->shape, a, sizeof a),
                grove_shape_str(want->ndim, want->shape, b, sizeof b));
  ck_assert_int_eq(got->dtype, GROVE_F32);
  ck_assert(grove_tensor_is_contiguous(got));
  size_t n = (size_t)grove_tensor_numel(want);
  long bad = grove_test_allclose(got->data, want->data, n, RTOL, ATOL);
  ck_assert_msg(bad < 0, "%s: element %ld is %g, torch says %g", what, bad,
                bad < 0 ? 0.0 : ((const float *)got->data)[bad],
                bad < 0 ? 0.0 : ((const float *)want->data)[bad]);
}

/* ============================================================ valid specs */

START_TEST(test_nested_named) {
  grove_model *m = spec_ok(
      "{" HEAD
      ", 'module': {'type': 'Sequential', 'children': {"
      "  'stem': {'type': 'Sequential', 'children': ["
      "     {'type': 'Linear', 'in_features': 4, 'out_features': 8}, {'type': 'ReLU'}]},"
      "  'head': {'type': 'ModuleDict', 'children': {'a': {'type': 'Linear', 'in_features': 8,"
      "           'out_features': 2, 'bias': false}, 'b': null}},"
      "  'list': {'type': 'ModuleList', 'children': [{'type': 'Identity'}, null]},"
      "  'empty': {'type': 'Sequential'}}}}");
  grove_module *root = m->root;
  ck_assert_str_eq(root->type->name, "Sequential");
  ck_assert_uint_eq(root->nchildren, 4);
  const char *names[] = {"stem", "head", "list", "empty"};
  for (int i = 0; i < 4; i++) ck_assert_str_eq(root->children[i].name, names[i]);
  ck_assert_str_eq(grove_module_find(root, "stem.0")->type->name, "Linear");
  ck_assert_str_eq(grove_module_find(root, "stem.1")->type->name, "ReLU");
  ck_assert_str_eq(grove_module_find(root, "head")->type->name, "ModuleDict");
  ck_assert_str_eq(grove_module_find(root, "head.a")->type->name, "Linear");
  ck_assert_ptr_null(grove_module_param(grove_module_find(root, "head.a"), "bias"));
  grove_module *list = grove_module_find(root, "list");
  ck_assert_uint_eq(list->nchildren, 2);
  ck_assert_str_eq(list->children[1].name, "1");
  ck_assert_ptr_null(list->children[1].module); /* null is torch's None */
  ck_assert_uint_eq(grove_module_find(root, "empty")->nchildren, 0);
  ck_assert(all_eval(root));
  /* Defaults. */
  ck_assert_ptr_null(m->name);
  ck_assert_ptr_null(m->weights_path);
  ck_assert_int_eq(m->batching.max_batch_size, 64);
  ck_assert_int_eq(m->batching.max_queue_delay_us, 500);
  ck_assert_int_eq(m->batching.max_queue_size, 1024);
  ck_assert_uint_eq(m->ninputs, 1);
  ck_assert_str_eq(m->inputs[0].name, "x");
  ck_assert_int_eq(m->inputs[0].dtype, GROVE_F32);
  ck_assert_int_eq(m->inputs[0].ndim, 2);
  ck_assert_int_eq(m->inputs[0].shape[0], -1);
  ck_assert_int_eq(m->inputs[0].shape[1], 4);
  ck_assert_uint_eq(m->noutputs, 0);
  /* torch's state_dict order. */
  grove_state_dict *sd = grove_sd_new();
  grove_err err = {0};
  ck_assert_ok(grove_module_state_dict(root, NULL, sd, &err), &err);
  const char *keys[] = {"stem.0.weight", "stem.0.bias", "head.a.weight"};
  ck_assert_uint_eq(grove_sd_count(sd), 3);
  for (int i = 0; i < 3; i++) ck_assert_str_eq(grove_sd_key(sd, (size_t)i), keys[i]);
  grove_sd_free(sd);
  grove_model_free(m);
}
END_TEST

/* Every module of the tree, depth first. */
static void modules_of(grove_module *root, grove_named_modules *mods) {
  grove_err err = {0};
  ck_assert_ok(grove_module_named_modules(root, "", true, mods, &err), &err);
}

/* Which of the big layers hold their packed weights; each has the same
 * value, which is returned. */
static bool packed(grove_module *root) {
  const char *lin[] = {"lin", "enc.linear1", "enc.linear2", "enc.self_attn.out_proj"};
  bool p = grove__linear_packed(grove_module_find(root, "lin"));
  for (size_t i = 0; i < sizeof lin / sizeof *lin; i++)
    ck_assert_msg(grove__linear_packed(grove_module_find(root, lin[i])) == p, "%s", lin[i]);
  ck_assert(grove__conv_rows_path(grove_module_find(root, "conv")) == p);
  ck_assert(grove__mha_packed(grove_module_find(root, "attn")) == p);
  ck_assert(grove__mha_packed(grove_module_find(root, "enc.self_attn")) == p);
  return p;
}

static bool any_pending(grove_module *root) {
  grove_named_modules mods = {0};
  modules_of(root, &mods);
  bool any = false;
  for (size_t i = 0; i < mods.n; i++) any |= mods.items[i].module->refresh_pending;
  grove_named_modules_fini(&mods);
  return any;
}

/* grove_model_open builds its tree for the load that follows: the big
 * layers' constructors pack nothing (their zero weights are about to be
 * replaced, and a packed copy of zeros cost a full extra copy of the
 * weights during every reload); the load packs the real weights once.  The
 * public grove_model_from_spec still returns a tree that runs. */
START_TEST(test_built_for_load_packs_nothing) {
  const char *spec =
      "{" HEAD
      ", 'module': {'type': 'ModuleDict', 'children': {"
      "  'lin': {'type': 'Linear', 'in_features': 4, 'out_features': 8},"
      "  'conv': {'type': 'Conv2d', 'in_channels': 8, 'out_channels': 8, 'kernel_size': 3},"
      "  'attn': {'type': 'MultiheadAttention', 'embed_dim': 8, 'num_heads': 2},"
      "  'enc': {'type': 'TransformerEncoderLayer', 'd_model': 8, 'nhead': 2,"
      "          'dim_feedforward': 16},"
      "  'norm': {'type': 'LayerNorm', 'normalized_shape': 8}}}}";
  grove_model *ready = spec_ok(spec);
  ck_assert(packed(ready->root));
  ck_assert(!any_pending(ready->root));

  grove__refresh_defer_begin();
  grove_model *built = spec_ok(spec);
  grove__refresh_defer_end();
  ck_assert(!packed(built->root));
  /* Only the layers that pack are deferred; the others refreshed as ever. */
  grove_named_modules mods = {0};
  modules_of(built->root, &mods);
  for (size_t i = 0; i < mods.n; i++) {
    const char *t = mods.items[i].module->type->name;
    bool big = !strcmp(t, "Linear") || !strcmp(t, "Conv2d") || !strcmp(t, "MultiheadAttention");
    ck_assert_msg(mods.items[i].module->refresh_pending == big, "%s (%s)", mods.items[i].name, t);
  }
  grove_named_modules_fini(&mods);

  /* A load of the whole tree refreshes every module: packed once. */
  grove_state_dict *sd = grove_sd_new();
  grove_err err = {0};
  ck_assert_ok(grove_module_state_dict(ready->root, NULL, sd, &err), &err);
  grove_load_opts lo = {.strict = true, .assign = true};
  ck_assert_ok(grove_module_load_state_dict(built->root, sd, &lo, NULL, &err), &err);
  ck_assert(packed(built->root));
  ck_assert(!any_pending(built->root));
  grove_sd_free(sd);
  grove_model_free(built);

  /* What a load leaves pending (none) or a tree that is never loaded gets
   * refreshed by grove__refresh_pending, and only that. */
  grove__refresh_defer_begin();
  built = spec_ok(spec);
  grove__refresh_defer_end();
  ck_assert_ok(grove__refresh_pending(grove_module_find(built->root, "enc"), &err), &err);
  ck_assert(grove__linear_packed(grove_module_find(built->root, "enc.linear1")));
  ck_assert(!grove__linear_packed(grove_module_find(built->root, "lin")));
  ck_assert_ok(grove__refresh_pending(built->root, &err), &err);
  ck_assert(packed(built->root));
  ck_assert(!any_pending(built->root));
  grove_model_free(built);
  grove_model_free(ready);
}
END_TEST

START_TEST(test_ref_is_the_same_module) {
  grove_model *m = spec_ok(
      "{" HEAD
      ", 'module': {'type': 'Sequential', 'children': ["
      "  {'type': 'Linear', 'in_features': 4, 'out_features': 4}, {'type': 'ReLU'},"
      "  {'type': 'Sequential', 'children': {'again': {'ref': '0'}, 'act': {'type': 'Tanh'}}},"
      "  {'ref': '2.again'}]}}");
  grove_module *a = grove_module_find(m->root, "0");
  ck_assert_ptr_eq(grove_module_find(m->root, "2.again"), a);
  ck_assert_ptr_eq(grove_module_find(m->root, "3"), a);
  ck_assert_int_eq(grove_module_param_count(m->root), 4 * 4 + 4);
  grove_state_dict *sd = grove_sd_new();
  grove_err err = {0};
  ck_assert_ok(grove_module_state_dict(m->root, NULL, sd, &err), &err);
  ck_assert_uint_eq(grove_sd_count(sd), 6); /* as torch: the shared module under each path */
  ck_assert_str_eq(grove_sd_key(sd, 2), "2.again.weight");
  ck_assert_str_eq(grove_sd_key(sd, 5), "3.bias");
  grove_sd_free(sd);
  grove_model_free(m);
}
END_TEST

START_TEST(test_tied_is_the_same_tensor) {
  grove_model *m = spec_ok(
      "{'format': 'grove.model/1', 'inputs': [{'name': 'ids', 'dtype': 'int64', 'shape': [-1, "
      "-1]}],"
      " 'module': {'type': 'Sequential', 'children': {"
      "  'embed': {'type': 'Embedding', 'num_embeddings': 10, 'embedding_dim': 4},"
      "  'dec': {'type': 'Linear', 'in_features': 4, 'out_features': 10, 'bias': false,"
      "          'tied': {'weight': 'embed.weight'}}}}}");
  grove_tensor *w = grove_module_param(grove_module_find(m->root, "embed"), "weight");
  ck_assert_ptr_nonnull(w);
  ck_assert_ptr_eq(grove_module_param(grove_module_find(m->root, "dec"), "weight"), w);
  ck_assert_int_eq(grove_module_param_count(m->root), 40);
  ck_assert_int_eq(m->inputs[0].dtype, GROVE_I64);
  ck_assert_int_eq(m->inputs[0].shape[1], -1);
  grove_model_free(m);
}
END_TEST

START_TEST(test_io_batching_name_weights) {
  grove_model *m = spec_ok(
      "{'format': 'grove.model/1', 'name': 'digits', 'weights': 'ckpt/w.safetensors',"
      " 'inputs': [{'name': 'x', 'dtype': 'float32', 'shape': [-1, 2, 4]},"
      "            {'name': 'mask', 'dtype': 'bool', 'shape': [-1]}],"
      " 'outputs': [{'name': 'y', 'dtype': 'float32', 'shape': [-1, 2, 3]},"
      "             {'name': 's', 'dtype': 'float32', 'shape': []}],"
      " 'batching': {'max_batch_size': 8, 'max_queue_delay_us': 0, 'max_queue_size': 3},"
      " 'module': {'type': 'Linear', 'in_features': 4, 'out_features': 3}}");
  ck_assert_str_eq(m->name, "digits");
  ck_assert_uint_eq(m->ninputs, 2);
  ck_assert_str_eq(m->inputs[1].name, "mask");
  ck_assert_int_eq(m->inputs[1].dtype, GROVE_BOOL);
  ck_assert_int_eq(m->inputs[1].ndim, 1);
  ck_assert_uint_eq(m->noutputs, 2);
  ck_assert_int_eq(m->outputs[0].ndim, 3);
  ck_assert_int_eq(m->outputs[0].shape[2], 3);
  ck_assert_int_eq(m->outputs[1].ndim, 0);
  ck_assert_int_eq(m->batching.max_batch_size, 8);
  ck_assert_int_eq(m->batching.max_queue_delay_us, 0);
  ck_assert_int_eq(m->batching.max_queue_size, 3);
  ck_assert(all_eval(m->root));
  grove_model_free(m);
}
END_TEST

/* The message shape promised in docs/model-spec.md, word for word. */
START_TEST(test_exact_message) {
  char *text = with_module(
      "{'type': 'Sequential', 'children': [{'type': 'Linear', "
      "'in_features': 4, 'out_features': 8}, {'type': 'ReLU'}, "
      "{'type': 'Linear', 'in_features': 8, 'out_features': -3}]}");
  grove_err err = {0};
  grove_model *m = NULL;
  ck_assert_status(grove_model_from_spec(text, "model.json", &m, &err), GROVE_E_SPEC);
  ck_assert_str_eq(err.msg,
                   "model.json: $.module.children[2].out_features: expected a positive integer, "
                   "got -3");
  ck_assert_int_eq(err.code, GROVE_E_SPEC);
  /* err may be NULL. */
  ck_assert_status(grove_model_from_spec(text, NULL, &m, NULL), GROVE_E_SPEC);
  ck_assert_ptr_null(m);
  free(text);
}
END_TEST

/* ============================================================ invalid specs */

typedef struct bad_case {
  const char *json; /* ' for "; a whole document when it starts with '{', else a module */
  grove_status status;
  const char *needle;
} bad_case;

#define L4 "{'type': 'Linear', 'in_features': 4, 'out_features': 4}"

static const bad_case bad[] = {
    /* JSON itself */
    {"{'format': 'grove.model/1',", GROVE_E_SPEC, "not valid JSON (line 1, column"},
    {"{'format': 'grove.model/1', 'format': 'grove.model/1'}", GROVE_E_SPEC,
     "not valid JSON (line 1, column 36: a key named twice in one object)"},
    {"[1, 2]", GROVE_E_SPEC, "$: expected an object, got an array of 2 items"},
    /* top level */
    {"{'inputs': []}", GROVE_E_SPEC, "$.format: missing (expected \"grove.model/1\")"},
    {"{'format': 'grove.model/2'}", GROVE_E_SPEC, "$.format: expected \"grove.model/1\""},
    {"{'format': 1}", GROVE_E_SPEC, "$.format: expected"},
    {"{" HEAD ", 'modul': " L4 "}", GROVE_E_SPEC, "$.modul: unknown key in model.json"},
    {"{" HEAD "}", GROVE_E_SPEC, "$.module: missing"},
    {"{" HEAD ", 'name': '', 'module': " L4 "}", GROVE_E_SPEC, "$.name: expected"},
    {"{" HEAD ", 'name': 'a/b', 'module': " L4 "}", GROVE_E_SPEC, "$.name: expected"},
    {"{" HEAD ", 'weights': '../w.pt', 'module': " L4 "}", GROVE_E_SPEC, "$.weights: \"../w.pt\""},
    {"{" HEAD ", 'weights': '/etc/w.pt', 'module': " L4 "}", GROVE_E_SPEC, "$.weights:"},
    {"{" HEAD ", 'weights': 3, 'module': " L4 "}", GROVE_E_SPEC, "$.weights: expected"},
    /* inputs and outputs */
    {"{'format': 'grove.model/1', 'module': " L4 "}", GROVE_E_SPEC, "$.inputs: missing"},
    {"{'format': 'grove.model/1', 'inputs': [], 'module': " L4 "}", GROVE_E_SPEC,
     "$.inputs: expected a list of 1 to 4 inputs"},
    {"{'format': 'grove.model/1', 'inputs': {}, 'module': " L4 "}", GROVE_E_SPEC,
     "$.inputs: expected"},
    {"{'format': 'grove.model/1', 'inputs': [3], 'module': " L4 "}", GROVE_E_SPEC,
     "$.inputs[0]: expected an object"},
    {"{'format': 'grove.model/1', 'inputs': [{'name': 'x', 'shape': [-1]}], 'module': " L4 "}",
     GROVE_E_SPEC, "$.inputs[0]: missing \"dtype\""},
    {"{'format': 'grove.model/1', 'inputs': [{'name': 'x', 'dtype': 'float33', 'shape': [-1]}], "
     "'module': " L4 "}",
     GROVE_E_SPEC, "$.inputs[0].dtype: expected a dtype name"},
    {"{'format': 'grove.model/1', 'inputs': [{'name': '', 'dtype': 'float32', 'shape': [-1]}], "
     "'module': " L4 "}",
     GROVE_E_SPEC, "$.inputs[0].name: expected a non-empty string"},
    {"{'format': 'grove.model/1', 'inputs': [{'name': 'x', 'dtype': 'float32', 'shape': [4, 4]}], "
     "'module': " L4 "}",
     GROVE_E_SPEC, "$.inputs[0].shape[0]: dimension 0 is the batch and must be -1, got 4"},
    {"{'format': 'grove.model/1', 'inputs': [{'name': 'x', 'dtype': 'float32', 'shape': [-1, 0]}], "
     "'module': " L4 "}",
     GROVE_E_SPEC, "$.inputs[0].shape[1]: expected a positive integer or -1 (any size), got 0"},
    {"{'format': 'grove.model/1', 'inputs': [{'name': 'x', 'dtype': 'float32', 'shape': []}], "
     "'module': " L4 "}",
     GROVE_E_SPEC, "$.inputs[0].shape: expected a list of 1 to 8 dimensions"},
    {"{'format': 'grove.model/1', 'inputs': [{'name': 'x', 'dtype': 'float32', 'shape': [-1], "
     "'layout': 'nchw'}], 'module': " L4 "}",
     GROVE_E_SPEC, "$.inputs[0].layout: unknown key in an input"},
    {"{'format': 'grove.model/1', 'inputs': [{'name': 'x', 'dtype': 'float32', 'shape': [-1]}, "
     "{'name': 'x', 'dtype': 'float32', 'shape': [-1]}], 'module': " L4 "}",
     GROVE_E_SPEC, "$.inputs[1].name: \"x\" is also the name of $.inputs[0]"},
    {"{" HEAD ", 'outputs': [{'name': 'y', 'dtype': 'float32', 'shape': [-1, -2]}], "
     "'module': " L4 "}",
     GROVE_E_SPEC, "$.outputs[0].shape[1]: expected a positive integer or -1"},
    {"{" HEAD ", 'outputs': 'y', 'module': " L4 "}", GROVE_E_SPEC, "$.outputs: expected"},
    /* batching */
    {"{" HEAD ", 'batching': {'max_batch_size': -1}, 'module': " L4 "}", GROVE_E_SPEC,
     "$.batching.max_batch_size: expected an integer in [0, 1048576], got -1"},
    {"{" HEAD ", 'batching': {'max_queue_delay_us': -1}, 'module': " L4 "}", GROVE_E_SPEC,
     "$.batching.max_queue_delay_us: expected an integer in [0, "},
    {"{" HEAD ", 'batching': {'max_queue_size': 1.5}, 'module': " L4 "}", GROVE_E_SPEC,
     "$.batching.max_queue_size: expected an integer"},
    {"{" HEAD ", 'batching': {'max_batchsize': 4}, 'module': " L4 "}", GROVE_E_SPEC,
     "$.batching.max_batchsize: unknown key in batching"},
    {"{" HEAD ", 'batching': 4, 'module': " L4 "}", GROVE_E_SPEC, "$.batching: expected an object"},
    /* modules */
    {"null", GROVE_E_SPEC, "$.module: expected an object describing a module"},
    {"{'in_features': 4}", GROVE_E_SPEC, "$.module: missing \"type\""},
    {"{'type': 7}", GROVE_E_SPEC, "$.module.type: expected a torch.nn class name, got 7"},
    {"{'type': 'Sequential', 'children': [" L4 ", {'type': 'Conv3d'}]}", GROVE_E_SPEC,
     "$.module.children[1].type: \"Conv3d\" is not a module type Grove runs (supported: "},
    {"{'type': 'Linear', 'in_features': 4, 'out_features': 4, 'children': []}", GROVE_E_SPEC,
     "$.module.children: a Linear has no children"},
    {"{'type': 'Sequential', 'children': 3}", GROVE_E_SPEC,
     "$.module.children: expected an array of modules or an object mapping names to modules, got "
     "3"},
    {"{'type': 'ModuleDict', 'children': [" L4 "]}", GROVE_E_SPEC,
     "$.module.children: a ModuleDict's children are an object"},
    {"{'type': 'Sequential', 'children': {'a.b': " L4 "}}", GROVE_E_SPEC,
     "$.module.children[\"a.b\"]: invalid child name \"a.b\""},
    {"{'type': 'Sequential', 'children': {'': " L4 "}}", GROVE_E_SPEC,
     "$.module.children[\"\"]: invalid child name \"\""},
    {"{'type': 'Sequential', 'children': [{'type': 'Linear', 'in_features': 4, 'out_feature': 4}]}",
     GROVE_E_SPEC, "$.module.children[0].out_feature: unknown argument of Linear"},
    {"{'type': 'Sequential', 'children': {'fc': {'type': 'Linear', 'in_features': 4}}}",
     GROVE_E_SPEC, "$.module.children.fc.out_features: missing"},
    {"{'type': 'Sequential', 'children': [{'type': 'Sequential', 'children': [{'type': 'GELU', "
     "'approximate': 'fast'}]}]}",
     GROVE_E_SPEC, "$.module.children[0].children[0].approximate: expected one of"},
    {"[]", GROVE_E_SPEC, "$.module: expected an object describing a module"},
    /* graph (tests/check_graph.c has the rest) */
    {"{'type': 'Sequential', 'children': [{'type': 'Block', 'graph': []}]}", GROVE_E_SPEC,
     "$.module.children[0].graph: no output node"},
    /* ref */
    {"{'type': 'Sequential', 'children': [{'ref': '1'}, " L4 "]}", GROVE_E_SPEC,
     "$.module.children[0].ref: \"1\" names no module defined before this point"},
    {"{'type': 'Sequential', 'children': [" L4 ", {'ref': 'fc'}]}", GROVE_E_SPEC,
     "$.module.children[1].ref: \"fc\" names no module"},
    {"{'type': 'Sequential', 'children': {'a': {'type': 'Sequential', 'children': [{'ref': "
     "'a'}]}}}",
     GROVE_E_SPEC,
     "$.module.children.a.children[0].ref: \"a\" is this module or one of its ancestors"},
    {"{'type': 'Sequential', 'children': [{'ref': ''}]}", GROVE_E_SPEC,
     "$.module.children[0].ref: \"\" is this module or one of its ancestors"},
    {"{'type': 'Sequential', 'children': [" L4 ", {'ref': '0', 'type': 'Linear'}]}", GROVE_E_SPEC,
     "$.module.children[1].type: unknown key in a {\"ref\": PATH} entry"},
    {"{'type': 'Sequential', 'children': [" L4 ", {'ref': 0}]}", GROVE_E_SPEC,
     "$.module.children[1].ref: expected the dotted path of a module defined earlier, got 0"},
    {"{'ref': 'x'}", GROVE_E_SPEC, "$.module.ref: \"x\" names no module"},
    /* tied */
    {"{'type': 'Sequential', 'children': [" L4 ", {'type': 'Linear', 'in_features': 4, "
     "'out_features': 4, 'tied': ['0.weight']}]}",
     GROVE_E_SPEC, "$.module.children[1].tied: expected an object"},
    {"{'type': 'Sequential', 'children': [" L4 ", {'type': 'Linear', 'in_features': 4, "
     "'out_features': 4, 'tied': {'weight': 3}}]}",
     GROVE_E_SPEC, "$.module.children[1].tied.weight: expected the dotted path of a parameter"},
    {"{'type': 'Sequential', 'children': [" L4 ", {'type': 'Linear', 'in_features': 4, "
     "'out_features': 4, 'tied': {'weight': 'enc.weight'}}]}",
     GROVE_E_SPEC, "$.module.children[1].tied.weight: \"enc.weight\" names no module \"enc\""},
    {"{'type': 'Sequential', 'children': [" L4 ", {'type': 'Linear', 'in_features': 4, "
     "'out_features': 4, 'tied': {'weight': '0.scale'}}]}",
     GROVE_E_SPEC,
     "$.module.children[1].tied.weight: \"0.scale\": the Linear at \"0\" has no "
     "parameter \"scale\""},
    {"{'type': 'Sequential', 'children': [{'type': 'Linear', 'in_features': 4, 'out_features': 4, "
     "'bias': false}, {'type': 'Linear', 'in_features': 4, 'out_features': 4, "
     "'tied': {'bias': '0.bias'}}]}",
     GROVE_E_SPEC,
     "$.module.children[1].tied.bias: \"0.bias\": the Linear at \"0\" has no "
     "parameter \"bias\""},
    {"{'type': 'Sequential', 'children': [" L4 ", {'type': 'Linear', 'in_features': 4, "
     "'out_features': 4, 'tied': {'scale': '0.weight'}}]}",
     GROVE_E_SPEC, "$.module.children[1].tied.scale: a Linear has no parameter \"scale\" to tie"},
    {"{'type': 'Sequential', 'children': [" L4 ", {'type': 'Linear', 'in_features': 4, "
     "'out_features': 4, 'bias': false, 'tied': {'bias': '0.bias'}}]}",
     GROVE_E_SPEC, "$.module.children[1].tied.bias: this Linear's parameter \"bias\" is None"},
    {"{'type': 'Sequential', 'children': [" L4 ", {'type': 'Linear', 'in_features': 4, "
     "'out_features': 4, 'tied': {'bias': '0.weight'}}]}",
     GROVE_E_SPEC,
     "$.module.children[1].tied.bias: \"0.weight\" is float32 [4, 4] but this "
     "Linear's \"bias\" is float32 [4]: tied parameters must have the same shape"},
    {"{'type': 'Sequential', 'children': [" L4 ", {'type': 'Linear', 'in_features': 4, "
     "'out_features': 4, 'tied': {'weight': '1.weight'}}]}",
     GROVE_E_SPEC, "$.module.children[1].tied.weight: \"1.weight\" is this very parameter"},
    {"{'type': 'Sequential', 'children': [" L4 ", {'type': 'Linear', 'in_features': 4, "
     "'out_features': 4, 'tied': {'weight': '0.weight'}}, {'type': 'Linear', 'in_features': 4, "
     "'out_features': 4, 'tied': {'weight': '1.weight'}}]}",
     GROVE_E_SPEC, "$.module.children[2].tied.weight: \"1.weight\" is itself tied"},
    {"{'type': 'Linear', 'in_features': 4, 'out_features': 4, 'tied': {'weight': 'weight'}}",
     GROVE_E_SPEC, "$.module.tied.weight: \"weight\" is this very parameter"},
};

START_TEST(test_bad_spec) {
  const bad_case *c = &bad[_i];
  bool document = strncmp(c->json, "{'format'", 9) == 0 || strncmp(c->json, "{'inputs'", 9) == 0 ||
                  strcmp(c->json, "[1, 2]") == 0;
  char *text = document ? J(c->json) : with_module(c->json);
  expect_error(text, c->status, c->needle);
  free(text);
}
END_TEST

START_TEST(test_too_deep) {
  size_t depth = 300, n = depth * 64 + 256;
  char *mod = malloc(n), *p = mod;
  for (size_t i = 0; i < depth; i++) p += sprintf(p, "{'type': 'Sequential', 'children': [");
  p += sprintf(p, "{'type': 'ReLU'}");
  for (size_t i = 0; i < depth; i++) p += sprintf(p, "]}");
  char *text = with_module(mod);
  expect_error(text, GROVE_E_SPEC, "nested more than 200 deep");
  free(text);
  free(mod);
}
END_TEST

START_TEST(test_null_arguments) {
  grove_err err = {0};
  grove_model *m = NULL;
  ck_assert_status(grove_model_from_spec(NULL, "x", &m, &err), GROVE_E_INVALID_ARGUMENT);
  ck_assert_status(grove_model_from_spec("{}", "x", NULL, &err), GROVE_E_INVALID_ARGUMENT);
  ck_assert_status(grove_model_open(NULL, NULL, &m, &err), GROVE_E_INVALID_ARGUMENT);
  ck_assert_ptr_null(m);
  grove_model_free(NULL);
}
END_TEST

/* ============================================================ fixture dirs */

static const char *const served[] = {"mlp", "nested", "norms", "embed", "tied"};

START_TEST(test_open_matches_torch) {
  const char *name = served[_i];
  char *dir = fixture_dir(name);
  grove_err err = {0};
  grove_model *m = NULL;
  ck_assert_ok(grove_model_open(dir, NULL, &m, &err), &err);
  char want_name[64];
  snprintf(want_name, sizeof want_name, "models_%s", name);
  ck_assert_str_eq(m->name, want_name);
  ck_assert_str_eq(m->dir, dir);
  char *weights = path2(dir, "weights.safetensors");
  ck_assert_str_eq(m->weights_path, weights);
  ck_assert(all_eval(m->root));
  ck_assert(!any_pending(m->root)); /* built for the load, then packed by it */
  ck_assert_int_eq(m->batching.max_batch_size, 16);
  ck_assert_int_eq(m->batching.max_queue_delay_us, 200);
  ck_assert_int_eq(m->batching.max_queue_size, 1024);
  ck_assert_int_gt(m->param_count, 0);
  ck_assert_uint_gt(m->weight_bytes, 0);
  ck_assert_uint_gt(m->arena_bytes, 0);
  ck_assert_uint_eq(m->noutputs, 1);
  assert_keys_match_file(m->root, weights);

  char *io_path = path2(dir, "io.safetensors");
  grove_state_dict *io = read_st(io_path);
  grove_tensor *x = grove_sd_get(io, "x"), *y = grove_sd_get(io, "y");
  ck_assert_ptr_nonnull(x);
  ck_assert_ptr_nonnull(y);
  grove_arena *arena = grove_arena_new(0);
  grove_values out = {0};
  ck_assert_ok(grove_model_forward(m, arena, x, 1, &out, &err), &err);
  ck_assert_int_eq(out.n, 1);
  assert_close_tensor(&out.v[0], y, name);
  /* The output fits the spec's outputs, as open checked at batch 16. */
  ck_assert_int_eq(out.v[0].ndim, m->outputs[0].ndim);
  grove_arena_reset(arena);
  grove_arena_free(arena);

  /* Without a free non-batch dimension, the measured scratch is all a full
   * batch needs: an arena of that size never grows. */
  bool free_dims = false;
  for (int d = 1; d < m->inputs[0].ndim; d++) free_dims |= m->inputs[0].shape[d] == -1;
  if (!free_dims) {
    int64_t shape[GROVE_MAX_DIMS];
    int64_t n = 1;
    for (int d = 0; d < m->inputs[0].ndim; d++) {
      shape[d] = d == 0 ? m->batching.max_batch_size : m->inputs[0].shape[d];
      n *= shape[d];
    }
    float *zeros = calloc((size_t)n, sizeof *zeros);
    grove_tensor z;
    grove_tensor_init(&z, GROVE_F32, m->inputs[0].ndim, shape, zeros);
    arena = grove_arena_new(m->arena_bytes);
    ck_assert_ok(grove_model_forward(m, arena, &z, 1, &out, &err), &err);
    ck_assert_uint_eq(grove_arena_grow_count(arena), 0);
    grove_arena_free(arena);
    free(zeros);
  }
  grove_sd_free(io);
  free(io_path);
  free(weights);
  free(dir);
  grove_model_free(m);
}
END_TEST

START_TEST(test_open_tied_stays_tied) {
  char *dir = fixture_dir("tied");
  grove_err err = {0};
  grove_model *m = NULL;
  ck_assert_ok(grove_model_open(dir, NULL, &m, &err), &err);
  grove_tensor *e = grove_module_param(grove_module_find(m->root, "embed"), "weight");
  ck_assert_ptr_eq(grove_module_param(grove_module_find(m->root, "decode"), "weight"), e);
  /* embed 30x12, mix 12x12 + 12; decode shares embed's weight. */
  ck_assert_int_eq(m->param_count, 30 * 12 + 12 * 12 + 12);
  ck_assert_uint_eq(m->weight_bytes, (size_t)(30 * 12 + 12 * 12 + 12) * 4);
  /* The loaded values are the checkpoint's. */
  char *weights = path2(dir, "weights.safetensors");
  grove_state_dict *sd = read_st(weights);
  grove_tensor *want = grove_sd_get(sd, "embed.weight");
  ck_assert_int_eq(grove_test_allclose(e->data, want->data, 30 * 12, 0, 0), -1);
  grove_sd_free(sd);
  free(weights);
  free(dir);
  grove_model_free(m);
}
END_TEST

/* Non-strict, with only the later key of a tie in the checkpoint: as torch's
 * copying load, the one shared tensor ends up with that key's values. */
START_TEST(test_tie_from_the_later_key) {
  char *src = fixture_dir("tied"), *dir = strdup(grove_test_tmpdir());
  char *a = path2(src, "model.json"), *b = path2(dir, "model.json");
  copy_file(a, b);
  char *from = path2(src, "weights.safetensors"), *to = path2(dir, "weights.safetensors");
  grove_state_dict *sd = read_st(from);
  grove_err err = {0};
  /* Distinct values under the later key, so that the choice shows. */
  grove_tensor *dec = grove_tensor_clone(grove_sd_get(sd, "decode.weight"), GROVE_F32, &err);
  for (int i = 0; i < 30 * 12; i++) ((float *)dec->data)[i] = (float)i;
  ck_assert_ok(grove_sd_set(sd, "decode.weight", dec, &err), &err);
  ck_assert(grove_sd_remove(sd, "embed.weight"));
  ck_assert_ok(grove_safetensors_write(to, sd, &err), &err);
  grove_model *m = (grove_model *)1;
  ck_assert_status(grove_model_open(dir, NULL, &m, &err), GROVE_E_STATE_DICT);
  ck_assert_msg(strstr(err.msg, "Missing key(s) in state_dict: \"embed.weight\"."), "%s", err.msg);
  grove_model_opts opts = {.non_strict = true};
  ck_assert_ok(grove_model_open(dir, &opts, &m, &err), &err);
  grove_tensor *e = grove_module_param(grove_module_find(m->root, "embed"), "weight");
  ck_assert_ptr_eq(grove_module_param(grove_module_find(m->root, "decode"), "weight"), e);
  ck_assert_int_eq(grove_test_allclose(e->data, dec->data, 30 * 12, 0, 0), -1);
  grove_model_free(m);
  grove_tensor_release(dec);
  grove_sd_free(sd);
  free(from);
  free(to);
  free(a);
  free(b);
  free(src);
  rm_rf(dir);
  free(dir);
}
END_TEST

/* A tree with ModuleDict/ModuleList inside has no forward as a whole: it
 * builds and loads (torch's state_dict order), its submodules run, and open
 * refuses it when the trial forward finds nothing to call. */
START_TEST(test_containers) {
  char *dir = fixture_dir("containers");
  char *spec_path = path2(dir, "model.json"), *weights = path2(dir, "weights.safetensors");
  char *io_path = path2(dir, "io.safetensors");
  char *text = grove_test_read_file(spec_path, NULL);
  ck_assert_ptr_nonnull(text);
  grove_err err = {0};
  grove_model *m = NULL;
  ck_assert_ok(grove_model_from_spec(text, spec_path, &m, &err), &err);
  ck_assert_str_eq(grove_module_find(m->root, "heads")->type->name, "ModuleDict");
  ck_assert_str_eq(grove_module_find(m->root, "blocks.2")->type->name, "ModuleList");
  grove_state_dict *sd = read_st(weights);
  grove_load_opts lo = {.strict = true};
  ck_assert_ok(grove_module_load_state_dict(m->root, sd, &lo, NULL, &err), &err);
  assert_keys_match_file(m->root, weights);
  grove_state_dict *io = read_st(io_path);
  grove_tensor *x = grove_sd_get(io, "x");
  grove_arena *arena = grove_arena_new(0);
  size_t checked = 0;
  for (size_t i = 0; i < grove_sd_count(io); i++) {
    const char *key = grove_sd_key(io, i);
    if (strncmp(key, "y:", 2) != 0) continue;
    grove_module *sub = grove_module_find(m->root, key + 2);
    ck_assert_msg(sub != NULL, "%s", key);
    grove_fwd f = {.arena = arena, .err = &err};
    grove_tensor y;
    ck_assert_ok(grove_module_call(sub, &f, x, &y), &err);
    assert_close_tensor(&y, grove_sd_tensor(io, i), key);
    grove_arena_reset(arena);
    checked++;
  }
  ck_assert_uint_eq(checked, 6);
  grove_arena_free(arena);
  grove_sd_free(io);
  grove_sd_free(sd);
  grove_model_free(m);

  m = (grove_model *)1;
  ck_assert_status(grove_model_open(dir, NULL, &m, &err), GROVE_E_NOT_CALLABLE);
  ck_assert_ptr_null(m);
  ck_assert_msg(strstr(err.msg, dir) && strstr(err.msg, "trial forward"), "%s", err.msg);
  free(text);
  free(io_path);
  free(weights);
  free(spec_path);
  free(dir);
}
END_TEST

/* ============================================================ open errors */

/* A scratch model directory with the mlp fixture's model.json. */
static char *mlp_copy(bool with_weights) {
  char *src = fixture_dir("mlp");
  char *dir = strdup(grove_test_tmpdir());
  char *a = path2(src, "model.json"), *b = path2(dir, "model.json");
  copy_file(a, b);
  free(a);
  free(b);
  if (with_weights) {
    a = path2(src, "weights.safetensors");
    b = path2(dir, "weights.safetensors");
    copy_file(a, b);
    free(a);
    free(b);
  }
  free(src);
  return dir;
}

static void write_text(const char *dir, const char *name, const char *squoted) {
  char *p = path2(dir, name), *t = J(squoted);
  ck_assert_int_eq(grove_test_write_file(p, t, strlen(t)), 0);
  free(p);
  free(t);
}

START_TEST(test_no_model_json) {
  char *dir = strdup(grove_test_tmpdir());
  grove_err err = {0};
  grove_model *m = (grove_model *)1;
  ck_assert_status(grove_model_open(dir, NULL, &m, &err), GROVE_E_NOT_FOUND);
  ck_assert_ptr_null(m);
  ck_assert_msg(strstr(err.msg, "model.json") && strstr(err.msg, dir), "%s", err.msg);
  rm_rf(dir);
  free(dir);
}
END_TEST

START_TEST(test_missing_weights) {
  char *dir = mlp_copy(false);
  grove_err err = {0};
  grove_model *m = (grove_model *)1;
  ck_assert_status(grove_model_open(dir, NULL, &m, &err), GROVE_E_NOT_FOUND);
  ck_assert_ptr_null(m);
  /* The fixture names weights.safetensors explicitly. */
  ck_assert_msg(strstr(err.msg, dir) && strstr(err.msg, "weights.safetensors") &&
                    strstr(err.msg, "does not exist"),
                "%s", err.msg);

  /* Without a "weights" key: every default name is tried and listed. */
  char *spec_path = path2(dir, "model.json");
  char *text = grove_test_read_file(spec_path, NULL);
  char *w = strstr(text, "\"weights\": \"weights.safetensors\",");
  ck_assert_ptr_nonnull(w);
  memset(w, ' ', strlen("\"weights\": \"weights.safetensors\","));
  ck_assert_int_eq(grove_test_write_file(spec_path, text, strlen(text)), 0);
  ck_assert_status(grove_model_open(dir, NULL, &m, &err), GROVE_E_NOT_FOUND);
  ck_assert_msg(
      strstr(err.msg, dir) && strstr(err.msg,
                                     "no weights file (tried weights.safetensors, weights.pt, "
                                     "weights.pth, weights.bin)"),
      "%s", err.msg);
  /* weights.pth is found when it is the only one (its reader says the rest). */
  char *pth = path2(dir, "weights.pth");
  char *src = fixture_dir("mlp");
  char *st = path2(src, "weights.safetensors");
  copy_file(st, pth);
  ck_assert_ok(grove_model_open(dir, NULL, &m, &err), &err); /* content decides the format */
  ck_assert_str_eq(m->weights_path, pth);
  grove_model_free(m);
  /* An explicit checkpoint wins; a missing one is NOT_FOUND. */
  grove_model_opts opts = {.weights = st};
  ck_assert_ok(grove_model_open(dir, &opts, &m, &err), &err);
  ck_assert_str_eq(m->weights_path, st);
  grove_model_free(m);
  opts.weights = "/nonexistent/w.safetensors";
  ck_assert_status(grove_model_open(dir, &opts, &m, &err), GROVE_E_NOT_FOUND);
  ck_assert_msg(strstr(err.msg, "/nonexistent/w.safetensors"), "%s", err.msg);
  free(src);
  free(st);
  free(pth);
  free(text);
  free(spec_path);
  rm_rf(dir);
  free(dir);
}
END_TEST

static void write_mlp_weights_without(const char *dir, const char *drop, const char *add) {
  char *src = fixture_dir("mlp");
  char *from = path2(src, "weights.safetensors"), *to = path2(dir, "weights.safetensors");
  grove_state_dict *sd = read_st(from);
  if (drop) ck_assert(grove_sd_remove(sd, drop));
  grove_err err = {0};
  if (add) {
    int64_t shape[1] = {3};
    grove_tensor *t = grove_tensor_new(GROVE_F32, 1, shape, &err);
    ck_assert_ok(grove_sd_set(sd, add, t, &err), &err);
    grove_tensor_release(t);
  }
  ck_assert_ok(grove_safetensors_write(to, sd, &err), &err);
  grove_sd_free(sd);
  free(from);
  free(to);
  free(src);
}

START_TEST(test_strict_failure_leaves_nothing) {
  char *dir = mlp_copy(false);
  write_mlp_weights_without(dir, "2.bias", NULL);
  grove_err err = {0};
  grove_model *m = (grove_model *)1;
  ck_assert_status(grove_model_open(dir, NULL, &m, &err), GROVE_E_STATE_DICT);
  ck_assert_ptr_null(m);
  ck_assert_msg(strstr(err.msg,
                       "weights.safetensors: Error(s) in loading state_dict for "
                       "Sequential:") &&
                    strstr(err.msg, "Missing key(s) in state_dict: \"2.bias\"."),
                "%s", err.msg);
  /* Non-strict: it opens, and the missing bias keeps its initial zeros. */
  grove_model_opts opts = {.non_strict = true};
  ck_assert_ok(grove_model_open(dir, &opts, &m, &err), &err);
  grove_tensor *b = grove_module_param(grove_module_find(m->root, "2"), "bias");
  for (int i = 0; i < 10; i++) ck_assert_float_eq(((float *)b->data)[i], 0.0f);
  grove_model_free(m);

  write_mlp_weights_without(dir, NULL, "3.extra");
  ck_assert_status(grove_model_open(dir, NULL, &m, &err), GROVE_E_STATE_DICT);
  ck_assert_msg(strstr(err.msg, "Unexpected key(s) in state_dict: \"3.extra\"."), "%s", err.msg);
  ck_assert_ok(grove_model_open(dir, &opts, &m, &err), &err);
  grove_model_free(m);
  rm_rf(dir);
  free(dir);
}
END_TEST

START_TEST(test_size_mismatch) {
  char *dir = mlp_copy(false);
  write_text(dir, "model.json",
             "{'format': 'grove.model/1', 'inputs': [{'name': 'x', 'dtype': 'float32', "
             "'shape': [-1, 64]}], 'module': {'type': 'Sequential', 'children': ["
             "{'type': 'Linear', 'in_features': 64, 'out_features': 32}, {'type': 'ReLU'},"
             "{'type': 'Linear', 'in_features': 32, 'out_features': 11}]}}");
  write_mlp_weights_without(dir, NULL, NULL);
  grove_err err = {0};
  grove_model *m = (grove_model *)1;
  ck_assert_status(grove_model_open(dir, NULL, &m, &err), GROVE_E_STATE_DICT);
  ck_assert_ptr_null(m);
  ck_assert_msg(strstr(err.msg, "size mismatch for 2.weight"), "%s", err.msg);
  /* Even non-strict: a shape mismatch is always an error. */
  grove_model_opts opts = {.non_strict = true};
  ck_assert_status(grove_model_open(dir, &opts, &m, &err), GROVE_E_STATE_DICT);
  rm_rf(dir);
  free(dir);
}
END_TEST

START_TEST(test_outputs_must_match) {
  char *dir = mlp_copy(true);
  write_text(dir, "model.json",
             "{'format': 'grove.model/1', 'inputs': [{'name': 'x', 'dtype': 'float32', "
             "'shape': [-1, 64]}], 'outputs': [{'name': 'logits', 'dtype': 'float32', "
             "'shape': [-1, 12]}], 'module': {'type': 'Sequential', 'children': ["
             "{'type': 'Linear', 'in_features': 64, 'out_features': 32}, {'type': 'ReLU'},"
             "{'type': 'Linear', 'in_features': 32, 'out_features': 10}]}}");
  grove_err err = {0};
  grove_model *m = (grove_model *)1;
  ck_assert_status(grove_model_open(dir, NULL, &m, &err), GROVE_E_SPEC);
  ck_assert_ptr_null(m);
  ck_assert_msg(strstr(err.msg,
                       "model.json: $.outputs[0]: output 'logits' is float32 [-1, 12] "
                       "in the spec, but the model produces float32 [2, 10]"),
                "%s", err.msg);
  rm_rf(dir);
  free(dir);
}
END_TEST

/* dir/model.json from spec (single-quoted JSON) and dir/weights.safetensors
 * from the tree's own state_dict, after fill (may be NULL: its zeros) sets
 * the values. */
static void write_model_dir(const char *dir, const char *spec, void (*fill)(grove_state_dict *)) {
  write_text(dir, "model.json", spec);
  char *text = J(spec);
  grove_err err = {0};
  grove_model *m = NULL;
  ck_assert_ok(grove_model_from_spec(text, "model.json", &m, &err), &err);
  grove_state_dict *sd = grove_sd_new();
  ck_assert_ok(grove_module_state_dict(m->root, NULL, sd, &err), &err);
  if (fill) fill(sd);
  char *w = path2(dir, "weights.safetensors");
  ck_assert_ok(grove_safetensors_write(w, sd, &err), &err);
  grove_sd_free(sd);
  grove_model_free(m);
  free(w);
  free(text);
}

START_TEST(test_architecture_that_does_not_run) {
  char *dir = strdup(grove_test_tmpdir());
  const char *spec =
      "{'format': 'grove.model/1', 'inputs': [{'name': 'x', 'dtype': 'float32', "
      "'shape': [-1, 64]}], 'module': {'type': 'Sequential', 'children': ["
      "{'type': 'Linear', 'in_features': 64, 'out_features': 32},"
      "{'type': 'Linear', 'in_features': 16, 'out_features': 10}]}}";
  /* Weights that fit the tree (its own zeros). */
  write_model_dir(dir, spec, NULL);
  grove_err err = {0};
  grove_model *m = (grove_model *)1;
  ck_assert_status(grove_model_open(dir, NULL, &m, &err), GROVE_E_SHAPE);
  ck_assert_ptr_null(m);
  ck_assert_msg(strstr(err.msg, dir) && strstr(err.msg, "trial forward on zero inputs (batch 2)"),
                "%s", err.msg);
  rm_rf(dir);
  free(dir);
}
END_TEST

/* The peak resident set of this process since the last clear_refs 5, in
 * bytes (VmHWM of /proc/self/status). */
static size_t peak_rss(void) {
  FILE *f = fopen("/proc/self/status", "r");
  ck_assert_ptr_nonnull(f);
  char line[256];
  size_t kb = 0;
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "VmHWM: %zu kB", &kb) == 1) break;
  fclose(f);
  ck_assert_uint_gt(kb, 0);
  return kb * 1024;
}

static void reset_peak_rss(void) {
  FILE *f = fopen("/proc/self/clear_refs", "w");
  ck_assert_msg(f != NULL, "cannot reset the peak RSS (/proc/self/clear_refs)");
  ck_assert_int_eq(fputs("5", f) >= 0, 1);
  fclose(f);
}

/* Weight and bias values of the Conv2d below that are not its zeros. */
static void conv_weights(grove_state_dict *sd) {
  grove_tensor *w = grove_sd_get(sd, "weight"), *b = grove_sd_get(sd, "bias");
  ck_assert_ptr_nonnull(w);
  ck_assert_ptr_nonnull(b);
  float *wd = w->data, *bd = b->data;
  for (int64_t i = 0; i < grove_tensor_numel(w); i++) wd[i] = (float)((i * 37 % 23) - 11) / 50.0f;
  for (int64_t i = 0; i < grove_tensor_numel(b); i++) bd[i] = (float)i / 10.0f - 0.7f;
}

/* Opening at max_batch_size 64 does not run a forward at 64: a Conv2d(3,
 * 16, 3) on 128 x 128 images produces 1 MB per image, 64 MB at batch 64,
 * and the open's peak memory stays under 24 MB above what it was before
 * (the trial forwards run at batch 2 and 4).  The scratch it records still
 * covers a batch of 64 (the arena never grows for it), and that batch
 * gives each image the result it gets alone. */
/* AddressSanitizer's redzones and its quarantine of freed blocks (which
 * keeps every trial's buffers resident) add to the peak: 51 MB measured
 * (make test SAN=1), still below the 64 MB one forward at 64 touches. */
#if defined(__SANITIZE_ADDRESS__)
#define OPEN_RSS_BOUND ((size_t)60 << 20)
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define OPEN_RSS_BOUND ((size_t)60 << 20)
#endif
#endif
#ifndef OPEN_RSS_BOUND
#define OPEN_RSS_BOUND ((size_t)24 << 20)
#endif

START_TEST(test_open_memory_bounded_by_small_trials) {
  char *dir = strdup(grove_test_tmpdir());
  const char *spec =
      "{'format': 'grove.model/1', 'inputs': [{'name': 'x', 'dtype': 'float32', "
      "'shape': [-1, 3, 128, 128]}], 'batching': {'max_batch_size': 64}, 'module': "
      "{'type': 'Conv2d', 'in_channels': 3, 'out_channels': 16, 'kernel_size': 3, "
      "'padding': 1}}";
  write_model_dir(dir, spec, conv_weights);
  grove_err err = {0};
  grove_model *m = NULL;

  const size_t image_out = (size_t)16 * 128 * 128 * sizeof(float);
  reset_peak_rss();
  const size_t before = peak_rss();
  ck_assert_ok(grove_model_open(dir, NULL, &m, &err), &err);
  const size_t grew = peak_rss() - before;
  ck_assert_msg(grew < OPEN_RSS_BOUND, "opening touched %zu bytes (a batch of 64 is %zu)", grew,
                64 * image_out);
  ck_assert_uint_ge(m->arena_bytes, 64 * image_out);
  ck_assert_uint_eq(m->noutputs, 1);
  ck_assert_int_eq(m->outputs[0].shape[0], -1);

  int64_t shape[4] = {64, 3, 128, 128};
  const size_t n = (size_t)64 * 3 * 128 * 128, per = n / 64;
  float *xd = malloc(n * sizeof *xd);
  ck_assert_ptr_nonnull(xd);
  for (size_t i = 0; i < n; i++) xd[i] = (float)((i * 7919) % 1000) / 500.0f - 1.0f;
  grove_tensor x;
  grove_tensor_init(&x, GROVE_F32, 4, shape, xd);
  grove_arena *arena = grove_arena_new(m->arena_bytes), *one = grove_arena_new(0);
  grove_values out = {0}, alone = {0};
  ck_assert_ok(grove_model_forward(m, arena, &x, 1, &out, &err), &err);
  ck_assert_uint_eq(grove_arena_grow_count(arena), 0);
  ck_assert_int_eq(out.n, 1);
  ck_assert_int_eq(out.v[0].shape[0], 64);
  const size_t oper = image_out / sizeof(float);
  for (int img = 0; img < 64; img += 63) {
    int64_t s1[4] = {1, 3, 128, 128};
    grove_tensor x1;
    grove_tensor_init(&x1, GROVE_F32, 4, s1, xd + (size_t)img * per);
    grove_arena_reset(one);
    ck_assert_ok(grove_model_forward(m, one, &x1, 1, &alone, &err), &err);
    ck_assert_int_eq(grove_test_allclose((const float *)out.v[0].data + (size_t)img * oper,
                                         alone.v[0].data, oper, 1e-5, 1e-6),
                     -1);
  }
  grove_arena_free(one);
  grove_arena_free(arena);
  free(xd);
  grove_model_free(m);
  rm_rf(dir);
  free(dir);
}
END_TEST

/* No parameters, no buffers: no weights file needed; outputs derived. */
START_TEST(test_stateless_model_and_derived_outputs) {
  char *dir = strdup(grove_test_tmpdir());
  write_text(dir, "model.json",
             "{'format': 'grove.model/1', 'inputs': [{'name': 'x', 'dtype': 'float32', "
             "'shape': [-1, -1, 5]}], 'batching': {'max_batch_size': 3}, "
             "'module': {'type': 'Sequential', 'children': [{'type': 'Flatten'}, {'type': "
             "'Softmax', 'dim': -1}]}}");
  grove_err err = {0};
  grove_model *m = NULL;
  ck_assert_ok(grove_model_open(dir, NULL, &m, &err), &err);
  ck_assert_ptr_null(m->weights_path);
  ck_assert_int_eq(m->param_count, 0);
  ck_assert_uint_eq(m->weight_bytes, 0);
  ck_assert_uint_gt(m->arena_bytes, 0);
  ck_assert_uint_eq(m->noutputs, 1);
  ck_assert_str_eq(m->outputs[0].name, "y");
  ck_assert_int_eq(m->outputs[0].dtype, GROVE_F32);
  ck_assert_int_eq(m->outputs[0].ndim, 2);
  ck_assert_int_eq(m->outputs[0].shape[0], -1);
  ck_assert_int_eq(m->outputs[0].shape[1], -1); /* follows the free dimension */
  grove_model_free(m);

  write_text(dir, "model.json",
             "{'format': 'grove.model/1', 'inputs': [{'name': 'x', 'dtype': 'float32', "
             "'shape': [-1, 2, 5]}], 'module': {'type': 'Flatten'}}");
  ck_assert_ok(grove_model_open(dir, NULL, &m, &err), &err);
  ck_assert_int_eq(m->outputs[0].ndim, 2);
  ck_assert_int_eq(m->outputs[0].shape[0], -1);
  ck_assert_int_eq(m->outputs[0].shape[1], 10);
  grove_model_free(m);
  rm_rf(dir);
  free(dir);
}
END_TEST

/* ============================================================ inputs */

/* model.json that is not JSON (a symlink to a secret, say): the message
 * gives the position, never the text near it. */
START_TEST(test_json_error_quotes_nothing) {
  grove_err err = {0};
  grove_model *m = NULL;
  ck_assert_status(grove_model_from_spec("TOKEN=hunter2\n", "model.json", &m, &err), GROVE_E_SPEC);
  ck_assert_msg(strstr(err.msg, "model.json: not valid JSON (line 1, column") &&
                    !strstr(err.msg, "TOKEN") && !strstr(err.msg, "hunter2"),
                "%s", err.msg);
  ck_assert_status(grove_model_from_spec("{\"format\": hunter2}", "model.json", &m, &err),
                   GROVE_E_SPEC);
  ck_assert_msg(!strstr(err.msg, "hunter2"), "%s", err.msg);
  ck_assert_ptr_null(m);
}
END_TEST

/* in_features of 2^40 fits 64 bits but not in memory: the message names the
 * JSON path of the layer and what could not be allocated, not just "out
 * of memory". */
START_TEST(test_huge_layer_names_its_path) {
  char *doc = with_module("{'type': 'Sequential', 'children': [" L4
                          ", {'type': 'Linear', 'in_features': "
                          "1099511627776, 'out_features': 4}]}");
  grove_err err = {0};
  grove_model *m = NULL;
  grove_status s = grove_model_from_spec(doc, "model.json", &m, &err);
  free(doc);
  ck_assert_ptr_null(m);
  ck_assert_msg(s == GROVE_E_NOMEM || s == GROVE_E_SPEC, "%s: %s", grove_status_name(s), err.msg);
  ck_assert_msg(strstr(err.msg, "$.module.children[1]") && strstr(err.msg, "Linear") &&
                    strstr(err.msg, "1099511627776"),
                "%s", err.msg);
  /* Sizes that overflow are refused as such, naming the path. */
  doc = with_module("{'type': 'Linear', 'in_features': 9223372036854775807, 'out_features': 4}");
  ck_assert_status(grove_model_from_spec(doc, "model.json", &m, &err), GROVE_E_SPEC);
  free(doc);
  ck_assert_msg(strstr(err.msg, "$.module") && strstr(err.msg, "too many"), "%s", err.msg);
}
END_TEST

/* 50,000 modules each a ref to the one before: a ref was looked up by a
 * linear scan of every module built so far, O(N^2); now hashed.  Asserts
 * that it builds and shares one module (no timing assertion). */
START_TEST(test_many_refs_build) {
  enum { N = 50000 };
  size_t cap = (size_t)N * 24 + 64, used = 0;
  char *mod = malloc(cap);
  ck_assert_ptr_nonnull(mod);
  used += (size_t)snprintf(mod + used, cap - used, "{'type': 'Sequential', 'children': [" L4);
  for (int i = 1; i < N; i++)
    used += (size_t)snprintf(mod + used, cap - used, ", {'ref': '%d'}", i - 1);
  snprintf(mod + used, cap - used, "]}");
  char *doc = with_module(mod);
  free(mod);
  grove_err err = {0};
  grove_model *m = NULL;
  ck_assert_ok(grove_model_from_spec(doc, "model.json", &m, &err), &err);
  free(doc);
  grove_module *root = m->root;
  ck_assert_ptr_eq(grove_module_find(root, "0"), grove_module_find(root, "49999"));
  grove_model_free(m);
}
END_TEST

START_TEST(test_check_inputs) {
  char *dir = fixture_dir("mlp");
  grove_err err = {0};
  grove_model *m = NULL;
  ck_assert_ok(grove_model_open(dir, NULL, &m, &err), &err);
  float buf[3 * 65] = {0};
  grove_tensor x;
  int64_t good[2] = {3, 64}, wide[2] = {3, 65}, flat[1] = {192}, deep[3] = {3, 64, 1};
  grove_tensor_init(&x, GROVE_F32, 2, good, buf);
  ck_assert_ok(grove_model_check_inputs(m, &x, 1, &err), &err);

  grove_tensor_init(&x, GROVE_F32, 2, wide, buf);
  ck_assert_status(grove_model_check_inputs(m, &x, 1, &err), GROVE_E_SHAPE);
  ck_assert_str_eq(err.msg, "input 'x': expected float32 [-1, 64], got float32 [3, 65]");

  grove_tensor_init(&x, GROVE_I64, 2, good, buf);
  ck_assert_status(grove_model_check_inputs(m, &x, 1, &err), GROVE_E_DTYPE);
  ck_assert_str_eq(err.msg, "input 'x': expected float32 [-1, 64], got int64 [3, 64]");

  grove_tensor_init(&x, GROVE_F32, 1, flat, buf);
  ck_assert_status(grove_model_check_inputs(m, &x, 1, &err), GROVE_E_SHAPE);
  ck_assert_str_eq(err.msg, "input 'x': expected float32 [-1, 64], got float32 [192]");

  grove_tensor_init(&x, GROVE_F32, 3, deep, buf);
  ck_assert_status(grove_model_check_inputs(m, &x, 1, &err), GROVE_E_SHAPE);

  grove_tensor two[2];
  grove_tensor_init(&two[0], GROVE_F32, 2, good, buf);
  grove_tensor_init(&two[1], GROVE_F32, 2, good, buf);
  ck_assert_status(grove_model_check_inputs(m, two, 2, &err), GROVE_E_INVALID_ARGUMENT);
  ck_assert_str_eq(err.msg, "expected 1 input(s) ('x'), got 2");
  ck_assert_status(grove_model_check_inputs(m, two, 0, &err), GROVE_E_INVALID_ARGUMENT);

  /* forward checks first and leaves the arena untouched on refusal. */
  grove_arena *arena = grove_arena_new(0);
  grove_values out = {0};
  grove_tensor_init(&x, GROVE_F32, 2, wide, buf);
  ck_assert_status(grove_model_forward(m, arena, &x, 1, &out, &err), GROVE_E_SHAPE);
  ck_assert_uint_eq(grove_arena_high_water(arena), 0);
  /* A zero-row batch is a batch. */
  int64_t none[2] = {0, 64};
  grove_tensor_init(&x, GROVE_F32, 2, none, buf);
  ck_assert_ok(grove_model_forward(m, arena, &x, 1, &out, &err), &err);
  ck_assert_int_eq(out.v[0].shape[0], 0);
  ck_assert_int_eq(out.v[0].shape[1], 10);
  grove_arena_free(arena);
  free(dir);
  grove_model_free(m);
}
END_TEST

/* The batch probe groved runs on every version (grove_model_probe_batching): dimension 0 is served as a
 * batch only when its rows are independent.  Softmax over dimension 0 mixes
 * the rows (a sequence-first layer's time); Flatten from dimension 0 makes
 * one row of all of them; Softmax over dimension 1 keeps them apart.  A
 * spec's own max_batch_size 0 stays 0. */
START_TEST(test_batch_probe) {
  static const struct {
    const char *module;
    int64_t want;
  } cases[] = {
      {"{'type': 'Softmax', 'dim': 0}", 0},
      {"{'type': 'Flatten', 'start_dim': 0}", 0},
      {"{'type': 'Softmax', 'dim': 1}", 64},
      {"{'type': 'Softmax', 'dim': -1}", 64},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char *dir = strdup(grove_test_tmpdir());
    char spec[512];
    snprintf(spec, sizeof spec,
             "{'format': 'grove.model/1', 'inputs': [{'name': 'x', 'dtype': 'float32', "
             "'shape': [-1, 3]}], 'module': %s}",
             cases[i].module);
    write_text(dir, "model.json", spec);
    grove_err err = {0};
    grove_model *m = NULL;
    ck_assert_ok(grove_model_open(dir, NULL, &m, &err), &err);
    ck_assert_int_eq(m->batching.max_batch_size, 64); /* open alone keeps the spec's */
    ck_assert_ok(grove_model_probe_batching(m, &err), &err);
    ck_assert_msg(m->batching.max_batch_size == cases[i].want, "%s: max_batch_size %lld",
                  cases[i].module, (long long)m->batching.max_batch_size);
    grove_model_free(m);
    rm_rf(dir);
    free(dir);
  }
  char *dir = strdup(grove_test_tmpdir());
  write_text(dir, "model.json",
             "{'format': 'grove.model/1', 'inputs': [{'name': 'x', 'dtype': 'float32', "
             "'shape': [-1, 3]}], 'batching': {'max_batch_size': 0}, "
             "'module': {'type': 'Softmax', 'dim': 1}}");
  grove_err err = {0};
  grove_model *m = NULL;
  ck_assert_ok(grove_model_open(dir, NULL, &m, &err), &err);
  ck_assert_ok(grove_model_probe_batching(m, &err), &err);
  ck_assert_int_eq(m->batching.max_batch_size, 0);
  grove_model_free(m);
  rm_rf(dir);
  free(dir);
}
END_TEST

Suite *spec_suite(void) {
  Suite *s = suite_create("spec");
  TCase *tc = tcase_create("spec");
  tcase_add_test(tc, test_nested_named);
  tcase_add_test(tc, test_built_for_load_packs_nothing);
  tcase_add_test(tc, test_ref_is_the_same_module);
  tcase_add_test(tc, test_tied_is_the_same_tensor);
  tcase_add_test(tc, test_io_batching_name_weights);
  tcase_add_test(tc, test_exact_message);
  tcase_add_loop_test(tc, test_bad_spec, 0, (int)(sizeof bad / sizeof bad[0]));
  tcase_add_test(tc, test_too_deep);
  tcase_add_test(tc, test_null_arguments);
  suite_add_tcase(s, tc);

  TCase *td = tcase_create("model_dir");
  tcase_add_loop_test(td, test_open_matches_torch, 0, (int)(sizeof served / sizeof served[0]));
  tcase_add_test(td, test_open_tied_stays_tied);
  tcase_add_test(td, test_tie_from_the_later_key);
  tcase_add_test(td, test_containers);
  tcase_add_test(td, test_no_model_json);
  tcase_add_test(td, test_missing_weights);
  tcase_add_test(td, test_strict_failure_leaves_nothing);
  tcase_add_test(td, test_size_mismatch);
  tcase_add_test(td, test_outputs_must_match);
  tcase_add_test(td, test_architecture_that_does_not_run);
  tcase_add_test(td, test_open_memory_bounded_by_small_trials);
  tcase_add_test(td, test_stateless_model_and_derived_outputs);
  tcase_add_test(td, test_check_inputs);
  tcase_add_test(td, test_json_error_quotes_nothing);
  tcase_add_test(td, test_huge_layer_names_its_path);
  tcase_add_test(td, test_many_refs_build);
  tcase_add_test(td, test_batch_probe);
  suite_add_tcase(s, td);
  return s;
}

GROVE_TEST_MAIN(spec_suite)
