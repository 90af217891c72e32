/* log.c: the process-wide log callback.  core/ never prints; it hands events
 * to whatever the program installed. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base.h"

static grove_log_fn log_fn;
static void *log_user;

void grove_set_log(grove_log_fn fn, void *user) {
  log_fn = fn;
  log_user = user;
}

const char *grove_log_level_name(grove_log_level level) {
  switch (level) {
    case GROVE_LOG_DEBUG: return "debug";
    case GROVE_LOG_INFO: return "info";
    case GROVE_LOG_WARN: return "warn";
    case GROVE_LOG_ERROR: return "error";
  }
  return "?";
}

void grove__log(grove_log_level level, const char *id, const char *fmt, ...) {
  grove_log_fn fn = log_fn;
  if (!fn) return;
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  fn(log_user, level, id, msg);
}

char *grove__strdup(const char *s) {
  if (!s) return NULL;
  size_t n = strlen(s) + 1;
  char *d = malloc(n);
  if (d) memcpy(d, s, n);
  return d;
}

char *grove__asprintf(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  if (n < 0) return NULL;
  char *s = malloc((size_t)n + 1);
  if (!s) return NULL;
  va_start(ap, fmt);
  vsnprintf(s, (size_t)n + 1, fmt, ap);
  va_end(ap);
  return s;
}
