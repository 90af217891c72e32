/* ops_select.c: the op entries (ops.h) of comparisons (==, !=, <, <=, >,
 * >= giving bool tensors, or a Python bool between two numbers), where,
 * masked_fill, and the reductions that pick: amax / amin, max / min (with a
 * dim: the (values, indices) tuple), argmax / argmin, and sort / argsort /
 * topk (a stable merge sort of each lane, here).  Kernels: select.c and
 * pick_reduce.c (tensor_ops.h). */
#include <math.h>
#include <string.h>

#include "ops.h"
#include "tensor_ops.h"

#define INPUT \
  { .name = "input", .kind = P_TENSOR, .dk = D_REQ }

/* a OP b with the operands swapped: 3 < x is x > 3. */
static int swapped(int op) {
  switch (op) {
    case GROVE__CMP_LT: return GROVE__CMP_GT;
    case GROVE__CMP_LE: return GROVE__CMP_GE;
    case GROVE__CMP_GT: return GROVE__CMP_LT;
    case GROVE__CMP_GE: return GROVE__CMP_LE;
    default: return op;
  }
}

static grove_status compare(const grove__opctx *c, gval *res, int op) {
  const gval *va = grove__op_val(c, &c->args[0]), *vb = grove__op_val(c, &c->args[1]);
  const bool ta = va && va->kind == V_TENSOR, tb = vb && vb->kind == V_TENSOR;
  grove_tensor y;
  grove_status s;
  double x1, x2;
  int64_t i1, i2;
  bool int1, int2;
  if (ta && tb) {
    s = grove__op_compare(c->f, op, &va->t[0], &vb->t[0], &y);
  } else if (ta || tb) {
    const bool ok = grove__op_number(c, &c->args[ta ? 1 : 0], &x2, &i2, &int2);
    if (!ok) return grove__op_want(c, "a tensor or a number to compare with");
    s = grove__op_compare_scalar(c->f, ta ? op : swapped(op), ta ? &va->t[0] : &vb->t[0], x2, &y);
  } else {
    /* Two Python numbers (a size against a constant): a Python bool. */
    if (!grove__op_number(c, &c->args[0], &x1, &i1, &int1) ||
        !grove__op_number(c, &c->args[1], &x2, &i2, &int2))
      return grove__op_want(c, "tensors or numbers to compare");
    const bool r = int1 && int2 ? grove__cmp_i64(op, i1, i2) : grove__cmp_f64(op, x1, x2);
    grove__op_set_int(res, r);
    res->kind = V_BOOL;
    return GROVE_OK;
  }
  if (s) return s;
  grove__op_set_tensor(res, &y);
  return GROVE_OK;
}

#define CMP_FWD(n, OP) \
  static grove_status n##_fwd(const grove__opctx *c, gval *res) { return compare(c, res, OP); }
CMP_FWD(eq, GROVE__CMP_EQ)
CMP_FWD(ne, GROVE__CMP_NE)
CMP_FWD(lt, GROVE__CMP_LT)
CMP_FWD(le, GROVE__CMP_LE)
CMP_FWD(gt, GROVE__CMP_GT)
CMP_FWD(ge, GROVE__CMP_GE)

/* A where operand: a tensor, or a number (*t NULL, *v set); *cat its
 * kind for torch's promotion: 0 bool, 1 integer, 2 float. */
static grove_status operand(const grove__opctx *c, int k, const grove_tensor **t, double *v,
                            int *cat) {
  const gval *g = grove__op_val(c, &c->args[k]);
  *t = NULL;
  if (g && g->kind == V_TENSOR) {
    *t = &g->t[0];
    *cat = grove_dtype_is_float((*t)->dtype) ? 2 : (*t)->dtype == GROVE_BOOL ? 0 : 1;
    return GROVE_OK;
  }
  int64_t i;
  bool is_int;
  if (!grove__op_number(c, &c->args[k], v, &i, &is_int))
    return grove__op_want(c, "a tensor or a number");
  *cat = !is_int ? 2 : (g ? g->kind == V_BOOL : c->args[k].kind == A_BOOL) ? 0 : 1;
  return GROVE_OK;
}

/* torch.where(cond, a, b) in the higher kind of a and b, as torch
 * promotes (a number's kind counts: where(c, long_ids, 0.5) is float32,
 * where(c, mask, False) bool): float32, int64 or bool. */
static grove_status where_fwd(const grove__opctx *c, gval *res) {
  const grove_tensor *cond, *a, *b;
  double av = 0, bv = 0;
  int ca, cb;
  grove_tensor y;
  grove_status s;
  if ((s = grove__op_tensor(c, 0, &cond)) || (s = operand(c, 1, &a, &av, &ca)) ||
      (s = operand(c, 2, &b, &bv, &cb)))
    return s;
  const int cat = ca > cb ? ca : cb;
  const grove_dtype dt = cat == 2 ? GROVE_F32 : cat == 1 ? GROVE_I64 : GROVE_BOOL;
  if ((s = grove__op_where(c->f, cond, a, av, b, bv, dt, &y))) return s;
  grove__op_set_tensor(res, &y);
  return GROVE_OK;
}

static grove_status masked_fill_fwd(const grove__opctx *c, gval *res) {
  const grove_tensor *x, *mask;
  double v;
  int64_t i;
  bool is_int;
  grove_tensor y;
  grove_status s;
  if ((s = grove__op_tensor(c, 0, &x)) || (s = grove__op_tensor(c, 1, &mask))) return s;
  if (!grove__op_number(c, &c->args[2], &v, &i, &is_int))
    return grove__op_want(c, "a number to fill with");
  if ((s = grove__op_masked_fill(c->f, x, mask, v, &y))) return s;
  grove__op_set_tensor(res, &y);
  return GROVE_OK;
}

static grove_status amax_common(const grove__opctx *c, gval *res, int op) {
  const grove_tensor *x;
  int64_t dims[GROVE_MAX_DIMS];
  int nd = -1;
  grove_tensor y;
  grove_status s;
  if ((s = grove__op_tensor(c, 0, &x))) return s;
  if (c->args[1].kind != A_NONE && (s = grove__op_ints(c, &c->args[1], true, dims, &nd))) return s;
  if (nd == 0) nd = -1; /* amax(x, dim=()) reduces everything, as torch */
  if ((s = grove__op_amax(c->f, op, x, dims, nd, c->args[2].i != 0, &y))) return s;
  grove__op_set_tensor(res, &y);
  return GROVE_OK;
}
static grove_status amax_fwd(const grove__opctx *c, gval *res) {
  return amax_common(c, res, GROVE__PICK_MAX);
}
static grove_status amin_fwd(const grove__opctx *c, gval *res) {
  return amax_common(c, res, GROVE__PICK_MIN);
}

/* max / min: without dim the 0-d maximum; with dim (values, indices);
 * with a tensor in dim's place, torch's other overload: torch.max(input,
 * other) is torch.maximum. */
static grove_status max_common(const grove__opctx *c, gval *res, int op, bool arg) {
  const grove_tensor *x;
  int64_t dim = 0;
  grove_tensor t[2];
  grove_status s;
  const gval *other = grove__op_val(c, &c->args[1]);
  if (!arg && other && other->kind == V_TENSOR)
    return grove__op_max_min(c, res, op == GROVE__PICK_MAX);
  if ((s = grove__op_tensor(c, 0, &x))) return s;
  const bool has = c->args[1].kind != A_NONE;
  if (has && (s = grove__op_int(c, &c->args[1], &dim))) return s;
  const bool keep = c->args[2].i != 0;
  if (arg) {
    if ((s = grove__op_max_dim(c->f, op, x, has, dim, keep, NULL, &t[0]))) return s;
    grove__op_set_tensor(res, &t[0]);
  } else if (!has) {
    if ((s = grove__op_max_dim(c->f, op, x, false, 0, false, &t[0], NULL))) return s;
    grove__op_set_tensor(res, &t[0]);
  } else {
    if ((s = grove__op_max_dim(c->f, op, x, true, dim, keep, &t[0], &t[1]))) return s;
    grove__op_set_tuple(res, t, 2);
  }
  return GROVE_OK;
}
static grove_status max_fwd(const grove__opctx *c, gval *res) {
  return max_common(c, res, GROVE__PICK_MAX, false);
}
static grove_status min_fwd(const grove__opctx *c, gval *res) {
  return max_common(c, res, GROVE__PICK_MIN, false);
}
static grove_status argmax_fwd(const grove__opctx *c, gval *res) {
  return max_common(c, res, GROVE__PICK_MAX, true);
}
static grove_status argmin_fwd(const grove__opctx *c, gval *res) {
  return max_common(c, res, GROVE__PICK_MIN, true);
}

/* ------------------------------------------------------------ the entries */

#define CMP_ENTRY(n)                                                                         \
  const grove__opdef grove__opdef_##n = {                                                    \
      .name = #n,                                                                            \
      .id = G_OP,                                                                            \
      .torch = (const char *const[]){"operator." #n "(input,other)", "torch." #n "(input,other)", \
                                     "Tensor." #n "(input,other)", NULL},                    \
      .varargs = -1,                                                                         \
      .p = {OP_REQ("input", P_OPERAND), OP_REQ("other", P_OPERAND)},                         \
      .forward = n##_fwd,                                                                    \
  }
CMP_ENTRY(eq);
CMP_ENTRY(ne);
CMP_ENTRY(lt);
CMP_ENTRY(le);
CMP_ENTRY(gt);
CMP_ENTRY(ge);

const grove__opdef grove__opdef_where = {
    .name = "where",
    .id = G_OP,
    .torch = (const char *const[]){"torch.where(condition,input,other)",
                                   "Tensor.where(input,condition,other)", NULL},
    .varargs = -1,
    .p = {OP_REQ("condition", P_TENSOR), OP_REQ("input", P_OPERAND), OP_REQ("other", P_OPERAND)},
    .forward = where_fwd,
};

const grove__opdef grove__opdef_masked_fill = {
    .name = "masked_fill",
    .id = G_OP,
    .torch = (const char *const[]){"torch.masked_fill(input,mask,value)",
                                   "Tensor.masked_fill(input,mask,value)", NULL},
    .varargs = -1,
    .p = {INPUT, {.name = "mask", .kind = P_TENSOR, .dk = D_REQ, .dtypes = 1u << GROVE_BOOL},
          OP_REQ("value", P_NUMBER)},
    .forward = masked_fill_fwd,
};

#define PICK_ENTRY(n, DIMKIND)                                                                \
  const grove__opdef grove__opdef_##n = {                                                     \
      .name = #n,                                                                             \
      .id = G_OP,                                                                             \
      .torch = (const char *const[]){"torch." #n "(input,dim,keepdim)",                       \
                                     "Tensor." #n "(input,dim,keepdim)", NULL},               \
      .varargs = -1,                                                                          \
      .p = {INPUT, OP_NONE("dim", DIMKIND), OP_BOOL("keepdim", 0)},                           \
      .forward = n##_fwd,                                                                     \
  }
PICK_ENTRY(amax, P_INTS);
PICK_ENTRY(amin, P_INTS);
PICK_ENTRY(max, P_INT);
PICK_ENTRY(min, P_INT);
PICK_ENTRY(argmax, P_INT);
PICK_ENTRY(argmin, P_INT);

/* ------------------------------------------------------------ isnan, any */

/* isnan: x != x; isinf: |x| == inf; isfinite: |x| < inf (NaN fails both);
 * bool tensors (integers are never NaN or infinite). */
static grove_status isnum_fwd(const grove__opctx *c, gval *res) {
  const grove_tensor *x;
  grove_tensor ax, y;
  grove_status s = grove__op_tensor(c, 0, &x);
  if (s) return s;
  const char *n = c->def->name;
  if (strcmp(n, "isnan") == 0) {
    s = grove__op_compare(c->f, GROVE__CMP_NE, x, x, &y);
  } else if (x->dtype == GROVE_BOOL) {
    s = grove__op_compare_scalar(c->f, strcmp(n, "isinf") == 0 ? GROVE__CMP_LT : GROVE__CMP_GE, x,
                                 0, &y); /* all false / all true */
  } else if (!(s = grove__op_unary(c->f, GROVE__UN_ABS, x, 0, 0, &ax, NULL))) {
    s = grove__op_compare_scalar(c->f, strcmp(n, "isinf") == 0 ? GROVE__CMP_EQ : GROVE__CMP_LT, &ax,
                                 INFINITY, &y);
  }
  if (s) return s;
  grove__op_set_tensor(res, &y);
  return GROVE_OK;
}

/* any / all(input, dim, keepdim): the max / min of input != 0, a bool. */
static grove_status any_all_fwd(const grove__opctx *c, gval *res) {
  const grove_tensor *x;
  grove_tensor nz, iv, m, y;
  int64_t dims[GROVE_MAX_DIMS];
  int n = -1;
  grove_status s = grove__op_tensor(c, 0, &x);
  if (s) return s;
  if (c->args[1].kind != A_NONE && (s = grove__op_ints(c, &c->args[1], true, dims, &n))) return s;
  const bool keepdim = c->args[2].kind == A_BOOL && c->args[2].i;
  const bool any = strcmp(c->def->name, "any") == 0;
  if ((s = grove__op_to_dtype(c->f, x, GROVE_BOOL, &nz)) ||
      (s = grove__op_to_dtype(c->f, &nz, GROVE_I64, &iv)) ||
      (s = grove__op_amax(c->f, any ? GROVE__PICK_MAX : GROVE__PICK_MIN, &iv, dims, n, keepdim,
                          &m)) ||
      (s = grove__op_to_dtype(c->f, &m, GROVE_BOOL, &y)))
    return s;
  grove__op_set_tensor(res, &y);
  return GROVE_OK;
}

#define ISNUM(n)                                                                           \
  const grove__opdef grove__opdef_##n = {                                                  \
      .name = #n,                                                                          \
      .id = G_OP,                                                                          \
      .torch = (const char *const[]){"torch." #n "(input)", "Tensor." #n "(input)", NULL}, \
      .varargs = -1,                                                                       \
      .p = {{.name = "input", .kind = P_TENSOR, .dk = D_REQ}},                             \
      .forward = isnum_fwd,                                                                \
  }
ISNUM(isnan);
ISNUM(isinf);
ISNUM(isfinite);

#define ANY_ALL(n)                                                              \
  const grove__opdef grove__opdef_##n = {                                       \
      .name = #n,                                                               \
      .id = G_OP,                                                               \
      .torch = (const char *const[]){"torch." #n "(input,dim,keepdim)",         \
                                     "Tensor." #n "(input,dim,keepdim)", NULL}, \
      .varargs = -1,                                                            \
      .p = {{.name = "input", .kind = P_TENSOR, .dk = D_REQ},                   \
            OP_NONE("dim", P_INTS),                                             \
            OP_BOOL("keepdim", 0)},                                             \
      .forward = any_all_fwd,                                                   \
  }
ANY_ALL(any);
ANY_ALL(all);

/* ------------------------------------------------------------ sort, argsort, topk */

/* One lane's keys, by position: float32 values widened to double (exact),
 * or int64 values compared as integers (through a double, 2^60 + 1 and
 * 2^60 are one value and would sort as ties). */
typedef struct lane {
  const double *f;
  const int64_t *i; /* int64 keys, or NULL: f */
} lane;

/* Whether the key at position a goes after the one at b in ascending
 * order: NaN is the largest, as torch sorts it (last ascending, first
 * descending). */
static bool after(const lane *v, int64_t a, int64_t b) {
  if (v->i) return v->i[a] > v->i[b];
  const double x = v->f[a], y = v->f[b];
  return isnan(x) ? !isnan(y) : x > y;
}

/* A stable merge sort of the indices ix[0..n) by their keys, descending or
 * not: equal values keep their order (torch's stable=True; its default
 * sort gives the same on the CPU).  tmp holds n indices. */
static void merge_sort(const lane *v, int64_t *ix, int64_t *tmp, int64_t n, bool desc) {
  for (int64_t w = 1; w < n; w *= 2) {
    for (int64_t lo = 0; lo < n; lo += 2 * w) {
      const int64_t mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n;
      int64_t i = lo, j = mid, k = lo;
      while (i < mid && j < hi) {
        /* j first only when it strictly precedes i: stability */
        const bool take_j = desc ? after(v, ix[j], ix[i]) : after(v, ix[i], ix[j]);
        tmp[k++] = take_j ? ix[j++] : ix[i++];
      }
      while (i < mid) tmp[k++] = ix[i++];
      while (j < hi) tmp[k++] = ix[j++];
    }
    memcpy(ix, tmp, (size_t)n * sizeof(int64_t));
  }
}

/* The first k of x sorted along dim (k = the dim's length: sort): values
 * (unless NULL) in x's dtype and int64 indices, each of x's shape with k
 * along dim.  float32 and int64 only: torch sorts every dtype (topk all
 * but bool and float16), and a graph's bool or uint8 tensor is refused
 * here, naming its dtype. */
static grove_status sort_dim(const grove__opctx *c, const grove_tensor *x0, int64_t d64, bool desc,
                             int64_t k, bool has_k, grove_tensor *vals, grove_tensor *idx) {
  const char *name = c->def->name;
  int dim;
  grove_status s;
  if (x0->dtype != GROVE_F32 && x0->dtype != GROVE_I64)
    return grove_err_set(c->f->err, GROVE_E_DTYPE, "%s: expected a float32 or int64 tensor, got %s",
                         name, grove_dtype_name(x0->dtype));
  if (!grove__op_wrap_dim(d64, x0->ndim ? x0->ndim : 1, &dim))
    return grove__op_dim_error(c->f, name, "dim", d64, x0->ndim);
  grove_tensor x = *x0;
  if (!grove_tensor_is_contiguous(x0) &&
      ((s = grove_fwd_alloc(c->f, &x, x0->dtype, x0->ndim, x0->shape)) ||
       (s = grove_tensor_copy(&x, x0, c->f->err))))
    return s;
  const int64_t len = x.ndim ? x.shape[dim] : 1;
  if (!has_k) k = len;
  if (k < 0 || k > len)
    return grove_err_set(c->f->err, GROVE_E_INVALID_ARGUMENT,
                         "%s: k (%lld) is out of range for a dim of size %lld", name, (long long)k,
                         (long long)len);
  int64_t shape[GROVE_MAX_DIMS];
  memcpy(shape, x.shape, (size_t)x.ndim * sizeof(int64_t));
  if (x.ndim) shape[dim] = k;
  if ((vals && (s = grove_fwd_alloc(c->f, vals, x.dtype, x.ndim, shape))) ||
      (s = grove_fwd_alloc(c->f, idx, GROVE_I64, x.ndim, shape)))
    return s;
  int64_t outer = 1, inner = 1;
  for (int i = 0; i < dim && i < x.ndim; i++) outer *= x.shape[i];
  for (int i = dim + 1; i < x.ndim; i++) inner *= x.shape[i];
  if (outer == 0 || inner == 0 || len == 0) return GROVE_OK;
  const bool flt = x.dtype == GROVE_F32;
  /* One key array of 8-byte keys: doubles or int64s (same size). */
  void *keys = grove_arena_alloc(c->f->arena, (size_t)len * sizeof(int64_t));
  int64_t *ix = grove_arena_alloc(c->f->arena, (size_t)len * sizeof(int64_t));
  int64_t *tmp = grove_arena_alloc(c->f->arena, (size_t)len * sizeof(int64_t));
  if (!keys || !ix || !tmp)
    return grove_err_set(c->f->err, GROVE_E_NOMEM, "%s: scratch arena is exhausted", name);
  const lane v = {flt ? keys : NULL, flt ? NULL : keys};
  for (int64_t o = 0; o < outer; o++)
    for (int64_t in = 0; in < inner; in++) {
      const int64_t base = o * len * inner + in, obase = o * k * inner + in;
      for (int64_t l = 0; l < len; l++) {
        const int64_t at = base + l * inner;
        if (flt)
          ((double *)keys)[l] = ((const float *)x.data)[at];
        else
          ((int64_t *)keys)[l] = ((const int64_t *)x.data)[at];
        ix[l] = l;
      }
      merge_sort(&v, ix, tmp, len, desc);
      for (int64_t l = 0; l < k; l++) {
        const int64_t at = obase + l * inner;
        ((int64_t *)idx->data)[at] = ix[l];
        if (!vals) continue;
        if (flt)
          ((float *)vals->data)[at] = ((const float *)x.data)[base + ix[l] * inner];
        else
          ((int64_t *)vals->data)[at] = ((const int64_t *)x.data)[base + ix[l] * inner];
      }
    }
  return GROVE_OK;
}

static bool flag_arg(const garg *a, bool dflt) {
  return a->kind == A_BOOL || a->kind == A_INT ? a->i != 0 : dflt;
}

/* sort(input, dim, descending, stable) -> (values, indices); argsort the
 * indices. */
static grove_status sort_fwd(const grove__opctx *c, gval *res) {
  const grove_tensor *x;
  int64_t dim;
  grove_tensor t[2];
  grove_status s;
  const bool arg = strcmp(c->def->name, "argsort") == 0;
  if ((s = grove__op_tensor(c, 0, &x)) || (s = grove__op_int(c, &c->args[1], &dim)) ||
      (s = sort_dim(c, x, dim, flag_arg(&c->args[2], false), 0, false, arg ? NULL : &t[0], &t[1])))
    return s;
  if (arg)
    grove__op_set_tensor(res, &t[1]);
  else
    grove__op_set_tuple(res, t, 2);
  return GROVE_OK;
}

/* topk(input, k, dim, largest, sorted) -> (values, indices), always in
 * sorted order (torch's order for sorted=False is unspecified); ties keep
 * the lower index first. */
static grove_status topk_fwd(const grove__opctx *c, gval *res) {
  const grove_tensor *x;
  int64_t k, dim;
  grove_tensor t[2];
  grove_status s;
  if ((s = grove__op_tensor(c, 0, &x)) || (s = grove__op_int(c, &c->args[1], &k)) ||
      (s = grove__op_int(c, &c->args[2], &dim)) ||
      (s = sort_dim(c, x, dim, flag_arg(&c->args[3], true), k, true, &t[0], &t[1])))
    return s;
  grove__op_set_tuple(res, t, 2);
  return GROVE_OK;
}

/* sort and argsort: one parameter list, one forward. */
#define SORT_ENTRY(n)                                                                  \
  const grove__opdef grove__opdef_##n = {                                              \
      .name = #n,                                                                      \
      .id = G_OP,                                                                      \
      .torch = (const char *const[]){"torch." #n "(input,dim,descending)",             \
                                     "Tensor." #n "(input,dim,descending)", NULL},     \
      .varargs = -1,                                                                   \
      .p = {INPUT, OP_INT("dim", -1), OP_BOOL("descending", 0), OP_BOOL("stable", 0)}, \
      .forward = sort_fwd,                                                             \
  }
SORT_ENTRY(sort);
SORT_ENTRY(argsort);

const grove__opdef grove__opdef_topk = {
    .name = "topk",
    .id = G_OP,
    .torch = (const char *const[]){"torch.topk(input,k,dim,largest,sorted)",
                                   "Tensor.topk(input,k,dim,largest,sorted)", NULL},
    .varargs = -1,
    .p = {INPUT, OP_REQ("k", P_INT), OP_INT("dim", -1), OP_BOOL("largest", 1),
          OP_BOOL("sorted", 1)},
    .forward = topk_fwd,
};
