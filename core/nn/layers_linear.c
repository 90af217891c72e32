/* layers_linear.c: torch.nn.Linear, y = x W^T + b over the last dim.
 *
 * The weight is packed for the GEMM kernel (core/kernels/gemm_pack.c) in refresh, which
 * runs after construction (unless the tree is built for a load, which packs
 * the loaded weight instead: module_internal.h, "deferred refresh") and after every
 * load_state_dict; forward only runs the kernel on the pack, so it allocates
 * nothing but its output.  The bias is copied into impl at the same time, so
 * that forward reads nothing but impl.  A strided input is copied into the
 * arena first (grove__layer_input). */
#include <assert.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "layers_internal.h"

typedef struct linear_impl {
  int64_t in_features, out_features;
  grove__linear_pack *pack; /* from the current weight; NULL only while refresh_pending */
  bool use_bias;            /* the bias parameter is not None */
  float bias[];             /* out_features floats, copied from the bias */
} linear_impl;

static void linear_free_impl(void *impl) {
  linear_impl *p = impl;
  if (!p) return;
  grove__linear_pack_free(p->pack);
  free(p);
}

/* Rebuilds the pack and the bias copy from the parameters.  All or nothing:
 * on error the previous pack and bias stay in use. */
static grove_status linear_refresh(grove_module *m, grove_err *err) {
  linear_impl *p = m->impl;
  const int64_t N = p->out_features, K = p->in_features;
  const grove_tensor *w = grove_module_param(m, "weight");
  const grove_tensor *b = grove_module_param(m, "bias");
  if (!w) return grove_err_set(err, GROVE_E_INVALID_ARGUMENT, "Linear: weight is None");
  if (w->ndim != 2 || w->shape[0] != N || w->shape[1] != K) {
    char got[128];
    grove_shape_str(w->ndim, w->shape, got, sizeof got);
    return grove_err_set(err, GROVE_E_SHAPE,
                         "Linear: weight has shape %s, expected [%lld, %lld] (out_features, "
                         "in_features)",
                         got, (long long)N, (long long)K);
  }
  if (b && grove_tensor_numel(b) != N) {
    char got[128];
    grove_shape_str(b->ndim, b->shape, got, sizeof got);
    return grove_err_set(err, GROVE_E_SHAPE, "Linear: bias has shape %s, expected [%lld]", got,
                         (long long)N);
  }
  if (!grove_dtype_is_float(w->dtype) || (b && !grove_dtype_is_float(b->dtype)))
    return grove_err_set(err, GROVE_E_DTYPE, "Linear: weight and bias must be floating point");

  /* The kernel wants W as contiguous float32; a strided or converted weight
   * (a view from a .pt checkpoint loaded with assign) goes through a copy. */
  float *tmp = NULL;
  const float *wd = w->data;
  if (w->dtype != GROVE_F32 || !grove_tensor_is_contiguous(w)) {
    tmp = malloc((size_t)(N * K) * sizeof(float) + 1);
    if (!tmp) return grove_err_set(err, GROVE_E_NOMEM, "Linear: out of memory packing the weight");
    grove_status s = grove__copy_f32(tmp, N * K, w, "Linear", "weight", err);
    if (s != GROVE_OK) {
      free(tmp);
      return s;
    }
    wd = tmp;
  }
  grove__linear_pack *np = grove__linear_pack_new(wd, N, K);
  free(tmp);
  if (!np) return grove_err_set(err, GROVE_E_NOMEM, "Linear: out of memory packing the weight");
  if (b) {
    grove_status s = grove__copy_f32(p->bias, N, b, "Linear", "bias", err);
    if (s != GROVE_OK) {
      grove__linear_pack_free(np);
      return s;
    }
  }
  grove__linear_pack_free(p->pack);
  p->pack = np;
  p->use_bias = b != NULL;
  return GROVE_OK;
}

grove_status grove__linear_forward_act(const grove_module *m, grove_fwd *f, const grove_values *in,
                                       grove_values *out, grove__act act) {
  const linear_impl *p = m->impl;
  grove_tensor x;
  grove_status s = grove__layer_input("Linear", f, in, GROVE_F32, &x);
  if (s != GROVE_OK) return s;
  const int64_t K = p->in_features, N = p->out_features;
  if (x.ndim == 0)
    return grove_err_set(f->err, GROVE_E_SHAPE,
                         "Linear: input is a 0-d tensor, expected shape [..., %lld] "
                         "(in_features)",
                         (long long)K);
  if (x.shape[x.ndim - 1] != K) {
    char got[128];
    grove_shape_str(x.ndim, x.shape, got, sizeof got);
    int64_t rows = 1;
    for (int i = 0; i < x.ndim - 1; i++) rows *= x.shape[i];
    return grove_err_set(f->err, GROVE_E_SHAPE,
                         "Linear: mat1 and mat2 shapes cannot be multiplied (%lldx%lld and "
                         "%lldx%lld): input shape %s, expected [..., %lld] (in_features)",
                         (long long)rows, (long long)x.shape[x.ndim - 1], (long long)K,
                         (long long)N, got, (long long)K);
  }
  const int64_t M = grove_tensor_numel(&x) / K;
  int64_t shape[GROVE_MAX_DIMS];
  memcpy(shape, x.shape, sizeof shape);
  shape[x.ndim - 1] = N;
  s = grove_fwd_alloc(f, &out->v[0], GROVE_F32, x.ndim, shape);
  if (s != GROVE_OK) return s;
  out->n = 1;
  assert(p->pack);
  if (M > 0)
    grove__linear_run(p->pack, x.data, M, p->use_bias ? p->bias : NULL, out->v[0].data, act);
  return GROVE_OK;
}

bool grove__linear_packed(const grove_module *m) {
  return ((const linear_impl *)m->impl)->pack != NULL;
}

static grove_status linear_forward(const grove_module *m, grove_fwd *f, const grove_values *in,
                                   grove_values *out) {
  return grove__linear_forward_act(m, f, in, out, GROVE__ACT_NONE);
}

const grove_module_type grove__linear_type = {
    .name = "Linear",
    .forward = linear_forward,
    .refresh = linear_refresh,
    .free_impl = linear_free_impl,
};

/* Registers weight [out, in] and bias [out] (or None), in torch's order. */
grove_status grove_linear_new(int64_t in_features, int64_t out_features, bool bias,
                              grove_module **out, grove_err *err) {
  *out = NULL;
  if (in_features <= 0 || out_features <= 0)
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT,
                         "Linear: in_features and out_features must be positive, got %lld and "
                         "%lld",
                         (long long)in_features, (long long)out_features);
  uint64_t nw;
  if (grove__mul_overflow_u64((uint64_t)in_features, (uint64_t)out_features, &nw) ||
      nw > (uint64_t)INT64_MAX / sizeof(float))
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT, "Linear: %lld x %lld weights are too many",
                         (long long)out_features, (long long)in_features);
  linear_impl *p = calloc(1, sizeof *p + (size_t)out_features * sizeof(float));
  if (!p) return grove_err_set(err, GROVE_E_NOMEM, "Linear: out of memory");
  p->in_features = in_features;
  p->out_features = out_features;
  grove_module *m = grove_module_new(&grove__linear_type, p, err);
  if (!m) return err && err->code != GROVE_OK ? err->code : GROVE_E_NOMEM;

  grove_status s = GROVE_OK;
  int64_t wshape[2] = {out_features, in_features};
  grove_tensor *w = grove_tensor_new(GROVE_F32, 2, wshape, err);
  grove_tensor *b = bias ? grove_tensor_new(GROVE_F32, 1, &out_features, err) : NULL;
  if (!w || (bias && !b)) {
    s = err && err->code != GROVE_OK ? err->code : GROVE_E_NOMEM;
    grove_err_prefix(err, "Linear: %s", w ? "bias" : "weight");
  }
  if (!s) s = grove_module_register_parameter(m, "weight", w, err);
  if (!s) s = grove_module_register_parameter(m, "bias", b, err);
  grove_tensor_release(w);
  grove_tensor_release(b);
  /* Packs the zero weight, unless the tree is built for a load (module_internal.h,
   * "deferred refresh"). */
  if (!s) s = grove__refresh_new(m, err);
  if (s != GROVE_OK) {
    grove_module_release(m);
    return s;
  }
  *out = m;
  return GROVE_OK;
}

grove_status grove__linear_from_json(const json_t *obj, const char *path, grove_module **out,
                                     grove_err *err) {
  static const char *const keys[] = {"in_features", "out_features", "bias", NULL};
  int64_t in_f, out_f;
  bool bias;
  grove_status s = grove__json_check_keys(obj, path, "Linear", keys, err);
  if (!s)
    s = grove__json_int(obj, path, "Linear", "in_features", true, 0, 1, INT64_MAX, &in_f, err);
  if (!s)
    s = grove__json_int(obj, path, "Linear", "out_features", true, 0, 1, INT64_MAX, &out_f, err);
  if (!s) s = grove__json_bool(obj, path, "Linear", "bias", true, &bias, err);
  return s != GROVE_OK
             ? s
             : grove__json_built(path, grove_linear_new(in_f, out_f, bias, out, err), err);
}
