/* torch_save.c: writing a state_dict as torch.save does (grove_torch_write).
 *
 * The archive is what torch.save(model.state_dict(), "NAME.pt") writes:
 *
 *   NAME/data.pkl    protocol 2 pickle of an OrderedDict: key ->
 *                    _rebuild_tensor_v2(storage, 0, size, stride, False,
 *                    OrderedDict()), then BUILD with {"_metadata":
 *                    OrderedDict(prefix -> {"version": v})} from the map's
 *                    module versions
 *   NAME/byteorder   "little" (PyTorch >= 2.1 writes it; older ones ignore it)
 *   NAME/data/K      each storage's bytes, stored (not deflated), 64-byte
 *                    aligned so that a reader can map them in place
 *   NAME/version     "3\n"
 *
 * NAME is the file name without its directory and last extension, as
 * torch's writer names it ("archive" when that is empty).  Only opcodes and
 * globals of torch.load(weights_only=True) are used, so PyTorch 1.13 and
 * later load the file with weights_only=True.
 *
 * Storages: one per distinct tensor view.  A tensor held under two keys
 * (tied weights: one grove_tensor, two references) is written once and both
 * keys refer to it, so torch.load gives two tensors sharing one storage, as
 * torch.save of a tied state_dict does.  Every storage is written
 * contiguous: a non-contiguous tensor is gathered first.
 *
 * The layout is built once, as a file plan (core/io/export_plan.c: pickle,
 * storages and zip records, the zip headers encoded by core/io/torch_zip.c's
 * grove__zip_dir), which groved also streams for ExportStateDict; this
 * file only turns that plan into a file or a buffer.  Non-contiguous
 * tensors are copied contiguous while planning.
 *
 * The file is written under a temporary name beside the target, fsync'd and
 * renamed: a failure leaves no half file.
 */
#include <stdlib.h>

#include "export_plan.h"
#include "fileio.h"
#include "torch_internal.h"

grove_status grove__torch_write_buffer(const grove_state_dict *sd, const char *archive,
                                       const grove__torch_write_opts *opts, uint8_t **out,
                                       size_t *len, grove_err *err) {
  *out = NULL;
  *len = 0;
  if (!sd || !archive)
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT, "grove_torch_write: NULL state_dict");
  grove_file_plan *p = NULL;
  grove_status st = grove__torch_plan_ex(sd, archive, opts ? &opts->zip : NULL, &p, err);
  if (st != GROVE_OK) {
    grove_err_prefix(err, "<buffer>");
    return st;
  }
  size_t n = (size_t)grove_file_plan_size(p);
  *out = malloc(n ? n : 1);
  if (!*out) {
    st = grove_err_set(err, GROVE_E_NOMEM, "<buffer>: out of memory");
  } else {
    st = grove_file_plan_read(p, 0, *out, n, err);
    *len = n;
  }
  grove_file_plan_free(p);
  return st;
}

grove_status grove__torch_write(const char *path, const grove_state_dict *sd,
                                const grove__torch_write_opts *opts, grove_err *err) {
  if (!path || !sd)
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT,
                         "grove_torch_write: NULL path or state_dict");
  char *archive = grove_torch_archive_name(path);
  if (!archive) return grove_err_set(err, GROVE_E_NOMEM, "%s: out of memory", path);
  grove_file_plan *p = NULL;
  grove_status st = grove__torch_plan_ex(sd, archive, opts ? &opts->zip : NULL, &p, err);
  free(archive);
  return grove__file_plan_write(st, p, path, err);
}

grove_status grove_torch_write(const char *path, const grove_state_dict *sd, grove_err *err) {
  return grove__torch_write(path, sd, NULL, err);
}
