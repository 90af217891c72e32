#!/usr/bin/env bash
# bench/server_bench.sh GROVE_BIN: groved on the reference MLP (Linear(784,1024) ReLU
# Linear(1024,1024) ReLU Linear(1024,10), /work/shared/peers/models.py), beside the same model
# run in-process by `grove bench --local`, in the same run on this machine.
#
#   1. tools/grove_export.py --builder PEERS/models.py:mlp DIR  (seeded weights)
#   2. groved (next to GROVE_BIN) serving DIR on an ipc socket and on 127.0.0.1
#   3. ROUNDS rounds, each alternating:
#        grove bench --local DIR --batch 32                        (throughput reference)
#        grove --server ipc bench mlp --concurrency 32 --batch 1    (32 clients, one row each)
#        grove --server tcp bench mlp --concurrency 32 --batch 1
#        bench/oip_load: OIP JSON infers, 32 keep-alive connections x batch 1 (HTTP listener)
#        bench/oip_load: OIP binary tensor data infers, likewise
#        bench/sp_load: 32 SP connections x batch 1 over ipc and tcp (groved's data plane with
#          a client of one thread and no NNG: groved's own capacity)
#        grove bench --local DIR --batch 1 --threads T              (one forward, T = blas threads)
#        grove --server ipc bench mlp --concurrency 1 --batch 1     (one client: latency), tcp too
#        bench/sp_load: one connection over ipc
#      the grove rows once per client transport of GROVE_SERVER_BENCH_CLIENT_IO (default
#      "sp nng": libgrove-client's SP transport, then NNG's req0; GROVE_CLIENT_IO), in turn
#   4. a table (best and median round): server samples/s against local batch 32, p50/p99,
#      the OIP rows against the NNG tcp row of the same round, and the latency one client adds
#      over a local forward (server p50 - local ms/batch).
#
# The bench client runs on the same machine as groved and takes its share of the cores, as
# it would for any client on the box.  Environment: GROVE_SERVER_BENCH_ROUNDS (3),
# GROVE_SERVER_BENCH_SECONDS (3), GROVE_SERVER_BENCH_WORKERS and
# GROVE_SERVER_BENCH_BLAS_THREADS (groved's defaults: 1 and cores),
# GROVE_SERVER_BENCH_DATA_IO (groved's --data-io), GROVE_SERVER_BENCH_CLIENT_IO (the client transports, "sp nng"), GROVE_SERVER_BENCH_MAX_BATCH (64) and GROVE_SERVER_BENCH_DELAY_US (500) for the exported
# model's batching, GROVE_PEERS (the peers folder).
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
grove_bin=${1:-}
if [ -z "$grove_bin" ]; then
  echo "usage: bench/server_bench.sh GROVE_BIN" >&2
  exit 2
fi
case "$grove_bin" in /*) ;; *) grove_bin="$root/$grove_bin" ;; esac
groved_bin="$(dirname "$(readlink -f "$grove_bin")")/groved"
rounds=${GROVE_SERVER_BENCH_ROUNDS:-3}
seconds=${GROVE_SERVER_BENCH_SECONDS:-3}
workers=${GROVE_SERVER_BENCH_WORKERS:-}
blas=${GROVE_SERVER_BENCH_BLAS_THREADS:-}
max_batch=${GROVE_SERVER_BENCH_MAX_BATCH:-64}
delay_us=${GROVE_SERVER_BENCH_DELAY_US:-500}
client_ios=${GROVE_SERVER_BENCH_CLIENT_IO:-sp nng}
peers=${GROVE_PEERS:-$root/../shared/peers}
python=/usr/bin/python3
[ -x "$python" ] || python=python3

echo "== groved on the reference MLP: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
if [ ! -x "$groved_bin" ]; then
  echo "server bench: $groved_bin not found (run make first); skipped"
  exit 0
fi
if ! "$grove_bin" bench --help 2>/dev/null | grep -q -- --concurrency; then
  echo "server bench: '$grove_bin bench' has no server form in this build; skipped"
  exit 0
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/grove-server-bench-XXXXXX")
groved_pid=
cleanup() {
  if [ -n "$groved_pid" ] && kill -0 "$groved_pid" 2>/dev/null; then
    kill -TERM "$groved_pid"
    wait "$groved_pid" 2>/dev/null
  fi
  rm -rf "$work"
}
trap cleanup EXIT

if [ -f "$peers/models.py" ]; then
  builder="$peers/models.py:mlp"
else
  builder="$root/bench/models_extra.py:mlp" # the same builder
fi
model_dir="$work/mlp"
if ! "$python" "$root/tools/grove_export.py" --builder "$builder" "$model_dir" --name mlp \
  --max-batch-size "$max_batch" --max-queue-delay-us "$delay_us" >"$work/export.log" 2>&1; then
  echo "server bench: could not export the reference MLP:"
  sed 's/^/  /' "$work/export.log" | head -20
  exit 1
fi

port=$("$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
hport=$("$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
ipc="ipc://$work/groved.sock"
tcp="tcp://127.0.0.1:$port"
args=(--model "mlp=$model_dir" --listen "$ipc" --listen "$tcp" --http "127.0.0.1:$hport"
  --log-level warn --admin-listen none)
[ -n "$workers" ] && args+=(--workers "$workers")
[ -n "$blas" ] && args+=(--blas-threads "$blas")
# GROVE_SERVER_BENCH_DATA_IO: groved's --data-io (loop or nng; unset: groved's default).
[ -n "${GROVE_SERVER_BENCH_DATA_IO:-}" ] && args+=(--data-io "$GROVE_SERVER_BENCH_DATA_IO")
# bench/sp_load speaks SP itself; its protobuf-c code is generated here from proto/ (any build's).
sp_load=
if protoc-c --c_out="$work" --proto_path="$root/proto" grove.proto 2>"$work/protoc.log" &&
  cc -std=c11 -O2 -I"$work" -o "$work/sp_load" "$root/bench/sp_load.c" "$work/grove.pb-c.c" \
    -lprotobuf-c 2>"$work/cc_sp.log"; then
  sp_load="$work/sp_load"
else
  echo "server bench: cannot build bench/sp_load.c; the sp rows are skipped"
fi
oip_load=
if cc -std=c11 -O2 -o "$work/oip_load" "$root/bench/oip_load.c" 2>"$work/cc.log"; then
  oip_load="$work/oip_load"
  # One row of the reference MLP's 784 inputs, as JSON and as binary tensor data (the answer
  # binary too).
  "$python" - "$work" <<'EOF'
import json, random, struct, sys
random.seed(0)
x = [random.uniform(-1, 1) for _ in range(784)]
d = sys.argv[1]
with open(d + "/oip.json", "w") as f:
    json.dump({"inputs": [{"name": "x", "shape": [1, 784], "datatype": "FP32", "data": x}]}, f)
head = json.dumps({"inputs": [{"name": "x", "shape": [1, 784], "datatype": "FP32",
                               "parameters": {"binary_data_size": 784 * 4}}],
                   "parameters": {"binary_data_output": True}}).encode()
with open(d + "/oip.bin", "wb") as f:
    f.write(head + struct.pack("<784f", *x))
with open(d + "/oip.bin.len", "w") as f:
    f.write(str(len(head)))
EOF
else
  echo "server bench: cannot compile bench/oip_load.c; the OIP rows are skipped"
fi
"$groved_bin" "${args[@]}" 2>"$work/groved.log" &
groved_pid=$!
for _ in $(seq 1 300); do
  [ -S "$work/groved.sock" ] && break
  kill -0 "$groved_pid" 2>/dev/null || break
  sleep 0.05
done
if ! "$grove_bin" --server "$ipc" status >"$work/status.out" 2>&1; then
  echo "server bench: groved did not come up:"
  sed 's/^/  /' "$work/groved.log" "$work/status.out" | tail -20
  exit 1
fi
config=$(grep -m1 '^server:' "$work/status.out")
echo "$config"
# The threads one forward of groved uses (its status line: "N workers x T compute threads"),
# for the local batch-1 forward the one-client rows are measured against.
blas=$(sed -n 's/.* x \([0-9][0-9]*\) compute thread.*/\1/p' <<<"$config")
[ -n "$blas" ] || blas=1
echo "batching: max_batch_size=$max_batch max_queue_delay_us=$delay_us;" \
  "$rounds rounds of $seconds s per figure"

results="$work/results.jsonl"
: >"$results"
record() { # kind round file
  tail -n 1 "$3" | "$python" -c '
import json, sys
kind, r = sys.argv[1], int(sys.argv[2])
kv = dict(f.split("=", 1) for f in sys.stdin.read().split())
print(json.dumps({"kind": kind, "round": r, **{k: float(v) for k, v in kv.items()}}))' "$1" "$2" \
    >>"$results"
}
run() { # kind round command...
  local kind=$1 r=$2
  shift 2
  if "$@" >"$work/run.out" 2>&1; then
    record "$kind" "$r" "$work/run.out"
  else
    echo "  $kind failed:"
    sed 's/^/    /' "$work/run.out" | tail -5
  fi
}
# One snapshot of groved: batches, rows, compute seconds (the batches' forwards, from
# grove_compute_latency_seconds), requests answered (grove_requests_total), groved's CPU
# seconds (/proc/PID/stat utime + stime, every thread) and its context switches (voluntary +
# nonvoluntary, summed over /proc/PID/task/*/status).
snapshot() {
  "$python" -c '
import glob, os, sys, urllib.request
t = urllib.request.urlopen(sys.argv[1], timeout=10).read().decode()
v = {}
for l in t.splitlines():
    if l.startswith("#") or not l.strip():
        continue
    k, x = l.rsplit(None, 1)
    v[k] = float(x)
m = "{model=\"mlp\"}"
req = sum(x for k, x in v.items() if k.startswith("grove_requests_total{model=\"mlp\""))
pid = sys.argv[2]
st = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
cpu = (int(st[11]) + int(st[12])) / os.sysconf("SC_CLK_TCK")
cs = 0
for f in glob.glob(f"/proc/{pid}/task/*/status"):
    try:
        for l in open(f):
            if l.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                cs += int(l.split()[1])
    except OSError:
        pass
print(int(v.get("grove_batch_size_count" + m, 0)), int(v.get("grove_batch_size_sum" + m, 0)),
      v.get("grove_compute_latency_seconds_sum" + m, 0.0), int(req), cpu, cs)' \
    "http://127.0.0.1:$hport/metrics" "$groved_pid"
}
# A served run, with groved's snapshot before and after and the client's own CPU and context
# switches (/usr/bin/time), recorded as KIND_cost.
served() { # kind round command...
  local kind=$1 r=$2
  shift 2
  local before after
  before=$(snapshot)
  /usr/bin/time -o "$work/time.out" -f "%U %S %w %c" "$@" >"$work/run.out" 2>&1
  local rc=$?
  after=$(snapshot)
  if [ "$rc" -ne 0 ]; then
    echo "  $kind failed:"
    sed 's/^/    /' "$work/run.out" | tail -5
    return
  fi
  record "$kind" "$r" "$work/run.out"
  "$python" -c '
import json, sys
kind, r = sys.argv[1], int(sys.argv[2])
b = [float(x) for x in sys.argv[3].split()]
a = [float(x) for x in sys.argv[4].split()]
u, s, w, c = (float(x) for x in open(sys.argv[5]).read().split()[-4:])
d = [y - x for x, y in zip(b, a)]
print(json.dumps({"kind": kind + "_cost", "round": r, "batches": d[0], "rows": d[1],
                  "compute_s": d[2], "requests": d[3], "groved_cpu_s": d[4], "groved_cs": d[5],
                  "client_cpu_s": u + s, "client_cs": w + c}))' \
    "$kind" "$r" "$before" "$after" "$work/time.out" >>"$results"
}

for r in $(seq 1 "$rounds"); do
  run local32 "$r" "$grove_bin" bench --local "$model_dir" --batch 32 --seconds "$seconds"
  for io in $client_ios; do
    GROVE_CLIENT_IO=$io served "ipc32/$io" "$r" "$grove_bin" --server "$ipc" bench mlp --concurrency 32 --batch 1 --seconds "$seconds"
    GROVE_CLIENT_IO=$io served "tcp32/$io" "$r" "$grove_bin" --server "$tcp" bench mlp --concurrency 32 --batch 1 --seconds "$seconds"
  done
  if [ -n "$oip_load" ]; then
    run oipjson32 "$r" "$oip_load" 127.0.0.1 "$hport" /v2/models/mlp/infer "$work/oip.json" 0 32 "$seconds"
    run oipbin32 "$r" "$oip_load" 127.0.0.1 "$hport" /v2/models/mlp/infer "$work/oip.bin" \
      "$(cat "$work/oip.bin.len")" 32 "$seconds"
  fi
  if [ -n "$sp_load" ]; then
    served sp_ipc32 "$r" "$sp_load" "$ipc" mlp 784 32 1 "$seconds"
    served sp_tcp32 "$r" "$sp_load" "$tcp" mlp 784 32 1 "$seconds"
  fi
  run local1 "$r" "$grove_bin" bench --local "$model_dir" --batch 1 --threads "$blas" --seconds "$seconds"
  for io in $client_ios; do
    GROVE_CLIENT_IO=$io served "ipc1/$io" "$r" "$grove_bin" --server "$ipc" bench mlp --concurrency 1 --batch 1 --seconds "$seconds"
    GROVE_CLIENT_IO=$io served "tcp1/$io" "$r" "$grove_bin" --server "$tcp" bench mlp --concurrency 1 --batch 1 --seconds "$seconds"
  done
  [ -n "$sp_load" ] && served sp_ipc1 "$r" "$sp_load" "$ipc" mlp 784 1 1 "$seconds"
  echo "  round $r done (load average $(cut -d' ' -f1 /proc/loadavg))"
done

echo
"$python" - "$results" "$client_ios" "$blas" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
ios = sys.argv[2].split()
threads = int(sys.argv[3])  # one forward's compute threads: each is busy for the forward
def vals(kind, key):
    return [r[key] for r in rows if r["kind"] == kind and key in r]
def agg(kind, key, f):
    v = vals(kind, key)
    return f(v) if v else None
def fmt(x, p=1):
    return "-" if x is None else f"{x:.{p}f}"
# "best": the most samples/s and the least latency of any round (the least disturbed by other
# work on the machine); "median": the typical round.
for title, f, lo in (("best round", max, min),
                     ("median round", statistics.median, statistics.median)):
    print(f"-- {title}")
    local32 = agg("local32", "samples_per_s", f)
    print(f"  local  batch 32 (grove bench --local):        {fmt(local32)} samples/s")
    for kind in [k + "/" + io for k in ("ipc32", "tcp32") for io in ios] + ["sp_ipc32", "sp_tcp32"]:
        s = agg(kind, "samples_per_s", f)
        if s is None:
            continue
        p50 = agg(kind, "p50_ms", lo)
        p99 = agg(kind, "p99_ms", lo)
        ratio = s / local32 if s and local32 else None
        name = (kind[:3] + " (" + kind[6:] + ")") if "/" in kind else kind[:-2].replace("sp_", "sp_load ")
        print(f"  groved {name:11s} 32 clients x batch 1: {fmt(s)} samples/s"
              f" = {fmt(ratio and 100 * ratio, 0)}% of local batch 32; p50 {fmt(p50, 3)} ms,"
              f" p99 {fmt(p99, 3)} ms")
    # The Open Inference Protocol on the HTTP listener against the NNG tcp row: by round
    # (the same round's tcp32 figure), then best or median of those ratios.
    tcp_by_round = {r["round"]: r["samples_per_s"] for r in rows
                    if r["kind"] == "tcp32/" + ios[0]}
    for kind, label in (("oipjson32", "OIP JSON  "), ("oipbin32", "OIP binary")):
        s = agg(kind, "samples_per_s", f)
        if s is None:
            continue
        p50 = agg(kind, "p50_ms", lo)
        p99 = agg(kind, "p99_ms", lo)
        ratios = [r["samples_per_s"] / tcp_by_round[r["round"]] for r in rows
                  if r["kind"] == kind and tcp_by_round.get(r["round"])]
        ratio = f(ratios) if ratios else None
        print(f"  groved {label} 32 connections x batch 1: {fmt(s)} samples/s"
              f" = {fmt(ratio and 100 * ratio, 0)}% of grove tcp ({ios[0]}, same round); p50 {fmt(p50, 3)} ms,"
              f" p99 {fmt(p99, 3)} ms")
    local1 = agg("local1", "ms_per_batch", lo)
    for kind in [k + "/" + io for k in ("ipc1", "tcp1") for io in ios] + ["sp_ipc1"]:
        p50 = agg(kind, "p50_ms", lo)
        if p50 is None:
            continue
        p99 = agg(kind, "p99_ms", lo)
        added = (p50 - local1) * 1000 if p50 is not None and local1 is not None else None
        name = (kind[:3] + " (" + kind[5:] + ")") if "/" in kind else kind[:-1].replace("sp_", "sp_load ")
        print(f"  groved {name:11s} 1 client x batch 1:  p50 {fmt(p50, 3)} ms, p99 {fmt(p99, 3)} ms;"
              f" local forward {fmt(local1, 3)} ms; added {fmt(added, 0)} us")
    print(f"  per request, outside the forward (groved CPU - compute x {threads} thread"
          f"{'s' if threads > 1 else ''}, over requests answered):")
    for kind in ([k + "/" + io for k in ("ipc32", "tcp32", "ipc1", "tcp1") for io in ios]
                 + ["sp_ipc32", "sp_tcp32", "sp_ipc1"]):
        c = [r for r in rows if r["kind"] == kind + "_cost" and r["requests"] > 0]
        if not c:
            continue
        # Costs are better low: the "best" round takes the least.
        g = (min if f is max else statistics.median)
        gs = g([(r["groved_cpu_s"] - r["compute_s"] * threads) / r["requests"] * 1e6 for r in c])
        cl = g([r["client_cpu_s"] / r["requests"] * 1e6 for r in c])
        cs = g([(r["groved_cs"]) / r["requests"] for r in c])
        ccs = g([(r["client_cs"]) / r["requests"] for r in c])
        rb = f([r["rows"] / r["batches"] for r in c if r["batches"]] or [0])
        print(f"    {kind:10s} groved {gs:6.1f} us CPU, client {cl:6.1f} us CPU; context switches"
              f" groved {cs:5.2f}, client {ccs:5.2f}; rows per batch {rb:5.1f}")
EOF
