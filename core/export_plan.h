/* export_plan.h: core/export_plan.c's test hook.  Never installed. */
#ifndef GROVE_EXPORT_PLAN_H
#define GROVE_EXPORT_PLAN_H

#include <stdbool.h>

#include "grove/checkpoint.h"

/* grove_torch_plan with ZIP64 fields forced, as grove__zipw_opts.force_zip64
 * makes the writer do (tests compare the two). */
grove_status grove__torch_plan_ex(const grove_state_dict *sd, const char *archive, bool force_zip64,
                                  grove_file_plan **out, grove_err *err);

#endif
