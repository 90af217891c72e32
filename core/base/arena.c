/* arena.c: the forward scratch allocator (see arena.h).
 *
 * One main block serves every pass that fits.  A pass that does not fit
 * takes overflow chunks from the heap; reset() then frees them and replaces
 * the main block with one of the high-water size.  So the heap is touched
 * only while a model warms up or meets a larger input than ever before.
 *
 * Marks and rewinds make the pass a stack: rewinding restores the main
 * block's fill and the chunk list head of the mark, and counts the pass's
 * bytes back down, so the high water is the peak of what was live.  Chunks
 * taken after the mark move to a retired list (their bytes must stay readable
 * for a caller that moves a block down) and are freed at the next reset. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base.h"

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
  chunk *overflow;      /* chunks taken in this pass, newest first */
  chunk *retired;       /* chunks forgotten by a rewind, freed at reset */
  size_t pass_bytes;    /* bytes handed out in this pass (block + chunks) */
  size_t high_water;
  size_t grow_count;
  uint64_t moved;        /* bytes grove__arena_keep moved, ever */
  grove__arena_log *log; /* recording: every allocation is appended here */
  /* Placing (grove__arena_place): allocation k of the node is served at
   * place_base + place_off[k] when its size is place_size[k]. */
  char *place_base;
  const size_t *place_off, *place_size;
  int place_n, place_k;
  bool place_miss;
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

static void free_chunks(chunk *c) {
  while (c) {
    chunk *next = c->next;
    free(c);
    c = next;
  }
}

static void free_overflow(grove_arena *a) {
  free_chunks(a->overflow);
  free_chunks(a->retired);
  a->overflow = NULL;
  a->retired = NULL;
}

void grove_arena_free(grove_arena *a) {
  if (!a) return;
  free_overflow(a);
  free(a->block);
  free(a);
}

static void *arena_alloc(grove_arena *a, size_t nbytes) {
  size_t n = round_up(nbytes ? nbytes : 1);
  if (n < nbytes) return NULL; /* overflow */
  if (a->place_base) {
    /* A planned node: its k-th allocation has its slot in the reserved
     * block (already counted in pass_bytes).  Anything else is a miss,
     * served as usual; the caller then falls back. */
    const int k = a->place_k++;
    if (k < a->place_n && a->place_size[k] == n) return a->place_base + a->place_off[k];
    a->place_miss = true;
  }
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

/* The allocation with the recording hook around it (graph_plan.c). */
void *grove_arena_alloc(grove_arena *a, size_t nbytes) {
  void *p = arena_alloc(a, nbytes);
  grove__arena_log *l = a->log;
  if (l && p) {
    if (l->n == l->cap) {
      l->full = true;
      return p;
    }
    l->ptr[l->n] = p;
    l->size[l->n++] = round_up(nbytes ? nbytes : 1);
  }
  return p;
}

void grove_arena_reset(grove_arena *a) {
  if (a->overflow || a->retired) {
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

grove_arena_mark grove_arena_mark_get(const grove_arena *a) {
  return (grove_arena_mark){a->used, a->pass_bytes, a->overflow};
}

void grove_arena_rewind(grove_arena *a, grove_arena_mark m) {
  /* Chunks are pushed on the front: everything before m's head is newer. */
  while (a->overflow && a->overflow != (chunk *)m.overflow) {
    chunk *c = a->overflow;
    a->overflow = c->next;
    c->next = a->retired;
    a->retired = c;
  }
  a->used = m.used;
  a->pass_bytes = m.pass_bytes;
}

/* ------------------------------------------------------------ plans (graph_plan.c) */

void grove__arena_record(grove_arena *a, grove__arena_log *log) {
  a->log = log;
}

void grove__arena_refuse_plan(grove_arena *a) {
  if (a->log) a->log->refuse = true;
}

void grove__arena_place(grove_arena *a, char *base, const size_t *off, const size_t *size, int n) {
  a->place_base = base;
  a->place_off = off;
  a->place_size = size;
  a->place_n = n;
  a->place_k = 0;
  a->place_miss = false;
}

bool grove__arena_unplace(grove_arena *a) {
  const bool ok = !a->place_miss && a->place_k == a->place_n;
  a->place_base = NULL;
  a->place_n = a->place_k = 0;
  a->place_miss = false;
  return ok;
}

bool grove__arena_busy(const grove_arena *a) {
  return a->log || a->place_base;
}

void grove__arena_count_move(grove_arena *a, size_t bytes) {
  a->moved += bytes;
}

uint64_t grove__arena_moves(const grove_arena *a) {
  return a->moved;
}
