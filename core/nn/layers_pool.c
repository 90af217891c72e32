/* layers_pool.c: the pooling layers, eval mode: torch.nn.MaxPool1d/2d,
 * AvgPool1d/2d, AdaptiveAvgPool1d/2d and AdaptiveMaxPool1d/2d, with their
 * constructors and model.json builders (split out of layers_conv.c).  One
 * window rule per kind (pool_window: torch's pooling_output_shape, avg_pool's
 * clipped windows and divisors, adaptive start/end indices) serves both
 * loops: planes of a contiguous input, and output rows of a channels-last
 * one (from a convolution or a cat of them), which a 2-d pool keeps, so a
 * SqueezeNet or DenseNet block never transposes around its pools.  A 1-d
 * pool is the 2-d one over [..., 1, L].  Each plane or row is one index of
 * grove__parallel_for, computed alike by any thread.  Every layer accepts
 * torch's unbatched input too. */
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

enum {
  POOL_MAX = GROVE__POOL_MAX,
  POOL_AVG = GROVE__POOL_AVG,
  POOL_ADAPTIVE = GROVE__POOL_ADAPTIVE,
  POOL_ADAPTIVE_MAX = GROVE__POOL_ADAPTIVE_MAX
};

/* A module's impl is its grove__pool (layers_internal.h). */
typedef grove__pool pool_impl;

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

static bool is_max(const pool_impl *p) { return p->kind == POOL_MAX || p->kind == POOL_ADAPTIVE_MAX; }

/* The input indices output o of dim d reads along that dim: first + t * step
 * for t in [0, n), ascending, inside [0, in); *span is the window's length
 * counted as torch's avg_pool2d divisor does (clipped to the padded input). */
typedef struct pool_win {
  int64_t first, n, step, span;
} pool_win;

static pool_win pool_window(const pool_impl *p, int d, int64_t o, int64_t in, int64_t out) {
  pool_win w = {0, 0, 1, 0};
  if (p->kind == POOL_ADAPTIVE || p->kind == POOL_ADAPTIVE_MAX) {
    /* torch's start_index / end_index. */
    const int64_t s = o * in / out, e = ((o + 1) * in + out - 1) / out;
    w.first = s;
    w.n = e - s;
    w.span = e - s;
  } else if (p->kind == POOL_MAX) {
    const int64_t h0 = o * p->stride[d] - p->pad[d], dl = p->dil[d];
    int64_t a = 0, b = p->k[d];
    while (a < b && h0 + a * dl < 0) a++;
    while (b > a && h0 + (b - 1) * dl >= in) b--;
    w.first = h0 + a * dl;
    w.n = b - a;
    w.step = dl;
  } else {
    int64_t hs = o * p->stride[d] - p->pad[d];
    int64_t he = hs + p->k[d] < in + p->pad[d] ? hs + p->k[d] : in + p->pad[d];
    w.span = he - hs;
    if (hs < 0) hs = 0;
    if (he > in) he = in;
    w.first = hs;
    w.n = he > hs ? he - hs : 0;
  }
  return w;
}

/* An average's divisor: divisor_override, the padded window
 * (count_include_pad) or the taps inside the input. */
static double pool_div(const pool_impl *p, const pool_win *h, const pool_win *w) {
  if (p->kind == POOL_AVG && p->divisor) return (double)p->divisor;
  if (p->kind == POOL_AVG && p->count_include_pad) return (double)(h->span * w->span);
  return (double)(h->n * w->n);
}

/* One plane (H x W) into OH x OW: maxima (a NaN wins, as in torch) or
 * averages summed in double, torch's accumulation type for float on the CPU,
 * in scan order (rows, then columns). */
static void pool_plane(const pool_impl *p, const float *restrict x, int64_t H, int64_t W,
                       float *restrict y, int64_t OH, int64_t OW) {
  const bool mx = is_max(p);
  for (int64_t oh = 0; oh < OH; oh++) {
    const pool_win wh = pool_window(p, 0, oh, H, OH);
    for (int64_t ow = 0; ow < OW; ow++) {
      const pool_win ww = pool_window(p, 1, ow, W, OW);
      if (mx) {
        float best = -INFINITY;
        for (int64_t i = 0; i < wh.n; i++) {
          const float *r = x + (wh.first + i * wh.step) * W + ww.first;
          for (int64_t j = 0; j < ww.n; j++) {
            const float v = r[j * ww.step];
            if (v > best || isnan(v)) best = v;
          }
        }
        y[oh * OW + ow] = best;
        continue;
      }
      if (wh.n == 0 || ww.n == 0) {
        y[oh * OW + ow] = 0.0f;
        continue;
      }
      double sum = 0;
      for (int64_t i = 0; i < wh.n; i++) {
        const float *r = x + (wh.first + i) * W + ww.first;
        for (int64_t j = 0; j < ww.n; j++) sum += r[j];
      }
      y[oh * OW + ow] = (float)(sum / pool_div(p, &wh, &ww));
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
  int64_t cb, nblk; /* channels last: channels an index of the loop takes, blocks a row */
  double *acc; /* channels last averages: C doubles per output row's position, per row */
} pool_par;

static void pool_planes(void *ctx, int64_t b, int64_t e) {
  const pool_par *c = ctx;
  const int64_t HW = c->H * c->W, OHW = c->OH * c->OW;
  for (int64_t pl = b; pl < e; pl++)
    pool_plane(c->p, c->x + pl * HW, c->H, c->W, c->y + pl * OHW, c->OH, c->OW);
}

/* Channels last in and out: indices [b, e), each a block of c->cb channels
 * of an output row (index = row * blocks + block, row = image * OH + oh),
 * every window visited in pool_plane's order with its arithmetic, a
 * block's channels at a time, so the same values.  The averages' double
 * sums live in acc (C per row, rows apart). */
GROVE__CHANNEL_LOOP static void pool_rows_nhwc(void *ctx, int64_t b, int64_t e) {
  const pool_par *c = ctx;
  const pool_impl *p = c->p;
  const int64_t H = c->H, W = c->W, OH = c->OH, OW = c->OW, ld = c->C;
  const int64_t nblk = c->nblk;
  const bool mx = is_max(p);
  for (int64_t idx = b; idx < e; idx++) {
    const int64_t row = idx / nblk, k0 = idx % nblk * c->cb;
    const int64_t cn = ld - k0 < c->cb ? ld - k0 : c->cb; /* channels k0 .. k0 + cn */
    const int64_t i = row / OH, oh = row % OH;
    const float *x = c->x + i * H * W * ld + k0;
    const pool_win wh = pool_window(p, 0, oh, H, OH);
    double *restrict acc = c->acc ? c->acc + row * ld + k0 : NULL;
    for (int64_t ow = 0; ow < OW; ow++) {
      float *restrict y = c->y + ((i * OH + oh) * OW + ow) * ld + k0;
      const pool_win ww = pool_window(p, 1, ow, W, OW);
      if (mx) {
        for (int64_t k = 0; k < cn; k++) y[k] = -INFINITY;
        for (int64_t a = 0; a < wh.n; a++)
          for (int64_t j = 0; j < ww.n; j++) {
            const float *restrict v =
                x + ((wh.first + a * wh.step) * W + ww.first + j * ww.step) * ld;
            for (int64_t k = 0; k < cn; k++) y[k] = (v[k] > y[k] || v[k] != v[k]) ? v[k] : y[k];
          }
        continue;
      }
      if (wh.n == 0 || ww.n == 0) {
        for (int64_t k = 0; k < cn; k++) y[k] = 0.0f;
        continue;
      }
      for (int64_t k = 0; k < cn; k++) acc[k] = 0;
      for (int64_t a = 0; a < wh.n; a++)
        for (int64_t j = 0; j < ww.n; j++) {
          const float *restrict v = x + ((wh.first + a) * W + ww.first + j) * ld;
          for (int64_t k = 0; k < cn; k++) acc[k] += v[k];
        }
      const double div = pool_div(p, &wh, &ww);
      for (int64_t k = 0; k < cn; k++) y[k] = (float)(acc[k] / div);
    }
  }
}

grove_status grove__pool_run(const grove__pool *p, const char *T, grove_fwd *f,
                            const grove_values *in, grove_values *out) {
  grove_tensor x;
  grove_status s;
  /* Channels last (from a convolution, a cat of them) is read as it is by
   * every 2-d pool, and kept. */
  const bool nhwc = p->nd == 2 && in->n == 1 && in->v[0].dtype == GROVE_F32 &&
                    grove__is_nhwc(&in->v[0]);
  if (nhwc)
    x = in->v[0];
  else if ((s = grove__layer_input(T, f, in, GROVE_F32, &x)) != GROVE_OK)
    return s;

  if (p->nd == 2 && x.ndim != 3 && x.ndim != 4)
    return grove__shape_error(f, T, "a 3-d or 4-d input ([C, H, W] or [N, C, H, W])", &x);
  if (p->nd == 1 && x.ndim != 2 && x.ndim != 3)
    return grove__shape_error(f, T, "a 2-d or 3-d input ([C, L] or [N, C, L])", &x);
  /* A 1-d pool is the 2-d one over [..., 1, L] with a 1-high window. */
  const int64_t H = p->nd == 2 ? x.shape[x.ndim - 2] : 1, W = x.shape[x.ndim - 1];
  const int64_t planes = H * W > 0 ? grove_tensor_numel(&x) / (H * W) : 0;
  int64_t OH, OW;
  if (p->kind == POOL_ADAPTIVE || p->kind == POOL_ADAPTIVE_MAX) {
    OH = p->osize[0] < 0 ? H : p->osize[0];
    OW = p->osize[1] < 0 ? W : p->osize[1];
    if ((H == 0 || W == 0) && OH * OW > 0)
      return grove__shape_error(f, T, "non-empty spatial dimensions", &x);
  } else {
    OH = pool_out_len(p, 0, H);
    OW = pool_out_len(p, 1, W);
    if (OH <= 0 || OW <= 0) {
      char want[128];
      if (p->nd == 2)
        snprintf(want, sizeof want, "an input whose pooled size is positive (kernel %lld x %lld)",
                 (long long)p->k[0], (long long)p->k[1]);
      else
        snprintf(want, sizeof want, "an input whose pooled size is positive (kernel %lld)",
                 (long long)p->k[1]);
      return grove__shape_error(f, T, want, &x);
    }
  }
  int64_t oshape[4];
  memcpy(oshape, x.shape, sizeof oshape);
  if (p->nd == 2) oshape[x.ndim - 2] = OH;
  oshape[x.ndim - 1] = OW;
  s = grove_fwd_alloc(f, &out->v[0], GROVE_F32, x.ndim, oshape);
  if (s != GROVE_OK) return s;
  out->n = 1;
  if (H * W == 0) return GROVE_OK;
  if (nhwc) {
    const int64_t N = x.shape[0], C = x.shape[1];
    pool_par c = {
        .p = p, .x = x.data, .y = out->v[0].data, .H = H, .W = W, .OH = OH, .OW = OW, .C = C};
    if (!is_max(p) &&
        !(c.acc = grove_arena_alloc(f->arena, (size_t)(N * OH * C) * sizeof(double) + 1)))
      return grove__scratch_error(f, T);
    /* [N, C, 1, 1] is contiguous in either layout. */
    if (OH * OW > 1) grove__set_nhwc(&out->v[0]);
    int64_t per = OW * C * 2; /* floats touched per output row, at least */
    if (p->kind == POOL_ADAPTIVE || p->kind == POOL_ADAPTIVE_MAX)
      per += (H + OH - 1) / OH * W * C;
    else
      per += p->k[0] * p->k[1] * OW * C;
    /* Too few output rows for the threads, each with work enough for two
     * (a global pool at batch 1, as in every squeeze-excitation block):
     * their channels go in two blocks a thread (multiples of 16 channels),
     * a block an index; each channel is still summed in the same order. */
    c.cb = C > 0 ? C : 1;
    int64_t grain = (4 * GROVE__PAR_FLOATS + per - 1) / per;
    const int64_t threads = grove_compute_threads();
    if (threads > 1 && N * OH < 2 * threads && per >= 8 * GROVE__PAR_FLOATS && C > 16) {
      c.cb = (C + 2 * threads - 1) / (2 * threads);
      c.cb = (c.cb + 15) / 16 * 16;
      grain = 1;
    }
    c.nblk = (C + c.cb - 1) / c.cb;
    grove__parallel_for(N * OH * c.nblk, grain, pool_rows_nhwc, &c);
    return GROVE_OK;
  }
  /* Planes are independent: the compute threads take runs of them. */
  pool_par c = {.p = p, .x = x.data, .y = out->v[0].data, .H = H, .W = W, .OH = OH, .OW = OW};
  int64_t per = H * W + OH * OW; /* floats touched per plane, about */
  grove__parallel_for(planes, (4 * GROVE__PAR_FLOATS + per - 1) / per, pool_planes, &c);
  return GROVE_OK;
}

static grove_status pool_forward(const grove_module *m, grove_fwd *f, const grove_values *in,
                                 grove_values *out) {
  return grove__pool_run(m->impl, m->type->name, f, in, out);
}

const grove_module_type grove__max_pool2d_type = {.name = "MaxPool2d", .forward = pool_forward};
const grove_module_type grove__avg_pool2d_type = {.name = "AvgPool2d", .forward = pool_forward};
const grove_module_type grove__adaptive_avg_pool2d_type = {.name = "AdaptiveAvgPool2d",
                                                           .forward = pool_forward};
const grove_module_type grove__adaptive_max_pool2d_type = {.name = "AdaptiveMaxPool2d",
                                                           .forward = pool_forward};
const grove_module_type grove__max_pool1d_type = {.name = "MaxPool1d", .forward = pool_forward};
const grove_module_type grove__avg_pool1d_type = {.name = "AvgPool1d", .forward = pool_forward};
const grove_module_type grove__adaptive_avg_pool1d_type = {.name = "AdaptiveAvgPool1d",
                                                           .forward = pool_forward};
const grove_module_type grove__adaptive_max_pool1d_type = {.name = "AdaptiveMaxPool1d",
                                                           .forward = pool_forward};

grove_status grove__pool_check(const char *T, const grove__pool *p, grove_err *err) {
  if (p->kind == POOL_ADAPTIVE || p->kind == POOL_ADAPTIVE_MAX) {
    for (int d = 0; d < 2; d++)
      if (p->osize[d] < -1 || p->osize[d] == 0 || p->osize[d] > BIG)
        return grove_err_set(err, GROVE_E_INVALID_ARGUMENT,
                             "%s: output_size must be positive or None", T);
    return GROVE_OK;
  }
  if (p->divisor < 0 || p->divisor > INT32_MAX)
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT,
                         "%s: divisor_override must be positive or None", T);
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

/* A windowed pool (max or average) of nd dims; the 1-d ones give their one
 * value at index 0 of each array, pooled along W (index 1) under a window
 * one high.  Arrays NULL: stride = the kernel, padding 0, dilation 1. */
static grove_status pool_new(const grove_module_type *type, int kind, int nd,
                             const int64_t kernel_size[2], const int64_t stride[2],
                             const int64_t padding[2], const int64_t dilation[2], bool ceil_mode,
                             bool count_include_pad, int64_t divisor_override,
                             grove_module **out, grove_err *err) {
  *out = NULL;
  const char *T = type->name;
  pool_impl *p = calloc(1, sizeof *p);
  if (!p) return grove_err_set(err, GROVE_E_NOMEM, "%s: out of memory", T);
  p->kind = kind;
  p->nd = nd;
  for (int d = 0; d < 2; d++) {
    const int src = nd == 1 ? 0 : d;
    const bool used = nd == 2 || d == 1;
    p->k[d] = used ? kernel_size[src] : 1;
    p->stride[d] = used ? (stride ? stride[src] : kernel_size[src]) : 1;
    p->pad[d] = used && padding ? padding[src] : 0;
    p->dil[d] = used && dilation ? dilation[src] : 1;
  }
  p->ceil_mode = ceil_mode;
  p->count_include_pad = count_include_pad;
  p->divisor = divisor_override;
  grove_status s = grove__pool_check(T, p, err);
  if (s) {
    free(p);
    return s;
  }
  return grove__layer_make(type, p, out, err);
}

grove_status grove_max_pool2d_new(const int64_t kernel_size[2], const int64_t stride[2],
                                  const int64_t padding[2], const int64_t dilation[2],
                                  bool ceil_mode, grove_module **out, grove_err *err) {
  return pool_new(&grove__max_pool2d_type, POOL_MAX, 2, kernel_size, stride, padding, dilation,
                  ceil_mode, false, 0, out, err);
}

grove_status grove_avg_pool2d_new(const int64_t kernel_size[2], const int64_t stride[2],
                                  const int64_t padding[2], bool ceil_mode, bool count_include_pad,
                                  int64_t divisor_override, grove_module **out, grove_err *err) {
  return pool_new(&grove__avg_pool2d_type, POOL_AVG, 2, kernel_size, stride, padding, NULL,
                  ceil_mode, count_include_pad, divisor_override, out, err);
}

grove_status grove_max_pool1d_new(int64_t kernel_size, int64_t stride, int64_t padding,
                                  int64_t dilation, bool ceil_mode, grove_module **out,
                                  grove_err *err) {
  const int64_t k[2] = {kernel_size}, st[2] = {stride ? stride : kernel_size}, pd[2] = {padding},
                dl[2] = {dilation};
  return pool_new(&grove__max_pool1d_type, POOL_MAX, 1, k, st, pd, dl, ceil_mode, false, 0, out,
                  err);
}

grove_status grove_avg_pool1d_new(int64_t kernel_size, int64_t stride, int64_t padding,
                                  bool ceil_mode, bool count_include_pad, grove_module **out,
                                  grove_err *err) {
  const int64_t k[2] = {kernel_size}, st[2] = {stride ? stride : kernel_size}, pd[2] = {padding};
  return pool_new(&grove__avg_pool1d_type, POOL_AVG, 1, k, st, pd, NULL, ceil_mode,
                  count_include_pad, 0, out, err);
}

static grove_status adaptive_new(const grove_module_type *type, int kind, int nd,
                                 const int64_t output_size[2], grove_module **out,
                                 grove_err *err) {
  *out = NULL;
  pool_impl *p = calloc(1, sizeof *p);
  if (!p) return grove_err_set(err, GROVE_E_NOMEM, "%s: out of memory", type->name);
  p->kind = kind;
  p->nd = nd;
  /* 1-d: one row in, one row out. */
  p->osize[0] = nd == 2 ? output_size[0] : 1;
  p->osize[1] = nd == 2 ? output_size[1] : output_size[0];
  p->k[0] = p->k[1] = p->stride[0] = p->stride[1] = p->dil[0] = p->dil[1] = 1;
  grove_status s = grove__pool_check(type->name, p, err);
  if (s) {
    free(p);
    return s;
  }
  return grove__layer_make(type, p, out, err);
}

grove_status grove_adaptive_avg_pool2d_new(const int64_t output_size[2], grove_module **out,
                                           grove_err *err) {
  return adaptive_new(&grove__adaptive_avg_pool2d_type, POOL_ADAPTIVE, 2, output_size, out, err);
}

grove_status grove_adaptive_max_pool2d_new(const int64_t output_size[2], grove_module **out,
                                           grove_err *err) {
  return adaptive_new(&grove__adaptive_max_pool2d_type, POOL_ADAPTIVE_MAX, 2, output_size, out,
                      err);
}

grove_status grove_adaptive_avg_pool1d_new(int64_t output_size, grove_module **out,
                                           grove_err *err) {
  const int64_t os[2] = {output_size};
  return adaptive_new(&grove__adaptive_avg_pool1d_type, POOL_ADAPTIVE, 1, os, out, err);
}

grove_status grove_adaptive_max_pool1d_new(int64_t output_size, grove_module **out,
                                           grove_err *err) {
  const int64_t os[2] = {output_size};
  return adaptive_new(&grove__adaptive_max_pool1d_type, POOL_ADAPTIVE_MAX, 1, os, out, err);
}

/* torch's stride=None (or absent): the kernel size. */
static grove_status pool_stride(const json_t *obj, const char *path, const char *T, int nd,
                                const int64_t k[2], int64_t st[2], grove_err *err) {
  const json_t *v = json_object_get(obj, "stride");
  if (!v || json_is_null(v)) {
    st[0] = k[0];
    st[1] = k[1];
    return GROVE_OK;
  }
  return grove__json_ints(obj, path, T, "stride", nd, 0, 1, BIG, st, err);
}

static grove_status no_indices(const json_t *obj, const char *path, const char *T,
                               grove_err *err) {
  bool ri;
  grove_status s = grove__json_bool(obj, path, T, "return_indices", false, &ri, err);
  if (s || !ri) return s;
  char why[160];
  snprintf(why, sizeof why,
           "%s(return_indices=True) returns a tuple of values and indices; Grove serves the "
           "values only",
           T);
  return grove__json_unsupported(path, "return_indices", why, err);
}

static grove_status max_pool_from_json(int nd, const json_t *obj, const char *path,
                                       grove_module **out, grove_err *err) {
  static const char *const keys[] = {"kernel_size",    "stride",    "padding", "dilation",
                                     "return_indices", "ceil_mode", NULL};
  const char *T = nd == 1 ? "MaxPool1d" : "MaxPool2d";
  int64_t k[2] = {0}, st[2] = {0}, pd[2] = {0}, dl[2] = {0};
  bool ceil;
  grove_status s = grove__json_check_keys(obj, path, T, keys, err);
  if (!s) s = grove__json_ints(obj, path, T, "kernel_size", nd, 0, 1, BIG, k, err);
  if (!s) s = pool_stride(obj, path, T, nd, k, st, err);
  if (!s) s = grove__json_ints(obj, path, T, "padding", nd, 0, 0, BIG, pd, err);
  if (!s) s = grove__json_ints(obj, path, T, "dilation", nd, 1, 1, BIG, dl, err);
  if (!s) s = no_indices(obj, path, T, err);
  if (!s) s = grove__json_bool(obj, path, T, "ceil_mode", false, &ceil, err);
  if (s) return s;
  return grove__json_built(
      path,
      nd == 1 ? grove_max_pool1d_new(k[0], st[0], pd[0], dl[0], ceil, out, err)
              : grove_max_pool2d_new(k, st, pd, dl, ceil, out, err),
      err);
}

grove_status grove__max_pool2d_from_json(const json_t *obj, const char *path, grove_module **out,
                                         grove_err *err) {
  return max_pool_from_json(2, obj, path, out, err);
}
grove_status grove__max_pool1d_from_json(const json_t *obj, const char *path, grove_module **out,
                                         grove_err *err) {
  return max_pool_from_json(1, obj, path, out, err);
}

static grove_status avg_pool_from_json(int nd, const json_t *obj, const char *path,
                                       grove_module **out, grove_err *err) {
  /* torch's AvgPool1d has no divisor_override. */
  static const char *const keys2[] = {
      "kernel_size",       "stride",           "padding", "ceil_mode",
      "count_include_pad", "divisor_override", NULL};
  static const char *const keys1[] = {"kernel_size", "stride", "padding", "ceil_mode",
                                      "count_include_pad", NULL};
  const char *T = nd == 1 ? "AvgPool1d" : "AvgPool2d";
  int64_t k[2] = {0}, st[2] = {0}, pd[2] = {0}, div = 0;
  bool ceil, cip, div_null = true;
  grove_status s = grove__json_check_keys(obj, path, T, nd == 1 ? keys1 : keys2, err);
  if (!s) s = grove__json_ints(obj, path, T, "kernel_size", nd, 0, 1, BIG, k, err);
  if (!s) s = pool_stride(obj, path, T, nd, k, st, err);
  if (!s) s = grove__json_ints(obj, path, T, "padding", nd, 0, 0, BIG, pd, err);
  if (!s) s = grove__json_bool(obj, path, T, "ceil_mode", false, &ceil, err);
  if (!s) s = grove__json_bool(obj, path, T, "count_include_pad", true, &cip, err);
  if (!s && nd == 2)
    s = grove__json_int_or_null(obj, path, T, "divisor_override", true, 0, 1, INT32_MAX, &div,
                                &div_null, err);
  if (s) return s;
  return grove__json_built(
      path,
      nd == 1 ? grove_avg_pool1d_new(k[0], st[0], pd[0], ceil, cip, out, err)
              : grove_avg_pool2d_new(k, st, pd, ceil, cip, div_null ? 0 : div, out, err),
      err);
}

grove_status grove__avg_pool2d_from_json(const json_t *obj, const char *path, grove_module **out,
                                         grove_err *err) {
  return avg_pool_from_json(2, obj, path, out, err);
}
grove_status grove__avg_pool1d_from_json(const json_t *obj, const char *path, grove_module **out,
                                         grove_err *err) {
  return avg_pool_from_json(1, obj, path, out, err);
}

/* AdaptiveAvgPool / AdaptiveMaxPool, 1-d or 2-d: output_size an integer or
 * a list of nd integers or nulls (null: the input's size). */
static grove_status adaptive_from_json(int nd, bool max, const json_t *obj, const char *path,
                                       grove_module **out, grove_err *err) {
  static const char *const keys[] = {"output_size", NULL};
  static const char *const keys_max[] = {"output_size", "return_indices", NULL};
  static const char *const names[2][2] = {{"AdaptiveAvgPool1d", "AdaptiveAvgPool2d"},
                                          {"AdaptiveMaxPool1d", "AdaptiveMaxPool2d"}};
  const char *T = names[max][nd - 1];
  grove_status s = grove__json_check_keys(obj, path, T, max ? keys_max : keys, err);
  if (!s && max) s = no_indices(obj, path, T, err);
  if (s) return s;
  const json_t *v = json_object_get(obj, "output_size");
  int64_t os[2] = {0};
  if (!v)
    return grove_err_set(err, GROVE_E_SPEC, "%s.output_size: missing required argument of %s", path,
                         T);
  if (json_is_integer(v)) {
    s = grove__json_ints(obj, path, T, "output_size", nd, 0, 1, BIG, os, err);
    if (s) return s;
  } else {
    bool ok = json_is_array(v) && json_array_size(v) == (size_t)nd;
    for (size_t i = 0; ok && i < (size_t)nd; i++) {
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
                           "%s.output_size: expected a positive integer or a list of %d positive "
                           "integers or nulls",
                           path, nd);
  }
  grove_status b;
  if (nd == 2)
    b = max ? grove_adaptive_max_pool2d_new(os, out, err)
            : grove_adaptive_avg_pool2d_new(os, out, err);
  else
    b = max ? grove_adaptive_max_pool1d_new(os[0], out, err)
            : grove_adaptive_avg_pool1d_new(os[0], out, err);
  return grove__json_built(path, b, err);
}

grove_status grove__adaptive_avg_pool2d_from_json(const json_t *obj, const char *path,
                                                  grove_module **out, grove_err *err) {
  return adaptive_from_json(2, false, obj, path, out, err);
}
grove_status grove__adaptive_max_pool2d_from_json(const json_t *obj, const char *path,
                                                  grove_module **out, grove_err *err) {
  return adaptive_from_json(2, true, obj, path, out, err);
}
grove_status grove__adaptive_avg_pool1d_from_json(const json_t *obj, const char *path,
                                                  grove_module **out, grove_err *err) {
  return adaptive_from_json(1, false, obj, path, out, err);
}
grove_status grove__adaptive_max_pool1d_from_json(const json_t *obj, const char *path,
                                                  grove_module **out, grove_err *err) {
  return adaptive_from_json(1, true, obj, path, out, err);
}
