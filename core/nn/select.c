/* select.c: comparisons giving bool tensors, torch.where and masked_fill
 * (tensor_ops.h): what masks are made of (attention masks, padding masks,
 * a ViT's or a decoder's guards); and the other elementwise functions of
 * three broadcast operands, lerp, addcmul and addcdiv, on where's walk.
 *
 * Operands broadcast as torch's do (graph_ops.c's rules, shared through
 * grove__broadcast_shape); bool results are one byte per element, 0 or 1,
 * as torch's. */
#include <math.h>
#include <string.h>

#include "graph_ops.h"
#include "tensor_ops.h"

/* Element i (a linear offset in elements) of t as a double / an int64. */
static inline double get_f(const grove_tensor *t, int64_t off) {
  switch (t->dtype) {
    case GROVE_F32: return ((const float *)t->data)[off];
    case GROVE_F64: return ((const double *)t->data)[off];
    case GROVE_I64: return (double)((const int64_t *)t->data)[off];
    case GROVE_I32: return ((const int32_t *)t->data)[off];
    case GROVE_I16: return ((const int16_t *)t->data)[off];
    case GROVE_I8: return ((const int8_t *)t->data)[off];
    default: return ((const uint8_t *)t->data)[off]; /* U8, BOOL */
  }
}

static inline int64_t get_i(const grove_tensor *t, int64_t off) {
  switch (t->dtype) {
    case GROVE_I64: return ((const int64_t *)t->data)[off];
    case GROVE_I32: return ((const int32_t *)t->data)[off];
    case GROVE_I16: return ((const int16_t *)t->data)[off];
    case GROVE_I8: return ((const int8_t *)t->data)[off];
    default: return ((const uint8_t *)t->data)[off];
  }
}

static bool is_float(grove_dtype dt) {
  return dt == GROVE_F32 || dt == GROVE_F64 || dt == GROVE_F16 || dt == GROVE_BF16;
}

static grove_status check_dtype(grove_fwd *f, const char *what, const grove_tensor *t) {
  if (t->dtype == GROVE_F16 || t->dtype == GROVE_BF16)
    return grove_err_set(f->err, GROVE_E_DTYPE, "%s: %s tensors are not supported", what,
                         grove_dtype_name(t->dtype));
  return GROVE_OK;
}

/* a OP b, once for doubles and once for int64 (ops_select.c compares two
 * Python numbers with them too). */
#define CMP_BODY                     \
  switch (op) {                      \
    case GROVE__CMP_EQ: return a == b; \
    case GROVE__CMP_NE: return a != b; \
    case GROVE__CMP_LT: return a < b;  \
    case GROVE__CMP_LE: return a <= b; \
    case GROVE__CMP_GT: return a > b;  \
    default: return a >= b;            \
  }
bool grove__cmp_f64(int op, double a, double b) { CMP_BODY }
bool grove__cmp_i64(int op, int64_t a, int64_t b) { CMP_BODY }
#define cmp_d grove__cmp_f64
#define cmp_i grove__cmp_i64

/* Walks the nd-d index space of shape in row-major order, keeping each
 * operand's element offset (strides st[k], 0 where broadcast). */
typedef struct walker {
  int nd, n;
  const int64_t *shape;
  int64_t idx[GROVE_MAX_DIMS];
  int64_t st[3][GROVE_MAX_DIMS];
  int64_t off[3];
} walker;

static void walk_next(walker *w) {
  for (int d = w->nd - 1; d >= 0; d--) {
    if (++w->idx[d] < w->shape[d]) {
      for (int k = 0; k < w->n; k++) w->off[k] += w->st[k][d];
      return;
    }
    for (int k = 0; k < w->n; k++) w->off[k] -= w->st[k][d] * (w->shape[d] - 1);
    w->idx[d] = 0;
  }
}

/* A walker over shape (nd dims) for the n operands ops, each broadcast to
 * it (grove__broadcast_strides). */
static void walk_start(walker *w, int nd, const int64_t *shape, int n,
                       const grove_tensor *const *ops) {
  *w = (walker){.nd = nd, .n = n, .shape = shape};
  for (int k = 0; k < n; k++) grove__broadcast_strides(ops[k], nd, shape, w->st[k]);
}

grove_status grove__op_compare(grove_fwd *f, int op, const grove_tensor *a, const grove_tensor *b,
                               grove_tensor *out) {
  grove_status s;
  if ((s = check_dtype(f, "comparison", a)) || (s = check_dtype(f, "comparison", b))) return s;
  int nd;
  int64_t shape[GROVE_MAX_DIMS];
  if ((s = grove__broadcast_shape(f, a, b, &nd, shape))) return s;
  if ((s = grove_fwd_alloc(f, out, GROVE_BOOL, nd, shape))) return s;
  const int64_t n = grove_tensor_numel(out);
  uint8_t *y = out->data;
  walker w;
  walk_start(&w, nd, shape, 2, (const grove_tensor *const[]){a, b});
  if (a->dtype == GROVE_F32 && b->dtype == GROVE_F32) {
    const float *pa = a->data, *pb = b->data;
    for (int64_t i = 0; i < n; i++, walk_next(&w)) y[i] = cmp_d(op, pa[w.off[0]], pb[w.off[1]]);
  } else if (!is_float(a->dtype) && !is_float(b->dtype)) {
    for (int64_t i = 0; i < n; i++, walk_next(&w))
      y[i] = cmp_i(op, get_i(a, w.off[0]), get_i(b, w.off[1]));
  } else {
    /* torch promotes an integer operand to the float one's float32. */
    for (int64_t i = 0; i < n; i++, walk_next(&w))
      y[i] = cmp_d(op, (float)get_f(a, w.off[0]), (float)get_f(b, w.off[1]));
  }
  return GROVE_OK;
}

grove_status grove__op_compare_scalar(grove_fwd *f, int op, const grove_tensor *a, double b,
                                      grove_tensor *out) {
  grove_status s;
  if ((s = check_dtype(f, "comparison", a))) return s;
  if ((s = grove_fwd_alloc(f, out, GROVE_BOOL, a->ndim, a->shape))) return s;
  const int64_t n = grove_tensor_numel(out);
  uint8_t *y = out->data;
  walker w = {.nd = a->ndim, .n = 1, .shape = a->shape};
  memcpy(w.st[0], a->strides, sizeof a->strides);
  if (a->dtype == GROVE_F32) {
    /* The number as float32, as torch compares a float tensor with it. */
    const float bf = (float)b, *pa = a->data;
    for (int64_t i = 0; i < n; i++, walk_next(&w)) y[i] = cmp_d(op, pa[w.off[0]], bf);
  } else if (b == floor(b) && fabs(b) < 9.2e18) {
    const int64_t bi = (int64_t)b;
    for (int64_t i = 0; i < n; i++, walk_next(&w)) y[i] = cmp_i(op, get_i(a, w.off[0]), bi);
  } else {
    for (int64_t i = 0; i < n; i++, walk_next(&w)) y[i] = cmp_d(op, get_f(a, w.off[0]), b);
  }
  return GROVE_OK;
}

/* The shape three operands broadcast to (where's and the ternaries'). */
static grove_status broadcast3(grove_fwd *f, const grove_tensor *a, const grove_tensor *b,
                               const grove_tensor *c, int *nd, int64_t *shape) {
  int nd1;
  int64_t sh1[GROVE_MAX_DIMS];
  grove_status s = grove__broadcast_shape(f, a, b, &nd1, sh1);
  if (s) return s;
  grove_tensor t;
  grove_tensor_init(&t, c->dtype, nd1, sh1, NULL);
  return grove__broadcast_shape(f, &t, c, nd, shape);
}

/* A number as a 0-d tensor of dtype dt (float32, int64 or bool), its
 * element in *v (the caller's). */
typedef union {
  float f;
  int64_t i;
  uint8_t b;
} scalar;

static grove_status scalar_tensor(grove_fwd *f, grove_tensor *t, grove_dtype dt, double x,
                                  scalar *v) {
  if (dt == GROVE_I64 && !(fabs(x) < 0x1p63)) /* torch: cannot be converted without overflow */
    return grove_err_set(f->err, GROVE_E_INVALID_ARGUMENT,
                         "where: the value %g does not fit an int64 result", x);
  if (dt == GROVE_F32)
    v->f = (float)x;
  else if (dt == GROVE_I64)
    v->i = (int64_t)x;
  else
    v->b = x != 0;
  grove_tensor_init(t, dt, 0, NULL, v);
  return GROVE_OK;
}

grove_status grove__op_where(grove_fwd *f, const grove_tensor *cond, const grove_tensor *a,
                             double av, const grove_tensor *b, double bv, grove_dtype dt,
                             grove_tensor *out) {
  grove_status s;
  if ((s = check_dtype(f, "where", cond))) return s;
  for (int k = 0; k < 2; k++) {
    const grove_tensor *t = k ? b : a;
    if (t && (s = check_dtype(f, "where", t))) return s;
  }
  if (dt != GROVE_F32 && dt != GROVE_I64 && dt != GROVE_BOOL)
    return grove_err_set(f->err, GROVE_E_DTYPE, "where: a %s result is not supported",
                         grove_dtype_name(dt));
  /* The operands in the result's dtype (themselves when they have it); a
   * number operand is a 0-d tensor for the broadcast, converted only to
   * dt (masked_fill's -inf into an int64 tensor is refused, as torch's). */
  grove_tensor ta, tb;
  scalar one[2];
  if ((s = a ? grove__op_to_dtype(f, a, dt, &ta) : scalar_tensor(f, &ta, dt, av, &one[0])) ||
      (s = b ? grove__op_to_dtype(f, b, dt, &tb) : scalar_tensor(f, &tb, dt, bv, &one[1])))
    return s;
  const grove_tensor *pa = &ta, *pb = &tb;
  int nd2;
  int64_t shape[GROVE_MAX_DIMS];
  if ((s = broadcast3(f, cond, pa, pb, &nd2, shape)) ||
      (s = grove_fwd_alloc(f, out, dt, nd2, shape)))
    return s;
  const int64_t n = grove_tensor_numel(out);
  walker w;
  walk_start(&w, nd2, shape, 3, (const grove_tensor *const[]){cond, pa, pb});
  const bool byte_cond = cond->dtype == GROVE_BOOL || cond->dtype == GROVE_U8;
  const uint8_t *c = cond->data;
#define WHERE_LOOP(T)                                                              \
  do {                                                                             \
    const T *da = pa->data, *db = pb->data;                                        \
    T *y = out->data;                                                              \
    for (int64_t i = 0; i < n; i++, walk_next(&w)) {                               \
      const bool take = byte_cond ? c[w.off[0]] != 0 : get_f(cond, w.off[0]) != 0; \
      y[i] = take ? da[w.off[1]] : db[w.off[2]];                                   \
    }                                                                              \
  } while (0)
  if (dt == GROVE_F32)
    WHERE_LOOP(float);
  else if (dt == GROVE_I64)
    WHERE_LOOP(int64_t);
  else
    WHERE_LOOP(uint8_t);
#undef WHERE_LOOP
  return GROVE_OK;
}

grove_status grove__op_masked_fill(grove_fwd *f, const grove_tensor *x, const grove_tensor *mask,
                                   double value, grove_tensor *out) {
  int nd;
  int64_t shape[GROVE_MAX_DIMS];
  grove_status s = grove__broadcast_shape(f, x, mask, &nd, shape);
  if (s) return s;
  if (nd != x->ndim || memcmp(shape, x->shape, (size_t)nd * sizeof(int64_t)) != 0) {
    char a[128], b[128];
    return grove_err_set(f->err, GROVE_E_SHAPE,
                         "masked_fill: the mask %s does not broadcast to the input's shape %s",
                         grove_shape_str(mask->ndim, mask->shape, a, sizeof a),
                         grove_shape_str(x->ndim, x->shape, b, sizeof b));
  }
  if (mask->dtype != GROVE_BOOL)
    return grove_err_set(f->err, GROVE_E_DTYPE,
                         "masked_fill: expected a bool mask, got %s (compare it first: mask == 1)",
                         grove_dtype_name(mask->dtype));
  /* x's dtype, as torch keeps it (the value converted to it). */
  const grove_dtype dt = is_float(x->dtype)       ? GROVE_F32
                         : x->dtype == GROVE_BOOL ? GROVE_BOOL
                                                  : GROVE_I64;
  return grove__op_where(f, mask, NULL, value, x, 0, dt, out);
}

/* One element of a GROVE__TER_* function, as aten's CPU kernels compute
 * it (Lerp.h, PointwiseOpsKernel.cpp): the same order of operations. */
static inline float ternary_f(int op, float x, float y, float z, float value) {
  switch (op) {
    case GROVE__TER_LERP: {
      const float diff = y - x;
      return fabsf(z) < 0.5f ? x + z * diff : y - diff * (1.0f - z);
    }
    case GROVE__TER_ADDCMUL:
      return x + value * y * z;
    default: /* GROVE__TER_ADDCDIV */
      return x + value * y / z;
  }
}

grove_status grove__op_ternary(grove_fwd *f, int op, const grove_tensor *a, const grove_tensor *b,
                               const grove_tensor *c, double value, grove_tensor *out) {
  static const char *const names[] = {"lerp", "addcmul", "addcdiv"};
  const char *name = names[op];
  const grove_tensor *ops[3] = {a, b, c};
  bool any_float = false;
  grove_status s;
  for (int k = 0; k < 3; k++) {
    if ((s = check_dtype(f, name, ops[k]))) return s;
    any_float = any_float || is_float(ops[k]->dtype);
  }
  const bool ints = !any_float;
  if (op == GROVE__TER_LERP && (!is_float(a->dtype) || !is_float(b->dtype)))
    return grove_err_set(f->err, GROVE_E_DTYPE,
                         "lerp: expected float tensors, got %s and %s (as torch)",
                         grove_dtype_name(a->dtype), grove_dtype_name(b->dtype));
  if (op == GROVE__TER_ADDCDIV && !is_float(b->dtype) && !is_float(c->dtype))
    return grove_err_set(f->err, GROVE_E_DTYPE,
                         "addcdiv: integer division with addcdiv is not supported (as in torch), "
                         "got %s / %s; make tensor1 or tensor2 float",
                         grove_dtype_name(b->dtype), grove_dtype_name(c->dtype));
  if (ints && (value != floor(value) || !(fabs(value) < 0x1p63)))
    return grove_err_set(f->err, GROVE_E_DTYPE,
                         "addcmul: for integer tensors value must be an integer (of int64's "
                         "range), got %g (as in torch)",
                         value);
  /* torch's promotion: int64 among integers (and bool), else float32. */
  const grove_dtype dt = ints ? GROVE_I64 : GROVE_F32;
  grove_tensor t[3];
  for (int k = 0; k < 3; k++)
    if ((s = grove__op_to_dtype(f, ops[k], dt, &t[k]))) return s;
  int nd2;
  int64_t shape[GROVE_MAX_DIMS];
  if ((s = broadcast3(f, &t[0], &t[1], &t[2], &nd2, shape)) ||
      (s = grove_fwd_alloc(f, out, dt, nd2, shape)))
    return s;
  const int64_t n = grove_tensor_numel(out);
  walker w;
  walk_start(&w, nd2, shape, 3, (const grove_tensor *const[]){&t[0], &t[1], &t[2]});
  if (ints) { /* addcmul alone: wrapping as int64 does */
    const int64_t *x = t[0].data, *y = t[1].data, *z = t[2].data;
    int64_t *o = out->data;
    const uint64_t v = (uint64_t)(int64_t)value;
    for (int64_t i = 0; i < n; i++, walk_next(&w))
      o[i] = (int64_t)((uint64_t)x[w.off[0]] + v * (uint64_t)y[w.off[1]] * (uint64_t)z[w.off[2]]);
    return GROVE_OK;
  }
  const float *x = t[0].data, *y = t[1].data, *z = t[2].data, v = (float)value;
  float *o = out->data;
  for (int64_t i = 0; i < n; i++, walk_next(&w))
    o[i] = ternary_f(op, x[w.off[0]], y[w.off[1]], z[w.off[2]], v);
  return GROVE_OK;
}
