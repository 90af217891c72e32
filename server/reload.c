/* reload.c: hot reload.  A model's weights (or its whole directory) are
 * replaced while it serves, with no request dropped and no reply computed
 * from a mix of two versions.
 *
 * Three triggers, one path: the Reload RPC, SIGHUP (every model from its
 * directory) and --watch (a model whose weights file was replaced, after a
 * quiet time).  A reload is a job of the libuv loop:
 *
 *   full (the default)
 *     loop:  the model is marked busy (a second reload of it is refused with
 *            UNAVAILABLE; SIGHUP and --watch instead run once more after it)
 *     pool:  grove_model_open builds a complete new version beside the
 *            serving one: spec, checkpoint (mmap, zero-copy where the format
 *            allows), load_state_dict all or nothing, trial forward
 *     loop:  the model's current-version pointer is swapped under its mutex;
 *            batches already dispatched keep the old version, which is freed
 *            when the last of them drops it; the reply goes out now that the
 *            new version serves.  On failure nothing changed, and the reply
 *            lists the missing keys, unexpected keys and mismatches.
 *
 *   in place (for models too large to hold twice)
 *     pool:  the checkpoint is read and checked against the serving tree,
 *            and converted to its dtypes, while the model still serves
 *     loop:  the model is paused (the batcher forms no batch of it; requests
 *            queue) until its running batches have finished
 *     pool:  load_state_dict(assign) swaps the new tensors into the serving
 *            tree (nothing is written into the old tensors, so an export
 *            still streaming them is undisturbed) and rebuilds the packed
 *            weights layer by layer
 *     loop:  a new version that shares the tree is installed, the model is
 *            resumed; the pause is measured and reported.
 *
 * Jobs reach the loop through grove__loopjob_post (loopjob.c), as export.c's
 * and train.c's do.  The drain waits until no job is in progress.  A job whose pool
 * work is still running when the loop shuts down (a drain that timed out)
 * finishes without replying: its request is gone by then. */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "internal.h" /* grove__model_dir_weights, grove__model_weight_names */
#include "server.h"

/* Reload times: 5 ms .. 60 s. */
#define NBUCKETS 13
static const double bucket_s[NBUCKETS] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                          1,     2.5,  5,     10,   30,  60};

typedef struct rhist {
  _Atomic uint64_t b[NBUCKETS + 1]; /* non-cumulative; last = +Inf */
  _Atomic uint64_t count;
  _Atomic uint64_t sum_ns;
} rhist;

static void rhist_observe(rhist *h, int64_t ns) {
  if (ns < 0) ns = 0;
  int i = 0;
  while (i < NBUCKETS && (double)ns > bucket_s[i] * 1e9) i++;
  atomic_fetch_add(&h->b[i], 1);
  atomic_fetch_add(&h->count, 1);
  atomic_fetch_add(&h->sum_ns, (uint64_t)ns);
}

typedef struct rjob rjob;

/* Per model; loop thread only unless marked. */
typedef struct mstate {
  srv_server *srv;
  srv_model *m;
  bool busy;           /* a reload is in progress */
  bool again;          /* SIGHUP or --watch came meanwhile: once more after it */
  int64_t last_number; /* the highest version number given out */
  rjob *waiting;       /* in place: paused, waiting for running batches */
  bool mutating;       /* in place: the serving tree is being changed */
  int wd;              /* --watch: inotify watch descriptor, -1 = none */
  char *watch_dir;
  uv_timer_t debounce;
  bool debounce_init;
  bool writing;        /* --watch: a file of the model was modified and not closed since */
  int64_t last_change; /* --watch: grove__now_ns() of the last event for the model */
  /* Metrics: any thread reads. */
  _Atomic uint64_t ok, failed, refused;
  _Atomic int in_progress;
  _Atomic int paused; /* m->paused, for /metrics */
  rhist duration, pause;
} mstate;

struct srv_admin {
  srv_server *srv;
  mstate *ms;
  int ifd; /* inotify, -1 = --watch off */
  uv_poll_t ipoll;
  bool ipoll_init;
};

/* A reload.  Fields are the loop's, except those the pool work fills while
 * the loop does not look (from s on). */
struct rjob {
  srv_server *srv;
  srv_model *m;
  mstate *ms;
  srv_req *r;          /* NULL: SIGHUP or --watch */
  const char *trigger; /* "rpc", "SIGHUP", "watch" */
  char *checkpoint;    /* owned; NULL = the directory's weights */
  char *model_dir;     /* owned; NULL = the current directory */
  bool non_strict, in_place;
  int64_t t0, t_pause, pause_ns;
  int64_t previous;
  char *dir;        /* owned: the directory the job opens */
  srv_version *cur; /* held: the version serving when the job started */
  uv_work_t work;
  /* Filled by the pool work. */
  grove_status s;
  grove_err err;
  grove_model *model;    /* full: the new model */
  grove_state_dict *sd;  /* in place: the checkpoint, in the tree's dtypes */
  char *weights_path;    /* owned: the file the weights come from */
  grove_load_report rep; /* what did not fit */
  int64_t version;       /* the version serving after the job */
  const char *build_prio; /* static: what the build (or prep) ran at */
  long build_yields;      /* how often it yielded (run_niced); -1: never asked to */
  /* In place: the checkpoint's stamp before it was read; whether the load was
   * refused because the file changed since (the tree is then untouched). */
  grove_file_stamp stamp;
  bool stale;
};

/* ================================================================ jobs */

bool grove__reload_in_place_active(srv_server *srv, const srv_model *m) {
  mstate *ms = &srv->admin->ms[m->index];
  return ms->waiting != NULL || ms->mutating;
}

/* ================================================================ helpers */

static int64_t rss_mib(void) {
  FILE *f = fopen("/proc/self/statm", "r");
  if (!f) return -1;
  long long size = 0, res = 0;
  int n = fscanf(f, "%lld %lld", &size, &res);
  fclose(f);
  if (n != 2) return -1;
  return (int64_t)(res * (long long)sysconf(_SC_PAGESIZE) >> 20);
}

static char *dup_or_null(const char *s) {
  return s && *s ? strdup(s) : NULL;
}

static bool is_file(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* The weights file grove_model_open picks in dir when given none (core's
 * search, grove__model_dir_weights); malloc'd, NULL with err set when there
 * is none. */
static char *dir_weights(const char *dir, grove_err *err) {
  char *path = NULL;
  if (grove__model_dir_weights(dir, &path, err)) return NULL;
  return path;
}

/* Freeing a version means unmapping and freeing all its weights: tens of
 * milliseconds for a large model, which neither the loop nor a worker must
 * spend while requests wait for their batches.  The last reference is
 * dropped in the pool instead, at idle priority like a build (or at once
 * when the loop is going away).  Workers hand their batch's reference back
 * to the loop for this (batcher.c): the batch that ends last on the old
 * version used to free it on its worker, before the worker took its next
 * batch. */
typedef struct release_req {
  uv_work_t work;
  srv_server *srv;
  srv_version *v;
} release_req;

static const char *run_niced(srv_server *srv, void (*fn)(void *), void *arg, long *nyields);

static void release_version(void *arg) {
  grove__version_release(arg);
}

static void release_work(uv_work_t *w) {
  release_req *q = w->data;
  run_niced(q->srv, release_version, q->v, NULL);
}

static void release_done(uv_work_t *w, int status) {
  (void)status;
  free(w->data);
}

void grove__version_release_off_loop(srv_server *srv, srv_version *v) {
  if (!v) return;
  /* refs only falls once v is not current: 1 means this is the last. */
  if (atomic_load(&v->refs) > 1 || grove__loopjob_closing(srv) || !srv->admin) {
    grove__version_release(v); /* not the last, or no pool to hand it to */
    return;
  }
  release_req *q = calloc(1, sizeof *q);
  if (q) {
    q->srv = srv;
    q->v = v;
    q->work.data = q;
    if (uv_queue_work(&srv->loop, &q->work, release_work, release_done) == 0) return;
    free(q);
  }
  grove__version_release(v);
}

static void job_free(rjob *j) {
  if (!j) return;
  free(j->checkpoint);
  free(j->model_dir);
  free(j->dir);
  free(j->weights_path);
  grove__version_release_off_loop(j->srv, j->cur);
  grove_model_free(j->model);
  grove_sd_free(j->sd);
  grove_load_report_fini(&j->rep);
  free(j);
}

/* ================================================================ replies */

static void reply(rjob *j) {
  srv_req *r = j->r;
  if (!r) return;
  j->r = NULL;
  Grove__ReloadReply rr = GROVE__RELOAD_REPLY__INIT;
  rr.version = j->version;
  rr.previous_version = j->previous;
  rr.weights_path = j->weights_path ? j->weights_path : "";
  rr.dir = j->dir ? j->dir : "";
  rr.duration_us = (uint64_t)((grove__now_ns() - j->t0) / 1000);
  rr.pause_us = (uint64_t)(j->pause_ns / 1000);
  rr.in_place = j->in_place;
  if (j->s) {
    rr.n_missing_keys = j->rep.n_missing;
    rr.missing_keys = j->rep.missing;
    rr.n_unexpected_keys = j->rep.n_unexpected;
    rr.unexpected_keys = j->rep.unexpected;
    rr.n_errors = j->rep.n_errors;
    rr.errors = j->rep.errors;
  }
  Grove__Reply rep = GROVE__REPLY__INIT;
  rep.protocol = GROVE__PROTOCOL_VERSION__PROTOCOL_VERSION;
  rep.id = r->id;
  rep.status = (int32_t)j->s;
  rep.message = j->s ? (char *)grove_err_msg(&j->err) : "";
  rep.body_case = GROVE__REPLY__BODY_RELOAD;
  rep.reload = &rr;
  nng_msg *msg = grove__rpc_pack(&rep);
  if (!msg && j->s == GROVE_OK) {
    /* The version serves; say so in a reply small enough to encode. */
    grove__rpc_reply_error(r, GROVE_E_NOMEM,
                           "model '%s' now serves version %" PRId64
                           ", but the reply could not be encoded",
                           j->m->name, j->version);
    return;
  }
  grove__rpc_send(r, msg, j->s);
}

/* A refusal before any work: answered (RPC) or logged (SIGHUP, --watch). */
static void refuse(rjob *j, grove_status s, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void refuse(rjob *j, grove_status s, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  grove_err_setv(&j->err, s, fmt, ap);
  va_end(ap);
  j->s = s;
  atomic_fetch_add(&j->ms->refused, 1);
  grove__slog(GROVE_LOG_WARN, "reload.refused", "model %s (%s): %s", j->m->name, j->trigger,
              grove_err_msg(&j->err));
  if (j->r) {
    srv_req *r = j->r;
    j->r = NULL;
    grove__rpc_reply_error(r, s, "%s", grove_err_msg(&j->err));
  }
}

/* ================================================================ versions */

/* Makes v (number set here) the model's current version; the old one is
 * released (batches holding it keep it until they finish). */
static void install(rjob *j, srv_version *v) {
  srv_model *m = j->m;
  atomic_init(&v->refs, 1);
  v->number = ++j->ms->last_number;
  srv_version *old = grove__model_install(m, v);
  j->version = v->number;
  /* Hooks re-resolve against the new tree now, so that patterns that
   * stopped matching are logged with the reload, not at the next batch. */
  grove__telemetry_on_version_swap(j->srv, m);
  grove__version_release_off_loop(j->srv, old);
}

static void start(rjob *j);
static void watch_model(srv_server *srv, mstate *ms);

/* The job is over (replied or logged): the model is free for the next. */
static void finish(rjob *j) {
  srv_server *srv = j->srv;
  mstate *ms = j->ms;
  ms->busy = false;
  atomic_store(&ms->in_progress, 0);
  bool again = ms->again;
  ms->again = false;
  job_free(j);
  rjob *n = NULL;
  if (again && !atomic_load(&srv->draining) && !grove__loopjob_closing(srv) &&
      (n = calloc(1, sizeof *n))) {
    n->srv = srv;
    n->m = ms->m;
    n->ms = ms;
    n->trigger = "again";
    n->in_place = srv->cfg.reload_in_place && ms->m->current != NULL;
    n->t0 = grove__now_ns();
    grove__loopjob_begin(srv); /* before this job's done: never idle between */
  }
  grove__loopjob_done(srv);
  if (n) start(n);
}

static void log_result(rjob *j) {
  const char *what = j->weights_path ? j->weights_path : j->dir ? j->dir : "?";
  double ms = (double)(grove__now_ns() - j->t0) / 1e6;
  if (!j->s) {
    char pause[64] = "";
    if (j->in_place) snprintf(pause, sizeof pause, " in place (paused %.1f ms)", j->pause_ns / 1e6);
    char yielded[96] = "";
    if (j->build_yields >= 0 && j->srv->cfg.background_yield_us > 0)
      snprintf(yielded, sizeof yielded, ", yielding every %d us (%ld times)",
               j->srv->cfg.background_yield_us, j->build_yields);
    grove__slog(GROVE_LOG_INFO, "reload.ok",
                "model %s version %" PRId64 " (was %" PRId64
                ") from %s%s, %s, %.1f ms, built at %s%s, rss %" PRId64 " MiB",
                j->m->name, j->version, j->previous, what, pause, j->trigger, ms,
                j->build_prio ? j->build_prio : "?", yielded, rss_mib());
  } else {
    grove__slog(GROVE_LOG_ERROR, "reload.failed",
                "model %s: reload from %s (%s) failed after %.1f ms: %s: %s; version %" PRId64
                " keeps serving",
                j->m->name, what, j->trigger, ms, grove__status_label(j->s), grove_err_msg(&j->err),
                j->previous);
  }
}

static void count_result(rjob *j) {
  if (!j->s) {
    atomic_fetch_add(&j->ms->ok, 1);
    rhist_observe(&j->ms->duration, grove__now_ns() - j->t0);
    if (j->in_place) rhist_observe(&j->ms->pause, j->pause_ns);
  } else {
    atomic_fetch_add(&j->ms->failed, 1);
  }
}

/* ================================================================ priority */

/* A build runs beside the workers.  On a machine whose cores the workers
 * keep busy it would take its time from their batches (the p99 of a reload
 * storm); it should take their idle time instead, so that a busy model
 * reloads more slowly rather than answering more slowly.  The build runs on
 * a thread of its own under SCHED_IDLE: the scheduler runs it only when no
 * normal thread wants the core, and a worker woken by a request preempts it
 * at once.  (It first ran at nice 10, which only weighs it less: a niced
 * thread still runs out its slice before a woken worker gets the core, and
 * that was the p99.  nice 10 remains the fallback where SCHED_IDLE is
 * refused.)  A thread of its own, because a thread cannot give itself its
 * priority back (that needs CAP_SYS_NICE), and libuv's pool threads must
 * keep theirs for in-place loads, which run while the model is paused.
 * The build computes alone (grove_thread_compute_alone), whatever
 * --blas-threads says: a thread at idle priority that started a pool of
 * compute helpers (core/kernels/threadpool.c) would leave them at idle
 * priority for the workers that use them later, and helpers doing its
 * chunks would run the build at their normal priority.  What the build shares with
 * normal threads (a malloc arena, the address space's lock around mmap) it
 * holds briefly, and nothing on a worker's path takes either.  SCHED_IDLE
 * alone was not enough: the thread is also a background one
 * (grove_thread_yield_every: core/base/yield.c), which yields its core every
 * --background-yield-us (100) of its work, or threads woken onto that core
 * wait for it for up to a scheduler tick. */
#define BUILD_NICE 10

typedef struct niced {
  void (*fn)(void *);
  void *arg;
  const char *prio; /* what the build ran at, for the log */
  int yield_us;     /* --background-yield-us */
  long yields;      /* times it yielded; -1: it ran on the caller's thread */
} niced;

static void *niced_main(void *p) {
  niced *n = p;
  setpriority(PRIO_PROCESS, (id_t)gettid(), BUILD_NICE);
  struct sched_param sp = {0};
  pthread_setschedparam(pthread_self(), SCHED_IDLE, &sp);
  /* Read back, so that the log says what the kernel applied. */
  int policy = -1;
  if (pthread_getschedparam(pthread_self(), &policy, &sp) == 0 && policy == SCHED_IDLE)
    n->prio = "SCHED_IDLE";
  else if (getpriority(PRIO_PROCESS, (id_t)gettid()) == BUILD_NICE)
    n->prio = "nice 10";
  grove_thread_yield_every(n->yield_us);
  grove_thread_compute_alone(true);
  n->fn(n->arg);
  n->yields = grove_thread_yields();
  return NULL;
}

/* Runs fn(arg) at idle priority, yielding every --background-yield-us (see above),
 * and returns what it ran at: "SCHED_IDLE", "nice 10" or "normal
 * priority"; *nyields (may be NULL) gets how often it yielded, -1 when it
 * ran on the calling thread (normal priority, no yields). */
static const char *run_niced(srv_server *srv, void (*fn)(void *), void *arg, long *nyields) {
  niced n = {fn, arg, "normal priority", srv->cfg.background_yield_us, -1};
  pthread_t t;
  if (pthread_create(&t, NULL, niced_main, &n) == 0) {
    pthread_join(t, NULL);
  } else {
    fn(arg);
  }
  if (nyields) *nyields = n.yields;
  return n.prio;
}

/* ================================================================ full */

/* What did not fit, for the reply: the load again, on a fresh tree, this time
 * keeping torch's lists (grove_model_open keeps only the message).  Runs only
 * after a failed load, when the new model is gone, so memory stays within
 * old + new. */
static void explain(rjob *j) {
  char path[PATH_MAX];
  snprintf(path, sizeof path, "%s/model.json", j->dir);
  grove_err e = {0};
  grove_model *spec = NULL;
  grove_state_dict *sd = NULL;
  char *text = NULL;
  FILE *f = fopen(path, "rb");
  if (f) {
    if (fseek(f, 0, SEEK_END) == 0) {
      long n = ftell(f);
      if (n >= 0 && n < (64l << 20) && fseek(f, 0, SEEK_SET) == 0 &&
          (text = malloc((size_t)n + 1))) {
        if (fread(text, 1, (size_t)n, f) == (size_t)n)
          text[n] = 0;
        else {
          free(text);
          text = NULL;
        }
      }
    }
    fclose(f);
  }
  const char *ck = j->weights_path;
  if (text && ck && !grove_model_from_spec(text, path, &spec, &e) &&
      !grove_checkpoint_read(ck, &sd, &e)) {
    grove_load_opts lo = {.strict = !j->non_strict, .assign = true};
    grove_load_report_fini(&j->rep);
    grove_module_load_state_dict(spec->root, sd, &lo, &j->rep, &e);
  }
  free(text);
  grove_sd_free(sd);
  grove_model_free(spec);
}

static void full_build(void *arg) {
  rjob *j = arg;
  grove_model_opts o = {.weights = j->checkpoint, .non_strict = j->non_strict};
  j->s = grove_model_open(j->dir, &o, &j->model, &j->err);
  if (!j->s) j->s = grove__model_check_servable(j->model, &j->err);
  if (!j->s) {
    j->weights_path = dup_or_null(j->model->weights_path);
    return;
  }
  grove_model_free(j->model);
  j->model = NULL;
  if (j->checkpoint)
    j->weights_path = strdup(j->checkpoint);
  else {
    grove_err ignore = {0};
    j->weights_path = dir_weights(j->dir, &ignore);
  }
  if (j->s == GROVE_E_STATE_DICT) explain(j);
}

static void full_work(uv_work_t *w) {
  rjob *j = w->data;
  j->build_prio = run_niced(j->srv, full_build, j, &j->build_yields);
}

static void full_done(uv_work_t *w, int status) {
  rjob *j = w->data;
  srv_server *srv = j->srv;
  if (grove__loopjob_closing(srv)) {
    j->r = NULL; /* gone with the socket */
    finish(j);
    return;
  }
  if (status != 0 && !j->s)
    j->s = grove_err_set(&j->err, GROVE_E_INTERNAL, "the reload was cancelled: %s",
                         uv_strerror(status));
  if (!j->s) {
    srv_version *v = calloc(1, sizeof *v);
    if (!v) {
      j->s = grove_err_set(&j->err, GROVE_E_NOMEM, "out of memory for the new version");
    } else {
      v->model = j->model;
      j->model = NULL;
      install(j, v);
      free(j->dir);
      j->dir = dup_or_null(v->model->dir);
      watch_model(srv, j->ms); /* a new model directory is watched from now on */
      grove__loop_wake(srv);   /* the batcher picks up the new batching settings */
    }
  }
  if (j->s) j->version = j->previous;
  log_result(j);
  count_result(j);
  reply(j);
  finish(j);
}

/* ================================================================ in place */

static int cmp_ptr(const void *a, const void *b) {
  uintptr_t x = (uintptr_t) * (void *const *)a, y = (uintptr_t) * (void *const *)b;
  return x < y ? -1 : x > y;
}

/* Pool: reads the checkpoint and prepares it for the serving tree (which
 * keeps serving meanwhile: only read here). */
static void prep_build(void *arg) {
  rjob *j = arg;
  const grove_module *root = j->cur->model->root;
  if (j->checkpoint)
    j->weights_path = strdup(j->checkpoint);
  else if (!(j->weights_path = dir_weights(j->dir, &j->err))) {
    j->s = j->err.code ? j->err.code : GROVE_E_NOMEM;
    return;
  }
  if (!j->weights_path) {
    j->s = grove_err_set(&j->err, GROVE_E_NOMEM, "out of memory");
    return;
  }
  grove_state_dict *live = grove_sd_new();
  if (!live) {
    j->s = grove_err_set(&j->err, GROVE_E_NOMEM, "out of memory");
    return;
  }
  j->s = grove_module_state_dict(root, NULL, live, &j->err);
  /* Tied parameters would come apart under assign (one tensor per key):
   * a full reload re-ties them, this mode does not. */
  size_t n = grove_sd_count(live);
  void **ps = j->s ? NULL : malloc((n ? n : 1) * sizeof *ps);
  if (!j->s && !ps) j->s = grove_err_set(&j->err, GROVE_E_NOMEM, "out of memory");
  if (!j->s) {
    for (size_t i = 0; i < n; i++) ps[i] = grove_sd_tensor(live, i);
    qsort(ps, n, sizeof *ps, cmp_ptr);
    for (size_t i = 1; i < n && !j->s; i++)
      if (ps[i] == ps[i - 1])
        j->s = grove_err_set(&j->err, GROVE_E_UNSUPPORTED,
                             "model '%s' ties parameters (one tensor under two keys); an "
                             "in-place reload would untie them: use a full reload",
                             j->m->name);
  }
  free(ps);
  if (!j->s && !is_file(j->weights_path))
    j->s =
        grove_err_set(&j->err, GROVE_E_NOT_FOUND, "%s: no such checkpoint file", j->weights_path);
  /* The file must still be this one when the tree changes (load_work): a
   * write meanwhile would make the model serve a file no longer on disk. */
  if (!j->s) j->s = grove_file_stamp_of(j->weights_path, &j->stamp, &j->err);
  if (!j->s) j->s = grove_checkpoint_read(j->weights_path, &j->sd, &j->err);
  /* Every tensor that will replace one of the tree's gets the tree's dtype
   * now, so that the load only ever swaps pointers (assign) and never writes
   * into a tensor a forward or an export may still be reading. */
  for (size_t i = 0; !j->s && i < grove_sd_count(j->sd); i++) {
    grove_tensor *src = grove_sd_tensor(j->sd, i);
    const grove_tensor *dst = grove_sd_get(live, grove_sd_key(j->sd, i));
    if (!dst || !src || grove_tensor_numel(src) != grove_tensor_numel(dst)) continue;
    if (src->dtype == dst->dtype && grove_tensor_is_contiguous(src)) continue;
    grove_err ce = {0};
    grove_tensor *c = grove_tensor_clone(src, dst->dtype, &ce);
    if (!c) continue; /* the load reports a dtype it cannot convert */
    j->s = grove_sd_set(j->sd, grove_sd_key(j->sd, i), c, &j->err);
    grove_tensor_release(c);
  }
  grove_sd_free(live);
  /* The readers' messages name the file already. */
  if (j->s && strncmp(grove_err_msg(&j->err), j->weights_path, strlen(j->weights_path)) != 0)
    grove_err_prefix(&j->err, "%s", j->weights_path);
}

static void prep_work(uv_work_t *w) {
  rjob *j = w->data;
  j->build_prio = run_niced(j->srv, prep_build, j, &j->build_yields);
}

/* Pool: the model is paused and no batch runs: change the serving tree. */
static void load_work(uv_work_t *w) {
  rjob *j = w->data;
  grove_load_opts lo = {.strict = !j->non_strict, .assign = true};
  j->s = grove_file_stamp_check(j->weights_path, &j->stamp, &j->err);
  j->stale = j->s != GROVE_OK; /* the tree is untouched */
  if (!j->s) j->s = grove_module_load_state_dict(j->cur->model->root, j->sd, &lo, &j->rep, &j->err);
  if (j->s == GROVE_E_STATE_DICT) grove_err_prefix(&j->err, "%s", j->weights_path);
  grove_sd_free(j->sd);
  j->sd = NULL;
}

static void resume(rjob *j) {
  srv_model *m = j->m;
  grove__model_set_paused(m, false);
  atomic_store(&j->ms->paused, 0);
  j->ms->mutating = false;
  j->ms->waiting = NULL;
  j->pause_ns = grove__now_ns() - j->t_pause;
  grove__loop_wake(j->srv); /* batches of m queued meanwhile */
}

static void load_done(uv_work_t *w, int status) {
  rjob *j = w->data;
  srv_server *srv = j->srv;
  resume(j);
  if (grove__loopjob_closing(srv)) {
    j->r = NULL;
    finish(j);
    return;
  }
  if (status != 0 && !j->s)
    j->s = grove_err_set(&j->err, GROVE_E_INTERNAL, "the reload was cancelled: %s",
                         uv_strerror(status));
  if (!j->s) {
    srv_version *v = calloc(1, sizeof *v);
    if (!v) {
      /* The tree holds the new weights already: the version number must
       * still change, or replies would name the old one. */
      grove__slog(GROVE_LOG_ERROR, "reload.nomem",
                  "model %s: out of memory for the version record after an in-place load",
                  j->m->name);
      j->s = grove_err_set(&j->err, GROVE_E_NOMEM, "out of memory");
    } else {
      srv_version *base = j->cur->base ? j->cur->base : j->cur;
      grove__version_retain(base);
      v->base = base;
      v->model = base->model;
      v->weights_path = j->weights_path ? strdup(j->weights_path) : NULL;
      install(j, v);
    }
  } else if (j->s != GROVE_E_STATE_DICT && !j->stale) {
    /* Anything but a refusal happened while the tree was being changed
     * (out of memory rebuilding a layer's packed weights): say so loudly. */
    grove__slog(GROVE_LOG_ERROR, "reload.in_place_broken",
                "model %s: the in-place load failed part way (%s); reload the model again",
                j->m->name, grove_err_msg(&j->err));
  }
  if (j->s) j->version = j->previous;
  log_result(j);
  count_result(j);
  reply(j);
  finish(j);
}

/* Loop: the model is paused and idle: change the tree in the pool. */
static void mutate(rjob *j) {
  j->ms->mutating = true;
  j->work.data = j;
  int rv = uv_queue_work(&j->srv->loop, &j->work, load_work, load_done);
  if (rv) {
    j->s = grove_err_set(&j->err, GROVE_E_INTERNAL, "uv_queue_work: %s", uv_strerror(rv));
    resume(j);
    log_result(j);
    count_result(j);
    reply(j);
    finish(j);
  }
}

void grove__reload_poll(srv_server *srv) {
  struct srv_admin *a = srv->admin;
  if (!a) return;
  for (size_t i = 0; i < srv->nmodels; i++) {
    mstate *ms = &a->ms[i];
    if (ms->waiting && !ms->mutating && ms->m->running == 0) mutate(ms->waiting);
  }
}

static void prep_done(uv_work_t *w, int status) {
  rjob *j = w->data;
  srv_server *srv = j->srv;
  if (grove__loopjob_closing(srv)) {
    j->r = NULL;
    finish(j);
    return;
  }
  if (status != 0 && !j->s)
    j->s = grove_err_set(&j->err, GROVE_E_INTERNAL, "the reload was cancelled: %s",
                         uv_strerror(status));
  if (j->s) {
    j->version = j->previous;
    log_result(j);
    count_result(j);
    reply(j);
    finish(j);
    return;
  }
  /* Hold the model's batches; go on once the running ones are done. */
  grove__model_set_paused(j->m, true);
  atomic_store(&j->ms->paused, 1);
  j->t_pause = grove__now_ns();
  j->ms->waiting = j;
  if (j->m->running == 0) mutate(j);
}

/* ================================================================ start */

static void start(rjob *j) {
  srv_server *srv = j->srv;
  mstate *ms = j->ms;
  srv_model *m = j->m;
  j->build_yields = -1; /* until a build says otherwise */
  if (atomic_load(&srv->draining)) {
    refuse(j, GROVE_E_UNAVAILABLE, "groved is shutting down; reload refused");
    job_free(j);
    grove__loopjob_done(srv);
    return;
  }
  if (ms->busy) {
    if (!j->r) { /* SIGHUP or --watch: once more when this one is done */
      ms->again = true;
      grove__slog(GROVE_LOG_INFO, "reload.queued",
                  "model %s: a reload is in progress; the %s reload follows it", m->name,
                  j->trigger);
      job_free(j);
      grove__loopjob_done(srv);
      return;
    }
    refuse(j, GROVE_E_UNAVAILABLE,
           "model '%s': another reload of it is in progress (to version %" PRId64
           "); retry once it has answered",
           m->name, ms->last_number + 1);
    job_free(j);
    grove__loopjob_done(srv);
    return;
  }
  j->cur = grove__model_acquire(m);
  j->previous = j->cur ? j->cur->number : 0;
  if (j->in_place && !j->cur) {
    refuse(j, GROVE_E_FAILED_PRECONDITION,
           "model '%s' has no version serving; an in-place reload needs one (use a full reload)",
           m->name);
    job_free(j);
    grove__loopjob_done(srv);
    return;
  }
  const char *dir = j->model_dir ? j->model_dir : j->cur ? j->cur->model->dir : m->dir;
  if (!(j->dir = strdup(dir))) {
    refuse(j, GROVE_E_NOMEM, "out of memory");
    job_free(j);
    grove__loopjob_done(srv);
    return;
  }
  ms->busy = true;
  atomic_store(&ms->in_progress, 1);
  j->work.data = j;
  int rv = uv_queue_work(&srv->loop, &j->work, j->in_place ? prep_work : full_work,
                         j->in_place ? prep_done : full_done);
  if (rv) {
    j->s = grove_err_set(&j->err, GROVE_E_INTERNAL, "uv_queue_work: %s", uv_strerror(rv));
    j->version = j->previous;
    log_result(j);
    count_result(j);
    reply(j);
    finish(j);
  }
}

static void start_posted(srv_server *srv, void *arg) {
  (void)srv;
  start(arg);
}

static void cancel_posted(void *arg) {
  rjob *j = arg;
  j->r = NULL;
  job_free(j);
}

/* An internal reload (SIGHUP, --watch) of m, on the loop. */
static void reload_model(srv_server *srv, srv_model *m, const char *trigger) {
  rjob *j = calloc(1, sizeof *j);
  if (!j) {
    grove__slog(GROVE_LOG_ERROR, "reload.nomem", "model %s: no memory to start a reload", m->name);
    return;
  }
  j->srv = srv;
  j->m = m;
  j->ms = &srv->admin->ms[m->index];
  j->trigger = trigger;
  j->in_place = srv->cfg.reload_in_place && m->current != NULL;
  j->t0 = grove__now_ns();
  grove__loopjob_begin(srv);
  start(j);
}

void grove__reload_all(srv_server *srv, const char *why) {
  if (!srv->admin || grove__loopjob_closing(srv)) return;
  if (atomic_load(&srv->draining)) {
    grove__slog(GROVE_LOG_WARN, "reload.signal", "%s: groved is draining; nothing reloaded", why);
    return;
  }
  grove__slog(GROVE_LOG_INFO, "reload.signal", "%s: reloading %zu model%s from their directories",
              why, srv->nmodels, srv->nmodels == 1 ? "" : "s");
  for (size_t i = 0; i < srv->nmodels; i++) reload_model(srv, &srv->models[i], why);
}

/* ================================================================ the RPC */

void grove__reload_request(srv_req *r, const srv_reload_args *q) {
  srv_server *srv = r->srv;
  srv_model *m = grove__registry_find(srv, q->model);
  if (!m) {
    grove__rpc_reply_error(r, GROVE_E_NOT_FOUND, "model '%s' is not served here",
                           q->model ? q->model : "");
    return;
  }
  if (atomic_load(&srv->draining)) {
    grove__rpc_reply_error(r, GROVE_E_UNAVAILABLE, "groved is shutting down; reload refused");
    return;
  }
  if (q->in_place && q->model_dir && *q->model_dir) {
    grove__rpc_reply_error(r, GROVE_E_INVALID_ARGUMENT,
                           "in_place and model_dir: an in-place reload keeps the model's "
                           "architecture; a new model directory needs a full reload");
    return;
  }
  if ((q->checkpoint && strlen(q->checkpoint) >= PATH_MAX) ||
      (q->model_dir && strlen(q->model_dir) >= PATH_MAX)) {
    grove__rpc_reply_error(r, GROVE_E_INVALID_ARGUMENT, "a path of %d bytes or more", PATH_MAX);
    return;
  }
  rjob *j = calloc(1, sizeof *j);
  if (j) {
    j->srv = srv;
    j->m = m;
    j->ms = &srv->admin->ms[m->index];
    j->r = r;
    j->trigger = "rpc";
    j->non_strict = q->non_strict;
    j->in_place = q->in_place;
    j->t0 = r->t_recv;
    j->checkpoint = dup_or_null(q->checkpoint);
    j->model_dir = dup_or_null(q->model_dir);
  }
  if (!j || (q->checkpoint && *q->checkpoint && !j->checkpoint) ||
      (q->model_dir && *q->model_dir && !j->model_dir) ||
      !grove__loopjob_post(srv, start_posted, cancel_posted, j)) {
    if (j) j->r = NULL;
    job_free(j);
    grove__rpc_reply_error(r, GROVE_E_NOMEM, "out of memory starting the reload");
  }
}

void grove__reload_handle(srv_req *r) {
  const Grove__ReloadRequest *q = r->msg->reload;
  srv_reload_args a = {.model = q->model,
                       .checkpoint = q->checkpoint,
                       .model_dir = q->model_dir,
                       .non_strict = q->non_strict,
                       .in_place = q->in_place};
  grove__reload_request(r, &a);
}

/* ================================================================ --watch */

/* Does a file called name, just replaced in ms's directory, concern it? */
static bool watched_name(const mstate *ms, const char *name) {
  if (!name[0] || name[0] == '.') return false; /* temporary siblings */
  if (strcmp(name, "model.json") == 0 || strcmp(name, grove__model_buffers_name) == 0) return true;
  for (int i = 0; grove__model_weight_names[i]; i++)
    if (strcmp(name, grove__model_weight_names[i]) == 0) return true;
  /* The file model.json names, or an explicit checkpoint in that directory. */
  srv_version *v = ms->m->current;
  const char *wp = v ? (v->weights_path ? v->weights_path : v->model->weights_path) : NULL;
  if (wp) {
    const char *base = strrchr(wp, '/');
    base = base ? base + 1 : wp;
    if (strcmp(base, name) == 0) return true;
  }
  return false;
}

static void on_debounce_fire(uv_timer_t *t);

static void on_inotify(uv_poll_t *h, int status, int events) {
  srv_server *srv = h->data;
  struct srv_admin *a = srv->admin;
  (void)events;
  if (status < 0) return;
  _Alignas(struct inotify_event) char buf[16384];
  for (;;) {
    ssize_t n = read(a->ifd, buf, sizeof buf);
    if (n <= 0) break;
    for (char *p = buf; p < buf + n;) {
      const struct inotify_event *ev = (const struct inotify_event *)p;
      p += sizeof *ev + ev->len;
      if (ev->mask & IN_Q_OVERFLOW) {
        grove__slog(GROVE_LOG_WARN, "reload.watch_overflow",
                    "--watch: inotify dropped events; reloading every model");
        for (size_t i = 0; i < srv->nmodels; i++)
          uv_timer_start(&a->ms[i].debounce, on_debounce_fire, (uint64_t)srv->cfg.watch_debounce_ms,
                         0);
        continue;
      }
      if (!ev->len) continue;
      for (size_t i = 0; i < srv->nmodels; i++) {
        mstate *ms = &a->ms[i];
        if (ms->wd != ev->wd || !watched_name(ms, ev->name)) continue;
        /* A write is in progress from the first IN_MODIFY to the writer's
         * close; the reload waits for it (on_debounce_fire). */
        bool modify = (ev->mask & (IN_MODIFY | IN_CLOSE_WRITE | IN_MOVED_TO)) == IN_MODIFY;
        if (!modify || !ms->writing)
          grove__slog(GROVE_LOG_DEBUG, "reload.watch_event", "model %s: %s/%s %s", ms->m->name,
                      ms->watch_dir, ev->name,
                      modify                   ? "being written"
                      : ev->mask & IN_MOVED_TO ? "renamed in"
                                               : "written");
        ms->writing = modify;
        ms->last_change = grove__now_ns();
        /* Restarted by every event: the reload waits for a quiet spell. */
        uv_timer_start(&ms->debounce, on_debounce_fire, (uint64_t)srv->cfg.watch_debounce_ms, 0);
      }
    }
  }
}

/* Watches the directory m now serves from (again after a reload changed
 * it). */
static void watch_model(srv_server *srv, mstate *ms) {
  struct srv_admin *a = srv->admin;
  if (a->ifd < 0) return;
  srv_version *v = ms->m->current;
  const char *dir = v ? v->model->dir : ms->m->dir;
  if (ms->watch_dir && strcmp(ms->watch_dir, dir) == 0) return;
  int wd = inotify_add_watch(a->ifd, dir, IN_MOVED_TO | IN_CLOSE_WRITE | IN_MODIFY | IN_ONLYDIR);
  if (wd < 0) {
    grove__slog(GROVE_LOG_WARN, "reload.watch_failed", "--watch: model %s: %s: %s", ms->m->name,
                dir, strerror(errno));
    return;
  }
  free(ms->watch_dir);
  ms->watch_dir = strdup(dir);
  ms->wd = wd;
  grove__slog(GROVE_LOG_DEBUG, "reload.watch", "--watch: model %s: watching %s", ms->m->name, dir);
}

/* How long a file may stay open for writing, with nothing written, before
 * --watch reloads anyway (a writer that died holding it open, say). */
#define WATCH_OPEN_WRITER_MAX_NS ((int64_t)30 * 1000000000)

static void on_debounce_fire(uv_timer_t *t) {
  mstate *ms = t->data;
  /* A writer that pauses longer than the debounce (a slow copy) has written
   * half a file: wait for its close.  Whatever slips past (two writers, a
   * write that comes with no event) is caught by the build itself, which
   * refuses a file that changes while it is read or built from
   * (core/model/model.c), and the write's own event brings the next reload. */
  if (ms->writing && grove__now_ns() - ms->last_change < WATCH_OPEN_WRITER_MAX_NS) {
    uv_timer_start(&ms->debounce, on_debounce_fire, (uint64_t)ms->srv->cfg.watch_debounce_ms, 0);
    return;
  }
  ms->writing = false;
  reload_model(ms->srv, ms->m, "watch");
}

/* ================================================================ lifetime */

/* The temporaries a killed groved left in a model's directory (a promote or
 * an export into it, interrupted): nothing will ever finish them.  Before
 * anything of this process writes there. */
static void remove_stale_temps(mstate *ms) {
  srv_version *v = ms->m->current;
  const char *dir = v ? v->model->dir : ms->m->dir;
  if (!dir) return;
  size_t n = 0;
  grove_err e = {0};
  if (grove_checkpoint_remove_stale_temps(dir, &n, &e))
    grove__slog(GROVE_LOG_WARN, "reload.stale_temp", "model %s: %s", ms->m->name,
                grove_err_msg(&e));
  if (n)
    grove__slog(GROVE_LOG_INFO, "reload.stale_temp",
                "model %s: removed %zu temporary file%s a killed writer left in %s", ms->m->name, n,
                n == 1 ? "" : "s", dir);
}

grove_status grove__reload_start(srv_server *srv, grove_err *err) {
  struct srv_admin *a = calloc(1, sizeof *a);
  if (!a) return grove_err_set(err, GROVE_E_NOMEM, "out of memory");
  srv->admin = a;
  a->srv = srv;
  grove__rpc_set_handler(srv, GROVE__REQUEST__BODY_RELOAD, grove__reload_handle, false);
  grove__metrics_add_family(srv, grove__reload_metrics);
  a->ifd = -1;
  a->ms = calloc(srv->nmodels ? srv->nmodels : 1, sizeof *a->ms);
  if (!a->ms) return grove_err_set(err, GROVE_E_NOMEM, "out of memory");
  int rv;
  for (size_t i = 0; i < srv->nmodels; i++) {
    mstate *ms = &a->ms[i];
    ms->srv = srv;
    ms->m = &srv->models[i];
    ms->wd = -1;
    ms->last_number = srv->models[i].current ? srv->models[i].current->number : 0;
    uv_timer_init(&srv->loop, &ms->debounce);
    ms->debounce.data = ms;
    ms->debounce_init = true;
    remove_stale_temps(ms);
  }
  if (!srv->cfg.watch) return GROVE_OK;
  a->ifd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
  if (a->ifd < 0)
    return grove_err_set(err, GROVE_E_INTERNAL, "--watch: inotify_init1: %s", strerror(errno));
  a->ipoll.data = srv;
  if ((rv = uv_poll_init(&srv->loop, &a->ipoll, a->ifd)) ||
      (rv = uv_poll_start(&a->ipoll, UV_READABLE, on_inotify)))
    return grove_err_set(err, GROVE_E_INTERNAL, "--watch: uv_poll: %s", uv_strerror(rv));
  a->ipoll_init = true;
  for (size_t i = 0; i < srv->nmodels; i++) watch_model(srv, &a->ms[i]);
  grove__slog(GROVE_LOG_INFO, "reload.watching",
              "--watch: a model reloads %d ms after its weights file or model.json is replaced "
              "and no longer being written",
              srv->cfg.watch_debounce_ms);
  return GROVE_OK;
}

static void on_closed(uv_handle_t *h) {
  (void)h;
}

void grove__reload_close(srv_server *srv) {
  struct srv_admin *a = srv->admin;
  if (!a) return;
  /* grove__loopjob_close ran first: the jobs not yet run were cancelled. */
  if (a->ipoll_init && !uv_is_closing((uv_handle_t *)&a->ipoll))
    uv_close((uv_handle_t *)&a->ipoll, on_closed);
  for (size_t i = 0; i < srv->nmodels; i++) {
    mstate *ms = &a->ms[i];
    if (ms->debounce_init && !uv_is_closing((uv_handle_t *)&ms->debounce))
      uv_close((uv_handle_t *)&ms->debounce, on_closed);
    /* An in-place reload still waiting for its model's batches. */
    if (ms->waiting) {
      rjob *j = ms->waiting;
      ms->waiting = NULL;
      j->r = NULL;
      finish(j);
    }
  }
}

void grove__reload_free(srv_server *srv) {
  struct srv_admin *a = srv->admin;
  if (!a) return;
  if (a->ifd >= 0) close(a->ifd);
  for (size_t i = 0; a->ms && i < srv->nmodels; i++) free(a->ms[i].watch_dir);
  free(a->ms);
  free(a);
  srv->admin = NULL;
}

/* ================================================================ metrics */

static void hist_text(srv_text *b, const char *name, const char *model, const rhist *h) {
  char labels[600];
  snprintf(labels, sizeof labels, "model=\"%s\"", model);
  grove__prom_histogram(b, name, labels, bucket_s, NBUCKETS, h->b,
                        (double)atomic_load(&h->sum_ns) * 1e-9);
}

void grove__reload_metrics(srv_server *srv, srv_text *b) {
  struct srv_admin *a = srv->admin;
  char lab[512];
  if (!a) return;
  grove__text_printf(
      b,
      "# HELP grove_reloads_total Reloads by model and result: ok (the new version serves), "
      "failed (the checkpoint could not be read or did not fit; nothing changed), refused "
      "(another reload of the model was in progress, or groved was draining).\n"
      "# TYPE grove_reloads_total counter\n");
  for (size_t i = 0; i < srv->nmodels; i++) {
    const mstate *ms = &a->ms[i];
    grove__prom_label(srv->models[i].name, lab, sizeof lab);
    grove__text_printf(b, "grove_reloads_total{model=\"%s\",result=\"ok\"} %" PRIu64 "\n", lab,
                       atomic_load(&ms->ok));
    grove__text_printf(b, "grove_reloads_total{model=\"%s\",result=\"failed\"} %" PRIu64 "\n", lab,
                       atomic_load(&ms->failed));
    grove__text_printf(b, "grove_reloads_total{model=\"%s\",result=\"refused\"} %" PRIu64 "\n", lab,
                       atomic_load(&ms->refused));
  }
  grove__text_printf(
      b,
      "# HELP grove_reload_in_progress 1 while a reload of the model is being built.\n"
      "# TYPE grove_reload_in_progress gauge\n");
  for (size_t i = 0; i < srv->nmodels; i++)
    grove__text_printf(b, "grove_reload_in_progress{model=\"%s\"} %d\n",
                       grove__prom_label(srv->models[i].name, lab, sizeof lab),
                       atomic_load(&a->ms[i].in_progress));
  grove__text_printf(
      b,
      "# HELP grove_reload_paused 1 while an in-place reload holds the model's batches.\n"
      "# TYPE grove_reload_paused gauge\n");
  for (size_t i = 0; i < srv->nmodels; i++)
    grove__text_printf(b, "grove_reload_paused{model=\"%s\"} %d\n",
                       grove__prom_label(srv->models[i].name, lab, sizeof lab),
                       atomic_load(&a->ms[i].paused));
  grove__text_printf(
      b,
      "# HELP grove_reload_duration_seconds Time from a successful reload's request to its "
      "new version serving.\n# TYPE grove_reload_duration_seconds histogram\n");
  for (size_t i = 0; i < srv->nmodels; i++)
    hist_text(b, "grove_reload_duration_seconds",
              grove__prom_label(srv->models[i].name, lab, sizeof lab), &a->ms[i].duration);
  grove__text_printf(
      b,
      "# HELP grove_reload_pause_seconds How long an in-place reload held the model's "
      "batches.\n# TYPE grove_reload_pause_seconds histogram\n");
  for (size_t i = 0; i < srv->nmodels; i++)
    hist_text(b, "grove_reload_pause_seconds",
              grove__prom_label(srv->models[i].name, lab, sizeof lab), &a->ms[i].pause);
}
