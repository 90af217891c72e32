/* layers_embedding.c: torch.nn.Embedding, a row lookup: indices of any shape
 * (int64 or int32) -> [..., embedding_dim].
 *
 * Every index is checked against num_embeddings before any row is copied: an
 * index from a request is user input, and a bad one is GROVE_E_RANGE naming
 * the index, its position and the bound, never a read out of bounds.  The
 * weight is read in place (it may be large, and may be a zero-copy view of a
 * checkpoint), with its own strides.  Strided indices are copied into the
 * arena first. */
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "layers_internal.h"

typedef struct embedding_impl {
  int64_t num_embeddings, embedding_dim;
  int64_t padding_idx; /* -1 for None; only matters for training */
  bool scale_grad_by_freq, sparse; /* only matter for training */
} embedding_impl;

void grove__embedding_settings(const grove_module *m, grove__layer_settings *s) {
  const embedding_impl *p = m->impl;
  s->padding_idx = p->padding_idx;
  s->scale_grad_by_freq = p->scale_grad_by_freq;
  s->sparse = p->sparse;
}

int64_t grove__embedding_padding_idx(const grove_module *m) {
  const embedding_impl *p = m->impl;
  return p->padding_idx;
}

static inline int64_t index_at(const grove_tensor *idx, int64_t i) {
  return idx->dtype == GROVE_I64 ? ((const int64_t *)idx->data)[i]
                                 : (int64_t)((const int32_t *)idx->data)[i];
}

/* Every index of idx in [0, V), before any row is read (they come from
 * requests): GROVE_E_RANGE naming the first bad one, its position and the
 * bound. */
static grove_status check_indices(grove_fwd *f, const char *T, const grove_tensor *idx,
                                  int64_t V) {
  const int64_t n = grove_tensor_numel(idx);
  for (int64_t i = 0; i < n; i++) {
    const int64_t v = index_at(idx, i);
    if (v < 0 || v >= V) {
      char sh[128];
      grove_shape_str(idx->ndim, idx->shape, sh, sizeof sh);
      return grove_err_set(f->err, GROVE_E_RANGE,
                           "%s: index %" PRId64 " (at flat position %" PRId64
                           " of indices %s) is out of range: num_embeddings is %" PRId64
                           ", so an index must be in [0, %" PRId64 "]",
                           T, v, i, sh, V, V - 1);
    }
  }
  return GROVE_OK;
}

/* The constructors' checks of a table's sizes and padding_idx. */
static grove_status check_table(const char *T, int64_t V, int64_t D, int64_t padding_idx,
                                grove_err *err) {
  uint64_t nw;
  if (V <= 0 || D <= 0 || grove__mul_overflow_u64((uint64_t)V, (uint64_t)D, &nw) ||
      nw > (uint64_t)INT64_MAX / sizeof(float))
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT,
                         "%s: num_embeddings and embedding_dim must be positive and their "
                         "product representable, got %lld and %lld",
                         T, (long long)V, (long long)D);
  if (padding_idx >= V)
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT,
                         "%s: padding_idx %lld must be within num_embeddings %lld", T,
                         (long long)padding_idx, (long long)V);
  return GROVE_OK;
}

static grove_status embedding_forward(const grove_module *m, grove_fwd *f, const grove_values *in,
                                      grove_values *out) {
  const embedding_impl *p = m->impl;
  const int64_t V = p->num_embeddings, D = p->embedding_dim;
  if (in->n != 1)
    return grove_err_set(f->err, GROVE_E_INVALID_ARGUMENT,
                         "Embedding: expected 1 input tensor, got %d", in->n);
  grove_dtype dt = in->v[0].dtype;
  if (dt != GROVE_I64 && dt != GROVE_I32)
    return grove_err_set(f->err, GROVE_E_DTYPE, "Embedding: indices must be int64 or int32, got %s",
                         grove_dtype_name(dt));
  grove_tensor idx;
  grove_status s = grove__layer_input("Embedding", f, in, dt, &idx);
  if (s != GROVE_OK) return s;
  if (idx.ndim + 1 > GROVE_MAX_DIMS) {
    char got[128];
    grove_shape_str(idx.ndim, idx.shape, got, sizeof got);
    return grove_err_set(f->err, GROVE_E_SHAPE,
                         "Embedding: indices of shape %s would give a %d-d output; at most %d "
                         "dimensions are supported",
                         got, idx.ndim + 1, GROVE_MAX_DIMS);
  }
  const grove_tensor *w = grove_module_param(m, "weight");
  if (!w || w->dtype != GROVE_F32 || w->ndim != 2 || w->shape[0] != V || w->shape[1] != D)
    return grove_err_set(f->err, GROVE_E_INTERNAL,
                         "Embedding: weight is missing or not a float32 [%lld, %lld] tensor",
                         (long long)V, (long long)D);

  const int64_t n = grove_tensor_numel(&idx);
  if ((s = check_indices(f, "Embedding", &idx, V))) return s;

  int64_t shape[GROVE_MAX_DIMS];
  memcpy(shape, idx.shape, (size_t)idx.ndim * sizeof(int64_t));
  shape[idx.ndim] = D;
  s = grove_fwd_alloc(f, &out->v[0], GROVE_F32, idx.ndim + 1, shape);
  if (s != GROVE_OK) return s;
  out->n = 1;
  float *y = out->v[0].data;
  const float *wd = w->data;
  const int64_t rs = w->strides[0], cs = w->strides[1];
  for (int64_t i = 0; i < n; i++) {
    const int64_t v = index_at(&idx, i);
    const float *row = wd + v * rs;
    float *yr = y + i * D;
    if (cs == 1) {
      memcpy(yr, row, (size_t)D * sizeof(float));
    } else {
      for (int64_t j = 0; j < D; j++) yr[j] = row[j * cs];
    }
  }
  return GROVE_OK;
}

const grove_module_type grove__embedding_type = {
    .name = "Embedding",
    .forward = embedding_forward,
};

grove_status grove_embedding_new(int64_t num_embeddings, int64_t embedding_dim, int64_t padding_idx,
                                 grove_module **out, grove_err *err) {
  *out = NULL;
  grove_status cs = check_table("Embedding", num_embeddings, embedding_dim, padding_idx, err);
  if (cs != GROVE_OK) return cs;
  embedding_impl *p = calloc(1, sizeof *p);
  if (!p) return grove_err_set(err, GROVE_E_NOMEM, "Embedding: out of memory");
  p->num_embeddings = num_embeddings;
  p->embedding_dim = embedding_dim;
  p->padding_idx = padding_idx < 0 ? -1 : padding_idx;
  grove_module *m = grove_module_new(&grove__embedding_type, p, err);
  if (!m) return err && err->code != GROVE_OK ? err->code : GROVE_E_NOMEM;
  int64_t shape[2] = {num_embeddings, embedding_dim};
  grove_tensor *w = grove_tensor_new(GROVE_F32, 2, shape, err);
  grove_status s = w ? grove_module_register_parameter(m, "weight", w, err)
                     : (err && err->code != GROVE_OK ? err->code : GROVE_E_NOMEM);
  grove_tensor_release(w);
  if (s != GROVE_OK) {
    grove_module_release(m);
    return s;
  }
  *out = m;
  return GROVE_OK;
}

/* torch's arguments.  scale_grad_by_freq and sparse only matter to training
 * and are kept for the replica; norm_type is accepted and ignored, which only matters with
 * max_norm.  max_norm renormalises the weight rows during forward (it writes
 * to the weight), which a serving tree never does: refused. */
/* The arguments Embedding and EmbeddingBag share: num_embeddings,
 * embedding_dim, padding_idx (normalised, -1 for None), and max_norm
 * (refused), norm_type, scale_grad_by_freq, sparse (accepted, no effect). */
static grove_status table_args(const json_t *obj, const char *path, const char *T, int64_t *V,
                               int64_t *D, int64_t *pad, bool *scale, bool *sparse,
                               grove_err *err) {
  bool pad_null;
  double norm_type;
  grove_status s = grove__json_int(obj, path, T, "num_embeddings", true, 0, 1, INT64_MAX, V, err);
  if (!s) s = grove__json_int(obj, path, T, "embedding_dim", true, 0, 1, INT64_MAX, D, err);
  if (!s)
    s = grove__json_int_or_null(obj, path, T, "padding_idx", true, 0, -*V, *V - 1, pad,
                                &pad_null, err);
  if (s != GROVE_OK) return s;
  const json_t *mn = json_object_get(obj, "max_norm");
  if (mn && !json_is_null(mn)) {
    char why[160];
    snprintf(why, sizeof why,
             "%s with max_norm is not supported (it renormalises the weight during forward); "
             "export with max_norm=None",
             T);
    return grove__json_unsupported(path, "max_norm", why, err);
  }
  s = grove__json_number(obj, path, T, "norm_type", 2.0, -INFINITY, INFINITY, &norm_type, err);
  if (!s) s = grove__json_bool(obj, path, T, "scale_grad_by_freq", false, scale, err);
  if (!s) s = grove__json_bool(obj, path, T, "sparse", false, sparse, err);
  /* torch normalises a negative padding_idx to padding_idx + num_embeddings. */
  if (pad_null)
    *pad = -1;
  else if (*pad < 0)
    *pad += *V;
  return s;
}

grove_status grove__embedding_from_json(const json_t *obj, const char *path, grove_module **out,
                                        grove_err *err) {
  static const char *const keys[] = {
      "num_embeddings", "embedding_dim",      "padding_idx", "max_norm",
      "norm_type",      "scale_grad_by_freq", "sparse",      NULL};
  int64_t V, D, pad;
  grove_status s = grove__json_check_keys(obj, path, "Embedding", keys, err);
  bool scale, sparse;
  if (!s) s = table_args(obj, path, "Embedding", &V, &D, &pad, &scale, &sparse, err);
  if (s != GROVE_OK) return s;
  s = grove__json_built(path, grove_embedding_new(V, D, pad, out, err), err);
  if (s) return s;
  /* Training's (the replica reads them, grove__embedding_settings). */
  embedding_impl *p = (*out)->impl;
  p->scale_grad_by_freq = scale;
  p->sparse = sparse;
  return GROVE_OK;
}

/* ------------------------------------------------------------ EmbeddingBag */

/* torch.nn.EmbeddingBag: the sum, mean or max of the rows of each bag, as
 * recommendation models use it.  Bags are the rows of a 2-d input [B, N], or
 * (1-d input) the runs input[offsets[i] : offsets[i + 1]], the last one to the
 * end (include_last_offset: offsets has B + 1 entries and its last closes the
 * last bag).  per_sample_weights (mode sum only, as in torch) scales each
 * row.  Entries equal to padding_idx are left out (a mean divides by the
 * entries kept); an empty bag is zeros in every mode, as torch gives.
 *
 * forward takes input, then optionally offsets, then optionally
 * per_sample_weights (a 2-d input has no offsets: its second tensor, when
 * float32, is per_sample_weights).  Every index and offset is checked before
 * anything is read: they come from requests. */

enum { BAG_SUM, BAG_MEAN, BAG_MAX };

typedef struct embedding_bag_impl {
  int64_t num_embeddings, embedding_dim, padding_idx;
  int mode;
  bool include_last_offset;
} embedding_bag_impl;

static grove_status bag_ints(grove_fwd *f, const grove_tensor *t, const char *what,
                             grove_tensor *out) {
  if (t->dtype != GROVE_I64 && t->dtype != GROVE_I32)
    return grove_err_set(f->err, GROVE_E_DTYPE, "EmbeddingBag: %s must be int64 or int32, got %s",
                         what, grove_dtype_name(t->dtype));
  return grove__fwd_contig(f, t, out);
}

static grove_status embedding_bag_forward(const grove_module *m, grove_fwd *f,
                                          const grove_values *in, grove_values *out) {
  const embedding_bag_impl *p = m->impl;
  const int64_t V = p->num_embeddings, D = p->embedding_dim;
  const char *T = "EmbeddingBag";
  if (in->n < 1 || in->n > 3)
    return grove_err_set(f->err, GROVE_E_INVALID_ARGUMENT,
                         "EmbeddingBag: expected input[, offsets[, per_sample_weights]], got %d "
                         "tensors",
                         in->n);
  grove_tensor idx, offs = {0}, psw = {0};
  bool has_offs = false, has_psw = false;
  grove_status s = bag_ints(f, &in->v[0], "input", &idx);
  if (s != GROVE_OK) return s;
  if (idx.ndim != 1 && idx.ndim != 2)
    return grove__shape_error(f, T, "a 1-d input with offsets or a 2-d input [B, N]", &idx);
  for (int k = 1; k < in->n; k++) {
    const grove_tensor *t = &in->v[k];
    const bool is_psw = k == 2 || (idx.ndim == 2 && grove_dtype_is_float(t->dtype));
    if (is_psw) {
      if (t->dtype != GROVE_F32)
        return grove_err_set(f->err, GROVE_E_DTYPE,
                             "EmbeddingBag: per_sample_weights must be float32, got %s",
                             grove_dtype_name(t->dtype));
      if ((s = grove__fwd_contig(f, t, &psw))) return s;
      has_psw = true;
    } else {
      if ((s = bag_ints(f, t, "offsets", &offs))) return s;
      has_offs = true;
    }
  }
  if (idx.ndim == 2 && has_offs)
    return grove_err_set(f->err, GROVE_E_INVALID_ARGUMENT,
                         "EmbeddingBag: if input is 2D, then offsets has to be None, as input is "
                         "treated is a mini-batch of fixed length sequences");
  if (idx.ndim == 1 && !has_offs)
    return grove_err_set(f->err, GROVE_E_INVALID_ARGUMENT,
                         "EmbeddingBag: offsets has to be a 1D Tensor but got None (a 1-d input "
                         "needs offsets)");
  if (has_psw && p->mode != BAG_SUM)
    return grove_err_set(f->err, GROVE_E_INVALID_ARGUMENT,
                         "EmbeddingBag: per_sample_weights was not None. per_sample_weights is "
                         "only supported for mode='sum' (got mode='%s')",
                         p->mode == BAG_MEAN ? "mean" : "max");
  if (has_psw && !grove_tensor_same_shape(&psw, &idx)) {
    char a[128], b[128];
    return grove_err_set(f->err, GROVE_E_SHAPE,
                         "EmbeddingBag: per_sample_weights has shape %s, but input has shape %s "
                         "(they must be the same)",
                         grove_shape_str(psw.ndim, psw.shape, a, sizeof a),
                         grove_shape_str(idx.ndim, idx.shape, b, sizeof b));
  }
  const int64_t n = grove_tensor_numel(&idx);
  if ((s = check_indices(f, T, &idx, V))) return s;
  int64_t B, N = 0, no = 0;
  if (idx.ndim == 2) {
    B = idx.shape[0];
    N = idx.shape[1];
  } else {
    if (offs.ndim != 1)
      return grove__shape_error(f, T, "1-d offsets", &offs);
    no = offs.shape[0];
    B = p->include_last_offset ? no - 1 : no;
    if (B < 0)
      return grove_err_set(f->err, GROVE_E_SHAPE,
                           "EmbeddingBag: include_last_offset needs at least one offset");
    for (int64_t i = 0; i < no; i++) {
      const int64_t o = index_at(&offs, i), prev = i ? index_at(&offs, i - 1) : 0;
      if ((i == 0 && o != 0) || o < prev || o > n)
        return grove_err_set(f->err, GROVE_E_RANGE,
                             "EmbeddingBag: offsets[%" PRId64 "] is %" PRId64
                             "; offsets must start at 0 and not decrease, and none may exceed "
                             "the input's length %" PRId64,
                             i, o, n);
    }
  }
  int64_t shape[2] = {B, D};
  if ((s = grove_fwd_alloc(f, &out->v[0], GROVE_F32, 2, shape))) return s;
  out->n = 1;
  const grove_tensor *w = grove_module_param(m, "weight");
  if (!w || w->dtype != GROVE_F32 || w->ndim != 2 || w->shape[0] != V || w->shape[1] != D)
    return grove_err_set(f->err, GROVE_E_INTERNAL,
                         "EmbeddingBag: weight is missing or not a float32 [%lld, %lld] tensor",
                         (long long)V, (long long)D);
  const float *wd = w->data;
  const int64_t rs = w->strides[0], cs = w->strides[1];
  const float *ws = has_psw ? psw.data : NULL;
  for (int64_t b = 0; b < B; b++) {
    int64_t lo, hi;
    if (idx.ndim == 2) {
      lo = b * N;
      hi = lo + N;
    } else {
      lo = index_at(&offs, b);
      hi = b + 1 < no ? index_at(&offs, b + 1) : n;
    }
    float *y = (float *)out->v[0].data + b * D;
    int64_t kept = 0;
    for (int64_t i = lo; i < hi; i++) {
      const int64_t v = index_at(&idx, i);
      if (v == p->padding_idx) continue;
      const float *row = wd + v * rs;
      const float sc = ws ? ws[i] : 1.0f;
      if (kept == 0 && p->mode == BAG_MAX) {
        for (int64_t j = 0; j < D; j++) y[j] = row[j * cs];
      } else if (kept == 0) {
        for (int64_t j = 0; j < D; j++) y[j] = sc * row[j * cs];
      } else if (p->mode == BAG_MAX) {
        for (int64_t j = 0; j < D; j++) y[j] = row[j * cs] > y[j] ? row[j * cs] : y[j];
      } else {
        for (int64_t j = 0; j < D; j++) y[j] += sc * row[j * cs];
      }
      kept++;
    }
    if (kept == 0) memset(y, 0, (size_t)D * sizeof(float));
    if (kept > 1 && p->mode == BAG_MEAN)
      for (int64_t j = 0; j < D; j++) y[j] /= (float)kept;
  }
  return GROVE_OK;
}

const grove_module_type grove__embedding_bag_type = {
    .name = "EmbeddingBag",
    .forward = embedding_bag_forward,
};

grove_status grove_embedding_bag_new(int64_t num_embeddings, int64_t embedding_dim,
                                     const char *mode, bool include_last_offset,
                                     int64_t padding_idx, grove_module **out, grove_err *err) {
  *out = NULL;
  int md;
  if (!mode || strcmp(mode, "mean") == 0)
    md = BAG_MEAN;
  else if (strcmp(mode, "sum") == 0)
    md = BAG_SUM;
  else if (strcmp(mode, "max") == 0)
    md = BAG_MAX;
  else
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT,
                         "EmbeddingBag: mode must be sum, mean or max, got \"%s\"", mode);
  grove_status cs = check_table("EmbeddingBag", num_embeddings, embedding_dim, padding_idx, err);
  if (cs != GROVE_OK) return cs;
  embedding_bag_impl *p = malloc(sizeof *p);
  if (!p) return grove_err_set(err, GROVE_E_NOMEM, "EmbeddingBag: out of memory");
  *p = (embedding_bag_impl){num_embeddings, embedding_dim, padding_idx < 0 ? -1 : padding_idx, md,
                            include_last_offset};
  grove_module *m = NULL;
  grove_status s = grove__layer_make(&grove__embedding_bag_type, p, &m, err);
  if (s != GROVE_OK) return s;
  int64_t shape[2] = {num_embeddings, embedding_dim};
  s = grove__layer_param(m, "weight", false, 2, shape, GROVE_F32, 0, err);
  if (s != GROVE_OK) {
    grove_module_release(m);
    return s;
  }
  *out = m;
  return GROVE_OK;
}

/* torch's arguments; max_norm refused as for Embedding, scale_grad_by_freq
 * and sparse (training only) accepted. */
grove_status grove__embedding_bag_from_json(const json_t *obj, const char *path,
                                            grove_module **out, grove_err *err) {
  static const char *const keys[] = {"num_embeddings",     "embedding_dim", "max_norm",
                                     "norm_type",          "scale_grad_by_freq", "mode",
                                     "sparse",             "include_last_offset", "padding_idx",
                                     NULL};
  static const char *const modes[] = {"sum", "mean", "max", NULL};
  const char *T = "EmbeddingBag";
  int64_t V, D, pad;
  bool last;
  int mode;
  grove_status s = grove__json_check_keys(obj, path, T, keys, err);
  bool scale, sparse; /* accepted as torch does; a bag has no training here */
  if (!s) s = table_args(obj, path, T, &V, &D, &pad, &scale, &sparse, err);
  if (!s) s = grove__json_bool(obj, path, T, "include_last_offset", false, &last, err);
  if (!s) s = grove__json_choice(obj, path, T, "mode", 1, modes, &mode, err);
  if (s != GROVE_OK) return s;
  return grove__json_built(path, grove_embedding_bag_new(V, D, modes[mode], last, pad, out, err),
                           err);
}
