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
#include <stdint.h>

#include "grove/state_dict.h"
#include "grove/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Largest safetensors header accepted (as the reference reader: 100 MB). */
#define GROVE_ST_MAX_HEADER (100u * 1000u * 1000u)
/* Writing views that repeat their storages' elements (stride 0, as
 * torch.load gives expanded tensors) copies at most this many bytes more
 * than those storages hold, per file; beyond, the writers refuse
 * (GROVE_E_LIMIT, naming the key), so that converting a small file cannot
 * cost gigabytes. */
#define GROVE_MAX_EXPANDED_COPY ((size_t)64 << 20)
/* Most tensors one safetensors file may list (GROVE_E_LIMIT): far above any
 * real shard (a few thousand), low enough that a header of zero-size
 * tensors cannot cost gigabytes (the JSON tree takes about 1 KB a tensor). */
#define GROVE_ST_MAX_TENSORS (1u << 17)

typedef enum grove_ckpt_format {
  GROVE_CKPT_UNKNOWN = 0,
  GROVE_CKPT_SAFETENSORS = 1,
  GROVE_CKPT_TORCH_ZIP = 2, /* a torch.save file: the zip format or the legacy one */
} grove_ckpt_format;

/* Guesses the format from the file name's extension and the first bytes. */
grove_ckpt_format grove_ckpt_detect(const char *path, const void *head, size_t head_len);

/* Reads a safetensors file.  The file is read whole into memory of its own
 * (never mapped: a write to the file later changes nothing read, and a file
 * written while it is read is refused, GROVE_E_IO); aligned little-endian
 * f32 tensors borrow that copy (it lives as long as any tensor does), others
 * are copied.  *out is a new map the caller frees.
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

/* What tells one state of a file from another without reading it: a write,
 * a truncate or a rename over the path changes it. */
typedef struct grove_file_stamp {
  uint64_t dev, ino;
  int64_t size, mtime_s, mtime_ns, ctime_s, ctime_ns;
} grove_file_stamp;
/* stat(path) into *out (following symlinks, as the readers' open does);
 * GROVE_E_IO when path cannot be stat'ed.  Any thread. */
grove_status grove_file_stamp_of(const char *path, grove_file_stamp *out, grove_err *err);
bool grove_file_stamp_same(const grove_file_stamp *a, const grove_file_stamp *b);
/* GROVE_OK when path's stamp is still then; else GROVE_E_IO, the message
 * naming path: "the file changed while the model was being built from it"
 * (a loader checks this last, before it hands out what it built from the
 * file, so that nothing serves a file that is no longer on disk).  Any
 * thread. */
grove_status grove_file_stamp_check(const char *path, const grove_file_stamp *then, grove_err *err);

/* Removes from dir the temporaries of this library's atomic writes (hidden
 * ".NAME.grove-tmp.PID.N", and "weights.*.tmp.PID.N" of older versions)
 * whose writer is gone: a process that no longer exists, or this very
 * process (call it before writing anything into dir, as groved does at
 * start).  A temporary of a live writer stays.  *removed (may be NULL)
 * counts what went.  The first failure to remove one is the error; the scan
 * goes on.  Any thread. */
grove_status grove_checkpoint_remove_stale_temps(const char *dir, size_t *removed, grove_err *err);

/* Reads a torch.save zip archive (.pt/.pth/.bin) with a restricted unpickler
 * that never runs code (docs/checkpoints.md).  Same contract as
 * grove_safetensors_read, except that a tensor may be a strided view of its
 * storage (as torch.load gives it: a transposed weight, an expanded tensor
 * of stride 0), never a copy: test grove_tensor_is_contiguous before using
 * its bytes as a flat array, or copy it (grove_tensor_copy and _clone take
 * any strides). */
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

/* ------------------------------------------------------------ file plans */

/* A checkpoint file described instead of written (core/io/export_plan.c): the
 * exact bytes grove_safetensors_write or grove_torch_write would write for a
 * state_dict, as a list of segments (headers, pickle and zip records owned by
 * the plan, the tensors' data referenced in place), so that any byte range of
 * the file can be produced on demand without building the file in memory.
 * groved streams the serving state_dict this way (ExportStateDict).
 *
 * Ownership: the plan holds a reference to every tensor whose bytes it
 * refers to (and a contiguous copy of any strided one), so the state_dict may
 * be freed as soon as the plan is made; the tensors' data must not change
 * while the plan lives (a served tree's never does).  Threads: making a plan
 * reads sd (no one may modify it meanwhile); a finished plan is immutable, so
 * any number of threads may read from it at once; it is freed once, when no
 * read is running. */
typedef struct grove_file_plan grove_file_plan;

/* The plan of grove_safetensors_write(path, sd): same header (key order,
 * offsets, {"format": "pt"} metadata, space padding) and the same data order.
 * Same refusals as the writer.  *out is new and the caller's. */
grove_status grove_safetensors_plan(const grove_state_dict *sd, grove_file_plan **out,
                                    grove_err *err);
/* The plan of grove_torch_write(path, sd) where archive is the folder inside
 * the zip: grove_torch_write names it grove_torch_archive_name(path); NULL or
 * "" means "archive".  Reads every distinct tensor once (the zip headers carry
 * CRC-32s).  *out is new and the caller's. */
grove_status grove_torch_plan(const grove_state_dict *sd, const char *archive,
                              grove_file_plan **out, grove_err *err);
/* The folder torch.save (and grove_torch_write) names the archive after:
 * path's base name without its last extension, "archive" when that is
 * empty.  New malloc'd string, NULL when out of memory. */
char *grove_torch_archive_name(const char *path);

/* The file's size in bytes, its number of keys, its format. */
uint64_t grove_file_plan_size(const grove_file_plan *p);
size_t grove_file_plan_tensors(const grove_file_plan *p);
grove_ckpt_format grove_file_plan_format(const grove_file_plan *p);
/* Copies the file's bytes [offset, offset + len) into buf.  GROVE_E_RANGE
 * when the range reaches past the end. */
grove_status grove_file_plan_read(const grove_file_plan *p, uint64_t offset, void *buf, size_t len,
                                  grove_err *err);
/* NULL is a no-op.  Drops the plan's tensor references. */
void grove_file_plan_free(grove_file_plan *p);

#ifdef __cplusplus
}
#endif
#endif
