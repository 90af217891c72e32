"""torchvision's Swin Transformer helpers as Grove runs them (#18): the op
entries patch_merging_pad, get_relative_position_bias and
shifted_window_attention (core/nn/ops_window.c), spelled as torchvision's
fx-wrapped _patch_merging_pad, _get_relative_position_bias and
shifted_window_attention.  Each case is torchvision's own module
(PatchMerging, PatchMergingV2, ShiftedWindowAttention, ...V2) or a small
forward calling the helper, exported with tools/grove_export.py and run with
`grove predict --local` at batch 1 and 3 on 2 and 1 compute threads (the
same bits), compared with torch within rtol 1e-4 / atol 1e-5.  The shapes are chosen for the helper's branches:
odd H and W (padding to the window, to even sizes), non-square windows, a
window that covers the map (no shift), a shift along one dim only (the
mask's zero-shift slices), no qkv/proj bias, and v2's logit_scale above
its clamp.  The bias tables and logit scales are drawn wide so that the
bias and the mask change the answer.  And the refusal of a dropout other
than 0 (torchvision's F.dropout without training= drops in eval mode).

Run by tests/run_py_tests.py under a python3 with torch, numpy and
torchvision.
"""
import os
import sys
import tempfile
import unittest

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "tools"))
sys.path.insert(0, HERE)

RTOL, ATOL = 1e-4, 1e-5


def _tv():
    try:
        import torchvision.models.swin_transformer as S
    except ImportError:
        raise unittest.SkipTest("no torchvision (scripts/deps.sh --test installs "
                                "python3-torchvision)")
    return S


def _randomise(m, seed):
    """Every parameter drawn from N(0, 1) / sqrt(fan-in)-ish, the bias table
    from N(0, 1): the defaults (a 0.02 table, zero biases) would hide the
    bias and the mask."""
    import torch
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.endswith("relative_position_bias_table"):
                p.copy_(torch.randn(p.shape, generator=g))
            elif name.endswith("logit_scale"):
                # around the clamp at log(100) = 4.6: one head above it
                p.copy_(torch.linspace(0.5, 5.5, p.numel()).view(p.shape))
            elif p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[1] ** 0.5)
            else:
                p.copy_(torch.randn(p.shape, generator=g) * 0.3 + (1.0 if "norm" in name and
                                                                   name.endswith("weight")
                                                                   else 0.0))
    return m.eval()


def _run(name, m, shape, batches=(1, 3)):
    """Exports m for inputs [N, *shape] and compares grove with torch at
    every batch size in batches, on 2 compute threads and on 1 (the same
    bits: shifted_window_attention spreads its windows' heads over the
    threads, each output row computed alone)."""
    import torch
    from grove_export import export
    from test_graph_export import predict
    rng = np.random.default_rng(sum(map(ord, name)))
    with tempfile.TemporaryDirectory() as tmp:
        d = os.path.join(tmp, name)
        export(m, d, example_input=torch.zeros(1, *shape))
        for n in batches:
            x = rng.standard_normal((n, *shape)).astype(np.float32)
            code, err, got = predict(d, tmp, [x], threads=2)
            assert code == 0, (name, err)
            code, err, got1 = predict(d, tmp, [x], threads=1)
            assert code == 0, (name, err)
            assert np.array_equal(got[0], got1[0]), (name, n, "1 and 2 threads differ")
            with torch.no_grad():
                want = m(torch.from_numpy(x)).numpy()
            assert got[0].shape == want.shape, (name, n, got[0].shape, want.shape)
            diff = float(np.max(np.abs(got[0] - want)))
            assert np.allclose(got[0], want, rtol=RTOL, atol=ATOL), (name, n, diff)


def test_shifted_window_attention_v1():
    S = _tv()
    # (dim, heads, window, shift, H, W, qkv_bias, proj_bias)
    cases = [
        (12, 3, [3, 3], [1, 1], 7, 9, True, True),     # odd sizes padded to 9x9, shifted
        (8, 2, [4, 3], [2, 1], 5, 6, False, False),    # non-square window, no biases
        (8, 2, [7, 7], [3, 3], 4, 4, True, True),      # the window covers the map: no shift
        (8, 4, [3, 8], [1, 4], 6, 5, True, True),      # shifted along H only (W fits one window)
        (6, 1, [2, 2], [0, 0], 4, 6, True, True),      # no shift asked
    ]
    for i, (dim, heads, ws, sh, h, w, qb, pb) in enumerate(cases):
        m = S.ShiftedWindowAttention(dim, ws, sh, heads, qkv_bias=qb, proj_bias=pb)
        _run(f"swa{i}", _randomise(m, i), (h, w, dim))


def test_shifted_window_attention_v2():
    S = _tv()
    cases = [
        (12, 3, [3, 3], [1, 1], 6, 7, True),   # cosine attention, shifted, odd W
        (8, 2, [8, 8], [4, 4], 5, 3, True),    # window covers the map
        (8, 4, [2, 3], [1, 1], 4, 5, False),   # no qkv bias
    ]
    for i, (dim, heads, ws, sh, h, w, qb) in enumerate(cases):
        m = S.ShiftedWindowAttentionV2(dim, ws, sh, heads, qkv_bias=qb)
        _run(f"swa2_{i}", _randomise(m, 10 + i), (h, w, dim))


def test_patch_merging():
    S = _tv()
    import torch.nn as nn
    _run("pm_odd", _randomise(S.PatchMerging(4), 20), (5, 7, 4))
    _run("pm_even", _randomise(S.PatchMerging(3), 21), (4, 6, 3))
    _run("pm2_odd", _randomise(S.PatchMergingV2(4), 22), (3, 3, 4))

    class Leading(nn.Module):  # more leading dims than [N, H, W, C]
        def forward(self, x):
            return S._patch_merging_pad(x) * 2

    _run("pm_5d", Leading().eval(), (2, 5, 4, 3))


def test_relative_position_bias():
    S = _tv()
    import torch
    import torch.nn as nn

    class Bias(nn.Module):
        """x + the [1, heads, N, N] bias of a 2x3 window (N = 6)."""

        def __init__(self):
            super().__init__()
            ws = [2, 3]
            self.table = nn.Parameter(torch.randn((2 * ws[0] - 1) * (2 * ws[1] - 1), 4))
            a = S.ShiftedWindowAttention(8, ws, [0, 0], 4)
            self.register_buffer("index", a.relative_position_index.clone())
            self.ws = ws

        def forward(self, x):
            return x + S._get_relative_position_bias(self.table, self.index, self.ws)

    torch.manual_seed(3)
    _run("relbias", Bias().eval(), (4, 6, 6))


def test_dropout_refused():
    S = _tv()
    import torch
    from test_graph_export import expect_refusal
    for kw in ("attention_dropout", "dropout"):
        m = S.ShiftedWindowAttention(8, [2, 2], [1, 1], 2, **{kw: 0.1}).eval()
        expect_refusal(m, torch.zeros(1, 4, 4, 8), f"{kw}=0.1", "drops at random",
                       "shifted_window_attention")


def test_bad_model_json_named():
    """A model.json whose shifted_window_attention node was edited: a bad
    constant is refused when the graph compiles, a num_heads that does not
    divide the channels when it runs; each message names the node and the
    value, and nothing crashes."""
    S = _tv()
    import json
    import torch
    from grove_export import export
    from test_graph_export import predict
    m = S.ShiftedWindowAttention(8, [2, 2], [1, 1], 2).eval()
    x = np.zeros((1, 4, 4, 8), np.float32)
    edits = [  # (argument index, value, what the message says)
        (4, [0, 2], "window_size[0] must be an int in [1, 4096]"),
        (6, [1], "shift_size must be a list of 2 ints"),
        (5, 3, "the input's 8 channels do not divide into num_heads=3"),
    ]
    with tempfile.TemporaryDirectory() as tmp:
        d = os.path.join(tmp, "swa")
        export(m, d, example_input=torch.zeros(1, 4, 4, 8))
        path = os.path.join(d, "model.json")
        orig = json.load(open(path))
        for k, value, needle in edits:
            doc = json.loads(json.dumps(orig))
            graph = doc["module"]["graph"]
            i = next(j for j, n in enumerate(graph) if n.get("target") == "shifted_window_attention")
            graph[i]["args"][k] = value
            json.dump(doc, open(path, "w"))
            code, err, _ = predict(d, tmp, [x])
            assert code == 1, (k, value, err)
            assert needle in err and "shifted_window_attention" in err, (needle, err)
