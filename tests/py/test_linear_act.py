"""A Linear's fused activation against torch (docs/performance-models.md, "ConvNeXt-T and
ViT-B/16"): a Sequential's Linear followed by ReLU, ReLU6, Hardswish, Hardsigmoid, SiLU,
Sigmoid or the exact GELU (ViT's and ConvNeXt's MLP) runs the activation in the product's
epilogue, on each register tile right after its last K block is written (core/kernels/gemm.c);
a TransformerEncoderLayer with activation="gelu" does the same in its feed-forward block.  The
shapes make every part of that epilogue count: K = 1,100 is two K blocks (an activation applied
after the first would be applied to a partial sum), N = 200 ends in a panel of 8 live columns
(a masked tile), and 3 x 7 rows end in a tile of 3.  Inputs are large enough that the clamps
and GELU's negative tail matter.  The tanh GELU is not fused and must still match.  Each model
runs on 1 and 2 compute threads (the same bits: the activation is per element, whatever the
threads' cut), compared with torch within rtol 1e-4 / atol 1e-5.
"""
import os
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

RTOL, ATOL = 1e-4, 1e-5


def _acts():
    import torch.nn as nn
    return [("ReLU", nn.ReLU()), ("ReLU6", nn.ReLU6()), ("Hardswish", nn.Hardswish()),
            ("Hardsigmoid", nn.Hardsigmoid()), ("SiLU", nn.SiLU()), ("Sigmoid", nn.Sigmoid()),
            ("GELU", nn.GELU()), ("GELU_tanh", nn.GELU(approximate="tanh"))]


def _mlp(act):
    """ViT's MLPBlock layout: Linear, activation, Dropout, Linear; the
    second Linear reads the first's activated output."""
    import torch.nn as nn
    return nn.Sequential(nn.Linear(1100, 200), act, nn.Dropout(0.1), nn.Linear(200, 72), act)


def _run(m, d, tmp, x):
    """grove predict on 1 and 2 threads: both outputs, which must be identical."""
    from test_graph_export import predict
    outs = []
    for threads in (1, 2):
        code, err, got = predict(d, tmp, [x], threads=threads)
        assert code == 0, err
        outs.append(got[0])
    assert np.array_equal(outs[0], outs[1]), "1 and 2 threads differ"
    return outs[0]


def test_linear_act_parity():
    import torch
    from grove_export import export
    torch.manual_seed(18)
    failures = []
    rng = np.random.default_rng(5)
    with tempfile.TemporaryDirectory() as tmp:
        for name, act in _acts():
            m = _mlp(act).eval()
            with torch.no_grad():  # first-layer outputs well beyond the clamps
                m[0].weight.mul_(8.0)
            d = os.path.join(tmp, name)
            export(m, d, example_input=torch.zeros(3, 7, 1100), batching={"max_batch_size": 3})
            x = rng.standard_normal((3, 7, 1100)).astype(np.float32)
            with torch.no_grad():
                h = m[0](torch.from_numpy(x))
                want = m(torch.from_numpy(x)).numpy()
            assert float(h.max()) > 6.0 and float(h.min()) < -3.0, (name, float(h.min()))
            got = _run(m, d, tmp, x)
            assert got.shape == want.shape, (name, got.shape, want.shape)
            if not np.allclose(got, want, rtol=RTOL, atol=ATOL):
                failures.append(f"{name}: max |diff| {float(np.max(np.abs(got - want))):.3g}")
    assert not failures, "\n".join(failures)


def test_encoder_layer_gelu_parity():
    """nn.TransformerEncoderLayer(activation="gelu"): linear1 with GELU in
    its epilogue (layers_transformer.c), batch 2 of 13 tokens."""
    import torch
    from grove_export import export
    torch.manual_seed(19)
    m = torch.nn.TransformerEncoderLayer(96, 4, dim_feedforward=1100, activation="gelu",
                                         batch_first=True).eval()
    with torch.no_grad():
        m.linear1.weight.mul_(4.0)
    x = np.random.default_rng(6).standard_normal((2, 13, 96)).astype(np.float32)
    with tempfile.TemporaryDirectory() as tmp:
        d = os.path.join(tmp, "tel")
        export(m, d, example_input=torch.zeros(2, 13, 96), batching={"max_batch_size": 2})
        got = _run(m, d, tmp, x)
    with torch.no_grad():
        want = m(torch.from_numpy(x)).numpy()
    assert np.allclose(got, want, rtol=RTOL, atol=ATOL), float(np.max(np.abs(got - want)))
