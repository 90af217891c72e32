/* oip.h: the Open Inference Protocol's tensor codec (oip_json.c), for
 * oip.c only.  Any thread. */
#ifndef GROVE_SERVER_OIP_H
#define GROVE_SERVER_OIP_H

#include <jansson.h>

#include "server.h"

/* "FP32" for GROVE_F32 ... ("INVALID" for none). */
const char *grove__oip_dtype_name(grove_dtype dt);
/* "TYPE_FP32" ... (Triton's model configuration). */
const char *grove__oip_triton_type(grove_dtype dt);
/* The grove_dtype of an OIP datatype name; false for a name Grove has no
 * dtype for (BYTES, UINT16, ...). */
bool grove__oip_dtype_parse(const char *name, grove_dtype *dt);
/* The names grove__oip_dtype_parse takes, for messages. */
const char *grove__oip_dtype_list(void);
/* A JSON "data" value (an array, flat or nested row-major, or one number)
 * of numel elements of dt into a new buffer (*out, malloc'd, the caller's).
 * false with why (what is wrong, to follow "inputs[i] ('x').data ") when
 * the count or a value does not fit.  Costs in proportion to data. */
bool grove__oip_json_data(const json_t *data, grove_dtype dt, uint64_t numel, void **out,
                          char *why, size_t n);
/* s as a JSON string, quoted and escaped, appended to b. */
void grove__oip_write_string(srv_text *b, const char *s);
/* numel elements of dt at data as a flat JSON array, appended to b. */
void grove__oip_write_data(srv_text *b, grove_dtype dt, const void *data, uint64_t numel);

/* An inputs[i].data array of numbers cut out of a request's JSON. */
typedef struct oip_span {
  size_t input;    /* i: its index in "inputs" */
  size_t off, len; /* where it was in the text */
  uint64_t leaves; /* its numbers */
} oip_span;
/* json[0, len) copied to out (len + 1 bytes; NUL-terminated) with each
 * inputs[i].data that is an array of numbers (nested at most
 * GROVE_MAX_DIMS deep, strict JSON numbers) replaced by null, at most max
 * of them described in spans; returns out's length.  Anything else is
 * copied as it is, for jansson to parse or refuse.  One pass. */
size_t grove__oip_cut_data(const char *json, size_t len, char *out, oip_span *spans, size_t max,
                           size_t *nspans);
/* grove__oip_json_data for a span sp of text (the original JSON): the same
 * results and messages. */
bool grove__oip_text_data(const char *text, const oip_span *sp, grove_dtype dt, uint64_t numel,
                          void **out, char *why, size_t n);

#endif
