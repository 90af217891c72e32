/* utf8.c: the one UTF-8 validator.  safetensors headers must be strict
 * UTF-8 (Rust's str::from_utf8); pickled str values may carry lone
 * surrogates, which Python writes with "surrogatepass". */
#include "base.h"

size_t grove__utf8_invalid_at(const uint8_t *s, size_t len, bool allow_surrogates) {
  size_t i = 0;
  while (i < len) {
    uint8_t c = s[i];
    if (c < 0x80) {
      i++;
      continue;
    }
    size_t n;
    uint8_t lo = 0x80, hi = 0xBF; /* allowed range of the second byte */
    if (c >= 0xC2 && c <= 0xDF) {
      n = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      n = 3;
      if (c == 0xE0)
        lo = 0xA0; /* overlong */
      else if (c == 0xED && !allow_surrogates)
        hi = 0x9F; /* U+D800..U+DFFF */
    } else if (c >= 0xF0 && c <= 0xF4) {
      n = 4;
      if (c == 0xF0)
        lo = 0x90; /* overlong */
      else if (c == 0xF4)
        hi = 0x8F; /* past U+10FFFF */
    } else {
      return i;
    }
    if (len - i < n) return i;
    if (s[i + 1] < lo || s[i + 1] > hi) return i;
    for (size_t k = 2; k < n; k++)
      if ((s[i + k] & 0xC0) != 0x80) return i;
    i += n;
  }
  return len;
}
