/* npy.c: reading and writing NumPy .npy files (see npy.h).
 *
 * The format (numpy/lib/format.py): the magic "\x93NUMPY", a major and a
 * minor version byte, the header length (little-endian u16 in 1.0, u32 in 2.0
 * and 3.0), then the header: the repr of a Python dict with exactly the keys
 * 'descr', 'fortran_order' and 'shape', padded with spaces and a final '\n'.
 * The raw array bytes follow and run to the end of the file.
 *
 * numpy reads the header with ast.literal_eval.  We parse the small subset a
 * real header uses (a dict of strings, True/False and a tuple of integers)
 * and refuse anything else with a message that says what was found, so a
 * file numpy would read either loads here or fails with a clear reason.
 */
#include "npy.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "npy.c copies little-endian file data as is: it needs a little-endian host"
#endif

/* ============================================================ dtypes */

typedef struct npy_dtype {
  char kind; /* numpy's type character */
  int size;
  grove_dtype dtype;
  const char *descr; /* what numpy.save writes */
} npy_dtype;

static const npy_dtype npy_dtypes[] = {
    {'f', 4, GROVE_F32, "<f4"}, {'f', 8, GROVE_F64, "<f8"}, {'f', 2, GROVE_F16, "<f2"},
    {'i', 8, GROVE_I64, "<i8"}, {'i', 4, GROVE_I32, "<i4"}, {'i', 2, GROVE_I16, "<i2"},
    {'i', 1, GROVE_I8, "|i1"},  {'u', 1, GROVE_U8, "|u1"},  {'b', 1, GROVE_BOOL, "|b1"},
};
#define N_NPY_DTYPES (sizeof npy_dtypes / sizeof npy_dtypes[0])

#define SUPPORTED_DTYPES "<f4 <f8 <f2 <i8 <i4 <i2 |i1 |u1 |b1"

const char *grove_npy_descr(grove_dtype dt) {
  for (size_t i = 0; i < N_NPY_DTYPES; i++)
    if (npy_dtypes[i].dtype == dt) return npy_dtypes[i].descr;
  return NULL;
}

/* Copies s[0..n) into out for a message, replacing bytes that are not
 * printable ASCII (a header may hold anything) and cutting long text. */
static const char *printable(const char *s, size_t n, char *out, size_t cap) {
  size_t j = 0;
  for (size_t i = 0; i < n && j + 4 < cap; i++) {
    unsigned char c = (unsigned char)s[i];
    out[j++] = (c >= 0x20 && c < 0x7f) ? (char)c : '?';
  }
  if (j + 4 >= cap && n > j) {
    memcpy(out + j, "...", 3);
    j += 3;
  }
  out[j] = '\0';
  return out;
}

/* descr is the text between the quotes.  Byte order: '<' little, '>' big,
 * '|' not applicable, '=' native (this host is little-endian); for one-byte
 * types any of them is fine, as numpy treats them alike. */
static grove_status parse_descr(const char *s, size_t n, const char *name, grove_dtype *out,
                                grove_err *err) {
  char shown[80];
  if (n >= 3 && n <= 4 && strchr("<>|=", s[0])) {
    char kind = s[1];
    int size = 0;
    bool digits = true;
    for (size_t i = 2; i < n; i++) {
      if (s[i] < '0' || s[i] > '9')
        digits = false;
      else
        size = size * 10 + (s[i] - '0');
    }
    if (digits) {
      for (size_t i = 0; i < N_NPY_DTYPES; i++) {
        if (npy_dtypes[i].kind != kind || npy_dtypes[i].size != size) continue;
        if (size > 1 && s[0] == '>')
          return grove_err_set(err, GROVE_E_BAD_DTYPE,
                               "%s: dtype '%s' is big-endian; Grove reads little-endian .npy "
                               "files only (save arr.astype('<%c%d'))",
                               name, printable(s, n, shown, sizeof shown), kind, size);
        *out = npy_dtypes[i].dtype;
        return GROVE_OK;
      }
    }
  }
  return grove_err_set(err, GROVE_E_BAD_DTYPE,
                       "%s: dtype '%s' is not supported (Grove reads " SUPPORTED_DTYPES ")", name,
                       printable(s, n, shown, sizeof shown));
}

/* ============================================================ header parsing */

typedef struct hdr_parser {
  const char *p, *end;
  const char *name;
  grove_err *err;
} hdr_parser;

static void skip_ws(hdr_parser *h) {
  while (h->p < h->end &&
         (*h->p == ' ' || *h->p == '\t' || *h->p == '\n' || *h->p == '\r' || *h->p == '\f'))
    h->p++;
}

/* Describes what is at the parser's position, for "expected X, found Y". */
static const char *found(const hdr_parser *h, char *buf, size_t cap) {
  if (h->p >= h->end) return "the end of the header";
  size_t n = (size_t)(h->end - h->p);
  if (n > 12) n = 12;
  char tmp[40];
  snprintf(buf, cap, "'%s'", printable(h->p, n, tmp, sizeof tmp));
  return buf;
}

static grove_status expect_char(hdr_parser *h, char c, const char *what) {
  skip_ws(h);
  if (h->p < h->end && *h->p == c) {
    h->p++;
    return GROVE_OK;
  }
  char buf[64];
  return grove_err_set(h->err, GROVE_E_FORMAT, "%s: bad header: expected %s, found %s", h->name,
                       what, found(h, buf, sizeof buf));
}

/* A Python string literal without escapes or prefixes: '...' or "...". */
static grove_status parse_string(hdr_parser *h, const char **s, size_t *n, const char *what) {
  skip_ws(h);
  char buf[64];
  if (h->p >= h->end || (*h->p != '\'' && *h->p != '"'))
    return grove_err_set(h->err, GROVE_E_FORMAT, "%s: bad header: expected %s, found %s", h->name,
                         what, found(h, buf, sizeof buf));
  char q = *h->p++;
  const char *start = h->p;
  while (h->p < h->end && *h->p != q) {
    if (*h->p == '\\' || *h->p == '\n')
      return grove_err_set(h->err, GROVE_E_FORMAT,
                           "%s: bad header: %s holds an escape or a line break", h->name, what);
    h->p++;
  }
  if (h->p >= h->end)
    return grove_err_set(h->err, GROVE_E_FORMAT, "%s: bad header: unterminated string", h->name);
  *s = start;
  *n = (size_t)(h->p - start);
  h->p++;
  return GROVE_OK;
}

static bool word_at(const hdr_parser *h, const char *w) {
  size_t n = strlen(w);
  if ((size_t)(h->end - h->p) < n || memcmp(h->p, w, n) != 0) return false;
  /* The word must end there: "Trueish" is a name, not True. */
  if ((size_t)(h->end - h->p) > n) {
    char c = h->p[n];
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_')
      return false;
  }
  return true;
}

static grove_status parse_bool(hdr_parser *h, bool *out) {
  skip_ws(h);
  if (word_at(h, "True")) {
    h->p += 4;
    *out = true;
    return GROVE_OK;
  }
  if (word_at(h, "False")) {
    h->p += 5;
    *out = false;
    return GROVE_OK;
  }
  char buf[64];
  return grove_err_set(h->err, GROVE_E_FORMAT,
                       "%s: bad header: 'fortran_order' must be True or False, found %s", h->name,
                       found(h, buf, sizeof buf));
}

/* A non-negative decimal integer, with Python 2's 'L' suffix tolerated (numpy
 * strips it from version 1.0 and 2.0 headers written by Python 2). */
static grove_status parse_dim(hdr_parser *h, int64_t *out) {
  skip_ws(h);
  char buf[64];
  if (h->p < h->end && *h->p == '-')
    return grove_err_set(h->err, GROVE_E_FORMAT, "%s: bad header: 'shape' has a negative dimension",
                         h->name);
  if (h->p >= h->end || *h->p < '0' || *h->p > '9')
    return grove_err_set(h->err, GROVE_E_FORMAT,
                         "%s: bad header: 'shape' must be a tuple of integers, found %s", h->name,
                         found(h, buf, sizeof buf));
  uint64_t v = 0;
  bool overflow = false;
  const char *start = h->p;
  while (h->p < h->end && *h->p >= '0' && *h->p <= '9') {
    if (v > ((uint64_t)INT64_MAX - (uint64_t)(*h->p - '0')) / 10)
      overflow = true;
    else
      v = v * 10 + (uint64_t)(*h->p - '0');
    h->p++;
  }
  if (h->p - start > 1 && *start == '0')
    return grove_err_set(h->err, GROVE_E_FORMAT,
                         "%s: bad header: 'shape' has a dimension with a leading zero", h->name);
  if (h->p < h->end && (*h->p == 'L' || *h->p == 'l')) h->p++;
  if (overflow)
    return grove_err_set(h->err, GROVE_E_RANGE, "%s: 'shape' has a dimension larger than 2^63-1",
                         h->name);
  *out = (int64_t)v;
  return GROVE_OK;
}

static grove_status parse_shape(hdr_parser *h, grove_npy_info *info) {
  grove_status s = expect_char(h, '(', "'shape' to be a tuple '('");
  if (s) return s;
  int n = 0;
  bool trailing_comma = false;
  for (;;) {
    skip_ws(h);
    if (h->p < h->end && *h->p == ')') {
      h->p++;
      break;
    }
    int64_t d = 0;
    if ((s = parse_dim(h, &d))) return s;
    if (n == GROVE_MAX_DIMS)
      return grove_err_set(h->err, GROVE_E_LIMIT,
                           "%s: the array has more than %d dimensions, Grove's limit", h->name,
                           GROVE_MAX_DIMS);
    info->shape[n++] = d;
    skip_ws(h);
    trailing_comma = false;
    if (h->p < h->end && *h->p == ',') {
      h->p++;
      trailing_comma = true;
      continue;
    }
    if ((s = expect_char(h, ')', "',' or ')' in 'shape'"))) return s;
    break;
  }
  /* (3) is the integer 3 in Python, not a tuple: numpy refuses it too. */
  if (n == 1 && !trailing_comma)
    return grove_err_set(h->err, GROVE_E_FORMAT,
                         "%s: bad header: 'shape' (%lld) is not a tuple (a 1-d shape is written "
                         "(%lld,))",
                         h->name, (long long)info->shape[0], (long long)info->shape[0]);
  info->ndim = n;
  return GROVE_OK;
}

enum { KEY_DESCR = 1, KEY_FORTRAN = 2, KEY_SHAPE = 4 };

static grove_status parse_dict(hdr_parser *h, grove_npy_info *info) {
  grove_status s = expect_char(h, '{', "a dict '{'");
  if (s) return s;
  unsigned seen = 0;
  for (;;) {
    skip_ws(h);
    if (h->p < h->end && *h->p == '}') {
      h->p++;
      break;
    }
    const char *k;
    size_t kn;
    if ((s = parse_string(h, &k, &kn, "a key string"))) return s;
    unsigned key = 0;
    if (kn == 5 && memcmp(k, "descr", 5) == 0)
      key = KEY_DESCR;
    else if (kn == 13 && memcmp(k, "fortran_order", 13) == 0)
      key = KEY_FORTRAN;
    else if (kn == 5 && memcmp(k, "shape", 5) == 0)
      key = KEY_SHAPE;
    char shown[80];
    if (!key)
      return grove_err_set(h->err, GROVE_E_FORMAT,
                           "%s: bad header: unexpected key '%s' (a .npy header has exactly "
                           "'descr', 'fortran_order' and 'shape')",
                           h->name, printable(k, kn, shown, sizeof shown));
    if (seen & key)
      return grove_err_set(h->err, GROVE_E_FORMAT, "%s: bad header: key '%s' appears twice",
                           h->name, printable(k, kn, shown, sizeof shown));
    seen |= key;
    if ((s = expect_char(h, ':', "':' after a key"))) return s;
    if (key == KEY_DESCR) {
      skip_ws(h);
      if (h->p < h->end && (*h->p == '[' || *h->p == '{'))
        return grove_err_set(h->err, GROVE_E_BAD_DTYPE,
                             "%s: the array has a structured dtype; Grove reads plain arrays of "
                             "" SUPPORTED_DTYPES " only",
                             h->name);
      const char *d;
      size_t dn;
      if ((s = parse_string(h, &d, &dn, "'descr' to be a dtype string"))) return s;
      if ((s = parse_descr(d, dn, h->name, &info->dtype, h->err))) return s;
    } else if (key == KEY_FORTRAN) {
      if ((s = parse_bool(h, &info->fortran_order))) return s;
    } else {
      if ((s = parse_shape(h, info))) return s;
    }
    skip_ws(h);
    if (h->p < h->end && *h->p == ',') {
      h->p++;
      continue;
    }
    if ((s = expect_char(h, '}', "',' or '}' in the header dict"))) return s;
    break;
  }
  skip_ws(h);
  if (h->p != h->end) {
    char buf[64];
    return grove_err_set(h->err, GROVE_E_FORMAT, "%s: bad header: %s after the dict", h->name,
                         found(h, buf, sizeof buf));
  }
  static const struct {
    unsigned bit;
    const char *name;
  } keys[] = {{KEY_DESCR, "descr"}, {KEY_FORTRAN, "fortran_order"}, {KEY_SHAPE, "shape"}};
  for (size_t i = 0; i < 3; i++)
    if (!(seen & keys[i].bit))
      return grove_err_set(h->err, GROVE_E_FORMAT, "%s: bad header: key '%s' is missing", h->name,
                           keys[i].name);
  return GROVE_OK;
}

static const unsigned char npy_magic[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};

grove_status grove_npy_parse_header(const void *buf, size_t len, const char *name,
                                    grove_npy_info *info, grove_err *err) {
  const unsigned char *b = buf;
  memset(info, 0, sizeof *info);
  if (!name) name = "(buffer)";
  size_t m = len < 6 ? len : 6;
  if (memcmp(b, npy_magic, m) != 0)
    return grove_err_set(err, GROVE_E_FORMAT,
                         "%s: not a .npy file (it does not start with \"\\x93NUMPY\")", name);
  if (len < 8)
    return grove_err_set(err, GROVE_E_TRUNCATED, "%s: truncated: the file ends in its preamble",
                         name);
  info->major = b[6];
  info->minor = b[7];
  size_t lenbytes;
  if (info->major == 1 && info->minor == 0)
    lenbytes = 2;
  else if ((info->major == 2 || info->major == 3) && info->minor == 0)
    lenbytes = 4;
  else
    return grove_err_set(err, GROVE_E_UNSUPPORTED,
                         "%s: .npy format version %d.%d is not supported (1.0, 2.0 and 3.0 are)",
                         name, info->major, info->minor);
  if (len < 8 + lenbytes)
    return grove_err_set(err, GROVE_E_TRUNCATED,
                         "%s: truncated: the file ends in its header length", name);
  uint32_t hlen = (uint32_t)b[8] | (uint32_t)b[9] << 8;
  if (lenbytes == 4) hlen |= (uint32_t)b[10] << 16 | (uint32_t)b[11] << 24;
  if (hlen > GROVE_NPY_MAX_HEADER)
    return grove_err_set(err, GROVE_E_HEADER_TOO_LARGE,
                         "%s: the header is %u bytes long; more than %d is refused (as numpy "
                         "does)",
                         name, hlen, GROVE_NPY_MAX_HEADER);
  size_t start = 8 + lenbytes;
  if (len - start < hlen)
    return grove_err_set(err, GROVE_E_TRUNCATED,
                         "%s: truncated: the header should be %u bytes, the file has %zu after "
                         "the preamble",
                         name, hlen, len - start);
  hdr_parser h = {(const char *)b + start, (const char *)b + start + hlen, name, err};
  grove_status s = parse_dict(&h, info);
  if (s) return s;

  /* Fortran order is the same byte layout as C order when at most one
   * dimension is longer than 1 (or there is no element at all). */
  if (info->fortran_order) {
    int big = 0;
    bool empty = false;
    for (int i = 0; i < info->ndim; i++) {
      if (info->shape[i] > 1) big++;
      if (info->shape[i] == 0) empty = true;
    }
    if (big > 1 && !empty) {
      char sh[128];
      return grove_err_set(err, GROVE_E_UNSUPPORTED,
                           "%s: the array %s is in Fortran order; Grove reads C-order arrays "
                           "only (save np.ascontiguousarray(a) instead)",
                           name, grove_shape_str(info->ndim, info->shape, sh, sizeof sh));
    }
  }
  /* An empty array is empty whatever its other dimensions say; otherwise
   * the byte size must fit in int64 (tensor sizes are int64_t). */
  uint64_t bytes = grove_dtype_size(info->dtype);
  bool empty = false;
  for (int i = 0; i < info->ndim; i++) empty = empty || info->shape[i] == 0;
  for (int i = 0; i < info->ndim && !empty; i++) {
    if (__builtin_mul_overflow(bytes, (uint64_t)info->shape[i], &bytes) ||
        bytes > (uint64_t)INT64_MAX || bytes > SIZE_MAX) {
      char sh[128];
      return grove_err_set(err, GROVE_E_RANGE, "%s: the array %s %s is too large to address", name,
                           grove_dtype_name(info->dtype),
                           grove_shape_str(info->ndim, info->shape, sh, sizeof sh));
    }
  }
  if (empty) bytes = 0;
  info->data_offset = start + hlen;
  info->data_bytes = (size_t)bytes;
  return GROVE_OK;
}

/* ============================================================ reading */

static grove_status check_bools(const grove_tensor *t, const char *name, grove_err *err) {
  if (t->dtype != GROVE_BOOL) return GROVE_OK;
  const unsigned char *d = t->data;
  size_t n = grove_tensor_nbytes(t);
  for (size_t i = 0; i < n; i++)
    if (d[i] > 1)
      return grove_err_set(err, GROVE_E_FORMAT,
                           "%s: bool element %zu holds the byte %u (only 0 and 1 are booleans)",
                           name, i, d[i]);
  return GROVE_OK;
}

/* grove_tensor_new said why in err (when there is one); add the file. */
static grove_status tensor_new_failed(const char *name, grove_err *err) {
  if (!err) return GROVE_E_NOMEM;
  if (err->code == GROVE_OK) grove_err_set(err, GROVE_E_NOMEM, "out of memory");
  return grove_err_prefix(err, "%s", name);
}

static grove_status size_mismatch(const grove_npy_info *info, const char *name, size_t have,
                                  grove_err *err) {
  char sh[128];
  grove_shape_str(info->ndim, info->shape, sh, sizeof sh);
  if (have < info->data_bytes)
    return grove_err_set(err, GROVE_E_TRUNCATED,
                         "%s: truncated: %s %s needs %zu bytes of data, the file has %zu", name,
                         grove_dtype_name(info->dtype), sh, info->data_bytes, have);
  return grove_err_set(err, GROVE_E_BAD_SIZE,
                       "%s: %zu bytes follow the data of %s %s (%zu bytes); a .npy file holds "
                       "exactly one array",
                       name, have - info->data_bytes, grove_dtype_name(info->dtype), sh,
                       info->data_bytes);
}

grove_status grove_npy_decode(const void *buf, size_t len, const char *name, grove_tensor **out,
                              grove_err *err) {
  *out = NULL;
  if (!name) name = "(buffer)";
  grove_npy_info info;
  grove_status s = grove_npy_parse_header(buf, len, name, &info, err);
  if (s) return s;
  if (len - info.data_offset != info.data_bytes)
    return size_mismatch(&info, name, len - info.data_offset, err);
  grove_tensor *t = grove_tensor_new(info.dtype, info.ndim, info.shape, err);
  if (!t) return tensor_new_failed(name, err);
  if (info.data_bytes) memcpy(t->data, (const char *)buf + info.data_offset, info.data_bytes);
  if ((s = check_bools(t, name, err))) {
    grove_tensor_release(t);
    return s;
  }
  *out = t;
  return GROVE_OK;
}

/* Reads up to n bytes, retrying short reads; returns the count (less than n
 * only at end of file) or -1 with errno set. */
static ssize_t read_full(int fd, void *buf, size_t n) {
  size_t got = 0;
  while (got < n) {
    ssize_t r = read(fd, (char *)buf + got, n - got);
    if (r < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    if (r == 0) break;
    got += (size_t)r;
  }
  return (ssize_t)got;
}

grove_status grove_npy_read(const char *path, grove_tensor **out, grove_err *err) {
  *out = NULL;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return grove_err_set(err, GROVE_E_IO, "%s: cannot open: %s", path, strerror(errno));
  grove_status s = GROVE_OK;
  grove_tensor *t = NULL;
  struct stat st;
  if (fstat(fd, &st) != 0) {
    s = grove_err_set(err, GROVE_E_IO, "%s: cannot stat: %s", path, strerror(errno));
    goto done;
  }
  if (S_ISDIR(st.st_mode)) {
    s = grove_err_set(err, GROVE_E_IO, "%s: is a directory, not a .npy file", path);
    goto done;
  }
  /* The preamble and the longest header we accept fit in head; whatever
   * data came along with them is copied into the tensor below. */
  enum { HEAD = 12 + GROVE_NPY_MAX_HEADER };
  unsigned char *head = malloc(HEAD);
  if (!head) {
    s = grove_err_set(err, GROVE_E_NOMEM, "%s: out of memory", path);
    goto done;
  }
  ssize_t n = read_full(fd, head, HEAD);
  if (n < 0) {
    s = grove_err_set(err, GROVE_E_IO, "%s: cannot read: %s", path, strerror(errno));
    goto done_head;
  }
  grove_npy_info info;
  if ((s = grove_npy_parse_header(head, (size_t)n, path, &info, err))) goto done_head;
  size_t in_head = (size_t)n - info.data_offset;
  /* For a regular file the size is known: refuse a wrong length before
   * allocating what the header claims. */
  if (S_ISREG(st.st_mode) && ((uint64_t)st.st_size < info.data_offset ||
                              (uint64_t)st.st_size - info.data_offset != info.data_bytes)) {
    s = size_mismatch(&info, path,
                      (uint64_t)st.st_size < info.data_offset
                          ? 0
                          : (size_t)((uint64_t)st.st_size - info.data_offset),
                      err);
    goto done_head;
  }
  if (in_head > info.data_bytes) {
    s = size_mismatch(&info, path, in_head, err);
    goto done_head;
  }
  t = grove_tensor_new(info.dtype, info.ndim, info.shape, err);
  if (!t) {
    s = tensor_new_failed(path, err);
    goto done_head;
  }
  if (in_head) memcpy(t->data, head + info.data_offset, in_head);
  size_t rest = info.data_bytes - in_head;
  if (rest) {
    ssize_t r = read_full(fd, (char *)t->data + in_head, rest);
    if (r < 0) {
      s = grove_err_set(err, GROVE_E_IO, "%s: cannot read: %s", path, strerror(errno));
      goto done_head;
    }
    if ((size_t)r < rest) {
      s = size_mismatch(&info, path, in_head + (size_t)r, err);
      goto done_head;
    }
  }
  /* A pipe (or a file that grew) may still hold more. */
  unsigned char extra;
  ssize_t r = read_full(fd, &extra, 1);
  if (r > 0) {
    s = size_mismatch(&info, path, info.data_bytes + 1, err);
    goto done_head;
  }
  s = check_bools(t, path, err);
done_head:
  free(head);
done:
  close(fd);
  if (s) {
    grove_tensor_release(t);
    return s;
  }
  *out = t;
  return GROVE_OK;
}

/* ============================================================ writing */

/* numpy's header for a C-order array, padded as _write_array_header and
 * _wrap_header do: after the dict, room for the first dimension to grow to
 * 21 digits, then spaces and '\n' up to a multiple of 64 bytes. */
static size_t format_header(const grove_tensor *t, const char *descr, char *out, size_t cap) {
  char dict[512];
  size_t n = (size_t)snprintf(dict, sizeof dict,
                              "{'descr': '%s', 'fortran_order': False, 'shape': (", descr);
  for (int i = 0; i < t->ndim; i++)
    n += (size_t)snprintf(dict + n, sizeof dict - n, "%s%lld", i ? ", " : "",
                          (long long)t->shape[i]);
  n += (size_t)snprintf(dict + n, sizeof dict - n, "%s), }", t->ndim == 1 ? "," : "");
  if (t->ndim > 0) {
    char first[32];
    int digits = snprintf(first, sizeof first, "%lld", (long long)t->shape[0]);
    for (int i = digits; i < 21; i++) dict[n++] = ' ';
  }
  size_t hlen = n + 1;                  /* with the final '\n' */
  size_t pad = 64 - ((10 + hlen) % 64); /* 1..64, as numpy */
  size_t total = 10 + hlen + pad;
  if (total > cap) return 0;
  memcpy(out, npy_magic, 6);
  out[6] = 1;
  out[7] = 0;
  size_t field = hlen + pad;
  out[8] = (char)(field & 0xff);
  out[9] = (char)(field >> 8);
  memcpy(out + 10, dict, n);
  memset(out + 10 + n, ' ', pad);
  out[total - 1] = '\n';
  return total;
}

/* Copies t's elements in C order into dst, following any strides. */
static void gather(const grove_tensor *t, unsigned char *dst) {
  size_t es = grove_dtype_size(t->dtype);
  int64_t numel = grove_tensor_numel(t);
  if (numel == 0) return;
  if (grove_tensor_is_contiguous(t)) {
    memcpy(dst, t->data, (size_t)numel * es);
    return;
  }
  int64_t idx[GROVE_MAX_DIMS] = {0};
  const unsigned char *base = t->data;
  for (int64_t k = 0; k < numel; k++) {
    int64_t off = 0;
    for (int i = 0; i < t->ndim; i++) off += idx[i] * t->strides[i];
    memcpy(dst + (size_t)k * es, base + off * (int64_t)es, es);
    for (int i = t->ndim - 1; i >= 0; i--) {
      if (++idx[i] < t->shape[i]) break;
      idx[i] = 0;
    }
  }
}

grove_status grove_npy_encode(const grove_tensor *t, void **buf, size_t *len, grove_err *err) {
  *buf = NULL;
  *len = 0;
  const char *descr = grove_npy_descr(t->dtype);
  if (!descr)
    return grove_err_set(err, GROVE_E_BAD_DTYPE,
                         "%s has no .npy dtype (numpy has no such type); convert to float32 first",
                         grove_dtype_name(t->dtype));
  if (t->ndim < 0 || t->ndim > GROVE_MAX_DIMS)
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT, "a tensor with %d dimensions", t->ndim);
  char hdr[640];
  size_t hn = format_header(t, descr, hdr, sizeof hdr);
  if (!hn) return grove_err_set(err, GROVE_E_INTERNAL, ".npy header does not fit");
  size_t data = grove_tensor_nbytes(t);
  if (data > SIZE_MAX - hn)
    return grove_err_set(err, GROVE_E_RANGE, "the tensor is too large to encode");
  unsigned char *out = malloc(hn + data ? hn + data : 1);
  if (!out)
    return grove_err_set(err, GROVE_E_NOMEM, "out of memory for a %zu-byte .npy", hn + data);
  memcpy(out, hdr, hn);
  gather(t, out + hn);
  *buf = out;
  *len = hn + data;
  return GROVE_OK;
}

static bool write_all(int fd, const void *buf, size_t n) {
  const char *p = buf;
  while (n) {
    ssize_t w = write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    p += w;
    n -= (size_t)w;
  }
  return true;
}

grove_status grove_npy_write(const char *path, const grove_tensor *t, grove_err *err) {
  void *buf;
  size_t len;
  grove_status s = grove_npy_encode(t, &buf, &len, err);
  if (s) return err ? grove_err_prefix(err, "%s", path) : s;

  struct stat st;
  bool direct = stat(path, &st) == 0 && !S_ISREG(st.st_mode);
  if (direct) {
    int fd = open(path, O_WRONLY | O_TRUNC | O_CLOEXEC);
    if (fd < 0)
      s = grove_err_set(err, GROVE_E_IO, "%s: cannot open: %s", path, strerror(errno));
    else {
      if (!write_all(fd, buf, len))
        s = grove_err_set(err, GROVE_E_IO, "%s: cannot write: %s", path, strerror(errno));
      close(fd);
    }
    free(buf);
    return s;
  }

  /* A temporary beside the target, then rename: a reader never sees half a
   * file, and a failed write leaves the old file alone. */
  static _Atomic unsigned counter;
  size_t plen = strlen(path);
  char *tmp = malloc(plen + 48);
  if (!tmp) {
    free(buf);
    return grove_err_set(err, GROVE_E_NOMEM, "%s: out of memory", path);
  }
  snprintf(tmp, plen + 48, "%s.tmp-%ld-%u", path, (long)getpid(), counter++);
  int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  if (fd < 0) {
    s = grove_err_set(err, GROVE_E_IO, "%s: cannot create: %s", path, strerror(errno));
  } else {
    bool ok = write_all(fd, buf, len);
    int saved = errno;
    if (close(fd) != 0 && ok) {
      ok = false;
      saved = errno;
    }
    if (!ok)
      s = grove_err_set(err, GROVE_E_IO, "%s: cannot write: %s", path, strerror(saved));
    else if (rename(tmp, path) != 0)
      s = grove_err_set(err, GROVE_E_IO, "%s: cannot rename %s into place: %s", path, tmp,
                        strerror(errno));
    if (s) unlink(tmp);
  }
  free(tmp);
  free(buf);
  return s;
}
