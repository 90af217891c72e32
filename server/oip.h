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

#endif
