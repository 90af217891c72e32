/* reload_fixtures.h: the reload fixtures that tests/check_reload.c and
 * tests/check_files.c share (tests/fixtures_gen/reload.py): reload_mlp, its
 * inputs and the outputs of checkpoints A and B, and the checkpoints in
 * reload_ckpt.  Include after groved_harness.h. */
#ifndef GROVE_TESTS_RELOAD_FIXTURES_H
#define GROVE_TESTS_RELOAD_FIXTURES_H

/* reload_mlp's io.safetensors: inputs x and the outputs ya (checkpoint A)
 * and yb (checkpoint B), exact in float32. */
typedef struct expected {
  grove_state_dict *sd;
  grove_tensor *x, *ya, *yb;
} expected;

static inline void expected_load(expected *e) {
  char path[4096];
  snprintf(path, sizeof path, "%s/io.safetensors", grove_fixture("reload_mlp"));
  grove_err err = {0};
  ck_assert_ok(grove_safetensors_read(path, &e->sd, &err), &err);
  e->x = grove_sd_get(e->sd, "x");
  e->ya = grove_sd_get(e->sd, "ya");
  e->yb = grove_sd_get(e->sd, "yb");
  ck_assert(e->x && e->ya && e->yb);
}

/* The path of checkpoint name in reload_ckpt; the last four stay valid. */
static inline const char *ckpt(const char *name) {
  static char buf[4][4096];
  static int k;
  k = (k + 1) % 4;
  snprintf(buf[k], sizeof buf[k], "%s/%s", grove_fixture("reload_ckpt"), name);
  return buf[k];
}

#endif
