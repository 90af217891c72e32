/* ops_stats.c: the op entries (ops.h) of the norms and statistics users'
 * own models compute in forward: torch.norm / Tensor.norm /
 * torch.linalg.vector_norm, F.normalize, F.cosine_similarity,
 * F.pairwise_distance (with nn.CosineSimilarity and nn.PairwiseDistance,
 * two-input op modules), var and std, logsumexp, torch.outer and F.glu
 * (with nn.GLU).  None has a kernel of its own: each is composed from the
 * pointwise functions (tensor_ops.h), the binary ops and the sum/mean
 * reduction (graph_ops.h) and amax (pick_reduce.c), so that every
 * reduction sums in double the one way mean and sum do. */
#include <math.h>
#include <string.h>

#include "graph_ops.h"
#include "layers_internal.h"
#include "ops.h"
#include "tensor_ops.h"

#define INPUT \
  { .name = "input", .kind = P_TENSOR, .dk = D_REQ }

/* A dims argument: None (*n = -1: every dim), one int or a list. */
static grove_status dims_arg(const grove__opctx *c, int k, int64_t *dims, int *n) {
  *n = -1;
  if (c->args[k].kind == A_NONE) return GROVE_OK;
  const gval *v = grove__op_val(c, &c->args[k]);
  if (v && v->kind == V_NONE) return GROVE_OK;
  return grove__op_ints(c, &c->args[k], true, dims, n);
}

static bool flag(const garg *a, bool dflt) {
  return a->kind == A_BOOL || a->kind == A_INT ? a->i != 0 : dflt;
}

/* A number argument (constant or computed), or dflt for None. */
static grove_status number(const grove__opctx *c, int k, double dflt, double *out) {
  int64_t i;
  bool is_int;
  *out = dflt;
  if (c->args[k].kind == A_NONE) return GROVE_OK;
  if (!grove__op_number(c, &c->args[k], out, &i, &is_int))
    return grove_err_set(c->f->err, GROVE_E_INVALID_ARGUMENT, "%s: argument \"%s\" must be a number",
                         grove__op_label(c), c->def->p[k].name);
  return GROVE_OK;
}

/* ------------------------------------------------------------ p-norms */

/* The p-norm of float32 x over dims (n < 0: all): sum(|x|^p)^(1/p), the
 * sum in double (grove__op_reduce); p = inf / -inf: the max / min of |x|;
 * p = 0: the count of nonzeros; 2 and 1 without pow. */
static grove_status pnorm(grove_fwd *f, const grove_tensor *x, double p, const int64_t *dims,
                          int n, bool keepdim, grove_tensor *out) {
  if (x->dtype != GROVE_F32)
    return grove_err_set(f->err, GROVE_E_DTYPE, "norm: expected a float32 tensor, got %s",
                         grove_dtype_name(x->dtype));
  grove_tensor a, s;
  grove_status st;
  if (p == 2) {
    if ((st = grove__op_unary(f, GROVE__UN_SQUARE, x, 0, 0, &a, NULL)) ||
        (st = grove__op_reduce(f, false, &a, dims, n, keepdim, &s)))
      return st;
    return grove__op_unary(f, GROVE__UN_SQRT, &s, 0, 0, out, &s);
  }
  if ((st = grove__op_unary(f, GROVE__UN_ABS, x, 0, 0, &a, NULL))) return st;
  if (isinf(p))
    return grove__op_amax(f, p > 0 ? GROVE__PICK_MAX : GROVE__PICK_MIN, &a, dims, n, keepdim,
                          out);
  if (p == 1) return grove__op_reduce(f, false, &a, dims, n, keepdim, out);
  if (p == 0) {
    if ((st = grove__op_unary(f, GROVE__UN_SIGN, &a, 0, 0, &a, &a))) return st;
    return grove__op_reduce(f, false, &a, dims, n, keepdim, out);
  }
  if ((st = grove__op_unary(f, GROVE__UN_POW, &a, p, 0, &a, &a)) ||
      (st = grove__op_reduce(f, false, &a, dims, n, keepdim, &s)))
    return st;
  return grove__op_unary(f, GROVE__UN_POW, &s, 1.0 / p, 0, out, &s);
}

/* torch.norm(input, p, dim, keepdim) and linalg.vector_norm(input, ord,
 * dim, keepdim): p a number, inf, or "fro" (2 over the dims). */
static grove_status norm_fwd(const grove__opctx *c, gval *res) {
  const grove_tensor *x;
  grove_tensor y;
  int64_t dims[GROVE_MAX_DIMS];
  int n;
  double p = 2;
  grove_status s;
  const garg *pa = &c->args[1];
  if (pa->kind == A_STR) {
    if (strcmp(pa->s, "fro") != 0)
      return grove_err_set(c->f->err, GROVE_E_UNSUPPORTED,
                           "%s: p=\"%s\" is not supported (a number, inf or \"fro\")", c->def->name,
                           pa->s);
  } else if ((s = number(c, 1, 2, &p))) {
    return s;
  }
  if ((s = grove__op_tensor(c, 0, &x)) || (s = dims_arg(c, 2, dims, &n)) ||
      (s = pnorm(c->f, x, p, dims, n, flag(&c->args[3], false), &y))) {
    grove_err_prefix(c->f->err, "%s", c->def->name);
    return s;
  }
  grove__op_set_tensor(res, &y);
  return GROVE_OK;
}

static grove_status norm_check(const grove__opdef *d, const garg *a, const char *jp,
                               grove_err *err) {
  if (a[4].kind != A_NONE)
    return grove_err_set(err, GROVE_E_UNSUPPORTED, "%s: %s with a dtype is not supported", jp,
                         d->name);
  if (a[1].kind == A_STR && strcmp(a[1].s, "fro") != 0)
    return grove_err_set(err, GROVE_E_UNSUPPORTED,
                         "%s: %s with p=\"%s\" is not supported (a number, inf or \"fro\")", jp,
                         d->name, a[1].s);
  return GROVE_OK;
}

/* F.normalize: x / max(norm(x, p, dim, keepdim), eps), as torch writes it. */
static grove_status normalize_fwd(const grove__opctx *c, gval *res) {
  const grove_tensor *x;
  grove_tensor nrm, y;
  double p, eps;
  int64_t dim;
  grove_status s;
  if ((s = grove__op_tensor(c, 0, &x)) || (s = number(c, 1, 2, &p)) ||
      (s = grove__op_int(c, &c->args[2], &dim)) || (s = number(c, 3, 1e-12, &eps)))
    return s;
  if ((s = pnorm(c->f, x, p, &dim, 1, true, &nrm)) ||
      (s = grove__op_unary(c->f, GROVE__UN_CLAMP, &nrm, eps, INFINITY, &nrm, &nrm)) ||
      (s = grove__op_binary(c->f, GROVE__BIN_DIV, x, &nrm, 1, &y, NULL))) {
    grove_err_prefix(c->f->err, "normalize");
    return s;
  }
  grove__op_set_tensor(res, &y);
  return GROVE_OK;
}

/* Argument k and k + 1 broadcast to one shape (views). */
static grove_status two(const grove__opctx *c, int k, grove_tensor *a, grove_tensor *b) {
  const grove_tensor *x1, *x2;
  grove_status s;
  if ((s = grove__op_tensor(c, k, &x1)) || (s = grove__op_tensor(c, k + 1, &x2))) return s;
  int nd;
  int64_t shape[GROVE_MAX_DIMS];
  if ((s = grove__broadcast_shape(c->f, x1, x2, &nd, shape)) ||
      (s = grove__op_expand(c->f, x1, shape, nd, a)) ||
      (s = grove__op_expand(c->f, x2, shape, nd, b)))
    return s;
  return GROVE_OK;
}

/* F.cosine_similarity(x1, x2, dim, eps): sum(x1 x2) / sqrt(max(sum(x1^2)
 * sum(x2^2), eps^2)) over dim, the inputs broadcast first. */
static grove_status cosine_fwd(const grove__opctx *c, gval *res) {
  grove_tensor a, b, t, w12, w1, w2, y;
  int64_t dim;
  double eps;
  grove_status s;
  if ((s = two(c, 0, &a, &b)) || (s = grove__op_int(c, &c->args[2], &dim)) ||
      (s = number(c, 3, 1e-8, &eps)))
    return s;
  if ((s = grove__op_binary(c->f, GROVE__BIN_MUL, &a, &b, 1, &t, NULL)) ||
      (s = grove__op_reduce(c->f, false, &t, &dim, 1, false, &w12)) ||
      (s = grove__op_unary(c->f, GROVE__UN_SQUARE, &a, 0, 0, &t, NULL)) ||
      (s = grove__op_reduce(c->f, false, &t, &dim, 1, false, &w1)) ||
      (s = grove__op_unary(c->f, GROVE__UN_SQUARE, &b, 0, 0, &t, NULL)) ||
      (s = grove__op_reduce(c->f, false, &t, &dim, 1, false, &w2)) ||
      (s = grove__op_binary(c->f, GROVE__BIN_MUL, &w1, &w2, 1, &t, &w1)) ||
      (s = grove__op_unary(c->f, GROVE__UN_CLAMP, &t, eps * eps, INFINITY, &t, &t)) ||
      (s = grove__op_unary(c->f, GROVE__UN_SQRT, &t, 0, 0, &t, &t)) ||
      (s = grove__op_binary(c->f, GROVE__BIN_DIV, &w12, &t, 1, &y, &w12))) {
    grove_err_prefix(c->f->err, "cosine_similarity");
    return s;
  }
  grove__op_set_tensor(res, &y);
  return GROVE_OK;
}

/* F.pairwise_distance(x1, x2, p, eps, keepdim): norm(x1 - x2 + eps, p) over
 * the last dim, as torch. */
static grove_status pairwise_fwd(const grove__opctx *c, gval *res) {
  grove_tensor a, b, d, y;
  double p, eps;
  grove_status s;
  if ((s = two(c, 0, &a, &b)) || (s = number(c, 2, 2, &p)) || (s = number(c, 3, 1e-6, &eps)))
    return s;
  float e = (float)eps;
  grove_tensor et;
  grove_tensor_init(&et, GROVE_F32, 0, NULL, &e);
  const int64_t last = -1;
  if ((s = grove__op_binary(c->f, GROVE__BIN_SUB, &a, &b, 1, &d, NULL)) ||
      (s = grove__op_binary(c->f, GROVE__BIN_ADD, &d, &et, 1, &d, &d)) ||
      (s = pnorm(c->f, &d, p, &last, 1, flag(&c->args[4], false), &y))) {
    grove_err_prefix(c->f->err, "pairwise_distance");
    return s;
  }
  grove__op_set_tensor(res, &y);
  return GROVE_OK;
}

/* ------------------------------------------------------------ var, std, logsumexp */

/* var / std(input, dim, unbiased, keepdim, correction): mean((x - mean)^2)
 * summed over dims and divided by N - correction (correction: the argument,
 * else 1 when unbiased, as torch; N - correction <= 0 gives inf or NaN, as
 * torch). */
static grove_status var_fwd(const grove__opctx *c, gval *res) {
  const grove_tensor *x;
  grove_tensor m, d, sum, y;
  int64_t dims[GROVE_MAX_DIMS];
  int n;
  grove_status s;
  const garg *a = c->args;
  bool unbiased = flag(&a[2], true);
  if ((s = grove__op_tensor(c, 0, &x))) return s;
  if (a[1].kind == A_BOOL) { /* var(x, False): the old (input, unbiased) form */
    unbiased = a[1].i != 0;
    n = -1;
  } else if ((s = dims_arg(c, 1, dims, &n))) {
    return s;
  }
  double corr = unbiased ? 1 : 0;
  if ((s = number(c, 4, corr, &corr))) return s;
  const bool keepdim = flag(&a[3], false);
  if (x->dtype != GROVE_F32)
    return grove_err_set(c->f->err, GROVE_E_DTYPE, "%s: expected a float32 tensor, got %s",
                         c->def->name, grove_dtype_name(x->dtype));
  if ((s = grove__op_reduce(c->f, true, x, dims, n, true, &m)) ||
      (s = grove__op_binary(c->f, GROVE__BIN_SUB, x, &m, 1, &d, NULL)) ||
      (s = grove__op_unary(c->f, GROVE__UN_SQUARE, &d, 0, 0, &d, &d)) ||
      (s = grove__op_reduce(c->f, false, &d, dims, n, keepdim, &sum))) {
    grove_err_prefix(c->f->err, "%s", c->def->name);
    return s;
  }
  const int64_t cnt = grove_tensor_numel(&sum) ? grove_tensor_numel(x) / grove_tensor_numel(&sum)
                                               : 0;
  float den = (float)((double)cnt - corr);
  if (den < 0) den = 0;
  grove_tensor dt;
  grove_tensor_init(&dt, GROVE_F32, 0, NULL, &den);
  if ((s = grove__op_binary(c->f, GROVE__BIN_DIV, &sum, &dt, 1, &y, &sum))) return s;
  if (strcmp(c->def->name, "std") == 0 &&
      (s = grove__op_unary(c->f, GROVE__UN_SQRT, &y, 0, 0, &y, &y)))
    return s;
  grove__op_set_tensor(res, &y);
  return GROVE_OK;
}

/* logsumexp(input, dim, keepdim): m + log(sum(exp(x - m))), m the max over
 * dims with infinite maxima taken as 0 (so an all -inf row gives -inf, not
 * NaN), as torch. */
static grove_status logsumexp_fwd(const grove__opctx *c, gval *res) {
  const grove_tensor *x;
  grove_tensor m, d, sum, y;
  int64_t dims[GROVE_MAX_DIMS];
  int n;
  grove_status s;
  if ((s = grove__op_tensor(c, 0, &x)) || (s = dims_arg(c, 1, dims, &n))) return s;
  const bool keepdim = flag(&c->args[2], false);
  if (x->dtype != GROVE_F32)
    return grove_err_set(c->f->err, GROVE_E_DTYPE, "logsumexp: expected a float32 tensor, got %s",
                         grove_dtype_name(x->dtype));
  if ((s = grove__op_amax(c->f, GROVE__PICK_MAX, x, dims, n, true, &m))) return s;
  float *mv = m.data; /* a new contiguous arena tensor */
  for (int64_t i = 0; i < grove_tensor_numel(&m); i++)
    if (isinf(mv[i])) mv[i] = 0;
  if ((s = grove__op_binary(c->f, GROVE__BIN_SUB, x, &m, 1, &d, NULL)) ||
      (s = grove__op_unary(c->f, GROVE__UN_EXP, &d, 0, 0, &d, &d)) ||
      (s = grove__op_reduce(c->f, false, &d, dims, n, true, &sum)) ||
      (s = grove__op_unary(c->f, GROVE__UN_LOG, &sum, 0, 0, &sum, &sum)) ||
      (s = grove__op_binary(c->f, GROVE__BIN_ADD, &sum, &m, 1, &y, &sum))) {
    grove_err_prefix(c->f->err, "logsumexp");
    return s;
  }
  if (!keepdim) { /* the reduced dims dropped: the shape sum without keepdim has */
    grove_tensor shape_of;
    if ((s = grove__op_reduce(c->f, false, &m, dims, n, false, &shape_of)) ||
        (s = grove__op_reshape(c->f, &y, shape_of.shape, shape_of.ndim, &y)))
      return s;
  }
  grove__op_set_tensor(res, &y);
  return GROVE_OK;
}

/* ------------------------------------------------------------ outer, glu */

/* torch.outer(a, b): a[:, None] * b[None, :], two 1-d tensors. */
static grove_status outer_fwd(const grove__opctx *c, gval *res) {
  const grove_tensor *a, *b;
  grove_tensor ca, cb, y;
  grove_status s;
  if ((s = grove__op_tensor(c, 0, &a)) || (s = grove__op_tensor(c, 1, &b))) return s;
  if (a->ndim != 1 || b->ndim != 1)
    return grove_err_set(c->f->err, GROVE_E_SHAPE, "outer: expected 1-d tensors, got %d-d and %d-d",
                         a->ndim, b->ndim);
  const int64_t sa[2] = {a->shape[0], 1}, sb[2] = {1, b->shape[0]};
  if ((s = grove__op_reshape(c->f, a, sa, 2, &ca)) || (s = grove__op_reshape(c->f, b, sb, 2, &cb)) ||
      (s = grove__op_binary(c->f, GROVE__BIN_MUL, &ca, &cb, 1, &y, NULL))) {
    grove_err_prefix(c->f->err, "outer");
    return s;
  }
  grove__op_set_tensor(res, &y);
  return GROVE_OK;
}

/* F.glu(x, dim): the first half times the sigmoid of the second along dim. */
static grove_status glu_fwd(const grove__opctx *c, gval *res) {
  const grove_tensor *x;
  grove_tensor a, b, src, g, y;
  int64_t dim64;
  int dim;
  grove_status s;
  if ((s = grove__op_tensor(c, 0, &x)) || (s = grove__op_int(c, &c->args[1], &dim64))) return s;
  if (!grove__op_wrap_dim(dim64, x->ndim, &dim) || x->ndim == 0)
    return grove__op_dim_error(c->f, grove__op_label(c), "dim", dim64, x->ndim);
  const int64_t len = x->shape[dim];
  if (len % 2)
    return grove_err_set(c->f->err, GROVE_E_SHAPE,
                         "%s: halving dimension must be even, but dimension %d is size %lld",
                         grove__op_label(c), dim, (long long)len);
  if (x->dtype != GROVE_F32)
    return grove_err_set(c->f->err, GROVE_E_DTYPE, "%s: expected a float32 tensor, got %s",
                         grove__op_label(c), grove_dtype_name(x->dtype));
  if ((s = grove__op_narrow(c->f, x, dim, 0, len / 2, &a)) ||
      (s = grove__op_narrow(c->f, x, dim, len / 2, len / 2, &b)) ||
      (s = grove__fwd_contig(c->f, &b, &src)) ||
      (s = grove_fwd_alloc(c->f, &g, GROVE_F32, b.ndim, b.shape)))
    return s;
  grove__elementwise(GROVE__ELT_SIGMOID, 0, src.data, g.data, grove_tensor_numel(&g));
  if ((s = grove__op_binary(c->f, GROVE__BIN_MUL, &a, &g, 1, &y, &g))) return s;
  grove__op_set_tensor(res, &y);
  return GROVE_OK;
}

/* ------------------------------------------------------------ the entries */

#define NORM_TAIL OP_NONE("dim", P_INTS), OP_BOOL("keepdim", 0), OP_NONE("dtype", P_DTYPE)

const grove__opdef grove__opdef_norm = {
    .name = "norm",
    .id = G_OP,
    .torch = (const char *const[]){"torch.norm(input,p,dim,keepdim,out,dtype)",
                                   "Tensor.norm(input,p,dim,keepdim,dtype)", NULL},
    .varargs = -1,
    .p = {INPUT, {.name = "p", .kind = P_ANY, .dk = D_STR, .ds = "fro"}, NORM_TAIL,
          {.name = "out", .kind = P_IGNORED, .dk = D_NONE}},
    .check = norm_check,
    .forward = norm_fwd,
};

const grove__opdef grove__opdef_vector_norm = {
    .name = "vector_norm",
    .id = G_OP,
    .torch = (const char *const[]){"torch.linalg.vector_norm(input,ord,dim,keepdim,dtype)", NULL},
    .varargs = -1,
    .p = {INPUT, {.name = "ord", .kind = P_NUMBER, .dk = D_FLOAT, .dv = 2}, NORM_TAIL},
    .check = norm_check,
    .forward = norm_fwd,
};

const grove__opdef grove__opdef_normalize = {
    .name = "normalize",
    .id = G_OP,
    .torch = (const char *const[]){"torch.nn.functional.normalize(input,p,dim,eps,out)", NULL},
    .varargs = -1,
    .p = {INPUT,
          {.name = "p", .kind = P_NUMBER, .dk = D_FLOAT, .dv = 2},
          OP_INT("dim", 1),
          {.name = "eps", .kind = P_NUMBER, .dk = D_FLOAT, .dv = 1e-12},
          {.name = "out", .kind = P_IGNORED, .dk = D_NONE}},
    .forward = normalize_fwd,
};

GROVE__OP_MODULE_TYPE(grove__cosine_similarity_type, "CosineSimilarity");
GROVE__OP_MODULE_TYPE(grove__pairwise_distance_type, "PairwiseDistance");
GROVE__OP_MODULE_TYPE(grove__glu_type, "GLU");

#define X12 OP_REQ("x1", P_TENSOR), OP_REQ("x2", P_TENSOR)
#define DIM_ARG(v) \
  { .name = "dim", .kind = P_INT, .dk = D_INT, .dv = v, .min = -GROVE_MAX_DIMS, .max = GROVE_MAX_DIMS - 1 }
#define EPS_ARG(v) \
  { .name = "eps", .kind = P_FLOAT, .dk = D_FLOAT, .dv = v, .min = 0, .max = INFINITY }
#define P_ARG \
  { .name = "p", .kind = P_FLOAT, .dk = D_FLOAT, .dv = 2, .min = -INFINITY, .max = INFINITY }

const grove__opdef grove__opdef_cosine_similarity = {
    .name = "cosine_similarity",
    .id = G_OP,
    .torch = (const char *const[]){"torch.nn.functional.cosine_similarity(x1,x2,dim,eps)", NULL},
    .varargs = -1,
    .p = {X12, DIM_ARG(1), EPS_ARG(1e-8)},
    .forward = cosine_fwd,
    .module = &(const grove__opmod){.cls = "CosineSimilarity",
                                    .type = &grove__cosine_similarity_type,
                                    .args = {DIM_ARG(1), EPS_ARG(1e-8)},
                                    .inputs = 2},
};

const grove__opdef grove__opdef_pairwise_distance = {
    .name = "pairwise_distance",
    .id = G_OP,
    .torch = (const char *const[]){"torch.nn.functional.pairwise_distance(x1,x2,p,eps,keepdim)",
                                   NULL},
    .varargs = -1,
    .p = {X12, P_ARG, EPS_ARG(1e-6), OP_BOOL("keepdim", 0)},
    .forward = pairwise_fwd,
    .module = &(const grove__opmod){.cls = "PairwiseDistance",
                                    .type = &grove__pairwise_distance_type,
                                    .args = {{.name = "p", .key = "norm", .kind = P_FLOAT,
                                              .dk = D_FLOAT, .dv = 2, .min = -INFINITY,
                                              .max = INFINITY},
                                             EPS_ARG(1e-6), OP_BOOL("keepdim", 0)},
                                    .inputs = 2},
};

#define VAR_OP(n)                                                                             \
  const grove__opdef grove__opdef_##n = {                                                     \
      .name = #n,                                                                             \
      .id = G_OP,                                                                             \
      .torch = (const char *const[]){"torch." #n "(input,dim,unbiased,keepdim)",              \
                                     "Tensor." #n "(input,dim,unbiased,keepdim)", NULL},      \
      .varargs = -1,                                                                          \
      .p = {INPUT, {.name = "dim", .kind = P_ANY, .dk = D_NONE}, OP_NONE("unbiased", P_BOOL), \
            OP_BOOL("keepdim", 0), OP_NONE("correction", P_NUMBER)},                          \
      .forward = var_fwd,                                                                     \
  }
VAR_OP(var);
VAR_OP(std);

const grove__opdef grove__opdef_logsumexp = {
    .name = "logsumexp",
    .id = G_OP,
    .torch = (const char *const[]){"torch.logsumexp(input,dim,keepdim)",
                                   "Tensor.logsumexp(input,dim,keepdim)", NULL},
    .varargs = -1,
    .p = {INPUT, OP_REQ("dim", P_INTS), OP_BOOL("keepdim", 0)},
    .forward = logsumexp_fwd,
};

const grove__opdef grove__opdef_outer = {
    .name = "outer",
    .alias = "ger",
    .id = G_OP,
    .torch = (const char *const[]){"torch.outer(input,vec2)", "Tensor.outer(input,vec2)",
                                   "torch.ger(input,vec2)", "Tensor.ger(input,vec2)", NULL},
    .varargs = -1,
    .p = {INPUT, OP_REQ("vec2", P_TENSOR)},
    .forward = outer_fwd,
};

const grove__opdef grove__opdef_glu = {
    .name = "glu",
    .id = G_OP,
    .torch = (const char *const[]){"torch.nn.functional.glu(input,dim)", NULL},
    .varargs = -1,
    .p = {INPUT, DIM_ARG(-1)},
    .forward = glu_fwd,
    .module = &(const grove__opmod){.cls = "GLU", .type = &grove__glu_type, .args = {DIM_ARG(-1)}},
};
