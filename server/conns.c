/* conns.c: how many connections groved keeps, and for how long.
 *
 * Every connection costs a file descriptor, and a process that runs out of
 * them can no longer accept anything: not a predict, not /healthz, not an
 * admin command.  NNG 1.5.2 makes it worse: its HTTP server retries a failed
 * accept at once, so at EMFILE groved spins at 100% CPU (its SP transports
 * wait 10 ms between tries).  So groved never lets connections reach the
 * limit:
 *
 *   - at start the soft RLIMIT_NOFILE is raised to the hard one, and the
 *     limit is split into a reserve (model files, reload and export files,
 *     libuv, NNG's own descriptors) and one budget per plane: data (the
 *     --listen URLs, --max-connections), admin, telemetry PUB and HTTP, the
 *     small ones sized so that /healthz and the admin listener still answer
 *     when the data plane is full;
 *   - a plane at its cap makes room for a new connection by closing the one
 *     that has been quiet longest, with no request in flight (a peer that
 *     opens connections and sends nothing cannot lock out clients with
 *     requests to send, which redial transparently if they were the quiet
 *     ones); when every connection has a request in flight, the new one is
 *     refused.  Both happen at NNG_PIPE_EV_ADD_PRE, after NNG's accept and
 *     the SP handshake, before the socket sees the pipe: closing it there
 *     frees its descriptor at once;
 *   - a connection of a plane with an idle timeout that has no request in
 *     flight and has carried nothing for --idle-timeout seconds is closed by
 *     a sweeper thread.  Clients redial on their own (libgrove-client
 *     does), so this only reclaims descriptors of peers that went quiet.
 *
 * A TCP connection that never completes the SP handshake is not a pipe yet
 * and is not counted: NNG closes it after its 10 s negotiation timeout.
 *
 * Pipes are kept in one open-addressing table keyed by NNG's pipe id (ids
 * are unique in the process), guarded by one mutex: every operation on it is
 * O(1) but the sweep, which is O(table) once per sweep interval. */
#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include <nng/nng.h>

#include "base.h"
#include "server.h"

#define MAX_PLANES 8
/* Descriptors kept back for everything that is not a connection. */
#define RESERVE_MIN 64
/* The small planes (admin, PUB, HTTP): each gets this share of the limit,
 * within [SMALL_MIN, SMALL_MAX]. */
#define SMALL_SHARE 16
#define SMALL_MIN 8
#define SMALL_MAX 256
#define SMALL_PLANES 3
#define CLOSE_BATCH 64

/* One pipe.  Nodes live in a fixed pool; the hash table holds their
 * indices, so that the table's deletions (which move entries) never move a
 * node.  Links are node index + 1, 0 for none. */
typedef struct node {
  uint32_t id; /* NNG's pipe id; 0: a free node */
  uint8_t plane;
  bool closing;        /* conns.c closed it (evicted or idle); REM_POST to come */
  bool in_lru;         /* on its plane's list of pipes with nothing in flight */
  uint32_t busy;       /* requests received and not yet answered */
  int64_t last_ns;     /* last request received or answered, or the connect */
  uint32_t prev, next; /* the LRU list (head: most recent), or the free list */
} node;

struct srv_conns {
  pthread_mutex_t mu;
  node *nodes;
  uint32_t nnodes, free_head;
  /* pipe id -> node index + 1 (both as pointers; core/base's hash table),
   * reserved for nnodes at the start, so that adding never allocates */
  grove__pmap tab;
  size_t nplanes;
  srv_plane planes[MAX_PLANES];
  struct {
    uint32_t head, tail;
    size_t closing; /* pipes of the plane being closed by conns.c */
  } lru[MAX_PLANES];
  uint64_t fd_limit;
  size_t small_cap; /* each small plane's cap */
  size_t data_cap;
  int64_t idle_ns; /* 0: never */
  /* the sweeper */
  pthread_t thread;
  pthread_cond_t cv;
  bool thread_started, stopping;
};

/* How far past its cap a plane may be while the pipes it evicted close. */
static size_t slack_of(size_t cap) {
  return cap / 8 + 8;
}

/* ------------------------------------------------------------ budget */

static size_t clamp_sz(uint64_t v, size_t lo, size_t hi) {
  return v < lo ? lo : v > hi ? hi : (size_t)v;
}

/* Raises the soft descriptor limit to the hard one (as nginx's
 * worker_rlimit_nofile and systemd services do) and returns the limit in
 * force afterwards. */
static uint64_t raise_fd_limit(void) {
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return 1024;
  if (rl.rlim_cur != rl.rlim_max) {
    /* An unlimited hard limit cannot be the soft one (the kernel caps it at
     * fs.nr_open): ask for a generous finite one, then a modest one. */
    const rlim_t tries[] = {rl.rlim_max, (rlim_t)1 << 20, 65536};
    for (size_t i = 0; i < sizeof tries / sizeof tries[0]; i++) {
      if (tries[i] <= rl.rlim_cur || tries[i] == RLIM_INFINITY || tries[i] > rl.rlim_max) continue;
      struct rlimit want = {tries[i], rl.rlim_max};
      if (setrlimit(RLIMIT_NOFILE, &want) == 0) {
        rl.rlim_cur = tries[i];
        break;
      }
    }
  }
  return rl.rlim_cur == RLIM_INFINITY ? (uint64_t)1 << 20 : (uint64_t)rl.rlim_cur;
}

grove_status grove__conns_init(srv_server *srv, grove_err *err) {
  srv_conns *c = calloc(1, sizeof *c);
  if (!c) return grove_err_set(err, GROVE_E_NOMEM, "out of memory");
  srv->conns = c;
  pthread_mutex_init(&c->mu, NULL);
  pthread_cond_init(&c->cv, NULL);
  c->fd_limit = raise_fd_limit();
  c->small_cap = clamp_sz(c->fd_limit / SMALL_SHARE, SMALL_MIN, SMALL_MAX);
  uint64_t reserve = c->fd_limit / 8 > RESERVE_MIN ? c->fd_limit / 8 : RESERVE_MIN;
  /* Three small planes (admin, PUB, HTTP), each with the slack it may
   * run over its cap while evicted connections close. */
  uint64_t taken = reserve + SMALL_PLANES * ((uint64_t)c->small_cap + slack_of(c->small_cap));
  uint64_t room = c->fd_limit > taken ? c->fd_limit - taken : 0;
  /* The data cap plus its own slack (cap / 8 + 8) fits in the room. */
  size_t budget = room > 8 ? (size_t)((room - 8) * 8 / 9) : 0;
  if (budget == 0) {
    budget = 1;
    grove__slog(GROVE_LOG_WARN, "server.fd_limit_low",
                "the descriptor limit (%" PRIu64
                ", ulimit -n) leaves no room for connections "
                "beside the %" PRIu64
                " groved keeps for itself; serving one data connection "
                "at a time",
                c->fd_limit, taken);
  }
  size_t want = srv->cfg.max_connections;
  if (want == 0) {
    c->data_cap = budget;
  } else if (want > budget) {
    c->data_cap = budget;
    grove__slog(GROVE_LOG_WARN, "server.max_connections_clamped",
                "--max-connections %zu needs more descriptors than the limit of %" PRIu64
                " (ulimit -n) leaves beside groved's reserve of %" PRIu64 "; using %zu",
                want, c->fd_limit, taken, budget);
  } else {
    c->data_cap = want;
  }
  c->idle_ns = (int64_t)srv->cfg.idle_timeout_s * 1000000000;
  uint64_t nn = (uint64_t)c->data_cap + slack_of(c->data_cap) +
                (SMALL_PLANES + 1) * ((uint64_t)c->small_cap + slack_of(c->small_cap));
  c->nnodes = nn > UINT32_MAX / 4 ? UINT32_MAX / 4 : (uint32_t)nn;
  c->nodes = calloc(c->nnodes, sizeof *c->nodes);
  if (!c->nodes || !grove__pmap_reserve(&c->tab, c->nnodes))
    return grove_err_set(err, GROVE_E_NOMEM, "out of memory for the connection table");
  for (uint32_t i = 0; i < c->nnodes; i++) c->nodes[i].next = i + 2 <= c->nnodes ? i + 2 : 0;
  c->free_head = c->nnodes ? 1 : 0;
  grove__slog(GROVE_LOG_INFO, "server.connections",
              "at most %zu data connections (descriptor limit %" PRIu64
              "), %zu on each other listener; idle ones closed after %d s%s",
              c->data_cap, c->fd_limit, c->small_cap, srv->cfg.idle_timeout_s,
              srv->cfg.idle_timeout_s ? "" : " (never: --idle-timeout 0)");
  return GROVE_OK;
}

size_t grove__conns_default_cap(srv_server *srv, bool data) {
  return data ? srv->conns->data_cap : srv->conns->small_cap;
}

/* ------------------------------------------------------------ table */

static node *N(srv_conns *c, uint32_t link) {
  return &c->nodes[link - 1];
}

/* Pipe ids (never 0) and links are the table's keys and values. */
static const void *key_of(uint32_t id) {
  return (const void *)(uintptr_t)id;
}

/* Pipe id's link, or 0 (c->mu held, as for everything below). */
static uint32_t find(srv_conns *c, uint32_t id) {
  return (uint32_t)(uintptr_t)grove__pmap_get(&c->tab, key_of(id), NULL);
}

static void lru_unlink(srv_conns *c, uint32_t k) {
  node *e = N(c, k);
  if (!e->in_lru) return;
  if (e->prev)
    N(c, e->prev)->next = e->next;
  else
    c->lru[e->plane].head = e->next;
  if (e->next)
    N(c, e->next)->prev = e->prev;
  else
    c->lru[e->plane].tail = e->prev;
  e->prev = e->next = 0;
  e->in_lru = false;
}

static void lru_push(srv_conns *c, uint32_t k) {
  node *e = N(c, k);
  e->prev = 0;
  e->next = c->lru[e->plane].head;
  if (e->next)
    N(c, e->next)->prev = k;
  else
    c->lru[e->plane].tail = k;
  c->lru[e->plane].head = k;
  e->in_lru = true;
}

/* Adds pipe id to plane pl; false when the pool is empty. */
static bool add(srv_conns *c, uint32_t id, uint8_t pl) {
  uint32_t k = c->free_head;
  if (!k) return false;
  c->free_head = N(c, k)->next;
  *N(c, k) = (node){.id = id, .plane = pl, .last_ns = grove__now_ns()};
  /* Cannot fail: a node was free, so the table holds fewer than nnodes. */
  bool added = grove__pmap_put(&c->tab, key_of(id), (void *)(uintptr_t)k);
  assert(added);
  (void)added;
  lru_push(c, k);
  return true;
}

/* Marks the least recently active pipe of plane pl with nothing in flight
 * as closing and returns its id; 0 when every pipe is busy. */
static uint32_t take_lru(srv_conns *c, uint8_t pl) {
  uint32_t k = c->lru[pl].tail;
  if (!k) return 0;
  lru_unlink(c, k);
  N(c, k)->closing = true;
  c->lru[pl].closing++;
  return N(c, k)->id;
}

/* Closes connection id of plane pl: NNG's pipe, or through the plane's own
 * closer (sp.c's connections on the loop). */
static void close_in(const srv_plane *pl, uint32_t id) {
  if (pl->close_fn) {
    pl->close_fn(pl->close_arg, id);
    return;
  }
  /* NNG 1.5.2 has no lookup from an id: nng_pipe is the id itself. */
  nng_pipe p = NNG_PIPE_INITIALIZER;
  p.id = id;
  nng_pipe_close(p);
}

/* ------------------------------------------------------------ pipes */

bool grove__conns_admit(srv_plane *pl, uint32_t id) {
  /* At the cap, the new connection takes the place of the one that has
   * been quiet longest (closed, as an idle one would be): a peer that
   * opens connections and sends nothing cannot lock out clients that
   * have requests to send.  Only when every connection has a request in
   * flight (or the plane is already past its cap by the slack while the
   * evicted ones close) is the new one refused. */
  srv_conns *c = pl->conns;
  uint8_t pi = (uint8_t)(pl - c->planes);
  uint32_t victim = 0;
  bool ok = true;
  pthread_mutex_lock(&c->mu);
  size_t open = atomic_load(&pl->open);
  if (open - c->lru[pi].closing >= pl->cap)
    ok = open < pl->cap + slack_of(pl->cap) && (victim = take_lru(c, pi)) != 0;
  if (ok) ok = add(c, id, pi);
  if (ok) atomic_fetch_add(&pl->open, 1);
  pthread_mutex_unlock(&c->mu);
  if (victim) {
    atomic_fetch_add(&pl->evicted, 1);
    close_in(pl, victim);
  }
  if (!ok) {
    uint64_t n = atomic_fetch_add(&pl->refused, 1);
    /* The first refusal and then one in a thousand: a flood must not
     * turn into a flood of log lines. */
    if (n % 1000 == 0)
      grove__slog(GROVE_LOG_WARN, "server.connection_refused",
                  "%s listener: %zu connections open (the cap%s), each with a request in "
                  "flight; refusing new ones (%" PRIu64 " refused so far)",
                  pl->name, pl->cap, pl->is_data ? ", --max-connections" : "", n + 1);
  }
  return ok;
}

void grove__conns_forget(srv_plane *pl, uint32_t id) {
  srv_conns *c = pl->conns;
  pthread_mutex_lock(&c->mu);
  uint32_t k = find(c, id);
  if (k) {
    node *e = N(c, k);
    if (e->closing) c->lru[e->plane].closing--;
    lru_unlink(c, k);
    grove__pmap_del(&c->tab, key_of(id));
    e->id = 0;
    e->next = c->free_head;
    c->free_head = k;
    atomic_fetch_sub(&pl->open, 1);
  }
  pthread_mutex_unlock(&c->mu);
}

static void pipe_event(nng_pipe p, nng_pipe_ev ev, void *arg) {
  srv_plane *pl = arg;
  uint32_t id = (uint32_t)nng_pipe_id(p);
  if (ev == NNG_PIPE_EV_ADD_PRE) {
    /* Refused: closing it here frees its descriptor at once. */
    if (!grove__conns_admit(pl, id)) {
      nng_pipe_close(p);
      return;
    }
  } else if (ev == NNG_PIPE_EV_REM_POST) {
    grove__conns_forget(pl, id);
  }
  if (pl->chain && ev != NNG_PIPE_EV_ADD_PRE) pl->chain(p, ev, pl->chain_arg);
}

srv_plane *grove__conns_plane(srv_server *srv, const char *name, size_t cap, bool idle_close) {
  srv_conns *c = srv->conns;
  pthread_mutex_lock(&c->mu);
  srv_plane *pl = NULL;
  if (c->nplanes < MAX_PLANES) {
    pl = &c->planes[c->nplanes++];
    snprintf(pl->name, sizeof pl->name, "%s", name);
    pl->cap = cap;
    pl->idle_close = idle_close && c->idle_ns > 0;
    pl->is_data = cap == c->data_cap && strcmp(name, "data") == 0;
    pl->conns = c;
  }
  pthread_mutex_unlock(&c->mu);
  return pl;
}

grove_status grove__conns_watch(srv_server *srv, nng_socket s, const char *name, size_t cap,
                                bool idle_close, nng_pipe_cb chain, void *chain_arg,
                                grove_err *err) {
  srv_plane *pl = grove__conns_plane(srv, name, cap, idle_close);
  if (!pl) return grove_err_set(err, GROVE_E_INTERNAL, "too many listeners for conns.c");
  pl->chain = chain;
  pl->chain_arg = chain_arg;
  int rv;
  if ((rv = nng_pipe_notify(s, NNG_PIPE_EV_ADD_PRE, pipe_event, pl)) ||
      (rv = nng_pipe_notify(s, NNG_PIPE_EV_REM_POST, pipe_event, pl)) ||
      (chain && (rv = nng_pipe_notify(s, NNG_PIPE_EV_ADD_POST, pipe_event, pl))))
    return grove_err_set(err, GROVE_E_INTERNAL, "cannot watch the %s listener's connections: %s",
                         name, nng_strerror(rv));
  return GROVE_OK;
}

void grove__conns_busy(srv_server *srv, const uint32_t *pipe_ids, size_t n, int delta) {
  srv_conns *c = srv->conns;
  if (!c || n == 0) return;
  /* One lock and one clock read for a whole batch's replies (a worker's):
   * per reply, the workers and NNG's threads took turns at this mutex. */
  int64_t now = grove__now_ns();
  pthread_mutex_lock(&c->mu);
  for (size_t j = 0; j < n; j++) {
    if (pipe_ids[j] == 0) continue;
    uint32_t k = find(c, pipe_ids[j]);
    if (!k) continue;
    node *e = N(c, k);
    e->last_ns = now;
    if (delta > 0) {
      e->busy++;
      lru_unlink(c, k);
    } else if (e->busy > 0 && --e->busy == 0 && !e->closing) {
      lru_push(c, k);
    }
  }
  pthread_mutex_unlock(&c->mu);
}

/* ------------------------------------------------------------ idle sweep */

/* Closes the pipes idle for longer than the timeout; returns how many.
 * Each plane's list is oldest-last, so the sweep visits only what it closes. */
static size_t sweep(srv_conns *c) {
  size_t total = 0;
  for (size_t pi = 0; pi < c->nplanes; pi++) {
    if (!c->planes[pi].idle_close) continue;
    for (;;) {
      uint32_t ids[CLOSE_BATCH];
      size_t n = 0;
      int64_t now = grove__now_ns();
      pthread_mutex_lock(&c->mu);
      while (n < CLOSE_BATCH && c->lru[pi].tail &&
             now - N(c, c->lru[pi].tail)->last_ns >= c->idle_ns)
        ids[n++] = take_lru(c, (uint8_t)pi);
      pthread_mutex_unlock(&c->mu);
      for (size_t i = 0; i < n; i++) close_in(&c->planes[pi], ids[i]);
      atomic_fetch_add(&c->planes[pi].idle_closed, n);
      total += n;
      if (n < CLOSE_BATCH) break;
    }
  }
  return total;
}

static void *sweeper_main(void *arg) {
  srv_conns *c = arg;
  /* A quarter of the timeout, within [50 ms, 1 s]: an idle connection
   * lives at most that much past its timeout. */
  int64_t every = c->idle_ns / 4;
  if (every < 50000000) every = 50000000;
  if (every > 1000000000) every = 1000000000;
  pthread_mutex_lock(&c->mu);
  while (!c->stopping) {
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    int64_t ns = (int64_t)until.tv_nsec + every;
    until.tv_sec += (time_t)(ns / 1000000000);
    until.tv_nsec = (long)(ns % 1000000000);
    pthread_cond_timedwait(&c->cv, &c->mu, &until);
    if (c->stopping) break;
    pthread_mutex_unlock(&c->mu);
    size_t n = sweep(c);
    if (n)
      grove__slog(GROVE_LOG_DEBUG, "server.idle_closed",
                  "closed %zu connection%s idle for %" PRId64 " s", n, n == 1 ? "" : "s",
                  c->idle_ns / 1000000000);
    pthread_mutex_lock(&c->mu);
  }
  pthread_mutex_unlock(&c->mu);
  return NULL;
}

grove_status grove__conns_start(srv_server *srv, grove_err *err) {
  srv_conns *c = srv->conns;
  grove__metrics_add_family(srv, grove__conns_metrics);
  if (c->idle_ns <= 0) return GROVE_OK;
  int rv = pthread_create(&c->thread, NULL, sweeper_main, c);
  if (rv)
    return grove_err_set(err, GROVE_E_INTERNAL, "cannot start the idle sweeper: %s", strerror(rv));
  c->thread_started = true;
  return GROVE_OK;
}

void grove__conns_stop(srv_server *srv) {
  srv_conns *c = srv->conns;
  if (!c || !c->thread_started) return;
  pthread_mutex_lock(&c->mu);
  c->stopping = true;
  pthread_cond_signal(&c->cv);
  pthread_mutex_unlock(&c->mu);
  pthread_join(c->thread, NULL);
  c->thread_started = false;
}

void grove__conns_free(srv_server *srv) {
  srv_conns *c = srv->conns;
  if (!c) return;
  grove__conns_stop(srv);
  pthread_mutex_destroy(&c->mu);
  pthread_cond_destroy(&c->cv);
  grove__pmap_fini(&c->tab);
  free(c->nodes);
  free(c);
  srv->conns = NULL;
}

/* ------------------------------------------------------------ metrics */

void grove__conns_metrics(srv_server *srv, srv_text *b) {
  srv_conns *c = srv->conns;
  if (!c) return;
  grove__text_printf(b,
                     "# HELP groved_fd_limit The descriptor limit groved runs with (after "
                     "raising the soft limit to the hard one).\n"
                     "# TYPE groved_fd_limit gauge\ngroved_fd_limit %" PRIu64 "\n",
                     c->fd_limit);
  static const struct {
    const char *name, *type, *help;
  } fam[] = {
      {"groved_connections", "gauge", "Connections open, per listener."},
      {"groved_connections_max", "gauge", "The cap on connections, per listener."},
      {"groved_connections_refused_total", "counter",
       "Connections closed at once: their listener was at its cap, every connection busy."},
      {"groved_connections_evicted_total", "counter",
       "Quiet connections closed to make room for a new one at the cap."},
      {"groved_connections_idle_closed_total", "counter",
       "Connections closed after --idle-timeout without a request."},
  };
  for (size_t f = 0; f < sizeof fam / sizeof fam[0]; f++) {
    grove__text_printf(b, "# HELP %s %s\n# TYPE %s %s\n", fam[f].name, fam[f].help, fam[f].name,
                       fam[f].type);
    for (size_t i = 0; i < c->nplanes; i++) {
      const srv_plane *pl = &c->planes[i];
      uint64_t v = f == 0   ? (uint64_t)atomic_load(&pl->open)
                   : f == 1 ? (uint64_t)pl->cap
                   : f == 2 ? atomic_load(&pl->refused)
                   : f == 3 ? atomic_load(&pl->evicted)
                            : atomic_load(&pl->idle_closed);
      grove__text_printf(b, "%s{listener=\"%s\"} %" PRIu64 "\n", fam[f].name, pl->name, v);
    }
  }
}
