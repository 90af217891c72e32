/* base.h: the non-public helpers of core/base/, the bottom layer of
 * libgrove (grove__ prefix): logging, yield points, strings, UTF-8,
 * instruction-set regions, the pointer map, secrets.  Each layer above has
 * its own internal header that includes this one (tensor_internal.h,
 * kernels.h, fileio.h, module_internal.h, ...; docs/architecture.md).  Never
 * installed; client/ must not include it.  Tests, bench/, fuzz/ and
 * server/admin.c (grove__secret_equal) include core/internal.h, which
 * gathers all of them. */
#ifndef GROVE_CORE_BASE_H
#define GROVE_CORE_BASE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "grove/grove.h"

/* ------------------------------------------------------------ logging */

/* Formats and hands one event to the installed log callback; does nothing
 * (not even format) when none is installed.  Any thread. */
void grove__log(grove_log_level level, const char *id, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* ------------------------------------------------------------ yield points
 *
 * A background thread's long loops (grove_thread_yield_every; core/base/yield.c
 * says why) call grove__yield_point() every few tens of microseconds of
 * work; it yields the core once the thread's interval has passed.  On every
 * other thread it is one thread-local load. */
extern _Thread_local int64_t grove__yield_every_ns;
void grove__yield_due(void);
/* CLOCK_MONOTONIC in nanoseconds (yield.c; the compute pool's spins use it
 * too).  Any thread. */
int64_t grove__clock_ns(void);
static inline void grove__yield_point(void) {
  if (__builtin_expect(grove__yield_every_ns != 0, 0)) grove__yield_due();
}

/* ------------------------------------------------------------ helpers */

/* strdup that returns NULL on NULL. */
char *grove__strdup(const char *s);
/* A new malloc'd printf-formatted string; NULL when out of memory. */
char *grove__asprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Overflow-checked a * b; false on overflow. */
static inline bool grove__mul_overflow_u64(uint64_t a, uint64_t b, uint64_t *out) {
  return __builtin_mul_overflow(a, b, out);
}

/* ------------------------------------------------------------ text */

/* Offset of the first byte of s that does not start a valid UTF-8 sequence,
 * or len when all of it is valid.  Strict (no overlong forms, nothing past
 * U+10FFFF); surrogates pass only when allow_surrogates. */
size_t grove__utf8_invalid_at(const uint8_t *s, size_t len, bool allow_surrogates);

/* ------------------------------------------------------------ instruction sets */

/* Code between GROVE__TARGET_PUSH("avx2,fma") and GROVE__TARGET_POP is
 * compiled for those instruction sets (GCC's target pragma, clang's
 * attribute), while the rest of the library keeps the distribution's
 * baseline flags; callers choose such a function only once the CPU is
 * known to have them (__builtin_cpu_supports, grove__cpu_avx512). */
#define GROVE__PRAGMA(...) _Pragma(#__VA_ARGS__)
#if defined(__clang__)
#define GROVE__TARGET_PUSH(T) \
  GROVE__PRAGMA(clang attribute push(__attribute__((target(T))), apply_to = function))
#define GROVE__TARGET_POP GROVE__PRAGMA(clang attribute pop)
#else
#define GROVE__TARGET_PUSH(T) GROVE__PRAGMA(GCC push_options) GROVE__PRAGMA(GCC target(T))
#define GROVE__TARGET_POP GROVE__PRAGMA(GCC pop_options)
#endif

/* ------------------------------------------------------------ hash table */

/* Grove's one hash table (ptrmap.c): open addressing from a key to a value.
 * Keys are pointers compared by identity, or, when the map is made with
 * .strkeys = true, NUL-terminated strings compared by content; a key is never
 * NULL.  The map owns its two arrays only: the caller keeps every key alive
 * (and unchanged) while it is in the map, and owns the values.  Zeroed is an
 * empty pointer map, {.strkeys = true} an empty string map.  The filled slots
 * may be walked: keys[i] != NULL for i < cap (any order).  Every operation
 * costs O(1) on average (the table is at most half full).  One owner: not
 * thread-safe. */
typedef struct grove__pmap {
  const void **keys;
  void **vals;
  size_t cap, n;
  bool strkeys;
} grove__pmap;

/* Sets k's value to v, adding k if absent; false (and m unchanged) when out
 * of memory. */
bool grove__pmap_put(grove__pmap *m, const void *k, void *v);
/* Adds k with value v if absent: 1 when added, 0 when k was there (its value
 * unchanged), -1 when out of memory (m unchanged).  A set is a map whose
 * values are NULL. */
int grove__pmap_add(grove__pmap *m, const void *k, void *v);
/* k's value, or NULL; *found (when not NULL) says whether k is there. */
void *grove__pmap_get(const grove__pmap *m, const void *k, bool *found);
/* Removes k; whether it was there.  Never allocates. */
bool grove__pmap_del(grove__pmap *m, const void *k);
/* Makes room for n entries, so that adding up to n in all never allocates
 * or fails (groved's connection table, filled under a lock); false when out
 * of memory (m unchanged). */
bool grove__pmap_reserve(grove__pmap *m, size_t n);
/* Removes every entry, keeping the arrays. */
void grove__pmap_clear(grove__pmap *m);
/* Frees the arrays and leaves the map empty (of the same kind). */
void grove__pmap_fini(grove__pmap *m);
/* The string hash (64-bit FNV-1a) of the string maps, for anyone else who
 * hashes names.  Any thread. */
uint64_t grove__hash_str(const char *s);

/* ------------------------------------------------------------ secrets */

/* Whether given equals secret, in time that depends on secret_len only
 * (secret.c; groved's admin token).  Any thread. */
bool grove__secret_equal(const void *secret, size_t secret_len, const void *given,
                         size_t given_len);

/* ------------------------------------------------------------ arena plans
 * Hooks for graph_plan.c (per-signature arena plans of a graph forward).
 * The forward's thread, like the arena. */

/* While recording, every allocation's address and rounded size are appended
 * (full set, the rest dropped, when cap is reached). */
typedef struct grove__arena_log {
  void **ptr;
  size_t *size;
  int n, cap;
  bool full;
  bool refuse; /* grove__arena_refuse_plan: keep the plan, marked bad */
} grove__arena_log;
void grove__arena_record(grove_arena *a, grove__arena_log *log); /* NULL: stop */
/* While recording: the forward being recorded must not be planned (a graph
 * nested in it cannot run well placed); a no-op otherwise. */
void grove__arena_refuse_plan(grove_arena *a);
/* The next n allocations are served at base + off[k] when their rounded
 * size is size[k]; unplace says whether exactly those n came, all matching
 * (otherwise the others were served as usual and the caller falls back). */
void grove__arena_place(grove_arena *a, char *base, const size_t *off, const size_t *size, int n);
bool grove__arena_unplace(grove_arena *a);
bool grove__arena_busy(const grove_arena *a); /* recording or placing */
/* Bytes grove__arena_keep moved over the arena's life (tests, bench). */
void grove__arena_count_move(grove_arena *a, size_t bytes);
uint64_t grove__arena_moves(const grove_arena *a);

#endif
