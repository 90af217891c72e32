/* checkpoint.c: recognising a checkpoint's format and dispatching to its
 * reader.
 *
 * Content decides before the name: a zip archive is a torch.save file
 * whatever it is called, and a file that starts like a safetensors header is
 * one.  The extension is only a fallback for files too short or too damaged
 * to tell, so that their reader can say precisely what is wrong with them.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "grove/checkpoint.h"
#include "fileio.h"

static bool has_ext(const char *path, const char *ext) {
  if (!path) return false;
  size_t n = strlen(path), e = strlen(ext);
  return n > e && strcasecmp(path + n - e, ext) == 0;
}

grove_ckpt_format grove_ckpt_detect(const char *path, const void *head, size_t head_len) {
  const uint8_t *h = head;
  if (h && head_len >= 4 && memcmp(h, "PK\x03\x04", 4) == 0) return GROVE_CKPT_TORCH_ZIP;
  if (h && head_len >= 9 && h[8] == '{') {
    uint64_t n = 0;
    memcpy(&n, h, 8); /* little-endian, as safetensors.c asserts */
    /* The smallest header is "{}". */
    if (n >= 2 && n <= GROVE_ST_MAX_HEADER) return GROVE_CKPT_SAFETENSORS;
  }
  /* A bare pickle (PROTO 2..5): torch's legacy pre-1.6 format, which the
   * torch reader reads (and any other pickle it refuses, with advice on
   * re-saving), whatever the file's name.
   * Checked after safetensors: a header length of 0x2??-0x5?? bytes starts
   * with the same two bytes (legacy files begin with a LONG1 magic number,
   * so their byte 8 is never '{'). */
  if (h && head_len >= 2 && h[0] == 0x80 && h[1] >= 2 && h[1] <= 5) return GROVE_CKPT_TORCH_ZIP;
  if (has_ext(path, ".safetensors")) return GROVE_CKPT_SAFETENSORS;
  if (has_ext(path, ".pt") || has_ext(path, ".pth") || has_ext(path, ".bin"))
    return GROVE_CKPT_TORCH_ZIP;
  return GROVE_CKPT_UNKNOWN;
}

grove_status grove_checkpoint_read(const char *path, grove_state_dict **out, grove_err *err) {
  if (out) *out = NULL;
  if (!path || !out)
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT, "grove_checkpoint_read: NULL path or out");

  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return grove_err_set(err, GROVE_E_IO, "%s: cannot open: %s", path, strerror(errno));
  uint8_t head[16];
  size_t got = 0;
  while (got < sizeof head) {
    ssize_t r = read(fd, head + got, sizeof head - got);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      int e = errno;
      close(fd);
      return grove_err_set(err, GROVE_E_IO, "%s: cannot read: %s", path, strerror(e));
    }
    if (r == 0) break;
    got += (size_t)r;
  }
  close(fd);

  switch (grove_ckpt_detect(path, head, got)) {
    case GROVE_CKPT_SAFETENSORS:
      return grove_safetensors_read(path, out, err);
    case GROVE_CKPT_TORCH_ZIP:
      return grove_torch_read(path, out, err);
    case GROVE_CKPT_UNKNOWN:
      break;
  }
  return grove_err_set(err, GROVE_E_FORMAT,
                       "%s: not a checkpoint Grove reads (neither safetensors nor a torch.save "
                       "zip archive)",
                       path);
}
