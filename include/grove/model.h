/* model.h: a model directory (model.json + weights) opened into a ready,
 * eval-mode Module tree with its input/output spec and serving settings.
 *
 *   models/digits/
 *     model.json            architecture (torch.nn names) + serving settings
 *     weights.safetensors   or weights.pt / .pth / .bin
 *
 * See docs/model-spec.md for the format. */
#ifndef GROVE_MODEL_H
#define GROVE_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "grove/arena.h"
#include "grove/module.h"
#include "grove/state_dict.h"
#include "grove/status.h"
#include "grove/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One named input or output.  Dimension 0 is the batch; -1 is "any". */
typedef struct grove_io_spec {
  char *name;
  grove_dtype dtype;
  int ndim;
  int64_t shape[GROVE_MAX_DIMS];
} grove_io_spec;

typedef struct grove_batching {
  int64_t max_batch_size;     /* rows; default 64.  0: unbatched, one request per forward with
                                 its inputs whole (Triton's max_batch_size 0); set by
                                 grove_model_probe_batching when the model's dimension 0 is
                                 not a batch of independent rows (docs/model-spec.md) */
  int64_t max_queue_delay_us; /* default 500 */
  int64_t max_queue_size;     /* requests; default 1024 */
} grove_batching;

typedef struct grove_model {
  char *name;         /* model.json "name", else the directory's base name */
  char *dir;          /* the directory as given */
  char *weights_path; /* the weights file that was loaded; NULL if none */
  grove_module *root; /* eval mode, loaded; owned */
  size_t ninputs, noutputs;
  grove_io_spec *inputs, *outputs;
  grove_batching batching;
  int64_t param_count;   /* de-duplicated parameter elements */
  size_t weight_bytes;   /* bytes of the state_dict's tensors */
  size_t arena_bytes;    /* scratch one forward at max_batch_size needs, extrapolated from
                            the open's trial forwards (docs/model-spec.md) */
} grove_model;

/* Parses a model.json text into a new tree (eval mode, zero weights) and the
 * io spec and batching of *out (root set; weights_path NULL).  origin names
 * the file in messages.  An error names the JSON path that is wrong
 * ("model.json: $.module.children[2].out_features: expected a positive
 * integer").  The caller frees *out with grove_model_free. */
grove_status grove_model_from_spec(const char *json_text, const char *origin, grove_model **out,
                                   grove_err *err);

typedef struct grove_model_opts {
  const char *weights;  /* a checkpoint to load instead of the directory's */
  bool non_strict;      /* load_state_dict(strict=False) */
} grove_model_opts;

/* Opens dir: parses model.json, reads the weights file, loads it all or
 * nothing (strict unless opts say otherwise), puts the tree in eval mode and
 * sizes the scratch from trial forwards at batch 2 and 4, extrapolated to
 * max_batch_size (docs/model-spec.md).  opts may be NULL.
 * *out is new and the caller's.  Any thread; nothing shared. */
grove_status grove_model_open(const char *dir, const grove_model_opts *opts, grove_model **out,
                              grove_err *err);
/* NULL is a no-op. */
void grove_model_free(grove_model *m);

/* Asks m whether dimension 0 of its inputs is a batch of independent rows,
 * as a server that concatenates requests along it needs (core/model/
 * model_probe.c: three small forwards on random inputs, row A, row B, and A
 * and B as one batch).  When it is not (a sequence-first recurrent or
 * attention layer, a recurrent net's h_n), sets m->batching.max_batch_size
 * to 0, unbatched, and logs a warning (model.unbatched) that names the
 * output and why.  A spec's own 0 is kept without probing, and a probe that
 * cannot run leaves m as it was.  Errors only for lack of memory.  groved
 * calls it on every version it opens; grove_model_forward never needs it.
 * The thread that owns m, before m is shared. */
grove_status grove_model_probe_batching(grove_model *m, grove_err *err);

/* Checks inputs against the spec (count, dtype, rank, every non-batch
 * dimension); the message names the input, what came and what was
 * expected. */
grove_status grove_model_check_inputs(const grove_model *m, const grove_tensor *inputs, size_t n,
                                      grove_err *err);
/* Checks and runs one forward.  Outputs live in arena until it is reset.
 * Any thread, concurrently, each with its own arena. */
grove_status grove_model_forward(const grove_model *m, grove_arena *arena,
                                 const grove_tensor *inputs, size_t n, grove_values *out,
                                 grove_err *err);

#ifdef __cplusplus
}
#endif
#endif
