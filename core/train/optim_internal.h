/* optim_internal.h: the optimizer's state, shared by optim.c (steps) and
 * optim_io.c (torch.save / torch.load of its state_dict).  Never installed. */
#ifndef GROVE_CORE_OPTIM_INTERNAL_H
#define GROVE_CORE_OPTIM_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>

#include "grove/train.h"
#include "fileio.h"
#include "kernels.h"

/* One parameter's state.  has: torch's state[p] exists (the parameter had a
 * gradient at some step). */
typedef struct grove__pstate {
  bool has;
  float step;          /* Adam/AdamW: torch keeps it as a 0-d float32 tensor */
  grove_tensor *buf;   /* SGD momentum_buffer (NULL = None), Adam exp_avg */
  grove_tensor *sq;    /* Adam exp_avg_sq */
  grove_tensor *maxsq; /* Adam max_exp_avg_sq (amsgrad) */
} grove__pstate;

typedef struct grove__group {
  grove_optim_hparams h;
  size_t *idx; /* parameter indices, in the group's order */
  size_t n;
} grove__group;

struct grove_optim {
  grove_optim_kind kind;
  size_t nparams;
  grove_tensor **params; /* retained */
  grove__pstate *state;  /* nparams */
  size_t *group_of;      /* nparams: group index, SIZE_MAX for none */
  grove__group *groups;
  size_t ngroups;
  size_t *order; /* parameters in the order they got state (torch's dict order) */
  size_t norder;
};

grove_status grove__optim_check(grove_optim_kind kind, const grove_optim_hparams *h,
                                grove_err *err);
void grove__pstate_clear(grove__pstate *s);

#endif
