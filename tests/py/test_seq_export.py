"""Recurrent nets and EmbeddingBag end to end: tools/grove_export.py writes
the model directory, `$GROVE_BIN predict --local` runs it, and every output
must be torch's (rtol 1e-4, atol 1e-5).  A model whose top level is an LSTM
(its outputs flattened: output, h_n, c_n), an LSTM inside a graph module
(`out, (h, c) = self.lstm(x)`, `out[:, -1]`, `h[-1]`), initial states given
as model inputs ((h0, c0) passed as torch's tuple), two LSTMs passing the
state tuple along, a bidirectional GRU and an RNN run sequence-first inside a
graph, EmbeddingBag with offsets and per-sample weights, as a
recommendation model calls it, and RNNCell / LSTMCell / GRUCell at the top
level and unrolled in a decoder's loop.

Run by tests/run_py_tests.py under a python3 with torch and numpy.
"""
import os
import sys
import tempfile

import numpy as np
import torch
import torch.nn as nn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from test_graph_export import check_model, predict  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tools"))
from grove_export import _flat, export  # noqa: E402


def _rng(seed):
    return np.random.default_rng(seed)


def test_top_level_lstm():
    """torch's (output, (h_n, c_n)) comes back as three outputs, in order."""
    torch.manual_seed(1)
    m = nn.LSTM(6, 10, num_layers=2, batch_first=True, bidirectional=True).eval()
    x = _rng(2).standard_normal((3, 7, 6)).astype(np.float32)
    with tempfile.TemporaryDirectory() as tmp:
        d = os.path.join(tmp, "lstm")
        doc = export(m, d)
        code, err, got = predict(d, tmp, [x])
        assert code == 0, err
    with torch.no_grad():
        want = _flat(m(torch.from_numpy(x)))
    assert len(got) == len(want) == 3
    for g, w in zip(got, want):
        assert g.shape == tuple(w.shape), (g.shape, w.shape)
        assert np.allclose(g, w.numpy(), rtol=1e-4, atol=1e-5), float(np.max(np.abs(g - w.numpy())))
    assert doc["module"]["type"] == "LSTM"
    assert doc["inputs"][0]["shape"] == [-1, -1, 6]
    assert [o["name"] for o in doc["outputs"]] == ["y0", "y1", "y2"]
    assert doc["outputs"][1]["shape"] == [4, -1, 10]  # h_n: the batch is dimension 1


class LSTMClassifier(nn.Module):
    """Token ids -> Embedding -> 2-layer LSTM -> the last step's output and
    the top layer's h_n, each through a head."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(50, 12)
        self.lstm = nn.LSTM(12, 16, num_layers=2, batch_first=True)
        self.fc = nn.Linear(16, 4)

    def forward(self, ids):
        out, (h, c) = self.lstm(self.emb(ids))
        return self.fc(out[:, -1]), self.fc(h[-1]) + c[-1].sum(-1, keepdim=True)


def test_lstm_in_graph():
    torch.manual_seed(3)
    m = LSTMClassifier()
    example = torch.zeros(2, 5, dtype=torch.int64)
    for shape in [(1, 5), (4, 9), (3, 1)]:
        ids = _rng(sum(shape)).integers(0, 50, shape).astype(np.int64)
        doc = check_model("cls", m, example, [ids])
    assert doc["inputs"][0]["shape"] == [-1, -1]


class WithState(nn.Module):
    """(h0, c0) come with the request, batch first, as a server would take
    them; torch's LSTM wants them [layers * dirs, batch, hidden]."""

    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(5, 8, bidirectional=True, proj_size=3, batch_first=True)

    def forward(self, x, h0, c0):
        out, (h, c) = self.lstm(x, (h0.transpose(0, 1).contiguous(),
                                    c0.transpose(0, 1).contiguous()))
        return out, h.transpose(0, 1), c.transpose(0, 1)


def test_lstm_state_inputs():
    torch.manual_seed(4)
    r = _rng(5)
    xs = [r.standard_normal((3, 4, 5)).astype(np.float32),
          r.standard_normal((3, 2, 3)).astype(np.float32),
          r.standard_normal((3, 2, 8)).astype(np.float32)]
    example = tuple(torch.from_numpy(x) for x in xs)
    doc = check_model("state", WithState(), example, xs)
    assert [i["name"] for i in doc["inputs"]] == ["x", "h0", "c0"]


class Stacked(nn.Module):
    """The second LSTM starts from the first one's final state: the state
    tuple travels between modules as one value."""

    def __init__(self):
        super().__init__()
        self.a = nn.LSTM(4, 6, batch_first=True)
        self.b = nn.LSTM(6, 6, batch_first=True)

    def forward(self, x):
        o1, hc = self.a(x)
        o2, (h, c) = self.b(o1, hc)
        return o2 + o1, h[0] * c[0]


def test_lstm_state_tuple_between_modules():
    torch.manual_seed(6)
    x = _rng(7).standard_normal((2, 5, 4)).astype(np.float32)
    check_model("stacked", Stacked(), torch.zeros(2, 5, 4), [x])


class SeqFirst(nn.Module):
    """Sequence-first recurrent nets inside a batch-first model: a
    bidirectional 2-layer GRU with h0 from the request and a relu RNN."""

    def __init__(self):
        super().__init__()
        self.gru = nn.GRU(3, 7, num_layers=2, bidirectional=True)
        self.rnn = nn.RNN(14, 5, nonlinearity="relu", bias=False)

    def forward(self, x, h0):
        out, h = self.gru(x.transpose(0, 1), h0.transpose(0, 1).contiguous())
        y, hr = self.rnn(out)
        return y.mean(0), h.sum(0) + hr[0].sum(-1, keepdim=True)


def test_gru_rnn_seq_first():
    torch.manual_seed(8)
    r = _rng(9)
    xs = [r.standard_normal((3, 6, 3)).astype(np.float32),
          r.standard_normal((3, 4, 7)).astype(np.float32)]
    check_model("seqfirst", SeqFirst(), tuple(torch.from_numpy(x) for x in xs), xs)


class Recommender(nn.Module):
    """Bags of item ids (fixed length per user) with per-item weights,
    pooled by EmbeddingBag; a second table pooled by max."""

    def __init__(self):
        super().__init__()
        self.items = nn.EmbeddingBag(40, 8, mode="sum", padding_idx=0)
        self.tags = nn.EmbeddingBag(20, 8, mode="max")
        self.fc = nn.Linear(8, 1)

    def forward(self, ids, weights, tags):
        u = self.items(ids, per_sample_weights=weights)
        return torch.sigmoid(self.fc(u + self.tags(tags)))


def test_embedding_bag_in_graph():
    torch.manual_seed(10)
    r = _rng(11)
    xs = [r.integers(0, 40, (4, 6)).astype(np.int64), r.random((4, 6)).astype(np.float32),
          r.integers(0, 20, (4, 3)).astype(np.int64)]
    xs[0][1, :] = 0  # a bag of padding only: zeros, as torch gives
    check_model("rec", Recommender(), tuple(torch.from_numpy(x) for x in xs), xs)


def test_embedding_bag_bad_index_is_named():
    torch.manual_seed(12)
    m = nn.Sequential(nn.EmbeddingBag(10, 4, mode="mean"), nn.Linear(4, 2)).eval()
    with tempfile.TemporaryDirectory() as tmp:
        d = os.path.join(tmp, "bag")
        export(m, d)
        code, err, _ = predict(d, tmp, [np.array([[1, 2], [3, 10]], dtype=np.int64)])
        assert code != 0
        assert "EmbeddingBag: index 10 (at flat position 3" in err, err


class CellDecoder(nn.Module):
    """A seq2seq decoder as tutorials write it: an LSTMCell unrolled over a
    fixed number of steps with its (h, c) state tuple, each step's output
    fed back; then a GRUCell without bias and a relu RNNCell, both without a
    state (zeros)."""

    def __init__(self):
        super().__init__()
        self.cell = nn.LSTMCell(6, 8)
        self.out = nn.Linear(8, 6)
        self.gru = nn.GRUCell(6, 5, bias=False)
        self.rnn = nn.RNNCell(5, 4, nonlinearity="relu")

    def forward(self, x, h, c):
        outs = []
        inp = x
        for _ in range(3):
            h, c = self.cell(inp, (h, c))
            inp = torch.tanh(self.out(h))
            outs.append(inp)
        g = self.gru(inp)
        return torch.stack(outs, 1), c, g, self.rnn(g, torch.zeros(g.shape[0], 4))


def test_rnn_cells_in_graph():
    torch.manual_seed(13)
    r = _rng(14)
    for n in (2, 1, 5):
        xs = [r.standard_normal((n, k)).astype(np.float32) for k in (6, 8, 8)]
        check_model("cells", CellDecoder(), tuple(torch.from_numpy(x) for x in xs), xs)


def test_top_level_cells():
    torch.manual_seed(15)
    r = _rng(16)
    for m in (nn.LSTMCell(4, 6), nn.GRUCell(4, 6), nn.RNNCell(4, 6, bias=False)):
        for n in (3, 1):
            x = r.standard_normal((n, 4)).astype(np.float32)
            check_model(type(m).__name__, m, torch.from_numpy(x), [x])
