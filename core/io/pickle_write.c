/* pickle_write.c: the protocol-2 pickle writer of Grove's torch.save files:
 * the state_dicts of export_plan.c (torch_save.c's format comment) and the
 * optimizer state_dicts of core/train/optim_io.c.  Each value is encoded as
 * Python's pickler encodes it at protocol 2 (the shortest integer opcode,
 * TUPLE1..3 for short tuples), using only opcodes that
 * torch.load(weights_only=True) accepts.  The reader is pickle.c. */
#include <stdlib.h>
#include <string.h>

#include "torch_internal.h"

void grove__pkw_put(grove__pkw *b, const void *data, size_t n) {
  if (b->oom) return;
  if (n > b->cap - b->n) {
    size_t cap = b->cap ? b->cap : 4096;
    while (cap - b->n < n) {
      if (cap > SIZE_MAX / 2) {
        b->oom = true;
        return;
      }
      cap *= 2;
    }
    uint8_t *p = realloc(b->p, cap);
    if (!p) {
      b->oom = true;
      return;
    }
    b->p = p;
    b->cap = cap;
  }
  memcpy(b->p + b->n, data, n);
  b->n += n;
}

void grove__pkw_op(grove__pkw *b, uint8_t o) {
  grove__pkw_put(b, &o, 1);
}

static void op_u32(grove__pkw *b, uint8_t o, uint32_t v) {
  uint8_t x[5] = {o, (uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
  grove__pkw_put(b, x, 5);
}

uint32_t grove__pkw_memo_put(grove__pkw *b) {
  uint32_t i = b->memo++;
  if (i < 256) {
    uint8_t x[2] = {'q', (uint8_t)i};
    grove__pkw_put(b, x, 2);
  } else {
    op_u32(b, 'r', i);
  }
  return i;
}

void grove__pkw_memo_get(grove__pkw *b, uint32_t i) {
  if (i < 256) {
    uint8_t x[2] = {'h', (uint8_t)i};
    grove__pkw_put(b, x, 2);
  } else {
    op_u32(b, 'j', i);
  }
}

void grove__pkw_str(grove__pkw *b, const char *s) {
  size_t n = strlen(s);
  op_u32(b, 'X', (uint32_t)n); /* the callers checked that lengths fit */
  grove__pkw_put(b, s, n);
}

void grove__pkw_int(grove__pkw *b, int64_t v) {
  if (v >= 0 && v < 256) {
    uint8_t x[2] = {'K', (uint8_t)v};
    grove__pkw_put(b, x, 2);
  } else if (v >= 0 && v < 65536) {
    uint8_t x[3] = {'M', (uint8_t)v, (uint8_t)(v >> 8)};
    grove__pkw_put(b, x, 3);
  } else if (v >= INT32_MIN && v <= INT32_MAX) {
    op_u32(b, 'J', (uint32_t)(int32_t)v);
  } else {
    /* LONG1: little-endian two's complement, as short as Python writes. */
    uint8_t x[10] = {0x8a, 8};
    uint64_t u = (uint64_t)v;
    for (int i = 0; i < 8; i++) x[2 + i] = (uint8_t)(u >> (8 * i));
    int n = 8;
    while (n > 1 && ((x[1 + n] == 0x00 && !(x[n] & 0x80)) || (x[1 + n] == 0xFF && (x[n] & 0x80))))
      n--;
    x[1] = (uint8_t)n;
    grove__pkw_put(b, x, 2 + (size_t)n);
  }
}

void grove__pkw_float(grove__pkw *b, double v) {
  /* BINFLOAT: a big-endian double. */
  uint64_t u;
  memcpy(&u, &v, sizeof u);
  uint8_t x[9] = {'G'};
  for (int i = 0; i < 8; i++) x[1 + i] = (uint8_t)(u >> (56 - 8 * i));
  grove__pkw_put(b, x, 9);
}

void grove__pkw_bool(grove__pkw *b, bool v) {
  grove__pkw_op(b, v ? 0x88 : 0x89); /* NEWTRUE, NEWFALSE */
}

void grove__pkw_int_tuple(grove__pkw *b, int n, const int64_t *v) {
  if (n == 0) {
    grove__pkw_op(b, ')');
    return;
  }
  if (n > 3) grove__pkw_op(b, '(');
  for (int i = 0; i < n; i++) grove__pkw_int(b, v[i]);
  grove__pkw_op(b, n == 1 ? 0x85 : n == 2 ? 0x86 : n == 3 ? 0x87 : 't');
}

void grove__pkw_global(grove__pkw *b, const char *module, const char *name) {
  grove__pkw_op(b, 'c');
  grove__pkw_put(b, module, strlen(module));
  grove__pkw_op(b, '\n');
  grove__pkw_put(b, name, strlen(name));
  grove__pkw_op(b, '\n');
}

void grove__pkw_fini(grove__pkw *b) {
  free(b->p);
  memset(b, 0, sizeof *b);
}
