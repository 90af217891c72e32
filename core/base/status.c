/* status.c: names and messages of grove_status, and the error buffer. */
#include <stdio.h>
#include <string.h>

#include "base.h"

const char *grove_status_name(grove_status s) {
  switch (s) {
#define X(name, value, msg) \
  case GROVE_##name:        \
    return "GROVE_" #name;
    GROVE_STATUS_LIST(X)
#undef X
  }
  return "GROVE_E_UNKNOWN";
}

const char *grove_strerror(grove_status s) {
  switch (s) {
#define X(name, value, msg) \
  case GROVE_##name:        \
    return msg;
    GROVE_STATUS_LIST(X)
#undef X
  }
  return "unknown status";
}

void grove_err_clear(grove_err *err) {
  if (!err) return;
  err->code = GROVE_OK;
  err->msg[0] = '\0';
}

/* Marks a message that vsnprintf had to cut, so that nobody mistakes it for
 * the whole story. */
static void mark_truncated(grove_err *err, int wanted) {
  if (wanted >= (int)sizeof err->msg) memcpy(err->msg + sizeof err->msg - 4, "...", 4);
}

grove_status grove_err_setv(grove_err *err, grove_status code, const char *fmt, va_list ap) {
  if (!err) return code;
  err->code = code;
  int n = vsnprintf(err->msg, sizeof err->msg, fmt, ap);
  if (n < 0) err->msg[0] = '\0';
  mark_truncated(err, n);
  return code;
}

grove_status grove_err_set(grove_err *err, grove_status code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  grove_err_setv(err, code, fmt, ap);
  va_end(ap);
  return code;
}

grove_status grove_err_prefix(grove_err *err, const char *fmt, ...) {
  if (!err) return GROVE_OK;
  char head[512];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(head, sizeof head, fmt, ap);
  va_end(ap);
  if (n < 0) return err->code;
  char old[GROVE_ERR_MSG_MAX];
  memcpy(old, err->msg, sizeof old);
  const char *rest = old[0] ? old : grove_strerror(err->code);
  int m = snprintf(err->msg, sizeof err->msg, "%s: %s", head, rest);
  mark_truncated(err, m);
  return err->code;
}

const char *grove_err_msg(const grove_err *err) {
  if (!err) return "";
  if (err->msg[0]) return err->msg;
  return grove_strerror(err->code);
}
