"""Models whose dimension 0 is not a batch of independent rows, served by
groved: a top-level LSTM (sequence first, h_n and c_n with the batch in
dimension 1), a batch-first GRU (its h_n too), and a custom module whose
sequence-first LSTM output has dimension 0 as time.  grove_model_open's probe
(core/model/model_probe.c) finds each and groved serves it one request per
forward, inputs and outputs whole, as Triton serves max_batch_size 0.
Without it the first two failed every predict (an output groved could not
split) and the third mixed concurrent clients' sequences into one.

Every answer must be torch's for that request alone (rtol 1e-4, atol 1e-5),
with requests sent concurrently to one worker behind a long batching delay,
so that a batched server would have put them into one forward.  A batch-first
model keeps its batching; a spec's own max_batch_size 0 is served unbatched
without the probe's warning.

Run by tests/run_py_tests.py under a python3 with torch and numpy.
"""
import json
import os
import sys
import tempfile
import threading

import numpy as np
import torch
import torch.nn as nn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from test_pyclient import Groved, load_grove  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tools"))
from grove_export import export  # noqa: E402

RTOL, ATOL = 1e-4, 1e-5
DELAY_US = 200000  # long: concurrent requests would meet in one batch


class SeqFirstTagger(nn.Module):
    """Dimension 0 is time: the rows of a "batch" along it are one sequence."""

    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(4, 6)
        self.head = nn.Linear(6, 3)

    def forward(self, x):
        out, _ = self.lstm(x)
        return self.head(out)


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        return torch.tanh(self.fc(x))


def _torch(m, x):
    with torch.no_grad():
        y = m(torch.from_numpy(x))
    flat = []

    def walk(v):
        if isinstance(v, (tuple, list)):
            for e in v:
                walk(e)
        else:
            flat.append(v.numpy())

    walk(y)
    return flat


def _concurrently(c, name, xs):
    """Sends every x at once from its own thread; returns the answers in order."""
    got = [None] * len(xs)
    errs = []
    start = threading.Barrier(len(xs))

    def one(k):
        try:
            start.wait()
            got[k] = list(c.predict(name, xs[k]).values())
        except Exception as e:  # noqa: BLE001 - reported below
            errs.append(f"request {k}: {e}")

    ts = [threading.Thread(target=one, args=(k,)) for k in range(len(xs))]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errs, errs
    return got


def _check_served(tmp, name, m, xs, want_unbatched, batching=None):
    d = os.path.join(tmp, name)
    export(m, d, example_input=torch.from_numpy(xs[0]),
           batching=batching or {"max_batch_size": 64, "max_queue_delay_us": DELAY_US})
    grove = load_grove()
    srv = Groved(tmp, name, pub=False, models=[f"{name}={d}"])
    try:
        with grove.Client(srv.url) as c:
            info = c.model_info(name)
            assert (info["batching"]["max_batch_size"] == 0) == want_unbatched, info
            got = _concurrently(c, name, xs)
        for x, g in zip(xs, got):
            want = _torch(m, x)
            assert len(g) == len(want), (len(g), len(want))
            for a, b in zip(g, want):
                assert a.shape == b.shape, (a.shape, b.shape)
                assert np.allclose(a, b, rtol=RTOL, atol=ATOL), np.abs(a - b).max()
        return srv.text()
    finally:
        srv.stop()


def _seqs(rng, shapes):
    return [rng.standard_normal(s).astype(np.float32) for s in shapes]


def test_top_level_lstm_sequence_first():
    torch.manual_seed(1)
    m = nn.LSTM(4, 5, num_layers=2).eval()
    rng = np.random.default_rng(1)
    xs = _seqs(rng, [(3, 2, 4), (3, 2, 4), (5, 1, 4), (3, 2, 4), (2, 3, 4), (5, 1, 4)])
    with tempfile.TemporaryDirectory() as tmp:
        log = _check_served(tmp, "lstm", m, xs, True)
        assert "model.unbatched" in log and "output 'y" in log, log


def test_top_level_gru_batch_first():
    """Batch first, but h_n is [layers, N, H]: dimension 0 of it is not the batch."""
    torch.manual_seed(2)
    m = nn.GRU(4, 5, batch_first=True).eval()
    rng = np.random.default_rng(2)
    xs = _seqs(rng, [(2, 3, 4), (1, 3, 4), (2, 3, 4), (3, 3, 4)])
    with tempfile.TemporaryDirectory() as tmp:
        log = _check_served(tmp, "gru", m, xs, True)
        assert "dimension 0 is not the batch" in log, log


def test_sequence_first_output_only():
    """Every output has dimension 0 sized like the input's, so only the
    rows' values tell: batched, two clients' sequences of 3 steps would run
    as one of 6."""
    torch.manual_seed(3)
    m = SeqFirstTagger().eval()
    rng = np.random.default_rng(3)
    xs = _seqs(rng, [(3, 2, 4)] * 6)
    with tempfile.TemporaryDirectory() as tmp:
        log = _check_served(tmp, "tagger", m, xs, True)
        assert "rows of dimension 0 are not independent" in log, log


def test_batch_first_model_keeps_batching():
    torch.manual_seed(4)
    m = Mlp().eval()
    rng = np.random.default_rng(4)
    xs = _seqs(rng, [(2, 4), (1, 4), (3, 4), (2, 4)])
    with tempfile.TemporaryDirectory() as tmp:
        log = _check_served(tmp, "mlp", m, xs, False)
        assert "model.unbatched" not in log, log


def test_spec_max_batch_size_zero():
    """Triton's max_batch_size 0 in the spec: unbatched, no probe, no warning;
    a request's dimension 0 is the model's own (here any number of rows is
    one request, answered whole)."""
    torch.manual_seed(5)
    m = Mlp().eval()
    rng = np.random.default_rng(5)
    xs = _seqs(rng, [(2, 4), (7, 4), (1, 4)])
    with tempfile.TemporaryDirectory() as tmp:
        log = _check_served(tmp, "mlp0", m, xs, True,
                            batching={"max_batch_size": 0, "max_queue_delay_us": DELAY_US})
        assert "model.unbatched" not in log, log
        with open(os.path.join(tmp, "mlp0", "model.json")) as f:
            assert json.load(f)["batching"]["max_batch_size"] == 0
