/* layers_container.c: the containers (Sequential with its fusions, ModuleList,
 * ModuleDict) and Identity, with their constructors and model.json
 * builders.  The parameter-free layers that are operations (ReLU, GELU,
 * Softmax, Flatten, Dropout ...) are op entries (ops.h, ops_activation.c,
 * ops_shape.c), built and run by ops_module.c. */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "layers_internal.h"
#include "observe.h"

/* ------------------------------------------------------------ helpers */

static const char *const no_args[] = {NULL};

/* ------------------------------------------------------------ containers */

/* The child after child i of Sequential m, or NULL. */
static const grove_module *seq_next(const grove_module *m, size_t i) {
  return i + 1 < m->nchildren ? m->children[i + 1].module : NULL;
}

/* The activation a Linear followed by module am applies in its product's
 * epilogue (gemm.c: in the register tiles for ReLU, on each tile right after
 * it is written for the others): the convolutions' (grove__fusable_act) and
 * the exact GELU of a transformer's MLP (ViT, ConvNeXt), or
 * GROVE__ACT_NONE. */
static grove__act linear_fusable_act(const grove_module *am) {
  const grove__act gelu = grove__gelu_act(am);
  return gelu != GROVE__ACT_NONE ? gelu : grove__fusable_act(am);
}

/* The input channels of `next` when it is a convolution that can multiply
 * its input by a per-channel scale as it reads it (grove__conv_takes_in_scale:
 * a 1x1 Conv2d on the rows path), directly or as the first child of a
 * Sequential (torchvision's Conv2dNormActivation), and no observer watches
 * it; else 0. */
static int64_t se_taker_channels(const grove_fwd *f, const grove_module *next) {
  if (next->type == &grove__sequential_type && next->nchildren > 0) {
    if (grove__observes(f, next)) return 0;
    next = next->children[0].module;
    if (!next) return 0;
  }
  if (grove__observes(f, next) || !grove__conv_takes_in_scale(next)) return 0;
  return grove__conv_in_channels(next);
}

/* torch.nn.Sequential.forward: input = module(input) for each child.  A
 * Linear immediately followed by an activation it fuses (linear_fusable_act),
 * and a Conv2d followed by a
 * BatchNorm2d (with running statistics) and/or an activation a convolution
 * fuses (grove__fusable_act: ReLU, ReLU6, Hardswish, Hardsigmoid, SiLU,
 * Sigmoid: MobileNet's and EfficientNet's Conv2dNormActivation), run as one fused
 * pass when no forward hook is registered anywhere and the forward's
 * observer watches none of them (with hooks, the ReLU's hooks must see the
 * Linear's output, so every child runs on its own).  Every child but the
 * last may hand the next a channels-last result; the last may when the
 * Sequential's own caller allows it.  A child that ends in squeeze-
 * excitation's `scale * x` (a graph) and is followed by a 1x1 convolution
 * hands over x and the scale instead, and the convolution applies the
 * scale as it reads its rows (grove_fwd.se): the same products of the same
 * numbers, without a pass over x that writes a scaled copy. */
static grove_status sequential_forward(const grove_module *m, grove_fwd *f, const grove_values *in,
                                       grove_values *out) {
  grove_values cur = *in, next;
  const bool fuse = grove__no_forward_hooks();
  const bool channels_last = f->channels_last_ok;
  for (size_t i = 0; i < m->nchildren; i++) {
    const grove_module *c = m->children[i].module;
    if (!c)
      return grove_err_set(f->err, GROVE_E_NOT_CALLABLE,
                           "Sequential: child '%s' is None and cannot be called",
                           m->children[i].name);
    grove_status s;
    const bool scaled = f->se.in_scale != NULL; /* for c, from the child before */
    const grove_module *after = seq_next(m, i);
    const bool watched = grove__observes(f, c) || (after && grove__observes(f, after));
    const grove_module *bn = fuse && !watched && after && c->type == &grove__conv2d_type &&
                                     grove__conv_bn_fusable(c, after)
                                 ? after
                                 : NULL;
    const grove_module *am = bn ? seq_next(m, i + 1) : after;
    const bool linear = c->type == &grove__linear_type;
    grove__act act = !am || grove__observes(f, am) ? GROVE__ACT_NONE
                     : linear                      ? linear_fusable_act(am)
                                                   : grove__fusable_act(am);
    if (fuse && !watched && linear && act != GROVE__ACT_NONE) {
      s = grove__linear_forward_act(c, f, &cur, &next, act);
      i++;
    } else if (fuse && !watched && c->type == &grove__conv2d_type &&
               (bn || act != GROVE__ACT_NONE)) {
      const size_t last = i + (bn != NULL) + (act != GROVE__ACT_NONE);
      s = grove__conv_bn_act_forward(c, bn, act, f, &cur, &next,
                                     channels_last || last + 1 < m->nchildren);
      i = last;
    } else {
      f->channels_last_ok = channels_last || i + 1 < m->nchildren;
      /* A child ending in squeeze-excitation's `scale * x` before a 1x1
       * convolution: offered to hand x and the scale over (grove_fwd.se). */
      const int64_t cin = fuse && !watched && after && cur.n == 1 && cur.v[0].ndim == 4
                              ? se_taker_channels(f, after)
                              : 0;
      float *dst = cin > 0 && cur.v[0].shape[0] > 0
                       ? grove_arena_alloc(f->arena, (size_t)(cur.v[0].shape[0] * cin) *
                                                         sizeof(float))
                       : NULL;
      if (dst) {
        f->se.for_module = c;
        f->se.dst = dst;
        f->se.cap = cur.v[0].shape[0] * cin;
      }
      s = grove_module_forward(c, f, &cur, &next);
      f->se.for_module = NULL;
      f->se.dst = NULL;
      if (!s && dst && f->se.done) f->se.in_scale = dst; /* for the next child */
      f->se.done = false;
    }
    if (s == GROVE_OK && scaled && f->se.in_scale) {
      /* se_taker_channels promised a convolution that takes it. */
      s = grove_err_set(f->err, GROVE_E_INTERNAL,
                        "Sequential: child '%s' did not take the squeeze-excitation scale",
                        m->children[i].name);
    }
    if (s != GROVE_OK) {
      f->se.in_scale = NULL;
      return s;
    }
    cur = next;
  }
  *out = cur;
  return GROVE_OK;
}

/* After the children's refresh (a load or a reload): a Conv2d followed by
 * a BatchNorm2d that sequential_forward fuses gets the BatchNorm folded
 * into its packed weight (grove__conv_fold_bn). */
static grove_status sequential_refresh(grove_module *m, grove_err *err) {
  for (size_t i = 0; i + 1 < m->nchildren; i++) {
    grove_module *c = m->children[i].module;
    const grove_module *bn = m->children[i + 1].module;
    if (!c || !bn || c->type != &grove__conv2d_type) continue;
    grove_status s = grove__conv_fold_bn(c, bn, err);
    if (s) return s;
  }
  return GROVE_OK;
}

const grove_module_type grove__sequential_type = {
    .name = "Sequential",
    .forward = sequential_forward,
    .refresh = sequential_refresh,
};
const grove_module_type grove__module_list_type = {
    .name = "ModuleList", .forward = NULL, /* not callable, like torch's ModuleList */
};
const grove_module_type grove__module_dict_type = {
    .name = "ModuleDict",
    .forward = NULL,
};

grove_status grove_sequential_new(grove_module **out, grove_err *err) {
  *out = NULL;
  return grove__layer_make(&grove__sequential_type, NULL, out, err);
}
grove_status grove_module_list_new(grove_module **out, grove_err *err) {
  *out = NULL;
  return grove__layer_make(&grove__module_list_type, NULL, out, err);
}
grove_status grove_module_dict_new(grove_module **out, grove_err *err) {
  *out = NULL;
  return grove__layer_make(&grove__module_dict_type, NULL, out, err);
}

grove_status grove__sequential_from_json(const json_t *obj, const char *path, grove_module **out,
                                         grove_err *err) {
  grove_status s = grove__json_check_keys(obj, path, "Sequential", no_args, err);
  return s != GROVE_OK ? s : grove__json_built(path, grove_sequential_new(out, err), err);
}
grove_status grove__module_list_from_json(const json_t *obj, const char *path, grove_module **out,
                                          grove_err *err) {
  grove_status s = grove__json_check_keys(obj, path, "ModuleList", no_args, err);
  return s != GROVE_OK ? s : grove__json_built(path, grove_module_list_new(out, err), err);
}
grove_status grove__module_dict_from_json(const json_t *obj, const char *path, grove_module **out,
                                          grove_err *err) {
  grove_status s = grove__json_check_keys(obj, path, "ModuleDict", no_args, err);
  return s != GROVE_OK ? s : grove__json_built(path, grove_module_dict_new(out, err), err);
}

/* ------------------------------------------------------------ Identity */

/* Like torch, Identity returns its input itself (no copy), whatever it is. */
static grove_status identity_forward(const grove_module *m, grove_fwd *f, const grove_values *in,
                                     grove_values *out) {
  *out = *in;
  return GROVE_OK;
}

const grove_module_type grove__identity_type = {
    .name = "Identity",
    .forward = identity_forward,
};

grove_status grove_identity_new(grove_module **out, grove_err *err) {
  *out = NULL;
  return grove__layer_make(&grove__identity_type, NULL, out, err);
}

grove_status grove__identity_from_json(const json_t *obj, const char *path, grove_module **out,
                                       grove_err *err) {
  grove_status s = grove__json_check_keys(obj, path, "Identity", no_args, err);
  return s != GROVE_OK ? s : grove__json_built(path, grove_identity_new(out, err), err);
}
