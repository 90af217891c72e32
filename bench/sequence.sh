#!/usr/bin/env bash
# bench/sequence.sh GROVE_BIN [MODELS]: Grove beside PyTorch and ONNX Runtime on the sequence
# models of issue #19 (bench/models_seq.py): an LSTM classifier (Embedding 1000x128, 2-layer
# LSTM 256, 32 tokens), a 4-layer BERT-like encoder (hidden 256, 4 heads, 128 tokens, a padding
# mask) and a 2-layer decoder with a causal mask (64 tokens), measured in the same run on this
# machine.  MODELS is "lstm,bert,decoder" by default.  bench/run.sh (make bench) calls it.
#
#   1. tools/grove_export.py on the builder's model and example inputs (Grove's directory; its
#      inputs' sequence length is then fixed to the example's, so that grove bench runs the
#      benchmark's length instead of its default 16 for a free dimension).  A model Grove
#      cannot run yet prints "grove: MODEL not supported: <the exporter's reason>" and its
#      row shows only the peers.
#   2. PyTorch: the same builder, timed in-process; it also writes MODEL.onnx (opset 14)
#   3. ONNX Runtime (npm's onnxruntime-node, CPU) on MODEL.onnx
#   4. GROVE_BIN bench --local DIR --batch B --seconds S --threads T
#   5. a table of samples/s (median of rounds) with Grove/ORT and Grove/PyTorch ratios
#
# Steps 2-4 alternate for ROUNDS rounds (the 2-vCPU host is shared with other guests).  Every
# engine gets the same threads (torch threads, ORT intra-op threads, Grove's compute threads):
# GROVE_BENCH_THREADS, default every core.  Inputs: PyTorch and ONNX Runtime get token ids in
# [1, 1000) (the BERT-like's padding mask then masks nothing; Grove's bench sends ids 0, which
# costs the same).  Environment: GROVE_SEQ_BATCHES (1,16), GROVE_BENCH_SECONDS (2),
# GROVE_BENCH_ROUNDS (3), GROVE_BENCH_THREADS (nproc), PEER_OUT (onnxruntime-node's folder,
# default /tmp/grove-peers, shared with bench/cnn_transformer.sh).
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
grove_bin=${1:-}
models=${2:-lstm,bert,decoder}
if [ -z "$grove_bin" ]; then
  echo "usage: bench/sequence.sh GROVE_BIN [lstm,bert,decoder]" >&2
  exit 2
fi
. "$root/bench/peers_lib.sh"
peers_settings
batches=${GROVE_SEQ_BATCHES:-1,16}

peers_workdir grove-bench-seq

# ------------------------------------------------------------------ Grove's directories
cat >"$work/export.py" <<'PY'
import json, os, sys
sys.path.insert(0, sys.argv[1])
sys.path.insert(0, sys.argv[2])
from models_seq import BUILDERS
from grove_export import export, ExportError
name, out = sys.argv[3], sys.argv[4]
m, xs = BUILDERS[name]()
try:
    export(m, out, example_input=xs)
except ExportError as e:
    print(f"not supported: {e}")
    sys.exit(1)
# The benchmark's lengths, not a free dimension (grove bench fills those with 16).
p = os.path.join(out, "model.json")
doc = json.load(open(p))
for spec, x in zip(doc["inputs"], xs):
    spec["shape"] = [-1] + list(x.shape[1:])
json.dump(doc, open(p, "w"), indent=1)
PY

# ------------------------------------------------------------------ PyTorch (+ ONNX files)
cat >"$work/torch_bench.py" <<'PY'
import json, os, sys, warnings
warnings.filterwarnings("ignore")
sys.path.insert(0, sys.argv[1])
import torch
from models_seq import BUILDERS
from peers_torch import time_forward
out, name, batches, threads, seconds, write_onnx = sys.argv[2:8]
torch.set_num_threads(int(threads))
m, xs = BUILDERS[name]()
names = [f"in{i}" for i in range(len(xs))]
if write_onnx == "1":
    path = os.path.join(out, f"{name}.onnx")
    try:
        torch.onnx.export(m, xs, path, input_names=names, output_names=["y"],
                          dynamic_axes=dict({n: {0: "b"} for n in names}, y={0: "b"}),
                          opset_version=14)
        meta = [{"shape": list(x.shape[1:]), "dtype": str(x.dtype).replace("torch.", "")}
                for x in xs]
        json.dump(meta, open(os.path.join(out, f"{name}.meta.json"), "w"))
    except Exception as e:  # the table shows no ORT figure; say why once
        print(f"onnx export of {name} failed: {type(e).__name__}: {str(e)[:200]}", file=sys.stderr)
for b in [int(s) for s in batches.split(",")]:
    time_forward(m, [t.expand(b, *t.shape[1:]).contiguous() for t in xs], name, b,
                 float(seconds), 3)
PY

peers_install_ort

echo "== sequence models (bench/models_seq.py): $threads thread(s) per engine on $(nproc) cores," \
  "batches $batches, $rounds rounds"
have_grove=1
[ -x "$grove_bin" ] || { echo "grove: $grove_bin not found (run make first)"; have_grove=0; }
for model in ${models//,/ }; do
  if [ "$have_grove" = 1 ] &&
    ! "$python" "$work/export.py" "$root/bench" "$root/tools" "$model" "$work/$model" \
      >"$work/export.log" 2>&1; then
    echo "grove: $model $(grep -m1 'not supported' "$work/export.log" || tail -1 "$work/export.log")" |
      cut -c1-300
  fi
done

for r in $(seq 1 "$rounds"); do
  for model in ${models//,/ }; do
    first=$([ "$r" = 1 ] && echo 1 || echo 0)
    if ! "$python" "$work/torch_bench.py" "$root/bench" "$work" "$model" "$batches" "$threads" \
      "$seconds" "$first" >"$work/torch.out" 2>"$work/torch.err"; then
      echo "pytorch: $model failed (round $r):"
      tail -5 "$work/torch.err" | sed 's/^/  /'
    elif [ "$first" = 1 ] && grep -q 'onnx export' "$work/torch.err"; then
      grep 'onnx export' "$work/torch.err"
    fi
    grep '^{' "$work/torch.out" >>"$results"
    peers_run_ort "$model" "$r" 3 1
    peers_run_grove "$model"
  done
  echo "  round $r done (load average $(cut -d' ' -f1 /proc/loadavg))"
done

echo
"$python" "$root/bench/peers_table.py" "$results" "$batches" "$models"
