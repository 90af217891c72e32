/* internal.h: libgrove's non-public helpers (grove__ prefix).  Never
 * installed; server/ and client/ must not include it (tests may). */
#ifndef GROVE_CORE_INTERNAL_H
#define GROVE_CORE_INTERNAL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "grove/grove.h"

/* ------------------------------------------------------------ logging */

/* Formats and hands one event to the installed log callback; does nothing
 * (not even format) when none is installed.  Any thread. */
void grove__log(grove_log_level level, const char *id, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* ------------------------------------------------------------ hooks */

/* How many forward hooks are registered anywhere (module or global).  Zero
 * means every grove_module_forward takes the direct path. */
extern atomic_long grove__forward_hook_count;

static inline bool grove__no_forward_hooks(void) {
  return atomic_load_explicit(&grove__forward_hook_count, memory_order_relaxed) == 0;
}

/* ------------------------------------------------------------ yield points
 *
 * A background thread's long loops (grove_thread_yield_every; core/yield.c
 * says why) call grove__yield_point() every few tens of microseconds of
 * work; it yields the core once the thread's interval has passed.  On every
 * other thread it is one thread-local load. */
extern _Thread_local int64_t grove__yield_every_ns;
void grove__yield_due(void);
/* CLOCK_MONOTONIC in nanoseconds (yield.c; the compute pool's spins use it
 * too).  Any thread. */
int64_t grove__clock_ns(void);
static inline void grove__yield_point(void) {
  if (__builtin_expect(grove__yield_every_ns != 0, 0)) grove__yield_due();
}

/* ------------------------------------------------------------ deferred refresh */

/* A layer's refresh derives what its forward reads from the weights: Linear,
 * Conv1d/2d and MultiheadAttention pack theirs for the GEMM kernel, a full
 * copy or more of the weights.  Their constructors refresh at once, so that a
 * new module runs forward on its zero weights.  grove_model_open, which loads
 * a checkpoint into the tree right after building it, instead builds inside
 * a deferral: those constructors then mark the module refresh_pending and
 * pack nothing, and load_state_dict's refresh packs the real weights once.
 * Without it every reload built (and faulted in) a packed copy of zeros on
 * top of old + new.
 *
 * The deferral is the calling thread's (a counter, so scopes nest): the
 * layer builders share one signature with the 28 types that have nothing to
 * defer, and the layers that build layers (TransformerEncoder, Multihead-
 * Attention's out_proj) call the public constructors. */
void grove__refresh_defer_begin(void);
void grove__refresh_defer_end(void);
/* A constructor's first refresh: m->type->refresh(m), or, inside a
 * deferral, only m->refresh_pending = true. */
grove_status grove__refresh_new(grove_module *m, grove_err *err);
/* Refreshes every module of root's tree whose refresh is still pending
 * (none after a load_state_dict of the whole tree), so that the tree can run
 * forward.  Stops at the first error. */
grove_status grove__refresh_pending(grove_module *root, grove_err *err);

/* ------------------------------------------------------------ helpers */

/* strdup that returns NULL on NULL. */
char *grove__strdup(const char *s);
/* A new malloc'd printf-formatted string; NULL when out of memory. */
char *grove__asprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Overflow-checked a * b; false on overflow. */
static inline bool grove__mul_overflow_u64(uint64_t a, uint64_t b, uint64_t *out) {
  return __builtin_mul_overflow(a, b, out);
}

/* ------------------------------------------------------------ views */

/* The one bounds computation for a strided view of a storage (torch_load,
 * optim_io, grove_tensor_view_new: every reader of offsets and strides from
 * a file goes through it).  A view of ndim dims (shape, strides in elements,
 * both from outside) starting elem_offset elements of es bytes into its
 * storage reaches up to byte *end (exclusive): (elem_offset + sum((shape_i -
 * 1) * stride_i) + 1) * es, or elem_offset * es when some shape_i is 0 (an
 * empty view reaches nothing but must still start inside).  Returns false,
 * *end untouched, when a shape or stride is negative or any step overflows
 * 64 bits: the caller refuses the view then, as when *end passes the
 * storage's size. */
bool grove__view_end(uint64_t elem_offset, size_t es, int ndim, const int64_t *shape,
                     const int64_t *strides, uint64_t *end);

/* Bytes of storage allocated by grove_storage_new since the process started
 * (never decreases; wrapped storages, e.g. mappings of files, do not count).
 * Lets tests check that reading a small file costs little memory. */
uint64_t grove__storage_bytes_allocated(void);

/* ------------------------------------------------------------ text */

/* Offset of the first byte of s that does not start a valid UTF-8 sequence,
 * or len when all of it is valid.  Strict (no overlong forms, nothing past
 * U+10FFFF); surrogates pass only when allow_surrogates. */
size_t grove__utf8_invalid_at(const uint8_t *s, size_t len, bool allow_surrogates);

/* ------------------------------------------------------------ files */

/* Reads the whole of path into a new storage the caller owns (an empty file
 * gives an empty storage), checking that nothing wrote to the file while it
 * was read: same size, mtime and ctime before and after, no byte past
 * the end.  A file that changed is GROVE_E_IO ("changed while it was being
 * read"), so the bytes are always one state of the file, and nothing done to
 * the file later reaches them.  Only I/O problems are errors here: the
 * parsers judge the content.  Any thread. */
grove_status grove__read_file(const char *path, grove_storage **out, grove_err *err);

/* Writes a file atomically: open() creates a unique temporary file beside
 * path (hidden: ".BASE.grove-tmp.PID.N"); write to f->fd; finish(st) fsyncs, closes and renames it
 * into place when st is GROVE_OK (and everything succeeds), else removes it, so that a failed write
 * leaves nothing.  Returns the final status. */
typedef struct grove__atomic_file {
  const char *path; /* borrowed */
  char *tmp;
  int fd;
} grove__atomic_file;
grove_status grove__atomic_open(grove__atomic_file *f, const char *path, grove_err *err);
grove_status grove__atomic_finish(grove__atomic_file *f, grove_status st, grove_err *err);
/* write() until done; -1 with errno on failure. */
int grove__write_all(int fd, const void *buf, size_t n);

/* ------------------------------------------------------------ linear kernel */

/* The GEMM behind Linear: y[M,N] = act(x[M,K] . W^T + b), W in torch's
 * [N,K] row-major layout.  A pack is built from W once, when weights are
 * loaded (refresh), in whatever layout the kernel runs fastest; it copies W,
 * so W may go away afterwards.  run() may be called from any number of
 * threads at once on one pack; it never allocates. */
typedef enum grove__act {
  GROVE__ACT_NONE = 0,
  GROVE__ACT_RELU = 1,
} grove__act;

typedef struct grove__linear_pack grove__linear_pack;

/* NULL when out of memory. */
grove__linear_pack *grove__linear_pack_new(const float *W, int64_t N, int64_t K);
void grove__linear_pack_free(grove__linear_pack *p);
/* bias may be NULL.  x is [M,K] contiguous, y is [M,N] contiguous. */
void grove__linear_run(const grove__linear_pack *p, const float *x, int64_t M, const float *bias,
                       float *y, grove__act act);

/* grove__linear_run on the calling thread alone: for the fn of a
 * grove__parallel_for, whose chunks are already spread over the compute
 * threads (a convolution computes each block of its output positions from
 * patch rows to epilogue in one chunk, in cache).  Call it there only on a
 * pack for which grove__linear_pack_native is true: a BLAS pack calls
 * OpenBLAS, whose own threads must not run inside the pool's chunks.  Any
 * thread; the same results, bit for bit, as grove__linear_run. */
void grove__linear_run_alone(const grove__linear_pack *p, const float *x, int64_t M,
                             const float *bias, float *y, grove__act act);
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
 * the calling thread and the helpers of a compute-thread pool (gemm.c) each
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

/* ------------------------------------------------------------ instruction sets */

/* Code between GROVE__TARGET_PUSH("avx2,fma") and GROVE__TARGET_POP is
 * compiled for those instruction sets (GCC's target pragma, clang's
 * attribute), while the rest of the library keeps the distribution's
 * baseline flags; callers choose such a function only once the CPU is
 * known to have them (__builtin_cpu_supports, grove__cpu_avx512). */
#define GROVE__PRAGMA(...) _Pragma(#__VA_ARGS__)
#if defined(__clang__)
#define GROVE__TARGET_PUSH(T) \
  GROVE__PRAGMA(clang attribute push(__attribute__((target(T))), apply_to = function))
#define GROVE__TARGET_POP GROVE__PRAGMA(clang attribute pop)
#else
#define GROVE__TARGET_PUSH(T) GROVE__PRAGMA(GCC push_options) GROVE__PRAGMA(GCC target(T))
#define GROVE__TARGET_POP GROVE__PRAGMA(GCC pop_options)
#endif

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

/* ------------------------------------------------------------ channels last */

/* Whether t is a 4-d [N, C, H, W] tensor whose memory is laid out channels
 * last (NHWC: strides [HWC, 1, WC, C]) and that is not also contiguous (C,
 * or H * W, larger than 1): what a convolution hands the next layer when
 * its caller allows (grove_fwd.channels_last_ok). */
bool grove__is_nhwc(const grove_tensor *t);
/* Gives the contiguous 4-d tensor t NHWC strides (same shape, same bytes). */
void grove__set_nhwc(grove_tensor *t);
/* dst [C][R] = src [R][C] transposed, float32 (16 x 16 blocks through
 * AVX-512 registers where the CPU has it; transpose.c).  Any thread. */
void grove__transpose_f32(const float *src, float *dst, int64_t R, int64_t C);
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
/* t itself when contiguous, else a contiguous copy of it in f's arena (a
 * channels-last float32 tensor by a transpose per image); module.c.  The
 * forward's thread. */
grove_status grove__fwd_contig(grove_fwd *f, const grove_tensor *t, grove_tensor *out);
/* The same for every NHWC tensor of v (the others are left as they are). */
grove_status grove__plain_values(grove_fwd *f, grove_values *v);

/* ------------------------------------------------------------ layer registry */

/* Builds one module from its model.json object (the "type" key already
 * read).  path is the JSON path of obj for messages ("$.module.children[2]");
 * an error names path plus the key ("$.module.children[2].out_features:
 * expected a positive integer") with GROVE_E_SPEC.  Containers come back
 * empty: spec.c adds their children.  Unknown keys are GROVE_E_SPEC too
 * (a misspelt argument must not be ignored), except "type", "children",
 * "ref", "tied" and "graph", which spec.c reads. */
struct json_t;
typedef grove_status (*grove__from_json_fn)(const struct json_t *obj, const char *path,
                                            grove_module **out, grove_err *err);

typedef struct grove__layer_def {
  const char *type; /* torch.nn class name */
  grove__from_json_fn from_json;
  bool container; /* holds "children" (Sequential, ModuleList, ModuleDict) */
} grove__layer_def;

/* What a JSON value is, for "got ..." in spec messages: the value itself
 * when it is short (numbers, short strings), else its kind. */
void grove__json_describe(const struct json_t *v, char *buf, size_t n);

/* The def for a torch.nn type name, or NULL when Grove does not run it. */
const grove__layer_def *grove__layer_find(const char *type);
/* All defs, for messages listing what is supported; *n set to the count. */
const grove__layer_def *grove__layer_defs(size_t *n);

/* ------------------------------------------------------------ pointer map */

/* Open addressing from a pointer to a value (ptrmap.c); the keys are modules
 * and parameter tensors, a few hundred at most.  Zeroed is empty.  One
 * owner: not thread-safe. */
typedef struct grove__pmap {
  const void **keys;
  void **vals;
  size_t cap, n;
} grove__pmap;

/* Sets k's value to v (k not NULL); false when out of memory. */
bool grove__pmap_put(grove__pmap *m, const void *k, void *v);
/* k's value, or NULL; *found (when not NULL) says whether k is there. */
void *grove__pmap_get(const grove__pmap *m, const void *k, bool *found);
/* Frees the table and leaves it empty. */
void grove__pmap_fini(grove__pmap *m);

/* ------------------------------------------------------------ secrets */

/* Whether given equals secret, in time that depends on secret_len only
 * (secret.c; groved's admin token).  Any thread. */
bool grove__secret_equal(const void *secret, size_t secret_len, const void *given,
                         size_t given_len);

#endif
