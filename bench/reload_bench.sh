#!/usr/bin/env bash
# bench/reload_bench.sh GROVE_BIN: hot reload under load, and its memory.
#
#   1. Latency.  groved serves the reference MLP (Linear(784,1024) ReLU Linear(1024,1024) ReLU
#      Linear(1024,10), 4.2 MB of float32) from weights A; a second set B sits beside it.
#      For ROUNDS rounds:
#        steady    grove bench mlp --concurrency C --batch 1 --seconds S
#        full      the same while another client reloads B, A, B, ... back to back
#        in place  the same with reload --in-place
#      and a table of p50/p99 (best and median round), errors, reloads done, and the p99 over
#      the same round's steady p99 (median over rounds).
#   2. Memory.  groved (one worker) serves a BIG_MB model (4 x Linear(N, N)); for a full
#      reload from safetensors, a full reload from .pt and an in-place reload, the peak RSS
#      (VmHWM after clear_refs) and the peak anonymous and file-backed RSS (sampled every
#      millisecond) beside the weights' size, and the in-place pause.
#
# Environment: GROVE_RELOAD_BENCH_ROUNDS (3; 0 skips part 1), GROVE_RELOAD_BENCH_SECONDS (4),
# GROVE_RELOAD_BENCH_CONCURRENCY (8), GROVE_RELOAD_BENCH_BIG_MB (256; 0 skips part 2),
# GROVE_RELOAD_BENCH_BASELINE (another build's grove binary, groved beside it: every
# measurement also runs on it, alternating with this build's, for a same-run comparison),
# GROVE_RELOAD_BENCH_KINDS (runs of part 1, of steady, full, full5, inplace5, control:
# reloads that fail at once, the clients' and RPCs' share of a storm, and train: a training
# session stepping flat out beside the predicts; default all but control and train),
# GROVE_RELOAD_BENCH_NO_YIELD=1 (every measurement also runs with --background-yield-us 0,
# alternating: what the background threads' yields are worth, core/base/yield.c).
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
grove_bin=${1:-}
if [ -z "$grove_bin" ]; then
  echo "usage: bench/reload_bench.sh GROVE_BIN" >&2
  exit 2
fi
case "$grove_bin" in /*) ;; *) grove_bin="$root/$grove_bin" ;; esac
groved_bin="$(dirname "$(readlink -f "$grove_bin")")/groved"
python=/usr/bin/python3
[ -x "$python" ] || python=python3
if [ ! -x "$groved_bin" ]; then
  echo "reload bench: $groved_bin not found (run make first); skipped"
  exit 0
fi
work=$(mktemp -d "${TMPDIR:-/tmp}/grove-reload-bench-XXXXXX")
trap 'rm -rf "$work"' EXIT

echo "== hot reload: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
GROVE="$grove_bin" GROVED="$groved_bin" WORK="$work" ROOT="$root" \
  ROUNDS=${GROVE_RELOAD_BENCH_ROUNDS:-3} SECONDS_=${GROVE_RELOAD_BENCH_SECONDS:-4} \
  CONC=${GROVE_RELOAD_BENCH_CONCURRENCY:-8} BIG_MB=${GROVE_RELOAD_BENCH_BIG_MB:-256} \
  BASELINE=${GROVE_RELOAD_BENCH_BASELINE:-} KINDS=${GROVE_RELOAD_BENCH_KINDS:-} \
  NO_YIELD=${GROVE_RELOAD_BENCH_NO_YIELD:-} \
  "$python" - <<'EOF'
import os, signal, socket, statistics, subprocess, sys, threading, time
sys.path.insert(0, os.path.join(os.environ["ROOT"], "tools"))
sys.path.insert(0, os.path.join(os.environ["ROOT"], "python"))
import torch, torch.nn as nn
import grove_export
os.environ.setdefault("GROVE_CLIENT_LIB",
                      os.path.join(os.path.dirname(os.path.realpath(os.environ["GROVE"])),
                                   "libgrove-client.so"))
import grove as grove_client

GROVE, GROVED, WORK = os.environ["GROVE"], os.environ["GROVED"], os.environ["WORK"]
ROUNDS, SECONDS, CONC = int(os.environ["ROUNDS"]), os.environ["SECONDS_"], os.environ["CONC"]
BIG_MB = int(os.environ["BIG_MB"])
BASELINE = None
if os.environ.get("BASELINE"):
    BASELINE = (os.environ["BASELINE"],
                os.path.join(os.path.dirname(os.path.realpath(os.environ["BASELINE"])), "groved"))
torch.set_num_threads(1)
MB = 1 << 20


def start(name, d, extra=(), groved=GROVED):
    sock = os.path.join(WORK, f"{name}.sock")
    if os.path.exists(sock):
        os.unlink(sock)
    log = open(os.path.join(WORK, f"{name}.log"), "a")
    # An admin plane of its own (the reloads' RPCs): the default address may be another
    # groved's on this machine.  The clients (python/grove, grove) find it in GROVE_ADMIN.
    # The checkpoints reloaded lie in WORK, outside the model's directory: allowed.
    admin = f"ipc://{WORK}/{name}.admin"
    os.environ["GROVE_ADMIN"] = admin
    p = subprocess.Popen([groved, "--model", f"{name}={d}", "--listen", f"ipc://{sock}",
                          "--http", "none", "--pub", f"ipc://{WORK}/{name}.pub",
                          "--admin-listen", admin, "--checkpoint-dir", WORK,
                          "--log-level", "warn", *extra],
                         stdout=log, stderr=log)
    # The socket file appears when the listener binds; the first predicts and reloads
    # need groved to answer, so wait for `status` too (a start-up race otherwise).
    url = f"ipc://{sock}"
    for _ in range(600):
        if p.poll() is not None:
            sys.exit(f"reload bench: groved exited with {p.returncode} at start-up; "
                     f"see {log.name}")
        if os.path.exists(sock) and subprocess.run(
                [GROVE, "--server", url, "status"], capture_output=True).returncode == 0:
            break
        time.sleep(0.05)
    return p, url


def stop(p):
    p.send_signal(signal.SIGTERM)
    p.wait(timeout=60)


def bench(url, name, grove=GROVE):
    r = subprocess.run([grove, "--server", url, "bench", name, "--concurrency", CONC, "--batch",
                        "1", "--seconds", SECONDS], capture_output=True, text=True)
    kv = dict(f.split("=", 1) for f in r.stdout.strip().splitlines()[-1].split())
    return {k: float(v) for k, v in kv.items()}


def storm(url, name, files, extra, gap, stop_ev, out):
    """Reloads B, A, B, ... until stop_ev, gap seconds apart (0: back to back).

    The reloads go through one python/grove client (libgrove-client.so of this
    build, which speaks the same protocol to the baseline): a `grove reload`
    process per reload costs about twice the CPU time of the reload it asks
    for, nearly all of it starting up, and on two cores that would be measured
    as the server's doing."""
    n = fails = 0
    with grove_client.Client(url, timeout_ms=120000) as c:
        while not stop_ev.is_set():
            try:
                c.reload(name, files[n % 2], in_place="--in-place" in extra)
            except grove_client.GroveError:
                fails += 1
            n += 1
            stop_ev.wait(gap)
    out.update(reloads=n, reload_failures=fails)


# ---------------------------------------------------------------- 1. latency
# BUILDS: label -> (grove, groved); a baseline build, when given, runs every
# measurement beside this one, alternating, so that the two are compared
# under the same load of this shared machine.
# Each entry: (grove, groved, extra groved flags).
BUILDS = {"": (GROVE, GROVED, [])}
if BASELINE:
    BUILDS = {"this build": (GROVE, GROVED, []), "baseline": (*BASELINE, [])}
if os.environ.get("NO_YIELD"):  # this build only: a baseline may not know the flag
    BUILDS[("this build, " if BASELINE else "") + "no yields"] = (
        GROVE, GROVED, ["--background-yield-us", "0"])


def latency():
    def ref_mlp(seed):
        torch.manual_seed(seed)
        return nn.Sequential(nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                             nn.Linear(1024, 10)).eval()
    a, b = ref_mlp(0), ref_mlp(1)
    d = os.path.join(WORK, "mlp")
    grove_export.export(a, d, example_input=torch.zeros(1, 784), name="mlp")
    fa, fb = os.path.join(WORK, "a.safetensors"), os.path.join(WORK, "b.safetensors")
    grove_export.save_safetensors(a.state_dict(), fa)
    grove_export.save_safetensors(b.state_dict(), fb)
    # kind -> (reload flags, seconds between reloads, files); None: no reloads.  The
    # control asks for reloads that fail at once (no such checkpoint): the same
    # client and RPCs as a storm of full reloads, without building anything.
    missing = (os.path.join(WORK, "missing.safetensors"),) * 2
    ALL_KINDS = {"steady": None, "full, back to back": ([], 0, (fb, fa)),
                 "full, 5/s": ([], 0.2, (fb, fa)), "in place, 5/s": (["--in-place"], 0.2, (fb, fa)),
                 "control: failing, 10/s": ([], 0.1, missing),
                 "training flat out": "train"}
    SHORT = dict(zip(["steady", "full", "full5", "inplace5", "control", "train"], ALL_KINDS))
    # A training batch for the "train" kind: TrainStep after TrainStep on it.
    tx, ty = os.path.join(WORK, "tx.npy"), os.path.join(WORK, "ty.npy")
    import numpy as np
    np.save(tx, np.random.default_rng(0).random((64, 784), dtype=np.float32))
    np.save(ty, np.random.default_rng(1).random((64, 10), dtype=np.float32))
    want = os.environ.get("KINDS") or "steady,full,full5,inplace5"
    KINDS = {SHORT[k]: ALL_KINDS[SHORT[k]] for k in want.split(",")}
    if "steady" not in KINDS:
        KINDS = {"steady": None, **KINDS}
    rows = {(bl, k): [] for k in KINDS for bl in BUILDS}
    for r in range(ROUNDS):
        for kind, how in KINDS.items():
            for bl, (grove, groved, flags) in BUILDS.items():
                # One server at a time: an idle second groved would still hold
                # its worker threads' memory, not the CPU, but keep it simple.
                p, url = start("mlp", d, flags, groved=groved)
                try:
                    if how is None:
                        res = bench(url, "mlp", grove)
                    elif how == "train":
                        # A session stepping flat out (one `grove train step` looping
                        # its steps), started before and stopped after the bench.
                        g = [grove, "--server", url, "train"]
                        subprocess.run(g + ["start", "mlp", "--optimizer", "SGD", "--loss",
                                            "MSELoss", "--lr", "0.001"], check=True,
                                       capture_output=True)
                        tr = subprocess.Popen(g + ["step", "mlp", tx, "--target", ty, "--steps",
                                                   "100000000"], stdout=subprocess.DEVNULL,
                                              stderr=subprocess.DEVNULL)
                        time.sleep(0.3)
                        res = bench(url, "mlp", grove)
                        tr.kill()
                        tr.wait()
                    else:
                        ev, extra = threading.Event(), {}
                        t = threading.Thread(target=storm, args=(url, "mlp", how[2], how[0],
                                                                 how[1], ev, extra))
                        t.start()
                        res = bench(url, "mlp", grove)
                        ev.set()
                        t.join()
                        res.update(extra)
                finally:
                    stop(p)
                rows[(bl, kind)].append(res)
        print(f"  round {r + 1} done (load average {open('/proc/loadavg').read().split()[0]})")
    print(f"\nreference MLP (4.2 MB), {CONC} clients x batch 1, {SECONDS} s per run, {ROUNDS} rounds")
    print(f"{'':40} {'p50 ms':>16} {'p99 ms':>16} {'samples/s':>10} {'errors':>7} {'reloads':>8}"
          f" {'p99 / steady':>13}")
    for bl in BUILDS:
        steady = [x["p99_ms"] for x in rows[(bl, "steady")]]
        for kind in KINDS:
            rs = rows[(bl, kind)]
            p50 = [x["p50_ms"] for x in rs]
            p99 = [x["p99_ms"] for x in rs]
            sps = statistics.median(x["samples_per_s"] for x in rs)
            err = sum(int(x["errors"]) for x in rs)
            rl = sum(int(x.get("reloads", 0)) for x in rs)
            rf = sum(int(x.get("reload_failures", 0)) for x in rs)
            name = f"{kind} ({bl})" if bl else kind
            print(f"{name:40} {min(p50):7.3f} / {statistics.median(p50):6.3f} "
                  f"{min(p99):7.3f} / {statistics.median(p99):6.3f} {sps:10.0f} {err:7d} "
                  f"{rl:8d} {statistics.median(a / b for a, b in zip(p99, steady)):12.2f}x"
                  + (f" ({rf} failed)" if rf else ""))
    print("(p50 and p99: best / median round; p99 / steady: the median over rounds of the "
          "run's p99 over the same round's steady p99)")


if ROUNDS > 0:
    latency()

# ---------------------------------------------------------------- 2. memory
if BIG_MB <= 0:
    sys.exit(0)
n = int((BIG_MB * MB / 4 / 4) ** 0.5)
def big(seed):
    torch.manual_seed(seed)
    layers = []
    for i in range(4):
        layers.append(nn.Linear(n, n, bias=False))
        if i < 3:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers).eval()
ba, bb = big(0), big(1)
d = os.path.join(WORK, "big")
grove_export.export(ba, d, example_input=torch.zeros(1, n), name="big",
                    batching={"max_batch_size": 8})
weights = 4 * n * n * 4
fbs, fbp = os.path.join(WORK, "big_b.safetensors"), os.path.join(WORK, "big_b.pt")
grove_export.save_safetensors(bb.state_dict(), fbs)
torch.save(bb.state_dict(), fbp)
del ba, bb


def status(pid):
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
                out[k] = int(v.split()[0]) * 1024
    return out


print(f"\nmemory: 4 x Linear({n}, {n}) = {weights / MB:.0f} MB of float32 weights, groved with one worker")
for bl, (grove, groved, flags) in BUILDS.items():
    if bl:
        print(f" {bl}:")
    p, url = start("big", d, ["--workers", "1", *flags], groved=groved)
    try:
        s0 = status(p.pid)
        print(f"  serving: RSS {s0['VmRSS'] / MB:.0f} MB (anonymous {s0['RssAnon'] / MB:.0f} MB: "
              f"the packed weights, and the checkpoint where it is read into memory; "
              f"file {s0['RssFile'] / MB:.0f} MB: the checkpoint where it is mapped)")
        def settle():
            """Waits (at most 10 s) for the version a reload replaced to be freed."""
            for _ in range(1000):
                if status(p.pid)["VmRSS"] < s0["VmRSS"] * 1.1:
                    return
                time.sleep(0.01)
        for label, ck, extra in (("full reload, safetensors", fbs, []),
                                 ("full reload, .pt", fbp, []),
                                 ("in-place reload, safetensors", fbs, ["--in-place"]),
                                 ("in-place reload, .pt", fbp, ["--in-place"])):
            settle()
            before = status(p.pid)
            with open(f"/proc/{p.pid}/clear_refs", "w") as f:
                f.write("5")
            peak = {"RssAnon": 0, "RssFile": 0}
            done = threading.Event()
            def sample():
                while not done.is_set():
                    s = status(p.pid)
                    for k in peak:
                        peak[k] = max(peak[k], s[k])
                    time.sleep(0.001)
            t = threading.Thread(target=sample)
            t.start()
            r = subprocess.run([grove, "--server", url, "reload", "big", ck, *extra],
                               capture_output=True, text=True)
            done.set()
            t.join()
            assert r.returncode == 0, r.stderr
            peak_total = status(p.pid)["VmHWM"]
            settle()
            after = status(p.pid)
            after["VmHWM"] = peak_total
            ms = r.stdout.strip().split(", ")
            took = [x for x in ms if x.endswith(" ms") and "paused" not in x]
            pause = r.stdout.split("paused ")[1].split(")")[0] if "paused" in r.stdout else "-"
            print(f"  {label:29}: peak RSS {after['VmHWM'] / MB:5.0f} MB "
                  f"(+{(after['VmHWM'] - before['VmRSS']) / MB:4.0f} MB over serving = "
                  f"{(after['VmHWM'] - before['VmRSS']) / weights:.2f} x the weights); "
                  f"peak anonymous {peak['RssAnon'] / MB:4.0f} MB, file {peak['RssFile'] / MB:4.0f} MB; "
                  f"settles at {after['VmRSS'] / MB:4.0f} MB; {took[0] if took else '?'}; pause {pause}")
    finally:
        stop(p)
EOF
