/* ops_reduce.c: the reductions mean and sum (torch.mean, torch.sum and the
 * Tensor methods): their entries (ops.h) and forwards; the kernel is
 * graph_ops.c's grove__op_reduce. */
#include "graph_ops.h"
#include "ops.h"

static grove_status reduce_fwd(const grove__opctx *c, gval *res) {
  const garg *a = c->args;
  const grove_tensor *x;
  grove_tensor y;
  int64_t ints[GROVE_MAX_DIMS];
  int ni = -1;
  grove_status s;
  if ((s = grove__op_tensor(c, 0, &x))) return s;
  if (a[1].kind != A_NONE && (s = grove__op_ints(c, &a[1], true, ints, &ni))) return s;
  if ((s = grove__op_reduce(c->f, c->def->id == G_MEAN, x, ints, ni, a[2].i != 0, &y))) return s;
  grove__op_set_tensor(res, &y);
  return GROVE_OK;
}

static grove_status reduce_check(const grove__opdef *d, const garg *a, const char *jp,
                                 grove_err *err) {
  if (a[3].kind != A_NONE)
    return grove_err_set(err, GROVE_E_UNSUPPORTED, "%s: %s with a dtype is not supported", jp,
                         d->name);
  if (a[2].kind != A_BOOL && a[2].kind != A_INT)
    return grove__op_want_const(d, jp, 2, "true or false (keepdim)", err);
  return GROVE_OK;
}

#define REDUCE_PARAMS                                                             \
  {                                                                               \
    OP_REQ("input", P_TENSOR), OP_NONE("dim", P_INTS), OP_BOOL("keepdim", 0), \
        OP_NONE("dtype", P_DTYPE)                                                 \
  }

const grove__opdef grove__opdef_mean = {
    .name = "mean",
    .id = G_MEAN,
    .torch = (const char *const[]){"torch.mean(input,dim,keepdim,dtype)",
                                   "Tensor.mean(input,dim,keepdim,dtype)", NULL},
    .varargs = -1,
    .p = REDUCE_PARAMS,
    .check = reduce_check,
    .forward = reduce_fwd,
};

const grove__opdef grove__opdef_sum = {
    .name = "sum",
    .id = G_SUM,
    .torch = (const char *const[]){"torch.sum(input,dim,keepdim,dtype)",
                                   "Tensor.sum(input,dim,keepdim,dtype)", NULL},
    .varargs = -1,
    .p = REDUCE_PARAMS,
    .check = reduce_check,
    .forward = reduce_fwd,
};
