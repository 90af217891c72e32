/* ops_linalg.c: the batched products attention code spells in torch's other
 * ways, as op table entries (ops.h): torch.bmm, baddbmm, addmm (HuggingFace's
 * Conv1D is addmm(bias, x, weight)) and einsum with the usual attention
 * equations ("bhld,bhmd->bhlm", "bhlm,bhmd->bhld", "ij,jk->ik", ...).  All of
 * them end in graph_ops.c's grove__op_matmul (one GEMM path); einsum only
 * permutes and reshapes its operands into [batch, m, k] x [batch, k, n]. */
#include <string.h>

#include "graph_ops.h"
#include "ops.h"

#define F32 (1u << GROVE_F32)
#define TENSOR(n) \
  { .name = n, .kind = P_TENSOR, .dk = D_REQ, .dtypes = F32 }
#define SCALE(n) \
  { .name = n, .kind = P_NUMBER, .dk = D_INT, .dv = 1 }

static grove_status want_dims(const grove__opctx *c, const grove_tensor *t, int nd,
                              const char *what) {
  if (t->ndim == nd) return GROVE_OK;
  char got[128];
  return grove_err_set(c->f->err, GROVE_E_SHAPE, "%s: %s must be a %d-d tensor, got %s",
                       c->def->name, what, nd, grove_shape_str(t->ndim, t->shape, got, sizeof got));
}

/* ------------------------------------------------------------ bmm, baddbmm, addmm */

static grove_status bmm_fwd(const grove__opctx *c, gval *res) {
  const grove_tensor *a, *b;
  grove_tensor y;
  grove_status s;
  if ((s = grove__op_tensor(c, 0, &a)) || (s = grove__op_tensor(c, 1, &b)) ||
      (s = want_dims(c, a, 3, "batch1")) || (s = want_dims(c, b, 3, "batch2")))
    return s;
  if (a->shape[0] != b->shape[0])
    return grove_err_set(c->f->err, GROVE_E_SHAPE, "bmm: batch sizes %lld and %lld differ",
                         (long long)a->shape[0], (long long)b->shape[0]);
  if ((s = grove__op_matmul(c->f, a, b, &y))) return s;
  grove__op_set_tensor(res, &y);
  return GROVE_OK;
}

/* beta * input + alpha * (m1 @ m2), m1 and m2 of rank nd (addmm 2, baddbmm 3);
 * beta = 0 ignores input (NaN included), as torch does. */
static grove_status addmm_fwd(const grove__opctx *c, gval *res) {
  const int nd = strcmp(c->def->name, "addmm") == 0 ? 2 : 3;
  const grove_tensor *in, *a, *b;
  grove_tensor p, y;
  double beta, alpha;
  int64_t ib, ia;
  bool bi, ai;
  grove_status s;
  if ((s = grove__op_tensor(c, 0, &in)) || (s = grove__op_tensor(c, 1, &a)) ||
      (s = grove__op_tensor(c, 2, &b)) || (s = want_dims(c, a, nd, nd == 2 ? "mat1" : "batch1")) ||
      (s = want_dims(c, b, nd, nd == 2 ? "mat2" : "batch2")))
    return s;
  if (!grove__op_number(c, &c->args[3], &beta, &ib, &bi) ||
      !grove__op_number(c, &c->args[4], &alpha, &ia, &ai))
    return grove__op_want(c, "numbers for beta and alpha");
  if (nd == 3 && a->shape[0] != b->shape[0])
    return grove_err_set(c->f->err, GROVE_E_SHAPE, "baddbmm: batch sizes %lld and %lld differ",
                         (long long)a->shape[0], (long long)b->shape[0]);
  if ((s = grove__op_matmul(c->f, a, b, &p))) return s;
  if (alpha != 1) {
    float av = (float)alpha;
    grove_tensor sc;
    grove_tensor_init(&sc, GROVE_F32, 0, NULL, &av);
    if ((s = grove__op_binary(c->f, GROVE__BIN_MUL, &p, &sc, 1.0, &p, &p))) return s;
  }
  if (beta == 0) {
    grove__op_set_tensor(res, &p);
    return GROVE_OK;
  }
  /* p + beta * input, into p: the result has p's shape (input broadcasts). */
  if ((s = grove__op_binary(c->f, GROVE__BIN_ADD, &p, in, beta, &y, &p))) return s;
  if (!grove_tensor_same_shape(&y, &p)) {
    char a1[128], b1[128];
    return grove_err_set(c->f->err, GROVE_E_SHAPE, "%s: input %s does not broadcast to %s",
                         c->def->name, grove_shape_str(in->ndim, in->shape, a1, sizeof a1),
                         grove_shape_str(p.ndim, p.shape, b1, sizeof b1));
  }
  grove__op_set_tensor(res, &y);
  return GROVE_OK;
}

const grove__opdef grove__opdef_bmm = {
    .name = "bmm",
    .id = G_OP,
    .torch = (const char *const[]){"torch.bmm(input,mat2)", "Tensor.bmm(input,mat2)", NULL},
    .varargs = -1,
    .p = {TENSOR("input"), TENSOR("mat2")},
    .forward = bmm_fwd,
};

const grove__opdef grove__opdef_baddbmm = {
    .name = "baddbmm",
    .id = G_OP,
    .torch = (const char *const[]){"torch.baddbmm(input,batch1,batch2)",
                                   "Tensor.baddbmm(input,batch1,batch2)", NULL},
    .varargs = -1,
    .p = {TENSOR("input"), TENSOR("batch1"), TENSOR("batch2"), SCALE("beta"), SCALE("alpha")},
    .forward = addmm_fwd,
};

const grove__opdef grove__opdef_addmm = {
    .name = "addmm",
    .id = G_OP,
    .torch = (const char *const[]){"torch.addmm(input,mat1,mat2)", "Tensor.addmm(input,mat1,mat2)",
                                   NULL},
    .varargs = -1,
    .p = {TENSOR("input"), TENSOR("mat1"), TENSOR("mat2"), SCALE("beta"), SCALE("alpha")},
    .forward = addmm_fwd,
};

/* ------------------------------------------------------------ einsum */

/* One operand's subscripts: letters, one per dim (no repeats: no
 * diagonals), or an error. */
static grove_status subscripts(const grove__opctx *c, const char *s, size_t len, char *out,
                               int *n) {
  *n = 0;
  for (size_t i = 0; i < len; i++) {
    const char ch = s[i];
    if (ch == ' ') continue;
    if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z')))
      return grove_err_set(c->f->err, GROVE_E_UNSUPPORTED,
                           "einsum: subscript '%c' is not supported (letters only; no ellipsis)",
                           ch);
    if (memchr(out, ch, (size_t)*n))
      return grove_err_set(c->f->err, GROVE_E_UNSUPPORTED,
                           "einsum: repeated subscript '%c' in one operand (a diagonal) is not "
                           "supported",
                           ch);
    if (*n >= GROVE_MAX_DIMS)
      return grove_err_set(c->f->err, GROVE_E_SHAPE, "einsum: too many dims");
    out[(*n)++] = ch;
  }
  return GROVE_OK;
}

static int pos(const char *s, int n, char ch) {
  for (int i = 0; i < n; i++)
    if (s[i] == ch) return i;
  return -1;
}

/* x summed over the dims whose letters are not in keep (kept: their order),
 * letters updated. */
static grove_status sum_out(const grove__opctx *c, grove_tensor *x, char *sub, int *n,
                            const char *keep1, int nk1, const char *keep2, int nk2) {
  int64_t dims[GROVE_MAX_DIMS];
  int nd = 0, m = 0;
  char left[GROVE_MAX_DIMS];
  for (int i = 0; i < *n; i++) {
    if (pos(keep1, nk1, sub[i]) < 0 && pos(keep2, nk2, sub[i]) < 0)
      dims[nd++] = i;
    else
      left[m++] = sub[i];
  }
  if (!nd) return GROVE_OK;
  grove_tensor y;
  grove_status s = grove__op_reduce(c->f, false, x, dims, nd, false, &y);
  if (s) return s;
  *x = y;
  memcpy(sub, left, (size_t)m);
  *n = m;
  return GROVE_OK;
}

static grove_status einsum_fwd(const grove__opctx *c, gval *res) {
  const garg *eq = &c->args[0];
  if (eq->kind != A_STR) return grove__op_want(c, "an equation string");
  /* The operands: einsum(eq, a, b) gathers them into a list, einsum(eq,
   * [a, b]) passes one. */
  grove_tensor ops[2];
  int nops = 0;
  const garg *la = &c->args[1];
  if (la->kind == A_LIST && la->n == 1 && la->items[0].kind == A_LIST) la = &la->items[0];
  const bool one = la->kind == A_NODE;
  if (!one && (la->kind != A_LIST || la->n < 1 || la->n > 2))
    return grove_err_set(c->f->err, GROVE_E_UNSUPPORTED,
                         "einsum: one or two operands are supported");
  for (int k = 0; k < (one ? 1 : la->n); k++) {
    const gval *v = grove__op_val(c, one ? la : &la->items[k]);
    if (!v || v->kind != V_TENSOR) return grove__op_want(c, "tensor operands");
    ops[nops++] = v->t[0];
  }
  grove_status s;
  for (int i = 0; i < nops; i++)
    if (ops[i].dtype != GROVE_F32)
      return grove_err_set(c->f->err, GROVE_E_DTYPE, "einsum: operand %d is %s, expected float32",
                           i, grove_dtype_name(ops[i].dtype));
  const char *e = eq->s, *arrow = strstr(e, "->"), *comma = strchr(e, ',');
  const char *lhs_end = arrow ? arrow : e + strlen(e);
  if (nops < 1 || nops > 2 || (nops == 2) != (comma && comma < lhs_end))
    return grove_err_set(c->f->err, GROVE_E_UNSUPPORTED,
                         "einsum: \"%s\" with %d operand(s): one or two operands are supported", e,
                         nops);
  char sa[GROVE_MAX_DIMS], sb[GROVE_MAX_DIMS], so[GROVE_MAX_DIMS];
  int na = 0, nb = 0, no = 0;
  const char *a_end = nops == 2 ? comma : lhs_end;
  if ((s = subscripts(c, e, (size_t)(a_end - e), sa, &na))) return s;
  if (nops == 2 && (s = subscripts(c, comma + 1, (size_t)(lhs_end - comma - 1), sb, &nb))) return s;
  if (arrow) {
    if ((s = subscripts(c, arrow + 2, strlen(arrow + 2), so, &no))) return s;
  } else { /* implicit output: the letters that appear once, sorted */
    for (char ch = 'A'; ch <= 'z'; ch++) {
      const int k = (pos(sa, na, ch) >= 0) + (pos(sb, nb, ch) >= 0);
      if (k == 1 && no < GROVE_MAX_DIMS) so[no++] = ch;
    }
  }
  if (ops[0].ndim != na || (nops == 2 && ops[1].ndim != nb))
    return grove_err_set(c->f->err, GROVE_E_SHAPE,
                         "einsum: the subscripts of \"%s\" do not match the operands' ranks", e);
  for (int i = 0; i < no; i++)
    if (pos(sa, na, so[i]) < 0 && pos(sb, nb, so[i]) < 0)
      return grove_err_set(c->f->err, GROVE_E_SHAPE,
                           "einsum: output subscript '%c' appears in no operand", so[i]);
  grove_tensor A = ops[0], B = nops == 2 ? ops[1] : ops[0];
  /* Letters only one operand has and the output lacks are summed first. */
  if ((s = sum_out(c, &A, sa, &na, so, no, sb, nops == 2 ? nb : 0))) return s;
  if (nops == 1) {
    int64_t perm[GROVE_MAX_DIMS];
    for (int i = 0; i < no; i++) perm[i] = pos(sa, na, so[i]);
    grove_tensor y;
    if ((s = grove__op_permute(c->f, &A, perm, no, &y))) return s;
    grove__op_set_tensor(res, &y);
    return GROVE_OK;
  }
  if ((s = sum_out(c, &B, sb, &nb, so, no, sa, na))) return s;
  /* batch: in A, B and out; contracted: A and B only; free: one side and out. */
  char bt[GROVE_MAX_DIMS], ct[GROVE_MAX_DIMS], fa[GROVE_MAX_DIMS], fb[GROVE_MAX_DIMS];
  int nbt = 0, nct = 0, nfa = 0, nfb = 0;
  for (int i = 0; i < na; i++) {
    const bool inb = pos(sb, nb, sa[i]) >= 0, ino = pos(so, no, sa[i]) >= 0;
    if (inb && ino)
      bt[nbt++] = sa[i];
    else if (inb)
      ct[nct++] = sa[i];
    else
      fa[nfa++] = sa[i];
  }
  for (int i = 0; i < nb; i++)
    if (pos(sa, na, sb[i]) < 0) fb[nfb++] = sb[i];
  int64_t pa[GROVE_MAX_DIMS], pb[GROVE_MAX_DIMS], bsz = 1, m = 1, k = 1, n = 1;
  int64_t oshape[GROVE_MAX_DIMS];
  char osub[GROVE_MAX_DIMS];
  int q = 0, r = 0, t = 0;
  for (int i = 0; i < nbt; i++) {
    const int ia = pos(sa, na, bt[i]), ib = pos(sb, nb, bt[i]);
    if (A.shape[ia] != B.shape[ib])
      return grove_err_set(c->f->err, GROVE_E_SHAPE,
                           "einsum: '%c' is %lld in one operand and %lld "
                           "in the other",
                           bt[i], (long long)A.shape[ia], (long long)B.shape[ib]);
    pa[q++] = ia;
    pb[r++] = ib;
    bsz *= A.shape[ia];
    oshape[t] = A.shape[ia];
    osub[t++] = bt[i];
  }
  for (int i = 0; i < nfa; i++) {
    const int ia = pos(sa, na, fa[i]);
    pa[q++] = ia;
    m *= A.shape[ia];
    oshape[t] = A.shape[ia];
    osub[t++] = fa[i];
  }
  for (int i = 0; i < nct; i++) {
    const int ia = pos(sa, na, ct[i]), ib = pos(sb, nb, ct[i]);
    if (A.shape[ia] != B.shape[ib])
      return grove_err_set(c->f->err, GROVE_E_SHAPE,
                           "einsum: '%c' is %lld in one operand and %lld "
                           "in the other",
                           ct[i], (long long)A.shape[ia], (long long)B.shape[ib]);
    pa[q++] = ia;
    pb[r++] = ib;
    k *= A.shape[ia];
  }
  for (int i = 0; i < nfb; i++) {
    const int ib = pos(sb, nb, fb[i]);
    pb[r++] = ib;
    n *= B.shape[ib];
    oshape[t] = B.shape[ib];
    osub[t++] = fb[i];
  }
  grove_tensor ap, bp, a3, b3, p, y, z;
  const int64_t s3a[3] = {bsz, m, k}, s3b[3] = {bsz, k, n};
  if ((s = grove__op_permute(c->f, &A, pa, na, &ap)) ||
      (s = grove__op_reshape(c->f, &ap, s3a, 3, &a3)) ||
      (s = grove__op_permute(c->f, &B, pb, nb, &bp)) ||
      (s = grove__op_reshape(c->f, &bp, s3b, 3, &b3)) ||
      (s = grove__op_matmul(c->f, &a3, &b3, &p)) ||
      (s = grove__op_reshape(c->f, &p, oshape, t, &y)))
    return s;
  int64_t perm[GROVE_MAX_DIMS];
  for (int i = 0; i < no; i++) perm[i] = pos(osub, t, so[i]);
  if ((s = grove__op_permute(c->f, &y, perm, no, &z))) return s;
  grove__op_set_tensor(res, &z);
  return GROVE_OK;
}

const grove__opdef grove__opdef_einsum = {
    .name = "einsum",
    .id = G_OP,
    .torch = (const char *const[]){"torch.einsum(equation,*operands)", NULL},
    .varargs = 1,
    .p = {OP_REQ("equation", P_STR), OP_REQ("operands", P_TENSORS)},
    .forward = einsum_fwd,
};

/* F.linear(input, weight, bias): input @ weight^T + bias, the transpose a
 * view (matmul takes transposed operands without a copy).  Users call it
 * with their own parameters (self.weight) in a custom forward. */
static grove_status linear_fwd(const grove__opctx *c, gval *res) {
  const grove_tensor *x, *w, *b = NULL;
  grove_tensor wt, y;
  grove_status s;
  if ((s = grove__op_tensor(c, 0, &x)) || (s = grove__op_tensor(c, 1, &w))) return s;
  if (c->args[2].kind != A_NONE && (s = grove__op_tensor(c, 2, &b))) return s;
  if (w->ndim != 2 && w->ndim != 1)
    return grove_err_set(c->f->err, GROVE_E_SHAPE, "linear: weight must be 1-d or 2-d, got %d-d",
                         w->ndim);
  wt = *w;
  if (w->ndim == 2 && (s = grove__op_transpose(c->f, w, 0, 1, &wt))) return s;
  if ((s = grove__op_matmul(c->f, x, &wt, &y))) {
    grove_err_prefix(c->f->err, "linear");
    return s;
  }
  if (b && (s = grove__op_binary(c->f, GROVE__BIN_ADD, &y, b, 1, &y, &y))) {
    grove_err_prefix(c->f->err, "linear: bias");
    return s;
  }
  grove__op_set_tensor(res, &y);
  return GROVE_OK;
}

const grove__opdef grove__opdef_linear = {
    .name = "linear",
    .id = G_OP,
    .torch = (const char *const[]){"torch.nn.functional.linear(input,weight,bias)", NULL},
    .varargs = -1,
    .p = {OP_REQ("input", P_TENSOR), OP_REQ("weight", P_TENSOR), OP_NONE("bias", P_TENSOR)},
    .forward = linear_fwd,
};
