/* ptrmap.c: Grove's one hash table (grove__pmap, base.h), and its one string
 * hash.
 *
 * Open addressing with linear probing over a power-of-two array of keys and
 * one of values, at most half full, so that a lookup probes a slot or two.
 * Keys are pointers compared by identity (a Module tree's memo sets, the
 * training replica's module -> settings and tensor -> index, groved's pipe
 * ids), or, in a map made with .strkeys, C strings compared by content (a
 * state_dict's index, a torch checkpoint's storages).  Deletion shifts the
 * entries after the hole back (no tombstones), so a map that is filled and
 * emptied for ever (groved's connections) never degrades.
 *
 * A leaf, as Redis's dict.c is: it includes nothing of the rest of Grove and
 * owns only its two arrays (never the keys or the values).  One owner: not
 * thread-safe. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base.h"

uint64_t grove__hash_str(const char *s) {
  /* FNV-1a, 64 bits.  (state_dict.c's and torch_load.c's copies, which this
   * replaced, had lost the offset basis's last digit.) */
  uint64_t h = 0xcbf29ce484222325ull;
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
  return h;
}

static size_t home(const grove__pmap *m, const void *k, size_t cap) {
  if (m->strkeys) return (size_t)grove__hash_str(k) & (cap - 1);
  uintptr_t x = (uintptr_t)k;
  x ^= x >> 17;
  x *= 0xed5ad4bbu;
  x ^= x >> 11;
  return x & (cap - 1);
}

static bool same(const grove__pmap *m, const void *a, const void *b) {
  return a == b || (m->strkeys && strcmp(a, b) == 0);
}

/* The slot holding k, or the empty slot where it would go. */
static size_t probe(const grove__pmap *m, const void *k) {
  size_t j = home(m, k, m->cap);
  while (m->keys[j] && !same(m, m->keys[j], k)) j = (j + 1) & (m->cap - 1);
  return j;
}

/* Moves every entry into arrays of cap slots; false (and m unchanged) when
 * out of memory. */
static bool rehash(grove__pmap *m, size_t cap) {
  const void **keys = calloc(cap, sizeof *keys);
  void **vals = calloc(cap, sizeof *vals);
  if (!keys || !vals) {
    free(keys);
    free(vals);
    return false;
  }
  for (size_t i = 0; i < m->cap; i++) {
    if (!m->keys[i]) continue;
    size_t j = home(m, m->keys[i], cap);
    while (keys[j]) j = (j + 1) & (cap - 1);
    keys[j] = m->keys[i];
    vals[j] = m->vals[i];
  }
  free(m->keys);
  free(m->vals);
  m->keys = keys;
  m->vals = vals;
  m->cap = cap;
  return true;
}

bool grove__pmap_reserve(grove__pmap *m, size_t n) {
  if (n > SIZE_MAX / 4) return false;
  size_t cap = m->cap ? m->cap : 32;
  while (n * 2 > cap) cap *= 2;
  return cap == m->cap || rehash(m, cap);
}

int grove__pmap_add(grove__pmap *m, const void *k, void *v) {
  /* A key already there never costs an allocation. */
  if (m->cap && m->keys[probe(m, k)]) return 0;
  if ((m->n + 1) * 2 > m->cap && !grove__pmap_reserve(m, m->n + 1)) return -1;
  size_t j = probe(m, k);
  m->keys[j] = k;
  m->vals[j] = v;
  m->n++;
  return 1;
}

bool grove__pmap_put(grove__pmap *m, const void *k, void *v) {
  if (m->cap) {
    size_t j = probe(m, k);
    if (m->keys[j]) {
      m->vals[j] = v;
      return true;
    }
  }
  return grove__pmap_add(m, k, v) >= 0;
}

void *grove__pmap_get(const grove__pmap *m, const void *k, bool *found) {
  if (found) *found = false;
  if (!m->cap) return NULL;
  size_t j = probe(m, k);
  if (!m->keys[j]) return NULL;
  if (found) *found = true;
  return m->vals[j];
}

bool grove__pmap_del(grove__pmap *m, const void *k) {
  if (!m->cap) return false;
  size_t i = probe(m, k);
  if (!m->keys[i]) return false;
  const size_t mask = m->cap - 1;
  m->keys[i] = NULL;
  m->vals[i] = NULL;
  m->n--;
  /* Linear probing's deletion without tombstones: an entry after the hole
   * that would no longer be found from its home slot moves back into it. */
  for (size_t j = (i + 1) & mask; m->keys[j]; j = (j + 1) & mask) {
    size_t h = home(m, m->keys[j], m->cap);
    /* Does h lie cyclically in (i, j]?  Then j stays where it is. */
    bool stays = i <= j ? (h > i && h <= j) : (h > i || h <= j);
    if (stays) continue;
    m->keys[i] = m->keys[j];
    m->vals[i] = m->vals[j];
    m->keys[j] = NULL;
    m->vals[j] = NULL;
    i = j;
  }
  return true;
}

void grove__pmap_clear(grove__pmap *m) {
  if (m->cap) {
    memset(m->keys, 0, m->cap * sizeof *m->keys);
    memset(m->vals, 0, m->cap * sizeof *m->vals);
  }
  m->n = 0;
}

void grove__pmap_fini(grove__pmap *m) {
  free(m->keys);
  free(m->vals);
  bool strkeys = m->strkeys;
  memset(m, 0, sizeof *m);
  m->strkeys = strkeys;
}
