/* layers_linear.c: torch.nn.Linear, y = x W^T + b over the last dim, and
 * torch.nn.Bilinear, y[o] = x1^T W[o] x2 + b[o].
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

/* ------------------------------------------------------------ Bilinear */

/* W [out, in1, in2] packed as the Linear kernel's [out * in1, in2]: one
 * product gives t[m, o * in1 + i] = sum_j W[o, i, j] x2[m, j], and
 * y[m, o] = b[o] + sum_i x1[m, i] t[m, o * in1 + i]. */
typedef struct bilinear_impl {
  int64_t in1, in2, out;
  grove__linear_pack *pack; /* NULL only while refresh_pending */
  bool use_bias;
  float bias[]; /* out floats */
} bilinear_impl;

static void bilinear_free_impl(void *impl) {
  bilinear_impl *p = impl;
  if (!p) return;
  grove__linear_pack_free(p->pack);
  free(p);
}

static grove_status bilinear_refresh(grove_module *m, grove_err *err) {
  bilinear_impl *p = m->impl;
  const char *T = "Bilinear";
  const grove_tensor *w = grove_module_param(m, "weight");
  const grove_tensor *b = grove_module_param(m, "bias");
  if (!w) return grove_err_set(err, GROVE_E_INVALID_ARGUMENT, "%s: weight is None", T);
  const int64_t want[3] = {p->out, p->in1, p->in2};
  if (w->ndim != 3 || memcmp(w->shape, want, sizeof want) != 0) {
    char got[128], exp[128];
    return grove_err_set(err, GROVE_E_SHAPE, "%s: weight has shape %s, expected %s", T,
                         grove_shape_str(w->ndim, w->shape, got, sizeof got),
                         grove_shape_str(3, want, exp, sizeof exp));
  }
  if (b && grove_tensor_numel(b) != p->out) {
    char got[128];
    return grove_err_set(err, GROVE_E_SHAPE, "%s: bias has shape %s, expected [%lld]", T,
                         grove_shape_str(b->ndim, b->shape, got, sizeof got), (long long)p->out);
  }
  const int64_t n = p->out * p->in1 * p->in2;
  float *wd = malloc((size_t)n * sizeof(float) + 1);
  if (!wd) return grove_err_set(err, GROVE_E_NOMEM, "%s: out of memory packing the weight", T);
  grove_status s = grove__copy_f32(wd, n, w, T, "weight", err);
  if (!s && b) s = grove__copy_f32(p->bias, p->out, b, T, "bias", err);
  grove__linear_pack *np = s ? NULL : grove__linear_pack_new(wd, p->out * p->in1, p->in2);
  free(wd);
  if (s) return s;
  if (!np) return grove_err_set(err, GROVE_E_NOMEM, "%s: out of memory packing the weight", T);
  grove__linear_pack_free(p->pack);
  p->pack = np;
  p->use_bias = b != NULL;
  return GROVE_OK;
}

static grove_status bilinear_forward(const grove_module *m, grove_fwd *f, const grove_values *in,
                                     grove_values *out) {
  const bilinear_impl *p = m->impl;
  const char *T = "Bilinear";
  if (in->n != 2)
    return grove_err_set(f->err, GROVE_E_INVALID_ARGUMENT,
                         "%s: expected two inputs (input1, input2), got %d", T, in->n);
  grove_tensor x1, x2;
  grove_status s;
  for (int k = 0; k < 2; k++)
    if (in->v[k].dtype != GROVE_F32)
      return grove_err_set(f->err, GROVE_E_DTYPE, "%s: input%d must be float32, got %s", T, k + 1,
                           grove_dtype_name(in->v[k].dtype));
  if ((s = grove__fwd_contig(f, &in->v[0], &x1)) || (s = grove__fwd_contig(f, &in->v[1], &x2)))
    return s;
  bool ok = x1.ndim >= 1 && x1.ndim == x2.ndim && x1.shape[x1.ndim - 1] == p->in1 &&
            x2.shape[x2.ndim - 1] == p->in2;
  for (int d = 0; ok && d < x1.ndim - 1; d++) ok = x1.shape[d] == x2.shape[d];
  if (!ok) {
    char a[128], b[128];
    return grove_err_set(f->err, GROVE_E_SHAPE,
                         "%s: input1 %s and input2 %s must be [..., %lld] and [..., %lld] with the "
                         "same leading dims",
                         T, grove_shape_str(x1.ndim, x1.shape, a, sizeof a),
                         grove_shape_str(x2.ndim, x2.shape, b, sizeof b), (long long)p->in1,
                         (long long)p->in2);
  }
  const int64_t M = grove_tensor_numel(&x1) / p->in1, O = p->out, I = p->in1;
  int64_t shape[GROVE_MAX_DIMS];
  memcpy(shape, x1.shape, sizeof shape);
  shape[x1.ndim - 1] = O;
  if ((s = grove_fwd_alloc(f, &out->v[0], GROVE_F32, x1.ndim, shape))) return s;
  out->n = 1;
  if (M == 0) return GROVE_OK;
  float *t = grove_arena_alloc(f->arena, (size_t)(M * O * I) * sizeof(float));
  if (!t) return grove__scratch_error(f, T);
  assert(p->pack);
  grove__linear_run(p->pack, x2.data, M, NULL, t, GROVE__ACT_NONE);
  const float *a = x1.data;
  float *y = out->v[0].data;
  for (int64_t r = 0; r < M; r++)
    for (int64_t o = 0; o < O; o++) {
      const float *tr = t + (r * O + o) * I, *ar = a + r * I;
      float acc = 0;
      for (int64_t i = 0; i < I; i++) acc += ar[i] * tr[i];
      y[r * O + o] = acc + (p->use_bias ? p->bias[o] : 0.0f);
    }
  return GROVE_OK;
}

const grove_module_type grove__bilinear_type = {
    .name = "Bilinear",
    .forward = bilinear_forward,
    .refresh = bilinear_refresh,
    .free_impl = bilinear_free_impl,
};

grove_status grove_bilinear_new(int64_t in1_features, int64_t in2_features, int64_t out_features,
                                bool bias, grove_module **out, grove_err *err) {
  *out = NULL;
  const int64_t big = (int64_t)1 << 24;
  uint64_t n1, n2;
  if (in1_features <= 0 || in2_features <= 0 || out_features <= 0 || in1_features > big ||
      in2_features > big || out_features > big ||
      grove__mul_overflow_u64((uint64_t)in1_features, (uint64_t)out_features, &n1) ||
      grove__mul_overflow_u64(n1, (uint64_t)in2_features, &n2) || n2 > ((uint64_t)1 << 34))
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT,
                         "Bilinear: in1_features, in2_features and out_features must be positive "
                         "and their weight below 2^34 numbers, got %lld, %lld, %lld",
                         (long long)in1_features, (long long)in2_features, (long long)out_features);
  bilinear_impl *p = calloc(1, sizeof *p + (size_t)out_features * sizeof(float));
  if (!p) return grove_err_set(err, GROVE_E_NOMEM, "Bilinear: out of memory");
  p->in1 = in1_features;
  p->in2 = in2_features;
  p->out = out_features;
  grove_module *m = NULL;
  grove_status s = grove__layer_make(&grove__bilinear_type, p, &m, err);
  if (s) return s;
  const int64_t wshape[3] = {out_features, in1_features, in2_features};
  return grove__conv_params(m, 3, wshape, out_features, bias, out, err);
}

grove_status grove__bilinear_from_json(const json_t *obj, const char *path, grove_module **out,
                                       grove_err *err) {
  static const char *const keys[] = {"in1_features", "in2_features", "out_features", "bias", NULL};
  const char *T = "Bilinear";
  int64_t a, b, o;
  bool bias;
  grove_status s = grove__json_check_keys(obj, path, T, keys, err);
  if (!s) s = grove__json_int(obj, path, T, "in1_features", true, 0, 1, INT64_MAX, &a, err);
  if (!s) s = grove__json_int(obj, path, T, "in2_features", true, 0, 1, INT64_MAX, &b, err);
  if (!s) s = grove__json_int(obj, path, T, "out_features", true, 0, 1, INT64_MAX, &o, err);
  if (!s) s = grove__json_bool(obj, path, T, "bias", true, &bias, err);
  return s ? s : grove__json_built(path, grove_bilinear_new(a, b, o, bias, out, err), err);
}
