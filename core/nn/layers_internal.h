/* layers_internal.h: what the layer files (layers*.c, layer_registry.c) share
 * with each other and with tests/check_layers.c.  Never installed.
 *
 * - the module types, so that Sequential can recognise a Linear followed by a
 *   ReLU and fuse them, and tests can look at a layer's settings;
 * - each layer's model.json builder, which layer_registry.c puts in its table;
 * - the typed JSON argument readers every builder uses, so that all of them
 *   word their GROVE_E_SPEC errors the same way ("$.module.children[2].
 *   out_features: expected a positive integer, got -3");
 * - small forward helpers (one input, float32, contiguous). */
#ifndef GROVE_CORE_LAYERS_INTERNAL_H
#define GROVE_CORE_LAYERS_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "grove/grove.h"
#include "module_internal.h"

struct json_t;

/* ------------------------------------------------------------ module types */

extern const grove_module_type grove__sequential_type;
extern const grove_module_type grove__module_list_type;
extern const grove_module_type grove__module_dict_type;
extern const grove_module_type grove__linear_type;
extern const grove_module_type grove__identity_type;
extern const grove_module_type grove__flatten_type;
extern const grove_module_type grove__dropout_type;
extern const grove_module_type grove__relu_type;
extern const grove_module_type grove__leaky_relu_type;
extern const grove_module_type grove__gelu_type;
extern const grove_module_type grove__silu_type;
extern const grove_module_type grove__sigmoid_type;
/* ops_pointwise.c */
extern const grove_module_type grove__relu6_type, grove__hardswish_type, grove__hardsigmoid_type;
extern const grove_module_type grove__tanh_type;
extern const grove_module_type grove__softmax_type;
extern const grove_module_type grove__log_softmax_type;
extern const grove_module_type grove__softmin_type;
extern const grove_module_type grove__unfold_type;
extern const grove_module_type grove__batch_norm1d_type;
extern const grove_module_type grove__layer_norm_type;
extern const grove_module_type grove__embedding_type;
extern const grove_module_type grove__embedding_bag_type;
extern const grove_module_type grove__conv1d_type;
extern const grove_module_type grove__conv2d_type;
extern const grove_module_type grove__conv_transpose2d_type;
extern const grove_module_type grove__conv_transpose1d_type;
extern const grove_module_type grove__batch_norm2d_type;
extern const grove_module_type grove__max_pool2d_type;
extern const grove_module_type grove__avg_pool2d_type;
extern const grove_module_type grove__adaptive_avg_pool2d_type;
extern const grove_module_type grove__adaptive_max_pool2d_type;
extern const grove_module_type grove__max_pool1d_type;
extern const grove_module_type grove__avg_pool1d_type;
extern const grove_module_type grove__adaptive_avg_pool1d_type;
extern const grove_module_type grove__adaptive_max_pool1d_type;
extern const grove_module_type grove__mha_type;
extern const grove_module_type grove__tel_type;
extern const grove_module_type grove__te_type;
extern const grove_module_type grove__tdl_type;
extern const grove_module_type grove__td_type;
extern const grove_module_type grove__transformer_type;
/* RNN, LSTM, GRU (layers_rnn.c): one forward, three names. */
extern const grove_module_type *const grove__rnn_type;
extern const grove_module_type *const grove__lstm_type;
extern const grove_module_type *const grove__gru_type;
/* Whether m is an RNN, LSTM or GRU; whether an LSTM (its state is a pair:
 * a graph presents its outputs as (output, (h_n, c_n))). */
bool grove__is_rnn(const grove_module *m);
bool grove__rnn_is_lstm(const grove_module *m);

/* The activations' formulas, once (ops_activation.c): y[i] = act(x[i]) for n
 * elements (x == y allowed), torch's: ReLU keeps NaN, GELU exact or with the
 * tanh approximation, LeakyReLU with slope.  The op entries, the
 * transformer's feed-forward and the training forwards (train/) call it, so
 * a value computes alike in serving and training.  Any thread. */
enum {
  GROVE__ELT_RELU,
  GROVE__ELT_LEAKY_RELU,
  GROVE__ELT_GELU,
  GROVE__ELT_GELU_TANH,
  GROVE__ELT_SILU,
  GROVE__ELT_SIGMOID,
  GROVE__ELT_TANH,
};
void grove__elementwise(int act, float slope, const float *x, float *y, int64_t n);

/* Linear's forward with an activation applied in the same pass over the
 * output.  Sequential calls it with GROVE__ACT_RELU for a Linear followed by
 * a ReLU when no forward hook is registered anywhere; the result is exactly
 * that of Linear then ReLU. */
grove_status grove__linear_forward_act(const grove_module *m, grove_fwd *f, const grove_values *in,
                                       grove_values *out, grove__act act);

/* Whether a Linear, a MultiheadAttention holds its packed weights (for
 * tests: a tree built for a load packs nothing until the load; internal.h,
 * "deferred refresh").  A Conv2d's are grove__conv_rows_path's packs. */
bool grove__linear_packed(const grove_module *m);
bool grove__mha_packed(const grove_module *m);

/* Embedding's padding_idx (-1 for None), for tests and for the exporter's
 * round trip. */
int64_t grove__embedding_padding_idx(const grove_module *m);

/* Convolution with a per-output-channel epilogue: y = act(conv(x) * scale +
 * shift).  scale NULL means 1 and shift NULL the conv's bias, which is the
 * plain forward; a graph that fuses a following BatchNorm2d passes the
 * folded scale and (bias * scale + bn shift).  relu clamps at zero.
 * out_nhwc (honoured on the rows path, batched Conv2d; pass
 * f->channels_last_ok or what a container knows of the reader) lays the
 * output's memory out NHWC: the same [N, C, H, W] tensor with strides [HWC,
 * 1, WC, C], which a following convolution, BatchNorm2d, activation or
 * residual add reads without transposing (and anything else reads as the
 * strided tensor it is). */
grove_status grove__conv_forward_ex(const grove_module *m, grove_fwd *f, const grove_values *in,
                                    grove_values *out, const float *scale, const float *shift,
                                    grove__act act, bool out_nhwc);
/* conv, then the BatchNorm2d bn folded into its epilogue (bn NULL: none;
 * grove__conv_bn_fusable must hold), then the activation act (NONE: none):
 * one pass, as a graph or a Sequential fuses them when nothing observes the
 * layers.  The activation is grove__act_apply's, the formula its own module
 * runs, so the result is that of the modules one after the other.  The
 * forward's thread. */
grove_status grove__conv_bn_act_forward(const grove_module *conv, const grove_module *bn,
                                        grove__act act, grove_fwd *f, const grove_values *in,
                                        grove_values *out, bool out_nhwc);
/* Folds the BatchNorm2d bn that follows conv into conv's packed weight
 * (W * scale, bias * scale + shift), so that grove__conv_bn_act_forward's
 * product writes the output with no epilogue pass; only where that removes
 * a pass (the rows path, one group, no Winograd), else nothing.  The
 * parents that fuse (Sequential, a graph) call it from their refresh,
 * which runs after their children's on every load and reload; the conv's
 * own refresh drops it, and a forward uses it only while bn still has the
 * statistics it was made from.  One more packed copy of the weight.
 * Refresh time: no forward may run on conv meanwhile. */
grove_status grove__conv_fold_bn(grove_module *conv, const grove_module *bn, grove_err *err);
/* Whether conv holds a fold of bn (tests). */
bool grove__conv_fold_active(const grove_module *conv, const grove_module *bn);
/* The activation a convolution can fuse when module m follows it (ReLU,
 * ReLU6, Hardswish, Hardsigmoid, SiLU, Sigmoid), or GROVE__ACT_NONE. */
grove__act grove__fusable_act(const grove_module *m);
/* GROVE__ACT_GELU for a GELU module with approximate='none' (what a Linear's
 * epilogue can apply: layers_container.c), else GROVE__ACT_NONE
 * (ops_activation.c).  Any thread. */
grove__act grove__gelu_act(const grove_module *m);
/* Whether bn is an eval BatchNorm2d with running statistics over conv's
 * output channels, conv a Conv2d: then it folds into the convolution. */
bool grove__conv_bn_fusable(const grove_module *conv, const grove_module *bn);
/* The convolution modules' shared construction (layers_conv_new.c; Conv1d,
 * Conv2d, ConvTranspose1d/2d, and Bilinear's weight and bias): registers the zero weight of wnd dims wshape
 * and the bias [cout] (or None), refreshes, and sets *out; on failure m is
 * released. */
grove_status grove__conv_params(grove_module *m, int wnd, const int64_t *wshape, int64_t cout,
                                bool bias, grove_module **out, grove_err *err);
/* Frees n packs and their array (either may be NULL). */
void grove__packs_free(grove__linear_pack **packs, int64_t n);
/* A convolution's bias b (may be NULL) is [cout], w and b floating point:
 * GROVE_E_SHAPE / GROVE_E_DTYPE naming T otherwise. */
grove_status grove__conv_check_bias(const char *T, const grove_tensor *w, const grove_tensor *b,
                                    int64_t cout, grove_err *err);
/* model.json: the keys Conv1d/Conv2d and ConvTranspose2d share, read from
 * obj (its keys already checked by the caller) for an nd-dimensional
 * convolution named T: in_channels, out_channels, kernel_size, stride,
 * dilation, groups, bias and padding_mode into *cin, *cout and *o (the
 * caller reads padding, whose forms differ).  padding_mode must be zeros
 * and groups must divide both channel counts; errors name path and key. */
grove_status grove__conv_json_common(const struct json_t *obj, const char *path, const char *T,
                                     int nd, int64_t *cin, int64_t *cout, grove_conv_opts *o,
                                     grove_err *err);

/* The pools' one computation (layers_pool.c), which the pooling modules
 * (their impl is a grove__pool) and the functional forms (F.max_pool2d ...,
 * ops_pool.c) both run.  kind GROVE__POOL_*; nd 1 pools [N, C, L] as
 * [N, C, 1, L] with a window one high (index 0 of the arrays unused).  The
 * adaptive kinds read osize (-1: the input's size), the others k, stride,
 * pad, dil, ceil_mode, count_include_pad and divisor (0: None). */
enum { GROVE__POOL_MAX, GROVE__POOL_AVG, GROVE__POOL_ADAPTIVE, GROVE__POOL_ADAPTIVE_MAX };
typedef struct grove__pool {
  int kind;
  int nd;
  int64_t k[2], stride[2], pad[2], dil[2];
  bool ceil_mode, count_include_pad;
  int64_t divisor;
  int64_t osize[2];
} grove__pool;
/* torch's constructor checks (GROVE_E_INVALID_ARGUMENT naming T). */
grove_status grove__pool_check(const char *T, const grove__pool *p, grove_err *err);
/* out = the pool of in's one float32 tensor (a channels-last input is read
 * as it is and the result kept channels last); messages name T.  Any
 * thread; p is read only. */
grove_status grove__pool_run(const grove__pool *p, const char *T, grove_fwd *f,
                             const grove_values *in, grove_values *out);

/* Whether the Conv2d m runs the rows path (and so reads and writes NHWC). */
bool grove__conv_rows_path(const grove_module *m);
/* Whether the Conv2d m runs the depthwise kernel (also NHWC in and out). */
bool grove__conv_depthwise_path(const grove_module *m);
int64_t grove__conv_out_channels(const grove_module *m);
int64_t grove__conv_in_channels(const grove_module *m);
/* Whether the module m is a Conv2d that multiplies its input's channels by
 * grove_fwd.se.in_scale as it reads them: a 1x1 convolution, stride 1, no
 * padding, one group, on the rows path (its rows are then a scaled copy of
 * the input, made block by block in cache). */
bool grove__conv_takes_in_scale(const grove_module *m);
/* The conv's bias as float32 (zeros when it has none); out_channels floats. */
const float *grove__conv_bias(const grove_module *m);
/* BatchNorm2d's folded eval scale and shift (per channel), when it has
 * running statistics and is in eval mode; false otherwise. */
bool grove__bn2d_affine(const grove_module *m, const float **scale, const float **shift);
int64_t grove__bn2d_channels(const grove_module *m);
/* BatchNorm2d m's eval forward followed by the activation act (NONE: none)
 * in the same pass, on each run of output just written (a graph fuses a
 * BatchNorm2d with the activation after it: DenseNet's norm1 + relu1).
 * As the module's forward otherwise; any thread. */
grove_status grove__bn2d_act_forward(const grove_module *m, grove_fwd *f, const grove_values *in,
                                     grove_values *out, grove__act act);

/* Sets, in f (grove_fwd.mha), the need_weights / average_attn_weights of
 * the next forward of the MultiheadAttention m (read and cleared by it; any
 * other forward ignores it; m NULL drops them).  Module forwards take
 * tensors only, so a graph passes the call's keyword arguments this way,
 * explicitly in the forward's context.  The forward's thread. */
void grove__mha_next_call(grove_fwd *f, const grove_module *m, bool need_weights, bool average);
/* Sets the masks of the next forward of m (grove_fwd.mha.mask: n of them in
 * the order of m's forward, NULL for None), keeping need_weights /
 * average_attn_weights when grove__mha_next_call named m just before, else
 * torch's defaults.  The tensors stay the caller's and must outlive the
 * call.  The forward's thread. */
void grove__next_call_masks(grove_fwd *f, const grove_module *m, int n,
                            const grove_tensor *const *masks);
/* The masks set for m's forward (copied into masks[6]: NULL for None, all
 * NULL when the call was set for another module), and clears the call.
 * need_weights / average (NULL allowed) get the call's or torch's defaults. */
void grove__take_call(grove_fwd *f, const grove_module *m, const grove_tensor *masks[6],
                      bool *need_weights, bool *average);
/* Runs the MultiheadAttention m on query q, key k, value v with torch's
 * key_padding_mask kpm and attn_mask am (either NULL), as
 * F.multi_head_attention_forward does; out gets the output and, when
 * need_weights, the weights.  For the transformer layers, which call their
 * attention children directly. */
grove_status grove__mha_call(const grove_module *m, grove_fwd *f, const grove_tensor *q,
                             const grove_tensor *k, const grove_tensor *v, const grove_tensor *kpm,
                             const grove_tensor *am, bool need_weights, bool average,
                             grove_values *out);
/* Element off (in elements, from t->data) of an attention mask as torch
 * reads it: bool and uint8 as 1 / 0, float32 / float64 as their value. */
double grove__mask_at(const grove_tensor *t, int64_t off);
/* Adds *c (just built, with status s) to m as child name and drops the
 * caller's reference (*c is NULL afterwards).  Returns s when it failed. */
grove_status grove__add_child(grove_module *m, const char *name, grove_status s, grove_module **c,
                              grove_err *err);

/* ------------------------------------------------------------ settings */

/* A layer's constructor settings as its builder read them from model.json
 * and its impl keeps them: what the training replica (core/train/train.c)
 * runs a layer with, so that model.json is decoded once, by the builders.
 * Conv1d's one spatial size is index 1 of the pairs (it runs as a conv over
 * [N, C, 1, L]). */
/* (A macro, so that the training replica's grove__tinfo can hold the same
 * fields both as one grove__layer_settings and by name: backward.h.) */
#define GROVE__LAYER_SETTINGS_FIELDS \
  /* Activations (op modules). */                                   \
  double slope;     /* LeakyReLU */                                 \
  bool tanh_approx; /* GELU */                                      \
  bool has_dim;     /* Softmax / LogSoftmax (false: dim=None) */    \
  int dim;                                                          \
  /* Flatten. */                                                    \
  int start_dim, end_dim;                                           \
  /* Dropout (and the dropout of MHA / TEL). */                     \
  double p;                                                         \
  /* Norms. */                                                      \
  double eps, momentum; /* momentum NaN = None */                   \
  bool affine, track;                                               \
  int conv_dims; /* BatchNorm: 1 or 2; Conv: 1 or 2 */              \
  int ln_ndim;   /* LayerNorm's normalized_shape */                 \
  int64_t ln_shape[GROVE_MAX_DIMS];                                 \
  /* Embedding. */                                                  \
  int64_t padding_idx; /* -1 for None */                            \
  bool scale_grad_by_freq, sparse;                                  \
  /* Conv and pools: [0] = H, [1] = W (1-d: [0] unused = 1 / 0). */ \
  int64_t in_channels, out_channels, groups;                        \
  int64_t kernel[2], stride[2], pad_lo[2], pad_hi[2], dilation[2];  \
  bool ceil_mode, count_include_pad;                                \
  int64_t divisor_override; /* 0 = None */                          \
  int64_t out_size[2];      /* AdaptiveAvgPool2d, -1 = None */      \
  /* Attention. */                                                  \
  int64_t embed_dim, num_heads, dim_feedforward;                    \
  bool batch_first, norm_first, gelu_ff;                            \
  bool mha_extras; /* add_bias_kv, add_zero_attn, kdim/vdim != E */ \
  double ln_eps;

typedef struct grove__layer_settings {
  GROVE__LAYER_SETTINGS_FIELDS
} grove__layer_settings;

/* m's settings (layer_settings.c, from the files' accessors below); false
 * for a module without any (Linear, containers, graphs).  Any thread. */
bool grove__layer_settings_of(const grove_module *m, grove__layer_settings *s);
void grove__conv_settings(const grove_module *m, grove__layer_settings *s);
void grove__bn_settings(const grove_module *m, grove__layer_settings *s);
void grove__ln_settings(const grove_module *m, grove__layer_settings *s);
void grove__pool_settings(const grove_module *m, grove__layer_settings *s);
void grove__embedding_settings(const grove_module *m, grove__layer_settings *s);
void grove__mha_settings(const grove_module *m, grove__layer_settings *s);
void grove__tel_settings(const grove_module *m, grove__layer_settings *s);

/* ------------------------------------------------------------ forward helpers */

/* Checks that in holds exactly one tensor of dtype dt (GROVE_DTYPE_COUNT:
 * any dtype, for the layers that only move data) and sets *x to it, or,
 * when it is not contiguous, to a contiguous copy in f's arena (inputs from a
 * user may be strided views; every layer runs on contiguous memory).  layer
 * names the layer in messages.  GROVE_E_INVALID_ARGUMENT for a wrong count,
 * GROVE_E_DTYPE for a wrong dtype, GROVE_E_NOMEM when the arena cannot grow. */
grove_status grove__layer_input(const char *layer, grove_fwd *f, const grove_values *in,
                                grove_dtype dt, grove_tensor *x);

/* Copies a parameter or buffer of exactly n elements into dst as float32
 * (any strides, any float dtype).  For refresh slots: derived copies live in
 * impl so that forward reads nothing else.  GROVE_E_SHAPE naming layer and
 * what when the element count differs. */
grove_status grove__copy_f32(float *dst, int64_t n, const grove_tensor *src, const char *layer,
                             const char *what, grove_err *err);

/* Wraps grove_module_new for the constructors: *out is the module, or NULL
 * with the status (GROVE_E_NOMEM when err says nothing). */
grove_status grove__layer_make(const grove_module_type *type, void *impl, grove_module **out,
                               grove_err *err);
/* Registers a new tensor of this shape and dtype, every element fill
 * (float32) or 0, as m's parameter (or persistent buffer) name. */
grove_status grove__layer_param(grove_module *m, const char *name, bool buffer, int ndim,
                                const int64_t *shape, grove_dtype dt, float fill, grove_err *err);
/* layers_norm.c: torch's slots of the normalisation layers, in torch's
 * order, on m.  grove__norm_affine: the parameters weight (ones) and bias
 * (zeros) of this shape, or both None without affine.  grove__norm_running:
 * the buffers running_mean (zeros) and running_var (ones) of C floats and
 * num_batches_tracked (an int64 0), or all three None without running. */
grove_status grove__norm_affine(grove_module *m, int ndim, const int64_t *shape, bool affine,
                                grove_err *err);
grove_status grove__norm_running(grove_module *m, int64_t C, bool running, grove_err *err);
/* GROVE_E_SHAPE: "<layer>: expected <want>, got input of shape [...]". */
grove_status grove__shape_error(grove_fwd *f, const char *layer, const char *want,
                                const grove_tensor *x);
/* MultiheadAttention's one head (layers_attention.c), for the other
 * attentions of the op table (Swin's shifted windows, ops_window.c):
 * o[l] = softmax(scale * q[l] . k^T + madd[l]) . v over L query and S key
 * rows (q, k, v, o rows rs* floats apart, d floats each), madd the additive
 * mask or NULL with row l at madd + l * ldm (ldm 0: one row for every l),
 * sc [L, S] and kt [d, S] the caller's scratch.  Any thread (inside a
 * grove__parallel_for's fn too when grove__attend_head_threads says so); no
 * allocation. */
void grove__attend_head(const float *q, int64_t rsq, const float *k, int64_t rsk, const float *v,
                        int64_t rsv, float *o, int64_t rso, int64_t L, int64_t S, int64_t d,
                        float scale, const float *madd, int64_t ldm, float *sc, float *kt);
/* Whether heads of these sizes may run on several compute threads at once:
 * false when grove__attend_head calls OpenBLAS (no AVX-512, a large head),
 * whose own threads are not for calls from ours. */
bool grove__attend_head_threads(int64_t L, int64_t S, int64_t d);
/* GROVE_E_NOMEM: "<layer>: scratch arena is exhausted". */
grove_status grove__scratch_error(grove_fwd *f, const char *layer);

/* ------------------------------------------------------------ model.json args */

/* Readers of one constructor argument `key` of the JSON object obj at JSON
 * path `path` (the object's own path, "$.module.children[2]").  Each returns
 * GROVE_OK and sets *out, or GROVE_E_SPEC with a message naming path.key, what
 * was expected and what was found.  When the key is absent, a required one is
 * an error ("missing required argument") and an optional one sets *out to
 * dflt.  `type` is the torch class name, for messages. */

/* Every key of obj must be one of allowed (NULL-terminated) or one of the
 * keys spec.c reads (type, children, ref, tied, graph). */
grove_status grove__json_check_keys(const struct json_t *obj, const char *path, const char *type,
                                    const char *const *allowed, grove_err *err);

/* A JSON integer in [min, max]. */
grove_status grove__json_int(const struct json_t *obj, const char *path, const char *type,
                             const char *key, bool required, int64_t dflt, int64_t min, int64_t max,
                             int64_t *out, grove_err *err);
/* As grove__json_int, but null is allowed too and sets *is_null (an absent
 * key means null when dflt_null, else dflt). */
grove_status grove__json_int_or_null(const struct json_t *obj, const char *path, const char *type,
                                     const char *key, bool dflt_null, int64_t dflt, int64_t min,
                                     int64_t max, int64_t *out, bool *is_null, grove_err *err);
/* A JSON number (integer or real) in [min, max]. */
grove_status grove__json_number(const struct json_t *obj, const char *path, const char *type,
                                const char *key, double dflt, double min, double max, double *out,
                                grove_err *err);
/* A number or null (absent = dflt, or null when dflt_null). */
grove_status grove__json_number_or_null(const struct json_t *obj, const char *path,
                                        const char *type, const char *key, bool dflt_null,
                                        double dflt, double min, double max, double *out,
                                        bool *is_null, grove_err *err);
/* true or false. */
grove_status grove__json_bool(const struct json_t *obj, const char *path, const char *type,
                              const char *key, bool dflt, bool *out, grove_err *err);
/* One of the strings in choices (NULL-terminated); *out is its index. */
grove_status grove__json_choice(const struct json_t *obj, const char *path, const char *type,
                                const char *key, int dflt, const char *const *choices, int *out,
                                grove_err *err);
/* A shape: one positive integer, or a non-empty array of at most max_dims of
 * them (torch's `int or list or torch.Size`).  Required. */
grove_status grove__json_shape(const struct json_t *obj, const char *path, const char *type,
                               const char *key, int max_dims, int *ndim, int64_t *shape,
                               grove_err *err);

/* torch's `int or tuple`: one integer in [min, max] for every one of nd
 * dims, or an array of exactly nd of them.  Absent: dflt for every dim
 * (dflt < min means required). */
grove_status grove__json_ints(const struct json_t *obj, const char *path, const char *type,
                              const char *key, int nd, int64_t dflt, int64_t min, int64_t max,
                              int64_t *out, grove_err *err);

/* Reports an argument Grove knows but does not run (Embedding's max_norm):
 * GROVE_E_UNSUPPORTED naming path.key and why. */
grove_status grove__json_unsupported(const char *path, const char *key, const char *why,
                                     grove_err *err);

/* Passes a constructor's status through, except that GROVE_E_INVALID_ARGUMENT
 * (values the readers let through but the constructor refused: a weight too
 * large to count) becomes GROVE_E_SPEC with path in front of the message:
 * it is still the spec that is wrong.  GROVE_E_NOMEM (a size that fits but
 * cannot be allocated: in_features 2^40) keeps its code and gets path in
 * front too. */
grove_status grove__json_built(const char *path, grove_status s, grove_err *err);

/* ------------------------------------------------------------ builders */

/* One per torch.nn type: reads obj's arguments (see grove__from_json_fn in
 * internal.h) and builds the module with its constructor. */
grove_status grove__sequential_from_json(const struct json_t *obj, const char *path,
                                         grove_module **out, grove_err *err);
grove_status grove__module_list_from_json(const struct json_t *obj, const char *path,
                                          grove_module **out, grove_err *err);
grove_status grove__module_dict_from_json(const struct json_t *obj, const char *path,
                                          grove_module **out, grove_err *err);
grove_status grove__linear_from_json(const struct json_t *obj, const char *path, grove_module **out,
                                     grove_err *err);
grove_status grove__bilinear_from_json(const struct json_t *obj, const char *path,
                                       grove_module **out, grove_err *err);
grove_status grove__identity_from_json(const struct json_t *obj, const char *path,
                                       grove_module **out, grove_err *err);
grove_status grove__batch_norm1d_from_json(const struct json_t *obj, const char *path,
                                           grove_module **out, grove_err *err);
grove_status grove__layer_norm_from_json(const struct json_t *obj, const char *path,
                                         grove_module **out, grove_err *err);
grove_status grove__embedding_from_json(const struct json_t *obj, const char *path,
                                        grove_module **out, grove_err *err);
grove_status grove__conv1d_from_json(const struct json_t *obj, const char *path,
                                     grove_module **out, grove_err *err);
grove_status grove__conv2d_from_json(const struct json_t *obj, const char *path,
                                     grove_module **out, grove_err *err);
grove_status grove__batch_norm2d_from_json(const struct json_t *obj, const char *path,
                                           grove_module **out, grove_err *err);
grove_status grove__max_pool2d_from_json(const struct json_t *obj, const char *path,
                                         grove_module **out, grove_err *err);
grove_status grove__avg_pool2d_from_json(const struct json_t *obj, const char *path,
                                         grove_module **out, grove_err *err);
grove_status grove__conv_transpose2d_from_json(const struct json_t *obj, const char *path,
                                               grove_module **out, grove_err *err);
grove_status grove__conv_transpose1d_from_json(const struct json_t *obj, const char *path,
                                               grove_module **out, grove_err *err);
grove_status grove__adaptive_avg_pool2d_from_json(const struct json_t *obj, const char *path,
                                                  grove_module **out, grove_err *err);
/* layers_norm_group.c: the modules whose functional forms are op-table
 * entries; each forward runs its function's kernel (tensor_ops.h).  The
 * constructors make torch's parameter slots with torch's initial values;
 * *out is owned by the caller. */
grove_status grove_group_norm_new(int64_t num_groups, int64_t num_channels, double eps,
                                  bool affine, grove_module **out, grove_err *err);
grove_status grove_instance_norm_new(int spatial, int64_t num_features, double eps, bool affine,
                                     bool track_running_stats, grove_module **out,
                                     grove_err *err);
grove_status grove_prelu_new(int64_t num_parameters, double init, grove_module **out,
                             grove_err *err);
grove_status grove__group_norm_from_json(const struct json_t *obj, const char *path,
                                         grove_module **out, grove_err *err);
grove_status grove__instance_norm1d_from_json(const struct json_t *obj, const char *path,
                                              grove_module **out, grove_err *err);
grove_status grove__instance_norm2d_from_json(const struct json_t *obj, const char *path,
                                              grove_module **out, grove_err *err);
grove_status grove__prelu_from_json(const struct json_t *obj, const char *path,
                                    grove_module **out, grove_err *err);
grove_status grove__adaptive_max_pool2d_from_json(const struct json_t *obj, const char *path,
                                                  grove_module **out, grove_err *err);
grove_status grove__max_pool1d_from_json(const struct json_t *obj, const char *path,
                                         grove_module **out, grove_err *err);
grove_status grove__avg_pool1d_from_json(const struct json_t *obj, const char *path,
                                         grove_module **out, grove_err *err);
grove_status grove__adaptive_avg_pool1d_from_json(const struct json_t *obj, const char *path,
                                                  grove_module **out, grove_err *err);
grove_status grove__adaptive_max_pool1d_from_json(const struct json_t *obj, const char *path,
                                                  grove_module **out, grove_err *err);
grove_status grove__multihead_attention_from_json(const struct json_t *obj, const char *path,
                                                  grove_module **out, grove_err *err);
grove_status grove__transformer_encoder_layer_from_json(const struct json_t *obj,
                                                        const char *path, grove_module **out,
                                                        grove_err *err);
grove_status grove__transformer_encoder_from_json(const struct json_t *obj, const char *path,
                                                  grove_module **out, grove_err *err);
grove_status grove__transformer_decoder_layer_from_json(const struct json_t *obj,
                                                        const char *path, grove_module **out,
                                                        grove_err *err);
grove_status grove__transformer_decoder_from_json(const struct json_t *obj, const char *path,
                                                  grove_module **out, grove_err *err);
grove_status grove__transformer_from_json(const struct json_t *obj, const char *path,
                                          grove_module **out, grove_err *err);
grove_status grove__embedding_bag_from_json(const struct json_t *obj, const char *path,
                                            grove_module **out, grove_err *err);
grove_status grove__rnn_from_json(const struct json_t *obj, const char *path, grove_module **out,
                                  grove_err *err);
grove_status grove__lstm_from_json(const struct json_t *obj, const char *path, grove_module **out,
                                   grove_err *err);
grove_status grove__gru_from_json(const struct json_t *obj, const char *path, grove_module **out,
                                  grove_err *err);
grove_status grove__rnn_cell_from_json(const struct json_t *obj, const char *path,
                                       grove_module **out, grove_err *err);
grove_status grove__lstm_cell_from_json(const struct json_t *obj, const char *path,
                                        grove_module **out, grove_err *err);
grove_status grove__gru_cell_from_json(const struct json_t *obj, const char *path,
                                       grove_module **out, grove_err *err);

#endif
