#!/usr/bin/env bash
# Installs the Debian 12 packages Grove needs, or, when not root, prints the
# exact command and fails.  Called by make through a stamp in build/ (the
# Makefile's "Dependencies"), before any rule that compiles, links or asks
# pkg-config anything; docs/building.md lists what each set holds and why.
#   scripts/deps.sh          building (`make`, `make run`): compilers, the C
#                            libraries and their headers, Check
#   scripts/deps.sh --test   `make test`: also clang (the fuzz targets' short
#                            pass), python3-torch and python3-numpy (fixtures,
#                            parity and integration tests), python3-torchvision
#                            (tests/py/test_zoo.py), python3-yaml and
#                            systemd and procps (deploy/'s manifests and the
#                            unit, whose ExecReload is /bin/kill, checked), curl
#                            (README's tour and the Open Inference Protocol tests
#                            drive groved's HTTP listener with it)
#   scripts/deps.sh --all    also python3-sklearn (examples/train_digits.py
#                            regenerates examples/digits; `make bench`)
#   (--torch is the old name of --all.)
set -euo pipefail
pkgs=(build-essential pkg-config libuv1-dev libnng-dev libprotobuf-c-dev protobuf-c-compiler
      libopenblas-dev check libjansson-dev zlib1g-dev)
test_pkgs=(clang libclang-rt-14-dev python3 python3-torch python3-torchvision python3-numpy python3-yaml
           systemd procps curl)
case "${1:-}" in
  "") ;;
  --test) pkgs+=("${test_pkgs[@]}") ;;
  --all|--torch) pkgs+=("${test_pkgs[@]}" python3-sklearn) ;;
  *) echo "usage: scripts/deps.sh [--test|--all]" >&2; exit 2 ;;
esac
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
case " ${missing[*]} " in
  *" python3-torch "*) echo "grove: (python3-torch and its libraries are about 1 GB to fetch)" >&2 ;;
esac
export DEBIAN_FRONTEND=noninteractive
# apt-get's output goes to a log; only a failure shows it.
mkdir -p build
log=build/deps.log
if ! { apt-get update -q && apt-get install -y -q --no-install-recommends "${missing[@]}"; } \
     >"$log" 2>&1; then
  tail -n 30 "$log" >&2
  echo "grove: installing failed (whole output: $log); the command was: apt-get update && $cmd" >&2
  exit 1
fi
echo "grove: installed (apt-get's output: $log)" >&2
