/* slog.c: groved's log lines.  One event, one line on stderr:
 *
 *   2026-11-29T14:03:07.123Z info server.listen: listening on tcp://127.0.0.1:7700
 *
 * UTC timestamp with milliseconds, the level as grove_log_level_name spells
 * it, a stable message id (docs/operations.md lists them) and the text.  A
 * line is formatted into a buffer and written with one write(2), so lines
 * from different threads never interleave.  libgrove's own events come
 * through grove__slog_core in the same shape. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "server.h"

static grove_log_level threshold = GROVE_LOG_INFO;

void grove__slog_init(grove_log_level t) {
  threshold = t;
}

int64_t grove__now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void emit(grove_log_level level, const char *id, const char *msg) {
  if (level < threshold) return;
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  struct tm tm;
  gmtime_r(&ts.tv_sec, &tm);
  char line[4096];
  int n =
      snprintf(line, sizeof line, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %s %s: ", tm.tm_year + 1900,
               tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000,
               grove_log_level_name(level), id);
  if (n < 0) return;
  size_t len = (size_t)n < sizeof line ? (size_t)n : sizeof line - 1;
  /* A message never spans lines: newlines inside it become spaces. */
  for (const char *p = msg; *p && len < sizeof line - 2; p++)
    line[len++] = (*p == '\n' || *p == '\r') ? ' ' : *p;
  line[len++] = '\n';
  ssize_t off = 0;
  while (off < (ssize_t)len) {
    ssize_t w = write(STDERR_FILENO, line + off, len - (size_t)off);
    if (w <= 0) break;
    off += w;
  }
}

void grove__slog(grove_log_level level, const char *id, const char *fmt, ...) {
  if (level < threshold) return;
  char msg[3072];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  emit(level, id, msg);
}

void grove__slog_core(void *user, grove_log_level level, const char *id, const char *msg) {
  (void)user;
  emit(level, id, msg);
}
