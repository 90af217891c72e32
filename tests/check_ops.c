/* check_ops.c: the one op table (core/nn/ops.h).  Walks every entry (a
 * forward, unique names and torch spellings, parameter lists that the
 * module and varargs refer into, module entries that build from model.json
 * through the registry and run the entry's forward), checks that
 * tools/grove_ops.json, which the exporter reads, is the table as it is
 * now, that an op's declared dtypes are enforced with a message naming
 * the op, the argument and the dtype, and that a layer's settings are read
 * back from the module its builder made (grove__layer_settings_of). */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "layers_internal.h"
#include "ops.h"
#include "testutil.h"

static int param_index(const grove__opdef *d, const char *name) {
  for (int i = 0; i < grove__op_nparams(d); i++)
    if (strcmp(d->p[i].name, name) == 0) return i;
  return -1;
}

START_TEST(test_entries) {
  int n;
  const grove__opdef *const *t = grove__ops(&n);
  ck_assert_int_gt(n, 20);
  for (int i = 0; i < n; i++) {
    const grove__opdef *d = t[i];
    ck_assert_msg(d->name && *d->name, "entry %d has no name", i);
    ck_assert_msg(d->forward != NULL, "%s has no forward", d->name);
    ck_assert_msg(grove__op_nparams(d) >= 1, "%s has no parameters", d->name);
    ck_assert_msg(d->varargs < grove__op_nparams(d), "%s: varargs out of range", d->name);
    for (int k = 0; k < grove__op_nparams(d); k++)
      ck_assert_msg(param_index(d, d->p[k].name) == k, "%s: parameter %s twice", d->name,
                    d->p[k].name);
    /* The graph finds it by name and alias, unless it is a module only. */
    if (!d->module_only) {
      ck_assert_ptr_eq(grove__op_find(d->name), d);
      if (d->alias) ck_assert_ptr_eq(grove__op_find(d->alias), d);
      ck_assert_msg(d->torch && d->torch[0], "%s has no torch spelling", d->name);
    } else {
      ck_assert_ptr_null(grove__op_find(d->name));
      ck_assert_msg(d->module, "%s is module_only without a module", d->name);
    }
    for (int j = 0; j < i; j++) {
      ck_assert_msg(strcmp(t[j]->name, d->name) != 0, "name %s twice", d->name);
      if (d->alias) ck_assert_msg(strcmp(t[j]->name, d->alias) != 0, "alias %s", d->alias);
    }
    /* Every spelling once in the whole table; a parameter list names only
     * parameters of the entry. */
    for (int k = 0; d->torch && d->torch[k]; k++) {
      const char *sp = d->torch[k];
      for (int j = 0; j <= i; j++)
        for (int l = 0; t[j]->torch && t[j]->torch[l]; l++)
          if (!(j == i && l == k)) {
            size_t a = strcspn(sp, "("), b = strcspn(t[j]->torch[l], "(");
            ck_assert_msg(a != b || strncmp(sp, t[j]->torch[l], a) != 0, "spelling %s twice", sp);
          }
      const char *p = strchr(sp, '(');
      if (!p) continue;
      char buf[256];
      snprintf(buf, sizeof buf, "%s", p + 1);
      buf[strcspn(buf, ")")] = '\0';
      for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
        const char *nm = tok[0] == '*' ? tok + 1 : tok;
        ck_assert_msg(param_index(d, nm) >= 0, "%s: spelling %s names no parameter %s", d->name,
                      sp, nm);
        if (tok[0] == '*') ck_assert_int_eq(param_index(d, nm), d->varargs);
      }
    }
    if (d->module) {
      for (const grove__opmod *md = d->module; md; md = md->next) {
        const grove__opmod *found = NULL;
        ck_assert_ptr_eq(grove__op_find_module(md->cls, &found), d);
        ck_assert_ptr_eq(found, md);
        ck_assert_str_eq(md->type->name, md->cls);
        ck_assert_msg(md->type->forward == grove__op_module_forward, "%s: its own forward",
                      md->cls);
        for (int k = 0; k < GROVE__OPMOD_MAX_ARGS && md->args[k].name; k++)
          ck_assert_msg(param_index(d, md->args[k].name) > 0,
                        "%s: constructor argument %s is "
                        "no parameter of %s",
                        md->cls, md->args[k].name, d->name);
      }
    }
  }
}
END_TEST

/* Every module entry builds from {"type": cls} through the layer registry,
 * with the op's module type, and runs on a float32 input. */
START_TEST(test_modules_build_and_run) {
  int n;
  const grove__opdef *const *t = grove__ops(&n);
  grove_arena *arena = grove_arena_new(1 << 20);
  ck_assert_ptr_nonnull(arena);
  int built = 0;
  for (int i = 0; i < n; i++)
    for (const grove__opmod *md = t[i]->module; md; md = md->next) {
      const grove__layer_def *ld = grove__layer_find(md->cls);
      ck_assert_msg(ld != NULL, "the registry lacks %s", md->cls);
      json_t *obj = json_pack("{ss}", "type", md->cls);
      grove_module *m = NULL;
      grove_err err = {0};
      /* A module with a required constructor argument (PixelShuffle's
       * upscale_factor, ConstantPad2d's padding) must say so when it is
       * missing, and Upsample with neither size nor scale_factor is refused as
       * F.interpolate is; their parity cases run them
       * (tests/fixtures_gen/zoo_ops.py). */
      bool required = false;
      for (int k = 0; k < GROVE__OPMOD_MAX_ARGS && md->args[k].name; k++)
        required |= md->args[k].dk == D_REQ;
      if (required || strcmp(md->cls, "Upsample") == 0) {
        ck_assert_status(ld->from_json(obj, "$.module", &m, &err), GROVE_E_SPEC);
        ck_assert_msg(strstr(grove_err_msg(&err), required ? "missing required argument"
                                                           : "either size or scale_factor"),
                      "%s", grove_err_msg(&err));
        json_decref(obj);
        continue;
      }
      ck_assert_ok(ld->from_json(obj, "$.module", &m, &err), &err);
      ck_assert_ptr_eq(m->type, md->type);
      grove_module_eval(m);
      float xs[6] = {-2, -1, 0, 0.5f, 1, 3};
      int64_t shape[2] = {3, 2}; /* an even last dim: GLU halves it */
      ;
      grove_tensor x;
      grove_tensor_init(&x, GROVE_F32, 2, shape, xs);
      /* A two-input module (CosineSimilarity(x1, x2)) gets x twice. */
      const int nin = md->inputs > 1 ? md->inputs : 1;
      grove_values in = {.n = nin}, out = {0};
      in.v[0] = in.v[1] = x;
      grove_fwd f = {.arena = arena, .err = &err};
      ck_assert_ok(grove_module_forward(m, &f, &in, &out), &err);
      ck_assert_int_eq(out.n, 1);
      ck_assert_int_eq(out.v[0].dtype, GROVE_F32);
      /* One input too many: the message every layer gives. */
      in.n = nin + 1;
      in.v[nin] = x;
      ck_assert_status(grove_module_forward(m, &f, &in, &out), GROVE_E_INVALID_ARGUMENT);
      char want[64];
      snprintf(want, sizeof want, "expected %d input tensor%s, got %d", nin, nin > 1 ? "s" : "",
               nin + 1);
      ck_assert_msg(strstr(grove_err_msg(&err), want), "%s", grove_err_msg(&err));
      grove_arena_reset(arena);
      grove_module_release(m);
      json_decref(obj);
      built++;
    }
  ck_assert_int_ge(built, 9);
  grove_arena_free(arena);
}
END_TEST

/* The module's constructor arguments are read by the entry's parameter
 * list: defaults, ranges and bound values land in the op's slots. */
START_TEST(test_module_arguments) {
  grove_err err = {0};
  grove_module *m = NULL;
  json_t *obj = json_pack("{ss si}", "type", "Softmax", "dim", -1);
  ck_assert_ok(grove__op_module_from_json(obj, "$.module", &m, &err), &err);
  const garg *dim = grove__op_module_arg(m, "dim");
  ck_assert_ptr_nonnull(dim);
  ck_assert_int_eq(dim->kind, A_INT);
  ck_assert_int_eq(dim->i, -1);
  grove_module_release(m);
  json_decref(obj);
  obj = json_pack("{ss}", "type", "Flatten");
  ck_assert_ok(grove__op_module_from_json(obj, "$.module", &m, &err), &err);
  ck_assert_int_eq(grove__op_module_arg(m, "start_dim")->i, 1); /* nn.Flatten's, not torch.flatten's */
  ck_assert_int_eq(grove__op_module_arg(m, "end_dim")->i, -1);
  grove_module_release(m);
  json_decref(obj);
  obj = json_pack("{ss sf}", "type", "Dropout", "p", 1.5);
  ck_assert_status(grove__op_module_from_json(obj, "$.module", &m, &err), GROVE_E_SPEC);
  ck_assert_msg(strstr(grove_err_msg(&err), "$.module.p"), "%s", grove_err_msg(&err));
  json_decref(obj);
}
END_TEST

/* The list-valued constructor arguments (Upsample's size and scale_factor,
 * the pads' padding): read as torch keeps them, copied into the module,
 * and refused with the key named when they are not numbers, out of range,
 * or what F.interpolate / F.pad refuse. */
static grove_status from_text(const char *text, grove_module **m, grove_err *err) {
  json_error_t je;
  json_t *obj = json_loads(text, 0, &je);
  ck_assert_msg(obj != NULL, "%s", je.text);
  grove_status s = grove__op_module_from_json(obj, "$.module", m, err);
  json_decref(obj);
  return s;
}

START_TEST(test_module_list_arguments) {
  grove_err err = {0};
  grove_module *m = NULL;
  ck_assert_ok(from_text("{\"type\": \"Upsample\", \"size\": null, \"scale_factor\": [2.0, 3.0], "
                         "\"mode\": \"bilinear\", \"align_corners\": true, "
                         "\"recompute_scale_factor\": null}",
                         &m, &err),
               &err);
  ck_assert_str_eq(m->type->name, "Upsample");
  const garg *sf = grove__op_module_arg(m, "scale_factor");
  ck_assert_int_eq(sf->kind, A_LIST);
  ck_assert_int_eq(sf->n, 2);
  ck_assert(sf->items[0].f == 2.0 && sf->items[1].f == 3.0);
  ck_assert_int_eq(grove__op_module_arg(m, "size")->kind, A_NONE);
  ck_assert_int_eq(grove__op_module_arg(m, "align_corners")->kind, A_BOOL);
  ck_assert_int_eq(grove__op_module_arg(m, "recompute_scale_factor")->kind, A_NONE);
  /* Runs: [1, 1, 2, 2] -> [1, 1, 4, 6], corners kept (align_corners). */
  grove_arena *arena = grove_arena_new(1 << 16);
  float xs[4] = {0, 1, 2, 3};
  int64_t shape[4] = {1, 1, 2, 2};
  grove_values in = {.n = 1}, out = {0};
  grove_tensor_init(&in.v[0], GROVE_F32, 4, shape, xs);
  grove_fwd f = {.arena = arena, .err = &err};
  grove_module_eval(m);
  ck_assert_ok(grove_module_forward(m, &f, &in, &out), &err);
  ck_assert_int_eq(out.v[0].shape[2], 4);
  ck_assert_int_eq(out.v[0].shape[3], 6);
  const float *y = out.v[0].data;
  ck_assert(y[0] == 0 && y[5] == 1 && y[18] == 2 && y[23] == 3);
  grove_module_release(m);
  grove_arena_free(arena);

  ck_assert_ok(from_text("{\"type\": \"ZeroPad2d\", \"padding\": [1, 2, 0, -1]}", &m, &err), &err);
  const garg *pad = grove__op_module_arg(m, "pad");
  ck_assert_int_eq(pad->kind, A_LIST);
  ck_assert_int_eq(pad->n, 4);
  ck_assert_int_eq(pad->items[3].i, -1);
  grove_module_release(m);

  static const struct {
    const char *json, *msg;
  } bad[] = {
      {"{\"type\": \"ConstantPad2d\", \"padding\": [1, 1.5, 0, 0], \"value\": 0}",
       "$.module.padding: expected integers"},
      {"{\"type\": \"ConstantPad2d\", \"padding\": 2, \"value\": 0}", "as a list"},
      {"{\"type\": \"ConstantPad1d\", \"padding\": [1, 1]}",
       "$.module.value: missing required argument of ConstantPad1d"},
      {"{\"type\": \"Upsample\", \"scale_factor\": [2, -1]}", "$.module.scale_factor: expected"},
      {"{\"type\": \"Upsample\", \"size\": [4, 4], \"scale_factor\": 2}",
       "only one of size or scale_factor"},
      {"{\"type\": \"Upsample\", \"scale_factor\": 2, \"align_corners\": false}",
       "align_corners option can only be set with the interpolating modes"},
      {"{\"type\": \"Upsample\", \"size\": 4, \"mode\": \"trilinear\"}",
       "$.module.mode: expected one of"},
      /* ReflectionPad2d's class fixes its mode. */
      {"{\"type\": \"ReflectionPad2d\", \"padding\": [1, 1, 1, 1], \"mode\": \"constant\"}",
       "$.module.mode: expected one of"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    m = NULL;
    ck_assert_status(from_text(bad[i].json, &m, &err), GROVE_E_SPEC);
    ck_assert_msg(strstr(grove_err_msg(&err), bad[i].msg), "%s: %s", bad[i].json,
                  grove_err_msg(&err));
    ck_assert_ptr_null(m);
  }
}
END_TEST

/* ReflectionPad*d and ReplicationPad*d run F.pad in their mode, and what
 * torch refuses at run time is refused naming the mode, the padding and the
 * input: a reflection as wide as its dimension, an input of the wrong rank,
 * an empty dimension.  Unflatten and PixelUnshuffle refuse sizes that do not
 * fit. */
static grove_status run_pad(const char *json, int nd, const int64_t *shape, const float *x,
                            grove_values *out, grove_arena *arena, grove_err *err) {
  grove_module *m = NULL;
  grove_status s = from_text(json, &m, err);
  if (s) return s;
  grove_values in = {.n = 1};
  grove_tensor_init(&in.v[0], GROVE_F32, nd, shape, (void *)x);
  grove_fwd f = {.arena = arena, .err = err};
  grove_module_eval(m);
  s = grove_module_forward(m, &f, &in, out);
  grove_module_release(m);
  return s;
}

START_TEST(test_edge_pads) {
  grove_err err = {0};
  grove_arena *arena = grove_arena_new(1 << 16);
  const float x[4] = {1, 2, 3, 4};
  const int64_t s13[3] = {1, 1, 4}, s22[4] = {1, 1, 2, 2}, s10[3] = {1, 1, 0};
  grove_values out = {0};
  /* [1 2 3 4] reflect (2, 1) -> [3 2 1 2 3 4 3]; replicate (1, 2) -> [1 1 2 3 4 4 4]. */
  ck_assert_ok(
      run_pad("{\"type\": \"ReflectionPad1d\", \"padding\": [2, 1]}", 3, s13, x, &out, arena, &err),
      &err);
  const float want_r[7] = {3, 2, 1, 2, 3, 4, 3};
  ck_assert_int_eq(out.v[0].shape[2], 7);
  ck_assert_mem_eq(out.v[0].data, want_r, sizeof want_r);
  ck_assert_ok(run_pad("{\"type\": \"ReplicationPad1d\", \"padding\": [1, 2]}", 3, s13, x, &out,
                       arena, &err),
               &err);
  const float want_p[7] = {1, 1, 2, 3, 4, 4, 4};
  ck_assert_mem_eq(out.v[0].data, want_p, sizeof want_p);
  const struct {
    const char *json;
    int nd;
    const int64_t *shape;
    const char *msg;
  } bad[] = {
      {"{\"type\": \"ReflectionPad1d\", \"padding\": [4, 0]}", 3, s13,
       "less than the dimension's size"},
      {"{\"type\": \"ReflectionPad2d\", \"padding\": [1, 1, 0, 2]}", 4, s22,
       "padding (0, 2) of dimension 2 of input [1, 1, 2, 2]"},
      {"{\"type\": \"ReplicationPad3d\", \"padding\": [1, 1, 1, 1, 1, 1]}", 3, s13,
       "got 6 padding numbers for an input [1, 1, 4]"},
      {"{\"type\": \"ReplicationPad1d\", \"padding\": [1, 1]}", 3, s10, "the dimension is empty"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    ck_assert_status(run_pad(bad[i].json, bad[i].nd, bad[i].shape, x, &out, arena, &err),
                     GROVE_E_SHAPE);
    ck_assert_msg(strstr(grove_err_msg(&err), bad[i].msg), "%s: %s", bad[i].json,
                  grove_err_msg(&err));
    ck_assert_msg(strstr(grove_err_msg(&err), "pad: mode"), "%s", grove_err_msg(&err));
  }
  const int64_t s6[2] = {1, 4};
  ck_assert_status(run_pad("{\"type\": \"Unflatten\", \"dim\": 1, \"unflattened_size\": [3, -1]}",
                           2, s6, x, &out, arena, &err),
                   GROVE_E_SHAPE);
  ck_assert_ptr_nonnull(strstr(grove_err_msg(&err),
                               "sizes [3, -1] don't multiply up to the size "
                               "of dim 1 (4)"));
  ck_assert_ok(run_pad("{\"type\": \"Unflatten\", \"dim\": -1, \"unflattened_size\": [2, -1]}", 2,
                       s6, x, &out, arena, &err),
               &err);
  ck_assert_int_eq(out.v[0].ndim, 3);
  ck_assert_int_eq(out.v[0].shape[2], 2);
  ck_assert_status(run_pad("{\"type\": \"PixelUnshuffle\", \"downscale_factor\": 3}", 4, s22, x,
                           &out, arena, &err),
                   GROVE_E_SHAPE);
  ck_assert_ptr_nonnull(strstr(grove_err_msg(&err), "pixel_unshuffle: expected an input"));
  grove_arena_free(arena);
}
END_TEST

/* tools/grove_ops.json is the table as it is (the exporter reads it). */
START_TEST(test_generated_file_matches) {
  const char *path = getenv("GROVE_OPS_JSON") ? getenv("GROVE_OPS_JSON") : "tools/grove_ops.json";
  json_error_t je;
  json_t *file = json_load_file(path, 0, &je);
  ck_assert_msg(file != NULL, "%s: %s", path, je.text);
  json_t *now = grove__ops_json();
  ck_assert_msg(json_equal(file, now), "%s is stale: run make ops-json", path);
  json_decref(file);
  json_decref(now);
}
END_TEST

/* An op that declares the dtypes of a tensor parameter: the accessor names
 * the op, the argument and the dtype it got. */
static grove_status probe_fwd(const grove__opctx *c, gval *res) {
  const grove_tensor *x;
  grove_status s = grove__op_tensor(c, 0, &x);
  if (s) return s;
  grove__op_set_int(res, x->ndim);
  return GROVE_OK;
}

START_TEST(test_declared_dtypes) {
  const grove__opdef probe = {
      .name = "probe",
      .id = G_OP,
      .varargs = -1,
      .p = {{.name = "mask", .kind = P_TENSOR, .dk = D_REQ,
             .dtypes = (1u << GROVE_BOOL) | (1u << GROVE_I64)}},
      .forward = probe_fwd,
  };
  int64_t shape[1] = {2};
  float xs[2] = {0, 1};
  gval v = {0};
  grove_tensor x;
  grove_tensor_init(&x, GROVE_F32, 1, shape, xs);
  grove__op_set_tensor(&v, &x);
  const garg a = {.kind = A_NODE, .node = 0};
  grove_err err = {0};
  grove_fwd f = {.err = &err};
  const grove__opctx c = {&f, &probe, &a, &v, NULL, 0};
  gval res = {0};
  ck_assert_status(probe.forward(&c, &res), GROVE_E_DTYPE);
  ck_assert_str_eq(grove_err_msg(&err),
                   "probe: argument \"mask\" must be a tensor of dtype int64 or bool, got float32");
  int64_t ids[2] = {3, 4};
  grove_tensor_init(&x, GROVE_I64, 1, shape, ids);
  grove__op_set_tensor(&v, &x);
  ck_assert_ok(probe.forward(&c, &res), &err);
  ck_assert_int_eq(res.kind, V_INT);
  ck_assert_int_eq(res.i, 1);
}
END_TEST

/* A layer's settings come from the module its builder made (the training
 * replica reads them there, never from model.json again): every value the
 * JSON gave, and the builders' defaults where it gave none. */
static grove_module *build(const char *json) {
  json_error_t je;
  json_t *obj = json_loads(json, 0, &je);
  ck_assert_msg(obj != NULL, "%s", je.text);
  const grove__layer_def *ld = grove__layer_find(json_string_value(json_object_get(obj, "type")));
  ck_assert_ptr_nonnull(ld);
  grove_module *m = NULL;
  grove_err err = {0};
  ck_assert_ok(ld->from_json(obj, "$.module", &m, &err), &err);
  json_decref(obj);
  return m;
}

START_TEST(test_layer_settings) {
  grove__layer_settings s;
  grove_module *m = build("{\"type\": \"LeakyReLU\", \"negative_slope\": 0.25}");
  ck_assert(grove__layer_settings_of(m, &s));
  ck_assert(s.slope == 0.25);
  grove_module_release(m);
  m = build("{\"type\": \"GELU\", \"approximate\": \"tanh\"}");
  ck_assert(grove__layer_settings_of(m, &s) && s.tanh_approx);
  grove_module_release(m);
  m = build("{\"type\": \"LogSoftmax\", \"dim\": -2}");
  ck_assert(grove__layer_settings_of(m, &s) && s.has_dim && s.dim == -2);
  grove_module_release(m);
  m = build("{\"type\": \"Dropout\", \"p\": 0.3}");
  ck_assert(grove__layer_settings_of(m, &s) && s.p == 0.3);
  grove_module_release(m);
  m = build("{\"type\": \"Flatten\", \"end_dim\": 2}");
  ck_assert(grove__layer_settings_of(m, &s) && s.start_dim == 1 && s.end_dim == 2);
  grove_module_release(m);
  m = build("{\"type\": \"Conv1d\", \"in_channels\": 4, \"out_channels\": 6, "
            "\"kernel_size\": 3, \"groups\": 2, \"padding\": \"same\", \"dilation\": 2}");
  ck_assert(grove__layer_settings_of(m, &s));
  ck_assert_int_eq(s.conv_dims, 1);
  ck_assert_int_eq(s.in_channels, 4);
  ck_assert_int_eq(s.out_channels, 6);
  ck_assert_int_eq(s.groups, 2);
  ck_assert_int_eq(s.kernel[0], 1);
  ck_assert_int_eq(s.kernel[1], 3);
  ck_assert_int_eq(s.dilation[1], 2);
  ck_assert_int_eq(s.pad_lo[1], 2);
  ck_assert_int_eq(s.pad_hi[1], 2);
  grove_module_release(m);
  m = build("{\"type\": \"BatchNorm2d\", \"num_features\": 3, \"eps\": 0.001, "
            "\"momentum\": null, \"affine\": false}");
  ck_assert(grove__layer_settings_of(m, &s));
  ck_assert(s.eps == 0.001 && isnan(s.momentum) && !s.affine && s.track && s.conv_dims == 2);
  grove_module_release(m);
  m = build("{\"type\": \"LayerNorm\", \"normalized_shape\": [2, 5], "
            "\"elementwise_affine\": false}");
  ck_assert(grove__layer_settings_of(m, &s));
  ck_assert(s.ln_ndim == 2 && s.ln_shape[0] == 2 && s.ln_shape[1] == 5 && !s.affine);
  grove_module_release(m);
  m = build("{\"type\": \"Embedding\", \"num_embeddings\": 5, \"embedding_dim\": 2, "
            "\"padding_idx\": -1, \"scale_grad_by_freq\": true}");
  ck_assert(grove__layer_settings_of(m, &s));
  ck_assert(s.padding_idx == 4 && s.scale_grad_by_freq && !s.sparse);
  grove_module_release(m);
  m = build("{\"type\": \"AvgPool2d\", \"kernel_size\": [2, 3], \"padding\": 1, "
            "\"ceil_mode\": true, \"count_include_pad\": false, \"divisor_override\": 5}");
  ck_assert(grove__layer_settings_of(m, &s));
  ck_assert(s.kernel[0] == 2 && s.kernel[1] == 3 && s.stride[0] == 2 && s.stride[1] == 3);
  ck_assert(s.pad_lo[0] == 1 && s.pad_hi[1] == 1 && s.ceil_mode && !s.count_include_pad);
  ck_assert(s.divisor_override == 5);
  grove_module_release(m);
  m = build("{\"type\": \"TransformerEncoderLayer\", \"d_model\": 8, \"nhead\": 2, "
            "\"dim_feedforward\": 16, \"dropout\": 0.2, \"activation\": \"gelu\", "
            "\"layer_norm_eps\": 0.0001, \"batch_first\": true, \"norm_first\": true}");
  ck_assert(grove__layer_settings_of(m, &s));
  ck_assert(s.embed_dim == 8 && s.num_heads == 2 && s.dim_feedforward == 16 && s.p == 0.2);
  ck_assert(s.gelu_ff && s.ln_eps == 0.0001 && s.batch_first && s.norm_first);
  grove_module_release(m);
  m = build("{\"type\": \"Linear\", \"in_features\": 2, \"out_features\": 3}");
  ck_assert(!grove__layer_settings_of(m, &s)); /* nothing to read */
  grove_module_release(m);
}
END_TEST

static Suite *ops_suite(void) {
  Suite *s = suite_create("ops");
  TCase *tc = tcase_create("table");
  tcase_add_test(tc, test_entries);
  tcase_add_test(tc, test_modules_build_and_run);
  tcase_add_test(tc, test_module_arguments);
  tcase_add_test(tc, test_module_list_arguments);
  tcase_add_test(tc, test_edge_pads);
  tcase_add_test(tc, test_generated_file_matches);
  tcase_add_test(tc, test_declared_dtypes);
  tcase_add_test(tc, test_layer_settings);
  suite_add_tcase(s, tc);
  return s;
}

GROVE_TEST_MAIN(ops_suite)
