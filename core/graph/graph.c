/* graph.c: modules with a custom forward, run from the node list of their
 * torch.fx graph (model.json "graph"; the format is in docs/model-spec.md),
 * as graph_compile.c compiled it.
 *
 * Compiling (graph_compile.c) resolved every node's target and bound its
 * arguments, counted its readers and planned fusion.
 *
 * Forward: the nodes run in order, each value kept in a table in the arena
 * (a tensor, a tuple of tensors from a module such as MultiheadAttention, a
 * Python int / float / bool, or a tuple of ints from size()).  Operations on
 * tensors are in graph_ops.c; modules run through grove_module_forward, so
 * their hooks fire as in torch.
 *
 * Memory: liveness on a stack.  Every tensor a node produces in new arena
 * memory becomes a region on a stack of regions; views (reshape of a
 * contiguous tensor, permute, indexing, Identity, Dropout) share their
 * input's region, which counts its readers.  After each node:
 *   1. the values whose last reader was this node release their regions;
 *   2. dead regions are popped off the top of the stack;
 *   3. the arena is rewound to the top live region and the node's new
 *      regions are moved down to sit right above it (grove__arena_keep), so
 *      the node's scratch and everything that died is given back at once.
 * A chain of layers therefore runs in about two buffers, and a residual
 * block holds only its skip tensor besides.  A dead region under a live one
 * stays until the one above dies (a stack, not a free list): simple, never
 * fragmented, and no allocation per node.  The cost is one copy of each
 * node's output when something below it died; fused chains and views skip
 * it.  When the graph returns, everything above its topmost output is
 * given back; a parent graph then moves the outputs down onto its own stack
 * like any node's.  The arena's high water is then the peak of live memory,
 * which is what grove_model_open sizes workers' arenas with. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph_internal.h"
#include "layers_internal.h"
#include "observe.h"

/* ============================================================ running */

enum { V_NONE, V_TENSOR, V_TUPLE, V_INT, V_FLOAT, V_BOOL, V_INTS };

typedef struct gval {
  int8_t kind;
  int8_t n;                      /* V_TUPLE: tensors; V_INTS: ints */
  uint8_t none_mask;             /* V_TUPLE: entries that are None */
  /* V_TUPLE: 0, or k > 0 when the tuple is (t[0], ..., t[k-1], (t[k], ...,
   * t[n-1])): k + 1 items, the last a tuple of the rest (an LSTM's
   * (output, (h_n, c_n)) has k = 1). */
  int8_t nest;
  int16_t reg[GROVE_MAX_VALUES]; /* region of each tensor, -1: not arena memory of this pass */
  int64_t i;
  double f;
  int64_t ints[GROVE_MAX_DIMS];
  grove_tensor t[GROVE_MAX_VALUES];
} gval;

typedef struct region {
  char *start;
  size_t bytes;
  int refs; /* live values reading it */
  grove_arena_mark end;
} region;

typedef struct run {
  const graph_impl *g;
  grove_fwd *f;
  gval *vals;
  region *regs;
  int nregs;
  grove_arena_mark base;
  const grove_values *in;
  bool fuse;
  bool channels_last; /* the graph's caller takes channels-last results */
} run;

static grove_status node_error(const run *r, int i, grove_status s) {
  const gnode *n = &r->g->nodes[i];
  grove_err *e = r->f->err;
  if (!e) return s;
  char what[160];
  if (n->op == G_CALL_MODULE)
    snprintf(what, sizeof what, "call_module '%s'", n->attr);
  else
    snprintf(what, sizeof what, "%s", n->what);
  if (n->source)
    return grove_err_prefix(e, "%s: graph node '%s' (%s, %s)", r->g->where, n->name, what,
                            n->source);
  return grove_err_prefix(e, "%s: graph node '%s' (%s)", r->g->where, n->name, what);
}

/* ------------------------------------------------------------ argument values */

static const gval *argv_(const run *r, const garg *a) {
  return a->kind == A_NODE ? &r->vals[a->node] : NULL;
}

static grove_status want(const run *r, const char *what) {
  return grove_err_set(r->f->err, GROVE_E_INVALID_ARGUMENT, "expected %s", what);
}

static grove_status arg_tensor(const run *r, const garg *a, const grove_tensor **t) {
  *t = NULL;
  const gval *v = argv_(r, a);
  if (!v || v->kind != V_TENSOR) return want(r, "a tensor argument");
  *t = &v->t[0];
  return GROVE_OK;
}

/* A Python number from a constant or a node. is_int tells int from float. */
static bool arg_number(const run *r, const garg *a, double *x, int64_t *ix, bool *is_int) {
  const gval *v = argv_(r, a);
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

static grove_status arg_int(const run *r, const garg *a, int64_t *out) {
  double x;
  bool is_int;
  if (!arg_number(r, a, &x, out, &is_int) || !is_int) return want(r, "an integer");
  return GROVE_OK;
}

/* A list of ints: [2, n, -1], a size() tuple node, or (allow_one) one int. */
static grove_status arg_ints(const run *r, const garg *a, bool allow_one, int64_t *out, int *n) {
  const gval *v = argv_(r, a);
  if (v && v->kind == V_INTS) {
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

/* ------------------------------------------------------------ operations */

static void set_tensor(gval *v, const grove_tensor *t) {
  v->kind = V_TENSOR;
  v->n = 1;
  v->t[0] = *t;
}

/* Whether node n may write its result over its tensor argument a: a dies
 * here, nothing else reads its memory (its region has this one reader), it
 * is this pass's arena memory, float32, contiguous or channels last (its
 * elements are then still one dense run; the result keeps the layout). */
static bool can_overwrite(const run *r, const gnode *n, const garg *a) {
  if (a->kind != A_NODE) return false;
  const gnode *src = &r->g->nodes[a->node];
  const gval *v = &r->vals[a->node];
  return src->uses == 1 && src->last_use == (int)(n - r->g->nodes) && v->kind == V_TENSOR &&
         v->reg[0] >= 0 && r->regs[v->reg[0]].refs == 1 && v->t[0].dtype == GROVE_F32 &&
         (grove_tensor_is_contiguous(&v->t[0]) || grove__is_nhwc(&v->t[0]));
}

static grove_status run_binary(run *r, const gnode *n, gval *res) {
  const garg *a = &n->args[0], *b = &n->args[1];
  const gval *va = argv_(r, a), *vb = argv_(r, b);
  bool ta = va && va->kind == V_TENSOR, tb = vb && vb->kind == V_TENSOR;
  double alpha = 1;
  int64_t ialpha = 1;
  bool alpha_int = true;
  if ((n->op == G_ADD || n->op == G_SUB) &&
      !arg_number(r, &n->args[2], &alpha, &ialpha, &alpha_int))
    return want(r, "a number for alpha");
  if (!ta && !tb) {
    /* Python arithmetic on numbers (sizes): ints stay ints. */
    gnum x, y, v;
    if (!arg_number(r, a, &x.f, &x.i, &x.is_int) || !arg_number(r, b, &y.f, &y.i, &y.is_int))
      return want(r, "tensors or numbers");
    grove_status s =
        grove__graph_arith(n->op, x, y, (gnum){alpha_int, ialpha, alpha}, &v, r->f->err);
    if (s) return s;
    res->kind = v.is_int ? V_INT : V_FLOAT;
    res->i = v.i;
    res->f = v.f;
    return GROVE_OK;
  }
  if (n->op == G_FLOORDIV)
    return grove_err_set(r->f->err, GROVE_E_UNSUPPORTED,
                         "floor division of tensors is not supported");
  /* A number on either side is a 0-d tensor. */
  float sa = 0, sb = 0;
  grove_tensor xa, xb;
  if (ta) {
    xa = va->t[0];
  } else {
    double x;
    int64_t ix;
    bool xi;
    if (!arg_number(r, a, &x, &ix, &xi)) return want(r, "a tensor or a number");
    sa = (float)x;
    grove_tensor_init(&xa, GROVE_F32, 0, NULL, &sa);
  }
  if (tb) {
    xb = vb->t[0];
  } else {
    double y;
    int64_t iy;
    bool yi;
    if (!arg_number(r, b, &y, &iy, &yi)) return want(r, "a tensor or a number");
    sb = (float)y;
    grove_tensor_init(&xb, GROVE_F32, 0, NULL, &sb);
  }
  static const int bin[] = {[G_ADD] = GROVE__BIN_ADD,
                            [G_SUB] = GROVE__BIN_SUB,
                            [G_MUL] = GROVE__BIN_MUL,
                            [G_DIV] = GROVE__BIN_DIV};
  /* In place into a when a dies here, owns its region alone, is contiguous
   * and b does not read that memory. */
  const grove_tensor *into = NULL;
  if (ta && can_overwrite(r, n, a) && !(tb && vb->reg[0] == va->reg[0]))
    into = &xa;
  else if (tb && n->op != G_SUB && n->op != G_DIV && can_overwrite(r, n, b) &&
           !(ta && va->reg[0] == vb->reg[0]))
    into = &xb; /* a + b = b + a: b's memory will do when b has the result's shape */
  grove_tensor y;
  grove_status s = grove__op_binary(r->f, bin[n->op], &xa, &xb, alpha, &y, into);
  if (s) return s;
  set_tensor(res, &y);
  return GROVE_OK;
}

/* Elements [b, e) of an in-place relu, sigmoid or tanh, on whichever
 * compute thread takes them. */
typedef struct unary_par {
  int op;
  float *d;
} unary_par;

static void unary_chunk(void *ctx, int64_t b, int64_t e) {
  const unary_par *c = ctx;
  float *restrict d = c->d;
  if (c->op == G_RELU)
    for (int64_t i = b; i < e; i++) d[i] = d[i] < 0.0f ? 0.0f : d[i];
  else if (c->op == G_SIGMOID)
    for (int64_t i = b; i < e; i++) d[i] = 1.0f / (1.0f + expf(-d[i]));
  else
    for (int64_t i = b; i < e; i++) d[i] = tanhf(d[i]);
}

/* relu, sigmoid and tanh in place (the formulas of layers.c). */
static bool unary_in_place(run *r, const gnode *n, gval *res) {
  if ((n->op != G_RELU && n->op != G_SIGMOID && n->op != G_TANH) ||
      !can_overwrite(r, n, &n->args[0]))
    return false;
  const grove_tensor *x = &r->vals[n->args[0].node].t[0];
  unary_par c = {n->op, x->data};
  grove__parallel_for(grove_tensor_numel(x), (int64_t)16 << 10, unary_chunk, &c);
  set_tensor(res, x);
  return true;
}

/* Calls a hidden layer (relu, softmax, ...) on a tensor argument. */
static grove_status run_hidden(run *r, const gnode *n, gval *res) {
  const grove_tensor *x;
  grove_status s = arg_tensor(r, &n->args[0], &x);
  if (s) return s;
  if (unary_in_place(r, n, res)) return GROVE_OK;
  grove_values in = {.n = 1}, out = {0};
  in.v[0] = *x;
  s = n->mod->type->forward(n->mod, r->f, &in, &out);
  if (s) return s;
  set_tensor(res, &out.v[0]);
  return GROVE_OK;
}

static grove_status run_getitem(run *r, const gnode *n, gval *res) {
  const gval *v = argv_(r, &n->args[0]);
  const garg *ix = &n->args[1];
  if (!v) return want(r, "a tensor, a tuple or a size to index");
  if (v->kind == V_TUPLE && v->nest > 0) {
    /* (t[0], ..., (t[nest], ...)): index into the top level. */
    const int len = v->nest + 1;
    int64_t k;
    grove_status s = ix->kind == A_SLICE
                         ? grove_err_set(r->f->err, GROVE_E_UNSUPPORTED,
                                         "slicing a nested tuple is not supported")
                         : arg_int(r, ix, &k);
    if (s) return s;
    if (k < 0) k += len;
    if (k < 0 || k >= len)
      return grove_err_set(r->f->err, GROVE_E_RANGE, "tuple index out of range (%d elements)", len);
    if (k < v->nest) {
      set_tensor(res, &v->t[k]);
      res->reg[0] = v->reg[k];
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
  if (v->kind == V_TUPLE || v->kind == V_INTS) {
    const int len = v->n;
    if (ix->kind == A_SLICE) {
      grove__index e = {GROVE__IX_SLICE, 0, 0, 1, false, false};
      grove_status s;
      if (ix->items[0].kind != A_NONE && (s = arg_int(r, &ix->items[0], &e.start))) return s;
      if (ix->items[1].kind != A_NONE && (s = arg_int(r, &ix->items[1], &e.stop))) return s;
      if (ix->items[2].kind != A_NONE && (s = arg_int(r, &ix->items[2], &e.step))) return s;
      if (e.step < 1)
        return grove_err_set(r->f->err, GROVE_E_UNSUPPORTED, "slice step must be positive");
      e.has_start = ix->items[0].kind != A_NONE;
      e.has_stop = ix->items[1].kind != A_NONE;
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
    grove_status s = arg_int(r, ix, &k);
    if (s) return s;
    if (k < 0) k += len;
    if (k < 0 || k >= len)
      return grove_err_set(r->f->err, GROVE_E_RANGE, "tuple index out of range (%d elements)", len);
    if (v->kind == V_INTS) {
      res->kind = V_INT;
      res->i = v->ints[k];
    } else if (v->none_mask & (1u << k)) {
      res->kind = V_NONE;
    } else {
      set_tensor(res, &v->t[k]);
    }
    return GROVE_OK;
  }
  if (v->kind != V_TENSOR) return want(r, "a tensor, a tuple or a size to index");
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
        return grove_err_set(r->f->err, GROVE_E_UNSUPPORTED, "slice step must be positive");
      o->has_start = e->items[0].kind != A_NONE;
      o->has_stop = e->items[1].kind != A_NONE;
    } else {
      const gval *ev = argv_(r, e);
      if (ev && ev->kind == V_TENSOR)
        return grove_err_set(r->f->err, GROVE_E_UNSUPPORTED,
                             "indexing with a tensor (advanced indexing) is not supported");
      o->kind = GROVE__IX_INT;
      if ((s = arg_int(r, e, &o->start))) return s;
    }
  }
  grove_tensor y;
  grove_status s = grove__op_index(r->f, &v->t[0], ixs, ni, &y);
  if (s) return s;
  set_tensor(res, &y);
  return GROVE_OK;
}

static grove_status run_op(run *r, int i, gval *res) {
  const gnode *n = &r->g->nodes[i];
  const garg *a = n->args;
  const grove_tensor *x;
  grove_tensor y;
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
      const grove_tensor *b;
      if ((s = arg_tensor(r, &a[0], &x)) || (s = arg_tensor(r, &a[1], &b))) return s;
      if ((s = grove__op_matmul(r->f, x, b, &y))) return s;
      set_tensor(res, &y);
      return GROVE_OK;
    }
    case G_RELU:
    case G_GELU:
    case G_SIGMOID:
    case G_TANH:
    case G_SOFTMAX:
    case G_LOG_SOFTMAX:
    case G_FLATTEN:
      return run_hidden(r, n, res);
    case G_DROPOUT:
      if ((s = arg_tensor(r, &a[0], &x))) return s;
      set_tensor(res, x);
      return GROVE_OK;
    case G_CONTIGUOUS:
      if ((s = arg_tensor(r, &a[0], &x)) || (s = grove__fwd_contig(r->f, x, &y))) return s;
      set_tensor(res, &y);
      return GROVE_OK;
    case G_RESHAPE:
    case G_VIEW:
      if ((s = arg_tensor(r, &a[0], &x)) || (s = arg_ints(r, &a[1], true, ints, &ni)) ||
          (s = grove__op_reshape(r->f, x, ints, ni, &y)))
        return s;
      set_tensor(res, &y);
      return GROVE_OK;
    case G_PERMUTE:
      if ((s = arg_tensor(r, &a[0], &x)) || (s = arg_ints(r, &a[1], true, ints, &ni)) ||
          (s = grove__op_permute(r->f, x, ints, ni, &y)))
        return s;
      set_tensor(res, &y);
      return GROVE_OK;
    case G_TRANSPOSE: {
      int64_t d0, d1;
      if ((s = arg_tensor(r, &a[0], &x)) || (s = arg_int(r, &a[1], &d0)) ||
          (s = arg_int(r, &a[2], &d1)) || (s = grove__op_transpose(r->f, x, d0, d1, &y)))
        return s;
      set_tensor(res, &y);
      return GROVE_OK;
    }
    case G_CAT: {
      grove_tensor ts[64];
      int nt = 0;
      const gval *tv = argv_(r, &a[0]);
      if (tv && tv->kind == V_TUPLE) {
        for (int k = 0; k < tv->n; k++) {
          if (tv->none_mask & (1u << k)) return want(r, "tensors to concatenate, not None");
          ts[nt++] = tv->t[k];
        }
      } else if (a[0].kind == A_LIST) {
        for (int k = 0; k < a[0].n && k < 64; k++) {
          const grove_tensor *t;
          if ((s = arg_tensor(r, &a[0].items[k], &t))) return s;
          ts[nt++] = *t;
        }
      } else {
        return want(r, "a list of tensors");
      }
      int64_t dim;
      if ((s = arg_int(r, &a[1], &dim)) || (s = grove__op_cat(r->f, ts, nt, dim, &y))) return s;
      set_tensor(res, &y);
      return GROVE_OK;
    }
    case G_MEAN:
    case G_SUM:
      if ((s = arg_tensor(r, &a[0], &x))) return s;
      ni = -1;
      if (a[1].kind != A_NONE && (s = arg_ints(r, &a[1], true, ints, &ni))) return s;
      if ((s = grove__op_reduce(r->f, n->op == G_MEAN, x, ints, ni, a[2].i != 0, &y))) return s;
      set_tensor(res, &y);
      return GROVE_OK;
    case G_GETITEM:
      return run_getitem(r, n, res);
    case G_SIZE:
    case G_GETATTR: {
      if ((s = arg_tensor(r, &a[0], &x))) return s;
      if (n->op == G_GETATTR && strcmp(a[1].s, "ndim") == 0) {
        res->kind = V_INT;
        res->i = x->ndim;
        return GROVE_OK;
      }
      if (n->op == G_SIZE && a[1].kind != A_NONE) {
        int64_t d;
        if ((s = arg_int(r, &a[1], &d))) return s;
        int nd = x->ndim == 0 ? 1 : x->ndim;
        if (d < -nd || d >= nd || x->ndim == 0)
          return grove_err_set(r->f->err, GROVE_E_SHAPE,
                               "dimension %lld is out of range for a %d-d tensor", (long long)d,
                               x->ndim);
        res->kind = V_INT;
        res->i = x->shape[d < 0 ? d + x->ndim : d];
        return GROVE_OK;
      }
      res->kind = V_INTS;
      res->n = (int8_t)x->ndim;
      memcpy(res->ints, x->shape, sizeof res->ints);
      return GROVE_OK;
    }
    default:
      return grove_err_set(r->f->err, GROVE_E_INTERNAL, "unknown graph op %d", n->op);
  }
}

/* ------------------------------------------------------------ modules */

/* Whether node i runs fused with the nodes it absorbs (decided identically
 * by i and by the absorbed nodes): no forward hook anywhere, and the
 * forward's observer watches none of the modules involved (each must then
 * be called on its own, to be seen with its own output). */
static bool fused(const run *r, int i) {
  const gnode *n = &r->g->nodes[i];
  if (!r->fuse || (n->fuse_bn < 0 && n->fuse_relu < 0)) return false;
  if (grove__observes(r->f, n->mod)) return false;
  if (n->fuse_bn >= 0) {
    const grove_module *bn = r->g->nodes[n->fuse_bn].mod;
    if (grove__observes(r->f, bn) || !grove__conv_bn_fusable(n->mod, bn)) return false;
  }
  if (n->fuse_relu >= 0 && r->g->nodes[n->fuse_relu].op == G_CALL_MODULE &&
      grove__observes(r->f, r->g->nodes[n->fuse_relu].mod))
    return false;
  return true;
}

/* Whether node i's result may be channels last: it stays inside the graph,
 * or the graph's own caller takes channels last. */
static bool channels_last_for(const run *r, int i) {
  return r->channels_last || r->g->nodes[i].last_use != r->g->output;
}

static grove_status run_module(run *r, int i, gval *res) {
  const gnode *n = &r->g->nodes[i];
  grove_values in = {.n = n->nargs}, out = {0};
  const bool cl = channels_last_for(r, i);
  for (int k = 0; k < n->nargs; k++) {
    const gval *v = argv_(r, &n->args[k]);
    /* An LSTM's state (h0, c0) may come as one tuple value (the (h_n, c_n)
     * of another LSTM): its tensors are the module's further inputs. */
    if (v && v->kind == V_TUPLE && k == n->nargs - 1 && k == 1 && !v->none_mask &&
        !v->nest && grove__is_rnn(n->mod) && k + v->n <= GROVE_MAX_VALUES) {
      for (int j = 0; j < v->n; j++) in.v[k + j] = v->t[j];
      in.n = k + v->n;
      break;
    }
    if (!v || v->kind != V_TENSOR)
      return grove_err_set(r->f->err, GROVE_E_INVALID_ARGUMENT,
                           "argument %d of the module call is not a tensor", k);
    in.v[k] = v->t[0];
  }
  grove_status s;
  if (fused(r, i)) {
    const grove_module *mm = n->mod;
    if (mm->type == &grove__linear_type)
      s = grove__linear_forward_act(mm, r->f, &in, &out, GROVE__ACT_RELU);
    else
      s = grove__conv_bn_relu_forward(mm, n->fuse_bn >= 0 ? r->g->nodes[n->fuse_bn].mod : NULL,
                                      n->fuse_relu >= 0, r->f, &in, &out, cl);
  } else {
    if (n->mod_kind == MK_MHA)
      grove__mha_next_call(r->f, n->mod, n->need_weights, n->average_weights);
    r->f->channels_last_ok = cl;
    s = grove_module_forward(n->mod, r->f, &in, &out);
    /* A pre-hook that failed leaves the call options unread: drop them. */
    if (n->mod_kind == MK_MHA) grove__mha_next_call(r->f, NULL, true, true);
  }
  if (s) return s;
  if (out.n < 1) return grove_err_set(r->f->err, GROVE_E_INTERNAL, "the module returned nothing");
  if (n->mod_kind == MK_MHA) {
    /* (attn_output, attn_weights or None) */
    res->kind = V_TUPLE;
    res->n = 2;
    res->nest = 0;
    res->t[0] = out.v[0];
    if (out.n > 1)
      res->t[1] = out.v[1];
    else
      res->none_mask = 2;
    return GROVE_OK;
  }
  if (n->tuple || out.n > 1) {
    res->kind = V_TUPLE;
    res->n = (int8_t)out.n;
    for (int k = 0; k < out.n; k++) res->t[k] = out.v[k];
    /* LSTM: (output, (h_n, c_n)). */
    res->nest = out.n == 3 && grove__rnn_is_lstm(n->mod) ? 1 : 0;
    return GROVE_OK;
  }
  set_tensor(res, &out.v[0]);
  return GROVE_OK;
}

/* ------------------------------------------------------------ memory */

static int find_region(const run *r, const char *p) {
  for (int k = r->nregs - 1; k >= 0; k--) {
    const region *g = &r->regs[k];
    if (g->refs > 0 && p >= g->start && p < g->start + g->bytes) return k;
  }
  return -1;
}

static bool within(const grove_tensor *t, const char *p) {
  const char *s = t->data;
  size_t e = grove__tensor_extent(t);
  return e && p >= s && p < s + e;
}

/* Whether p lies in memory the pass does not own: an input, or a parameter
 * a get_attr node fetched (a view of either is not copied). */
static bool external_memory(const run *r, const char *p, int upto) {
  for (int k = 0; k < r->in->n; k++)
    if (within(&r->in->v[k], p)) return true;
  for (int k = 0; k < upto; k++)
    if (r->g->nodes[k].op == G_GET_ATTR && r->vals[k].kind == V_TENSOR &&
        within(&r->vals[k].t[0], p))
      return true;
  return false;
}

static void release(run *r, gval *v) {
  if (v->kind != V_TENSOR && v->kind != V_TUPLE) return;
  for (int k = 0; k < v->n && k < GROVE_MAX_VALUES; k++)
    if (v->reg[k] >= 0) r->regs[v->reg[k]].refs--;
  v->kind = V_NONE;
}

static void release_args(run *r, const garg *a, int i) {
  if (a->kind == A_NODE) {
    const gnode *src = &r->g->nodes[a->node];
    if (src->last_use == i && r->vals[a->node].kind != V_NONE) release(r, &r->vals[a->node]);
  }
  for (int k = 0; k < a->n; k++) release_args(r, &a->items[k], i);
}

/* New blocks of value v (memory not in a live region nor in the inputs):
 * merges overlapping ones; new[k] lists which tensors of v each block
 * holds. */
typedef struct newblk {
  char *start;
  size_t bytes;
  int tensors; /* bit mask */
} newblk;

static int cmp_blk(const void *a, const void *b) {
  const newblk *x = a, *y = b;
  return (uintptr_t)x->start < (uintptr_t)y->start ? -1 : (uintptr_t)x->start > (uintptr_t)y->start;
}

/* Classifies the tensors of a value a node just produced: in a live region
 * (a view: that region gains a reader), outside this pass's memory (an input,
 * a parameter), or in new blocks, which are returned for keeping. */
static int classify(run *r, int i, gval *v, bool external, newblk *blk) {
  int nb = 0;
  for (int k = 0; k < GROVE_MAX_VALUES; k++) v->reg[k] = -1;
  if (v->kind != V_TENSOR && v->kind != V_TUPLE) return 0;
  for (int k = 0; k < v->n; k++) {
    if (v->kind == V_TUPLE && (v->none_mask & (1u << k))) continue;
    const grove_tensor *t = &v->t[k];
    size_t e = grove__tensor_extent(t);
    if (external || e == 0) continue;
    char *p = t->data;
    int g = find_region(r, p);
    if (g >= 0) {
      v->reg[k] = (int16_t)g;
      r->regs[g].refs++;
      continue;
    }
    if (external_memory(r, p, i)) continue;
    blk[nb++] = (newblk){p, e, 1 << k};
  }
  if (nb > 1) {
    qsort(blk, (size_t)nb, sizeof *blk, cmp_blk);
    int m = 0;
    for (int k = 1; k < nb; k++) {
      newblk *last = &blk[m];
      if (blk[k].start < last->start + last->bytes) {
        char *end = blk[k].start + blk[k].bytes;
        if (end > last->start + last->bytes) last->bytes = (size_t)(end - last->start);
        last->tensors |= blk[k].tensors;
      } else {
        blk[++m] = blk[k];
      }
    }
    nb = m + 1;
  }
  return nb;
}

/* After node i: frees what died, keeps what it made. */
static grove_status settle(run *r, int i, gval *v, bool external) {
  const gnode *n = &r->g->nodes[i];
  newblk blk[GROVE_MAX_VALUES];
  int nb = classify(r, i, v, external, blk);
  for (int k = 0; k < n->nargs; k++) release_args(r, &n->args[k], i);
  if (n->last_use < 0) {
    release(r, v); /* nobody reads it: its new blocks are simply forgotten */
    nb = 0;
  }
  while (r->nregs > 0 && r->regs[r->nregs - 1].refs == 0) r->nregs--;
  grove_arena_mark top = r->nregs ? r->regs[r->nregs - 1].end : r->base;
  grove__keep keep[GROVE_MAX_VALUES];
  for (int k = 0; k < nb; k++) keep[k] = (grove__keep){blk[k].start, blk[k].bytes, NULL, {0}};
  grove_status s = grove__arena_keep(r->f->arena, top, keep, nb, r->f->err);
  if (s) return s;
  for (int k = 0; k < nb; k++) {
    if (r->nregs >= r->g->max_regions)
      return grove_err_set(r->f->err, GROVE_E_INTERNAL, "graph: region table overflow");
    const ptrdiff_t delta = (char *)keep[k].moved - blk[k].start;
    for (int j = 0; j < v->n; j++) {
      if (!(blk[k].tensors & (1 << j))) continue;
      v->t[j].data = (char *)v->t[j].data + delta;
      v->reg[j] = (int16_t)r->nregs;
    }
    r->regs[r->nregs++] = (region){keep[k].moved, blk[k].bytes, 0, keep[k].end};
    for (int j = 0; j < v->n; j++)
      if (blk[k].tensors & (1 << j)) r->regs[r->nregs - 1].refs++;
  }
  return GROVE_OK;
}

/* ------------------------------------------------------------ forward */

static grove_status run_output(run *r, grove_values *out) {
  const gnode *n = &r->g->nodes[r->g->output];
  const garg *a = &n->args[0];
  const garg *items = a->kind == A_LIST ? a->items : a;
  int ni = a->kind == A_LIST ? a->n : 1;
  out->n = 0;
  int regs[GROVE_MAX_VALUES];
  for (int k = 0; k < ni; k++) {
    const gval *v = &r->vals[items[k].node];
    int cnt = v->kind == V_TENSOR ? 1 : v->kind == V_TUPLE ? v->n : 0;
    if (cnt == 0 || (v->kind == V_TUPLE && v->none_mask))
      return grove_err_set(r->f->err, GROVE_E_UNSUPPORTED,
                           "the graph returns %s, but a model returns tensors only",
                           v->kind == V_TUPLE ? "None inside a tuple" : "a number or None");
    for (int j = 0; j < cnt; j++) {
      if (out->n >= GROVE_MAX_VALUES)
        return grove_err_set(r->f->err, GROVE_E_UNSUPPORTED,
                             "the graph returns more than %d tensors", GROVE_MAX_VALUES);
      regs[out->n] = v->reg[j];
      out->v[out->n++] = v->t[j];
    }
  }
  /* Views (x[:, 0], a transpose) leave as contiguous copies: a caller (the
   * server splitting rows, a .npy writer) gets plain tensors, as from every
   * layer. */
  grove__keep keep[2 * GROVE_MAX_VALUES];
  int owner[2 * GROVE_MAX_VALUES], nk = 0;
  for (int k = 0; k < out->n; k++) {
    if (grove_tensor_is_contiguous(&out->v[k])) continue;
    if (r->channels_last && grove__is_nhwc(&out->v[k])) continue;
    grove_tensor c;
    grove_status s = grove__fwd_contig(r->f, &out->v[k], &c);
    if (s) return s;
    out->v[k] = c;
    regs[k] = -2; /* its own new block */
    keep[nk] = (grove__keep){c.data, grove__tensor_extent(&c), NULL, {0}};
    owner[nk++] = -1 - k;
  }
  if (nk == 0) {
    /* Plain tensors: give back everything above the topmost output region
     * and leave them where they are.  Moving them down to where the pass
     * began would free the dead regions under them too, but a parent graph
     * moves a child's outputs down onto its own stack anyway (one copy, not
     * two), and a root's caller resets the arena after reading them. */
    int top = -1;
    for (int k = 0; k < out->n; k++)
      if (regs[k] > top) top = regs[k];
    grove_arena_rewind(r->f->arena, top >= 0 ? r->regs[top].end : r->base);
    return GROVE_OK;
  }
  /* Some outputs were copied: move them and the outputs' regions down to
   * where the pass began. */
  for (int k = 0; k < out->n; k++) {
    if (regs[k] < 0) continue;
    bool dup = false;
    for (int j = 0; j < nk; j++) dup |= owner[j] == regs[k];
    if (dup) continue;
    owner[nk] = regs[k];
    keep[nk++] = (grove__keep){r->regs[regs[k]].start, r->regs[regs[k]].bytes, NULL, {0}};
  }
  grove_status s = grove__arena_keep(r->f->arena, r->base, keep, nk, r->f->err);
  if (s) return s;
  for (int k = 0; k < out->n; k++) {
    for (int j = 0; j < nk; j++) {
      bool mine = regs[k] == -2 ? owner[j] == -1 - k : (regs[k] >= 0 && owner[j] == regs[k]);
      if (mine)
        out->v[k].data = (char *)out->v[k].data + ((char *)keep[j].moved - (char *)keep[j].start);
    }
  }
  return GROVE_OK;
}

grove_status grove__graph_forward(const grove_module *m, grove_fwd *f, const grove_values *in,
                                  grove_values *out) {
  const graph_impl *g = m->impl;
  if (in->n > g->nplaceholders)
    return grove_err_set(f->err, GROVE_E_INVALID_ARGUMENT, "%s: forward takes %d input(s), got %d",
                         g->where, g->nplaceholders, in->n);
  run r = {.g = g,
           .f = f,
           .in = in,
           .fuse = grove__no_forward_hooks(),
           .channels_last = f->channels_last_ok};
  r.vals = grove_arena_alloc(f->arena, (size_t)g->nnodes * sizeof(gval));
  r.regs = grove_arena_alloc(f->arena, (size_t)g->max_regions * sizeof(region));
  if (!r.vals || !r.regs) return grove_err_set(f->err, GROVE_E_NOMEM, "out of scratch memory");
  r.base = grove_arena_mark_get(f->arena);
  int next_input = 0;
  for (int i = 0; i < g->nnodes; i++) {
    grove__yield_point();
    const gnode *n = &g->nodes[i];
    gval *v = &r.vals[i];
    v->kind = V_NONE;
    v->n = 0;
    v->none_mask = 0;
    v->nest = 0;
    grove_status s = GROVE_OK;
    bool external = false;
    switch (n->op) {
      case G_PLACEHOLDER:
        external = true;
        if (next_input < in->n) {
          set_tensor(v, &in->v[next_input]);
        } else if (n->has_default) {
          const garg *d = &n->dflt;
          v->kind = d->kind == A_INT     ? V_INT
                    : d->kind == A_FLOAT ? V_FLOAT
                    : d->kind == A_BOOL  ? V_BOOL
                                         : V_NONE;
          v->i = d->i;
          v->f = d->f;
        } else {
          return grove_err_set(f->err, GROVE_E_INVALID_ARGUMENT,
                               "%s: forward takes %d input(s), got %d ('%s' is missing)", g->where,
                               g->nplaceholders, in->n, n->name);
        }
        next_input++;
        break;
      case G_GET_ATTR: {
        external = true;
        const grove_tensor *t = grove_module_param(n->mod, n->attr);
        if (!t) t = grove_module_buffer(n->mod, n->attr);
        if (!t) {
          s = grove_err_set(f->err, GROVE_E_INVALID_ARGUMENT, "'%s' is None", n->attr);
          break;
        }
        set_tensor(v, t);
        v->t[0].refcount = 0;
        v->t[0].storage = NULL;
        break;
      }
      case G_CALL_MODULE:
        if (n->fused_into >= 0 && fused(&r, n->fused_into)) {
          *v = r.vals[n->args[0].node]; /* computed by the node that absorbed it */
          v->reg[0] = -1;
          break;
        }
        s = run_module(&r, i, v);
        break;
      case G_OUTPUT:
        s = run_output(&r, out);
        if (s) return node_error(&r, i, s);
        return GROVE_OK;
      default:
        if (n->op == G_RELU && n->fused_into >= 0 && fused(&r, n->fused_into)) {
          *v = r.vals[n->args[0].node];
          break;
        }
        s = run_op(&r, i, v);
        break;
    }
    if (s) return node_error(&r, i, s);
    if ((s = settle(&r, i, v, external))) return node_error(&r, i, s);
  }
  return grove_err_set(f->err, GROVE_E_INTERNAL, "%s: graph without output", g->where);
}

grove_status grove__graph_arith(int op, gnum x, gnum y, gnum alpha, gnum *out, grove_err *err) {
  const bool ints = x.is_int && y.is_int && alpha.is_int;
  switch (op) {
    case G_ADD:
    case G_SUB: {
      const int sign = op == G_ADD ? 1 : -1;
      *out = ints ? (gnum){true, x.i + sign * alpha.i * y.i, 0}
                  : (gnum){false, 0, x.f + sign * alpha.f * y.f};
      break;
    }
    case G_MUL:
      *out = ints ? (gnum){true, x.i * y.i, 0} : (gnum){false, 0, x.f * y.f};
      break;
    case G_DIV:
      if (y.f == 0) return grove_err_set(err, GROVE_E_RANGE, "division by zero");
      *out = (gnum){false, 0, x.f / y.f};
      break;
    default: /* floordiv */
      if (y.f == 0) return grove_err_set(err, GROVE_E_RANGE, "integer division or modulo by zero");
      if (ints) {
        int64_t q = x.i / y.i;
        if ((x.i % y.i != 0) && ((x.i < 0) != (y.i < 0))) q--;
        *out = (gnum){true, q, 0};
      } else {
        *out = (gnum){false, 0, floor(x.f / y.f)};
      }
      break;
  }
  if (out->is_int) out->f = (double)out->i;
  return GROVE_OK;
}
