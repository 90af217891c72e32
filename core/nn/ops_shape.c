/* ops_shape.c: the shape operations: flatten (and the Flatten module),
 * reshape, view, permute, transpose, cat, contiguous, and what a graph reads
 * off values: getitem (tensor indexing, tuple and size indexing), size and
 * getattr (.shape, .ndim, .device, .dtype).  Their entries (ops.h) and forwards; the kernels
 * are graph_ops.c's.  Views (reshape of a contiguous input, permute,
 * transpose, indexing, flatten) share their input's memory. */
#include <inttypes.h>
#include <string.h>

#include "graph_ops.h"
#include "layers_internal.h"
#include "ops.h"
#include "tensor_ops.h"

#define INPUT \
  { .name = "input", .kind = P_TENSOR, .dk = D_REQ }

/* ------------------------------------------------------------ flatten */

int grove__flatten_shape(const grove_tensor *x, int sd, int ed, int64_t *shape) {
  int nd = 0;
  if (x->ndim == 0) {
    shape[nd++] = 1;
    return nd;
  }
  int64_t merged = 1;
  for (int i = 0; i < x->ndim; i++) {
    if (i < sd || i > ed) {
      shape[nd++] = x->shape[i];
    } else {
      merged *= x->shape[i];
      if (i == ed) shape[nd++] = merged;
    }
  }
  return nd;
}

int64_t grove__softmax_dim(bool has_dim, int64_t dim, int ndim) {
  return has_dim ? dim : (ndim == 0 || ndim == 1 || ndim == 3) ? 0 : 1;
}

/* torch.flatten: a view of the (contiguous) input with dims start..end
 * merged into one.  No data moves unless the input was strided. */
static grove_status flatten_fwd(const grove__opctx *c, gval *res) {
  const char *layer = grove__op_label(c);
  const grove_tensor *xa;
  grove_status s = grove__op_tensor(c, 0, &xa);
  if (s) return s;
  grove_values in = {.n = 1};
  in.v[0] = *xa;
  grove_tensor x;
  if ((s = grove__layer_input(layer, c->f, &in, GROVE_DTYPE_COUNT, &x)) != GROVE_OK) return s;
  const int64_t start = c->args[1].i, end = c->args[2].i;
  int sd, ed;
  if (!grove__op_wrap_dim(start, x.ndim, &sd))
    return grove__op_dim_error(c->f, layer, "start_dim", start, x.ndim);
  if (!grove__op_wrap_dim(end, x.ndim, &ed))
    return grove__op_dim_error(c->f, layer, "end_dim", end, x.ndim);
  if (sd > ed)
    return grove_err_set(c->f->err, GROVE_E_SHAPE,
                         "%s: start_dim %" PRId64 " comes after end_dim %" PRId64
                         " for a %d-d input",
                         layer, start, end, x.ndim);
  int64_t shape[GROVE_MAX_DIMS];
  const int nd = grove__flatten_shape(&x, sd, ed, shape);
  grove_tensor y;
  grove_tensor_init(&y, x.dtype, nd, shape, x.data);
  grove__op_set_tensor(res, &y);
  return GROVE_OK;
}

static bool is_int_const(const garg *a) {
  return a->kind == A_INT || a->kind == A_BOOL;
}

static grove_status flatten_check(const grove__opdef *d, const garg *a, const char *jp,
                                  grove_err *err) {
  if (!is_int_const(&a[1]) || !is_int_const(&a[2]) || a[1].i < -GROVE_MAX_DIMS ||
      a[1].i >= GROVE_MAX_DIMS || a[2].i < -GROVE_MAX_DIMS || a[2].i >= GROVE_MAX_DIMS)
    return grove__op_want_const(d, jp, 1, "an integer constant (start_dim, end_dim)", err);
  return GROVE_OK;
}

const grove_module_type grove__flatten_type = {
    .name = "Flatten", .forward = grove__op_module_forward, .free_impl = grove__op_module_free};

#define DIM_ARG(n, v) \
  { .name = n, .kind = P_INT, .dk = D_INT, .dv = v, .min = -GROVE_MAX_DIMS, .max = GROVE_MAX_DIMS - 1 }

const grove__opdef grove__opdef_flatten = {
    .name = "flatten",
    .id = G_FLATTEN,
    .torch = (const char *const[]){"torch.flatten(input,start_dim,end_dim)",
                                   "Tensor.flatten(input,start_dim,end_dim)", NULL},
    .varargs = -1,
    .p = {INPUT, DIM_ARG("start_dim", 0), DIM_ARG("end_dim", -1)},
    .check = flatten_check,
    .forward = flatten_fwd,
    /* nn.Flatten keeps the batch dim: start_dim=1, where torch.flatten's is 0. */
    .module = &(const grove__opmod){.cls = "Flatten", .type = &grove__flatten_type, .args = {DIM_ARG("start_dim", 1), DIM_ARG("end_dim", -1)}},
};

grove_status grove_flatten_new(int start_dim, int end_dim, grove_module **out, grove_err *err) {
  const garg a[2] = {{.kind = A_INT, .i = start_dim}, {.kind = A_INT, .i = end_dim}};
  return grove__op_module_new(&grove__opdef_flatten, grove__opdef_flatten.module, a, 2, out, err);
}

/* Tensor.unflatten(dim, sizes) / nn.Unflatten: dimension dim becomes sizes
 * (one of them may be -1), a view as torch gives it. */
static grove_status unflatten_fwd(const grove__opctx *c, gval *res) {
  const char *layer = grove__op_label(c);
  const grove_tensor *xa;
  int64_t dim, sizes[GROVE_MAX_DIMS];
  int ns;
  grove_status s;
  if ((s = grove__op_tensor(c, 0, &xa)) || (s = grove__op_int(c, &c->args[1], &dim)) ||
      (s = grove__op_ints(c, &c->args[2], true, sizes, &ns)))
    return s;
  grove_tensor x;
  if ((s = grove__fwd_contig(c->f, xa, &x))) return s;
  int d;
  if (!grove__op_wrap_dim(dim, x.ndim, &d))
    return grove__op_dim_error(c->f, layer, "dim", dim, x.ndim);
  char b[128], b2[128];
  if (ns < 1 || x.ndim - 1 + ns > GROVE_MAX_DIMS)
    return grove_err_set(c->f->err, GROVE_E_SHAPE,
                         "%s: unflattened_size must have 1 to %d sizes for a %d-d input, got %d",
                         layer, GROVE_MAX_DIMS - x.ndim + 1, x.ndim, ns);
  int64_t known = 1;
  int infer = -1;
  for (int k = 0; k < ns; k++) {
    if (sizes[k] == -1 && infer < 0) {
      infer = k;
    } else if (sizes[k] < 0) {
      infer = -2;
      break;
    } else if (__builtin_mul_overflow(known, sizes[k], &known)) {
      infer = -2;
      break;
    }
  }
  const int64_t n = x.shape[d];
  bool ok = infer != -2;
  if (ok && infer >= 0) {
    ok = known > 0 && n % known == 0;
    if (ok) sizes[infer] = n / known;
  } else if (ok) {
    ok = known == n;
  }
  if (!ok)
    return grove_err_set(c->f->err, GROVE_E_SHAPE,
                         "%s: unflatten: provided sizes %s don't multiply up to the size of dim "
                         "%d (%lld) in the input tensor %s",
                         layer, grove_shape_str(ns, sizes, b, sizeof b), d, (long long)n,
                         grove_shape_str(x.ndim, x.shape, b2, sizeof b2));
  int64_t shape[GROVE_MAX_DIMS];
  int nd = 0;
  for (int k = 0; k < d; k++) shape[nd++] = x.shape[k];
  for (int k = 0; k < ns; k++) shape[nd++] = sizes[k];
  for (int k = d + 1; k < x.ndim; k++) shape[nd++] = x.shape[k];
  grove_tensor y;
  grove_tensor_init(&y, x.dtype, nd, shape, x.data);
  grove__op_set_tensor(res, &y);
  return GROVE_OK;
}

GROVE__OP_MODULE_TYPE(grove__unflatten_type, "Unflatten");

const grove__opdef grove__opdef_unflatten = {
    .name = "unflatten",
    .id = G_OP,
    .torch = (const char *const[]){"Tensor.unflatten(input,dim,sizes)",
                                   "torch.unflatten(input,dim,sizes)", NULL},
    .varargs = -1,
    .p = {INPUT, OP_REQ("dim", P_INT), OP_REQ("sizes", P_INTS)},
    .forward = unflatten_fwd,
    .module = &(const grove__opmod){.cls = "Unflatten",
                                    .type = &grove__unflatten_type,
                                    .args = {{.name = "dim",
                                              .kind = P_INT,
                                              .dk = D_REQ,
                                              .min = -GROVE_MAX_DIMS,
                                              .max = GROVE_MAX_DIMS - 1},
                                             {.name = "sizes",
                                              .key = "unflattened_size",
                                              .kind = P_INTS,
                                              .dk = D_REQ,
                                              .min = -1,
                                              .max = (double)INT64_MAX}}},
};

/* ------------------------------------------------------------ views */

/* reshape / view (a shape) and permute (dims): a tensor and a list of ints. */
static grove_status ints_view_fwd(const grove__opctx *c, gval *res) {
  const grove_tensor *x;
  grove_tensor y;
  int64_t ints[GROVE_MAX_DIMS];
  int ni;
  grove_status s;
  if ((s = grove__op_tensor(c, 0, &x)) || (s = grove__op_ints(c, &c->args[1], true, ints, &ni)))
    return s;
  s = c->def->id == G_PERMUTE ? grove__op_permute(c->f, x, ints, ni, &y)
                              : grove__op_reshape(c->f, x, ints, ni, &y);
  if (s) return s;
  grove__op_set_tensor(res, &y);
  return GROVE_OK;
}

/* x.view_as(other), x.reshape_as(other), x.expand_as(other): view,
 * reshape and expand to other's shape (other's values are not read, so
 * its dtype is any). */
static grove_status as_fwd(const grove__opctx *c, gval *res) {
  const grove_tensor *x, *o;
  grove_tensor y;
  grove_status s;
  if ((s = grove__op_tensor(c, 0, &x)) || (s = grove__op_tensor(c, 1, &o))) return s;
  s = strcmp(c->def->name, "expand_as") == 0 ? grove__op_expand(c->f, x, o->shape, o->ndim, &y)
                                             : grove__op_reshape(c->f, x, o->shape, o->ndim, &y);
  if (s) return s;
  grove__op_set_tensor(res, &y);
  return GROVE_OK;
}

static grove_status transpose_fwd(const grove__opctx *c, gval *res) {
  const grove_tensor *x;
  grove_tensor y;
  int64_t d0, d1;
  grove_status s;
  if ((s = grove__op_tensor(c, 0, &x)) || (s = grove__op_int(c, &c->args[1], &d0)) ||
      (s = grove__op_int(c, &c->args[2], &d1)) || (s = grove__op_transpose(c->f, x, d0, d1, &y)))
    return s;
  grove__op_set_tensor(res, &y);
  return GROVE_OK;
}

static grove_status contiguous_fwd(const grove__opctx *c, gval *res) {
  const grove_tensor *x;
  grove_tensor y;
  grove_status s;
  if ((s = grove__op_tensor(c, 0, &x)) || (s = grove__fwd_contig(c->f, x, &y))) return s;
  grove__op_set_tensor(res, &y);
  return GROVE_OK;
}

#define SHAPE_VARARG(n) \
  { .name = n, .kind = P_INTS, .dk = D_REQ }

const grove__opdef grove__opdef_reshape = {
    .name = "reshape",
    .id = G_RESHAPE,
    .torch = (const char *const[]){"torch.reshape(input,shape)", "Tensor.reshape(input,*shape)",
                                   NULL},
    .varargs = 1,
    .p = {INPUT, SHAPE_VARARG("shape")},
    .forward = ints_view_fwd,
};

const grove__opdef grove__opdef_view = {
    .name = "view",
    .id = G_VIEW,
    .torch = (const char *const[]){"Tensor.view(input,*shape)", NULL},
    .varargs = 1,
    .p = {INPUT, SHAPE_VARARG("shape")},
    .forward = ints_view_fwd,
};

#define AS_OP(n)                                                          \
  const grove__opdef grove__opdef_##n = {                                 \
      .name = #n,                                                         \
      .id = G_OP,                                                         \
      .torch = (const char *const[]){"Tensor." #n "(input,other)", NULL}, \
      .varargs = -1,                                                      \
      .p = {{.name = "input", .kind = P_TENSOR, .dk = D_REQ},             \
            {.name = "other", .kind = P_TENSOR, .dk = D_REQ}},            \
      .forward = as_fwd,                                                  \
  }
AS_OP(view_as);
AS_OP(reshape_as);
AS_OP(expand_as);

const grove__opdef grove__opdef_permute = {
    .name = "permute",
    .id = G_PERMUTE,
    .torch = (const char *const[]){"torch.permute(input,dims)", "Tensor.permute(input,*dims)",
                                   NULL},
    .varargs = 1,
    .p = {INPUT, SHAPE_VARARG("dims")},
    .forward = ints_view_fwd,
};

const grove__opdef grove__opdef_transpose = {
    .name = "transpose",
    .id = G_TRANSPOSE,
    .torch =
        (const char *const[]){
            "torch.transpose(input,dim0,dim1)", "Tensor.transpose(input,dim0,dim1)",
            /* numpy's names (MaxViT's SwapAxes), bound by position */
            "torch.swapaxes(input,dim0,dim1)", "Tensor.swapaxes(input,dim0,dim1)",
            "torch.swapdims(input,dim0,dim1)", "Tensor.swapdims(input,dim0,dim1)", NULL},
    .varargs = -1,
    .p = {INPUT, OP_REQ("dim0", P_INT), OP_REQ("dim1", P_INT)},
    .forward = transpose_fwd,
};

/* x.clone(), x.detach(): x itself (a graph never writes over a value
 * another node reads, graph.c; detach changes nothing when serving). */
static grove_status same_fwd(const grove__opctx *c, gval *res) {
  const grove_tensor *x;
  grove_status s = grove__op_tensor(c, 0, &x);
  if (s) return s;
  grove__op_set_tensor(res, x);
  return GROVE_OK;
}

/* x.t(): transpose(0, 1) of a 2-d x, x itself below 2 dims, as torch. */
static grove_status t_fwd(const grove__opctx *c, gval *res) {
  const grove_tensor *x;
  grove_tensor y;
  grove_status s = grove__op_tensor(c, 0, &x);
  if (s) return s;
  if (x->ndim > 2)
    return grove_err_set(c->f->err, GROVE_E_SHAPE,
                         "t: expects a tensor with <= 2 dimensions, "
                         "but self is %d-d",
                         x->ndim);
  if (x->ndim < 2) return same_fwd(c, res);
  if ((s = grove__op_transpose(c->f, x, 0, 1, &y))) return s;
  grove__op_set_tensor(res, &y);
  return GROVE_OK;
}

const grove__opdef grove__opdef_clone = {
    .name = "clone",
    .id = G_OP,
    .torch = (const char *const[]){"torch.clone(input,memory_format)",
                                   "Tensor.clone(input,memory_format)", NULL},
    .varargs = -1,
    .p = {INPUT, OP_NONE("memory_format", P_IGNORED)},
    .forward = same_fwd,
};

const grove__opdef grove__opdef_detach = {
    .name = "detach",
    .id = G_OP,
    .torch = (const char *const[]){"torch.detach(input)", "Tensor.detach(input)", NULL},
    .varargs = -1,
    .p = {INPUT},
    .forward = same_fwd,
};

const grove__opdef grove__opdef_t = {
    .name = "t",
    .id = G_OP,
    .torch = (const char *const[]){"torch.t(input)", "Tensor.t(input)", NULL},
    .varargs = -1,
    .p = {INPUT},
    .forward = t_fwd,
};

const grove__opdef grove__opdef_contiguous = {
    .name = "contiguous",
    .id = G_CONTIGUOUS,
    .torch = (const char *const[]){"Tensor.contiguous(input,memory_format)", NULL},
    .varargs = -1,
    .p = {INPUT, OP_NONE("memory_format", P_IGNORED)},
    .forward = contiguous_fwd,
};

/* ------------------------------------------------------------ cat */

static grove_status cat_fwd(const grove__opctx *c, gval *res) {
  grove_tensor ts[64], y;
  int nt;
  int64_t dim;
  grove_status s;
  if ((s = grove__op_tensors(c, &c->args[0], ts, NULL, 64, &nt)) ||
      (s = grove__op_int(c, &c->args[1], &dim)) || (s = grove__op_cat(c->f, ts, nt, dim, &y)))
    return s;
  grove__op_set_tensor(res, &y);
  return GROVE_OK;
}

static grove_status cat_check(const grove__opdef *d, const garg *a, const char *jp,
                              grove_err *err) {
  if (a[0].kind != A_LIST && a[0].kind != A_NODE)
    return grove__op_want_const(d, jp, 0, "a list of tensors", err);
  return GROVE_OK;
}

const grove__opdef grove__opdef_cat = {
    .name = "cat",
    .alias = "concat",
    .id = G_CAT,
    .torch = (const char *const[]){"torch.cat(tensors,dim)", "torch.concat(tensors,dim)", NULL},
    .varargs = -1,
    .p = {OP_REQ("tensors", P_TENSORS), OP_INT("dim", 0)},
    .check = cat_check,
    .forward = cat_fwd,
};

/* ------------------------------------------------------------ getitem */

static grove_status slice_of(const grove__opctx *c, const garg *e, grove__index *o) {
  grove_status s;
  o->kind = GROVE__IX_SLICE;
  o->step = 1;
  if (e->items[0].kind != A_NONE && (s = grove__op_int(c, &e->items[0], &o->start))) return s;
  if (e->items[1].kind != A_NONE && (s = grove__op_int(c, &e->items[1], &o->stop))) return s;
  if (e->items[2].kind != A_NONE && (s = grove__op_int(c, &e->items[2], &o->step))) return s;
  if (o->step < 1)
    return grove_err_set(c->f->err, GROVE_E_UNSUPPORTED, "slice step must be positive");
  o->has_start = e->items[0].kind != A_NONE;
  o->has_stop = e->items[1].kind != A_NONE;
  return GROVE_OK;
}

/* x[i] of a tuple that ends in a tuple (gval.nest: an LSTM's (output, (h_n,
 * c_n))): a tensor of the top level, or the inner tuple. */
static grove_status getitem_nested(const grove__opctx *c, const gval *v, const garg *ix,
                                   gval *res) {
  const int len = v->nest + 1;
  int64_t k;
  grove_status s = ix->kind == A_SLICE ? grove_err_set(c->f->err, GROVE_E_UNSUPPORTED,
                                                       "slicing a nested tuple is not supported")
                                       : grove__op_int(c, ix, &k);
  if (s) return s;
  if (k < 0) k += len;
  if (k < 0 || k >= len)
    return grove_err_set(c->f->err, GROVE_E_RANGE, "tuple index out of range (%d elements)", len);
  if (k < v->nest) {
    grove__op_set_tensor(res, &v->t[k]);
    return GROVE_OK;
  }
  *res = *v;
  res->nest = 0;
  res->n = (int8_t)(v->n - v->nest);
  for (int j = 0; j < GROVE_MAX_VALUES; j++) {
    res->t[j] = j < res->n ? v->t[v->nest + j] : (grove_tensor){0};
    res->reg[j] = j < res->n ? v->reg[v->nest + j] : -1;
  }
  res->none_mask = (uint8_t)(v->none_mask >> v->nest);
  return GROVE_OK;
}

/* x[i] / x[a:b] of a tuple (a module's) or of a size. */
static grove_status getitem_seq(const grove__opctx *c, const gval *v, const garg *ix, gval *res) {
  const int len = v->n;
  grove_status s;
  if (v->kind == V_TUPLE && v->nest > 0) return getitem_nested(c, v, ix, res);
  if (ix->kind == A_SLICE) {
    grove__index e = {0};
    if ((s = slice_of(c, ix, &e))) return s;
    int64_t first, count;
    grove__slice_indices(len, &e, &first, &count);
    *res = *v;
    res->n = (int8_t)count;
    res->none_mask = 0;
    for (int64_t k = 0; k < count; k++) {
      int64_t from = first + k * e.step;
      if (v->kind == V_INTS) {
        res->ints[k] = v->ints[from];
      } else {
        res->t[k] = v->t[from];
        res->reg[k] = v->reg[from];
        if (v->none_mask & (1u << from)) res->none_mask |= (uint8_t)(1u << k);
      }
    }
    for (int64_t k = count; k < GROVE_MAX_VALUES; k++) res->reg[k] = -1;
    return GROVE_OK;
  }
  int64_t k;
  if ((s = grove__op_int(c, ix, &k))) return s;
  if (k < 0) k += len;
  if (k < 0 || k >= len)
    return grove_err_set(c->f->err, GROVE_E_RANGE, "tuple index out of range (%d elements)", len);
  if (v->kind == V_INTS) {
    grove__op_set_int(res, v->ints[k]);
  } else if (v->none_mask & (1u << k)) {
    res->kind = V_NONE;
  } else {
    grove__op_set_tensor(res, &v->t[k]);
    res->reg[0] = v->reg[k]; /* the evaluator's handle travels with the tensor */
  }
  return GROVE_OK;
}

grove_status grove__op_index_list(const grove__opctx *c, const garg *ix, grove__index *ixs,
                                  int *n, const grove_tensor **ids_out, int *ids_at_out) {
  const garg *items = ix->kind == A_LIST ? ix->items : ix;
  int ni = ix->kind == A_LIST ? ix->n : 1;
  if (ni > GROVE_MAX_DIMS + 4) return grove__op_want(c, "fewer indices");
  /* One integer tensor among slices (x[ids], x[:, ids], Swin's
   * table[index]): the slices as a view, then the ids along their dim.
   * A caller without ids_out (training) refuses tensor indices below. */
  const grove_tensor *ids = NULL;
  int ids_at = -1;
  for (int i = 0; i < ni && ids_out; i++) {
    const gval *ev = grove__op_val(c, &items[i]);
    if (!ev || ev->kind != V_TENSOR) continue;
    const grove_dtype dt = ev->t[0].dtype;
    bool slices_only = ids == NULL;
    for (int k = 0; k < ni && slices_only; k++) slices_only = k == i || items[k].kind == A_SLICE;
    if (!slices_only || (dt != GROVE_I64 && dt != GROVE_I32))
      return grove_err_set(c->f->err, GROVE_E_UNSUPPORTED,
                           "indexing with a tensor is supported for one int64 index tensor among "
                           "slices (x[ids], x[:, ids]); got a %s tensor%s",
                           grove_dtype_name(dt), slices_only ? "" : " with other indices");
    ids = &ev->t[0];
    ids_at = i;
  }
  for (int i = 0; i < ni; i++) {
    if (i == ids_at) {
      memset(&ixs[i], 0, sizeof ixs[i]);
      ixs[i].kind = GROVE__IX_SLICE;
      ixs[i].step = 1;
      continue;
    }
    const garg *e = &items[i];
    grove__index *o = &ixs[i];
    memset(o, 0, sizeof *o);
    grove_status s;
    if (e->kind == A_NONE) {
      o->kind = GROVE__IX_NONE;
    } else if (e->kind == A_ELLIPSIS) {
      o->kind = GROVE__IX_ELLIPSIS;
    } else if (e->kind == A_SLICE) {
      if ((s = slice_of(c, e, o))) return s;
    } else {
      const gval *ev = grove__op_val(c, e);
      if (ev && ev->kind == V_TENSOR)
        return grove_err_set(c->f->err, GROVE_E_UNSUPPORTED,
                             "indexing with a tensor (advanced indexing) is not supported");
      o->kind = GROVE__IX_INT;
      if ((s = grove__op_int(c, e, &o->start))) return s;
    }
  }
  *n = ni;
  if (ids_out) {
    *ids_out = ids;
    *ids_at_out = ids_at;
  }
  return GROVE_OK;
}

static grove_status getitem_fwd(const grove__opctx *c, gval *res) {
  const gval *v = grove__op_val(c, &c->args[0]);
  const garg *ix = &c->args[1];
  if (!v) return grove__op_want(c, "a tensor, a tuple or a size to index");
  if (v->kind == V_TUPLE || v->kind == V_INTS) return getitem_seq(c, v, ix, res);
  if (v->kind != V_TENSOR) return grove__op_want(c, "a tensor, a tuple or a size to index");
  grove__index ixs[GROVE_MAX_DIMS + 4];
  int ni, ids_at;
  const grove_tensor *ids;
  grove_status s = grove__op_index_list(c, ix, ixs, &ni, &ids, &ids_at);
  if (s) return s;
  grove_tensor y, z;
  if ((s = grove__op_index(c->f, &v->t[0], ixs, ni, &y))) return s;
  if (ids) {
    if ((s = grove__op_index_select(c->f, &y, ids_at, ids, true, &z))) return s;
    y = z;
  }
  grove__op_set_tensor(res, &y);
  return GROVE_OK;
}

const grove__opdef grove__opdef_getitem = {
    .name = "getitem",
    .id = G_GETITEM,
    .torch = (const char *const[]){"operator.getitem(a,b)", NULL},
    .varargs = -1,
    .p = {OP_REQ("a", P_ANY), OP_REQ("b", P_INDEX)},
    .forward = getitem_fwd,
};

/* ------------------------------------------------------------ size, getattr */

static grove_status size_fwd(const grove__opctx *c, gval *res) {
  const grove_tensor *x;
  grove_status s = grove__op_tensor(c, 0, &x);
  if (s) return s;
  if (c->def->id == G_GETATTR && strcmp(c->args[1].s, "ndim") == 0) {
    grove__op_set_int(res, x->ndim);
    return GROVE_OK;
  }
  if (c->def->id == G_GETATTR && strcmp(c->args[1].s, "device") == 0) {
    /* x.device: Grove runs on the CPU, and every device argument
     * (torch.zeros(..., device=x.device), .to(x.device)) is ignored. */
    res->kind = V_NONE;
    return GROVE_OK;
  }
  if (c->def->id == G_GETATTR && strcmp(c->args[1].s, "dtype") == 0) {
    res->kind = V_DTYPE; /* torch.full([], v, dtype=x.dtype), x.to(y.dtype) */
    res->i = x->dtype;
    return GROVE_OK;
  }
  if (c->def->id == G_SIZE && c->args[1].kind != A_NONE) {
    int64_t d;
    if ((s = grove__op_int(c, &c->args[1], &d))) return s;
    int nd = x->ndim == 0 ? 1 : x->ndim;
    if (d < -nd || d >= nd || x->ndim == 0)
      return grove_err_set(c->f->err, GROVE_E_SHAPE,
                           "dimension %lld is out of range for a %d-d tensor", (long long)d,
                           x->ndim);
    grove__op_set_int(res, x->shape[d < 0 ? d + x->ndim : d]);
    return GROVE_OK;
  }
  res->kind = V_INTS;
  res->n = (int8_t)x->ndim;
  memcpy(res->ints, x->shape, sizeof res->ints);
  return GROVE_OK;
}

static grove_status getattr_check(const grove__opdef *d, const garg *a, const char *jp,
                                  grove_err *err) {
  if (a[1].kind != A_STR ||
      (strcmp(a[1].s, "shape") && strcmp(a[1].s, "ndim") && strcmp(a[1].s, "device") &&
       strcmp(a[1].s, "dtype")))
    return grove_err_set(err, GROVE_E_UNSUPPORTED,
                         "%s: getattr of a tensor supports \"shape\", \"ndim\", \"device\" and "
                         "\"dtype\" only",
                         jp);
  return GROVE_OK;
}

const grove__opdef grove__opdef_size = {
    .name = "size",
    .id = G_SIZE,
    .torch = (const char *const[]){"Tensor.size(input,dim)", NULL},
    .varargs = -1,
    .p = {INPUT, OP_NONE("dim", P_INT)},
    .forward = size_fwd,
};

const grove__opdef grove__opdef_getattr = {
    .name = "getattr",
    .id = G_GETATTR,
    .torch = (const char *const[]){"builtins.getattr(input,name)", NULL},
    .varargs = -1,
    .p = {INPUT, OP_REQ("name", P_STR)},
    .check = getattr_check,
    .forward = size_fwd,
};
