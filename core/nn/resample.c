/* resample.c: F.interpolate / nn.Upsample (nearest, nearest-exact,
 * linear/bilinear with align_corners either way), F.pad's constant mode
 * (nn.ZeroPad2d, ConstantPad*d) and its reflect, replicate and circular
 * modes (nn.ReflectionPad*d, ReplicationPad*d), and F.pixel_shuffle and
 * F.pixel_unshuffle (tensor_ops.h).
 *
 * The source coordinates are computed as aten's upsample kernels do
 * (UpSample.h: area_pixel_compute_scale, nearest_idx,
 * area_pixel_compute_source_index), in float, so that the chosen pixels and
 * weights are torch's. */
#include <math.h>
#include <string.h>

#include "layers_internal.h"
#include "tensor_ops.h"

/* The step of source coordinates per output pixel. */
static float coord_scale(int64_t in, int64_t out, bool align, double scale_factor) {
  if (align) return out > 1 ? (float)(in - 1) / (float)(out - 1) : 0.0f;
  return scale_factor > 0 ? (float)(1.0 / scale_factor) : (float)in / (float)out;
}

static int64_t nearest_src(int mode, int64_t dst, int64_t in, int64_t out, float sc) {
  if (mode == GROVE__INTERP_NEAREST) {
    if (out == in) return dst;
    if (out == 2 * in) return dst >> 1;
    const int64_t i = (int64_t)floorf((float)dst * sc);
    return i < in - 1 ? i : in - 1;
  }
  const int64_t i = (int64_t)floorf(((float)dst + 0.5f) * sc);
  return i < in - 1 ? i : in - 1;
}

/* Linear: the two source pixels and the second one's weight. */
static void linear_src(int64_t dst, int64_t in, float sc, bool align, int64_t *i0, int64_t *i1,
                       float *l1) {
  float src = align ? sc * (float)dst : sc * ((float)dst + 0.5f) - 0.5f;
  if (!align && src < 0) src = 0;
  int64_t a = (int64_t)src;
  if (a > in - 1) a = in - 1;
  *i0 = a;
  *i1 = a + (a < in - 1 ? 1 : 0);
  *l1 = src - (float)a;
  if (*l1 < 0) *l1 = 0;
}

/* torch's cubic convolution weights (A = -0.75) of the four source pixels
 * around a point t past the first of the middle two (UpSample.h,
 * get_cubic_upsample_coefficients). */
static void cubic_weights(float t, float w[4]) {
  const float A = -0.75f;
  const float x1 = t + 1.0f, x2 = 1.0f - t, x3 = 2.0f - t;
  w[0] = ((A * x1 - 5.0f * A) * x1 + 8.0f * A) * x1 - 4.0f * A;
  w[1] = ((A + 2.0f) * t - (A + 3.0f)) * t * t + 1.0f;
  w[2] = ((A + 2.0f) * x2 - (A + 3.0f)) * x2 * x2 + 1.0f;
  w[3] = ((A * x3 - 5.0f * A) * x3 + 8.0f * A) * x3 - 4.0f * A;
}

/* Bicubic: for each output index, its four source indexes (clamped to the
 * input, as torch's upsample_get_value_bounded) and weights. */
static void cubic_src(int64_t dst, int64_t in, float sc, bool align, int64_t *idx, float *w) {
  /* area_pixel_compute_source_index with cubic=true: no clamp at 0. */
  const float src = align ? sc * (float)dst : sc * ((float)dst + 0.5f) - 0.5f;
  const float fl = floorf(src);
  cubic_weights(src - fl, w);
  for (int k = 0; k < 4; k++) {
    int64_t i = (int64_t)fl - 1 + k;
    idx[k] = i < 0 ? 0 : i > in - 1 ? in - 1 : i;
  }
}

static void bicubic(const float *xv, float *y, int64_t planes, int64_t H, int64_t W, int64_t OH,
                    int64_t OW, const int64_t *cx, const float *wx, const int64_t *cy,
                    const float *wy) {
  for (int64_t p = 0; p < planes; p++) {
    const float *xp = xv + p * H * W;
    float *yp = y + p * OH * OW;
    for (int64_t i = 0; i < OH; i++) {
      const float *rows[4];
      for (int a = 0; a < 4; a++) rows[a] = xp + cy[4 * i + a] * W;
      const float *v = wy + 4 * i;
      for (int64_t j = 0; j < OW; j++) {
        const int64_t *c = cx + 4 * j;
        const float *u = wx + 4 * j;
        float r[4];
        for (int a = 0; a < 4; a++)
          r[a] = rows[a][c[0]] * u[0] + rows[a][c[1]] * u[1] + rows[a][c[2]] * u[2] +
                 rows[a][c[3]] * u[3];
        yp[i * OW + j] = r[0] * v[0] + r[1] * v[1] + r[2] * v[2] + r[3] * v[3];
      }
    }
  }
}

grove_status grove__op_interpolate(grove_fwd *f, const grove_tensor *x0, const int64_t *size,
                                   const double *scale, int nsp, int mode, bool align_corners,
                                   grove_tensor *out) {
  char b[128];
  if (x0->dtype != GROVE_F32)
    return grove_err_set(f->err, GROVE_E_DTYPE, "interpolate: expected a float32 input, got %s",
                         grove_dtype_name(x0->dtype));
  if (mode == GROVE__INTERP_CUBIC && nsp != 2)
    return grove_err_set(f->err, GROVE_E_SHAPE,
                         "interpolate: Got %dD input, but bicubic mode needs 4D input", x0->ndim);
  if (nsp < 1 || nsp > 2 || x0->ndim != nsp + 2)
    return grove_err_set(f->err, GROVE_E_SHAPE,
                         "interpolate: expected an input [N, C, W] or [N, C, H, W] with %d size(s), "
                         "got %s",
                         nsp, grove_shape_str(x0->ndim, x0->shape, b, sizeof b));
  for (int d = 0; d < nsp; d++)
    if (size[d] <= 0 || x0->shape[2 + d] <= 0)
      return grove_err_set(f->err, GROVE_E_SHAPE,
                           "interpolate: input and output sizes must be positive (input %s, "
                           "output size %lld)",
                           grove_shape_str(x0->ndim, x0->shape, b, sizeof b), (long long)size[d]);
  grove_tensor x;
  grove_status s = grove__fwd_contig(f, x0, &x);
  if (s) return s;
  /* 1-d is 2-d with a height of 1. */
  const int64_t N = x.shape[0], C = x.shape[1];
  const int64_t H = nsp == 2 ? x.shape[2] : 1, W = x.shape[nsp + 1];
  const int64_t OH = nsp == 2 ? size[0] : 1, OW = size[nsp - 1];
  int64_t oshape[4] = {N, C, OH, OW};
  if (nsp == 1) oshape[2] = OW;
  if ((s = grove_fwd_alloc(f, out, GROVE_F32, nsp + 2, oshape))) return s;
  const bool align = (mode == GROVE__INTERP_LINEAR || mode == GROVE__INTERP_CUBIC) && align_corners;
  const float sh = coord_scale(H, OH, align, nsp == 2 && scale ? scale[0] : 0);
  const float sw = coord_scale(W, OW, align, scale ? scale[nsp - 1] : 0);
  if (mode == GROVE__INTERP_CUBIC) {
    int64_t *cx = grove_arena_alloc(f->arena, (size_t)(4 * (OW + OH)) * sizeof(int64_t));
    float *wx = grove_arena_alloc(f->arena, (size_t)(4 * (OW + OH)) * sizeof(float));
    if (!cx || !wx) return grove__scratch_error(f, "interpolate");
    int64_t *cy = cx + 4 * OW;
    float *wy = wx + 4 * OW;
    for (int64_t j = 0; j < OW; j++) cubic_src(j, W, sw, align, cx + 4 * j, wx + 4 * j);
    for (int64_t i = 0; i < OH; i++) cubic_src(i, H, sh, align, cy + 4 * i, wy + 4 * i);
    bicubic(x.data, out->data, N * C, H, W, OH, OW, cx, wx, cy, wy);
    return GROVE_OK;
  }
  /* The source columns (and weights) of every output column, once. */
  int64_t *c0 = grove_arena_alloc(f->arena, (size_t)(2 * OW + 2 * OH) * sizeof(int64_t));
  float *lw = grove_arena_alloc(f->arena, (size_t)(OW + OH) * sizeof(float));
  if (!c0 || !lw) return grove__scratch_error(f, "interpolate");
  int64_t *c1 = c0 + OW, *r0 = c1 + OW, *r1 = r0 + OH;
  float *lh = lw + OW;
  for (int64_t j = 0; j < OW; j++) {
    if (mode == GROVE__INTERP_LINEAR)
      linear_src(j, W, sw, align, &c0[j], &c1[j], &lw[j]);
    else
      c0[j] = nearest_src(mode, j, W, OW, sw);
  }
  for (int64_t i = 0; i < OH; i++) {
    if (nsp == 1) {
      r0[i] = r1[i] = 0;
      lh[i] = 0;
    } else if (mode == GROVE__INTERP_LINEAR) {
      linear_src(i, H, sh, align, &r0[i], &r1[i], &lh[i]);
    } else {
      r0[i] = nearest_src(mode, i, H, OH, sh);
    }
  }
  const float *xv = x.data;
  float *y = out->data;
  for (int64_t p = 0; p < N * C; p++) {
    const float *xp = xv + p * H * W;
    float *yp = y + p * OH * OW;
    for (int64_t i = 0; i < OH; i++) {
      float *yr = yp + i * OW;
      if (mode != GROVE__INTERP_LINEAR) {
        const float *xr = xp + r0[i] * W;
        for (int64_t j = 0; j < OW; j++) yr[j] = xr[c0[j]];
        continue;
      }
      const float *a = xp + r0[i] * W, *bb = xp + r1[i] * W;
      const float h1 = lh[i], h0 = 1.0f - h1;
      for (int64_t j = 0; j < OW; j++) {
        const float w1 = lw[j], w0 = 1.0f - w1;
        yr[j] = h0 * (w0 * a[c0[j]] + w1 * a[c1[j]]) + h1 * (w0 * bb[c0[j]] + w1 * bb[c1[j]]);
      }
    }
  }
  return GROVE_OK;
}

grove_status grove__op_pad(grove_fwd *f, const grove_tensor *x, const int64_t *pad, int npad,
                           double value, grove_tensor *out) {
  char b[128];
  if (npad % 2 || npad / 2 > x->ndim)
    return grove_err_set(f->err, GROVE_E_SHAPE,
                         "pad: the padding has %d numbers, expected an even number of at most "
                         "2 * %d (the input is %s)",
                         npad, x->ndim, grove_shape_str(x->ndim, x->shape, b, sizeof b));
  int64_t oshape[GROVE_MAX_DIMS];
  memcpy(oshape, x->shape, sizeof oshape);
  grove_tensor src = *x;
  int64_t dst_off[GROVE_MAX_DIMS] = {0};
  const size_t es = grove_dtype_size(x->dtype);
  for (int k = 0; k < npad / 2; k++) {
    const int d = x->ndim - 1 - k;
    const int64_t lo = pad[2 * k], hi = pad[2 * k + 1];
    oshape[d] = x->shape[d] + lo + hi;
    if (oshape[d] < 0 || lo < -x->shape[d] || hi < -x->shape[d])
      return grove_err_set(f->err, GROVE_E_SHAPE,
                           "pad: padding (%lld, %lld) of dimension %d (size %lld) leaves a "
                           "negative size",
                           (long long)lo, (long long)hi, d, (long long)x->shape[d]);
    /* A negative amount crops the source. */
    const int64_t cut_lo = lo < 0 ? -lo : 0, cut_hi = hi < 0 ? -hi : 0;
    src.shape[d] = x->shape[d] - cut_lo - cut_hi;
    if (src.shape[d] < 0) src.shape[d] = 0;
    if (src.shape[d] > 0) src.data = (char *)src.data + (size_t)(cut_lo * x->strides[d]) * es;
    dst_off[d] = lo > 0 ? lo : 0;
  }
  grove_status s = grove_fwd_alloc(f, out, x->dtype, x->ndim, oshape);
  if (s) return s;
  const int64_t n = grove_tensor_numel(out);
  if (x->dtype == GROVE_F32) {
    float *y = out->data;
    for (int64_t i = 0; i < n; i++) y[i] = (float)value;
  } else if (value == 0) {
    memset(out->data, 0, (size_t)n * es);
  } else {
    return grove_err_set(f->err, GROVE_E_DTYPE, "pad: a %s input pads with 0 only",
                         grove_dtype_name(x->dtype));
  }
  grove_tensor dst = *out;
  int64_t off = 0;
  for (int d = 0; d < x->ndim; d++) {
    dst.shape[d] = src.shape[d];
    off += dst_off[d] * out->strides[d];
  }
  dst.data = (char *)out->data + (size_t)off * es;
  if (grove_tensor_numel(&dst) == 0) return GROVE_OK;
  return grove_tensor_copy(&dst, &src, f->err);
}

/* Where output index o of a padded dimension of size n (lo before it)
 * reads, in each mode (aten's reflection_pad, replication_pad and
 * _pad_circular): the callers checked that it lands inside [0, n). */
static int64_t edge_src(int mode, int64_t o, int64_t lo, int64_t n) {
  int64_t i = o - lo;
  switch (mode) {
    case GROVE__PAD_REFLECT:
      if (i < 0) i = -i;
      if (i >= n) i = 2 * (n - 1) - i;
      return i;
    case GROVE__PAD_REPLICATE:
      return i < 0 ? 0 : i >= n ? n - 1 : i;
    default: /* circular */
      return ((i % n) + n) % n;
  }
}

grove_status grove__op_pad_edge(grove_fwd *f, const grove_tensor *x0, const int64_t *pad, int npad,
                                int mode, grove_tensor *out) {
  static const char *const names[] = {"constant", "reflect", "replicate", "circular"};
  const char *mname = names[mode];
  char b[128];
  const int k = npad / 2;
  /* torch's rule (at::pad): 2, 4 or 6 numbers, for an input with one or two
   * more dimensions (the batch and channel dims are never padded). */
  if (npad % 2 || k < 1 || k > 3 || x0->ndim < k + 1 || x0->ndim > k + 2)
    return grove_err_set(f->err, GROVE_E_SHAPE,
                         "pad: mode \"%s\" pads the last 1, 2 or 3 dimensions of an input of 2-3, "
                         "3-4 or 4-5 dimensions; got %d padding numbers for an input %s",
                         mname, npad, grove_shape_str(x0->ndim, x0->shape, b, sizeof b));
  const int nd = x0->ndim;
  int64_t oshape[GROVE_MAX_DIMS];
  memcpy(oshape, x0->shape, sizeof oshape);
  size_t nmap = 0;
  for (int j = 0; j < k; j++) {
    const int d = nd - 1 - j;
    const int64_t n = x0->shape[d], lo = pad[2 * j], hi = pad[2 * j + 1];
    const int64_t lim = mode == GROVE__PAD_REFLECT    ? n - 1
                        : mode == GROVE__PAD_CIRCULAR ? n
                                                      : INT64_MAX;
    /* Amounts from outside: |lo|, |hi| <= 2^30 (the op's range) and n fits
     * a tensor, so the sums below do not overflow. */
    if (n < 1 || lo > lim || hi > lim || lo < -n || hi < -n || n + lo + hi < 1)
      return grove_err_set(f->err, GROVE_E_SHAPE,
                           "pad: mode \"%s\": padding (%lld, %lld) of dimension %d of input %s: %s",
                           mname, (long long)lo, (long long)hi, d,
                           grove_shape_str(nd, x0->shape, b, sizeof b),
                           n < 1 ? "the dimension is empty"
                           : mode == GROVE__PAD_REFLECT && (lo > lim || hi > lim)
                               ? "each amount must be less than the dimension's size"
                           : mode == GROVE__PAD_CIRCULAR && (lo > lim || hi > lim)
                               ? "an amount larger than the dimension would wrap around more "
                                 "than once"
                               : "the result would be empty");
    oshape[d] = n + lo + hi;
    nmap += (size_t)oshape[d];
  }
  grove_tensor x;
  grove_status s = grove__fwd_contig(f, x0, &x);
  if (s) return s;
  int64_t *map = grove_arena_alloc(f->arena, nmap * sizeof(int64_t));
  if (!map) return grove__scratch_error(f, "pad");
  /* maps[d]: the source index of each output index along padded dim d;
   * NULL for the dims left as they are. */
  const int64_t *maps[GROVE_MAX_DIMS] = {NULL};
  for (int j = 0, at = 0; j < k; j++) {
    const int d = nd - 1 - j;
    int64_t *m = map + at;
    for (int64_t o = 0; o < oshape[d]; o++) m[o] = edge_src(mode, o, pad[2 * j], x.shape[d]);
    maps[d] = m;
    at += (int)oshape[d];
  }
  if ((s = grove_fwd_alloc(f, out, x.dtype, nd, oshape))) return s;
  const size_t es = grove_dtype_size(x.dtype);
  const int64_t W = oshape[nd - 1], *mw = maps[nd - 1];
  int64_t rows = 1;
  for (int d = 0; d < nd - 1; d++) rows *= oshape[d];
  int64_t idx[GROVE_MAX_DIMS] = {0};
  const char *xs = x.data;
  char *y = out->data;
  for (int64_t r = 0; r < rows; r++, y += (size_t)W * es) {
    int64_t off = 0; /* the source row, in elements */
    for (int d = 0; d < nd - 1; d++) off += (maps[d] ? maps[d][idx[d]] : idx[d]) * x.strides[d];
    const char *xr = xs + (size_t)off * es;
    if (es == 4) {
      const float *xf = (const float *)xr;
      float *yf = (float *)y;
      for (int64_t o = 0; o < W; o++) yf[o] = xf[mw[o]];
    } else {
      for (int64_t o = 0; o < W; o++) memcpy(y + (size_t)o * es, xr + (size_t)mw[o] * es, es);
    }
    for (int d = nd - 2; d >= 0; d--) {
      if (++idx[d] < oshape[d]) break;
      idx[d] = 0;
    }
  }
  return GROVE_OK;
}

grove_status grove__op_pixel_shuffle(grove_fwd *f, const grove_tensor *x0, int64_t r, bool inverse,
                                     grove_tensor *out) {
  char b[128];
  const int nd = x0->ndim;
  const bool ok = nd >= 3 && r > 0 &&
                  (inverse ? x0->shape[nd - 2] % r == 0 && x0->shape[nd - 1] % r == 0
                           : x0->shape[nd - 3] % (r * r) == 0);
  if (!ok && inverse)
    return grove_err_set(f->err, GROVE_E_SHAPE,
                         "pixel_unshuffle: expected an input [*, C, H * %lld, W * %lld] "
                         "(downscale factor %lld), got %s",
                         (long long)r, (long long)r, (long long)r,
                         grove_shape_str(nd, x0->shape, b, sizeof b));
  if (!ok)
    return grove_err_set(f->err, GROVE_E_SHAPE,
                         "pixel_shuffle: expected an input [*, C * %lld, H, W] (upscale factor "
                         "%lld), got %s",
                         (long long)(r * r), (long long)r,
                         grove_shape_str(nd, x0->shape, b, sizeof b));
  grove_tensor x;
  grove_status s = grove__fwd_contig(f, x0, &x);
  if (s) return s;
  /* The shuffled side [B, C, H * r, W * r] and the stacked side
   * [B, C * r * r, H, W]. */
  const int64_t C = inverse ? x.shape[nd - 3] : x.shape[nd - 3] / (r * r);
  const int64_t H = inverse ? x.shape[nd - 2] / r : x.shape[nd - 2];
  const int64_t W = inverse ? x.shape[nd - 1] / r : x.shape[nd - 1];
  int64_t B = 1;
  for (int d = 0; d < nd - 3; d++) B *= x.shape[d];
  int64_t oshape[GROVE_MAX_DIMS];
  memcpy(oshape, x.shape, sizeof oshape);
  oshape[nd - 3] = inverse ? C * r * r : C;
  oshape[nd - 2] = inverse ? H : H * r;
  oshape[nd - 1] = inverse ? W : W * r;
  if ((s = grove_fwd_alloc(f, out, x.dtype, nd, oshape))) return s;
  /* shuffled[b, c, h * r + i, w * r + j] = stacked[b, c * r * r + i * r + j,
   * h, w]: the shuffled side walked as [B, C, H, r, W, r] contiguously, the
   * stacked side by strides; the copy runs from whichever is the input. */
  const int64_t sh6[6] = {B, C, H, r, W, r};
  const int64_t st6[6] = {C * r * r * H * W, r * r * H * W, W, r * H * W, 1, H * W};
  grove_tensor stacked, shuffled;
  grove_tensor_init(&stacked, x.dtype, 6, sh6, inverse ? out->data : x.data);
  memcpy(stacked.strides, st6, sizeof st6);
  grove_tensor_init(&shuffled, x.dtype, 6, sh6, inverse ? x.data : out->data);
  if (grove_tensor_numel(&shuffled) == 0) return GROVE_OK;
  return inverse ? grove_tensor_copy(&stacked, &shuffled, f->err)
                 : grove_tensor_copy(&shuffled, &stacked, f->err);
}
