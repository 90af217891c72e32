/* state_dict.h: an ordered map from dotted key to heap tensor, like the
 * OrderedDict torch's state_dict() returns, plus per-module metadata
 * (torch's `_metadata`: the module's version, keyed by module prefix).
 *
 * The map owns one reference to each tensor it holds.  Keys keep insertion
 * order; lookups are hashed.  Not thread-safe: one thread at a time. */
#ifndef GROVE_STATE_DICT_H
#define GROVE_STATE_DICT_H

#include <stdbool.h>
#include <stddef.h>

#include "grove/status.h"
#include "grove/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct grove_state_dict grove_state_dict;

/* A new empty map; NULL when out of memory.  Caller owns it. */
grove_state_dict *grove_sd_new(void);
/* Frees the map and drops its tensor references.  NULL is a no-op. */
void grove_sd_free(grove_state_dict *sd);

/* Inserts key -> t, retaining t.  An existing key keeps its position and
 * has its tensor replaced (like assigning into an OrderedDict).  key is
 * copied. */
grove_status grove_sd_set(grove_state_dict *sd, const char *key, grove_tensor *t, grove_err *err);
/* Like grove_sd_set, but an existing key is GROVE_E_DUPLICATE_KEY (readers
 * use this: a file that names a key twice is refused). */
grove_status grove_sd_add(grove_state_dict *sd, const char *key, grove_tensor *t, grove_err *err);
/* Borrowed pointer, or NULL when key is absent. */
grove_tensor *grove_sd_get(const grove_state_dict *sd, const char *key);
bool grove_sd_contains(const grove_state_dict *sd, const char *key);
/* Removes key (dropping its reference); returns false when absent.  Keeps
 * the order of the others. */
bool grove_sd_remove(grove_state_dict *sd, const char *key);

size_t grove_sd_count(const grove_state_dict *sd);
/* i-th key / tensor in order, 0 <= i < count.  Borrowed. */
const char *grove_sd_key(const grove_state_dict *sd, size_t i);
grove_tensor *grove_sd_tensor(const grove_state_dict *sd, size_t i);
/* Total bytes of the tensors' elements (a tensor held twice counts twice). */
size_t grove_sd_nbytes(const grove_state_dict *sd);

/* Module metadata, torch's state_dict._metadata[prefix]["version"].  prefix
 * is the module path without the trailing dot ("" for the root).  A map read
 * from a safetensors file has none. */
grove_status grove_sd_set_version(grove_state_dict *sd, const char *prefix, int version, grove_err *err);
/* Returns true and sets *version when the prefix has metadata. */
bool grove_sd_get_version(const grove_state_dict *sd, const char *prefix, int *version);
size_t grove_sd_meta_count(const grove_state_dict *sd);
const char *grove_sd_meta_prefix(const grove_state_dict *sd, size_t i);
int grove_sd_meta_version(const grove_state_dict *sd, size_t i);

#ifdef __cplusplus
}
#endif
#endif
