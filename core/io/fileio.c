/* fileio.c: the file plumbing the checkpoint readers and writers share:
 * reading a file whole into a refcounted storage (a snapshot that later
 * writes to the file cannot change), telling whether a file changed, and
 * writing a file atomically (hidden temporary name beside it, fsync, rename,
 * fsync of the directory) and removing the temporaries a killed writer
 * left. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "grove/checkpoint.h"
#include "fileio.h"

/* Checkpoints are read into memory the process owns, never mapped.  A
 * MAP_PRIVATE mapping shares the page cache with every writer of the file: a
 * `cp` over a model's weights while they are read turns the reads into
 * SIGBUS (past the new end of the file) or into bytes of the new file next
 * to bytes of the old one; a served version that borrowed the mapping would
 * fault in a worker's GEMM after a `truncate`.  A private copy cannot change
 * underneath, so a version, an export and a training replica all read bytes
 * that stay as they were read.  (docs/checkpoints.md, "Files that change on
 * disk", has the memory this costs.) */

static void id_from_stat(const struct stat *sb, grove_file_stamp *id) {
  id->dev = (uint64_t)sb->st_dev;
  id->ino = (uint64_t)sb->st_ino;
  id->size = (int64_t)sb->st_size;
  id->mtime_s = (int64_t)sb->st_mtim.tv_sec;
  id->mtime_ns = (int64_t)sb->st_mtim.tv_nsec;
  id->ctime_s = (int64_t)sb->st_ctim.tv_sec;
  id->ctime_ns = (int64_t)sb->st_ctim.tv_nsec;
}

grove_status grove_file_stamp_of(const char *path, grove_file_stamp *id, grove_err *err) {
  struct stat sb;
  if (stat(path, &sb) != 0)
    return grove_err_set(err, GROVE_E_IO, "%s: cannot stat: %s", path, strerror(errno));
  id_from_stat(&sb, id);
  return GROVE_OK;
}

bool grove_file_stamp_same(const grove_file_stamp *a, const grove_file_stamp *b) {
  return a->dev == b->dev && a->ino == b->ino && a->size == b->size && a->mtime_s == b->mtime_s &&
         a->mtime_ns == b->mtime_ns && a->ctime_s == b->ctime_s && a->ctime_ns == b->ctime_ns;
}

grove_status grove_file_stamp_check(const char *path, const grove_file_stamp *then,
                                    grove_err *err) {
  grove_file_stamp now;
  grove_err ignore = {0};
  if (grove_file_stamp_of(path, &now, &ignore) == GROVE_OK && grove_file_stamp_same(then, &now))
    return GROVE_OK;
  return grove_err_set(err, GROVE_E_IO,
                       "%s: the file changed while the model was being built from it; nothing "
                       "was loaded (load it again once the write is complete)",
                       path);
}

static grove_status changed(const char *path, grove_err *err) {
  return grove_err_set(err, GROVE_E_IO,
                       "%s: the file changed while it was being read (is a copy still being "
                       "written?); nothing was loaded from it",
                       path);
}

grove_status grove__read_file(const char *path, grove_storage **out, grove_err *err) {
  *out = NULL;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return grove_err_set(err, GROVE_E_IO, "%s: cannot open: %s", path, strerror(errno));
  struct stat sb;
  grove_status st = GROVE_OK;
  if (fstat(fd, &sb) != 0)
    st = grove_err_set(err, GROVE_E_IO, "%s: cannot stat: %s", path, strerror(errno));
  else if (!S_ISREG(sb.st_mode))
    st = grove_err_set(err, GROVE_E_IO, "%s: not a regular file", path);
  else if ((uint64_t)sb.st_size > SIZE_MAX / 2)
    st = grove_err_set(err, GROVE_E_LIMIT, "%s: too large to read", path);
  size_t len = st ? 0 : (size_t)sb.st_size;
  /* Large storages come zero-filled from anonymous mappings (tensor.c): the
   * pages cost nothing until the reads below fill them. */
  grove_storage *s = st ? NULL : grove_storage_new(len);
  if (!st && !s)
    st = grove_err_set(err, GROVE_E_NOMEM, "%s: out of memory for %zu bytes", path, len);
  uint8_t *p = s ? grove_storage_data(s) : NULL;
  size_t got = 0;
  while (!st && got < len) {
    size_t want = len - got > (1u << 30) ? (1u << 30) : len - got;
    ssize_t r = pread(fd, p + got, want, (off_t)got);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0)
      st = grove_err_set(err, GROVE_E_IO, "%s: read failed: %s", path, strerror(errno));
    else if (r == 0)
      st = changed(path, err); /* shorter than it was a moment ago */
    else
      got += (size_t)r;
  }
  /* The bytes are one state of the file only if nothing wrote to it while
   * they were read: the same size (and nothing past the end), the same
   * modification and change times.  (A file renamed over path meanwhile is
   * another inode: these bytes are still all the old one's.) */
  if (!st) {
    uint8_t extra;
    ssize_t r;
    do r = pread(fd, &extra, 1, (off_t)len);
    while (r < 0 && errno == EINTR);
    struct stat after;
    grove_file_stamp a, b;
    id_from_stat(&sb, &a);
    if (r != 0 || fstat(fd, &after) != 0)
      st = changed(path, err);
    else {
      id_from_stat(&after, &b);
      if (!grove_file_stamp_same(&a, &b)) st = changed(path, err);
    }
  }
  close(fd);
  if (st) {
    grove_storage_release(s);
    return st;
  }
  *out = s;
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

/* The temporary's name: ".BASE.grove-tmp.PID.N" beside path.  Hidden, so
 * that nothing listing the directory (a model directory's --watch, an
 * operator's ls, a glob for *.safetensors) takes it for a checkpoint, and
 * with the writer's pid, so that grove_checkpoint_remove_stale_temps can
 * tell one a killed writer left from one being written now. */
#define TMP_MARK ".grove-tmp."

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
  const char *slash = strrchr(path, '/');
  int dlen = slash ? (int)(slash - path + 1) : 0;
  snprintf(f->tmp, tlen, "%.*s.%s" TMP_MARK "%ld.%u", dlen, path, path + dlen, (long)getpid(), seq);
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

/* The writer's pid in a temporary's name: ".BASE.grove-tmp.PID.N", or the
 * name grove__atomic_open gave before it hid them, "BASE.tmp.PID.N" (only for
 * BASE a weights file, the one such name groved wrote into model
 * directories).  0 when name is neither. */
static long temp_owner(const char *name) {
  const char *p = NULL;
  if (name[0] == '.') {
    const char *m = strstr(name + 1, TMP_MARK);
    if (m && m > name + 1) p = m + strlen(TMP_MARK);
  } else if (strncmp(name, "weights.", 8) == 0) {
    const char *m = strstr(name, ".tmp.");
    if (m) p = m + 5;
  }
  if (!p || *p < '1' || *p > '9') return 0;
  char *end;
  errno = 0;
  long pid = strtol(p, &end, 10);
  if (errno || *end != '.' || !end[1]) return 0;
  for (const char *q = end + 1; *q; q++)
    if (*q < '0' || *q > '9') return 0;
  return pid;
}

grove_status grove_checkpoint_remove_stale_temps(const char *dir, size_t *removed, grove_err *err) {
  if (removed) *removed = 0;
  if (!dir) return grove_err_set(err, GROVE_E_INVALID_ARGUMENT, "no directory");
  DIR *d = opendir(dir);
  if (!d) return grove_err_set(err, GROVE_E_IO, "%s: cannot list: %s", dir, strerror(errno));
  grove_status st = GROVE_OK;
  struct dirent *e;
  while ((e = readdir(d))) {
    long pid = temp_owner(e->d_name);
    if (!pid) continue;
    /* Ours from an earlier life (a container's groved is pid 1 every time:
     * the caller has written nothing yet), or a writer that is gone. */
    if (pid != (long)getpid() && !(kill((pid_t)pid, 0) != 0 && errno == ESRCH)) continue;
    struct stat sb;
    if (fstatat(dirfd(d), e->d_name, &sb, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(sb.st_mode))
      continue;
    if (unlinkat(dirfd(d), e->d_name, 0) == 0) {
      if (removed) (*removed)++;
    } else if (!st) {
      st = grove_err_set(err, GROVE_E_IO, "%s/%s: cannot remove: %s", dir, e->d_name,
                         strerror(errno));
    }
  }
  closedir(d);
  return st;
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
