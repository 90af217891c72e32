/* internal.h: every non-public header of libgrove's lower layers at once,
 * for the code outside core/'s layer folders that may see all of them:
 * tests/, bench/, fuzz/ and server/admin.c (grove__secret_equal).  It sits
 * at the top of core/, on no layer's include path, so no file of core/
 * can include it (each includes its own layer's header: base.h,
 * tensor_internal.h, kernels.h, fileio.h, module_internal.h,
 * model_internal.h, ...).  Never installed. */
#ifndef GROVE_CORE_INTERNAL_H
#define GROVE_CORE_INTERNAL_H

#include "base.h"
#include "fileio.h"
#include "kernels.h"
#include "model_internal.h"
#include "module_internal.h"
#include "tensor_internal.h"

#endif
