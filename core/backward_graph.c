/* backward_graph.c: training forwards of graph modules. */
#include "backward.h"

grove_status grove__tgraph_compile(grove__tinfo *info, const grove_module *m,
                                   const struct json_t *obj, grove_err *err) {
  return grove_err_set(err, GROVE_E_UNSUPPORTED,
                       "training: '%s' (%s): graph modules cannot be trained yet",
                       info->path ? info->path : "", m->type->name);
}
void grove__tgraph_free(void *graph) {
  (void)graph;
}
grove_status grove__tf_graph(grove__tape *t, const grove_module *m, const grove__tinfo *info,
                             const int *in, int nin, int *out, int *nout) {
  return grove_err_set(t->err, GROVE_E_UNSUPPORTED, "graph modules cannot be trained yet");
}
