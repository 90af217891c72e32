#!/usr/bin/env bash
# bench/train_bench.sh [GROVE_BIN]: training steps per second on the reference MLP
# (Linear(784,1024) ReLU Linear(1024,1024) ReLU Linear(1024,10), /work/shared/peers/models.py)
# for a Grove training replica and for PyTorch, measured in the same run on this machine; with
# GROVE_TRAIN_MODELS=mlp,cnn also on bench/models_extra.py's small ResNet (3x32x32 images;
# convolutions, BatchNorm2d in train mode, residual adds, global pooling).
#
# A step is what a training loop does per batch: zero_grad(set_to_none), forward, CrossEntropyLoss,
# backward, optimizer step (SGD momentum 0.9, or AdamW with torch's defaults), on one fixed random
# batch so that only the step is timed.  Grove runs bench/train_bench.c (built here from
# libgrove.a next to GROVE_BIN) on the model exported by tools/grove_export.py from the same
# seeded builder; PyTorch runs the builder's module itself.  Both use GROVE_TRAIN_THREADS threads
# (torch.set_num_threads / grove_set_compute_threads).  Debian's torch does its matrix products in
# OpenBLAS (BLAS_INFO=generic), whose thread count torch.set_num_threads does not set: without
# OPENBLAS_NUM_THREADS, "one thread" of PyTorch multiplied on every core.
#
# Besides steps per second (wall time), each engine reports steps per CPU second (the CPU time of
# all its threads): on a shared host the latter moves less with other jobs, and with one thread it
# says how fast a step is on the core it got.
#
# The host is shared (2 vCPUs that other guests and other jobs use), so the two engines alternate
# for ROUNDS rounds and the table shows each one's best and median round.
# Environment: GROVE_TRAIN_MODELS (mlp), GROVE_TRAIN_BATCHES (64,256 for the MLP; the CNN
# always runs at 16 and 64), GROVE_TRAIN_OPTIMS (sgd,adamw), GROVE_TRAIN_SECONDS (2 per run),
# GROVE_TRAIN_ROUNDS (3), GROVE_TRAIN_THREADS (1), GROVE_PEERS (the peers folder).
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
grove_bin=${1:-$root/build/release/grove}
case "$grove_bin" in /*) ;; *) grove_bin="$root/$grove_bin" ;; esac
libgrove="$(dirname "$grove_bin")/libgrove.a"
models=${GROVE_TRAIN_MODELS:-mlp}
batches=${GROVE_TRAIN_BATCHES:-64,256}
optims=${GROVE_TRAIN_OPTIMS:-sgd,adamw}
seconds=${GROVE_TRAIN_SECONDS:-2}
rounds=${GROVE_TRAIN_ROUNDS:-3}
threads=${GROVE_TRAIN_THREADS:-1}
peers=${GROVE_PEERS:-$root/../shared/peers}
python=/usr/bin/python3
[ -x "$python" ] || python=python3

if [ ! -f "$libgrove" ]; then
  echo "train_bench: $libgrove not found (run make first)" >&2
  exit 1
fi
work=$(mktemp -d "${TMPDIR:-/tmp}/grove-train-bench-XXXXXX")
trap 'rm -rf "$work"' EXIT

${CC:-cc} -O2 -std=c11 -D_POSIX_C_SOURCE=200809L -D_DEFAULT_SOURCE -pthread \
  -I"$root/include" -I"$root/core" $(pkg-config --cflags openblas 2>/dev/null) \
  "$root/bench/train_bench.c" "$libgrove" -o "$work/train_bench" \
  $(pkg-config --libs jansson openblas zlib 2>/dev/null) -lm || {
  echo "train_bench: cannot build bench/train_bench.c" >&2
  exit 1
}
for model in ${models//,/ }; do
  case "$model" in
    mlp) builder="$peers/models.py:mlp" ;;
    cnn) builder="$root/bench/models_extra.py:cnn" ;;
    *)
      echo "train_bench: GROVE_TRAIN_MODELS: '$model' is not mlp or cnn" >&2
      exit 2
      ;;
  esac
  "$python" "$root/tools/grove_export.py" --builder "$builder" "$work/$model" >/dev/null || {
    echo "train_bench: cannot export the $model model (needs python3-torch)" >&2
    exit 1
  }
done

cat >"$work/torch_train.py" <<'EOF'
import json, sys, time
import torch, torch.nn as nn
sys.path.insert(0, sys.argv[1])
sys.path.insert(0, sys.argv[7])
batch, optim, seconds, threads = int(sys.argv[2]), sys.argv[3], float(sys.argv[4]), int(sys.argv[5])
model = sys.argv[6]
torch.set_num_threads(threads)
if model == "mlp":
    from models import mlp as build
else:
    from models_extra import cnn as build
m, example = build()
m.train()
g = torch.Generator().manual_seed(42)
x = torch.rand((batch,) + tuple(example.shape[1:]), generator=g) * 2 - 1
y = torch.arange(batch) * 7 % 10
opt = (torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9) if optim == "sgd"
       else torch.optim.AdamW(m.parameters()))
loss_fn = nn.CrossEntropyLoss()
def step():
    opt.zero_grad(set_to_none=True)
    loss = loss_fn(m(x), y)
    loss.backward()
    opt.step()
for _ in range(3):
    step()
n, c0, t0 = 0, time.process_time(), time.monotonic()
t1 = t0
while t1 - t0 < seconds:
    step()
    n += 1
    t1 = time.monotonic()
c1 = time.process_time()
print(json.dumps({"engine": "torch", "model": model, "batch": batch, "optim": optim,
                  "threads": threads,
                  "steps_per_s": round(n / (t1 - t0), 2),
                  "steps_per_cpu_s": round(n / (c1 - c0), 2)}))
EOF

echo "== machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')," \
  "torch $("$python" -c 'import torch; print(torch.__version__)' 2>/dev/null)," \
  "OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset}, load average $(cut -d' ' -f1-3 /proc/loadavg)"
results="$work/results.jsonl"
: >"$results"
for ((r = 1; r <= rounds; r++)); do
  for model in ${models//,/ }; do
    model_batches=$batches
    [ "$model" = cnn ] && model_batches=16,64
    for b in ${model_batches//,/ }; do
      for o in ${optims//,/ }; do
        OPENBLAS_NUM_THREADS=$threads OMP_NUM_THREADS=$threads \
          "$python" "$work/torch_train.py" "$peers" "$b" "$o" "$seconds" "$threads" "$model" \
          "$root/bench" >>"$results" || echo "torch run failed ($model, batch $b, $o)" >&2
        "$work/train_bench" --model "$work/$model" --batch "$b" --optim "$o" \
          --seconds "$seconds" --threads "$threads" |
          sed "s/^{/{\"model\": \"$model\", /" >>"$results" ||
          echo "grove run failed ($model, batch $b, $o)" >&2
      done
    done
  done
done

"$python" - "$results" "$threads" "$rounds" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
threads, rounds = sys.argv[2], sys.argv[3]
keys = sorted({(r["model"], r["batch"], r["optim"]) for r in rows},
              key=lambda k: (k[0] != "mlp", k[0], k[2], k[1]))
names = {"mlp": "reference MLP", "cnn": "small ResNet"}
for what, field in (("training steps/s", "steps_per_s"),
                    ("training steps per CPU second (all threads)", "steps_per_cpu_s")):
    print(f"\n== {what}, {threads} thread(s), best | median of {rounds} rounds")
    print(f"{'model':13} {'optimizer':9} {'batch':>5}  {'Grove':>15}  {'PyTorch':>15}  "
          f"{'Grove/PyTorch':>13}")
    for mo, b, o in keys:
        def pick(engine):
            v = [r[field] for r in rows if r["engine"] == engine and r["model"] == mo
                 and r["batch"] == b and r["optim"] == o and field in r]
            return (max(v), statistics.median(v)) if v else (float("nan"), float("nan"))
        g, t = pick("grove"), pick("torch")
        print(f"{names[mo]:13} {o:9} {b:>5}  {g[0]:7.1f} | {g[1]:5.1f}  {t[0]:7.1f} | "
              f"{t[1]:5.1f}  {g[0] / t[0]:5.2f} | {g[1] / t[1]:4.2f}")
EOF
