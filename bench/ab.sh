#!/usr/bin/env bash
# bench/ab.sh [--rounds N] [--parts gemm,mlp,cpu,server] REV_A REV_B: Grove's figures for two
# revisions, measured in one run on this machine, in alternating rounds, as a table of
# medians with B/A ratios.  For a restructuring ("no speed change") or a speed-up, the lead
# runs it on the tree before and after.
#
#   1. each revision checked out in a temporary worktree (git worktree add --detach under
#      $TMPDIR, removed on exit, whatever happens) and built there with its own Makefile:
#      `make all gemm-bench` (release build, the same compiler and flags for both)
#   2. the reference MLP exported once, with this tree's tools/grove_export.py (the same
#      seeded weights for both; model.json and safetensors did not change with #17)
#   3. ROUNDS rounds; each runs A then B, or B then A in every other round (so that a drift
#      of the machine's load falls on both sides alike), of these parts:
#        gemm    the revision's own bench/gemm_bench (`make bench`'s micro-benchmark: the
#                MLP's three layers chained), --seconds S --rounds 5, batches 1,64,256;
#                its cblas rows are the same OpenBLAS in both builds: a control for noise
#        mlp     `grove bench --local MLP --batch B --seconds S` for each batch (`make
#                bench`'s end-to-end Grove figures; the PyTorch and ONNX Runtime columns of
#                `make bench` are the same programs for both revisions and are left out)
#        cpu     the same at --threads 1 under /usr/bin/time: samples per CPU second (user +
#                sys, the load and warm-up included), which a busy machine disturbs far less
#                than samples/s, since it counts only the time the process ran
#        server  this tree's bench/server_bench.sh on the revision's grove and groved, one
#                round (GROVE_SERVER_BENCH_ROUNDS=1) per round here
#   4. a table: for each figure the median over the rounds of A and of B, and B/A (for
#      samples/s above 1 is faster; for a latency below 1 is faster)
#
# How long: the two builds take 5 to 10 minutes on a 2-core machine; then a round of the
# three parts about 30 s (gemm) + 10 s (mlp) + 45 s (server) per revision, so the default
# 3 rounds about 9 minutes.  Environment: AB_SECONDS (2, per run of gemm and mlp),
# AB_BATCHES (1,64,256), AB_JOBS (make -j, 2), GROVE_PEERS as for bench/server_bench.sh.
# Figures only, never a verdict: compare a ratio with the control's and with the spread.
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
rounds=3
parts=gemm,mlp,cpu,server
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds=$2; shift 2 ;;
    --parts) parts=$2; shift 2 ;;
    -h | --help)
      sed -n '2,4p' "$0" | sed 's/^# \{0,1\}//'
      exit 0 ;;
    --*) echo "bench/ab.sh: unknown option $1" >&2; exit 2 ;;
    *) break ;;
  esac
done
if [ $# -ne 2 ]; then
  echo "usage: bench/ab.sh [--rounds N] [--parts gemm,mlp,cpu,server] REV_A REV_B" >&2
  exit 2
fi
case "$rounds" in '' | *[!0-9]* | 0) echo "bench/ab.sh: --rounds wants a positive number" >&2; exit 2 ;; esac
for p in ${parts//,/ }; do
  case "$p" in gemm | mlp | cpu | server) ;; *) echo "bench/ab.sh: unknown part '$p' (gemm, mlp, cpu, server)" >&2; exit 2 ;; esac
done
has_part() { case ",$parts," in *",$1,"*) return 0 ;; *) return 1 ;; esac; }
seconds=${AB_SECONDS:-2}
batches=${AB_BATCHES:-1,64,256}
jobs=${AB_JOBS:-2}
peers=${GROVE_PEERS:-$root/../shared/peers}
python=/usr/bin/python3
[ -x "$python" ] || python=python3

rev_a=$(git -C "$root" rev-parse --verify --quiet "$1^{commit}") || { echo "bench/ab.sh: no commit '$1'" >&2; exit 2; }
rev_b=$(git -C "$root" rev-parse --verify --quiet "$2^{commit}") || { echo "bench/ab.sh: no commit '$2'" >&2; exit 2; }

work=$(mktemp -d "${TMPDIR:-/tmp}/grove-ab-XXXXXX")
cleanup() {
  for side in a b; do
    if [ -d "$work/$side" ]; then
      git -C "$root" worktree remove --force "$work/$side" >/dev/null 2>&1 || rm -rf "$work/$side"
    fi
  done
  git -C "$root" worktree prune >/dev/null 2>&1
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
results="$work/results.jsonl"
: >"$results"

echo "== bench/ab.sh: A = $(git -C "$root" log -1 --format='%h %s' "$rev_a" | cut -c1-80)"
echo "               B = $(git -C "$root" log -1 --format='%h %s' "$rev_b" | cut -c1-80)"
echo "   $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), load average $(cut -d' ' -f1-3 /proc/loadavg); parts $parts, $rounds rounds"

# ------------------------------------------------------------------ builds
for side in a b; do
  rev=$rev_a
  [ "$side" = b ] && rev=$rev_b
  t0=$(date +%s)
  if ! git -C "$root" worktree add --detach "$work/$side" "$rev" >"$work/wt-$side.log" 2>&1; then
    echo "bench/ab.sh: git worktree add failed for $rev:" >&2
    sed 's/^/  /' "$work/wt-$side.log" >&2
    exit 1
  fi
  if ! make -C "$work/$side" -j"$jobs" all gemm-bench >"$work/build-$side.log" 2>&1; then
    echo "bench/ab.sh: the build of ${side^^} ($rev) failed:" >&2
    tail -20 "$work/build-$side.log" | sed 's/^/  /' >&2
    exit 1
  fi
  echo "   built ${side^^} in $(($(date +%s) - t0)) s"
done
bin_of() { echo "$work/$1/build/release/$2"; }

# ------------------------------------------------------------------ the model
model_dir="$work/mlp"
if has_part mlp || has_part cpu; then
  builder="$peers/models.py:mlp"
  # The same builder as peers/models.py where that folder is absent.
  [ -f "$peers/models.py" ] || builder="$root/bench/models_extra.py:mlp"
  if ! "$python" "$root/tools/grove_export.py" --builder "$builder" "$model_dir" >"$work/export.log" 2>&1; then
    echo "bench/ab.sh: could not export the reference MLP; parts mlp and cpu skipped:" >&2
    head -20 "$work/export.log" | sed 's/^/  /' >&2
    parts=$(echo ",$parts," | sed 's/,mlp,/,/; s/,cpu,/,/; s/^,//; s/,$//')
  fi
fi

# ------------------------------------------------------------------ one side's round
# record SIDE ROUND PART FIGURE UNIT VALUE
record() {
  printf '{"side": "%s", "round": %s, "part": "%s", "figure": "%s", "unit": "%s", "value": %s}\n' \
    "$1" "$2" "$3" "$4" "$5" "$6" >>"$results"
}

run_gemm() {
  local side=$1 r=$2 out="$work/gemm-$1-$2.out"
  if ! "$(bin_of "$side" bench/gemm_bench)" --batches "$batches" --seconds "$seconds" --rounds 5 >"$out" 2>&1; then
    echo "   gemm_bench of ${side^^} failed (round $r): $(tail -1 "$out")"
    return
  fi
  # grove  mlp batch=1    samples_per_s=   1096.8 ms_per_batch=  0.9117 gflops=   4.1
  awk '($1 == "grove" || $1 == "cblas") && $3 ~ /^batch=/ {
         split($3, b, "="); v = $4; sub(/samples_per_s=/, "", v); if (v == "") v = $5;
         print $1, b[2], v }' "$out" |
    while read -r engine b v; do
      record "$side" "$r" gemm "gemm_bench $engine batch $b" "samples/s" "$v"
    done
}

run_mlp() {
  local side=$1 r=$2 b out
  for b in ${batches//,/ }; do
    out="$work/mlp-$side-$r-$b.out"
    if ! "$(bin_of "$side" grove)" bench --local "$model_dir" --batch "$b" --seconds "$seconds" >"$out" 2>&1; then
      echo "   grove bench --local of ${side^^} failed (round $r, batch $b): $(tail -1 "$out")"
      continue
    fi
    # Last line: batch=B samples_per_s=X ms_per_batch=X
    v=$(tail -n 1 "$out" | tr ' ' '\n' | sed -n 's/^samples_per_s=//p')
    [ -n "$v" ] && record "$side" "$r" mlp "grove bench --local batch $b" "samples/s" "$v"
  done
}

run_cpu() {
  local side=$1 r=$2 b out sps cpu
  for b in ${batches//,/ }; do
    out="$work/cpu-$side-$r-$b.out"
    if ! /usr/bin/time -f "ab_cpu %U %S" "$(bin_of "$side" grove)" bench --local "$model_dir" --batch "$b" \
      --threads 1 --seconds "$seconds" >"$out" 2>&1; then
      echo "   grove bench --local --threads 1 of ${side^^} failed (round $r, batch $b): $(tail -1 "$out")"
      continue
    fi
    sps=$(grep samples_per_s= "$out" | tail -n 1 | tr ' ' '\n' | sed -n 's/^samples_per_s=//p')
    cpu=$(awk '/^ab_cpu / { print $2 + $3 }' "$out")
    [ -n "$sps" ] && [ -n "$cpu" ] &&
      record "$side" "$r" cpu "grove bench --local --threads 1 batch $b" "samples/CPU s" \
        "$(awk -v s="$sps" -v t="$seconds" -v c="$cpu" 'BEGIN { printf "%.1f", (c > 0 ? s * t / c : 0) }')"
  done
}

run_server() {
  local side=$1 r=$2 out="$work/server-$1-$2.out"
  GROVE_SERVER_BENCH_ROUNDS=1 GROVE_SERVER_BENCH_SECONDS=${AB_SERVER_SECONDS:-3} \
    bash "$root/bench/server_bench.sh" "$(bin_of "$side" grove)" >"$out" 2>&1
  # The "median round" block (with one round, the round itself).
  "$python" - "$out" "$side" "$r" >>"$results" <<'EOF'
import json, re, sys
text = open(sys.argv[1]).read()
side, r = sys.argv[2], int(sys.argv[3])
block = text.split("-- median round")[-1] if "-- median round" in text else ""
def rec(fig, unit, v):
    print(json.dumps({"side": side, "round": r, "part": "server", "figure": fig, "unit": unit,
                      "value": float(v)}))
m = re.search(r"local\s+batch 32 .*?:\s+([\d.]+) samples/s", block)
if m: rec("local batch 32 (reference)", "samples/s", m.group(1))
for kind in ("ipc", "tcp"):
    m = re.search(r"groved %s 32 clients x batch 1:\s+([\d.]+) samples/s.*?p50 ([\d.]+) ms" % kind, block)
    if m:
        rec("groved %s 32 clients" % kind, "samples/s", m.group(1))
    m = re.search(r"groved %s 1 client x batch 1:\s+p50 ([\d.]+) ms, p99 ([\d.]+) ms" % kind, block)
    if m:
        rec("groved %s 1 client p50" % kind, "ms", m.group(1))
        rec("groved %s 1 client p99" % kind, "ms", m.group(2))
EOF
  grep -q '"part": "server"' <(grep "\"side\": \"$side\", \"round\": $r," "$results") ||
    echo "   server_bench of ${side^^} gave no figures (round $r): $(tail -2 "$out" | tr '\n' ' ')"
}

# ------------------------------------------------------------------ rounds
for r in $(seq 1 "$rounds"); do
  order="a b"
  [ $((r % 2)) -eq 0 ] && order="b a"
  t0=$(date +%s)
  for part in ${parts//,/ }; do
    for side in $order; do
      "run_$part" "$side" "$r"
    done
  done
  echo "   round $r ($order) done in $(($(date +%s) - t0)) s, load average $(cut -d' ' -f1 /proc/loadavg)"
done

# ------------------------------------------------------------------ table
echo
"$python" - "$results" "$(git -C "$root" rev-parse --short "$rev_a")" "$(git -C "$root" rev-parse --short "$rev_b")" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
a_name, b_name = sys.argv[2], sys.argv[3]
if not rows:
    print("no figures (see the messages above)")
    sys.exit(0)
figures = []
for r in rows:
    key = (r["part"], r["figure"], r["unit"])
    if key not in figures:
        figures.append(key)
def spread(xs):
    return f"{min(xs):.4g}..{max(xs):.4g}" if xs else "-"
print(f"medians over the rounds (A = {a_name}, B = {b_name}); B/A: samples/s above 1 and ms below 1"
      " are faster")
print(f"| part | figure | A | B | B/A | A's rounds | B's rounds |")
print(f"| --- | --- | --- | --- | --- | --- | --- |")
for part, fig, unit in figures:
    xs = {s: [r["value"] for r in rows if r["side"] == s and r["part"] == part and r["figure"] == fig]
          for s in ("a", "b")}
    ma = statistics.median(xs["a"]) if xs["a"] else None
    mb = statistics.median(xs["b"]) if xs["b"] else None
    ratio = f"{mb / ma:.2f}" if ma and mb else "-"
    fa = f"{ma:.4g} {unit}" if ma is not None else "-"
    fb = f"{mb:.4g} {unit}" if mb is not None else "-"
    print(f"| {part} | {fig} | {fa} | {fb} | {ratio} | {spread(xs['a'])} | {spread(xs['b'])} |")
EOF
