/* ptrmap.c: a map from pointers to pointers (open addressing, linear
 * probing), for the training replica's module -> settings and tensor ->
 * index tables.  Split out of train.c: a leaf container that uses nothing
 * of the rest.  Not thread-safe: one owner. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base.h"

static size_t phash(const void *p, size_t cap) {
  uintptr_t x = (uintptr_t)p;
  x ^= x >> 17;
  x *= 0xed5ad4bbu;
  x ^= x >> 11;
  return x & (cap - 1);
}

bool grove__pmap_put(grove__pmap *m, const void *k, void *v) {
  if ((m->n + 1) * 2 > m->cap) {
    size_t cap = m->cap ? m->cap * 2 : 64;
    const void **keys = calloc(cap, sizeof *keys);
    void **vals = calloc(cap, sizeof *vals);
    if (!keys || !vals) {
      free(keys);
      free(vals);
      return false;
    }
    for (size_t i = 0; i < m->cap; i++) {
      if (!m->keys[i]) continue;
      size_t j = phash(m->keys[i], cap);
      while (keys[j]) j = (j + 1) & (cap - 1);
      keys[j] = m->keys[i];
      vals[j] = m->vals[i];
    }
    free(m->keys);
    free(m->vals);
    m->keys = keys;
    m->vals = vals;
    m->cap = cap;
  }
  size_t j = phash(k, m->cap);
  while (m->keys[j] && m->keys[j] != k) j = (j + 1) & (m->cap - 1);
  if (!m->keys[j]) m->n++;
  m->keys[j] = k;
  m->vals[j] = v;
  return true;
}

void *grove__pmap_get(const grove__pmap *m, const void *k, bool *found) {
  if (found) *found = false;
  if (!m->cap) return NULL;
  size_t j = phash(k, m->cap);
  while (m->keys[j]) {
    if (m->keys[j] == k) {
      if (found) *found = true;
      return m->vals[j];
    }
    j = (j + 1) & (m->cap - 1);
  }
  return NULL;
}

void grove__pmap_fini(grove__pmap *m) {
  free(m->keys);
  free(m->vals);
  memset(m, 0, sizeof *m);
}
