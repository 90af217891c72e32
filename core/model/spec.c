/* spec.c: model.json (format "grove.model/1") parsed into a Module tree and
 * the model's input/output spec and batching settings.
 *
 * The tree is built depth-first through the layer registry (module_internal.h): each
 * module object goes to its type's from_json, which reads the constructor
 * arguments and refuses unknown ones; this file reads what is about the tree
 * itself ("children", "ref", "tied", "graph") and the top-level keys.
 *
 * Shared modules and tied parameters keep PyTorch's identity semantics: a
 * {"ref": PATH} entry adds the very module object built at PATH a second time
 * (as torch's module reachable from two attributes), and "tied" makes a
 * parameter slot hold the very tensor object of another path (as
 * `decoder.weight = embed.weight`).  Traversals then de-duplicate exactly as
 * torch's named_parameters() and state_dict() do.
 *
 * A module with a custom forward carries "graph" (graph.c): it is built
 * with its own parameters and buffers, then its children, and its graph is
 * compiled last, against the finished subtree.
 *
 * Every error is GROVE_E_SPEC (an argument or graph operation Grove knows but
 * does not run is GROVE_E_UNSUPPORTED) with a message "ORIGIN: $.json.path:
 * what is wrong".  The format is described in docs/model-spec.md.
 */
#include <ctype.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph.h"
#include "grove/grove.h"
#include "module_internal.h"

#define SPEC_FORMAT "grove.model/1"
/* Deeper nesting than this is a broken or hostile file, not a model; the
 * limit keeps the recursive builder's stack small. */
#define MAX_DEPTH 200
/* Serving limits: a batch is concatenated into one tensor and the scratch
 * arena is sized for max_batch_size rows, so absurd values would only fail
 * later, at open, as an allocation failure. */
#define MAX_BATCH 1048576
#define MAX_QUEUE 16777216
#define MAX_DELAY_US 60000000 /* one minute */

/* ------------------------------------------------------------ helpers */

static grove_status expected(grove_err *err, const char *path, const char *what, const json_t *v) {
  char got[96];
  grove__json_describe(v, got, sizeof got);
  return grove_err_set(err, GROVE_E_SPEC, "%s: expected %s, got %s", path, what, got);
}

/* JSON path of member key of the object at base: base.key when key is a
 * plain identifier, else base["key"] (keys of named children may be "0" or
 * contain anything). */
static char *jpath_key(const char *base, const char *key) {
  bool plain = (isalpha((unsigned char)key[0]) || key[0] == '_');
  for (const char *p = key; plain && *p; p++) plain = isalnum((unsigned char)*p) || *p == '_';
  if (plain) return grove__asprintf("%s.%s", base, key);
  /* Escape quotes and backslashes so that the path stays unambiguous. */
  size_t n = strlen(key);
  char *esc = malloc(2 * n + 1), *q = esc;
  if (!esc) return NULL;
  for (const char *p = key; *p; p++) {
    if (*p == '"' || *p == '\\') *q++ = '\\';
    *q++ = *p;
  }
  *q = '\0';
  char *s = grove__asprintf("%s[\"%s\"]", base, esc);
  free(esc);
  return s;
}

/* Dotted module path: "" + "fc" -> "fc", "enc" + "0" -> "enc.0". */
static char *mpath_join(const char *base, const char *name) {
  return base[0] ? grove__asprintf("%s.%s", base, name) : grove__strdup(name);
}

static grove_status nomem(grove_err *err) {
  return grove_err_set(err, GROVE_E_NOMEM, "out of memory");
}

/* The first key of obj not in allowed (NULL-terminated), or NULL. */
static const char *unknown_key(const json_t *obj, const char *const *allowed) {
  const char *key;
  json_t *v;
  json_object_foreach((json_t *)obj, key, v) {
    bool ok = false;
    for (size_t i = 0; allowed[i] && !ok; i++) ok = strcmp(allowed[i], key) == 0;
    if (!ok) return key;
  }
  return NULL;
}

static grove_status check_keys(grove_err *err, const json_t *obj, const char *path,
                               const char *what, const char *const *allowed) {
  const char *bad = unknown_key(obj, allowed);
  if (!bad) return GROVE_OK;
  char list[256] = "";
  size_t used = 0;
  for (size_t i = 0; allowed[i] && used < sizeof list; i++)
    used += (size_t)snprintf(list + used, sizeof list - used, "%s%s", i ? ", " : "", allowed[i]);
  char *p = jpath_key(path, bad);
  grove_status s = grove_err_set(err, GROVE_E_SPEC, "%s: unknown key in %s (known: %s)",
                                 p ? p : path, what, list);
  free(p);
  return s;
}

/* ------------------------------------------------------------ tree building */

typedef struct built {
  char *path;      /* dotted module path */
  grove_module *m; /* borrowed from the tree */
} built;

typedef struct tie {
  grove_module *m;    /* borrowed: the module whose slot is tied */
  const char *param;  /* borrowed from the JSON document */
  const char *target; /* dotted path of the parameter it shares, from the document */
  char *jpath;        /* "$.module.children[6].tied.weight" */
} tie;

typedef struct ctx {
  built *mods;
  size_t nmods, capmods;
  /* path -> index in mods: a jansson object, for its hash table (a linear
   * scan per ref made N modules cost O(N^2)). */
  json_t *by_path;
  tie *ties;
  size_t nties, capties;
  grove_err *err;
} ctx;

static void ctx_fini(ctx *c) {
  for (size_t i = 0; i < c->nmods; i++) free(c->mods[i].path);
  for (size_t i = 0; i < c->nties; i++) free(c->ties[i].jpath);
  free(c->mods);
  free(c->ties);
  json_decref(c->by_path);
}

static grove_status remember(ctx *c, const char *path, grove_module *m) {
  if (c->nmods == c->capmods) {
    size_t cap = c->capmods ? 2 * c->capmods : 32;
    built *p = realloc(c->mods, cap * sizeof *p);
    if (!p) return nomem(c->err);
    c->mods = p;
    c->capmods = cap;
  }
  char *copy = grove__strdup(path);
  if (!copy) return nomem(c->err);
  if (!c->by_path && !(c->by_path = json_object())) {
    free(copy);
    return nomem(c->err);
  }
  /* The first module built at a path is the one a ref names. */
  if (!json_object_get(c->by_path, path) &&
      json_object_set_new_nocheck(c->by_path, path, json_integer((json_int_t)c->nmods))) {
    free(copy);
    return nomem(c->err);
  }
  c->mods[c->nmods++] = (built){copy, m};
  return GROVE_OK;
}

static grove_module *lookup(const ctx *c, const char *path) {
  const json_t *i = c->by_path ? json_object_get(c->by_path, path) : NULL;
  return i ? c->mods[json_integer_value(i)].m : NULL;
}

/* Whether path a is mp itself or one of its ancestors ("" is everyone's). */
static bool is_ancestor_or_self(const char *a, const char *mp) {
  size_t n = strlen(a);
  if (n == 0) return true;
  return strncmp(a, mp, n) == 0 && (mp[n] == '\0' || mp[n] == '.');
}

static grove_status build(ctx *c, const json_t *v, const char *jp, const char *mp, int depth,
                          grove_module **out);

static grove_status build_ref(ctx *c, const json_t *v, const char *jp, const char *mp,
                              grove_module **out) {
  static const char *const only_ref[] = {"ref", NULL};
  grove_status s = check_keys(c->err, v, jp, "a {\"ref\": PATH} entry", only_ref);
  if (s) return s;
  const json_t *ref = json_object_get(v, "ref");
  char *p = jpath_key(jp, "ref");
  if (!p) return nomem(c->err);
  if (!json_is_string(ref)) {
    s = expected(c->err, p, "the dotted path of a module defined earlier", ref);
  } else {
    const char *target = json_string_value(ref);
    grove_module *m = lookup(c, target);
    if (m) {
      grove_module_retain(m);
      *out = m;
      /* A later ref may name this path too. */
      s = remember(c, mp, m);
    } else if (is_ancestor_or_self(target, mp)) {
      s = grove_err_set(c->err, GROVE_E_SPEC,
                        "%s: \"%s\" is this module or one of its ancestors: a module cannot "
                        "contain itself",
                        p, target);
    } else {
      s = grove_err_set(c->err, GROVE_E_SPEC,
                        "%s: \"%s\" names no module defined before this point (a ref names the "
                        "first path of a shared module, in named_modules() order)",
                        p, target);
    }
  }
  free(p);
  return s;
}

static grove_status record_ties(ctx *c, const json_t *tied, const char *jp, grove_module *m) {
  char *tp = jpath_key(jp, "tied");
  if (!tp) return nomem(c->err);
  grove_status s = GROVE_OK;
  if (!json_is_object(tied)) {
    s = expected(c->err, tp,
                 "an object mapping a parameter name to the dotted path of the "
                 "parameter it shares",
                 tied);
    free(tp);
    return s;
  }
  const char *key;
  json_t *val;
  json_object_foreach((json_t *)tied, key, val) {
    char *kp = jpath_key(tp, key);
    if (!kp) {
      s = nomem(c->err);
      break;
    }
    if (!json_is_string(val) || json_string_length(val) == 0) {
      s = expected(c->err, kp, "the dotted path of a parameter (\"embed.weight\")", val);
      free(kp);
      break;
    }
    if (c->nties == c->capties) {
      size_t cap = c->capties ? 2 * c->capties : 8;
      tie *t = realloc(c->ties, cap * sizeof *t);
      if (!t) {
        free(kp);
        s = nomem(c->err);
        break;
      }
      c->ties = t;
      c->capties = cap;
    }
    c->ties[c->nties++] = (tie){m, key, json_string_value(val), kp};
  }
  free(tp);
  return s;
}

static grove_status add_child(ctx *c, grove_module *m, const char *name, const json_t *cv,
                              const char *cjp, const char *mp, int depth) {
  char *cmp = mpath_join(mp, name);
  if (!cmp) return nomem(c->err);
  grove_module *child = NULL;
  grove_status s = build(c, cv, cjp, cmp, depth + 1, &child);
  free(cmp);
  if (s) return s;
  grove_err e = {0};
  s = grove_module_add_module(m, name, child, &e);
  grove_module_release(child); /* the container holds its own reference */
  if (s == GROVE_E_NOMEM) return nomem(c->err);
  if (s)
    return grove_err_set(c->err, GROVE_E_SPEC, "%s: invalid child name \"%s\": %s", cjp, name,
                         grove_err_msg(&e));
  return GROVE_OK;
}

static grove_status build_children(ctx *c, const json_t *kids, const char *type, const char *jp,
                                   const char *mp, int depth, grove_module *m) {
  char *kp = jpath_key(jp, "children");
  if (!kp) return nomem(c->err);
  grove_status s = GROVE_OK;
  if (json_is_array(kids)) {
    if (strcmp(type, "ModuleDict") == 0) {
      s = grove_err_set(c->err, GROVE_E_SPEC,
                        "%s: a ModuleDict's children are an object (name -> module), not an "
                        "array",
                        kp);
    }
    for (size_t i = 0; !s && i < json_array_size(kids); i++) {
      char name[32];
      snprintf(name, sizeof name, "%zu", i);
      char *cjp = grove__asprintf("%s[%zu]", kp, i);
      if (!cjp) {
        s = nomem(c->err);
        break;
      }
      s = add_child(c, m, name, json_array_get(kids, i), cjp, mp, depth);
      free(cjp);
    }
  } else if (json_is_object(kids)) {
    const char *name;
    json_t *cv;
    json_object_foreach((json_t *)kids, name, cv) {
      char *cjp = jpath_key(kp, name);
      if (!cjp) {
        s = nomem(c->err);
        break;
      }
      s = add_child(c, m, name, cv, cjp, mp, depth);
      free(cjp);
      if (s) break;
    }
  } else {
    s = expected(c->err, kp, "an array of modules or an object mapping names to modules", kids);
  }
  free(kp);
  return s;
}

/* A module with a custom forward: its own tensors, its children, then its
 * graph, which names them. */
static grove_status build_graph(ctx *c, const json_t *v, const char *jp, const char *mp, int depth,
                                grove_module **out) {
  grove_module *m = NULL;
  grove_status s = grove__graph_from_json(v, jp, &m, c->err);
  if (s) return s;
  const json_t *tied = json_object_get(v, "tied");
  const json_t *kids = json_object_get(v, "children");
  if (tied) s = record_ties(c, tied, jp, m);
  if (!s && kids) s = build_children(c, kids, grove_module_type_name(m), jp, mp, depth, m);
  if (!s) {
    char *where = mp[0] ? grove__asprintf("'%s' (%s)", mp, grove_module_type_name(m))
                        : grove__asprintf("the root module (%s)", grove_module_type_name(m));
    s = where ? grove__graph_compile(m, v, jp, where, c->err) : nomem(c->err);
    free(where);
  }
  if (!s) s = remember(c, mp, m);
  if (s) {
    grove_module_release(m);
    return s;
  }
  *out = m;
  return GROVE_OK;
}

/* Builds the module described at JSON path jp, to live at dotted path mp.
 * *out is a new reference (or NULL for a JSON null child, torch's None). */
static grove_status build(ctx *c, const json_t *v, const char *jp, const char *mp, int depth,
                          grove_module **out) {
  *out = NULL;
  if (depth > MAX_DEPTH)
    return grove_err_set(c->err, GROVE_E_SPEC, "modules nested more than %d deep, at %s", MAX_DEPTH,
                         jp); /* the path is long: the reason goes first */
  if (json_is_null(v) && depth > 0) return GROVE_OK;
  if (!json_is_object(v))
    return expected(c->err, jp, "an object describing a module ({\"type\": ...} or {\"ref\": ...})",
                    v);
  if (json_object_get(v, "ref")) return build_ref(c, v, jp, mp, out);
  if (json_object_get(v, "graph")) return build_graph(c, v, jp, mp, depth, out);
  const json_t *tv = json_object_get(v, "type");
  if (!tv)
    return grove_err_set(c->err, GROVE_E_SPEC,
                         "%s: missing \"type\" (the torch.nn class name, e.g. \"Linear\")", jp);
  if (!json_is_string(tv)) {
    char *p = jpath_key(jp, "type");
    grove_status s = expected(c->err, p ? p : jp, "a torch.nn class name", tv);
    free(p);
    return s;
  }
  const char *type = json_string_value(tv);
  const grove__layer_def *def = grove__layer_find(type);
  if (!def) {
    size_t n = 0;
    const grove__layer_def *defs = grove__layer_defs(&n);
    char list[1024] = "";
    size_t used = 0;
    for (size_t i = 0; i < n && used < sizeof list; i++)
      used +=
          (size_t)snprintf(list + used, sizeof list - used, "%s%s", i ? ", " : "", defs[i].type);
    char shown[96];
    grove__json_describe(tv, shown, sizeof shown);
    return grove_err_set(c->err, GROVE_E_SPEC,
                         "%s.type: %s is not a module type Grove runs (supported: %s)", jp, shown,
                         list);
  }
  const json_t *kids = json_object_get(v, "children");
  if (kids && !def->container)
    return grove_err_set(c->err, GROVE_E_SPEC,
                         "%s.children: a %s has no children (only Sequential, ModuleList and "
                         "ModuleDict do)",
                         jp, type);

  grove_module *m = NULL;
  grove_status s = def->from_json(v, jp, &m, c->err);
  if (s) return s;
  const json_t *tied = json_object_get(v, "tied");
  if (tied) s = record_ties(c, tied, jp, m);
  if (!s && kids) s = build_children(c, kids, type, jp, mp, depth, m);
  /* Registered only now, complete: a ref from inside its own subtree would
   * be a cycle, and is refused as one. */
  if (!s) s = remember(c, mp, m);
  if (s) {
    grove_module_release(m);
    return s;
  }
  *out = m;
  return GROVE_OK;
}

static grove_slot *find_param_slot(grove_module *m, const char *name) {
  for (size_t i = 0; i < m->nparams; i++)
    if (strcmp(m->params[i].name, name) == 0) return &m->params[i];
  return NULL;
}

static bool is_tie_source(const ctx *c, const grove_module *m, const char *param) {
  for (size_t i = 0; i < c->nties; i++)
    if (c->ties[i].m == m && strcmp(c->ties[i].param, param) == 0) return true;
  return false;
}

/* Resolves every "tied" entry once the whole tree exists: the slot is set to
 * the very tensor object at the target path, so the two are one parameter
 * (named_parameters() yields it once; state_dict() under both keys). */
static grove_status apply_ties(ctx *c, grove_module *root) {
  for (size_t i = 0; i < c->nties; i++) {
    const tie *t = &c->ties[i];
    const char *dot = strrchr(t->target, '.');
    char *modpath = dot ? strndup(t->target, (size_t)(dot - t->target)) : grove__strdup("");
    if (!modpath) return nomem(c->err);
    const char *pname = dot ? dot + 1 : t->target;
    grove_module *tm = grove_module_find(root, modpath);
    grove_status s = GROVE_OK;
    grove_slot *src = find_param_slot(t->m, t->param);
    grove_slot *dst = tm ? find_param_slot(tm, pname) : NULL;
    char a[160], b[160];
    if (!tm) {
      s = grove_err_set(c->err, GROVE_E_SPEC, "%s: \"%s\" names no module \"%s\"", t->jpath,
                        t->target, modpath);
    } else if (!dst || !dst->tensor) {
      s = grove_err_set(c->err, GROVE_E_SPEC,
                        "%s: \"%s\": the %s at \"%s\" has no parameter \"%s\"", t->jpath, t->target,
                        tm->type->name, modpath, pname);
    } else if (!src) {
      s = grove_err_set(c->err, GROVE_E_SPEC, "%s: a %s has no parameter \"%s\" to tie", t->jpath,
                        t->m->type->name, t->param);
    } else if (!src->tensor) {
      s = grove_err_set(c->err, GROVE_E_SPEC,
                        "%s: this %s's parameter \"%s\" is None (bias=false?) and cannot be tied",
                        t->jpath, t->m->type->name, t->param);
    } else if (src == dst) {
      s = grove_err_set(c->err, GROVE_E_SPEC, "%s: \"%s\" is this very parameter", t->jpath,
                        t->target);
    } else if (is_tie_source(c, tm, pname)) {
      s = grove_err_set(c->err, GROVE_E_SPEC,
                        "%s: \"%s\" is itself tied to another parameter; name the first "
                        "occurrence instead",
                        t->jpath, t->target);
    } else if (!grove_tensor_same_shape(src->tensor, dst->tensor) ||
               src->tensor->dtype != dst->tensor->dtype) {
      s = grove_err_set(c->err, GROVE_E_SPEC,
                        "%s: \"%s\" is %s %s but this %s's \"%s\" is %s %s: tied "
                        "parameters must have the same shape",
                        t->jpath, t->target, grove_dtype_name(dst->tensor->dtype),
                        grove_shape_str(dst->tensor->ndim, dst->tensor->shape, a, sizeof a),
                        t->m->type->name, t->param, grove_dtype_name(src->tensor->dtype),
                        grove_shape_str(src->tensor->ndim, src->tensor->shape, b, sizeof b));
    } else {
      grove_err e = {0};
      s = grove_module_register_parameter(t->m, t->param, dst->tensor, &e);
      if (s) s = grove_err_set(c->err, s, "%s: %s", t->jpath, grove_err_msg(&e));
    }
    free(modpath);
    if (s) return s;
  }
  return GROVE_OK;
}

/* ------------------------------------------------------------ io and batching */

static grove_status parse_dim(grove_err *err, const json_t *d, const char *sp, size_t k,
                              int64_t *out) {
  if (json_is_integer(d)) {
    json_int_t x = json_integer_value(d);
    if (x == -1 || x >= 1) {
      *out = (int64_t)x;
      return GROVE_OK;
    }
  }
  char *p = grove__asprintf("%s[%zu]", sp, k);
  grove_status s = expected(err, p ? p : sp, "a positive integer or -1 (any size)", d);
  free(p);
  return s;
}

static grove_status parse_io_entry(grove_err *err, const json_t *e, const char *ep, bool input,
                                   grove_io_spec *out) {
  static const char *const keys[] = {"name", "dtype", "shape", NULL};
  if (!json_is_object(e)) return expected(err, ep, "an object {\"name\", \"dtype\", \"shape\"}", e);
  grove_status s = check_keys(err, e, ep, input ? "an input" : "an output", keys);
  if (s) return s;
  const json_t *name = json_object_get(e, "name"), *dt = json_object_get(e, "dtype"),
               *shape = json_object_get(e, "shape");
  const char *missing = !name ? "name" : !dt ? "dtype" : !shape ? "shape" : NULL;
  if (missing) return grove_err_set(err, GROVE_E_SPEC, "%s: missing \"%s\"", ep, missing);
  char *p = NULL;
  if (!json_is_string(name) || json_string_length(name) == 0) {
    p = jpath_key(ep, "name");
    s = expected(err, p ? p : ep, "a non-empty string", name);
  } else if (!json_is_string(dt) || !grove_dtype_from_name(json_string_value(dt), &out->dtype)) {
    p = jpath_key(ep, "dtype");
    s = expected(err, p ? p : ep,
                 "a dtype name (float32, int64, float16, bfloat16, float64, int32, int16, int8, "
                 "uint8, bool)",
                 dt);
  } else {
    p = jpath_key(ep, "shape");
    if (!p) return nomem(err);
    size_t n = json_is_array(shape) ? json_array_size(shape) : 0;
    if (!json_is_array(shape) || n > GROVE_MAX_DIMS || (input && n == 0)) {
      char what[96];
      snprintf(what, sizeof what, "a list of %d to %d dimensions (-1 = any size)", input ? 1 : 0,
               GROVE_MAX_DIMS);
      s = expected(err, p, what, shape);
    }
    for (size_t k = 0; !s && k < n; k++)
      s = parse_dim(err, json_array_get(shape, k), p, k, &out->shape[k]);
    if (!s && input && out->shape[0] != -1) {
      s = grove_err_set(err, GROVE_E_SPEC,
                        "%s[0]: dimension 0 is the batch and must be -1, got %" PRId64, p,
                        out->shape[0]);
    }
    if (!s) {
      out->ndim = (int)n;
      out->name = grove__strdup(json_string_value(name));
      if (!out->name) s = nomem(err);
    }
  }
  free(p);
  return s;
}

static grove_status parse_io(grove_err *err, const json_t *arr, const char *jp, bool input,
                             grove_io_spec **out, size_t *n) {
  if (!json_is_array(arr) || (input && json_array_size(arr) == 0) ||
      json_array_size(arr) > GROVE_MAX_VALUES) {
    char what[96];
    snprintf(what, sizeof what, "a list of %d to %d %s", input ? 1 : 0, GROVE_MAX_VALUES,
             input ? "inputs" : "outputs");
    return expected(err, jp, what, arr);
  }
  size_t count = json_array_size(arr);
  if (count == 0) return GROVE_OK;
  *out = calloc(count, sizeof **out);
  if (!*out) return nomem(err);
  *n = count; /* names freed by grove_model_free even when we stop half-way */
  for (size_t i = 0; i < count; i++) {
    char *ep = grove__asprintf("%s[%zu]", jp, i);
    if (!ep) return nomem(err);
    grove_status s = parse_io_entry(err, json_array_get(arr, i), ep, input, &(*out)[i]);
    for (size_t j = 0; !s && j < i; j++) {
      if (strcmp((*out)[j].name, (*out)[i].name) == 0)
        s = grove_err_set(err, GROVE_E_SPEC, "%s.name: \"%s\" is also the name of %s[%zu]", ep,
                          (*out)[i].name, jp, j);
    }
    free(ep);
    if (s) return s;
  }
  return GROVE_OK;
}

static grove_status parse_batching(grove_err *err, const json_t *b, grove_batching *out) {
  static const char *const keys[] = {"max_batch_size", "max_queue_delay_us", "max_queue_size",
                                     NULL};
  static const int64_t lo[] = {0, 0, 1}, hi[] = {MAX_BATCH, MAX_DELAY_US, MAX_QUEUE};
  int64_t *dst[] = {&out->max_batch_size, &out->max_queue_delay_us, &out->max_queue_size};
  if (!json_is_object(b))
    return expected(err, "$.batching",
                    "an object with max_batch_size, max_queue_delay_us, "
                    "max_queue_size",
                    b);
  grove_status s = check_keys(err, b, "$.batching", "batching", keys);
  if (s) return s;
  for (int i = 0; keys[i]; i++) {
    const json_t *v = json_object_get(b, keys[i]);
    if (!v) continue;
    if (!json_is_integer(v) || json_integer_value(v) < lo[i] || json_integer_value(v) > hi[i]) {
      char p[64], what[96];
      snprintf(p, sizeof p, "$.batching.%s", keys[i]);
      snprintf(what, sizeof what, "an integer in [%" PRId64 ", %" PRId64 "]", lo[i], hi[i]);
      return expected(err, p, what, v);
    }
    *dst[i] = (int64_t)json_integer_value(v);
  }
  return GROVE_OK;
}

/* The weights file must stay inside the model directory: a model.json from
 * elsewhere must not make the server read arbitrary files. */
static grove_status check_weights_name(grove_err *err, const json_t *w) {
  if (!json_is_string(w) || json_string_length(w) == 0)
    return expected(err, "$.weights", "a file name inside the model directory", w);
  const char *s = json_string_value(w);
  bool bad = s[0] == '/' || strlen(s) != json_string_length(w);
  for (const char *p = s; !bad && *p;) {
    size_t n = strcspn(p, "/");
    if (n == 2 && p[0] == '.' && p[1] == '.') bad = true;
    p += n;
    if (*p) p++;
  }
  if (bad)
    return grove_err_set(err, GROVE_E_SPEC,
                         "$.weights: \"%s\" is not a file name inside the model directory (no "
                         "absolute path, no \"..\")",
                         s);
  return GROVE_OK;
}

static grove_status check_name(grove_err *err, const json_t *v) {
  bool ok = json_is_string(v) && json_string_length(v) > 0 &&
            strlen(json_string_value(v)) == json_string_length(v);
  for (const char *p = ok ? json_string_value(v) : ""; ok && *p; p++)
    ok = (unsigned char)*p > 0x20 && *p != '/' && *p != 0x7f;
  if (!ok) return expected(err, "$.name", "a non-empty name without spaces or '/'", v);
  return GROVE_OK;
}

/* ------------------------------------------------------------ entry point */

static grove_status parse(const json_t *doc, grove_model *m, grove_err *err) {
  static const char *const top[] = {"format",   "name",    "inputs", "outputs",
                                    "batching", "weights", "module", NULL};
  if (!json_is_object(doc)) return expected(err, "$", "an object", doc);
  const json_t *fmt = json_object_get(doc, "format");
  if (!fmt)
    return grove_err_set(err, GROVE_E_SPEC, "$.format: missing (expected \"%s\")", SPEC_FORMAT);
  if (!json_is_string(fmt) || strcmp(json_string_value(fmt), SPEC_FORMAT) != 0)
    return expected(err, "$.format", "\"" SPEC_FORMAT "\" (the only format this Grove reads)", fmt);
  grove_status s = check_keys(err, doc, "$", "model.json", top);
  if (s) return s;

  const json_t *v;
  if ((v = json_object_get(doc, "name"))) {
    if ((s = check_name(err, v))) return s;
    if (!(m->name = grove__strdup(json_string_value(v)))) return nomem(err);
  }
  if ((v = json_object_get(doc, "weights")) && (s = check_weights_name(err, v))) return s;
  v = json_object_get(doc, "inputs");
  if (!v)
    return grove_err_set(err, GROVE_E_SPEC,
                         "$.inputs: missing (a list of {\"name\", \"dtype\", \"shape\"})");
  if ((s = parse_io(err, v, "$.inputs", true, &m->inputs, &m->ninputs))) return s;
  if ((v = json_object_get(doc, "outputs")) &&
      (s = parse_io(err, v, "$.outputs", false, &m->outputs, &m->noutputs)))
    return s;
  m->batching = (grove_batching){64, 500, 1024};
  if ((v = json_object_get(doc, "batching")) && (s = parse_batching(err, v, &m->batching)))
    return s;

  v = json_object_get(doc, "module");
  if (!v) return grove_err_set(err, GROVE_E_SPEC, "$.module: missing (the module tree)");
  ctx c = {.err = err};
  s = build(&c, v, "$.module", "", 0, &m->root);
  if (!s) s = apply_ties(&c, m->root);
  ctx_fini(&c);
  if (s) return s;
  /* Serving trees are eval-mode for good (DESIGN.md); torch builds modules
   * in training mode, and so do the layer constructors. */
  grove_module_eval(m->root);
  return GROVE_OK;
}

grove_status grove_model_from_spec(const char *json_text, const char *origin, grove_model **out,
                                   grove_err *err) {
  if (out) *out = NULL;
  if (!origin) origin = "model.json";
  if (!json_text || !out)
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT, "grove_model_from_spec: NULL argument");
  json_error_t je;
  json_t *doc = json_loads(json_text, JSON_REJECT_DUPLICATES, &je);
  /* Position only: jansson's text quotes the bytes near the error, and
   * model.json may be a symlink to a file that is not a spec at all. */
  if (!doc)
    return grove_err_set(
        err, GROVE_E_SPEC, "%s: not valid JSON (line %d, column %d%s)", origin, je.line, je.column,
        json_error_code(&je) == json_error_duplicate_key ? ": a key named twice in one object"
                                                         : "");
  grove_model *m = calloc(1, sizeof *m);
  grove_status s = m ? parse(doc, m, err) : nomem(err);
  json_decref(doc);
  if (s) {
    grove_model_free(m);
    grove_err_prefix(err, "%s", origin);
    return s;
  }
  *out = m;
  return GROVE_OK;
}

void grove_model_free(grove_model *m) {
  if (!m) return;
  free(m->name);
  free(m->dir);
  free(m->weights_path);
  grove_module_release(m->root);
  for (size_t i = 0; i < m->ninputs; i++) free(m->inputs[i].name);
  for (size_t i = 0; i < m->noutputs; i++) free(m->outputs[i].name);
  free(m->inputs);
  free(m->outputs);
  free(m);
}
