/* telemetry_stats.c: the pure functions of groved's hook telemetry: the
 * statistics of the tensors a hook sees (moments, extremes, counts,
 * histogram, per-column moments).
 *
 * Everything here runs on a worker in the middle of a forward, so nothing
 * allocates, locks or recurses.  Moments are accumulated in double around a
 * shift (the chunk's first value), which keeps the one-pass sum of squares
 * well conditioned, and merged across chunks, calls and batches with Chan
 * et al.'s pairwise update; the result matches a two-pass float64
 * computation to ~1e-12 relative, far inside the 1e-4 the tests ask. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "telemetry.h"

/* ================================================================ moments */

void grove__tel_basic_init(tel_basic *b) {
  memset(b, 0, sizeof *b);
  b->min = INFINITY;
  b->max = -INFINITY;
}

void grove__tel_basic_merge(tel_basic *a, const tel_basic *b) {
  a->count += b->count;
  a->zeros += b->zeros;
  a->nans += b->nans;
  a->infs += b->infs;
  a->abs_sum += b->abs_sum;
  if (b->finite == 0) return;
  if (a->finite == 0) {
    a->mean = b->mean;
    a->m2 = b->m2;
  } else {
    double na = (double)a->finite, nb = (double)b->finite, n = na + nb;
    double d = b->mean - a->mean;
    a->mean += d * nb / n;
    a->m2 += b->m2 + d * d * na * nb / n;
  }
  a->finite += b->finite;
  if (b->min < a->min) a->min = b->min;
  if (b->max > a->max) a->max = b->max;
}

double grove__tel_basic_std(const tel_basic *b) {
  if (b->finite < 2) return 0.0;
  double v = b->m2 / (double)(b->finite - 1);
  return v > 0 ? sqrt(v) : 0.0;
}

/* Every value finite: four independent lanes, no branch, so the compiler
 * can keep the loop in vector registers.  Returns false (and leaves *o
 * alone) when a NaN or infinity turned up, for the careful pass. */
static bool moments_fast(const float *x, int64_t n, tel_basic *o) {
  const double k = x[0];
  double s1[4] = {0}, s2[4] = {0}, sa[4] = {0};
  float mn[4], mx[4];
  uint64_t z[4] = {0};
  for (int l = 0; l < 4; l++) mn[l] = mx[l] = x[0];
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    for (int l = 0; l < 4; l++) {
      float v = x[i + l];
      double d = (double)v - k;
      s1[l] += d;
      s2[l] += d * d;
      sa[l] += fabs((double)v);
      mn[l] = v < mn[l] ? v : mn[l];
      mx[l] = v > mx[l] ? v : mx[l];
      z[l] += v == 0.0f;
    }
  }
  for (; i < n; i++) {
    float v = x[i];
    double d = (double)v - k;
    s1[0] += d;
    s2[0] += d * d;
    sa[0] += fabs((double)v);
    mn[0] = v < mn[0] ? v : mn[0];
    mx[0] = v > mx[0] ? v : mx[0];
    z[0] += v == 0.0f;
  }
  double S1 = s1[0] + s1[1] + s1[2] + s1[3], S2 = s2[0] + s2[1] + s2[2] + s2[3];
  double SA = sa[0] + sa[1] + sa[2] + sa[3];
  if (!isfinite(S1) || !isfinite(S2) || !isfinite(SA)) return false;
  float lo = mn[0], hi = mx[0];
  for (int l = 1; l < 4; l++) {
    lo = mn[l] < lo ? mn[l] : lo;
    hi = mx[l] > hi ? mx[l] : hi;
  }
  /* A NaN never wins a comparison, so it can hide from min/max but not
   * from the sums checked above. */
  double dn = (double)n;
  o->count = o->finite = (uint64_t)n;
  o->zeros = z[0] + z[1] + z[2] + z[3];
  o->nans = o->infs = 0;
  o->mean = k + S1 / dn;
  o->m2 = S2 - S1 * S1 / dn;
  if (o->m2 < 0) o->m2 = 0;
  o->abs_sum = SA;
  o->min = lo;
  o->max = hi;
  return true;
}

static void moments_careful(const float *x, int64_t n, tel_basic *o) {
  grove__tel_basic_init(o);
  double k = 0;
  int64_t first = -1;
  for (int64_t i = 0; i < n && first < 0; i++)
    if (isfinite(x[i])) first = i;
  if (first >= 0) k = x[first];
  double s1 = 0, s2 = 0;
  for (int64_t i = 0; i < n; i++) {
    float v = x[i];
    if (isnan(v)) {
      o->nans++;
      continue;
    }
    if (isinf(v)) {
      o->infs++;
      continue;
    }
    double d = (double)v - k;
    s1 += d;
    s2 += d * d;
    o->abs_sum += fabs((double)v);
    o->zeros += v == 0.0f;
    if (v < o->min) o->min = v;
    if (v > o->max) o->max = v;
    o->finite++;
  }
  o->count = (uint64_t)n;
  if (o->finite) {
    double dn = (double)o->finite;
    o->mean = k + s1 / dn;
    o->m2 = s2 - s1 * s1 / dn;
    if (o->m2 < 0) o->m2 = 0;
  }
}

void grove__tel_basic_add(tel_basic *b, const float *x, int64_t n) {
  if (n <= 0) return;
  tel_basic c;
  /* Chunks keep the shifted sums short (and the shift close to the data). */
  const int64_t chunk = 1 << 16;
  for (int64_t off = 0; off < n; off += chunk) {
    int64_t m = n - off < chunk ? n - off : chunk;
    if (!moments_fast(x + off, m, &c)) moments_careful(x + off, m, &c);
    grove__tel_basic_merge(b, &c);
  }
}

/* ================================================================ histogram */

void grove__tel_hist_add(uint64_t *counts, uint32_t nbins, double lo, double hi, uint64_t *below,
                         uint64_t *above, const float *x, int64_t n) {
  if (nbins == 0 || !(hi > lo)) return;
  const double scale = (double)nbins / (hi - lo);
  for (int64_t i = 0; i < n; i++) {
    double v = x[i];
    if (v != v) continue;
    if (v < lo) {
      (*below)++;
    } else if (v >= hi) {
      (*above)++;
    } else {
      uint64_t j = (uint64_t)((v - lo) * scale);
      counts[j < nbins ? j : nbins - 1]++;
    }
  }
}

/* ================================================================ per column */

static void feat_merge_col(tel_feat *f, int64_t j, double nb, double mean_b, double m2_b) {
  double na = (double)f->rows;
  if (na == 0) {
    f->mean[j] = mean_b;
    f->m2[j] = m2_b;
    return;
  }
  double n = na + nb, d = mean_b - f->mean[j];
  f->mean[j] += d * nb / n;
  f->m2[j] += m2_b + d * d * na * nb / n;
}

void grove__tel_feat_add_rows(tel_feat *f, const float *x, int64_t rows) {
  const int64_t F = f->nfeat;
  if (rows <= 0 || F <= 0) return;
  for (int64_t j = 0; j < F; j++) {
    f->k[j] = x[j];
    f->s1[j] = f->s2[j] = 0;
  }
  for (int64_t r = 0; r < rows; r++) {
    const float *row = x + r * F;
    for (int64_t j = 0; j < F; j++) {
      double d = (double)row[j] - f->k[j];
      f->s1[j] += d;
      f->s2[j] += d * d;
    }
  }
  double nb = (double)rows;
  for (int64_t j = 0; j < F; j++) {
    double m2 = f->s2[j] - f->s1[j] * f->s1[j] / nb;
    if (m2 < 0) m2 = 0;
    feat_merge_col(f, j, nb, f->k[j] + f->s1[j] / nb, m2);
  }
  f->rows += (uint64_t)rows;
}

void grove__tel_feat_add_stream(tel_feat *f, const float *x, int64_t n, int64_t flat0) {
  const int64_t F = f->nfeat;
  if (F <= 0) return;
  /* Welford per value: column j's count is the rows merged before this
   * tensor plus the rows of it seen so far. */
  for (int64_t i = 0; i < n; i++) {
    int64_t q = flat0 + i, r = q / F, j = q % F;
    double cnt = (double)f->rows + (double)r + 1.0;
    double v = x[i];
    if (cnt == 1.0) {
      f->mean[j] = v;
      f->m2[j] = 0;
      continue;
    }
    double d = v - f->mean[j];
    f->mean[j] += d / cnt;
    f->m2[j] += d * (v - f->mean[j]);
  }
}

double grove__tel_feat_std(const tel_feat *f, int64_t j) {
  if (f->rows < 2) return 0.0;
  double v = f->m2[j] / (double)(f->rows - 1);
  if (v != v) return v;
  return v > 0 ? sqrt(v) : 0.0;
}

/* ================================================================ tensors */

static float read_elem(const unsigned char *p, grove_dtype dt) {
  switch (dt) {
    case GROVE_F32: {
      float v;
      memcpy(&v, p, 4);
      return v;
    }
    case GROVE_F64: {
      double v;
      memcpy(&v, p, 8);
      return (float)v;
    }
    case GROVE_F16:
    case GROVE_BF16: {
      uint16_t h;
      memcpy(&h, p, 2);
      return dt == GROVE_F16 ? grove_f16_to_f32(h) : grove_bf16_to_f32(h);
    }
    case GROVE_I64: {
      int64_t v;
      memcpy(&v, p, 8);
      return (float)v;
    }
    case GROVE_I32: {
      int32_t v;
      memcpy(&v, p, 4);
      return (float)v;
    }
    case GROVE_I16: {
      int16_t v;
      memcpy(&v, p, 2);
      return (float)v;
    }
    case GROVE_I8:
      return (float)(int8_t)p[0];
    case GROVE_U8:
    case GROVE_BOOL:
      return (float)p[0];
    default:
      return NAN;
  }
}

void grove__tel_tensor_chunks(const grove_tensor *t, float *buf, size_t cap,
                              void (*fn)(void *ctx, const float *x, int64_t n, int64_t flat0),
                              void *ctx) {
  int64_t n = grove_tensor_numel(t);
  if (n <= 0 || !t->data) return;
  if (t->dtype == GROVE_F32 && grove_tensor_is_contiguous(t)) {
    fn(ctx, t->data, n, 0);
    return;
  }
  size_t es = grove_dtype_size(t->dtype);
  if (es == 0 || cap == 0 || t->ndim < 0 || t->ndim > GROVE_MAX_DIMS) return;
  /* An odometer over the shape, following the strides (a view may run
   * backwards or repeat elements; it is read as torch would iterate it). */
  int64_t idx[GROVE_MAX_DIMS] = {0};
  int64_t off = 0; /* in elements */
  const unsigned char *base = t->data;
  size_t used = 0;
  int64_t flat0 = 0;
  for (int64_t q = 0; q < n; q++) {
    buf[used++] = read_elem(base + off * (int64_t)es, t->dtype);
    if (used == cap) {
      fn(ctx, buf, (int64_t)used, flat0);
      flat0 += (int64_t)used;
      used = 0;
    }
    for (int d = t->ndim - 1; d >= 0; d--) {
      if (++idx[d] < t->shape[d]) {
        off += t->strides[d];
        break;
      }
      off -= t->strides[d] * (t->shape[d] - 1);
      idx[d] = 0;
    }
  }
  if (used) fn(ctx, buf, (int64_t)used, flat0);
}
