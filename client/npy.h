/* npy.h: NumPy .npy files, the tensors of Grove's command line.
 *
 * Reads format versions 1.0, 2.0 and 3.0 (the header length is 2 bytes in
 * 1.0 and 4 bytes after; 3.0 only allows UTF-8 in the header) and writes 1.0
 * byte for byte as numpy.save does (header padded with spaces to a 64-byte
 * boundary, plus numpy's spare room for growing the first axis).
 *
 * Supported dtypes, little-endian only ('|' for one-byte types):
 *   <f4 float32   <f8 float64   <f2 float16
 *   <i8 int64     <i4 int32     <i2 int16    |i1 int8
 *   |u1 uint8     |b1 bool
 * C order only: a file with fortran_order True is refused (GROVE_E_UNSUPPORTED)
 * unless its layout is the same as C order (at most one dimension above 1).
 * At most GROVE_MAX_DIMS dimensions.
 *
 * Every error names the file (the name given) and what is wrong:
 *   GROVE_E_FORMAT            bad magic, a header that is not numpy's dict
 *                             literal, missing/extra/duplicate keys, a bad shape
 *                             or fortran_order value, a bool byte not 0 or 1
 *   GROVE_E_TRUNCATED         the file ends inside the preamble, header or data
 *   GROVE_E_BAD_SIZE          bytes left over after the data
 *   GROVE_E_BAD_DTYPE         a descr Grove has no dtype for (big-endian,
 *                             complex, strings, objects, structured)
 *   GROVE_E_UNSUPPORTED       a format version other than 1.0/2.0/3.0, or
 *                             Fortran order
 *   GROVE_E_HEADER_TOO_LARGE  a header over GROVE_NPY_MAX_HEADER bytes
 *   GROVE_E_LIMIT             more than GROVE_MAX_DIMS dimensions
 *   GROVE_E_RANGE             a dimension or the byte size overflows
 *   GROVE_E_IO, GROVE_E_NOMEM as usual
 *
 * Nothing here keeps state: every function may be called from any thread.
 */
#ifndef GROVE_CLIENT_NPY_H
#define GROVE_CLIENT_NPY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "grove/status.h"
#include "grove/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* numpy refuses headers longer than this by default (format._MAX_HEADER_SIZE)
 * because it evaluates them; a legitimate header for at most 8 dimensions
 * takes well under 200 bytes. */
#define GROVE_NPY_MAX_HEADER 10000

/* What a header says. */
typedef struct grove_npy_info {
  int major, minor; /* format version */
  grove_dtype dtype;
  int ndim;
  int64_t shape[GROVE_MAX_DIMS];
  bool fortran_order; /* only ever true when the layout equals C order */
  size_t data_offset; /* bytes before the data: preamble + header */
  size_t data_bytes;  /* numel * element size */
} grove_npy_info;

/* Parses the preamble and header at the start of buf (len bytes available;
 * the data need not be there).  name is used in messages.  Does not check
 * the file's length: callers compare data_offset + data_bytes with it. */
grove_status grove_npy_parse_header(const void *buf, size_t len, const char *name,
                                    grove_npy_info *info, grove_err *err);

/* Reads the .npy file at path into a new contiguous heap tensor (*out, the
 * caller's reference; release with grove_tensor_release).  The file's length
 * must be exactly header + data.  On error *out is NULL. */
grove_status grove_npy_read(const char *path, grove_tensor **out, grove_err *err);

/* The same from a whole file in memory (buf, len); name is used in
 * messages. */
grove_status grove_npy_decode(const void *buf, size_t len, const char *name, grove_tensor **out,
                              grove_err *err);

/* Encodes t (any strides; dtypes above, not bfloat16) as a version 1.0 .npy
 * image in a new malloc'd buffer (*buf, the caller frees it; *len its
 * size).  Byte-identical to numpy.save of the same C-order array. */
grove_status grove_npy_encode(const grove_tensor *t, void **buf, size_t *len, grove_err *err);

/* Writes t to path as grove_npy_encode does.  A regular file (or a new name)
 * is written under a temporary name in the same directory and renamed, so a
 * failure never leaves half a file; anything else (/dev/stdout, a pipe) is
 * written directly. */
grove_status grove_npy_write(const char *path, const grove_tensor *t, grove_err *err);

/* The .npy descr of a dtype ("<f4"), or NULL when .npy has none
 * (bfloat16). */
const char *grove_npy_descr(grove_dtype dt);

#ifdef __cplusplus
}
#endif
#endif
