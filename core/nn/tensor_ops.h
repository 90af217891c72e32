/* tensor_ops.h: the kernels of the torchvision zoo's operations (#18) that
 * are not convolution or pooling: activations and pointwise math
 * (pointwise.c), comparisons, where and masked_fill (select.c), the norms
 * that are not BatchNorm/LayerNorm (norm_group.c), resampling and padding
 * (resample.c), shape operations (shape_ops.c) and the reductions that pick
 * (pick_reduce.c).  Plain functions on a grove_fwd, as graph_ops.h's are:
 * the op table's entries (ops.h) call them, and a module with parameters
 * (PReLU, GroupNorm, InstanceNorm2d with affine) runs the same kernel as its
 * functional form.  core/nn/, internal to libgrove (tests may include it).
 *
 * Common rules: results are new arena tensors in f's arena, except where a
 * function says it returns a view (sharing x's memory, as torch's view ops
 * do).  Inputs may be strided; a channels-last [N, C, H, W] input
 * (grove__is_nhwc) of an elementwise op gives a channels-last result of the
 * same layout.  Errors set f->err without naming the node (the caller
 * prefixes it).  Every function runs on the forward's thread and may cut its
 * loop between the compute threads (grove__parallel_for). */
#ifndef GROVE_CORE_TENSOR_OPS_H
#define GROVE_CORE_TENSOR_OPS_H

#include <stdbool.h>
#include <stdint.h>

#include "grove/grove.h"
#include "module_internal.h"

/* ------------------------------------------------------------ pointwise.c */

/* One-input elementwise functions.  a and b are the function's numbers:
 *   HARDTANH / CLAMP: min a, max b (-INFINITY / INFINITY for none);
 *   ELU, CELU: alpha a; SELU: none (torch's constants);
 *   SOFTPLUS: beta a, threshold b; POW: exponent a (x ** a);
 *   LEAKY: negative_slope a; the others: none. */
enum {
  GROVE__UN_RELU6,
  GROVE__UN_HARDSWISH,
  GROVE__UN_HARDSIGMOID,
  GROVE__UN_HARDTANH,
  GROVE__UN_CLAMP,
  GROVE__UN_ELU,
  GROVE__UN_SELU,
  GROVE__UN_CELU,
  GROVE__UN_SOFTPLUS,
  GROVE__UN_MISH,
  GROVE__UN_EXP,
  GROVE__UN_LOG,
  GROVE__UN_SQRT,
  GROVE__UN_RSQRT,
  GROVE__UN_ABS,
  GROVE__UN_NEG,
  GROVE__UN_POW,
  GROVE__UN_SIN,
  GROVE__UN_COS,
  GROVE__UN_ERF,
  GROVE__UN_RECIPROCAL,
  GROVE__UN_LOG1P,
  GROVE__UN_EXPM1,
  GROVE__UN_SOFTSIGN,
  GROVE__UN_LOGSIGMOID,
  GROVE__UN_FLOOR,
  GROVE__UN_CEIL,
  GROVE__UN_ROUND, /* decimals a (torch.round(x, decimals=a)), half to even */
  GROVE__UN_TRUNC,
  GROVE__UN_SIGN,
  GROVE__UN_SQUARE,
  GROVE__UN_LOG2,
  GROVE__UN_LOG10,
  GROVE__UN_EXP2,
  GROVE__UN_TAN,
  GROVE__UN_ATAN,
  GROVE__UN_SINH,
  GROVE__UN_COSH,
  GROVE__UN_ASIN,
  GROVE__UN_ACOS,
  GROVE__UN_TANHSHRINK,
  GROVE__UN_HARDSHRINK, /* lambd a */
  GROVE__UN_SOFTSHRINK, /* lambd a */
  GROVE__UN_THRESHOLD,  /* threshold a, value b */
  GROVE__UN_COUNT
};

/* torch's name of a GROVE__UN_* function ("hardswish"), for messages. */
const char *grove__unary_name(int op);

/* out = op(x).  Float32 in and out, except: ABS, NEG, CLAMP, FLOOR, CEIL,
 * ROUND, TRUNC, SIGN and SQUARE keep an int64 input's dtype (torch does;
 * CLAMP then rounds its bounds toward the values torch compares with), and
 * EXP, LOG, SQRT, RSQRT, POW, SIN, COS, ERF, RECIPROCAL, LOG1P, EXPM1,
 * SOFTSIGN, LOG2, LOG10, EXP2, TAN, ATAN, SINH, COSH, ASIN and ACOS of an integer or bool input
 * compute in float32 (torch promotes them).  into, when not NULL, contiguous and of x's shape,
 * receives the result (it may be x itself when nothing else reads x). */
grove_status grove__op_unary(grove_fwd *f, int op, const grove_tensor *x, double a, double b,
                             grove_tensor *out, const grove_tensor *into);

/* torch.pow(x, e) with a tensor exponent (broadcast). */
grove_status grove__op_pow_tensor(grove_fwd *f, const grove_tensor *x, const grove_tensor *e,
                                  grove_tensor *out);

/* F.prelu(x, weight): weight holds 1 number or one per channel (dim 1 of x;
 * x may be 1-d, then its only dim is the channel).  nn.PReLU runs this. */
grove_status grove__op_prelu(grove_fwd *f, const grove_tensor *x, const grove_tensor *weight,
                             grove_tensor *out);

/* x.to(dtype) / x.type(dtype) / x.float() / x.long() / x.bool(): a copy
 * converted as torch converts (float -> integer truncates toward zero, any
 * -> bool is != 0); x itself (no copy) when it already has that dtype, as
 * torch returns self. */
grove_status grove__op_to_dtype(grove_fwd *f, const grove_tensor *x, grove_dtype dt,
                                grove_tensor *out);

/* ------------------------------------------------------------ select.c */

enum { GROVE__CMP_EQ, GROVE__CMP_NE, GROVE__CMP_LT, GROVE__CMP_LE, GROVE__CMP_GT, GROVE__CMP_GE };

/* a OP b with broadcasting, a bool tensor.  a and b may be float32, int64
 * or bool (compared as numbers: int64 against float32 as torch promotes,
 * in float32). */
grove_status grove__op_compare(grove_fwd *f, int op, const grove_tensor *a, const grove_tensor *b,
                               grove_tensor *out);
/* The same against a Python number (x == 3, x < 0.5). */
grove_status grove__op_compare_scalar(grove_fwd *f, int op, const grove_tensor *a, double b,
                                      grove_tensor *out);

/* a OP b for two numbers (GROVE__CMP_*). */
bool grove__cmp_f64(int op, double a, double b);
bool grove__cmp_i64(int op, int64_t a, int64_t b);

/* torch.where(cond, a, b): cond bool (or any dtype, != 0), a and b
 * tensors of any dtype Grove keeps, all broadcast together, converted to
 * dt (float32, int64 or bool: the caller promotes as torch does).  A NULL
 * a or b is the number av / bv (torch.where(mask, x, 0.0)). */
grove_status grove__op_where(grove_fwd *f, const grove_tensor *cond, const grove_tensor *a,
                             double av, const grove_tensor *b, double bv, grove_dtype dt,
                             grove_tensor *out);
/* x.masked_fill(mask, value): where(mask, value, x), of x's shape (mask
 * broadcasts to it, not the other way round, as torch requires). */
grove_status grove__op_masked_fill(grove_fwd *f, const grove_tensor *x, const grove_tensor *mask,
                                   double value, grove_tensor *out);

/* Elementwise functions of three tensors broadcast together:
 *   LERP: torch.lerp(a, b, weight c), a + c * (b - a) (for |c| >= 0.5
 *     computed from b, as torch); float only, as torch refuses integers;
 *   ADDCMUL: torch.addcmul(a, b, c, value), a + value * b * c; integers
 *     (and bool) give int64 with an integer value, as torch;
 *   ADDCDIV: torch.addcdiv(a, b, c, value), a + value * b / c; float only.
 * A float among the operands makes the others float32. */
enum { GROVE__TER_LERP, GROVE__TER_ADDCMUL, GROVE__TER_ADDCDIV };
grove_status grove__op_ternary(grove_fwd *f, int op, const grove_tensor *a, const grove_tensor *b,
                               const grove_tensor *c, double value, grove_tensor *out);

/* ------------------------------------------------------------ norm_group.c */

/* F.group_norm(x, groups, weight, bias, eps): x [N, C, *] with C divisible
 * by groups; weight and bias NULL or C floats (float32 tensors of C
 * elements).  nn.GroupNorm runs this. */
grove_status grove__op_group_norm(grove_fwd *f, const grove_tensor *x, int64_t groups,
                                  const grove_tensor *weight, const grove_tensor *bias, double eps,
                                  grove_tensor *out);
/* F.instance_norm in eval: with use_input_stats each (sample, channel)
 * plane is normalised by its own mean and variance (InstanceNorm2d's
 * default track_running_stats=False), else by running_mean / running_var
 * (C floats each).  weight, bias NULL or C floats.  nn.InstanceNorm1d/2d
 * run this. */
grove_status grove__op_instance_norm(grove_fwd *f, const grove_tensor *x,
                                     const grove_tensor *running_mean,
                                     const grove_tensor *running_var, const grove_tensor *weight,
                                     const grove_tensor *bias, bool use_input_stats, double eps,
                                     grove_tensor *out);
/* F.local_response_norm(x, size, alpha, beta, k) over dim 1 (channels),
 * x 3-d or more. */
grove_status grove__op_local_response_norm(grove_fwd *f, const grove_tensor *x, int64_t size,
                                           double alpha, double beta, double k, grove_tensor *out);

/* layers_norm.c: LayerNorm over rows of D floats (nn.LayerNorm's forward and
 * F.layer_norm): w, b NULL or D floats; statistics in double. */
void grove__layer_norm_rows(const float *x, float *y, int64_t rows, int64_t D, const float *w,
                            const float *b, double eps);

/* ------------------------------------------------------------ resample.c */

enum {
  GROVE__INTERP_NEAREST,
  GROVE__INTERP_NEAREST_EXACT,
  GROVE__INTERP_LINEAR, /* linear / bilinear: by the number of spatial dims */
  GROVE__INTERP_CUBIC,  /* bicubic: 2 spatial dims */
};

/* F.interpolate / nn.Upsample on x [N, C, *spatial] (1 or 2 spatial dims)
 * to size[] (nsp values).  scale NULL or scale[d] <= 0: the source
 * coordinates step by in / out (a given size, or recompute_scale_factor);
 * scale[d] > 0: the scale_factor the caller gave, which torch then maps
 * with (1 / scale_factor).  align_corners only for LINEAR and CUBIC.  A channels-last
 * input is read as it is; the result is contiguous. */
grove_status grove__op_interpolate(grove_fwd *f, const grove_tensor *x, const int64_t *size,
                                   const double *scale, int nsp, int mode, bool align_corners,
                                   grove_tensor *out);

/* F.pad(x, pad, mode="constant", value): pad holds 2 * k numbers, (left,
 * right) of the last dim first, then of the one before, ...; negative
 * amounts crop.  nn.ZeroPad2d / ConstantPad1d/2d/3d run this. */
grove_status grove__op_pad(grove_fwd *f, const grove_tensor *x, const int64_t *pad, int npad,
                           double value, grove_tensor *out);

/* F.pad's modes. */
enum { GROVE__PAD_CONSTANT, GROVE__PAD_REFLECT, GROVE__PAD_REPLICATE, GROVE__PAD_CIRCULAR };
/* F.pad(x, pad, mode) for mode reflect, replicate or circular: pad holds
 * 2, 4 or 6 numbers as for grove__op_pad, x one or two more dimensions
 * (torch's rule); negative amounts crop; reflect's amounts are below the
 * dimension's size, circular's at most it.  Any dtype; the result is
 * contiguous.  nn.ReflectionPad1d/2d/3d and ReplicationPad1d/2d/3d run
 * this.  The forward's thread. */
grove_status grove__op_pad_edge(grove_fwd *f, const grove_tensor *x, const int64_t *pad, int npad,
                                int mode, grove_tensor *out);

/* F.pixel_shuffle(x, r): [*, C * r * r, H, W] -> [*, C, H * r, W * r]; with
 * inverse, F.pixel_unshuffle(x, r), the way back. */
grove_status grove__op_pixel_shuffle(grove_fwd *f, const grove_tensor *x, int64_t r, bool inverse,
                                     grove_tensor *out);

/* ------------------------------------------------------------ shape_ops.c */

/* x.chunk(chunks, dim) / x.split(size, dim) / x.split([sizes], dim) /
 * x.unbind(dim): up to max views of x (sharing its memory), *n of them.
 * split: sizes NULL and nsizes 1 with sizes_one = size for the int form.
 * GROVE_E_SHAPE when the parts would be more than max. */
grove_status grove__op_chunk(grove_fwd *f, const grove_tensor *x, int64_t chunks, int64_t dim,
                             grove_tensor *outs, int max, int *n);
grove_status grove__op_split(grove_fwd *f, const grove_tensor *x, const int64_t *sizes,
                             int nsizes, int64_t size, int64_t dim, grove_tensor *outs, int max,
                             int *n);
grove_status grove__op_unbind(grove_fwd *f, const grove_tensor *x, int64_t dim,
                              grove_tensor *outs, int max, int *n);

/* Views: x.narrow(dim, start, length); x.unsqueeze(dim); x.squeeze()
 * (every size-1 dim: dim NULL) or x.squeeze(dim); x.expand(*sizes) (-1
 * keeps a dim; new leading dims allowed; stride 0 where it broadcasts). */
grove_status grove__op_narrow(grove_fwd *f, const grove_tensor *x, int64_t dim, int64_t start,
                              int64_t length, grove_tensor *out);
grove_status grove__op_unsqueeze(grove_fwd *f, const grove_tensor *x, int64_t dim,
                                 grove_tensor *out);
grove_status grove__op_squeeze(grove_fwd *f, const grove_tensor *x, const int64_t *dim,
                               grove_tensor *out);
grove_status grove__op_expand(grove_fwd *f, const grove_tensor *x, const int64_t *sizes, int n,
                              grove_tensor *out);
/* torch.stack(ts, dim): every tensor of one shape, a new dim at dim (torch.cat
 * of their unsqueezed views). */
grove_status grove__op_stack(grove_fwd *f, const grove_tensor *ts, int n, int64_t dim,
                             grove_tensor *out);
/* x.repeat(*reps) (reps at least x's dims; leading ones add dims). */
grove_status grove__op_repeat(grove_fwd *f, const grove_tensor *x, const int64_t *reps, int n,
                              grove_tensor *out);
/* torch.roll(x, shifts, dims): ndims 0 rolls the flattened tensor by
 * shifts[0] and keeps the shape. */
grove_status grove__op_roll(grove_fwd *f, const grove_tensor *x, const int64_t *shifts,
                            const int64_t *dims, int ndims, grove_tensor *out);
/* torch.index_select(x, dim, index) and x[index] / x[:, index] with an
 * int64 (or int32) index tensor of any shape: its shape replaces dim.  An
 * id out of [0, size) is GROVE_E_RANGE naming it, as torch.index_select;
 * with negative (indexing), ids from -size count from the end. */
grove_status grove__op_index_select(grove_fwd *f, const grove_tensor *x, int64_t dim,
                                    const grove_tensor *index, bool negative,
                                    grove_tensor *out);

/* torch.flip(x, dims): a copy with each of dims reversed (each once). */
grove_status grove__op_flip(grove_fwd *f, const grove_tensor *x, const int64_t *dims, int n,
                            grove_tensor *out);
/* torch.gather(x, dim, index): out[..., i, ...] = x[..., index[..., i, ...], ...]
 * along dim; index int64 or int32 of x's ndim, no larger than x off dim,
 * ids in [0, size) (torch takes no negative ones); out has index's shape. */
grove_status grove__op_gather(grove_fwd *f, const grove_tensor *x, int64_t dim,
                              const grove_tensor *index, grove_tensor *out);
/* F.one_hot(ids, num_classes): int64 [*ids.shape, num_classes] (num_classes
 * < 0: max id + 1, as torch); ids non-negative and below num_classes. */
grove_status grove__op_one_hot(grove_fwd *f, const grove_tensor *ids, int64_t num_classes,
                               grove_tensor *out);

/* ------------------------------------------------------------ pick_reduce.c */

enum { GROVE__PICK_MAX, GROVE__PICK_MIN };

/* torch.amax / amin(x, dims, keepdim) (ndims < 0: every dim); float32 or
 * int64 (kept). */
grove_status grove__op_amax(grove_fwd *f, int op, const grove_tensor *x, const int64_t *dims,
                            int ndims, bool keepdim, grove_tensor *out);
/* torch.max / min(x, dim, keepdim): values and int64 indices (the first of
 * equal values, as torch on CPU); argmax / argmin is the indices alone
 * (indices NULL: values only; values NULL: indices only).  has_dim false:
 * over every element, a 0-d value (max) or 0-d index (argmax). */
grove_status grove__op_max_dim(grove_fwd *f, int op, const grove_tensor *x, bool has_dim,
                               int64_t dim, bool keepdim, grove_tensor *values,
                               grove_tensor *indices);

#endif
