/* cli_args.h: the conventions every grove command follows (docs/cli.md), in
 * one place for client/grove.c, cli_remote.c, cli_hooks.c and cli_train.c:
 *
 *   - the exit statuses;
 *   - "grove: <reason>" for a refusal, "grove CMD: <what>" and "Try 'grove
 *     CMD --help'." for a usage error;
 *   - options anywhere after the command as `--name value`, `--name=value`,
 *     `-x value` or `-xvalue`, `--` ending them, and the checks of their
 *     values (integers, numbers, seconds);
 *   - the monotonic clock the commands measure with.
 *
 * Everything here runs on the CLI's main thread; the parser keeps pointers
 * into argv and into the option tables, and owns nothing. */
#ifndef GROVE_CLI_ARGS_H
#define GROVE_CLI_ARGS_H

#include <stdbool.h>
#include <stddef.h>

/* The exit statuses of every grove command (docs/cli.md, "Exit status"). */
enum { EXIT_OK = 0, EXIT_REFUSED = 1, EXIT_USAGE = 2, EXIT_UNREACHABLE = 3 };

/* ============================================================ messages */

/* Prints "grove: <message>" and a newline on stderr; returns code, for
 * `return grove__cli_fail(EXIT_REFUSED, ...)`. */
int grove__cli_fail(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Prints "grove CMD: <message>" and "Try 'grove CMD --help'." on stderr
 * (cmd NULL: the global options, "grove: ..." and "Try 'grove --help'.");
 * returns EXIT_USAGE. */
int grove__cli_usage(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ============================================================ options */

#define GROVE__CLI_MAX_ARGS 64 /* positional arguments, and options, per command */
#define GROVE__CLI_MAX_DEFS 32 /* entries of one option table */

/* grove__cli_opt.flags */
enum {
  GROVE__CLI_VALUE = 1, /* takes a value */
  /* Given twice, a usage error at once ("option '--NAME' given twice").
   * Without it every occurrence is kept and the command decides (one value
   * wanted: grove__cli_value says it came twice; -o: each is a file). */
  GROVE__CLI_ONCE = 2,
  GROVE__CLI_VALUE_ONCE = GROVE__CLI_VALUE | GROVE__CLI_ONCE,
};

/* One entry of a command's option table; a table ends with {NULL}. */
typedef struct grove__cli_opt {
  const char *name; /* the long name, without "--" */
  char short_name;  /* 0 for none */
  int flags;        /* GROVE__CLI_VALUE, GROVE__CLI_ONCE */
} grove__cli_opt;

/* What grove__cli_parse found.  Options are referred to by their index in
 * the table (commands declare the tables with designated initializers from
 * an enum).  Every pointer points into argv (or is ""), which the caller
 * keeps. */
typedef struct grove__cli_args {
  int npos;
  const char *pos[GROVE__CLI_MAX_ARGS];
  int nopts;
  struct {
    int def;
    const char *value;                  /* "" for an option without a value */
  } opts[GROVE__CLI_MAX_ARGS];          /* every option, in the order given */
  const char *val[GROVE__CLI_MAX_DEFS]; /* per entry: its last value; NULL when absent */
  int count[GROVE__CLI_MAX_DEFS];       /* per entry: how many times it came */
} grove__cli_args;

/* Parses argv[0..argc) of command cmd (argv[0] is the first argument after
 * the command's name) against defs into *p.  When defs has an entry named
 * "help" and it was given, prints help on stdout.
 *
 * Returns -1 when the command is to run with *p; otherwise the exit status
 * to return at once: EXIT_OK after the help, EXIT_USAGE after the message
 * (unknown option, missing value, value for a flag, a GROVE__CLI_ONCE
 * option twice, too many arguments). */
int grove__cli_parse(const char *cmd, int argc, char **argv, const grove__cli_opt *defs,
                     const char *help, grove__cli_args *p);

/* The last value of entry def, or NULL when absent; sets *twice (never
 * clears it) when the option came more than once, so that a command can
 * ask for several and check once. */
const char *grove__cli_value(const grove__cli_args *p, int def, bool *twice);

/* Every value of entry def in the order given into out (room for
 * GROVE__CLI_MAX_ARGS); returns how many. */
size_t grove__cli_values(const grove__cli_args *p, int def, const char **out);

/* The output files of predict (-o, repeatable) into out as
 * grove__cli_values does, refusing a file named twice ("-o FILE given
 * twice").  Returns 0, or EXIT_USAGE after the message. */
int grove__cli_outputs(const char *cmd, const grove__cli_args *p, int def, const char **out,
                       size_t *n);

/* ============================================================ values */

/* s as a decimal integer in [lo, hi] into *out; false (and *out untouched)
 * for anything else, NULL and "" included. */
bool grove__cli_int(const char *s, long long lo, long long hi, long long *out);

/* The same unsigned: a leading '-' is refused rather than wrapped. */
bool grove__cli_u64(const char *s, unsigned long long lo, unsigned long long hi,
                    unsigned long long *out);

/* s as a finite number into *out; false (and *out untouched) otherwise. */
bool grove__cli_double(const char *s, double *out);

/* --seconds of bench: a number in (0, 86400]. */
bool grove__cli_seconds(const char *s, double *out);

/* ============================================================ time */

/* Seconds on CLOCK_MONOTONIC (any thread: bench's completions call it on
 * NNG's threads). */
double grove__cli_now_s(void);

#endif
