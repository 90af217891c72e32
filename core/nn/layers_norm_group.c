/* layers_norm_group.c: the torch.nn modules with parameters whose
 * functional forms are op-table entries (ops_resample.c, ops_pointwise.c):
 * PReLU, GroupNorm, InstanceNorm1d / InstanceNorm2d.  Each forward passes
 * its parameters and buffers to the same kernel as the function
 * (tensor_ops.h: grove__op_prelu, grove__op_group_norm,
 * grove__op_instance_norm), so a module and F.<fn> never differ.  The
 * parameters are read at every forward (no derived copies: the kernels take
 * them as they are); state_dict slots and their order are torch's. */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>

#include "layers_internal.h"
#include "tensor_ops.h"

typedef struct gn_impl {
  int64_t groups, channels;
  double eps;
  bool instance;          /* InstanceNorm: groups == channels */
  bool track_running_stats; /* InstanceNorm: normalise by the running statistics */
  int min_nd, max_nd;     /* accepted input ranks */
} gn_impl;

static grove_status one_input(const char *T, grove_fwd *f, const grove_values *in,
                              const grove_tensor **x) {
  if (in->n != 1)
    return grove_err_set(f->err, GROVE_E_INVALID_ARGUMENT, "%s: expected 1 input tensor, got %d",
                         T, in->n);
  *x = &in->v[0];
  return GROVE_OK;
}

static grove_status gn_forward(const grove_module *m, grove_fwd *f, const grove_values *in,
                               grove_values *out) {
  const gn_impl *p = m->impl;
  const char *T = m->type->name;
  const grove_tensor *x = NULL;
  grove_status s = one_input(T, f, in, &x);
  if (s) return s;
  if (x->ndim < p->min_nd || x->ndim > p->max_nd || x->shape[1] != p->channels) {
    char want[64];
    snprintf(want, sizeof want, "a %d-d to %d-d input with %lld channels (dim 1)", p->min_nd,
             p->max_nd, (long long)p->channels);
    return grove__shape_error(f, T, want, x);
  }
  const grove_tensor *w = grove_module_param(m, "weight"), *b = grove_module_param(m, "bias");
  if (p->instance) {
    s = grove__op_instance_norm(f, x, grove_module_buffer(m, "running_mean"),
                                grove_module_buffer(m, "running_var"), w, b,
                                !p->track_running_stats, p->eps, &out->v[0]);
  } else {
    s = grove__op_group_norm(f, x, p->groups, w, b, p->eps, &out->v[0]);
  }
  if (s) return grove_err_prefix(f->err, "%s", T);
  out->n = 1;
  return GROVE_OK;
}

const grove_module_type grove__group_norm_type = {.name = "GroupNorm", .forward = gn_forward};
const grove_module_type grove__instance_norm1d_type = {.name = "InstanceNorm1d",
                                                       .forward = gn_forward};
const grove_module_type grove__instance_norm2d_type = {.name = "InstanceNorm2d",
                                                       .forward = gn_forward};

static grove_status gn_make(const grove_module_type *type, gn_impl *p, bool affine,
                            bool running, grove_module **out, grove_err *err) {
  grove_module *m = grove_module_new(type, p, err);
  if (!m) return err && err->code != GROVE_OK ? err->code : GROVE_E_NOMEM;
  const int64_t C = p->channels;
  /* torch's slots: weight, bias (None without affine); InstanceNorm's
   * running_mean, running_var, num_batches_tracked (None without
   * track_running_stats). */
  grove_status s = grove__norm_affine(m, 1, &C, affine, err);
  if (!s && p->instance) s = grove__norm_running(m, C, running, err);
  if (s) {
    grove_module_release(m);
    return s;
  }
  *out = m;
  return GROVE_OK;
}

static grove_status check_eps(const char *T, double eps, grove_err *err) {
  if (!(eps >= 0.0) || isinf(eps))
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT,
                         "%s: eps must be a finite non-negative number, got %g", T, eps);
  return GROVE_OK;
}

grove_status grove_group_norm_new(int64_t num_groups, int64_t num_channels, double eps,
                                  bool affine, grove_module **out, grove_err *err) {
  *out = NULL;
  if (num_groups <= 0 || num_channels <= 0 || num_channels % num_groups)
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT,
                         "GroupNorm: num_channels (%lld) must be divisible by num_groups (%lld)",
                         (long long)num_channels, (long long)num_groups);
  grove_status s = check_eps("GroupNorm", eps, err);
  if (s) return s;
  gn_impl *p = calloc(1, sizeof *p);
  if (!p) return grove_err_set(err, GROVE_E_NOMEM, "GroupNorm: out of memory");
  *p = (gn_impl){.groups = num_groups, .channels = num_channels, .eps = eps, .min_nd = 2,
                 .max_nd = GROVE_MAX_DIMS};
  return gn_make(&grove__group_norm_type, p, affine, false, out, err);
}

grove_status grove_instance_norm_new(int spatial, int64_t num_features, double eps, bool affine,
                                     bool track_running_stats, grove_module **out,
                                     grove_err *err) {
  *out = NULL;
  const grove_module_type *type =
      spatial == 1 ? &grove__instance_norm1d_type : &grove__instance_norm2d_type;
  if ((spatial != 1 && spatial != 2) || num_features <= 0)
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT,
                         "InstanceNorm: num_features must be positive and the spatial dims 1 or 2");
  grove_status s = check_eps(type->name, eps, err);
  if (s) return s;
  gn_impl *p = calloc(1, sizeof *p);
  if (!p) return grove_err_set(err, GROVE_E_NOMEM, "%s: out of memory", type->name);
  /* torch takes [N, C, *] or, unbatched, [C, *]: Grove serves batches. */
  *p = (gn_impl){.groups = num_features, .channels = num_features, .eps = eps, .instance = true,
                 .track_running_stats = track_running_stats, .min_nd = spatial + 2,
                 .max_nd = spatial + 2};
  return gn_make(type, p, affine, track_running_stats, out, err);
}

/* ------------------------------------------------------------ PReLU */

static grove_status prelu_forward(const grove_module *m, grove_fwd *f, const grove_values *in,
                                  grove_values *out) {
  const grove_tensor *x = NULL;
  grove_status s = one_input("PReLU", f, in, &x);
  if (s) return s;
  const grove_tensor *w = grove_module_param(m, "weight");
  if ((s = grove__op_prelu(f, x, w, &out->v[0]))) return grove_err_prefix(f->err, "PReLU");
  out->n = 1;
  return GROVE_OK;
}

const grove_module_type grove__prelu_type = {.name = "PReLU", .forward = prelu_forward};

grove_status grove_prelu_new(int64_t num_parameters, double init, grove_module **out,
                             grove_err *err) {
  *out = NULL;
  if (num_parameters <= 0 || num_parameters > (int64_t)1 << 30)
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT,
                         "PReLU: num_parameters %lld must be positive", (long long)num_parameters);
  grove_module *m = grove_module_new(&grove__prelu_type, NULL, err);
  if (!m) return err && err->code != GROVE_OK ? err->code : GROVE_E_NOMEM;
  grove_status s = grove__layer_param(m, "weight", false, 1, &num_parameters, GROVE_F32,
                                      (float)init, err);
  if (s) {
    grove_module_release(m);
    return s;
  }
  *out = m;
  return GROVE_OK;
}

/* ------------------------------------------------------------ model.json */

grove_status grove__group_norm_from_json(const json_t *obj, const char *path, grove_module **out,
                                         grove_err *err) {
  static const char *const keys[] = {"num_groups", "num_channels", "eps", "affine", NULL};
  const char *T = "GroupNorm";
  int64_t g, c;
  double eps;
  bool affine;
  grove_status s = grove__json_check_keys(obj, path, T, keys, err);
  if (!s) s = grove__json_int(obj, path, T, "num_groups", true, 0, 1, (int64_t)1 << 30, &g, err);
  if (!s)
    s = grove__json_int(obj, path, T, "num_channels", true, 0, 1, (int64_t)1 << 30, &c, err);
  if (!s) s = grove__json_number(obj, path, T, "eps", 1e-5, 0.0, INFINITY, &eps, err);
  if (!s) s = grove__json_bool(obj, path, T, "affine", true, &affine, err);
  if (!s) s = grove__json_built(path, grove_group_norm_new(g, c, eps, affine, out, err), err);
  return s;
}

static grove_status instance_from_json(int spatial, const json_t *obj, const char *path,
                                       grove_module **out, grove_err *err) {
  static const char *const keys[] = {"num_features", "eps", "momentum", "affine",
                                     "track_running_stats", NULL};
  const char *T = spatial == 1 ? "InstanceNorm1d" : "InstanceNorm2d";
  int64_t c;
  double eps, momentum;
  bool affine, track, is_null;
  grove_status s = grove__json_check_keys(obj, path, T, keys, err);
  if (!s)
    s = grove__json_int(obj, path, T, "num_features", true, 0, 1, (int64_t)1 << 30, &c, err);
  if (!s) s = grove__json_number(obj, path, T, "eps", 1e-5, 0.0, INFINITY, &eps, err);
  if (!s)
    s = grove__json_number_or_null(obj, path, T, "momentum", false, 0.1, 0.0, 1.0, &momentum,
                                   &is_null, err);
  if (!s) s = grove__json_bool(obj, path, T, "affine", false, &affine, err);
  if (!s) s = grove__json_bool(obj, path, T, "track_running_stats", false, &track, err);
  if (!s)
    s = grove__json_built(path, grove_instance_norm_new(spatial, c, eps, affine, track, out, err),
                          err);
  return s;
}

grove_status grove__instance_norm1d_from_json(const json_t *obj, const char *path,
                                              grove_module **out, grove_err *err) {
  return instance_from_json(1, obj, path, out, err);
}

grove_status grove__instance_norm2d_from_json(const json_t *obj, const char *path,
                                              grove_module **out, grove_err *err) {
  return instance_from_json(2, obj, path, out, err);
}

grove_status grove__prelu_from_json(const json_t *obj, const char *path, grove_module **out,
                                    grove_err *err) {
  static const char *const keys[] = {"num_parameters", "init", NULL};
  const char *T = "PReLU";
  int64_t n;
  double init;
  grove_status s = grove__json_check_keys(obj, path, T, keys, err);
  if (!s)
    s = grove__json_int(obj, path, T, "num_parameters", false, 1, 1, (int64_t)1 << 30, &n, err);
  if (!s) s = grove__json_number(obj, path, T, "init", 0.25, -INFINITY, INFINITY, &init, err);
  if (!s) s = grove__json_built(path, grove_prelu_new(n, init, out, err), err);
  return s;
}
