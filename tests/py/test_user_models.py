"""Models written the way tutorials and HuggingFace write them, end to end:
tools/grove_export.py writes the directory, `$GROVE_BIN predict --local`
runs it, and every output must be torch's in eval mode (rtol 1e-4, atol
1e-5).  Covered so far: non-persistent buffers (HF's position_ids, nanoGPT's
causal mask: values in buffers.safetensors, not in either state_dict); results that are namedtuples, dataclasses,
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
from test_graph_export import grove_bin, predict  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tools"))
from grove_export import ExportError, export  # noqa: E402
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


# ---------------------------------------------------------------- non-persistent buffers


class Bertish(nn.Module):
    """HF BERT's embeddings: position_ids is a non-persistent buffer sliced
    by the sequence length."""

    def __init__(self, vocab=20, d=16, max_pos=10):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(max_pos, d)
        self.ln = nn.LayerNorm(d)
        self.register_buffer("position_ids", torch.arange(max_pos).expand((1, -1)),
                             persistent=False)

    def forward(self, input_ids):
        n = input_ids.shape[1]
        return self.ln(self.tok(input_ids) + self.pos(self.position_ids[:, :n]))


class CausalSelfAttention(nn.Module):
    """nanoGPT's attention: the causal mask is a non-persistent buffer."""

    def __init__(self, d=16, heads=2, block=8):
        super().__init__()
        self.h = heads
        self.scale = 1.0 / (d // heads) ** 0.5
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.register_buffer("bias", torch.tril(torch.ones(block, block)).view(1, 1, block, block),
                             persistent=False)

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.qkv(x).split(C, dim=2)
        q = q.view(B, T, self.h, C // self.h).transpose(1, 2)
        k = k.view(B, T, self.h, C // self.h).transpose(1, 2)
        v = v.view(B, T, self.h, C // self.h).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * self.scale
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        y = (torch.softmax(att, dim=-1) @ v).transpose(1, 2).contiguous().view(B, T, C)
        return x + self.proj(y)


class GPTBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm(16)
        self.attn = CausalSelfAttention()

    def forward(self, x):
        return self.attn(self.ln(x))


def _st_keys(path):
    """The tensor names in a safetensors file (its JSON header)."""
    import json
    import struct
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return [k for k in json.loads(f.read(n)) if k != "__metadata__"]


def _ids(*shape, seed=0):
    return np.random.default_rng(seed).integers(0, 20, shape).astype(np.int64)


def test_position_ids_buffer():
    """Exported with 6 tokens, served at 6 and 4 (the sequence is free):
    position_ids comes from buffers.safetensors, not the state_dict."""
    torch.manual_seed(6)
    m = Bertish().eval()
    with tempfile.TemporaryDirectory() as tmp:
        d = os.path.join(tmp, "bert")
        doc = export(m, d, example_input=torch.from_numpy(_ids(2, 6)))
        assert doc["module"]["buffers"]["position_ids"] == \
            {"shape": [1, 10], "dtype": "int64", "persistent": False}
        assert doc["inputs"][0]["shape"] == [-1, -1]
        assert os.path.exists(os.path.join(d, "buffers.safetensors"))
        # torch's state_dict leaves it out, and so does the weights file.
        assert "position_ids" not in _st_keys(os.path.join(d, "weights.safetensors"))
        assert _st_keys(os.path.join(d, "buffers.safetensors")) == ["position_ids"]
        # Grove's state_dict leaves it out too (what a state_dict export writes).
        import subprocess
        r = subprocess.run([grove_bin(), "inspect", d], capture_output=True, text=True,
                           timeout=120)
        assert r.returncode == 0, r.stderr
        sd = r.stdout.split("state_dict:")[1]
        assert "tok.weight" in sd and "position_ids" not in sd, sd
        for ids in (_ids(2, 6, seed=1), _ids(3, 4, seed=2)):
            code, err, got = predict(d, tmp, [ids])
            assert code == 0, err
            with torch.no_grad():
                want = m(torch.from_numpy(ids)).numpy()
            assert got[0].shape == want.shape
            assert np.allclose(got[0], want, rtol=RTOL, atol=ATOL)


def test_causal_mask_buffer():
    torch.manual_seed(7)
    doc = run_both("gpt", GPTBlock(), [_x(2, 8, 16, seed=5)])
    assert doc["module"]["children"]["attn"]["buffers"]["bias"]["persistent"] is False


def test_missing_buffers_file_is_named():
    """A directory whose buffers.safetensors was lost is refused at open,
    naming the file and the buffer."""
    torch.manual_seed(8)
    m = Bertish().eval()
    with tempfile.TemporaryDirectory() as tmp:
        d = os.path.join(tmp, "bert")
        export(m, d, example_input=torch.from_numpy(_ids(2, 6)))
        os.remove(os.path.join(d, "buffers.safetensors"))
        code, err, _ = predict(d, tmp, [_ids(2, 6)])
        assert code != 0
        assert "buffers.safetensors" in err and "position_ids" in err, err


# ---------------------------------------------------------------- keyword defaults


class KwDefaults(nn.Module):
    """forward(x, mask=None, scale=1.0): only the tensors passed are inputs;
    the defaults are constants of the graph."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 4)

    def forward(self, x, mask=None, scale=1.0):
        y = self.fc(x) * scale
        if mask is not None:
            y = y + mask
        return y


def test_keyword_defaults_are_constants():
    torch.manual_seed(9)
    doc = run_both("kw", KwDefaults(), [_x(3, 8, seed=6)])
    assert [i["name"] for i in doc["inputs"]] == ["x"]


def test_keyword_passed_tensor_is_an_input():
    torch.manual_seed(10)
    doc = run_both("kw2", KwDefaults(), [_x(3, 8, seed=7), _x(3, 4, seed=8)])
    assert [i["name"] for i in doc["inputs"]] == ["x", "mask"]


# ---------------------------------------------------------------- shape checks


class AssertNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.d = 8
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        assert x.shape[-1] == self.d, f"expected {self.d} features"
        torch._assert(x.dim() == 3, "3-d input")
        if x.dim() != 3:
            raise ValueError("want [N, T, d]")
        B, T, C = x.size()
        if C != self.d:
            raise ValueError("bad width")
        return self.fc(x)


class Sub(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        assert x.size(-1) == 8
        return torch.relu(self.fc(x))


class AssertInChild(nn.Module):
    def __init__(self):
        super().__init__()
        self.sub = Sub()

    def forward(self, x):
        return self.sub(x) + 1


class ValueBranch(nn.Module):
    def forward(self, x):
        if x.sum() > 0:
            return x
        return -x


def test_shape_asserts_and_raises_are_dropped():
    torch.manual_seed(11)
    doc = run_both("asserts", AssertNet(), [_x(2, 5, 8, seed=9)])
    ops = [(n["op"], n.get("target")) for n in doc["module"]["graph"]]
    assert ops == [("placeholder", None), ("call_module", "fc"), ("output", None)], ops


def test_shape_assert_in_a_child():
    torch.manual_seed(12)
    run_both("child", AssertInChild(), [_x(3, 8, seed=10)])


def test_control_flow_on_values_still_refused():
    with tempfile.TemporaryDirectory() as tmp:
        try:
            export(ValueBranch(), os.path.join(tmp, "v"), example_input=torch.randn(2, 3))
        except ExportError as e:
            assert "control flow" in str(e), str(e)
        else:
            raise AssertionError("export did not refuse")


# ---------------------------------------------------------------- free float dims


class SeqMixer(nn.Module):
    """[N, T, d] -> [N, T, d]: the sequence length is free (the output follows it)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.ln = nn.LayerNorm(8)

    def forward(self, x):
        return self.ln(self.fc(x)).softmax(-1) + x.mean(dim=1, keepdim=True)


class TinyCNN(nn.Module):
    """An image classifier: the output does not follow H and W, which stay fixed."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.fc = nn.Linear(4, 2)

    def forward(self, x):
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(self.conv(x), 1), 1))


def test_float_sequence_dim_is_free():
    torch.manual_seed(13)
    m = SeqMixer().eval()
    with tempfile.TemporaryDirectory() as tmp:
        d = os.path.join(tmp, "seq")
        doc = export(m, d, example_input=torch.randn(2, 5, 8))
        assert doc["inputs"][0]["shape"] == [-1, -1, 8], doc["inputs"]
        assert doc["outputs"][0]["shape"] == [-1, -1, 8], doc["outputs"]
        for x in (_x(2, 5, 8, seed=11), _x(3, 9, 8, seed=12), _x(1, 1, 8, seed=13)):
            code, err, got = predict(d, tmp, [x])
            assert code == 0, err
            with torch.no_grad():
                want = m(torch.from_numpy(x)).numpy()
            assert got[0].shape == want.shape
            assert np.allclose(got[0], want, rtol=RTOL, atol=ATOL)


def test_image_dims_stay_fixed():
    torch.manual_seed(14)
    doc = run_both("cnn", TinyCNN(), [_x(2, 3, 6, 6, seed=14)])
    assert doc["inputs"][0]["shape"] == [-1, 3, 6, 6]


def test_example_shape_overrides_the_probe():
    torch.manual_seed(15)
    with tempfile.TemporaryDirectory() as tmp:
        doc = export(SeqMixer(), os.path.join(tmp, "a"), example_input=torch.randn(2, 5, 8),
                     example_shape=[-1, 5, 8])
        assert doc["inputs"][0]["shape"] == [-1, 5, 8]
        doc = export(TinyCNN(), os.path.join(tmp, "b"), example_input=torch.randn(2, 3, 6, 6),
                     example_shape=[[-1, 3, -1, -1]])
        assert doc["inputs"][0]["shape"] == [-1, 3, -1, -1]
        code, err, got = predict(os.path.join(tmp, "b"), tmp, [_x(2, 3, 9, 7, seed=15)])
        assert code == 0, err
        for bad, needle in (([-1, 6, 8], "example_input[0] has 5 there"),
                            ([-1, 5], "expected 3 integers"),
                            ([[-1, 5, 8], [-1, 5]], "2 shapes for 1 inputs")):
            try:
                export(SeqMixer(), os.path.join(tmp, "c"), example_input=torch.randn(2, 5, 8),
                       example_shape=bad)
            except ExportError as e:
                assert needle in str(e), str(e)
            else:
                raise AssertionError(f"example_shape {bad} was accepted")


# ---------------------------------------------------------------- .values / .indices, computed pads


class PadToMultiple(nn.Module):
    """Pads the last dim up to a multiple of 4, the amount computed from
    x.shape (Python's % on a size)."""

    def forward(self, x):
        p = (4 - x.shape[-1] % 4) % 4
        return nn.functional.pad(x, [0, p]) * 2


class MaxMinFields(nn.Module):
    def forward(self, x):
        m = x.max(dim=-1)
        return m.values + torch.min(x, 1).values, torch.max(x, dim=1).indices


def test_pad_amounts_from_the_shape():
    with tempfile.TemporaryDirectory() as tmp:
        d = os.path.join(tmp, "pad")
        m = PadToMultiple()
        doc = export(m, d, example_input=torch.randn(2, 3, 6), example_shape=[-1, 3, -1])
        assert doc["inputs"][0]["shape"] == [-1, 3, -1]
        for w in (6, 8, 5, 1):
            x = _x(2, 3, w, seed=w)
            code, err, got = predict(d, tmp, [x])
            assert code == 0, (w, err)
            want = m(torch.from_numpy(x)).numpy()
            assert got[0].shape == want.shape, (w, got[0].shape, want.shape)
            assert np.allclose(got[0], want, rtol=RTOL, atol=ATOL)


def test_values_and_indices_fields():
    run_both("fields", MaxMinFields(), [_x(3, 7, seed=16)])
