/* cli_connect.h: how the grove CLI's server commands reach groved
 * (client/cli_connect.c).  cli_remote.c, cli_hooks.c and cli_train.c call
 * down into it; it calls none of them (docs/architecture.md, "client/"). */
#ifndef GROVE_CLI_CONNECT_H
#define GROVE_CLI_CONNECT_H

#include <stddef.h>

#include "grove/client.h"

#ifdef __cplusplus
extern "C" {
#endif

/* groved's default data-plane URL (--server, $GROVE_SERVER). */
#define GROVE__CLI_DEFAULT_SERVER "tcp://127.0.0.1:7700"
/* At most this many URLs in one --server or --admin list. */
#define GROVE__CLI_MAX_URLS 16

/* The global --admin URL (groved's admin listener, where reload, export,
 * hook and train go; NULL: $GROVE_ADMIN, else GROVE_DEFAULT_ADMIN_URL) and
 * --token-file FILE (the admin token; NULL: $GROVE_ADMIN_TOKEN, else none).
 * The strings must stay valid while commands run (argv).  Main thread. */
void grove_cli_remote_set_admin(const char *url, const char *token_file);

/* Opens *out (the caller's, for grove_client_close) on server_url, as
 * grove_cli_remote takes it, with timeout_ms as its calls' default.
 * Returns 0, or the exit status after the message on stderr: 2 for a
 * --server without a URL, 3 when no server can be reached.  Main thread. */
int grove__cli_connect(const char *server_url, int timeout_ms, grove_client **out);
/* grove__cli_connect for an admin command (reload, export, hook, train): a
 * client of groved's admin listener (--admin, $GROVE_ADMIN, else the
 * default) with the admin token (--token-file, $GROVE_ADMIN_TOKEN).
 * server_url is not dialed.  Main thread. */
int grove__cli_connect_admin(const char *server_url, int timeout_ms, grove_client **out);
/* A client of the one admin listener at admin, with the token (reload's
 * loop over replicas).  0, or the exit status after the message. */
int grove__cli_connect_admin_url(const char *admin, int timeout_ms, grove_client **out);
/* The admin URLs an admin command acts on into urls (at most
 * GROVE__CLI_MAX_URLS; buf of bufn bytes holds them): those given, else the
 * default one.  With several --server URLs and no admin URL given, which
 * replica's admin listener is meant is unknown: refused (exit 1).  Returns
 * how many, or 0 after the message with *rc set. */
size_t grove__cli_admin_targets(const char *server_url, char *buf, size_t bufn, const char **urls,
                                int *rc);

/* Prints why a libgrove-client call failed with s and err ("grove:
 * [WHAT: ]STATUS: the server's reason", or the client's own reason) and
 * returns its exit status: 3 when the server could not be reached or never
 * answered, else 1 (it said no).  what may be NULL.  Main thread. */
int grove__cli_call_failed(grove_status s, const grove_err *err, const char *what);

#ifdef __cplusplus
}
#endif
#endif
