/* graph_plan.c: per-signature arena plans of a graph's serving forward
 * (issue #18).  graph.c's stack liveness moves each node's new blocks down
 * over dead memory after the node; for a CNN that is a copy of most
 * activations per forward.  The first plain serving forward of a graph at
 * a new input signature (dtype, shape, strides of every input and the
 * channels-last flag) records every allocation its nodes make (size, node,
 * and for the blocks a node keeps, the last node that reads them).  Offsets
 * are then fixed by first fit over the live intervals (the graph's outputs
 * first, so they sit at the bottom; then largest first) and the plan is
 * published.  Later forwards at that signature reserve one block and serve
 * each node's allocations at their offsets (grove__arena_place): nothing is
 * moved.  A size or count that differs from the recording makes graph.c
 * mark the plan bad and run the forward again without it: never wrong,
 * only slower.  A node that fails (its input's fault: an id past an
 * embedding) is no miss: the forward returns its error and the plan stays
 * good; a forward that fails while recording publishes nothing (the next
 * one at the signature records).  A recording during which a nested graph
 * with chains of cats in place ran (graph.c: it runs passthru there, and
 * keeps all it made) is published bad: that signature runs unplanned and
 * is not recorded again.  Up to GROVE__MAX_PLANS plans a graph,
 * under a mutex (graphs are shared by the worker threads), never replaced:
 * forwards at further signatures run unplanned; a published plan never
 * changes except for its bad flag. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "graph_internal.h"

#define LOG_CAP (1 << 16)

struct grove__plans {
  pthread_mutex_t mu;
  grove__gplan *p[GROVE__MAX_PLANS];
  int n;
};

static void plan_free(grove__gplan *p) {
  if (!p) return;
  free(p->first);
  free(p->off);
  free(p->size);
  free(p->kfirst);
  free(p->keeps);
  free(p);
}

grove__plans *grove__plans_new(void) {
  grove__plans *s = calloc(1, sizeof *s);
  if (s && pthread_mutex_init(&s->mu, NULL) != 0) {
    free(s);
    return NULL;
  }
  return s;
}

void grove__plans_free(grove__plans *s) {
  if (!s) return;
  for (int k = 0; k < s->n; k++) plan_free(s->p[k]);
  pthread_mutex_destroy(&s->mu);
  free(s);
}

static bool same_sig(const grove__gplan *p, const grove_values *in, bool cl) {
  if (p->nin != in->n || p->cl != cl) return false;
  for (int k = 0; k < in->n; k++) {
    const grove_tensor *t = &in->v[k];
    if (t->dtype != p->dtype[k] || t->ndim != p->ndim[k]) return false;
    for (int d = 0; d < t->ndim; d++)
      if (t->shape[d] != p->shape[k][d] || t->strides[d] != p->strides[k][d]) return false;
  }
  return true;
}

const grove__gplan *grove__plan_find(const graph_impl *g, const grove_values *in, bool cl,
                                     bool *record) {
  *record = false;
  grove__plans *s = g->plans;
  if (!s || in->n > GROVE_MAX_VALUES) return NULL;
  const grove__gplan *found = NULL;
  bool any = false;
  pthread_mutex_lock(&s->mu);
  for (int k = 0; k < s->n && !any; k++)
    if (same_sig(s->p[k], in, cl)) {
      any = true;
      if (!atomic_load(&s->p[k]->bad)) found = s->p[k];
    }
  *record = !any && s->n < GROVE__MAX_PLANS;
  pthread_mutex_unlock(&s->mu);
  return found;
}

void grove__plan_bad(const grove__gplan *p) {
  atomic_store(&((grove__gplan *)p)->bad, true);
}

/* ------------------------------------------------------------ recording */

struct grove__plan_rec {
  grove__arena_log log;
  int nnodes;
  int *start, *end; /* per node: its allocations, log[start, end) */
  int *death;       /* per log entry: last reader of a kept block; -1 scratch */
  int *keep_node;   /* per keep: the node */
  grove__gkeep *keeps;
  int nkeeps, capkeeps;
  bool fail;
};

grove__plan_rec *grove__plan_rec_begin(const graph_impl *g, grove_arena *a) {
  grove__plan_rec *r = calloc(1, sizeof *r);
  if (!r) return NULL;
  r->nnodes = g->nnodes;
  r->log.cap = LOG_CAP;
  r->log.ptr = malloc(LOG_CAP * sizeof(void *));
  r->log.size = malloc(LOG_CAP * sizeof(size_t));
  r->death = malloc(LOG_CAP * sizeof(int));
  r->start = calloc((size_t)g->nnodes, sizeof(int));
  r->end = calloc((size_t)g->nnodes, sizeof(int));
  if (!r->log.ptr || !r->log.size || !r->death || !r->start || !r->end) {
    grove__plan_rec_end(r, g, NULL, false, false, a);
    return NULL;
  }
  for (int k = 0; k < LOG_CAP; k++) r->death[k] = -1;
  grove__arena_record(a, &r->log);
  return r;
}

void grove__plan_rec_node(grove__plan_rec *r, int i) {
  r->start[i] = r->end[i] = r->log.n;
}
void grove__plan_rec_computed(grove__plan_rec *r, int i) {
  r->end[i] = r->log.n;
}

int grove__plan_rec_block(grove__plan_rec *r, int i, const char *start, size_t bytes) {
  /* The latest allocation of node i holding the block: an earlier one at
   * the same address was scratch given back inside the node. */
  for (int k = r->end[i] - 1; k >= r->start[i]; k--) {
    const char *p = r->log.ptr[k];
    if (start >= p && start + bytes <= p + r->log.size[k]) {
      if (r->nkeeps == r->capkeeps) {
        const int cap = r->capkeeps ? 2 * r->capkeeps : 256;
        grove__gkeep *nk = realloc(r->keeps, (size_t)cap * sizeof *nk);
        int *nn = realloc(r->keep_node, (size_t)cap * sizeof *nn);
        if (nk) r->keeps = nk;
        if (nn) r->keep_node = nn;
        if (!nk || !nn) break;
        r->capkeeps = cap;
      }
      r->keeps[r->nkeeps] = (grove__gkeep){k, (size_t)(start - p), bytes};
      r->keep_node[r->nkeeps++] = i;
      r->death[k] = r->nnodes; /* until a death is seen: an output */
      return k;
    }
  }
  r->fail = true;
  return -1;
}

void grove__plan_rec_death(grove__plan_rec *r, int item, int i) {
  if (item >= 0 && item < r->log.n) r->death[item] = i;
}

typedef struct pitem {
  size_t size, off;
  int from, to, idx;
} pitem;

static int cmp_item(const void *a, const void *b) {
  const pitem *x = a, *y = b;
  const int ox = x->to == INT32_MAX, oy = y->to == INT32_MAX;
  if (ox != oy) return oy - ox;
  if (x->size != y->size) return x->size > y->size ? -1 : 1;
  return x->idx - y->idx;
}

static int cmp_off(const void *a, const void *b) {
  const pitem *x = *(pitem *const *)a, *y = *(pitem *const *)b;
  return x->off < y->off ? -1 : x->off > y->off;
}

static grove__gplan *build(grove__plan_rec *r, const grove_values *in, bool cl) {
  const int nn = r->nnodes;
  grove__gplan *p = calloc(1, sizeof *p);
  if (!p) return NULL;
  int n = 0;
  for (int i = 0; i < nn; i++) n += r->end[i] - r->start[i];
  p->first = calloc((size_t)nn + 1, sizeof(int));
  p->kfirst = calloc((size_t)nn + 1, sizeof(int));
  p->off = malloc(((size_t)n + 1) * sizeof(size_t));
  p->size = malloc(((size_t)n + 1) * sizeof(size_t));
  p->keeps = malloc(((size_t)r->nkeeps + 1) * sizeof(grove__gkeep));
  int *map = malloc(((size_t)r->log.n + 1) * sizeof(int));
  pitem *it = malloc(((size_t)n + 1) * sizeof(pitem));
  pitem **live = malloc(((size_t)n + 1) * sizeof(pitem *));
  if (!p->first || !p->kfirst || !p->off || !p->size || !p->keeps || !map || !it || !live) {
    free(map);
    free(it);
    free(live);
    plan_free(p);
    return NULL;
  }
  int c = 0;
  for (int i = 0; i < nn; i++) {
    p->first[i] = c;
    for (int k = r->start[i]; k < r->end[i]; k++) {
      map[k] = c;
      const int d = r->death[k];
      it[c] = (pitem){r->log.size[k], 0, i, d < 0 ? i : d >= nn ? INT32_MAX : d, c};
      p->size[c++] = r->log.size[k];
    }
  }
  p->first[nn] = c;
  /* Keeps were recorded in node order. */
  int kc = 0;
  for (int i = 0; i < nn; i++) {
    p->kfirst[i] = kc;
    while (kc < r->nkeeps && r->keep_node[kc] == i) {
      p->keeps[kc] = r->keeps[kc];
      p->keeps[kc].item = map[r->keeps[kc].item];
      kc++;
    }
  }
  p->kfirst[nn] = kc;
  /* First fit: each item at the lowest offset clear of every placed item
   * whose live interval meets its own. */
  qsort(it, (size_t)n, sizeof *it, cmp_item);
  size_t total = 0;
  for (int k = 0; k < n; k++) {
    int nl = 0;
    for (int j = 0; j < k; j++)
      if (it[j].from <= it[k].to && it[k].from <= it[j].to) live[nl++] = &it[j];
    qsort(live, (size_t)nl, sizeof *live, cmp_off);
    size_t off = 0;
    for (int j = 0; j < nl; j++) {
      if (off + it[k].size <= live[j]->off) break;
      if (live[j]->off + live[j]->size > off) off = live[j]->off + live[j]->size;
    }
    it[k].off = off;
    p->off[it[k].idx] = off;
    if (off + it[k].size > total) total = off + it[k].size;
  }
  p->total = total ? total : 64; /* the reserve is never empty (nor a total of 0) */
  p->nin = in->n;
  p->cl = cl;
  for (int k = 0; k < in->n; k++) {
    const grove_tensor *t = &in->v[k];
    p->dtype[k] = t->dtype;
    p->ndim[k] = t->ndim;
    for (int d = 0; d < t->ndim; d++) {
      p->shape[k][d] = t->shape[d];
      p->strides[k][d] = t->strides[d];
    }
  }
  free(map);
  free(it);
  free(live);
  return p;
}

size_t grove__plan_rec_end(grove__plan_rec *r, const graph_impl *g, const grove_values *in, bool cl,
                           bool ok, grove_arena *a) {
  if (!r) return 0;
  grove__arena_record(a, NULL);
  size_t total = 0;
  if (ok && !r->fail && !r->log.full && g->plans) {
    grove__gplan *p = build(r, in, cl);
    if (p && r->log.refuse) {
      /* Kept so that the signature is not recorded again, never used. */
      atomic_store(&p->bad, true);
    } else if (p) {
      total = p->total;
    }
    if (p) {
      grove__plans *s = g->plans;
      pthread_mutex_lock(&s->mu);
      bool dup = false;
      for (int k = 0; k < s->n; k++) dup |= same_sig(s->p[k], in, cl);
      if (!dup && s->n < GROVE__MAX_PLANS) {
        s->p[s->n++] = p;
        p = NULL;
      }
      pthread_mutex_unlock(&s->mu);
      plan_free(p);
    }
  }
  free(r->log.ptr);
  free(r->log.size);
  free(r->death);
  free(r->start);
  free(r->end);
  free(r->keeps);
  free(r->keep_node);
  free(r);
  return total;
}
