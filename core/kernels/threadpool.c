/* threadpool.c: the compute threads (grove__parallel_for) and their setting
 * (grove_set_compute_threads), which the GEMM, the convolutions and the
 * other kernels that cut their work into chunks share.
 *
 * grove_set_compute_threads(n) with n > 1 starts n - 1 helper threads (a
 * small persistent pool).  A run cuts its work into chunks (a GEMM's panels,
 * or for a narrow layer groups of rows; a convolution's transforms and patch
 * rows) that the caller and the helpers claim one at a time, so a helper
 * that is late or whose core was taken never holds the caller up.  Helpers
 * spin for a short while after each job, because the next layer of the same
 * forward follows within microseconds and waking a sleeping thread costs
 * more than a whole batch-1 layer, then sleep on a condition variable.  One
 * run at a time owns a pool; when several worker threads run at once,
 * further pools are started on demand up to cores / n of them (see
 * g_pools), and a run that finds none free computes on its own thread, so
 * concurrent runs are correct and never use more than workers x n threads.
 * Pools are joined at exit (atexit) and when the thread count changes, and
 * dropped in the child of a fork.  Split out of gemm.c: it knows nothing of
 * what its chunks compute. */
#define _GNU_SOURCE /* sched_getaffinity, CPU_COUNT */
#include <assert.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "gemm_internal.h"

/* How long a helper spins for the next job before it sleeps, and how long
 * a caller spins for chunks still in flight before it yields its core.
 * The helper's 50 us cover the gap between one layer and the next of a
 * forward; it was 500 us, which between a server's batches was CPU the loop
 * and the clients needed (docs/performance.md, "An idle worker takes what is
 * queued"). */
#define HELPER_SPIN_NS 50000
#define CALLER_SPIN_NS 20000

/* One grove__parallel_for: chunk c is fn(ctx, c * grain, min(n, (c+1) * grain)). */
typedef struct job {
  void (*fn)(void *ctx, int64_t begin, int64_t end);
  void *ctx;
  int64_t n, grain;
} job;

/* The claim word: generation (32 bits) | hi (16) | lo (16): the chunks
 * nobody has claimed yet are [lo, hi), 0 and the job's count when it is
 * posted.  The caller claims from the front (lo) and the first helper from
 * the back (hi - 1), so that with two threads each takes one end of the
 * range.  Why: the layers of a forward cut their outputs alike (rows of
 * the same images), so each thread then reads mostly what it wrote itself
 * one layer earlier, in its own core's cache, where a single counter dealt
 * the chunks out alternately and half of every input came from the other
 * core.  Threads claim a chunk by a compare-and-swap on the whole word, so
 * a helper that comes late (asleep, or its core taken by another process)
 * can never claim a chunk of a job that has moved on, and the caller never
 * waits for a helper that has not started: it claims what nobody took and
 * waits only for chunks already being computed.  Job fields are read only
 * after a successful claim, and a job ends only when every claimed chunk is
 * done, so they are stable while read. */
#define MAX_CHUNKS 0xFFFF
static inline uint64_t word_make(uint32_t gen, uint32_t total, uint32_t next) {
  return (uint64_t)gen << 32 | (uint64_t)total << 16 | next;
}
static inline uint32_t word_gen(uint64_t w) {
  return (uint32_t)(w >> 32);
}
static inline uint32_t word_hi(uint64_t w) {
  return (uint32_t)(w >> 16) & 0xFFFF;
}
static inline uint32_t word_lo(uint64_t w) {
  return (uint32_t)w & 0xFFFF;
}

typedef struct pool {
  int nhelpers;
  pthread_t *threads;
  atomic_flag busy; /* held by the run that owns the pool */
  _Alignas(64) _Atomic uint64_t work;
  _Alignas(64) atomic_int done;     /* chunks finished in the current job */
  _Alignas(64) atomic_int sleepers; /* helpers waiting on cv */
  atomic_bool stop;
  atomic_int started; /* helpers started, each taking the next index */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  job cur;
} pool;

/* The pools: g_pools[0 .. g_npools) are published and never change until
 * grove_set_compute_threads (or exit, or fork) replaces them all, which
 * must not race with forwards (grove.h).  There is one pool to begin with;
 * when several worker threads run products at once, each run takes a free
 * pool, and a run that finds none starts one more, up to g_pool_cap =
 * cores / threads, so that W workers with T threads each end up with W
 * pools of T - 1 helpers: W x T threads, never more than the cores.  Pools
 * are added under g_cfg_mu (tried, never waited for: a run that cannot get
 * it computes alone). */
#define MAX_POOLS 64
static atomic_int g_threads = 1;
static _Atomic(pool *) g_pools[MAX_POOLS];
static atomic_int g_npools;
static atomic_int g_pool_cap;
static pthread_mutex_t g_cfg_mu = PTHREAD_MUTEX_INITIALIZER;
static bool g_atexit_done, g_atfork_done; /* handlers registered; g_cfg_mu */

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

static void run_chunk(const job *jb, int64_t c) {
  int64_t b = c * jb->grain;
  jb->fn(jb->ctx, b, jb->n - b < jb->grain ? jb->n : b + jb->grain);
}

/* Claims and runs chunks of generation gen until none is left, from the
 * back of the range when back. */
static void claim_chunks(pool *pl, uint32_t gen, bool back) {
  uint64_t w = atomic_load_explicit(&pl->work, memory_order_acquire);
  for (;;) {
    if (word_gen(w) != gen || word_lo(w) >= word_hi(w)) return;
    const uint64_t nw = back ? w - ((uint64_t)1 << 16) : w + 1;
    if (!atomic_compare_exchange_weak_explicit(&pl->work, &w, nw, memory_order_acq_rel,
                                               memory_order_acquire))
      continue; /* w now holds the current word */
    run_chunk(&pl->cur, back ? word_hi(w) - 1 : word_lo(w));
    atomic_fetch_add_explicit(&pl->done, 1, memory_order_release);
    grove__yield_point(); /* a background caller's, between its chunks (core/base/yield.c) */
    w = atomic_load_explicit(&pl->work, memory_order_acquire);
  }
}

static inline uint32_t current_gen(pool *pl) {
  return word_gen(atomic_load_explicit(&pl->work, memory_order_acquire));
}

static void *helper_main(void *arg) {
  pool *pl = arg;
  /* Named, so that top -H and the tests tell the compute helpers from
   * OpenBLAS's threads (which spin on their own after a thread change). */
  pthread_setname_np(pthread_self(), "grove-compute");
  /* The first helper claims from the back (claim word), the others from
   * the front with the caller. */
  const bool back = atomic_fetch_add(&pl->started, 1) == 0;
  uint32_t seen = 0; /* the pool starts at generation 0 with no chunks */
  for (;;) {
    int64_t t0 = grove__clock_ns();
    uint32_t g;
    int spins = 0;
    while ((g = current_gen(pl)) == seen) {
      cpu_relax();
      if (++spins % 256 == 0 && grove__clock_ns() - t0 > HELPER_SPIN_NS) {
        /* Dekker pairing with post_job: we publish sleepers before
         * re-reading work, it publishes work before reading sleepers (all
         * seq_cst), so at least one of us sees the other. */
        pthread_mutex_lock(&pl->mu);
        atomic_fetch_add(&pl->sleepers, 1);
        while (word_gen(atomic_load(&pl->work)) == seen) pthread_cond_wait(&pl->cv, &pl->mu);
        atomic_fetch_sub(&pl->sleepers, 1);
        pthread_mutex_unlock(&pl->mu);
        t0 = grove__clock_ns();
      }
    }
    seen = g;
    if (atomic_load(&pl->stop)) return NULL;
    claim_chunks(pl, g, back);
  }
}

/* Publishes a new generation with `total` chunks (the caller, owning the
 * pool, has filled pl->cur) and wakes sleeping helpers; returns the
 * generation. */
static uint32_t post_job(pool *pl, uint32_t total) {
  uint32_t g = current_gen(pl) + 1;
  atomic_store_explicit(&pl->done, 0, memory_order_relaxed);
  atomic_store(&pl->work, word_make(g, total, 0)); /* seq_cst: see helper_main */
  if (atomic_load(&pl->sleepers) > 0) {
    pthread_mutex_lock(&pl->mu);
    pthread_cond_broadcast(&pl->cv);
    pthread_mutex_unlock(&pl->mu);
  }
  return g;
}

/* Stops and joins every helper, frees the pool.  Takes the busy flag
 * first, so a run still using the pool finishes. */
static void pool_free(pool *pl) {
  if (!pl) return;
  while (atomic_flag_test_and_set_explicit(&pl->busy, memory_order_acquire)) sched_yield();
  atomic_store(&pl->stop, true);
  post_job(pl, 0);
  for (int i = 0; i < pl->nhelpers; i++) pthread_join(pl->threads[i], NULL);
  pthread_cond_destroy(&pl->cv);
  pthread_mutex_destroy(&pl->mu);
  free(pl->threads);
  free(pl);
}

/* A pool with up to nhelpers helpers (fewer when thread creation fails),
 * or NULL when none could start. */
static pool *pool_new(int nhelpers) {
  /* Aligned so that the claim word, the done counter and the sleepers
   * count sit on cache lines of their own. */
  pool *pl = aligned_alloc(_Alignof(pool), sizeof *pl);
  if (!pl) return NULL;
  memset(pl, 0, sizeof *pl);
  pl->threads = calloc((size_t)nhelpers, sizeof *pl->threads);
  if (!pl->threads || pthread_mutex_init(&pl->mu, NULL) != 0) {
    free(pl->threads);
    free(pl);
    return NULL;
  }
  if (pthread_cond_init(&pl->cv, NULL) != 0) {
    pthread_mutex_destroy(&pl->mu);
    free(pl->threads);
    free(pl);
    return NULL;
  }
  atomic_flag_clear(&pl->busy);
  atomic_init(&pl->work, word_make(0, 0, 0));
  atomic_init(&pl->done, 0);
  atomic_init(&pl->sleepers, 0);
  atomic_init(&pl->stop, false);
  atomic_init(&pl->started, 0);
  /* Helpers start with every signal blocked (they inherit the mask), so
   * that a process-directed signal is never handled on a compute thread. */
  sigset_t all, old;
  sigfillset(&all);
  bool masked = pthread_sigmask(SIG_SETMASK, &all, &old) == 0;
  for (int i = 0; i < nhelpers; i++) {
    if (pthread_create(&pl->threads[i], NULL, helper_main, pl) != 0) break;
    pl->nhelpers++;
  }
  if (masked) pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (pl->nhelpers == 0) {
    pool_free(pl);
    return NULL;
  }
  return pl;
}

/* Unpublishes and frees every pool; g_cfg_mu is held. */
static void pools_free_all(void) {
  int n = atomic_exchange(&g_npools, 0);
  for (int i = 0; i < n; i++) pool_free(atomic_exchange(&g_pools[i], NULL));
}

/* fork() copies only the calling thread: in the child the helpers are
 * gone, so the pools are dropped (their memory freed, nothing joined) and
 * runs compute on their own thread until grove_set_compute_threads is
 * called again.  g_cfg_mu is held across fork so that the child never
 * inherits it locked. */
static void fork_prepare(void) {
  pthread_mutex_lock(&g_cfg_mu);
}
static void fork_parent(void) {
  pthread_mutex_unlock(&g_cfg_mu);
}
static void fork_child(void) {
  int n = atomic_exchange(&g_npools, 0);
  for (int i = 0; i < n; i++) {
    pool *pl = atomic_exchange(&g_pools[i], NULL);
    free(pl->threads);
    free(pl);
  }
  atomic_store(&g_threads, 1);
  pthread_mutex_unlock(&g_cfg_mu);
}

static void pools_atexit(void) {
  pthread_mutex_lock(&g_cfg_mu);
  pools_free_all();
  atomic_store(&g_threads, 1);
  pthread_mutex_unlock(&g_cfg_mu);
}

int grove_available_cores(void) {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? (int)n : 1;
}

void grove_set_compute_threads(int n) {
  if (n < 1) n = 1;
  grove__gemm_blas_threads(n);
  pthread_mutex_lock(&g_cfg_mu);
  if (!g_atexit_done) g_atexit_done = atexit(pools_atexit) == 0;
  if (!g_atfork_done) g_atfork_done = pthread_atfork(fork_prepare, fork_parent, fork_child) == 0;
  /* GROVE_GEMM_POOLS overrides the cap (tests use it to grow pools on a
   * small machine). */
  long cores = grove_available_cores();
  long cap = cores > n ? cores / n : 1;
  const char *env = getenv("GROVE_GEMM_POOLS");
  if (env && atol(env) > 0) cap = atol(env);
  atomic_store(&g_pool_cap, (int)(cap < MAX_POOLS ? cap : MAX_POOLS));
  pool *first = atomic_load(&g_pools[0]);
  int have = atomic_load(&g_npools) > 0 ? first->nhelpers + 1 : 1;
  if (have != n || atomic_load(&g_threads) != n) {
    pools_free_all();
    first = n > 1 ? pool_new(n - 1) : NULL;
    if (first) {
      atomic_store(&g_pools[0], first);
      atomic_store(&g_npools, 1);
    }
  }
  int got = first ? first->nhelpers + 1 : 1;
  atomic_store(&g_threads, got);
  pthread_mutex_unlock(&g_cfg_mu);
  if (got < n)
    grove__log(GROVE_LOG_WARN, "gemm.threads", "could start only %d of %d compute threads", got, n);
}

int grove_compute_threads(void) {
  return atomic_load(&g_threads);
}

/* grove_thread_compute_alone's: this thread's runs take no pool. */
static _Thread_local bool t_alone;

void grove_thread_compute_alone(bool alone) {
  t_alone = alone;
}

/* A pool this run now owns (its busy flag set), or NULL: compute alone. */
static pool *pool_acquire(int threads) {
  int n = atomic_load_explicit(&g_npools, memory_order_acquire);
  for (int i = 0; i < n; i++) {
    pool *pl = atomic_load_explicit(&g_pools[i], memory_order_relaxed);
    if (!atomic_flag_test_and_set_explicit(&pl->busy, memory_order_acquire)) return pl;
  }
  if (n >= atomic_load(&g_pool_cap) || pthread_mutex_trylock(&g_cfg_mu) != 0) return NULL;
  /* Once per extra concurrent worker, not per run: starts threads. */
  pool *pl = NULL;
  n = atomic_load(&g_npools);
  if (n > 0 && n < atomic_load(&g_pool_cap) && atomic_load(&g_threads) == threads &&
      (pl = pool_new(threads - 1)) != NULL) {
    atomic_flag_test_and_set(&pl->busy);
    atomic_store_explicit(&g_pools[n], pl, memory_order_relaxed);
    atomic_store_explicit(&g_npools, n + 1, memory_order_release);
  }
  pthread_mutex_unlock(&g_cfg_mu);
  return pl;
}

/* Posts the job the caller has filled into pl->cur as `chunks` chunks,
 * computes what it can claim and returns when every chunk is done. */
static void pool_go(pool *pl, int64_t chunks) {
  assert(chunks >= 1 && chunks <= MAX_CHUNKS);
  uint32_t g = post_job(pl, (uint32_t)chunks);
  claim_chunks(pl, g, false);
  int64_t t0 = 0;
  int spins = 0;
  while (atomic_load_explicit(&pl->done, memory_order_acquire) < chunks) {
    /* Only chunks a helper is computing right now are left.  Should its
     * core have been taken (by another process, or by the hypervisor), give
     * ours up so that it can finish. */
    cpu_relax();
    if (++spins % 256 == 0) {
      if (!t0)
        t0 = grove__clock_ns();
      else if (grove__clock_ns() - t0 > CALLER_SPIN_NS)
        sched_yield();
    }
  }
}

/* ================================================================ parallel for */

void grove__parallel_for(int64_t n, int64_t grain,
                         void (*fn)(void *ctx, int64_t begin, int64_t end), void *ctx) {
  assert(fn);
  if (n <= 0) return;
  if (grain < 1) grain = 1;
  int threads = atomic_load_explicit(&g_threads, memory_order_relaxed);
  if (threads > 1 && n > grain && !t_alone) {
    /* The claim word counts at most MAX_CHUNKS chunks. */
    if ((n + grain - 1) / grain > MAX_CHUNKS) grain = (n + MAX_CHUNKS - 1) / MAX_CHUNKS;
    pool *pl = pool_acquire(threads);
    if (pl) {
      pl->cur = (job){.fn = fn, .ctx = ctx, .n = n, .grain = grain};
      pool_go(pl, (n + grain - 1) / grain);
      atomic_flag_clear_explicit(&pl->busy, memory_order_release);
      return;
    }
  }
  if (grove__yield_every_ns) {
    /* A background thread (core/base/yield.c): the chunks' ends are its yield
     * points, as they would be a pool's hand-offs. */
    for (int64_t b = 0; b < n; b += grain) {
      fn(ctx, b, n - b < grain ? n : b + grain);
      grove__yield_point();
    }
    return;
  }
  fn(ctx, 0, n);
}
