/* backward_graph.c: the training forward of graph modules (modules with a
 * custom forward, run from their torch.fx node list).
 *
 * The graph is the one graph_compile.c built for serving: nodes with their
 * arguments bound to each operation's parameters, targets resolved.  This
 * file reads that compiled form (graph_internal.h) and runs it again on the
 * tape: tensor values are vars, each operation is one of the differentiable
 * ops (backward_ops.c, backward_tensor.c), call_module nodes go through
 * grove__train_call, and get_attr of a parameter makes a var whose gradient
 * is handed to the parameter's .grad.  Python numbers and size tuples are
 * computed as graph.c computes them (they carry no gradient).
 *
 * Memory is not reclaimed per node as in serving: every activation stays on
 * the tape until backward.  Fusion does not apply either (a fused conv ->
 * BatchNorm2d in training would be a batch-statistics BatchNorm anyway).
 * A traced F.dropout carries training=False (fx records self.training at
 * export, in eval): it stays the identity here too; nn.Dropout modules
 * are what drop during training. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "backward.h"
#include "graph_internal.h"
#include "layers_internal.h"

static inline grove_tensor *val(grove__tape *t, int v) {
  return &t->vars[v].t;
}

enum { TV_NONE, TV_TENSOR, TV_TUPLE, TV_INT, TV_FLOAT, TV_BOOL, TV_INTS };

typedef struct tval {
  int kind;
  int n;                   /* TV_TUPLE: entries; TV_INTS: ints */
  unsigned none_mask;      /* TV_TUPLE: entries that are None */
  int v[GROVE_MAX_VALUES]; /* vars */
  int64_t i;
  double f;
  int64_t ints[GROVE_MAX_DIMS];
} tval;

typedef struct grun {
  grove__tape *t;
  const graph_impl *g;
  tval *vals;
} grun;

grove_status grove__tgraph_compile(grove__tinfo *info, const grove_module *m,
                                   const struct json_t *obj, grove_err *err) {
  const graph_impl *g = m->impl;
  if (!g || !g->compiled)
    return grove_err_set(err, GROVE_E_INTERNAL, "training: %s has no compiled graph",
                         m->type->name);
  info->graph = (void *)g; /* borrowed: the module owns it */
  return GROVE_OK;
}

void grove__tgraph_free(void *graph) {
  (void)graph;
}

/* ------------------------------------------------------------ arguments */

static grove_status want(grun *r, const char *what) {
  return grove_err_set(r->t->err, GROVE_E_INVALID_ARGUMENT, "expected %s", what);
}

static const tval *argv_(grun *r, const garg *a) {
  return a->kind == A_NODE ? &r->vals[a->node] : NULL;
}

static grove_status arg_tensor(grun *r, const garg *a, int *v) {
  const tval *x = argv_(r, a);
  if (!x || x->kind != TV_TENSOR) return want(r, "a tensor argument");
  *v = x->v[0];
  return GROVE_OK;
}

static bool arg_number(grun *r, const garg *a, double *x, int64_t *ix, bool *is_int) {
  const tval *v = argv_(r, a);
  int kind = v                    ? v->kind
             : a->kind == A_INT   ? TV_INT
             : a->kind == A_BOOL  ? TV_BOOL
             : a->kind == A_FLOAT ? TV_FLOAT
                                  : TV_NONE;
  int64_t i = v ? v->i : a->i;
  double f = v ? v->f : a->f;
  if (kind == TV_INT || kind == TV_BOOL) {
    *ix = i;
    *x = (double)i;
    *is_int = true;
    return true;
  }
  if (kind == TV_FLOAT) {
    *x = f;
    *is_int = false;
    return true;
  }
  return false;
}

static grove_status arg_int(grun *r, const garg *a, int64_t *out) {
  double x;
  bool is_int;
  if (!arg_number(r, a, &x, out, &is_int) || !is_int) return want(r, "an integer");
  return GROVE_OK;
}

static grove_status arg_ints(grun *r, const garg *a, bool allow_one, int64_t *out, int *n) {
  const tval *v = argv_(r, a);
  if (v && v->kind == TV_INTS) {
    *n = v->n;
    memcpy(out, v->ints, (size_t)v->n * sizeof(int64_t));
    return GROVE_OK;
  }
  if (a->kind == A_LIST) {
    if (a->n > GROVE_MAX_DIMS) return want(r, "at most 8 dimensions");
    for (int i = 0; i < a->n; i++) {
      grove_status s = arg_int(r, &a->items[i], &out[i]);
      if (s) return s;
    }
    *n = a->n;
    return GROVE_OK;
  }
  if (allow_one) {
    *n = 1;
    return arg_int(r, a, &out[0]);
  }
  return want(r, "a list of integers");
}

static void set_tensor(tval *v, int var) {
  v->kind = TV_TENSOR;
  v->n = 1;
  v->v[0] = var;
}

static bool wrap(int64_t d, int nd, int64_t *out) {
  int n = nd == 0 ? 1 : nd;
  if (d < -n || d >= n) return false;
  *out = d < 0 ? d + n : d;
  return true;
}

static grove_status dim_error(grun *r, int64_t d, int nd) {
  return grove_err_set(r->t->err, GROVE_E_SHAPE, "dimension %lld is out of range for a %d-d tensor",
                       (long long)d, nd);
}

/* ------------------------------------------------------------ get_attr */

/* A parameter read by the graph: its gradient goes to the parameter. */
static grove_status attr_backward(grove__tape *t, const grove__node *n) {
  float *g;
  grove_status s = grove__param_grad(t, n->p[0], &g);
  if (s || !g) return s;
  const float *dy = grove__grad_in(t, n->out[0]);
  const int64_t N = grove_tensor_numel(n->p[0]);
  for (int64_t i = 0; i < N; i++) g[i] += dy[i];
  return GROVE_OK;
}

static grove_status run_attr(grun *r, const gnode *n, tval *res) {
  grove__tape *t = r->t;
  const grove_tensor *p = grove_module_param(n->mod, n->attr);
  const bool is_param = p != NULL;
  if (!p) p = grove_module_buffer(n->mod, n->attr);
  if (!p) return grove_err_set(t->err, GROVE_E_INVALID_ARGUMENT, "'%s' is None", n->attr);
  grove_tensor v = *p;
  v.refcount = 0;
  v.storage = NULL;
  if (!grove_tensor_is_contiguous(&v)) {
    grove_status s = grove__talloc(t, &v, p->dtype, p->ndim, p->shape);
    if (!s) s = grove_tensor_copy(&v, p, t->err);
    if (s) return s;
  }
  const bool rg = is_param && p->dtype == GROVE_F32 && grove_tensor_is_contiguous(p);
  int var = grove__var_new(t, &v, rg);
  if (var < 0) return GROVE_E_NOMEM;
  set_tensor(res, var);
  if (!rg) return GROVE_OK;
  grove__node nd = {.backward = attr_backward, .nin = 0, .nout = 1, .out = {var}};
  nd.p[0] = p;
  return grove__node_add(t, &nd);
}

/* ------------------------------------------------------------ operations */

static const int bin_of[] = {[G_ADD] = GROVE__BIN_ADD,
                             [G_SUB] = GROVE__BIN_SUB,
                             [G_MUL] = GROVE__BIN_MUL,
                             [G_DIV] = GROVE__BIN_DIV};

static grove_status run_binary(grun *r, const gnode *n, tval *res) {
  grove__tape *t = r->t;
  const garg *a = &n->args[0], *b = &n->args[1];
  const tval *va = argv_(r, a), *vb = argv_(r, b);
  const bool ta = va && va->kind == TV_TENSOR, tb = vb && vb->kind == TV_TENSOR;
  double alpha = 1;
  int64_t ialpha = 1;
  bool alpha_int = true;
  if ((n->op == G_ADD || n->op == G_SUB) &&
      !arg_number(r, &n->args[2], &alpha, &ialpha, &alpha_int))
    return want(r, "a number for alpha");
  if (!ta && !tb) {
    /* Numbers (sizes): the serving evaluator's arithmetic. */
    gnum x, y, v;
    if (!arg_number(r, a, &x.f, &x.i, &x.is_int) || !arg_number(r, b, &y.f, &y.i, &y.is_int))
      return want(r, "tensors or numbers");
    grove_status s = grove__graph_arith(n->op, x, y, (gnum){alpha_int, ialpha, alpha}, &v, t->err);
    if (s) return s;
    res->kind = v.is_int ? TV_INT : TV_FLOAT;
    res->i = v.i;
    res->f = v.f;
    return GROVE_OK;
  }
  if (n->op == G_FLOORDIV)
    return grove_err_set(t->err, GROVE_E_UNSUPPORTED, "floor division of tensors is not supported");
  const int op = bin_of[n->op];
  int y;
  grove_status s;
  if (ta && tb) {
    s = grove__top_binary(t, op, va->v[0], vb->v[0], alpha, &y);
  } else {
    /* A number on one side: the number is float32, as a 0-d tensor would be. */
    double num;
    int64_t inum;
    bool is_int;
    const bool left_tensor = ta;
    if (!arg_number(r, left_tensor ? b : a, &num, &inum, &is_int))
      return want(r, "a tensor or a number");
    const int x = left_tensor ? va->v[0] : vb->v[0];
    if (left_tensor) {
      /* x OP alpha * num */
      double k = (op == GROVE__BIN_ADD || op == GROVE__BIN_SUB) ? (double)(float)num * alpha : num;
      s = grove__top_scalar(t, op, x, (double)(float)k, false, &y);
    } else {
      /* num OP alpha * x */
      int xs = x;
      s = GROVE_OK;
      if ((op == GROVE__BIN_ADD || op == GROVE__BIN_SUB) && alpha != 1.0)
        s = grove__top_scalar(t, GROVE__BIN_MUL, x, alpha, false, &xs);
      if (!s) s = grove__top_scalar(t, op, xs, (double)(float)num, true, &y);
    }
  }
  if (!s) set_tensor(res, y);
  return s;
}

static grove_status run_getitem(grun *r, const gnode *n, tval *res) {
  grove__tape *t = r->t;
  const tval *v = argv_(r, &n->args[0]);
  const garg *ix = &n->args[1];
  if (!v) return want(r, "a tensor, a tuple or a size to index");
  if (v->kind == TV_TUPLE || v->kind == TV_INTS) {
    const int len = v->n;
    if (ix->kind == A_SLICE) {
      grove__index e = {GROVE__IX_SLICE, 0, 0, 1, false, false};
      grove_status s;
      if (ix->items[0].kind != A_NONE && (s = arg_int(r, &ix->items[0], &e.start))) return s;
      if (ix->items[1].kind != A_NONE && (s = arg_int(r, &ix->items[1], &e.stop))) return s;
      if (ix->items[2].kind != A_NONE && (s = arg_int(r, &ix->items[2], &e.step))) return s;
      if (e.step < 1)
        return grove_err_set(t->err, GROVE_E_UNSUPPORTED, "slice step must be positive");
      e.has_start = ix->items[0].kind != A_NONE;
      e.has_stop = ix->items[1].kind != A_NONE;
      int64_t first, count;
      grove__slice_indices(len, &e, &first, &count);
      *res = *v;
      res->n = (int)count;
      res->none_mask = 0;
      for (int64_t k = 0; k < count; k++) {
        int64_t from = first + k * e.step;
        if (v->kind == TV_INTS) {
          res->ints[k] = v->ints[from];
        } else {
          res->v[k] = v->v[from];
          if (v->none_mask & (1u << from)) res->none_mask |= 1u << k;
        }
      }
      return GROVE_OK;
    }
    int64_t k;
    grove_status s = arg_int(r, ix, &k);
    if (s) return s;
    if (k < 0) k += len;
    if (k < 0 || k >= len)
      return grove_err_set(t->err, GROVE_E_RANGE, "tuple index out of range (%d elements)", len);
    if (v->kind == TV_INTS) {
      res->kind = TV_INT;
      res->i = v->ints[k];
    } else if (v->none_mask & (1u << k)) {
      res->kind = TV_NONE;
    } else {
      set_tensor(res, v->v[k]);
    }
    return GROVE_OK;
  }
  if (v->kind != TV_TENSOR) return want(r, "a tensor, a tuple or a size to index");
  grove__index ixs[GROVE_MAX_DIMS + 4];
  const garg *items = ix->kind == A_LIST ? ix->items : ix;
  int ni = ix->kind == A_LIST ? ix->n : 1;
  if (ni > GROVE_MAX_DIMS + 4) return want(r, "fewer indices");
  for (int i = 0; i < ni; i++) {
    const garg *e = &items[i];
    grove__index *o = &ixs[i];
    memset(o, 0, sizeof *o);
    grove_status s;
    if (e->kind == A_NONE) {
      o->kind = GROVE__IX_NONE;
    } else if (e->kind == A_ELLIPSIS) {
      o->kind = GROVE__IX_ELLIPSIS;
    } else if (e->kind == A_SLICE) {
      o->kind = GROVE__IX_SLICE;
      o->step = 1;
      if (e->items[0].kind != A_NONE && (s = arg_int(r, &e->items[0], &o->start))) return s;
      if (e->items[1].kind != A_NONE && (s = arg_int(r, &e->items[1], &o->stop))) return s;
      if (e->items[2].kind != A_NONE && (s = arg_int(r, &e->items[2], &o->step))) return s;
      if (o->step < 1)
        return grove_err_set(t->err, GROVE_E_UNSUPPORTED, "slice step must be positive");
      o->has_start = e->items[0].kind != A_NONE;
      o->has_stop = e->items[1].kind != A_NONE;
    } else {
      const tval *ev = argv_(r, e);
      if (ev && ev->kind == TV_TENSOR)
        return grove_err_set(t->err, GROVE_E_UNSUPPORTED,
                             "indexing with a tensor (advanced indexing) is not supported");
      o->kind = GROVE__IX_INT;
      if ((s = arg_int(r, e, &o->start))) return s;
    }
  }
  int y;
  grove_status s = grove__top_index(t, v->v[0], ixs, ni, &y);
  if (!s) set_tensor(res, y);
  return s;
}

/* reshape's shape with its one -1 resolved. */
static grove_status resolve_shape(grun *r, int x, int64_t *shape, int nd) {
  const int64_t numel = grove_tensor_numel(val(r->t, x));
  int neg = -1;
  int64_t known = 1;
  for (int d = 0; d < nd; d++) {
    if (shape[d] == -1) {
      if (neg >= 0)
        return grove_err_set(r->t->err, GROVE_E_SHAPE, "only one dimension can be inferred");
      neg = d;
    } else if (shape[d] < 0) {
      return grove_err_set(r->t->err, GROVE_E_SHAPE, "invalid shape dimension %lld",
                           (long long)shape[d]);
    } else {
      known *= shape[d];
    }
  }
  if (neg >= 0) {
    if (known == 0 || numel % known) {
      char a[128], b[128];
      return grove_err_set(r->t->err, GROVE_E_SHAPE, "shape %s is invalid for an input of shape %s",
                           grove_shape_str(nd, shape, a, sizeof a),
                           grove_shape_str(val(r->t, x)->ndim, val(r->t, x)->shape, b, sizeof b));
    }
    shape[neg] = numel / known;
  }
  return GROVE_OK;
}

static grove_status run_op(grun *r, const gnode *n, tval *res) {
  grove__tape *t = r->t;
  const garg *a = n->args;
  int x, y;
  grove_status s;
  int64_t ints[GROVE_MAX_DIMS];
  int ni;
  switch (n->op) {
    case G_ADD:
    case G_SUB:
    case G_MUL:
    case G_DIV:
    case G_FLOORDIV:
      return run_binary(r, n, res);
    case G_MATMUL: {
      int b;
      if ((s = arg_tensor(r, &a[0], &x)) || (s = arg_tensor(r, &a[1], &b)) ||
          (s = grove__top_matmul(t, x, b, &y)))
        return s;
      set_tensor(res, y);
      return GROVE_OK;
    }
    case G_RELU:
    case G_SIGMOID:
    case G_TANH:
    case G_GELU: {
      if ((s = arg_tensor(r, &a[0], &x))) return s;
      grove__tinfo info = {.kind = GROVE__TK_RELU};
      if (n->op == G_SIGMOID) info.kind = GROVE__TK_SIGMOID;
      if (n->op == G_TANH) info.kind = GROVE__TK_TANH;
      if (n->op == G_GELU) {
        info.kind = GROVE__TK_GELU;
        info.tanh_approx = a[1].kind == A_STR && strcmp(a[1].s, "tanh") == 0;
      }
      if ((s = grove__top_act(t, info.kind, &info, x, &y))) return s;
      set_tensor(res, y);
      return GROVE_OK;
    }
    case G_SOFTMAX:
    case G_LOG_SOFTMAX: {
      if ((s = arg_tensor(r, &a[0], &x))) return s;
      const int nd = val(t, x)->ndim;
      int64_t dim = (nd == 0 || nd == 1 || nd == 3) ? 0 : 1, d;
      if (a[1].kind != A_NONE && (s = arg_int(r, &a[1], &dim))) return s;
      if (!wrap(dim, nd, &d)) return dim_error(r, dim, nd);
      if ((s = grove__top_softmax(t, x, nd == 0 ? 0 : (int)d, n->op == G_LOG_SOFTMAX, &y)))
        return s;
      set_tensor(res, y);
      return GROVE_OK;
    }
    case G_DROPOUT:
    case G_CONTIGUOUS:
      if ((s = arg_tensor(r, &a[0], &x))) return s;
      set_tensor(res, x);
      return GROVE_OK;
    case G_FLATTEN: {
      int64_t sd, ed, wsd, wed;
      if ((s = arg_tensor(r, &a[0], &x)) || (s = arg_int(r, &a[1], &sd)) ||
          (s = arg_int(r, &a[2], &ed)))
        return s;
      const grove_tensor *xt = val(t, x);
      if (!wrap(sd, xt->ndim, &wsd) || !wrap(ed, xt->ndim, &wed) || wsd > wed)
        return grove_err_set(t->err, GROVE_E_SHAPE,
                             "flatten: start_dim %lld and end_dim %lld do not fit a %d-d input",
                             (long long)sd, (long long)ed, xt->ndim);
      int64_t shape[GROVE_MAX_DIMS];
      int nd = 0;
      if (xt->ndim == 0) {
        shape[nd++] = 1;
      } else {
        int64_t merged = 1;
        for (int i = 0; i < xt->ndim; i++) {
          if (i < wsd || i > wed) {
            shape[nd++] = xt->shape[i];
          } else {
            merged *= xt->shape[i];
            if (i == wed) shape[nd++] = merged;
          }
        }
      }
      if ((s = grove__top_reshape(t, x, nd, shape, &y))) return s;
      set_tensor(res, y);
      return GROVE_OK;
    }
    case G_RESHAPE:
    case G_VIEW:
      if ((s = arg_tensor(r, &a[0], &x)) || (s = arg_ints(r, &a[1], true, ints, &ni)) ||
          (s = resolve_shape(r, x, ints, ni)) || (s = grove__top_reshape(t, x, ni, ints, &y)))
        return s;
      set_tensor(res, y);
      return GROVE_OK;
    case G_PERMUTE: {
      if ((s = arg_tensor(r, &a[0], &x)) || (s = arg_ints(r, &a[1], true, ints, &ni))) return s;
      const int nd = val(t, x)->ndim;
      for (int i = 0; i < ni; i++)
        if (!wrap(ints[i], nd, &ints[i])) return dim_error(r, ints[i], nd);
      if ((s = grove__top_permute(t, x, ni, ints, &y))) return s;
      set_tensor(res, y);
      return GROVE_OK;
    }
    case G_TRANSPOSE: {
      int64_t d0, d1;
      if ((s = arg_tensor(r, &a[0], &x)) || (s = arg_int(r, &a[1], &d0)) ||
          (s = arg_int(r, &a[2], &d1)))
        return s;
      const int nd = val(t, x)->ndim;
      if (!wrap(d0, nd, &d0)) return dim_error(r, d0, nd);
      if (!wrap(d1, nd, &d1)) return dim_error(r, d1, nd);
      int64_t dims[GROVE_MAX_DIMS];
      for (int i = 0; i < nd; i++) dims[i] = i;
      dims[d0] = d1;
      dims[d1] = d0;
      if (nd == 0) {
        y = x;
      } else if ((s = grove__top_permute(t, x, nd, dims, &y))) {
        return s;
      }
      set_tensor(res, y);
      return GROVE_OK;
    }
    case G_CAT: {
      int xs[64], nt = 0;
      const tval *tv = argv_(r, &a[0]);
      if (tv && tv->kind == TV_TUPLE) {
        for (int k = 0; k < tv->n; k++) {
          if (tv->none_mask & (1u << k)) return want(r, "tensors to concatenate, not None");
          xs[nt++] = tv->v[k];
        }
      } else if (a[0].kind == A_LIST) {
        for (int k = 0; k < a[0].n && k < 64; k++)
          if ((s = arg_tensor(r, &a[0].items[k], &xs[nt++]))) return s;
      } else {
        return want(r, "a list of tensors");
      }
      int64_t dim, d;
      if ((s = arg_int(r, &a[1], &dim))) return s;
      if (nt == 0) return want(r, "at least one tensor");
      if (!wrap(dim, val(t, xs[0])->ndim, &d)) return dim_error(r, dim, val(t, xs[0])->ndim);
      if ((s = grove__top_cat(t, xs, nt, (int)d, &y))) return s;
      set_tensor(res, y);
      return GROVE_OK;
    }
    case G_MEAN:
    case G_SUM: {
      if ((s = arg_tensor(r, &a[0], &x))) return s;
      const int nd = val(t, x)->ndim;
      uint32_t mask = 0;
      if (a[1].kind == A_NONE) {
        mask = nd ? (1u << nd) - 1 : 0;
      } else {
        if ((s = arg_ints(r, &a[1], true, ints, &ni))) return s;
        for (int i = 0; i < ni; i++) {
          int64_t d;
          if (!wrap(ints[i], nd, &d)) return dim_error(r, ints[i], nd);
          if (nd && (mask >> d & 1))
            return grove_err_set(t->err, GROVE_E_SHAPE, "dim %lld appears multiple times",
                                 (long long)d);
          if (nd) mask |= 1u << d;
        }
      }
      if ((s = grove__top_reduce(t, x, n->op == G_MEAN, mask, a[2].i != 0, &y))) return s;
      set_tensor(res, y);
      return GROVE_OK;
    }
    case G_GETITEM:
      return run_getitem(r, n, res);
    case G_SIZE:
    case G_GETATTR: {
      if ((s = arg_tensor(r, &a[0], &x))) return s;
      const grove_tensor *xt = val(t, x);
      if (n->op == G_GETATTR && strcmp(a[1].s, "ndim") == 0) {
        res->kind = TV_INT;
        res->i = xt->ndim;
        return GROVE_OK;
      }
      if (n->op == G_SIZE && a[1].kind != A_NONE) {
        int64_t d;
        if ((s = arg_int(r, &a[1], &d))) return s;
        if (xt->ndim == 0 || !wrap(d, xt->ndim, &d)) return dim_error(r, d, xt->ndim);
        res->kind = TV_INT;
        res->i = xt->shape[d];
        return GROVE_OK;
      }
      res->kind = TV_INTS;
      res->n = xt->ndim;
      memcpy(res->ints, xt->shape, sizeof res->ints);
      return GROVE_OK;
    }
    default:
      return grove_err_set(t->err, GROVE_E_INTERNAL, "unknown graph op %d", n->op);
  }
}

static grove_status run_module(grun *r, const gnode *n, tval *res) {
  grove__tape *t = r->t;
  int in[GROVE_MAX_VALUES];
  if (n->nargs > n->ntensors)
    return grove_err_set(t->err, GROVE_E_UNSUPPORTED,
                         "training a %s called with masks is not supported (serving runs it)",
                         n->mod->type->name);
  for (int k = 0; k < n->nargs; k++) {
    const tval *v = argv_(r, &n->args[k]);
    if (!v || v->kind != TV_TENSOR)
      return grove_err_set(t->err, GROVE_E_INVALID_ARGUMENT,
                           "argument %d of the module call is not a tensor", k);
    in[k] = v->v[0];
  }
  if (n->mod_kind == MK_MHA) {
    const grove__tinfo *info = grove__tinfo_of(t, n->mod);
    if (!info) return grove_err_set(t->err, GROVE_E_INTERNAL, "no settings for the attention");
    int o, w;
    grove_status s = grove__mha_run(t, n->mod, info, in[0], in[1], in[2], n->need_weights,
                                    n->average_weights, &o, &w);
    if (s) return s;
    res->kind = TV_TUPLE;
    res->n = 2;
    res->v[0] = o;
    res->v[1] = w;
    res->none_mask = w < 0 ? 2u : 0u;
    return GROVE_OK;
  }
  int out[GROVE_MAX_VALUES], nout = 0;
  grove_status s = grove__train_call(t, n->mod, in, n->nargs, out, &nout);
  if (s) return s;
  if (nout < 1) return grove_err_set(t->err, GROVE_E_INTERNAL, "the module returned nothing");
  if (n->tuple || nout > 1) {
    res->kind = TV_TUPLE;
    res->n = nout;
    memcpy(res->v, out, (size_t)nout * sizeof(int));
    return GROVE_OK;
  }
  set_tensor(res, out[0]);
  return GROVE_OK;
}

static grove_status node_error(grun *r, const gnode *n, grove_status s) {
  grove_err *e = r->t->err;
  if (!e || strncmp(e->msg, "training: ", 10) == 0) return s; /* a module inside named itself */
  char what[160];
  if (n->op == G_CALL_MODULE)
    snprintf(what, sizeof what, "call_module '%s'", n->attr);
  else
    snprintf(what, sizeof what, "%s", n->what);
  if (n->source) return grove_err_prefix(e, "graph node '%s' (%s, %s)", n->name, what, n->source);
  return grove_err_prefix(e, "graph node '%s' (%s)", n->name, what);
}

grove_status grove__tf_graph(grove__tape *t, const grove_module *m, const grove__tinfo *info,
                             const int *in, int nin, int *out, int *nout) {
  const graph_impl *g = info->graph;
  if (nin > g->nplaceholders)
    return grove_err_set(t->err, GROVE_E_INVALID_ARGUMENT, "forward takes %d input(s), got %d",
                         g->nplaceholders, nin);
  grun r = {.t = t, .g = g};
  r.vals = grove__tscratch(t, (size_t)g->nnodes * sizeof(tval), true);
  if (!r.vals) return GROVE_E_NOMEM;
  int next_input = 0;
  for (int i = 0; i < g->nnodes; i++) {
    const gnode *n = &g->nodes[i];
    tval *v = &r.vals[i];
    grove_status s = GROVE_OK;
    switch (n->op) {
      case G_PLACEHOLDER:
        if (next_input < nin) {
          set_tensor(v, in[next_input]);
        } else if (n->has_default) {
          const garg *d = &n->dflt;
          v->kind = d->kind == A_INT     ? TV_INT
                    : d->kind == A_FLOAT ? TV_FLOAT
                    : d->kind == A_BOOL  ? TV_BOOL
                                         : TV_NONE;
          v->i = d->i;
          v->f = d->f;
        } else {
          return grove_err_set(t->err, GROVE_E_INVALID_ARGUMENT,
                               "forward takes %d input(s), got %d ('%s' is missing)",
                               g->nplaceholders, nin, n->name);
        }
        next_input++;
        break;
      case G_GET_ATTR:
        s = run_attr(&r, n, v);
        break;
      case G_CALL_MODULE:
        s = run_module(&r, n, v);
        break;
      case G_OUTPUT: {
        const garg *a = &n->args[0];
        const garg *items = a->kind == A_LIST ? a->items : a;
        const int ni = a->kind == A_LIST ? a->n : 1;
        *nout = 0;
        for (int k = 0; k < ni; k++) {
          const tval *ov = items[k].kind == A_NODE ? &r.vals[items[k].node] : NULL;
          const int cnt = !ov ? 0 : ov->kind == TV_TENSOR ? 1 : ov->kind == TV_TUPLE ? ov->n : 0;
          if (cnt == 0 || (ov->kind == TV_TUPLE && ov->none_mask))
            return node_error(&r, n,
                              grove_err_set(t->err, GROVE_E_UNSUPPORTED,
                                            "the graph returns a number or None, but a model "
                                            "returns tensors only"));
          for (int j = 0; j < cnt; j++) {
            if (*nout >= GROVE_MAX_VALUES)
              return node_error(
                  &r, n,
                  grove_err_set(t->err, GROVE_E_UNSUPPORTED,
                                "the graph returns more than %d tensors", GROVE_MAX_VALUES));
            out[(*nout)++] = ov->v[j];
          }
        }
        return GROVE_OK;
      }
      default:
        s = run_op(&r, n, v);
        break;
    }
    if (s) return node_error(&r, n, s);
  }
  return grove_err_set(t->err, GROVE_E_INTERNAL, "graph without output");
}
