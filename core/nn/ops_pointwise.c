/* ops_pointwise.c: the op entries (ops.h) of the torchvision zoo's
 * activations and pointwise math: relu6, hardswish, hardsigmoid, hardtanh,
 * elu, selu, celu, softplus, mish (each with its torch.nn module), clamp,
 * exp, log, sqrt, rsqrt, abs, neg, pow, nan_to_num, Python's int() of a
 * size, the dtype conversions float / long / bool, dim and numel, and
 * torchvision's stochastic_depth (identity in eval).  The kernels are pointwise.c's (tensor_ops.h);
 * a module and its functional form run the same entry. */
#include <float.h>
#include <math.h>
#include <string.h>

#include "graph_ops.h"
#include "layers_internal.h"
#include "ops.h"
#include "tensor_ops.h"

#define INPUT \
  { .name = "input", .kind = P_TENSOR, .dk = D_REQ }
#define INPLACE \
  { .name = "inplace", .kind = P_IGNORED, .dk = D_BOOL, .dv = 0 }
#define FNUM(n, v) \
  { .name = n, .kind = P_FLOAT, .dk = D_FLOAT, .dv = v, .min = -INFINITY, .max = INFINITY }

/* A number argument k (constant or computed), or dflt when it is None. */
static grove_status num_arg(const grove__opctx *c, int k, double dflt, double *out) {
  const garg *a = &c->args[k];
  if (a->kind == A_NONE) {
    *out = dflt;
    return GROVE_OK;
  }
  int64_t i;
  bool is_int;
  if (!grove__op_number(c, a, out, &i, &is_int))
    return grove_err_set(c->f->err, GROVE_E_INVALID_ARGUMENT, "%s: argument \"%s\" must be a number",
                         grove__op_label(c), c->def->p[k].name);
  return GROVE_OK;
}

/* math.sqrt / math.log / math.exp of a number (a size: the attention
 * scale 1 / math.sqrt(x.size(-1))): Python's float result; math.floor /
 * math.ceil: Python's int.  true when op has a math.* spelling and
 * argument 0 is a number. */
static bool unary_number(const grove__opctx *c, gval *res, int op) {
  double v;
  int64_t i;
  bool is_int;
  const gval *a = grove__op_val(c, &c->args[0]);
  if ((a && a->kind == V_TENSOR) || !grove__op_number(c, &c->args[0], &v, &i, &is_int))
    return false;
  switch (op) {
    case GROVE__UN_SQRT:
      v = sqrt(v);
      break;
    case GROVE__UN_LOG:
      v = log(v);
      break;
    case GROVE__UN_EXP:
      v = exp(v);
      break;
    case GROVE__UN_FLOOR: /* math.floor / math.ceil: Python's int */
    case GROVE__UN_CEIL:
      v = op == GROVE__UN_FLOOR ? floor(v) : ceil(v);
      if (!(fabs(v) < 9.2e18)) return false; /* the tensor path then names the argument */
      grove__op_set_int(res, (int64_t)v);
      return true;
    case GROVE__UN_ABS: /* abs(n - m) of sizes: an int stays an int */
      if (is_int) {
        grove__op_set_int(res, i < 0 ? -i : i);
        return true;
      }
      v = fabs(v);
      break;
    default:
      return false;
  }
  res->kind = V_FLOAT;
  res->f = v;
  return true;
}

/* One GROVE__UN_* function of argument 0 with numbers a and b. */
static grove_status unary(const grove__opctx *c, gval *res, int op, double a, double b) {
  const grove_tensor *x;
  grove_tensor y;
  if (unary_number(c, res, op)) return GROVE_OK;
  grove_status s = grove__op_tensor(c, 0, &x);
  if (s) return s;
  /* In place when the evaluator says nothing else reads the input. */
  const grove_tensor *into = (c->overwrite & 1u) ? x : NULL;
  if ((s = grove__op_unary(c->f, op, x, a, b, &y, into))) {
    grove_err_prefix(c->f->err, "%s", grove__op_label(c));
    return s;
  }
  grove__op_set_tensor(res, &y);
  return GROVE_OK;
}

#define UNARY0(fn, OP) \
  static grove_status fn(const grove__opctx *c, gval *res) { return unary(c, res, OP, 0, 0); }
UNARY0(relu6_fwd, GROVE__UN_RELU6)
UNARY0(hardswish_fwd, GROVE__UN_HARDSWISH)
UNARY0(hardsigmoid_fwd, GROVE__UN_HARDSIGMOID)
UNARY0(selu_fwd, GROVE__UN_SELU)
UNARY0(mish_fwd, GROVE__UN_MISH)
UNARY0(exp_fwd, GROVE__UN_EXP)
UNARY0(log_fwd, GROVE__UN_LOG)
UNARY0(sqrt_fwd, GROVE__UN_SQRT)
UNARY0(rsqrt_fwd, GROVE__UN_RSQRT)
UNARY0(abs_fwd, GROVE__UN_ABS)
UNARY0(neg_fwd, GROVE__UN_NEG)
UNARY0(sin_fwd, GROVE__UN_SIN)
UNARY0(cos_fwd, GROVE__UN_COS)
UNARY0(erf_fwd, GROVE__UN_ERF)
UNARY0(reciprocal_fwd, GROVE__UN_RECIPROCAL)
UNARY0(log1p_fwd, GROVE__UN_LOG1P)
UNARY0(expm1_fwd, GROVE__UN_EXPM1)
UNARY0(softsign_fwd, GROVE__UN_SOFTSIGN)
UNARY0(logsigmoid_fwd, GROVE__UN_LOGSIGMOID)
UNARY0(floor_fwd, GROVE__UN_FLOOR)
UNARY0(ceil_fwd, GROVE__UN_CEIL)
UNARY0(trunc_fwd, GROVE__UN_TRUNC)
UNARY0(sign_fwd, GROVE__UN_SIGN)
UNARY0(square_fwd, GROVE__UN_SQUARE)
UNARY0(log2_fwd, GROVE__UN_LOG2)
UNARY0(log10_fwd, GROVE__UN_LOG10)
UNARY0(exp2_fwd, GROVE__UN_EXP2)
UNARY0(tan_fwd, GROVE__UN_TAN)
UNARY0(atan_fwd, GROVE__UN_ATAN)
UNARY0(sinh_fwd, GROVE__UN_SINH)
UNARY0(cosh_fwd, GROVE__UN_COSH)
UNARY0(asin_fwd, GROVE__UN_ASIN)
UNARY0(acos_fwd, GROVE__UN_ACOS)
UNARY0(tanhshrink_fwd, GROVE__UN_TANHSHRINK)

/* torch.round(x, decimals) of a tensor; Python's round(n) of a number (a
 * size: round(h * 0.5)), half to even, an int, and round(n, d) a float. */
static grove_status round_fwd(const grove__opctx *c, gval *res) {
  int64_t decimals = 0;
  const gval *a = grove__op_val(c, &c->args[0]);
  double v;
  int64_t i;
  bool is_int;
  grove_status s;
  if (c->args[1].kind != A_NONE && (s = grove__op_int(c, &c->args[1], &decimals))) return s;
  if ((!a || a->kind != V_TENSOR) && grove__op_number(c, &c->args[0], &v, &i, &is_int)) {
    if (c->args[1].kind == A_NONE) {
      if (is_int) {
        grove__op_set_int(res, i);
        return GROVE_OK;
      }
      v = nearbyint(v); /* the default rounding mode: half to even, as Python */
      if (!(fabs(v) < 9.2e18))
        return grove_err_set(c->f->err, GROVE_E_RANGE, "round: cannot convert %g to an integer", v);
      grove__op_set_int(res, (int64_t)v);
      return GROVE_OK;
    }
    const double p = pow(10.0, (double)decimals);
    res->kind = V_FLOAT;
    res->f = nearbyint(v * p) / p;
    return GROVE_OK;
  }
  if (decimals < -30 || decimals > 30) /* 10^31 is beyond float32 */
    return grove_err_set(c->f->err, GROVE_E_INVALID_ARGUMENT,
                         "round: decimals must be in [-30, 30], got %lld", (long long)decimals);
  return unary(c, res, GROVE__UN_ROUND, (double)decimals, 0);
}

static grove_status shrink_fwd(const grove__opctx *c, gval *res) {
  double lambd;
  grove_status s = num_arg(c, 1, 0.5, &lambd);
  if (s) return s;
  if (lambd < 0)
    return grove_err_set(c->f->err, GROVE_E_INVALID_ARGUMENT,
                         "%s: lambda must be greater or equal to 0, but found to be %g",
                         grove__op_label(c), lambd);
  return unary(
      c, res, strcmp(c->def->name, "hardshrink") == 0 ? GROVE__UN_HARDSHRINK : GROVE__UN_SOFTSHRINK,
      lambd, 0);
}

static grove_status threshold_fwd(const grove__opctx *c, gval *res) {
  double th, v;
  grove_status s;
  if ((s = num_arg(c, 1, 0, &th)) || (s = num_arg(c, 2, 0, &v))) return s;
  return unary(c, res, GROVE__UN_THRESHOLD, th, v);
}

/* clamp_min(x, min) and clamp_max(x, max): clamp with one bound. */
static grove_status clamp_one_fwd(const grove__opctx *c, gval *res) {
  double v;
  grove_status s = num_arg(c, 1, 0, &v);
  if (s) return s;
  return strcmp(c->def->name, "clamp_min") == 0 ? unary(c, res, GROVE__UN_CLAMP, v, INFINITY)
                                                : unary(c, res, GROVE__UN_CLAMP, -INFINITY, v);
}

static grove_status hardtanh_fwd(const grove__opctx *c, gval *res) {
  double lo, hi;
  grove_status s;
  if ((s = num_arg(c, 1, -1, &lo)) || (s = num_arg(c, 2, 1, &hi))) return s;
  return unary(c, res, GROVE__UN_HARDTANH, lo, hi);
}

static grove_status clamp_fwd(const grove__opctx *c, gval *res) {
  double lo, hi;
  grove_status s;
  if ((s = num_arg(c, 1, -INFINITY, &lo)) || (s = num_arg(c, 2, INFINITY, &hi))) return s;
  return unary(c, res, GROVE__UN_CLAMP, lo, hi);
}

static grove_status elu_fwd(const grove__opctx *c, gval *res) {
  double alpha;
  grove_status s = num_arg(c, 1, 1, &alpha);
  return s ? s : unary(c, res, GROVE__UN_ELU, alpha, 0);
}

static grove_status celu_fwd(const grove__opctx *c, gval *res) {
  double alpha;
  grove_status s = num_arg(c, 1, 1, &alpha);
  return s ? s : unary(c, res, GROVE__UN_CELU, alpha, 0);
}

static grove_status softplus_fwd(const grove__opctx *c, gval *res) {
  double beta, threshold;
  grove_status s;
  if ((s = num_arg(c, 1, 1, &beta)) || (s = num_arg(c, 2, 20, &threshold))) return s;
  return unary(c, res, GROVE__UN_SOFTPLUS, beta, threshold);
}

/* x ** e.  Two numbers (GPT-2's value.size(-1) ** 0.5, a size): Python's
 * result, an int for a non-negative int power of an int, else a float.  A
 * number base with a tensor exponent (2 ** x, torch.pow(2, x)): the base
 * as a 0-d float32 tensor, broadcast. */
static grove_status pow_fwd(const grove__opctx *c, gval *res) {
  const gval *b = grove__op_val(c, &c->args[0]), *e = grove__op_val(c, &c->args[1]);
  const bool tb = b && b->kind == V_TENSOR, te = e && e->kind == V_TENSOR;
  if (!tb) {
    double xb, xe;
    int64_t ib, ie;
    bool b_int, e_int;
    if (!grove__op_number(c, &c->args[0], &xb, &ib, &b_int))
      return grove__op_want(c, "a tensor or a number for input");
    if (te) {
      float base = (float)xb;
      grove_tensor x, y;
      grove_tensor_init(&x, GROVE_F32, 0, NULL, &base);
      grove_status s = grove__op_pow_tensor(c->f, &x, &e->t[0], &y);
      if (s) return s;
      grove__op_set_tensor(res, &y);
      return GROVE_OK;
    }
    if (!grove__op_number(c, &c->args[1], &xe, &ie, &e_int))
      return grove__op_want(c, "a tensor or a number for exponent");
    if (b_int && e_int && ie >= 0) {
      uint64_t r = 1, m = (uint64_t)ib; /* wraps as int64 would; sizes stay small */
      for (int64_t k = ie; k > 0; k >>= 1, m *= m)
        if (k & 1) r *= m;
      grove__op_set_int(res, (int64_t)r);
      return GROVE_OK;
    }
    res->kind = V_FLOAT;
    res->f = pow(xb, xe);
    return GROVE_OK;
  }
  if (te) {
    const grove_tensor *x;
    grove_tensor y;
    grove_status s;
    if ((s = grove__op_tensor(c, 0, &x)) || (s = grove__op_pow_tensor(c->f, x, &e->t[0], &y)))
      return s;
    grove__op_set_tensor(res, &y);
    return GROVE_OK;
  }
  double ex;
  grove_status s = num_arg(c, 1, 1, &ex);
  return s ? s : unary(c, res, GROVE__UN_POW, ex, 0);
}

/* torch.nan_to_num(x, nan=0.0, posinf=None, neginf=None): NaN, +inf and
 * -inf replaced (an infinity without a number by float32's largest finite
 * value of its sign, as torch); an integer or bool x is itself. */
static grove_status nan_to_num_fwd(const grove__opctx *c, gval *res) {
  const grove_tensor *x;
  grove_tensor xf, y;
  double nan, pinf, ninf;
  grove_status s;
  if ((s = grove__op_tensor(c, 0, &x)) || (s = num_arg(c, 1, 0, &nan)) ||
      (s = num_arg(c, 2, FLT_MAX, &pinf)) || (s = num_arg(c, 3, -FLT_MAX, &ninf)))
    return s;
  if (!grove_dtype_is_float(x->dtype)) {
    grove__op_set_tensor(res, x);
    return GROVE_OK;
  }
  if ((s = grove__contig_f32(c->f, x, &xf)) ||
      (s = grove_fwd_alloc(c->f, &y, GROVE_F32, xf.ndim, xf.shape)))
    return s;
  const float vn = (float)nan, vp = (float)pinf, vm = (float)ninf, *px = xf.data;
  float *py = y.data;
  const int64_t n = grove_tensor_numel(&y);
  for (int64_t i = 0; i < n; i++) {
    const float v = px[i];
    py[i] = isnan(v) ? vn : v == INFINITY ? vp : v == -INFINITY ? vm : v;
  }
  grove__op_set_tensor(res, &y);
  return GROVE_OK;
}

/* The dtype conversions with the dtype in the method's name. */
static grove_status convert(const grove__opctx *c, gval *res, grove_dtype dt) {
  const grove_tensor *x;
  grove_tensor y;
  grove_status s;
  if ((s = grove__op_tensor(c, 0, &x)) || (s = grove__op_to_dtype(c->f, x, dt, &y))) return s;
  grove__op_set_tensor(res, &y);
  return GROVE_OK;
}
static grove_status float_fwd(const grove__opctx *c, gval *res) {
  const gval *a = grove__op_val(c, &c->args[0]);
  double v;
  int64_t i;
  bool is_int;
  if ((!a || a->kind != V_TENSOR) && grove__op_number(c, &c->args[0], &v, &i, &is_int)) {
    res->kind = V_FLOAT; /* float(x.size(-1)) */
    res->f = v;
    return GROVE_OK;
  }
  return convert(c, res, GROVE_F32);
}
/* Python's int() / float() of a number (a size: int(x.shape[-1] ** 0.5)):
 * int toward zero, an infinity or NaN refused as Python refuses it.  Of a
 * tensor, Tensor.int() / Tensor.float(): int64 (Grove's integer dtype, as
 * .to(torch.int32) gives) / float32. */
static grove_status int_fwd(const grove__opctx *c, gval *res) {
  double v;
  int64_t i;
  bool is_int;
  const gval *a = grove__op_val(c, &c->args[0]);
  if (a && a->kind == V_TENSOR) return convert(c, res, GROVE_I64);
  if (!grove__op_number(c, &c->args[0], &v, &i, &is_int))
    return grove__op_want(c, "a number (int() of a size) or a tensor");
  if (!is_int) {
    if (!(fabs(v) < 9.2e18))
      return grove_err_set(c->f->err, GROVE_E_RANGE, "int: cannot convert %g to an integer", v);
    i = (int64_t)v; /* C's conversion truncates toward zero, as Python's int() */
  }
  grove__op_set_int(res, i);
  return GROVE_OK;
}

static grove_status long_fwd(const grove__opctx *c, gval *res) {
  return convert(c, res, GROVE_I64);
}
static grove_status bool_fwd(const grove__opctx *c, gval *res) {
  return convert(c, res, GROVE_BOOL);
}

/* x.type_as(other) (ops_create.c's "to" and "type" take the dtype forms):
 * argument 1 is a dtype name ("float32", "int64", "bool": the exporter writes
 * torch.float32 so), "cpu" (Grove serves on the CPU: the identity), or a
 * tensor whose dtype is taken. */
static grove_status to_fwd(const grove__opctx *c, gval *res) {
  const garg *a = &c->args[1];
  const gval *v = grove__op_val(c, a);
  grove_dtype dt;
  if (v && v->kind == V_TENSOR) {
    dt = v->t[0].dtype;
  } else if (a->kind == A_STR && strcmp(a->s, "cpu") == 0) {
    const grove_tensor *x;
    grove_status s = grove__op_tensor(c, 0, &x);
    if (s) return s;
    grove__op_set_tensor(res, x);
    return GROVE_OK;
  } else if (a->kind != A_STR || !grove_dtype_from_name(a->s, &dt)) {
    return grove_err_set(c->f->err, GROVE_E_UNSUPPORTED,
                         "%s: expected a dtype (\"float32\", \"int64\", \"bool\", ...), \"cpu\" or "
                         "a tensor, got %s%s",
                         c->def->name, a->kind == A_STR ? a->s : "another value",
                         a->kind == A_STR && strncmp(a->s, "cuda", 4) == 0
                             ? " (Grove serves on the CPU)"
                             : "");
  }
  return convert(c, res, dt);
}

static grove_status dim_fwd(const grove__opctx *c, gval *res) {
  const grove_tensor *x;
  grove_status s = grove__op_tensor(c, 0, &x);
  if (s) return s;
  grove__op_set_int(res, x->ndim);
  return GROVE_OK;
}

static grove_status numel_fwd(const grove__opctx *c, gval *res) {
  const grove_tensor *x;
  grove_status s = grove__op_tensor(c, 0, &x);
  if (s) return s;
  grove__op_set_int(res, grove_tensor_numel(x));
  return GROVE_OK;
}

/* torchvision.ops.stochastic_depth(input, p, mode, training): in eval
 * (training False, checked when compiling) it returns its input. */
static grove_status stochastic_depth_fwd(const grove__opctx *c, gval *res) {
  const grove_tensor *x;
  grove_status s = grove__op_tensor(c, 0, &x);
  if (s) return s;
  grove__op_set_tensor(res, x);
  return GROVE_OK;
}

static grove_status prelu_fwd(const grove__opctx *c, gval *res) {
  const grove_tensor *x, *w;
  grove_tensor y;
  grove_status s;
  if ((s = grove__op_tensor(c, 0, &x)) || (s = grove__op_tensor(c, 1, &w)) ||
      (s = grove__op_prelu(c->f, x, w, &y)))
    return s;
  grove__op_set_tensor(res, &y);
  return GROVE_OK;
}

static grove_status stochastic_depth_check(const grove__opdef *d, const garg *a, const char *jp,
                                           grove_err *err) {
  if (a[3].kind != A_BOOL || a[3].i)
    return grove_err_set(err, GROVE_E_UNSUPPORTED,
                         "%s: stochastic_depth with training=True drops rows at random; pass "
                         "training=self.training (Grove serves eval mode)",
                         jp);
  return GROVE_OK;
}

static grove_status nonzero_check(const grove__opdef *d, const garg *a, const char *jp,
                                  grove_err *err) {
  if (a[1].kind == A_FLOAT && a[1].f == 0)
    return grove_err_set(err, GROVE_E_SPEC, "%s: %s's %s must not be 0", jp, d->name,
                         d->p[1].name);
  return GROVE_OK;
}

/* ------------------------------------------------------------ the entries */

GROVE__OP_MODULE_TYPE(grove__relu6_type, "ReLU6");
GROVE__OP_MODULE_TYPE(grove__hardswish_type, "Hardswish");
GROVE__OP_MODULE_TYPE(grove__hardsigmoid_type, "Hardsigmoid");
GROVE__OP_MODULE_TYPE(grove__hardtanh_type, "Hardtanh");
GROVE__OP_MODULE_TYPE(grove__elu_type, "ELU");
GROVE__OP_MODULE_TYPE(grove__selu_type, "SELU");
GROVE__OP_MODULE_TYPE(grove__celu_type, "CELU");
GROVE__OP_MODULE_TYPE(grove__softplus_type, "Softplus");
GROVE__OP_MODULE_TYPE(grove__mish_type, "Mish");

/* An activation with only `inplace`: F.<n>(input, inplace), nn.<cls>(inplace). */
#define ACT_INPLACE(n, CLS, fwd)                                                             \
  const grove__opdef grove__opdef_##n = {                                                    \
      .name = #n,                                                                            \
      .id = G_OP,                                                                            \
      .torch = (const char *const[]){"torch.nn.functional." #n "(input,inplace)", NULL},     \
      .varargs = -1,                                                                         \
      .p = {INPUT, INPLACE},                                                                 \
      .forward = fwd,                                                                        \
      .module = &(const grove__opmod){.cls = CLS, .type = &grove__##n##_type, .args = {INPLACE}}, \
  }

ACT_INPLACE(relu6, "ReLU6", relu6_fwd);
ACT_INPLACE(hardswish, "Hardswish", hardswish_fwd);
ACT_INPLACE(hardsigmoid, "Hardsigmoid", hardsigmoid_fwd);
ACT_INPLACE(mish, "Mish", mish_fwd);

const grove__opdef grove__opdef_selu = {
    .name = "selu",
    .id = G_OP,
    .torch = (const char *const[]){"torch.nn.functional.selu(input,inplace)", "torch.selu(input)",
                                   NULL},
    .varargs = -1,
    .p = {INPUT, INPLACE},
    .forward = selu_fwd,
    .module = &(const grove__opmod){.cls = "SELU", .type = &grove__selu_type, .args = {INPLACE}},
};

const grove__opdef grove__opdef_hardtanh = {
    .name = "hardtanh",
    .id = G_OP,
    .torch = (const char *const[]){"torch.nn.functional.hardtanh(input,min_val,max_val,inplace)",
                                   NULL},
    .varargs = -1,
    .p = {INPUT, FNUM("min_val", -1), FNUM("max_val", 1), INPLACE},
    .forward = hardtanh_fwd,
    .module = &(const grove__opmod){.cls = "Hardtanh",
                                    .type = &grove__hardtanh_type,
                                    .args = {FNUM("min_val", -1), FNUM("max_val", 1), INPLACE}},
};

const grove__opdef grove__opdef_elu = {
    .name = "elu",
    .id = G_OP,
    .torch = (const char *const[]){"torch.nn.functional.elu(input,alpha,inplace)", NULL},
    .varargs = -1,
    .p = {INPUT, FNUM("alpha", 1), INPLACE},
    .forward = elu_fwd,
    .module = &(const grove__opmod){
        .cls = "ELU", .type = &grove__elu_type, .args = {FNUM("alpha", 1), INPLACE}},
};

const grove__opdef grove__opdef_celu = {
    .name = "celu",
    .id = G_OP,
    .torch = (const char *const[]){"torch.nn.functional.celu(input,alpha,inplace)",
                                   "torch.celu(input,alpha)", NULL},
    .varargs = -1,
    .p = {INPUT, FNUM("alpha", 1), INPLACE},
    .check = nonzero_check,
    .forward = celu_fwd,
    .module = &(const grove__opmod){
        .cls = "CELU", .type = &grove__celu_type, .args = {FNUM("alpha", 1), INPLACE}},
};

const grove__opdef grove__opdef_softplus = {
    .name = "softplus",
    .id = G_OP,
    .torch = (const char *const[]){"torch.nn.functional.softplus(input,beta,threshold)", NULL},
    .varargs = -1,
    .p = {INPUT, FNUM("beta", 1), FNUM("threshold", 20)},
    .check = nonzero_check,
    .forward = softplus_fwd,
    .module = &(const grove__opmod){.cls = "Softplus",
                                    .type = &grove__softplus_type,
                                    .args = {FNUM("beta", 1), FNUM("threshold", 20)}},
};

const grove__opdef grove__opdef_clamp = {
    .name = "clamp",
    .alias = "clip",
    .id = G_OP,
    .torch = (const char *const[]){"torch.clamp(input,min,max)", "torch.clip(input,min,max)",
                                   "Tensor.clamp(input,min,max)", "Tensor.clip(input,min,max)",
                                   NULL},
    .varargs = -1,
    .p = {INPUT, OP_NONE("min", P_NUMBER), OP_NONE("max", P_NUMBER)},
    .forward = clamp_fwd,
};

/* A one-input function with torch.<n> and Tensor.<n> spellings. */
#define MATH1(n, fwd)                                                                     \
  const grove__opdef grove__opdef_##n = {                                                 \
      .name = #n,                                                                         \
      .id = G_OP,                                                                         \
      .torch = (const char *const[]){"torch." #n "(input)", "Tensor." #n "(input)", NULL}, \
      .varargs = -1,                                                                      \
      .p = {INPUT},                                                                       \
      .forward = fwd,                                                                     \
  }

/* MATH1 with Python's math.<n> too, on a number (unary_number). */
#define MATH1N(n, fwd)                                                              \
  const grove__opdef grove__opdef_##n = {                                           \
      .name = #n,                                                                   \
      .id = G_OP,                                                                   \
      .torch = (const char *const[]){"torch." #n "(input)", "Tensor." #n "(input)", \
                                     "math." #n "(input)", NULL},                   \
      .varargs = -1,                                                                \
      .p = {OP_REQ("input", P_OPERAND)},                                            \
      .forward = fwd,                                                               \
  }

MATH1N(exp, exp_fwd);
MATH1(sin, sin_fwd);
MATH1(cos, cos_fwd);
MATH1(reciprocal, reciprocal_fwd);
MATH1N(floor, floor_fwd);
MATH1N(ceil, ceil_fwd);
MATH1(sign, sign_fwd);
MATH1(square, square_fwd);
MATH1(log2, log2_fwd);
MATH1(log10, log10_fwd);
MATH1(exp2, exp2_fwd);
MATH1(tan, tan_fwd);
MATH1(atan, atan_fwd);
MATH1(sinh, sinh_fwd);
MATH1(cosh, cosh_fwd);
MATH1(asin, asin_fwd);
MATH1(acos, acos_fwd);

/* The same with torch.special's spelling (and trunc's alias fix). */
#define MATH1S(n, other, fwd)                                                                     \
  const grove__opdef grove__opdef_##n = {                                                         \
      .name = #n,                                                                                 \
      .id = G_OP,                                                                                 \
      .torch = (const char *const[]){"torch." #n "(input)", "Tensor." #n "(input)", other, NULL}, \
      .varargs = -1,                                                                              \
      .p = {INPUT},                                                                               \
      .forward = fwd,                                                                             \
  }
MATH1S(erf, "torch.special.erf(input)", erf_fwd);
MATH1S(log1p, "torch.special.log1p(input)", log1p_fwd);
MATH1S(expm1, "torch.special.expm1(input)", expm1_fwd);
MATH1S(trunc, "torch.fix(input)", trunc_fwd);

const grove__opdef grove__opdef_round = {
    .name = "round",
    .id = G_OP,
    .torch = (const char *const[]){"torch.round(input)", "Tensor.round(input)",
                                   "builtins.round(input,decimals)", NULL},
    .varargs = -1,
    .p = {OP_REQ("input", P_OPERAND), OP_NONE("decimals", P_INT)},
    .forward = round_fwd,
};

#define CLAMP1(n, bound)                                                      \
  const grove__opdef grove__opdef_##n = {                                     \
      .name = #n,                                                             \
      .id = G_OP,                                                             \
      .torch = (const char *const[]){"torch." #n "(input," bound ")",         \
                                     "Tensor." #n "(input," bound ")", NULL}, \
      .varargs = -1,                                                          \
      .p = {INPUT, OP_REQ(bound, P_NUMBER)},                                  \
      .forward = clamp_one_fwd,                                               \
  }
CLAMP1(clamp_min, "min");
CLAMP1(clamp_max, "max");

GROVE__OP_MODULE_TYPE(grove__softsign_type, "Softsign");
GROVE__OP_MODULE_TYPE(grove__logsigmoid_type, "LogSigmoid");

const grove__opdef grove__opdef_softsign = {
    .name = "softsign",
    .id = G_OP,
    .torch = (const char *const[]){"torch.nn.functional.softsign(input)", NULL},
    .varargs = -1,
    .p = {INPUT},
    .forward = softsign_fwd,
    .module =
        &(const grove__opmod){.cls = "Softsign", .type = &grove__softsign_type, .args = {{0}}},
};

GROVE__OP_MODULE_TYPE(grove__tanhshrink_type, "Tanhshrink");
GROVE__OP_MODULE_TYPE(grove__hardshrink_type, "Hardshrink");
GROVE__OP_MODULE_TYPE(grove__softshrink_type, "Softshrink");
GROVE__OP_MODULE_TYPE(grove__threshold_type, "Threshold");

#define LAMBD FNUM("lambd", 0.5)
const grove__opdef grove__opdef_hardshrink = {
    .name = "hardshrink",
    .id = G_OP,
    .torch = (const char *const[]){"torch.nn.functional.hardshrink(input,lambd)",
                                   "Tensor.hardshrink(input,lambd)", NULL},
    .varargs = -1,
    .p = {INPUT, LAMBD},
    .forward = shrink_fwd,
    .module = &(
        const grove__opmod){.cls = "Hardshrink", .type = &grove__hardshrink_type, .args = {LAMBD}},
};

const grove__opdef grove__opdef_softshrink = {
    .name = "softshrink",
    .id = G_OP,
    .torch = (const char *const[]){"torch.nn.functional.softshrink(input,lambd)", NULL},
    .varargs = -1,
    .p = {INPUT, LAMBD},
    .forward = shrink_fwd,
    .module = &(
        const grove__opmod){.cls = "Softshrink", .type = &grove__softshrink_type, .args = {LAMBD}},
};

const grove__opdef grove__opdef_threshold = {
    .name = "threshold",
    .id = G_OP,
    .torch = (const char *const[]){"torch.nn.functional.threshold(input,threshold,value,inplace)",
                                   "torch.threshold(input,threshold,value)", NULL},
    .varargs = -1,
    .p = {INPUT, OP_REQ("threshold", P_NUMBER), OP_REQ("value", P_NUMBER), INPLACE},
    .forward = threshold_fwd,
    .module = &(const grove__opmod){.cls = "Threshold",
                                    .type = &grove__threshold_type,
                                    .args = {FNUM("threshold", 0), FNUM("value", 0), INPLACE}},
};

const grove__opdef grove__opdef_tanhshrink = {
    .name = "tanhshrink",
    .id = G_OP,
    .torch = (const char *const[]){"torch.nn.functional.tanhshrink(input)", NULL},
    .varargs = -1,
    .p = {INPUT},
    .forward = tanhshrink_fwd,
    .module =
        &(const grove__opmod){.cls = "Tanhshrink", .type = &grove__tanhshrink_type, .args = {{0}}},
};

const grove__opdef grove__opdef_logsigmoid = {
    .name = "logsigmoid",
    .id = G_OP,
    .torch = (const char *const[]){"torch.nn.functional.logsigmoid(input)", NULL},
    .varargs = -1,
    .p = {INPUT},
    .forward = logsigmoid_fwd,
    .module =
        &(const grove__opmod){.cls = "LogSigmoid", .type = &grove__logsigmoid_type, .args = {{0}}},
};
MATH1N(log, log_fwd);
MATH1N(sqrt, sqrt_fwd);
MATH1(rsqrt, rsqrt_fwd);

const grove__opdef grove__opdef_abs = {
    .name = "abs",
    .id = G_OP,
    .torch =
        (const char *const[]){"operator.abs(input)", "torch.abs(input)", "Tensor.abs(input)", NULL},
    .varargs = -1,
    .p = {OP_REQ("input", P_OPERAND)},
    .forward = abs_fwd,
};

const grove__opdef grove__opdef_neg = {
    .name = "neg",
    .id = G_OP,
    .torch = (const char *const[]){"operator.neg(input)", "torch.neg(input)", "Tensor.neg(input)",
                                   NULL},
    .varargs = -1,
    .p = {INPUT},
    .forward = neg_fwd,
};

const grove__opdef grove__opdef_int = {
    .name = "int",
    .id = G_OP,
    .torch = (const char *const[]){"builtins.int(input)", "Tensor.int(input)", NULL},
    .varargs = -1,
    .p = {OP_REQ("input", P_OPERAND)},
    .forward = int_fwd,
};

const grove__opdef grove__opdef_nan_to_num = {
    .name = "nan_to_num",
    .id = G_OP,
    .torch = (const char *const[]){"torch.nan_to_num(input,nan,posinf,neginf)",
                                   "Tensor.nan_to_num(input,nan,posinf,neginf)", NULL},
    .varargs = -1,
    .p = {INPUT,
          {.name = "nan", .kind = P_NUMBER, .dk = D_FLOAT, .dv = 0},
          OP_NONE("posinf", P_NUMBER),
          OP_NONE("neginf", P_NUMBER)},
    .forward = nan_to_num_fwd,
};

const grove__opdef grove__opdef_pow = {
    .name = "pow",
    .id = G_OP,
    .torch = (const char *const[]){"operator.pow(input,exponent)", "torch.pow(input,exponent)",
                                   "Tensor.pow(input,exponent)", NULL},
    .varargs = -1,
    .p = {OP_REQ("input", P_OPERAND), OP_REQ("exponent", P_OPERAND)},
    .forward = pow_fwd,
};

#define METHOD0(n, fwd)                                                       \
  const grove__opdef grove__opdef_##n = {                                    \
      .name = #n,                                                            \
      .id = G_OP,                                                            \
      .torch = (const char *const[]){"Tensor." #n "(input)", NULL},          \
      .varargs = -1,                                                         \
      .p = {{.name = "input", .kind = P_TENSOR, .dk = D_REQ, .dtypes = 0}}, \
      .forward = fwd,                                                        \
  }


const grove__opdef grove__opdef_type_as = {
    .name = "type_as",
    .id = G_OP,
    .torch = (const char *const[]){"Tensor.type_as(input,other)", NULL},
    .varargs = -1,
    .p = {{.name = "input", .kind = P_TENSOR, .dk = D_REQ, .dtypes = 0},
          OP_REQ("other", P_TENSOR)},
    .forward = to_fwd,
};

const grove__opdef grove__opdef_float = {
    .name = "float",
    .id = G_OP,
    .torch = (const char *const[]){"Tensor.float(input)", "builtins.float(input)", NULL},
    .varargs = -1,
    .p = {OP_REQ("input", P_OPERAND)},
    .forward = float_fwd,
};
METHOD0(long, long_fwd);
METHOD0(bool, bool_fwd);
METHOD0(dim, dim_fwd);

const grove__opdef grove__opdef_numel = {
    .name = "numel",
    .id = G_OP,
    .torch = (const char *const[]){"torch.numel(input)", "Tensor.numel(input)", NULL},
    .varargs = -1,
    .p = {INPUT},
    .forward = numel_fwd,
};

/* nn.PReLU (a parameter: layers_norm_group.c) runs the same kernel. */
const grove__opdef grove__opdef_prelu = {
    .name = "prelu",
    .id = G_OP,
    .torch = (const char *const[]){"torch.nn.functional.prelu(input,weight)",
                                   "torch.prelu(input,weight)", NULL},
    .varargs = -1,
    .p = {INPUT, OP_REQ("weight", P_TENSOR)},
    .forward = prelu_fwd,
};

const grove__opdef grove__opdef_stochastic_depth = {
    .name = "stochastic_depth",
    .id = G_OP,
    .torch = (const char *const[]){"torchvision.ops.stochastic_depth(input,p,mode,training)",
                                   NULL},
    .varargs = -1,
    .p = {INPUT, {.name = "p", .kind = P_FLOAT, .dk = D_REQ, .min = 0, .max = 1},
          OP_REQ("mode", P_STR), OP_BOOL("training", 1)},
    .check = stochastic_depth_check,
    .forward = stochastic_depth_fwd,
};
