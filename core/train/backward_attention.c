/* backward_attention.c: training forwards of MultiheadAttention,
 * TransformerEncoderLayer and TransformerEncoder, composed from the tape's
 * differentiable ops (backward_ops.c, backward_tensor.c), so that their
 * backward is those ops' backwards in reverse.
 *
 * MultiheadAttention follows torch 1.13's F.multi_head_attention_forward
 * without masks: batch-first inputs are transposed to sequence-first, q, k
 * and v are the three row blocks of in_proj_weight applied to query, key and
 * value, heads are split as view(L, N * H, d).transpose(0, 1), q is divided
 * by sqrt(d), attn = softmax(q k^T) (then dropout in training), out =
 * out_proj(attn v) and the returned weights are attn averaged over heads.
 * TransformerEncoderLayer is torch's non-fast path (the one training takes):
 * x + dropout1(self_attn(x)) and x + dropout2(linear2(dropout(act(linear1(x)))))
 * around norm1 / norm2, before (norm_first) or after each block.  The
 * serving forwards of these layers (layers_attention.c) are not used. */
#include <math.h>
#include <string.h>

#include "backward.h"
#include "graph.h"

static inline grove_tensor *val(grove__tape *t, int v) {
  return &t->vars[v].t;
}

static grove_status reshape3(grove__tape *t, int x, int64_t a, int64_t b, int64_t c, int *y) {
  const int64_t sh[3] = {a, b, c};
  return grove__top_reshape(t, x, 3, sh, y);
}

static grove_status perm3(grove__tape *t, int x, int64_t a, int64_t b, int64_t c, int *y) {
  const int64_t d[3] = {a, b, c};
  return grove__top_permute(t, x, 3, d, y);
}

/* Runs the MultiheadAttention m on query q, key k, value v (vars).  *out is
 * the attention output; *weights (when need_weights) the attention weights,
 * averaged over heads when average, else -1. */
grove_status grove__mha_run(grove__tape *t, const grove_module *m, const grove__tinfo *info, int q,
                            int k, int v, bool need_weights, bool average, int *out, int *weights) {
  const char *T = "MultiheadAttention";
  const int64_t E = info->embed_dim, H = info->num_heads, d = E / H;
  const grove_tensor *qt = val(t, q), *kt = val(t, k), *vt = val(t, v);
  const bool batched = qt->ndim == 3;
  if ((qt->ndim != 2 && qt->ndim != 3) || kt->ndim != qt->ndim || vt->ndim != qt->ndim ||
      qt->shape[qt->ndim - 1] != E || kt->shape[kt->ndim - 1] != E ||
      vt->shape[vt->ndim - 1] != E) {
    char a[128], b[128], c[128];
    return grove_err_set(t->err, GROVE_E_SHAPE,
                         "%s: query %s, key %s and value %s must be [L, N, %lld] (or batch-first, "
                         "or unbatched [L, %lld])",
                         T, grove_shape_str(qt->ndim, qt->shape, a, sizeof a),
                         grove_shape_str(kt->ndim, kt->shape, b, sizeof b),
                         grove_shape_str(vt->ndim, vt->shape, c, sizeof c), (long long)E,
                         (long long)E);
  }
  const grove_tensor *W, *b;
  grove_status s = grove__param_f32(t, m, "in_proj_weight", 3 * E * E, &W);
  if (!s) s = grove__param_f32(t, m, "in_proj_bias", 3 * E, &b);
  if (s) return s;
  const grove_module *op = grove_module_child(m, "out_proj");
  const grove_tensor *Wo, *bo;
  if (!op || !W) return grove_err_set(t->err, GROVE_E_INVALID_ARGUMENT, "%s: no weights", T);
  if ((s = grove__param_f32(t, op, "weight", E * E, &Wo)) ||
      (s = grove__param_f32(t, op, "bias", E, &bo)))
    return s;
  if (!Wo) return grove_err_set(t->err, GROVE_E_INVALID_ARGUMENT, "%s: out_proj has no weight", T);
  /* Sequence-first [L, N, E] from here on. */
  int qs = q, ks = k, vs = v;
  if (batched && info->batch_first) {
    if ((s = perm3(t, q, 1, 0, 2, &qs))) return s;
    if (k == q)
      ks = qs;
    else if ((s = perm3(t, k, 1, 0, 2, &ks)))
      return s;
    if (v == k)
      vs = ks;
    else if ((s = perm3(t, v, 1, 0, 2, &vs)))
      return s;
  } else if (!batched) {
    if ((s = reshape3(t, q, val(t, q)->shape[0], 1, E, &qs))) return s;
    if (k == q)
      ks = qs;
    else if ((s = reshape3(t, k, val(t, k)->shape[0], 1, E, &ks)))
      return s;
    if (v == k)
      vs = ks;
    else if ((s = reshape3(t, v, val(t, v)->shape[0], 1, E, &vs)))
      return s;
  }
  const int64_t L = val(t, qs)->shape[0], N = val(t, qs)->shape[1], S = val(t, ks)->shape[0];
  if (val(t, ks)->shape[1] != N || val(t, vs)->shape[1] != N || val(t, vs)->shape[0] != S)
    return grove_err_set(t->err, GROVE_E_SHAPE,
                         "%s: query, key and value disagree on batch or "
                         "sequence sizes",
                         T);
  int qp, kp, vp, qh, kh, vh, x;
  if ((s = grove__top_linear_rows(t, qs, W, b, 0, E, &qp)) ||
      (s = grove__top_linear_rows(t, ks, W, b, E, E, &kp)) ||
      (s = grove__top_linear_rows(t, vs, W, b, 2 * E, E, &vp)))
    return s;
  /* Heads: view(L, N * H, d).transpose(0, 1). */
  if ((s = reshape3(t, qp, L, N * H, d, &x)) || (s = perm3(t, x, 1, 0, 2, &qh)) ||
      (s = reshape3(t, kp, S, N * H, d, &x)) || (s = perm3(t, x, 1, 2, 0, &kh)) ||
      (s = reshape3(t, vp, S, N * H, d, &x)) || (s = perm3(t, x, 1, 0, 2, &vh)))
    return s;
  int qsc, att, attn, o;
  if ((s = grove__top_scalar(t, GROVE__BIN_DIV, qh, sqrt((double)d), false, &qsc)) ||
      (s = grove__top_matmul(t, qsc, kh, &att)) || (s = grove__top_softmax(t, att, 2, false, &att)))
    return s;
  if ((s = grove__top_dropout(t, att, info->p, &attn))) return s;
  if ((s = grove__top_matmul(t, attn, vh, &o)) || (s = perm3(t, o, 1, 0, 2, &x))) return s;
  const int64_t flat[2] = {L * N, E};
  if ((s = grove__top_reshape(t, x, 2, flat, &x)) || (s = grove__top_linear(t, x, Wo, bo, &x)) ||
      (s = reshape3(t, x, L, N, E, &x)))
    return s;
  if (batched && info->batch_first) {
    if ((s = perm3(t, x, 1, 0, 2, &x))) return s;
  } else if (!batched) {
    const int64_t le[2] = {L, E};
    if ((s = grove__top_reshape(t, x, 2, le, &x))) return s;
  }
  *out = x;
  *weights = -1;
  if (!need_weights) return GROVE_OK;
  const int64_t w4[4] = {N, H, L, S};
  int w;
  if ((s = grove__top_reshape(t, attn, 4, w4, &w))) return s;
  if (average && ((s = grove__top_reduce(t, w, false, 1u << 1, false, &w)) ||
                  (s = grove__top_scalar(t, GROVE__BIN_DIV, w, (double)H, false, &w))))
    return s;
  if (!batched) {
    /* Unbatched: the batch dim of 1 goes. */
    const grove_tensor *wt = val(t, w);
    if ((s = grove__top_reshape(t, w, wt->ndim - 1, wt->shape + 1, &w))) return s;
  }
  *weights = w;
  return GROVE_OK;
}

grove_status grove__tf_mha(grove__tape *t, const grove_module *m, const grove__tinfo *info,
                           const int *in, int nin, int *out, int *nout) {
  if (nin != 1 && nin != 3)
    return grove_err_set(t->err, GROVE_E_INVALID_ARGUMENT,
                         "MultiheadAttention: expected query, key and value (or one tensor), got "
                         "%d inputs",
                         nin);
  const int q = in[0], k = nin == 3 ? in[1] : in[0], v = nin == 3 ? in[2] : in[0];
  grove_status s = grove__mha_run(t, m, info, q, k, v, true, true, &out[0], &out[1]);
  if (!s) *nout = 2;
  return s;
}

/* ------------------------------------------------------------ encoder layer */

static grove_status child(grove__tape *t, const grove_module *m, const char *name, int x, int *y) {
  const grove_module *c = grove_module_child(m, name);
  if (!c)
    return grove_err_set(t->err, GROVE_E_INVALID_ARGUMENT, "TransformerEncoderLayer: no %s", name);
  int outs[GROVE_MAX_VALUES], n = 0;
  grove_status s = grove__train_call(t, c, &x, 1, outs, &n);
  if (!s) *y = outs[0];
  return s;
}

static grove_status sa_block(grove__tape *t, const grove_module *m, int x, int *y) {
  const grove_module *sa = grove_module_child(m, "self_attn");
  const grove__tinfo *si = sa ? grove__tinfo_of(t, sa) : NULL;
  if (!si) return grove_err_set(t->err, GROVE_E_INTERNAL, "TransformerEncoderLayer: no self_attn");
  int a, w;
  grove_status s = grove__mha_run(t, sa, si, x, x, x, false, false, &a, &w);
  if (!s) s = child(t, m, "dropout1", a, y);
  return s;
}

static grove_status ff_block(grove__tape *t, const grove_module *m, const grove__tinfo *info, int x,
                             int *y) {
  int h;
  grove_status s = child(t, m, "linear1", x, &h);
  if (!s) s = grove__top_act(t, info->gelu_ff ? GROVE__TK_GELU : GROVE__TK_RELU, NULL, h, &h);
  if (!s) s = child(t, m, "dropout", h, &h);
  if (!s) s = child(t, m, "linear2", h, &h);
  if (!s) s = child(t, m, "dropout2", h, y);
  return s;
}

grove_status grove__tf_tel(grove__tape *t, const grove_module *m, const grove__tinfo *info,
                           const int *in, int nin, int *out, int *nout) {
  if (nin != 1)
    return grove_err_set(t->err, GROVE_E_INVALID_ARGUMENT,
                         "TransformerEncoderLayer: expected 1 input tensor (src), got %d", nin);
  int x = in[0], a, b;
  grove_status s;
  if (info->norm_first) {
    if ((s = child(t, m, "norm1", x, &a)) || (s = sa_block(t, m, a, &a)) ||
        (s = grove__top_binary(t, GROVE__BIN_ADD, x, a, 1.0, &x)) ||
        (s = child(t, m, "norm2", x, &b)) || (s = ff_block(t, m, info, b, &b)) ||
        (s = grove__top_binary(t, GROVE__BIN_ADD, x, b, 1.0, &x)))
      return s;
  } else {
    if ((s = sa_block(t, m, x, &a)) || (s = grove__top_binary(t, GROVE__BIN_ADD, x, a, 1.0, &x)) ||
        (s = child(t, m, "norm1", x, &x)) || (s = ff_block(t, m, info, x, &b)) ||
        (s = grove__top_binary(t, GROVE__BIN_ADD, x, b, 1.0, &x)) ||
        (s = child(t, m, "norm2", x, &x)))
      return s;
  }
  out[0] = x;
  *nout = 1;
  return GROVE_OK;
}

grove_status grove__tf_te(grove__tape *t, const grove_module *m, const grove__tinfo *info,
                          const int *in, int nin, int *out, int *nout) {
  if (nin != 1)
    return grove_err_set(t->err, GROVE_E_INVALID_ARGUMENT,
                         "TransformerEncoder: expected 1 input tensor (src), got %d", nin);
  const grove_module *layers = grove_module_child(m, "layers");
  const grove_module *norm = grove_module_child(m, "norm");
  int x = in[0];
  for (size_t i = 0; layers && i < layers->nchildren; i++) {
    int outs[GROVE_MAX_VALUES], n = 0;
    grove_status s = grove__train_call(t, layers->children[i].module, &x, 1, outs, &n);
    if (s) return s;
    x = outs[0];
  }
  if (norm) {
    int outs[GROVE_MAX_VALUES], n = 0;
    grove_status s = grove__train_call(t, norm, &x, 1, outs, &n);
    if (s) return s;
    x = outs[0];
  }
  out[0] = x;
  *nout = 1;
  return GROVE_OK;
}
