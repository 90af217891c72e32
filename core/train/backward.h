/* backward.h: the tape of a training forward, and what the training ops
 * (core/backward_*.c) share with the replica (core/train/train.c).  Internal to
 * libgrove (tests may include it).
 *
 * A training forward works on *vars*: every tensor it produces is a var (a
 * contiguous plain tensor in the replica's arena, plus a gradient that is
 * allocated the first time something flows back into it).  Every operation
 * that has a gradient pushes a *node* naming its input and output vars, its
 * module and whatever it saved.  Backward visits the nodes in reverse; a node
 * whose outputs received no gradient is skipped, and a node accumulates into
 * its inputs' gradients (only those that require one) and into its
 * parameters' .grad.  Values are immutable once made, so a node may save its
 * inputs and outputs by var index instead of copying them.
 *
 * Ops never read a layer's private impl: their settings (grove__tinfo) come
 * from the layers' settings accessors (grove__layer_settings_of, nn/), read
 * once when the replica is made.  And they compute from the parameter tensors themselves,
 * not from the packed copies a serving forward uses, so the optimizer may
 * change parameters between steps without any refresh. */
#ifndef GROVE_CORE_BACKWARD_H
#define GROVE_CORE_BACKWARD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "grove/grove.h"
#include "grove/train.h"
#include "layers_internal.h"
#include "module_internal.h"

struct json_t;

/* ------------------------------------------------------------ settings */

/* What a module is to the trainer.  Decoded from its model.json object. */
typedef enum grove__tkind {
  GROVE__TK_SEQUENTIAL = 1,
  GROVE__TK_LINEAR,
  GROVE__TK_IDENTITY,
  GROVE__TK_FLATTEN,
  GROVE__TK_DROPOUT,
  GROVE__TK_RELU,
  GROVE__TK_LEAKY_RELU,
  GROVE__TK_GELU,
  GROVE__TK_SILU,
  GROVE__TK_SIGMOID,
  GROVE__TK_TANH,
  GROVE__TK_SOFTMAX,
  GROVE__TK_LOG_SOFTMAX,
  GROVE__TK_BATCH_NORM, /* 1d and 2d */
  GROVE__TK_LAYER_NORM,
  GROVE__TK_EMBEDDING,
  GROVE__TK_CONV, /* 1d and 2d */
  GROVE__TK_MAX_POOL2D,
  GROVE__TK_AVG_POOL2D,
  GROVE__TK_ADAPTIVE_AVG_POOL2D,
  GROVE__TK_MHA,
  GROVE__TK_TEL,
  GROVE__TK_TE,
  GROVE__TK_GRAPH,
  GROVE__TK_HOLDER, /* ModuleList, ModuleDict, a graph module without graph: not callable */
} grove__tkind;

struct grove__tape;

typedef struct grove__tinfo {
  grove__tkind kind;
  const char *path; /* "fc1", "" for the root: owned by the replica */
  /* The layer's settings (layers_internal.h), read from the module the
   * serving builder made (grove__layer_settings_of), never from model.json
   * again: as one struct (set) and by name (info->eps). */
  union {
    grove__layer_settings set;
    struct {
      GROVE__LAYER_SETTINGS_FIELDS
    };
  };
  /* Graph modules. */
  void *graph; /* backward_graph.c's compiled form */
  /* The op's training forward (backward_*.c), chosen by kind when train.c
   * decodes the module; NULL for a container without forward. */
  grove_status (*fn)(struct grove__tape *t, const grove_module *m, const struct grove__tinfo *info,
                     const int *in, int nin, int *out, int *nout);
} grove__tinfo;

/* ------------------------------------------------------------ the tape */

typedef struct grove__tape grove__tape;
typedef struct grove__node grove__node;
typedef grove_status (*grove__backward_fn)(grove__tape *t, const grove__node *n);

#define GROVE__NODE_MAX_IN 4
#define GROVE__NODE_MAX_OUT 4

typedef struct grove__var {
  grove_tensor t;     /* contiguous plain tensor in the tape's arena */
  float *grad;        /* float32 vars: NULL until a gradient arrives */
  bool requires_grad; /* something upstream needs its gradient */
} grove__var;

struct grove__node {
  grove__backward_fn backward;
  const grove_module *m;    /* may be NULL (graph operations) */
  const grove__tinfo *info; /* may be NULL */
  int nin, nout;
  int in[GROVE__NODE_MAX_IN]; /* var indices; -1 for none */
  int out[GROVE__NODE_MAX_OUT];
  void *saved;              /* the op's own, in the arena */
  const grove_tensor *p[3]; /* parameters the op reads (weight, bias, ...) */
  int64_t i[8];             /* small op arguments */
  double d[4];
};

struct grove_replica;

struct grove__tape {
  grove_arena *arena;
  grove_err *err;
  grove__var *vars;
  size_t nvars, vars_cap;
  grove__node *nodes;
  size_t nnodes, nodes_cap;
  struct grove_replica *r;
  bool recording; /* false in an eval forward run through the tape (never) */
  /* grove__gemm's workspace (packed operands): one heap block that keeps
   * the size of the largest product seen, so a step allocates nothing. */
  void *ws;
  size_t ws_cap;
};

/* The replica (train.c owns it; tape.c reads its random state, settings
 * and parameter gradients for the ops). */
struct grove_replica {
  grove_model *model; /* the tree (train mode) and its io spec */
  grove_replica_opts opts;
  grove__pmap infos;    /* module -> grove__tinfo* */
  grove__tinfo **owned; /* every tinfo, to free */
  size_t nowned, owned_cap;
  grove_named_tensors params; /* de-duplicated, torch's order */
  grove_tensor **grads;       /* params.n entries, NULL = None */
  grove_tensor **spare;       /* gradients zero_grad set to None, kept for reuse */
  grove__pmap param_index;    /* tensor -> index + 1 */
  grove__tape tape;
  grove_err *err_slot;
  uint64_t rng[4];
  int in_vars[GROVE_MAX_VALUES], nin;
  int out_vars[GROVE_MAX_VALUES], nout;
  bool have_tape, backward_done;
};

/* A new var holding t (which must be contiguous and live in the arena or
 * outlive the tape).  Returns its index, or -1 with f->err set when out of
 * memory. */
int grove__var_new(grove__tape *t, const grove_tensor *value, bool requires_grad);
static inline grove__var *grove__var_at(grove__tape *t, int v) {
  return &t->vars[v];
}
static inline const grove_tensor *grove__val(grove__tape *t, int v) {
  return &t->vars[v].t;
}

/* Pushes a copy of n.  GROVE_E_NOMEM when the node list cannot grow. */
grove_status grove__node_add(grove__tape *t, const grove__node *n);

/* A contiguous uninitialised tensor in the arena. */
grove_status grove__talloc(grove__tape *t, grove_tensor *out, grove_dtype dt, int ndim,
                           const int64_t *shape);
/* n bytes of scratch in the arena (zeroed when zero), or NULL with err set. */
void *grove__tscratch(grove__tape *t, size_t n, bool zero);
/* A new var for a tensor of this shape: allocates it, makes the var, and
 * sets *data to its memory.  -1 on error. */
int grove__var_alloc(grove__tape *t, grove_dtype dt, int ndim, const int64_t *shape,
                     bool requires_grad, float **data);

/* The gradient of var v for accumulating into: allocated (zeroed) on first
 * use.  NULL with err set when out of memory. */
float *grove__grad(grove__tape *t, int v);
/* The same, except that memory allocated by this call is not zeroed and
 * *fresh says so: the caller then writes every element instead of adding
 * (a product with beta = 0 saves a pass over the memory). */
float *grove__grad_fresh(grove__tape *t, int v, bool *fresh);
/* A 64-byte aligned workspace of n bytes for grove__gemm, the tape's own
 * (reused by the next product: hold it for one call only).  NULL with err
 * set when out of memory. */
void *grove__tape_ws(grove__tape *t, size_t n);
/* grove__gemm (core/kernels/kernels.h: C[M,N] (+)= op(A) . op(B) with flags) on
 * the tape's workspace: Grove's kernel where the CPU has it, its yield
 * points included (a background session's products yield too), else
 * cblas_sgemm.  GROVE_E_NOMEM with err set when out of memory.  The tape's
 * thread. */
grove_status grove__tape_gemm(grove__tape *t, int flags, int64_t M, int64_t N, int64_t K,
                              const float *A, int64_t lda, const float *B, int64_t ldb, float *C,
                              int64_t ldc);
/* y = x . W^T for a training forward: x [M, K], rows [r0, r0 + N) of W
 * [*, K] (torch's layout), y [M, N], all contiguous; grove__gemm with the
 * tape's workspace.  GROVE_E_NOMEM with err set when out of memory. */
grove_status grove__tape_linear(grove__tape *t, const float *x, int64_t M, int64_t K,
                                const float *W, int64_t N, float *y);
/* The gradient of v if one has arrived, else NULL. */
static inline const float *grove__grad_in(grove__tape *t, int v) {
  return v >= 0 ? t->vars[v].grad : NULL;
}
/* Whether input v of a node wants a gradient. */
static inline bool grove__wants(grove__tape *t, int v) {
  return v >= 0 && t->vars[v].requires_grad && t->vars[v].t.dtype == GROVE_F32;
}

/* The .grad of a parameter tensor of the replica, allocated (zeroed) on
 * first use, as float32 data to accumulate into.  *g is NULL (and the status
 * OK) for a tensor that is not one of the replica's parameters (a buffer). */
grove_status grove__param_grad(grove__tape *t, const grove_tensor *param, float **g);
/* The same, except that a .grad that this call creates (or takes back from
 * the memory zero_grad kept) is not zeroed and *fresh says so: the caller
 * must then write every element of it instead of adding. */
grove_status grove__param_grad_fresh(grove__tape *t, const grove_tensor *param, float **g,
                                     bool *fresh);
/* The parameter or None, checked to be a contiguous float32 tensor with n
 * elements (n < 0: any).  GROVE_E_DTYPE / GROVE_E_SHAPE naming the module. */
grove_status grove__param_f32(grove__tape *t, const grove_module *m, const char *name, int64_t n,
                              const grove_tensor **out);

/* The replica's Dropout generator: uniform in [0, 1). */
double grove__tape_uniform(grove__tape *t);

/* Whether any input var of the list requires a gradient. */
bool grove__any_requires(grove__tape *t, const int *in, int n);

/* ------------------------------------------------------------ dispatch */

/* The training forward of module m on input vars in[0, nin): writes its
 * output vars to out (*nout of them).  Dispatches on m's tinfo.  Any
 * failure sets t->err naming the module's path. */
grove_status grove__train_call(grove__tape *t, const grove_module *m, const int *in, int nin,
                               int *out, int *nout);
/* m's settings, or NULL for a module the replica does not know. */
const grove__tinfo *grove__tinfo_of(grove__tape *t, const grove_module *m);

/* Each op's training forward (backward_*.c).  Same contract as
 * grove__train_call; info is m's. */
typedef grove_status (*grove__train_fn)(grove__tape *t, const grove_module *m,
                                        const grove__tinfo *info, const int *in, int nin, int *out,
                                        int *nout);
grove_status grove__tf_linear(grove__tape *, const grove_module *, const grove__tinfo *,
                              const int *, int, int *, int *);
grove_status grove__tf_activation(grove__tape *, const grove_module *, const grove__tinfo *,
                                  const int *, int, int *, int *);
grove_status grove__tf_softmax(grove__tape *, const grove_module *, const grove__tinfo *,
                               const int *, int, int *, int *);
grove_status grove__tf_flatten(grove__tape *, const grove_module *, const grove__tinfo *,
                               const int *, int, int *, int *);
grove_status grove__tf_dropout(grove__tape *, const grove_module *, const grove__tinfo *,
                               const int *, int, int *, int *);
grove_status grove__tf_embedding(grove__tape *, const grove_module *, const grove__tinfo *,
                                 const int *, int, int *, int *);
grove_status grove__tf_batch_norm(grove__tape *, const grove_module *, const grove__tinfo *,
                                  const int *, int, int *, int *);
grove_status grove__tf_layer_norm(grove__tape *, const grove_module *, const grove__tinfo *,
                                  const int *, int, int *, int *);
grove_status grove__tf_conv(grove__tape *, const grove_module *, const grove__tinfo *, const int *,
                            int, int *, int *);
grove_status grove__tf_pool(grove__tape *, const grove_module *, const grove__tinfo *, const int *,
                            int, int *, int *);
grove_status grove__tf_mha(grove__tape *, const grove_module *, const grove__tinfo *, const int *,
                           int, int *, int *);
grove_status grove__tf_tel(grove__tape *, const grove_module *, const grove__tinfo *, const int *,
                           int, int *, int *);
grove_status grove__tf_te(grove__tape *, const grove_module *, const grove__tinfo *, const int *,
                          int, int *, int *);
grove_status grove__tf_graph(grove__tape *, const grove_module *, const grove__tinfo *, const int *,
                             int, int *, int *);

/* ------------------------------------------------------------ functional ops */

/* Differentiable operations on vars, for the composite layers and graphs
 * (backward_ops.c: activations to reshape; backward_tensor.c: the rest).  Each makes its output
 * var(s) and pushes its node. Errors set t->err. */

/* Activations by tinfo kind (RELU ... TANH; info carries slope and
 * tanh_approx); a NULL info means ReLU. */
grove_status grove__top_act(grove__tape *t, grove__tkind kind, const grove__tinfo *info, int x,
                            int *y);
/* softmax / log_softmax over dim (already wrapped). */
grove_status grove__top_softmax(grove__tape *t, int x, int dim, bool as_log, int *y);
/* y = x W^T (+ b), W [N, K] and b [N] float32 parameter tensors (b may be
 * NULL), over x's last dimension. */
grove_status grove__top_linear(grove__tape *t, int x, const grove_tensor *W, const grove_tensor *b,
                               int *y);
/* The same with rows [r0, r0 + n) of W and b only (a packed projection). */
grove_status grove__top_linear_rows(grove__tape *t, int x, const grove_tensor *W,
                                    const grove_tensor *b, int64_t r0, int64_t n, int *y);
/* Inverted dropout with probability p (0 <= p <= 1) from the replica's
 * generator; the identity (no node, y = x) when p is 0. */
grove_status grove__top_dropout(grove__tape *t, int x, double p, int *y);
/* LayerNorm over the last D elements with weight/bias (either may be NULL). */
grove_status grove__top_layer_norm(grove__tape *t, int x, int64_t D, double eps,
                                   const grove_tensor *w, const grove_tensor *b, int *y);
/* Elementwise a OP b with torch's broadcasting (GROVE__BIN_*); alpha scales
 * b for add and sub.  A scalar operand is a var holding a 0-d tensor. */
grove_status grove__top_binary(grove__tape *t, int op, int a, int b, double alpha, int *y);
/* a OP s (s a number on the right), or s OP a when reversed. */
grove_status grove__top_scalar(grove__tape *t, int op, int a, double s, bool reversed, int *y);
/* torch.matmul (1-d operands and batch broadcasting). */
grove_status grove__top_matmul(grove__tape *t, int a, int b, int *y);
/* reshape to shape (already resolved: no -1). */
grove_status grove__top_reshape(grove__tape *t, int x, int nd, const int64_t *shape, int *y);
/* permute by dims (already wrapped). */
grove_status grove__top_permute(grove__tape *t, int x, int nd, const int64_t *dims, int *y);
/* cat along dim (already wrapped). */
grove_status grove__top_cat(grove__tape *t, const int *xs, int n, int dim, int *y);
/* mean or sum over the dims flagged in mask (bit d = reduce dim d). */
grove_status grove__top_reduce(grove__tape *t, int x, bool mean, uint32_t mask, bool keepdim,
                               int *y);
/* Basic indexing: y = x[ix...] made contiguous (a copy, so grads scatter
 * back).  ix as graph.h's grove__index (slices with step >= 1). */
struct grove__index;
grove_status grove__top_index(grove__tape *t, int x, const struct grove__index *ix, int n, int *y);

/* MultiheadAttention m (settings info) on query q, key k, value v
 * (backward_attention.c): *out the attention output, *weights the weights
 * (averaged over heads when average) when need_weights, else -1. */
grove_status grove__mha_run(grove__tape *t, const grove_module *m, const grove__tinfo *info, int q,
                            int k, int v, bool need_weights, bool average, int *out, int *weights);

/* ------------------------------------------------------------ replica internals */

/* Runs every module's refresh (children first), as load_state_dict does, so
 * that the serving forward sees the parameters the optimizer changed. */
grove_status grove__refresh_tree(grove_module *root, grove_err *err);

/* The settings of a graph module (train_graph.c): info->graph borrows the
 * node list graph_compile.c compiled for serving. */
grove_status grove__tgraph_compile(grove__tinfo *info, const grove_module *m, grove_err *err);
void grove__tgraph_free(void *graph);

#endif
