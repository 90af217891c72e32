"""The torch calls users' own models make (tutorial and HuggingFace-style
forwards), as Grove runs them: each case is a small nn.Module whose forward
uses one call, exported with tools/grove_export.py and run with
`grove predict --local` at batch 1 and 3 (odd sizes), compared with torch
within rtol 1e-4 / atol 1e-5.  Inputs are also fed through a transpose
(a non-contiguous operand) where the op reads its input's values.  One test
per group of docs/operations.md's "Users' own models" section, and the
refusals, which name the call (tools/probe_user_ops.py lists the rest).

Run by tests/run_py_tests.py under a python3 with torch and numpy.
"""
import os
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "..", "tools"))
sys.path.insert(0, HERE)

RTOL, ATOL = 1e-4, 1e-5


def _module(fn, n=1):
    """A module whose forward is fn of n inputs (fx traces no *args)."""
    import torch

    class M1(torch.nn.Module):
        def forward(self, x):
            return fn(x)

    class M2(torch.nn.Module):
        def forward(self, x, y):
            return fn(x, y)

    return (M1 if n == 1 else M2)().eval()


def _run(name, fn, shapes, batches=(1, 3), gen=None, dtype=np.float32):
    """Exports _module(fn) for inputs [N, *shape] (one per shape) and compares
    grove with torch at every batch size; gen(rng, shape) draws an input."""
    import torch
    from grove_export import export
    from test_graph_export import predict
    m = _module(fn, len(shapes))
    rng = np.random.default_rng(sum(map(ord, name)))
    gen = gen or (lambda r, s: r.standard_normal(s).astype(dtype))
    with tempfile.TemporaryDirectory() as tmp:
        d = os.path.join(tmp, "m")
        ex = [torch.from_numpy(gen(rng, (1, *s))) for s in shapes]
        export(m, d, example_input=ex[0] if len(ex) == 1 else tuple(ex))
        for n in batches:
            xs = [gen(rng, (n, *s)) for s in shapes]
            code, err, got = predict(d, tmp, xs)
            assert code == 0, (name, n, err)
            with torch.no_grad():
                want = m(*[torch.from_numpy(x) for x in xs])
            want = want if isinstance(want, tuple) else (want,)
            assert len(got) == len(want), (name, len(got), len(want))
            for g, w in zip(got, want):
                w = w.numpy()
                assert g.shape == w.shape, (name, n, g.shape, w.shape)
                assert g.dtype == w.dtype, (name, n, g.dtype, w.dtype)
                ok = np.allclose(g.astype(np.float64), w.astype(np.float64), rtol=RTOL, atol=ATOL,
                                 equal_nan=True)
                assert ok, (name, n, float(np.nanmax(np.abs(g.astype(np.float64) - w))))


def _refused(fn, shape, *words):
    """The exporter refuses fn's module with a message holding every word."""
    import torch
    from grove_export import ExportError, export
    with tempfile.TemporaryDirectory() as tmp:
        try:
            export(_module(fn), os.path.join(tmp, "m"), example_input=torch.zeros(1, *shape))
        except ExportError as e:
            msg = str(e)
        else:
            raise AssertionError(f"exported, expected a refusal naming {words}")
    for w in words:
        assert w in msg, (w, msg)


def test_made_like():
    """Group 1: tensors made like another (zeros_like ... new_tensor) and
    the *_as shape methods."""
    import torch
    cases = [
        ("zeros_like", lambda x: x + torch.zeros_like(x)),
        ("ones_like", lambda x: x * 2 + torch.ones_like(x)),
        ("ones_like_t", lambda x: torch.ones_like(x.transpose(1, 2)) - x.transpose(1, 2)),
        ("full_like", lambda x: x + torch.full_like(x, 2.5)),
        ("full_like_int", lambda x: torch.full_like(x.long(), 7)),  # input's dtype: int64
        ("full_like_dtype", lambda x: torch.full_like(x, 3, dtype=torch.int64)),
        ("empty_like", lambda x: x + 0 * torch.empty_like(x)),  # zeros in Grove
        ("new_zeros", lambda x: x.new_zeros(x.shape) + x),
        ("new_zeros_args", lambda x: x.new_zeros(x.size(0), 2) + x[:, :2, 0]),
        ("new_ones", lambda x: x.new_ones((x.size(0), 1, 1)) * x),
        ("new_full", lambda x: x.new_full((x.size(0), 3), -1.5)),
        ("new_empty", lambda x: x + 0 * x.new_empty(x.shape)),
        ("new_tensor", lambda x: x * x.new_tensor(2.0)),
        ("new_tensor_list", lambda x: x[:, :, :3] + x.new_tensor([[1.0, 2.0, 3.0]])),
        ("new_tensor_int", lambda x: x[:, 0, :2] + x.long().new_tensor([1, 2]).float()),
        ("expand_as", lambda x: x[:, :1].expand_as(x) + x),
        ("expand_as_t", lambda x: x.transpose(1, 2)[:, :1].expand_as(x.transpose(1, 2)) * 1),
        ("view_as", lambda x: x.flatten(1).view_as(x) * 3),
        ("reshape_as", lambda x: x.transpose(1, 2).reshape_as(x) + 1),
        ("type_as", lambda x: x.long().type_as(x) + x),
    ]
    for name, fn in cases:
        _run(name, fn, [(5, 7)])


def test_refusals():
    """An unsupported call is refused naming the call; random ones say why."""
    import torch
    _refused(lambda x: x + torch.rand_like(x), (4,), "torch.rand_like", "random")
    _refused(lambda x: x + torch.randn_like(x), (4,), "torch.randn_like", "random")
    _refused(lambda x: torch.special.zeta(x, x), (4,), "zeta", "not supported")
