/* graph.h: modules with a custom forward, run from their torch.fx graph
 * (graph.c; the tensor operations its nodes call are in core/nn/graph_ops.h,
 * which the attention layers use too).  Internal to libgrove (tests may include it).
 *
 * A graph module is built from its model.json object in two steps, because
 * its graph names its children: grove__graph_from_json makes the module with
 * its own parameters and buffers, spec.c adds the children, and
 * grove__graph_compile then reads "graph" and resolves every target against
 * the finished subtree.  A module whose "graph" is null is a holder: it has
 * state and children but no forward of its own (its forward was traced into
 * its parent's graph), and calling it is GROVE_E_NOT_CALLABLE. */
#ifndef GROVE_CORE_GRAPH_H
#define GROVE_CORE_GRAPH_H

#include <stdbool.h>
#include <stddef.h>

#include "grove/grove.h"
#include "graph_ops.h"
#include "module_internal.h"

struct json_t;

/* Builds a graph (or holder) module from obj: "type" is the Python class
 * name (any identifier; it is the module's type name in messages and in
 * load_state_dict's "Error(s) in loading state_dict for T"), "parameters" and
 * "buffers" declare its own tensors.  Keys other than type, graph, children,
 * parameters, buffers and tied are GROVE_E_SPEC at path.  *out is new. */
grove_status grove__graph_from_json(const struct json_t *obj, const char *path, grove_module **out,
                                    grove_err *err);

/* Compiles obj's "graph" into m (made by grove__graph_from_json, children
 * already added).  path is obj's JSON path and where names the module in
 * runtime messages ("'blocks.0' (Block)").  GROVE_E_SPEC naming the JSON path
 * of the node, argument or target that is wrong; GROVE_E_UNSUPPORTED for an
 * operation or argument Grove knows but does not run (a mask). */
grove_status grove__graph_compile(grove_module *m, const struct json_t *obj, const char *path,
                                  const char *where, grove_err *err);

/* Whether m is a graph or holder module. */
bool grove__is_graph(const grove_module *m);

#endif
