/* fileio.h: the file plumbing of core/io/ (fileio.c), which the checkpoint
 * readers and writers, model.c and optim_io.c share.  Never installed
 * (tests may include it). */
#ifndef GROVE_CORE_FILEIO_H
#define GROVE_CORE_FILEIO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "grove/grove.h"
#include "tensor_internal.h"

/* ------------------------------------------------------------ files */

/* Reads the whole of path into a new storage the caller owns (an empty file
 * gives an empty storage), checking that nothing wrote to the file while it
 * was read: same size, mtime and ctime before and after, no byte past
 * the end.  A file that changed is GROVE_E_IO ("changed while it was being
 * read"), so the bytes are always one state of the file, and nothing done to
 * the file later reaches them.  Only I/O problems are errors here: the
 * parsers judge the content.  Any thread. */
grove_status grove__read_file(const char *path, grove_storage **out, grove_err *err);

/* Writes a file atomically: open() creates a unique temporary file beside
 * path (hidden: ".BASE.grove-tmp.PID.N"); write to f->fd; finish(st) fsyncs, closes and renames it
 * into place when st is GROVE_OK (and everything succeeds), else removes it, so that a failed write
 * leaves nothing.  Returns the final status. */
typedef struct grove__atomic_file {
  const char *path; /* borrowed */
  char *tmp;
  int fd;
} grove__atomic_file;
grove_status grove__atomic_open(grove__atomic_file *f, const char *path, grove_err *err);
grove_status grove__atomic_finish(grove__atomic_file *f, grove_status st, grove_err *err);
/* write() until done; -1 with errno on failure. */
int grove__write_all(int fd, const void *buf, size_t n);

#endif
