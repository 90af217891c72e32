#!/usr/bin/env bash
# bench/zoo.sh GROVE_BIN [MODELS]: the torchvision zoo (issue #18) beside ONNX Runtime and
# PyTorch: resnet50, mobilenet_v2, mobilenet_v3_large, efficientnet_b0, squeezenet1_1,
# densenet121, convnext_tiny and vit_b_16 (bench/zoo_models.py: torchvision.models.<name>(
# weights=None), eval mode, unchanged) at 224x224, batch 1 and 16.  The steps, rounds,
# medians and ratios are bench/cnn_transformer.sh's (one implementation of the
# three-engine comparison): every engine gets the same thread count, the engines alternate
# within each round, and the table shows each engine's median round with Grove/ORT and
# Grove/PyTorch from the same run.  A model Grove cannot run yet shows
# "not supported: <the exporter's refusal>" (and still gets its ORT and PyTorch figures).
#
# Environment as cnn_transformer.sh's, with other defaults: GROVE_BENCH_BATCHES (1,16),
# GROVE_BENCH_SECONDS (3), GROVE_BENCH_ROUNDS (3), GROVE_BENCH_WARMUP (2 forwards; a
# batch of 16 224x224 images is a second or more on two shared cores), GROVE_BENCH_THREADS
# (nproc), GROVE_BENCH_OPSET (14: ViT's attention exports from opset 14),
# GROVE_BENCH_EXPORT_ARGS (--max-batch-size 16: the largest batch measured here; opening
# sizes the scratch for it from trial forwards at batch 2 and 4, docs/model-spec.md).  Figures and the
# profile of what remains: docs/performance-models.md, "The torchvision zoo".
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
if [ -z "${1:-}" ]; then
  echo "usage: bench/zoo.sh GROVE_BIN [resnet50,mobilenet_v2,...]" >&2
  exit 2
fi
models=${2:-resnet50,mobilenet_v2,mobilenet_v3_large,efficientnet_b0,squeezenet1_1,densenet121,convnext_tiny,vit_b_16}
GROVE_BENCH_BUILDERS="$root/bench/zoo_models.py" \
GROVE_BENCH_TITLE="torchvision zoo (bench/zoo_models.py), 3x224x224" \
GROVE_BENCH_BATCHES=${GROVE_BENCH_BATCHES:-1,16} \
GROVE_BENCH_SECONDS=${GROVE_BENCH_SECONDS:-3} \
GROVE_BENCH_WARMUP=${GROVE_BENCH_WARMUP:-2} \
GROVE_BENCH_OPSET=${GROVE_BENCH_OPSET:-14} \
GROVE_BENCH_EXPORT_ARGS=${GROVE_BENCH_EXPORT_ARGS:---max-batch-size 16} \
  exec bash "$root/bench/cnn_transformer.sh" "$1" "$models"
