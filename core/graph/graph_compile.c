/* graph_compile.c: a graph module's model.json object compiled into nodes
 * (graph_internal.h), once, when the tree is built; graph.c runs them.
 *
 * Every node's target is resolved (call_module to a module of the subtree,
 * get_attr to a parameter or buffer slot, call_function/call_method to an
 * entry of the op table, core/nn/ops.h), its arguments are bound to the
 * entry's parameters (positional, then keyword, then torch's defaults) and
 * checked where they are constants (the entry's check), and each node learns how many
 * argument slots read it and the index of its last reader (graph.c's
 * liveness).  Anything Grove cannot run is refused here, naming the JSON
 * path of the node.  Fusion is planned last: a Conv2d -> BatchNorm2d -> ReLU
 * chain (or a part of it, and Linear -> ReLU) whose intermediates have no
 * other reader.  (Which results may be channels last is decided when the
 * graph runs: graph.c, channels_last_for.) */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph_internal.h"
#include "layers_internal.h"

void grove__graph_free_impl(void *impl) {
  graph_impl *g = impl;
  if (!g) return;
  grove__plans_free(g->plans);
  for (int i = 0; i < g->nnodes; i++) {
    gnode *n = &g->nodes[i];
    free(n->name);
    free(n->source);
    free(n->attr);
    for (int k = 0; k < n->nargs; k++) grove__garg_fini(&n->args[k]);
    free(n->args);
    grove__garg_fini(&n->dflt);
  }
  free(g->nodes);
  free(g->placeholders);
  free(g->type_name);
  free(g->where);
  free(g);
}

bool grove__is_graph(const grove_module *m) {
  return m && m->type && m->type->free_impl == grove__graph_free_impl;
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
      return grove_err_set(err, GROVE_E_SPEC, "%s.%s.%s: expected {\"shape\": [...]} or null", path,
                           key, name);
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
      return grove_err_set(err, GROVE_E_SPEC,
                           "%s.%s.%s.dtype: expected a dtype name (float32, "
                           "int64, ...)",
                           path, key, name);
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
    /* A non-persistent buffer is not in the state_dict: grove_model_open
     * reads its value from buffers.safetensors beside the weights. */
    if (pv) persistent = json_is_true(pv);
    grove_err e = {0};
    grove_tensor *t = grove_tensor_new(dt, (int)nd, shape, &e);
    if (!t)
      return grove_err_set(err, e.code ? e.code : GROVE_E_NOMEM, "%s.%s.%s: %s", path, key, name,
                           grove_err_msg(&e));
    grove_status s = buffers ? grove_module_register_buffer(m, name, t, persistent, &e)
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
  static const char *const keys[] = {"type",    "graph", "children", "parameters",
                                     "buffers", "tied",  "inlined",  NULL};
  *out = NULL;
  const char *key;
  json_t *v;
  json_object_foreach((json_t *)obj, key, v) {
    bool ok = false;
    for (int i = 0; keys[i]; i++) ok |= strcmp(keys[i], key) == 0;
    if (!ok)
      return grove_err_set(err, GROVE_E_SPEC,
                           "%s.%s: unknown key of a module with a graph (known: type, graph, "
                           "children, parameters, buffers, tied, inlined)",
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
  const json_t *iv = json_object_get(obj, "inlined");
  if (iv && (!json_is_boolean(iv) || (json_is_true(iv) && !json_is_null(gv))))
    return grove_err_set(err, GROVE_E_SPEC,
                         "%s.inlined: expected true (with \"graph\": null) for a module whose "
                         "forward the exporter traced into its caller's graph, or false",
                         path);
  const json_t *kids = json_object_get(obj, "children");
  if (kids && !json_is_object(kids))
    return grove_err_set(err, GROVE_E_SPEC,
                         "%s.children: expected an object mapping attribute names to modules",
                         path);
  graph_impl *g = calloc(1, sizeof *g);
  if (!g) return nomem(err);
  g->plans = grove__plans_new(); /* NULL: forwards simply run unplanned */
  g->type_name = grove__strdup(json_string_value(tv));
  if (!g->type_name) {
    grove__graph_free_impl(g); /* the plans too */
    return nomem(err);
  }
  g->type.name = g->type_name;
  g->type.forward = NULL; /* until compiled */
  g->type.free_impl = grove__graph_free_impl;
  grove_module *m = grove_module_new(&g->type, g, err);
  if (!m) return err && err->code ? err->code : GROVE_E_NOMEM;
  m->inlined = json_is_true(iv);
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

/* ------------------------------------------------------------ arguments */

typedef struct cctx {
  graph_impl *g;
  grove_module *m;
  const char *path; /* JSON path of the module object */
  grove_err *err;
  int cur;             /* index of the node being compiled */
  const json_t *graph; /* the JSON node list */
  /* Name -> index of every node compiled so far: a jansson object, for its
   * hash table (a linear scan per argument made N nodes cost O(N^2)). */
  json_t *names;
} cctx;

static int node_index(const cctx *c, const char *name) {
  const json_t *i = json_object_get(c->names, name);
  return i ? (int)json_integer_value(i) : -1;
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
  if (depth > 16) return grove_err_set(c->err, GROVE_E_SPEC, "%s: arguments nested too deeply", jp);
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
      if (n > 64)
        return grove_err_set(c->err, GROVE_E_SPEC, "%s: a list of more than 64 arguments", jp);
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
            return grove_err_set(c->err, GROVE_E_SPEC, "%s: expected an integer, null or a node",
                                 sub);
        }
        return GROVE_OK;
      }
      if (json_object_size(v) == 1 && json_is_true(ev)) {
        out->kind = A_ELLIPSIS;
        return GROVE_OK;
      }
      /* JSON has no infinities: {"float": "-inf"} (masks fill with it). */
      const json_t *fv = json_object_get(v, "float");
      if (json_object_size(v) == 1 && json_is_string(fv)) {
        const char *t = json_string_value(fv);
        out->kind = A_FLOAT;
        if (strcmp(t, "inf") == 0)
          out->f = INFINITY;
        else if (strcmp(t, "-inf") == 0)
          out->f = -INFINITY;
        else if (strcmp(t, "nan") == 0)
          out->f = NAN;
        else
          return grove_err_set(c->err, GROVE_E_SPEC, "%s.float: expected \"inf\", \"-inf\" or "
                               "\"nan\"", jp);
        return GROVE_OK;
      }
      return grove_err_set(c->err, GROVE_E_SPEC,
                           "%s: expected a constant, a list, {\"node\": NAME}, {\"slice\": [start, "
                           "stop, step]}, {\"ellipsis\": true} or {\"float\": \"-inf\"}",
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
static grove_status bind(cctx *c, gnode *n, const grove__opdef *d, const json_t *args,
                         const json_t *kwargs, const char *jp) {
  const int np = grove__op_nparams(d);
  n->args = calloc(np ? (size_t)np : 1, sizeof(garg)); /* calloc(0) may be NULL */
  if (!n->args) return nomem(c->err);
  n->nargs = np;
  bool set[GROVE__OP_MAX_PARAMS] = {false};
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
        /* Counted before it is parsed: a list item refused after its
         * first items were parsed holds memory that fini must free. */
        if ((s = parse_arg(c, json_array_get(args, i), sub, &va->items[va->n++], 0))) return s;
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
        used +=
            (size_t)snprintf(list + used, sizeof list - used, "%s%s", i ? ", " : "", d->p[i].name);
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
    grove_status ds = grove__op_default(&d->p[i], &n->args[i]);
    if (ds == GROVE_E_SPEC)
      return grove_err_set(c->err, GROVE_E_SPEC, "%s: %s is missing its argument \"%s\"", jp,
                           d->name, d->p[i].name);
    if (ds) return nomem(c->err);
  }
  return GROVE_OK;
}

/* ------------------------------------------------------------ call_module */

/* The attention and transformer modules' forward parameters, as torch
 * binds them: the tensors (REQ) first, then masks (a name with "mask": a
 * tensor or None, passed in the forward's context, grove_fwd.mha.mask, in
 * this order), need_weights / average_attn_weights (constants), and torch
 * 2's is_causal hints (false only: torch 1.13 has none). */
#define MDEF_MAX 11
typedef struct mdef {
  int kind;
  const char *type;
  grove__oppar p[MDEF_MAX];
} mdef;

#define REQ(n) OP_REQ(n, P_TENSOR)
#define DNONE(n) OP_NONE(n, P_TENSOR)
#define DBOOL(n, v) OP_BOOL(n, v)

static const mdef mdefs[] = {
    {MK_MHA,
     "MultiheadAttention",
     {REQ("query"), REQ("key"), REQ("value"), DNONE("key_padding_mask"), DBOOL("need_weights", 1),
      DNONE("attn_mask"), DBOOL("average_attn_weights", 1), DBOOL("is_causal", 0)}},
    {MK_ENCODER,
     "TransformerEncoderLayer",
     {REQ("src"), DNONE("src_mask"), DNONE("src_key_padding_mask"), DBOOL("is_causal", 0)}},
    {MK_ENCODER,
     "TransformerEncoder",
     {REQ("src"), DNONE("mask"), DNONE("src_key_padding_mask"), DNONE("is_causal")}},
    {MK_ENCODER,
     "TransformerDecoderLayer",
     {REQ("tgt"), REQ("memory"), DNONE("tgt_mask"), DNONE("memory_mask"),
      DNONE("tgt_key_padding_mask"), DNONE("memory_key_padding_mask"), DBOOL("tgt_is_causal", 0),
      DBOOL("memory_is_causal", 0)}},
    {MK_ENCODER,
     "TransformerDecoder",
     {REQ("tgt"), REQ("memory"), DNONE("tgt_mask"), DNONE("memory_mask"),
      DNONE("tgt_key_padding_mask"), DNONE("memory_key_padding_mask"), DNONE("tgt_is_causal"),
      DBOOL("memory_is_causal", 0)}},
    {MK_ENCODER,
     "Transformer",
     {REQ("src"), REQ("tgt"), DNONE("src_mask"), DNONE("tgt_mask"), DNONE("memory_mask"),
      DNONE("src_key_padding_mask"), DNONE("tgt_key_padding_mask"),
      DNONE("memory_key_padding_mask"), DNONE("src_is_causal"), DNONE("tgt_is_causal"),
      DBOOL("memory_is_causal", 0)}},
};

/* An LSTM's (h0, c0): torch passes the state as one tuple argument, Grove's
 * module forward as two more tensors.  Replaces the last argument of n, a
 * list of nodes, by its items. */
static grove_status flatten_state(cctx *c, gnode *n, const char *jp) {
  garg *a = &n->args[n->nargs - 1];
  for (int k = 0; k < a->n; k++)
    if (a->items[k].kind != A_NODE)
      return grove_err_set(c->err, GROVE_E_UNSUPPORTED,
                           "%s[%d]: the state of a %s must be tensors (nodes)", jp, k,
                           n->mod->type->name);
  if (n->nargs - 1 + a->n > GROVE_MAX_VALUES)
    return grove_err_set(c->err, GROVE_E_UNSUPPORTED, "%s: too many state tensors", jp);
  garg *na = calloc((size_t)(n->nargs - 1 + a->n), sizeof(garg));
  if (!na) return nomem(c->err);
  memcpy(na, n->args, (size_t)(n->nargs - 1) * sizeof(garg));
  for (int k = 0; k < a->n; k++) na[n->nargs - 1 + k] = a->items[k];
  const int nn = n->nargs - 1 + a->n;
  free(a->items);
  free(n->args);
  n->args = na;
  n->nargs = nn;
  return GROVE_OK;
}

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
      n->nargs = (int)i + 1; /* before parsing: a half-parsed list is freed too */
      if ((s = parse_arg(c, json_array_get(args, i), sub, &n->args[i], 0))) return s;
      if (n->args[i].kind == A_LIST && grove__is_rnn(t) && i == 1 && na == 2 &&
          (s = flatten_state(c, n, sub)))
        return s;
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
    n->ntensors = n->nargs;
    return GROVE_OK;
  }
  int np = 0;
  while (np < MDEF_MAX && md->p[np].name) np++;
  n->args = calloc((size_t)np, sizeof(garg));
  if (!n->args) return nomem(c->err);
  n->nargs = np;
  bool set[MDEF_MAX] = {false};
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
    if (strstr(pn, "mask") && a->kind != A_NONE && a->kind != A_NODE)
      return grove_err_set(c->err, GROVE_E_SPEC,
                           "%s: argument \"%s\" of %s must be a tensor or None", jp, pn,
                           t->type->name);
    if (strstr(pn, "is_causal") && a->kind != A_NONE && !(a->kind == A_BOOL && !a->i))
      return grove_err_set(c->err, GROVE_E_UNSUPPORTED,
                           "%s: %s=True is not supported (torch 1.13 has no is_causal: pass the "
                           "causal mask itself)",
                           jp, pn);
    if ((strcmp(pn, "need_weights") == 0 || strcmp(pn, "average_attn_weights") == 0) &&
        a->kind != A_BOOL)
      return grove_err_set(c->err, GROVE_E_SPEC, "%s: argument \"%s\" must be true or false", jp,
                           pn);
  }
  n->mod_kind = md->kind;
  if (md->kind == MK_MHA) {
    n->need_weights = n->args[4].i != 0;
    n->average_weights = n->args[6].i != 0;
    n->tuple = true;
  }
  /* The arguments kept: the tensors, then (when any is given) every mask
   * slot in order, None included, so that liveness sees the masks read. */
  int nt = 0;
  while (nt < np && md->p[nt].dk == D_REQ) nt++;
  garg keep[MDEF_MAX];
  int nk = 0, nm = 0;
  bool any_mask = false;
  for (int i = 0; i < np; i++) {
    const bool mask = strstr(md->p[i].name, "mask") && !strstr(md->p[i].name, "is_causal");
    if (i < nt || mask) {
      keep[nk++] = n->args[i];
      nm += mask;
      any_mask |= mask && n->args[i].kind == A_NODE;
    } else {
      grove__garg_fini(&n->args[i]);
    }
  }
  if (!any_mask) {
    for (int i = nt; i < nk; i++) grove__garg_fini(&keep[i]);
    nk = nt;
  }
  memcpy(n->args, keep, (size_t)nk * sizeof(garg));
  n->nargs = nk;
  n->ntensors = nt;
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
    s = grove_err_set(c->err, GROVE_E_SPEC,
                      "%s.target: \"%s\": this module has no submodule \"%s\"", jp, target, mp);
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
  n->fuse_bn = n->fuse_relu = n->fused_into = n->cat_into = n->cat_part = -1;
  n->fuse_add = n->fuse_res = -1;
  n->fuse_act = GROVE__ACT_NONE;
  n->last_use = -1;
  if (!json_is_object(v))
    return grove_err_set(c->err, GROVE_E_SPEC, "%s: expected a node object {\"op\", \"name\", ...}",
                         jp);
  static const char *const keys[] = {"op",     "name",    "target", "args",
                                     "kwargs", "default", "source", NULL};
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
    return grove_err_set(c->err, GROVE_E_SPEC, "%s.name: \"%s\" is the name of an earlier node", jp,
                         json_string_value(namev));
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
      return grove_err_set(c->err, GROVE_E_SPEC,
                           "%s: a placeholder has no args (a default goes in "
                           "\"default\")",
                           jp);
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
  const grove__opdef *d = grove__op_find(target);
  if (!d) {
    char list[600];
    grove__op_list(list, sizeof list);
    return grove_err_set(c->err, GROVE_E_UNSUPPORTED,
                         "%s.target: \"%s\" is not an operation Grove runs (supported: %s)", jp,
                         target, list);
  }
  n->op = d->id;
  n->def = d;
  n->what = d->name;
  grove_status s = bind(c, n, d, args, kwargs, jp);
  if (!s && d->check) s = d->check(d, n->args, jp, c->err);
  return s;
}

/* ------------------------------------------------------------ fusion */

/* The single reader of node i, when it reads nothing but i, else -1. */
static int sole_reader(const graph_impl *g, int i) {
  if (g->nodes[i].uses != 1) return -1;
  int r = g->nodes[i].last_use;
  const gnode *n = &g->nodes[r];
  if (n->op == G_CALL_MODULE && n->nargs == 1 && n->args[0].kind == A_NODE &&
      n->args[0].node == i && n->mod_kind == MK_PLAIN && !n->tuple)
    return r;
  if (n->op == G_RELU && n->args[0].kind == A_NODE && n->args[0].node == i) return r;
  return -1;
}

/* The activation node r applies, when a convolution before it can take it
 * into its epilogue (a Linear only a ReLU). */
static grove__act node_act(const graph_impl *g, int r) {
  const gnode *n = &g->nodes[r];
  if (n->op == G_RELU) return GROVE__ACT_RELU;
  return n->op == G_CALL_MODULE ? grove__fusable_act(n->mod) : GROVE__ACT_NONE;
}

/* Node i absorbs the activation that alone reads node j, if any. */
static void take_act(graph_impl *g, int i, int j) {
  const int r = sole_reader(g, j);
  const grove__act act = r >= 0 ? node_act(g, r) : GROVE__ACT_NONE;
  if (act != GROVE__ACT_NONE) {
    g->nodes[i].fuse_relu = r;
    g->nodes[i].fuse_act = act;
    g->nodes[r].fused_into = i;
  }
}

/* A residual block's `relu(conv(x) [+ bn] + identity)`: conv i (last: the
 * node whose result the add reads, i or its BatchNorm) absorbs a two-tensor
 * add with alpha 1 that alone reads last and runs right after it, when the
 * other operand comes from a node before i (it exists when the conv runs),
 * and the activation that alone reads the add.  The add's node must follow
 * last directly, so that at most one convolution's add is pending at any
 * time (graph.c's run.res_done). */
static void plan_residual(graph_impl *g, int i, int last) {
  gnode *n = &g->nodes[i];
  if (g->nodes[last].uses != 1) return;
  const int a = g->nodes[last].last_use;
  const gnode *A = &g->nodes[a];
  if (a != last + 1 || A->op != G_ADD || A->nargs != 3 || A->args[0].kind != A_NODE ||
      A->args[1].kind != A_NODE || A->args[2].kind != A_INT || A->args[2].i != 1 ||
      A->fused_into >= 0)
    return;
  const int o = A->args[0].node == last ? A->args[1].node : A->args[0].node;
  if (o == last || o >= i || (A->args[0].node != last && A->args[1].node != last)) return;
  n->fuse_add = a;
  n->fuse_res = o;
  g->nodes[a].fused_into = i;
  take_act(g, i, a);
}

static void plan_fusion(graph_impl *g) {
  for (int i = 0; i < g->nnodes; i++) {
    gnode *n = &g->nodes[i];
    if (n->op != G_CALL_MODULE || n->fused_into >= 0 || n->nargs != 1) continue;
    const grove_module_type *t = n->mod->type;
    if (t == &grove__batch_norm2d_type) {
      /* A BatchNorm2d no convolution absorbed (a pre-activation block:
       * DenseNet's norm1 + relu1) applies the activation after it in its
       * own pass (grove__bn2d_act_forward). */
      take_act(g, i, i);
      continue;
    }
    bool conv = t == &grove__conv1d_type || t == &grove__conv2d_type;
    if (!conv && t != &grove__linear_type) continue;
    int r = sole_reader(g, i);
    if (r < 0) {
      if (t == &grove__conv2d_type) plan_residual(g, i, i);
      continue;
    }
    if (conv && t == &grove__conv2d_type && g->nodes[r].op == G_CALL_MODULE &&
        g->nodes[r].mod->type == &grove__batch_norm2d_type &&
        grove__bn2d_channels(g->nodes[r].mod) == grove__conv_out_channels(n->mod)) {
      n->fuse_bn = r;
      g->nodes[r].fused_into = i;
      const int bn = r;
      r = sole_reader(g, r);
      if (r < 0) {
        plan_residual(g, i, bn);
        continue;
      }
    }
    const grove__act act = node_act(g, r);
    if (act == GROVE__ACT_RELU || (conv && act != GROVE__ACT_NONE)) {
      n->fuse_relu = r;
      n->fuse_act = act;
      g->nodes[r].fused_into = i;
    }
  }
}

/* The convolution computing item, a part of a cat: item itself, or the
 * convolution that absorbs item as its last fused node (its BatchNorm with
 * no activation after it, or its activation); -1 when it is neither. */
static int slice_producer(const graph_impl *g, int item) {
  const gnode *it = &g->nodes[item];
  int q = item;
  if (it->fused_into >= 0) {
    const gnode *c = &g->nodes[it->fused_into];
    if (c->fuse_relu != item && !(c->fuse_bn == item && c->fuse_relu < 0)) return -1;
    if (c->fuse_add >= 0) return -1; /* its result is decided at run time */
    q = it->fused_into;
  }
  const gnode *n = &g->nodes[q];
  /* Whether it has a channels-last path is known only once its weights are
   * packed (by the load, after compiling): the convolution decides. */
  if (n->op != G_CALL_MODULE || n->mod_kind != MK_PLAIN || n->tuple ||
      n->mod->type != &grove__conv2d_type)
    return -1;
  return q;
}

/* Whether node c is a torch.cat of a list of 1 to 64 distinct nodes along
 * dim 1. */
static bool cat_of_nodes(const gnode *c) {
  if (c->op != G_CAT || c->nargs < 2 || c->args[0].kind != A_LIST || c->args[0].n < 1 ||
      c->args[0].n > 64 || c->args[1].kind != A_INT || c->args[1].i != 1)
    return false;
  const garg *it = c->args[0].items;
  for (int k = 0; k < c->args[0].n; k++) {
    if (it[k].kind != A_NODE) return false;
    for (int j = 0; j < k; j++)
      if (it[j].node == it[k].node) return false;
  }
  return true;
}

/* Plans the chains of gnode.cat_into, latest cat first (a cat that ends a
 * chain claims its prefixes).  A part becomes its convolution's slice when
 * the chain's cats are its only readers; any other part (the block's input
 * of a DenseNet block, a pool's result) is copied into its slice by the
 * first cat that lists it, once, and must exist before the chain's first
 * node runs (the buffer's channel count is then known when it is made).
 * A chain without a convolution writing its slice is left alone: its cat
 * would only copy as always, into a layout its readers may not want.
 * Whether a slice is written is decided at run time (graph.c): the
 * convolution must produce channels last at the buffer's batch and size;
 * a cat copies every part it finds elsewhere. */
static void plan_cat_slices(graph_impl *g) {
  for (int f = g->nnodes - 1; f >= 0; f--) {
    gnode *F = &g->nodes[f];
    if (!cat_of_nodes(F) || F->cat_into >= 0) continue;
    const garg *items = F->args[0].items;
    const int n = F->args[0].n;
    int reads[64], writer[64], members[64], nm = 0, first = f;
    for (int k = 0; k < n; k++) reads[k] = 1;
    for (int c = 0; c < f && nm < 64; c++) {
      const gnode *C = &g->nodes[c];
      if (!cat_of_nodes(C) || C->cat_into >= 0 || C->args[0].n > n) continue;
      bool prefix = true;
      for (int k = 0; prefix && k < C->args[0].n; k++)
        prefix = C->args[0].items[k].node == items[k].node;
      if (!prefix) continue;
      members[nm++] = c;
      for (int k = 0; k < C->args[0].n; k++) reads[k]++;
      if (c < first) first = c;
    }
    int writers = 0;
    for (int k = 0; k < n; k++) {
      const int it = items[k].node;
      const int q = g->nodes[it].uses == reads[k] ? slice_producer(g, it) : -1;
      writer[k] = q >= 0 && g->nodes[q].cat_into < 0 ? q : -1;
      if (writer[k] >= 0) {
        writers++;
        if (q < first) first = q;
      }
    }
    bool ok = writers > 0;
    for (int k = 0; ok && k < n; k++) ok = writer[k] >= 0 || items[k].node < first;
    if (!ok) continue;
    for (int k = 0; k < n; k++) {
      if (writer[k] < 0) continue;
      g->nodes[writer[k]].cat_into = f;
      g->nodes[writer[k]].cat_part = k;
    }
    for (int m = 0; m < nm; m++) {
      g->nodes[members[m]].cat_into = f;
      g->nodes[members[m]].cat_planned = true;
    }
    F->cat_into = f;
    F->cat_planned = true;
    g->has_cat_plans = true;
  }
}

/* After the children's refresh (a load or a reload): each convolution
 * that plan_fusion joined to a BatchNorm2d gets it folded into its packed
 * weight (grove__conv_fold_bn). */
static grove_status graph_refresh(grove_module *m, grove_err *err) {
  graph_impl *g = m->impl;
  for (int i = 0; i < g->nnodes; i++) {
    const gnode *n = &g->nodes[i];
    if (n->fuse_bn < 0) continue;
    grove_status s = grove__conv_fold_bn(n->mod, g->nodes[n->fuse_bn].mod, err);
    if (s) return s;
  }
  return GROVE_OK;
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
  cctx c = {g, m, path, err, 0, gv, json_object()};
  if (!c.names) return nomem(err);
  for (size_t i = 0; i < nn; i++) {
    char jp[480];
    snprintf(jp, sizeof jp, "%s.graph[%zu]", path, i);
    c.cur = (int)i;
    grove_status s = compile_node(&c, json_array_get(gv, i), jp);
    if (!s && json_object_set_new_nocheck(c.names, g->nodes[i].name, json_integer((json_int_t)i)))
      s = nomem(err);
    if (s) {
      json_decref(c.names);
      return s;
    }
    gnode *n = &g->nodes[i];
    if (n->op == G_OUTPUT) {
      if (i + 1 != nn) {
        json_decref(c.names);
        return grove_err_set(err, GROVE_E_SPEC, "%s: the output node must be the last node", jp);
      }
      g->output = (int)i;
    }
    for (int k = 0; k < n->nargs; k++) count_uses(g->nodes, &n->args[k], (int)i);
  }
  json_decref(c.names);
  if (g->output < 0)
    return grove_err_set(err, GROVE_E_SPEC,
                         "%s.graph: no output node (the last node must be "
                         "{\"op\": \"output\", ...})",
                         path);
  /* Regions: at most one per tensor a node produces. */
  g->max_regions = g->nnodes * GROVE_MAX_VALUES + GROVE_MAX_VALUES;
  plan_fusion(g);
  plan_cat_slices(g);
  g->compiled = true;
  g->type.forward = grove__graph_forward;
  g->type.refresh = graph_refresh;
  return GROVE_OK;
}
