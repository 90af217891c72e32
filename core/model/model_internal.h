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

/* Asks m whether dimension 0 of its inputs is a batch of independent rows
 * (model_probe.c: three small forwards on random inputs) and, when it is
 * not, sets m->batching.max_batch_size to 0 (served one request per forward)
 * with a warning that names the output and why.  A spec's own 0 is kept
 * without probing.  Errors only for lack of memory; a probe that cannot run
 * leaves m as it was.  Called by grove_model_open on the opening thread,
 * before m is shared. */
grove_status grove__model_probe_rows(grove_model *m, grove_err *err);

#endif
