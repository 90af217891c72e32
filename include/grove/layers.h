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

/* The type of m by torch class name ("Linear"). */
const char *grove_module_type_name(const grove_module *m);

#ifdef __cplusplus
}
#endif
#endif
