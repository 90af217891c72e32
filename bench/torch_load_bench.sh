#!/usr/bin/env bash
# bench/torch_load_bench.sh BENCH_BIN: loading a ~500 MB state_dict, Grove
# beside torch.load, in the same run on this machine.
#
#   1. /usr/bin/python3 writes a seeded state_dict of float32 weights
#      (GROVE_BENCH_MB, default 500) as weights.pt (torch.save) and
#      weights.safetensors (tools/grove_export.py's save_safetensors);
#   2. BENCH_BIN (bench/torch_load_bench.c) reads each ROUNDS times:
#      grove_checkpoint_read, then every byte touched;
#   3. torch.load(weights.pt, weights_only=True) and torch.load without it,
#      ROUNDS times each (torch copies every byte while loading, so its time
#      compares with Grove's "read + touch");
#   4. a table: seconds (best, median) and MB/s of the median.
#
# The files sit in the page cache (written just before): these are warm-cache
# figures, the case of a reload.  `make bench-torch-load` runs this.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bench=${1:?usage: bench/torch_load_bench.sh BENCH_BIN}
mb=${GROVE_BENCH_MB:-500}
rounds=${GROVE_BENCH_ROUNDS:-5}
python=/usr/bin/python3
work=$(mktemp -d "${TMPDIR:-/tmp}/grove-loadbench-XXXXXX")
trap 'rm -rf "$work"' EXIT

"$python" - "$work" "$mb" "$root" <<'PY'
import collections, os, sys
work, mb, root = sys.argv[1], int(sys.argv[2]), sys.argv[3]
sys.path.insert(0, os.path.join(root, "tools"))
import torch
from grove_export import save_safetensors
g = torch.Generator().manual_seed(1)
sd = collections.OrderedDict()
total, i = 0, 0
# Transformer-like shapes: 4 MB / 16 MB matrices with biases and norms.
while total < mb * 1000 * 1000:
    for name, shape in ((f"layers.{i}.attn.weight", (1024, 1024)),
                        (f"layers.{i}.attn.bias", (1024,)),
                        (f"layers.{i}.mlp.weight", (4096, 1024)),
                        (f"layers.{i}.mlp.bias", (4096,)),
                        (f"layers.{i}.norm.weight", (1024,))):
        sd[name] = torch.randn(*shape, generator=g)
        total += sd[name].numel() * 4
    i += 1
torch.save(sd, os.path.join(work, "weights.pt"))
save_safetensors(sd, os.path.join(work, "weights.safetensors"))
print(f"state_dict: {len(sd)} tensors, {total / 1e6:.0f} MB (float32)", file=sys.stderr)
PY

results="$work/results.jsonl"
for f in weights.pt weights.safetensors; do
  "$bench" "$work/$f" "$rounds" >>"$results"
done
"$python" - "$work" "$rounds" >>"$results" <<'PY'
import json, os, statistics, sys, time
import torch
work, rounds = sys.argv[1], int(sys.argv[2])
torch.set_num_threads(1)
path = os.path.join(work, "weights.pt")
for wo in (True, False):
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        sd = torch.load(path, weights_only=wo)
        times.append(time.perf_counter() - t0)
        nbytes = sum(t.numel() * t.element_size() for t in sd.values())
        del sd
    times.sort()
    med = times[len(times) // 2]
    print(json.dumps({"engine": "torch.load" + (" weights_only" if wo else ""),
                      "file": path, "bytes": nbytes, "rounds": rounds,
                      "read_touch_best_s": times[0], "read_touch_median_s": med,
                      "mb_per_s": nbytes / med / 1e6}))
PY

"$python" - "$results" <<'PY'
import json, os, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print(f"{'engine':<28} {'file':<20} {'read (s)':>15} {'read+touch (s)':>17} {'MB/s':>8}")
print(f"{'':<28} {'':<20} {'best / median':>15} {'best / median':>17} {'(median)':>8}")
for r in rows:
    read = (f"{r['read_best_s']:.3f} / {r['read_median_s']:.3f}" if "read_best_s" in r else "-")
    touch = f"{r['read_touch_best_s']:.3f} / {r['read_touch_median_s']:.3f}"
    print(f"{r['engine']:<28} {os.path.basename(r['file']):<20} {read:>15} {touch:>17} "
          f"{r['mb_per_s']:>8.0f}")
print(f"({rows[0]['bytes'] / 1e6:.0f} MB of tensors, {rows[0]['rounds']} rounds each, warm page cache)")
PY
