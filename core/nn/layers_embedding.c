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
  for (int64_t i = 0; i < n; i++) {
    const int64_t v = index_at(&idx, i);
    if (v < 0 || v >= V) {
      char sh[128];
      grove_shape_str(idx.ndim, idx.shape, sh, sizeof sh);
      return grove_err_set(f->err, GROVE_E_RANGE,
                           "Embedding: index %" PRId64 " (at flat position %" PRId64
                           " of indices %s) is out of range: num_embeddings is %" PRId64
                           ", so an index must be in [0, %" PRId64 "]",
                           v, i, sh, V, V - 1);
    }
  }

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
  uint64_t nw;
  if (num_embeddings <= 0 || embedding_dim <= 0 ||
      grove__mul_overflow_u64((uint64_t)num_embeddings, (uint64_t)embedding_dim, &nw) ||
      nw > (uint64_t)INT64_MAX / sizeof(float))
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT,
                         "Embedding: num_embeddings and embedding_dim must be positive and "
                         "their product representable, got %lld and %lld",
                         (long long)num_embeddings, (long long)embedding_dim);
  if (padding_idx >= num_embeddings)
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT,
                         "Embedding: padding_idx %lld must be within num_embeddings %lld",
                         (long long)padding_idx, (long long)num_embeddings);
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
grove_status grove__embedding_from_json(const json_t *obj, const char *path, grove_module **out,
                                        grove_err *err) {
  static const char *const keys[] = {
      "num_embeddings", "embedding_dim",      "padding_idx", "max_norm",
      "norm_type",      "scale_grad_by_freq", "sparse",      NULL};
  const char *T = "Embedding";
  int64_t V, D, pad;
  bool pad_null, scale, sparse;
  double norm_type;
  grove_status s = grove__json_check_keys(obj, path, T, keys, err);
  if (!s) s = grove__json_int(obj, path, T, "num_embeddings", true, 0, 1, INT64_MAX, &V, err);
  if (!s) s = grove__json_int(obj, path, T, "embedding_dim", true, 0, 1, INT64_MAX, &D, err);
  if (!s)
    s = grove__json_int_or_null(obj, path, T, "padding_idx", true, 0, -V, V - 1, &pad, &pad_null,
                                err);
  if (s != GROVE_OK) return s;
  const json_t *mn = json_object_get(obj, "max_norm");
  if (mn && !json_is_null(mn))
    return grove__json_unsupported(path, "max_norm",
                                   "Embedding with max_norm is not supported (it renormalises "
                                   "the weight during forward); export with max_norm=None",
                                   err);
  s = grove__json_number(obj, path, T, "norm_type", 2.0, -INFINITY, INFINITY, &norm_type, err);
  if (!s) s = grove__json_bool(obj, path, T, "scale_grad_by_freq", false, &scale, err);
  if (!s) s = grove__json_bool(obj, path, T, "sparse", false, &sparse, err);
  if (s != GROVE_OK) return s;
  /* torch normalises a negative padding_idx to padding_idx + num_embeddings. */
  if (!pad_null && pad < 0) pad += V;
  s = grove__json_built(path, grove_embedding_new(V, D, pad_null ? -1 : pad, out, err), err);
  if (s) return s;
  embedding_impl *p = (*out)->impl;
  p->scale_grad_by_freq = scale;
  p->sparse = sparse;
  return GROVE_OK;
}
