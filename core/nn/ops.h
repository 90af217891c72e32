/* ops.h: the one op table.  Every tensor operation Grove runs between
 * modules (a torch.fx call_function / call_method node) or as a parameter-
 * free torch.nn layer (ReLU, Softmax(dim), Flatten(start_dim, end_dim) ...)
 * is one grove__opdef, defined once in the file of its family
 * (ops_activation.c, ops_shape.c, ops_reduce.c, ops_binary.c) and listed
 * once in ops_table.c.  An entry carries:
 *   - its canonical name (the "target" of a model.json node) and every torch
 *     spelling the exporter maps to it (tools/grove_ops.json, generated from
 *     this table by tools/grove_ops_json.c);
 *   - its parameters as torch binds them (name, what it takes, default);
 *   - a compile-time check of the constant arguments (graph_compile.c calls
 *     it once the node is bound; the layer builder after reading model.json);
 *   - its forward, which reads bound arguments through the accessors below
 *     and writes one value (a tensor of any dtype, a tuple of tensors, a
 *     Python number or a tuple of ints);
 *   - the torch.nn module that means it, or none: the module's constructor
 *     arguments are op parameters (by name) with the module's own defaults,
 *     read from model.json by one builder (ops_table.c) and run by one
 *     forward (ops_module.c), the entry's.
 * core/nn/, under the graphs that bind and run it (core/graph/).  Internal
 * to libgrove (tests and tools/grove_ops_json.c include it).  The table is
 * constant: any thread may read it. */
#ifndef GROVE_CORE_OPS_H
#define GROVE_CORE_OPS_H

#include <stdbool.h>
#include <stdint.h>

#include "grove/grove.h"
#include "module_internal.h"

struct json_t;
typedef struct json_t json_t;

/* ------------------------------------------------------------ bound arguments */

/* One argument as bound at compile time: a constant, a reference to an
 * earlier node's value, or a list / slice of those. */
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
  char *s;            /* A_STR (owned) */
  struct garg *items; /* A_LIST, A_SLICE (3: start, stop, step) (owned) */
  int n;
} garg;

/* Frees what a points at and zeroes it. */
void grove__garg_fini(garg *a);

/* ------------------------------------------------------------ values */

/* A value a node computes.  Tensors are float32 today, but an op may take
 * and return any dtype (bool masks, int64 ids): it says which in its
 * parameters (grove__oppar.dtypes) and the accessor refuses others by name. */
/* V_DTYPE: x.dtype (i: the grove_dtype), which full / zeros / to take as a dtype. */
enum { V_NONE, V_TENSOR, V_TUPLE, V_INT, V_FLOAT, V_BOOL, V_INTS, V_DTYPE };

typedef struct gval {
  int8_t kind;
  int8_t n;                      /* V_TUPLE: tensors; V_INTS: ints */
  uint8_t none_mask;             /* V_TUPLE: entries that are None */
  /* V_TUPLE: 0, or k > 0 when the tuple is (t[0], ..., t[k-1], (t[k], ...,
   * t[n-1])): k + 1 items, the last a tuple of the rest (an LSTM's
   * (output, (h_n, c_n)) has k = 1; layers_rnn.c). */
  int8_t nest;
  int32_t reg[GROVE_MAX_VALUES]; /* the evaluator's handle of each tensor: its arena region
                                    when serving, its tape var when training (graph.c) */
  int64_t i;                     /* V_INT, V_BOOL */
  double f;                      /* V_FLOAT */
  int64_t ints[GROVE_MAX_DIMS];  /* V_INTS */
  grove_tensor t[GROVE_MAX_VALUES];
} gval;

/* ------------------------------------------------------------ the entry */

#define GROVE__OP_MAX_PARAMS 12 /* torchvision's shifted_window_attention takes 12 */

/* What a parameter takes (for the accessors' messages and the exporter). */
enum {
  P_TENSOR,  /* a tensor (its dtypes: grove__oppar.dtypes) */
  P_TENSORS, /* a list of tensors, or a tuple value */
  P_ANY,     /* a tensor, a number, a tuple (getitem's operand) */
  P_INT,
  P_INTS, /* a list of ints, a size() tuple, or one int */
  P_FLOAT,
  P_NUMBER,  /* an int or a float, constant or computed */
  P_OPERAND, /* a tensor or a number (a binary op's operand) */
  P_BOOL,
  P_STR,
  P_DTYPE,
  P_INDEX, /* getitem's index: an int, a slice, None, Ellipsis or a list of them */
  P_IGNORED, /* accepted for torch's sake, changes nothing in eval mode */
};

/* The default when an argument is not passed. */
enum { D_REQ, D_NONE, D_INT, D_FLOAT, D_BOOL, D_STR };

typedef struct grove__oppar {
  const char *name;
  int kind;        /* P_* */
  int dk;          /* D_* */
  double dv;       /* D_INT, D_FLOAT, D_BOOL */
  const char *ds;  /* D_STR */
  unsigned dtypes; /* P_TENSOR: bit per grove_dtype accepted; 0: any (the forward checks) */
  /* A module constructor argument read from model.json: its range
   * (numbers) or its choices (NULL-terminated strings). */
  double min, max;
  const char *const *choices;
  /* A module constructor argument whose torch attribute (and model.json
   * key) is not the op parameter's name: ConstantPad2d's "padding" is
   * pad's "pad".  NULL: the name. */
  const char *key;
  /* A required ints argument that model.json must give as a list (a
   * pad's: one int would not say which sides); others take one int too
   * (nn.Unfold(3)). */
  bool list_only;
} grove__oppar;

/* Parameter initialisers: REQ a required one, D* a default. */
#define OP_REQ(n, k) \
  { .name = n, .kind = k, .dk = D_REQ }
#define OP_NONE(n, k) \
  { .name = n, .kind = k, .dk = D_NONE }
#define OP_INT(n, v) \
  { .name = n, .kind = P_INT, .dk = D_INT, .dv = v }
#define OP_FLOAT(n, v) \
  { .name = n, .kind = P_FLOAT, .dk = D_FLOAT, .dv = v }
#define OP_BOOL(n, v) \
  { .name = n, .kind = P_BOOL, .dk = D_BOOL, .dv = v }
#define OP_STR(n, v) \
  { .name = n, .kind = P_STR, .dk = D_STR, .ds = v }

struct grove__opdef;

/* What a forward sees: the bound arguments of its node and the values they
 * refer to.  One per call, on the caller's stack; the forward's thread. */
typedef struct grove__opctx {
  grove_fwd *f;
  const struct grove__opdef *def;
  const garg *args;        /* one per parameter of def, bound */
  const gval *vals;        /* the values A_NODE arguments index */
  const grove_module *mod; /* run as a layer module: the module; else NULL */
  unsigned overwrite;      /* bit k: argument k's tensor dies here and nothing else reads its
                              memory: the result may be written over it (graph.c decides) */
} grove__opctx;

/* A compile-time check of the constant arguments a (one per parameter),
 * GROVE_E_SPEC / GROVE_E_UNSUPPORTED with a message starting with jp (the
 * node's JSON path).  Runs on the builder's thread. */
typedef grove_status (*grove__opcheck_fn)(const struct grove__opdef *d, const garg *a,
                                          const char *jp, grove_err *err);
/* The forward: reads c's arguments, writes *res (kind and payload); errors
 * set c->f->err without naming the node (the evaluator prefixes it). */
typedef grove_status (*grove__opforward_fn)(const grove__opctx *c, gval *res);

/* The most constructor arguments an op module has (Upsample: size,
 * scale_factor, mode, align_corners, recompute_scale_factor). */
#define GROVE__OPMOD_MAX_ARGS 5

/* The torch.nn module that means an op. */
typedef struct grove__opmod {
  const char *cls;                /* "Softmax": model.json's "type" */
  const grove_module_type *type;  /* its vtable (forward: grove__op_module_forward) */
  grove__oppar args[GROVE__OPMOD_MAX_ARGS]; /* constructor arguments, each named as an op
                                     parameter, with the module's defaults (Flatten:
                                     start_dim=1) */
  /* Optional: called after the builder read obj (Softmax warns of an
   * implicit dim). */
  void (*after_json)(const struct grove__opdef *d, const char *path, const garg *args);
  /* The builder runs the op's check on the constructor arguments (the
   * op's defaults elsewhere): Upsample's are F.interpolate's, refused
   * alike.  Off where a default means something else in a module
   * (Dropout's training=True is the module's mode). */
  bool check_args;
  /* How many tensors the module is called with: 0 or 1 (one), or 2
   * (CosineSimilarity(x1, x2)): the op's first parameters. */
  int inputs;
  /* Another torch.nn class that means the same op (ConstantPad1d, 2d, 3d
   * and ZeroPad2d are all F.pad), or NULL. */
  const struct grove__opmod *next;
} grove__opmod;

typedef struct grove__opdef {
  const char *name;  /* canonical: model.json's target */
  const char *alias; /* a second target name model.json may use ("concat"), or NULL */
  int id;            /* G_*: ops the evaluators treat specially; G_OP otherwise */
  /* Every torch spelling, NULL-terminated: "torch.relu",
   * "torch.nn.functional.relu(input,inplace)", "Tensor.relu(input)",
   * "operator.add(input,other)", "Tensor.view(input,*shape)".  Without a
   * parameter list the spelling binds positionally as the canonical list;
   * with one, as listed (torch's own order for that callable).  A Tensor
   * method's first parameter is self.  Exporter side only. */
  const char *const *torch;
  int varargs; /* the parameter that gathers extra positional args (view(x, 2, -1)), or -1 */
  grove__oppar p[GROVE__OP_MAX_PARAMS];
  grove__opcheck_fn check;     /* or NULL */
  grove__opforward_fn forward; /* never NULL */
  const grove__opmod *module;  /* or NULL */
  bool module_only;            /* no call_function/call_method target (yet) */
} grove__opdef;

/* Op ids.  Nodes that are not operations come first; G_OP is every op the
 * evaluators run through the table alone. */
enum {
  G_PLACEHOLDER,
  G_GET_ATTR,
  G_CALL_MODULE,
  G_OUTPUT,
  G_OP,
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
  G_MOD,
};

/* ------------------------------------------------------------ the table (ops_table.c) */

/* Every entry, in the order messages list them; *n the count. */
const grove__opdef *const *grove__ops(int *n);
/* The entry a model.json target names (name or alias), or NULL. */
const grove__opdef *grove__op_find(const char *target);
/* The entry one of whose module classes (d->module and its next chain) is
 * cls, or NULL; *md (when md is not NULL) that class's grove__opmod. */
const grove__opdef *grove__op_find_module(const char *cls, const grove__opmod **md);
/* "add, sub, ..." of every graph target (names, then alias): messages. */
void grove__op_list(char *buf, size_t n);

/* Builds the module of the entry whose module class is obj's "type" from
 * its model.json object (keys: the module's args), reading each constructor
 * argument with layer_json.c's readers (their ranges and choices are the
 * entry's).  The layer registry's builder for every op module. */
grove_status grove__op_module_from_json(const struct json_t *obj, const char *path,
                                        grove_module **out, grove_err *err);

/* The table as a JSON document (ops_json.c): what tools/grove_ops.json
 * holds.  A new reference, owned by the caller. */
json_t *grove__ops_json(void);

/* ------------------------------------------------------------ modules (ops_module.c) */

/* A module of class md (d->module or one of its next chain) whose
 * constructor arguments are args (values of md->args, in that order; n of
 * them; copied, lists and strings too).  The public constructors
 * (grove_relu_new ...) and the builder call it.  *out owned by the caller. */
grove_status grove__op_module_new(const grove__opdef *d, const grove__opmod *md, const garg *args,
                                  int n, grove_module **out, grove_err *err);
/* Every op module type's forward: d->forward on its one input tensor with
 * the bound constructor arguments. */
grove_status grove__op_module_forward(const grove_module *m, grove_fwd *f, const grove_values *in,
                                      grove_values *out);
/* Every op module type's free_impl. */
void grove__op_module_free(void *impl);
/* Defines an op module's vtable: var, named cls (torch's class). */
#define GROVE__OP_MODULE_TYPE(var, cls) \
  const grove_module_type var = {       \
      .name = cls, .forward = grove__op_module_forward, .free_impl = grove__op_module_free}
/* The bound argument i (a parameter of d) of an op module, or NULL when m
 * is not one (train.c reads Dropout's p, Softmax's dim ... from it). */
const garg *grove__op_module_arg(const grove_module *m, const char *name);

/* ------------------------------------------------------------ arguments (ops_args.c) */

/* The value A_NODE argument a refers to, or NULL for a constant. */
const gval *grove__op_val(const grove__opctx *c, const garg *a);
/* GROVE_E_INVALID_ARGUMENT "expected <what>". */
grove_status grove__op_want(const grove__opctx *c, const char *what);
/* Argument k as a tensor, checked against the parameter's dtypes:
 * GROVE_E_DTYPE "<op>: argument \"<name>\" must be a tensor of dtype <dtypes>, got <dtype>". */
grove_status grove__op_tensor(const grove__opctx *c, int k, const grove_tensor **t);
/* A Python number from a constant or a node; is_int tells int from float. */
bool grove__op_number(const grove__opctx *c, const garg *a, double *x, int64_t *ix, bool *is_int);
grove_status grove__op_int(const grove__opctx *c, const garg *a, int64_t *out);
/* A list of ints: [2, n, -1], a size() tuple node, or (allow_one) one int. */
grove_status grove__op_ints(const grove__opctx *c, const garg *a, bool allow_one, int64_t *out,
                            int *n);
/* Number of parameters of d. */
int grove__op_nparams(const grove__opdef *d);
/* Wraps a possibly negative dim into [0, ndim) as torch's maybe_wrap_dim
 * (a 0-d tensor counts as 1-d); false when out of range.  int64_t: a
 * graph's dim argument as given (cast to int first, 2^32 would be 0). */
bool grove__op_wrap_dim(int64_t dim, int ndim, int *out);
/* GROVE_E_SHAPE "<layer>: <what> <dim> is out of range for a <ndim>-d input
 * (expected in [lo, hi])". */
grove_status grove__op_dim_error(grove_fwd *f, const char *layer, const char *what, int64_t dim,
                                 int ndim);
/* A list of tensors (cat's): a list argument of tensor nodes, or a tuple
 * value; at most max; slots (may be NULL) gets each one's gval.reg. */
grove_status grove__op_tensors(const grove__opctx *c, const garg *a, grove_tensor *ts,
                               int32_t *slots, int max, int *n);
/* getitem's index (an int, a slice, None, Ellipsis or a list of them) as
 * graph_ops.h's basic-indexing list; ixs has room for GROVE_MAX_DIMS + 4.
 * With ids_out, one int64/int32 index tensor among slices is allowed: its
 * position gets a full slice in ixs, *ids_out the tensor (NULL: none) and
 * *ids_at its dim; without (NULL), a tensor index is refused.
 * (ops_shape.c) */
struct grove__index;
grove_status grove__op_index_list(const grove__opctx *c, const garg *ix, struct grove__index *ixs,
                                  int *n, const grove_tensor **ids_out, int *ids_at_out);
/* x's shape with dims sd..ed (wrapped, sd <= ed) merged into one, as
 * torch.flatten (a 0-d x becomes [1]); returns the new ndim.  The serving
 * forward and both training forwards (module and graph node) use it. */
int grove__flatten_shape(const grove_tensor *x, int sd, int ed, int64_t *shape);
/* softmax's dim: dim, or torch's _get_softmax_dim for dim=None. */
int64_t grove__softmax_dim(bool has_dim, int64_t dim, int ndim);
/* Results. */
void grove__op_set_tensor(gval *v, const grove_tensor *t);
void grove__op_set_int(gval *v, int64_t i);
/* A tuple of n tensors (chunk, split, an LSTM's (out, (h, c)) flattened). */
void grove__op_set_tuple(gval *v, const grove_tensor *ts, int n);
/* The name a message gives the op: its module class when it has one
 * ("ReLU": the messages layers gave), else its canonical name. */
const char *grove__op_label(const grove__opctx *c);

/* Sets a to p's default (GROVE_E_SPEC when p is required: the caller
 * words that message); GROVE_E_NOMEM for a string. */
grove_status grove__op_default(const grove__oppar *p, garg *a);

/* "%s: %s's argument %d must be %s" (jp, op, i, what): GROVE_E_SPEC. */
grove_status grove__op_want_const(const grove__opdef *d, const char *jp, int i, const char *what,
                                  grove_err *err);

/* A number a graph computes with (sizes, scalars): a Python int or float. */
typedef struct gnum {
  bool is_int;
  int64_t i; /* is_int */
  double f;  /* always: the value as a double */
} gnum;

/* Python's x OP y for two numbers, op G_ADD or G_SUB (x OP alpha * y),
 * G_MUL, G_DIV (true division: a float), G_FLOORDIV (floored) or G_MOD
 * (floored: the sign of y): ints stay ints.  Division by zero is GROVE_E_RANGE with Python's
 * message in err. Both evaluators call it, so sizes compute alike in serving and in training.  Any
 * thread.  (ops_binary.c) */
grove_status grove__graph_arith(int op, gnum x, gnum y, gnum alpha, gnum *out, grove_err *err);

/* torch.maximum / torch.minimum of arguments 0 and 1 (tensors, broadcast;
 * integers stay int64, bools bool, a float on either side gives float32):
 * also torch.max / torch.min called with a tensor for dim (ops_select.c).
 * (ops_binary.c) */
grove_status grove__op_max_min(const grove__opctx *c, gval *res, bool max);

#endif
