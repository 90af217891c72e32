/* checkpoint.h: reading and writing state_dicts in the files PyTorch users
 * have: safetensors and torch.save zip archives (.pt/.pth/.bin).
 *
 * Readers never run code from a file and never return a half-read map: on any
 * error the result is NULL and err names the file, the key and the problem.
 * All functions may be called from any thread; they share no state. */
#ifndef GROVE_CHECKPOINT_H
#define GROVE_CHECKPOINT_H

#include <stdbool.h>
#include <stddef.h>

#include "grove/state_dict.h"
#include "grove/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Largest safetensors header accepted (as the reference reader: 100 MB). */
#define GROVE_ST_MAX_HEADER (100u * 1000u * 1000u)

typedef enum grove_ckpt_format {
  GROVE_CKPT_UNKNOWN = 0,
  GROVE_CKPT_SAFETENSORS = 1,
  GROVE_CKPT_TORCH_ZIP = 2,
} grove_ckpt_format;

/* Guesses the format from the file name's extension and the first bytes. */
grove_ckpt_format grove_ckpt_detect(const char *path, const void *head, size_t head_len);

/* Reads a safetensors file.  The file is mmap'd; aligned little-endian f32
 * tensors borrow the mapping (zero-copy; the mapping lives as long as any
 * tensor does), others are copied.  *out is a new map the caller frees.
 * Every validation of the reference reader, plus duplicate keys; the
 * "__metadata__" entry is checked (string values) and not returned. */
grove_status grove_safetensors_read(const char *path, grove_state_dict **out, grove_err *err);
/* The same from memory (no zero-copy: tensors are copied).  name is used in
 * messages. */
grove_status grove_safetensors_read_buffer(const void *buf, size_t len, const char *name,
                                           grove_state_dict **out, grove_err *err);
/* Writes sd as safetensors with {"format": "pt"} metadata, tensors in sd's
 * order, data 8-byte aligned.  Written to a temporary name and renamed, so a
 * failure leaves no half file. */
grove_status grove_safetensors_write(const char *path, const grove_state_dict *sd, grove_err *err);

/* Reads a torch.save zip archive (.pt/.pth/.bin) with a restricted unpickler
 * that never runs code (docs/checkpoints.md).  Same contract as
 * grove_safetensors_read. */
grove_status grove_torch_read(const char *path, grove_state_dict **out, grove_err *err);
/* Writes sd as torch.save(sd, path) would: a zip archive with a protocol-2
 * pickle of an OrderedDict (keys in sd's order, sd's module versions as its
 * _metadata), storages stored 64-byte aligned, "version" and "byteorder"
 * records, all under one folder named after the file.
 * torch.load(path, weights_only=True) returns the same keys in the same
 * order, bit for bit; one tensor held under two keys is written once and
 * comes back as two tensors sharing a storage.  Written to a temporary name
 * and renamed, so a failure leaves no half file.  sd is only read (the
 * caller keeps it); any thread, as long as no one modifies sd meanwhile. */
grove_status grove_torch_write(const char *path, const grove_state_dict *sd, grove_err *err);

/* Reads any supported checkpoint, by content.  Same contract as above. */
grove_status grove_checkpoint_read(const char *path, grove_state_dict **out, grove_err *err);

#ifdef __cplusplus
}
#endif
#endif
