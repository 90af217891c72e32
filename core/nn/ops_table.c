/* ops_table.c: the list of every op entry (ops.h), in the order messages
 * name them, the look-ups graph_compile.c and the layer registry use, and
 * the one model.json builder of every op module.  Above the family files
 * (ops_activation.c, ops_shape.c, ops_reduce.c, ops_binary.c, ops_pool.c), whose
 * entries it lists.  Adding an operation: define its entry in its family's
 * file, declare it here and add it to `table` (docs/architecture.md, "How
 * to add an operation"). */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "layers_internal.h"
#include "ops.h"

extern const grove__opdef grove__opdef_add, grove__opdef_sub, grove__opdef_mul, grove__opdef_div,
    grove__opdef_floordiv, grove__opdef_matmul, grove__opdef_remainder, grove__opdef_linear,
    grove__opdef_tensor;
extern const grove__opdef grove__opdef_bitwise_and, grove__opdef_bitwise_or,
    grove__opdef_bitwise_xor, grove__opdef_logical_and, grove__opdef_logical_or,
    grove__opdef_logical_xor, grove__opdef_bitwise_not, grove__opdef_logical_not,
    grove__opdef_isnan, grove__opdef_isinf, grove__opdef_isfinite, grove__opdef_any,
    grove__opdef_all, grove__opdef_hardshrink, grove__opdef_softshrink, grove__opdef_threshold;
extern const grove__opdef grove__opdef_log2, grove__opdef_log10, grove__opdef_exp2,
    grove__opdef_tan, grove__opdef_atan, grove__opdef_sinh, grove__opdef_cosh, grove__opdef_asin,
    grove__opdef_acos, grove__opdef_tanhshrink, grove__opdef_clone, grove__opdef_detach,
    grove__opdef_t;
extern const grove__opdef grove__opdef_relu, grove__opdef_gelu, grove__opdef_sigmoid,
    grove__opdef_tanh, grove__opdef_softmax, grove__opdef_log_softmax, grove__opdef_softmin,
    grove__opdef_dropout, grove__opdef_leaky_relu, grove__opdef_silu;
extern const grove__opdef grove__opdef_flatten, grove__opdef_reshape, grove__opdef_view, grove__opdef_permute,
    grove__opdef_transpose, grove__opdef_cat, grove__opdef_getitem, grove__opdef_size, grove__opdef_getattr,
    grove__opdef_contiguous;
extern const grove__opdef grove__opdef_mean, grove__opdef_sum;
extern const grove__opdef grove__opdef_full, grove__opdef_zeros, grove__opdef_ones,
    grove__opdef_arange, grove__opdef_triu, grove__opdef_tril, grove__opdef_cumsum,
    grove__opdef_cumprod, grove__opdef_prod, grove__opdef_to, grove__opdef_type,
    grove__opdef_zeros_like, grove__opdef_ones_like, grove__opdef_empty_like,
    grove__opdef_full_like, grove__opdef_new_zeros, grove__opdef_new_ones, grove__opdef_new_empty,
    grove__opdef_new_full, grove__opdef_new_tensor, grove__opdef_view_as, grove__opdef_reshape_as,
    grove__opdef_expand_as;
/* Users' own models' pointwise math: ops_pointwise.c, ops_binary.c. */
extern const grove__opdef grove__opdef_sin, grove__opdef_cos, grove__opdef_erf,
    grove__opdef_reciprocal, grove__opdef_log1p, grove__opdef_expm1, grove__opdef_softsign,
    grove__opdef_logsigmoid, grove__opdef_floor, grove__opdef_ceil, grove__opdef_round,
    grove__opdef_trunc, grove__opdef_sign, grove__opdef_square, grove__opdef_clamp_min,
    grove__opdef_clamp_max, grove__opdef_maximum, grove__opdef_minimum, grove__opdef_atan2,
    grove__opdef_lerp, grove__opdef_addcmul, grove__opdef_addcdiv, grove__opdef_nan_to_num,
    grove__opdef_int;
/* Norms and statistics: ops_stats.c. */
extern const grove__opdef grove__opdef_norm, grove__opdef_vector_norm, grove__opdef_normalize,
    grove__opdef_cosine_similarity, grove__opdef_pairwise_distance, grove__opdef_var,
    grove__opdef_std, grove__opdef_logsumexp, grove__opdef_outer, grove__opdef_glu;
/* ops_split.c: indexing users' models do. */
extern const grove__opdef grove__opdef_flip, grove__opdef_gather, grove__opdef_one_hot;
extern const grove__opdef grove__opdef_bmm, grove__opdef_baddbmm, grove__opdef_addmm,
    grove__opdef_einsum;

/* The torchvision zoo's operations (#18): ops_pointwise.c, ops_split.c,
 * ops_select.c, ops_resample.c. */
extern const grove__opdef grove__opdef_relu6, grove__opdef_hardswish, grove__opdef_hardsigmoid,
    grove__opdef_mish, grove__opdef_selu, grove__opdef_hardtanh, grove__opdef_elu,
    grove__opdef_celu, grove__opdef_softplus, grove__opdef_clamp, grove__opdef_exp,
    grove__opdef_log, grove__opdef_sqrt, grove__opdef_rsqrt, grove__opdef_abs, grove__opdef_neg,
    grove__opdef_pow, grove__opdef_float, grove__opdef_long, grove__opdef_bool, grove__opdef_dim,
    grove__opdef_numel, grove__opdef_prelu, grove__opdef_type_as, grove__opdef_stochastic_depth,
    grove__opdef_chunk, grove__opdef_split, grove__opdef_unbind, grove__opdef_stack,
    grove__opdef_expand, grove__opdef_repeat, grove__opdef_repeat_interleave,
    grove__opdef_unsqueeze, grove__opdef_squeeze, grove__opdef_roll, grove__opdef_narrow,
    grove__opdef_index_select, grove__opdef_eq, grove__opdef_ne, grove__opdef_lt, grove__opdef_le,
    grove__opdef_gt, grove__opdef_ge, grove__opdef_where, grove__opdef_masked_fill,
    grove__opdef_amax, grove__opdef_amin, grove__opdef_max, grove__opdef_min, grove__opdef_argmax,
    grove__opdef_argmin, grove__opdef_sort, grove__opdef_argsort, grove__opdef_topk,
    grove__opdef_interpolate, grove__opdef_pad, grove__opdef_pixel_shuffle,
    grove__opdef_pixel_unshuffle, grove__opdef_unflatten, grove__opdef_layer_norm,
    grove__opdef_group_norm, grove__opdef_instance_norm, grove__opdef_local_response_norm,
    grove__opdef_unfold;
extern const grove__opdef grove__opdef_max_pool1d, grove__opdef_max_pool2d, grove__opdef_avg_pool1d,
    grove__opdef_avg_pool2d, grove__opdef_adaptive_avg_pool1d, grove__opdef_adaptive_avg_pool2d,
    grove__opdef_adaptive_max_pool1d, grove__opdef_adaptive_max_pool2d;
/* torchvision's Swin Transformer helpers: ops_window.c. */
extern const grove__opdef grove__opdef_patch_merging_pad, grove__opdef_get_relative_position_bias,
    grove__opdef_shifted_window_attention;

static const grove__opdef *const table[] = {
    &grove__opdef_add,
    &grove__opdef_sub,
    &grove__opdef_mul,
    &grove__opdef_div,
    &grove__opdef_floordiv,
    &grove__opdef_matmul,
    &grove__opdef_relu,
    &grove__opdef_gelu,
    &grove__opdef_sigmoid,
    &grove__opdef_tanh,
    &grove__opdef_softmax,
    &grove__opdef_log_softmax,
    &grove__opdef_softmin,
    &grove__opdef_dropout,
    &grove__opdef_flatten,
    &grove__opdef_reshape,
    &grove__opdef_view,
    &grove__opdef_permute,
    &grove__opdef_transpose,
    &grove__opdef_cat,
    &grove__opdef_mean,
    &grove__opdef_sum,
    &grove__opdef_getitem,
    &grove__opdef_size,
    &grove__opdef_getattr,
    &grove__opdef_contiguous,
    &grove__opdef_leaky_relu,
    &grove__opdef_silu,
    /* #18 */
    &grove__opdef_relu6,
    &grove__opdef_hardswish,
    &grove__opdef_hardsigmoid,
    &grove__opdef_mish,
    &grove__opdef_selu,
    &grove__opdef_hardtanh,
    &grove__opdef_elu,
    &grove__opdef_celu,
    &grove__opdef_softplus,
    &grove__opdef_clamp,
    &grove__opdef_exp,
    &grove__opdef_log,
    &grove__opdef_sqrt,
    &grove__opdef_rsqrt,
    &grove__opdef_abs,
    &grove__opdef_neg,
    &grove__opdef_pow,
    &grove__opdef_float,
    &grove__opdef_long,
    &grove__opdef_bool,
    &grove__opdef_dim,
    &grove__opdef_numel,
    &grove__opdef_prelu,
    &grove__opdef_type_as,
    &grove__opdef_stochastic_depth,
    &grove__opdef_chunk,
    &grove__opdef_split,
    &grove__opdef_unbind,
    &grove__opdef_stack,
    &grove__opdef_expand,
    &grove__opdef_repeat,
    &grove__opdef_repeat_interleave,
    &grove__opdef_unsqueeze,
    &grove__opdef_squeeze,
    &grove__opdef_roll,
    &grove__opdef_narrow,
    &grove__opdef_index_select,
    &grove__opdef_eq,
    &grove__opdef_ne,
    &grove__opdef_lt,
    &grove__opdef_le,
    &grove__opdef_gt,
    &grove__opdef_ge,
    &grove__opdef_where,
    &grove__opdef_masked_fill,
    &grove__opdef_amax,
    &grove__opdef_amin,
    &grove__opdef_max,
    &grove__opdef_min,
    &grove__opdef_argmax,
    &grove__opdef_argmin,
    &grove__opdef_sort,
    &grove__opdef_argsort,
    &grove__opdef_topk,
    &grove__opdef_interpolate,
    &grove__opdef_pad,
    &grove__opdef_pixel_shuffle,
    &grove__opdef_pixel_unshuffle,
    &grove__opdef_unflatten,
    &grove__opdef_layer_norm,
    &grove__opdef_group_norm,
    &grove__opdef_instance_norm,
    &grove__opdef_local_response_norm,
    &grove__opdef_unfold,
    /* ops_create.c, ops_linalg.c: what sequence models build masks and
     * attention with */
    &grove__opdef_full,
    &grove__opdef_zeros,
    &grove__opdef_ones,
    &grove__opdef_arange,
    &grove__opdef_triu,
    &grove__opdef_tril,
    &grove__opdef_cumsum,
    &grove__opdef_cumprod,
    &grove__opdef_prod,
    &grove__opdef_to,
    &grove__opdef_type,
    &grove__opdef_zeros_like,
    &grove__opdef_ones_like,
    &grove__opdef_empty_like,
    &grove__opdef_full_like,
    &grove__opdef_new_zeros,
    &grove__opdef_new_ones,
    &grove__opdef_new_empty,
    &grove__opdef_new_full,
    &grove__opdef_new_tensor,
    &grove__opdef_view_as,
    &grove__opdef_reshape_as,
    &grove__opdef_expand_as,
    &grove__opdef_sin,
    &grove__opdef_cos,
    &grove__opdef_erf,
    &grove__opdef_reciprocal,
    &grove__opdef_log1p,
    &grove__opdef_expm1,
    &grove__opdef_softsign,
    &grove__opdef_logsigmoid,
    &grove__opdef_floor,
    &grove__opdef_ceil,
    &grove__opdef_round,
    &grove__opdef_trunc,
    &grove__opdef_sign,
    &grove__opdef_square,
    &grove__opdef_clamp_min,
    &grove__opdef_clamp_max,
    &grove__opdef_maximum,
    &grove__opdef_minimum,
    &grove__opdef_atan2,
    &grove__opdef_lerp,
    &grove__opdef_addcmul,
    &grove__opdef_addcdiv,
    &grove__opdef_nan_to_num,
    &grove__opdef_int,
    &grove__opdef_norm,
    &grove__opdef_vector_norm,
    &grove__opdef_normalize,
    &grove__opdef_cosine_similarity,
    &grove__opdef_pairwise_distance,
    &grove__opdef_var,
    &grove__opdef_std,
    &grove__opdef_logsumexp,
    &grove__opdef_outer,
    &grove__opdef_glu,
    &grove__opdef_flip,
    &grove__opdef_gather,
    &grove__opdef_one_hot,
    &grove__opdef_remainder,
    &grove__opdef_linear,
    &grove__opdef_tensor,
    &grove__opdef_bitwise_and,
    &grove__opdef_bitwise_or,
    &grove__opdef_bitwise_xor,
    &grove__opdef_logical_and,
    &grove__opdef_logical_or,
    &grove__opdef_logical_xor,
    &grove__opdef_bitwise_not,
    &grove__opdef_logical_not,
    &grove__opdef_isnan,
    &grove__opdef_isinf,
    &grove__opdef_isfinite,
    &grove__opdef_any,
    &grove__opdef_all,
    &grove__opdef_hardshrink,
    &grove__opdef_softshrink,
    &grove__opdef_threshold,

    &grove__opdef_log2,
    &grove__opdef_log10,
    &grove__opdef_exp2,
    &grove__opdef_tan,
    &grove__opdef_atan,
    &grove__opdef_sinh,
    &grove__opdef_cosh,
    &grove__opdef_asin,
    &grove__opdef_acos,
    &grove__opdef_tanhshrink,
    &grove__opdef_clone,
    &grove__opdef_detach,
    &grove__opdef_t,

    &grove__opdef_bmm,
    &grove__opdef_baddbmm,
    &grove__opdef_addmm,
    &grove__opdef_einsum,
    &grove__opdef_max_pool1d,
    &grove__opdef_max_pool2d,
    &grove__opdef_avg_pool1d,
    &grove__opdef_avg_pool2d,
    &grove__opdef_adaptive_avg_pool1d,
    &grove__opdef_adaptive_avg_pool2d,
    &grove__opdef_adaptive_max_pool1d,
    &grove__opdef_adaptive_max_pool2d,
    /* ops_window.c: Swin */
    &grove__opdef_patch_merging_pad,
    &grove__opdef_get_relative_position_bias,
    &grove__opdef_shifted_window_attention,
};
#define NTABLE ((int)(sizeof table / sizeof table[0]))

const grove__opdef *const *grove__ops(int *n) {
  if (n) *n = NTABLE;
  return table;
}

const grove__opdef *grove__op_find(const char *target) {
  if (!target) return NULL;
  for (int i = 0; i < NTABLE; i++) {
    const grove__opdef *d = table[i];
    if (d->module_only) continue;
    if (strcmp(d->name, target) == 0 || (d->alias && strcmp(d->alias, target) == 0)) return d;
  }
  return NULL;
}

const grove__opdef *grove__op_find_module(const char *cls, const grove__opmod **md) {
  if (!cls) return NULL;
  for (int i = 0; i < NTABLE; i++)
    for (const grove__opmod *m = table[i]->module; m; m = m->next)
      if (strcmp(m->cls, cls) == 0) {
        if (md) *md = m;
        return table[i];
      }
  return NULL;
}

void grove__op_list(char *buf, size_t n) {
  size_t used = 0;
  buf[0] = '\0';
  int k = 0;
  for (int i = 0; i < NTABLE && used < n; i++) {
    const grove__opdef *d = table[i];
    if (d->module_only) continue;
    used += (size_t)snprintf(buf + used, n - used, "%s%s", k++ ? ", " : "", d->name);
    if (d->alias && used < n) used += (size_t)snprintf(buf + used, n - used, ", %s", d->alias);
  }
}

/* ------------------------------------------------------------ the module builder */

/* A number (integers, as P_INTS, or any), or a list of 1 to
 * 2 * GROVE_MAX_DIMS of them, in [p->min, p->max]: Upsample's size and
 * scale_factor, ConstantPad2d's padding.  Absent: p's default; null where
 * the default is None. */
static grove_status read_numbers(const json_t *obj, const char *path, const char *cls,
                                 const grove__oppar *p, const char *key, garg *a, grove_err *err) {
  const bool ints = p->kind == P_INTS;
  const json_t *v = json_object_get(obj, key);
  if (!v || (json_is_null(v) && p->dk == D_NONE)) {
    if (!v && p->dk == D_REQ)
      return grove_err_set(err, GROVE_E_SPEC, "%s.%s: missing required argument of %s", path, key,
                           cls);
    if (p->dk == D_NONE) {
      a->kind = A_NONE;
    } else {
      a->kind = A_FLOAT;
      a->f = p->dv;
    }
    return GROVE_OK;
  }
  const bool list = json_is_array(v);
  const size_t n = list ? json_array_size(v) : 1;
  bool ok = (!list || (n >= 1 && n <= 2 * GROVE_MAX_DIMS)) && !(!list && p->list_only);
  for (size_t i = 0; ok && i < n; i++) {
    const json_t *x = list ? json_array_get(v, i) : v;
    ok = ints ? json_is_integer(x) : json_is_number(x);
    ok = ok && json_number_value(x) >= p->min && json_number_value(x) <= p->max;
  }
  if (!ok) {
    char got[96];
    grove__json_describe(v, got, sizeof got);
    return grove_err_set(err, GROVE_E_SPEC, "%s.%s: expected %s%s in [%g, %g]%s, got %s", path, key,
                         p->dk == D_REQ ? "" : "null, or ", ints ? "integers" : "numbers", p->min,
                         p->max, p->list_only ? " as a list" : " (one, or a list of one per dim)",
                         got);
  }
  if (!list) {
    a->kind = ints ? A_INT : A_FLOAT;
    a->i = ints ? (int64_t)json_integer_value(v) : 0;
    a->f = json_number_value(v);
    return GROVE_OK;
  }
  if (!(a->items = calloc(n, sizeof *a->items)))
    return grove_err_set(err, GROVE_E_NOMEM, "%s.%s: out of memory", path, key);
  a->kind = A_LIST;
  a->n = (int)n;
  for (size_t i = 0; i < n; i++) {
    const json_t *x = json_array_get(v, i);
    a->items[i].kind = ints ? A_INT : A_FLOAT;
    a->items[i].i = ints ? (int64_t)json_integer_value(x) : 0;
    a->items[i].f = json_number_value(x);
  }
  return GROVE_OK;
}

/* Reads constructor argument p of module cls from obj into a (a list's
 * items owned by a). */
static grove_status read_arg(const json_t *obj, const char *path, const char *cls,
                             const grove__oppar *p, garg *a, grove_err *err) {
  memset(a, 0, sizeof *a);
  grove_status s;
  const char *key = p->key ? p->key : p->name;
  if (p->kind == P_INTS || (p->kind == P_NUMBER && p->dk == D_NONE))
    return read_numbers(obj, path, cls, p, key, a, err);
  switch (p->kind) {
    case P_BOOL:
    case P_IGNORED: {
      if (p->dk == D_NONE) { /* Upsample's align_corners: None, True or False */
        const json_t *v = json_object_get(obj, key);
        if (!v || json_is_null(v)) {
          a->kind = A_NONE;
          return GROVE_OK;
        }
      }
      bool b = false; /* left unset when the key is refused */
      s = grove__json_bool(obj, path, cls, key, p->dv != 0, &b, err);
      a->kind = A_BOOL;
      a->i = b;
      return s;
    }
    case P_INT: {
      int64_t v = 0;
      bool is_null = false;
      if (p->dk == D_NONE)
        s = grove__json_int_or_null(obj, path, cls, key, true, 0, (int64_t)p->min, (int64_t)p->max,
                                    &v, &is_null, err);
      else
        s = grove__json_int(obj, path, cls, key, p->dk == D_REQ, (int64_t)p->dv, (int64_t)p->min,
                            (int64_t)p->max, &v, err);
      a->kind = is_null ? A_NONE : A_INT;
      a->i = v;
      return s;
    }
    case P_FLOAT:
    case P_NUMBER: {
      double v = 0;
      if (p->dk == D_REQ && !json_object_get(obj, key)) /* ConstantPad2d's value */
        return grove_err_set(err, GROVE_E_SPEC, "%s.%s: missing required argument of %s", path, key,
                             cls);
      s = grove__json_number(obj, path, cls, key, p->dv, p->min, p->max, &v, err);
      a->kind = A_FLOAT;
      a->f = v;
      return s;
    }
    case P_STR: {
      int dflt = 0, which = 0;
      for (int i = 0; p->choices && p->choices[i]; i++)
        if (p->ds && strcmp(p->choices[i], p->ds) == 0) dflt = i;
      s = grove__json_choice(obj, path, cls, key, dflt, p->choices, &which, err);
      a->kind = A_STR;
      a->s = (char *)p->choices[which]; /* not owned: grove__op_module_new copies it */
      return s;
    }
    default:
      return grove_err_set(err, GROVE_E_INTERNAL, "%s: constructor argument %s of kind %d", cls,
                           key, p->kind);
  }
}

/* The op's check (interpolate: a mode with align_corners, size and
 * scale_factor both set) on a module's arguments, the op's defaults
 * elsewhere, so that a module and a node are refused alike, at build time. */
static grove_status check_module_args(const grove__opdef *d, const grove__opmod *md, const garg *a,
                                      int n, const char *path, grove_err *err) {
  if (!d->check || !md->check_args) return GROVE_OK;
  garg dflt[GROVE__OP_MAX_PARAMS] = {{0}}; /* owned */
  garg view[GROVE__OP_MAX_PARAMS] = {{0}}; /* borrowed from dflt and a */
  const int np = grove__op_nparams(d);
  grove_status s = GROVE_OK;
  for (int i = md->inputs > 1 ? md->inputs : 1; i < np && !s; i++) { /* before: the inputs */
    int k = 0;
    while (k < n && strcmp(md->args[k].name, d->p[i].name) != 0) k++;
    if (k < n) {
      view[i] = a[k];
      continue;
    }
    if ((s = grove__op_default(&d->p[i], &dflt[i])) == GROVE_E_SPEC) s = GROVE_OK; /* required */
    view[i] = dflt[i];
  }
  if (!s) s = d->check(d, view, path, err);
  for (int i = 0; i < np; i++) grove__garg_fini(&dflt[i]);
  return s;
}

grove_status grove__op_module_from_json(const json_t *obj, const char *path, grove_module **out,
                                        grove_err *err) {
  *out = NULL;
  const char *cls = json_string_value(json_object_get(obj, "type"));
  const grove__opmod *md = NULL;
  const grove__opdef *d = grove__op_find_module(cls, &md);
  if (!d) return grove_err_set(err, GROVE_E_INTERNAL, "%s: no op module of type %s", path, cls);
  const char *keys[GROVE__OPMOD_MAX_ARGS + 1] = {NULL};
  int n = 0;
  while (n < GROVE__OPMOD_MAX_ARGS && md->args[n].name) {
    keys[n] = md->args[n].key ? md->args[n].key : md->args[n].name;
    n++;
  }
  grove_status s = grove__json_check_keys(obj, path, cls, keys, err);
  garg a[GROVE__OPMOD_MAX_ARGS] = {{0}};
  for (int k = 0; !s && k < n; k++) s = read_arg(obj, path, cls, &md->args[k], &a[k], err);
  if (!s) s = check_module_args(d, md, a, n, path, err);
  if (!s && md->after_json) {
    /* The hook reads parameters by their op slot. */
    garg full[GROVE__OP_MAX_PARAMS] = {{0}};
    for (int k = 0; k < n; k++)
      for (int i = 0; i < GROVE__OP_MAX_PARAMS && d->p[i].name; i++)
        if (strcmp(d->p[i].name, md->args[k].name) == 0) full[i] = a[k];
    md->after_json(d, path, full);
  }
  if (!s) s = grove__json_built(path, grove__op_module_new(d, md, a, n, out, err), err);
  for (int k = 0; k < n; k++) {
    a[k].s = NULL; /* a choice string of the table, not owned */
    grove__garg_fini(&a[k]);
  }
  return s;
}
