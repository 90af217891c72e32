/* ops_window.c: the op entries (ops.h) of torchvision's Swin Transformer
 * helpers, spelled as torchvision spells them: _patch_merging_pad,
 * _get_relative_position_bias and shifted_window_attention
 * (torchvision/models/swin_transformer.py).  torchvision marks the three
 * with torch.fx.wrap, so a traced Swin records each as one call; and
 * shifted_window_attention branches in Python on its input's padded size
 * (no shift when the window covers the map), which fx could not trace
 * through anyway.  Each entry is therefore the helper itself, computed at
 * run time from the tensors it is given: the padding, the shift, the
 * shifted-window mask and the window partition follow the input's actual
 * H and W, so every input the spec accepts gets torch's answer, and the
 * weights (qkv, proj, the bias table, logit_scale) stay parameters read at
 * each call.  The pieces run on Grove's existing kernels: F.pad, strided
 * indexing, cat, index_select, reshape / permute (graph_ops.c, shape_ops.c,
 * resample.c) for the first two; shifted_window_attention gathers its
 * windows' rows in one pass (padding, shift and partition together) and
 * scatters them back the same way, runs F.linear on grove__gemm and
 * MultiheadAttention's per-head softmax(scale q.k^T + bias) v
 * (grove__attend_head, layers_attention.c) for its windows' heads on the
 * compute threads.  No training forward (train_graph.c): a graph using
 * them trains with "<op> has no training forward in Grove". */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "graph_ops.h"
#include "layers_internal.h"
#include "ops.h"
#include "tensor_ops.h"

#define TENSOR(n) \
  { .name = n, .kind = P_TENSOR, .dk = D_REQ, .dtypes = 1u << GROVE_F32 }
#define OPT_TENSOR(n) \
  { .name = n, .kind = P_TENSOR, .dk = D_NONE, .dtypes = 1u << GROVE_F32 }

static grove_status shape_err(grove_fwd *f, const char *op, const char *what, const grove_tensor *t,
                              const char *want) {
  char got[128];
  return grove_err_set(f->err, GROVE_E_SHAPE, "%s: %s has shape %s, expected %s", op, what,
                       grove_shape_str(t->ndim, t->shape, got, sizeof got), want);
}

/* ------------------------------------------------------------ _patch_merging_pad */

/* x [..., H, W, C] padded to even H and W, then x[..., 0::2, 0::2, :],
 * x[..., 1::2, 0::2, :], x[..., 0::2, 1::2, :], x[..., 1::2, 1::2, :]
 * concatenated on the last dim: [..., H/2, W/2, 4C]. */
static grove_status patch_merging_pad_fwd(const grove__opctx *c, gval *res) {
  const grove_tensor *x;
  grove_tensor xp, parts[4], y;
  grove_status s;
  if ((s = grove__op_tensor(c, 0, &x))) return s;
  if (x->ndim < 3) return shape_err(c->f, "_patch_merging_pad", "input", x, "[..., H, W, C]");
  const int64_t H = x->shape[x->ndim - 3], W = x->shape[x->ndim - 2];
  const int64_t pad[6] = {0, 0, 0, W % 2, 0, H % 2};
  if ((s = grove__op_pad(c->f, x, pad, 6, 0.0, &xp))) return s;
  static const int64_t starts[4][2] = {{0, 0}, {1, 0}, {0, 1}, {1, 1}};
  for (int i = 0; i < 4; i++) {
    grove__index ix[4] = {
        {.kind = GROVE__IX_ELLIPSIS},
        {.kind = GROVE__IX_SLICE, .start = starts[i][0], .step = 2, .has_start = true},
        {.kind = GROVE__IX_SLICE, .start = starts[i][1], .step = 2, .has_start = true},
        {.kind = GROVE__IX_SLICE, .step = 1},
    };
    if ((s = grove__op_index(c->f, &xp, ix, 4, &parts[i]))) return s;
  }
  if ((s = grove__op_cat(c->f, parts, 4, x->ndim - 1, &y))) return s;
  grove__op_set_tensor(res, &y);
  return GROVE_OK;
}

/* ------------------------------------------------------------ _get_relative_position_bias */

/* table[index].view(N, N, -1).permute(2, 0, 1).contiguous().unsqueeze(0),
 * N = window_size[0] * window_size[1]: [1, heads, N, N]. */
static grove_status relative_position_bias_fwd(const grove__opctx *c, gval *res) {
  const grove_tensor *table, *index;
  grove_tensor g, v, p, y, u;
  int64_t ws[GROVE_MAX_DIMS];
  int nws;
  grove_status s;
  if ((s = grove__op_tensor(c, 0, &table)) || (s = grove__op_tensor(c, 1, &index)) ||
      (s = grove__op_ints(c, &c->args[2], false, ws, &nws)))
    return s;
  if (nws != 2)
    return grove_err_set(c->f->err, GROVE_E_SHAPE,
                         "_get_relative_position_bias: window_size must have 2 values, got %d",
                         nws);
  if (table->ndim < 1)
    return shape_err(c->f, "_get_relative_position_bias", "relative_position_bias_table", table,
                     "at least 1 dimension");
  const int64_t N = ws[0] * ws[1];
  const int64_t shape[3] = {N, N, -1};
  const int64_t perm[3] = {2, 0, 1};
  if ((s = grove__op_index_select(c->f, table, 0, index, true, &g)) ||
      (s = grove__op_reshape(c->f, &g, shape, 3, &v)) ||
      (s = grove__op_permute(c->f, &v, perm, 3, &p)) || (s = grove__contig_f32(c->f, &p, &y)) ||
      (s = grove__op_unsqueeze(c->f, &y, 0, &u)))
    return s;
  grove__op_set_tensor(res, &u);
  return GROVE_OK;
}

static grove_status window_size_check(const garg *a, const char *jp, const char *op,
                                      const char *what, bool positive, grove_err *err) {
  if (a->kind != A_LIST || a->n != 2)
    return grove_err_set(err, GROVE_E_SPEC, "%s: %s's %s must be a list of 2 ints", jp, op, what);
  for (int i = 0; i < 2; i++)
    if (a->items[i].kind != A_INT || a->items[i].i < (positive ? 1 : 0) ||
        a->items[i].i > (1 << 12))
      return grove_err_set(err, GROVE_E_SPEC, "%s: %s's %s[%d] must be an int in [%d, %d]", jp, op,
                           what, i, positive ? 1 : 0, 1 << 12);
  return GROVE_OK;
}

static grove_status relative_position_bias_check(const grove__opdef *d, const garg *a,
                                                 const char *jp, grove_err *err) {
  return window_size_check(&a[2], jp, d->name, "window_size", true, err);
}

/* ------------------------------------------------------------ shifted_window_attention */

/* F.linear(x, w, b) on M contiguous rows of K floats: y [M, N] = x w^T + b
 * in the arena (b may be NULL).  The weights are parameters read at each
 * call, so the product is grove__gemm's (w packed per call, O(NK) against
 * the product's O(MNK)), on the compute threads; through matmul it went to
 * OpenBLAS with its copies (17% of Swin-T's forward). */
static grove_status linear(grove_fwd *f, const float *x, int64_t M, int64_t K,
                           const grove_tensor *w, const grove_tensor *b, float **y) {
  grove_tensor wc, bc;
  grove_status s;
  const int64_t N = w->shape[0];
  if ((s = grove__contig_f32(f, w, &wc)) || (b && (s = grove__contig_f32(f, b, &bc)))) return s;
  const size_t wsb = grove__gemm_ws_size(GROVE__GEMM_TRANS_B, M, N, K);
  float *out = grove_arena_alloc(f->arena, (size_t)(M * N) * sizeof(float) + 1);
  void *ws = wsb ? grove_arena_alloc(f->arena, wsb) : NULL;
  if (!out || (wsb && !ws)) return grove__scratch_error(f, "shifted_window_attention");
  grove__gemm(GROVE__GEMM_TRANS_B, M, N, K, x, K, wc.data, K, out, N, ws, wsb);
  if (b) {
    const float *bd = bc.data;
    for (int64_t r = 0; r < M; r++) {
      float *restrict yr = out + r * N;
      for (int64_t n = 0; n < N; n++) yr[n] += bd[n];
    }
  }
  *y = out;
  return GROVE_OK;
}

/* F.normalize(v, dim=-1) of one head's d floats, in place: v / max(|v|, 1e-12). */
static void normalize(float *v, int64_t d) {
  double ss = 0;
  for (int64_t t = 0; t < d; t++) ss += (double)v[t] * v[t];
  const double n = sqrt(ss);
  const float inv = (float)(1.0 / (n > 1e-12 ? n : 1e-12));
  for (int64_t t = 0; t < d; t++) v[t] *= inv;
}

/* Python's [start:stop] of a sequence of len items (stop may be None), as
 * the half-open range it selects. */
static void py_range(int64_t len, int64_t start, bool has_stop, int64_t stop, int64_t *lo,
                     int64_t *hi) {
  if (start < 0) start = start + len < 0 ? 0 : start + len;
  if (start > len) start = len;
  if (!has_stop) stop = len;
  if (stop < 0) stop = stop + len < 0 ? 0 : stop + len;
  if (stop > len) stop = len;
  *lo = start;
  *hi = stop > start ? stop : start;
}

/* The region of every (padded, shifted) position, as torchvision labels
 * it: attn_mask[h0:h1, w0:w1] = count over its three slices per dim
 * ((0, -ws), (-ws, -shift), (-shift, None)), in its order, later
 * assignments winning. */
static void region_ids(int32_t *id, int64_t pH, int64_t pW, const int64_t *ws, const int64_t *sh) {
  memset(id, 0, (size_t)(pH * pW) * sizeof *id);
  const int64_t len[2] = {pH, pW};
  int64_t lo[2][3], hi[2][3];
  for (int d = 0; d < 2; d++) {
    py_range(len[d], 0, true, -ws[d], &lo[d][0], &hi[d][0]);
    py_range(len[d], -ws[d], true, -sh[d], &lo[d][1], &hi[d][1]);
    py_range(len[d], -sh[d], false, 0, &lo[d][2], &hi[d][2]);
  }
  int32_t count = 0;
  for (int a = 0; a < 3; a++)
    for (int b = 0; b < 3; b++, count++)
      for (int64_t i = lo[0][a]; i < hi[0][a]; i++)
        for (int64_t j = lo[1][b]; j < hi[1][b]; j++) id[i * pW + j] = count;
}

/* The windows' rows of one shifted_window_attention call.  Row r = (b nW +
 * w) N + a ws1 + c (batch item b, window w, token (a, c) of the window) is
 * the position (i, j) = ((w / nWw) ws0 + a + sh0) % pH, ((w % nWw) ws1 + c +
 * sh1) % pW of the padded map: torchvision's F.pad, torch.roll by -shift and
 * window partition in one gather, zeros where i >= H or j >= W; and back,
 * torch.roll by +shift and the crop, the same map read the other way. */
typedef struct swa_map {
  int64_t H, W, C, pH, pW, nW, nWw, N, ws0, ws1, sh0, sh1;
  const float *x; /* [B, H, W, C] */
  float *rows;    /* [B nW N, C] */
  float *out;     /* [B, H, W, C] (swa_scatter) */
} swa_map;

/* Row r's position in the unpadded map (i * W + j of its batch item), or -1
 * for padding. */
static int64_t swa_pos(const swa_map *m, int64_t r) {
  const int64_t t = r % m->N, w = r / m->N % m->nW;
  const int64_t i = ((w / m->nWw) * m->ws0 + t / m->ws1 + m->sh0) % m->pH;
  const int64_t j = ((w % m->nWw) * m->ws1 + t % m->ws1 + m->sh1) % m->pW;
  return i < m->H && j < m->W ? i * m->W + j : -1;
}

static void swa_gather(void *ctx, int64_t r0, int64_t r1) {
  const swa_map *m = ctx;
  const size_t bytes = (size_t)m->C * sizeof(float);
  for (int64_t r = r0; r < r1; r++) {
    const int64_t p = swa_pos(m, r), b = r / (m->nW * m->N);
    if (p < 0)
      memset(m->rows + r * m->C, 0, bytes);
    else
      memcpy(m->rows + r * m->C, m->x + (b * m->H * m->W + p) * m->C, bytes);
  }
}

static void swa_scatter(void *ctx, int64_t r0, int64_t r1) {
  const swa_map *m = ctx;
  const size_t bytes = (size_t)m->C * sizeof(float);
  for (int64_t r = r0; r < r1; r++) {
    const int64_t p = swa_pos(m, r), b = r / (m->nW * m->N);
    if (p >= 0) memcpy(m->out + (b * m->H * m->W + p) * m->C, m->rows + r * m->C, bytes);
  }
}

/* The heads of a call: unit u = (window u / heads, head u % heads) over
 * every batch item; slot g of slots takes units [g units / slots, (g + 1)
 * units / slots) with its own scratch (per floats at scratch + g per). */
typedef struct swa_heads {
  const swa_map *map;
  int64_t B, heads, d, units, slots, per;
  const float *Q; /* qkv rows, [M, 3C] */
  float *ctx;     /* [M, C] */
  const float *bias, *lsd;
  const int32_t *id; /* the padded map's regions, NULL when not shifted */
  float *scratch;
  float qscale;
} swa_heads;

static void swa_head_slots(void *vctx, int64_t g0, int64_t g1) {
  const swa_heads *a = vctx;
  const swa_map *m = a->map;
  const int64_t N = m->N, C = m->C, d = a->d, ld = 3 * C;
  const float cap = (float)log(100.0);
  for (int64_t g = g0; g < g1; g++) {
    float *sc = a->scratch + g * a->per, *madd = sc + N * N, *kt = madd + N * N;
    int32_t *wid = (int32_t *)(kt + d * N);
    int64_t wcur = -1;
    for (int64_t u = g * a->units / a->slots; u < (g + 1) * a->units / a->slots; u++) {
      const int64_t w = u / a->heads, h = u % a->heads;
      /* The window's tokens' regions (row-major in the window). */
      if (a->id && w != wcur) {
        const int64_t i0 = (w / m->nWw) * m->ws0, j0 = (w % m->nWw) * m->ws1;
        for (int64_t p = 0; p < m->ws0; p++)
          for (int64_t q = 0; q < m->ws1; q++) wid[p * m->ws1 + q] = a->id[(i0 + p) * m->pW + j0 + q];
      }
      wcur = w;
      const float *bh = a->bias + h * N * N;
      if (a->id) {
        for (int64_t l = 0; l < N; l++)
          for (int64_t t = 0; t < N; t++)
            madd[l * N + t] = bh[l * N + t] + (wid[l] != wid[t] ? -100.0f : 0.0f);
      } else {
        memcpy(madd, bh, (size_t)(N * N) * sizeof(float));
      }
      float scale = a->qscale;
      if (a->lsd) scale = expf(a->lsd[h] < cap ? a->lsd[h] : cap);
      for (int64_t b = 0; b < a->B; b++) {
        const int64_t r0 = (b * m->nW + w) * N;
        const float *q = a->Q + r0 * ld + h * d;
        grove__attend_head(q, ld, q + C, ld, q + 2 * C, ld, a->ctx + r0 * C + h * d, C, N, N, d,
                           scale, madd, N, sc, kt);
      }
    }
  }
}

static grove_status swa_check(const grove__opdef *d, const garg *a, const char *jp,
                              grove_err *err) {
  grove_status s;
  if ((s = window_size_check(&a[4], jp, d->name, "window_size", true, err)) ||
      (s = window_size_check(&a[6], jp, d->name, "shift_size", false, err)))
    return s;
  if (a[5].kind != A_INT || a[5].i < 1 || a[5].i > (1 << 16))
    return grove_err_set(err, GROVE_E_SPEC, "%s: %s's num_heads must be a positive int", jp,
                         d->name);
  for (int k = 7; k <= 8; k++) {
    const double p = a[k].kind == A_FLOAT ? a[k].f : a[k].kind == A_INT ? (double)a[k].i : -1;
    if (p != 0)
      return grove_err_set(err, GROVE_E_UNSUPPORTED,
                           "%s: %s with %s other than 0 drops at random even in eval mode "
                           "(torchvision calls F.dropout without training=); Grove serves eval "
                           "mode: build the model with %s=0.0",
                           jp, d->name, d->p[k].name, d->p[k].name);
  }
  return GROVE_OK;
}

/* Arguments: input [B, H, W, C], qkv_weight [3C, C], proj_weight [C, C],
 * relative_position_bias [..., heads, N, N] (N = ws0 * ws1, leading dims
 * 1), window_size, num_heads, shift_size, attention_dropout, dropout
 * (0: checked), qkv_bias [3C] or None, proj_bias [C] or None, logit_scale
 * (heads numbers: Swin v2's cosine attention) or None. */
static grove_status swa_fwd(const grove__opctx *c, gval *res) {
  static const char *const OP = "shifted_window_attention";
  grove_fwd *f = c->f;
  const grove_tensor *x, *wqkv, *wproj, *rpb, *bqkv = NULL, *bproj = NULL, *ls = NULL;
  int64_t ws[GROVE_MAX_DIMS], sh[GROVE_MAX_DIMS], heads;
  int nws, nsh;
  grove_status s;
  if ((s = grove__op_tensor(c, 0, &x)) || (s = grove__op_tensor(c, 1, &wqkv)) ||
      (s = grove__op_tensor(c, 2, &wproj)) || (s = grove__op_tensor(c, 3, &rpb)) ||
      (s = grove__op_ints(c, &c->args[4], false, ws, &nws)) ||
      (s = grove__op_int(c, &c->args[5], &heads)) ||
      (s = grove__op_ints(c, &c->args[6], false, sh, &nsh)) ||
      (c->args[9].kind != A_NONE && (s = grove__op_tensor(c, 9, &bqkv))) ||
      (c->args[10].kind != A_NONE && (s = grove__op_tensor(c, 10, &bproj))) ||
      (c->args[11].kind != A_NONE && (s = grove__op_tensor(c, 11, &ls))))
    return s;
  if (nws != 2 || nsh != 2)
    return grove_err_set(f->err, GROVE_E_SHAPE,
                         "%s: window_size and shift_size must be of length 2", OP);
  if (x->ndim != 4) return shape_err(f, OP, "input", x, "[B, H, W, C]");
  const int64_t B = x->shape[0], H = x->shape[1], W = x->shape[2], C = x->shape[3];
  char want[96];
  if (heads < 1 || C % heads)
    return grove_err_set(f->err, GROVE_E_SHAPE,
                         "%s: the input's %lld channels do not divide into num_heads=%lld", OP,
                         (long long)C, (long long)heads);
  const int64_t d = C / heads, N = ws[0] * ws[1];
  snprintf(want, sizeof want, "[%lld, %lld]", (long long)(3 * C), (long long)C);
  if (wqkv->ndim != 2 || wqkv->shape[0] != 3 * C || wqkv->shape[1] != C)
    return shape_err(f, OP, "qkv_weight", wqkv, want);
  snprintf(want, sizeof want, "[%lld, %lld]", (long long)C, (long long)C);
  if (wproj->ndim != 2 || wproj->shape[0] != C || wproj->shape[1] != C)
    return shape_err(f, OP, "proj_weight", wproj, want);
  snprintf(want, sizeof want, "[%lld]", (long long)(3 * C));
  if (bqkv && grove_tensor_numel(bqkv) != 3 * C) return shape_err(f, OP, "qkv_bias", bqkv, want);
  snprintf(want, sizeof want, "[%lld]", (long long)C);
  if (bproj && grove_tensor_numel(bproj) != C) return shape_err(f, OP, "proj_bias", bproj, want);
  snprintf(want, sizeof want, "[%lld, 1, 1]", (long long)heads);
  if (ls && grove_tensor_numel(ls) != heads) return shape_err(f, OP, "logit_scale", ls, want);
  snprintf(want, sizeof want, "[1, %lld, %lld, %lld]", (long long)heads, (long long)N,
           (long long)N);
  bool rpb_ok = rpb->ndim >= 3 && grove_tensor_numel(rpb) == heads * N * N &&
                rpb->shape[rpb->ndim - 3] == heads && rpb->shape[rpb->ndim - 2] == N &&
                rpb->shape[rpb->ndim - 1] == N;
  if (!rpb_ok) return shape_err(f, OP, "relative_position_bias", rpb, want);

  /* Pad H and W to multiples of the window; no shift along a dim the
   * window covers. */
  const int64_t pad_r = (ws[1] - W % ws[1]) % ws[1], pad_b = (ws[0] - H % ws[0]) % ws[0];
  const int64_t pH = H + pad_b, pW = W + pad_r;
  const int64_t shift[2] = {ws[0] >= pH ? 0 : sh[0], ws[1] >= pW ? 0 : sh[1]};
  const bool shifted = shift[0] + shift[1] > 0;
  const int64_t nWh = pH / ws[0], nWw = pW / ws[1], nW = nWh * nWw, M = B * nW * N;
  grove_tensor xc;
  if ((s = grove__contig_f32(f, x, &xc))) return s;
  swa_map map = {.H = H, .W = W, .C = C, .pH = pH, .pW = pW, .nW = nW, .nWw = nWw, .N = N,
                 .ws0 = ws[0], .ws1 = ws[1], .sh0 = shift[0], .sh1 = shift[1],
                 .x = xc.data};
  float *xw = grove_arena_alloc(f->arena, (size_t)(M * C) * sizeof(float) + 1);
  if (!xw) return grove__scratch_error(f, OP);
  map.rows = xw;
  grove__parallel_for(B * nW * N, grove__par_grain(C), swa_gather, &map);

  /* Swin v2 zeroes the key third of qkv_bias (on a copy). */
  grove_tensor bq;
  if (ls && bqkv) {
    if ((s = grove__contig_f32(f, bqkv, &bq))) return s;
    float *bd = grove_arena_alloc(f->arena, (size_t)(3 * C) * sizeof(float) + 1);
    if (!bd) return grove__scratch_error(f, OP);
    memcpy(bd, bq.data, (size_t)(3 * C) * sizeof(float));
    memset(bd + C, 0, (size_t)C * sizeof(float));
    const int64_t bs[1] = {3 * C};
    grove_tensor_init(&bq, GROVE_F32, 1, bs, bd);
    bqkv = &bq;
  }
  float *Q;
  if ((s = linear(f, xw, M, C, wqkv, bqkv, &Q))) return s;
  const int64_t ld = 3 * C;

  grove_tensor rb, lsc;
  if ((s = grove__contig_f32(f, rpb, &rb))) return s;
  const float *lsd = NULL;
  if (ls) {
    if ((s = grove__contig_f32(f, ls, &lsc))) return s;
    lsd = lsc.data;
  }
  /* Windows x heads, each with scratch of its own: up to four slots per
   * compute thread, each taking a run of (window, head) units (every
   * output row of a unit is computed alone, so the cut does not change a
   * bit). */
  const int64_t units = nW * heads;
  int64_t slots = grove__attend_head_threads(N, N, d) ? 4 * (int64_t)grove_compute_threads() : 1;
  if (slots > units) slots = units;
  const int64_t per = 2 * N * N + d * N + N; /* sc, madd, kt, wid (as floats) */
  float *ctx = grove_arena_alloc(f->arena, (size_t)(M * C) * sizeof(float) + 1);
  float *scratch = grove_arena_alloc(f->arena, (size_t)(slots * per) * sizeof(float) + 1);
  int32_t *id =
      shifted ? grove_arena_alloc(f->arena, (size_t)(pH * pW) * sizeof(int32_t) + 1) : NULL;
  if (!ctx || !scratch || (shifted && !id)) return grove__scratch_error(f, OP);
  if (shifted) region_ids(id, pH, pW, ws, shift);
  if (ls) /* cosine attention: q and k of every head normalised */
    for (int64_t r = 0; r < M; r++)
      for (int64_t h = 0; h < heads; h++) {
        normalize(Q + r * ld + h * d, d);
        normalize(Q + r * ld + C + h * d, d);
      }
  swa_heads hp = {.map = &map, .B = B, .heads = heads, .d = d, .units = units, .slots = slots,
                  .per = per, .Q = Q, .ctx = ctx, .bias = rb.data, .lsd = lsd, .id = id,
                  .scratch = scratch, .qscale = (float)pow((double)d, -0.5)};
  grove__parallel_for(slots, 1, swa_head_slots, &hp);

  float *y;
  if ((s = linear(f, ctx, M, C, wproj, bproj, &y))) return s;
  /* Windows back, unshifted and cropped: each row to the position it came
   * from. */
  const int64_t full[4] = {B, H, W, C};
  grove_tensor yc;
  if ((s = grove_fwd_alloc(f, &yc, GROVE_F32, 4, full))) return s;
  map.rows = y;
  map.out = yc.data;
  grove__parallel_for(B * nW * N, grove__par_grain(C), swa_scatter, &map);
  grove__op_set_tensor(res, &yc);
  return GROVE_OK;
}

/* ------------------------------------------------------------ entries */

const grove__opdef grove__opdef_patch_merging_pad = {
    .name = "patch_merging_pad",
    .id = G_OP,
    .torch =
        (const char *const[]){"torchvision.models.swin_transformer._patch_merging_pad(x)", NULL},
    .varargs = -1,
    .p = {TENSOR("x")},
    .forward = patch_merging_pad_fwd,
};

const grove__opdef grove__opdef_get_relative_position_bias = {
    .name = "get_relative_position_bias",
    .id = G_OP,
    .torch = (const char *const[]){"torchvision.models.swin_transformer._get_relative_position_"
                                   "bias(relative_position_bias_table,relative_position_index,"
                                   "window_size)",
                                   NULL},
    .varargs = -1,
    .p = {TENSOR("relative_position_bias_table"),
          {.name = "relative_position_index",
           .kind = P_TENSOR,
           .dk = D_REQ,
           .dtypes = (1u << GROVE_I64) | (1u << GROVE_I32)},
          OP_REQ("window_size", P_INTS)},
    .check = relative_position_bias_check,
    .forward = relative_position_bias_fwd,
};

const grove__opdef grove__opdef_shifted_window_attention = {
    .name = "shifted_window_attention",
    .id = G_OP,
    .torch = (const char *const[]){"torchvision.models.swin_transformer.shifted_window_attention("
                                   "input,qkv_weight,proj_weight,relative_position_bias,window_"
                                   "size,num_heads,shift_size,attention_dropout,dropout,qkv_bias,"
                                   "proj_bias,logit_scale)",
                                   NULL},
    .varargs = -1,
    .p = {TENSOR("input"), TENSOR("qkv_weight"), TENSOR("proj_weight"),
          TENSOR("relative_position_bias"), OP_REQ("window_size", P_INTS),
          OP_REQ("num_heads", P_INT), OP_REQ("shift_size", P_INTS),
          OP_FLOAT("attention_dropout", 0.0), OP_FLOAT("dropout", 0.0), OPT_TENSOR("qkv_bias"),
          OPT_TENSOR("proj_bias"), OPT_TENSOR("logit_scale")},
    .check = swa_check,
    .forward = swa_fwd,
};
