"""A convolution's fused epilogue against torch (docs/performance-models.md, "The
torchvision zoo"): Grove runs Conv2d [+ BatchNorm2d] + an activation (ReLU,
ReLU6, Hardswish, Hardsigmoid, SiLU, Sigmoid) as one pass when a Sequential
or a graph holds them in a row, and squeeze-excitation's `scale * input`
keeps the channels-last layout.  These models put every fusable activation
after each kind of convolution Grove lowers differently (patch rows, the
direct 1x1 product, Winograd, depthwise 3x3 and 5x5, grouped columns), as a
Sequential (MobileNet's Conv2dNormActivation) and as the nodes of a graph
(an MBConv-like block with squeeze-excitation and a residual add), at batch 1
and 3 and odd image sizes, a BatchNorm2d + activation with no convolution
before it (a pre-activation block, NCHW and channels-last inputs), with
BatchNorm statistics that are not the
defaults and inputs large enough that ReLU6's and Hardswish's upper clamps
and SiLU's negative side matter.  Exported with tools/grove_export.py, run
with `grove predict --local`, compared within rtol 1e-4 / atol 1e-5.
"""
import os
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

RTOL, ATOL = 1e-4, 1e-5
ACTS = ("ReLU", "ReLU6", "Hardswish", "Hardsigmoid", "SiLU", "Sigmoid")


def _randomize(m, seed):
    import torch
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for mod in m.modules():
            if isinstance(mod, torch.nn.BatchNorm2d):
                n = mod.num_features
                mod.running_mean.copy_(torch.randn(n, generator=g) * 0.5)
                mod.running_var.copy_(torch.rand(n, generator=g) + 0.2)
                mod.weight.copy_(torch.rand(n, generator=g) * 2 + 0.5)
                mod.bias.copy_(torch.randn(n, generator=g))
    return m.eval()


def _seq(act):
    """Conv2dNormActivation's layout: every kind of convolution, each
    followed by a BatchNorm2d and the activation; the last one ends the
    model (its output is the caller's, NCHW)."""
    import torch.nn as nn
    A = getattr(nn, act)

    def cba(cin, cout, k, s=1, g=1, bn=True, bias=False):
        layers = [nn.Conv2d(cin, cout, k, s, k // 2, groups=g, bias=bias)]
        if bn:
            layers.append(nn.BatchNorm2d(cout))
        return layers + [A()]
    return nn.Sequential(
        *cba(8, 32, 3, 2),            # patch rows
        *cba(32, 32, 3, g=32),        # depthwise 3x3
        *cba(32, 48, 1, bn=False, bias=True),  # direct 1x1, the product writes the output
        *cba(48, 48, 5, 2, g=48),     # depthwise 5x5, stride 2
        *cba(48, 24, 3),              # Winograd
        *cba(24, 24, 3, g=4),         # grouped: columns
        *cba(24, 16, 1))              # direct 1x1 with a BatchNorm, last


def _mbconv(act):
    """A graph: expand, depthwise, squeeze-excitation (the scale's
    activation is Sigmoid or, for Hardswish blocks, Hardsigmoid, as in
    MobileNetV3), project, residual add."""
    import torch
    import torch.nn as nn
    A = getattr(nn, act)

    class SE(nn.Module):
        def __init__(self, c, r):
            super().__init__()
            self.avgpool = nn.AdaptiveAvgPool2d(1)
            self.fc1 = nn.Conv2d(c, r, 1)
            self.act = A()
            self.fc2 = nn.Conv2d(r, c, 1)
            self.scale = nn.Hardsigmoid() if act == "Hardswish" else nn.Sigmoid()

        def forward(self, x):
            s = self.scale(self.fc2(self.act(self.fc1(self.avgpool(x)))))
            return s * x

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Conv2d(8, 16, 3, 1, 1, bias=False)
            self.stem_bn = nn.BatchNorm2d(16)
            self.stem_act = A()
            self.expand = nn.Conv2d(16, 64, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(64)
            self.act1 = A()
            self.dw = nn.Conv2d(64, 64, 3, 1, 1, groups=64, bias=False)
            self.bn2 = nn.BatchNorm2d(64)
            self.act2 = A()
            self.se = SE(64, 8)
            self.project = nn.Conv2d(64, 16, 1, bias=False)
            self.bn3 = nn.BatchNorm2d(16)
            self.head = nn.Conv2d(16, 10, 1)
            self.head_act = A()

        def forward(self, x):
            x = self.stem_act(self.stem_bn(self.stem(x)))
            y = self.act1(self.bn1(self.expand(x)))
            y = self.act2(self.bn2(self.dw(y)))
            y = self.bn3(self.project(self.se(y)))
            x = x + y
            return torch.flatten(self.head_act(self.head(x)), 1)
    return Block()


def _preact(act):
    """BatchNorm2d + the activation where no convolution comes before them
    (a pre-activation block, DenseNet's norm1 + relu1): the graph runs them
    as one pass, on the model's NCHW input and on a convolution's
    channels-last result."""
    import torch.nn as nn
    A = getattr(nn, act)

    class Preact(nn.Module):
        def __init__(self):
            super().__init__()
            self.bn0 = nn.BatchNorm2d(8)
            self.act0 = A()
            self.conv = nn.Conv2d(8, 13, 3, 1, 1)
            self.bn1 = nn.BatchNorm2d(13)
            self.act1 = A()
            self.head = nn.Conv2d(13, 5, 1)

        def forward(self, x):
            y = self.conv(self.act0(self.bn0(x)))
            return self.head(self.act1(self.bn1(y * 2)))
    return Preact()


def test_conv_act_parity():
    import torch
    from grove_export import export
    from test_graph_export import predict
    torch.manual_seed(18)
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        for kind, build in (("Sequential", _seq), ("graph", _mbconv), ("preact", _preact)):
            for k, act in enumerate(ACTS):
                m = _randomize(build(act), 100 + k)
                for n, (h, w) in ((1, (17, 13)), (3, (9, 23))):
                    # The image size is fixed by the export's example input.
                    d = os.path.join(tmp, f"{kind}_{act}_{h}x{w}")
                    export(m, d, example_input=torch.zeros(1, 8, h, w),
                           batching={"max_batch_size": 3})
                    x = (np.random.default_rng(k + n).standard_normal((n, 8, h, w)) * 3
                         ).astype(np.float32)
                    with torch.no_grad():
                        want = m(torch.from_numpy(x)).numpy()
                    code, err, got = predict(d, tmp, [x])
                    assert code == 0, (kind, act, err)
                    g = got[0]
                    assert g.shape == want.shape, (kind, act, g.shape, want.shape)
                    if not np.allclose(g, want, rtol=RTOL, atol=ATOL):
                        failures.append(f"{kind} {act} batch {n} {h}x{w}: max |diff| "
                                        f"{float(np.max(np.abs(g - want))):.3g} (|torch| up to "
                                        f"{float(np.max(np.abs(want))):.3g})")
                # The activations' inputs reached their clamps (ReLU6 above 6,
                # the hard ones above 3 and below -3).
                seen = []
                hooks = [a.register_forward_hook(lambda mod, i, o: seen.append(i[0]))
                         for a in m.modules() if type(a).__name__ == act]
                with torch.no_grad():
                    m(torch.from_numpy(x))
                for h_ in hooks:
                    h_.remove()
                hi = max(float(t.max()) for t in seen)
                lo = min(float(t.min()) for t in seen)
                assert hi > 6.0 and lo < -3.0, (kind, act, lo, hi)
    assert not failures, "\n".join(failures)


def _se_seq(act, bare):
    """torchvision's MBConv block layout (EfficientNet, MobileNetV3): a
    Sequential of expand, depthwise, SqueezeExcitation (a graph ending in
    `scale * input`) and the 1x1 projection, which Grove hands the scale to
    instead of running the multiply (grove_fwd.se): as Conv2dNormActivation
    (a Sequential, Conv2d + BatchNorm2d) or, bare, a Conv2d with a bias."""
    import torch.nn as nn
    from torchvision.ops.misc import Conv2dNormActivation as CNA, SqueezeExcitation
    A = getattr(nn, act)
    scale_act = nn.Hardsigmoid if act == "Hardswish" else nn.Sigmoid
    project = nn.Conv2d(64, 24, 1) if bare else CNA(64, 24, 1, activation_layer=None)
    return nn.Sequential(
        CNA(8, 16, 3, activation_layer=A),
        CNA(16, 64, 1, activation_layer=A),
        CNA(64, 64, 3, groups=64, activation_layer=A),
        SqueezeExcitation(64, 8, activation=A, scale_activation=scale_act),
        project,
        CNA(24, 10, 1, activation_layer=A))


def test_se_scale_in_conv_parity():
    """Squeeze-excitation's scale applied by the next 1x1 convolution as it
    reads its rows equals torch's `scale * input` then the convolution: each
    image's own scale (batches 2 and 3, images of different content), both
    kinds of projection, on one and two compute threads, in fused chunks and
    stage by stage."""
    import torch
    from grove_export import export
    from test_graph_export import predict
    torch.manual_seed(18)
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        for k, (act, bare) in enumerate((("SiLU", False), ("Hardswish", False), ("ReLU", True))):
            m = _randomize(_se_seq(act, bare), 300 + k)
            # 2 x 7 x 5: too few rows for fused chunks on two threads (the
            # stages one after another).
            for n, (h, w) in ((1, (15, 13)), (3, (9, 23)), (2, (7, 5))):
                d = os.path.join(tmp, f"se_{act}_{bare}_{h}x{w}")
                export(m, d, example_input=torch.zeros(1, 8, h, w),
                       batching={"max_batch_size": 3})
                x = (np.random.default_rng(40 + k + n).standard_normal((n, 8, h, w)) * 3
                     ).astype(np.float32)
                x *= np.arange(1, n + 1, dtype=np.float32).reshape(n, 1, 1, 1)
                with torch.no_grad():
                    want = m(torch.from_numpy(x)).numpy()
                outs = []
                for threads in (1, 2):
                    code, err, got = predict(d, tmp, [x], threads=threads)
                    assert code == 0, (act, bare, err)
                    g = got[0]
                    outs.append(g)
                    assert g.shape == want.shape, (act, g.shape, want.shape)
                    if not np.allclose(g, want, rtol=RTOL, atol=ATOL):
                        failures.append(f"{act} bare={bare} batch {n} {h}x{w} threads {threads}: "
                                        f"max |diff| {float(np.max(np.abs(g - want))):.3g}")
                # Grove's own threads never change the bits (docs/performance.md).
                assert np.array_equal(outs[0], outs[1]), (act, bare, n, h, w)
    assert not failures, "\n".join(failures)


def _res_blocks():
    """Residual blocks whose add (and ReLU) the last convolution applies in
    its output stage (grove_fwd.res): torchvision's BasicBlock (a 3x3 conv:
    Winograd) and Bottleneck (a 1x1 conv: the direct product), with and
    without a downsample; an add whose identity is the model's NCHW input
    and one whose conv output leaves the model (NCHW) take the plain add;
    a strided 3x3 (patch rows) and a conv without BatchNorm fuse too."""
    import torch
    import torch.nn as nn
    from torchvision.models.resnet import BasicBlock, Bottleneck

    def down(cin, cout, s):
        return nn.Sequential(nn.Conv2d(cin, cout, 1, s, bias=False), nn.BatchNorm2d(cout))

    class Mixed(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Conv2d(16, 16, 3, 1, 1)
            self.rows = nn.Conv2d(16, 16, 5, 1, 2)      # patch rows, no BatchNorm
            self.act = nn.ReLU()
            self.last = nn.Conv2d(16, 16, 1, bias=False)
            self.bn = nn.BatchNorm2d(16)

        def forward(self, x):
            y = self.act(self.rows(self.stem(x)) + x)   # identity: the NCHW input
            z = self.act(self.rows(y) + y)              # fused, no BatchNorm
            return self.bn(self.last(z)) + z            # the model's NCHW output

    return (
        ("basic", nn.Sequential(nn.Conv2d(16, 64, 3, 1, 1), BasicBlock(64, 64),
                                BasicBlock(64, 128, 2, down(64, 128, 2)))),
        ("bottleneck", nn.Sequential(nn.Conv2d(16, 256, 1), Bottleneck(256, 64),
                                     Bottleneck(256, 128, 2, down(256, 512, 2)),
                                     Bottleneck(512, 128), nn.Flatten(1))),
        ("mixed", Mixed()),
    )


def test_conv_residual_parity():
    import torch
    from grove_export import export
    from test_graph_export import predict
    torch.manual_seed(19)
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        for k, (kind, m) in enumerate(_res_blocks()):
            m = _randomize(m, 300 + k)
            for n, (h, w) in ((1, (14, 14)), (3, (9, 11))):
                d = os.path.join(tmp, f"{kind}_{h}x{w}")
                export(m, d, example_input=torch.zeros(1, 16, h, w),
                       batching={"max_batch_size": 3})
                x = (np.random.default_rng(k + n).standard_normal((n, 16, h, w))
                     ).astype(np.float32)
                with torch.no_grad():
                    want = m(torch.from_numpy(x)).numpy()
                code, err, got = predict(d, tmp, [x])
                assert code == 0, (kind, err)
                g = got[0]
                assert g.shape == want.shape, (kind, g.shape, want.shape)
                if not np.allclose(g, want, rtol=RTOL, atol=ATOL):
                    failures.append(f"{kind} batch {n} {h}x{w}: max |diff| "
                                    f"{float(np.max(np.abs(g - want))):.3g}")
    assert not failures, "\n".join(failures)
