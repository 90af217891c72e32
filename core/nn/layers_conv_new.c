/* layers_conv_new.c: torch.nn.Conv1d and Conv2d built: grove_conv1d_new /
 * grove_conv2d_new with torch's constructor arguments and their checks
 * (padding "same" / "valid", groups, dilation), and the model.json
 * builders that read those arguments under torch's names.  The layers
 * themselves (refresh, forward) are layers_conv.c's. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "layers_conv_internal.h"
#include "layers_internal.h"

static grove_status conv_new(int nd, int64_t cin, int64_t cout, const grove_conv_opts *o,
                             grove_module **out, grove_err *err) {
  *out = NULL;
  const char *T = nd == 1 ? "Conv1d" : "Conv2d";
  if (!o) return grove_err_set(err, GROVE_E_INVALID_ARGUMENT, "%s: no options", T);
  int64_t groups = o->groups ? o->groups : 1;
  if (cin <= 0 || cout <= 0 || groups <= 0)
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT,
                         "%s: in_channels, out_channels and groups must be positive, got %lld, "
                         "%lld and %lld",
                         T, (long long)cin, (long long)cout, (long long)groups);
  if (cin % groups)
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT,
                         "%s: in_channels must be divisible by groups", T);
  if (cout % groups)
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT,
                         "%s: out_channels must be divisible by groups", T);
  int64_t k[2], st[2], dl[2], pd[2];
  for (int d = 0; d < 2; d++) {
    /* 1-d layers use index 0 of the options for their one dim (W). */
    int src = nd == 1 ? 0 : d;
    bool used = nd == 2 || d == 1;
    k[d] = used ? o->kernel_size[src] : 1;
    st[d] = used ? (o->stride[src] ? o->stride[src] : 1) : 1;
    dl[d] = used ? (o->dilation[src] ? o->dilation[src] : 1) : 1;
    pd[d] = used ? o->padding[src] : 0;
    if (k[d] <= 0 || st[d] <= 0 || dl[d] <= 0 || pd[d] < 0 || k[d] > (1 << 20) ||
        st[d] > (1 << 20) || dl[d] > (1 << 20) || pd[d] > (1 << 20))
      return grove_err_set(err, GROVE_E_INVALID_ARGUMENT,
                           "%s: kernel_size, stride and dilation must be positive and padding "
                           "non-negative (and each at most 2^20)",
                           T);
  }
  if (o->padding_same && (st[0] != 1 || st[1] != 1))
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT,
                         "%s: padding='same' is not supported for strided convolutions", T);
  uint64_t K, nw;
  if (grove__mul_overflow_u64((uint64_t)(cin / groups), (uint64_t)(k[0] * k[1]), &K) ||
      grove__mul_overflow_u64(K, (uint64_t)cout, &nw) || nw > ((uint64_t)1 << 40))
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT, "%s: the weight is too large", T);
  conv_impl *p = calloc(1, sizeof *p + ((size_t)nw + 3 * (size_t)cout) * sizeof(float));
  if (!p) return grove_err_set(err, GROVE_E_NOMEM, "%s: out of memory", T);
  p->nd = nd;
  p->cin = cin;
  p->cout = cout;
  p->groups = groups;
  p->K = (int64_t)K;
  p->pad_kind = o->padding_same ? 1 : o->padding_valid ? 2 : 0;
  for (int d = 0; d < 2; d++) {
    p->k[d] = k[d];
    p->stride[d] = st[d];
    p->dil[d] = dl[d];
    p->padding[d] = pd[d];
    if (o->padding_same) {
      /* torch's _conv_forward: total = dilation * (kernel - 1), the odd one
       * out on the right. */
      int64_t total = dl[d] * (k[d] - 1);
      p->pad_lo[d] = total / 2;
      p->pad_hi[d] = total - total / 2;
    } else if (o->padding_valid) {
      p->pad_lo[d] = p->pad_hi[d] = 0;
    } else {
      p->pad_lo[d] = p->pad_hi[d] = pd[d];
    }
  }
  p->w = p->data;
  p->bias = p->w + nw;
  p->ones = p->bias + cout;
  for (int64_t c = 0; c < cout; c++) p->ones[c] = 1.0f;
  grove_module *m = NULL;
  grove_status s =
      grove__layer_make(nd == 1 ? &grove__conv1d_type : &grove__conv2d_type, p, &m, err);
  if (s) return s;
  int64_t wshape[4] = {cout, cin / groups, k[0], k[1]};
  if (nd == 1) wshape[2] = k[1];
  return grove__conv_params(m, nd + 2, wshape, cout, o->bias, out, err);
}

grove_status grove__conv_params(grove_module *m, int wnd, const int64_t *wshape, int64_t cout,
                                bool bias, grove_module **out, grove_err *err) {
  grove_status s = grove__layer_param(m, "weight", false, wnd, wshape, GROVE_F32, 0.0f, err);
  if (!s) {
    if (bias)
      s = grove__layer_param(m, "bias", false, 1, &cout, GROVE_F32, 0.0f, err);
    else
      s = grove_module_register_parameter(m, "bias", NULL, err);
  }
  /* Copies and packs the zero weight, unless the tree is built for a load
   * (module_module_internal.h, "deferred refresh"). */
  if (!s) s = grove__refresh_new(m, err);
  if (s) {
    grove_module_release(m);
    return s;
  }
  *out = m;
  return GROVE_OK;
}

grove_status grove_conv1d_new(int64_t in_channels, int64_t out_channels, const grove_conv_opts *o,
                              grove_module **out, grove_err *err) {
  return conv_new(1, in_channels, out_channels, o, out, err);
}
grove_status grove_conv2d_new(int64_t in_channels, int64_t out_channels, const grove_conv_opts *o,
                              grove_module **out, grove_err *err) {
  return conv_new(2, in_channels, out_channels, o, out, err);
}

/* ------------------------------------------------------------ model.json */

#define BIG (1 << 20)

static grove_status conv_from_json(int nd, const json_t *obj, const char *path, grove_module **out,
                                   grove_err *err) {
  static const char *const keys[] = {
      "in_channels", "out_channels", "kernel_size", "stride",       "padding",
      "dilation",    "groups",       "bias",        "padding_mode", NULL};
  const char *T = nd == 1 ? "Conv1d" : "Conv2d";
  int64_t cin, cout;
  grove_conv_opts o = {0};
  grove_status s = grove__json_check_keys(obj, path, T, keys, err);
  if (!s) s = grove__conv_json_common(obj, path, T, nd, &cin, &cout, &o, err);
  if (s) return s;
  const json_t *pad = json_object_get(obj, "padding");
  if (json_is_string(pad)) {
    static const char *const pads[] = {"same", "valid", NULL};
    int which;
    s = grove__json_choice(obj, path, T, "padding", 0, pads, &which, err);
    if (s) return s;
    o.padding_same = which == 0;
    o.padding_valid = which == 1;
  } else {
    s = grove__json_ints(obj, path, T, "padding", nd, 0, 0, BIG, o.padding, err);
    if (s) return s;
  }
  return grove__json_built(path,
                           nd == 1 ? grove_conv1d_new(cin, cout, &o, out, err)
                                   : grove_conv2d_new(cin, cout, &o, out, err),
                           err);
}

grove_status grove__conv_json_common(const json_t *obj, const char *path, const char *T,
                                     int nd, int64_t *cin, int64_t *cout, grove_conv_opts *o,
                                     grove_err *err) {
  static const char *const modes[] = {"zeros", "reflect", "replicate", "circular", NULL};
  int64_t groups;
  int mode = 0;
  grove_status s = grove__json_int(obj, path, T, "in_channels", true, 0, 1, INT32_MAX, cin, err);
  if (!s) s = grove__json_int(obj, path, T, "out_channels", true, 0, 1, INT32_MAX, cout, err);
  if (!s) s = grove__json_ints(obj, path, T, "kernel_size", nd, 0, 1, BIG, o->kernel_size, err);
  if (!s) s = grove__json_ints(obj, path, T, "stride", nd, 1, 1, BIG, o->stride, err);
  if (!s) s = grove__json_ints(obj, path, T, "dilation", nd, 1, 1, BIG, o->dilation, err);
  if (!s) s = grove__json_int(obj, path, T, "groups", false, 1, 1, INT32_MAX, &groups, err);
  if (!s) s = grove__json_bool(obj, path, T, "bias", true, &o->bias, err);
  if (!s) s = grove__json_choice(obj, path, T, "padding_mode", 0, modes, &mode, err);
  if (s) return s;
  /* torch accepts only zeros for the transposed convolutions; Grove's
   * convolutions pad with zeros only. */
  if (mode != 0)
    return grove__json_unsupported(path, "padding_mode", "only padding_mode=\"zeros\" is supported",
                                   err);
  if (*cin % groups || *cout % groups)
    return grove_err_set(err, GROVE_E_SPEC,
                         "%s.groups: in_channels (%lld) and out_channels (%lld) must both be "
                         "divisible by groups (%lld)",
                         path, (long long)*cin, (long long)*cout, (long long)groups);
  o->groups = groups;
  return GROVE_OK;
}

grove_status grove__conv1d_from_json(const json_t *obj, const char *path, grove_module **out,
                                     grove_err *err) {
  return conv_from_json(1, obj, path, out, err);
}
grove_status grove__conv2d_from_json(const json_t *obj, const char *path, grove_module **out,
                                     grove_err *err) {
  return conv_from_json(2, obj, path, out, err);
}
