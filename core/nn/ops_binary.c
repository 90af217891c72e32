/* ops_binary.c: the binary operations add, sub, mul, div, floordiv, mod
 * (numbers only) and matmul (torch.*, operator.*, Tensor methods): their entries (ops.h) and
 * forwards, and Python's arithmetic on numbers (sizes, scalars) that the
 * same nodes compute when neither operand is a tensor; maximum, minimum,
 * atan2, the three-operand lerp, addcmul, addcdiv, and the logical and
 * bitwise operations.  The kernels are graph_ops.c's (select.c's for
 * three operands). */
#include <math.h>
#include <string.h>

#include "graph_ops.h"
#include "ops.h"
#include "tensor_ops.h"

grove_status grove__graph_arith(int op, gnum x, gnum y, gnum alpha, gnum *out, grove_err *err) {
  const bool ints = x.is_int && y.is_int && alpha.is_int;
  switch (op) {
    case G_ADD:
    case G_SUB: {
      const int sign = op == G_ADD ? 1 : -1;
      *out = ints ? (gnum){true, x.i + sign * alpha.i * y.i, 0}
                  : (gnum){false, 0, x.f + sign * alpha.f * y.f};
      break;
    }
    case G_MUL:
      *out = ints ? (gnum){true, x.i * y.i, 0} : (gnum){false, 0, x.f * y.f};
      break;
    case G_DIV:
      if (y.f == 0) return grove_err_set(err, GROVE_E_RANGE, "division by zero");
      *out = (gnum){false, 0, x.f / y.f};
      break;
    case G_MOD: /* Python's %: the sign of y */
      if (y.f == 0) return grove_err_set(err, GROVE_E_RANGE, "integer division or modulo by zero");
      if (ints) {
        int64_t r = x.i % y.i;
        if (r != 0 && ((r < 0) != (y.i < 0))) r += y.i;
        *out = (gnum){true, r, 0};
      } else {
        double r = fmod(x.f, y.f);
        if (r != 0 && ((r < 0) != (y.f < 0))) r += y.f;
        *out = (gnum){false, 0, r};
      }
      break;
    default: /* floordiv */
      if (y.f == 0) return grove_err_set(err, GROVE_E_RANGE, "integer division or modulo by zero");
      if (ints) {
        int64_t q = x.i / y.i;
        if ((x.i % y.i != 0) && ((x.i < 0) != (y.i < 0))) q--;
        *out = (gnum){true, q, 0};
      } else {
        *out = (gnum){false, 0, floor(x.f / y.f)};
      }
      break;
  }
  if (out->is_int) out->f = (double)out->i;
  return GROVE_OK;
}

static bool int_dtype(grove_dtype dt) {
  return dt == GROVE_I64 || dt == GROVE_I32 || dt == GROVE_I16 || dt == GROVE_I8 ||
         dt == GROVE_U8 || dt == GROVE_BOOL;
}

/* Bitwise and, or, xor: integer only (binary_i64's, not the float kernel's). */
enum { BIN_AND = 100, BIN_OR, BIN_XOR };

/* One int64 element of a OP b (a GROVE__BIN_* but DIV, or BIN_AND ...); false when b is 0
 * for a division (torch raises ZeroDivisionError).  Wrapping as int64. */
static bool i64_op(int op, int64_t x, int64_t v, int64_t alpha, int64_t *y) {
  const uint64_t ux = (uint64_t)x, uv = (uint64_t)v;
  switch (op) {
    case GROVE__BIN_ADD:
      *y = (int64_t)(ux + (uint64_t)alpha * uv);
      return true;
    case GROVE__BIN_SUB:
      *y = (int64_t)(ux - (uint64_t)alpha * uv);
      return true;
    case GROVE__BIN_MUL:
      *y = (int64_t)(ux * uv);
      return true;
    case GROVE__BIN_MAX:
      *y = x > v ? x : v;
      return true;
    case GROVE__BIN_MIN:
      *y = x < v ? x : v;
      return true;
    default:
      break;
  }
  if (op == BIN_AND || op == BIN_OR || op == BIN_XOR) {
    *y = op == BIN_AND ? (x & v) : op == BIN_OR ? (x | v) : (x ^ v);
    return true;
  }
  if (v == 0) return false;
  if (v == -1) { /* INT64_MIN / -1 overflows in C; torch wraps */
    *y = op == GROVE__BIN_MOD ? 0 : (int64_t)(0 - ux);
    return true;
  }
  const int64_t q = x / v, r = x % v;
  const bool off = r != 0 && ((r < 0) != (v < 0)); /* floored differs from truncated */
  *y = op == GROVE__BIN_TRUNCDIV ? q : op == GROVE__BIN_FLOORDIV ? q - off : r + (off ? v : 0);
  return true;
}

/* a OP b on int64 tensors (broadcast), as torch: add, sub (alpha an int),
 * mul, maximum / minimum, floor / trunc division and remainder. */
static grove_status binary_i64(grove_fwd *f, int op, const grove_tensor *a0, const grove_tensor *b0,
                               int64_t alpha, grove_tensor *out) {
  grove_tensor a, b;
  grove_status s;
  if ((s = grove__op_to_dtype(f, a0, GROVE_I64, &a)) ||
      (s = grove__op_to_dtype(f, b0, GROVE_I64, &b)))
    return s;
  int nd;
  int64_t shape[GROVE_MAX_DIMS], sa[GROVE_MAX_DIMS], sb[GROVE_MAX_DIMS];
  if ((s = grove__broadcast_shape(f, &a, &b, &nd, shape)) ||
      (s = grove_fwd_alloc(f, out, GROVE_I64, nd, shape)))
    return s;
  /* Element strides of a and b as stored (a view may be strided). */
  grove__broadcast_strides(&a, nd, shape, sa);
  grove__broadcast_strides(&b, nd, shape, sb);
  const int64_t n = grove_tensor_numel(out);
  const int64_t *pa = a.data, *pb = b.data;
  int64_t *y = out->data;
  int64_t idx[GROVE_MAX_DIMS] = {0}, oa = 0, ob = 0;
  for (int64_t i = 0; i < n; i++) {
    if (!i64_op(op, pa[oa], pb[ob], alpha, &y[i]))
      return grove_err_set(f->err, GROVE_E_RANGE, "ZeroDivisionError: integer division by zero");
    for (int d = nd - 1; d >= 0; d--) {
      if (++idx[d] < shape[d]) {
        oa += sa[d];
        ob += sb[d];
        break;
      }
      oa -= sa[d] * (shape[d] - 1);
      ob -= sb[d] * (shape[d] - 1);
      idx[d] = 0;
    }
  }
  return GROVE_OK;
}

/* a OP b: numbers stay Python numbers; a tensor on either side makes the
 * other a 0-d tensor.  In place into a tensor operand when the evaluator
 * allows it (c->overwrite) and the other does not read that memory. */
static grove_status binary_fwd(const grove__opctx *c, gval *res) {
  int op = c->def->id;
  /* div's rounding_mode (checked when compiling): "floor" is floordiv. */
  const bool trunc = op == G_DIV && c->args[2].kind == A_STR && strcmp(c->args[2].s, "trunc") == 0;
  if (op == G_DIV && c->args[2].kind == A_STR && strcmp(c->args[2].s, "floor") == 0)
    op = G_FLOORDIV;
  const garg *a = &c->args[0], *b = &c->args[1];
  const gval *va = grove__op_val(c, a), *vb = grove__op_val(c, b);
  bool ta = va && va->kind == V_TENSOR, tb = vb && vb->kind == V_TENSOR;
  double alpha = 1;
  int64_t ialpha = 1;
  bool alpha_int = true;
  if ((op == G_ADD || op == G_SUB) &&
      !grove__op_number(c, &c->args[2], &alpha, &ialpha, &alpha_int))
    return grove__op_want(c, "a number for alpha");
  const bool la = (va && va->kind == V_INTS) || a->kind == A_LIST,
             lb = (vb && vb->kind == V_INTS) || b->kind == A_LIST;
  if (op == G_ADD && la && lb) {
    /* size()[:-1] + (h, d): Python's tuple concatenation, a size tuple. */
    int64_t x[GROVE_MAX_DIMS], y[GROVE_MAX_DIMS];
    int nx, ny;
    grove_status s;
    if ((s = grove__op_ints(c, a, false, x, &nx)) || (s = grove__op_ints(c, b, false, y, &ny)))
      return s;
    if (nx + ny > GROVE_MAX_DIMS) return grove__op_want(c, "at most 8 sizes");
    res->kind = V_INTS;
    res->n = (int8_t)(nx + ny);
    memcpy(res->ints, x, (size_t)nx * sizeof(int64_t));
    memcpy(res->ints + nx, y, (size_t)ny * sizeof(int64_t));
    return GROVE_OK;
  }
  if (!ta && !tb) {
    /* Python arithmetic on numbers (sizes): ints stay ints. */
    if (trunc) return grove__op_want(c, "a tensor for div with rounding_mode=\"trunc\"");
    gnum x, y, v;
    if (!grove__op_number(c, a, &x.f, &x.i, &x.is_int) ||
        !grove__op_number(c, b, &y.f, &y.i, &y.is_int))
      return grove__op_want(c, "tensors or numbers");
    grove_status s = grove__graph_arith(op, x, y, (gnum){alpha_int, ialpha, alpha}, &v, c->f->err);
    if (s) return s;
    res->kind = v.is_int ? V_INT : V_FLOAT;
    res->i = v.i;
    res->f = v.f;
    return GROVE_OK;
  }
  const int bin = trunc              ? GROVE__BIN_TRUNCDIV
                  : op == G_ADD      ? GROVE__BIN_ADD
                  : op == G_SUB      ? GROVE__BIN_SUB
                  : op == G_MUL      ? GROVE__BIN_MUL
                  : op == G_FLOORDIV ? GROVE__BIN_FLOORDIV
                  : op == G_MOD      ? GROVE__BIN_MOD
                                     : GROVE__BIN_DIV;

  float sa = 0, sb = 0;
  int64_t ia = 0, ib = 0;
  bool a_int = false, b_int = false;
  grove_tensor xa, xb;
  if (ta) {
    xa = va->t[0];
    a_int = int_dtype(xa.dtype);
  } else {
    double x;
    if (!grove__op_number(c, a, &x, &ia, &a_int)) return grove__op_want(c, "a tensor or a number");
    sa = (float)x;
    grove_tensor_init(&xa, GROVE_F32, 0, NULL, &sa);
  }
  if (tb) {
    xb = vb->t[0];
    b_int = int_dtype(xb.dtype);
  } else {
    double y;
    if (!grove__op_number(c, b, &y, &ib, &b_int)) return grove__op_want(c, "a tensor or a number");
    sb = (float)y;
    grove_tensor_init(&xb, GROVE_F32, 0, NULL, &sb);
  }
  if (xa.dtype != GROVE_F32 || xb.dtype != GROVE_F32) {
    /* torch's promotion: integers (and bool) with integers stay int64 for
     * add, sub and mul; anything with a float, and true division, is
     * float32 (Grove's float). */
    grove_tensor y, pa = xa, pb = xb;
    grove_status s;
    /* bool with bool (a Python bool on one side too) stays bool in torch:
     * + is or, * is and; - is refused as torch refuses it. */
    const bool a_bool = ta ? xa.dtype == GROVE_BOOL : (va ? va->kind == V_BOOL : a->kind == A_BOOL),
               b_bool = tb ? xb.dtype == GROVE_BOOL : (vb ? vb->kind == V_BOOL : b->kind == A_BOOL);
    const bool both_bool = a_bool && b_bool && (ta || tb);
    if (both_bool && bin == GROVE__BIN_SUB)
      return grove_err_set(c->f->err, GROVE_E_DTYPE,
                           "%s: subtraction of two bool tensors is not supported (as in torch); "
                           "use ^ or logical_xor",
                           grove__op_label(c));
    if (a_int && b_int && bin != GROVE__BIN_DIV && alpha_int) {
      if (!ta) grove_tensor_init(&pa, GROVE_I64, 0, NULL, &ia);
      if (!tb) grove_tensor_init(&pb, GROVE_I64, 0, NULL, &ib);
      s = binary_i64(c->f, bin, &pa, &pb, ialpha, &y);
      if (!s && both_bool && (bin == GROVE__BIN_ADD || bin == GROVE__BIN_MUL) && ialpha == 1) {
        const grove_tensor sum = y; /* to_dtype's output must not be its input */
        s = grove__op_to_dtype(c->f, &sum, GROVE_BOOL, &y);
      }
    } else if (!(s = grove__op_to_dtype(c->f, &xa, GROVE_F32, &pa)) &&
               !(s = grove__op_to_dtype(c->f, &xb, GROVE_F32, &pb))) {
      s = grove__op_binary(c->f, bin, &pa, &pb, alpha, &y, NULL);
    }
    if (s) return s;
    grove__op_set_tensor(res, &y);
    return GROVE_OK;
  }
  const grove_tensor *into = NULL;
  if (ta && (c->overwrite & 1u) && !(tb && vb->reg[0] == va->reg[0]))
    into = &xa;
  else if (tb && (op == G_ADD || op == G_MUL) && (c->overwrite & 2u) &&
           !(ta && va->reg[0] == vb->reg[0]))
    into = &xb; /* a + b = b + a: b's memory will do when b has the result's shape */
  grove_tensor y;
  grove_status s = grove__op_binary(c->f, bin, &xa, &xb, alpha, &y, into);
  if (s) return s;
  grove__op_set_tensor(res, &y);
  return GROVE_OK;
}

static grove_status div_check(const grove__opdef *d, const garg *a, const char *jp,
                              grove_err *err) {
  if (a[2].kind != A_NONE &&
      !(a[2].kind == A_STR && (strcmp(a[2].s, "floor") == 0 || strcmp(a[2].s, "trunc") == 0)))
    return grove_err_set(err, GROVE_E_SPEC,
                         "%s: div's rounding_mode must be null, \"floor\" or \"trunc\"", jp);
  return GROVE_OK;
}

static grove_status matmul_fwd(const grove__opctx *c, gval *res) {
  const grove_tensor *x, *b;
  grove_tensor y;
  grove_status s;
  if ((s = grove__op_tensor(c, 0, &x)) || (s = grove__op_tensor(c, 1, &b)) ||
      (s = grove__op_matmul(c->f, x, b, &y)))
    return s;
  grove__op_set_tensor(res, &y);
  return GROVE_OK;
}

grove_status grove__op_max_min(const grove__opctx *c, gval *res, bool max) {
  const grove_tensor *x, *b;
  grove_tensor y, xf, bf;
  grove_status s;
  const int op = max ? GROVE__BIN_MAX : GROVE__BIN_MIN;
  const char *name = max ? "maximum" : "minimum";
  if ((s = grove__op_tensor(c, 0, &x)) || (s = grove__op_tensor(c, 1, &b))) return s;
  if (int_dtype(x->dtype) && int_dtype(b->dtype)) {
    /* Integers (T5's torch.min(bucket, torch.full_like(bucket, n - 1))):
     * int64, and bool with bool stays bool, as torch promotes. */
    if ((s = binary_i64(c->f, op, x, b, 1, &y))) return s;
    if (x->dtype == GROVE_BOOL && b->dtype == GROVE_BOOL) {
      const grove_tensor r = y; /* to_dtype's output must not be its input */
      if ((s = grove__op_to_dtype(c->f, &r, GROVE_BOOL, &y))) return s;
    }
  } else if ((s = grove__op_to_dtype(c->f, x, GROVE_F32, &xf)) ||
             (s = grove__op_to_dtype(c->f, b, GROVE_F32, &bf)) ||
             (s = grove__op_binary(c->f, op, &xf, &bf, 1, &y, NULL))) {
    grove_err_prefix(c->f->err, "%s", name);
    return s;
  }
  grove__op_set_tensor(res, &y);
  return GROVE_OK;
}

/* torch.maximum / minimum (two tensors, broadcast): the binary kernel's
 * MAX and MIN. */
static grove_status max_min_fwd(const grove__opctx *c, gval *res) {
  return grove__op_max_min(c, res, strcmp(c->def->name, "maximum") == 0);
}

/* torch.atan2(input, other): two tensors, broadcast; integers and bool
 * compute in float32, as torch promotes them. */
static grove_status atan2_fwd(const grove__opctx *c, gval *res) {
  const grove_tensor *x, *b;
  grove_tensor y, xf, bf;
  grove_status s;
  if ((s = grove__op_tensor(c, 0, &x)) || (s = grove__op_tensor(c, 1, &b)) ||
      (s = grove__op_to_dtype(c->f, x, GROVE_F32, &xf)) ||
      (s = grove__op_to_dtype(c->f, b, GROVE_F32, &bf)))
    return s;
  if ((s = grove__op_binary(c->f, GROVE__BIN_ATAN2, &xf, &bf, 1, &y, NULL))) {
    grove_err_prefix(c->f->err, "%s", "atan2");
    return s;
  }
  grove__op_set_tensor(res, &y);
  return GROVE_OK;
}

/* Argument k as a tensor, or a Python number as a 0-d float32 one in *buf
 * (lerp's weight). */
static grove_status tensor_or_number(const grove__opctx *c, int k, float *buf, grove_tensor *out) {
  const gval *v = grove__op_val(c, &c->args[k]);
  if (v && v->kind == V_TENSOR) {
    *out = v->t[0];
    return GROVE_OK;
  }
  double x;
  int64_t i;
  bool is_int;
  if (!grove__op_number(c, &c->args[k], &x, &i, &is_int))
    return grove__op_want(c, "a tensor or a number");
  *buf = (float)x;
  grove_tensor_init(out, GROVE_F32, 0, NULL, buf);
  return GROVE_OK;
}

/* torch.lerp(input, end, weight) (weight a tensor or a number),
 * torch.addcmul / addcdiv(input, tensor1, tensor2, value=1): select.c's
 * three-operand kernel. */
static grove_status ternary_fwd(const grove__opctx *c, gval *res) {
  const char *n = c->def->name;
  const int op = strcmp(n, "lerp") == 0      ? GROVE__TER_LERP
                 : strcmp(n, "addcmul") == 0 ? GROVE__TER_ADDCMUL
                                             : GROVE__TER_ADDCDIV;
  const grove_tensor *a, *b;
  grove_tensor w, y;
  float wbuf = 0;
  double value = 1;
  int64_t iv;
  bool is_int;
  grove_status s;
  if ((s = grove__op_tensor(c, 0, &a)) || (s = grove__op_tensor(c, 1, &b)) ||
      (s = tensor_or_number(c, 2, &wbuf, &w)))
    return s;
  if (op != GROVE__TER_LERP && !grove__op_number(c, &c->args[3], &value, &iv, &is_int))
    return grove__op_want(c, "a number for value");
  if ((s = grove__op_ternary(c->f, op, a, b, &w, value, &y))) return s;
  grove__op_set_tensor(res, &y);
  return GROVE_OK;
}

/* Operands of a binary op: a tensor or a Python number. */
#define OPERAND(n) \
  { .name = n, .kind = P_OPERAND, .dk = D_REQ }
#define ALPHA \
  { .name = "alpha", .kind = P_NUMBER, .dk = D_INT, .dv = 1 }

const grove__opdef grove__opdef_add = {
    .name = "add",
    .id = G_ADD,
    .torch = (const char *const[]){"operator.add(input,other)", "torch.add(input,other)",
                                   "Tensor.add(input,other)", NULL},
    .varargs = -1,
    .p = {OPERAND("input"), OPERAND("other"), ALPHA},
    .forward = binary_fwd,
};

const grove__opdef grove__opdef_sub = {
    .name = "sub",
    .id = G_SUB,
    .torch = (const char *const[]){"operator.sub(input,other)", "torch.sub(input,other)",
                                   "Tensor.sub(input,other)", NULL},
    .varargs = -1,
    .p = {OPERAND("input"), OPERAND("other"), ALPHA},
    .forward = binary_fwd,
};

const grove__opdef grove__opdef_mul = {
    .name = "mul",
    .id = G_MUL,
    .torch = (const char *const[]){"operator.mul(input,other)", "torch.mul(input,other)",
                                   "Tensor.mul(input,other)", NULL},
    .varargs = -1,
    .p = {OPERAND("input"), OPERAND("other")},
    .forward = binary_fwd,
};

const grove__opdef grove__opdef_div = {
    .name = "div",
    .id = G_DIV,
    .torch = (const char *const[]){"operator.truediv(input,other)",
                                   "torch.div(input,other,rounding_mode)",
                                   "Tensor.div(input,other,rounding_mode)",
                                   "torch.true_divide(input,other)",
                                   "Tensor.true_divide(input,other)", NULL},
    .varargs = -1,
    .p = {OPERAND("input"), OPERAND("other"), OP_NONE("rounding_mode", P_STR)},
    .check = div_check,
    .forward = binary_fwd,
};

const grove__opdef grove__opdef_floordiv = {
    .name = "floordiv",
    .id = G_FLOORDIV,
    .torch =
        (const char *const[]){"operator.floordiv(input,other)", "torch.floor_divide(input,other)",
                              "Tensor.floor_divide(input,other)", NULL},
    .varargs = -1,
    .p = {OPERAND("input"), OPERAND("other")},
    .forward = binary_fwd,
};

const grove__opdef grove__opdef_remainder = {
    .name = "remainder",
    .id = G_MOD,
    .torch = (const char *const[]){"operator.mod(input,other)", "torch.remainder(input,other)",
                                   "Tensor.remainder(input,other)", NULL},
    .varargs = -1,
    .p = {OPERAND("input"), OPERAND("other")},
    .forward = binary_fwd,
};

/* Only on numbers: pad amounts and window counts computed from x.shape. */

const grove__opdef grove__opdef_matmul = {
    .name = "matmul",
    .id = G_MATMUL,
    .torch = (const char *const[]){"operator.matmul(input,other)", "torch.matmul(input,other)",
                                   "Tensor.matmul(input,other)", NULL},
    .varargs = -1,
    .p = {OP_REQ("input", P_TENSOR), OP_REQ("other", P_TENSOR)},
    .forward = matmul_fwd,
};

#define MAX_MIN(n)                                                                                \
  const grove__opdef grove__opdef_##n = {                                                         \
      .name = #n,                                                                                 \
      .id = G_OP,                                                                                 \
      .torch =                                                                                    \
          (const char *const[]){"torch." #n "(input,other)", "Tensor." #n "(input,other)", NULL}, \
      .varargs = -1,                                                                              \
      .p = {OP_REQ("input", P_TENSOR), OP_REQ("other", P_TENSOR)},                                \
      .forward = max_min_fwd,                                                                     \
  }
MAX_MIN(maximum);
MAX_MIN(minimum);

const grove__opdef grove__opdef_atan2 = {
    .name = "atan2",
    .id = G_OP,
    .torch =
        (const char *const[]){"torch.atan2(input,other)", "Tensor.atan2(input,other)",
                              "torch.arctan2(input,other)", "Tensor.arctan2(input,other)", NULL},
    .varargs = -1,
    .p = {OP_REQ("input", P_TENSOR), OP_REQ("other", P_TENSOR)},
    .forward = atan2_fwd,
};

const grove__opdef grove__opdef_lerp = {
    .name = "lerp",
    .id = G_OP,
    .torch = (const char *const[]){"torch.lerp(input,end,weight)", "Tensor.lerp(input,end,weight)",
                                   NULL},
    .varargs = -1,
    .p = {OP_REQ("input", P_TENSOR), OP_REQ("end", P_TENSOR), OPERAND("weight")},
    .forward = ternary_fwd,
};

#define ADDC(n)                                                                           \
  const grove__opdef grove__opdef_##n = {                                                 \
      .name = #n,                                                                         \
      .id = G_OP,                                                                         \
      .torch = (const char *const[]){"torch." #n "(input,tensor1,tensor2,value)",         \
                                     "Tensor." #n "(input,tensor1,tensor2,value)", NULL}, \
      .varargs = -1,                                                                      \
      .p = {OP_REQ("input", P_TENSOR),                                                    \
            OP_REQ("tensor1", P_TENSOR),                                                  \
            OP_REQ("tensor2", P_TENSOR),                                                  \
            {.name = "value", .kind = P_NUMBER, .dk = D_INT, .dv = 1}},                   \
      .forward = ternary_fwd,                                                             \
  }
ADDC(addcmul);
ADDC(addcdiv);

/* ------------------------------------------------------------ logical and bitwise */

/* Argument k as a tensor, or a Python bool / int as a 0-d int64 one in *buf. */
static grove_status int_operand(const grove__opctx *c, int k, int64_t *buf, grove_tensor *out,
                                bool *is_bool) {
  const gval *v = grove__op_val(c, &c->args[k]);
  if (v && v->kind == V_TENSOR) {
    *out = v->t[0];
    *is_bool = out->dtype == GROVE_BOOL;
    return GROVE_OK;
  }
  double f;
  bool is_int;
  if (!grove__op_number(c, &c->args[k], &f, buf, &is_int) || !is_int)
    return grove__op_want(c, "a bool or integer tensor, or a bool or int");
  *is_bool = c->args[k].kind == A_BOOL;
  grove_tensor_init(out, GROVE_I64, 0, NULL, buf);
  return GROVE_OK;
}

/* a & b, a | b, a ^ b (operator.and_ ..., torch.bitwise_*): bitwise on
 * integers (int64), logical on bools (a bool result); logical_and / or /
 * xor: of a != 0 and b != 0, always bool. */
static grove_status bitwise_fwd(const grove__opctx *c, gval *res) {
  const char *n = c->def->name;
  const bool logical = strncmp(n, "logical_", 8) == 0;
  const char *what = n + 8; /* after "logical_" or "bitwise_" (8 letters each) */
  const int op = strcmp(what, "and") == 0 ? BIN_AND : strcmp(what, "or") == 0 ? BIN_OR : BIN_XOR;
  int64_t ba = 0, bb = 0;
  bool a_bool, b_bool;
  grove_tensor a, b, y;
  grove_status s;
  if ((s = int_operand(c, 0, &ba, &a, &a_bool)) || (s = int_operand(c, 1, &bb, &b, &b_bool)))
    return s;
  const bool to_bool = logical || (a_bool && b_bool);
  if (!logical && !to_bool && (grove_dtype_is_float(a.dtype) || grove_dtype_is_float(b.dtype)))
    return grove_err_set(c->f->err, GROVE_E_DTYPE,
                         "%s: bitwise operations take integer or bool tensors, got %s and %s", n,
                         grove_dtype_name(a.dtype), grove_dtype_name(b.dtype));
  /* (to_dtype's result must not be its input's struct) */
  grove_tensor a1 = a, b1 = b, r;
  if (to_bool && ((s = grove__op_to_dtype(c->f, &a, GROVE_BOOL, &a1)) ||
                  (s = grove__op_to_dtype(c->f, &b, GROVE_BOOL, &b1))))
    return s;
  if ((s = binary_i64(c->f, op, &a1, &b1, 1, &y))) return s;
  r = y;
  if (to_bool && (s = grove__op_to_dtype(c->f, &y, GROVE_BOOL, &r))) return s;
  grove__op_set_tensor(res, &r);
  return GROVE_OK;
}

/* ~x (operator.invert, torch.bitwise_not): not on bools, ~v on integers;
 * logical_not: x == 0, a bool. */
static grove_status not_fwd(const grove__opctx *c, gval *res) {
  const grove_tensor *x;
  grove_tensor y;
  grove_status s = grove__op_tensor(c, 0, &x);
  if (s) return s;
  const bool logical = strcmp(c->def->name, "logical_not") == 0;
  if (logical || x->dtype == GROVE_BOOL) {
    if ((s = grove__op_compare_scalar(c->f, GROVE__CMP_EQ, x, 0, &y))) return s;
  } else {
    if (grove_dtype_is_float(x->dtype))
      return grove_err_set(c->f->err, GROVE_E_DTYPE,
                           "bitwise_not: expected an integer or bool tensor, got %s",
                           grove_dtype_name(x->dtype));
    int64_t m1 = -1;
    grove_tensor ones;
    grove_tensor_init(&ones, GROVE_I64, 0, NULL, &m1);
    if ((s = binary_i64(c->f, BIN_XOR, x, &ones, 1, &y))) return s; /* ~v = v ^ -1 */
  }
  grove__op_set_tensor(res, &y);
  return GROVE_OK;
}

#define BITWISE(n, ...)                                  \
  const grove__opdef grove__opdef_##n = {                \
      .name = #n,                                        \
      .id = G_OP,                                        \
      .torch = (const char *const[]){__VA_ARGS__, NULL}, \
      .varargs = -1,                                     \
      .p = {OPERAND("input"), OPERAND("other")},         \
      .forward = bitwise_fwd,                            \
  }
BITWISE(bitwise_and, "operator.and_(input,other)", "torch.bitwise_and(input,other)",
        "Tensor.bitwise_and(input,other)");
BITWISE(bitwise_or, "operator.or_(input,other)", "torch.bitwise_or(input,other)",
        "Tensor.bitwise_or(input,other)");
BITWISE(bitwise_xor, "operator.xor(input,other)", "torch.bitwise_xor(input,other)",
        "Tensor.bitwise_xor(input,other)");
BITWISE(logical_and, "torch.logical_and(input,other)", "Tensor.logical_and(input,other)");
BITWISE(logical_or, "torch.logical_or(input,other)", "Tensor.logical_or(input,other)");
BITWISE(logical_xor, "torch.logical_xor(input,other)", "Tensor.logical_xor(input,other)");

const grove__opdef grove__opdef_bitwise_not = {
    .name = "bitwise_not",
    .id = G_OP,
    .torch = (const char *const[]){"operator.invert(input)", "torch.bitwise_not(input)",
                                   "Tensor.bitwise_not(input)", NULL},
    .varargs = -1,
    .p = {OP_REQ("input", P_TENSOR)},
    .forward = not_fwd,
};

const grove__opdef grove__opdef_logical_not = {
    .name = "logical_not",
    .id = G_OP,
    .torch = (const char *const[]){"torch.logical_not(input)", "Tensor.logical_not(input)", NULL},
    .varargs = -1,
    .p = {OP_REQ("input", P_TENSOR)},
    .forward = not_fwd,
};
