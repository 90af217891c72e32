/* ops_table.c: the list of every op entry (ops.h), in the order messages
 * name them, the look-ups graph_compile.c and the layer registry use, and
 * the one model.json builder of every op module.  Above the family files
 * (ops_activation.c, ops_shape.c, ops_reduce.c, ops_binary.c, ops_pool.c), whose
 * entries it lists.  Adding an operation: define its entry in its family's
 * file, declare it here and add it to `table` (docs/architecture.md, "How
 * to add an operation"). */
#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "layers_internal.h"
#include "ops.h"

extern const grove__opdef grove__opdef_add, grove__opdef_sub, grove__opdef_mul, grove__opdef_div,
    grove__opdef_floordiv, grove__opdef_matmul;
extern const grove__opdef grove__opdef_relu, grove__opdef_gelu, grove__opdef_sigmoid, grove__opdef_tanh,
    grove__opdef_softmax, grove__opdef_log_softmax, grove__opdef_dropout, grove__opdef_leaky_relu,
    grove__opdef_silu;
extern const grove__opdef grove__opdef_flatten, grove__opdef_reshape, grove__opdef_view, grove__opdef_permute,
    grove__opdef_transpose, grove__opdef_cat, grove__opdef_getitem, grove__opdef_size, grove__opdef_getattr,
    grove__opdef_contiguous;
extern const grove__opdef grove__opdef_mean, grove__opdef_sum;
extern const grove__opdef grove__opdef_full, grove__opdef_zeros, grove__opdef_ones,
    grove__opdef_arange, grove__opdef_triu, grove__opdef_tril, grove__opdef_cumsum,
    grove__opdef_to, grove__opdef_type;
extern const grove__opdef grove__opdef_bmm, grove__opdef_baddbmm, grove__opdef_addmm,
    grove__opdef_einsum;

/* The torchvision zoo's operations (#18): ops_pointwise.c, ops_split.c,
 * ops_select.c, ops_resample.c. */
extern const grove__opdef grove__opdef_relu6, grove__opdef_hardswish, grove__opdef_hardsigmoid,
    grove__opdef_mish, grove__opdef_selu, grove__opdef_hardtanh, grove__opdef_elu,
    grove__opdef_celu, grove__opdef_softplus, grove__opdef_clamp, grove__opdef_exp,
    grove__opdef_log, grove__opdef_sqrt, grove__opdef_rsqrt, grove__opdef_abs, grove__opdef_neg,
    grove__opdef_pow, grove__opdef_float, grove__opdef_long, grove__opdef_bool, grove__opdef_dim,
    grove__opdef_numel, grove__opdef_prelu, grove__opdef_type_as,
    grove__opdef_stochastic_depth, grove__opdef_chunk, grove__opdef_split, grove__opdef_unbind,
    grove__opdef_stack, grove__opdef_expand, grove__opdef_repeat, grove__opdef_unsqueeze,
    grove__opdef_squeeze, grove__opdef_roll, grove__opdef_narrow, grove__opdef_index_select,
    grove__opdef_eq, grove__opdef_ne, grove__opdef_lt, grove__opdef_le, grove__opdef_gt,
    grove__opdef_ge, grove__opdef_where, grove__opdef_masked_fill, grove__opdef_amax,
    grove__opdef_amin, grove__opdef_max, grove__opdef_min, grove__opdef_argmax,
    grove__opdef_argmin, grove__opdef_interpolate, grove__opdef_pad, grove__opdef_pixel_shuffle,
    grove__opdef_layer_norm, grove__opdef_group_norm, grove__opdef_instance_norm,
    grove__opdef_local_response_norm;
extern const grove__opdef grove__opdef_max_pool1d, grove__opdef_max_pool2d, grove__opdef_avg_pool1d,
    grove__opdef_avg_pool2d, grove__opdef_adaptive_avg_pool1d, grove__opdef_adaptive_avg_pool2d,
    grove__opdef_adaptive_max_pool1d, grove__opdef_adaptive_max_pool2d;
/* torchvision's Swin Transformer helpers: ops_window.c. */
extern const grove__opdef grove__opdef_patch_merging_pad, grove__opdef_get_relative_position_bias,
    grove__opdef_shifted_window_attention;

static const grove__opdef *const table[] = {
    &grove__opdef_add,        &grove__opdef_sub,       &grove__opdef_mul,        &grove__opdef_div,
    &grove__opdef_floordiv,   &grove__opdef_matmul,    &grove__opdef_relu,       &grove__opdef_gelu,
    &grove__opdef_sigmoid,    &grove__opdef_tanh,      &grove__opdef_softmax,    &grove__opdef_log_softmax,
    &grove__opdef_dropout,    &grove__opdef_flatten,   &grove__opdef_reshape,    &grove__opdef_view,
    &grove__opdef_permute,    &grove__opdef_transpose, &grove__opdef_cat,        &grove__opdef_mean,
    &grove__opdef_sum,        &grove__opdef_getitem,   &grove__opdef_size,       &grove__opdef_getattr,
    &grove__opdef_contiguous, &grove__opdef_leaky_relu, &grove__opdef_silu,
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
    &grove__opdef_interpolate,
    &grove__opdef_pad,
    &grove__opdef_pixel_shuffle,
    &grove__opdef_layer_norm,
    &grove__opdef_group_norm,
    &grove__opdef_instance_norm,
    &grove__opdef_local_response_norm,
    /* ops_create.c, ops_linalg.c: what sequence models build masks and
     * attention with */
    &grove__opdef_full,       &grove__opdef_zeros,     &grove__opdef_ones,       &grove__opdef_arange,
    &grove__opdef_triu,       &grove__opdef_tril,      &grove__opdef_cumsum,     &grove__opdef_to,
    &grove__opdef_type,       &grove__opdef_bmm,       &grove__opdef_baddbmm,    &grove__opdef_addmm,
    &grove__opdef_einsum,
    &grove__opdef_max_pool1d, &grove__opdef_max_pool2d, &grove__opdef_avg_pool1d,
    &grove__opdef_avg_pool2d, &grove__opdef_adaptive_avg_pool1d, &grove__opdef_adaptive_avg_pool2d,
    &grove__opdef_adaptive_max_pool1d, &grove__opdef_adaptive_max_pool2d,
    /* ops_window.c: Swin */
    &grove__opdef_patch_merging_pad, &grove__opdef_get_relative_position_bias,
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

const grove__opdef *grove__op_find_module(const char *cls) {
  if (!cls) return NULL;
  for (int i = 0; i < NTABLE; i++)
    if (table[i]->module && strcmp(table[i]->module->cls, cls) == 0) return table[i];
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

/* Reads constructor argument p of module cls from obj into a. */
static grove_status read_arg(const json_t *obj, const char *path, const char *cls,
                             const grove__oppar *p, garg *a, grove_err *err) {
  memset(a, 0, sizeof *a);
  grove_status s;
  switch (p->kind) {
    case P_BOOL:
    case P_IGNORED: {
      bool b;
      s = grove__json_bool(obj, path, cls, p->name, p->dv != 0, &b, err);
      a->kind = A_BOOL;
      a->i = b;
      return s;
    }
    case P_INT: {
      int64_t v = 0;
      bool is_null = false;
      if (p->dk == D_NONE)
        s = grove__json_int_or_null(obj, path, cls, p->name, true, 0, (int64_t)p->min,
                                    (int64_t)p->max, &v, &is_null, err);
      else
        s = grove__json_int(obj, path, cls, p->name, p->dk == D_REQ, (int64_t)p->dv,
                            (int64_t)p->min, (int64_t)p->max, &v, err);
      a->kind = is_null ? A_NONE : A_INT;
      a->i = v;
      return s;
    }
    case P_FLOAT:
    case P_NUMBER: {
      double v;
      s = grove__json_number(obj, path, cls, p->name, p->dv, p->min, p->max, &v, err);
      a->kind = A_FLOAT;
      a->f = v;
      return s;
    }
    case P_STR: {
      int dflt = 0, which = 0;
      for (int i = 0; p->choices && p->choices[i]; i++)
        if (p->ds && strcmp(p->choices[i], p->ds) == 0) dflt = i;
      s = grove__json_choice(obj, path, cls, p->name, dflt, p->choices, &which, err);
      a->kind = A_STR;
      a->s = (char *)p->choices[which]; /* not owned: grove__op_module_new copies it */
      return s;
    }
    default:
      return grove_err_set(err, GROVE_E_INTERNAL, "%s: constructor argument %s of kind %d", cls,
                           p->name, p->kind);
  }
}

grove_status grove__op_module_from_json(const json_t *obj, const char *path, grove_module **out,
                                        grove_err *err) {
  *out = NULL;
  const char *cls = json_string_value(json_object_get(obj, "type"));
  const grove__opdef *d = grove__op_find_module(cls);
  if (!d) return grove_err_set(err, GROVE_E_INTERNAL, "%s: no op module of type %s", path, cls);
  const grove__opmod *md = d->module;
  const char *keys[5] = {NULL};
  int n = 0;
  while (n < 4 && md->args[n].name) {
    keys[n] = md->args[n].name;
    n++;
  }
  grove_status s = grove__json_check_keys(obj, path, cls, keys, err);
  garg a[4];
  for (int k = 0; !s && k < n; k++) s = read_arg(obj, path, cls, &md->args[k], &a[k], err);
  if (s) return s;
  if (md->after_json) {
    /* The hook reads parameters by their op slot. */
    garg full[GROVE__OP_MAX_PARAMS] = {{0}};
    for (int k = 0; k < n; k++)
      for (int i = 0; i < GROVE__OP_MAX_PARAMS && d->p[i].name; i++)
        if (strcmp(d->p[i].name, md->args[k].name) == 0) full[i] = a[k];
    md->after_json(d, path, full);
  }
  return grove__json_built(path, grove__op_module_new(d, a, n, out, err), err);
}
