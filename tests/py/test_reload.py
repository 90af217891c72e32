"""`grove reload` against a live groved, checked with PyTorch: after a
reload the served outputs are the new torch module's; a checkpoint that does
not fit prints what did not fit (torch's lists) and changes nothing; the exit
statuses; relative paths; in-place reloads; SIGHUP after the directory's
weights were replaced.  (tests/check_reload.c holds the storm, the refusals
one by one, --watch and the busy cases.)

Run by tests/run_py_tests.py under a python3 with torch and numpy.
"""
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch
import torch.nn as nn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from test_export_rpc import GROVE, Server  # noqa: E402
from netutil import with_admin  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import grove_export  # noqa: E402

RTOL, ATOL = 1e-4, 1e-5


def grove(*args, cwd=None):
    r = subprocess.run([GROVE, *with_admin(args)], capture_output=True, text=True, cwd=cwd,
                       timeout=120)
    return r.returncode, r.stdout, r.stderr


def mlp(seed):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(10, 20), nn.GELU(), nn.LayerNorm(20), nn.Linear(20, 3)).eval()


def served(srv, tmp, x):
    """The outputs and version groved answers for x."""
    xin, yout = os.path.join(tmp, "x.npy"), os.path.join(tmp, "y.npy")
    np.save(xin, x)
    rc, _, err = grove("--server", srv.ipc, "predict", "m", xin, "-o", yout)
    assert rc == 0, err
    return np.load(yout)


def expect(srv, tmp, m, x):
    with torch.no_grad():
        want = m(torch.from_numpy(x)).numpy()
    got = served(srv, tmp, x)
    assert np.allclose(got, want, rtol=RTOL, atol=ATOL), (got, want)


def version(srv):
    rc, out, err = grove("--server", srv.ipc, "status")
    assert rc == 0, err
    line = [l for l in out.splitlines() if l.startswith("model m:")][0]
    return int(line.split("version ")[1].split(",")[0])


def test_reload_cli():
    x = np.random.default_rng(3).standard_normal((5, 10)).astype(np.float32)
    with tempfile.TemporaryDirectory() as tmp:
        a, b = mlp(1), mlp(2)
        d = os.path.join(tmp, "m")
        grove_export.export(a, d, example_input=torch.zeros(1, 10))
        torch.save(b.state_dict(), os.path.join(tmp, "b.pt"))
        bad = b.state_dict()
        del bad["3.bias"]
        bad["4.weight"] = torch.zeros(1)
        bad["0.weight"] = torch.zeros(20, 11)
        torch.save(bad, os.path.join(tmp, "bad.pt"))
        srv = Server(tmp, [f"m={d}"])
        try:
            expect(srv, tmp, a, x)
            # A relative name is made absolute with the caller's directory.
            rc, out, err = grove("--server", srv.ipc, "reload", "m", "b.pt", cwd=tmp)
            assert rc == 0, err
            assert out.startswith("model m: version 2 serving (was 1), weights "
                                  f"{os.path.join(tmp, 'b.pt')}"), out
            expect(srv, tmp, b, x)
            # What does not fit is listed as torch lists it; nothing changes.
            rc, out, err = grove("--server", srv.ipc, "reload", "m", os.path.join(tmp, "bad.pt"))
            assert rc == 1, (rc, err)
            assert "Error(s) in loading state_dict for Sequential" in err, err
            assert "missing keys (1): 3.bias" in err, err
            assert "unexpected keys (1): 4.weight" in err, err
            assert "size mismatch for 0.weight" in err, err
            assert "version 2 keeps serving" in err, err
            expect(srv, tmp, b, x)
            rc, out, err = grove("--server", srv.ipc, "reload", "m", os.path.join(tmp, "bad.pt"),
                                 "--non-strict")
            assert rc == 1 and "size mismatch" in err, err  # a mismatch is never allowed
            # In place, back to the directory's weights (A).
            rc, out, err = grove("--server", srv.ipc, "reload", "m", "--in-place")
            assert rc == 0, err
            assert "version 3 serving (was 2)" in out and "in place (requests paused" in out, out
            expect(srv, tmp, a, x)
            # Usage and reachability.
            assert grove("--server", srv.ipc, "reload")[0] == 2
            assert grove("--server", srv.ipc, "reload", "m", "a", "b")[0] == 2
            assert grove("--server", srv.ipc, "reload", "m", "--in-place", "--model-dir", d)[0] == 2
            rc, _, err = grove("--server", srv.ipc, "reload", "nope")
            assert rc == 1 and "NOT_FOUND" in err, err
            rc, _, err = grove("--server", f"ipc://{tmp}/nobody.sock", "reload", "m")
            assert rc == 3, err
            rc, out, _ = grove("reload", "--help")
            assert rc == 0 and out.startswith("usage: grove reload MODEL"), out
            assert version(srv) == 3

            # SIGHUP after the directory's weights were replaced by a rename.
            c = mlp(9)
            tmpw = os.path.join(d, ".weights.new")
            grove_export.save_safetensors(c.state_dict(), tmpw)
            os.replace(tmpw, os.path.join(d, "weights.safetensors"))
            srv.proc.send_signal(signal.SIGHUP)
            deadline = time.monotonic() + 20
            while version(srv) != 4:
                assert time.monotonic() < deadline, srv.text()
                time.sleep(0.02)
            expect(srv, tmp, c, x)
        finally:
            srv.stop()
