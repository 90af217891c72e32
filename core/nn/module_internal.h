/* module_internal.h: the Module tree's non-public helpers (module.c,
 * layer_registry.c; core/nn/), which the layers, graphs, model.c and the
 * training replica use: the hook counter, deferred refresh, contiguous
 * inputs, the table of torch.nn types.  Never installed (tests may include
 * it). */
#ifndef GROVE_CORE_MODULE_INTERNAL_H
#define GROVE_CORE_MODULE_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "grove/grove.h"
#include "kernels.h"

/* ------------------------------------------------------------ hooks */

/* How many forward hooks are registered anywhere (module or global).  Zero
 * means every grove_module_forward takes the direct path. */
extern atomic_long grove__forward_hook_count;

static inline bool grove__no_forward_hooks(void) {
  return atomic_load_explicit(&grove__forward_hook_count, memory_order_relaxed) == 0;
}

/* ------------------------------------------------------------ deferred refresh */

/* A layer's refresh derives what its forward reads from the weights: Linear,
 * Conv1d/2d and MultiheadAttention pack theirs for the GEMM kernel, a full
 * copy or more of the weights.  Their constructors refresh at once, so that a
 * new module runs forward on its zero weights.  grove_model_open, which loads
 * a checkpoint into the tree right after building it, instead builds inside
 * a deferral: those constructors then mark the module refresh_pending and
 * pack nothing, and load_state_dict's refresh packs the real weights once.
 * Without it every reload built (and faulted in) a packed copy of zeros on
 * top of old + new.
 *
 * The deferral is the calling thread's (a counter, so scopes nest): the
 * layer builders share one signature with the 28 types that have nothing to
 * defer, and the layers that build layers (TransformerEncoder, Multihead-
 * Attention's out_proj) call the public constructors. */
void grove__refresh_defer_begin(void);
void grove__refresh_defer_end(void);
/* A constructor's first refresh: m->type->refresh(m), or, inside a
 * deferral, only m->refresh_pending = true. */
grove_status grove__refresh_new(grove_module *m, grove_err *err);
/* Refreshes every module of root's tree whose refresh is still pending
 * (none after a load_state_dict of the whole tree), so that the tree can run
 * forward.  Stops at the first error. */
grove_status grove__refresh_pending(grove_module *root, grove_err *err);

/* ------------------------------------------------------------ contiguous inputs */

/* t itself when contiguous, else a contiguous copy of it in f's arena (a
 * channels-last float32 tensor by a transpose per image); module.c.  The
 * forward's thread. */
grove_status grove__fwd_contig(grove_fwd *f, const grove_tensor *t, grove_tensor *out);
/* The same for every NHWC tensor of v (the others are left as they are). */
grove_status grove__plain_values(grove_fwd *f, grove_values *v);

/* ------------------------------------------------------------ layer registry */

/* Builds one module from its model.json object (the "type" key already
 * read).  path is the JSON path of obj for messages ("$.module.children[2]");
 * an error names path plus the key ("$.module.children[2].out_features:
 * expected a positive integer") with GROVE_E_SPEC.  Containers come back
 * empty: spec.c adds their children.  Unknown keys are GROVE_E_SPEC too
 * (a misspelt argument must not be ignored), except "type", "children",
 * "ref", "tied" and "graph", which spec.c reads. */
struct json_t;
typedef grove_status (*grove__from_json_fn)(const struct json_t *obj, const char *path,
                                            grove_module **out, grove_err *err);

typedef struct grove__layer_def {
  const char *type; /* torch.nn class name */
  grove__from_json_fn from_json;
  bool container; /* holds "children" (Sequential, ModuleList, ModuleDict) */
} grove__layer_def;

/* What a JSON value is, for "got ..." in spec messages: the value itself
 * when it is short (numbers, short strings), else its kind. */
void grove__json_describe(const struct json_t *v, char *buf, size_t n);

/* The def for a torch.nn type name, or NULL when Grove does not run it. */
const grove__layer_def *grove__layer_find(const char *type);
/* All defs, for messages listing what is supported; *n set to the count. */
const grove__layer_def *grove__layer_defs(size_t *n);

#endif
