/* client_train.c: libgrove-client's training calls (include/grove/client.h,
 * "training"; docs/training.md).  Training RPCs belong to groved's admin
 * plane: each call goes through grove__client_admin_plane first. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client_impl.h"

void grove_train_info_fini(grove_train_info *info) {
  if (!info) return;
  grove__client_strv_free(info->param_names, info->nparams);
  free(info->group_sizes);
  memset(info, 0, sizeof *info);
}

static const char *loss_name(grove_loss_kind k) {
  switch (k) {
    case GROVE_LOSS_MSE:
      return "MSELoss";
    case GROVE_LOSS_CROSS_ENTROPY:
      return "CrossEntropyLoss";
    case GROVE_LOSS_BCE_WITH_LOGITS:
      return "BCEWithLogitsLoss";
  }
  return "";
}

static const char *optim_name(grove_optim_kind k) {
  return k == GROVE_OPTIM_ADAM ? "Adam" : k == GROVE_OPTIM_ADAMW ? "AdamW" : "SGD";
}

grove_status grove_client_start_training(grove_client *c, const char *model,
                                         const grove_train_opts *o, int timeout_ms,
                                         grove_train_info *out, grove_err *err) {
  if (out) memset(out, 0, sizeof *out);
  if (!c || !model || !o || !out || (o->ngroups && !o->groups) || o->ngroups > 64)
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT,
                         LOCAL_PREFIX
                         "start_training: needs a client, a model, options and "
                         "somewhere for the result (at most 64 groups)");
  grove_status plane = grove__client_admin_plane(&c, "start_training", err);
  if (plane) return plane;
  Grove__DoubleValue v[9];
  for (int i = 0; i < 9; i++) grove__double_value__init(&v[i]);
  Grove__StartTrainingRequest q = GROVE__START_TRAINING_REQUEST__INIT;
  q.model = (char *)model;
  q.optimizer = (char *)optim_name(o->optimizer);
  v[0].value = o->h.lr, q.lr = &v[0];
  v[1].value = o->h.momentum, q.momentum = &v[1];
  v[2].value = o->h.dampening, q.dampening = &v[2];
  v[3].value = o->h.beta1, q.beta1 = &v[3];
  v[4].value = o->h.beta2, q.beta2 = &v[4];
  v[5].value = o->h.eps, q.eps = &v[5];
  v[6].value = o->h.weight_decay, q.weight_decay = &v[6];
  q.nesterov = o->h.nesterov;
  q.amsgrad = o->h.amsgrad;
  q.maximize = o->h.maximize;
  Grove__ParamGroup groups[64], *gp[64];
  Grove__DoubleValue glr[64], gwd[64];
  for (size_t g = 0; g < o->ngroups; g++) {
    grove__param_group__init(&groups[g]);
    groups[g].n_prefixes = o->groups[g].nprefixes;
    groups[g].prefixes = (char **)o->groups[g].prefixes;
    if (o->groups[g].has_lr) {
      grove__double_value__init(&glr[g]);
      glr[g].value = o->groups[g].lr;
      groups[g].lr = &glr[g];
    }
    if (o->groups[g].has_weight_decay) {
      grove__double_value__init(&gwd[g]);
      gwd[g].value = o->groups[g].weight_decay;
      groups[g].weight_decay = &gwd[g];
    }
    gp[g] = &groups[g];
  }
  q.n_param_groups = o->ngroups;
  q.param_groups = gp;
  q.loss = (char *)loss_name(o->loss.kind);
  q.reduction = o->loss.reduction == GROVE_REDUCTION_SUM ? "sum" : "mean";
  Grove__Int64Value ii = GROVE__INT64_VALUE__INIT;
  ii.value = o->loss.ignore_index;
  q.ignore_index = &ii;
  q.label_smoothing = o->loss.label_smoothing;
  Grove__Tensor pw;
  int64_t pw_shape[GROVE_MAX_DIMS];
  grove_tensor *pw_copy = NULL;
  if (o->loss.pos_weight) {
    grove_status s =
        grove__client_wire_of(o->loss.pos_weight, "pos_weight", &pw, pw_shape, &pw_copy, err);
    if (s) return s;
    q.pos_weight = &pw;
  }
  q.seed = o->seed;
  q.optimizer_state = (char *)(o->optimizer_state ? o->optimizer_state : "");
  Grove__Request req = GROVE__REQUEST__INIT;
  req.body_case = GROVE__REQUEST__BODY_START_TRAINING;
  req.start_training = &q;
  Grove__Reply *r = NULL;
  grove_status s = grove__client_call_for(c, &req, grove__client_timeout_of(c, timeout_ms),
                                          GROVE__REPLY__BODY_START_TRAINING,
                                          "the reply to start_training is empty", &r, err);
  grove_tensor_release(pw_copy);
  if (s) return s;
  const Grove__StartTrainingReply *w = r->start_training;
  bool oom = false;
  out->base_version = w->base_version;
  out->param_count = w->param_count;
  out->param_names = grove__client_strv_dup(w->param_names, w->n_param_names, &oom);
  out->nparams = out->param_names ? w->n_param_names : 0;
  if (w->n_group_sizes && (out->group_sizes = malloc(w->n_group_sizes * sizeof(uint32_t)))) {
    memcpy(out->group_sizes, w->group_sizes, w->n_group_sizes * sizeof(uint32_t));
    out->ngroups = w->n_group_sizes;
  } else if (w->n_group_sizes) {
    oom = true;
  }
  grove__reply__free_unpacked(r, NULL);
  if (oom) {
    grove_train_info_fini(out);
    return grove__client_nomem(err);
  }
  return GROVE_OK;
}

grove_status grove_client_train_step(grove_client *c, const char *model, const grove_tensor *inputs,
                                     size_t ninputs, const grove_tensor *target, int timeout_ms,
                                     grove_train_step_result *out, grove_err *err) {
  if (out) memset(out, 0, sizeof *out);
  if (!c || !model || !target || !out)
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT,
                         LOCAL_PREFIX
                         "train_step: needs a client, a model, a target and "
                         "somewhere for the result");
  grove_status plane = grove__client_admin_plane(&c, "train_step", err);
  if (plane) return plane;
  wire_batch b;
  grove_status s =
      grove__client_wire_batch_init(&b, inputs, ninputs, target, GROVE_MAX_VALUES, err);
  Grove__Reply *r = NULL;
  if (!s) {
    Grove__TrainStepRequest q = GROVE__TRAIN_STEP_REQUEST__INIT;
    q.model = (char *)model;
    q.n_inputs = ninputs;
    q.inputs = b.ptrs;
    q.target = b.ptrs[ninputs];
    Grove__Request req = GROVE__REQUEST__INIT;
    req.body_case = GROVE__REQUEST__BODY_TRAIN_STEP;
    req.train_step = &q;
    s = grove__client_call_for(c, &req, grove__client_timeout_of(c, timeout_ms),
                               GROVE__REPLY__BODY_TRAIN_STEP, "the reply to train_step is empty",
                               &r, err);
  }
  grove__client_wire_batch_fini(&b);
  if (s) return s;
  out->loss = r->train_step->loss;
  out->grad_norm = r->train_step->grad_norm;
  out->step = r->train_step->step;
  out->compute_us = r->train_step->compute_us;
  grove__reply__free_unpacked(r, NULL);
  return GROVE_OK;
}

grove_status grove_client_evaluate(grove_client *c, const char *model, const grove_tensor *inputs,
                                   size_t ninputs, const grove_tensor *target, int timeout_ms,
                                   grove_prediction *out, double *loss, grove_err *err) {
  if (out) memset(out, 0, sizeof *out);
  if (loss) *loss = NAN;
  if (!c || !model || !out)
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT,
                         LOCAL_PREFIX
                         "evaluate: needs a client, a model and somewhere for the "
                         "outputs");
  grove_status plane = grove__client_admin_plane(&c, "evaluate", err);
  if (plane) return plane;
  wire_batch b;
  grove_status s =
      grove__client_wire_batch_init(&b, inputs, ninputs, target, GROVE_MAX_VALUES, err);
  Grove__Reply *r = NULL;
  if (!s) {
    Grove__EvaluateRequest q = GROVE__EVALUATE_REQUEST__INIT;
    q.model = (char *)model;
    q.n_inputs = ninputs;
    q.inputs = b.ptrs;
    q.target = target ? b.ptrs[ninputs] : NULL;
    Grove__Request req = GROVE__REQUEST__INIT;
    req.body_case = GROVE__REQUEST__BODY_EVALUATE;
    req.evaluate = &q;
    s = grove__client_call_for(c, &req, grove__client_timeout_of(c, timeout_ms),
                               GROVE__REPLY__BODY_EVALUATE, "the reply to evaluate is empty", &r,
                               err);
  }
  grove__client_wire_batch_fini(&b);
  if (s) return s;
  const Grove__EvaluateReply *w = r->evaluate;
  s = grove__client_outputs_from_wire(w->outputs, w->n_outputs, out, err);
  if (loss && w->has_loss) *loss = w->loss;
  grove__reply__free_unpacked(r, NULL);
  return s;
}

grove_status grove_client_promote(grove_client *c, const char *model, const char *path,
                                  bool in_place, int timeout_ms, grove_reload_result *out,
                                  grove_err *err) {
  if (out) memset(out, 0, sizeof *out);
  if (!c || !model || !out)
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT,
                         LOCAL_PREFIX
                         "promote: needs a client, a model and somewhere for the "
                         "result");
  grove_status plane = grove__client_admin_plane(&c, "promote", err);
  if (plane) return plane;
  Grove__PromoteRequest q = GROVE__PROMOTE_REQUEST__INIT;
  q.model = (char *)model;
  q.path = (char *)(path ? path : "");
  q.in_place = in_place;
  Grove__Request req = GROVE__REQUEST__INIT;
  req.body_case = GROVE__REQUEST__BODY_PROMOTE;
  req.promote = &q;
  /* Promote answers with its reload's reply. */
  return grove__client_reload_call(c, &req, grove__client_timeout_of(c, timeout_ms), "promote", out,
                                   err);
}

grove_status grove_client_stop_training(grove_client *c, const char *model,
                                        const char *optimizer_state, int timeout_ms,
                                        uint64_t *steps, grove_err *err) {
  if (steps) *steps = 0;
  if (!c || !model)
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT,
                         LOCAL_PREFIX "stop_training: needs a client and a model");
  grove_status plane = grove__client_admin_plane(&c, "stop_training", err);
  if (plane) return plane;
  Grove__StopTrainingRequest q = GROVE__STOP_TRAINING_REQUEST__INIT;
  q.model = (char *)model;
  q.optimizer_state = (char *)(optimizer_state ? optimizer_state : "");
  Grove__Request req = GROVE__REQUEST__INIT;
  req.body_case = GROVE__REQUEST__BODY_STOP_TRAINING;
  req.stop_training = &q;
  Grove__Reply *r = NULL;
  grove_status s = grove__client_call(c, &req, grove__client_timeout_of(c, timeout_ms), &r, err);
  if (s) return s;
  if (steps && r->body_case == GROVE__REPLY__BODY_STOP_TRAINING) *steps = r->stop_training->steps;
  grove__reply__free_unpacked(r, NULL);
  return GROVE_OK;
}
