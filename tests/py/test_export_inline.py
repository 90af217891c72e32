"""Submodule calls Grove cannot pass between modules, traced through
(tools/grove_export_graph.py, _traced_through; docs/exporter.md, "Custom
forwards"): a custom module called with a list of tensors (DenseNet's
_DenseLayer), with an int or a keyword argument (MaxViT's WindowPartition),
with the dict another submodule returned (LRASPP's head), or with more
tensors than GROVE_MAX_VALUES (4) is inlined into its caller's graph; the
modules it calls stay call_module nodes by their dotted paths, so the
state_dict keys are torch's, and the inlined module is written with
"inlined": true (Grove refuses forward hooks on it: tests/check_graph.c
test_inlined_module_hooks).  Each model is exported and run with
`grove predict --local`, and compared with torch (rtol 1e-4, atol 1e-5).
A torch.nn layer called with a constant is still refused, and a refusal
inside an inlined forward names that module and its line.

Run by tests/run_py_tests.py under a python3 with torch and numpy.
"""
import os
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_graph_export import HERE, check_model, expect_refusal  # noqa: E402

HERE = os.path.basename(__file__)


class DenseLayer(nn.Module):
    """torchvision's _DenseLayer: called with the list of the features so
    far, which it concatenates; a parameter of its own (read by get_attr
    through the caller's graph)."""

    def __init__(self, cin, growth):
        super().__init__()
        self.norm = nn.BatchNorm2d(cin)
        self.conv = nn.Conv2d(cin, growth, 3, padding=1, bias=False)
        self.gate = nn.Parameter(torch.linspace(0.5, 1.5, growth).view(1, growth, 1, 1))

    def forward(self, inputs):
        x = torch.cat(inputs, 1) if isinstance(inputs, list) else inputs
        return self.conv(F.relu(self.norm(x))) * self.gate


class Tail(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.fc = nn.Conv2d(c, 2, 1)

    def forward(self, x):
        return self.fc(x)


class DenseBlock(nn.ModuleDict):
    """torchvision's _DenseBlock (a ModuleDict with its own forward), and a
    custom module inside a traced-through forward that keeps its node."""

    def __init__(self, cin, growth, n):
        super().__init__()
        for i in range(n):
            self[f"layer{i + 1}"] = DenseLayer(cin + i * growth, growth)

    def forward(self, x):
        features = [x]
        for name, layer in self.items():
            features.append(layer(features))
        return torch.cat(features, 1)


class DenseNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 4, 3, padding=1)
        self.block = DenseBlock(4, 3, 3)
        self.last = Wrapper(Tail(13))

    def forward(self, x):
        return self.last([self.block(self.stem(x))])


class Wrapper(nn.Module):
    """Called with a list: inlined; the Tail it calls with a tensor keeps its
    own graph and node (by its dotted path 'last.inner')."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, xs):
        return self.inner(xs[0])


def test_list_argument_traced_through():
    torch.manual_seed(3)
    m = DenseNet().eval()
    with torch.no_grad():
        for mod in m.modules():
            if isinstance(mod, nn.BatchNorm2d):
                mod.running_mean.normal_(0, 0.2)
                mod.running_var.uniform_(0.5, 1.5)
    rng = np.random.default_rng(4)
    doc = check_model("dense", m, torch.zeros(1, 3, 8, 8),
                      [rng.standard_normal((3, 3, 8, 8)).astype(np.float32)])
    root, block = doc["module"], doc["module"]["children"]["block"]
    targets = [n["target"] for n in block["graph"] if n["op"] == "call_module"]
    # The layers' own modules, called from the block's graph by dotted path.
    assert targets == [f"layer{i}.{k}" for i in (1, 2, 3) for k in ("norm", "conv")], targets
    gets = [n["target"] for n in block["graph"] if n["op"] == "get_attr"]
    assert gets == ["layer1.gate", "layer2.gate", "layer3.gate"], gets
    for i in (1, 2, 3):
        layer = block["children"][f"layer{i}"]
        assert layer["inlined"] is True and layer["graph"] is None, layer
        assert layer["parameters"]["gate"]["shape"] == [1, 3, 1, 1]
    last = root["children"]["last"]
    assert last["inlined"] is True and last["graph"] is None
    assert [n.get("target") for n in root["graph"] if n["op"] == "call_module"] == \
        ["stem", "block", "last.inner"]
    inner = last["children"]["inner"]
    assert "inlined" not in inner and inner["graph"][-1]["op"] == "output"


class Partition(nn.Module):
    """MaxViT's WindowPartition: an int argument."""

    def forward(self, x, p):
        n, c, h, w = x.shape
        x = x.view(n, c, h // p, p, w // p, p)
        return torch.swapaxes(x.permute(0, 2, 4, 3, 5, 1), 1, 2).reshape(n, -1, p * p * c)


class Scale(nn.Module):
    def forward(self, x, factor=1.0, shift=None):
        return x * factor + (0 if shift is None else shift)


class Many(nn.Module):
    """Five tensors: more than Grove passes between modules."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, a, b, c, d, e):
        return self.fc(a + b * c - d) + e


class Consts(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 4, 1)
        self.part = Partition()
        self.scale = Scale()
        self.many = Many()

    def forward(self, x):
        t = self.part(self.conv(x), 2)  # [N, 4, 16]
        t = self.scale(t, factor=0.5, shift=t)
        u = t[:, :, :4]
        return self.many(u, u * 2, u + 1, u.exp(), u.tanh())


class Five(nn.Module):
    """Returns five tensors and a tuple with an int: more than, and other
    than, what Grove passes back from a module."""

    def forward(self, x):
        return x + 1, x * 2, x - 3, x.exp(), x.tanh()


class Pair(nn.Module):
    def forward(self, x):
        return x * 3, x.shape[1] * 2


class Results(nn.Module):
    def __init__(self):
        super().__init__()
        self.five = Five()
        self.pair = Pair()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        a, b, c, d, e = self.five(self.fc(x))
        y, k = self.pair(a * b - c)
        return y * k + d - e


def test_many_results_traced_through():
    torch.manual_seed(9)
    rng = np.random.default_rng(10)
    doc = check_model("results", Results(), torch.zeros(1, 4),
                      [rng.standard_normal((3, 4)).astype(np.float32)])
    root = doc["module"]
    assert [n["target"] for n in root["graph"] if n["op"] == "call_module"] == ["fc"]
    assert root["children"]["five"]["inlined"] and root["children"]["pair"]["inlined"]


def test_constant_keyword_and_many_arguments_traced_through():
    torch.manual_seed(5)
    rng = np.random.default_rng(6)
    doc = check_model("consts", Consts(), torch.zeros(1, 2, 4, 8),
                      [rng.standard_normal((2, 2, 4, 8)).astype(np.float32)])
    root = doc["module"]
    assert [n["target"] for n in root["graph"] if n["op"] == "call_module"] == \
        ["conv", "many.fc"]
    assert all(root["children"][k]["inlined"] for k in ("part", "scale", "many"))
    assert any(n.get("target") == "transpose" for n in root["graph"])  # torch.swapaxes


class Backbone(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 4, 3, stride=2, padding=1)
        self.c2 = nn.Conv2d(4, 6, 3, stride=2, padding=1)

    def forward(self, x):
        low = self.c1(x)
        return {"low": low, "high": self.c2(low)}


class Head(nn.Module):
    """LRASPP's head: indexes the backbone's dict by key."""

    def __init__(self):
        super().__init__()
        self.lo = nn.Conv2d(4, 2, 1)
        self.hi = nn.Conv2d(6, 2, 1)

    def forward(self, feats):
        high = F.interpolate(self.hi(feats["high"]), size=feats["low"].shape[-2:],
                             mode="bilinear", align_corners=False)
        return self.lo(feats["low"]) + high


class Seg(nn.Module):
    def __init__(self):
        super().__init__()
        self.backbone = Backbone()
        self.head = Head()

    def forward(self, x):
        return {"out": self.head(self.backbone(x))}


def test_dict_between_modules_traced_through():
    torch.manual_seed(7)
    rng = np.random.default_rng(8)
    m = Seg().eval()
    xs = [rng.standard_normal((2, 3, 16, 12)).astype(np.float32)]
    import tempfile
    from test_graph_export import predict
    from grove_export import export
    with tempfile.TemporaryDirectory() as tmp:
        d = os.path.join(tmp, "seg")
        doc = export(m, d, example_input=torch.zeros(1, 3, 16, 12))
        code, err, got = predict(d, tmp, xs)
        assert code == 0, err
        with torch.no_grad():
            want = m(torch.from_numpy(xs[0]))["out"].numpy()
        assert np.allclose(got[0], want, rtol=1e-4, atol=1e-5), float(np.max(np.abs(got[0] - want)))
    root = doc["module"]
    assert root["children"]["head"]["inlined"] is True
    # The backbone keeps its graph; the head's leaves are called from the root's.
    assert [n["target"] for n in root["graph"] if n["op"] == "call_module"] == \
        ["backbone", "head.hi", "head.lo"]
    assert "inlined" not in root["children"]["backbone"]


class BadInner(nn.Module):
    def forward(self, xs):
        return torch.cat(xs, 1).logit(0.1)


class BadOuter(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = BadInner()

    def forward(self, x):
        return self.inner([x, x])


class LinearWithConst(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return self.fc([x])


def test_refusals_name_the_inlined_module_and_line():
    msg = expect_refusal(BadOuter(), torch.zeros(1, 4), "cannot export the root module (BadOuter)",
                         "in 'inner' (BadInner, whose forward is traced into this one)",
                         "Tensor.logit", f"{HERE}:")
    assert "torch.cat(xs, 1).logit(0.1)" in msg, msg
    # A torch.nn layer has no forward to trace through: still refused.
    expect_refusal(LinearWithConst(), torch.zeros(1, 4), "a Linear called with a constant argument",
                   f"{HERE}:", "self.fc([x])")


def test_hooks_on_inlined_modules_refused_in_groved():
    """A forward hook whose pattern matches only inlined modules would never
    fire (nothing calls their forward): groved refuses it with UNSUPPORTED
    naming them, and a pattern that also matches hookable modules counts
    only those."""
    import tempfile
    from grove_export import export
    from test_pyclient import Groved, load_grove
    grove = load_grove()
    torch.manual_seed(5)
    m = DenseNet().eval()
    with tempfile.TemporaryDirectory() as tmp:
        d = os.path.join(tmp, "dense")
        export(m, d, example_input=torch.zeros(1, 3, 8, 8))
        srv = Groved(tmp, "g", models=[f"dense={d}"])
        try:
            with grove.Client(srv.url, admin=srv.admin) as c:
                for pattern in ("last", "block.layer?"):
                    try:
                        c.add_hook("dense", pattern)
                        raise AssertionError(f"hook on '{pattern}' was accepted")
                    except grove.GroveError as e:
                        assert e.status == "GROVE_E_UNSUPPORTED", e
                        assert "traced into their caller's graph" in str(e), e
                h = c.add_hook("dense", "block.layer1.*")
                assert sorted(h["modules"]) == ["block.layer1.conv", "block.layer1.norm"], h
                h = c.add_hook("dense", "**")
                assert "last" not in h["modules"] and "block.layer2" not in h["modules"], h
                assert "last.inner" in h["modules"] and "block" in h["modules"], h
                x = np.zeros((1, 3, 8, 8), dtype=np.float32)
                c.predict("dense", x)  # serving is unaffected
        finally:
            srv.stop()
