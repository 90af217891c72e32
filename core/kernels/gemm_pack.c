/* gemm_pack.c: the GEMM's packs (gemm_internal.h says how the GEMM's files
 * share the work).
 *
 * A Linear layer's pack is made once, when weights are loaded: the kernel is
 * chosen then (AVX-512, AVX2 or BLAS), and W is repacked into column panels
 * of up to NR = 64 output features, k-major, so that one k step of a panel
 * is 4 aligned zmm loads (AVX-512), or strip by strip (AVX2).  A narrow last
 * panel (N % 64) is packed 16, 32 or 48 wide so that Linear(1024, 10) does
 * not compute 64 columns.  A BLAS pack keeps W as it is.
 *
 * The general products (grove__gemm) pack their operands at every call, into
 * the caller's workspace, in the same panel layout: the rows of op(B) as
 * they are, or through 16 x 16 transposes in registers when op(B) is
 * transposed. */
#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gemm_internal.h"

#if GROVE__X86_SIMD
#include <immintrin.h>
#endif

#define NR GROVE__GEMM_NR

/* ================================================================ Linear's packs */

/* gemm_internal.h.  GROVE_GEMM=avx2 serves tests and benchmarks of the AVX2
 * kernel on an AVX-512 machine. */
int grove__gemm_kind(void) {
  const char *force = getenv("GROVE_GEMM");
  if (force && strcmp(force, "blas") == 0) return GROVE__GEMM_KIND_BLAS;
#if GROVE__X86_SIMD
  __builtin_cpu_init();
  const bool avx2 = grove__cpu_avx2();
  if (force && strcmp(force, "avx2") == 0 && avx2) return GROVE__GEMM_KIND_AVX2;
  if (__builtin_cpu_supports("avx512f")) return GROVE__GEMM_KIND_AVX512;
  if (avx2) return GROVE__GEMM_KIND_AVX2;
#endif
  return GROVE__GEMM_KIND_BLAS;
}

grove__linear_pack *grove__linear_pack_new(const float *W, int64_t N, int64_t K) {
  if (N < 0 || K < 0 || (N > 0 && K > 0 && !W)) return NULL;
  grove__linear_pack *p = calloc(1, sizeof *p);
  if (!p) return NULL;
  p->N = N;
  p->K = K;
  p->kind = grove__gemm_kind();
  p->npanels = (N + NR - 1) / NR;
  /* BLAS takes int sizes; a layer that large is refused rather than cut. */
  if (p->kind == GROVE__GEMM_KIND_BLAS && (N > INT_MAX || K > INT_MAX)) {
    free(p);
    return NULL;
  }

  uint64_t cols = p->kind != GROVE__GEMM_KIND_BLAS ? (uint64_t)p->npanels * NR : (uint64_t)N;
  uint64_t elems, bytes;
  if (grove__mul_overflow_u64(cols, (uint64_t)K, &elems) ||
      grove__mul_overflow_u64(elems, sizeof(float), &bytes) || bytes > SIZE_MAX - 64) {
    free(p);
    return NULL;
  }
  /* aligned_alloc wants a size that is a multiple of the alignment; the
   * panels' k rows are 64-byte multiples, so panel starts stay aligned. */
  size_t size = ((size_t)bytes + 63) / 64 * 64;
  p->data = aligned_alloc(64, size ? size : 64);
  if (!p->data) {
    free(p);
    return NULL;
  }
  if (p->kind == GROVE__GEMM_KIND_BLAS) {
    if (bytes) memcpy(p->data, W, (size_t)bytes);
    grove__yield_point();
    return p;
  }
  /* A transpose of each panel's rows, in blocks of 64 k: a block reads 64
   * contiguous floats of each row (16 KB in all, in L1) and writes them as
   * 64 rows of the panel.  Walking k for all rows at once instead read one
   * float per row and k, 4 KB apart for K = 1024, which the cache's sets
   * cannot hold: 3 to 5 times slower, and the pack is most of a reload's
   * CPU time and all of an in-place reload's pause. */
  enum { KB = 64 };
  const bool strips = p->kind == GROVE__GEMM_KIND_AVX2;
  for (int64_t pi = 0; pi < p->npanels; pi++) {
    grove__yield_point(); /* a background build packs (core/base/yield.c) */
    int w = grove__gemm_panel_width(N, pi);
    float *dst = p->data + pi * K * NR;
    int64_t n0 = pi * NR;
    int rows = N - n0 < w ? (int)(N - n0) : w;
    for (int64_t k0 = 0; k0 < K; k0 += KB) {
      int64_t k1 = k0 + KB < K ? k0 + KB : K;
      for (int j = 0; j < w; j++) {
        /* Where (k, j) goes: k * ks + j's column offset (the layouts above). */
        float *d = strips ? dst + (int64_t)(j / 16) * K * 16 + j % 16 : dst + j;
        const int64_t ks = strips ? 16 : w;
        if (j < rows) {
          const float *src = W + (n0 + j) * K;
          for (int64_t k = k0; k < k1; k++) d[k * ks] = src[k];
        } else {
          for (int64_t k = k0; k < k1; k++) d[k * ks] = 0.0f;
        }
      }
    }
  }
  return p;
}

void grove__linear_pack_free(grove__linear_pack *p) {
  if (!p) return;
  free(p->data);
  free(p);
}

bool grove__linear_pack_native(const grove__linear_pack *p) {
  return p && p->kind != GROVE__GEMM_KIND_BLAS;
}

static const char *kind_name(int kind) {
  return kind == GROVE__GEMM_KIND_AVX512 ? "avx512"
         : kind == GROVE__GEMM_KIND_AVX2 ? "avx2"
                                         : "blas";
}

const char *grove__linear_pack_kernel(const grove__linear_pack *p) {
  return kind_name(p->kind);
}

const char *grove_compute_kernel(void) {
  return kind_name(grove__gemm_kind());
}

/* ================================================================ general products' packs */

#if GROVE__X86_SIMD

GROVE__TARGET_PUSH("avx512f,avx512vl,fma")

/* dst[c * ldd + r] (+)= src[r * lds + c] for r < nr, c < nc (both <= 16):
 * one 16 x 16 block through registers.  Rows past nr and columns past nc
 * read as zero; the block writes out_rows rows of out_cols floats (the
 * caller asks for more than nc x nr to zero-fill a panel's padding). */
static inline void t16(const float *src, int64_t lds, int nr, int nc, float *dst, int64_t ldd,
                       int out_rows, int out_cols, bool accumulate) {
  __m512 r[16], t[16];
  const __mmask16 cm = (__mmask16)((1u << nc) - 1u);
#pragma GCC unroll 16
  for (int i = 0; i < 16; i++)
    r[i] = i < nr ? _mm512_maskz_loadu_ps(cm, src + i * lds) : _mm512_setzero_ps();
#pragma GCC unroll 8
  for (int i = 0; i < 8; i++) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
#pragma GCC unroll 4
  for (int i = 0; i < 4; i++) {
    r[4 * i + 0] = _mm512_shuffle_ps(t[4 * i + 0], t[4 * i + 2], 0x44);
    r[4 * i + 1] = _mm512_shuffle_ps(t[4 * i + 0], t[4 * i + 2], 0xEE);
    r[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
    r[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
  }
  /* r[4i + c], lane L: column 4L + c of rows 4i .. 4i + 3. */
#pragma GCC unroll 4
  for (int c = 0; c < 4; c++) {
    __m512 v0 = _mm512_shuffle_f32x4(r[c], r[4 + c], 0x88);
    __m512 v1 = _mm512_shuffle_f32x4(r[c], r[4 + c], 0xDD);
    __m512 v2 = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0x88);
    __m512 v3 = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0xDD);
    t[c] = _mm512_shuffle_f32x4(v0, v2, 0x88);
    t[8 + c] = _mm512_shuffle_f32x4(v0, v2, 0xDD);
    t[4 + c] = _mm512_shuffle_f32x4(v1, v3, 0x88);
    t[12 + c] = _mm512_shuffle_f32x4(v1, v3, 0xDD);
  }
  const __mmask16 om = (__mmask16)((1u << out_cols) - 1u);
#pragma GCC unroll 16
  for (int c = 0; c < 16; c++) {
    if (c >= out_rows) break;
    __m512 v = t[c];
    if (accumulate) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(om, dst + c * ldd));
    _mm512_mask_storeu_ps(dst + c * ldd, om, v);
  }
}

/* dst[c * ldd + r] (+)= src[r * lds + c] over rows [r0, r1) of src and all
 * its cols. */
void grove__gemm_transpose_rows(const float *src, int64_t lds, int64_t r0, int64_t r1, int64_t cols,
                                float *dst, int64_t ldd, bool accumulate) {
  for (int64_t r = r0; r < r1; r += 16) {
    int nr = (int)(r1 - r < 16 ? r1 - r : 16);
    for (int64_t c = 0; c < cols; c += 16) {
      int nc = (int)(cols - c < 16 ? cols - c : 16);
      t16(src + r * lds + c, lds, nr, nc, dst + c * ldd + r, ldd, nc, nr, accumulate);
    }
  }
}

/* Rows [k0, k1) of op(B) [K, N], op(B)[k, n] = B[k * ldb + n], into every
 * panel of pack (layout of grove__linear_pack: panel pi at pi * K * NR, K
 * rows of its width w, zero past N).  Row by row, so that B is read in
 * order: a panel at a time would read 256 bytes per 4 KB page of a
 * 1024-wide B, which the prefetchers do not follow. */
void grove__gemm_pack_rows(const float *B, int64_t ldb, int64_t N, int64_t K, int64_t npanels,
                           int64_t k0, int64_t k1, float *pack) {
  for (int64_t k = k0; k < k1; k++) {
    const float *s = B + k * ldb;
    for (int64_t pi = 0; pi < npanels; pi++) {
      const int w = grove__gemm_panel_width(N, pi);
      const int64_t n0 = pi * NR;
      const int ncols = (int)(N - n0 < NR ? N - n0 : NR);
      float *dst = pack + pi * K * NR + k * w;
      for (int j = 0; j < w; j += 16) {
        int v = ncols - j;
        v = v < 0 ? 0 : v > 16 ? 16 : v;
        _mm512_store_ps(dst + j, _mm512_maskz_loadu_ps((__mmask16)((1u << v) - 1u), s + n0 + j));
      }
    }
  }
}

/* Rows [k0, k1) (multiples of 16 but for K) of panel pi of op(B) [K, N],
 * op(B)[k, n] = B[n * ldb + k], into their place in pack (as grove__gemm_pack_rows): the
 * rows n0 + j of B are the panel's columns j, through 16 x 16 transposes. */
void grove__gemm_pack_panel_t(const float *B, int64_t ldb, int64_t N, int64_t K, int64_t pi,
                              int64_t k0, int64_t k1, float *pack) {
  const int w = grove__gemm_panel_width(N, pi);
  const int64_t n0 = pi * NR;
  const int ncols = (int)(N - n0 < NR ? N - n0 : NR);
  float *dst = pack + pi * K * NR;
  for (int j = 0; j < w; j += 16) {
    int nr = ncols - j;
    nr = nr < 0 ? 0 : nr > 16 ? 16 : nr;
    for (int64_t k = k0; k < k1; k += 16) {
      int nk = (int)(K - k < 16 ? K - k : 16);
      t16(B + (n0 + j) * ldb + k, ldb, nr, nk, dst + k * w + j, w, nk, 16, false);
    }
  }
}

GROVE__TARGET_POP

#endif /* GROVE__X86_SIMD */
