/* ops_binary.c: the binary operations add, sub, mul, div, floordiv, mod
 * (numbers only) and matmul (torch.*, operator.*, Tensor methods): their entries (ops.h) and
 * forwards, and Python's arithmetic on numbers (sizes, scalars) that the
 * same nodes compute when neither operand is a tensor.  The kernels are
 * graph_ops.c's. */
#include <math.h>
#include <string.h>

#include "graph_ops.h"
#include "ops.h"

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
    case G_MOD:
      if (y.f == 0) return grove_err_set(err, GROVE_E_RANGE, "integer division or modulo by zero");
      if (ints) {
        int64_t r = x.i % y.i;
        if (r != 0 && ((r < 0) != (y.i < 0))) r += y.i; /* Python's: the divisor's sign */
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

/* a OP b: numbers stay Python numbers; a tensor on either side makes the
 * other a 0-d tensor.  In place into a tensor operand when the evaluator
 * allows it (c->overwrite) and the other does not read that memory. */
static grove_status binary_fwd(const grove__opctx *c, gval *res) {
  const int op = c->def->id;
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
  if (op == G_FLOORDIV || op == G_MOD)
    return grove_err_set(c->f->err, GROVE_E_UNSUPPORTED, "%s of tensors is not supported",
                         op == G_MOD ? "modulo" : "floor division");
  float sa = 0, sb = 0;
  grove_tensor xa, xb;
  if (ta) {
    xa = va->t[0];
  } else {
    double x;
    int64_t ix;
    bool xi;
    if (!grove__op_number(c, a, &x, &ix, &xi)) return grove__op_want(c, "a tensor or a number");
    sa = (float)x;
    grove_tensor_init(&xa, GROVE_F32, 0, NULL, &sa);
  }
  if (tb) {
    xb = vb->t[0];
  } else {
    double y;
    int64_t iy;
    bool yi;
    if (!grove__op_number(c, b, &y, &iy, &yi)) return grove__op_want(c, "a tensor or a number");
    sb = (float)y;
    grove_tensor_init(&xb, GROVE_F32, 0, NULL, &sb);
  }
  const int bin = op == G_ADD   ? GROVE__BIN_ADD
                  : op == G_SUB ? GROVE__BIN_SUB
                  : op == G_MUL ? GROVE__BIN_MUL
                                : GROVE__BIN_DIV;
  const grove_tensor *into = NULL;
  if (ta && (c->overwrite & 1u) && !(tb && vb->reg[0] == va->reg[0]))
    into = &xa;
  else if (tb && op != G_SUB && op != G_DIV && (c->overwrite & 2u) &&
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
  if (a[2].kind != A_NONE)
    return grove_err_set(err, GROVE_E_UNSUPPORTED,
                         "%s: div with rounding_mode is not supported (only true division)", jp);
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
    .torch = (const char *const[]){"operator.truediv(input,other)", "torch.div(input,other)",
                                   "Tensor.div(input,other,rounding_mode)", NULL},
    .varargs = -1,
    .p = {OPERAND("input"), OPERAND("other"), OP_NONE("rounding_mode", P_STR)},
    .check = div_check,
    .forward = binary_fwd,
};

const grove__opdef grove__opdef_floordiv = {
    .name = "floordiv",
    .id = G_FLOORDIV,
    .torch = (const char *const[]){"operator.floordiv(input,other)", NULL},
    .varargs = -1,
    .p = {OPERAND("input"), OPERAND("other")},
    .forward = binary_fwd,
};

/* Only on numbers: pad amounts and window counts computed from x.shape. */
const grove__opdef grove__opdef_mod = {
    .name = "mod",
    .id = G_MOD,
    .torch = (const char *const[]){"operator.mod(input,other)", NULL},
    .varargs = -1,
    .p = {OPERAND("input"), OPERAND("other")},
    .forward = binary_fwd,
};

const grove__opdef grove__opdef_matmul = {
    .name = "matmul",
    .id = G_MATMUL,
    .torch = (const char *const[]){"operator.matmul(input,other)", "torch.matmul(input,other)",
                                   "Tensor.matmul(input,other)", NULL},
    .varargs = -1,
    .p = {OP_REQ("input", P_TENSOR), OP_REQ("other", P_TENSOR)},
    .forward = matmul_fwd,
};
