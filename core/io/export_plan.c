/* export_plan.c: checkpoint files described, not written (grove_file_plan).
 *
 * grove_safetensors_plan and grove_torch_plan lay out the bytes of a
 * safetensors file or a torch.save archive for a state_dict as an ordered
 * list of segments: bytes the plan owns (the safetensors header, the pickle,
 * zip headers and directory) and the tensors' own data, referenced in place.
 * Any byte range of the file is then produced on demand by copying from the
 * segments, so groved can stream a 2 GB live state_dict in bounded memory
 * (server/export.c) without ever building the file.
 *
 * This is the one implementation of both layouts: grove_safetensors_write
 * and grove_torch_write build the plan and stream its segments into the
 * file (grove__file_plan_write), so a served export and a written file are
 * the same bytes by construction.  The zip headers themselves are encoded by
 * core/io/torch_zip.c's grove__zip_dir, shared with the general zip writer.
 * tests/check_export.c still compares plans with written files, over
 * state_dicts that reach every branch (tied tensors, views, metadata, more
 * than 256 memo entries and 1000 keys, ZIP64 fields).
 *
 * Non-contiguous tensors: the plan refers to a contiguous copy of each
 * (grove_tensor_clone), made while planning and held until the plan is
 * freed, so writing a state_dict of strided views holds copies of all of
 * them at once (the data of contiguous tensors is never copied).  Views
 * larger than their storages (expanded) are copied up to
 * GROVE_MAX_EXPANDED_COPY bytes beyond the storages' sizes in all, else
 * refused before any copy (check_expanded).
 *
 * Costs: the safetensors plan is one pass over the keys.  The torch plan
 * also reads every distinct tensor once, because the zip headers carry each
 * record's CRC-32 before its data. */
#include <assert.h>
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "export_plan.h"
#include "grove/checkpoint.h"
#include "fileio.h"
#include "torch_internal.h"

/* ================================================================ the plan */

typedef struct seg {
  uint64_t start; /* offset in the file */
  uint64_t len;
  const uint8_t *src; /* an owned blob or a held tensor's data */
} seg;

struct grove_file_plan {
  grove_ckpt_format format;
  uint64_t size;
  size_t ntensors;
  seg *segs;
  size_t nsegs, segcap;
  uint8_t **blobs; /* owned */
  size_t nblobs, blobcap;
  grove_tensor **held; /* one reference each */
  size_t nheld, heldcap;
  /* Builder state: owned bytes not yet cut into a blob. */
  uint8_t *pend;
  size_t npend, pendcap;
  bool oom;
};

static bool grow(void **p, size_t *cap, size_t need, size_t elem) {
  if (need <= *cap) return true;
  size_t c = *cap ? *cap : 16;
  while (c < need) {
    if (c > SIZE_MAX / 2 / elem) return false;
    c *= 2;
  }
  void *q = realloc(*p, c * elem);
  if (!q) return false;
  *p = q;
  *cap = c;
  return true;
}

static void add_seg(grove_file_plan *p, const uint8_t *src, uint64_t len) {
  if (p->oom || len == 0) return;
  if (!grow((void **)&p->segs, &p->segcap, p->nsegs + 1, sizeof *p->segs)) {
    p->oom = true;
    return;
  }
  p->segs[p->nsegs++] = (seg){.start = p->size, .len = len, .src = src};
  p->size += len;
}

/* Appends owned bytes; consecutive ones become one blob. */
static void put_own(grove_file_plan *p, const void *data, size_t n) {
  if (p->oom || n == 0) return;
  if (!grow((void **)&p->pend, &p->pendcap, p->npend + n, 1)) {
    p->oom = true;
    return;
  }
  memcpy(p->pend + p->npend, data, n);
  p->npend += n;
}

static void flush_own(grove_file_plan *p) {
  if (p->oom || p->npend == 0) return;
  if (!grow((void **)&p->blobs, &p->blobcap, p->nblobs + 1, sizeof *p->blobs)) {
    p->oom = true;
    return;
  }
  uint8_t *b = realloc(p->pend, p->npend); /* shrink to fit */
  if (!b) b = p->pend;
  p->blobs[p->nblobs++] = b;
  add_seg(p, b, p->npend);
  p->pend = NULL;
  p->npend = p->pendcap = 0;
}

/* Appends len bytes of data that t holds (t is retained by the plan). */
static void put_ref(grove_file_plan *p, grove_tensor *t, const void *data, uint64_t len) {
  if (p->oom) return;
  flush_own(p);
  if (!grow((void **)&p->held, &p->heldcap, p->nheld + 1, sizeof *p->held)) {
    p->oom = true;
    return;
  }
  grove_tensor_retain(t);
  p->held[p->nheld++] = t;
  add_seg(p, data, len);
}

void grove_file_plan_free(grove_file_plan *p) {
  if (!p) return;
  for (size_t i = 0; i < p->nblobs; i++) free(p->blobs[i]);
  for (size_t i = 0; i < p->nheld; i++) grove_tensor_release(p->held[i]);
  free(p->blobs);
  free(p->held);
  free(p->segs);
  free(p->pend);
  free(p);
}

uint64_t grove_file_plan_size(const grove_file_plan *p) {
  return p ? p->size : 0;
}

size_t grove_file_plan_tensors(const grove_file_plan *p) {
  return p ? p->ntensors : 0;
}

grove_ckpt_format grove_file_plan_format(const grove_file_plan *p) {
  return p ? p->format : GROVE_CKPT_UNKNOWN;
}

grove_status grove_file_plan_read(const grove_file_plan *p, uint64_t offset, void *buf, size_t len,
                                  grove_err *err) {
  if (!p || (!buf && len))
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT, "grove_file_plan_read: no plan or buffer");
  if (offset > p->size || len > p->size - offset)
    return grove_err_set(
        err, GROVE_E_RANGE, "bytes [%llu, %llu) reach past the end of the %llu-byte file",
        (unsigned long long)offset, (unsigned long long)offset + len, (unsigned long long)p->size);
  if (len == 0) return GROVE_OK;
  /* The last segment that starts at or before offset. */
  size_t lo = 0, hi = p->nsegs;
  while (hi - lo > 1) {
    size_t mid = lo + (hi - lo) / 2;
    if (p->segs[mid].start <= offset)
      lo = mid;
    else
      hi = mid;
  }
  uint8_t *out = buf;
  for (size_t i = lo; len > 0 && i < p->nsegs; i++) {
    const seg *s = &p->segs[i];
    uint64_t skip = offset > s->start ? offset - s->start : 0;
    if (skip >= s->len) continue;
    size_t n = (size_t)(s->len - skip < len ? s->len - skip : len);
    memcpy(out, s->src + skip, n);
    out += n;
    len -= n;
    offset += n;
  }
  assert(len == 0); /* the segments tile [0, size) */
  return GROVE_OK;
}

grove_status grove__file_plan_write(grove_status planned, grove_file_plan *p, const char *path,
                                    grove_err *err) {
  if (planned != GROVE_OK) {
    grove_err_prefix(err, "%s", path);
    grove_file_plan_free(p);
    return planned;
  }
  grove__atomic_file f;
  grove_status st = grove__atomic_open(&f, path, err);
  if (st == GROVE_OK) {
    for (size_t i = 0; i < p->nsegs && st == GROVE_OK; i++)
      if (grove__write_all(f.fd, p->segs[i].src, (size_t)p->segs[i].len) != 0)
        st = grove_err_set(err, GROVE_E_IO, "%s: write failed: %s", path, strerror(errno));
    st = grove__atomic_finish(&f, st, err);
  }
  grove_file_plan_free(p);
  return st;
}

static grove_file_plan *plan_new(grove_ckpt_format f) {
  grove_file_plan *p = calloc(1, sizeof *p);
  if (p) p->format = f;
  return p;
}

/* Views that repeat elements (expanded tensors, stride 0, as torch_load
 * hands them out) are larger written out than the storages they read: eight
 * zeros(1).expand(2**24) in a 1.4 KB .pt are 512 MiB of copies.  Checked
 * before anything is copied: the tensors idx[0..n) of sd may be copied up
 * to GROVE_MAX_EXPANDED_COPY bytes beyond their storages' sizes in all;
 * past it, refused, naming the key that goes over. */
static grove_status check_expanded(const grove_state_dict *sd, const size_t *idx, size_t n,
                                   grove_err *err) {
  size_t spare = GROVE_MAX_EXPANDED_COPY;
  for (size_t j = 0; j < n; j++) {
    const grove_tensor *t = grove_sd_tensor(sd, idx[j]);
    if (grove_tensor_is_contiguous(t)) continue;
    size_t nbytes = grove_tensor_nbytes(t), have = grove_storage_nbytes(t->storage);
    if (nbytes <= have) continue;
    if (nbytes - have > spare) {
      char sh[200];
      return grove_err_set(
          err, GROVE_E_LIMIT,
          "key '%s': a view of shape %s repeats the elements of its %zu-byte storage (stride 0: "
          "an expanded tensor) into %zu bytes; Grove copies at most %zu bytes more than the "
          "views' storages per file (save t.clone() if the copy is meant)",
          grove_sd_key(sd, idx[j]), grove_shape_str(t->ndim, t->shape, sh, sizeof sh), have, nbytes,
          (size_t)GROVE_MAX_EXPANDED_COPY);
    }
    spare -= nbytes - have;
  }
  return GROVE_OK;
}

/* A tensor whose bytes can be referenced as they are: t itself when
 * contiguous, else a contiguous copy.  The result is a new reference. */
static grove_tensor *contiguous_ref(grove_tensor *t, const char *key, grove_err *err) {
  if (grove_tensor_is_contiguous(t)) {
    grove_tensor_retain(t);
    return t;
  }
  grove_err local = {0};
  grove_tensor *c = grove_tensor_clone(t, t->dtype, &local);
  if (!c)
    grove_err_set(err, local.code ? local.code : GROVE_E_NOMEM, "key '%s': %s", key,
                  grove_err_msg(&local));
  return c;
}

/* ================================================================ safetensors */

/* Refuses what cannot be written: the reserved key, keys that are not UTF-8
 * (JSON must be), missing tensors or invalid dtypes. */
static grove_status st_check(const grove_state_dict *sd, grove_err *err) {
  for (size_t i = 0, n = grove_sd_count(sd); i < n; i++) {
    const char *key = grove_sd_key(sd, i);
    const grove_tensor *t = grove_sd_tensor(sd, i);
    size_t klen = strlen(key);
    if (strcmp(key, "__metadata__") == 0)
      return grove_err_set(err, GROVE_E_KEY,
                           "key '__metadata__' is reserved by safetensors for metadata");
    if (grove__utf8_invalid_at((const uint8_t *)key, klen, false) != klen)
      return grove_err_set(err, GROVE_E_BAD_UTF8, "key '%s' is not valid UTF-8", key);
    if (!t || grove_dtype_size(t->dtype) == 0)
      return grove_err_set(err, GROVE_E_DTYPE, "key '%s': no tensor or an invalid dtype", key);
  }
  return GROVE_OK;
}

/* The JSON header text (unpadded) with the data offsets of begin; *out is
 * malloc'd by jansson and freed with free(). */
static grove_status st_header(const grove_state_dict *sd, const uint64_t *begin, char **out,
                              grove_err *err) {
  *out = NULL;
  json_t *root = json_object();
  json_t *meta = json_object();
  if (!root || !meta || json_object_set_new(meta, "format", json_string("pt")) != 0 ||
      json_object_set(root, "__metadata__", meta) != 0) {
    json_decref(meta);
    json_decref(root);
    return grove_err_set(err, GROVE_E_NOMEM, "out of memory");
  }
  json_decref(meta);
  grove_status st = GROVE_OK;
  for (size_t i = 0, count = grove_sd_count(sd); i < count && st == GROVE_OK; i++) {
    const char *key = grove_sd_key(sd, i);
    const grove_tensor *t = grove_sd_tensor(sd, i);
    uint64_t offset = begin[i], nbytes = grove_tensor_nbytes(t);
    json_t *shape = json_array();
    json_t *offs = json_array();
    json_t *entry = json_object();
    bool ok = shape && offs && entry;
    for (int d = 0; ok && d < t->ndim; d++)
      ok = json_array_append_new(shape, json_integer((json_int_t)t->shape[d])) == 0;
    ok = ok && json_array_append_new(offs, json_integer((json_int_t)offset)) == 0 &&
         json_array_append_new(offs, json_integer((json_int_t)(offset + nbytes))) == 0 &&
         json_object_set_new(entry, "dtype", json_string(grove_dtype_st_name(t->dtype))) == 0 &&
         json_object_set(entry, "shape", shape) == 0 &&
         json_object_set(entry, "data_offsets", offs) == 0 &&
         json_object_set(root, key, entry) == 0;
    json_decref(shape);
    json_decref(offs);
    json_decref(entry);
    if (!ok) st = grove_err_set(err, GROVE_E_NOMEM, "out of memory");
  }
  if (st == GROVE_OK && !(*out = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER)))
    st = grove_err_set(err, GROVE_E_NOMEM, "out of memory");
  json_decref(root);
  return st;
}

grove_status grove_safetensors_plan(const grove_state_dict *sd, grove_file_plan **out,
                                    grove_err *err) {
  if (out) *out = NULL;
  if (!sd || !out)
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT, "grove_safetensors_plan: NULL argument");
  grove_status st = st_check(sd, err);
  if (st) return st;
  size_t count = grove_sd_count(sd);
  size_t *order = malloc((count ? count : 1) * sizeof *order);
  uint64_t *begin = malloc((count ? count : 1) * sizeof *begin);
  grove_file_plan *p = plan_new(GROVE_CKPT_SAFETENSORS);
  char *hjson = NULL;
  if (!order || !begin || !p) {
    st = grove_err_set(err, GROVE_E_NOMEM, "out of memory");
    goto done;
  }
  /* The header lists the keys in sd's order, but the data goes in order of
   * decreasing element size (8, 4, 2, 1 bytes; sd order within a size), as
   * the reference writer does.  The data section starts 8-byte aligned and
   * each group's bytes are a multiple of its element size, so every tensor
   * is aligned to its element: all f32 tensors are zero-copy when read
   * back.  order: data position -> sd index; begin: sd index -> offset. */
  size_t k = 0;
  uint64_t offset = 0;
  for (size_t es = 8; es >= 1; es /= 2)
    for (size_t i = 0; i < count; i++) {
      const grove_tensor *t = grove_sd_tensor(sd, i);
      if (grove_dtype_size(t->dtype) != es) continue;
      order[k++] = i;
      begin[i] = offset;
      offset += grove_tensor_nbytes(t);
    }
  assert(k == count);
  if ((st = st_header(sd, begin, &hjson, err))) goto done;
  size_t hlen = strlen(hjson), padded = (hlen + 7) & ~(size_t)7;
  if (padded > GROVE_ST_MAX_HEADER) {
    st = grove_err_set(err, GROVE_E_HEADER_TOO_LARGE,
                       "the header would be %zu bytes, over the limit of %u", padded,
                       GROVE_ST_MAX_HEADER);
    goto done;
  }
  uint8_t lenbuf[8];
  uint64_t n64 = padded;
  for (int b = 0; b < 8; b++) lenbuf[b] = (uint8_t)(n64 >> (8 * b));
  put_own(p, lenbuf, 8);
  put_own(p, hjson, hlen);
  put_own(p, "        ", padded - hlen); /* so that the data starts 8-byte aligned */
  if (!st) st = check_expanded(sd, order, count, err);
  for (size_t j = 0; j < count && !st; j++) {
    grove_tensor *t = grove_sd_tensor(sd, order[j]);
    size_t nbytes = grove_tensor_nbytes(t);
    if (nbytes == 0) continue;
    grove_tensor *c = contiguous_ref(t, grove_sd_key(sd, order[j]), err);
    if (!c) {
      st = err ? err->code : GROVE_E_NOMEM;
      break;
    }
    put_ref(p, c, c->data, nbytes);
    grove_tensor_release(c);
  }
  flush_own(p);
  if (!st && p->oom) st = grove_err_set(err, GROVE_E_NOMEM, "out of memory");
done:
  free(hjson);
  free(order);
  free(begin);
  if (st) {
    grove_file_plan_free(p);
    return st;
  }
  p->ntensors = count;
  *out = p;
  return GROVE_OK;
}

/* ================================================================ pickle */

/* The protocol-2 pickle of core/io/torch_save.c's format comment, through
 * the pickle writer (pickle_write.c). */

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

static grove_status pt_check(const grove_state_dict *sd, grove_err *err) {
  for (size_t i = 0, n = grove_sd_count(sd); i < n; i++) {
    const char *key = grove_sd_key(sd, i);
    const grove_tensor *t = grove_sd_tensor(sd, i);
    size_t klen = strlen(key);
    if (klen > 0xFFFFFFFFu || !utf8_ok(key, klen))
      return grove_err_set(err, GROVE_E_BAD_UTF8, "key '%s' is not valid UTF-8", key);
    if (!t || !storage_class(t->dtype))
      return grove_err_set(err, GROVE_E_DTYPE, "key '%s': no tensor or an invalid dtype", key);
  }
  for (size_t i = 0, n = grove_sd_meta_count(sd); i < n; i++) {
    const char *pfx = grove_sd_meta_prefix(sd, i);
    if (!utf8_ok(pfx, strlen(pfx)))
      return grove_err_set(err, GROVE_E_BAD_UTF8, "module prefix '%s' is not valid UTF-8", pfx);
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

/* storage_of[i]: the storage (record) tensor i is written in; first[k]:
 * the tensor record k is written from.  One record per distinct view, in
 * order of first appearance. */
static grove_status plan_storages(const grove_state_dict *sd, size_t *storage_of, size_t *first,
                                  size_t *nstorages) {
  /* The distinct views by their data address (the hash table, base.h):
   * data -> the first record's tensor index + 1, and the records' tensors
   * of one address chained through next (index + 1, 0 = end), so that each
   * tensor is compared only with the views of its own address. */
  static const char no_data; /* the key of tensors without data (empty) */
  size_t n = grove_sd_count(sd);
  size_t *next = calloc(n ? n : 1, sizeof *next);
  grove__pmap by_data = {0};
  if (!next || !grove__pmap_reserve(&by_data, n)) {
    free(next);
    return GROVE_E_NOMEM;
  }
  size_t k = 0;
  for (size_t i = 0; i < n; i++) {
    const grove_tensor *t = grove_sd_tensor(sd, i);
    const void *key = t->data ? t->data : &no_data;
    size_t head = (size_t)(uintptr_t)grove__pmap_get(&by_data, key, NULL), j = head;
    while (j && !same_view(grove_sd_tensor(sd, j - 1), t)) j = next[j - 1];
    if (j) {
      storage_of[i] = storage_of[j - 1];
      continue;
    }
    next[i] = head; /* reserved: never fails */
    grove__pmap_put(&by_data, key, (void *)(uintptr_t)(i + 1));
    first[k] = i;
    storage_of[i] = k++;
  }
  grove__pmap_fini(&by_data);
  free(next);
  *nstorages = k;
  return GROVE_OK;
}

static void build_pickle(grove__pkw *b, const grove_state_dict *sd, const size_t *storage_of) {
  size_t n = grove_sd_count(sd);
  uint32_t m_od, m_rebuild = UINT32_MAX, m_storage = UINT32_MAX, m_cpu = UINT32_MAX,
                 m_version = UINT32_MAX;
  uint32_t m_class[GROVE_DTYPE_COUNT];
  for (int i = 0; i < GROVE_DTYPE_COUNT; i++) m_class[i] = UINT32_MAX;
  uint8_t proto[2] = {0x80, 2};
  grove__pkw_put(b, proto, 2);
  grove__pkw_global(b, "collections", "OrderedDict");
  m_od = grove__pkw_memo_put(b);
  grove__pkw_op(b, ')');
  grove__pkw_op(b, 'R');
  grove__pkw_memo_put(b);

  /* Items in batches of 1000 per SETITEMS, as Python's pickler does. */
  for (size_t i = 0; i < n; i++) {
    if (i % 1000 == 0) grove__pkw_op(b, '(');
    const grove_tensor *t = grove_sd_tensor(sd, i);
    grove__pkw_str(b, grove_sd_key(sd, i));
    grove__pkw_memo_put(b);
    if (m_rebuild == UINT32_MAX) {
      grove__pkw_global(b, "torch._utils", "_rebuild_tensor_v2");
      m_rebuild = grove__pkw_memo_put(b);
    } else {
      grove__pkw_memo_get(b, m_rebuild);
    }
    grove__pkw_op(b, '(');
    /* The persistent id ('storage', torch.XStorage, key, 'cpu', numel). */
    grove__pkw_op(b, '(');
    if (m_storage == UINT32_MAX) {
      grove__pkw_str(b, "storage");
      m_storage = grove__pkw_memo_put(b);
    } else {
      grove__pkw_memo_get(b, m_storage);
    }
    if (m_class[t->dtype] == UINT32_MAX) {
      grove__pkw_global(b, "torch", storage_class(t->dtype));
      m_class[t->dtype] = grove__pkw_memo_put(b);
    } else {
      grove__pkw_memo_get(b, m_class[t->dtype]);
    }
    char key[32];
    snprintf(key, sizeof key, "%zu", storage_of[i]);
    grove__pkw_str(b, key);
    if (m_cpu == UINT32_MAX) {
      grove__pkw_str(b, "cpu");
      m_cpu = grove__pkw_memo_put(b);
    } else {
      grove__pkw_memo_get(b, m_cpu);
    }
    grove__pkw_int(b, grove_tensor_numel(t));
    grove__pkw_op(b, 't');
    grove__pkw_op(b, 'Q'); /* BINPERSID */
    grove__pkw_int(b, 0);
    int64_t strides[GROVE_MAX_DIMS];
    grove_contiguous_strides(t->ndim, t->shape, strides);
    grove__pkw_int_tuple(b, t->ndim, t->shape);
    grove__pkw_int_tuple(b, t->ndim, strides);
    grove__pkw_op(b, 0x89); /* requires_grad=False */
    grove__pkw_memo_get(b, m_od);
    grove__pkw_op(b, ')');
    grove__pkw_op(b, 'R'); /* backward_hooks=OrderedDict() */
    grove__pkw_op(b, 't');
    grove__pkw_op(b, 'R');
    if (i % 1000 == 999 || i + 1 == n) grove__pkw_op(b, 'u');
  }

  /* BUILD {"_metadata": OrderedDict(prefix -> {"version": v})}. */
  grove__pkw_op(b, '}');
  grove__pkw_str(b, "_metadata");
  grove__pkw_memo_get(b, m_od);
  grove__pkw_op(b, ')');
  grove__pkw_op(b, 'R');
  size_t nm = grove_sd_meta_count(sd);
  for (size_t i = 0; i < nm; i++) {
    if (i % 1000 == 0) grove__pkw_op(b, '(');
    grove__pkw_str(b, grove_sd_meta_prefix(sd, i));
    grove__pkw_op(b, '}');
    if (m_version == UINT32_MAX) {
      grove__pkw_str(b, "version");
      m_version = grove__pkw_memo_put(b);
    } else {
      grove__pkw_memo_get(b, m_version);
    }
    grove__pkw_int(b, grove_sd_meta_version(sd, i));
    grove__pkw_op(b, 's');
    if (i % 1000 == 999 || i + 1 == nm) grove__pkw_op(b, 'u');
  }
  grove__pkw_op(b, 's');
  grove__pkw_op(b, 'b');
  grove__pkw_op(b, '.');
}

/* ================================================================ zip */

/* The archive's records, laid out by core/io/torch_zip.c's grove__zip_dir (the
 * one encoder of zip headers; grove__zipw writes the same bytes). */
typedef struct zplan {
  grove_file_plan *p;
  grove__zip_dir *dir;
  bool deflate; /* tests' deflated archives (grove__zipw_opts) */
} zplan;

/* One record: its local header (owned) and its data, owned (copied: the
 * small records, or deflated ones) or held (a tensor's bytes: t not NULL). */
static grove_status zadd(zplan *z, const char *record, grove_tensor *t, const void *data,
                         size_t len, grove_err *err) {
  grove_file_plan *p = z->p;
  const uint8_t *hdr = NULL;
  uint8_t *deflated = NULL;
  size_t hdr_len = 0, stored = len;
  grove_status st = GROVE_OK;
  if (z->deflate) st = grove__zip_deflate(data, len, &deflated, &stored, err);
  if (st == GROVE_OK)
    st = grove__zip_dir_add(z->dir, record, p->size + p->npend, grove__crc32(0, data, len), len,
                            stored, z->deflate ? 8 : 0, &hdr, &hdr_len, err);
  if (st == GROVE_OK) {
    put_own(p, hdr, hdr_len);
    if (deflated)
      put_own(p, deflated, stored);
    else if (t)
      put_ref(p, t, data, len);
    else
      put_own(p, data, len);
    if (p->oom) st = grove_err_set(err, GROVE_E_NOMEM, "out of memory");
  }
  free(deflated);
  return st;
}

static grove_status zfinish(zplan *z, grove_err *err) {
  grove_file_plan *p = z->p;
  const uint8_t *tail = NULL;
  size_t n = 0;
  grove_status st = grove__zip_dir_finish(z->dir, p->size + p->npend, &tail, &n, err);
  if (st != GROVE_OK) return st;
  put_own(p, tail, n);
  flush_own(p);
  return p->oom ? grove_err_set(err, GROVE_E_NOMEM, "out of memory") : GROVE_OK;
}

grove_status grove__torch_plan_ex(const grove_state_dict *sd, const char *archive,
                                  const grove__zipw_opts *opts, grove_file_plan **out,
                                  grove_err *err) {
  if (out) *out = NULL;
  if (!sd || !out)
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT, "grove_torch_plan: NULL argument");
  if (!archive || !*archive) archive = "archive";
  grove_status st = pt_check(sd, err);
  if (st) return st;
  size_t n = grove_sd_count(sd), nstorages = 0;
  size_t *storage_of = malloc((n ? n : 1) * sizeof *storage_of);
  size_t *first = malloc((n ? n : 1) * sizeof *first);
  size_t alen = strlen(archive);
  char *rec = malloc(alen + 64);
  grove__pkw b = {0};
  zplan z = {.p = plan_new(GROVE_CKPT_TORCH_ZIP),
             .dir = grove__zip_dir_new(opts && opts->force_zip64),
             .deflate = opts && opts->deflate};
  if (!storage_of || !first || !rec || !z.p || !z.dir ||
      plan_storages(sd, storage_of, first, &nstorages) != GROVE_OK) {
    st = grove_err_set(err, GROVE_E_NOMEM, "out of memory");
    goto done;
  }
  build_pickle(&b, sd, storage_of);
  if (b.oom) {
    st = grove_err_set(err, GROVE_E_NOMEM, "out of memory");
    goto done;
  }
  snprintf(rec, alen + 64, "%s/data.pkl", archive);
  st = zadd(&z, rec, NULL, b.p, b.n, err);
  snprintf(rec, alen + 64, "%s/byteorder", archive);
  if (!st) st = zadd(&z, rec, NULL, "little", 6, err);
  if (!st) st = check_expanded(sd, first, nstorages, err);
  for (size_t k = 0; k < nstorages && !st; k++) {
    grove_tensor *t = grove_sd_tensor(sd, first[k]);
    size_t nbytes = grove_tensor_nbytes(t);
    snprintf(rec, alen + 64, "%s/data/%zu", archive, k);
    if (nbytes == 0) {
      st = zadd(&z, rec, NULL, NULL, 0, err);
      continue;
    }
    grove_tensor *c = contiguous_ref(t, grove_sd_key(sd, first[k]), err);
    if (!c) {
      st = err ? err->code : GROVE_E_NOMEM;
      break;
    }
    st = zadd(&z, rec, c, c->data, nbytes, err);
    grove_tensor_release(c);
  }
  snprintf(rec, alen + 64, "%s/version", archive);
  if (!st) st = zadd(&z, rec, NULL, "3\n", 2, err);
  if (!st) st = zfinish(&z, err);
done:
  grove__zip_dir_free(z.dir);
  grove__pkw_fini(&b);
  free(rec);
  free(storage_of);
  free(first);
  if (st) {
    grove_file_plan_free(z.p);
    return st;
  }
  z.p->ntensors = n;
  *out = z.p;
  return GROVE_OK;
}

grove_status grove_torch_plan(const grove_state_dict *sd, const char *archive,
                              grove_file_plan **out, grove_err *err) {
  return grove__torch_plan_ex(sd, archive, NULL, out, err);
}

char *grove_torch_archive_name(const char *path) {
  if (!path) return grove__strdup("archive");
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
