/* backward_tensor.c: differentiable tensor operations on the tape's vars for
 * the attention layers and graphs: elementwise arithmetic with broadcasting,
 * arithmetic with a number, matmul, permute, cat, sum / mean, and basic
 * indexing, each with torch's semantics (shapes, broadcasting, matmul's
 * 1-d rules) and the backward autograd would run.
 *
 * Vars are contiguous, so views (permute, indexing) are materialised as
 * copies here; a copy's backward scatters the gradient back through the same
 * index map.  One strided walker (an offset per element of a contiguous
 * output, from per-dimension strides of the source) serves gather, scatter,
 * broadcasting and the reduction of a broadcast gradient. */
#include <math.h>
#include <string.h>

#include "backward.h"
#include "graph.h"

static inline grove_tensor *val(grove__tape *t, int v) {
  return &t->vars[v].t;
}

/* ------------------------------------------------------------ strided walk */

/* Calls, for every element i of a contiguous tensor of `shape` (in
 * row-major order), fn with i and the offsets of that element in up to two
 * sources with strides sa and sb (0 strides broadcast). */
#define WALK(nd, shape, sa, sb, BODY)                        \
  do {                                                       \
    int64_t idx_[GROVE_MAX_DIMS] = {0};                      \
    int64_t oa_ = 0, ob_ = 0, total_ = 1;                    \
    for (int d_ = 0; d_ < (nd); d_++) total_ *= (shape)[d_]; \
    for (int64_t i_ = 0; i_ < total_; i_++) {                \
      const int64_t i = i_, oa = oa_, ob = ob_;              \
      (void)oa;                                              \
      (void)ob;                                              \
      BODY;                                                  \
      for (int d_ = (nd)-1; d_ >= 0; d_--) {                 \
        if (++idx_[d_] < (shape)[d_]) {                      \
          oa_ += (sa)[d_];                                   \
          ob_ += (sb)[d_];                                   \
          break;                                             \
        }                                                    \
        oa_ -= (sa)[d_] * ((shape)[d_] - 1);                 \
        ob_ -= (sb)[d_] * ((shape)[d_] - 1);                 \
        idx_[d_] = 0;                                        \
      }                                                      \
    }                                                        \
  } while (0)

static const int64_t zero_strides[GROVE_MAX_DIMS] = {0};

/* Strides of t (contiguous) aligned to an output of nd dims on the right,
 * 0 where t broadcasts (size 1 or missing). */
static void bcast_strides(const grove_tensor *t, int nd, const int64_t *oshape, int64_t *st) {
  int64_t cs[GROVE_MAX_DIMS];
  grove_contiguous_strides(t->ndim, t->shape, cs);
  for (int d = 0; d < nd; d++) {
    int td = d - (nd - t->ndim);
    st[d] = td < 0 || t->shape[td] == 1 || oshape[d] == 1 ? 0 : cs[td];
  }
}

static grove_status need_f32(grove__tape *t, int v, const char *op) {
  if (val(t, v)->dtype != GROVE_F32)
    return grove_err_set(t->err, GROVE_E_DTYPE, "%s: expected a float32 tensor, got %s", op,
                         grove_dtype_name(val(t, v)->dtype));
  return GROVE_OK;
}

/* ------------------------------------------------------------ binary */

static grove_status binary_backward(grove__tape *t, const grove__node *n) {
  const int a = n->in[0], b = n->in[1], y = n->out[0];
  const int op = (int)n->i[0];
  const float alpha = (float)n->d[0];
  const grove_tensor *yt = val(t, y), *at = val(t, a), *bt = val(t, b);
  const float *dy = grove__grad_in(t, y), *ad = at->data, *bd = bt->data;
  int64_t sa[GROVE_MAX_DIMS], sb[GROVE_MAX_DIMS];
  bcast_strides(at, yt->ndim, yt->shape, sa);
  bcast_strides(bt, yt->ndim, yt->shape, sb);
  float *da = grove__wants(t, a) ? grove__grad(t, a) : NULL;
  float *db = grove__wants(t, b) && b != a ? grove__grad(t, b) : NULL;
  if ((grove__wants(t, a) && !da) || (grove__wants(t, b) && b != a && !db)) return GROVE_E_NOMEM;
  /* a OP a: both sides land in a's gradient. */
  float *db_ = b == a && grove__wants(t, a) ? da : db;
  switch (op) {
    case GROVE__BIN_ADD:
    case GROVE__BIN_SUB: {
      const float sb_ = op == GROVE__BIN_ADD ? alpha : -alpha;
      WALK(yt->ndim, yt->shape, sa, sb, {
        if (da) da[oa] += dy[i];
        if (db_) db_[ob] += sb_ * dy[i];
      });
      break;
    }
    case GROVE__BIN_MUL:
      WALK(yt->ndim, yt->shape, sa, sb, {
        if (da) da[oa] += dy[i] * bd[ob];
        if (db_) db_[ob] += dy[i] * ad[oa];
      });
      break;
    case GROVE__BIN_DIV:
      WALK(yt->ndim, yt->shape, sa, sb, {
        if (da) da[oa] += dy[i] / bd[ob];
        if (db_) db_[ob] += -dy[i] * ad[oa] / (bd[ob] * bd[ob]);
      });
      break;
  }
  return GROVE_OK;
}

grove_status grove__top_binary(grove__tape *t, int op, int a, int b, double alpha, int *y) {
  grove_status s = need_f32(t, a, "arithmetic");
  if (!s) s = need_f32(t, b, "arithmetic");
  if (s) return s;
  const grove_tensor *at = val(t, a), *bt = val(t, b);
  const int nd = at->ndim > bt->ndim ? at->ndim : bt->ndim;
  int64_t shape[GROVE_MAX_DIMS];
  for (int d = 0; d < nd; d++) {
    int da = d - (nd - at->ndim), db = d - (nd - bt->ndim);
    int64_t x = da < 0 ? 1 : at->shape[da], z = db < 0 ? 1 : bt->shape[db];
    if (x != z && x != 1 && z != 1) {
      char p[128], q[128];
      return grove_err_set(t->err, GROVE_E_SHAPE,
                           "the size of tensor a (%lld) must match the size of tensor b (%lld) at "
                           "non-singleton dimension %d (shapes %s and %s)",
                           (long long)x, (long long)z, d,
                           grove_shape_str(at->ndim, at->shape, p, sizeof p),
                           grove_shape_str(bt->ndim, bt->shape, q, sizeof q));
    }
    shape[d] = x == 1 ? z : x;
  }
  const bool rg = t->vars[a].requires_grad || t->vars[b].requires_grad;
  float *yd;
  int yv = grove__var_alloc(t, GROVE_F32, nd, shape, rg, &yd);
  if (yv < 0) return GROVE_E_NOMEM;
  at = val(t, a), bt = val(t, b);
  int64_t sa[GROVE_MAX_DIMS], sb[GROVE_MAX_DIMS];
  bcast_strides(at, nd, shape, sa);
  bcast_strides(bt, nd, shape, sb);
  const float *ad = at->data, *bd = bt->data;
  const float al = (float)alpha;
  switch (op) {
    case GROVE__BIN_ADD:
      if (alpha == 1.0)
        WALK(nd, shape, sa, sb, yd[i] = ad[oa] + bd[ob]);
      else
        WALK(nd, shape, sa, sb, yd[i] = ad[oa] + al * bd[ob]);
      break;
    case GROVE__BIN_SUB:
      if (alpha == 1.0)
        WALK(nd, shape, sa, sb, yd[i] = ad[oa] - bd[ob]);
      else
        WALK(nd, shape, sa, sb, yd[i] = ad[oa] - al * bd[ob]);
      break;
    case GROVE__BIN_MUL:
      WALK(nd, shape, sa, sb, yd[i] = ad[oa] * bd[ob]);
      break;
    case GROVE__BIN_DIV:
      WALK(nd, shape, sa, sb, yd[i] = ad[oa] / bd[ob]);
      break;
    default:
      return grove_err_set(t->err, GROVE_E_INTERNAL, "binary op %d", op);
  }
  *y = yv;
  if (!rg) return GROVE_OK;
  grove__node n = {.backward = binary_backward, .nin = 2, .nout = 1, .in = {a, b}, .out = {yv}};
  n.i[0] = op;
  n.d[0] = alpha;
  return grove__node_add(t, &n);
}

/* ------------------------------------------------------------ with a number */

static grove_status scalar_backward(grove__tape *t, const grove__node *n) {
  const int a = n->in[0], y = n->out[0];
  if (!grove__wants(t, a)) return GROVE_OK;
  const float *dy = grove__grad_in(t, y), *ad = val(t, a)->data;
  float *da = grove__grad(t, a);
  if (!da) return GROVE_E_NOMEM;
  const int op = (int)n->i[0];
  const bool rev = n->i[1];
  const float s = (float)n->d[0];
  const int64_t N = grove_tensor_numel(val(t, a));
  for (int64_t i = 0; i < N; i++) {
    float g;
    switch (op) {
      case GROVE__BIN_ADD:
        g = dy[i];
        break;
      case GROVE__BIN_SUB:
        g = rev ? -dy[i] : dy[i];
        break;
      case GROVE__BIN_MUL:
        g = dy[i] * s;
        break;
      default: /* DIV */
        g = rev ? -dy[i] * s / (ad[i] * ad[i]) : dy[i] / s;
        break;
    }
    da[i] += g;
  }
  return GROVE_OK;
}

grove_status grove__top_scalar(grove__tape *t, int op, int a, double s, bool reversed, int *y) {
  grove_status st = need_f32(t, a, "arithmetic");
  if (st) return st;
  const bool rg = t->vars[a].requires_grad;
  float *yd;
  int yv = grove__var_alloc(t, GROVE_F32, val(t, a)->ndim, val(t, a)->shape, rg, &yd);
  if (yv < 0) return GROVE_E_NOMEM;
  const float *ad = val(t, a)->data;
  const float f = (float)s;
  const int64_t N = grove_tensor_numel(val(t, a));
  for (int64_t i = 0; i < N; i++) {
    switch (op) {
      case GROVE__BIN_ADD:
        yd[i] = ad[i] + f;
        break;
      case GROVE__BIN_SUB:
        yd[i] = reversed ? f - ad[i] : ad[i] - f;
        break;
      case GROVE__BIN_MUL:
        yd[i] = ad[i] * f;
        break;
      default:
        yd[i] = reversed ? f / ad[i] : ad[i] / f;
        break;
    }
  }
  *y = yv;
  if (!rg) return GROVE_OK;
  grove__node n = {.backward = scalar_backward, .nin = 1, .nout = 1, .in = {a}, .out = {yv}};
  n.i[0] = op;
  n.i[1] = reversed;
  n.d[0] = s;
  return grove__node_add(t, &n);
}

/* ------------------------------------------------------------ matmul */

typedef struct mm_geom {
  int64_t M, K, N, batch;
  int bnd;                                        /* batch dims of the output */
  int64_t bshape[GROVE_MAX_DIMS];                 /* output batch shape */
  int64_t sa[GROVE_MAX_DIMS], sb[GROVE_MAX_DIMS]; /* batch strides in matrices */
} mm_geom;

static grove_status mm_backward(grove__tape *t, const grove__node *n) {
  const mm_geom *g = n->saved;
  const int a = n->in[0], b = n->in[1];
  const float *dy = grove__grad_in(t, n->out[0]);
  const float *ad = val(t, a)->data, *bd = val(t, b)->data;
  /* The workspace first (see conv_backward, backward_conv.c). */
  size_t wsn = grove__gemm_ws_size(GROVE__GEMM_TRANS_B | GROVE__GEMM_ACCUMULATE, g->M, g->K, g->N);
  const size_t wsb =
      grove__gemm_ws_size(GROVE__GEMM_TRANS_A | GROVE__GEMM_ACCUMULATE, g->K, g->N, g->M);
  if (wsb > wsn) wsn = wsb;
  if (!grove__tape_ws(t, wsn)) return GROVE_E_NOMEM;
  float *da = grove__wants(t, a) ? grove__grad(t, a) : NULL;
  float *db = grove__wants(t, b) ? grove__grad(t, b) : NULL;
  if ((grove__wants(t, a) && !da) || (grove__wants(t, b) && !db)) return GROVE_E_NOMEM;
  const int64_t MK = g->M * g->K, KN = g->K * g->N, MN = g->M * g->N;
  if (MN == 0 || g->K == 0) return GROVE_OK;
  grove_status s = GROVE_OK;
  WALK(g->bnd, g->bshape, g->sa, g->sb, {
    const float *dyi = dy + i * MN;
    /* dA += dY . B^T;  dB += A^T . dY */
    if (!s && da)
      s = grove__tape_gemm(t, GROVE__GEMM_TRANS_B | GROVE__GEMM_ACCUMULATE, g->M, g->K, g->N, dyi,
                           g->N, bd + ob * KN, g->N, da + oa * MK, g->K);
    if (!s && db)
      s = grove__tape_gemm(t, GROVE__GEMM_TRANS_A | GROVE__GEMM_ACCUMULATE, g->K, g->N, g->M,
                           ad + oa * MK, g->K, dyi, g->N, db + ob * KN, g->N);
  });
  return s;
}

grove_status grove__top_matmul(grove__tape *t, int a, int b, int *y) {
  grove_status s = need_f32(t, a, "matmul");
  if (!s) s = need_f32(t, b, "matmul");
  if (s) return s;
  const grove_tensor *at = val(t, a), *bt = val(t, b);
  if (at->ndim == 0 || bt->ndim == 0)
    return grove_err_set(t->err, GROVE_E_SHAPE, "matmul: both arguments need at least 1 dimension");
  mm_geom g = {0};
  /* 1-d operands: a [K] is [1, K], b [K] is [K, 1]; those dims are dropped. */
  const bool a1 = at->ndim == 1, b1 = bt->ndim == 1;
  g.M = a1 ? 1 : at->shape[at->ndim - 2];
  g.K = at->shape[at->ndim - 1];
  const int64_t Kb = b1 ? bt->shape[0] : bt->shape[bt->ndim - 2];
  g.N = b1 ? 1 : bt->shape[bt->ndim - 1];
  if (g.K != Kb) {
    char p[128], q[128];
    return grove_err_set(t->err, GROVE_E_SHAPE, "matmul: shapes %s and %s cannot be multiplied",
                         grove_shape_str(at->ndim, at->shape, p, sizeof p),
                         grove_shape_str(bt->ndim, bt->shape, q, sizeof q));
  }
  const int abd = a1 ? 0 : at->ndim - 2, bbd = b1 ? 0 : bt->ndim - 2;
  g.bnd = abd > bbd ? abd : bbd;
  int64_t ast[GROVE_MAX_DIMS], bst[GROVE_MAX_DIMS];
  int64_t acc = 1;
  for (int d = abd - 1; d >= 0; d--) ast[d] = at->shape[d] == 1 ? 0 : acc, acc *= at->shape[d];
  acc = 1;
  for (int d = bbd - 1; d >= 0; d--) bst[d] = bt->shape[d] == 1 ? 0 : acc, acc *= bt->shape[d];
  g.batch = 1;
  for (int d = 0; d < g.bnd; d++) {
    int da = d - (g.bnd - abd), db = d - (g.bnd - bbd);
    int64_t x = da < 0 ? 1 : at->shape[da], z = db < 0 ? 1 : bt->shape[db];
    if (x != z && x != 1 && z != 1) {
      char p[128], q[128];
      return grove_err_set(t->err, GROVE_E_SHAPE,
                           "matmul: batch dimensions of %s and %s do not broadcast",
                           grove_shape_str(at->ndim, at->shape, p, sizeof p),
                           grove_shape_str(bt->ndim, bt->shape, q, sizeof q));
    }
    g.bshape[d] = x == 1 ? z : x;
    g.sa[d] = da < 0 || x == 1 ? 0 : ast[da];
    g.sb[d] = db < 0 || z == 1 ? 0 : bst[db];
    g.batch *= g.bshape[d];
  }
  if (g.M > INT32_MAX || g.N > INT32_MAX || g.K > INT32_MAX)
    return grove_err_set(t->err, GROVE_E_LIMIT, "matmul: sizes beyond the BLAS int range");
  int64_t shape[GROVE_MAX_DIMS];
  int nd = 0;
  for (int d = 0; d < g.bnd; d++) shape[nd++] = g.bshape[d];
  if (!a1) shape[nd++] = g.M;
  if (!b1) shape[nd++] = g.N;
  const bool rg = t->vars[a].requires_grad || t->vars[b].requires_grad;
  float *yd;
  int yv = grove__var_alloc(t, GROVE_F32, nd, shape, rg, &yd);
  if (yv < 0) return GROVE_E_NOMEM;
  mm_geom *sv = grove__tscratch(t, sizeof *sv, false);
  if (!sv) return GROVE_E_NOMEM;
  *sv = g;
  const float *ad = val(t, a)->data, *bd = val(t, b)->data;
  const int64_t MK = g.M * g.K, KN = g.K * g.N, MN = g.M * g.N;
  grove_status s2 = GROVE_OK;
  if (MN > 0)
    WALK(g.bnd, g.bshape, g.sa, g.sb, {
      /* grove__gemm writes zeros for K = 0 */
      if (!s2)
        s2 = grove__tape_gemm(t, 0, g.M, g.N, g.K, ad + oa * MK, g.K, bd + ob * KN, g.N,
                              yd + i * MN, g.N);
    });
  if (s2) return s2;
  *y = yv;
  if (!rg) return GROVE_OK;
  grove__node n = {.backward = mm_backward, .nin = 2, .nout = 1, .in = {a, b}, .out = {yv}};
  n.saved = sv;
  return grove__node_add(t, &n);
}

/* ------------------------------------------------------------ gather copies */

/* A var made by reading x through (offset, strides) for each element of a
 * contiguous output: permute, indexing, slicing. */
typedef struct gmap {
  int nd;
  int64_t shape[GROVE_MAX_DIMS], strides[GROVE_MAX_DIMS];
  int64_t offset;
} gmap;

static grove_status gather_backward(grove__tape *t, const grove__node *n) {
  const int x = n->in[0];
  if (!grove__wants(t, x)) return GROVE_OK;
  const gmap *g = n->saved;
  const float *dy = grove__grad_in(t, n->out[0]);
  float *dx = grove__grad(t, x);
  if (!dx) return GROVE_E_NOMEM;
  float *base = dx + g->offset;
  WALK(g->nd, g->shape, g->strides, zero_strides, base[oa] += dy[i]);
  return GROVE_OK;
}

static grove_status gather(grove__tape *t, int x, const gmap *g, int *y) {
  const grove_tensor *xt = val(t, x);
  const bool rg = t->vars[x].requires_grad && xt->dtype == GROVE_F32;
  grove_tensor yt;
  grove_status s = grove__talloc(t, &yt, xt->dtype, g->nd, g->shape);
  if (s) return s;
  const size_t es = grove_dtype_size(xt->dtype);
  const char *src = (const char *)xt->data + g->offset * (int64_t)es;
  char *dst = yt.data;
  if (es == 4)
    WALK(g->nd, g->shape, g->strides, zero_strides, ((float *)dst)[i] = ((const float *)src)[oa]);
  else
    WALK(g->nd, g->shape, g->strides, zero_strides,
         memcpy(dst + i * (int64_t)es, src + oa * (int64_t)es, es));
  int yv = grove__var_new(t, &yt, rg);
  if (yv < 0) return GROVE_E_NOMEM;
  *y = yv;
  if (!rg) return GROVE_OK;
  gmap *sv = grove__tscratch(t, sizeof *sv, false);
  if (!sv) return GROVE_E_NOMEM;
  *sv = *g;
  grove__node n = {.backward = gather_backward, .nin = 1, .nout = 1, .in = {x}, .out = {yv}};
  n.saved = sv;
  return grove__node_add(t, &n);
}

grove_status grove__top_permute(grove__tape *t, int x, int nd, const int64_t *dims, int *y) {
  const grove_tensor *xt = val(t, x);
  if (nd != xt->ndim)
    return grove_err_set(t->err, GROVE_E_SHAPE,
                         "permute: number of dims don't match (%d for a %d-d tensor)", nd,
                         xt->ndim);
  int64_t cs[GROVE_MAX_DIMS];
  grove_contiguous_strides(xt->ndim, xt->shape, cs);
  gmap g = {.nd = nd};
  bool seen[GROVE_MAX_DIMS] = {false};
  for (int d = 0; d < nd; d++) {
    if (dims[d] < 0 || dims[d] >= nd || seen[dims[d]])
      return grove_err_set(t->err, GROVE_E_SHAPE, "permute: repeated or invalid dim %lld",
                           (long long)dims[d]);
    seen[dims[d]] = true;
    g.shape[d] = xt->shape[dims[d]];
    g.strides[d] = cs[dims[d]];
  }
  return gather(t, x, &g, y);
}

grove_status grove__top_index(grove__tape *t, int x, const struct grove__index *ix, int n, int *y) {
  const grove_tensor *xt = val(t, x);
  int64_t cs[GROVE_MAX_DIMS];
  grove_contiguous_strides(xt->ndim, xt->shape, cs);
  int used = 0, ell = -1;
  for (int i = 0; i < n; i++) {
    if (ix[i].kind == GROVE__IX_INT || ix[i].kind == GROVE__IX_SLICE) used++;
    if (ix[i].kind == GROVE__IX_ELLIPSIS) {
      if (ell >= 0)
        return grove_err_set(t->err, GROVE_E_SHAPE, "an index can only have a single ellipsis");
      ell = i;
    }
  }
  if (used > xt->ndim)
    return grove_err_set(t->err, GROVE_E_SHAPE, "too many indices for a %d-d tensor", xt->ndim);
  gmap g = {0};
  int d = 0; /* the source dim */
  for (int i = 0; i < n; i++) {
    const grove__index *e = &ix[i];
    if (e->kind == GROVE__IX_ELLIPSIS) {
      for (int k = 0; k < xt->ndim - used; k++, d++) {
        if (g.nd >= GROVE_MAX_DIMS) goto too_many;
        g.shape[g.nd] = xt->shape[d];
        g.strides[g.nd++] = cs[d];
      }
    } else if (e->kind == GROVE__IX_NONE) {
      if (g.nd >= GROVE_MAX_DIMS) goto too_many;
      g.shape[g.nd] = 1;
      g.strides[g.nd++] = 0;
    } else if (e->kind == GROVE__IX_INT) {
      int64_t k = e->start < 0 ? e->start + xt->shape[d] : e->start;
      if (k < 0 || k >= xt->shape[d])
        return grove_err_set(t->err, GROVE_E_RANGE,
                             "index %lld is out of bounds for dimension %d with size %lld",
                             (long long)e->start, d, (long long)xt->shape[d]);
      g.offset += k * cs[d];
      d++;
    } else {
      int64_t first, count;
      grove__slice_indices(xt->shape[d], e, &first, &count);
      if (g.nd >= GROVE_MAX_DIMS) goto too_many;
      g.offset += first * cs[d];
      g.shape[g.nd] = count;
      g.strides[g.nd++] = cs[d] * e->step;
      d++;
    }
  }
  for (; d < xt->ndim; d++) { /* the rest, as x[i] keeps the trailing dims */
    if (g.nd >= GROVE_MAX_DIMS) goto too_many;
    g.shape[g.nd] = xt->shape[d];
    g.strides[g.nd++] = cs[d];
  }
  return gather(t, x, &g, y);
too_many:
  return grove_err_set(t->err, GROVE_E_SHAPE, "indexing gives more than %d dimensions",
                       GROVE_MAX_DIMS);
}

/* ------------------------------------------------------------ cat */

static grove_status cat_backward(grove__tape *t, const grove__node *n) {
  const float *dy = grove__grad_in(t, n->out[0]);
  const grove_tensor *yt = val(t, n->out[0]);
  const int dim = (int)n->i[0];
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < dim; d++) outer *= yt->shape[d];
  for (int d = dim + 1; d < yt->ndim; d++) inner *= yt->shape[d];
  const int64_t ylen = yt->shape[dim] * inner;
  int64_t at = 0;
  const int *xs = n->saved;
  for (int k = 0; k < (int)n->i[1]; k++) {
    const int x = xs[k];
    const int64_t len = val(t, x)->shape[dim] * inner;
    if (grove__wants(t, x)) {
      float *dx = grove__grad(t, x);
      if (!dx) return GROVE_E_NOMEM;
      for (int64_t o = 0; o < outer; o++)
        for (int64_t j = 0; j < len; j++) dx[o * len + j] += dy[o * ylen + at + j];
    }
    at += len;
  }
  return GROVE_OK;
}

grove_status grove__top_cat(grove__tape *t, const int *xs, int n, int dim, int *y) {
  if (n < 1) return grove_err_set(t->err, GROVE_E_INVALID_ARGUMENT, "cat: no tensors");
  const grove_tensor *x0 = val(t, xs[0]);
  int64_t shape[GROVE_MAX_DIMS];
  memcpy(shape, x0->shape, sizeof shape);
  shape[dim] = 0;
  bool rg = false;
  for (int k = 0; k < n; k++) {
    const grove_tensor *xk = val(t, xs[k]);
    bool ok = xk->ndim == x0->ndim && xk->dtype == x0->dtype;
    for (int d = 0; ok && d < x0->ndim; d++) ok = d == dim || xk->shape[d] == x0->shape[d];
    if (!ok) {
      char p[128], q[128];
      return grove_err_set(t->err, GROVE_E_SHAPE, "cat: tensors %s and %s do not fit along dim %d",
                           grove_shape_str(x0->ndim, x0->shape, p, sizeof p),
                           grove_shape_str(xk->ndim, xk->shape, q, sizeof q), dim);
    }
    shape[dim] += xk->shape[dim];
    rg |= t->vars[xs[k]].requires_grad;
  }
  rg = rg && x0->dtype == GROVE_F32;
  grove_tensor yt;
  grove_status s = grove__talloc(t, &yt, x0->dtype, x0->ndim, shape);
  if (s) return s;
  const size_t es = grove_dtype_size(yt.dtype);
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < dim; d++) outer *= shape[d];
  for (int d = dim + 1; d < yt.ndim; d++) inner *= shape[d];
  const int64_t ylen = shape[dim] * inner;
  int64_t at = 0;
  for (int k = 0; k < n; k++) {
    const grove_tensor *xk = val(t, xs[k]);
    const int64_t len = xk->shape[dim] * inner;
    for (int64_t o = 0; o < outer; o++)
      memcpy((char *)yt.data + (o * ylen + at) * (int64_t)es,
             (const char *)xk->data + o * len * (int64_t)es, (size_t)len * es);
    at += len;
  }
  int yv = grove__var_new(t, &yt, rg);
  if (yv < 0) return GROVE_E_NOMEM;
  *y = yv;
  if (!rg) return GROVE_OK;
  int *sv = grove__tscratch(t, (size_t)n * sizeof(int), false);
  if (!sv) return GROVE_E_NOMEM;
  memcpy(sv, xs, (size_t)n * sizeof(int));
  grove__node nd = {.backward = cat_backward, .nin = 0, .nout = 1, .out = {yv}};
  nd.saved = sv;
  nd.i[0] = dim;
  nd.i[1] = n;
  return grove__node_add(t, &nd);
}

/* ------------------------------------------------------------ sum, mean */

typedef struct red_geom {
  int nd;
  int64_t shape[GROVE_MAX_DIMS]; /* x's */
  int64_t ostr[GROVE_MAX_DIMS];  /* the output's stride per x dim (0 = reduced) */
  double scale;                  /* 1, or 1 / count for mean */
} red_geom;

static grove_status reduce_backward(grove__tape *t, const grove__node *n) {
  const int x = n->in[0];
  if (!grove__wants(t, x)) return GROVE_OK;
  const red_geom *g = n->saved;
  const float *dy = grove__grad_in(t, n->out[0]);
  float *dx = grove__grad(t, x);
  if (!dx) return GROVE_E_NOMEM;
  const float sc = (float)g->scale;
  WALK(g->nd, g->shape, g->ostr, zero_strides, dx[i] += dy[oa] * sc);
  return GROVE_OK;
}

grove_status grove__top_reduce(grove__tape *t, int x, bool mean, uint32_t mask, bool keepdim,
                               int *y) {
  grove_status s = need_f32(t, x, mean ? "mean" : "sum");
  if (s) return s;
  const grove_tensor *xt = val(t, x);
  red_geom g = {.nd = xt->ndim};
  memcpy(g.shape, xt->shape, sizeof g.shape);
  int64_t oshape[GROVE_MAX_DIMS], kshape[GROVE_MAX_DIMS];
  int ond = 0;
  int64_t count = 1;
  for (int d = 0; d < xt->ndim; d++) {
    bool red = mask >> d & 1;
    kshape[d] = red ? 1 : xt->shape[d];
    if (red)
      count *= xt->shape[d];
    else
      oshape[ond++] = xt->shape[d];
  }
  int64_t ks[GROVE_MAX_DIMS];
  grove_contiguous_strides(xt->ndim, kshape, ks);
  for (int d = 0; d < xt->ndim; d++) g.ostr[d] = mask >> d & 1 ? 0 : ks[d];
  g.scale = mean ? 1.0 / (double)count : 1.0;
  const bool rg = t->vars[x].requires_grad;
  float *yd;
  int yv = keepdim ? grove__var_alloc(t, GROVE_F32, xt->ndim, kshape, rg, &yd)
                   : grove__var_alloc(t, GROVE_F32, ond, oshape, rg, &yd);
  if (yv < 0) return GROVE_E_NOMEM;
  const int64_t on = grove_tensor_numel(val(t, yv));
  double *acc = grove__tscratch(t, (size_t)(on + 1) * sizeof(double), true);
  if (!acc) return GROVE_E_NOMEM;
  const float *xd = val(t, x)->data;
  WALK(g.nd, g.shape, g.ostr, zero_strides, acc[oa] += xd[i]);
  for (int64_t i = 0; i < on; i++) yd[i] = (float)(acc[i] * g.scale);
  *y = yv;
  if (!rg) return GROVE_OK;
  red_geom *sv = grove__tscratch(t, sizeof *sv, false);
  if (!sv) return GROVE_E_NOMEM;
  *sv = g;
  grove__node n = {.backward = reduce_backward, .nin = 1, .nout = 1, .in = {x}, .out = {yv}};
  n.saved = sv;
  return grove__node_add(t, &n);
}
