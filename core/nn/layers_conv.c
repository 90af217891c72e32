/* layers_conv.c: the convolutional layers, eval mode: torch.nn.Conv1d and
 * Conv2d (their constructors and model.json builders are in
 * layers_conv_new.c; BatchNorm2d is in
 * layers_norm.c, the poolings in layers_pool.c, the transposes and Winograd
 * transforms in transpose.c and winograd.c).
 *
 * Convolution is lowered onto a matrix product, one of two ways, chosen when
 * the weight is packed (refresh):
 *
 *  - rows (8 or more input and output channels per group, the usual case):
 *    images go through in chunks that fit in cache (ROWS_BUDGET); a chunk is
 *    transposed to NHWC, every output position's patch becomes one row of
 *    K = kh * kw * cin_g floats (whole kernel rows copied kw * C floats at a
 *    time), and Grove's packed GEMM kernel (grove__linear_run, the kernel
 *    behind Linear: AVX-512 where the CPU has it) multiplies the rows by the
 *    weight, packed once with K in the same (ki, kj, c) order.  The product
 *    is [positions, cout_g]; the epilogue transposes it into the NCHW output.
 *    3x3 convolutions with stride 1 (no dilation, one group) take Winograd
 *    F(2x2, 3x3) instead of patch rows: 16 packed products over 4x4 tiles,
 *    2.25 times fewer multiply-adds (see conv_winograd).
 *  - depthwise (groups == in_channels == out_channels: MobileNet's and
 *    EfficientNet's 3x3 and 5x5 layers): no product at all; the kernel of
 *    core/kernels/depthwise.c sums each output's taps over NHWC vectors of
 *    channels with the weight repacked [kh][kw][C], and applies the
 *    epilogue before its one store (see conv_depthwise).  It reads and
 *    writes channels last as the rows path does.
 *  - columns (other grouped convolutions with fewer than 8 channels per
 *    group, e.g. a depthwise one with a channel multiplier; also
 *    GROVE_CONV=columns):
 *    im2col into [K, positions] columns and cblas_sgemm W_g [cout_g, K] x
 *    col, for a run of images at once (COL_BUDGET), so the product is NCHW
 *    already.  A 1x1 convolution with stride 1 and no padding needs no
 *    unrolling in either way.
 *
 * Measured on bench/models_extra.py's CNN (one thread, batch 64, this 2-vCPU
 * AMD EPYC): the columns path through OpenBLAS 0.3.21 (which picks its
 * Haswell kernel here) ran 520 samples/s, the rows path 1070 (cache-sized
 * chunks instead of whole-batch passes, and AVX-512 16 x 16 transposes, were
 * most of the difference between the first rows version and that), with
 * Winograd for the 3x3 layers 1570.
 *
 * Channels last: when its caller allows it (grove_fwd.channels_last_ok: a
 * graph or Sequential whose next layer reads the result), a batched Conv2d
 * on the rows path (or the depthwise kernel) returns its [N, C, H, W] result laid out NHWC, and
 * reads an NHWC input as it is.  BatchNorm2d, the activations, a residual
 * add and a cat along channels (graph_ops.c) and every 2-d pool keep or
 * read that layout; any other layer gets a contiguous copy
 * (grove_tensor_copy, one transpose), and grove_module_forward makes the result contiguous for a
 * caller that did not ask.  So a ResNet's activations stay NHWC from the
 * stem to the pooling and no convolution transposes its input or output.
 *
 * Squeeze-excitation: a 1x1 convolution on the rows path may be given a
 * per-image channel scale with its input (grove_fwd.se.in_scale, from a
 * Sequential whose child before it left out its final `scale * x`); its
 * rows are then the input times the scale (scaled_rows), made block by
 * block into small buffers in cache, instead of the input itself.
 *
 * The bias, and when a graph fuses a following BatchNorm2d and ReLU into the
 * convolution their per-channel scale, shift and clamp, are applied in the
 * one pass that writes the NCHW output (the epilogue).
 *
 * Padding is zeros (torch's padding_mode="zeros"; the other modes are refused
 * by the builders) and may be asymmetric: padding="same" with an even
 * effective kernel pads one more on the right/bottom, as torch does.
 *
 * Every layer here accepts torch's unbatched input too ([C, L] for Conv1d,
 * [C, H, W] for the 2-d layers, except BatchNorm2d, which torch requires to
 * be 4-d). */
#include <assert.h>
#include <cblas.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdatomic.h>
#include <string.h>

#include "layers_conv_internal.h"
#include "layers_internal.h"

/* Bytes of im2col scratch a convolution takes at most per chunk of images
 * (at least one image's worth, whatever its size). */
#define COL_BUDGET ((size_t)4 << 20)
/* The same for the rows path, whose transposes and epilogue also touch
 * every element: a chunk's input, rows and product together (about L2). */
#define ROWS_BUDGET ((size_t)2 << 20)

/* ============================================================ convolution */

/* conv_impl: layers_conv_internal.h (shared with layers_conv_new.c, the
 * constructors and model.json builders). */

static void conv_drop_fold(conv_impl *p) {
  grove__linear_pack_free(p->fold_pack);
  free(p->fold_bias);
  p->fold_pack = NULL;
  p->fold_bias = NULL;
  p->fold_bn = NULL;
}

static void conv_free_packs(conv_impl *p) {
  for (int k = 0; k < 16; k++) {
    grove__linear_pack_free(p->wino[k]);
    p->wino[k] = NULL;
  }
  grove__packs_free(p->packs, p->groups);
  p->packs = NULL;
}

void grove__packs_free(grove__linear_pack **packs, int64_t n) {
  for (int64_t g = 0; packs && g < n; g++) grove__linear_pack_free(packs[g]);
  free(packs);
}

grove_status grove__conv_check_bias(const char *T, const grove_tensor *w, const grove_tensor *b,
                                    int64_t cout, grove_err *err) {
  if (b && (b->ndim != 1 || b->shape[0] != cout)) {
    char got[128];
    grove_shape_str(b->ndim, b->shape, got, sizeof got);
    return grove_err_set(err, GROVE_E_SHAPE, "%s: bias has shape %s, expected [%lld]", T, got,
                         (long long)cout);
  }
  if (!grove_dtype_is_float(w->dtype) || (b && !grove_dtype_is_float(b->dtype)))
    return grove_err_set(err, GROVE_E_DTYPE, "%s: weight and bias must be floating point", T);
  return GROVE_OK;
}

static void conv_free_impl(void *impl) {
  conv_impl *p = impl;
  if (!p) return;
  conv_free_packs(p);
  conv_drop_fold(p);
  free(p->dww);
  free(p);
}

/* A 1x1 convolution whose rows are its input (conv_rows' `direct`). */
static bool direct_1x1(const conv_impl *p) {
  return p->groups == 1 && p->k[0] == 1 && p->k[1] == 1 && p->stride[0] == 1 &&
         p->stride[1] == 1 && p->pad_lo[0] == 0 && p->pad_lo[1] == 0 && p->pad_hi[0] == 0 &&
         p->pad_hi[1] == 0;
}

/* Which lowering a convolution takes.  The rows path gathers cin_g floats at
 * a time from an NHWC copy of the input, so a grouped convolution wants
 * enough channels per group for it; GROVE_CONV=rows|columns|winograd
 * overrides (for measurements and tests). */
static bool want_rows(const conv_impl *p) {
  const char *force = getenv("GROVE_CONV");
  if (force && (strcmp(force, "rows") == 0 || strcmp(force, "winograd") == 0)) return true;
  if (force && strcmp(force, "columns") == 0) return false;
  /* Ungrouped convolutions always: the image stem (3 input channels) too, so
   * that a model's convolutions never mix OpenBLAS's threads with Grove's
   * (with both pools spinning, two cores run three threads). */
  return p->groups == 1 || (p->cin / p->groups >= 8 && p->cout / p->groups >= 8);
}

/* The depthwise kernel (depthwise.c) takes every 2-d convolution with one
 * input and one output channel per group, unless GROVE_CONV forces another
 * lowering ("depthwise" keeps it, for symmetry). */
static bool want_depthwise(const conv_impl *p) {
  const char *force = getenv("GROVE_CONV");
  if (force && strcmp(force, "depthwise") != 0) return false;
  return p->nd == 2 && p->groups > 1 && p->groups == p->cin && p->cout == p->cin;
}

/* Winograd F(2x2, 3x3) takes the 3x3, stride 1, undilated, ungrouped
 * convolutions of the rows path (GROVE_CONV=rows keeps them on plain rows). */
static bool want_winograd(const conv_impl *p) {
  const char *force = getenv("GROVE_CONV");
  if (force && strcmp(force, "winograd") != 0) return false;
  return p->nd == 2 && p->k[0] == 3 && p->k[1] == 3 && p->stride[0] == 1 && p->stride[1] == 1 &&
         p->dil[0] == 1 && p->dil[1] == 1 && p->groups == 1 && p->cin >= 8 && p->cout >= 8;
}

/* U = G g G^T for every (out, in) pair, G = [1 0 0; .5 .5 .5; .5 -.5 .5;
 * 0 0 1]: the 16 matrices [cout, cin] of the transformed weight, packed. */
static grove_status wino_pack(conv_impl *p, grove__linear_pack *out[16]) {
  const int64_t Co = p->cout, Ci = p->cin;
  float *u = malloc((size_t)(16 * Co * Ci) * sizeof(float) + 1);
  if (!u) return GROVE_E_NOMEM;
  for (int64_t o = 0; o < Co; o++)
    for (int64_t c = 0; c < Ci; c++) {
      const float *g = p->w + (o * Ci + c) * 9; /* [3][3] */
      float t[4][3];
      for (int j = 0; j < 3; j++) {
        t[0][j] = g[j];
        t[1][j] = 0.5f * (g[j] + g[3 + j] + g[6 + j]);
        t[2][j] = 0.5f * (g[j] - g[3 + j] + g[6 + j]);
        t[3][j] = g[6 + j];
      }
      for (int r = 0; r < 4; r++) {
        const float v[4] = {t[r][0], 0.5f * (t[r][0] + t[r][1] + t[r][2]),
                            0.5f * (t[r][0] - t[r][1] + t[r][2]), t[r][2]};
        for (int q = 0; q < 4; q++) u[((r * 4 + q) * Co + o) * Ci + c] = v[q];
      }
    }
  grove_status s = GROVE_OK;
  for (int k = 0; k < 16; k++) {
    out[k] = grove__linear_pack_new(u + k * Co * Ci, Co, Ci);
    if (!out[k]) s = GROVE_E_NOMEM;
  }
  free(u);
  if (s)
    for (int k = 0; k < 16; k++) {
      grove__linear_pack_free(out[k]);
      out[k] = NULL;
    }
  return s;
}

/* The pack of group g of the weight w ([cout, K], (c, ki, kj)) for the rows
 * path, K reordered to (ki, kj, c), each output channel o times oscale[o]
 * when oscale is not NULL; tmp is scratch of cout_g * K floats.  NULL when
 * out of memory. */
static grove__linear_pack *pack_group(const conv_impl *p, const float *w, int64_t g,
                                      const float *oscale, float *tmp) {
  const int64_t G = p->groups, cin_g = p->cin / G, cout_g = p->cout / G, K = p->K;
  const int64_t kk = p->k[0] * p->k[1];
  for (int64_t o = 0; o < cout_g; o++) {
    const float *src = w + (g * cout_g + o) * K; /* (c, ki, kj) */
    float *dst = tmp + o * K;                    /* (ki, kj, c) */
    const float a = oscale ? oscale[g * cout_g + o] : 1.0f;
    for (int64_t c = 0; c < cin_g; c++)
      for (int64_t q = 0; q < kk; q++)
        dst[q * cin_g + c] = oscale ? src[c * kk + q] * a : src[c * kk + q];
  }
  return grove__linear_pack_new(tmp, cout_g, K);
}

/* Packs of the weight for the rows path, K reordered to (ki, kj, c). */
static grove_status conv_pack(conv_impl *p, grove_err *err, const char *T) {
  const int64_t G = p->groups, cout_g = p->cout / G, K = p->K;
  grove__linear_pack **packs = calloc((size_t)G, sizeof *packs);
  float *tmp = malloc((size_t)(cout_g * K) * sizeof(float) + 1);
  grove_status s = GROVE_OK;
  if (!packs || !tmp)
    s = grove_err_set(err, GROVE_E_NOMEM, "%s: out of memory packing the weight", T);
  for (int64_t g = 0; !s && g < G; g++) {
    packs[g] = pack_group(p, p->w, g, NULL, tmp);
    if (!packs[g]) s = grove_err_set(err, GROVE_E_NOMEM, "%s: out of memory packing the weight", T);
  }
  free(tmp);
  if (s) {
    grove__packs_free(packs, G);
    return s;
  }
  grove__linear_pack *wino[16] = {NULL};
  if (want_winograd(p) && wino_pack(p, wino)) {
    for (int64_t g = 0; g < G; g++) grove__linear_pack_free(packs[g]);
    free(packs);
    return grove_err_set(err, GROVE_E_NOMEM, "%s: out of memory packing the weight", T);
  }
  conv_free_packs(p);
  p->packs = packs;
  memcpy(p->wino, wino, sizeof wino);
  return GROVE_OK;
}

static grove_status conv_refresh(grove_module *m, grove_err *err) {
  conv_impl *p = m->impl;
  const char *T = m->type->name;
  /* New weights: a BatchNorm folded into the old ones no longer applies
   * (the parent's refresh, which runs after, folds it again). */
  conv_drop_fold(p);
  const grove_tensor *w = grove_module_param(m, "weight");
  const grove_tensor *b = grove_module_param(m, "bias");
  if (!w) return grove_err_set(err, GROVE_E_INVALID_ARGUMENT, "%s: weight is None", T);
  int64_t want[3] = {p->cout, p->cin / p->groups, p->k[1]};
  int wnd = 3;
  if (p->nd == 2) {
    want[2] = p->k[0];
    wnd = 4;
  }
  bool ok = w->ndim == wnd && w->shape[0] == want[0] && w->shape[1] == want[1] &&
            w->shape[2] == want[2] && (wnd == 3 || w->shape[3] == p->k[1]);
  if (!ok) {
    char got[128], exp[128];
    int64_t e[4] = {want[0], want[1], p->k[0], p->k[1]};
    if (p->nd == 1) e[2] = p->k[1];
    grove_shape_str(w->ndim, w->shape, got, sizeof got);
    grove_shape_str(wnd, e, exp, sizeof exp);
    return grove_err_set(err, GROVE_E_SHAPE, "%s: weight has shape %s, expected %s", T, got, exp);
  }
  grove_status s0 = grove__conv_check_bias(T, w, b, p->cout, err);
  if (s0) return s0;
  /* Copies go to scratch first so that a failure leaves impl as it was. */
  float *wf = malloc((size_t)(p->cout * p->K) * sizeof(float) + 1);
  if (!wf) return grove_err_set(err, GROVE_E_NOMEM, "%s: out of memory", T);
  grove_status s = grove__copy_f32(wf, p->cout * p->K, w, T, "weight", err);
  float *old = p->w;
  float *dww = NULL;
  if (!s && want_depthwise(p)) {
    /* [C][1][kh][kw] -> [kh][kw][C]: the taps of neighbouring channels are
     * one vector. */
    const int64_t kk = p->k[0] * p->k[1], C = p->cout;
    if (!(dww = malloc((size_t)(kk * C) * sizeof(float) + 1)))
      s = grove_err_set(err, GROVE_E_NOMEM, "%s: out of memory", T);
    for (int64_t c = 0; dww && c < C; c++)
      for (int64_t q = 0; q < kk; q++) dww[q * C + c] = wf[c * kk + q];
    if (!s) conv_free_packs(p);
  } else if (!s) {
    p->w = wf;
    if (want_rows(p)) {
      s = conv_pack(p, err, T);
    } else {
      conv_free_packs(p);
    }
    p->w = old;
  }
  if (!s) {
    free(p->dww);
    p->dww = dww;
  }
  /* A copy the rows path or the depthwise kernel never reads would be one
   * more resident copy of the weights in every serving version. */
  if (!s && !p->packs && !p->dww) memcpy(p->w, wf, (size_t)(p->cout * p->K) * sizeof(float));
  free(wf);
  if (!s && b) s = grove__copy_f32(p->bias, p->cout, b, T, "bias", err);
  if (s) return s;
  if (!b) memset(p->bias, 0, (size_t)p->cout * sizeof(float));
  p->use_bias = b != NULL;
  return GROVE_OK;
}

/* Output length of one spatial dim, torch's formula. */
static int64_t conv_out_len(const conv_impl *p, int d, int64_t in) {
  int64_t eff = p->dil[d] * (p->k[d] - 1) + 1;
  int64_t span = in + p->pad_lo[d] + p->pad_hi[d] - eff;
  return span < 0 ? -1 : span / p->stride[d] + 1;
}

/* Unrolls the patches of one image's group of channels (x: cin_g planes of
 * H x W) into col rows ((c, ki, kj) major, matching the weight's layout), one
 * column per output position, rows ldc floats apart (core/kernels/im2col.c). */
static void im2col(const conv_impl *p, const float *restrict x, int64_t cin_g, int64_t H, int64_t W,
                   int64_t OH, int64_t OW, float *restrict col, int64_t ldc) {
  const grove__conv_geom g = {.H = H, .W = W, .Ho = OH, .Wo = OW, .kh = p->k[0], .kw = p->k[1],
                              .sh = p->stride[0], .sw = p->stride[1], .ph = p->pad_lo[0],
                              .pw = p->pad_lo[1], .dh = p->dil[0], .dw = p->dil[1]};
  grove__im2col(&g, x, 0, cin_g, col, ldc);
}

/* dst[c][j] = act(src[c][j] * scale[c] + shift[c]) for rows of n floats. */
static void epilogue(float *dst, int64_t ldd, const float *src, int64_t lds, int64_t rows,
                     int64_t n, const float *restrict scale, const float *restrict shift,
                     bool relu) {
  for (int64_t c = 0; c < rows; c++) {
    const float a = scale[c], b = shift[c];
    const float *s = src + c * lds;
    float *d = dst + c * ldd;
    if (relu) {
      for (int64_t j = 0; j < n; j++) {
        float v = s[j] * a + b;
        d[j] = v < 0.0f ? 0.0f : v;
      }
    } else {
      for (int64_t j = 0; j < n; j++) d[j] = s[j] * a + b;
    }
  }
}

/* ------------------------------------------------------------ threads */

/* The work of the rows path around its products (transposes, Winograd
 * transforms, patch rows, epilogues) is cut by grove__parallel_for over
 * output elements, each computed by the same arithmetic whichever thread
 * takes it, so results do not depend on the thread count.  A chunk is at
 * least GROVE__PAR_FLOATS floats of work (grove__par_grain), so that a
 * hand-off (about a microsecond) stays small beside it. */

/* Everything one parallel stage of conv_rows reads; each stage uses some. */
typedef struct conv_par {
  const conv_impl *p;
  const float *src;
  float *dst;
  int64_t C, H, W, OH, OW, HW, P;
  int64_t blocks; /* per image: 16-position blocks (transposes) */
  int64_t TH, TW, T; /* Winograd tiles per column, per row, in the chunk */
  int64_t g, cin_g, cout_g;
  const float *zeros, *scale, *shift;
  bool relu;
  /* An activation other than ReLU fused after the epilogue (NONE: none),
   * applied by the stages that write the NHWC output, on the rows they
   * just wrote (still in cache); an NCHW output gets it in one pass after
   * (act_pass). */
  grove__act post;
  int64_t ldo; /* nhwc_out: floats per output position */
  /* Squeeze-excitation's scale ([images][C], from the chunk's first image)
   * that the 1x1 rows multiply their input by (grove_fwd.se), or NULL. */
  const float *in_scale;
  /* A residual block's add (grove_fwd.res): y = res_act(y + res) on the
   * rows the NHWC stages just wrote; res has the output's layout (ldo ==
   * Cout), from the chunk's first image.  NULL: none (then relu and post
   * are the activation). */
  const float *res;
  grove__act res_act;
} conv_par;

/* Images [i / blocks] of a chunk into NHWC, 16 positions a step. */
static void par_to_nhwc(void *ctx, int64_t b, int64_t e) {
  const conv_par *c = ctx;
  for (int64_t j = b; j < e;) {
    const int64_t i = j / c->blocks, q0 = j % c->blocks;
    const int64_t q1 = e - i * c->blocks < c->blocks ? e - i * c->blocks : c->blocks;
    grove__nchw_to_nhwc(c->src + i * c->C * c->HW, c->dst + i * c->HW * c->C, c->C, c->HW, q0, q1);
    j = i * c->blocks + q1;
  }
}

/* acc [cnt * P, cout_g] -> out [n][g * cout_g + c][p], 16 positions a step
 * (dst is the chunk's first output image). */
static void par_epilogue(void *ctx, int64_t b, int64_t e) {
  const conv_par *c = ctx;
  const int64_t Co = c->p->cout;
  for (int64_t j = b; j < e;) {
    const int64_t i = j / c->blocks, q0 = j % c->blocks;
    const int64_t q1 = e - i * c->blocks < c->blocks ? e - i * c->blocks : c->blocks;
    grove__nhwc_epilogue(c->src + i * c->P * c->cout_g, c->cout_g,
                         c->dst + (i * Co + c->g * c->cout_g) * c->P, c->P, c->cout_g, c->scale,
                         c->shift, c->relu, q0, q1);
    j = i * c->blocks + q1;
  }
}

/* acc [cnt * P, cout_g] -> out [n][p][g * cout_g + c] for rows [b, e). */
GROVE__CHANNEL_LOOP static void par_epilogue_nhwc(void *ctx, int64_t b, int64_t e) {
  const conv_par *c = ctx;
  const int64_t n = c->cout_g;
  const float *sc = c->scale, *sf = c->shift;
  for (int64_t r = b; r < e; r++) {
    const float *ar = c->src + r * n;
    float *yr = c->dst + r * c->ldo + c->g * n;
    if (c->relu) {
      for (int64_t k = 0; k < n; k++) {
        float v = ar[k] * sc[k] + sf[k];
        yr[k] = v < 0.0f ? 0.0f : v;
      }
    } else {
      for (int64_t k = 0; k < n; k++) yr[k] = ar[k] * sc[k] + sf[k];
    }
    grove__act_apply(c->post, yr, yr, n);
    if (c->res) grove__act_add(c->res_act, yr, c->res + r * c->ldo + c->g * n, n);
  }
}

/* Winograd input transform of tiles [b, e) of the chunk: src NHWC, dst V. */
static void par_wino_in(void *ctx, int64_t b, int64_t e) {
  const conv_par *c = ctx;
  const int64_t C = c->C, H = c->H, W = c->W, TH = c->TH, TW = c->TW;
  const int64_t ph = c->p->pad_lo[0], pw = c->p->pad_lo[1];
  for (int64_t t = b; t < e; t++) {
    const int64_t i = t / (TH * TW), ty = t / TW % TH, tx = t % TW;
    const float *d[16];
    for (int a = 0; a < 4; a++)
      for (int q = 0; q < 4; q++) {
        const int64_t iy = 2 * ty - ph + a, ix = 2 * tx - pw + q;
        d[4 * a + q] = (iy < 0 || iy >= H || ix < 0 || ix >= W)
                           ? c->zeros
                           : c->src + i * c->HW * C + (iy * W + ix) * C;
      }
    grove__wino_in(d, C, c->dst + t * C, c->T * C);
  }
}

/* Winograd output transform of tiles [b, e): src M, dst acc (NHWC); with
 * ldo set, dst is the NHWC output itself (ldo floats per position) and the
 * epilogue is applied on the way. */
static void par_wino_out(void *ctx, int64_t b, int64_t e) {
  const conv_par *c = ctx;
  const int64_t Co = c->p->cout, OH = c->OH, OW = c->OW, TH = c->TH, TW = c->TW;
  const int64_t ld = c->ldo ? c->ldo : Co;
  const grove__wino_ep ep = {c->scale, c->shift, c->relu};
  for (int64_t t = b; t < e; t++) {
    const int64_t i = t / (TH * TW), ty = t / TW % TH, tx = t % TW;
    float *y[4];
    for (int a = 0; a < 2; a++)
      for (int q = 0; q < 2; q++) {
        const int64_t oy = 2 * ty + a, ox = 2 * tx + q;
        y[2 * a + q] = (oy < OH && ox < OW) ? c->dst + (i * c->P + oy * OW + ox) * ld : NULL;
      }
    grove__wino_out(c->src + t * Co, c->T * Co, Co, y, c->ldo ? &ep : NULL);
    if (c->ldo)
      for (int k = 0; k < 4; k++)
        if (y[k]) grove__act_apply(c->post, y[k], y[k], Co);
  }
}

/* Rows [b, e) of a 1x1 convolution with an input scale: each row its
 * input position's C channels times the image's scale, the same product
 * x * s per element as the multiply node it replaces (graph_ops.c's
 * chan_chunk), so the convolution's result is the same bits.  Compiled
 * for AVX-512 and AVX2 too, one image's rows at a time (no division per
 * row: at 16 to 96 channels those were most of the time). */
GROVE__CHANNEL_LOOP static void scaled_rows(const conv_par *c, int64_t b, int64_t e,
                                             float *dst) {
  const int64_t C = c->C, P = c->HW;
  for (int64_t row = b; row < e;) {
    const int64_t i = row / P, end = (i + 1) * P < e ? (i + 1) * P : e;
    const float *restrict sc = c->in_scale + i * C;
    for (; row < end; row++) {
      const float *restrict xs = c->src + row * C;
      float *restrict r = dst + (row - b) * C;
      for (int64_t k = 0; k < C; k++) r[k] = xs[k] * sc[k];
    }
  }
}

/* Patch rows [b, e) of the chunk (row = (image, oh, ow)), group g, from the
 * NHWC src into dst rows of K floats. */
static void par_rows(void *ctx, int64_t b, int64_t e) {
  const conv_par *c = ctx;
  if (c->in_scale) {
    scaled_rows(c, b, e, c->dst + b * c->C);
    return;
  }
  const conv_impl *p = c->p;
  const int64_t C = c->C, H = c->H, W = c->W, OH = c->OH, OW = c->OW, K = p->K;
  const int64_t cin_g = c->cin_g, G = p->groups;
  const int64_t kh = p->k[0], kw = p->k[1], sh = p->stride[0], sw = p->stride[1];
  const int64_t dh = p->dil[0], dw = p->dil[1], ph = p->pad_lo[0], pw = p->pad_lo[1];
  if (G == 1 && dw == 1 && kw * C <= 16) {
    /* A stem's kernel rows (3 RGB pixels): one masked move each. */
    const grove__conv_geom g = {.H = H,
                                .W = W,
                                .Ho = OH,
                                .Wo = OW,
                                .kh = kh,
                                .kw = kw,
                                .sh = sh,
                                .sw = sw,
                                .ph = ph,
                                .pw = pw,
                                .dh = dh,
                                .dw = dw};
    if (grove__patch_rows_short(&g, C, c->src, b, e, c->dst + b * K)) return;
  }
  /* (image, oh, ow) of row b, then stepped along: three divisions per
   * row were a third of the patch rows' time for a stem's 27-float rows. */
  int64_t i = b / (OH * OW), oh = b / OW % OH, ow = b % OW - 1;
  for (int64_t row = b; row < e; row++) {
    if (++ow == OW) {
      ow = 0;
      if (++oh == OH) {
        oh = 0;
        i++;
      }
    }
    const float *xi = c->src + i * c->HW * C + c->g * cin_g;
    float *r = c->dst + row * K;
    const int64_t iw0 = ow * sw - pw;
    /* With one group and no dilation, a kernel row's kw pixels are
     * kw * C contiguous floats of the NHWC input. */
    const bool whole = G == 1 && dw == 1 && iw0 >= 0 && iw0 + kw <= W;
    for (int64_t ki = 0; ki < kh; ki++) {
      const int64_t ih = oh * sh - ph + ki * dh;
      if (whole) {
        if (ih < 0 || ih >= H)
          memset(r, 0, (size_t)(kw * C) * sizeof(float));
        else
          memcpy(r, xi + (ih * W + iw0) * C, (size_t)(kw * C) * sizeof(float));
        r += kw * C;
        continue;
      }
      for (int64_t kj = 0; kj < kw; kj++, r += cin_g) {
        const int64_t iw = ow * sw - pw + kj * dw;
        if (ih < 0 || ih >= H || iw < 0 || iw >= W)
          memset(r, 0, (size_t)cin_g * sizeof(float));
        else
          memcpy(r, xi + (ih * W + iw) * C, (size_t)cin_g * sizeof(float));
      }
    }
  }
}

/* ------------------------------------------------------------ fused chunks
 *
 * With Grove's own kernel (grove__linear_pack_native), a chunk of output
 * positions goes from patch rows (or Winograd input transform) through its
 * products to the epilogue (or output transform) on one thread, in cache:
 * one parallel region per convolution instead of one per stage and product
 * (a Winograd convolution made 18, and at batch 1 those hand-offs were what
 * a second thread lost).  Each stage writes the same slice of the same
 * buffer as when the stages run one after another, with the same
 * arithmetic per element, so results do not depend on how the range is
 * cut or on the thread count. */

/* Multiply-adds a fused chunk is given at least, so that a hand-off (about
 * a microsecond) stays small beside it. */
#define FUSED_MIN_MACS ((int64_t)256 << 10)
/* Floats of V and M (Winograd) or of patch rows one pass of a fused chunk
 * touches at most: half of a 1 MB L2.  Each pass reads the whole weight,
 * so short passes cost more than cache misses on the rows: at 64 K floats
 * ResNet-50's layer4 products (K 2048 or 512, 49 positions) went 16 rows a
 * pass and ran at 46% of the FMA peak, all 49 at once at 64%
 * (bench/gemm_shapes.c). */
#define FUSED_STEP_FLOATS ((int64_t)128 << 10)
/* The same for a weight of more than 2 * FUSED_STEP_FLOATS: its reads from
 * L3 then cost more than rows that overflow a 1 MB L2 (ResNet-50's layer4
 * 3x3, 2.4 M floats, made 4 passes over its 49 positions at the bound
 * above, 1 at this one). */
#define FUSED_BIG_STEP_FLOATS ((int64_t)384 << 10)

/* Product rows a fused chunk is given at least where it can: each chunk
 * reads the whole weight, so fewer rows would make the products wait for
 * it (2-row chunks of an 8 x 8 layer at batch 1 read 1 MB per 2 rows). */
#define FUSED_MIN_ROWS 24

/* Indices per chunk for n indices of macs multiply-adds and rows product
 * rows each: at least FUSED_MIN_MACS of work and FUSED_MIN_ROWS rows, and
 * about four chunks per compute thread, so that a helper that comes late
 * still finds work. */
static int64_t fused_grain(int64_t n, int64_t macs, int64_t rows) {
  int64_t lo = (FUSED_MIN_MACS + macs - 1) / (macs > 0 ? macs : 1);
  int64_t lr = (FUSED_MIN_ROWS + rows - 1) / rows;
  int64_t per = (n + 4 * grove_compute_threads() - 1) / (4 * grove_compute_threads());
  if (lr > lo) lo = lr;
  return per > lo ? per : lo;
}

/* The most blocks one pass of a fused chunk takes (fused_step). */
static int64_t fused_most(int64_t floats, int64_t wfloats) {
  const int64_t budget = wfloats > 2 * FUSED_STEP_FLOATS ? FUSED_BIG_STEP_FLOATS : FUSED_STEP_FLOATS;
  const int64_t most = budget / (floats > 0 ? floats : 1);
  return most < 1 ? 1 : most;
}

/* Units per pass of a fused chunk of n units of `floats` each, over a
 * weight of wfloats: as many as FUSED_STEP_FLOATS (or for a large weight
 * FUSED_BIG_STEP_FLOATS) holds, evened out over the passes, so that the
 * last pass is not a remainder of a few rows that reads the whole weight
 * (13 blocks at 12 a pass made a 4-row pass). */
static int64_t fused_step(int64_t n, int64_t floats, int64_t wfloats) {
  const int64_t most = fused_most(floats, wfloats);
  const int64_t passes = (n + most - 1) / most;
  return passes > 1 ? (n + passes - 1) / passes : (n > 0 ? n : 1);
}

typedef struct wino_fused {
  conv_par in, out; /* the input transform's (src xt, dst V) and the output transform's */
  float *V, *M;     /* [16][T][cin], [16][T][cout] */
  int64_t floats;   /* of V and M per tile */
} wino_fused;

/* Tiles [b, e) of a Winograd chunk: transform, 16 products, transform. */
static void par_wino_fused(void *ctx, int64_t b, int64_t e) {
  const wino_fused *w = ctx;
  const conv_impl *p = w->in.p;
  const int64_t C = p->cin, Co = p->cout, T = w->in.T;
  const int64_t step = fused_step(e - b, w->floats, 16 * C * Co);
  for (int64_t t0 = b; t0 < e; t0 += step) {
    const int64_t t1 = e - t0 < step ? e : t0 + step;
    par_wino_in((void *)&w->in, t0, t1);
    for (int k = 0; k < 16; k++)
      grove__linear_run_alone(p->wino[k], w->V + (k * T + t0) * C, t1 - t0, NULL,
                              w->M + (k * T + t0) * Co, GROVE__ACT_NONE);
    par_wino_out((void *)&w->out, t0, t1);
  }
}

/* Products [b, e) of the 16 of a Winograd chunk, each over all its tiles. */
static void par_wino_k(void *ctx, int64_t b, int64_t e) {
  const wino_fused *w = ctx;
  const conv_impl *p = w->in.p;
  const int64_t T = w->in.T;
  for (int64_t k = b; k < e; k++)
    grove__linear_run_alone(p->wino[k], w->V + k * T * p->cin, T, NULL, w->M + k * T * p->cout,
                            GROVE__ACT_NONE);
}

/* The product stage of the rows path by Winograd: cnt images of xt (NHWC)
 * into acc [cnt * P, cout] (NHWC), or, with ldo set, straight into the NHWC
 * output y (ldo floats per position) through the epilogue (scale, shift,
 * relu).  V, M and zeros are scratch of 16 * tiles * cin, 16 * tiles * cout
 * and cin floats. */
static void conv_winograd(const conv_impl *p, const float *xt, int64_t cnt, int64_t H, int64_t W,
                          int64_t OH, int64_t OW, float *V, float *M, const float *zeros,
                          float *acc, int64_t ldo, const float *scale, const float *shift,
                          bool relu, grove__act post) {
  const int64_t C = p->cin, Co = p->cout;
  const int64_t TH = (OH + 1) / 2, TW = (OW + 1) / 2, T = cnt * TH * TW;
  conv_par c = {.p = p, .src = xt, .dst = V, .C = C, .H = H, .W = W, .OH = OH, .OW = OW,
                .HW = H * W, .P = OH * OW, .TH = TH, .TW = TW, .T = T, .zeros = zeros};
  if (grove__linear_pack_native(p->wino[0])) {
    wino_fused w = {.in = c, .out = c, .V = V, .M = M};
    w.out.src = M;
    w.out.dst = acc;
    if (ldo) {
      w.out.ldo = ldo;
      w.out.scale = scale;
      w.out.shift = shift;
      w.out.relu = relu;
      w.out.post = post;
    }
    w.floats = 16 * (C + Co);
    const int threads = grove_compute_threads();
    if (threads == 1 || T >= 2 * threads * FUSED_MIN_ROWS) {
      grove__parallel_for(T, fused_grain(T, 16 * C * Co, 1), par_wino_fused, &w);
      return;
    }
    /* Too few tiles to give every thread rows enough (small images at small
     * batches): the threads share out the 16 products instead, each over
     * every tile, between the two transforms. */
    grove__parallel_for(T, grove__par_grain(32 * C), par_wino_in, &w.in);
    grove__parallel_for(16, 1, par_wino_k, &w);
    grove__parallel_for(T, grove__par_grain(20 * Co), par_wino_out, &w.out);
    return;
  }
  /* OpenBLAS products: each runs on OpenBLAS's threads, between stages. */
  grove__parallel_for(T, grove__par_grain(32 * C), par_wino_in, &c);
  for (int k = 0; k < 16; k++)
    grove__linear_run(p->wino[k], V + k * T * C, T, NULL, M + k * T * Co, GROVE__ACT_NONE);
  c.src = M;
  c.dst = acc;
  grove__parallel_for(T, grove__par_grain(20 * Co), par_wino_out, &c);
}

/* Whether an OH x OW output takes Winograd (when the layer has its packs).
 * Its transformed weight is 16/9 the size of the plain one and its 16
 * products have one row per 2 x 2 tile, so on a small image the products
 * are short and reading the weight dominates: 512 channels at 7 x 7 (16
 * tiles) took 1.7 to 4 times as long as the plain rows (bench/conv_bench.c,
 * batch 1, one thread).  From 49 tiles (a 13 x 13 output) it pays:
 * ResNet-50's layer3 3x3 (256 channels at 14 x 14) took 26% less
 * convolution time than the plain rows at batch 16 and no more at batch 1
 * (per-convolution CPU time in the whole forward, one thread), and from 64
 * tiles (28 x 28 and up) about 0.6 of it.  Decided by the image, not the
 * batch, so that an image's result does not depend on the batch it came
 * in; GROVE_CONV=winograd keeps it everywhere (tests). */
static bool wino_pays(int64_t OH, int64_t OW) {
  const char *force = getenv("GROVE_CONV");
  if (force && strcmp(force, "winograd") == 0) return true;
  return ((OH + 1) / 2) * ((OW + 1) / 2) >= 49;
}

typedef struct rows_fused {
  conv_par rows, ep; /* patch rows (src xt, dst rows) and epilogue (src acc, dst y) */
  const grove__linear_pack *pack;
  const float *x; /* the product's input rows: rows, or xt (direct) */
  float *acc;
  bool direct, nhwc_out;
  /* The product writes the NHWC output itself, its bias and ReLU fused
   * (one group, scale 1: a convolution without a BatchNorm folded in), so
   * no epilogue pass reads it back. */
  bool into_y;
  int64_t blocks, P, K; /* 16-position blocks per image */
  int64_t floats;       /* of patch rows and product per block */
  /* With an input scale (rows.in_scale): each pass's scaled rows go to one
   * of nslots buffers of slot_floats (a chunk takes a free one for its
   * passes; no more chunks run at once than there are compute threads), so
   * they are read by the product from cache, not from a buffer the size of
   * the input. */
  float *slots;
  int64_t slot_floats;
  int nslots;
  _Atomic unsigned busy;
} rows_fused;

static int take_slot(rows_fused *w) {
  for (;;)
    for (int k = 0; k < w->nslots; k++)
      if (!(atomic_fetch_or(&w->busy, 1u << k) & (1u << k))) return k;
}

/* The row of the chunk where 16-position block j begins. */
static int64_t block_row(const rows_fused *w, int64_t j) {
  const int64_t q = (j % w->blocks) * 16;
  return j / w->blocks * w->P + (q < w->P ? q : w->P);
}

/* Blocks [b, e) of a rows chunk: patch rows, product, epilogue. */
static void par_rows_fused(void *ctx, int64_t b, int64_t e) {
  rows_fused *w = ctx;
  const int64_t n = w->ep.cout_g;
  int64_t step = fused_step(e - b, w->floats, w->K * n);
  /* The slots hold slot_floats (sized for this convolution's chunks). */
  if (w->slots && step * 16 * w->K > w->slot_floats) step = w->slot_floats / (16 * w->K);
  const int slot = w->slots ? take_slot(w) : -1;
  float *const buf = w->slots ? w->slots + slot * w->slot_floats : NULL;
  for (int64_t j0 = b; j0 < e; j0 += step) {
    const int64_t j1 = e - j0 < step ? e : j0 + step;
    const int64_t r0 = block_row(w, j0), r1 = block_row(w, j1);
    const float *xr = w->x + r0 * w->K;
    if (buf) {
      scaled_rows(&w->rows, r0, r1, buf);
      xr = buf;
    } else if (!w->direct) {
      par_rows(&w->rows, r0, r1);
    }
    if (w->into_y) {
      /* ldo: floats per output position (Cout, or a cat's channels). */
      const int64_t ldo = w->ep.ldo;
      float *y = w->ep.dst + r0 * ldo;
      /* The product applies the activation: ReLU and ReLU6 in its tiles,
       * any other on each tile's rows while they are in L1 (a pass of its
       * own here was 4.7% of MobileNetV2 for ReLU6 alone). */
      grove__linear_run_alone_ld(w->pack, xr, r1 - r0, w->ep.shift, y, ldo,
                                 w->ep.relu ? GROVE__ACT_RELU : w->ep.post);
      /* Only with ldo == n (conv_forward_packs): the rows still in cache. */
      if (w->ep.res) grove__act_add(w->ep.res_act, y, w->ep.res + r0 * ldo, (r1 - r0) * n);
      continue;
    }
    grove__linear_run_alone(w->pack, xr, r1 - r0, NULL, w->acc + r0 * n, GROVE__ACT_NONE);
    if (w->nhwc_out)
      par_epilogue_nhwc(&w->ep, r0, r1);
    else
      par_epilogue(&w->ep, j0, j1);
  }
  if (buf) atomic_fetch_and(&w->busy, ~(1u << slot));
}

/* The rows path: the input is transposed to NHWC once, each output
 * position's patch becomes one row of K = kh * kw * cin_g floats (copied
 * cin_g at a time, zeros for padding), and Grove's packed GEMM kernel
 * (grove__linear_run: AVX-512 where the CPU has it, and the compute threads)
 * computes rows . W_g^T = [positions, cout_g], which the epilogue transposes
 * into the NCHW output.  A 1x1 convolution with stride 1 and no padding uses
 * the NHWC input itself as its rows. */
static grove_status conv_rows(const conv_impl *p, grove_fwd *f, const float *xd, int64_t N,
                              int64_t H, int64_t W, int64_t OH, int64_t OW, float *yd,
                              const float *scale, const float *shift, bool relu, grove__act post,
                              bool nhwc_in, bool nhwc_out, int64_t ldo,
                              grove__linear_pack *const *packs, const float *in_scale,
                              const float *res, grove__act res_act, const char *T) {
  const int64_t G = p->groups, C = p->cin, cin_g = C / G, cout_g = p->cout / G, K = p->K;
  const int64_t P = OH * OW, HW = H * W;
  /* With an input scale (only a 1x1 convolution gets one) the rows are a
   * scaled copy of the input, made by par_rows like any patch rows. */
  const bool direct = direct_1x1(p) && !in_scale;
  /* Images go through in chunks whose transposed input, rows and product
   * all stay in cache: each chunk reads its input once and writes its
   * output once. */
  const bool wino = p->wino[0] != NULL && wino_pays(OH, OW);
  const int64_t tiles = ((OH + 1) / 2) * ((OW + 1) / 2);
  const int64_t work = wino ? 16 * tiles * (C + p->cout) : direct ? 0 : P * K;
  const size_t per_image = (size_t)(work + HW * C + P * cout_g) * sizeof(float);
  int64_t nb = (int64_t)(ROWS_BUDGET / (per_image ? per_image : 1));
  if (nb < 1) nb = 1;
  if (nb > N) nb = N;
  float *xbuf =
      nhwc_in ? NULL : grove_arena_alloc(f->arena, (size_t)(nb * HW * C) * sizeof(float) + 1);
  /* Fused chunks (Grove's packs, rows enough for every thread; as in the
   * loop below) of a convolution with an input scale make their rows in
   * the slots, so only a chunk of images run stage by stage needs rows. */
  const int64_t last = N - (N - 1) / nb * nb;
#define STAGED(cnt)                                                                          \
  (!grove__linear_pack_native(packs[0]) ||                                                   \
   (grove_compute_threads() > 1 && (cnt) * P < 2 * grove_compute_threads() * FUSED_MIN_ROWS))
  const bool need_rows = !direct && (!in_scale || STAGED(nb) || STAGED(last));
  const bool need_slots = in_scale && (!STAGED(nb) || !STAGED(last));
#undef STAGED
  float *rows =
      need_rows ? grove_arena_alloc(f->arena, (size_t)(nb * work) * sizeof(float) + 1) : NULL;
  float *zeros = wino ? grove_arena_alloc(f->arena, (size_t)C * sizeof(float)) : NULL;
  if (zeros) memset(zeros, 0, (size_t)C * sizeof(float));
  float *acc = grove_arena_alloc(f->arena, (size_t)(nb * P * cout_g) * sizeof(float) + 1);
  /* The fused chunks' buffers for scaled rows (rows_fused.slots). */
  const int nslots = grove_compute_threads() < 31 ? grove_compute_threads() + 1 : 32;
  /* A pass takes at most fused_most blocks and no more than its chunk,
   * whose grain is largest for the largest chunk of images. */
  int64_t slot_blocks = need_slots ? fused_most(16 * (K + cout_g), K * cout_g) : 0;
  if (need_slots) {
    const int64_t nblk = nb * ((P + 15) / 16), g = fused_grain(nblk, 16 * K * cout_g, 16);
    if (g < slot_blocks) slot_blocks = g;
  }
  const int64_t slot_floats = slot_blocks * 16 * K;
  float *slots = need_slots ? grove_arena_alloc(f->arena, (size_t)(nslots * slot_floats) *
                                                              sizeof(float))
                            : NULL;
  if ((!nhwc_in && !xbuf) || (need_rows && !rows) || !acc || (wino && !zeros) ||
      (need_slots && !slots))
    return grove__scratch_error(f, T);
  for (int64_t n0 = 0; n0 < N; n0 += nb) {
    const int64_t cnt = N - n0 < nb ? N - n0 : nb;
    /* xt: the chunk's images in NHWC (the input itself when it already is). */
    const float *xt = nhwc_in ? xd + n0 * HW * C : xbuf;
    if (!nhwc_in) {
      conv_par c = {.src = xd + n0 * C * HW, .dst = xbuf, .C = C, .HW = HW,
                    .blocks = (HW + 15) / 16};
      grove__parallel_for(cnt * c.blocks, grove__par_grain(16 * C), par_to_nhwc, &c);
    }
    for (int64_t g = 0; g < G; g++) {
      conv_par ep = {.p = p,
                     .src = acc,
                     .C = C,
                     .HW = HW,
                     .P = P,
                     .g = g,
                     .cout_g = cout_g,
                     .scale = scale + g * cout_g,
                     .shift = shift + g * cout_g,
                     .relu = relu,
                     .post = nhwc_out ? post : GROVE__ACT_NONE,
                     .res = res ? res + n0 * P * ldo : NULL,
                     .res_act = res_act};
      if (nhwc_out) {
        ep.dst = yd + n0 * P * ldo;
        ep.ldo = ldo;
      } else {
        ep.dst = yd + n0 * p->cout * P;
        ep.blocks = (P + 15) / 16;
      }
      if (wino) {
        /* With an NHWC output, the output transform applies the epilogue. */
        const bool into_y = nhwc_out && grove__linear_pack_native(p->wino[0]);
        conv_winograd(p, xt, cnt, H, W, OH, OW, rows, rows + 16 * cnt * tiles * C, zeros,
                      into_y ? ep.dst : acc, into_y ? ep.ldo : 0, ep.scale, ep.shift, relu,
                      ep.post);
        if (into_y) {
          /* The chunk's output (ldo == Cout with a residual) is in cache. */
          if (ep.res) grove__act_add(res_act, ep.dst, ep.res, cnt * P * ldo);
          continue;
        }
      } else if (grove__linear_pack_native(packs[g]) &&
                 (grove_compute_threads() == 1 ||
                  cnt * P >= 2 * grove_compute_threads() * FUSED_MIN_ROWS || (!rows && !direct))) {
        rows_fused w = {.rows = {.p = p, .src = xt, .dst = rows, .C = C, .H = H, .W = W,
                                 .OH = OH, .OW = OW, .HW = HW, .P = P, .g = g, .cin_g = cin_g,
                                 .in_scale = in_scale ? in_scale + n0 * C : NULL},
                        .ep = ep, .pack = packs[g], .x = direct ? xt : rows, .acc = acc,
                        .direct = direct, .nhwc_out = nhwc_out, .blocks = (P + 15) / 16,
                        .P = P, .K = direct ? C : K,
                        .into_y = nhwc_out && G == 1 && scale == p->ones};
        w.floats = 16 * (K + cout_g);
        if (slots) {
          w.slots = slots;
          w.slot_floats = slot_floats;
          w.nslots = nslots;
        }
        const int64_t nblk = cnt * w.blocks;
        grove__parallel_for(nblk, fused_grain(nblk, 16 * K * cout_g, 16), par_rows_fused, &w);
        continue;
      } else {
        /* OpenBLAS packs, or too few rows to give every thread enough (a
         * 7 x 7 image at batch 1): the stages one after another, so that
         * grove__linear_run gives each thread its own panels of the weight
         * over every row; fused chunks of rows would each read all of it
         * (ResNet-50's layer4, 9.4 MB, read twice for 49 rows).  A 1x1
         * convolution that reads its input as its rows comes here too when
         * the rows are few: squeeze-excitation's two convolutions over one
         * pixel were a single fused chunk, on the caller alone while the
         * other threads waited (#18: mobilenet_v3_large at batch 1 on two
         * threads, 455 -> 495 samples/s).  With a channels-last output and
         * no separate scale, the product writes the output itself, its
         * bias and activation applied by the tiles as in the fused chunks
         * (same bits), instead of an accumulator and an epilogue pass. */
        if (!direct) {
          conv_par c = {.p = p, .src = xt, .dst = rows, .C = C, .H = H, .W = W, .OH = OH,
                        .OW = OW, .HW = HW, .P = P, .g = g, .cin_g = cin_g,
                        .in_scale = in_scale ? in_scale + n0 * C : NULL};
          grove__parallel_for(cnt * P, grove__par_grain(K), par_rows, &c);
        }
        if (nhwc_out && G == 1 && scale == p->ones && grove__linear_pack_native(packs[g])) {
          grove__linear_run_ld(packs[g], direct ? xt : rows, cnt * P, ep.shift, ep.dst, ldo,
                               relu ? GROVE__ACT_RELU : ep.post);
          if (ep.res) grove__act_add(res_act, ep.dst, ep.res, cnt * P * ldo);
          continue;
        }
        grove__linear_run(packs[g], direct ? xt : rows, cnt * P, NULL, acc, GROVE__ACT_NONE);
      }
      if (nhwc_out) {
        /* acc [cnt * P, cout_g] -> out [n][p][g * cout_g + c]: no transpose. */
        grove__parallel_for(cnt * P, grove__par_grain(2 * cout_g), par_epilogue_nhwc, &ep);
        continue;
      }
      /* acc [cnt * P, cout_g] -> out [n][g * cout_g + c][p]. */
      grove__parallel_for(cnt * ep.blocks, grove__par_grain(32 * cout_g), par_epilogue, &ep);
    }
  }
  return GROVE_OK;
}

static bool is_conv(const grove_module *m) {
  return m->type == &grove__conv1d_type || m->type == &grove__conv2d_type;
}

bool grove__conv_rows_path(const grove_module *m) {
  const conv_impl *p = m->impl;
  return is_conv(m) && p->packs != NULL && p->nd == 2;
}

bool grove__conv_depthwise_path(const grove_module *m) {
  return is_conv(m) && ((const conv_impl *)m->impl)->dww != NULL;
}

/* ------------------------------------------------------------ depthwise */

typedef struct dw_par {
  grove__dw_args a;
  const float *x; /* NHWC images */
  float *y;       /* NHWC images */
  const float *src; /* the NHWC result, for the transpose to NCHW */
  float *dst;
  int64_t P, C;
  grove__act post; /* applied to each row after the kernel's clamp */
  bool pairs;      /* grove__depthwise_pairs: two rows of an image at a time */
} dw_par;

/* Output rows [b, e) (row = image * OH + oh), two of the same image at a
 * time where the kernel computes pairs. */
static void par_dw_rows(void *ctx, int64_t b, int64_t e) {
  const dw_par *c = ctx;
  const grove__dw_args *a = &c->a;
  const int64_t n = a->OW * a->C;
  for (int64_t r = b; r < e;) {
    const int64_t i = r / a->OH, oh = r % a->OH;
    float *y = c->y + r * n;
    const float *xi = c->x + i * a->H * a->W * a->C;
    if (c->pairs && r + 1 < e && oh + 1 < a->OH) {
      grove__depthwise_rows2(a, xi, oh, y, y + n);
      grove__act_apply(c->post, y, y, 2 * n);
      r += 2;
      continue;
    }
    grove__depthwise_row(a, xi, oh, y);
    grove__act_apply(c->post, y, y, n);
    r++;
  }
}

/* Images [b, e) of the NHWC result into the NCHW output. */
static void par_dw_to_nchw(void *ctx, int64_t b, int64_t e) {
  const dw_par *c = ctx;
  for (int64_t i = b; i < e; i++)
    grove__transpose_f32(c->src + i * c->P * c->C, c->dst + i * c->C * c->P, c->P, c->C);
}

/* The depthwise path: the input in NHWC (transposed once unless it already
 * is), each output row computed by grove__depthwise_row with the epilogue
 * applied (the clamp at zero for a fused ReLU), written NHWC, then
 * transposed into the NCHW output unless the caller takes channels last.
 * Rows are independent and computed the same way by any thread. */
static grove_status conv_depthwise(const conv_impl *p, grove_fwd *f, const float *xd, int64_t N,
                                   int64_t H, int64_t W, int64_t OH, int64_t OW, float *yd,
                                   const float *scale, const float *shift, grove__act act,
                                   bool nhwc_in, bool nhwc_out, const char *T) {
  const int64_t C = p->cin, HW = H * W, P = OH * OW;
  float *xbuf = nhwc_in ? NULL : grove_arena_alloc(f->arena, (size_t)(N * HW * C) * sizeof(float));
  float *ybuf = nhwc_out ? NULL : grove_arena_alloc(f->arena, (size_t)(N * P * C) * sizeof(float));
  if ((!nhwc_in && !xbuf) || (!nhwc_out && !ybuf)) return grove__scratch_error(f, T);
  if (!nhwc_in) {
    conv_par c = {.src = xd, .dst = xbuf, .C = C, .HW = HW, .blocks = (HW + 15) / 16};
    grove__parallel_for(N * c.blocks, grove__par_grain(16 * C), par_to_nhwc, &c);
  }
  dw_par c = {.a = {.H = H, .W = W, .C = C, .OH = OH, .OW = OW, .kh = p->k[0], .kw = p->k[1],
                    .sh = p->stride[0], .sw = p->stride[1], .dh = p->dil[0], .dw = p->dil[1],
                    .ph = p->pad_lo[0], .pw = p->pad_lo[1], .w = p->dww, .scale = scale,
                    .shift = shift, .lo = -INFINITY, .hi = INFINITY},
              .x = nhwc_in ? xd : xbuf, .y = nhwc_out ? yd : ybuf, .P = P, .C = C};
  /* ReLU and ReLU6 are the kernel's own clamp (the same comparisons as
   * grove__act_apply's), Hardswish and Hardsigmoid its last step; the
   * others follow on each row. */
  if (act == GROVE__ACT_RELU || act == GROVE__ACT_RELU6) {
    c.a.lo = 0.0f;
    if (act == GROVE__ACT_RELU6) c.a.hi = 6.0f;
  } else if (act == GROVE__ACT_HARDSWISH || act == GROVE__ACT_HARDSIGMOID) {
    c.a.post = act;
  } else {
    c.post = act;
  }
  /* Pairs: chunks of an even number of rows, so that a pair is not cut. */
  c.pairs = grove__depthwise_pairs(&c.a);
  int64_t grain = grove__par_grain(OW * C * p->k[0] * p->k[1]);
  if (c.pairs) grain += grain & 1;
  grove__parallel_for(N * OH, grain, par_dw_rows, &c);
  if (!nhwc_out) {
    c.src = ybuf;
    c.dst = yd;
    grove__parallel_for(N, grove__par_grain(2 * P * C), par_dw_to_nchw, &c);
  }
  return GROVE_OK;
}

/* The fused activation over a whole output, for the paths that write it
 * NCHW (a stage per channel plane would cut each call into short runs). */
static void act_pass(grove__act act, float *y, int64_t n) {
  grove__act_inplace_par(act, y, n);
}

/* Makes *y the caller's slice of a concatenation (grove_fwd.into) for an
 * [N, Cout, OH, OW] result, allocating the concatenation's buffer when it
 * is the first of its parts to run.  False (y untouched) when there is no
 * slice, it does not fit these channels, the buffer has another batch or
 * size, or it cannot be allocated (the result then gets its own tensor,
 * and the cat copies it as any other). */
static bool into_slice(grove_fwd *f, const conv_impl *p, int64_t N, int64_t OH, int64_t OW,
                       grove_tensor *y) {
  const int64_t C = f->into.channels, off = f->into.offset;
  if (C <= 0 || off < 0 || off > C - p->cout) return false;
  if (!f->into.data) {
    uint64_t n;
    if (grove__mul_overflow_u64((uint64_t)N * (uint64_t)C, (uint64_t)(OH * OW), &n) ||
        n > SIZE_MAX / sizeof(float) / 2)
      return false;
    float *d = grove_arena_alloc(f->arena, (size_t)n * sizeof(float) + 1);
    if (!d) return false;
    f->into.data = d;
    f->into.n = N;
    f->into.h = OH;
    f->into.w = OW;
  } else if (f->into.n != N || f->into.h != OH || f->into.w != OW) {
    return false;
  }
  const int64_t shape[4] = {N, p->cout, OH, OW};
  grove_tensor_init(y, GROVE_F32, 4, shape, f->into.data + off);
  y->strides[0] = OH * OW * C;
  y->strides[1] = 1;
  y->strides[2] = OW * C;
  y->strides[3] = C;
  return true;
}

/* grove__conv_forward_ex with the rows path's packs given (p->packs, or
 * the folded BatchNorm's pack, one group). */
static grove_status conv_forward_packs(const grove_module *m, grove_fwd *f, const grove_values *in,
                                       grove_values *out, const float *scale, const float *shift,
                                       grove__act act, bool out_nhwc,
                                       grove__linear_pack *const *packs) {
  const conv_impl *p = m->impl;
  const char *T = m->type->name;
  grove_tensor x;
  grove_status s;
  /* Squeeze-excitation's scale, left to this convolution by a Sequential
   * (grove_fwd.se), which checked grove__conv_takes_in_scale. */
  const float *in_scale = f->se.in_scale;
  f->se.in_scale = NULL;
  const grove_tensor *rt = f->res.t;
  f->res.t = NULL;
  f->res.done = false;
  if (in_scale && !grove__conv_takes_in_scale(m))
    return grove_err_set(f->err, GROVE_E_INTERNAL, "%s: given an input scale it cannot apply", T);
  /* An NHWC input (from a convolution before this one) is read as it is by
   * the rows path; anything else strided is made contiguous first. */
  const bool nhwc_in = in->n == 1 && (p->packs || p->dww) && p->nd == 2 &&
                       in->v[0].dtype == GROVE_F32 && grove__is_nhwc(&in->v[0]);
  if (nhwc_in) {
    x = in->v[0];
  } else if ((s = grove__layer_input(T, f, in, GROVE_F32, &x)) != GROVE_OK) {
    return s;
  }
  /* Batched [N, C, (H,) W] or unbatched [C, (H,) W]. */
  const int full = p->nd + 2;
  bool batched = x.ndim == full;
  if ((x.ndim != full && x.ndim != full - 1) || x.shape[batched ? 1 : 0] != p->cin) {
    char want[128];
    snprintf(want, sizeof want, "a %d-d or %d-d input with %lld channels (%s)", full - 1, full,
             (long long)p->cin, p->nd == 1 ? "[N, C, L] or [C, L]" : "[N, C, H, W] or [C, H, W]");
    return grove__shape_error(f, T, want, &x);
  }
  const int64_t N = batched ? x.shape[0] : 1;
  const int64_t H = p->nd == 2 ? x.shape[x.ndim - 2] : 1, W = x.shape[x.ndim - 1];
  const int64_t OH = conv_out_len(p, 0, H), OW = conv_out_len(p, 1, W);
  if (OH <= 0 || OW <= 0) {
    char want[160];
    snprintf(want, sizeof want,
             "an input at least as large as the dilated kernel after padding (kernel %lld x "
             "%lld, dilation %lld x %lld)",
             (long long)p->k[0], (long long)p->k[1], (long long)p->dil[0], (long long)p->dil[1]);
    return grove__shape_error(f, T, want, &x);
  }
  int64_t oshape[GROVE_MAX_DIMS];
  int nd = 0;
  if (batched) oshape[nd++] = N;
  oshape[nd++] = p->cout;
  if (p->nd == 2) oshape[nd++] = OH;
  oshape[nd++] = OW;
  out_nhwc = out_nhwc && (p->packs || p->dww) && p->nd == 2 && batched;
  /* Floats per output position of an NHWC output: Cout, or the channels of
   * the concatenation whose slice the result is (grove_fwd.into). */
  int64_t ldo = p->cout;
  if (out_nhwc && !p->dww && into_slice(f, p, N, OH, OW, &out->v[0])) {
    ldo = f->into.channels;
  } else {
    s = grove_fwd_alloc(f, &out->v[0], GROVE_F32, nd, oshape);
    if (s != GROVE_OK) return s;
    /* The same [N, Cout, OH, OW] tensor, its memory laid out NHWC. */
    if (out_nhwc) grove__set_nhwc(&out->v[0]);
  }
  out->n = 1;
  if (N == 0) return GROVE_OK;
  if (!scale) scale = p->ones;
  if (!shift) shift = p->bias;

  const int64_t G = p->groups, cin_g = p->cin / G, cout_g = p->cout / G, K = p->K;
  const int64_t P = OH * OW, HW = H * W;
  const float *xd = x.data;
  float *yd = out->v[0].data;
  /* A residual (grove_fwd.res) on the rows path's NHWC output of its own
   * (no cat slice): then act follows the add, not the epilogue. */
  const float *res = NULL;
  const grove__act res_act = rt ? (grove__act)f->res.act : GROVE__ACT_NONE;
  if (rt && p->packs && !p->dww && out_nhwc && ldo == p->cout && rt->dtype == GROVE_F32 &&
      rt->ndim == 4 && grove_tensor_same_shape(rt, &out->v[0]) &&
      memcmp(rt->strides, out->v[0].strides, 4 * sizeof(int64_t)) == 0 && rt->data) {
    res = rt->data;
    act = GROVE__ACT_NONE;
  }
  f->res.done = res != NULL;
  /* ReLU is every path's own clamp; any other activation follows the
   * epilogue (in the stages that write an NHWC output, else act_pass). */
  const bool relu = act == GROVE__ACT_RELU;
  const grove__act post = relu ? GROVE__ACT_NONE : act;
  const int64_t numel = grove_tensor_numel(&out->v[0]);
  if (p->dww)
    return conv_depthwise(p, f, xd, N, H, W, OH, OW, yd, scale, shift, act, nhwc_in, out_nhwc,
                          T);
  if (p->packs) {
    s = conv_rows(p, f, xd, N, H, W, OH, OW, yd, scale, shift, relu, post, nhwc_in, out_nhwc, ldo,
                  packs, in_scale, res, res_act, T);
    if (!s && !out_nhwc) act_pass(post, yd, numel);
    return s;
  }
  const bool direct = p->k[0] == 1 && p->k[1] == 1 && p->stride[0] == 1 && p->stride[1] == 1 &&
                      p->pad_lo[0] == 0 && p->pad_lo[1] == 0 && p->pad_hi[0] == 0 &&
                      p->pad_hi[1] == 0;
  if (direct) {
    /* A 1x1 convolution: each image's group is already [cin_g, P]. */
    for (int64_t n = 0; n < N; n++) {
      for (int64_t g = 0; g < G; g++) {
        float *y = yd + (n * p->cout + g * cout_g) * P;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (blasint)cout_g, (blasint)P,
                    (blasint)K, 1.0f, p->w + g * cout_g * K, (blasint)K,
                    xd + (n * p->cin + g * cin_g) * HW, (blasint)P, 0.0f, y, (blasint)P);
        epilogue(y, P, y, P, cout_g, P, scale + g * cout_g, shift + g * cout_g, relu);
      }
    }
    act_pass(post, yd, numel);
    return GROVE_OK;
  }
  /* Images per chunk: as many as fit the column budget, at least one. */
  const size_t per_image = (size_t)K * (size_t)P * sizeof(float);
  int64_t nb = (int64_t)(COL_BUDGET / (per_image ? per_image : 1));
  if (nb < 1) nb = 1;
  if (nb > N) nb = N;
  float *col = grove_arena_alloc(f->arena, (size_t)nb * per_image);
  float *tmp =
      nb > 1 ? grove_arena_alloc(f->arena, (size_t)nb * (size_t)cout_g * (size_t)P * sizeof(float))
             : NULL;
  if (!col || (nb > 1 && !tmp)) return grove__scratch_error(f, T);
  for (int64_t n0 = 0; n0 < N; n0 += nb) {
    const int64_t cnt = N - n0 < nb ? N - n0 : nb;
    const int64_t ldc = cnt * P;
    for (int64_t g = 0; g < G; g++) {
      for (int64_t i = 0; i < cnt; i++)
        im2col(p, xd + ((n0 + i) * p->cin + g * cin_g) * HW, cin_g, H, W, OH, OW, col + i * P, ldc);
      if (cnt == 1) {
        float *y = yd + (n0 * p->cout + g * cout_g) * P;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (blasint)cout_g, (blasint)P,
                    (blasint)K, 1.0f, p->w + g * cout_g * K, (blasint)K, col, (blasint)P, 0.0f, y,
                    (blasint)P);
        epilogue(y, P, y, P, cout_g, P, scale + g * cout_g, shift + g * cout_g, relu);
        continue;
      }
      /* tmp [cout_g, cnt * P]: image i's block sits at column i * P. */
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (blasint)cout_g, (blasint)ldc,
                  (blasint)K, 1.0f, p->w + g * cout_g * K, (blasint)K, col, (blasint)ldc, 0.0f, tmp,
                  (blasint)ldc);
      for (int64_t i = 0; i < cnt; i++)
        epilogue(yd + ((n0 + i) * p->cout + g * cout_g) * P, P, tmp + i * P, ldc, cout_g, P,
                 scale + g * cout_g, shift + g * cout_g, relu);
    }
  }
  act_pass(post, yd, numel);
  return GROVE_OK;
}

grove_status grove__conv_forward_ex(const grove_module *m, grove_fwd *f, const grove_values *in,
                                    grove_values *out, const float *scale, const float *shift,
                                    grove__act act, bool out_nhwc) {
  const conv_impl *p = m->impl;
  return conv_forward_packs(m, f, in, out, scale, shift, act, out_nhwc, p->packs);
}

static grove_status conv_forward(const grove_module *m, grove_fwd *f, const grove_values *in,
                                 grove_values *out) {
  return grove__conv_forward_ex(m, f, in, out, NULL, NULL, GROVE__ACT_NONE, f->channels_last_ok);
}

grove_status grove__conv_bn_act_forward(const grove_module *conv, const grove_module *bn,
                                        grove__act act, grove_fwd *f, const grove_values *in,
                                        grove_values *out, bool out_nhwc) {
  const float *scale = NULL, *shift = NULL;
  if (bn) {
    const float *bs, *bt;
    bool ok = grove__bn2d_affine(bn, &bs, &bt);
    assert(ok); /* the caller checked grove__conv_bn_fusable */
    (void)ok;
    const int64_t C = grove__conv_out_channels(conv);
    const conv_impl *p = conv->impl;
    /* Folded into the weight when the parent was refreshed, from this
     * BatchNorm's present statistics: the product writes the output. */
    if (p->fold_bn == bn && memcmp(p->fold_bias + C, bs, (size_t)C * sizeof(float)) == 0 &&
        memcmp(p->fold_bias + 2 * C, bt, (size_t)C * sizeof(float)) == 0) {
      grove__linear_pack *const one[1] = {p->fold_pack};
      return conv_forward_packs(conv, f, in, out, p->ones, p->fold_bias, act, out_nhwc, one);
    }
    const float *cb = grove__conv_bias(conv);
    float *tmp = grove_arena_alloc(f->arena, (size_t)C * 2 * sizeof(float));
    if (!tmp) return grove__scratch_error(f, conv->type->name);
    /* bn(conv(x) + b) = conv(x) * s + (b * s + t). */
    for (int64_t c = 0; c < C; c++) {
      tmp[c] = bs[c];
      tmp[C + c] = cb[c] * bs[c] + bt[c];
    }
    scale = tmp;
    shift = tmp + C;
  }
  return grove__conv_forward_ex(conv, f, in, out, scale, shift, act, out_nhwc);
}

grove__act grove__fusable_act(const grove_module *m) {
  const grove_module_type *t = m->type;
  if (t == &grove__relu_type) return GROVE__ACT_RELU;
  if (t == &grove__relu6_type) return GROVE__ACT_RELU6;
  if (t == &grove__hardswish_type) return GROVE__ACT_HARDSWISH;
  if (t == &grove__hardsigmoid_type) return GROVE__ACT_HARDSIGMOID;
  if (t == &grove__silu_type) return GROVE__ACT_SILU;
  if (t == &grove__sigmoid_type) return GROVE__ACT_SIGMOID;
  return GROVE__ACT_NONE;
}

grove_status grove__conv_fold_bn(grove_module *conv, const grove_module *bn, grove_err *err) {
  conv_impl *p = conv->impl;
  conv_drop_fold(p);
  const float *bs, *bt;
  /* Only where it removes a pass: the rows path's own products (Winograd
   * and the depthwise kernel apply the epilogue in their output stage). */
  if (!grove__conv_bn_fusable(conv, bn) || !p->packs || p->wino[0] || p->groups != 1 ||
      !grove__linear_pack_native(p->packs[0]) || !grove__bn2d_affine(bn, &bs, &bt))
    return GROVE_OK;
  const char *T = conv->type->name;
  const grove_tensor *w = grove_module_param(conv, "weight");
  const int64_t C = p->cout, n = C * p->K;
  float *wf = malloc((size_t)n * sizeof(float)), *tmp = malloc((size_t)n * sizeof(float));
  float *fb = malloc((size_t)(3 * C) * sizeof(float));
  grove_status s = GROVE_OK;
  if (!wf || !tmp || !fb) s = grove_err_set(err, GROVE_E_NOMEM, "%s: out of memory", T);
  if (!s) s = grove__copy_f32(wf, n, w, T, "weight", err);
  grove__linear_pack *pk = s ? NULL : pack_group(p, wf, 0, bs, tmp);
  if (!s && !pk) s = grove_err_set(err, GROVE_E_NOMEM, "%s: out of memory packing the weight", T);
  free(wf);
  free(tmp);
  if (s) {
    free(fb);
    return s;
  }
  /* The same shift as the unfolded epilogue's: bn(conv(x) + b) =
   * conv(x) * s + (b * s + t). */
  for (int64_t c = 0; c < C; c++) fb[c] = p->bias[c] * bs[c] + bt[c];
  memcpy(fb + C, bs, (size_t)C * sizeof(float));
  memcpy(fb + 2 * C, bt, (size_t)C * sizeof(float));
  p->fold_pack = pk;
  p->fold_bias = fb;
  p->fold_bn = bn;
  return GROVE_OK;
}

bool grove__conv_fold_active(const grove_module *conv, const grove_module *bn) {
  const conv_impl *p = conv->impl;
  return is_conv(conv) && p->fold_bn == bn && p->fold_pack != NULL;
}

bool grove__conv_bn_fusable(const grove_module *conv, const grove_module *bn) {
  const float *a, *b;
  return conv->type == &grove__conv2d_type && bn->type == &grove__batch_norm2d_type &&
         grove__bn2d_channels(bn) == grove__conv_out_channels(conv) &&
         grove__bn2d_affine(bn, &a, &b);
}

const grove_module_type grove__conv1d_type = {
    .name = "Conv1d",
    .forward = conv_forward,
    .refresh = conv_refresh,
    .free_impl = conv_free_impl,
};
const grove_module_type grove__conv2d_type = {
    .name = "Conv2d",
    .forward = conv_forward,
    .refresh = conv_refresh,
    .free_impl = conv_free_impl,
};

int64_t grove__conv_out_channels(const grove_module *m) {
  return ((const conv_impl *)m->impl)->cout;
}

int64_t grove__conv_in_channels(const grove_module *m) {
  return ((const conv_impl *)m->impl)->cin;
}

bool grove__conv_takes_in_scale(const grove_module *m) {
  const conv_impl *p = m->impl;
  return m->type == &grove__conv2d_type && p->nd == 2 && p->packs && !p->dww && direct_1x1(p);
}

const float *grove__conv_bias(const grove_module *m) {
  return ((const conv_impl *)m->impl)->bias;
}

void grove__conv_settings(const grove_module *m, grove__layer_settings *s) {
  const conv_impl *p = m->impl;
  s->conv_dims = p->nd;
  s->in_channels = p->cin;
  s->out_channels = p->cout;
  s->groups = p->groups;
  for (int d = 0; d < 2; d++) {
    s->kernel[d] = p->k[d];
    s->stride[d] = p->stride[d];
    s->dilation[d] = p->dil[d];
    s->pad_lo[d] = p->pad_lo[d];
    s->pad_hi[d] = p->pad_hi[d];
  }
  if (p->nd == 1) s->pad_lo[0] = s->pad_hi[0] = 0;
}
