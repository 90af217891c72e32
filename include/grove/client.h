/* client.h: libgrove-client, the C API for talking to groved.
 *
 *   grove_client *c;
 *   const char *urls[] = {"tcp://127.0.0.1:7700"};
 *   if (grove_client_open(urls, 1, NULL, &c, &err)) ...;
 *   grove_prediction p;
 *   if (grove_client_predict(c, "digits", &x, 1, 1000, &p, &err)) ...;
 *   ... p.outputs[0] ...
 *   grove_prediction_fini(&p);
 *   grove_client_close(c);
 *
 * Link with libgrove-client.a, libgrove.a (tensors), libprotobuf-c and
 * libnng.  The wire format is proto/grove.proto (docs/protocol.md).
 *
 * Statuses: a call returns GROVE_OK, or the status the server answered with
 * (GROVE_E_NOT_FOUND, GROVE_E_INVALID_ARGUMENT, GROVE_E_RESOURCE_EXHAUSTED,
 * GROVE_E_DEADLINE_EXCEEDED, GROVE_E_UNAVAILABLE, ...) with the server's
 * message in err, or one of these from the client side:
 *   GROVE_E_UNAVAILABLE        no connection: none of the URLs could be
 *                              reached at open; or the last connection went
 *                              away (the server exited, was killed or closed
 *                              it), which fails every call in flight at
 *                              once; or a call made while no connection is
 *                              back found none within 2 s of redialing (not
 *                              its whole timeout: docs/operations.md,
 *                              "Connections")
 *   GROVE_E_DEADLINE_EXCEEDED  connected, but no reply within the timeout
 *   GROVE_E_FORMAT             the reply did not decode (not a groved?)
 *   GROVE_E_INVALID_ARGUMENT   bad arguments to the call
 *   GROVE_E_NOMEM
 * grove_client_failed_locally() tells these apart from the same statuses
 * sent by the server (a draining server answers UNAVAILABLE itself).
 *
 * Threads: one grove_client may be used by any number of threads at once
 * (a synchronous call writes its request and, when no other thread is
 * reading that connection, reads its own reply on its own thread); open and
 * close must not race with calls on the same client.
 * grove_client_predict_async keeps many requests in flight from one thread
 * (the bench's clients); their replies are read in bursts by one reader
 * thread per client, which runs the callbacks.
 *
 * Transport: the client speaks NNG's SP protocol (req0) itself over tcp://
 * and ipc://, on its own sockets, with no NNG thread; GROVE_CLIENT_IO=nng
 * (read at open) uses an NNG req0 socket instead, for NNG's other
 * transports (docs/operations.md, "The client's transport").  Either talks
 * to any SP rep0 server: groved's listeners, its admin plane. */
#ifndef GROVE_CLIENT_H
#define GROVE_CLIENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "grove/checkpoint.h"
#include "grove/model.h"
#include "grove/status.h"
#include "grove/tensor.h"
#include "grove/train.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct grove_client grove_client;

/* groved's default admin listener (groved --admin-listen): local only. */
#define GROVE_DEFAULT_ADMIN_URL "tcp://127.0.0.1:7703"

typedef struct grove_client_opts {
  /* Timeout of a call whose timeout_ms argument is 0.  0 here means 30000. */
  int default_timeout_ms;
  /* Where the admin calls (reload, export, hooks, training) go: groved
   * serves them on its admin listener, not on the URLs given to open.  NULL
   * or "": $GROVE_ADMIN, else GROVE_DEFAULT_ADMIN_URL.  Dialed at the first
   * admin call. */
  const char *admin_url;
  /* The admin plane's token (groved --admin-token-file), sent with admin
   * calls only.  NULL: $GROVE_ADMIN_TOKEN, else none; "": none.  Copied. */
  const char *admin_token;
} grove_client_opts;

/* Connects to every URL (tcp://HOST:PORT, ipc:///PATH), each dialed once
 * synchronously.  A URL that cannot be reached now keeps being retried in
 * the background, as long as at least one could: with none, open fails with
 * GROVE_E_UNAVAILABLE naming them.  opts may be NULL.  *out is the caller's;
 * close it with grove_client_close.  Any thread.
 *
 * Several URLs are replicas of one service (docs/operations.md, "Several
 * replicas"): requests go round robin over the connected ones, and
 * grove_client_predict sends a request that a replica could not answer (its
 * connection was lost, or it answered UNAVAILABLE: draining, model not
 * loaded there) to another, within the same timeout.  The asynchronous
 * predict does not retry.
 *
 * The admin calls (reload, export, the hook and training calls) go to
 * groved's admin listener, opts->admin_url (docs/operations.md,
 * "Security"); they fail with GROVE_E_UNAVAILABLE naming it when it cannot
 * be reached, and a groved answers GROVE_E_PERMISSION_DENIED to one sent to
 * its data listener.  They act on one replica and are not safe to resend, so
 * a client of several URLs refuses them (GROVE_E_INVALID_ARGUMENT, from the
 * client side) unless an admin URL was given (opts or $GROVE_ADMIN). */
grove_status grove_client_open(const char *const *urls, size_t nurls, const grove_client_opts *opts,
                               grove_client **out, grove_err *err);
/* Waits for outstanding asynchronous calls, closes the connections and frees
 * c.  NULL is a no-op.  No synchronous call on c may be running, and none
 * may start afterwards. */
void grove_client_close(grove_client *c);

/* The result of one predict.  outputs are new heap tensors owned by the
 * prediction (grove_prediction_fini releases them; retain one to keep it);
 * names[i] is outputs[i]'s name, owned likewise. */
typedef struct grove_prediction {
  size_t noutputs;
  grove_tensor **outputs;
  char **names;
  int64_t version;     /* the model version that computed the outputs */
  uint64_t queue_us;   /* time the request waited for its batch */
  uint64_t compute_us; /* time of the batch's forward */
  uint32_t batch_rows; /* rows of the batch the request rode in */
} grove_prediction;

/* Sends inputs (ninputs tensors, in the model's input order; any strides:
 * they are sent in C order) to model and waits at most timeout_ms (0: the
 * client's default) for the outputs.  The server drops the request unanswered
 * by its compute if it is still queued when the timeout passes.  The inputs
 * stay the caller's.  On success *out holds the outputs (fini it); on error
 * *out is empty and needs no fini.  Any thread, concurrently. */
grove_status grove_client_predict(grove_client *c, const char *model, const grove_tensor *inputs,
                                  size_t ninputs, int timeout_ms, grove_prediction *out,
                                  grove_err *err);
/* Releases everything p holds and empties it.  An empty p is a no-op. */
void grove_prediction_fini(grove_prediction *p);

/* The completion of an asynchronous predict.  Called once, on the client's
 * reader thread (GROVE_CLIENT_IO=nng: one of NNG's threads), with s == GROVE_OK and p holding the outputs (the callback owns
 * them: grove_prediction_fini), or with the status, p NULL and err saying
 * why.  err is valid during the call only.  It must not block and must not
 * close the client or wait for it to be idle; it may start the next call. */
typedef void (*grove_predict_cb)(void *arg, grove_status s, grove_prediction *p,
                                 const grove_err *err);

/* grove_client_predict without waiting: sends the request and returns;
 * cb(arg, ...) runs when the reply comes or the timeout passes.  The inputs
 * are encoded before it returns and stay the caller's.  When it returns an
 * error, cb is never called.  Many calls may be outstanding at once (one
 * context each, reused from call to call).  Any thread. */
grove_status grove_client_predict_async(grove_client *c, const char *model,
                                        const grove_tensor *inputs, size_t ninputs, int timeout_ms,
                                        grove_predict_cb cb, void *arg, grove_err *err);
/* Waits until no asynchronous call of c is outstanding (every callback has
 * returned).  grove_client_close waits so too.  Not from a callback. */
void grove_client_wait_idle(grove_client *c);

/* One served model, as the server describes it.  Every pointer is owned by
 * the struct that holds it. */
typedef struct grove_model_info {
  char *name;
  char *dir;
  char *weights_path; /* "" when none */
  bool ready;         /* false: the load failed, error says why */
  char *error;        /* "" when ready */
  int64_t version;
  size_t ninputs, noutputs;
  grove_io_spec *inputs, *outputs;
  int64_t param_count;
  uint64_t weight_bytes;
  grove_batching batching;
  uint64_t queue_depth; /* requests waiting when the reply was made */
} grove_model_info;

typedef struct grove_server_status {
  char *server_version;
  uint32_t protocol;
  bool ready;    /* every configured model loaded and not draining */
  bool draining; /* SIGTERM seen */
  uint64_t uptime_ms;
  uint32_t workers, blas_threads;
  uint64_t inflight; /* predicts accepted and not yet answered */
  size_t nmodels;
  grove_model_info *models;
  size_t nlisten; /* groved's data listener URLs (--listen) */
  char **listen_urls;
  size_t nadmin; /* its admin listener URLs (--admin-listen; none: no admin plane) */
  char **admin_urls;
} grove_server_status;

/* Asks the server for its status and every model it serves.  *out is new and
 * the caller's (grove_server_status_free).  Any thread. */
grove_status grove_client_status(grove_client *c, int timeout_ms, grove_server_status **out,
                                 grove_err *err);
void grove_server_status_free(grove_server_status *s);

/* One model's metadata; GROVE_E_NOT_FOUND when the server has no such model.
 * *out is new and the caller's (grove_model_info_free).  Any thread. */
grove_status grove_client_model_info(grove_client *c, const char *model, int timeout_ms,
                                     grove_model_info **out, grove_err *err);
void grove_model_info_free(grove_model_info *m);

/* ------------------------------------------------------------ reload */

typedef struct grove_reload_opts {
  const char *checkpoint; /* a file on the server's machine; NULL: the directory's weights */
  const char *model_dir;  /* serve another model directory; NULL: the current one */
  bool non_strict;        /* load_state_dict(strict=False) */
  bool in_place;          /* load into the serving tree (the model pauses); not with model_dir */
} grove_reload_opts;

/* What a reload did.  On success: the new version.  On failure (the call's
 * status, e.g. GROVE_E_STATE_DICT) the server's lists of what did not fit:
 * missing and unexpected keys, and errors (size mismatches, dtypes), as
 * torch words them; version is then the one still serving.  Every pointer is
 * owned by the struct (grove_reload_result_fini). */
typedef struct grove_reload_result {
  int64_t version, previous_version;
  char *weights_path;             /* the file loaded ("" when none) */
  char *dir;                      /* the model directory served */
  uint64_t duration_us, pause_us; /* request to serving; in place: the pause */
  bool in_place;
  size_t n_missing, n_unexpected, n_errors;
  char **missing, **unexpected, **errors;
} grove_reload_result;

/* Asks the server to reload model (docs/protocol.md, "Reload") and waits for
 * the new version to serve (timeout_ms 0: the client's default; a large
 * model may take seconds).  GROVE_OK with *out filled, or the server's
 * status and message (UNAVAILABLE: another reload of the model is in
 * progress, or draining) with *out holding the lists when the server sent
 * them.  opts may be NULL (the directory's weights, strict).  *out is always
 * initialised; fini it.  Any thread. */
grove_status grove_client_reload(grove_client *c, const char *model, const grove_reload_opts *opts,
                                 int timeout_ms, grove_reload_result *out, grove_err *err);
void grove_reload_result_fini(grove_reload_result *r);

/* ------------------------------------------------------------ export */

typedef struct grove_export_opts {
  const char *prefix;       /* only the keys that start with it; NULL: every key */
  const char *archive_name; /* .pt: the folder inside the zip; NULL: "archive" */
  size_t chunk_bytes;       /* bytes asked per round trip; 0: 8 MiB (the server caps it) */
} grove_export_opts;

typedef struct grove_export_info {
  int64_t version;     /* the one version every byte comes from */
  uint64_t total_size; /* bytes of the file */
  uint32_t tensors;    /* keys in it */
} grove_export_info;

/* Receives the file's bytes in order, chunk after chunk; returns GROVE_OK to
 * go on, anything else to stop the export (that status is returned). */
typedef grove_status (*grove_export_sink)(void *user, const void *data, size_t len, grove_err *err);

/* Exports the serving version of model's state_dict as a file of format
 * (GROVE_CKPT_SAFETENSORS or GROVE_CKPT_TORCH_ZIP), handing its bytes to
 * sink; memory stays bounded by one chunk whatever the model's size.
 * timeout_ms bounds each round trip.  info (may be NULL) says which version
 * it was.  On any failure the export is closed on the server too.  Any
 * thread. */
grove_status grove_client_export(grove_client *c, const char *model, grove_ckpt_format format,
                                 const grove_export_opts *opts, int timeout_ms,
                                 grove_export_sink sink, void *user, grove_export_info *info,
                                 grove_err *err);
/* grove_client_export into path, the format from its extension (.safetensors;
 * .pt, .pth, .bin) and, for .pt, the archive named after the file as
 * torch.save does.  Written to a file with no name in path's directory
 * (O_TMPFILE; a hidden temporary where that is not available), fsync'd and
 * named path, so a failed export, or a process killed during it, leaves no
 * file; an existing path is refused
 * with GROVE_E_ALREADY_EXISTS unless overwrite.  opts->archive_name is
 * ignored.  Any thread. */
grove_status grove_client_export_file(grove_client *c, const char *model, const char *path,
                                      bool overwrite, const grove_export_opts *opts, int timeout_ms,
                                      grove_export_info *info, grove_err *err);

/* True when status s, just returned by a call with err, came from the client
 * side (no connection, no reply in time, undecodable reply) rather than from
 * the server: the CLI's exit status 3 versus 1. */
bool grove_client_failed_locally(grove_status s, const grove_err *err);

/* ------------------------------------------------------------ hooks */

/* Forward-hook telemetry (docs/telemetry.md): a hook asks groved for
 * statistics of what matching modules of a served model compute on live
 * traffic; they are published on groved's PUB socket (grove_watch_*). */

typedef enum grove_hook_kind {
  GROVE_HOOK_FORWARD = 0,     /* the module's output (register_forward_hook) */
  GROVE_HOOK_FORWARD_PRE = 1, /* its input (register_forward_pre_hook) */
} grove_hook_kind;

typedef struct grove_hook_spec {
  const char *model;
  /* An exact dotted path ("1", "encoder.block.0"; "" the model itself) or a
   * glob ("encoder.layers.*.linear1", "**" every module). */
  const char *pattern;
  grove_hook_kind kind;
  uint32_t every;          /* one event per N observed batches; 0 = 1 */
  double sample_rate;      /* fraction of batches observed, (0, 1]; 0 = 1 */
  uint32_t histogram_bins; /* 0 = none */
  double histogram_min, histogram_max;
  bool per_feature; /* mean and std per column of 2-D tensors */
} grove_hook_spec;

/* A registered hook as the server describes it; every pointer is owned by
 * the struct. */
typedef struct grove_hook_info {
  uint64_t id;
  char *model, *pattern;
  grove_hook_kind kind;
  uint32_t every;
  double sample_rate;
  uint32_t histogram_bins;
  double histogram_min, histogram_max;
  bool per_feature;
  size_t nmodules;
  char **modules;  /* what the pattern matches in version */
  int64_t version; /* the model version it was last resolved against */
  uint64_t events_published, events_dropped;
  char *note; /* why it matches nothing; "" when it matches */
} grove_hook_info;

/* Registers a hook; *id (may be NULL) gets its id, *info (may be NULL) a new
 * description the caller frees with grove_hook_info_free.  The server
 * answers GROVE_E_NOT_FOUND for an unknown model or a pattern matching no
 * module, GROVE_E_INVALID_ARGUMENT for a bad pattern or setting,
 * GROVE_E_FAILED_PRECONDITION when it publishes no telemetry (--pub none).
 * Any thread. */
grove_status grove_client_register_hook(grove_client *c, const grove_hook_spec *spec,
                                        int timeout_ms, uint64_t *id, grove_hook_info **info,
                                        grove_err *err);
/* Removes hook id (GROVE_E_NOT_FOUND when there is none); *removed (may be
 * NULL) describes it as it was.  Any thread. */
grove_status grove_client_remove_hook(grove_client *c, uint64_t id, int timeout_ms,
                                      grove_hook_info **removed, grove_err *err);
/* The hooks of model (NULL or "": every model), in registration order, as a
 * new array of *n (free with grove_hook_infos_free).  Any thread. */
grove_status grove_client_list_hooks(grove_client *c, const char *model, int timeout_ms,
                                     grove_hook_info **hooks, size_t *n, grove_err *err);
/* NULL is a no-op. */
void grove_hook_info_free(grove_hook_info *h);
void grove_hook_infos_free(grove_hook_info *hooks, size_t n);

/* ------------------------------------------------------------ watching */

/* One hook event: the statistics of one module over one interval.  mean,
 * std (unbiased), min, max and abs_mean are over finite values; nan_count
 * and inf_count count the others.  Arrays are owned by the event. */
typedef struct grove_hook_event {
  char *model, *module;
  int64_t version;
  uint64_t hook_id;
  grove_hook_kind kind;
  uint64_t batches, rows, count;
  double mean, std, min, max, abs_mean, zero_fraction;
  uint64_t nan_count, inf_count;
  size_t nbins; /* histogram */
  uint64_t *histogram;
  double histogram_min, histogram_max;
  uint64_t histogram_below, histogram_above;
  size_t nfeatures; /* per_feature */
  double *feature_mean, *feature_std;
  int64_t start_unix_us, end_unix_us;
  uint64_t sequence; /* per hook and module, from 1; a gap = events lost */
  uint32_t worker;
  int ndim;
  int64_t shape[GROVE_MAX_DIMS]; /* of the last tensor seen */
} grove_hook_event;

typedef struct grove_watch grove_watch;

/* Subscribes to the PUB socket at url (groved --pub; tcp:// or ipc://):
 * every event (model NULL), every event of model (module NULL), or one
 * module's events (model and module, exact).  The socket is dialed once
 * synchronously (GROVE_E_UNAVAILABLE when nothing listens) and then kept
 * connected in the background.  *out is the caller's (grove_watch_close).
 * A watch is used by one thread at a time. */
grove_status grove_watch_open(const char *url, const char *model, const char *module,
                              grove_watch **out, grove_err *err);
/* Waits at most timeout_ms (< 0: forever) for the next event and decodes it
 * into *ev (grove_hook_event_fini it).  GROVE_E_DEADLINE_EXCEEDED when none
 * came, GROVE_E_FORMAT for a message that is not a hook event (it is
 * skipped; call again). */
grove_status grove_watch_next(grove_watch *w, int timeout_ms, grove_hook_event *ev,
                              grove_err *err);
void grove_hook_event_fini(grove_hook_event *ev);
/* NULL is a no-op.  (NNG 1.5.2's nng_close can hang on a SUB socket whose
 * receive queue is full, nanomsg/nng#1543: a watch that keeps calling
 * grove_watch_next never has one.) */
void grove_watch_close(grove_watch *w);

/* ------------------------------------------------------------ training */

/* A training session on the server (docs/training.md, "On the server"): a
 * replica of the model's serving version trained by train_step, checked by
 * evaluate and made the next serving version by promote.  Serving is not
 * touched before promote.  One session per model. */

/* A param_group by parameter name: the parameters (named_parameters(), as
 * "0.weight") that start with one of prefixes (none: every parameter no
 * earlier group took), with their own lr / weight_decay when has_*. */
typedef struct grove_param_group_spec {
  const char *const *prefixes;
  size_t nprefixes;
  bool has_lr, has_weight_decay;
  double lr, weight_decay;
} grove_param_group_spec;

typedef struct grove_train_opts {
  grove_optim_kind optimizer;
  grove_optim_hparams h;                /* every field is sent: start from grove_optim_defaults */
  const grove_param_group_spec *groups; /* ngroups 0: one group with every parameter */
  size_t ngroups;
  grove_loss loss;             /* kind, reduction, ignore_index, label_smoothing, pos_weight */
  uint64_t seed;               /* the replica's Dropout generator */
  const char *optimizer_state; /* a torch.save'd optimizer state on the server; NULL: fresh */
} grove_train_opts;

/* What StartTraining built.  Owned by the struct (grove_train_info_fini). */
typedef struct grove_train_info {
  int64_t base_version; /* the serving version the replica copies */
  size_t nparams;
  char **param_names; /* torch's model.parameters() order */
  int64_t param_count;
  size_t ngroups;
  uint32_t *group_sizes;
} grove_train_info;
void grove_train_info_fini(grove_train_info *info);

/* Starts model's training session.  GROVE_E_ALREADY_EXISTS when it has one,
 * GROVE_E_UNSUPPORTED when a module cannot be trained (naming it), the
 * optimizer's or loss's GROVE_E_INVALID_ARGUMENT for a bad value.  *out is
 * always initialised (fini it).  Any thread. */
grove_status grove_client_start_training(grove_client *c, const char *model,
                                         const grove_train_opts *opts, int timeout_ms,
                                         grove_train_info *out, grove_err *err);

typedef struct grove_train_step_result {
  double loss, grad_norm; /* the gradients' total L2 norm before the step */
  uint64_t step;          /* steps the session has taken */
  uint64_t compute_us;
} grove_train_step_result;

/* One step (zero_grad, forward, loss, backward, optimizer step) on a batch:
 * inputs as for predict, target the loss's (int64 class indices for
 * CrossEntropyLoss, else float32).  Any strides; they stay the caller's. */
grove_status grove_client_train_step(grove_client *c, const char *model, const grove_tensor *inputs,
                                     size_t ninputs, const grove_tensor *target, int timeout_ms,
                                     grove_train_step_result *out, grove_err *err);

/* The replica in eval mode on inputs: *out the outputs (fini it; version is
 * the session's base version).  With a target (may be NULL), *loss (may be
 * NULL) gets the loss, else NaN. */
grove_status grove_client_evaluate(grove_client *c, const char *model, const grove_tensor *inputs,
                                   size_t ninputs, const grove_tensor *target, int timeout_ms,
                                   grove_prediction *out, double *loss, grove_err *err);

/* Makes the replica's state_dict model's next serving version, through the
 * reload path: written to path on the server (NULL: a new file in groved's
 * temporary directory; it backs the new version: keep it), then loaded as a
 * Reload with that checkpoint (in_place as for reload).  *out is the
 * reload's result (fini it). */
grove_status grove_client_promote(grove_client *c, const char *model, const char *path,
                                  bool in_place, int timeout_ms, grove_reload_result *out,
                                  grove_err *err);

/* Ends model's session, first saving the optimizer's state_dict to
 * optimizer_state on the server when not NULL (if that fails the session
 * goes on).  *steps (may be NULL) gets the steps it took. */
grove_status grove_client_stop_training(grove_client *c, const char *model,
                                        const char *optimizer_state, int timeout_ms,
                                        uint64_t *steps, grove_err *err);

#ifdef __cplusplus
}
#endif
#endif
