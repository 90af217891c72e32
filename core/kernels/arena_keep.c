/* arena_keep.c: arena compaction (grove__arena_keep): after a graph node or
 * a layer ran, the blocks still live are moved down onto the memory that
 * died, a large move cut between the compute threads.  Split out of
 * graph.c so that the layers that compact (TransformerEncoder) and the graph
 * evaluator share it from below both.  The forward's thread. */
#include <stdint.h>
#include <string.h>

#include "kernels.h"

/* A large copy between two ranges that do not overlap, cut between the
 * compute threads (a node's output moved down onto a dead input at least
 * its size: each chunk's source is read by that chunk only). */
typedef struct copy_par {
  char *dst;
  const char *src;
  size_t bytes;
} copy_par;

#define COPY_GRAIN ((int64_t)256 << 10)

static void copy_chunk(void *ctx, int64_t b, int64_t e) {
  const copy_par *c = ctx;
  const size_t end = (size_t)e * COPY_GRAIN < c->bytes ? (size_t)e * COPY_GRAIN : c->bytes;
  memcpy(c->dst + (size_t)b * COPY_GRAIN, c->src + (size_t)b * COPY_GRAIN,
         end - (size_t)b * COPY_GRAIN);
}

static void move_down(char *dst, const char *src, size_t bytes) {
  if (dst + bytes <= src && bytes >= 4 * (size_t)COPY_GRAIN) {
    copy_par c = {dst, src, bytes};
    grove__parallel_for((int64_t)((bytes + COPY_GRAIN - 1) / COPY_GRAIN), 1, copy_chunk, &c);
    return;
  }
  memmove(dst, src, bytes);
}

grove_status grove__arena_keep(grove_arena *a, grove_arena_mark m, grove__keep *keep, int n,
                               grove_err *err) {
  if (n == 1) {
    /* Rewinding never moves memory and the new place is at or below the old
     * one in the same block (or in another block): memmove is enough. */
    grove_arena_rewind(a, m);
    void *p = grove_arena_alloc(a, keep[0].bytes);
    if (!p) return grove_err_set(err, GROVE_E_NOMEM, "out of scratch memory");
    if (p != keep[0].start) {
      move_down(p, keep[0].start, keep[0].bytes);
      grove__arena_count_move(a, keep[0].bytes);
    }
    keep[0].moved = p;
    keep[0].end = grove_arena_mark_get(a);
    return GROVE_OK;
  }
  if (n == 0) {
    grove_arena_rewind(a, m);
    return GROVE_OK;
  }
  /* Several blocks: stage them above everything first, so that placing one
   * can never overwrite another that is still to be moved. */
  size_t total = 0;
  for (int k = 0; k < n; k++) total += (keep[k].bytes + 63) / 64 * 64;
  char *stage = grove_arena_alloc(a, total);
  if (!stage) return grove_err_set(err, GROVE_E_NOMEM, "out of scratch memory");
  size_t off = 0;
  for (int k = 0; k < n; k++) {
    memcpy(stage + off, keep[k].start, keep[k].bytes);
    off += (keep[k].bytes + 63) / 64 * 64;
  }
  grove_arena_rewind(a, m);
  off = 0;
  for (int k = 0; k < n; k++) {
    void *p = grove_arena_alloc(a, keep[k].bytes);
    if (!p) return grove_err_set(err, GROVE_E_NOMEM, "out of scratch memory");
    memmove(p, stage + off, keep[k].bytes);
    grove__arena_count_move(a, keep[k].bytes);
    off += (keep[k].bytes + 63) / 64 * 64;
    keep[k].moved = p;
    keep[k].end = grove_arena_mark_get(a);
  }
  return GROVE_OK;
}
