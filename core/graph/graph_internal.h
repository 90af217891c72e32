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
  bool has_default;                   /* placeholder */
  garg dflt;                          /* placeholder default */
  int uses;                           /* how many argument slots read this node */
  int last_use;                       /* index of the last node reading it; -1: none */
  /* Fusion (only when no forward hook is registered anywhere). */
  int fuse_bn;    /* conv: index of the BatchNorm2d node it absorbs, or -1 */
  int fuse_relu;  /* conv/Linear: index of the ReLU node it absorbs, or -1 */
  int fused_into; /* an absorbed node: the node that computes it, or -1 */
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
} graph_impl;

/* The vtable slots every graph module's own type points at. */
grove_status grove__graph_forward(const grove_module *m, grove_fwd *f, const grove_values *in,
                                  grove_values *out);
void grove__graph_free_impl(void *impl);

#endif
