/* train.h: training replicas, losses and optimizers, with torch's semantics.
 *
 * A training replica is a Module tree of its own, built from a model's
 * model.json text and a copy of a state_dict (so the serving tree it came
 * from is never written), kept in train mode: BatchNorm normalises with the
 * batch's statistics and updates its running statistics, Dropout drops with a
 * generator the replica owns.  Its forward records a tape (each module call's
 * inputs, outputs and saved tensors, in the replica's own arena); backward
 * walks the tape in reverse and accumulates gradients into one .grad tensor
 * per parameter, as torch's autograd does.  Losses give a value and the
 * gradient of their input; optimizers (SGD, Adam, AdamW with param_groups)
 * update the replica's parameters in place from its gradients.
 * docs/training.md describes the design and what torch behaviour is matched.
 *
 * Threading: a replica, a loss and an optimizer are used by one thread at a
 * time (any thread), like a torch training loop.  Nothing here touches any
 * other tree; the library keeps no global state for training.
 */
#ifndef GROVE_TRAIN_H
#define GROVE_TRAIN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "grove/arena.h"
#include "grove/model.h"
#include "grove/module.h"
#include "grove/state_dict.h"
#include "grove/status.h"
#include "grove/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ================================================================ replica */

typedef struct grove_replica grove_replica;

typedef struct grove_replica_opts {
  /* Seed of the replica's Dropout generator.  The same seed, model and
   * batches give the same masks, bit for bit (not torch's masks: torch's
   * generator is its own). */
  uint64_t seed;
  /* Also compute the gradient of each float input (grove_replica_input_grad),
   * as torch does for an input with requires_grad=True.  Off by default:
   * training needs only the parameters' gradients. */
  bool inputs_require_grad;
  /* load_state_dict(strict=False) when building the replica. */
  bool non_strict;
} grove_replica_opts;

/* Builds a replica: parses model_json (a model.json text; origin names it in
 * messages) into a new tree, copies weights into it with load_state_dict
 * (strict unless opts say otherwise; weights may be NULL to keep the spec's
 * initial values) and puts it in train mode.  Nothing of weights is kept or
 * written: the replica's tensors are its own.  Every module must be one Grove
 * can train (docs/training.md lists them); another is GROVE_E_UNSUPPORTED
 * naming its path.  opts may be NULL (seed 0, strict).  *out is new and the
 * caller's.  Any thread. */
grove_status grove_replica_new(const char *model_json, const char *origin,
                               const grove_state_dict *weights, const grove_replica_opts *opts,
                               grove_replica **out, grove_err *err);
/* NULL is a no-op.  Frees the tree, the gradients and the tape. */
void grove_replica_free(grove_replica *r);

/* The replica's tree (train mode) and model (its io spec).  Borrowed; valid
 * until grove_replica_free.  Do not toggle training or load into the tree
 * while a step is in progress. */
grove_module *grove_replica_root(const grove_replica *r);
const grove_model *grove_replica_model(const grove_replica *r);

/* The parameters, in torch's model.parameters() order (named_parameters with
 * de-duplication: a tied tensor once).  Optimizers and param_groups refer to
 * them by this index.  Borrowed. */
size_t grove_replica_num_params(const grove_replica *r);
const char *grove_replica_param_name(const grove_replica *r, size_t i);
grove_tensor *grove_replica_param(const grove_replica *r, size_t i);
/* Parameter i's .grad: NULL until a backward reaches it and after
 * zero_grad(set_to_none).  Borrowed; the replica owns it. */
grove_tensor *grove_replica_grad(const grove_replica *r, size_t i);
/* All n gradients (NULL where None) in index order, for an optimizer step:
 * a borrowed array valid until the next backward or zero_grad. */
grove_tensor *const *grove_replica_grads(const grove_replica *r);

/* torch's zero_grad: set_to_none (torch's default) drops every .grad (the
 * next backward allocates them again, and an optimizer skips a parameter
 * without one); otherwise they are filled with zeros. */
void grove_replica_zero_grad(grove_replica *r, bool set_to_none);

/* The training forward: checks inputs against the model's input spec, runs
 * every module in train mode and records the tape.  BatchNorm's running
 * statistics are updated here, as in torch.  out's tensors live in the
 * replica's arena until the next forward.  Forgets the previous tape. */
grove_status grove_replica_forward(grove_replica *r, const grove_tensor *inputs, size_t n,
                                   grove_values *out, grove_err *err);

/* Backpropagates from the outputs of the last forward: grad_outputs[i] is
 * dLoss/dOutput_i (shape of output i; n = the number of outputs, and an
 * output with no gradient may be given with data NULL).  Gradients are
 * accumulated into the parameters' .grad (allocated on first use).  Once per
 * forward (GROVE_E_FAILED_PRECONDITION otherwise, like torch without
 * retain_graph). */
grove_status grove_replica_backward(grove_replica *r, const grove_tensor *grad_outputs, size_t n,
                                    grove_err *err);

/* After a backward with inputs_require_grad: the gradient of float input i
 * (a plain tensor in the replica's arena, valid until the next forward).
 * false when it has none (an integer input, or nothing reached it). */
bool grove_replica_input_grad(const grove_replica *r, size_t i, grove_tensor *out);

/* The L2 norm of all gradients together (torch's clip_grad_norm_ total
 * norm), in double; 0 when there are none. */
double grove_replica_grad_norm(const grove_replica *r);

/* An eval-mode forward on the replica (torch's model.eval(); with no_grad),
 * for validation: BatchNorm uses its running statistics, Dropout does
 * nothing.  The replica is back in train mode afterwards.  Outputs live in
 * arena (the caller's) until it is reset. */
grove_status grove_replica_evaluate(grove_replica *r, grove_arena *arena,
                                    const grove_tensor *inputs, size_t n, grove_values *out,
                                    grove_err *err);

/* A snapshot of the replica's state_dict for serving (Promote) or saving:
 * every tensor copied (a tensor held under two keys is copied once and stays
 * shared), with module versions.  dest must be empty; it owns the copies. */
grove_status grove_replica_state_dict(const grove_replica *r, grove_state_dict *dest,
                                      grove_err *err);

/* ================================================================ losses */

typedef enum grove_loss_kind {
  GROVE_LOSS_MSE = 0,             /* torch.nn.MSELoss */
  GROVE_LOSS_CROSS_ENTROPY = 1,   /* torch.nn.CrossEntropyLoss, class indices */
  GROVE_LOSS_BCE_WITH_LOGITS = 2, /* torch.nn.BCEWithLogitsLoss */
} grove_loss_kind;

typedef enum grove_reduction {
  GROVE_REDUCTION_MEAN = 0,
  GROVE_REDUCTION_SUM = 1,
} grove_reduction;

typedef struct grove_loss {
  grove_loss_kind kind;
  grove_reduction reduction;
  int64_t ignore_index;   /* cross entropy; torch's default -100 */
  double label_smoothing; /* cross entropy, in [0, 1]; default 0 */
  /* BCEWithLogits' pos_weight (NULL is None): broadcast against the input's
   * last dimension(s), as torch.  Borrowed; must outlive the calls. */
  const grove_tensor *pos_weight;
} grove_loss;

/* A loss with torch's defaults for kind (mean, ignore_index -100, no label
 * smoothing, no pos_weight). */
grove_loss grove_loss_default(grove_loss_kind kind);
/* "MSELoss", "CrossEntropyLoss", "BCEWithLogitsLoss" (torch's class names)
 * to a kind; false for anything else. */
bool grove_loss_kind_from_name(const char *name, grove_loss_kind *out);

/* The loss of input against target and its gradient dLoss/dInput (the
 * backward from a loss of 1, as loss.backward()).  Shapes as torch:
 *   MSE: target of input's shape (float32).
 *   CrossEntropy: input [N, C], [N, C, d1, ...] or [C] (logits); target int64
 *     class indices [N], [N, d1, ...] or [] in [0, C) or ignore_index.
 *   BCEWithLogits: target of input's shape (float32, in [0, 1]).
 * *value gets the loss; grad (may be NULL), when given, must be a contiguous
 * float32 tensor of input's shape and receives the gradient.  A cross
 * entropy whose targets are all ignore_index is NaN with reduction mean, as
 * in torch.  GROVE_E_SHAPE / GROVE_E_DTYPE / GROVE_E_RANGE (a class index out
 * of range, naming it) for bad inputs.  Any thread. */
grove_status grove_loss_compute(const grove_loss *loss, const grove_tensor *input,
                                const grove_tensor *target, double *value, grove_tensor *grad,
                                grove_err *err);

/* ================================================================ optimizers */

typedef enum grove_optim_kind {
  GROVE_OPTIM_SGD = 0,
  GROVE_OPTIM_ADAM = 1,
  GROVE_OPTIM_ADAMW = 2,
} grove_optim_kind;

/* One param_group's hyperparameters, torch's names.  Fields an optimizer
 * does not have are ignored (SGD has no betas). */
typedef struct grove_optim_hparams {
  double lr;
  double momentum, dampening; /* SGD */
  bool nesterov;              /* SGD */
  double beta1, beta2, eps;   /* Adam, AdamW */
  bool amsgrad;               /* Adam, AdamW */
  double weight_decay;
  bool maximize;
} grove_optim_hparams;

/* torch's defaults for kind: SGD lr 1e-3 (torch has none: name one),
 * momentum 0, dampening 0, weight_decay 0; Adam lr 1e-3, betas (0.9, 0.999),
 * eps 1e-8, weight_decay 0; AdamW the same with weight_decay 1e-2. */
grove_optim_hparams grove_optim_defaults(grove_optim_kind kind);
/* "SGD", "Adam", "AdamW" to a kind; false for anything else. */
bool grove_optim_kind_from_name(const char *name, grove_optim_kind *out);

/* A param_group: hyperparameters and the indices of its parameters (into
 * the params array given to grove_optim_new).  Copied by grove_optim_new. */
typedef struct grove_param_group {
  grove_optim_hparams h;
  const size_t *params;
  size_t nparams;
} grove_param_group;

typedef struct grove_optim grove_optim;

/* torch.optim.SGD / Adam / AdamW over params[0, nparams) (contiguous float32
 * heap tensors, typically a replica's; each is retained).  groups: ngroups
 * param_groups; every parameter may be in at most one group (torch's
 * "some parameters appear in more than one parameter group"); a parameter in
 * no group is never updated.  ngroups 0 means one group with every
 * parameter and the hyperparameters *h (h NULL: the defaults).  torch's
 * checks on values (lr >= 0, betas in [0, 1), nesterov needs momentum > 0
 * and dampening 0, ...) are GROVE_E_INVALID_ARGUMENT.  *out is new and the
 * caller's. */
grove_status grove_optim_new(grove_optim_kind kind, grove_tensor *const *params, size_t nparams,
                             const grove_param_group *groups, size_t ngroups,
                             const grove_optim_hparams *h, grove_optim **out, grove_err *err);
/* NULL is a no-op; releases the parameters and the state. */
void grove_optim_free(grove_optim *o);

grove_optim_kind grove_optim_get_kind(const grove_optim *o);
size_t grove_optim_num_groups(const grove_optim *o);
/* The group's hyperparameters, writable (torch's param_groups[i]["lr"] = x:
 * a scheduler changes lr between steps).  NULL when i is out of range. */
grove_optim_hparams *grove_optim_group(grove_optim *o, size_t i);

/* One optimizer step: every parameter of every group with a gradient
 * (grads[i] not NULL: a float32 tensor of params[i]'s shape; nparams of them,
 * as grove_replica_grads gives) is updated in place, exactly as torch's
 * single-tensor (foreach=False) implementation orders its float32 operations.
 * A parameter without a gradient is skipped and its state untouched. */
grove_status grove_optim_step(grove_optim *o, grove_tensor *const *grads, grove_err *err);

/* Saves the optimizer's state_dict as torch.save(optimizer.state_dict())
 * would: a zip archive torch.load reads into
 * {"state": {index: {...}}, "param_groups": [{..., "params": [indices]}]},
 * with torch 1.13's keys for each kind ("step" a 0-d float32 tensor,
 * "exp_avg", "exp_avg_sq", "max_exp_avg_sq" with amsgrad; SGD's
 * "momentum_buffer", None while momentum is 0).  Only opcodes of
 * torch.load(weights_only=True) are used, though torch 1.13's weights-only
 * unpickler lacks BINFLOAT and so refuses any optimizer state_dict, torch's
 * own included.  Written atomically. */
grove_status grove_optim_save(const grove_optim *o, const char *path, grove_err *err);
/* torch's optimizer.load_state_dict from a file torch.save wrote (or
 * grove_optim_save): the group count and each group's size must match
 * (GROVE_E_STATE_DICT, with torch's messages); hyperparameters come from the
 * file; state tensors must match their parameter's shape and are converted
 * to float32.  All or nothing: on error the optimizer is unchanged. */
grove_status grove_optim_load(grove_optim *o, const char *path, grove_err *err);

/* ================================================================ one step */

/* torch's usual loop body on a replica: zero_grad(set_to_none=True),
 * forward, loss against targets (one target tensor for output 0), backward,
 * the gradients' total L2 norm (before the step), optimizer step.  *loss_value
 * and *grad_norm (either may be NULL) receive the loss and the norm. */
grove_status grove_replica_train_step(grove_replica *r, grove_optim *o, const grove_loss *loss,
                                      const grove_tensor *inputs, size_t n,
                                      const grove_tensor *target, double *loss_value,
                                      double *grad_norm, grove_err *err);

#ifdef __cplusplus
}
#endif
#endif
