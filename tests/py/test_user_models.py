"""Models written the way tutorials and HuggingFace write them, end to end:
tools/grove_export.py writes the directory, `$GROVE_BIN predict --local`
runs it, and every output must be torch's in eval mode (rtol 1e-4, atol
1e-5).  Covered so far: results that are namedtuples, dataclasses,
ModelOutput-like OrderedDict dataclasses, dicts and nested tuples (named
outputs in their fields' order, nested tuples flattened).

Run by tests/run_py_tests.py under a python3 with torch and numpy.
"""
import collections
import dataclasses
import os
import sys
import tempfile

import numpy as np
import torch
import torch.nn as nn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from test_graph_export import predict  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tools"))
from grove_export import export  # noqa: E402
from grove_export_types import _named_flat  # noqa: E402

RTOL, ATOL = 1e-4, 1e-5


def run_both(name, m, xs):
    """Exports m (eval) on xs, runs Grove on them, compares every output
    with torch's flattened result; returns model.json."""
    m.eval()
    with tempfile.TemporaryDirectory() as tmp:
        d = os.path.join(tmp, name)
        doc = export(m, d, example_input=tuple(torch.from_numpy(x) for x in xs))
        code, err, got = predict(d, tmp, xs)
        assert code == 0, (name, err)
    with torch.no_grad():
        _, want = _named_flat(m(*[torch.from_numpy(x) for x in xs]))
    assert len(got) == len(want), (name, len(got), len(want))
    for g, w in zip(got, want):
        w = w.numpy()
        assert g.shape == w.shape, (name, g.shape, w.shape)
        assert np.allclose(g, w, rtol=RTOL, atol=ATOL), (name, float(np.max(np.abs(g - w))))
    return doc


def _x(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


# ---------------------------------------------------------------- structured outputs

Out = collections.namedtuple("Out", ["logits", "hidden"])


class NamedTupleNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        h = torch.relu(x)
        return Out(self.fc(h), h)


@dataclasses.dataclass
class ClsOutput:
    logits: torch.Tensor
    hidden_states: torch.Tensor = None
    attentions: torch.Tensor = None  # left None: not an output


class DataclassNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        return ClsOutput(logits=self.fc(x), hidden_states=x * 2)


@dataclasses.dataclass
class ModelOutputLike(collections.OrderedDict):
    """HuggingFace's ModelOutput in miniature: a dataclass that is also an
    OrderedDict of the fields that are set."""
    last_hidden_state: torch.Tensor = None
    pooler_output: torch.Tensor = None

    def __post_init__(self):
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if v is not None:
                self[f.name] = v


class HFStyleNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 6)

    def forward(self, x):
        h = torch.tanh(self.fc(x))
        return ModelOutputLike(last_hidden_state=h, pooler_output=h.mean(dim=1))


class NestedTupleNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        return self.fc(x), (x + 1, (x * 2,))


class DictOfTuplesNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        return {"logits": self.fc(x), "states": (x, x - 1)}


def test_namedtuple_output():
    torch.manual_seed(1)
    doc = run_both("nt", NamedTupleNet(), [_x(3, 8)])
    assert [o["name"] for o in doc["outputs"]] == ["logits", "hidden"]
    # The namedtuple's class is not an op of the graph.
    assert [n["op"] for n in doc["module"]["graph"]][-1] == "output"
    assert not any(n.get("target") == "Out" for n in doc["module"]["graph"])


def test_dataclass_output_leaves_out_none_fields():
    torch.manual_seed(2)
    doc = run_both("dc", DataclassNet(), [_x(3, 8, seed=1)])
    assert [o["name"] for o in doc["outputs"]] == ["logits", "hidden_states"]


def test_model_output_like():
    torch.manual_seed(3)
    doc = run_both("hf", HFStyleNet(), [_x(2, 5, 8, seed=2)])
    assert [o["name"] for o in doc["outputs"]] == ["last_hidden_state", "pooler_output"]
    assert doc["outputs"][1]["shape"] == [-1, 6]


def test_nested_tuple_output_is_flattened():
    torch.manual_seed(4)
    doc = run_both("nested", NestedTupleNet(), [_x(3, 8, seed=3)])
    assert [o["name"] for o in doc["outputs"]] == ["y0", "y1", "y2"]


def test_dict_of_tuples_names_each_value():
    torch.manual_seed(5)
    doc = run_both("dt", DictOfTuplesNet(), [_x(3, 8, seed=4)])
    assert [o["name"] for o in doc["outputs"]] == ["logits", "states_0", "states_1"]


if __name__ == "__main__":
    for k, v in sorted(globals().items()):
        if k.startswith("test_") and callable(v):
            v()
            print("ok", k)
