/* layers_conv_transpose.c: torch.nn.ConvTranspose1d and ConvTranspose2d,
 * eval mode, with their constructors and model.json builders (the
 * convolutions are in layers_conv.c, which this mirrors).  A 1-d one is the
 * 2-d one over images of one row: its length is the width, its kernel,
 * stride, padding, dilation and output_padding the width's, the height's 1
 * (or 0 for the paddings).
 *
 * A transposed convolution scatters every input pixel into a kh x kw patch
 * of the output: y[co][ih*sh - ph + ki*dh][iw*sw - pw + kj*dw] +=
 * w[ci][co][ki][kj] * x[ci][ih][iw] (per group), plus the bias, with output
 * size (H - 1) * sh - 2 * ph + dh * (kh - 1) + output_padding + 1 (torch's
 * formula).  It is lowered onto Grove's packed GEMM kernel (the one behind
 * Linear and Conv2d's rows path): each image's pixels, channels last, are
 * the rows [H*W, cin_g]; the weight of a group, packed once at refresh as
 * [cout_g * kh * kw, cin_g], gives every pixel's whole patch in one product
 * row; then a col2im pass adds the patches into the NCHW output, one output
 * channel per index of grove__parallel_for, each in the same order (pixels
 * in scan order, then the taps), so the result does not depend on the
 * thread count.  A channels-last input (a convolution's result) is read as
 * it is. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "layers_internal.h"

#define BIG (1 << 20)

typedef struct convt_impl {
  int nd; /* 1: ConvTranspose1d, 2: ConvTranspose2d */
  int64_t cin, cout, groups;
  int64_t k[2], stride[2], pad[2], dil[2], opad[2];
  int64_t cols; /* cout_g * kh * kw: a pixel's patch, one product row */
  bool use_bias;
  grove__linear_pack **packs; /* per group, [cols, cin_g] */
  float *bias;                /* cout floats, zeros without a bias */
} convt_impl;

static void convt_free_impl(void *impl) {
  convt_impl *p = impl;
  if (!p) return;
  grove__packs_free(p->packs, p->groups);
  free(p->bias);
  free(p);
}

static grove_status convt_refresh(grove_module *m, grove_err *err) {
  convt_impl *p = m->impl;
  const char *T = m->type->name;
  const grove_tensor *w = grove_module_param(m, "weight");
  const grove_tensor *b = grove_module_param(m, "bias");
  const int64_t G = p->groups, cin_g = p->cin / G, cout_g = p->cout / G, kk = p->k[0] * p->k[1];
  if (!w) return grove_err_set(err, GROVE_E_INVALID_ARGUMENT, "%s: weight is None", T);
  /* [in, out/groups, (kh,) kw] */
  const int64_t want[4] = {p->cin, cout_g, p->nd == 2 ? p->k[0] : p->k[1], p->k[1]};
  const int wn = p->nd + 2;
  if (w->ndim != wn || memcmp(w->shape, want, (size_t)wn * sizeof(int64_t)) != 0) {
    char got[128], exp[128];
    grove_shape_str(w->ndim, w->shape, got, sizeof got);
    grove_shape_str(wn, want, exp, sizeof exp);
    return grove_err_set(err, GROVE_E_SHAPE, "%s: weight has shape %s, expected %s", T, got, exp);
  }
  grove_status s = grove__conv_check_bias(T, w, b, p->cout, err);
  if (s) return s;
  const int64_t nw = p->cin * cout_g * kk;
  float *wf = malloc((size_t)nw * sizeof(float) + 1);
  float *tmp = malloc((size_t)(p->cols * cin_g) * sizeof(float) + 1);
  float *bias = calloc((size_t)p->cout + 1, sizeof(float));
  grove__linear_pack **packs = calloc((size_t)G, sizeof *packs);
  if (!wf || !tmp || !bias || !packs) s = grove_err_set(err, GROVE_E_NOMEM, "%s: out of memory", T);
  if (!s) s = grove__copy_f32(wf, nw, w, T, "weight", err);
  if (!s && b) s = grove__copy_f32(bias, p->cout, b, T, "bias", err);
  for (int64_t g = 0; !s && g < G; g++) {
    /* [cin_g][cout_g][kk] of this group -> [cout_g * kk][cin_g]. */
    for (int64_t ci = 0; ci < cin_g; ci++)
      for (int64_t j = 0; j < p->cols; j++)
        tmp[j * cin_g + ci] = wf[((g * cin_g + ci) * cout_g) * kk + j];
    if (!(packs[g] = grove__linear_pack_new(tmp, p->cols, cin_g)))
      s = grove_err_set(err, GROVE_E_NOMEM, "%s: out of memory packing the weight", T);
  }
  free(wf);
  free(tmp);
  if (s) {
    grove__packs_free(packs, G);
    free(bias);
    return s;
  }
  grove__packs_free(p->packs, G);
  free(p->bias);
  p->packs = packs;
  p->bias = bias;
  p->use_bias = b != NULL;
  return GROVE_OK;
}

/* torch's output length of one dim. */
static int64_t convt_out_len(const convt_impl *p, int d, int64_t in) {
  return (in - 1) * p->stride[d] - 2 * p->pad[d] + p->dil[d] * (p->k[d] - 1) + p->opad[d] + 1;
}

typedef struct convt_par {
  const convt_impl *p;
  const float *src; /* NCHW image (to_rows) */
  float *dst;
  const float *acc; /* [HW][cols] */
  float *y;         /* the image's NCHW output */
  int64_t g, C, H, W, OH, OW, cin_g;
} convt_par;

/* Rows [b, e) (pixels) of a group's product input from an NHWC image. */
static void par_group_rows(void *ctx, int64_t b, int64_t e) {
  const convt_par *c = ctx;
  for (int64_t q = b; q < e; q++)
    memcpy(c->dst + q * c->cin_g, c->src + q * c->C + c->g * c->cin_g,
           (size_t)c->cin_g * sizeof(float));
}

/* Output channels [b, e) of group g: bias, then every pixel's patch added in
 * scan order. */
static void par_col2im(void *ctx, int64_t b, int64_t e) {
  const convt_par *c = ctx;
  const convt_impl *p = c->p;
  const int64_t kh = p->k[0], kw = p->k[1], kk = kh * kw, OW = c->OW, OH = c->OH;
  for (int64_t co = b; co < e; co++) {
    float *y = c->y + (c->g * (p->cout / p->groups) + co) * OH * OW;
    const float bias = p->bias[c->g * (p->cout / p->groups) + co];
    for (int64_t i = 0; i < OH * OW; i++) y[i] = bias;
    for (int64_t ih = 0; ih < c->H; ih++)
      for (int64_t iw = 0; iw < c->W; iw++) {
        const float *a = c->acc + (ih * c->W + iw) * p->cols + co * kk;
        for (int64_t ki = 0; ki < kh; ki++) {
          const int64_t oh = ih * p->stride[0] - p->pad[0] + ki * p->dil[0];
          if (oh < 0 || oh >= OH) continue;
          float *yr = y + oh * OW;
          for (int64_t kj = 0; kj < kw; kj++) {
            const int64_t ow = iw * p->stride[1] - p->pad[1] + kj * p->dil[1];
            if (ow >= 0 && ow < OW) yr[ow] += a[ki * kw + kj];
          }
        }
      }
  }
}

/* An NCHW image into NHWC, 16 positions a step (as layers_conv.c's). */
static void par_image_nhwc(void *ctx, int64_t b, int64_t e) {
  const convt_par *c = ctx;
  grove__nchw_to_nhwc(c->src, c->dst, c->C, c->H * c->W, b, e);
}

static grove_status convt_forward(const grove_module *m, grove_fwd *f, const grove_values *in,
                                  grove_values *out) {
  const convt_impl *p = m->impl;
  const char *T = m->type->name;
  grove_tensor x;
  grove_status s;
  const bool nhwc_in =
      p->nd == 2 && in->n == 1 && in->v[0].dtype == GROVE_F32 && grove__is_nhwc(&in->v[0]);
  if (nhwc_in)
    x = in->v[0];
  else if ((s = grove__layer_input(T, f, in, GROVE_F32, &x)) != GROVE_OK)
    return s;
  const bool batched = x.ndim == p->nd + 2;
  if ((x.ndim != p->nd + 1 && !batched) || x.shape[batched ? 1 : 0] != p->cin) {
    char want[128];
    snprintf(want, sizeof want, "a %d-d or %d-d input with %lld channels (%s)", p->nd + 1,
             p->nd + 2, (long long)p->cin,
             p->nd == 2 ? "[N, C, H, W] or [C, H, W]" : "[N, C, L] or [C, L]");
    return grove__shape_error(f, T, want, &x);
  }
  const int64_t N = batched ? x.shape[0] : 1, W = x.shape[x.ndim - 1];
  const int64_t H = p->nd == 2 ? x.shape[x.ndim - 2] : 1;
  const int64_t OH = convt_out_len(p, 0, H), OW = convt_out_len(p, 1, W);
  if (OH <= 0 || OW <= 0)
    return grove__shape_error(f, T, "an input whose transposed output size is positive", &x);
  int64_t oshape[4];
  int nd = 0;
  if (batched) oshape[nd++] = N;
  oshape[nd++] = p->cout;
  if (p->nd == 2) oshape[nd++] = OH;
  oshape[nd++] = OW;
  if ((s = grove_fwd_alloc(f, &out->v[0], GROVE_F32, nd, oshape))) return s;
  out->n = 1;
  const int64_t G = p->groups, C = p->cin, cin_g = C / G, cout_g = p->cout / G, HW = H * W;
  if (N == 0) return GROVE_OK;
  if (HW == 0) {
    /* No pixel: the output is the bias alone. */
    float *y = out->v[0].data;
    for (int64_t i = 0; i < N * p->cout; i++)
      for (int64_t q = 0; q < OH * OW; q++) y[i * OH * OW + q] = p->bias[i % p->cout];
    return GROVE_OK;
  }
  float *xt = nhwc_in ? NULL : grove_arena_alloc(f->arena, (size_t)(HW * C) * sizeof(float));
  float *xg = G > 1 ? grove_arena_alloc(f->arena, (size_t)(HW * cin_g) * sizeof(float)) : NULL;
  float *acc = grove_arena_alloc(f->arena, (size_t)(HW * p->cols) * sizeof(float));
  if ((!nhwc_in && !xt) || (G > 1 && !xg) || !acc) return grove__scratch_error(f, T);
  for (int64_t n = 0; n < N; n++) {
    const float *img = (const float *)x.data + n * C * HW;
    if (!nhwc_in) {
      convt_par c = {.src = img, .dst = xt, .C = C, .H = H, .W = W};
      grove__parallel_for((HW + 15) / 16, grove__par_grain(16 * C), par_image_nhwc, &c);
      img = xt;
    }
    for (int64_t g = 0; g < G; g++) {
      const float *rows = img;
      if (G > 1) {
        convt_par c = {.src = img, .dst = xg, .C = C, .g = g, .cin_g = cin_g};
        grove__parallel_for(HW, grove__par_grain(cin_g), par_group_rows, &c);
        rows = xg;
      }
      grove__linear_run(p->packs[g], rows, HW, NULL, acc, GROVE__ACT_NONE);
      convt_par c = {.p = p, .acc = acc, .y = (float *)out->v[0].data + n * p->cout * OH * OW,
                     .g = g, .H = H, .W = W, .OH = OH, .OW = OW};
      grove__parallel_for(cout_g, grove__par_grain(HW * p->k[0] * p->k[1] + OH * OW), par_col2im,
                          &c);
    }
  }
  return GROVE_OK;
}

const grove_module_type grove__conv_transpose2d_type = {
    .name = "ConvTranspose2d",
    .forward = convt_forward,
    .refresh = convt_refresh,
    .free_impl = convt_free_impl,
};

const grove_module_type grove__conv_transpose1d_type = {
    .name = "ConvTranspose1d",
    .forward = convt_forward,
    .refresh = convt_refresh,
    .free_impl = convt_free_impl,
};

/* o's sizes are per dim, the 1-d one's in [0]. */
static grove_status convt_new(int nd, int64_t in_channels, int64_t out_channels,
                              const grove_conv_opts *o, grove_module **out, grove_err *err) {
  *out = NULL;
  const char *T = nd == 1 ? "ConvTranspose1d" : "ConvTranspose2d";
  if (!o) return grove_err_set(err, GROVE_E_INVALID_ARGUMENT, "%s: no options", T);
  const int64_t groups = o->groups ? o->groups : 1;
  if (in_channels <= 0 || out_channels <= 0 || groups <= 0)
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT,
                         "%s: in_channels, out_channels and groups must be positive", T);
  if (in_channels % groups || out_channels % groups)
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT,
                         "%s: in_channels and out_channels must be divisible by groups", T);
  if (o->padding_same || o->padding_valid)
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT,
                         "%s: padding must be numbers (torch has no 'same' or 'valid' here)", T);
  convt_impl *p = calloc(1, sizeof *p);
  if (!p) return grove_err_set(err, GROVE_E_NOMEM, "%s: out of memory", T);
  p->nd = nd;
  p->cin = in_channels;
  p->cout = out_channels;
  p->groups = groups;
  for (int d = 0; d < 2; d++) {
    /* A 1-d one: a height of 1 (k 1, stride 1, no padding), o's [0] the width's. */
    const int od = nd == 2 ? d : 0;
    const bool unit = nd == 1 && d == 0;
    p->k[d] = unit ? 1 : o->kernel_size[od];
    p->stride[d] = unit || !o->stride[od] ? 1 : o->stride[od];
    p->dil[d] = unit || !o->dilation[od] ? 1 : o->dilation[od];
    p->pad[d] = unit ? 0 : o->padding[od];
    p->opad[d] = unit ? 0 : o->output_padding[od];
    if (p->k[d] <= 0 || p->stride[d] <= 0 || p->dil[d] <= 0 || p->pad[d] < 0 || p->opad[d] < 0 ||
        p->k[d] > BIG || p->stride[d] > BIG || p->dil[d] > BIG || p->pad[d] > BIG) {
      free(p);
      return grove_err_set(err, GROVE_E_INVALID_ARGUMENT,
                           "%s: kernel_size, stride and dilation must be positive, padding and "
                           "output_padding non-negative (each at most 2^20)",
                           T);
    }
    /* torch: "output padding must be smaller than either stride or dilation". */
    if (p->opad[d] >= p->stride[d] && p->opad[d] >= p->dil[d]) {
      const long long op = (long long)p->opad[d], st = (long long)p->stride[d],
                      dl = (long long)p->dil[d];
      free(p);
      return grove_err_set(err, GROVE_E_INVALID_ARGUMENT,
                           "%s: output padding must be smaller than either stride or dilation, "
                           "but got output_padding=%lld, stride=%lld, dilation=%lld",
                           T, op, st, dl);
    }
  }
  uint64_t cols, nw;
  if (grove__mul_overflow_u64((uint64_t)(out_channels / groups), (uint64_t)(p->k[0] * p->k[1]),
                              &cols) ||
      grove__mul_overflow_u64(cols, (uint64_t)in_channels, &nw) || nw > ((uint64_t)1 << 40)) {
    free(p);
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT, "%s: the weight is too large", T);
  }
  p->cols = (int64_t)cols;
  grove_module *m = NULL;
  grove_status s = grove__layer_make(
      nd == 1 ? &grove__conv_transpose1d_type : &grove__conv_transpose2d_type, p, &m, err);
  if (s) return s;
  const int64_t wshape[4] = {in_channels, out_channels / groups, nd == 2 ? p->k[0] : p->k[1],
                             p->k[1]};
  return grove__conv_params(m, nd + 2, wshape, out_channels, o->bias, out, err);
}

grove_status grove_conv_transpose2d_new(int64_t in_channels, int64_t out_channels,
                                        const grove_conv_opts *o, grove_module **out,
                                        grove_err *err) {
  return convt_new(2, in_channels, out_channels, o, out, err);
}

grove_status grove_conv_transpose1d_new(int64_t in_channels, int64_t out_channels,
                                        const grove_conv_opts *o, grove_module **out,
                                        grove_err *err) {
  return convt_new(1, in_channels, out_channels, o, out, err);
}

static grove_status convt_from_json(const json_t *obj, const char *path, int nd, grove_module **out,
                                    grove_err *err) {
  static const char *const keys[] = {"in_channels", "out_channels",   "kernel_size",
                                     "stride",      "padding",        "output_padding",
                                     "groups",      "bias",           "dilation",
                                     "padding_mode", NULL};
  const char *T = nd == 1 ? "ConvTranspose1d" : "ConvTranspose2d";
  int64_t cin, cout;
  grove_conv_opts o = {0};
  grove_status s = grove__json_check_keys(obj, path, T, keys, err);
  if (!s) s = grove__conv_json_common(obj, path, T, nd, &cin, &cout, &o, err);
  if (!s) s = grove__json_ints(obj, path, T, "padding", nd, 0, 0, BIG, o.padding, err);
  if (!s)
    s = grove__json_ints(obj, path, T, "output_padding", nd, 0, 0, BIG, o.output_padding, err);
  if (s) return s;
  return grove__json_built(path, convt_new(nd, cin, cout, &o, out, err), err);
}

grove_status grove__conv_transpose2d_from_json(const json_t *obj, const char *path,
                                               grove_module **out, grove_err *err) {
  return convt_from_json(obj, path, 2, out, err);
}

grove_status grove__conv_transpose1d_from_json(const json_t *obj, const char *path,
                                               grove_module **out, grove_err *err) {
  return convt_from_json(obj, path, 1, out, err);
}
