"""Convolutions writing into their slice of a torch.cat (core/graph/graph_compile.c
plan_cat_slices, docs/performance-models.md "Concatenations in place") against torch.

A cat along dim 1 whose parts are all convolutions that nothing else reads has
each convolution write its channels of the cat's channels-last buffer.  These
models give the planner every case it must get right or leave alone: parts of
odd channel counts from each kind of convolution Grove lowers differently
(direct 1x1, patch rows, Winograd, grouped columns), with a fused ReLU, a
folded BatchNorm, a BatchNorm and an activation, or nothing after them; parts
listed in another order than they run; a Fire-like block inside a Sequential
(its cat stays channels last for the next convolution) and as the model's
output (made contiguous for the caller); and the cats the planner must not
touch: along dims 2 and 3, with a part that another node also reads, with a
part that is not a convolution, with a part that is a cat itself; and
torchvision's DenseNet blocks, whose growing list of features is one buffer
that each layer's convolution writes its slice of.  Batch 1 and 3, odd image sizes.  Exported with
tools/grove_export.py, run with `grove predict --local`, compared within
rtol 1e-4 / atol 1e-5.
"""
import os
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

RTOL, ATOL = 1e-4, 1e-5

from test_conv_act import _randomize  # noqa: E402 (BatchNorm statistics not the defaults)


def _models():
    import torch
    import torch.nn as nn

    class Parts(nn.Module):
        """Every kind of part, listed out of the order they run."""

        def __init__(self):
            super().__init__()
            self.direct = nn.Conv2d(6, 5, 1)                      # direct 1x1, bias
            self.rows = nn.Conv2d(6, 7, 3, 2, 1, bias=False)      # patch rows, stride 2
            self.rows_bn = nn.BatchNorm2d(7)                      # folded, no activation
            self.wino = nn.Conv2d(6, 3, 3, 1, 1)                  # Winograd (large image)
            self.wino_act = nn.ReLU()
            self.grouped = nn.Conv2d(6, 9, 3, 1, 1, groups=3, bias=False)
            self.grouped_bn = nn.BatchNorm2d(9)
            self.grouped_act = nn.Hardswish()
            self.pool = nn.MaxPool2d(2, 2, ceil_mode=True)

        def forward(self, x):
            a = self.direct(x)
            b = self.wino_act(self.wino(x))
            c = self.grouped_act(self.grouped_bn(self.grouped(x)))
            y = torch.cat([c, a, b], 1)                            # 17 channels, full size
            d = self.rows_bn(self.rows(x))
            z = torch.cat((self.pool(y), d), dim=1)                # a pooled part: not planned
            return y.mean((2, 3)), z

    class Fire(nn.Module):
        def __init__(self, cin, s, e1, e3):
            super().__init__()
            self.squeeze = nn.Conv2d(cin, s, 1)
            self.squeeze_activation = nn.ReLU(inplace=True)
            self.expand1x1 = nn.Conv2d(s, e1, 1)
            self.expand1x1_activation = nn.ReLU(inplace=True)
            self.expand3x3 = nn.Conv2d(s, e3, 3, padding=1)
            self.expand3x3_activation = nn.ReLU(inplace=True)

        def forward(self, x):
            x = self.squeeze_activation(self.squeeze(x))
            return torch.cat([self.expand1x1_activation(self.expand1x1(x)),
                              self.expand3x3_activation(self.expand3x3(x))], 1)

    class Fires(nn.Module):
        """SqueezeNet's layout: Fire blocks in a Sequential, the last one the
        model's output."""

        def __init__(self):
            super().__init__()
            self.features = nn.Sequential(nn.Conv2d(6, 16, 3, 2), nn.ReLU(), Fire(16, 5, 11, 13),
                                          nn.MaxPool2d(3, 2, ceil_mode=True), Fire(24, 7, 9, 3))

        def forward(self, x):
            return self.features(x)

    class Untouched(nn.Module):
        """Cats the planner leaves alone."""

        def __init__(self):
            super().__init__()
            self.a = nn.Conv2d(6, 5, 1)
            self.b = nn.Conv2d(6, 5, 3, 1, 1)
            self.c = nn.Conv2d(6, 3, 1)
            self.d = nn.Conv2d(6, 3, 1, bias=False)
            self.e = nn.Conv2d(6, 4, 1)
            self.f = nn.Conv2d(11, 4, 1)

        def forward(self, x):
            a, b = self.a(x), self.b(x)
            h = torch.cat([a, b], 2)                   # along H
            w = torch.cat([b, a], dim=3)               # along W (b is read twice: not planned)
            c = self.c(x)
            shared = torch.cat([c, self.d(x)], 1)      # c is also read below
            mixed = torch.cat([self.e(x), x], 1)       # x is not a convolution's result
            grow = torch.cat([shared, self.f(torch.cat([shared, self.e(x) * 2, x[:, :1]], 1))], 1)
            return h, w, torch.cat([shared + c.sum(1, keepdim=True), mixed], 1), grow

    class Dense(nn.Module):
        """torchvision's own DenseNet block (torch.cat of a growing list: each
        layer's cat is a prefix of the next's) at odd widths, its input a
        pool's result (copied into the block's buffer once) and its output
        read by a transition."""

        def __init__(self):
            super().__init__()
            from torchvision.models.densenet import _DenseBlock, _Transition
            self.stem = nn.Conv2d(6, 5, 3, 1, 1)
            self.pool = nn.MaxPool2d(2, 2, ceil_mode=True)
            self.block = _DenseBlock(num_layers=4, num_input_features=5, bn_size=3,
                                     growth_rate=7, drop_rate=0)
            self.trans = _Transition(5 + 4 * 7, 11)
            self.block2 = _DenseBlock(num_layers=2, num_input_features=11, bn_size=2,
                                      growth_rate=3, drop_rate=0)

        def forward(self, x):
            y = self.block(self.pool(self.stem(x)))
            return y, self.block2(self.trans(y))

    return (("parts", Parts), ("fires", Fires), ("untouched", Untouched), ("dense", Dense))


def test_cat_slices_parity():
    import torch
    from grove_export import export
    from test_graph_export import predict
    torch.manual_seed(18)
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        for k, (name, build) in enumerate(_models()):
            m = _randomize(build(), 200 + k)
            for n, (h, w) in ((1, (19, 17)), (3, (21, 15))):
                d = os.path.join(tmp, f"{name}_{h}x{w}")
                export(m, d, example_input=torch.zeros(1, 6, h, w),
                       batching={"max_batch_size": 3})
                x = np.random.default_rng(k * 10 + n).standard_normal((n, 6, h, w)).astype(
                    np.float32)
                with torch.no_grad():
                    want = m(torch.from_numpy(x))
                want = [t.numpy() for t in (want if isinstance(want, tuple) else (want,))]
                code, err, got = predict(d, tmp, [x])
                assert code == 0, (name, err)
                assert len(got) == len(want), (name, len(got), len(want))
                for j, (g, wt) in enumerate(zip(got, want)):
                    assert g.shape == wt.shape, (name, j, g.shape, wt.shape)
                    if not np.allclose(g, wt, rtol=RTOL, atol=ATOL):
                        failures.append(f"{name} output {j} batch {n} {h}x{w}: max |diff| "
                                        f"{float(np.max(np.abs(g - wt))):.3g}")
    assert not failures, "\n".join(failures)
