#!/usr/bin/env bash
# Prints the path of a Python interpreter that imports torch and numpy, or
# nothing (exit 1).  Debian's python3-torch lives under /usr/bin/python3; the
# python3 first on PATH may be another interpreter without it.
for py in "${GROVE_PYTHON:-}" /usr/bin/python3 python3; do
  [ -n "$py" ] || continue
  if "$py" -c 'import torch, numpy' >/dev/null 2>&1; then
    command -v "$py"
    exit 0
  fi
done
exit 1
