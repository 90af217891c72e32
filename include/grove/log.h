/* log.h: the one way libgrove reports events.  core/ never prints: it calls the
 * callback installed here, and does nothing when none is installed.  Programs
 * (groved, grove) install a callback that writes one line per event. */
#ifndef GROVE_LOG_H
#define GROVE_LOG_H

#ifdef __cplusplus
extern "C" {
#endif

typedef enum grove_log_level {
  GROVE_LOG_DEBUG = 0,
  GROVE_LOG_INFO = 1,
  GROVE_LOG_WARN = 2,
  GROVE_LOG_ERROR = 3,
} grove_log_level;

/* id is a stable message id ("spec.softmax_implicit_dim"), msg the text.  Both
 * are valid only during the call.  The callback may be called from any thread
 * that calls into libgrove, concurrently: it must be thread-safe. */
typedef void (*grove_log_fn)(void *user, grove_log_level level, const char *id, const char *msg);

/* Installs (or with fn == NULL removes) the process-wide log callback.  Call
 * it before other threads use libgrove. */
void grove_set_log(grove_log_fn fn, void *user);

const char *grove_log_level_name(grove_log_level level);

#ifdef __cplusplus
}
#endif
#endif
