"""Models with a custom forward, end to end: tools/grove_export.py traces them
with torch.fx, `$GROVE_BIN predict --local` runs the exported directory, and
the outputs must be torch's (rtol 1e-4, atol 1e-5).  The three models of
issue #4 (a small ResNet whose residual blocks sit in a ModuleList iterated in
forward, a LeNet-like CNN, a text classifier Embedding -> TransformerEncoder
-> mean over tokens -> Linear), plus several inputs and outputs, and the
refusals: the exporter names the operation and the line of forward, Grove
names the node.

Run by tests/run_py_tests.py under a python3 with torch and numpy.
"""
import json
import os
import subprocess
import sys
import tempfile
import unittest

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools"))
from grove_export import ExportError, export  # noqa: E402

RTOL, ATOL = 1e-4, 1e-5
HERE = os.path.basename(__file__)


# ---------------------------------------------------------------- the models


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False),
                                      nn.BatchNorm2d(cout))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        identity = x if self.down is None else self.down(x)
        return F.relu(out + identity)


class SmallResNet(nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8),
                                  nn.ReLU())
        self.blocks = nn.ModuleList([BasicBlock(8, 8, 1), BasicBlock(8, 16, 2),
                                     BasicBlock(16, 16, 1)])
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(16, classes)

    def forward(self, x):
        x = self.stem(x)
        for block in self.blocks:
            x = block(x)
        return self.fc(torch.flatten(self.pool(x), 1))


class LeNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 6, 5, padding=2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.pool = nn.MaxPool2d(2)
        self.avg = nn.AvgPool2d(2, stride=1)
        self.fc1 = nn.Linear(16 * 4 * 4, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, 10)

    def forward(self, x):
        x = self.pool(torch.tanh(self.conv1(x)))
        x = self.avg(self.pool(F.relu(self.conv2(x))))
        x = x.view(x.size(0), -1)
        x = F.relu(self.fc1(x))
        x = F.dropout(x, 0.2, self.training)
        return F.log_softmax(self.fc3(F.relu(self.fc2(x))), dim=-1)


class TextClassifier(nn.Module):
    def __init__(self, vocab=100, d=32, heads=4, layers=2, classes=3, batch_first=True,
                 norm_first=False):
        super().__init__()
        self.embed = nn.Embedding(vocab, d, padding_idx=0)
        self.pos = nn.Parameter(torch.randn(1, 64, d) * 0.1)
        layer = nn.TransformerEncoderLayer(d, heads, 2 * d, dropout=0.1, batch_first=batch_first,
                                           norm_first=norm_first)
        self.encoder = nn.TransformerEncoder(layer, layers)
        self.head = nn.Linear(d, classes)
        self.batch_first = batch_first

    def forward(self, tokens):
        h = self.embed(tokens) + self.pos[:, :tokens.size(1)]
        if not self.batch_first:
            h = h.transpose(0, 1)
        h = self.encoder(h)
        return self.head(h.mean(dim=1 if self.batch_first else 0))


def _settle_bn(m, shape, seed):
    """Real running statistics, as a trained checkpoint has."""
    torch.manual_seed(seed)
    m.train()
    with torch.no_grad():
        for _ in range(3):
            m(torch.randn(shape) * 2 + 0.3)
    return m.eval()


# ---------------------------------------------------------------- helpers


def grove_bin():
    b = os.environ.get("GROVE_BIN") or os.path.join(ROOT, "build", "grove")
    if not (os.path.isfile(b) and os.access(b, os.X_OK)):
        raise unittest.SkipTest(f"no grove binary at {b} (make builds it)")
    return b


def predict(d, tmp, xs, threads=None):
    """grove predict --local d on the numpy inputs xs (on `threads` compute
    threads when given); (returncode, stderr, outputs)."""
    ins, outs = [], []
    for i, x in enumerate(xs):
        ins.append(os.path.join(tmp, f"in{i}.npy"))
        np.save(ins[-1], x)
    doc = json.load(open(os.path.join(d, "model.json")))
    n_out = len(doc.get("outputs", [1]))
    args = [grove_bin(), "predict", "--local", d] + ins
    for i in range(n_out):
        outs.append(os.path.join(tmp, f"out{i}.npy"))
        args += ["-o", outs[-1]]
    if threads:
        args += ["--threads", str(threads)]
    r = subprocess.run(args, capture_output=True, text=True, timeout=300)
    got = [np.load(p) for p in outs] if r.returncode == 0 else None
    return r.returncode, r.stderr, got


def compare(name, m, xs, got, equal_nan=False):
    """grove's outputs got against torch's m(*xs): same count, shapes and
    values within RTOL/ATOL (NaN matching NaN when equal_nan)."""
    with torch.no_grad():
        want = m(*[torch.from_numpy(x) for x in xs])
    want = want if isinstance(want, tuple) else (want,)
    assert len(got) == len(want), (name, len(got), len(want))
    for g, w in zip(got, want):
        w = w.numpy()
        assert g.shape == w.shape, (name, g.shape, w.shape)
        assert np.allclose(g, w, rtol=RTOL, atol=ATOL, equal_nan=equal_nan), \
            (name, [x.shape for x in xs], float(np.nanmax(np.abs(g - w))))


def check_model(name, m, example, xs):
    m.eval()
    with tempfile.TemporaryDirectory() as tmp:
        d = os.path.join(tmp, name)
        doc = export(m, d, example_input=example)
        code, err, got = predict(d, tmp, xs)
        assert code == 0, (name, err)
        compare(name, m, xs, got)
        return doc


def expect_refusal(model, example, *needles):
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "m")
        try:
            export(model, out, example_input=example)
        except ExportError as e:
            msg = str(e)
            for n in needles:
                assert n in msg, (n, msg)
            assert not os.path.exists(out)
            return msg
        raise AssertionError("export did not refuse")


# ---------------------------------------------------------------- the three models


def test_small_resnet():
    torch.manual_seed(1)
    m = _settle_bn(SmallResNet(), (8, 3, 16, 16), 2)
    rng = np.random.default_rng(3)
    doc = check_model("resnet", m, torch.zeros(1, 3, 16, 16),
                      [rng.standard_normal((5, 3, 16, 16)).astype(np.float32)])
    # The blocks are their own graphs, called from the root's loop.
    root = doc["module"]
    assert root["type"] == "SmallResNet"
    targets = [n.get("target") for n in root["graph"] if n["op"] == "call_module"]
    assert targets == ["stem", "blocks.0", "blocks.1", "blocks.2", "pool", "fc"], targets
    blk = root["children"]["blocks"]["children"][1]
    assert blk["type"] == "BasicBlock" and blk["graph"][-1]["op"] == "output"
    assert doc["inputs"] == [{"name": "x", "dtype": "float32", "shape": [-1, 3, 16, 16]}]
    # Batch 1 too.
    check_model("resnet_b1", m, torch.zeros(1, 3, 16, 16),
                [rng.standard_normal((1, 3, 16, 16)).astype(np.float32)])
    # A batch whose activations (channels last between the layers) are cut
    # between compute threads everywhere, moves of the graph's arena
    # included: torch's values, and the same bits on 1 and 2 threads.
    x = rng.standard_normal((64, 3, 16, 16)).astype(np.float32)
    with tempfile.TemporaryDirectory() as tmp:
        d = os.path.join(tmp, "resnet")
        export(m, d, example_input=torch.zeros(1, 3, 16, 16))
        runs = []
        for t in (1, 2):
            code, err, got = predict(d, tmp, [x], threads=t)
            assert code == 0, err
            runs.append(got[0])
        with torch.no_grad():
            want = m(torch.from_numpy(x)).numpy()
        assert np.allclose(runs[0], want, rtol=RTOL, atol=ATOL), float(np.max(np.abs(runs[0] - want)))
        assert np.array_equal(runs[0], runs[1]), "2 compute threads changed the result"


def test_lenet():
    torch.manual_seed(4)
    m = LeNet()
    rng = np.random.default_rng(5)
    check_model("lenet", m, torch.zeros(1, 1, 28, 28),
                [rng.standard_normal((7, 1, 28, 28)).astype(np.float32)])


def test_text_classifier():
    torch.manual_seed(6)
    rng = np.random.default_rng(7)
    m = TextClassifier()
    doc = check_model("text", m, torch.zeros(1, 12, dtype=torch.long),
                      [rng.integers(0, 100, (4, 12)).astype(np.int64)])
    # Token ids of any length (up to the positional table's 64).
    assert doc["inputs"] == [{"name": "tokens", "dtype": "int64", "shape": [-1, -1]}], doc["inputs"]
    enc = doc["module"]["children"]["encoder"]
    assert enc["type"] == "TransformerEncoder" and enc["num_layers"] == 2
    check_model("text_long", m, torch.zeros(1, 12, dtype=torch.long),
                [rng.integers(0, 100, (2, 31)).astype(np.int64)])
    # Sequence-first layers, norm_first and batch 1.
    torch.manual_seed(8)
    m = TextClassifier(layers=3, batch_first=False, norm_first=True)
    check_model("text_seq_first", m, torch.zeros(1, 5, dtype=torch.long),
                [rng.integers(0, 100, (1, 9)).astype(np.int64)])


class TwoHeads(nn.Module):
    """Two inputs, an attention call that returns its weights, two outputs."""

    def __init__(self):
        super().__init__()
        self.attn = nn.MultiheadAttention(8, 2, batch_first=True)
        self.proj = nn.Linear(3, 8)

    def forward(self, x, extra):
        h = x + self.proj(extra)[:, None]
        out, weights = self.attn(h, h, h)
        return out.sum(1), weights


def test_several_inputs_and_outputs():
    torch.manual_seed(9)
    rng = np.random.default_rng(10)
    doc = check_model("two", TwoHeads(), (torch.zeros(2, 5, 8), torch.zeros(2, 3)),
                      [rng.standard_normal((3, 5, 8)).astype(np.float32),
                       rng.standard_normal((3, 3)).astype(np.float32)])
    assert [i["name"] for i in doc["inputs"]] == ["x", "extra"]
    assert [o["name"] for o in doc["outputs"]] == ["y0", "y1"]
    # The sequence is free: the attention weights follow it (docs/exporter.md,
    # "Inputs and outputs"); Grove runs it at another length too.
    assert doc["inputs"][0]["shape"] == [-1, -1, 8]
    assert doc["outputs"][1]["shape"] == [-1, -1, -1]
    m = TwoHeads().eval()
    with tempfile.TemporaryDirectory() as tmp:
        d = os.path.join(tmp, "two")
        export(m, d, example_input=(torch.zeros(2, 5, 8), torch.zeros(2, 3)))
        xs = [rng.standard_normal((2, 7, 8)).astype(np.float32),
              rng.standard_normal((2, 3)).astype(np.float32)]
        code, err, got = predict(d, tmp, xs)
        assert code == 0, err
        compare("two at 7", m, xs, got)


# ---------------------------------------------------------------- refusals


class Digamma(nn.Module):
    def forward(self, x):
        return torch.digamma(x) + 1


class Logit(nn.Module):  # a method Grove does not run
    def forward(self, x):
        return x.logit(0.1)


class Masked(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = nn.MultiheadAttention(4, 2)
        self.mask = 0.5  # a constant where a mask tensor goes

    def forward(self, x):
        return self.attn(x, x, x, attn_mask=self.mask)[0]


class AlwaysDropout(nn.Module):
    def forward(self, x):
        return F.dropout(x, 0.5)


class PlainAttr(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = torch.ones(4)  # not a buffer: not in the state_dict

    def forward(self, x):
        return x * self.scale


class Branchy(nn.Module):
    def forward(self, x):
        if x.sum() > 0:
            return x
        return -x


def test_exporter_names_op_and_line():
    msg = expect_refusal(nn.Sequential(nn.Linear(4, 4), Digamma()), torch.zeros(1, 4),
                         "'1' (Digamma)", "torch.digamma", f"{HERE}:")
    assert "return torch.digamma(x) + 1" in msg, msg
    expect_refusal(Logit(), torch.zeros(1, 4), "Tensor.logit", f"{HERE}:", "x.logit(0.1)")
    expect_refusal(Masked(), torch.zeros(3, 1, 4), "attn_mask", "must be a tensor or None")
    expect_refusal(AlwaysDropout(), torch.zeros(1, 4), "training=True", f"{HERE}:")
    expect_refusal(PlainAttr(), torch.zeros(1, 4), "self.scale", "register_buffer")
    expect_refusal(Branchy(), torch.zeros(1, 4), "torch.fx cannot trace", "(Branchy)")
    # The model was not changed by the attempts.
    assert not hasattr(Digamma(), "_tensor_constant0")


def test_grove_names_the_node():
    torch.manual_seed(11)
    m = LeNet().eval()
    with tempfile.TemporaryDirectory() as tmp:
        d = os.path.join(tmp, "lenet")
        export(m, d, example_input=torch.zeros(1, 1, 28, 28))
        path = os.path.join(d, "model.json")
        doc = json.load(open(path))
        graph = doc["module"]["graph"]
        k = next(i for i, n in enumerate(graph) if n.get("target") == "tanh")
        graph[k]["target"] = "digamma"
        json.dump(doc, open(path, "w"))
        x = np.zeros((2, 1, 28, 28), np.float32)
        code, err, _ = predict(d, tmp, [x])
        assert code == 1, err
        assert f"$.module.graph[{k}].target" in err and '"digamma"' in err, err


class Split(nn.Module):
    def forward(self, x):
        return x.view(x.size(0), 2, 3)


def test_grove_runtime_error_names_node_and_line():
    """A graph that fails while running (here its view was edited to a shape
    that does not fit) fails naming the module, the node and the line of
    forward it came from."""
    with tempfile.TemporaryDirectory() as tmp:
        d = os.path.join(tmp, "split")
        export(Split(), d, example_input=torch.zeros(4, 6))
        path = os.path.join(d, "model.json")
        doc = json.load(open(path))
        view = next(n for n in doc["module"]["graph"] if n.get("target") == "view")
        view["args"][1][-1] = 4  # args: [x, [x.size(0), 2, 3]]
        json.dump(doc, open(path, "w"))
        code, err, _ = predict(d, tmp, [np.zeros((3, 6), np.float32)])
        assert code == 1, err
        assert "the root module (Split): graph node 'view' (view, " in err, err
        assert f"{HERE}:" in err and "return x.view(x.size(0), 2, 3)" in err, err
        # The open's first trial forward (batch 2) finds it.
        assert "trial forward on zero inputs (batch 2)" in err, err
        assert "shape [2, 2, 4] is invalid for an input of shape [2, 6]" in err, err
