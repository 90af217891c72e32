/* optim_io.c: an optimizer's state_dict as torch.save writes it, and back.
 *
 * torch.save(optimizer.state_dict()) pickles nested Python containers:
 *
 *   {"state": {0: {"step": tensor(3.), "exp_avg": T, "exp_avg_sq": T}, ...},
 *    "param_groups": [{"lr": 0.001, "betas": (0.9, 0.999), ..., "params": [0, 1]}]}
 *
 * grove_torch_write (torch_save.c) writes a flat dict of tensors only, so
 * this file has its own small pickler for these containers (ints, floats,
 * bools, None, strings, tuples, lists, dicts and tensors), emitting the same
 * protocol-2 opcodes and the same zip layout (NAME/data.pkl, NAME/byteorder,
 * NAME/data/K, NAME/version) through torch_internal.h's zip writer; the
 * reader walks the restricted unpickler's value tree (pickle.c).  Both stay
 * within torch.load(weights_only=True)'s allow-list.
 *
 * Indices are torch's: parameters are numbered across the groups in group
 * order (the k-th parameter of the concatenated group lists is k), which is
 * what optimizer.load_state_dict maps back onto its own groups.  Keys of
 * each group and state are torch 1.13's, in its order. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "optim_internal.h"
#include "torch_internal.h"

/* ================================================================ pickle out */

/* The pickle (the writer of core/io/pickle_write.c) and the tensors whose
 * storages it names, in order. */
typedef struct pkw {
  grove__pkw w;
  const grove_tensor **tensors; /* storage k = tensors[k] */
  size_t ntensors, tcap;
} pkw;

/* _rebuild_tensor_v2(('storage', torch.FloatStorage, 'K', 'cpu', numel),
 * 0, size, stride, False, OrderedDict()) on a new storage K. */
static void tensor(pkw *b, const grove_tensor *t) {
  if (b->ntensors == b->tcap) {
    size_t cap = b->tcap ? b->tcap * 2 : 16;
    const grove_tensor **ts = realloc(b->tensors, cap * sizeof *ts);
    if (!ts) {
      b->w.oom = true;
      return;
    }
    b->tensors = ts;
    b->tcap = cap;
  }
  size_t k = b->ntensors;
  b->tensors[b->ntensors++] = t;
  grove__pkw_global(&b->w, "torch._utils", "_rebuild_tensor_v2");
  grove__pkw_op(&b->w, '(');
  grove__pkw_op(&b->w, '(');
  grove__pkw_str(&b->w, "storage");
  grove__pkw_global(&b->w, "torch", "FloatStorage");
  char key[32];
  snprintf(key, sizeof key, "%zu", k);
  grove__pkw_str(&b->w, key);
  grove__pkw_str(&b->w, "cpu");
  grove__pkw_int(&b->w, grove_tensor_numel(t));
  grove__pkw_op(&b->w, 't');
  grove__pkw_op(&b->w, 'Q');
  grove__pkw_int(&b->w, 0);
  int64_t strides[GROVE_MAX_DIMS];
  grove_contiguous_strides(t->ndim, t->shape, strides);
  grove__pkw_int_tuple(&b->w, t->ndim, t->shape);
  grove__pkw_int_tuple(&b->w, t->ndim, strides);
  grove__pkw_bool(&b->w, false);
  grove__pkw_global(&b->w, "collections", "OrderedDict");
  grove__pkw_op(&b->w, ')');
  grove__pkw_op(&b->w, 'R');
  grove__pkw_op(&b->w, 't');
  grove__pkw_op(&b->w, 'R');
}

/* torch's packed index of every parameter: its position in the
 * concatenated group lists. */
static void packed_index(const grove_optim *o, size_t *packed) {
  size_t k = 0;
  for (size_t g = 0; g < o->ngroups; g++)
    for (size_t j = 0; j < o->groups[g].n; j++) packed[o->groups[g].idx[j]] = k++;
}

static void group_dict(pkw *b, const grove_optim *o, size_t g, size_t *next) {
  const grove_optim_hparams *h = &o->groups[g].h;
  grove__pkw_op(&b->w, '}');
  grove__pkw_op(&b->w, '(');
  grove__pkw_str(&b->w, "lr");
  grove__pkw_float(&b->w, h->lr);
  if (o->kind == GROVE_OPTIM_SGD) {
    grove__pkw_str(&b->w, "momentum");
    grove__pkw_float(&b->w, h->momentum);
    grove__pkw_str(&b->w, "dampening");
    grove__pkw_float(&b->w, h->dampening);
    grove__pkw_str(&b->w, "weight_decay");
    grove__pkw_float(&b->w, h->weight_decay);
    grove__pkw_str(&b->w, "nesterov");
    grove__pkw_bool(&b->w, h->nesterov);
    grove__pkw_str(&b->w, "maximize");
    grove__pkw_bool(&b->w, h->maximize);
    grove__pkw_str(&b->w, "foreach");
    grove__pkw_op(&b->w, 'N');
    grove__pkw_str(&b->w, "differentiable");
    grove__pkw_bool(&b->w, false);
  } else {
    grove__pkw_str(&b->w, "betas");
    grove__pkw_float(&b->w, h->beta1);
    grove__pkw_float(&b->w, h->beta2);
    grove__pkw_op(&b->w, 0x86); /* TUPLE2 */
    grove__pkw_str(&b->w, "eps");
    grove__pkw_float(&b->w, h->eps);
    grove__pkw_str(&b->w, "weight_decay");
    grove__pkw_float(&b->w, h->weight_decay);
    grove__pkw_str(&b->w, "amsgrad");
    grove__pkw_bool(&b->w, h->amsgrad);
    if (o->kind == GROVE_OPTIM_ADAM) {
      grove__pkw_str(&b->w, "maximize");
      grove__pkw_bool(&b->w, h->maximize);
      grove__pkw_str(&b->w, "foreach");
      grove__pkw_op(&b->w, 'N');
    } else {
      grove__pkw_str(&b->w, "foreach");
      grove__pkw_op(&b->w, 'N');
      grove__pkw_str(&b->w, "maximize");
      grove__pkw_bool(&b->w, h->maximize);
    }
    grove__pkw_str(&b->w, "capturable");
    grove__pkw_bool(&b->w, false);
    if (o->kind == GROVE_OPTIM_ADAM) {
      grove__pkw_str(&b->w, "differentiable");
      grove__pkw_bool(&b->w, false);
      grove__pkw_str(&b->w, "fused");
      grove__pkw_bool(&b->w, false);
    }
  }
  grove__pkw_str(&b->w, "params");
  grove__pkw_op(&b->w, ']');
  if (o->groups[g].n) {
    grove__pkw_op(&b->w, '(');
    for (size_t j = 0; j < o->groups[g].n; j++) grove__pkw_int(&b->w, (int64_t)(*next)++);
    grove__pkw_op(&b->w, 'e');
  }
  grove__pkw_op(&b->w, 'u');
}

/* The 0-d float32 "step" tensors live here while the pickle is written. */
static grove_status build(pkw *b, const grove_optim *o, grove_tensor **steps, grove_err *err) {
  size_t *packed = malloc((o->nparams + 1) * sizeof *packed);
  if (!packed) return grove_err_set(err, GROVE_E_NOMEM, "out of memory");
  packed_index(o, packed);
  uint8_t proto[2] = {0x80, 2};
  grove__pkw_put(&b->w, proto, 2);
  grove__pkw_op(&b->w, '}');
  grove__pkw_op(&b->w, '(');
  grove__pkw_str(&b->w, "state");
  grove__pkw_op(&b->w, '}');
  if (o->norder) grove__pkw_op(&b->w, '(');
  for (size_t k = 0; k < o->norder; k++) {
    size_t i = o->order[k];
    const grove__pstate *st = &o->state[i];
    grove__pkw_int(&b->w, (int64_t)packed[i]);
    grove__pkw_op(&b->w, '}');
    grove__pkw_op(&b->w, '(');
    if (o->kind == GROVE_OPTIM_SGD) {
      grove__pkw_str(&b->w, "momentum_buffer");
      if (st->buf)
        tensor(b, st->buf);
      else
        grove__pkw_op(&b->w, 'N');
    } else {
      steps[k] = grove_tensor_new(GROVE_F32, 0, NULL, err);
      if (!steps[k]) {
        free(packed);
        return err && err->code ? err->code : GROVE_E_NOMEM;
      }
      *(float *)steps[k]->data = st->step;
      grove__pkw_str(&b->w, "step");
      tensor(b, steps[k]);
      grove__pkw_str(&b->w, "exp_avg");
      tensor(b, st->buf);
      grove__pkw_str(&b->w, "exp_avg_sq");
      tensor(b, st->sq);
      if (st->maxsq) {
        grove__pkw_str(&b->w, "max_exp_avg_sq");
        tensor(b, st->maxsq);
      }
    }
    grove__pkw_op(&b->w, 'u');
  }
  if (o->norder) grove__pkw_op(&b->w, 'u');
  grove__pkw_str(&b->w, "param_groups");
  grove__pkw_op(&b->w, ']');
  grove__pkw_op(&b->w, '(');
  size_t next = 0;
  for (size_t g = 0; g < o->ngroups; g++) group_dict(b, o, g, &next);
  grove__pkw_op(&b->w, 'e');
  grove__pkw_op(&b->w, 'u');
  grove__pkw_op(&b->w, '.');
  free(packed);
  return b->w.oom ? grove_err_set(err, GROVE_E_NOMEM, "out of memory") : GROVE_OK;
}

static char *archive_of(const char *path) {
  char *name = grove_torch_archive_name(path);
  return name;
}

grove_status grove_optim_save(const grove_optim *o, const char *path, grove_err *err) {
  pkw b = {0};
  grove_tensor **steps = calloc(o->norder + 1, sizeof *steps);
  char *archive = archive_of(path);
  char *rec = archive ? malloc(strlen(archive) + 64) : NULL;
  grove_status s = steps && rec ? GROVE_OK : grove_err_set(err, GROVE_E_NOMEM, "out of memory");
  if (!s) s = build(&b, o, steps, err);
  grove__atomic_file f = {0};
  bool opened = false;
  if (!s) {
    s = grove__atomic_open(&f, path, err);
    opened = s == GROVE_OK;
  }
  grove__zipw *w = NULL;
  if (!s && !(w = grove__zipw_new(f.fd, path, NULL)))
    s = grove_err_set(err, GROVE_E_NOMEM, "%s: out of memory", path);
  size_t alen = archive ? strlen(archive) + 64 : 0;
  if (!s) {
    snprintf(rec, alen, "%s/data.pkl", archive);
    s = grove__zipw_add(w, rec, b.w.p, b.w.n, err);
  }
  if (!s) {
    snprintf(rec, alen, "%s/byteorder", archive);
    s = grove__zipw_add(w, rec, "little", 6, err);
  }
  for (size_t k = 0; !s && k < b.ntensors; k++) {
    snprintf(rec, alen, "%s/data/%zu", archive, k);
    s = grove__zipw_add(w, rec, b.tensors[k]->data, grove_tensor_nbytes(b.tensors[k]), err);
  }
  if (!s) {
    snprintf(rec, alen, "%s/version", archive);
    s = grove__zipw_add(w, rec, "3\n", 2, err);
  }
  if (!s) s = grove__zipw_finish(w, err);
  grove__zipw_free(w);
  if (opened) s = grove__atomic_finish(&f, s, err);
  for (size_t k = 0; steps && k < o->norder; k++) grove_tensor_release(steps[k]);
  free(steps);
  grove__pkw_fini(&b.w);
  free(b.tensors);
  free(archive);
  free(rec);
  return s;
}

/* ================================================================ load */

typedef struct reader {
  const char *path;
  grove__zip zip;
  char *prefix; /* "archive/" */
  grove_err *err;
} reader;

static grove_status bad(reader *rd, const char *what) {
  return grove_err_set(rd->err, GROVE_E_FORMAT, "%s: not an optimizer state_dict: %s", rd->path,
                       what);
}

static bool as_int(const grove__pk *v, int64_t *out) {
  if (!v) return false;
  if (v->kind == GROVE__PK_INT) {
    *out = v->u.i;
    return true;
  }
  if (v->kind == GROVE__PK_BOOL) {
    *out = v->u.b;
    return true;
  }
  return false;
}

static bool as_num(const grove__pk *v, double *out) {
  if (!v) return false;
  if (v->kind == GROVE__PK_FLOAT) {
    *out = v->u.f;
    return true;
  }
  int64_t i;
  if (as_int(v, &i)) {
    *out = (double)i;
    return true;
  }
  return false;
}

static int read_dims(const grove__pk *t, int64_t *dims) {
  if (!t || t->kind != GROVE__PK_TUPLE || t->u.seq.n > GROVE_MAX_DIMS) return -1;
  for (size_t i = 0; i < t->u.seq.n; i++)
    if (!as_int(t->u.seq.items[i], &dims[i]) || dims[i] < 0) return -1;
  return (int)t->u.seq.n;
}

/* A tensor of the pickle (_rebuild_tensor_v2 of a storage record), as a new
 * contiguous float32 heap tensor. */
static grove_status read_tensor(reader *rd, const grove__pk *v, const char *what,
                                grove_tensor **out) {
  *out = NULL;
  if (!v || v->kind != GROVE__PK_CALL || v->u.call.func->kind != GROVE__PK_GLOBAL ||
      (v->u.call.func->u.global.tag != GROVE__TAG_REBUILD_TENSOR_V2 &&
       v->u.call.func->u.global.tag != GROVE__TAG_REBUILD_TENSOR) ||
      v->u.call.args->kind != GROVE__PK_TUPLE || v->u.call.args->u.seq.n < 4)
    return grove_err_set(rd->err, GROVE_E_FORMAT, "%s: %s is not a tensor", rd->path, what);
  grove__pk *const *a = v->u.call.args->u.seq.items;
  if (a[0]->kind != GROVE__PK_PERSID || a[0]->u.pid->kind != GROVE__PK_TUPLE ||
      a[0]->u.pid->u.seq.n != 5)
    return grove_err_set(rd->err, GROVE_E_FORMAT, "%s: %s: bad storage reference", rd->path, what);
  grove__pk *const *pid = a[0]->u.pid->u.seq.items;
  if (pid[1]->kind != GROVE__PK_GLOBAL || pid[1]->u.global.tag != GROVE__TAG_STORAGE ||
      !pid[1]->u.global.dtype_ok || pid[1]->u.global.untyped || pid[2]->kind != GROVE__PK_STR ||
      !grove_dtype_is_float(pid[1]->u.global.dtype))
    return grove_err_set(rd->err, GROVE_E_BAD_DTYPE, "%s: %s: expected a floating-point storage",
                         rd->path, what);
  const grove_dtype dt = pid[1]->u.global.dtype;
  int64_t offset, shape[GROVE_MAX_DIMS], strides[GROVE_MAX_DIMS];
  int nd = read_dims(a[2], shape), nd2 = read_dims(a[3], strides);
  if (!as_int(a[1], &offset) || offset < 0 || nd < 0 || nd2 != nd)
    return grove_err_set(rd->err, GROVE_E_FORMAT, "%s: %s: bad offset, size or stride", rd->path,
                         what);
  /* Bounds before anything is read (the view is checked again below); the
   * same helper as every reader, so that offset * element size and a last
   * index of 2^64 - 1 cannot wrap. */
  uint64_t end;
  char sbuf[200], tbuf[200];
  if (!grove__view_end((uint64_t)offset, grove_dtype_size(dt), nd, shape, strides, &end))
    return grove_err_set(rd->err, GROVE_E_BAD_OFFSETS,
                         "%s: %s: a view of shape %s, stride %s at offset %lld overflows 64 bits",
                         rd->path, what, grove_shape_str(nd, shape, sbuf, sizeof sbuf),
                         grove_shape_str(nd, strides, tbuf, sizeof tbuf), (long long)offset);
  char *rec = grove__asprintf("%sdata/%s", rd->prefix, pid[2]->u.str.s);
  if (!rec) return grove_err_set(rd->err, GROVE_E_NOMEM, "out of memory");
  const grove__zip_entry *e = grove__zip_find(&rd->zip, rec);
  free(rec);
  if (!e)
    return grove_err_set(rd->err, GROVE_E_FORMAT, "%s: %s: storage '%s' is missing", rd->path, what,
                         pid[2]->u.str.s);
  if (e->size > ((uint64_t)1 << 40))
    return grove_err_set(rd->err, GROVE_E_LIMIT, "%s: %s: storage too large", rd->path, what);
  grove_storage *st = grove_storage_new((size_t)e->size);
  if (!st) return grove_err_set(rd->err, GROVE_E_NOMEM, "out of memory");
  grove_status s = grove__zip_extract(&rd->zip, e, grove_storage_data(st), rd->err);
  grove_tensor *view = NULL;
  if (!s && end > grove_storage_nbytes(st))
    s = grove_err_set(rd->err, GROVE_E_BAD_OFFSETS,
                      "a view of shape %s, stride %s at offset %lld is out of bounds for storage "
                      "'%s' (%zu bytes)",
                      grove_shape_str(nd, shape, sbuf, sizeof sbuf),
                      grove_shape_str(nd, strides, tbuf, sizeof tbuf), (long long)offset,
                      pid[2]->u.str.s, grove_storage_nbytes(st));
  if (!s) {
    view = grove_tensor_view_new(st, (size_t)offset * grove_dtype_size(dt), dt, nd, shape, strides,
                                 rd->err);
    if (!view) s = rd->err && rd->err->code ? rd->err->code : GROVE_E_FORMAT;
  }
  if (!s && !(*out = grove_tensor_clone(view, GROVE_F32, rd->err)))
    s = rd->err && rd->err->code ? rd->err->code : GROVE_E_NOMEM;
  if (s) grove_err_prefix(rd->err, "%s: %s", rd->path, what);
  grove_tensor_release(view);
  grove_storage_release(st);
  return s;
}

static const grove__pk *dget(const grove__pk *d, const char *k) {
  return grove__pk_dict_get(d, k);
}

/* A group's hyperparameters from its dict, on top of the current ones. */
static grove_status read_group(reader *rd, grove_optim_kind kind, const grove__pk *d, size_t g,
                               grove_optim_hparams *h) {
  const grove__pk *v;
  char what[64];
  snprintf(what, sizeof what, "param_groups[%zu]", g);
  int64_t b;
  if ((v = dget(d, "lr")) && !as_num(v, &h->lr)) return bad(rd, what);
  if ((v = dget(d, "weight_decay")) && !as_num(v, &h->weight_decay)) return bad(rd, what);
  if ((v = dget(d, "maximize")) && v->kind != GROVE__PK_NONE) {
    if (!as_int(v, &b)) return bad(rd, what);
    h->maximize = b;
  }
  if (kind == GROVE_OPTIM_SGD) {
    if ((v = dget(d, "momentum")) && !as_num(v, &h->momentum)) return bad(rd, what);
    if ((v = dget(d, "dampening")) && !as_num(v, &h->dampening)) return bad(rd, what);
    if ((v = dget(d, "nesterov"))) {
      if (!as_int(v, &b)) return bad(rd, what);
      h->nesterov = b;
    }
  } else {
    if ((v = dget(d, "betas"))) {
      if ((v->kind != GROVE__PK_TUPLE && v->kind != GROVE__PK_LIST) || v->u.seq.n != 2 ||
          !as_num(v->u.seq.items[0], &h->beta1) || !as_num(v->u.seq.items[1], &h->beta2))
        return bad(rd, what);
    }
    if ((v = dget(d, "eps")) && !as_num(v, &h->eps)) return bad(rd, what);
    if ((v = dget(d, "amsgrad"))) {
      if (!as_int(v, &b)) return bad(rd, what);
      h->amsgrad = b;
    }
  }
  grove_status s = grove__optim_check(kind, h, rd->err);
  if (s) grove_err_prefix(rd->err, "%s: %s", rd->path, what);
  return s;
}

typedef struct field {
  const char *key;
  grove_tensor **dst;
  bool required;
} field;

static grove_status read_state(reader *rd, const grove_optim *o, size_t i, const grove__pk *d,
                               const grove_optim_hparams *h, grove__pstate *st) {
  char what[96];
  const grove_tensor *p = o->params[i];
  grove_status s = GROVE_OK;
  if (!d || d->kind != GROVE__PK_DICT) {
    snprintf(what, sizeof what, "the state of parameter %zu is not a dict", i);
    return bad(rd, what);
  }
  field fields[4];
  int nf = 0;
  if (o->kind == GROVE_OPTIM_SGD) {
    fields[nf++] = (field){"momentum_buffer", &st->buf, false};
  } else {
    fields[nf++] = (field){"exp_avg", &st->buf, true};
    fields[nf++] = (field){"exp_avg_sq", &st->sq, true};
    fields[nf++] = (field){"max_exp_avg_sq", &st->maxsq, h->amsgrad};
    const grove__pk *sv = dget(d, "step");
    double step;
    if (!sv) {
      snprintf(what, sizeof what, "the state of parameter %zu has no 'step'", i);
      return bad(rd, what);
    }
    if (sv->kind == GROVE__PK_CALL) {
      grove_tensor *t;
      snprintf(what, sizeof what, "state[%zu]['step']", i);
      if ((s = read_tensor(rd, sv, what, &t))) return s;
      bool one = grove_tensor_numel(t) == 1;
      step = one ? *(const float *)t->data : 0;
      grove_tensor_release(t);
      if (!one) return bad(rd, "a 'step' tensor must hold one value");
    } else if (!as_num(sv, &step)) {
      return bad(rd, "'step' must be a number or a tensor");
    }
    st->step = (float)step;
  }
  for (int f = 0; f < nf; f++) {
    const grove__pk *v = dget(d, fields[f].key);
    if (!v || v->kind == GROVE__PK_NONE) {
      if (fields[f].required) {
        snprintf(what, sizeof what,
                 "the state of parameter %zu has no '%s' (saved by another optimizer?)", i,
                 fields[f].key);
        return grove_err_set(rd->err, GROVE_E_STATE_DICT, "%s: %s", rd->path, what);
      }
      continue;
    }
    snprintf(what, sizeof what, "state[%zu]['%s']", i, fields[f].key);
    if ((s = read_tensor(rd, v, what, fields[f].dst))) return s;
    if (!grove_tensor_same_shape(*fields[f].dst, p)) {
      char a[128], b[128];
      return grove_err_set(
          rd->err, GROVE_E_STATE_DICT, "%s: %s has shape %s, the parameter %s", rd->path, what,
          grove_shape_str((*fields[f].dst)->ndim, (*fields[f].dst)->shape, a, sizeof a),
          grove_shape_str(p->ndim, p->shape, b, sizeof b));
    }
  }
  /* SGD with momentum but no buffer yet is a valid state (None). */
  st->has = true;
  return GROVE_OK;
}

grove_status grove_optim_load(grove_optim *o, const char *path, grove_err *err) {
  reader rd = {.path = path, .err = err};
  grove_storage *file = NULL;
  grove__pickle *pk = NULL;
  const grove__pk *root = NULL;
  grove__pstate *nstate = calloc(o->nparams + 1, sizeof *nstate);
  grove_optim_hparams *nh = calloc(o->ngroups + 1, sizeof *nh);
  size_t *norder = malloc((o->nparams + 1) * sizeof *norder), nnorder = 0;
  size_t *by_packed = malloc((o->nparams + 1) * sizeof *by_packed);
  grove_status s = nstate && nh && norder && by_packed
                       ? GROVE_OK
                       : grove_err_set(err, GROVE_E_NOMEM, "out of memory");
  if (!s) s = grove__read_file(path, &file, err);
  if (!s)
    s = grove__zip_open(&rd.zip, grove_storage_data(file), grove_storage_nbytes(file), path, err);
  /* The archive's folder: the one holding data.pkl. */
  const grove__zip_entry *pkl = NULL;
  for (size_t i = 0; !s && i < rd.zip.count && !pkl; i++) {
    const char *nm = rd.zip.entries[i].name;
    size_t len = strlen(nm);
    if (len >= 9 && strcmp(nm + len - 9, "/data.pkl") == 0) {
      pkl = &rd.zip.entries[i];
      if (!(rd.prefix = malloc(len - 7)))
        s = grove_err_set(err, GROVE_E_NOMEM, "out of memory");
      else {
        memcpy(rd.prefix, nm, len - 8);
        rd.prefix[len - 8] = '\0';
      }
    }
  }
  if (!s && !pkl) s = grove_err_set(err, GROVE_E_FORMAT, "%s: no data.pkl in the archive", path);
  uint8_t *pbuf = NULL;
  if (!s && pkl->size > GROVE_PKL_MAX_BYTES)
    s = grove_err_set(err, GROVE_E_LIMIT, "%s: data.pkl is too large", path);
  if (!s && !(pbuf = malloc((size_t)pkl->size + 1)))
    s = grove_err_set(err, GROVE_E_NOMEM, "out of memory");
  if (!s) s = grove__zip_extract(&rd.zip, pkl, pbuf, err);
  if (!s) s = grove__pickle_load(pbuf, (size_t)pkl->size, path, &pk, &root, err);
  const grove__pk *state = NULL, *groups = NULL;
  if (!s) {
    state = root->kind == GROVE__PK_DICT ? dget(root, "state") : NULL;
    groups = root->kind == GROVE__PK_DICT ? dget(root, "param_groups") : NULL;
    if (!state || state->kind != GROVE__PK_DICT || !groups || groups->kind != GROVE__PK_LIST)
      s = bad(&rd, "expected {'state': {...}, 'param_groups': [...]}");
  }
  /* torch's checks, with its messages. */
  if (!s && groups->u.seq.n != o->ngroups)
    s = grove_err_set(err, GROVE_E_STATE_DICT,
                      "%s: loaded state dict has a different number of parameter groups (%zu, "
                      "the optimizer has %zu)",
                      path, groups->u.seq.n, o->ngroups);
  /* id_map: the saved ids of each group, in order, onto our parameters. */
  size_t nsaved = 0;
  int64_t *saved_ids = NULL;
  if (!s && !(saved_ids = malloc((o->nparams + 1) * sizeof *saved_ids)))
    s = grove_err_set(err, GROVE_E_NOMEM, "out of memory");
  for (size_t g = 0; !s && g < o->ngroups; g++) {
    const grove__pk *gd = groups->u.seq.items[g];
    const grove__pk *ps = gd->kind == GROVE__PK_DICT ? dget(gd, "params") : NULL;
    if (!ps || ps->kind != GROVE__PK_LIST) {
      s = bad(&rd, "a param_group has no 'params' list");
      break;
    }
    if (ps->u.seq.n != o->groups[g].n) {
      s = grove_err_set(err, GROVE_E_STATE_DICT,
                        "%s: loaded state dict contains a parameter group that doesn't match "
                        "the size of optimizer's group (group %zu: %zu, the optimizer has %zu)",
                        path, g, ps->u.seq.n, o->groups[g].n);
      break;
    }
    for (size_t j = 0; j < ps->u.seq.n; j++) {
      if (!as_int(ps->u.seq.items[j], &saved_ids[nsaved])) {
        s = bad(&rd, "a parameter id is not an int");
        break;
      }
      by_packed[nsaved++] = o->groups[g].idx[j];
    }
    nh[g] = o->groups[g].h;
    if (!s) s = read_group(&rd, o->kind, gd, g, &nh[g]);
  }
  for (size_t k = 0; !s && k < state->u.seq.n / 2; k++) {
    int64_t id;
    if (!as_int(state->u.seq.items[2 * k], &id)) {
      s = bad(&rd, "a state key is not an int");
      break;
    }
    size_t j = 0;
    while (j < nsaved && saved_ids[j] != id) j++;
    if (j == nsaved) continue; /* torch keeps unmapped state as is; Grove has no use for it */
    size_t i = by_packed[j];
    if (nstate[i].has) continue;
    s = read_state(&rd, o, i, state->u.seq.items[2 * k + 1], &nh[o->group_of[i]], &nstate[i]);
    if (!s) norder[nnorder++] = i;
  }
  if (!s) {
    /* Everything fits: swap it in. */
    for (size_t i = 0; i < o->nparams; i++) {
      grove__pstate_clear(&o->state[i]);
      o->state[i] = nstate[i];
      nstate[i] = (grove__pstate){0};
    }
    for (size_t g = 0; g < o->ngroups; g++) o->groups[g].h = nh[g];
    memcpy(o->order, norder, nnorder * sizeof *norder);
    o->norder = nnorder;
  }
  for (size_t i = 0; nstate && i < o->nparams; i++) grove__pstate_clear(&nstate[i]);
  free(nstate);
  free(nh);
  free(norder);
  free(by_packed);
  free(saved_ids);
  free(pbuf);
  grove__pickle_free(pk);
  free(rd.prefix);
  grove__zip_close(&rd.zip);
  grove_storage_release(file);
  return s;
}
