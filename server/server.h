/* server.h: groved's internal types and the functions its parts call on
 * each other.  Never installed; nothing outside server/ includes it.
 *
 * The parts, one file each (docs/architecture.md, "server/", has their
 * layers; a file calls only those below it, and the layers below call up
 * only through the tables the owners fill in at start):
 *   main.c      flags
 *   lifecycle.c start-up order, signals, drain, shutdown
 *   registry.c  model directories loaded into refcounted versions; installs
 *               a model's new version
 *   sp.c        --data-io loop: the data plane's connections read and written
 *               on the loop, in NNG's wire protocol
 *   rpc.c       the NNG rep sockets: receive, decode, dispatch through the
 *               handler table, reply
 *   predict.c   the Predict RPC: validate, hand to the loop
 *   status.c    the Status and ModelMetadata RPCs
 *   loop.c      the libuv loop and its inbox
 *   loopjob.c   the loop-job queue (work other threads run on the loop)
 *   batcher.c   the libuv loop's side of predicts: queues per model, batch
 *               formation, handing batches to idle workers
 *   worker.c    worker threads: concatenate rows, forward, split, reply
 *   metrics.c   counters and histograms, Prometheus text
 *   http.c      /healthz, /readyz, /metrics and registered routes on a libuv HTTP
 *               server of its own thread
 *   oip.c       the Open Inference Protocol on the HTTP listener (with oip_json.c)
 *   conns.c     connection caps and idle timeouts of every listener
 *   slog.c      one log line per event
 *   reload.c    hot reload (Reload RPC, SIGHUP, --watch, promote)
 *   telemetry.c forward-hook telemetry: hook tables, workers' statistics, the
 *               PUB socket (with telemetry_stats.c; docs/telemetry.md)
 *   export.c    ExportStateDict: the serving state_dict streamed in byte ranges
 *   train.c     training sessions: StartTraining, TrainStep, Evaluate, Promote,
 *               StopTraining (docs/training.md)
 *
 * Threads and who owns what (docs/operations.md has the picture):
 *   - The libuv loop thread owns every model's queue, the idle-worker list,
 *     and the drain state.  Nothing else touches them.
 *   - NNG's callback threads decode and validate a request, then hand it to
 *     the loop through the inbox (a mutex-guarded list plus a srv_waker).
 *     Bad requests, status and metadata are answered right there.
 *   - A worker owns the batch the loop gave it until it posts itself back
 *     through the same inbox.  It replies to each request itself (the reply
 *     goes out on NNG from the worker thread: one hop less than going back
 *     through the loop, and the loop never waits on a socket).  A lone
 *     request's batch may instead be run by the loop itself on an idle
 *     worker's arena (batcher.c), the worker off the idle list meanwhile.
 *   - With --data-io loop (sp.c, the default) the loop itself reads the
 *     data plane's connections, decodes and checks each request; a worker
 *     writes its replies when their connection has nothing queued, the
 *     loop the rest (the requests come back through sp.c's outbox, one
 *     wake-up per batch).  NNG's threads then serve the admin plane only.
 *   - A request (srv_req) belongs to exactly one of them at a time, so it
 *     carries no lock: NNG thread -> loop -> worker -> NNG again.  An OIP
 *     infer (oip.c) goes HTTP thread -> loop -> worker -> HTTP thread (the
 *     worker encodes the answer and posts it: grove__http_post).
 *   - Metrics are atomics any thread may bump and the HTTP thread reads.
 *   - A model's current version is swapped only by the loop (the hot-reload
 *     issue) under srv_model.mu; readers on other threads take a reference
 *     under that mutex.  A batch holds a reference to the version it was
 *     dispatched with until its last reply is out.
 */
#ifndef GROVE_SERVER_H
#define GROVE_SERVER_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <nng/nng.h>
#include <uv.h>

#include "grove.pb-c.h"
#include "grove/grove.h"

/* ================================================================ config */

#define SRV_MAX_URLS 16
#define SRV_MAX_MODELS 256

typedef struct srv_model_arg {
  char *name; /* NULL: the directory's base name */
  char *dir;
} srv_model_arg;

typedef struct srv_config {
  const char *listen[SRV_MAX_URLS]; /* the data plane: predict, status, metadata */
  size_t nlisten;
  const char *admin_listen[SRV_MAX_URLS]; /* the admin plane (admin.c) */
  size_t nadmin_listen;
  bool admin_default;             /* admin_listen is the default only (for messages) */
  const char *admin_token_file;   /* --admin-token-file, or NULL: no token */
  const char *checkpoint_dirs[SRV_MAX_URLS]; /* --checkpoint-dir: more allowed paths */
  size_t ncheckpoint_dirs;
  const char *http; /* HOST:PORT, or NULL for none */
  const char *pub;  /* telemetry PUB URL (the hooks issue); recorded only */
  const char *model_repo;
  srv_model_arg models[SRV_MAX_MODELS];
  size_t nmodels;
  int workers;      /* 0 = cores / blas_threads (both 0: from the models' weights) */
  int blas_threads; /* 0 = cores / workers */
  size_t max_request_bytes;
  int drain_timeout_ms;
  int test_batch_delay_ms; /* testing aid: each batch sleeps this long first */
  bool watch;              /* --watch: reload a model when its weights file is replaced */
  int watch_debounce_ms;   /* quiet time after the last change before reloading */
  bool reload_in_place;    /* SIGHUP and --watch reload in place */
  int background_yield_us; /* reload builds and training yield this often (0: never) */
  grove_log_level log_level;
  size_t max_connections; /* --max-connections; 0: from the descriptor limit (conns.c) */
  int idle_timeout_s;     /* --idle-timeout; 0: never */
  bool data_io_loop;      /* --data-io loop: sp.c reads the --listen URLs on the loop */
} srv_config;

/* ================================================================ logging */

/* One line on stderr: "2026-11-29T14:03:07.123Z info server.listen: msg".
 * Thread-safe (one write(2) per line). */
void grove__slog_init(grove_log_level threshold);
void grove__slog(grove_log_level level, const char *id, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* The callback installed with grove_set_log, so libgrove's events come out
 * the same way. */
void grove__slog_core(void *user, grove_log_level level, const char *id, const char *msg);

/* ================================================================ time */

/* CLOCK_MONOTONIC in nanoseconds. */
int64_t grove__now_ns(void);

/* ================================================================ metrics */

/* Upper bounds of the latency buckets, in seconds; +Inf is implicit. */
#define SRV_LAT_BUCKETS 16
/* Upper bounds of the batch-size buckets, in rows; +Inf is implicit. */
#define SRV_BATCH_BUCKETS 10
/* grove_status values below this are counted by value (they are < 100). */
#define SRV_NSTATUS 128

typedef struct srv_hist {
  _Atomic uint64_t buckets[SRV_LAT_BUCKETS + 1]; /* non-cumulative; last = +Inf */
  _Atomic uint64_t count;
  _Atomic uint64_t sum; /* ns for latencies, rows for batch sizes */
} srv_hist;

/* The protocol a request came by: the `protocol` label of
 * grove_requests_total and grove_request_latency_seconds. */
typedef enum srv_proto {
  SRV_PROTO_GROVE = 0, /* protobuf over NNG (rpc.c) */
  SRV_PROTO_OIP = 1,   /* the Open Inference Protocol over HTTP (oip.c) */
  SRV_NPROTO
} srv_proto;

typedef struct srv_metrics {
  _Atomic uint64_t requests[SRV_NPROTO][SRV_NSTATUS]; /* answered, by protocol and status */
  srv_hist queue_lat, compute_lat;
  srv_hist total_lat[SRV_NPROTO]; /* by protocol */
  srv_hist batch_size;
} srv_metrics;

void grove__hist_observe_ns(srv_hist *h, int64_t ns);
void grove__hist_observe_rows(srv_hist *h, int64_t rows);
/* Counts one answered request of protocol p with status s. */
void grove__metrics_count(srv_metrics *m, srv_proto p, grove_status s);
/* "grove", "oip". */
const char *grove__proto_label(srv_proto p);
typedef struct srv_text srv_text; /* below, with the text buffer */
/* h's lines in b (grove__prom_histogram; labels as it takes them): a latency
 * in seconds, or with rows a batch size. */
void grove__hist_render(srv_text *b, const char *name, const char *labels, const srv_hist *h,
                        bool rows);

/* ================================================================ models */

/* One loaded version of a model: the tree and its weights.  Immutable;
 * freed when its last reference drops (any thread). */
typedef struct srv_version {
  atomic_int refs;
  int64_t number; /* 1 for the first load, +1 per reload */
  grove_model *model;
  /* An in-place reload (reload.c) loads new weights into the serving tree:
   * the new version shares model with base (held; base frees the model) and
   * names its own weights file (owned; NULL = model->weights_path). */
  struct srv_version *base;
  char *weights_path;
} srv_version;

void grove__version_retain(srv_version *v);
/* NULL is a no-op.  Frees the model on the last reference. */
void grove__version_release(srv_version *v);

typedef struct srv_req srv_req;

typedef struct srv_model {
  size_t index;
  char *name;
  char *dir;
  char *error; /* why the load failed, or NULL; set at start, then read-only */

  pthread_mutex_t mu;   /* guards current */
  srv_version *current; /* NULL when the load failed; written by grove__model_install only */

  /* Loop thread only. */
  srv_req *head, *tail; /* FIFO of queued requests */
  size_t queued;        /* requests in the FIFO */
  int64_t queued_rows;
  int running; /* batches of this model on workers now */
  /* The most rows of this model in groved at once (queued plus running,
   * taken as each request is queued), over the current and the previous
   * window of BATCH_PEAK_WINDOW_NS or four batches (batcher.c): how many
   * the clients keep in flight, which sets how many a batch waits for. */
  int64_t peak_rows, peak_rows_prev;
  int64_t peak_window_start;
  bool paused; /* an in-place reload holds this model's batches (grove__model_set_paused) */

  /* Any thread. */
  /* Rows of batches dispatched and not yet answered: added by the loop at
   * dispatch, taken off by the worker before its first reply goes out (so
   * that a request coming back never finds its rows still counted). */
  _Atomic int64_t running_rows;
  /* How long a batch of one request takes to compute (worker.c: a running
   * mean of the last ones, ns; 0 until one ran), for batcher.c's choice of
   * running a lone request on the loop. */
  _Atomic int64_t lone_ns;
  /* ... and a batch of any size: batcher.c's hold never outlasts one. */
  _Atomic int64_t batch_ns;
  _Atomic uint64_t queue_depth; /* = queued, for /metrics and status */
  _Atomic int64_t version_number;
  srv_metrics metrics;
} srv_model;

/* Loads every model of cfg (--model and --model-repo) into srv->models.  A
 * model that fails keeps its entry with error set and no version; the
 * others serve.  Returns GROVE_E_INVALID_ARGUMENT for a bad configuration
 * (duplicate names, an unreadable repository), with err set. */
typedef struct srv_server srv_server;
grove_status grove__registry_load(srv_server *srv, grove_err *err);
void grove__registry_free(srv_server *srv);
/* The model called name, or NULL.  The table never changes after start, so
 * any thread may call this. */
srv_model *grove__registry_find(srv_server *srv, const char *name);
/* A new reference to m's current version, or NULL when it has none.  Any
 * thread. */
srv_version *grove__model_acquire(srv_model *m);
/* Loop thread only (or the main thread at start): makes v (refs and number
 * set) m's current version under m->mu and returns the one it replaces
 * (NULL: none), whose reference the caller now holds.  The one writer of
 * m->current and m->version_number. */
srv_version *grove__model_install(srv_model *m, srv_version *v);
/* Loop thread only: holds (or lets go) m's batches; the batcher forms none
 * while paused (an in-place reload). */
void grove__model_set_paused(srv_model *m, bool paused);
/* Loop thread only.  Drops v (NULL is a no-op); when that is the last
 * reference, the version is freed in libuv's pool at idle priority
 * (reload.c), not on the loop. */
void grove__version_release_off_loop(srv_server *srv, srv_version *v);
/* The served models' names, ", "-separated ("none" without any), cut to
 * fit n bytes of buf, for messages.  Any thread. */
void grove__registry_names(srv_server *srv, char *buf, size_t n);
/* Every configured model loaded? */
bool grove__registry_ready(srv_server *srv);
/* What groved needs of a model beyond grove_model_open's checks (declared
 * inputs with a batch dimension, at most GROVE_MAX_VALUES of each, sane
 * batching); GROVE_E_SPEC with err set otherwise.  Then asks the model
 * whether dimension 0 batches (grove_model_probe_batching), which may set
 * m's max_batch_size to 0.  The thread that opened m, before it is shared. */
grove_status grove__model_check_servable(grove_model *m, grove_err *err);

/* ================================================================ requests */

typedef enum srv_req_state {
  REQ_IDLE = 0, /* no receive posted (before start, after stop) */
  REQ_RECV,     /* a receive is posted */
  REQ_WORK,     /* received; owned by the NNG callback, the loop or a worker */
  REQ_SEND,     /* a reply is being sent */
} srv_req_state;

/* Where a predict came from when not from an NNG context (oip.c): who
 * answers it.  rpc.c and worker.c call these instead of their own replies
 * when srv_req.origin is set; either takes r, which is the origin's
 * afterwards (it counts the answer: grove__metrics_answer, and drops
 * srv.inflight for an accepted one).
 *   error:   any thread that owns r (predict.c's checks, the batcher's queue
 *            full and deadline, a worker's failed batch); msg is borrowed.
 *   outputs: the worker thread, once its batch's forward succeeded: r's
 *            rows are out's rows [row0, row0 + r->rows), valid for this
 *            call only (the worker's arena). */
typedef struct srv_batch srv_batch;
typedef struct srv_origin {
  srv_proto protocol;
  void (*error)(srv_req *r, grove_status s, const char *msg);
  void (*outputs)(srv_req *r, const srv_batch *b, const grove_values *out, int64_t row0,
                  int64_t compute_ns);
} srv_origin;

/* One in-flight RPC.  Its predict fields are valid while state == REQ_WORK.
 *
 * Where it came from decides how its answer goes back.  With origin set it
 * is a request of another protocol (oip.c's, which allocates it) handed to
 * the same predict path: msg is then that protocol's own (not unpacked by
 * protobuf-c, never freed by rpc.c), the answer goes to origin's callbacks
 * unencoded (the outputs straight from the worker's arena), and ctx, aio,
 * state and the reply chain are unused.  Otherwise the answer is an encoded
 * grove.Reply: deliver, the origin's reply function, which
 * grove__rpc_send and grove__rpc_send_chain call once r's answer is counted
 * and its request freed, with r->reply holding it (NULL: no memory to
 * encode it; nothing can be sent and the client will time out); r is the
 * origin's again afterwards.  rpc.c's own is an NNG context with its aio,
 * reused for request after request (rpc_deliver, its replies chained per
 * connection); a front end that speaks grove.Request bytes embeds a
 * srv_req, sets srv, deliver and pipe_id 0 and hands the bytes to
 * grove__rpc_dispatch on a thread of its own.  deliver must not block (a
 * worker calls it). */
struct srv_req {
  const srv_origin *origin; /* NULL: the NNG RPC */
  srv_server *srv;
  void (*deliver)(srv_req *r);
  nng_ctx ctx;
  nng_aio *aio;
  srv_req_state state;

  Grove__Request *msg; /* decoded request; owned */
  uint64_t id;         /* the client's id, echoed */
  bool counted;        /* counted in grove_requests_total (predicts, garbage) */
  bool accepted;       /* a predict handed to the loop: srv.inflight counts it */

  /* Predict only. */
  srv_model *model;
  size_t ninputs;
  grove_tensor inputs[GROVE_MAX_VALUES]; /* plain views into msg */
  int64_t rows;
  int64_t t_recv, t_dispatch, deadline; /* ns; deadline INT64_MAX = none */

  srv_req *next; /* inbox, model FIFO or batch list */
  bool admin_plane; /* the context receives on the admin socket (admin.c) */

  /* A worker's encoded reply, waiting its turn in its connection's chain. */
  uint32_t pipe_id; /* the connection the request came on */
  nng_msg *reply;
  grove_status reply_status;
  srv_req *chain;      /* the reply to send once this one's send completes */
  srv_req *chain_tail; /* heads only: the last of the chain */
  srv_req *next_head;  /* heads only: the next connection's chain */
};

/* ================================================================ workers */

struct srv_batch {
  srv_model *model;
  srv_version *version;   /* reference held until the batch is done */
  struct tel_table *hooks; /* the model's hook table, likewise; NULL: none */
  srv_req *reqs;        /* linked by next, in queue order */
  size_t nreqs;
  int64_t rows;
  bool answered; /* worker.c: its rows no longer count in model->running_rows */
};

/* loop.c: a wake-up of the loop from any thread, one per kind of work
 * (the inbox's, sp.c's outbox), all on one eventfd the loop polls.
 * libuv 1.44's uv_async_send was one before: the loop, woken by the
 * sender's write, spun (pause, then sched_yield) until the sender had
 * returned from it and marked the handle, a fifth of the loop's CPU per
 * lone request in this VM (perf: uv__async_spin); this one has nothing to
 * wait for.  Loop thread: init (after grove__loop_init), close; any thread:
 * send. */
typedef struct srv_waker srv_waker;
struct srv_waker {
  atomic_bool armed; /* sent, its callback not yet run */
  void (*cb)(srv_waker *);
  void *data;
  struct srv_server *srv;
};
grove_status grove__waker_init(struct srv_server *srv, srv_waker *w, void (*cb)(srv_waker *),
                               void *data, grove_err *err);
/* Any thread: cb runs on the loop soon.  Between grove__wakers_hold and
 * grove__wakers_release (one thread, e.g. a worker around its batch) the
 * write waits and goes out at the release, so that a batch's replies and
 * the worker's return wake the loop once; another thread's send meanwhile
 * waits for that release too (at most the rest of the batch's replies). */
void grove__waker_send(srv_waker *w);
void grove__wakers_hold(void);
void grove__wakers_release(void);
/* Loop thread: cb is never called again. */
void grove__waker_close(srv_waker *w);

typedef struct srv_worker srv_worker;
struct srv_worker {
  srv_server *srv;
  int id;
  pthread_t thread;
  bool started;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  bool assigned; /* guarded by mu: batch is set and not finished */
  bool stop;     /* guarded by mu */
  srv_batch batch;
  grove_arena **arenas; /* one per model (index), NULL for a model not loaded */
  srv_worker *next;     /* idle stack or done list */
  int64_t idle_since;   /* loop thread: when it last became idle (batcher.c's hold) */
};

grove_status grove__workers_start(srv_server *srv, grove_err *err);
/* The part of batch b's output t that is request r's, r's rows starting at
 * row0: its rows of dimension 0, or all of t when the model is unbatched
 * (batching.max_batch_size 0: one request per forward, outputs whole).
 * *dim0 is the slice's dimension 0 (meaningless when t has none).  Worker
 * thread, while b's arena holds t. */
const void *grove__batch_slice(const srv_batch *b, const srv_req *r, const grove_tensor *t,
                               int64_t row0, size_t *nbytes, int64_t *dim0);
/* Hands b to the idle worker w (loop thread). */
void grove__worker_assign(srv_worker *w);
/* Loop thread: runs w's batch (formed by batcher.c, w off the idle list) on
 * the calling thread, as the worker would, replies included; w goes back to
 * the idle list by the caller. */
void grove__worker_run_here(srv_worker *w);
/* Stops and joins every worker; one running a batch finishes it first. */
void grove__workers_stop(srv_server *srv);
/* Frees the workers' arenas and state (after grove__workers_stop). */
void grove__workers_free(srv_server *srv);

/* ================================================================ tables */

/* An RPC's handler: called on the NNG thread that owns r, which it answers
 * (now or later, from any thread that then owns r). */
typedef void (*srv_rpc_handler)(srv_req *r);
/* Above every Grove__Request body case of proto/grove.proto. */
#define SRV_RPC_BODIES 32
/* rpc.c's dispatch table, filled in at start by each RPC's owner (before
 * grove__rpc_serve; read-only afterwards, so NNG's threads read it without
 * a lock). */
typedef struct srv_rpc_table {
  srv_rpc_handler handle[SRV_RPC_BODIES]; /* by body case; NULL: UNSUPPORTED */
  bool counted[SRV_RPC_BODIES];           /* counted in grove_requests_total */
  bool (*gate)(srv_req *r);               /* admin.c: may r run here? NULL: yes */
  void (*wake)(srv_server *srv);          /* a reply went out while draining */
} srv_rpc_table;

/* http.c's routes (below, with http.c): a route answers a request whose
 * path has its prefix. */
typedef struct srv_hreq srv_hreq;
typedef struct srv_hres srv_hres;
typedef bool (*srv_http_route)(srv_server *srv, const srv_hreq *q, srv_hres *res);

/* A feature's metric families, appended to b (the HTTP thread). */
typedef void (*srv_metrics_fn)(srv_server *srv, srv_text *b);
#define SRV_MAX_FAMILIES 16

/* ================================================================ server */

struct srv_server {
  srv_config cfg;
  int workers, blas_threads;
  bool threads_auto; /* neither flag given: lifecycle.c settles them after the load */
  int64_t t_start;

  srv_model *models;
  size_t nmodels;

  /* NNG */
  nng_socket sock;
  bool sock_open;
  nng_socket admin_sock; /* the admin plane's listeners (admin.c) */
  bool admin_sock_open;
  struct srv_admin_plane *plane; /* admin.c: token, allowed directories, URLs */
  srv_req *reqs;
  size_t nreqs;
  _Atomic int64_t inflight; /* predicts handed to the loop, not yet answered */
  srv_metrics unrouted;     /* requests naming no known model, or undecodable */
  _Atomic int64_t sending;  /* replies being sent */
  atomic_bool draining;     /* SIGTERM seen: new predicts get UNAVAILABLE */

  /* libuv (loop thread) */
  uv_loop_t loop;
  srv_waker wake;                  /* loop.c: the inbox's wake-up */
  int wake_fd;                     /* loop.c: every waker's eventfd ... */
  atomic_bool wake_armed;          /* ... written and not yet read */
  uv_poll_t wake_poll;
  srv_waker *wakers[4];
  size_t nwakers;
  uv_check_t check;                /* loop.c: the loop's own predicts, taken once per iteration */
  uv_prepare_t prepare;            /* loop.c: ... and before the loop blocks */
  pthread_t loop_tid;              /* loop.c: the thread running the loop */
  bool inbox_dirty;                /* loop thread: pushed from the loop, not yet taken */
  void (*on_wake)(srv_server *);   /* lifecycle.c's, called on every wake-up */
  bool stopped;                    /* lifecycle.c: the loop's handles are closing */
  bool drain_expired;              /* lifecycle.c: --drain-timeout passed; queued ones answered */
  uv_signal_t sig_term, sig_int, sig_hup;
  uv_timer_t drain_timer;
  uv_poll_t hold_poll; /* batcher.c: the batch hold's timerfd ... */
  int hold_fd;
  int64_t hold_at; /* ... armed for this time (ns, CLOCK_MONOTONIC), 0 = disarmed */
  bool loop_started;
  size_t rr; /* round-robin start among models */

  /* inbox: NNG threads and workers -> loop */
  pthread_mutex_t inbox_mu;
  srv_req *inbox_head, *inbox_tail;
  srv_worker *done_head;

  srv_worker *worker_array;
  srv_worker *idle; /* loop thread: stack of idle workers */
  size_t nidle;

  /* HTTP */
  struct srv_http *http; /* http.c: the HTTP thread */
  const char *http_prefix; /* grove__http_set_route's (one route: oip.c's /v2) */
  srv_http_route http_route;

  struct srv_admin *admin;         /* reload.c: reload jobs, --watch, their metrics */
  struct srv_loopjobs *loopjobs;   /* loopjob.c: the loop-job queue */
  struct srv_exports *exports;     /* export.c: open state_dict exports */
  struct srv_telemetry *telemetry; /* telemetry.c: hooks and the PUB socket */
  struct srv_training *training;   /* train.c: training sessions */
  struct srv_conns *conns;         /* conns.c: connection caps and idle timeouts */
  struct srv_sp *sp;               /* sp.c: the data plane's listeners on the loop */

  srv_rpc_table rpc;                        /* rpc.c's handlers (above) */
  srv_metrics_fn families[SRV_MAX_FAMILIES]; /* metrics.c's families, in order */
  _Atomic size_t nfamilies;

  int exit_code;
};

/* admin.c: the admin plane (docs/operations.md, "Security").
 *
 * Reads --admin-token-file and resolves every --checkpoint-dir (main, before
 * grove__rpc_start); GROVE_E_INVALID_ARGUMENT naming the flag otherwise. */
grove_status grove__admin_plane_init(srv_server *srv, grove_err *err);
void grove__admin_plane_free(srv_server *srv);
/* Listens on the --admin-listen URLs (rpc.c, at start).  The default address
 * is not best effort: taken, groved does not start (another groved's
 * admin plane would answer this one's clients). */
grove_status grove__admin_plane_listen(srv_server *srv, grove_err *err);
/* Whether r (decoded, on the NNG thread that owns it) may run here: an admin
 * RPC only on the admin listener and with the token, predict only on the
 * data listener.  false when it was refused (r is answered). */
bool grove__admin_gate(srv_req *r);
/* The admin plane's URLs as StatusReply.admin_listen wants them (static
 * after start; n 0 when there is none). */
char **grove__admin_urls(srv_server *srv, size_t *n);
/* Whether path may be read or written by an admin RPC on model m: it must
 * resolve (symlinks followed, "..", relative to groved's working directory;
 * a file still to be made by its directory's realpath) inside m's directory
 * or a --checkpoint-dir.  GROVE_E_PERMISSION_DENIED naming what ("promote's
 * path") and the allowed directories otherwise, saying nothing of the file.
 * Any thread. */
grove_status grove__admin_path_check(srv_server *srv, const srv_model *m, const char *what,
                                     const char *path, grove_err *err);

/* conns.c: connection caps and idle timeouts for every listener.
 *
 * One plane per listener: a name for logs and metrics ("data", "admin",
 * "pub", "http"), a cap, whether idle connections are closed, and counters
 * that any thread bumps and /metrics reads. */
typedef struct srv_conns srv_conns;
typedef struct srv_plane {
  char name[16];
  size_t cap;
  bool idle_close; /* --idle-timeout applies */
  bool is_data;    /* its cap is --max-connections (for messages) */
  _Atomic size_t open;
  _Atomic uint64_t refused, evicted, idle_closed;
  nng_pipe_cb chain; /* the socket's own ADD_POST/REM_POST callback, or NULL */
  void *chain_arg;
  /* Closes connection id of this plane (any thread; it may close later);
   * NULL: id is an NNG pipe (nng_pipe_close).  sp.c's, set at start. */
  void (*close_fn)(void *arg, uint32_t id);
  void *close_arg;
  srv_conns *conns;
} srv_plane;
/* Raises the soft RLIMIT_NOFILE to the hard limit and splits it between a
 * reserve and the planes' caps (cfg.max_connections, clamped with a warning
 * when the limit does not leave room for it).  main, before anything opens a
 * descriptor it keeps. */
grove_status grove__conns_init(srv_server *srv, grove_err *err);
/* The cap a listener gets by default: data (every --listen URL together),
 * or one of the small planes (admin, PUB, HTTP). */
size_t grove__conns_default_cap(srv_server *srv, bool data);
/* A plane for a listener conns.c does not watch itself (http.c counts its
 * own connections in it); NULL when there are too many.  Start-up only. */
srv_plane *grove__conns_plane(srv_server *srv, const char *name, size_t cap, bool idle_close);
/* Caps the NNG socket s at cap connections (refused at NNG_PIPE_EV_ADD_PRE)
 * and, with idle_close, closes those idle for --idle-timeout.  It takes the
 * socket's pipe notifications: a socket that wants ADD_POST/REM_POST itself
 * passes its callback as chain.  Call before nng_listen; start-up only. */
grove_status grove__conns_watch(srv_server *srv, nng_socket s, const char *name, size_t cap,
                                bool idle_close, nng_pipe_cb chain, void *chain_arg,
                                grove_err *err);
/* A listener that is not NNG's (sp.c) tells conns.c of its connections
 * itself: admit a new one (id unique among the plane's open ones and never 0)
 * before reading from it, forget it once closed.  admit returns false when
 * the plane is at its cap with every connection busy (logged; the caller
 * closes it), and closes the quietest one (close_fn) to make room at the
 * cap.  Any thread. */
bool grove__conns_admit(srv_plane *pl, uint32_t id);
void grove__conns_forget(srv_plane *pl, uint32_t id);
/* n requests arrived on pipe_ids (delta +1; repeats allowed) or were
 * answered (-1): a pipe with a request in flight is never idle.  One lock
 * for all n (a worker's batch of replies).  Any thread. */
void grove__conns_busy(srv_server *srv, const uint32_t *pipe_ids, size_t n, int delta);
/* Starts the idle sweeper (when --idle-timeout is not 0). */
grove_status grove__conns_start(srv_server *srv, grove_err *err);
void grove__conns_stop(srv_server *srv);
void grove__conns_free(srv_server *srv);
void grove__conns_metrics(srv_server *srv, srv_text *b);

/* sp.c: the data plane's listeners read on the loop (--data-io loop): NNG's
 * SP wire protocol (TCP and IPC transports, rep0 over them) spoken by groved
 * itself, so that NNG req0 clients work unchanged while a request goes from
 * the socket to the batcher with no thread between.  start listens on
 * every --listen URL (main thread, before the loop runs; the loop thread is
 * the caller's); stop closes listeners and connections (loop thread, once
 * everything is sent: the drain's shut-down); free after the loop ended.
 * Requests arrive in srv_reqs whose deliver is sp.c's: any thread may
 * answer them; the replies are written on the loop. */
grove_status grove__sp_start(srv_server *srv, grove_err *err);
void grove__sp_stop(srv_server *srv);
void grove__sp_free(srv_server *srv);

/* rpc.c.  start opens the sockets and their contexts and listens on the
 * data plane's URLs; serve posts the contexts' receives (after the admin
 * plane listens and every handler is registered).  Main thread. */
grove_status grove__rpc_start(srv_server *srv, grove_err *err);
grove_status grove__rpc_serve(srv_server *srv, grove_err *err);
/* The handler of Grove__Request body case body (counted: whether its
 * answers count in grove_requests_total), the admin plane's gate, and what
 * wakes the loop.  Start-up only, before grove__rpc_serve. */
void grove__rpc_set_handler(srv_server *srv, int body, srv_rpc_handler fn, bool counted);
void grove__rpc_set_gate(srv_server *srv, bool (*gate)(srv_req *r));
void grove__rpc_set_wake(srv_server *srv, void (*wake)(srv_server *srv));
/* Closes the socket and waits until no NNG callback runs. */
void grove__rpc_stop(srv_server *srv);
/* nng_close(s), given CLOSE_WAIT_MS (rpc.c) to return: client/nng_close.c's
 * bounded close, the one libgrove-client uses too.  NNG 1.5.2's close can
 * deadlock while peers are connected (nanomsg/nng#1543; seen as a drained
 * groved that never exited).  It is only called on the way out,
 * after every reply was sent, so when the close does not return the process
 * says so (naming what, "the RPC socket") and ends at once with
 * srv->exit_code, leaving the kernel to close the sockets.  The loop thread,
 * or main's clean-up. */
void grove__nng_close_or_exit(srv_server *srv, nng_socket s, const char *what);
/* Answers r with an error status and message (any thread that owns r). */
void grove__rpc_reply_error(srv_req *r, grove_status s, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Sends an encoded reply for r (takes msg).  Counts the request under its
 * model with status s.  Any thread that owns r; r is NNG's afterwards. */
void grove__rpc_send(srv_req *r, nng_msg *msg, grove_status s);
/* Sends the replies of a list of requests linked by next, each with
 * reply/reply_status set (reply NULL: out of memory, not answered): NNG's
 * one after the other per connection, from NNG's threads; another origin's
 * through its deliver.  The caller (a worker) owns them all before
 * and none after. */
void grove__rpc_send_chain(srv_req *first);
/* Decodes the grove.Request in bytes (the caller keeps them) for r (srv,
 * deliver and pipe_id set) and dispatches it through the handler table: r
 * is answered now or handed to its handler.  The thread that owns r. */
void grove__rpc_dispatch(srv_req *r, const void *bytes, size_t len);
/* The largest message a data-plane connection may send: --max-request-bytes
 * plus a slack, so that a request a little over the limit is answered
 * INVALID_ARGUMENT while a hostile one is not buffered (its connection is
 * closed).  Any thread. */
size_t grove__rpc_recv_max(const srv_server *srv);
/* How many data-plane requests may be in flight at once: enough for every
 * queue to fill and every worker to hold a full batch of one-row requests
 * (so that RESOURCE_EXHAUSTED, not back-pressure, is what an overloaded
 * model's clients see).  NNG's contexts and sp.c's window.  After the
 * models loaded. */
size_t grove__rpc_max_inflight(const srv_server *srv);
/* Packs reply into a new nng_msg; NULL when out of memory. */
nng_msg *grove__rpc_pack(const Grove__Reply *reply);

/* lifecycle.c: groved's start, run (until drained) and clean-up, after the
 * flags were parsed (main thread).  Returns the exit status. */
int grove__server_run(srv_server *srv);

/* predict.c, status.c: register their RPCs (start-up). */
grove_status grove__predict_start(srv_server *srv, grove_err *err);
/* The Predict RPC's path for r, whose msg holds a predict (r->msg->predict:
 * the model, its inputs and timeout), however it came: finds the model,
 * refuses while draining or not loaded, checks the inputs and queues it
 * for the loop, or answers it (grove__rpc_reply_error: the origin's error
 * for another protocol's request).  r->t_recv set; the thread that owns r,
 * which is the predict path's afterwards. */
void grove__predict_submit(srv_req *r);
/* Counts r's answer with status s under its model (or srv.unrouted):
 * grove_requests_total when r->counted, and for an accepted predict
 * grove_request_latency_seconds, by r's protocol.  Any thread that owns r. */
void grove__metrics_answer(srv_server *srv, const srv_req *r, grove_status s);
grove_status grove__status_start(srv_server *srv, grove_err *err);

/* loop.c.  init creates the loop and the inbox; on_wake runs on the loop
 * after every wake-up.  stop closes the inbox's handle (loop thread, at
 * shutdown); close closes what is left and the loop (after uv_run). */
grove_status grove__loop_init(srv_server *srv, void (*on_wake)(srv_server *), grove_err *err);
void grove__loop_stop(srv_server *srv);
void grove__loop_close(srv_server *srv);
/* Any thread: queue r for the loop.  From the loop itself (sp.c's
 * connections) nothing is woken: every predict read in one iteration of
 * the loop is taken and scheduled together after that iteration's I/O
 * (a uv_check), so requests that arrived together batch together. */
void grove__inbox_push_req(srv_server *srv, srv_req *r);
/* Any thread (a worker): w finished its batch. */
void grove__inbox_push_done(srv_server *srv, srv_worker *w);
/* Any thread: wake the loop (for instance to re-check the drain). */
void grove__loop_wake(srv_server *srv);
/* Loop thread: everything queued since the last take (lists linked by next;
 * the caller owns them). */
void grove__inbox_take(srv_server *srv, srv_req **reqs, srv_worker **done);

/* loopjob.c: the loop-job queue.  start after grove__loop_init; close from
 * the shutdown (loop thread; the jobs not yet run are cancelled); free after
 * the loop ended. */
grove_status grove__loopjob_start(srv_server *srv, grove_err *err);
void grove__loopjob_close(srv_server *srv);
void grove__loopjob_free(srv_server *srv);
/* Runs fn(srv, arg) on the loop thread soon (any thread).  The job counts as
 * in progress until grove__loopjob_done; if the server shuts down first, fn
 * is never called and cancel(arg) is (cancel may be NULL).  Returns false,
 * and posts nothing, when out of memory. */
bool grove__loopjob_post(srv_server *srv, void (*fn)(srv_server *, void *), void (*cancel)(void *),
                         void *arg);
void grove__loopjob_done(srv_server *srv);
/* A job the loop thread starts itself (a SIGHUP's reload): in progress, as
 * a posted one, until grove__loopjob_done. */
void grove__loopjob_begin(srv_server *srv);
/* No job is in progress (loop thread; the drain waits). */
bool grove__loopjob_idle(srv_server *srv);
/* The loop is shutting down: jobs finishing in libuv's pool must not reply
 * (their requests are gone).  Any thread. */
bool grove__loopjob_closing(srv_server *srv);

/* batcher.c (loop thread).  init opens the batch hold's timer (after
 * grove__loop_init); stop closes its handle at shutdown; close its
 * descriptor after the loop has ended. */
grove_status grove__batcher_init(srv_server *srv, grove_err *err);
void grove__batcher_stop(srv_server *srv);
void grove__batcher_close(srv_server *srv);
/* Takes the inbox (loop.c): finished workers become idle, predicts are
 * queued (or answered: queue full). */
void grove__batcher_take_inbox(srv_server *srv);
/* Hands batches to idle workers: each idle one takes what is queued. */
void grove__batcher_schedule(srv_server *srv);
/* Nothing queued, nothing running, every worker idle. */
bool grove__batcher_idle(srv_server *srv);
/* The drain timed out: answers every queued (not yet computing) request
 * UNAVAILABLE, so that its client hears why rather than a closed socket.
 * Returns how many. */
size_t grove__batcher_fail_queued(srv_server *srv, int drain_timeout_ms);

/* http.c: groved's HTTP/1.1 listener (--http).  Its own endpoints
 * (/healthz, /readyz, /metrics) and the routes other parts register (oip.c's
 * /v2), each request answered on the HTTP thread now or later. */
typedef struct hconn hconn; /* one connection (http.c's) */
/* One request as a route sees it.  Everything is the connection's, valid
 * until the route's answer (grove__http_answer): the connection reads no
 * further request meanwhile, so a route may keep pointers into body. */
struct srv_hreq {
  const char *method; /* "GET", "HEAD", "POST", ... */
  const char *path;   /* the target without its query */
  const char *head;   /* the request head, for grove__http_header */
  size_t head_len;
  char *body; /* body_len bytes (+ a NUL), NULL without a body */
  size_t body_len;
  hconn *conn;
};
/* An answer.  body is malloc'd (taken) or NULL with static_body; extra holds
 * header lines ("Name: value\r\n" each) or is empty; done (optional) is
 * called on the HTTP thread once the answer was written or dropped (its
 * connection closed). */
struct srv_hres {
  uint16_t code;
  const char *ctype;
  char *body;
  const char *static_body;
  size_t len;
  char extra[192];
  void (*done)(void *arg);
  void *done_arg;
};
/* A route (srv_http_route) answers q now (fills res, returns true) or later
 * (returns false: the connection waits for grove__http_answer).  HTTP
 * thread. */
/* Requests whose path starts with prefix go to fn.  Start-up, before
 * grove__http_start. */
void grove__http_set_route(srv_server *srv, const char *prefix, srv_http_route fn);
/* The value of header name in q (case-insensitive name, blanks trimmed) in
 * buf (cut to n bytes); false when q has no such header.  HTTP thread. */
bool grove__http_header(const srv_hreq *q, const char *name, char *buf, size_t n);
/* Answers the request a route left pending on c (takes res's body).  HTTP
 * thread only. */
void grove__http_answer(hconn *c, srv_hres *res);
/* Work handed to the HTTP thread: fn(job) runs there soon (any thread may
 * post; the job is the poster's until fn runs, then fn's). */
typedef struct srv_http_job {
  void (*fn)(struct srv_http_job *job);
  struct srv_http_job *next;
} srv_http_job;
void grove__http_post(srv_server *srv, srv_http_job *job);
grove_status grove__http_start(srv_server *srv, grove_err *err);
void grove__http_stop(srv_server *srv);

/* oip.c: the Open Inference Protocol (KServe V2 REST) on the HTTP listener
 * (docs/protocol.md).  Registers its route; start-up, before
 * grove__http_start. */
grove_status grove__oip_start(srv_server *srv, grove_err *err);

/* metrics.c: Prometheus text exposition of everything; *out malloc'd. */
grove_status grove__metrics_render(srv_server *srv, char **out, size_t *len);
/* fn's families follow the server's own and those registered before
 * (start-up, main thread; the HTTP thread may render meanwhile). */
void grove__metrics_add_family(srv_server *srv, srv_metrics_fn fn);

/* reload.c: hot reload (docs/operations.md, "Hot reload").  start and
 * close run on the loop thread (start after grove__loop_init; close from
 * the shutdown, after grove__rpc_stop); free after the loop has ended. */
grove_status grove__reload_start(srv_server *srv, grove_err *err);
void grove__reload_close(srv_server *srv);
void grove__reload_free(srv_server *srv);
/* The Reload RPC (the NNG thread that owns r). */
void grove__reload_handle(srv_req *r);
/* What a reload is asked for: the model, and, each NULL or "" for the
 * default, the checkpoint and the model directory (borrowed for the call). */
typedef struct srv_reload_args {
  const char *model;
  const char *checkpoint;
  const char *model_dir;
  bool non_strict, in_place;
} srv_reload_args;
/* Starts the reload a asks for, answering r with its Reload reply when it is
 * done (or refused); the Reload RPC and train.c's Promote.  The NNG thread
 * (or a training session's) that owns r; r is the reload's afterwards. */
void grove__reload_request(srv_req *r, const srv_reload_args *a);
/* SIGHUP: reload every model from its directory (loop thread). */
void grove__reload_all(srv_server *srv, const char *why);
/* Loop thread, after workers came back: an in-place reload waiting for its
 * model's batches to finish may go on. */
void grove__reload_poll(srv_server *srv);
/* An in-place reload is changing m's tree (loop thread): nothing may read
 * the tree's tensors now. */
bool grove__reload_in_place_active(srv_server *srv, const srv_model *m);
/* The reload metric families, appended to b (the HTTP thread). */
void grove__reload_metrics(srv_server *srv, srv_text *b);

/* export.c: the ExportStateDict RPC (the NNG thread that owns r). */
grove_status grove__export_start(srv_server *srv, grove_err *err);
void grove__export_close(srv_server *srv); /* loop thread, at shutdown */
void grove__export_free(srv_server *srv);  /* releases every open export */
void grove__export_handle(srv_req *r);
/* The export metric families, appended to b (the HTTP thread). */
void grove__export_metrics(srv_server *srv, srv_text *b);

/* telemetry.c: forward-hook telemetry (docs/telemetry.md).  start after
 * the workers exist (main thread), stop after workers and RPCs stopped
 * (joins the publisher, closes the PUB socket), free after the workers'
 * batches were released. */
grove_status grove__telemetry_start(srv_server *srv, grove_err *err);
void grove__telemetry_stop(srv_server *srv);
void grove__telemetry_free(srv_server *srv);
/* telemetry_rpc.c: registers the hook RPCs and metric families (start-up,
 * after grove__telemetry_start). */
grove_status grove__telemetry_rpc_start(srv_server *srv, grove_err *err);
/* RegisterHook, RemoveHook, ListHooks (the NNG thread that owns r). */
void grove__telemetry_handle(srv_req *r);
/* Loop thread, at dispatch: a reference to m's hook table for the batch
 * (NULL: nothing watched).  Installs a table an RPC staged, and rebuilds the
 * table when m's current version is not the one it was resolved against. */
struct tel_table *grove__telemetry_acquire(srv_server *srv, srv_model *m);
/* Any thread; NULL is a no-op. */
void grove__telemetry_release(struct tel_table *t);
/* Loop thread, right after m->current was swapped (hot reload): resolves
 * m's hooks against the new tree now and logs patterns that stopped
 * matching (telemetry.unmatched).  Optional: acquire does the same at the
 * model's next dispatch. */
void grove__telemetry_on_version_swap(srv_server *srv, srv_model *m);
/* Worker thread: b's forward, with an observer when b's hook table watches
 * something this batch (statistics go to the worker's accumulators and,
 * every N batches, to the publisher); otherwise exactly grove_model_forward.
 * Same contract as grove_model_forward. */
grove_status grove__telemetry_forward(srv_worker *w, const srv_batch *b, grove_arena *arena,
                                      const grove_tensor *inputs, size_t n, grove_values *out,
                                      grove_err *err);
/* The hook metric families, appended to b (the HTTP thread). */
void grove__telemetry_metrics(srv_server *srv, srv_text *b);

/* train.c: training sessions (docs/training.md, "On the server").  start
 * with the other parts (main thread); stop after the workers and before
 * the socket closes (a running step finishes, queued requests are answered
 * UNAVAILABLE); free at the end. */
grove_status grove__training_start(srv_server *srv, grove_err *err);
void grove__training_stop(srv_server *srv);
void grove__training_free(srv_server *srv);
/* StartTraining, TrainStep, Evaluate, Promote, StopTraining (the NNG thread
 * that owns r; the reply comes from the session's thread). */
void grove__training_handle(srv_req *r);

/* status_text: "INVALID_ARGUMENT" for GROVE_E_INVALID_ARGUMENT, "OK". */
const char *grove__status_label(grove_status s);

/* A growing text buffer for the Prometheus exposition (metrics.c).  The
 * zero value is empty; p is malloc'd (NULL until the first write) and the
 * caller frees it.  A failed allocation sets oom, after which writes do
 * nothing: the caller checks oom once at the end.  One thread at a time. */
struct srv_text {
  char *p;
  size_t len, cap;
  bool oom;
};
void grove__text_printf(srv_text *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* n bytes of p appended as they are. */
void grove__text_append(srv_text *b, const void *p, size_t n);
/* s as a Prometheus label value (\, " and newline escaped) in buf, cut to
 * fit n bytes; returns buf.  Any thread. */
const char *grove__prom_label(const char *s, char *buf, size_t n);
/* One Prometheus histogram of one model: its _bucket lines (cumulative; le
 * the nb upper bounds, in the unit the metric is named in), _sum and _count.
 * labels is the text of the labels before le, escaped: model="digits" or
 * model="digits",protocol="oip".
 * buckets holds nb + 1 non-cumulative counts (the last is +Inf) that other
 * threads may be bumping.  One thread at a time per b. */
void grove__prom_histogram(srv_text *b, const char *name, const char *labels, const double *le,
                           int nb, const _Atomic uint64_t *buckets, double sum);

#endif
