/* graph_ops.c: the tensor operations a torch.fx graph may call between its
 * modules (see graph.c and docs/model-spec.md, "Graphs"): elementwise
 * arithmetic with broadcasting, matmul, mean/sum over dims, cat, and the
 * views (reshape, permute, transpose, indexing).
 *
 * Each follows torch's semantics for float32 tensors and writes a new arena
 * tensor, or, for the views, a tensor sharing its input's memory with new
 * shape and strides (no copy, as in torch; graph.c tracks the sharing).
 * Inputs may be strided.  Errors set f->err without naming the node: graph.c
 * puts the node in front. */
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph_ops.h"
#include "layers_internal.h"

size_t grove__tensor_extent(const grove_tensor *t) {
  int64_t n = grove_tensor_numel(t);
  if (n == 0) return 0;
  int64_t last = 0;
  for (int d = 0; d < t->ndim; d++) last += (t->shape[d] - 1) * t->strides[d];
  return (size_t)(last + 1) * grove_dtype_size(t->dtype);
}

static char *shp(const grove_tensor *t, char *buf, size_t n) {
  return grove_shape_str(t->ndim, t->shape, buf, n);
}

static int wrap(int64_t dim, int ndim, int *out) {
  int n = ndim == 0 ? 1 : ndim;
  if (dim < -n || dim >= n) return 0;
  *out = (int)(dim < 0 ? dim + n : dim);
  return 1;
}

static grove_status dim_range(grove_fwd *f, int64_t dim, int ndim) {
  int n = ndim == 0 ? 1 : ndim;
  return grove_err_set(f->err, GROVE_E_SHAPE,
                       "dimension %lld is out of range for a %d-d tensor (expected in [%d, %d])",
                       (long long)dim, ndim, -n, n - 1);
}

/* A contiguous float32 copy of t in the arena (t itself when it already is
 * contiguous float32). */
grove_status grove__contig_f32(grove_fwd *f, const grove_tensor *t, grove_tensor *out) {
  if (t->dtype == GROVE_F32) return grove__fwd_contig(f, t, out);
  grove_status s = grove_fwd_alloc(f, out, GROVE_F32, t->ndim, t->shape);
  if (!s) s = grove_tensor_copy(out, t, f->err);
  return s;
}

/* ============================================================ elementwise */

/* Broadcast shape of a and b (torch's rules), or an error. */
static grove_status broadcast(grove_fwd *f, const grove_tensor *a, const grove_tensor *b, int *nd,
                              int64_t *shape) {
  int n = a->ndim > b->ndim ? a->ndim : b->ndim;
  for (int i = 0; i < n; i++) {
    int ia = a->ndim - n + i, ib = b->ndim - n + i;
    int64_t da = ia >= 0 ? a->shape[ia] : 1, db = ib >= 0 ? b->shape[ib] : 1;
    if (da != db && da != 1 && db != 1) {
      char x[128], y[128];
      return grove_err_set(f->err, GROVE_E_SHAPE,
                           "the shapes %s and %s cannot be broadcast together (dimension %d: %lld "
                           "vs %lld)",
                           shp(a, x, sizeof x), shp(b, y, sizeof y), i, (long long)da,
                           (long long)db);
    }
    shape[i] = da == 1 ? db : da;
  }
  *nd = n;
  return GROVE_OK;
}

/* Strides of t in an n-d broadcast index space: 0 where t is broadcast. */
static void bstrides(const grove_tensor *t, int n, const int64_t *shape, int64_t *st) {
  for (int i = 0; i < n; i++) {
    int it = t->ndim - n + i;
    st[i] = (it < 0 || (t->shape[it] == 1 && shape[i] != 1)) ? 0 : t->strides[it];
  }
}

#define BINARY_LOOP(EXPR)                       \
  for (int64_t j = 0; j < inner; j++) {         \
    const float x = pa[j * sa], y = pb[j * sb]; \
    py[j] = (EXPR);                             \
  }

/* aten's div_floor for floats (BinaryOpsKernel.cpp): floor(a / b)
 * computed from fmod so that it agrees with remainder. */
static inline float floordivf(float a, float b) {
  if (b == 0) return a / b;
  const float mod = fmodf(a, b);
  float div = (a - mod) / b;
  if (mod != 0 && (b < 0) != (mod < 0)) div -= 1;
  if (div == 0) return copysignf(0, a / b);
  const float fl = floorf(div);
  return div - fl > 0.5f ? fl + 1 : fl;
}

/* torch.remainder for floats: fmod with b's sign. */
static inline float remf(float a, float b) {
  const float mod = fmodf(a, b);
  return mod != 0 && (b < 0) != (mod < 0) ? mod + b : mod;
}

/* y = a OP b over one inner run, strides sa and sb (0, 1 or any). */
/* py may be pa or pb (in place): every element is read before it is
 * written, at the same index.  Compiled for AVX-512 and AVX2 too
 * (GROVE__CHANNEL_LOOP: each element alone, the same bits at any width):
 * squeeze-excitation's scale * input over a whole activation was 10% of
 * EfficientNet-B0 in the baseline build's loops. */
GROVE__CHANNEL_LOOP static void binary_run(int op, float alpha, const float *pa, int64_t sa,
                                           const float *pb, int64_t sb, float *py, int64_t inner) {
  switch (op) {
    case GROVE__BIN_ADD:
      if (alpha == 1.0f) {
        if (sa == 1 && sb == 1) {
          for (int64_t j = 0; j < inner; j++) py[j] = pa[j] + pb[j];
        } else if (sa == 1 && sb == 0) {
          const float y = pb[0];
          for (int64_t j = 0; j < inner; j++) py[j] = pa[j] + y;
        } else {
          BINARY_LOOP(x + y)
        }
      } else {
        BINARY_LOOP(x + alpha * y)
      }
      break;
    case GROVE__BIN_SUB:
      if (alpha == 1.0f) {
        BINARY_LOOP(x - y)
      } else {
        BINARY_LOOP(x - alpha * y)
      }
      break;
    case GROVE__BIN_MUL:
      if (sa == 1 && sb == 1) {
        for (int64_t j = 0; j < inner; j++) py[j] = pa[j] * pb[j];
      } else if (sa == 1 && sb == 0) {
        const float y = pb[0];
        for (int64_t j = 0; j < inner; j++) py[j] = pa[j] * y;
      } else {
        BINARY_LOOP(x * y)
      }
      break;
    case GROVE__BIN_MAX: /* x is NaN: x; y is NaN: x > y is false, so y */
      BINARY_LOOP(x != x || x > y ? x : y)
      break;
    case GROVE__BIN_MIN:
      BINARY_LOOP(x != x || x < y ? x : y)
      break;
    case GROVE__BIN_FLOORDIV:
      BINARY_LOOP(floordivf(x, y))
      break;
    case GROVE__BIN_TRUNCDIV:
      BINARY_LOOP(truncf(x / y))
      break;
    case GROVE__BIN_MOD:
      BINARY_LOOP(remf(x, y))
      break;
    case GROVE__BIN_ATAN2:
      BINARY_LOOP(atan2f(x, y))
      break;
    default: /* GROVE__BIN_DIV */
      BINARY_LOOP(x / y)
      break;
  }
}

/* One dense run of a binary op, cut between the compute threads: elements
 * [b, e) (each computed alone, so the cut changes no bit). */
typedef struct dense_par {
  int op;
  float alpha;
  const float *a;
  int64_t sa; /* 1, or 0 for a single number */
  const float *b;
  int64_t sb;
  float *y;
} dense_par;

static void dense_chunk(void *ctx, int64_t b, int64_t e) {
  const dense_par *c = ctx;
  binary_run(c->op, c->alpha, c->a + b * c->sa, c->sa, c->b + b * c->sb, c->sb, c->y + b, e - b);
}

/* Elements per chunk of a dense elementwise pass: large enough that a
 * hand-off (about a microsecond) stays small beside it. */
#define DENSE_GRAIN ((int64_t)16 << 10)

/* Whether t is a contiguous per-channel operand of the 4-d x: [C, 1, 1] or
 * [1 or N, C, 1, 1]. */
bool grove__per_channel(const grove_tensor *t, const grove_tensor *x) {
  if (t->dtype != GROVE_F32 || x->ndim != 4 || !grove_tensor_is_contiguous(t)) return false;
  if (t->ndim == 3) return t->shape[0] == x->shape[1] && t->shape[1] == 1 && t->shape[2] == 1;
  return t->ndim == 4 && (t->shape[0] == 1 || t->shape[0] == x->shape[0]) &&
         t->shape[1] == x->shape[1] && t->shape[2] == 1 && t->shape[3] == 1;
}

/* Positions [b, e) (image * P + position) of a channels-last tensor with a
 * per-channel operand: one run of C channels each, by binary_run (so each
 * element computes as in the contiguous loops). */
typedef struct chan_par {
  int op;
  float alpha;
  const float *a, *b;
  float *y;
  bool a_big; /* a is the channels-last tensor, b the per-channel one */
  int64_t C, P;
  bool per_image; /* the per-channel operand has one row of C per image */
} chan_par;

GROVE__CHANNEL_LOOP static void chan_chunk(void *ctx, int64_t b, int64_t e) {
  const chan_par *c = ctx;
  const int64_t C = c->C;
  /* x * s and x + s (commutative, exactly): the loop inline, without a
   * call per position (C is often 16 to 96). */
  if (c->op == GROVE__BIN_MUL || (c->op == GROVE__BIN_ADD && c->alpha == 1.0f)) {
    const bool mul = c->op == GROVE__BIN_MUL;
    for (int64_t r = b; r < e; r++) {
      const float *row = (c->a_big ? c->a : c->b) + r * C;
      const float *ch = (c->a_big ? c->b : c->a) + (c->per_image ? r / c->P * C : 0);
      float *y = c->y + r * C;
      if (mul)
        for (int64_t k = 0; k < C; k++) y[k] = row[k] * ch[k];
      else
        for (int64_t k = 0; k < C; k++) y[k] = row[k] + ch[k];
    }
    return;
  }
  for (int64_t r = b; r < e; r++) {
    const float *row = (c->a_big ? c->a : c->b) + r * c->C;
    const float *ch = (c->a_big ? c->b : c->a) + (c->per_image ? r / c->P * c->C : 0);
    binary_run(c->op, c->alpha, c->a_big ? row : ch, 1, c->a_big ? ch : row, 1, c->y + r * c->C,
               c->C);
  }
}

grove_status grove__op_binary(grove_fwd *f, int op, const grove_tensor *a, const grove_tensor *b,
                              double alpha, grove_tensor *out, const grove_tensor *into) {
  if (a->dtype != GROVE_F32 || b->dtype != GROVE_F32)
    return grove_err_set(f->err, GROVE_E_DTYPE,
                         "expected float32 tensors, got %s and %s (Grove computes in float32)",
                         grove_dtype_name(a->dtype), grove_dtype_name(b->dtype));
  int nd;
  int64_t shape[GROVE_MAX_DIMS];
  grove_status s;
  /* A channels-last tensor with another of its shape and layout (a
   * residual add between convolutions) or with a single number: one dense
   * run, and the result keeps the layout. */
  const bool na = grove__is_nhwc(a), nb = grove__is_nhwc(b);
  const bool one_a = grove_tensor_numel(a) == 1 && a->ndim <= 4;
  const bool one_b = grove_tensor_numel(b) == 1 && b->ndim <= 4;
  if ((na && nb && grove_tensor_same_shape(a, b)) || (na && one_b) || (nb && one_a)) {
    const grove_tensor *t = na ? a : b;
    if (into && grove__is_nhwc(into) && grove_tensor_same_shape(into, t))
      *out = *into;
    else if ((s = grove_fwd_alloc(f, out, GROVE_F32, 4, t->shape)))
      return s;
    else
      grove__set_nhwc(out);
    dense_par c = {op, (float)alpha, a->data, na ? 1 : 0, b->data, nb ? 1 : 0, out->data};
    grove__parallel_for(grove_tensor_numel(t), DENSE_GRAIN, dense_chunk, &c);
    return GROVE_OK;
  }
  /* A channels-last [N, C, H, W] with a per-channel operand ([N or 1, C,
   * 1, 1] or [C, 1, 1], contiguous: squeeze-excitation's scale * input, a
   * bias): the result keeps the layout, each position one run over C. */
  const grove_tensor *big = na ? a : nb ? b : NULL, *chan = na ? b : a;
  if (big && (na != nb) && grove__per_channel(chan, big)) {
    if (into && grove__is_nhwc(into) && grove_tensor_same_shape(into, big))
      *out = *into;
    else if ((s = grove_fwd_alloc(f, out, GROVE_F32, 4, big->shape)))
      return s;
    else
      grove__set_nhwc(out);
    chan_par c = {op, (float)alpha, a->data, b->data, out->data, na, big->shape[1],
                  big->shape[2] * big->shape[3], chan->ndim == 4 && chan->shape[0] > 1};
    grove__parallel_for(big->shape[0] * c.P, grove__par_grain(c.C), chan_chunk, &c);
    return GROVE_OK;
  }
  if ((s = broadcast(f, a, b, &nd, shape))) return s;
  /* The loops below write the result in contiguous order. */
  if (into && grove_tensor_is_contiguous(into) && into->ndim == nd &&
      memcmp(into->shape, shape, (size_t)nd * sizeof(int64_t)) == 0)
    *out = *into;
  else if ((s = grove_fwd_alloc(f, out, GROVE_F32, nd, shape)))
    return s;
  int64_t n = grove_tensor_numel(out);
  if (n == 0) return GROVE_OK;
  int64_t sa[GROVE_MAX_DIMS], sb[GROVE_MAX_DIMS];
  bstrides(a, nd, shape, sa);
  bstrides(b, nd, shape, sb);
  /* Merge adjacent dims where both operands stay linear, so that the usual
   * cases (same shape, a row vector, a scalar) become one or two runs. */
  int64_t msh[GROVE_MAX_DIMS], msa[GROVE_MAX_DIMS], msb[GROVE_MAX_DIMS];
  int m = 0;
  for (int i = 0; i < nd; i++) {
    if (shape[i] == 1) continue;
    if (m > 0 && msa[m - 1] == sa[i] * shape[i] && msb[m - 1] == sb[i] * shape[i]) {
      msh[m - 1] *= shape[i];
      msa[m - 1] = sa[i];
      msb[m - 1] = sb[i];
      continue;
    }
    msh[m] = shape[i];
    msa[m] = sa[i];
    msb[m] = sb[i];
    m++;
  }
  if (m == 0) {
    msh[0] = 1;
    msa[0] = msb[0] = 0;
    m = 1;
  }
  const float *da = a->data, *db = b->data;
  float *dy = out->data;
  const int64_t inner = msh[m - 1];
  const int64_t outer = n / inner;
  int64_t idx[GROVE_MAX_DIMS] = {0};
  int64_t oa = 0, ob = 0;
  for (int64_t o = 0; o < outer; o++) {
    binary_run(op, (float)alpha, da + oa, msa[m - 1], db + ob, msb[m - 1], dy + o * inner, inner);
    for (int d = m - 2; d >= 0; d--) {
      if (++idx[d] < msh[d]) {
        oa += msa[d];
        ob += msb[d];
        break;
      }
      oa -= msa[d] * (msh[d] - 1);
      ob -= msb[d] * (msh[d] - 1);
      idx[d] = 0;
    }
  }
  return GROVE_OK;
}

/* ============================================================ matmul */

/* How one operand's last two dims go to sgemm: as stored (ld = row stride)
 * or transposed; false when neither dim is unit-stride (copy first). */
static bool gemm_layout(const grove_tensor *t, int64_t rs, int64_t cs, int64_t rows, int64_t cols,
                        bool *trans, int64_t *ld) {
  if (cs == 1 || cols == 1) {
    *trans = false;
    *ld = rows == 1 || rs < cols ? cols : rs;
    return rows == 1 || rs >= cols;
  }
  if (rs == 1 || rows == 1) {
    *trans = true;
    *ld = cols == 1 || cs < rows ? rows : cs;
    return cols == 1 || cs >= rows;
  }
  return false;
}

grove_status grove__op_matmul(grove_fwd *f, const grove_tensor *a0, const grove_tensor *b0,
                              grove_tensor *out) {
  if (a0->dtype != GROVE_F32 || b0->dtype != GROVE_F32)
    return grove_err_set(f->err, GROVE_E_DTYPE, "matmul: expected float32 tensors, got %s and %s",
                         grove_dtype_name(a0->dtype), grove_dtype_name(b0->dtype));
  if (a0->ndim == 0 || b0->ndim == 0)
    return grove_err_set(f->err, GROVE_E_SHAPE,
                         "matmul: both arguments need at least 1 dimension, got %d-d and %d-d",
                         a0->ndim, b0->ndim);
  /* Promote 1-d operands as torch does: [K] -> [1, K] on the left, [K, 1]
   * on the right; the added dim is dropped from the result. */
  grove_tensor a = *a0, b = *b0;
  if (a.ndim == 1) {
    a.ndim = 2;
    a.shape[1] = a.shape[0];
    a.strides[1] = a.strides[0];
    a.shape[0] = 1;
    a.strides[0] = a.shape[1];
  }
  if (b.ndim == 1) {
    b.ndim = 2;
    b.shape[1] = 1;
    b.strides[1] = 1;
  }
  const int64_t M = a.shape[a.ndim - 2], K = a.shape[a.ndim - 1];
  const int64_t K2 = b.shape[b.ndim - 2], N = b.shape[b.ndim - 1];
  if (K != K2) {
    char x[128], y[128];
    return grove_err_set(f->err, GROVE_E_SHAPE,
                         "matmul: shapes %s and %s cannot be multiplied (%lldx%lld and %lldx%lld)",
                         shp(a0, x, sizeof x), shp(b0, y, sizeof y), (long long)M, (long long)K,
                         (long long)K2, (long long)N);
  }
  /* Batch dims broadcast. */
  grove_tensor ab = a, bb = b;
  ab.ndim -= 2;
  bb.ndim -= 2;
  int nb = 0;
  int64_t bshape[GROVE_MAX_DIMS];
  grove_status s = broadcast(f, &ab, &bb, &nb, bshape);
  if (s) return grove_err_prefix(f->err, "matmul: batch dimensions");
  if (nb + 2 > GROVE_MAX_DIMS)
    return grove_err_set(f->err, GROVE_E_SHAPE, "matmul: too many dimensions");
  int64_t oshape[GROVE_MAX_DIMS];
  int ond = 0;
  for (int i = 0; i < nb; i++) oshape[ond++] = bshape[i];
  if (a0->ndim > 1) oshape[ond++] = M;
  if (b0->ndim > 1) oshape[ond++] = N;
  s = grove_fwd_alloc(f, out, GROVE_F32, ond, oshape);
  if (s) return s;
  int64_t batches = 1;
  for (int i = 0; i < nb; i++) batches *= bshape[i];
  if (batches * M * N == 0) return GROVE_OK;
  float *y = out->data;
  if (K == 0) {
    memset(y, 0, (size_t)(batches * M * N) * sizeof(float));
    return GROVE_OK;
  }
  bool ta, tb;
  int64_t lda, ldb;
  const int64_t ars = a.strides[a.ndim - 2], acs = a.strides[a.ndim - 1];
  const int64_t brs = b.strides[b.ndim - 2], bcs = b.strides[b.ndim - 1];
  if (!gemm_layout(&a, ars, acs, M, K, &ta, &lda) || !gemm_layout(&b, brs, bcs, K, N, &tb, &ldb)) {
    /* Neither dim is unit-stride: work on contiguous copies. */
    grove_tensor ac, bc;
    if ((s = grove__contig_f32(f, a0, &ac)) || (s = grove__contig_f32(f, b0, &bc))) return s;
    grove_tensor r;
    s = grove__op_matmul(f, &ac, &bc, &r);
    if (s) return s;
    memcpy(out->data, r.data, grove_tensor_nbytes(out));
    return GROVE_OK;
  }
  int64_t sa[GROVE_MAX_DIMS], sb[GROVE_MAX_DIMS];
  bstrides(&ab, nb, bshape, sa);
  bstrides(&bb, nb, bshape, sb);
  int64_t idx[GROVE_MAX_DIMS] = {0};
  int64_t oa = 0, ob = 0;
  const float *da = a.data, *db = b.data;
  for (int64_t t = 0; t < batches; t++) {
    float *yt = y + t * M * N;
    if (M == 1 && !tb) {
      /* A row times a matrix: y = b^T . a as a matrix-vector product. */
      cblas_sgemv(CblasRowMajor, CblasTrans, (blasint)K, (blasint)N, 1.0f, db + ob, (blasint)ldb,
                  da + oa, (blasint)(acs > 0 ? acs : 1), 0.0f, yt, 1);
    } else {
      cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                  (blasint)M, (blasint)N, (blasint)K, 1.0f, da + oa, (blasint)lda, db + ob,
                  (blasint)ldb, 0.0f, yt, (blasint)N);
    }
    for (int d = nb - 1; d >= 0; d--) {
      if (++idx[d] < bshape[d]) {
        oa += sa[d];
        ob += sb[d];
        break;
      }
      oa -= sa[d] * (bshape[d] - 1);
      ob -= sb[d] * (bshape[d] - 1);
      idx[d] = 0;
    }
  }
  return GROVE_OK;
}

/* ============================================================ reductions */

grove_status grove__op_reduce(grove_fwd *f, bool mean, const grove_tensor *x0, const int64_t *dims,
                              int ndims, bool keepdim, grove_tensor *out) {
  if (x0->dtype != GROVE_F32)
    return grove_err_set(f->err, GROVE_E_DTYPE, "%s: expected a float32 tensor, got %s",
                         mean ? "mean" : "sum", grove_dtype_name(x0->dtype));
  const grove_tensor *x = x0;
  bool red[GROVE_MAX_DIMS] = {false};
  if (ndims < 0) { /* dim=None: everything */
    for (int d = 0; d < x->ndim; d++) red[d] = true;
  } else {
    for (int i = 0; i < ndims; i++) {
      int d;
      if (!wrap(dims[i], x->ndim, &d)) return dim_range(f, dims[i], x->ndim);
      if (x->ndim == 0) continue;
      if (red[d])
        return grove_err_set(f->err, GROVE_E_SHAPE,
                             "dim %d appears multiple times in the list of dims", d);
      red[d] = true;
    }
  }
  int64_t oshape[GROVE_MAX_DIMS];
  int ond = 0;
  int64_t count = 1;
  for (int d = 0; d < x->ndim; d++) {
    if (red[d]) {
      count *= x->shape[d];
      if (keepdim) oshape[ond++] = 1;
    } else {
      oshape[ond++] = x->shape[d];
    }
  }
  grove_status s = grove_fwd_alloc(f, out, GROVE_F32, ond, oshape);
  if (s) return s;
  const int64_t on = grove_tensor_numel(out);
  double *acc = grove_arena_alloc(f->arena, (size_t)(on ? on : 1) * sizeof(double));
  if (!acc) return grove_err_set(f->err, GROVE_E_NOMEM, "out of scratch memory");
  for (int64_t i = 0; i < on; i++) acc[i] = 0;
  /* Each input dim's stride in the output (0 when reduced). */
  int64_t ost[GROVE_MAX_DIMS], o = 1;
  for (int d = x->ndim - 1; d >= 0; d--) {
    ost[d] = red[d] ? 0 : o;
    if (!red[d]) o *= x->shape[d];
  }
  const int64_t n = grove_tensor_numel(x);
  if (n > 0) {
    const int nd = x->ndim;
    const int64_t inner = nd ? x->shape[nd - 1] : 1;
    const int64_t xs = nd ? x->strides[nd - 1] : 1, os = nd ? ost[nd - 1] : 0;
    const float *xd = x->data;
    int64_t idx[GROVE_MAX_DIMS] = {0};
    int64_t ox = 0, oo = 0;
    for (int64_t r = 0; r < n / inner; r++) {
      const float *xr = xd + ox;
      double *ar = acc + oo;
      if (os == 0) {
        double sum = 0;
        for (int64_t j = 0; j < inner; j++) sum += xr[j * xs];
        ar[0] += sum;
      } else {
        for (int64_t j = 0; j < inner; j++) ar[j * os] += xr[j * xs];
      }
      for (int d = nd - 2; d >= 0; d--) {
        if (++idx[d] < x->shape[d]) {
          ox += x->strides[d];
          oo += ost[d];
          break;
        }
        ox -= x->strides[d] * (x->shape[d] - 1);
        oo -= ost[d] * (x->shape[d] - 1);
        idx[d] = 0;
      }
    }
  }
  float *y = out->data;
  for (int64_t i = 0; i < on; i++)
    y[i] = (float)(mean ? (count ? acc[i] / (double)count : NAN) : acc[i]);
  return GROVE_OK;
}

/* ============================================================ cat */

grove_status grove__op_cat(grove_fwd *f, const grove_tensor *ts, int n, int64_t dim,
                           grove_tensor *out) {
  if (n == 0)
    return grove_err_set(f->err, GROVE_E_INVALID_ARGUMENT,
                         "cat: expected a non-empty list of tensors");
  /* torch skips 1-d empty tensors (legacy behaviour). */
  const grove_tensor *ref = NULL;
  for (int i = 0; i < n && !ref; i++)
    if (!(ts[i].ndim == 1 && ts[i].shape[0] == 0)) ref = &ts[i];
  if (!ref) ref = &ts[0];
  int d;
  if (ref->ndim == 0)
    return grove_err_set(f->err, GROVE_E_SHAPE,
                         "cat: zero-dimensional tensor (at position 0) cannot be concatenated");
  if (!wrap(dim, ref->ndim, &d)) return dim_range(f, dim, ref->ndim);
  int64_t total = 0;
  for (int i = 0; i < n; i++) {
    const grove_tensor *t = &ts[i];
    if (t->ndim == 1 && t->shape[0] == 0 && ref->ndim != 1) continue;
    if (t->dtype != ref->dtype)
      return grove_err_set(f->err, GROVE_E_DTYPE, "cat: tensor %d is %s, tensor 0 is %s", i,
                           grove_dtype_name(t->dtype), grove_dtype_name(ref->dtype));
    bool ok = t->ndim == ref->ndim;
    for (int k = 0; ok && k < t->ndim; k++) ok = k == d || t->shape[k] == ref->shape[k];
    if (!ok) {
      char x[128], y[128];
      return grove_err_set(f->err, GROVE_E_SHAPE,
                           "cat: sizes of tensors must match except in dimension %d: tensor %d "
                           "is %s, the first is %s",
                           d, i, shp(t, x, sizeof x), shp(ref, y, sizeof y));
    }
    total += t->shape[d];
  }
  int64_t oshape[GROVE_MAX_DIMS];
  memcpy(oshape, ref->shape, sizeof oshape);
  oshape[d] = total;
  grove_status s = grove_fwd_alloc(f, out, ref->dtype, ref->ndim, oshape);
  if (s) return s;
  /* Channels last in, channels last out: concatenating channels of NHWC
   * tensors (SqueezeNet's Fire modules, DenseNet's blocks, Inception's
   * branches: convolutions' results) copies each position's channels side
   * by side, where a contiguous result would transpose every input. */
  bool nhwc = d == 1 && ref->ndim == 4 && ref->dtype == GROVE_F32;
  for (int i = 0; nhwc && i < n; i++) nhwc = ts[i].ndim == 4 && grove__is_nhwc(&ts[i]);
  if (nhwc) {
    grove__set_nhwc(out);
    const int64_t pos = oshape[0] * oshape[2] * oshape[3];
    int64_t c0 = 0;
    for (int i = 0; i < n; c0 += ts[i].shape[1], i++) {
      const int64_t ci = ts[i].shape[1];
      const float *src = ts[i].data;
      float *dst = (float *)out->data + c0;
      for (int64_t q = 0; q < pos; q++)
        memcpy(dst + q * total, src + q * ci, (size_t)ci * sizeof(float));
    }
    return GROVE_OK;
  }
  int64_t off = 0;
  const size_t es = grove_dtype_size(ref->dtype);
  for (int i = 0; i < n; i++) {
    const grove_tensor *t = &ts[i];
    if (t->ndim == 1 && t->shape[0] == 0 && ref->ndim != 1) continue;
    grove_tensor dst = *out;
    dst.shape[d] = t->shape[d];
    dst.data = (char *)out->data + (size_t)(off * out->strides[d]) * es;
    if (grove_tensor_numel(&dst) > 0 && (s = grove_tensor_copy(&dst, t, f->err))) return s;
    off += t->shape[d];
  }
  return GROVE_OK;
}

/* ============================================================ views */

grove_status grove__op_reshape(grove_fwd *f, const grove_tensor *x, const int64_t *shape, int nd,
                               grove_tensor *out) {
  if (nd > GROVE_MAX_DIMS)
    return grove_err_set(f->err, GROVE_E_SHAPE, "reshape: at most %d dimensions", GROVE_MAX_DIMS);
  int64_t sh[GROVE_MAX_DIMS], known = 1;
  int infer = -1;
  for (int i = 0; i < nd; i++) {
    if (shape[i] == -1) {
      if (infer >= 0)
        return grove_err_set(f->err, GROVE_E_SHAPE, "reshape: only one dimension can be inferred");
      infer = i;
    } else if (shape[i] < 0) {
      return grove_err_set(f->err, GROVE_E_SHAPE, "reshape: invalid shape dimension %lld",
                           (long long)shape[i]);
    } else {
      known *= shape[i];
    }
    sh[i] = shape[i];
  }
  const int64_t n = grove_tensor_numel(x);
  if (infer >= 0) {
    if (known == 0 || n % known) goto bad;
    sh[infer] = n / known;
  } else if (known != n) {
    goto bad;
  }
  grove_tensor c;
  grove_status s = grove__fwd_contig(f, x, &c);
  if (s) return s;
  grove_tensor_init(out, c.dtype, nd, sh, c.data);
  return GROVE_OK;
bad : {
  char a[128], b[128];
  return grove_err_set(f->err, GROVE_E_SHAPE,
                       "shape %s is invalid for an input of shape %s (%lld elements)",
                       grove_shape_str(nd, shape, a, sizeof a), shp(x, b, sizeof b), (long long)n);
}
}

grove_status grove__op_permute(grove_fwd *f, const grove_tensor *x, const int64_t *dims, int nd,
                               grove_tensor *out) {
  if (nd != x->ndim)
    return grove_err_set(f->err, GROVE_E_SHAPE,
                         "permute: number of dims don't match: the input has %d, %d given", x->ndim,
                         nd);
  bool seen[GROVE_MAX_DIMS] = {false};
  grove_tensor y = *x;
  for (int i = 0; i < nd; i++) {
    int d;
    if (!wrap(dims[i], nd, &d)) return dim_range(f, dims[i], nd);
    if (seen[d]) return grove_err_set(f->err, GROVE_E_SHAPE, "permute: repeated dim %d", d);
    seen[d] = true;
    y.shape[i] = x->shape[d];
    y.strides[i] = x->strides[d];
  }
  *out = y;
  return GROVE_OK;
}

grove_status grove__op_transpose(grove_fwd *f, const grove_tensor *x, int64_t d0, int64_t d1,
                                 grove_tensor *out) {
  int a, b;
  if (!wrap(d0, x->ndim, &a)) return dim_range(f, d0, x->ndim);
  if (!wrap(d1, x->ndim, &b)) return dim_range(f, d1, x->ndim);
  *out = *x;
  if (x->ndim == 0) return GROVE_OK;
  out->shape[a] = x->shape[b];
  out->shape[b] = x->shape[a];
  out->strides[a] = x->strides[b];
  out->strides[b] = x->strides[a];
  return GROVE_OK;
}

/* Python's slice.indices for a positive step. */
static void slice_range(int64_t len, bool has_start, int64_t start, bool has_stop, int64_t stop,
                        int64_t step, int64_t *first, int64_t *count) {
  int64_t b = has_start ? start : 0, e = has_stop ? stop : len;
  if (b < 0) b += len;
  if (e < 0) e += len;
  if (b < 0) b = 0;
  if (b > len) b = len;
  if (e < 0) e = 0;
  if (e > len) e = len;
  *first = b;
  *count = e > b ? (e - b + step - 1) / step : 0;
}

void grove__slice_indices(int64_t len, const grove__index *ix, int64_t *first, int64_t *count) {
  slice_range(len, ix->has_start, ix->start, ix->has_stop, ix->stop, ix->step, first, count);
}

grove_status grove__op_index(grove_fwd *f, const grove_tensor *x, const grove__index *ix, int n,
                             grove_tensor *out) {
  /* Dims the index list consumes (None and ... consume none). */
  int used = 0, ell = -1;
  for (int i = 0; i < n; i++) {
    if (ix[i].kind == GROVE__IX_INT || ix[i].kind == GROVE__IX_SLICE) used++;
    if (ix[i].kind == GROVE__IX_ELLIPSIS) {
      if (ell >= 0)
        return grove_err_set(f->err, GROVE_E_SHAPE,
                             "an index can only have a single ellipsis ('...')");
      ell = i;
    }
  }
  if (used > x->ndim)
    return grove_err_set(f->err, GROVE_E_SHAPE, "too many indices for a %d-d tensor: %d", x->ndim,
                         used);
  grove_tensor y = *x;
  y.ndim = 0;
  int src = 0;
  const size_t es = grove_dtype_size(x->dtype);
  char *data = x->data;
  for (int i = 0; i < n; i++) {
    const grove__index *e = &ix[i];
    if (e->kind == GROVE__IX_ELLIPSIS) {
      for (int k = 0; k < x->ndim - used; k++) {
        if (y.ndim >= GROVE_MAX_DIMS) goto too_many;
        y.shape[y.ndim] = x->shape[src];
        y.strides[y.ndim++] = x->strides[src++];
      }
      continue;
    }
    if (e->kind == GROVE__IX_NONE) {
      if (y.ndim >= GROVE_MAX_DIMS) goto too_many;
      y.shape[y.ndim] = 1;
      y.strides[y.ndim] = 1;
      y.ndim++;
      continue;
    }
    const int64_t len = x->shape[src];
    if (e->kind == GROVE__IX_INT) {
      int64_t k = e->start < 0 ? e->start + len : e->start;
      if (k < 0 || k >= len)
        return grove_err_set(f->err, GROVE_E_RANGE,
                             "index %lld is out of bounds for dimension %d with size %lld",
                             (long long)e->start, src, (long long)len);
      data += (size_t)(k * x->strides[src]) * es;
      src++;
      continue;
    }
    int64_t first, count;
    grove__slice_indices(len, e, &first, &count);
    if (y.ndim >= GROVE_MAX_DIMS) goto too_many;
    if (count > 0) data += (size_t)(first * x->strides[src]) * es;
    y.shape[y.ndim] = count;
    y.strides[y.ndim++] = x->strides[src] * e->step;
    src++;
  }
  /* Dims after the last index are kept. */
  while (src < x->ndim) {
    if (y.ndim >= GROVE_MAX_DIMS) goto too_many;
    y.shape[y.ndim] = x->shape[src];
    y.strides[y.ndim++] = x->strides[src++];
  }
  y.data = data;
  *out = y;
  return GROVE_OK;
too_many:
  return grove_err_set(f->err, GROVE_E_SHAPE, "indexing gives more than %d dimensions",
                       GROVE_MAX_DIMS);
}

/* ============================================================ shared helpers */

/* For the other operation files (tensor_ops.h): the dim wrapping, its
 * message and torch's broadcasting, once. */
grove_status grove__dim_index(grove_fwd *f, int64_t dim, int ndim, int *out) {
  return wrap(dim, ndim, out) ? GROVE_OK : dim_range(f, dim, ndim);
}

grove_status grove__broadcast_shape(grove_fwd *f, const grove_tensor *a, const grove_tensor *b,
                                    int *nd, int64_t *shape) {
  return broadcast(f, a, b, nd, shape);
}

void grove__broadcast_strides(const grove_tensor *t, int n, const int64_t *shape, int64_t *st) {
  bstrides(t, n, shape, st);
}
