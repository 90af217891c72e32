/* telemetry.h: what the files of groved's forward-hook telemetry share
 * with each other and with tests/check_telemetry.c.  Never installed.
 * server.h declares what the rest of groved calls (grove__telemetry_*);
 * docs/telemetry.md describes the design.
 *
 *   telemetry_stats.c  the statistics of a tensor (pure functions: no
 *                      state, no lock, no allocation)
 *   telemetry.c        the immutable hook tables, the workers'
 *                      accumulators, the publisher thread and the PUB socket
 *   telemetry_rpc.c    the hook registry's RPCs and the hook metrics */
#ifndef GROVE_SERVER_TELEMETRY_H
#define GROVE_SERVER_TELEMETRY_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <nng/nng.h>

#include "grove/grove.h"
#include "server.h"

typedef struct tel_table tel_table;
typedef struct srv_telemetry srv_telemetry;

/* ================================================================ statistics */

/* Moments and counts of a stream of values.  mean and m2 (sum of squared
 * deviations) are over the finite values only, merged with Chan et al.'s
 * pairwise formula so that sums of many batches stay exact to double
 * precision. */
typedef struct tel_basic {
  uint64_t count;  /* every value */
  uint64_t finite; /* values that are neither NaN nor infinite */
  uint64_t zeros, nans, infs;
  double mean, m2, abs_sum, min, max; /* min/max: +inf/-inf while finite == 0 */
} tel_basic;

void grove__tel_basic_init(tel_basic *b);
/* Adds n values. */
void grove__tel_basic_add(tel_basic *b, const float *x, int64_t n);
/* a += b. */
void grove__tel_basic_merge(tel_basic *a, const tel_basic *b);
/* Unbiased standard deviation (torch.std's default); 0 below 2 values. */
double grove__tel_basic_std(const tel_basic *b);

/* Fixed-bin histogram over [lo, hi): counts[nbins], values below lo (and
 * -inf) in *below, values >= hi (and +inf) in *above; NaN is skipped. */
void grove__tel_hist_add(uint64_t *counts, uint32_t nbins, double lo, double hi, uint64_t *below,
                         uint64_t *above, const float *x, int64_t n);

/* Per-column mean and variance of a 2-D tensor [rows, nfeat].  The five
 * arrays hold nfeat doubles each, allocated by the owner; rows counts the
 * rows merged so far.  NaN propagates into its column. */
typedef struct tel_feat {
  int64_t nfeat;
  uint64_t rows;
  double *mean, *m2;   /* the merged result */
  double *s1, *s2, *k; /* scratch of one batch */
} tel_feat;

/* Adds rows x nfeat contiguous values (one call, one batch of rows). */
void grove__tel_feat_add_rows(tel_feat *f, const float *x, int64_t rows);
/* Adds n values of a row-major stream whose first value has flat index
 * flat0 (rows are counted when their last column comes by).  Slower; for
 * tensors that are not contiguous float32. */
void grove__tel_feat_add_stream(tel_feat *f, const float *x, int64_t n, int64_t flat0);
double grove__tel_feat_std(const tel_feat *f, int64_t j);

/* ================================================================ tensors */

/* Calls fn on the elements of t in C order, as float32, in chunks of at
 * most cap values through buf (a contiguous float32 t is passed whole,
 * without copying).  flat0 is the flat index of the chunk's first value.
 * Every dtype is read (integers and bool as their value, f64 rounded). */
void grove__tel_tensor_chunks(const grove_tensor *t, float *buf, size_t cap,
                              void (*fn)(void *ctx, const float *x, int64_t n, int64_t flat0),
                              void *ctx);

/* ================================================================ state
 *
 * What telemetry.c (tables, workers, publisher) and telemetry_rpc.c (the
 * RPCs and metrics) share.  See telemetry.c's header comment for who runs
 * where. */

#define TEL_DEFAULT_PUB "tcp://127.0.0.1:7702" /* main.c's default */
#define TEL_MAX_HOOKS 1024
#define TEL_MAX_EVERY 1000000u
#define TEL_MAX_BINS 1024u
#define TEL_MAX_FEATURES 16384
#define TEL_QUEUE_MAX 4096 /* intervals waiting for the publisher */
#define TEL_SENDBUF 128    /* events NNG queues per subscriber */
#define TEL_CHUNK 1024     /* floats converted at a time (strided, non-f32) */
#define TEL_POLL_NS 200000000LL
#define TEL_SWEEP_NS 5000000000LL
#define TEL_SEQ_BUCKETS 256

/* A hook's counters.  Tables, accumulators and intervals point at them
 * without a reference: they live until grove__telemetry_free. */
typedef struct tel_counters {
  struct tel_counters *next_all;
  _Atomic uint64_t published, dropped;
} tel_counters;

typedef struct tel_spec {
  int kind; /* GROVE_OBSERVE_PRE or GROVE_OBSERVE_POST */
  uint32_t every;
  double sample_rate;
  uint32_t bins;
  double lo, hi;
  bool per_feature;
} tel_spec;

typedef struct tel_hook {
  uint64_t id;
  size_t model; /* index in srv->models */
  char *pattern;
  tel_spec spec;
  tel_counters *ctr;
  /* The last resolution (guarded by tel->mu). */
  char **modules;
  size_t nmodules;
  int64_t version;
} tel_hook;

typedef struct tel_target {
  uint64_t hook_id;
  tel_counters *ctr;
  char *path;
  const grove_module *module;
  tel_spec spec;
} tel_target;

struct tel_table {
  atomic_int refs;
  uint64_t gen; /* unique per table */
  size_t model;
  srv_version *version; /* held: the tree the module pointers point into */
  tel_target *targets;
  size_t ntargets;
  /* The observer's view: unique modules sorted by address, what is watched
   * on each, and their targets (order[first[i] .. first[i] + count[i]]). */
  const grove_module **mods;
  unsigned char *kinds;
  size_t nmods;
  uint32_t *first, *count, *order;
};

/* One (hook, module) accumulator: a worker's running interval, or a
 * finished interval on its way to the publisher (then next, model and
 * worker are set).  Owns path, hist and feat_mem. */
typedef struct tel_acc {
  struct tel_acc *next;
  size_t model;
  uint32_t worker;
  uint64_t hook_id;
  tel_counters *ctr;
  char *path;
  size_t path_cap;
  tel_spec spec;
  int64_t version;
  uint64_t batches, rows, last_seq;
  int64_t start_us, end_us;
  tel_basic b;
  uint64_t *hist;
  size_t hist_cap;
  uint64_t below, above;
  tel_feat feat;
  double *feat_mem; /* 5 x feat_cap doubles: mean, m2, s1, s2, k */
  size_t feat_cap;
  bool feat_off; /* the tensor was not 2-D, or its width changed */
  int ndim;
  int64_t shape[GROVE_MAX_DIMS];
} tel_acc;

/* A worker's accumulators for one model, lined up with one of its tables. */
typedef struct tel_wmodel {
  uint64_t gen; /* the table generation accs line up with; 0: none */
  tel_acc *accs;
  size_t nacc;
  unsigned char *active; /* per target: observed in this batch */
  uint64_t seq;          /* batches of the model this worker ran with a table */
} tel_wmodel;

typedef struct tel_worker {
  uint32_t id;
  tel_wmodel *models; /* one per served model */
  /* During one batch. */
  const tel_table *cur;
  tel_wmodel *wm;
  int64_t rows, version, t0_us;
  grove_observer obs;
  /* Empty intervals taken from the publisher's free list, so that handing
   * over costs one lock per batch, not one per interval. */
  tel_acc *spare;
  size_t nspare;
  float chunk[TEL_CHUNK];
} tel_worker;

typedef struct tel_pipe {
  uint32_t id;
  uint64_t base;    /* events sent before it connected */
  uint64_t counted; /* its drops already counted */
} tel_pipe;

typedef struct tel_seq {
  struct tel_seq *next;
  uint64_t hook_id;
  uint64_t seq;
  char path[];
} tel_seq;

struct srv_telemetry {
  srv_server *srv;
  bool enabled;
  char why_off[256];
  size_t nmodels;

  pthread_mutex_t mu; /* the registry and pending tables */
  tel_hook **hooks;
  size_t nhooks, hooks_cap;
  uint64_t next_id, next_gen;
  tel_counters *all_ctr;
  tel_table **pending;
  bool *has_pending;
  int64_t *pending_num;
  atomic_int *model_hooks; /* hooks per model (written under mu) */
  atomic_bool *dirty;      /* a pending table waits */

  /* Loop thread only. */
  tel_table **current;
  int64_t *current_num; /* the version number current[] was built for; 0 none */

  tel_worker *workers;
  int nworkers;

  pthread_mutex_t q_mu; /* the interval queue and the free list */
  pthread_cond_t q_cv;
  tel_acc *q_head, *q_tail, *free_items;
  size_t q_len, nfree;
  bool stop;
  pthread_t thread;
  bool thread_started;

  nng_socket pub;
  bool pub_open;
  pthread_mutex_t pipe_mu;
  tel_pipe *pipes;
  size_t npipes, pipes_cap;

  _Atomic uint64_t sent; /* events handed to the socket */
  _Atomic uint64_t *published;
  _Atomic uint64_t dropped_queue, dropped_subscriber;
  _Atomic int64_t subscribers;

  /* Publisher thread only. */
  tel_seq *seqs[TEL_SEQ_BUCKETS];
  int64_t last_poll_ns, last_sweep_ns;
  uint64_t polled_sent;
  bool stats_unavailable;
  double *std_buf;
  size_t std_cap;
};

static inline const char *grove__tel_kind_name(int kind) {
  return kind == GROVE_OBSERVE_PRE ? "forward_pre" : "forward";
}

void grove__tel_free_names(char **names, size_t n);
/* Whether a hook of pattern observes nm's module: the pattern matches its
 * name and the module has a forward of its own (one the exporter traced
 * into its caller's graph, "inlined", is never called, so it would never
 * fire).  Any thread; reads the tree only. */
bool grove__tel_observes(const char *pattern, const grove_named_module *nm);

/* Under tel->mu: builds model mi's table from its hooks against v (which
 * updates every hook's resolution) and stages it for the loop to install at
 * the model's next dispatch. */
grove_status grove__tel_stage_table(srv_telemetry *tel, size_t mi, srv_version *v);

#endif
