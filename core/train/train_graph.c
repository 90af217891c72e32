/* train_graph.c: graph modules (a custom forward, run from its torch.fx node
 * list) in training.  There is one graph evaluator, graph.c's; this file is
 * its training option (grove__graph_tape, graph_internal.h): graph.c walks
 * the nodes, binds values and computes Python numbers and sizes exactly as
 * when serving, and calls back here for what differs on a tape:
 *   - an operation node runs its training forward from the table below
 *     (the differentiable ops of backward_ops.c / backward_tensor.c, which
 *     record each node's backward), keyed by the op entry (core/nn/ops.h);
 *     where an operation computes no tensor (size, getattr, Python
 *     arithmetic, indexing a tuple) it runs the entry's own forward;
 *   - call_module nodes go through grove__train_call;
 *   - get_attr of a parameter makes a var whose gradient is handed to the
 *     parameter's .grad.
 * Why train/ fills a table of pointers that graph/ is handed, rather than
 * the op entries (core/nn/) carrying their backward: the backwards work on
 * the tape (vars, nodes, gradients), which belongs to train/, above graph/
 * and nn/; an entry naming them would be a call upward.
 *
 * A tensor's var rides in gval.reg[].  Memory is not reclaimed per node as
 * in serving: every activation stays on the tape until backward.  Fusion
 * does not apply either (a fused conv -> BatchNorm2d in training would be a
 * batch-statistics BatchNorm anyway).  A traced F.dropout carries
 * training=False (fx records self.training at export, in eval): it stays
 * the identity here too; nn.Dropout modules are what drop during training. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "backward.h"
#include "graph_internal.h"
#include "layers_internal.h"

grove_status grove__tgraph_compile(grove__tinfo *info, const grove_module *m, grove_err *err) {
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

/* ------------------------------------------------------------ values */

static inline const grove_tensor *val(grove__tape *t, int v) {
  return &t->vars[v].t;
}

/* The var of tensor argument a. */
static grove_status arg_var(const grove__opctx *c, const garg *a, int *v) {
  const gval *x = grove__op_val(c, a);
  *v = -1;
  if (!x || x->kind != V_TENSOR) return grove__op_want(c, "a tensor argument");
  *v = x->reg[0];
  return GROVE_OK;
}

static void set_var(grove__tape *t, gval *res, int var) {
  grove__op_set_tensor(res, val(t, var));
  res->reg[0] = var;
}

static bool wrap(int64_t d, int nd, int64_t *out) {
  int n = nd == 0 ? 1 : nd;
  if (d < -n || d >= n) return false;
  *out = d < 0 ? d + n : d;
  return true;
}

static grove_status dim_error(grove__tape *t, int64_t d, int nd) {
  return grove_err_set(t->err, GROVE_E_SHAPE, "dimension %lld is out of range for a %d-d tensor",
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

static grove_status tr_get_attr(void *tape, const gnode *n, gval *res) {
  grove__tape *t = tape;
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
  set_var(t, res, var);
  if (!rg) return GROVE_OK;
  grove__node nd = {.backward = attr_backward, .nin = 0, .nout = 1, .out = {var}};
  nd.p[0] = p;
  return grove__node_add(t, &nd);
}

/* ------------------------------------------------------------ call_module */

static grove_status tr_call_module(void *tape, const gnode *n, const gval *vals, gval *res) {
  grove__tape *t = tape;
  int in[GROVE_MAX_VALUES];
  if (n->nargs > n->ntensors)
    return grove_err_set(t->err, GROVE_E_UNSUPPORTED,
                         "training a %s called with masks is not supported (serving runs it)",
                         n->mod->type->name);
  for (int k = 0; k < n->nargs; k++) {
    const gval *v = n->args[k].kind == A_NODE ? &vals[n->args[k].node] : NULL;
    if (!v || v->kind != V_TENSOR)
      return grove_err_set(t->err, GROVE_E_INVALID_ARGUMENT,
                           "argument %d of the module call is not a tensor", k);
    in[k] = v->reg[0];
  }
  if (n->mod_kind == MK_MHA) {
    const grove__tinfo *info = grove__tinfo_of(t, n->mod);
    if (!info) return grove_err_set(t->err, GROVE_E_INTERNAL, "no settings for the attention");
    int o, w;
    grove_status s = grove__mha_run(t, n->mod, info, in[0], in[1], in[2], n->need_weights,
                                    n->average_weights, &o, &w);
    if (s) return s;
    set_var(t, res, o);
    res->kind = V_TUPLE;
    res->n = 2;
    if (w >= 0) {
      res->t[1] = *val(t, w);
      res->reg[1] = w;
    } else {
      res->none_mask = 2u;
    }
    return GROVE_OK;
  }
  int out[GROVE_MAX_VALUES], nout = 0;
  grove_status s = grove__train_call(t, n->mod, in, n->nargs, out, &nout);
  if (s) return s;
  if (nout < 1) return grove_err_set(t->err, GROVE_E_INTERNAL, "the module returned nothing");
  for (int k = 0; k < nout; k++) {
    res->t[k] = *val(t, out[k]);
    res->reg[k] = out[k];
  }
  res->n = (int8_t)nout;
  res->kind = n->tuple || nout > 1 ? V_TUPLE : V_TENSOR;
  return GROVE_OK;
}

/* ------------------------------------------------------------ operations */

typedef grove_status (*train_op_fn)(grove__tape *t, const grove__opctx *c, gval *res);

/* a OP b.  Numbers (sizes) compute as when serving (the entry's forward). */
static grove_status tr_binary(grove__tape *t, const grove__opctx *c, gval *res) {
  static const int bin_of[] = {[G_ADD] = GROVE__BIN_ADD,
                               [G_SUB] = GROVE__BIN_SUB,
                               [G_MUL] = GROVE__BIN_MUL,
                               [G_DIV] = GROVE__BIN_DIV};
  const int id = c->def->id;
  const garg *a = &c->args[0], *b = &c->args[1];
  const gval *va = grove__op_val(c, a), *vb = grove__op_val(c, b);
  const bool ta = va && va->kind == V_TENSOR, tb = vb && vb->kind == V_TENSOR;
  if ((!ta && !tb) || id == G_FLOORDIV || id == G_MOD) return c->def->forward(c, res);
  double alpha = 1;
  int64_t ialpha = 1;
  bool alpha_int = true;
  if ((id == G_ADD || id == G_SUB) && !grove__op_number(c, &c->args[2], &alpha, &ialpha, &alpha_int))
    return grove__op_want(c, "a number for alpha");
  const int op = bin_of[id];
  int y;
  grove_status s;
  if (ta && tb) {
    s = grove__top_binary(t, op, va->reg[0], vb->reg[0], alpha, &y);
  } else {
    /* A number on one side: the number is float32, as a 0-d tensor would be. */
    double num;
    int64_t inum;
    bool is_int;
    const bool left_tensor = ta;
    if (!grove__op_number(c, left_tensor ? b : a, &num, &inum, &is_int))
      return grove__op_want(c, "a tensor or a number");
    const int x = left_tensor ? va->reg[0] : vb->reg[0];
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
  if (!s) set_var(t, res, y);
  return s;
}

static grove_status tr_matmul(grove__tape *t, const grove__opctx *c, gval *res) {
  int x, b, y;
  grove_status s;
  if ((s = arg_var(c, &c->args[0], &x)) || (s = arg_var(c, &c->args[1], &b)) ||
      (s = grove__top_matmul(t, x, b, &y)))
    return s;
  set_var(t, res, y);
  return GROVE_OK;
}

static grove_status tr_act(grove__tape *t, const grove__opctx *c, gval *res) {
  int x, y;
  grove_status s = arg_var(c, &c->args[0], &x);
  if (s) return s;
  const int id = c->def->id;
  grove__tinfo info = {.kind = GROVE__TK_RELU};
  if (id == G_SIGMOID) info.kind = GROVE__TK_SIGMOID;
  if (id == G_TANH) info.kind = GROVE__TK_TANH;
  if (id == G_GELU) {
    info.kind = GROVE__TK_GELU;
    info.tanh_approx = c->args[1].kind == A_STR && strcmp(c->args[1].s, "tanh") == 0;
  }
  if ((s = grove__top_act(t, info.kind, &info, x, &y))) return s;
  set_var(t, res, y);
  return GROVE_OK;
}

static grove_status tr_softmax(grove__tape *t, const grove__opctx *c, gval *res) {
  int x, y;
  grove_status s = arg_var(c, &c->args[0], &x);
  if (s) return s;
  const int nd = val(t, x)->ndim;
  int64_t dim = grove__softmax_dim(false, 0, nd), d;
  if (c->args[1].kind != A_NONE && (s = grove__op_int(c, &c->args[1], &dim))) return s;
  if (!wrap(dim, nd, &d)) return dim_error(t, dim, nd);
  if ((s = grove__top_softmax(t, x, nd == 0 ? 0 : (int)d, c->def->id == G_LOG_SOFTMAX, &y)))
    return s;
  set_var(t, res, y);
  return GROVE_OK;
}

/* dropout(training=False), contiguous: the input itself (vars are
 * contiguous). */
static grove_status tr_identity(grove__tape *t, const grove__opctx *c, gval *res) {
  int x;
  grove_status s = arg_var(c, &c->args[0], &x);
  if (!s) set_var(t, res, x);
  return s;
}

static grove_status tr_flatten(grove__tape *t, const grove__opctx *c, gval *res) {
  int64_t sd, ed, wsd, wed;
  int x, y;
  grove_status s;
  if ((s = arg_var(c, &c->args[0], &x)) || (s = grove__op_int(c, &c->args[1], &sd)) ||
      (s = grove__op_int(c, &c->args[2], &ed)))
    return s;
  const grove_tensor *xt = val(t, x);
  if (!wrap(sd, xt->ndim, &wsd) || !wrap(ed, xt->ndim, &wed) || wsd > wed)
    return grove_err_set(t->err, GROVE_E_SHAPE,
                         "flatten: start_dim %lld and end_dim %lld do not fit a %d-d input",
                         (long long)sd, (long long)ed, xt->ndim);
  int64_t shape[GROVE_MAX_DIMS];
  const int nd = grove__flatten_shape(xt, (int)wsd, (int)wed, shape);
  if ((s = grove__top_reshape(t, x, nd, shape, &y))) return s;
  set_var(t, res, y);
  return GROVE_OK;
}

/* reshape's shape with its one -1 resolved. */
static grove_status resolve_shape(grove__tape *t, int x, int64_t *shape, int nd) {
  const int64_t numel = grove_tensor_numel(val(t, x));
  int neg = -1;
  int64_t known = 1;
  for (int d = 0; d < nd; d++) {
    if (shape[d] == -1) {
      if (neg >= 0) return grove_err_set(t->err, GROVE_E_SHAPE, "only one dimension can be inferred");
      neg = d;
    } else if (shape[d] < 0) {
      return grove_err_set(t->err, GROVE_E_SHAPE, "invalid shape dimension %lld",
                           (long long)shape[d]);
    } else {
      known *= shape[d];
    }
  }
  if (neg >= 0) {
    if (known == 0 || numel % known) {
      char a[128], b[128];
      return grove_err_set(t->err, GROVE_E_SHAPE, "shape %s is invalid for an input of shape %s",
                           grove_shape_str(nd, shape, a, sizeof a),
                           grove_shape_str(val(t, x)->ndim, val(t, x)->shape, b, sizeof b));
    }
    shape[neg] = numel / known;
  }
  return GROVE_OK;
}

static grove_status tr_reshape(grove__tape *t, const grove__opctx *c, gval *res) {
  int64_t ints[GROVE_MAX_DIMS];
  int ni, x, y;
  grove_status s;
  if ((s = arg_var(c, &c->args[0], &x)) || (s = grove__op_ints(c, &c->args[1], true, ints, &ni)) ||
      (s = resolve_shape(t, x, ints, ni)) || (s = grove__top_reshape(t, x, ni, ints, &y)))
    return s;
  set_var(t, res, y);
  return GROVE_OK;
}

static grove_status tr_permute(grove__tape *t, const grove__opctx *c, gval *res) {
  int64_t ints[GROVE_MAX_DIMS];
  int ni, x, y;
  grove_status s;
  if ((s = arg_var(c, &c->args[0], &x)) || (s = grove__op_ints(c, &c->args[1], true, ints, &ni)))
    return s;
  const int nd = val(t, x)->ndim;
  for (int i = 0; i < ni; i++)
    if (!wrap(ints[i], nd, &ints[i])) return dim_error(t, ints[i], nd);
  if ((s = grove__top_permute(t, x, ni, ints, &y))) return s;
  set_var(t, res, y);
  return GROVE_OK;
}

static grove_status tr_transpose(grove__tape *t, const grove__opctx *c, gval *res) {
  int64_t d0, d1;
  int x, y;
  grove_status s;
  if ((s = arg_var(c, &c->args[0], &x)) || (s = grove__op_int(c, &c->args[1], &d0)) ||
      (s = grove__op_int(c, &c->args[2], &d1)))
    return s;
  const int nd = val(t, x)->ndim;
  if (!wrap(d0, nd, &d0)) return dim_error(t, d0, nd);
  if (!wrap(d1, nd, &d1)) return dim_error(t, d1, nd);
  int64_t dims[GROVE_MAX_DIMS];
  for (int i = 0; i < nd; i++) dims[i] = i;
  dims[d0] = d1;
  dims[d1] = d0;
  if (nd == 0)
    y = x;
  else if ((s = grove__top_permute(t, x, nd, dims, &y)))
    return s;
  set_var(t, res, y);
  return GROVE_OK;
}

static grove_status tr_cat(grove__tape *t, const grove__opctx *c, gval *res) {
  grove_tensor ts[64];
  int32_t slots[64];
  int xs[64], nt, y;
  int64_t dim, d;
  grove_status s;
  if ((s = grove__op_tensors(c, &c->args[0], ts, slots, 64, &nt)) ||
      (s = grove__op_int(c, &c->args[1], &dim)))
    return s;
  if (nt == 0) return grove__op_want(c, "at least one tensor");
  for (int k = 0; k < nt; k++) xs[k] = slots[k];
  if (!wrap(dim, val(t, xs[0])->ndim, &d)) return dim_error(t, dim, val(t, xs[0])->ndim);
  if ((s = grove__top_cat(t, xs, nt, (int)d, &y))) return s;
  set_var(t, res, y);
  return GROVE_OK;
}

static grove_status tr_reduce(grove__tape *t, const grove__opctx *c, gval *res) {
  const garg *a = c->args;
  int64_t ints[GROVE_MAX_DIMS];
  int ni, x, y;
  grove_status s = arg_var(c, &a[0], &x);
  if (s) return s;
  const int nd = val(t, x)->ndim;
  uint32_t mask = 0;
  if (a[1].kind == A_NONE) {
    mask = nd ? (1u << nd) - 1 : 0;
  } else {
    if ((s = grove__op_ints(c, &a[1], true, ints, &ni))) return s;
    for (int i = 0; i < ni; i++) {
      int64_t d;
      if (!wrap(ints[i], nd, &d)) return dim_error(t, ints[i], nd);
      if (nd && (mask >> d & 1))
        return grove_err_set(t->err, GROVE_E_SHAPE, "dim %lld appears multiple times",
                             (long long)d);
      if (nd) mask |= 1u << d;
    }
  }
  if ((s = grove__top_reduce(t, x, c->def->id == G_MEAN, mask, a[2].i != 0, &y))) return s;
  set_var(t, res, y);
  return GROVE_OK;
}

/* x[...] of a tensor: a copy on the tape, so gradients scatter back; of a
 * tuple or a size: the entry's forward (the vars ride along). */
static grove_status tr_getitem(grove__tape *t, const grove__opctx *c, gval *res) {
  const gval *v = grove__op_val(c, &c->args[0]);
  if (!v || v->kind != V_TENSOR) return c->def->forward(c, res);
  grove__index ixs[GROVE_MAX_DIMS + 4];
  int ni, y;
  grove_status s = grove__op_index_list(c, &c->args[1], ixs, &ni, NULL, NULL);
  if (!s) s = grove__top_index(t, v->reg[0], ixs, ni, &y);
  if (!s) set_var(t, res, y);
  return s;
}

/* size, getattr: numbers read off a tensor. */
static grove_status tr_plain(grove__tape *t, const grove__opctx *c, gval *res) {
  return c->def->forward(c, res);
}

/* The training forward of each op entry, by canonical name.  An entry not
 * listed here cannot be trained through (yet): the message says which. */
static const struct {
  const char *op;
  train_op_fn fn;
} train_ops[] = {
    {"add", tr_binary},         {"sub", tr_binary},         {"mul", tr_binary},
    {"div", tr_binary},         {"floordiv", tr_binary},    {"matmul", tr_matmul},
    {"relu", tr_act},           {"gelu", tr_act},           {"sigmoid", tr_act},
    {"tanh", tr_act},           {"softmax", tr_softmax},    {"log_softmax", tr_softmax},
    {"dropout", tr_identity},   {"contiguous", tr_identity}, {"flatten", tr_flatten},
    {"reshape", tr_reshape},    {"view", tr_reshape},       {"permute", tr_permute},
    {"transpose", tr_transpose}, {"cat", tr_cat},           {"mean", tr_reduce},
    {"sum", tr_reduce},         {"getitem", tr_getitem},    {"size", tr_plain},
    {"getattr", tr_plain},
};

static grove_status tr_op(void *tape, const gnode *n, const grove__opctx *c, gval *res) {
  grove__tape *t = tape;
  for (size_t k = 0; k < sizeof train_ops / sizeof train_ops[0]; k++)
    if (strcmp(train_ops[k].op, n->def->name) == 0) {
      grove_status s = train_ops[k].fn(t, c, res);
      /* Every tensor a node yields on the tape is a var. */
      const int nt = res->kind == V_TENSOR ? 1 : res->kind == V_TUPLE ? res->n : 0;
      for (int j = 0; !s && j < nt; j++)
        if (!(res->none_mask & (1u << j)) && res->reg[j] < 0)
          s = grove_err_set(t->err, GROVE_E_INTERNAL, "%s yielded a tensor off the tape",
                            n->def->name);
      return s;
    }
  return grove_err_set(t->err, GROVE_E_UNSUPPORTED, "%s has no training forward in Grove",
                       n->def->name);
}

grove_status grove__tf_graph(grove__tape *t, const grove_module *m, const grove__tinfo *info,
                             const int *in, int nin, int *out, int *nout) {
  const grove__graph_tape tr = {t, tr_op, tr_call_module, tr_get_attr};
  grove_values vin = {.n = nin}, vout = {0};
  for (int k = 0; k < nin && k < GROVE_MAX_VALUES; k++) vin.v[k] = *val(t, in[k]);
  grove_fwd f = {.arena = t->arena, .err = t->err};
  grove_status s = grove__graph_run(m, &f, &vin, in, &tr, &vout, out);
  if (!s) *nout = vout.n;
  return s;
}
