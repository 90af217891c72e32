/* tensor.h: dtypes, refcounted storage, and the tensor: a view (dtype, shape,
 * strides in elements, data pointer) onto a storage.
 *
 * Two kinds of tensor share one struct:
 *   - heap tensors from grove_tensor_new / grove_tensor_view_new: refcounted
 *     objects (refcount >= 1) that own a reference to their storage.  Module
 *     parameters and buffers, and state_dict values, are heap tensors; a tensor
 *     reachable from two places (tied weights) is one object with two refs.
 *   - plain values (refcount 0, storage NULL) that describe memory owned by
 *     someone else: arena scratch during forward, a caller's input.  Set them
 *     up with grove_tensor_init; never retain or release them.
 *
 * Nothing here locks.  Refcounts are atomic, so heap tensors may be retained
 * and released from any thread; the data itself is not synchronised.
 */
#ifndef GROVE_TENSOR_H
#define GROVE_TENSOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "grove/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Values reach disk and the wire: they only grow. */
typedef enum grove_dtype {
  GROVE_F32 = 0,
  GROVE_F16 = 1,
  GROVE_BF16 = 2,
  GROVE_F64 = 3,
  GROVE_I64 = 4,
  GROVE_I32 = 5,
  GROVE_U8 = 6,
  GROVE_BOOL = 7,
  GROVE_I8 = 8,
  GROVE_I16 = 9,
  GROVE_DTYPE_COUNT
} grove_dtype;

/* Size of one element in bytes, 0 for an invalid dtype. */
size_t grove_dtype_size(grove_dtype dt);
/* NumPy/PyTorch name: "float32", "float16", "bfloat16", "float64", "int64",
 * "int32", "uint8", "bool", "int8", "int16"; "invalid" otherwise. */
const char *grove_dtype_name(grove_dtype dt);
/* Accepts the names above and torch's ("torch.float32", "float", "long", ...).
 * Returns false for anything else. */
bool grove_dtype_from_name(const char *name, grove_dtype *out);
/* safetensors' names: "F32", "F16", "BF16", "F64", "I64", "I32", "U8",
 * "BOOL", "I8", "I16". */
const char *grove_dtype_st_name(grove_dtype dt);
bool grove_dtype_from_st_name(const char *name, grove_dtype *out);
bool grove_dtype_is_float(grove_dtype dt);

/* ---------------------------------------------------------------- storage */

typedef struct grove_storage grove_storage;

/* A new zeroed storage of nbytes (64-byte aligned; nbytes may be 0).  The
 * caller owns the one reference.  NULL when out of memory. */
grove_storage *grove_storage_new(size_t nbytes);

/* A storage over memory someone else owns (an mmap'd file region).  When the
 * last reference drops, release(ctx) is called (release may be NULL).  The
 * caller owns the one reference. NULL when out of memory, and then release is
 * not called. */
grove_storage *grove_storage_wrap(void *data, size_t nbytes, void (*release)(void *ctx), void *ctx);

void grove_storage_retain(grove_storage *s);
/* Drops one reference; frees on the last.  NULL is a no-op. */
void grove_storage_release(grove_storage *s);
void *grove_storage_data(const grove_storage *s);
size_t grove_storage_nbytes(const grove_storage *s);

/* ----------------------------------------------------------------- tensor */

#define GROVE_MAX_DIMS 8

typedef struct grove_tensor {
  grove_dtype dtype;
  int ndim;                         /* 0 for a scalar */
  int64_t shape[GROVE_MAX_DIMS];    /* shape[i] >= 0 */
  int64_t strides[GROVE_MAX_DIMS];  /* in elements, like torch's stride() */
  void *data;                       /* first element (storage data + offset) */
  grove_storage *storage;           /* owned reference, or NULL for a plain value */
  int refcount;                     /* heap tensors only; atomic; 0 for values */
} grove_tensor;

/* A new contiguous, zeroed heap tensor.  shape may be NULL when ndim is 0.
 * The caller owns the one reference (release with grove_tensor_release).
 * Returns NULL and sets err on a bad shape or when out of memory. */
grove_tensor *grove_tensor_new(grove_dtype dt, int ndim, const int64_t *shape, grove_err *err);

/* A new heap tensor viewing storage at byte_offset with the given shape and
 * strides (strides NULL = contiguous).  Retains storage; checks, with overflow
 * checks, that every element it can reach lies inside the storage.  The caller
 * owns the one reference.  NULL and err set when the view does not fit. */
grove_tensor *grove_tensor_view_new(grove_storage *storage, size_t byte_offset, grove_dtype dt,
                                    int ndim, const int64_t *shape, const int64_t *strides,
                                    grove_err *err);

/* A heap tensor that copies src into a new contiguous storage of dtype dt
 * (converting as grove_tensor_copy does).  Caller owns the reference. */
grove_tensor *grove_tensor_clone(const grove_tensor *src, grove_dtype dt, grove_err *err);

void grove_tensor_retain(grove_tensor *t);
/* Drops one reference of a heap tensor and frees it on the last.  NULL is a
 * no-op; must not be called on a plain value. */
void grove_tensor_release(grove_tensor *t);

/* Fills a plain value describing contiguous memory at data (not owned). */
void grove_tensor_init(grove_tensor *t, grove_dtype dt, int ndim, const int64_t *shape, void *data);

int64_t grove_tensor_numel(const grove_tensor *t);
size_t grove_tensor_nbytes(const grove_tensor *t); /* numel * element size */
bool grove_tensor_is_contiguous(const grove_tensor *t);
bool grove_tensor_same_shape(const grove_tensor *a, const grove_tensor *b);
/* Computes contiguous strides for shape into strides. */
void grove_contiguous_strides(int ndim, const int64_t *shape, int64_t *strides);

/* Copies src into dst elementwise (same shape; any strides on either side),
 * converting the dtype: float <-> float (f16/bf16 rounding to nearest even),
 * integer/bool -> float, integer <-> integer when the value fits.  Returns
 * GROVE_E_SHAPE, or GROVE_E_DTYPE for a float -> integer copy. */
grove_status grove_tensor_copy(grove_tensor *dst, const grove_tensor *src, grove_err *err);

/* Writes "[2, 3]" into buf (always NUL-terminated).  Returns buf. */
char *grove_shape_str(int ndim, const int64_t *shape, char *buf, size_t n);

/* Half-precision helpers (exact, round to nearest even on narrowing). */
float grove_f16_to_f32(uint16_t h);
uint16_t grove_f32_to_f16(float f);
float grove_bf16_to_f32(uint16_t h);
uint16_t grove_f32_to_bf16(float f);

#ifdef __cplusplus
}
#endif
#endif
