#!/usr/bin/env bash
# bench/run.sh GROVE_BIN: Grove beside PyTorch and ONNX Runtime on the reference MLP
# (Linear(784,1024) ReLU Linear(1024,1024) ReLU Linear(1024,10), /work/shared/peers/models.py),
# measured in the same run on this machine, the GEMM micro-benchmark, and bench/sequence.sh (the
# LSTM, BERT-like and decoder models of issue #19).  `make bench` calls it.
#
#   1. ../shared/peers/run.sh mlp BATCHES  (PyTorch and ONNX Runtime; JSON lines)
#   2. tools/grove_export.py --builder PEERS/models.py:mlp DIR  (the same seeded weights)
#   3. GROVE_BIN bench --local DIR --batch B --seconds S  for each batch
#   4. a table of samples/s with Grove/ORT and Grove/PyTorch ratios
#
# The host this runs on is shared (a 2-vCPU VM whose cores other guests also use), so steps 1
# and 3 alternate for ROUNDS rounds and the tables show each engine's best and median round
# (the best is the least disturbed by other guests; the median is the typical one).
# Environment: GROVE_BENCH_BATCHES (1,64,256), GROVE_BENCH_SECONDS (2, per Grove run),
# GROVE_BENCH_ROUNDS (3), GROVE_PEERS (the peers folder), PEER_OUT (peers' scratch folder).
# OPENBLAS_CORETYPE is left as the environment has it; the micro-benchmark is also run without
# it, to show what OpenBLAS picks by itself.
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
grove_bin=${1:-}
if [ -z "$grove_bin" ]; then
  echo "usage: bench/run.sh GROVE_BIN" >&2
  exit 2
fi
case "$grove_bin" in /*) ;; *) grove_bin="$root/$grove_bin" ;; esac
batches=${GROVE_BENCH_BATCHES:-1,64,256}
seconds=${GROVE_BENCH_SECONDS:-2}
rounds=${GROVE_BENCH_ROUNDS:-3}
peers=${GROVE_PEERS:-$root/../shared/peers}
python=/usr/bin/python3
[ -x "$python" ] || python=python3

work=$(mktemp -d "${TMPDIR:-/tmp}/grove-bench-XXXXXX")
trap 'rm -rf "$work"' EXIT
results="$work/results.jsonl"
: >"$results"

echo "== machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')," \
  "OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-(unset)}, load average $(cut -d' ' -f1-3 /proc/loadavg)"
busy() { awk -v n="$(nproc)" '{ exit !($1 > 0.3 * n) }' /proc/loadavg; }
if busy; then
  echo "warning: the machine is busy (load average above); figures will be noisy"
fi

# ------------------------------------------------------------------ GEMM micro-benchmark
# Built straight from libgrove.a next to GROVE_BIN, so it needs no Makefile rule.
libgrove="$(dirname "$grove_bin")/libgrove.a"
gemm_bench="$work/gemm_bench"
if [ -f "$libgrove" ] &&
  ${CC:-cc} -O2 -std=c11 -D_POSIX_C_SOURCE=200809L -D_DEFAULT_SOURCE -pthread \
    -I"$root/include" -I"$root/core" $(pkg-config --cflags openblas 2>/dev/null) \
    "$root/bench/gemm_bench.c" "$libgrove" -o "$gemm_bench" \
    $(pkg-config --libs jansson openblas 2>/dev/null) -lm 2>"$work/cc.log"; then
  echo
  echo "== GEMM micro-benchmark (bench/gemm_bench.c): the MLP's three layers chained, ReLU fused"
  "$gemm_bench" --batches "$batches" --seconds "$seconds" --rounds 5
  if [ -n "${OPENBLAS_CORETYPE:-}" ]; then
    echo "-- the same with OPENBLAS_CORETYPE unset (OpenBLAS picks its kernels itself):"
    env -u OPENBLAS_CORETYPE "$gemm_bench" --batches "$batches" --seconds "$seconds" --rounds 5 |
      grep -v 'max |grove'
  fi
else
  echo "gemm micro-benchmark: skipped (no $libgrove, or it did not compile:" \
    "$(head -c 300 "$work/cc.log" 2>/dev/null))"
fi

# ------------------------------------------------------------------ the reference MLP, exported
have_peers=1
if [ ! -x "$peers/run.sh" ] || [ ! -f "$peers/models.py" ]; then
  echo
  echo "peers: $peers/run.sh not found; skipping PyTorch and ONNX Runtime (set GROVE_PEERS)"
  have_peers=0
  # The same builder as peers/models.py, so Grove still has its model.
  builder="$root/bench/models_extra.py:mlp"
else
  builder="$peers/models.py:mlp"
fi

model_dir="$work/mlp"
have_grove=1
if ! "$python" "$root/tools/grove_export.py" --builder "$builder" "$model_dir" >"$work/export.log" 2>&1; then
  echo
  echo "grove: could not export the reference MLP with tools/grove_export.py:"
  sed 's/^/  /' "$work/export.log" | head -20
  have_grove=0
elif [ ! -x "$grove_bin" ]; then
  echo
  echo "grove: $grove_bin not found (run make first); skipping Grove's end-to-end figures"
  have_grove=0
elif ! "$grove_bin" bench --help >/dev/null 2>&1; then
  echo
  echo "grove: '$grove_bin bench' is not available in this build; skipping Grove's end-to-end figures"
  have_grove=0
fi

# ------------------------------------------------------------------ rounds
echo
echo "== reference MLP end to end: $rounds rounds of peers then Grove, batches $batches"
for r in $(seq 1 "$rounds"); do
  if [ "$have_peers" = 1 ]; then
    if bash "$peers/run.sh" mlp "$batches" >"$work/peers.out" 2>"$work/peers.err"; then
      grep '^{' "$work/peers.out" | "$python" -c '
import json, sys
r = int(sys.argv[1])
for line in sys.stdin:
    d = json.loads(line); d["round"] = r; print(json.dumps(d))' "$r" >>"$results"
    else
      echo "peers: run.sh failed (round $r); skipping peers:"
      sed 's/^/  /' "$work/peers.err" | tail -5
      have_peers=0
    fi
  fi
  if [ "$have_grove" = 1 ]; then
    for b in ${batches//,/ }; do
      if ! "$grove_bin" bench --local "$model_dir" --batch "$b" --seconds "$seconds" \
        >"$work/grove.out" 2>&1; then
        echo "grove: bench failed at batch $b:"
        sed 's/^/  /' "$work/grove.out" | tail -5
        have_grove=0
        break
      fi
      # Last line: batch=B samples_per_s=X ms_per_batch=X
      tail -n 1 "$work/grove.out" | "$python" -c '
import json, sys
r = int(sys.argv[1])
kv = dict(f.split("=", 1) for f in sys.stdin.read().split())
print(json.dumps({"engine": "grove", "model": "mlp", "batch": int(kv["batch"]),
                  "samples_per_s": float(kv["samples_per_s"]),
                  "ms_per_batch": float(kv["ms_per_batch"]), "round": r}))' "$r" >>"$results"
    done
  fi
  echo "  round $r done (load average $(cut -d' ' -f1 /proc/loadavg))"
done

# ------------------------------------------------------------------ table
echo
"$python" - "$results" "$batches" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
batches = [int(b) for b in sys.argv[2].split(",")]
if not rows:
    print("no figures (see the messages above)")
    sys.exit(0)
def family(e):
    return "grove" if e == "grove" else "ort" if e.startswith("onnxruntime") else \
           "torch" if e.startswith("torch") else e
names = {}
for r in rows:
    names.setdefault(family(r["engine"]), r["engine"])
print("reference MLP, samples/s; ratios from the same run")
print("engines: " + ", ".join(names[f] for f in ("grove", "ort", "torch") if f in names))
def fmt(x, w, p=1):
    return f"{x:>{w}.{p}f}" if x is not None else f"{'-':>{w}}"
for title, agg in (("best round", max), ("median round", statistics.median)):
    print(f"-- {title}")
    print(f"{'batch':>6} {'grove':>11} {'onnxruntime':>12} {'pytorch':>11} {'grove/ORT':>10} "
          f"{'grove/torch':>12}")
    for b in batches:
        v = {}
        for fam in ("grove", "ort", "torch"):
            xs = [r["samples_per_s"] for r in rows if family(r["engine"]) == fam and r["batch"] == b]
            v[fam] = agg(xs) if xs else None
        g, o, t = v["grove"], v["ort"], v["torch"]
        print(f"{b:>6} {fmt(g, 11)} {fmt(o, 12)} {fmt(t, 11)} "
              f"{fmt(g / o if g and o else None, 10, 2)} {fmt(g / t if g and t else None, 12, 2)}")
EOF

# ------------------------------------------------------------------ sequence models (#19)
echo
bash "$root/bench/sequence.sh" "$grove_bin"
