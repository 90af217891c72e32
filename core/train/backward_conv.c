/* backward_conv.c: training forwards and backwards of Conv1d / Conv2d and
 * the 2-d pools (MaxPool2d, AvgPool2d, AdaptiveAvgPool2d).
 *
 * Convolution is lowered to GEMMs on im2col patches, per image and group:
 *   col  [Cg * kh * kw, Ho * Wo]   the input patches (zeros where padded)
 *   y_g  = W_g [Og, Cg*kh*kw] . col  (+ bias)
 * and backward reuses the same lowering:
 *   dW_g += dy_g . col^T,   dcol = W_g^T . dy_g,   dx += col2im(dcol).
 * The patches are rebuilt from the saved input in backward rather than kept
 * (they are kh * kw times the input).  Conv1d is the same on [N, C, 1, L].
 * This is a plain lowering, not the serving path's packed kernel: training
 * runs from the parameter tensors the optimizer updates.
 *
 * Pools follow torch's CPU kernels (aten/src/ATen/native/cpu): output sizes
 * with ceil_mode's "the last window must start inside the input" rule;
 * max pooling keeps the first maximum of each window in scan order (a NaN
 * wins), and routes the gradient there; average pooling divides by the
 * window as torch counts it (count_include_pad, divisor_override). */
#include <math.h>
#include <string.h>

#include "backward.h"

static inline grove_tensor *val(grove__tape *t, int v) {
  return &t->vars[v].t;
}

/* ============================================================ convolution */

typedef struct conv_geom {
  int64_t N, C, H, W, O, Ho, Wo, G, Cg, Og, K; /* K = Cg * kh * kw */
  int64_t kh, kw, sh, sw, ph, pw, dh, dw;
} conv_geom;

/* im2col and col2im (core/kernels/im2col.c) over the compute threads, a
 * chunk of input channels each: every channel's patch rows (and its dx plane)
 * belong to one chunk, written with the same arithmetic whatever thread takes
 * it, so the results do not depend on the thread count. */
typedef struct col_job {
  grove__conv_geom k; /* the patches' geometry (kernels.h) */
  int64_t ldc;
  const float *src;
  float *dst;
} col_job;

static col_job col_job_of(const conv_geom *g, const float *src, float *dst) {
  return (col_job){.k = {.H = g->H, .W = g->W, .Ho = g->Ho, .Wo = g->Wo, .kh = g->kh, .kw = g->kw,
                         .sh = g->sh, .sw = g->sw, .ph = g->ph, .pw = g->pw, .dh = g->dh,
                         .dw = g->dw},
                   .ldc = g->Ho * g->Wo,
                   .src = src,
                   .dst = dst};
}

static void im2col_chunk(void *ctx, int64_t c0, int64_t c1) {
  const col_job *j = ctx;
  grove__im2col(&j->k, j->src, c0, c1, j->dst, j->ldc);
}

static void col2im_chunk(void *ctx, int64_t c0, int64_t c1) {
  const col_job *j = ctx;
  grove__col2im(&j->k, j->src, j->ldc, j->dst, c0, c1);
}

/* Channels per chunk: at least 16K floats of patch rows, so that a hand-off
 * stays small beside the copying. */
static int64_t col_grain(const conv_geom *g) {
  const int64_t per = g->kh * g->kw * g->Ho * g->Wo;
  return per >= 16384 ? 1 : 16384 / (per > 0 ? per : 1);
}

static void im2col(const conv_geom *g, const float *x, float *col) {
  col_job j = col_job_of(g, x, col);
  grove__parallel_for(g->Cg, col_grain(g), im2col_chunk, &j);
}

static void col2im(const conv_geom *g, const float *col, float *dx) {
  col_job j = col_job_of(g, col, dx);
  grove__parallel_for(g->Cg, col_grain(g), col2im_chunk, &j);
}

static grove_status conv_backward(grove__tape *t, const grove__node *n) {
  const conv_geom *g = n->saved;
  const grove_tensor *Wt = n->p[0], *b = n->p[1];
  const int x = n->in[0];
  const float *xd = val(t, x)->data;
  const float *dy = grove__grad_in(t, n->out[0]);
  float *dx = NULL, *dW = NULL, *db = NULL;
  const int64_t HW = g->Ho * g->Wo;
  /* The products' workspace before any gradient is touched: the tape keeps
   * the largest one asked for, so the products below allocate nothing and
   * cannot fail halfway through a gradient. */
  size_t wsn = grove__gemm_ws_size(GROVE__GEMM_TRANS_B | GROVE__GEMM_ACCUMULATE, g->Og, g->K, HW);
  const size_t wsx = grove__gemm_ws_size(GROVE__GEMM_TRANS_A, g->K, HW, g->Og);
  if (wsx > wsn) wsn = wsx;
  if (!grove__tape_ws(t, wsn)) return GROVE_E_NOMEM;
  grove_status s = grove__param_grad(t, Wt, &dW);
  if (!s && b) s = grove__param_grad(t, b, &db);
  if (s) return s;
  if (grove__wants(t, x) && !(dx = grove__grad(t, x))) return GROVE_E_NOMEM;
  float *col = grove__tscratch(t, (size_t)(g->K * HW + 1) * sizeof(float), false);
  if (!col) return GROVE_E_NOMEM;
  const float *wd = Wt->data;
  for (int64_t im = 0; im < g->N; im++) {
    for (int64_t gr = 0; gr < g->G; gr++) {
      const float *xg = xd + (im * g->C + gr * g->Cg) * g->H * g->W;
      const float *dyg = dy + (im * g->O + gr * g->Og) * HW;
      const float *wg = wd + gr * g->Og * g->K;
      grove_status st = GROVE_OK;
      if (dW) {
        im2col(g, xg, col);
        /* dW_g += dy_g [Og, HW] . col^T */
        st = grove__tape_gemm(t, GROVE__GEMM_TRANS_B | GROVE__GEMM_ACCUMULATE, g->Og, g->K, HW, dyg,
                              HW, col, HW, dW + gr * g->Og * g->K, g->K);
      }
      if (!st && dx) {
        /* dcol = W_g^T [K, Og] . dy_g */
        st = grove__tape_gemm(t, GROVE__GEMM_TRANS_A, g->K, HW, g->Og, wg, g->K, dyg, HW, col, HW);
        if (!st) col2im(g, col, dx + (im * g->C + gr * g->Cg) * g->H * g->W);
      }
      if (st) return st;
    }
    if (db)
      for (int64_t o = 0; o < g->O; o++) {
        double acc = 0;
        const float *r = dy + (im * g->O + o) * HW;
        for (int64_t k = 0; k < HW; k++) acc += r[k];
        db[o] += (float)acc;
      }
  }
  return GROVE_OK;
}

grove_status grove__tf_conv(grove__tape *t, const grove_module *m, const grove__tinfo *info,
                            const int *in, int nin, int *out, int *nout) {
  const char *T = m->type->name;
  if (nin != 1)
    return grove_err_set(t->err, GROVE_E_INVALID_ARGUMENT, "%s: expected 1 input tensor, got %d", T,
                         nin);
  const grove_tensor *x = val(t, in[0]);
  if (x->dtype != GROVE_F32)
    return grove_err_set(t->err, GROVE_E_DTYPE, "%s: expected a float32 input, got %s", T,
                         grove_dtype_name(x->dtype));
  const bool one = info->conv_dims == 1;
  const int sp = one ? 1 : 2; /* spatial dims */
  if (x->ndim != sp + 1 && x->ndim != sp + 2) {
    char got[128];
    return grove_err_set(t->err, GROVE_E_SHAPE, "%s: expected a %d-d or %d-d input, got %s", T,
                         sp + 1, sp + 2, grove_shape_str(x->ndim, x->shape, got, sizeof got));
  }
  const bool batched = x->ndim == sp + 2;
  conv_geom g = {0};
  const int c0 = batched ? 1 : 0;
  g.N = batched ? x->shape[0] : 1;
  g.C = x->shape[c0];
  g.H = one ? 1 : x->shape[c0 + 1];
  g.W = x->shape[x->ndim - 1];
  g.G = info->groups;
  g.O = info->out_channels;
  if (g.C != info->in_channels) {
    char got[128];
    return grove_err_set(t->err, GROVE_E_SHAPE, "%s: expected input with %lld channels, got %s", T,
                         (long long)info->in_channels,
                         grove_shape_str(x->ndim, x->shape, got, sizeof got));
  }
  g.kh = info->kernel[0], g.kw = info->kernel[1];
  g.sh = info->stride[0], g.sw = info->stride[1];
  g.dh = info->dilation[0], g.dw = info->dilation[1];
  g.ph = info->pad_lo[0], g.pw = info->pad_lo[1];
  const int64_t eh = g.H + info->pad_lo[0] + info->pad_hi[0] - g.dh * (g.kh - 1) - 1;
  const int64_t ew = g.W + info->pad_lo[1] + info->pad_hi[1] - g.dw * (g.kw - 1) - 1;
  if (eh < 0 || ew < 0)
    return grove_err_set(t->err, GROVE_E_SHAPE, "%s: the input is smaller than the kernel", T);
  g.Ho = eh / g.sh + 1;
  g.Wo = ew / g.sw + 1;
  g.Cg = g.C / g.G;
  g.Og = g.O / g.G;
  g.K = g.Cg * g.kh * g.kw;
  const grove_tensor *Wt, *b;
  grove_status s = grove__param_f32(t, m, "weight", g.O * g.K, &Wt);
  if (!s) s = grove__param_f32(t, m, "bias", g.O, &b);
  if (s) return s;
  if (!Wt) return grove_err_set(t->err, GROVE_E_INVALID_ARGUMENT, "%s: weight is None", T);
  if (g.K * g.Ho * g.Wo > INT32_MAX || g.Og > INT32_MAX)
    return grove_err_set(t->err, GROVE_E_LIMIT, "%s: sizes beyond the BLAS int range", T);
  int64_t shape[4];
  int nd = 0;
  if (batched) shape[nd++] = g.N;
  shape[nd++] = g.O;
  if (!one) shape[nd++] = g.Ho;
  shape[nd++] = g.Wo;
  float *yd;
  int yv = grove__var_alloc(t, GROVE_F32, nd, shape, true, &yd);
  if (yv < 0) return GROVE_E_NOMEM;
  conv_geom *sv = grove__tscratch(t, sizeof *sv, false);
  const int64_t HW = g.Ho * g.Wo;
  float *col = grove__tscratch(t, (size_t)(g.K * HW + 1) * sizeof(float), false);
  if (!sv || !col) return GROVE_E_NOMEM;
  *sv = g;
  const float *xd = val(t, in[0])->data, *wd = Wt->data, *bd = b ? b->data : NULL;
  for (int64_t im = 0; im < g.N; im++)
    for (int64_t gr = 0; gr < g.G; gr++) {
      im2col(&g, xd + (im * g.C + gr * g.Cg) * g.H * g.W, col);
      float *yg = yd + (im * g.O + gr * g.Og) * HW;
      /* y_g = W_g [Og, K] . col */
      s = grove__tape_gemm(t, 0, g.Og, HW, g.K, wd + gr * g.Og * g.K, g.K, col, HW, yg, HW);
      if (s) return s;
      if (bd)
        for (int64_t o = 0; o < g.Og; o++)
          for (int64_t k = 0; k < HW; k++) yg[o * HW + k] += bd[gr * g.Og + o];
    }
  out[0] = yv;
  *nout = 1;
  grove__node n = {
      .backward = conv_backward, .m = m, .nin = 1, .nout = 1, .in = {in[0]}, .out = {yv}};
  n.saved = sv;
  n.p[0] = Wt;
  n.p[1] = b;
  return grove__node_add(t, &n);
}

/* ============================================================ pools */

typedef struct pool_geom {
  int64_t NC, H, W, Ho, Wo;
  int64_t kh, kw, sh, sw, ph, pw, dh, dw;
  int kind;
  bool count_include_pad;
  int64_t divisor;
  int64_t *argmax; /* max pooling: flat input index per output, -1 for none */
} pool_geom;

/* torch's pooling_output_shape. */
static int64_t pool_out(int64_t in, int64_t k, int64_t pad, int64_t stride, int64_t dil,
                        bool ceil_mode) {
  int64_t num = in + 2 * pad - dil * (k - 1) - 1 + (ceil_mode ? stride - 1 : 0);
  int64_t o = (num >= 0 ? num / stride : -((-num + stride - 1) / stride)) + 1;
  if (ceil_mode && (o - 1) * stride >= in + pad) o--;
  return o;
}

/* An avg window: [h0, h1) x [w0, w1) clamped to the input, and its divisor. */
static void avg_window(const pool_geom *g, int64_t oh, int64_t ow, int64_t *h0, int64_t *h1,
                       int64_t *w0, int64_t *w1, float *div) {
  int64_t hs = oh * g->sh - g->ph, ws = ow * g->sw - g->pw;
  int64_t he = hs + g->kh < g->H + g->ph ? hs + g->kh : g->H + g->ph;
  int64_t we = ws + g->kw < g->W + g->pw ? ws + g->kw : g->W + g->pw;
  const int64_t pool_size = (he - hs) * (we - ws);
  hs = hs > 0 ? hs : 0;
  ws = ws > 0 ? ws : 0;
  he = he < g->H ? he : g->H;
  we = we < g->W ? we : g->W;
  *h0 = hs, *h1 = he, *w0 = ws, *w1 = we;
  if (g->divisor)
    *div = (float)g->divisor;
  else if (g->count_include_pad)
    *div = (float)pool_size;
  else
    *div = (float)((he - hs) * (we - ws));
}

/* AdaptiveAvgPool2d's window along one dim: torch's start_index/end_index. */
static void adaptive_range(int64_t o, int64_t out, int64_t in, int64_t *a, int64_t *b) {
  *a = (o * in) / out;
  *b = ((o + 1) * in + out - 1) / out;
}

static grove_status pool_backward(grove__tape *t, const grove__node *n) {
  const pool_geom *g = n->saved;
  const int x = n->in[0];
  if (!grove__wants(t, x)) return GROVE_OK;
  const float *dy = grove__grad_in(t, n->out[0]);
  float *dx = grove__grad(t, x);
  if (!dx) return GROVE_E_NOMEM;
  const int64_t HW = g->H * g->W, OHW = g->Ho * g->Wo;
  for (int64_t p = 0; p < g->NC; p++) {
    float *dxp = dx + p * HW;
    const float *dyp = dy + p * OHW;
    for (int64_t oh = 0; oh < g->Ho; oh++)
      for (int64_t ow = 0; ow < g->Wo; ow++) {
        const int64_t o = oh * g->Wo + ow;
        if (g->kind == GROVE__TK_MAX_POOL2D) {
          const int64_t a = g->argmax[p * OHW + o];
          if (a >= 0) dxp[a] += dyp[o];
          continue;
        }
        int64_t h0, h1, w0, w1;
        float div;
        if (g->kind == GROVE__TK_AVG_POOL2D) {
          avg_window(g, oh, ow, &h0, &h1, &w0, &w1, &div);
        } else {
          adaptive_range(oh, g->Ho, g->H, &h0, &h1);
          adaptive_range(ow, g->Wo, g->W, &w0, &w1);
          div = (float)((h1 - h0) * (w1 - w0));
        }
        const float v = dyp[o] / div;
        for (int64_t ih = h0; ih < h1; ih++)
          for (int64_t iw = w0; iw < w1; iw++) dxp[ih * g->W + iw] += v;
      }
  }
  return GROVE_OK;
}

grove_status grove__tf_pool(grove__tape *t, const grove_module *m, const grove__tinfo *info,
                            const int *in, int nin, int *out, int *nout) {
  const char *T = m->type->name;
  if (nin != 1)
    return grove_err_set(t->err, GROVE_E_INVALID_ARGUMENT, "%s: expected 1 input tensor, got %d", T,
                         nin);
  const grove_tensor *x = val(t, in[0]);
  if (x->dtype != GROVE_F32 || (x->ndim != 3 && x->ndim != 4)) {
    char got[128];
    return grove_err_set(t->err, x->dtype != GROVE_F32 ? GROVE_E_DTYPE : GROVE_E_SHAPE,
                         "%s: expected a float32 [N, C, H, W] or [C, H, W] input, got %s %s", T,
                         grove_dtype_name(x->dtype),
                         grove_shape_str(x->ndim, x->shape, got, sizeof got));
  }
  pool_geom g = {0};
  g.kind = info->kind;
  g.H = x->shape[x->ndim - 2];
  g.W = x->shape[x->ndim - 1];
  g.NC = grove_tensor_numel(x) / (g.H * g.W > 0 ? g.H * g.W : 1);
  if (info->kind == GROVE__TK_ADAPTIVE_AVG_POOL2D) {
    g.Ho = info->out_size[0] < 0 ? g.H : info->out_size[0];
    g.Wo = info->out_size[1] < 0 ? g.W : info->out_size[1];
  } else {
    g.kh = info->kernel[0], g.kw = info->kernel[1];
    g.sh = info->stride[0], g.sw = info->stride[1];
    g.ph = info->pad_lo[0], g.pw = info->pad_lo[1];
    g.dh = info->dilation[0], g.dw = info->dilation[1];
    g.count_include_pad = info->count_include_pad;
    g.divisor = info->divisor_override;
    g.Ho = pool_out(g.H, g.kh, g.ph, g.sh, g.dh, info->ceil_mode);
    g.Wo = pool_out(g.W, g.kw, g.pw, g.sw, g.dw, info->ceil_mode);
  }
  if (g.Ho <= 0 || g.Wo <= 0 || g.H == 0 || g.W == 0) {
    char got[128];
    return grove_err_set(t->err, GROVE_E_SHAPE, "%s: input %s is too small for the pool", T,
                         grove_shape_str(x->ndim, x->shape, got, sizeof got));
  }
  int64_t shape[4];
  memcpy(shape, x->shape, sizeof shape);
  shape[x->ndim - 2] = g.Ho;
  shape[x->ndim - 1] = g.Wo;
  const bool rg = t->vars[in[0]].requires_grad;
  float *yd;
  int yv = grove__var_alloc(t, GROVE_F32, x->ndim, shape, rg, &yd);
  if (yv < 0) return GROVE_E_NOMEM;
  pool_geom *sv = grove__tscratch(t, sizeof *sv, false);
  if (!sv) return GROVE_E_NOMEM;
  const int64_t OHW = g.Ho * g.Wo, HW = g.H * g.W;
  if (g.kind == GROVE__TK_MAX_POOL2D &&
      !(g.argmax = grove__tscratch(t, (size_t)(g.NC * OHW) * sizeof(int64_t), false)))
    return GROVE_E_NOMEM;
  *sv = g;
  const float *xd = val(t, in[0])->data;
  for (int64_t p = 0; p < g.NC; p++) {
    const float *xp = xd + p * HW;
    float *yp = yd + p * OHW;
    for (int64_t oh = 0; oh < g.Ho; oh++)
      for (int64_t ow = 0; ow < g.Wo; ow++) {
        const int64_t o = oh * g.Wo + ow;
        if (g.kind == GROVE__TK_MAX_POOL2D) {
          /* torch: the first valid position, then `val > max || isnan(val)`
           * (so the last NaN wins and all -inf keeps the first). */
          float best = -INFINITY;
          int64_t arg = -1;
          for (int64_t i = 0; i < g.kh; i++) {
            const int64_t ih = oh * g.sh - g.ph + i * g.dh;
            if (ih < 0 || ih >= g.H) continue;
            for (int64_t j = 0; j < g.kw; j++) {
              const int64_t iw = ow * g.sw - g.pw + j * g.dw;
              if (iw < 0 || iw >= g.W) continue;
              const float v = xp[ih * g.W + iw];
              if (arg < 0) arg = ih * g.W + iw;
              if (v > best || isnan(v)) {
                best = v;
                arg = ih * g.W + iw;
              }
            }
          }
          yp[o] = best;
          sv->argmax[p * OHW + o] = arg;
          continue;
        }
        int64_t h0, h1, w0, w1;
        float div;
        if (g.kind == GROVE__TK_AVG_POOL2D) {
          avg_window(&g, oh, ow, &h0, &h1, &w0, &w1, &div);
        } else {
          adaptive_range(oh, g.Ho, g.H, &h0, &h1);
          adaptive_range(ow, g.Wo, g.W, &w0, &w1);
          div = (float)((h1 - h0) * (w1 - w0));
        }
        float sum = 0;
        for (int64_t ih = h0; ih < h1; ih++)
          for (int64_t iw = w0; iw < w1; iw++) sum += xp[ih * g.W + iw];
        yp[o] = sum / div;
      }
  }
  out[0] = yv;
  *nout = 1;
  if (!rg) return GROVE_OK;
  grove__node n = {
      .backward = pool_backward, .m = m, .nin = 1, .nout = 1, .in = {in[0]}, .out = {yv}};
  n.saved = sv;
  return grove__node_add(t, &n);
}
