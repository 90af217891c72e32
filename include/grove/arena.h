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

#ifdef __cplusplus
}
#endif
#endif
