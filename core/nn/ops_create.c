/* ops_create.c: the tensors a graph makes rather than transforms, as op
 * table entries (ops.h): torch.full, zeros, ones and arange (their sizes may
 * be traced: x.size(1)), the triangles triu / tril, cumsum, and the casts
 * Tensor.to(dtype) / Tensor.type(dtype).  Sequence models build their masks with them:
 * nn.Transformer.generate_square_subsequent_mask(t) is
 * torch.triu(torch.full((t, t), -inf), diagonal=1), a HuggingFace causal
 * mask a tril of ones, position ids an arange or a cumsum, an attention
 * mask turned float by Tensor.to(torch.float32).
 *
 * Float results are float32 (Grove computes in float32, docs/model-spec.md);
 * integer ones int64, as torch makes them by default; bool stays bool. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "graph_ops.h"
#include "ops.h"
#include "tensor_ops.h"

#define INPUT OP_REQ("input", P_TENSOR)
#define IGNORED(n) \
  { .name = n, .kind = P_IGNORED, .dk = D_NONE }
#define DTYPE OP_NONE("dtype", P_DTYPE)

/* The largest tensor a graph may make (elements): far above any mask, far
 * below what would overflow a byte count. */
#define MAX_MADE ((int64_t)1 << 36)

/* The dtype a made tensor gets: the dtype argument k (a constant name) or,
 * when it is None, dflt.  Float names give float32. */
static grove_status dtype_arg(const grove__opctx *c, int k, grove_dtype dflt, grove_dtype *out) {
  const garg *a = &c->args[k];
  const gval *v = grove__op_val(c, a);
  *out = dflt;
  if (a->kind == A_NONE) return GROVE_OK;
  grove_dtype dt = GROVE_F32;
  if (v && v->kind == V_DTYPE) /* dtype=x.dtype */
    dt = (grove_dtype)v->i;
  else if (a->kind != A_STR || !grove_dtype_from_name(a->s, &dt))
    return grove_err_set(c->f->err, GROVE_E_INVALID_ARGUMENT, "%s: dtype must be a dtype name",
                         c->def->name);
  if (grove_dtype_is_float(dt)) dt = GROVE_F32;
  if (dt == GROVE_I32 || dt == GROVE_I16 || dt == GROVE_I8) dt = GROVE_I64;
  if (dt != GROVE_F32 && dt != GROVE_I64 && dt != GROVE_BOOL && dt != GROVE_U8)
    return grove_err_set(c->f->err, GROVE_E_UNSUPPORTED, "%s: dtype %s is not supported",
                         c->def->name, grove_dtype_name(dt));
  *out = dt;
  return GROVE_OK;
}

/* Element i of a contiguous tensor as a double / as an int64. */
static double get_f(const grove_tensor *t, int64_t i) {
  switch (t->dtype) {
    case GROVE_F32:
      return ((const float *)t->data)[i];
    case GROVE_F64:
      return ((const double *)t->data)[i];
    case GROVE_I64:
      return (double)((const int64_t *)t->data)[i];
    case GROVE_I32:
      return ((const int32_t *)t->data)[i];
    default:
      return ((const uint8_t *)t->data)[i];
  }
}

static int64_t get_i(const grove_tensor *t, int64_t i) {
  switch (t->dtype) {
    case GROVE_F32:
      return (int64_t)((const float *)t->data)[i]; /* torch: toward zero */
    case GROVE_F64:
      return (int64_t)((const double *)t->data)[i];
    case GROVE_I64:
      return ((const int64_t *)t->data)[i];
    case GROVE_I32:
      return ((const int32_t *)t->data)[i];
    default:
      return ((const uint8_t *)t->data)[i];
  }
}

static void put(grove_tensor *t, int64_t i, double f, int64_t v) {
  switch (t->dtype) {
    case GROVE_F32:
      ((float *)t->data)[i] = (float)f;
      break;
    case GROVE_I64:
      ((int64_t *)t->data)[i] = v;
      break;
    default:
      ((uint8_t *)t->data)[i] = v != 0 || f != 0;
      break;
  }
}

static bool readable(grove_dtype dt) {
  return dt == GROVE_F32 || dt == GROVE_F64 || dt == GROVE_I64 || dt == GROVE_I32 ||
         dt == GROVE_U8 || dt == GROVE_BOOL;
}

/* A contiguous copy of x in its own dtype (x itself when contiguous). */
static grove_status contig(const grove__opctx *c, const grove_tensor *x, grove_tensor *out) {
  if (!readable(x->dtype))
    return grove_err_set(c->f->err, GROVE_E_DTYPE, "%s: a %s input is not supported", c->def->name,
                         grove_dtype_name(x->dtype));
  if (grove_tensor_is_contiguous(x)) {
    *out = *x;
    return GROVE_OK;
  }
  grove_status s = grove_fwd_alloc(c->f, out, x->dtype, x->ndim, x->shape);
  return s ? s : grove_tensor_copy(out, x, c->f->err);
}

static grove_status make(const grove__opctx *c, grove_dtype dt, int nd, const int64_t *shape,
                         grove_tensor *y) {
  int64_t n = 1;
  for (int i = 0; i < nd; i++) {
    if (shape[i] < 0)
      return grove_err_set(c->f->err, GROVE_E_SHAPE, "%s: negative dimension %lld", c->def->name,
                           (long long)shape[i]);
    if (shape[i] && n > MAX_MADE / shape[i])
      return grove_err_set(c->f->err, GROVE_E_LIMIT, "%s: more than 2^36 elements", c->def->name);
    n *= shape[i];
  }
  return grove_fwd_alloc(c->f, y, dt, nd, shape);
}

/* ------------------------------------------------------------ full, zeros, ones */

/* The dtype a tensor made like x gets by default (zeros_like, new_zeros):
 * x's, as torch, within the dtypes a graph makes (floats are float32). */
static grove_dtype like_dtype(const grove_tensor *x) {
  if (grove_dtype_is_float(x->dtype)) return GROVE_F32;
  if (x->dtype == GROVE_BOOL || x->dtype == GROVE_U8) return x->dtype;
  return GROVE_I64;
}

/* A tensor of the sizes argument size_arg (size_arg < 0: like's shape)
 * filled with value, of the dtype argument dtype_arg_k or by default like's
 * dtype (like not NULL: the _like and new_ forms) or value's. */
static grove_status fill_fwd(const grove__opctx *c, int size_arg, const garg *value,
                             int dtype_arg_k, const grove_tensor *like, gval *res) {
  int64_t shape[GROVE_MAX_DIMS];
  int nd;
  double v;
  int64_t iv;
  bool is_int;
  grove_status s = GROVE_OK;
  if (size_arg < 0) {
    nd = like->ndim;
    memcpy(shape, like->shape, (size_t)nd * sizeof(int64_t));
  } else {
    /* zeros(2, 3), zeros((2, 3)) and zeros(x.size()): the gathered list may
     * hold the one sequence. */
    const garg *sz = &c->args[size_arg];
    if (sz->kind == A_LIST && sz->n == 1) {
      const gval *sv = grove__op_val(c, &sz->items[0]);
      if ((sv && sv->kind == V_INTS) || sz->items[0].kind == A_LIST) sz = &sz->items[0];
    }
    if ((s = grove__op_ints(c, sz, true, shape, &nd))) return s;
  }
  if (!grove__op_number(c, value, &v, &iv, &is_int))
    return grove__op_want(c, "a number for fill_value");
  const bool is_bool = value->kind == A_BOOL;
  grove_dtype dt;
  const grove_dtype dflt = like      ? like_dtype(like)
                           : is_bool ? GROVE_BOOL
                           : is_int  ? GROVE_I64
                                     : GROVE_F32;
  if ((s = dtype_arg(c, dtype_arg_k, dflt, &dt))) return s;
  grove_tensor y;
  if ((s = make(c, dt, nd, shape, &y))) return s;
  const int64_t n = grove_tensor_numel(&y);
  if (dt == GROVE_F32) {
    float *d = y.data;
    for (int64_t i = 0; i < n; i++) d[i] = (float)v;
  } else {
    for (int64_t i = 0; i < n; i++) put(&y, i, v, is_int ? iv : (int64_t)v);
  }
  grove__op_set_tensor(res, &y);
  return GROVE_OK;
}

static grove_status full_fwd(const grove__opctx *c, gval *res) {
  return fill_fwd(c, 0, &c->args[1], 2, NULL, res);
}

static grove_status zeros_ones_fwd(const grove__opctx *c, gval *res) {
  /* torch.zeros / ones default to float32 whatever the sizes' type. */
  const garg one = {.kind = A_FLOAT, .f = strcmp(c->def->name, "ones") == 0 ? 1.0 : 0.0};
  return fill_fwd(c, 0, &one, 1, NULL, res);
}

/* zeros_like, ones_like, empty_like (zeros: Grove has no uninitialised
 * memory to hand out, and a model that reads it is wrong either way),
 * full_like; new_zeros, new_ones, new_empty, new_full.  The name says
 * which: a "_like" form takes input's shape, a "new_" form its size
 * argument (1); both default to input's dtype. */
static grove_status like_fwd(const grove__opctx *c, gval *res) {
  const char *n = c->def->name;
  const bool like = strncmp(n, "new_", 4) != 0, full = strstr(n, "full") != NULL;
  const garg one = {.kind = A_FLOAT, .f = strstr(n, "ones") ? 1.0 : 0.0};
  const grove_tensor *x;
  grove_status s = grove__op_tensor(c, 0, &x);
  if (s) return s;
  /* _like: (input, [fill_value,] dtype, ...); new_: (input, size, [fill_value,] dtype, ...) */
  const int size_k = like ? -1 : 1, fill_k = like ? 1 : 2;
  return fill_fwd(c, size_k, full ? &c->args[fill_k] : &one, fill_k + (full ? 1 : 0), x, res);
}

/* The shape of new_tensor's data (nested lists of numbers), rectangular. */
static grove_status data_shape(const grove__opctx *c, const garg *a, int depth, int64_t *shape,
                               int *nd) {
  if (a->kind != A_LIST) {
    if (*nd < 0) *nd = depth;
    if (*nd != depth) return grove__op_want(c, "data of nested lists of one length per level");
    return GROVE_OK;
  }
  if (depth >= GROVE_MAX_DIMS) return grove__op_want(c, "data nested at most 8 deep");
  if (*nd >= 0 && (depth >= *nd || shape[depth] != a->n))
    return grove__op_want(c, "data of nested lists of one length per level");
  if (*nd < 0 && a->n == 0) *nd = depth + 1;
  shape[depth] = a->n;
  for (int i = 0; i < a->n; i++) {
    grove_status s = data_shape(c, &a->items[i], depth + 1, shape, nd);
    if (s) return s;
  }
  return GROVE_OK;
}

/* Writes data's numbers (leaves, in order) into y from *at. */
static grove_status data_put(const grove__opctx *c, const garg *a, grove_tensor *y, int64_t *at) {
  if (a->kind == A_LIST) {
    for (int i = 0; i < a->n; i++) {
      grove_status s = data_put(c, &a->items[i], y, at);
      if (s) return s;
    }
    return GROVE_OK;
  }
  double v;
  int64_t iv;
  bool is_int;
  if (!grove__op_number(c, a, &v, &iv, &is_int)) return grove__op_want(c, "numbers in data");
  put(y, (*at)++, v, is_int ? iv : (int64_t)v);
  return GROVE_OK;
}

/* The dtype torch.tensor(data) infers: float32 when a number is a float,
 * bool when all are bools, else int64. */
static void data_dtype(const grove__opctx *c, const garg *a, bool *any_float, bool *all_bool) {
  if (a->kind == A_LIST) {
    for (int i = 0; i < a->n; i++) data_dtype(c, &a->items[i], any_float, all_bool);
    return;
  }
  double v;
  int64_t iv;
  bool is_int = true;
  if (a->kind != A_BOOL) *all_bool = false;
  if (grove__op_number(c, a, &v, &iv, &is_int) && !is_int) *any_float = true;
}

/* Argument k_data (a number or nested lists of numbers, constant or
 * computed sizes) as a tensor of the dtype argument k_dtype or by default
 * like's (x.new_tensor) or the data's (torch.tensor, like NULL). */
static grove_status from_data(const grove__opctx *c, int k_data, int k_dtype,
                              const grove_tensor *like, gval *res) {
  int64_t shape[GROVE_MAX_DIMS] = {0};
  int nd = -1;
  grove_dtype dt, dflt = GROVE_F32;
  grove_tensor y;
  grove_status s;
  if (like) {
    dflt = like_dtype(like);
  } else {
    bool any_float = false, all_bool = true;
    data_dtype(c, &c->args[k_data], &any_float, &all_bool);
    dflt = any_float ? GROVE_F32 : all_bool ? GROVE_BOOL : GROVE_I64;
  }
  if ((s = data_shape(c, &c->args[k_data], 0, shape, &nd)) ||
      (s = dtype_arg(c, k_dtype, dflt, &dt)) || (s = make(c, dt, nd, shape, &y)))
    return s;
  int64_t at = 0;
  if ((s = data_put(c, &c->args[k_data], &y, &at))) return s;
  grove__op_set_tensor(res, &y);
  return GROVE_OK;
}

/* x.new_tensor(data): x's dtype unless dtype says another. */
static grove_status new_tensor_fwd(const grove__opctx *c, gval *res) {
  const grove_tensor *x;
  grove_status s = grove__op_tensor(c, 0, &x);
  return s ? s : from_data(c, 1, 2, x, res);
}

/* torch.tensor(data): a constant made in forward (a scale, a small table),
 * or one of traced sizes (torch.tensor(x.size(1))). */
static grove_status tensor_fwd(const grove__opctx *c, gval *res) {
  return from_data(c, 0, 1, NULL, res);
}

#define LIKE_TAIL DTYPE, IGNORED("layout"), IGNORED("device"), IGNORED("requires_grad")
#define LIKE_OP(n, ...)                                                              \
  const grove__opdef grove__opdef_##n = {                                            \
      .name = #n,                                                                    \
      .id = G_OP,                                                                    \
      .torch = (const char *const[]){"torch." #n, NULL},                             \
      .varargs = -1,                                                                 \
      .p = {OP_REQ("input", P_TENSOR), __VA_ARGS__ LIKE_TAIL, IGNORED("pin_memory"), \
            IGNORED("memory_format")},                                               \
      .forward = like_fwd,                                                           \
  }
LIKE_OP(zeros_like, );
LIKE_OP(ones_like, );
LIKE_OP(empty_like, );
LIKE_OP(full_like, OP_REQ("fill_value", P_NUMBER), );

/* Tensor.new_zeros(*size) and new_ones, new_empty; new_full(size, fill_value). */
#define NEW_OP(n, spelling, va, ...)                                                  \
  const grove__opdef grove__opdef_##n = {                                             \
      .name = #n,                                                                     \
      .id = G_OP,                                                                     \
      .torch = (const char *const[]){spelling, NULL},                                 \
      .varargs = va,                                                                  \
      .p = {OP_REQ("input", P_TENSOR), OP_REQ("size", P_INTS), __VA_ARGS__ LIKE_TAIL, \
            IGNORED("pin_memory")},                                                   \
      .forward = like_fwd,                                                            \
  }
NEW_OP(new_zeros, "Tensor.new_zeros(input,*size)", 1, );
NEW_OP(new_ones, "Tensor.new_ones(input,*size)", 1, );
NEW_OP(new_empty, "Tensor.new_empty(input,*size)", 1, );
NEW_OP(new_full, "Tensor.new_full(input,size,fill_value)", -1, OP_REQ("fill_value", P_NUMBER), );

const grove__opdef grove__opdef_tensor = {
    .name = "tensor",
    .id = G_OP,
    .torch = (const char *const[]){"torch.tensor(data)", NULL},
    .varargs = -1,
    .p = {OP_REQ("data", P_ANY), LIKE_TAIL, IGNORED("pin_memory")},
    .forward = tensor_fwd,
};

const grove__opdef grove__opdef_new_tensor = {
    .name = "new_tensor",
    .id = G_OP,
    .torch = (const char *const[]){"Tensor.new_tensor(input,data)", NULL},
    .varargs = -1,
    .p = {OP_REQ("input", P_TENSOR), OP_REQ("data", P_ANY), LIKE_TAIL, IGNORED("pin_memory")},
    .forward = new_tensor_fwd,
};

const grove__opdef grove__opdef_full = {
    .name = "full",
    .id = G_OP,
    .torch = (const char *const[]){"torch.full(size,fill_value)", NULL},
    .varargs = -1,
    .p = {OP_REQ("size", P_INTS), OP_REQ("fill_value", P_NUMBER), DTYPE, IGNORED("layout"),
          IGNORED("device"), IGNORED("pin_memory"), IGNORED("requires_grad")},
    .forward = full_fwd,
};

const grove__opdef grove__opdef_zeros = {
    .name = "zeros",
    .id = G_OP,
    .torch = (const char *const[]){"torch.zeros(*size)", NULL},
    .varargs = 0,
    .p = {OP_REQ("size", P_INTS), DTYPE, IGNORED("layout"), IGNORED("device"),
          IGNORED("pin_memory"), IGNORED("requires_grad")},
    .forward = zeros_ones_fwd,
};

const grove__opdef grove__opdef_ones = {
    .name = "ones",
    .id = G_OP,
    .torch = (const char *const[]){"torch.ones(*size)", NULL},
    .varargs = 0,
    .p = {OP_REQ("size", P_INTS), DTYPE, IGNORED("layout"), IGNORED("device"),
          IGNORED("pin_memory"), IGNORED("requires_grad")},
    .forward = zeros_ones_fwd,
};

/* ------------------------------------------------------------ arange */

/* torch.arange(end), (start, end) or (start, end, step): int64 when every
 * bound is an integer, else float32; ceil((end - start) / step) values. */
static grove_status arange_fwd(const grove__opctx *c, gval *res) {
  double a, b, st = 1;
  int64_t ia, ib, ist = 1;
  bool ai, bi, si = true;
  if (!grove__op_number(c, &c->args[0], &a, &ia, &ai)) return grove__op_want(c, "a number (start)");
  if (c->args[1].kind == A_NONE) {
    b = a, ib = ia, bi = ai;
    a = 0, ia = 0, ai = true;
  } else if (!grove__op_number(c, &c->args[1], &b, &ib, &bi)) {
    return grove__op_want(c, "a number (end)");
  }
  if (!grove__op_number(c, &c->args[2], &st, &ist, &si))
    return grove__op_want(c, "a number (step)");
  if (st == 0)
    return grove_err_set(c->f->err, GROVE_E_INVALID_ARGUMENT, "arange: step must be nonzero");
  if ((st > 0 && b < a) || (st < 0 && b > a))
    return grove_err_set(c->f->err, GROVE_E_INVALID_ARGUMENT,
                         "arange: upper bound and larger bound inconsistent with step sign");
  const bool ints = ai && bi && si;
  grove_dtype dt;
  grove_status s = dtype_arg(c, 3, ints ? GROVE_I64 : GROVE_F32, &dt);
  if (s) return s;
  const double len = ceil((b - a) / st);
  if (!(len < (double)MAX_MADE))
    return grove_err_set(c->f->err, GROVE_E_LIMIT, "arange: more than 2^36 elements");
  const int64_t n = (int64_t)len;
  grove_tensor y;
  if ((s = make(c, dt, 1, &n, &y))) return s;
  for (int64_t i = 0; i < n; i++) {
    if (ints)
      put(&y, i, (double)(ia + i * ist), ia + i * ist);
    else
      put(&y, i, a + (double)i * st, (int64_t)(a + (double)i * st));
  }
  grove__op_set_tensor(res, &y);
  return GROVE_OK;
}

const grove__opdef grove__opdef_arange = {
    .name = "arange",
    .id = G_OP,
    .torch = (const char *const[]){"torch.arange(start,end,step)", NULL},
    .varargs = -1,
    .p = {OP_REQ("start", P_NUMBER),
          OP_NONE("end", P_NUMBER),
          {.name = "step", .kind = P_NUMBER, .dk = D_INT, .dv = 1},
          DTYPE,
          IGNORED("layout"),
          IGNORED("device"),
          IGNORED("pin_memory"),
          IGNORED("requires_grad")},
    .forward = arange_fwd,
};

/* ------------------------------------------------------------ triu, tril */

static grove_status tri_fwd(const grove__opctx *c, gval *res) {
  const bool upper = strcmp(c->def->name, "triu") == 0;
  const grove_tensor *x;
  int64_t diag;
  grove_status s;
  if ((s = grove__op_tensor(c, 0, &x)) || (s = grove__op_int(c, &c->args[1], &diag))) return s;
  if (x->ndim < 2)
    return grove_err_set(c->f->err, GROVE_E_SHAPE,
                         "%s: input tensor must have at least 2 dimensions", c->def->name);
  if (!readable(x->dtype))
    return grove_err_set(c->f->err, GROVE_E_DTYPE, "%s: a %s input is not supported", c->def->name,
                         grove_dtype_name(x->dtype));
  grove_tensor y;
  if ((s = grove_fwd_alloc(c->f, &y, x->dtype, x->ndim, x->shape)) ||
      (s = grove_tensor_copy(&y, x, c->f->err)))
    return s;
  const int64_t R = x->shape[x->ndim - 2], C = x->shape[x->ndim - 1];
  const int64_t mats = (R > 0 && C > 0) ? grove_tensor_numel(&y) / (R * C) : 0;
  const size_t es = grove_dtype_size(y.dtype);
  char *d = y.data;
  for (int64_t m = 0; m < mats; m++)
    for (int64_t i = 0; i < R; i++) {
      /* triu keeps j - i >= diag, tril keeps j - i <= diag. */
      int64_t lo = upper ? 0 : i + diag + 1, hi = upper ? i + diag : C;
      if (lo < 0) lo = 0;
      if (hi > C) hi = C;
      if (hi > lo) memset(d + ((m * R + i) * C + lo) * es, 0, (size_t)(hi - lo) * es);
    }
  grove__op_set_tensor(res, &y);
  return GROVE_OK;
}

const grove__opdef grove__opdef_triu = {
    .name = "triu",
    .id = G_OP,
    .torch =
        (const char *const[]){"torch.triu(input,diagonal)", "Tensor.triu(input,diagonal)", NULL},
    .varargs = -1,
    .p = {INPUT, OP_INT("diagonal", 0)},
    .forward = tri_fwd,
};

const grove__opdef grove__opdef_tril = {
    .name = "tril",
    .id = G_OP,
    .torch =
        (const char *const[]){"torch.tril(input,diagonal)", "Tensor.tril(input,diagonal)", NULL},
    .varargs = -1,
    .p = {INPUT, OP_INT("diagonal", 0)},
    .forward = tri_fwd,
};

/* ------------------------------------------------------------ cumsum, cumprod, prod */

enum { SCAN_CUMSUM, SCAN_CUMPROD, SCAN_PROD };

/* The running sum or product along dim, in double (float) or int64
 * (integers and bool, which torch promotes to int64; the product wraps as
 * int64 does, computed unsigned).  prod is the running product's last
 * element: over dim (keepdim or not), or over every element (dim None,
 * a 0-d result). */
static grove_status scan(const grove__opctx *c, gval *res, int mode) {
  const char *name = c->def->name;
  const grove_tensor *x0;
  grove_tensor x, y;
  int64_t d64 = 0;
  int dim = 0;
  grove_status s;
  if ((s = grove__op_tensor(c, 0, &x0))) return s;
  const bool all = mode == SCAN_PROD && c->args[1].kind == A_NONE;
  if (!all) {
    if ((s = grove__op_int(c, &c->args[1], &d64))) return s;
    if (!grove__op_wrap_dim(d64, x0->ndim, &dim))
      return grove__op_dim_error(c->f, name, "dim", d64, x0->ndim);
  }
  const bool flt = grove_dtype_is_float(x0->dtype);
  const bool keepdim = mode == SCAN_PROD && c->args[2].kind == A_BOOL && c->args[2].i;
  grove_dtype dt;
  if ((s = dtype_arg(c, mode == SCAN_PROD ? 3 : 2, flt ? GROVE_F32 : GROVE_I64, &dt)) ||
      (s = contig(c, x0, &x)))
    return s;
  int64_t outer = 1, len = x.ndim ? x.shape[dim] : 1, inner = 1;
  if (all) {
    len = grove_tensor_numel(&x);
  } else {
    for (int i = 0; i < dim; i++) outer *= x.shape[i];
    for (int i = dim + 1; i < x.ndim; i++) inner *= x.shape[i];
  }
  int64_t shape[GROVE_MAX_DIMS];
  int ndim = 0;
  if (mode != SCAN_PROD) {
    ndim = x.ndim;
    memcpy(shape, x.shape, sizeof(int64_t) * (size_t)x.ndim);
  } else if (!all) {
    for (int i = 0; i < x.ndim; i++)
      if (i != dim || keepdim) shape[ndim++] = i == dim ? 1 : x.shape[i];
  }
  if ((s = grove_fwd_alloc(c->f, &y, dt, ndim, shape))) return s;
  const bool mul = mode != SCAN_CUMSUM;
  for (int64_t o = 0; o < outer; o++)
    for (int64_t in = 0; in < inner; in++) {
      double af = mul ? 1 : 0;
      uint64_t ai = mul ? 1 : 0;
      for (int64_t l = 0; l < len; l++) {
        const int64_t i = (o * len + l) * inner + in;
        if (dt == GROVE_F32)
          af = mul ? af * get_f(&x, i) : af + get_f(&x, i);
        else
          ai = mul ? ai * (uint64_t)get_i(&x, i) : ai + (uint64_t)get_i(&x, i);
        if (mode != SCAN_PROD) put(&y, i, dt == GROVE_F32 ? af : (double)(int64_t)ai, (int64_t)ai);
      }
      if (mode == SCAN_PROD)
        put(&y, o * inner + in, dt == GROVE_F32 ? af : (double)(int64_t)ai, (int64_t)ai);
    }
  grove__op_set_tensor(res, &y);
  return GROVE_OK;
}

static grove_status cumsum_fwd(const grove__opctx *c, gval *res) {
  return scan(c, res, SCAN_CUMSUM);
}
static grove_status cumprod_fwd(const grove__opctx *c, gval *res) {
  return scan(c, res, SCAN_CUMPROD);
}
static grove_status prod_fwd(const grove__opctx *c, gval *res) {
  return scan(c, res, SCAN_PROD);
}

/* cumsum and cumprod: torch's (input, dim, *, dtype). */
#define CUM_ENTRY(n)                                                                               \
  const grove__opdef grove__opdef_##n = {                                                          \
      .name = #n,                                                                                  \
      .id = G_OP,                                                                                  \
      .torch = (const char *const[]){"torch." #n "(input,dim)", "Tensor." #n "(input,dim)", NULL}, \
      .varargs = -1,                                                                               \
      .p = {INPUT, OP_REQ("dim", P_INT), DTYPE},                                                   \
      .forward = n##_fwd,                                                                          \
  }
CUM_ENTRY(cumsum);
CUM_ENTRY(cumprod);

const grove__opdef grove__opdef_prod = {
    .name = "prod",
    .id = G_OP,
    .torch = (const char *const[]){"torch.prod(input,dim,keepdim)",
                                   "Tensor.prod(input,dim,keepdim)", NULL},
    .varargs = -1,
    .p = {INPUT, OP_NONE("dim", P_INT), OP_BOOL("keepdim", 0), DTYPE},
    .forward = prod_fwd,
};

/* ------------------------------------------------------------ to, type */

/* x as dtype dt: tensor_ops.h's one conversion (x itself when it already
 * has dt, as torch returns self). */
static grove_status cast(const grove__opctx *c, const grove_tensor *x, grove_dtype dt, gval *res) {
  grove_tensor y;
  grove_status s = grove__op_to_dtype(c->f, x, dt, &y);
  if (s) return s;
  grove__op_set_tensor(res, &y);
  return GROVE_OK;
}

/* Tensor.to(dtype), .to(device), .to(device, dtype), .to(other) and
 * .type(dtype): a device (Grove serves on the CPU) changes nothing. */
static grove_status to_fwd(const grove__opctx *c, gval *res) {
  const grove_tensor *x;
  grove_status s = grove__op_tensor(c, 0, &x);
  if (s) return s;
  grove_dtype dt = x->dtype, named;
  for (int k = 1; k <= 2; k++) {
    const garg *a = &c->args[k];
    const gval *v = grove__op_val(c, a);
    if (v && v->kind == V_TENSOR) { /* to(other): other's dtype */
      dt = v->t[0].dtype;
    } else if ((v && v->kind == V_DTYPE) ||
               (a->kind == A_STR && grove_dtype_from_name(a->s, &named))) {
      if ((s = dtype_arg(c, k, dt, &dt))) return s;
    } else if (!(a->kind == A_NONE || a->kind == A_STR || (v && v->kind == V_NONE))) {
      return grove__op_want(c, "a dtype, a device or a tensor");
    }
  }
  if (grove_dtype_is_float(dt)) dt = GROVE_F32;
  return cast(c, x, dt, res);
}

const grove__opdef grove__opdef_to = {
    .name = "to",
    .id = G_OP,
    .torch = (const char *const[]){"Tensor.to(input,device,dtype)", NULL},
    .varargs = -1,
    .p = {INPUT,
          {.name = "device", .kind = P_ANY, .dk = D_NONE},
          {.name = "dtype", .kind = P_ANY, .dk = D_NONE},
          IGNORED("non_blocking"),
          IGNORED("copy"),
          IGNORED("memory_format")},
    .forward = to_fwd,
};

const grove__opdef grove__opdef_type = {
    .name = "type",
    .id = G_OP,
    .torch = (const char *const[]){"Tensor.type(input,dtype)", NULL},
    .varargs = -1,
    .p = {INPUT, {.name = "dtype", .kind = P_ANY, .dk = D_NONE}, IGNORED("non_blocking")},
    .forward = to_fwd,
};
