/* tensor_internal.h: the non-public helpers of core/tensor/ (tensor.c):
 * the bounds of a strided view, storage accounting, the channels-last
 * layout.  Never installed (tests may include it). */
#ifndef GROVE_CORE_TENSOR_INTERNAL_H
#define GROVE_CORE_TENSOR_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "grove/grove.h"
#include "base.h"

/* ------------------------------------------------------------ views */

/* The one bounds computation for a strided view of a storage (torch_load,
 * optim_io, grove_tensor_view_new: every reader of offsets and strides from
 * a file goes through it).  A view of ndim dims (shape, strides in elements,
 * both from outside) starting elem_offset elements of es bytes into its
 * storage reaches up to byte *end (exclusive): (elem_offset + sum((shape_i -
 * 1) * stride_i) + 1) * es, or elem_offset * es when some shape_i is 0 (an
 * empty view reaches nothing but must still start inside).  Returns false,
 * *end untouched, when a shape or stride is negative or any step overflows
 * 64 bits: the caller refuses the view then, as when *end passes the
 * storage's size. */
bool grove__view_end(uint64_t elem_offset, size_t es, int ndim, const int64_t *shape,
                     const int64_t *strides, uint64_t *end);

/* Bytes of storage allocated by grove_storage_new since the process started
 * (never decreases; wrapped storages, e.g. mappings of files, do not count).
 * Lets tests check that reading a small file costs little memory. */
uint64_t grove__storage_bytes_allocated(void);

/* ------------------------------------------------------------ channels last */

/* Whether t is a 4-d [N, C, H, W] tensor whose memory is laid out channels
 * last (NHWC: strides [HWC, 1, WC, C]) and that is not also contiguous (C,
 * or H * W, larger than 1): what a convolution hands the next layer when
 * its caller allows (grove_fwd.channels_last_ok). */
bool grove__is_nhwc(const grove_tensor *t);
/* Gives the contiguous 4-d tensor t NHWC strides (same shape, same bytes). */
void grove__set_nhwc(grove_tensor *t);

#endif
