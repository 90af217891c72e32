/* shape_ops.c: the shape operations of the torchvision zoo and of masks
 * (tensor_ops.h): chunk, split, unbind, narrow, unsqueeze, squeeze and
 * expand as views of their input (no copy, as in torch), and stack,
 * repeat, roll, index_select, flip, gather and one_hot, which copy.
 *
 * A view keeps its input's dtype, storage and strides; the evaluator
 * tracks the sharing (graph.c), as for graph_ops.c's views. */
#include <string.h>

#include "graph_ops.h"
#include "tensor_ops.h"

static grove_status too_many(grove_fwd *f, const char *op, int64_t n, int max) {
  return grove_err_set(f->err, GROVE_E_SHAPE, "%s: %lld parts, Grove takes at most %d", op,
                       (long long)n, max);
}

/* x's part [start, start + len) along d, a view. */
static grove_tensor part(const grove_tensor *x, int d, int64_t start, int64_t len) {
  grove_tensor y = *x;
  y.shape[d] = len;
  if (len > 0)
    y.data = (char *)x->data + (size_t)(start * x->strides[d]) * grove_dtype_size(x->dtype);
  return y;
}

grove_status grove__op_chunk(grove_fwd *f, const grove_tensor *x, int64_t chunks, int64_t dim,
                             grove_tensor *outs, int max, int *n) {
  int d;
  grove_status s;
  if (x->ndim == 0)
    return grove_err_set(f->err, GROVE_E_SHAPE, "chunk expects at least a 1-dimensional tensor");
  if ((s = grove__dim_index(f, dim, x->ndim, &d))) return s;
  if (chunks <= 0)
    return grove_err_set(f->err, GROVE_E_INVALID_ARGUMENT,
                         "chunk expects `chunks` to be greater than 0, got: %lld",
                         (long long)chunks);
  /* torch: parts of ceil(len / chunks), as many as that makes (fewer than
   * chunks when it does not divide). */
  const int64_t len = x->shape[d];
  const int64_t size = (len + chunks - 1) / chunks;
  if (size == 0) return grove__op_split(f, x, NULL, 1, 0, d, outs, max, n);
  return grove__op_split(f, x, NULL, 1, size, d, outs, max, n);
}

grove_status grove__op_split(grove_fwd *f, const grove_tensor *x, const int64_t *sizes,
                             int nsizes, int64_t size, int64_t dim, grove_tensor *outs, int max,
                             int *n) {
  int d;
  grove_status s;
  if (x->ndim == 0)
    return grove_err_set(f->err, GROVE_E_SHAPE, "split expects at least a 1-dimensional tensor");
  if ((s = grove__dim_index(f, dim, x->ndim, &d))) return s;
  const int64_t len = x->shape[d];
  if (!sizes) {
    if (size < 0)
      return grove_err_set(f->err, GROVE_E_INVALID_ARGUMENT,
                           "split expects split_size be non-negative, but got split_size=%lld",
                           (long long)size);
    if (size == 0) {
      if (len != 0)
        return grove_err_set(f->err, GROVE_E_INVALID_ARGUMENT,
                             "split_size can only be 0 if dimension size is 0, but got dimension "
                             "size of %lld",
                             (long long)len);
      if (max < 1) return too_many(f, "split", 1, max);
      outs[0] = *x;
      *n = 1;
      return GROVE_OK;
    }
    const int64_t parts = len == 0 ? 1 : (len + size - 1) / size;
    if (parts > max) return too_many(f, "split", parts, max);
    for (int64_t i = 0; i < parts; i++) {
      const int64_t st = i * size;
      outs[i] = part(x, d, st, st + size <= len ? size : len - st);
    }
    *n = (int)parts;
    return GROVE_OK;
  }
  int64_t total = 0;
  for (int i = 0; i < nsizes; i++) {
    if (sizes[i] < 0)
      return grove_err_set(f->err, GROVE_E_INVALID_ARGUMENT,
                           "split: split_sizes must be non-negative, got %lld",
                           (long long)sizes[i]);
    total += sizes[i];
  }
  if (total != len)
    return grove_err_set(f->err, GROVE_E_SHAPE,
                         "split_with_sizes expects split_sizes to sum exactly to %lld (input "
                         "tensor's size at dimension %d), but got split_sizes summing to %lld",
                         (long long)len, d, (long long)total);
  if (nsizes > max) return too_many(f, "split", nsizes, max);
  int64_t st = 0;
  for (int i = 0; i < nsizes; i++) {
    outs[i] = part(x, d, st, sizes[i]);
    st += sizes[i];
  }
  *n = nsizes;
  return GROVE_OK;
}

grove_status grove__op_unbind(grove_fwd *f, const grove_tensor *x, int64_t dim,
                              grove_tensor *outs, int max, int *n) {
  int d;
  grove_status s;
  if (x->ndim == 0)
    return grove_err_set(f->err, GROVE_E_SHAPE, "unbind: dimension specified as 0 but tensor has "
                                                "no dimensions");
  if ((s = grove__dim_index(f, dim, x->ndim, &d))) return s;
  const int64_t len = x->shape[d];
  if (len > max) return too_many(f, "unbind", len, max);
  for (int64_t i = 0; i < len; i++) {
    grove_tensor y = part(x, d, i, 1);
    memmove(&y.shape[d], &y.shape[d + 1], (size_t)(x->ndim - d - 1) * sizeof(int64_t));
    memmove(&y.strides[d], &y.strides[d + 1], (size_t)(x->ndim - d - 1) * sizeof(int64_t));
    y.ndim--;
    outs[i] = y;
  }
  *n = (int)len;
  return GROVE_OK;
}

grove_status grove__op_narrow(grove_fwd *f, const grove_tensor *x, int64_t dim, int64_t start,
                              int64_t length, grove_tensor *out) {
  int d;
  grove_status s;
  if (x->ndim == 0)
    return grove_err_set(f->err, GROVE_E_SHAPE, "narrow() cannot be applied to a 0-dim tensor.");
  if ((s = grove__dim_index(f, dim, x->ndim, &d))) return s;
  const int64_t len = x->shape[d];
  if (start < -len || start > len)
    return grove_err_set(f->err, GROVE_E_RANGE,
                         "narrow: start (%lld) is out of range for dimension %d of size %lld",
                         (long long)start, d, (long long)len);
  if (start < 0) start += len;
  if (length < 0 || start > len - length)
    return grove_err_set(f->err, GROVE_E_RANGE,
                         "narrow: start (%lld) + length (%lld) exceeds dimension size (%lld)",
                         (long long)start, (long long)length, (long long)len);
  *out = part(x, d, start, length);
  return GROVE_OK;
}

grove_status grove__op_unsqueeze(grove_fwd *f, const grove_tensor *x, int64_t dim,
                                 grove_tensor *out) {
  int d;
  grove_status s;
  if (x->ndim >= GROVE_MAX_DIMS)
    return grove_err_set(f->err, GROVE_E_SHAPE, "unsqueeze: at most %d dimensions",
                         GROVE_MAX_DIMS);
  if ((s = grove__dim_index(f, dim, x->ndim + 1, &d))) return s;
  grove_tensor y = *x;
  memmove(&y.shape[d + 1], &x->shape[d], (size_t)(x->ndim - d) * sizeof(int64_t));
  memmove(&y.strides[d + 1], &x->strides[d], (size_t)(x->ndim - d) * sizeof(int64_t));
  y.shape[d] = 1;
  /* torch's stride for the new dim: the next dim's extent. */
  y.strides[d] = d < x->ndim ? x->shape[d] * x->strides[d] : 1;
  y.ndim++;
  *out = y;
  return GROVE_OK;
}

grove_status grove__op_squeeze(grove_fwd *f, const grove_tensor *x, const int64_t *dim,
                               grove_tensor *out) {
  int only = -1;
  grove_status s;
  if (dim && x->ndim > 0 && (s = grove__dim_index(f, *dim, x->ndim, &only))) return s;
  if (dim && x->ndim == 0) {
    if ((s = grove__dim_index(f, *dim, 0, &only))) return s;
    *out = *x;
    return GROVE_OK;
  }
  grove_tensor y = *x;
  y.ndim = 0;
  for (int d = 0; d < x->ndim; d++) {
    const bool drop = x->shape[d] == 1 && (only < 0 || d == only);
    if (drop) continue;
    y.shape[y.ndim] = x->shape[d];
    y.strides[y.ndim++] = x->strides[d];
  }
  *out = y;
  return GROVE_OK;
}

grove_status grove__op_expand(grove_fwd *f, const grove_tensor *x, const int64_t *sizes, int n,
                              grove_tensor *out) {
  char a[128], b[128];
  if (n < x->ndim || n > GROVE_MAX_DIMS)
    return grove_err_set(f->err, GROVE_E_SHAPE,
                         "expand: the number of sizes provided (%d) must be greater or equal to "
                         "the number of dimensions in the tensor (%d)",
                         n, x->ndim);
  grove_tensor y = *x;
  y.ndim = n;
  for (int i = 0; i < n; i++) {
    const int src = x->ndim - n + i;
    const int64_t want = sizes[i];
    if (src < 0) {
      if (want < 0)
        return grove_err_set(f->err, GROVE_E_SHAPE,
                             "expand: -1 is not allowed in a leading, non-existing dimension %d",
                             i);
      y.shape[i] = want;
      y.strides[i] = 0;
      continue;
    }
    const int64_t have = x->shape[src];
    if (want == -1 || want == have) {
      y.shape[i] = have;
      y.strides[i] = x->strides[src];
    } else if (have == 1 && want >= 0) {
      y.shape[i] = want;
      y.strides[i] = 0;
    } else {
      return grove_err_set(f->err, GROVE_E_SHAPE,
                           "expand: the expanded size of the tensor (%lld) must match the "
                           "existing size (%lld) at non-singleton dimension %d.  Target sizes: "
                           "%s.  Tensor sizes: %s",
                           (long long)want, (long long)have, i, grove_shape_str(n, sizes, a, sizeof a),
                           grove_shape_str(x->ndim, x->shape, b, sizeof b));
    }
  }
  *out = y;
  return GROVE_OK;
}

grove_status grove__op_stack(grove_fwd *f, const grove_tensor *ts, int n, int64_t dim,
                             grove_tensor *out) {
  if (n <= 0 || n > 64)
    return grove_err_set(f->err, GROVE_E_INVALID_ARGUMENT,
                         "stack expects a non-empty list of at most 64 tensors, got %d", n);
  grove_tensor u[64];
  for (int i = 0; i < n; i++) {
    if (!grove_tensor_same_shape(&ts[i], &ts[0])) {
      char a[128], b[128];
      return grove_err_set(f->err, GROVE_E_SHAPE,
                           "stack expects each tensor to be equal size, but got %s at entry 0 "
                           "and %s at entry %d",
                           grove_shape_str(ts[0].ndim, ts[0].shape, a, sizeof a),
                           grove_shape_str(ts[i].ndim, ts[i].shape, b, sizeof b), i);
    }
    grove_status s = grove__op_unsqueeze(f, &ts[i], dim, &u[i]);
    if (s) return s;
  }
  int d;
  grove_status s = grove__dim_index(f, dim, ts[0].ndim + 1, &d);
  if (s) return s;
  return grove__op_cat(f, u, n, d, out);
}

grove_status grove__op_repeat(grove_fwd *f, const grove_tensor *x, const int64_t *reps, int n,
                              grove_tensor *out) {
  if (n < x->ndim || n > GROVE_MAX_DIMS / 2)
    return grove_err_set(f->err, GROVE_E_SHAPE,
                         "repeat: number of repeat dims (%d) can not be smaller than number of "
                         "dimensions of tensor (%d), nor more than %d",
                         n, x->ndim, GROVE_MAX_DIMS / 2);
  int64_t oshape[GROVE_MAX_DIMS], xs[GROVE_MAX_DIMS], xst[GROVE_MAX_DIMS];
  for (int i = 0; i < n; i++) {
    const int src = x->ndim - n + i;
    xs[i] = src < 0 ? 1 : x->shape[src];
    xst[i] = src < 0 ? 0 : x->strides[src];
    if (reps[i] < 0)
      return grove_err_set(f->err, GROVE_E_SHAPE, "repeat: repeats cannot be negative, got %lld",
                           (long long)reps[i]);
    oshape[i] = xs[i] * reps[i];
  }
  grove_status s = grove_fwd_alloc(f, out, x->dtype, n, oshape);
  if (s || grove_tensor_numel(out) == 0) return s;
  /* out seen as [r0, s0, r1, s1, ...]; x broadcast over the r dims. */
  int64_t sh[GROVE_MAX_DIMS], st[GROVE_MAX_DIMS];
  for (int i = 0; i < n; i++) {
    sh[2 * i] = reps[i];
    sh[2 * i + 1] = xs[i];
    st[2 * i] = 0;
    st[2 * i + 1] = xst[i];
  }
  grove_tensor src, dst;
  grove_tensor_init(&src, x->dtype, 2 * n, sh, x->data);
  memcpy(src.strides, st, sizeof st);
  grove_tensor_init(&dst, x->dtype, 2 * n, sh, out->data);
  return grove_tensor_copy(&dst, &src, f->err);
}

grove_status grove__op_roll(grove_fwd *f, const grove_tensor *x, const int64_t *shifts,
                            const int64_t *dims, int ndims, grove_tensor *out) {
  grove_status s;
  if (ndims == 0) {
    /* Flattened: roll the contiguous copy as 1-d, then give the shape back. */
    grove_tensor c, flat, r;
    if ((s = grove__fwd_contig(f, x, &c))) return s;
    const int64_t n = grove_tensor_numel(&c);
    grove_tensor_init(&flat, c.dtype, 1, &n, c.data);
    const int64_t d0 = 0;
    if ((s = grove__op_roll(f, &flat, shifts, &d0, 1, &r))) return s;
    grove_tensor_init(out, r.dtype, x->ndim, x->shape, r.data);
    return GROVE_OK;
  }
  if ((s = grove_fwd_alloc(f, out, x->dtype, x->ndim, x->shape))) return s;
  if (grove_tensor_numel(out) == 0) return GROVE_OK;
  int64_t shift[GROVE_MAX_DIMS] = {0};
  for (int i = 0; i < ndims; i++) {
    int d;
    if ((s = grove__dim_index(f, dims[i], x->ndim, &d))) return s;
    const int64_t len = x->shape[d];
    shift[d] = ((shifts[i] % len) + len + shift[d]) % len;
  }
  /* Each dim splits into two blocks: out[shift:] = x[:len - shift] and
   * out[:shift] = x[len - shift:]; 2^k block copies for k rolled dims. */
  const size_t es = grove_dtype_size(x->dtype);
  int rolled[GROVE_MAX_DIMS], k = 0;
  for (int d = 0; d < x->ndim; d++)
    if (shift[d]) rolled[k++] = d;
  for (int mask = 0; mask < (1 << k); mask++) {
    grove_tensor src = *x, dst = *out;
    bool empty = false;
    for (int j = 0; j < k; j++) {
      const int d = rolled[j];
      const int64_t len = x->shape[d], sh = shift[d];
      const bool tail = (mask >> j) & 1; /* the part that wraps around */
      const int64_t sst = tail ? len - sh : 0, dstart = tail ? 0 : sh;
      const int64_t cnt = tail ? sh : len - sh;
      if (cnt == 0) empty = true;
      src.shape[d] = dst.shape[d] = cnt;
      src.data = (char *)src.data + (size_t)(sst * x->strides[d]) * es;
      dst.data = (char *)dst.data + (size_t)(dstart * out->strides[d]) * es;
    }
    if (!empty && (s = grove_tensor_copy(&dst, &src, f->err))) return s;
  }
  return GROVE_OK;
}

grove_status grove__op_index_select(grove_fwd *f, const grove_tensor *x, int64_t dim,
                                    const grove_tensor *index, bool negative,
                                    grove_tensor *out) {
  int d;
  grove_status s;
  if (index->dtype != GROVE_I64 && index->dtype != GROVE_I32)
    return grove_err_set(f->err, GROVE_E_DTYPE,
                         "index: tensors used as indices must be int64 (or int32), got %s",
                         grove_dtype_name(index->dtype));
  if (x->ndim == 0)
    return grove_err_set(f->err, GROVE_E_SHAPE, "index: cannot index a 0-d tensor with a tensor");
  if ((s = grove__dim_index(f, dim, x->ndim, &d))) return s;
  if (x->ndim - 1 + index->ndim > GROVE_MAX_DIMS)
    return grove_err_set(f->err, GROVE_E_SHAPE, "index: the result has more than %d dimensions",
                         GROVE_MAX_DIMS);
  grove_tensor ix;
  if ((s = grove__fwd_contig(f, index, &ix))) return s;
  const int64_t ni = grove_tensor_numel(&ix), len = x->shape[d];
  int64_t oshape[GROVE_MAX_DIMS];
  int nd = 0;
  for (int k = 0; k < d; k++) oshape[nd++] = x->shape[k];
  for (int k = 0; k < index->ndim; k++) oshape[nd++] = index->shape[k];
  for (int k = d + 1; k < x->ndim; k++) oshape[nd++] = x->shape[k];
  if ((s = grove_fwd_alloc(f, out, x->dtype, nd, oshape))) return s;
  /* out seen as [pre, ni, post], one slab copy per id. */
  const size_t es = grove_dtype_size(x->dtype);
  grove_tensor dst = *out, src = *x;
  dst.ndim = x->ndim;
  memcpy(dst.shape, x->shape, sizeof dst.shape);
  dst.shape[d] = 1;
  grove_contiguous_strides(x->ndim, x->shape, dst.strides);
  /* The dims after d keep their contiguous strides; those before step
   * over the ni ids' slabs. */
  int64_t post = 1;
  for (int k = d + 1; k < x->ndim; k++) post *= x->shape[k];
  dst.strides[d] = post;
  for (int k = d - 1; k >= 0; k--)
    dst.strides[k] = dst.strides[k + 1] * (k + 1 == d ? ni : dst.shape[k + 1]);
  src.shape[d] = 1;
  for (int64_t i = 0; i < ni; i++) {
    int64_t id = ix.dtype == GROVE_I64 ? ((const int64_t *)ix.data)[i]
                                       : ((const int32_t *)ix.data)[i];
    /* torch.index_select takes no negative ids; indexing x[ids] does. */
    if (id < (negative ? -len : 0) || id >= len)
      return grove_err_set(f->err, GROVE_E_RANGE,
                           "index %lld is out of bounds for dimension %d with size %lld",
                           (long long)id, d, (long long)len);
    if (id < 0) id += len;
    grove_tensor si = src, di = dst;
    si.data = (char *)x->data + (size_t)(id * x->strides[d]) * es;
    di.data = (char *)out->data + (size_t)(i * post) * es;
    if (grove_tensor_numel(&si) && (s = grove_tensor_copy(&di, &si, f->err))) return s;
  }
  return GROVE_OK;
}

/* Index tensor element i (int64 or int32, contiguous). */
static int64_t id_at(const grove_tensor *ix, int64_t i) {
  return ix->dtype == GROVE_I64 ? ((const int64_t *)ix->data)[i] : ((const int32_t *)ix->data)[i];
}

/* Steps the multi-index idx over shape (last dim fastest); false at the end. */
static bool next_index(int64_t *idx, const int64_t *shape, int nd) {
  for (int d = nd - 1; d >= 0; d--) {
    if (++idx[d] < shape[d]) return true;
    idx[d] = 0;
  }
  return false;
}

grove_status grove__op_flip(grove_fwd *f, const grove_tensor *x, const int64_t *dims, int n,
                            grove_tensor *out) {
  bool rev[GROVE_MAX_DIMS] = {false};
  grove_status s;
  for (int i = 0; i < n; i++) {
    int d;
    if ((s = grove__dim_index(f, dims[i], x->ndim, &d))) return s;
    if (rev[d])
      return grove_err_set(f->err, GROVE_E_INVALID_ARGUMENT, "flip: dim %d appears multiple times",
                           d);
    rev[d] = true;
  }
  if ((s = grove_fwd_alloc(f, out, x->dtype, x->ndim, x->shape))) return s;
  const int64_t total = grove_tensor_numel(out);
  if (total == 0) return GROVE_OK;
  const size_t es = grove_dtype_size(x->dtype);
  const char *src = x->data;
  char *dst = out->data;
  int64_t idx[GROVE_MAX_DIMS] = {0};
  for (int64_t i = 0; i < total; i++) {
    int64_t off = 0;
    for (int d = 0; d < x->ndim; d++)
      off += (rev[d] ? x->shape[d] - 1 - idx[d] : idx[d]) * x->strides[d];
    memcpy(dst + (size_t)i * es, src + off * (int64_t)es, es);
    next_index(idx, x->shape, x->ndim);
  }
  return GROVE_OK;
}

grove_status grove__op_gather(grove_fwd *f, const grove_tensor *x, int64_t dim,
                              const grove_tensor *index, grove_tensor *out) {
  int d;
  grove_status s;
  if (index->dtype != GROVE_I64 && index->dtype != GROVE_I32)
    return grove_err_set(f->err, GROVE_E_DTYPE, "gather: index must be int64 (or int32), got %s",
                         grove_dtype_name(index->dtype));
  const int nd = x->ndim ? x->ndim : 1;
  if ((s = grove__dim_index(f, dim, x->ndim, &d))) return s;
  if ((index->ndim ? index->ndim : 1) != nd)
    return grove_err_set(f->err, GROVE_E_SHAPE,
                         "gather: index has %d dimensions and input %d; they must be equal",
                         index->ndim, x->ndim);
  for (int k = 0; k < x->ndim; k++)
    if (k != d && index->shape[k] > x->shape[k])
      return grove_err_set(f->err, GROVE_E_SHAPE,
                           "gather: size %lld of index at dimension %d is larger than the "
                           "input's %lld",
                           (long long)index->shape[k], k, (long long)x->shape[k]);
  grove_tensor ix;
  if ((s = grove__fwd_contig(f, index, &ix)) ||
      (s = grove_fwd_alloc(f, out, x->dtype, index->ndim, index->shape)))
    return s;
  const int64_t total = grove_tensor_numel(out);
  if (total == 0) return GROVE_OK;
  const size_t es = grove_dtype_size(x->dtype);
  const int64_t len = x->ndim ? x->shape[d] : 1;
  const char *src = x->data;
  char *dst = out->data;
  int64_t idx[GROVE_MAX_DIMS] = {0};
  for (int64_t i = 0; i < total; i++) {
    const int64_t id = id_at(&ix, i);
    if (id < 0 || id >= len) /* torch.gather takes no negative ids */
      return grove_err_set(f->err, GROVE_E_RANGE,
                           "gather: index %lld is out of bounds for dimension %d with size %lld",
                           (long long)id, d, (long long)len);
    int64_t off = 0;
    for (int k = 0; k < x->ndim; k++) off += (k == d ? id : idx[k]) * x->strides[k];
    memcpy(dst + (size_t)i * es, src + off * (int64_t)es, es);
    next_index(idx, index->shape, index->ndim);
  }
  return GROVE_OK;
}

grove_status grove__op_one_hot(grove_fwd *f, const grove_tensor *ids, int64_t num_classes,
                               grove_tensor *out) {
  if (ids->dtype != GROVE_I64 && ids->dtype != GROVE_I32)
    return grove_err_set(f->err, GROVE_E_DTYPE,
                         "one_hot: one_hot is only applicable to index tensor (int64), got %s",
                         grove_dtype_name(ids->dtype));
  if (ids->ndim >= GROVE_MAX_DIMS)
    return grove_err_set(f->err, GROVE_E_SHAPE, "one_hot: at most %d dimensions",
                         GROVE_MAX_DIMS - 1);
  grove_tensor ix;
  grove_status s = grove__fwd_contig(f, ids, &ix);
  if (s) return s;
  const int64_t n = grove_tensor_numel(&ix);
  int64_t mx = -1;
  for (int64_t i = 0; i < n; i++) {
    const int64_t v = id_at(&ix, i);
    if (v < 0)
      return grove_err_set(f->err, GROVE_E_RANGE,
                           "one_hot: class values must be non-negative, got %lld", (long long)v);
    if (v > mx) mx = v;
  }
  if (num_classes < 0) {
    if (n == 0)
      return grove_err_set(f->err, GROVE_E_INVALID_ARGUMENT,
                           "one_hot: can not infer total number of classes from empty tensor");
    num_classes = mx + 1;
  } else if (mx >= num_classes) {
    return grove_err_set(f->err, GROVE_E_RANGE,
                         "one_hot: class values must be smaller than "
                         "num_classes (%lld), got %lld",
                         (long long)num_classes, (long long)mx);
  }
  if (num_classes > ((int64_t)1 << 24))
    return grove_err_set(f->err, GROVE_E_LIMIT, "one_hot: more than 2^24 classes (%lld)",
                         (long long)num_classes);
  int64_t shape[GROVE_MAX_DIMS];
  memcpy(shape, ids->shape, (size_t)ids->ndim * sizeof(int64_t));
  shape[ids->ndim] = num_classes;
  if ((s = grove_fwd_alloc(f, out, GROVE_I64, ids->ndim + 1, shape))) return s;
  int64_t *y = out->data;
  memset(y, 0, (size_t)(n * num_classes) * sizeof(int64_t));
  for (int64_t i = 0; i < n; i++) y[i * num_classes + id_at(&ix, i)] = 1;
  return GROVE_OK;
}
