/* client_impl.h: what client.c shares with the other files of
 * libgrove-client (client_train.c).  Never installed.  Hidden from the shared
 * library's symbol table. */
#ifndef GROVE_CLIENT_IMPL_H
#define GROVE_CLIENT_IMPL_H

#include "grove.pb-c.h"
#include "grove/client.h"

/* Messages of failures found on the client side begin with this
 * (grove_client_failed_locally). */
#define LOCAL_PREFIX "grove client: "
#define MAX_INPUTS 64

#pragma GCC visibility push(hidden)

/* A batch of tensors as wire tensors: t[i] views inputs[i] (its data, or a
 * contiguous copy kept in copies[i]) and the target comes last; ptrs[i] is
 * &t[i], for the request's repeated field.  Large: on the stack of one
 * call. */
typedef struct wire_batch {
  Grove__Tensor t[MAX_INPUTS + 1];
  Grove__Tensor *ptrs[MAX_INPUTS + 1];
  int64_t shapes[MAX_INPUTS + 1][GROVE_MAX_DIMS];
  grove_tensor *copies[MAX_INPUTS + 1];
} wire_batch;

grove_status grove__client_nomem(grove_err *err);
int grove__client_timeout_of(const grove_client *c, int timeout_ms);
grove_status grove__client_call(grove_client *c, Grove__Request *req, int timeout_ms,
                                Grove__Reply **out, grove_err *err);
grove_status grove__client_call_for(grove_client *c, Grove__Request *req, int timeout_ms,
                                    Grove__Reply__BodyCase body, const char *missing,
                                    Grove__Reply **out, grove_err *err);
grove_status grove__client_wire_of(const grove_tensor *t, const char *what, Grove__Tensor *w,
                                   int64_t *shape, grove_tensor **copy, grove_err *err);
grove_status grove__client_wire_batch_init(wire_batch *b, const grove_tensor *inputs, size_t n,
                                           const grove_tensor *target, size_t max, grove_err *err);
void grove__client_wire_batch_fini(wire_batch *b);
grove_status grove__client_outputs_from_wire(Grove__Tensor **w, size_t n, grove_prediction *out,
                                             grove_err *err);
void grove__client_strv_free(char **v, size_t n);
char **grove__client_strv_dup(char **w, size_t n, bool *oom);
/* An admin call (what names it for a message) goes to the admin plane:
 * *c becomes the client's connection to groved's admin listener (opened at
 * the first admin call: grove_client_opts.admin_url), or the call is refused
 * (a client of several replicas and no admin URL; the admin listener cannot
 * be reached) with err set. */
grove_status grove__client_admin_plane(grove_client **c, const char *what, grove_err *err);
grove_status grove__client_reload_call(grove_client *c, Grove__Request *req, int timeout_ms,
                                       const char *what, grove_reload_result *out, grove_err *err);

#pragma GCC visibility pop
#endif
