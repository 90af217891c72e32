/* optim.c: torch.optim.SGD, Adam and AdamW with param_groups.
 *
 * Each step follows torch 1.13's single-tensor implementations
 * (torch/optim/sgd.py _single_tensor_sgd, adam.py _single_tensor_adam,
 * adamw.py _single_tensor_adamw) operation by operation in float32, with
 * the scalars torch computes in Python (bias corrections, step size) in
 * double, so that a few steps agree with torch to float32 rounding.
 *
 * State per parameter, created the first time the parameter has a gradient
 * at a step (as torch's lazy state): SGD's momentum_buffer (None while
 * momentum is 0, created from the first gradient), Adam's step (a float,
 * saved as a 0-d float32 tensor as torch keeps it), exp_avg, exp_avg_sq and,
 * with amsgrad, max_exp_avg_sq.  The order in which parameters first got
 * state is kept too: it is the order of torch's state dict.
 * Saving and loading the state_dict is in optim_io.c. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "optim_internal.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

grove_optim_hparams grove_optim_defaults(grove_optim_kind kind) {
  grove_optim_hparams h = {.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8};
  if (kind == GROVE_OPTIM_ADAMW) h.weight_decay = 1e-2;
  return h;
}

bool grove_optim_kind_from_name(const char *name, grove_optim_kind *out) {
  if (!name) return false;
  if (strcmp(name, "SGD") == 0)
    *out = GROVE_OPTIM_SGD;
  else if (strcmp(name, "Adam") == 0)
    *out = GROVE_OPTIM_ADAM;
  else if (strcmp(name, "AdamW") == 0)
    *out = GROVE_OPTIM_ADAMW;
  else
    return false;
  return true;
}

/* torch's constructor checks, with its messages. */
grove_status grove__optim_check(grove_optim_kind kind, const grove_optim_hparams *h,
                                grove_err *err) {
  if (!(h->lr >= 0.0))
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT, "Invalid learning rate: %g", h->lr);
  if (!(h->weight_decay >= 0.0))
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT, "Invalid weight_decay value: %g",
                         h->weight_decay);
  if (kind == GROVE_OPTIM_SGD) {
    if (!(h->momentum >= 0.0))
      return grove_err_set(err, GROVE_E_INVALID_ARGUMENT, "Invalid momentum value: %g",
                           h->momentum);
    if (h->nesterov && (h->momentum <= 0 || h->dampening != 0))
      return grove_err_set(err, GROVE_E_INVALID_ARGUMENT,
                           "Nesterov momentum requires a momentum and zero dampening");
    if (!isfinite(h->dampening))
      return grove_err_set(err, GROVE_E_INVALID_ARGUMENT, "Invalid dampening value: %g",
                           h->dampening);
    return GROVE_OK;
  }
  if (!(h->eps >= 0.0))
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT, "Invalid epsilon value: %g", h->eps);
  if (!(h->beta1 >= 0.0 && h->beta1 < 1.0))
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT, "Invalid beta parameter at index 0: %g",
                         h->beta1);
  if (!(h->beta2 >= 0.0 && h->beta2 < 1.0))
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT, "Invalid beta parameter at index 1: %g",
                         h->beta2);
  return GROVE_OK;
}

void grove_optim_free(grove_optim *o) {
  if (!o) return;
  for (size_t i = 0; i < o->nparams; i++) {
    grove_tensor_release(o->params[i]);
    grove__pstate_clear(&o->state[i]);
  }
  for (size_t g = 0; g < o->ngroups; g++) free(o->groups[g].idx);
  free(o->groups);
  free(o->params);
  free(o->state);
  free(o->group_of);
  free(o->order);
  free(o);
}

void grove__pstate_clear(grove__pstate *s) {
  grove_tensor_release(s->buf);
  grove_tensor_release(s->sq);
  grove_tensor_release(s->maxsq);
  memset(s, 0, sizeof *s);
}

grove_status grove_optim_new(grove_optim_kind kind, grove_tensor *const *params, size_t nparams,
                             const grove_param_group *groups, size_t ngroups,
                             const grove_optim_hparams *h, grove_optim **out, grove_err *err) {
  *out = NULL;
  if (kind != GROVE_OPTIM_SGD && kind != GROVE_OPTIM_ADAM && kind != GROVE_OPTIM_ADAMW)
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT, "unknown optimizer kind %d", (int)kind);
  for (size_t i = 0; i < nparams; i++)
    if (!params[i] || params[i]->dtype != GROVE_F32 || !grove_tensor_is_contiguous(params[i]) ||
        params[i]->refcount == 0)
      return grove_err_set(err, GROVE_E_INVALID_ARGUMENT,
                           "optimizer: parameter %zu must be a contiguous float32 heap tensor", i);
  grove_optim_hparams dflt = h ? *h : grove_optim_defaults(kind);
  grove_param_group all = {.h = dflt, .params = NULL, .nparams = nparams};
  if (ngroups == 0) {
    groups = &all;
    ngroups = 1;
  }
  grove_optim *o = calloc(1, sizeof *o);
  if (!o) return grove_err_set(err, GROVE_E_NOMEM, "out of memory");
  o->kind = kind;
  o->nparams = nparams;
  o->params = calloc(nparams + 1, sizeof *o->params);
  o->state = calloc(nparams + 1, sizeof *o->state);
  o->group_of = malloc((nparams + 1) * sizeof *o->group_of);
  o->order = malloc((nparams + 1) * sizeof *o->order);
  o->groups = calloc(ngroups, sizeof *o->groups);
  grove_status s = GROVE_OK;
  if (!o->params || !o->state || !o->group_of || !o->order || !o->groups)
    s = grove_err_set(err, GROVE_E_NOMEM, "out of memory");
  for (size_t i = 0; !s && i < nparams; i++) {
    o->params[i] = params[i];
    grove_tensor_retain(params[i]);
    o->group_of[i] = SIZE_MAX;
  }
  for (size_t g = 0; !s && g < ngroups; g++) {
    o->ngroups = g + 1;
    grove__group *gr = &o->groups[g];
    gr->h = groups[g].h;
    if ((s = grove__optim_check(kind, &gr->h, err))) {
      grove_err_prefix(err, "param_groups[%zu]", g);
      break;
    }
    gr->n = groups[g].nparams;
    gr->idx = malloc((gr->n + 1) * sizeof *gr->idx);
    if (!gr->idx) {
      s = grove_err_set(err, GROVE_E_NOMEM, "out of memory");
      break;
    }
    for (size_t k = 0; k < gr->n; k++) {
      size_t i = groups[g].params ? groups[g].params[k] : k;
      if (i >= nparams) {
        s = grove_err_set(err, GROVE_E_INVALID_ARGUMENT,
                          "param_groups[%zu]: parameter index %zu is out of range (%zu parameters)",
                          g, i, nparams);
        break;
      }
      if (o->group_of[i] != SIZE_MAX) {
        s = grove_err_set(err, GROVE_E_INVALID_ARGUMENT,
                          "some parameters appear in more than one parameter group (parameter "
                          "%zu)",
                          i);
        break;
      }
      o->group_of[i] = g;
      gr->idx[k] = i;
    }
  }
  if (s) {
    grove_optim_free(o);
    return s;
  }
  *out = o;
  return GROVE_OK;
}

grove_optim_kind grove_optim_get_kind(const grove_optim *o) {
  return o->kind;
}
size_t grove_optim_num_groups(const grove_optim *o) {
  return o->ngroups;
}
grove_optim_hparams *grove_optim_group(grove_optim *o, size_t i) {
  return i < o->ngroups ? &o->groups[i].h : NULL;
}

static grove_tensor *zeros_like(const grove_tensor *p, grove_err *err) {
  return grove_tensor_new(GROVE_F32, p->ndim, p->shape, err);
}

/* Creates parameter i's state on its first step (torch's lazy init). */
static grove_status init_state(grove_optim *o, size_t i, const grove_optim_hparams *h,
                               grove_err *err) {
  grove__pstate *st = &o->state[i];
  if (st->has) return GROVE_OK;
  const grove_tensor *p = o->params[i];
  if (o->kind != GROVE_OPTIM_SGD) {
    st->buf = zeros_like(p, err);
    st->sq = zeros_like(p, err);
    if (h->amsgrad) st->maxsq = zeros_like(p, err);
    if (!st->buf || !st->sq || (h->amsgrad && !st->maxsq)) {
      grove__pstate_clear(st);
      return err && err->code ? err->code : GROVE_E_NOMEM;
    }
  }
  st->has = true;
  o->order[o->norder++] = i;
  return GROVE_OK;
}

/* The update loops take their switches as constants (inlined per case) so
 * that each case compiles to one branch-free loop GCC can vectorise; -O2
 * does not unswitch loops by itself. */
static inline __attribute__((always_inline)) void sgd_loop(
    float *restrict p, float *restrict b, const float *restrict g, int64_t n, float sign, float wd,
    float mom, float damp, float lr, bool decay, bool first, bool has_buf, bool nesterov) {
  for (int64_t j = 0; j < n; j++) {
    float d = g[j] * sign;
    if (decay) d = d + wd * p[j];
    if (has_buf) {
      b[j] = first ? d : b[j] * mom + damp * d;
      d = nesterov ? d + mom * b[j] : b[j];
    }
    p[j] = p[j] + lr * d;
  }
}

/* Elements per chunk of an update on the compute threads: every element is
 * updated by the same operations whichever thread takes it, so the result
 * does not depend on the thread count. */
#define OPTIM_GRAIN 65536

typedef struct sgd_args {
  float *p, *b; /* b: the momentum buffer, NULL without momentum */
  const float *g;
  float sign, wd, mom, damp, lr;
  bool decay;
  int c; /* momentum cases: decay x first x nesterov */
} sgd_args;

static void sgd_chunk(void *ctx, int64_t begin, int64_t end) {
  const sgd_args *a = ctx;
  float *p = a->p + begin, *b = a->b ? a->b + begin : NULL;
  const float *g = a->g + begin;
  const int64_t n = end - begin;
  const float sign = a->sign, wd = a->wd, mom = a->mom, damp = a->damp, lr = a->lr;
  if (!b) {
    if (a->decay)
      sgd_loop(p, b, g, n, sign, wd, mom, damp, lr, true, false, false, false);
    else
      sgd_loop(p, b, g, n, sign, wd, mom, damp, lr, false, false, false, false);
    return;
  }
  switch (a->c) {
#define SGD_CASE(k)                                                           \
  case k:                                                                     \
    sgd_loop(p, b, g, n, sign, wd, mom, damp, lr, (k)&4, (k)&2, true, (k)&1); \
    break;
    SGD_CASE(0)
    SGD_CASE(1)
    SGD_CASE(2)
    SGD_CASE(3)
    SGD_CASE(4)
    SGD_CASE(5)
    SGD_CASE(6)
    SGD_CASE(7)
#undef SGD_CASE
  }
}

static void sgd_step(grove_optim *o, size_t i, const grove_optim_hparams *h, const float *g,
                     grove_err *err, grove_status *s) {
  grove__pstate *st = &o->state[i];
  float *p = o->params[i]->data;
  const int64_t n = grove_tensor_numel(o->params[i]);
  const float wd = (float)h->weight_decay, mom = (float)h->momentum;
  const float damp = (float)(1.0 - h->dampening), lr = (float)-h->lr;
  const float sign = h->maximize ? -1.0f : 1.0f;
  const bool decay = h->weight_decay != 0;
  bool first = false;
  if (h->momentum != 0 && !st->buf) {
    /* buf = clone(d_p): the first momentum step. */
    st->buf = zeros_like(o->params[i], err);
    if (!st->buf) {
      *s = err && err->code ? err->code : GROVE_E_NOMEM;
      return;
    }
    first = true;
  }
  sgd_args a = {.p = p,
                .b = st->buf ? st->buf->data : NULL,
                .g = g,
                .sign = sign,
                .wd = wd,
                .mom = mom,
                .damp = damp,
                .lr = lr,
                .decay = decay,
                .c = (decay ? 4 : 0) | (first ? 2 : 0) | (h->nesterov ? 1 : 0)};
  grove__parallel_for(n, OPTIM_GRAIN, sgd_chunk, &a);
}

static inline __attribute__((always_inline)) void adam_loop(
    float *restrict p, float *restrict m, float *restrict v, float *restrict vmax,
    const float *restrict g, int64_t n, float sign, bool decoupled, bool l2, bool amsgrad,
    float decay, float wd, float b1, float a1, float b2, float a2, float bc2s, float eps,
    float step_size) {
  int64_t j = 0;
#if defined(__SSE2__)
  /* Four at a time with the same IEEE operations in the same order (the
   * scalar loop below gives the same bits).  GCC will not vectorise the
   * scalar loop itself: sqrtf may set errno, and it guards each call. */
  const __m128 vsign = _mm_set1_ps(sign), vdecay = _mm_set1_ps(decay), vwd = _mm_set1_ps(wd);
  const __m128 vb1 = _mm_set1_ps(b1), va1 = _mm_set1_ps(a1), vb2 = _mm_set1_ps(b2);
  const __m128 va2 = _mm_set1_ps(a2), vbc2s = _mm_set1_ps(bc2s), veps = _mm_set1_ps(eps);
  const __m128 vstep = _mm_set1_ps(step_size);
  for (; j + 4 <= n; j += 4) {
    __m128 d = _mm_mul_ps(_mm_loadu_ps(g + j), vsign);
    __m128 pj = _mm_loadu_ps(p + j);
    if (decoupled) pj = _mm_mul_ps(pj, vdecay);
    if (l2) d = _mm_add_ps(d, _mm_mul_ps(vwd, pj));
    const __m128 mj = _mm_add_ps(_mm_mul_ps(_mm_loadu_ps(m + j), vb1), _mm_mul_ps(va1, d));
    const __m128 vj =
        _mm_add_ps(_mm_mul_ps(_mm_loadu_ps(v + j), vb2), _mm_mul_ps(_mm_mul_ps(va2, d), d));
    _mm_storeu_ps(m + j, mj);
    _mm_storeu_ps(v + j, vj);
    __m128 sq = vj;
    if (amsgrad) {
      sq = _mm_max_ps(_mm_loadu_ps(vmax + j), vj); /* vmax > v ? vmax : v */
      _mm_storeu_ps(vmax + j, sq);
    }
    const __m128 den = _mm_add_ps(_mm_div_ps(_mm_sqrt_ps(sq), vbc2s), veps);
    _mm_storeu_ps(p + j, _mm_add_ps(pj, _mm_div_ps(_mm_mul_ps(vstep, mj), den)));
  }
#endif
  for (; j < n; j++) {
    float d = g[j] * sign;
    if (decoupled) p[j] = p[j] * decay;
    if (l2) d = d + wd * p[j];
    m[j] = m[j] * b1 + a1 * d;
    v[j] = v[j] * b2 + a2 * d * d; /* addcmul: value * t1 * t2 */
    float den;
    if (amsgrad) {
      vmax[j] = vmax[j] > v[j] ? vmax[j] : v[j];
      den = sqrtf(vmax[j]) / bc2s + eps;
    } else {
      den = sqrtf(v[j]) / bc2s + eps;
    }
    p[j] = p[j] + step_size * m[j] / den; /* addcdiv: value * t1 / t2 */
  }
}

typedef struct adam_args {
  float *p, *m, *v, *vmax;
  const float *g;
  float sign, decay, wd, b1, a1, b2, a2, bc2s, eps, step_size;
  int c; /* decoupled x l2 x amsgrad */
} adam_args;

static void adam_chunk(void *ctx, int64_t begin, int64_t end) {
  const adam_args *a = ctx;
  float *p = a->p + begin, *m = a->m + begin, *v = a->v + begin;
  float *vmax = a->vmax ? a->vmax + begin : NULL;
  const float *g = a->g + begin;
  const int64_t n = end - begin;
  switch (a->c) {
#define ADAM_CASE(k)                                                                            \
  case k:                                                                                       \
    adam_loop(p, m, v, vmax, g, n, a->sign, (k)&4, (k)&2, (k)&1, a->decay, a->wd, a->b1, a->a1, \
              a->b2, a->a2, a->bc2s, a->eps, a->step_size);                                     \
    break;
    ADAM_CASE(0)
    ADAM_CASE(1)
    ADAM_CASE(2)
    ADAM_CASE(3)
    ADAM_CASE(4)
    ADAM_CASE(5)
#undef ADAM_CASE
  }
}

static void adam_step(grove_optim *o, size_t i, const grove_optim_hparams *h, const float *g) {
  grove__pstate *st = &o->state[i];
  float *p = o->params[i]->data, *m = st->buf->data, *v = st->sq->data;
  float *vmax = st->maxsq ? st->maxsq->data : NULL;
  const int64_t n = grove_tensor_numel(o->params[i]);
  st->step = (float)(st->step + 1.0f);
  const double step = st->step;
  const bool decoupled = o->kind == GROVE_OPTIM_ADAMW;
  const bool l2 = !decoupled && h->weight_decay != 0;
  const float sign = h->maximize ? -1.0f : 1.0f;
  const float b1 = (float)h->beta1, b2 = (float)h->beta2;
  const float a1 = (float)(1.0 - h->beta1), a2 = (float)(1.0 - h->beta2);
  const float wd = (float)h->weight_decay, decay = (float)(1.0 - h->lr * h->weight_decay);
  const double bc1 = 1.0 - pow(h->beta1, step), bc2 = 1.0 - pow(h->beta2, step);
  const float step_size = (float)-(h->lr / bc1), bc2s = (float)sqrt(bc2), eps = (float)h->eps;
  adam_args a = {.p = p,
                 .m = m,
                 .v = v,
                 .vmax = vmax,
                 .g = g,
                 .sign = sign,
                 .decay = decay,
                 .wd = wd,
                 .b1 = b1,
                 .a1 = a1,
                 .b2 = b2,
                 .a2 = a2,
                 .bc2s = bc2s,
                 .eps = eps,
                 .step_size = step_size,
                 .c = (decoupled ? 4 : 0) | (l2 ? 2 : 0) | (vmax ? 1 : 0)};
  grove__parallel_for(n, OPTIM_GRAIN, adam_chunk, &a);
}

grove_status grove_optim_step(grove_optim *o, grove_tensor *const *grads, grove_err *err) {
  /* Check every gradient first: a bad one changes nothing. */
  for (size_t i = 0; grads && i < o->nparams; i++) {
    const grove_tensor *g = grads[i];
    if (!g || o->group_of[i] == SIZE_MAX) continue;
    if (g->dtype != GROVE_F32 || !grove_tensor_same_shape(g, o->params[i]) ||
        !grove_tensor_is_contiguous(g)) {
      char a[128], b[128];
      return grove_err_set(
          err, GROVE_E_SHAPE, "optimizer step: gradient %zu is %s %s, parameter is float32 %s", i,
          grove_dtype_name(g->dtype), grove_shape_str(g->ndim, g->shape, a, sizeof a),
          grove_shape_str(o->params[i]->ndim, o->params[i]->shape, b, sizeof b));
    }
  }
  if (!grads) return GROVE_OK;
  grove_status s = GROVE_OK;
  for (size_t gi = 0; gi < o->ngroups; gi++) {
    const grove__group *gr = &o->groups[gi];
    for (size_t k = 0; k < gr->n; k++) {
      const size_t i = gr->idx[k];
      if (!grads[i]) continue;
      grove__yield_point();
      if ((s = init_state(o, i, &gr->h, err))) return s;
      if (o->kind == GROVE_OPTIM_SGD)
        sgd_step(o, i, &gr->h, grads[i]->data, err, &s);
      else
        adam_step(o, i, &gr->h, grads[i]->data);
      if (s) return s;
    }
  }
  return GROVE_OK;
}
