/* telemetry.c: groved's forward-hook telemetry (docs/telemetry.md).
 *
 * A hook (RegisterHook: model, pattern, kind, statistics, every N batches or
 * a sampling rate) asks for statistics of what matching modules compute on
 * live traffic.  The pieces, and the thread each runs on:
 *
 *   registry   every hook, guarded by tel->mu; RPCs (NNG threads) add and
 *              remove hooks, ListHooks reads them.
 *   tables     a model's hooks resolved against one version's tree: the
 *              (hook, module) targets and, sorted by module address, what a
 *              forward's observer (grove_observer, module.h) watches.  A
 *              table is immutable and refcounted.  A change builds a new
 *              table (copy on write) as "pending"; the loop installs it the
 *              next time it dispatches a batch of that model, and rebuilds
 *              the table itself when the model's version changed (hot
 *              reload), so hooks survive reloads.  A batch takes a
 *              reference to the table at dispatch, like its version.
 *   workers    a worker with a table that watches something this batch
 *              runs the forward with an observer; the observer's callback
 *              computes statistics of each watched module's output (or
 *              input) and adds them to the worker's own accumulators (no
 *              lock).  Every `every` observed batches an accumulator is
 *              copied into an interval and handed to the publisher through
 *              a briefly locked queue; a full queue drops it (counted).
 *              With no hook (or none sampled) the worker calls
 *              grove_model_forward exactly as before hooks existed.
 *   publisher  one thread encodes intervals as HookEvent and sends them on
 *              the NNG PUB socket (--pub), topic "MODEL/MODULE.PATH" + 0.
 *              NNG's PUB never blocks: a subscriber that does not keep up
 *              loses events inside NNG, which reports nothing, so the
 *              publisher compares what it sent with what each subscriber's
 *              connection transmitted (NNG's per-pipe statistics) and counts
 *              the difference beyond NNG's queue as dropped.
 */
#define _GNU_SOURCE /* pthread_setname_np */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <nng/nng.h>
#include <nng/protocol/pubsub0/pub.h>

#include "server.h"
#include "telemetry.h"

static int64_t now_unix_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* ================================================================ tables */

static void table_free(tel_table *t) {
  for (size_t i = 0; i < t->ntargets; i++) free(t->targets[i].path);
  free(t->targets);
  free(t->mods);
  free(t->kinds);
  free(t->first);
  free(t->count);
  free(t->order);
  grove__version_release(t->version);
  free(t);
}

void grove__telemetry_release(tel_table *t) {
  if (t && atomic_fetch_sub_explicit(&t->refs, 1, memory_order_acq_rel) == 1) table_free(t);
}

typedef struct sort_key {
  uintptr_t key;
  uint32_t idx;
} sort_key;

static int cmp_key(const void *a, const void *b) {
  const sort_key *x = a, *y = b;
  if (x->key != y->key) return x->key < y->key ? -1 : 1;
  return x->idx < y->idx ? -1 : x->idx > y->idx;
}

bool grove__tel_observes(const char *pattern, const grove_named_module *nm) {
  return !nm->module->inlined && grove_module_pattern_match(pattern, nm->name);
}

void grove__tel_free_names(char **names, size_t n) {
  for (size_t i = 0; i < n; i++) free(names[i]);
  free(names);
}

/* Builds the table of model mi's hooks against v (under tel->mu), updating
 * each hook's resolution.  *out is NULL when nothing matches (the model's
 * batches then run without observer).  log: say which hooks stopped (or
 * started again) matching, for a new version. */
static grove_status build_table(srv_telemetry *tel, size_t mi, srv_version *v, bool log,
                                tel_table **out) {
  *out = NULL;
  grove_err err = {0};
  grove_named_modules nm = {0};
  grove_status s = grove_module_named_modules(v->model->root, "", true, &nm, &err);
  if (s) return s;
  const char *mname = tel->srv->models[mi].name;
  size_t nt = 0;
  /* Resolve every hook of the model; remember the matches on the hook. */
  for (size_t h = 0; h < tel->nhooks && !s; h++) {
    tel_hook *hk = tel->hooks[h];
    if (hk->model != mi) continue;
    size_t cnt = 0;
    for (size_t i = 0; i < nm.n; i++)
      cnt += grove__tel_observes(hk->pattern, &nm.items[i]);
    char **names = cnt ? calloc(cnt, sizeof *names) : NULL;
    if (cnt && !names) {
      s = GROVE_E_NOMEM;
      break;
    }
    size_t k = 0;
    for (size_t i = 0; i < nm.n && k < cnt; i++)
      if (grove__tel_observes(hk->pattern, &nm.items[i])) {
        if (!(names[k++] = strdup(nm.items[i].name))) s = GROVE_E_NOMEM;
      }
    if (s) {
      grove__tel_free_names(names, cnt);
      break;
    }
    if (log && cnt == 0 && hk->nmodules > 0)
      grove__slog(GROVE_LOG_WARN, "telemetry.unmatched",
                  "hook %" PRIu64 " (%s '%s') matches no module of model %s version %" PRId64
                  "; it stays registered and is resolved again at the next version",
                  hk->id, grove__tel_kind_name(hk->spec.kind), hk->pattern, mname, v->number);
    else if (log && cnt > 0 && hk->nmodules == 0)
      grove__slog(GROVE_LOG_INFO, "telemetry.matched",
                  "hook %" PRIu64 " (%s '%s') matches %zu module%s of model %s version %" PRId64
                  " again",
                  hk->id, grove__tel_kind_name(hk->spec.kind), hk->pattern, cnt,
                  cnt == 1 ? "" : "s", mname, v->number);
    grove__tel_free_names(hk->modules, hk->nmodules);
    hk->modules = names;
    hk->nmodules = cnt;
    hk->version = v->number;
    nt += cnt;
  }
  tel_table *t = NULL;
  sort_key *keys = NULL;
  if (!s && nt > 0) {
    t = calloc(1, sizeof *t);
    keys = calloc(nt, sizeof *keys);
    if (!t || !keys || !(t->targets = calloc(nt, sizeof *t->targets)) ||
        !(t->mods = calloc(nt, sizeof *t->mods)) || !(t->kinds = calloc(nt, 1)) ||
        !(t->first = calloc(nt, sizeof *t->first)) || !(t->count = calloc(nt, sizeof *t->count)) ||
        !(t->order = calloc(nt, sizeof *t->order)))
      s = GROVE_E_NOMEM;
  }
  if (!s && t) {
    atomic_init(&t->refs, 1);
    t->gen = ++tel->next_gen;
    t->model = mi;
    grove__version_retain(v);
    t->version = v;
    for (size_t h = 0; h < tel->nhooks && !s; h++) {
      tel_hook *hk = tel->hooks[h];
      if (hk->model != mi) continue;
      for (size_t k = 0; k < hk->nmodules && !s; k++) {
        tel_target *tg = &t->targets[t->ntargets];
        tg->hook_id = hk->id;
        tg->ctr = hk->ctr;
        tg->spec = hk->spec;
        tg->module = grove_module_find(v->model->root, hk->modules[k]);
        if (!(tg->path = strdup(hk->modules[k]))) s = GROVE_E_NOMEM;
        keys[t->ntargets] = (sort_key){(uintptr_t)tg->module, (uint32_t)t->ntargets};
        t->ntargets++;
      }
    }
  }
  if (!s && t) {
    /* A module reachable twice (shared) is one object: the observer sees
     * it under the first path named_modules yields, which is the one
     * resolved, so grove_module_find above finds that same object. */
    qsort(keys, t->ntargets, sizeof *keys, cmp_key);
    for (size_t i = 0; i < t->ntargets; i++) {
      t->order[i] = keys[i].idx;
      if (t->nmods == 0 || (uintptr_t)t->mods[t->nmods - 1] != keys[i].key) {
        t->mods[t->nmods] = t->targets[keys[i].idx].module;
        t->first[t->nmods] = (uint32_t)i;
        t->nmods++;
      }
      size_t g = t->nmods - 1;
      t->count[g]++;
      t->kinds[g] |= (unsigned char)t->targets[keys[i].idx].spec.kind;
    }
  }
  free(keys);
  grove_named_modules_fini(&nm);
  if (s) {
    if (t) table_free(t);
    return s;
  }
  *out = t;
  return GROVE_OK;
}

/* Loop thread: rebuilds m's table against its current version. */
static void rebuild_current(srv_telemetry *tel, srv_model *m, bool log) {
  size_t mi = m->index;
  srv_version *v = m->current;
  tel_table *t = NULL;
  pthread_mutex_lock(&tel->mu);
  grove_status s = v ? build_table(tel, mi, v, log, &t) : GROVE_OK;
  pthread_mutex_unlock(&tel->mu);
  if (s)
    grove__slog(GROVE_LOG_ERROR, "telemetry.table",
                "model %s: cannot resolve its hooks (%s); its batches run unobserved", m->name,
                grove_status_name(s));
  grove__telemetry_release(tel->current[mi]);
  tel->current[mi] = t;
  tel->current_num[mi] = v ? v->number : 0;
}

tel_table *grove__telemetry_acquire(srv_server *srv, srv_model *m) {
  srv_telemetry *tel = srv->telemetry;
  if (!tel) return NULL;
  size_t mi = m->index;
  if (atomic_load_explicit(&tel->dirty[mi], memory_order_acquire)) {
    pthread_mutex_lock(&tel->mu);
    if (tel->has_pending[mi]) {
      grove__telemetry_release(tel->current[mi]);
      tel->current[mi] = tel->pending[mi];
      tel->current_num[mi] = tel->pending_num[mi];
      tel->pending[mi] = NULL;
      tel->has_pending[mi] = false;
    }
    atomic_store(&tel->dirty[mi], false);
    pthread_mutex_unlock(&tel->mu);
  }
  /* A version swapped without grove__telemetry_on_version_swap (or while a
   * pending table was being built against the old one) is caught here. */
  if (atomic_load_explicit(&tel->model_hooks[mi], memory_order_relaxed) > 0 && m->current &&
      tel->current_num[mi] != m->current->number)
    rebuild_current(tel, m, true);
  tel_table *t = tel->current[mi];
  if (t) atomic_fetch_add_explicit(&t->refs, 1, memory_order_relaxed);
  return t;
}

void grove__telemetry_on_version_swap(srv_server *srv, srv_model *m) {
  srv_telemetry *tel = srv->telemetry;
  if (!tel) return;
  if (atomic_load(&tel->model_hooks[m->index]) > 0 || tel->current[m->index])
    rebuild_current(tel, m, true);
}

grove_status grove__tel_stage_table(srv_telemetry *tel, size_t mi, srv_version *v) {
  tel_table *t = NULL;
  grove_status s = build_table(tel, mi, v, false, &t);
  if (s) return s;
  grove__telemetry_release(tel->pending[mi]);
  tel->pending[mi] = t;
  tel->pending_num[mi] = v->number;
  tel->has_pending[mi] = true;
  atomic_store_explicit(&tel->dirty[mi], true, memory_order_release);
  return GROVE_OK;
}

/* ================================================================ accumulators */

static void acc_reset(tel_acc *a) {
  a->batches = a->rows = 0;
  a->last_seq = 0;
  a->start_us = a->end_us = 0;
  grove__tel_basic_init(&a->b);
  if (a->hist) memset(a->hist, 0, a->hist_cap * sizeof *a->hist);
  a->below = a->above = 0;
  a->feat.rows = 0;
  a->feat.nfeat = 0;
  a->feat_off = false;
  a->ndim = 0;
}

static void acc_fini(tel_acc *a) {
  free(a->path);
  free(a->hist);
  free(a->feat_mem);
  memset(a, 0, sizeof *a);
}

static void feat_point(tel_acc *a) {
  size_t c = a->feat_cap;
  a->feat.mean = a->feat_mem;
  a->feat.m2 = a->feat_mem + c;
  a->feat.s1 = a->feat_mem + 2 * c;
  a->feat.s2 = a->feat_mem + 3 * c;
  a->feat.k = a->feat_mem + 4 * c;
}

/* Room for n features; false when out of memory. */
static bool feat_reserve(tel_acc *a, size_t n) {
  if (a->feat_cap >= n) return true;
  double *p = malloc(5 * n * sizeof *p);
  if (!p) return false;
  free(a->feat_mem);
  a->feat_mem = p;
  a->feat_cap = n;
  feat_point(a);
  return true;
}

static bool hist_reserve(tel_acc *a, size_t n) {
  if (a->hist_cap >= n) return true;
  uint64_t *p = calloc(n, sizeof *p);
  if (!p) return false;
  free(a->hist);
  a->hist = p;
  a->hist_cap = n;
  return true;
}

static bool path_set(tel_acc *a, const char *path) {
  size_t n = strlen(path) + 1;
  if (a->path_cap < n) {
    char *p = malloc(n);
    if (!p) return false;
    free(a->path);
    a->path = p;
    a->path_cap = n;
  }
  memcpy(a->path, path, n);
  return true;
}

/* A worker's accumulator for target tg, empty. */
static bool acc_init(tel_acc *a, const tel_target *tg) {
  memset(a, 0, sizeof *a);
  a->hook_id = tg->hook_id;
  a->ctr = tg->ctr;
  a->spec = tg->spec;
  if (!path_set(a, tg->path) || !hist_reserve(a, tg->spec.bins)) return false;
  acc_reset(a);
  return true;
}

/* dst (an interval) becomes a copy of src's statistics and identity. */
static bool acc_copy(tel_acc *dst, const tel_acc *src) {
  if (!path_set(dst, src->path) || !hist_reserve(dst, src->spec.bins)) return false;
  int64_t nf = src->feat_off ? 0 : src->feat.nfeat;
  if (nf > 0 && !feat_reserve(dst, (size_t)nf)) return false;
  dst->hook_id = src->hook_id;
  dst->ctr = src->ctr;
  dst->spec = src->spec;
  dst->version = src->version;
  dst->batches = src->batches;
  dst->rows = src->rows;
  dst->start_us = src->start_us;
  dst->end_us = src->end_us;
  dst->b = src->b;
  if (src->spec.bins) memcpy(dst->hist, src->hist, src->spec.bins * sizeof *dst->hist);
  dst->below = src->below;
  dst->above = src->above;
  dst->feat_off = src->feat_off;
  dst->feat.nfeat = nf;
  dst->feat.rows = src->feat.rows;
  if (nf > 0) {
    memcpy(dst->feat.mean, src->feat.mean, (size_t)nf * sizeof(double));
    memcpy(dst->feat.m2, src->feat.m2, (size_t)nf * sizeof(double));
  }
  dst->ndim = src->ndim;
  memcpy(dst->shape, src->shape, sizeof dst->shape);
  return true;
}

/* ================================================================ hand-off */

/* A list of finished intervals a worker collects during one batch, handed
 * over under one lock. */
typedef struct handoff {
  tel_acc *head, *tail;
  size_t n;
} handoff;

/* Copies a into a fresh interval for the publisher and empties a.  Worker
 * thread.  Intervals come from the free list the publisher refills; the
 * heap is touched only while that list is empty (the first intervals). */
static void finish(srv_telemetry *tel, tel_worker *tw, size_t model, tel_acc *a, handoff *h) {
  if (a->batches == 0) return;
  tel_acc *it = tw->spare;
  if (it) {
    tw->spare = it->next;
    tw->nspare--;
  } else {
    it = calloc(1, sizeof *it);
  }
  if (!it || !acc_copy(it, a)) {
    if (it) {
      acc_fini(it);
      free(it);
    }
    atomic_fetch_add(&tel->dropped_queue, 1);
    atomic_fetch_add(&a->ctr->dropped, 1);
  } else {
    it->next = NULL;
    it->model = model;
    it->worker = tw->id;
    if (h->tail)
      h->tail->next = it;
    else
      h->head = it;
    h->tail = it;
    h->n++;
  }
  acc_reset(a);
}

enum { SPARE_MAX = 64 };

static void handoff_push(srv_telemetry *tel, tel_worker *tw, handoff *h) {
  if (!h->head) return;
  pthread_mutex_lock(&tel->q_mu);
  /* A publisher that fell behind loses the newest intervals, never
   * predict's time: the worker does not wait. */
  while (h->head && tel->q_len >= TEL_QUEUE_MAX) {
    tel_acc *it = h->head;
    h->head = it->next;
    atomic_fetch_add(&tel->dropped_queue, 1);
    atomic_fetch_add(&it->ctr->dropped, 1);
    it->next = tel->free_items;
    tel->free_items = it;
    tel->nfree++;
  }
  for (tel_acc *it = h->head; it; it = it->next) tel->q_len++;
  if (h->head) {
    if (tel->q_tail)
      tel->q_tail->next = h->head;
    else
      tel->q_head = h->head;
    tel->q_tail = h->tail;
    pthread_cond_signal(&tel->q_cv);
  }
  while (tel->free_items && tw->nspare < SPARE_MAX) {
    tel_acc *it = tel->free_items;
    tel->free_items = it->next;
    tel->nfree--;
    it->next = tw->spare;
    tw->spare = it;
    tw->nspare++;
  }
  pthread_mutex_unlock(&tel->q_mu);
  *h = (handoff){0};
}

/* ================================================================ workers */

static bool has_hook(const tel_table *t, uint64_t id) {
  for (size_t i = 0; t && i < t->ntargets; i++)
    if (t->targets[i].hook_id == id) return true;
  return false;
}

/* Lines the worker's accumulators up with table t: a (hook, module) that
 * goes on keeps its running interval; one whose hook goes on but whose
 * module is gone (a new version) hands its partial interval over; one whose
 * hook was removed is dropped.  Allocates (a table change is rare). */
static bool switch_table(srv_telemetry *tel, tel_worker *tw, tel_wmodel *wm, const tel_table *t,
                         size_t model, handoff *h) {
  size_t n = t ? t->ntargets : 0;
  tel_acc *accs = n ? calloc(n, sizeof *accs) : NULL;
  unsigned char *active = n ? calloc(n, 1) : NULL;
  bool *taken = wm->nacc ? calloc(wm->nacc, sizeof *taken) : NULL;
  if (n && (!accs || !active)) goto nomem;
  if (wm->nacc && !taken) goto nomem;
  for (size_t j = 0; j < n; j++) {
    const tel_target *tg = &t->targets[j];
    for (size_t i = 0; i < wm->nacc; i++) {
      tel_acc *o = &wm->accs[i];
      if (!taken[i] && o->hook_id == tg->hook_id && strcmp(o->path, tg->path) == 0) {
        accs[j] = *o;
        memset(o, 0, sizeof *o);
        taken[i] = true;
        break;
      }
    }
    if (!accs[j].path && !acc_init(&accs[j], tg)) goto nomem;
  }
  for (size_t i = 0; i < wm->nacc; i++) {
    if (taken && taken[i]) continue;
    if (has_hook(t, wm->accs[i].hook_id)) finish(tel, tw, model, &wm->accs[i], h);
    acc_fini(&wm->accs[i]);
  }
  free(wm->accs);
  free(wm->active);
  free(taken);
  wm->accs = accs;
  wm->active = active;
  wm->nacc = n;
  wm->gen = t ? t->gen : 0;
  return true;
nomem:
  for (size_t j = 0; accs && j < n; j++) acc_fini(&accs[j]);
  free(accs);
  free(active);
  free(taken);
  return false;
}

/* Worker thread: a hook that samples takes this batch when a hash of the
 * worker's batch count and the hook falls under its rate. */
static bool sampled(const tel_spec *sp, uint64_t seq, uint64_t hook_id, uint32_t worker) {
  if (sp->sample_rate >= 1.0) return true;
  uint64_t x = seq * 0x9E3779B97F4A7C15ull ^ hook_id * 0xBF58476D1CE4E5B9ull ^ worker;
  x ^= x >> 31;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 29;
  return (double)(x >> 11) * (1.0 / 9007199254740992.0) < sp->sample_rate;
}

typedef struct call_ctx {
  tel_basic *b;
  tel_acc *a;
} call_ctx;

static void chunk_basic(void *ctx, const float *x, int64_t n, int64_t flat0) {
  (void)flat0;
  grove__tel_basic_add(((call_ctx *)ctx)->b, x, n);
}

static void chunk_hist(void *ctx, const float *x, int64_t n, int64_t flat0) {
  (void)flat0;
  tel_acc *a = ((call_ctx *)ctx)->a;
  grove__tel_hist_add(a->hist, a->spec.bins, a->spec.lo, a->spec.hi, &a->below, &a->above, x, n);
}

static void chunk_feat(void *ctx, const float *x, int64_t n, int64_t flat0) {
  grove__tel_feat_add_stream(&((call_ctx *)ctx)->a->feat, x, n, flat0);
}

static void add_features(tel_worker *tw, tel_acc *a, const grove_tensor *x) {
  if (a->feat_off) return;
  if (x->ndim != 2 || x->shape[1] <= 0 || x->shape[1] > TEL_MAX_FEATURES ||
      (a->feat.rows > 0 && a->feat.nfeat != x->shape[1])) {
    a->feat_off = true;
    return;
  }
  int64_t F = x->shape[1], R = x->shape[0];
  if (!feat_reserve(a, (size_t)F)) {
    a->feat_off = true;
    return;
  }
  a->feat.nfeat = F;
  if (x->dtype == GROVE_F32 && grove_tensor_is_contiguous(x)) {
    grove__tel_feat_add_rows(&a->feat, x->data, R);
  } else {
    call_ctx c = {.a = a};
    grove__tel_tensor_chunks(x, tw->chunk, TEL_CHUNK, chunk_feat, &c);
    a->feat.rows += (uint64_t)R;
  }
}

/* The observer's callback (grove_observer.fn), on the worker thread in the
 * middle of the forward. */
static void observe(void *ctx, size_t index, grove_observe_kind kind, const grove_module *m,
                    const grove_values *v) {
  (void)m;
  tel_worker *tw = ctx;
  const tel_table *t = tw->cur;
  tel_wmodel *wm = tw->wm;
  if (v->n < 1 || index >= t->nmods) return;
  const grove_tensor *x = &v->v[0];
  tel_basic bb;
  bool have = false;
  for (uint32_t k = t->first[index], e = k + t->count[index]; k < e; k++) {
    uint32_t i = t->order[k];
    if (!wm->active[i] || t->targets[i].spec.kind != (int)kind) continue;
    tel_acc *a = &wm->accs[i];
    if (!have) {
      /* The statistics of one call are computed once, whatever the number
       * of hooks watching the module. */
      grove__tel_basic_init(&bb);
      call_ctx c = {.b = &bb};
      grove__tel_tensor_chunks(x, tw->chunk, TEL_CHUNK, chunk_basic, &c);
      have = true;
    }
    if (a->last_seq != wm->seq) {
      a->last_seq = wm->seq;
      a->batches++;
      a->rows += (uint64_t)tw->rows;
      if (!a->start_us) a->start_us = tw->t0_us;
      a->version = tw->version;
    }
    grove__tel_basic_merge(&a->b, &bb);
    if (a->spec.bins) {
      call_ctx c = {.a = a};
      grove__tel_tensor_chunks(x, tw->chunk, TEL_CHUNK, chunk_hist, &c);
    }
    if (a->spec.per_feature) add_features(tw, a, x);
    a->ndim = x->ndim;
    memcpy(a->shape, x->shape, sizeof(int64_t) * (size_t)x->ndim);
  }
}

grove_status grove__telemetry_forward(srv_worker *w, const srv_batch *b, grove_arena *arena,
                                      const grove_tensor *inputs, size_t n, grove_values *out,
                                      grove_err *err) {
  srv_telemetry *tel = w->srv->telemetry;
  const grove_model *gm = b->version->model;
  const tel_table *t = b->hooks;
  tel_worker *tw = tel && w->id < tel->nworkers ? &tel->workers[w->id] : NULL;
  tel_wmodel *wm = tw && b->model->index < tel->nmodels ? &tw->models[b->model->index] : NULL;
  handoff h = {0};
  if (!wm) tw = NULL;
  if (wm && wm->gen != (t ? t->gen : 0)) {
    if (!switch_table(tel, tw, wm, t, b->model->index, &h)) {
      grove__slog(GROVE_LOG_ERROR, "telemetry.nomem",
                  "worker %d: no memory for hook accumulators; this batch runs unobserved", w->id);
      t = NULL;
    }
  }
  /* The table is one the loop built against this batch's version (it
   * rebuilds on a version change before dispatching). */
  if (t && t->version->model != gm) t = NULL;
  bool any = false;
  if (t && tw) {
    wm->seq++;
    for (size_t i = 0; i < t->ntargets; i++) {
      const tel_target *tg = &t->targets[i];
      tel_acc *a = &wm->accs[i];
      wm->active[i] = sampled(&tg->spec, wm->seq, tg->hook_id, tw->id);
      any |= wm->active[i];
      /* An in-place reload keeps the tree and changes the version: the
       * interval of the old version ends here. */
      if (wm->active[i] && a->batches && a->version != b->version->number)
        finish(tel, tw, b->model->index, a, &h);
    }
  }
  grove_status s;
  if (!any) {
    if (tw) handoff_push(tel, tw, &h);
    return grove_model_forward(gm, arena, inputs, n, out, err);
  }
  tw->cur = t;
  tw->wm = wm;
  tw->rows = b->rows;
  tw->version = b->version->number;
  tw->t0_us = now_unix_us();
  tw->obs = (grove_observer){
      .modules = t->mods, .kinds = t->kinds, .n = t->nmods, .fn = observe, .ctx = tw};
  s = grove_model_check_inputs(gm, inputs, n, err);
  if (!s) {
    grove_values in = {.n = (int)n};
    for (size_t i = 0; i < n; i++) in.v[i] = inputs[i];
    grove_fwd f = {.arena = arena, .err = err, .observer = &tw->obs};
    *out = (grove_values){0};
    s = grove_module_forward(gm->root, &f, &in, out);
  }
  int64_t t1 = now_unix_us();
  for (size_t i = 0; i < t->ntargets; i++) {
    tel_acc *a = &wm->accs[i];
    if (!wm->active[i] || a->last_seq != wm->seq) continue;
    a->end_us = t1;
    if (a->batches >= a->spec.every) finish(tel, tw, b->model->index, a, &h);
  }
  tw->cur = NULL;
  tw->wm = NULL;
  handoff_push(tel, tw, &h);
  return s;
}

/* ================================================================ publisher */

static uint64_t next_seq(srv_telemetry *tel, uint64_t hook_id, const char *path) {
  uint64_t hsh = hook_id * 0x9E3779B97F4A7C15ull;
  for (const char *p = path; *p; p++) hsh = (hsh ^ (unsigned char)*p) * 0x100000001B3ull;
  tel_seq **b = &tel->seqs[hsh % TEL_SEQ_BUCKETS];
  for (tel_seq *e = *b; e; e = e->next)
    if (e->hook_id == hook_id && strcmp(e->path, path) == 0) return ++e->seq;
  size_t len = strlen(path) + 1;
  tel_seq *e = malloc(sizeof *e + len);
  if (!e) return 0; /* no gap detection for it; the event still goes */
  e->hook_id = hook_id;
  e->seq = 1;
  memcpy(e->path, path, len);
  e->next = *b;
  *b = e;
  return 1;
}

/* Forgets the sequence numbers of removed hooks (publisher thread). */
static void sweep_seqs(srv_telemetry *tel) {
  for (size_t i = 0; i < TEL_SEQ_BUCKETS; i++) {
    tel_seq **pp = &tel->seqs[i];
    while (*pp) {
      tel_seq *e = *pp;
      bool live = false;
      pthread_mutex_lock(&tel->mu);
      for (size_t h = 0; h < tel->nhooks && !live; h++) live = tel->hooks[h]->id == e->hook_id;
      pthread_mutex_unlock(&tel->mu);
      if (live) {
        pp = &e->next;
      } else {
        *pp = e->next;
        free(e);
      }
    }
  }
}

static void publish(srv_telemetry *tel, tel_acc *it) {
  srv_model *m = &tel->srv->models[it->model];
  Grove__HookEvent ev = GROVE__HOOK_EVENT__INIT;
  ev.model = m->name;
  ev.version = it->version;
  ev.module = it->path;
  ev.hook_id = it->hook_id;
  ev.kind = it->spec.kind == GROVE_OBSERVE_PRE ? GROVE__HOOK_KIND__HOOK_FORWARD_PRE
                                               : GROVE__HOOK_KIND__HOOK_FORWARD;
  ev.batches = it->batches;
  ev.rows = it->rows;
  ev.count = it->b.count;
  bool fin = it->b.finite > 0;
  ev.mean = fin ? it->b.mean : 0;
  ev.std = grove__tel_basic_std(&it->b);
  ev.min = fin ? it->b.min : 0;
  ev.max = fin ? it->b.max : 0;
  ev.abs_mean = fin ? it->b.abs_sum / (double)it->b.finite : 0;
  ev.zero_fraction = it->b.count ? (double)it->b.zeros / (double)it->b.count : 0;
  ev.nan_count = it->b.nans;
  ev.inf_count = it->b.infs;
  if (it->spec.bins) {
    ev.n_histogram = it->spec.bins;
    ev.histogram = it->hist;
    ev.histogram_min = it->spec.lo;
    ev.histogram_max = it->spec.hi;
    ev.histogram_below = it->below;
    ev.histogram_above = it->above;
  }
  size_t nf = it->feat_off ? 0 : (size_t)it->feat.nfeat;
  if (nf > tel->std_cap) {
    double *p = realloc(tel->std_buf, nf * sizeof *p);
    if (p) {
      tel->std_buf = p;
      tel->std_cap = nf;
    } else {
      nf = 0;
    }
  }
  if (nf) {
    for (size_t j = 0; j < nf; j++) tel->std_buf[j] = grove__tel_feat_std(&it->feat, (int64_t)j);
    ev.n_feature_mean = ev.n_feature_std = nf;
    ev.feature_mean = it->feat.mean;
    ev.feature_std = tel->std_buf;
  }
  ev.start_unix_us = it->start_us;
  ev.end_unix_us = it->end_us;
  ev.sequence = next_seq(tel, it->hook_id, it->path);
  ev.worker = it->worker;
  ev.n_shape = (size_t)it->ndim;
  ev.shape = it->shape;

  size_t ml = strlen(m->name), pl = strlen(it->path);
  size_t tl = ml + 1 + pl + 1;
  size_t body = grove__hook_event__get_packed_size(&ev);
  nng_msg *msg;
  if (nng_msg_alloc(&msg, tl + body) != 0) {
    atomic_fetch_add(&tel->dropped_queue, 1);
    atomic_fetch_add(&it->ctr->dropped, 1);
    return;
  }
  unsigned char *p = nng_msg_body(msg);
  memcpy(p, m->name, ml);
  p[ml] = '/';
  memcpy(p + ml + 1, it->path, pl);
  p[ml + 1 + pl] = 0;
  grove__hook_event__pack(&ev, p + tl);
  /* PUB never waits for a subscriber: it queues per connection and drops
   * the oldest when a queue is full. */
  if (nng_sendmsg(tel->pub, msg, NNG_FLAG_NONBLOCK) != 0) {
    nng_msg_free(msg);
    atomic_fetch_add(&tel->dropped_queue, 1);
    atomic_fetch_add(&it->ctr->dropped, 1);
    return;
  }
  atomic_fetch_add(&tel->sent, 1);
  atomic_fetch_add(&tel->published[it->model], 1);
  atomic_fetch_add(&it->ctr->published, 1);
}

static uint64_t stat_u64(nng_stat *scope, const char *name, bool *ok) {
  for (nng_stat *s = nng_stat_child(scope); s; s = nng_stat_next(s))
    if (strcmp(nng_stat_name(s), name) == 0) return nng_stat_value(s);
  *ok = false;
  return 0;
}

/* Counts what slow subscribers lost inside NNG: of the events sent since a
 * subscriber connected, those its connection has not transmitted beyond
 * what NNG may still hold for it (its queue plus one in flight) were
 * dropped.  A lower bound; publisher thread. */
static void poll_subscribers(srv_telemetry *tel, int64_t now) {
  if (tel->stats_unavailable || atomic_load(&tel->subscribers) <= 0) return;
  uint64_t sent = atomic_load(&tel->sent);
  if (now - tel->last_poll_ns < TEL_POLL_NS || sent == tel->polled_sent) return;
  tel->last_poll_ns = now;
  tel->polled_sent = sent;
  nng_stat *root;
  if (nng_stats_get(&root) != 0) {
    tel->stats_unavailable = true;
    grove__slog(GROVE_LOG_INFO, "telemetry.no_stats",
                "NNG keeps no statistics here: events a slow subscriber loses inside NNG are "
                "not counted");
    return;
  }
  pthread_mutex_lock(&tel->pipe_mu);
  for (nng_stat *s = nng_stat_child(root); s; s = nng_stat_next(s)) {
    if (strcmp(nng_stat_name(s), "pipe") != 0) continue;
    bool ok = true;
    uint64_t id = stat_u64(s, "id", &ok), tx = stat_u64(s, "tx_msgs", &ok);
    if (!ok) continue;
    for (size_t i = 0; i < tel->npipes; i++) {
      tel_pipe *p = &tel->pipes[i];
      if (p->id != (uint32_t)id) continue;
      uint64_t to_it = sent - p->base;
      uint64_t lost = to_it > tx + TEL_SENDBUF + 1 ? to_it - tx - (TEL_SENDBUF + 1) : 0;
      if (lost > p->counted) {
        atomic_fetch_add(&tel->dropped_subscriber, lost - p->counted);
        p->counted = lost;
      }
    }
  }
  pthread_mutex_unlock(&tel->pipe_mu);
  nng_stats_free(root);
}

static void *publisher_main(void *arg) {
  srv_telemetry *tel = arg;
  pthread_setname_np(pthread_self(), "groved-pub");
  pthread_mutex_lock(&tel->q_mu);
  while (!tel->stop) {
    if (!tel->q_head) {
      struct timespec ts;
      clock_gettime(CLOCK_REALTIME, &ts);
      ts.tv_nsec += TEL_POLL_NS;
      if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
      }
      pthread_cond_timedwait(&tel->q_cv, &tel->q_mu, &ts);
    }
    tel_acc *list = tel->q_head;
    tel->q_head = tel->q_tail = NULL;
    tel->q_len = 0;
    pthread_mutex_unlock(&tel->q_mu);
    for (tel_acc *it = list; it; it = it->next) publish(tel, it);
    int64_t now = grove__now_ns();
    poll_subscribers(tel, now);
    if (now - tel->last_sweep_ns > TEL_SWEEP_NS) {
      tel->last_sweep_ns = now;
      sweep_seqs(tel);
    }
    pthread_mutex_lock(&tel->q_mu);
    while (list) {
      tel_acc *it = list;
      list = it->next;
      if (tel->nfree < TEL_QUEUE_MAX) {
        it->next = tel->free_items;
        tel->free_items = it;
        tel->nfree++;
      } else {
        acc_fini(it);
        free(it);
      }
    }
  }
  pthread_mutex_unlock(&tel->q_mu);
  return NULL;
}

static void pipe_cb(nng_pipe p, nng_pipe_ev ev, void *arg) {
  srv_telemetry *tel = arg;
  uint32_t id = (uint32_t)nng_pipe_id(p);
  pthread_mutex_lock(&tel->pipe_mu);
  if (ev == NNG_PIPE_EV_ADD_POST) {
    if (tel->npipes == tel->pipes_cap) {
      size_t cap = tel->pipes_cap ? 2 * tel->pipes_cap : 8;
      tel_pipe *g = realloc(tel->pipes, cap * sizeof *g);
      if (g) {
        tel->pipes = g;
        tel->pipes_cap = cap;
      }
    }
    if (tel->npipes < tel->pipes_cap) {
      tel->pipes[tel->npipes++] = (tel_pipe){.id = id, .base = atomic_load(&tel->sent)};
      atomic_fetch_add(&tel->subscribers, 1);
    }
  } else if (ev == NNG_PIPE_EV_REM_POST) {
    /* Only a pipe that was added counts (one refused at its start, such as
     * a peer that is not a SUB, never was). */
    for (size_t i = 0; i < tel->npipes; i++)
      if (tel->pipes[i].id == id) {
        tel->pipes[i] = tel->pipes[--tel->npipes];
        atomic_fetch_sub(&tel->subscribers, 1);
        break;
      }
  }
  pthread_mutex_unlock(&tel->pipe_mu);
  grove__slog(GROVE_LOG_DEBUG, "telemetry.subscriber", "subscriber %" PRIu32 " %s", id,
              ev == NNG_PIPE_EV_ADD_POST ? "connected" : "left");
}

/* ================================================================ start/stop */

grove_status grove__telemetry_start(srv_server *srv, grove_err *err) {
  srv_telemetry *tel = calloc(1, sizeof *tel);
  if (!tel) return grove_err_set(err, GROVE_E_NOMEM, "out of memory");
  srv->telemetry = tel;
  tel->srv = srv;
  tel->nmodels = srv->nmodels;
  pthread_mutex_init(&tel->mu, NULL);
  pthread_mutex_init(&tel->q_mu, NULL);
  pthread_cond_init(&tel->q_cv, NULL);
  pthread_mutex_init(&tel->pipe_mu, NULL);
  size_t nm = srv->nmodels ? srv->nmodels : 1;
  tel->pending = calloc(nm, sizeof *tel->pending);
  tel->has_pending = calloc(nm, sizeof *tel->has_pending);
  tel->pending_num = calloc(nm, sizeof *tel->pending_num);
  tel->model_hooks = calloc(nm, sizeof *tel->model_hooks);
  tel->dirty = calloc(nm, sizeof *tel->dirty);
  tel->current = calloc(nm, sizeof *tel->current);
  tel->current_num = calloc(nm, sizeof *tel->current_num);
  tel->published = calloc(nm, sizeof *tel->published);
  tel->nworkers = srv->workers > 0 ? srv->workers : 1;
  tel->workers = calloc((size_t)tel->nworkers, sizeof *tel->workers);
  if (!tel->pending || !tel->has_pending || !tel->pending_num || !tel->model_hooks || !tel->dirty ||
      !tel->current || !tel->current_num || !tel->published || !tel->workers)
    return grove_err_set(err, GROVE_E_NOMEM, "out of memory");
  for (int i = 0; i < tel->nworkers; i++) {
    tel->workers[i].id = (uint32_t)i;
    if (!(tel->workers[i].models = calloc(nm, sizeof *tel->workers[i].models)))
      return grove_err_set(err, GROVE_E_NOMEM, "out of memory");
  }
  tel->next_id = 1;

  const char *url = srv->cfg.pub;
  if (!url) {
    snprintf(tel->why_off, sizeof tel->why_off, "groved runs with --pub none");
    grove__slog(GROVE_LOG_INFO, "telemetry.off", "--pub none: forward-hook telemetry is off");
    return GROVE_OK;
  }
  int rv = nng_pub0_open(&tel->pub);
  if (rv) return grove_err_set(err, GROVE_E_IO, "cannot open the PUB socket: %s", nng_strerror(rv));
  tel->pub_open = true;
  nng_socket_set_int(tel->pub, NNG_OPT_SENDBUF, TEL_SENDBUF);
  /* Capped like every listener (conns.c), which passes the pipe events on
   * to pipe_cb; subscribers only receive, so none is closed as idle. */
  grove_status cs = grove__conns_watch(srv, tel->pub, "pub", grove__conns_default_cap(srv, false),
                                       false, pipe_cb, tel, err);
  if (cs) return cs;
  if ((rv = nng_listen(tel->pub, url, NULL, 0)) != 0) {
    if (strcmp(url, TEL_DEFAULT_PUB) != 0)
      return grove_err_set(err, GROVE_E_IO, "cannot listen on --pub %s: %s", url, nng_strerror(rv));
    /* Only the default address is best effort, so that a second groved on
     * one machine (tests, a canary) still serves. */
    snprintf(tel->why_off, sizeof tel->why_off,
             "groved could not listen on the default PUB address %s (%s); start it with --pub", url,
             nng_strerror(rv));
    grove__slog(GROVE_LOG_WARN, "telemetry.pub_unavailable",
                "cannot listen on the default --pub %s: %s; forward-hook telemetry is off", url,
                nng_strerror(rv));
    nng_close(tel->pub);
    tel->pub_open = false;
    return GROVE_OK;
  }
  if ((rv = pthread_create(&tel->thread, NULL, publisher_main, tel)) != 0)
    return grove_err_set(err, GROVE_E_INTERNAL, "cannot start the publisher thread: %s",
                         strerror(rv));
  tel->thread_started = true;
  tel->enabled = true;
  grove__slog(GROVE_LOG_INFO, "telemetry.listen", "publishing hook events on %s", url);
  return GROVE_OK;
}

void grove__telemetry_stop(srv_server *srv) {
  srv_telemetry *tel = srv->telemetry;
  if (!tel) return;
  if (tel->thread_started) {
    pthread_mutex_lock(&tel->q_mu);
    tel->stop = true;
    pthread_cond_signal(&tel->q_cv);
    pthread_mutex_unlock(&tel->q_mu);
    pthread_join(tel->thread, NULL);
    tel->thread_started = false;
  }
  if (tel->pub_open) {
    grove__nng_close_or_exit(srv, tel->pub, "the hook PUB socket");
    tel->pub_open = false;
  }
  tel->enabled = false;
}

static void free_items(tel_acc *it) {
  while (it) {
    tel_acc *next = it->next;
    acc_fini(it);
    free(it);
    it = next;
  }
}

void grove__telemetry_free(srv_server *srv) {
  srv_telemetry *tel = srv->telemetry;
  if (!tel) return;
  grove__telemetry_stop(srv);
  for (size_t i = 0; i < tel->nmodels; i++) {
    if (tel->current) grove__telemetry_release(tel->current[i]);
    if (tel->pending) grove__telemetry_release(tel->pending[i]);
  }
  for (int w = 0; tel->workers && w < tel->nworkers; w++) {
    tel_worker *tw = &tel->workers[w];
    for (size_t k = 0; tw->models && k < tel->nmodels; k++) {
      tel_wmodel *wm = &tw->models[k];
      for (size_t i = 0; i < wm->nacc; i++) acc_fini(&wm->accs[i]);
      free(wm->accs);
      free(wm->active);
    }
    free(tw->models);
    free_items(tw->spare);
  }
  free_items(tel->q_head);
  free_items(tel->free_items);
  for (size_t h = 0; h < tel->nhooks; h++) {
    free(tel->hooks[h]->pattern);
    grove__tel_free_names(tel->hooks[h]->modules, tel->hooks[h]->nmodules);
    free(tel->hooks[h]);
  }
  free(tel->hooks);
  while (tel->all_ctr) {
    tel_counters *c = tel->all_ctr;
    tel->all_ctr = c->next_all;
    free(c);
  }
  for (size_t i = 0; i < TEL_SEQ_BUCKETS; i++)
    while (tel->seqs[i]) {
      tel_seq *e = tel->seqs[i];
      tel->seqs[i] = e->next;
      free(e);
    }
  free(tel->std_buf);
  free(tel->pipes);
  free(tel->pending);
  free(tel->has_pending);
  free(tel->pending_num);
  free(tel->model_hooks);
  free(tel->dirty);
  free(tel->current);
  free(tel->current_num);
  free(tel->published);
  free(tel->workers);
  pthread_mutex_destroy(&tel->mu);
  pthread_mutex_destroy(&tel->q_mu);
  pthread_cond_destroy(&tel->q_cv);
  pthread_mutex_destroy(&tel->pipe_mu);
  free(tel);
  srv->telemetry = NULL;
}
