"""Sequence models served by groved: several named inputs and several
outputs through `grove predict` and the Python client, and token batches of
different lengths batched only with requests of their own length.

The model: token ids (int64 [B, T]) and a mask ([B, T], float32 in the spec;
`grove predict` converts an int64 0/1 file losslessly) into an Embedding, an
LSTM, a masked mean over the tokens and two heads, exported with a long
batching delay so that concurrent requests meet in the queue.  Every answer
must be torch's for that request alone (rtol 1e-4, atol 1e-5).

Run by tests/run_py_tests.py under a python3 with torch and numpy.
"""
import os
import subprocess
import sys
import tempfile
import threading

import numpy as np
import torch
import torch.nn as nn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from test_pyclient import GROVE, Groved, load_grove  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tools"))
from grove_export import export  # noqa: E402

RTOL, ATOL = 1e-4, 1e-5


class Tagger(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(30, 8)
        self.lstm = nn.LSTM(8, 12, batch_first=True, bidirectional=True)
        self.cls = nn.Linear(24, 3)
        self.tok = nn.Linear(24, 2)

    def forward(self, ids, mask):
        out, (h, c) = self.lstm(self.emb(ids))
        pooled = (out * mask[:, :, None]).sum(1) / mask.sum(1, keepdim=True)
        return self.cls(pooled), self.tok(out)


def _inputs(rng, rows, length):
    ids = rng.integers(1, 30, (rows, length)).astype(np.int64)
    mask = np.ones((rows, length), dtype=np.float32)
    mask[:, length - 1 - rng.integers(0, 2):] = 0  # padding at the end
    mask[:, 0] = 1
    return ids, mask


def _torch(m, ids, mask):
    with torch.no_grad():
        a, b = m(torch.from_numpy(ids), torch.from_numpy(mask.astype(np.float32)))
    return a.numpy(), b.numpy()


def _serve(tmp, delay_us):
    torch.manual_seed(21)
    m = Tagger().eval()
    d = os.path.join(tmp, "seq")
    ex = _inputs(np.random.default_rng(0), 2, 5)
    export(m, d, example_input=tuple(torch.from_numpy(x) for x in ex),
           batching={"max_batch_size": 64, "max_queue_delay_us": delay_us})
    return m, Groved(tmp, "seq", pub=False, models=[f"seq={d}"])


def test_named_inputs_cli_and_client():
    grove = load_grove()
    rng = np.random.default_rng(1)
    with tempfile.TemporaryDirectory() as tmp:
        m, srv = _serve(tmp, 500)
        try:
            ids, mask = _inputs(rng, 3, 7)
            want = _torch(m, ids, mask)
            with grove.Client(srv.url) as c:
                info = c.model_info("seq")
                assert [i["name"] for i in info["inputs"]] == ["ids", "mask"]
                assert [i["dtype"] for i in info["inputs"]] == ["int64", "float32"]
                for p in (c.predict("seq", ids, mask), c.predict("seq", mask=mask, ids=ids)):
                    got = list(p.values())
                    assert len(got) == 2
                    for g, w in zip(got, want):
                        assert g.shape == w.shape and np.allclose(g, w, rtol=RTOL, atol=ATOL)
                try:
                    c.predict("seq", ids=ids, msk=mask)
                    raise AssertionError("an unknown input name was accepted")
                except TypeError as e:
                    assert "no input 'msk' (its inputs: ids, mask)" in str(e), e
            # grove predict: NAME=FILE in any order, an int64 mask converted losslessly.
            np.save(os.path.join(tmp, "ids.npy"), ids)
            np.save(os.path.join(tmp, "mask.npy"), mask.astype(np.int64))
            outs = [os.path.join(tmp, f"o{k}.npy") for k in range(2)]
            r = subprocess.run([GROVE, "--server", srv.url, "predict", "seq",
                                f"mask={tmp}/mask.npy", f"ids={tmp}/ids.npy",
                                "-o", outs[0], "-o", outs[1]], capture_output=True, text=True)
            assert r.returncode == 0, r.stderr
            for o, w in zip(outs, want):
                assert np.allclose(np.load(o), w, rtol=RTOL, atol=ATOL)
            r = subprocess.run([GROVE, "--server", srv.url, "predict", "seq",
                                f"{tmp}/ids.npy", f"mask={tmp}/mask.npy"],
                               capture_output=True, text=True)
            assert r.returncode == 1 and "all as NAME=FILE.npy or all in order" in r.stderr, \
                r.stderr
            r = subprocess.run([GROVE, "--server", srv.url, "predict", "seq",
                                f"ids={tmp}/ids.npy"], capture_output=True, text=True)
            assert r.returncode == 1 and "input 'mask' of model seq was not given" in r.stderr, \
                r.stderr
            # --local takes the same names.
            r = subprocess.run([GROVE, "predict", "--local", os.path.join(tmp, "seq"),
                                f"mask={tmp}/mask.npy", f"ids={tmp}/ids.npy", "-o", outs[0]],
                               capture_output=True, text=True)
            assert r.returncode == 0, r.stderr
            assert np.allclose(np.load(outs[0]), want[0], rtol=RTOL, atol=ATOL)
        finally:
            srv.stop()


def test_token_batches_of_different_lengths():
    """42 requests of lengths 4, 7 and 11 sent at once: each batch holds one
    length only (its batch_rows never counts rows of another length), and
    every answer is torch's for that request alone.  groved dispatches at
    once to an idle worker, so batches form behind the first one: with one
    worker and 42 requests in flight, some do."""
    grove = load_grove()
    rng = np.random.default_rng(2)
    with tempfile.TemporaryDirectory() as tmp:
        m, srv = _serve(tmp, 200000)
        try:
            reqs = []
            for length in (4, 7, 11, 7, 4, 11, 4) * 6:
                rows = int(rng.integers(1, 4))
                reqs.append(_inputs(rng, rows, length))
            rows_of = {}
            for ids, _ in reqs:
                rows_of[ids.shape[1]] = rows_of.get(ids.shape[1], 0) + ids.shape[0]
            results = [None] * len(reqs)
            barrier = threading.Barrier(len(reqs))

            def run(k):
                with grove.Client(srv.url) as c:
                    barrier.wait()
                    results[k] = c.predict("seq", ids=reqs[k][0], mask=reqs[k][1])

            threads = [threading.Thread(target=run, args=(k,)) for k in range(len(reqs))]
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
            batched = False
            for (ids, mask), p in zip(reqs, results):
                assert p is not None, srv.text()
                length = ids.shape[1]
                assert ids.shape[0] <= p.batch_rows <= rows_of[length], \
                    (length, p.batch_rows, rows_of)
                batched |= p.batch_rows > ids.shape[0]
                for g, w in zip(p.values(), _torch(m, ids, mask)):
                    assert g.shape == w.shape, (g.shape, w.shape)
                    assert np.allclose(g, w, rtol=RTOL, atol=ATOL), float(np.max(np.abs(g - w)))
            # Same-length requests did meet (else the test would prove nothing).
            assert batched, [p.batch_rows for p in results]
        finally:
            srv.stop()
