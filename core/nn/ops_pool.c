/* ops_pool.c: the functional pools (torch.nn.functional.max_pool1d/2d,
 * avg_pool1d/2d, adaptive_avg_pool1d/2d, adaptive_max_pool1d/2d and their
 * torch.* spellings): their entries (ops.h), whose forwards run the same
 * computation as the pooling modules (grove__pool_run, layers_pool.c) with a
 * grove__pool read from the node's constant arguments.  The modules stay
 * layers_pool.c's (their constructors take more arguments than an op module
 * holds); the arithmetic, the window rules and torch's checks are one. */
#include <stdio.h>
#include <string.h>

#include "layers_internal.h"
#include "ops.h"

/* torch's `int or tuple` constant for nd dims into v ([0] unused for 1-d):
 * 0 when a gives values, 1 when it is None or [] (the caller's default), -1
 * when it is not a constant of that form. */
static int const_ints(const garg *a, int nd, bool allow_none, int64_t v[2]) {
  if (a->kind == A_NONE || (a->kind == A_LIST && a->n == 0)) return 1;
  if (a->kind == A_INT || a->kind == A_BOOL) {
    v[0] = v[1] = a->i;
    return 0;
  }
  if (a->kind != A_LIST || (a->n != nd && a->n != 1)) return -1;
  for (int d = 0; d < nd; d++) {
    const garg *e = &a->items[a->n == 1 ? 0 : d];
    int64_t *dst = &v[nd == 1 ? 1 : d];
    if (e->kind == A_INT)
      *dst = e->i;
    else if (allow_none && e->kind == A_NONE)
      *dst = -1;
    else
      return -1;
  }
  if (nd == 1) v[0] = v[1];
  return 0;
}

/* The grove__pool of entry d (kind and nd from its name) from the bound
 * constant arguments a; GROVE_E_SPEC / _UNSUPPORTED with what was wrong in
 * why (the caller prefixes the node or the op). */
static grove_status pool_from_args(const grove__opdef *d, const garg *a, grove__pool *p,
                                   char *why, size_t n) {
  memset(p, 0, sizeof *p);
  const char *nm = d->name;
  const bool adaptive = strncmp(nm, "adaptive_", 9) == 0;
  const bool mx = strstr(nm, "max_") != NULL;
  p->nd = nm[strlen(nm) - 2] == '1' ? 1 : 2;
  const int nd = p->nd;
  p->kind = adaptive ? (mx ? GROVE__POOL_ADAPTIVE_MAX : GROVE__POOL_ADAPTIVE)
                     : (mx ? GROVE__POOL_MAX : GROVE__POOL_AVG);
  p->k[0] = p->k[1] = p->stride[0] = p->stride[1] = p->dil[0] = p->dil[1] = 1;
  if (adaptive) {
    int64_t os[2] = {1, 1};
    if (const_ints(&a[1], nd, true, os) != 0) {
      snprintf(why, n, "%s's output_size must be a constant integer or a list of %d integers or "
               "None", nm, nd);
      return GROVE_E_SPEC;
    }
    p->osize[0] = nd == 2 ? os[0] : 1;
    p->osize[1] = os[1];
    if (mx && a[2].kind != A_NONE && a[2].i) {
      snprintf(why, n, "%s(return_indices=True) returns (values, indices); Grove serves the "
               "values only", nm);
      return GROVE_E_UNSUPPORTED;
    }
    return GROVE_OK;
  }
  /* (input, kernel_size, stride, padding, then max: dilation, ceil_mode,
   * return_indices; avg: ceil_mode, count_include_pad, divisor_override). */
  int64_t k[2], st[2], pd[2] = {0, 0}, dl[2] = {1, 1};
  const char *bad = NULL;
  if (const_ints(&a[1], nd, false, k) != 0) bad = "kernel_size";
  int r = bad ? 0 : const_ints(&a[2], nd, false, st);
  if (r < 0) bad = "stride";
  if (r == 1) memcpy(st, k, sizeof st);
  if (!bad && const_ints(&a[3], nd, false, pd) < 0) bad = "padding";
  if (!bad && mx && const_ints(&a[4], nd, false, dl) < 0) bad = "dilation";
  if (bad) {
    snprintf(why, n, "%s's %s must be a constant integer or a list of %d", nm, bad, nd);
    return GROVE_E_SPEC;
  }
  const int ceil_at = mx ? 5 : 4;
  p->ceil_mode = a[ceil_at].kind != A_NONE && a[ceil_at].i != 0;
  if (mx && a[6].kind != A_NONE && a[6].i) {
    snprintf(why, n, "%s(return_indices=True) returns (values, indices); Grove serves the values "
             "only", nm);
    return GROVE_E_UNSUPPORTED;
  }
  if (!mx) {
    p->count_include_pad = a[5].kind == A_NONE || a[5].i != 0;
    if (nd == 2 && a[6].kind != A_NONE) {
      if (a[6].kind != A_INT || a[6].i <= 0) {
        snprintf(why, n, "%s's divisor_override must be a positive integer or None", nm);
        return GROVE_E_SPEC;
      }
      p->divisor = a[6].i;
    }
  }
  for (int dd = 0; dd < 2; dd++) {
    const bool used = nd == 2 || dd == 1;
    p->k[dd] = used ? k[dd] : 1;
    p->stride[dd] = used ? st[dd] : 1;
    p->pad[dd] = used ? pd[dd] : 0;
    p->dil[dd] = used ? dl[dd] : 1;
  }
  return GROVE_OK;
}

/* Whether size argument a is computed in forward (global pooling written
 * by hand: F.avg_pool2d(x, x.shape[2:]), (x.size(2), x.size(3))). */
static bool computed(const garg *a) {
  if (a->kind == A_NODE) return true;
  for (int i = 0; a->kind == A_LIST && i < a->n; i++)
    if (a->items[i].kind == A_NODE) return true;
  return false;
}

static bool any_computed(const grove__opdef *d, const garg *a) {
  for (int k = 1; k < grove__op_nparams(d); k++)
    if (d->p[k].kind == P_INTS && computed(&a[k])) return true;
  return false;
}

static grove_status pool_check(const grove__opdef *d, const garg *a, const char *jp,
                               grove_err *err) {
  /* Computed sizes are known only in forward, which checks them all alike. */
  if (any_computed(d, a)) return GROVE_OK;
  grove__pool p;
  char why[200];
  grove_status s = pool_from_args(d, a, &p, why, sizeof why);
  if (s) return grove_err_set(err, s, "%s: %s", jp, why);
  grove_err e = {0};
  if (grove__pool_check(d->name, &p, &e)) return grove_err_set(err, GROVE_E_SPEC, "%s: %s", jp, e.msg);
  return GROVE_OK;
}

static grove_status pool_fwd(const grove__opctx *c, gval *res) {
  const grove_tensor *x;
  grove_status s;
  if ((s = grove__op_tensor(c, 0, &x))) return s;
  grove__pool p;
  char why[200];
  const char *T = grove__op_label(c);
  /* Computed sizes become constants for this call (lists of at most 2). */
  const int np = grove__op_nparams(c->def);
  garg rv[GROVE__OP_MAX_PARAMS], items[GROVE__OP_MAX_PARAMS][2];
  const garg *args = c->args;
  if (any_computed(c->def, c->args)) {
    memcpy(rv, c->args, (size_t)np * sizeof *rv);
    for (int k = 1; k < np; k++) {
      if (c->def->p[k].kind != P_INTS || !computed(&c->args[k])) continue;
      int64_t v[GROVE_MAX_DIMS];
      int n;
      if ((s = grove__op_ints(c, &c->args[k], true, v, &n))) return s;
      const int nd = c->def->name[strlen(c->def->name) - 2] - '0';
      if (n != 1 && n != nd)
        return grove_err_set(c->f->err, GROVE_E_INVALID_ARGUMENT,
                             "%s: %s must be one integer or a list of %d, got %d values", T,
                             c->def->p[k].name, nd, n);
      for (int i = 0; i < n; i++) items[k][i] = (garg){.kind = A_INT, .i = v[i]};
      rv[k] = (garg){.kind = A_LIST, .items = items[k], .n = n};
    }
    args = rv;
  }
  if ((s = pool_from_args(c->def, args, &p, why, sizeof why)))
    return grove_err_set(c->f->err, s, "%s", why);
  if ((s = grove__pool_check(T, &p, c->f->err))) return s;
  grove_values in = {.n = 1}, out = {0};
  in.v[0] = *x;
  if ((s = grove__pool_run(&p, T, c->f, &in, &out))) return s;
  grove__op_set_tensor(res, &out.v[0]);
  return GROVE_OK;
}

/* The parameter lists, as torch's functions take them. */
#define MAX_POOL_PARAMS                                                                  \
  {                                                                                      \
    OP_REQ("input", P_TENSOR), OP_REQ("kernel_size", P_INTS), OP_NONE("stride", P_INTS), \
        {.name = "padding", .kind = P_INTS, .dk = D_INT, .dv = 0},                       \
        {.name = "dilation", .kind = P_INTS, .dk = D_INT, .dv = 1},                      \
        OP_BOOL("ceil_mode", 0), OP_BOOL("return_indices", 0)                            \
  }
#define AVG_POOL1D_PARAMS                                                                \
  {                                                                                      \
    OP_REQ("input", P_TENSOR), OP_REQ("kernel_size", P_INTS), OP_NONE("stride", P_INTS), \
        {.name = "padding", .kind = P_INTS, .dk = D_INT, .dv = 0}, OP_BOOL("ceil_mode", 0), \
        OP_BOOL("count_include_pad", 1)                                                  \
  }
#define AVG_POOL2D_PARAMS                                                                \
  {                                                                                      \
    OP_REQ("input", P_TENSOR), OP_REQ("kernel_size", P_INTS), OP_NONE("stride", P_INTS), \
        {.name = "padding", .kind = P_INTS, .dk = D_INT, .dv = 0}, OP_BOOL("ceil_mode", 0), \
        OP_BOOL("count_include_pad", 1), OP_NONE("divisor_override", P_INT)              \
  }
#define ADAPTIVE_AVG_PARAMS \
  { OP_REQ("input", P_TENSOR), OP_REQ("output_size", P_INTS) }
#define ADAPTIVE_MAX_PARAMS \
  { OP_REQ("input", P_TENSOR), OP_REQ("output_size", P_INTS), OP_BOOL("return_indices", 0) }

/* One entry: its name (model.json's target), parameters and torch
 * spellings; every one runs pool_check and pool_fwd. */
#define POOL_ENTRY(NAME, PARAMS, ...)                   \
  const grove__opdef grove__opdef_##NAME = {            \
      .name = #NAME,                                    \
      .id = G_OP,                                       \
      .torch = (const char *const[]){__VA_ARGS__, NULL}, \
      .varargs = -1,                                    \
      .p = PARAMS,                                      \
      .check = pool_check,                              \
      .forward = pool_fwd,                              \
  }

POOL_ENTRY(max_pool1d, MAX_POOL_PARAMS,
           "torch.nn.functional.max_pool1d(input,kernel_size,stride,padding,dilation,ceil_mode,"
           "return_indices)",
           "torch.max_pool1d(input,kernel_size,stride,padding,dilation,ceil_mode)");
POOL_ENTRY(max_pool2d, MAX_POOL_PARAMS,
           "torch.nn.functional.max_pool2d(input,kernel_size,stride,padding,dilation,ceil_mode,"
           "return_indices)",
           "torch.max_pool2d(input,kernel_size,stride,padding,dilation,ceil_mode)");
POOL_ENTRY(avg_pool1d, AVG_POOL1D_PARAMS,
           "torch.nn.functional.avg_pool1d(input,kernel_size,stride,padding,ceil_mode,"
           "count_include_pad)",
           "torch.avg_pool1d(input,kernel_size,stride,padding,ceil_mode,count_include_pad)");
POOL_ENTRY(avg_pool2d, AVG_POOL2D_PARAMS,
           "torch.nn.functional.avg_pool2d(input,kernel_size,stride,padding,ceil_mode,"
           "count_include_pad,divisor_override)");
POOL_ENTRY(adaptive_avg_pool1d, ADAPTIVE_AVG_PARAMS,
           "torch.nn.functional.adaptive_avg_pool1d(input,output_size)",
           "torch.adaptive_avg_pool1d(input,output_size)");
POOL_ENTRY(adaptive_avg_pool2d, ADAPTIVE_AVG_PARAMS,
           "torch.nn.functional.adaptive_avg_pool2d(input,output_size)");
POOL_ENTRY(adaptive_max_pool1d, ADAPTIVE_MAX_PARAMS,
           "torch.nn.functional.adaptive_max_pool1d(input,output_size,return_indices)");
POOL_ENTRY(adaptive_max_pool2d, ADAPTIVE_MAX_PARAMS,
           "torch.nn.functional.adaptive_max_pool2d(input,output_size,return_indices)");
