/* cli_remote.h: the grove CLI's server commands (client/cli_remote.c).
 *
 *   grove [--server URL] status
 *   grove [--server URL] predict MODEL INPUT.npy... [-o OUTPUT.npy]... [--timeout-ms N]
 *   grove [--server URL] bench MODEL --concurrency C --batch B [--seconds S]
 *   grove [--server URL] reload MODEL [CHECKPOINT] [--non-strict] [--model-dir DIR] [--in-place]
 *   grove [--server URL] export MODEL -o FILE.safetensors|FILE.pt [--force] [--prefix P]
 *
 * client/grove.c parses the global options and calls grove_cli_remote for a
 * command before its own local ones, and cli_remote.c hands the hook,
 * watch and train commands to cli_hooks.c and cli_train.c.  All three
 * connect and report failed calls through cli_connect.h. */
#ifndef GROVE_CLI_REMOTE_H
#define GROVE_CLI_REMOTE_H

#include "cli_connect.h" /* grove_cli_remote_set_admin, for grove.c */
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

#ifdef __cplusplus
}
#endif
#endif
