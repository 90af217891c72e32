/* module.c: the Module tree with torch.nn.Module's semantics: registration
 * and its errors, traversal with memo de-duplication, train/eval, apply,
 * state_dict, all-or-nothing load_state_dict, and hooks.
 *
 * PyTorch (torch/nn/modules/module.py) is the reference for every order and
 * every message here; tests/fixtures_gen/module.py checks them against it. */
#include <assert.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "module_internal.h"
#include "layers_internal.h"

/* ============================================================== hooks */

enum {
  HK_FWD_PRE,
  HK_FWD,
  HK_SD_PRE,
  HK_SD_POST,
  HK_LOAD_PRE,
  HK_LOAD_POST,
  HK_KINDS
};

typedef void (*any_fn)(void);

typedef struct hook {
  uint64_t id;
  any_fn fn;
  void *user;
} hook;

typedef struct hook_list {
  hook *items;
  size_t n, cap;
} hook_list;

struct grove_hooks {
  hook_list lists[HK_KINDS];
};

atomic_long grove__forward_hook_count;
static atomic_uint_fast64_t next_hook_id = 1;
static hook_list global_fwd_pre, global_fwd;

static grove_status hook_list_add(hook_list *l, any_fn fn, void *user, bool prepend,
                                  uint64_t *id, grove_err *err) {
  if (!fn) return grove_err_set(err, GROVE_E_INVALID_ARGUMENT, "hook function is NULL");
  if (l->n == l->cap) {
    size_t cap = l->cap ? l->cap * 2 : 4;
    hook *items = realloc(l->items, cap * sizeof *items);
    if (!items) return grove_err_set(err, GROVE_E_NOMEM, "out of memory registering a hook");
    l->items = items;
    l->cap = cap;
  }
  hook h = {atomic_fetch_add(&next_hook_id, 1), fn, user};
  if (prepend) {
    memmove(&l->items[1], &l->items[0], l->n * sizeof(hook));
    l->items[0] = h;
  } else {
    l->items[l->n] = h;
  }
  l->n++;
  if (id) *id = h.id;
  return GROVE_OK;
}

static bool hook_list_remove(hook_list *l, uint64_t id) {
  for (size_t i = 0; i < l->n; i++) {
    if (l->items[i].id == id) {
      memmove(&l->items[i], &l->items[i + 1], (l->n - i - 1) * sizeof(hook));
      l->n--;
      return true;
    }
  }
  return false;
}

static grove_status module_hook_add(grove_module *m, int kind, any_fn fn, void *user,
                                    bool prepend, uint64_t *id, grove_err *err) {
  if (m->inlined && (kind == HK_FWD_PRE || kind == HK_FWD))
    return grove_err_set(err, GROVE_E_UNSUPPORTED,
                         "a %s whose forward the exporter traced into its caller's graph has no "
                         "forward of its own to hook; hook the modules it calls",
                         m->type && m->type->name ? m->type->name : "module");
  if (!m->hooks) {
    m->hooks = calloc(1, sizeof *m->hooks);
    if (!m->hooks) return grove_err_set(err, GROVE_E_NOMEM, "out of memory registering a hook");
  }
  grove_status s = hook_list_add(&m->hooks->lists[kind], fn, user, prepend, id, err);
  if (s == GROVE_OK && (kind == HK_FWD_PRE || kind == HK_FWD))
    atomic_fetch_add(&grove__forward_hook_count, 1);
  return s;
}

static const hook_list *module_hooks(const grove_module *m, int kind) {
  return m->hooks ? &m->hooks->lists[kind] : NULL;
}

grove_status grove_module_register_forward_pre_hook(grove_module *m, grove_forward_pre_hook_fn fn,
                                                    void *user, bool prepend, uint64_t *id) {
  return module_hook_add(m, HK_FWD_PRE, (any_fn)fn, user, prepend, id, NULL);
}
grove_status grove_module_register_forward_hook(grove_module *m, grove_forward_hook_fn fn,
                                                void *user, bool prepend, uint64_t *id) {
  return module_hook_add(m, HK_FWD, (any_fn)fn, user, prepend, id, NULL);
}
grove_status grove_module_register_state_dict_pre_hook(grove_module *m,
                                                       grove_state_dict_pre_hook_fn fn, void *user,
                                                       uint64_t *id) {
  return module_hook_add(m, HK_SD_PRE, (any_fn)fn, user, false, id, NULL);
}
grove_status grove_module_register_state_dict_hook(grove_module *m, grove_state_dict_hook_fn fn,
                                                   void *user, uint64_t *id) {
  return module_hook_add(m, HK_SD_POST, (any_fn)fn, user, false, id, NULL);
}
grove_status grove_module_register_load_state_dict_pre_hook(grove_module *m,
                                                            grove_load_pre_hook_fn fn, void *user,
                                                            uint64_t *id) {
  return module_hook_add(m, HK_LOAD_PRE, (any_fn)fn, user, false, id, NULL);
}
grove_status grove_module_register_load_state_dict_post_hook(grove_module *m,
                                                             grove_load_post_hook_fn fn,
                                                             void *user, uint64_t *id) {
  return module_hook_add(m, HK_LOAD_POST, (any_fn)fn, user, false, id, NULL);
}

bool grove_module_remove_hook(grove_module *m, uint64_t id) {
  if (!m->hooks) return false;
  for (int k = 0; k < HK_KINDS; k++) {
    if (hook_list_remove(&m->hooks->lists[k], id)) {
      if (k == HK_FWD_PRE || k == HK_FWD) atomic_fetch_sub(&grove__forward_hook_count, 1);
      return true;
    }
  }
  return false;
}

grove_status grove_register_global_forward_pre_hook(grove_forward_pre_hook_fn fn, void *user,
                                                    uint64_t *id) {
  grove_status s = hook_list_add(&global_fwd_pre, (any_fn)fn, user, false, id, NULL);
  if (s == GROVE_OK) atomic_fetch_add(&grove__forward_hook_count, 1);
  return s;
}

grove_status grove_register_global_forward_hook(grove_forward_hook_fn fn, void *user,
                                                uint64_t *id) {
  grove_status s = hook_list_add(&global_fwd, (any_fn)fn, user, false, id, NULL);
  if (s == GROVE_OK) atomic_fetch_add(&grove__forward_hook_count, 1);
  return s;
}

bool grove_remove_global_hook(uint64_t id) {
  bool removed = hook_list_remove(&global_fwd_pre, id) || hook_list_remove(&global_fwd, id);
  if (removed) atomic_fetch_sub(&grove__forward_hook_count, 1);
  /* The lists' arrays are kept for reuse; free them once empty so that a
   * program that removes all its hooks leaks nothing. */
  if (global_fwd_pre.n == 0) {
    free(global_fwd_pre.items);
    global_fwd_pre = (hook_list){0};
  }
  if (global_fwd.n == 0) {
    free(global_fwd.items);
    global_fwd = (hook_list){0};
  }
  return removed;
}

static void free_hooks(grove_module *m) {
  if (!m->hooks) return;
  long fwd = (long)(m->hooks->lists[HK_FWD_PRE].n + m->hooks->lists[HK_FWD].n);
  if (fwd) atomic_fetch_sub(&grove__forward_hook_count, fwd);
  for (int k = 0; k < HK_KINDS; k++) free(m->hooks->lists[k].items);
  free(m->hooks);
  m->hooks = NULL;
}

/* ============================================================== lifecycle */

grove_module *grove_module_new(const grove_module_type *type, void *impl, grove_err *err) {
  grove_module *m = calloc(1, sizeof *m);
  if (!m) {
    if (type && type->free_impl)
      type->free_impl(impl);
    else
      free(impl);
    grove_err_set(err, GROVE_E_NOMEM, "out of memory creating a module");
    return NULL;
  }
  m->type = type;
  m->impl = impl;
  m->training = true;
  m->refcount = 1;
  return m;
}

void grove_module_retain(grove_module *m) { __atomic_fetch_add(&m->refcount, 1, __ATOMIC_RELAXED); }

void grove_module_release(grove_module *m) {
  if (!m) return;
  if (__atomic_fetch_sub(&m->refcount, 1, __ATOMIC_ACQ_REL) != 1) return;
  for (size_t i = 0; i < m->nparams; i++) {
    free(m->params[i].name);
    grove_tensor_release(m->params[i].tensor);
  }
  for (size_t i = 0; i < m->nbuffers; i++) {
    free(m->buffers[i].name);
    grove_tensor_release(m->buffers[i].tensor);
  }
  for (size_t i = 0; i < m->nchildren; i++) {
    free(m->children[i].name);
    grove_module_release(m->children[i].module);
  }
  free(m->params);
  free(m->buffers);
  free(m->children);
  json_decref(m->child_index);
  free_hooks(m);
  if (m->type && m->type->free_impl)
    m->type->free_impl(m->impl);
  else
    free(m->impl);
  free(m);
}

/* ============================================================== registration */

/* Attributes every torch.nn.Module has, so `hasattr(self, name)` is true and
 * torch refuses to register a member under them. */
static const char *const reserved_names[] = {
    "training", "forward", "state_dict", "load_state_dict", "parameters", "buffers",
    "children", "modules", "named_parameters", "named_buffers", "named_children",
    "named_modules", "train", "eval", "apply", "register_buffer", "register_parameter",
    "add_module", "to", "cpu", "cuda", "type", "float", "double", "half", "zero_grad",
};

static bool is_reserved(const char *name) {
  for (size_t i = 0; i < sizeof reserved_names / sizeof reserved_names[0]; i++)
    if (strcmp(name, reserved_names[i]) == 0) return true;
  return false;
}

static long slot_index(const grove_slot *slots, size_t n, const char *name) {
  for (size_t i = 0; i < n; i++)
    if (strcmp(slots[i].name, name) == 0) return (long)i;
  return -1;
}

/* Children at which the name index (m->child_index, a jansson object: its
 * hash table) is built; below, a scan is cheaper. */
#define CHILD_INDEX_FROM 16

static long child_index(const grove_module *m, const char *name) {
  if (m->child_index) {
    const json_t *i = json_object_get(m->child_index, name);
    return i ? (long)json_integer_value(i) : -1;
  }
  for (size_t i = 0; i < m->nchildren; i++)
    if (strcmp(m->children[i].name, name) == 0) return (long)i;
  return -1;
}

/* Records child i in the index, building it when the module grows past
 * CHILD_INDEX_FROM.  Out of memory only drops the index (lookups scan). */
static void index_child(grove_module *m, size_t i) {
  if (!m->child_index && m->nchildren < CHILD_INDEX_FROM) return;
  bool fresh = !m->child_index;
  if (fresh && !(m->child_index = json_object())) return;
  for (size_t k = fresh ? 0 : i; k <= i; k++) {
    if (json_object_set_new_nocheck(m->child_index, m->children[k].name,
                                    json_integer((json_int_t)k))) {
      json_decref(m->child_index);
      m->child_index = NULL;
      return;
    }
  }
}

enum { KIND_PARAM, KIND_BUFFER, KIND_MODULE };

/* torch's checks, in torch's order, with torch's KeyError texts. */
static grove_status check_name(const grove_module *m, const char *name, int kind, grove_err *err) {
  static const char *const what[] = {"parameter", "buffer", "module"};
  if (!name) return grove_err_set(err, GROVE_E_KEY, "%s name should be a string. Got NULL", what[kind]);
  if (strchr(name, '.')) {
    if (kind == KIND_MODULE)
      return grove_err_set(err, GROVE_E_KEY, "module name can't contain \".\", got: %s", name);
    return grove_err_set(err, GROVE_E_KEY, "%s name can't contain \".\"", what[kind]);
  }
  if (!*name) return grove_err_set(err, GROVE_E_KEY, "%s name can't be empty string \"\"", what[kind]);
  bool taken = is_reserved(name) ||
               (kind != KIND_PARAM && slot_index(m->params, m->nparams, name) >= 0) ||
               (kind != KIND_BUFFER && slot_index(m->buffers, m->nbuffers, name) >= 0) ||
               (kind != KIND_MODULE && child_index(m, name) >= 0);
  if (taken) return grove_err_set(err, GROVE_E_KEY, "attribute '%s' already exists", name);
  return GROVE_OK;
}

static grove_status slot_put(grove_slot **slots, size_t *n, size_t *cap, const char *name,
                             grove_tensor *t, bool persistent, grove_err *err) {
  long at = slot_index(*slots, *n, name);
  if (at >= 0) {
    if (t) grove_tensor_retain(t);
    grove_tensor_release((*slots)[at].tensor);
    (*slots)[at].tensor = t;
    (*slots)[at].persistent = persistent;
    return GROVE_OK;
  }
  if (*n == *cap) {
    size_t c = *cap ? *cap * 2 : 4;
    grove_slot *s = realloc(*slots, c * sizeof *s);
    if (!s) return grove_err_set(err, GROVE_E_NOMEM, "out of memory registering '%s'", name);
    *slots = s;
    *cap = c;
  }
  char *nm = grove__strdup(name);
  if (!nm) return grove_err_set(err, GROVE_E_NOMEM, "out of memory registering '%s'", name);
  if (t) grove_tensor_retain(t);
  (*slots)[(*n)++] = (grove_slot){nm, t, persistent};
  return GROVE_OK;
}

grove_status grove_module_register_parameter(grove_module *m, const char *name, grove_tensor *t,
                                             grove_err *err) {
  grove_status s = check_name(m, name, KIND_PARAM, err);
  if (s) return s;
  return slot_put(&m->params, &m->nparams, &m->params_cap, name, t, true, err);
}

grove_status grove_module_register_buffer(grove_module *m, const char *name, grove_tensor *t,
                                          bool persistent, grove_err *err) {
  grove_status s = check_name(m, name, KIND_BUFFER, err);
  if (s) return s;
  return slot_put(&m->buffers, &m->nbuffers, &m->buffers_cap, name, t, persistent, err);
}

grove_status grove_module_add_module(grove_module *m, const char *name, grove_module *child,
                                     grove_err *err) {
  grove_status s = check_name(m, name, KIND_MODULE, err);
  if (s) return s;
  long at = child_index(m, name);
  if (at >= 0) {
    if (child) grove_module_retain(child);
    grove_module_release(m->children[at].module);
    m->children[at].module = child;
    return GROVE_OK;
  }
  if (m->nchildren == m->children_cap) {
    size_t c = m->children_cap ? m->children_cap * 2 : 4;
    grove_child *ch = realloc(m->children, c * sizeof *ch);
    if (!ch) return grove_err_set(err, GROVE_E_NOMEM, "out of memory adding module '%s'", name);
    m->children = ch;
    m->children_cap = c;
  }
  char *nm = grove__strdup(name);
  if (!nm) return grove_err_set(err, GROVE_E_NOMEM, "out of memory adding module '%s'", name);
  if (child) grove_module_retain(child);
  m->children[m->nchildren++] = (grove_child){nm, child};
  index_child(m, m->nchildren - 1);
  return GROVE_OK;
}

grove_tensor *grove_module_param(const grove_module *m, const char *name) {
  long at = slot_index(m->params, m->nparams, name);
  return at < 0 ? NULL : m->params[at].tensor;
}

grove_tensor *grove_module_buffer(const grove_module *m, const char *name) {
  long at = slot_index(m->buffers, m->nbuffers, name);
  return at < 0 ? NULL : m->buffers[at].tensor;
}

grove_module *grove_module_child(const grove_module *m, const char *name) {
  long at = child_index(m, name);
  return at < 0 ? NULL : m->children[at].module;
}

grove_module *grove_module_find(const grove_module *m, const char *path) {
  char part[256];
  const char *p = path;
  while (m && *p) {
    const char *dot = strchr(p, '.');
    size_t len = dot ? (size_t)(dot - p) : strlen(p);
    if (len >= sizeof part) return NULL;
    memcpy(part, p, len);
    part[len] = '\0';
    m = grove_module_child(m, part);
    p += len + (dot ? 1 : 0);
  }
  return (grove_module *)m;
}

/* ============================================================== traversal */

/* prefix + ("." if prefix else "") + name, malloc'd. */
static char *join_name(const char *prefix, const char *name) {
  size_t a = prefix ? strlen(prefix) : 0, b = strlen(name);
  char *s = malloc(a + b + 2);
  if (!s) return NULL;
  if (a) {
    memcpy(s, prefix, a);
    s[a++] = '.';
  }
  memcpy(s + a, name, b + 1);
  return s;
}

static grove_status push_module(grove_named_modules *l, char *name, grove_module *m,
                                grove_err *err) {
  if (!name) return grove_err_set(err, GROVE_E_NOMEM, "out of memory");
  if (l->n == l->cap) {
    size_t c = l->cap ? l->cap * 2 : 16;
    grove_named_module *it = realloc(l->items, c * sizeof *it);
    if (!it) {
      free(name);
      return grove_err_set(err, GROVE_E_NOMEM, "out of memory");
    }
    l->items = it;
    l->cap = c;
  }
  l->items[l->n++] = (grove_named_module){name, m};
  return GROVE_OK;
}

static grove_status push_tensor(grove_named_tensors *l, char *name, grove_tensor *t,
                                grove_err *err) {
  if (!name) return grove_err_set(err, GROVE_E_NOMEM, "out of memory");
  if (l->n == l->cap) {
    size_t c = l->cap ? l->cap * 2 : 16;
    grove_named_tensor *it = realloc(l->items, c * sizeof *it);
    if (!it) {
      free(name);
      return grove_err_set(err, GROVE_E_NOMEM, "out of memory");
    }
    l->items = it;
    l->cap = c;
  }
  l->items[l->n++] = (grove_named_tensor){name, t};
  return GROVE_OK;
}

void grove_named_tensors_fini(grove_named_tensors *l) {
  for (size_t i = 0; i < l->n; i++) free(l->items[i].name);
  free(l->items);
  memset(l, 0, sizeof *l);
}

void grove_named_modules_fini(grove_named_modules *l) {
  for (size_t i = 0; i < l->n; i++) free(l->items[i].name);
  free(l->items);
  memset(l, 0, sizeof *l);
}

/* torch's named_modules(memo, prefix, remove_duplicate): pre-order. */
static grove_status named_modules_rec(const grove_module *m, const char *prefix,
                                      grove__pmap *memo, bool dedup, grove_named_modules *out,
                                      grove_err *err) {
  if (dedup) {
    int r = grove__pmap_add(memo, m, NULL);
    if (r < 0) return grove_err_set(err, GROVE_E_NOMEM, "out of memory");
    if (r == 0) return GROVE_OK;
  }
  grove_status s = push_module(out, grove__strdup(prefix), (grove_module *)m, err);
  if (s) return s;
  for (size_t i = 0; i < m->nchildren; i++) {
    const grove_module *c = m->children[i].module;
    if (!c) continue;
    char *sub = join_name(prefix, m->children[i].name);
    if (!sub) return grove_err_set(err, GROVE_E_NOMEM, "out of memory");
    s = named_modules_rec(c, sub, memo, dedup, out, err);
    free(sub);
    if (s) return s;
  }
  return GROVE_OK;
}

grove_status grove_module_named_modules(const grove_module *m, const char *prefix,
                                        bool remove_duplicate, grove_named_modules *out,
                                        grove_err *err) {
  grove__pmap memo = {0}; /* a set (base.h), as torch's memo */
  grove_status s = named_modules_rec(m, prefix ? prefix : "", &memo, remove_duplicate, out, err);
  grove__pmap_fini(&memo);
  if (s) grove_named_modules_fini(out);
  return s;
}

grove_status grove_module_named_children(const grove_module *m, grove_named_modules *out,
                                         grove_err *err) {
  grove__pmap memo = {0};
  grove_status s = GROVE_OK;
  for (size_t i = 0; i < m->nchildren && !s; i++) {
    grove_module *c = m->children[i].module;
    if (!c) continue;
    int r = grove__pmap_add(&memo, c, NULL);
    if (r < 0) s = grove_err_set(err, GROVE_E_NOMEM, "out of memory");
    if (r > 0) s = push_module(out, grove__strdup(m->children[i].name), c, err);
  }
  grove__pmap_fini(&memo);
  if (s) grove_named_modules_fini(out);
  return s;
}

/* torch's _named_members: over named_modules (or just m), each module's
 * members in order, None skipped, a tensor seen before skipped when
 * remove_duplicate. */
static grove_status named_members(const grove_module *m, const char *prefix, bool recurse,
                                  bool dedup, bool buffers, grove_named_tensors *out,
                                  grove_err *err) {
  grove_named_modules mods = {0};
  grove_status s;
  if (recurse) {
    s = grove_module_named_modules(m, prefix, dedup, &mods, err);
  } else {
    s = push_module(&mods, grove__strdup(prefix ? prefix : ""), (grove_module *)m, err);
  }
  if (s) return s;
  grove__pmap memo = {0};
  for (size_t i = 0; i < mods.n && !s; i++) {
    const grove_module *mm = mods.items[i].module;
    const grove_slot *slots = buffers ? mm->buffers : mm->params;
    size_t n = buffers ? mm->nbuffers : mm->nparams;
    for (size_t j = 0; j < n && !s; j++) {
      grove_tensor *t = slots[j].tensor;
      if (!t) continue;
      if (dedup) { /* without de-duplication torch's memo stays empty */
        int r = grove__pmap_add(&memo, t, NULL);
        if (r < 0) {
          s = grove_err_set(err, GROVE_E_NOMEM, "out of memory");
          break;
        }
        if (r == 0) continue;
      }
      s = push_tensor(out, join_name(mods.items[i].name, slots[j].name), t, err);
    }
  }
  grove__pmap_fini(&memo);
  grove_named_modules_fini(&mods);
  if (s) grove_named_tensors_fini(out);
  return s;
}

grove_status grove_module_named_parameters(const grove_module *m, const char *prefix, bool recurse,
                                           bool remove_duplicate, grove_named_tensors *out,
                                           grove_err *err) {
  return named_members(m, prefix, recurse, remove_duplicate, false, out, err);
}

grove_status grove_module_named_buffers(const grove_module *m, const char *prefix, bool recurse,
                                        bool remove_duplicate, grove_named_tensors *out,
                                        grove_err *err) {
  return named_members(m, prefix, recurse, remove_duplicate, true, out, err);
}

void grove_module_apply(grove_module *m, void (*fn)(grove_module *m, void *user), void *user) {
  /* children() yields each direct child once; deeper repeats are visited
   * again, as in torch. */
  for (size_t i = 0; i < m->nchildren; i++) {
    grove_module *c = m->children[i].module;
    if (!c) continue;
    bool seen = false;
    for (size_t j = 0; j < i && !seen; j++) seen = m->children[j].module == c;
    if (!seen) grove_module_apply(c, fn, user);
  }
  fn(m, user);
}

static void set_training(grove_module *m, void *user) { m->training = *(bool *)user; }

void grove_module_train(grove_module *m, bool mode) { grove_module_apply(m, set_training, &mode); }
void grove_module_eval(grove_module *m) { grove_module_train(m, false); }

int64_t grove_module_param_count(const grove_module *m) {
  grove_named_tensors l = {0};
  if (grove_module_named_parameters(m, "", true, true, &l, NULL)) return -1;
  int64_t n = 0;
  for (size_t i = 0; i < l.n; i++) n += grove_tensor_numel(l.items[i].tensor);
  grove_named_tensors_fini(&l);
  return n;
}

/* ============================================================== state_dict */

static grove_status state_dict_rec(const grove_module *m, const char *prefix,
                                   grove_state_dict *dest, grove_err *err) {
  /* _metadata key is the prefix without its trailing dot. */
  size_t plen = strlen(prefix);
  char *meta_key = malloc(plen + 1);
  if (!meta_key) return grove_err_set(err, GROVE_E_NOMEM, "out of memory");
  memcpy(meta_key, prefix, plen + 1);
  if (plen) meta_key[plen - 1] = '\0';
  grove_status s = grove_sd_set_version(dest, meta_key, m->type->version ? m->type->version : 1, err);
  free(meta_key);
  if (s) return s;

  const hook_list *pre = module_hooks(m, HK_SD_PRE);
  for (size_t i = 0; pre && i < pre->n; i++)
    ((grove_state_dict_pre_hook_fn)pre->items[i].fn)(pre->items[i].user, m, prefix);

  char key[4096];
  for (size_t i = 0; i < m->nparams; i++) {
    if (!m->params[i].tensor) continue;
    snprintf(key, sizeof key, "%s%s", prefix, m->params[i].name);
    if ((s = grove_sd_set(dest, key, m->params[i].tensor, err))) return s;
  }
  for (size_t i = 0; i < m->nbuffers; i++) {
    if (!m->buffers[i].tensor || !m->buffers[i].persistent) continue;
    snprintf(key, sizeof key, "%s%s", prefix, m->buffers[i].name);
    if ((s = grove_sd_set(dest, key, m->buffers[i].tensor, err))) return s;
  }
  for (size_t i = 0; i < m->nchildren; i++) {
    if (!m->children[i].module) continue;
    snprintf(key, sizeof key, "%s%s.", prefix, m->children[i].name);
    if ((s = state_dict_rec(m->children[i].module, key, dest, err))) return s;
  }
  const hook_list *post = module_hooks(m, HK_SD_POST);
  for (size_t i = 0; post && i < post->n; i++) {
    s = ((grove_state_dict_hook_fn)post->items[i].fn)(post->items[i].user, m, dest, prefix, err);
    if (s) return s;
  }
  return GROVE_OK;
}

grove_status grove_module_state_dict(const grove_module *m, const char *prefix,
                                     grove_state_dict *dest, grove_err *err) {
  return state_dict_rec(m, prefix ? prefix : "", dest, err);
}

/* ============================================================== load_state_dict */

typedef struct strlist {
  char **items;
  size_t n, cap;
} strlist;

static grove_status strlist_push(strlist *l, char *s, grove_err *err) {
  if (!s) return grove_err_set(err, GROVE_E_NOMEM, "out of memory");
  if (l->n == l->cap) {
    size_t c = l->cap ? l->cap * 2 : 8;
    char **it = realloc(l->items, c * sizeof *it);
    if (!it) {
      free(s);
      return grove_err_set(err, GROVE_E_NOMEM, "out of memory");
    }
    l->items = it;
    l->cap = c;
  }
  l->items[l->n++] = s;
  return GROVE_OK;
}

static void strlist_fini(strlist *l) {
  for (size_t i = 0; i < l->n; i++) free(l->items[i]);
  free(l->items);
  memset(l, 0, sizeof *l);
}

/* torch prints shapes as torch.Size([3, 4]). */
static char *torch_size(const grove_tensor *t, char *buf, size_t n) {
  char inner[256];
  grove_shape_str(t->ndim, t->shape, inner, sizeof inner);
  snprintf(buf, n, "torch.Size(%s)", inner);
  return buf;
}

/* A copy to make once everything has been checked. */
typedef struct planned {
  grove_slot *slot;  /* the module's slot (stable: nothing registers meanwhile) */
  grove_tensor *src; /* borrowed from the working state_dict */
} planned;

typedef struct load_ctx {
  grove_state_dict *sd; /* private shallow copy */
  const grove_load_opts *opts;
  grove_load_report *rep; /* lists live here while loading */
  strlist missing, unexpected, errors;
  planned *plan;
  size_t nplan, plancap;
  grove_err *err;
} load_ctx;

static void sync_report(load_ctx *c) {
  c->rep->missing = c->missing.items;
  c->rep->n_missing = c->missing.n;
  c->rep->unexpected = c->unexpected.items;
  c->rep->n_unexpected = c->unexpected.n;
  c->rep->errors = c->errors.items;
  c->rep->n_errors = c->errors.n;
}

/* A post-hook may have removed entries through grove_load_report_remove. */
static void unsync_report(load_ctx *c) {
  c->missing.n = c->rep->n_missing;
  c->unexpected.n = c->rep->n_unexpected;
}

static grove_status plan_copy(load_ctx *c, grove_slot *slot, grove_tensor *src) {
  if (c->nplan == c->plancap) {
    size_t cap = c->plancap ? c->plancap * 2 : 32;
    planned *p = realloc(c->plan, cap * sizeof *p);
    if (!p) return grove_err_set(c->err, GROVE_E_NOMEM, "out of memory");
    c->plan = p;
    c->plancap = cap;
  }
  c->plan[c->nplan++] = (planned){slot, src};
  return GROVE_OK;
}

/* torch's _load_from_state_dict for one slot. */
static grove_status check_slot(load_ctx *c, const char *prefix, grove_slot *slot) {
  char key[4096];
  snprintf(key, sizeof key, "%s%s", prefix, slot->name);
  grove_tensor *src = grove_sd_get(c->sd, key);
  if (!src) return strlist_push(&c->missing, grove__strdup(key), c->err);
  grove_tensor *dst = slot->tensor;
  if (!grove_tensor_same_shape(src, dst)) {
    char a[300], b[300];
    return strlist_push(&c->errors,
                        grove__asprintf("size mismatch for %s: copying a param with shape %s from "
                                  "checkpoint, the shape in current model is %s.",
                                  key, torch_size(src, a, sizeof a), torch_size(dst, b, sizeof b)),
                        c->err);
  }
  if (grove_dtype_is_float(src->dtype) && !grove_dtype_is_float(dst->dtype)) {
    char a[300], b[300];
    return strlist_push(&c->errors,
                        grove__asprintf("While copying the parameter named \"%s\", whose dimensions in "
                                  "the model are %s and whose dimensions in the checkpoint are %s, "
                                  "an exception occurred : ('cannot convert %s to %s').",
                                  key, torch_size(dst, a, sizeof a), torch_size(src, b, sizeof b),
                                  grove_dtype_name(src->dtype), grove_dtype_name(dst->dtype)),
                        c->err);
  }
  return plan_copy(c, slot, src);
}

static bool local_name(const grove_module *m, const char *name, size_t len) {
  for (size_t i = 0; i < m->nparams; i++)
    if (m->params[i].tensor && strlen(m->params[i].name) == len &&
        memcmp(m->params[i].name, name, len) == 0)
      return true;
  for (size_t i = 0; i < m->nbuffers; i++)
    if (m->buffers[i].tensor && m->buffers[i].persistent && strlen(m->buffers[i].name) == len &&
        memcmp(m->buffers[i].name, name, len) == 0)
      return true;
  for (size_t i = 0; i < m->nchildren; i++) /* torch checks _modules, None included */
    if (strlen(m->children[i].name) == len && memcmp(m->children[i].name, name, len) == 0)
      return true;
  return false;
}

static grove_status load_rec(load_ctx *c, grove_module *m, const char *prefix) {
  grove_status s;
  size_t plen = strlen(prefix);
  int version = -1;
  {
    char meta_key[4096];
    snprintf(meta_key, sizeof meta_key, "%.*s", plen ? (int)plen - 1 : 0, prefix);
    int v;
    if (grove_sd_get_version(c->sd, meta_key, &v)) version = v;
  }
  const hook_list *pre = module_hooks(m, HK_LOAD_PRE);
  for (size_t i = 0; pre && i < pre->n; i++) {
    s = ((grove_load_pre_hook_fn)pre->items[i].fn)(pre->items[i].user, m, c->sd, prefix,
                                                    c->opts->strict, c->err);
    if (s) return s;
  }
  if (m->type->load_fixup && (s = m->type->load_fixup(m, c->sd, prefix, version, c->err)))
    return s;

  for (size_t i = 0; i < m->nparams; i++)
    if (m->params[i].tensor && (s = check_slot(c, prefix, &m->params[i]))) return s;
  for (size_t i = 0; i < m->nbuffers; i++)
    if (m->buffers[i].tensor && m->buffers[i].persistent &&
        (s = check_slot(c, prefix, &m->buffers[i])))
      return s;
  size_t n = grove_sd_count(c->sd);
  for (size_t i = 0; i < n; i++) {
    const char *key = grove_sd_key(c->sd, i);
    if (strncmp(key, prefix, plen) != 0) continue;
    const char *rest = key + plen;
    const char *dot = strchr(rest, '.');
    size_t len = dot ? (size_t)(dot - rest) : strlen(rest);
    if (!local_name(m, rest, len) && (s = strlist_push(&c->unexpected, grove__strdup(key), c->err)))
      return s;
  }
  for (size_t i = 0; i < m->nchildren; i++) {
    if (!m->children[i].module) continue;
    char *sub = grove__asprintf("%s%s.", prefix, m->children[i].name);
    if (!sub) return grove_err_set(c->err, GROVE_E_NOMEM, "out of memory");
    s = load_rec(c, m->children[i].module, sub);
    free(sub);
    if (s) return s;
  }
  const hook_list *post = module_hooks(m, HK_LOAD_POST);
  for (size_t i = 0; post && i < post->n; i++) {
    sync_report(c);
    ((grove_load_post_hook_fn)post->items[i].fn)(post->items[i].user, m, c->rep);
    unsync_report(c);
  }
  return GROVE_OK;
}

bool grove_load_report_remove(grove_load_report *r, int which, const char *name) {
  char **items = which ? r->unexpected : r->missing;
  size_t *n = which ? &r->n_unexpected : &r->n_missing;
  for (size_t i = 0; i < *n; i++) {
    if (strcmp(items[i], name) == 0) {
      free(items[i]);
      memmove(&items[i], &items[i + 1], (*n - i - 1) * sizeof(char *));
      (*n)--;
      return true;
    }
  }
  return false;
}

void grove_load_report_fini(grove_load_report *r) {
  if (!r) return;
  for (size_t i = 0; i < r->n_missing; i++) free(r->missing[i]);
  for (size_t i = 0; i < r->n_unexpected; i++) free(r->unexpected[i]);
  for (size_t i = 0; i < r->n_errors; i++) free(r->errors[i]);
  free(r->missing);
  free(r->unexpected);
  free(r->errors);
  free(r->message);
  memset(r, 0, sizeof *r);
}

/* '"a", "b"' as torch joins key lists. */
static char *quoted_list(const strlist *l) {
  size_t len = 1;
  for (size_t i = 0; i < l->n; i++) len += strlen(l->items[i]) + 4;
  char *s = malloc(len), *p = s;
  if (!s) return NULL;
  for (size_t i = 0; i < l->n; i++) p += sprintf(p, "%s\"%s\"", i ? ", " : "", l->items[i]);
  *p = '\0';
  return s;
}

/* torch's RuntimeError text: "Error(s) in loading state_dict for T:\n\t" then
 * missing, unexpected (when strict) and the other errors, tab-separated. */
static char *build_message(const grove_module *m, load_ctx *c) {
  strlist parts = {0};
  if (c->opts->strict && c->missing.n) {
    char *q = quoted_list(&c->missing);
    strlist_push(&parts, q ? grove__asprintf("Missing key(s) in state_dict: %s. ", q) : NULL, NULL);
    free(q);
  }
  if (c->opts->strict && c->unexpected.n) {
    char *q = quoted_list(&c->unexpected);
    strlist_push(&parts, q ? grove__asprintf("Unexpected key(s) in state_dict: %s. ", q) : NULL, NULL);
    free(q);
  }
  for (size_t i = 0; i < c->errors.n; i++) strlist_push(&parts, grove__strdup(c->errors.items[i]), NULL);
  if (!parts.n) return NULL;
  size_t len = strlen(m->type->name) + 64;
  for (size_t i = 0; i < parts.n; i++) len += strlen(parts.items[i]) + 2;
  char *msg = malloc(len);
  if (msg) {
    char *p = msg + sprintf(msg, "Error(s) in loading state_dict for %s:", m->type->name);
    for (size_t i = 0; i < parts.n; i++) p += sprintf(p, "\n\t%s", parts.items[i]);
  }
  strlist_fini(&parts);
  return msg;
}

/* Children before their parents (a parent's refresh may read what a
 * child derived).  only_pending: just the modules whose constructor deferred
 * their refresh. */
static grove_status refresh_tree(grove_module *root, bool only_pending, grove_err *err) {
  grove_named_modules mods = {0};
  grove_status s = grove_module_named_modules(root, "", true, &mods, err);
  for (size_t i = mods.n; s == GROVE_OK && i-- > 0;) {
    grove_module *mm = mods.items[i].module;
    if (only_pending && !mm->refresh_pending) continue;
    if (mm->type->refresh) s = mm->type->refresh(mm, err);
    if (!s) mm->refresh_pending = false;
  }
  grove_named_modules_fini(&mods);
  return s;
}

static grove_status refresh_all(grove_module *root, grove_err *err) {
  return refresh_tree(root, false, err);
}

/* The deferral of constructors' refresh (module_internal.h). */
static _Thread_local int refresh_defer_depth;

void grove__refresh_defer_begin(void) {
  refresh_defer_depth++;
}

void grove__refresh_defer_end(void) {
  assert(refresh_defer_depth > 0);
  refresh_defer_depth--;
}

grove_status grove__refresh_new(grove_module *m, grove_err *err) {
  if (refresh_defer_depth > 0) {
    m->refresh_pending = true;
    return GROVE_OK;
  }
  return m->type->refresh ? m->type->refresh(m, err) : GROVE_OK;
}

grove_status grove__refresh_pending(grove_module *root, grove_err *err) {
  return refresh_tree(root, true, err);
}

grove_status grove_module_load_state_dict(grove_module *m, const grove_state_dict *sd,
                                          const grove_load_opts *opts, grove_load_report *report,
                                          grove_err *err) {
  static const grove_load_opts defaults = {.strict = true, .assign = false};
  if (!opts) opts = &defaults;
  grove_load_report local_rep = {0};
  load_ctx c = {.opts = opts, .rep = report ? report : &local_rep, .err = err};
  grove_load_report_fini(c.rep);
  grove_status s = GROVE_OK;

  /* Hooks and fixups may edit the map: they get a shallow copy. */
  c.sd = grove_sd_new();
  if (!c.sd) {
    s = grove_err_set(err, GROVE_E_NOMEM, "out of memory");
    goto out;
  }
  for (size_t i = 0; i < grove_sd_count(sd) && !s; i++)
    s = grove_sd_set(c.sd, grove_sd_key(sd, i), grove_sd_tensor(sd, i), err);
  for (size_t i = 0; i < grove_sd_meta_count(sd) && !s; i++)
    s = grove_sd_set_version(c.sd, grove_sd_meta_prefix(sd, i), grove_sd_meta_version(sd, i), err);
  if (!s) s = load_rec(&c, m, "");
  if (s) goto out;

  char *msg = build_message(m, &c);
  if (msg) {
    grove_err_set(err, GROVE_E_STATE_DICT, "%s", msg);
    c.rep->message = msg;
    s = GROVE_E_STATE_DICT;
    goto out;
  }
  /* Everything fits: only now is the module touched. */
  for (size_t i = 0; i < c.nplan; i++) {
    grove_slot *slot = c.plan[i].slot;
    grove_tensor *src = c.plan[i].src;
    if (opts->assign && src->dtype == slot->tensor->dtype && grove_tensor_is_contiguous(src)) {
      grove_tensor_retain(src);
      grove_tensor_release(slot->tensor);
      slot->tensor = src;
    } else if ((s = grove_tensor_copy(slot->tensor, src, err))) {
      grove_err_prefix(err, "%s", slot->name);
      goto out; /* integer out of range: checked values cannot otherwise fail */
    }
  }
  s = refresh_all(m, err);
out:
  sync_report(&c);
  c.missing = c.unexpected = c.errors = (strlist){0}; /* now owned by the report */
  grove_load_report_fini(&local_rep);
  free(c.plan);
  grove_sd_free(c.sd);
  return s;
}

/* ============================================================== forward */

grove_status grove_fwd_alloc(grove_fwd *f, grove_tensor *out, grove_dtype dt, int ndim,
                             const int64_t *shape) {
  int64_t n = 1;
  for (int i = 0; i < ndim; i++) n *= shape[i];
  void *p = grove_arena_alloc(f->arena, (size_t)n * grove_dtype_size(dt));
  if (!p) return grove_err_set(f->err, GROVE_E_NOMEM, "out of scratch memory");
  grove_tensor_init(out, dt, ndim, shape, p);
  return GROVE_OK;
}

static grove_status not_callable(const grove_module *m, grove_fwd *f) {
  return grove_err_set(f->err, GROVE_E_NOT_CALLABLE,
                       "%s is not callable: it holds modules but has no forward", m->type->name);
}

/* torch's _call_impl slow path: global pre-hooks, the module's pre-hooks,
 * forward, global hooks, the module's hooks. */
static grove_status forward_with_hooks(const grove_module *m, grove_fwd *f, const grove_values *in,
                                       grove_values *out) {
  grove_values args = *in;
  grove_status s;
  /* The observer (module.h) sees what the module's forward gets and what
   * its caller finally gets: after the pre-hooks, after the hooks. */
  const grove_observer *obs = f->observer;
  long watched = obs ? grove_observer_find(obs, m) : -1;
  const hook_list *pre[2] = {&global_fwd_pre, module_hooks(m, HK_FWD_PRE)};
  const hook_list *post[2] = {&global_fwd, module_hooks(m, HK_FWD)};
  /* Hooks and the observer see contiguous tensors, as before layers
   * handed each other channels-last ones. */
  const bool hooked = watched >= 0 || global_fwd_pre.n || global_fwd.n || (pre[1] && pre[1]->n) ||
                      (post[1] && post[1]->n);
  if (hooked) {
    if ((s = grove__plain_values(f, &args))) return s;
    f->channels_last_ok = false;
  }
  for (int k = 0; k < 2; k++)
    for (size_t i = 0; pre[k] && i < pre[k]->n; i++)
      if ((s = ((grove_forward_pre_hook_fn)pre[k]->items[i].fn)(pre[k]->items[i].user, m, f,
                                                                 &args)))
        return s;
  if (watched >= 0 && (obs->kinds[watched] & GROVE_OBSERVE_PRE))
    obs->fn(obs->ctx, (size_t)watched, GROVE_OBSERVE_PRE, m, &args);
  if ((s = m->type->forward(m, f, &args, out))) return s;
  if (hooked && (s = grove__plain_values(f, out))) return s;
  for (int k = 0; k < 2; k++)
    for (size_t i = 0; post[k] && i < post[k]->n; i++)
      if ((s = ((grove_forward_hook_fn)post[k]->items[i].fn)(post[k]->items[i].user, m, f, &args,
                                                              out)))
        return s;
  if (watched >= 0 && (obs->kinds[watched] & GROVE_OBSERVE_POST))
    obs->fn(obs->ctx, (size_t)watched, GROVE_OBSERVE_POST, m, out);
  return GROVE_OK;
}

grove_status grove_module_forward(const grove_module *m, grove_fwd *f, const grove_values *in,
                                  grove_values *out) {
  if (!m->type->forward) return not_callable(m, f);
  grove__yield_point(); /* a background build's trial forward (core/base/yield.c) */
  /* A channels-last result goes back only to a caller that allows it; the
   * flag is the caller's again afterwards, whatever the calls inside set. */
  const bool channels_last = f->channels_last_ok;
  grove_status s = grove__no_forward_hooks() && !f->observer ? m->type->forward(m, f, in, out)
                                                             : forward_with_hooks(m, f, in, out);
  if (!s && !channels_last) s = grove__plain_values(f, out);
  f->channels_last_ok = channels_last;
  return s;
}

grove_status grove_module_call(const grove_module *m, grove_fwd *f, const grove_tensor *x,
                               grove_tensor *y) {
  grove_values in = {.n = 1}, out = {0};
  in.v[0] = *x;
  const bool channels_last = f->channels_last_ok;
  f->channels_last_ok = false; /* y is contiguous, as module.h says */
  grove_status s = grove_module_forward(m, f, &in, &out);
  f->channels_last_ok = channels_last;
  if (s) return s;
  if (out.n < 1) return grove_err_set(f->err, GROVE_E_INTERNAL, "%s returned nothing", m->type->name);
  *y = out.v[0];
  return GROVE_OK;
}

/* ------------------------------------------------------------ forward helpers
 * (every layer file, the graph ops and the trees above use them: a contiguous
 * view of an input, the one-input check, the float32 copy of a parameter) */

const char *grove_module_type_name(const grove_module *m) {
  return m && m->type ? m->type->name : NULL;
}

grove_status grove__fwd_contig(grove_fwd *f, const grove_tensor *t, grove_tensor *out) {
  if (grove_tensor_is_contiguous(t)) {
    *out = *t;
    return GROVE_OK;
  }
  grove_status s = grove_fwd_alloc(f, out, t->dtype, t->ndim, t->shape);
  if (s != GROVE_OK) return s;
  if (t->dtype == GROVE_F32 && grove__is_nhwc(t)) {
    /* Channels last (a convolution's result): a transpose per image. */
    const int64_t C = t->shape[1], HW = t->shape[2] * t->shape[3];
    for (int64_t i = 0; i < t->shape[0]; i++)
      grove__transpose_f32((const float *)t->data + i * HW * C, (float *)out->data + i * C * HW, HW,
                           C);
    return GROVE_OK;
  }
  return grove_tensor_copy(out, t, f->err);
}

grove_status grove__plain_values(grove_fwd *f, grove_values *v) {
  for (int k = 0; k < v->n; k++) {
    if (!grove__is_nhwc(&v->v[k])) continue;
    grove_tensor c;
    grove_status s = grove__fwd_contig(f, &v->v[k], &c);
    if (s) return s;
    v->v[k] = c;
  }
  return GROVE_OK;
}

grove_status grove__layer_input(const char *layer, grove_fwd *f, const grove_values *in,
                                grove_dtype dt, grove_tensor *x) {
  if (in->n != 1)
    return grove_err_set(f->err, GROVE_E_INVALID_ARGUMENT, "%s: expected 1 input tensor, got %d",
                         layer, in->n);
  const grove_tensor *t = &in->v[0];
  if (dt != GROVE_DTYPE_COUNT && t->dtype != dt)
    return grove_err_set(f->err, GROVE_E_DTYPE, "%s: expected a %s input, got %s", layer,
                         grove_dtype_name(dt), grove_dtype_name(t->dtype));
  return grove__fwd_contig(f, t, x);
}

grove_status grove__copy_f32(float *dst, int64_t n, const grove_tensor *src, const char *layer,
                             const char *what, grove_err *err) {
  if (!src) return grove_err_set(err, GROVE_E_INVALID_ARGUMENT, "%s: %s is None", layer, what);
  if (grove_tensor_numel(src) != n) {
    char got[128];
    grove_shape_str(src->ndim, src->shape, got, sizeof got);
    return grove_err_set(err, GROVE_E_SHAPE, "%s: %s has shape %s, expected %lld elements", layer,
                         what, got, (long long)n);
  }
  if (n == 0) return GROVE_OK;
  if (src->dtype == GROVE_F32 && grove_tensor_is_contiguous(src)) {
    memcpy(dst, src->data, (size_t)n * sizeof(float));
    return GROVE_OK;
  }
  grove_tensor d;
  grove_tensor_init(&d, GROVE_F32, src->ndim, src->shape, dst);
  return grove_tensor_copy(&d, src, err);
}

grove_status grove__layer_make(const grove_module_type *type, void *impl, grove_module **out,
                               grove_err *err) {
  grove_module *m = grove_module_new(type, impl, err);
  if (!m) return err && err->code != GROVE_OK ? err->code : GROVE_E_NOMEM;
  *out = m;
  return GROVE_OK;
}

grove_status grove__layer_param(grove_module *m, const char *name, bool buffer, int ndim,
                                const int64_t *shape, grove_dtype dt, float fill, grove_err *err) {
  grove_tensor *t = grove_tensor_new(dt, ndim, shape, err);
  if (!t) return err && err->code != GROVE_OK ? err->code : GROVE_E_NOMEM;
  if (fill != 0.0f) {
    float *d = t->data;
    for (int64_t i = 0, n = grove_tensor_numel(t); i < n; i++) d[i] = fill;
  }
  grove_status s = buffer ? grove_module_register_buffer(m, name, t, true, err)
                          : grove_module_register_parameter(m, name, t, err);
  grove_tensor_release(t);
  return s;
}

grove_status grove__shape_error(grove_fwd *f, const char *layer, const char *want,
                                const grove_tensor *x) {
  char got[128];
  grove_shape_str(x->ndim, x->shape, got, sizeof got);
  return grove_err_set(f->err, GROVE_E_SHAPE, "%s: expected %s, got input of shape %s", layer, want,
                       got);
}

grove_status grove__scratch_error(grove_fwd *f, const char *layer) {
  return grove_err_set(f->err, GROVE_E_NOMEM, "%s: scratch arena is exhausted", layer);
}
