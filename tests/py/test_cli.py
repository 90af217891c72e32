"""The grove command line's local commands (inspect, predict --local, bench
--local), run as a subprocess and compared with PyTorch.

Run by tests/run_py_tests.py under a python3 with torch and numpy; GROVE_BIN
is the grove binary.  Models are exported with tools/grove_export.py.
"""
import collections
import os
import re
import subprocess
import sys
import tempfile

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import grove_export  # noqa: E402

GROVE = os.environ.get("GROVE_BIN") or os.path.join(ROOT, "build", "grove")
RTOL, ATOL = 1e-4, 1e-5


def grove(*args, timeout=120):
    return subprocess.run([GROVE, *args], capture_output=True, text=True, timeout=timeout)


def mlp():
    torch.manual_seed(1234)
    m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    return m.eval()


def export_mlp(tmp, name="mlp"):
    m = mlp()
    d = os.path.join(tmp, name)
    grove_export.export(m, d, example_input=torch.randn(1, 8))
    return m, d


def torch_out(m, x):
    with torch.no_grad():
        return m(torch.from_numpy(x)).numpy()


def assert_close(got, want):
    assert got.shape == want.shape, (got.shape, want.shape)
    assert np.allclose(got, want, rtol=RTOL, atol=ATOL), np.max(np.abs(got - want))


def printed_rows(stdout):
    """The values of the '  [r] v v v' lines that predict prints."""
    rows = {}
    for line in stdout.splitlines():
        m = re.match(r"^  \[(\d+)\]((?: \S+)*?)(?: \.\.\. \(\d+ values\))?$", line)
        if m:
            rows[int(m.group(1))] = [float(v) for v in m.group(2).split()]
    return rows


# ---------------------------------------------------------------- help, usage


def test_version_and_help():
    r = grove("--version")
    assert r.returncode == 0 and r.stdout.startswith("grove "), r
    r = grove("--help")
    assert r.returncode == 0, r
    for cmd in ("inspect", "predict", "bench"):
        assert cmd in r.stdout
    # Server commands are listed with their global option.
    assert "[--server URL] status" in r.stdout, r.stdout
    for cmd in ("inspect", "predict", "bench"):
        r = grove(cmd, "--help")
        assert r.returncode == 0 and r.stdout.startswith(f"usage: grove {cmd}"), r
        r = grove("help", cmd)
        assert r.returncode == 0 and r.stdout.startswith(f"usage: grove {cmd}"), r


def test_usage_errors():
    with tempfile.TemporaryDirectory() as tmp:
        _, d = export_mlp(tmp)
        x = os.path.join(tmp, "x.npy")
        np.save(x, np.zeros((2, 8), np.float32))
        cases = [
            [],
            ["frobnicate"],
            ["--nope", "inspect", d],
            ["inspect"],
            ["inspect", d, d],
            ["inspect", "--bogus", d],
            ["predict", "--local", d],              # no input
            ["predict", "--local"],                 # --local without its value
            ["predict", "--local", d, x, "-o"],     # -o without its value
            ["predict", "--local", d, "--local", d, x],
            ["predict", "--local", d, x, "--threads", "0"],
            ["bench", "--local", d],                # no --batch
            ["bench", "--local", d, "--batch", "0"],
            ["bench", "--local", d, "--batch", "x"],
            ["bench", "--local", d, "--batch", "2", "--seconds", "-1"],
            ["bench", "--local", d, "--batch", "2", "--seconds", "nan"],
            ["bench", "--local", d, "--batch", "2", "extra"],
            ["help", "nothing"],
        ]
        for args in cases:
            r = grove(*args)
            assert r.returncode == 2, (args, r.returncode, r.stderr)
            assert r.stderr.startswith(("grove", "usage: grove")), (args, r.stderr)
            assert r.stdout == "", (args, r.stdout)


def test_server_unreachable():
    # Port 1 on loopback: nothing listens there; server commands exit 3.
    with tempfile.TemporaryDirectory() as tmp:
        x = os.path.join(tmp, "x.npy")
        np.save(x, np.zeros((2, 8), np.float32))
        for args in (["status"], ["predict", "m", x]):
            r = grove("--server", "tcp://127.0.0.1:1", *args)
            assert r.returncode == 3, (args, r.returncode, r.stderr)
            assert r.stderr, args


# ---------------------------------------------------------------- inspect


def test_inspect_safetensors():
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "w.safetensors")
        sd = collections.OrderedDict([
            ("encoder.weight", torch.randn(3, 4)),
            ("encoder.bias", torch.randn(3)),
            ("steps", torch.tensor(7, dtype=torch.int64)),
            ("half", torch.zeros(2, 5, dtype=torch.float16)),
        ])
        grove_export.save_safetensors(sd, path)
        r = grove("inspect", path)
        assert r.returncode == 0, r.stderr
        out = r.stdout
        assert "safetensors" in out
        lines = {l.split()[0]: l.split()[1:] for l in out.splitlines()[2:] if l.startswith("  ")}
        assert lines["encoder.weight"][0] == "float32" and "[3, 4]" in " ".join(lines["encoder.weight"])
        assert "[3]" in " ".join(lines["encoder.bias"])
        assert lines["steps"][0] == "int64" and "[]" in " ".join(lines["steps"])
        assert lines["half"][0] == "float16" and lines["half"][-1] == "20"
        total = 12 * 4 + 3 * 4 + 8 + 10 * 2
        assert f"total: 4 tensors, 26 elements, {total} bytes" in out, out


def test_inspect_model_dir():
    with tempfile.TemporaryDirectory() as tmp:
        m, d = export_mlp(tmp, name="tiny")
        for target in (d, os.path.join(d, "model.json")):
            r = grove("inspect", target)
            assert r.returncode == 0, r.stderr
            out = r.stdout
            assert "model: tiny" in out, out
            nparams = sum(p.numel() for p in m.parameters())
            assert f"parameters: {nparams} " in out, out
            assert "inputs:" in out and "float32 [-1, 8]" in out, out
            assert "outputs:" in out and "[-1, 4]" in out, out
            assert "max_batch_size=" in out
            for k, v in m.state_dict().items():
                line = next(l for l in out.splitlines() if l.split()[:1] == [k])
                assert str(list(v.shape)) in line, (k, line)


def test_inspect_npy():
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "a.npy")
        np.save(path, np.zeros((2, 3), np.float64))
        r = grove("inspect", path)
        assert r.returncode == 0, r.stderr
        assert "float64" in r.stdout and "[2, 3]" in r.stdout and "48 bytes" in r.stdout


def test_inspect_refuses_bad_files():
    with tempfile.TemporaryDirectory() as tmp:
        garbage = os.path.join(tmp, "garbage.safetensors")
        with open(garbage, "wb") as f:
            f.write(b"\xff" * 8 + b"this is not a checkpoint at all")
        other = os.path.join(tmp, "noise.bin")
        with open(other, "wb") as f:
            f.write(os.urandom(100))
        bad_npy = os.path.join(tmp, "bad.npy")
        np.save(bad_npy, np.zeros(4, np.float32))
        with open(bad_npy, "ab") as f:
            f.write(b"x")
        empty_dir = os.path.join(tmp, "empty_model")
        os.mkdir(empty_dir)
        for path in (garbage, other, bad_npy, empty_dir, os.path.join(tmp, "missing")):
            r = grove("inspect", path)
            assert r.returncode == 1, (path, r)
            assert os.path.basename(path) in r.stderr, (path, r.stderr)
            assert r.stderr.startswith("grove: "), r.stderr


# ---------------------------------------------------------------- predict


def test_predict_matches_torch_with_output_file():
    with tempfile.TemporaryDirectory() as tmp:
        m, d = export_mlp(tmp)
        x = np.random.default_rng(5).standard_normal((5, 8)).astype(np.float32)
        xp, yp = os.path.join(tmp, "x.npy"), os.path.join(tmp, "y.npy")
        np.save(xp, x)
        r = grove("predict", "--local", d, xp, "-o", yp)
        assert r.returncode == 0, r.stderr
        y = np.load(yp)
        assert y.dtype == np.float32
        assert_close(y, torch_out(m, x))
        # --output=FILE and an existing file are fine too.
        r = grove("predict", "--local", d, "--output=" + yp, xp)
        assert r.returncode == 0, r.stderr
        assert_close(np.load(yp), torch_out(m, x))


def test_predict_prints_without_output_file():
    with tempfile.TemporaryDirectory() as tmp:
        m, d = export_mlp(tmp)
        x = np.random.default_rng(6).standard_normal((3, 8)).astype(np.float32)
        xp = os.path.join(tmp, "x.npy")
        np.save(xp, x)
        r = grove("predict", "--local", d, xp)
        assert r.returncode == 0, r.stderr
        assert re.search(r"^\S+ float32 \[3, 4\]$", r.stdout, re.M), r.stdout
        rows = printed_rows(r.stdout)
        want = torch_out(m, x)
        assert sorted(rows) == [0, 1, 2], r.stdout
        for i, vals in rows.items():
            assert_close(np.array(vals, np.float32), want[i])


def test_predict_many_rows_prints_the_first():
    with tempfile.TemporaryDirectory() as tmp:
        m, d = export_mlp(tmp)
        x = np.random.default_rng(7).standard_normal((20, 8)).astype(np.float32)
        xp = os.path.join(tmp, "x.npy")
        np.save(xp, x)
        r = grove("predict", "--local", d, xp)
        assert r.returncode == 0, r.stderr
        rows = printed_rows(r.stdout)
        want = torch_out(m, x)
        assert 1 <= len(rows) < 20 and "(20 rows)" in r.stdout, r.stdout
        for i, vals in rows.items():
            assert_close(np.array(vals, np.float32), want[i])


def test_predict_input_dtypes():
    with tempfile.TemporaryDirectory() as tmp:
        m, d = export_mlp(tmp)
        # float64 holding values float32 represents exactly: converted.
        x64 = (np.arange(16, dtype=np.float64).reshape(2, 8) - 8) / 4
        xp, yp = os.path.join(tmp, "x64.npy"), os.path.join(tmp, "y.npy")
        np.save(xp, x64)
        r = grove("predict", "--local", d, xp, "-o", yp)
        assert r.returncode == 0, r.stderr
        assert_close(np.load(yp), torch_out(m, x64.astype(np.float32)))
        # int32 values convert exactly to float32.
        np.save(xp, np.arange(16, dtype=np.int32).reshape(2, 8))
        r = grove("predict", "--local", d, xp, "-o", yp)
        assert r.returncode == 0, r.stderr
        # 0.1 has no exact float32: refused, naming the file.
        np.save(xp, np.full((2, 8), 0.1))
        r = grove("predict", "--local", d, xp, "-o", yp)
        assert r.returncode == 1 and "x64.npy" in r.stderr and "float32" in r.stderr, r.stderr
        # A shape the model does not take.
        bad = os.path.join(tmp, "bad_shape.npy")
        np.save(bad, np.zeros((2, 7), np.float32))
        r = grove("predict", "--local", d, bad)
        assert r.returncode == 1 and r.stderr.startswith("grove: "), r.stderr
        # Not a .npy file.
        junk = os.path.join(tmp, "junk.npy")
        with open(junk, "wb") as f:
            f.write(b"hello")
        r = grove("predict", "--local", d, junk)
        assert r.returncode == 1 and "junk.npy" in r.stderr, r.stderr
        # Not a model directory.
        r = grove("predict", "--local", os.path.join(tmp, "nowhere"), bad)
        assert r.returncode == 1 and "nowhere" in r.stderr, r.stderr


def test_predict_embedding_indices():
    with tempfile.TemporaryDirectory() as tmp:
        torch.manual_seed(99)
        m = torch.nn.Sequential(torch.nn.Embedding(10, 6), torch.nn.Linear(6, 3)).eval()
        d = os.path.join(tmp, "emb")
        grove_export.export(m, d, example_input=torch.zeros(1, 5, dtype=torch.int64))
        idx = np.random.default_rng(8).integers(0, 10, size=(4, 5))
        want = torch_out(m, idx.astype(np.int64))
        xp, yp = os.path.join(tmp, "idx.npy"), os.path.join(tmp, "y.npy")
        for dt in (np.int64, np.int32, np.uint8):
            np.save(xp, idx.astype(dt))
            r = grove("predict", "--local", d, xp, "-o", yp)
            assert r.returncode == 0, (dt, r.stderr)
            assert_close(np.load(yp), want)
        # Floats are never taken as indices.
        np.save(xp, idx.astype(np.float32))
        r = grove("predict", "--local", d, xp, "-o", yp)
        assert r.returncode == 1 and "int64" in r.stderr, r.stderr


# ---------------------------------------------------------------- bench


def test_bench_last_line():
    with tempfile.TemporaryDirectory() as tmp:
        _, d = export_mlp(tmp)
        r = grove("bench", "--local", d, "--batch", "4", "--seconds", "0.2", "--threads", "1")
        assert r.returncode == 0, r.stderr
        last = r.stdout.rstrip("\n").splitlines()[-1]
        m = re.fullmatch(r"batch=4 samples_per_s=(\d+(?:\.\d+)?) ms_per_batch=(\d+(?:\.\d+)?)",
                         last)
        assert m, last
        assert float(m.group(1)) > 0 and float(m.group(2)) > 0
