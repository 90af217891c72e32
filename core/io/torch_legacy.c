/* torch_legacy.c: the layout of a torch.save file in the legacy format
 * (PyTorch before 1.6, or _use_new_zipfile_serialization=False).
 *
 * Such a file is five pickles one after the other, then the storages:
 *
 *   1. the magic number, LONG1 0x1950a86a20f9469cfc6c
 *   2. the protocol version, 1001
 *   3. the writer's sys_info: {"protocol_version", "little_endian",
 *      "type_sizes"}
 *   4. the object, whose tensors name storages by persistent id
 *      ('storage', StorageType, key, location, numel, view_metadata)
 *   5. the list of storage keys, in the order their bytes follow
 *   then, for each key of that list: its element count as 8 little-endian
 *   bytes, and its elements, little-endian whatever the writer's host was
 *   (torch's _write_file converts; sys_info's little_endian describes the
 *   writer, not the data).
 *
 * The bytes of a storage are found by walking the list, so each key's
 * element size must be known first: it comes from the storage type of the
 * persistent ids in pickle 4, where every storage the list names appears.
 * Everything is checked against the file's length with overflow in mind;
 * nothing is read twice.  Called by torch_load.c only. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "torch_internal.h"

static const uint8_t magic[] = {0x80, 0x02, 0x8a, 0x0a, 0x6c, 0xfc, 0x9c, 0x46,
                                0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19, '.'};

bool grove__legacy_is(const void *buf, size_t len) {
  /* From PROTO 2 and LONG1 on, what a file cut inside its magic number also
   * begins with (grove__legacy_open then says it is cut short). */
  size_t n = len < sizeof magic ? len : sizeof magic;
  return n >= 3 && memcmp(buf, magic, n) == 0;
}

/* What the persistent ids say of a key: its element size and count. */
typedef struct keyinfo {
  size_t es;
  uint64_t numel;
  const char *type; /* "torch.FloatStorage" (static) */
} keyinfo;

typedef struct scan {
  grove__legacy *lg;
  const char *name;
  grove_err *err;
  grove_status st;
} scan;

static bool note_persid(void *ctx, const grove__pk *v) {
  scan *sc = ctx;
  const grove__pk *pid = v->u.pid;
  /* A malformed id is torch_load.c's to refuse when a tensor uses it. */
  if (pid->kind != GROVE__PK_TUPLE || pid->u.seq.n != 6) return true;
  const grove__pk *tag = pid->u.seq.items[0], *type = pid->u.seq.items[1],
                  *key = pid->u.seq.items[2], *numel = pid->u.seq.items[4];
  if (tag->kind != GROVE__PK_STR || strcmp(tag->u.str.s, "storage") != 0) return true;
  if (type->kind != GROVE__PK_GLOBAL || type->u.global.tag != GROVE__TAG_STORAGE) return true;
  if (key->kind != GROVE__PK_STR || memchr(key->u.str.s, 0, key->u.str.len)) return true;
  if (numel->kind != GROVE__PK_INT || numel->u.i < 0) return true;
  keyinfo *ki = grove__pmap_get(&sc->lg->keys, key->u.str.s, NULL);
  if (ki) {
    if (strcmp(ki->type, type->u.global.name) != 0 || ki->numel != (uint64_t)numel->u.i) {
      sc->st = grove_err_set(sc->err, GROVE_E_FORMAT,
                             "%s: storage '%s' is described twice, differently (%s x %llu, then "
                             "%s x %llu)",
                             sc->name, key->u.str.s, ki->type, (unsigned long long)ki->numel,
                             type->u.global.name, (unsigned long long)numel->u.i);
      return false;
    }
    return true;
  }
  if (!type->u.global.dtype_ok) {
    /* Its bytes could not even be skipped: their size is unknown. */
    sc->st = grove_err_set(sc->err, GROVE_E_BAD_DTYPE,
                           "%s: storage '%s' is a %s; Grove reads float32, float16, bfloat16, "
                           "float64, int64, int32, int16, int8, uint8 and bool tensors",
                           sc->name, key->u.str.s, type->u.global.name);
    return false;
  }
  ki = malloc(sizeof *ki);
  if (!ki || !grove__pmap_put(&sc->lg->keys, key->u.str.s, ki)) {
    free(ki);
    sc->st = grove_err_set(sc->err, GROVE_E_NOMEM, "%s: out of memory", sc->name);
    return false;
  }
  ki->es = type->u.global.untyped ? 1 : grove_dtype_size(type->u.global.dtype);
  ki->numel = (uint64_t)numel->u.i;
  ki->type = type->u.global.name;
  return true;
}

static uint64_t le64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
  return v;
}

/* Pickle k of the file at *off: loads it and moves *off past it. */
static grove_status next_pickle(const uint8_t *buf, size_t len, size_t *off, const char *name,
                                const char *what, grove__pickle **pk, const grove__pk **root,
                                grove_err *err) {
  char pname[4200];
  snprintf(pname, sizeof pname, "%s: %s (the legacy format's pickle at byte %zu)", name, what,
           *off);
  size_t used = 0;
  grove_status st = grove__pickle_load_prefix(buf + *off, len - *off, pname, pk, root, &used, err);
  if (st == GROVE_OK) *off += used;
  return st;
}

grove_status grove__legacy_open(const void *data, size_t len, const char *name, grove__legacy *lg,
                                grove_err *err) {
  const uint8_t *buf = data;
  memset(lg, 0, sizeof *lg);
  lg->keys.strkeys = true;
  lg->recs.strkeys = true;
  if (len < sizeof magic || memcmp(buf, magic, sizeof magic) != 0)
    return grove_err_set(err, GROVE_E_TRUNCATED,
                         "%s: a legacy torch.save file cut short in its magic number", name);
  size_t off = sizeof magic;
  grove__pickle *pk = NULL;
  const grove__pk *v = NULL;
  char d[200];

  grove_status st = next_pickle(buf, len, &off, name, "the protocol version", &pk, &v, err);
  if (st != GROVE_OK) return st;
  bool ok = v->kind == GROVE__PK_INT && v->u.i == 1001;
  if (!ok)
    st = grove_err_set(
        err, GROVE_E_UNSUPPORTED,
        "%s: legacy torch.save protocol version %s; Grove reads 1001 (what "
        "PyTorch 0.4 to 2.x write)",
        name, v->kind == GROVE__PK_INT ? "other than 1001" : grove__pk_describe(v, d, sizeof d));
  grove__pickle_free(pk);
  if (st != GROVE_OK) return st;

  st = next_pickle(buf, len, &off, name, "sys_info", &pk, &v, err);
  if (st != GROVE_OK) return st;
  if (v->kind != GROVE__PK_DICT)
    st = grove_err_set(err, GROVE_E_FORMAT, "%s: the legacy format's sys_info is %s, not a dict",
                       name, grove__pk_describe(v, d, sizeof d));
  grove__pickle_free(pk);
  if (st != GROVE_OK) return st;

  st = next_pickle(buf, len, &off, name, "the saved object", &lg->pk, &lg->root, err);
  if (st != GROVE_OK) return st;
  scan sc = {.lg = lg, .name = name, .err = err};
  if (!grove__pickle_each(lg->pk, GROVE__PK_PERSID, note_persid, &sc)) return sc.st;

  st = next_pickle(buf, len, &off, name, "the storage keys", &lg->keys_pk, &v, err);
  if (st != GROVE_OK) return st;
  if (v->kind != GROVE__PK_LIST)
    return grove_err_set(err, GROVE_E_FORMAT,
                         "%s: the legacy format's storage keys are %s, not a list", name,
                         grove__pk_describe(v, d, sizeof d));
  /* Each key costs at least 8 bytes of file; a list longer than that is a
   * lie, refused before anything is allocated for it. */
  if (v->u.seq.n > (len - off) / 8)
    return grove_err_set(err, GROVE_E_TRUNCATED,
                         "%s: the legacy format lists %zu storages, but only %zu bytes follow",
                         name, v->u.seq.n, len - off);
  lg->nrecs = v->u.seq.n;
  lg->recs_arr = calloc(lg->nrecs ? lg->nrecs : 1, sizeof *lg->recs_arr);
  if (!lg->recs_arr) return grove_err_set(err, GROVE_E_NOMEM, "%s: out of memory", name);
  for (size_t i = 0; i < lg->nrecs; i++) {
    const grove__pk *k = v->u.seq.items[i];
    if (k->kind != GROVE__PK_STR || memchr(k->u.str.s, 0, k->u.str.len))
      return grove_err_set(err, GROVE_E_FORMAT,
                           "%s: storage key %zu of the legacy format's list is %s, not a string",
                           name, i, grove__pk_describe(k, d, sizeof d));
    const keyinfo *ki = grove__pmap_get(&lg->keys, k->u.str.s, NULL);
    if (!ki)
      return grove_err_set(err, GROVE_E_FORMAT,
                           "%s: storage '%s' is listed, but no tensor of the saved object names "
                           "it, so the size of its elements is unknown",
                           name, k->u.str.s);
    if (len - off < 8)
      return grove_err_set(err, GROVE_E_TRUNCATED,
                           "%s: storage '%s': the file ends at byte %zu, before its element count",
                           name, k->u.str.s, len);
    uint64_t n = le64(buf + off), nbytes;
    off += 8;
    if (n != ki->numel)
      return grove_err_set(err, GROVE_E_BAD_SIZE,
                           "%s: storage '%s' holds %llu elements, but its tensors say %llu", name,
                           k->u.str.s, (unsigned long long)n, (unsigned long long)ki->numel);
    if (grove__mul_overflow_u64(n, ki->es, &nbytes) || nbytes > len - off)
      return grove_err_set(err, GROVE_E_TRUNCATED,
                           "%s: storage '%s': %llu elements of %zu bytes at byte %zu, but the file "
                           "ends at byte %zu",
                           name, k->u.str.s, (unsigned long long)n, ki->es, off, len);
    grove__legacy_rec *r = &lg->recs_arr[i];
    r->offset = off;
    r->nbytes = (size_t)nbytes;
    int added = grove__pmap_add(&lg->recs, k->u.str.s, r);
    if (added < 0) return grove_err_set(err, GROVE_E_NOMEM, "%s: out of memory", name);
    if (added == 0)
      return grove_err_set(err, GROVE_E_DUPLICATE_KEY,
                           "%s: storage '%s' is listed twice in the legacy format's storage keys",
                           name, k->u.str.s);
    off += (size_t)nbytes;
  }
  return GROVE_OK;
}

const grove__legacy_rec *grove__legacy_find(const grove__legacy *lg, const char *key) {
  return grove__pmap_get(&lg->recs, key, NULL);
}

void grove__legacy_fini(grove__legacy *lg) {
  for (size_t i = 0; i < lg->keys.cap; i++)
    if (lg->keys.keys[i]) free(lg->keys.vals[i]);
  grove__pmap_fini(&lg->keys);
  grove__pmap_fini(&lg->recs);
  free(lg->recs_arr);
  grove__pickle_free(lg->keys_pk);
  grove__pickle_free(lg->pk);
  memset(lg, 0, sizeof *lg);
}
