"""`grove export` against a live groved, checked with PyTorch: the .pt file
torch.load(weights_only=True) reads and a .safetensors file read by hand (the
safetensors package is not packaged on Debian) give back exactly the
state_dict that was served (keys, order, dtypes, bits, tied storage), and
loading it into the original module with strict=True gives identical
outputs.  A model of a few hundred MB exports with bounded memory on both
sides (peak RSS of the CLI and growth of groved's measured); the 2 GB case
runs with GROVE_SLOW=1.

Run by tests/run_py_tests.py under a python3 with torch; GROVE_BIN is the
grove binary and groved sits next to it.
"""
import json
import os
import signal
import struct
import subprocess
import sys
import tempfile
import time
from collections import OrderedDict

import torch
import torch.nn as nn

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import grove_export  # noqa: E402

from netutil import admin_listen, free_port, register_admin, with_admin

GROVE = os.path.abspath(os.environ.get("GROVE_BIN") or os.path.join(ROOT, "build", "grove"))
GROVED = os.environ.get("GROVED_BIN") or os.path.join(os.path.dirname(os.path.realpath(GROVE)),
                                                      "groved")
MB = 1 << 20


def _sanitized():
    """A sanitizer build keeps freed memory in quarantine (ASan): its RSS says
    nothing about the program's own bounds."""
    try:
        with open(GROVE, "rb") as f:
            return b"__asan_init" in f.read()
    except OSError:
        return False


SANITIZED = _sanitized()


class Server:
    """groved serving NAME=DIR models on an ipc socket in tmp."""

    def __init__(self, tmp, models, extra=()):
        self.ipc = f"ipc://{tmp}/groved.sock"
        self.admin = admin_listen(tmp)
        tcp = f"tcp://127.0.0.1:{free_port()}"
        register_admin(self.admin, self.ipc, tcp)
        self.log = open(os.path.join(tmp, "groved.log"), "w+")
        args = [GROVED, "--listen", self.ipc, "--listen", tcp, "--admin-listen", self.admin,
                "--checkpoint-dir", tmp, "--http", "none", "--pub", f"ipc://{tmp}/pub.sock",
                "--workers", "1", *extra]
        for m in models:
            args += ["--model", m]
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        sock = self.ipc[len("ipc://"):]
        while not os.path.exists(sock):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"groved did not start:\n{self.text()}")
            time.sleep(0.02)

    def text(self):
        self.log.seek(0)
        return self.log.read()

    def status(self, field):
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
        raise AssertionError(field)

    def reset_peak(self):
        """Lets VmHWM start again from the current RSS (Linux clear_refs 5)."""
        with open(f"/proc/{self.proc.pid}/clear_refs", "w") as f:
            f.write("5")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                rc = self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError("groved did not drain within 60 s")
            assert rc == 0, f"groved exited {rc}:\n{self.text()}"
        self.log.close()


def grove(*args, cwd=None, timeout=300):
    """Runs the CLI; returns (returncode, stdout, stderr)."""
    r = subprocess.run([GROVE, *with_admin(args)], capture_output=True, text=True, cwd=cwd,
                       timeout=timeout)
    return r.returncode, r.stdout, r.stderr


def grove_rss(*args, timeout=600):
    """Runs the CLI and returns (returncode, stderr, its peak RSS in bytes):
    the largest VmHWM read from /proc while it runs (the rusage of a child
    would include the memory of this process, which it was forked from)."""
    with tempfile.TemporaryFile() as errf:
        p = subprocess.Popen([GROVE, *with_admin(args)], stdout=subprocess.DEVNULL, stderr=errf)
        peak = 0
        deadline = time.monotonic() + timeout
        while p.poll() is None:
            try:
                with open(f"/proc/{p.pid}/status") as f:
                    for line in f:
                        if line.startswith("VmHWM:"):
                            peak = max(peak, int(line.split()[1]) * 1024)
            except (FileNotFoundError, ProcessLookupError, ValueError):
                pass
            if time.monotonic() > deadline:
                p.kill()
                raise AssertionError("grove export did not finish")
            time.sleep(0.005)
        errf.seek(0)
        return p.returncode, errf.read().decode(), peak


ST_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
             "F64": torch.float64, "I64": torch.int64, "I32": torch.int32, "I16": torch.int16,
             "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool}


def read_safetensors(path):
    """A safetensors reader: the header's order, dtypes and bytes."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n], object_pairs_hook=OrderedDict)
    meta = header.pop("__metadata__", None)
    assert meta == {"format": "pt"}, meta
    base = 8 + n
    out = OrderedDict()
    for key, e in header.items():
        b, end = e["data_offsets"]
        raw = bytearray(data[base + b:base + end])
        t = torch.frombuffer(raw, dtype=ST_DTYPES[e["dtype"]]) if raw else \
            torch.empty(0, dtype=ST_DTYPES[e["dtype"]])
        out[key] = t.reshape(e["shape"])
    return out


def same_bits(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and \
        a.contiguous().numpy().tobytes() == b.contiguous().numpy().tobytes()


def check_state_dict(got, want):
    assert list(got.keys()) == list(want.keys()), (list(got.keys()), list(want.keys()))
    for k in want:
        assert same_bits(got[k], want[k]), f"{k}: {got[k].dtype} {tuple(got[k].shape)} vs " \
                                           f"{want[k].dtype} {tuple(want[k].shape)}"


def bn_mlp():
    torch.manual_seed(77)
    m = nn.Sequential(nn.Linear(12, 24), nn.BatchNorm1d(24), nn.ReLU(), nn.Linear(24, 5))
    m.train()
    with torch.no_grad():
        for _ in range(4):
            m(torch.randn(32, 12))
    return m.eval()


class Tied(nn.Module):
    """An embedding whose matrix is also the output projection."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(20, 8)
        self.proj = nn.Linear(8, 20)
        self.proj.weight = self.embed.weight

    def forward(self, x):
        return self.proj(self.embed(x))


def test_export_equals_served_checkpoint():
    cases = [("bn", bn_mlp(), torch.randn(7, 12), "pt"),
             ("bn_st", bn_mlp(), torch.randn(7, 12), "safetensors"),
             ("tied", Tied().eval(), torch.randint(0, 20, (3, 5)), "pt")]
    with tempfile.TemporaryDirectory() as tmp:
        models = []
        for name, m, x, fmt in cases:
            grove_export.export(m, os.path.join(tmp, name), example_input=x[:1], weights=fmt)
            models.append(f"{name}={os.path.join(tmp, name)}")
        srv = Server(tmp, models)
        try:
            for name, m, x, fmt in cases:
                want = m.state_dict()
                pt = os.path.join(tmp, f"{name}_out.pt")
                st = os.path.join(tmp, f"{name}_out.safetensors")
                for out in (pt, st):
                    rc, stdout, err = grove("--server", srv.ipc, "export", name, "-o", out)
                    assert rc == 0, err
                    assert f"model {name} version 1: {len(want)} tensors" in stdout, stdout
                got = torch.load(pt, weights_only=True)
                check_state_dict(got, want)
                check_state_dict(read_safetensors(st), want)
                if name != "tied":
                    assert got["1.num_batches_tracked"].dtype == torch.int64
                    assert int(got["1.num_batches_tracked"]) == 4
                else:
                    # One storage under both keys, as torch.save of a tied
                    # state_dict writes it.
                    assert got["embed.weight"].data_ptr() == got["proj.weight"].data_ptr()
                # Into the original module, strictly: identical outputs.
                fresh = type(m)() if name == "tied" else bn_mlp()
                fresh.load_state_dict(got, strict=True)
                fresh.eval()
                with torch.no_grad():
                    assert torch.equal(fresh(x), m(x))
                fresh.load_state_dict(read_safetensors(st), strict=True)
                with torch.no_grad():
                    assert torch.equal(fresh(x), m(x))
            # A prefix keeps those keys, unchanged.
            out = os.path.join(tmp, "part.pt")
            rc, _, err = grove("--server", srv.ipc, "export", "bn", "-o", out, "--prefix", "1.")
            assert rc == 0, err
            part = torch.load(out, weights_only=True)
            assert list(part) == [k for k in bn_mlp().state_dict() if k.startswith("1.")]
            # The CLI's refusals: an existing file, a bad name, an unknown model.
            rc, _, err = grove("--server", srv.ipc, "export", "bn", "-o", out)
            assert rc == 1 and "exists; --force" in err, err
            rc, _, err = grove("--server", srv.ipc, "export", "bn", "-o", out, "--force")
            assert rc == 0, err
            rc, _, err = grove("--server", srv.ipc, "export", "bn", "-o", os.path.join(tmp, "x.h5"))
            assert rc == 1 and ".safetensors" in err, err
            rc, _, err = grove("--server", srv.ipc, "export", "nope", "-o",
                               os.path.join(tmp, "n.pt"))
            assert rc == 1 and "NOT_FOUND" in err, err
            rc, _, err = grove("--server", srv.ipc, "export", "bn")
            assert rc == 2 and "-o" in err, err
            rc, _, err = grove("--server", f"ipc://{tmp}/nobody.sock", "export", "bn", "-o",
                               os.path.join(tmp, "u.pt"))
            assert rc == 3, err
            assert not [f for f in os.listdir(tmp) if ".tmp-" in f], os.listdir(tmp)
        finally:
            srv.stop()


def big_model(layers, width):
    torch.manual_seed(5)
    mods = []
    for i in range(layers):
        mods.append(nn.Linear(width, width))
        if i + 1 < layers:
            mods.append(nn.ReLU())
    m = nn.Sequential(*mods).eval()
    return m


def export_big(layers, width):
    """Exports a model of layers x width^2 floats both ways; checks the bytes
    and the memory on both sides."""
    m = big_model(layers, width)
    want = m.state_dict()
    nbytes = sum(t.numel() * t.element_size() for t in want.values())
    with tempfile.TemporaryDirectory() as tmp:
        d = os.path.join(tmp, "big")
        grove_export.export(m, d, example_input=torch.zeros(1, width),
                            batching={"max_batch_size": 4})
        srv = Server(tmp, [f"big={d}"])
        try:
            for ext in ("pt", "safetensors"):
                out = os.path.join(tmp, f"out.{ext}")
                srv.reset_peak()
                before = srv.status("VmRSS")
                t0 = time.monotonic()
                # The .safetensors asks for more than the server's 16 MiB per reply.
                more = ["--chunk-bytes", str(64 * MB)] if ext == "safetensors" else []
                rc, err, cli_peak = grove_rss("--server", srv.ipc, "export", "big", "-o", out, *more)
                dt = time.monotonic() - t0
                assert rc == 0, err
                server_growth = srv.status("VmHWM") - before
                print(f"    export {nbytes / MB:.0f} MB as .{ext}: {dt:.2f} s, client peak RSS "
                      f"{cli_peak / MB:.1f} MB, groved peak growth {server_growth / MB:.1f} MB")
                # Bounded by a few chunks (8 MiB each), not by the model.
                if not SANITIZED:
                    assert cli_peak < 128 * MB, cli_peak
                    assert server_growth < 128 * MB, server_growth
                got = torch.load(out, weights_only=True) if ext == "pt" else read_safetensors(out)
                check_state_dict(got, want)
                del got
                os.unlink(out)
        finally:
            srv.stop()


def test_export_large_model():
    export_big(4, 4096)  # 256 MB of float32


def test_export_2gb_slow():
    if os.environ.get("GROVE_SLOW") != "1":
        import unittest
        raise unittest.SkipTest("2 GB export: set GROVE_SLOW=1")
    export_big(8, 8192)  # 2 GiB of float32
