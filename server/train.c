/* train.c: training sessions (StartTraining, TrainStep, Evaluate, Promote,
 * StopTraining; docs/training.md, "On the server").
 *
 * One session per model, each with a thread of its own that owns the
 * session's replica (include/grove/train.h), optimizer and loss.  RPCs reach
 * it through a short queue: the NNG thread that decoded a request checks it,
 * queues it and returns; the session thread runs it and replies itself (as a
 * worker does).  The queue is short (SESSION_QUEUE) because a queued request
 * holds one of groved's NNG contexts: a client that floods TrainStep gets
 * RESOURCE_EXHAUSTED instead of starving predicts of contexts.
 *
 * Serving is never touched.  StartTraining copies the serving version's
 * state_dict into a new replica; the snapshot is taken on the loop thread
 * (an admin job), where no in-place reload can be swapping the serving tree's
 * tensors at the same moment.  Promote writes the replica's state_dict to a
 * safetensors file and hands the request to the reload path as a Reload with
 * that checkpoint: the new version is built, checked and swapped in exactly
 * as any reload, and the reply is the reload's.
 *
 * Cores: a session runs on its one thread, at a lower priority (nice +10,
 * as reload's builds), so that predict's workers keep their cores; its
 * matrix products (Grove's kernel for Linear, BLAS for the rest) use the
 * server's --blas-threads compute threads, like the workers'.  Sessions stop at shutdown (after the
 * workers, before the socket closes): a running step finishes, queued requests are answered
 * UNAVAILABLE. */
#define _GNU_SOURCE
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "grove/train.h"
#include "server.h"

#define SESSION_QUEUE 8

enum { J_START, J_STEP, J_EVAL, J_PROMOTE, J_STOP };

typedef struct tjob {
  int kind;
  srv_req *r;
  struct tjob *next;
} tjob;

/* The serving state_dict, taken on the loop for a starting session.  Two
 * references: the session thread's and the admin job's. */
typedef struct snap {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int refs;
  bool done;
  grove_status s;
  char msg[256];
  srv_version *version; /* held */
  grove_state_dict *sd; /* the serving tree's tensors, retained */
} snap;

typedef struct session {
  srv_server *srv;
  srv_model *m;
  pthread_t thread;
  bool started;
  pthread_mutex_t mu; /* guards the queue and stop */
  pthread_cond_t cv;
  tjob *head, *tail;
  size_t queued;
  bool stop;          /* shutdown */
  bool exited;        /* the thread has left its loop: nothing more is queued */
  atomic_bool closed; /* stopping, stopped or failed to start: accepts nothing more */
  /* The session thread's own. */
  grove_replica *rep;
  grove_optim *opt;
  grove_loss loss;
  grove_tensor *pos_weight;
  grove_arena *arena;
  uint64_t steps;
  int64_t base_version;
  struct session *next_retired; /* srv_training.retired */
} session;

struct srv_training {
  srv_server *srv;
  pthread_mutex_t mu; /* guards sessions[] */
  session **sessions; /* per model index; NULL = none */
  session *retired;   /* replaced sessions whose thread may still be answering */
};

/* ================================================================ helpers */

static void session_free(session *s) {
  if (!s) return;
  for (tjob *j = s->head, *n; j; j = n) {
    n = j->next;
    free(j);
  }
  grove_optim_free(s->opt);
  grove_replica_free(s->rep);
  grove_tensor_release(s->pos_weight);
  grove_arena_free(s->arena);
  pthread_mutex_destroy(&s->mu);
  pthread_cond_destroy(&s->cv);
  free(s);
}

static void reply_body(srv_req *r, grove_status st, const char *msg, Grove__Reply *rep) {
  rep->protocol = GROVE__PROTOCOL_VERSION__PROTOCOL_VERSION;
  rep->id = r->id;
  rep->status = (int32_t)st;
  rep->message = (char *)(msg ? msg : "");
  nng_msg *m = grove__rpc_pack(rep);
  if (!m) {
    grove__rpc_reply_error(r, GROVE_E_NOMEM, "out of memory encoding the reply");
    return;
  }
  grove__rpc_send(r, m, st);
}

/* A plain view of a wire tensor (the request keeps the bytes). */
static grove_status wire_tensor(const Grove__Tensor *t, const char *what, grove_tensor *out,
                                grove_err *err) {
  if (!t) return grove_err_set(err, GROVE_E_INVALID_ARGUMENT, "%s is missing", what);
  if (t->dtype < 0 || t->dtype >= GROVE_DTYPE_COUNT || grove_dtype_size(t->dtype) == 0)
    return grove_err_set(err, GROVE_E_DTYPE, "%s.dtype: %d is not a grove_dtype value", what,
                         t->dtype);
  if (t->n_shape > GROVE_MAX_DIMS)
    return grove_err_set(err, GROVE_E_SHAPE, "%s: %zu dimensions (at most %d)", what, t->n_shape,
                         GROVE_MAX_DIMS);
  uint64_t numel = 1, bytes;
  for (size_t d = 0; d < t->n_shape; d++) {
    if (t->shape[d] < 0 || __builtin_mul_overflow(numel, (uint64_t)t->shape[d], &numel))
      return grove_err_set(err, GROVE_E_SHAPE, "%s: bad shape", what);
  }
  if (__builtin_mul_overflow(numel, (uint64_t)grove_dtype_size(t->dtype), &bytes) ||
      bytes != t->data.len)
    return grove_err_set(err, GROVE_E_BAD_SIZE, "%s: %zu bytes of data for %" PRIu64 " %s elements",
                         what, t->data.len, numel, grove_dtype_name(t->dtype));
  grove_tensor_init(out, (grove_dtype)t->dtype, (int)t->n_shape, t->shape, t->data.data);
  return GROVE_OK;
}

static grove_status wire_inputs(Grove__Tensor **ts, size_t n, grove_tensor *out, grove_err *err) {
  if (n > GROVE_MAX_VALUES)
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT, "%zu inputs (at most %d)", n,
                         GROVE_MAX_VALUES);
  for (size_t i = 0; i < n; i++) {
    char what[32];
    snprintf(what, sizeof what, "inputs[%zu]", i);
    grove_status s = wire_tensor(ts[i], what, &out[i], err);
    if (s) return s;
  }
  return GROVE_OK;
}

/* A new malloc'd printf string (NULL when out of memory). */
static char *str_printf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *str_printf(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  char *buf = n >= 0 ? malloc((size_t)n + 1) : NULL;
  if (!buf) return NULL;
  va_start(ap, fmt);
  vsnprintf(buf, (size_t)n + 1, fmt, ap);
  va_end(ap);
  return buf;
}

/* ================================================================ the snapshot */

static void snap_put(snap *p) {
  pthread_mutex_lock(&p->mu);
  bool last = --p->refs == 0;
  pthread_mutex_unlock(&p->mu);
  if (!last) return;
  grove_sd_free(p->sd);
  grove__version_release(p->version);
  pthread_mutex_destroy(&p->mu);
  pthread_cond_destroy(&p->cv);
  free(p);
}

static void snap_finish(snap *p, grove_status s, const char *msg) {
  pthread_mutex_lock(&p->mu);
  p->s = s;
  if (msg) snprintf(p->msg, sizeof p->msg, "%s", msg);
  p->done = true;
  pthread_cond_broadcast(&p->cv);
  pthread_mutex_unlock(&p->mu);
}

typedef struct snap_arg {
  snap *p;
  srv_model *m;
} snap_arg;

/* Loop thread: the model's current version and its state_dict. */
static void snap_take(srv_server *srv, void *arg) {
  snap_arg *a = arg;
  snap *p = a->p;
  grove_err err = {0};
  grove_status s = GROVE_OK;
  if (grove__reload_in_place_active(srv, a->m)) {
    s = grove_err_set(&err, GROVE_E_UNAVAILABLE,
                      "model '%s' is being reloaded in place; start training again once it "
                      "serves its new version",
                      a->m->name);
  } else if (!(p->version = grove__model_acquire(a->m))) {
    s = grove_err_set(&err, GROVE_E_FAILED_PRECONDITION, "model '%s' has no version serving",
                      a->m->name);
  } else if (!(p->sd = grove_sd_new())) {
    s = grove_err_set(&err, GROVE_E_NOMEM, "out of memory");
  } else {
    s = grove_module_state_dict(p->version->model->root, "", p->sd, &err);
  }
  snap_finish(p, s, s ? grove_err_msg(&err) : NULL);
  snap_put(p);
  free(a);
  grove__loopjob_done(srv);
}

static void snap_cancel(void *arg) {
  snap_arg *a = arg;
  snap_finish(a->p, GROVE_E_UNAVAILABLE, "groved is shutting down");
  snap_put(a->p);
  free(a);
}

/* ================================================================ start */

static grove_status hparams(const Grove__StartTrainingRequest *q, grove_optim_kind kind,
                            grove_optim_hparams *h, grove_err *err) {
  *h = grove_optim_defaults(kind);
  if (kind == GROVE_OPTIM_SGD && !q->lr)
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT,
                         "SGD needs a learning rate (lr): torch.optim.SGD has no default");
  if (q->lr) h->lr = q->lr->value;
  if (q->momentum) h->momentum = q->momentum->value;
  if (q->dampening) h->dampening = q->dampening->value;
  if (q->beta1) h->beta1 = q->beta1->value;
  if (q->beta2) h->beta2 = q->beta2->value;
  if (q->eps) h->eps = q->eps->value;
  if (q->weight_decay) h->weight_decay = q->weight_decay->value;
  h->nesterov = q->nesterov;
  h->amsgrad = q->amsgrad;
  h->maximize = q->maximize;
  return GROVE_OK;
}

static bool has_prefix(const char *name, char **prefixes, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (strncmp(name, prefixes[i], strlen(prefixes[i])) == 0) return true;
  return false;
}

/* Builds the optimizer over the replica's parameters with the request's
 * param_groups (a parameter in the first group whose prefixes claim it). */
static grove_status make_optim(session *s, const Grove__StartTrainingRequest *q,
                               grove_optim_kind kind, Grove__StartTrainingReply *rr,
                               grove_err *err) {
  grove_optim_hparams h;
  grove_status st = hparams(q, kind, &h, err);
  if (st) return st;
  const size_t np = grove_replica_num_params(s->rep);
  const size_t ng = q->n_param_groups;
  grove_tensor **params = calloc(np + 1, sizeof *params);
  size_t *idx = calloc(np + 1, sizeof *idx), *group = calloc(np + 1, sizeof *group);
  grove_param_group *groups = calloc(ng + 1, sizeof *groups);
  uint32_t *sizes = calloc(ng + 1, sizeof *sizes);
  if (!params || !idx || !group || !groups || !sizes) {
    st = grove_err_set(err, GROVE_E_NOMEM, "out of memory");
    goto out;
  }
  for (size_t i = 0; i < np; i++) {
    params[i] = grove_replica_param(s->rep, i);
    group[i] = SIZE_MAX;
    for (size_t g = 0; g < ng && group[i] == SIZE_MAX; g++) {
      const Grove__ParamGroup *pg = q->param_groups[g];
      if (pg->n_prefixes == 0 ||
          has_prefix(grove_replica_param_name(s->rep, i), pg->prefixes, pg->n_prefixes))
        group[i] = g;
    }
  }
  /* The groups' index lists, in parameter order, packed into idx. */
  size_t at = 0;
  for (size_t g = 0; g < ng; g++) {
    const Grove__ParamGroup *pg = q->param_groups[g];
    groups[g].h = h;
    if (pg->lr) groups[g].h.lr = pg->lr->value;
    if (pg->weight_decay) groups[g].h.weight_decay = pg->weight_decay->value;
    groups[g].params = idx + at;
    for (size_t i = 0; i < np; i++)
      if (group[i] == g) idx[at++] = i;
    groups[g].nparams = (size_t)(idx + at - groups[g].params);
    sizes[g] = (uint32_t)groups[g].nparams;
  }
  st = grove_optim_new(kind, params, np, groups, ng, &h, &s->opt, err);
  if (!st && ng == 0) sizes[0] = (uint32_t)np;
  rr->n_group_sizes = ng ? ng : 1;
  rr->group_sizes = sizes;
  sizes = NULL;
out:
  free(params);
  free(idx);
  free(group);
  free(groups);
  free(sizes);
  return st;
}

static grove_status make_loss(session *s, const Grove__StartTrainingRequest *q, grove_err *err) {
  grove_loss_kind kind;
  if (!grove_loss_kind_from_name(q->loss, &kind))
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT,
                         "loss '%s': expected MSELoss, CrossEntropyLoss or BCEWithLogitsLoss",
                         q->loss ? q->loss : "");
  s->loss = grove_loss_default(kind);
  if (q->reduction && strcmp(q->reduction, "sum") == 0)
    s->loss.reduction = GROVE_REDUCTION_SUM;
  else if (q->reduction && *q->reduction && strcmp(q->reduction, "mean") != 0)
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT,
                         "reduction '%s': expected mean or sum (a training loss is a scalar)",
                         q->reduction);
  if (q->ignore_index) s->loss.ignore_index = q->ignore_index->value;
  if (!(q->label_smoothing >= 0.0 && q->label_smoothing <= 1.0))
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT,
                         "label_smoothing must be between 0.0 and 1.0, got %g", q->label_smoothing);
  s->loss.label_smoothing = q->label_smoothing;
  if (q->pos_weight) {
    grove_tensor v;
    grove_status st = wire_tensor(q->pos_weight, "pos_weight", &v, err);
    if (st) return st;
    if (!(s->pos_weight = grove_tensor_clone(&v, GROVE_F32, err)))
      return err && err->code ? err->code : GROVE_E_NOMEM;
    s->loss.pos_weight = s->pos_weight;
  }
  return GROVE_OK;
}

static char *read_text(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  char *buf = NULL;
  size_t n = 0, cap = 0;
  for (;;) {
    if (cap - n < 65536) {
      char *b = realloc(buf, cap ? cap * 2 : 65536);
      if (!b) {
        free(buf);
        fclose(f);
        return NULL;
      }
      buf = b;
      cap = cap ? cap * 2 : 65536;
    }
    size_t got = fread(buf + n, 1, cap - n - 1, f);
    n += got;
    if (got == 0) break;
  }
  fclose(f);
  buf[n] = '\0';
  return buf;
}

static bool stopping(session *s) {
  pthread_mutex_lock(&s->mu);
  bool stop = s->stop;
  pthread_mutex_unlock(&s->mu);
  return stop;
}

/* A start that failed: the session closes before the reply goes, so that
 * the caller may start again as soon as it has the answer. */
static void start_failed(session *s, srv_req *r, grove_status st, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void start_failed(session *s, srv_req *r, grove_status st, const char *fmt, ...) {
  char msg[GROVE_ERR_MSG_MAX];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  atomic_store(&s->closed, true);
  grove__rpc_reply_error(r, st, "%s", msg);
}

static bool run_start(session *s, srv_req *r) {
  const Grove__StartTrainingRequest *q = r->msg->start_training;
  grove_err err = {0};
  grove_status st = GROVE_OK;
  /* The serving state_dict, from the loop. */
  snap *p = calloc(1, sizeof *p);
  snap_arg *a = calloc(1, sizeof *a);
  if (!p || !a) {
    free(p);
    free(a);
    start_failed(s, r, GROVE_E_NOMEM, "out of memory starting training");
    return false;
  }
  pthread_mutex_init(&p->mu, NULL);
  pthread_cond_init(&p->cv, NULL);
  p->refs = 2;
  a->p = p;
  a->m = s->m;
  if (!grove__loopjob_post(s->srv, snap_take, snap_cancel, a)) {
    free(a);
    p->refs = 1;
    snap_put(p);
    start_failed(s, r, GROVE_E_NOMEM, "out of memory starting training");
    return false;
  }
  /* Wait for the loop; give up if groved stops meanwhile (the job, or its
   * cancellation at shutdown, drops the other reference). */
  pthread_mutex_lock(&p->mu);
  while (!p->done) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += 50 * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
      ts.tv_sec++;
      ts.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(&p->cv, &p->mu, &ts);
    if (!p->done && stopping(s)) {
      snprintf(p->msg, sizeof p->msg, "groved is shutting down");
      p->s = GROVE_E_UNAVAILABLE;
      break;
    }
  }
  pthread_mutex_unlock(&p->mu);
  if (p->s) {
    start_failed(s, r, p->s, "%s", p->msg);
    snap_put(p);
    return false;
  }
  grove_optim_kind kind = GROVE_OPTIM_SGD;
  char *json = NULL, *path = NULL;
  Grove__StartTrainingReply rr = GROVE__START_TRAINING_REPLY__INIT;
  if (!grove_optim_kind_from_name(q->optimizer, &kind))
    st =
        grove_err_set(&err, GROVE_E_INVALID_ARGUMENT, "optimizer '%s': expected SGD, Adam or AdamW",
                      q->optimizer ? q->optimizer : "");
  if (!st) st = make_loss(s, q, &err);
  /* The replica: the serving version's model.json and state_dict. */
  if (!st && !(path = str_printf("%s/model.json", p->version->model->dir)))
    st = grove_err_set(&err, GROVE_E_NOMEM, "out of memory");
  if (!st && !(json = read_text(path)))
    st = grove_err_set(&err, GROVE_E_IO, "%s: %s", path, strerror(errno));
  if (!st) {
    grove_replica_opts o = {.seed = q->seed};
    st = grove_replica_new(json, path, p->sd, &o, &s->rep, &err);
  }
  if (!st) st = make_optim(s, q, kind, &rr, &err);
  if (!st && q->optimizer_state && *q->optimizer_state)
    st = grove_optim_load(s->opt, q->optimizer_state, &err);
  if (!st && !(s->arena = grove_arena_new(0)))
    st = grove_err_set(&err, GROVE_E_NOMEM, "out of memory");
  s->base_version = p->version->number;
  free(json);
  free(path);
  snap_put(p);
  if (st) {
    free(rr.group_sizes);
    grove__slog(GROVE_LOG_WARN, "train.start_failed", "model %s: %s", s->m->name,
                grove_err_msg(&err));
    start_failed(s, r, st, "%s", grove_err_msg(&err));
    return false;
  }
  const size_t np = grove_replica_num_params(s->rep);
  char **names = calloc(np + 1, sizeof *names);
  if (names)
    for (size_t i = 0; i < np; i++) names[i] = (char *)grove_replica_param_name(s->rep, i);
  rr.base_version = s->base_version;
  rr.n_param_names = names ? np : 0;
  rr.param_names = names;
  rr.param_count = grove_module_param_count(grove_replica_root(s->rep));
  Grove__Reply rep = GROVE__REPLY__INIT;
  rep.body_case = GROVE__REPLY__BODY_START_TRAINING;
  rep.start_training = &rr;
  grove__slog(GROVE_LOG_INFO, "train.start",
              "model %s: training session from version %" PRId64 " (%s, %s, %zu parameters)",
              s->m->name, s->base_version, q->optimizer, q->loss, np);
  reply_body(r, GROVE_OK, NULL, &rep);
  free(names);
  free(rr.group_sizes);
  return true;
}

/* ================================================================ the other jobs */

static void run_step(session *s, srv_req *r) {
  const Grove__TrainStepRequest *q = r->msg->train_step;
  grove_err err = {0};
  grove_tensor in[GROVE_MAX_VALUES], target;
  grove_status st = wire_inputs(q->inputs, q->n_inputs, in, &err);
  if (!st) st = wire_tensor(q->target, "target", &target, &err);
  double loss = 0, norm = 0;
  const int64_t t0 = grove__now_ns();
  if (!st)
    st = grove_replica_train_step(s->rep, s->opt, &s->loss, in, q->n_inputs, &target, &loss, &norm,
                                  &err);
  if (st) {
    grove__rpc_reply_error(r, st, "%s", grove_err_msg(&err));
    return;
  }
  s->steps++;
  Grove__TrainStepReply tr = GROVE__TRAIN_STEP_REPLY__INIT;
  tr.loss = loss;
  tr.grad_norm = norm;
  tr.step = s->steps;
  tr.compute_us = (uint64_t)((grove__now_ns() - t0) / 1000);
  Grove__Reply rep = GROVE__REPLY__INIT;
  rep.body_case = GROVE__REPLY__BODY_TRAIN_STEP;
  rep.train_step = &tr;
  reply_body(r, GROVE_OK, NULL, &rep);
}

static void run_eval(session *s, srv_req *r) {
  const Grove__EvaluateRequest *q = r->msg->evaluate;
  grove_err err = {0};
  grove_tensor in[GROVE_MAX_VALUES], target;
  grove_values out = {0};
  grove_arena_reset(s->arena);
  grove_status st = wire_inputs(q->inputs, q->n_inputs, in, &err);
  if (!st && q->target) st = wire_tensor(q->target, "target", &target, &err);
  if (!st) st = grove_replica_evaluate(s->rep, s->arena, in, q->n_inputs, &out, &err);
  double loss = 0;
  if (!st && q->target) st = grove_loss_compute(&s->loss, &out.v[0], &target, &loss, NULL, &err);
  if (st) {
    grove__rpc_reply_error(r, st, "%s", grove_err_msg(&err));
    return;
  }
  Grove__Tensor ts[GROVE_MAX_VALUES], *tp[GROVE_MAX_VALUES];
  grove_tensor c[GROVE_MAX_VALUES];
  for (int i = 0; i < out.n; i++) {
    /* Outputs leave as contiguous tensors. */
    c[i] = out.v[i];
    if (!grove_tensor_is_contiguous(&c[i])) {
      void *d = grove_arena_alloc(s->arena, grove_tensor_nbytes(&c[i]) + 1);
      grove_tensor t;
      if (!d) {
        grove__rpc_reply_error(r, GROVE_E_NOMEM, "out of memory for the outputs");
        return;
      }
      grove_tensor_init(&t, c[i].dtype, c[i].ndim, c[i].shape, d);
      grove_tensor_copy(&t, &c[i], NULL);
      c[i] = t;
    }
    grove__tensor__init(&ts[i]);
    ts[i].dtype = (int32_t)c[i].dtype;
    ts[i].n_shape = (size_t)c[i].ndim;
    ts[i].shape = c[i].shape;
    ts[i].data.len = grove_tensor_nbytes(&c[i]);
    ts[i].data.data = c[i].data;
    tp[i] = &ts[i];
  }
  Grove__EvaluateReply er = GROVE__EVALUATE_REPLY__INIT;
  er.n_outputs = (size_t)out.n;
  er.outputs = tp;
  er.has_loss = q->target != NULL;
  er.loss = loss;
  er.step = s->steps;
  Grove__Reply rep = GROVE__REPLY__INIT;
  rep.body_case = GROVE__REPLY__BODY_EVALUATE;
  rep.evaluate = &er;
  reply_body(r, GROVE_OK, NULL, &rep);
}

/* Writes the replica's state_dict, then asks reload.c for a reload of the
 * model from that file (grove__reload_request), which answers r. */
static void run_promote(session *s, srv_req *r) {
  const Grove__PromoteRequest *q = r->msg->promote;
  grove_err err = {0};
  char *path = NULL;
  bool created = false; /* path is a file of ours, to remove if the promote fails */
  grove_status st = GROVE_OK;
  if (q->path && *q->path) {
    if (strlen(q->path) >= PATH_MAX)
      st = grove_err_set(&err, GROVE_E_INVALID_ARGUMENT, "a path of %d bytes or more", PATH_MAX);
    else if (!(path = strdup(q->path)))
      st = grove_err_set(&err, GROVE_E_NOMEM, "out of memory");
  } else {
    /* A new file of our own; the write below replaces it atomically.  The
     * model's name goes into the file name only as letters, digits, '.',
     * '-' and '_', at most 64 of them: a name is any string, and a '/' or
     * 255 bytes of it would make another path or none. */
    const char *tmp = getenv("TMPDIR");
    char tag[65];
    size_t n = 0;
    for (const char *p = s->m->name; *p && n < sizeof tag - 1; p++)
      tag[n++] = isalnum((unsigned char)*p) || *p == '.' || *p == '-' || *p == '_' ? *p : '_';
    tag[n] = '\0';
    path = str_printf("%s/grove-promote-%s-step%" PRIu64 "-XXXXXX.safetensors",
                      tmp && *tmp ? tmp : "/tmp", tag, s->steps);
    int fd = path ? mkstemps(path, 12) : -1;
    if (fd < 0)
      st = grove_err_set(&err, path ? GROVE_E_IO : GROVE_E_NOMEM, "cannot create %s: %s",
                         path ? path : "a promote file", strerror(errno));
    else {
      close(fd);
      created = true;
    }
  }
  grove_state_dict *sd = st ? NULL : grove_sd_new();
  if (!st && !sd) st = grove_err_set(&err, GROVE_E_NOMEM, "out of memory");
  if (!st) st = grove_replica_state_dict(s->rep, sd, &err);
  if (!st) st = grove_safetensors_write(path, sd, &err);
  grove_sd_free(sd);
  if (st) {
    if (created) unlink(path); /* the empty file mkstemps made */
    free(path);
    grove__rpc_reply_error(r, st, "promote: %s", grove_err_msg(&err));
    return;
  }
  grove__slog(GROVE_LOG_INFO, "train.promote", "model %s: promoting step %" PRIu64 " from %s",
              s->m->name, s->steps, path);
  /* The reload answers r (with a Reload reply); it copies what it keeps. */
  srv_reload_args a = {.model = s->m->name, .checkpoint = path, .in_place = q->in_place};
  grove__reload_request(r, &a);
  free(path);
}

static void run_stop(session *s, srv_req *r) {
  const Grove__StopTrainingRequest *q = r->msg->stop_training;
  grove_err err = {0};
  if (q->optimizer_state && *q->optimizer_state &&
      grove_optim_save(s->opt, q->optimizer_state, &err)) {
    /* The session goes on: the caller may retry with another path. */
    grove__rpc_reply_error(r, err.code, "%s", grove_err_msg(&err));
    atomic_store(&s->closed, false);
    return;
  }
  Grove__StopTrainingReply sr = GROVE__STOP_TRAINING_REPLY__INIT;
  sr.steps = s->steps;
  Grove__Reply rep = GROVE__REPLY__INIT;
  rep.body_case = GROVE__REPLY__BODY_STOP_TRAINING;
  rep.stop_training = &sr;
  grove__slog(GROVE_LOG_INFO, "train.stop",
              "model %s: training session stopped after %" PRIu64 " steps", s->m->name, s->steps);
  reply_body(r, GROVE_OK, NULL, &rep);
}

/* ================================================================ the session thread */

static void *session_main(void *arg) {
  session *s = arg;
  /* Below predict's workers: a training step never takes their core first. */
  if (setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), 10) != 0)
    grove__slog(GROVE_LOG_DEBUG, "train.nice", "could not lower the session's priority: %s",
                strerror(errno));
  /* ... and a background thread (core/base/yield.c): its steps yield the core
   * every --background-yield-us of their work.  At nice 10 alone, a session
   * training flat out left predicts woken onto its core waiting for it for
   * up to a scheduler tick (p99 3 x steady). */
  grove_thread_yield_every(s->srv->cfg.background_yield_us);
  bool running = true;
  for (;;) {
    pthread_mutex_lock(&s->mu);
    while (!s->head && !s->stop && running) pthread_cond_wait(&s->cv, &s->mu);
    tjob *j = s->head;
    if (j) {
      s->head = j->next;
      if (!s->head) s->tail = NULL;
      s->queued--;
    }
    const bool stop = s->stop;
    if (!j) s->exited = true; /* under mu: enqueue refuses from now on */
    pthread_mutex_unlock(&s->mu);
    if (!j) break; /* stopped (or closed) and nothing left to answer */
    srv_req *r = j->r;
    const int kind = j->kind;
    free(j);
    if (stop) {
      grove__rpc_reply_error(r, GROVE_E_UNAVAILABLE, "groved is shutting down");
      continue;
    }
    if (!running) {
      grove__rpc_reply_error(r, GROVE_E_NOT_FOUND,
                             "model '%s' has no training session (it was stopped)", s->m->name);
      continue;
    }
    switch (kind) {
      case J_START:
        if (!run_start(s, r)) {
          atomic_store(&s->closed, true);
          running = false;
        }
        break;
      case J_STEP:
        run_step(s, r);
        break;
      case J_EVAL:
        run_eval(s, r);
        break;
      case J_PROMOTE:
        run_promote(s, r);
        break;
      case J_STOP:
        run_stop(s, r);
        if (atomic_load(&s->closed)) running = false;
        break;
    }
    if (!running) {
      /* The replica goes now; requests already queued are answered above. */
      grove_optim_free(s->opt);
      s->opt = NULL;
      grove_replica_free(s->rep);
      s->rep = NULL;
    }
  }
  return NULL;
}

/* ================================================================ RPCs */

static bool enqueue(session *s, int kind, srv_req *r) {
  tjob *j = malloc(sizeof *j);
  if (!j) return false;
  j->kind = kind;
  j->r = r;
  j->next = NULL;
  pthread_mutex_lock(&s->mu);
  if (s->exited) {
    pthread_mutex_unlock(&s->mu);
    free(j);
    return false;
  }
  if (s->tail)
    s->tail->next = j;
  else
    s->head = j;
  s->tail = j;
  s->queued++;
  pthread_cond_signal(&s->cv);
  pthread_mutex_unlock(&s->mu);
  return true;
}

/* Takes the retired sessions whose thread has ended off the list (tr->mu
 * held); the caller joins and frees them. */
static session *reap(struct srv_training *tr) {
  session *done = NULL, **pp = &tr->retired;
  while (*pp) {
    session *x = *pp;
    pthread_mutex_lock(&x->mu);
    bool exited = x->exited || !x->started;
    pthread_mutex_unlock(&x->mu);
    if (exited) {
      *pp = x->next_retired;
      x->next_retired = done;
      done = x;
    } else {
      pp = &x->next_retired;
    }
  }
  return done;
}

static void handle_start(srv_server *srv, srv_req *r) {
  struct srv_training *tr = srv->training;
  const Grove__StartTrainingRequest *q = r->msg->start_training;
  srv_model *m = grove__registry_find(srv, q->model);
  if (!m) {
    grove__rpc_reply_error(r, GROVE_E_NOT_FOUND, "model '%s' is not served here",
                           q->model ? q->model : "");
    return;
  }
  session *s = calloc(1, sizeof *s);
  if (!s) {
    grove__rpc_reply_error(r, GROVE_E_NOMEM, "out of memory starting training");
    return;
  }
  s->srv = srv;
  s->m = m;
  pthread_mutex_init(&s->mu, NULL);
  pthread_cond_init(&s->cv, NULL);
  pthread_mutex_lock(&tr->mu);
  session *cur = tr->sessions[m->index];
  if (cur && !atomic_load(&cur->closed)) {
    pthread_mutex_unlock(&tr->mu);
    session_free(s);
    grove__rpc_reply_error(r, GROVE_E_ALREADY_EXISTS,
                           "model '%s' already has a training session; StopTraining it first",
                           m->name);
    return;
  }
  tr->sessions[m->index] = s;
  /* Queued before the thread starts: the first thing it does is start. */
  bool ok = enqueue(s, J_START, r);
  if (ok && pthread_create(&s->thread, NULL, session_main, s) == 0) s->started = true;
  if (!s->started) {
    tr->sessions[m->index] = cur;
  } else if (cur) {
    /* A stopped (or failed) session: its thread may still be answering what
     * was queued behind StopTraining.  It is joined once it has ended. */
    cur->next_retired = tr->retired;
    tr->retired = cur;
  }
  session *done = reap(tr);
  pthread_mutex_unlock(&tr->mu);
  while (done) {
    session *n = done->next_retired;
    if (done->started) pthread_join(done->thread, NULL);
    session_free(done);
    done = n;
  }
  if (!s->started) {
    if (ok) { /* the job holds r: take it back */
      free(s->head);
      s->head = s->tail = NULL;
    }
    session_free(s);
    grove__rpc_reply_error(r, GROVE_E_RESOURCE_EXHAUSTED, "cannot start a training thread");
  }
}

void grove__training_handle(srv_req *r) {
  srv_server *srv = r->srv;
  struct srv_training *tr = srv->training;
  if (!tr) {
    grove__rpc_reply_error(r, GROVE_E_UNAVAILABLE, "training is not running on this server");
    return;
  }
  if (atomic_load(&srv->draining)) {
    grove__rpc_reply_error(r, GROVE_E_UNAVAILABLE, "groved is shutting down");
    return;
  }
  const char *model = NULL;
  int kind = J_STEP;
  switch (r->msg->body_case) {
    case GROVE__REQUEST__BODY_START_TRAINING:
      handle_start(srv, r);
      return;
    case GROVE__REQUEST__BODY_TRAIN_STEP:
      model = r->msg->train_step->model;
      kind = J_STEP;
      break;
    case GROVE__REQUEST__BODY_EVALUATE:
      model = r->msg->evaluate->model;
      kind = J_EVAL;
      break;
    case GROVE__REQUEST__BODY_PROMOTE:
      model = r->msg->promote->model;
      kind = J_PROMOTE;
      break;
    case GROVE__REQUEST__BODY_STOP_TRAINING:
      model = r->msg->stop_training->model;
      kind = J_STOP;
      break;
    default:
      grove__rpc_reply_error(r, GROVE_E_INTERNAL, "not a training request");
      return;
  }
  srv_model *m = grove__registry_find(srv, model);
  if (!m) {
    grove__rpc_reply_error(r, GROVE_E_NOT_FOUND, "model '%s' is not served here",
                           model ? model : "");
    return;
  }
  pthread_mutex_lock(&tr->mu);
  session *s = tr->sessions[m->index];
  bool ok = s && !atomic_load(&s->closed);
  bool full = false;
  if (ok) {
    pthread_mutex_lock(&s->mu);
    full = s->queued >= SESSION_QUEUE;
    pthread_mutex_unlock(&s->mu);
  }
  /* StopTraining closes at once: what comes after it is refused here. */
  if (ok && !full && kind == J_STOP) atomic_store(&s->closed, true);
  bool queued = ok && !full && enqueue(s, kind, r);
  pthread_mutex_unlock(&tr->mu);
  if (!ok) {
    grove__rpc_reply_error(r, GROVE_E_NOT_FOUND,
                           "model '%s' has no training session (StartTraining first)", m->name);
  } else if (full) {
    grove__rpc_reply_error(r, GROVE_E_RESOURCE_EXHAUSTED,
                           "model '%s': %d training requests are already queued; wait for their "
                           "replies",
                           m->name, SESSION_QUEUE);
  } else if (!queued) {
    /* Out of memory, or the thread has just ended (a failed start). */
    grove__rpc_reply_error(r, GROVE_E_NOT_FOUND,
                           "model '%s' has no training session (StartTraining first)", m->name);
  }
}

/* ================================================================ lifecycle */

grove_status grove__training_start(srv_server *srv, grove_err *err) {
  struct srv_training *tr = calloc(1, sizeof *tr);
  if (!tr || !(tr->sessions = calloc(srv->nmodels + 1, sizeof *tr->sessions))) {
    free(tr);
    return grove_err_set(err, GROVE_E_NOMEM, "out of memory for training sessions");
  }
  tr->srv = srv;
  pthread_mutex_init(&tr->mu, NULL);
  srv->training = tr;
  static const int bodies[] = {GROVE__REQUEST__BODY_START_TRAINING, GROVE__REQUEST__BODY_TRAIN_STEP,
                               GROVE__REQUEST__BODY_EVALUATE, GROVE__REQUEST__BODY_PROMOTE,
                               GROVE__REQUEST__BODY_STOP_TRAINING};
  for (size_t i = 0; i < sizeof bodies / sizeof bodies[0]; i++)
    grove__rpc_set_handler(srv, bodies[i], grove__training_handle, false);
  return GROVE_OK;
}

static void stop_join(session *s) {
  if (!s || !s->started) return;
  pthread_mutex_lock(&s->mu);
  s->stop = true;
  pthread_cond_signal(&s->cv);
  pthread_mutex_unlock(&s->mu);
  pthread_join(s->thread, NULL);
  s->started = false;
}

void grove__training_stop(srv_server *srv) {
  struct srv_training *tr = srv->training;
  if (!tr) return;
  /* No RPC runs any more (the workers and NNG callbacks are done with new
   * requests by now), so the table is stable. */
  for (size_t i = 0; i < srv->nmodels; i++) stop_join(tr->sessions[i]);
  for (session *x = tr->retired; x; x = x->next_retired) stop_join(x);
}

void grove__training_free(srv_server *srv) {
  struct srv_training *tr = srv->training;
  if (!tr) return;
  grove__training_stop(srv);
  for (size_t i = 0; i < srv->nmodels; i++) session_free(tr->sessions[i]);
  for (session *x = tr->retired, *n; x; x = n) {
    n = x->next_retired;
    session_free(x);
  }
  free(tr->sessions);
  pthread_mutex_destroy(&tr->mu);
  free(tr);
  srv->training = NULL;
}
