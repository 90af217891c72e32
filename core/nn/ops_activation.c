/* ops_activation.c: the elementwise activations (relu, gelu, silu,
 * leaky_relu, sigmoid, tanh), softmax / log_softmax and dropout: their op
 * entries (ops.h), their forwards, the torch.nn modules that mean them
 * (ReLU, GELU, SiLU, LeakyReLU, Sigmoid, Tanh, Softmax, LogSoftmax, Dropout)
 * and those modules' public constructors (include/grove/layers.h).
 *
 * Forward contract: one float32 input (dropout: any dtype), outputs in the
 * forward's arena, no heap allocation.  A non-contiguous input (a user's
 * strided view) is first copied into the arena, so the loops see contiguous
 * memory; a channels-last input is one dense run too and keeps its layout.
 * A module never writes over its input, even when torch's `inplace=True`
 * was asked for (a caller or a forward hook may still hold it); a graph
 * node does when the evaluator says that nothing else reads the input
 * (grove__opctx.overwrite), for relu, sigmoid and tanh. */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "layers_internal.h"
#include "ops.h"
#include "tensor_ops.h"

/* ------------------------------------------------------------ elementwise */

enum {
  ACT_RELU = GROVE__ELT_RELU,
  ACT_LEAKY = GROVE__ELT_LEAKY_RELU,
  ACT_GELU = GROVE__ELT_GELU,
  ACT_GELU_TANH = GROVE__ELT_GELU_TANH,
  ACT_SILU = GROVE__ELT_SILU,
  ACT_SIGMOID = GROVE__ELT_SIGMOID,
  ACT_TANH = GROVE__ELT_TANH,
};

/* Elements [b, e) of an in-place tanh, on whichever compute thread takes
 * them (relu and sigmoid: grove__act_inplace_par). */
static void tanh_chunk(void *ctx, int64_t b, int64_t e) {
  float *restrict d = ctx;
  for (int64_t i = b; i < e; i++) d[i] = tanhf(d[i]);
}

/* Elements [0, n) of one grove__elementwise call, on one thread. */
static void elementwise_run(int act, float slope, const float *x, float *y, int64_t n) {
  switch (act) {
    case ACT_RELU:
      grove__act_apply(GROVE__ACT_RELU, x, y, n);
      break;
    case ACT_LEAKY:
      /* Written as pos + neg * slope with two selects against zero: GCC 12
       * vectorises that but not `v > 0 ? v : v * slope`.  NaN stays NaN. */
      for (int64_t i = 0; i < n; i++) {
        const float v = x[i];
        y[i] = (v < 0.0f ? 0.0f : v) + (v < 0.0f ? v : 0.0f) * slope;
      }
      break;
    case ACT_GELU_TANH: {
      const float k = 0.7978845608028654f; /* sqrt(2 / pi) */
      for (int64_t i = 0; i < n; i++) {
        float v = x[i];
        y[i] = 0.5f * v * (1.0f + tanhf(k * (v + 0.044715f * v * v * v)));
      }
      break;
    }
    case ACT_GELU: /* a Linear's fused epilogue's formula too (kernels.h) */
      grove__act_apply(GROVE__ACT_GELU, x, y, n);
      break;
    case ACT_SILU: /* the convolutions' fused epilogue's formula too (kernels.h) */
      grove__act_apply(GROVE__ACT_SILU, x, y, n);
      break;
    case ACT_SIGMOID:
      grove__act_apply(GROVE__ACT_SIGMOID, x, y, n);
      break;
    default:
      for (int64_t i = 0; i < n; i++) y[i] = tanhf(x[i]);
      break;
  }
}

typedef struct elt_par {
  int act;
  float slope;
  const float *x;
  float *y;
} elt_par;

static void elt_chunk(void *ctx, int64_t b, int64_t e) {
  const elt_par *c = ctx;
  elementwise_run(c->act, c->slope, c->x + b, c->y + b, e - b);
}

/* y = act(x) over n elements (y may be x), in chunks on the compute
 * threads: every element is computed alone, so any cut gives the same
 * bits.  torch's formulas: ReLU keeps NaN (as torch's clamp_min: x < 0 is
 * false for NaN); GELU exact 0.5 x (1 + erf(x / sqrt 2)) (grove__act_apply's
 * vector erfc where the CPU has AVX2 or AVX-512), tanh approximation
 * 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))). */
void grove__elementwise(int act, float slope, const float *x, float *y, int64_t n) {
  elt_par p = {act, slope, x, y};
  grove__parallel_for(n, (int64_t)16 << 10, elt_chunk, &p);
}

/* One elementwise pass of the op c names, on its argument 0. */
static grove_status act_forward(const grove__opctx *c, gval *res, int act, float slope) {
  const grove_tensor *xa;
  grove_status s = grove__op_tensor(c, 0, &xa);
  if (s) return s;
  if ((c->overwrite & 1u) && (act == ACT_RELU || act == ACT_SIGMOID || act == ACT_TANH)) {
    if (act == ACT_TANH)
      grove__parallel_for(grove_tensor_numel(xa), (int64_t)16 << 10, tanh_chunk, xa->data);
    else
      grove__act_inplace_par(act == ACT_RELU ? GROVE__ACT_RELU : GROVE__ACT_SIGMOID, xa->data,
                             grove_tensor_numel(xa));
    grove__op_set_tensor(res, xa);
    return GROVE_OK;
  }
  const char *layer = grove__op_label(c);
  grove_values in = {.n = 1};
  in.v[0] = *xa;
  grove_tensor x, y;
  const bool nhwc = xa->dtype == GROVE_F32 && grove__is_nhwc(xa);
  if (nhwc)
    x = *xa;
  else if ((s = grove__layer_input(layer, c->f, &in, GROVE_F32, &x)) != GROVE_OK)
    return s;
  if ((s = grove_fwd_alloc(c->f, &y, GROVE_F32, x.ndim, x.shape))) return s;
  if (nhwc) grove__set_nhwc(&y);
  grove__elementwise(act, slope, x.data, y.data, grove_tensor_numel(&x));
  grove__op_set_tensor(res, &y);
  return GROVE_OK;
}

static grove_status relu_fwd(const grove__opctx *c, gval *res) {
  return act_forward(c, res, ACT_RELU, 0);
}
static grove_status leaky_relu_fwd(const grove__opctx *c, gval *res) {
  const garg *a = &c->args[1];
  return act_forward(c, res, ACT_LEAKY, (float)(a->kind == A_INT ? (double)a->i : a->f));
}
static grove_status gelu_fwd(const grove__opctx *c, gval *res) {
  const garg *a = &c->args[1];
  return act_forward(c, res,
                     a->kind == A_STR && strcmp(a->s, "tanh") == 0 ? ACT_GELU_TANH : ACT_GELU, 0);
}
static grove_status silu_fwd(const grove__opctx *c, gval *res) {
  return act_forward(c, res, ACT_SILU, 0);
}
static grove_status sigmoid_fwd(const grove__opctx *c, gval *res) {
  return act_forward(c, res, ACT_SIGMOID, 0);
}
static grove_status tanh_fwd(const grove__opctx *c, gval *res) {
  return act_forward(c, res, ACT_TANH, 0);
}

/* negative_slope is a constant: a module's float, or a graph node's float
 * or int (F.leaky_relu(x, 0)). */
static grove_status leaky_relu_check(const grove__opdef *d, const garg *a, const char *jp,
                                     grove_err *err) {
  const double v = a[1].kind == A_INT ? (double)a[1].i : a[1].f;
  if ((a[1].kind != A_FLOAT && a[1].kind != A_INT) || !isfinite(v))
    return grove__op_want_const(d, jp, 1, "a finite constant number (negative_slope)", err);
  return GROVE_OK;
}

static grove_status gelu_check(const grove__opdef *d, const garg *a, const char *jp,
                               grove_err *err) {
  if (a[1].kind != A_STR || (strcmp(a[1].s, "none") && strcmp(a[1].s, "tanh")))
    return grove_err_set(err, GROVE_E_SPEC, "%s: gelu's approximate must be \"none\" or \"tanh\"",
                         jp);
  return GROVE_OK;
}

/* ------------------------------------------------------------ softmax */

/* Rows along the last dim (inner == 1), the common case.  Numerically
 * stable: exp(x - max); the sum is kept in double. */
static void softmax_rows(const float *restrict x, float *restrict y, int64_t outer, int64_t n,
                         bool as_log) {
  for (int64_t o = 0; o < outer; o++) {
    const float *xr = x + o * n;
    float *yr = y + o * n;
    float mx = -INFINITY;
    for (int64_t j = 0; j < n; j++)
      if (xr[j] > mx) mx = xr[j];
    double sum = 0;
    if (as_log) {
      for (int64_t j = 0; j < n; j++) sum += expf(xr[j] - mx);
      /* (x - max) - log(sum), as torch: folding max and log(sum) into one
       * float first would round away digits of large logits. */
      const float lse = (float)log(sum);
      for (int64_t j = 0; j < n; j++) yr[j] = (xr[j] - mx) - lse;
    } else {
      for (int64_t j = 0; j < n; j++) {
        yr[j] = expf(xr[j] - mx);
        sum += yr[j];
      }
      const float inv = (float)(1.0 / sum);
      for (int64_t j = 0; j < n; j++) yr[j] *= inv;
    }
  }
}

/* A dim that is not the last: each of the `inner` lanes is its own softmax
 * over n elements spaced inner apart.  The loops run along the lanes, which
 * are contiguous, so they vectorise.  mx and sum are arena scratch of inner
 * elements. */
static void softmax_lanes(const float *restrict x, float *restrict y, int64_t outer, int64_t n,
                          int64_t inner, float *restrict mx, double *restrict sum, bool as_log) {
  for (int64_t o = 0; o < outer; o++) {
    const float *xb = x + o * n * inner;
    float *yb = y + o * n * inner;
    for (int64_t k = 0; k < inner; k++) {
      mx[k] = -INFINITY;
      sum[k] = 0;
    }
    for (int64_t j = 0; j < n; j++) {
      const float *xr = xb + j * inner;
      for (int64_t k = 0; k < inner; k++) mx[k] = xr[k] > mx[k] ? xr[k] : mx[k];
    }
    for (int64_t j = 0; j < n; j++) {
      const float *xr = xb + j * inner;
      float *yr = yb + j * inner;
      for (int64_t k = 0; k < inner; k++) {
        float e = expf(xr[k] - mx[k]);
        if (!as_log) yr[k] = e;
        sum[k] += e;
      }
    }
    if (as_log) {
      for (int64_t k = 0; k < inner; k++) sum[k] = log(sum[k]);
      for (int64_t j = 0; j < n; j++) {
        const float *xr = xb + j * inner;
        float *yr = yb + j * inner;
        for (int64_t k = 0; k < inner; k++) yr[k] = (xr[k] - mx[k]) - (float)sum[k];
      }
    } else {
      for (int64_t k = 0; k < inner; k++) mx[k] = (float)(1.0 / sum[k]);
      for (int64_t j = 0; j < n; j++) {
        float *yr = yb + j * inner;
        for (int64_t k = 0; k < inner; k++) yr[k] *= mx[k];
      }
    }
  }
}

/* as_log: log_softmax; neg: softmin, softmax(-x), as torch computes it. */
static grove_status softmax_common(const grove__opctx *c, gval *res, bool as_log, bool neg) {
  const char *layer = grove__op_label(c);
  const grove_tensor *xa;
  grove_status s = grove__op_tensor(c, 0, &xa);
  if (s) return s;
  grove_values in = {.n = 1};
  in.v[0] = *xa;
  grove_tensor x, y;
  if ((s = grove__layer_input(layer, c->f, &in, GROVE_F32, &x)) != GROVE_OK) return s;
  if (neg && (s = grove__op_unary(c->f, GROVE__UN_NEG, &x, 0, 0, &x, NULL))) return s;
  /* torch's _get_softmax_dim for dim=None. */
  const bool has_dim = c->args[1].kind == A_INT;
  int64_t dim = grove__softmax_dim(has_dim, has_dim ? c->args[1].i : 0, x.ndim);
  int d;
  if (!grove__op_wrap_dim(dim, x.ndim, &d))
    return grove__op_dim_error(c->f, layer, "dim", dim, x.ndim);
  if ((s = grove_fwd_alloc(c->f, &y, GROVE_F32, x.ndim, x.shape))) return s;
  grove__op_set_tensor(res, &y);
  int64_t outer = 1, n = 1, inner = 1;
  for (int i = 0; i < x.ndim; i++) {
    if (i < d)
      outer *= x.shape[i];
    else if (i == d)
      n = x.shape[i];
    else
      inner *= x.shape[i];
  }
  if (outer == 0 || n == 0 || inner == 0) return GROVE_OK;
  if (inner == 1) {
    softmax_rows(x.data, y.data, outer, n, as_log);
    return GROVE_OK;
  }
  float *mx = grove_arena_alloc(c->f->arena, (size_t)inner * sizeof(float));
  double *sum = grove_arena_alloc(c->f->arena, (size_t)inner * sizeof(double));
  if (!mx || !sum)
    return grove_err_set(c->f->err, GROVE_E_NOMEM, "%s: scratch arena is exhausted", layer);
  softmax_lanes(x.data, y.data, outer, n, inner, mx, sum, as_log);
  return GROVE_OK;
}

static grove_status softmax_fwd(const grove__opctx *c, gval *res) {
  return softmax_common(c, res, false, false);
}
static grove_status log_softmax_fwd(const grove__opctx *c, gval *res) {
  return softmax_common(c, res, true, false);
}
static grove_status softmin_fwd(const grove__opctx *c, gval *res) {
  return softmax_common(c, res, false, true);
}

static grove_status softmax_check(const grove__opdef *d, const garg *a, const char *jp,
                                  grove_err *err) {
  if (a[1].kind != A_NONE && a[1].kind != A_INT)
    return grove__op_want_const(d, jp, 1, "an integer constant or null", err);
  /* dtype="float32" (F.softmax(w, dim=-1, dtype=torch.float32), LLaMA's
   * and T5's spelling): the float32 softmax Grove computes anyway. */
  if (a[3].kind != A_NONE && !(a[3].kind == A_STR && strcmp(a[3].s, "float32") == 0))
    return grove_err_set(err, GROVE_E_UNSUPPORTED,
                         "%s: %s with a dtype other than float32 is not supported", jp, d->name);
  if (a[1].kind == A_INT && (a[1].i < -GROVE_MAX_DIMS || a[1].i >= GROVE_MAX_DIMS))
    return grove_err_set(err, GROVE_E_SPEC, "%s: dim %lld is out of range", jp, (long long)a[1].i);
  return GROVE_OK;
}

static void softmax_after_json(const grove__opdef *d, const char *path, const garg *a);

/* ------------------------------------------------------------ dropout */

/* Identity in eval mode.  Training-mode dropout needs a random generator and
 * belongs to the training replica, never to a serving tree.  A graph node's
 * training=False is checked when compiling. */
static grove_status dropout_fwd(const grove__opctx *c, gval *res) {
  if (c->mod && c->mod->training)
    return grove_err_set(c->f->err, GROVE_E_UNSUPPORTED,
                         "Dropout: training-mode forward is not available on a serving tree");
  const grove_tensor *x;
  grove_status s = grove__op_tensor(c, 0, &x);
  if (s) return s;
  grove__op_set_tensor(res, x);
  return GROVE_OK;
}

static grove_status dropout_check(const grove__opdef *d, const garg *a, const char *jp,
                                  grove_err *err) {
  if (a[2].kind != A_BOOL || a[2].i)
    return grove_err_set(err, GROVE_E_UNSUPPORTED,
                         "%s: dropout with training=True drops activations at random even in "
                         "eval mode; pass training=self.training (Grove serves eval mode)",
                         jp);
  return GROVE_OK;
}

/* ------------------------------------------------------------ the entries */

GROVE__OP_MODULE_TYPE(grove__relu_type, "ReLU");
GROVE__OP_MODULE_TYPE(grove__leaky_relu_type, "LeakyReLU");
GROVE__OP_MODULE_TYPE(grove__gelu_type, "GELU");
GROVE__OP_MODULE_TYPE(grove__silu_type, "SiLU");
GROVE__OP_MODULE_TYPE(grove__sigmoid_type, "Sigmoid");
GROVE__OP_MODULE_TYPE(grove__tanh_type, "Tanh");
GROVE__OP_MODULE_TYPE(grove__softmax_type, "Softmax");
GROVE__OP_MODULE_TYPE(grove__log_softmax_type, "LogSoftmax");
GROVE__OP_MODULE_TYPE(grove__softmin_type, "Softmin");
GROVE__OP_MODULE_TYPE(grove__dropout_type, "Dropout");
GROVE__OP_MODULE_TYPE(grove__dropout1d_type, "Dropout1d");
GROVE__OP_MODULE_TYPE(grove__dropout2d_type, "Dropout2d");
GROVE__OP_MODULE_TYPE(grove__dropout3d_type, "Dropout3d");
GROVE__OP_MODULE_TYPE(grove__alpha_dropout_type, "AlphaDropout");
GROVE__OP_MODULE_TYPE(grove__feature_alpha_dropout_type, "FeatureAlphaDropout");

#define F32 (1u << GROVE_F32)
#define INPUT \
  { .name = "input", .kind = P_TENSOR, .dk = D_REQ, .dtypes = 0 }
#define INPLACE \
  { .name = "inplace", .kind = P_IGNORED, .dk = D_BOOL, .dv = 0 }
#define DIM_OR_NONE \
  { .name = "dim", .kind = P_INT, .dk = D_NONE, .min = -GROVE_MAX_DIMS, .max = GROVE_MAX_DIMS - 1 }

static const char *const gelu_choices[] = {"none", "tanh", NULL};

const grove__opdef grove__opdef_relu = {
    .name = "relu",
    .id = G_RELU,
    .torch = (const char *const[]){"torch.relu(input)", "torch.nn.functional.relu(input,inplace)",
                                   "Tensor.relu(input)", NULL},
    .varargs = -1,
    .p = {INPUT, INPLACE},
    .forward = relu_fwd,
    .module = &(const grove__opmod){.cls = "ReLU", .type = &grove__relu_type, .args = {INPLACE}},
};

const grove__opdef grove__opdef_leaky_relu = {
    .name = "leaky_relu",
    .id = G_OP,
    .torch =
        (const char *const[]){"torch.nn.functional.leaky_relu(input,negative_slope,inplace)", NULL},
    .varargs = -1,
    .p = {INPUT,
          {.name = "negative_slope",
           .kind = P_FLOAT,
           .dk = D_FLOAT,
           .dv = 0.01,
           .min = -INFINITY,
           .max = INFINITY},
          INPLACE},
    .forward = leaky_relu_fwd,
    .module = &(const grove__opmod){.cls = "LeakyReLU",
                                    .type = &grove__leaky_relu_type,
                                    .args = {{.name = "negative_slope",
                                              .kind = P_FLOAT,
                                              .dk = D_FLOAT,
                                              .dv = 0.01,
                                              .min = -INFINITY,
                                              .max = INFINITY},
                                             INPLACE}},
    .check = leaky_relu_check,
};

const grove__opdef grove__opdef_gelu = {
    .name = "gelu",
    .id = G_GELU,
    .torch = (const char *const[]){"torch.nn.functional.gelu(input,approximate)", NULL},
    .varargs = -1,
    .p = {INPUT,
          {.name = "approximate",
           .kind = P_STR,
           .dk = D_STR,
           .ds = "none",
           .choices = gelu_choices}},
    .check = gelu_check,
    .forward = gelu_fwd,
    .module = &(const grove__opmod){.cls = "GELU",
                                    .type = &grove__gelu_type,
                                    .args = {{.name = "approximate",
                                              .kind = P_STR,
                                              .dk = D_STR,
                                              .ds = "none",
                                              .choices = gelu_choices}}},
};

const grove__opdef grove__opdef_silu = {
    .name = "silu",
    .id = G_OP,
    .torch = (const char *const[]){"torch.nn.functional.silu(input,inplace)", NULL},
    .varargs = -1,
    .p = {INPUT, INPLACE},
    .forward = silu_fwd,
    .module = &(const grove__opmod){.cls = "SiLU", .type = &grove__silu_type, .args = {INPLACE}},
};

const grove__opdef grove__opdef_sigmoid = {
    .name = "sigmoid",
    .id = G_SIGMOID,
    .torch = (const char *const[]){"torch.sigmoid(input)", "Tensor.sigmoid(input)", NULL},
    .varargs = -1,
    .p = {INPUT},
    .forward = sigmoid_fwd,
    .module = &(const grove__opmod){.cls = "Sigmoid", .type = &grove__sigmoid_type, .args = {{0}}},
};

const grove__opdef grove__opdef_tanh = {
    .name = "tanh",
    .id = G_TANH,
    .torch = (const char *const[]){"torch.tanh(input)", "Tensor.tanh(input)", NULL},
    .varargs = -1,
    .p = {INPUT},
    .forward = tanh_fwd,
    .module = &(const grove__opmod){.cls = "Tanh", .type = &grove__tanh_type, .args = {{0}}},
};

#define SOFTMAX_PARAMS \
  { INPUT, DIM_OR_NONE, OP_INT("_stacklevel", 3), OP_NONE("dtype", P_DTYPE) }
#define SOFTMAX_SPELLINGS(n)                                                                  \
  (const char *const[]) {                                                                     \
    "torch.nn.functional." n "(input,dim,_stacklevel,dtype)", "torch." n "(input,dim,dtype)", \
        "Tensor." n "(input,dim,dtype)", NULL                                                 \
  }

const grove__opdef grove__opdef_softmax = {
    .name = "softmax",
    .id = G_SOFTMAX,
    .torch = SOFTMAX_SPELLINGS("softmax"),
    .varargs = -1,
    .p = SOFTMAX_PARAMS,
    .check = softmax_check,
    .forward = softmax_fwd,
    .module = &(const grove__opmod){.cls = "Softmax",
                                    .type = &grove__softmax_type,
                                    .args = {DIM_OR_NONE},
                                    .after_json = softmax_after_json},
};

const grove__opdef grove__opdef_log_softmax = {
    .name = "log_softmax",
    .id = G_LOG_SOFTMAX,
    .torch = SOFTMAX_SPELLINGS("log_softmax"),
    .varargs = -1,
    .p = SOFTMAX_PARAMS,
    .check = softmax_check,
    .forward = log_softmax_fwd,
    .module = &(const grove__opmod){.cls = "LogSoftmax",
                                    .type = &grove__log_softmax_type,
                                    .args = {DIM_OR_NONE},
                                    .after_json = softmax_after_json},
};

/* F.softmin / nn.Softmin: torch's parameters are softmax's (no Tensor
 * spelling). */
const grove__opdef grove__opdef_softmin = {
    .name = "softmin",
    .id = G_OP,
    .torch =
        (const char *const[]){"torch.nn.functional.softmin(input,dim,_stacklevel,dtype)", NULL},
    .varargs = -1,
    .p = SOFTMAX_PARAMS,
    .check = softmax_check,
    .forward = softmin_fwd,
    .module = &(const grove__opmod){.cls = "Softmin",
                                    .type = &grove__softmin_type,
                                    .args = {DIM_OR_NONE},
                                    .after_json = softmax_after_json},
};

/* The other dropouts (channel-wise, alpha): in eval mode every one is the
 * identity, which is all a serving tree runs (training=True is refused); a
 * training replica trains nn.Dropout only (core/train names the others). */
#define DROP_P \
  { .name = "p", .kind = P_FLOAT, .dk = D_FLOAT, .dv = 0.5, .min = 0, .max = 1 }
#define DROPOUT_MODULE(var, C, nxt)          \
  static const grove__opmod var##_module = { \
      .cls = #C, .type = &grove__##var##_type, .args = {DROP_P, INPLACE}, .next = nxt}
DROPOUT_MODULE(feature_alpha_dropout, FeatureAlphaDropout, NULL);
DROPOUT_MODULE(alpha_dropout, AlphaDropout, &feature_alpha_dropout_module);
DROPOUT_MODULE(dropout3d, Dropout3d, &alpha_dropout_module);
DROPOUT_MODULE(dropout2d, Dropout2d, &dropout3d_module);
DROPOUT_MODULE(dropout1d, Dropout1d, &dropout2d_module);

const grove__opdef grove__opdef_dropout = {
    .name = "dropout",
    .id = G_DROPOUT,
    .torch = (const char *const[]){"torch.nn.functional.dropout(input,p,training,inplace)",
                                   "torch.nn.functional.dropout1d(input,p,training,inplace)",
                                   "torch.nn.functional.dropout2d(input,p,training,inplace)",
                                   "torch.nn.functional.dropout3d(input,p,training,inplace)",
                                   "torch.nn.functional.alpha_dropout(input,p,training,inplace)",
                                   "torch.nn.functional.feature_alpha_dropout(input,p,training,"
                                   "inplace)",
                                   NULL},
    .varargs = -1,
    .p = {{.name = "input", .kind = P_TENSOR, .dk = D_REQ},
          {.name = "p", .kind = P_FLOAT, .dk = D_FLOAT, .dv = 0.5, .min = 0, .max = 1},
          OP_BOOL("training", 1),
          INPLACE},
    .check = dropout_check,
    .forward = dropout_fwd,
    .module =
        &(const grove__opmod){
            .cls = "Dropout",
            .type = &grove__dropout_type,
            .args = {{.name = "p", .kind = P_FLOAT, .dk = D_FLOAT, .dv = 0.5, .min = 0, .max = 1},
                     INPLACE},
            .next = &dropout1d_module},
};

static void softmax_after_json(const grove__opdef *d, const char *path, const garg *a) {
  if (a[1].kind == A_NONE)
    grove__log(GROVE_LOG_WARN, "spec.softmax_implicit_dim",
               "%s: %s with dim=None uses torch's deprecated implicit dim (0 for 0-, 1- and 3-d "
               "input, else 1); export the model with an explicit dim",
               path, d->module->cls);
}

/* ------------------------------------------------------------ constructors */

static grove_status make(const grove__opdef *d, const garg *a, int n, grove_module **out,
                         grove_err *err) {
  return grove__op_module_new(d, d->module, a, n, out, err);
}

grove_status grove_relu_new(grove_module **out, grove_err *err) {
  return make(&grove__opdef_relu, NULL, 0, out, err);
}
grove_status grove_leaky_relu_new(double negative_slope, grove_module **out, grove_err *err) {
  if (!isfinite(negative_slope)) {
    *out = NULL;
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT,
                         "LeakyReLU: negative_slope must be finite, got %g", negative_slope);
  }
  const garg a = {.kind = A_FLOAT, .f = negative_slope};
  return make(&grove__opdef_leaky_relu, &a, 1, out, err);
}
grove__act grove__gelu_act(const grove_module *m) {
  if (m->type != &grove__gelu_type) return GROVE__ACT_NONE;
  const garg *a = grove__op_module_arg(m, "approximate");
  return a && a->kind == A_STR && strcmp(a->s, "tanh") == 0 ? GROVE__ACT_NONE : GROVE__ACT_GELU;
}

grove_status grove_gelu_new(const char *approximate, grove_module **out, grove_err *err) {
  if (approximate && strcmp(approximate, "tanh") && strcmp(approximate, "none")) {
    *out = NULL;
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT,
                         "GELU: approximate must be \"none\" or \"tanh\", got \"%s\"", approximate);
  }
  const garg a = {.kind = A_STR, .s = (char *)(approximate ? approximate : "none")};
  return make(&grove__opdef_gelu, &a, 1, out, err);
}
grove_status grove_silu_new(grove_module **out, grove_err *err) {
  return make(&grove__opdef_silu, NULL, 0, out, err);
}
grove_status grove_sigmoid_new(grove_module **out, grove_err *err) {
  return make(&grove__opdef_sigmoid, NULL, 0, out, err);
}
grove_status grove_tanh_new(grove_module **out, grove_err *err) {
  return make(&grove__opdef_tanh, NULL, 0, out, err);
}
grove_status grove_softmax_new(bool has_dim, int dim, grove_module **out, grove_err *err) {
  const garg a = {.kind = has_dim ? A_INT : A_NONE, .i = has_dim ? dim : 0};
  return make(&grove__opdef_softmax, &a, 1, out, err);
}
grove_status grove_log_softmax_new(bool has_dim, int dim, grove_module **out, grove_err *err) {
  const garg a = {.kind = has_dim ? A_INT : A_NONE, .i = has_dim ? dim : 0};
  return make(&grove__opdef_log_softmax, &a, 1, out, err);
}
grove_status grove_dropout_new(double p, grove_module **out, grove_err *err) {
  *out = NULL;
  if (!(p >= 0.0 && p <= 1.0))
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT,
                         "Dropout: dropout probability has to be between 0 and 1, but got %g", p);
  const garg a = {.kind = A_FLOAT, .f = p};
  return make(&grove__opdef_dropout, &a, 1, out, err);
}
