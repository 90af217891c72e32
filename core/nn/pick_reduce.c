/* pick_reduce.c: the reductions that pick an element rather than add
 * (tensor_ops.h): amax / amin over dims, max / min over a dim with the
 * indices, argmax / argmin.  NaN wins, as in torch (a max with a NaN is
 * NaN, its index the NaN's).  float32 and int64 inputs keep their dtype;
 * indices are int64. */
#include <math.h>
#include <string.h>

#include "graph_ops.h"
#include "tensor_ops.h"

/* Whether v beats the best so far (strictly: the first of equal values
 * stays, as torch's CPU kernels keep it). */
static inline bool beats_f(int op, float v, float best) {
  if (isnan(best)) return false;
  if (isnan(v)) return true;
  return op == GROVE__PICK_MAX ? v > best : v < best;
}

static inline bool beats_i(int op, int64_t v, int64_t best) {
  return op == GROVE__PICK_MAX ? v > best : v < best;
}

static grove_status pick_input(grove_fwd *f, const char *name, const grove_tensor *x) {
  if (x->dtype != GROVE_F32 && x->dtype != GROVE_I64)
    return grove_err_set(f->err, GROVE_E_DTYPE, "%s: expected a float32 or int64 tensor, got %s",
                         name, grove_dtype_name(x->dtype));
  return GROVE_OK;
}

/* x with the reduced dims moved last and merged: [kept..., reduced] as a
 * strided view of x when possible; outer = product of kept, inner = of
 * reduced.  The walk below then reads each output's run of inputs. */
typedef struct plan {
  int nk, nr;
  int64_t ksh[GROVE_MAX_DIMS], kst[GROVE_MAX_DIMS];
  int64_t rsh[GROVE_MAX_DIMS], rst[GROVE_MAX_DIMS];
  int64_t outer, inner;
} plan;

static void plan_make(const grove_tensor *x, const bool *red, plan *p) {
  memset(p, 0, sizeof *p);
  p->outer = p->inner = 1;
  for (int d = 0; d < x->ndim; d++) {
    if (red[d]) {
      p->rsh[p->nr] = x->shape[d];
      p->rst[p->nr++] = x->strides[d];
      p->inner *= x->shape[d];
    } else {
      p->ksh[p->nk] = x->shape[d];
      p->kst[p->nk++] = x->strides[d];
      p->outer *= x->shape[d];
    }
  }
}

/* Offset of the i-th element of an n-d index space (row-major). */
static int64_t offset_of(int64_t i, int n, const int64_t *sh, const int64_t *st) {
  int64_t off = 0;
  for (int d = n - 1; d >= 0; d--) {
    off += (i % sh[d]) * st[d];
    i /= sh[d];
  }
  return off;
}

/* The best of output o's run: its value's offset and its index in the
 * reduced space. */
static void pick_run(int op, const grove_tensor *x, const plan *p, int64_t o, int64_t *best_off,
                     int64_t *best_idx) {
  const int64_t base = offset_of(o, p->nk, p->ksh, p->kst);
  int64_t bo = base, bi = 0;
  for (int64_t j = 1; j < p->inner; j++) {
    const int64_t off = base + offset_of(j, p->nr, p->rsh, p->rst);
    const bool win = x->dtype == GROVE_F32
                         ? beats_f(op, ((const float *)x->data)[off], ((const float *)x->data)[bo])
                         : beats_i(op, ((const int64_t *)x->data)[off],
                                   ((const int64_t *)x->data)[bo]);
    if (win) {
      bo = off;
      bi = j;
    }
  }
  *best_off = bo;
  *best_idx = bi;
}

static grove_status out_shape(grove_fwd *f, const grove_tensor *x, const bool *red, bool keepdim,
                              grove_dtype dt, grove_tensor *out) {
  int64_t sh[GROVE_MAX_DIMS];
  int nd = 0;
  for (int d = 0; d < x->ndim; d++) {
    if (!red[d])
      sh[nd++] = x->shape[d];
    else if (keepdim)
      sh[nd++] = 1;
  }
  return grove_fwd_alloc(f, out, dt, nd, sh);
}

grove_status grove__op_amax(grove_fwd *f, int op, const grove_tensor *x, const int64_t *dims,
                            int ndims, bool keepdim, grove_tensor *out) {
  const char *name = op == GROVE__PICK_MAX ? "amax" : "amin";
  grove_status s = pick_input(f, name, x);
  if (s) return s;
  bool red[GROVE_MAX_DIMS] = {false};
  if (ndims <= 0) {
    for (int d = 0; d < x->ndim; d++) red[d] = true;
  }
  for (int i = 0; i < ndims; i++) {
    int d;
    if ((s = grove__dim_index(f, dims[i], x->ndim, &d))) return s;
    if (x->ndim == 0) continue;
    if (red[d])
      return grove_err_set(f->err, GROVE_E_SHAPE,
                           "dim %d appears multiple times in the list of dims", d);
    red[d] = true;
  }
  plan p;
  plan_make(x, red, &p);
  if (p.inner == 0)
    return grove_err_set(f->err, GROVE_E_SHAPE,
                         "%s: expected reduction dims of non-zero size (the input is empty)", name);
  if ((s = out_shape(f, x, red, keepdim, x->dtype, out))) return s;
  for (int64_t o = 0; o < p.outer; o++) {
    int64_t bo, bi;
    pick_run(op, x, &p, o, &bo, &bi);
    if (x->dtype == GROVE_F32)
      ((float *)out->data)[o] = ((const float *)x->data)[bo];
    else
      ((int64_t *)out->data)[o] = ((const int64_t *)x->data)[bo];
  }
  return GROVE_OK;
}

grove_status grove__op_max_dim(grove_fwd *f, int op, const grove_tensor *x, bool has_dim,
                               int64_t dim, bool keepdim, grove_tensor *values,
                               grove_tensor *indices) {
  const char *name = op == GROVE__PICK_MAX ? "max" : "min";
  grove_status s = pick_input(f, name, x);
  if (s) return s;
  bool red[GROVE_MAX_DIMS] = {false};
  if (!has_dim) {
    for (int d = 0; d < x->ndim; d++) red[d] = true;
    keepdim = false;
  } else {
    int d;
    if ((s = grove__dim_index(f, dim, x->ndim, &d))) return s;
    if (x->ndim > 0) red[d] = true;
  }
  plan p;
  plan_make(x, red, &p);
  if (p.inner == 0)
    return grove_err_set(f->err, GROVE_E_SHAPE,
                         "%s: cannot pick from an empty dimension (the input is empty)", name);
  if (values && (s = out_shape(f, x, red, keepdim, x->dtype, values))) return s;
  if (indices && (s = out_shape(f, x, red, keepdim, GROVE_I64, indices))) return s;
  for (int64_t o = 0; o < p.outer; o++) {
    int64_t bo, bi;
    pick_run(op, x, &p, o, &bo, &bi);
    if (values) {
      if (x->dtype == GROVE_F32)
        ((float *)values->data)[o] = ((const float *)x->data)[bo];
      else
        ((int64_t *)values->data)[o] = ((const int64_t *)x->data)[bo];
    }
    if (indices) ((int64_t *)indices->data)[o] = bi;
  }
  return GROVE_OK;
}
