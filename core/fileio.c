/* fileio.c: the file plumbing the checkpoint readers and writers share:
 * mapping a file as a refcounted storage, and writing a file atomically
 * (temporary name beside it, fsync, rename, fsync of the directory). */
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "internal.h"

typedef struct mapping {
  void *addr;
  size_t len;
} mapping;

static void unmap_release(void *ctx) {
  mapping *m = ctx;
  munmap(m->addr, m->len);
  free(m);
}

grove_status grove__map_file(const char *path, grove_storage **out, grove_err *err) {
  *out = NULL;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return grove_err_set(err, GROVE_E_IO, "%s: cannot open: %s", path, strerror(errno));
  struct stat sb;
  if (fstat(fd, &sb) != 0) {
    int e = errno;
    close(fd);
    return grove_err_set(err, GROVE_E_IO, "%s: cannot stat: %s", path, strerror(e));
  }
  if (!S_ISREG(sb.st_mode)) {
    close(fd);
    return grove_err_set(err, GROVE_E_IO, "%s: not a regular file", path);
  }
  if ((uint64_t)sb.st_size > SIZE_MAX / 2) {
    close(fd);
    return grove_err_set(err, GROVE_E_LIMIT, "%s: too large to map", path);
  }
  size_t len = (size_t)sb.st_size;
  if (len == 0) { /* mmap refuses empty files; the parsers say what is wrong */
    close(fd);
    *out = grove_storage_wrap(NULL, 0, NULL, NULL);
    return *out ? GROVE_OK : grove_err_set(err, GROVE_E_NOMEM, "%s: out of memory", path);
  }
  void *addr = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
  int map_errno = errno;
  close(fd); /* the mapping keeps the file */
  if (addr == MAP_FAILED)
    return grove_err_set(err, GROVE_E_IO, "%s: cannot mmap: %s", path, strerror(map_errno));
  mapping *m = malloc(sizeof *m);
  grove_storage *map = m ? grove_storage_wrap(addr, len, unmap_release, m) : NULL;
  if (!map) {
    munmap(addr, len);
    free(m);
    return grove_err_set(err, GROVE_E_NOMEM, "%s: out of memory", path);
  }
  m->addr = addr;
  m->len = len;
  *out = map;
  return GROVE_OK;
}

int grove__write_all(int fd, const void *buf, size_t n) {
  const uint8_t *p = buf;
  while (n > 0) {
    ssize_t w = write(fd, p, n > (1u << 30) ? (1u << 30) : n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    p += w;
    n -= (size_t)w;
  }
  return 0;
}

grove_status grove__atomic_open(grove__atomic_file *f, const char *path, grove_err *err) {
  /* A unique temporary name beside the target (same file system, so the
   * rename is atomic); the counter keeps two threads of one process apart. */
  static atomic_uint counter;
  unsigned seq = atomic_fetch_add(&counter, 1u);
  f->path = path;
  f->fd = -1;
  size_t tlen = strlen(path) + 64;
  f->tmp = malloc(tlen);
  if (!f->tmp) return grove_err_set(err, GROVE_E_NOMEM, "%s: out of memory", path);
  snprintf(f->tmp, tlen, "%s.tmp.%ld.%u", path, (long)getpid(), seq);
  f->fd = open(f->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (f->fd < 0) {
    grove_status st =
        grove_err_set(err, GROVE_E_IO, "%s: cannot create %s: %s", path, f->tmp, strerror(errno));
    free(f->tmp);
    f->tmp = NULL;
    return st;
  }
  return GROVE_OK;
}

/* fsyncs the directory holding path so that the rename is durable.  Best
 * effort: some file systems refuse to fsync a directory. */
static void sync_parent_dir(const char *path) {
  char *dir = grove__strdup(path);
  if (!dir) return;
  char *slash = strrchr(dir, '/');
  const char *d = ".";
  if (slash == dir)
    d = "/";
  else if (slash) {
    *slash = '\0';
    d = dir;
  }
  int fd = open(d, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    (void)fsync(fd);
    close(fd);
  }
  free(dir);
}

grove_status grove__atomic_finish(grove__atomic_file *f, grove_status st, grove_err *err) {
  if (st == GROVE_OK && fsync(f->fd) != 0)
    st = grove_err_set(err, GROVE_E_IO, "%s: fsync failed: %s", f->path, strerror(errno));
  if (close(f->fd) != 0 && st == GROVE_OK)
    st = grove_err_set(err, GROVE_E_IO, "%s: close failed: %s", f->path, strerror(errno));
  if (st == GROVE_OK && rename(f->tmp, f->path) != 0)
    st = grove_err_set(err, GROVE_E_IO, "%s: cannot rename %s into place: %s", f->path, f->tmp,
                       strerror(errno));
  if (st != GROVE_OK)
    unlink(f->tmp);
  else
    sync_parent_dir(f->path);
  free(f->tmp);
  f->tmp = NULL;
  f->fd = -1;
  return st;
}
