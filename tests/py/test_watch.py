"""grove hook add/ls/rm and grove watch against a live groved, compared with
what torch forward hooks see (docs/telemetry.md).

Run by tests/run_py_tests.py under a python3 with torch and numpy; GROVE_BIN
is the grove binary and groved sits next to it.  Each test starts its own
groved with its RPC and PUB sockets on ipc paths in a temporary directory
and --http none, and stops it with SIGTERM (which must exit 0).  Every wait
is bounded (watch runs with --count and --seconds).
"""
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import grove_export  # noqa: E402
from netutil import admin_listen, register_admin, with_admin  # noqa: E402

GROVE = os.environ.get("GROVE_BIN") or os.path.join(ROOT, "build", "grove")
GROVED = os.environ.get("GROVED_BIN") or os.path.join(os.path.dirname(os.path.realpath(GROVE)),
                                                      "groved")


def grove(*args, timeout=60):
    return subprocess.run([GROVE, *with_admin(args)], capture_output=True, text=True,
                          timeout=timeout)


class Server:
    def __init__(self, tmp, models, extra=()):
        self.rpc = f"ipc://{tmp}/rpc.sock"
        self.pub = f"ipc://{tmp}/pub.sock"
        self.admin = admin_listen(tmp)
        register_admin(self.admin, self.rpc)
        self.log = open(os.path.join(tmp, "groved.log"), "w+")
        args = [GROVED, "--listen", self.rpc, "--pub", self.pub, "--http", "none",
                "--admin-listen", self.admin, "--checkpoint-dir", tmp, "--workers", "1", *extra]
        for m in models:
            args += ["--model", m]
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while not os.path.exists(self.rpc[len("ipc://"):]):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"groved did not start:\n{self.text()}")
            time.sleep(0.02)

    def text(self):
        self.log.seek(0)
        return self.log.read()

    def cli(self, *args, **kw):
        return grove("--server", self.rpc, "--pub", self.pub, *args, **kw)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                rc = self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError("groved did not drain within 30 s")
            assert rc == 0, f"groved exited {rc}:\n{self.text()}"
        self.log.close()


def model():
    torch.manual_seed(99)
    m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(),
                            torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Tanh()),
                            torch.nn.Linear(16, 3)).eval()
    return m


def torch_stats(m, x):
    """What forward hooks see on every module: {(path, kind): stats}."""
    seen = {}

    def stats(t):
        t = t.detach().to(torch.float64)
        f = t.reshape(-1)
        return {"count": f.numel(), "mean": f.mean().item(), "std": f.std().item(),
                "min": f.min().item(), "max": f.max().item(),
                "zero_fraction": (f == 0).sum().item() / f.numel(),
                "feature_mean": t.mean(0).tolist() if t.dim() == 2 else None}

    hs = []
    for name, mod in m.named_modules():
        hs.append(mod.register_forward_hook(
            lambda mod, i, o, name=name: seen.__setitem__((name, "forward"), stats(o))))
        hs.append(mod.register_forward_pre_hook(
            lambda mod, i, name=name: seen.__setitem__((name, "forward_pre"), stats(i[0]))))
    with torch.no_grad():
        m(x)
    for h in hs:
        h.remove()
    return seen


def serve(tmp):
    m = model()
    d = os.path.join(tmp, "m")
    grove_export.export(m, d, example_input=torch.randn(1, 8))
    return m, Server(tmp, [f"m={d}"])


def watch_while_predicting(srv, xfile, args, tries=200):
    """Starts `grove watch ARGS` and predicts xfile until it exits (it stops
    after --count events); returns its stdout lines."""
    w = subprocess.Popen([GROVE, "--pub", srv.pub, "watch", *args], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(tries):
            r = srv.cli("predict", "m", xfile, "-o", xfile + ".out.npy")
            assert r.returncode == 0, r.stderr
            if w.poll() is not None:
                break
            time.sleep(0.02)
        out, err = w.communicate(timeout=30)
    finally:
        if w.poll() is None:
            w.kill()
            w.wait()
    assert w.returncode == 0, err
    return out.splitlines()


def close(a, b, what):
    assert abs(a - b) <= 1e-4 * abs(b) + 1e-6, f"{what}: grove {a}, torch {b}"


def test_hooks_and_watch_json_equal_torch():
    with tempfile.TemporaryDirectory() as tmp:
        m, srv = serve(tmp)
        try:
            x = np.random.default_rng(3).standard_normal((5, 8)).astype(np.float32)
            xfile = os.path.join(tmp, "x.npy")
            np.save(xfile, x)
            want = torch_stats(m, torch.from_numpy(x))
            r = srv.cli("hook", "add", "m", "**", "--stats", "basic,per_feature")
            assert r.returncode == 0, r.stderr
            hid = int(r.stdout.strip())
            assert "matches 6 modules: 0, 1, 2, 2.0, 2.1, 3" in r.stderr, r.stderr
            r = srv.cli("hook", "add", "m", "2.0", "--kind", "forward_pre")
            assert r.returncode == 0, r.stderr
            pre_id = int(r.stdout.strip())
            assert pre_id != hid
            # 6 forward events and 1 forward_pre event per predict: collect 14.
            lines = watch_while_predicting(srv, xfile, ["m", "--json", "--count", "14",
                                                        "--seconds", "30"])
            assert len(lines) == 14, lines
            kinds = set()
            for line in lines:
                e = json.loads(line)
                assert e["model"] == "m" and e["version"] == 1, e
                w = want[(e["module"], e["kind"])]
                kinds.add((e["module"], e["kind"]))
                assert e["count"] == w["count"] and e["nan_count"] == 0 and e["rows"] == 5, e
                for k in ("mean", "std", "min", "max", "zero_fraction"):
                    close(e[k], w[k], f"{e['module']} {e['kind']} {k}")
                if e["hook_id"] == hid:
                    assert len(e["feature_mean"]) == len(w["feature_mean"]), e
                    for a, b in zip(e["feature_mean"], w["feature_mean"]):
                        close(a, b, f"{e['module']} feature_mean")
                else:
                    assert e["hook_id"] == pre_id and e["module"] == "2.0", e
                    assert "feature_mean" not in e
            assert ("1", "forward") in kinds and ("2.0", "forward_pre") in kinds, kinds

            # ls shows both hooks, what they match and what they published.
            r = srv.cli("hook", "ls", "m", "--json")
            assert r.returncode == 0, r.stderr
            hooks = [json.loads(line) for line in r.stdout.splitlines()]
            assert [h["id"] for h in hooks] == [hid, pre_id], hooks
            assert hooks[0]["modules"] == ["0", "1", "2", "2.0", "2.1", "3"], hooks
            assert hooks[1]["modules"] == ["2.0"] and hooks[1]["kind"] == "forward_pre", hooks
            assert hooks[0]["events_published"] >= 12, hooks
            r = srv.cli("hook", "ls")
            assert r.returncode == 0 and f"hook {pre_id}: model m, forward_pre '2.0'" in r.stdout, \
                r.stdout

            # A glob after the model filters on the watcher's side.
            lines = watch_while_predicting(srv, xfile, ["m:2.*", "--json", "--count", "3",
                                                        "--seconds", "30"])
            assert {json.loads(line)["module"] for line in lines} <= {"2.0", "2.1"}, lines
            # Without --json and without a terminal: one plain line per event.
            lines = watch_while_predicting(srv, xfile, ["m:3", "--count", "1", "--seconds", "30"])
            assert len(lines) == 1 and lines[0].startswith("m/3 v1 hook"), lines

            r = srv.cli("hook", "rm", str(hid))
            assert r.returncode == 0 and f"removed hook {hid}" in r.stdout, r.stderr
            r = srv.cli("hook", "rm", str(hid))
            assert r.returncode == 1 and "NOT_FOUND" in r.stderr, r.stderr
            r = srv.cli("hook", "ls", "--json")
            assert [json.loads(line)["id"] for line in r.stdout.splitlines()] == [pre_id]
        finally:
            srv.stop()


def test_hook_cli_refusals():
    with tempfile.TemporaryDirectory() as tmp:
        m, srv = serve(tmp)
        try:
            r = srv.cli("hook", "add", "m")
            assert r.returncode == 2 and "Try 'grove hook --help'" in r.stderr, r.stderr
            r = srv.cli("hook", "add", "m", "**", "--stats", "median")
            assert r.returncode == 2 and "median" in r.stderr, r.stderr
            r = srv.cli("hook", "add", "m", "**", "--every", "0")
            assert r.returncode == 2, r.stderr
            r = srv.cli("hook", "add", "m", "[0", "--kind", "forward")
            assert r.returncode == 2 and "'['" in r.stderr, r.stderr
            r = srv.cli("hook", "add", "m", "encoder.*")
            assert r.returncode == 1 and "NOT_FOUND" in r.stderr and "2.0" in r.stderr, r.stderr
            r = srv.cli("hook", "add", "nope", "**")
            assert r.returncode == 1 and "NOT_FOUND" in r.stderr, r.stderr
            r = srv.cli("hook", "rm", "x")
            assert r.returncode == 2, r.stderr
            r = srv.cli("watch", "--count", "x")
            assert r.returncode == 2, r.stderr
            r = grove("--pub", f"ipc://{tmp}/nothing.sock", "watch", "--count", "1")
            assert r.returncode == 3 and "cannot reach" in r.stderr, r.stderr
            r = grove("--server", f"ipc://{tmp}/nothing.sock", "hook", "ls")
            assert r.returncode == 3, r.stderr
            # Nothing registered: watch waits its --seconds and says so.
            r = srv.cli("watch", "--count", "1", "--seconds", "0.3")
            assert r.returncode == 1 and "0 of 1 events" in r.stderr, r.stderr
            r = grove("hook", "--help")
            assert r.returncode == 0 and "histogram[:BINS[:MIN:MAX]]" in r.stdout
            r = grove("--help")
            assert "watch [MODEL[:PATTERN]]" in r.stdout, r.stdout
        finally:
            srv.stop()
