/* arena.c: the forward scratch allocator (see arena.h).
 *
 * One main block serves every pass that fits.  A pass that does not fit
 * takes overflow chunks from the heap; reset() then frees them and replaces
 * the main block with one of the high-water size.  So the heap is touched
 * only while a model warms up or meets a larger input than ever before. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define ALIGN 64

typedef struct chunk {
  struct chunk *next;
  size_t size;
  /* data follows, aligned */
} chunk;

struct grove_arena {
  unsigned char *block; /* main block, ALIGN-aligned */
  size_t capacity;
  size_t used;          /* in the main block */
  chunk *overflow;      /* chunks taken in this pass */
  size_t pass_bytes;    /* bytes handed out in this pass (block + chunks) */
  size_t high_water;
  size_t grow_count;
};

static size_t round_up(size_t n) { return (n + ALIGN - 1) & ~(size_t)(ALIGN - 1); }

grove_arena *grove_arena_new(size_t capacity) {
  grove_arena *a = calloc(1, sizeof *a);
  if (!a) return NULL;
  capacity = round_up(capacity);
  if (capacity) {
    a->block = aligned_alloc(ALIGN, capacity);
    if (!a->block) {
      free(a);
      return NULL;
    }
  }
  a->capacity = capacity;
  return a;
}

static void free_overflow(grove_arena *a) {
  chunk *c = a->overflow;
  while (c) {
    chunk *next = c->next;
    free(c);
    c = next;
  }
  a->overflow = NULL;
}

void grove_arena_free(grove_arena *a) {
  if (!a) return;
  free_overflow(a);
  free(a->block);
  free(a);
}

void *grove_arena_alloc(grove_arena *a, size_t nbytes) {
  size_t n = round_up(nbytes ? nbytes : 1);
  if (n < nbytes) return NULL; /* overflow */
  a->pass_bytes += n;
  if (a->pass_bytes > a->high_water) a->high_water = a->pass_bytes;
  if (a->capacity - a->used >= n) {
    void *p = a->block + a->used;
    a->used += n;
    return p;
  }
  /* Does not fit: a chunk of its own.  The header is padded to ALIGN so the
   * data stays aligned. */
  size_t hdr = round_up(sizeof(chunk));
  chunk *c = aligned_alloc(ALIGN, hdr + n);
  if (!c) return NULL;
  c->size = n;
  c->next = a->overflow;
  a->overflow = c;
  a->grow_count++;
  return (unsigned char *)c + hdr;
}

void grove_arena_reset(grove_arena *a) {
  if (a->overflow) {
    free_overflow(a);
    size_t want = round_up(a->high_water);
    unsigned char *b = aligned_alloc(ALIGN, want);
    if (b) {
      free(a->block);
      a->block = b;
      a->capacity = want;
    } /* else keep the old block: the next pass grows again, still correct */
  }
  a->used = 0;
  a->pass_bytes = 0;
}

size_t grove_arena_capacity(const grove_arena *a) { return a->capacity; }
size_t grove_arena_high_water(const grove_arena *a) { return a->high_water; }
size_t grove_arena_grow_count(const grove_arena *a) { return a->grow_count; }
