/* ops_resample.c: the op entries (ops.h) of F.interpolate, F.pad (constant
 * mode), F.pixel_shuffle / nn.PixelShuffle, and of the normalisations by
 * function: F.layer_norm, F.group_norm, F.instance_norm (eval),
 * F.local_response_norm / nn.LocalResponseNorm.  Kernels: resample.c,
 * norm_group.c and layers_norm.c's rows (tensor_ops.h). */
#include <math.h>
#include <string.h>

#include "layers_internal.h"
#include "ops.h"
#include "tensor_ops.h"

#define INPUT \
  { .name = "input", .kind = P_TENSOR, .dk = D_REQ }
#define F32 (1u << GROVE_F32)
#define TENSOR_OR_NONE(n) \
  { .name = n, .kind = P_TENSOR, .dk = D_NONE, .dtypes = F32 }

static grove_status done(gval *res, const grove_tensor *y) {
  grove__op_set_tensor(res, y);
  return GROVE_OK;
}

/* Argument k as a tensor, or NULL for None. */
static grove_status opt_tensor(const grove__opctx *c, int k, const grove_tensor **t) {
  *t = NULL;
  if (c->args[k].kind == A_NONE) return GROVE_OK;
  return grove__op_tensor(c, k, t);
}

/* ------------------------------------------------------------ interpolate */

static const char *const interp_modes[] = {"nearest",  "nearest-exact", "linear",
                                           "bilinear", "bicubic",       NULL};

static grove_status interpolate_fwd(const grove__opctx *c, gval *res) {
  const grove_tensor *x;
  grove_status s = grove__op_tensor(c, 0, &x);
  if (s) return s;
  const int nsp = x->ndim - 2;
  if (nsp < 1 || nsp > 2) {
    char b[128];
    return grove_err_set(c->f->err, GROVE_E_SHAPE,
                         "interpolate: expected a 3-d or 4-d input (1 or 2 spatial dims), got %s",
                         grove_shape_str(x->ndim, x->shape, b, sizeof b));
  }
  const char *mode = c->args[3].s;
  int m = strcmp(mode, "nearest") == 0         ? GROVE__INTERP_NEAREST
          : strcmp(mode, "nearest-exact") == 0 ? GROVE__INTERP_NEAREST_EXACT
          : strcmp(mode, "bicubic") == 0       ? GROVE__INTERP_CUBIC
                                               : GROVE__INTERP_LINEAR;
  int64_t size[2];
  double scale[2] = {0, 0};
  if (c->args[1].kind != A_NONE) {
    int64_t v[GROVE_MAX_DIMS];
    int n;
    if ((s = grove__op_ints(c, &c->args[1], true, v, &n))) return s;
    if (n != 1 && n != nsp)
      return grove_err_set(c->f->err, GROVE_E_SHAPE,
                           "interpolate: size has %d numbers for %d spatial dims", n, nsp);
    for (int d = 0; d < nsp; d++) size[d] = v[n == 1 ? 0 : d];
  } else {
    /* One scale_factor for every spatial dim, or one per dim (nn.Upsample
     * keeps a tuple as given). */
    const garg *sf = &c->args[2];
    const int nf = sf->kind == A_LIST ? sf->n : 1;
    if (nf != 1 && nf != nsp)
      return grove_err_set(c->f->err, GROVE_E_SHAPE,
                           "interpolate: scale_factor has %d numbers for %d spatial dims", nf, nsp);
    /* torch: the output size is floor(in * scale_factor); the source
     * coordinates step by 1 / scale_factor unless recompute_scale_factor. */
    const bool recompute = c->args[5].kind == A_BOOL && c->args[5].i;
    for (int d = 0; d < nsp; d++) {
      double f;
      int64_t i;
      bool is_int;
      const garg *fa = sf->kind == A_LIST ? &sf->items[nf == 1 ? 0 : d] : sf;
      if (!grove__op_number(c, fa, &f, &i, &is_int) || !(f > 0) ||
          !((double)x->shape[2 + d] * f < (double)INT32_MAX))
        return grove_err_set(c->f->err, GROVE_E_INVALID_ARGUMENT,
                             "interpolate: expected a size or a positive scale_factor whose "
                             "output size fits");
      size[d] = (int64_t)floor((double)x->shape[2 + d] * f);
      scale[d] = recompute ? 0 : f;
    }
  }
  const bool align = c->args[4].kind == A_BOOL && c->args[4].i;
  grove_tensor y;
  if ((s = grove__op_interpolate(c->f, x, size, scale, nsp, m, align, &y))) return s;
  return done(res, &y);
}

static grove_status interpolate_check(const grove__opdef *d, const garg *a, const char *jp,
                                      grove_err *err) {
  if (a[3].kind != A_STR)
    return grove__op_want_const(d, jp, 3, "a mode string", err);
  bool known = false;
  for (int i = 0; interp_modes[i]; i++) known |= strcmp(a[3].s, interp_modes[i]) == 0;
  if (!known)
    return grove_err_set(err, GROVE_E_UNSUPPORTED,
                         "%s: interpolate mode \"%s\" is not supported (Grove runs nearest, "
                         "nearest-exact, linear, bilinear, bicubic)",
                         jp, a[3].s);
  const bool linear = strncmp(a[3].s, "nearest", 7) != 0;
  if (!linear && a[4].kind == A_BOOL)
    return grove_err_set(err, GROVE_E_SPEC,
                         "%s: align_corners option can only be set with the interpolating "
                         "modes: linear | bilinear | bicubic | trilinear",
                         jp);
  if (a[1].kind == A_NONE && a[2].kind == A_NONE)
    return grove_err_set(err, GROVE_E_SPEC, "%s: either size or scale_factor should be defined",
                         jp);
  if (a[1].kind != A_NONE && a[2].kind != A_NONE)
    return grove_err_set(err, GROVE_E_SPEC,
                         "%s: only one of size or scale_factor should be defined", jp);
  if (a[6].kind == A_BOOL && a[6].i)
    return grove_err_set(err, GROVE_E_UNSUPPORTED, "%s: antialias=True is not supported", jp);
  return GROVE_OK;
}

/* ------------------------------------------------------------ pad */

/* F.pad's modes, in GROVE__PAD_* order (tensor_ops.h). */
static const char *const pad_modes[] = {"constant", "reflect", "replicate", "circular", NULL};

static int pad_mode(const garg *a) {
  for (int m = 0; a->kind == A_STR && pad_modes[m]; m++)
    if (strcmp(a->s, pad_modes[m]) == 0) return m;
  return -1;
}

static grove_status pad_fwd(const grove__opctx *c, gval *res) {
  const grove_tensor *x;
  int64_t pad[GROVE_MAX_DIMS * 2];
  int n;
  grove_status s;
  if ((s = grove__op_tensor(c, 0, &x)) || (s = grove__op_ints(c, &c->args[1], false, pad, &n)))
    return s;
  double v = 0;
  int64_t i;
  bool is_int;
  if (c->args[3].kind != A_NONE && !grove__op_number(c, &c->args[3], &v, &i, &is_int))
    return grove__op_want(c, "a number to pad with");
  const int mode = pad_mode(&c->args[2]); /* pad_check's */
  grove_tensor y;
  if (mode != GROVE__PAD_CONSTANT && v != 0)
    return grove_err_set(c->f->err, GROVE_E_INVALID_ARGUMENT,
                         "pad: mode \"%s\" takes no value to pad with (got %g)", pad_modes[mode],
                         v);
  if (mode == GROVE__PAD_CONSTANT)
    s = grove__op_pad(c->f, x, pad, n, v, &y);
  else
    s = grove__op_pad_edge(c->f, x, pad, n, mode, &y);
  return s ? s : done(res, &y);
}

static grove_status pad_check(const grove__opdef *d, const garg *a, const char *jp,
                              grove_err *err) {
  if (pad_mode(&a[2]) < 0)
    return grove_err_set(err, GROVE_E_UNSUPPORTED,
                         "%s: pad mode \"%s\" is not one of torch's: constant, reflect, "
                         "replicate, circular",
                         jp, a[2].kind == A_STR ? a[2].s : "?");
  return GROVE_OK;
}

/* ------------------------------------------------------------ pixel_shuffle */

extern const grove__opdef grove__opdef_pixel_unshuffle;

/* pixel_shuffle and pixel_unshuffle: one implementation, each way. */
static grove_status pixel_shuffle_fwd(const grove__opctx *c, gval *res) {
  const grove_tensor *x;
  int64_t r;
  grove_tensor y;
  grove_status s;
  if ((s = grove__op_tensor(c, 0, &x)) || (s = grove__op_int(c, &c->args[1], &r)) ||
      (s = grove__op_pixel_shuffle(c->f, x, r, c->def == &grove__opdef_pixel_unshuffle, &y)))
    return s;
  return done(res, &y);
}

/* ------------------------------------------------------------ norms */

static grove_status layer_norm_fwd(const grove__opctx *c, gval *res) {
  const grove_tensor *xa, *w, *b;
  int64_t shape[GROVE_MAX_DIMS];
  int n;
  grove_status s;
  if ((s = grove__op_tensor(c, 0, &xa)) || (s = grove__op_ints(c, &c->args[1], true, shape, &n)) ||
      (s = opt_tensor(c, 2, &w)) || (s = opt_tensor(c, 3, &b)))
    return s;
  double eps;
  int64_t ie;
  bool is_int;
  if (!grove__op_number(c, &c->args[4], &eps, &ie, &is_int)) return grove__op_want(c, "an eps");
  grove_tensor x, y, wc, bc;
  if ((s = grove__fwd_contig(c->f, xa, &x))) return s;
  bool ok = x.ndim >= n;
  int64_t D = 1;
  for (int d = 0; ok && d < n; d++) {
    ok = x.shape[x.ndim - n + d] == shape[d];
    D *= shape[d];
  }
  if (!ok) {
    char got[128], want[128];
    return grove_err_set(c->f->err, GROVE_E_SHAPE,
                         "layer_norm: given normalized_shape=%s, expected input with shape [*, %s, "
                         "but got input of size %s",
                         grove_shape_str(n, shape, want, sizeof want), want + 1,
                         grove_shape_str(x.ndim, x.shape, got, sizeof got));
  }
  for (int k = 0; k < 2; k++) {
    const grove_tensor *t = k ? b : w;
    if (t && grove_tensor_numel(t) != D)
      return grove_err_set(c->f->err, GROVE_E_SHAPE,
                           "layer_norm: %s has %lld elements, normalized_shape %lld",
                           k ? "bias" : "weight", (long long)grove_tensor_numel(t), (long long)D);
  }
  if ((w && (s = grove__fwd_contig(c->f, w, &wc))) || (b && (s = grove__fwd_contig(c->f, b, &bc))) ||
      (s = grove_fwd_alloc(c->f, &y, GROVE_F32, x.ndim, x.shape)))
    return s;
  grove__layer_norm_rows(x.data, y.data, D ? grove_tensor_numel(&x) / D : 0, D,
                         w ? wc.data : NULL, b ? bc.data : NULL, eps);
  return done(res, &y);
}

static grove_status group_norm_fwd(const grove__opctx *c, gval *res) {
  const grove_tensor *x, *w, *b;
  int64_t g;
  double eps;
  int64_t ie;
  bool is_int;
  grove_tensor y;
  grove_status s;
  if ((s = grove__op_tensor(c, 0, &x)) || (s = grove__op_int(c, &c->args[1], &g)) ||
      (s = opt_tensor(c, 2, &w)) || (s = opt_tensor(c, 3, &b)))
    return s;
  if (!grove__op_number(c, &c->args[4], &eps, &ie, &is_int)) return grove__op_want(c, "an eps");
  if ((s = grove__op_group_norm(c->f, x, g, w, b, eps, &y))) return s;
  return done(res, &y);
}

static grove_status instance_norm_fwd(const grove__opctx *c, gval *res) {
  const grove_tensor *x, *rm, *rv, *w, *b;
  double eps;
  int64_t ie;
  bool is_int;
  grove_tensor y;
  grove_status s;
  if ((s = grove__op_tensor(c, 0, &x)) || (s = opt_tensor(c, 1, &rm)) ||
      (s = opt_tensor(c, 2, &rv)) || (s = opt_tensor(c, 3, &w)) || (s = opt_tensor(c, 4, &b)))
    return s;
  if (!grove__op_number(c, &c->args[7], &eps, &ie, &is_int)) return grove__op_want(c, "an eps");
  const bool use_input = c->args[5].i != 0;
  if ((s = grove__op_instance_norm(c->f, x, rm, rv, w, b, use_input, eps, &y))) return s;
  return done(res, &y);
}

static grove_status lrn_fwd(const grove__opctx *c, gval *res) {
  const grove_tensor *x;
  int64_t size;
  grove_tensor y;
  grove_status s;
  if ((s = grove__op_tensor(c, 0, &x)) || (s = grove__op_int(c, &c->args[1], &size))) return s;
  if ((s = grove__op_local_response_norm(c->f, x, size, c->args[2].f, c->args[3].f, c->args[4].f,
                                         &y))) {
    grove_err_prefix(c->f->err, "%s", grove__op_label(c));
    return s;
  }
  return done(res, &y);
}

/* ------------------------------------------------------------ the entries */

GROVE__OP_MODULE_TYPE(grove__upsample_type, "Upsample");
GROVE__OP_MODULE_TYPE(grove__constant_pad1d_type, "ConstantPad1d");
GROVE__OP_MODULE_TYPE(grove__constant_pad2d_type, "ConstantPad2d");
GROVE__OP_MODULE_TYPE(grove__constant_pad3d_type, "ConstantPad3d");
GROVE__OP_MODULE_TYPE(grove__zero_pad2d_type, "ZeroPad2d");
GROVE__OP_MODULE_TYPE(grove__reflection_pad1d_type, "ReflectionPad1d");
GROVE__OP_MODULE_TYPE(grove__reflection_pad2d_type, "ReflectionPad2d");
GROVE__OP_MODULE_TYPE(grove__reflection_pad3d_type, "ReflectionPad3d");
GROVE__OP_MODULE_TYPE(grove__replication_pad1d_type, "ReplicationPad1d");
GROVE__OP_MODULE_TYPE(grove__replication_pad2d_type, "ReplicationPad2d");
GROVE__OP_MODULE_TYPE(grove__replication_pad3d_type, "ReplicationPad3d");
GROVE__OP_MODULE_TYPE(grove__pixel_shuffle_type, "PixelShuffle");
GROVE__OP_MODULE_TYPE(grove__pixel_unshuffle_type, "PixelUnshuffle");
GROVE__OP_MODULE_TYPE(grove__local_response_norm_type, "LocalResponseNorm");

/* nn.Upsample: F.interpolate's module, its arguments as torch keeps them
 * (size and scale_factor a number or a tuple per dim). */
static const grove__opmod upsample_module = {
    .cls = "Upsample",
    .type = &grove__upsample_type,
    .args =
        {{.name = "size", .kind = P_INTS, .dk = D_NONE, .min = 1, .max = 1 << 30},
         {.name = "scale_factor", .kind = P_NUMBER, .dk = D_NONE, .min = 0x1p-20, .max = 1 << 20},
         {.name = "mode", .kind = P_STR, .dk = D_STR, .ds = "nearest", .choices = interp_modes},
         {.name = "align_corners", .kind = P_BOOL, .dk = D_NONE},
         {.name = "recompute_scale_factor", .kind = P_BOOL, .dk = D_NONE}},
    .check_args = true,
};

/* The constant pads, all F.pad(input, padding, "constant", value): torch
 * stores padding as the full tuple (2, 4 or 6 numbers), which is F.pad's. */
#define PADDING                                                                      \
  {                                                                                  \
    .name = "pad", .key = "padding", .kind = P_INTS, .dk = D_REQ, .min = -(1 << 30), \
    .max = 1 << 30, .list_only = true                                                \
  }
#define PAD_VALUE \
  { .name = "value", .kind = P_FLOAT, .dk = D_REQ, .min = -INFINITY, .max = INFINITY }
/* ReflectionPad*d and ReplicationPad*d: F.pad in their mode, which the
 * class fixes (torch keeps no attribute for it, so the exporter writes
 * none and the only choice is the default). */
static const char *const reflect_only[] = {"reflect", NULL};
static const char *const replicate_only[] = {"replicate", NULL};
#define FIXED_MODE(m, ch) \
  { .name = "mode", .kind = P_STR, .dk = D_STR, .ds = m, .choices = ch }
#define EDGE_PAD(var, C, m, ch, nxt)                                              \
  static const grove__opmod var##_module = {.cls = #C,                            \
                                            .type = &grove__##var##_type,         \
                                            .args = {PADDING, FIXED_MODE(m, ch)}, \
                                            .check_args = true,                   \
                                            .next = nxt}
EDGE_PAD(replication_pad3d, ReplicationPad3d, "replicate", replicate_only, NULL);
EDGE_PAD(replication_pad2d, ReplicationPad2d, "replicate", replicate_only,
         &replication_pad3d_module);
EDGE_PAD(replication_pad1d, ReplicationPad1d, "replicate", replicate_only,
         &replication_pad2d_module);
EDGE_PAD(reflection_pad3d, ReflectionPad3d, "reflect", reflect_only, &replication_pad1d_module);
EDGE_PAD(reflection_pad2d, ReflectionPad2d, "reflect", reflect_only, &reflection_pad3d_module);
EDGE_PAD(reflection_pad1d, ReflectionPad1d, "reflect", reflect_only, &reflection_pad2d_module);
static const grove__opmod zero_pad2d_module = {.cls = "ZeroPad2d",
                                               .type = &grove__zero_pad2d_type,
                                               .args = {PADDING},
                                               .check_args = true,
                                               .next = &reflection_pad1d_module};
static const grove__opmod constant_pad3d_module = {.cls = "ConstantPad3d",
                                                   .type = &grove__constant_pad3d_type,
                                                   .args = {PADDING, PAD_VALUE},
                                                   .check_args = true,
                                                   .next = &zero_pad2d_module};
static const grove__opmod constant_pad2d_module = {.cls = "ConstantPad2d",
                                                   .type = &grove__constant_pad2d_type,
                                                   .args = {PADDING, PAD_VALUE},
                                                   .check_args = true,
                                                   .next = &constant_pad3d_module};
static const grove__opmod constant_pad1d_module = {.cls = "ConstantPad1d",
                                                   .type = &grove__constant_pad1d_type,
                                                   .args = {PADDING, PAD_VALUE},
                                                   .check_args = true,
                                                   .next = &constant_pad2d_module};

#define FNUM(n, v) \
  { .name = n, .kind = P_FLOAT, .dk = D_FLOAT, .dv = v, .min = -INFINITY, .max = INFINITY }
#define POS_INT(n) \
  { .name = n, .kind = P_INT, .dk = D_REQ, .min = 1, .max = 1 << 20 }

const grove__opdef grove__opdef_interpolate = {
    .name = "interpolate",
    .id = G_OP,
    .torch = (const char *const[]){"torch.nn.functional.interpolate(input,size,scale_factor,mode,"
                                   "align_corners,recompute_scale_factor,antialias)",
                                   NULL},
    .varargs = -1,
    .p = {INPUT, OP_NONE("size", P_INTS), OP_NONE("scale_factor", P_NUMBER),
          OP_STR("mode", "nearest"), OP_NONE("align_corners", P_BOOL),
          OP_NONE("recompute_scale_factor", P_BOOL), OP_BOOL("antialias", 0)},
    .check = interpolate_check,
    .forward = interpolate_fwd,
    .module = &upsample_module,
};

const grove__opdef grove__opdef_pad = {
    .name = "pad",
    .id = G_OP,
    .torch = (const char *const[]){"torch.nn.functional.pad(input,pad,mode,value)", NULL},
    .varargs = -1,
    .p = {INPUT, OP_REQ("pad", P_INTS), OP_STR("mode", "constant"), OP_NONE("value", P_NUMBER)},
    .check = pad_check,
    .forward = pad_fwd,
    .module = &constant_pad1d_module,
};

const grove__opdef grove__opdef_pixel_shuffle = {
    .name = "pixel_shuffle",
    .id = G_OP,
    .torch = (const char *const[]){"torch.nn.functional.pixel_shuffle(input,upscale_factor)",
                                   "torch.pixel_shuffle(input,upscale_factor)", NULL},
    .varargs = -1,
    .p = {INPUT, POS_INT("upscale_factor")},
    .forward = pixel_shuffle_fwd,
    .module = &(const grove__opmod){.cls = "PixelShuffle",
                                    .type = &grove__pixel_shuffle_type,
                                    .args = {POS_INT("upscale_factor")}},
};

const grove__opdef grove__opdef_pixel_unshuffle = {
    .name = "pixel_unshuffle",
    .id = G_OP,
    .torch = (const char *const[]){"torch.nn.functional.pixel_unshuffle(input,downscale_factor)",
                                   "torch.pixel_unshuffle(input,downscale_factor)", NULL},
    .varargs = -1,
    .p = {INPUT, POS_INT("downscale_factor")},
    .forward = pixel_shuffle_fwd,
    .module = &(const grove__opmod){.cls = "PixelUnshuffle",
                                    .type = &grove__pixel_unshuffle_type,
                                    .args = {POS_INT("downscale_factor")}},
};

const grove__opdef grove__opdef_layer_norm = {
    .name = "layer_norm",
    .id = G_OP,
    .torch = (const char *const[]){"torch.nn.functional.layer_norm(input,normalized_shape,weight,"
                                   "bias,eps)",
                                   NULL},
    .varargs = -1,
    .p = {INPUT, OP_REQ("normalized_shape", P_INTS), TENSOR_OR_NONE("weight"),
          TENSOR_OR_NONE("bias"), FNUM("eps", 1e-5)},
    .forward = layer_norm_fwd,
};

const grove__opdef grove__opdef_group_norm = {
    .name = "group_norm",
    .id = G_OP,
    .torch = (const char *const[]){"torch.nn.functional.group_norm(input,num_groups,weight,bias,"
                                   "eps)",
                                   NULL},
    .varargs = -1,
    .p = {INPUT, OP_REQ("num_groups", P_INT), TENSOR_OR_NONE("weight"), TENSOR_OR_NONE("bias"),
          FNUM("eps", 1e-5)},
    .forward = group_norm_fwd,
};

const grove__opdef grove__opdef_instance_norm = {
    .name = "instance_norm",
    .id = G_OP,
    .torch = (const char *const[]){"torch.nn.functional.instance_norm(input,running_mean,"
                                   "running_var,weight,bias,use_input_stats,momentum,eps)",
                                   NULL},
    .varargs = -1,
    .p = {INPUT, TENSOR_OR_NONE("running_mean"), TENSOR_OR_NONE("running_var"),
          TENSOR_OR_NONE("weight"), TENSOR_OR_NONE("bias"), OP_BOOL("use_input_stats", 1),
          {.name = "momentum", .kind = P_IGNORED, .dk = D_FLOAT, .dv = 0.1}, FNUM("eps", 1e-5)},
    .forward = instance_norm_fwd,
};

const grove__opdef grove__opdef_local_response_norm = {
    .name = "local_response_norm",
    .id = G_OP,
    .torch = (const char *const[]){"torch.nn.functional.local_response_norm(input,size,alpha,"
                                   "beta,k)",
                                   NULL},
    .varargs = -1,
    .p = {INPUT, POS_INT("size"), FNUM("alpha", 1e-4), FNUM("beta", 0.75), FNUM("k", 1.0)},
    .forward = lrn_fwd,
    .module = &(const grove__opmod){.cls = "LocalResponseNorm",
                                    .type = &grove__local_response_norm_type,
                                    .args = {POS_INT("size"), FNUM("alpha", 1e-4),
                                             FNUM("beta", 0.75), FNUM("k", 1.0)}},
};

/* ------------------------------------------------------------ unfold */

/* One int or a pair (h, w) of argument k, each at least lo. */
static grove_status pair_arg(const grove__opctx *c, int k, int64_t lo, int64_t v[2]) {
  int n = 1;
  grove_status s = GROVE_OK;
  const garg *a = &c->args[k];
  if (a->kind == A_FLOAT && a->f == (double)(int64_t)a->f)
    v[0] = (int64_t)a->f; /* a module's default model.json left out (read as a number) */
  else
    s = grove__op_ints(c, a, true, v, &n);
  if (s) return s;
  if (n == 1) v[1] = v[0];
  if ((n != 1 && n != 2) || v[0] < lo || v[1] < lo)
    return grove_err_set(c->f->err, GROVE_E_INVALID_ARGUMENT,
                         "unfold: %s must be one int or two, each at least %lld", c->def->p[k].name,
                         (long long)lo);
  return GROVE_OK;
}

/* F.unfold (im2col): a 4-d [N, C, H, W] (or 3-d [C, H, W]) input gives
 * [N, C * kh * kw, L], column l the kh x kw patch at the l-th window
 * position (row-major), zero where the padding is; any dtype (elements are
 * copied). */
static grove_status unfold_fwd(const grove__opctx *c, gval *res) {
  const grove_tensor *x0;
  grove_tensor x, y;
  int64_t k[2], dl[2], pd[2], st[2];
  grove_status s;
  if ((s = grove__op_tensor(c, 0, &x0)) || (s = pair_arg(c, 1, 1, k)) ||
      (s = pair_arg(c, 2, 1, dl)) || (s = pair_arg(c, 3, 0, pd)) || (s = pair_arg(c, 4, 1, st)))
    return s;
  if (x0->ndim != 3 && x0->ndim != 4)
    return grove_err_set(c->f->err, GROVE_E_SHAPE, "unfold: expected a 3-d or 4-d input, got %d-d",
                         x0->ndim);
  x = *x0;
  if (!grove_tensor_is_contiguous(x0) &&
      ((s = grove_fwd_alloc(c->f, &x, x0->dtype, x0->ndim, x0->shape)) ||
       (s = grove_tensor_copy(&x, x0, c->f->err))))
    return s;
  const int b = x.ndim == 4;
  const int64_t N = b ? x.shape[0] : 1, C = x.shape[b], H = x.shape[b + 1], W = x.shape[b + 2];
  int64_t o[2];
  const int64_t in[2] = {H, W};
  for (int i = 0; i < 2; i++) {
    const int64_t span = dl[i] * (k[i] - 1) + 1, room = in[i] + 2 * pd[i];
    if (pd[i] > (int64_t)1 << 30 || k[i] > (int64_t)1 << 30 || dl[i] > (int64_t)1 << 30 ||
        room < span)
      return grove_err_set(c->f->err, GROVE_E_SHAPE,
                           "unfold: the kernel (%lld x %lld, dilation %lld x %lld) does not fit "
                           "the padded %lld x %lld input",
                           (long long)k[0], (long long)k[1], (long long)dl[0], (long long)dl[1],
                           (long long)(H + 2 * pd[0]), (long long)(W + 2 * pd[1]));
    o[i] = (room - span) / st[i] + 1;
  }
  int64_t rows;
  if (__builtin_mul_overflow(C, k[0] * k[1], &rows))
    return grove_err_set(c->f->err, GROVE_E_SHAPE, "unfold: the output is too large");
  const int64_t shape[3] = {N, rows, o[0] * o[1]};
  if ((s = grove_fwd_alloc(c->f, &y, x.dtype, b ? 3 : 2, b ? shape : shape + 1))) return s;
  const size_t es = grove_dtype_size(x.dtype);
  const char *src = x.data;
  char *dst = y.data;
  const int64_t L = o[0] * o[1];
  for (int64_t n = 0; n < N; n++)
    for (int64_t ch = 0; ch < C; ch++)
      for (int64_t ki = 0; ki < k[0]; ki++)
        for (int64_t kj = 0; kj < k[1]; kj++) {
          const int64_t row = (ch * k[0] + ki) * k[1] + kj;
          char *out = dst + ((n * rows + row) * L) * (int64_t)es;
          for (int64_t oi = 0; oi < o[0]; oi++)
            for (int64_t oj = 0; oj < o[1]; oj++) {
              const int64_t h = oi * st[0] - pd[0] + ki * dl[0],
                            w = oj * st[1] - pd[1] + kj * dl[1];
              char *e = out + (oi * o[1] + oj) * (int64_t)es;
              if (h < 0 || h >= H || w < 0 || w >= W)
                memset(e, 0, es);
              else
                memcpy(e, src + (((n * C + ch) * H + h) * W + w) * (int64_t)es, es);
            }
        }
  grove__op_set_tensor(res, &y);
  return GROVE_OK;
}

/* Each an int or a pair (nn.Unfold(3) or nn.Unfold((2, 3))). */
#define UNFOLD_PAR(n, d, lo) \
  { .name = n, .kind = P_INTS, .dk = d, .dv = lo, .min = lo, .max = 1 << 30 }
#define UNFOLD_REST \
  UNFOLD_PAR("dilation", D_INT, 1), UNFOLD_PAR("padding", D_INT, 0), UNFOLD_PAR("stride", D_INT, 1)

GROVE__OP_MODULE_TYPE(grove__unfold_type, "Unfold");

const grove__opdef grove__opdef_unfold = {
    .name = "unfold",
    .id = G_OP,
    .torch = (const char *const[]){"torch.nn.functional.unfold(input,kernel_size,dilation,padding,"
                                   "stride)",
                                   NULL},
    .varargs = -1,
    .p = {INPUT, UNFOLD_PAR("kernel_size", D_REQ, 1), UNFOLD_REST},
    .forward = unfold_fwd,
    .module = &(const grove__opmod){.cls = "Unfold",
                                    .type = &grove__unfold_type,
                                    .args = {UNFOLD_PAR("kernel_size", D_REQ, 1), UNFOLD_REST}},
};
