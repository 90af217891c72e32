/* state_dict.c: an insertion-ordered map from key to heap tensor, with an
 * open-addressing hash index so that lookups stay O(1) on state_dicts of
 * thousands of keys, and per-prefix module versions (torch's _metadata). */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

typedef struct entry {
  char *key;
  grove_tensor *tensor;
  uint64_t hash;
} entry;

typedef struct meta {
  char *prefix;
  int version;
} meta;

struct grove_state_dict {
  entry *items; /* in order; removed entries are compacted away */
  size_t n, cap;
  size_t *index; /* slot -> item position + 1; 0 = empty */
  size_t index_cap; /* power of two, or 0 */
  meta *metas;
  size_t nmeta, metacap;
};

static uint64_t hash_str(const char *s) { /* FNV-1a */
  uint64_t h = 1469598103934665603ull;
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
  return h;
}

grove_state_dict *grove_sd_new(void) { return calloc(1, sizeof(grove_state_dict)); }

void grove_sd_free(grove_state_dict *sd) {
  if (!sd) return;
  for (size_t i = 0; i < sd->n; i++) {
    free(sd->items[i].key);
    grove_tensor_release(sd->items[i].tensor);
  }
  for (size_t i = 0; i < sd->nmeta; i++) free(sd->metas[i].prefix);
  free(sd->items);
  free(sd->index);
  free(sd->metas);
  free(sd);
}

static bool rebuild_index(grove_state_dict *sd, size_t want) {
  size_t cap = 16;
  while (cap < want * 2) cap *= 2;
  size_t *idx = calloc(cap, sizeof *idx);
  if (!idx) return false;
  for (size_t i = 0; i < sd->n; i++) {
    size_t s = sd->items[i].hash & (cap - 1);
    while (idx[s]) s = (s + 1) & (cap - 1);
    idx[s] = i + 1;
  }
  free(sd->index);
  sd->index = idx;
  sd->index_cap = cap;
  return true;
}

/* Position of key in items, or -1. */
static long find(const grove_state_dict *sd, const char *key, uint64_t h) {
  if (!sd->index_cap) return -1;
  size_t s = h & (sd->index_cap - 1);
  while (sd->index[s]) {
    const entry *e = &sd->items[sd->index[s] - 1];
    if (e->hash == h && strcmp(e->key, key) == 0) return (long)(sd->index[s] - 1);
    s = (s + 1) & (sd->index_cap - 1);
  }
  return -1;
}

static grove_status put(grove_state_dict *sd, const char *key, grove_tensor *t, bool replace,
                        grove_err *err) {
  if (!key || !t) return grove_err_set(err, GROVE_E_INVALID_ARGUMENT, "state_dict: NULL key or tensor");
  uint64_t h = hash_str(key);
  long at = find(sd, key, h);
  if (at >= 0) {
    if (!replace)
      return grove_err_set(err, GROVE_E_DUPLICATE_KEY, "duplicate key '%s'", key);
    grove_tensor_retain(t);
    grove_tensor_release(sd->items[at].tensor);
    sd->items[at].tensor = t;
    return GROVE_OK;
  }
  if (sd->n == sd->cap) {
    size_t cap = sd->cap ? sd->cap * 2 : 16;
    entry *items = realloc(sd->items, cap * sizeof *items);
    if (!items) goto oom;
    sd->items = items;
    sd->cap = cap;
  }
  if ((sd->n + 1) * 2 > sd->index_cap && !rebuild_index(sd, sd->n + 1)) goto oom;
  char *k = grove__strdup(key);
  if (!k) goto oom;
  grove_tensor_retain(t);
  sd->items[sd->n] = (entry){k, t, h};
  size_t s = h & (sd->index_cap - 1);
  while (sd->index[s]) s = (s + 1) & (sd->index_cap - 1);
  sd->index[s] = ++sd->n;
  return GROVE_OK;
oom:
  return grove_err_set(err, GROVE_E_NOMEM, "state_dict: out of memory adding '%s'", key);
}

grove_status grove_sd_set(grove_state_dict *sd, const char *key, grove_tensor *t, grove_err *err) {
  return put(sd, key, t, true, err);
}

grove_status grove_sd_add(grove_state_dict *sd, const char *key, grove_tensor *t, grove_err *err) {
  return put(sd, key, t, false, err);
}

grove_tensor *grove_sd_get(const grove_state_dict *sd, const char *key) {
  long at = find(sd, key, hash_str(key));
  return at < 0 ? NULL : sd->items[at].tensor;
}

bool grove_sd_contains(const grove_state_dict *sd, const char *key) {
  return find(sd, key, hash_str(key)) >= 0;
}

bool grove_sd_remove(grove_state_dict *sd, const char *key) {
  long at = find(sd, key, hash_str(key));
  if (at < 0) return false;
  free(sd->items[at].key);
  grove_tensor_release(sd->items[at].tensor);
  memmove(&sd->items[at], &sd->items[at + 1], (sd->n - (size_t)at - 1) * sizeof(entry));
  sd->n--;
  /* Positions after `at` moved: rebuilding at the same size cannot fail
   * for lack of room, but may for memory; then fall back to no index. */
  if (!rebuild_index(sd, sd->n ? sd->n : 1)) {
    free(sd->index);
    sd->index = NULL;
    sd->index_cap = 0;
  }
  return true;
}

size_t grove_sd_count(const grove_state_dict *sd) { return sd->n; }
const char *grove_sd_key(const grove_state_dict *sd, size_t i) { return sd->items[i].key; }
grove_tensor *grove_sd_tensor(const grove_state_dict *sd, size_t i) { return sd->items[i].tensor; }

size_t grove_sd_nbytes(const grove_state_dict *sd) {
  size_t total = 0;
  for (size_t i = 0; i < sd->n; i++) total += grove_tensor_nbytes(sd->items[i].tensor);
  return total;
}

grove_status grove_sd_set_version(grove_state_dict *sd, const char *prefix, int version,
                                  grove_err *err) {
  for (size_t i = 0; i < sd->nmeta; i++) {
    if (strcmp(sd->metas[i].prefix, prefix) == 0) {
      sd->metas[i].version = version;
      return GROVE_OK;
    }
  }
  if (sd->nmeta == sd->metacap) {
    size_t cap = sd->metacap ? sd->metacap * 2 : 8;
    meta *m = realloc(sd->metas, cap * sizeof *m);
    if (!m) return grove_err_set(err, GROVE_E_NOMEM, "state_dict: out of memory");
    sd->metas = m;
    sd->metacap = cap;
  }
  char *p = grove__strdup(prefix);
  if (!p) return grove_err_set(err, GROVE_E_NOMEM, "state_dict: out of memory");
  sd->metas[sd->nmeta++] = (meta){p, version};
  return GROVE_OK;
}

bool grove_sd_get_version(const grove_state_dict *sd, const char *prefix, int *version) {
  for (size_t i = 0; i < sd->nmeta; i++) {
    if (strcmp(sd->metas[i].prefix, prefix) == 0) {
      *version = sd->metas[i].version;
      return true;
    }
  }
  return false;
}

size_t grove_sd_meta_count(const grove_state_dict *sd) { return sd->nmeta; }
const char *grove_sd_meta_prefix(const grove_state_dict *sd, size_t i) { return sd->metas[i].prefix; }
int grove_sd_meta_version(const grove_state_dict *sd, size_t i) { return sd->metas[i].version; }
