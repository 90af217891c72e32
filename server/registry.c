/* registry.c: the models groved serves.
 *
 * Every model named on the command line (--model NAME=DIR, --model DIR) or
 * found in the repository (--model-repo DIR: each subdirectory holding a
 * model.json, named after the subdirectory) is opened at start.  The table
 * of models never changes after that: any thread may look a name up without
 * a lock.  What changes is a model's current version, a refcounted
 * grove_model that the loop swaps (hot reload) while batches already
 * dispatched keep the one they took, and whether its batches are held (an
 * in-place reload): this file is the one place both are written
 * (grove__model_install, grove__model_set_paused); reload.c decides when. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "server.h"

void grove__version_retain(srv_version *v) {
  atomic_fetch_add_explicit(&v->refs, 1, memory_order_relaxed);
}

void grove__version_release(srv_version *v) {
  if (!v) return;
  if (atomic_fetch_sub_explicit(&v->refs, 1, memory_order_acq_rel) == 1) {
    /* A version made by an in-place reload shares its base's tree. */
    if (v->base)
      grove__version_release(v->base);
    else
      grove_model_free(v->model);
    free(v->weights_path);
    free(v);
  }
}

srv_version *grove__model_acquire(srv_model *m) {
  pthread_mutex_lock(&m->mu);
  srv_version *v = m->current;
  if (v) grove__version_retain(v);
  pthread_mutex_unlock(&m->mu);
  return v;
}

srv_version *grove__model_install(srv_model *m, srv_version *v) {
  pthread_mutex_lock(&m->mu);
  srv_version *old = m->current;
  m->current = v;
  pthread_mutex_unlock(&m->mu);
  atomic_store(&m->version_number, v->number);
  return old;
}

void grove__model_set_paused(srv_model *m, bool paused) {
  m->paused = paused;
}

srv_model *grove__registry_find(srv_server *srv, const char *name) {
  if (!name) return NULL;
  for (size_t i = 0; i < srv->nmodels; i++)
    if (strcmp(srv->models[i].name, name) == 0) return &srv->models[i];
  return NULL;
}

void grove__registry_names(srv_server *srv, char *buf, size_t n) {
  size_t used = 0;
  buf[0] = 0;
  for (size_t i = 0; i < srv->nmodels && used + 1 < n; i++) {
    int w = snprintf(buf + used, n - used, "%s%s", i ? ", " : "", srv->models[i].name);
    if (w < 0) break;
    used += (size_t)w;
  }
  if (srv->nmodels == 0) snprintf(buf, n, "none");
}

bool grove__registry_ready(srv_server *srv) {
  for (size_t i = 0; i < srv->nmodels; i++)
    if (atomic_load(&srv->models[i].version_number) == 0) return false;
  return true;
}

/* The last path component of dir, trailing slashes ignored. */
static char *dir_base(const char *dir) {
  size_t n = strlen(dir);
  while (n > 1 && dir[n - 1] == '/') n--;
  size_t start = n;
  while (start > 0 && dir[start - 1] != '/') start--;
  return strndup(dir + start, n - start);
}

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

typedef struct pending {
  char *name; /* NULL: from model.json, else the directory's name */
  char *dir;
} pending;

/* Subdirectories of repo that hold a model.json, sorted by name (so the
 * order of models, in logs and status, does not depend on readdir). */
static grove_status scan_repo(const char *repo, pending **list, size_t *n, size_t *cap,
                              grove_err *err) {
  DIR *d = opendir(repo);
  if (!d)
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT, "--model-repo %s: %s", repo,
                         strerror(errno));
  char **names = NULL;
  size_t nn = 0, nc = 0;
  grove_status s = GROVE_OK;
  struct dirent *e;
  while ((e = readdir(d))) {
    /* Hidden entries include the exporter's temporary siblings. */
    if (e->d_name[0] == '.') continue;
    char path[4096];
    struct stat st;
    snprintf(path, sizeof path, "%s/%s/model.json", repo, e->d_name);
    if (stat(path, &st) != 0 || !S_ISREG(st.st_mode)) continue;
    if (nn == nc) {
      nc = nc ? 2 * nc : 16;
      char **g = realloc(names, nc * sizeof *names);
      if (!g) {
        s = grove_err_set(err, GROVE_E_NOMEM, "out of memory");
        break;
      }
      names = g;
    }
    if (!(names[nn] = strdup(e->d_name))) {
      s = grove_err_set(err, GROVE_E_NOMEM, "out of memory");
      break;
    }
    nn++;
  }
  closedir(d);
  if (!s) qsort(names, nn, sizeof *names, cmp_str);
  for (size_t i = 0; i < nn; i++) {
    if (!s && *n == *cap) {
      *cap = *cap ? 2 * *cap : 16;
      pending *g = realloc(*list, *cap * sizeof **list);
      if (!g)
        s = grove_err_set(err, GROVE_E_NOMEM, "out of memory");
      else
        *list = g;
    }
    if (!s) {
      char path[4096];
      snprintf(path, sizeof path, "%s/%s", repo, names[i]);
      (*list)[*n].name = names[i];
      (*list)[*n].dir = strdup(path);
      names[i] = NULL;
      if (!(*list)[(*n)++].dir) s = grove_err_set(err, GROVE_E_NOMEM, "out of memory");
    }
    free(names[i]);
  }
  free(names);
  if (!s && nn == 0)
    grove__slog(GROVE_LOG_WARN, "model.repo_empty",
                "--model-repo %s: no subdirectory holds a "
                "model.json",
                repo);
  return s;
}

/* What groved needs beyond what grove_model_open checks: declared inputs
 * with a batch dimension, and no more of them than a request carries; and
 * whether that dimension batches (grove_model_probe_batching: otherwise the
 * model is served one request per forward). */
grove_status grove__model_check_servable(grove_model *m, grove_err *err) {
  if (m->ninputs == 0)
    return grove_err_set(err, GROVE_E_SPEC,
                         "model.json declares no inputs; groved needs "
                         "\"inputs\" to check requests (tools/grove_export.py writes them)");
  if (m->ninputs > GROVE_MAX_VALUES || m->noutputs > GROVE_MAX_VALUES)
    return grove_err_set(err, GROVE_E_SPEC,
                         "%zu inputs and %zu outputs: groved serves at most "
                         "%d of each",
                         m->ninputs, m->noutputs, GROVE_MAX_VALUES);
  for (size_t i = 0; i < m->ninputs; i++)
    if (m->inputs[i].ndim < 1)
      return grove_err_set(err, GROVE_E_SPEC, "input '%s' has no batch dimension (dim 0)",
                           m->inputs[i].name);
  if (m->batching.max_batch_size < 0 || m->batching.max_queue_size < 1 ||
      m->batching.max_queue_delay_us < 0)
    return grove_err_set(err, GROVE_E_SPEC,
                         "batching: max_batch_size must be >= 0 (0: unbatched), "
                         "max_queue_size >= 1 and max_queue_delay_us >= 0");
  return grove_model_probe_batching(m, err);
}

/* Opens sm->dir into sm->current, or sets sm->error.  name_given: the name
 * came from the command line or the repository, so model.json's does not
 * replace it. */
static grove_status load_one(srv_model *sm, bool name_given, grove_err *oerr) {
  grove_err err = {0};
  grove_model *m = NULL;
  int64_t t0 = grove__now_ns();
  grove_status s = grove_model_open(sm->dir, NULL, &m, &err);
  if (!s) s = grove__model_check_servable(m, &err);
  if (s) {
    grove_model_free(m);
    sm->error = strdup(grove_err_msg(&err));
    grove__slog(GROVE_LOG_ERROR, "model.load_failed", "model %s (%s): %s: %s", sm->name, sm->dir,
                grove_status_name(s), grove_err_msg(&err));
    return sm->error ? GROVE_OK : grove_err_set(oerr, GROVE_E_NOMEM, "out of memory");
  }
  srv_version *v = calloc(1, sizeof *v);
  if (!v) {
    grove_model_free(m);
    return grove_err_set(oerr, GROVE_E_NOMEM, "out of memory");
  }
  if (!name_given && m->name && strcmp(m->name, sm->name) != 0) {
    char *nm = strdup(m->name);
    if (!nm) {
      grove_model_free(m);
      free(v);
      return grove_err_set(oerr, GROVE_E_NOMEM, "out of memory");
    }
    free(sm->name);
    sm->name = nm;
  }
  atomic_init(&v->refs, 1);
  v->number = 1;
  v->model = m;
  grove__model_install(sm, v); /* the first: nothing to release */
  char shape[160];
  const grove_io_spec *in = &m->inputs[0];
  grove__slog(
      GROVE_LOG_INFO, "model.loaded",
      "model %s version 1 from %s: input '%s' %s %s, %" PRId64
      " parameters, %zu bytes "
      "of weights, scratch %zu bytes, batching max_batch_size=%" PRId64
      " max_queue_delay_us=%" PRId64 " max_queue_size=%" PRId64 ", %.1f ms",
      sm->name, m->weights_path ? m->weights_path : sm->dir, in->name, grove_dtype_name(in->dtype),
      grove_shape_str(in->ndim, in->shape, shape, sizeof shape), m->param_count, m->weight_bytes,
      m->arena_bytes, m->batching.max_batch_size, m->batching.max_queue_delay_us,
      m->batching.max_queue_size, (double)(grove__now_ns() - t0) / 1e6);
  return GROVE_OK;
}

grove_status grove__registry_load(srv_server *srv, grove_err *err) {
  const srv_config *cfg = &srv->cfg;
  pending *list = NULL;
  size_t n = 0, cap = 0;
  grove_status s = GROVE_OK;
  for (size_t i = 0; i < cfg->nmodels && !s; i++) {
    if (n == cap) {
      cap = cap ? 2 * cap : 16;
      pending *g = realloc(list, cap * sizeof *list);
      if (!g) {
        s = grove_err_set(err, GROVE_E_NOMEM, "out of memory");
        break;
      }
      list = g;
    }
    list[n].name = cfg->models[i].name ? strdup(cfg->models[i].name) : NULL;
    list[n].dir = strdup(cfg->models[i].dir);
    n++;
    if (!list[n - 1].dir) s = grove_err_set(err, GROVE_E_NOMEM, "out of memory");
  }
  if (!s && cfg->model_repo) s = scan_repo(cfg->model_repo, &list, &n, &cap, err);

  if (!s && n > 0 && !(srv->models = calloc(n, sizeof *srv->models)))
    s = grove_err_set(err, GROVE_E_NOMEM, "out of memory");
  for (size_t i = 0; i < n && !s; i++) {
    srv_model *sm = &srv->models[i];
    sm->index = i;
    pthread_mutex_init(&sm->mu, NULL);
    sm->dir = list[i].dir;
    list[i].dir = NULL;
    srv->nmodels = i + 1;
    /* The name: NAME= on the command line or the repository's directory
     * name; for a bare --model DIR, model.json's "name" once it is read
     * (grove_model_open falls back to the directory's base name). */
    bool given = list[i].name != NULL;
    sm->name = given ? list[i].name : dir_base(sm->dir);
    list[i].name = NULL;
    if (!sm->name) s = grove_err_set(err, GROVE_E_NOMEM, "out of memory");
    if (!s) s = load_one(sm, given, err);
    for (size_t j = 0; j < i && !s; j++)
      if (strcmp(srv->models[j].name, sm->name) == 0)
        s = grove_err_set(err, GROVE_E_INVALID_ARGUMENT,
                          "two models are called '%s' (%s and %s); name them with "
                          "--model NAME=DIR",
                          sm->name, srv->models[j].dir, sm->dir);
  }
  for (size_t i = 0; i < n; i++) {
    free(list[i].name);
    free(list[i].dir);
  }
  free(list);
  return s;
}

void grove__registry_free(srv_server *srv) {
  for (size_t i = 0; i < srv->nmodels; i++) {
    srv_model *m = &srv->models[i];
    grove__version_release(m->current);
    pthread_mutex_destroy(&m->mu);
    free(m->name);
    free(m->dir);
    free(m->error);
  }
  free(srv->models);
  srv->models = NULL;
  srv->nmodels = 0;
}
