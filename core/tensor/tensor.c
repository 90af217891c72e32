/* tensor.c: dtypes, refcounted storage, tensors and dtype conversion. */
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "tensor_internal.h"

/* ============================================================== dtypes */

static const struct {
  const char *name, *st_name;
  size_t size;
  bool is_float;
} dtypes[GROVE_DTYPE_COUNT] = {
    [GROVE_F32] = {"float32", "F32", 4, true},  [GROVE_F16] = {"float16", "F16", 2, true},
    [GROVE_BF16] = {"bfloat16", "BF16", 2, true}, [GROVE_F64] = {"float64", "F64", 8, true},
    [GROVE_I64] = {"int64", "I64", 8, false},   [GROVE_I32] = {"int32", "I32", 4, false},
    [GROVE_U8] = {"uint8", "U8", 1, false},     [GROVE_BOOL] = {"bool", "BOOL", 1, false},
    [GROVE_I8] = {"int8", "I8", 1, false},      [GROVE_I16] = {"int16", "I16", 2, false},
};

static bool valid_dtype(grove_dtype dt) { return (unsigned)dt < GROVE_DTYPE_COUNT; }

size_t grove_dtype_size(grove_dtype dt) { return valid_dtype(dt) ? dtypes[dt].size : 0; }
const char *grove_dtype_name(grove_dtype dt) { return valid_dtype(dt) ? dtypes[dt].name : "invalid"; }
const char *grove_dtype_st_name(grove_dtype dt) {
  return valid_dtype(dt) ? dtypes[dt].st_name : "invalid";
}
bool grove_dtype_is_float(grove_dtype dt) { return valid_dtype(dt) && dtypes[dt].is_float; }

bool grove_dtype_from_name(const char *name, grove_dtype *out) {
  static const struct {
    const char *alias;
    grove_dtype dt;
  } aliases[] = {{"float", GROVE_F32},   {"half", GROVE_F16},  {"double", GROVE_F64},
                 {"long", GROVE_I64},    {"int", GROVE_I32},   {"short", GROVE_I16},
                 {"f4", GROVE_F32},      {"f8", GROVE_F64},    {"i8", GROVE_I64}};
  if (!name) return false;
  if (strncmp(name, "torch.", 6) == 0) name += 6;
  for (int i = 0; i < GROVE_DTYPE_COUNT; i++) {
    if (strcmp(name, dtypes[i].name) == 0) {
      *out = (grove_dtype)i;
      return true;
    }
  }
  for (size_t i = 0; i < sizeof aliases / sizeof aliases[0]; i++) {
    if (strcmp(name, aliases[i].alias) == 0) {
      *out = aliases[i].dt;
      return true;
    }
  }
  return false;
}

bool grove_dtype_from_st_name(const char *name, grove_dtype *out) {
  if (!name) return false;
  for (int i = 0; i < GROVE_DTYPE_COUNT; i++) {
    if (strcmp(name, dtypes[i].st_name) == 0) {
      *out = (grove_dtype)i;
      return true;
    }
  }
  return false;
}

/* ============================================================== halves */

float grove_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
  if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else { /* subnormal: normalise */
      int e = -1;
      do {
        e++;
        man <<= 1;
      } while (!(man & 0x400));
      bits = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ff) << 13);
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (man << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
  }
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

uint16_t grove_f32_to_f16(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
  uint32_t exp = (x >> 23) & 0xff, man = x & 0x7fffff;
  if (exp == 0xff) return sign | 0x7c00 | (man ? 0x200 : 0); /* inf / nan */
  int e = (int)exp - 127 + 15;
  if (e >= 0x1f) return sign | 0x7c00; /* overflow -> inf */
  if (e <= 0) {                         /* subnormal or zero */
    if (e < -10) return sign;
    man |= 0x800000;
    int shift = 14 - e;
    uint32_t half = man >> shift, rem = man & ((1u << shift) - 1), mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1))) half++;
    return sign | (uint16_t)half;
  }
  uint32_t half = ((uint32_t)e << 10) | (man >> 13), rem = man & 0x1fff;
  if (rem > 0x1000 || (rem == 0x1000 && (half & 1))) half++; /* may carry into exp: fine */
  return sign | (uint16_t)half;
}

float grove_bf16_to_f32(uint16_t h) {
  uint32_t bits = (uint32_t)h << 16;
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

uint16_t grove_f32_to_bf16(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  if ((x & 0x7fffffff) > 0x7f800000) return (uint16_t)((x >> 16) | 0x40); /* quiet nan */
  x += 0x7fff + ((x >> 16) & 1);
  return (uint16_t)(x >> 16);
}

/* ============================================================== storage */

struct grove_storage {
  atomic_int refcount;
  void *data;
  size_t nbytes;
  void (*release)(void *ctx); /* NULL and owned: data is ours to free */
  void *ctx;
  bool owned;
  bool mapped; /* owned and from mmap (BIG_STORAGE and up) */
};

/* Storages this large come straight from anonymous mappings: the kernel
 * hands out zero pages that cost no memory until written.  A model built
 * from its spec allocates every parameter zeroed and then, loading with
 * assign, replaces most of them by views of the checkpoint: with memset
 * those zeros were a full extra copy of the weights during every reload. */
#define BIG_STORAGE ((size_t)1 << 20)

static _Atomic uint64_t storage_bytes_allocated;

uint64_t grove__storage_bytes_allocated(void) {
  return atomic_load_explicit(&storage_bytes_allocated, memory_order_relaxed);
}

grove_storage *grove_storage_new(size_t nbytes) {
  grove_storage *s = malloc(sizeof *s);
  if (!s) return NULL;
  size_t cap = (nbytes + 63) & ~(size_t)63;
  if (cap < nbytes) {
    free(s);
    return NULL;
  }
  s->mapped = cap >= BIG_STORAGE;
  if (s->mapped) {
    void *p = mmap(NULL, cap, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    s->data = p == MAP_FAILED ? NULL : p; /* page-aligned and zero */
  } else {
    s->data = aligned_alloc(64, cap ? cap : 64);
    if (s->data) memset(s->data, 0, cap ? cap : 64);
  }
  if (!s->data) {
    free(s);
    return NULL;
  }
  atomic_fetch_add_explicit(&storage_bytes_allocated, nbytes, memory_order_relaxed);
  atomic_init(&s->refcount, 1);
  s->nbytes = nbytes;
  s->release = NULL;
  s->ctx = NULL;
  s->owned = true;
  return s;
}

grove_storage *grove_storage_wrap(void *data, size_t nbytes, void (*release)(void *ctx), void *ctx) {
  grove_storage *s = malloc(sizeof *s);
  if (!s) return NULL;
  atomic_init(&s->refcount, 1);
  s->data = data;
  s->nbytes = nbytes;
  s->release = release;
  s->ctx = ctx;
  s->owned = false;
  s->mapped = false;
  return s;
}

void grove_storage_retain(grove_storage *s) {
  atomic_fetch_add_explicit(&s->refcount, 1, memory_order_relaxed);
}

void grove_storage_release(grove_storage *s) {
  if (!s) return;
  if (atomic_fetch_sub_explicit(&s->refcount, 1, memory_order_acq_rel) != 1) return;
  if (s->owned && s->mapped)
    munmap(s->data, (s->nbytes + 63) & ~(size_t)63);
  else if (s->owned)
    free(s->data);
  else if (s->release)
    s->release(s->ctx);
  free(s);
}

void *grove_storage_data(const grove_storage *s) { return s->data; }
size_t grove_storage_nbytes(const grove_storage *s) { return s->nbytes; }

/* ============================================================== tensors */

void grove_contiguous_strides(int ndim, const int64_t *shape, int64_t *strides) {
  int64_t st = 1;
  for (int i = ndim - 1; i >= 0; i--) {
    strides[i] = st;
    st *= shape[i] > 0 ? shape[i] : 1;
  }
}

char *grove_shape_str(int ndim, const int64_t *shape, char *buf, size_t n) {
  size_t used = 0;
  if (n == 0) return buf;
  buf[0] = '\0';
  used += (size_t)snprintf(buf, n, "[");
  for (int i = 0; i < ndim && used < n; i++)
    used += (size_t)snprintf(buf + used, n - used, "%s%lld", i ? ", " : "", (long long)shape[i]);
  if (used < n) snprintf(buf + used, n - used, "]");
  return buf;
}

/* Elements of a shape, or -1 when it is invalid or overflows. */
static int64_t shape_numel(int ndim, const int64_t *shape) {
  uint64_t n = 1;
  for (int i = 0; i < ndim; i++) {
    if (shape[i] < 0) return -1;
    if (grove__mul_overflow_u64(n, (uint64_t)shape[i], &n) || n > (uint64_t)INT64_MAX) return -1;
  }
  return (int64_t)n;
}

static grove_status check_shape(grove_dtype dt, int ndim, const int64_t *shape, grove_err *err) {
  if (!valid_dtype(dt)) return grove_err_set(err, GROVE_E_BAD_DTYPE, "invalid dtype %d", (int)dt);
  if (ndim < 0 || ndim > GROVE_MAX_DIMS)
    return grove_err_set(err, GROVE_E_LIMIT, "%d dimensions: at most %d are supported", ndim,
                         GROVE_MAX_DIMS);
  if (ndim > 0 && !shape) return grove_err_set(err, GROVE_E_INVALID_ARGUMENT, "shape is NULL");
  int64_t n = shape_numel(ndim, shape);
  uint64_t bytes;
  if (n < 0 || grove__mul_overflow_u64((uint64_t)n, grove_dtype_size(dt), &bytes) ||
      bytes > (uint64_t)SIZE_MAX / 2) {
    char s[256];
    return grove_err_set(err, GROVE_E_RANGE, "invalid or too large shape %s",
                         grove_shape_str(ndim, shape, s, sizeof s));
  }
  return GROVE_OK;
}

static grove_tensor *tensor_alloc(grove_dtype dt, int ndim, const int64_t *shape) {
  grove_tensor *t = calloc(1, sizeof *t);
  if (!t) return NULL;
  t->dtype = dt;
  t->ndim = ndim;
  for (int i = 0; i < ndim; i++) t->shape[i] = shape[i];
  grove_contiguous_strides(ndim, t->shape, t->strides);
  t->refcount = 1;
  return t;
}

grove_tensor *grove_tensor_new(grove_dtype dt, int ndim, const int64_t *shape, grove_err *err) {
  if (check_shape(dt, ndim, shape, err) != GROVE_OK) return NULL;
  grove_tensor *t = tensor_alloc(dt, ndim, shape);
  if (!t) goto oom;
  t->storage = grove_storage_new((size_t)shape_numel(ndim, shape) * grove_dtype_size(dt));
  if (!t->storage) {
    free(t);
    goto oom;
  }
  t->data = grove_storage_data(t->storage);
  return t;
oom:;
  /* The shape and the size, so that a spec asking for 2^40 features says
   * what could not be allocated (check_shape bounded the product). */
  char sh[256];
  grove_err_set(err, GROVE_E_NOMEM, "cannot allocate a %s tensor of shape %s (%llu bytes)",
                grove_dtype_name(dt), grove_shape_str(ndim, shape, sh, sizeof sh),
                (unsigned long long)((uint64_t)shape_numel(ndim, shape) * grove_dtype_size(dt)));
  return NULL;
}

bool grove__view_end(uint64_t elem_offset, size_t es, int ndim, const int64_t *shape,
                     const int64_t *strides, uint64_t *end) {
  uint64_t last = elem_offset;
  bool empty = false;
  for (int i = 0; i < ndim; i++) {
    if (shape[i] < 0 || strides[i] < 0) return false;
    if (shape[i] == 0) empty = true;
  }
  if (empty) return !grove__mul_overflow_u64(elem_offset, es, end);
  for (int i = 0; i < ndim; i++) {
    uint64_t r;
    if (grove__mul_overflow_u64((uint64_t)(shape[i] - 1), (uint64_t)strides[i], &r) ||
        __builtin_add_overflow(last, r, &last))
      return false;
  }
  /* last + 1 wraps to 0 when last is 2^64 - 1: checked like the rest. */
  return !__builtin_add_overflow(last, 1, &last) && !grove__mul_overflow_u64(last, es, end);
}

grove_tensor *grove_tensor_view_new(grove_storage *storage, size_t byte_offset, grove_dtype dt,
                                    int ndim, const int64_t *shape, const int64_t *strides,
                                    grove_err *err) {
  if (check_shape(dt, ndim, shape, err) != GROVE_OK) return NULL;
  int64_t cstrides[GROVE_MAX_DIMS];
  if (!strides) {
    grove_contiguous_strides(ndim, shape, cstrides);
    strides = cstrides;
  }
  /* The furthest byte the view can reach must lie inside the storage; an
   * empty view reaches nothing but must start inside. */
  for (int i = 0; i < ndim; i++)
    if (strides[i] < 0)
      return grove_err_set(err, GROVE_E_RANGE, "negative stride %lld", (long long)strides[i]),
             NULL;
  uint64_t end;
  if (!grove__view_end(0, grove_dtype_size(dt), ndim, shape, strides, &end) ||
      __builtin_add_overflow(end, (uint64_t)byte_offset, &end) ||
      end > grove_storage_nbytes(storage))
    goto out_of_bounds;
  grove_tensor *t = tensor_alloc(dt, ndim, shape);
  if (!t) {
    grove_err_set(err, GROVE_E_NOMEM, "out of memory for a tensor");
    return NULL;
  }
  for (int i = 0; i < ndim; i++) t->strides[i] = strides[i];
  grove_storage_retain(storage);
  t->storage = storage;
  t->data = (unsigned char *)grove_storage_data(storage) + byte_offset;
  return t;
out_of_bounds:;
  char s[256];
  grove_err_set(err, GROVE_E_BAD_OFFSETS,
                "a %s view of shape %s at byte offset %zu does not fit in a storage of %zu bytes",
                grove_dtype_name(dt), grove_shape_str(ndim, shape, s, sizeof s), byte_offset,
                grove_storage_nbytes(storage));
  return NULL;
}

grove_tensor *grove_tensor_clone(const grove_tensor *src, grove_dtype dt, grove_err *err) {
  grove_tensor *t = grove_tensor_new(dt, src->ndim, src->shape, err);
  if (!t) return NULL;
  if (grove_tensor_copy(t, src, err) != GROVE_OK) {
    grove_tensor_release(t);
    return NULL;
  }
  return t;
}

void grove_tensor_retain(grove_tensor *t) {
  __atomic_fetch_add(&t->refcount, 1, __ATOMIC_RELAXED);
}

void grove_tensor_release(grove_tensor *t) {
  if (!t) return;
  if (__atomic_fetch_sub(&t->refcount, 1, __ATOMIC_ACQ_REL) != 1) return;
  grove_storage_release(t->storage);
  free(t);
}

void grove_tensor_init(grove_tensor *t, grove_dtype dt, int ndim, const int64_t *shape,
                       void *data) {
  memset(t, 0, sizeof *t);
  t->dtype = dt;
  t->ndim = ndim;
  for (int i = 0; i < ndim; i++) t->shape[i] = shape[i];
  grove_contiguous_strides(ndim, t->shape, t->strides);
  t->data = data;
}

int64_t grove_tensor_numel(const grove_tensor *t) {
  int64_t n = 1;
  for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
  return n;
}

size_t grove_tensor_nbytes(const grove_tensor *t) {
  return (size_t)grove_tensor_numel(t) * grove_dtype_size(t->dtype);
}

bool grove_tensor_is_contiguous(const grove_tensor *t) {
  int64_t st = 1;
  for (int i = t->ndim - 1; i >= 0; i--) {
    if (t->shape[i] == 0) return true;
    if (t->shape[i] != 1 && t->strides[i] != st) return false;
    st *= t->shape[i];
  }
  return true;
}

bool grove__is_nhwc(const grove_tensor *t) {
  if (t->ndim != 4) return false;
  const int64_t C = t->shape[1], H = t->shape[2], W = t->shape[3];
  return t->strides[1] == 1 && t->strides[3] == C && t->strides[2] == W * C &&
         t->strides[0] == H * W * C && !grove_tensor_is_contiguous(t);
}

void grove__set_nhwc(grove_tensor *t) {
  const int64_t C = t->shape[1], H = t->shape[2], W = t->shape[3];
  t->strides[0] = H * W * C;
  t->strides[1] = 1;
  t->strides[2] = W * C;
  t->strides[3] = C;
}

bool grove_tensor_same_shape(const grove_tensor *a, const grove_tensor *b) {
  if (a->ndim != b->ndim) return false;
  for (int i = 0; i < a->ndim; i++)
    if (a->shape[i] != b->shape[i]) return false;
  return true;
}

/* ------------------------------------------------------------ conversion */

/* Every element travels as a double or an int64: exact for every dtype we
 * hold (f64 included for the float side; i64 for the integer side). */
static double load_f(const void *p, grove_dtype dt) {
  switch (dt) {
    case GROVE_F32: return *(const float *)p;
    case GROVE_F16: return grove_f16_to_f32(*(const uint16_t *)p);
    case GROVE_BF16: return grove_bf16_to_f32(*(const uint16_t *)p);
    case GROVE_F64: return *(const double *)p;
    case GROVE_I64: return (double)*(const int64_t *)p;
    case GROVE_I32: return *(const int32_t *)p;
    case GROVE_I16: return *(const int16_t *)p;
    case GROVE_I8: return *(const int8_t *)p;
    case GROVE_U8: return *(const uint8_t *)p;
    case GROVE_BOOL: return *(const uint8_t *)p ? 1.0 : 0.0;
    default: return 0;
  }
}

static int64_t load_i(const void *p, grove_dtype dt) {
  switch (dt) {
    case GROVE_I64: return *(const int64_t *)p;
    case GROVE_I32: return *(const int32_t *)p;
    case GROVE_I16: return *(const int16_t *)p;
    case GROVE_I8: return *(const int8_t *)p;
    case GROVE_U8: return *(const uint8_t *)p;
    case GROVE_BOOL: return *(const uint8_t *)p ? 1 : 0;
    default: return 0;
  }
}

static void store_f(void *p, grove_dtype dt, double v) {
  switch (dt) {
    case GROVE_F32: *(float *)p = (float)v; break;
    case GROVE_F16: *(uint16_t *)p = grove_f32_to_f16((float)v); break;
    case GROVE_BF16: *(uint16_t *)p = grove_f32_to_bf16((float)v); break;
    case GROVE_F64: *(double *)p = v; break;
    default: break;
  }
}

/* False when v does not fit dt. */
static bool store_i(void *p, grove_dtype dt, int64_t v) {
  switch (dt) {
    case GROVE_I64: *(int64_t *)p = v; return true;
    case GROVE_I32:
      if (v < INT32_MIN || v > INT32_MAX) return false;
      *(int32_t *)p = (int32_t)v;
      return true;
    case GROVE_I16:
      if (v < INT16_MIN || v > INT16_MAX) return false;
      *(int16_t *)p = (int16_t)v;
      return true;
    case GROVE_I8:
      if (v < INT8_MIN || v > INT8_MAX) return false;
      *(int8_t *)p = (int8_t)v;
      return true;
    case GROVE_U8:
      if (v < 0 || v > UINT8_MAX) return false;
      *(uint8_t *)p = (uint8_t)v;
      return true;
    case GROVE_BOOL: *(uint8_t *)p = v != 0; return true;
    default: return false;
  }
}

grove_status grove_tensor_copy(grove_tensor *dst, const grove_tensor *src, grove_err *err) {
  if (!grove_tensor_same_shape(dst, src)) {
    char a[256], b[256];
    return grove_err_set(err, GROVE_E_SHAPE, "cannot copy a tensor of shape %s into shape %s",
                         grove_shape_str(src->ndim, src->shape, a, sizeof a),
                         grove_shape_str(dst->ndim, dst->shape, b, sizeof b));
  }
  bool df = grove_dtype_is_float(dst->dtype), sf = grove_dtype_is_float(src->dtype);
  if (sf && !df)
    return grove_err_set(err, GROVE_E_DTYPE, "cannot copy %s into %s", grove_dtype_name(src->dtype),
                         grove_dtype_name(dst->dtype));
  int64_t n = grove_tensor_numel(src);
  if (n == 0) return GROVE_OK;
  size_t des = grove_dtype_size(dst->dtype), ses = grove_dtype_size(src->dtype);
  if (dst->dtype == src->dtype && grove_tensor_is_contiguous(dst) &&
      grove_tensor_is_contiguous(src)) {
    memmove(dst->data, src->data, (size_t)n * des);
    return GROVE_OK;
  }
  /* General case: walk a multi-index over the shape. */
  const bool same = dst->dtype == src->dtype;
  int nd = src->ndim;
  int64_t idx[GROVE_MAX_DIMS] = {0};
  for (int64_t k = 0; k < n; k++) {
    int64_t so = 0, dof = 0;
    for (int i = 0; i < nd; i++) {
      so += idx[i] * src->strides[i];
      dof += idx[i] * dst->strides[i];
    }
    const unsigned char *sp = (const unsigned char *)src->data + so * (int64_t)ses;
    unsigned char *dp = (unsigned char *)dst->data + dof * (int64_t)des;
    if (same) {
      /* Bit for bit, as torch's contiguous(): through float a half's NaN
       * payload (or a float's signalling NaN) would not survive. */
      memcpy(dp, sp, des);
    } else if (df) {
      store_f(dp, dst->dtype, load_f(sp, src->dtype));
    } else if (!store_i(dp, dst->dtype, load_i(sp, src->dtype))) {
      return grove_err_set(err, GROVE_E_RANGE, "value %lld does not fit %s",
                           (long long)load_i(sp, src->dtype), grove_dtype_name(dst->dtype));
    }
    for (int i = nd - 1; i >= 0; i--) {
      if (++idx[i] < src->shape[i]) break;
      idx[i] = 0;
    }
  }
  return GROVE_OK;
}
