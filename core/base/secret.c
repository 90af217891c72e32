/* secret.c: comparing a secret in time that does not depend on where it
 * differs.  groved's admin token (server/admin.c) is compared with the one a
 * request carries; a plain memcmp stops at the first differing byte, and the
 * time it takes tells a prober how many leading bytes were right. */
#include "base.h"

bool grove__secret_equal(const void *secret, size_t secret_len, const void *given,
                         size_t given_len) {
  const unsigned char *a = secret, *b = given;
  /* Every byte of the secret is looked at whatever given holds; a given of
   * another length reads zeros past its end and fails on the length.  The
   * time depends on the secret's length only, which is not the secret. */
  volatile unsigned char diff = (unsigned char)(secret_len != given_len);
  for (size_t i = 0; i < secret_len; i++) {
    unsigned char g = i < given_len ? b[i] : 0;
    diff = (unsigned char)(diff | (a[i] ^ g));
  }
  return diff == 0;
}
