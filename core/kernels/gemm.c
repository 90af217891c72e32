/* gemm.c: the matrix product behind Linear, y = act(x . W^T + b), and the
 * general products training uses (grove__gemm): dispatch and the public
 * entries (gemm_internal.h says how the GEMM's files share the work).
 *
 * Three kernels, chosen once per pack when weights are loaded (gemm_pack.c):
 *
 *  - AVX-512 (x86-64 with avx512f, checked at run time): register tiles of
 *    MR x 64 outputs over W's column panels (gemm_avx512.c), bias and ReLU
 *    applied while a tile is still in registers, so y is written exactly
 *    once.  The same kernel serves batch 1 (one row; the weights then stream
 *    from cache once per forward, which is all a matrix-vector product can
 *    do).
 *  - AVX2 (x86-64 with avx2 and fma but not avx512f, or GROVE_GEMM=avx2):
 *    the same panels computed in 16-column strips (gemm_avx2.c).
 *  - BLAS (anything else, or GROVE_GEMM=blas): cblas_sgemv or cblas_sgemm,
 *    then bias and ReLU (gemm_blas.c).
 *
 * Threads: a product with enough work is cut into chunks (runs of panels
 * over all rows, or for a layer with fewer panels than threads groups of
 * rows over all panels) that grove__parallel_for spreads over the compute
 * threads (threadpool.c); each output element is computed by one chunk with
 * the same arithmetic whatever the cut, so the results are the same, bit for
 * bit, with any number of threads. */
#include <assert.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "gemm_internal.h"

#define NR GROVE__GEMM_NR
#define MR GROVE__GEMM_MR
#define KC GROVE__GEMM_KC

/* Below this many multiply-adds a product is not worth a hand-off (about a
 * microsecond when the helper is spinning). */
#define MIN_THREADED_MACS (128 * 1024)

/* ================================================================ Linear */

#if GROVE__X86_SIMD

/* Rows [r0, r1) x panels [p0, p1) of one product, blocked for the caches
 * (y's rows ldy >= N floats apart; the activation act, if any, applied to
 * each tile after its last K block):
 *
 *  - A long K is cut into blocks of at most KC (kc depends on K alone), so
 *    that the block of a panel (kc x 64 floats, at most 256 KB) stays in L2
 *    while the rows pass over it; the partial sums go through y, and bias
 *    and ReLU come with the last block.
 *  - Rows go in blocks of mc, whose kc-wide slice of x (X_BLOCK_BYTES) stays
 *    in L2 while every panel's block of that k range passes over it, so the
 *    weight is read once per block of rows and x once in all (768 KB: a
 *    ViT-B's 197 token rows, K 768 or 3,072, are one block; at 256 KB of
 *    whole rows its 9.4 MB MLP weights were read from L3 3 to 11 times).  mc is set by
 *    kc, not K: set by K, a 3x3 convolution's patch rows (K 4,608, ResNet-50's
 *    layer4) went 12 rows a block, and its 9.4 MB weight streamed from L3
 *    five times for the 49 rows of an image (2.3x ONNX Runtime's time on that
 *    layer); a transformer's 2,048 token rows at batch 16 would otherwise read
 *    all of x from memory once per panel.
 *
 * Each output element is the same sequence of tile calls (block kb of K
 * after block kb - 1, through y) whatever the blocking of rows and panels
 * and whichever tile height covers it, so the bits do not depend on M, on
 * the cut into chunks, or on the thread count. */
static void packed_part(const grove__linear_pack *p, const float *x, const float *bias, float *y,
                        int64_t ldy, grove__act act, int64_t r0, int64_t r1, int64_t p0, int64_t p1) {
  enum { X_BLOCK_BYTES = 768 * 1024, PREFETCH_BYTES = 256 * 1024 };
  const int64_t N = p->N, K = p->K;
  const bool avx2 = p->kind == GROVE__GEMM_KIND_AVX2;
  const int64_t kblocks = K > KC ? (K + KC - 1) / KC : 1;
  const int64_t kc = (K + kblocks - 1) / kblocks;
  int64_t mc = X_BLOCK_BYTES / ((kc > 0 ? kc : 1) * (int64_t)sizeof(float));
  mc = mc < MR ? MR : mc - mc % MR;
  /* ReLU, ReLU6 (MobileNetV2's 1x1 convolutions), Hardswish and
   * Hardsigmoid (MobileNetV3's) are the tiles' own epilogue.  Any other
   * activation (GELU after a transformer's first MLP Linear) is applied to
   * each tile's rows right after the tile's last K block wrote them, while
   * they are in L1, instead of in a pass of its own over y. */
  const int act_flag = act == GROVE__ACT_RELU          ? GROVE__TILE_RELU
                       : act == GROVE__ACT_RELU6       ? GROVE__TILE_RELU6
                       : act == GROVE__ACT_HARDSWISH   ? GROVE__TILE_HARDSWISH
                       : act == GROVE__ACT_HARDSIGMOID ? GROVE__TILE_HARDSIGMOID
                                                       : 0;
  const grove__act post = act_flag ? GROVE__ACT_NONE : act;
  /* Prefetching the next block (below) pays for a weight of 256 KB or
   * more: a forward's weights pass through L2 once each, so such a weight
   * comes from L3 (ResNet-50's layer4, 2 to 9.4 MB, took 13-19% less time
   * with it; layer3's Winograd 3x3, sixteen 256 KB products, 20-30% less
   * than with the bound at 1 MB).  Smaller ones (the stem's 37 KB, reused
   * by thousands of rows) keep the plain tiles and their one load less. */
  const bool pf_on = !avx2 && (double)N * (double)K * sizeof(float) >= (double)PREFETCH_BYTES;
  for (int64_t rb = r0; rb < r1; rb += mc) {
    const int64_t re = r1 - rb < mc ? r1 : rb + mc;
    for (int64_t kb = 0; kb < kblocks; kb++) {
      const int64_t k0 = kb * kc, kn = K - k0 < kc ? K - k0 : kc;
      const bool last = kb == kblocks - 1;
      const int flags = (kb > 0 ? GROVE__TILE_ACCUMULATE : 0) | (last ? act_flag : 0);
      for (int64_t pi = p0; pi < p1; pi++) {
        grove__yield_point();
        const int w = grove__gemm_panel_width(N, pi);
        const int64_t n0 = pi * NR;
        const int ncols = (int)(N - n0 < NR ? N - n0 : NR);
        const float *B = p->data + pi * K * NR;
        const float *bp = bias && last ? bias + n0 : NULL;
        /* The block the tiles read next (the next panel's, or the next k
         * range's first), which the tiles of this one prefetch a line per k
         * step, in turn: otherwise each block's first tile waited on L3. */
        const char *next = NULL;
        int64_t next_bytes = 0;
        if (pf_on) {
          const int64_t npi = pi + 1 < p1 ? pi + 1 : p0;
          const int64_t nkb = pi + 1 < p1 ? kb : kb + 1 < kblocks ? kb + 1 : 0;
          const int64_t nk0 = nkb * kc, nw = grove__gemm_panel_width(N, npi);
          next = (const char *)(p->data + npi * K * NR + nk0 * nw);
          next_bytes = (K - nk0 < kc ? K - nk0 : kc) * nw * (int64_t)sizeof(float);
        }
        for (int64_t i = rb, t = 0; i < re; i += MR, t++) {
          const int mr = (int)(re - i < MR ? re - i : MR);
          if (avx2) {
            grove__gemm_tiles2[mr - 1][w / 16 - 1](kn, x + i * K + k0, K, B + k0 * 16, K * 16, bp,
                                                   y + i * ldy + n0, ldy, ncols, flags);
          } else {
            /* Tile t takes lines [t * kn, (t + 1) * kn) of the next block;
             * the tiles past its end prefetch nothing. */
            const int64_t off = t * kn * 64;
            const int pf = off < next_bytes;
            grove__gemm_tiles512[pf][mr - 1][w / 16 - 1](kn, x + i * K + k0, K, B + k0 * w,
                                                         pf ? next + off : NULL, bp,
                                                         y + i * ldy + n0, ldy, ncols, flags);
          }
          if (last && post != GROVE__ACT_NONE)
            for (int r = 0; r < mr; r++)
              grove__act_apply(post, y + (i + r) * ldy + n0, y + (i + r) * ldy + n0, ncols);
        }
      }
    }
  }
}

/* One product cut into chunks for grove__parallel_for: a run of
 * panels_per_chunk panels over all rows, or with row_groups > 0 one panel
 * over rows_per_chunk rows (a multiple of MR): chunk c is panel c % npanels
 * of row group c / npanels. */
typedef struct linear_job {
  const grove__linear_pack *p;
  const float *x, *bias;
  float *y;
  int64_t M, ldy;
  grove__act act;
  grove__linear_cut cut;
} linear_job;

static void linear_chunks(void *ctx, int64_t begin, int64_t end) {
  const linear_job *jb = ctx;
  const grove__linear_pack *p = jb->p;
  const grove__linear_cut *cut = &jb->cut;
  for (int64_t c = begin; c < end; c++) {
    if (cut->row_groups) {
      const int64_t pi = c % p->npanels;
      const int64_t r0 = c / p->npanels * cut->rows_per_chunk;
      const int64_t r1 = r0 + cut->rows_per_chunk < jb->M ? r0 + cut->rows_per_chunk : jb->M;
      packed_part(p, jb->x, jb->bias, jb->y, jb->ldy, jb->act, r0, r1, pi, pi + 1);
    } else {
      const int64_t q0 = c * cut->panels_per_chunk;
      const int64_t q1 =
          q0 + cut->panels_per_chunk < p->npanels ? q0 + cut->panels_per_chunk : p->npanels;
      packed_part(p, jb->x, jb->bias, jb->y, jb->ldy, jb->act, 0, jb->M, q0, q1);
    }
  }
}
#endif /* GROVE__X86_SIMD */

/* kernels.h.  About four chunks per thread, so that a late helper still
 * finds work and a slow one does not hold up the end.  With that many
 * panels, runs of panels over all rows (each panel's weights read by one
 * thread); with fewer, each panel is also cut into row groups: by panels
 * alone, Linear(384, 96) (a 64- and a 32-wide panel) gave one of two
 * threads twice the other's work, and a one-panel layer a single chunk. */
grove__linear_cut grove__linear_cut_plan(const grove__linear_pack *p, int64_t M, int threads) {
  /* The pool's claim word counts at most 65535 chunks. */
  enum { MAX_CHUNKS = 0xFFFF };
  grove__linear_cut cut = {0};
  const int64_t want = 4 * (int64_t)threads, blocks = (M + MR - 1) / MR;
  if (p->npanels >= want || blocks <= 1) {
    cut.panels_per_chunk = (p->npanels + MAX_CHUNKS - 1) / MAX_CHUNKS;
    cut.chunks = (p->npanels + cut.panels_per_chunk - 1) / cut.panels_per_chunk;
    return cut;
  }
  int64_t groups = (want + p->npanels - 1) / p->npanels;
  if (groups > blocks) groups = blocks;
  /* With a panel for every thread, a panel is cut only into groups of four
   * tiles or more: each group reads the panel's weights again, which for a
   * few rows (a batch of 7) would double what a weight-bound product reads. */
  if (p->npanels >= threads && groups > blocks / 4) groups = blocks / 4;
  if (groups <= 1) {
    cut.panels_per_chunk = 1;
    cut.chunks = p->npanels;
    return cut;
  }
  const int64_t per = (blocks + groups - 1) / groups;
  cut.rows_per_chunk = per * MR;
  cut.row_groups = (blocks + per - 1) / per;
  cut.chunks = cut.row_groups * p->npanels;
  return cut;
}

#if GROVE__X86_SIMD
/* Runs one product over the compute threads. */
static void linear_threaded(int threads, const grove__linear_pack *p, const float *x, int64_t M,
                            const float *bias, float *y, int64_t ldy, grove__act act) {
  linear_job jb = {.p = p, .x = x, .bias = bias, .y = y, .M = M, .ldy = ldy, .act = act};
  jb.cut = grove__linear_cut_plan(p, M, threads);
  grove__parallel_for(jb.cut.chunks, 1, linear_chunks, &jb);
}
#endif /* GROVE__X86_SIMD */

/* The BLAS path's activation: ReLU in gemm_blas.c, any other over y after
 * the product. */
static void blas_linear(const grove__linear_pack *p, const float *x, int64_t M, const float *bias,
                        float *y, grove__act act) {
  grove__gemm_blas_linear(p, x, M, bias, y, act == GROVE__ACT_RELU);
  if (act != GROVE__ACT_RELU) grove__act_apply(act, y, y, M * p->N);
}

void grove__linear_run(const grove__linear_pack *p, const float *x, int64_t M, const float *bias,
                       float *y, grove__act act) {
  assert(p);
  grove__linear_run_ld(p, x, M, bias, y, p->N, act);
}

void grove__linear_run_ld(const grove__linear_pack *p, const float *x, int64_t M,
                          const float *bias, float *y, int64_t ldy, grove__act act) {
  assert(p && M >= 0 && ldy >= p->N);
  if (M == 0 || p->N == 0) return;
  if (p->kind == GROVE__GEMM_KIND_BLAS) {
    assert(ldy == p->N);
    blas_linear(p, x, M, bias, y, act);
    return;
  }
#if GROVE__X86_SIMD
  int threads = grove_compute_threads();
  double macs = (double)M * (double)p->N * (double)p->K;
  if (threads > 1 && macs >= MIN_THREADED_MACS && (p->npanels > 1 || M > MR)) {
    linear_threaded(threads, p, x, M, bias, y, ldy, act);
    return;
  }
  packed_part(p, x, bias, y, ldy, act, 0, M, 0, p->npanels);
#endif
}

void grove__linear_run_alone(const grove__linear_pack *p, const float *x, int64_t M,
                             const float *bias, float *y, grove__act act) {
  grove__linear_run_alone_ld(p, x, M, bias, y, p->N, act);
}

void grove__linear_run_alone_ld(const grove__linear_pack *p, const float *x, int64_t M,
                                const float *bias, float *y, int64_t ldy, grove__act act) {
  assert(p && M >= 0 && ldy >= p->N);
  if (M == 0 || p->N == 0) return;
  if (p->kind == GROVE__GEMM_KIND_BLAS) {
    assert(ldy == p->N);
    blas_linear(p, x, M, bias, y, act);
    return;
  }
#if GROVE__X86_SIMD
  packed_part(p, x, bias, y, ldy, act, 0, M, 0, p->npanels);
#endif
}

/* ================================================================ general products */

/* grove__gemm (kernels.h): C = op(A) . op(B) (+ C) for operands that change
 * at every call, as training's do.  The AVX-512 path packs op(B) into the
 * panels of the Linear kernel (into the caller's workspace, so nothing is
 * allocated) and runs the same register tiles over it (gtile: tile() without
 * bias and ReLU, adding C at the end), giving op(A) to them as rows,
 * transposed first when its rows are not contiguous; the packing is
 * O(NK + MK) against O(MNK) of arithmetic.  When op(B) is the large operand
 * and would need a transposing pack (y = x . W^T: B is the weight, M the
 * batch), the product is computed the other way round, C^T = op(B)^T .
 * op(A)^T: W's rows are then the tiles' rows as they are, only x is packed,
 * and the [N, M] result is transposed into C.  The BLAS path is one
 * cblas_sgemm. */

/* Rows of the tiles' output per chunk (at most: gemm_avx512 halves it for a
 * product with few chunks), and rows of op(B) per unit of a transposing
 * pack. */
enum { GEMM_ROWS_PER_CHUNK = 16 * MR, PACK_T_ROWS = 64 };

/* What the AVX-512 path does for these arguments. */
typedef struct gemm_plan {
  bool swap;          /* computes C^T = op(B)^T . op(A)^T into scratch */
  bool pack_a;        /* the tiles' rows need a transposed copy */
  int64_t rows, cols; /* the tiles' product: [rows, cols] over depth */
  int64_t depth;
  int64_t npanels;
  size_t pack_floats; /* the packed right-hand side */
  size_t a_floats;    /* the rows' copy, when pack_a */
  size_t out_floats;  /* the [N, M] result, when swap */
} gemm_plan;

static gemm_plan gemm_plan_make(int flags, int64_t M, int64_t N, int64_t K) {
  gemm_plan pl = {0};
  const bool ta = flags & GROVE__GEMM_TRANS_A, tb = flags & GROVE__GEMM_TRANS_B;
  /* Swapped, op(B)^T is B as stored when tb, and op(A)^T packs from A
   * whatever ta is; so swapping pays when tb and B is the larger side. */
  pl.swap = tb && N > M;
  pl.rows = pl.swap ? N : M;
  pl.cols = pl.swap ? M : N;
  pl.depth = K;
  pl.pack_a = !pl.swap && ta;
  pl.npanels = (pl.cols + NR - 1) / NR;
  pl.pack_floats = (size_t)pl.npanels * NR * (size_t)K;
  pl.a_floats = pl.pack_a ? (size_t)M * (size_t)K : 0;
  pl.out_floats = pl.swap ? (size_t)M * (size_t)N : 0;
  return pl;
}

/* Floats rounded up to whole 64-byte lines, so that each region of the
 * workspace starts aligned. */
static size_t gemm_lines(size_t floats) {
  return (floats + 15) / 16 * 16;
}

size_t grove__gemm_ws_size(int flags, int64_t M, int64_t N, int64_t K) {
  if (M <= 0 || N <= 0 || K <= 0 || grove__gemm_kind() != GROVE__GEMM_KIND_AVX512) return 0;
  gemm_plan pl = gemm_plan_make(flags, M, N, K);
  return (gemm_lines(pl.pack_floats) + gemm_lines(pl.a_floats) + gemm_lines(pl.out_floats)) *
         sizeof(float);
}

#if GROVE__X86_SIMD

typedef struct gemm_job {
  gemm_plan pl;
  /* The tiles' operands: rows of a (row i at a + i * lda, contiguous over
   * depth), the packed right-hand side, the output c (row i at c + i * ldc). */
  const float *a;
  int64_t lda;
  float *pack;
  float *c;
  int64_t ldc;
  bool accumulate;
  /* Packing: op(B) as given (pack_rows, or pack_panel_t when tb) in bunits
   * units (16 rows, or panels), then op(A) when pack_a. */
  const float *b;
  int64_t ldb;
  bool tb;
  const float *a_src;
  int64_t a_src_ld;
  float *a_copy;
  int64_t bunits;
  int64_t rpc; /* rows per chunk, a multiple of MR */
} gemm_job;

static void gemm_pack_fn(void *ctx, int64_t begin, int64_t end) {
  gemm_job *j = ctx;
  const int64_t K = j->pl.depth;
  for (int64_t i = begin; i < end; i++) {
    grove__yield_point();
    if (i < j->bunits && j->tb) {
      /* Units of PACK_T_ROWS rows of a panel, so that a batch's one panel
       * (y = x W^T swapped) still spreads over the threads. */
      const int64_t per = (K + PACK_T_ROWS - 1) / PACK_T_ROWS;
      const int64_t k0 = i % per * PACK_T_ROWS, k1 = k0 + PACK_T_ROWS < K ? k0 + PACK_T_ROWS : K;
      grove__gemm_pack_panel_t(j->b, j->ldb, j->pl.cols, K, i / per, k0, k1, j->pack);
    } else if (i < j->bunits) {
      int64_t k0 = i * 16, k1 = k0 + 16 < K ? k0 + 16 : K;
      grove__gemm_pack_rows(j->b, j->ldb, j->pl.cols, K, j->pl.npanels, k0, k1, j->pack);
    } else {
      /* op(A) = A^T, A stored [K, M]: its rows 16 (i - bunits) .. as
       * columns of the copy [M, K]. */
      int64_t k0 = (i - j->bunits) * 16;
      int64_t k1 = k0 + 16 < j->pl.depth ? k0 + 16 : j->pl.depth;
      grove__gemm_transpose_rows(j->a_src, j->a_src_ld, k0, k1, j->pl.rows, j->a_copy, j->pl.depth,
                                 false);
    }
  }
}

/* Chunk c: rows [rpc * (c / npanels), ...) x panel c % npanels, so that
 * consecutive chunks on one thread reuse the same rows of a from L2.  K is
 * cut into blocks as in packed_part. */
static void gemm_tiles_fn(void *ctx, int64_t begin, int64_t end) {
  const gemm_job *j = ctx;
  const int64_t R = j->pl.rows, N = j->pl.cols, K = j->pl.depth;
  const int64_t kblocks = K > KC ? (K + KC - 1) / KC : 1;
  const int64_t kc = (K + kblocks - 1) / kblocks;
  for (int64_t c = begin; c < end; c++) {
    grove__yield_point();
    const int64_t pi = c % j->pl.npanels;
    const int64_t r0 = c / j->pl.npanels * j->rpc;
    const int64_t r1 = r0 + j->rpc < R ? r0 + j->rpc : R;
    const int w = grove__gemm_panel_width(N, pi);
    const int64_t n0 = pi * NR;
    const int ncols = (int)(N - n0 < NR ? N - n0 : NR);
    const float *B = j->pack + pi * K * NR;
    for (int64_t kb = 0; kb < kblocks; kb++) {
      const int64_t k0 = kb * kc, kn = K - k0 < kc ? K - k0 : kc;
      const bool add = kb > 0 || j->accumulate;
      for (int64_t i = r0; i < r1; i += MR) {
        int mr = (int)(r1 - i < MR ? r1 - i : MR);
        grove__gemm_gtiles[mr - 1][w / 16 - 1](kn, j->a + i * j->lda + k0, j->lda, B + k0 * w,
                                               j->c + i * j->ldc + n0, j->ldc, ncols, add);
      }
    }
  }
}

typedef struct gemm_out_job {
  const float *src; /* [N, M] */
  float *c;
  int64_t M, N, ldc;
  bool accumulate;
} gemm_out_job;

/* Rows [begin, end) of the [N, M] result into columns of C. */
static void gemm_out_fn(void *ctx, int64_t begin, int64_t end) {
  const gemm_out_job *o = ctx;
  grove__gemm_transpose_rows(o->src, o->M, begin, end, o->M, o->c, o->ldc, o->accumulate);
}

static void gemm_avx512(int flags, int64_t M, int64_t N, int64_t K, const float *A, int64_t lda,
                        const float *B, int64_t ldb, float *C, int64_t ldc, void *ws) {
  const bool ta = flags & GROVE__GEMM_TRANS_A, tb = flags & GROVE__GEMM_TRANS_B;
  const bool acc = flags & GROVE__GEMM_ACCUMULATE;
  gemm_job j = {.pl = gemm_plan_make(flags, M, N, K)};
  float *p = ws;
  j.pack = p;
  p += gemm_lines(j.pl.pack_floats);
  if (j.pl.swap) {
    /* C^T [N, M] = op(B)^T . op(A)^T: the tiles' rows are B's rows as
     * stored (tb), the right-hand side is op(A)^T, whose element (k, m) is
     * A[m * lda + k] (a transposing pack) or, with ta, A[k * lda + m]. */
    j.a = B;
    j.lda = ldb;
    j.b = A;
    j.ldb = lda;
    j.tb = !ta;
    j.c = p + gemm_lines(j.pl.a_floats);
    j.ldc = M;
    j.accumulate = false;
  } else {
    j.b = B;
    j.ldb = ldb;
    j.tb = tb;
    j.c = C;
    j.ldc = ldc;
    j.accumulate = acc;
    if (j.pl.pack_a) {
      j.a_src = A;
      j.a_src_ld = lda;
      j.a_copy = p;
      j.a = p;
      j.lda = K;
    } else {
      j.a = A;
      j.lda = lda;
    }
  }
  const int threads = grove_compute_threads();
  const bool par = threads > 1 && (double)M * (double)N * (double)K >= MIN_THREADED_MACS;
  j.bunits = j.tb ? j.pl.npanels * ((K + PACK_T_ROWS - 1) / PACK_T_ROWS) : (K + 15) / 16;
  const int64_t packs = j.bunits + (j.pl.pack_a ? (K + 15) / 16 : 0);
  /* Fewer rows per chunk when the product has few chunks (one panel, or
   * few rows), so that about eight per thread keep the threads even. */
  j.rpc = GEMM_ROWS_PER_CHUNK;
  while (par && j.rpc > MR && (j.pl.rows + j.rpc - 1) / j.rpc * j.pl.npanels < 8 * threads)
    j.rpc /= 2;
  const int64_t chunks = (j.pl.rows + j.rpc - 1) / j.rpc * j.pl.npanels;
  if (par) {
    grove__parallel_for(packs, 1, gemm_pack_fn, &j);
    grove__parallel_for(chunks, 1, gemm_tiles_fn, &j);
  } else {
    gemm_pack_fn(&j, 0, packs);
    gemm_tiles_fn(&j, 0, chunks);
  }
  if (j.pl.swap) {
    gemm_out_job o = {.src = j.c, .c = C, .M = M, .N = N, .ldc = ldc, .accumulate = acc};
    if (par)
      grove__parallel_for(N, 64, gemm_out_fn, &o);
    else
      gemm_out_fn(&o, 0, N);
  }
}

#endif /* GROVE__X86_SIMD */

void grove__gemm(int flags, int64_t M, int64_t N, int64_t K, const float *A, int64_t lda,
                 const float *B, int64_t ldb, float *C, int64_t ldc, void *ws, size_t ws_bytes) {
  assert(M >= 0 && N >= 0 && K >= 0);
  const bool acc = flags & GROVE__GEMM_ACCUMULATE;
  if (M == 0 || N == 0) return;
  if (K == 0) {
    if (!acc)
      for (int64_t i = 0; i < M; i++) memset(C + i * ldc, 0, (size_t)N * sizeof(float));
    return;
  }
#if GROVE__X86_SIMD
  /* The size is checked rather than trusted: GROVE_GEMM may have changed
   * since the caller asked for it. */
  const size_t need = grove__gemm_ws_size(flags, M, N, K);
  if (ws && need > 0 && ws_bytes >= need) {
    gemm_avx512(flags, M, N, K, A, lda, B, ldb, C, ldc, ws);
    return;
  }
#endif
  (void)ws;
  (void)ws_bytes;
  grove__gemm_blas(flags, M, N, K, A, lda, B, ldb, C, ldc);
}
