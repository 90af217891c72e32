# bench/peers_lib.sh: the steps bench/sequence.sh and bench/cnn_transformer.sh share, sourced
# by both (not run on its own): installing ONNX Runtime (npm's onnxruntime-node) once into
# PEER_OUT, and one round's ONNX Runtime (bench/ort_bench.js) and Grove runs of a model, each
# appending JSON lines to the caller's results file.  The callers set root, grove_bin and
# batches, then call peers_settings and peers_workdir, which set the rest.

# peers_settings: grove_bin made absolute (from $root), and the settings every peers bench
# reads the same way: seconds (GROVE_BENCH_SECONDS, 2), rounds (GROVE_BENCH_ROUNDS, 3),
# peer_out (PEER_OUT, /tmp/grove-peers), threads (GROVE_BENCH_THREADS, every core), python.
peers_settings() {
  case "$grove_bin" in /*) ;; *) grove_bin="$root/$grove_bin" ;; esac
  seconds=${GROVE_BENCH_SECONDS:-2}
  rounds=${GROVE_BENCH_ROUNDS:-3}
  peer_out=${PEER_OUT:-/tmp/grove-peers}
  threads=${GROVE_BENCH_THREADS:-$(nproc)}
  python=/usr/bin/python3
  [ -x "$python" ] || python=python3
}

# peers_workdir PREFIX: work, a fresh folder under TMPDIR removed at exit, and results, its
# empty JSON-lines file.
peers_workdir() {
  work=$(mktemp -d "${TMPDIR:-/tmp}/$1-XXXXXX")
  trap 'rm -rf "$work"' EXIT
  results="$work/results.jsonl"
  : >"$results"
}

# peers_install_ort: sets have_ort to 1 when node and onnxruntime-node (installed into
# $peer_out on first use, shared between the benches) are there, else 0 with a line saying why.
peers_install_ort() {
  have_ort=1
  if ! command -v node >/dev/null; then
    echo "onnxruntime: node not found; skipping ONNX Runtime"
    have_ort=0
  elif [ ! -d "$peer_out/node_modules/onnxruntime-node" ]; then
    mkdir -p "$peer_out"
    if ! (cd "$peer_out" && npm install --silent --ignore-scripts onnxruntime-node@1.30.0 >/dev/null 2>&1); then
      echo "onnxruntime: could not install onnxruntime-node into $peer_out; skipping ONNX Runtime"
      have_ort=0
    fi
  fi
}

# peers_run_ort MODEL ROUND WARMUP ID_BASE: bench/ort_bench.js on $work/MODEL.onnx and
# $work/MODEL.meta.json (when the PyTorch step wrote them and ORT is installed), WARMUP runs
# before the timing, the first int64 input's token ids from ID_BASE.
peers_run_ort() {
  local model=$1 r=$2 warmup=$3 id_base=$4
  [ "$have_ort" = 1 ] && [ -f "$work/$model.onnx" ] || return 0
  if ! NODE_PATH="$peer_out/node_modules" node "$root/bench/ort_bench.js" "$work/$model.onnx" \
    "$model" "$batches" "$threads" "$seconds" "$work/$model.meta.json" "$warmup" "$id_base" \
    >"$work/ort.out" 2>"$work/ort.err"; then
    echo "onnxruntime: $model failed (round $r):"
    tail -5 "$work/ort.err" | sed 's/^/  /'
  fi
  grep '^{' "$work/ort.out" >>"$results"
}

# peers_run_grove MODEL: GROVE_BIN bench --local $work/MODEL at each batch (when the export
# step wrote the directory), its last line turned into the table's JSON.
peers_run_grove() {
  local model=$1 b
  [ "$have_grove" = 1 ] && [ -f "$work/$model/model.json" ] || return 0
  for b in ${batches//,/ }; do
    if ! "$grove_bin" bench --local "$work/$model" --batch "$b" --seconds "$seconds" \
      --threads "$threads" >"$work/grove.out" 2>&1; then
      echo "grove: $model bench failed at batch $b:"
      tail -5 "$work/grove.out" | sed 's/^/  /'
      continue
    fi
    tail -n 1 "$work/grove.out" | "$python" -c '
import json, sys
kv = dict(f.split("=", 1) for f in sys.stdin.read().split())
print(json.dumps({"engine": "grove", "model": sys.argv[1], "batch": int(kv["batch"]),
                  "samples_per_s": float(kv["samples_per_s"]),
                  "ms_per_batch": float(kv["ms_per_batch"])}))' "$model" >>"$results"
  done
}
