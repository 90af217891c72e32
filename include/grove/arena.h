/* arena.h: scratch memory for forward passes.
 *
 * A bump allocator that is reset after each forward.  It starts with one
 * block; when a pass needs more it takes extra chunks from the heap, and the
 * next reset replaces everything with one block of the high-water size, so
 * that from then on a pass of that size allocates nothing.  A model sizes a
 * worker's arena when it is loaded by running one forward at its largest batch
 * (grove_model_open), so the hot path never allocates.
 *
 * One arena belongs to one thread at a time. */
#ifndef GROVE_ARENA_H
#define GROVE_ARENA_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct grove_arena grove_arena;

/* A new arena with one block of capacity bytes (0 is allowed).  Caller owns
 * it.  NULL when out of memory. */
grove_arena *grove_arena_new(size_t capacity);
/* NULL is a no-op. */
void grove_arena_free(grove_arena *a);
/* nbytes of 64-byte aligned scratch, valid until the next reset.  NULL only
 * when the heap is exhausted. */
void *grove_arena_alloc(grove_arena *a, size_t nbytes);
/* Forgets every allocation.  If the pass had to grow, consolidates into one
 * block of the high-water size (this is the only allocation it does). */
void grove_arena_reset(grove_arena *a);
/* Bytes in the main block; the most used by any pass since creation; how
 * many times a pass had to take memory from the heap. */
size_t grove_arena_capacity(const grove_arena *a);
size_t grove_arena_high_water(const grove_arena *a);
size_t grove_arena_grow_count(const grove_arena *a);

/* A position in the current pass, for grove_arena_rewind.  The fields are
 * the arena's own; callers only keep and pass the value. */
typedef struct grove_arena_mark {
  size_t used;       /* main block bytes in use */
  size_t pass_bytes; /* bytes handed out in the pass */
  void *overflow;    /* the newest overflow chunk */
} grove_arena_mark;

/* The current position.  Valid until the next reset. */
grove_arena_mark grove_arena_mark_get(const grove_arena *a);
/* Forgets every allocation made after m (a stack pop): the next alloc hands
 * out the memory above m again, and the high-water count only sees what is
 * live, so a pass that rewinds needs less scratch.  The bytes of the
 * forgotten allocations stay readable, unchanged, until an alloc hands them
 * out again; so a caller may keep one forgotten block by rewinding,
 * allocating its new place and memmove-ing it down (the new place never lies
 * above the old one in the same block).  Never touches the heap: overflow
 * chunks of forgotten allocations are kept until the next reset.  m must come
 * from this pass, and allocations made before m are untouched. */
void grove_arena_rewind(grove_arena *a, grove_arena_mark m);

#ifdef __cplusplus
}
#endif
#endif
