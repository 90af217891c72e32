/* state_dict.c: an insertion-ordered map from key to heap tensor, with an
 * index in Grove's hash table (grove__pmap, base.h) so that lookups stay
 * O(1) on state_dicts of thousands of keys, and per-prefix module versions
 * (torch's _metadata), kept in a second table of the same kind. */
#include <stdlib.h>
#include <string.h>

#include "tensor_internal.h"

/* ============================================================== table */

typedef struct entry {
  char *key;
  grove_tensor *tensor; /* the tensors table */
  int version;          /* the metadata table */
} entry;

/* Entries in insertion order; removal compacts them.  index maps each
 * entry's key (the entry's own copy) to its position + 1. */
typedef struct table {
  entry *items;
  size_t n, cap;
  grove__pmap index; /* a string map (base.h) */
} table;

/* Position of key, or -1. */
static long table_find(const table *t, const char *key) {
  return (long)(uintptr_t)grove__pmap_get(&t->index, key, NULL) - 1;
}

/* Appends a new entry for key (absent: the caller checked); returns it, or
 * NULL when out of memory (the table is unchanged then). */
static entry *table_append(table *t, const char *key) {
  if (t->n == t->cap) {
    size_t cap = t->cap ? t->cap * 2 : 16;
    entry *items = realloc(t->items, cap * sizeof *items);
    if (!items) return NULL;
    t->items = items;
    t->cap = cap;
  }
  char *k = grove__strdup(key);
  if (!k) return NULL;
  if (!grove__pmap_put(&t->index, k, (void *)(uintptr_t)(t->n + 1))) {
    free(k);
    return NULL;
  }
  entry *e = &t->items[t->n++];
  *e = (entry){.key = k};
  return e;
}

static void table_remove_at(table *t, size_t at) {
  grove__pmap_del(&t->index, t->items[at].key);
  free(t->items[at].key);
  grove_tensor_release(t->items[at].tensor);
  memmove(&t->items[at], &t->items[at + 1], (t->n - at - 1) * sizeof(entry));
  t->n--;
  /* Positions after `at` moved down by one: the keys stay where they are in
   * the index (which needs no memory), only their values change. */
  for (size_t i = at; i < t->n; i++)
    grove__pmap_put(&t->index, t->items[i].key, (void *)(uintptr_t)(i + 1));
}

static void table_fini(table *t) {
  for (size_t i = 0; i < t->n; i++) {
    free(t->items[i].key);
    grove_tensor_release(t->items[i].tensor);
  }
  free(t->items);
  grove__pmap_fini(&t->index);
}

/* ============================================================== state_dict */

struct grove_state_dict {
  table tensors;
  table metas;
};

grove_state_dict *grove_sd_new(void) {
  grove_state_dict *sd = calloc(1, sizeof(grove_state_dict));
  if (sd) sd->tensors.index.strkeys = sd->metas.index.strkeys = true;
  return sd;
}

void grove_sd_free(grove_state_dict *sd) {
  if (!sd) return;
  table_fini(&sd->tensors);
  table_fini(&sd->metas);
  free(sd);
}

static grove_status put(grove_state_dict *sd, const char *key, grove_tensor *t, bool replace,
                        grove_err *err) {
  if (!key || !t)
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT, "state_dict: NULL key or tensor");
  long at = table_find(&sd->tensors, key);
  if (at >= 0) {
    if (!replace) return grove_err_set(err, GROVE_E_DUPLICATE_KEY, "duplicate key '%s'", key);
    grove_tensor_retain(t);
    grove_tensor_release(sd->tensors.items[at].tensor);
    sd->tensors.items[at].tensor = t;
    return GROVE_OK;
  }
  entry *e = table_append(&sd->tensors, key);
  if (!e) return grove_err_set(err, GROVE_E_NOMEM, "state_dict: out of memory adding '%s'", key);
  grove_tensor_retain(t);
  e->tensor = t;
  return GROVE_OK;
}

grove_status grove_sd_set(grove_state_dict *sd, const char *key, grove_tensor *t, grove_err *err) {
  return put(sd, key, t, true, err);
}

grove_status grove_sd_add(grove_state_dict *sd, const char *key, grove_tensor *t, grove_err *err) {
  return put(sd, key, t, false, err);
}

grove_tensor *grove_sd_get(const grove_state_dict *sd, const char *key) {
  long at = table_find(&sd->tensors, key);
  return at < 0 ? NULL : sd->tensors.items[at].tensor;
}

bool grove_sd_contains(const grove_state_dict *sd, const char *key) {
  return table_find(&sd->tensors, key) >= 0;
}

bool grove_sd_remove(grove_state_dict *sd, const char *key) {
  long at = table_find(&sd->tensors, key);
  if (at < 0) return false;
  table_remove_at(&sd->tensors, (size_t)at);
  return true;
}

size_t grove_sd_count(const grove_state_dict *sd) { return sd->tensors.n; }
const char *grove_sd_key(const grove_state_dict *sd, size_t i) { return sd->tensors.items[i].key; }
grove_tensor *grove_sd_tensor(const grove_state_dict *sd, size_t i) {
  return sd->tensors.items[i].tensor;
}

size_t grove_sd_nbytes(const grove_state_dict *sd) {
  size_t total = 0;
  for (size_t i = 0; i < sd->tensors.n; i++) total += grove_tensor_nbytes(sd->tensors.items[i].tensor);
  return total;
}

grove_status grove_sd_set_version(grove_state_dict *sd, const char *prefix, int version,
                                  grove_err *err) {
  long at = table_find(&sd->metas, prefix);
  entry *e = at >= 0 ? &sd->metas.items[at] : table_append(&sd->metas, prefix);
  if (!e) return grove_err_set(err, GROVE_E_NOMEM, "state_dict: out of memory");
  e->version = version;
  return GROVE_OK;
}

bool grove_sd_get_version(const grove_state_dict *sd, const char *prefix, int *version) {
  long at = table_find(&sd->metas, prefix);
  if (at < 0) return false;
  *version = sd->metas.items[at].version;
  return true;
}

size_t grove_sd_meta_count(const grove_state_dict *sd) { return sd->metas.n; }
const char *grove_sd_meta_prefix(const grove_state_dict *sd, size_t i) {
  return sd->metas.items[i].key;
}
int grove_sd_meta_version(const grove_state_dict *sd, size_t i) {
  return sd->metas.items[i].version;
}
