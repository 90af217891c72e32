/* layers_transformer.c: torch.nn.TransformerEncoderLayer, TransformerEncoder,
 * TransformerDecoderLayer, TransformerDecoder and Transformer, eval mode, with
 * PyTorch's state_dict layout (self_attn.*, multihead_attn.*, linear1/2,
 * norm1/2/3; layers.N. under an encoder or decoder; encoder.* and decoder.*
 * under a Transformer).
 *
 * The layers run torch's (slow path) formulation, norm_first either way,
 * relu or gelu, calling their children through grove_module_forward so that
 * their hooks fire; with no hook anywhere, linear1 and a relu run as one
 * fused pass.  The masks of a call arrive in the forward's context
 * (grove_fwd.mha.mask, in the order of torch's forward) and are handed to
 * the attention children the same way.  torch 1.13's eval fast path
 * (_transformer_encoder_layer_fwd) computes the same math; the parity tests
 * compare against whichever torch takes.
 *
 * TransformerEncoder with a src_key_padding_mask takes, in torch 1.13, a
 * nested-tensor path when its conditions hold (below, nested_path): the
 * padded positions of its output are then 0 before the final norm.  Grove
 * gives the same zeros there, at the input's full length (torch 1.13 also
 * trims trailing positions padded in every item; torch 2 keeps them, as
 * Grove does: docs/model-spec.md).  The stacks give the arena back between
 * layers (grove__arena_keep), so their scratch is that of one layer whatever
 * the depth. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph_ops.h"
#include "layers_internal.h"
#include "observe.h"

/* ============================================================ the layers */

typedef struct tl_impl {
  grove_encoder_layer_opts o;
  bool gelu, decoder;
} tl_impl;

void grove__tel_settings(const grove_module *m, grove__layer_settings *s) {
  const tl_impl *p = m->impl;
  s->embed_dim = p->o.d_model;
  s->num_heads = p->o.nhead;
  s->dim_feedforward = p->o.dim_feedforward;
  s->p = p->o.dropout;
  s->gelu_ff = p->gelu;
  s->ln_eps = p->o.layer_norm_eps;
  s->batch_first = p->o.batch_first;
  s->norm_first = p->o.norm_first;
}

static grove_status call(const grove_module *m, const char *child, grove_fwd *f,
                         const grove_tensor *x, grove_tensor *y) {
  const grove_module *c = grove_module_child(m, child);
  if (!c)
    return grove_err_set(f->err, GROVE_E_INTERNAL, "%s: child %s is missing", m->type->name, child);
  return grove_module_call(c, f, x, y);
}

/* y += x elementwise (same shape, both contiguous float32). */
static void add_into(grove_tensor *y, const grove_tensor *x) {
  float *restrict a = y->data;
  const float *restrict b = x->data;
  for (int64_t i = 0, n = grove_tensor_numel(y); i < n; i++) a[i] += b[i];
}

/* The attention child attn on x (self-attention when mem is NULL, else
 * x against mem) with the masks, need_weights=False as torch's _sa_block /
 * _mha_block call it, then the dropout child drop. */
static grove_status attn_block(const grove_module *m, grove_fwd *f, const char *attn,
                               const char *drop, const grove_tensor *x, const grove_tensor *mem,
                               const grove_tensor *am, const grove_tensor *kpm, grove_tensor *y) {
  const grove_module *sa = grove_module_child(m, attn);
  if (!sa)
    return grove_err_set(f->err, GROVE_E_INTERNAL, "%s: child %s is missing", m->type->name, attn);
  grove_values in = {.n = 3}, out = {0};
  in.v[0] = *x;
  in.v[1] = in.v[2] = mem ? *mem : *x;
  const grove_tensor *masks[2] = {kpm, am};
  grove__mha_next_call(f, sa, false, true);
  grove__next_call_masks(f, sa, 2, masks);
  grove_status s = grove_module_forward(sa, f, &in, &out);
  grove__mha_next_call(f, NULL, true, true);
  if (s) return s;
  return call(m, drop, f, &out.v[0], y);
}

static grove_status ff_block(const grove_module *m, grove_fwd *f, const tl_impl *p,
                             const grove_tensor *x, grove_tensor *y) {
  const grove_module *l1 = grove_module_child(m, "linear1");
  grove_values in = {.n = 1}, out = {0};
  in.v[0] = *x;
  grove_status s;
  grove_tensor h;
  if (grove__no_forward_hooks() && !grove__observes(f, l1)) {
    /* The activation in linear1's epilogue (gemm.c), on each tile of h while
     * it is in cache. */
    const grove__act act = p->gelu ? GROVE__ACT_GELU : GROVE__ACT_RELU;
    if ((s = grove__linear_forward_act(l1, f, &in, &out, act))) return s;
    h = out.v[0];
  } else {
    if ((s = grove_module_call(l1, f, x, &h))) return s;
    if (h.dtype != GROVE_F32 || !grove_tensor_is_contiguous(&h))
      return grove_err_set(f->err, GROVE_E_INTERNAL, "linear1 returned a strided tensor");
    grove__elementwise(p->gelu ? GROVE__ELT_GELU : GROVE__ELT_RELU, 0.0f, h.data, h.data,
                       grove_tensor_numel(&h));
  }
  grove_tensor d, l2;
  if ((s = call(m, "dropout", f, &h, &d)) || (s = call(m, "linear2", f, &d, &l2))) return s;
  return call(m, p->decoder ? "dropout3" : "dropout2", f, &l2, y);
}

/* Residual: r = a + b into b's memory when b is ours (a fresh, contiguous
 * result), else into a new tensor. */
static grove_status residual(const grove_module *m, grove_fwd *f, const grove_tensor *a,
                             grove_tensor *b, grove_tensor *r) {
  if (!grove_tensor_same_shape(a, b) || a->dtype != GROVE_F32 || b->dtype != GROVE_F32)
    return grove_err_set(f->err, GROVE_E_SHAPE, "%s: a sublayer changed the shape", m->type->name);
  if (grove_tensor_is_contiguous(b) && b->data != a->data) {
    add_into(b, a);
    *r = *b;
    return GROVE_OK;
  }
  return grove__op_binary(f, GROVE__BIN_ADD, a, b, 1.0, r, NULL);
}

static grove_status check_seq(const grove_module *m, grove_fwd *f, const tl_impl *p,
                              const char *what, const grove_tensor *x) {
  if ((x->ndim == 2 || x->ndim == 3) && x->shape[x->ndim - 1] == p->o.d_model) return GROVE_OK;
  char got[128];
  return grove_err_set(
      f->err, GROVE_E_SHAPE, "%s: expected %s of shape %s with d_model %lld, got %s", m->type->name,
      what, p->o.batch_first ? "[N, S, E] or [S, E]" : "[S, N, E] or [S, E]",
      (long long)p->o.d_model, grove_shape_str(x->ndim, x->shape, got, sizeof got));
}

/* TransformerEncoderLayer.forward(src, src_mask, src_key_padding_mask) and
 * TransformerDecoderLayer.forward(tgt, memory, tgt_mask, memory_mask,
 * tgt_key_padding_mask, memory_key_padding_mask). */
static grove_status tl_forward(const grove_module *m, grove_fwd *f, const grove_values *in,
                               grove_values *out) {
  const tl_impl *p = m->impl;
  const char *T = m->type->name;
  const grove_tensor *mk[6];
  grove__take_call(f, m, mk, NULL, NULL);
  const int want = p->decoder ? 2 : 1;
  if (in->n != want)
    return grove_err_set(f->err, GROVE_E_INVALID_ARGUMENT,
                         "%s: expected %d input tensor%s (%s), got %d", T, want,
                         want > 1 ? "s" : "", p->decoder ? "tgt, memory" : "src", in->n);
  grove_tensor x, mem;
  grove_status s;
  for (int i = 0; i < want; i++)
    if (in->v[i].dtype != GROVE_F32)
      return grove_err_set(f->err, GROVE_E_DTYPE, "%s: expected float32 inputs, got %s", T,
                           grove_dtype_name(in->v[i].dtype));
  if ((s = grove__contig_f32(f, &in->v[0], &x)) ||
      (s = check_seq(m, f, p, p->decoder ? "tgt" : "src", &x)))
    return s;
  if (p->decoder &&
      ((s = grove__contig_f32(f, &in->v[1], &mem)) || (s = check_seq(m, f, p, "memory", &mem))))
    return s;
  grove_tensor t1, t2, x1, x2, y;
  if (!p->decoder) {
    /* masks: src_mask, src_key_padding_mask */
    if (p->o.norm_first) {
      if ((s = call(m, "norm1", f, &x, &t1)) ||
          (s = attn_block(m, f, "self_attn", "dropout1", &t1, NULL, mk[0], mk[1], &t2)) ||
          (s = residual(m, f, &x, &t2, &x1)) || (s = call(m, "norm2", f, &x1, &t1)) ||
          (s = ff_block(m, f, p, &t1, &t2)) || (s = residual(m, f, &x1, &t2, &y)))
        return s;
    } else {
      if ((s = attn_block(m, f, "self_attn", "dropout1", &x, NULL, mk[0], mk[1], &t1)) ||
          (s = residual(m, f, &x, &t1, &t2)) || (s = call(m, "norm1", f, &t2, &x1)) ||
          (s = ff_block(m, f, p, &x1, &t1)) || (s = residual(m, f, &x1, &t1, &t2)) ||
          (s = call(m, "norm2", f, &t2, &y)))
        return s;
    }
  } else if (p->o.norm_first) {
    /* masks: tgt_mask, memory_mask, tgt_key_padding_mask, memory_key_padding_mask */
    if ((s = call(m, "norm1", f, &x, &t1)) ||
        (s = attn_block(m, f, "self_attn", "dropout1", &t1, NULL, mk[0], mk[2], &t2)) ||
        (s = residual(m, f, &x, &t2, &x1)) || (s = call(m, "norm2", f, &x1, &t1)) ||
        (s = attn_block(m, f, "multihead_attn", "dropout2", &t1, &mem, mk[1], mk[3], &t2)) ||
        (s = residual(m, f, &x1, &t2, &x2)) || (s = call(m, "norm3", f, &x2, &t1)) ||
        (s = ff_block(m, f, p, &t1, &t2)) || (s = residual(m, f, &x2, &t2, &y)))
      return s;
  } else {
    if ((s = attn_block(m, f, "self_attn", "dropout1", &x, NULL, mk[0], mk[2], &t1)) ||
        (s = residual(m, f, &x, &t1, &t2)) || (s = call(m, "norm1", f, &t2, &x1)) ||
        (s = attn_block(m, f, "multihead_attn", "dropout2", &x1, &mem, mk[1], mk[3], &t1)) ||
        (s = residual(m, f, &x1, &t1, &t2)) || (s = call(m, "norm2", f, &t2, &x2)) ||
        (s = ff_block(m, f, p, &x2, &t1)) || (s = residual(m, f, &x2, &t1, &t2)) ||
        (s = call(m, "norm3", f, &t2, &y)))
      return s;
  }
  out->n = 1;
  out->v[0] = y;
  return GROVE_OK;
}

const grove_module_type grove__tel_type = {
    .name = "TransformerEncoderLayer",
    .forward = tl_forward,
};

const grove_module_type grove__tdl_type = {
    .name = "TransformerDecoderLayer",
    .forward = tl_forward,
};

static grove_status layer_new(const grove_encoder_layer_opts *o, bool decoder, grove_module **out,
                              grove_err *err) {
  *out = NULL;
  const char *T = decoder ? "TransformerDecoderLayer" : "TransformerEncoderLayer";
  if (!o || o->d_model <= 0 || o->nhead <= 0 || o->dim_feedforward <= 0)
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT,
                         "%s: d_model, nhead and dim_feedforward must be positive", T);
  if (o->d_model % o->nhead)
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT, "%s: d_model must be divisible by nhead",
                         T);
  bool gelu = false;
  if (o->activation && strcmp(o->activation, "gelu") == 0)
    gelu = true;
  else if (o->activation && strcmp(o->activation, "relu") != 0)
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT,
                         "%s: activation should be relu/gelu, not %s", T, o->activation);
  if (!(o->dropout >= 0.0 && o->dropout <= 1.0) || !(o->layer_norm_eps >= 0.0) ||
      isinf(o->layer_norm_eps))
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT,
                         "%s: dropout must be in [0, 1] and layer_norm_eps finite and >= 0", T);
  tl_impl *p = calloc(1, sizeof *p);
  if (!p) return grove_err_set(err, GROVE_E_NOMEM, "%s: out of memory", T);
  p->o = *o;
  p->o.activation = gelu ? "gelu" : "relu"; /* static strings: the caller's may go away */
  p->gelu = gelu;
  p->decoder = decoder;
  grove_module *m = NULL;
  grove_status s = grove__layer_make(decoder ? &grove__tdl_type : &grove__tel_type, p, &m, err);
  if (s) return s;
  const int64_t E = o->d_model;
  grove_module *c = NULL;
  /* torch's registration order (the decoder's cross-attention second, its
   * third norm and dropout last of their kinds). */
  s = grove__add_child(m, "self_attn",
                       grove_multihead_attention_new(E, o->nhead, true, o->batch_first, &c, err),
                       &c, err);
  if (!s && decoder)
    s = grove__add_child(m, "multihead_attn",
                         grove_multihead_attention_new(E, o->nhead, true, o->batch_first, &c, err),
                         &c, err);
  if (!s)
    s = grove__add_child(m, "linear1", grove_linear_new(E, o->dim_feedforward, true, &c, err), &c,
                         err);
  if (!s) s = grove__add_child(m, "dropout", grove_dropout_new(o->dropout, &c, err), &c, err);
  if (!s)
    s = grove__add_child(m, "linear2", grove_linear_new(o->dim_feedforward, E, true, &c, err), &c,
                         err);
  static const char *const norms[3] = {"norm1", "norm2", "norm3"};
  static const char *const drops[3] = {"dropout1", "dropout2", "dropout3"};
  for (int i = 0; i < (decoder ? 3 : 2) && !s; i++)
    s = grove__add_child(m, norms[i], grove_layer_norm_new(1, &E, o->layer_norm_eps, true, &c, err),
                         &c, err);
  for (int i = 0; i < (decoder ? 3 : 2) && !s; i++)
    s = grove__add_child(m, drops[i], grove_dropout_new(o->dropout, &c, err), &c, err);
  if (s) {
    grove_module_release(m);
    return s;
  }
  *out = m;
  return GROVE_OK;
}

grove_status grove_transformer_encoder_layer_new(const grove_encoder_layer_opts *o,
                                                 grove_module **out, grove_err *err) {
  return layer_new(o, false, out, err);
}

grove_status grove_transformer_decoder_layer_new(const grove_encoder_layer_opts *o,
                                                 grove_module **out, grove_err *err) {
  return layer_new(o, true, out, err);
}

/* The constructor arguments of an encoder or decoder layer (T), which torch
 * spells alike; Transformer's own keys are read by transformer_from_json. */
static grove_status layer_opts_from_json(const json_t *obj, const char *path, const char *T,
                                         grove_encoder_layer_opts *o, grove_err *err) {
  static const char *const keys[] = {
      "d_model",        "nhead",       "dim_feedforward", "dropout", "activation",
      "layer_norm_eps", "batch_first", "norm_first",      "bias",    NULL};
  static const char *const acts[] = {"relu", "gelu", NULL};
  int act = 0;
  bool bias;
  grove_status s = grove__json_check_keys(obj, path, T, keys, err);
  if (!s) s = grove__json_int(obj, path, T, "d_model", true, 0, 1, 1 << 16, &o->d_model, err);
  if (!s) s = grove__json_int(obj, path, T, "nhead", true, 0, 1, 1 << 16, &o->nhead, err);
  if (!s)
    s = grove__json_int(obj, path, T, "dim_feedforward", false, 2048, 1, 1 << 20,
                        &o->dim_feedforward, err);
  if (!s) s = grove__json_number(obj, path, T, "dropout", 0.1, 0.0, 1.0, &o->dropout, err);
  if (!s) s = grove__json_choice(obj, path, T, "activation", 0, acts, &act, err);
  if (!s)
    s = grove__json_number(obj, path, T, "layer_norm_eps", 1e-5, 0.0, INFINITY, &o->layer_norm_eps,
                           err);
  if (!s) s = grove__json_bool(obj, path, T, "batch_first", false, &o->batch_first, err);
  if (!s) s = grove__json_bool(obj, path, T, "norm_first", false, &o->norm_first, err);
  if (!s) s = grove__json_bool(obj, path, T, "bias", true, &bias, err);
  if (s) return s;
  if (!bias)
    return grove__json_unsupported(path, "bias", "bias=False (torch >= 2.1) is not supported", err);
  o->activation = acts[act];
  if (o->d_model % o->nhead)
    return grove_err_set(err, GROVE_E_SPEC,
                         "%s.nhead: d_model (%lld) must be divisible by nhead (%lld)", path,
                         (long long)o->d_model, (long long)o->nhead);
  return GROVE_OK;
}

grove_status grove__transformer_encoder_layer_from_json(const json_t *obj, const char *path,
                                                        grove_module **out, grove_err *err) {
  grove_encoder_layer_opts o = {0};
  grove_status s = layer_opts_from_json(obj, path, "TransformerEncoderLayer", &o, err);
  return s ? s : grove__json_built(path, grove_transformer_encoder_layer_new(&o, out, err), err);
}

grove_status grove__transformer_decoder_layer_from_json(const json_t *obj, const char *path,
                                                        grove_module **out, grove_err *err) {
  grove_encoder_layer_opts o = {0};
  grove_status s = layer_opts_from_json(obj, path, "TransformerDecoderLayer", &o, err);
  return s ? s : grove__json_built(path, grove_transformer_decoder_layer_new(&o, out, err), err);
}

/* ============================================================ the stacks */

typedef struct stack_impl {
  grove_encoder_layer_opts o; /* every layer's */
  bool decoder;
  bool nested, mask_check; /* TransformerEncoder's enable_nested_tensor, mask_check */
} stack_impl;

/* Whether torch 1.13's TransformerEncoder.forward would take its nested
 * tensor path for this call (eval, no autograd): then the padded positions
 * (kpm nonzero) of its output are 0.  mask_check asks that every item's
 * unpadded positions come first. */
static bool nested_path(const stack_impl *p, const grove_tensor *x, const grove_tensor *mask,
                        const grove_tensor *kpm) {
  if (p->decoder || !p->nested || p->o.norm_first || !p->o.batch_first || x->ndim != 3 || !kpm ||
      mask || p->o.nhead % 2 == 1 || kpm->ndim != 2)
    return false;
  if (!p->mask_check) return true;
  for (int64_t n = 0; n < kpm->shape[0]; n++) {
    bool padded = false;
    for (int64_t s = 0; s < kpm->shape[1]; s++) {
      const bool pad = grove__mask_at(kpm, n * kpm->strides[0] + s * kpm->strides[1]) != 0;
      if (padded && !pad) return false;
      padded |= pad;
    }
  }
  return true;
}

/* y[n, s, :] = 0 where kpm[n, s] is nonzero (batch-first [N, S, E], contiguous). */
static void zero_padded(grove_tensor *y, const grove_tensor *kpm) {
  const int64_t N = y->shape[0], S = y->shape[1], E = y->shape[2];
  float *d = y->data;
  for (int64_t n = 0; n < N && n < kpm->shape[0]; n++)
    for (int64_t s = 0; s < S && s < kpm->shape[1]; s++) {
      if (grove__mask_at(kpm, n * kpm->strides[0] + s * kpm->strides[1]) != 0)
        memset(d + (n * S + s) * E, 0, (size_t)E * sizeof(float));
    }
}

/* TransformerEncoder.forward(src, mask, src_key_padding_mask) and
 * TransformerDecoder.forward(tgt, memory, tgt_mask, memory_mask,
 * tgt_key_padding_mask, memory_key_padding_mask): every layer gets the same
 * masks. */
static grove_status stack_forward(const grove_module *m, grove_fwd *f, const grove_values *in,
                                  grove_values *out) {
  const stack_impl *p = m->impl;
  const grove_tensor *mk[6];
  grove__take_call(f, m, mk, NULL, NULL);
  const int want = p->decoder ? 2 : 1;
  if (in->n != want)
    return grove_err_set(f->err, GROVE_E_INVALID_ARGUMENT,
                         "%s: expected %d input tensor%s (%s), got %d", m->type->name, want,
                         want > 1 ? "s" : "", p->decoder ? "tgt, memory" : "src", in->n);
  const grove_module *layers = grove_module_child(m, "layers");
  const grove_module *norm = grove_module_child(m, "norm");
  grove_tensor x = in->v[0];
  const bool zero = nested_path(p, &x, mk[0], mk[1]);
  grove_arena_mark m0 = grove_arena_mark_get(f->arena);
  for (size_t i = 0; layers && i < layers->nchildren; i++) {
    const grove_module *l = layers->children[i].module;
    grove_values lin = {.n = want}, lout = {0};
    lin.v[0] = x;
    if (p->decoder) lin.v[1] = in->v[1];
    grove__next_call_masks(f, l, p->decoder ? 4 : 2, mk);
    grove_status s = grove_module_forward(l, f, &lin, &lout);
    grove__mha_next_call(f, NULL, true, true);
    if (s) return s;
    grove_tensor y = lout.v[0];
    /* Everything but y is scratch now: give it back (x included, when it
     * was the previous layer's output). */
    grove__keep k = {y.data, grove__tensor_extent(&y), NULL, {0}};
    if (k.bytes > 0) {
      if ((s = grove__arena_keep(f->arena, m0, &k, 1, f->err))) return s;
      y.data = k.moved;
    }
    x = y;
  }
  if (zero && layers && layers->nchildren > 0 && grove_tensor_is_contiguous(&x) &&
      x.dtype == GROVE_F32)
    zero_padded(&x, mk[1]);
  if (norm) {
    grove_tensor y;
    grove_status s = grove_module_call(norm, f, &x, &y);
    if (s) return s;
    x = y;
  }
  out->n = 1;
  out->v[0] = x;
  return GROVE_OK;
}

const grove_module_type grove__te_type = {
    .name = "TransformerEncoder",
    .forward = stack_forward,
};

const grove_module_type grove__td_type = {
    .name = "TransformerDecoder",
    .forward = stack_forward,
};

static grove_status stack_new(const grove_encoder_layer_opts *layer, bool decoder,
                              int64_t num_layers, grove_module *norm, grove_module **out,
                              grove_err *err) {
  *out = NULL;
  const char *T = decoder ? "TransformerDecoder" : "TransformerEncoder";
  if (num_layers < 0 || num_layers > 4096)
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT,
                         "%s: num_layers must be in [0, 4096], got %lld", T, (long long)num_layers);
  stack_impl *p = calloc(1, sizeof *p);
  if (!p) return grove_err_set(err, GROVE_E_NOMEM, "%s: out of memory", T);
  p->o = *layer;
  p->decoder = decoder;
  p->nested = p->mask_check = true; /* torch's defaults */
  grove_module *m = NULL;
  grove_status s = grove__layer_make(decoder ? &grove__td_type : &grove__te_type, p, &m, err);
  if (s) return s;
  grove_module *list = NULL;
  s = grove_module_list_new(&list, err);
  for (int64_t i = 0; !s && i < num_layers; i++) {
    grove_module *l = NULL;
    char name[32];
    snprintf(name, sizeof name, "%lld", (long long)i);
    s = grove__add_child(list, name, layer_new(layer, decoder, &l, err), &l, err);
  }
  if (!s) s = grove_module_add_module(m, "layers", list, err);
  grove_module_release(list);
  if (!s && norm) s = grove_module_add_module(m, "norm", norm, err);
  if (s) {
    grove_module_release(m);
    return s;
  }
  *out = m;
  return GROVE_OK;
}

grove_status grove_transformer_encoder_new(const grove_encoder_layer_opts *layer,
                                           int64_t num_layers, grove_module *norm,
                                           grove_module **out, grove_err *err) {
  return stack_new(layer, false, num_layers, norm, out, err);
}

grove_status grove_transformer_decoder_new(const grove_encoder_layer_opts *layer,
                                           int64_t num_layers, grove_module *norm,
                                           grove_module **out, grove_err *err) {
  return stack_new(layer, true, num_layers, norm, out, err);
}

/* TransformerEncoder's / TransformerDecoder's JSON: the layer object under
 * layer_key (of type layer_type), num_layers, norm (null or a LayerNorm). */
static grove_status stack_from_json(const json_t *obj, const char *path, bool decoder,
                                    grove_module **out, grove_err *err) {
  static const char *const ekeys[] = {"encoder_layer",        "num_layers", "norm",
                                      "enable_nested_tensor", "mask_check", NULL};
  static const char *const dkeys[] = {"decoder_layer", "num_layers", "norm", NULL};
  const char *T = decoder ? "TransformerDecoder" : "TransformerEncoder";
  const char *lkey = decoder ? "decoder_layer" : "encoder_layer";
  const char *ltype = decoder ? "TransformerDecoderLayer" : "TransformerEncoderLayer";
  int64_t nl;
  bool nested = true, mask_check = true;
  grove_status s = grove__json_check_keys(obj, path, T, decoder ? dkeys : ekeys, err);
  if (!s) s = grove__json_int(obj, path, T, "num_layers", true, 0, 0, 4096, &nl, err);
  if (!s && !decoder)
    s = grove__json_bool(obj, path, T, "enable_nested_tensor", true, &nested, err);
  if (!s && !decoder) s = grove__json_bool(obj, path, T, "mask_check", true, &mask_check, err);
  if (s) return s;
  const json_t *el = json_object_get(obj, lkey), *nv = json_object_get(obj, "norm");
  char sub[1024];
  snprintf(sub, sizeof sub, "%s.%s", path, lkey);
  if (!json_is_object(el) || !json_is_string(json_object_get(el, "type")) ||
      strcmp(json_string_value(json_object_get(el, "type")), ltype) != 0)
    return grove_err_set(err, GROVE_E_SPEC,
                         "%s: expected a {\"type\": \"%s\", ...} object (the layer every one of "
                         "the num_layers copies is built like)",
                         sub, ltype);
  grove_encoder_layer_opts o = {0};
  if ((s = layer_opts_from_json(el, sub, ltype, &o, err))) return s;
  grove_module *norm = NULL;
  if (nv && !json_is_null(nv)) {
    snprintf(sub, sizeof sub, "%s.norm", path);
    if (!json_is_object(nv) || !json_is_string(json_object_get(nv, "type")) ||
        strcmp(json_string_value(json_object_get(nv, "type")), "LayerNorm") != 0)
      return grove_err_set(err, GROVE_E_SPEC,
                           "%s: expected null or a {\"type\": \"LayerNorm\", ...} object", sub);
    if ((s = grove__layer_norm_from_json(nv, sub, &norm, err))) return s;
  }
  s = grove__json_built(path, stack_new(&o, decoder, nl, norm, out, err), err);
  grove_module_release(norm);
  if (!s) {
    stack_impl *p = (*out)->impl;
    p->nested = nested;
    p->mask_check = mask_check;
  }
  return s;
}

grove_status grove__transformer_encoder_from_json(const json_t *obj, const char *path,
                                                  grove_module **out, grove_err *err) {
  return stack_from_json(obj, path, false, out, err);
}

grove_status grove__transformer_decoder_from_json(const json_t *obj, const char *path,
                                                  grove_module **out, grove_err *err) {
  return stack_from_json(obj, path, true, out, err);
}

/* ============================================================ Transformer */

typedef struct tf_impl {
  grove_encoder_layer_opts o;
} tf_impl;

/* Transformer.forward(src, tgt, src_mask, tgt_mask, memory_mask,
 * src_key_padding_mask, tgt_key_padding_mask, memory_key_padding_mask):
 * memory = encoder(src, src_mask, src_key_padding_mask), then
 * decoder(tgt, memory, tgt_mask, memory_mask, tgt_key_padding_mask,
 * memory_key_padding_mask), each called as a module. */
static grove_status tf_forward(const grove_module *m, grove_fwd *f, const grove_values *in,
                               grove_values *out) {
  const tf_impl *p = m->impl;
  const char *T = "Transformer";
  const grove_tensor *mk[6];
  grove__take_call(f, m, mk, NULL, NULL);
  if (in->n != 2)
    return grove_err_set(f->err, GROVE_E_INVALID_ARGUMENT,
                         "%s: expected 2 input tensors (src, tgt), got %d", T, in->n);
  const grove_tensor *src = &in->v[0], *tgt = &in->v[1];
  if (src->ndim == 3 && tgt->ndim == 3 &&
      src->shape[p->o.batch_first ? 0 : 1] != tgt->shape[p->o.batch_first ? 0 : 1])
    return grove_err_set(f->err, GROVE_E_SHAPE, "%s: the batch number of src and tgt must be equal",
                         T);
  if (src->ndim < 1 || tgt->ndim < 1 || src->shape[src->ndim - 1] != p->o.d_model ||
      tgt->shape[tgt->ndim - 1] != p->o.d_model)
    return grove_err_set(f->err, GROVE_E_SHAPE,
                         "%s: the feature number of src and tgt must be equal to d_model (%lld)", T,
                         (long long)p->o.d_model);
  const grove_module *enc = grove_module_child(m, "encoder"),
                     *dec = grove_module_child(m, "decoder");
  if (!enc || !dec)
    return grove_err_set(f->err, GROVE_E_INTERNAL, "%s: encoder or decoder is missing", T);
  grove_values ein = {.n = 1}, eout = {0};
  ein.v[0] = *src;
  const grove_tensor *em[2] = {mk[0], mk[3]};
  grove__next_call_masks(f, enc, 2, em);
  grove_status s = grove_module_forward(enc, f, &ein, &eout);
  grove__mha_next_call(f, NULL, true, true);
  if (s) return s;
  grove_values din = {.n = 2};
  din.v[0] = *tgt;
  din.v[1] = eout.v[0];
  const grove_tensor *dm[4] = {mk[1], mk[2], mk[4], mk[5]};
  grove__next_call_masks(f, dec, 4, dm);
  s = grove_module_forward(dec, f, &din, out);
  grove__mha_next_call(f, NULL, true, true);
  return s;
}

const grove_module_type grove__transformer_type = {
    .name = "Transformer",
    .forward = tf_forward,
};

grove_status grove_transformer_new(const grove_encoder_layer_opts *layer,
                                   int64_t num_encoder_layers, int64_t num_decoder_layers,
                                   grove_module **out, grove_err *err) {
  *out = NULL;
  tf_impl *p = calloc(1, sizeof *p);
  if (!p) return grove_err_set(err, GROVE_E_NOMEM, "Transformer: out of memory");
  p->o = *layer;
  p->o.activation = NULL;
  grove_module *m = NULL;
  grove_status s = grove__layer_make(&grove__transformer_type, p, &m, err);
  if (s) return s;
  const int64_t E = layer->d_model;
  /* torch builds both stacks with a final LayerNorm(d_model, layer_norm_eps). */
  for (int i = 0; i < 2 && !s; i++) {
    grove_module *norm = NULL, *c = NULL;
    s = grove_layer_norm_new(1, &E, layer->layer_norm_eps, true, &norm, err);
    if (!s)
      s = grove__add_child(
          m, i ? "decoder" : "encoder",
          stack_new(layer, i == 1, i ? num_decoder_layers : num_encoder_layers, norm, &c, err), &c,
          err);
    grove_module_release(norm);
  }
  if (s) {
    grove_module_release(m);
    return s;
  }
  *out = m;
  return GROVE_OK;
}

grove_status grove__transformer_from_json(const json_t *obj, const char *path, grove_module **out,
                                          grove_err *err) {
  static const char *const keys[] = {"d_model",
                                     "nhead",
                                     "num_encoder_layers",
                                     "num_decoder_layers",
                                     "dim_feedforward",
                                     "dropout",
                                     "activation",
                                     "custom_encoder",
                                     "custom_decoder",
                                     "layer_norm_eps",
                                     "batch_first",
                                     "norm_first",
                                     "bias",
                                     NULL};
  static const char *const acts[] = {"relu", "gelu", NULL};
  const char *T = "Transformer";
  grove_encoder_layer_opts o = {0};
  int64_t ne, nd;
  int act = 0;
  bool bias;
  grove_status s = grove__json_check_keys(obj, path, T, keys, err);
  if (!s) s = grove__json_int(obj, path, T, "d_model", false, 512, 1, 1 << 16, &o.d_model, err);
  if (!s) s = grove__json_int(obj, path, T, "nhead", false, 8, 1, 1 << 16, &o.nhead, err);
  if (!s) s = grove__json_int(obj, path, T, "num_encoder_layers", false, 6, 0, 4096, &ne, err);
  if (!s) s = grove__json_int(obj, path, T, "num_decoder_layers", false, 6, 0, 4096, &nd, err);
  if (!s)
    s = grove__json_int(obj, path, T, "dim_feedforward", false, 2048, 1, 1 << 20,
                        &o.dim_feedforward, err);
  if (!s) s = grove__json_number(obj, path, T, "dropout", 0.1, 0.0, 1.0, &o.dropout, err);
  if (!s) s = grove__json_choice(obj, path, T, "activation", 0, acts, &act, err);
  if (!s)
    s = grove__json_number(obj, path, T, "layer_norm_eps", 1e-5, 0.0, INFINITY, &o.layer_norm_eps,
                           err);
  if (!s) s = grove__json_bool(obj, path, T, "batch_first", false, &o.batch_first, err);
  if (!s) s = grove__json_bool(obj, path, T, "norm_first", false, &o.norm_first, err);
  if (!s) s = grove__json_bool(obj, path, T, "bias", true, &bias, err);
  if (s) return s;
  if (!bias)
    return grove__json_unsupported(path, "bias", "bias=False (torch >= 2.1) is not supported", err);
  for (int i = 0; i < 2; i++) {
    const char *k = i ? "custom_decoder" : "custom_encoder";
    const json_t *v = json_object_get(obj, k);
    if (v && !json_is_null(v))
      return grove__json_unsupported(path, k,
                                     "a custom encoder or decoder is not supported (export the "
                                     "model's own encoder/decoder modules instead)",
                                     err);
  }
  o.activation = acts[act];
  if (o.d_model % o.nhead)
    return grove_err_set(err, GROVE_E_SPEC,
                         "%s.nhead: d_model (%lld) must be divisible by nhead (%lld)", path,
                         (long long)o.d_model, (long long)o.nhead);
  return grove__json_built(path, grove_transformer_new(&o, ne, nd, out, err), err);
}
