/* layers.c: the parameter-free torch.nn layers: the containers (Sequential,
 * ModuleList, ModuleDict), Identity, Flatten, Dropout, the elementwise
 * activations (ReLU, LeakyReLU, GELU, SiLU, Sigmoid, Tanh) and Softmax /
 * LogSoftmax, with their constructors and model.json builders, plus the
 * forward helpers every layer file uses.
 *
 * Forward contract shared by all layers here (see module.h): eval mode, one
 * float32 input (Identity, Flatten and Dropout take any dtype), outputs in the
 * forward's arena, no heap allocation.  A non-contiguous input (a user's
 * strided view) is first copied into the arena, so the loops below always see
 * contiguous memory.  Activations write a new arena tensor and never modify
 * their input in place, even when torch's `inplace=True` was asked for: a
 * caller or a forward hook may still hold the input. */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "layers_internal.h"
#include "observe.h"

/* ------------------------------------------------------------ helpers */

/* Allocates the output of an elementwise layer: same shape as x, float32. */
static grove_status same_shape_out(grove_fwd *f, const grove_tensor *x, grove_values *out) {
  grove_status s = grove_fwd_alloc(f, &out->v[0], GROVE_F32, x->ndim, x->shape);
  if (s != GROVE_OK) return s;
  out->n = 1;
  return GROVE_OK;
}

static const char *const no_args[] = {NULL};

/* ------------------------------------------------------------ containers */

/* The child after child i of Sequential m, or NULL. */
static const grove_module *seq_next(const grove_module *m, size_t i) {
  return i + 1 < m->nchildren ? m->children[i + 1].module : NULL;
}

/* torch.nn.Sequential.forward: input = module(input) for each child.  A
 * Linear immediately followed by a ReLU, and a Conv2d followed by a
 * BatchNorm2d (with running statistics) and/or a ReLU, run as one fused
 * pass when no forward hook is registered anywhere and the forward's
 * observer watches none of them (with hooks, the ReLU's hooks must see the
 * Linear's output, so every child runs on its own).  Every child but the
 * last may hand the next a channels-last result; the last may when the
 * Sequential's own caller allows it. */
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
    const grove_module *after = seq_next(m, i);
    const bool watched = grove__observes(f, c) || (after && grove__observes(f, after));
    const grove_module *bn = fuse && !watched && after && c->type == &grove__conv2d_type &&
                                     grove__conv_bn_fusable(c, after)
                                 ? after
                                 : NULL;
    const grove_module *relu = bn ? seq_next(m, i + 1) : after;
    if (relu && (relu->type != &grove__relu_type || grove__observes(f, relu))) relu = NULL;
    if (fuse && !watched && c->type == &grove__linear_type && relu) {
      s = grove__linear_forward_act(c, f, &cur, &next, GROVE__ACT_RELU);
      i++;
    } else if (fuse && !watched && c->type == &grove__conv2d_type && (bn || relu)) {
      const size_t last = i + (bn != NULL) + (relu != NULL);
      s = grove__conv_bn_relu_forward(c, bn, relu != NULL, f, &cur, &next,
                                      channels_last || last + 1 < m->nchildren);
      i = last;
    } else {
      f->channels_last_ok = channels_last || i + 1 < m->nchildren;
      s = grove_module_forward(c, f, &cur, &next);
    }
    if (s != GROVE_OK) return s;
    cur = next;
  }
  *out = cur;
  return GROVE_OK;
}

const grove_module_type grove__sequential_type = {
    .name = "Sequential",
    .forward = sequential_forward,
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

/* ------------------------------------------------------------ Flatten */

typedef struct flatten_impl {
  int start_dim, end_dim;
} flatten_impl;

/* Wraps a possibly negative dim into [0, ndim) as torch's maybe_wrap_dim
 * does (a 0-d tensor counts as 1-d); false when it is out of range. */
static bool wrap_dim(int dim, int ndim, int *out) {
  int n = ndim == 0 ? 1 : ndim;
  if (dim < -n || dim >= n) return false;
  *out = dim < 0 ? dim + n : dim;
  return true;
}

static grove_status dim_error(grove_fwd *f, const char *layer, const char *what, int dim,
                              int ndim) {
  int n = ndim == 0 ? 1 : ndim;
  return grove_err_set(f->err, GROVE_E_SHAPE,
                       "%s: %s %d is out of range for a %d-d input (expected in [%d, %d])", layer,
                       what, dim, ndim, -n, n - 1);
}

/* torch.flatten: a view of the (contiguous) input with dims start..end
 * merged into one.  No data moves unless the input was strided. */
static grove_status flatten_forward(const grove_module *m, grove_fwd *f, const grove_values *in,
                                    grove_values *out) {
  const flatten_impl *p = m->impl;
  grove_tensor x;
  grove_status s = grove__layer_input("Flatten", f, in, GROVE_DTYPE_COUNT, &x);
  if (s != GROVE_OK) return s;
  int sd, ed;
  if (!wrap_dim(p->start_dim, x.ndim, &sd))
    return dim_error(f, "Flatten", "start_dim", p->start_dim, x.ndim);
  if (!wrap_dim(p->end_dim, x.ndim, &ed))
    return dim_error(f, "Flatten", "end_dim", p->end_dim, x.ndim);
  if (sd > ed)
    return grove_err_set(f->err, GROVE_E_SHAPE,
                         "Flatten: start_dim %d comes after end_dim %d for a %d-d input",
                         p->start_dim, p->end_dim, x.ndim);
  int64_t shape[GROVE_MAX_DIMS];
  int nd = 0;
  if (x.ndim == 0) {
    shape[nd++] = 1;
  } else {
    int64_t merged = 1;
    for (int i = 0; i < x.ndim; i++) {
      if (i < sd || i > ed)
        shape[nd++] = x.shape[i];
      else {
        merged *= x.shape[i];
        if (i == ed) shape[nd++] = merged;
      }
    }
  }
  grove_tensor y;
  grove_tensor_init(&y, x.dtype, nd, shape, x.data);
  out->n = 1;
  out->v[0] = y;
  return GROVE_OK;
}

const grove_module_type grove__flatten_type = {
    .name = "Flatten",
    .forward = flatten_forward,
};

grove_status grove_flatten_new(int start_dim, int end_dim, grove_module **out, grove_err *err) {
  *out = NULL;
  flatten_impl *p = malloc(sizeof *p);
  if (!p) return grove_err_set(err, GROVE_E_NOMEM, "Flatten: out of memory");
  p->start_dim = start_dim;
  p->end_dim = end_dim;
  return grove__layer_make(&grove__flatten_type, p, out, err);
}

grove_status grove__flatten_from_json(const json_t *obj, const char *path, grove_module **out,
                                      grove_err *err) {
  static const char *const keys[] = {"start_dim", "end_dim", NULL};
  int64_t sd, ed;
  grove_status s = grove__json_check_keys(obj, path, "Flatten", keys, err);
  if (!s)
    s = grove__json_int(obj, path, "Flatten", "start_dim", false, 1, -GROVE_MAX_DIMS,
                        GROVE_MAX_DIMS - 1, &sd, err);
  if (!s)
    s = grove__json_int(obj, path, "Flatten", "end_dim", false, -1, -GROVE_MAX_DIMS,
                        GROVE_MAX_DIMS - 1, &ed, err);
  return s != GROVE_OK
             ? s
             : grove__json_built(path, grove_flatten_new((int)sd, (int)ed, out, err), err);
}

/* ------------------------------------------------------------ Dropout */

typedef struct dropout_impl {
  double p;
} dropout_impl;

/* Identity in eval mode.  Training-mode dropout needs a random generator and
 * belongs to the training replica, never to a serving tree. */
static grove_status dropout_forward(const grove_module *m, grove_fwd *f, const grove_values *in,
                                    grove_values *out) {
  if (m->training)
    return grove_err_set(f->err, GROVE_E_UNSUPPORTED,
                         "Dropout: training-mode forward is not available on a serving tree");
  *out = *in;
  return GROVE_OK;
}

const grove_module_type grove__dropout_type = {
    .name = "Dropout",
    .forward = dropout_forward,
};

grove_status grove_dropout_new(double p, grove_module **out, grove_err *err) {
  *out = NULL;
  if (!(p >= 0.0 && p <= 1.0))
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT,
                         "Dropout: dropout probability has to be between 0 and 1, but got %g", p);
  dropout_impl *d = malloc(sizeof *d);
  if (!d) return grove_err_set(err, GROVE_E_NOMEM, "Dropout: out of memory");
  d->p = p;
  return grove__layer_make(&grove__dropout_type, d, out, err);
}

grove_status grove__dropout_from_json(const json_t *obj, const char *path, grove_module **out,
                                      grove_err *err) {
  static const char *const keys[] = {"p", "inplace", NULL};
  double p;
  bool inplace;
  grove_status s = grove__json_check_keys(obj, path, "Dropout", keys, err);
  if (!s) s = grove__json_number(obj, path, "Dropout", "p", 0.5, 0.0, 1.0, &p, err);
  if (!s) s = grove__json_bool(obj, path, "Dropout", "inplace", false, &inplace, err);
  return s != GROVE_OK ? s : grove__json_built(path, grove_dropout_new(p, out, err), err);
}

/* ------------------------------------------------------------ activations */

typedef struct act_impl {
  float negative_slope; /* LeakyReLU */
  bool tanh_approx;     /* GELU: approximate="tanh" */
} act_impl;

/* Sets up one elementwise pass: x is the (contiguous) float32 input, y a new
 * arena tensor of its shape.  A channels-last input is one dense run too:
 * it is read as it is and y gets its layout (grove_module_forward makes y
 * contiguous for a caller that wants it so). */
static grove_status act_begin(const char *layer, grove_fwd *f, const grove_values *in,
                              grove_values *out, const float **x, float **y, int64_t *n) {
  grove_tensor xt;
  grove_status s;
  const bool nhwc = in->n == 1 && in->v[0].dtype == GROVE_F32 && grove__is_nhwc(&in->v[0]);
  if (nhwc)
    xt = in->v[0];
  else if ((s = grove__layer_input(layer, f, in, GROVE_F32, &xt)) != GROVE_OK)
    return s;
  s = same_shape_out(f, &xt, out);
  if (s != GROVE_OK) return s;
  if (nhwc) grove__set_nhwc(&out->v[0]);
  *x = xt.data;
  *y = out->v[0].data;
  *n = grove_tensor_numel(&xt);
  return GROVE_OK;
}

/* ReLU keeps NaN (as torch's clamp_min does): x < 0 is false for NaN. */
static grove_status relu_forward(const grove_module *m, grove_fwd *f, const grove_values *in,
                                 grove_values *out) {
  const float *x;
  float *y;
  int64_t n;
  grove_status s = act_begin("ReLU", f, in, out, &x, &y, &n);
  if (s != GROVE_OK) return s;
  const float *restrict xr = x;
  float *restrict yr = y;
  for (int64_t i = 0; i < n; i++) yr[i] = xr[i] < 0.0f ? 0.0f : xr[i];
  return GROVE_OK;
}

static grove_status leaky_relu_forward(const grove_module *m, grove_fwd *f, const grove_values *in,
                                       grove_values *out) {
  const act_impl *p = m->impl;
  const float *x;
  float *y;
  int64_t n;
  grove_status s = act_begin("LeakyReLU", f, in, out, &x, &y, &n);
  if (s != GROVE_OK) return s;
  const float *restrict xr = x;
  float *restrict yr = y;
  const float slope = p->negative_slope;
  /* Written as pos + neg * slope with two selects against zero: GCC 12
   * vectorises that but not `v > 0 ? v : v * slope`.  NaN stays NaN. */
  for (int64_t i = 0; i < n; i++) {
    const float v = xr[i];
    yr[i] = (v < 0.0f ? 0.0f : v) + (v < 0.0f ? v : 0.0f) * slope;
  }
  return GROVE_OK;
}

/* torch's formulas: exact 0.5 x (1 + erf(x / sqrt 2)); tanh approximation
 * 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))). */
static grove_status gelu_forward(const grove_module *m, grove_fwd *f, const grove_values *in,
                                 grove_values *out) {
  const act_impl *p = m->impl;
  const float *x;
  float *y;
  int64_t n;
  grove_status s = act_begin("GELU", f, in, out, &x, &y, &n);
  if (s != GROVE_OK) return s;
  const float *restrict xr = x;
  float *restrict yr = y;
  if (p->tanh_approx) {
    const float k = 0.7978845608028654f; /* sqrt(2 / pi) */
    for (int64_t i = 0; i < n; i++) {
      float v = xr[i];
      yr[i] = 0.5f * v * (1.0f + tanhf(k * (v + 0.044715f * v * v * v)));
    }
  } else {
    const float r = 0.7071067811865476f; /* 1 / sqrt(2) */
    for (int64_t i = 0; i < n; i++) {
      float v = xr[i];
      yr[i] = 0.5f * v * (1.0f + erff(v * r));
    }
  }
  return GROVE_OK;
}

static grove_status silu_forward(const grove_module *m, grove_fwd *f, const grove_values *in,
                                 grove_values *out) {
  const float *x;
  float *y;
  int64_t n;
  grove_status s = act_begin("SiLU", f, in, out, &x, &y, &n);
  if (s != GROVE_OK) return s;
  const float *restrict xr = x;
  float *restrict yr = y;
  for (int64_t i = 0; i < n; i++) yr[i] = xr[i] / (1.0f + expf(-xr[i]));
  return GROVE_OK;
}

static grove_status sigmoid_forward(const grove_module *m, grove_fwd *f, const grove_values *in,
                                    grove_values *out) {
  const float *x;
  float *y;
  int64_t n;
  grove_status s = act_begin("Sigmoid", f, in, out, &x, &y, &n);
  if (s != GROVE_OK) return s;
  const float *restrict xr = x;
  float *restrict yr = y;
  for (int64_t i = 0; i < n; i++) yr[i] = 1.0f / (1.0f + expf(-xr[i]));
  return GROVE_OK;
}

static grove_status tanh_forward(const grove_module *m, grove_fwd *f, const grove_values *in,
                                 grove_values *out) {
  const float *x;
  float *y;
  int64_t n;
  grove_status s = act_begin("Tanh", f, in, out, &x, &y, &n);
  if (s != GROVE_OK) return s;
  const float *restrict xr = x;
  float *restrict yr = y;
  for (int64_t i = 0; i < n; i++) yr[i] = tanhf(xr[i]);
  return GROVE_OK;
}

const grove_module_type grove__relu_type = {.name = "ReLU", .forward = relu_forward};
const grove_module_type grove__leaky_relu_type = {.name = "LeakyReLU",
                                                  .forward = leaky_relu_forward};
const grove_module_type grove__gelu_type = {.name = "GELU", .forward = gelu_forward};
const grove_module_type grove__silu_type = {.name = "SiLU", .forward = silu_forward};
const grove_module_type grove__sigmoid_type = {.name = "Sigmoid", .forward = sigmoid_forward};
const grove_module_type grove__tanh_type = {.name = "Tanh", .forward = tanh_forward};

static grove_status act_new(const grove_module_type *type, float slope, bool tanh_approx,
                            grove_module **out, grove_err *err) {
  *out = NULL;
  act_impl *p = malloc(sizeof *p);
  if (!p) return grove_err_set(err, GROVE_E_NOMEM, "%s: out of memory", type->name);
  p->negative_slope = slope;
  p->tanh_approx = tanh_approx;
  return grove__layer_make(type, p, out, err);
}

grove_status grove_relu_new(grove_module **out, grove_err *err) {
  return act_new(&grove__relu_type, 0, false, out, err);
}
grove_status grove_leaky_relu_new(double negative_slope, grove_module **out, grove_err *err) {
  if (!isfinite(negative_slope)) {
    *out = NULL;
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT,
                         "LeakyReLU: negative_slope must be finite, got %g", negative_slope);
  }
  return act_new(&grove__leaky_relu_type, (float)negative_slope, false, out, err);
}
grove_status grove_gelu_new(const char *approximate, grove_module **out, grove_err *err) {
  bool tanh_approx = false;
  if (approximate && strcmp(approximate, "tanh") == 0) {
    tanh_approx = true;
  } else if (approximate && strcmp(approximate, "none") != 0) {
    *out = NULL;
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT,
                         "GELU: approximate must be \"none\" or \"tanh\", got \"%s\"", approximate);
  }
  return act_new(&grove__gelu_type, 0, tanh_approx, out, err);
}
grove_status grove_silu_new(grove_module **out, grove_err *err) {
  return act_new(&grove__silu_type, 0, false, out, err);
}
grove_status grove_sigmoid_new(grove_module **out, grove_err *err) {
  return act_new(&grove__sigmoid_type, 0, false, out, err);
}
grove_status grove_tanh_new(grove_module **out, grove_err *err) {
  return act_new(&grove__tanh_type, 0, false, out, err);
}

/* `inplace` is accepted for torch's sake and ignored: see the file comment. */
static const char *const inplace_args[] = {"inplace", NULL};

grove_status grove__relu_from_json(const json_t *obj, const char *path, grove_module **out,
                                   grove_err *err) {
  bool inplace;
  grove_status s = grove__json_check_keys(obj, path, "ReLU", inplace_args, err);
  if (!s) s = grove__json_bool(obj, path, "ReLU", "inplace", false, &inplace, err);
  return s != GROVE_OK ? s : grove__json_built(path, grove_relu_new(out, err), err);
}
grove_status grove__leaky_relu_from_json(const json_t *obj, const char *path, grove_module **out,
                                         grove_err *err) {
  static const char *const keys[] = {"negative_slope", "inplace", NULL};
  double slope;
  bool inplace;
  grove_status s = grove__json_check_keys(obj, path, "LeakyReLU", keys, err);
  if (!s)
    s = grove__json_number(obj, path, "LeakyReLU", "negative_slope", 0.01, -INFINITY, INFINITY,
                           &slope, err);
  if (!s) s = grove__json_bool(obj, path, "LeakyReLU", "inplace", false, &inplace, err);
  return s != GROVE_OK ? s : grove__json_built(path, grove_leaky_relu_new(slope, out, err), err);
}
grove_status grove__gelu_from_json(const json_t *obj, const char *path, grove_module **out,
                                   grove_err *err) {
  static const char *const keys[] = {"approximate", NULL};
  static const char *const choices[] = {"none", "tanh", NULL};
  int which;
  grove_status s = grove__json_check_keys(obj, path, "GELU", keys, err);
  if (!s) s = grove__json_choice(obj, path, "GELU", "approximate", 0, choices, &which, err);
  return s != GROVE_OK ? s : grove__json_built(path, grove_gelu_new(choices[which], out, err), err);
}
grove_status grove__silu_from_json(const json_t *obj, const char *path, grove_module **out,
                                   grove_err *err) {
  bool inplace;
  grove_status s = grove__json_check_keys(obj, path, "SiLU", inplace_args, err);
  if (!s) s = grove__json_bool(obj, path, "SiLU", "inplace", false, &inplace, err);
  return s != GROVE_OK ? s : grove__json_built(path, grove_silu_new(out, err), err);
}
grove_status grove__sigmoid_from_json(const json_t *obj, const char *path, grove_module **out,
                                      grove_err *err) {
  grove_status s = grove__json_check_keys(obj, path, "Sigmoid", no_args, err);
  return s != GROVE_OK ? s : grove__json_built(path, grove_sigmoid_new(out, err), err);
}
grove_status grove__tanh_from_json(const json_t *obj, const char *path, grove_module **out,
                                   grove_err *err) {
  grove_status s = grove__json_check_keys(obj, path, "Tanh", no_args, err);
  return s != GROVE_OK ? s : grove__json_built(path, grove_tanh_new(out, err), err);
}

/* ------------------------------------------------------------ Softmax */

typedef struct softmax_impl {
  bool has_dim; /* false: torch's dim=None */
  int dim;
} softmax_impl;

/* Rows along the last dim (inner == 1), the common case.  Numerically
 * stable: exp(x - max); the sum is kept in double. */
static void softmax_rows(const float *restrict x, float *restrict y, int64_t outer, int64_t n,
                         bool as_log) {
  for (int64_t o = 0; o < outer; o++) {
    const float *xr = x + o * n;
    float *yr = y + o * n;
    float mx = -INFINITY;
    for (int64_t j = 0; j < n; j++)
      if (xr[j] > mx) mx = xr[j];
    double sum = 0;
    if (as_log) {
      for (int64_t j = 0; j < n; j++) sum += expf(xr[j] - mx);
      /* (x - max) - log(sum), as torch: folding max and log(sum) into one
       * float first would round away digits of large logits. */
      const float lse = (float)log(sum);
      for (int64_t j = 0; j < n; j++) yr[j] = (xr[j] - mx) - lse;
    } else {
      for (int64_t j = 0; j < n; j++) {
        yr[j] = expf(xr[j] - mx);
        sum += yr[j];
      }
      const float inv = (float)(1.0 / sum);
      for (int64_t j = 0; j < n; j++) yr[j] *= inv;
    }
  }
}

/* A dim that is not the last: each of the `inner` lanes is its own softmax
 * over n elements spaced inner apart.  The loops run along the lanes, which
 * are contiguous, so they vectorise.  mx and sum are arena scratch of inner
 * elements. */
static void softmax_lanes(const float *restrict x, float *restrict y, int64_t outer, int64_t n,
                          int64_t inner, float *restrict mx, double *restrict sum, bool as_log) {
  for (int64_t o = 0; o < outer; o++) {
    const float *xb = x + o * n * inner;
    float *yb = y + o * n * inner;
    for (int64_t k = 0; k < inner; k++) {
      mx[k] = -INFINITY;
      sum[k] = 0;
    }
    for (int64_t j = 0; j < n; j++) {
      const float *xr = xb + j * inner;
      for (int64_t k = 0; k < inner; k++) mx[k] = xr[k] > mx[k] ? xr[k] : mx[k];
    }
    for (int64_t j = 0; j < n; j++) {
      const float *xr = xb + j * inner;
      float *yr = yb + j * inner;
      for (int64_t k = 0; k < inner; k++) {
        float e = expf(xr[k] - mx[k]);
        if (!as_log) yr[k] = e;
        sum[k] += e;
      }
    }
    if (as_log) {
      for (int64_t k = 0; k < inner; k++) sum[k] = log(sum[k]);
      for (int64_t j = 0; j < n; j++) {
        const float *xr = xb + j * inner;
        float *yr = yb + j * inner;
        for (int64_t k = 0; k < inner; k++) yr[k] = (xr[k] - mx[k]) - (float)sum[k];
      }
    } else {
      for (int64_t k = 0; k < inner; k++) mx[k] = (float)(1.0 / sum[k]);
      for (int64_t j = 0; j < n; j++) {
        float *yr = yb + j * inner;
        for (int64_t k = 0; k < inner; k++) yr[k] *= mx[k];
      }
    }
  }
}

static grove_status softmax_common(const grove_module *m, grove_fwd *f, const grove_values *in,
                                   grove_values *out, bool as_log) {
  const softmax_impl *p = m->impl;
  const char *layer = m->type->name;
  grove_tensor x;
  grove_status s = grove__layer_input(layer, f, in, GROVE_F32, &x);
  if (s != GROVE_OK) return s;
  /* torch's _get_softmax_dim for dim=None. */
  int dim = p->has_dim ? p->dim : (x.ndim == 0 || x.ndim == 1 || x.ndim == 3) ? 0 : 1;
  int d;
  if (!wrap_dim(dim, x.ndim, &d)) return dim_error(f, layer, "dim", dim, x.ndim);
  s = same_shape_out(f, &x, out);
  if (s != GROVE_OK) return s;
  int64_t outer = 1, n = 1, inner = 1;
  for (int i = 0; i < x.ndim; i++) {
    if (i < d)
      outer *= x.shape[i];
    else if (i == d)
      n = x.shape[i];
    else
      inner *= x.shape[i];
  }
  if (outer == 0 || n == 0 || inner == 0) return GROVE_OK;
  if (inner == 1) {
    softmax_rows(x.data, out->v[0].data, outer, n, as_log);
    return GROVE_OK;
  }
  float *mx = grove_arena_alloc(f->arena, (size_t)inner * sizeof(float));
  double *sum = grove_arena_alloc(f->arena, (size_t)inner * sizeof(double));
  if (!mx || !sum)
    return grove_err_set(f->err, GROVE_E_NOMEM, "%s: scratch arena is exhausted", layer);
  softmax_lanes(x.data, out->v[0].data, outer, n, inner, mx, sum, as_log);
  return GROVE_OK;
}

static grove_status softmax_forward(const grove_module *m, grove_fwd *f, const grove_values *in,
                                    grove_values *out) {
  return softmax_common(m, f, in, out, false);
}
static grove_status log_softmax_forward(const grove_module *m, grove_fwd *f, const grove_values *in,
                                        grove_values *out) {
  return softmax_common(m, f, in, out, true);
}

const grove_module_type grove__softmax_type = {.name = "Softmax", .forward = softmax_forward};
const grove_module_type grove__log_softmax_type = {.name = "LogSoftmax",
                                                   .forward = log_softmax_forward};

static grove_status softmax_new(const grove_module_type *type, bool has_dim, int dim,
                                grove_module **out, grove_err *err) {
  *out = NULL;
  softmax_impl *p = malloc(sizeof *p);
  if (!p) return grove_err_set(err, GROVE_E_NOMEM, "%s: out of memory", type->name);
  p->has_dim = has_dim;
  p->dim = has_dim ? dim : 0;
  return grove__layer_make(type, p, out, err);
}

grove_status grove_softmax_new(bool has_dim, int dim, grove_module **out, grove_err *err) {
  return softmax_new(&grove__softmax_type, has_dim, dim, out, err);
}
grove_status grove_log_softmax_new(bool has_dim, int dim, grove_module **out, grove_err *err) {
  return softmax_new(&grove__log_softmax_type, has_dim, dim, out, err);
}

static grove_status softmax_from_json(const json_t *obj, const char *path, const char *type,
                                      bool as_log, grove_module **out, grove_err *err) {
  static const char *const keys[] = {"dim", NULL};
  int64_t dim;
  bool is_null;
  grove_status s = grove__json_check_keys(obj, path, type, keys, err);
  if (!s)
    s = grove__json_int_or_null(obj, path, type, "dim", true, 0, -GROVE_MAX_DIMS,
                                GROVE_MAX_DIMS - 1, &dim, &is_null, err);
  if (s != GROVE_OK) return s;
  if (is_null)
    grove__log(GROVE_LOG_WARN, "spec.softmax_implicit_dim",
               "%s: %s with dim=None uses torch's deprecated implicit dim (0 for 0-, 1- and 3-d "
               "input, else 1); export the model with an explicit dim",
               path, type);
  return grove__json_built(path,
                           as_log ? grove_log_softmax_new(!is_null, (int)dim, out, err)
                                  : grove_softmax_new(!is_null, (int)dim, out, err),
                           err);
}

grove_status grove__softmax_from_json(const json_t *obj, const char *path, grove_module **out,
                                      grove_err *err) {
  return softmax_from_json(obj, path, "Softmax", false, out, err);
}
grove_status grove__log_softmax_from_json(const json_t *obj, const char *path, grove_module **out,
                                          grove_err *err) {
  return softmax_from_json(obj, path, "LogSoftmax", true, out, err);
}
