/* cli_args.c: exit statuses, messages, options and option values of the
 * grove commands (cli_args.h; docs/cli.md). */
#include "cli_args.h"

#include <assert.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ============================================================ messages */

int grove__cli_fail(int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs("grove: ", stderr);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
  return code;
}

int grove__cli_usage(const char *cmd, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs(cmd ? "grove " : "grove", stderr);
  if (cmd) fputs(cmd, stderr);
  fputs(": ", stderr);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
  if (cmd)
    fprintf(stderr, "Try 'grove %s --help'.\n", cmd);
  else
    fputs("Try 'grove --help'.\n", stderr);
  return EXIT_USAGE;
}

/* ============================================================ options */

/* The entry of defs that argument a names, or -1; *value is set to a value
 * written into a ("--name=value", "-xvalue"), else NULL. */
static int find_opt(const grove__cli_opt *defs, const char *a, const char **value) {
  int found = -1;
  *value = NULL;
  if (a[1] == '-') {
    const char *name = a + 2, *eq = strchr(name, '=');
    size_t len = eq ? (size_t)(eq - name) : strlen(name);
    for (int d = 0; defs[d].name; d++)
      if (strlen(defs[d].name) == len && strncmp(defs[d].name, name, len) == 0) found = d;
    if (found >= 0 && eq) *value = eq + 1;
  } else {
    for (int d = 0; defs[d].name; d++)
      if (defs[d].short_name && defs[d].short_name == a[1]) found = d;
    if (found >= 0 && a[2]) *value = a + 2;
  }
  return found;
}

int grove__cli_parse(const char *cmd, int argc, char **argv, const grove__cli_opt *defs,
                     const char *help, grove__cli_args *p) {
  memset(p, 0, sizeof *p);
  int help_def = -1;
  for (int d = 0; defs[d].name; d++) {
    assert(d < GROVE__CLI_MAX_DEFS && "an option table longer than grove__cli_args holds");
    if (strcmp(defs[d].name, "help") == 0) help_def = d;
  }
  bool only_pos = false;
  for (int i = 0; i < argc; i++) {
    const char *a = argv[i];
    if (only_pos || a[0] != '-' || a[1] == '\0') {
      if (p->npos == GROVE__CLI_MAX_ARGS) return grove__cli_usage(cmd, "too many arguments");
      p->pos[p->npos++] = a;
      continue;
    }
    if (strcmp(a, "--") == 0) {
      only_pos = true;
      continue;
    }
    const char *value;
    int d = find_opt(defs, a, &value);
    if (d < 0) return grove__cli_usage(cmd, "unknown option '%s'", a);
    const grove__cli_opt *o = &defs[d];
    bool takes_value = o->flags & GROVE__CLI_VALUE;
    /* "-hx" is not -h with a value but an option grove does not have. */
    if (!takes_value && value && a[1] != '-')
      return grove__cli_usage(cmd, "unknown option '%s'", a);
    if ((o->flags & GROVE__CLI_ONCE) && p->count[d])
      return grove__cli_usage(cmd, "option '--%s' given twice", o->name);
    if (!takes_value) {
      if (value) return grove__cli_usage(cmd, "option '--%s' takes no value", o->name);
      value = "";
    } else if (!value) {
      if (i + 1 == argc) return grove__cli_usage(cmd, "option '%s' needs a value", a);
      value = argv[++i];
    }
    if (p->nopts == GROVE__CLI_MAX_ARGS) return grove__cli_usage(cmd, "too many options");
    p->opts[p->nopts].def = d;
    p->opts[p->nopts++].value = value;
    p->val[d] = value;
    p->count[d]++;
  }
  if (help_def >= 0 && p->val[help_def]) {
    fputs(help, stdout);
    return EXIT_OK;
  }
  return -1;
}

const char *grove__cli_value(const grove__cli_args *p, int def, bool *twice) {
  if (p->count[def] > 1) *twice = true;
  return p->val[def];
}

size_t grove__cli_values(const grove__cli_args *p, int def, const char **out) {
  size_t n = 0;
  for (int i = 0; i < p->nopts; i++)
    if (p->opts[i].def == def) out[n++] = p->opts[i].value;
  return n;
}

int grove__cli_outputs(const char *cmd, const grove__cli_args *p, int def, const char **out,
                       size_t *n) {
  *n = grove__cli_values(p, def, out);
  for (size_t i = 0; i < *n; i++)
    for (size_t j = 0; j < i; j++)
      if (strcmp(out[i], out[j]) == 0) return grove__cli_usage(cmd, "-o %s given twice", out[i]);
  return 0;
}

/* ============================================================ values */

bool grove__cli_int(const char *s, long long lo, long long hi, long long *out) {
  if (!s || !*s) return false;
  errno = 0;
  char *end;
  long long v = strtoll(s, &end, 10);
  if (errno || *end || v < lo || v > hi) return false;
  *out = v;
  return true;
}

bool grove__cli_u64(const char *s, unsigned long long lo, unsigned long long hi,
                    unsigned long long *out) {
  if (!s || !*s || *s == '-') return false;
  errno = 0;
  char *end;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno || *end || v < lo || v > hi) return false;
  *out = v;
  return true;
}

bool grove__cli_double(const char *s, double *out) {
  if (!s || !*s) return false;
  errno = 0;
  char *end;
  double v = strtod(s, &end);
  if (errno || *end || !isfinite(v)) return false;
  *out = v;
  return true;
}

bool grove__cli_seconds(const char *s, double *out) {
  double v;
  if (!grove__cli_double(s, &v) || v <= 0 || v > 86400.0) return false;
  *out = v;
  return true;
}

/* ============================================================ time */

double grove__cli_now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}
