/* cli_connect.c: how the grove CLI's server commands reach groved.
 *
 * cli_remote.c, cli_hooks.c and cli_train.c all call down into this file
 * (never into each other, but for cli_remote.c dispatching a command to the
 * file that runs it): --server/$GROVE_SERVER for the data plane,
 * --admin/$GROVE_ADMIN and --token-file/$GROVE_ADMIN_TOKEN for the admin
 * plane, and the message and exit status of a call that failed. */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_args.h"
#include "cli_connect.h"
#include "grove/client.h"
#include "grove/grove.h"

#define DEFAULT_SERVER GROVE__CLI_DEFAULT_SERVER
#define MAX_URLS 16

/* ============================================================ messages */

int grove__cli_call_failed(grove_status s, const grove_err *err, const char *what) {
  bool local = grove_client_failed_locally(s, err);
  int code = local && (s == GROVE_E_UNAVAILABLE || s == GROVE_E_DEADLINE_EXCEEDED)
                 ? EXIT_UNREACHABLE
                 : EXIT_REFUSED;
  if (local) return grove__cli_fail(code, "%s", grove_err_msg(err) + strlen("grove client: "));
  return grove__cli_fail(code, "%s%s%s: %s", what ? what : "", what ? ": " : "",
                         grove_status_name(s), grove_err_msg(err));
}

/* ============================================================ connecting */

/* The URLs of flag (else $env, else dflt; NULL: none), split at commas
 * into buf; returns how many (at most MAX_URLS). */
static size_t split_urls(const char *flag, const char *env, const char *dflt, char *buf,
                         size_t bufn, const char **urls) {
  const char *spec = flag;
  if (!spec || !*spec) spec = getenv(env);
  if (!spec || !*spec) spec = dflt;
  if (!spec) return 0;
  snprintf(buf, bufn, "%s", spec);
  size_t n = 0;
  for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok && n < MAX_URLS;
       tok = strtok_r(NULL, ",", &save))
    if (*tok) urls[n++] = tok;
  return n;
}

/* The URLs of --server (else $GROVE_SERVER, else the default). */
static size_t server_urls(const char *server_url, char *buf, size_t bufn, const char **urls) {
  return split_urls(server_url, "GROVE_SERVER", DEFAULT_SERVER, buf, bufn, urls);
}

int grove__cli_connect(const char *server_url, int timeout_ms, grove_client **out) {
  char buf[2048];
  const char *urls[MAX_URLS];
  size_t n = server_urls(server_url, buf, sizeof buf, urls);
  if (n == 0) return grove__cli_fail(EXIT_USAGE, "--server: no URL given");
  grove_client_opts o = {.default_timeout_ms = timeout_ms};
  grove_err err = {0};
  grove_status s = grove_client_open(urls, n, &o, out, &err);
  if (s) return grove__cli_call_failed(s, &err, NULL);
  return 0;
}

static const char *admin_url_flag, *token_file_flag;

void grove_cli_remote_set_admin(const char *url, const char *token_file) {
  if (url) admin_url_flag = url;
  if (token_file) token_file_flag = token_file;
}

/* The token in --token-file FILE (its first line) into buf; 0, or the exit
 * status after the message (the token itself is never printed). */
static int read_token_file(const char *file, char *buf, size_t n) {
  FILE *f = fopen(file, "r");
  if (!f) return grove__cli_fail(EXIT_USAGE, "--token-file %s: %s", file, strerror(errno));
  size_t len = fread(buf, 1, n - 1, f);
  bool more = len == n - 1 && fgetc(f) != EOF;
  fclose(f);
  buf[len] = '\0';
  /* groved reads its --admin-token-file the same way: one line, without
   * trailing whitespace. */
  size_t end = strcspn(buf, "\r\n");
  while (end && (buf[end - 1] == ' ' || buf[end - 1] == '\t')) end--;
  buf[end] = '\0';
  if (more)
    return grove__cli_fail(EXIT_USAGE, "--token-file %s: longer than %zu bytes", file, n - 2);
  if (!buf[0]) return grove__cli_fail(EXIT_USAGE, "--token-file %s is empty", file);
  return 0;
}

/* The URLs of --admin (else $GROVE_ADMIN), split at commas into buf;
 * returns how many (0: none given, the default applies). */
static size_t given_admin_urls(char *buf, size_t bufn, const char **urls) {
  return split_urls(admin_url_flag, "GROVE_ADMIN", NULL, buf, bufn, urls);
}

/* A client of the admin listener at admin, with the token. */
int grove__cli_connect_admin_url(const char *admin, int timeout_ms, grove_client **out) {
  char token[4096];
  if (token_file_flag) {
    int rc = read_token_file(token_file_flag, token, sizeof token);
    if (rc) return rc;
  }
  grove_client_opts o = {.default_timeout_ms = timeout_ms,
                         .admin_url = admin,
                         .admin_token = token_file_flag ? token : NULL};
  const char *urls[] = {admin};
  grove_err err = {0};
  grove_status s = grove_client_open(urls, 1, &o, out, &err);
  explicit_bzero(token, sizeof token);
  if (s) {
    /* Say where admin commands go: the usual surprise is a groved on
     * another port or machine. */
    return grove__cli_fail(EXIT_UNREACHABLE,
                           "%s (admin commands go to groved's admin listener: grove --admin URL "
                           "or $GROVE_ADMIN; groved --admin-listen)",
                           grove_err_msg(&err) + strlen("grove client: "));
  }
  return 0;
}

/* The admin URLs an admin command acts on into urls (buf holds them): those
 * given, else the default one.  With several --server URLs and no admin URL
 * given, which replica's admin listener is meant is unknown: refused (exit
 * 1).  Returns how many, or 0 after the message with *rc set. */
size_t grove__cli_admin_targets(const char *server_url, char *buf, size_t bufn, const char **urls,
                                int *rc) {
  size_t n = given_admin_urls(buf, bufn, urls);
  if (n) return n;
  char sbuf[2048];
  const char *surls[MAX_URLS];
  size_t ns = server_urls(server_url, sbuf, sizeof sbuf, surls);
  if (ns > 1) {
    *rc = grove__cli_fail(EXIT_REFUSED,
                          "admin commands act on one replica at its admin listener, and --server "
                          "names %zu; give their admin URLs with --admin URL[,URL...] (or "
                          "$GROVE_ADMIN)",
                          ns);
    return 0;
  }
  urls[0] = GROVE_DEFAULT_ADMIN_URL;
  return 1;
}

int grove__cli_connect_admin(const char *server_url, int timeout_ms, grove_client **out) {
  char buf[2048];
  const char *urls[MAX_URLS];
  int rc = 0;
  size_t n = grove__cli_admin_targets(server_url, buf, sizeof buf, urls, &rc);
  if (!n) return rc;
  if (n > 1)
    return grove__cli_fail(EXIT_REFUSED,
                           "this command acts on one replica; --admin names %zu: give one", n);
  return grove__cli_connect_admin_url(urls[0], timeout_ms, out);
}
