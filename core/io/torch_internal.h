/* torch_internal.h: the pieces of Grove's torch.save support, for the files
 * that implement it (torch_zip.c, pickle.c, pickle_write.c, torch_load.c,
 * torch_save.c, export_plan.c), core/train/optim_io.c, the tests and the
 * fuzz targets.  Never installed.
 *
 * Three layers, each with one job:
 *   - torch_zip.c reads a zip archive held in memory (stored and deflated
 *     records, ZIP64) and writes one (stored records aligned to 64 bytes, as
 *     torch's writer does);
 *   - pickle.c turns pickle bytes into a small tree of values.  Globals are
 *     data tags from an allow-list; REDUCE and NEWOBJ only record "call tag
 *     with these arguments"; nothing from the file is ever executed;
 *   - torch_load.c walks that tree into a grove_state_dict; export_plan.c
 *     lays one out as torch.save would (pickle, storages, records encoded
 *     by torch_zip.c's grove__zip_dir), and torch_save.c writes that plan.
 *
 * Every function here may be called from any thread; none keeps state
 * between calls. */
#ifndef GROVE_TORCH_INTERNAL_H
#define GROVE_TORCH_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base.h"
#include "grove/checkpoint.h"
#include "grove/state_dict.h"
#include "grove/status.h"
#include "grove/tensor.h"

/* ================================================================ limits */

/* Most records a zip archive may list (each torch storage is one record). */
#define GROVE_ZIP_MAX_ENTRIES (1u << 20)
/* Largest data.pkl accepted, uncompressed. */
#define GROVE_PKL_MAX_BYTES ((size_t)256 << 20)
/* Pickle machine limits: values on the stack (all marks together), nested
 * MARKs, memo index, bytes of one string, items of one container, values
 * built in total.  Each is far above what torch.save writes for the largest
 * models and keeps a hostile file's memory proportional to its size. */
#define GROVE_PKL_MAX_STACK (1u << 22)
#define GROVE_PKL_MAX_MARKS 4096u
#define GROVE_PKL_MAX_MEMO (1u << 22)
#define GROVE_PKL_MAX_STR ((size_t)16 << 20)
#define GROVE_PKL_MAX_CONTAINER (1u << 22)
#define GROVE_PKL_MAX_VALUES (1u << 22)
/* _metadata entries read from one state_dict. */
#define GROVE_TORCH_MAX_META (1u << 15)

/* ================================================================ zip reader */

typedef struct grove__zip_entry {
  char *name;             /* NUL-terminated copy of the record's name */
  uint64_t header_offset; /* its local header's first byte in the archive */
  uint64_t data_offset;   /* first byte of the record's data in the archive */
  uint64_t comp_size;     /* bytes in the archive */
  uint64_t size;          /* bytes once inflated */
  uint32_t crc;           /* CRC-32 from the central directory; 0 = not checked */
  uint16_t method;        /* 0 stored, 8 deflated */
} grove__zip_entry;

typedef struct grove__zip {
  const uint8_t *buf; /* the whole archive (borrowed) */
  size_t len;
  const char *name;          /* for messages (borrowed) */
  grove__zip_entry *entries; /* central directory order */
  size_t count;
  size_t *by_name; /* entry indexes sorted by name, for lookups */
} grove__zip;

/* Parses the central directory of the archive in buf[0, len) and locates
 * every record's data through its local header.  buf must outlive z.  On
 * error z is left empty (grove__zip_close is still safe). */
grove_status grove__zip_open(grove__zip *z, const void *buf, size_t len, const char *name,
                             grove_err *err);
void grove__zip_close(grove__zip *z);
/* The entry called name, or NULL. */
const grove__zip_entry *grove__zip_find(const grove__zip *z, const char *name);
/* Copies (stored) or inflates (deflated) the record into dst, which holds
 * exactly e->size bytes, and checks its CRC-32. */
grove_status grove__zip_extract(const grove__zip *z, const grove__zip_entry *e, void *dst,
                                grove_err *err);
/* A stored record's bytes in place (after checking the CRC-32).  Refuses a
 * deflated record with GROVE_E_INTERNAL: callers check e->method. */
grove_status grove__zip_stored(const grove__zip *z, const grove__zip_entry *e, const uint8_t **data,
                               grove_err *err);

/* ================================================================ zip writer */

typedef struct grove__zipw grove__zipw;

typedef struct grove__zipw_opts {
  bool force_zip64; /* ZIP64 fields even when nothing needs them (tests) */
  bool deflate;     /* deflate records instead of storing them (tests) */
} grove__zipw_opts;

/* A writer appending to fd (not owned; positioned at 0) or, with fd < 0, to
 * a growing memory buffer.  name is used in messages.  NULL when out of
 * memory.  opts may be NULL. */
grove__zipw *grove__zipw_new(int fd, const char *name, const grove__zipw_opts *opts);
/* Appends one record whose data starts 64-byte aligned in the archive. */
grove_status grove__zipw_add(grove__zipw *w, const char *record, const void *data, size_t len,
                             grove_err *err);
/* Writes the central directory and the end records. */
grove_status grove__zipw_finish(grove__zipw *w, grove_err *err);
/* The memory archive (fd < 0): borrowed, valid until grove__zipw_free. */
const uint8_t *grove__zipw_data(const grove__zipw *w, size_t *len);
void grove__zipw_free(grove__zipw *w);

/* The archive layout itself, shared by grove__zipw (which writes the bytes
 * as it goes) and the torch file plan (core/io/export_plan.c, which lays the
 * same bytes out as segments for grove_torch_write and groved's export): the
 * records listed so far and the encoding of every header.  Messages are not
 * prefixed with a file name; callers add theirs. */
typedef struct grove__zip_dir grove__zip_dir;

/* NULL when out of memory.  force_zip64: as grove__zipw_opts. */
grove__zip_dir *grove__zip_dir_new(bool force_zip64);
void grove__zip_dir_free(grove__zip_dir *d);
/* Lists a record whose local header starts at offset in the archive and
 * encodes that header: signature, name, then the extra fields (ZIP64 when
 * needed, padding) that make the data following it start 64-byte aligned.
 * *hdr is borrowed from d until the next call on d. */
grove_status grove__zip_dir_add(grove__zip_dir *d, const char *record, uint64_t offset,
                                uint32_t crc, uint64_t size, uint64_t comp_size, uint16_t method,
                                const uint8_t **hdr, size_t *hdr_len, grove_err *err);
/* Encodes the central directory of every record listed, starting at offset
 * cd_off, and the end records: the rest of the archive.  *out as above. */
grove_status grove__zip_dir_finish(grove__zip_dir *d, uint64_t cd_off, const uint8_t **out,
                                   size_t *len, grove_err *err);
/* Raw deflate of data (at most 1 GiB) into a new malloc'd *out (tests'
 * deflated archives: torch writes stored records). */
grove_status grove__zip_deflate(const void *data, size_t len, uint8_t **out, size_t *out_len,
                                grove_err *err);

/* CRC-32 (zlib's) of any length. */
uint32_t grove__crc32(uint32_t crc, const void *data, size_t len);

/* ================================================================ pickle */

typedef enum grove__pk_kind {
  GROVE__PK_NONE,
  GROVE__PK_BOOL,
  GROVE__PK_INT,    /* fits int64 */
  GROVE__PK_BIGINT, /* a LONG that does not: kept as a tag, value unknown */
  GROVE__PK_FLOAT,
  GROVE__PK_STR, /* UTF-8, NUL-terminated (may hold NULs: use len) */
  GROVE__PK_BYTES,
  GROVE__PK_TUPLE,
  GROVE__PK_LIST,
  GROVE__PK_SET,
  GROVE__PK_DICT,   /* items are key, value, key, value, ... in order */
  GROVE__PK_GLOBAL, /* an allow-listed global: a data tag */
  GROVE__PK_CALL,   /* REDUCE or NEWOBJ of a global: func(args), not run */
  GROVE__PK_PERSID, /* BINPERSID: a reference to a storage record */
} grove__pk_kind;

/* The globals Grove recognises.  Anything else is refused. */
typedef enum grove__pk_tag {
  GROVE__TAG_ORDERED_DICT,
  GROVE__TAG_REBUILD_TENSOR, /* torch._utils._rebuild_tensor */
  GROVE__TAG_REBUILD_TENSOR_V2,
  GROVE__TAG_REBUILD_TENSOR_V3,
  GROVE__TAG_REBUILD_PARAMETER,
  GROVE__TAG_REBUILD_PARAMETER_WITH_STATE,
  GROVE__TAG_REBUILD_FROM_TYPE_V2, /* torch._tensor._rebuild_from_type_v2 */
  GROVE__TAG_REBUILD_UNSUPPORTED,  /* quantized, sparse, meta, subclass rebuilds */
  GROVE__TAG_PARAMETER,            /* torch.nn.parameter.Parameter */
  GROVE__TAG_TENSOR,               /* torch.Tensor */
  GROVE__TAG_SIZE,                 /* torch.Size */
  GROVE__TAG_DEVICE,               /* torch.device */
  GROVE__TAG_GET_LAYOUT,           /* torch.serialization._get_layout */
  GROVE__TAG_CODECS_ENCODE,        /* _codecs.encode (protocol-2 bytes) */
  GROVE__TAG_SET,                  /* builtins.set */
  GROVE__TAG_STORAGE,              /* torch.FloatStorage, ..., UntypedStorage */
  GROVE__TAG_DTYPE,                /* torch.float32, ... */
  GROVE__TAG_QSCHEME,              /* torch.per_tensor_affine, ... */
} grove__pk_tag;

typedef struct grove__pk grove__pk;
struct grove__pk {
  grove__pk_kind kind;
  union {
    bool b;
    int64_t i;
    double f;
    struct {
      char *s;
      size_t len;
    } str; /* STR, BYTES */
    struct {
      grove__pk **items;
      size_t n, cap;
    } seq; /* TUPLE, LIST, SET, DICT */
    struct {
      grove__pk_tag tag;
      const char *name;  /* "torch.FloatStorage" (static) */
      bool dtype_ok;     /* STORAGE / DTYPE: Grove has this dtype */
      bool untyped;      /* STORAGE: UntypedStorage (bytes) */
      grove_dtype dtype; /* STORAGE / DTYPE when dtype_ok */
      const char *what;  /* REBUILD_UNSUPPORTED: "a quantized tensor" */
    } global;
    struct {
      grove__pk *func; /* a GLOBAL */
      grove__pk *args; /* usually a TUPLE */
      bool newobj;
    } call;
    grove__pk *pid; /* PERSID */
  } u;
  /* BUILD state set on a DICT (OrderedDict attributes such as _metadata)
   * or a CALL (a tensor's Python attributes); NULL when none. */
  grove__pk *state;
  /* DICT: made by OrderedDict() rather than EMPTY_DICT (only those take
   * BUILD, as in torch). */
  bool ordered;
};

typedef struct grove__pickle grove__pickle;

/* Runs the restricted unpickler over buf[0, len).  On success *pk owns every
 * value and *root is the unpickled object (borrowed from *pk).  name prefixes
 * messages ("weights.pt: data.pkl").  Statuses: GROVE_E_REFUSED (an opcode
 * or global outside the allow-list, naming it), GROVE_E_TRUNCATED,
 * GROVE_E_FORMAT (an impossible stack), GROVE_E_LIMIT, GROVE_E_BAD_UTF8,
 * GROVE_E_UNSUPPORTED (a protocol above 5), GROVE_E_NOMEM. */
grove_status grove__pickle_load(const void *buf, size_t len, const char *name, grove__pickle **pk,
                                const grove__pk **root, grove_err *err);
void grove__pickle_free(grove__pickle *pk);
/* grove__pickle_load of a pickle that ends at its STOP, somewhere in
 * buf[0, len) (a file of several pickles and data after them: torch's
 * legacy format); *used receives its length.  Only the first
 * GROVE_PKL_MAX_BYTES of buf may hold it. */
grove_status grove__pickle_load_prefix(const void *buf, size_t len, const char *name,
                                       grove__pickle **pk, const grove__pk **root, size_t *used,
                                       grove_err *err);
/* Calls fn on every value of pk of that kind, in no particular order,
 * until fn returns false (then returns false).  The caller's thread. */
bool grove__pickle_each(const grove__pickle *pk, grove__pk_kind kind,
                        bool (*fn)(void *ctx, const grove__pk *v), void *ctx);

/* The unpickler's limits; grove__pickle_load uses the defaults (the
 * GROVE_PKL_* values above).  Tests lower them to reach every limit. */
typedef struct grove__pkl_limits {
  size_t max_bytes, max_stack, max_marks, max_memo, max_str, max_container, max_values;
} grove__pkl_limits;
extern const grove__pkl_limits grove__pkl_default_limits;
/* grove__pickle_load with other limits (NULL: the defaults). */
grove_status grove__pickle_load_limited(const void *buf, size_t len, const char *name,
                                        const grove__pkl_limits *lim, grove__pickle **pk,
                                        const grove__pk **root, grove_err *err);

/* A value's kind in words ("a tuple", "the global 'torch.Size'"), for
 * messages.  Static or in buf. */
const char *grove__pk_describe(const grove__pk *v, char *buf, size_t n);
/* Looks key up in a DICT; the last pair with that string key wins, as in
 * Python.  NULL when absent or when d is not a DICT. */
const grove__pk *grove__pk_dict_get(const grove__pk *d, const char *key);
/* Whether a call of the global tagged tag builds a tensor (the _rebuild_*
 * functions and Parameter): what the pickle reader and torch_load both ask. */
bool grove__pk_tag_makes_tensor(grove__pk_tag tag);

/* ================================================================ torch */

/* A legacy torch.save file's layout (torch_legacy.c; see there): its saved
 * object, and where each storage's bytes are. */
typedef struct grove__legacy_rec {
  size_t offset, nbytes; /* of the storage's elements in the file */
} grove__legacy_rec;
typedef struct grove__legacy {
  grove__pickle *pk;      /* the saved object's values */
  const grove__pk *root;  /* the saved object (in pk) */
  grove__pickle *keys_pk; /* the storage key list's values */
  grove__pmap keys;       /* storage key -> what its persistent ids say */
  grove__pmap recs;       /* storage key -> its grove__legacy_rec */
  grove__legacy_rec *recs_arr;
  size_t nrecs;
} grove__legacy;
/* Whether buf begins as a legacy torch.save file does. */
bool grove__legacy_is(const void *buf, size_t len);
/* Reads the five pickles of buf[0, len) and the storage table after them
 * into *lg (which the caller finishes with grove__legacy_fini, whatever the
 * status); names name in messages.  Checks every count and size against len.
 * The caller's thread; buf must outlive *lg. */
grove_status grove__legacy_open(const void *buf, size_t len, const char *name, grove__legacy *lg,
                                grove_err *err);
/* Where storage key's bytes are, or NULL when the file has none for it. */
const grove__legacy_rec *grove__legacy_find(const grove__legacy *lg, const char *key);
void grove__legacy_fini(grove__legacy *lg);

/* grove_torch_read on an archive in memory.  map, when not NULL, is a
 * storage holding buf (the whole file, read by grove__read_file): stored,
 * aligned f32 records become zero-copy views into it.  name is used in
 * messages. */
grove_status grove__torch_read_buffer(const void *buf, size_t len, const char *name,
                                      grove_storage *map, grove_state_dict **out, grove_err *err);

/* Copies the elements of t, in row-major order, to dst (grove_tensor_nbytes
 * bytes), bit for bit, whatever t's strides. */
void grove__tensor_gather(const grove_tensor *t, void *dst);

typedef struct grove__torch_write_opts {
  grove__zipw_opts zip;
} grove__torch_write_opts;

/* grove_torch_write with options (tests write ZIP64 and deflated archives
 * with it).  opts may be NULL. */
grove_status grove__torch_write(const char *path, const grove_state_dict *sd,
                                const grove__torch_write_opts *opts, grove_err *err);
/* The same archive into memory: *out is malloc'd, the caller frees it.
 * archive_name is the top-level folder. */
grove_status grove__torch_write_buffer(const grove_state_dict *sd, const char *archive_name,
                                       const grove__torch_write_opts *opts, uint8_t **out,
                                       size_t *len, grove_err *err);

/* ------------------------------------------------------------ pickle writer */

/* A protocol-2 pickle built in a growing buffer (pickle_write.c): p[0 .. n)
 * so far.  The first allocation that fails sets oom, and every later call
 * leaves the buffer as it is, so a writer checks oom once at the end.
 * Zeroed is empty; memo counts the memo slots handed out. */
typedef struct grove__pkw {
  uint8_t *p;
  size_t n, cap;
  bool oom;
  uint32_t memo;
} grove__pkw;

/* Raw bytes; one opcode. */
void grove__pkw_put(grove__pkw *b, const void *data, size_t n);
void grove__pkw_op(grove__pkw *b, uint8_t o);
/* MEMOIZE the top of the stack into the next memo slot (BINPUT or
 * LONG_BINPUT), which it returns; push memo slot i (BINGET, LONG_BINGET). */
uint32_t grove__pkw_memo_put(grove__pkw *b);
void grove__pkw_memo_get(grove__pkw *b, uint32_t i);
/* A str (BINUNICODE; s is UTF-8 shorter than 4 GiB, which callers check), an
 * int, a float, a bool, a tuple of ints, a global (module.name). */
void grove__pkw_str(grove__pkw *b, const char *s);
void grove__pkw_int(grove__pkw *b, int64_t v);
void grove__pkw_float(grove__pkw *b, double v);
void grove__pkw_bool(grove__pkw *b, bool v);
void grove__pkw_int_tuple(grove__pkw *b, int n, const int64_t *v);
void grove__pkw_global(grove__pkw *b, const char *module, const char *name);
/* Frees the buffer and leaves b empty. */
void grove__pkw_fini(grove__pkw *b);

#endif
