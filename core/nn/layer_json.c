/* layer_json.c: the typed readers the model.json builders of every layer
 * use for constructor arguments (split out of layer_registry.c, so that the
 * layers below the registry do not call up into it).
 *
 * Every reader words its errors the same way, naming the JSON path of the
 * argument, what was expected and what was found:
 *
 *   $.module.children[2].out_features: expected a positive integer, got -3
 *
 * spec.c prefixes the file ("model.json: ") when it knows it. */
#include <jansson.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "layers_internal.h"

/* ------------------------------------------------------------ messages */

void grove__json_describe(const json_t *v, char *buf, size_t n) {
  switch (json_typeof(v)) {
    case JSON_NULL:
      snprintf(buf, n, "null");
      return;
    case JSON_TRUE:
      snprintf(buf, n, "true");
      return;
    case JSON_FALSE:
      snprintf(buf, n, "false");
      return;
    case JSON_INTEGER:
      snprintf(buf, n, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
      return;
    case JSON_REAL: {
      /* 1.0 must not read as the integer 1: a real where an integer is
       * expected is the very mistake being reported. */
      snprintf(buf, n, "%.17g", json_real_value(v));
      if (!strpbrk(buf, ".eEni")) strncat(buf, ".0", n - strlen(buf) - 1);
      return;
    }
    case JSON_STRING:
      if (json_string_length(v) <= 40)
        snprintf(buf, n, "\"%s\"", json_string_value(v));
      else
        snprintf(buf, n, "a string of %zu bytes", json_string_length(v));
      return;
    case JSON_ARRAY:
      snprintf(buf, n, "an array of %zu item%s", json_array_size(v),
               json_array_size(v) == 1 ? "" : "s");
      return;
    case JSON_OBJECT:
      snprintf(buf, n, "an object");
      return;
  }
  snprintf(buf, n, "an unknown JSON value");
}

static grove_status expected(const char *path, const char *key, const char *what, const json_t *v,
                             grove_err *err) {
  char got[96];
  grove__json_describe(v, got, sizeof got);
  return grove_err_set(err, GROVE_E_SPEC, "%s.%s: expected %s, got %s", path, key, what, got);
}

static grove_status missing(const char *path, const char *type, const char *key, grove_err *err) {
  return grove_err_set(err, GROVE_E_SPEC, "%s.%s: missing required argument of %s", path, key,
                       type);
}

/* "a positive integer", "an integer in [-3, 2]", ... for [min, max]. */
static void int_range_words(int64_t min, int64_t max, char *buf, size_t n) {
  if (min == INT64_MIN && max == INT64_MAX)
    snprintf(buf, n, "an integer");
  else if (min == 1 && max == INT64_MAX)
    snprintf(buf, n, "a positive integer");
  else if (min == 0 && max == INT64_MAX)
    snprintf(buf, n, "a non-negative integer");
  else if (max == INT64_MAX)
    snprintf(buf, n, "an integer >= %" PRId64, min);
  else if (min == INT64_MIN)
    snprintf(buf, n, "an integer <= %" PRId64, max);
  else
    snprintf(buf, n, "an integer in [%" PRId64 ", %" PRId64 "]", min, max);
}

static void number_range_words(double min, double max, char *buf, size_t n) {
  if (isinf(min) && isinf(max))
    snprintf(buf, n, "a number");
  else if (min == 0 && isinf(max))
    snprintf(buf, n, "a non-negative number");
  else if (isinf(max))
    snprintf(buf, n, "a number >= %g", min);
  else if (isinf(min))
    snprintf(buf, n, "a number <= %g", max);
  else
    snprintf(buf, n, "a number in [%g, %g]", min, max);
}

/* ------------------------------------------------------------ readers */

static const char *const spec_keys[] = {"type", "children", "ref", "tied", "graph", NULL};

static bool in_list(const char *key, const char *const *list) {
  for (size_t i = 0; list && list[i]; i++)
    if (strcmp(list[i], key) == 0) return true;
  return false;
}

grove_status grove__json_check_keys(const json_t *obj, const char *path, const char *type,
                                    const char *const *allowed, grove_err *err) {
  if (!json_is_object(obj))
    return grove_err_set(err, GROVE_E_SPEC, "%s: expected an object describing a %s", path, type);
  const char *key;
  json_t *v;
  json_object_foreach((json_t *)obj, key, v) {
    if (in_list(key, spec_keys) || in_list(key, allowed)) continue;
    char list[512] = "";
    size_t used = 0;
    for (size_t i = 0; allowed && allowed[i] && used < sizeof list; i++) {
      int w = snprintf(list + used, sizeof list - used, "%s%s", i ? ", " : "", allowed[i]);
      if (w < 0) break;
      used += (size_t)w;
    }
    if (!allowed || !allowed[0])
      return grove_err_set(err, GROVE_E_SPEC, "%s.%s: unknown argument (%s takes no arguments)",
                           path, key, type);
    return grove_err_set(err, GROVE_E_SPEC, "%s.%s: unknown argument of %s (it takes: %s)", path,
                         key, type, list);
  }
  return GROVE_OK;
}

static grove_status int_value(const json_t *v, const char *path, const char *key, int64_t min,
                              int64_t max, int64_t *out, grove_err *err) {
  char what[96];
  int_range_words(min, max, what, sizeof what);
  if (!json_is_integer(v)) return expected(path, key, what, v, err);
  json_int_t x = json_integer_value(v);
  if (x < min || x > max) return expected(path, key, what, v, err);
  *out = (int64_t)x;
  return GROVE_OK;
}

grove_status grove__json_int(const json_t *obj, const char *path, const char *type, const char *key,
                             bool required, int64_t dflt, int64_t min, int64_t max, int64_t *out,
                             grove_err *err) {
  const json_t *v = json_object_get(obj, key);
  if (!v) {
    if (required) return missing(path, type, key, err);
    *out = dflt;
    return GROVE_OK;
  }
  return int_value(v, path, key, min, max, out, err);
}

grove_status grove__json_int_or_null(const json_t *obj, const char *path, const char *type,
                                     const char *key, bool dflt_null, int64_t dflt, int64_t min,
                                     int64_t max, int64_t *out, bool *is_null, grove_err *err) {
  const json_t *v = json_object_get(obj, key);
  if (!v || json_is_null(v)) {
    *is_null = v ? true : dflt_null;
    *out = *is_null ? 0 : dflt;
    return GROVE_OK;
  }
  char what[128];
  int_range_words(min, max, what, sizeof what);
  strncat(what, " or null", sizeof what - strlen(what) - 1);
  if (!json_is_integer(v)) return expected(path, key, what, v, err);
  json_int_t x = json_integer_value(v);
  if (x < min || x > max) return expected(path, key, what, v, err);
  *is_null = false;
  *out = (int64_t)x;
  return GROVE_OK;
}

grove_status grove__json_number_or_null(const json_t *obj, const char *path, const char *type,
                                        const char *key, bool dflt_null, double dflt, double min,
                                        double max, double *out, bool *is_null, grove_err *err) {
  const json_t *v = json_object_get(obj, key);
  if (!v || json_is_null(v)) {
    *is_null = v ? true : dflt_null;
    *out = *is_null ? NAN : dflt;
    return GROVE_OK;
  }
  char what[128];
  number_range_words(min, max, what, sizeof what);
  strncat(what, " or null", sizeof what - strlen(what) - 1);
  if (!json_is_number(v)) return expected(path, key, what, v, err);
  double x = json_number_value(v);
  if (!(x >= min && x <= max)) return expected(path, key, what, v, err);
  *is_null = false;
  *out = x;
  return GROVE_OK;
}

grove_status grove__json_number(const json_t *obj, const char *path, const char *type,
                                const char *key, double dflt, double min, double max, double *out,
                                grove_err *err) {
  const json_t *v = json_object_get(obj, key);
  if (!v) {
    *out = dflt;
    return GROVE_OK;
  }
  char what[96];
  number_range_words(min, max, what, sizeof what);
  if (!json_is_number(v)) return expected(path, key, what, v, err);
  double x = json_number_value(v);
  if (!(x >= min && x <= max)) return expected(path, key, what, v, err);
  *out = x;
  return GROVE_OK;
}

grove_status grove__json_bool(const json_t *obj, const char *path, const char *type,
                              const char *key, bool dflt, bool *out, grove_err *err) {
  const json_t *v = json_object_get(obj, key);
  if (!v) {
    *out = dflt;
    return GROVE_OK;
  }
  if (!json_is_boolean(v)) return expected(path, key, "true or false", v, err);
  *out = json_is_true(v);
  return GROVE_OK;
}

grove_status grove__json_choice(const json_t *obj, const char *path, const char *type,
                                const char *key, int dflt, const char *const *choices, int *out,
                                grove_err *err) {
  const json_t *v = json_object_get(obj, key);
  if (!v) {
    *out = dflt;
    return GROVE_OK;
  }
  char what[256] = "one of";
  for (int i = 0; choices[i]; i++) {
    size_t used = strlen(what);
    snprintf(what + used, sizeof what - used, "%s \"%s\"", i ? "," : "", choices[i]);
  }
  if (!json_is_string(v)) return expected(path, key, what, v, err);
  for (int i = 0; choices[i]; i++) {
    if (strcmp(json_string_value(v), choices[i]) == 0) {
      *out = i;
      return GROVE_OK;
    }
  }
  return expected(path, key, what, v, err);
}

grove_status grove__json_shape(const json_t *obj, const char *path, const char *type,
                               const char *key, int max_dims, int *ndim, int64_t *shape,
                               grove_err *err) {
  const json_t *v = json_object_get(obj, key);
  if (!v) return missing(path, type, key, err);
  if (json_is_integer(v)) {
    *ndim = 1;
    return int_value(v, path, key, 1, INT64_MAX, &shape[0], err);
  }
  char what[128];
  snprintf(what, sizeof what, "a positive integer or a list of 1 to %d positive integers",
           max_dims);
  if (!json_is_array(v) || json_array_size(v) == 0 || json_array_size(v) > (size_t)max_dims)
    return expected(path, key, what, v, err);
  for (size_t i = 0; i < json_array_size(v); i++) {
    char elem[64];
    snprintf(elem, sizeof elem, "%s[%zu]", key, i);
    grove_status s = int_value(json_array_get(v, i), path, elem, 1, INT64_MAX, &shape[i], err);
    if (s != GROVE_OK) return s;
  }
  *ndim = (int)json_array_size(v);
  return GROVE_OK;
}

grove_status grove__json_unsupported(const char *path, const char *key, const char *why,
                                     grove_err *err) {
  return grove_err_set(err, GROVE_E_UNSUPPORTED, "%s.%s: %s", path, key, why);
}

grove_status grove__json_built(const char *path, grove_status s, grove_err *err) {
  /* A size the spec asks for that cannot be allocated names the module's
   * JSON path too (and stays GROVE_E_NOMEM). */
  if (s == GROVE_E_NOMEM && err) grove_err_prefix(err, "%s", path);
  if (s != GROVE_E_INVALID_ARGUMENT) return s;
  if (!err) return GROVE_E_SPEC;
  grove_err_prefix(err, "%s", path);
  err->code = GROVE_E_SPEC;
  return GROVE_E_SPEC;
}

/* torch's `int or tuple`: one integer in [min, max] for every dim, or an
 * array of exactly nd of them.  Absent: dflt for every dim (dflt < min
 * means required). */
grove_status grove__json_ints(const json_t *obj, const char *path, const char *type,
                              const char *key, int nd, int64_t dflt, int64_t min, int64_t max,
                              int64_t *out, grove_err *err) {
  const json_t *v = json_object_get(obj, key);
  if (!v) {
    if (dflt < min)
      return grove_err_set(err, GROVE_E_SPEC, "%s.%s: missing required argument of %s", path, key,
                           type);
    for (int d = 0; d < nd; d++) out[d] = dflt;
    return GROVE_OK;
  }
  if (json_is_integer(v)) {
    int64_t x;
    grove_status s = grove__json_int(obj, path, type, key, true, 0, min, max, &x, err);
    for (int d = 0; d < nd; d++) out[d] = x;
    return s;
  }
  if (!json_is_array(v) || json_array_size(v) != (size_t)nd ||
      !json_is_integer(json_array_get(v, 0)) ||
      (nd == 2 && !json_is_integer(json_array_get(v, 1))) ||
      json_integer_value(json_array_get(v, 0)) < min ||
      json_integer_value(json_array_get(v, 0)) > max ||
      (nd == 2 && (json_integer_value(json_array_get(v, 1)) < min ||
                   json_integer_value(json_array_get(v, 1)) > max)))
    return grove_err_set(err, GROVE_E_SPEC,
                         "%s.%s: expected an integer in [%lld, %lld] or a list of %d of them", path,
                         key, (long long)min, (long long)max, nd);
  for (int d = 0; d < nd; d++) out[d] = (int64_t)json_integer_value(json_array_get(v, (size_t)d));
  return GROVE_OK;
}
