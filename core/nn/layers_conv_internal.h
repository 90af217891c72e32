/* layers_conv_internal.h: the state of a Conv1d / Conv2d, shared by
 * layers_conv.c (refresh, the forward paths, the BatchNorm fold) and
 * layers_conv_new.c (the constructors and model.json builders, which fill
 * in the settings; refresh packs the rest).  Never installed. */
#ifndef GROVE_CORE_NN_LAYERS_CONV_INTERNAL_H
#define GROVE_CORE_NN_LAYERS_CONV_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "layers_internal.h"

typedef struct conv_impl {
  int nd; /* spatial dims: 1 (Conv1d) or 2 (Conv2d) */
  int64_t cin, cout, groups;
  /* Per spatial dim, index 0 = H (1-d: unused, kernel 1) and 1 = W. */
  int64_t k[2], stride[2], dil[2], pad_lo[2], pad_hi[2];
  int64_t padding[2]; /* as given (for the exporter's round trip) */
  int pad_kind;       /* 0 numbers, 1 "same", 2 "valid" */
  bool use_bias;
  int64_t K; /* cin/groups * kh * kw: one row of weight.view(out, -1) */
  /* [cout, K] float32, copied from the weight in refresh for the columns
   * path; left untouched (its zero pages cost no memory) while the rows
   * path runs, which computes from its packs alone. */
  float *w;
  float *bias;
  float *ones; /* cout ones: the scale of a plain convolution */
  /* The rows path (see conv_rows): one pack per group of the weight with K
   * reordered to (ki, kj, c), or NULL when the column path runs. */
  grove__linear_pack **packs;
  /* Winograd F(2x2, 3x3) (see conv_winograd): the 16 transformed weight
   * matrices [cout, cin], packed; wino[0] NULL when it does not run. */
  grove__linear_pack *wino[16];
  /* The depthwise kernel (see conv_depthwise): the weight repacked
   * [kh][kw][C], or NULL when another path runs. */
  float *dww;
  /* A following BatchNorm2d folded into the weight (grove__conv_fold_bn):
   * fold_pack packs W * scale (the rows path, one group, no Winograd), and
   * fold_bias is bias * scale + shift, so the product writes the output
   * with its bias and no epilogue pass reads it back.  fold_key holds the
   * BatchNorm's scale and shift it was made from: a forward uses the fold
   * only while the BatchNorm still has those (a reload of the BatchNorm
   * alone falls back to the epilogue until its parent is refreshed).
   * NULL when nothing is folded; dropped by every refresh of the conv. */
  grove__linear_pack *fold_pack;
  float *fold_bias; /* cout floats, then fold_key's 2 * cout */
  const grove_module *fold_bn;
  float data[];
} conv_impl;

#endif
