/* graph.c: modules with a custom forward, run from the node list of their
 * torch.fx graph (model.json "graph"; the format is in docs/model-spec.md).
 *
 * Compile (once, when the tree is built): every node's target is resolved
 * (call_module to a module of the subtree, get_attr to a parameter or buffer
 * slot, call_function/call_method to one of the operations Grove runs), its
 * arguments are bound to the operation's parameters (positional, then
 * keyword, then torch's defaults) and checked where they are constants, and
 * each node learns the index of its last reader.  Anything Grove cannot run is
 * refused here, naming the JSON path of the node.  A conv -> BatchNorm2d ->
 * ReLU chain (and Linear -> ReLU, conv -> ReLU) whose intermediates have no
 * other reader is marked for fusion.
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
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph.h"
#include "layers_internal.h"
#include "observe.h"

/* ============================================================ compiled form */

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
  int node;  /* A_NODE */
  int64_t i; /* A_INT, A_BOOL */
  double f;  /* A_FLOAT */
  char *s;   /* A_STR */
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
  grove_module *mod;  /* call_module: the target (borrowed); ops: a hidden layer (owned) */
  bool own_mod;
  char *attr;         /* get_attr: the slot name of mod */
  int mod_kind;       /* call_module */
  bool tuple;         /* call_module: the value is a tuple (MHA, a graph returning one) */
  bool need_weights, average_weights; /* MK_MHA */
  bool has_default;   /* placeholder */
  garg dflt;          /* placeholder default */
  int uses;           /* how many argument slots read this node */
  int last_use;       /* index of the last node reading it; -1: none */
  /* Fusion (only when no forward hook is registered anywhere). */
  int fuse_bn;     /* conv: index of the BatchNorm2d node it absorbs, or -1 */
  int fuse_relu;   /* conv/Linear: index of the ReLU node it absorbs, or -1 */
  int fused_into;  /* an absorbed node: the node that computes it, or -1 */
  int nhwc_to;     /* fused conv: the Conv2d node that alone reads the chain's result, or -1 */
} gnode;

typedef struct graph_impl {
  grove_module_type type; /* this module's own vtable: name = the Python class */
  char *type_name;
  char *where;      /* for messages: "'blocks.0' (Block)" */
  bool compiled;    /* false: a holder, not callable */
  gnode *nodes;
  int nnodes;
  int *placeholders;
  int nplaceholders;
  int output;          /* index of the output node */
  bool returns_tuple;  /* the output's argument is a list */
  int max_regions;
} graph_impl;

static void garg_fini(garg *a) {
  if (!a) return;
  free(a->s);
  for (int i = 0; i < a->n; i++) garg_fini(&a->items[i]);
  free(a->items);
  memset(a, 0, sizeof *a);
}

static void graph_free_impl(void *impl) {
  graph_impl *g = impl;
  if (!g) return;
  for (int i = 0; i < g->nnodes; i++) {
    gnode *n = &g->nodes[i];
    free(n->name);
    free(n->source);
    free(n->attr);
    for (int k = 0; k < n->nargs; k++) garg_fini(&n->args[k]);
    free(n->args);
    garg_fini(&n->dflt);
    if (n->own_mod) grove_module_release(n->mod);
  }
  free(g->nodes);
  free(g->placeholders);
  free(g->type_name);
  free(g->where);
  free(g);
}

static grove_status graph_forward(const grove_module *m, grove_fwd *f, const grove_values *in,
                                  grove_values *out);

bool grove__is_graph(const grove_module *m) {
  return m && m->type && m->type->free_impl == graph_free_impl;
}

/* ============================================================ small helpers */

static grove_status nomem(grove_err *err) {
  return grove_err_set(err, GROVE_E_NOMEM, "out of memory");
}

static bool is_identifier(const char *s) {
  if (!s || !*s || !((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || *s == '_'))
    return false;
  for (; *s; s++)
    if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') ||
          *s == '_'))
      return false;
  return true;
}

/* ============================================================ building */

static grove_status declare_tensors(grove_module *m, const json_t *decl, const char *path,
                                    const char *key, bool buffers, grove_err *err) {
  if (!decl) return GROVE_OK;
  if (!json_is_object(decl))
    return grove_err_set(err, GROVE_E_SPEC,
                         "%s.%s: expected an object mapping a name to {\"shape\": [...], "
                         "\"dtype\": ...}",
                         path, key);
  const char *name;
  json_t *v;
  json_object_foreach((json_t *)decl, name, v) {
    static const char *const pkeys[] = {"shape", "dtype", NULL};
    static const char *const bkeys[] = {"shape", "dtype", "persistent", NULL};
    const char *const *allowed = buffers ? bkeys : pkeys;
    if (json_is_null(v)) { /* a None slot */
      grove_err e = {0};
      grove_status s = buffers ? grove_module_register_buffer(m, name, NULL, true, &e)
                               : grove_module_register_parameter(m, name, NULL, &e);
      if (s)
        return grove_err_set(err, s == GROVE_E_NOMEM ? s : GROVE_E_SPEC, "%s.%s.%s: %s", path, key,
                             name, grove_err_msg(&e));
      continue;
    }
    if (!json_is_object(v))
      return grove_err_set(err, GROVE_E_SPEC, "%s.%s.%s: expected {\"shape\": [...]} or null",
                           path, key, name);
    const char *k;
    json_t *kv;
    json_object_foreach(v, k, kv) {
      bool ok = false;
      for (int i = 0; allowed[i]; i++) ok |= strcmp(allowed[i], k) == 0;
      if (!ok)
        return grove_err_set(err, GROVE_E_SPEC, "%s.%s.%s.%s: unknown key (known: %s)", path, key,
                             name, k, buffers ? "shape, dtype, persistent" : "shape, dtype");
    }
    const json_t *sh = json_object_get(v, "shape");
    int64_t shape[GROVE_MAX_DIMS];
    size_t nd = json_is_array(sh) ? json_array_size(sh) : 0;
    bool ok = json_is_array(sh) && nd <= GROVE_MAX_DIMS;
    for (size_t i = 0; ok && i < nd; i++) {
      const json_t *d = json_array_get(sh, i);
      ok = json_is_integer(d) && json_integer_value(d) >= 0 &&
           json_integer_value(d) <= ((json_int_t)1 << 40);
      if (ok) shape[i] = (int64_t)json_integer_value(d);
    }
    if (!ok)
      return grove_err_set(err, GROVE_E_SPEC,
                           "%s.%s.%s.shape: expected a list of at most %d non-negative integers",
                           path, key, name, GROVE_MAX_DIMS);
    grove_dtype dt = GROVE_F32;
    const json_t *dv = json_object_get(v, "dtype");
    if (dv && (!json_is_string(dv) || !grove_dtype_from_name(json_string_value(dv), &dt)))
      return grove_err_set(err, GROVE_E_SPEC, "%s.%s.%s.dtype: expected a dtype name (float32, "
                           "int64, ...)", path, key, name);
    if (!buffers && !grove_dtype_is_float(dt))
      return grove_err_set(err, GROVE_E_SPEC,
                           "%s.%s.%s.dtype: a parameter is floating point, got %s", path, key, name,
                           grove_dtype_name(dt));
    if (grove_dtype_is_float(dt)) dt = GROVE_F32; /* Grove computes in float32 */
    bool persistent = true;
    const json_t *pv = json_object_get(v, "persistent");
    if (pv && !json_is_boolean(pv))
      return grove_err_set(err, GROVE_E_SPEC, "%s.%s.%s.persistent: expected true or false", path,
                           key, name);
    if (pv) persistent = json_is_true(pv);
    if (!persistent)
      return grove_err_set(err, GROVE_E_UNSUPPORTED,
                           "%s.%s.%s.persistent: a non-persistent buffer is not in the state_dict, "
                           "so Grove could not load its value",
                           path, key, name);
    grove_err e = {0};
    grove_tensor *t = grove_tensor_new(dt, (int)nd, shape, &e);
    if (!t) return grove_err_set(err, e.code ? e.code : GROVE_E_NOMEM, "%s.%s.%s: %s", path, key,
                                 name, grove_err_msg(&e));
    grove_status s = buffers ? grove_module_register_buffer(m, name, t, true, &e)
                             : grove_module_register_parameter(m, name, t, &e);
    grove_tensor_release(t);
    if (s)
      return grove_err_set(err, s == GROVE_E_NOMEM ? s : GROVE_E_SPEC, "%s.%s.%s: %s", path, key,
                           name, grove_err_msg(&e));
  }
  return GROVE_OK;
}

grove_status grove__graph_from_json(const json_t *obj, const char *path, grove_module **out,
                                    grove_err *err) {
  static const char *const keys[] = {"type",   "graph",   "children", "parameters",
                                     "buffers", "tied", NULL};
  *out = NULL;
  const char *key;
  json_t *v;
  json_object_foreach((json_t *)obj, key, v) {
    bool ok = false;
    for (int i = 0; keys[i]; i++) ok |= strcmp(keys[i], key) == 0;
    if (!ok)
      return grove_err_set(err, GROVE_E_SPEC,
                           "%s.%s: unknown key of a module with a graph (known: type, graph, "
                           "children, parameters, buffers, tied)",
                           path, key);
  }
  const json_t *tv = json_object_get(obj, "type");
  if (!json_is_string(tv) || !is_identifier(json_string_value(tv)))
    return grove_err_set(err, GROVE_E_SPEC,
                         "%s.type: expected the module's Python class name (an identifier)", path);
  const json_t *gv = json_object_get(obj, "graph");
  if (!json_is_array(gv) && !json_is_null(gv))
    return grove_err_set(err, GROVE_E_SPEC,
                         "%s.graph: expected the list of torch.fx nodes, or null for a module "
                         "whose forward Grove never calls",
                         path);
  const json_t *kids = json_object_get(obj, "children");
  if (kids && !json_is_object(kids))
    return grove_err_set(err, GROVE_E_SPEC,
                         "%s.children: expected an object mapping attribute names to modules",
                         path);
  graph_impl *g = calloc(1, sizeof *g);
  if (!g) return nomem(err);
  g->type_name = grove__strdup(json_string_value(tv));
  if (!g->type_name) {
    free(g);
    return nomem(err);
  }
  g->type.name = g->type_name;
  g->type.forward = NULL; /* until compiled */
  g->type.free_impl = graph_free_impl;
  grove_module *m = grove_module_new(&g->type, g, err);
  if (!m) return err && err->code ? err->code : GROVE_E_NOMEM;
  grove_status s =
      declare_tensors(m, json_object_get(obj, "parameters"), path, "parameters", false, err);
  if (!s) s = declare_tensors(m, json_object_get(obj, "buffers"), path, "buffers", true, err);
  if (s) {
    grove_module_release(m);
    return s;
  }
  *out = m;
  return GROVE_OK;
}

/* ------------------------------------------------------------ the op table */

enum { D_REQ, D_NONE, D_INT, D_FLOAT, D_BOOL, D_STR };

typedef struct pdef {
  const char *name;
  int dk;
  double dv;
  const char *ds;
} pdef;

typedef struct opdef {
  const char *name;
  int op;
  int varargs; /* a parameter that gathers extra positional arguments, or -1 */
  pdef p[5];
} opdef;

#define REQ(n) {n, D_REQ, 0, NULL}
#define DNONE(n) {n, D_NONE, 0, NULL}
#define DINT(n, v) {n, D_INT, v, NULL}
#define DBOOL(n, v) {n, D_BOOL, v, NULL}
#define DSTR(n, v) {n, D_STR, 0, v}

static const opdef opdefs[] = {
    {"add", G_ADD, -1, {REQ("input"), REQ("other"), DINT("alpha", 1)}},
    {"sub", G_SUB, -1, {REQ("input"), REQ("other"), DINT("alpha", 1)}},
    {"mul", G_MUL, -1, {REQ("input"), REQ("other")}},
    {"div", G_DIV, -1, {REQ("input"), REQ("other"), DNONE("rounding_mode")}},
    {"floordiv", G_FLOORDIV, -1, {REQ("input"), REQ("other")}},
    {"matmul", G_MATMUL, -1, {REQ("input"), REQ("other")}},
    {"relu", G_RELU, -1, {REQ("input"), DBOOL("inplace", 0)}},
    {"gelu", G_GELU, -1, {REQ("input"), DSTR("approximate", "none")}},
    {"sigmoid", G_SIGMOID, -1, {REQ("input")}},
    {"tanh", G_TANH, -1, {REQ("input")}},
    {"softmax", G_SOFTMAX, -1, {REQ("input"), DNONE("dim"), DINT("_stacklevel", 3), DNONE("dtype")}},
    {"log_softmax", G_LOG_SOFTMAX, -1,
     {REQ("input"), DNONE("dim"), DINT("_stacklevel", 3), DNONE("dtype")}},
    {"dropout", G_DROPOUT, -1, {REQ("input"), {"p", D_FLOAT, 0.5, NULL}, DBOOL("training", 1), DBOOL("inplace", 0)}},
    {"flatten", G_FLATTEN, -1, {REQ("input"), DINT("start_dim", 0), DINT("end_dim", -1)}},
    {"reshape", G_RESHAPE, 1, {REQ("input"), REQ("shape")}},
    {"view", G_VIEW, 1, {REQ("input"), REQ("shape")}},
    {"permute", G_PERMUTE, 1, {REQ("input"), REQ("dims")}},
    {"transpose", G_TRANSPOSE, -1, {REQ("input"), REQ("dim0"), REQ("dim1")}},
    {"cat", G_CAT, -1, {REQ("tensors"), DINT("dim", 0)}},
    {"concat", G_CAT, -1, {REQ("tensors"), DINT("dim", 0)}},
    {"mean", G_MEAN, -1, {REQ("input"), DNONE("dim"), DBOOL("keepdim", 0), DNONE("dtype")}},
    {"sum", G_SUM, -1, {REQ("input"), DNONE("dim"), DBOOL("keepdim", 0), DNONE("dtype")}},
    {"getitem", G_GETITEM, -1, {REQ("a"), REQ("b")}},
    {"size", G_SIZE, -1, {REQ("input"), DNONE("dim")}},
    {"getattr", G_GETATTR, -1, {REQ("input"), REQ("name")}},
    {"contiguous", G_CONTIGUOUS, -1, {REQ("input"), DNONE("memory_format")}},
};
#define NOPDEFS ((int)(sizeof opdefs / sizeof opdefs[0]))

static int nparams(const opdef *d) {
  int n = 0;
  while (n < 5 && d->p[n].name) n++;
  return n;
}

static const opdef *find_op(const char *name) {
  for (int i = 0; i < NOPDEFS; i++)
    if (strcmp(opdefs[i].name, name) == 0) return &opdefs[i];
  return NULL;
}

/* ------------------------------------------------------------ arguments */

typedef struct cctx {
  graph_impl *g;
  grove_module *m;
  const char *path; /* JSON path of the module object */
  grove_err *err;
  int cur;             /* index of the node being compiled */
  const json_t *graph; /* the JSON node list */
} cctx;

static int node_index(const cctx *c, const char *name) {
  for (int i = 0; i < c->cur; i++)
    if (strcmp(c->g->nodes[i].name, name) == 0) return i;
  return -1;
}

/* Whether a later node of the JSON graph has this name (for the message). */
static bool later_node(const cctx *c, const char *name) {
  for (size_t i = (size_t)c->cur; i < json_array_size(c->graph); i++) {
    const json_t *nv = json_object_get(json_array_get(c->graph, i), "name");
    if (json_is_string(nv) && strcmp(json_string_value(nv), name) == 0) return true;
  }
  return false;
}

static grove_status parse_arg(cctx *c, const json_t *v, const char *jp, garg *out, int depth) {
  memset(out, 0, sizeof *out);
  if (depth > 16)
    return grove_err_set(c->err, GROVE_E_SPEC, "%s: arguments nested too deeply", jp);
  switch (json_typeof(v)) {
    case JSON_INTEGER:
      out->kind = A_INT;
      out->i = (int64_t)json_integer_value(v);
      return GROVE_OK;
    case JSON_REAL:
      out->kind = A_FLOAT;
      out->f = json_real_value(v);
      return GROVE_OK;
    case JSON_TRUE:
    case JSON_FALSE:
      out->kind = A_BOOL;
      out->i = json_is_true(v);
      return GROVE_OK;
    case JSON_NULL:
      out->kind = A_NONE;
      return GROVE_OK;
    case JSON_STRING:
      out->kind = A_STR;
      out->s = grove__strdup(json_string_value(v));
      return out->s ? GROVE_OK : nomem(c->err);
    case JSON_ARRAY: {
      out->kind = A_LIST;
      size_t n = json_array_size(v);
      if (n > 64) return grove_err_set(c->err, GROVE_E_SPEC, "%s: a list of more than 64 arguments", jp);
      out->items = calloc(n ? n : 1, sizeof(garg));
      if (!out->items) return nomem(c->err);
      for (size_t i = 0; i < n; i++) {
        char sub[640];
        snprintf(sub, sizeof sub, "%s[%zu]", jp, i);
        grove_status s = parse_arg(c, json_array_get(v, i), sub, &out->items[i], depth + 1);
        out->n = (int)i + 1;
        if (s) return s;
      }
      return GROVE_OK;
    }
    case JSON_OBJECT: {
      const json_t *nv = json_object_get(v, "node"), *sv = json_object_get(v, "slice"),
                   *ev = json_object_get(v, "ellipsis");
      if (json_object_size(v) == 1 && nv) {
        if (!json_is_string(nv))
          return grove_err_set(c->err, GROVE_E_SPEC, "%s.node: expected a node name", jp);
        int k = node_index(c, json_string_value(nv));
        if (k < 0) {
          bool later = later_node(c, json_string_value(nv));
          return grove_err_set(c->err, GROVE_E_SPEC,
                               "%s.node: \"%s\" %s (arguments refer to earlier nodes by name)", jp,
                               json_string_value(nv),
                               later ? "is defined after this node" : "names no node of the graph");
        }
        if (c->g->nodes[k].op == G_OUTPUT)
          return grove_err_set(c->err, GROVE_E_SPEC, "%s.node: \"%s\" is the output node", jp,
                               json_string_value(nv));
        out->kind = A_NODE;
        out->node = k;
        return GROVE_OK;
      }
      if (json_object_size(v) == 1 && sv) {
        if (!json_is_array(sv) || json_array_size(sv) != 3)
          return grove_err_set(c->err, GROVE_E_SPEC, "%s.slice: expected [start, stop, step]", jp);
        out->kind = A_SLICE;
        out->items = calloc(3, sizeof(garg));
        if (!out->items) return nomem(c->err);
        out->n = 3;
        for (size_t i = 0; i < 3; i++) {
          char sub[640];
          snprintf(sub, sizeof sub, "%s.slice[%zu]", jp, i);
          grove_status s = parse_arg(c, json_array_get(sv, i), sub, &out->items[i], depth + 1);
          if (s) return s;
          int k = out->items[i].kind;
          if (k != A_INT && k != A_NONE && k != A_NODE)
            return grove_err_set(c->err, GROVE_E_SPEC,
                                 "%s: expected an integer, null or a node", sub);
        }
        return GROVE_OK;
      }
      if (json_object_size(v) == 1 && json_is_true(ev)) {
        out->kind = A_ELLIPSIS;
        return GROVE_OK;
      }
      return grove_err_set(c->err, GROVE_E_SPEC,
                           "%s: expected a constant, a list, {\"node\": NAME}, {\"slice\": [start, "
                           "stop, step]} or {\"ellipsis\": true}",
                           jp);
    }
  }
  return grove_err_set(c->err, GROVE_E_SPEC, "%s: unexpected JSON value", jp);
}

static void count_uses(gnode *nodes, const garg *a, int reader) {
  if (a->kind == A_NODE) {
    nodes[a->node].uses++;
    nodes[a->node].last_use = reader;
  }
  for (int i = 0; i < a->n; i++) count_uses(nodes, &a->items[i], reader);
}

/* Binds positional args and kwargs (JSON) to the op's parameters. */
static grove_status bind(cctx *c, gnode *n, const opdef *d, const json_t *args, const json_t *kwargs,
                         const char *jp) {
  const int np = nparams(d);
  n->args = calloc((size_t)np, sizeof(garg));
  if (!n->args) return nomem(c->err);
  n->nargs = np;
  bool set[5] = {false};
  size_t na = args ? json_array_size(args) : 0;
  grove_status s;
  for (size_t i = 0; i < na; i++) {
    char sub[640];
    snprintf(sub, sizeof sub, "%s.args[%zu]", jp, i);
    int slot = (int)i;
    if (d->varargs >= 0 && slot >= d->varargs) {
      /* view(x, 2, -1) is view(x, [2, -1]); view(x, [2, -1]) stays. */
      garg *va = &n->args[d->varargs];
      if (na == (size_t)d->varargs + 1) {
        if ((s = parse_arg(c, json_array_get(args, i), sub, va, 0))) return s;
      } else {
        if (!va->items) {
          va->kind = A_LIST;
          va->items = calloc(na - (size_t)d->varargs, sizeof(garg));
          if (!va->items) return nomem(c->err);
        }
        if ((s = parse_arg(c, json_array_get(args, i), sub, &va->items[va->n], 0))) return s;
        va->n++;
      }
      set[d->varargs] = true;
      continue;
    }
    if (slot >= np)
      return grove_err_set(c->err, GROVE_E_SPEC, "%s: %s takes at most %d arguments, got %zu", sub,
                           d->name, np, na);
    if ((s = parse_arg(c, json_array_get(args, i), sub, &n->args[slot], 0))) return s;
    set[slot] = true;
  }
  const char *k;
  json_t *v;
  json_object_foreach((json_t *)kwargs, k, v) {
    char sub[640];
    snprintf(sub, sizeof sub, "%s.kwargs.%s", jp, k);
    int slot = -1;
    for (int i = 0; i < np; i++)
      if (strcmp(d->p[i].name, k) == 0) slot = i;
    if (slot < 0) {
      char list[256] = "";
      size_t used = 0;
      for (int i = 0; i < np && used < sizeof list; i++)
        used += (size_t)snprintf(list + used, sizeof list - used, "%s%s", i ? ", " : "", d->p[i].name);
      return grove_err_set(c->err, GROVE_E_SPEC, "%s: %s has no argument \"%s\" (it takes: %s)",
                           sub, d->name, k, list);
    }
    if (set[slot])
      return grove_err_set(c->err, GROVE_E_SPEC, "%s: %s got multiple values for argument \"%s\"",
                           sub, d->name, k);
    if ((s = parse_arg(c, v, sub, &n->args[slot], 0))) return s;
    set[slot] = true;
  }
  for (int i = 0; i < np; i++) {
    if (set[i]) continue;
    garg *a = &n->args[i];
    switch (d->p[i].dk) {
      case D_REQ:
        return grove_err_set(c->err, GROVE_E_SPEC, "%s: %s is missing its argument \"%s\"", jp,
                             d->name, d->p[i].name);
      case D_NONE:
        a->kind = A_NONE;
        break;
      case D_INT:
        a->kind = A_INT;
        a->i = (int64_t)d->p[i].dv;
        break;
      case D_FLOAT:
        a->kind = A_FLOAT;
        a->f = d->p[i].dv;
        break;
      case D_BOOL:
        a->kind = A_BOOL;
        a->i = d->p[i].dv != 0;
        break;
      case D_STR:
        a->kind = A_STR;
        if (!(a->s = grove__strdup(d->p[i].ds))) return nomem(c->err);
        break;
    }
  }
  return GROVE_OK;
}

static bool is_int_const(const garg *a) { return a->kind == A_INT || a->kind == A_BOOL; }

static grove_status want_const(cctx *c, const char *jp, const gnode *n, int i, const char *what) {
  return grove_err_set(c->err, GROVE_E_SPEC, "%s: %s's argument %d must be %s", jp, n->what, i,
                       what);
}

/* Marks a hidden layer built by a constructor; a refused argument is the
 * spec's fault. */
static grove_status hidden(cctx *c, gnode *n, grove_status s, const char *jp) {
  if (s) return grove__json_built(jp, s, c->err);
  grove_module_eval(n->mod);
  n->own_mod = true;
  return GROVE_OK;
}

/* Constant checks and hidden layers of one operation node. */
static grove_status check_op(cctx *c, gnode *n, const char *jp) {
  garg *a = n->args;
  switch (n->op) {
    case G_DIV:
      if (a[2].kind != A_NONE)
        return grove_err_set(c->err, GROVE_E_UNSUPPORTED,
                             "%s: div with rounding_mode is not supported (only true division)", jp);
      return GROVE_OK;
    case G_RELU:
      return hidden(c, n, grove_relu_new(&n->mod, c->err), jp);
    case G_SIGMOID:
      return hidden(c, n, grove_sigmoid_new(&n->mod, c->err), jp);
    case G_TANH:
      return hidden(c, n, grove_tanh_new(&n->mod, c->err), jp);
    case G_GELU:
      if (a[1].kind != A_STR || (strcmp(a[1].s, "none") && strcmp(a[1].s, "tanh")))
        return grove_err_set(c->err, GROVE_E_SPEC,
                             "%s: gelu's approximate must be \"none\" or \"tanh\"", jp);
      return hidden(c, n, grove_gelu_new(a[1].s, &n->mod, c->err), jp);
    case G_SOFTMAX:
    case G_LOG_SOFTMAX: {
      if (a[1].kind != A_NONE && a[1].kind != A_INT)
        return want_const(c, jp, n, 1, "an integer constant or null");
      if (a[3].kind != A_NONE)
        return grove_err_set(c->err, GROVE_E_UNSUPPORTED, "%s: %s with a dtype is not supported",
                             jp, n->what);
      if (a[1].kind == A_INT && (a[1].i < -GROVE_MAX_DIMS || a[1].i >= GROVE_MAX_DIMS))
        return grove_err_set(c->err, GROVE_E_SPEC, "%s: dim %lld is out of range", jp,
                             (long long)a[1].i);
      bool has = a[1].kind == A_INT;
      int dim = has ? (int)a[1].i : 0;
      return hidden(c, n,
                    n->op == G_SOFTMAX ? grove_softmax_new(has, dim, &n->mod, c->err)
                                       : grove_log_softmax_new(has, dim, &n->mod, c->err),
                    jp);
    }
    case G_DROPOUT:
      if (a[2].kind != A_BOOL || a[2].i)
        return grove_err_set(c->err, GROVE_E_UNSUPPORTED,
                             "%s: dropout with training=True drops activations at random even in "
                             "eval mode; pass training=self.training (Grove serves eval mode)",
                             jp);
      return GROVE_OK;
    case G_FLATTEN:
      if (!is_int_const(&a[1]) || !is_int_const(&a[2]) || a[1].i < -GROVE_MAX_DIMS ||
          a[1].i >= GROVE_MAX_DIMS || a[2].i < -GROVE_MAX_DIMS || a[2].i >= GROVE_MAX_DIMS)
        return want_const(c, jp, n, 1, "an integer constant (start_dim, end_dim)");
      return hidden(c, n, grove_flatten_new((int)a[1].i, (int)a[2].i, &n->mod, c->err), jp);
    case G_MEAN:
    case G_SUM:
      if (a[3].kind != A_NONE)
        return grove_err_set(c->err, GROVE_E_UNSUPPORTED, "%s: %s with a dtype is not supported",
                             jp, n->what);
      if (a[2].kind != A_BOOL && a[2].kind != A_INT)
        return want_const(c, jp, n, 2, "true or false (keepdim)");
      return GROVE_OK;
    case G_GETATTR:
      if (a[1].kind != A_STR || (strcmp(a[1].s, "shape") && strcmp(a[1].s, "ndim")))
        return grove_err_set(c->err, GROVE_E_UNSUPPORTED,
                             "%s: getattr of a tensor supports \"shape\" and \"ndim\" only", jp);
      return GROVE_OK;
    case G_CAT:
      if (a[0].kind != A_LIST && a[0].kind != A_NODE)
        return want_const(c, jp, n, 0, "a list of tensors");
      return GROVE_OK;
    default:
      return GROVE_OK;
  }
}

/* ------------------------------------------------------------ call_module */

typedef struct mdef {
  int kind;
  const char *type;
  pdef p[7];
} mdef;

static const mdef mdefs[] = {
    {MK_MHA,
     "MultiheadAttention",
     {REQ("query"), REQ("key"), REQ("value"), DNONE("key_padding_mask"), DBOOL("need_weights", 1),
      DNONE("attn_mask"), DBOOL("average_attn_weights", 1)}},
    {MK_ENCODER,
     "TransformerEncoderLayer",
     {REQ("src"), DNONE("src_mask"), DNONE("src_key_padding_mask"), DBOOL("is_causal", 0)}},
    {MK_ENCODER,
     "TransformerEncoder",
     {REQ("src"), DNONE("mask"), DNONE("src_key_padding_mask"), DNONE("is_causal")}},
};

static grove_status bind_module(cctx *c, gnode *n, const json_t *args, const json_t *kwargs,
                                const char *jp) {
  const grove_module *t = n->mod;
  if (!t->type->forward)
    return grove_err_set(c->err, GROVE_E_SPEC,
                         "%s.target: \"%s\" is a %s, which has no forward (Grove cannot call it)",
                         jp, n->attr, t->type->name);
  const mdef *md = NULL;
  for (size_t i = 0; i < sizeof mdefs / sizeof mdefs[0]; i++)
    if (!grove__is_graph(t) && strcmp(t->type->name, mdefs[i].type) == 0) md = &mdefs[i];
  size_t na = args ? json_array_size(args) : 0;
  grove_status s;
  if (!md) {
    /* Any other module takes tensors only, positionally. */
    if (json_object_size(kwargs) > 0)
      return grove_err_set(c->err, GROVE_E_UNSUPPORTED,
                           "%s.kwargs: keyword arguments to a %s are not supported (Grove passes "
                           "tensors positionally)",
                           jp, t->type->name);
    n->args = calloc(na ? na : 1, sizeof(garg));
    if (!n->args) return nomem(c->err);
    for (size_t i = 0; i < na; i++) {
      char sub[640];
      snprintf(sub, sizeof sub, "%s.args[%zu]", jp, i);
      if ((s = parse_arg(c, json_array_get(args, i), sub, &n->args[i], 0))) return s;
      n->nargs = (int)i + 1;
      if (n->args[i].kind != A_NODE && n->args[i].kind != A_NONE)
        return grove_err_set(c->err, GROVE_E_UNSUPPORTED,
                             "%s: a constant argument to a %s; Grove passes only tensors between "
                             "modules",
                             sub, t->type->name);
    }
    /* Trailing Nones are the callee's defaults. */
    while (n->nargs > 0 && n->args[n->nargs - 1].kind == A_NONE) n->nargs--;
    for (int i = 0; i < n->nargs; i++)
      if (n->args[i].kind == A_NONE)
        return grove_err_set(c->err, GROVE_E_UNSUPPORTED,
                             "%s.args[%d]: None before a tensor argument of a %s", jp, i,
                             t->type->name);
    if (n->nargs > GROVE_MAX_VALUES)
      return grove_err_set(c->err, GROVE_E_UNSUPPORTED,
                           "%s.args: a module call takes at most %d tensors", jp, GROVE_MAX_VALUES);
    if (grove__is_graph(t)) n->tuple = ((const graph_impl *)t->impl)->returns_tuple;
    return GROVE_OK;
  }
  int np = 0;
  while (np < 7 && md->p[np].name) np++;
  n->args = calloc((size_t)np, sizeof(garg));
  if (!n->args) return nomem(c->err);
  n->nargs = np;
  bool set[7] = {false};
  for (size_t i = 0; i < na; i++) {
    char sub[640];
    snprintf(sub, sizeof sub, "%s.args[%zu]", jp, i);
    if ((int)i >= np)
      return grove_err_set(c->err, GROVE_E_SPEC, "%s: %s takes at most %d arguments", sub,
                           t->type->name, np);
    if ((s = parse_arg(c, json_array_get(args, i), sub, &n->args[i], 0))) return s;
    set[i] = true;
  }
  const char *k;
  json_t *v;
  json_object_foreach((json_t *)kwargs, k, v) {
    char sub[640];
    snprintf(sub, sizeof sub, "%s.kwargs.%s", jp, k);
    int slot = -1;
    for (int i = 0; i < np; i++)
      if (strcmp(md->p[i].name, k) == 0) slot = i;
    if (slot < 0)
      return grove_err_set(c->err, GROVE_E_SPEC, "%s: %s.forward has no argument \"%s\"", sub,
                           t->type->name, k);
    if (set[slot])
      return grove_err_set(c->err, GROVE_E_SPEC, "%s: multiple values for \"%s\"", sub, k);
    if ((s = parse_arg(c, v, sub, &n->args[slot], 0))) return s;
    set[slot] = true;
  }
  for (int i = 0; i < np; i++) {
    garg *a = &n->args[i];
    if (!set[i]) {
      if (md->p[i].dk == D_REQ)
        return grove_err_set(c->err, GROVE_E_SPEC, "%s: %s is missing its argument \"%s\"", jp,
                             t->type->name, md->p[i].name);
      a->kind = md->p[i].dk == D_BOOL ? A_BOOL : A_NONE;
      a->i = md->p[i].dv != 0;
    }
    const char *pn = md->p[i].name;
    bool tensor = md->p[i].dk == D_REQ;
    if (tensor && a->kind != A_NODE)
      return grove_err_set(c->err, GROVE_E_SPEC, "%s: argument \"%s\" of %s must be a tensor", jp,
                           pn, t->type->name);
    if (strstr(pn, "mask") && a->kind != A_NONE)
      return grove_err_set(c->err, GROVE_E_UNSUPPORTED,
                           "%s: argument \"%s\" of %s: masks are not supported (attention runs "
                           "over every position)",
                           jp, pn, t->type->name);
    if (strcmp(pn, "is_causal") == 0 && a->kind != A_NONE && !(a->kind == A_BOOL && !a->i))
      return grove_err_set(c->err, GROVE_E_UNSUPPORTED, "%s: is_causal=True is not supported", jp);
    if ((strcmp(pn, "need_weights") == 0 || strcmp(pn, "average_attn_weights") == 0) &&
        a->kind != A_BOOL)
      return grove_err_set(c->err, GROVE_E_SPEC, "%s: argument \"%s\" must be true or false", jp, pn);
  }
  n->mod_kind = md->kind;
  if (md->kind == MK_MHA) {
    n->need_weights = n->args[4].i != 0;
    n->average_weights = n->args[6].i != 0;
    n->tuple = true;
    /* Only the tensors stay as arguments: query, key, value. */
    for (int i = 3; i < np; i++) garg_fini(&n->args[i]);
    n->nargs = 3;
  } else {
    for (int i = 1; i < np; i++) garg_fini(&n->args[i]);
    n->nargs = 1;
  }
  return GROVE_OK;
}

/* ------------------------------------------------------------ nodes */

static grove_status resolve_attr(cctx *c, gnode *n, const char *target, const char *jp) {
  const char *dot = strrchr(target, '.');
  char *mp = dot ? strndup(target, (size_t)(dot - target)) : grove__strdup("");
  if (!mp) return nomem(c->err);
  grove_module *owner = grove_module_find(c->m, mp);
  const char *slot = dot ? dot + 1 : target;
  grove_status s = GROVE_OK;
  if (!owner) {
    s = grove_err_set(c->err, GROVE_E_SPEC, "%s.target: \"%s\": this module has no submodule \"%s\"",
                      jp, target, mp);
  } else if (!grove_module_param(owner, slot) && !grove_module_buffer(owner, slot)) {
    s = grove_err_set(c->err, GROVE_E_SPEC,
                      "%s.target: \"%s\": the %s has no parameter or buffer \"%s\" (declare the "
                      "module's own tensors under \"parameters\"/\"buffers\")",
                      jp, target, owner->type->name, slot);
  } else {
    n->mod = owner;
    if (!(n->attr = grove__strdup(slot))) s = nomem(c->err);
  }
  free(mp);
  return s;
}

static grove_status compile_node(cctx *c, const json_t *v, const char *jp) {
  gnode *n = &c->g->nodes[c->cur];
  n->fuse_bn = n->fuse_relu = n->fused_into = n->nhwc_to = -1;
  n->last_use = -1;
  if (!json_is_object(v))
    return grove_err_set(c->err, GROVE_E_SPEC, "%s: expected a node object {\"op\", \"name\", ...}",
                         jp);
  static const char *const keys[] = {"op", "name", "target", "args", "kwargs", "default", "source", NULL};
  const char *key;
  json_t *kv;
  json_object_foreach((json_t *)v, key, kv) {
    bool ok = false;
    for (int i = 0; keys[i]; i++) ok |= strcmp(keys[i], key) == 0;
    if (!ok)
      return grove_err_set(c->err, GROVE_E_SPEC,
                           "%s.%s: unknown key of a node (known: op, name, target, args, kwargs, "
                           "default, source)",
                           jp, key);
  }
  const json_t *opv = json_object_get(v, "op"), *namev = json_object_get(v, "name"),
               *tv = json_object_get(v, "target"), *args = json_object_get(v, "args"),
               *kwargs = json_object_get(v, "kwargs"), *srcv = json_object_get(v, "source");
  if (!json_is_string(namev) || json_string_length(namev) == 0)
    return grove_err_set(c->err, GROVE_E_SPEC, "%s.name: expected a non-empty string", jp);
  if (node_index(c, json_string_value(namev)) >= 0)
    return grove_err_set(c->err, GROVE_E_SPEC, "%s.name: \"%s\" is the name of an earlier node",
                         jp, json_string_value(namev));
  if (!(n->name = grove__strdup(json_string_value(namev)))) return nomem(c->err);
  if (srcv && !json_is_string(srcv))
    return grove_err_set(c->err, GROVE_E_SPEC, "%s.source: expected a string", jp);
  if (srcv && !(n->source = grove__strdup(json_string_value(srcv)))) return nomem(c->err);
  if (args && !json_is_array(args))
    return grove_err_set(c->err, GROVE_E_SPEC, "%s.args: expected a list", jp);
  if (kwargs && !json_is_object(kwargs))
    return grove_err_set(c->err, GROVE_E_SPEC, "%s.kwargs: expected an object", jp);
  if (!json_is_string(opv))
    return grove_err_set(c->err, GROVE_E_SPEC,
                         "%s.op: expected one of \"placeholder\", \"get_attr\", \"call_module\", "
                         "\"call_function\", \"call_method\", \"output\"",
                         jp);
  const char *op = json_string_value(opv);
  bool needs_target = strcmp(op, "placeholder") && strcmp(op, "output");
  if (needs_target && (!json_is_string(tv) || json_string_length(tv) == 0))
    return grove_err_set(c->err, GROVE_E_SPEC, "%s.target: expected a non-empty string", jp);
  const char *target = needs_target ? json_string_value(tv) : NULL;
  if (strcmp(op, "placeholder") != 0 && json_object_get(v, "default"))
    return grove_err_set(c->err, GROVE_E_SPEC, "%s.default: only a placeholder has a default", jp);
  if (strcmp(op, "placeholder") == 0) {
    n->op = G_PLACEHOLDER;
    n->what = "placeholder";
    if (args || kwargs)
      return grove_err_set(c->err, GROVE_E_SPEC, "%s: a placeholder has no args (a default goes in "
                           "\"default\")", jp);
    if (strncmp(n->name, "*", 1) == 0)
      return grove_err_set(c->err, GROVE_E_UNSUPPORTED,
                           "%s: a forward with *args or **kwargs is not supported", jp);
    const json_t *dv = json_object_get(v, "default");
    if (dv) {
      char sub[640];
      snprintf(sub, sizeof sub, "%s.default", jp);
      grove_status s = parse_arg(c, dv, sub, &n->dflt, 0);
      if (s) return s;
      if (n->dflt.kind == A_NODE || n->dflt.kind == A_LIST)
        return grove_err_set(c->err, GROVE_E_SPEC, "%s: expected a constant", sub);
      n->has_default = true;
    }
    int *p = realloc(c->g->placeholders, (size_t)(c->g->nplaceholders + 1) * sizeof(int));
    if (!p) return nomem(c->err);
    c->g->placeholders = p;
    p[c->g->nplaceholders++] = c->cur;
    return GROVE_OK;
  }
  if (strcmp(op, "output") == 0) {
    n->op = G_OUTPUT;
    n->what = "output";
    if (!args || json_array_size(args) != 1 || json_object_size(kwargs) > 0)
      return grove_err_set(c->err, GROVE_E_SPEC,
                           "%s.args: the output node takes one argument: a node or a list of "
                           "nodes",
                           jp);
    n->args = calloc(1, sizeof(garg));
    if (!n->args) return nomem(c->err);
    n->nargs = 1;
    char sub[640];
    snprintf(sub, sizeof sub, "%s.args[0]", jp);
    grove_status s = parse_arg(c, json_array_get(args, 0), sub, &n->args[0], 0);
    if (s) return s;
    garg *a = &n->args[0];
    if (a->kind == A_LIST) {
      if (a->n < 1 || a->n > GROVE_MAX_VALUES)
        return grove_err_set(c->err, GROVE_E_UNSUPPORTED,
                             "%s: a model returns 1 to %d tensors, this returns %d", sub,
                             GROVE_MAX_VALUES, a->n);
      for (int i = 0; i < a->n; i++)
        if (a->items[i].kind != A_NODE)
          return grove_err_set(c->err, GROVE_E_UNSUPPORTED,
                               "%s[%d]: the output must be tensors (nodes), not constants", sub, i);
      c->g->returns_tuple = true;
    } else if (a->kind != A_NODE) {
      return grove_err_set(c->err, GROVE_E_UNSUPPORTED,
                           "%s: the output must be a tensor (a node), not a constant", sub);
    }
    return GROVE_OK;
  }
  if (strcmp(op, "get_attr") == 0) {
    n->op = G_GET_ATTR;
    n->what = "get_attr";
    if (args || kwargs)
      return grove_err_set(c->err, GROVE_E_SPEC, "%s: get_attr takes no arguments", jp);
    return resolve_attr(c, n, target, jp);
  }
  if (strcmp(op, "call_module") == 0) {
    n->op = G_CALL_MODULE;
    n->what = "call_module";
    n->mod = grove_module_find(c->m, target);
    if (!n->mod)
      return grove_err_set(c->err, GROVE_E_SPEC,
                           "%s.target: \"%s\" names no submodule of this module", jp, target);
    if (!(n->attr = grove__strdup(target))) return nomem(c->err);
    return bind_module(c, n, args, kwargs, jp);
  }
  if (strcmp(op, "call_function") != 0 && strcmp(op, "call_method") != 0)
    return grove_err_set(c->err, GROVE_E_SPEC,
                         "%s.op: \"%s\" is not a torch.fx node kind (placeholder, get_attr, "
                         "call_module, call_function, call_method, output)",
                         jp, op);
  const opdef *d = find_op(target);
  if (!d) {
    char list[600] = "";
    size_t used = 0;
    for (int i = 0; i < NOPDEFS && used < sizeof list; i++)
      used += (size_t)snprintf(list + used, sizeof list - used, "%s%s", i ? ", " : "", opdefs[i].name);
    return grove_err_set(c->err, GROVE_E_UNSUPPORTED,
                         "%s.target: \"%s\" is not an operation Grove runs (supported: %s)", jp,
                         target, list);
  }
  n->op = d->op;
  n->what = d->name;
  grove_status s = bind(c, n, d, args, kwargs, jp);
  if (!s) s = check_op(c, n, jp);
  return s;
}

/* ------------------------------------------------------------ fusion */

/* The single reader of node i, when it reads nothing but i, else -1. */
static int sole_reader(const graph_impl *g, int i) {
  if (g->nodes[i].uses != 1) return -1;
  int r = g->nodes[i].last_use;
  const gnode *n = &g->nodes[r];
  if (n->op == G_CALL_MODULE && n->nargs == 1 && n->args[0].kind == A_NODE && n->args[0].node == i &&
      n->mod_kind == MK_PLAIN && !n->tuple)
    return r;
  if (n->op == G_RELU && n->args[0].kind == A_NODE && n->args[0].node == i) return r;
  return -1;
}

static bool is_relu_node(const graph_impl *g, int r) {
  const gnode *n = &g->nodes[r];
  return n->op == G_RELU || (n->op == G_CALL_MODULE && n->mod->type == &grove__relu_type);
}

static void plan_fusion(graph_impl *g) {
  for (int i = 0; i < g->nnodes; i++) {
    gnode *n = &g->nodes[i];
    if (n->op != G_CALL_MODULE || n->fused_into >= 0 || n->nargs != 1) continue;
    const grove_module_type *t = n->mod->type;
    bool conv = t == &grove__conv1d_type || t == &grove__conv2d_type;
    if (!conv && t != &grove__linear_type) continue;
    int r = sole_reader(g, i);
    if (r < 0) continue;
    if (conv && t == &grove__conv2d_type && g->nodes[r].op == G_CALL_MODULE &&
        g->nodes[r].mod->type == &grove__batch_norm2d_type &&
        grove__bn2d_channels(g->nodes[r].mod) == grove__conv_out_channels(n->mod)) {
      n->fuse_bn = r;
      g->nodes[r].fused_into = i;
      r = sole_reader(g, r);
      if (r < 0) continue;
    }
    if (is_relu_node(g, r)) {
      n->fuse_relu = r;
      g->nodes[r].fused_into = i;
    }
  }
  /* A fused Conv2d chain whose result only another Conv2d reads hands it
   * over in NHWC, saving a transpose each way (both on the rows path, checked
   * at run time). */
  for (int i = 0; i < g->nnodes; i++) {
    gnode *n = &g->nodes[i];
    if (n->op != G_CALL_MODULE || n->mod->type != &grove__conv2d_type ||
        (n->fuse_bn < 0 && n->fuse_relu < 0))
      continue;
    int end = n->fuse_relu >= 0 ? n->fuse_relu : n->fuse_bn;
    if (g->nodes[end].uses != 1) continue;
    int j = g->nodes[end].last_use;
    const gnode *c = &g->nodes[j];
    if (c->op == G_CALL_MODULE && c->mod->type == &grove__conv2d_type && c->nargs == 1 &&
        c->args[0].kind == A_NODE && c->args[0].node == end && c->fused_into < 0)
      n->nhwc_to = j;
  }
}

grove_status grove__graph_compile(grove_module *m, const json_t *obj, const char *path,
                                  const char *where, grove_err *err) {
  graph_impl *g = m->impl;
  if (!(g->where = grove__strdup(where))) return nomem(err);
  const json_t *gv = json_object_get(obj, "graph");
  if (json_is_null(gv)) return GROVE_OK; /* a holder */
  size_t nn = json_array_size(gv);
  if (nn > 100000)
    return grove_err_set(err, GROVE_E_SPEC, "%s.graph: more than 100000 nodes", path);
  g->nodes = calloc(nn ? nn : 1, sizeof(gnode));
  if (!g->nodes) return nomem(err);
  g->nnodes = (int)nn;
  g->output = -1;
  cctx c = {g, m, path, err, 0, gv};
  for (size_t i = 0; i < nn; i++) {
    char jp[480];
    snprintf(jp, sizeof jp, "%s.graph[%zu]", path, i);
    c.cur = (int)i;
    grove_status s = compile_node(&c, json_array_get(gv, i), jp);
    if (s) return s;
    gnode *n = &g->nodes[i];
    if (n->op == G_OUTPUT) {
      if (i + 1 != nn)
        return grove_err_set(err, GROVE_E_SPEC, "%s: the output node must be the last node", jp);
      g->output = (int)i;
    }
    for (int k = 0; k < n->nargs; k++) count_uses(g->nodes, &n->args[k], (int)i);
  }
  if (g->output < 0)
    return grove_err_set(err, GROVE_E_SPEC, "%s.graph: no output node (the last node must be "
                         "{\"op\": \"output\", ...})", path);
  /* Regions: at most one per tensor a node produces. */
  g->max_regions = g->nnodes * GROVE_MAX_VALUES + GROVE_MAX_VALUES;
  plan_fusion(g);
  g->compiled = true;
  g->type.forward = graph_forward;
  return GROVE_OK;
}

/* ============================================================ running */

enum { V_NONE, V_TENSOR, V_TUPLE, V_INT, V_FLOAT, V_BOOL, V_INTS };

typedef struct gval {
  int8_t kind;
  int8_t n;           /* V_TUPLE: tensors; V_INTS: ints */
  uint8_t none_mask;  /* V_TUPLE: entries that are None */
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
  int kind = v ? v->kind : a->kind == A_INT ? V_INT : a->kind == A_BOOL ? V_BOOL
                                                   : a->kind == A_FLOAT ? V_FLOAT : V_NONE;
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
 * is this pass's arena memory, contiguous float32. */
static bool can_overwrite(const run *r, const gnode *n, const garg *a) {
  if (a->kind != A_NODE) return false;
  const gnode *src = &r->g->nodes[a->node];
  const gval *v = &r->vals[a->node];
  return src->uses == 1 && src->last_use == (int)(n - r->g->nodes) && v->kind == V_TENSOR &&
         v->reg[0] >= 0 && r->regs[v->reg[0]].refs == 1 && v->t[0].dtype == GROVE_F32 &&
         grove_tensor_is_contiguous(&v->t[0]);
}

static grove_status run_binary(run *r, const gnode *n, gval *res) {
  const garg *a = &n->args[0], *b = &n->args[1];
  const gval *va = argv_(r, a), *vb = argv_(r, b);
  bool ta = va && va->kind == V_TENSOR, tb = vb && vb->kind == V_TENSOR;
  double alpha = 1;
  int64_t ialpha = 1;
  bool alpha_int = true;
  if ((n->op == G_ADD || n->op == G_SUB) && !arg_number(r, &n->args[2], &alpha, &ialpha, &alpha_int))
    return want(r, "a number for alpha");
  if (!ta && !tb) {
    /* Python arithmetic on numbers (sizes): ints stay ints. */
    double x, y;
    int64_t ix, iy;
    bool xi, yi;
    if (!arg_number(r, a, &x, &ix, &xi) || !arg_number(r, b, &y, &iy, &yi))
      return want(r, "tensors or numbers");
    bool ints = xi && yi && alpha_int;
    switch (n->op) {
      case G_ADD:
      case G_SUB: {
        int sign = n->op == G_ADD ? 1 : -1;
        if (ints) {
          res->kind = V_INT;
          res->i = ix + sign * ialpha * iy;
        } else {
          res->kind = V_FLOAT;
          res->f = x + sign * alpha * y;
        }
        return GROVE_OK;
      }
      case G_MUL:
        if (ints) {
          res->kind = V_INT;
          res->i = ix * iy;
        } else {
          res->kind = V_FLOAT;
          res->f = x * y;
        }
        return GROVE_OK;
      case G_DIV:
        if (y == 0) return grove_err_set(r->f->err, GROVE_E_RANGE, "division by zero");
        res->kind = V_FLOAT;
        res->f = x / y;
        return GROVE_OK;
      default: /* floordiv */
        if (y == 0) return grove_err_set(r->f->err, GROVE_E_RANGE, "integer division or modulo by zero");
        if (ints) {
          int64_t q = ix / iy;
          if ((ix % iy != 0) && ((ix < 0) != (iy < 0))) q--;
          res->kind = V_INT;
          res->i = q;
        } else {
          res->kind = V_FLOAT;
          res->f = floor(x / y);
        }
        return GROVE_OK;
    }
  }
  if (n->op == G_FLOORDIV)
    return grove_err_set(r->f->err, GROVE_E_UNSUPPORTED, "floor division of tensors is not supported");
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
  static const int bin[] = {[G_ADD] = GROVE__BIN_ADD, [G_SUB] = GROVE__BIN_SUB,
                            [G_MUL] = GROVE__BIN_MUL, [G_DIV] = GROVE__BIN_DIV};
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

/* relu, sigmoid and tanh in place (the formulas of layers.c). */
static bool unary_in_place(run *r, const gnode *n, gval *res) {
  if ((n->op != G_RELU && n->op != G_SIGMOID && n->op != G_TANH) ||
      !can_overwrite(r, n, &n->args[0]))
    return false;
  const grove_tensor *x = &r->vals[n->args[0].node].t[0];
  float *restrict d = x->data;
  const int64_t cnt = grove_tensor_numel(x);
  if (n->op == G_RELU)
    for (int64_t i = 0; i < cnt; i++) d[i] = d[i] < 0.0f ? 0.0f : d[i];
  else if (n->op == G_SIGMOID)
    for (int64_t i = 0; i < cnt; i++) d[i] = 1.0f / (1.0f + expf(-d[i]));
  else
    for (int64_t i = 0; i < cnt; i++) d[i] = tanhf(d[i]);
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
  if (v->kind == V_TUPLE || v->kind == V_INTS) {
    const int len = v->n;
    if (ix->kind == A_SLICE) {
      grove__index e = {GROVE__IX_SLICE, 0, 0, 1, false, false};
      grove_status s;
      if (ix->items[0].kind != A_NONE && (s = arg_int(r, &ix->items[0], &e.start))) return s;
      if (ix->items[1].kind != A_NONE && (s = arg_int(r, &ix->items[1], &e.stop))) return s;
      if (ix->items[2].kind != A_NONE && (s = arg_int(r, &ix->items[2], &e.step))) return s;
      if (e.step < 1) return grove_err_set(r->f->err, GROVE_E_UNSUPPORTED, "slice step must be positive");
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
      if ((s = arg_tensor(r, &a[0], &x)) || (s = grove__contig(r->f, x, &y))) return s;
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
    const float *sc, *sh;
    const grove_module *bn = r->g->nodes[n->fuse_bn].mod;
    if (grove__observes(r->f, bn) || !grove__bn2d_affine(bn, &sc, &sh)) return false;
  }
  if (n->fuse_relu >= 0 && r->g->nodes[n->fuse_relu].op == G_CALL_MODULE &&
      grove__observes(r->f, r->g->nodes[n->fuse_relu].mod))
    return false;
  return true;
}

static grove_status run_module(run *r, int i, gval *res) {
  const gnode *n = &r->g->nodes[i];
  grove_values in = {.n = n->nargs}, out = {0};
  for (int k = 0; k < n->nargs; k++) {
    const gval *v = argv_(r, &n->args[k]);
    if (!v || v->kind != V_TENSOR)
      return grove_err_set(r->f->err, GROVE_E_INVALID_ARGUMENT,
                           "argument %d of the module call is not a tensor", k);
    in.v[k] = v->t[0];
  }
  grove_status s;
  if (fused(r, i)) {
    const grove_module *mm = n->mod;
    if (mm->type == &grove__linear_type) {
      s = grove__linear_forward_act(mm, r->f, &in, &out, GROVE__ACT_RELU);
    } else {
      const float *scale = NULL, *shift = NULL;
      float *tmp = NULL;
      if (n->fuse_bn >= 0) {
        const float *bs, *bt;
        grove__bn2d_affine(r->g->nodes[n->fuse_bn].mod, &bs, &bt);
        const int64_t C = grove__conv_out_channels(mm);
        const float *cb = grove__conv_bias(mm);
        tmp = grove_arena_alloc(r->f->arena, (size_t)C * 2 * sizeof(float));
        if (!tmp) return grove_err_set(r->f->err, GROVE_E_NOMEM, "out of scratch memory");
        /* bn(conv(x) + b) = conv(x) * s + (b * s + t). */
        for (int64_t c = 0; c < C; c++) {
          tmp[c] = bs[c];
          tmp[C + c] = cb[c] * bs[c] + bt[c];
        }
        scale = tmp;
        shift = tmp + C;
      }
      const bool nhwc = n->nhwc_to >= 0 && grove__conv_rows_path(mm) &&
                        grove__conv_rows_path(r->g->nodes[n->nhwc_to].mod);
      s = grove__conv_forward_ex(mm, r->f, &in, &out, scale, shift, n->fuse_relu >= 0, nhwc);
    }
  } else {
    if (n->mod_kind == MK_MHA) grove__mha_next_call(n->mod, n->need_weights, n->average_weights);
    s = grove_module_forward(n->mod, r->f, &in, &out);
  }
  if (s) return s;
  if (out.n < 1)
    return grove_err_set(r->f->err, GROVE_E_INTERNAL, "the module returned nothing");
  if (n->mod_kind == MK_MHA) {
    /* (attn_output, attn_weights or None) */
    res->kind = V_TUPLE;
    res->n = 2;
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

grove_status grove__arena_keep(grove_arena *a, grove_arena_mark m, grove__keep *keep, int n,
                               grove_err *err) {
  if (n == 1) {
    /* Rewinding never moves memory and the new place is at or below the old
     * one in the same block (or in another block): memmove is enough. */
    grove_arena_rewind(a, m);
    void *p = grove_arena_alloc(a, keep[0].bytes);
    if (!p) return grove_err_set(err, GROVE_E_NOMEM, "out of scratch memory");
    if (p != keep[0].start) memmove(p, keep[0].start, keep[0].bytes);
    keep[0].moved = p;
    keep[0].end = grove_arena_mark_get(a);
    return GROVE_OK;
  }
  if (n == 0) {
    grove_arena_rewind(a, m);
    return GROVE_OK;
  }
  /* Several blocks: stage them above everything first, so that placing one
   * can never overwrite another that is still to be moved. */
  size_t total = 0;
  for (int k = 0; k < n; k++) total += (keep[k].bytes + 63) / 64 * 64;
  char *stage = grove_arena_alloc(a, total);
  if (!stage) return grove_err_set(err, GROVE_E_NOMEM, "out of scratch memory");
  size_t off = 0;
  for (int k = 0; k < n; k++) {
    memcpy(stage + off, keep[k].start, keep[k].bytes);
    off += (keep[k].bytes + 63) / 64 * 64;
  }
  grove_arena_rewind(a, m);
  off = 0;
  for (int k = 0; k < n; k++) {
    void *p = grove_arena_alloc(a, keep[k].bytes);
    if (!p) return grove_err_set(err, GROVE_E_NOMEM, "out of scratch memory");
    memmove(p, stage + off, keep[k].bytes);
    off += (keep[k].bytes + 63) / 64 * 64;
    keep[k].moved = p;
    keep[k].end = grove_arena_mark_get(a);
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
        return grove_err_set(r->f->err, GROVE_E_UNSUPPORTED, "the graph returns more than %d tensors",
                             GROVE_MAX_VALUES);
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
    grove_tensor c;
    grove_status s = grove__contig(r->f, &out->v[k], &c);
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

static grove_status graph_forward(const grove_module *m, grove_fwd *f, const grove_values *in,
                                  grove_values *out) {
  const graph_impl *g = m->impl;
  if (in->n > g->nplaceholders)
    return grove_err_set(f->err, GROVE_E_INVALID_ARGUMENT, "%s: forward takes %d input(s), got %d",
                         g->where, g->nplaceholders, in->n);
  run r = {.g = g, .f = f, .in = in, .fuse = grove__no_forward_hooks()};
  r.vals = grove_arena_alloc(f->arena, (size_t)g->nnodes * sizeof(gval));
  r.regs = grove_arena_alloc(f->arena, (size_t)g->max_regions * sizeof(region));
  if (!r.vals || !r.regs) return grove_err_set(f->err, GROVE_E_NOMEM, "out of scratch memory");
  r.base = grove_arena_mark_get(f->arena);
  int next_input = 0;
  for (int i = 0; i < g->nnodes; i++) {
    const gnode *n = &g->nodes[i];
    gval *v = &r.vals[i];
    v->kind = V_NONE;
    v->n = 0;
    v->none_mask = 0;
    grove_status s = GROVE_OK;
    bool external = false;
    switch (n->op) {
      case G_PLACEHOLDER:
        external = true;
        if (next_input < in->n) {
          set_tensor(v, &in->v[next_input]);
        } else if (n->has_default) {
          const garg *d = &n->dflt;
          v->kind = d->kind == A_INT ? V_INT : d->kind == A_FLOAT ? V_FLOAT
                    : d->kind == A_BOOL ? V_BOOL : V_NONE;
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
