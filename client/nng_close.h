/* nng_close.h: a close of an NNG socket that cannot hang its caller.
 *
 * NNG 1.5.2's nng_close can deadlock while peers are connected
 * (nanomsg/nng#1543; seen as a drained groved that never exited and as a
 * client stuck in grove_client_close).  groved (server/rpc.c,
 * grove__nng_close_or_exit) and libgrove-client (client.c, watch.c) close
 * their sockets through this one function.  Not installed. */
#ifndef GROVE_NNG_CLOSE_H
#define GROVE_NNG_CLOSE_H

#include <stdbool.h>

#include <nng/nng.h>

/* Closes s on a thread of its own and waits up to wait_ms for it.  true: s
 * is closed (or the close ran here, unbounded, when no thread could be
 * started).  false: the close is stuck; the thread goes on trying, and
 * whatever NNG may still call back (pipe notifications, aio callbacks of
 * s's contexts) must stay valid: the caller keeps it (leaks it) or ends
 * the process.  Any thread; the caller owns s and never uses it again. */
bool grove__nng_close_bounded(nng_socket s, int wait_ms);

#endif
