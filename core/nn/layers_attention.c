/* layers_attention.c: torch.nn.MultiheadAttention, TransformerEncoderLayer
 * and TransformerEncoder, eval mode, with PyTorch's state_dict layout
 * (self_attn.in_proj_weight, in_proj_bias, out_proj.weight/bias, linear1/2,
 * norm1/2; layers.N. under an encoder).
 *
 * MultiheadAttention: the input projection is one packed GEMM of the
 * in_proj weight (core/kernels/gemm.c) when query, key and value are one tensor
 * (self-attention), else three.  Scores, softmax and the weighted sum run per
 * batch item and head straight on the projected rows (no transposed copies of
 * q or v: a head is a column block of a row-major matrix; k is transposed
 * once per head), the heads on the compute threads, with the softmax
 * max-subtracted (summed in float on the AVX-512 path, in double on the
 * portable one); the output projection is out_proj's
 * Linear.  q is scaled by 1/sqrt(head_dim) before the product, as torch does.
 * Masks are F.multi_head_attention_forward's: attn_mask (bool or float,
 * [L, S] or [N * num_heads, L, S]) and key_padding_mask (bool or float,
 * [N, S]) are merged into one additive row per batch item and head (a true
 * entry is -inf) that is added to the scores before the softmax; a row with
 * every key masked is NaN, as torch 1.13 gives it.  kdim / vdim other than
 * embed_dim project with the separate q/k/v_proj_weight; add_bias_kv and
 * add_zero_attn append one key/value position after the projection (the
 * masks padded with 0 there), as torch does.  The attention weights (torch's
 * need_weights=True default, averaged over heads unless
 * average_attn_weights=False) are a second output; a graph that calls with
 * need_weights=False or with masks says so in the forward's context
 * (grove_fwd.mha, set by grove__mha_next_call / grove__next_call_masks) and
 * gets one output.  The transformer layers are in layers_transformer.c. */
#include <assert.h>
#include <cblas.h>
#include <float.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph_ops.h"
#include "layers_internal.h"
#include "observe.h"
#include "simd_exp.h"

/* *c is read here, after the constructor ran: C leaves the order of
 * argument evaluation open. */
grove_status grove__add_child(grove_module *m, const char *name, grove_status s, grove_module **c,
                              grove_err *err) {
  if (s) return s;
  s = grove_module_add_module(m, name, *c, err);
  grove_module_release(*c);
  *c = NULL;
  return s;
}

/* ============================================================ MultiheadAttention */

typedef struct mha_impl {
  grove_mha_opts o; /* kdim, vdim filled in */
  int64_t E, H, d;
  bool same;                   /* kdim == vdim == embed_dim: one in_proj_weight */
  double dropout;              /* the constructor's; training's only (the replica reads it) */
  grove__linear_pack *in_pack; /* [3E, E]: q, k and v in one product (same only) */
  grove__linear_pack *qkv[3];  /* [E, E], [E, kdim], [E, vdim]: query, key, value */
  float in_bias[];             /* 3E, then bias_k and bias_v (E each) */
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
  s->batch_first = p->o.batch_first;
  s->mha_extras = !p->same || p->o.add_bias_kv || p->o.add_zero_attn;
}

/* The parameter name of m, checked to be [n0, n1] (n1 0: 3-d [1, 1, n0]). */
static grove_status want_param(const grove_module *m, const char *name, int64_t n0, int64_t n1,
                               const grove_tensor **out, grove_err *err) {
  const grove_tensor *w = grove_module_param(m, name);
  *out = w;
  if (!w)
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT, "MultiheadAttention: %s is None", name);
  const bool ok = n1 ? (w->ndim == 2 && w->shape[0] == n0 && w->shape[1] == n1)
                     : (w->ndim == 3 && w->shape[0] == 1 && w->shape[1] == 1 && w->shape[2] == n0);
  if (ok) return GROVE_OK;
  char got[128];
  grove_shape_str(w->ndim, w->shape, got, sizeof got);
  if (n1)
    return grove_err_set(err, GROVE_E_SHAPE,
                         "MultiheadAttention: %s has shape %s, expected [%lld, %lld]", name, got,
                         (long long)n0, (long long)n1);
  return grove_err_set(err, GROVE_E_SHAPE,
                       "MultiheadAttention: %s has shape %s, expected [1, 1, %lld]", name, got,
                       (long long)n0);
}

static grove_status mha_refresh(grove_module *m, grove_err *err) {
  mha_impl *p = m->impl;
  const int64_t E = p->E;
  const char *T = "MultiheadAttention";
  const grove_tensor *b = grove_module_param(m, "in_proj_bias"), *w;
  if (b && (b->ndim != 1 || b->shape[0] != 3 * E)) {
    char got[128];
    grove_shape_str(b->ndim, b->shape, got, sizeof got);
    return grove_err_set(err, GROVE_E_SHAPE,
                         "MultiheadAttention: in_proj_bias has shape %s, expected [%lld]", got,
                         (long long)(3 * E));
  }
  grove__linear_pack *packs[4] = {NULL};
  grove_status s = GROVE_OK;
  if (p->same) {
    if ((s = want_param(m, "in_proj_weight", 3 * E, E, &w, err))) return s;
    float *wf = malloc((size_t)(3 * E * E) * sizeof(float) + 1);
    if (!wf) return grove_err_set(err, GROVE_E_NOMEM, "%s: out of memory", T);
    s = grove__copy_f32(wf, 3 * E * E, w, T, "in_proj_weight", err);
    if (!s) {
      packs[0] = grove__linear_pack_new(wf, 3 * E, E);
      for (int i = 0; i < 3; i++) packs[i + 1] = grove__linear_pack_new(wf + i * E * E, E, E);
      for (int i = 0; i < 4; i++)
        if (!packs[i]) s = grove_err_set(err, GROVE_E_NOMEM, "%s: out of memory", T);
    }
    free(wf);
  } else {
    static const char *const names[3] = {"q_proj_weight", "k_proj_weight", "v_proj_weight"};
    const int64_t in[3] = {E, p->o.kdim, p->o.vdim};
    for (int i = 0; i < 3 && !s; i++) {
      if ((s = want_param(m, names[i], E, in[i], &w, err))) break;
      float *wf = malloc((size_t)(E * in[i]) * sizeof(float) + 1);
      if (!wf) {
        s = grove_err_set(err, GROVE_E_NOMEM, "%s: out of memory", T);
        break;
      }
      s = grove__copy_f32(wf, E * in[i], w, T, names[i], err);
      if (!s && !(packs[i + 1] = grove__linear_pack_new(wf, E, in[i])))
        s = grove_err_set(err, GROVE_E_NOMEM, "%s: out of memory", T);
      free(wf);
    }
  }
  if (!s && b) s = grove__copy_f32(p->in_bias, 3 * E, b, T, "in_proj_bias", err);
  if (!s && !b) memset(p->in_bias, 0, (size_t)(3 * E) * sizeof(float));
  if (!s && p->o.add_bias_kv) {
    if (!(s = want_param(m, "bias_k", E, 0, &w, err)))
      s = grove__copy_f32(p->in_bias + 3 * E, E, w, T, "bias_k", err);
    if (!s && !(s = want_param(m, "bias_v", E, 0, &w, err)))
      s = grove__copy_f32(p->in_bias + 4 * E, E, w, T, "bias_v", err);
  }
  if (s) {
    for (int i = 0; i < 4; i++) grove__linear_pack_free(packs[i]);
    return s;
  }
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
  memset(f->mha.mask, 0, sizeof f->mha.mask);
}

void grove__next_call_masks(grove_fwd *f, const grove_module *m, int n,
                            const grove_tensor *const *masks) {
  if (f->mha.m != m) grove__mha_next_call(f, m, true, true);
  for (int i = 0; i < 6; i++) f->mha.mask[i] = i < n ? masks[i] : NULL;
}

void grove__take_call(grove_fwd *f, const grove_module *m, const grove_tensor *masks[6],
                      bool *need_weights, bool *average) {
  const bool mine = m && f->mha.m == m;
  for (int i = 0; i < 6; i++) masks[i] = mine ? f->mha.mask[i] : NULL;
  if (need_weights) *need_weights = mine ? f->mha.need_weights : true;
  if (average) *average = mine ? f->mha.average : true;
  if (mine) grove__mha_next_call(f, NULL, true, true);
}

/* ------------------------------------------------------------ attention core */

/* Heads of any size run AVX-512 kernels where the CPU has it: a block of
 * score or output rows lives in registers over its whole reduction.  The
 * build's baseline is SSE2, so the portable loops below run 4 floats at a
 * time and spill their accumulators to memory on every step. */
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

/* R rows x NV vectors of rows_avx512's output (out row r at out + r * ldo,
 * B's block at bb), R and NV compile-time constants at every call so that
 * the accumulators stay in registers: each sum over t in order from zero,
 * then times sv, as the 4 x 4 tile computes it. */
static inline __attribute__((always_inline)) void rows_tile(const int R, const int NV,
                                                            const float *A, int64_t lda,
                                                            const float *bb, int64_t ldb,
                                                            int64_t K, const __mmask16 *m,
                                                            __m512 sv, float *out, int64_t ldo) {
  __m512 acc[8][4];
#pragma GCC unroll 8
  for (int r = 0; r < R; r++)
#pragma GCC unroll 4
    for (int j = 0; j < NV; j++) acc[r][j] = _mm512_setzero_ps();
  for (int64_t t = 0; t < K; t++) {
    __m512 b[4];
#pragma GCC unroll 4
    for (int j = 0; j < NV; j++) b[j] = _mm512_maskz_loadu_ps(m[j], bb + t * ldb + 16 * j);
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) {
      const __m512 x = _mm512_set1_ps(A[r * lda + t]);
#pragma GCC unroll 4
      for (int j = 0; j < NV; j++) acc[r][j] = _mm512_fmadd_ps(x, b[j], acc[r][j]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; r++)
#pragma GCC unroll 4
    for (int j = 0; j < NV; j++)
      _mm512_mask_storeu_ps(out + r * ldo + 16 * j, m[j], _mm512_mul_ps(acc[r][j], sv));
}

/* out[l][c] = scale * sum_t A[l * lda + t] B[t * ldb + c] for l < L, c < C,
 * t < K: both of attention's products, the scores (A = q, B = k transposed,
 * K = d) and the mix (A = the probabilities, B = v, K = S; scale 1, which
 * is exact).  Columns go in blocks of up to 64: a full block keeps 4 rows x
 * 4 vectors in 16 named accumulators (registers; an array of them spills
 * there), each B vector loaded once for 4 rows; a partial block goes in
 * tiles of 8 or 5 rows (rows_tile), and the rows left over one at a time
 * over all of the block's vectors.  Every sum runs over t in order, so the
 * blocking does not change the bits. */
static void rows_avx512(const float *A, int64_t lda, const float *B, int64_t ldb, int64_t L,
                        int64_t C, int64_t K, float scale, float *out, int64_t ldo) {
  const __m512 sv = _mm512_set1_ps(scale);
  for (int64_t c0 = 0; c0 < C; c0 += 64) {
    const int64_t cols = C - c0 < 64 ? C - c0 : 64;
    const int nv = (int)((cols + 15) / 16);
    __mmask16 m[4];
    for (int j = 0; j < 4; j++) m[j] = j < nv ? tail_mask(cols - 16 * j) : 0;
    const float *bb = B + c0;
    int64_t l = 0;
    for (; nv == 4 && l + 4 <= L; l += 4) {
      __m512 a00 = _mm512_setzero_ps(), a01 = a00, a02 = a00, a03 = a00;
      __m512 a10 = a00, a11 = a00, a12 = a00, a13 = a00;
      __m512 a20 = a00, a21 = a00, a22 = a00, a23 = a00;
      __m512 a30 = a00, a31 = a00, a32 = a00, a33 = a00;
      const float *a0 = A + l * lda;
      for (int64_t t = 0; t < K; t++) {
        const float *br = bb + t * ldb;
        const __m512 b0 = _mm512_loadu_ps(br), b1 = _mm512_loadu_ps(br + 16),
                     b2 = _mm512_loadu_ps(br + 32), b3 = _mm512_maskz_loadu_ps(m[3], br + 48);
#define ROWS_FMA(r)                                    \
  do {                                                 \
    const __m512 x_ = _mm512_set1_ps(a0[r * lda + t]); \
    a##r##0 = _mm512_fmadd_ps(x_, b0, a##r##0);        \
    a##r##1 = _mm512_fmadd_ps(x_, b1, a##r##1);        \
    a##r##2 = _mm512_fmadd_ps(x_, b2, a##r##2);        \
    a##r##3 = _mm512_fmadd_ps(x_, b3, a##r##3);        \
  } while (0)
        ROWS_FMA(0);
        ROWS_FMA(1);
        ROWS_FMA(2);
        ROWS_FMA(3);
#undef ROWS_FMA
      }
#define ROWS_STORE(r)                                                 \
  do {                                                                \
    float *o_ = out + (l + r) * ldo + c0;                             \
    _mm512_storeu_ps(o_, _mm512_mul_ps(a##r##0, sv));                 \
    _mm512_storeu_ps(o_ + 16, _mm512_mul_ps(a##r##1, sv));            \
    _mm512_storeu_ps(o_ + 32, _mm512_mul_ps(a##r##2, sv));            \
    _mm512_mask_storeu_ps(o_ + 48, m[3], _mm512_mul_ps(a##r##3, sv)); \
  } while (0)
      ROWS_STORE(0);
      ROWS_STORE(1);
      ROWS_STORE(2);
      ROWS_STORE(3);
#undef ROWS_STORE
    }
    /* A block narrower than 64 columns (Swin's mix: d = 32) in tiles of
     * R rows x nv vectors, R = 8 / 8 / 5 for nv = 1 / 2 / 3 (8 to 16
     * independent chains: an FMA's result is ready 4 cycles after it
     * issues, 2 issue a cycle); then each row left alone over all nv
     * vectors. */
    switch (nv) {
      case 1:
        for (; l + 8 <= L; l += 8)
          rows_tile(8, 1, A + l * lda, lda, bb, ldb, K, m, sv, out + l * ldo + c0, ldo);
        break;
      case 2:
        for (; l + 8 <= L; l += 8)
          rows_tile(8, 2, A + l * lda, lda, bb, ldb, K, m, sv, out + l * ldo + c0, ldo);
        break;
      case 3:
        for (; l + 5 <= L; l += 5)
          rows_tile(5, 3, A + l * lda, lda, bb, ldb, K, m, sv, out + l * ldo + c0, ldo);
        break;
      default:
        break;
    }
    for (; l < L; l++) {
      switch (nv) {
        case 1:
          rows_tile(1, 1, A + l * lda, lda, bb, ldb, K, m, sv, out + l * ldo + c0, ldo);
          break;
        case 2:
          rows_tile(1, 2, A + l * lda, lda, bb, ldb, K, m, sv, out + l * ldo + c0, ldo);
          break;
        case 3:
          rows_tile(1, 3, A + l * lda, lda, bb, ldb, K, m, sv, out + l * ldo + c0, ldo);
          break;
        default:
          rows_tile(1, 4, A + l * lda, lda, bb, ldb, K, m, sv, out + l * ldo + c0, ldo);
          break;
      }
    }
  }
}

/* Softmax of L rows of S floats in place, the additive mask (madd row l at
 * madd + l * ldm; ldm 0: one row for every l; NULL: none) added first, in
 * the same float addition as a separate pass would make: max-subtracted,
 * summed in float.  A weight below FLT_MIN (a subnormal) is 0: Swin's
 * shifted-window mask adds -100, whose exp (3.7e-44) is one, and every FMA
 * of the mix that reads a subnormal takes a microcode assist (the mix ran
 * at a fifth of its speed: 18% of Swin-T's forward); a finite mask such as
 * a padding mask's -1e4 gives grove__exp16's clamp, 2^-127, also subnormal.
 * What is dropped weighs less than 1.2e-38 of a value. */
static void softmax_rows_avx512(float *sc, int64_t L, int64_t S, const float *madd, int64_t ldm) {
  const __m512 ninf = _mm512_set1_ps(-INFINITY), tiny = _mm512_set1_ps(FLT_MIN);
  for (int64_t l = 0; l < L; l++) {
    float *row = sc + l * S;
    const float *mr = madd ? madd + l * ldm : NULL;
    __m512 mx = ninf;
    for (int64_t c = 0; c < S; c += 16) {
      const __mmask16 m = tail_mask(S - c);
      __m512 v = _mm512_mask_loadu_ps(ninf, m, row + c);
      if (mr) {
        v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, mr + c));
        _mm512_mask_storeu_ps(row + c, m, v);
      }
      mx = _mm512_max_ps(mx, v);
    }
    const float top = _mm512_reduce_max_ps(mx);
    if (top == -INFINITY) { /* every key masked: torch's softmax gives NaN */
      for (int64_t s = 0; s < S; s++) row[s] = NAN;
      continue;
    }
    const __m512 mv = _mm512_set1_ps(top);
    __m512 sum = _mm512_setzero_ps();
    for (int64_t c = 0; c < S; c += 16) {
      const __mmask16 m = tail_mask(S - c);
      const __m512 v = _mm512_mask_loadu_ps(ninf, m, row + c);
      /* A masked key (-inf) weighs exactly 0, as in torch (grove__exp16 clamps
       * its argument, which would leave 2^-127). */
      const __mmask16 live = m & _mm512_cmp_ps_mask(v, ninf, _CMP_NEQ_UQ);
      __m512 e = _mm512_maskz_mov_ps(live, grove__exp16(_mm512_sub_ps(v, mv)));
      /* Not below FLT_MIN (a NaN stays). */
      e = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(e, tiny, _CMP_NLT_UQ), e);
      _mm512_mask_storeu_ps(row + c, m, e);
      sum = _mm512_add_ps(sum, e);
    }
    const __m512 inv = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(sum));
    for (int64_t c = 0; c < S; c += 16) {
      const __mmask16 m = tail_mask(S - c);
      const __m512 p = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, row + c), inv);
      _mm512_mask_storeu_ps(row + c, m,
                            _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(p, tiny, _CMP_NLT_UQ), p));
    }
  }
}

GROVE__TARGET_POP
#endif /* ATT_HAVE_AVX512 */

/* One head of one batch item: o[l] = softmax(scale * q[l] . k^T + madd[l]) . v,
 * rows of q, k, v and o rs* floats apart; madd row l at madd + l * ldm (ldm
 * 0: one row for all l, a padding mask's; NULL: no mask; -inf masks a key,
 * and a row of -inf gives NaN as in torch), added in the softmax's first
 * pass; sc is [L, S] scratch that ends up holding the probabilities and kt
 * [d, S] scratch.  With AVX-512 every head runs the register
 * kernels above on k transposed once; otherwise large heads go to sgemm and
 * small ones to loops that vectorise along S and d (att_big says
 * when the caller must not run heads on several threads: OpenBLAS's own
 * threads are not for calls from ours). */
static bool att_fast(void) {
  return att_avx512();
}

static bool att_big(int64_t L, int64_t S, int64_t d) {
  return !att_fast() && L * S * d >= (1 << 15);
}

static void attend(const float *q, int64_t rsq, const float *k, int64_t rsk, const float *v,
                   int64_t rsv, float *o, int64_t rso, int64_t L, int64_t S, int64_t d, float scale,
                   const float *madd, int64_t ldm, float *restrict sc, float *restrict kt) {
  const bool fast = att_fast(), big = att_big(L, S, d);
  if (fast) {
#if ATT_HAVE_AVX512
    grove__transpose_f32_ld(k, rsk, kt, S, S, d);      /* kt[t][s] = k[s][t] */
    rows_avx512(q, rsq, kt, S, L, S, d, scale, sc, S); /* the scores */
    softmax_rows_avx512(sc, L, S, madd, ldm);
    rows_avx512(sc, S, v, rsv, L, d, S, 1.0f, o, rso); /* the mix */
#endif
    return;
  }
  if (big) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (blasint)L, (blasint)S, (blasint)d, scale,
                q, (blasint)rsq, k, (blasint)rsk, 0.0f, sc, (blasint)S);
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
  for (int64_t l = 0; l < L; l++) {
    float *row = sc + l * S;
    if (madd)
      for (int64_t s = 0; s < S; s++) row[s] += madd[l * ldm + s];
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
  if (big) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (blasint)L, (blasint)d, (blasint)S, 1.0f,
                sc, (blasint)S, v, (blasint)rsv, 0.0f, o, (blasint)rso);
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

void grove__attend_head(const float *q, int64_t rsq, const float *k, int64_t rsk, const float *v,
                        int64_t rsv, float *o, int64_t rso, int64_t L, int64_t S, int64_t d,
                        float scale, const float *madd, int64_t ldm, float *sc, float *kt) {
  attend(q, rsq, k, rsk, v, rsv, o, rso, L, S, d, scale, madd, ldm, sc, kt);
}

bool grove__attend_head_threads(int64_t L, int64_t S, int64_t d) {
  return !att_big(L, S, d);
}

static grove_status contig(grove_fwd *f, const grove_tensor *t, grove_tensor *out) {
  if (t->dtype != GROVE_F32)
    return grove_err_set(f->err, GROVE_E_DTYPE,
                         "MultiheadAttention: expected float32 inputs, got %s",
                         grove_dtype_name(t->dtype));
  return grove__contig_f32(f, t, out);
}

/* ------------------------------------------------------------ masks */

static bool mask_is_bool(const grove_tensor *t) {
  return t->dtype == GROVE_BOOL || t->dtype == GROVE_U8; /* uint8: torch's deprecated bool */
}

double grove__mask_at(const grove_tensor *t, int64_t off) {
  switch (t->dtype) {
    case GROVE_F32:
      return ((const float *)t->data)[off];
    case GROVE_F64:
      return ((const double *)t->data)[off];
    default:
      return ((const uint8_t *)t->data)[off] ? 1.0 : 0.0;
  }
}

static grove_status mask_dtype(grove_fwd *f, const grove_tensor *t, const char *what) {
  if (mask_is_bool(t) || t->dtype == GROVE_F32 || t->dtype == GROVE_F64) return GROVE_OK;
  return grove_err_set(f->err, GROVE_E_DTYPE,
                       "MultiheadAttention: only bool and floating types of %s are supported, "
                       "got %s",
                       what, grove_dtype_name(t->dtype));
}

/* Checks key_padding_mask kpm ([N, S]; unbatched [S]) and attn_mask am
 * ([L, S] or [N * H, L, S]) as F.multi_head_attention_forward does. */
static grove_status masks_check(grove_fwd *f, const grove_tensor *kpm, const grove_tensor *am,
                                bool batched, int64_t N, int64_t H, int64_t L, int64_t S) {
  char got[128];
  grove_status s;
  if (kpm) {
    if ((s = mask_dtype(f, kpm, "key_padding_mask"))) return s;
    if (batched ? (kpm->ndim != 2 || kpm->shape[0] != N || kpm->shape[1] != S)
                : (kpm->ndim != 1 || kpm->shape[0] != S))
      return grove_err_set(f->err, GROVE_E_SHAPE,
                           "MultiheadAttention: expecting key_padding_mask shape of %s(%lld), but "
                           "got %s",
                           batched ? "(N, S) = " : "", (long long)S,
                           grove_shape_str(kpm->ndim, kpm->shape, got, sizeof got));
  }
  if (am) {
    if ((s = mask_dtype(f, am, "attn_mask"))) return s;
    if (am->ndim == 2 && (am->shape[0] != L || am->shape[1] != S))
      return grove_err_set(f->err, GROVE_E_SHAPE,
                           "MultiheadAttention: the shape of the 2D attn_mask is %s, but should be "
                           "[%lld, %lld]",
                           grove_shape_str(am->ndim, am->shape, got, sizeof got), (long long)L,
                           (long long)S);
    if (am->ndim == 3 && (am->shape[0] != N * H || am->shape[1] != L || am->shape[2] != S))
      return grove_err_set(f->err, GROVE_E_SHAPE,
                           "MultiheadAttention: the shape of the 3D attn_mask is %s, but should be "
                           "[%lld, %lld, %lld] (batch * num_heads, L, S)",
                           grove_shape_str(am->ndim, am->shape, got, sizeof got),
                           (long long)(N * H), (long long)L, (long long)S);
    if (am->ndim != 2 && am->ndim != 3)
      return grove_err_set(f->err, GROVE_E_SHAPE,
                           "MultiheadAttention: attn_mask's dimension %d is not supported",
                           am->ndim);
  }
  if (kpm && am && !mask_is_bool(kpm) && !mask_is_bool(am))
    return grove_err_set(f->err, GROVE_E_DTYPE,
                         "MultiheadAttention: a float key_padding_mask with a float attn_mask: "
                         "torch merges them with masked_fill, which only supports boolean masks");
  return GROVE_OK;
}

/* madd[l][s] for batch item n, head h: the two masks merged as torch merges
 * them (bool or bool: -inf; float attn_mask with a bool padding mask:
 * masked_fill with -inf; a bool attn_mask with a float padding mask: their
 * logical or), 0 in the S2 - S columns that add_bias_kv / add_zero_attn
 * appended (torch pads the masks with zeros there). */
static void mask_rows(float *madd, const grove_tensor *kpm, const grove_tensor *am, int64_t n,
                      int64_t h, int64_t H, int64_t L, int64_t S, int64_t S2) {
  const bool kb = kpm && mask_is_bool(kpm), ab = am && mask_is_bool(am);
  for (int64_t l = 0; l < L; l++) {
    float *row = madd + l * S2;
    for (int64_t s = 0; s < S2; s++) {
      if (s >= S) {
        row[s] = 0.0f;
        continue;
      }
      double a = 0, k = 0;
      if (am)
        a = am->ndim == 2 ? grove__mask_at(am, l * am->strides[0] + s * am->strides[1])
                          : grove__mask_at(am, (n * H + h) * am->strides[0] + l * am->strides[1] +
                                                   s * am->strides[2]);
      if (kpm)
        k = kpm->ndim == 2 ? grove__mask_at(kpm, n * kpm->strides[0] + s * kpm->strides[1])
                           : grove__mask_at(kpm, s * kpm->strides[0]);
      double v;
      if ((ab || !am) && (kb || !kpm))
        v = (a != 0 || k != 0) ? -INFINITY : 0.0;
      else if (!am)
        v = k;
      else if (!kpm)
        v = a;
      else if (kb) /* float attn_mask, bool padding */
        v = k != 0 ? -INFINITY : a;
      else /* bool attn_mask, float padding: logical_or */
        v = (a != 0 || k != 0) ? -INFINITY : 0.0;
      row[s] = (float)v;
    }
  }
}

/* ------------------------------------------------------------ heads in parallel */

enum { ATT_MASK_NONE, ATT_MASK_ROWS, ATT_MASK_SHARED, ATT_MASK_UNIT };

/* One attention call's heads, for att_groups on the compute threads. */
typedef struct att_par {
  const float *Q, *K, *V; /* the projected rows */
  int64_t ldq, ldk, ldv;
  float *ctx; /* [rows, E]: each head writes its d columns */
  int64_t E, H, d, L, S, S2, qstep, kstep;
  bool bf, extended;
  float scale;
  const grove_tensor *kpm, *am;
  int mode;    /* ATT_MASK_*: how the additive mask is found */
  float *mask; /* ROWS: [N, S2]; SHARED: [L, S2] */
  float *wd;   /* the attention weights' output, or NULL */
  bool need_weights, average, per_item;
  int64_t units, groups, per; /* per: scratch floats per group */
  float *scratch;             /* groups * per */
} att_par;

/* Head h of batch item n, with scratch sc ([L, S2]), kt ([d, S2]) and madd
 * ([L, S2], for ATT_MASK_UNIT). */
static void att_head(const att_par *a, int64_t n, int64_t h, float *sc, float *kt, float *madd) {
  const int64_t E = a->E, d = a->d, L = a->L, S2 = a->S2;
  const int64_t q0r = a->bf ? n * L : n, k0r = a->bf || a->extended ? n * S2 : n;
  float *probs = (a->need_weights && !a->average) ? a->wd + ((n * a->H + h) * L) * S2 : sc;
  if (S2 == 0) {
    for (int64_t l = 0; l < L; l++)
      memset(a->ctx + (q0r + l * a->qstep) * E + h * d, 0, (size_t)d * sizeof(float));
    return;
  }
  const float *m = NULL;
  int64_t ldm = S2;
  if (a->mode == ATT_MASK_ROWS) {
    m = a->mask + n * S2;
    ldm = 0;
  } else if (a->mode == ATT_MASK_SHARED) {
    m = a->mask;
  } else if (a->mode == ATT_MASK_UNIT) {
    mask_rows(madd, a->kpm, a->am, n, h, a->H, L, a->S, S2);
    m = madd;
  }
  attend(a->Q + q0r * a->ldq + h * d, a->qstep * a->ldq, a->K + k0r * a->ldk + h * d,
         a->kstep * a->ldk, a->V + k0r * a->ldv + h * d, a->kstep * a->ldv,
         a->ctx + q0r * E + h * d, a->qstep * E, L, S2, d, a->scale, m, ldm, probs, kt);
  if (a->per_item) {
    float *w = a->wd + n * L * S2;
    for (int64_t i = 0; i < L * S2; i++) w[i] += probs[i];
  }
}

static void att_groups(void *ctx, int64_t g0, int64_t g1) {
  const att_par *a = ctx;
  const int64_t L = a->L, S2 = a->S2;
  for (int64_t g = g0; g < g1; g++) {
    float *sc = a->scratch + g * a->per, *madd = sc + L * S2, *kt = madd + L * S2;
    const int64_t u0 = g * a->units / a->groups, u1 = (g + 1) * a->units / a->groups;
    for (int64_t u = u0; u < u1; u++) {
      if (!a->per_item) {
        att_head(a, u / a->H, u % a->H, sc, kt, madd);
        continue;
      }
      /* Batch item u, every head, its weights summed then averaged. */
      for (int64_t h = 0; h < a->H; h++) att_head(a, u, h, sc, kt, madd);
      float *w = a->wd + u * L * S2;
      const float inv = 1.0f / (float)a->H;
      for (int64_t i = 0; i < L * S2; i++) w[i] *= inv;
    }
  }
}

/* ------------------------------------------------------------ forward */

static grove_status mha_run(const grove_module *m, grove_fwd *f, const grove_tensor *q0,
                            const grove_tensor *k0, const grove_tensor *v0, const grove_tensor *kpm,
                            const grove_tensor *am, bool need_weights, bool average,
                            grove_values *out) {
  const mha_impl *p = m->impl;
  const char *T = "MultiheadAttention";
  const int64_t E = p->E, H = p->H, d = p->d, KD = p->o.kdim, VD = p->o.vdim;
  const bool self_attn = p->same && q0->data == k0->data && k0->data == v0->data &&
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
  bool kv_fit = k.ndim == v.ndim;
  for (int i = 0; kv_fit && i < k.ndim - 1; i++) kv_fit = k.shape[i] == v.shape[i];
  if ((q.ndim != 3 && q.ndim != 2) || k.ndim != q.ndim || v.ndim != q.ndim ||
      q.shape[q.ndim - 1] != E || k.shape[k.ndim - 1] != KD || v.shape[v.ndim - 1] != VD ||
      !kv_fit ||
      (batched && (p->o.batch_first ? (k.shape[0] != q.shape[0]) : (k.shape[1] != q.shape[1])))) {
    char dims[96] = "";
    if (!p->same)
      snprintf(dims, sizeof dims, ", kdim %lld, vdim %lld", (long long)KD, (long long)VD);
    return grove_err_set(f->err, GROVE_E_SHAPE,
                         "MultiheadAttention: query %s, key %s and value %s do not fit: expected "
                         "%s with embed_dim %lld%s (key and value of one shape, one batch size)",
                         grove_shape_str(q.ndim, q.shape, a, sizeof a),
                         grove_shape_str(k.ndim, k.shape, b, sizeof b),
                         grove_shape_str(v.ndim, v.shape, c, sizeof c),
                         p->o.batch_first ? "[N, L, E] or [L, E]" : "[L, N, E] or [L, E]",
                         (long long)E, dims);
  }
  const bool bf = batched && p->o.batch_first;
  const int64_t N = batched ? (bf ? q.shape[0] : q.shape[1]) : 1;
  const int64_t L = batched ? (bf ? q.shape[1] : q.shape[0]) : q.shape[0];
  const int64_t S = batched ? (bf ? k.shape[1] : k.shape[0]) : k.shape[0];
  const int64_t rq = N * L, rk = N * S;
  /* torch's src_len after add_bias_kv / add_zero_attn appended positions. */
  const int64_t S2 = S + (p->o.add_bias_kv ? 1 : 0) + (p->o.add_zero_attn ? 1 : 0);
  if ((s = masks_check(f, kpm, am, batched, N, H, L, S))) return s;

  /* Projections: rows in the input's own order.  The packs exist once the
   * module is refreshed (never before a deferred build is loaded). */
  assert(p->qkv[0] && (p->in_pack || !p->same));
  const float *Q, *K, *V;
  int64_t ldq, ldk, ldv;
  if (self_attn) {
    float *qkv = grove_arena_alloc(f->arena, (size_t)(rq * 3 * E) * sizeof(float) + 1);
    if (!qkv) return grove__scratch_error(f, T);
    if (rq) grove__linear_run(p->in_pack, q.data, rq, p->in_bias, qkv, GROVE__ACT_NONE);
    Q = qkv;
    K = qkv + E;
    V = qkv + 2 * E;
    ldq = ldk = ldv = 3 * E;
  } else {
    float *pq = grove_arena_alloc(f->arena, (size_t)(rq * E) * sizeof(float) + 1);
    float *pk = grove_arena_alloc(f->arena, (size_t)(rk * E) * sizeof(float) + 1);
    float *pv = grove_arena_alloc(f->arena, (size_t)(rk * E) * sizeof(float) + 1);
    if (!pq || !pk || !pv) return grove__scratch_error(f, T);
    if (rq) grove__linear_run(p->qkv[0], q.data, rq, p->in_bias, pq, GROVE__ACT_NONE);
    if (rk) grove__linear_run(p->qkv[1], k.data, rk, p->in_bias + E, pk, GROVE__ACT_NONE);
    if (rk) grove__linear_run(p->qkv[2], v.data, rk, p->in_bias + 2 * E, pv, GROVE__ACT_NONE);
    Q = pq;
    K = pk;
    V = pv;
    ldq = ldk = ldv = E;
  }
  /* Batch n's query row l is row n*L + l (batch_first) or l*N + n; keys
   * likewise, unless positions were appended: then keys and values are
   * copied batch-major, [N, S2, E], with bias_k / bias_v and a zero row at
   * the end of each item. */
  const bool extended = S2 != S;
  if (extended) {
    float *k2 = grove_arena_alloc(f->arena, (size_t)(N * S2 * E) * sizeof(float) + 1);
    float *v2 = grove_arena_alloc(f->arena, (size_t)(N * S2 * E) * sizeof(float) + 1);
    if (!k2 || !v2) return grove__scratch_error(f, T);
    const size_t row = (size_t)E * sizeof(float);
    for (int64_t n = 0; n < N; n++) {
      for (int64_t j = 0; j < S; j++) {
        const int64_t r = bf || !batched ? n * S + j : j * N + n;
        memcpy(k2 + (n * S2 + j) * E, K + r * ldk, row);
        memcpy(v2 + (n * S2 + j) * E, V + r * ldv, row);
      }
      int64_t j = S;
      if (p->o.add_bias_kv) {
        memcpy(k2 + (n * S2 + j) * E, p->in_bias + 3 * E, row);
        memcpy(v2 + (n * S2 + j) * E, p->in_bias + 4 * E, row);
        j++;
      }
      if (p->o.add_zero_attn) {
        memset(k2 + (n * S2 + j) * E, 0, row);
        memset(v2 + (n * S2 + j) * E, 0, row);
      }
    }
    K = k2;
    V = v2;
    ldk = ldv = E;
  }
  float *ctx = grove_arena_alloc(f->arena, (size_t)(rq * E) * sizeof(float) + 1);
  if (!ctx) return grove__scratch_error(f, T);

  /* Attention weights: [N, L, S2] averaged, [N, H, L, S2] per head
   * (unbatched: without N). */
  grove_tensor wt = {0};
  float *wd = NULL;
  if (need_weights) {
    int64_t ws[4];
    int wn = 0;
    if (batched) ws[wn++] = N;
    if (!average) ws[wn++] = H;
    ws[wn++] = L;
    ws[wn++] = S2;
    if ((s = grove_fwd_alloc(f, &wt, GROVE_F32, wn, ws))) return s;
    wd = wt.data;
    if (average) memset(wd, 0, (size_t)(N * L * S2) * sizeof(float));
  }
  att_par ap = {.Q = Q,
                .K = K,
                .V = V,
                .ldq = ldq,
                .ldk = ldk,
                .ldv = ldv,
                .ctx = ctx,
                .E = E,
                .H = H,
                .d = d,
                .L = L,
                .S = S,
                .S2 = S2,
                .qstep = bf ? 1 : N,
                .kstep = bf || extended ? 1 : N,
                .bf = bf,
                .extended = extended,
                .scale = (float)(1.0 / sqrt((double)d)),
                .kpm = kpm,
                .am = am,
                .wd = wd,
                .need_weights = need_weights,
                .average = average};
  /* The masks merged once where they allow it: a padding mask alone is one
   * row per batch item for every query and head, a 2-d attn_mask alone one
   * [L, S2] matrix for all; other mixes are built per head. */
  if (kpm && !am) {
    ap.mode = ATT_MASK_ROWS;
    ap.mask = grove_arena_alloc(f->arena, (size_t)(N * S2) * sizeof(float) + 1);
    if (!ap.mask) return grove__scratch_error(f, T);
    for (int64_t n = 0; n < N; n++) mask_rows(ap.mask + n * S2, kpm, NULL, n, 0, H, 1, S, S2);
  } else if (am && am->ndim == 2 && !kpm) {
    ap.mode = ATT_MASK_SHARED;
    ap.mask = grove_arena_alloc(f->arena, (size_t)(L * S2) * sizeof(float) + 1);
    if (!ap.mask) return grove__scratch_error(f, T);
    mask_rows(ap.mask, NULL, am, 0, 0, H, L, S, S2);
  } else {
    ap.mode = kpm || am ? ATT_MASK_UNIT : ATT_MASK_NONE;
  }
  /* Heads (or, when the averaged weights are summed over heads, batch
   * items) are independent units; they run in up to 16 groups on the
   * compute threads, each group with scratch of its own, so the result is
   * the same for any thread count. */
  ap.per_item = need_weights && average;
  ap.units = L > 0 ? (ap.per_item ? N : N * H) : 0;
  ap.per = 2 * L * S2 + d * S2;
  /* More groups than threads only balance the load: past 32 MB of scratch
   * (long sequences: a head's [L, S] scores are 64 MB at 4,096 tokens) there
   * are as many groups as compute threads. */
  int64_t cap = ((int64_t)32 << 20) / ((ap.per > 0 ? ap.per : 1) * (int64_t)sizeof(float));
  if (cap < grove_compute_threads()) cap = grove_compute_threads();
  ap.groups = ap.units < 16 ? ap.units : 16;
  if (ap.groups > cap) ap.groups = cap;
  if (att_big(L, S2, d)) ap.groups = ap.units < 1 ? ap.units : 1;
  ap.scratch = grove_arena_alloc(f->arena, (size_t)(ap.groups * ap.per) * sizeof(float) + 1);
  if (!ap.scratch) return grove__scratch_error(f, T);
  if (ap.groups > 0) grove__parallel_for(ap.groups, 1, att_groups, &ap);
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

grove_status grove__mha_call(const grove_module *m, grove_fwd *f, const grove_tensor *q,
                             const grove_tensor *k, const grove_tensor *v, const grove_tensor *kpm,
                             const grove_tensor *am, bool need_weights, bool average,
                             grove_values *out) {
  if (m->type != &grove__mha_type)
    return grove_err_set(f->err, GROVE_E_INTERNAL, "%s is not a MultiheadAttention", m->type->name);
  return mha_run(m, f, q, k, v, kpm, am, need_weights, average, out);
}

bool grove__mha_packed(const grove_module *m) {
  const mha_impl *p = m->impl;
  return p->qkv[0] != NULL && (p->in_pack != NULL || !p->same);
}

static grove_status mha_forward(const grove_module *m, grove_fwd *f, const grove_values *in,
                                grove_values *out) {
  const grove_tensor *mask[6];
  bool need, avg;
  grove__take_call(f, m, mask, &need, &avg);
  if (in->n != 1 && in->n != 3)
    return grove_err_set(f->err, GROVE_E_INVALID_ARGUMENT,
                         "MultiheadAttention: expected query, key and value (3 tensors), got %d",
                         in->n);
  const grove_tensor *q = &in->v[0];
  const grove_tensor *k = in->n == 3 ? &in->v[1] : q, *v = in->n == 3 ? &in->v[2] : q;
  return mha_run(m, f, q, k, v, mask[0], mask[1], need, avg, out);
}

const grove_module_type grove__mha_type = {
    .name = "MultiheadAttention",
    .forward = mha_forward,
    .refresh = mha_refresh,
    .free_impl = mha_free_impl,
};

grove_status grove_multihead_attention_new(int64_t embed_dim, int64_t num_heads, bool bias,
                                           bool batch_first, grove_module **out, grove_err *err) {
  const grove_mha_opts o = {
      .embed_dim = embed_dim, .num_heads = num_heads, .bias = bias, .batch_first = batch_first};
  return grove_multihead_attention_new_opts(&o, out, err);
}

grove_status grove_multihead_attention_new_opts(const grove_mha_opts *o, grove_module **out,
                                                grove_err *err) {
  *out = NULL;
  const char *T = "MultiheadAttention";
  const int64_t E = o->embed_dim, kd = o->kdim ? o->kdim : E, vd = o->vdim ? o->vdim : E;
  if (E <= 0 || o->num_heads <= 0 || E > (1 << 16) || kd < 0 || kd > (1 << 16) || vd < 0 ||
      vd > (1 << 16))
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT,
                         "%s: embed_dim and num_heads must be positive (embed_dim, kdim and vdim "
                         "at most 65536), got %lld and %lld",
                         T, (long long)E, (long long)o->num_heads);
  if (E % o->num_heads)
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT,
                         "%s: embed_dim must be divisible by num_heads", T);
  mha_impl *p = calloc(1, sizeof *p + (size_t)(5 * E) * sizeof(float));
  if (!p) return grove_err_set(err, GROVE_E_NOMEM, "%s: out of memory", T);
  p->o = *o;
  p->o.kdim = kd;
  p->o.vdim = vd;
  p->E = E;
  p->H = o->num_heads;
  p->d = E / o->num_heads;
  p->same = kd == E && vd == E;
  grove_module *m = NULL;
  grove_status s = grove__layer_make(&grove__mha_type, p, &m, err);
  if (s) return s;
  /* torch's registration order, the unused weights as None: the separate
   * q/k/v weights (or None) and in_proj_weight (or None), in_proj_bias,
   * then bias_k, bias_v; out_proj is a child, so its keys come after. */
  int64_t ws[2] = {3 * E, E}, bs = 3 * E, kvs[3] = {1, 1, E};
  grove_tensor *w = NULL, *b = NULL, *sep[3] = {NULL}, *bkv[2] = {NULL};
  if (p->same) {
    if (!(w = grove_tensor_new(GROVE_F32, 2, ws, err))) s = GROVE_E_NOMEM;
  } else {
    const int64_t in[3] = {E, kd, vd};
    for (int i = 0; i < 3; i++) {
      int64_t sh[2] = {E, in[i]};
      if (!(sep[i] = grove_tensor_new(GROVE_F32, 2, sh, err))) s = GROVE_E_NOMEM;
    }
  }
  if (o->bias && !(b = grove_tensor_new(GROVE_F32, 1, &bs, err))) s = GROVE_E_NOMEM;
  for (int i = 0; i < 2 && o->add_bias_kv; i++)
    if (!(bkv[i] = grove_tensor_new(GROVE_F32, 3, kvs, err))) s = GROVE_E_NOMEM;
  if (s) s = err && err->code ? err->code : GROVE_E_NOMEM;
  if (p->same) {
    if (!s) s = grove_module_register_parameter(m, "in_proj_weight", w, err);
    if (!s) s = grove_module_register_parameter(m, "q_proj_weight", NULL, err);
    if (!s) s = grove_module_register_parameter(m, "k_proj_weight", NULL, err);
    if (!s) s = grove_module_register_parameter(m, "v_proj_weight", NULL, err);
  } else {
    if (!s) s = grove_module_register_parameter(m, "q_proj_weight", sep[0], err);
    if (!s) s = grove_module_register_parameter(m, "k_proj_weight", sep[1], err);
    if (!s) s = grove_module_register_parameter(m, "v_proj_weight", sep[2], err);
    if (!s) s = grove_module_register_parameter(m, "in_proj_weight", NULL, err);
  }
  if (!s) s = grove_module_register_parameter(m, "in_proj_bias", b, err);
  /* Without add_bias_kv torch's bias_k / bias_v are plain None attributes,
   * not parameter slots. */
  if (!s && o->add_bias_kv) s = grove_module_register_parameter(m, "bias_k", bkv[0], err);
  if (!s && o->add_bias_kv) s = grove_module_register_parameter(m, "bias_v", bkv[1], err);
  grove_tensor_release(w);
  grove_tensor_release(b);
  for (int i = 0; i < 3; i++) grove_tensor_release(sep[i]);
  for (int i = 0; i < 2; i++) grove_tensor_release(bkv[i]);
  grove_module *op = NULL;
  if (!s) s = grove__add_child(m, "out_proj", grove_linear_new(E, E, o->bias, &op, err), &op, err);
  /* Packs the zero weights, unless the tree is built for a load
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
  if (E % H)
    return grove_err_set(err, GROVE_E_SPEC,
                         "%s.num_heads: embed_dim (%lld) must be divisible by num_heads (%lld)",
                         path, (long long)E, (long long)H);
  const grove_mha_opts o = {.embed_dim = E,
                            .num_heads = H,
                            .bias = bias,
                            .batch_first = bf,
                            .add_bias_kv = bkv,
                            .add_zero_attn = zero,
                            .kdim = kd_null ? 0 : kd,
                            .vdim = vd_null ? 0 : vd};
  s = grove_multihead_attention_new_opts(&o, out, err);
  /* dropout acts in training only (the replica reads it, grove__mha_settings). */
  if (!s) ((mha_impl *)(*out)->impl)->dropout = dropout;
  return grove__json_built(path, s, err);
}
