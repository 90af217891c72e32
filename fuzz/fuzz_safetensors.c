/* fuzz_safetensors.c: libFuzzer target for the safetensors reader
 * (core/io/safetensors.c).  Input: a whole safetensors file. */
#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  grove_err err = {0};
  grove_state_dict *sd = NULL;
  (void)grove_ckpt_detect("fuzz.safetensors", data, size);
  grove_status st = grove_safetensors_read_buffer(data, size, "fuzz.safetensors", &sd, &err);
  FUZZ_CHECK((st == GROVE_OK) == (sd != NULL));
  FUZZ_CHECK(st == GROVE_OK || err.code == st);
  if (sd) {
    fuzz_touch(sd);
    /* What reads as safetensors also writes as torch.save and reads back. */
    uint8_t *out = NULL;
    size_t len = 0;
    if (grove__torch_write_buffer(sd, "archive", NULL, &out, &len, &err) == GROVE_OK) {
      grove_state_dict *back = NULL;
      FUZZ_CHECK(grove__torch_read_buffer(out, len, "back.pt", NULL, &back, &err) == GROVE_OK);
      fuzz_same(sd, back);
      grove_sd_free(back);
      free(out);
    } else {
      /* Only a key torch cannot hold: not valid UTF-8 was checked by the
       * reader, so nothing else may fail. */
      FUZZ_CHECK(err.code == GROVE_E_BAD_UTF8);
    }
  }
  grove_sd_free(sd);
  return 0;
}
