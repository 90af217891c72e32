/* oip_json.c: the Open Inference Protocol's tensor codec (oip.c's): the
 * datatype names, a JSON "data" array (flat or nested, row-major) into a
 * tensor's bytes, a tensor's bytes into a JSON array, JSON strings.
 *
 * Pure functions of their arguments: any thread (oip.c decodes on the HTTP
 * thread and encodes on the worker that computed the outputs).
 *
 * The fast path: jansson makes one allocated json_t per number, which on
 * the HTTP thread capped JSON infers at a fifth of binary ones.  So before
 * jansson sees a request, grove__oip_cut_data takes every inputs[i].data
 * that is an array of numbers out of the text (one pass, no allocation),
 * and grove__oip_text_data converts those straight into the tensor's
 * bytes.  Anything else (strings, booleans, a malformed number) is left in
 * the text for jansson and the general decoder above, so the answers and
 * their messages are the same either way.
 *
 * Layer: below oip.c; calls nothing of server/ but metrics.c's text buffer. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <inttypes.h>

#include "oip.h"

/* OIP datatype names (kserve required_api.md, "Tensor Data Types") and
 * Triton's model-configuration names, by grove_dtype. */
static const struct {
  grove_dtype dt;
  const char *oip, *triton;
} dtypes[] = {
    {GROVE_BOOL, "BOOL", "TYPE_BOOL"},  {GROVE_U8, "UINT8", "TYPE_UINT8"},
    {GROVE_I8, "INT8", "TYPE_INT8"},    {GROVE_I16, "INT16", "TYPE_INT16"},
    {GROVE_I32, "INT32", "TYPE_INT32"}, {GROVE_I64, "INT64", "TYPE_INT64"},
    {GROVE_F16, "FP16", "TYPE_FP16"},   {GROVE_BF16, "BF16", "TYPE_BF16"},
    {GROVE_F32, "FP32", "TYPE_FP32"},   {GROVE_F64, "FP64", "TYPE_FP64"},
};
#define NDTYPES (sizeof dtypes / sizeof dtypes[0])

const char *grove__oip_dtype_name(grove_dtype dt) {
  for (size_t i = 0; i < NDTYPES; i++)
    if (dtypes[i].dt == dt) return dtypes[i].oip;
  return "INVALID";
}

const char *grove__oip_triton_type(grove_dtype dt) {
  for (size_t i = 0; i < NDTYPES; i++)
    if (dtypes[i].dt == dt) return dtypes[i].triton;
  return "TYPE_INVALID";
}

bool grove__oip_dtype_parse(const char *name, grove_dtype *dt) {
  for (size_t i = 0; i < NDTYPES; i++)
    if (strcmp(dtypes[i].oip, name) == 0) {
      *dt = dtypes[i].dt;
      return true;
    }
  return false;
}

const char *grove__oip_dtype_list(void) {
  return "BOOL, UINT8, INT8, INT16, INT32, INT64, FP16, BF16, FP32, FP64";
}

/* ------------------------------------------------------------ decoding */

/* Leaves of a nested array, or -1 past max (the shape's element count: a
 * longer array is refused without walking the rest), or -2 at a leaf that
 * is an object or a string. */
static int64_t count_leaves(const json_t *a, int64_t max, int depth) {
  if (!json_is_array(a)) return json_is_object(a) || json_is_string(a) ? -2 : 1;
  if (depth > GROVE_MAX_DIMS) return -2;
  int64_t n = 0;
  size_t len = json_array_size(a);
  for (size_t i = 0; i < len; i++) {
    int64_t k = count_leaves(json_array_get(a, i), max - n, depth + 1);
    if (k < 0) return k;
    n += k;
    if (n > max) return -1;
  }
  return n;
}

/* One value into element p of dt: a float datatype's (rounded as torch
 * rounds a Python float into the tensor), an integer one's (false when out
 * of its range). */
static bool is_float(grove_dtype dt) {
  return dt == GROVE_F32 || dt == GROVE_F64 || dt == GROVE_F16 || dt == GROVE_BF16;
}

static void store_float(grove_dtype dt, unsigned char *p, double d) {
  switch (dt) {
    case GROVE_F64:
      memcpy(p, &d, 8);
      break;
    case GROVE_F32: {
      float x = (float)d;
      memcpy(p, &x, 4);
      break;
    }
    case GROVE_F16: {
      uint16_t h = grove_f32_to_f16((float)d);
      memcpy(p, &h, 2);
      break;
    }
    default: {
      uint16_t h = grove_f32_to_bf16((float)d);
      memcpy(p, &h, 2);
      break;
    }
  }
}

static bool store_int(grove_dtype dt, unsigned char *p, long long x) {
  switch (dt) {
    case GROVE_I64: {
      int64_t y = x;
      memcpy(p, &y, 8);
      return true;
    }
    case GROVE_I32: {
      int32_t y = (int32_t)x;
      memcpy(p, &y, 4);
      return x >= INT32_MIN && x <= INT32_MAX;
    }
    case GROVE_I16: {
      int16_t y = (int16_t)x;
      memcpy(p, &y, 2);
      return x >= INT16_MIN && x <= INT16_MAX;
    }
    case GROVE_I8:
      *(int8_t *)p = (int8_t)x;
      return x >= INT8_MIN && x <= INT8_MAX;
    default: /* GROVE_U8 */
      *p = (uint8_t)x;
      return x >= 0 && x <= UINT8_MAX;
  }
}

static const char out_of_range[] = "a value is out of the datatype's range";

typedef struct filler {
  grove_dtype dt;
  unsigned char *p;
  size_t i;
  const char *bad; /* the first value the dtype cannot hold */
} filler;

static void put(filler *f, const json_t *v) {
  unsigned char *p = f->p + f->i * grove_dtype_size(f->dt);
  f->i++;
  if (f->bad) return;
  if (f->dt == GROVE_BOOL) {
    if (!json_is_boolean(v)) {
      f->bad = "BOOL takes true or false";
      return;
    }
    *p = json_is_true(v) ? 1 : 0;
    return;
  }
  if (is_float(f->dt)) {
    if (!json_is_number(v)) {
      f->bad = "a floating-point datatype takes numbers";
      return;
    }
    store_float(f->dt, p, json_number_value(v));
    return;
  }
  if (!json_is_integer(v)) {
    f->bad = "an integer datatype takes integers";
    return;
  }
  if (!store_int(f->dt, p, (long long)json_integer_value(v))) f->bad = out_of_range;
}

static void fill(filler *f, const json_t *a) {
  if (!json_is_array(a)) {
    put(f, a);
    return;
  }
  size_t len = json_array_size(a);
  for (size_t i = 0; i < len && !f->bad; i++) fill(f, json_array_get(a, i));
}

bool grove__oip_json_data(const json_t *data, grove_dtype dt, uint64_t numel, void **out,
                          char *why, size_t n) {
  *out = NULL;
  int64_t max = numel > (uint64_t)INT64_MAX / 2 ? INT64_MAX / 2 : (int64_t)numel;
  int64_t got = count_leaves(data, max, 0);
  if (got == -2) {
    snprintf(why, n, "holds a string, an object or too deep a nesting; %s takes numbers",
             grove__oip_dtype_name(dt));
    return false;
  }
  if (got < 0 || (uint64_t)got != numel) {
    if (got < 0)
      snprintf(why, n, "holds more values than the shape's %" PRIu64 " elements", numel);
    else
      snprintf(why, n, "holds %" PRId64 " values, but the shape has %" PRIu64 " elements", got,
               numel);
    return false;
  }
  /* numel values each took at least two bytes of the body: this fits. */
  filler f = {.dt = dt, .p = malloc(numel * grove_dtype_size(dt) + 1)};
  if (!f.p) {
    snprintf(why, n, "out of memory for %" PRIu64 " values", numel);
    return false;
  }
  fill(&f, data);
  if (f.bad) {
    snprintf(why, n, "value %zu: %s", f.i - 1, f.bad);
    free(f.p);
    return false;
  }
  *out = f.p;
  return true;
}

/* ------------------------------------------------------------ encoding */

void grove__oip_write_string(srv_text *b, const char *s) {
  char tmp[256];
  size_t j = 0;
  grove__text_append(b, "\"", 1);
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    if (j + 8 > sizeof tmp) {
      grove__text_append(b, tmp, j);
      j = 0;
    }
    if (*p == '"' || *p == '\\') {
      tmp[j++] = '\\';
      tmp[j++] = (char)*p;
    } else if (*p < 0x20) {
      j += (size_t)snprintf(tmp + j, sizeof tmp - j, "\\u%04x", *p);
    } else {
      tmp[j++] = (char)*p;
    }
  }
  grove__text_append(b, tmp, j);
  grove__text_append(b, "\"", 1);
}

/* One float as JSON with the digits that read back to the same value (9
 * for a float, 17 for a double); NaN and the infinities as Python's json module writes them, since JSON
 * has no spelling for them. */
static int put_double(char *t, size_t n, double d, int digits) {
  if (isnan(d)) return snprintf(t, n, "NaN");
  if (isinf(d)) return snprintf(t, n, d < 0 ? "-Infinity" : "Infinity");
  return snprintf(t, n, "%.*g", digits, d);
}

void grove__oip_write_data(srv_text *b, grove_dtype dt, const void *data, uint64_t numel) {
  const unsigned char *p = data;
  char tmp[4096];
  size_t j = 0;
  size_t es = grove_dtype_size(dt);
  grove__text_append(b, "[", 1);
  for (uint64_t i = 0; i < numel; i++, p += es) {
    if (j + 40 > sizeof tmp) {
      grove__text_append(b, tmp, j);
      j = 0;
    }
    if (i) tmp[j++] = ',';
    int w = 0;
    switch (dt) {
      case GROVE_F32: {
        float x;
        memcpy(&x, p, 4);
        w = put_double(tmp + j, sizeof tmp - j, x, 9);
        break;
      }
      case GROVE_F64: {
        double x;
        memcpy(&x, p, 8);
        w = put_double(tmp + j, sizeof tmp - j, x, 17);
        break;
      }
      case GROVE_F16:
      case GROVE_BF16: {
        uint16_t h;
        memcpy(&h, p, 2);
        w = put_double(tmp + j, sizeof tmp - j,
                       dt == GROVE_F16 ? grove_f16_to_f32(h) : grove_bf16_to_f32(h), 9);
        break;
      }
      case GROVE_BOOL:
        w = snprintf(tmp + j, sizeof tmp - j, "%s", *p ? "true" : "false");
        break;
      case GROVE_I64: {
        int64_t x;
        memcpy(&x, p, 8);
        w = snprintf(tmp + j, sizeof tmp - j, "%" PRId64, x);
        break;
      }
      case GROVE_I32: {
        int32_t x;
        memcpy(&x, p, 4);
        w = snprintf(tmp + j, sizeof tmp - j, "%" PRId32, x);
        break;
      }
      case GROVE_I16: {
        int16_t x;
        memcpy(&x, p, 2);
        w = snprintf(tmp + j, sizeof tmp - j, "%d", (int)x);
        break;
      }
      case GROVE_I8:
        w = snprintf(tmp + j, sizeof tmp - j, "%d", (int)*(const int8_t *)p);
        break;
      default:
        w = snprintf(tmp + j, sizeof tmp - j, "%u", (unsigned)*p);
        break;
    }
    if (w > 0) j += (size_t)w;
  }
  grove__text_append(b, tmp, j);
  grove__text_append(b, "]", 1);
}

/* ------------------------------------------------------------ the fast path */

/* A JSON number at p (strict grammar: -?(0|[1-9]d*)(.d+)?([eE][+-]?d+)?);
 * its end, or NULL.  *integral: no fraction, no exponent. */
static const char *scan_number(const char *p, const char *end, bool *integral) {
  *integral = true;
  if (p < end && *p == '-') p++;
  if (p >= end) return NULL;
  if (*p == '0') {
    p++;
  } else if (*p >= '1' && *p <= '9') {
    while (p < end && *p >= '0' && *p <= '9') p++;
  } else {
    return NULL;
  }
  if (p < end && *p == '.') {
    *integral = false;
    p++;
    const char *d = p;
    while (p < end && *p >= '0' && *p <= '9') p++;
    if (p == d) return NULL;
  }
  if (p < end && (*p == 'e' || *p == 'E')) {
    *integral = false;
    p++;
    if (p < end && (*p == '+' || *p == '-')) p++;
    const char *d = p;
    while (p < end && *p >= '0' && *p <= '9') p++;
    if (p == d) return NULL;
  }
  return p;
}

static const char *skip_ws(const char *p, const char *end) {
  while (p < end && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')) p++;
  return p;
}

/* An array of numbers (nested at most GROVE_MAX_DIMS deep) at p == '[':
 * its end and its leaves, or NULL when it is anything else (jansson then
 * parses it, and words what is wrong with it). */
static const char *scan_number_array(const char *p, const char *end, uint64_t *leaves) {
  int depth = 0;
  *leaves = 0;
  for (;;) {
    /* at a value */
    p = skip_ws(p, end);
    if (p >= end) return NULL;
    if (*p == '[') {
      if (++depth > GROVE_MAX_DIMS) return NULL;
      p = skip_ws(p + 1, end);
      if (p < end && *p == ']') {
        depth--;
        p++;
        goto after_value;
      }
      continue;
    }
    bool integral;
    if (!(p = scan_number(p, end, &integral))) return NULL;
    (*leaves)++;
  after_value:
    for (;;) {
      if (depth == 0) return p;
      p = skip_ws(p, end);
      if (p >= end) return NULL;
      if (*p == ',') {
        p++;
        break;
      }
      if (*p != ']') return NULL;
      depth--;
      p++;
    }
  }
}

size_t grove__oip_cut_data(const char *json, size_t len, char *out, oip_span *spans, size_t max,
                           size_t *nspans) {
  /* The containers open at p: kind, the key being read or whose value
   * follows (1: "inputs", 2: "data", 0: another), the key each container
   * was opened under, an array's element index. */
  enum { MAXD = 8 };
  char kind[MAXD];
  int key[MAXD], under[MAXD];
  size_t index[MAXD];
  int depth = 0;
  const char *p = json, *end = json + len, *copied = json;
  size_t o = 0;
  *nspans = 0;
  while (p < end) {
    char c = *p;
    if (c == '"') {
      const char *s = ++p;
      while (p < end && *p != '"') p += *p == '\\' ? 2 : 1;
      if (p >= end) break; /* unterminated: jansson says so */
      size_t n = (size_t)(p - s);
      p++;
      if (depth > 0 && depth <= MAXD && kind[depth - 1] == '{') {
        const char *q = skip_ws(p, end);
        if (q < end && *q == ':') /* a key */
          key[depth - 1] = n == 6 && memcmp(s, "inputs", 6) == 0 ? 1
                           : n == 4 && memcmp(s, "data", 4) == 0 ? 2
                                                                 : 0;
      }
      continue;
    }
    if (c == '[' && depth == 3 && kind[2] == '{' && key[2] == 2 && under[1] == 1 &&
        kind[1] == '[' && *nspans < max) {
      uint64_t leaves;
      const char *e = scan_number_array(p, end, &leaves);
      if (e && e - p >= 4) { /* shorter ones stay: "null" must not grow the text */
        /* inputs[index[1]].data: cut out, "null" in its place. */
        memcpy(out + o, copied, (size_t)(p - copied));
        o += (size_t)(p - copied);
        memcpy(out + o, "null", 4);
        o += 4;
        spans[*nspans] = (oip_span){.input = index[1],
                                    .off = (size_t)(p - json),
                                    .len = (size_t)(e - p),
                                    .leaves = leaves};
        (*nspans)++;
        p = copied = e;
        continue;
      }
    }
    if (c == '{' || c == '[') {
      if (depth < MAXD) {
        kind[depth] = c;
        key[depth] = 0;
        index[depth] = 0;
        under[depth] = depth > 0 && kind[depth - 1] == '{' ? key[depth - 1] : 0;
      }
      depth++;
    } else if (c == '}' || c == ']') {
      if (depth > 0) depth--;
    } else if (c == ',' && depth > 0 && depth <= MAXD) {
      if (kind[depth - 1] == '[') index[depth - 1]++;
      key[depth - 1] = 0;
    }
    p++;
  }
  memcpy(out + o, copied, (size_t)(end - copied));
  o += (size_t)(end - copied);
  out[o] = 0;
  return o;
}

bool grove__oip_text_data(const char *text, const oip_span *sp, grove_dtype dt, uint64_t numel,
                          void **out, char *why, size_t n) {
  *out = NULL;
  if (sp->leaves > numel) {
    snprintf(why, n, "holds more values than the shape's %" PRIu64 " elements", numel);
    return false;
  }
  if (sp->leaves != numel) {
    snprintf(why, n, "holds %" PRIu64 " values, but the shape has %" PRIu64 " elements",
             sp->leaves, numel);
    return false;
  }
  if (dt == GROVE_BOOL && numel > 0) {
    snprintf(why, n, "value 0: BOOL takes true or false");
    return false;
  }
  size_t es = grove_dtype_size(dt);
  unsigned char *buf = malloc(numel * es + 1), *w = buf;
  if (!buf) {
    snprintf(why, n, "out of memory for %" PRIu64 " values", numel);
    return false;
  }
  const char *p = text + sp->off, *end = p + sp->len;
  for (uint64_t i = 0; i < numel; i++) {
    while (p < end && !(*p == '-' || (*p >= '0' && *p <= '9'))) p++;
    bool integral;
    const char *e = scan_number(p, end, &integral);
    const char *bad = NULL;
    if (is_float(dt)) {
      store_float(dt, w, strtod(p, NULL));
    } else if (!integral) {
      bad = "an integer datatype takes integers";
    } else {
      errno = 0;
      long long x = strtoll(p, NULL, 10);
      if (!store_int(dt, w, x) || errno) bad = out_of_range;
    }
    if (bad) {
      snprintf(why, n, "value %" PRIu64 ": %s", i, bad);
      free(buf);
      return false;
    }
    w += es;
    p = e;
  }
  *out = buf;
  return true;
}
