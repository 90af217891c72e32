/* layers_attention.c: torch.nn.MultiheadAttention, TransformerEncoderLayer
 * and TransformerEncoder, eval mode, with PyTorch's state_dict layout
 * (self_attn.in_proj_weight, in_proj_bias, out_proj.weight/bias, linear1/2,
 * norm1/2; layers.N. under an encoder).
 *
 * MultiheadAttention: the input projection is one packed GEMM of the
 * in_proj weight (core/kernels/gemm.c) when query, key and value are one tensor
 * (self-attention), else three.  Scores, softmax and the weighted sum run per
 * batch item and head straight on the projected rows (no transposed copies of
 * q, k, v: a head is a column block of a row-major matrix), with the softmax
 * max-subtracted and summed in double; the output projection is out_proj's
 * Linear.  q is scaled by 1/sqrt(head_dim) before the product, as torch does.
 * No masks: attention runs over every position (graph.c refuses a mask
 * argument by name), kdim = vdim = embed_dim, no bias_k/bias_v, no zero
 * attention.  The attention weights (torch's need_weights=True default,
 * averaged over heads unless average_attn_weights=False) are a second output;
 * a graph that calls with need_weights=False says so in the forward's
 * context (grove_fwd.mha, set by grove__mha_next_call) and gets one output.
 *
 * TransformerEncoderLayer runs torch's (slow path) formulation, norm_first
 * either way, relu or gelu, calling its children through
 * grove_module_forward so that their hooks fire; with no hook anywhere,
 * linear1 and a relu run as one fused pass.  torch 1.13's eval fast path
 * (_transformer_encoder_layer_fwd) computes the same math; the parity tests
 * compare against whichever torch takes.  TransformerEncoder gives the arena
 * back between layers (grove__arena_keep), so its scratch is that of one
 * layer whatever the depth. */
#include <assert.h>
#include <cblas.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph_ops.h"
#include "layers_internal.h"
#include "observe.h"

/* Adds *c (just built, with status s) as child name and drops our
 * reference.  *c is read here, after the constructor ran: C leaves the order
 * of argument evaluation open. */
static grove_status add_child(grove_module *m, const char *name, grove_status s, grove_module **c,
                              grove_err *err) {
  if (s) return s;
  s = grove_module_add_module(m, name, *c, err);
  grove_module_release(*c);
  *c = NULL;
  return s;
}

static grove_status scratch(grove_fwd *f, const char *layer) {
  return grove_err_set(f->err, GROVE_E_NOMEM, "%s: scratch arena is exhausted", layer);
}

/* ============================================================ MultiheadAttention */

typedef struct mha_impl {
  int64_t E, H, d;
  bool bias, batch_first;
  double dropout;
  grove__linear_pack *in_pack; /* [3E, E]: q, k and v in one product */
  grove__linear_pack *qkv[3];  /* [E, E] each: separate query, key, value */
  float in_bias[];             /* 3E */
} mha_impl;

static void mha_free_impl(void *impl) {
  mha_impl *p = impl;
  if (!p) return;
  grove__linear_pack_free(p->in_pack);
  for (int i = 0; i < 3; i++) grove__linear_pack_free(p->qkv[i]);
  free(p);
}

void grove__mha_settings(const grove_module *m, grove__layer_settings *s) {
  const mha_impl *p = m->impl;
  s->embed_dim = p->E;
  s->num_heads = p->H;
  s->p = p->dropout;
  s->batch_first = p->batch_first;
}

static grove_status mha_refresh(grove_module *m, grove_err *err) {
  mha_impl *p = m->impl;
  const int64_t E = p->E;
  const grove_tensor *w = grove_module_param(m, "in_proj_weight");
  const grove_tensor *b = grove_module_param(m, "in_proj_bias");
  if (!w)
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT,
                         "MultiheadAttention: in_proj_weight is None");
  if (w->ndim != 2 || w->shape[0] != 3 * E || w->shape[1] != E) {
    char got[128];
    grove_shape_str(w->ndim, w->shape, got, sizeof got);
    return grove_err_set(err, GROVE_E_SHAPE,
                         "MultiheadAttention: in_proj_weight has shape %s, expected [%lld, %lld]",
                         got, (long long)(3 * E), (long long)E);
  }
  if (b && (b->ndim != 1 || b->shape[0] != 3 * E)) {
    char got[128];
    grove_shape_str(b->ndim, b->shape, got, sizeof got);
    return grove_err_set(err, GROVE_E_SHAPE,
                         "MultiheadAttention: in_proj_bias has shape %s, expected [%lld]", got,
                         (long long)(3 * E));
  }
  float *wf = malloc((size_t)(3 * E * E) * sizeof(float) + 1);
  if (!wf) return grove_err_set(err, GROVE_E_NOMEM, "MultiheadAttention: out of memory");
  grove_status s = grove__copy_f32(wf, 3 * E * E, w, "MultiheadAttention", "in_proj_weight", err);
  grove__linear_pack *packs[4] = {NULL};
  if (!s) {
    packs[0] = grove__linear_pack_new(wf, 3 * E, E);
    for (int i = 0; i < 3; i++) packs[i + 1] = grove__linear_pack_new(wf + i * E * E, E, E);
    for (int i = 0; i < 4; i++)
      if (!packs[i]) s = grove_err_set(err, GROVE_E_NOMEM, "MultiheadAttention: out of memory");
  }
  if (!s && b) s = grove__copy_f32(p->in_bias, 3 * E, b, "MultiheadAttention", "in_proj_bias", err);
  free(wf);
  if (s) {
    for (int i = 0; i < 4; i++) grove__linear_pack_free(packs[i]);
    return s;
  }
  if (!b) memset(p->in_bias, 0, (size_t)(3 * E) * sizeof(float));
  grove__linear_pack_free(p->in_pack);
  p->in_pack = packs[0];
  for (int i = 0; i < 3; i++) {
    grove__linear_pack_free(p->qkv[i]);
    p->qkv[i] = packs[i + 1];
  }
  return GROVE_OK;
}

void grove__mha_next_call(grove_fwd *f, const grove_module *m, bool need_weights, bool average) {
  f->mha.m = m;
  f->mha.need_weights = need_weights;
  f->mha.average = average;
}

/* ------------------------------------------------------------ attention core */

/* Heads of up to 64 keys and 128 dims (every transformer of this size class)
 * run an AVX-512 kernel where the CPU has it: a score row and an output row
 * live in registers over their whole reduction.  The build's baseline is
 * SSE2, so the portable loops below run 4 floats at a time and spill their
 * accumulators to memory on every step. */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define ATT_HAVE_AVX512 1
#include <immintrin.h>
#else
#define ATT_HAVE_AVX512 0
#endif

/* grove__cpu_avx512 (cpu.c): GROVE_GEMM=avx2 turns this path off too. */
static bool att_avx512(void) {
#if ATT_HAVE_AVX512
  return grove__cpu_avx512();
#else
  return false;
#endif
}

#if ATT_HAVE_AVX512
GROVE__TARGET_PUSH("avx512f")

static inline __mmask16 tail_mask(int64_t left) {
  return left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1u);
}

/* sc[l][s] = scale * q[l] . kt[:, s] for S <= 64 (kt is [d, S]).  Rows go
 * four at a time so that four independent accumulator chains hide the FMA
 * latency. */
static void scores_avx512(const float *q, int64_t rsq, const float *kt, int64_t L, int64_t S,
                          int64_t d, float scale, float *sc) {
  const int nv = (int)((S + 15) / 16);
  __mmask16 m[4];
  for (int j = 0; j < 4; j++) m[j] = j < nv ? tail_mask(S - 16 * j) : 0;
  int64_t l = 0;
  for (; l + 4 <= L; l += 4) {
    for (int j = 0; j < nv; j++) {
      __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
      const float *q0 = q + l * rsq;
      for (int64_t t = 0; t < d; t++) {
        const __m512 kv = _mm512_maskz_loadu_ps(m[j], kt + t * S + 16 * j);
        a0 = _mm512_fmadd_ps(_mm512_set1_ps(q0[t]), kv, a0);
        a1 = _mm512_fmadd_ps(_mm512_set1_ps(q0[rsq + t]), kv, a1);
        a2 = _mm512_fmadd_ps(_mm512_set1_ps(q0[2 * rsq + t]), kv, a2);
        a3 = _mm512_fmadd_ps(_mm512_set1_ps(q0[3 * rsq + t]), kv, a3);
      }
      const __m512 sv = _mm512_set1_ps(scale);
      float *out = sc + l * S + 16 * j;
      _mm512_mask_storeu_ps(out, m[j], _mm512_mul_ps(a0, sv));
      _mm512_mask_storeu_ps(out + S, m[j], _mm512_mul_ps(a1, sv));
      _mm512_mask_storeu_ps(out + 2 * S, m[j], _mm512_mul_ps(a2, sv));
      _mm512_mask_storeu_ps(out + 3 * S, m[j], _mm512_mul_ps(a3, sv));
    }
  }
  for (; l < L; l++) {
    for (int j = 0; j < nv; j++) {
      __m512 a0 = _mm512_setzero_ps();
      const float *ql = q + l * rsq;
      for (int64_t t = 0; t < d; t++)
        a0 = _mm512_fmadd_ps(_mm512_set1_ps(ql[t]),
                             _mm512_maskz_loadu_ps(m[j], kt + t * S + 16 * j), a0);
      _mm512_mask_storeu_ps(sc + l * S + 16 * j, m[j], _mm512_mul_ps(a0, _mm512_set1_ps(scale)));
    }
  }
}

/* o[l] = sum_s p[l][s] v[s] for d <= 128, four rows at a time. */
static void mix_avx512(const float *p, const float *v, int64_t rsv, float *o, int64_t rso,
                       int64_t L, int64_t S, int64_t d) {
  const int nv = (int)((d + 15) / 16);
  __mmask16 m[8];
  for (int j = 0; j < 8; j++) m[j] = j < nv ? tail_mask(d - 16 * j) : 0;
  int64_t l = 0;
  for (; l + 4 <= L; l += 4) {
    for (int j = 0; j < nv; j++) {
      __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
      const float *p0 = p + l * S;
      for (int64_t s = 0; s < S; s++) {
        const __m512 vv = _mm512_maskz_loadu_ps(m[j], v + s * rsv + 16 * j);
        a0 = _mm512_fmadd_ps(_mm512_set1_ps(p0[s]), vv, a0);
        a1 = _mm512_fmadd_ps(_mm512_set1_ps(p0[S + s]), vv, a1);
        a2 = _mm512_fmadd_ps(_mm512_set1_ps(p0[2 * S + s]), vv, a2);
        a3 = _mm512_fmadd_ps(_mm512_set1_ps(p0[3 * S + s]), vv, a3);
      }
      float *out = o + l * rso + 16 * j;
      _mm512_mask_storeu_ps(out, m[j], a0);
      _mm512_mask_storeu_ps(out + rso, m[j], a1);
      _mm512_mask_storeu_ps(out + 2 * rso, m[j], a2);
      _mm512_mask_storeu_ps(out + 3 * rso, m[j], a3);
    }
  }
  for (; l < L; l++) {
    for (int j = 0; j < nv; j++) {
      __m512 a0 = _mm512_setzero_ps();
      for (int64_t s = 0; s < S; s++)
        a0 = _mm512_fmadd_ps(_mm512_set1_ps(p[l * S + s]),
                             _mm512_maskz_loadu_ps(m[j], v + s * rsv + 16 * j), a0);
      _mm512_mask_storeu_ps(o + l * rso + 16 * j, m[j], a0);
    }
  }
}

/* exp(x) for 16 lanes (Cephes' expf: x = n ln2 + r, |r| <= ln2 / 2,
 * exp(r) by a degree-7 polynomial, times 2^n), within 2 ulp. */
static inline __m512 exp512(__m512 x) {
  x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(88.3762626647949f)),
                    _mm512_set1_ps(-88.3762626647949f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500E-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507E-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073E-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894E-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459E-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201E-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_scalef_ps(p, n);
}

/* Softmax of L rows of S <= 64 floats in place: max-subtracted, summed in
 * float over at most 64 terms. */
static void softmax_rows_avx512(float *sc, int64_t L, int64_t S) {
  const int nv = (int)((S + 15) / 16);
  __mmask16 m[4];
  for (int j = 0; j < 4; j++) m[j] = j < nv ? tail_mask(S - 16 * j) : 0;
  for (int64_t l = 0; l < L; l++) {
    float *row = sc + l * S;
    __m512 v[4];
    __m512 mx = _mm512_set1_ps(-INFINITY);
    for (int j = 0; j < nv; j++) {
      v[j] = _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), m[j], row + 16 * j);
      mx = _mm512_max_ps(mx, v[j]);
    }
    const __m512 mv = _mm512_set1_ps(_mm512_reduce_max_ps(mx));
    __m512 sum = _mm512_setzero_ps();
    for (int j = 0; j < nv; j++) {
      v[j] = _mm512_maskz_mov_ps(m[j], exp512(_mm512_sub_ps(v[j], mv)));
      sum = _mm512_add_ps(sum, v[j]);
    }
    const __m512 inv = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(sum));
    for (int j = 0; j < nv; j++)
      _mm512_mask_storeu_ps(row + 16 * j, m[j], _mm512_mul_ps(v[j], inv));
  }
}

GROVE__TARGET_POP
#endif /* ATT_HAVE_AVX512 */

/* One head of one batch item: o[l] = softmax(scale * q[l] . k^T) . v, rows
 * of q, k, v and o rs* floats apart; sc is [L, S] scratch that ends up
 * holding the probabilities and kt [d, S] scratch.  Large heads go to
 * sgemm; small ones (the common case: a few dozen tokens) run loops that
 * vectorise along S and d: k is transposed once so that every inner loop is
 * a contiguous multiply-add. */
static void attend(const float *q, int64_t rsq, const float *k, int64_t rsk, const float *v,
                   int64_t rsv, float *o, int64_t rso, int64_t L, int64_t S, int64_t d, float scale,
                   float *restrict sc, float *restrict kt) {
  const bool big = L * S * d >= (1 << 15);
  bool fast = false; /* the AVX-512 kernels: S <= 64, d <= 128 */
#if ATT_HAVE_AVX512
  fast = S <= 64 && d <= 128 && att_avx512();
#endif
  if (big) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (blasint)L, (blasint)S, (blasint)d, scale,
                q, (blasint)rsq, k, (blasint)rsk, 0.0f, sc, (blasint)S);
  } else if (fast) {
#if ATT_HAVE_AVX512
    grove__transpose_f32_ld(k, rsk, kt, S, S, d); /* kt[t][s] = k[s][t] */
    scores_avx512(q, rsq, kt, L, S, d, scale, sc);
#endif
  } else {
    grove__transpose_f32_ld(k, rsk, kt, S, S, d);
    for (int64_t l = 0; l < L; l++) {
      const float *ql = q + l * rsq;
      float *restrict row = sc + l * S;
      for (int64_t s = 0; s < S; s++) row[s] = 0.0f;
      for (int64_t t = 0; t < d; t++) {
        const float qv = ql[t] * scale;
        const float *restrict kr = kt + t * S;
        for (int64_t s = 0; s < S; s++) row[s] += qv * kr[s];
      }
    }
  }
  if (fast) {
#if ATT_HAVE_AVX512
    softmax_rows_avx512(sc, L, S);
#endif
  } else {
    for (int64_t l = 0; l < L; l++) {
      float *row = sc + l * S;
      float mx = -INFINITY;
      for (int64_t s = 0; s < S; s++) mx = row[s] > mx ? row[s] : mx;
      double sum = 0;
      for (int64_t s = 0; s < S; s++) {
        row[s] = expf(row[s] - mx);
        sum += row[s];
      }
      const float inv = (float)(1.0 / sum);
      for (int64_t s = 0; s < S; s++) row[s] *= inv;
    }
  }
  if (big) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (blasint)L, (blasint)d, (blasint)S, 1.0f,
                sc, (blasint)S, v, (blasint)rsv, 0.0f, o, (blasint)rso);
    return;
  }
  if (fast) {
#if ATT_HAVE_AVX512
    mix_avx512(sc, v, rsv, o, rso, L, S, d);
#endif
    return;
  }
  for (int64_t l = 0; l < L; l++) {
    float *restrict ol = o + l * rso;
    const float *row = sc + l * S;
    for (int64_t t = 0; t < d; t++) ol[t] = 0;
    for (int64_t s = 0; s < S; s++) {
      const float pv = row[s];
      const float *restrict vs = v + s * rsv;
      for (int64_t t = 0; t < d; t++) ol[t] += pv * vs[t];
    }
  }
}

static grove_status contig(grove_fwd *f, const grove_tensor *t, grove_tensor *out) {
  if (t->dtype != GROVE_F32)
    return grove_err_set(f->err, GROVE_E_DTYPE,
                         "MultiheadAttention: expected float32 inputs, got %s",
                         grove_dtype_name(t->dtype));
  return grove__contig_f32(f, t, out);
}

static grove_status mha_run(const grove_module *m, grove_fwd *f, const grove_tensor *q0,
                            const grove_tensor *k0, const grove_tensor *v0, bool need_weights,
                            bool average, grove_values *out) {
  const mha_impl *p = m->impl;
  const char *T = "MultiheadAttention";
  const int64_t E = p->E, H = p->H, d = p->d;
  const bool self_attn = q0->data == k0->data && k0->data == v0->data &&
                         grove_tensor_same_shape(q0, k0) && grove_tensor_same_shape(k0, v0) &&
                         memcmp(q0->strides, k0->strides, sizeof q0->strides) == 0 &&
                         memcmp(k0->strides, v0->strides, sizeof k0->strides) == 0;
  grove_tensor q, k, v;
  grove_status s;
  if ((s = contig(f, q0, &q))) return s;
  if (self_attn) {
    k = v = q;
  } else if ((s = contig(f, k0, &k)) || (s = contig(f, v0, &v))) {
    return s;
  }
  const bool batched = q.ndim == 3;
  char a[128], b[128], c[128];
  if ((q.ndim != 3 && q.ndim != 2) || k.ndim != q.ndim || v.ndim != q.ndim ||
      q.shape[q.ndim - 1] != E || k.shape[k.ndim - 1] != E || v.shape[v.ndim - 1] != E ||
      !grove_tensor_same_shape(&k, &v) ||
      (batched && (p->batch_first ? (k.shape[0] != q.shape[0]) : (k.shape[1] != q.shape[1]))))
    return grove_err_set(f->err, GROVE_E_SHAPE,
                         "MultiheadAttention: query %s, key %s and value %s do not fit: expected "
                         "%s with embed_dim %lld (key and value of one shape, one batch size)",
                         grove_shape_str(q.ndim, q.shape, a, sizeof a),
                         grove_shape_str(k.ndim, k.shape, b, sizeof b),
                         grove_shape_str(v.ndim, v.shape, c, sizeof c),
                         p->batch_first ? "[N, L, E] or [L, E]" : "[L, N, E] or [L, E]",
                         (long long)E);
  const bool bf = batched && p->batch_first;
  const int64_t N = batched ? (bf ? q.shape[0] : q.shape[1]) : 1;
  const int64_t L = batched ? (bf ? q.shape[1] : q.shape[0]) : q.shape[0];
  const int64_t S = batched ? (bf ? k.shape[1] : k.shape[0]) : k.shape[0];
  const int64_t rq = N * L, rk = N * S;

  /* Projections: rows in the input's own order.  The packs exist once the
   * module is refreshed (never before a deferred build is loaded). */
  assert(p->in_pack && p->qkv[0]);
  const float *Q, *K, *V;
  int64_t ldq, ldk, ldv;
  if (self_attn) {
    float *qkv = grove_arena_alloc(f->arena, (size_t)(rq * 3 * E) * sizeof(float) + 1);
    if (!qkv) return scratch(f, T);
    if (rq) grove__linear_run(p->in_pack, q.data, rq, p->in_bias, qkv, GROVE__ACT_NONE);
    Q = qkv;
    K = qkv + E;
    V = qkv + 2 * E;
    ldq = ldk = ldv = 3 * E;
  } else {
    float *pq = grove_arena_alloc(f->arena, (size_t)(rq * E) * sizeof(float) + 1);
    float *pk = grove_arena_alloc(f->arena, (size_t)(rk * E) * sizeof(float) + 1);
    float *pv = grove_arena_alloc(f->arena, (size_t)(rk * E) * sizeof(float) + 1);
    if (!pq || !pk || !pv) return scratch(f, T);
    if (rq) grove__linear_run(p->qkv[0], q.data, rq, p->in_bias, pq, GROVE__ACT_NONE);
    if (rk) grove__linear_run(p->qkv[1], k.data, rk, p->in_bias + E, pk, GROVE__ACT_NONE);
    if (rk) grove__linear_run(p->qkv[2], v.data, rk, p->in_bias + 2 * E, pv, GROVE__ACT_NONE);
    Q = pq;
    K = pk;
    V = pv;
    ldq = ldk = ldv = E;
  }
  float *ctx = grove_arena_alloc(f->arena, (size_t)(rq * E) * sizeof(float) + 1);
  float *sc = grove_arena_alloc(f->arena, (size_t)(L * S) * sizeof(float) + 1);
  float *kt = grove_arena_alloc(f->arena, (size_t)(d * S) * sizeof(float) + 1);
  if (!ctx || !sc || !kt) return scratch(f, T);

  /* Attention weights: [N, L, S] averaged, [N, H, L, S] per head (unbatched:
   * without N). */
  grove_tensor wt = {0};
  float *wd = NULL;
  if (need_weights) {
    int64_t ws[4];
    int wn = 0;
    if (batched) ws[wn++] = N;
    if (!average) ws[wn++] = H;
    ws[wn++] = L;
    ws[wn++] = S;
    if ((s = grove_fwd_alloc(f, &wt, GROVE_F32, wn, ws))) return s;
    wd = wt.data;
    if (average) memset(wd, 0, (size_t)(N * L * S) * sizeof(float));
  }
  const float scale = (float)(1.0 / sqrt((double)d));
  /* Batch n's row l is row n*L + l (batch_first) or l*N + n. */
  const int64_t qstep = bf ? 1 : N, kstep = bf ? 1 : N;
  for (int64_t n = 0; n < N && L > 0; n++) {
    const int64_t q0r = bf ? n * L : n, k0r = bf ? n * S : n;
    for (int64_t h = 0; h < H; h++) {
      float *probs = (need_weights && !average) ? wd + ((n * H + h) * L) * S : sc;
      if (S == 0) {
        for (int64_t l = 0; l < L; l++)
          memset(ctx + (q0r + l * qstep) * E + h * d, 0, (size_t)d * sizeof(float));
        continue;
      }
      attend(Q + q0r * ldq + h * d, qstep * ldq, K + k0r * ldk + h * d, kstep * ldk,
             V + k0r * ldv + h * d, kstep * ldv, ctx + q0r * E + h * d, qstep * E, L, S, d, scale,
             probs, kt);
      if (need_weights && average) {
        float *w = wd + n * L * S;
        for (int64_t i = 0; i < L * S; i++) w[i] += probs[i];
      }
    }
    if (need_weights && average) {
      float *w = wd + n * L * S;
      const float inv = 1.0f / (float)H;
      for (int64_t i = 0; i < L * S; i++) w[i] *= inv;
    }
  }
  /* out_proj, called as torch does: with its weights, not as a module (its
   * hooks do not fire in torch either). */
  const grove_module *op = grove_module_child(m, "out_proj");
  if (!op || op->type != &grove__linear_type)
    return grove_err_set(f->err, GROVE_E_INTERNAL, "MultiheadAttention: out_proj is not a Linear");
  grove_values pin = {.n = 1}, pout = {0};
  int64_t cs[2] = {rq, E};
  grove_tensor_init(&pin.v[0], GROVE_F32, 2, cs, ctx);
  if ((s = grove__linear_forward_act(op, f, &pin, &pout, GROVE__ACT_NONE))) return s;
  grove_tensor y = pout.v[0];
  y.ndim = q.ndim;
  memcpy(y.shape, q.shape, sizeof y.shape);
  grove_contiguous_strides(y.ndim, y.shape, y.strides);
  out->n = need_weights ? 2 : 1;
  out->v[0] = y;
  if (need_weights) out->v[1] = wt;
  return GROVE_OK;
}

bool grove__mha_packed(const grove_module *m) {
  const mha_impl *p = m->impl;
  return p->in_pack != NULL && p->qkv[0] != NULL;
}

static grove_status mha_forward(const grove_module *m, grove_fwd *f, const grove_values *in,
                                grove_values *out) {
  bool need = true, avg = true;
  if (f->mha.m == m) {
    need = f->mha.need_weights;
    avg = f->mha.average;
    f->mha.m = NULL;
  }
  if (in->n != 1 && in->n != 3)
    return grove_err_set(f->err, GROVE_E_INVALID_ARGUMENT,
                         "MultiheadAttention: expected query, key and value (3 tensors), got %d",
                         in->n);
  const grove_tensor *q = &in->v[0];
  const grove_tensor *k = in->n == 3 ? &in->v[1] : q, *v = in->n == 3 ? &in->v[2] : q;
  return mha_run(m, f, q, k, v, need, avg, out);
}

const grove_module_type grove__mha_type = {
    .name = "MultiheadAttention",
    .forward = mha_forward,
    .refresh = mha_refresh,
    .free_impl = mha_free_impl,
};

grove_status grove_multihead_attention_new(int64_t embed_dim, int64_t num_heads, bool bias,
                                           bool batch_first, grove_module **out, grove_err *err) {
  *out = NULL;
  const char *T = "MultiheadAttention";
  if (embed_dim <= 0 || num_heads <= 0 || embed_dim > (1 << 16))
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT,
                         "%s: embed_dim and num_heads must be positive (embed_dim at most 65536), "
                         "got %lld and %lld",
                         T, (long long)embed_dim, (long long)num_heads);
  if (embed_dim % num_heads)
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT,
                         "%s: embed_dim must be divisible by num_heads", T);
  const int64_t E = embed_dim;
  mha_impl *p = calloc(1, sizeof *p + (size_t)(3 * E) * sizeof(float));
  if (!p) return grove_err_set(err, GROVE_E_NOMEM, "%s: out of memory", T);
  p->E = E;
  p->H = num_heads;
  p->d = E / num_heads;
  p->bias = bias;
  p->batch_first = batch_first;
  grove_module *m = NULL;
  grove_status s = grove__layer_make(&grove__mha_type, p, &m, err);
  if (s) return s;
  int64_t ws[2] = {3 * E, E}, bs = 3 * E;
  grove_tensor *w = grove_tensor_new(GROVE_F32, 2, ws, err);
  grove_tensor *b = bias ? grove_tensor_new(GROVE_F32, 1, &bs, err) : NULL;
  if (!w || (bias && !b)) s = err && err->code ? err->code : GROVE_E_NOMEM;
  /* torch's registration order, the unused separate weights as None. */
  if (!s) s = grove_module_register_parameter(m, "in_proj_weight", w, err);
  if (!s) s = grove_module_register_parameter(m, "q_proj_weight", NULL, err);
  if (!s) s = grove_module_register_parameter(m, "k_proj_weight", NULL, err);
  if (!s) s = grove_module_register_parameter(m, "v_proj_weight", NULL, err);
  if (!s) s = grove_module_register_parameter(m, "in_proj_bias", b, err);
  grove_tensor_release(w);
  grove_tensor_release(b);
  grove_module *op = NULL;
  if (!s) s = add_child(m, "out_proj", grove_linear_new(E, E, bias, &op, err), &op, err);
  /* Packs the zero in_proj_weight, unless the tree is built for a load
   * (module_module_internal.h, "deferred refresh"). */
  if (!s) s = grove__refresh_new(m, err);
  if (s) {
    grove_module_release(m);
    return s;
  }
  *out = m;
  return GROVE_OK;
}

grove_status grove__multihead_attention_from_json(const json_t *obj, const char *path,
                                                  grove_module **out, grove_err *err) {
  static const char *const keys[] = {
      "embed_dim",     "num_heads", "dropout", "bias",        "add_bias_kv",
      "add_zero_attn", "kdim",      "vdim",    "batch_first", NULL};
  const char *T = "MultiheadAttention";
  int64_t E, H, kd, vd;
  bool kd_null, vd_null, bias, bkv, zero, bf;
  double dropout;
  grove_status s = grove__json_check_keys(obj, path, T, keys, err);
  if (!s) s = grove__json_int(obj, path, T, "embed_dim", true, 0, 1, 1 << 16, &E, err);
  if (!s) s = grove__json_int(obj, path, T, "num_heads", true, 0, 1, 1 << 16, &H, err);
  if (!s) s = grove__json_number(obj, path, T, "dropout", 0.0, 0.0, 1.0, &dropout, err);
  if (!s) s = grove__json_bool(obj, path, T, "bias", true, &bias, err);
  if (!s) s = grove__json_bool(obj, path, T, "add_bias_kv", false, &bkv, err);
  if (!s) s = grove__json_bool(obj, path, T, "add_zero_attn", false, &zero, err);
  if (!s)
    s = grove__json_int_or_null(obj, path, T, "kdim", true, 0, 1, 1 << 16, &kd, &kd_null, err);
  if (!s)
    s = grove__json_int_or_null(obj, path, T, "vdim", true, 0, 1, 1 << 16, &vd, &vd_null, err);
  if (!s) s = grove__json_bool(obj, path, T, "batch_first", false, &bf, err);
  if (s) return s;
  if (bkv)
    return grove__json_unsupported(path, "add_bias_kv", "add_bias_kv=True is not supported", err);
  if (zero)
    return grove__json_unsupported(path, "add_zero_attn", "add_zero_attn=True is not supported",
                                   err);
  if ((!kd_null && kd != E) || (!vd_null && vd != E))
    return grove__json_unsupported(path, kd_null || kd == E ? "vdim" : "kdim",
                                   "kdim and vdim other than embed_dim (separate q/k/v "
                                   "projection weights) are not supported",
                                   err);
  if (E % H)
    return grove_err_set(err, GROVE_E_SPEC,
                         "%s.num_heads: embed_dim (%lld) must be divisible by num_heads (%lld)",
                         path, (long long)E, (long long)H);
  return grove__json_built(path, grove_multihead_attention_new(E, H, bias, bf, out, err), err);
}

/* ============================================================ TransformerEncoderLayer */

typedef struct tel_impl {
  grove_encoder_layer_opts o;
  bool gelu;
} tel_impl;

void grove__tel_settings(const grove_module *m, grove__layer_settings *s) {
  const tel_impl *p = m->impl;
  s->embed_dim = p->o.d_model;
  s->num_heads = p->o.nhead;
  s->dim_feedforward = p->o.dim_feedforward;
  s->p = p->o.dropout;
  s->gelu_ff = p->gelu;
  s->ln_eps = p->o.layer_norm_eps;
  s->batch_first = p->o.batch_first;
  s->norm_first = p->o.norm_first;
}

static grove_status call(const grove_module *m, const char *child, grove_fwd *f,
                         const grove_tensor *x, grove_tensor *y) {
  const grove_module *c = grove_module_child(m, child);
  if (!c)
    return grove_err_set(f->err, GROVE_E_INTERNAL, "%s: child %s is missing", m->type->name, child);
  return grove_module_call(c, f, x, y);
}

/* y += x elementwise (same shape, both contiguous float32). */
static void add_into(grove_tensor *y, const grove_tensor *x) {
  float *restrict a = y->data;
  const float *restrict b = x->data;
  for (int64_t i = 0, n = grove_tensor_numel(y); i < n; i++) a[i] += b[i];
}

static grove_status sa_block(const grove_module *m, grove_fwd *f, const grove_tensor *x,
                             grove_tensor *y) {
  const grove_module *sa = grove_module_child(m, "self_attn");
  grove_values in = {.n = 3}, out = {0};
  in.v[0] = in.v[1] = in.v[2] = *x;
  grove__mha_next_call(f, sa, false, true);
  grove_status s = grove_module_forward(sa, f, &in, &out);
  grove__mha_next_call(f, NULL, true, true);
  if (s) return s;
  return call(m, "dropout1", f, &out.v[0], y);
}

static grove_status ff_block(const grove_module *m, grove_fwd *f, const tel_impl *p,
                             const grove_tensor *x, grove_tensor *y) {
  const grove_module *l1 = grove_module_child(m, "linear1");
  grove_values in = {.n = 1}, out = {0};
  in.v[0] = *x;
  grove_status s;
  grove_tensor h;
  if (!p->gelu && grove__no_forward_hooks() && !grove__observes(f, l1)) {
    if ((s = grove__linear_forward_act(l1, f, &in, &out, GROVE__ACT_RELU))) return s;
    h = out.v[0];
  } else {
    if ((s = grove_module_call(l1, f, x, &h))) return s;
    if (h.dtype != GROVE_F32 || !grove_tensor_is_contiguous(&h))
      return grove_err_set(f->err, GROVE_E_INTERNAL, "linear1 returned a strided tensor");
    float *restrict a = h.data;
    const int64_t n = grove_tensor_numel(&h);
    if (p->gelu) {
      const float r = 0.7071067811865476f;
      for (int64_t i = 0; i < n; i++) a[i] = 0.5f * a[i] * (1.0f + erff(a[i] * r));
    } else {
      for (int64_t i = 0; i < n; i++) a[i] = a[i] < 0.0f ? 0.0f : a[i];
    }
  }
  grove_tensor d, l2;
  if ((s = call(m, "dropout", f, &h, &d)) || (s = call(m, "linear2", f, &d, &l2))) return s;
  return call(m, "dropout2", f, &l2, y);
}

/* Residual: r = a + b into b's memory when b is ours (a fresh, contiguous
 * result), else into a new tensor. */
static grove_status residual(grove_fwd *f, const grove_tensor *a, grove_tensor *b,
                             grove_tensor *r) {
  if (!grove_tensor_same_shape(a, b) || a->dtype != GROVE_F32 || b->dtype != GROVE_F32)
    return grove_err_set(f->err, GROVE_E_SHAPE,
                         "TransformerEncoderLayer: a sublayer changed the shape");
  if (grove_tensor_is_contiguous(b) && b->data != a->data) {
    add_into(b, a);
    *r = *b;
    return GROVE_OK;
  }
  return grove__op_binary(f, GROVE__BIN_ADD, a, b, 1.0, r, NULL);
}

static grove_status tel_forward(const grove_module *m, grove_fwd *f, const grove_values *in,
                                grove_values *out) {
  const tel_impl *p = m->impl;
  const char *T = "TransformerEncoderLayer";
  if (in->n != 1)
    return grove_err_set(f->err, GROVE_E_INVALID_ARGUMENT,
                         "%s: expected 1 input tensor (src), got %d", T, in->n);
  grove_tensor x;
  grove_status s = grove__layer_input(T, f, in, GROVE_F32, &x);
  if (s) return s;
  if ((x.ndim != 2 && x.ndim != 3) || x.shape[x.ndim - 1] != p->o.d_model) {
    char got[128];
    return grove_err_set(
        f->err, GROVE_E_SHAPE, "%s: expected src of shape %s with d_model %lld, got %s", T,
        p->o.batch_first ? "[N, S, E] or [S, E]" : "[S, N, E] or [S, E]", (long long)p->o.d_model,
        grove_shape_str(x.ndim, x.shape, got, sizeof got));
  }
  grove_tensor t1, t2, x1, y;
  if (p->o.norm_first) {
    if ((s = call(m, "norm1", f, &x, &t1)) || (s = sa_block(m, f, &t1, &t2)) ||
        (s = residual(f, &x, &t2, &x1)) || (s = call(m, "norm2", f, &x1, &t1)) ||
        (s = ff_block(m, f, p, &t1, &t2)) || (s = residual(f, &x1, &t2, &y)))
      return s;
  } else {
    if ((s = sa_block(m, f, &x, &t1)) || (s = residual(f, &x, &t1, &t2)) ||
        (s = call(m, "norm1", f, &t2, &x1)) || (s = ff_block(m, f, p, &x1, &t1)) ||
        (s = residual(f, &x1, &t1, &t2)) || (s = call(m, "norm2", f, &t2, &y)))
      return s;
  }
  out->n = 1;
  out->v[0] = y;
  return GROVE_OK;
}

const grove_module_type grove__tel_type = {
    .name = "TransformerEncoderLayer",
    .forward = tel_forward,
};

grove_status grove_transformer_encoder_layer_new(const grove_encoder_layer_opts *o,
                                                 grove_module **out, grove_err *err) {
  *out = NULL;
  const char *T = "TransformerEncoderLayer";
  if (!o || o->d_model <= 0 || o->nhead <= 0 || o->dim_feedforward <= 0)
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT,
                         "%s: d_model, nhead and dim_feedforward must be positive", T);
  if (o->d_model % o->nhead)
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT, "%s: d_model must be divisible by nhead",
                         T);
  bool gelu = false;
  if (o->activation && strcmp(o->activation, "gelu") == 0)
    gelu = true;
  else if (o->activation && strcmp(o->activation, "relu") != 0)
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT,
                         "%s: activation should be relu/gelu, not %s", T, o->activation);
  if (!(o->dropout >= 0.0 && o->dropout <= 1.0) || !(o->layer_norm_eps >= 0.0) ||
      isinf(o->layer_norm_eps))
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT,
                         "%s: dropout must be in [0, 1] and layer_norm_eps finite and >= 0", T);
  tel_impl *p = calloc(1, sizeof *p);
  if (!p) return grove_err_set(err, GROVE_E_NOMEM, "%s: out of memory", T);
  p->o = *o;
  p->o.activation = gelu ? "gelu" : "relu"; /* static strings: the caller's may go away */
  p->gelu = gelu;
  grove_module *m = NULL;
  grove_status s = grove__layer_make(&grove__tel_type, p, &m, err);
  if (s) return s;
  const int64_t E = o->d_model;
  grove_module *c = NULL;
  s = add_child(m, "self_attn",
                grove_multihead_attention_new(E, o->nhead, true, o->batch_first, &c, err), &c, err);
  if (!s)
    s = add_child(m, "linear1", grove_linear_new(E, o->dim_feedforward, true, &c, err), &c, err);
  if (!s) s = add_child(m, "dropout", grove_dropout_new(o->dropout, &c, err), &c, err);
  if (!s)
    s = add_child(m, "linear2", grove_linear_new(o->dim_feedforward, E, true, &c, err), &c, err);
  if (!s)
    s = add_child(m, "norm1", grove_layer_norm_new(1, &E, o->layer_norm_eps, true, &c, err), &c,
                  err);
  if (!s)
    s = add_child(m, "norm2", grove_layer_norm_new(1, &E, o->layer_norm_eps, true, &c, err), &c,
                  err);
  if (!s) s = add_child(m, "dropout1", grove_dropout_new(o->dropout, &c, err), &c, err);
  if (!s) s = add_child(m, "dropout2", grove_dropout_new(o->dropout, &c, err), &c, err);
  if (s) {
    grove_module_release(m);
    return s;
  }
  *out = m;
  return GROVE_OK;
}

static grove_status tel_opts_from_json(const json_t *obj, const char *path,
                                       grove_encoder_layer_opts *o, grove_err *err) {
  static const char *const keys[] = {
      "d_model",        "nhead",       "dim_feedforward", "dropout", "activation",
      "layer_norm_eps", "batch_first", "norm_first",      "bias",    NULL};
  static const char *const acts[] = {"relu", "gelu", NULL};
  const char *T = "TransformerEncoderLayer";
  int act = 0;
  bool bias;
  grove_status s = grove__json_check_keys(obj, path, T, keys, err);
  if (!s) s = grove__json_int(obj, path, T, "d_model", true, 0, 1, 1 << 16, &o->d_model, err);
  if (!s) s = grove__json_int(obj, path, T, "nhead", true, 0, 1, 1 << 16, &o->nhead, err);
  if (!s)
    s = grove__json_int(obj, path, T, "dim_feedforward", false, 2048, 1, 1 << 20,
                        &o->dim_feedforward, err);
  if (!s) s = grove__json_number(obj, path, T, "dropout", 0.1, 0.0, 1.0, &o->dropout, err);
  if (!s) s = grove__json_choice(obj, path, T, "activation", 0, acts, &act, err);
  if (!s)
    s = grove__json_number(obj, path, T, "layer_norm_eps", 1e-5, 0.0, INFINITY, &o->layer_norm_eps,
                           err);
  if (!s) s = grove__json_bool(obj, path, T, "batch_first", false, &o->batch_first, err);
  if (!s) s = grove__json_bool(obj, path, T, "norm_first", false, &o->norm_first, err);
  if (!s) s = grove__json_bool(obj, path, T, "bias", true, &bias, err);
  if (s) return s;
  if (!bias)
    return grove__json_unsupported(path, "bias", "bias=False (torch >= 2.1) is not supported", err);
  o->activation = acts[act];
  if (o->d_model % o->nhead)
    return grove_err_set(err, GROVE_E_SPEC,
                         "%s.nhead: d_model (%lld) must be divisible by nhead (%lld)", path,
                         (long long)o->d_model, (long long)o->nhead);
  return GROVE_OK;
}

grove_status grove__transformer_encoder_layer_from_json(const json_t *obj, const char *path,
                                                        grove_module **out, grove_err *err) {
  grove_encoder_layer_opts o = {0};
  grove_status s = tel_opts_from_json(obj, path, &o, err);
  return s ? s : grove__json_built(path, grove_transformer_encoder_layer_new(&o, out, err), err);
}

/* ============================================================ TransformerEncoder */

static grove_status te_forward(const grove_module *m, grove_fwd *f, const grove_values *in,
                               grove_values *out) {
  if (in->n != 1)
    return grove_err_set(f->err, GROVE_E_INVALID_ARGUMENT,
                         "TransformerEncoder: expected 1 input tensor (src), got %d", in->n);
  const grove_module *layers = grove_module_child(m, "layers");
  const grove_module *norm = grove_module_child(m, "norm");
  grove_tensor x = in->v[0];
  grove_arena_mark m0 = grove_arena_mark_get(f->arena);
  for (size_t i = 0; layers && i < layers->nchildren; i++) {
    grove_tensor y;
    grove_status s = grove_module_call(layers->children[i].module, f, &x, &y);
    if (s) return s;
    /* Everything but y is scratch now: give it back (x included, when it
     * was the previous layer's output). */
    grove__keep k = {y.data, grove__tensor_extent(&y), NULL, {0}};
    if (k.bytes > 0) {
      if ((s = grove__arena_keep(f->arena, m0, &k, 1, f->err))) return s;
      y.data = k.moved;
    }
    x = y;
  }
  if (norm) {
    grove_tensor y;
    grove_status s = grove_module_call(norm, f, &x, &y);
    if (s) return s;
    x = y;
  }
  out->n = 1;
  out->v[0] = x;
  return GROVE_OK;
}

const grove_module_type grove__te_type = {
    .name = "TransformerEncoder",
    .forward = te_forward,
};

grove_status grove_transformer_encoder_new(const grove_encoder_layer_opts *layer,
                                           int64_t num_layers, grove_module *norm,
                                           grove_module **out, grove_err *err) {
  *out = NULL;
  if (num_layers < 0 || num_layers > 4096)
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT,
                         "TransformerEncoder: num_layers must be in [0, 4096], got %lld",
                         (long long)num_layers);
  grove_module *m = NULL;
  grove_status s = grove__layer_make(&grove__te_type, NULL, &m, err);
  if (s) return s;
  grove_module *list = NULL;
  s = grove_module_list_new(&list, err);
  for (int64_t i = 0; !s && i < num_layers; i++) {
    grove_module *l = NULL;
    char name[32];
    snprintf(name, sizeof name, "%lld", (long long)i);
    s = add_child(list, name, grove_transformer_encoder_layer_new(layer, &l, err), &l, err);
  }
  if (!s) {
    s = grove_module_add_module(m, "layers", list, err);
  }
  grove_module_release(list);
  if (!s && norm) s = grove_module_add_module(m, "norm", norm, err);
  if (s) {
    grove_module_release(m);
    return s;
  }
  *out = m;
  return GROVE_OK;
}

grove_status grove__transformer_encoder_from_json(const json_t *obj, const char *path,
                                                  grove_module **out, grove_err *err) {
  static const char *const keys[] = {"encoder_layer",        "num_layers", "norm",
                                     "enable_nested_tensor", "mask_check", NULL};
  const char *T = "TransformerEncoder";
  int64_t nl;
  bool nested, mask_check;
  grove_status s = grove__json_check_keys(obj, path, T, keys, err);
  if (!s) s = grove__json_int(obj, path, T, "num_layers", true, 0, 0, 4096, &nl, err);
  if (!s) s = grove__json_bool(obj, path, T, "enable_nested_tensor", true, &nested, err);
  if (!s) s = grove__json_bool(obj, path, T, "mask_check", true, &mask_check, err);
  if (s) return s;
  const json_t *el = json_object_get(obj, "encoder_layer"), *nv = json_object_get(obj, "norm");
  char sub[1024];
  snprintf(sub, sizeof sub, "%s.encoder_layer", path);
  if (!json_is_object(el) || !json_is_string(json_object_get(el, "type")) ||
      strcmp(json_string_value(json_object_get(el, "type")), "TransformerEncoderLayer") != 0)
    return grove_err_set(err, GROVE_E_SPEC,
                         "%s: expected a {\"type\": \"TransformerEncoderLayer\", ...} object (the "
                         "layer every one of the num_layers copies is built like)",
                         sub);
  grove_encoder_layer_opts o = {0};
  if ((s = tel_opts_from_json(el, sub, &o, err))) return s;
  grove_module *norm = NULL;
  if (nv && !json_is_null(nv)) {
    snprintf(sub, sizeof sub, "%s.norm", path);
    if (!json_is_object(nv) || !json_is_string(json_object_get(nv, "type")) ||
        strcmp(json_string_value(json_object_get(nv, "type")), "LayerNorm") != 0)
      return grove_err_set(err, GROVE_E_SPEC,
                           "%s: expected null or a {\"type\": \"LayerNorm\", ...} object", sub);
    if ((s = grove__layer_norm_from_json(nv, sub, &norm, err))) return s;
  }
  s = grove__json_built(path, grove_transformer_encoder_new(&o, nl, norm, out, err), err);
  grove_module_release(norm);
  return s;
}
