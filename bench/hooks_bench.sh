#!/usr/bin/env bash
# bench/hooks_bench.sh [BUILD_DIR]: what forward-hook telemetry costs predict
# (docs/telemetry.md, docs/performance.md "Hooks").
#
#   1. two models exported with tools/grove_export.py: the reference MLP
#      (Linear(784,1024) ReLU Linear(1024,1024) ReLU Linear(1024,10),
#      /work/shared/peers/models.py) and a small one (Linear(64,128) ReLU
#      Linear(128,128) ReLU Linear(128,10)), where a forward is short and a
#      hook's share of it the largest
#   2. groved (BUILD_DIR/groved, default build/release) serving both, RPC and
#      PUB on ipc sockets, nothing subscribed unless said
#   3. ROUNDS rounds; in each, for each model, every configuration in turn
#      (each round starting at the next one):
#        none      no hook (the path of a groved without hooks)
#        one       one forward hook on the last Linear
#        all       forward hooks on every module ('**'): nothing fuses
#        all+pre   every module, forward and forward_pre, with a 32-bin
#                  histogram and per-feature statistics (the heaviest)
#        all@1%    every module, 1% of batches sampled (--sample 0.01)
#        all+sub   'all' with `grove watch --json` reading every event
#      load: grove bench MODEL --concurrency 32 --batch 1 (as bench/server_bench.sh)
#   4. a table: median samples/s of each configuration, and relative to none
#
# GROVE_HOOKS_BENCH_BASE=DIR adds "before": DIR/groved, a build of Grove from
# before hooks existed (e.g. `git worktree add /tmp/base 41bdb75^ && make -C
# /tmp/base`), serving the same models, measured in each round too.
# Environment: GROVE_HOOKS_BENCH_ROUNDS (3), GROVE_HOOKS_BENCH_SECONDS (2),
# GROVE_PEERS (the peers folder).
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build/release}
case "$build" in /*) ;; *) build="$root/$build" ;; esac
grove_bin="$build/grove"
groved_bin="$build/groved"
rounds=${GROVE_HOOKS_BENCH_ROUNDS:-3}
seconds=${GROVE_HOOKS_BENCH_SECONDS:-2}
base=${GROVE_HOOKS_BENCH_BASE:-}
peers=${GROVE_PEERS:-$root/../shared/peers}
python=/usr/bin/python3
[ -x "$python" ] || python=python3

echo "== hooks: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
if [ ! -x "$groved_bin" ] || ! "$grove_bin" hook --help >/dev/null 2>&1; then
  echo "hooks bench: $groved_bin or a grove with 'hook' not found (run make first); skipped"
  exit 0
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/grove-hooks-bench-XXXXXX")
pids=()
watch_pid=
cleanup() {
  [ -n "$watch_pid" ] && kill "$watch_pid" 2>/dev/null && wait "$watch_pid" 2>/dev/null
  for p in "${pids[@]}"; do
    kill -TERM "$p" 2>/dev/null && wait "$p" 2>/dev/null
  done
  rm -rf "$work"
}
trap cleanup EXIT

cat >"$work/models.py" <<'EOF'
import importlib.util
import os
import sys

import torch
import torch.nn as nn


def mlp():
    peers = os.environ.get("PEERS_MODELS")
    if peers and os.path.exists(peers):
        spec = importlib.util.spec_from_file_location("peers_models", peers)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod.mlp()
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                         nn.Linear(1024, 10)).eval(), torch.randn(1, 784)


def small():
    torch.manual_seed(1)
    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(),
                         nn.Linear(128, 10)).eval(), torch.randn(1, 64)
EOF
for m in mlp small; do
  if ! PEERS_MODELS="$peers/models.py" "$python" "$root/tools/grove_export.py" \
    --builder "$work/models.py:$m" "$work/$m" --name "$m" --max-batch-size 64 \
    --max-queue-delay-us 500 >"$work/export.log" 2>&1; then
    echo "hooks bench: could not export $m:"
    sed 's/^/  /' "$work/export.log" | head -20
    exit 1
  fi
done

start() { # name groved-binary pub-flag...
  local name=$1 bin=$2
  shift 2
  # An admin plane of its own (the hook RPCs): the default address may be another groved's
  # on this machine.  A base from before the admin plane has no such flag.
  local admin=()
  "$bin" --help 2>&1 | grep -q -- --admin-listen && admin=(--admin-listen "ipc://$work/$name.admin")
  "$bin" --model "mlp=$work/mlp" --model "small=$work/small" --listen "ipc://$work/$name.sock" \
    --http none --log-level warn "${admin[@]}" "$@" 2>"$work/$name.log" &
  pids+=($!)
  for _ in $(seq 1 300); do
    [ -S "$work/$name.sock" ] && break
    sleep 0.05
  done
  if ! "$grove_bin" --server "ipc://$work/$name.sock" status >/dev/null 2>&1; then
    echo "hooks bench: groved ($name) did not come up:"
    sed 's/^/  /' "$work/$name.log" | tail -20
    exit 1
  fi
}
start hooks "$groved_bin" --pub "ipc://$work/pub.sock"
srv="ipc://$work/hooks.sock"
pub="ipc://$work/pub.sock"
[ -n "$base" ] && start base "$base/groved"
"$grove_bin" --server "$srv" status | grep -m1 '^server:'
echo "load: 32 clients x batch 1 (grove bench --concurrency 32), $rounds rounds of $seconds s"

g() { "$grove_bin" --server "$srv" --admin "ipc://$work/hooks.admin" "$@"; }
clear_hooks() {
  for id in $(g hook ls --json | sed -n 's/^{"id":\([0-9]*\),.*/\1/p'); do
    g hook rm "$id" >/dev/null
  done
}
configure() { # model config
  local m=$1 last=4
  clear_hooks
  case "$2" in
    none | before) ;;
    one) g hook add "$m" "$last" >/dev/null 2>&1 ;;
    all | all+sub) g hook add "$m" '**' >/dev/null 2>&1 ;;
    all+pre)
      g hook add "$m" '**' --stats histogram:32,per_feature >/dev/null 2>&1
      g hook add "$m" '**' --kind forward_pre --stats histogram:32,per_feature >/dev/null 2>&1
      ;;
    all@1%) g hook add "$m" '**' --sample 0.01 >/dev/null 2>&1 ;;
  esac
}

results="$work/results.txt"
: >"$results"
configs=(none one all all+pre all@1% all+sub)
[ -n "$base" ] && configs=(before "${configs[@]}")
n=${#configs[@]}
for r in $(seq 1 "$rounds"); do
  for m in mlp small; do
    # Each round starts at another configuration, so that none is always
    # measured first (on a warm or a cold machine).
    for k in $(seq 0 $((n - 1))); do
      c=${configs[$(((k + r - 1) % n))]}
      configure "$m" "$c"
      url=$srv
      [ "$c" = before ] && url="ipc://$work/base.sock"
      if [ "$c" = all+sub ]; then
        "$grove_bin" --pub "$pub" watch "$m" --json >/dev/null 2>&1 &
        watch_pid=$!
        sleep 0.2
      fi
      if "$grove_bin" --server "$url" bench "$m" --concurrency 32 --batch 1 \
        --seconds "$seconds" >"$work/run.out" 2>&1; then
        echo "$m $c $(tail -n 1 "$work/run.out")" >>"$results"
      else
        echo "  $m $c failed:"
        sed 's/^/    /' "$work/run.out" | tail -5
      fi
      if [ -n "$watch_pid" ]; then
        kill "$watch_pid" 2>/dev/null
        wait "$watch_pid" 2>/dev/null
        watch_pid=
      fi
    done
  done
  echo "  round $r done (load average $(cut -d' ' -f1 /proc/loadavg))"
done
clear_hooks

echo
"$python" - "$results" "${configs[@]}" <<'EOF'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    m, c, *kv = line.split()
    d = dict(f.split("=", 1) for f in kv)
    rows.setdefault((m, c), []).append(d)
configs = sys.argv[2:]
print(f"{'model':6} {'hooks':8} {'samples/s':>10} {'vs none':>8} {'p50 ms':>8} {'p99 ms':>8} "
      f"{'errors':>6}")
for m in ("mlp", "small"):
    none = rows.get((m, "none"), [])
    ref = statistics.median(float(x["samples_per_s"]) for x in none) if none else None
    for c in configs:
        r = rows.get((m, c), [])
        if not r:
            continue
        s = statistics.median(float(x["samples_per_s"]) for x in r)
        p50 = statistics.median(float(x["p50_ms"]) for x in r)
        p99 = statistics.median(float(x["p99_ms"]) for x in r)
        err = sum(int(x["errors"]) for x in r)
        rel = f"{100 * s / ref:.0f}%" if ref else "-"
        print(f"{m:6} {c:8} {s:10.0f} {rel:>8} {p50:8.3f} {p99:8.3f} {err:6d}")
EOF
