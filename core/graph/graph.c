/* graph.c: modules with a custom forward, run from the node list of their
 * torch.fx graph (model.json "graph"; the format is in docs/model-spec.md),
 * as graph_compile.c compiled it.
 *
 * Compiling (graph_compile.c) resolved every node's target and bound its
 * arguments, counted its readers and planned fusion.
 *
 * Forward: the nodes run in order, each value kept in a table in the arena
 * (a tensor, a tuple of tensors from a module such as MultiheadAttention, a
 * Python int / float / bool, or a tuple of ints from size()).  Operations
 * run their op entry's forward (ops.h: the one table, core/nn/ops_*.c);
 * modules run through grove_module_forward, so their hooks fire as in
 * torch.
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

typedef struct region {
  char *start;
  size_t bytes;
  int refs; /* live values reading it */
  grove_arena_mark end;
  int item; /* recording a plan: its allocation's log entry until it dies, else -1 */
} region;

/* A chain's buffer (gnode.cat_into), once a member or a part made it:
 * [n, C, h, w] channels last; its first `filled` parts are in place.  Its
 * region (reg) holds one reference of the chain's own from the node that
 * made it until the chain's last cat has run, so that it stays while no
 * value happens to read it (DenseNet: after a layer's norm1 read the
 * block's features, before its conv2 writes their next slice). */
typedef struct catbuf {
  float *data;
  int64_t n, h, w, C;
  int filled, reg;
} catbuf;

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
  const grove__graph_tape *tr; /* the training option, or NULL */
  catbuf *cats; /* per node, for the planned cats (g->has_cat_plans), else NULL */
  int res_done; /* the convolution that applied its fuse_add (the one pending), or -1 */
  /* Arena plans (graph_plan.c): using one (plan, its block reserve, the
   * arena's top above it pbase; miss: something differed, fall back), or
   * recording one (rec). */
  const grove__gplan *plan;
  char *reserve;
  grove_arena_mark pbase;
  bool miss;
  grove__plan_rec *rec;
  size_t *out_copy; /* recording: the bytes of the outputs copied out as contiguous */
  /* A graph run inside a node of a graph recording or using a plan: its
   * blocks stay where they were made (they are that node's allocations,
   * which the plan places), nothing is moved. */
  bool passthru;
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
  if (r->tr) {
    /* The trainer names the module path itself ("training: ..."). */
    if (strncmp(e->msg, "training: ", 10) == 0) return s;
    if (n->source) return grove_err_prefix(e, "graph node '%s' (%s, %s)", n->name, what, n->source);
    return grove_err_prefix(e, "graph node '%s' (%s)", n->name, what);
  }
  if (n->source)
    return grove_err_prefix(e, "%s: graph node '%s' (%s, %s)", r->g->where, n->name, what,
                            n->source);
  return grove_err_prefix(e, "%s: graph node '%s' (%s)", r->g->where, n->name, what);
}

/* ------------------------------------------------------------ argument values */

static const gval *argv_(const run *r, const garg *a) {
  return a->kind == A_NODE ? &r->vals[a->node] : NULL;
}

/* ------------------------------------------------------------ operations */

static void set_tensor(gval *v, const grove_tensor *t) {
  grove__op_set_tensor(v, t);
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

/* Runs operation node i: its entry's forward on its bound arguments, told
 * which tensor arguments it may write its result over. */
static grove_status run_op(run *r, int i, gval *res) {
  const gnode *n = &r->g->nodes[i];
  if (r->tr) {
    const grove__opctx c = {r->f, n->def, n->args, r->vals, NULL, 0};
    return r->tr->op(r->tr->tape, n, &c, res);
  }
  unsigned overwrite = 0;
  for (int k = 0; k < n->nargs && k < 32; k++)
    if (can_overwrite(r, n, &n->args[k])) overwrite |= 1u << k;
  const grove__opctx c = {r->f, n->def, n->args, r->vals, NULL, overwrite};
  return n->def->forward(&c, res);
}

/* The training output: the vars of the tensors the output node names. */
static grove_status tape_output(run *r, grove_values *out, int *out_vars) {
  const gnode *n = &r->g->nodes[r->g->output];
  const garg *a = &n->args[0];
  const garg *items = a->kind == A_LIST ? a->items : a;
  const int ni = a->kind == A_LIST ? a->n : 1;
  out->n = 0;
  for (int k = 0; k < ni; k++) {
    const gval *v = items[k].kind == A_NODE ? &r->vals[items[k].node] : NULL;
    const int cnt = !v ? 0 : v->kind == V_TENSOR ? 1 : v->kind == V_TUPLE ? v->n : 0;
    if (cnt == 0 || (v->kind == V_TUPLE && v->none_mask))
      return grove_err_set(r->f->err, GROVE_E_UNSUPPORTED,
                           "the graph returns a number or None, but a model returns tensors only");
    for (int j = 0; j < cnt; j++) {
      if (out->n >= GROVE_MAX_VALUES)
        return grove_err_set(r->f->err, GROVE_E_UNSUPPORTED,
                             "the graph returns more than %d tensors", GROVE_MAX_VALUES);
      out_vars[out->n] = v->reg[j];
      out->v[out->n++] = v->t[j];
    }
  }
  return GROVE_OK;
}

/* ------------------------------------------------------------ modules */

/* Whether node i runs fused with the nodes it absorbs (decided identically
 * by i and by the absorbed nodes): no forward hook anywhere, and the
 * forward's observer watches none of the modules involved (each must then
 * be called on its own, to be seen with its own output). */
static bool fused(const run *r, int i) {
  const gnode *n = &r->g->nodes[i];
  if (!r->fuse || (n->fuse_bn < 0 && n->fuse_relu < 0 && n->fuse_add < 0)) return false;
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

/* Whether node i, absorbed by a convolution, was computed by it: after a
 * residual add, only when the convolution applied it (run.res_done). */
static bool absorbed(const run *r, int i) {
  const int c = r->g->nodes[i].fused_into;
  if (c < 0 || !fused(r, c)) return false;
  const gnode *C = &r->g->nodes[c];
  return C->fuse_add < 0 || i < C->fuse_add || r->res_done == c;
}

/* Whether node i's result may be channels last: it stays inside the graph,
 * or the graph's own caller takes channels last. */
static bool channels_last_for(const run *r, int i) {
  return r->channels_last || r->g->nodes[i].last_use != r->g->output;
}

/* The channels of part k of chain f: its convolution's when that writes
 * its slice, else those of its value, which exists before the chain's
 * first node runs (plan_cat_slices); -1 when it is not a 4-d tensor. */
static int64_t part_channels(const run *r, int f, int k) {
  const gnode *g = r->g->nodes;
  const int it = g[f].args[0].items[k].node;
  const int q = g[it].fused_into >= 0 ? g[it].fused_into : it;
  if (g[q].cat_into == f && g[q].op == G_CALL_MODULE) return grove__conv_out_channels(g[q].mod);
  const gval *v = &r->vals[it];
  return v->kind == V_TENSOR && v->t[0].ndim == 4 ? v->t[0].shape[1] : -1;
}

/* The channels of parts [0, k) of chain f (k = its part count: the
 * buffer's), or -1. */
static int64_t chain_channels(const run *r, int f, int k) {
  int64_t c = 0;
  for (int j = 0; j < k; j++) {
    const int64_t cj = part_channels(r, f, j);
    if (cj < 0) return -1;
    c += cj;
  }
  return c;
}

/* Whether convolution node i writes its result into its slice of its
 * chain's buffer: its own result, or the fused chain's that ends in the
 * cat's part, nothing observes it (an observer or hook sees each module's
 * own output), and it may be channels last. */
static bool writes_slice(const run *r, int i, bool cl) {
  const gnode *n = &r->g->nodes[i];
  if (n->cat_into < 0 || n->op != G_CALL_MODULE || !r->cats || !cl || !r->fuse ||
      r->f->observer)
    return false;
  return (n->fuse_bn < 0 && n->fuse_relu < 0) || fused(r, i);
}

static grove_status run_module(run *r, int i, gval *res) {
  const gnode *n = &r->g->nodes[i];
  grove_values in = {.n = n->ntensors}, out = {0};
  const bool cl = channels_last_for(r, i);
  const bool slice = writes_slice(r, i, cl);
  for (int k = 0; k < n->ntensors; k++) {
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
  /* The mask slots of an attention or transformer call (graph_internal.h). */
  const grove_tensor *masks[6] = {NULL};
  const int nmasks = n->nargs - n->ntensors;
  for (int k = 0; k < nmasks && k < 6; k++) {
    const garg *a = &n->args[n->ntensors + k];
    if (a->kind == A_NONE) continue;
    const gval *v = argv_(r, a);
    if (!v || v->kind != V_TENSOR)
      return grove_err_set(r->f->err, GROVE_E_INVALID_ARGUMENT,
                           "mask argument %d of the %s call is not a tensor", k,
                           n->mod->type->name);
    masks[k] = &v->t[0];
  }
  grove_status s;
  if (slice) {
    const catbuf *cb = &r->cats[n->cat_into];
    const int f = n->cat_into;
    r->f->into.channels = cb->data ? cb->C : chain_channels(r, f, r->g->nodes[f].args[0].n);
    r->f->into.offset = chain_channels(r, f, n->cat_part);
    if (r->f->into.channels < 0 || r->f->into.offset < 0) r->f->into.channels = 0;
    r->f->into.data = cb->data;
    r->f->into.n = cb->n;
    r->f->into.h = cb->h;
    r->f->into.w = cb->w;
  }
  if (fused(r, i)) {
    const grove_module *mm = n->mod;
    if (mm->type == &grove__linear_type)
      s = grove__linear_forward_act(mm, r->f, &in, &out, GROVE__ACT_RELU);
    else if (mm->type == &grove__batch_norm2d_type)
      s = grove__bn2d_act_forward(mm, r->f, &in, &out, n->fuse_act);
    else if (n->fuse_add >= 0) {
      /* The residual's add and activation, when the conv's path can apply
       * them (grove_fwd.res); else the plain conv, and the add runs. */
      const gval *rv = &r->vals[n->fuse_res];
      r->f->res.t = rv->kind == V_TENSOR ? &rv->t[0] : NULL;
      r->f->res.act = (int)n->fuse_act;
      r->f->res.done = false;
      s = grove__conv_bn_act_forward(mm, n->fuse_bn >= 0 ? r->g->nodes[n->fuse_bn].mod : NULL,
                                     GROVE__ACT_NONE, r->f, &in, &out, cl);
      r->res_done = !s && r->f->res.done ? i : -1;
      r->f->res.t = NULL;
      r->f->res.done = false;
    } else
      s = grove__conv_bn_act_forward(mm, n->fuse_bn >= 0 ? r->g->nodes[n->fuse_bn].mod : NULL,
                                     n->fuse_act, r->f, &in, &out, cl);
  } else {
    if (n->mod_kind == MK_MHA)
      grove__mha_next_call(r->f, n->mod, n->need_weights, n->average_weights);
    if (nmasks > 0) grove__next_call_masks(r->f, n->mod, nmasks, masks);
    r->f->channels_last_ok = cl;
    s = grove_module_forward(n->mod, r->f, &in, &out);
    /* A pre-hook that failed leaves the call options unread: drop them. */
    if (n->mod_kind == MK_MHA || nmasks > 0) grove__mha_next_call(r->f, NULL, true, true);
  }
  if (slice) {
    /* The part that allocated the buffer: the cat's from now on. */
    catbuf *cb = &r->cats[n->cat_into];
    if (!cb->data && r->f->into.data)
      *cb = (catbuf){r->f->into.data, r->f->into.n, r->f->into.h, r->f->into.w,
                     r->f->into.channels, 0, -1};
    memset(&r->f->into, 0, sizeof r->f->into);
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
      v->reg[k] = (int32_t)g;
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

static size_t catbuf_bytes(const catbuf *cb) {
  return (size_t)(cb->n * cb->C * cb->h * cb->w) * sizeof(float);
}

/* The new block of node i's result that holds the chain buffer i just made
 * (its result is a slice of it), or -1.  The block must be the whole
 * buffer, whose later slices its view does not reach. */
static int catbuf_block(const run *r, int i, const gval *v, newblk *blk, int nb) {
  const gnode *n = &r->g->nodes[i];
  if (n->cat_into < 0 || !r->cats || v->kind != V_TENSOR) return -1;
  const catbuf *cb = &r->cats[n->cat_into];
  const char *p = v->t[0].data, *b = (const char *)cb->data;
  if (!b || p < b || p >= b + catbuf_bytes(cb)) return -1;
  for (int k = 0; k < nb; k++)
    if (blk[k].tensors & 1) return k;
  return -1;
}

/* After node i: frees what died, keeps what it made. */
static grove_status settle(run *r, int i, gval *v, bool external) {
  const gnode *n = &r->g->nodes[i];
  newblk blk[GROVE_MAX_VALUES];
  int nb = classify(r, i, v, external, blk);
  const int cbk = catbuf_block(r, i, v, blk, nb);
  if (cbk >= 0) {
    catbuf *cb = &r->cats[n->cat_into];
    blk[cbk].start = (char *)cb->data;
    blk[cbk].bytes = catbuf_bytes(cb);
  }
  for (int k = 0; k < n->nargs; k++) release_args(r, &n->args[k], i);
  if (n->cat_planned && n->cat_into == i && r->cats && r->cats[i].reg >= 0) {
    r->regs[r->cats[i].reg].refs--; /* the chain's own reference (catbuf) */
    r->cats[i].reg = -1;
  }
  if (n->last_use < 0) {
    release(r, v); /* nobody reads it: its new blocks are simply forgotten */
    nb = 0;
  }
  int items[GROVE_MAX_VALUES];
  if (r->rec) {
    for (int k = 0; k < r->nregs; k++)
      if (r->regs[k].refs == 0 && r->regs[k].item >= 0) {
        grove__plan_rec_death(r->rec, r->regs[k].item, i);
        r->regs[k].item = -1;
      }
    for (int k = 0; k < nb; k++)
      items[k] = grove__plan_rec_block(r->rec, i, blk[k].start, blk[k].bytes);
  } else {
    for (int k = 0; k < nb; k++) items[k] = -1;
  }
  while (r->nregs > 0 && r->regs[r->nregs - 1].refs == 0) r->nregs--;
  grove_arena_mark top = r->nregs ? r->regs[r->nregs - 1].end : r->base;
  grove__keep keep[GROVE_MAX_VALUES];
  for (int k = 0; k < nb; k++) keep[k] = (grove__keep){blk[k].start, blk[k].bytes, NULL, {0}};
  grove_status s = GROVE_OK;
  if (r->plan) {
    /* Planned: the blocks must be those recorded, at their slots; they
     * stay there. */
    const grove__gplan *p = r->plan;
    if (nb != p->kfirst[i + 1] - p->kfirst[i]) {
      r->miss = true;
      return GROVE_OK;
    }
    for (int k = 0; k < nb; k++) {
      bool found = false;
      for (int j = p->kfirst[i]; j < p->kfirst[i + 1] && !found; j++) {
        const grove__gkeep *q = &p->keeps[j];
        found = blk[k].start == r->reserve + p->off[q->item] + q->delta && blk[k].bytes == q->bytes;
      }
      if (!found) {
        r->miss = true;
        return GROVE_OK;
      }
      keep[k].moved = blk[k].start;
      keep[k].end = r->pbase;
    }
    grove_arena_rewind(r->f->arena, r->pbase);
  } else if (r->passthru) {
    for (int k = 0; k < nb; k++) {
      keep[k].moved = blk[k].start;
      keep[k].end = grove_arena_mark_get(r->f->arena);
    }
  } else {
    s = grove__arena_keep(r->f->arena, top, keep, nb, r->f->err);
  }
  if (s) return s;
  for (int k = 0; k < nb; k++) {
    if (r->nregs >= r->g->max_regions)
      return grove_err_set(r->f->err, GROVE_E_INTERNAL, "graph: region table overflow");
    const ptrdiff_t delta = (char *)keep[k].moved - blk[k].start;
    if (k == cbk) {
      r->cats[n->cat_into].data = (float *)keep[k].moved;
      r->cats[n->cat_into].reg = n->cat_into != i ? r->nregs : -1;
    }
    for (int j = 0; j < v->n; j++) {
      if (!(blk[k].tensors & (1 << j))) continue;
      v->t[j].data = (char *)v->t[j].data + delta;
      v->reg[j] = (int32_t)r->nregs;
    }
    /* A chain's buffer starts with the chain's own reference, unless its
     * last cat made it. */
    const bool hold = k == cbk && n->cat_into != i;
    r->regs[r->nregs++] =
        (region){keep[k].moved, blk[k].bytes, hold ? 1 : 0, keep[k].end, items[k]};
    for (int j = 0; j < v->n; j++)
      if (blk[k].tensors & (1 << j)) r->regs[r->nregs - 1].refs++;
  }
  return GROVE_OK;
}

/* Copies [N, C, H, W] src into dst when both keep each position's C
 * channels together (strides[1] == 1: a channels-last tensor, a slice of a
 * chain's buffer), one run of C floats a position; else as
 * grove_tensor_copy does, element by element along W. */
static grove_status copy_part(grove_tensor *dst, const grove_tensor *src, grove_err *err) {
  if (src->strides[1] != 1 || dst->strides[1] != 1 || src->dtype != GROVE_F32)
    return grove_tensor_copy(dst, src, err);
  const size_t bytes = (size_t)src->shape[1] * sizeof(float);
  for (int64_t i = 0; i < src->shape[0]; i++)
    for (int64_t h = 0; h < src->shape[2]; h++)
      for (int64_t w = 0; w < src->shape[3]; w++)
        memcpy((float *)dst->data + i * dst->strides[0] + h * dst->strides[2] + w * dst->strides[3],
               (const float *)src->data + i * src->strides[0] + h * src->strides[2] +
                   w * src->strides[3],
               bytes);
  return GROVE_OK;
}

/* A chain's cat node i (gnode.cat_planned): its result is the first
 * channels of the chain's buffer, made here when no part made it yet.  The
 * parts past the buffer's `filled` that are not in their slices (a
 * copied part, a convolution that could not take its slice) are copied
 * in, once for the whole chain.  *done false, nothing done, when a part
 * does not fit (the cat then runs as always and names what is wrong), or
 * when a hook or an observer may see the result (a module's input is then
 * a plain tensor, as without the plan). */
static grove_status cat_in_place(run *r, int i, gval *res, bool *done) {
  const gnode *n = &r->g->nodes[i];
  const int f = n->cat_into;
  catbuf *cb = &r->cats[f];
  const garg *items = n->args[0].items;
  const int np = n->args[0].n;
  *done = false;
  if (!r->fuse || r->f->observer) return GROVE_OK;
  const grove_tensor *t0 = &r->vals[items[0].node].t[0];
  int64_t C = 0;
  for (int k = 0; k < np; k++) {
    const gval *v = &r->vals[items[k].node];
    if (v->kind != V_TENSOR) return GROVE_OK;
    const grove_tensor *t = &v->t[0];
    if (t->dtype != GROVE_F32 || t->ndim != 4 || t->shape[0] != t0->shape[0] ||
        t->shape[2] != t0->shape[2] || t->shape[3] != t0->shape[3])
      return GROVE_OK;
    C += t->shape[1];
  }
  if (cb->data && (cb->n != t0->shape[0] || cb->h != t0->shape[2] || cb->w != t0->shape[3] ||
                   C > cb->C))
    return GROVE_OK;
  if (!cb->data) {
    const int64_t all = chain_channels(r, f, r->g->nodes[f].args[0].n);
    uint64_t bytes;
    if (all < C ||
        grove__mul_overflow_u64((uint64_t)(t0->shape[0] * all),
                                (uint64_t)(t0->shape[2] * t0->shape[3] * 4), &bytes) ||
        bytes > SIZE_MAX / 2)
      return GROVE_OK;
    float *d = grove_arena_alloc(r->f->arena, (size_t)bytes + 1);
    if (!d) return GROVE_OK;
    *cb = (catbuf){d, t0->shape[0], t0->shape[2], t0->shape[3], all, 0, -1};
  }
  grove_tensor y;
  const int64_t shape[4] = {cb->n, C, cb->h, cb->w};
  grove_tensor_init(&y, GROVE_F32, 4, shape, cb->data);
  y.strides[0] = cb->h * cb->w * cb->C;
  y.strides[1] = 1;
  y.strides[2] = cb->w * cb->C;
  y.strides[3] = cb->C;
  int64_t off = 0;
  for (int k = 0; k < np; off += r->vals[items[k].node].t[0].shape[1], k++) {
    if (k < cb->filled) continue;
    const grove_tensor *t = &r->vals[items[k].node].t[0];
    grove_tensor dst = y;
    dst.shape[1] = t->shape[1];
    dst.data = cb->data + off;
    bool same = t->data == dst.data;
    for (int d = 0; same && d < 4; d++) same = t->strides[d] == dst.strides[d];
    if (same) continue;
    grove_status s = copy_part(&dst, t, r->f->err);
    if (s) return s;
  }
  if (np > cb->filled) cb->filled = np;
  set_tensor(res, &y);
  *done = true;
  return GROVE_OK;
}

/* ------------------------------------------------------------ forward */

/* The node of the graph's final `scale * x` (its output is that product,
 * one operand a placeholder), or -1.  Squeeze-excitation ends so. */
static int tail_mul(const graph_impl *g) {
  const garg *o = &g->nodes[g->output].args[0];
  if (o->kind != A_NODE) return -1;
  const gnode *n = &g->nodes[o->node];
  if (n->op != G_MUL || n->nargs != 2 || n->args[0].kind != A_NODE ||
      n->args[1].kind != A_NODE || n->uses != 1)
    return -1;
  const bool x0 = g->nodes[n->args[0].node].op == G_PLACEHOLDER;
  const bool x1 = g->nodes[n->args[1].node].op == G_PLACEHOLDER;
  return x0 != x1 ? o->node : -1;
}

/* Node i, the tail multiply, left to the convolution after the graph
 * (grove_fwd.se): when x is a channels-last float32 [N, C, H, W] and the
 * other operand a per-channel scale, copies the scale per image into dst
 * and makes x the node's value.  False (the product then runs as usual)
 * for anything else. */
static bool tail_scale_take(run *r, int i, float *dst, int64_t cap, gval *v) {
  const gnode *n = &r->g->nodes[i];
  const int xa = r->g->nodes[n->args[0].node].op == G_PLACEHOLDER ? 0 : 1;
  const gval *xv = &r->vals[n->args[xa].node], *sv = &r->vals[n->args[1 - xa].node];
  if (xv->kind != V_TENSOR || sv->kind != V_TENSOR) return false;
  const grove_tensor *x = &xv->t[0], *t = &sv->t[0];
  if (x->dtype != GROVE_F32 || x->ndim != 4 || !grove__is_nhwc(x) || !grove__per_channel(t, x))
    return false;
  const int64_t N = x->shape[0], C = x->shape[1];
  if (N * C > cap) return false;
  const bool per_image = t->ndim == 4 && t->shape[0] > 1;
  const float *sd = t->data;
  for (int64_t k = 0; k < N; k++)
    memcpy(dst + k * C, sd + (per_image ? k * C : 0), (size_t)C * sizeof(float));
  *v = *xv;
  return true;
}

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
  if (r->out_copy) /* recording: what this takes above a plan's block, staged */
    for (int j = 0; j < nk; j++) *r->out_copy += 2 * (keep[j].bytes + 64);
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
  return grove__graph_run(m, f, in, NULL, NULL, out, NULL);
}

static grove_status run_graph(const grove_module *m, grove_fwd *f, const grove_values *in,
                              const int *in_vars, const grove__graph_tape *tr, grove_values *out,
                              int *out_vars, const grove__gplan *plan, grove__plan_rec *rec,
                              bool *miss, size_t *out_copy) {
  const graph_impl *g = m->impl;
  if (in->n > g->nplaceholders)
    return tr ? grove_err_set(f->err, GROVE_E_INVALID_ARGUMENT,
                              "forward takes %d input(s), got %d", g->nplaceholders, in->n)
              : grove_err_set(f->err, GROVE_E_INVALID_ARGUMENT,
                              "%s: forward takes %d input(s), got %d", g->where, g->nplaceholders,
                              in->n);
  run r = {.g = g,
           .f = f,
           .in = in,
           .fuse = !tr && grove__no_forward_hooks(),
           .channels_last = !tr && f->channels_last_ok,
           .tr = tr,
           .res_done = -1,
           .plan = plan,
           .rec = rec,
           .out_copy = out_copy,
           .passthru = !tr && !plan && !rec && grove__arena_busy(f->arena)};
  /* A graph with chains of cats in place, run inside a node of a graph
   * being recorded, runs passthru: none of its blocks moves down, so its
   * chains' buffers and every step's scratch stay where they were made,
   * and the whole of it stays in the arena until that node ends (DenseNet's
   * dense blocks under its root graph: planned forwards at batch 1 took 17%
   * longer than unplanned ones, the memory no longer in cache).  The root's
   * plan is then kept bad: that signature runs unplanned. */
  if (r.passthru && g->has_cat_plans) grove__arena_refuse_plan(f->arena);
  r.vals = grove_arena_alloc(f->arena, (size_t)g->nnodes * sizeof(gval));
  r.regs = tr ? NULL : grove_arena_alloc(f->arena, (size_t)g->max_regions * sizeof(region));
  if (!tr && g->has_cat_plans) {
    r.cats = grove_arena_alloc(f->arena, (size_t)g->nnodes * sizeof(catbuf));
    if (r.cats) memset(r.cats, 0, (size_t)g->nnodes * sizeof(catbuf));
  }
  if (!r.vals || (!tr && !r.regs) || (!tr && g->has_cat_plans && !r.cats))
    return grove_err_set(f->err, GROVE_E_NOMEM, "out of scratch memory");
  r.base = grove_arena_mark_get(f->arena);
  if (plan) {
    r.reserve = grove_arena_alloc(f->arena, plan->total);
    if (!r.reserve) return grove_err_set(f->err, GROVE_E_NOMEM, "out of scratch memory");
    r.pbase = grove_arena_mark_get(f->arena);
  }
  /* A Sequential's offer to take this graph's final `scale * x` into the
   * next convolution (grove_fwd.se): for this call only, not the graphs
   * it calls. */
  float *se_dst = NULL;
  int64_t se_cap = 0;
  int se_node = -1;
  if (f->se.for_module == m) {
    se_dst = f->se.dst;
    se_cap = f->se.cap;
    se_node = tr ? -1 : tail_mul(g);
  }
  f->se.for_module = NULL;
  f->se.dst = NULL;
  f->se.done = false;
  int next_input = 0;
  for (int i = 0; i < g->nnodes; i++) {
    grove__yield_point();
    const gnode *n = &g->nodes[i];
    gval *v = &r.vals[i];
    v->kind = V_NONE;
    v->n = 0;
    v->none_mask = 0;
    for (int k = 0; k < GROVE_MAX_VALUES; k++) v->reg[k] = -1;
    v->nest = 0;
    grove_status s = GROVE_OK;
    bool external = false;
    if (plan && n->op != G_OUTPUT)
      grove__arena_place(f->arena, r.reserve, plan->off + plan->first[i],
                         plan->size + plan->first[i], plan->first[i + 1] - plan->first[i]);
    if (rec) grove__plan_rec_node(rec, i);
    switch (n->op) {
      case G_PLACEHOLDER:
        external = true;
        if (next_input < in->n) {
          set_tensor(v, &in->v[next_input]);
          if (tr) v->reg[0] = (int32_t)in_vars[next_input];
        } else if (n->has_default) {
          const garg *d = &n->dflt;
          v->kind = d->kind == A_INT     ? V_INT
                    : d->kind == A_FLOAT ? V_FLOAT
                    : d->kind == A_BOOL  ? V_BOOL
                                         : V_NONE;
          v->i = d->i;
          v->f = d->f;
        } else {
          return tr ? grove_err_set(f->err, GROVE_E_INVALID_ARGUMENT,
                                    "forward takes %d input(s), got %d ('%s' is missing)",
                                    g->nplaceholders, in->n, n->name)
                    : grove_err_set(f->err, GROVE_E_INVALID_ARGUMENT,
                                    "%s: forward takes %d input(s), got %d ('%s' is missing)",
                                    g->where, g->nplaceholders, in->n, n->name);
        }
        next_input++;
        break;
      case G_GET_ATTR: {
        external = true;
        if (tr) {
          s = tr->get_attr(tr->tape, n, v);
          break;
        }
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
        if (tr) {
          s = tr->call_module(tr->tape, n, r.vals, v);
          break;
        }
        if (absorbed(&r, i)) {
          *v = r.vals[n->args[0].node]; /* computed by the node that absorbed it */
          v->reg[0] = -1;
          break;
        }
        s = run_module(&r, i, v);
        break;
      case G_OUTPUT:
        s = tr ? tape_output(&r, out, out_vars) : run_output(&r, out);
        if (s) return node_error(&r, i, s);
        return GROVE_OK;
      default:
        if (n->op == G_RELU && absorbed(&r, i)) {
          *v = r.vals[n->args[0].node];
          break;
        }
        if (n->op == G_ADD && absorbed(&r, i)) {
          /* The convolution's result, read through its BatchNorm's node. */
          const int last = r.g->nodes[n->fused_into].fuse_bn >= 0
                               ? r.g->nodes[n->fused_into].fuse_bn
                               : n->fused_into;
          *v = r.vals[last];
          v->reg[0] = -1;
          break;
        }
        if (i == se_node && tail_scale_take(&r, i, se_dst, se_cap, v)) {
          external = true; /* x: the caller's memory */
          f->se.done = true;
          break;
        }
        if (n->cat_planned && r.cats) {
          bool done;
          if ((s = cat_in_place(&r, i, v, &done)) || done) break;
        }
        s = run_op(&r, i, v);
        break;
    }
    /* A node that failed (an id past an embedding) is its input's fault,
     * not the plan's: its error is the forward's, and the plan stays good.
     * (As a miss, one bad request marked the plan bad for every later
     * forward at its signature.) */
    if (plan && !grove__arena_unplace(f->arena) && !s) {
      *miss = true;
      return GROVE_OK;
    }
    if (rec) grove__plan_rec_computed(rec, i);
    if (s) return node_error(&r, i, s);
    if (!tr && (s = settle(&r, i, v, external))) return node_error(&r, i, s);
    if (r.miss) {
      *miss = true;
      return GROVE_OK;
    }
  }
  return grove_err_set(f->err, GROVE_E_INTERNAL, "%s: graph without output", g->where);
}

/* Runs graph m, with an arena plan when it is a plain serving forward at
 * the root (graph_plan.c): no tape, no forward hook, no observer, no
 * squeeze-excitation offer, no chains of cats in place, and not inside a
 * node of a graph already recording or placed. */
grove_status grove__graph_run(const grove_module *m, grove_fwd *f, const grove_values *in,
                              const int *in_vars, const grove__graph_tape *tr, grove_values *out,
                              int *out_vars) {
  const graph_impl *g = m->impl;
  const bool plain = !tr && g->plans && !g->has_cat_plans && !f->observer &&
                     f->se.for_module != m && grove__no_forward_hooks() &&
                     !grove__arena_busy(f->arena);
  if (!plain) return run_graph(m, f, in, in_vars, tr, out, out_vars, NULL, NULL, NULL, NULL);
  bool record = false;
  const bool cl = f->channels_last_ok;
  const grove__gplan *p = grove__plan_find(g, in, cl, &record);
  if (p) {
    const grove_arena_mark m0 = grove_arena_mark_get(f->arena);
    bool miss = false;
    grove_status s = run_graph(m, f, in, in_vars, tr, out, out_vars, p, NULL, &miss, NULL);
    grove__arena_unplace(f->arena);
    if (!miss) return s;
    /* Something differed from the recording: this forward again the usual
     * way, and the plan never again. */
    grove__plan_bad(p);
    grove_arena_rewind(f->arena, m0);
    f->channels_last_ok = cl;
    return run_graph(m, f, in, in_vars, tr, out, out_vars, NULL, NULL, NULL, NULL);
  }
  grove__plan_rec *rec = record ? grove__plan_rec_begin(g, f->arena) : NULL;
  size_t rec_out = 0;
  grove_status s = run_graph(m, f, in, in_vars, tr, out, out_vars, NULL, rec, NULL, &rec_out);
  const size_t total = grove__plan_rec_end(rec, g, in, cl, s == GROVE_OK, f->arena);
  if (total) {
    /* The planned forwards take the plan's block above what this one
     * took before its first node: count that into the high water now, so
     * that the arena settles at its size on the next reset and the next
     * forward does not grow. */
    const grove_arena_mark top = grove_arena_mark_get(f->arena);
    const size_t pre = (size_t)g->nnodes * sizeof(gval) + (size_t)g->max_regions * sizeof(region) +
                       (g->has_cat_plans ? (size_t)g->nnodes * sizeof(catbuf) : 0) + 4 * 64;
    /* Above this forward's end, not its start: what the caller allocates
     * after it (a channels-last output made contiguous) then fits too. */
    if (grove_arena_alloc(f->arena, pre + total + rec_out)) grove_arena_rewind(f->arena, top);
  }
  return s;
}
