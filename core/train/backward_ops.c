/* backward_ops.c: differentiable operations on the tape's vars (backward.h):
 * activations, softmax, linear, dropout, layer norm and reshape, each a
 * training forward that pushes a node and the backward that node runs.
 * The module ops (backward_layers.c, backward_attention.c) and graphs
 * (backward_graph.c) are built from these.
 *
 * Formulas are torch's own (aten/src/ATen/native: Activation.cpp,
 * SoftMax.cpp, layer_norm_kernel.cpp, Dropout.cpp) so that gradients agree
 * with autograd to float32 rounding.  Sums over a row are kept in double. */
#include <math.h>
#include <string.h>

#include "backward.h"

static inline grove_tensor *val(grove__tape *t, int v) {
  return &t->vars[v].t;
}

/* ============================================================ activations */

static grove_status act_backward(grove__tape *t, const grove__node *n) {
  const int x = n->in[0], y = n->out[0];
  if (!grove__wants(t, x)) return GROVE_OK;
  const float *restrict dy = grove__grad_in(t, y);
  /* ReLU writes a gradient x had not received yet instead of zeroing it and
   * adding (the usual case: x is the Linear output the ReLU follows). */
  bool fresh = false;
  float *restrict dx =
      (grove__tkind)n->i[0] == GROVE__TK_RELU ? grove__grad_fresh(t, x, &fresh) : grove__grad(t, x);
  if (!dx) return GROVE_E_NOMEM;
  const float *restrict xv = val(t, x)->data;
  const float *restrict yv = val(t, y)->data;
  const int64_t N = grove_tensor_numel(val(t, x));
  switch ((grove__tkind)n->i[0]) {
    case GROVE__TK_RELU: /* threshold_backward(grad, result, 0) */
      /* dy[i] is read whatever the branch, so that the loop is a select and
       * vectorises (a conditional load is a branch per element). */
      if (fresh) {
        for (int64_t i = 0; i < N; i++) {
          const float g = dy[i];
          dx[i] = yv[i] > 0.0f ? g : 0.0f;
        }
      } else {
        for (int64_t i = 0; i < N; i++) {
          const float g = dy[i];
          dx[i] += yv[i] > 0.0f ? g : 0.0f;
        }
      }
      break;
    case GROVE__TK_LEAKY_RELU: {
      const float slope = (float)n->d[0];
      for (int64_t i = 0; i < N; i++) dx[i] += xv[i] > 0.0f ? dy[i] : dy[i] * slope;
      break;
    }
    case GROVE__TK_GELU:
      if (n->i[1]) {
        const float kBeta = (float)(M_SQRT2 * M_2_SQRTPI * 0.5), kKappa = 0.044715f;
        for (int64_t i = 0; i < N; i++) {
          const float v = xv[i], v2 = v * v;
          const float inner = kBeta * (v + kKappa * v2 * v);
          const float th = tanhf(inner);
          const float left = 0.5f * v, right = 1.0f + th;
          const float dl = 0.5f * right;
          const float dr = left * (1.0f - th * th) * kBeta * (1.0f + 3.0f * kKappa * v2);
          dx[i] += dy[i] * (dl + dr);
        }
      } else {
        const float kAlpha = (float)M_SQRT1_2, kBeta = (float)(M_2_SQRTPI * M_SQRT1_2 * 0.5);
        for (int64_t i = 0; i < N; i++) {
          const float v = xv[i];
          const float cdf = 0.5f * (1.0f + erff(v * kAlpha));
          const float pdf = kBeta * expf(v * v * -0.5f);
          dx[i] += dy[i] * (cdf + v * pdf);
        }
      }
      break;
    case GROVE__TK_SILU:
      for (int64_t i = 0; i < N; i++) {
        const float s = 1.0f / (1.0f + expf(-xv[i]));
        dx[i] += dy[i] * s * (1.0f + xv[i] * (1.0f - s));
      }
      break;
    case GROVE__TK_SIGMOID:
      for (int64_t i = 0; i < N; i++) dx[i] += dy[i] * (1.0f - yv[i]) * yv[i];
      break;
    case GROVE__TK_TANH:
      for (int64_t i = 0; i < N; i++) dx[i] += dy[i] * (1.0f - yv[i] * yv[i]);
      break;
    default:
      return grove_err_set(t->err, GROVE_E_INTERNAL, "activation backward: kind %d", (int)n->i[0]);
  }
  return GROVE_OK;
}

static grove_status need_f32(grove__tape *t, int x, const char *what) {
  if (val(t, x)->dtype != GROVE_F32)
    return grove_err_set(t->err, GROVE_E_DTYPE, "%s: expected a float32 input, got %s", what,
                         grove_dtype_name(val(t, x)->dtype));
  return GROVE_OK;
}

grove_status grove__top_act(grove__tape *t, grove__tkind kind, const grove__tinfo *info, int x,
                            int *y) {
  grove_status s = need_f32(t, x, "activation");
  if (s) return s;
  const grove_tensor *xt = val(t, x);
  const bool rg = t->vars[x].requires_grad;
  float *yd;
  int yv = grove__var_alloc(t, GROVE_F32, xt->ndim, xt->shape, rg, &yd);
  if (yv < 0) return GROVE_E_NOMEM;
  xt = val(t, x); /* the var list may have moved */
  const float *restrict xd = xt->data;
  const int64_t N = grove_tensor_numel(xt);
  const float slope = info ? (float)info->slope : 0.0f;
  const bool th = info && info->tanh_approx;
  /* The serving formulas themselves (nn/'s grove__elementwise). */
  int elt;
  switch (kind) {
    case GROVE__TK_RELU: elt = GROVE__ELT_RELU; break;
    case GROVE__TK_LEAKY_RELU: elt = GROVE__ELT_LEAKY_RELU; break;
    case GROVE__TK_GELU: elt = th ? GROVE__ELT_GELU_TANH : GROVE__ELT_GELU; break;
    case GROVE__TK_SILU: elt = GROVE__ELT_SILU; break;
    case GROVE__TK_SIGMOID: elt = GROVE__ELT_SIGMOID; break;
    case GROVE__TK_TANH: elt = GROVE__ELT_TANH; break;
    default: return grove_err_set(t->err, GROVE_E_INTERNAL, "activation: kind %d", (int)kind);
  }
  grove__elementwise(elt, slope, xd, yd, N);
  *y = yv;
  if (!rg) return GROVE_OK;
  grove__node n = {.backward = act_backward, .nin = 1, .nout = 1, .in = {x}, .out = {yv}};
  n.i[0] = kind;
  n.i[1] = th;
  n.d[0] = slope;
  return grove__node_add(t, &n);
}

/* ============================================================ softmax */

/* outer x n x inner around dim. */
static void split_dim(const grove_tensor *x, int dim, int64_t *outer, int64_t *n, int64_t *inner) {
  *outer = *n = *inner = 1;
  for (int i = 0; i < x->ndim; i++) {
    if (i < dim)
      *outer *= x->shape[i];
    else if (i == dim)
      *n = x->shape[i];
    else
      *inner *= x->shape[i];
  }
}

static grove_status softmax_backward(grove__tape *t, const grove__node *n) {
  const int x = n->in[0], y = n->out[0];
  if (!grove__wants(t, x)) return GROVE_OK;
  const float *dy = grove__grad_in(t, y);
  float *dx = grove__grad(t, x);
  if (!dx) return GROVE_E_NOMEM;
  const float *yv = val(t, y)->data;
  const bool as_log = n->i[0];
  int64_t outer, len, inner;
  split_dim(val(t, y), (int)n->i[1], &outer, &len, &inner);
  for (int64_t o = 0; o < outer; o++) {
    for (int64_t k = 0; k < inner; k++) {
      const int64_t base = o * len * inner + k;
      double sum = 0;
      if (as_log) {
        for (int64_t j = 0; j < len; j++) sum += dy[base + j * inner];
        for (int64_t j = 0; j < len; j++) {
          const int64_t e = base + j * inner;
          dx[e] += dy[e] - expf(yv[e]) * (float)sum;
        }
      } else {
        for (int64_t j = 0; j < len; j++)
          sum += (double)dy[base + j * inner] * yv[base + j * inner];
        for (int64_t j = 0; j < len; j++) {
          const int64_t e = base + j * inner;
          dx[e] += yv[e] * (dy[e] - (float)sum);
        }
      }
    }
  }
  return GROVE_OK;
}

grove_status grove__top_softmax(grove__tape *t, int x, int dim, bool as_log, int *y) {
  grove_status s = need_f32(t, x, as_log ? "log_softmax" : "softmax");
  if (s) return s;
  const bool rg = t->vars[x].requires_grad;
  float *yd;
  int yv = grove__var_alloc(t, GROVE_F32, val(t, x)->ndim, val(t, x)->shape, rg, &yd);
  if (yv < 0) return GROVE_E_NOMEM;
  const grove_tensor *xt = val(t, x);
  const float *xd = xt->data;
  int64_t outer, len, inner;
  split_dim(xt, dim, &outer, &len, &inner);
  for (int64_t o = 0; o < outer; o++) {
    for (int64_t k = 0; k < inner; k++) {
      const int64_t base = o * len * inner + k;
      float mx = -INFINITY;
      for (int64_t j = 0; j < len; j++) mx = xd[base + j * inner] > mx ? xd[base + j * inner] : mx;
      double sum = 0;
      for (int64_t j = 0; j < len; j++) sum += expf(xd[base + j * inner] - mx);
      if (as_log) {
        const float lse = (float)log(sum);
        for (int64_t j = 0; j < len; j++) yd[base + j * inner] = (xd[base + j * inner] - mx) - lse;
      } else {
        const float inv = (float)(1.0 / sum);
        for (int64_t j = 0; j < len; j++)
          yd[base + j * inner] = expf(xd[base + j * inner] - mx) * inv;
      }
    }
  }
  *y = yv;
  if (!rg) return GROVE_OK;
  grove__node n = {.backward = softmax_backward, .nin = 1, .nout = 1, .in = {x}, .out = {yv}};
  n.i[0] = as_log;
  n.i[1] = dim;
  return grove__node_add(t, &n);
}

/* ============================================================ linear */

/* Rows [r0, r0 + N) of W (and of b): MultiheadAttention's packed in_proj
 * weight is three projections, and each gradient lands in its own rows. */
static grove_status linear_backward(grove__tape *t, const grove__node *n) {
  const int x = n->in[0], y = n->out[0];
  const grove_tensor *W = n->p[0], *b = n->p[1];
  const int64_t K = W->shape[1], r0 = n->i[0], N = n->i[1];
  const int64_t M = grove_tensor_numel(val(t, x)) / K;
  const float *dy = grove__grad_in(t, y);
  if (M == 0) return GROVE_OK;
  const float *wd = (const float *)W->data + r0 * K;
  /* Each workspace is taken before the gradient it fills, so that a failure
   * never leaves a gradient that was handed out unzeroed and not written. */
  if (grove__wants(t, x)) {
    const size_t wsn = grove__gemm_ws_size(GROVE__GEMM_ACCUMULATE, M, K, N);
    void *ws = grove__tape_ws(t, wsn);
    bool fresh;
    float *dx = ws ? grove__grad_fresh(t, x, &fresh) : NULL;
    if (!dx) return GROVE_E_NOMEM;
    /* dX (+)= dY W */
    grove__gemm(fresh ? 0 : GROVE__GEMM_ACCUMULATE, M, K, N, dy, N, wd, K, dx, K, ws, wsn);
  }
  float *dW, *db = NULL;
  const size_t wsn = grove__gemm_ws_size(GROVE__GEMM_TRANS_A, N, K, M);
  void *ws = grove__tape_ws(t, wsn);
  if (!ws) return GROVE_E_NOMEM;
  /* A product over every row of W writes the whole .grad, so a new one
   * need not be zeroed first; MultiheadAttention's row blocks add up. */
  bool fresh = false;
  grove_status s = r0 == 0 && N == W->shape[0] ? grove__param_grad_fresh(t, W, &dW, &fresh)
                                               : grove__param_grad(t, W, &dW);
  if (s) return s;
  /* dW (+)= dY^T X */
  if (dW)
    grove__gemm(GROVE__GEMM_TRANS_A | (fresh ? 0 : GROVE__GEMM_ACCUMULATE), N, K, M, dy, N,
                val(t, x)->data, K, dW + r0 * K, K, ws, wsn);
  if (b && (s = grove__param_grad(t, b, &db))) return s;
  if (db) {
    /* Column sums in double: a long batch would otherwise lose digits. */
    double *acc = grove__tscratch(t, (size_t)N * sizeof(double), true);
    if (!acc) return GROVE_E_NOMEM;
    for (int64_t r = 0; r < M; r++)
      for (int64_t j = 0; j < N; j++) acc[j] += dy[r * N + j];
    for (int64_t j = 0; j < N; j++) db[r0 + j] += (float)acc[j];
  }
  return GROVE_OK;
}

grove_status grove__top_linear_rows(grove__tape *t, int x, const grove_tensor *W,
                                    const grove_tensor *b, int64_t r0, int64_t N, int *y) {
  grove_status s = need_f32(t, x, "Linear");
  if (s) return s;
  const int64_t K = W->shape[1];
  const grove_tensor *xt = val(t, x);
  if (xt->ndim == 0 || xt->shape[xt->ndim - 1] != K) {
    char got[128];
    grove_shape_str(xt->ndim, xt->shape, got, sizeof got);
    return grove_err_set(t->err, GROVE_E_SHAPE, "Linear: input shape %s, expected [..., %lld]", got,
                         (long long)K);
  }
  if ((size_t)N > (size_t)INT32_MAX || (size_t)K > (size_t)INT32_MAX ||
      grove_tensor_numel(xt) / K > INT32_MAX)
    return grove_err_set(t->err, GROVE_E_LIMIT, "Linear: sizes beyond the BLAS int range");
  int64_t shape[GROVE_MAX_DIMS];
  memcpy(shape, xt->shape, sizeof shape);
  shape[xt->ndim - 1] = N;
  float *yd;
  int yv = grove__var_alloc(t, GROVE_F32, xt->ndim, shape, true, &yd);
  if (yv < 0) return GROVE_E_NOMEM;
  xt = val(t, x);
  const int64_t M = grove_tensor_numel(xt) / K;
  if (M > 0) {
    if ((s = grove__tape_linear(t, xt->data, M, K, (const float *)W->data + r0 * K, N, yd)))
      return s;
    if (b) {
      const float *bd = (const float *)b->data + r0;
      for (int64_t r = 0; r < M; r++)
        for (int64_t j = 0; j < N; j++) yd[r * N + j] += bd[j];
    }
  }
  *y = yv;
  grove__node n = {.backward = linear_backward, .nin = 1, .nout = 1, .in = {x}, .out = {yv}};
  n.p[0] = W;
  n.p[1] = b;
  n.i[0] = r0;
  n.i[1] = N;
  return grove__node_add(t, &n);
}

grove_status grove__top_linear(grove__tape *t, int x, const grove_tensor *W, const grove_tensor *b,
                               int *y) {
  return grove__top_linear_rows(t, x, W, b, 0, W->shape[0], y);
}

/* ============================================================ dropout */

static grove_status dropout_backward(grove__tape *t, const grove__node *n) {
  const int x = n->in[0], y = n->out[0];
  if (!grove__wants(t, x)) return GROVE_OK;
  const float *dy = grove__grad_in(t, y);
  float *dx = grove__grad(t, x);
  if (!dx) return GROVE_E_NOMEM;
  const unsigned char *mask = n->saved;
  const float scale = (float)n->d[0];
  const int64_t N = grove_tensor_numel(val(t, x));
  for (int64_t i = 0; i < N; i++) dx[i] += mask[i] ? dy[i] * scale : 0.0f;
  return GROVE_OK;
}

grove_status grove__top_dropout(grove__tape *t, int x, double p, int *y) {
  if (p == 0.0) {
    *y = x; /* F.dropout(p=0) in training computes x * 1: the same values */
    return GROVE_OK;
  }
  grove_status s = need_f32(t, x, "Dropout");
  if (s) return s;
  const bool rg = t->vars[x].requires_grad;
  float *yd;
  int yv = grove__var_alloc(t, GROVE_F32, val(t, x)->ndim, val(t, x)->shape, rg, &yd);
  if (yv < 0) return GROVE_E_NOMEM;
  const int64_t N = grove_tensor_numel(val(t, x));
  unsigned char *mask = grove__tscratch(t, (size_t)N + 1, false);
  if (!mask) return GROVE_E_NOMEM;
  const float *xd = val(t, x)->data;
  /* torch: noise = bernoulli(1 - p) / (1 - p); y = x * noise.  p = 1 drops
   * everything (torch multiplies by zeros). */
  const float scale = p >= 1.0 ? 0.0f : (float)(1.0 / (1.0 - p));
  const double keep = 1.0 - p;
  for (int64_t i = 0; i < N; i++) {
    mask[i] = grove__tape_uniform(t) < keep;
    yd[i] = mask[i] ? xd[i] * scale : 0.0f;
  }
  *y = yv;
  if (!rg) return GROVE_OK;
  grove__node n = {.backward = dropout_backward, .nin = 1, .nout = 1, .in = {x}, .out = {yv}};
  n.saved = mask;
  n.d[0] = scale;
  return grove__node_add(t, &n);
}

/* ============================================================ layer norm */

typedef struct ln_saved {
  double *mean, *rstd; /* per row */
} ln_saved;

static grove_status ln_backward(grove__tape *t, const grove__node *n) {
  const int x = n->in[0], y = n->out[0];
  const grove_tensor *w = n->p[0], *b = n->p[1];
  const int64_t D = n->i[0];
  const int64_t R = D ? grove_tensor_numel(val(t, x)) / D : 0;
  const ln_saved *sv = n->saved;
  const float *dy = grove__grad_in(t, y);
  const float *xd = val(t, x)->data;
  const float *wd = w ? w->data : NULL;
  float *dx = NULL, *dw = NULL, *db = NULL;
  grove_status s = GROVE_OK;
  if (grove__wants(t, x) && !(dx = grove__grad(t, x))) return GROVE_E_NOMEM;
  if (w) s = grove__param_grad(t, w, &dw);
  if (!s && b) s = grove__param_grad(t, b, &db);
  if (s) return s;
  double *aw = NULL, *ab = NULL;
  if (dw || db) {
    aw = grove__tscratch(t, 2 * (size_t)D * sizeof(double), true);
    if (!aw) return GROVE_E_NOMEM;
    ab = aw + D;
  }
  for (int64_t r = 0; r < R; r++) {
    const float *xr = xd + r * D, *dyr = dy + r * D;
    const double mean = sv->mean[r], rstd = sv->rstd[r];
    if (aw)
      for (int64_t j = 0; j < D; j++) {
        aw[j] += (double)dyr[j] * ((xr[j] - mean) * rstd);
        ab[j] += dyr[j];
      }
    if (!dx) continue;
    double sg = 0, sgx = 0;
    for (int64_t j = 0; j < D; j++) {
      const double g = wd ? (double)dyr[j] * wd[j] : dyr[j];
      sg += g;
      sgx += g * (xr[j] - mean) * rstd;
    }
    sg /= (double)D;
    sgx /= (double)D;
    float *dxr = dx + r * D;
    for (int64_t j = 0; j < D; j++) {
      const double g = wd ? (double)dyr[j] * wd[j] : dyr[j];
      const double xhat = (xr[j] - mean) * rstd;
      dxr[j] += (float)(rstd * (g - sg - xhat * sgx));
    }
  }
  for (int64_t j = 0; dw && j < D; j++) dw[j] += (float)aw[j];
  for (int64_t j = 0; db && j < D; j++) db[j] += (float)ab[j];
  return GROVE_OK;
}

grove_status grove__top_layer_norm(grove__tape *t, int x, int64_t D, double eps,
                                   const grove_tensor *w, const grove_tensor *b, int *y) {
  grove_status s = need_f32(t, x, "LayerNorm");
  if (s) return s;
  const bool rg = t->vars[x].requires_grad || w || b;
  float *yd;
  int yv = grove__var_alloc(t, GROVE_F32, val(t, x)->ndim, val(t, x)->shape, rg, &yd);
  if (yv < 0) return GROVE_E_NOMEM;
  const int64_t R = D ? grove_tensor_numel(val(t, x)) / D : 0;
  ln_saved *sv = grove__tscratch(t, sizeof *sv, false);
  double *st = grove__tscratch(t, 2 * (size_t)(R + 1) * sizeof(double), false);
  if (!sv || !st) return GROVE_E_NOMEM;
  sv->mean = st;
  sv->rstd = st + R + 1;
  const float *xd = val(t, x)->data;
  const float *wd = w ? w->data : NULL, *bd = b ? b->data : NULL;
  for (int64_t r = 0; r < R; r++) {
    const float *xr = xd + r * D;
    float *yr = yd + r * D;
    double sum = 0, sq = 0;
    for (int64_t j = 0; j < D; j++) sum += xr[j];
    const double mean = sum / (double)D;
    for (int64_t j = 0; j < D; j++) sq += (xr[j] - mean) * (xr[j] - mean);
    const double rstd = 1.0 / sqrt(sq / (double)D + eps);
    sv->mean[r] = mean;
    sv->rstd[r] = rstd;
    for (int64_t j = 0; j < D; j++) {
      float v = (float)((xr[j] - mean) * rstd);
      if (wd) v *= wd[j];
      if (bd) v += bd[j];
      yr[j] = v;
    }
  }
  *y = yv;
  if (!rg) return GROVE_OK;
  grove__node n = {.backward = ln_backward, .nin = 1, .nout = 1, .in = {x}, .out = {yv}};
  n.saved = sv;
  n.p[0] = w;
  n.p[1] = b;
  n.i[0] = D;
  return grove__node_add(t, &n);
}

/* ============================================================ reshape */

static grove_status copy_backward(grove__tape *t, const grove__node *n) {
  const int x = n->in[0], y = n->out[0];
  if (!grove__wants(t, x)) return GROVE_OK;
  const float *dy = grove__grad_in(t, y);
  float *dx = grove__grad(t, x);
  if (!dx) return GROVE_E_NOMEM;
  const int64_t N = grove_tensor_numel(val(t, x));
  for (int64_t i = 0; i < N; i++) dx[i] += dy[i];
  return GROVE_OK;
}

grove_status grove__top_reshape(grove__tape *t, int x, int nd, const int64_t *shape, int *y) {
  const grove_tensor *xt = val(t, x);
  int64_t n = 1;
  for (int i = 0; i < nd; i++) n *= shape[i];
  if (n != grove_tensor_numel(xt)) {
    char a[128], b[128];
    return grove_err_set(t->err, GROVE_E_SHAPE, "shape %s is invalid for an input of shape %s",
                         grove_shape_str(nd, shape, a, sizeof a),
                         grove_shape_str(xt->ndim, xt->shape, b, sizeof b));
  }
  /* Vars are values: the view shares the memory, its gradient does not. */
  grove_tensor v;
  grove_tensor_init(&v, xt->dtype, nd, shape, xt->data);
  const bool rg = t->vars[x].requires_grad;
  int yv = grove__var_new(t, &v, rg);
  if (yv < 0) return GROVE_E_NOMEM;
  *y = yv;
  if (!rg || v.dtype != GROVE_F32) return GROVE_OK;
  grove__node nd_ = {.backward = copy_backward, .nin = 1, .nout = 1, .in = {x}, .out = {yv}};
  return grove__node_add(t, &nd_);
}
