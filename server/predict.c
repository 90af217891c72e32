/* predict.c: the Predict RPC's first half, on the NNG thread that
 * received it: the request is checked completely against the model's input
 * spec (anything wrong is answered here and never reaches the loop), then a
 * good one goes to the loop's inbox (loop.c), where batcher.c queues it.
 *
 * Layer: a feature (docs/architecture.md, "server/"), beside batcher.c and
 * worker.c, the rest of the predict path. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "server.h"

/* Checks the decoded predict against the model and fills r->inputs.
 * Returns GROVE_OK, or GROVE_E_INVALID_ARGUMENT with err naming the field,
 * what came and what was expected. */
static grove_status check_predict(srv_req *r, const grove_model *gm, grove_err *err) {
  const Grove__PredictRequest *p = r->msg->predict;
  const char *mname = r->model->name;
  if (p->n_inputs != gm->ninputs) {
    char names[256] = "";
    size_t used = 0;
    for (size_t i = 0; i < gm->ninputs && used < sizeof names; i++)
      used += (size_t)snprintf(names + used, sizeof names - used, "%s'%s'", i ? ", " : "",
                               gm->inputs[i].name);
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT,
                         "inputs: model '%s' takes %zu input%s (%s), the request has %zu", mname,
                         gm->ninputs, gm->ninputs == 1 ? "" : "s", names, p->n_inputs);
  }
  for (size_t i = 0; i < p->n_inputs; i++) {
    const Grove__Tensor *t = p->inputs[i];
    const grove_io_spec *sp = &gm->inputs[i];
    char want[160], got[160]; /* formatted only for a message */
    if (t->dtype < 0 || t->dtype >= GROVE_DTYPE_COUNT || grove_dtype_size(t->dtype) == 0)
      return grove_err_set(err, GROVE_E_INVALID_ARGUMENT,
                           "inputs[%zu] ('%s').dtype: %d is not a grove_dtype value; expected %d "
                           "(%s)",
                           i, sp->name, t->dtype, (int)sp->dtype, grove_dtype_name(sp->dtype));
    if (t->n_shape > GROVE_MAX_DIMS || (int)t->n_shape != sp->ndim) {
      grove_shape_str(sp->ndim, sp->shape, want, sizeof want);
      return grove_err_set(err, GROVE_E_INVALID_ARGUMENT,
                           "inputs[%zu] ('%s').shape: %zu dimensions; expected %d (%s %s)", i,
                           sp->name, t->n_shape, sp->ndim, grove_dtype_name(sp->dtype), want);
    }
    uint64_t numel = 1;
    for (size_t d = 0; d < t->n_shape; d++) {
      if (t->shape[d] < 0)
        return grove_err_set(err, GROVE_E_INVALID_ARGUMENT,
                             "inputs[%zu] ('%s').shape[%zu] is %" PRId64 "; dimensions are >= 0", i,
                             sp->name, d, t->shape[d]);
      if (__builtin_mul_overflow(numel, (uint64_t)t->shape[d], &numel))
        return grove_err_set(err, GROVE_E_INVALID_ARGUMENT,
                             "inputs[%zu] ('%s').shape: the element count overflows", i, sp->name);
    }
    uint64_t bytes;
    if (__builtin_mul_overflow(numel, (uint64_t)grove_dtype_size(t->dtype), &bytes) ||
        bytes != (uint64_t)t->data.len) {
      grove_shape_str((int)t->n_shape, t->shape, got, sizeof got);
      return grove_err_set(err, GROVE_E_INVALID_ARGUMENT,
                           "inputs[%zu] ('%s').data: %zu bytes, but %s %s takes %" PRIu64
                           " bytes (%" PRIu64 " elements of %zu bytes)",
                           i, sp->name, t->data.len, grove_dtype_name(t->dtype), got, bytes, numel,
                           grove_dtype_size(t->dtype));
    }
    grove_tensor_init(&r->inputs[i], (grove_dtype)t->dtype, (int)t->n_shape, t->shape,
                      t->data.data);
  }
  r->ninputs = p->n_inputs;
  grove_status s = grove_model_check_inputs(gm, r->inputs, r->ninputs, err);
  if (s) {
    /* grove_model_check_inputs says E_DTYPE or E_SHAPE; on the wire a request
     * that does not fit is INVALID_ARGUMENT, its message says which part. */
    grove_err_prefix(err, "model '%s'", mname);
    err->code = GROVE_E_INVALID_ARGUMENT;
    return GROVE_E_INVALID_ARGUMENT;
  }
  if (gm->batching.max_batch_size == 0) { /* unbatched: dimension 0 is the model's own */
    r->rows = 1;
    return GROVE_OK;
  }
  int64_t rows = r->inputs[0].shape[0];
  for (size_t i = 1; i < r->ninputs; i++)
    if (r->inputs[i].shape[0] != rows)
      return grove_err_set(err, GROVE_E_INVALID_ARGUMENT,
                           "inputs[%zu] ('%s') has %" PRId64 " rows, inputs[0] ('%s') has %" PRId64
                           "; every input has the same rows (dimension 0)",
                           i, gm->inputs[i].name, r->inputs[i].shape[0], gm->inputs[0].name, rows);
  if (rows == 0)
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT,
                         "inputs[0] ('%s') has 0 rows; send at least one", gm->inputs[0].name);
  if (rows > gm->batching.max_batch_size)
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT,
                         "inputs[0] ('%s') has %" PRId64
                         " rows, more than model '%s' runs at once "
                         "(batching.max_batch_size %" PRId64 "); split the request",
                         gm->inputs[0].name, rows, mname, gm->batching.max_batch_size);
  r->rows = rows;
  return GROVE_OK;
}

void grove__predict_submit(srv_req *r) {
  srv_server *srv = r->srv;
  const Grove__PredictRequest *p = r->msg->predict;
  srv_model *m = grove__registry_find(srv, p->model);
  if (!m) {
    char names[512];
    grove__registry_names(srv, names, sizeof names);
    grove__rpc_reply_error(r, GROVE_E_NOT_FOUND, "model '%s' is not served here (models: %s)",
                           p->model, names);
    return;
  }
  r->model = m;
  if (atomic_load(&srv->draining)) {
    grove__rpc_reply_error(r, GROVE_E_UNAVAILABLE,
                           "groved is shutting down; send the request to another replica");
    return;
  }
  srv_version *v = grove__model_acquire(m);
  if (!v) {
    grove__rpc_reply_error(r, GROVE_E_UNAVAILABLE, "model '%s' is not loaded: %s", m->name,
                           m->error ? m->error : "unknown error");
    return;
  }
  grove_err err = {0};
  grove_status s = check_predict(r, v->model, &err);
  grove__version_release(v);
  if (s) {
    grove__rpc_reply_error(r, s, "%s", grove_err_msg(&err));
    return;
  }
  r->deadline = p->timeout_us ? r->t_recv + (int64_t)(p->timeout_us > (uint64_t)INT64_MAX / 2000
                                                          ? INT64_MAX / 2
                                                          : p->timeout_us * 1000)
                              : INT64_MAX;
  r->accepted = true;
  atomic_fetch_add(&srv->inflight, 1);
  grove__inbox_push_req(srv, r);
}

grove_status grove__predict_start(srv_server *srv, grove_err *err) {
  (void)err;
  grove__rpc_set_handler(srv, GROVE__REQUEST__BODY_PREDICT, grove__predict_submit, true);
  return GROVE_OK;
}
