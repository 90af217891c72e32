#!/usr/bin/env bash
# Installs what Grove needs to build and test on Debian 12, or, when not root,
# prints the exact command and fails.  Called by `make` (once: it leaves a
# stamp in the build folder) and by .ci/run.
#   scripts/deps.sh          build + test dependencies (C libraries, Check, clang
#                            for the fuzz targets' short pass)
#   scripts/deps.sh --torch  also python3-torch and python3-numpy (parity tests,
#                            the exporter, benchmarks)
set -euo pipefail
pkgs=(build-essential pkg-config libuv1-dev libnng-dev libprotobuf-c-dev protobuf-c-compiler
      libopenblas-dev check libjansson-dev zlib1g-dev clang libclang-rt-14-dev)
if [ "${1:-}" = "--torch" ]; then
  pkgs+=(python3-torch python3-numpy python3-sklearn)
fi
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
cmd="apt-get install -y --no-install-recommends ${missing[*]}"
if [ "$(id -u)" -ne 0 ]; then
  echo "grove: missing Debian packages: ${missing[*]}" >&2
  echo "grove: install them with: sudo apt-get update && sudo $cmd" >&2
  exit 1
fi
echo "grove: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -q >/dev/null
apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
