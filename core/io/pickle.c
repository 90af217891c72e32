/* pickle.c: a restricted unpickler that builds a tree of plain values.
 *
 * It runs the opcodes of torch's weights_only unpickler
 * (torch/_weights_only_unpickler.py) plus the cheap ones of protocols 3-4
 * (bytes, short and 8-byte strings, FRAME, MEMOIZE, STACK_GLOBAL, BINFLOAT),
 * and nothing else: every other opcode is refused by name.  It never
 * imports or calls anything:
 *
 *   GLOBAL / STACK_GLOBAL  look the name up in an allow-list and push a data
 *                          tag; a name outside the list is GROVE_E_REFUSED.
 *   REDUCE / NEWOBJ        push a CALL value "tag(args)" that torch_load.c
 *                          interprets later, except the three that build
 *                          containers the pickle goes on to fill or that are
 *                          plain data: OrderedDict() (a DICT), torch.Size(t)
 *                          (a TUPLE), set(list) (a SET) and
 *                          _codecs.encode(s, 'latin1') (BYTES).
 *                          NEWOBJ is only allowed on torch.nn.Parameter, as
 *                          in torch.
 *   BUILD                  records the state on an OrderedDict (its
 *                          attributes: a state_dict's _metadata) or a
 *                          tensor-building CALL (a tensor's attributes); on
 *                          anything else it is refused, as in torch.
 *   BINPERSID              pushes a PERSID value: torch_load.c resolves it
 *                          to a storage record.
 *
 * Values live in slabs owned by one grove__pickle and are freed together;
 * the memo and the stack hold borrowed pointers, so a value reached twice
 * is one value (as in Python), and a cycle built through the memo costs
 * nothing to free.  Every size is bounded (torch_internal.h: GROVE_PKL_*),
 * and memory stays proportional to the input.
 */
#include <assert.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fileio.h"
#include "torch_internal.h"

/* ================================================================ allow-list */

typedef struct allowed {
  const char *name;
  grove__pk_tag tag;
  int dtype;        /* STORAGE / DTYPE: a grove_dtype, or -1 when Grove lacks it */
  const char *what; /* REBUILD_UNSUPPORTED: how to say it in a message */
} allowed;

#define NO_DTYPE (-1)

/* The globals of torch.load(weights_only=True) that a state_dict can hold.
 * torch's list has a few more (complex, bytearray, Counter, the legacy tensor
 * classes): Grove does not need them. */
static const allowed allow_list[] = {
    {"collections.OrderedDict", GROVE__TAG_ORDERED_DICT, 0, NULL},
    {"torch._utils._rebuild_tensor", GROVE__TAG_REBUILD_TENSOR, 0, NULL},
    {"torch._utils._rebuild_tensor_v2", GROVE__TAG_REBUILD_TENSOR_V2, 0, NULL},
    {"torch._utils._rebuild_tensor_v3", GROVE__TAG_REBUILD_TENSOR_V3, 0, NULL},
    {"torch._utils._rebuild_parameter", GROVE__TAG_REBUILD_PARAMETER, 0, NULL},
    {"torch._utils._rebuild_parameter_with_state", GROVE__TAG_REBUILD_PARAMETER_WITH_STATE, 0,
     NULL},
    {"torch._tensor._rebuild_from_type_v2", GROVE__TAG_REBUILD_FROM_TYPE_V2, 0, NULL},
    {"torch._utils._rebuild_qtensor", GROVE__TAG_REBUILD_UNSUPPORTED, 0,
     "a quantized tensor (save t.dequantize() instead)"},
    {"torch._utils._rebuild_sparse_tensor", GROVE__TAG_REBUILD_UNSUPPORTED, 0,
     "a sparse tensor (save t.to_dense() instead)"},
    {"torch._utils._rebuild_sparse_csr_tensor", GROVE__TAG_REBUILD_UNSUPPORTED, 0,
     "a sparse tensor (save t.to_dense() instead)"},
    {"torch._utils._rebuild_meta_tensor_no_storage", GROVE__TAG_REBUILD_UNSUPPORTED, 0,
     "a meta tensor, which has no data (materialize it before saving)"},
    {"torch._utils._rebuild_wrapper_subclass", GROVE__TAG_REBUILD_UNSUPPORTED, 0,
     "a tensor subclass (save a plain tensor instead)"},
    {"torch._utils._rebuild_device_tensor_from_numpy", GROVE__TAG_REBUILD_UNSUPPORTED, 0,
     "a device tensor saved through NumPy (save t.cpu() instead)"},
    {"torch._utils._rebuild_device_tensor_from_cpu_tensor", GROVE__TAG_REBUILD_UNSUPPORTED, 0,
     "a device tensor saved without storage (save t.cpu() instead)"},
    {"torch.nn.parameter.Parameter", GROVE__TAG_PARAMETER, 0, NULL},
    {"torch.Tensor", GROVE__TAG_TENSOR, 0, NULL},
    {"torch.Size", GROVE__TAG_SIZE, 0, NULL},
    {"torch.device", GROVE__TAG_DEVICE, 0, NULL},
    {"torch.serialization._get_layout", GROVE__TAG_GET_LAYOUT, 0, NULL},
    {"_codecs.encode", GROVE__TAG_CODECS_ENCODE, 0, NULL},
    {"builtins.set", GROVE__TAG_SET, 0, NULL},
    {"__builtin__.set", GROVE__TAG_SET, 0, NULL}, /* protocol 2's name for it */
    /* Storage classes (the legacy typed ones are what torch.save pickles). */
    {"torch.FloatStorage", GROVE__TAG_STORAGE, GROVE_F32, NULL},
    {"torch.HalfStorage", GROVE__TAG_STORAGE, GROVE_F16, NULL},
    {"torch.BFloat16Storage", GROVE__TAG_STORAGE, GROVE_BF16, NULL},
    {"torch.DoubleStorage", GROVE__TAG_STORAGE, GROVE_F64, NULL},
    {"torch.LongStorage", GROVE__TAG_STORAGE, GROVE_I64, NULL},
    {"torch.IntStorage", GROVE__TAG_STORAGE, GROVE_I32, NULL},
    {"torch.ShortStorage", GROVE__TAG_STORAGE, GROVE_I16, NULL},
    {"torch.CharStorage", GROVE__TAG_STORAGE, GROVE_I8, NULL},
    {"torch.ByteStorage", GROVE__TAG_STORAGE, GROVE_U8, NULL},
    {"torch.BoolStorage", GROVE__TAG_STORAGE, GROVE_BOOL, NULL},
    {"torch.ComplexFloatStorage", GROVE__TAG_STORAGE, NO_DTYPE, NULL},
    {"torch.ComplexDoubleStorage", GROVE__TAG_STORAGE, NO_DTYPE, NULL},
    {"torch.QInt8Storage", GROVE__TAG_STORAGE, NO_DTYPE, NULL},
    {"torch.QUInt8Storage", GROVE__TAG_STORAGE, NO_DTYPE, NULL},
    {"torch.QInt32Storage", GROVE__TAG_STORAGE, NO_DTYPE, NULL},
    {"torch.QUInt4x2Storage", GROVE__TAG_STORAGE, NO_DTYPE, NULL},
    {"torch.QUInt2x4Storage", GROVE__TAG_STORAGE, NO_DTYPE, NULL},
    {"torch.UntypedStorage", GROVE__TAG_STORAGE, GROVE_U8, "untyped"},
    {"torch.storage.UntypedStorage", GROVE__TAG_STORAGE, GROVE_U8, "untyped"},
    {"torch.storage._UntypedStorage", GROVE__TAG_STORAGE, GROVE_U8, "untyped"},
    /* dtypes, by the names their pickles use (str(torch.float32)). */
    {"torch.float32", GROVE__TAG_DTYPE, GROVE_F32, NULL},
    {"torch.float16", GROVE__TAG_DTYPE, GROVE_F16, NULL},
    {"torch.bfloat16", GROVE__TAG_DTYPE, GROVE_BF16, NULL},
    {"torch.float64", GROVE__TAG_DTYPE, GROVE_F64, NULL},
    {"torch.int64", GROVE__TAG_DTYPE, GROVE_I64, NULL},
    {"torch.int32", GROVE__TAG_DTYPE, GROVE_I32, NULL},
    {"torch.int16", GROVE__TAG_DTYPE, GROVE_I16, NULL},
    {"torch.int8", GROVE__TAG_DTYPE, GROVE_I8, NULL},
    {"torch.uint8", GROVE__TAG_DTYPE, GROVE_U8, NULL},
    {"torch.bool", GROVE__TAG_DTYPE, GROVE_BOOL, NULL},
    {"torch.complex32", GROVE__TAG_DTYPE, NO_DTYPE, NULL},
    {"torch.complex64", GROVE__TAG_DTYPE, NO_DTYPE, NULL},
    {"torch.complex128", GROVE__TAG_DTYPE, NO_DTYPE, NULL},
    {"torch.uint16", GROVE__TAG_DTYPE, NO_DTYPE, NULL},
    {"torch.uint32", GROVE__TAG_DTYPE, NO_DTYPE, NULL},
    {"torch.uint64", GROVE__TAG_DTYPE, NO_DTYPE, NULL},
    {"torch.float8_e4m3fn", GROVE__TAG_DTYPE, NO_DTYPE, NULL},
    {"torch.float8_e5m2", GROVE__TAG_DTYPE, NO_DTYPE, NULL},
    {"torch.float8_e4m3fnuz", GROVE__TAG_DTYPE, NO_DTYPE, NULL},
    {"torch.float8_e5m2fnuz", GROVE__TAG_DTYPE, NO_DTYPE, NULL},
    {"torch.qint8", GROVE__TAG_DTYPE, NO_DTYPE, NULL},
    {"torch.quint8", GROVE__TAG_DTYPE, NO_DTYPE, NULL},
    {"torch.qint32", GROVE__TAG_DTYPE, NO_DTYPE, NULL},
    {"torch.quint4x2", GROVE__TAG_DTYPE, NO_DTYPE, NULL},
    {"torch.quint2x4", GROVE__TAG_DTYPE, NO_DTYPE, NULL},
    /* Quantization schemes: arguments of _rebuild_qtensor. */
    {"torch.per_tensor_affine", GROVE__TAG_QSCHEME, 0, NULL},
    {"torch.per_tensor_symmetric", GROVE__TAG_QSCHEME, 0, NULL},
    {"torch.per_channel_affine", GROVE__TAG_QSCHEME, 0, NULL},
    {"torch.per_channel_symmetric", GROVE__TAG_QSCHEME, 0, NULL},
    {"torch.per_channel_affine_float_qparams", GROVE__TAG_QSCHEME, 0, NULL},
};

static const allowed *find_allowed(const char *module, size_t mlen, const char *name, size_t nlen) {
  if (memchr(module, 0, mlen) || memchr(name, 0, nlen)) return NULL;
  for (size_t i = 0; i < sizeof allow_list / sizeof allow_list[0]; i++) {
    const char *full = allow_list[i].name;
    if (strlen(full) == mlen + 1 + nlen && memcmp(full, module, mlen) == 0 && full[mlen] == '.' &&
        memcmp(full + mlen + 1, name, nlen) == 0)
      return &allow_list[i];
  }
  return NULL;
}

/* ================================================================ opcodes */

/* Every opcode of protocols 0-5 by name, for messages; NULL for bytes that are
 * no opcode. */
static const char *const opcode_names[256] = {
    ['('] = "MARK",
    ['.'] = "STOP",
    ['0'] = "POP",
    ['1'] = "POP_MARK",
    ['2'] = "DUP",
    ['F'] = "FLOAT",
    ['I'] = "INT",
    ['J'] = "BININT",
    ['K'] = "BININT1",
    ['L'] = "LONG",
    ['M'] = "BININT2",
    ['N'] = "NONE",
    ['P'] = "PERSID",
    ['Q'] = "BINPERSID",
    ['R'] = "REDUCE",
    ['S'] = "STRING",
    ['T'] = "BINSTRING",
    ['U'] = "SHORT_BINSTRING",
    ['V'] = "UNICODE",
    ['X'] = "BINUNICODE",
    ['a'] = "APPEND",
    ['b'] = "BUILD",
    ['c'] = "GLOBAL",
    ['d'] = "DICT",
    ['}'] = "EMPTY_DICT",
    ['e'] = "APPENDS",
    ['g'] = "GET",
    ['h'] = "BINGET",
    ['i'] = "INST",
    ['j'] = "LONG_BINGET",
    ['l'] = "LIST",
    [']'] = "EMPTY_LIST",
    ['o'] = "OBJ",
    ['p'] = "PUT",
    ['q'] = "BINPUT",
    ['r'] = "LONG_BINPUT",
    ['s'] = "SETITEM",
    ['t'] = "TUPLE",
    [')'] = "EMPTY_TUPLE",
    ['u'] = "SETITEMS",
    ['G'] = "BINFLOAT",
    ['B'] = "BINBYTES",
    ['C'] = "SHORT_BINBYTES",
    [0x80] = "PROTO",
    [0x81] = "NEWOBJ",
    [0x82] = "EXT1",
    [0x83] = "EXT2",
    [0x84] = "EXT4",
    [0x85] = "TUPLE1",
    [0x86] = "TUPLE2",
    [0x87] = "TUPLE3",
    [0x88] = "NEWTRUE",
    [0x89] = "NEWFALSE",
    [0x8a] = "LONG1",
    [0x8b] = "LONG4",
    [0x8c] = "SHORT_BINUNICODE",
    [0x8d] = "BINUNICODE8",
    [0x8e] = "BINBYTES8",
    [0x8f] = "EMPTY_SET",
    [0x90] = "ADDITEMS",
    [0x91] = "FROZENSET",
    [0x92] = "NEWOBJ_EX",
    [0x93] = "STACK_GLOBAL",
    [0x94] = "MEMOIZE",
    [0x95] = "FRAME",
    [0x96] = "BYTEARRAY8",
    [0x97] = "NEXT_BUFFER",
    [0x98] = "READONLY_BUFFER",
};

static const char *opcode_name(uint8_t op) {
  return opcode_names[op];
}

/* ================================================================ values */

#define SLAB_VALUES 1024

typedef struct slab {
  struct slab *next;
  size_t used;
  grove__pk v[SLAB_VALUES];
} slab;

struct grove__pickle {
  slab *slabs;
  size_t nvalues;
};

/* The machine: input, stack with mark positions, memo. */
typedef struct machine {
  grove__pickle *pk;
  const uint8_t *p, *end, *start;
  const char *name;
  grove_err *err;
  grove__pk **stack;
  size_t sp, stack_cap;
  size_t *marks;
  size_t nmarks, marks_cap;
  grove__pk **memo;
  size_t memo_cap; /* slots allocated */
  size_t memo_len; /* distinct indexes set (MEMOIZE uses it) */
  size_t memo_limit;
  grove__pkl_limits lim;
} machine;

static size_t at(const machine *m) {
  return (size_t)(m->p - m->start);
}

static grove_status nomem(machine *m) {
  return grove_err_set(m->err, GROVE_E_NOMEM, "%s: out of memory", m->name);
}

static grove__pk *new_value(machine *m, grove__pk_kind kind) {
  if (m->pk->nvalues >= m->lim.max_values) {
    grove_err_set(m->err, GROVE_E_LIMIT, "%s: more than %zu values (byte %zu)", m->name,
                  m->lim.max_values, at(m));
    return NULL;
  }
  slab *s = m->pk->slabs;
  if (!s || s->used == SLAB_VALUES) {
    s = malloc(sizeof *s);
    if (!s) {
      nomem(m);
      return NULL;
    }
    s->used = 0;
    s->next = m->pk->slabs;
    m->pk->slabs = s;
  }
  grove__pk *v = &s->v[s->used++];
  memset(v, 0, sizeof *v);
  v->kind = kind;
  m->pk->nvalues++;
  return v;
}

void grove__pickle_free(grove__pickle *pk) {
  if (!pk) return;
  slab *s = pk->slabs;
  while (s) {
    for (size_t i = 0; i < s->used; i++) {
      grove__pk *v = &s->v[i];
      switch (v->kind) {
        case GROVE__PK_STR:
        case GROVE__PK_BYTES:
          free(v->u.str.s);
          break;
        case GROVE__PK_TUPLE:
        case GROVE__PK_LIST:
        case GROVE__PK_SET:
        case GROVE__PK_DICT:
          free(v->u.seq.items);
          break;
        default:
          break;
      }
    }
    slab *next = s->next;
    free(s);
    s = next;
  }
  free(pk);
}

static bool is_seq(const grove__pk *v) {
  return v->kind == GROVE__PK_TUPLE || v->kind == GROVE__PK_LIST || v->kind == GROVE__PK_SET ||
         v->kind == GROVE__PK_DICT;
}

static grove_status seq_push(machine *m, grove__pk *c, grove__pk *item) {
  assert(is_seq(c));
  if (c->u.seq.n >= m->lim.max_container)
    return grove_err_set(m->err, GROVE_E_LIMIT, "%s: a container of more than %zu items (byte %zu)",
                         m->name, m->lim.max_container, at(m));
  if (c->u.seq.n == c->u.seq.cap) {
    size_t cap = c->u.seq.cap ? c->u.seq.cap * 2 : 4;
    grove__pk **items = realloc(c->u.seq.items, cap * sizeof *items);
    if (!items) return nomem(m);
    c->u.seq.items = items;
    c->u.seq.cap = cap;
  }
  c->u.seq.items[c->u.seq.n++] = item;
  return GROVE_OK;
}

/* ================================================================ describe */

const char *grove__pk_describe(const grove__pk *v, char *buf, size_t n) {
  if (!v) return "nothing";
  switch (v->kind) {
    case GROVE__PK_NONE:
      return "None";
    case GROVE__PK_BOOL:
      return "a bool";
    case GROVE__PK_INT:
    case GROVE__PK_BIGINT:
      return "an int";
    case GROVE__PK_FLOAT:
      return "a float";
    case GROVE__PK_STR:
      return "a str";
    case GROVE__PK_BYTES:
      return "bytes";
    case GROVE__PK_TUPLE:
      return "a tuple";
    case GROVE__PK_LIST:
      return "a list";
    case GROVE__PK_SET:
      return "a set";
    case GROVE__PK_DICT:
      return "a dict";
    case GROVE__PK_GLOBAL:
      snprintf(buf, n, "the global '%s'", v->u.global.name);
      return buf;
    case GROVE__PK_CALL:
      snprintf(buf, n, "a call of '%s'", v->u.call.func->u.global.name);
      return buf;
    case GROVE__PK_PERSID:
      return "a storage";
  }
  return "a value";
}

const grove__pk *grove__pk_dict_get(const grove__pk *d, const char *key) {
  if (!d || d->kind != GROVE__PK_DICT) return NULL;
  size_t klen = strlen(key);
  const grove__pk *found = NULL;
  for (size_t i = 0; i + 1 < d->u.seq.n; i += 2) {
    const grove__pk *k = d->u.seq.items[i];
    if (k->kind == GROVE__PK_STR && k->u.str.len == klen && memcmp(k->u.str.s, key, klen) == 0)
      found = d->u.seq.items[i + 1];
  }
  return found;
}

/* ================================================================ machine */

/* Copies s into a printable, NUL-terminated form for messages. */
static const char *printable(const char *s, size_t len, char *buf, size_t n) {
  size_t k = 0;
  for (size_t i = 0; i < len && k + 5 < n; i++) {
    unsigned char c = (unsigned char)s[i];
    if (c >= 0x20 && c < 0x7F && c != '\'')
      buf[k++] = (char)c;
    else
      k += (size_t)snprintf(buf + k, n - k, "\\x%02x", c);
  }
  buf[k < n ? k : n - 1] = '\0';
  return buf;
}

static grove_status truncated(machine *m, const char *what) {
  return grove_err_set(m->err, GROVE_E_TRUNCATED, "%s: the pickle ends inside %s (byte %zu of %zu)",
                       m->name, what, at(m), (size_t)(m->end - m->start));
}

static grove_status need(machine *m, size_t n, const char *what) {
  if ((size_t)(m->end - m->p) < n) return truncated(m, what);
  return GROVE_OK;
}

static uint64_t le(const uint8_t *p, size_t n) {
  uint64_t v = 0;
  for (size_t i = n; i-- > 0;) v = v << 8 | p[i];
  return v;
}

static grove_status push(machine *m, grove__pk *v) {
  if (!v) return m->err ? m->err->code : GROVE_E_NOMEM;
  if (m->sp >= m->lim.max_stack)
    return grove_err_set(m->err, GROVE_E_LIMIT, "%s: more than %zu values on the stack (byte %zu)",
                         m->name, m->lim.max_stack, at(m));
  if (m->sp == m->stack_cap) {
    size_t cap = m->stack_cap ? m->stack_cap * 2 : 64;
    grove__pk **s = realloc(m->stack, cap * sizeof *s);
    if (!s) return nomem(m);
    m->stack = s;
    m->stack_cap = cap;
  }
  m->stack[m->sp++] = v;
  return GROVE_OK;
}

/* The bottom of the current mark frame: values below it are not ours. */
static size_t frame_base(const machine *m) {
  return m->nmarks ? m->marks[m->nmarks - 1] : 0;
}

static grove_status underflow(machine *m, uint8_t op) {
  return grove_err_set(m->err, GROVE_E_FORMAT,
                       "%s: %s at byte %zu finds too few values on the stack", m->name,
                       opcode_name(op), at(m) - 1);
}

static grove_status pop(machine *m, uint8_t op, grove__pk **out) {
  if (m->sp <= frame_base(m)) return underflow(m, op);
  *out = m->stack[--m->sp];
  return GROVE_OK;
}

static grove_status top(machine *m, uint8_t op, grove__pk **out) {
  if (m->sp <= frame_base(m)) return underflow(m, op);
  *out = m->stack[m->sp - 1];
  return GROVE_OK;
}

/* Pops the values above the last MARK; *items points at them (still in the
 * stack array, valid until the next push). */
static grove_status pop_mark(machine *m, uint8_t op, grove__pk ***items, size_t *n) {
  if (m->nmarks == 0)
    return grove_err_set(m->err, GROVE_E_FORMAT, "%s: %s at byte %zu without a MARK", m->name,
                         opcode_name(op), at(m) - 1);
  size_t base = m->marks[--m->nmarks];
  *items = m->stack ? m->stack + base : NULL; /* no stack yet: nothing was pushed */
  *n = m->sp - base;
  m->sp = base;
  return GROVE_OK;
}

static grove_status wrong_type(machine *m, uint8_t op, const char *expected, const grove__pk *got) {
  char d[160];
  return grove_err_set(m->err, GROVE_E_FORMAT, "%s: %s at byte %zu expects %s, finds %s", m->name,
                       opcode_name(op), at(m) - 1, expected, grove__pk_describe(got, d, sizeof d));
}

/* Reads a string of n bytes from the input into a new STR or BYTES. */
static grove_status read_str(machine *m, uint64_t n, grove__pk_kind kind, const char *what) {
  if (n > m->lim.max_str)
    return grove_err_set(m->err, GROVE_E_LIMIT,
                         "%s: a string of %llu bytes at byte %zu (the limit is %zu)", m->name,
                         (unsigned long long)n, at(m), m->lim.max_str);
  grove_status st = need(m, (size_t)n, what);
  if (st != GROVE_OK) return st;
  if (kind == GROVE__PK_STR && grove__utf8_invalid_at(m->p, (size_t)n, true) != (size_t)n)
    return grove_err_set(m->err, GROVE_E_BAD_UTF8, "%s: a string at byte %zu is not valid UTF-8",
                         m->name, at(m));
  grove__pk *v = new_value(m, kind);
  if (!v) return m->err ? m->err->code : GROVE_E_NOMEM;
  v->u.str.s = malloc((size_t)n + 1);
  if (!v->u.str.s) return nomem(m);
  memcpy(v->u.str.s, m->p, (size_t)n);
  v->u.str.s[n] = '\0';
  v->u.str.len = (size_t)n;
  m->p += n;
  return push(m, v);
}

static grove_status memo_put(machine *m, uint64_t idx, uint8_t op) {
  grove__pk *v;
  grove_status st = top(m, op, &v);
  if (st != GROVE_OK) return st;
  if (idx >= m->memo_limit)
    return grove_err_set(m->err, GROVE_E_LIMIT, "%s: %s at byte %zu: memo index %llu is too large",
                         m->name, opcode_name(op), at(m), (unsigned long long)idx);
  if (idx >= m->memo_cap) {
    size_t cap = m->memo_cap ? m->memo_cap : 64;
    while (cap <= idx) cap *= 2;
    grove__pk **memo = realloc(m->memo, cap * sizeof *memo);
    if (!memo) return nomem(m);
    memset(memo + m->memo_cap, 0, (cap - m->memo_cap) * sizeof *memo);
    m->memo = memo;
    m->memo_cap = cap;
  }
  if (!m->memo[idx]) m->memo_len++;
  m->memo[idx] = v;
  return GROVE_OK;
}

static grove_status memo_get(machine *m, uint64_t idx, uint8_t op) {
  if (idx >= m->memo_cap || !m->memo[idx])
    return grove_err_set(m->err, GROVE_E_FORMAT,
                         "%s: %s at byte %zu: memo index %llu was never set", m->name,
                         opcode_name(op), at(m), (unsigned long long)idx);
  return push(m, m->memo[idx]);
}

/* Pushes the tag of an allow-listed global or refuses the name. */
static grove_status push_global(machine *m, const char *mod, size_t mlen, const char *name,
                                size_t nlen, size_t pos) {
  const allowed *a = find_allowed(mod, mlen, name, nlen);
  if (!a) {
    char pm[200], pn[200];
    printable(mod, mlen > 150 ? 150 : mlen, pm, sizeof pm);
    printable(name, nlen > 150 ? 150 : nlen, pn, sizeof pn);
    bool module_like = (mlen >= 8 && strncmp(mod, "__main__", 8) == 0) ||
                       (mlen >= 15 && strncmp(mod, "torch.nn.modules", 15) == 0) ||
                       (mlen >= 11 && strncmp(mod, "torch.optim", 11) == 0);
    return grove_err_set(
        m->err, GROVE_E_REFUSED,
        "%s: global '%s.%s' (byte %zu) is not allowed: this file would run code when loaded; "
        "Grove reads only tensors and containers (what torch.load(weights_only=True) accepts)%s",
        m->name, pm, pn, pos,
        module_like ? ". It looks like a whole pickled object (torch.save(model)): save "
                      "model.state_dict() instead"
                    : "");
  }
  grove__pk *v = new_value(m, GROVE__PK_GLOBAL);
  if (!v) return m->err ? m->err->code : GROVE_E_NOMEM;
  v->u.global.tag = a->tag;
  v->u.global.name = a->name;
  if (a->tag == GROVE__TAG_STORAGE || a->tag == GROVE__TAG_DTYPE) {
    v->u.global.dtype_ok = a->dtype != NO_DTYPE;
    v->u.global.dtype = a->dtype != NO_DTYPE ? (grove_dtype)a->dtype : GROVE_F32;
    v->u.global.untyped = a->what != NULL;
  } else {
    v->u.global.what = a->what;
  }
  return push(m, v);
}

static grove_status op_global(machine *m) {
  size_t pos = at(m) - 1;
  const char *lines[2];
  size_t lens[2];
  for (int k = 0; k < 2; k++) {
    size_t room = (size_t)(m->end - m->p);
    if (room > 1024) room = 1024;
    const uint8_t *nl = memchr(m->p, '\n', room);
    if (!nl) {
      if ((size_t)(m->end - m->p) <= 1024) return truncated(m, "a GLOBAL name");
      return grove_err_set(m->err, GROVE_E_LIMIT, "%s: a GLOBAL name at byte %zu is too long",
                           m->name, pos);
    }
    lines[k] = (const char *)m->p;
    lens[k] = (size_t)(nl - m->p);
    m->p = nl + 1;
  }
  return push_global(m, lines[0], lens[0], lines[1], lens[1], pos);
}

static grove_status op_stack_global(machine *m, uint8_t op) {
  size_t pos = at(m) - 1;
  grove__pk *name = NULL, *mod = NULL;
  grove_status st = pop(m, op, &name);
  if (st == GROVE_OK) st = pop(m, op, &mod);
  if (st != GROVE_OK) return st;
  if (mod->kind != GROVE__PK_STR || name->kind != GROVE__PK_STR)
    return wrong_type(m, op, "two strings", mod->kind != GROVE__PK_STR ? mod : name);
  return push_global(m, mod->u.str.s, mod->u.str.len, name->u.str.s, name->u.str.len, pos);
}

/* Decodes a little-endian two's-complement integer of n bytes. */
static grove_status push_long(machine *m, const uint8_t *b, size_t n) {
  if (n > 8) {
    /* Bigger than 64 bits only if it is not a sign extension. */
    bool neg = b[n - 1] & 0x80;
    size_t k = n;
    while (k > 8 && b[k - 1] == (neg ? 0xFF : 0x00)) k--;
    if (k > 8 || ((b[7] & 0x80) != 0) != neg) return push(m, new_value(m, GROVE__PK_BIGINT));
    n = 8;
  }
  uint64_t v = le(b, n);
  if (n > 0 && n < 8 && (b[n - 1] & 0x80)) v |= ~(uint64_t)0 << (8 * n);
  grove__pk *x = new_value(m, GROVE__PK_INT);
  if (x) x->u.i = (int64_t)v;
  return push(m, x);
}

static grove_status push_int(machine *m, int64_t i) {
  grove__pk *v = new_value(m, GROVE__PK_INT);
  if (v) v->u.i = i;
  return push(m, v);
}

/* REDUCE and NEWOBJ: func(args) for an allow-listed func.  Containers and
 * plain data are built now; everything else becomes a CALL value. */
static grove_status op_call(machine *m, uint8_t op, bool newobj) {
  grove__pk *args = NULL, *func = NULL;
  grove_status st = pop(m, op, &args);
  if (st == GROVE_OK) st = pop(m, op, &func);
  if (st != GROVE_OK) return st;
  if (func->kind != GROVE__PK_GLOBAL) return wrong_type(m, op, "a global to call", func);
  if (args->kind != GROVE__PK_TUPLE) return wrong_type(m, op, "an argument tuple", args);
  grove__pk_tag tag = func->u.global.tag;
  size_t n = args->u.seq.n;
  grove__pk **a = args->u.seq.items;
  if (newobj && tag != GROVE__TAG_PARAMETER)
    return grove_err_set(m->err, GROVE_E_REFUSED,
                         "%s: NEWOBJ at byte %zu creates '%s': only torch.nn.Parameter may be "
                         "created (as in torch.load(weights_only=True))",
                         m->name, at(m) - 1, func->u.global.name);
  switch (tag) {
    case GROVE__TAG_ORDERED_DICT: {
      /* OrderedDict() or OrderedDict([(k, v), ...]). */
      grove__pk *d = new_value(m, GROVE__PK_DICT);
      if (!d) return m->err ? m->err->code : GROVE_E_NOMEM;
      d->ordered = true;
      if (n == 1 && a[0]->kind == GROVE__PK_LIST) {
        for (size_t i = 0; i < a[0]->u.seq.n && st == GROVE_OK; i++) {
          grove__pk *pair = a[0]->u.seq.items[i];
          if (pair->kind != GROVE__PK_TUPLE || pair->u.seq.n != 2)
            return wrong_type(m, op, "(key, value) pairs", pair);
          st = seq_push(m, d, pair->u.seq.items[0]);
          if (st == GROVE_OK) st = seq_push(m, d, pair->u.seq.items[1]);
        }
      } else if (n != 0) {
        return wrong_type(m, op, "OrderedDict() or OrderedDict(pairs)", args);
      }
      if (st != GROVE_OK) return st;
      return push(m, d);
    }
    case GROVE__TAG_SET: {
      /* set() or set([items]): plain data a checkpoint may carry. */
      grove__pk *set = new_value(m, GROVE__PK_SET);
      if (!set) return m->err ? m->err->code : GROVE_E_NOMEM;
      if (n == 1 && (a[0]->kind == GROVE__PK_LIST || a[0]->kind == GROVE__PK_TUPLE)) {
        for (size_t i = 0; i < a[0]->u.seq.n && st == GROVE_OK; i++)
          st = seq_push(m, set, a[0]->u.seq.items[i]);
      } else if (n != 0) {
        return wrong_type(m, op, "set() or set(list)", args);
      }
      if (st != GROVE_OK) return st;
      return push(m, set);
    }
    case GROVE__TAG_SIZE:
      if (n != 1 || a[0]->kind != GROVE__PK_TUPLE)
        return wrong_type(m, op, "torch.Size(tuple)", args);
      return push(m, a[0]);
    case GROVE__TAG_CODECS_ENCODE: {
      /* Protocol 2 pickles bytes as _codecs.encode(text, 'latin1'): the
       * code points, each below 256, are the bytes. */
      if (n != 2 || a[0]->kind != GROVE__PK_STR || a[1]->kind != GROVE__PK_STR ||
          (strcmp(a[1]->u.str.s, "latin1") != 0 && strcmp(a[1]->u.str.s, "latin-1") != 0))
        return wrong_type(m, op, "_codecs.encode(str, 'latin1')", args);
      const uint8_t *s = (const uint8_t *)a[0]->u.str.s;
      size_t len = a[0]->u.str.len, k = 0;
      grove__pk *b = new_value(m, GROVE__PK_BYTES);
      if (!b) return m->err ? m->err->code : GROVE_E_NOMEM;
      b->u.str.s = malloc(len + 1);
      if (!b->u.str.s) return nomem(m);
      for (size_t i = 0; i < len; i++) {
        if (s[i] < 0x80) {
          b->u.str.s[k++] = (char)s[i];
        } else if ((s[i] == 0xC2 || s[i] == 0xC3) && i + 1 < len) {
          b->u.str.s[k++] = (char)(((s[i] & 0x03) << 6) | (s[i + 1] & 0x3F));
          i++;
        } else {
          return grove_err_set(m->err, GROVE_E_FORMAT,
                               "%s: _codecs.encode at byte %zu: a character above U+00FF cannot "
                               "be latin1",
                               m->name, at(m) - 1);
        }
      }
      b->u.str.s[k] = '\0';
      b->u.str.len = k;
      return push(m, b);
    }
    case GROVE__TAG_STORAGE:
    case GROVE__TAG_DTYPE:
    case GROVE__TAG_QSCHEME:
      /* Calling a storage class would allocate one; a dtype or scheme is
       * not callable.  torch.save never writes these calls. */
      return grove_err_set(m->err, GROVE_E_REFUSED,
                           "%s: %s at byte %zu calls '%s', which a state_dict never does", m->name,
                           opcode_name(op), at(m) - 1, func->u.global.name);
    default: {
      grove__pk *c = new_value(m, GROVE__PK_CALL);
      if (!c) return m->err ? m->err->code : GROVE_E_NOMEM;
      c->u.call.func = func;
      c->u.call.args = args;
      c->u.call.newobj = newobj;
      return push(m, c);
    }
  }
}

bool grove__pk_tag_makes_tensor(grove__pk_tag tag) {
  switch (tag) {
    case GROVE__TAG_REBUILD_TENSOR:
    case GROVE__TAG_REBUILD_TENSOR_V2:
    case GROVE__TAG_REBUILD_TENSOR_V3:
    case GROVE__TAG_REBUILD_PARAMETER:
    case GROVE__TAG_REBUILD_PARAMETER_WITH_STATE:
    case GROVE__TAG_REBUILD_FROM_TYPE_V2:
    case GROVE__TAG_REBUILD_UNSUPPORTED:
    case GROVE__TAG_PARAMETER:
      return true;
    default:
      return false;
  }
}

static grove_status op_build(machine *m, uint8_t op) {
  grove__pk *state = NULL, *inst = NULL;
  grove_status st = pop(m, op, &state);
  if (st == GROVE_OK) st = top(m, op, &inst);
  if (st != GROVE_OK) return st;
  /* torch's weights_only unpickler builds OrderedDicts, Tensors and
   * Parameters only: here, dicts from OrderedDict() and the results of the
   * tensor-building calls. */
  bool ok =
      (inst->kind == GROVE__PK_DICT && inst->ordered) ||
      (inst->kind == GROVE__PK_CALL && grove__pk_tag_makes_tensor(inst->u.call.func->u.global.tag));
  if (!ok) {
    char d[160];
    return grove_err_set(m->err, GROVE_E_REFUSED,
                         "%s: BUILD at byte %zu sets the state of %s; only OrderedDicts and "
                         "tensors may have state (as in torch.load(weights_only=True))",
                         m->name, at(m) - 1, grove__pk_describe(inst, d, sizeof d));
  }
  inst->state = state;
  return GROVE_OK;
}

static grove_status run(machine *m, const grove__pk **root) {
  grove_status st = GROVE_OK;
  while (st == GROVE_OK) {
    if (m->p >= m->end)
      return grove_err_set(m->err, GROVE_E_TRUNCATED,
                           "%s: the pickle ends without STOP (%zu bytes)", m->name,
                           (size_t)(m->end - m->start));
    uint8_t op = *m->p++;
    grove__pk *a = NULL, *b = NULL, *c = NULL, **items = NULL;
    size_t n;
    switch (op) {
      case 0x80: /* PROTO */
        if ((st = need(m, 1, "PROTO")) != GROVE_OK) break;
        if (*m->p > 5)
          return grove_err_set(m->err, GROVE_E_UNSUPPORTED,
                               "%s: pickle protocol %u; Grove reads protocols 2 to 5", m->name,
                               *m->p);
        m->p++;
        break;
      case 0x95: /* FRAME: only a length; the opcodes follow inline */
        if ((st = need(m, 8, "FRAME")) != GROVE_OK) break;
        if (le(m->p, 8) > (uint64_t)(m->end - m->p - 8)) return truncated(m, "a FRAME");
        m->p += 8;
        break;
      case '.': /* STOP */
        if ((st = pop(m, op, &a)) != GROVE_OK) break;
        *root = a;
        return GROVE_OK;
      case '(': /* MARK */
        if (m->nmarks >= m->lim.max_marks)
          return grove_err_set(m->err, GROVE_E_LIMIT, "%s: more than %zu nested MARKs (byte %zu)",
                               m->name, m->lim.max_marks, at(m) - 1);
        if (m->nmarks == m->marks_cap) {
          size_t cap = m->marks_cap ? m->marks_cap * 2 : 16;
          size_t *mk = realloc(m->marks, cap * sizeof *mk);
          if (!mk) return nomem(m);
          m->marks = mk;
          m->marks_cap = cap;
        }
        m->marks[m->nmarks++] = m->sp;
        break;
      case 'N':
        st = push(m, new_value(m, GROVE__PK_NONE));
        break;
      case 0x88: /* NEWTRUE */
      case 0x89: /* NEWFALSE */
        a = new_value(m, GROVE__PK_BOOL);
        if (a) a->u.b = op == 0x88;
        st = push(m, a);
        break;
      case 'J': /* BININT */
        if ((st = need(m, 4, "BININT")) != GROVE_OK) break;
        st = push_int(m, (int32_t)(uint32_t)le(m->p, 4));
        m->p += 4;
        break;
      case 'K': /* BININT1 */
        if ((st = need(m, 1, "BININT1")) != GROVE_OK) break;
        st = push_int(m, *m->p++);
        break;
      case 'M': /* BININT2 */
        if ((st = need(m, 2, "BININT2")) != GROVE_OK) break;
        st = push_int(m, (int64_t)le(m->p, 2));
        m->p += 2;
        break;
      case 0x8a:   /* LONG1 */
      case 0x8b: { /* LONG4 */
        size_t w = op == 0x8a ? 1 : 4;
        if ((st = need(m, w, opcode_name(op))) != GROVE_OK) break;
        uint64_t len = le(m->p, w);
        m->p += w;
        if (op == 0x8b && (len & 0x80000000u))
          return grove_err_set(m->err, GROVE_E_FORMAT,
                               "%s: LONG4 at byte %zu has a negative length", m->name, at(m) - 5);
        if (len > m->lim.max_str)
          return grove_err_set(m->err, GROVE_E_LIMIT, "%s: an integer of %llu bytes at byte %zu",
                               m->name, (unsigned long long)len, at(m));
        if ((st = need(m, (size_t)len, opcode_name(op))) != GROVE_OK) break;
        st = push_long(m, m->p, (size_t)len);
        m->p += len;
        break;
      }
      case 'G': { /* BINFLOAT: big-endian IEEE double */
        if ((st = need(m, 8, "BINFLOAT")) != GROVE_OK) break;
        uint64_t bits = 0;
        for (int i = 0; i < 8; i++) bits = bits << 8 | m->p[i];
        m->p += 8;
        a = new_value(m, GROVE__PK_FLOAT);
        if (a) memcpy(&a->u.f, &bits, sizeof bits);
        st = push(m, a);
        break;
      }
      case 'X': /* BINUNICODE */
        if ((st = need(m, 4, "BINUNICODE")) != GROVE_OK) break;
        n = (size_t)le(m->p, 4);
        m->p += 4;
        st = read_str(m, n, GROVE__PK_STR, "a BINUNICODE string");
        break;
      case 0x8c: /* SHORT_BINUNICODE */
        if ((st = need(m, 1, "SHORT_BINUNICODE")) != GROVE_OK) break;
        n = *m->p++;
        st = read_str(m, n, GROVE__PK_STR, "a SHORT_BINUNICODE string");
        break;
      case 0x8d: { /* BINUNICODE8 */
        if ((st = need(m, 8, "BINUNICODE8")) != GROVE_OK) break;
        uint64_t len = le(m->p, 8);
        m->p += 8;
        st = read_str(m, len, GROVE__PK_STR, "a BINUNICODE8 string");
        break;
      }
      case 'U': /* SHORT_BINSTRING: torch decodes these as text */
        if ((st = need(m, 1, "SHORT_BINSTRING")) != GROVE_OK) break;
        n = *m->p++;
        st = read_str(m, n, GROVE__PK_STR, "a SHORT_BINSTRING string");
        break;
      case 'C': /* SHORT_BINBYTES */
        if ((st = need(m, 1, "SHORT_BINBYTES")) != GROVE_OK) break;
        n = *m->p++;
        st = read_str(m, n, GROVE__PK_BYTES, "SHORT_BINBYTES data");
        break;
      case 'B': /* BINBYTES */
        if ((st = need(m, 4, "BINBYTES")) != GROVE_OK) break;
        n = (size_t)le(m->p, 4);
        m->p += 4;
        st = read_str(m, n, GROVE__PK_BYTES, "BINBYTES data");
        break;
      case 0x8e: { /* BINBYTES8 */
        if ((st = need(m, 8, "BINBYTES8")) != GROVE_OK) break;
        uint64_t len = le(m->p, 8);
        m->p += 8;
        st = read_str(m, len, GROVE__PK_BYTES, "BINBYTES8 data");
        break;
      }
      case ')':
        st = push(m, new_value(m, GROVE__PK_TUPLE));
        break;
      case ']':
        st = push(m, new_value(m, GROVE__PK_LIST));
        break;
      case '}':
        st = push(m, new_value(m, GROVE__PK_DICT));
        break;
      case 0x8f:
        st = push(m, new_value(m, GROVE__PK_SET));
        break;
      case 't': /* TUPLE */
        if ((st = pop_mark(m, op, &items, &n)) != GROVE_OK) break;
        a = new_value(m, GROVE__PK_TUPLE);
        if (!a) return m->err ? m->err->code : GROVE_E_NOMEM;
        /* The items sit in the stack above sp: copy them out before the
         * push below can overwrite them. */
        for (size_t i = 0; i < n && st == GROVE_OK; i++) st = seq_push(m, a, items[i]);
        if (st == GROVE_OK) st = push(m, a);
        break;
      case 0x85:   /* TUPLE1 */
      case 0x86:   /* TUPLE2 */
      case 0x87: { /* TUPLE3 */
        size_t k = (size_t)(op - 0x84);
        if (m->sp - frame_base(m) < k) return underflow(m, op);
        a = new_value(m, GROVE__PK_TUPLE);
        if (!a) return m->err ? m->err->code : GROVE_E_NOMEM;
        for (size_t i = m->sp - k; i < m->sp && st == GROVE_OK; i++)
          st = seq_push(m, a, m->stack[i]);
        m->sp -= k;
        if (st == GROVE_OK) st = push(m, a);
        break;
      }
      case 'a': /* APPEND */
        if ((st = pop(m, op, &b)) != GROVE_OK || (st = top(m, op, &a)) != GROVE_OK) break;
        if (a->kind != GROVE__PK_LIST) return wrong_type(m, op, "a list", a);
        st = seq_push(m, a, b);
        break;
      case 'e': /* APPENDS */
        if ((st = pop_mark(m, op, &items, &n)) != GROVE_OK || (st = top(m, op, &a)) != GROVE_OK)
          break;
        if (a->kind != GROVE__PK_LIST) return wrong_type(m, op, "a list", a);
        for (size_t i = 0; i < n && st == GROVE_OK; i++) st = seq_push(m, a, items[i]);
        break;
      case 's': /* SETITEM */
        if ((st = pop(m, op, &c)) != GROVE_OK || (st = pop(m, op, &b)) != GROVE_OK ||
            (st = top(m, op, &a)) != GROVE_OK)
          break;
        if (a->kind != GROVE__PK_DICT) return wrong_type(m, op, "a dict", a);
        st = seq_push(m, a, b);
        if (st == GROVE_OK) st = seq_push(m, a, c);
        break;
      case 'u': /* SETITEMS */
        if ((st = pop_mark(m, op, &items, &n)) != GROVE_OK || (st = top(m, op, &a)) != GROVE_OK)
          break;
        if (a->kind != GROVE__PK_DICT) return wrong_type(m, op, "a dict", a);
        if (n % 2)
          return grove_err_set(m->err, GROVE_E_FORMAT,
                               "%s: SETITEMS at byte %zu has an odd number of values (%zu)",
                               m->name, at(m) - 1, n);
        for (size_t i = 0; i < n && st == GROVE_OK; i++) st = seq_push(m, a, items[i]);
        break;
      case 'h': /* BINGET */
        if ((st = need(m, 1, "BINGET")) != GROVE_OK) break;
        st = memo_get(m, *m->p++, op);
        break;
      case 'j': /* LONG_BINGET */
        if ((st = need(m, 4, "LONG_BINGET")) != GROVE_OK) break;
        n = (size_t)le(m->p, 4);
        m->p += 4;
        st = memo_get(m, n, op);
        break;
      case 'q': /* BINPUT */
        if ((st = need(m, 1, "BINPUT")) != GROVE_OK) break;
        st = memo_put(m, *m->p++, op);
        break;
      case 'r': /* LONG_BINPUT */
        if ((st = need(m, 4, "LONG_BINPUT")) != GROVE_OK) break;
        n = (size_t)le(m->p, 4);
        m->p += 4;
        st = memo_put(m, n, op);
        break;
      case 0x94: /* MEMOIZE */
        st = memo_put(m, m->memo_len, op);
        break;
      case 'c':
        st = op_global(m);
        break;
      case 0x93:
        st = op_stack_global(m, op);
        break;
      case 'R':
        st = op_call(m, op, false);
        break;
      case 0x81:
        st = op_call(m, op, true);
        break;
      case 'b':
        st = op_build(m, op);
        break;
      case 'Q': /* BINPERSID */
        if ((st = pop(m, op, &a)) != GROVE_OK) break;
        b = new_value(m, GROVE__PK_PERSID);
        if (b) b->u.pid = a;
        st = push(m, b);
        break;
      default: {
        const char *on = opcode_name(op);
        if (on)
          return grove_err_set(m->err, GROVE_E_REFUSED,
                               "%s: opcode %s (0x%02x, byte %zu) is not allowed: Grove runs only "
                               "the opcodes of torch.load(weights_only=True)",
                               m->name, on, op, at(m) - 1);
        return grove_err_set(m->err, GROVE_E_FORMAT, "%s: byte %zu (0x%02x) is not a pickle opcode",
                             m->name, at(m) - 1, op);
      }
    }
  }
  return st;
}

const grove__pkl_limits grove__pkl_default_limits = {
    .max_bytes = GROVE_PKL_MAX_BYTES,
    .max_stack = GROVE_PKL_MAX_STACK,
    .max_marks = GROVE_PKL_MAX_MARKS,
    .max_memo = GROVE_PKL_MAX_MEMO,
    .max_str = GROVE_PKL_MAX_STR,
    .max_container = GROVE_PKL_MAX_CONTAINER,
    .max_values = GROVE_PKL_MAX_VALUES,
};

/* The one entry of the loads: used, when not NULL, receives the bytes up to
 * and including STOP, and the pickle may then end anywhere in buf[0, len)
 * (only its first max_bytes count). */
static grove_status load(const void *buf, size_t len, const char *name,
                         const grove__pkl_limits *lim, grove__pickle **pk, const grove__pk **root,
                         size_t *used, grove_err *err) {
  *pk = NULL;
  *root = NULL;
  if (!name) name = "<pickle>";
  if (!lim) lim = &grove__pkl_default_limits;
  if (used && len > lim->max_bytes) len = lim->max_bytes;
  if (len > lim->max_bytes)
    return grove_err_set(err, GROVE_E_LIMIT, "%s: %zu bytes of pickle (the limit is %zu)", name,
                         len, lim->max_bytes);
  grove_err local = {0};
  machine m = {0};
  m.pk = calloc(1, sizeof *m.pk);
  if (!m.pk) return grove_err_set(err, GROVE_E_NOMEM, "%s: out of memory", name);
  m.start = m.p = buf ? buf : (const void *)"";
  m.end = m.start + len;
  m.name = name;
  m.err = err ? err : &local;
  m.lim = *lim;
  /* A put costs at least two bytes, so the memo of an honest pickle holds
   * fewer entries than it has bytes; the slack admits sparse 1-byte
   * indexes in small pickles. */
  m.memo_limit = len + 256 < lim->max_memo ? len + 256 : lim->max_memo;
  grove_status st = run(&m, root);
  free(m.stack);
  free(m.marks);
  free(m.memo);
  if (st != GROVE_OK) {
    grove__pickle_free(m.pk);
    *root = NULL;
    return st;
  }
  *pk = m.pk;
  if (used) *used = (size_t)(m.p - m.start);
  return GROVE_OK;
}

grove_status grove__pickle_load_limited(const void *buf, size_t len, const char *name,
                                        const grove__pkl_limits *lim, grove__pickle **pk,
                                        const grove__pk **root, grove_err *err) {
  return load(buf, len, name, lim, pk, root, NULL, err);
}

grove_status grove__pickle_load(const void *buf, size_t len, const char *name, grove__pickle **pk,
                                const grove__pk **root, grove_err *err) {
  return load(buf, len, name, NULL, pk, root, NULL, err);
}

grove_status grove__pickle_load_prefix(const void *buf, size_t len, const char *name,
                                       grove__pickle **pk, const grove__pk **root, size_t *used,
                                       grove_err *err) {
  return load(buf, len, name, NULL, pk, root, used, err);
}

bool grove__pickle_each(const grove__pickle *pk, grove__pk_kind kind,
                        bool (*fn)(void *ctx, const grove__pk *v), void *ctx) {
  for (const slab *s = pk ? pk->slabs : NULL; s; s = s->next)
    for (size_t i = 0; i < s->used; i++)
      if (s->v[i].kind == kind && !fn(ctx, &s->v[i])) return false;
  return true;
}
