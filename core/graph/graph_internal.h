/* graph_internal.h: the compiled form of a graph module, shared by
 * graph_compile.c (model.json -> nodes), graph.c (running them for serving)
 * and backward_graph.c (running them on a training tape).  Never
 * installed. */
#ifndef GROVE_CORE_GRAPH_INTERNAL_H
#define GROVE_CORE_GRAPH_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "graph.h"
#include "ops.h"

/* What a call_module's target is, for binding and for its value. */
enum { MK_PLAIN, MK_MHA, MK_ENCODER };

typedef struct gnode {
  int op;                  /* G_* (ops.h): the node kind, or the op entry's id */
  const grove__opdef *def; /* call_function / call_method: the op entry */
  char *name;
  const char *what; /* the op's name in messages ("add", "call_module") */
  char *source;     /* "model.py:42: x = x + y" from the exporter, or NULL */
  garg *args;       /* bound: one per parameter of the op (call_module: the tensors) */
  int nargs;
  grove_module *mod; /* call_module, get_attr: the target (borrowed) */
  char *attr;   /* get_attr: the slot name of mod */
  int mod_kind; /* call_module */
  bool tuple;   /* call_module: the value is a tuple (MHA, a graph returning one) */
  bool need_weights, average_weights; /* MK_MHA */
  /* call_module of an attention or transformer module (MK_MHA, MK_ENCODER):
   * args[0 .. ntensors-1] are its tensors; any args after them are its mask
   * slots in the order of torch's forward (A_NONE for None). */
  int ntensors;
  bool has_default;                   /* placeholder */
  garg dflt;                          /* placeholder default */
  int uses;                           /* how many argument slots read this node */
  int last_use;                       /* index of the last node reading it; -1: none */
  /* Fusion (only when no forward hook is registered anywhere). */
  int fuse_bn;    /* conv: index of the BatchNorm2d node it absorbs, or -1 */
  int fuse_relu;  /* conv/Linear: index of the activation node it absorbs, or -1 */
  int fused_into; /* an absorbed node: the node that computes it, or -1 */
  /* What the fuse_relu node applies (a Linear: only ReLU), or NONE. */
  grove__act fuse_act;
  /* conv: a residual block's add after it (or after its fuse_bn), whose
   * other operand fuse_res comes from a node before the conv; fuse_relu is
   * then the activation after the add, or -1.  Whether the conv applies
   * the add is decided at run time (grove_fwd.res); -1: none. */
  int fuse_add, fuse_res;
  /* Concatenations in place (plan_cat_slices, graph_compile.c).  A chain
   * is a torch.cat(parts, 1) node F and the cats before it whose parts are
   * a prefix of F's (DenseNet's growing features; SqueezeNet's Fire: F
   * alone).  Every member has cat_into = F and cat_planned: its result is
   * the first channels of F's channels-last buffer, into which each part is
   * written or copied once.  A 2-d convolution whose result (or that of
   * the BatchNorm / activation fused after it) is part cat_part of F and
   * is read by the chain alone has cat_into = F too: it writes that result
   * straight into its slice (grove_fwd.into).  -1: not planned. */
  int cat_into, cat_part;
  bool cat_planned;
} gnode;

typedef struct graph_impl {
  grove_module_type type; /* this module's own vtable: name = the Python class */
  char *type_name;
  char *where;   /* for messages: "'blocks.0' (Block)" */
  bool compiled; /* false: a holder, not callable */
  gnode *nodes;
  int nnodes;
  int *placeholders;
  int nplaceholders;
  int output;         /* index of the output node */
  bool returns_tuple; /* the output's argument is a list */
  int max_regions;
  bool has_cat_plans; /* some node has cat_planned */
  struct grove__plans *plans; /* arena plans (graph_plan.c), or NULL */
} graph_impl;

/* ------------------------------------------------------------ arena plans (graph_plan.c) */

#define GROVE__MAX_PLANS 8

/* A block node i keeps: inside its allocation `item` (plan-wide index), at
 * delta, bytes long. */
typedef struct grove__gkeep {
  int item;
  size_t delta, bytes;
} grove__gkeep;

/* One signature's plan: node i's allocations are items [first[i],
 * first[i+1]), served at reserve + off[k] when of size[k]; the blocks it
 * keeps are keeps[kfirst[i] .. kfirst[i+1]).  Immutable once published but
 * for bad (a forward met something else: never used again). */
typedef struct grove__gplan {
  int nin;
  bool cl;
  grove_dtype dtype[GROVE_MAX_VALUES];
  int ndim[GROVE_MAX_VALUES];
  int64_t shape[GROVE_MAX_VALUES][GROVE_MAX_DIMS], strides[GROVE_MAX_VALUES][GROVE_MAX_DIMS];
  size_t total;
  int *first;
  size_t *off, *size;
  int *kfirst;
  grove__gkeep *keeps;
  atomic_bool bad;
} grove__gplan;

typedef struct grove__plans grove__plans;
typedef struct grove__plan_rec grove__plan_rec;

grove__plans *grove__plans_new(void);
void grove__plans_free(grove__plans *s);
/* The good plan for the inputs, or NULL; *record: none yet and room for one. */
const grove__gplan *grove__plan_find(const graph_impl *g, const grove_values *in, bool cl,
                                     bool *record);
void grove__plan_bad(const grove__gplan *p);
/* Recording a forward: begin (the arena logs from now on), before node i,
 * after its compute (before its settle), a block node i keeps (its plan
 * item or -1: the recording fails), the node where an item's region died,
 * and end (ok: the forward succeeded; builds and publishes the plan, returns
 * its block's size). */
grove__plan_rec *grove__plan_rec_begin(const graph_impl *g, grove_arena *a);
void grove__plan_rec_node(grove__plan_rec *r, int i);
void grove__plan_rec_computed(grove__plan_rec *r, int i);
int grove__plan_rec_block(grove__plan_rec *r, int i, const char *start, size_t bytes);
void grove__plan_rec_death(grove__plan_rec *r, int item, int i);
size_t grove__plan_rec_end(grove__plan_rec *r, const graph_impl *g, const grove_values *in, bool cl,
                           bool ok, grove_arena *a); /* the plan's size, or 0 */

/* ------------------------------------------------------------ the training option */

/* How the one evaluator (graph.c) runs a graph on a training tape.  train/
 * fills it (core/train/train_graph.c) and passes it to grove__graph_run;
 * graph/ only calls through these pointers, so no call goes up from graph/
 * to train/.  With a tape, each tensor of a value carries its tape var in
 * gval.reg[] (the slot that holds an arena region when serving), every
 * activation stays on the tape (no liveness, no compaction), nothing is
 * fused and nothing is written in place.  The tape's thread. */
typedef struct grove__graph_tape {
  void *tape;
  /* Operation node n: its training forward, recording its backward; c as
   * for the entry's forward (c->overwrite is 0). */
  grove_status (*op)(void *tape, const gnode *n, const grove__opctx *c, gval *res);
  /* call_module node n on the values vals. */
  grove_status (*call_module)(void *tape, const gnode *n, const gval *vals, gval *res);
  /* get_attr node n: a parameter read becomes a var whose gradient goes to
   * the parameter's .grad. */
  grove_status (*get_attr)(void *tape, const gnode *n, gval *res);
} grove__graph_tape;

/* Runs graph module m: serving (tr NULL; in_vars, out_vars NULL), or on the
 * tape tr, the inputs' vars in in_vars and the outputs' written to
 * out_vars.  Errors name the node. */
grove_status grove__graph_run(const grove_module *m, grove_fwd *f, const grove_values *in,
                              const int *in_vars, const grove__graph_tape *tr, grove_values *out,
                              int *out_vars);

/* The vtable slots every graph module's own type points at. */
grove_status grove__graph_forward(const grove_module *m, grove_fwd *f, const grove_values *in,
                                  grove_values *out);
void grove__graph_free_impl(void *impl);

#endif
