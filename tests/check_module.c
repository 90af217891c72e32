/* check_module.c: the Module core against torch.nn.Module.
 *
 * tests/fixtures_gen/module.py describes a torch tree (nested containers, a
 * shared module, a tied parameter, None members, non-persistent buffers) and
 * records what torch does with it.  Here the same tree is rebuilt from
 * generic modules and every answer compared: state_dict order and metadata,
 * named_* traversals, apply order, load_state_dict reports and messages,
 * registration errors, hook order. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "testutil.h"

/* ------------------------------------------------------------ a generic tree */

/* One type per torch class name, so messages carry torch's names. */
static grove_module_type types[32];
static char type_names[32][64];
static size_t ntypes;

static grove_status identity_forward(const grove_module *m, grove_fwd *f, const grove_values *in,
                                     grove_values *out) {
  *out = *in;
  return GROVE_OK;
}

static const grove_module_type *type_for(const char *name) {
  for (size_t i = 0; i < ntypes; i++)
    if (strcmp(type_names[i], name) == 0) return &types[i];
  ck_assert_uint_lt(ntypes, 32);
  snprintf(type_names[ntypes], sizeof type_names[0], "%s", name);
  types[ntypes] = (grove_module_type){.name = type_names[ntypes], .forward = identity_forward};
  if (strcmp(name, "BatchNorm1d") == 0) types[ntypes].version = 2;
  return &types[ntypes++];
}

static json_t *fixture;

static void load_fixture(void) {
  json_error_t jerr;
  fixture = json_load_file(grove_fixture("module_tree.json"), 0, &jerr);
  ck_assert_msg(fixture != NULL, "module_tree.json: %s (run make fixtures)", jerr.text);
}

static void free_fixture(void) {
  json_decref(fixture);
  fixture = NULL;
}

static grove_tensor *shaped(json_t *shape, grove_dtype dt) {
  int64_t dims[GROVE_MAX_DIMS];
  int nd = (int)json_array_size(shape);
  for (int i = 0; i < nd; i++) dims[i] = json_integer_value(json_array_get(shape, (size_t)i));
  grove_err err = {0};
  grove_tensor *t = grove_tensor_new(dt, nd, dims, &err);
  ck_assert_msg(t != NULL, "%s", err.msg);
  return t;
}

/* Builds module `idx` of the description, sharing modules and tensors by id. */
static grove_module *build(json_t *mods, size_t idx, grove_module **built, grove_tensor **tensors) {
  if (built[idx]) {
    grove_module_retain(built[idx]);
    return built[idx];
  }
  json_t *d = json_array_get(mods, idx);
  grove_err err = {0};
  grove_module *m = grove_module_new(type_for(json_string_value(json_object_get(d, "type"))),
                                     NULL, &err);
  ck_assert_ptr_nonnull(m);
  built[idx] = m;
  size_t i;
  json_t *p;
  json_array_foreach(json_object_get(d, "params"), i, p) {
    json_t *tid = json_object_get(p, "tensor");
    grove_tensor *t = NULL;
    if (json_is_integer(tid)) {
      size_t k = (size_t)json_integer_value(tid);
      if (!tensors[k]) tensors[k] = shaped(json_object_get(p, "shape"), GROVE_F32);
      t = tensors[k];
    }
    ck_assert_ok(grove_module_register_parameter(m, json_string_value(json_object_get(p, "name")),
                                                 t, &err),
                 &err);
  }
  json_array_foreach(json_object_get(d, "buffers"), i, p) {
    json_t *tid = json_object_get(p, "tensor");
    grove_tensor *t = NULL;
    if (json_is_integer(tid)) {
      size_t k = (size_t)json_integer_value(tid);
      grove_dtype dt = GROVE_F32;
      ck_assert(grove_dtype_from_name(json_string_value(json_object_get(p, "dtype")), &dt));
      if (!tensors[k]) tensors[k] = shaped(json_object_get(p, "shape"), dt);
      t = tensors[k];
    }
    ck_assert_ok(grove_module_register_buffer(m, json_string_value(json_object_get(p, "name")), t,
                                              json_is_true(json_object_get(p, "persistent")), &err),
                 &err);
  }
  json_array_foreach(json_object_get(d, "children"), i, p) {
    json_t *cid = json_object_get(p, "module");
    grove_module *c = NULL;
    if (json_is_integer(cid)) c = build(mods, (size_t)json_integer_value(cid), built, tensors);
    ck_assert_ok(grove_module_add_module(m, json_string_value(json_object_get(p, "name")), c, &err),
                 &err);
    grove_module_release(c);
  }
  return m;
}

static grove_module *build_tree(void) {
  json_t *mods = json_object_get(fixture, "modules");
  size_t n = json_array_size(mods);
  grove_module **built = calloc(n, sizeof *built);
  grove_tensor **tensors = calloc(256, sizeof *tensors);
  grove_module *root = build(mods, 0, built, tensors);
  for (size_t i = 0; i < 256; i++) grove_tensor_release(tensors[i]);
  free(tensors);
  free(built);
  return root;
}

static void assert_names(json_t *expected, const char *const *got, size_t n, const char *what) {
  ck_assert_msg(json_array_size(expected) == n, "%s: %zu names, torch has %zu", what, n,
                json_array_size(expected));
  for (size_t i = 0; i < n; i++)
    ck_assert_msg(strcmp(json_string_value(json_array_get(expected, i)), got[i]) == 0,
                  "%s[%zu]: got '%s', torch has '%s'", what, i, got[i],
                  json_string_value(json_array_get(expected, i)));
}

static void assert_tensor_names(const char *key, const grove_named_tensors *l) {
  const char **names = calloc(l->n + 1, sizeof *names);
  for (size_t i = 0; i < l->n; i++) names[i] = l->items[i].name;
  assert_names(json_object_get(fixture, key), names, l->n, key);
  free(names);
}

static void assert_module_names(const char *key, const grove_named_modules *l) {
  const char **names = calloc(l->n + 1, sizeof *names);
  for (size_t i = 0; i < l->n; i++) names[i] = l->items[i].name;
  assert_names(json_object_get(fixture, key), names, l->n, key);
  free(names);
}

/* ------------------------------------------------------------ traversal */

START_TEST(test_state_dict_order) {
  grove_module *root = build_tree();
  grove_state_dict *sd = grove_sd_new();
  grove_err err = {0};
  ck_assert_ok(grove_module_state_dict(root, NULL, sd, &err), &err);
  const char **keys = calloc(grove_sd_count(sd) + 1, sizeof *keys);
  for (size_t i = 0; i < grove_sd_count(sd); i++) keys[i] = grove_sd_key(sd, i);
  assert_names(json_object_get(fixture, "state_dict_keys"), keys, grove_sd_count(sd),
               "state_dict");
  free(keys);
  /* The tied weight is one tensor under two keys. */
  ck_assert_ptr_eq(grove_sd_get(sd, "embed.weight"), grove_sd_get(sd, "out.weight"));
  /* _metadata: every module's prefix with its version. */
  json_t *meta = json_object_get(fixture, "state_dict_metadata");
  ck_assert_uint_eq(grove_sd_meta_count(sd), json_object_size(meta));
  const char *k;
  json_t *v;
  json_object_foreach(meta, k, v) {
    int version = 0;
    ck_assert_msg(grove_sd_get_version(sd, k, &version), "no metadata for '%s'", k);
    ck_assert_int_eq(version, json_integer_value(v));
  }
  grove_sd_free(sd);
  grove_module_release(root);
}
END_TEST

START_TEST(test_named_traversals) {
  grove_module *root = build_tree();
  grove_err err = {0};
  grove_named_tensors t = {0};
  ck_assert_ok(grove_module_named_parameters(root, "", true, true, &t, &err), &err);
  assert_tensor_names("named_parameters", &t);
  grove_named_tensors_fini(&t);
  ck_assert_ok(grove_module_named_parameters(root, "", true, false, &t, &err), &err);
  assert_tensor_names("named_parameters_all", &t);
  grove_named_tensors_fini(&t);
  ck_assert_ok(grove_module_named_buffers(root, "", true, true, &t, &err), &err);
  assert_tensor_names("named_buffers", &t);
  grove_named_tensors_fini(&t);
  grove_module *b0 = grove_module_find(root, "blocks.0");
  ck_assert_ptr_nonnull(b0);
  ck_assert_ok(grove_module_named_parameters(b0, "blocks.0", false, true, &t, &err), &err);
  assert_tensor_names("blocks0_named_parameters_norecurse", &t);
  grove_named_tensors_fini(&t);

  grove_named_modules m = {0};
  ck_assert_ok(grove_module_named_modules(root, "", true, &m, &err), &err);
  assert_module_names("named_modules", &m);
  grove_named_modules_fini(&m);
  ck_assert_ok(grove_module_named_modules(root, "", false, &m, &err), &err);
  assert_module_names("named_modules_all", &m);
  grove_named_modules_fini(&m);
  ck_assert_ok(grove_module_named_children(root, &m, &err), &err);
  assert_module_names("children", &m);
  grove_named_modules_fini(&m);
  ck_assert_int_eq(grove_module_param_count(root),
                   json_integer_value(json_object_get(fixture, "param_count")));
  grove_module_release(root);
}
END_TEST

typedef struct visits {
  const char *names[64];
  size_t n;
} visits;

static void record_type(grove_module *m, void *user) {
  visits *v = user;
  if (v->n < 64) v->names[v->n++] = m->type->name;
}

START_TEST(test_apply_and_train) {
  grove_module *root = build_tree();
  visits v = {0};
  grove_module_apply(root, record_type, &v);
  assert_names(json_object_get(fixture, "apply_types"), v.names, v.n, "apply");
  ck_assert(root->training);
  grove_module_eval(root);
  grove_named_modules m = {0};
  ck_assert_ok(grove_module_named_modules(root, "", true, &m, NULL), NULL);
  for (size_t i = 0; i < m.n; i++) ck_assert(!m.items[i].module->training);
  grove_module_train(root, true);
  for (size_t i = 0; i < m.n; i++) ck_assert(m.items[i].module->training);
  grove_named_modules_fini(&m);
  grove_module_release(root);
}
END_TEST

/* ------------------------------------------------------------ load_state_dict */

static grove_tensor *zeros(int nd, const int64_t *shape) {
  return grove_tensor_new(GROVE_F32, nd, shape, NULL);
}

static void add_zeros(grove_state_dict *sd, const char *key, int nd, const int64_t *shape) {
  grove_tensor *t = zeros(nd, shape);
  grove_sd_set(sd, key, t, NULL);
  grove_tensor_release(t);
}

/* The same edits tests/fixtures_gen/module.py makes to torch's state_dict. */
static void edit(grove_state_dict *sd, const char *name) {
  if (strcmp(name, "missing") == 0) {
    grove_sd_remove(sd, "blocks.1.fc.bias");
    grove_sd_remove(sd, "heads.a.weight");
  } else if (strcmp(name, "unexpected") == 0) {
    add_zeros(sd, "foo.bar", 1, (int64_t[]){1});
    add_zeros(sd, "blocks.0.extra", 1, (int64_t[]){2});
    add_zeros(sd, "heads.c.weight", 1, (int64_t[]){1});
  } else if (strcmp(name, "size_mismatch") == 0) {
    add_zeros(sd, "heads.a.bias", 1, (int64_t[]){3});
  } else if (strcmp(name, "all_three") == 0) {
    grove_sd_remove(sd, "embed.weight");
    add_zeros(sd, "zzz", 1, (int64_t[]){1});
    add_zeros(sd, "out.weight", 2, (int64_t[]){5, 4});
  } else if (strcmp(name, "no_num_batches_tracked") == 0) {
    grove_sd_remove(sd, "blocks.0.norm.num_batches_tracked");
  } else {
    ck_assert_str_eq(name, "exact");
  }
}

static void check_list(json_t *expected, char **got, size_t n, const char *what) {
  assert_names(expected, (const char *const *)got, n, what);
}

START_TEST(test_load_cases_match_torch) {
  json_t *cases = json_object_get(fixture, "load_cases");
  const char *name;
  json_t *c;
  json_object_foreach(cases, name, c) {
    for (int strict = 1; strict >= 0; strict--) {
      json_t *want = json_object_get(c, strict ? "strict" : "non_strict");
      grove_module *root = build_tree();
      grove_state_dict *sd = grove_sd_new();
      ck_assert_ok(grove_module_state_dict(root, "", sd, NULL), NULL);
      edit(sd, name);
      grove_load_opts opts = {.strict = strict};
      grove_load_report rep = {0};
      grove_err err = {0};
      grove_status s = grove_module_load_state_dict(root, sd, &opts, &rep, &err);
      if (json_is_true(json_object_get(want, "ok"))) {
        ck_assert_msg(s == GROVE_OK, "%s strict=%d: %s", name, strict, err.msg);
        check_list(json_object_get(want, "missing"), rep.missing, rep.n_missing, "missing");
        check_list(json_object_get(want, "unexpected"), rep.unexpected, rep.n_unexpected,
                   "unexpected");
      } else {
        ck_assert_msg(s == GROVE_E_STATE_DICT, "%s strict=%d: %s", name, strict,
                      grove_status_name(s));
        ck_assert_str_eq(err.msg, json_string_value(json_object_get(want, "message")));
        ck_assert_str_eq(rep.message, err.msg);
      }
      grove_load_report_fini(&rep);
      grove_sd_free(sd);
      grove_module_release(root);
    }
  }
}
END_TEST

START_TEST(test_load_all_or_nothing) {
  grove_module *root = build_tree();
  grove_tensor *w = grove_module_param(grove_module_find(root, "heads.a"), "weight");
  grove_state_dict *sd = grove_sd_new();
  ck_assert_ok(grove_module_state_dict(root, "", sd, NULL), NULL);
  /* A checkpoint whose heads.a.weight is all 7s, but with one bad shape
   * further on: nothing may be copied. */
  grove_tensor *sevens = grove_tensor_new(GROVE_F32, w->ndim, w->shape, NULL);
  for (int64_t i = 0; i < grove_tensor_numel(sevens); i++) ((float *)sevens->data)[i] = 7;
  grove_sd_set(sd, "heads.a.weight", sevens, NULL);
  add_zeros(sd, "out.weight", 2, (int64_t[]){1, 1});
  grove_err err = {0};
  ck_assert_status(grove_module_load_state_dict(root, sd, NULL, NULL, &err), GROVE_E_STATE_DICT);
  ck_assert_ptr_eq(grove_module_param(grove_module_find(root, "heads.a"), "weight"), w);
  ck_assert_float_eq(((float *)w->data)[0], 0.0f);
  /* Fixed, it loads, by copy (the module keeps its own tensor). */
  add_zeros(sd, "out.weight", 2, (int64_t[]){5, 3});
  ck_assert_ok(grove_module_load_state_dict(root, sd, NULL, NULL, &err), &err);
  ck_assert_ptr_eq(grove_module_param(grove_module_find(root, "heads.a"), "weight"), w);
  ck_assert_float_eq(((float *)w->data)[1], 7.0f);
  /* With assign, the module shares the checkpoint's tensor (zero-copy). */
  grove_load_opts assign = {.strict = true, .assign = true};
  ck_assert_ok(grove_module_load_state_dict(root, sd, &assign, NULL, &err), &err);
  ck_assert_ptr_eq(grove_module_param(grove_module_find(root, "heads.a"), "weight"), sevens);
  grove_tensor_release(sevens);
  grove_sd_free(sd);
  grove_module_release(root);
}
END_TEST

START_TEST(test_load_converts_dtypes) {
  grove_err err = {0};
  grove_module *m = grove_module_new(type_for("Linear"), NULL, &err);
  grove_tensor *w = zeros(1, (int64_t[]){3});
  grove_module_register_parameter(m, "weight", w, &err);
  const grove_dtype dts[] = {GROVE_F16, GROVE_BF16, GROVE_F64, GROVE_I64};
  for (size_t k = 0; k < 4; k++) {
    grove_tensor *src = grove_tensor_new(dts[k], 1, (int64_t[]){3}, &err);
    grove_tensor *f = grove_tensor_new(GROVE_F32, 1, (int64_t[]){3}, &err);
    float vals[3] = {1.5f, -2.25f, 1024.0f};
    if (dts[k] == GROVE_I64) vals[0] = 1, vals[1] = -2; /* integers convert exactly */
    memcpy(f->data, vals, sizeof vals);
    if (dts[k] == GROVE_I64) {
      for (int i = 0; i < 3; i++) ((int64_t *)src->data)[i] = (int64_t)vals[i];
    } else {
      ck_assert_ok(grove_tensor_copy(src, f, &err), &err);
    }
    grove_state_dict *sd = grove_sd_new();
    grove_sd_set(sd, "weight", src, NULL);
    grove_load_opts assign = {.strict = true, .assign = true};
    ck_assert_ok(grove_module_load_state_dict(m, sd, &assign, NULL, &err), &err);
    /* A dtype change is always a copy into the module's f32 tensor. */
    ck_assert_ptr_eq(grove_module_param(m, "weight"), w);
    for (int i = 0; i < 3; i++) ck_assert_float_eq(((float *)w->data)[i], vals[i]);
    grove_sd_free(sd);
    grove_tensor_release(src);
    grove_tensor_release(f);
  }
  /* Float into an integer buffer is refused, naming the key. */
  grove_tensor *nbt = grove_tensor_new(GROVE_I64, 0, NULL, &err);
  grove_module_register_buffer(m, "count", nbt, true, &err);
  grove_state_dict *sd = grove_sd_new();
  grove_sd_set(sd, "weight", w, NULL);
  grove_tensor *fl = grove_tensor_new(GROVE_F32, 0, NULL, &err);
  grove_sd_set(sd, "count", fl, NULL);
  ck_assert_status(grove_module_load_state_dict(m, sd, NULL, NULL, &err), GROVE_E_STATE_DICT);
  ck_assert_ptr_nonnull(strstr(err.msg, "\"count\""));
  grove_tensor_release(fl);
  grove_tensor_release(nbt);
  grove_sd_free(sd);
  grove_tensor_release(w);
  grove_module_release(m);
}
END_TEST

/* A pre-hook that renames an old key, and a post-hook that forgives one
 * missing key: torch's documented uses of the two. */
static grove_status rename_hook(void *user, grove_module *m, grove_state_dict *sd,
                                const char *prefix, bool strict, grove_err *err) {
  grove_tensor *old = grove_sd_get(sd, "w_old");
  if (old) {
    grove_tensor_retain(old);
    grove_sd_remove(sd, "w_old");
    grove_sd_set(sd, "weight", old, err);
    grove_tensor_release(old);
  }
  (*(int *)user)++;
  return GROVE_OK;
}

static void forgive_hook(void *user, grove_module *m, grove_load_report *r) {
  grove_load_report_remove(r, 0, "bias");
  (*(int *)user)++;
}

START_TEST(test_load_hooks) {
  grove_err err = {0};
  grove_module *m = grove_module_new(type_for("Linear"), NULL, &err);
  grove_tensor *w = zeros(1, (int64_t[]){2}), *b = zeros(1, (int64_t[]){2});
  grove_module_register_parameter(m, "weight", w, &err);
  grove_module_register_parameter(m, "bias", b, &err);
  int pre = 0, post = 0;
  uint64_t h1, h2;
  ck_assert_ok(grove_module_register_load_state_dict_pre_hook(m, rename_hook, &pre, &h1), &err);
  ck_assert_ok(grove_module_register_load_state_dict_post_hook(m, forgive_hook, &post, &h2), &err);
  grove_state_dict *sd = grove_sd_new();
  grove_tensor *ones = zeros(1, (int64_t[]){2});
  ((float *)ones->data)[0] = ((float *)ones->data)[1] = 1;
  grove_sd_set(sd, "w_old", ones, NULL);
  grove_load_report rep = {0};
  ck_assert_ok(grove_module_load_state_dict(m, sd, NULL, &rep, &err), &err);
  ck_assert_int_eq(pre, 1);
  ck_assert_int_eq(post, 1);
  ck_assert_uint_eq(rep.n_missing, 0);
  ck_assert_float_eq(((float *)w->data)[1], 1.0f);
  ck_assert(grove_sd_contains(sd, "w_old")); /* the caller's map is untouched */
  grove_load_report_fini(&rep);
  ck_assert(grove_module_remove_hook(m, h1));
  ck_assert(grove_module_remove_hook(m, h2));
  ck_assert(!grove_module_remove_hook(m, h2));
  ck_assert_status(grove_module_load_state_dict(m, sd, NULL, NULL, &err), GROVE_E_STATE_DICT);
  grove_sd_free(sd);
  grove_tensor_release(ones);
  grove_tensor_release(w);
  grove_tensor_release(b);
  grove_module_release(m);
}
END_TEST

static void sd_pre(void *user, const grove_module *m, const char *prefix) {
  (*(int *)user)++;
}

static grove_status sd_post(void *user, const grove_module *m, grove_state_dict *dest,
                            const char *prefix, grove_err *err) {
  grove_sd_remove(dest, "secret");
  return GROVE_OK;
}

START_TEST(test_state_dict_hooks) {
  grove_err err = {0};
  grove_module *m = grove_module_new(type_for("Linear"), NULL, &err);
  grove_tensor *w = zeros(1, (int64_t[]){2});
  grove_module_register_parameter(m, "weight", w, &err);
  grove_module_register_parameter(m, "secret", w, &err);
  int calls = 0;
  uint64_t id;
  grove_module_register_state_dict_pre_hook(m, sd_pre, &calls, &id);
  grove_module_register_state_dict_hook(m, sd_post, NULL, &id);
  grove_state_dict *sd = grove_sd_new();
  ck_assert_ok(grove_module_state_dict(m, "", sd, &err), &err);
  ck_assert_int_eq(calls, 1);
  ck_assert_uint_eq(grove_sd_count(sd), 1);
  ck_assert_str_eq(grove_sd_key(sd, 0), "weight");
  grove_sd_free(sd);
  grove_tensor_release(w);
  grove_module_release(m);
}
END_TEST

/* ------------------------------------------------------------ registration */

START_TEST(test_registration_errors_match_torch) {
  json_t *want = json_object_get(fixture, "registration_errors");
  grove_err err = {0};
  grove_module *m = grove_module_new(type_for("BatchNorm1d"), NULL, &err);
  grove_tensor *t = zeros(1, (int64_t[]){2});
  grove_module_register_parameter(m, "weight", t, &err);
  grove_module_register_parameter(m, "bias", t, &err);
  grove_module_register_buffer(m, "running_mean", t, true, &err);
  struct {
    const char *key;
    grove_status s;
  } probes[] = {
      {"param_dot", grove_module_register_parameter(m, "a.b", NULL, &err)},
  };
  ck_assert_status(probes[0].s, GROVE_E_KEY);
  ck_assert_str_eq(err.msg, json_string_value(json_object_get(want, "param_dot")));
#define PROBE(key, call)                                                        \
  do {                                                                          \
    ck_assert_status((call), GROVE_E_KEY);                                      \
    ck_assert_str_eq(err.msg, json_string_value(json_object_get(want, key)));   \
  } while (0)
  PROBE("param_empty", grove_module_register_parameter(m, "", NULL, &err));
  PROBE("param_taken_by_buffer", grove_module_register_parameter(m, "running_mean", NULL, &err));
  PROBE("param_training", grove_module_register_parameter(m, "training", NULL, &err));
  PROBE("buffer_dot", grove_module_register_buffer(m, "a.b", NULL, true, &err));
  PROBE("buffer_empty", grove_module_register_buffer(m, "", NULL, true, &err));
  PROBE("buffer_taken_by_param", grove_module_register_buffer(m, "weight", NULL, true, &err));
  PROBE("module_dot", grove_module_add_module(m, "a.b", NULL, &err));
  PROBE("module_empty", grove_module_add_module(m, "", NULL, &err));
  PROBE("module_taken_by_param", grove_module_add_module(m, "bias", NULL, &err));
#undef PROBE
  /* Re-registering a parameter replaces it in place, keeping the order. */
  ck_assert_ok(grove_module_register_parameter(m, "weight", NULL, &err), &err);
  ck_assert_str_eq(m->params[0].name, "weight");
  ck_assert_ptr_null(m->params[0].tensor);
  grove_tensor_release(t);
  grove_module_release(m);
}
END_TEST

/* ------------------------------------------------------------ forward hooks */

typedef struct trace {
  char calls[32];
  int n;
} trace;

typedef struct tagged {
  trace *t;
  char tag;
} tagged;

static grove_status pre_hook(void *user, const grove_module *m, grove_fwd *f, grove_values *in) {
  tagged *g = user;
  g->t->calls[g->t->n++] = g->tag;
  return GROVE_OK;
}

static grove_status post_hook(void *user, const grove_module *m, grove_fwd *f,
                              const grove_values *in, grove_values *out) {
  tagged *g = user;
  g->t->calls[g->t->n++] = g->tag;
  return GROVE_OK;
}

static void run_once(grove_module *m) {
  grove_arena *a = grove_arena_new(0);
  grove_fwd f = {.arena = a};
  float x = 1;
  grove_tensor in, out;
  grove_tensor_init(&in, GROVE_F32, 1, (int64_t[]){1}, &x);
  ck_assert_ok(grove_module_call(m, &f, &in, &out), NULL);
  grove_arena_free(a);
}

START_TEST(test_forward_hook_order_matches_torch) {
  trace t = {0};
  tagged A = {&t, 'A'}, B = {&t, 'B'}, C = {&t, 'C'}, D = {&t, 'D'}, G = {&t, 'G'}, H = {&t, 'H'};
  grove_module *m = grove_module_new(type_for("Identity"), NULL, NULL);
  bool prepend = json_is_true(json_object_get(fixture, "hook_prepend"));
  uint64_t ids[6];
  ck_assert_int_eq(atomic_load(&grove__forward_hook_count), 0);
  grove_module_register_forward_pre_hook(m, pre_hook, &A, false, &ids[0]);
  grove_module_register_forward_pre_hook(m, pre_hook, &B, prepend, &ids[1]);
  grove_register_global_forward_pre_hook(pre_hook, &G, &ids[2]);
  grove_module_register_forward_hook(m, post_hook, &C, false, &ids[3]);
  grove_module_register_forward_hook(m, post_hook, &D, prepend, &ids[4]);
  grove_register_global_forward_hook(post_hook, &H, &ids[5]);
  ck_assert_int_eq(atomic_load(&grove__forward_hook_count), 6);
  run_once(m);
  t.calls[t.n] = '\0';
  char want[16] = {0};
  size_t i;
  json_t *v;
  json_array_foreach(json_object_get(fixture, "hook_order"), i, v) want[i] = json_string_value(v)[0];
  ck_assert_str_eq(t.calls, want);
  ck_assert(grove_module_remove_hook(m, ids[0]));
  ck_assert(grove_module_remove_hook(m, ids[4]));
  t.n = 0;
  run_once(m);
  t.calls[t.n] = '\0';
  memset(want, 0, sizeof want);
  json_array_foreach(json_object_get(fixture, "hook_order_after_remove"), i, v) want[i] =
      json_string_value(v)[0];
  ck_assert_str_eq(t.calls, want);
  ck_assert(grove_remove_global_hook(ids[2]));
  ck_assert(grove_remove_global_hook(ids[5]));
  ck_assert(!grove_remove_global_hook(ids[5]));
  grove_module_release(m); /* frees its remaining hooks and their count */
  ck_assert_int_eq(atomic_load(&grove__forward_hook_count), 0);
}
END_TEST

START_TEST(test_prepend_puts_first) {
  /* torch >= 2.0's prepend (OrderedDict.move_to_end(id, last=False)); the
   * seeds give the order: g_pre, pre0(prepend), pre1, forward, g_post,
   * post0(prepend), post1. */
  trace t = {0};
  tagged P1 = {&t, '1'}, P0 = {&t, '0'}, G = {&t, 'g'}, Q1 = {&t, 'b'}, Q0 = {&t, 'a'},
         H = {&t, 'h'};
  grove_module *m = grove_module_new(type_for("Identity"), NULL, NULL);
  uint64_t id[6];
  grove_module_register_forward_pre_hook(m, pre_hook, &P1, false, &id[0]);
  grove_module_register_forward_pre_hook(m, pre_hook, &P0, true, &id[1]);
  grove_register_global_forward_pre_hook(pre_hook, &G, &id[2]);
  grove_module_register_forward_hook(m, post_hook, &Q1, false, &id[3]);
  grove_module_register_forward_hook(m, post_hook, &Q0, true, &id[4]);
  grove_register_global_forward_hook(post_hook, &H, &id[5]);
  run_once(m);
  t.calls[t.n] = '\0';
  ck_assert_str_eq(t.calls, "g01hab");
  grove_remove_global_hook(id[2]);
  grove_remove_global_hook(id[5]);
  grove_module_release(m);
  ck_assert_int_eq(atomic_load(&grove__forward_hook_count), 0);
}
END_TEST

static grove_status double_output(void *user, const grove_module *m, grove_fwd *f,
                                  const grove_values *in, grove_values *out) {
  grove_tensor y;
  grove_status s = grove_fwd_alloc(f, &y, GROVE_F32, out->v[0].ndim, out->v[0].shape);
  if (s) return s;
  for (int64_t i = 0; i < grove_tensor_numel(&y); i++)
    ((float *)y.data)[i] = 2 * ((float *)out->v[0].data)[i];
  out->v[0] = y;
  return GROVE_OK;
}

START_TEST(test_hook_replaces_output_and_not_callable) {
  grove_err err = {0};
  grove_module *m = grove_module_new(type_for("Identity"), NULL, &err);
  uint64_t id;
  grove_module_register_forward_hook(m, double_output, NULL, false, &id);
  grove_arena *a = grove_arena_new(0);
  grove_fwd f = {.arena = a, .err = &err};
  float x = 3;
  grove_tensor in, out;
  grove_tensor_init(&in, GROVE_F32, 1, (int64_t[]){1}, &x);
  ck_assert_ok(grove_module_call(m, &f, &in, &out), &err);
  ck_assert_float_eq(((float *)out.data)[0], 6.0f);
  ck_assert_float_eq(x, 3.0f);
  static const grove_module_type list_type = {.name = "ModuleList"};
  grove_module *l = grove_module_new(&list_type, NULL, &err);
  ck_assert_status(grove_module_call(l, &f, &in, &out), GROVE_E_NOT_CALLABLE);
  ck_assert_ptr_nonnull(strstr(err.msg, "ModuleList"));
  grove_module_release(l);
  grove_arena_free(a);
  grove_module_release(m);
}
END_TEST

Suite *module_suite(void) {
  Suite *s = suite_create("module");
  TCase *tc = tcase_create("torch parity");
  tcase_add_checked_fixture(tc, load_fixture, free_fixture);
  tcase_add_test(tc, test_state_dict_order);
  tcase_add_test(tc, test_named_traversals);
  tcase_add_test(tc, test_apply_and_train);
  tcase_add_test(tc, test_load_cases_match_torch);
  tcase_add_test(tc, test_load_all_or_nothing);
  tcase_add_test(tc, test_registration_errors_match_torch);
  tcase_add_test(tc, test_forward_hook_order_matches_torch);
  suite_add_tcase(s, tc);
  TCase *tc2 = tcase_create("behaviour");
  tcase_add_test(tc2, test_load_converts_dtypes);
  tcase_add_test(tc2, test_load_hooks);
  tcase_add_test(tc2, test_state_dict_hooks);
  tcase_add_test(tc2, test_prepend_puts_first);
  tcase_add_test(tc2, test_hook_replaces_output_and_not_callable);
  suite_add_tcase(s, tc2);
  return s;
}

GROVE_TEST_MAIN(module_suite)
