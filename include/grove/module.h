/* module.h: the Module tree, with torch.nn.Module's semantics.
 *
 * A grove_module has a type (a vtable), ordered parameters (a slot may hold
 * NULL, like None), ordered buffers each with a persistent flag, ordered named
 * children, a training flag, and hook lists.  Modules and tensors are
 * refcounted, so one module or one tensor may be reachable from two places
 * (tied weights); traversals de-duplicate exactly as PyTorch does.
 *
 * Threading: building, registering, loading and hook registration mutate the
 * tree and must happen on one thread while nothing else uses that tree.  After
 * that the tree is immutable: grove_module_forward takes it const and any
 * number of threads may run forward on it at once, each with its own arena.
 * The training flag is set when a tree is built and never toggled on a request
 * path (serving trees are eval-mode; training uses its own replica).
 */
#ifndef GROVE_MODULE_H
#define GROVE_MODULE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "grove/arena.h"
#include "grove/state_dict.h"
#include "grove/status.h"
#include "grove/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct grove_module grove_module;

/* ------------------------------------------------------ forward plumbing */

/* Up to this many tensors go in or out of one module call (MultiheadAttention
 * returns two; fx graphs pass a few). */
#define GROVE_MAX_VALUES 4

typedef struct grove_values {
  int n;
  grove_tensor v[GROVE_MAX_VALUES]; /* plain values: memory owned elsewhere */
} grove_values;

/* A per-call observer of module inputs and outputs: forward hooks that belong
 * to one forward pass instead of to the tree.  groved's hook telemetry uses it
 * because the served tree is immutable and shared by every worker, so hooks
 * cannot be registered on it from a request path.
 *
 * modules lists the watched modules (n of them, unique, sorted by address as
 * uintptr_t), kinds[i] says what is watched on modules[i]
 * (GROVE_OBSERVE_PRE: its input, as a forward pre-hook sees it, after the
 * module's own pre-hooks; GROVE_OBSERVE_POST: its output, as a forward hook
 * sees it, after the module's own hooks).  fn(ctx, i, kind, module, values)
 * runs on the forward's thread each time a watched module is called; it may
 * read values (plain tensors, valid only during the call) and must not modify
 * them, allocate from the forward's arena, or fail: an observer never changes
 * a prediction.  While an observer watches a Linear or the ReLU after it,
 * Sequential does not fuse the two, so each is seen on its own.
 *
 * The whole struct, and every array it points to, is the caller's and must
 * stay unchanged until the forward returns. */
typedef enum grove_observe_kind {
  GROVE_OBSERVE_PRE = 1,
  GROVE_OBSERVE_POST = 2,
} grove_observe_kind;

typedef struct grove_observer {
  const grove_module *const *modules;
  const unsigned char *kinds; /* bit set of grove_observe_kind per module */
  size_t n;
  void (*fn)(void *ctx, size_t index, grove_observe_kind kind, const grove_module *m,
             const grove_values *values);
  void *ctx;
} grove_observer;

/* One forward pass's context.  The caller owns it and the arena; outputs
 * live in the arena until the caller resets it.  err may be NULL.  observer
 * may be NULL (the usual case: nothing is watched, and forward costs exactly
 * what it did before observers existed). */
typedef struct grove_fwd {
  grove_arena *arena;
  grove_err *err;
  const grove_observer *observer;
  /* Set by a container (a graph, Sequential) just before it calls a child
   * whose result stays inside the model: the child may then return a
   * [N, C, H, W] tensor laid out channels last (strides [HWC, 1, WC, C]),
   * as a convolution computes it, so that the next layer reads it without
   * a transpose.  Read by the callee at entry; grove_module_forward gives
   * it back unchanged.  Left false (as by a zeroed grove_fwd),
   * grove_module_forward returns contiguous tensors (grove_module_call
   * always does), and hooks always see contiguous ones. */
  bool channels_last_ok;
  /* Set by a graph just before it calls a convolution whose result nothing
   * but torch.cat along dim 1 reads (core/graph/graph.c: one cat, or a
   * chain of cats that share one buffer): the callee may write its
   * channels-last result straight into its slice of the concatenation
   * instead of a tensor of its own, so that the cat copies nothing.  channels: the concatenation's channel count (0: no slice, the
   * rest unread); offset: this result's first channel in it; data: the
   * concatenation's [n, channels, h, w] channels-last buffer in f's arena,
   * or NULL for the callee to allocate it there (and set data, n, h, w).
   * The result is then the view [N, Cout, OH, OW] of its channels, strides
   * [OH * OW * channels, 1, OW * channels, channels].  A callee that cannot
   * (another layout or size, or a layer that never does) ignores it and
   * returns a tensor of its own.  The caller clears it after the call;
   * hooks never see it (a graph sets it only where nothing observes). */
  struct {
    int64_t channels, offset, n, h, w;
    float *data;
  } into;
  /* The keyword arguments of one attention or transformer call (torch's
   * need_weights and average_attn_weights, and the masks), which a module forward cannot
   * take with its tensors: set by the caller (a graph's call node, a
   * TransformerEncoderLayer's self-attention) just before it calls the
   * module mha.m, read and cleared by that module's forward; any other
   * forward ignores it.  mha.m NULL (as in a zeroed grove_fwd): torch's
   * defaults (true, true). */
  /* mask[i] is the i-th mask argument of that call in the order of torch's
   * forward, NULL for None: MultiheadAttention (key_padding_mask,
   * attn_mask), TransformerEncoderLayer / TransformerEncoder (src_mask or
   * mask, src_key_padding_mask), TransformerDecoderLayer / TransformerDecoder
   * (tgt_mask, memory_mask, tgt_key_padding_mask, memory_key_padding_mask),
   * Transformer (src_mask, tgt_mask, memory_mask, src_key_padding_mask,
   * tgt_key_padding_mask, memory_key_padding_mask).  The tensors belong to
   * the caller and must live until the call returns. */
  struct {
    const struct grove_module *m;
    bool need_weights, average;
    const struct grove_tensor *mask[6];
  } mha;
  /* Squeeze-excitation's `scale * x` applied by the 1x1 convolution that
   * reads its result, instead of a pass of its own (layers_container.c: a
   * Sequential child ending in that multiply, then a Conv2d or a Sequential
   * starting with one).  Set by that Sequential, all zero otherwise:
   * - for, dst, cap: just before it calls the child `for` (a graph): room
   *   for N * C floats.  The graph `for` reads and clears them at entry and
   *   may then leave out its final per-channel multiply, return x, copy the
   *   scale per image into dst ([N][C]) and set done.
   * - in_scale: just before it calls the convolution (directly or as the
   *   first child of a Sequential) when done was set; read and cleared by
   *   that convolution, which multiplies each image's input channels by it.
   * The buffers belong to the Sequential's forward (its arena). */
  struct {
    const struct grove_module *for_module;
    float *dst;
    int64_t cap;
    bool done;
    const float *in_scale;
  } se;
  /* A residual block's `act(conv(x) + t)` (graph.c, a convolution fused
   * with the add after it): set just before the graph calls the
   * convolution, which reads and clears t and act; it applies both in its
   * output stage and sets done only when t is f32 of its output's shape and
   * memory layout and its path has that stage; otherwise it returns the
   * plain convolution (no activation) and the add runs on its own. */
  struct {
    const struct grove_tensor *t;
    int act; /* a grove__act */
    bool done;
  } res;
} grove_fwd;

/* The index of m in o->modules, or -1 when o is NULL or does not watch m.
 * Binary search; any thread. */
long grove_observer_find(const grove_observer *o, const grove_module *m);

/* Sets *out to a contiguous plain tensor of the given shape in f's arena
 * (uninitialised).  GROVE_E_NOMEM when the arena cannot grow. */
grove_status grove_fwd_alloc(grove_fwd *f, grove_tensor *out, grove_dtype dt, int ndim,
                             const int64_t *shape);

/* ------------------------------------------------------------ the vtable */

typedef struct grove_module_type {
  /* torch.nn class name: "Linear", "Sequential". */
  const char *name;
  /* Eval-mode forward: reads in, writes out (out->n and each tensor, usually
   * allocated with grove_fwd_alloc).  Must not allocate from the heap nor
   * modify the module.  NULL: the module is not callable (ModuleList,
   * ModuleDict), and calling it is GROVE_E_NOT_CALLABLE. */
  grove_status (*forward)(const grove_module *m, grove_fwd *f, const grove_values *in,
                          grove_values *out);
  /* Optional.  Recomputes derived data held in impl from the parameters and
   * buffers (BatchNorm's folded scale and shift).  Called after construction
   * and after every successful load_state_dict, on the loading thread.  NULL:
   * nothing is derived.  (grove_model_open builds its tree with the
   * constructors' refresh of the large layers deferred to the load, which
   * replaces their zero weights anyway: see refresh_pending.) */
  grove_status (*refresh)(grove_module *m, grove_err *err);
  /* Optional.  torch's _load_from_state_dict override for layout migrations:
   * called before the module's own keys are checked, with the module's key
   * prefix ("0.bn." or "") and the checkpoint's version for it (-1 when the
   * checkpoint has no metadata).  May add keys to sd.  NULL: nothing to do. */
  grove_status (*load_fixup)(grove_module *m, grove_state_dict *sd, const char *prefix,
                             int version, grove_err *err);
  /* Optional.  Frees impl.  NULL: free(impl). */
  void (*free_impl)(void *impl);
  /* torch's class attribute _version, written into state_dict metadata.
   * 0 means 1 (the default of torch.nn.Module). */
  int version;
} grove_module_type;

/* ------------------------------------------------------------ the module */

typedef struct grove_slot {
  char *name;
  grove_tensor *tensor; /* owned reference, or NULL (torch's None) */
  bool persistent;      /* buffers only: false = not in state_dict */
} grove_slot;

typedef struct grove_child {
  char *name;
  grove_module *module; /* owned reference, or NULL */
} grove_child;

struct grove_hooks; /* internal */

struct grove_module {
  const grove_module_type *type;
  void *impl; /* type-specific settings and derived data; owned */
  bool training;
  /* The constructor left refresh to the load that follows (grove_model_open
   * builds so; core/nn/module_internal.h, "deferred refresh"): impl holds no derived
   * data yet and forward must not run.  Cleared by load_state_dict. */
  bool refresh_pending;
  /* Its forward was traced into its caller's graph at export (model.json
   * "inlined": true, docs/exporter.md): no node calls it, so a forward hook
   * on it could never fire and registering one is GROVE_E_UNSUPPORTED.
   * Set by the graph builder, read-only after. */
  bool inlined;
  int refcount; /* atomic */
  grove_slot *params;
  size_t nparams, params_cap;
  grove_slot *buffers;
  size_t nbuffers, buffers_cap;
  grove_child *children;
  size_t nchildren, children_cap;
  struct grove_hooks *hooks; /* NULL when this module has no hooks */
  /* Private to core/nn/module.c: a hash of the children's names once there are
   * many (NULL before), so that adding N children costs O(N), not O(N^2). */
  void *child_index;
};

/* A new module of type with no members, training = true (as torch).  Takes
 * ownership of impl (freed with the module, or at once on failure).  The
 * caller owns the one reference.  NULL and err set when out of memory. */
grove_module *grove_module_new(const grove_module_type *type, void *impl, grove_err *err);
void grove_module_retain(grove_module *m);
/* Drops a reference; on the last, releases members and children and frees
 * impl.  NULL is a no-op. */
void grove_module_release(grove_module *m);

/* torch's register_parameter / register_buffer / add_module.  t or child may
 * be NULL (None); otherwise it is retained.  Registering an existing name of
 * the same kind replaces it in place (keeping its position).  Errors, with
 * PyTorch's messages, as GROVE_E_KEY: an empty name, a name with '.', a name
 * already used by another kind of member. */
grove_status grove_module_register_parameter(grove_module *m, const char *name, grove_tensor *t,
                                             grove_err *err);
grove_status grove_module_register_buffer(grove_module *m, const char *name, grove_tensor *t,
                                          bool persistent, grove_err *err);
grove_status grove_module_add_module(grove_module *m, const char *name, grove_module *child,
                                     grove_err *err);

/* Borrowed lookups; NULL when absent or None. */
grove_tensor *grove_module_param(const grove_module *m, const char *name);
grove_tensor *grove_module_buffer(const grove_module *m, const char *name);
grove_module *grove_module_child(const grove_module *m, const char *name);
/* Follows a dotted path of child names ("encoder.layers.0"); "" is m. */
grove_module *grove_module_find(const grove_module *m, const char *path);

/* ------------------------------------------------------------ traversal */

typedef struct grove_named_tensor {
  char *name;           /* owned by the list */
  grove_tensor *tensor; /* borrowed from the tree */
} grove_named_tensor;

typedef struct grove_named_tensors {
  size_t n, cap;
  grove_named_tensor *items;
} grove_named_tensors;

typedef struct grove_named_module {
  char *name;           /* owned by the list */
  grove_module *module; /* borrowed from the tree */
} grove_named_module;

typedef struct grove_named_modules {
  size_t n, cap;
  grove_named_module *items;
} grove_named_modules;

/* Frees the names and the array; the list is empty afterwards. */
void grove_named_tensors_fini(grove_named_tensors *l);
void grove_named_modules_fini(grove_named_modules *l);

/* torch's named_parameters(prefix, recurse, remove_duplicate) and
 * named_buffers: None skipped, a tensor reachable twice yielded once when
 * remove_duplicate.  *out must be zeroed; the caller finis it. */
grove_status grove_module_named_parameters(const grove_module *m, const char *prefix, bool recurse,
                                           bool remove_duplicate, grove_named_tensors *out,
                                           grove_err *err);
grove_status grove_module_named_buffers(const grove_module *m, const char *prefix, bool recurse,
                                        bool remove_duplicate, grove_named_tensors *out,
                                        grove_err *err);
/* torch's named_modules (pre-order, self first with name prefix) and
 * named_children (direct children, each module once). */
grove_status grove_module_named_modules(const grove_module *m, const char *prefix,
                                        bool remove_duplicate, grove_named_modules *out,
                                        grove_err *err);
grove_status grove_module_named_children(const grove_module *m, grove_named_modules *out,
                                         grove_err *err);

/* Module-path patterns, to pick modules out of named_modules: a pattern
 * without wildcard is an exact dotted path ("encoder.layers.0"; "" is the
 * root); otherwise it is a glob in which "*" matches a run of characters
 * without '.', "**" any run (a leading "**." or an inner ".**." also
 * matches no component at all), "?" one character but '.', "[abc]" /
 * "[!a-z]" one of a set (never '.') and "\c" the character c.  A glob never
 * matches the root.  check: GROVE_E_INVALID_ARGUMENT naming the problem (an
 * unclosed '[', a trailing '\', longer than 512 characters).  match: false
 * for a pattern that check refuses.  Linear in pattern x path length, no
 * recursion, no heap; any thread. */
grove_status grove_module_pattern_check(const char *pattern, grove_err *err);
bool grove_module_pattern_match(const char *pattern, const char *path);

/* torch's apply(fn): fn on every child's subtree (children() order, each
 * direct child once), then on m itself: post-order. */
void grove_module_apply(grove_module *m, void (*fn)(grove_module *m, void *user), void *user);
/* torch's train(mode) / eval(): sets training recursively. */
void grove_module_train(grove_module *m, bool mode);
void grove_module_eval(grove_module *m);

/* Parameter count (elements) and bytes over named_parameters with
 * de-duplication. */
int64_t grove_module_param_count(const grove_module *m);

/* ------------------------------------------------------------ state_dict */

/* torch's state_dict(prefix=prefix): for each module, its parameters, then
 * its persistent buffers, then its children in order; None skipped; no
 * de-duplication (a tied tensor appears under each of its keys).  Records each
 * module's version under its prefix.  The tensors put into dest are the tree's
 * own (retained, not copied): treat them as read-only.  state_dict pre-hooks
 * and post-hooks run as in torch.  prefix may be NULL for "". */
grove_status grove_module_state_dict(const grove_module *m, const char *prefix,
                                     grove_state_dict *dest, grove_err *err);

typedef struct grove_load_opts {
  bool strict; /* missing or unexpected keys are errors */
  /* Share the checkpoint's tensors instead of copying into the existing
   * ones when the dtype already matches (zero-copy from mmap).  Like torch's
   * assign=True.  Tied parameters stay tied only if the checkpoint ties them. */
  bool assign;
} grove_load_opts;

typedef struct grove_load_report {
  size_t n_missing;
  char **missing;
  size_t n_unexpected;
  char **unexpected;
  size_t n_errors; /* torch's error_msgs: size mismatches, bad dtypes */
  char **errors;
  char *message; /* the whole report as torch words it; NULL when loaded */
} grove_load_report;

void grove_load_report_fini(grove_load_report *r);

/* torch's load_state_dict.  All or nothing: every key is checked first
 * (missing and unexpected keys are errors when strict; a shape mismatch always
 * is; a dtype that cannot convert is), and only then are values copied
 * (converted to the existing tensor's dtype: f16, bf16, f64 -> f32).  On
 * failure the module is unchanged, the result is GROVE_E_STATE_DICT, and
 * err->msg holds torch's message ("Error(s) in loading state_dict for
 * Sequential:\n\tMissing key(s) in state_dict: ...").  report (may be NULL;
 * zeroed by the caller, fini'd by the caller) gets the lists either way.
 * sd is not modified (hooks see a private shallow copy).  opts NULL means
 * strict, copying. */
grove_status grove_module_load_state_dict(grove_module *m, const grove_state_dict *sd,
                                          const grove_load_opts *opts, grove_load_report *report,
                                          grove_err *err);

/* ------------------------------------------------------------ forward */

/* Runs m on in, writing out.  Runs hooks in torch's order (global pre-hooks,
 * m's pre-hooks, forward, global hooks, m's hooks), and f->observer's
 * callbacks for m after the pre-hooks and after the hooks; when no hook is
 * registered anywhere and f has no observer it calls the type's forward
 * directly.  Any thread, concurrently on one tree, each call with its own f. */
grove_status grove_module_forward(const grove_module *m, grove_fwd *f, const grove_values *in,
                                  grove_values *out);
/* One tensor in, the first output out. */
grove_status grove_module_call(const grove_module *m, grove_fwd *f, const grove_tensor *x,
                               grove_tensor *y);

/* ------------------------------------------------------------ hooks */

/* Forward pre-hook: may replace the inputs (in place in *in, e.g. with arena
 * tensors from f).  A non-OK status stops the forward. */
typedef grove_status (*grove_forward_pre_hook_fn)(void *user, const grove_module *m, grove_fwd *f,
                                                  grove_values *in);
/* Forward hook: sees the inputs and may replace the outputs. */
typedef grove_status (*grove_forward_hook_fn)(void *user, const grove_module *m, grove_fwd *f,
                                              const grove_values *in, grove_values *out);
/* state_dict pre-hook (torch's _register_state_dict_pre_hook): before m's own
 * entries are added.  post-hook: after m's subtree was added; may edit dest. */
typedef void (*grove_state_dict_pre_hook_fn)(void *user, const grove_module *m, const char *prefix);
typedef grove_status (*grove_state_dict_hook_fn)(void *user, const grove_module *m,
                                                 grove_state_dict *dest, const char *prefix,
                                                 grove_err *err);
/* load_state_dict pre-hook: before m's keys are checked, with the private
 * copy of the checkpoint, which it may edit (rename keys).  post-hook: after
 * m's subtree was checked; may edit the report's missing/unexpected lists
 * (remove entries with grove_load_report_remove). */
typedef grove_status (*grove_load_pre_hook_fn)(void *user, grove_module *m, grove_state_dict *sd,
                                               const char *prefix, bool strict, grove_err *err);
typedef void (*grove_load_post_hook_fn)(void *user, grove_module *m, grove_load_report *report);

/* Removes name from report->missing (which = 0) or ->unexpected (which = 1);
 * returns whether it was there. */
bool grove_load_report_remove(grove_load_report *report, int which, const char *name);

/* Registration returns a handle id (unique in the process, never 0) that
 * removes the hook.  prepend puts it before m's existing hooks of that kind.
 * Call only while no forward runs on m's tree.  A forward (pre-)hook on a
 * module whose forward was inlined at export (m->inlined) is refused with
 * GROVE_E_UNSUPPORTED: it would never fire. */
grove_status grove_module_register_forward_pre_hook(grove_module *m, grove_forward_pre_hook_fn fn,
                                                    void *user, bool prepend, uint64_t *id);
grove_status grove_module_register_forward_hook(grove_module *m, grove_forward_hook_fn fn,
                                                void *user, bool prepend, uint64_t *id);
grove_status grove_module_register_state_dict_pre_hook(grove_module *m,
                                                       grove_state_dict_pre_hook_fn fn, void *user,
                                                       uint64_t *id);
grove_status grove_module_register_state_dict_hook(grove_module *m, grove_state_dict_hook_fn fn,
                                                   void *user, uint64_t *id);
grove_status grove_module_register_load_state_dict_pre_hook(grove_module *m,
                                                            grove_load_pre_hook_fn fn, void *user,
                                                            uint64_t *id);
grove_status grove_module_register_load_state_dict_post_hook(grove_module *m,
                                                             grove_load_post_hook_fn fn,
                                                             void *user, uint64_t *id);
/* Removes the hook with that id from m; false when m has none such. */
bool grove_module_remove_hook(grove_module *m, uint64_t id);

/* Global hooks (torch's register_module_forward_pre_hook / _hook): run for
 * every module, before the module's own.  Process-wide; call while no forward
 * runs anywhere. */
grove_status grove_register_global_forward_pre_hook(grove_forward_pre_hook_fn fn, void *user,
                                                    uint64_t *id);
grove_status grove_register_global_forward_hook(grove_forward_hook_fn fn, void *user,
                                                uint64_t *id);
bool grove_remove_global_hook(uint64_t id);

#ifdef __cplusplus
}
#endif
#endif
