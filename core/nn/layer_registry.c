/* layer_registry.c: the table of torch.nn types that model.json may name,
 * each with its builder (the layer files' *_from_json).  The typed readers
 * the builders use are in layer_json.c, below the layers. */
#include <jansson.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "layers_internal.h"
#include "ops.h"

/* ------------------------------------------------------------ the table */

/* Sorted as torch.nn's documentation lists them: containers first. */
static const grove__layer_def defs[] = {
    {"Sequential", grove__sequential_from_json, true},
    {"ModuleList", grove__module_list_from_json, true},
    {"ModuleDict", grove__module_dict_from_json, true},
    {"Linear", grove__linear_from_json, false},
    {"Identity", grove__identity_from_json, false},
    {"Flatten", grove__op_module_from_json, false},
    {"Dropout", grove__op_module_from_json, false},
    {"Dropout1d", grove__op_module_from_json, false},
    {"Dropout2d", grove__op_module_from_json, false},
    {"Dropout3d", grove__op_module_from_json, false},
    {"AlphaDropout", grove__op_module_from_json, false},
    {"FeatureAlphaDropout", grove__op_module_from_json, false},
    {"ReLU", grove__op_module_from_json, false},
    {"LeakyReLU", grove__op_module_from_json, false},
    {"GELU", grove__op_module_from_json, false},
    {"SiLU", grove__op_module_from_json, false},
    {"Sigmoid", grove__op_module_from_json, false},
    {"Tanh", grove__op_module_from_json, false},
    {"Softmax", grove__op_module_from_json, false},
    {"LogSoftmax", grove__op_module_from_json, false},
    {"ReLU6", grove__op_module_from_json, false},
    {"Hardswish", grove__op_module_from_json, false},
    {"Hardsigmoid", grove__op_module_from_json, false},
    {"Mish", grove__op_module_from_json, false},
    {"SELU", grove__op_module_from_json, false},
    {"Hardtanh", grove__op_module_from_json, false},
    {"ELU", grove__op_module_from_json, false},
    {"CELU", grove__op_module_from_json, false},
    {"Softplus", grove__op_module_from_json, false},
    {"Softsign", grove__op_module_from_json, false},
    {"GLU", grove__op_module_from_json, false},
    {"CosineSimilarity", grove__op_module_from_json, false},
    {"PairwiseDistance", grove__op_module_from_json, false},
    {"LogSigmoid", grove__op_module_from_json, false},
    {"Softmin", grove__op_module_from_json, false},
    {"Unfold", grove__op_module_from_json, false},
    {"Tanhshrink", grove__op_module_from_json, false},
    {"Hardshrink", grove__op_module_from_json, false},
    {"Softshrink", grove__op_module_from_json, false},
    {"Threshold", grove__op_module_from_json, false},
    {"PixelShuffle", grove__op_module_from_json, false},
    {"LocalResponseNorm", grove__op_module_from_json, false},
    {"Upsample", grove__op_module_from_json, false},
    {"ConstantPad1d", grove__op_module_from_json, false},
    {"ConstantPad2d", grove__op_module_from_json, false},
    {"ConstantPad3d", grove__op_module_from_json, false},
    {"ZeroPad2d", grove__op_module_from_json, false},
    {"PixelUnshuffle", grove__op_module_from_json, false},
    {"Unflatten", grove__op_module_from_json, false},
    {"ReflectionPad1d", grove__op_module_from_json, false},
    {"ReflectionPad2d", grove__op_module_from_json, false},
    {"ReflectionPad3d", grove__op_module_from_json, false},
    {"ReplicationPad1d", grove__op_module_from_json, false},
    {"ReplicationPad2d", grove__op_module_from_json, false},
    {"ReplicationPad3d", grove__op_module_from_json, false},
    {"GroupNorm", grove__group_norm_from_json, false},
    {"InstanceNorm1d", grove__instance_norm1d_from_json, false},
    {"InstanceNorm2d", grove__instance_norm2d_from_json, false},
    {"PReLU", grove__prelu_from_json, false},
    {"BatchNorm1d", grove__batch_norm1d_from_json, false},
    {"LayerNorm", grove__layer_norm_from_json, false},
    {"Embedding", grove__embedding_from_json, false},
    {"EmbeddingBag", grove__embedding_bag_from_json, false},
    {"Conv1d", grove__conv1d_from_json, false},
    {"Conv2d", grove__conv2d_from_json, false},
    {"ConvTranspose2d", grove__conv_transpose2d_from_json, false},
    {"ConvTranspose1d", grove__conv_transpose1d_from_json, false},
    {"BatchNorm2d", grove__batch_norm2d_from_json, false},
    {"MaxPool2d", grove__max_pool2d_from_json, false},
    {"AvgPool2d", grove__avg_pool2d_from_json, false},
    {"MaxPool1d", grove__max_pool1d_from_json, false},
    {"AvgPool1d", grove__avg_pool1d_from_json, false},
    {"AdaptiveAvgPool1d", grove__adaptive_avg_pool1d_from_json, false},
    {"AdaptiveAvgPool2d", grove__adaptive_avg_pool2d_from_json, false},
    {"AdaptiveMaxPool1d", grove__adaptive_max_pool1d_from_json, false},
    {"AdaptiveMaxPool2d", grove__adaptive_max_pool2d_from_json, false},
    {"MultiheadAttention", grove__multihead_attention_from_json, false},
    {"TransformerEncoderLayer", grove__transformer_encoder_layer_from_json, false},
    {"TransformerEncoder", grove__transformer_encoder_from_json, false},
    {"TransformerDecoderLayer", grove__transformer_decoder_layer_from_json, false},
    {"TransformerDecoder", grove__transformer_decoder_from_json, false},
    {"Transformer", grove__transformer_from_json, false},
    {"RNN", grove__rnn_from_json, false},
    {"LSTM", grove__lstm_from_json, false},
    {"GRU", grove__gru_from_json, false},
    {"Bilinear", grove__bilinear_from_json, false},
    {"RNNCell", grove__rnn_cell_from_json, false},
    {"LSTMCell", grove__lstm_cell_from_json, false},
    {"GRUCell", grove__gru_cell_from_json, false},
};

const grove__layer_def *grove__layer_find(const char *type) {
  if (!type) return NULL;
  for (size_t i = 0; i < sizeof defs / sizeof defs[0]; i++)
    if (strcmp(defs[i].type, type) == 0) return &defs[i];
  return NULL;
}

const grove__layer_def *grove__layer_defs(size_t *n) {
  if (n) *n = sizeof defs / sizeof defs[0];
  return defs;
}
