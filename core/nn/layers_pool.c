/* layers_pool.c: the pooling layers, eval mode: torch.nn.MaxPool2d,
 * AvgPool2d and AdaptiveAvgPool2d, with their constructors and model.json
 * builders (split out of layers_conv.c).  Each plane (or, for a channels-last
 * input from a convolution, each output row) is one index of
 * grove__parallel_for.  Every layer accepts torch's unbatched [C, H, W]
 * input too. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "layers_internal.h"

/* The largest kernel, stride, padding or dilation model.json may give (as
 * layers_conv.c's). */
#define BIG (1 << 20)

/* ============================================================ pooling */

enum { POOL_MAX, POOL_AVG, POOL_ADAPTIVE };

typedef struct pool_impl {
  int kind;
  int64_t k[2], stride[2], pad[2], dil[2];
  bool ceil_mode, count_include_pad;
  int64_t divisor;  /* 0: None */
  int64_t osize[2]; /* adaptive: -1 = the input's size */
} pool_impl;

/* torch's pooling_output_shape. */
void grove__pool_settings(const grove_module *m, grove__layer_settings *s) {
  const pool_impl *p = m->impl;
  for (int d = 0; d < 2; d++) {
    s->kernel[d] = p->k[d];
    s->stride[d] = p->stride[d];
    s->pad_lo[d] = s->pad_hi[d] = p->pad[d];
    s->dilation[d] = p->kind == POOL_MAX ? p->dil[d] : 1;
    s->out_size[d] = p->osize[d];
  }
  s->ceil_mode = p->ceil_mode;
  s->count_include_pad = p->kind == POOL_MAX || p->count_include_pad;
  s->divisor_override = p->divisor;
}

static int64_t pool_out_len(const pool_impl *p, int d, int64_t in) {
  int64_t eff = p->dil[d] * (p->k[d] - 1) + 1;
  int64_t num = in + 2 * p->pad[d] - eff + (p->ceil_mode ? p->stride[d] - 1 : 0);
  if (num < 0) return 0;
  int64_t o = num / p->stride[d] + 1;
  if (p->ceil_mode && (o - 1) * p->stride[d] >= in + p->pad[d]) o--;
  return o;
}

static void max_plane(const pool_impl *p, const float *restrict x, int64_t H, int64_t W,
                      float *restrict y, int64_t OH, int64_t OW) {
  for (int64_t oh = 0; oh < OH; oh++) {
    const int64_t h0 = oh * p->stride[0] - p->pad[0];
    for (int64_t ow = 0; ow < OW; ow++) {
      const int64_t w0 = ow * p->stride[1] - p->pad[1];
      float best = -INFINITY;
      for (int64_t i = 0; i < p->k[0]; i++) {
        const int64_t ih = h0 + i * p->dil[0];
        if (ih < 0 || ih >= H) continue;
        const float *r = x + ih * W;
        for (int64_t j = 0; j < p->k[1]; j++) {
          const int64_t iw = w0 + j * p->dil[1];
          if (iw < 0 || iw >= W) continue;
          const float v = r[iw];
          /* NaN wins, as in torch. */
          if (v > best || isnan(v)) best = v;
        }
      }
      y[oh * OW + ow] = best;
    }
  }
}

/* torch's avg_pool2d: the divisor counts the padded window (clipped to the
 * padded input) unless count_include_pad is false. */
static void avg_plane(const pool_impl *p, const float *restrict x, int64_t H, int64_t W,
                      float *restrict y, int64_t OH, int64_t OW) {
  for (int64_t oh = 0; oh < OH; oh++) {
    int64_t hs = oh * p->stride[0] - p->pad[0];
    int64_t he = hs + p->k[0] < H + p->pad[0] ? hs + p->k[0] : H + p->pad[0];
    const int64_t hpool = he - hs;
    if (hs < 0) hs = 0;
    if (he > H) he = H;
    for (int64_t ow = 0; ow < OW; ow++) {
      int64_t ws = ow * p->stride[1] - p->pad[1];
      int64_t we = ws + p->k[1] < W + p->pad[1] ? ws + p->k[1] : W + p->pad[1];
      const int64_t pool = hpool * (we - ws);
      if (ws < 0) ws = 0;
      if (we > W) we = W;
      if (hs >= he || ws >= we) {
        y[oh * OW + ow] = 0.0f;
        continue;
      }
      double sum = 0;
      for (int64_t ih = hs; ih < he; ih++)
        for (int64_t iw = ws; iw < we; iw++) sum += x[ih * W + iw];
      const int64_t div = p->divisor             ? p->divisor
                          : p->count_include_pad ? pool
                                                 : (he - hs) * (we - ws);
      y[oh * OW + ow] = (float)(sum / (double)div);
    }
  }
}

static void adaptive_plane(const float *restrict x, int64_t H, int64_t W, float *restrict y,
                           int64_t OH, int64_t OW) {
  for (int64_t oh = 0; oh < OH; oh++) {
    const int64_t hs = oh * H / OH, he = ((oh + 1) * H + OH - 1) / OH;
    for (int64_t ow = 0; ow < OW; ow++) {
      const int64_t ws = ow * W / OW, we = ((ow + 1) * W + OW - 1) / OW;
      double sum = 0;
      for (int64_t ih = hs; ih < he; ih++)
        for (int64_t iw = ws; iw < we; iw++) sum += x[ih * W + iw];
      y[oh * OW + ow] = (float)(sum / (double)((he - hs) * (we - ws)));
    }
  }
}

/* Planes [b, e) of one pooling forward (grove__parallel_for). */
typedef struct pool_par {
  const pool_impl *p;
  const float *x;
  float *y;
  int64_t H, W, OH, OW;
  int64_t C;   /* channels last: floats per position */
  double *acc; /* AdaptiveAvgPool2d to 1 x 1, channels last: C doubles per image */
} pool_par;

static void pool_planes(void *ctx, int64_t b, int64_t e) {
  const pool_par *c = ctx;
  const pool_impl *p = c->p;
  const int64_t H = c->H, W = c->W, OH = c->OH, OW = c->OW;
  for (int64_t pl = b; pl < e; pl++) {
    const float *xp = c->x + pl * H * W;
    float *yp = c->y + pl * OH * OW;
    if (p->kind == POOL_MAX)
      max_plane(p, xp, H, W, yp, OH, OW);
    else if (p->kind == POOL_AVG)
      avg_plane(p, xp, H, W, yp, OH, OW);
    else
      adaptive_plane(xp, H, W, yp, OH, OW);
  }
}

/* AdaptiveAvgPool2d to 1 x 1 of a channels-last input: images [b, e), each
 * the mean of its HW positions per channel, summed in the same order and
 * precision as adaptive_plane does, so the same bits. */
static void gap_images(void *ctx, int64_t b, int64_t e) {
  const pool_par *c = ctx;
  const int64_t C = c->C, HW = c->H * c->W;
  for (int64_t i = b; i < e; i++) {
    double *restrict acc = c->acc + i * C;
    const float *x = c->x + i * HW * C;
    for (int64_t k = 0; k < C; k++) acc[k] = 0;
    for (int64_t q = 0; q < HW; q++)
      for (int64_t k = 0; k < C; k++) acc[k] += x[q * C + k];
    for (int64_t k = 0; k < C; k++) c->y[i * C + k] = (float)(acc[k] / (double)HW);
  }
}

/* MaxPool2d of a channels-last input into a channels-last output: output
 * rows [b, e) (row = image * OH + oh), the window visited in max_plane's
 * order with its NaN rule, C channels at a time, so the same values. */
static void max_rows_nhwc(void *ctx, int64_t b, int64_t e) {
  const pool_par *c = ctx;
  const pool_impl *p = c->p;
  const int64_t H = c->H, W = c->W, OH = c->OH, OW = c->OW, C = c->C;
  for (int64_t row = b; row < e; row++) {
    const int64_t i = row / OH, oh = row % OH;
    const float *x = c->x + i * H * W * C;
    const int64_t h0 = oh * p->stride[0] - p->pad[0];
    for (int64_t ow = 0; ow < OW; ow++) {
      float *restrict y = c->y + ((i * OH + oh) * OW + ow) * C;
      for (int64_t k = 0; k < C; k++) y[k] = -INFINITY;
      const int64_t w0 = ow * p->stride[1] - p->pad[1];
      for (int64_t a = 0; a < p->k[0]; a++) {
        const int64_t ih = h0 + a * p->dil[0];
        if (ih < 0 || ih >= H) continue;
        for (int64_t j = 0; j < p->k[1]; j++) {
          const int64_t iw = w0 + j * p->dil[1];
          if (iw < 0 || iw >= W) continue;
          const float *restrict v = x + (ih * W + iw) * C;
          for (int64_t k = 0; k < C; k++) y[k] = (v[k] > y[k] || v[k] != v[k]) ? v[k] : y[k];
        }
      }
    }
  }
}

static grove_status pool_forward(const grove_module *m, grove_fwd *f, const grove_values *in,
                                 grove_values *out) {
  const pool_impl *p = m->impl;
  const char *T = m->type->name;
  grove_tensor x;
  grove_status s;
  /* Channels last (from a convolution) is read as it is by MaxPool2d and
   * by AdaptiveAvgPool2d to 1 x 1; the others get a contiguous copy. */
  const bool global = p->kind == POOL_ADAPTIVE && p->osize[0] == 1 && p->osize[1] == 1;
  const bool nhwc = in->n == 1 && in->v[0].dtype == GROVE_F32 && grove__is_nhwc(&in->v[0]) &&
                    (p->kind == POOL_MAX || global);
  if (nhwc)
    x = in->v[0];
  else if ((s = grove__layer_input(T, f, in, GROVE_F32, &x)) != GROVE_OK)
    return s;

  if (x.ndim != 3 && x.ndim != 4)
    return grove__shape_error(f, T, "a 3-d or 4-d input ([C, H, W] or [N, C, H, W])", &x);
  const int64_t H = x.shape[x.ndim - 2], W = x.shape[x.ndim - 1];
  const int64_t planes = H * W > 0 ? grove_tensor_numel(&x) / (H * W) : 0;
  int64_t OH, OW;
  if (p->kind == POOL_ADAPTIVE) {
    OH = p->osize[0] < 0 ? H : p->osize[0];
    OW = p->osize[1] < 0 ? W : p->osize[1];
    if ((H == 0 || W == 0) && OH * OW > 0)
      return grove__shape_error(f, T, "non-empty spatial dimensions", &x);
  } else {
    OH = pool_out_len(p, 0, H);
    OW = pool_out_len(p, 1, W);
    if (OH <= 0 || OW <= 0) {
      char want[128];
      snprintf(want, sizeof want, "an input whose pooled size is positive (kernel %lld x %lld)",
               (long long)p->k[0], (long long)p->k[1]);
      return grove__shape_error(f, T, want, &x);
    }
  }
  int64_t oshape[4];
  memcpy(oshape, x.shape, sizeof oshape);
  oshape[x.ndim - 2] = OH;
  oshape[x.ndim - 1] = OW;
  s = grove_fwd_alloc(f, &out->v[0], GROVE_F32, x.ndim, oshape);
  if (s != GROVE_OK) return s;
  out->n = 1;
  if (H * W == 0) return GROVE_OK;
  if (nhwc) {
    const int64_t N = x.shape[0], C = x.shape[1];
    pool_par c = {
        .p = p, .x = x.data, .y = out->v[0].data, .H = H, .W = W, .OH = OH, .OW = OW, .C = C};
    if (global) {
      /* [N, C, 1, 1] is contiguous in either layout. */
      if (!(c.acc = grove_arena_alloc(f->arena, (size_t)(N * C) * sizeof(double) + 1)))
        return grove__scratch_error(f, T);
      grove__parallel_for(N, (4 * GROVE__PAR_FLOATS + H * W * C - 1) / (H * W * C), gap_images, &c);
    } else {
      grove__set_nhwc(&out->v[0]);
      const int64_t per = p->k[0] * p->k[1] * OW * C; /* floats read per output row */
      grove__parallel_for(N * OH, (4 * GROVE__PAR_FLOATS + per - 1) / per, max_rows_nhwc, &c);
    }
    return GROVE_OK;
  }
  /* Planes are independent: the compute threads take runs of them. */
  pool_par c = {.p = p, .x = x.data, .y = out->v[0].data, .H = H, .W = W, .OH = OH, .OW = OW};
  int64_t per = H * W + OH * OW; /* floats touched per plane, about */
  grove__parallel_for(planes, (4 * GROVE__PAR_FLOATS + per - 1) / per, pool_planes, &c);
  return GROVE_OK;
}

const grove_module_type grove__max_pool2d_type = {.name = "MaxPool2d", .forward = pool_forward};
const grove_module_type grove__avg_pool2d_type = {.name = "AvgPool2d", .forward = pool_forward};
const grove_module_type grove__adaptive_avg_pool2d_type = {.name = "AdaptiveAvgPool2d",
                                                           .forward = pool_forward};

static grove_status pool_check(const char *T, const pool_impl *p, grove_err *err) {
  for (int d = 0; d < 2; d++) {
    if (p->k[d] <= 0 || p->stride[d] <= 0 || p->dil[d] <= 0 || p->pad[d] < 0 || p->k[d] > BIG ||
        p->stride[d] > BIG || p->dil[d] > BIG)
      return grove_err_set(err, GROVE_E_INVALID_ARGUMENT,
                           "%s: kernel_size, stride and dilation must be positive and padding "
                           "non-negative",
                           T);
    /* torch: "pad should be at most half of effective kernel size". */
    if (p->pad[d] > (p->dil[d] * (p->k[d] - 1) + 1) / 2)
      return grove_err_set(err, GROVE_E_INVALID_ARGUMENT,
                           "%s: pad should be at most half of effective kernel size, but got "
                           "pad=%lld and kernel_size=%lld",
                           T, (long long)p->pad[d], (long long)p->k[d]);
  }
  return GROVE_OK;
}

grove_status grove_max_pool2d_new(const int64_t kernel_size[2], const int64_t stride[2],
                                  const int64_t padding[2], const int64_t dilation[2],
                                  bool ceil_mode, grove_module **out, grove_err *err) {
  *out = NULL;
  pool_impl *p = calloc(1, sizeof *p);
  if (!p) return grove_err_set(err, GROVE_E_NOMEM, "MaxPool2d: out of memory");
  p->kind = POOL_MAX;
  for (int d = 0; d < 2; d++) {
    p->k[d] = kernel_size[d];
    p->stride[d] = stride ? stride[d] : kernel_size[d];
    p->pad[d] = padding ? padding[d] : 0;
    p->dil[d] = dilation ? dilation[d] : 1;
  }
  p->ceil_mode = ceil_mode;
  grove_status s = pool_check("MaxPool2d", p, err);
  if (s) {
    free(p);
    return s;
  }
  return grove__layer_make(&grove__max_pool2d_type, p, out, err);
}

grove_status grove_avg_pool2d_new(const int64_t kernel_size[2], const int64_t stride[2],
                                  const int64_t padding[2], bool ceil_mode, bool count_include_pad,
                                  int64_t divisor_override, grove_module **out, grove_err *err) {
  *out = NULL;
  if (divisor_override < 0 || divisor_override > INT32_MAX)
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT,
                         "AvgPool2d: divisor_override must be positive or None");
  pool_impl *p = calloc(1, sizeof *p);
  if (!p) return grove_err_set(err, GROVE_E_NOMEM, "AvgPool2d: out of memory");
  p->kind = POOL_AVG;
  for (int d = 0; d < 2; d++) {
    p->k[d] = kernel_size[d];
    p->stride[d] = stride ? stride[d] : kernel_size[d];
    p->pad[d] = padding ? padding[d] : 0;
    p->dil[d] = 1;
  }
  p->ceil_mode = ceil_mode;
  p->count_include_pad = count_include_pad;
  p->divisor = divisor_override;
  grove_status s = pool_check("AvgPool2d", p, err);
  if (s) {
    free(p);
    return s;
  }
  return grove__layer_make(&grove__avg_pool2d_type, p, out, err);
}

grove_status grove_adaptive_avg_pool2d_new(const int64_t output_size[2], grove_module **out,
                                           grove_err *err) {
  *out = NULL;
  for (int d = 0; d < 2; d++)
    if (output_size[d] < -1 || output_size[d] == 0 || output_size[d] > BIG)
      return grove_err_set(err, GROVE_E_INVALID_ARGUMENT,
                           "AdaptiveAvgPool2d: output_size must be positive or None");
  pool_impl *p = calloc(1, sizeof *p);
  if (!p) return grove_err_set(err, GROVE_E_NOMEM, "AdaptiveAvgPool2d: out of memory");
  p->kind = POOL_ADAPTIVE;
  p->osize[0] = output_size[0];
  p->osize[1] = output_size[1];
  p->k[0] = p->k[1] = p->stride[0] = p->stride[1] = p->dil[0] = p->dil[1] = 1;
  return grove__layer_make(&grove__adaptive_avg_pool2d_type, p, out, err);
}

/* torch's stride=None (or absent): the kernel size. */
static grove_status pool_stride(const json_t *obj, const char *path, const char *T,
                                const int64_t k[2], int64_t st[2], grove_err *err) {
  const json_t *v = json_object_get(obj, "stride");
  if (!v || json_is_null(v)) {
    st[0] = k[0];
    st[1] = k[1];
    return GROVE_OK;
  }
  return grove__json_ints(obj, path, T, "stride", 2, 0, 1, BIG, st, err);
}

grove_status grove__max_pool2d_from_json(const json_t *obj, const char *path, grove_module **out,
                                         grove_err *err) {
  static const char *const keys[] = {"kernel_size",    "stride",    "padding", "dilation",
                                     "return_indices", "ceil_mode", NULL};
  const char *T = "MaxPool2d";
  int64_t k[2], st[2], pd[2], dl[2];
  bool ri, ceil;
  grove_status s = grove__json_check_keys(obj, path, T, keys, err);
  if (!s) s = grove__json_ints(obj, path, T, "kernel_size", 2, 0, 1, BIG, k, err);
  if (!s) s = pool_stride(obj, path, T, k, st, err);
  if (!s) s = grove__json_ints(obj, path, T, "padding", 2, 0, 0, BIG, pd, err);
  if (!s) s = grove__json_ints(obj, path, T, "dilation", 2, 1, 1, BIG, dl, err);
  if (!s) s = grove__json_bool(obj, path, T, "return_indices", false, &ri, err);
  if (!s) s = grove__json_bool(obj, path, T, "ceil_mode", false, &ceil, err);
  if (s) return s;
  if (ri)
    return grove__json_unsupported(path, "return_indices",
                                   "MaxPool2d(return_indices=True) returns a tuple of values and "
                                   "indices; Grove serves the values only",
                                   err);
  return grove__json_built(path, grove_max_pool2d_new(k, st, pd, dl, ceil, out, err), err);
}

grove_status grove__avg_pool2d_from_json(const json_t *obj, const char *path, grove_module **out,
                                         grove_err *err) {
  static const char *const keys[] = {
      "kernel_size",       "stride",           "padding", "ceil_mode",
      "count_include_pad", "divisor_override", NULL};
  const char *T = "AvgPool2d";
  int64_t k[2], st[2], pd[2], div;
  bool ceil, cip, div_null;
  grove_status s = grove__json_check_keys(obj, path, T, keys, err);
  if (!s) s = grove__json_ints(obj, path, T, "kernel_size", 2, 0, 1, BIG, k, err);
  if (!s) s = pool_stride(obj, path, T, k, st, err);
  if (!s) s = grove__json_ints(obj, path, T, "padding", 2, 0, 0, BIG, pd, err);
  if (!s) s = grove__json_bool(obj, path, T, "ceil_mode", false, &ceil, err);
  if (!s) s = grove__json_bool(obj, path, T, "count_include_pad", true, &cip, err);
  if (!s)
    s = grove__json_int_or_null(obj, path, T, "divisor_override", true, 0, 1, INT32_MAX, &div,
                                &div_null, err);
  if (s) return s;
  return grove__json_built(
      path, grove_avg_pool2d_new(k, st, pd, ceil, cip, div_null ? 0 : div, out, err), err);
}

grove_status grove__adaptive_avg_pool2d_from_json(const json_t *obj, const char *path,
                                                  grove_module **out, grove_err *err) {
  static const char *const keys[] = {"output_size", NULL};
  const char *T = "AdaptiveAvgPool2d";
  grove_status s = grove__json_check_keys(obj, path, T, keys, err);
  if (s) return s;
  const json_t *v = json_object_get(obj, "output_size");
  int64_t os[2];
  if (!v)
    return grove_err_set(err, GROVE_E_SPEC, "%s.output_size: missing required argument of %s", path,
                         T);
  if (json_is_integer(v)) {
    s = grove__json_ints(obj, path, T, "output_size", 2, 0, 1, BIG, os, err);
    if (s) return s;
  } else {
    bool ok = json_is_array(v) && json_array_size(v) == 2;
    for (size_t i = 0; ok && i < 2; i++) {
      const json_t *e = json_array_get(v, i);
      if (json_is_null(e))
        os[i] = -1;
      else if (json_is_integer(e) && json_integer_value(e) >= 1 && json_integer_value(e) <= BIG)
        os[i] = (int64_t)json_integer_value(e);
      else
        ok = false;
    }
    if (!ok)
      return grove_err_set(err, GROVE_E_SPEC,
                           "%s.output_size: expected a positive integer or a list of 2 positive "
                           "integers or nulls",
                           path);
  }
  return grove__json_built(path, grove_adaptive_avg_pool2d_new(os, out, err), err);
}
