/* cli_train.h: the grove CLI's training commands (client/cli_train.c;
 * docs/training.md, "On the server"):
 *
 *   grove [--server URL] train start MODEL --optimizer SGD|Adam|AdamW --loss NAME [...]
 *   grove [--server URL] train step MODEL INPUT.npy... --target T.npy [--steps N]
 *   grove [--server URL] train eval MODEL INPUT.npy... [--target T.npy] [-o OUT.npy]
 *   grove [--server URL] train promote MODEL [--path FILE] [--in-place]
 *   grove [--server URL] train stop MODEL [--save-optimizer FILE]
 *
 * grove_cli_remote (cli_remote.c) calls this for "train". */
#ifndef GROVE_CLI_TRAIN_H
#define GROVE_CLI_TRAIN_H

/* The exit status (0 ok, 1 the server said no, 2 usage, 3 cannot reach the
 * server).  argv[0] is the first argument after "train"; server_url as
 * grove_cli_remote takes it. */
int grove__cli_train(const char *server_url, int argc, char **argv);

#endif
