"""The grove command line's server commands (status, predict MODEL, bench MODEL
--concurrency) against a live groved, compared with PyTorch.

Run by tests/run_py_tests.py under a python3 with torch and numpy; GROVE_BIN
is the grove binary and groved sits next to it.  Each test starts its own
groved on an ipc socket in a temporary directory (and 127.0.0.1 on a free
port), with --http none, and stops it with SIGTERM (which must exit 0).
Until client/grove.c dispatches the server commands the tests skip.
"""
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import unittest

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import grove_export  # noqa: E402

from netutil import admin_listen, free_port

GROVE = os.environ.get("GROVE_BIN") or os.path.join(ROOT, "build", "grove")
GROVED = os.environ.get("GROVED_BIN") or os.path.join(os.path.dirname(os.path.realpath(GROVE)),
                                                      "groved")
RTOL, ATOL = 1e-4, 1e-5


def grove(*args, timeout=60, env=None):
    return subprocess.run([GROVE, *args], capture_output=True, text=True, timeout=timeout,
                          env=env)


class Server:
    """groved serving the model directories given as NAME=DIR."""

    def __init__(self, tmp, models, extra=()):
        self.ipc = f"ipc://{tmp}/groved.sock"
        self.tcp = f"tcp://127.0.0.1:{free_port()}"
        self.log = open(os.path.join(tmp, "groved.log"), "w+")
        self.admin = admin_listen(tmp)
        args = [GROVED, "--listen", self.ipc, "--listen", self.tcp, "--http", "none",
                "--admin-listen", self.admin, "--workers", "1", *extra]
        for m in models:
            args += ["--model", m]
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        sock = self.ipc[len("ipc://"):]
        while not os.path.exists(sock):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"groved did not start:\n{self.text()}")
            time.sleep(0.02)

    def text(self):
        self.log.seek(0)
        return self.log.read()

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


def mlp():
    torch.manual_seed(4321)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(),
                               torch.nn.Linear(16, 3)).eval()


def serve(tmp):
    m = mlp()
    d = os.path.join(tmp, "mlp")
    grove_export.export(m, d, example_input=torch.randn(1, 8))
    return m, Server(tmp, [f"m={d}"])


def skip_unless_wired(srv):
    r = grove("--server", srv.ipc, "status")
    if r.returncode == 2 and ("unknown" in r.stderr):
        raise unittest.SkipTest("client/grove.c does not dispatch the server commands yet: "
                                + r.stderr.strip().splitlines()[0])


def test_predict_equals_torch():
    with tempfile.TemporaryDirectory() as tmp:
        m, srv = serve(tmp)
        try:
            skip_unless_wired(srv)
            x = np.random.default_rng(5).standard_normal((6, 8)).astype(np.float32)
            np.save(os.path.join(tmp, "x.npy"), x)
            for url in (srv.ipc, srv.tcp):
                out = os.path.join(tmp, "y.npy")
                r = grove("--server", url, "predict", "m", os.path.join(tmp, "x.npy"), "-o", out)
                assert r.returncode == 0, r.stderr
                with torch.no_grad():
                    want = m(torch.from_numpy(x)).numpy()
                got = np.load(out)
                assert got.shape == want.shape
                assert np.allclose(got, want, rtol=RTOL, atol=ATOL)
            # Without -o the rows are printed as predict --local prints them.
            r = grove("--server", srv.ipc, "predict", "m", os.path.join(tmp, "x.npy"))
            assert r.returncode == 0, r.stderr
            assert r.stdout.startswith("y float32 [6, 3]\n"), r.stdout
            first = [float(v) for v in r.stdout.splitlines()[1].split()[1:]]
            assert np.allclose(first, want[0], rtol=1e-5, atol=1e-6)
            # float64 that is exactly representable converts; other values refuse.
            np.save(os.path.join(tmp, "x64.npy"), x.astype(np.float64))
            r = grove("--server", srv.ipc, "predict", "m", os.path.join(tmp, "x64.npy"))
            assert r.returncode == 0, r.stderr
            np.save(os.path.join(tmp, "x64b.npy"), x.astype(np.float64) + 1e-12)
            r = grove("--server", srv.ipc, "predict", "m", os.path.join(tmp, "x64b.npy"))
            assert r.returncode == 1 and "no exact float32 value" in r.stderr, r.stderr
        finally:
            srv.stop()


def test_exit_statuses():
    with tempfile.TemporaryDirectory() as tmp:
        m, srv = serve(tmp)
        try:
            skip_unless_wired(srv)
            np.save(os.path.join(tmp, "x.npy"), np.zeros((1, 8), np.float32))
            np.save(os.path.join(tmp, "bad.npy"), np.zeros((1, 7), np.float32))
            r = grove("--server", srv.ipc, "predict", "nope", os.path.join(tmp, "x.npy"))
            assert r.returncode == 1 and "NOT_FOUND" in r.stderr, r.stderr
            r = grove("--server", srv.ipc, "predict", "m", os.path.join(tmp, "bad.npy"))
            assert r.returncode == 1 and "INVALID_ARGUMENT" in r.stderr and "[1, 7]" in r.stderr, \
                r.stderr
            r = grove("--server", srv.ipc, "predict", "m")
            assert r.returncode == 2 and "Try 'grove predict --help'" in r.stderr, r.stderr
            r = grove("--server", srv.ipc, "bench", "m", "--batch", "1")
            assert r.returncode == 2 and "--concurrency" in r.stderr, r.stderr
            r = grove("--server", f"ipc://{tmp}/nothing.sock", "status")
            assert r.returncode == 3 and "cannot reach" in r.stderr, r.stderr
            r = grove("--server", f"tcp://127.0.0.1:{free_port()}", "predict", "m",
                      os.path.join(tmp, "x.npy"))
            assert r.returncode == 3, r.stderr
        finally:
            srv.stop()


def test_status_and_bench():
    with tempfile.TemporaryDirectory() as tmp:
        m, srv = serve(tmp)
        try:
            skip_unless_wired(srv)
            r = grove("--server", srv.tcp, "status")
            assert r.returncode == 0, r.stderr
            assert "model m: version 1, ready" in r.stdout, r.stdout
            assert "inputs:  x float32 [-1, 8]" in r.stdout, r.stdout
            r = grove("--server", srv.ipc, "bench", "m", "--concurrency", "4", "--batch", "2",
                      "--seconds", "0.5")
            assert r.returncode == 0, r.stderr
            last = r.stdout.strip().splitlines()[-1]
            mm = re.fullmatch(r"requests=(\d+) errors=(\d+) samples_per_s=([\d.]+) "
                              r"p50_ms=([\d.]+) p99_ms=([\d.]+)", last)
            assert mm, last
            assert int(mm.group(1)) > 0 and int(mm.group(2)) == 0, last
            assert float(mm.group(4)) <= float(mm.group(5)), last
        finally:
            srv.stop()


def test_admin_commands_go_to_the_admin_listener():
    """grove status shows both planes; admin commands go to --admin, else
    $GROVE_ADMIN, with --token-file or $GROVE_ADMIN_TOKEN; on the data
    listener they are refused naming the admin one."""
    with tempfile.TemporaryDirectory() as tmp:
        m = mlp()
        d = os.path.join(tmp, "mlp")
        grove_export.export(m, d, example_input=torch.randn(1, 8))
        tok = os.path.join(tmp, "token")
        with open(tok, "w") as f:
            f.write("cli-admin-secret\n")
        os.chmod(tok, 0o600)
        srv = Server(tmp, [f"m={d}"], extra=("--admin-token-file", tok, "--pub",
                                              f"ipc://{tmp}/pub.sock"))
        try:
            r = grove("--server", srv.tcp, "status")
            assert r.returncode == 0, r.stderr
            assert f"data plane:  {srv.ipc}, {srv.tcp} (predict" in r.stdout, r.stdout
            assert f"admin plane: {srv.admin} (reload, export, hooks, training)" in r.stdout, \
                r.stdout
            env = {k: v for k, v in os.environ.items()
                   if k not in ("GROVE_ADMIN", "GROVE_ADMIN_TOKEN")}
            # The data listener named as the admin one: the server refuses.
            r = grove("--server", srv.tcp, "--admin", srv.tcp, "--token-file", tok, "reload", "m",
                      env=env)
            assert r.returncode == 1 and "PERMISSION_DENIED" in r.stderr, r.stderr
            assert srv.admin in r.stderr, r.stderr
            # --admin without the token; with it.
            r = grove("--admin", srv.admin, "reload", "m", env=env)
            assert r.returncode == 1 and "UNAUTHENTICATED" in r.stderr, r.stderr
            assert "cli-admin-secret" not in r.stderr
            r = grove("--admin", srv.admin, "--token-file", tok, "reload", "m", env=env)
            assert r.returncode == 0 and "version 2 serving" in r.stdout, r.stdout + r.stderr
            # The defaults: $GROVE_ADMIN and $GROVE_ADMIN_TOKEN.
            env2 = dict(env, GROVE_ADMIN=srv.admin, GROVE_ADMIN_TOKEN="cli-admin-secret")
            for args in (["reload", "m"], ["hook", "add", "m", "*"], ["hook", "ls"],
                         ["export", "m", "-o", os.path.join(tmp, "m.safetensors")]):
                r = grove("--server", srv.ipc, *args, env=env2)
                assert r.returncode == 0, (args, r.stdout, r.stderr)
            r = grove("--server", srv.ipc, "hook", "ls", env=dict(env2, GROVE_ADMIN_TOKEN="no"))
            assert r.returncode == 1 and "UNAUTHENTICATED" in r.stderr, r.stderr
            # Nothing at the admin URL: exit 3, saying where admin commands go.
            r = grove("--admin", f"ipc://{tmp}/nothing.sock", "reload", "m", env=env)
            assert r.returncode == 3 and "--admin" in r.stderr, r.stderr
            assert "cli-admin-secret" not in srv.text()
        finally:
            srv.stop()
