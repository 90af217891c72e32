/* graph_ops.h: the tensor operations (graph_ops.c) a torch.fx graph's
 * call_function / call_method nodes run between its modules (core/graph/)
 * and the attention layers compose (layers_attention.c): a part of
 * core/nn/, below the graphs that call them.  Internal to libgrove (tests
 * may include it). */
#ifndef GROVE_CORE_GRAPH_OPS_H
#define GROVE_CORE_GRAPH_OPS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "grove/grove.h"
#include "module_internal.h"

/* ------------------------------------------------------------ extents */

/* Bytes a (non-negative strided) tensor's elements span from its data
 * pointer; 0 for an empty tensor. */
size_t grove__tensor_extent(const grove_tensor *t);

/* ------------------------------------------------------------ operations */

/* graph_ops.c: torch's semantics on float32 tensors of any strides.  Results
 * are new arena tensors, except the views (reshape of a contiguous input,
 * permute, transpose, index), which share x's memory.  Errors set f->err
 * without naming the node (the caller prefixes it). */

/* MAX, MIN: torch.maximum / minimum (a NaN on either side wins);
 * FLOORDIV, TRUNCDIV: div with rounding_mode "floor" / "trunc" (and //);
 * MOD: torch.remainder (and %), the sign of b; ATAN2: torch.atan2(a, b),
 * the angle of the point (b, a). */
enum {
  GROVE__BIN_ADD,
  GROVE__BIN_SUB,
  GROVE__BIN_MUL,
  GROVE__BIN_DIV,
  GROVE__BIN_MAX,
  GROVE__BIN_MIN,
  GROVE__BIN_FLOORDIV,
  GROVE__BIN_TRUNCDIV,
  GROVE__BIN_MOD,
  GROVE__BIN_ATAN2,
};

/* Whether t is a contiguous per-channel operand of the 4-d float32 x
 * ([C, 1, 1] or [1 or N, C, 1, 1]: squeeze-excitation's scale, a bias),
 * which grove__op_binary runs over a channels-last x without changing its
 * layout.  graph_ops.c; pure. */
bool grove__per_channel(const grove_tensor *t, const grove_tensor *x);

/* out = a OP b with broadcasting (add, sub: a OP alpha * b).  into, when
 * not NULL and of the result's shape, receives the result in place (it may be
 * a itself when nothing else reads a). */
grove_status grove__op_binary(grove_fwd *f, int op, const grove_tensor *a, const grove_tensor *b,
                              double alpha, grove_tensor *out, const grove_tensor *into);
/* torch.matmul, 1-d operands and batch broadcasting included. */
grove_status grove__op_matmul(grove_fwd *f, const grove_tensor *a, const grove_tensor *b,
                              grove_tensor *out);
/* mean or sum over dims (ndims < 0: every dim), keepdim as torch. */
grove_status grove__op_reduce(grove_fwd *f, bool mean, const grove_tensor *x, const int64_t *dims,
                              int ndims, bool keepdim, grove_tensor *out);
/* torch.cat along dim. */
grove_status grove__op_cat(grove_fwd *f, const grove_tensor *ts, int n, int64_t dim,
                           grove_tensor *out);
/* reshape/view with one -1: a view of x when it is contiguous, else of a
 * contiguous copy. */
grove_status grove__op_reshape(grove_fwd *f, const grove_tensor *x, const int64_t *shape, int nd,
                               grove_tensor *out);
grove_status grove__op_permute(grove_fwd *f, const grove_tensor *x, const int64_t *dims, int nd,
                               grove_tensor *out);
grove_status grove__op_transpose(grove_fwd *f, const grove_tensor *x, int64_t d0, int64_t d1,
                                 grove_tensor *out);

/* One element of a tensor index (x[0, 1:3, None, ...]). */
enum { GROVE__IX_INT, GROVE__IX_SLICE, GROVE__IX_NONE, GROVE__IX_ELLIPSIS };
typedef struct grove__index {
  int kind;
  int64_t start, stop, step; /* IX_INT: start is the index; IX_SLICE: step >= 1 */
  bool has_start, has_stop;  /* IX_SLICE: false for a None bound */
} grove__index;

/* Python's slice.indices(len) for a positive step: first element and count. */
void grove__slice_indices(int64_t len, const grove__index *ix, int64_t *first, int64_t *count);
/* x[ix...] (basic indexing: a view). */
grove_status grove__op_index(grove_fwd *f, const grove_tensor *x, const grove__index *ix, int n,
                             grove_tensor *out);
/* A contiguous float32 copy in the arena; t itself when it already is one
 * (any dtype: grove__fwd_contig, module_internal.h). */
grove_status grove__contig_f32(grove_fwd *f, const grove_tensor *t, grove_tensor *out);

/* torch's dim wrapping (-1 is the last; a 0-d tensor takes -1 and 0) with
 * its message ("dimension 3 is out of range for a 2-d tensor ..."), and
 * broadcasting: the result shape of a OP b, and t's strides in that index
 * space (0 where t is broadcast).  For the operation files beside this one
 * (tensor_ops.h). */
grove_status grove__dim_index(grove_fwd *f, int64_t dim, int ndim, int *out);
grove_status grove__broadcast_shape(grove_fwd *f, const grove_tensor *a, const grove_tensor *b,
                                    int *nd, int64_t *shape);
void grove__broadcast_strides(const grove_tensor *t, int n, const int64_t *shape, int64_t *st);

#endif
