"""The exporter on models as torchvision writes them (issue #18, exporter
fixes): a refusal quotes torchvision's frame and names its function
`torchvision.*`; an input dim the model fixes is fixed in model.json, not a
refusal; `torch._assert` shape guards vanish from the graph (model.json's
input shapes, which Grove checks on every request, are what they guarded).

Run by tests/run_py_tests.py under a python3 with torch and numpy.
"""
import json
import os
import sys
import tempfile

import numpy as np
import torch
import torch.nn as nn

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from grove_export import ExportError, export  # noqa: E402
from test_graph_export import check_model, predict  # noqa: E402


class WithRoIAlign(nn.Module):
    """A torchvision layer whose function (fx-wrapped) Grove does not run."""

    def __init__(self):
        super().__init__()
        import torchvision
        self.roi = torchvision.ops.RoIAlign(2, 1.0, 1)

    def forward(self, x, boxes):
        return self.roi(x, boxes)


def test_refusal_quotes_torchvision_frame():
    with tempfile.TemporaryDirectory() as tmp:
        try:
            export(WithRoIAlign(), os.path.join(tmp, "m"),
                   example_input=(torch.zeros(1, 2, 8, 8), torch.tensor([[0., 0., 0., 4., 4.]])))
        except ExportError as e:
            msg = str(e)
        else:
            raise AssertionError("export did not refuse roi_align")
    # torchvision's function by its own name, not torch.roi_align ...
    assert "operation torchvision.ops.roi_align is not supported" in msg, msg
    # ... and the line of torchvision's forward that called it, which is the
    # model's code (the old prefix test took torchvision/ for torch/).
    assert "forward line roi_align.py:" in msg and "return roi_align(" in msg, msg
    assert "'roi' (RoIAlign)" in msg, msg


def test_fixed_token_count_is_fixed_not_refused():
    """Embedding -> Flatten -> Linear over 6 tokens: the token dim, free as
    far as the Embedding goes, is fixed by the Linear; 7 tokens no longer fit,
    so model.json says 6."""
    torch.manual_seed(21)
    m = nn.Sequential(nn.Embedding(10, 4), nn.Flatten(), nn.Linear(24, 3))
    rng = np.random.default_rng(22)
    doc = check_model("tokens6", m, torch.zeros(1, 6, dtype=torch.long),
                      [rng.integers(0, 10, (5, 6)).astype(np.int64)])
    assert doc["inputs"] == [{"name": "x", "dtype": "int64", "shape": [-1, 6]}], doc["inputs"]
    assert doc["outputs"][0]["shape"] == [-1, 3], doc["outputs"]


class Guarded(nn.Module):
    """Shape guards as torchvision's ViT writes them."""

    def __init__(self):
        super().__init__()
        self.size = 6
        self.fc = nn.Linear(6, 2)

    def forward(self, x):
        n, h = x.shape
        torch._assert(h == self.size, f"Wrong width! Expected {self.size} but got {h}!")
        torch._assert(x.dim() == 2, "expected a 2-d input")
        return self.fc(x) * 2


def test_assert_guards_vanish():
    torch.manual_seed(25)
    rng = np.random.default_rng(26)
    doc = check_model("guarded", Guarded(), torch.zeros(1, 6),
                      [rng.standard_normal((3, 6)).astype(np.float32)])
    graph = doc["module"]["graph"]
    targets = [n.get("target") for n in graph]
    assert targets == [None, "fc", "mul", None], targets  # x, fc, * 2, output
    assert doc["inputs"][0]["shape"] == [-1, 6], doc["inputs"]
    # What the guard checked, Grove checks on the request.
    with tempfile.TemporaryDirectory() as tmp:
        d = os.path.join(tmp, "guarded")
        export(Guarded(), d, example_input=torch.zeros(1, 6))
        code, err, _ = predict(d, tmp, [np.zeros((2, 5), np.float32)])
        assert code != 0 and "[-1, 6]" in err, (code, err)
        assert json.load(open(os.path.join(d, "model.json")))["inputs"][0]["shape"] == [-1, 6]
