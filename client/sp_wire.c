/* sp_wire.c: NNG's SP wire codec (sp_wire.h). */
#include "sp_wire.h"

static uint64_t get64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++) v = v << 8 | p[i];
  return v;
}

static void put64(uint8_t *p, uint64_t v) {
  for (int i = 7; i >= 0; i--, v >>= 8) p[i] = (uint8_t)v;
}

void grove__sp_handshake(uint8_t *out, unsigned proto) {
  out[0] = 0;
  out[1] = 'S';
  out[2] = 'P';
  out[3] = 0;
  out[4] = (uint8_t)(proto >> 8);
  out[5] = (uint8_t)proto;
  out[6] = 0;
  out[7] = 0;
}

sp_hs grove__sp_handshake_check(const uint8_t *in, unsigned want, unsigned *got) {
  if (in[0] != 0 || in[1] != 'S' || in[2] != 'P' || in[3] != 0 || in[6] != 0 || in[7] != 0)
    return SP_HS_NOT_SP;
  *got = (unsigned)in[4] << 8 | in[5];
  return *got == want ? SP_HS_OK : SP_HS_PROTOCOL;
}

size_t grove__sp_head_put(uint8_t *head, bool ipc, uint64_t len) {
  size_t hl = 0;
  if (ipc) head[hl++] = 1;
  put64(head + hl, len);
  return hl + 8;
}

bool grove__sp_head_get(const uint8_t *p, bool ipc, uint64_t *len, unsigned *type) {
  *type = ipc ? p[0] : 1;
  *len = get64(p + (ipc ? 1 : 0));
  return *type == 1;
}

long grove__sp_backtrace_len(const uint8_t *p, size_t n, int max_hops) {
  size_t i = 0;
  for (int hops = 0;; hops++) {
    if (n - i < 4) return 0;
    if (hops >= max_hops) return -1;
    bool last = p[i] & 0x80;
    i += 4;
    if (last) return (long)i;
  }
}
