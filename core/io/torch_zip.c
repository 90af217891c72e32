/* torch_zip.c: the zip archives torch.save writes (a reader and a writer).
 *
 * Reader.  The archive is held in memory (a file read whole).  The end of
 * central directory record is found from the end of the file, its ZIP64
 * twin when a field is saturated, then every central directory entry; each
 * record's data is located through its own local header (whose name and
 * extra field lengths may differ from the central ones: torch pads the local
 * extra field so that data starts 64-byte aligned).  Stored and deflated
 * (zlib, raw inflate) records are read; everything else is refused:
 *
 *   no end record, entries or headers out of the file, bad signatures,
 *   sizes that contradict each other, NUL in a name      -> GROVE_E_FORMAT
 *   a record reaching past the end of the file           -> GROVE_E_TRUNCATED
 *   several disks, encryption, methods other than 0 / 8  -> GROVE_E_UNSUPPORTED
 *   two records with one name                            -> GROVE_E_DUPLICATE_KEY
 *   more than GROVE_ZIP_MAX_ENTRIES records              -> GROVE_E_LIMIT
 *   CRC-32 mismatch, deflate data that is invalid or does
 *   not inflate to exactly the declared size             -> GROVE_E_FORMAT
 *
 * A CRC-32 of 0 is not checked: torch can write archives without computing
 * CRCs (torch.serialization.set_crc32_options(False)) and then stores 0.
 * (torch itself checks no CRC at all; Grove checks them because a damaged
 * download should be refused, not served.)
 *
 * A deflated record may claim an uncompressed size at most 1032 times its
 * compressed size (deflate's largest ratio), its deflate stream must end
 * exactly at its last byte, and records may not overlap (each other, the
 * central directory or the end records): the compressed sizes then add up
 * to at most the file's size, so the bytes all records inflate to stay
 * within about 1032 times the file (a 24.5 KB file of overlapping entries
 * inflated to 512 MiB before).  Overlapping records -> GROVE_E_FORMAT.
 *
 * Writer.  Stored records only (deflate is kept for tests), each one's data
 * 64-byte aligned by a local extra field of id "FB" filled with 'Z', as
 * torch's PyTorchStreamWriter does, sizes and CRC in the local header (no
 * data descriptors), ZIP64 fields wherever a value needs them.
 */
#include <assert.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "fileio.h"
#include "torch_internal.h"

#define SIG_LOCAL 0x04034b50u
#define SIG_CENTRAL 0x02014b50u
#define SIG_EOCD 0x06054b50u
#define SIG_EOCD64 0x06064b50u
#define SIG_LOC64 0x07064b50u

#define EOCD_LEN 22u
#define EOCD64_LEN 56u
#define LOC64_LEN 20u
#define CENTRAL_LEN 46u
#define LOCAL_LEN 30u

static uint16_t rd16(const uint8_t *p) {
  return (uint16_t)(p[0] | p[1] << 8);
}
static uint32_t rd32(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t rd64(const uint8_t *p) {
  return (uint64_t)rd32(p) | (uint64_t)rd32(p + 4) << 32;
}

uint32_t grove__crc32(uint32_t crc, const void *data, size_t len) {
  const uint8_t *p = data;
  uLong c = crc;
  while (len > 0) {
    /* 64 KB at a time: a background build's yield points (core/base/yield.c). */
    uInt n = len > (1u << 16) ? (1u << 16) : (uInt)len;
    grove__yield_point();
    c = crc32(c, p, n);
    p += n;
    len -= n;
  }
  return (uint32_t)c;
}

/* =============================================================== reader */

/* Finds the end of central directory record: the last signature, searching
 * back over at most a maximal comment, whose comment ends the file. */
static grove_status find_eocd(const grove__zip *z, size_t *pos, grove_err *err) {
  if (z->len < EOCD_LEN)
    return grove_err_set(err, GROVE_E_FORMAT,
                         "%s: %zu bytes: too short for a zip archive (no end of central "
                         "directory record)",
                         z->name, z->len);
  size_t lowest = z->len - EOCD_LEN > 0xFFFF ? z->len - EOCD_LEN - 0xFFFF : 0;
  for (size_t p = z->len - EOCD_LEN + 1; p-- > lowest;) {
    if (rd32(z->buf + p) != SIG_EOCD) continue;
    if (p + EOCD_LEN + rd16(z->buf + p + 20) == z->len) {
      *pos = p;
      return GROVE_OK;
    }
  }
  return grove_err_set(err, GROVE_E_FORMAT,
                       "%s: not a zip archive: no end of central directory record", z->name);
}

/* The central directory's entry count, offset and size, from the end record
 * or, when that holds saturated fields, from the ZIP64 end record. */
static grove_status read_directory_bounds(const grove__zip *z, size_t eocd, uint64_t *count,
                                          uint64_t *cd_off, uint64_t *cd_size, uint64_t *cd_limit,
                                          grove_err *err) {
  const uint8_t *e = z->buf + eocd;
  uint16_t disk = rd16(e + 4), cd_disk = rd16(e + 6);
  uint64_t n_disk = rd16(e + 8), n = rd16(e + 10);
  *cd_size = rd32(e + 12);
  *cd_off = rd32(e + 16);
  *cd_limit = eocd;
  bool saturated = n == 0xFFFF || n_disk == 0xFFFF || *cd_size == 0xFFFFFFFFu ||
                   *cd_off == 0xFFFFFFFFu || disk == 0xFFFF || cd_disk == 0xFFFF;
  if (saturated && eocd >= LOC64_LEN && rd32(z->buf + eocd - LOC64_LEN) == SIG_LOC64) {
    const uint8_t *l = z->buf + eocd - LOC64_LEN;
    uint64_t e64 = rd64(l + 8);
    if (rd32(l + 4) != 0 || rd32(l + 16) > 1)
      return grove_err_set(err, GROVE_E_UNSUPPORTED,
                           "%s: a multi-disk (split) zip archive; Grove reads single files",
                           z->name);
    if (e64 > eocd - LOC64_LEN || eocd - LOC64_LEN - e64 < EOCD64_LEN ||
        rd32(z->buf + e64) != SIG_EOCD64)
      return grove_err_set(err, GROVE_E_FORMAT,
                           "%s: the ZIP64 end of central directory locator points to offset "
                           "%llu, where there is no ZIP64 end record",
                           z->name, (unsigned long long)e64);
    const uint8_t *r = z->buf + e64;
    disk = (uint16_t)(rd32(r + 16) != 0);
    cd_disk = (uint16_t)(rd32(r + 20) != 0);
    n_disk = rd64(r + 24);
    n = rd64(r + 32);
    *cd_size = rd64(r + 40);
    *cd_off = rd64(r + 48);
    *cd_limit = e64;
  }
  if (disk != 0 || cd_disk != 0 || n_disk != n)
    return grove_err_set(err, GROVE_E_UNSUPPORTED,
                         "%s: a multi-disk (split) zip archive; Grove reads single files", z->name);
  if (*cd_off > *cd_limit || *cd_size > *cd_limit - *cd_off)
    return grove_err_set(err, GROVE_E_FORMAT,
                         "%s: the central directory (offset %llu, %llu bytes) lies outside the "
                         "archive",
                         z->name, (unsigned long long)*cd_off, (unsigned long long)*cd_size);
  if (n > GROVE_ZIP_MAX_ENTRIES)
    return grove_err_set(err, GROVE_E_LIMIT, "%s: %llu records: Grove reads at most %u", z->name,
                         (unsigned long long)n, GROVE_ZIP_MAX_ENTRIES);
  if (n > *cd_size / CENTRAL_LEN)
    return grove_err_set(err, GROVE_E_FORMAT,
                         "%s: %llu records cannot fit a central directory of %llu bytes", z->name,
                         (unsigned long long)n, (unsigned long long)*cd_size);
  *count = n;
  return GROVE_OK;
}

/* Reads the ZIP64 extended information extra field (id 1) for the fields
 * that are saturated in the header, in the order the format fixes. */
static grove_status read_zip64_extra(const grove__zip *z, const char *rec, const uint8_t *extra,
                                     size_t extra_len, uint64_t *size, uint64_t *comp,
                                     uint64_t *offset, grove_err *err) {
  bool need_size = *size == 0xFFFFFFFFu, need_comp = *comp == 0xFFFFFFFFu,
       need_off = offset && *offset == 0xFFFFFFFFu;
  if (!need_size && !need_comp && !need_off) return GROVE_OK;
  size_t p = 0;
  while (extra_len - p >= 4) {
    uint16_t id = rd16(extra + p), n = rd16(extra + p + 2);
    if (n > extra_len - p - 4) break;
    if (id == 1) {
      const uint8_t *f = extra + p + 4;
      size_t want = 8u * (need_size + need_comp + need_off);
      if (n < want) break;
      if (need_size) *size = rd64(f), f += 8;
      if (need_comp) *comp = rd64(f), f += 8;
      if (need_off) *offset = rd64(f);
      return GROVE_OK;
    }
    p += 4u + n;
  }
  return grove_err_set(err, GROVE_E_FORMAT,
                       "%s: record '%s' has saturated sizes but no valid ZIP64 extra field",
                       z->name, rec);
}

/* Sorts entry indexes by name: a merge sort, since qsort would need the
 * entries through a global and the reader runs on any thread. */
static void sort_by_name(const grove__zip *z, size_t *idx, size_t *tmp, size_t n) {
  if (n < 2) return;
  size_t h = n / 2;
  sort_by_name(z, idx, tmp, h);
  sort_by_name(z, idx + h, tmp, n - h);
  size_t i = 0, j = h, k = 0;
  while (i < h && j < n)
    tmp[k++] = strcmp(z->entries[idx[j]].name, z->entries[idx[i]].name) < 0 ? idx[j++] : idx[i++];
  while (i < h) tmp[k++] = idx[i++];
  while (j < n) tmp[k++] = idx[j++];
  memcpy(idx, tmp, n * sizeof *idx);
}

/* A record's bytes in the archive: local header, name, extra, data. */
typedef struct span {
  uint64_t start, end;
  size_t entry;
} span;

static int span_cmp(const void *a, const void *b) {
  const span *x = a, *y = b;
  return x->start < y->start ? -1 : x->start > y->start;
}

/* Refuses records whose bytes overlap one another's or the central
 * directory's and end records'.  A real writer never does this; a hostile
 * one points many entries at one deflate stream (or one record's range over
 * the others') so that a small file inflates to many times its size.  With
 * the records disjoint, their compressed sizes add up to at most the file's
 * and the per-record ratio check bounds the total inflated bytes by about
 * 1032 times the file. */
static grove_status check_disjoint(const grove__zip *z, uint64_t cd_off, uint64_t cd_end,
                                   uint64_t cd_limit, grove_err *err) {
  span *s = malloc((z->count + 2) * sizeof *s);
  if (!s) return grove_err_set(err, GROVE_E_NOMEM, "%s: out of memory", z->name);
  size_t n = 0;
  for (size_t i = 0; i < z->count; i++) {
    const grove__zip_entry *e = &z->entries[i];
    s[n++] = (span){e->header_offset, e->data_offset + e->comp_size, i};
  }
  if (cd_end > cd_off) s[n++] = (span){cd_off, cd_end, SIZE_MAX};
  if (z->len > cd_limit) s[n++] = (span){cd_limit, z->len, SIZE_MAX};
  qsort(s, n, sizeof *s, span_cmp);
  grove_status st = GROVE_OK;
  for (size_t i = 1; i < n && st == GROVE_OK; i++) {
    if (s[i].start >= s[i - 1].end) continue;
    const span *a = &s[i - 1], *b = &s[i];
    if (a->entry == SIZE_MAX || b->entry == SIZE_MAX) {
      const span *r = a->entry == SIZE_MAX ? b : a;
      st = grove_err_set(err, GROVE_E_FORMAT,
                         "%s: record '%s' (bytes %llu to %llu) overlaps the central directory",
                         z->name, z->entries[r->entry].name, (unsigned long long)r->start,
                         (unsigned long long)r->end);
    } else {
      st = grove_err_set(err, GROVE_E_FORMAT,
                         "%s: records '%s' and '%s' overlap (bytes %llu to %llu and %llu to %llu)",
                         z->name, z->entries[a->entry].name, z->entries[b->entry].name,
                         (unsigned long long)a->start, (unsigned long long)a->end,
                         (unsigned long long)b->start, (unsigned long long)b->end);
    }
  }
  free(s);
  return st;
}

/* Parses one central directory entry at *p and its local header. */
static grove_status read_entry(const grove__zip *z, uint64_t *p, uint64_t cd_end,
                               grove__zip_entry *e, grove_err *err) {
  if (cd_end - *p < CENTRAL_LEN || rd32(z->buf + *p) != SIG_CENTRAL)
    return grove_err_set(err, GROVE_E_FORMAT, "%s: no central directory entry at offset %llu",
                         z->name, (unsigned long long)*p);
  const uint8_t *c = z->buf + *p;
  uint16_t flags = rd16(c + 8), method = rd16(c + 10);
  uint32_t crc = rd32(c + 16);
  uint64_t comp = rd32(c + 20), size = rd32(c + 24);
  size_t name_len = rd16(c + 28), extra_len = rd16(c + 30), comment_len = rd16(c + 32);
  uint16_t disk = rd16(c + 34);
  uint64_t lho = rd32(c + 42);
  if (cd_end - *p - CENTRAL_LEN < (uint64_t)name_len + extra_len + comment_len)
    return grove_err_set(err, GROVE_E_FORMAT,
                         "%s: the central directory entry at offset %llu runs past the directory",
                         z->name, (unsigned long long)*p);
  const uint8_t *name = c + CENTRAL_LEN;
  if (memchr(name, 0, name_len))
    return grove_err_set(err, GROVE_E_FORMAT, "%s: a record name holds a NUL byte", z->name);
  e->name = malloc(name_len + 1);
  if (!e->name) return grove_err_set(err, GROVE_E_NOMEM, "%s: out of memory", z->name);
  memcpy(e->name, name, name_len);
  e->name[name_len] = '\0';
  *p += CENTRAL_LEN + name_len + extra_len + comment_len;

  grove_status st =
      read_zip64_extra(z, e->name, name + name_len, extra_len, &size, &comp, &lho, err);
  if (st != GROVE_OK) return st;
  if (disk != 0 && disk != 0xFFFF)
    return grove_err_set(err, GROVE_E_UNSUPPORTED,
                         "%s: a multi-disk (split) zip archive; Grove reads single files", z->name);
  if (flags & 1u)
    return grove_err_set(err, GROVE_E_UNSUPPORTED, "%s: record '%s' is encrypted", z->name,
                         e->name);
  if (method != 0 && method != 8)
    return grove_err_set(err, GROVE_E_UNSUPPORTED,
                         "%s: record '%s' uses compression method %u; Grove reads stored (0) "
                         "and deflated (8) records",
                         z->name, e->name, method);
  if (method == 0 && comp != size)
    return grove_err_set(err, GROVE_E_FORMAT,
                         "%s: record '%s' is stored but its sizes differ (%llu compressed, %llu "
                         "uncompressed)",
                         z->name, e->name, (unsigned long long)comp, (unsigned long long)size);
  if (method == 8 && (size > comp * 1032u + 1032u))
    return grove_err_set(err, GROVE_E_FORMAT,
                         "%s: record '%s' claims %llu bytes from %llu deflated bytes, more than "
                         "deflate can encode",
                         z->name, e->name, (unsigned long long)size, (unsigned long long)comp);

  /* The local header: its own name and extra lengths decide where data is. */
  if (lho > z->len || z->len - lho < LOCAL_LEN || rd32(z->buf + lho) != SIG_LOCAL)
    return grove_err_set(err, GROVE_E_FORMAT, "%s: record '%s': no local header at offset %llu",
                         z->name, e->name, (unsigned long long)lho);
  const uint8_t *l = z->buf + lho;
  size_t lname = rd16(l + 26), lextra = rd16(l + 28);
  uint64_t data = lho + LOCAL_LEN + lname + lextra;
  if (data > z->len)
    return grove_err_set(err, GROVE_E_TRUNCATED,
                         "%s: record '%s': its local header runs past the end of the file", z->name,
                         e->name);
  if (lname != name_len || memcmp(l + LOCAL_LEN, name, name_len) != 0)
    return grove_err_set(err, GROVE_E_FORMAT,
                         "%s: record '%s': the local header names another record", z->name,
                         e->name);
  if (comp > z->len - data)
    return grove_err_set(err, GROVE_E_TRUNCATED,
                         "%s: record '%s': %llu bytes at offset %llu reach past the end of the "
                         "file (%zu bytes; is it truncated?)",
                         z->name, e->name, (unsigned long long)comp, (unsigned long long)data,
                         z->len);
  if (size > (uint64_t)SIZE_MAX / 2)
    return grove_err_set(err, GROVE_E_LIMIT, "%s: record '%s': %llu bytes is too large", z->name,
                         e->name, (unsigned long long)size);
  e->header_offset = lho;
  e->data_offset = data;
  e->comp_size = comp;
  e->size = size;
  e->crc = crc;
  e->method = method;
  return GROVE_OK;
}

grove_status grove__zip_open(grove__zip *z, const void *buf, size_t len, const char *name,
                             grove_err *err) {
  memset(z, 0, sizeof *z);
  z->buf = buf;
  z->len = len;
  z->name = name ? name : "<buffer>";
  size_t eocd = 0;
  uint64_t count = 0, cd_off = 0, cd_size = 0, cd_limit = 0;
  grove_status st = find_eocd(z, &eocd, err);
  if (st == GROVE_OK)
    st = read_directory_bounds(z, eocd, &count, &cd_off, &cd_size, &cd_limit, err);
  if (st != GROVE_OK) return st;

  z->entries = calloc(count ? count : 1, sizeof *z->entries);
  z->by_name = malloc((count ? count : 1) * sizeof *z->by_name);
  size_t *tmp = malloc((count ? count : 1) * sizeof *tmp);
  if (!z->entries || !z->by_name || !tmp) {
    free(tmp);
    grove__zip_close(z);
    return grove_err_set(err, GROVE_E_NOMEM, "%s: out of memory", z->name);
  }
  uint64_t p = cd_off, cd_end = cd_off + cd_size;
  for (size_t i = 0; i < count; i++) {
    z->count = i + 1; /* so that close frees this entry's name */
    st = read_entry(z, &p, cd_end, &z->entries[i], err);
    if (st != GROVE_OK) break;
    z->by_name[i] = i;
  }
  if (st == GROVE_OK) st = check_disjoint(z, cd_off, cd_end, cd_limit, err);
  if (st == GROVE_OK) {
    sort_by_name(z, z->by_name, tmp, (size_t)count);
    for (size_t i = 1; i < count && st == GROVE_OK; i++)
      if (strcmp(z->entries[z->by_name[i - 1]].name, z->entries[z->by_name[i]].name) == 0)
        st = grove_err_set(err, GROVE_E_DUPLICATE_KEY, "%s: two records are named '%s'", z->name,
                           z->entries[z->by_name[i]].name);
  }
  free(tmp);
  if (st != GROVE_OK) grove__zip_close(z);
  return st;
}

void grove__zip_close(grove__zip *z) {
  if (!z) return;
  for (size_t i = 0; i < z->count && z->entries; i++) free(z->entries[i].name);
  free(z->entries);
  free(z->by_name);
  z->entries = NULL;
  z->by_name = NULL;
  z->count = 0;
}

const grove__zip_entry *grove__zip_find(const grove__zip *z, const char *name) {
  size_t lo = 0, hi = z->count;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    const grove__zip_entry *e = &z->entries[z->by_name[mid]];
    int c = strcmp(e->name, name);
    if (c == 0) return e;
    if (c < 0)
      lo = mid + 1;
    else
      hi = mid;
  }
  return NULL;
}

static grove_status check_crc(const grove__zip *z, const grove__zip_entry *e, const void *data,
                              grove_err *err) {
#ifdef FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION
  /* The fuzz build (mk/fuzz.mk) skips the check so that mutated records
   * reach the unpickler instead of stopping at their CRC. */
  (void)z, (void)e, (void)data, (void)err;
  return GROVE_OK;
#endif
  if (e->crc == 0) return GROVE_OK;
  uint32_t got = grove__crc32(0, data, (size_t)e->size);
  if (got != e->crc)
    return grove_err_set(err, GROVE_E_FORMAT,
                         "%s: record '%s' is damaged: CRC-32 %08x, the archive says %08x", z->name,
                         e->name, got, e->crc);
  return GROVE_OK;
}

grove_status grove__zip_stored(const grove__zip *z, const grove__zip_entry *e, const uint8_t **data,
                               grove_err *err) {
  *data = NULL;
  if (e->method != 0)
    return grove_err_set(err, GROVE_E_INTERNAL, "%s: record '%s' is not stored", z->name, e->name);
  grove_status st = check_crc(z, e, z->buf + e->data_offset, err);
  if (st == GROVE_OK) *data = z->buf + e->data_offset;
  return st;
}

static grove_status inflate_into(const grove__zip *z, const grove__zip_entry *e, uint8_t *dst,
                                 grove_err *err) {
  z_stream s;
  memset(&s, 0, sizeof s);
  if (inflateInit2(&s, -MAX_WBITS) != Z_OK)
    return grove_err_set(err, GROVE_E_NOMEM, "%s: out of memory (zlib)", z->name);
  const uint8_t *in = z->buf + e->data_offset;
  uint64_t in_left = e->comp_size, out_left = e->size;
  const char *why = NULL;
  bool ok = false, nomem = false;
  /* zlib refuses a NULL output pointer even when there is no room. */
  uint8_t spare;
  s.next_out = e->size ? dst : &spare;
  for (;;) {
    if (s.avail_in == 0 && in_left > 0) {
      s.avail_in = in_left > (1u << 30) ? (1u << 30) : (uInt)in_left;
      s.next_in = (Bytef *)in;
      in += s.avail_in;
      in_left -= s.avail_in;
    }
    if (s.avail_out == 0 && out_left > 0) {
      s.avail_out = out_left > (1u << 30) ? (1u << 30) : (uInt)out_left;
      s.next_out = dst;
      dst += s.avail_out;
      out_left -= s.avail_out;
    }
    bool out_full = s.avail_out == 0 && out_left == 0;
    bool in_done = s.avail_in == 0 && in_left == 0;
    int r = inflate(&s, Z_NO_FLUSH);
    if (r == Z_OK) continue; /* progress was made */
    if (r == Z_STREAM_END) {
      /* The stream must use the record's bytes, all of them: the ratio
       * check (read_entry) trusted the claimed compressed size, and bytes
       * left over would be room for another record's data. */
      ok = s.avail_out == 0 && out_left == 0 && s.avail_in == 0 && in_left == 0;
      why = s.avail_in || in_left ? "ends its deflate stream before the record's last byte"
                                  : "inflates to fewer bytes than its declared size";
    } else if (r == Z_BUF_ERROR && out_full) {
      why = "inflates to more bytes than its declared size";
    } else if (r == Z_BUF_ERROR && in_done) {
      why = "ends before its deflate stream does";
    } else if (r == Z_MEM_ERROR) {
      nomem = true;
    } else {
      why = "holds invalid deflate data";
    }
    break;
  }
  inflateEnd(&s);
  if (ok) return GROVE_OK;
  if (nomem) return grove_err_set(err, GROVE_E_NOMEM, "%s: out of memory (zlib)", z->name);
  return grove_err_set(err, GROVE_E_FORMAT, "%s: record '%s' %s (%llu bytes)", z->name, e->name,
                       why, (unsigned long long)e->size);
}

grove_status grove__zip_extract(const grove__zip *z, const grove__zip_entry *e, void *dst,
                                grove_err *err) {
  if (e->method == 0) {
    if (e->size > 0) memcpy(dst, z->buf + e->data_offset, (size_t)e->size);
  } else if (e->size > 0 || e->comp_size > 0) {
    grove_status st = inflate_into(z, e, dst, err);
    if (st != GROVE_OK) return st;
  }
  return check_crc(z, e, dst, err);
}

/* =============================================================== writer */

/* The archive layout lives in grove__zip_dir alone: grove__zipw below
 * writes its bytes as they come, and the torch file plan
 * (core/io/export_plan.c, which grove_torch_write streams) lays the same bytes
 * out as segments. */

typedef struct zipw_rec {
  char *name;
  uint64_t offset; /* of the local header */
  uint64_t comp_size, size;
  uint32_t crc;
  uint16_t method;
} zipw_rec;

struct grove__zip_dir {
  bool force_zip64;
  zipw_rec *recs;
  size_t n, cap;
  uint8_t *buf; /* the bytes last encoded */
  size_t len, buf_cap;
};

grove__zip_dir *grove__zip_dir_new(bool force_zip64) {
  grove__zip_dir *d = calloc(1, sizeof *d);
  if (d) d->force_zip64 = force_zip64;
  return d;
}

void grove__zip_dir_free(grove__zip_dir *d) {
  if (!d) return;
  for (size_t i = 0; i < d->n; i++) free(d->recs[i].name);
  free(d->recs);
  free(d->buf);
  free(d);
}

static bool dput(grove__zip_dir *d, const void *data, size_t n) {
  if (n > d->buf_cap - d->len) {
    size_t cap = d->buf_cap ? d->buf_cap : 256;
    while (cap - d->len < n) {
      if (cap > SIZE_MAX / 2) return false;
      cap *= 2;
    }
    uint8_t *b = realloc(d->buf, cap);
    if (!b) return false;
    d->buf = b;
    d->buf_cap = cap;
  }
  if (n) memcpy(d->buf + d->len, data, n);
  d->len += n;
  return true;
}

static void wr16(uint8_t *p, uint16_t v) {
  p[0] = (uint8_t)v;
  p[1] = (uint8_t)(v >> 8);
}
static void wr32(uint8_t *p, uint32_t v) {
  wr16(p, (uint16_t)v);
  wr16(p + 2, (uint16_t)(v >> 16));
}
static void wr64(uint8_t *p, uint64_t v) {
  wr32(p, (uint32_t)v);
  wr32(p + 4, (uint32_t)(v >> 32));
}

static uint32_t sat32(uint64_t v, bool force) {
  return force || v >= 0xFFFFFFFFu ? 0xFFFFFFFFu : (uint32_t)v;
}

grove_status grove__zip_deflate(const void *data, size_t len, uint8_t **out, size_t *out_len,
                                grove_err *err) {
  z_stream s;
  memset(&s, 0, sizeof s);
  if (len > (1u << 30) ||
      deflateInit2(&s, 6, Z_DEFLATED, -MAX_WBITS, 8, Z_DEFAULT_STRATEGY) != Z_OK)
    return grove_err_set(err, GROVE_E_NOMEM, "cannot deflate a record");
  uLong bound = deflateBound(&s, (uLong)len);
  uint8_t *buf = malloc(bound ? bound : 1);
  if (!buf) {
    deflateEnd(&s);
    return grove_err_set(err, GROVE_E_NOMEM, "out of memory");
  }
  s.next_in = (Bytef *)data;
  s.avail_in = (uInt)len;
  s.next_out = buf;
  s.avail_out = (uInt)bound;
  int r = deflate(&s, Z_FINISH);
  *out_len = s.total_out;
  deflateEnd(&s);
  if (r != Z_STREAM_END) {
    free(buf);
    return grove_err_set(err, GROVE_E_INTERNAL, "deflate failed");
  }
  *out = buf;
  return GROVE_OK;
}

grove_status grove__zip_dir_add(grove__zip_dir *d, const char *record, uint64_t offset,
                                uint32_t crc, uint64_t size, uint64_t comp_size, uint16_t method,
                                const uint8_t **hdr, size_t *hdr_len, grove_err *err) {
  size_t name_len = strlen(record);
  if (name_len > 0xFFFF) return grove_err_set(err, GROVE_E_LIMIT, "record name too long");
  if (d->n == d->cap) {
    size_t cap = d->cap ? d->cap * 2 : 16;
    zipw_rec *r = realloc(d->recs, cap * sizeof *r);
    if (!r) return grove_err_set(err, GROVE_E_NOMEM, "out of memory");
    d->recs = r;
    d->cap = cap;
  }
  zipw_rec *rec = &d->recs[d->n];
  *rec = (zipw_rec){.name = grove__strdup(record),
                    .offset = offset,
                    .comp_size = comp_size,
                    .size = size,
                    .crc = crc,
                    .method = method};
  if (!rec->name) return grove_err_set(err, GROVE_E_NOMEM, "out of memory");
  d->n++;

  bool zip64 = d->force_zip64 || size >= 0xFFFFFFFFu || comp_size >= 0xFFFFFFFFu;
  /* The padding extra field ("FB", length, 'Z'...) makes the data start on a
   * 64-byte boundary, as torch's writer does: tensors can then be mapped and
   * used in place. */
  uint64_t start = offset + LOCAL_LEN + name_len + 4 + (zip64 ? 20 : 0);
  size_t pad = (size_t)((64 - start % 64) % 64);
  uint8_t h[LOCAL_LEN], x[20 + 4 + 64];
  wr32(h, SIG_LOCAL);
  wr16(h + 4, zip64 ? 45 : 20); /* version needed */
  wr16(h + 6, 0x0800);          /* names are UTF-8 */
  wr16(h + 8, method);
  wr16(h + 10, 0);    /* time */
  wr16(h + 12, 0x21); /* date: 1980-01-01 */
  wr32(h + 14, crc);
  wr32(h + 18, zip64 ? 0xFFFFFFFFu : (uint32_t)comp_size);
  wr32(h + 22, zip64 ? 0xFFFFFFFFu : (uint32_t)size);
  wr16(h + 26, (uint16_t)name_len);
  wr16(h + 28, (uint16_t)((zip64 ? 20 : 0) + 4 + pad));
  size_t k = 0;
  if (zip64) {
    wr16(x, 1);
    wr16(x + 2, 16);
    wr64(x + 4, size);
    wr64(x + 12, comp_size);
    k = 20;
  }
  wr16(x + k, 0x4246); /* "FB" */
  wr16(x + k + 2, (uint16_t)pad);
  memset(x + k + 4, 'Z', pad);
  k += 4 + pad;
  d->len = 0;
  if (!dput(d, h, LOCAL_LEN) || !dput(d, record, name_len) || !dput(d, x, k))
    return grove_err_set(err, GROVE_E_NOMEM, "out of memory");
  assert((offset + d->len) % 64 == 0);
  *hdr = d->buf;
  *hdr_len = d->len;
  return GROVE_OK;
}

grove_status grove__zip_dir_finish(grove__zip_dir *d, uint64_t cd_off, const uint8_t **out,
                                   size_t *len, grove_err *err) {
  bool force = d->force_zip64, ok = true;
  d->len = 0;
  for (size_t i = 0; i < d->n && ok; i++) {
    const zipw_rec *r = &d->recs[i];
    bool big_size = force || r->size >= 0xFFFFFFFFu,
         big_comp = force || r->comp_size >= 0xFFFFFFFFu,
         big_off = force || r->offset >= 0xFFFFFFFFu;
    size_t name_len = strlen(r->name);
    size_t x = 8u * (big_size + big_comp + big_off);
    uint8_t c[CENTRAL_LEN + 28];
    memset(c, 0, sizeof c);
    wr32(c, SIG_CENTRAL);
    wr16(c + 4, 0x0300 | (x ? 45 : 20)); /* made by: Unix */
    wr16(c + 6, x ? 45 : 20);
    wr16(c + 8, 0x0800);
    wr16(c + 10, r->method);
    wr16(c + 12, 0);
    wr16(c + 14, 0x21);
    wr32(c + 16, r->crc);
    wr32(c + 20, sat32(r->comp_size, force));
    wr32(c + 24, sat32(r->size, force));
    wr16(c + 28, (uint16_t)name_len);
    wr16(c + 30, (uint16_t)(x ? x + 4 : 0));
    wr32(c + 38, 0644u << 16); /* external attributes: a regular file */
    wr32(c + 42, sat32(r->offset, force));
    uint8_t *f = c + CENTRAL_LEN;
    if (x) {
      wr16(f, 1);
      wr16(f + 2, (uint16_t)x);
      f += 4;
      if (big_size) wr64(f, r->size), f += 8;
      if (big_comp) wr64(f, r->comp_size), f += 8;
      if (big_off) wr64(f, r->offset), f += 8;
    }
    ok = dput(d, c, CENTRAL_LEN) && dput(d, r->name, name_len) &&
         (!x || dput(d, c + CENTRAL_LEN, x + 4));
  }
  uint64_t cd_size = d->len;
  bool zip64 = force || d->n >= 0xFFFF || cd_off >= 0xFFFFFFFFu || cd_size >= 0xFFFFFFFFu;
  if (ok && zip64) {
    uint8_t r[EOCD64_LEN + LOC64_LEN];
    wr32(r, SIG_EOCD64);
    wr64(r + 4, EOCD64_LEN - 12);
    wr16(r + 12, 0x0300 | 45);
    wr16(r + 14, 45);
    wr32(r + 16, 0);
    wr32(r + 20, 0);
    wr64(r + 24, d->n);
    wr64(r + 32, d->n);
    wr64(r + 40, cd_size);
    wr64(r + 48, cd_off);
    uint8_t *l = r + EOCD64_LEN;
    wr32(l, SIG_LOC64);
    wr32(l + 4, 0);
    wr64(l + 8, cd_off + cd_size); /* where the ZIP64 end record starts */
    wr32(l + 16, 1);
    ok = dput(d, r, sizeof r);
  }
  uint8_t e[EOCD_LEN];
  wr32(e, SIG_EOCD);
  wr16(e + 4, 0);
  wr16(e + 6, 0);
  uint16_t n16 = zip64 || d->n >= 0xFFFF ? 0xFFFF : (uint16_t)d->n;
  wr16(e + 8, n16);
  wr16(e + 10, n16);
  wr32(e + 12, sat32(cd_size, zip64));
  wr32(e + 16, sat32(cd_off, zip64));
  wr16(e + 20, 0);
  if (!ok || !dput(d, e, sizeof e)) return grove_err_set(err, GROVE_E_NOMEM, "out of memory");
  *out = d->buf;
  *len = d->len;
  return GROVE_OK;
}

struct grove__zipw {
  int fd;
  const char *name;
  bool deflate;
  uint64_t pos; /* bytes written so far */
  uint8_t *mem; /* memory sink (fd < 0) */
  size_t mem_cap;
  grove__zip_dir *dir;
  bool failed;
};

grove__zipw *grove__zipw_new(int fd, const char *name, const grove__zipw_opts *opts) {
  grove__zipw *w = calloc(1, sizeof *w);
  if (!w) return NULL;
  w->fd = fd;
  w->name = name ? name : "<buffer>";
  w->deflate = opts && opts->deflate;
  if (!(w->dir = grove__zip_dir_new(opts && opts->force_zip64))) {
    free(w);
    return NULL;
  }
  return w;
}

void grove__zipw_free(grove__zipw *w) {
  if (!w) return;
  grove__zip_dir_free(w->dir);
  free(w->mem);
  free(w);
}

const uint8_t *grove__zipw_data(const grove__zipw *w, size_t *len) {
  if (len) *len = (size_t)w->pos;
  return w->mem;
}

static grove_status emit(grove__zipw *w, const void *data, size_t n, grove_err *err) {
  if (n == 0) return GROVE_OK;
  if (w->fd >= 0) {
    if (grove__write_all(w->fd, data, n) != 0) {
      w->failed = true;
      return grove_err_set(err, GROVE_E_IO, "%s: write failed: %s", w->name, strerror(errno));
    }
  } else {
    if (n > w->mem_cap - (size_t)w->pos) {
      size_t cap = w->mem_cap ? w->mem_cap : 4096;
      while (cap - (size_t)w->pos < n) {
        if (cap > SIZE_MAX / 2) {
          w->failed = true;
          return grove_err_set(err, GROVE_E_NOMEM, "%s: out of memory", w->name);
        }
        cap *= 2;
      }
      uint8_t *m = realloc(w->mem, cap);
      if (!m) {
        w->failed = true;
        return grove_err_set(err, GROVE_E_NOMEM, "%s: out of memory", w->name);
      }
      w->mem = m;
      w->mem_cap = cap;
    }
    memcpy(w->mem + w->pos, data, n);
  }
  w->pos += n;
  return GROVE_OK;
}

grove_status grove__zipw_add(grove__zipw *w, const char *record, const void *data, size_t len,
                             grove_err *err) {
  if (w->failed) return grove_err_set(err, GROVE_E_IO, "%s: an earlier write failed", w->name);
  const uint8_t *payload = data, *hdr = NULL;
  uint8_t *deflated = NULL;
  size_t payload_len = len, hdr_len = 0;
  grove_status st = GROVE_OK;
  if (w->deflate && (st = grove__zip_deflate(data, len, &deflated, &payload_len, err)) == GROVE_OK)
    payload = deflated;
  if (st == GROVE_OK)
    st = grove__zip_dir_add(w->dir, record, w->pos, grove__crc32(0, data, len), len, payload_len,
                            w->deflate ? 8 : 0, &hdr, &hdr_len, err);
  if (st != GROVE_OK) {
    grove_err_prefix(err, "%s", w->name);
  } else {
    st = emit(w, hdr, hdr_len, err);
    if (st == GROVE_OK) st = emit(w, payload, payload_len, err);
  }
  free(deflated);
  return st;
}

grove_status grove__zipw_finish(grove__zipw *w, grove_err *err) {
  if (w->failed) return grove_err_set(err, GROVE_E_IO, "%s: an earlier write failed", w->name);
  const uint8_t *tail = NULL;
  size_t n = 0;
  grove_status st = grove__zip_dir_finish(w->dir, w->pos, &tail, &n, err);
  if (st != GROVE_OK) {
    grove_err_prefix(err, "%s", w->name);
    return st;
  }
  return emit(w, tail, n, err);
}
