/* simd_act.h: core/kernels/, Hardswish and Hardsigmoid on a vector of
 * floats, for the kernels that apply them to a result still in registers
 * (the GEMM tiles, gemm_avx512.c and gemm_avx2.c; the depthwise rows,
 * depthwise.c) instead of in a pass of their own over the output.
 *
 * Why in the tiles: MobileNetV3's 1x1 convolutions applied Hardswish by
 * grove__act_apply on each tile's rows, 64 floats a call, and the calls
 * were 5-6% of its forward at batch 1 (docs/performance-models.md).
 *
 * The same bits as activation.c's clamp_kind, the reference: x * clampf(x
 * + 3, 0, 6) / 6 and clampf(x + 3, 0, 6) / 6, each step rounded as the C
 * expression is (the add, the clamp, the product, then a true division by
 * 6).  max and min return their second operand when either is NaN, so
 * with the value second a NaN passes, as clampf lets it.  Header-only
 * macros over the intrinsics' prefix V (_mm256 or _mm512), expanded inside
 * the caller's target region.  Pure, any thread.  Never installed. */
#ifndef GROVE_CORE_SIMD_ACT_H
#define GROVE_CORE_SIMD_ACT_H

#include "kernels.h"

#if GROVE__X86_SIMD
#include <immintrin.h>

/* clamp(v + 3, 0, 6), the factor both share. */
#define GROVE__HARD_GATE(V, v) \
  V##_min_ps(V##_set1_ps(6.0f), V##_max_ps(V##_setzero_ps(), V##_add_ps((v), V##_set1_ps(3.0f))))
/* v * clamp(v + 3, 0, 6) / 6 */
#define GROVE__HARDSWISH(V, v) \
  V##_div_ps(V##_mul_ps((v), GROVE__HARD_GATE(V, v)), V##_set1_ps(6.0f))
/* clamp(v + 3, 0, 6) / 6 */
#define GROVE__HARDSIGMOID(V, v) V##_div_ps(GROVE__HARD_GATE(V, v), V##_set1_ps(6.0f))

#endif /* GROVE__X86_SIMD */
#endif
