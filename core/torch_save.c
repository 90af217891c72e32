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
 * The file is written under a temporary name beside the target, fsync'd and
 * renamed: a failure leaves no half file.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"
#include "torch_internal.h"

/* ================================================================ pickle out */

typedef struct pkbuf {
  uint8_t *p;
  size_t n, cap;
  bool oom;
  uint32_t memo; /* next memo index */
} pkbuf;

static void put(pkbuf *b, const void *data, size_t n) {
  if (b->oom) return;
  if (n > b->cap - b->n) {
    size_t cap = b->cap ? b->cap : 4096;
    while (cap - b->n < n) {
      if (cap > SIZE_MAX / 2) {
        b->oom = true;
        return;
      }
      cap *= 2;
    }
    uint8_t *p = realloc(b->p, cap);
    if (!p) {
      b->oom = true;
      return;
    }
    b->p = p;
    b->cap = cap;
  }
  memcpy(b->p + b->n, data, n);
  b->n += n;
}

static void op(pkbuf *b, uint8_t o) {
  put(b, &o, 1);
}

static void op_u32(pkbuf *b, uint8_t o, uint32_t v) {
  uint8_t x[5] = {o, (uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
  put(b, x, 5);
}

/* Memoizes the value on top of the stack; returns its index. */
static uint32_t memo_put(pkbuf *b) {
  uint32_t i = b->memo++;
  if (i < 256) {
    uint8_t x[2] = {'q', (uint8_t)i};
    put(b, x, 2);
  } else {
    op_u32(b, 'r', i);
  }
  return i;
}

static void memo_get(pkbuf *b, uint32_t i) {
  if (i < 256) {
    uint8_t x[2] = {'h', (uint8_t)i};
    put(b, x, 2);
  } else {
    op_u32(b, 'j', i);
  }
}

static void str(pkbuf *b, const char *s) {
  size_t n = strlen(s);
  op_u32(b, 'X', (uint32_t)n); /* lengths were checked to fit */
  put(b, s, n);
}

static void integer(pkbuf *b, int64_t v) {
  if (v >= 0 && v < 256) {
    uint8_t x[2] = {'K', (uint8_t)v};
    put(b, x, 2);
  } else if (v >= 0 && v < 65536) {
    uint8_t x[3] = {'M', (uint8_t)v, (uint8_t)(v >> 8)};
    put(b, x, 3);
  } else if (v >= INT32_MIN && v <= INT32_MAX) {
    op_u32(b, 'J', (uint32_t)(int32_t)v);
  } else {
    /* LONG1: little-endian two's complement, as short as Python writes. */
    uint8_t x[10] = {0x8a, 8};
    uint64_t u = (uint64_t)v;
    for (int i = 0; i < 8; i++) x[2 + i] = (uint8_t)(u >> (8 * i));
    int n = 8;
    while (n > 1 && ((x[1 + n] == 0x00 && !(x[n] & 0x80)) || (x[1 + n] == 0xFF && (x[n] & 0x80))))
      n--;
    x[1] = (uint8_t)n;
    put(b, x, 2 + (size_t)n);
  }
}

static void int_tuple(pkbuf *b, int n, const int64_t *v) {
  if (n == 0) {
    op(b, ')');
    return;
  }
  if (n > 3) op(b, '(');
  for (int i = 0; i < n; i++) integer(b, v[i]);
  op(b, n == 1 ? 0x85 : n == 2 ? 0x86 : n == 3 ? 0x87 : 't');
}

static void global(pkbuf *b, const char *module, const char *name) {
  op(b, 'c');
  put(b, module, strlen(module));
  op(b, '\n');
  put(b, name, strlen(name));
  op(b, '\n');
}

/* ================================================================ plan */

static const char *storage_class(grove_dtype dt) {
  switch (dt) {
    case GROVE_F32:
      return "FloatStorage";
    case GROVE_F16:
      return "HalfStorage";
    case GROVE_BF16:
      return "BFloat16Storage";
    case GROVE_F64:
      return "DoubleStorage";
    case GROVE_I64:
      return "LongStorage";
    case GROVE_I32:
      return "IntStorage";
    case GROVE_I16:
      return "ShortStorage";
    case GROVE_I8:
      return "CharStorage";
    case GROVE_U8:
      return "ByteStorage";
    case GROVE_BOOL:
      return "BoolStorage";
    default:
      return NULL;
  }
}

/* UTF-8 as Python's pickle writes it: strict, except that lone surrogates
 * pass (pickle encodes str with "surrogatepass", and the reader accepts
 * them), so that every key Grove reads can be written back. */
static bool utf8_ok(const char *s, size_t len) {
  return grove__utf8_invalid_at((const uint8_t *)s, len, true) == len;
}

static grove_status check_writable(const grove_state_dict *sd, const char *name, grove_err *err) {
  for (size_t i = 0, n = grove_sd_count(sd); i < n; i++) {
    const char *key = grove_sd_key(sd, i);
    const grove_tensor *t = grove_sd_tensor(sd, i);
    size_t klen = strlen(key);
    if (klen > 0xFFFFFFFFu || !utf8_ok(key, klen))
      return grove_err_set(err, GROVE_E_BAD_UTF8, "%s: key '%s' is not valid UTF-8", name, key);
    if (!t || !storage_class(t->dtype))
      return grove_err_set(err, GROVE_E_DTYPE, "%s: key '%s': no tensor or an invalid dtype", name,
                           key);
  }
  for (size_t i = 0, n = grove_sd_meta_count(sd); i < n; i++) {
    const char *p = grove_sd_meta_prefix(sd, i);
    if (!utf8_ok(p, strlen(p)))
      return grove_err_set(err, GROVE_E_BAD_UTF8, "%s: module prefix '%s' is not valid UTF-8", name,
                           p);
  }
  return GROVE_OK;
}

static bool same_view(const grove_tensor *a, const grove_tensor *b) {
  if (a == b) return true;
  if (a->storage != b->storage || a->data != b->data || a->dtype != b->dtype || a->ndim != b->ndim)
    return false;
  for (int i = 0; i < a->ndim; i++)
    if (a->shape[i] != b->shape[i] || a->strides[i] != b->strides[i]) return false;
  return true;
}

/* storage_of[i]: the storage key (index into the distinct list) of tensor
 * i; first[k]: the tensor that storage k is written from.  Views are
 * matched through a hash of their data pointer. */
static grove_status plan_storages(const grove_state_dict *sd, size_t *storage_of, size_t *first,
                                  size_t *nstorages) {
  size_t n = grove_sd_count(sd), cap = 16;
  while (cap < 2 * n) cap *= 2;
  size_t *table = malloc(cap * sizeof *table); /* tensor index + 1, 0 = empty */
  if (!table) return GROVE_E_NOMEM;
  memset(table, 0, cap * sizeof *table);
  size_t k = 0;
  for (size_t i = 0; i < n; i++) {
    const grove_tensor *t = grove_sd_tensor(sd, i);
    uintptr_t h = (uintptr_t)t->data;
    h ^= h >> 17;
    h *= (uintptr_t)0x9E3779B97F4A7C15ull;
    size_t j = (size_t)(h >> 7) & (cap - 1);
    bool found = false;
    for (; table[j]; j = (j + 1) & (cap - 1)) {
      if (same_view(grove_sd_tensor(sd, table[j] - 1), t)) {
        storage_of[i] = storage_of[table[j] - 1];
        found = true;
        break;
      }
    }
    if (!found) {
      table[j] = i + 1;
      first[k] = i;
      storage_of[i] = k++;
    }
  }
  free(table);
  *nstorages = k;
  return GROVE_OK;
}

/* ================================================================ pickle */

static void build_pickle(pkbuf *b, const grove_state_dict *sd, const size_t *storage_of) {
  size_t n = grove_sd_count(sd);
  uint32_t m_od, m_rebuild = UINT32_MAX, m_storage = UINT32_MAX, m_cpu = UINT32_MAX,
                 m_version = UINT32_MAX;
  uint32_t m_class[GROVE_DTYPE_COUNT];
  for (int i = 0; i < GROVE_DTYPE_COUNT; i++) m_class[i] = UINT32_MAX;
  uint8_t proto[2] = {0x80, 2};
  put(b, proto, 2);
  global(b, "collections", "OrderedDict");
  m_od = memo_put(b);
  op(b, ')');
  op(b, 'R');
  memo_put(b);

  /* Items in batches of 1000 per SETITEMS, as Python's pickler does. */
  for (size_t i = 0; i < n; i++) {
    if (i % 1000 == 0) op(b, '(');
    const grove_tensor *t = grove_sd_tensor(sd, i);
    str(b, grove_sd_key(sd, i));
    memo_put(b);
    if (m_rebuild == UINT32_MAX) {
      global(b, "torch._utils", "_rebuild_tensor_v2");
      m_rebuild = memo_put(b);
    } else {
      memo_get(b, m_rebuild);
    }
    op(b, '(');
    /* The persistent id ('storage', torch.XStorage, key, 'cpu', numel). */
    op(b, '(');
    if (m_storage == UINT32_MAX) {
      str(b, "storage");
      m_storage = memo_put(b);
    } else {
      memo_get(b, m_storage);
    }
    if (m_class[t->dtype] == UINT32_MAX) {
      global(b, "torch", storage_class(t->dtype));
      m_class[t->dtype] = memo_put(b);
    } else {
      memo_get(b, m_class[t->dtype]);
    }
    char key[32];
    snprintf(key, sizeof key, "%zu", storage_of[i]);
    str(b, key);
    if (m_cpu == UINT32_MAX) {
      str(b, "cpu");
      m_cpu = memo_put(b);
    } else {
      memo_get(b, m_cpu);
    }
    integer(b, grove_tensor_numel(t));
    op(b, 't');
    op(b, 'Q'); /* BINPERSID */
    integer(b, 0);
    int64_t strides[GROVE_MAX_DIMS];
    grove_contiguous_strides(t->ndim, t->shape, strides);
    int_tuple(b, t->ndim, t->shape);
    int_tuple(b, t->ndim, strides);
    op(b, 0x89); /* requires_grad=False */
    memo_get(b, m_od);
    op(b, ')');
    op(b, 'R'); /* backward_hooks=OrderedDict() */
    op(b, 't');
    op(b, 'R');
    if (i % 1000 == 999 || i + 1 == n) op(b, 'u');
  }

  /* BUILD {"_metadata": OrderedDict(prefix -> {"version": v})}. */
  op(b, '}');
  str(b, "_metadata");
  memo_get(b, m_od);
  op(b, ')');
  op(b, 'R');
  size_t nm = grove_sd_meta_count(sd);
  for (size_t i = 0; i < nm; i++) {
    if (i % 1000 == 0) op(b, '(');
    str(b, grove_sd_meta_prefix(sd, i));
    op(b, '}');
    if (m_version == UINT32_MAX) {
      str(b, "version");
      m_version = memo_put(b);
    } else {
      memo_get(b, m_version);
    }
    integer(b, grove_sd_meta_version(sd, i));
    op(b, 's');
    if (i % 1000 == 999 || i + 1 == nm) op(b, 'u');
  }
  op(b, 's');
  op(b, 'b');
  op(b, '.');
}

/* ================================================================ archive */

static grove_status write_archive(grove__zipw *w, const grove_state_dict *sd, const char *archive,
                                  const char *name, grove_err *err) {
  grove_status st = check_writable(sd, name, err);
  if (st != GROVE_OK) return st;
  size_t n = grove_sd_count(sd);
  size_t *storage_of = malloc((n ? n : 1) * sizeof *storage_of);
  size_t *first = malloc((n ? n : 1) * sizeof *first);
  size_t nstorages = 0;
  pkbuf b = {0};
  if (!storage_of || !first || plan_storages(sd, storage_of, first, &nstorages) != GROVE_OK) {
    st = grove_err_set(err, GROVE_E_NOMEM, "%s: out of memory", name);
    goto done;
  }
  build_pickle(&b, sd, storage_of);
  if (b.oom) {
    st = grove_err_set(err, GROVE_E_NOMEM, "%s: out of memory", name);
    goto done;
  }

  size_t alen = strlen(archive);
  char *rec = malloc(alen + 64);
  if (!rec) {
    st = grove_err_set(err, GROVE_E_NOMEM, "%s: out of memory", name);
    goto done;
  }
  snprintf(rec, alen + 64, "%s/data.pkl", archive);
  st = grove__zipw_add(w, rec, b.p, b.n, err);
  snprintf(rec, alen + 64, "%s/byteorder", archive);
  if (st == GROVE_OK) st = grove__zipw_add(w, rec, "little", 6, err);
  for (size_t k = 0; k < nstorages && st == GROVE_OK; k++) {
    const grove_tensor *t = grove_sd_tensor(sd, first[k]);
    size_t nbytes = grove_tensor_nbytes(t);
    snprintf(rec, alen + 64, "%s/data/%zu", archive, k);
    if (grove_tensor_is_contiguous(t) || nbytes == 0) {
      st = grove__zipw_add(w, rec, t->data, nbytes, err);
    } else {
      void *tmp = malloc(nbytes);
      if (!tmp) {
        st = grove_err_set(err, GROVE_E_NOMEM, "%s: key '%s': out of memory", name,
                           grove_sd_key(sd, first[k]));
        break;
      }
      grove__tensor_gather(t, tmp);
      st = grove__zipw_add(w, rec, tmp, nbytes, err);
      free(tmp);
    }
  }
  snprintf(rec, alen + 64, "%s/version", archive);
  if (st == GROVE_OK) st = grove__zipw_add(w, rec, "3\n", 2, err);
  if (st == GROVE_OK) st = grove__zipw_finish(w, err);
  free(rec);
done:
  free(b.p);
  free(storage_of);
  free(first);
  return st;
}

/* torch's writer names the folder after the file: its base name without
 * the last extension. */
static char *archive_name(const char *path) {
  const char *base = strrchr(path, '/');
  base = base ? base + 1 : path;
  const char *dot = strrchr(base, '.');
  size_t n = dot ? (size_t)(dot - base) : strlen(base);
  if (n == 0) return grove__strdup("archive");
  char *s = malloc(n + 1);
  if (!s) return NULL;
  memcpy(s, base, n);
  s[n] = '\0';
  return s;
}

grove_status grove__torch_write_buffer(const grove_state_dict *sd, const char *archive,
                                       const grove__torch_write_opts *opts, uint8_t **out,
                                       size_t *len, grove_err *err) {
  *out = NULL;
  *len = 0;
  if (!sd || !archive)
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT, "grove_torch_write: NULL state_dict");
  grove__zipw *w = grove__zipw_new(-1, "<buffer>", opts ? &opts->zip : NULL);
  if (!w) return grove_err_set(err, GROVE_E_NOMEM, "<buffer>: out of memory");
  grove_status st = write_archive(w, sd, archive, "<buffer>", err);
  if (st == GROVE_OK) {
    size_t n;
    const uint8_t *data = grove__zipw_data(w, &n);
    *out = malloc(n ? n : 1);
    if (!*out) {
      st = grove_err_set(err, GROVE_E_NOMEM, "<buffer>: out of memory");
    } else {
      memcpy(*out, data, n);
      *len = n;
    }
  }
  grove__zipw_free(w);
  return st;
}

grove_status grove__torch_write(const char *path, const grove_state_dict *sd,
                                const grove__torch_write_opts *opts, grove_err *err) {
  if (!path || !sd)
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT,
                         "grove_torch_write: NULL path or state_dict");
  grove_status st = check_writable(sd, path, err);
  if (st != GROVE_OK) return st;
  char *archive = archive_name(path);
  if (!archive) return grove_err_set(err, GROVE_E_NOMEM, "%s: out of memory", path);
  grove__atomic_file f;
  st = grove__atomic_open(&f, path, err);
  if (st != GROVE_OK) {
    free(archive);
    return st;
  }
  int fd = f.fd;
  grove__zipw *w = grove__zipw_new(fd, path, opts ? &opts->zip : NULL);
  if (!w)
    st = grove_err_set(err, GROVE_E_NOMEM, "%s: out of memory", path);
  else
    st = write_archive(w, sd, archive, path, err);
  grove__zipw_free(w);
  free(archive);
  return grove__atomic_finish(&f, st, err);
}

grove_status grove_torch_write(const char *path, const grove_state_dict *sd, grove_err *err) {
  return grove__torch_write(path, sd, NULL, err);
}
