/* layers_rnn.c: torch.nn.RNN (tanh, relu), torch.nn.LSTM (with proj_size)
 * and torch.nn.GRU: any num_layers, bidirectional, batch_first both ways,
 * with or without bias, optional initial states.
 *
 * State_dict: torch's flat names, per layer k and direction ("" or
 * "_reverse"), in torch's order: weight_ih_l<k>, weight_hh_l<k>,
 * bias_ih_l<k>, bias_hh_l<k>, weight_hr_l<k> (LSTM with proj_size).  The
 * gates are stacked as torch stacks them: LSTM i, f, g, o; GRU r, z, n.
 *
 * Forward takes x ([T, B, I], [B, T, I] with batch_first, or unbatched
 * [T, I]) and optionally h0 (RNN, GRU) or h0 and c0 (LSTM), as separate
 * tensors: a graph flattens torch's (h0, c0) tuple argument.  It returns
 * output, h_n (and c_n) as out.v[0..2]; a graph presents them as torch's
 * (output, h_n) or (output, (h_n, c_n)).
 *
 * torch.nn.RNNCell, LSTMCell and GRUCell are one time step of a one-layer,
 * one-direction net, with the names weight_ih, weight_hh, bias_ih, bias_hh:
 * the same packs and gate math, their input [B, I] (or unbatched [I]) run as
 * a sequence of one, and they return h' (RNNCell, GRUCell) or h', c'
 * (LSTMCell, which a graph presents as torch's tuple).
 *
 * How it runs: per layer and direction, the input-to-hidden products of all
 * time steps are one GEMM on the Linear kernel ([T*B, I] x W_ih^T plus both
 * biases folded into one, except GRU's b_hn, which sits inside r * (...)),
 * and each time step is then one [B, H] x W_hh^T product on the same kernel
 * plus the gate math, which runs 8 floats at a time (AVX2) where the CPU has
 * it.  The weights are packed in refresh, as Linear packs its own. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "layers_internal.h"
#include "simd_exp.h"

enum { RNN_TANH, RNN_RELU, RNN_LSTM, RNN_GRU };

/* The hidden products run in column blocks of RNN_BLOCK hidden units: block
 * k packs the rows of W_hh for units [k*RNN_BLOCK, ...) of every gate, so
 * that one task computes its block's products and then its gates, all on one
 * thread and in cache, and a time step is one hand-off to the compute
 * threads.  (With OpenBLAS packs, which must not run inside the pool, one
 * whole product per step and the gates after it.) */
#define RNN_BLOCK 32

typedef struct rnn_cell {
  grove__linear_pack *ih, *hr; /* hr: LSTM's projection, or NULL */
  grove__linear_pack **blk;    /* nblk column blocks of W_hh, or NULL: */
  int64_t nblk;
  grove__linear_pack *hh; /* the whole of W_hh (not native packs) */
  float *bias_x;          /* G*H: added to the input products */
  float *bias_h;          /* GRU: [0, 0, b_hn] (G*H), per block when blk; else NULL */
} rnn_cell;

typedef struct rnn_impl {
  int mode;
  int64_t input_size, hidden_size, proj_size, num_layers;
  bool bias, batch_first, bidirectional;
  double dropout;
  int ndir, gates;
  bool cell;       /* RNNCell, LSTMCell, GRUCell: one step, names without _l0 */
  rnn_cell *cells; /* num_layers * ndir, layer-major; packs NULL while refresh_pending */
} rnn_impl;

static const char *rnn_name(const rnn_impl *p) {
  if (p->cell) return p->mode == RNN_LSTM ? "LSTMCell" : p->mode == RNN_GRU ? "GRUCell" : "RNNCell";
  return p->mode == RNN_LSTM ? "LSTM" : p->mode == RNN_GRU ? "GRU" : "RNN";
}

/* The hidden state's width: proj_size when an LSTM projects, else hidden_size. */
static int64_t out_width(const rnn_impl *p) {
  return p->proj_size > 0 ? p->proj_size : p->hidden_size;
}

static int64_t layer_in(const rnn_impl *p, int64_t layer) {
  return layer == 0 ? p->input_size : out_width(p) * p->ndir;
}

static void cells_free(rnn_cell *c, int64_t n) {
  if (!c) return;
  for (int64_t i = 0; i < n; i++) {
    grove__linear_pack_free(c[i].ih);
    grove__linear_pack_free(c[i].hh);
    grove__linear_pack_free(c[i].hr);
    for (int64_t k = 0; k < c[i].nblk; k++) grove__linear_pack_free(c[i].blk[k]);
    free(c[i].blk);
    free(c[i].bias_x);
    free(c[i].bias_h);
  }
  free(c);
}

static void rnn_free_impl(void *impl) {
  rnn_impl *p = impl;
  if (!p) return;
  cells_free(p->cells, p->num_layers * p->ndir);
  free(p);
}

static void param_name(char *buf, size_t n, const rnn_impl *p, const char *what, int64_t layer,
                       int dir) {
  if (p->cell)
    snprintf(buf, n, "%s", what);
  else
    snprintf(buf, n, "%s_l%lld%s", what, (long long)layer, dir ? "_reverse" : "");
}

/* The float32 contents of parameter name, checked to be [rows, cols] (cols 0:
 * 1-d [rows]), in a new malloc'd buffer. */
static grove_status param_f32(const grove_module *m, const char *name, int64_t rows, int64_t cols,
                              float **out, grove_err *err) {
  const rnn_impl *p = m->impl;
  *out = NULL;
  const grove_tensor *t = grove_module_param(m, name);
  if (!t) return grove_err_set(err, GROVE_E_INVALID_ARGUMENT, "%s: %s is None", rnn_name(p), name);
  const bool ok = cols ? (t->ndim == 2 && t->shape[0] == rows && t->shape[1] == cols)
                       : (t->ndim == 1 && t->shape[0] == rows);
  if (!ok) {
    char got[128];
    grove_shape_str(t->ndim, t->shape, got, sizeof got);
    if (cols)
      return grove_err_set(err, GROVE_E_SHAPE, "%s: %s has shape %s, expected [%lld, %lld]",
                           rnn_name(p), name, got, (long long)rows, (long long)cols);
    return grove_err_set(err, GROVE_E_SHAPE, "%s: %s has shape %s, expected [%lld]", rnn_name(p),
                         name, got, (long long)rows);
  }
  const int64_t n = rows * (cols ? cols : 1);
  float *d = malloc((size_t)n * sizeof(float) + 1);
  if (!d) return grove_err_set(err, GROVE_E_NOMEM, "%s: out of memory packing %s", rnn_name(p), name);
  grove_status s = grove__copy_f32(d, n, t, rnn_name(p), name, err);
  if (s != GROVE_OK) {
    free(d);
    return s;
  }
  *out = d;
  return GROVE_OK;
}

static grove_status pack_param(const grove_module *m, const char *name, int64_t rows, int64_t cols,
                               grove__linear_pack **out, grove_err *err) {
  float *w;
  grove_status s = param_f32(m, name, rows, cols, &w, err);
  if (s != GROVE_OK) return s;
  *out = grove__linear_pack_new(w, rows, cols);
  free(w);
  if (!*out)
    return grove_err_set(err, GROVE_E_NOMEM, "%s: out of memory packing %s",
                         rnn_name(m->impl), name);
  return GROVE_OK;
}

static grove_status pack_hh(const grove_module *m, const char *name, rnn_cell *c, grove_err *err);
static grove_status fold_biases(const grove_module *m, int64_t layer, int dir, rnn_cell *c,
                                grove_err *err);

static grove_status refresh_cell(const grove_module *m, int64_t layer, int dir, rnn_cell *c,
                                 grove_err *err) {
  const rnn_impl *p = m->impl;
  const int64_t H = p->hidden_size, GH = p->gates * H;
  char name[64];
  grove_status s;
  param_name(name, sizeof name, p, "weight_ih", layer, dir);
  if ((s = pack_param(m, name, GH, layer_in(p, layer), &c->ih, err))) return s;
  if (p->proj_size > 0) {
    param_name(name, sizeof name, p, "weight_hr", layer, dir);
    if ((s = pack_param(m, name, p->proj_size, H, &c->hr, err))) return s;
  }
  c->bias_x = calloc((size_t)GH, sizeof(float));
  if (!c->bias_x) return grove_err_set(err, GROVE_E_NOMEM, "%s: out of memory", rnn_name(p));
  if (p->mode == RNN_GRU) {
    c->bias_h = calloc((size_t)GH, sizeof(float));
    if (!c->bias_h) return grove_err_set(err, GROVE_E_NOMEM, "%s: out of memory", rnn_name(p));
  }
  if (p->bias && (s = fold_biases(m, layer, dir, c, err))) return s;
  param_name(name, sizeof name, p, "weight_hh", layer, dir);
  return pack_hh(m, name, c, err);
}

/* W_hh [G*H, HO] as column blocks (or whole: see RNN_BLOCK), with GRU's b_hn
 * laid out per block. */
static grove_status pack_hh(const grove_module *m, const char *name, rnn_cell *c, grove_err *err) {
  const rnn_impl *p = m->impl;
  const int64_t H = p->hidden_size, G = p->gates, HO = out_width(p);
  float *w;
  grove_status s = param_f32(m, name, G * H, HO, &w, err);
  if (s != GROVE_OK) return s;
  const int64_t nblk = (H + RNN_BLOCK - 1) / RNN_BLOCK;
  float *rows = malloc((size_t)(G * RNN_BLOCK * HO) * sizeof(float));
  float *bias = c->bias_h ? calloc((size_t)(nblk * G * RNN_BLOCK), sizeof(float)) : NULL;
  c->blk = calloc((size_t)nblk, sizeof *c->blk);
  if (!rows || !c->blk || (c->bias_h && !bias)) {
    free(w);
    free(rows);
    free(bias);
    return grove_err_set(err, GROVE_E_NOMEM, "%s: out of memory packing %s", rnn_name(p), name);
  }
  bool native = true;
  for (int64_t k = 0; k < nblk && native; k++) {
    const int64_t j0 = k * RNN_BLOCK, bw = H - j0 < RNN_BLOCK ? H - j0 : RNN_BLOCK;
    for (int64_t g = 0; g < G; g++) {
      memcpy(rows + g * bw * HO, w + (g * H + j0) * HO, (size_t)(bw * HO) * sizeof(float));
      if (bias)
        memcpy(bias + k * G * RNN_BLOCK + g * bw, c->bias_h + g * H + j0,
               (size_t)bw * sizeof(float));
    }
    c->blk[k] = grove__linear_pack_new(rows, G * bw, HO);
    c->nblk = k + 1;
    if (!c->blk[k]) {
      s = grove_err_set(err, GROVE_E_NOMEM, "%s: out of memory packing %s", rnn_name(p), name);
      break;
    }
    native = grove__linear_pack_native(c->blk[k]);
  }
  free(rows);
  if (s == GROVE_OK && !native) {
    /* OpenBLAS: one whole product per step instead. */
    for (int64_t k = 0; k < c->nblk; k++) grove__linear_pack_free(c->blk[k]);
    free(c->blk);
    c->blk = NULL;
    c->nblk = 0;
    free(bias);
    bias = NULL;
    c->hh = grove__linear_pack_new(w, G * H, HO);
    if (!c->hh)
      s = grove_err_set(err, GROVE_E_NOMEM, "%s: out of memory packing %s", rnn_name(p), name);
  }
  free(w);
  if (bias) {
    free(c->bias_h);
    c->bias_h = bias;
  }
  return s;
}

/* bias_x = b_ih + b_hh, except GRU's b_hn, which goes to bias_h. */
static grove_status fold_biases(const grove_module *m, int64_t layer, int dir, rnn_cell *c,
                                grove_err *err) {
  const rnn_impl *p = m->impl;
  const int64_t H = p->hidden_size, GH = p->gates * H;
  char name[64];
  grove_status s;
  float *bi, *bh;
  param_name(name, sizeof name, p, "bias_ih", layer, dir);
  if ((s = param_f32(m, name, GH, 0, &bi, err))) return s;
  param_name(name, sizeof name, p, "bias_hh", layer, dir);
  if ((s = param_f32(m, name, GH, 0, &bh, err))) {
    free(bi);
    return s;
  }
  /* GRU's n gate is tanh(W_in x + b_in + r * (W_hn h + b_hn)): b_hn stays
   * with the hidden product; every other bias is a constant of the input
   * product. */
  const int64_t fold = p->mode == RNN_GRU ? 2 * H : GH;
  for (int64_t j = 0; j < GH; j++) c->bias_x[j] = bi[j] + (j < fold ? bh[j] : 0.0f);
  if (p->mode == RNN_GRU)
    for (int64_t j = fold; j < GH; j++) c->bias_h[j] = bh[j];
  free(bi);
  free(bh);
  return GROVE_OK;
}

/* All or nothing: on error the previous packs stay in use. */
static grove_status rnn_refresh(grove_module *m, grove_err *err) {
  rnn_impl *p = m->impl;
  const int64_t n = p->num_layers * p->ndir;
  rnn_cell *cells = calloc((size_t)n, sizeof *cells);
  if (!cells) return grove_err_set(err, GROVE_E_NOMEM, "%s: out of memory", rnn_name(p));
  for (int64_t i = 0; i < n; i++) {
    grove_status s = refresh_cell(m, i / p->ndir, (int)(i % p->ndir), &cells[i], err);
    if (s != GROVE_OK) {
      cells_free(cells, n);
      return s;
    }
  }
  cells_free(p->cells, n);
  p->cells = cells;
  return GROVE_OK;
}

/* ------------------------------------------------------------ gate math */

/* The gates read the input product gx (G*H floats per batch row, biases
 * folded in) and the hidden product gh of one time step. */

static inline float sigmoidf_(float x) { return 1.0f / (1.0f + expf(-x)); }

#if GROVE__X86_SIMD
#include <immintrin.h>
GROVE__TARGET_PUSH("avx2,fma")

static inline __m256 sigmoid8(__m256 x) {
  const __m256 one = _mm256_set1_ps(1.0f);
  return _mm256_div_ps(one,
                       _mm256_add_ps(one, grove__exp8(_mm256_sub_ps(_mm256_setzero_ps(), x))));
}

/* tanh(x) = 2 sigmoid(2x) - 1 (absolute error about 1e-7 near 0). */
static inline __m256 tanh8(__m256 x) {
  const __m256 two = _mm256_set1_ps(2.0f);
  return _mm256_fmsub_ps(two, sigmoid8(_mm256_mul_ps(two, x)), _mm256_set1_ps(1.0f));
}

/* The gate functions read gate g of column j at gx[g * sx + j] and
 * gh[g * sh + j]: gx is a row of the input products (sx = H), gh a row of a
 * column block's hidden products (sh = the block's width). */

/* LSTM: c = f c + i g, h = o tanh(c), over the first n8 (a multiple of 8)
 * columns. */
static void lstm_gates_avx2(const float *gx, int64_t sx, const float *gh, int64_t sh, float *c,
                            float *h, int64_t n8) {
  for (int64_t j = 0; j < n8; j += 8) {
    __m256 i = sigmoid8(_mm256_add_ps(_mm256_loadu_ps(gx + j), _mm256_loadu_ps(gh + j)));
    __m256 f =
        sigmoid8(_mm256_add_ps(_mm256_loadu_ps(gx + sx + j), _mm256_loadu_ps(gh + sh + j)));
    __m256 g = tanh8(
        _mm256_add_ps(_mm256_loadu_ps(gx + 2 * sx + j), _mm256_loadu_ps(gh + 2 * sh + j)));
    __m256 o = sigmoid8(
        _mm256_add_ps(_mm256_loadu_ps(gx + 3 * sx + j), _mm256_loadu_ps(gh + 3 * sh + j)));
    __m256 cn = _mm256_fmadd_ps(f, _mm256_loadu_ps(c + j), _mm256_mul_ps(i, g));
    _mm256_storeu_ps(c + j, cn);
    _mm256_storeu_ps(h + j, _mm256_mul_ps(o, tanh8(cn)));
  }
}

static void gru_gates_avx2(const float *gx, int64_t sx, const float *gh, int64_t sh,
                           const float *hp, float *h, int64_t n8) {
  const __m256 one = _mm256_set1_ps(1.0f);
  for (int64_t j = 0; j < n8; j += 8) {
    __m256 r = sigmoid8(_mm256_add_ps(_mm256_loadu_ps(gx + j), _mm256_loadu_ps(gh + j)));
    __m256 z =
        sigmoid8(_mm256_add_ps(_mm256_loadu_ps(gx + sx + j), _mm256_loadu_ps(gh + sh + j)));
    __m256 n = tanh8(_mm256_fmadd_ps(r, _mm256_loadu_ps(gh + 2 * sh + j),
                                     _mm256_loadu_ps(gx + 2 * sx + j)));
    /* (1 - z) n + z h' */
    __m256 hn =
        _mm256_fmadd_ps(z, _mm256_loadu_ps(hp + j), _mm256_mul_ps(_mm256_sub_ps(one, z), n));
    _mm256_storeu_ps(h + j, hn);
  }
}

static void rnn_gates_avx2(const float *gx, const float *gh, float *h, int64_t n8, bool relu) {
  for (int64_t j = 0; j < n8; j += 8) {
    __m256 v = _mm256_add_ps(_mm256_loadu_ps(gx + j), _mm256_loadu_ps(gh + j));
    _mm256_storeu_ps(h + j, relu ? _mm256_max_ps(v, _mm256_setzero_ps()) : tanh8(v));
  }
}

GROVE__TARGET_POP
#endif

static int64_t simd_cols(int64_t n) {
#if GROVE__X86_SIMD
  if (grove__cpu_avx2()) return n & ~(int64_t)7;
#endif
  (void)n;
  return 0;
}

/* n columns of one batch row of one time step (strides as above).  hp: the
 * previous hidden state (GRU reads it), h: where the new one goes (not hp),
 * c: LSTM's cell state, updated in place. */
static void cell_gates(int mode, const float *gx, int64_t sx, const float *gh, int64_t sh,
                       const float *hp, float *c, float *h, int64_t n) {
  const int64_t n8 = simd_cols(n);
  int64_t j = 0;
  switch (mode) {
    case RNN_LSTM:
#if GROVE__X86_SIMD
      if (n8) lstm_gates_avx2(gx, sx, gh, sh, c, h, n8);
#endif
      for (j = n8; j < n; j++) {
        float i = sigmoidf_(gx[j] + gh[j]), f = sigmoidf_(gx[sx + j] + gh[sh + j]);
        float g = tanhf(gx[2 * sx + j] + gh[2 * sh + j]);
        float o = sigmoidf_(gx[3 * sx + j] + gh[3 * sh + j]);
        c[j] = f * c[j] + i * g;
        h[j] = o * tanhf(c[j]);
      }
      return;
    case RNN_GRU:
#if GROVE__X86_SIMD
      if (n8) gru_gates_avx2(gx, sx, gh, sh, hp, h, n8);
#endif
      for (j = n8; j < n; j++) {
        float r = sigmoidf_(gx[j] + gh[j]), z = sigmoidf_(gx[sx + j] + gh[sh + j]);
        float nn = tanhf(gx[2 * sx + j] + r * gh[2 * sh + j]);
        h[j] = (1.0f - z) * nn + z * hp[j];
      }
      return;
    default:
#if GROVE__X86_SIMD
      if (n8) rnn_gates_avx2(gx, gh, h, n8, mode == RNN_RELU);
#endif
      for (j = n8; j < n; j++) {
        float v = gx[j] + gh[j];
        h[j] = mode == RNN_RELU ? (v > 0.0f ? v : 0.0f) : tanhf(v);
      }
      return;
  }
}

/* ------------------------------------------------------------ forward */

typedef struct rnn_run {
  const rnn_impl *p;
  grove_fwd *f;
  int64_t T, B;
  float *gx, *gh, *hfull, *hbuf, *c; /* scratch */
} rnn_run;

/* One time step of the column blocks [k0, k1): each block's hidden products
 * from hp, then its gates, written to hw (row stride ldh). */
typedef struct step_ctx {
  const rnn_impl *p;
  const rnn_cell *cell;
  const float *gx; /* this step's input products, [B, G*H] */
  const float *hp; /* [B, HO] */
  float *gh;       /* per block: [B, G*RNN_BLOCK] */
  float *c, *hw;
  int64_t B, ldh;
} step_ctx;

static void step_blocks(void *ctx, int64_t k0, int64_t k1) {
  const step_ctx *sc = ctx;
  const rnn_impl *p = sc->p;
  const int64_t H = p->hidden_size, G = p->gates, HO = out_width(p), B = sc->B;
  for (int64_t k = k0; k < k1; k++) {
    const int64_t j0 = k * RNN_BLOCK, bw = H - j0 < RNN_BLOCK ? H - j0 : RNN_BLOCK;
    float *gh = sc->gh + k * B * G * RNN_BLOCK;
    const float *bias = sc->cell->bias_h ? sc->cell->bias_h + k * G * RNN_BLOCK : NULL;
    grove__linear_run_alone(sc->cell->blk[k], sc->hp, B, bias, gh, GROVE__ACT_NONE);
    for (int64_t b = 0; b < B; b++)
      cell_gates(p->mode, sc->gx + b * G * H + j0, H, gh + b * G * bw, bw, sc->hp + b * HO + j0,
                 sc->c ? sc->c + b * H + j0 : NULL, sc->hw + b * sc->ldh + j0, bw);
  }
}

/* One layer in one direction: in [T*B, I] (time-major) -> out [T, B,
 * ndir*HO] at column dir*HO; h [B, HO] and c [B, H] hold the initial state on
 * entry and the final one on return. */
static void run_direction(rnn_run *r, const rnn_cell *cell, int dir, const float *in, float *out,
                          float *h, float *c) {
  const rnn_impl *p = r->p;
  const int64_t T = r->T, B = r->B, H = p->hidden_size, HO = out_width(p), GH = p->gates * H;
  const int64_t ow = p->ndir * HO;
  grove__linear_run(cell->ih, in, T * B, cell->bias_x, r->gx, GROVE__ACT_NONE);
  /* The new state must not overwrite the one the other blocks still read:
   * one direction without a projection writes it straight into the output
   * (its rows at step t are a contiguous [B, HO]); otherwise h and hbuf take
   * turns, and the state is copied into the output. */
  const bool direct = p->ndir == 1 && !cell->hr;
  const float *hp = h;
  float *hn = NULL;
  for (int64_t step = 0; step < T; step++) {
    const int64_t t = dir ? T - 1 - step : step;
    hn = direct ? out + t * B * HO : (hp == h ? r->hbuf : h);
    /* LSTM with a projection computes the full-width h first, then h = h W_hr^T. */
    float *hw = cell->hr ? r->hfull : hn;
    const int64_t ldh = cell->hr ? H : HO;
    const float *gx = r->gx + t * B * GH;
    if (cell->blk) {
      step_ctx sc = {p, cell, gx, hp, r->gh, c, hw, B, ldh};
      grove__parallel_for(cell->nblk, 1, step_blocks, &sc);
    } else {
      grove__linear_run(cell->hh, hp, B, cell->bias_h, r->gh, GROVE__ACT_NONE);
      for (int64_t b = 0; b < B; b++)
        cell_gates(p->mode, gx + b * GH, H, r->gh + b * GH, H, hp + b * HO, c ? c + b * H : NULL,
                   hw + b * ldh, H);
    }
    if (cell->hr) grove__linear_run(cell->hr, r->hfull, B, NULL, hn, GROVE__ACT_NONE);
    if (!direct)
      for (int64_t b = 0; b < B; b++)
        memcpy(out + (t * B + b) * ow + dir * HO, hn + b * HO, (size_t)HO * sizeof(float));
    hp = hn;
  }
  if (hp != h) memcpy(h, hp, (size_t)(B * HO) * sizeof(float));
}

/* dst[j][i] = src[i][j] over [n0, n1, w] blocks: [B, T, w] <-> [T, B, w]. */
static void swap01(float *dst, const float *src, int64_t n0, int64_t n1, int64_t w) {
  for (int64_t i = 0; i < n0; i++)
    for (int64_t j = 0; j < n1; j++)
      memcpy(dst + (j * n0 + i) * w, src + (i * n1 + j) * w, (size_t)w * sizeof(float));
}

static void *scratch(grove_fwd *f, int64_t floats) {
  return grove_arena_alloc(f->arena, (size_t)(floats > 0 ? floats : 1) * sizeof(float));
}

/* Checks an initial state: [L*D, B, width] ([L*D, width] unbatched). */
static grove_status check_state(const rnn_impl *p, grove_fwd *f, const grove_tensor *t,
                                const char *what, bool batched, int64_t B, int64_t width) {
  const int64_t LD = p->num_layers * p->ndir;
  char want[96], got[128];
  if (batched)
    snprintf(want, sizeof want, "[%lld, %lld, %lld]", (long long)LD, (long long)B,
             (long long)width);
  else
    snprintf(want, sizeof want, "[%lld, %lld]", (long long)LD, (long long)width);
  bool ok = t->dtype == GROVE_F32 && t->ndim == (batched ? 3 : 2) && t->shape[0] == LD &&
            t->shape[t->ndim - 1] == width && (!batched || t->shape[1] == B);
  if (ok) return GROVE_OK;
  grove_shape_str(t->ndim, t->shape, got, sizeof got);
  return grove_err_set(f->err, t->dtype != GROVE_F32 ? GROVE_E_DTYPE : GROVE_E_SHAPE,
                       "%s: expected %s of shape %s (num_layers * num_directions, batch, %s) "
                       "and dtype float32, got %s %s",
                       rnn_name(p), what, want, width == p->hidden_size ? "hidden_size" : "proj_size",
                       grove_dtype_name(t->dtype), got);
}

static grove_status rnn_forward(const grove_module *m, grove_fwd *f, const grove_values *in,
                                grove_values *out) {
  const rnn_impl *p = m->impl;
  const char *T_ = rnn_name(p);
  const bool lstm = p->mode == RNN_LSTM;
  const int nstate = lstm ? 2 : 1;
  if (m->training && p->dropout > 0 && p->num_layers > 1)
    return grove_err_set(f->err, GROVE_E_UNSUPPORTED,
                         "%s: training-mode forward with dropout is not available on a serving "
                         "tree",
                         T_);
  if (in->n != 1 && in->n != 1 + nstate)
    return grove_err_set(f->err, GROVE_E_INVALID_ARGUMENT,
                         "%s: expected the input, or the input and %s, got %d tensors", T_,
                         lstm ? "(h0, c0)" : "h0", in->n);
  grove_tensor x;
  grove_status s;
  if (in->v[0].dtype != GROVE_F32)
    return grove_err_set(f->err, GROVE_E_DTYPE, "%s: input must be float32, got %s", T_,
                         grove_dtype_name(in->v[0].dtype));
  if ((s = grove__fwd_contig(f, &in->v[0], &x))) return s;
  if (x.ndim != 2 && x.ndim != 3) {
    char want[96];
    snprintf(want, sizeof want, "a 2-d (unbatched) or 3-d input of %lld features",
             (long long)p->input_size);
    return grove__shape_error(f, T_, want, &x);
  }
  const bool batched = x.ndim == 3;
  const int64_t I = x.shape[x.ndim - 1];
  if (I != p->input_size)
    return grove_err_set(f->err, GROVE_E_SHAPE,
                         "%s: input.size(-1) must be equal to input_size. Expected %lld, got %lld",
                         T_, (long long)p->input_size, (long long)I);
  const int64_t T = batched ? x.shape[p->batch_first ? 1 : 0] : x.shape[0];
  const int64_t B = batched ? x.shape[p->batch_first ? 0 : 1] : 1;
  if (T == 0 || B == 0)
    return grove_err_set(f->err, GROVE_E_SHAPE,
                         "%s: the input's sequence length and batch must be positive", T_);
  const int64_t H = p->hidden_size, HO = out_width(p), GH = p->gates * H, D = p->ndir;
  const int64_t LD = p->num_layers * D;
  uint64_t tb, n1, n2;
  const int64_t widest = layer_in(p, 1) > p->input_size ? layer_in(p, 1) : p->input_size;
  if (grove__mul_overflow_u64((uint64_t)T, (uint64_t)B, &tb) ||
      grove__mul_overflow_u64(tb, (uint64_t)(GH > widest ? GH : widest), &n1) ||
      grove__mul_overflow_u64(n1, sizeof(float) * 4, &n2) || n2 > (uint64_t)INT64_MAX)
    return grove_err_set(f->err, GROVE_E_SHAPE, "%s: a sequence of %lld x %lld is too large", T_,
                         (long long)T, (long long)B);

  grove_tensor st[2];
  for (int k = 0; k < nstate && in->n > 1; k++) {
    const int64_t w = k == 0 ? HO : H;
    if ((s = check_state(p, f, &in->v[1 + k], k == 0 ? "h0" : "c0", batched, B, w))) return s;
    if ((s = grove__fwd_contig(f, &in->v[1 + k], &st[k]))) return s;
  }

  /* Outputs first, so that the scratch after them is given back by a
   * graph's compaction. */
  int64_t yshape[3], hshape[3];
  const int64_t ow = D * HO;
  if (batched) {
    yshape[0] = p->batch_first ? B : T;
    yshape[1] = p->batch_first ? T : B;
    yshape[2] = ow;
  } else {
    yshape[0] = T;
    yshape[1] = ow;
  }
  hshape[0] = LD;
  hshape[1] = batched ? B : HO;
  hshape[2] = HO;
  if ((s = grove_fwd_alloc(f, &out->v[0], GROVE_F32, x.ndim, yshape))) return s;
  if ((s = grove_fwd_alloc(f, &out->v[1], GROVE_F32, batched ? 3 : 2, hshape))) return s;
  if (lstm) {
    hshape[batched ? 2 : 1] = H;
    if ((s = grove_fwd_alloc(f, &out->v[2], GROVE_F32, batched ? 3 : 2, hshape))) return s;
  }
  out->n = 1 + nstate;
  float *hn = out->v[1].data, *cn = lstm ? out->v[2].data : NULL;
  if (in->n > 1) {
    memcpy(hn, st[0].data, (size_t)(LD * B * HO) * sizeof(float));
    if (lstm) memcpy(cn, st[1].data, (size_t)(LD * B * H) * sizeof(float));
  } else {
    memset(hn, 0, (size_t)(LD * B * HO) * sizeof(float));
    if (lstm) memset(cn, 0, (size_t)(LD * B * H) * sizeof(float));
  }

  rnn_run r = {.p = p, .f = f, .T = T, .B = B};
  const float *cur = x.data;
  if (batched && p->batch_first && B > 1 && T > 1) {
    float *t = scratch(f, T * B * I);
    if (!t) return grove__scratch_error(f, T_);
    swap01(t, x.data, B, T, I);
    cur = t;
  }
  const bool to_bf = batched && p->batch_first && B > 1 && T > 1;
  r.gx = scratch(f, T * B * GH);
  /* The blocks' products: G * RNN_BLOCK columns for each block (the last
   * one may be narrower), at least G*H for the whole product. */
  const int64_t nblk = (H + RNN_BLOCK - 1) / RNN_BLOCK;
  r.gh = scratch(f, B * p->gates * RNN_BLOCK * nblk);
  r.hbuf = scratch(f, B * HO);
  r.hfull = p->proj_size > 0 ? scratch(f, B * H) : NULL;
  float *bufs[2] = {NULL, NULL};
  const int nbuf = p->num_layers > 1 ? 2 : 1;
  for (int k = 0; k < nbuf; k++) bufs[k] = scratch(f, T * B * ow);
  if (!r.gx || !r.gh || !r.hbuf || (p->proj_size > 0 && !r.hfull) || !bufs[0] ||
      (nbuf > 1 && !bufs[1]))
    return grove__scratch_error(f, T_);
  for (int64_t l = 0; l < p->num_layers; l++) {
    /* The last layer writes the output itself when no transpose follows. */
    float *dst = (l == p->num_layers - 1 && !to_bf) ? out->v[0].data : bufs[l % 2];
    for (int dir = 0; dir < D; dir++) {
      const int64_t k = l * D + dir;
      run_direction(&r, &p->cells[k], dir, cur, dst, hn + k * B * HO, lstm ? cn + k * B * H : NULL);
    }
    cur = dst;
  }
  if (to_bf) swap01(out->v[0].data, cur, T, B, ow);
  return GROVE_OK;
}

/* RNNCell, LSTMCell, GRUCell: input [B, I] or [I], and h (and c) [B, H] or
 * [H] or none (zeros), as torch's cells check them; run as a sequence of
 * one through rnn_forward, whose h_n (and c_n) are the results. */
static grove_status cell_forward(const grove_module *m, grove_fwd *f, const grove_values *in,
                                 grove_values *out) {
  const rnn_impl *p = m->impl;
  const char *T_ = rnn_name(p);
  const int nstate = p->mode == RNN_LSTM ? 2 : 1;
  if (in->n != 1 && in->n != 1 + nstate)
    return grove_err_set(f->err, GROVE_E_INVALID_ARGUMENT,
                         "%s: expected the input, or the input and %s, got %d tensors", T_,
                         nstate == 2 ? "(h, c)" : "h", in->n);
  const grove_tensor *x = &in->v[0];
  if (x->ndim != 1 && x->ndim != 2)
    return grove_err_set(f->err, GROVE_E_SHAPE,
                         "%s: Expected input to be 1D or 2D, got %dD instead", T_, x->ndim);
  const bool batched = x->ndim == 2;
  const int64_t B = batched ? x->shape[0] : 1, H = p->hidden_size;
  grove_values seq = {.n = in->n};
  grove_status s;
  /* [1, B, I]: a contiguous copy viewed with one more dimension. */
  for (int k = 0; k < in->n; k++) {
    const grove_tensor *t = &in->v[k];
    if (k > 0) {
      char got[128];
      const bool ok = t->dtype == GROVE_F32 && t->ndim == x->ndim && t->shape[t->ndim - 1] == H &&
                      (!batched || t->shape[0] == B);
      if (!ok)
        return grove_err_set(f->err, t->dtype != GROVE_F32 ? GROVE_E_DTYPE : GROVE_E_SHAPE,
                             "%s: %s must be float32 [%s%lld] (the input's batch, hidden_size), "
                             "got %s %s",
                             T_, k == 1 ? "h" : "c", batched ? "B, " : "", (long long)H,
                             grove_dtype_name(t->dtype),
                             grove_shape_str(t->ndim, t->shape, got, sizeof got));
    }
    grove_tensor c;
    if ((s = grove__fwd_contig(f, t, &c))) return s;
    const int64_t sh[3] = {1, B, t->shape[t->ndim - 1]};
    grove_tensor_init(&seq.v[k], GROVE_F32, 3, sh, c.data);
  }
  grove_values res = {0};
  if ((s = rnn_forward(m, f, &seq, &res))) return s;
  /* h_n, c_n: [1, B, H] -> [B, H] or [H]. */
  out->n = nstate;
  const int64_t sh[2] = {batched ? B : H, H};
  for (int k = 0; k < nstate; k++)
    grove_tensor_init(&out->v[k], GROVE_F32, x->ndim, sh, res.v[1 + k].data);
  return GROVE_OK;
}

/* ------------------------------------------------------------ construction */

static const grove_module_type rnn_types[6] = {
    {.name = "RNN", .forward = rnn_forward, .refresh = rnn_refresh, .free_impl = rnn_free_impl},
    {.name = "LSTM", .forward = rnn_forward, .refresh = rnn_refresh, .free_impl = rnn_free_impl},
    {.name = "GRU", .forward = rnn_forward, .refresh = rnn_refresh, .free_impl = rnn_free_impl},
    {.name = "RNNCell",
     .forward = cell_forward,
     .refresh = rnn_refresh,
     .free_impl = rnn_free_impl},
    {.name = "LSTMCell",
     .forward = cell_forward,
     .refresh = rnn_refresh,
     .free_impl = rnn_free_impl},
    {.name = "GRUCell",
     .forward = cell_forward,
     .refresh = rnn_refresh,
     .free_impl = rnn_free_impl},
};
const grove_module_type *const grove__rnn_type = &rnn_types[0];
const grove_module_type *const grove__lstm_type = &rnn_types[1];
const grove_module_type *const grove__gru_type = &rnn_types[2];

bool grove__is_rnn(const grove_module *m) {
  return m && m->type >= &rnn_types[0] && m->type <= &rnn_types[5];
}

bool grove__rnn_is_lstm(const grove_module *m) { return m && m->type == &rnn_types[1]; }

grove_status grove_rnn_new(const grove_rnn_opts *o, grove_module **out, grove_err *err) {
  *out = NULL;
  int mode;
  if (!o->mode || strcmp(o->mode, "RNN_TANH") == 0)
    mode = RNN_TANH;
  else if (strcmp(o->mode, "RNN_RELU") == 0)
    mode = RNN_RELU;
  else if (strcmp(o->mode, "LSTM") == 0)
    mode = RNN_LSTM;
  else if (strcmp(o->mode, "GRU") == 0)
    mode = RNN_GRU;
  else
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT,
                         "RNN: mode must be RNN_TANH, RNN_RELU, LSTM or GRU, got \"%s\"", o->mode);
  const char *T = o->cell ? (mode == RNN_LSTM  ? "LSTMCell"
                             : mode == RNN_GRU ? "GRUCell"
                                               : "RNNCell")
                          : (mode == RNN_LSTM  ? "LSTM"
                             : mode == RNN_GRU ? "GRU"
                                               : "RNN");
  if (o->cell && (o->num_layers != 1 || o->proj_size != 0 || o->bidirectional || o->batch_first ||
                  o->dropout != 0))
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT,
                         "%s: a cell has one layer, one direction, no projection, batch_first "
                         "and dropout unset",
                         T);
  const int gates = mode == RNN_LSTM ? 4 : mode == RNN_GRU ? 3 : 1;
  /* 2^24 keeps every product of two sizes (and the gate count) far from
   * overflowing, and is far beyond any recurrent net's width. */
  const int64_t big = (int64_t)1 << 24;
  if (o->input_size <= 0 || o->hidden_size <= 0 || o->num_layers <= 0 ||
      o->input_size > big || o->hidden_size > big || o->num_layers > 4096)
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT,
                         "%s: input_size, hidden_size and num_layers must be positive (and below "
                         "2^24, 4096), got %lld, %lld and %lld",
                         T, (long long)o->input_size, (long long)o->hidden_size,
                         (long long)o->num_layers);
  if (o->proj_size < 0 || (o->proj_size > 0 && mode != RNN_LSTM) ||
      o->proj_size >= o->hidden_size)
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT,
                         "%s: proj_size must be 0, or (LSTM only) positive and smaller than "
                         "hidden_size %lld, got %lld",
                         T, (long long)o->hidden_size, (long long)o->proj_size);
  if (!(o->dropout >= 0 && o->dropout <= 1))
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT,
                         "%s: dropout must be in [0, 1], got %g", T, o->dropout);
  rnn_impl *p = calloc(1, sizeof *p);
  if (!p) return grove_err_set(err, GROVE_E_NOMEM, "%s: out of memory", T);
  p->mode = mode;
  p->input_size = o->input_size;
  p->hidden_size = o->hidden_size;
  p->proj_size = o->proj_size;
  p->num_layers = o->num_layers;
  p->bias = o->bias;
  p->batch_first = o->batch_first;
  p->bidirectional = o->bidirectional;
  p->dropout = o->dropout;
  p->ndir = o->bidirectional ? 2 : 1;
  p->gates = gates;
  p->cell = o->cell;
  grove_module *m = NULL;
  const int ti = (mode == RNN_LSTM ? 1 : mode == RNN_GRU ? 2 : 0) + (o->cell ? 3 : 0);
  grove_status s = grove__layer_make(&rnn_types[ti], p, &m, err);
  if (s != GROVE_OK) return s;
  const int64_t H = p->hidden_size, GH = gates * H, HO = out_width(p);
  for (int64_t l = 0; l < p->num_layers && !s; l++)
    for (int dir = 0; dir < p->ndir && !s; dir++) {
      char name[64];
      int64_t wih[2] = {GH, layer_in(p, l)}, whh[2] = {GH, HO}, whr[2] = {p->proj_size, H};
      param_name(name, sizeof name, p, "weight_ih", l, dir);
      s = grove__layer_param(m, name, false, 2, wih, GROVE_F32, 0, err);
      param_name(name, sizeof name, p, "weight_hh", l, dir);
      if (!s) s = grove__layer_param(m, name, false, 2, whh, GROVE_F32, 0, err);
      if (p->bias) {
        param_name(name, sizeof name, p, "bias_ih", l, dir);
        if (!s) s = grove__layer_param(m, name, false, 1, &GH, GROVE_F32, 0, err);
        param_name(name, sizeof name, p, "bias_hh", l, dir);
        if (!s) s = grove__layer_param(m, name, false, 1, &GH, GROVE_F32, 0, err);
      }
      if (p->proj_size > 0) {
        param_name(name, sizeof name, p, "weight_hr", l, dir);
        if (!s) s = grove__layer_param(m, name, false, 2, whr, GROVE_F32, 0, err);
      }
    }
  if (!s) s = grove__refresh_new(m, err);
  if (s != GROVE_OK) {
    grove_module_release(m);
    return s;
  }
  *out = m;
  return GROVE_OK;
}

/* torch's constructor arguments.  RNN's nonlinearity picks RNN_TANH or
 * RNN_RELU; proj_size is LSTM's only.  dropout (between layers, training
 * only) is accepted and does nothing in eval mode. */
static grove_status rnn_from_json(const json_t *obj, const char *path, const char *T, int mode,
                                  grove_module **out, grove_err *err) {
  static const char *const rnn_keys[] = {"input_size",  "hidden_size", "num_layers",
                                         "nonlinearity", "bias",       "batch_first",
                                         "dropout",     "bidirectional", NULL};
  static const char *const lstm_keys[] = {"input_size",    "hidden_size", "num_layers",
                                          "bias",          "batch_first", "dropout",
                                          "bidirectional", "proj_size",   NULL};
  static const char *const gru_keys[] = {"input_size",  "hidden_size", "num_layers",
                                         "bias",        "batch_first", "dropout",
                                         "bidirectional", NULL};
  static const char *const nl[] = {"tanh", "relu", NULL};
  const char *const *keys = mode == RNN_LSTM ? lstm_keys : mode == RNN_GRU ? gru_keys : rnn_keys;
  grove_rnn_opts o = {0};
  int act = 0;
  grove_status s = grove__json_check_keys(obj, path, T, keys, err);
  if (!s) s = grove__json_int(obj, path, T, "input_size", true, 0, 1, INT64_MAX, &o.input_size, err);
  if (!s)
    s = grove__json_int(obj, path, T, "hidden_size", true, 0, 1, INT64_MAX, &o.hidden_size, err);
  if (!s) s = grove__json_int(obj, path, T, "num_layers", false, 1, 1, INT64_MAX, &o.num_layers, err);
  if (!s && mode == RNN_TANH) s = grove__json_choice(obj, path, T, "nonlinearity", 0, nl, &act, err);
  if (!s && mode == RNN_LSTM)
    s = grove__json_int(obj, path, T, "proj_size", false, 0, 0, INT64_MAX, &o.proj_size, err);
  if (!s) s = grove__json_bool(obj, path, T, "bias", true, &o.bias, err);
  if (!s) s = grove__json_bool(obj, path, T, "batch_first", false, &o.batch_first, err);
  if (!s) s = grove__json_bool(obj, path, T, "bidirectional", false, &o.bidirectional, err);
  if (!s) s = grove__json_number(obj, path, T, "dropout", 0.0, 0.0, 1.0, &o.dropout, err);
  if (s != GROVE_OK) return s;
  o.mode = mode == RNN_LSTM ? "LSTM" : mode == RNN_GRU ? "GRU" : act ? "RNN_RELU" : "RNN_TANH";
  return grove__json_built(path, grove_rnn_new(&o, out, err), err);
}

grove_status grove__rnn_from_json(const json_t *obj, const char *path, grove_module **out,
                                  grove_err *err) {
  return rnn_from_json(obj, path, "RNN", RNN_TANH, out, err);
}

grove_status grove__lstm_from_json(const json_t *obj, const char *path, grove_module **out,
                                   grove_err *err) {
  return rnn_from_json(obj, path, "LSTM", RNN_LSTM, out, err);
}

grove_status grove__gru_from_json(const json_t *obj, const char *path, grove_module **out,
                                  grove_err *err) {
  return rnn_from_json(obj, path, "GRU", RNN_GRU, out, err);
}

/* The cells' constructor arguments: input_size, hidden_size, bias, and
 * RNNCell's nonlinearity. */
static grove_status cell_from_json(const json_t *obj, const char *path, const char *T, int mode,
                                   grove_module **out, grove_err *err) {
  static const char *const rnn_keys[] = {"input_size", "hidden_size", "bias", "nonlinearity", NULL};
  static const char *const keys[] = {"input_size", "hidden_size", "bias", NULL};
  static const char *const nl[] = {"tanh", "relu", NULL};
  grove_rnn_opts o = {.num_layers = 1, .cell = true};
  int act = 0;
  grove_status s = grove__json_check_keys(obj, path, T, mode == RNN_TANH ? rnn_keys : keys, err);
  if (!s)
    s = grove__json_int(obj, path, T, "input_size", true, 0, 1, INT64_MAX, &o.input_size, err);
  if (!s)
    s = grove__json_int(obj, path, T, "hidden_size", true, 0, 1, INT64_MAX, &o.hidden_size, err);
  if (!s && mode == RNN_TANH)
    s = grove__json_choice(obj, path, T, "nonlinearity", 0, nl, &act, err);
  if (!s) s = grove__json_bool(obj, path, T, "bias", true, &o.bias, err);
  if (s != GROVE_OK) return s;
  o.mode = mode == RNN_LSTM ? "LSTM" : mode == RNN_GRU ? "GRU" : act ? "RNN_RELU" : "RNN_TANH";
  return grove__json_built(path, grove_rnn_new(&o, out, err), err);
}

grove_status grove__rnn_cell_from_json(const json_t *obj, const char *path, grove_module **out,
                                       grove_err *err) {
  return cell_from_json(obj, path, "RNNCell", RNN_TANH, out, err);
}

grove_status grove__lstm_cell_from_json(const json_t *obj, const char *path, grove_module **out,
                                        grove_err *err) {
  return cell_from_json(obj, path, "LSTMCell", RNN_LSTM, out, err);
}

grove_status grove__gru_cell_from_json(const json_t *obj, const char *path, grove_module **out,
                                       grove_err *err) {
  return cell_from_json(obj, path, "GRUCell", RNN_GRU, out, err);
}
