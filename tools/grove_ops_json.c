/* grove_ops_json: prints the op table (core/nn/ops.h) as JSON; `make
 * ops-json` writes its output to tools/grove_ops.json, which the exporter
 * reads.  Usage: grove_ops_json > tools/grove_ops.json */
#include <jansson.h>
#include <stdio.h>

#include "ops.h"

int main(void) {
  json_t *j = grove__ops_json();
  if (!j) return 1;
  int rc = json_dumpf(j, stdout, JSON_INDENT(1) | JSON_PRESERVE_ORDER) ? 1 : 0;
  fputc('\n', stdout);
  json_decref(j);
  return rc;
}
