/* fuzz_spec.c: libFuzzer target for model.json (core/model/spec.c, the layer
 * builders, graph_compile.c) and for running what it builds (graph.c, the
 * layers' forwards).  Input: a model.json text.
 *
 * A model directory is a file users hand to groved; a broken or hostile
 * one must be refused with a message, never crash it.  What builds must
 * also run: on zero weights and zero inputs of its own spec (batch 2, 3
 * for any other free dimension) a forward either succeeds or fails with a
 * status and a message, its outputs are readable, and the tree's
 * state_dict loads back into it strictly.
 *
 * Sizes are capped before parsing (every integer in the text at most
 * MAX_INT, the text at most 64 KB): the builders allocate what a spec
 * asks for, so Linear(100000, 100000) is 40 GB of zeros, not a bug. */
#include <stdbool.h>

#include "fuzz_common.h"

#define MAX_TEXT 65536
#define MAX_INT 512
#define MAX_INPUT_ELEMS 65536

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Whether every run of digits in the text is a number of at most MAX_INT
 * (a float's digits count too: harmless, and simpler than parsing). */
static bool small_numbers(const char *s) {
  for (const char *p = s; *p;) {
    if (*p < '0' || *p > '9') {
      p++;
      continue;
    }
    long v = 0;
    while (*p >= '0' && *p <= '9') {
      v = v * 10 + (*p - '0');
      if (v > MAX_INT) return false;
      p++;
    }
  }
  return true;
}

static void touch(const grove_tensor *t) {
  size_t n = grove_tensor_nbytes(t);
  uint8_t *buf = malloc(n ? n : 1);
  FUZZ_CHECK(buf != NULL);
  grove__tensor_gather(t, buf);
  free(buf);
}

/* Zero inputs of m's spec, batch 2; false when they would be too large or
 * of a dtype there is no zero tensor for. */
static bool make_inputs(const grove_model *m, grove_tensor **in) {
  for (size_t i = 0; i < m->ninputs; i++) {
    const grove_io_spec *s = &m->inputs[i];
    int64_t shape[GROVE_MAX_DIMS], elems = 1;
    for (int d = 0; d < s->ndim; d++) {
      shape[d] = s->shape[d] < 0 ? (d == 0 ? 2 : 3) : s->shape[d];
      elems *= shape[d];
      if (elems > MAX_INPUT_ELEMS) return false;
    }
    grove_err err = {0};
    in[i] = grove_tensor_new(s->dtype, s->ndim, shape, &err);
    if (!in[i]) return false;
  }
  return true;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size > MAX_TEXT) return 0;
  char *text = malloc(size + 1);
  FUZZ_CHECK(text != NULL);
  memcpy(text, data, size);
  text[size] = '\0';
  if (strlen(text) != size || !small_numbers(text)) {
    free(text);
    return 0;
  }
  grove_err err = {0};
  grove_model *m = NULL;
  grove_status st = grove_model_from_spec(text, "fuzz/model.json", &m, &err);
  free(text);
  FUZZ_CHECK((st == GROVE_OK) == (m != NULL));
  FUZZ_CHECK(st == GROVE_OK || (err.code == st && err.msg[0] != '\0'));
  if (!m) return 0;

  /* The tree's state_dict loads back into it, strictly. */
  grove_state_dict *sd = grove_sd_new();
  FUZZ_CHECK(sd != NULL);
  st = grove_module_state_dict(m->root, "", sd, &err);
  FUZZ_CHECK(st == GROVE_OK);
  st = grove_module_load_state_dict(m->root, sd, NULL, NULL, &err);
  FUZZ_CHECK(st == GROVE_OK);
  grove_sd_free(sd);

  /* A forward runs or says why not. */
  grove_tensor *in[GROVE_MAX_VALUES] = {0};
  if (m->ninputs <= GROVE_MAX_VALUES && make_inputs(m, in)) {
    grove_tensor x[GROVE_MAX_VALUES];
    for (size_t i = 0; i < m->ninputs; i++) x[i] = *in[i];
    grove_arena *arena = grove_arena_new(0);
    FUZZ_CHECK(arena != NULL);
    grove_values out;
    grove_err ferr = {0};
    st = grove_model_forward(m, arena, x, m->ninputs, &out, &ferr);
    FUZZ_CHECK(st == GROVE_OK || (ferr.code == st && ferr.msg[0] != '\0'));
    if (st == GROVE_OK)
      for (int k = 0; k < out.n; k++) touch(&out.v[k]);
    grove_arena_free(arena);
  }
  for (size_t i = 0; i < GROVE_MAX_VALUES; i++)
    if (in[i]) grove_tensor_release(in[i]);
  grove_model_free(m);
  return 0;
}
