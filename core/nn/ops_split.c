/* ops_split.c: the op entries (ops.h) of the shape operations the zoo and
 * masks need beyond ops_shape.c's: chunk, split, unbind (tuples of views),
 * stack, expand, repeat, repeat_interleave, unsqueeze, squeeze, roll, narrow and
 * index_select.
 * Kernels: shape_ops.c (tensor_ops.h). */
#include <string.h>

#include "graph_ops.h"
#include "ops.h"
#include "tensor_ops.h"

#define INPUT \
  { .name = "input", .kind = P_TENSOR, .dk = D_REQ }
#define ANY_INPUT \
  { .name = "input", .kind = P_TENSOR, .dk = D_REQ, .dtypes = 0 }

static grove_status set_parts(gval *res, const grove_tensor *ts, int n) {
  grove__op_set_tuple(res, ts, n);
  return GROVE_OK;
}

static grove_status chunk_fwd(const grove__opctx *c, gval *res) {
  const grove_tensor *x;
  grove_tensor ts[GROVE_MAX_VALUES];
  int64_t chunks, dim;
  int n;
  grove_status s;
  if ((s = grove__op_tensor(c, 0, &x)) || (s = grove__op_int(c, &c->args[1], &chunks)) ||
      (s = grove__op_int(c, &c->args[2], &dim)) ||
      (s = grove__op_chunk(c->f, x, chunks, dim, ts, GROVE_MAX_VALUES, &n)))
    return s;
  return set_parts(res, ts, n);
}

static grove_status split_fwd(const grove__opctx *c, gval *res) {
  const grove_tensor *x;
  grove_tensor ts[GROVE_MAX_VALUES];
  int64_t dim, sizes[GROVE_MAX_DIMS];
  int n, ns;
  grove_status s;
  if ((s = grove__op_tensor(c, 0, &x)) || (s = grove__op_int(c, &c->args[2], &dim))) return s;
  const garg *a = &c->args[1];
  const gval *v = grove__op_val(c, a);
  const bool one = a->kind == A_INT || (v && v->kind == V_INT);
  if (one) {
    int64_t size;
    if ((s = grove__op_int(c, a, &size)) ||
        (s = grove__op_split(c->f, x, NULL, 1, size, dim, ts, GROVE_MAX_VALUES, &n)))
      return s;
  } else if ((s = grove__op_ints(c, a, false, sizes, &ns)) ||
             (s = grove__op_split(c->f, x, sizes, ns, 0, dim, ts, GROVE_MAX_VALUES, &n))) {
    return s;
  }
  return set_parts(res, ts, n);
}

static grove_status unbind_fwd(const grove__opctx *c, gval *res) {
  const grove_tensor *x;
  grove_tensor ts[GROVE_MAX_VALUES];
  int64_t dim;
  int n;
  grove_status s;
  if ((s = grove__op_tensor(c, 0, &x)) || (s = grove__op_int(c, &c->args[1], &dim)) ||
      (s = grove__op_unbind(c->f, x, dim, ts, GROVE_MAX_VALUES, &n)))
    return s;
  return set_parts(res, ts, n);
}

static grove_status stack_fwd(const grove__opctx *c, gval *res) {
  const garg *a = c->args;
  grove_tensor ts[64], y;
  int nt = 0;
  grove_status s;
  int64_t dim;
  if ((s = grove__op_tensors(c, &a[0], ts, NULL, 64, &nt)) || (s = grove__op_int(c, &a[1], &dim)) ||
      (s = grove__op_stack(c->f, ts, nt, dim, &y)))
    return s;
  grove__op_set_tensor(res, &y);
  return GROVE_OK;
}

/* An op of (input, *ints): expand, repeat. */
static grove_status ints_op(const grove__opctx *c, gval *res, bool expand) {
  const grove_tensor *x;
  grove_tensor y;
  int64_t v[GROVE_MAX_DIMS];
  int n;
  grove_status s;
  if ((s = grove__op_tensor(c, 0, &x)) || (s = grove__op_ints(c, &c->args[1], true, v, &n)))
    return s;
  s = expand ? grove__op_expand(c->f, x, v, n, &y) : grove__op_repeat(c->f, x, v, n, &y);
  if (s) return s;
  grove__op_set_tensor(res, &y);
  return GROVE_OK;
}
static grove_status expand_fwd(const grove__opctx *c, gval *res) {
  return ints_op(c, res, true);
}
static grove_status repeat_fwd(const grove__opctx *c, gval *res) {
  return ints_op(c, res, false);
}

static grove_status unsqueeze_fwd(const grove__opctx *c, gval *res) {
  const grove_tensor *x;
  grove_tensor y;
  int64_t dim;
  grove_status s;
  if ((s = grove__op_tensor(c, 0, &x)) || (s = grove__op_int(c, &c->args[1], &dim)) ||
      (s = grove__op_unsqueeze(c->f, x, dim, &y)))
    return s;
  grove__op_set_tensor(res, &y);
  return GROVE_OK;
}

static grove_status squeeze_fwd(const grove__opctx *c, gval *res) {
  const grove_tensor *x;
  grove_tensor y;
  int64_t dim;
  grove_status s;
  if ((s = grove__op_tensor(c, 0, &x))) return s;
  const bool has = c->args[1].kind != A_NONE;
  if (has && (s = grove__op_int(c, &c->args[1], &dim))) return s;
  if ((s = grove__op_squeeze(c->f, x, has ? &dim : NULL, &y))) return s;
  grove__op_set_tensor(res, &y);
  return GROVE_OK;
}

static grove_status roll_fwd(const grove__opctx *c, gval *res) {
  const grove_tensor *x;
  grove_tensor y;
  int64_t shifts[GROVE_MAX_DIMS], dims[GROVE_MAX_DIMS];
  int ns, nd = 0;
  grove_status s;
  if ((s = grove__op_tensor(c, 0, &x)) ||
      (s = grove__op_ints(c, &c->args[1], true, shifts, &ns)))
    return s;
  if (c->args[2].kind != A_NONE && (s = grove__op_ints(c, &c->args[2], true, dims, &nd))) return s;
  if (nd != 0 && nd != ns)
    return grove_err_set(c->f->err, GROVE_E_SHAPE,
                         "roll: shifts and dimensions must align. shifts: %d, dims: %d", ns, nd);
  if (nd == 0 && ns != 1)
    return grove_err_set(c->f->err, GROVE_E_SHAPE,
                         "roll: without dims, one shift (the flattened tensor's), got %d", ns);
  if ((s = grove__op_roll(c->f, x, shifts, dims, nd, &y))) return s;
  grove__op_set_tensor(res, &y);
  return GROVE_OK;
}

static grove_status narrow_fwd(const grove__opctx *c, gval *res) {
  const grove_tensor *x;
  grove_tensor y;
  int64_t dim, start, length;
  grove_status s;
  if ((s = grove__op_tensor(c, 0, &x)) || (s = grove__op_int(c, &c->args[1], &dim)) ||
      (s = grove__op_int(c, &c->args[2], &start)) ||
      (s = grove__op_int(c, &c->args[3], &length)) ||
      (s = grove__op_narrow(c->f, x, dim, start, length, &y)))
    return s;
  grove__op_set_tensor(res, &y);
  return GROVE_OK;
}

static grove_status index_select_fwd(const grove__opctx *c, gval *res) {
  const grove_tensor *x, *ix;
  grove_tensor y;
  int64_t dim;
  grove_status s;
  if ((s = grove__op_tensor(c, 0, &x)) || (s = grove__op_int(c, &c->args[1], &dim)) ||
      (s = grove__op_tensor(c, 2, &ix)) ||
      (s = grove__op_index_select(c->f, x, dim, ix, false, &y)))
    return s;
  grove__op_set_tensor(res, &y);
  return GROVE_OK;
}

/* ------------------------------------------------------------ the entries */

#define I64S ((1u << GROVE_I64) | (1u << GROVE_I32))

const grove__opdef grove__opdef_chunk = {
    .name = "chunk",
    .id = G_OP,
    .torch = (const char *const[]){"torch.chunk(input,chunks,dim)",
                                   "Tensor.chunk(input,chunks,dim)", NULL},
    .varargs = -1,
    .p = {ANY_INPUT, OP_REQ("chunks", P_INT), OP_INT("dim", 0)},
    .forward = chunk_fwd,
};

const grove__opdef grove__opdef_split = {
    .name = "split",
    .id = G_OP,
    .torch = (const char *const[]){"torch.split(input,split_size_or_sections,dim)",
                                   "Tensor.split(input,split_size_or_sections,dim)", NULL},
    .varargs = -1,
    .p = {ANY_INPUT, OP_REQ("split_size_or_sections", P_INTS), OP_INT("dim", 0)},
    .forward = split_fwd,
};

const grove__opdef grove__opdef_unbind = {
    .name = "unbind",
    .id = G_OP,
    .torch = (const char *const[]){"torch.unbind(input,dim)", "Tensor.unbind(input,dim)", NULL},
    .varargs = -1,
    .p = {ANY_INPUT, OP_INT("dim", 0)},
    .forward = unbind_fwd,
};

const grove__opdef grove__opdef_stack = {
    .name = "stack",
    .id = G_OP,
    .torch = (const char *const[]){"torch.stack(tensors,dim)", NULL},
    .varargs = -1,
    .p = {OP_REQ("tensors", P_TENSORS), OP_INT("dim", 0)},
    .forward = stack_fwd,
};

const grove__opdef grove__opdef_expand = {
    .name = "expand",
    .id = G_OP,
    .torch = (const char *const[]){"Tensor.expand(input,*size)", NULL},
    .varargs = 1,
    .p = {ANY_INPUT, OP_REQ("size", P_INTS)},
    .forward = expand_fwd,
};

const grove__opdef grove__opdef_repeat = {
    .name = "repeat",
    .id = G_OP,
    .torch = (const char *const[]){"Tensor.repeat(input,*repeats)", NULL},
    .varargs = 1,
    .p = {ANY_INPUT, OP_REQ("repeats", P_INTS)},
    .forward = repeat_fwd,
};

const grove__opdef grove__opdef_unsqueeze = {
    .name = "unsqueeze",
    .id = G_OP,
    .torch = (const char *const[]){"torch.unsqueeze(input,dim)", "Tensor.unsqueeze(input,dim)",
                                   NULL},
    .varargs = -1,
    .p = {ANY_INPUT, OP_REQ("dim", P_INT)},
    .forward = unsqueeze_fwd,
};

const grove__opdef grove__opdef_squeeze = {
    .name = "squeeze",
    .id = G_OP,
    .torch = (const char *const[]){"torch.squeeze(input,dim)", "Tensor.squeeze(input,dim)", NULL},
    .varargs = -1,
    .p = {ANY_INPUT, OP_NONE("dim", P_INT)},
    .forward = squeeze_fwd,
};

const grove__opdef grove__opdef_roll = {
    .name = "roll",
    .id = G_OP,
    .torch = (const char *const[]){"torch.roll(input,shifts,dims)", "Tensor.roll(input,shifts,dims)",
                                   NULL},
    .varargs = -1,
    .p = {ANY_INPUT, OP_REQ("shifts", P_INTS), OP_NONE("dims", P_INTS)},
    .forward = roll_fwd,
};

const grove__opdef grove__opdef_narrow = {
    .name = "narrow",
    .id = G_OP,
    .torch = (const char *const[]){"torch.narrow(input,dim,start,length)",
                                   "Tensor.narrow(input,dim,start,length)", NULL},
    .varargs = -1,
    .p = {ANY_INPUT, OP_REQ("dim", P_INT), OP_REQ("start", P_INT), OP_REQ("length", P_INT)},
    .forward = narrow_fwd,
};

const grove__opdef grove__opdef_index_select = {
    .name = "index_select",
    .id = G_OP,
    .torch = (const char *const[]){"torch.index_select(input,dim,index)",
                                   "Tensor.index_select(input,dim,index)", NULL},
    .varargs = -1,
    .p = {ANY_INPUT, OP_REQ("dim", P_INT),
          {.name = "index", .kind = P_TENSOR, .dk = D_REQ, .dtypes = I64S}},
    .forward = index_select_fwd,
};

static grove_status flip_fwd(const grove__opctx *c, gval *res) {
  const grove_tensor *x;
  grove_tensor y;
  int64_t v[GROVE_MAX_DIMS];
  int n;
  grove_status s;
  if ((s = grove__op_tensor(c, 0, &x)) || (s = grove__op_ints(c, &c->args[1], true, v, &n)) ||
      (s = grove__op_flip(c->f, x, v, n, &y)))
    return s;
  grove__op_set_tensor(res, &y);
  return GROVE_OK;
}

static grove_status gather_fwd(const grove__opctx *c, gval *res) {
  const grove_tensor *x, *ix;
  grove_tensor y;
  int64_t dim;
  grove_status s;
  if ((s = grove__op_tensor(c, 0, &x)) || (s = grove__op_int(c, &c->args[1], &dim)) ||
      (s = grove__op_tensor(c, 2, &ix)) || (s = grove__op_gather(c->f, x, dim, ix, &y)))
    return s;
  grove__op_set_tensor(res, &y);
  return GROVE_OK;
}

static grove_status one_hot_fwd(const grove__opctx *c, gval *res) {
  const grove_tensor *x;
  grove_tensor y;
  int64_t k;
  grove_status s;
  if ((s = grove__op_tensor(c, 0, &x)) || (s = grove__op_int(c, &c->args[1], &k)) ||
      (s = grove__op_one_hot(c->f, x, k, &y)))
    return s;
  grove__op_set_tensor(res, &y);
  return GROVE_OK;
}

static grove_status sparse_grad_check(const grove__opdef *d, const garg *a, const char *jp,
                                      grove_err *err) {
  if (a[3].kind == A_BOOL && a[3].i)
    return grove_err_set(err, GROVE_E_UNSUPPORTED,
                         "%s: gather with sparse_grad=True is not supported", jp);
  return GROVE_OK;
}

const grove__opdef grove__opdef_flip = {
    .name = "flip",
    .id = G_OP,
    .torch = (const char *const[]){"torch.flip(input,dims)", "Tensor.flip(input,*dims)", NULL},
    .varargs = 1,
    .p = {ANY_INPUT, OP_REQ("dims", P_INTS)},
    .forward = flip_fwd,
};

const grove__opdef grove__opdef_gather = {
    .name = "gather",
    .id = G_OP,
    .torch = (const char *const[]){"torch.gather(input,dim,index,sparse_grad)",
                                   "Tensor.gather(input,dim,index,sparse_grad)", NULL},
    .varargs = -1,
    .p = {ANY_INPUT, OP_REQ("dim", P_INT), OP_REQ("index", P_TENSOR), OP_BOOL("sparse_grad", 0)},
    .check = sparse_grad_check,
    .forward = gather_fwd,
};

const grove__opdef grove__opdef_one_hot = {
    .name = "one_hot",
    .id = G_OP,
    .torch = (const char *const[]){"torch.nn.functional.one_hot(input,num_classes)", NULL},
    .varargs = -1,
    .p = {ANY_INPUT, OP_INT("num_classes", -1)},
    .forward = one_hot_fwd,
};

/* ------------------------------------------------------------ repeat_interleave */

/* repeat_interleave(input, repeats, dim) with an int repeats: each element
 * r times along dim (every element of the flattened input when dim is
 * None), as x.unsqueeze(dim + 1) expanded to r along the new dim and
 * reshaped to r times the dim (the reshape copies); a tensor of repeats is
 * refused. */
static grove_status repeat_interleave_fwd(const grove__opctx *c, gval *res) {
  const grove_tensor *x0;
  grove_tensor x, u, rep, y;
  int64_t r, d64 = 0;
  grove_status s;
  if ((s = grove__op_tensor(c, 0, &x0))) return s;
  const gval *rv = grove__op_val(c, &c->args[1]);
  if (rv && rv->kind == V_TENSOR)
    return grove_err_set(c->f->err, GROVE_E_UNSUPPORTED,
                         "repeat_interleave: a tensor of repeats is not supported (only an int)");
  if ((s = grove__op_int(c, &c->args[1], &r))) return s;
  if (r < 0)
    return grove_err_set(c->f->err, GROVE_E_INVALID_ARGUMENT,
                         "repeat_interleave: repeats must be non-negative, got %lld", (long long)r);
  x = *x0;
  if (c->args[2].kind == A_NONE) {
    const int64_t flat[1] = {grove_tensor_numel(x0)};
    if ((s = grove__op_reshape(c->f, x0, flat, 1, &x))) return s;
  } else if ((s = grove__op_int(c, &c->args[2], &d64))) {
    return s;
  }
  int dim;
  if (!grove__op_wrap_dim(d64, x.ndim, &dim))
    return grove__op_dim_error(c->f, "repeat_interleave", "dim", d64, x.ndim);
  if (x.shape[dim] && r > INT64_MAX / x.shape[dim])
    return grove_err_set(c->f->err, GROVE_E_INVALID_ARGUMENT,
                         "repeat_interleave: %lld repeats of a dim of %lld overflow", (long long)r,
                         (long long)x.shape[dim]);
  int64_t sizes[GROVE_MAX_DIMS], shape[GROVE_MAX_DIMS];
  if (x.ndim + 1 > GROVE_MAX_DIMS)
    return grove_err_set(c->f->err, GROVE_E_SHAPE, "repeat_interleave: at most %d dims",
                         GROVE_MAX_DIMS - 1);
  for (int i = 0; i <= x.ndim; i++)
    sizes[i] = i == dim + 1 ? r : i <= dim ? x.shape[i] : x.shape[i - 1];
  for (int i = 0; i < x.ndim; i++) shape[i] = i == dim ? x.shape[i] * r : x.shape[i];
  if ((s = grove__op_unsqueeze(c->f, &x, dim + 1, &u)) ||
      (s = grove__op_expand(c->f, &u, sizes, x.ndim + 1, &rep)) ||
      (s = grove__op_reshape(c->f, &rep, shape, x.ndim, &y))) {
    grove_err_prefix(c->f->err, "repeat_interleave");
    return s;
  }
  grove__op_set_tensor(res, &y);
  return GROVE_OK;
}

const grove__opdef grove__opdef_repeat_interleave = {
    .name = "repeat_interleave",
    .id = G_OP,
    .torch = (const char *const[]){"torch.repeat_interleave(input,repeats,dim)",
                                   "Tensor.repeat_interleave(input,repeats,dim)", NULL},
    .varargs = -1,
    .p = {ANY_INPUT,
          {.name = "repeats", .kind = P_ANY, .dk = D_REQ},
          OP_NONE("dim", P_INT),
          OP_NONE("output_size", P_INT)},
    .forward = repeat_interleave_fwd,
};
