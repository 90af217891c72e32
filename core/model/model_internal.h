/* model_internal.h: what the model layer (core/model/) offers the code above
 * it beyond include/grove/model.h: the weights-file search of a model
 * directory, which groved's reload uses so that there is one search, not
 * two.  Never installed. */
#ifndef GROVE_CORE_MODEL_INTERNAL_H
#define GROVE_CORE_MODEL_INTERNAL_H

#include "grove/grove.h"

/* The weights file grove_model_open picks in dir when given none: the one
 * model.json names ("weights"), else the first of weights.safetensors, .pt,
 * .pth, .bin that exists (model.c; groved's reload names it before opening).
 * *path malloc'd; GROVE_E_NOT_FOUND naming what was looked for when there is
 * none.  Any thread. */
grove_status grove__model_dir_weights(const char *dir, char **path, grove_err *err);
/* Those names, in that order, NULL-terminated (--watch reloads when one is
 * replaced). */
extern const char *const grove__model_weight_names[];
/* "buffers.safetensors": the values of the non-persistent buffers beside the
 * weights (model.c; --watch reloads when it is replaced too). */
extern const char grove__model_buffers_name[];

#endif
