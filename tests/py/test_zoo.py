"""The torchvision zoo (issue #18): every classifier of
`torchvision.models.list_models(module=torchvision.models)` (80 names in
torchvision 0.14) and the segmentation nets fcn_resnet50,
deeplabv3_mobilenet_v3_large and lraspp_mobilenet_v3_large, built as a
PyTorch user builds them (`torchvision.models.<name>(weights=None)`, eval
mode), exported with tools/grove_export.py, run with `grove predict --local`
and compared with torch within rtol 1e-3 / atol 1e-4.

How each is built:
- weights=None (torchvision's random init), then every BatchNorm's running
  statistics, every norm's affine parameters and ConvNeXt's layer scales
  drawn at random, so that nothing rests on the defaults (mean 0, var 1,
  weight 1, bias 0, layer scale 1e-6);
- inputs 2x3x64x64 (inception_v3 2x3x75x75, its smallest; the ViTs and
  MaxViT are built for their test image size, which their constructors
  take: vit_*_14 at 56);
- the giants run as the same torchvision builder (same classes, same widths)
  with fewer blocks: the family helper torchvision's builder calls
  (torchvision.models.resnet._resnet, ..._efficientnet_conf, ...) is given
  at most SHRINK[family] blocks per stage (GIANTS lists which names, and
  the report says "(fewer blocks)"); VGG and AlexNet keep their features but
  get a classifier of the same layers with 64 hidden features instead of
  4096 (102M of vgg16's 138M parameters are that classifier's first Linear).
  The operations are those of the full-size model.  fcn_resnet50 runs on
  its dilated resnet50 with 2 blocks per stage too: at full depth its
  random-init outputs reach |y| ~ 150, and float32 rounding (4.5e-4 at most,
  3e-6 of the scale; Grove's interpolate matches torch's to 1e-4 at |y| ~ 300
  alone) exceeds atol 1e-4 where the bilinear upsampling cancels neighbours.
- every model is exported with max_batch_size 2: grove's open-time trial
  forward runs at the largest batch, which at the default 64 would cost
  more than the comparison.

The models Grove does not run yet are in EXPECTED_REFUSALS, each with (a
part of) the refusal it gives: the test fails when one of them is refused
for another reason, or passes (then it must leave the list), and when any
other model fails.  The list shrinks as the operations land (#18); the test
prints the whole report.  Each model is exported once per run.

Run by tests/run_py_tests.py under a python3 with torch, numpy and
torchvision (scripts/deps.sh --test installs python3-torchvision).
"""
import contextlib
import os
import sys
import tempfile
import time
import unittest

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

RTOL, ATOL = 1e-3, 1e-4
SEGMENTATION = ("fcn_resnet50", "deeplabv3_mobilenet_v3_large", "lraspp_mobilenet_v3_large")

# Names built with fewer blocks than torchvision's full size (see the top).
GIANTS = {
    "resnet101", "resnet152", "resnext101_32x8d", "resnext101_64x4d", "wide_resnet50_2",
    "wide_resnet101_2", "densenet161", "densenet169", "densenet201",
    "efficientnet_b1", "efficientnet_b2", "efficientnet_b3", "efficientnet_b4", "efficientnet_b5",
    "efficientnet_b6", "efficientnet_b7", "efficientnet_v2_s", "efficientnet_v2_m",
    "efficientnet_v2_l", "regnet_x_3_2gf", "regnet_x_8gf", "regnet_x_16gf", "regnet_x_32gf",
    "regnet_y_3_2gf", "regnet_y_8gf", "regnet_y_16gf", "regnet_y_32gf", "regnet_y_128gf",
    "convnext_small", "convnext_base", "convnext_large", "swin_t", "swin_s", "swin_b",
    "swin_v2_t", "swin_v2_s", "swin_v2_b", "maxvit_t", "vit_b_16", "vit_b_32", "vit_l_16",
    "vit_l_32", "vit_h_14", "fcn_resnet50",
}
# Names whose classifier's hidden Linear layers are 64 wide instead of 4096.
SMALL_CLASSIFIER = {"alexnet", "vgg11", "vgg11_bn", "vgg13", "vgg13_bn", "vgg16", "vgg16_bn",
                    "vgg19", "vgg19_bn"}

# What Grove refuses today, and the refusal each gives (a part of the
# exporter's message): nothing.  DenseNet's _DenseLayer (called with the list
# of the block's features), MaxViT's WindowPartition (called with an int) and
# LRASPP's head (called with the backbone's dict) are traced through into
# their callers' graphs (docs/exporter.md); Swin's shifted windows run as op
# entries (core/nn/ops_window.c).  A model that starts being refused fails.
EXPECTED_REFUSALS = {
}


def _image(name):
    if name == "inception_v3":
        return 75
    if name == "vit_h_14":
        return 56
    return 64


@contextlib.contextmanager
def _shrunk(module, helper, shrink):
    """module.helper (the family function torchvision's builders call)
    with its arguments passed through shrink(args, kwargs) -> (args, kwargs),
    for the duration of one build."""
    orig = getattr(module, helper)

    def wrapper(*args, **kwargs):
        args, kwargs = shrink(list(args), dict(kwargs))
        return orig(*args, **kwargs)

    setattr(module, helper, wrapper)
    try:
        yield
    finally:
        setattr(module, helper, orig)


def _cap(seq, n):
    return [min(int(v), n) for v in seq]


def _arg(a, k, i, key, fn):
    """Applies fn to the helper's argument key, passed at position i or by
    name (torchvision's builders do both)."""
    if key in k:
        k[key] = fn(k[key])
    else:
        a[i] = fn(a[i])


def _shrinker(name):
    """(module, helper, shrink) making a giant of this name smaller, or None."""
    import torchvision.models as M
    if name not in GIANTS:
        return None
    if name.startswith(("resnet", "resnext", "wide_resnet", "fcn_resnet")):
        def f(a, k):
            _arg(a, k, 1, "layers", lambda v: _cap(v, 2))
            return a, k
        return M.resnet, "_resnet", f
    if name.startswith("densenet"):
        def f(a, k):
            _arg(a, k, 1, "block_config", lambda v: tuple(_cap(v, 2)))
            return a, k
        return M.densenet, "_densenet", f
    if name.startswith(("efficientnet", "regnet")):
        return None  # build() swaps the config helper itself
    if name.startswith("convnext"):
        def f(a, k):
            _arg(a, k, 0, "block_setting", lambda v: [setattr(c, "num_layers", 1) or c for c in v])
            return a, k
        return M.convnext, "_convnext", f
    if name.startswith("swin"):
        def f(a, k):
            _arg(a, k, 2, "depths", lambda v: _cap(v, 2))
            return a, k
        return M.swin_transformer, "_swin_transformer", f
    if name == "maxvit_t":
        def f(a, k):
            k.setdefault("input_size", (64, 64))
            _arg(a, k, 2, "block_layers", lambda v: _cap(v, 1))
            # 64x64 -> 32 (stem), 16, 8, 4, 2: windows and grids of 2
            _arg(a, k, 4, "partition_size", lambda v: 2)
            return a, k
        return M.maxvit, "_maxvit", f
    if name.startswith("vit"):
        def f(a, k):
            k.setdefault("image_size", _image(name))
            _arg(a, k, 1, "num_layers",
                 lambda v: 1 if name.startswith(("vit_l", "vit_h")) else 2)
            return a, k
        return M.vision_transformer, "_vision_transformer", f
    if name == "inception_v3":
        return None  # full size, at its 75x75 minimum
    raise AssertionError(f"no shrinker for {name}")


def build(name):
    """The eval-mode torch module for a zoo name, with random statistics."""
    import torch
    import torch.nn as nn
    import torchvision.models as M
    torch.manual_seed(sum(map(ord, name)))
    ctx = contextlib.nullcontext()
    if name in GIANTS and name.startswith("efficientnet"):
        orig = M.efficientnet._efficientnet_conf

        def conf(arch, **kwargs):
            setting, last = orig(arch, **kwargs)
            for c in setting:  # two, so that the residual (stochastic depth) path runs
                c.num_layers = min(c.num_layers, 2)
            return setting, last
        ctx = _swap(M.efficientnet, "_efficientnet_conf", conf)
    elif name in GIANTS and name.startswith("regnet"):
        orig_fn = M.regnet.BlockParams.from_init_params.__func__

        def from_init(cls, depth, *a, **k):
            return orig_fn(cls, min(depth, 4), *a, **k)
        ctx = _swap(M.regnet.BlockParams, "from_init_params", classmethod(from_init))
    else:
        s = _shrinker(name)
        if s is not None:
            ctx = _shrunk(*s)
    with ctx:
        if name in SEGMENTATION:
            m = getattr(M.segmentation, name)(weights=None, weights_backbone=None)
        else:
            m = getattr(M, name)(weights=None)
    if name in SMALL_CLASSIFIER:
        old = m.classifier
        lin = [c for c in old if isinstance(c, nn.Linear)]
        m.classifier = nn.Sequential(*[
            nn.Linear(lin[0].in_features, 64) if c is lin[0] else
            nn.Linear(64, 64) if c is lin[1] else
            nn.Linear(64, lin[2].out_features) if c is lin[2] else c for c in old])
    with torch.no_grad():
        if name == "inception_v3":
            # torchvision initialises Inception's convolutions from N(0, 0.1)
            # whatever their fan-in, which grows the activations to ~1e9 over
            # its depth (float32 rounding there is ~1e4, far above atol):
            # torch's own default initialisation keeps them near 1.
            for mod in m.modules():
                if isinstance(mod, (nn.Conv2d, nn.Linear)):
                    mod.reset_parameters()
        for mod in m.modules():
            if isinstance(mod, nn.modules.batchnorm._BatchNorm) and mod.running_mean is not None:
                mod.running_mean.normal_(0, 0.1)
                mod.running_var.uniform_(0.5, 1.5)
            if isinstance(mod, (nn.modules.batchnorm._BatchNorm, nn.LayerNorm, nn.GroupNorm,
                                nn.modules.instancenorm._InstanceNorm)) and \
                    getattr(mod, "weight", None) is not None:
                mod.weight.uniform_(0.5, 1.5)
                if mod.bias is not None:
                    mod.bias.normal_(0, 0.1)
            ls = getattr(mod, "layer_scale", None)
            if isinstance(ls, nn.Parameter):
                ls.uniform_(0.1, 0.5)
    return m.eval()


@contextlib.contextmanager
def _swap(owner, attr, value):
    orig = owner.__dict__[attr]
    setattr(owner, attr, value)
    try:
        yield
    finally:
        setattr(owner, attr, orig)


def names():
    import torchvision.models as M
    return list(M.list_models(module=M)) + list(SEGMENTATION)


def _outputs(y):
    """torch's outputs as a list, in model.json's order (a dict's by key)."""
    if isinstance(y, dict):
        return [y[k] for k in y]
    return list(y) if isinstance(y, (tuple, list)) else [y]


def run_one(name, tmp):
    """('pass', detail) or ('refused', message) or ('wrong', detail)."""
    import torch
    from grove_export import ExportError, export
    from test_graph_export import predict
    m = build(name)
    size = _image(name)
    rng = np.random.default_rng(sum(map(ord, name)))
    x = rng.standard_normal((2, 3, size, size)).astype(np.float32)
    d = os.path.join(tmp, name)
    try:
        # max_batch_size 2: the batch this test sends (the open's trial
        # forwards run at batch 1 and 2 for it).
        export(m, d, example_input=torch.zeros(1, 3, size, size), batching={"max_batch_size": 2})
    except ExportError as e:
        return "refused", str(e)
    with torch.no_grad():
        want = [w.numpy() for w in _outputs(m(torch.from_numpy(x)))]
    code, err, got = predict(d, tmp, [x])
    if code != 0:
        return "refused", "grove: " + err.strip().splitlines()[-1] if err.strip() else "grove"
    if len(got) != len(want):
        return "wrong", f"{len(got)} outputs, torch gives {len(want)}"
    worst = 0.0
    for g, w in zip(got, want):
        if g.shape != w.shape:
            return "wrong", f"shape {g.shape}, torch {w.shape}"
        if not np.allclose(g, w, rtol=RTOL, atol=ATOL):
            return "wrong", f"max |diff| {float(np.max(np.abs(g - w))):.3g} " \
                            f"(|torch| up to {float(np.max(np.abs(w))):.3g})"
        worst = max(worst, float(np.max(np.abs(g - w))))
    return "pass", f"max |diff| {worst:.2g}"


def test_zoo():
    try:
        import torchvision  # noqa: F401
    except ImportError:
        raise unittest.SkipTest("no torchvision (scripts/deps.sh --test installs "
                                "python3-torchvision)")
    import torch
    torch.set_num_threads(1)
    only = os.environ.get("GROVE_ZOO_ONLY")
    todo = [n for n in names() if not only or n in only.split(",")]
    assert only or len(todo) == 83, len(todo)
    unknown = set(EXPECTED_REFUSALS) - set(names())
    assert not unknown, f"EXPECTED_REFUSALS names no zoo model: {sorted(unknown)}"
    report, problems = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for name in todo:
            t0 = time.monotonic()
            verdict, detail = run_one(name, tmp)
            dt = time.monotonic() - t0
            how = " (fewer blocks)" if name in GIANTS else \
                " (small classifier)" if name in SMALL_CLASSIFIER else ""
            report.append(f"  {name}{how}: {verdict}: {detail.splitlines()[0][:300]} [{dt:.1f}s]")
            expected = EXPECTED_REFUSALS.get(name)
            if expected is None and verdict != "pass":
                problems.append(f"{name}: {verdict}: {detail}")
            elif expected is not None and verdict == "pass":
                problems.append(f"{name} passes now: remove it from EXPECTED_REFUSALS")
            elif expected is not None and (verdict != "refused" or expected not in detail):
                problems.append(f"{name}: expected a refusal with {expected!r}, got {verdict}: "
                                f"{detail}")
            with contextlib.suppress(FileNotFoundError):
                import shutil
                shutil.rmtree(os.path.join(tmp, name))
    passed = sum(1 for r in report if ": pass: " in r)
    print(f"zoo: {passed} of {len(todo)} pass, {len(todo) - passed} refused")
    print("\n".join(report))
    assert not problems, "\n".join(problems)
