/* safetensors.c: reading and writing safetensors checkpoints.
 *
 * The format: an 8-byte little-endian header length N, N bytes of UTF-8 JSON
 * (an object: key -> {"dtype", "shape", "data_offsets": [begin, end]}, plus an
 * optional "__metadata__" object of string -> string), then the tensors' raw
 * little-endian bytes.  Offsets are relative to the first byte after the
 * header; together the tensors must cover that data section exactly.
 *
 * The reader makes every check of the reference reader (huggingface
 * safetensors, safetensors/src/tensor.rs: read_metadata and
 * Metadata::validate) and a few more, each answered with one specific
 * grove_status.  The mapping, reference error -> Grove status:
 *
 * No message quotes the file's bytes (a file that is not safetensors at
 * all, a secret behind a symlink, must not have its first bytes shown as a
 * "header length"): lengths, positions and keys only.
 *
 *   HeaderTooSmall (file < 8 bytes)          -> GROVE_E_TRUNCATED
 *   InvalidHeaderLength (8 + N > file size)  -> GROVE_E_TRUNCATED
 *   HeaderTooLarge (N > 100 MB)              -> GROVE_E_HEADER_TOO_LARGE
 *   InvalidHeader (header not UTF-8)         -> GROVE_E_BAD_UTF8 (checked
 *                                               strictly, like Rust's
 *                                               str::from_utf8, before JSON)
 *   InvalidHeaderStart (first byte not '{')  -> GROVE_E_BAD_JSON
 *   InvalidHeaderDeserialization, split by cause:
 *     JSON syntax (and numbers too big)      -> GROVE_E_BAD_JSON
 *     unknown dtype, or one Grove lacks
 *       (U16, U32, U64, F8_*, ...)           -> GROVE_E_BAD_DTYPE
 *     valid JSON of the wrong shape: entry
 *       not an object, dtype missing, shape
 *       or data_offsets not arrays of
 *       non-negative integers (so a negative
 *       or fractional dimension), offsets
 *       not exactly two, __metadata__ not an
 *       object of strings                    -> GROVE_E_FORMAT
 *   InvalidOffset (begin != previous end, or
 *     end < begin, after sorting by offset)  -> GROVE_E_BAD_OFFSETS
 *   TensorInvalidInfo (end - begin != numel
 *     x dtype size)                          -> GROVE_E_BAD_SIZE
 *   ValidationOverflow (numel or bytes
 *     overflow)                              -> GROVE_E_BAD_SIZE
 *   MetadataIncompleteBuffer (last end !=
 *     data section length): trailing bytes,
 *     or a tensor reaching past the file     -> GROVE_E_BAD_OFFSETS
 *
 * Beyond the reference:
 *   a key named twice in any JSON object (serde keeps the last silently)
 *                                            -> GROVE_E_DUPLICATE_KEY
 *   more than GROVE_MAX_DIMS dimensions      -> GROVE_E_LIMIT
 *   a zero-size tensor whose dimensions multiply (ignoring the zeros) past
 *   64 bits: the reference accepts it since 0 x anything is 0, but such a
 *   shape has no representable strides     -> GROVE_E_BAD_SIZE
 *   a file that cannot be read, or changed   -> GROVE_E_IO
 *   more than GROVE_ST_MAX_TENSORS tensors   -> GROVE_E_LIMIT, counted by a
 *                                               scan of the header before
 *                                               any JSON is built
 *
 * A tensor entry's unknown fields are ignored, as the reference does, and a
 * "__metadata__": null is accepted as no metadata (serde reads it as None).
 *
 * Zero-copy: grove_safetensors_read reads the file whole into one
 * grove_storage of its own (grove__read_file: never a mapping, so a write to
 * the file on disk, even a truncate, changes nothing read).  F32 tensors whose
 * data is 4-byte aligned become views into it; every other tensor is copied
 * into its own storage, in its own dtype.  The copy is freed when the last
 * view of it is released.
 */
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "export_plan.h"
#include "grove/checkpoint.h"
#include "fileio.h"

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
               "safetensors data is little-endian; Grove supports little-endian hosts only");

/* ------------------------------------------------------------ header */

/* One tensor entry of the header.  key points into the parsed JSON. */
typedef struct st_entry {
  const char *key;
  size_t index; /* position in the header */
  grove_dtype dtype;
  int ndim;
  int64_t shape[GROVE_MAX_DIMS];
  uint64_t begin, end;
} st_entry;

static const char *or_buffer(const char *name) {
  return name ? name : "<buffer>";
}

/* Reads a JSON value that must be a non-negative integer. */
static bool json_nonneg(const json_t *v, uint64_t *out) {
  if (!json_is_integer(v)) return false;
  json_int_t x = json_integer_value(v);
  if (x < 0) return false;
  *out = (uint64_t)x;
  return true;
}

static grove_status check_metadata(const json_t *meta, const char *name, grove_err *err) {
  if (json_is_null(meta)) return GROVE_OK;
  if (!json_is_object(meta))
    return grove_err_set(err, GROVE_E_FORMAT, "%s: \"__metadata__\" must be an object of strings",
                         name);
  const char *k;
  json_t *v;
  json_object_foreach((json_t *)meta, k, v) {
    if (!json_is_string(v))
      return grove_err_set(err, GROVE_E_FORMAT,
                           "%s: \"__metadata__\" key '%s': value must be a string", name, k);
  }
  return GROVE_OK;
}

static grove_status parse_entry(const char *key, const json_t *v, const char *name, st_entry *e,
                                grove_err *err) {
  e->key = key;
  if (!json_is_object(v))
    return grove_err_set(err, GROVE_E_FORMAT,
                         "%s: key '%s': expected an object with dtype, shape, data_offsets", name,
                         key);

  const json_t *dt = json_object_get(v, "dtype");
  if (!json_is_string(dt))
    return grove_err_set(err, GROVE_E_FORMAT, "%s: key '%s': \"dtype\" must be a string", name,
                         key);
  if (!grove_dtype_from_st_name(json_string_value(dt), &e->dtype))
    return grove_err_set(err, GROVE_E_BAD_DTYPE,
                         "%s: key '%s': dtype '%s' is not supported (Grove reads F32, F16, "
                         "BF16, F64, I64, I32, I16, I8, U8, BOOL)",
                         name, key, json_string_value(dt));

  const json_t *shape = json_object_get(v, "shape");
  if (!json_is_array(shape))
    return grove_err_set(err, GROVE_E_FORMAT,
                         "%s: key '%s': \"shape\" must be an array of non-negative integers", name,
                         key);
  size_t nd = json_array_size(shape);
  if (nd > GROVE_MAX_DIMS)
    return grove_err_set(err, GROVE_E_LIMIT,
                         "%s: key '%s': %zu dimensions, Grove supports at most %d", name, key, nd,
                         GROVE_MAX_DIMS);
  e->ndim = (int)nd;
  for (size_t i = 0; i < nd; i++) {
    uint64_t d;
    if (!json_nonneg(json_array_get(shape, i), &d))
      return grove_err_set(err, GROVE_E_FORMAT,
                           "%s: key '%s': shape[%zu] must be a non-negative integer", name, key, i);
    e->shape[i] = (int64_t)d;
  }

  const json_t *offs = json_object_get(v, "data_offsets");
  if (!json_is_array(offs) || json_array_size(offs) != 2 ||
      !json_nonneg(json_array_get(offs, 0), &e->begin) ||
      !json_nonneg(json_array_get(offs, 1), &e->end))
    return grove_err_set(err, GROVE_E_FORMAT,
                         "%s: key '%s': \"data_offsets\" must be [begin, end], two non-negative "
                         "integers",
                         name, key);
  return GROVE_OK;
}

static int cmp_by_offset(const void *pa, const void *pb) {
  const st_entry *a = *(const st_entry *const *)pa, *b = *(const st_entry *const *)pb;
  if (a->begin != b->begin) return a->begin < b->begin ? -1 : 1;
  if (a->end != b->end) return a->end < b->end ? -1 : 1;
  return a->index < b->index ? -1 : a->index > b->index;
}

/* Checks, in offset order, that the tensors tile [0, data_len) exactly and
 * that each one's byte size is numel x dtype size. */
static grove_status validate_layout(st_entry *entries, size_t n, uint64_t data_len,
                                    const char *name, grove_err *err) {
  if (n == 0) {
    if (data_len != 0)
      return grove_err_set(err, GROVE_E_BAD_OFFSETS,
                           "%s: %llu bytes of data follow a header that lists no tensor", name,
                           (unsigned long long)data_len);
    return GROVE_OK;
  }
  st_entry **sorted = malloc(n * sizeof *sorted);
  if (!sorted) return grove_err_set(err, GROVE_E_NOMEM, "%s: out of memory", name);
  for (size_t i = 0; i < n; i++) sorted[i] = &entries[i];
  qsort(sorted, n, sizeof *sorted, cmp_by_offset);

  grove_status st = GROVE_OK;
  uint64_t expect = 0;
  const st_entry *prev = NULL;
  for (size_t i = 0; i < n && st == GROVE_OK; i++) {
    const st_entry *e = sorted[i];
    char sbuf[160];
    if (e->end < e->begin) {
      st = grove_err_set(err, GROVE_E_BAD_OFFSETS,
                         "%s: key '%s': data_offsets [%llu, %llu] end before they begin", name,
                         e->key, (unsigned long long)e->begin, (unsigned long long)e->end);
    } else if (e->begin < expect) {
      st = grove_err_set(err, GROVE_E_BAD_OFFSETS,
                         "%s: key '%s': data_offsets [%llu, %llu] overlap tensor '%s', which "
                         "ends at %llu",
                         name, e->key, (unsigned long long)e->begin, (unsigned long long)e->end,
                         prev->key, (unsigned long long)expect);
    } else if (e->begin > expect) {
      st = grove_err_set(err, GROVE_E_BAD_OFFSETS,
                         "%s: key '%s': data_offsets [%llu, %llu] leave bytes %llu..%llu of the "
                         "data covered by no tensor",
                         name, e->key, (unsigned long long)e->begin, (unsigned long long)e->end,
                         (unsigned long long)expect, (unsigned long long)e->begin);
    } else if (e->end > data_len) {
      st = grove_err_set(err, GROVE_E_BAD_OFFSETS,
                         "%s: key '%s': data_offsets [%llu, %llu] reach past the end of the "
                         "data (%llu bytes after the header; is the file truncated?)",
                         name, e->key, (unsigned long long)e->begin, (unsigned long long)e->end,
                         (unsigned long long)data_len);
    } else {
      /* Elements x element size, overflow-checked.  Zero dimensions are
       * skipped in the product so that a zero-size tensor with absurd other
       * dimensions is refused too: its strides would overflow. */
      uint64_t span = grove_dtype_size(e->dtype);
      bool overflow = false, empty = false;
      for (int d = 0; d < e->ndim; d++) {
        uint64_t dim = (uint64_t)e->shape[d];
        if (dim == 0)
          empty = true;
        else
          overflow |= grove__mul_overflow_u64(span, dim, &span);
      }
      overflow |= span > (uint64_t)INT64_MAX;
      uint64_t nbytes = empty ? 0 : span;
      if (overflow) {
        st = grove_err_set(err, GROVE_E_BAD_SIZE, "%s: key '%s': shape %s of %s overflows 64 bits",
                           name, e->key, grove_shape_str(e->ndim, e->shape, sbuf, sizeof sbuf),
                           grove_dtype_st_name(e->dtype));
      } else if (nbytes != e->end - e->begin) {
        st = grove_err_set(err, GROVE_E_BAD_SIZE,
                           "%s: key '%s': %s %s needs %llu bytes but data_offsets [%llu, %llu] "
                           "hold %llu",
                           name, e->key, grove_dtype_st_name(e->dtype),
                           grove_shape_str(e->ndim, e->shape, sbuf, sizeof sbuf),
                           (unsigned long long)nbytes, (unsigned long long)e->begin,
                           (unsigned long long)e->end, (unsigned long long)(e->end - e->begin));
      }
    }
    expect = e->end;
    prev = e;
  }
  if (st == GROVE_OK && expect != data_len)
    st = grove_err_set(err, GROVE_E_BAD_OFFSETS,
                       "%s: %llu trailing bytes after the last tensor '%s' (data ends at %llu, "
                       "the file holds %llu bytes after the header)",
                       name, (unsigned long long)(data_len - expect), prev->key,
                       (unsigned long long)expect, (unsigned long long)data_len);
  free(sorted);
  return st;
}

/* Copies the message out of a jansson duplicate-key error: its text ends in
 * "near '\"key\"'", the raw token.  Falls back to the whole text. */
static const char *dup_token(const json_error_t *je, char *buf, size_t n) {
  const char *near = strstr(je->text, "near '");
  if (!near) return je->text;
  near += 6;
  size_t len = strlen(near);
  if (len > 0 && near[len - 1] == '\'') len--;
  if (len >= n) len = n - 1;
  memcpy(buf, near, len);
  buf[len] = '\0';
  return buf;
}

/* The number of members of the header's top-level object, counted without
 * building anything (one pass, no allocation): the colons at depth 1
 * outside strings.  Exact for valid JSON; for invalid JSON any count is
 * fine, the parser refuses it next. */
static size_t count_members(const uint8_t *h, size_t n) {
  size_t count = 0;
  int depth = 0;
  bool in_str = false;
  for (size_t i = 0; i < n; i++) {
    uint8_t c = h[i];
    if (in_str) {
      if (c == '\\')
        i++;
      else if (c == '"')
        in_str = false;
    } else if (c == '"') {
      in_str = true;
    } else if (c == '{' || c == '[') {
      depth++;
    } else if (c == '}' || c == ']') {
      depth--;
    } else if (c == ':' && depth == 1) {
      count++;
    }
  }
  return count;
}

/* ------------------------------------------------------------ reader */

/* Builds the tensor of one entry into *out: a view into map when it is given
 * and the entry is aligned, non-empty f32; otherwise a copy. */
static grove_status make_tensor(const st_entry *e, const uint8_t *data, grove_storage *map,
                                const char *name, grove_tensor **out, grove_err *err) {
  grove_err local = {0};
  const uint8_t *src = data + e->begin;
  size_t nbytes = (size_t)(e->end - e->begin);
  grove_tensor *t;
  if (map && e->dtype == GROVE_F32 && nbytes > 0 && (uintptr_t)src % sizeof(float) == 0) {
    size_t off = (size_t)(src - (const uint8_t *)grove_storage_data(map));
    t = grove_tensor_view_new(map, off, GROVE_F32, e->ndim, e->shape, NULL, &local);
  } else {
    t = grove_tensor_new(e->dtype, e->ndim, e->shape, &local);
    if (t && nbytes > 0) memcpy(t->data, src, nbytes);
  }
  *out = t;
  if (t) return GROVE_OK;
  return grove_err_set(err, local.code != GROVE_OK ? local.code : GROVE_E_NOMEM, "%s: key '%s': %s",
                       name, e->key, grove_err_msg(&local));
}

/* Validates buf (a whole file) and builds the map.  map, when not NULL, is
 * the storage holding buf, for zero-copy views. */
static grove_status st_parse(const uint8_t *buf, size_t len, const char *name, grove_storage *map,
                             grove_state_dict **out, grove_err *err) {
  if (len < 8)
    return grove_err_set(err, GROVE_E_TRUNCATED,
                         "%s: %zu bytes, too short for the 8-byte header length", name, len);
  uint64_t n = 0;
  memcpy(&n, buf, 8); /* little-endian host: asserted above */
  /* The length is the file's first 8 bytes: never shown (see the top). */
  if (n > GROVE_ST_MAX_HEADER)
    return grove_err_set(err, GROVE_E_HEADER_TOO_LARGE,
                         "%s: not a safetensors file (header length exceeds the limit of %u "
                         "bytes)",
                         name, GROVE_ST_MAX_HEADER);
  if (n > len - 8)
    return grove_err_set(err, GROVE_E_TRUNCATED,
                         "%s: not a safetensors file, or a truncated one (header length exceeds "
                         "the file, %zu bytes)",
                         name, len);
  const uint8_t *hdr = buf + 8;
  size_t bad = grove__utf8_invalid_at(hdr, (size_t)n, false);
  if (bad != n)
    return grove_err_set(err, GROVE_E_BAD_UTF8,
                         "%s: header is not valid UTF-8 (at byte %zu of the header)", name, bad);
  if (n == 0) return grove_err_set(err, GROVE_E_BAD_JSON, "%s: the header is empty", name);
  if (hdr[0] != '{')
    return grove_err_set(err, GROVE_E_BAD_JSON, "%s: the header does not start with '{'", name);

  /* Bounded before the JSON tree (about 1 KB a member) is built. */
  size_t members = count_members(hdr, (size_t)n);
  if (members > GROVE_ST_MAX_TENSORS + 1u) /* + 1: __metadata__ */
    return grove_err_set(err, GROVE_E_LIMIT,
                         "%s: the header lists %zu tensors; Grove reads at most %u per file", name,
                         members, GROVE_ST_MAX_TENSORS);

  json_error_t je;
  json_t *root = json_loadb((const char *)hdr, (size_t)n, JSON_REJECT_DUPLICATES, &je);
  if (!root) {
    if (json_error_code(&je) == json_error_duplicate_key) {
      char tok[256];
      return grove_err_set(err, GROVE_E_DUPLICATE_KEY,
                           "%s: duplicate key %s in the header (byte %d)", name,
                           dup_token(&je, tok, sizeof tok), je.position);
    }
    /* jansson's text quotes the bytes near the error: position only. */
    return grove_err_set(err, GROVE_E_BAD_JSON,
                         "%s: the header is not valid JSON (line %d, column %d, byte %d)", name,
                         je.line, je.column, je.position);
  }

  grove_status st = GROVE_OK;
  size_t cap = json_object_size(root);
  st_entry *entries = calloc(cap ? cap : 1, sizeof *entries);
  grove_state_dict *sd = NULL;
  size_t n_entries = 0;
  if (!entries) {
    st = grove_err_set(err, GROVE_E_NOMEM, "%s: out of memory", name);
    goto done;
  }

  /* jansson iterates objects in insertion order, which is the file's order:
   * the order the writer (torch's save_file, ours) had the state_dict in. */
  const char *key;
  json_t *v;
  json_object_foreach(root, key, v) {
    if (strcmp(key, "__metadata__") == 0) {
      st = check_metadata(v, name, err);
    } else {
      st_entry *e = &entries[n_entries];
      e->index = n_entries;
      st = parse_entry(key, v, name, e, err);
      n_entries++;
    }
    if (st != GROVE_OK) goto done;
  }

  if (n_entries > GROVE_ST_MAX_TENSORS) {
    st = grove_err_set(err, GROVE_E_LIMIT,
                       "%s: the header lists %zu tensors; Grove reads at most %u per file", name,
                       n_entries, GROVE_ST_MAX_TENSORS);
    goto done;
  }
  st = validate_layout(entries, n_entries, (uint64_t)(len - 8 - (size_t)n), name, err);
  if (st != GROVE_OK) goto done;

  sd = grove_sd_new();
  if (!sd) {
    st = grove_err_set(err, GROVE_E_NOMEM, "%s: out of memory", name);
    goto done;
  }
  const uint8_t *data = hdr + n;
  for (size_t i = 0; i < n_entries; i++) {
    grove_tensor *t;
    st = make_tensor(&entries[i], data, map, name, &t, err);
    if (st != GROVE_OK) goto done;
    grove_err local = {0};
    st = grove_sd_add(sd, entries[i].key, t, &local);
    grove_tensor_release(t); /* the map holds its own reference now */
    if (st != GROVE_OK) {
      grove_err_set(err, st, "%s: key '%s': %s", name, entries[i].key, grove_err_msg(&local));
      goto done;
    }
  }

done:
  if (st != GROVE_OK) {
    grove_sd_free(sd);
    sd = NULL;
  }
  free(entries);
  json_decref(root);
  *out = sd;
  return st;
}

grove_status grove_safetensors_read_buffer(const void *buf, size_t len, const char *name,
                                           grove_state_dict **out, grove_err *err) {
  if (out) *out = NULL;
  if (!out || (!buf && len > 0))
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT,
                         "grove_safetensors_read_buffer: NULL buffer or out");
  return st_parse(buf, len, or_buffer(name), NULL, out, err);
}

grove_status grove_safetensors_read(const char *path, grove_state_dict **out, grove_err *err) {
  if (out) *out = NULL;
  if (!path || !out)
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT, "grove_safetensors_read: NULL path or out");
  grove_storage *map;
  grove_status st = grove__read_file(path, &map, err);
  if (st != GROVE_OK) return st;
  st = st_parse(grove_storage_data(map), grove_storage_nbytes(map), path, map, out, err);
  /* Views hold their own references; when there are none this frees. */
  grove_storage_release(map);
  return st;
}

/* ------------------------------------------------------------ writer */

/* The layout (header, key order, data order and alignment) is
 * grove_safetensors_plan's (core/io/export_plan.c), which groved also streams
 * for ExportStateDict; the writer streams the same segments into the file.
 * Non-contiguous tensors are copied contiguous while planning. */
grove_status grove_safetensors_write(const char *path, const grove_state_dict *sd, grove_err *err) {
  if (!path || !sd)
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT,
                         "grove_safetensors_write: NULL path or state_dict");
  grove_file_plan *p = NULL;
  grove_status st = grove_safetensors_plan(sd, &p, err);
  return grove__file_plan_write(st, p, path, err);
}
