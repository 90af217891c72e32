/* backward_attention.c: training forwards of MultiheadAttention and the
 * transformer encoder layers. */
#include "backward.h"

static grove_status later(grove__tape *t, const grove_module *m) {
  return grove_err_set(t->err, GROVE_E_UNSUPPORTED, "%s cannot be trained yet", m->type->name);
}
grove_status grove__tf_mha(grove__tape *t, const grove_module *m, const grove__tinfo *info,
                           const int *in, int nin, int *out, int *nout) {
  return later(t, m);
}
grove_status grove__tf_tel(grove__tape *t, const grove_module *m, const grove__tinfo *info,
                           const int *in, int nin, int *out, int *nout) {
  return later(t, m);
}
grove_status grove__tf_te(grove__tape *t, const grove_module *m, const grove__tinfo *info,
                          const int *in, int nin, int *out, int *nout) {
  return later(t, m);
}
