/* cli_remote.h: the grove CLI's server commands (client/cli_remote.c).
 *
 *   grove [--server URL] status
 *   grove [--server URL] predict MODEL INPUT.npy... [-o OUTPUT.npy]... [--timeout-ms N]
 *   grove [--server URL] bench MODEL --concurrency C --batch B [--seconds S]
 *   grove [--server URL] reload MODEL [CHECKPOINT] [--non-strict] [--model-dir DIR] [--in-place]
 *   grove [--server URL] export MODEL -o FILE.safetensors|FILE.pt [--force] [--prefix P]
 *
 * client/grove.c parses the global options and calls grove_cli_remote for a
 * command before its own local ones.  The other server-command files
 * (cli_hooks.c, cli_train.c) connect and report failed calls with the
 * grove__cli_ functions at the end. */
#ifndef GROVE_CLI_REMOTE_H
#define GROVE_CLI_REMOTE_H

#include "grove/client.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Runs the server command cmd with its arguments (argv[0] is the first
 * argument after cmd, as grove.c's commands get them; argc may be 0).
 * server_url is --server's value: one URL or several separated by commas;
 * NULL means $GROVE_SERVER, else tcp://127.0.0.1:7700.
 *
 * Returns the exit status (0 ok, 1 the server said no, 2 usage, 3 cannot
 * reach the server), or -1 when cmd is not a server command, including
 * `predict --local` and `bench --local`, which grove.c runs itself. */
int grove_cli_remote(const char *server_url, const char *cmd, int argc, char **argv);

/* Lines for the main help text, one per server command, each starting with
 * two spaces and ending in a newline. */
extern const char grove_cli_remote_usage[];

/* The global --pub URL (groved's telemetry PUB socket) for `grove watch`;
 * NULL means $GROVE_PUB, else tcp://127.0.0.1:7702.  The string must stay
 * valid while commands run (argv).  Defined in cli_hooks.c. */
void grove_cli_remote_set_pub(const char *url);

/* The global --admin URL (groved's admin listener, where reload, export,
 * hook and train go; NULL: $GROVE_ADMIN, else GROVE_DEFAULT_ADMIN_URL) and
 * --token-file FILE (the admin token; NULL: $GROVE_ADMIN_TOKEN, else none).
 * The strings must stay valid while commands run (argv). */
void grove_cli_remote_set_admin(const char *url, const char *token_file);

/* ============================================================ for cli_*.c */

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

/* Prints why a libgrove-client call failed with s and err ("grove:
 * [WHAT: ]STATUS: the server's reason", or the client's own reason) and
 * returns its exit status: 3 when the server could not be reached or never
 * answered, else 1 (it said no).  what may be NULL.  Main thread. */
int grove__cli_call_failed(grove_status s, const grove_err *err, const char *what);

#ifdef __cplusplus
}
#endif
#endif
