/* cli_tensor.c: printing, lossless conversion and bench inputs of the grove
 * commands (cli_tensor.h). */
#include "cli_tensor.h"

#include "cli_args.h"

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ============================================================ elements */

/* Offset in elements of the k-th element in C order, following strides. */
static int64_t elem_offset(const grove_tensor *t, int64_t k) {
  int64_t off = 0;
  for (int i = t->ndim - 1; i >= 0; i--) {
    int64_t n = t->shape[i] > 0 ? t->shape[i] : 1;
    off += (k % n) * t->strides[i];
    k /= n;
  }
  return off;
}

/* One element as a number: an integer or a double (every float dtype widens
 * exactly to double). */
typedef struct num {
  bool is_int;
  int64_t i;
  double d;
} num;

static num elem(const grove_tensor *t, int64_t k) {
  size_t es = grove_dtype_size(t->dtype);
  const unsigned char *p = (const unsigned char *)t->data + elem_offset(t, k) * (int64_t)es;
  num v = {0};
  switch (t->dtype) {
    case GROVE_F32: {
      float f;
      memcpy(&f, p, 4);
      v.d = f;
      break;
    }
    case GROVE_F64:
      memcpy(&v.d, p, 8);
      break;
    case GROVE_F16:
    case GROVE_BF16: {
      uint16_t h;
      memcpy(&h, p, 2);
      v.d = t->dtype == GROVE_F16 ? grove_f16_to_f32(h) : grove_bf16_to_f32(h);
      break;
    }
    case GROVE_I64:
      v.is_int = true;
      memcpy(&v.i, p, 8);
      break;
    case GROVE_I32: {
      int32_t x;
      memcpy(&x, p, 4);
      v.is_int = true;
      v.i = x;
      break;
    }
    case GROVE_I16: {
      int16_t x;
      memcpy(&x, p, 2);
      v.is_int = true;
      v.i = x;
      break;
    }
    case GROVE_I8:
      v.is_int = true;
      v.i = (int8_t)p[0];
      break;
    case GROVE_U8:
    case GROVE_BOOL:
      v.is_int = true;
      v.i = p[0];
      break;
    default:
      break;
  }
  return v;
}

/* ============================================================ printing */

static void print_num(num v) {
  if (v.is_int)
    printf(" %lld", (long long)v.i);
  else
    printf(" %.7g", v.d);
}

enum { SHOW_ROWS = 8, SHOW_COLS = 10 };

void grove__cli_print_tensor(const char *name, const grove_tensor *t) {
  char sh[256];
  printf("%s %s %s\n", name, grove_dtype_name(t->dtype),
         grove_shape_str(t->ndim, t->shape, sh, sizeof sh));
  int64_t numel = grove_tensor_numel(t);
  if (numel == 0) return;
  int64_t rows = t->ndim ? t->shape[0] : 1;
  int64_t cols = numel / rows;
  for (int64_t r = 0; r < rows && r < SHOW_ROWS; r++) {
    printf("  [%lld]", (long long)r);
    for (int64_t c = 0; c < cols && c < SHOW_COLS; c++) print_num(elem(t, r * cols + c));
    if (cols > SHOW_COLS) printf(" ... (%lld values)", (long long)cols);
    putchar('\n');
  }
  if (rows > SHOW_ROWS) printf("  ... (%lld rows)\n", (long long)rows);
}

/* ============================================================ conversion */

static bool same_value(num a, num b) {
  if (a.is_int && b.is_int) return a.i == b.i;
  if (!a.is_int && !b.is_int) return a.d == b.d || (isnan(a.d) && isnan(b.d));
  num f = a.is_int ? b : a, n = a.is_int ? a : b;
  if (!(f.d >= -9223372036854775808.0 && f.d < 9223372036854775808.0)) return false;
  return (double)(int64_t)f.d == f.d && (int64_t)f.d == n.i;
}

grove_status grove__cli_convert(const grove_tensor *src, grove_dtype want, const char *path,
                                const char *iname, grove_tensor **out, grove_err *err) {
  if (grove_dtype_is_float(src->dtype) && !grove_dtype_is_float(want))
    return grove_err_set(
        err, GROVE_E_DTYPE, "%s holds %s, but input '%s' takes %s (indices): save it as %s", path,
        grove_dtype_name(src->dtype), iname, grove_dtype_name(want), grove_dtype_name(want));
  grove_err cerr = {0};
  grove_tensor *t = grove_tensor_clone(src, want, &cerr);
  if (!t)
    return grove_err_set(err, cerr.code == GROVE_E_NOMEM ? GROVE_E_NOMEM : GROVE_E_DTYPE,
                         "%s: %s does not convert to %s, which input '%s' takes: %s", path,
                         grove_dtype_name(src->dtype), grove_dtype_name(want), iname,
                         grove_err_msg(&cerr));
  int64_t n = grove_tensor_numel(src);
  for (int64_t k = 0; k < n; k++) {
    num a = elem(src, k), b = elem(t, k);
    if (same_value(a, b)) continue;
    char v[64];
    if (a.is_int)
      snprintf(v, sizeof v, "%lld", (long long)a.i);
    else
      for (int prec = 9; prec <= 17; prec++) { /* the shortest text that reads back */
        snprintf(v, sizeof v, "%.*g", prec, a.d);
        if (strtod(v, NULL) == a.d) break;
      }
    grove_tensor_release(t);
    return grove_err_set(err, GROVE_E_DTYPE,
                         "%s: input '%s' takes %s, and element %lld of this %s array (%s) has "
                         "no exact %s value; convert it yourself if rounding is acceptable",
                         path, iname, grove_dtype_name(want), (long long)k,
                         grove_dtype_name(src->dtype), v, grove_dtype_name(want));
  }
  *out = t;
  return GROVE_OK;
}

/* ============================================================ bench inputs */

enum { FREE_DIM = 16 };

/* Deterministic inputs (xorshift64*), so two runs do the same work. */
static void fill_random(grove_tensor *t, uint64_t *state) {
  int64_t n = grove_tensor_numel(t);
  if (t->dtype != GROVE_F32 && t->dtype != GROVE_F64) return; /* integers stay 0 */
  for (int64_t k = 0; k < n; k++) {
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    uint64_t r = *state * 2685821657736338717ull;
    double u = (double)(r >> 11) * (1.0 / 9007199254740992.0) * 2.0 - 1.0;
    if (t->dtype == GROVE_F32)
      ((float *)t->data)[k] = (float)u;
    else
      ((double *)t->data)[k] = u;
  }
}

grove_tensor *grove__cli_bench_input(const grove_io_spec *s, long long batch, uint64_t *state,
                                     grove_err *err) {
  int64_t shape[GROVE_MAX_DIMS];
  for (int d = 0; d < s->ndim; d++)
    shape[d] = d == 0 ? batch : s->shape[d] < 0 ? FREE_DIM : s->shape[d];
  grove_tensor *t = grove_tensor_new(s->dtype, s->ndim, shape, err);
  if (!t) return NULL;
  fill_random(t, state);
  char sh[256];
  printf("input %s: %s %s\n", s->name, grove_dtype_name(s->dtype),
         grove_shape_str(s->ndim, shape, sh, sizeof sh));
  return t;
}

/* ============================================================ named inputs */

const char *grove__cli_input_file(const char *arg, char *name, size_t n) {
  const char *eq = strchr(arg, '=');
  const char *slash = strchr(arg, '/');
  if (!eq || eq == arg || (slash && slash < eq)) {
    if (n) name[0] = '\0';
    return arg;
  }
  size_t len = (size_t)(eq - arg);
  if (len >= n) len = n ? n - 1 : 0;
  if (n) {
    memcpy(name, arg, len);
    name[len] = '\0';
  }
  return eq + 1;
}

static void input_names(const grove_io_spec *specs, size_t nspecs, char *buf, size_t n) {
  size_t used = 0;
  buf[0] = '\0';
  for (size_t i = 0; i < nspecs && used + 1 < n; i++) {
    int w = snprintf(buf + used, n - used, "%s%s", i ? ", " : "",
                     specs[i].name ? specs[i].name : "?");
    if (w < 0) break;
    used += (size_t)w < n - used ? (size_t)w : n - used - 1;
  }
}

int grove__cli_order_inputs(const char *model, const char *const *args, size_t nargs,
                            const grove_io_spec *specs, size_t nspecs, size_t *order) {
  char name[256], names[512];
  size_t named = 0;
  for (size_t k = 0; k < nargs; k++) {
    grove__cli_input_file(args[k], name, sizeof name);
    if (name[0]) named++;
  }
  if (named == 0) {
    if (nargs != nspecs)
      return grove__cli_fail(EXIT_REFUSED, "model %s takes %zu input%s, %zu .npy file%s given",
                             model, nspecs, nspecs == 1 ? "" : "s", nargs,
                             nargs == 1 ? " was" : "s were");
    for (size_t i = 0; i < nspecs; i++) order[i] = i;
    return 0;
  }
  input_names(specs, nspecs, names, sizeof names);
  if (named != nargs)
    return grove__cli_fail(EXIT_REFUSED,
                           "give model %s's inputs all as NAME=FILE.npy or all in order, not "
                           "both (its inputs: %s)",
                           model, names);
  for (size_t i = 0; i < nspecs; i++) order[i] = SIZE_MAX;
  for (size_t k = 0; k < nargs; k++) {
    grove__cli_input_file(args[k], name, sizeof name);
    size_t i = 0;
    while (i < nspecs && !(specs[i].name && strcmp(specs[i].name, name) == 0)) i++;
    if (i == nspecs)
      return grove__cli_fail(EXIT_REFUSED, "model %s has no input '%s' (its inputs: %s)", model,
                             name, names);
    if (order[i] != SIZE_MAX)
      return grove__cli_fail(EXIT_REFUSED, "input '%s' of model %s is given twice", name, model);
    order[i] = k;
  }
  for (size_t i = 0; i < nspecs; i++)
    if (order[i] == SIZE_MAX)
      return grove__cli_fail(EXIT_REFUSED, "input '%s' of model %s was not given (its inputs: %s)",
                             specs[i].name ? specs[i].name : "?", model, names);
  return 0;
}
