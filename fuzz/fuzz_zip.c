/* fuzz_zip.c: libFuzzer target for torch.save archives: the zip directory
 * reader (core/io/torch_zip.c) and everything behind it (core/io/pickle.c,
 * core/io/torch_load.c), with a round trip through the writer.  Input: a whole
 * .pt file. */
#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  /* The directory alone: every record that is small enough is extracted. */
  grove__zip z;
  grove_err err = {0};
  if (grove__zip_open(&z, data, size, "fuzz.zip", &err) == GROVE_OK) {
    for (size_t i = 0; i < z.count; i++) {
      const grove__zip_entry *e = &z.entries[i];
      FUZZ_CHECK(grove__zip_find(&z, e->name) == e);
      FUZZ_CHECK(e->data_offset + e->comp_size <= size);
      if (e->size > (1u << 20)) continue;
      uint8_t *buf = malloc(e->size ? (size_t)e->size : 1);
      FUZZ_CHECK(buf != NULL);
      (void)grove__zip_extract(&z, e, buf, &err);
      free(buf);
    }
    grove__zip_close(&z);
  }
  fuzz_torch_archive(data, size);
  return 0;
}
