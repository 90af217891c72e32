/* oip.c: the Open Inference Protocol (KServe "V2" REST, as Triton, KServe
 * and MLServer serve it) on groved's HTTP listener (docs/protocol.md, "Open
 * Inference Protocol"):
 *
 *   GET  /v2                                   server metadata
 *   GET  /v2/health/live, /v2/health/ready     liveness, readiness
 *   GET  /v2/models/{m}[/versions/{v}]         model metadata
 *   GET  /v2/models/{m}[/versions/{v}]/ready   model readiness
 *   GET  /v2/models/{m}[/versions/{v}]/config  Triton's model configuration
 *   POST /v2/models/{m}[/versions/{v}]/infer   inference (JSON, or JSON and
 *                                              binary tensor data)
 *
 * An infer becomes a predict on the same path as the NNG RPC's: its inputs
 * are decoded on the HTTP thread into a Grove__PredictRequest in the
 * model's input order (binary tensors are not copied: they point into the
 * request body, which the connection keeps until the answer), and
 * grove__predict_submit validates (the same messages), queues and batches
 * it with NNG's requests.  The srv_req carries oip_origin: its errors and
 * its outputs come back here instead of to NNG.  The worker that computed
 * the outputs encodes the answer (JSON, or JSON and binary) from its arena
 * and posts it to the HTTP thread (grove__http_post), which writes it.
 *
 * Threads: the route runs on the HTTP thread; oip_error on whichever thread
 * owns the request (the HTTP thread for a request refused at once, the loop
 * for a full queue or a deadline, a worker for a failed batch);
 * oip_outputs on the worker; answer() on the HTTP thread.  An oip_req
 * belongs to one of them at a time, like an NNG srv_req.
 *
 * Nothing here is an admin operation: reloads, hooks, exports and training
 * stay on the admin plane (NNG). */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "oip.h"

/* One infer in flight. */
typedef struct oip_req {
  srv_req r; /* the predict path's view; first, so that a srv_req * is an oip_req * */
  srv_server *srv;
  hconn *conn;
  srv_http_job job;
  Grove__Request msg;
  Grove__PredictRequest pred;
  Grove__Tensor tens[GROVE_MAX_VALUES];
  Grove__Tensor *tp[GROVE_MAX_VALUES];
  int64_t shapes[GROVE_MAX_VALUES][GROVE_MAX_DIMS];
  void *owned[GROVE_MAX_VALUES]; /* inputs decoded from JSON (malloc'd) */
  char *id;                      /* the request's "id", or NULL */
  char model_name[256];
  /* Outputs asked for: nwant of them (0: every output), by index, and
   * whether each goes as binary data. */
  int nwant;
  int want[GROVE_MAX_VALUES];
  bool want_binary[GROVE_MAX_VALUES];
  bool binary_all; /* parameters.binary_data_output */
  bool sending;    /* counted in srv.sending until the answer is written */
  srv_hres res;    /* the answer, posted to the HTTP thread */
} oip_req;

static const srv_origin oip_origin;

/* ------------------------------------------------------------ answers */

static void set_json(srv_hres *res, uint16_t code, srv_text *b) {
  *res = (srv_hres){.code = code, .ctype = "application/json"};
  if (b->oom || !b->p) {
    free(b->p);
    static const char m[] = "{\"error\":\"out of memory\"}";
    res->code = 500;
    res->static_body = m;
    res->len = sizeof m - 1;
    return;
  }
  res->body = b->p;
  res->len = b->len;
}

/* {"error": msg} with code. */
static void set_error(srv_hres *res, uint16_t code, const char *msg) {
  srv_text b = {0};
  grove__text_append(&b, "{\"error\":", 9);
  grove__oip_write_string(&b, msg);
  grove__text_append(&b, "}", 1);
  set_json(res, code, &b);
}

/* The HTTP status of a grove_status (docs/protocol.md has the table). */
static uint16_t http_code(grove_status s) {
  switch (s) {
    case GROVE_OK:
      return 200;
    case GROVE_E_INVALID_ARGUMENT:
    case GROVE_E_SHAPE:
    case GROVE_E_DTYPE:
      return 400;
    case GROVE_E_NOT_FOUND:
      return 404;
    case GROVE_E_RESOURCE_EXHAUSTED:
      return 429;
    case GROVE_E_UNAVAILABLE:
      return 503;
    case GROVE_E_DEADLINE_EXCEEDED:
      return 504;
    default:
      return 500;
  }
}

static void oip_free(oip_req *o) {
  for (size_t i = 0; i < GROVE_MAX_VALUES; i++) free(o->owned[i]);
  free(o->id);
  free(o);
}

/* The answer was written (or its connection had closed): HTTP thread. */
static void answer_done(void *arg) {
  oip_req *o = arg;
  srv_server *srv = o->srv;
  if (o->sending) {
    atomic_fetch_sub(&srv->sending, 1);
    if (atomic_load(&srv->draining)) srv->rpc.wake(srv);
  }
  oip_free(o);
}

static void answer(srv_http_job *job) {
  oip_req *o = (oip_req *)((char *)job - offsetof(oip_req, job));
  o->res.done = answer_done;
  o->res.done_arg = o;
  grove__http_answer(o->conn, &o->res);
}

/* o's answer is in o->res: count it and hand it to the HTTP thread.  An
 * accepted predict counts in srv.sending until the answer is written (it
 * rises before srv.inflight falls, as rpc.c's do, so the drain never sees
 * both at zero while the answer is on its way). */
static void finish(oip_req *o, grove_status s) {
  srv_server *srv = o->srv;
  grove__metrics_answer(srv, &o->r, s);
  if (o->r.accepted) {
    atomic_fetch_add(&srv->sending, 1);
    atomic_fetch_sub(&srv->inflight, 1);
    o->sending = true;
  }
  o->r.accepted = false;
  o->job.fn = answer;
  grove__http_post(srv, &o->job);
}

static void oip_error(srv_req *r, grove_status s, const char *msg) {
  oip_req *o = (oip_req *)r;
  set_error(&o->res, http_code(s), msg);
  finish(o, s);
}

static const char *output_name(const grove_model *gm, int k, char *buf, size_t n) {
  if ((size_t)k < gm->noutputs && gm->outputs[k].name && gm->outputs[k].name[0])
    return gm->outputs[k].name;
  snprintf(buf, n, "output_%d", k);
  return buf;
}

/* The worker's outputs, encoded here (worker thread). */
static void oip_outputs(srv_req *r, const srv_batch *b, const grove_values *out, int64_t row0,
                        int64_t compute_ns) {
  (void)compute_ns;
  oip_req *o = (oip_req *)r;
  const grove_model *gm = b->version->model;
  srv_text j = {0};
  grove__text_printf(&j, "{\"model_name\":");
  grove__oip_write_string(&j, r->model->name);
  grove__text_printf(&j, ",\"model_version\":\"%" PRId64 "\"", b->version->number);
  if (o->id) {
    grove__text_append(&j, ",\"id\":", 6);
    grove__oip_write_string(&j, o->id);
  }
  grove__text_append(&j, ",\"outputs\":[", 12);
  int n = o->nwant ? o->nwant : out->n;
  const void *bin[GROVE_MAX_VALUES];
  size_t binlen[GROVE_MAX_VALUES], nbin = 0;
  int written = 0;
  for (int i = 0; i < n; i++) {
    int k = o->nwant ? o->want[i] : i;
    if (k >= out->n) continue; /* a reload changed the outputs: the ones left */
    const grove_tensor *t = &out->v[k];
    size_t nbytes;
    int64_t dim0;
    const unsigned char *p = grove__batch_slice(b, r, t, row0, &nbytes, &dim0);
    char nb[32];
    grove__text_append(&j, written ? ",{\"name\":" : "{\"name\":", written ? 9 : 8);
    written++;
    grove__oip_write_string(&j, output_name(gm, k, nb, sizeof nb));
    grove__text_printf(&j, ",\"datatype\":\"%s\",\"shape\":[", grove__oip_dtype_name(t->dtype));
    for (int d = 0; d < t->ndim; d++)
      grove__text_printf(&j, "%s%" PRId64, d ? "," : "", d ? t->shape[d] : dim0);
    grove__text_append(&j, "]", 1);
    bool binary = o->nwant ? o->want_binary[i] : o->binary_all;
    if (binary) {
      grove__text_printf(&j, ",\"parameters\":{\"binary_data_size\":%zu}}", nbytes);
      bin[nbin] = p;
      binlen[nbin++] = nbytes;
    } else {
      grove__text_append(&j, ",\"data\":", 8);
      grove__oip_write_data(&j, t->dtype, p, nbytes / grove_dtype_size(t->dtype));
      grove__text_append(&j, "}", 1);
    }
  }
  grove__text_append(&j, "]}", 2);
  size_t json_len = j.len;
  for (size_t i = 0; i < nbin; i++) grove__text_append(&j, bin[i], binlen[i]);
  set_json(&o->res, 200, &j);
  if (nbin && o->res.code == 200) {
    /* Triton's binary answer: the JSON, then the tensors in output order;
     * the header says where the JSON ends. */
    o->res.ctype = "application/octet-stream";
    snprintf(o->res.extra, sizeof o->res.extra, "Inference-Header-Content-Length: %zu\r\n",
             json_len);
  }
  finish(o, o->res.code == 200 ? GROVE_OK : GROVE_E_NOMEM);
}

static const srv_origin oip_origin = {
    .protocol = SRV_PROTO_OIP, .error = oip_error, .outputs = oip_outputs};

/* ------------------------------------------------------------ infer */

/* The request refused before it reached the predict path (HTTP thread):
 * counted under its model (or none) like a predict the RPC refuses. */
static void refuse(oip_req *o, grove_status s, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void refuse(oip_req *o, grove_status s, const char *fmt, ...) {
  char msg[GROVE_ERR_MSG_MAX];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  oip_error(&o->r, s, msg);
}

/* The binary section: the body past the JSON header, consumed in input
 * order. */
typedef struct binsec {
  const unsigned char *p;
  size_t len, used;
  size_t json_len; /* the JSON header's bytes before p */
} binsec;

/* The inputs' data arrays grove__oip_cut_data took out of the text. */
typedef struct cutdata {
  const char *text; /* the original JSON */
  oip_span spans[GROVE_MAX_VALUES];
  size_t n;
} cutdata;

/* Fills o's predict from the JSON request root (binary tensors from bs,
 * data arrays cut out of the text from cut); false when refused (o
 * answered). */
static bool decode_infer(oip_req *o, const json_t *root, const grove_model *gm, binsec *bs,
                         const cutdata *cut) {
  const char *mname = o->model_name;
  json_t *id = json_object_get(root, "id");
  if (id && !json_is_string(id)) {
    refuse(o, GROVE_E_INVALID_ARGUMENT, "id: a string, if given");
    return false;
  }
  if (id && !(o->id = strdup(json_string_value(id)))) {
    refuse(o, GROVE_E_NOMEM, "out of memory");
    return false;
  }
  json_t *params = json_object_get(root, "parameters");
  if (params && !json_is_object(params)) {
    refuse(o, GROVE_E_INVALID_ARGUMENT, "parameters: an object, if given");
    return false;
  }
  json_t *bdo = params ? json_object_get(params, "binary_data_output") : NULL;
  o->binary_all = bdo && json_is_true(bdo);
  json_t *timeout = params ? json_object_get(params, "timeout") : NULL;
  if (timeout) {
    if (!json_is_integer(timeout) || json_integer_value(timeout) < 0) {
      refuse(o, GROVE_E_INVALID_ARGUMENT,
             "parameters.timeout: microseconds, an integer >= 0 (0: none)");
      return false;
    }
    o->pred.timeout_us = (uint64_t)json_integer_value(timeout);
  }

  json_t *inputs = json_object_get(root, "inputs");
  if (!json_is_array(inputs)) {
    refuse(o, GROVE_E_INVALID_ARGUMENT, "inputs: the request needs an array of inputs");
    return false;
  }
  size_t nin = json_array_size(inputs);
  /* Each request input by name into the model's order; the predict path
   * then checks count, shapes, dtypes and rows as it does the RPC's. */
  size_t slot_of[GROVE_MAX_VALUES];
  bool filled[GROVE_MAX_VALUES] = {false};
  if (nin > GROVE_MAX_VALUES) {
    refuse(o, GROVE_E_INVALID_ARGUMENT, "inputs: %zu of them; model '%s' takes %zu", nin, mname,
           gm->ninputs);
    return false;
  }
  for (size_t j = 0; j < nin; j++) {
    json_t *in = json_array_get(inputs, j);
    const char *name = json_string_value(json_object_get(in, "name"));
    if (!json_is_object(in) || !name) {
      refuse(o, GROVE_E_INVALID_ARGUMENT, "inputs[%zu]: an object with a \"name\"", j);
      return false;
    }
    size_t slot = gm->ninputs;
    for (size_t i = 0; i < gm->ninputs; i++)
      if (strcmp(gm->inputs[i].name, name) == 0) slot = i;
    if (slot == gm->ninputs) {
      char names[256] = "";
      size_t used = 0;
      for (size_t i = 0; i < gm->ninputs && used < sizeof names; i++)
        used += (size_t)snprintf(names + used, sizeof names - used, "%s'%s'", i ? ", " : "",
                                 gm->inputs[i].name);
      refuse(o, GROVE_E_INVALID_ARGUMENT, "inputs[%zu] ('%s'): model '%s' has no such input (%s)",
             j, name, mname, names);
      return false;
    }
    if (filled[slot]) {
      refuse(o, GROVE_E_INVALID_ARGUMENT, "inputs[%zu] ('%s'): given twice", j, name);
      return false;
    }
    filled[slot] = true;
    slot_of[j] = slot;
  }
  for (size_t i = 0; i < gm->ninputs; i++)
    if (!filled[i]) {
      refuse(o, GROVE_E_INVALID_ARGUMENT, "inputs: model '%s' input '%s' is missing", mname,
             gm->inputs[i].name);
      return false;
    }
  for (size_t j = 0; j < nin; j++) {
    json_t *in = json_array_get(inputs, j);
    size_t slot = slot_of[j];
    const char *name = gm->inputs[slot].name;
    Grove__Tensor *t = &o->tens[slot];
    const char *dts = json_string_value(json_object_get(in, "datatype"));
    grove_dtype dt;
    if (!dts) {
      refuse(o, GROVE_E_INVALID_ARGUMENT, "inputs[%zu] ('%s').datatype: missing", j, name);
      return false;
    }
    if (!grove__oip_dtype_parse(dts, &dt)) {
      refuse(o, GROVE_E_INVALID_ARGUMENT,
             "inputs[%zu] ('%s').datatype: '%s' is not a datatype Grove has (%s); model '%s' "
             "takes %s",
             j, name, dts, grove__oip_dtype_list(), mname,
             grove__oip_dtype_name(gm->inputs[slot].dtype));
      return false;
    }
    json_t *shape = json_object_get(in, "shape");
    size_t nd = json_array_size(shape);
    if (!json_is_array(shape) || nd > GROVE_MAX_DIMS) {
      refuse(o, GROVE_E_INVALID_ARGUMENT,
             "inputs[%zu] ('%s').shape: an array of at most %d dimensions", j, name,
             GROVE_MAX_DIMS);
      return false;
    }
    uint64_t numel = 1;
    for (size_t d = 0; d < nd; d++) {
      json_t *v = json_array_get(shape, d);
      if (!json_is_integer(v) || json_integer_value(v) < 0) {
        refuse(o, GROVE_E_INVALID_ARGUMENT,
               "inputs[%zu] ('%s').shape[%zu]: dimensions are integers >= 0", j, name, d);
        return false;
      }
      o->shapes[slot][d] = (int64_t)json_integer_value(v);
      if (__builtin_mul_overflow(numel, (uint64_t)o->shapes[slot][d], &numel)) {
        refuse(o, GROVE_E_INVALID_ARGUMENT, "inputs[%zu] ('%s').shape: the element count overflows",
               j, name);
        return false;
      }
    }
    t->dtype = (int32_t)dt;
    t->n_shape = nd;
    t->shape = o->shapes[slot];
    json_t *ip = json_object_get(in, "parameters");
    json_t *bsize = json_is_object(ip) ? json_object_get(ip, "binary_data_size") : NULL;
    json_t *data = json_object_get(in, "data");
    if (bsize) {
      if (!json_is_integer(bsize) || json_integer_value(bsize) < 0) {
        refuse(o, GROVE_E_INVALID_ARGUMENT,
               "inputs[%zu] ('%s').parameters.binary_data_size: a byte count", j, name);
        return false;
      }
      uint64_t n = (uint64_t)json_integer_value(bsize);
      if (n > bs->len - bs->used) {
        refuse(o, GROVE_E_INVALID_ARGUMENT,
               "inputs[%zu] ('%s').parameters.binary_data_size: %" PRIu64
               " bytes, but only %zu of the body's %zu binary bytes (after "
               "Inference-Header-Content-Length) are left",
               j, name, n, bs->len - bs->used, bs->len);
        return false;
      }
      /* Binary tensors are kept where they are (the request body). */
      t->data.data = (uint8_t *)bs->p + bs->used;
      t->data.len = (size_t)n;
      bs->used += (size_t)n;
    } else {
      if (!data) {
        refuse(o, GROVE_E_INVALID_ARGUMENT,
               "inputs[%zu] ('%s'): no \"data\" and no parameters.binary_data_size", j, name);
        return false;
      }
      char why[256];
      const oip_span *sp = NULL;
      for (size_t k = 0; json_is_null(data) && k < cut->n; k++)
        if (cut->spans[k].input == j) sp = &cut->spans[k];
      if (sp ? !grove__oip_text_data(cut->text, sp, dt, numel, &o->owned[slot], why, sizeof why)
             : !grove__oip_json_data(data, dt, numel, &o->owned[slot], why, sizeof why)) {
        refuse(o, GROVE_E_INVALID_ARGUMENT, "inputs[%zu] ('%s').data %s", j, name, why);
        return false;
      }
      t->data.data = o->owned[slot];
      t->data.len = (size_t)numel * grove_dtype_size(dt);
    }
  }
  if (bs->used != bs->len) {
    refuse(o, GROVE_E_INVALID_ARGUMENT,
           "binary data: the inputs' binary_data_size add up to %zu bytes, but the body carries "
           "%zu after its %zu-byte JSON header (Inference-Header-Content-Length)",
           bs->used, bs->len, bs->json_len);
    return false;
  }

  json_t *outs = json_object_get(root, "outputs");
  if (outs) {
    if (!json_is_array(outs) || json_array_size(outs) > GROVE_MAX_VALUES) {
      refuse(o, GROVE_E_INVALID_ARGUMENT, "outputs: an array of at most %d outputs, if given",
             GROVE_MAX_VALUES);
      return false;
    }
    for (size_t j = 0; j < json_array_size(outs); j++) {
      json_t *ow = json_array_get(outs, j);
      const char *name = json_string_value(json_object_get(ow, "name"));
      int k = -1;
      char nb[32];
      for (size_t i = 0; name && i < gm->noutputs; i++)
        if (strcmp(output_name(gm, (int)i, nb, sizeof nb), name) == 0) k = (int)i;
      if (k < 0) {
        refuse(o, GROVE_E_INVALID_ARGUMENT, "outputs[%zu] ('%s'): model '%s' has no such output",
               j, name ? name : "", mname);
        return false;
      }
      json_t *op = json_object_get(ow, "parameters");
      json_t *bd = json_is_object(op) ? json_object_get(op, "binary_data") : NULL;
      o->want[o->nwant] = k;
      o->want_binary[o->nwant++] = bd ? json_is_true(bd) : o->binary_all;
    }
  }
  for (size_t i = 0; i < gm->ninputs; i++) o->tp[i] = &o->tens[i];
  o->pred.n_inputs = gm->ninputs;
  o->pred.inputs = o->tp;
  return true;
}

/* POST .../infer (HTTP thread).  Always answered later (finish posts). */
static void infer(srv_server *srv, const srv_hreq *q, srv_model *m, const char *name) {
  oip_req *o = calloc(1, sizeof *o);
  if (!o) {
    srv_hres res;
    set_error(&res, 500, "out of memory");
    grove__http_answer(q->conn, &res);
    return;
  }
  o->srv = srv;
  o->conn = q->conn;
  o->r.srv = srv;
  o->r.origin = &oip_origin;
  o->r.t_recv = grove__now_ns();
  o->r.deadline = INT64_MAX;
  o->r.counted = true;
  o->r.model = m; /* NULL: counted unrouted, like the RPC's */
  snprintf(o->model_name, sizeof o->model_name, "%s", name);
  grove__request__init(&o->msg);
  grove__predict_request__init(&o->pred);
  for (size_t i = 0; i < GROVE_MAX_VALUES; i++) grove__tensor__init(&o->tens[i]);
  o->msg.body_case = GROVE__REQUEST__BODY_PREDICT;
  o->msg.predict = &o->pred;
  o->pred.model = o->model_name;
  o->r.msg = &o->msg;
  if (!m) {
    grove__predict_submit(&o->r); /* NOT_FOUND, worded as the RPC's */
    return;
  }
  /* The JSON: the whole body, or its first Inference-Header-Content-Length
   * bytes, the binary tensors following. */
  char hv[32];
  if (grove__http_header(q, "Content-Encoding", hv, sizeof hv) && strcmp(hv, "identity") != 0) {
    refuse(o, GROVE_E_INVALID_ARGUMENT,
           "Content-Encoding '%s' is not supported: send the body uncompressed", hv);
    return;
  }
  size_t jlen = q->body_len;
  binsec bs = {0};
  if (grove__http_header(q, "Inference-Header-Content-Length", hv, sizeof hv)) {
    char *end;
    unsigned long long v = strtoull(hv, &end, 10);
    if (!hv[0] || *end || hv[0] == '-' || v > q->body_len) {
      refuse(o, GROVE_E_INVALID_ARGUMENT,
             "Inference-Header-Content-Length: '%s' is not a byte count within the body's %zu "
             "bytes",
             hv, q->body_len);
      return;
    }
    jlen = (size_t)v;
    bs.p = (const unsigned char *)q->body + jlen;
    bs.len = q->body_len - jlen;
    bs.json_len = jlen;
  }
  if (jlen == 0) {
    refuse(o, GROVE_E_INVALID_ARGUMENT, "the request has no JSON body");
    return;
  }
  /* The numbers of the data arrays are read straight into the tensors;
   * jansson parses the rest (oip_json.c, "the fast path"). */
  cutdata cut = {.text = q->body};
  char *text = malloc(jlen + 1);
  if (!text) {
    refuse(o, GROVE_E_NOMEM, "out of memory for the request's JSON");
    return;
  }
  size_t tlen = grove__oip_cut_data(q->body, jlen, text, cut.spans, GROVE_MAX_VALUES, &cut.n);
  json_error_t jerr;
  json_t *root = json_loadb(text, tlen, JSON_REJECT_DUPLICATES, &jerr);
  free(text);
  if (!root && cut.n) /* where the error is, in the text the client sent */
    root = json_loadb(q->body, jlen, JSON_REJECT_DUPLICATES, &jerr);
  if (!root || !json_is_object(root)) {
    if (root)
      refuse(o, GROVE_E_INVALID_ARGUMENT, "the request's JSON is not an object");
    else
      refuse(o, GROVE_E_INVALID_ARGUMENT, "malformed JSON at line %d, column %d: %s", jerr.line,
             jerr.column, jerr.text);
    json_decref(root);
    return;
  }
  srv_version *v = grove__model_acquire(m);
  if (!v) {
    json_decref(root);
    grove__predict_submit(&o->r); /* not loaded: UNAVAILABLE, as the RPC's */
    return;
  }
  bool ok = decode_infer(o, root, v->model, &bs, &cut);
  grove__version_release(v);
  json_decref(root);
  if (ok) grove__predict_submit(&o->r);
}

/* ------------------------------------------------------------ metadata */

static void shape_json(srv_text *b, const grove_io_spec *sp, int from, bool batched) {
  grove__text_append(b, "[", 1);
  for (int d = from; d < sp->ndim; d++)
    grove__text_printf(b, "%s%" PRId64, d > from ? "," : "",
                       d == 0 && batched ? -1 : sp->shape[d]);
  grove__text_append(b, "]", 1);
}

/* The inputs or outputs of a model as a JSON array, under key: OIP's
 * metadata ("datatype" FP32, "shape" with -1 for the batch) or, with
 * triton, Triton's configuration ("data_type" TYPE_FP32, "dims" without
 * the batch dimension, which max_batch_size > 0 says is there; with
 * max_batch_size 0, unbatched, every dimension is the model's own). */
static void specs_json(srv_text *b, const char *key, const grove_io_spec *sp, size_t n,
                       bool triton, bool batched) {
  grove__text_printf(b, ",\"%s\":[", key);
  for (size_t i = 0; i < n; i++) {
    grove__text_append(b, i ? ",{\"name\":" : "{\"name\":", i ? 9 : 8);
    grove__oip_write_string(b, sp[i].name ? sp[i].name : "");
    if (triton)
      grove__text_printf(b, ",\"data_type\":\"%s\",\"dims\":",
                         grove__oip_triton_type(sp[i].dtype));
    else
      grove__text_printf(b, ",\"datatype\":\"%s\",\"shape\":",
                         grove__oip_dtype_name(sp[i].dtype));
    shape_json(b, &sp[i], triton && batched ? 1 : 0, batched);
    grove__text_append(b, "}", 1);
  }
  grove__text_append(b, "]", 1);
}

static void model_metadata(srv_model *m, const grove_model *gm, int64_t version, srv_hres *res) {
  srv_text b = {0};
  grove__text_append(&b, "{\"name\":", 8);
  grove__oip_write_string(&b, m->name);
  grove__text_printf(&b, ",\"versions\":[\"%" PRId64 "\"],\"platform\":\"grove\"", version);
  specs_json(&b, "inputs", gm->inputs, gm->ninputs, false, gm->batching.max_batch_size > 0);
  specs_json(&b, "outputs", gm->outputs, gm->noutputs, false, gm->batching.max_batch_size > 0);
  grove__text_append(&b, "}", 1);
  set_json(res, 200, &b);
}

/* Triton's model configuration, as much of it as perf_analyzer and
 * tritonclient read. */
static void model_config(srv_model *m, const grove_model *gm, srv_hres *res) {
  srv_text b = {0};
  grove__text_append(&b, "{\"name\":", 8);
  grove__oip_write_string(&b, m->name);
  grove__text_printf(&b, ",\"platform\":\"grove\",\"backend\":\"grove\",\"max_batch_size\":%" PRId64,
                     gm->batching.max_batch_size);
  /* Triton allows dynamic batching only with a batch dimension. */
  if (gm->batching.max_batch_size > 0)
    grove__text_printf(&b, ",\"dynamic_batching\":{\"max_queue_delay_microseconds\":%" PRId64 "}",
                       gm->batching.max_queue_delay_us);
  grove__text_printf(&b, ",\"version_policy\":{\"latest\":{\"num_versions\":1}}");
  specs_json(&b, "input", gm->inputs, gm->ninputs, true, gm->batching.max_batch_size > 0);
  specs_json(&b, "output", gm->outputs, gm->noutputs, true, gm->batching.max_batch_size > 0);
  grove__text_append(&b, "}", 1);
  set_json(res, 200, &b);
}

static void server_metadata(srv_hres *res) {
  srv_text b = {0};
  grove__text_printf(&b,
                     "{\"name\":\"grove\",\"version\":\"%s\",\"extensions\":"
                     "[\"binary_tensor_data\",\"model_configuration\"]}",
                     GROVE_VERSION);
  set_json(res, 200, &b);
}

/* /v2/health/ready: as /readyz. */
static void server_ready(srv_server *srv, srv_hres *res) {
  if (atomic_load(&srv->draining)) {
    set_error(res, 503, "groved is shutting down");
    return;
  }
  for (size_t i = 0; i < srv->nmodels; i++)
    if (atomic_load(&srv->models[i].version_number) == 0) {
      char msg[GROVE_ERR_MSG_MAX];
      snprintf(msg, sizeof msg, "model '%s' is not loaded: %s", srv->models[i].name,
               srv->models[i].error ? srv->models[i].error : "unknown error");
      set_error(res, 503, msg);
      return;
    }
  *res = (srv_hres){.code = 200, .ctype = "application/json", .static_body = "", .len = 0};
}

/* ------------------------------------------------------------ routing */

/* One path segment of s (up to '/' or the end), %-decoded, in buf; returns
 * what follows it, or NULL when it does not fit or decodes badly. */
static const char *segment(const char *s, char *buf, size_t n) {
  size_t j = 0;
  for (; *s && *s != '/'; s++) {
    char c = *s;
    if (c == '%') {
      unsigned v;
      if (!s[1] || !s[2] || sscanf(s + 1, "%2x", &v) != 1) return NULL;
      c = (char)v;
      s += 2;
    }
    if (j + 1 >= n || c == 0) return NULL;
    buf[j++] = c;
  }
  buf[j] = 0;
  return s;
}

static bool method_is(const srv_hreq *q, const char *allow, srv_hres *res) {
  bool get = strcmp(allow, "GET") == 0;
  if (get ? strcmp(q->method, "GET") == 0 || strcmp(q->method, "HEAD") == 0
          : strcmp(q->method, allow) == 0)
    return true;
  char msg[96];
  snprintf(msg, sizeof msg, "%s %s: this endpoint takes %s", q->method, q->path,
           get ? "GET (or HEAD)" : allow);
  set_error(res, 405, msg);
  snprintf(res->extra, sizeof res->extra, "Allow: %s\r\n", get ? "GET, HEAD" : allow);
  return false;
}

static bool oip_route(srv_server *srv, const srv_hreq *q, srv_hres *res) {
  const char *p = q->path + 3; /* past "/v2" */
  if (*p == 0) {
    if (method_is(q, "GET", res)) server_metadata(res);
    return true;
  }
  if (strcmp(p, "/health/live") == 0) {
    if (method_is(q, "GET", res))
      *res = (srv_hres){.code = 200, .ctype = "application/json", .static_body = ""};
    return true;
  }
  if (strcmp(p, "/health/ready") == 0) {
    if (method_is(q, "GET", res)) server_ready(srv, res);
    return true;
  }
  char name[256], vers[32] = "";
  if (strncmp(p, "/models/", 8) != 0 || !(p = segment(p + 8, name, sizeof name)) || !name[0]) {
    set_error(res, 404, "not an Open Inference Protocol endpoint (docs/protocol.md)");
    return true;
  }
  if (strncmp(p, "/versions/", 10) == 0 && !(p = segment(p + 10, vers, sizeof vers))) {
    set_error(res, 404, "a version is a number");
    return true;
  }
  enum { META, READY, CONFIG, INFER } what;
  if (*p == 0)
    what = META;
  else if (strcmp(p, "/ready") == 0)
    what = READY;
  else if (strcmp(p, "/config") == 0)
    what = CONFIG;
  else if (strcmp(p, "/infer") == 0)
    what = INFER;
  else {
    set_error(res, 404, "not an Open Inference Protocol endpoint (docs/protocol.md)");
    return true;
  }
  if (!method_is(q, what == INFER ? "POST" : "GET", res)) return true;
  srv_model *m = grove__registry_find(srv, name);
  /* An infer for no model or without a version goes down the predict path,
   * which words (and counts) unknown models, draining and not loaded as it
   * does for the RPC. */
  if (what == INFER && (!m || !vers[0])) {
    infer(srv, q, m, name);
    return false;
  }
  char msg[GROVE_ERR_MSG_MAX];
  if (!m) {
    char names[512];
    grove__registry_names(srv, names, sizeof names);
    snprintf(msg, sizeof msg, "model '%s' is not served here (models: %s)", name, names);
    set_error(res, 404, msg);
    return true;
  }
  int64_t serving = atomic_load(&m->version_number);
  if (vers[0]) {
    char *end;
    long long v = strtoll(vers, &end, 10);
    if (*end || v <= 0 || v != serving) {
      /* Grove serves one version of a model at a time: the one hot reload
       * installed last (docs/operations.md, "Hot reload"). */
      snprintf(msg, sizeof msg,
               "model '%s' version '%s' is not served: groved serves one version at a time, now "
               "%" PRId64,
               name, vers, serving);
      set_error(res, 404, msg);
      return true;
    }
  }
  if (what == INFER) {
    infer(srv, q, m, name);
    return false;
  }
  srv_version *v = grove__model_acquire(m);
  if (!v) {
    snprintf(msg, sizeof msg, "model '%s' is not loaded: %s", name,
             m->error ? m->error : "unknown error");
    set_error(res, 503, msg);
    return true;
  }
  switch (what) {
    case READY:
      if (atomic_load(&srv->draining))
        set_error(res, 503, "groved is shutting down");
      else
        *res = (srv_hres){.code = 200, .ctype = "application/json", .static_body = ""};
      break;
    case CONFIG:
      model_config(m, v->model, res);
      break;
    default:
      model_metadata(m, v->model, v->number, res);
      break;
  }
  grove__version_release(v);
  return true;
}

grove_status grove__oip_start(srv_server *srv, grove_err *err) {
  (void)err;
  grove__http_set_route(srv, "/v2", oip_route);
  return GROVE_OK;
}
