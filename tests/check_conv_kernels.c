/* check_conv_kernels.c: the convolution kernels under core/kernels called
 * directly, on the kernel this CPU runs (the suite runs a second time on
 * the AVX2 kernel, Makefile AVX2_SUITES): the depthwise kernel's fused
 * Hardswish and Hardsigmoid and its rows in pairs, the short patch rows of
 * a stem, and the RGB
 * transpose to channels last.  The layers that use them are checked
 * against torch in check_conv. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "testutil.h"

static float lcg(unsigned *st) {
  *st = *st * 1664525u + 1013904223u;
  return (float)((*st >> 8) & 0xFFFF) / 32768.0f - 1.0f;
}
/* A depthwise layer's operands for the kernel tests: an NHWC image x
 * ([H][W][C], values in [-2, 2)), the weight repacked [k][k][C] (scaled by
 * wscale / k), per-channel scale in [0.5, 1.5) and shift (scaled by
 * shscale) with a NaN in channel nan_c, and the kernel's arguments with no
 * clamp (lo/hi infinite) and no post activation. */
typedef struct dw_case {
  float *x, *w, *sc, *sh;
  grove__dw_args a;
} dw_case;

static dw_case dw_case_new(int64_t C, int64_t k, int64_t st, int64_t p, int64_t H, int64_t W,
                           unsigned seed, float wscale, float shscale, int64_t nan_c) {
  dw_case d = {.x = malloc(sizeof(float) * (size_t)(H * W * C)),
               .w = malloc(sizeof(float) * (size_t)(k * k * C)),
               .sc = malloc(sizeof(float) * (size_t)C),
               .sh = malloc(sizeof(float) * (size_t)C)};
  ck_assert(d.x && d.w && d.sc && d.sh);
  for (int64_t i = 0; i < H * W * C; i++) d.x[i] = 2.0f * lcg(&seed);
  for (int64_t i = 0; i < k * k * C; i++) d.w[i] = wscale * lcg(&seed) / (float)k;
  for (int64_t c = 0; c < C; c++) {
    d.sc[c] = 1.0f + 0.5f * lcg(&seed);
    d.sh[c] = shscale * lcg(&seed);
  }
  d.sh[nan_c] = NAN;
  d.a = (grove__dw_args){.H = H,
                         .W = W,
                         .C = C,
                         .kh = k,
                         .kw = k,
                         .sh = st,
                         .sw = st,
                         .dh = 1,
                         .dw = 1,
                         .ph = p,
                         .pw = p,
                         .w = d.w,
                         .scale = d.sc,
                         .shift = d.sh,
                         .lo = -INFINITY,
                         .hi = INFINITY};
  d.a.OH = (H + 2 * p - k) / st + 1;
  d.a.OW = (W + 2 * p - k) / st + 1;
  return d;
}

static void dw_case_free(dw_case *d) {
  free(d->x);
  free(d->w);
  free(d->sc);
  free(d->sh);
}

/* Hardswish and Hardsigmoid as the depthwise kernel's last step
 * (grove__dw_args.post) give the bits of the kernel without them followed
 * by grove__act_apply over each row, on the kernel this CPU runs (the
 * suite runs again on AVX2): 3x3 and 5x5, strides 1 and 2, channel counts
 * with and without a partial last vector (the AVX2 kernel's scalar tail),
 * rows with clipped taps at the edges, a NaN in one channel's shift, and
 * inputs past both ends of the gate (-3 and 3). */
START_TEST(test_depthwise_post) {
  static const int64_t geo[][5] = {/* C, k, stride, H, W */
                                   {16, 3, 1, 9, 13},
                                   {21, 3, 2, 8, 11},
                                   {40, 5, 1, 7, 19},
                                   {35, 5, 2, 11, 9},
                                   {48, 3, 1, 5, 40}};
  int lo = 0, hi = 0;
  for (size_t g = 0; g < sizeof geo / sizeof geo[0]; g++) {
    const int64_t C = geo[g][0], k = geo[g][1], st = geo[g][2], H = geo[g][3], W = geo[g][4];
    const int64_t p = k / 2;
    dw_case d = dw_case_new(C, k, st, p, H, W, 77 + (unsigned)g, 4.0f, 3.0f, C / 2);
    grove__dw_args a = d.a;
    const int64_t OH = a.OH, OW = a.OW;
    const float *x = d.x;
    float *plain = malloc(sizeof(float) * (size_t)(OW * C));
    float *fused = malloc(sizeof(float) * (size_t)(OW * C));
    ck_assert(plain && fused);
    for (int h = 0; h < 2; h++) {
      const grove__act act = h ? GROVE__ACT_HARDSIGMOID : GROVE__ACT_HARDSWISH;
      for (int64_t oh = 0; oh < OH; oh++) {
        a.post = GROVE__ACT_NONE;
        grove__depthwise_row(&a, x, oh, plain);
        for (int64_t i = 0; i < OW * C; i++) {
          lo += plain[i] < -3.0f;
          hi += plain[i] > 3.0f;
        }
        grove__act_apply(act, plain, plain, OW * C);
        a.post = act;
        grove__depthwise_row(&a, x, oh, fused);
        for (int64_t i = 0; i < OW * C; i++)
          ck_assert_msg(memcmp(&plain[i], &fused[i], sizeof(float)) == 0,
                        "C %lld %lldx%lld stride %lld, activation %d, row %lld, [%lld][%lld]: %a, "
                        "want %a",
                        (long long)C, (long long)k, (long long)k, (long long)st, (int)act,
                        (long long)oh, (long long)(i / C), (long long)(i % C), fused[i], plain[i]);
        ck_assert(isnan(fused[C / 2]));
      }
    }
    free(plain);
    free(fused);
    dw_case_free(&d);
  }
  ck_assert(lo > 100 && hi > 100);
}
END_TEST

/* The input image's transpose to channels last (grove__nchw_to_nhwc, every
 * convolution of an NCHW input): three channels (RGB) take their own
 * interleaving loop; it must put every value where the plain transpose
 * does, for any number of positions and any range of 16-position blocks. */
START_TEST(test_nchw_to_nhwc_rgb) {
  const int64_t sizes[] = {1, 15, 16, 17, 53, 224 * 7};
  for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
    for (int64_t C = 2; C <= 4; C++) {
      const int64_t HW = sizes[k], blocks = (HW + 15) / 16;
      float *src = malloc(sizeof(float) * (size_t)(C * HW));
      float *dst = malloc(sizeof(float) * (size_t)(C * HW));
      for (int64_t i = 0; i < C * HW; i++) src[i] = (float)i + 0.25f;
      for (int64_t b0 = 0; b0<blocks; b0 += blocks> 2 ? blocks / 2 : 1) {
        for (int64_t i = 0; i < C * HW; i++) dst[i] = -1.0f;
        grove__nchw_to_nhwc(src, dst, C, HW, b0, blocks);
        for (int64_t p = 0; p < HW; p++)
          for (int64_t c = 0; c < C; c++) {
            const float want = p < b0 * 16 ? -1.0f : src[c * HW + p];
            ck_assert_msg(dst[p * C + c] == want, "C %lld HW %lld from block %lld: [%lld][%lld]",
                          (long long)C, (long long)HW, (long long)b0, (long long)p, (long long)c);
          }
      }
      grove__transpose_f32(src, dst, C, HW);
      for (int64_t p = 0; p < HW; p++)
        for (int64_t c = 0; c < C; c++) ck_assert(dst[p * C + c] == src[c * HW + p]);
      free(src);
      free(dst);
    }
  }
}
END_TEST

/* grove__patch_rows_short (where the CPU has AVX-512) writes the rows of a
 * plain im2col of the NHWC images (taps in (ki, kj, c) order, zeros in the
 * padding): 1 to 5 channels, kernel widths up to 16 floats a row, strides, row dilation,
 * padding on every side, two images, and row ranges that start and end
 * inside an output row (the callers' chunks). */
START_TEST(test_patch_rows_short) {
  static const int64_t geo[][8] = {/* C, kh, kw, sh, sw, ph, pw, dh */
                                   {3, 3, 3, 2, 2, 1, 1, 1}, {3, 3, 3, 1, 1, 0, 0, 1},
                                   {1, 5, 5, 1, 2, 2, 2, 1}, {2, 4, 7, 2, 1, 1, 3, 2},
                                   {5, 3, 3, 1, 1, 1, 1, 1}, {4, 2, 4, 3, 3, 0, 2, 1},
                                   {3, 1, 5, 1, 1, 0, 2, 1}, {16, 1, 1, 1, 1, 0, 0, 1}};
  const int64_t N = 2, H = 9, W = 11;
  for (size_t t = 0; t < sizeof geo / sizeof geo[0]; t++) {
    const int64_t C = geo[t][0], kh = geo[t][1], kw = geo[t][2], sh = geo[t][3], sw = geo[t][4];
    const int64_t ph = geo[t][5], pw = geo[t][6], dh = geo[t][7];
    const int64_t Ho = (H + 2 * ph - dh * (kh - 1) - 1) / sh + 1, Wo = (W + 2 * pw - kw) / sw + 1;
    const int64_t K = kh * kw * C, rows = N * Ho * Wo;
    const grove__conv_geom g = {.H = H,
                                .W = W,
                                .Ho = Ho,
                                .Wo = Wo,
                                .kh = kh,
                                .kw = kw,
                                .sh = sh,
                                .sw = sw,
                                .ph = ph,
                                .pw = pw,
                                .dh = dh,
                                .dw = 1};
    float *x = malloc(sizeof(float) * (size_t)(N * H * W * C));
    float *want = malloc(sizeof(float) * (size_t)(rows * K));
    float *got = malloc(sizeof(float) * (size_t)(rows * K));
    ck_assert(x && want && got);
    for (int64_t i = 0; i < N * H * W * C; i++) x[i] = (float)i + 0.5f;
    for (int64_t r = 0; r < rows; r++) {
      const int64_t n = r / (Ho * Wo), oh = r / Wo % Ho, ow = r % Wo;
      for (int64_t ki = 0; ki < kh; ki++)
        for (int64_t kj = 0; kj < kw; kj++)
          for (int64_t c = 0; c < C; c++) {
            const int64_t ih = oh * sh - ph + ki * dh, iw = ow * sw - pw + kj;
            want[r * K + (ki * kw + kj) * C + c] =
                ih < 0 || ih >= H || iw < 0 || iw >= W ? 0.0f : x[((n * H + ih) * W + iw) * C + c];
          }
    }
    const int64_t cuts[] = {0, 1, Wo + 3, rows / 2, rows - 1, rows};
    for (size_t a = 0; a + 1 < sizeof cuts / sizeof cuts[0]; a++) {
      const int64_t b = cuts[a], e = cuts[a + 1];
      if (e <= b) continue;
      for (int64_t i = 0; i < rows * K; i++) got[i] = -1.0f;
      if (!grove__patch_rows_short(&g, C, x, b, e, got + b * K)) {
        /* No AVX-512: par_rows' own loop writes these rows (check_conv). */
        free(x);
        free(want);
        free(got);
        return;
      }
      for (int64_t i = 0; i < rows * K; i++) {
        const bool in = i >= b * K && i < e * K;
        ck_assert_msg(got[i] == (in ? want[i] : -1.0f),
                      "geometry %zu, rows [%lld, %lld): float %lld (row %lld, tap %lld) is %g, "
                      "want %g",
                      t, (long long)b, (long long)e, (long long)i, (long long)(i / K),
                      (long long)(i % K), got[i], in ? want[i] : -1.0f);
      }
    }
    free(x);
    free(want);
    free(got);
  }
}
END_TEST

/* grove__depthwise_rows2 gives the bits of two calls of
 * grove__depthwise_row: 3x3 and 5x5 kernels, padding 0 to 2, rows with
 * several interior blocks of eight columns and rows with none, channel
 * counts with a masked last vector and several channel blocks, every pair
 * of rows (the top and bottom ones clipped), a NaN in one channel's shift
 * and each epilogue (ReLU6's clamp, Hardswish).  Where the kernel does not
 * take pairs (AVX2) it is the two calls by definition. */
START_TEST(test_depthwise_pairs) {
  static const int64_t geo[][5] = {/* C, k, pad, H, W */
                                   {32, 3, 1, 12, 40}, {21, 3, 1, 7, 19}, {200, 5, 2, 9, 30},
                                   {48, 5, 0, 10, 27}, {16, 3, 0, 6, 9},  {960, 3, 1, 7, 7}};
  for (size_t g = 0; g < sizeof geo / sizeof geo[0]; g++) {
    const int64_t C = geo[g][0], k = geo[g][1], p = geo[g][2], H = geo[g][3], W = geo[g][4];
    dw_case d = dw_case_new(C, k, 1, p, H, W, 501 + (unsigned)g, 3.0f, 2.0f, C - 1);
    const int64_t OH = d.a.OH, OW = d.a.OW;
    const float *x = d.x;
    float *one = malloc(sizeof(float) * (size_t)(2 * OW * C));
    float *two = malloc(sizeof(float) * (size_t)(2 * OW * C));
    ck_assert(one && two);
    for (int ep = 0; ep < 2; ep++) {
      grove__dw_args a = d.a;
      a.lo = ep ? -INFINITY : 0.0f;
      a.hi = ep ? INFINITY : 6.0f;
      a.post = ep ? GROVE__ACT_HARDSWISH : GROVE__ACT_NONE;
      for (int64_t oh = 0; oh + 1 < OH; oh++) {
        grove__depthwise_row(&a, x, oh, one);
        grove__depthwise_row(&a, x, oh + 1, one + OW * C);
        for (int64_t i = 0; i < 2 * OW * C; i++) two[i] = -7.0f;
        grove__depthwise_rows2(&a, x, oh, two, two + OW * C);
        for (int64_t i = 0; i < 2 * OW * C; i++)
          ck_assert_msg(memcmp(&one[i], &two[i], sizeof(float)) == 0,
                        "C %lld %lldx%lld pad %lld %lldx%lld, epilogue %d, rows %lld and %lld: "
                        "row %lld [%lld][%lld] is %a, want %a",
                        (long long)C, (long long)k, (long long)k, (long long)p, (long long)H,
                        (long long)W, ep, (long long)oh, (long long)oh + 1,
                        (long long)(oh + i / (OW * C)), (long long)(i / C % OW), (long long)(i % C),
                        two[i], one[i]);
      }
    }
    free(one);
    free(two);
    dw_case_free(&d);
  }
}
END_TEST

static Suite *conv_kernels_suite(void) {
  Suite *s = suite_create("conv_kernels");
  TCase *tc = tcase_create("kernels");
  tcase_add_test(tc, test_depthwise_post);
  tcase_add_test(tc, test_depthwise_pairs);
  tcase_add_test(tc, test_patch_rows_short);
  tcase_add_test(tc, test_nchw_to_nhwc_rgb);
  suite_add_tcase(s, tc);
  return s;
}

GROVE_TEST_MAIN(conv_kernels_suite)
