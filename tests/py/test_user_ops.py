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
    m = fn if isinstance(fn, torch.nn.Module) else _module(fn, len(shapes))
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
        # torch's values are whatever memory held: compare shape and dtype only
        ("empty_like", lambda x: torch.zeros_like(torch.empty_like(x.long())) + x),
        ("new_zeros", lambda x: x.new_zeros(x.shape) + x),
        ("new_zeros_args", lambda x: x.new_zeros(x.size(0), 2) + x[:, :2, 0]),
        ("new_ones", lambda x: x.new_ones((x.size(0), 1, 1)) * x),
        ("new_full", lambda x: x.new_full((x.size(0), 3), -1.5)),
        ("new_empty", lambda x: torch.zeros_like(x.new_empty(x.shape)) + x),
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


def _wide(r, s):
    """Values over [-4, 4] with halves (round's ties) and exact zeros."""
    x = (r.standard_normal(s) * 2).astype(np.float32)
    flat = x.reshape(-1)
    flat[::7] = np.float32(0.5) * np.round(flat[::7] * 2)  # k + 0.5 and integers
    return x


def test_pointwise_math():
    """Group 2: maximum/minimum, clamp_min/max, sign ... square, on a float
    input and through a transpose; the integer-keeping ones on int64 too."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    t = lambda x: x.transpose(1, 2)  # noqa: E731  a non-contiguous operand
    cases = [
        ("maximum", lambda x: torch.maximum(x, -x)),
        ("maximum_bcast", lambda x: torch.maximum(t(x), x[:, :1, :1])),
        ("minimum", lambda x: torch.minimum(x, x[:, :, :1])),
        ("Tensor.maximum", lambda x: x.maximum(x * 0.5)),
        ("clamp_min", lambda x: torch.clamp_min(t(x), 0.25)),
        ("Tensor.clamp_min", lambda x: x.clamp_min(-0.5)),
        ("Tensor.clamp_max", lambda x: x.clamp_max(1)),
        ("sign", lambda x: torch.sign(t(x))),
        ("sin", lambda x: torch.sin(t(x))),
        ("cos", lambda x: x.cos()),
        ("erf", lambda x: torch.erf(t(x))),
        ("special.erf", lambda x: torch.special.erf(x)),
        ("reciprocal", lambda x: torch.reciprocal(x.abs() + 0.5)),
        ("floor", lambda x: torch.floor(t(x))),
        ("ceil", lambda x: x.ceil()),
        ("round", lambda x: torch.round(t(x))),
        ("round_decimals", lambda x: torch.round(x, decimals=1)),
        ("trunc", lambda x: torch.trunc(x)),
        ("fix", lambda x: torch.fix(x)),
        ("softsign", lambda x: F.softsign(t(x))),
        ("Softsign", nn.Sequential(nn.Softsign()).eval()),
        ("logsigmoid", lambda x: F.logsigmoid(t(x) * 10)),
        ("LogSigmoid", nn.Sequential(nn.Linear(7, 7), nn.LogSigmoid()).eval()),
        ("log1p", lambda x: torch.log1p(x.abs())),
        ("expm1", lambda x: torch.expm1(t(x))),
        ("square", lambda x: torch.square(t(x))),
        ("int_keeps", lambda x: (torch.sign(x.long()), torch.square(x.long()),
                                 torch.floor(x.long()), x.long().round())),
        ("int_promotes", lambda x: torch.sin(x.long()) + torch.reciprocal(x.long() + 10)),
    ]
    for name, fn in cases:
        _run(name, fn, [(5, 7)], gen=_wide)


def test_functional_spellings():
    """Group 3: the functional forms of modules Grove runs (F.silu and
    F.leaky_relu were refused), and a two-input maximum."""
    import torch
    import torch.nn.functional as F
    cases = [
        ("F.silu", lambda x: F.silu(x.transpose(1, 2))),
        ("F.leaky_relu", lambda x: F.leaky_relu(x, 0.2)),
        ("F.leaky_relu_default", lambda x: F.leaky_relu(x)),
        ("F.leaky_relu_int", lambda x: F.leaky_relu(x, 0)),
        ("F.gelu_tanh", lambda x: F.gelu(x, approximate="tanh")),
        ("F.hardtanh", lambda x: F.hardtanh(x, -0.5, 0.5)),
    ]
    for name, fn in cases:
        _run(name, fn, [(5, 7)])
    _run("maximum2", lambda x, y: torch.maximum(x, y), [(3, 4), (1, 4)])


def test_integer_arithmetic():
    """int64 tensors with int64 tensors and Python ints stay int64 (add,
    sub with alpha, mul, //, %, div with rounding_mode; broadcast,
    strided, negative divisors floored as Python); with a float, or true
    division, they compute in float32, as torch promotes.  Float // and %
    are aten's (fmod-based)."""
    import torch
    t = lambda x: x.transpose(1, 2)  # noqa: E731
    cases = [
        ("int_add", lambda x: x.long() + x.long()[:, :1]),
        ("int_sub_alpha", lambda x: torch.sub(t(x.long()), 3, alpha=2)),
        ("int_mul", lambda x: t(x.long()) * t(x.long())),
        ("int_rsub", lambda x: 1 - x.long()),
        ("int_bool", lambda x: (x > 0).long() + (x < 0)),
        ("int_float", lambda x: x.long() * 0.5 + x),
        ("int_div", lambda x: x.long() / 3),
        ("int_radd_pos", lambda x: torch.cumsum((x[:, 0] > 0).long(), 1) + 2),
        ("int_floordiv", lambda x: (x * 4).long() // 3),
        ("int_floordiv_neg", lambda x: (x * 4).long() // -3),
        ("int_floordiv_t", lambda x: (x * 4).long() // (x.abs() * 2 + 1).long()),
        ("int_mod", lambda x: (x * 4).long() % 3),
        ("int_mod_neg", lambda x: torch.remainder(t((x * 4).long()), -3)),
        ("int_div_floor", lambda x: torch.div((x * 4).long(), 3, rounding_mode="floor")),
        ("int_div_trunc", lambda x: torch.div((x * 4).long(), 3, rounding_mode="trunc")),
        ("floor_divide", lambda x: torch.floor_divide(x, 0.7)),
        ("float_floordiv", lambda x: t(x) // 0.3),
        ("float_mod", lambda x: x % 1.5),
        ("float_mod_neg", lambda x: torch.remainder(x, -0.75)),
        ("float_div_floor", lambda x: torch.div(x, -0.6, rounding_mode="floor")),
        ("float_div_trunc", lambda x: x.div(x[:, :1] + 3, rounding_mode="trunc")),
        ("true_divide", lambda x: torch.true_divide(x.long(), 2)),
    ]
    for name, fn in cases:
        _run(name, fn, [(5, 7)], gen=_wide)


def test_norms_and_statistics():
    """Group 4: norms (p = 2, 1, inf, 3 over dims, keepdim), normalize,
    cosine_similarity and pairwise_distance (functions and modules, two
    inputs broadcast), var/std (unbiased, correction), logsumexp, outer,
    glu (and nn.GLU)."""
    import math
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    t = lambda x: x.transpose(1, 2)  # noqa: E731
    cases = [
        ("norm", lambda x: torch.norm(x, dim=-1, keepdim=True)),
        ("norm_all", lambda x: x.norm() + x),
        ("norm_p1", lambda x: t(x).norm(p=1, dim=1)),
        ("norm_inf", lambda x: torch.norm(t(x), p=math.inf, dim=(1, 2))),
        ("norm_p3", lambda x: x.norm(3, dim=2)),
        ("vector_norm", lambda x: torch.linalg.vector_norm(t(x), dim=-1)),
        ("vector_norm_ord", lambda x: torch.linalg.vector_norm(x, ord=1, dim=(1,), keepdim=True)),
        ("vector_norm_ninf", lambda x: torch.linalg.vector_norm(x, ord=-math.inf, dim=1)),
        ("normalize", lambda x: F.normalize(x, dim=1)),
        ("normalize_t", lambda x: F.normalize(t(x), p=1.0, dim=-1)),
        ("normalize_zero", lambda x: F.normalize(x * 0, dim=-1)),
        ("cosine", lambda x: F.cosine_similarity(x, -x * 2 + 1, dim=1)),
        ("cosine_last", lambda x: F.cosine_similarity(t(x), t(x)[:, :1], dim=-1)),
        ("pairwise", lambda x: F.pairwise_distance(x[:, 0], x[:, 1])),
        ("pairwise_p1", lambda x: F.pairwise_distance(x[:, 0], x[:, 2], p=1, keepdim=True)),
        ("var", lambda x: x.var(dim=1)),
        ("var_biased", lambda x: torch.var(t(x), 2, False, True)),
        ("var_correction", lambda x: x.var(dim=(1, 2), correction=0)),
        ("var_all", lambda x: x.var() + x),
        ("std", lambda x: x.std(dim=-1, keepdim=True)),
        ("std_unbiased_kw", lambda x: torch.std(t(x), dim=1, unbiased=False)),
        ("logsumexp", lambda x: torch.logsumexp(x, dim=1)),
        ("logsumexp_keep", lambda x: t(x).logsumexp(dim=(1, 2), keepdim=True)),
        ("logsumexp_ninf", lambda x: torch.logsumexp(x.clamp_max(-1) * float("inf"), dim=-1)),
        ("outer", lambda x: torch.outer(x[:, 0, 0], x[0, :, 1])),
        ("ger", lambda x: x[:, 0, 0].ger(x[0, 1])),
        ("glu", lambda x: F.glu(x[:, :, :6])),
        ("glu_dim", lambda x: F.glu(t(x)[:, :6], dim=1)),
    ]
    for name, fn in cases:
        _run(name, fn, [(5, 7)])
    for name, m, shapes in [
            ("CosineSimilarity", nn.CosineSimilarity(dim=1), [(6,), (6,)]),
            ("CosineSimilarity_eps", nn.CosineSimilarity(dim=-1, eps=1e-3), [(3, 6), (1, 6)]),
            ("PairwiseDistance", nn.PairwiseDistance(), [(6,), (6,)]),
            ("PairwiseDistance_p", nn.PairwiseDistance(p=1.5, keepdim=True), [(5,), (5,)]),
            ("GLU", nn.GLU(), [(3, 8)])]:
        _run(name, _Wrap(m, len(shapes)), shapes)


def _Wrap(m, n):
    """m called from a custom forward with n inputs (the exporter runs a
    bare two-input module only inside a graph)."""
    import torch

    class W1(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = m

        def forward(self, x):
            return self.m(x)

    class W2(W1):
        def forward(self, x, y):
            return self.m(x, y)

    return (W1 if n == 1 else W2)().eval()


def test_indexing():
    """Group 4: torch.gather (ids from argsort-like argmax, strided input),
    torch.flip / Tensor.flip (one and several dims, int64 too), F.one_hot
    (given and inferred num_classes)."""
    import torch
    import torch.nn.functional as F
    t = lambda x: x.transpose(1, 2)  # noqa: E731
    cases = [
        ("gather", lambda x: torch.gather(x, 2, x.argmax(2, keepdim=True))),
        ("gather_t", lambda x: t(x).gather(1, x[:, :3, :5].abs().mul(2).long().clamp(0, 6))),
        ("gather_dim0", lambda x: torch.gather(x, 0, torch.zeros_like(x[:, :2]).long())),
        ("flip", lambda x: torch.flip(x, [1])),
        ("flip_many", lambda x: t(x).flip(1, 2)),
        ("flip_neg", lambda x: x.flip(-1) + x),
        ("flip_int", lambda x: x.long().flip(dims=(0, 2))),
        ("one_hot", lambda x: F.one_hot(x.argmax(-1), 7).float() * 2),
        ("one_hot_infer", lambda x: F.one_hot(x.abs().mul(3).long().clamp(0, 9))),
    ]
    for name, fn in cases:
        _run(name, fn, [(5, 7)])


def test_pools_computed_sizes():
    """Group 5: global pooling written by hand, the kernel size read off the
    input (x.shape[2:], x.size()[2:], (x.size(2), x.size(3)), x.size(-1),
    computed halves), beside constant strides."""
    import torch.nn.functional as F
    cases = [
        ("max_pool2d_shape", lambda x: F.max_pool2d(x, x.shape[2:]), (3, 5, 6)),
        ("avg_pool2d_size", lambda x: F.avg_pool2d(x, kernel_size=x.size()[2:]), (3, 5, 6)),
        ("avg_pool2d_tuple", lambda x: F.avg_pool2d(x, (x.size(2), x.size(3))), (2, 4, 7)),
        ("avg_pool2d_stride", lambda x: F.avg_pool2d(x, x.shape[2:], stride=1), (2, 3, 3)),
        ("max_pool1d_last", lambda x: F.max_pool1d(x, x.size(-1)).squeeze(-1), (4, 9)),
        ("avg_pool1d_last", lambda x: F.avg_pool1d(x, kernel_size=x.shape[-1]), (4, 9)),
        ("avg_pool2d_half", lambda x: F.avg_pool2d(x, (x.size(2) // 2, 1)), (2, 6, 5)),
    ]
    for name, fn, shape in cases:
        _run(name, fn, [shape])


def test_more_user_calls():
    """Calls tools/probe_user_ops.py found refused beyond the brief's list:
    F.linear with the module's own parameters, torch.tensor constants made
    in forward (ImageNet mean/std), clone/detach/t, more pointwise math."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class Lin(nn.Module):
        def __init__(self, bias=True):
            super().__init__()
            self.weight = nn.Parameter(torch.randn(3, 7) * 0.3)
            self.bias = nn.Parameter(torch.randn(3)) if bias else None

        def forward(self, x):
            return F.linear(x, self.weight, self.bias)

    class Norm(nn.Module):
        def forward(self, x):
            mean = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1)
            std = torch.tensor([[0.229], [0.224], [0.225]])
            return (x - mean) / std.unsqueeze(-1) * torch.tensor(2) + torch.tensor(True)

    class Shifted(nn.Linear):  # a subclass with its own forward: traced, F.linear runs
        def forward(self, x):
            return super().forward(x) + 1

    _run("linear", Lin().eval(), [(5, 7)])
    _run("linear_subclass", nn.Sequential(nn.ReLU(), Shifted(7, 3)).eval(), [(7,)])
    _run("linear_nobias", Lin(False).eval(), [(7,)])
    _run("tensor_consts", Norm().eval(), [(3, 4, 5)])
    t = lambda x: x.transpose(1, 2)  # noqa: E731
    cases = [
        ("clone", lambda x: t(x).clone() + x.detach().transpose(1, 2)),
        ("t", lambda x: x[0].t() * 2 + x[:, 0, :5].t().sum()),
        ("log2", lambda x: torch.log2(x.abs() + 0.1)),
        ("log10", lambda x: t(x).abs().log10()),
        ("exp2", lambda x: torch.exp2(x)),
        ("tan", lambda x: torch.tan(x.clamp(-1, 1))),
        ("atan", lambda x: torch.atan(t(x))),
        ("sinh_cosh", lambda x: torch.sinh(x) + x.cosh()),
        ("asin_acos", lambda x: torch.asin(x.clamp(-1, 1)) + torch.acos(x.clamp(-1, 1) * 0.9)),
        ("tanhshrink", lambda x: F.tanhshrink(t(x))),
        ("Tanhshrink", nn.Sequential(nn.Tanhshrink()).eval()),
    ]
    for name, fn in cases:
        _run(name, fn, [(5, 7)])


def test_masks_and_predicates():
    """Mask logic users write: & | ^ ~ on bool masks (and bitwise on
    int64), logical_*, isnan/isinf/isfinite, any/all over dims."""
    import torch

    def special(r, s):  # NaN, +-inf and zeros among normal values
        x = r.standard_normal(s).astype(np.float32)
        flat = x.reshape(-1)
        flat[::5] = np.nan
        flat[1::7] = np.inf
        flat[2::9] = -np.inf
        flat[3::4] = 0
        return x

    t = lambda x: x.transpose(1, 2)  # noqa: E731
    cases = [
        ("and", lambda x: ((x > 0) & (x < 1)).float()),
        ("or_t", lambda x: (t(x) > 0) | (t(x) < -1)),
        ("xor", lambda x: (x > 0) ^ (x[:, :1] > 0)),
        ("invert", lambda x: ~(x > 0)),
        ("and_scalar", lambda x: (x > 0) & True),
        ("int_bitwise", lambda x: ((x * 8).long() & 6) | ((x * 8).long() ^ 3)),
        ("int_invert", lambda x: ~(x * 8).long()),
        ("logical", lambda x: torch.logical_and(x, x > 0) | torch.logical_or(x > 1, x < -1)),
        ("logical_xor_not", lambda x: torch.logical_xor(x, x.long()) ^ torch.logical_not(x)),
        ("isnan", lambda x: torch.isnan(t(x))),
        ("isinf", lambda x: x.isinf()),
        ("isfinite", lambda x: torch.isfinite(x)),
        ("isfinite_int", lambda x: torch.isfinite((x > 0).long())),
        ("any", lambda x: torch.any(x > 1, dim=-1)),
        ("all_keep", lambda x: (t(x) > -1).all(dim=1, keepdim=True)),
        ("any_all", lambda x: (x > 0).any() | (x > 0).all() | x[:, 0, 0].isnan()),
    ]
    for name, fn in cases:
        _run(name, fn, [(5, 7)], gen=special)


def test_shrink_and_threshold():
    """F.hardshrink / softshrink / threshold and their modules (lambd,
    threshold and value given and defaulted; values at the edges)."""
    import torch.nn as nn
    import torch.nn.functional as F
    cases = [
        ("hardshrink", lambda x: F.hardshrink(x)),
        ("hardshrink_l", lambda x: x.transpose(1, 2).hardshrink(1.0)),
        ("softshrink", lambda x: F.softshrink(x, 0.25)),
        ("threshold", lambda x: F.threshold(x, 0.1, 20.0)),
        ("Hardshrink", nn.Sequential(nn.Hardshrink(0.3)).eval()),
        ("Softshrink", nn.Sequential(nn.Softshrink()).eval()),
        ("Threshold", nn.Sequential(nn.Threshold(-0.5, 7)).eval()),
    ]
    for name, fn in cases:
        _run(name, fn, [(5, 7)], gen=_wide)


def test_inplace_methods():
    """x.add_(y) ... x.zero_(), torch.relu_, F.relu(inplace=True) and
    nn.ReLU(inplace=True): the call's result and every later read of x see
    the written value (as in torch)."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    def later(op):  # h written in place, then h itself read
        def fn(x):
            h = x * 3
            r = op(h)
            return h * 2 + r
        return fn

    t = lambda x: x.transpose(1, 2)  # noqa: E731
    cases = [
        ("add_", lambda x: x.clone().add_(1)),
        ("add_later", later(lambda h: h.add_(h[:, :1] * 1, alpha=0.5))),
        ("sub_", later(lambda h: h.sub_(2.5))),
        ("mul_", lambda x: t(x).clone().mul_(x[:, :1, :1])),
        ("div_", later(lambda h: h.div_(4))),
        ("clamp_", later(lambda h: h.clamp_(-1, 0.5))),
        ("clamp_min_", later(lambda h: h.clamp_min_(0.1))),
        ("relu_", later(lambda h: h.relu_())),
        ("torch.relu_", later(lambda h: torch.relu_(h))),
        ("sigmoid_", later(lambda h: h.sigmoid_())),
        ("tanh_", later(lambda h: h.tanh_())),
        ("fill_", later(lambda h: h.fill_(1.5))),
        ("fill_int", lambda x: (x * 4).long().fill_(3)),
        ("zero_", later(lambda h: h.zero_())),
        ("masked_fill_", later(lambda h: h.masked_fill_(h > 0, -1.0))),
        ("F.relu_inplace", later(lambda h: F.relu(h, inplace=True))),
        ("chain", lambda x: x.clone().mul_(2).add_(1).neg_()),
        ("view_of_fresh", lambda x: (x * 1).view(x.size(0), -1).add_(1)),
        ("input", lambda x: x.add_(1) + x),
    ]
    for name, fn in cases:
        _run(name, fn, [(5, 7)])

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.relu = nn.ReLU(inplace=True)

        def forward(self, x):
            h = x * 2
            self.relu(h)
            return h + 1  # h is relu'd: nn.ReLU(inplace=True) wrote into it

    _run("ReLU_inplace", Block().eval(), [(5, 7)])


def test_inplace_refusals():
    """An in-place write Grove cannot follow is refused naming the call."""
    import torch
    # into a slice of h, which is read afterwards
    _refused(lambda x: (lambda h: (h[:, 0].add_(1), h * 2)[1])(x * 3), (4, 5), "add_",
             "view or slice")

    def early_view(x):
        h = x * 3
        v = h.view(-1)
        h.mul_(2)
        return v + 1
    _refused(early_view, (4, 5), "mul_", "view")


def test_transpose_attributes():
    """Tensor.T (2-d) and Tensor.mT (the last two dims swapped)."""
    cases = [
        ("T", lambda x: x[0].T * 1),
        ("T_use", lambda x: x[0, :, :3] @ x[0].T[:3]),
        ("mT", lambda x: x.mT + 0),
        ("mT_matmul", lambda x: x @ x.mT),
    ]
    for name, fn in cases:
        _run(name, fn, [(5, 7)])


def test_math_on_sizes():
    """math.sqrt / math.log / math.exp of sizes (the attention scale
    1 / math.sqrt(d)), on the batch dim too, and the tensor ops still."""
    import math
    import torch
    cases = [
        ("sqrt_last", lambda x: x / math.sqrt(x.size(-1))),
        ("sqrt_shape", lambda x: x * (1.0 / math.sqrt(x.shape[1] * 2))),
        ("log_batch", lambda x: x * math.log(x.size(0) + 1)),
        ("exp_size", lambda x: x - math.exp(x.size(2) / 7)),
        ("tensor_sqrt", lambda x: torch.sqrt(x.abs()) + x.abs().log().exp()),
    ]
    for name, fn in cases:
        _run(name, fn, [(5, 7)])


def test_softmin():
    """F.softmin / nn.Softmin: softmax(-x) along the last dim, a middle one
    (negative dims), through a transpose."""
    import torch.nn as nn
    import torch.nn.functional as F
    cases = [
        ("softmin_last", lambda x: F.softmin(x, dim=-1)),
        ("softmin_mid", lambda x: F.softmin(x * 10, 1)),
        ("softmin_t", lambda x: F.softmin(x.transpose(1, 2), dim=-2)),
        ("Softmin", nn.Sequential(nn.Softmin(dim=1)).eval()),
        ("Softmin_neg", nn.Sequential(nn.Softmin(dim=-1)).eval()),
    ]
    for name, fn in cases:
        _run(name, fn, [(5, 7)])


def test_bool_arithmetic():
    """bool + bool and bool * bool are bool in torch (or / and), with a
    Python bool too; with an int or a float they promote as before."""
    t = lambda x: x.transpose(1, 2)  # noqa: E731
    cases = [
        ("bool_add", lambda x: (x > 0) + (x < 1)),
        ("bool_mul_t", lambda x: (t(x) > 0) * (t(x) < 1)),
        ("bool_add_bcast", lambda x: (x > 0) + (x[:, :1] < -1)),
        ("bool_add_true", lambda x: (x > 0) + True),
        ("bool_add_int", lambda x: (x > 0) + 1),
        ("bool_mul_long", lambda x: (x > 0) * (x * 3).long()),
        ("bool_add_float", lambda x: (x > 0) + 0.5),
    ]
    for name, fn in cases:
        _run(name, fn, [(5, 7)])


def test_cumulative_and_prod():
    """torch.cumprod / torch.prod (a dim, keepdim, every element) beside
    cumsum, on floats (kept near 1 so products stay finite) and integers
    (int64 results), negative dims, through a transpose."""
    import torch
    t = lambda x: x.transpose(1, 2)  # noqa: E731
    near1 = lambda r, s: (1 + 0.3 * r.standard_normal(s)).astype(np.float32)  # noqa: E731
    cases = [
        ("cumprod", lambda x: torch.cumprod(x, dim=-1)),
        ("cumprod_t", lambda x: t(x).cumprod(1)),
        ("cumprod_int", lambda x: torch.cumprod((x * 2).long(), 0)),
        ("cumprod_bool", lambda x: (x > 1).cumprod(-1)),
        ("cumsum_t", lambda x: torch.cumsum(t(x), -2)),
        ("prod_dim", lambda x: x.prod(1)),
        ("prod_neg_keep", lambda x: torch.prod(t(x), -1, keepdim=True)),
        ("prod_all", lambda x: torch.prod(x)),
        ("prod_int", lambda x: (x * 3).long().prod(dim=2)),
        ("prod_bool", lambda x: (x > 0.5).prod(-1)),
        ("prod_dtype", lambda x: torch.prod(x, 1, dtype=torch.float32)),
    ]
    for name, fn in cases:
        _run(name, fn, [(5, 7)], gen=near1)


def test_sort_and_topk():
    """torch.sort / argsort (stable, descending) and torch.topk (values
    and indices; largest or not), along the last, a middle and a negative
    dim, through a transpose; ties (integers) keep their order as torch's
    stable sort does."""
    import torch
    t = lambda x: x.transpose(1, 2)  # noqa: E731
    cases = [
        ("sort", lambda x: torch.sort(x, dim=-1)),
        ("sort_values", lambda x: torch.sort(t(x), 1, descending=True)[0]),
        ("sort_indices", lambda x: x.sort(dim=1).indices),
        ("sort_stable_int", lambda x: torch.sort((x * 2).long(), dim=-1, stable=True)),
        ("sort_stable_desc", lambda x: torch.sort((x * 2).long(), dim=-1, descending=True,
                                                  stable=True)),
        ("argsort", lambda x: torch.argsort(x, dim=-1)),
        ("argsort_desc_t", lambda x: t(x).argsort(dim=-2, descending=True)),
        ("topk", lambda x: torch.topk(x, 2, dim=-1)),
        ("topk_values", lambda x: torch.topk(t(x), 3, dim=1)[0]),
        ("topk_smallest", lambda x: x.topk(1, dim=-2, largest=False).values),
        ("topk_indices", lambda x: torch.topk(x, 7).indices),
        ("topk_int", lambda x: torch.topk((x * 3).long(), 2)[0]),
    ]
    for name, fn in cases:
        _run(name, fn, [(5, 7)])


def test_sort_exact_int64_and_nan():
    """int64 keys compare as integers: 2**60 + 1 and 2**60 are one double
    (2**60's neighbours are 256 apart), so values that close, and near
    either end of int64's range, must still sort apart, ties in their
    order (stable).  The outputs are the values minus the offset (small
    again, so that the float64 comparison sees a wrong order) and the
    indices.  Floats: NaN goes last ascending and first descending, as
    torch.sort puts it; topk's NaNs are compared as values only (torch's
    order of equal values in topk is its own)."""
    import torch
    big, hi, lo = 2 ** 60, 2 ** 63 - 64, -(2 ** 63) + 64
    t = lambda x: x.transpose(1, 2)  # noqa: E731
    q = lambda x: (x * 3).long()  # noqa: E731  small integers, many ties

    def vi(s, off):
        return s.values - off, s.indices

    def distinct(x):  # distinct along the last dim (a * 8 + its position), within 256
        return q(x) * 8 + torch.arange(7)

    def nan(x):  # NaNs and -infs among the values
        return x.masked_fill(x > 0.6, float("nan")).masked_fill(x < -1.2, float("-inf"))

    cases = [
        ("sort_i64_big", lambda x: vi(torch.sort(q(x) + big, dim=-1, stable=True), big)),
        ("sort_i64_big_desc", lambda x: vi(torch.sort(q(x) + big, dim=1, descending=True,
                                                      stable=True), big)),
        ("sort_i64_big_t", lambda x: vi(torch.sort(t(q(x) + big), dim=-1, stable=True), big)),
        ("argsort_i64_big", lambda x: torch.argsort(q(x) + big, dim=-1, stable=True)),
        ("argsort_i64_big_desc", lambda x: torch.argsort(q(x) - big, descending=True,
                                                         stable=True)),
        ("sort_i64_max", lambda x: vi(torch.sort(q(x) + hi, descending=True, stable=True), hi)),
        ("sort_i64_min", lambda x: vi(torch.sort(q(x) + lo, stable=True), lo)),
        ("topk_i64_big", lambda x: vi(torch.topk(distinct(x) + big, 3), big)),
        ("topk_i64_big_smallest", lambda x: vi(torch.topk(distinct(x) + big, 2, largest=False),
                                               big)),
        ("sort_nan", lambda x: torch.sort(nan(x), dim=-1, stable=True)),
        ("sort_nan_desc", lambda x: torch.sort(nan(x), dim=-1, descending=True, stable=True)),
        ("argsort_nan_t", lambda x: t(nan(x)).argsort(dim=1, descending=True, stable=True)),
        ("topk_nan_values", lambda x: torch.topk(nan(x), 4)[0]),
        ("topk_nan_smallest", lambda x: torch.topk(nan(x), 3, largest=False)[0]),
    ]
    for name, fn in cases:
        _run(name, fn, [(5, 7)])


def test_repeat_interleave():
    """repeat_interleave with an int repeats: along a dim (negative too),
    flattened (no dim), on integers, through a transpose, past 4 dims."""
    import torch
    t = lambda x: x.transpose(1, 2)  # noqa: E731
    cases = [
        ("ri_dim1", lambda x: x.repeat_interleave(2, dim=1)),
        ("ri_neg", lambda x: torch.repeat_interleave(x, 3, dim=-1)),
        ("ri_t", lambda x: t(x).repeat_interleave(2, 1)),
        ("ri_batch", lambda x: x.repeat_interleave(2, dim=0)),
        ("ri_flat", lambda x: torch.repeat_interleave(x[:, :2], 2)),
        ("ri_int", lambda x: (x * 3).long().repeat_interleave(1, dim=2)),
        ("ri_kv_heads", lambda x: x.unsqueeze(1).repeat_interleave(4, dim=1) * 1),
    ]
    for name, fn in cases:
        _run(name, fn, [(5, 7)])


def test_unfold():
    """F.unfold (im2col) on a 4-d input: kernel, dilation, padding and
    stride as ints and pairs, odd sizes, through a transpose; nn.Unfold."""
    import torch.nn as nn
    import torch.nn.functional as F
    cases = [
        ("unfold_k2", lambda x: F.unfold(x, 2)),
        ("unfold_pairs", lambda x: F.unfold(x, (2, 3), dilation=(1, 2), padding=1, stride=(2, 1))),
        ("unfold_t", lambda x: F.unfold(x.transpose(2, 3), kernel_size=3, padding=(0, 1))),
        ("unfold_s2", lambda x: F.unfold(x * 3, 2, stride=2)),
        ("unfold_1x1", lambda x: F.unfold(x, 1)),
        ("Unfold", nn.Sequential(nn.Unfold((2, 3), padding=1, stride=2)).eval()),
        ("Unfold_default", nn.Sequential(nn.Unfold(3)).eval()),
    ]
    for name, fn in cases:
        _run(name, fn, [(3, 5, 7)])


def test_atan2_lerp_addc_nan_to_num():
    """torch.atan2 (arctan2, integers promoted), torch.lerp (a number or a
    tensor weight, either side of 0.5, broadcast), torch.addcmul / addcdiv
    (value, integers kept int64 by addcmul, a float among them float32),
    torch.nan_to_num (defaults: float32's largest; numbers; integers
    unchanged); torch, Tensor and in-place spellings, through a transpose."""
    import torch
    t = lambda x: x.transpose(1, 2)  # noqa: E731
    # NaN (log of a negative) and +-inf (division by zero) beside numbers.
    odd = lambda x: torch.cat([x.log(), x / 0, x], dim=1)  # noqa: E731
    cases = [
        ("atan2", lambda x: torch.atan2(x, x[:, :1] + 0.5)),
        ("atan2_method_t", lambda x: t(x).atan2(t(x) * 2 - 1)),
        ("arctan2", lambda x: torch.arctan2(x, -x.abs())),
        ("atan2_zero", lambda x: torch.atan2(x * 0, x)),  # -0 and +0 beside negative x
        ("atan2_int", lambda x: torch.atan2((x * 3).long(), x)),
        ("lerp", lambda x: torch.lerp(x, -x, 0.3)),
        ("lerp_high", lambda x: torch.lerp(x, x * 2 + 1, 0.8)),
        ("lerp_negative", lambda x: torch.lerp(x, -x, -0.7)),
        ("lerp_tensor_w", lambda x: torch.lerp(x, x[:, :1], x.sigmoid())),
        ("lerp_method_t", lambda x: t(x).lerp(t(x) * 3, 0.25)),
        ("lerp_", lambda x: x.clone().lerp_(x.flip(1), x[:, :, :1].sigmoid())),
        ("addcmul", lambda x: torch.addcmul(x, x, x, value=0.5)),
        ("addcmul_default", lambda x: torch.addcmul(x, x[:, :1], t(x)[:, :, :5].transpose(1, 2))),
        ("addcmul_method", lambda x: x.addcmul(x.sin(), x.cos(), value=-2)),
        ("addcmul_int", lambda x: torch.addcmul((x * 3).long(), (x * 2).long(), x.long(),
                                                value=2)),
        ("addcmul_mixed", lambda x: torch.addcmul(x, (x * 3).long(), x)),
        ("addcmul_", lambda x: x.clone().addcmul_(x, x[:, :1], value=0.1)),
        ("addcdiv", lambda x: torch.addcdiv(x, x, x.abs() + 1, value=0.5)),
        ("addcdiv_t", lambda x: t(x).addcdiv(t(x)[:, :1], t(x).exp())),
        ("addcdiv_mixed", lambda x: torch.addcdiv(x, (x * 3).long(), x.abs() + 1)),
        ("addcdiv_", lambda x: x.clone().addcdiv_(x, x.abs() + 0.5, value=3)),
        ("nan_to_num", lambda x: torch.nan_to_num(odd(x))),
        ("nan_to_num_values", lambda x: torch.nan_to_num(odd(x), nan=1.5, posinf=10, neginf=-3)),
        ("nan_to_num_method_t", lambda x: t(odd(x)).nan_to_num(posinf=1.0)),
        ("nan_to_num_", lambda x: odd(x).nan_to_num_(neginf=0.0)),
        ("nan_to_num_int", lambda x: torch.nan_to_num((x * 3).long())),
    ]
    for name, fn in cases:
        _run(name, fn, [(5, 7)])


def test_promotions_in_hf_code():
    """What HuggingFace's blocks needed (tests/py/test_hf_blocks.py), one
    call each: where on int64 and bool operands, torch.min / max with a
    tensor for other, maximum / minimum on integers, pow of numbers
    (size ** 0.5) and of a number base, F.softmax(dtype=torch.float32)."""
    import torch
    import torch.nn.functional as F
    ids = lambda x: (x * 4).long()  # noqa: E731
    cases = [
        ("where_int", lambda x: torch.where(x > 0, ids(x), ids(-x))),
        ("where_int_number", lambda x: torch.where(x > 0, ids(x), 7)),
        ("where_int_float_number", lambda x: torch.where(x > 0, ids(x), 0.5)),
        ("where_bool", lambda x: torch.where(x > 1, x > 0, False)),
        ("where_bool_number_int", lambda x: torch.where(x > 1, x > 0, 0)),
        ("where_mixed", lambda x: torch.where(x > 0, ids(x), x)),
        ("masked_fill_int", lambda x: ids(x).masked_fill(x > 0, 3)),
        ("masked_fill_bool", lambda x: (x > 0).masked_fill(x > 1, False)),
        ("min_other", lambda x: torch.min(x, torch.full_like(x, 0.5))),
        ("max_other_int", lambda x: torch.max(ids(x), torch.full_like(ids(x), 2))),
        ("min_method_other", lambda x: ids(x).min(ids(x[:, :1]))),
        ("minimum_int", lambda x: torch.minimum(ids(x), ids(-x))),
        ("maximum_mixed", lambda x: torch.maximum(ids(x), x)),
        ("maximum_bool", lambda x: torch.maximum(x > 0, x > 1)),
        ("pow_sizes", lambda x: x / (x.size(-1) ** 0.5)),
        ("pow_int_sizes", lambda x: x[:, : x.size(1) ** 2 // 10]),
        ("pow_number_base", lambda x: 2 ** x),
        ("pow_number_base_torch", lambda x: torch.pow(3.0, x[:, :1])),
        ("softmax_dtype", lambda x: F.softmax(x, dim=-1, dtype=torch.float32)),
        ("log_softmax_dtype", lambda x: x.log_softmax(1, dtype=torch.float32)),
    ]
    for name, fn in cases:
        _run(name, fn, [(5, 7)])


def test_int_of_sizes():
    """int() of a size expression (int(x.shape[-1] ** 0.5), int(math.sqrt(n)),
    int(n / 2)), float(n), math.floor / math.ceil, round() and abs() of
    sizes are computed per request; int() / float() of a tensor's value is refused naming it.
    Tensor.int() (RoBERTa's position ids) computes as int64."""
    import math

    import torch
    cases = [
        ("int_pow", lambda x: x[:, :, : int(x.shape[-1] ** 0.5)]),
        ("int_sqrt", lambda x: x[:, : int(math.sqrt(x.size(1)))] * 2),
        ("int_div", lambda x: x.view(x.size(0), int(x.size(1) * x.size(2) / 5), 5)),
        ("int_int", lambda x: x[:, : int(x.size(-1))]),
        ("float_size", lambda x: x / float(x.size(-1))),
        ("math_floor", lambda x: x[:, : math.floor(x.size(1) / 2)]),
        ("math_ceil", lambda x: x[:, : math.ceil(x.size(1) / 2)] + 1),
        ("round_size", lambda x: x[:, : round(x.size(1) / 2)]),  # half to even: 2
        ("round_size_digits", lambda x: x * round(x.size(1) / 3, 2)),
        ("abs_size", lambda x: x[:, : abs(x.size(1) - 9)]),
        ("abs_float_size", lambda x: x * abs(x.size(1) / -2)),
        ("tensor_int", lambda x: x * (x > 0).int()),
        ("tensor_int_cumsum", lambda x: torch.cumsum((x > 0).int(), dim=1).type_as(x) * x),
        ("tensor_float", lambda x: (x > 0).float() + (x * 3).long().float()),
        # int and float stand for themselves too while traced: isinstance,
        # issubclass and int() of a constant answer as Python's do.
        ("int_still_a_type", lambda x: x * (2 if isinstance(5, int) and issubclass(bool, int)
                                            and not isinstance(5.0, int)
                                            and isinstance(1.5, (int, float)) else 3)
         + int("4") + float(1)),
    ]
    for name, fn in cases:
        _run(name, fn, [(5, 7)])
    _refused(lambda x: x[:, : int(x.sum())], (4,), "int()", "tensor's value")
    _refused(lambda x: x * float(x.max()), (4,), "float()", "tensor's value")


def test_topk_unsorted_as_sets():
    """torch.topk(..., sorted=False): torch's order is implementation-defined
    (Grove gives the sorted order), so values and indices are compared as
    sets: sorted inside the module, on inputs without ties."""
    import torch
    t = lambda x: x.transpose(1, 2)  # noqa: E731
    cases = [
        ("topk_unsorted_values", lambda x: torch.topk(x, 3, sorted=False)[0].sort(-1)[0]),
        ("topk_unsorted_indices", lambda x: x.topk(4, dim=1, sorted=False)[1].sort(1)[0]),
        ("topk_unsorted_smallest_t", lambda x: torch.topk(t(x), 2, dim=-1, largest=False,
                                                          sorted=False).values.sort(-1)[0]),
        ("topk_unsorted_gather", lambda x: x.gather(-1, x.topk(3, sorted=False).indices)
         .sort(-1, descending=True)[0]),
    ]
    for name, fn in cases:
        _run(name, fn, [(5, 7)])
