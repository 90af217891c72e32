/* export_plan.h: core/io/export_plan.c's hooks for the writers
 * (core/io/safetensors.c, core/io/torch_save.c) and the tests.  Never installed. */
#ifndef GROVE_EXPORT_PLAN_H
#define GROVE_EXPORT_PLAN_H

#include <stdbool.h>

#include "grove/checkpoint.h"
#include "torch_internal.h"

/* grove_torch_plan with the zip writer's test options (ZIP64 fields forced,
 * deflated records); opts may be NULL.  grove__torch_write uses it. */
grove_status grove__torch_plan_ex(const grove_state_dict *sd, const char *archive,
                                  const grove__zipw_opts *opts, grove_file_plan **out,
                                  grove_err *err);

/* The end of a writer: when planning succeeded (planned is GROVE_OK),
 * writes p's bytes to path atomically (grove__atomic_open: a failure leaves
 * no half file); otherwise puts path in front of the planner's message.
 * Frees p either way (NULL is fine) and returns the final status.  Any
 * thread. */
grove_status grove__file_plan_write(grove_status planned, grove_file_plan *p, const char *path,
                                    grove_err *err);

#endif
