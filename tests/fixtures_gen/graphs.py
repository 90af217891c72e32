"""Graph parity fixtures: small modules with a custom forward, one or a few
graph operations each (every operation docs/model-spec.md lists), exported by
tools/grove_export.py, with torch's outputs:

    graph_<case>.json          the model.json build_spec writes (its fx graph)
    graph_<case>.safetensors   w.<state_dict key>, the inputs x0.. and torch's
                               outputs y0.. on them, and the same for two more
                               input sets, s1.x0.. / s1.y0.. and s2.x0.. /
                               s2.y0.. (batch 1 and batch 7)

tests/check_graph.c builds each model from the JSON, loads w.* strictly, runs
the inputs and compares every output (rtol 1e-4, atol 1e-5).  The first set's
inputs have a batch size other than the example's; the other two run every
case at batch 1 and at an odd batch (7), with 3 for any other dimension the
spec leaves free (a sequence length), so the graph's size arithmetic and each
operation meet several shapes."""
import json
import os
from collections import OrderedDict

import torch
import torch.nn as nn
import torch.nn.functional as F

from grove_export import build_spec, save_safetensors


class AddTensor(nn.Module):
    def forward(self, a, b):
        return a + b, torch.add(a, b, alpha=2), torch.add(a, 3)


class AddBroadcast(nn.Module):
    def __init__(self):
        super().__init__()
        self.bias = nn.Parameter(torch.randn(4))
        self.col = nn.Parameter(torch.randn(3, 1))

    def forward(self, x):
        return x + self.bias, torch.add(x, self.col), self.col + x[:, :1]


class SubScalar(nn.Module):
    def forward(self, x):
        return x - 1.5, 2 - x, torch.sub(x, x * 0.5, alpha=0.5), x.sub(x[0])


class MulDiv(nn.Module):
    def __init__(self):
        super().__init__()
        self.den = nn.Parameter(torch.rand(5) + 0.5)

    def forward(self, x, y):
        return x * y, x / 3, 3 / (x * x + 1), torch.div(x, self.den) * torch.mul(y, 2)


class MatMul(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(5, 3))
        self.v = nn.Parameter(torch.randn(5))

    def forward(self, x):
        return (x @ self.w, torch.matmul(x, x.transpose(-1, -2)), x @ self.v,
                torch.matmul(self.v, x.transpose(1, 2)))


class Activations(nn.Module):
    def forward(self, x):
        return (F.relu(x) + torch.relu(x) + x.relu(), F.gelu(x) + F.gelu(x, approximate="tanh"),
                torch.sigmoid(x) * x.sigmoid(), torch.tanh(x) - x.tanh() + torch.tanh(x))


class Softmaxes(nn.Module):
    def forward(self, x):
        return (F.softmax(x, dim=1), torch.softmax(x, -1), x.log_softmax(0),
                F.log_softmax(x, dim=-1) + x.softmax(-1))


class DropoutFlatten(nn.Module):
    def forward(self, x):
        x = F.dropout(x, 0.3, self.training)
        return torch.flatten(x, 1), x.flatten(), x.flatten(0, 1)


class ReshapeView(nn.Module):
    def forward(self, x):
        return (x.view(x.size(0), -1), x.reshape(-1, 6), x.view(x.shape[0], x.size(1) // 3, -1),
                x.transpose(1, 2).reshape(x.size(0), -1))


class PermuteTranspose(nn.Module):
    def forward(self, x):
        return (x.permute(0, 2, 1) + 1, x.transpose(1, 2).contiguous(),
                torch.transpose(x, 0, 1) * 2, torch.permute(x, (2, 0, 1)) - x.permute(2, 0, 1))


class Cat(nn.Module):
    def forward(self, x, y):
        return (torch.cat([x, y], dim=1), torch.cat((x, x * 2), -1),
                torch.cat([x.transpose(1, 2), y.transpose(1, 2)], 2))


class MeanSum(nn.Module):
    def forward(self, x):
        return (x.mean(dim=1), x.mean(dim=(1, 2), keepdim=True), torch.sum(x, 1) + x.sum(),
                x.sum(-1, keepdim=True) * x.mean() + torch.mean(x, -2, True))


class GetItem(nn.Module):
    def forward(self, x):
        return x[:, 0], x[:, 1:3], x[..., ::2], x[:, None, -1]


class Sizes(nn.Module):
    def forward(self, x):
        return (x.reshape(x.shape), x.view(x.size(0), x.size(1) * x.size(2)),
                torch.reshape(x, (-1, 12)), x * (x.size(1) - 1) / x.size(2))


class AttnTuple(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = nn.MultiheadAttention(8, 2, batch_first=True)

    def forward(self, x):
        out, w = self.attn(x, x, x)
        return out + self.attn(x, x, x, need_weights=False)[0], w


class GetAttr(nn.Module):
    def __init__(self):
        super().__init__()
        self.pos = nn.Parameter(torch.randn(1, 10, 4))
        self.register_buffer("scale", torch.rand(4) + 0.5)
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        h = (x + self.pos[:, :x.size(1)]) * self.scale
        return torch.matmul(h, self.fc.weight.transpose(0, 1)) + self.fc.bias


class MultiIO(nn.Module):
    def forward(self, a, b):
        return a[:, :2] + b, a[:, :2] * b, torch.cat([a, b], 1)


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.fc1 = nn.Linear(c, c)
        self.fc2 = nn.Linear(c, c)
        self.norm = nn.LayerNorm(c)

    def forward(self, x):
        return self.norm(x + self.fc2(F.relu(self.fc1(x))))


class Nested(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([Block(6) for _ in range(3)])
        self.head = nn.Sequential(nn.Linear(6, 4), nn.Tanh())

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return self.head(x)


class ResBlock(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.conv1 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(c)
        self.act = nn.ReLU()

    def forward(self, x):
        out = self.act(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + x)


class ResNetFused(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3, stride=2, padding=1)
        self.blocks = nn.ModuleList([ResBlock(16), ResBlock(16)])
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(16, 5)

    def forward(self, x):
        x = F.relu(self.stem(x))
        for b in self.blocks:
            x = b(x)
        return self.fc(torch.flatten(self.pool(x), 1))


class Fire(nn.Module):
    """torchvision's SqueezeNet Fire block: two convolutions' outputs, each through its ReLU,
    concatenated (a chain of cats in place in Grove)."""

    def __init__(self, cin, squeeze, e1, e3):
        super().__init__()
        self.squeeze = nn.Conv2d(cin, squeeze, 1)
        self.squeeze_activation = nn.ReLU(inplace=True)
        self.expand1x1 = nn.Conv2d(squeeze, e1, 1)
        self.expand1x1_activation = nn.ReLU(inplace=True)
        self.expand3x3 = nn.Conv2d(squeeze, e3, 3, padding=1)
        self.expand3x3_activation = nn.ReLU(inplace=True)

    def forward(self, x):
        x = self.squeeze_activation(self.squeeze(x))
        return torch.cat([self.expand1x1_activation(self.expand1x1(x)),
                          self.expand3x3_activation(self.expand3x3(x))], 1)


class FireNested(nn.Module):
    """Fire blocks (graphs with cats in place) called from a root graph, as SqueezeNet and
    DenseNet nest theirs: the root is not planned (core/graph/graph.c)."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3, stride=2, padding=1)
        self.features = nn.Sequential(Fire(16, 8, 16, 16), Fire(32, 8, 16, 16))
        self.fc = nn.Linear(32, 5)

    def forward(self, x):
        x = self.features(F.relu(self.stem(x)))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


class LinearRelu(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(7, 9)
        self.b = nn.Linear(9, 5)
        self.act = nn.ReLU()

    def forward(self, x):
        return self.act(self.b(F.relu(self.a(x))))


class Inner(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):  # never called: the root calls self.sub.fc directly
        raise RuntimeError("unused")


class Holder(nn.Module):
    def __init__(self):
        super().__init__()
        self.sub = Inner()

    def forward(self, x):
        return self.sub.fc(x) * 2


class EmbedMean(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(20, 6)
        self.fc = nn.Linear(6, 2)

    def forward(self, ids):
        return self.fc(self.emb(ids).mean(1))


class SeqMasks(nn.Module):
    """Masks built in forward (#19): generate_square_subsequent_mask(t) in a
    MultiheadAttention call, arange, cumsum, ones/zeros/full with traced
    sizes, tril, Tensor.to."""

    def __init__(self):
        super().__init__()
        self.attn = nn.MultiheadAttention(8, 2, batch_first=True)

    def forward(self, x):
        t = x.size(1)
        causal = nn.Transformer.generate_square_subsequent_mask(t)
        a, w = self.attn(x, x, x, attn_mask=causal)
        pos = torch.arange(t).to(torch.float32) + torch.cumsum(torch.ones(t, dtype=torch.long), 0).to(
            torch.float32)
        lower = torch.tril(torch.full((t, t), 0.5)) + torch.zeros(t, t)
        return a + pos[None, :, None], w + lower, x.sum(-1).cumsum(dim=1)


class SeqLinalg(nn.Module):
    """einsum (attention spellings), bmm, baddbmm and addmm (#19)."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(6, 5) * 0.3)
        self.b = nn.Parameter(torch.randn(5) * 0.1)

    def forward(self, x, y):
        s = torch.einsum("bld,bmd->blm", x, y)
        o = torch.einsum("blm,bmd->bld", s.softmax(-1), y)
        r = torch.bmm(o, y.transpose(1, 2)) + torch.baddbmm(s, x, y.transpose(1, 2), beta=0.5,
                                                             alpha=2)
        h = torch.addmm(self.b, x.reshape(-1, 6), self.w).view(x.size(0), x.size(1), 5)
        return r, h, torch.einsum("ij->ji", self.w)


class FunctionalPools(nn.Module):
    """F.max_pool2d, F.avg_pool2d, F.adaptive_avg/max_pool2d on a convolution's result
    (channels last inside Grove) and on the input (contiguous)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)

    def forward(self, x):
        y = self.conv(x)
        a = F.max_pool2d(y, 3, 2, 1, ceil_mode=True)
        b = F.avg_pool2d(y, 3, stride=2, padding=1, ceil_mode=True, count_include_pad=False)
        c = F.adaptive_avg_pool2d(y, (3, None))
        d = F.adaptive_max_pool2d(x, 2)
        e = F.avg_pool2d(x, (2, 3), divisor_override=4)
        f = torch.flatten(F.adaptive_avg_pool2d(y, 1), 1)
        g = F.max_pool2d(x, kernel_size=2, stride=1, dilation=2)
        return a, b, c, torch.cat([d.flatten(1) + 1, e.flatten(1), f, g.flatten(1)], 1)


class FunctionalPools1d(nn.Module):
    def forward(self, x):
        return (F.max_pool1d(x, 3, 2, padding=1, ceil_mode=True),
                F.avg_pool1d(x, 4, 3, 2, True, False), F.adaptive_avg_pool1d(x, 5),
                torch.cat([F.adaptive_max_pool1d(x, 4), F.max_pool1d(x, 2, dilation=3)], 2))


def _r(*shape):
    return torch.randn(shape)


# (name, module, example inputs, test inputs)
CASES = [
    ("add_tensor", AddTensor, lambda: (_r(2, 4), _r(2, 4)), lambda: (_r(3, 4), _r(3, 4))),
    ("add_broadcast", AddBroadcast, lambda: (_r(2, 3, 4),), lambda: (_r(1, 3, 4),)),
    ("sub_scalar", SubScalar, lambda: (_r(2, 5),), lambda: (_r(3, 5),)),
    ("mul_div", MulDiv, lambda: (_r(2, 5), _r(2, 5)), lambda: (_r(4, 5), _r(4, 5))),
    ("matmul", MatMul, lambda: (_r(2, 4, 5),), lambda: (_r(3, 4, 5),)),
    ("activations", Activations, lambda: (_r(2, 7) * 3,), lambda: (_r(3, 7) * 3,)),
    ("softmax", Softmaxes, lambda: (_r(2, 6),), lambda: (_r(3, 6) * 4,)),
    ("dropout_flatten", DropoutFlatten, lambda: (_r(2, 3, 4, 5),), lambda: (_r(1, 3, 4, 5),)),
    ("reshape_view", ReshapeView, lambda: (_r(2, 3, 4),), lambda: (_r(5, 3, 4),)),
    ("permute_transpose", PermuteTranspose, lambda: (_r(2, 3, 4),), lambda: (_r(3, 3, 4),)),
    ("cat", Cat, lambda: (_r(2, 3, 4), _r(2, 5, 4)), lambda: (_r(1, 3, 4), _r(1, 5, 4))),
    ("mean_sum", MeanSum, lambda: (_r(2, 3, 5),), lambda: (_r(3, 3, 5),)),
    ("getitem", GetItem, lambda: (_r(2, 3, 4),), lambda: (_r(3, 3, 4),)),
    ("sizes", Sizes, lambda: (_r(2, 3, 4),), lambda: (_r(3, 3, 4),)),
    ("attn_tuple", AttnTuple, lambda: (_r(2, 5, 8),), lambda: (_r(3, 5, 8),)),
    ("get_attr", GetAttr, lambda: (_r(2, 7, 4),), lambda: (_r(1, 7, 4),)),
    ("multi_io", MultiIO, lambda: (_r(2, 3), _r(2, 2)), lambda: (_r(4, 3), _r(4, 2))),
    ("nested", Nested, lambda: (_r(2, 6),), lambda: (_r(5, 6),)),
    ("resnet_fused", ResNetFused, lambda: (_r(1, 3, 12, 12),), lambda: (_r(2, 3, 12, 12),)),
    ("fire_nested", FireNested, lambda: (_r(1, 3, 12, 12),), lambda: (_r(2, 3, 12, 12),)),
    ("resnet_b1", ResNetFused, lambda: (_r(1, 3, 10, 10),), lambda: (_r(1, 3, 10, 10),)),
    ("linear_relu", LinearRelu, lambda: (_r(2, 7),), lambda: (_r(3, 7),)),
    ("holder", Holder, lambda: (_r(2, 4),), lambda: (_r(3, 4),)),
    ("embed_mean", EmbedMean, lambda: (torch.zeros(1, 5, dtype=torch.long),),
     lambda: (torch.randint(0, 20, (3, 7)),)),
    ("seq_masks", SeqMasks, lambda: (_r(2, 5, 8),), lambda: (_r(3, 5, 8),)),
    ("seq_linalg", SeqLinalg, lambda: (_r(2, 4, 6), _r(2, 3, 6)), lambda: (_r(3, 4, 6), _r(3, 3, 6))),


    ("functional_pools", FunctionalPools, lambda: (_r(2, 3, 9, 10),), lambda: (_r(3, 3, 9, 10),)),
    ("functional_pools1d", FunctionalPools1d, lambda: (_r(2, 3, 17),), lambda: (_r(3, 3, 17),)),
]


def _randomise_bn(m, g):
    for mod in m.modules():
        if isinstance(mod, nn.BatchNorm2d):
            with torch.no_grad():
                mod.running_mean.copy_(torch.rand(mod.running_mean.shape, generator=g) - 0.5)
                mod.running_var.copy_(torch.rand(mod.running_var.shape, generator=g) + 0.5)
                mod.weight.copy_(torch.rand(mod.weight.shape, generator=g) + 0.5)
                mod.bias.copy_(torch.rand(mod.bias.shape, generator=g) - 0.5)


# The extra input sets: (batch, size of any other free dimension).
EXTRA_SETS = ((1, 3), (7, 3))


def _resample(x, spec_shape, batch, free, g):
    """An input like x with batch rows and `free` for each other dimension the
    spec leaves free (-1); floats at x's spread, ids in x's range."""
    shape = [batch] + [free if d < 0 else d for d in spec_shape[1:]]
    if x.dtype.is_floating_point:
        return torch.randn(shape, generator=g) * max(float(x.std()), 0.5)
    return torch.randint(0, max(int(x.max()) + 1, 2), shape, generator=g, dtype=x.dtype)


def generate(out_dir):
    write_cases(out_dir, CASES, 700)


def write_cases(out_dir, cases, seed):
    """graph_<case>.json / .safetensors for each (name, make, make_ex,
    make_x) of cases (zoo_ops.py writes its cases with it too), seeded from
    seed."""
    for i, (name, make, make_ex, make_x) in enumerate(cases):
        torch.manual_seed(seed + i)
        m = make()
        _randomise_bn(m, torch.Generator().manual_seed(seed + i))
        m.eval()
        doc = build_spec(m, make_ex())
        xs = make_x()
        with torch.no_grad():
            ys = m(*xs)
        ys = ys if isinstance(ys, tuple) else (ys,)
        tensors = OrderedDict(("w." + k, v) for k, v in m.state_dict().items())
        for k, x in enumerate(xs):
            tensors[f"x{k}"] = x
        for k, y in enumerate(ys):
            tensors[f"y{k}"] = y.contiguous()
        g = torch.Generator().manual_seed(seed + 200 + i)
        for j, (batch, free) in enumerate(EXTRA_SETS, 1):
            xj = tuple(_resample(x, d["shape"], batch, free, g)
                       for x, d in zip(xs, doc["inputs"]))
            with torch.no_grad():
                yj = m(*xj)
            yj = yj if isinstance(yj, tuple) else (yj,)
            for k, x in enumerate(xj):
                tensors[f"s{j}.x{k}"] = x
            for k, y in enumerate(yj):
                tensors[f"s{j}.y{k}"] = y.contiguous()
        save_safetensors(tensors, os.path.join(out_dir, f"graph_{name}.safetensors"))
        with open(os.path.join(out_dir, f"graph_{name}.json"), "w") as f:
            json.dump(doc, f, indent=1)
