/* layers.h: the torch.nn layer types Grove runs, with PyTorch's constructor
 * arguments and state_dict layout.
 *
 * Constructors build eval-ready modules whose parameters are zero (or, where
 * torch initialises them to constants, those constants: norms' weight 1,
 * running_var 1); real weights come from load_state_dict.  Like torch, a new
 * module has training = true; call grove_module_eval before forward (BatchNorm
 * and Dropout refuse a training-mode forward: training uses its own replica).
 * Each returns a new module the caller owns in *out, or a status and err.
 * Any thread. */
#ifndef GROVE_LAYERS_H
#define GROVE_LAYERS_H

#include <stdbool.h>
#include <stdint.h>

#include "grove/module.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Containers.  Sequential calls its children in order; ModuleList and
 * ModuleDict hold children and are not callable.  Children are added with
 * grove_module_add_module ("0", "1", ... for Sequential/ModuleList). */
grove_status grove_sequential_new(grove_module **out, grove_err *err);
grove_status grove_module_list_new(grove_module **out, grove_err *err);
grove_status grove_module_dict_new(grove_module **out, grove_err *err);

grove_status grove_linear_new(int64_t in_features, int64_t out_features, bool bias,
                              grove_module **out, grove_err *err);
/* torch.nn.Bilinear: weight [out, in1, in2], bias [out] or None; forward
 * takes input1 [..., in1] and input2 [..., in2] (the same leading dims) and
 * gives [..., out]. */
grove_status grove_bilinear_new(int64_t in1_features, int64_t in2_features, int64_t out_features,
                                bool bias, grove_module **out, grove_err *err);
grove_status grove_identity_new(grove_module **out, grove_err *err);
grove_status grove_flatten_new(int start_dim, int end_dim, grove_module **out, grove_err *err);
grove_status grove_dropout_new(double p, grove_module **out, grove_err *err);
grove_status grove_relu_new(grove_module **out, grove_err *err);
grove_status grove_leaky_relu_new(double negative_slope, grove_module **out, grove_err *err);
/* approximate: "none" or "tanh". */
grove_status grove_gelu_new(const char *approximate, grove_module **out, grove_err *err);
grove_status grove_silu_new(grove_module **out, grove_err *err);
grove_status grove_sigmoid_new(grove_module **out, grove_err *err);
grove_status grove_tanh_new(grove_module **out, grove_err *err);
/* dim: as torch; has_dim false is torch's dim=None (the legacy implicit dim:
 * 0 for 0-, 1- and 3-d input, else 1). */
grove_status grove_softmax_new(bool has_dim, int dim, grove_module **out, grove_err *err);
grove_status grove_log_softmax_new(bool has_dim, int dim, grove_module **out, grove_err *err);
/* momentum NaN means torch's momentum=None (a cumulative average). */
grove_status grove_batch_norm1d_new(int64_t num_features, double eps, double momentum, bool affine,
                                    bool track_running_stats, grove_module **out, grove_err *err);
grove_status grove_layer_norm_new(int ndim, const int64_t *normalized_shape, double eps,
                                  bool elementwise_affine, grove_module **out, grove_err *err);
/* padding_idx < 0 means None (torch's negative padding_idx is normalised by
 * the caller: padding_idx + num_embeddings). */
grove_status grove_embedding_new(int64_t num_embeddings, int64_t embedding_dim,
                                 int64_t padding_idx, grove_module **out, grove_err *err);

/* mode: "sum", "mean" (NULL) or "max".  padding_idx < 0 means None.
 * forward takes input (a 2-d [B, N] of bags, or 1-d with offsets), then
 * offsets, then per_sample_weights (mode sum), and returns [B, D]. */
grove_status grove_embedding_bag_new(int64_t num_embeddings, int64_t embedding_dim,
                                     const char *mode, bool include_last_offset,
                                     int64_t padding_idx, grove_module **out, grove_err *err);

/* ---------------------------------------------------------- convolution */

/* Conv1d / Conv2d options, torch's constructor arguments per spatial dim
 * (Conv2d: [0] = H, [1] = W; Conv1d uses [0] only).  A zero stride,
 * dilation or groups means torch's default 1, so a designated initializer
 * need only name what differs: (grove_conv_opts){.kernel_size = {3, 3},
 * .padding = {1, 1}, .bias = true}. */
typedef struct grove_conv_opts {
  int64_t kernel_size[2];
  int64_t stride[2];
  int64_t padding[2]; /* zeros on both sides */
  int64_t dilation[2];
  int64_t groups;
  bool padding_same;  /* torch's padding="same" (stride 1 only; an odd total pads right) */
  bool padding_valid; /* torch's padding="valid": no padding */
  bool bias;
  int64_t output_padding[2]; /* ConvTranspose2d only (ignored by Conv1d/Conv2d) */
} grove_conv_opts;

/* weight [out, in/groups, (kh,) kw], bias [out] or None.  Only torch's
 * padding_mode="zeros" exists here. */
grove_status grove_conv1d_new(int64_t in_channels, int64_t out_channels, const grove_conv_opts *o,
                              grove_module **out, grove_err *err);
grove_status grove_conv2d_new(int64_t in_channels, int64_t out_channels, const grove_conv_opts *o,
                              grove_module **out, grove_err *err);
/* ConvTranspose2d: weight [in, out/groups, kh, kw] (torch's layout), bias
 * [out] or None; padding numbers only, output_padding smaller than the
 * stride or the dilation (as torch checks).  Input [N, C, H, W] or
 * [C, H, W]; output (H - 1) * stride - 2 * padding + dilation * (kernel - 1)
 * + output_padding + 1 per dim.  torch's forward(output_size=...) is not
 * offered: give output_padding instead. */
grove_status grove_conv_transpose2d_new(int64_t in_channels, int64_t out_channels,
                                        const grove_conv_opts *o, grove_module **out,
                                        grove_err *err);
/* ConvTranspose1d: the same over [N, C, L] or [C, L], weight [in,
 * out/groups, k]; o's sizes in their [0]. */
grove_status grove_conv_transpose1d_new(int64_t in_channels, int64_t out_channels,
                                        const grove_conv_opts *o, grove_module **out,
                                        grove_err *err);
/* As grove_batch_norm1d_new, for [N, C, H, W] input. */
grove_status grove_batch_norm2d_new(int64_t num_features, double eps, double momentum, bool affine,
                                    bool track_running_stats, grove_module **out, grove_err *err);
/* Pools take [N, C, H, W] or [C, H, W].  stride NULL means the kernel size
 * (torch's stride=None); padding NULL means 0, dilation NULL means 1. */
grove_status grove_max_pool2d_new(const int64_t kernel_size[2], const int64_t stride[2],
                                  const int64_t padding[2], const int64_t dilation[2],
                                  bool ceil_mode, grove_module **out, grove_err *err);
/* divisor_override 0 means None. */
grove_status grove_avg_pool2d_new(const int64_t kernel_size[2], const int64_t stride[2],
                                  const int64_t padding[2], bool ceil_mode, bool count_include_pad,
                                  int64_t divisor_override, grove_module **out, grove_err *err);
/* output_size[i] == -1 is torch's None: that dim keeps the input's size.
 * AdaptiveMaxPool2d keeps the first maximum of each window (a NaN wins), as
 * torch; the indices (return_indices=True) are not served. */
grove_status grove_adaptive_avg_pool2d_new(const int64_t output_size[2], grove_module **out,
                                           grove_err *err);
grove_status grove_adaptive_max_pool2d_new(const int64_t output_size[2], grove_module **out,
                                           grove_err *err);
/* The 1-d pools take [N, C, L] or [C, L], one integer per argument (stride
 * 0 means the kernel size, torch's stride=None); torch's AvgPool1d has no
 * divisor_override. */
grove_status grove_max_pool1d_new(int64_t kernel_size, int64_t stride, int64_t padding,
                                  int64_t dilation, bool ceil_mode, grove_module **out,
                                  grove_err *err);
grove_status grove_avg_pool1d_new(int64_t kernel_size, int64_t stride, int64_t padding,
                                  bool ceil_mode, bool count_include_pad, grove_module **out,
                                  grove_err *err);
grove_status grove_adaptive_avg_pool1d_new(int64_t output_size, grove_module **out,
                                           grove_err *err);
grove_status grove_adaptive_max_pool1d_new(int64_t output_size, grove_module **out,
                                           grove_err *err);

/* ---------------------------------------------------------- attention */

/* in_proj_weight [3E, E], in_proj_bias [3E] (or None), out_proj (a Linear).
 * kdim = vdim = embed_dim, no bias_k/bias_v, no zero attention (see
 * grove_multihead_attention_new_opts for those); eval-mode
 * dropout does nothing and is not an argument.  forward takes query, key and
 * value (or one tensor for all three) and returns the attention output and
 * the attention weights averaged over heads. */
grove_status grove_multihead_attention_new(int64_t embed_dim, int64_t num_heads, bool bias,
                                           bool batch_first, grove_module **out, grove_err *err);

/* MultiheadAttention's constructor arguments (torch's names; dropout has no
 * effect in eval).  kdim / vdim 0 mean embed_dim; other values give separate
 * q_proj_weight [E, E], k_proj_weight [E, kdim], v_proj_weight [E, vdim]
 * instead of in_proj_weight.  add_bias_kv adds bias_k and bias_v [1, 1, E]. */
typedef struct grove_mha_opts {
  int64_t embed_dim, num_heads;
  bool bias, batch_first, add_bias_kv, add_zero_attn;
  int64_t kdim, vdim;
} grove_mha_opts;
/* As grove_multihead_attention_new, with every argument; o is copied.  The
 * masks of a call are passed in the forward's context (grove_fwd.mha). */
grove_status grove_multihead_attention_new_opts(const grove_mha_opts *o, grove_module **out,
                                                grove_err *err);

/* TransformerEncoderLayer's constructor arguments (torch's names).
 * activation: "relu" (NULL) or "gelu". */
typedef struct grove_encoder_layer_opts {
  int64_t d_model, nhead, dim_feedforward;
  double dropout;
  const char *activation;
  double layer_norm_eps;
  bool batch_first, norm_first;
} grove_encoder_layer_opts;

/* Children self_attn, linear1, dropout, linear2, norm1, norm2, dropout1,
 * dropout2, as torch registers them.  o is copied. */
grove_status grove_transformer_encoder_layer_new(const grove_encoder_layer_opts *o,
                                                 grove_module **out, grove_err *err);
/* layers (a ModuleList of num_layers layers built from layer) and, when norm
 * is not NULL, norm (retained: the caller keeps its own reference). */
grove_status grove_transformer_encoder_new(const grove_encoder_layer_opts *layer,
                                           int64_t num_layers, grove_module *norm,
                                           grove_module **out, grove_err *err);

/* TransformerDecoderLayer: children self_attn, multihead_attn, linear1,
 * dropout, linear2, norm1, norm2, norm3, dropout1, dropout2, dropout3, as
 * torch registers them; forward takes tgt and memory.  o is copied. */
grove_status grove_transformer_decoder_layer_new(const grove_encoder_layer_opts *o,
                                                 grove_module **out, grove_err *err);
/* TransformerDecoder: layers (num_layers decoder layers built from layer)
 * and, when norm is not NULL, norm (retained). */
grove_status grove_transformer_decoder_new(const grove_encoder_layer_opts *layer,
                                           int64_t num_layers, grove_module *norm,
                                           grove_module **out, grove_err *err);
/* nn.Transformer: encoder (num_encoder_layers layers and a final LayerNorm)
 * and decoder (num_decoder_layers, a final LayerNorm), every layer built
 * from layer; forward takes src and tgt.  The masks of a call travel in
 * grove_fwd.mha (module.h). */
grove_status grove_transformer_new(const grove_encoder_layer_opts *layer,
                                   int64_t num_encoder_layers, int64_t num_decoder_layers,
                                   grove_module **out, grove_err *err);

/* ---------------------------------------------------------- recurrent */

/* RNN, LSTM and GRU: torch's constructor arguments.  mode: "RNN_TANH"
 * (NULL), "RNN_RELU" (an RNN), "LSTM" or "GRU".  proj_size: LSTM only, 0 for
 * none.  dropout (between layers, training only) is kept for the round trip.
 * Parameters weight_ih_l<k>[_reverse], weight_hh_l<k>, bias_ih_l<k>,
 * bias_hh_l<k> (with bias), weight_hr_l<k> (with proj_size), in torch's
 * order.  forward takes x and optionally h0 (RNN, GRU) or h0 and c0 (LSTM)
 * as further tensors, and returns output, h_n (and c_n). */
typedef struct grove_rnn_opts {
  const char *mode;
  int64_t input_size, hidden_size, num_layers, proj_size;
  bool bias, batch_first, bidirectional;
  double dropout;
  /* torch.nn.RNNCell / LSTMCell / GRUCell (by mode): one time step, names
   * weight_ih, weight_hh, bias_ih, bias_hh; num_layers 1, the rest unset. */
  bool cell;
} grove_rnn_opts;
grove_status grove_rnn_new(const grove_rnn_opts *o, grove_module **out, grove_err *err);

/* The type of m by torch class name ("Linear"). */
const char *grove_module_type_name(const grove_module *m);

#ifdef __cplusplus
}
#endif
#endif
