/* ops_args.c: how an op's forward reads its bound arguments and writes its
 * value (ops.h), the one copy both the graph evaluator and the op modules
 * go through.  Below every op family file. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops.h"

void grove__garg_fini(garg *a) {
  if (!a) return;
  free(a->s);
  for (int i = 0; i < a->n; i++) grove__garg_fini(&a->items[i]);
  free(a->items);
  memset(a, 0, sizeof *a);
}

const gval *grove__op_val(const grove__opctx *c, const garg *a) {
  return a->kind == A_NODE ? &c->vals[a->node] : NULL;
}

grove_status grove__op_want(const grove__opctx *c, const char *what) {
  return grove_err_set(c->f->err, GROVE_E_INVALID_ARGUMENT, "expected %s", what);
}

const char *grove__op_label(const grove__opctx *c) {
  return c->def->module ? c->def->module->cls : c->def->name;
}

/* "float32 or int64" for a dtype mask. */
static void dtype_list(unsigned mask, char *buf, size_t n) {
  size_t used = 0;
  buf[0] = '\0';
  int k = 0;
  for (int d = 0; d < GROVE_DTYPE_COUNT && used < n; d++)
    if (mask & (1u << d))
      used += (size_t)snprintf(buf + used, n - used, "%s%s", k++ ? " or " : "",
                               grove_dtype_name((grove_dtype)d));
}

grove_status grove__op_tensor(const grove__opctx *c, int k, const grove_tensor **t) {
  *t = NULL;
  const gval *v = grove__op_val(c, &c->args[k]);
  if (!v || v->kind != V_TENSOR) return grove__op_want(c, "a tensor argument");
  const unsigned mask = c->def->p[k].dtypes;
  if (mask && !(mask & (1u << v->t[0].dtype))) {
    char want[128];
    dtype_list(mask, want, sizeof want);
    return grove_err_set(c->f->err, GROVE_E_DTYPE, "%s: argument \"%s\" must be a tensor of dtype %s, got %s",
                         c->def->name, c->def->p[k].name, want, grove_dtype_name(v->t[0].dtype));
  }
  *t = &v->t[0];
  return GROVE_OK;
}

bool grove__op_number(const grove__opctx *c, const garg *a, double *x, int64_t *ix, bool *is_int) {
  const gval *v = grove__op_val(c, a);
  int kind = v                    ? v->kind
             : a->kind == A_INT   ? V_INT
             : a->kind == A_BOOL  ? V_BOOL
             : a->kind == A_FLOAT ? V_FLOAT
                                  : V_NONE;
  int64_t i = v ? v->i : a->i;
  double f = v ? v->f : a->f;
  if (kind == V_INT || kind == V_BOOL) {
    *ix = i;
    *x = (double)i;
    *is_int = true;
    return true;
  }
  if (kind == V_FLOAT) {
    *x = f;
    *is_int = false;
    return true;
  }
  return false;
}

grove_status grove__op_int(const grove__opctx *c, const garg *a, int64_t *out) {
  double x;
  bool is_int;
  if (!grove__op_number(c, a, &x, out, &is_int) || !is_int) return grove__op_want(c, "an integer");
  return GROVE_OK;
}

grove_status grove__op_ints(const grove__opctx *c, const garg *a, bool allow_one, int64_t *out,
                            int *n) {
  const gval *v = grove__op_val(c, a);
  if (v && v->kind == V_INTS) {
    *n = v->n;
    memcpy(out, v->ints, (size_t)v->n * sizeof(int64_t));
    return GROVE_OK;
  }
  if (a->kind == A_LIST) {
    if (a->n > GROVE_MAX_DIMS) return grove__op_want(c, "at most 8 dimensions");
    for (int i = 0; i < a->n; i++) {
      grove_status s = grove__op_int(c, &a->items[i], &out[i]);
      if (s) return s;
    }
    *n = a->n;
    return GROVE_OK;
  }
  if (allow_one) {
    *n = 1;
    return grove__op_int(c, a, &out[0]);
  }
  return grove__op_want(c, "a list of integers");
}

void grove__op_set_tensor(gval *v, const grove_tensor *t) {
  v->kind = V_TENSOR;
  v->n = 1;
  v->t[0] = *t;
}

void grove__op_set_int(gval *v, int64_t i) {
  v->kind = V_INT;
  v->i = i;
}

void grove__op_set_tuple(gval *v, const grove_tensor *ts, int n) {
  v->kind = V_TUPLE;
  v->n = (int8_t)n;
  v->none_mask = 0;
  v->nest = 0;
  for (int k = 0; k < n; k++) v->t[k] = ts[k];
}

grove_status grove__op_want_const(const grove__opdef *d, const char *jp, int i, const char *what,
                                  grove_err *err) {
  return grove_err_set(err, GROVE_E_SPEC, "%s: %s's argument %d must be %s", jp, d->name, i, what);
}

grove_status grove__op_default(const grove__oppar *p, garg *a) {
  memset(a, 0, sizeof *a);
  switch (p->dk) {
    case D_REQ:
      return GROVE_E_SPEC;
    case D_NONE:
      a->kind = A_NONE;
      break;
    case D_INT:
      a->kind = A_INT;
      a->i = (int64_t)p->dv;
      break;
    case D_FLOAT:
      a->kind = A_FLOAT;
      a->f = p->dv;
      break;
    case D_BOOL:
      a->kind = A_BOOL;
      a->i = p->dv != 0;
      break;
    case D_STR:
      a->kind = A_STR;
      if (!(a->s = strdup(p->ds))) return GROVE_E_NOMEM;
      break;
  }
  return GROVE_OK;
}

int grove__op_nparams(const grove__opdef *d) {
  int n = 0;
  while (n < GROVE__OP_MAX_PARAMS && d->p[n].name) n++;
  return n;
}

bool grove__op_wrap_dim(int64_t dim, int ndim, int *out) {
  int n = ndim == 0 ? 1 : ndim;
  if (dim < -n || dim >= n) return false;
  *out = (int)(dim < 0 ? dim + n : dim);
  return true;
}

grove_status grove__op_dim_error(grove_fwd *f, const char *layer, const char *what, int64_t dim,
                                 int ndim) {
  int n = ndim == 0 ? 1 : ndim;
  return grove_err_set(f->err, GROVE_E_SHAPE,
                       "%s: %s %lld is out of range for a %d-d input (expected in [%d, %d])", layer,
                       what, (long long)dim, ndim, -n, n - 1);
}

grove_status grove__op_tensors(const grove__opctx *c, const garg *a, grove_tensor *ts,
                               int32_t *slots, int max, int *n) {
  int nt = 0;
  const gval *tv = grove__op_val(c, a);
  if (tv && tv->kind == V_TUPLE) {
    for (int k = 0; k < tv->n && nt < max; k++) {
      if (tv->none_mask & (1u << k)) return grove__op_want(c, "tensors to concatenate, not None");
      if (slots) slots[nt] = tv->reg[k];
      ts[nt++] = tv->t[k];
    }
  } else if (a->kind == A_LIST) {
    for (int k = 0; k < a->n && nt < max; k++) {
      const gval *v = grove__op_val(c, &a->items[k]);
      if (!v || v->kind != V_TENSOR) return grove__op_want(c, "a tensor argument");
      if (slots) slots[nt] = v->reg[0];
      ts[nt++] = v->t[0];
    }
  } else {
    return grove__op_want(c, "a list of tensors");
  }
  *n = nt;
  return GROVE_OK;
}
