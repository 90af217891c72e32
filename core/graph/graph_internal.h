/* graph_internal.h: the compiled form of a graph module, shared by
 * graph_compile.c (model.json -> nodes), graph.c (running them for serving)
 * and backward_graph.c (running them on a training tape).  Never
 * installed. */
#ifndef GROVE_CORE_GRAPH_INTERNAL_H
#define GROVE_CORE_GRAPH_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "graph.h"

enum {
  A_NODE,
  A_INT,
  A_FLOAT,
  A_BOOL,
  A_NONE,
  A_STR,
  A_LIST,
  A_SLICE,
  A_ELLIPSIS,
};

typedef struct garg {
  int kind;
  int node;           /* A_NODE */
  int64_t i;          /* A_INT, A_BOOL */
  double f;           /* A_FLOAT */
  char *s;            /* A_STR */
  struct garg *items; /* A_LIST, A_SLICE (3: start, stop, step) */
  int n;
} garg;

enum {
  G_PLACEHOLDER,
  G_GET_ATTR,
  G_CALL_MODULE,
  G_OUTPUT,
  /* operations */
  G_ADD,
  G_SUB,
  G_MUL,
  G_DIV,
  G_FLOORDIV,
  G_MATMUL,
  G_RELU,
  G_GELU,
  G_SIGMOID,
  G_TANH,
  G_SOFTMAX,
  G_LOG_SOFTMAX,
  G_DROPOUT,
  G_FLATTEN,
  G_RESHAPE,
  G_VIEW,
  G_PERMUTE,
  G_TRANSPOSE,
  G_CAT,
  G_MEAN,
  G_SUM,
  G_GETITEM,
  G_SIZE,
  G_GETATTR,
  G_CONTIGUOUS,
};

/* What a call_module's target is, for binding and for its value. */
enum { MK_PLAIN, MK_MHA, MK_ENCODER };

typedef struct gnode {
  int op;
  char *name;
  const char *what; /* the op's name in messages ("add", "call_module") */
  char *source;     /* "model.py:42: x = x + y" from the exporter, or NULL */
  garg *args;       /* bound: one per parameter of the op (call_module: the tensors) */
  int nargs;
  grove_module *mod; /* call_module: the target (borrowed); ops: a hidden layer (owned) */
  bool own_mod;
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

/* A number a graph computes with (sizes, scalars): a Python int or float. */
typedef struct gnum {
  bool is_int;
  int64_t i; /* is_int */
  double f;  /* always: the value as a double */
} gnum;

/* Python's x OP y for two numbers, op G_ADD or G_SUB (x OP alpha * y),
 * G_MUL, G_DIV (true division: a float) or G_FLOORDIV (floored): ints stay
 * ints.  Division by zero is GROVE_E_RANGE with Python's message in err.
 * Both evaluators call it, so sizes compute alike in serving and in
 * training.  Any thread. */
grove_status grove__graph_arith(int op, gnum x, gnum y, gnum alpha, gnum *out, grove_err *err);

/* The vtable slots every graph module's own type points at. */
grove_status grove__graph_forward(const grove_module *m, grove_fwd *f, const grove_values *in,
                                  grove_values *out);
void grove__graph_free_impl(void *impl);

#endif
