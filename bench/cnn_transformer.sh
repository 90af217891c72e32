#!/usr/bin/env bash
# bench/cnn_transformer.sh GROVE_BIN [MODELS]: Grove beside PyTorch and ONNX Runtime on the
# CNN and the transformer of bench/models_extra.py (graphs: conv/BatchNorm/ReLU, residual
# adds, attention), measured in the same run on this machine.  MODELS is "cnn,transformer"
# by default.  bench/run.sh may call it after its MLP table:
#
#     bash bench/cnn_transformer.sh "$grove_bin"
#
#   1. tools/grove_export.py --builder bench/models_extra.py:MODEL DIR   (Grove's directory)
#   2. PyTorch: the same builder, timed in-process; it also writes MODEL.onnx (opset 13)
#   3. ONNX Runtime (npm's onnxruntime-node, CPU) on MODEL.onnx
#   4. GROVE_BIN bench --local DIR --batch B --seconds S
#   5. a table of samples/s per model with Grove/ORT and Grove/PyTorch ratios
#
# Steps 2-4 alternate for ROUNDS rounds (the 2-vCPU host is shared with other guests) and the
# table shows each engine's median round.  Every engine gets the same number of threads
# (torch threads, ORT intra-op threads, Grove's compute threads): GROVE_BENCH_THREADS, default
# every core.  On the shared 2-vCPU host each engine ran faster on one thread than on two when
# this was written, so both are worth a look.  Environment: GROVE_BENCH_BATCHES (1,64),
# GROVE_BENCH_SECONDS (2), GROVE_BENCH_ROUNDS (3), GROVE_BENCH_THREADS (nproc), PEER_OUT
# (onnxruntime-node's folder, default /tmp/grove-peers, shared with ../shared/peers/run.sh).
# bench/zoo.sh runs the same steps on other models: GROVE_BENCH_BUILDERS (a Python file whose
# BUILDERS dict and functions of the same names build them; default bench/models_extra.py),
# GROVE_BENCH_TITLE (the heading), GROVE_BENCH_OPSET (13), GROVE_BENCH_WARMUP (5 forwards),
# GROVE_BENCH_EXPORT_ARGS (more tools/grove_export.py options, e.g. --max-batch-size 16).
# A model the exporter refuses is shown as "not supported: <the refusal>".
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
grove_bin=${1:-}
models=${2:-cnn,transformer}
if [ -z "$grove_bin" ]; then
  echo "usage: bench/cnn_transformer.sh GROVE_BIN [cnn,transformer]" >&2
  exit 2
fi
. "$root/bench/peers_lib.sh"
peers_settings
batches=${GROVE_BENCH_BATCHES:-1,64}
builders=${GROVE_BENCH_BUILDERS:-$root/bench/models_extra.py}
case "$builders" in /*) ;; *) builders="$root/$builders" ;; esac
title=${GROVE_BENCH_TITLE:-"CNN and transformer (bench/models_extra.py)"}
opset=${GROVE_BENCH_OPSET:-13}
warmup=${GROVE_BENCH_WARMUP:-5}

peers_workdir grove-bench-extra

# ------------------------------------------------------------------ PyTorch (+ ONNX files)
cat >"$work/torch_bench.py" <<'PY'
import importlib.util, json, os, sys
import torch
sys.path.insert(0, sys.argv[10])
from peers_torch import time_forward
spec = importlib.util.spec_from_file_location("bench_builders", sys.argv[1])
builders = importlib.util.module_from_spec(spec)
spec.loader.exec_module(builders)
out, name, batches, threads, seconds, write_onnx, opset, warmup = sys.argv[2:10]
torch.set_num_threads(int(threads))
m, x1 = builders.BUILDERS[name]()
if write_onnx == "1":
    path = os.path.join(out, f"{name}.onnx")
    try:
        torch.onnx.export(m, x1, path, input_names=["x"], output_names=["y"],
                          dynamic_axes={"x": {0: "b"}, "y": {0: "b"}}, opset_version=int(opset))
    except Exception as e:  # ORT is then left out for this model; torch still runs
        print(f"onnx: {name}: torch.onnx.export failed: {type(e).__name__}: {e}"[:300],
              file=sys.stderr)
    meta = {"shape": list(x1.shape[1:]), "dtype": "int64" if x1.dtype == torch.int64 else "float32"}
    json.dump(meta, open(os.path.join(out, f"{name}.meta.json"), "w"))
for b in [int(s) for s in batches.split(",")]:
    if x1.dtype == torch.int64:
        x = torch.randint(0, 1000, (b, *x1.shape[1:]))
    else:
        x = torch.randn(b, *x1.shape[1:])
    time_forward(m, [x], name, b, float(seconds), int(warmup))
PY

peers_install_ort

echo "== $title: $threads thread(s) per engine on $(nproc) cores," \
  "batches $batches, $rounds rounds"
have_grove=1
[ -x "$grove_bin" ] || { echo "grove: $grove_bin not found (run make first)"; have_grove=0; }
for model in ${models//,/ }; do
  if [ "$have_grove" = 1 ] &&
    ! "$python" "$root/tools/grove_export.py" --builder "$builders:$model" \
      ${GROVE_BENCH_EXPORT_ARGS:-} "$work/$model" >"$work/export.log" 2>&1; then
    # The exporter's refusal names the layer or operation; the table repeats it.
    reason=$(grep -v '^\s*$' "$work/export.log" | tail -n 1 | sed 's/^grove_export: //; s/ (supported: .*//; s/\. Supported: .*//')
    echo "grove: $model not supported: $reason"
    printf '%s\t%s\n' "$model" "$reason" >>"$work/unsupported.tsv"
  fi
done

for r in $(seq 1 "$rounds"); do
  for model in ${models//,/ }; do
    first=$([ "$r" = 1 ] && echo 1 || echo 0)
    if ! "$python" "$work/torch_bench.py" "$builders" "$work" "$model" "$batches" "$threads" \
      "$seconds" "$first" "$opset" "$warmup" "$root/bench" >"$work/torch.out" 2>"$work/torch.err"; then
      echo "pytorch: $model failed (round $r):"
      tail -5 "$work/torch.err" | sed 's/^/  /'
    fi
    grep '^{' "$work/torch.out" >>"$results"
    [ "$first" = 1 ] && grep '^onnx: ' "$work/torch.err"
    peers_run_ort "$model" "$r" "$warmup" 0
    peers_run_grove "$model"
  done
  echo "  round $r done"
done

echo
touch "$work/unsupported.tsv"
"$python" "$root/bench/peers_table.py" "$results" "$batches" "$models" "$work/unsupported.tsv"
