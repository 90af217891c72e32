/* status.h: Grove's one error enum and the caller-owned error buffer.
 *
 * Every fallible function in libgrove returns a grove_status (0 = GROVE_OK) and,
 * when it is handed a non-NULL grove_err, writes a sentence into it that names
 * what was wrong: the file, the key, the shape, the JSON path.  The buffer is
 * owned by the caller (or by the request that carries it); libgrove keeps no
 * error state of its own, so these functions are safe from any thread.
 *
 * Codes only grow: they reach the wire (the server copies them into replies)
 * and tests assert them exactly.  Never renumber.
 */
#ifndef GROVE_STATUS_H
#define GROVE_STATUS_H

#include <stdarg.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* X(NAME, value, message).  Grouped: generic, file formats, model, server. */
#define GROVE_STATUS_LIST(X)                                                    \
  X(OK, 0, "ok")                                                                \
  X(E_INVALID_ARGUMENT, 1, "invalid argument")                                  \
  X(E_NOT_FOUND, 2, "not found")                                                \
  X(E_ALREADY_EXISTS, 3, "already exists")                                      \
  X(E_NOMEM, 4, "out of memory")                                                \
  X(E_IO, 5, "input/output error")                                              \
  X(E_UNSUPPORTED, 6, "unsupported")                                            \
  X(E_INTERNAL, 7, "internal error")                                            \
  X(E_RANGE, 8, "value out of range")                                           \
  /* file formats */                                                            \
  X(E_FORMAT, 20, "malformed file")                                             \
  X(E_TRUNCATED, 21, "file is truncated")                                       \
  X(E_HEADER_TOO_LARGE, 22, "header is too large")                              \
  X(E_BAD_JSON, 23, "invalid JSON")                                             \
  X(E_BAD_OFFSETS, 24, "data offsets are invalid")                              \
  X(E_BAD_SIZE, 25, "byte size does not match dtype and shape")                 \
  X(E_DUPLICATE_KEY, 26, "duplicate key")                                       \
  X(E_BAD_DTYPE, 27, "unknown or unsupported dtype")                            \
  X(E_BAD_UTF8, 28, "invalid UTF-8")                                            \
  X(E_REFUSED, 29, "refused: the file asks for something never allowed")        \
  X(E_LIMIT, 30, "a size limit was exceeded")                                   \
  /* model */                                                                   \
  X(E_SPEC, 40, "invalid model spec")                                           \
  X(E_STATE_DICT, 41, "state_dict does not fit the module")                     \
  X(E_SHAPE, 42, "shape mismatch")                                              \
  X(E_DTYPE, 43, "wrong dtype")                                                 \
  X(E_KEY, 44, "invalid or conflicting name")                                   \
  X(E_NOT_CALLABLE, 45, "module has no forward")                                \
  /* server (used by groved and the client) */                                  \
  X(E_RESOURCE_EXHAUSTED, 60, "resource exhausted")                             \
  X(E_DEADLINE_EXCEEDED, 61, "deadline exceeded")                               \
  X(E_UNAVAILABLE, 62, "unavailable")                                           \
  X(E_CANCELLED, 63, "cancelled")                                               \
  X(E_FAILED_PRECONDITION, 64, "failed precondition")                         \
  /* the admin plane: an RPC on the wrong listener, a path outside the      \
   * allowed directories (65); a missing or wrong admin token (66) */         \
  X(E_PERMISSION_DENIED, 65, "permission denied")                             \
  X(E_UNAUTHENTICATED, 66, "unauthenticated")

typedef enum grove_status {
#define GROVE__STATUS_ENUM(name, value, msg) GROVE_##name = value,
  GROVE_STATUS_LIST(GROVE__STATUS_ENUM)
#undef GROVE__STATUS_ENUM
} grove_status;

/* "GROVE_E_TRUNCATED" for GROVE_E_TRUNCATED; "GROVE_E_UNKNOWN" for a value
 * outside the list.  Static strings; any thread. */
const char *grove_status_name(grove_status s);

/* The short English message of a code ("file is truncated").  Static string;
 * any thread. */
const char *grove_strerror(grove_status s);

#define GROVE_ERR_MSG_MAX 2048

/* Detail for the user.  Owned by the caller; zero-initialise it (or call
 * grove_err_clear).  msg is always NUL-terminated; a long message is cut and
 * ends in "...". */
typedef struct grove_err {
  grove_status code;
  char msg[GROVE_ERR_MSG_MAX];
} grove_err;

void grove_err_clear(grove_err *err);

/* Sets err (if not NULL) to code and the printf-formatted message and returns
 * code, so that callers can write `return grove_err_set(err, ...)`.  Any
 * thread. */
grove_status grove_err_set(grove_err *err, grove_status code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
grove_status grove_err_setv(grove_err *err, grove_status code, const char *fmt, va_list ap);

/* Puts "prefix: " in front of the message already in err (for example the
 * file name, once the caller knows it).  Returns err->code. */
grove_status grove_err_prefix(grove_err *err, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* The message of err, or the code's short message when err holds none. */
const char *grove_err_msg(const grove_err *err);

#ifdef __cplusplus
}
#endif
#endif
