/* sp_wire.h: NNG's SP wire, the one codec groved's loop listener
 * (server/sp.c) and libgrove-client's SP transport (client/client_sp.c)
 * both speak.  Checked against NNG's src/sp/transport/tcp/tcp.c,
 * ipc/ipc.c and src/sp/protocol/reqrep0/{req,rep}.c:
 *   - both sides first send 8 bytes: 0x00 'S' 'P' 0x00, the sender's
 *     protocol id (16 bits, big-endian: req0 0x30, rep0 0x31), two zero
 *     bytes;
 *   - then messages, each a 64-bit big-endian length and that many bytes
 *     (IPC puts a message type, 1, before the length);
 *   - a request begins with its backtrace, 32-bit big-endian words up to
 *     and including the first with the high bit set (the request id; a
 *     device between adds its own words first); the reply carries the same
 *     words back.
 * Pure functions on bytes: no I/O, no allocation, no state; any thread.
 * A leaf: it calls nothing of server/ or client/, and both link it (as
 * they do nng_close.c).  Not installed. */
#ifndef GROVE_SP_WIRE_H
#define GROVE_SP_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SP_PROTO_REQ0 0x30
#define SP_PROTO_REP0 0x31
#define SP_HANDSHAKE_LEN 8
#define SP_HEAD_MAX 9 /* IPC's type byte and the 64-bit length */
#define SP_MAX_HOPS 8 /* rep0's default TTL: backtrace words at most */

/* What a peer's 8 handshake bytes say. */
typedef enum sp_hs { SP_HS_OK, SP_HS_NOT_SP, SP_HS_PROTOCOL } sp_hs;

/* Our handshake for protocol proto into out[0..8). */
void grove__sp_handshake(uint8_t *out, unsigned proto);
/* A peer's handshake in[0..8): SP_HS_OK when it is SP with protocol want;
 * *got is the peer's protocol whenever it is SP at all. */
sp_hs grove__sp_handshake_check(const uint8_t *in, unsigned want, unsigned *got);

/* The bytes of a message's head on this transport: 9 (IPC), 8 (TCP). */
static inline size_t grove__sp_head_len(bool ipc) {
  return ipc ? 9 : 8;
}
/* Writes the head of a message of len bytes into head (SP_HEAD_MAX);
 * returns its length. */
size_t grove__sp_head_put(uint8_t *head, bool ipc, uint64_t len);
/* Reads the head at p (grove__sp_head_len bytes) into *len; false when
 * IPC's message type is not 1 (*type says which it was). */
bool grove__sp_head_get(const uint8_t *p, bool ipc, uint64_t *len, unsigned *type);

/* The backtrace at the front of a message p[0..n): its length in bytes
 * (> 0, the request id its last 4) when whole within max_hops words;
 * 0 when the message ends before its request id; -1 when it holds more
 * than max_hops words before one. */
long grove__sp_backtrace_len(const uint8_t *p, size_t n, int max_hops);

static inline uint32_t grove__sp_get32(const uint8_t *p) {
  return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}
static inline void grove__sp_put32(uint8_t *p, uint32_t v) {
  p[0] = (uint8_t)(v >> 24);
  p[1] = (uint8_t)(v >> 16);
  p[2] = (uint8_t)(v >> 8);
  p[3] = (uint8_t)v;
}

#endif
