/* torch_load.c: reading torch.save checkpoints (grove_torch_read).
 *
 * A torch.save file (PyTorch >= 1.6) is a zip archive with one top-level
 * folder (named after the file, or "archive") holding:
 *   data.pkl      the pickled object; tensors in it refer to storages by
 *                 persistent id ('storage', StorageType, key, location, numel)
 *   data/<key>    each storage's raw bytes
 *   version       the archive format version ("3\n")
 *   byteorder     "little" or "big" (PyTorch >= 2.1; absent means little)
 *
 * The pickle is turned into a value tree by the restricted unpickler
 * (pickle.c); this file interprets it:
 *
 *   - The top level is a state_dict, or a dict holding one under
 *     "state_dict", "model" or "module" (checkpoints such as
 *     {"state_dict": sd, "epoch": 3}), searched in that order, up to four
 *     levels deep.  Its tensor values become the map, in order; non-tensor
 *     values are ignored; the OrderedDict's _metadata attribute becomes the
 *     map's module versions and never a key.
 *   - A tensor is _rebuild_tensor_v2 (or _rebuild_tensor, _v3), possibly
 *     wrapped in _rebuild_parameter(_with_state), a Parameter NEWOBJ or
 *     _rebuild_from_type_v2 of a plain Tensor / Parameter.
 *   - Storages are read once per key and shared: tied weights (two keys, one
 *     storage) come back as two tensors on one grove_storage.  Offsets and
 *     strides are in elements and checked, overflow-safe, against the
 *     storage, in grove__view_end.  Every tensor is a view of its storage,
 *     strides kept (a transposed weight, an expanded one of stride 0), as
 *     torch.load gives them: memory follows the file, not the numel.
 *   - Stored, little-endian, 4-byte aligned f32 storages of a file read whole
 *     are zero-copy (the contract of grove_safetensors_read); the rest is
 *     copied, inflated, and byte-swapped when the archive is big-endian.
 *
 * The legacy format (before 1.6, or _use_new_zipfile_serialization=False)
 * holds the same pickle and storages in another layout, which
 * torch_legacy.c reads; from there on the two are interpreted alike.
 *
 * Refused, with the file and the key named:
 *   TorchScript archives, tar archives (before 0.4), bare pickles
 *                                     -> GROVE_E_UNSUPPORTED, saying how to
 *                                        re-save them
 *   quantized, sparse, meta tensors, tensor subclasses
 *                                     -> GROVE_E_UNSUPPORTED
 *   dtypes Grove lacks (complex, ...) -> GROVE_E_BAD_DTYPE
 *   a view outside its storage        -> GROVE_E_BAD_OFFSETS
 *   a storage record of the wrong size, shapes overflowing 64 bits
 *                                     -> GROVE_E_BAD_SIZE
 *   more than GROVE_MAX_DIMS dims, too much metadata -> GROVE_E_LIMIT
 *   a tensor key named twice          -> GROVE_E_DUPLICATE_KEY
 *   anything else malformed           -> GROVE_E_FORMAT
 * plus whatever the zip reader and the unpickler refuse.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fileio.h"
#include "torch_internal.h"

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
               "Grove supports little-endian hosts only");

/* ================================================================ gather */

void grove__tensor_gather(const grove_tensor *t, void *dst) {
  size_t es = grove_dtype_size(t->dtype);
  int64_t n = grove_tensor_numel(t);
  if (n <= 0) return;
  if (grove_tensor_is_contiguous(t)) {
    memcpy(dst, t->data, (size_t)n * es);
    return;
  }
  int nd = t->ndim;
  int64_t inner = t->shape[nd - 1], istride = t->strides[nd - 1];
  int64_t idx[GROVE_MAX_DIMS] = {0};
  uint8_t *out = dst;
  const uint8_t *base = t->data;
  for (int64_t o = 0, outer = n / inner; o < outer; o++) {
    int64_t off = 0;
    for (int i = 0; i < nd - 1; i++) off += idx[i] * t->strides[i];
    const uint8_t *src = base + off * (int64_t)es;
    if (istride == 1) {
      memcpy(out, src, (size_t)inner * es);
      out += (size_t)inner * es;
    } else {
      size_t step = (size_t)istride * es;
      for (int64_t j = 0; j < inner; j++, src += step, out += es) memcpy(out, src, es);
    }
    for (int i = nd - 2; i >= 0; i--) {
      if (++idx[i] < t->shape[i]) break;
      idx[i] = 0;
    }
  }
}

/* ================================================================ loader */

typedef struct slot {
  const char *key; /* storage key (borrowed from the pickle) */
  grove_storage *s;
  grove_dtype dtype; /* the storage's element type */
  bool untyped;
  uint64_t numel;
} slot;

typedef struct loader {
  const char *name; /* the file, for messages */
  grove__zip zip;
  const grove__legacy *legacy; /* a legacy file's layout, else NULL (a zip) */
  const uint8_t *buf;          /* the file's bytes */
  char *prefix;                /* "archive/" */
  bool big_endian;
  grove_storage *map; /* the file read whole (grove__read_file), or NULL */
  grove_err *err;
  grove__pmap slots; /* storages read so far: a string map (base.h), key -> slot */
} loader;

static slot *slot_find(loader *ld, const char *key) {
  return grove__pmap_get(&ld->slots, key, NULL);
}

/* A new slot for key (absent: the caller checked; key outlives the loader's
 * use of it), or NULL when out of memory. */
static slot *slot_add(loader *ld, const char *key) {
  slot *sl = calloc(1, sizeof *sl);
  if (!sl) return NULL;
  sl->key = key;
  if (!grove__pmap_put(&ld->slots, key, sl)) {
    free(sl);
    return NULL;
  }
  return sl;
}

static void loader_fini(loader *ld) {
  for (size_t i = 0; i < ld->slots.cap; i++) {
    slot *sl = ld->slots.vals[i];
    if (!ld->slots.keys[i]) continue;
    grove_storage_release(sl->s);
    free(sl);
  }
  grove__pmap_fini(&ld->slots);
  free(ld->prefix);
  grove__zip_close(&ld->zip);
}

static grove_status nomem(loader *ld) {
  return grove_err_set(ld->err, GROVE_E_NOMEM, "%s: out of memory", ld->name);
}

/* The record prefix + rest, or NULL when absent (*buf receives the name). */
static const grove__zip_entry *find_record(loader *ld, const char *rest, char *buf, size_t n) {
  snprintf(buf, n, "%s%s", ld->prefix, rest);
  return grove__zip_find(&ld->zip, buf);
}

/* ================================================================ archive */

/* GROVE_OK for a zip archive; *legacy set for a legacy file. */
static grove_status check_kind(const uint8_t *b, size_t len, const char *name, bool *legacy,
                               grove_err *err) {
  *legacy = grove__legacy_is(b, len);
  if (*legacy) return GROVE_OK;
  if (len >= 262 && memcmp(b + 257, "ustar", 5) == 0)
    return grove_err_set(err, GROVE_E_UNSUPPORTED,
                         "%s: a tar archive (the torch.save format of PyTorch before 0.4?); "
                         "Grove reads the zip format. Re-save it with PyTorch >= 1.6: "
                         "torch.save(torch.load(f), 'weights.pt')",
                         name);
  if (len >= 2 && b[0] == 0x80 && b[1] <= 5)
    return grove_err_set(err, GROVE_E_UNSUPPORTED,
                         "%s: a bare pickle, not a torch.save file (pickle.dump?); re-save "
                         "it with torch.save(obj, 'weights.pt')",
                         name);
  if (len < 4 || b[0] != 'P' || b[1] != 'K')
    return grove_err_set(err, GROVE_E_FORMAT,
                         "%s: not a torch.save archive (no zip signature at the start)", name);
  return GROVE_OK;
}

/* Finds the folder every record lives in and reads version and byteorder. */
static grove_status read_layout(loader *ld) {
  grove__zip *z = &ld->zip;
  if (z->count == 0)
    return grove_err_set(ld->err, GROVE_E_FORMAT, "%s: the zip archive holds no records", ld->name);
  const char *first = z->entries[0].name, *slash = strchr(first, '/');
  if (!slash)
    return grove_err_set(ld->err, GROVE_E_FORMAT,
                         "%s: record '%s' is not inside a folder; torch.save puts every record "
                         "under one top-level folder",
                         ld->name, first);
  size_t plen = (size_t)(slash - first) + 1;
  ld->prefix = malloc(plen + 1);
  if (!ld->prefix) return nomem(ld);
  memcpy(ld->prefix, first, plen);
  ld->prefix[plen] = '\0';
  for (size_t i = 1; i < z->count; i++)
    if (strncmp(z->entries[i].name, ld->prefix, plen) != 0)
      return grove_err_set(ld->err, GROVE_E_FORMAT,
                           "%s: record '%s' is outside the archive's folder '%.*s'", ld->name,
                           z->entries[i].name, (int)(plen - 1), ld->prefix);

  char rec[4096];
  if (find_record(ld, "constants.pkl", rec, sizeof rec))
    return grove_err_set(ld->err, GROVE_E_UNSUPPORTED,
                         "%s: a TorchScript archive (torch.jit.save), not a torch.save "
                         "checkpoint; save its weights with "
                         "torch.save(torch.jit.load(f).state_dict(), 'weights.pt')",
                         ld->name);

  /* version: a decimal number, as torch's reader requires. */
  const grove__zip_entry *e = find_record(ld, "version", rec, sizeof rec);
  if (!e) e = find_record(ld, ".data/version", rec, sizeof rec);
  if (e) {
    char v[32];
    if (e->size == 0 || e->size >= sizeof v)
      return grove_err_set(ld->err, GROVE_E_FORMAT, "%s: record '%s' is not a version number",
                           ld->name, e->name);
    grove_status st = grove__zip_extract(z, e, v, ld->err);
    if (st != GROVE_OK) return st;
    size_t n = (size_t)e->size, k = 0;
    while (k < n && v[k] >= '0' && v[k] <= '9') k++;
    while (k < n && (v[k] == '\n' || v[k] == '\r' || v[k] == ' ')) k++;
    if (k != n || v[0] < '0' || v[0] > '9')
      return grove_err_set(ld->err, GROVE_E_FORMAT, "%s: record '%s' is not a version number",
                           ld->name, e->name);
  }

  e = find_record(ld, "byteorder", rec, sizeof rec);
  if (e) {
    char b[8] = {0};
    if (e->size > 6)
      return grove_err_set(ld->err, GROVE_E_FORMAT,
                           "%s: record '%s' must say \"little\" or \"big\"", ld->name, e->name);
    grove_status st = grove__zip_extract(z, e, b, ld->err);
    if (st != GROVE_OK) return st;
    if (strcmp(b, "big") == 0)
      ld->big_endian = true;
    else if (strcmp(b, "little") != 0)
      return grove_err_set(ld->err, GROVE_E_FORMAT,
                           "%s: record '%s' must say \"little\" or \"big\"", ld->name, e->name);
  }
  return GROVE_OK;
}

/* ================================================================ tensors */

static void release_map(void *ctx) {
  grove_storage_release(ctx);
}

static void byteswap(uint8_t *p, size_t nbytes, size_t es) {
  for (size_t i = 0; i + es <= nbytes; i += es)
    for (size_t a = 0, b = es - 1; a < b; a++, b--) {
      uint8_t t = p[i + a];
      p[i + a] = p[i + b];
      p[i + b] = t;
    }
}

/* A storage of nbytes at src inside the file read whole (ld->map), which it
 * keeps alive: the zero-copy case of both layouts. */
static grove_status wrap_in_map(loader *ld, const uint8_t *src, uint64_t nbytes,
                                grove_storage **out) {
  grove_storage_retain(ld->map);
  *out = grove_storage_wrap((void *)src, (size_t)nbytes, release_map, ld->map);
  if (*out) return GROVE_OK;
  grove_storage_release(ld->map);
  return nomem(ld);
}

/* A new slot for a storage read just now (s, whose reference it takes). */
static grove_status add_slot(loader *ld, const char *skey, grove_storage *s, grove_dtype dtype,
                             bool untyped, uint64_t numel, slot **out) {
  slot *sl = slot_add(ld, skey);
  if (!sl) {
    grove_storage_release(s);
    return nomem(ld);
  }
  sl->s = s;
  sl->dtype = dtype;
  sl->untyped = untyped;
  sl->numel = numel;
  *out = sl;
  return GROVE_OK;
}

/* get_storage's part for a legacy file: the bytes are in the file itself,
 * little-endian, zero-copy when f32 and aligned (as a stored zip record). */
static grove_status legacy_storage(loader *ld, const char *tkey, const char *skey,
                                   grove_dtype dtype, bool untyped, uint64_t numel, uint64_t nbytes,
                                   slot **out) {
  const grove__legacy_rec *r = grove__legacy_find(ld->legacy, skey);
  if (!r)
    return grove_err_set(ld->err, GROVE_E_FORMAT,
                         "%s: key '%s': its storage '%s' is not in the file's list of storages",
                         ld->name, tkey, skey);
  /* torch_legacy.c checked the count against every persistent id. */
  if (r->nbytes != nbytes)
    return grove_err_set(ld->err, GROVE_E_BAD_SIZE,
                         "%s: key '%s': storage '%s' holds %zu bytes, but the pickle says %llu "
                         "elements of %s",
                         ld->name, tkey, skey, r->nbytes, (unsigned long long)numel,
                         grove_dtype_name(dtype));
  const uint8_t *src = ld->buf + r->offset;
  grove_storage *s;
  if (ld->map && dtype == GROVE_F32 && !untyped && nbytes > 0 &&
      (uintptr_t)src % sizeof(float) == 0) {
    grove_status st = wrap_in_map(ld, src, nbytes, &s);
    if (st) return st;
  } else {
    s = grove_storage_new((size_t)nbytes);
    if (!s) return nomem(ld);
    if (nbytes) memcpy(grove_storage_data(s), src, (size_t)nbytes);
  }
  return add_slot(ld, skey, s, dtype, untyped, numel, out);
}

/* Reads storage record key (once) into a grove_storage.  dtype is the
 * storage's element type; swap_es the element size to byte-swap by. */
static grove_status get_storage(loader *ld, const char *tkey, const char *skey, grove_dtype dtype,
                                bool untyped, uint64_t numel, size_t swap_es, slot **out) {
  slot *sl = slot_find(ld, skey);
  if (sl) {
    if (sl->dtype != dtype || sl->untyped != untyped || sl->numel != numel)
      return grove_err_set(ld->err, GROVE_E_FORMAT,
                           "%s: key '%s': storage '%s' is described twice, differently (%s x "
                           "%llu, then %s x %llu)",
                           ld->name, tkey, skey, grove_dtype_name(sl->dtype),
                           (unsigned long long)sl->numel, grove_dtype_name(dtype),
                           (unsigned long long)numel);
    *out = sl;
    return GROVE_OK;
  }
  size_t es = grove_dtype_size(dtype);
  uint64_t nbytes;
  if (grove__mul_overflow_u64(numel, es, &nbytes) || nbytes > (uint64_t)SIZE_MAX / 2)
    return grove_err_set(ld->err, GROVE_E_BAD_SIZE,
                         "%s: key '%s': storage '%s' of %llu elements overflows", ld->name, tkey,
                         skey, (unsigned long long)numel);
  if (ld->legacy) return legacy_storage(ld, tkey, skey, dtype, untyped, numel, nbytes, out);
  char rec[4096];
  char skey_short[256];
  snprintf(skey_short, sizeof skey_short, "%s", skey);
  const grove__zip_entry *e = NULL;
  if (strlen(skey) < 1000) {
    char tail[1100];
    snprintf(tail, sizeof tail, "data/%s", skey);
    e = find_record(ld, tail, rec, sizeof rec);
  }
  if (!e)
    return grove_err_set(ld->err, GROVE_E_FORMAT,
                         "%s: key '%s': its storage record '%sdata/%s' is missing", ld->name, tkey,
                         ld->prefix, skey_short);
  if (e->size != nbytes)
    return grove_err_set(ld->err, GROVE_E_BAD_SIZE,
                         "%s: key '%s': storage record '%s' holds %llu bytes, but the pickle "
                         "says %llu elements of %s (%llu bytes)",
                         ld->name, tkey, e->name, (unsigned long long)e->size,
                         (unsigned long long)numel, grove_dtype_name(dtype),
                         (unsigned long long)nbytes);

  grove_storage *s = NULL;
  grove_status st = GROVE_OK;
  const uint8_t *in_place = NULL;
  if (ld->map && e->method == 0 && !ld->big_endian && dtype == GROVE_F32 && !untyped &&
      nbytes > 0 && (e->data_offset % sizeof(float)) == 0) {
    st = grove__zip_stored(&ld->zip, e, &in_place, ld->err);
    if (st == GROVE_OK) st = wrap_in_map(ld, in_place, nbytes, &s);
    if (st != GROVE_OK) return st;
  } else {
    s = grove_storage_new((size_t)nbytes);
    if (!s) return nomem(ld);
    st = grove__zip_extract(&ld->zip, e, grove_storage_data(s), ld->err);
    if (st != GROVE_OK) {
      grove_storage_release(s);
      return st;
    }
    if (ld->big_endian && swap_es > 1) byteswap(grove_storage_data(s), (size_t)nbytes, swap_es);
  }
  return add_slot(ld, skey, s, dtype, untyped, numel, out);
}

static bool as_int(const grove__pk *v, int64_t *out) {
  if (!v || v->kind != GROVE__PK_INT) return false;
  *out = v->u.i;
  return true;
}

static bool is_str(const grove__pk *v, const char *s) {
  return v && (v->kind == GROVE__PK_STR || v->kind == GROVE__PK_BYTES) &&
         v->u.str.len == strlen(s) && memcmp(v->u.str.s, s, v->u.str.len) == 0;
}

static grove_status bad(loader *ld, const char *key, const char *what, const grove__pk *got) {
  char d[200];
  return grove_err_set(ld->err, GROVE_E_FORMAT, "%s: key '%s': %s, found %s", ld->name, key, what,
                       grove__pk_describe(got, d, sizeof d));
}

/* Reads a tuple of non-negative ints into dims; returns its length or -1. */
static int read_dims(const grove__pk *t, int64_t *dims, bool *too_many) {
  *too_many = false;
  if (!t || t->kind != GROVE__PK_TUPLE) return -1;
  if (t->u.seq.n > GROVE_MAX_DIMS) {
    *too_many = true;
    return -1;
  }
  for (size_t i = 0; i < t->u.seq.n; i++)
    if (!as_int(t->u.seq.items[i], &dims[i]) || dims[i] < 0) return -1;
  return (int)t->u.seq.n;
}

/* _rebuild_tensor(_v2, _v3)(storage, offset, size, stride, ...): a view of a
 * storage.  dtype_v is v3's dtype argument, or NULL. */
static grove_status rebuild(loader *ld, const char *key, const grove__pk *storage_v,
                            const grove__pk *offset_v, const grove__pk *size_v,
                            const grove__pk *stride_v, const grove__pk *dtype_v,
                            grove_tensor **out) {
  /* The persistent id: ('storage', StorageType, key, location, numel),
   * and in the legacy format a sixth item, view_metadata: None unless the
   * storage is a view of another (what PyTorch before 1.12 could save). */
  if (!storage_v || storage_v->kind != GROVE__PK_PERSID)
    return bad(ld, key, "a tensor's first argument must be a storage", storage_v);
  const grove__pk *pid = storage_v->u.pid;
  const size_t pid_n = ld->legacy ? 6 : 5;
  if (pid->kind != GROVE__PK_TUPLE || pid->u.seq.n != pid_n ||
      !is_str(pid->u.seq.items[0], "storage"))
    return bad(ld, key,
               ld->legacy ? "a storage reference must be ('storage', type, key, location, numel, "
                            "view_metadata)"
                          : "a storage reference must be ('storage', type, key, location, numel)",
               pid);
  if (ld->legacy && pid->u.seq.items[5]->kind != GROVE__PK_NONE)
    return grove_err_set(ld->err, GROVE_E_UNSUPPORTED,
                         "%s: key '%s' is a view of another storage (the legacy format's "
                         "view_metadata); re-save it with PyTorch >= 1.6: "
                         "torch.save(torch.load(f), 'weights.pt')",
                         ld->name, key);
  const grove__pk *type = pid->u.seq.items[1], *skey = pid->u.seq.items[2];
  int64_t numel;
  if (type->kind != GROVE__PK_GLOBAL || type->u.global.tag != GROVE__TAG_STORAGE)
    return bad(ld, key, "a storage reference must name a storage class", type);
  if (skey->kind != GROVE__PK_STR || memchr(skey->u.str.s, 0, skey->u.str.len) || !skey->u.str.len)
    return bad(ld, key, "a storage key must be a non-empty string", skey);
  if (!as_int(pid->u.seq.items[4], &numel) || numel < 0)
    return bad(ld, key, "a storage's size must be a non-negative int", pid->u.seq.items[4]);
  if (!type->u.global.dtype_ok)
    return grove_err_set(ld->err, GROVE_E_BAD_DTYPE,
                         "%s: key '%s': storage type %s: Grove reads float32, float16, bfloat16, "
                         "float64, int64, int32, int16, int8, uint8 and bool tensors",
                         ld->name, key, type->u.global.name);
  grove_dtype sdt = type->u.global.dtype, dt = sdt;
  bool untyped = type->u.global.untyped;
  if (dtype_v) {
    if (dtype_v->kind != GROVE__PK_GLOBAL || dtype_v->u.global.tag != GROVE__TAG_DTYPE)
      return bad(ld, key, "_rebuild_tensor_v3's dtype must be a torch dtype", dtype_v);
    if (!dtype_v->u.global.dtype_ok)
      return grove_err_set(ld->err, GROVE_E_BAD_DTYPE,
                           "%s: key '%s': dtype %s: Grove reads float32, float16, bfloat16, "
                           "float64, int64, int32, int16, int8, uint8 and bool tensors",
                           ld->name, key, dtype_v->u.global.name);
    dt = dtype_v->u.global.dtype;
    if (!untyped && dt != sdt)
      return grove_err_set(ld->err, GROVE_E_FORMAT, "%s: key '%s': a %s tensor on a %s storage",
                           ld->name, key, grove_dtype_name(dt), type->u.global.name);
  }

  int64_t offset, shape[GROVE_MAX_DIMS], strides[GROVE_MAX_DIMS];
  bool too_many = false, too_many2 = false;
  if (!as_int(offset_v, &offset) || offset < 0)
    return bad(ld, key, "a storage offset must be a non-negative int", offset_v);
  int nd = read_dims(size_v, shape, &too_many);
  int nd2 = read_dims(stride_v, strides, &too_many2);
  if (too_many || too_many2)
    return grove_err_set(ld->err, GROVE_E_LIMIT,
                         "%s: key '%s': %zu dimensions, Grove supports at most %d", ld->name, key,
                         (too_many ? size_v : stride_v)->u.seq.n, GROVE_MAX_DIMS);
  if (nd < 0) return bad(ld, key, "a tensor's size must be a tuple of non-negative ints", size_v);
  if (nd2 != nd)
    return bad(ld, key, "a tensor's stride must be a tuple of non-negative ints, one per dimension",
               stride_v);

  /* The shape's element count must fit (torch's numel is an int64). */
  size_t es = grove_dtype_size(dt);
  uint64_t numel_t = 1;
  bool empty = false, overflow = false;
  for (int i = 0; i < nd; i++) {
    if (shape[i] == 0)
      empty = true;
    else
      overflow |= grove__mul_overflow_u64(numel_t, (uint64_t)shape[i], &numel_t);
  }
  overflow |= numel_t > (uint64_t)INT64_MAX / 8;
  char sbuf[200], tbuf[200];
  if (overflow)
    return grove_err_set(ld->err, GROVE_E_BAD_SIZE, "%s: key '%s': shape %s overflows 64 bits",
                         ld->name, key, grove_shape_str(nd, shape, sbuf, sizeof sbuf));
  slot *sl = NULL;
  grove_status st = get_storage(ld, key, skey->u.str.s, sdt, untyped, (uint64_t)numel,
                                untyped ? es : grove_dtype_size(sdt), &sl);
  if (st != GROVE_OK) return st;
  /* Bounds, overflow-checked in the one helper every view goes through: a
   * last index of 2^64 - 1 must not wrap to an end of 0.  torch refuses
   * these too ("out of bounds for storage"). */
  uint64_t snbytes = grove_storage_nbytes(sl->s), end = 0;
  if (!grove__view_end((uint64_t)offset, es, nd, shape, strides, &end) || end > snbytes)
    return grove_err_set(ld->err, GROVE_E_BAD_OFFSETS,
                         "%s: key '%s': a %s view of shape %s, stride %s at offset %lld is out of "
                         "bounds for storage '%s' (%llu bytes)",
                         ld->name, key, grove_dtype_name(dt),
                         grove_shape_str(nd, shape, sbuf, sizeof sbuf),
                         grove_shape_str(nd, strides, tbuf, sizeof tbuf), (long long)offset,
                         skey->u.str.s, (unsigned long long)snbytes);

  /* The tensor is a view of the storage, strides kept, as torch.load gives
   * it: an expanded tensor (stride 0) costs its storage, not its numel, and
   * tied views share one storage.  Consumers that need contiguous memory
   * (load_state_dict's copy, export, the wire) copy what they use. */
  grove_err local = {0};
  size_t byte_off = empty ? 0 : (size_t)offset * es;
  grove_tensor *t = grove_tensor_view_new(sl->s, byte_off, dt, nd, shape, strides, &local);
  if (!t)
    return grove_err_set(ld->err, local.code ? local.code : GROVE_E_NOMEM, "%s: key '%s': %s",
                         ld->name, key, grove_err_msg(&local));
  *out = t;
  return GROVE_OK;
}

static bool is_tensor_value(const grove__pk *v) {
  return v && v->kind == GROVE__PK_CALL && grove__pk_tag_makes_tensor(v->u.call.func->u.global.tag);
}

static grove_status build_tensor(loader *ld, const char *key, const grove__pk *v, int depth,
                                 grove_tensor **out);

/* Interprets func(args) for a tensor-making func. */
static grove_status build_call(loader *ld, const char *key, const grove__pk *func,
                               const grove__pk *args, int depth, grove_tensor **out) {
  if (func->kind != GROVE__PK_GLOBAL || !grove__pk_tag_makes_tensor(func->u.global.tag))
    return bad(ld, key, "expected a tensor-building function", func);
  if (args->kind != GROVE__PK_TUPLE) return bad(ld, key, "expected an argument tuple", args);
  size_t n = args->u.seq.n;
  grove__pk *const *a = args->u.seq.items;
  const char *fname = func->u.global.name;
  char what[200];
  switch (func->u.global.tag) {
    case GROVE__TAG_REBUILD_TENSOR:
      if (n != 4) break;
      return rebuild(ld, key, a[0], a[1], a[2], a[3], NULL, out);
    case GROVE__TAG_REBUILD_TENSOR_V2:
      if (n != 6 && n != 7) break;
      return rebuild(ld, key, a[0], a[1], a[2], a[3], NULL, out);
    case GROVE__TAG_REBUILD_TENSOR_V3:
      if (n != 7 && n != 8) break;
      return rebuild(ld, key, a[0], a[1], a[2], a[3], a[6], out);
    case GROVE__TAG_REBUILD_PARAMETER:
      if (n != 3) break;
      return build_tensor(ld, key, a[0], depth + 1, out);
    case GROVE__TAG_REBUILD_PARAMETER_WITH_STATE:
      if (n != 4) break;
      return build_tensor(ld, key, a[0], depth + 1, out);
    case GROVE__TAG_PARAMETER:
      /* torch.nn.Parameter(data[, requires_grad]) */
      if (n != 1 && n != 2) break;
      return build_tensor(ld, key, a[0], depth + 1, out);
    case GROVE__TAG_REBUILD_FROM_TYPE_V2: {
      /* (func, new_type, args, state): a plain Tensor or Parameter only. */
      if (n != 4) break;
      const grove__pk *type = a[1];
      if (type->kind != GROVE__PK_GLOBAL ||
          (type->u.global.tag != GROVE__TAG_TENSOR && type->u.global.tag != GROVE__TAG_PARAMETER))
        return grove_err_set(ld->err, GROVE_E_UNSUPPORTED,
                             "%s: key '%s' is a tensor subclass (%s); Grove reads plain tensors",
                             ld->name, key, grove__pk_describe(type, what, sizeof what));
      if (depth > 4) return bad(ld, key, "tensor rebuilds nest too deeply", a[0]);
      return build_call(ld, key, a[0], a[2], depth + 1, out);
    }
    case GROVE__TAG_REBUILD_UNSUPPORTED:
      return grove_err_set(ld->err, GROVE_E_UNSUPPORTED,
                           "%s: key '%s' is %s; Grove reads dense tensors only", ld->name, key,
                           func->u.global.what);
    default:
      break;
  }
  snprintf(what, sizeof what, "%s takes other arguments than these %zu", fname, n);
  return bad(ld, key, what, args);
}

static grove_status build_tensor(loader *ld, const char *key, const grove__pk *v, int depth,
                                 grove_tensor **out) {
  if (depth > 4) return bad(ld, key, "tensor rebuilds nest too deeply", v);
  if (!is_tensor_value(v)) return bad(ld, key, "expected a tensor", v);
  return build_call(ld, key, v->u.call.func, v->u.call.args, depth, out);
}

/* ================================================================ state_dict */

/* _metadata: {prefix: {"version": int, ...}, ...} on the OrderedDict. */
static grove_status read_metadata(loader *ld, const grove__pk *sd_node, grove_state_dict *sd) {
  const grove__pk *meta = grove__pk_dict_get(sd_node->state, "_metadata");
  if (!meta || meta->kind != GROVE__PK_DICT) return GROVE_OK;
  size_t n = meta->u.seq.n / 2;
  if (n > GROVE_TORCH_MAX_META)
    return grove_err_set(ld->err, GROVE_E_LIMIT,
                         "%s: _metadata lists %zu modules (the limit is %u)", ld->name, n,
                         GROVE_TORCH_MAX_META);
  for (size_t i = 0; i < n; i++) {
    const grove__pk *prefix = meta->u.seq.items[2 * i], *entry = meta->u.seq.items[2 * i + 1];
    int64_t version;
    /* torch treats _metadata loosely (missing entries and versions are
     * normal); entries that are not {"version": int} are skipped. */
    if (prefix->kind != GROVE__PK_STR || memchr(prefix->u.str.s, 0, prefix->u.str.len)) continue;
    if (!as_int(grove__pk_dict_get(entry, "version"), &version)) continue;
    if (version < INT_MIN || version > INT_MAX) continue;
    grove_err local = {0};
    if (grove_sd_set_version(sd, prefix->u.str.s, (int)version, &local) != GROVE_OK)
      return grove_err_set(ld->err, local.code, "%s: %s", ld->name, grove_err_msg(&local));
  }
  return GROVE_OK;
}

/* The dict that holds the tensors: the root, or what it wraps. */
static grove_status find_state_dict(loader *ld, const grove__pk *root, const grove__pk **out) {
  char d[200];
  if (root->kind != GROVE__PK_DICT)
    return grove_err_set(
        ld->err, GROVE_E_FORMAT, "%s: %s holds %s, not a state_dict (a dict of tensors)", ld->name,
        ld->legacy ? "the saved object" : "data.pkl", grove__pk_describe(root, d, sizeof d));
  static const char *const wrappers[] = {"state_dict", "model", "module"};
  for (int depth = 0; depth < 4; depth++) {
    const grove__pk *inner = NULL;
    for (size_t w = 0; w < 3 && !inner; w++) {
      const grove__pk *v = grove__pk_dict_get(root, wrappers[w]);
      if (v && v->kind == GROVE__PK_DICT) inner = v;
    }
    if (!inner) break;
    root = inner;
  }
  *out = root;
  return GROVE_OK;
}

static grove_status read_state_dict(loader *ld, const grove__pk *root, grove_state_dict **out) {
  const grove__pk *node = NULL;
  grove_status st = find_state_dict(ld, root, &node);
  if (st != GROVE_OK) return st;
  grove_state_dict *sd = grove_sd_new();
  if (!sd) return nomem(ld);
  for (size_t i = 0; i + 1 < node->u.seq.n && st == GROVE_OK; i += 2) {
    const grove__pk *k = node->u.seq.items[i], *v = node->u.seq.items[i + 1];
    if (!is_tensor_value(v)) continue; /* epochs, optimizer state, ... */
    if (k->kind != GROVE__PK_STR || memchr(k->u.str.s, 0, k->u.str.len)) {
      char d[200];
      st = grove_err_set(ld->err, GROVE_E_FORMAT,
                         "%s: a tensor is stored under %s; state_dict keys are strings", ld->name,
                         grove__pk_describe(k, d, sizeof d));
      break;
    }
    const char *key = k->u.str.s;
    grove_tensor *t = NULL;
    st = build_tensor(ld, key, v, 0, &t);
    if (st != GROVE_OK) break;
    grove_err local = {0};
    st = grove_sd_add(sd, key, t, &local);
    grove_tensor_release(t);
    if (st != GROVE_OK)
      grove_err_set(ld->err, st, "%s: key '%s': %s", ld->name, key, grove_err_msg(&local));
  }
  if (st == GROVE_OK) st = read_metadata(ld, node, sd);
  if (st != GROVE_OK) {
    grove_sd_free(sd);
    return st;
  }
  *out = sd;
  return GROVE_OK;
}

grove_status grove__torch_read_buffer(const void *buf, size_t len, const char *name,
                                      grove_storage *map, grove_state_dict **out, grove_err *err) {
  if (out) *out = NULL;
  if (!out || (!buf && len > 0))
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT, "grove_torch_read: NULL buffer or out");
  if (!name) name = "<buffer>";
  grove_err local = {0};
  if (!err) err = &local;
  bool legacy = false;
  grove_status st = check_kind(buf, len, name, &legacy, err);
  if (st != GROVE_OK) return st;

  loader ld = {.slots = {.strkeys = true}};
  ld.name = name;
  ld.map = map;
  ld.err = err;
  ld.buf = buf;
  if (legacy) {
    grove__legacy lg;
    st = grove__legacy_open(buf, len, name, &lg, err);
    ld.legacy = &lg;
    if (st == GROVE_OK) st = read_state_dict(&ld, lg.root, out);
    loader_fini(&ld); /* before lg: its slots' keys are lg's strings */
    grove__legacy_fini(&lg);
    return st;
  }
  st = grove__zip_open(&ld.zip, buf, len, name, err);
  if (st == GROVE_OK) st = read_layout(&ld);

  uint8_t *pkl_owned = NULL;
  const uint8_t *pkl = NULL;
  const grove__zip_entry *e = NULL;
  char rec[4096];
  if (st == GROVE_OK) {
    e = find_record(&ld, "data.pkl", rec, sizeof rec);
    if (!e)
      st = grove_err_set(err, GROVE_E_FORMAT, "%s: no record '%s' (the pickled state_dict)", name,
                         rec);
    else if (e->size > GROVE_PKL_MAX_BYTES)
      st = grove_err_set(err, GROVE_E_LIMIT, "%s: data.pkl holds %llu bytes (the limit is %zu)",
                         name, (unsigned long long)e->size, GROVE_PKL_MAX_BYTES);
  }
  if (st == GROVE_OK && e->method == 0) {
    st = grove__zip_stored(&ld.zip, e, &pkl, err);
  } else if (st == GROVE_OK) {
    pkl_owned = malloc(e->size ? (size_t)e->size : 1);
    if (!pkl_owned) st = nomem(&ld);
    if (st == GROVE_OK) st = grove__zip_extract(&ld.zip, e, pkl_owned, err);
    pkl = pkl_owned;
  }

  grove__pickle *pk = NULL;
  const grove__pk *root = NULL;
  if (st == GROVE_OK) {
    char pname[4200];
    snprintf(pname, sizeof pname, "%s: data.pkl", name);
    st = grove__pickle_load(pkl, (size_t)e->size, pname, &pk, &root, err);
  }
  if (st == GROVE_OK) st = read_state_dict(&ld, root, out);
  grove__pickle_free(pk);
  free(pkl_owned);
  loader_fini(&ld);
  return st;
}

/* ================================================================ files */

grove_status grove_torch_read(const char *path, grove_state_dict **out, grove_err *err) {
  if (out) *out = NULL;
  if (!path || !out)
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT, "grove_torch_read: NULL path or out");
  grove_storage *map;
  grove_status st = grove__read_file(path, &map, err);
  if (st != GROVE_OK) return st;
  if (grove_storage_nbytes(map) == 0) {
    grove_storage_release(map);
    return grove_err_set(err, GROVE_E_TRUNCATED, "%s: the file is empty", path);
  }
  st = grove__torch_read_buffer(grove_storage_data(map), grove_storage_nbytes(map), path, map, out,
                                err);
  /* Zero-copy storages hold their own references; without any, this
   * frees the file's bytes. */
  grove_storage_release(map);
  return st;
}
