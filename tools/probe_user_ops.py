#!/usr/bin/env python3
"""probe_user_ops: traces one tiny nn.Module per common torch call (the
calls users' own models make: tutorial and HuggingFace-style code) through
tools/grove_export.py and lists which the exporter refuses, with its reason.
Exporting is the Python side only: no Grove build is needed.

    scripts/torch-python.sh -> python3 tools/probe_user_ops.py [-v] [NAME...]

Exit status 0 always (it is a survey, not a test; tests/py/test_user_ops.py
holds the parity tests).  -v prints the refusal message of each refused call.
"""
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def cases():
    """(name, forward(x), input shape): each forward is one user spelling."""
    import math

    import torch
    import torch.nn.functional as F
    c = [
        # 1: tensors made like another
        ("torch.zeros_like", lambda x: x + torch.zeros_like(x)),
        ("torch.ones_like", lambda x: x * torch.ones_like(x)),
        ("torch.full_like", lambda x: x + torch.full_like(x, 2.0)),
        ("torch.empty_like", lambda x: torch.empty_like(x).fill_(0) + x),
        ("torch.rand_like", lambda x: x + 0 * torch.rand_like(x)),
        ("Tensor.new_zeros", lambda x: x + x.new_zeros(x.shape)),
        ("Tensor.new_ones", lambda x: x + x.new_ones(x.shape)),
        ("Tensor.new_full", lambda x: x + x.new_full(x.shape, 3.0)),
        ("Tensor.new_empty", lambda x: x + 0 * x.new_empty(x.shape)),
        ("Tensor.new_tensor", lambda x: x + x.new_tensor(2.0)),
        ("Tensor.expand_as", lambda x: x[:, :1].expand_as(x) + x),
        ("Tensor.view_as", lambda x: x.flatten(1).view_as(x)),
        ("Tensor.reshape_as", lambda x: x.flatten(1).reshape_as(x)),
        ("Tensor.type_as", lambda x: x.type_as(x)),
        # 2: pointwise math
        ("torch.maximum", lambda x: torch.maximum(x, -x)),
        ("torch.minimum", lambda x: torch.minimum(x, -x)),
        ("torch.clamp_min", lambda x: torch.clamp_min(x, 0.1)),
        ("Tensor.clamp_min", lambda x: x.clamp_min(0.1)),
        ("Tensor.clamp_max", lambda x: x.clamp_max(0.1)),
        ("torch.sign", lambda x: torch.sign(x)),
        ("torch.sin", lambda x: torch.sin(x)),
        ("torch.cos", lambda x: torch.cos(x)),
        ("torch.erf", lambda x: torch.erf(x)),
        ("torch.reciprocal", lambda x: torch.reciprocal(x)),
        ("torch.floor", lambda x: torch.floor(x)),
        ("torch.ceil", lambda x: torch.ceil(x)),
        ("torch.round", lambda x: torch.round(x)),
        ("torch.trunc", lambda x: torch.trunc(x)),
        ("F.softsign", lambda x: F.softsign(x)),
        ("F.logsigmoid", lambda x: F.logsigmoid(x)),
        ("torch.log1p", lambda x: torch.log1p(x.abs())),
        ("torch.expm1", lambda x: torch.expm1(x)),
        ("torch.square", lambda x: torch.square(x)),
        # 3: functional spellings of modules Grove runs
        ("F.silu", lambda x: F.silu(x)),
        ("F.leaky_relu", lambda x: F.leaky_relu(x, 0.2)),
        ("F.sigmoid", lambda x: F.sigmoid(x)),
        ("F.tanh", lambda x: F.tanh(x)),
        ("F.hardtanh", lambda x: F.hardtanh(x)),
        ("F.elu", lambda x: F.elu(x)),
        ("F.softplus", lambda x: F.softplus(x)),
        ("F.gelu(tanh)", lambda x: F.gelu(x, approximate="tanh")),
        ("F.relu6", lambda x: F.relu6(x)),
        ("F.mish", lambda x: F.mish(x)),
        ("F.relu", lambda x: F.relu(x)),
        ("F.hardswish", lambda x: F.hardswish(x)),
        ("F.hardsigmoid", lambda x: F.hardsigmoid(x)),
        ("F.selu", lambda x: F.selu(x)),
        ("F.celu", lambda x: F.celu(x)),
        ("F.softmax", lambda x: F.softmax(x, dim=-1)),
        ("F.log_softmax", lambda x: F.log_softmax(x, dim=-1)),
        ("F.glu", lambda x: F.glu(x, dim=1)),
        ("torch.nn.functional.silu via Tensor", lambda x: torch.nn.functional.silu(x)),
        ("Tensor.sigmoid", lambda x: x.sigmoid()),
        ("Tensor.tanh", lambda x: x.tanh()),
        ("Tensor.relu", lambda x: x.relu()),
        ("Tensor.exp", lambda x: x.exp()),
        ("torch.rsqrt", lambda x: torch.rsqrt(x.abs() + 1)),
        # 4: norms, statistics, indexing
        ("torch.norm", lambda x: torch.norm(x, dim=-1, keepdim=True)),
        ("Tensor.norm", lambda x: x.norm(p=2, dim=1)),
        ("torch.linalg.vector_norm", lambda x: torch.linalg.vector_norm(x, dim=-1)),
        ("F.normalize", lambda x: F.normalize(x, dim=1)),
        ("F.cosine_similarity", lambda x: F.cosine_similarity(x, x.flip(1), dim=1)),
        ("F.pairwise_distance", lambda x: F.pairwise_distance(x, x * 2)),
        ("Tensor.var", lambda x: x.var(dim=1)),
        ("Tensor.std", lambda x: x.std(dim=1, keepdim=True)),
        ("torch.logsumexp", lambda x: torch.logsumexp(x, dim=1)),
        ("torch.gather", lambda x: torch.gather(x, 1, x.argmax(1, keepdim=True))),
        ("torch.flip", lambda x: torch.flip(x, [1])),
        ("F.one_hot", lambda x: F.one_hot(x.argmax(1), 4).float()),
        ("torch.outer", lambda x: torch.outer(x[0], x[0])),
        ("Tensor.max(dim)", lambda x: x.max(dim=1)[0]),
        ("Tensor.mean", lambda x: x.mean(-1)),
        ("torch.amax", lambda x: torch.amax(x, 1)),
        ("Tensor.prod", lambda x: x.prod(1)),
        ("torch.max(x, y)", lambda x: torch.max(x, -x)),
        ("torch.min(x, y)", lambda x: torch.min(x, -x)),
        ("x // 2 (tensor)", lambda x: (x * 4).long() // 3),
        ("x % 2 (tensor)", lambda x: (x * 4).long() % 3),
        ("torch.div(rounding_mode)", lambda x: torch.div(x, 2, rounding_mode="floor")),
        ("torch.remainder", lambda x: torch.remainder(x, 1.5)),
        ("Tensor.t", lambda x: x.t()),
        ("Tensor.T", lambda x: x.T),
        ("Tensor.mT", lambda x: x.unsqueeze(1).mT),
        ("Tensor.add_", lambda x: x.clone().add_(1)),
        ("Tensor.clone", lambda x: x.clone()),
        ("Tensor.detach", lambda x: x.detach()),
        ("F.relu(inplace)", lambda x: F.relu(x * 1, inplace=True)),
        ("Tensor.fill_", lambda x: torch.empty_like(x).fill_(1)),
        ("torch.where(scalar)", lambda x: torch.where(x > 0, x, 0.0)),
        ("torch.log2", lambda x: torch.log2(x.abs() + 1)),
        ("torch.log10", lambda x: torch.log10(x.abs() + 1)),
        ("torch.exp2", lambda x: torch.exp2(x)),
        ("torch.tan", lambda x: torch.tan(x)),
        ("torch.atan", lambda x: torch.atan(x)),
        ("torch.atan2", lambda x: torch.atan2(x, x + 1)),
        ("torch.sinh", lambda x: torch.sinh(x)),
        ("F.softmin", lambda x: F.softmin(x, dim=-1)),
        ("F.tanhshrink", lambda x: F.tanhshrink(x)),
        ("F.threshold", lambda x: F.threshold(x, 0.1, 20.0)),
        ("F.hardshrink", lambda x: F.hardshrink(x)),
        ("torch.topk", lambda x: torch.topk(x, 2, dim=-1)[0]),
        ("torch.sort", lambda x: torch.sort(x, dim=-1)[0]),
        ("torch.argsort", lambda x: torch.argsort(x, dim=-1)),
        ("torch.cumprod", lambda x: torch.cumprod(x, dim=-1)),
        ("Tensor.repeat_interleave", lambda x: x.repeat_interleave(2, dim=1)),
        ("torch.isnan", lambda x: torch.isnan(x).float()),
        ("torch.nan_to_num", lambda x: torch.nan_to_num(x)),
        ("torch.lerp", lambda x: torch.lerp(x, -x, 0.3)),
        ("torch.addcmul", lambda x: torch.addcmul(x, x, x, value=0.5)),
        ("torch.addcdiv", lambda x: torch.addcdiv(x, x, x.abs() + 1, value=0.5)),
        ("Tensor.lerp_", lambda x: x.clone().lerp_(-x, x.sigmoid())),
        ("Tensor.nan_to_num", lambda x: (x / 0).nan_to_num(posinf=1.0)),
        ("torch.min(x, other)", lambda x: torch.min(x, torch.full_like(x, 0.5))),
        ("int(size ** 0.5)", lambda x: x[:, : int(x.shape[-1] ** 0.5)]),
        ("int(math.sqrt(size))", lambda x: x[:, : int(math.sqrt(x.size(-1)))]),
        ("F.softmax(dtype=float32)", lambda x: F.softmax(x, dim=-1, dtype=torch.float32)),
        ("float(size)", lambda x: x / float(x.size(-1))),
        ("math.floor(size)", lambda x: x[:, : math.floor(x.size(1) / 2)]),
        ("round(size)", lambda x: x[:, : round(x.size(1) / 2)]),
        ("abs(size)", lambda x: x[:, : abs(x.size(1) - 10)]),
        ("Tensor.int", lambda x: x * (x > 0).int()),
        ("torch.any", lambda x: (x > 0).any(dim=-1).float()),
        ("torch.all", lambda x: (x > 0).all(dim=-1).float()),
        ("Tensor.masked_fill_", lambda x: x.clone().masked_fill_(x > 0, 0.0)),
        ("torch.tensor", lambda x: x + torch.tensor(2.0)),
        ("torch.logical_and", lambda x: torch.logical_and(x > 0, x < 1).float()),
        ("operator.invert", lambda x: (~(x > 0)).float()),
        ("operator.and_", lambda x: ((x > 0) & (x < 1)).float()),
        ("F.linear", lambda x: F.linear(x, x[0:1].expand(3, -1))),
        ("F.unfold", lambda x: F.unfold(x, 2), (3, 5, 6)),
        ("torch.prod", lambda x: torch.prod(x, 1)),
        # 5: pools with computed kernels
        ("F.max_pool2d(x, x.shape[2:])", lambda x: F.max_pool2d(x, x.shape[2:]), (3, 5, 6)),
        ("F.avg_pool2d(x, kernel_size=x.size()[2:])",
         lambda x: F.avg_pool2d(x, kernel_size=x.size()[2:]), (3, 5, 6)),
        ("F.adaptive_avg_pool2d(x, 1)", lambda x: F.adaptive_avg_pool2d(x, 1), (3, 5, 6)),
        ("F.avg_pool2d(x, (x.size(2), x.size(3)))",
         lambda x: F.avg_pool2d(x, (x.size(2), x.size(3))), (3, 5, 6)),
    ]
    return [(t[0], t[1], t[2] if len(t) > 2 else (4,)) for t in c]


def probe(name, fn, shape):
    """None when the module exports, else the exporter's message."""
    import torch
    from grove_export import export

    class M(torch.nn.Module):
        def forward(self, x):
            return fn(x)

    with tempfile.TemporaryDirectory() as tmp:
        try:
            export(M().eval(), os.path.join(tmp, "m"), example_input=torch.randn(1, *shape))
        except Exception as e:  # ExportError, or fx's own when tracing fails
            return f"{type(e).__name__}: {e}"
    return None


def main(argv):
    verbose = "-v" in argv
    names = [a for a in argv if a != "-v"]
    refused = 0
    for name, fn, shape in cases():
        if names and name not in names:
            continue
        why = probe(name, fn, shape)
        refused += why is not None
        print(f"{'REFUSED' if why else 'ok     '} {name}" + (f"\n    {why}" if why and verbose
                                                              else ""))
    print(f"{refused} refused")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
