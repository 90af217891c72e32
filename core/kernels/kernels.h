/* kernels.h: core/kernels/, the compute kernels under the layers: the GEMM
 * kernels and their packs (gemm*.c, gemm_internal.h), CPU detection (cpu.c),
 * the compute thread pool (grove__parallel_for, threadpool.c), arena
 * compaction (arena_keep.c), the NCHW/NHWC transposes (transpose.c), a
 * convolution's patches (im2col.c), the Winograd transforms (winograd.c)
 * the depthwise convolution (depthwise.c), the elementwise activations
 * (activation.c), the vector exp (simd_exp.h) and the vector Hardswish and
 * Hardsigmoid (simd_act.h).
 * Never installed (tests and bench/ may include it). */
#ifndef GROVE_CORE_KERNELS_H
#define GROVE_CORE_KERNELS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "grove/grove.h"
#include "tensor_internal.h"

/* Whether this compiler builds the x86 vector paths (AVX-512, AVX2) beside
 * the portable loops; which of them runs is grove__cpu_avx512 /
 * grove__cpu_avx2's answer (cpu.c: GROVE_GEMM=avx2 turns AVX-512 off). */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define GROVE__X86_SIMD 1
#else
#define GROVE__X86_SIMD 0
#endif

/* For a plain C loop over channels whose every element is computed alone
 * (no sum across lanes, so the same bits at any vector width): GCC compiles
 * the function for AVX-512, AVX2 and the baseline and picks one at load
 * time (an ifunc), so the loop is vectorised 16 or 8 wide without
 * intrinsics.  The pools' and epilogues' per-channel loops use it.  Not
 * under ThreadSanitizer: the ifunc's resolver runs while the dynamic loader
 * relocates, before TSan's runtime is set up, and its instrumented entry
 * crashed every SAN=thread binary before main. */
#if GROVE__X86_SIMD && defined(__GNUC__) && !defined(__clang__) && defined(__linux__) && \
    !defined(__SANITIZE_THREAD__)
#define GROVE__CHANNEL_LOOP __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define GROVE__CHANNEL_LOOP
#endif

/* ------------------------------------------------------------ linear kernel */

/* The GEMM behind Linear: y[M,N] = act(x[M,K] . W^T + b), W in torch's
 * [N,K] row-major layout.  A pack is built from W once, when weights are
 * loaded (refresh), in whatever layout the kernel runs fastest; it copies W,
 * so W may go away afterwards.  run() may be called from any number of
 * threads at once on one pack; it never allocates. */
typedef enum grove__act {
  GROVE__ACT_NONE = 0,
  GROVE__ACT_RELU = 1,
  /* ReLU is applied inside the linear kernels' register tiles; these by
   * grove__act_apply, in a convolution's epilogue or on each tile of a
   * Linear's output right after the tile is written. */
  GROVE__ACT_RELU6,
  GROVE__ACT_HARDSWISH,
  GROVE__ACT_HARDSIGMOID,
  GROVE__ACT_SILU,
  GROVE__ACT_SIGMOID,
  /* The exact GELU, 0.5 x (1 + erf(x / sqrt 2)) (torch's approximate='none'). */
  GROVE__ACT_GELU,
} grove__act;

/* y[i] = act(x[i]) for n floats (x == y allowed; NONE leaves y alone), with
 * torch's formulas; SiLU and Sigmoid with simd_exp.h's exp on AVX-512 /
 * AVX2 (each element by the same code wherever it falls in the run).  The
 * one implementation behind the activation ops and the convolutions' fused
 * epilogues (activation.c).  Pure, any thread. */
void grove__act_apply(grove__act act, const float *x, float *y, int64_t n);
/* y[i] = act(y[i] + res[i]) for n floats: a residual block's add (and its
 * ReLU) applied by the convolution before it, in the stage that writes the
 * output (torch's order: the sum rounded first, then the activation).
 * Pure, any thread. */
void grove__act_add(grove__act act, float *y, const float *res, int64_t n);
/* The same in place over n floats, cut between the compute threads (each
 * element alone: the same bits at any thread count).  The forward's
 * thread. */
void grove__act_inplace_par(grove__act act, float *y, int64_t n);

typedef struct grove__linear_pack grove__linear_pack;

/* NULL when out of memory. */
grove__linear_pack *grove__linear_pack_new(const float *W, int64_t N, int64_t K);
void grove__linear_pack_free(grove__linear_pack *p);
/* bias may be NULL.  x is [M,K] contiguous, y is [M,N] contiguous.  act is
 * applied to every output, the same bits as grove__act_apply over y after
 * the product. */
void grove__linear_run(const grove__linear_pack *p, const float *x, int64_t M, const float *bias,
                       float *y, grove__act act);
/* The same with the rows of y ldy >= N floats apart (a native pack only
 * when ldy > N): a convolution writing its rows straight into its
 * channels-last output, or its channels of a cat's buffer. */
void grove__linear_run_ld(const grove__linear_pack *p, const float *x, int64_t M,
                          const float *bias, float *y, int64_t ldy, grove__act act);

/* How grove__linear_run cuts a product of M rows over `threads` compute
 * threads (gemm.c): chunks chunks, each a run of panels_per_chunk 64-wide
 * panels over all rows, or, when row_groups > 0, one panel over
 * rows_per_chunk rows (the last group shorter).  For tests and benchmarks;
 * any thread. */
typedef struct grove__linear_cut {
  int64_t chunks, panels_per_chunk, row_groups, rows_per_chunk;
} grove__linear_cut;
grove__linear_cut grove__linear_cut_plan(const grove__linear_pack *p, int64_t M, int threads);

/* grove__linear_run on the calling thread alone: for the fn of a
 * grove__parallel_for, whose chunks are already spread over the compute
 * threads (a convolution computes each block of its output positions from
 * patch rows to epilogue in one chunk, in cache).  Call it there only on a
 * pack for which grove__linear_pack_native is true: a BLAS pack calls
 * OpenBLAS, whose own threads must not run inside the pool's chunks.  Any
 * thread; the same results, bit for bit, as grove__linear_run. */
void grove__linear_run_alone(const grove__linear_pack *p, const float *x, int64_t M,
                             const float *bias, float *y, grove__act act);
/* The same with the rows of y ldy >= N floats apart (a convolution writing
 * its channels of a wider channels-last buffer: graph.c's cat slices); a
 * native pack only when ldy > N. */
void grove__linear_run_alone_ld(const grove__linear_pack *p, const float *x, int64_t M,
                                const float *bias, float *y, int64_t ldy, grove__act act);
/* Whether p runs Grove's own kernel (AVX-512 or AVX2), not OpenBLAS. */
bool grove__linear_pack_native(const grove__linear_pack *p);
/* Whether Grove's AVX-512 code (outside the packs: the convolutions'
 * transforms, attention's loops) may run: the CPU has avx512f and
 * GROVE_GEMM is not "avx2", which makes the process behave as an AVX2-only
 * CPU throughout (tests and benchmarks of that path on an AVX-512 host).
 * Read once per process (cpu.c).  Any thread. */
bool grove__cpu_avx512(void);
/* Whether the CPU has AVX2 and FMA (GROVE_GEMM does not matter).  Read once
 * per process.  Any thread. */
bool grove__cpu_avx2(void);
/* The kernel p runs: "avx512", "avx2" or "blas" (a static string; tests and
 * logs).  Any thread. */
const char *grove__linear_pack_kernel(const grove__linear_pack *p);

/* Runs fn over [0, n) in chunks of grain indices (the last one shorter):
 * the calling thread and the helpers of a compute-thread pool (threadpool.c) each
 * claim chunks until none is left, and the call returns when every chunk is
 * done.  With one compute thread, n <= grain, or no free pool (another
 * worker thread holds it), it is fn(ctx, 0, n) on the caller.  So fn must
 * give the same result however [0, n) is cut, which it does when every
 * index writes its own outputs with the same arithmetic; it must not call
 * grove__parallel_for or grove__linear_run itself (those would compute
 * alone; grove__linear_run_alone says so).  Safe from several threads at
 * once, like grove__linear_run; it never allocates once the pool is
 * running.  grain: indices per chunk (raised when n / grain would exceed
 * 65535 chunks), at least a few microseconds of work, since a hand-off
 * costs about one. */
void grove__parallel_for(int64_t n, int64_t grain,
                         void (*fn)(void *ctx, int64_t begin, int64_t end), void *ctx);
/* The floats of work a chunk of grove__parallel_for should at least hold,
 * so that a hand-off (about a microsecond) stays small beside it; and the
 * grain (indices per chunk) that gives it for floats_per_index floats of
 * work per index. */
#define GROVE__PAR_FLOATS 8192
static inline int64_t grove__par_grain(int64_t floats_per_index) {
  if (floats_per_index < 1) floats_per_index = 1;
  return (GROVE__PAR_FLOATS + floats_per_index - 1) / floats_per_index;
}

/* General products on the Linear kernel, for operands that change at every
 * call (training: forward y = x W^T, dX = dY W, dW += dY^T X), row-major as
 * cblas_sgemm: C[M,N] = op(A)[M,K] . op(B)[K,N], plus C with
 * GROVE__GEMM_ACCUMULATE (beta = 1; else beta = 0 and C is only written).
 * op(A)[i,k] is A[i*lda + k], or A[k*lda + i] with GROVE__GEMM_TRANS_A;
 * op(B)[k,n] is B[k*ldb + n], or B[n*ldb + k] with GROVE__GEMM_TRANS_B.
 * ws is the caller's workspace of ws_bytes bytes, 64-byte aligned, which the
 * call overwrites (the packed operands), so a training loop allocates it once
 * and nothing is allocated per call.  The AVX-512 kernel runs when the CPU
 * has it, GROVE_GEMM is not "blas" (read at each call) and ws_bytes is at
 * least grove__gemm_ws_size(flags, M, N, K); otherwise cblas_sgemm (sizes
 * must then fit an int).  Uses the compute threads like grove__linear_run; safe from
 * several threads at once with a workspace each. */
enum {
  GROVE__GEMM_TRANS_A = 1,
  GROVE__GEMM_TRANS_B = 2,
  GROVE__GEMM_ACCUMULATE = 4,
};
/* Bytes of workspace for these arguments; 0 when the BLAS path will run or
 * there is nothing to compute. */
size_t grove__gemm_ws_size(int flags, int64_t M, int64_t N, int64_t K);
void grove__gemm(int flags, int64_t M, int64_t N, int64_t K, const float *A, int64_t lda,
                 const float *B, int64_t ldb, float *C, int64_t ldc, void *ws, size_t ws_bytes);

/* ------------------------------------------------------------ arena compaction */

/* One block of arena memory a caller wants to keep: [start, start + bytes). */
typedef struct grove__keep {
  void *start;
  size_t bytes;
  void *moved;          /* set by grove__arena_keep: where the block now starts */
  grove_arena_mark end; /* set by grove__arena_keep: the arena's top right after it */
} grove__keep;

/* Forgets every arena allocation made after m except the n blocks in keep,
 * which are moved down to sit, in order, right above m (their bytes are
 * copied; keep[i].moved receives the new start, and callers shift their
 * pointers by moved - start).  The blocks must lie in memory allocated after
 * m and must not overlap one another.  Used after a node (or a layer) ran:
 * its scratch and the intermediates that died are given back, so the next
 * node reuses that memory and the high water is the peak of what is live.
 * GROVE_E_NOMEM when the arena cannot grow (only for several blocks, which
 * are staged above the arena's top first); arena_keep.c. */
grove_status grove__arena_keep(grove_arena *a, grove_arena_mark m, grove__keep *keep, int n,
                               grove_err *err);

/* ------------------------------------------------------------ transposes */

/* dst [C][R] = src [R][C] transposed, float32 (16 x 16 blocks through
 * AVX-512 registers where the CPU has it; transpose.c).  Any thread. */
void grove__transpose_f32(const float *src, float *dst, int64_t R, int64_t C);
/* The same with row strides: dst[c * ldd + r] = src[r * lds + c] for r < R,
 * c < C (transpose.c).  Any thread. */
void grove__transpose_f32_ld(const float *src, int64_t lds, float *dst, int64_t ldd, int64_t R,
                             int64_t C);
/* dst[i][c] = src[c][i] for a [C, HW] plane, positions [b0 * 16, b1 * 16)
 * (clipped to HW); transpose.c.  Any thread. */
void grove__nchw_to_nhwc(const float *restrict src, float *restrict dst, int64_t C, int64_t HW,
                         int64_t b0, int64_t b1);
/* y[c][p] = act(acc[p][c] * scale[c] + shift[c]) for positions [b0 * 16,
 * b1 * 16) of P and n channels (acc rows lda floats apart, y rows P floats
 * apart); transpose.c.  Any thread. */
void grove__nhwc_epilogue(const float *acc, int64_t lda, float *y, int64_t P, int64_t n,
                          const float *scale, const float *shift, bool relu, int64_t b0,
                          int64_t b1);

/* ------------------------------------------------------------ im2col */

/* The geometry of a convolution's patches over one image's planes: input
 * planes H x W, output Ho x Wo, kernel kh x kw, strides, leading paddings
 * (the trailing ones only shape Ho and Wo) and dilations.  Conv1d is
 * H = kh = 1. */
typedef struct grove__conv_geom {
  int64_t H, W, Ho, Wo;
  int64_t kh, kw, sh, sw, ph, pw, dh, dw;
} grove__conv_geom;
/* The patch rows of input channels [c0, c1) of x (planes of H x W): row
 * (c * kh + i) * kw + j of col, ldc floats apart (at least Ho * Wo), holds
 * the input under kernel tap (i, j) at each output position, zero where it
 * falls into the padding; the layout of a [C_out, C * kh * kw] weight, so a
 * GEMM of the two is the convolution (serving's columns path, training's
 * forward and weight gradient).  im2col.c.  Any thread. */
void grove__im2col(const grove__conv_geom *g, const float *x, int64_t c0, int64_t c1, float *col,
                   int64_t ldc);
/* Patch rows [b, e) (row = (image * Ho + oh) * Wo + ow) of the NHWC images
 * x of C channels into dst (row b first, kh * kw * C floats a row, taps in
 * (ki, kj, c) order, zero in the padding) for one group and dw == 1, with
 * kw * C <= 16: a stem's short kernel rows, one masked move each with
 * AVX-512 (im2col.c).  The rows layers_conv.c's par_rows writes for the
 * same convolution.  False, and nothing written, on a CPU without AVX-512
 * (par_rows' own loop then writes them).  Any thread. */
bool grove__patch_rows_short(const grove__conv_geom *g, int64_t C, const float *x, int64_t b,
                             int64_t e, float *dst);
/* The adjoint: dx (planes of H x W) += the patch rows of channels [c0, c1)
 * of col, each added back where grove__im2col took it from (training's input
 * gradient).  im2col.c.  Any thread. */
void grove__col2im(const grove__conv_geom *g, const float *col, int64_t ldc, float *dx, int64_t c0,
                   int64_t c1);

/* ------------------------------------------------------------ Winograd */

/* An output of the Winograd transform, through the epilogue when set (the
 * NHWC output of a convolution: scale, shift and ReLU per channel). */
typedef struct grove__wino_ep {
  const float *scale, *shift;
  bool relu;
} grove__wino_ep;
/* V[k][c] (k = 4r + q, rows vs floats apart) = (B^T d B)[r][q] for the C
 * channels of the tile whose 16 input pixels (NHWC) d[i] points at;
 * winograd.c.  Any thread. */
void grove__wino_in(const float *const d[16], int64_t C, float *V, int64_t vs);
/* y[2a + b][c] = (A^T m A)[a][b] for the 16 products m[k] (rows ms floats
 * apart), through ep when not NULL; y[i] NULL for an output past the edge;
 * winograd.c.  Any thread. */
void grove__wino_out(const float *M, int64_t ms, int64_t Co, float *const y[4],
                     const grove__wino_ep *ep);

/* ------------------------------------------------------------ depthwise */

/* One depthwise convolution (groups == in_channels == out_channels) over
 * one NHWC image: x is [H][W][C], w the weight repacked [kh][kw][C]; the
 * padding is zeros (pl: top/left, the rest follows from OH and OW).  Each
 * output is post(clamp(fma(sum of taps, scale[c], shift[c]), lo, hi)): lo
 * = 0 for a fused ReLU, hi = 6 for ReLU6, -inf / +inf otherwise; post is
 * GROVE__ACT_HARDSWISH, GROVE__ACT_HARDSIGMOID or GROVE__ACT_NONE, with
 * grove__act_apply's bits.  Read only. */
typedef struct grove__dw_args {
  int64_t H, W, C, OH, OW;
  int64_t kh, kw, sh, sw, dh, dw, ph, pw;
  const float *w, *scale, *shift;
  float lo, hi;
  grove__act post;
} grove__dw_args;
/* Output row oh of the image x into y ([OW][C]), the same bits on every
 * kernel (AVX-512, AVX2, scalar); depthwise.c.  Any thread. */
void grove__depthwise_row(const grove__dw_args *a, const float *x, int64_t oh, float *y);
/* Whether grove__depthwise_rows2 computes two rows at once for a (AVX-512,
 * stride and dilation 1, a 3 or 5 wide kernel), so that a caller should
 * hand it pairs of rows.  Any thread. */
bool grove__depthwise_pairs(const grove__dw_args *a);
/* Output rows oh and oh + 1 of the image x into y0 and y1, the same bits as
 * two calls of grove__depthwise_row (which it makes where
 * grove__depthwise_pairs is false); depthwise.c.  Any thread. */
void grove__depthwise_rows2(const grove__dw_args *a, const float *x, int64_t oh, float *y0,
                            float *y1);

#endif
