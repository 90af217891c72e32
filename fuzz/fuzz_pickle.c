/* fuzz_pickle.c: libFuzzer target for the restricted unpickler
 * (core/io/pickle.c) and the state_dict walker behind it (core/io/torch_load.c).
 * Input: a data.pkl.  When it unpickles, it is put in an archive beside
 * storages data/0 .. data/7 of 256 bytes each (the seed pickles refer to
 * those) and read as a checkpoint. */
#include <stdio.h>

#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  grove__pickle *pk = NULL;
  const grove__pk *root = NULL;
  grove_err err = {0};
  grove_status st = grove__pickle_load(data, size, "fuzz.pkl", &pk, &root, &err);
  FUZZ_CHECK((st == GROVE_OK) == (root != NULL));
  if (st != GROVE_OK) return 0;
  char d[200];
  (void)grove__pk_describe(root, d, sizeof d);
  (void)grove__pk_dict_get(root, "state_dict");
  grove__pickle_free(pk);

  static uint8_t storage[256];
  for (size_t i = 0; i < sizeof storage; i++) storage[i] = (uint8_t)(i * 7 + 1);
  grove__zipw *w = grove__zipw_new(-1, "fuzz", NULL);
  FUZZ_CHECK(w != NULL);
  FUZZ_CHECK(grove__zipw_add(w, "archive/data.pkl", data, size, &err) == GROVE_OK);
  for (int k = 0; k < 8; k++) {
    char name[32];
    snprintf(name, sizeof name, "archive/data/%d", k);
    FUZZ_CHECK(grove__zipw_add(w, name, storage, sizeof storage, &err) == GROVE_OK);
  }
  FUZZ_CHECK(grove__zipw_add(w, "archive/version", "3\n", 2, &err) == GROVE_OK);
  FUZZ_CHECK(grove__zipw_finish(w, &err) == GROVE_OK);
  size_t len;
  const uint8_t *zip = grove__zipw_data(w, &len);
  fuzz_torch_archive(zip, len);
  grove__zipw_free(w);
  return 0;
}
