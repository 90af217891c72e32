/* cli_hooks.h: the grove CLI's forward-hook telemetry commands
 * (client/cli_hooks.c; docs/telemetry.md):
 *
 *   grove [--server URL] hook add MODEL PATTERN [--stats LIST] [--every N]
 *                                 [--sample RATE] [--kind forward|forward_pre]
 *   grove [--server URL] hook ls [MODEL] [--json]
 *   grove [--server URL] hook rm ID
 *   grove [--pub URL] watch [MODEL[:PATTERN]] [--count N] [--seconds S] [--json]
 *
 * grove_cli_remote (cli_remote.c) calls these for "hook" and "watch". */
#ifndef GROVE_CLI_HOOKS_H
#define GROVE_CLI_HOOKS_H

/* Each returns the exit status (0 ok, 1 the server said no, 2 usage, 3
 * cannot reach the server).  argv[0] is the first argument after the
 * command.  server_url as grove_cli_remote takes it. */
int grove__cli_hook(const char *server_url, int argc, char **argv);
int grove__cli_watch(int argc, char **argv);

#endif
