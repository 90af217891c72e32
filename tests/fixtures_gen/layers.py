"""Layer parity fixtures: for each case, a torch.nn layer with seeded random
weights in eval mode, a seeded random input and torch's output, written as
layers_<case>.safetensors with keys

    w.<state_dict key>   the layer's state_dict, in torch's order
    x                    the input
    y                    torch's output

tests/check_layers.c builds the same layer with Grove's C constructor (its
table of cases mirrors CASES below), loads the w.* tensors with
load_state_dict(strict), runs forward on x and compares with y (rtol 1e-4,
atol 1e-5)."""
import os
from collections import OrderedDict

import torch
import torch.nn as nn

from grove_export import save_safetensors


def _randomise(m, seed):
    """Every parameter uniform in [-1, 1], running_var in [0.5, 2], running
    mean in [-1, 1], num_batches_tracked 7; Embedding keeps torch's own init
    (normal, padding row zero) so that the padding row stays zero."""
    g = torch.Generator().manual_seed(seed + 1000)
    for mod in m.modules():
        if isinstance(mod, nn.Embedding):
            continue
        for name, p in mod.named_parameters(recurse=False):
            with torch.no_grad():
                p.copy_(torch.rand(p.shape, generator=g) * 2 - 1)
        for name, b in mod.named_buffers(recurse=False):
            with torch.no_grad():
                if name == "running_var":
                    b.copy_(torch.rand(b.shape, generator=g) * 1.5 + 0.5)
                elif name == "running_mean":
                    b.copy_(torch.rand(b.shape, generator=g) * 2 - 1)
                elif name == "num_batches_tracked":
                    b.fill_(7)


def _x(shape, scale=1.0, offset=0.0):
    return torch.randn(shape) * scale + offset


def _cases():
    """(name, module factory, input factory).  Built lazily so each case sees
    the same seed whatever precedes it."""
    act_x = lambda: torch.cat([_x((4, 37), 3.0), torch.tensor([[-30.0, -20.0, -5.0, -1e-3, 0.0,
                                                                1e-3, 5.0, 20.0, 30.0] + [0.5] * 28])])
    idx = lambda shape, n: torch.randint(0, n, shape, dtype=torch.int64)
    return [
        # Linear: batch 1, odd sizes, no bias, 3-d and 1-d inputs, a size
        # with ragged kernel tiles.
        ("linear_b1", lambda: nn.Linear(64, 32), lambda: _x((1, 64))),
        ("linear_odd", lambda: nn.Linear(13, 7), lambda: _x((5, 13))),
        ("linear_nobias", lambda: nn.Linear(10, 3, bias=False), lambda: _x((4, 10))),
        ("linear_3d", lambda: nn.Linear(6, 5), lambda: _x((2, 3, 6))),
        ("linear_1d", lambda: nn.Linear(6, 5), lambda: _x((6,))),
        ("linear_big", lambda: nn.Linear(100, 67), lambda: _x((33, 100))),
        # Sequential MLP: Linear+ReLU pairs that Grove fuses.
        ("mlp", lambda: nn.Sequential(nn.Linear(20, 17), nn.ReLU(), nn.Linear(17, 9), nn.ReLU(),
                                      nn.Linear(9, 4)),
         lambda: _x((7, 20))),
        ("mlp_b1", lambda: nn.Sequential(nn.Linear(20, 17), nn.ReLU(), nn.Linear(17, 9), nn.ReLU(),
                                         nn.Linear(9, 4)),
         lambda: _x((1, 20))),
        ("mlp_mixed", lambda: nn.Sequential(OrderedDict([
            ("fc1", nn.Linear(8, 16)), ("act1", nn.GELU()), ("drop", nn.Dropout(0.2)),
            ("norm", nn.LayerNorm(16)), ("fc2", nn.Linear(16, 5)), ("act2", nn.ReLU()),
            ("out", nn.LogSoftmax(dim=-1))])),
         lambda: _x((6, 8))),
        ("identity", lambda: nn.Identity(), lambda: _x((3, 4))),
        ("flatten_default", lambda: nn.Flatten(), lambda: _x((2, 3, 4, 5))),
        ("flatten_0_2", lambda: nn.Flatten(0, 2), lambda: _x((2, 3, 4, 5))),
        ("flatten_neg", lambda: nn.Flatten(-3, -2), lambda: _x((2, 3, 4))),
        ("flatten_0d", lambda: nn.Flatten(0, -1), lambda: _x(())),
        ("dropout", lambda: nn.Dropout(0.3), lambda: _x((3, 5))),
        ("relu", lambda: nn.ReLU(), act_x),
        ("leaky_relu", lambda: nn.LeakyReLU(), act_x),
        ("leaky_relu_02", lambda: nn.LeakyReLU(0.2), act_x),
        ("gelu", lambda: nn.GELU(), act_x),
        ("gelu_tanh", lambda: nn.GELU(approximate="tanh"), act_x),
        ("silu", lambda: nn.SiLU(), act_x),
        ("sigmoid", lambda: nn.Sigmoid(), act_x),
        ("tanh", lambda: nn.Tanh(), act_x),
        ("relu_3d_b1", lambda: nn.ReLU(), lambda: _x((1, 3, 5))),
        # Softmax / LogSoftmax: last dim, inner lanes, negative dims, dim=None
        # on 1-, 2-, 3- and 4-d inputs, large logits.
        ("softmax_1", lambda: nn.Softmax(dim=1), lambda: _x((4, 10))),
        ("softmax_neg", lambda: nn.Softmax(dim=-1), lambda: _x((2, 3, 7))),
        ("softmax_0", lambda: nn.Softmax(dim=0), lambda: _x((5, 3))),
        ("softmax_mid", lambda: nn.Softmax(dim=1), lambda: _x((2, 5, 3))),
        ("softmax_neg2", lambda: nn.Softmax(dim=-2), lambda: _x((3, 4, 6))),
        ("softmax_none_1d", lambda: nn.Softmax(), lambda: _x((6,))),
        ("softmax_none_2d", lambda: nn.Softmax(), lambda: _x((3, 4))),
        ("softmax_none_3d", lambda: nn.Softmax(), lambda: _x((3, 4, 5))),
        ("softmax_none_4d", lambda: nn.Softmax(), lambda: _x((2, 3, 2, 2))),
        ("softmax_large", lambda: nn.Softmax(dim=1), lambda: _x((3, 9), 50.0)),
        ("softmax_b1", lambda: nn.Softmax(dim=-1), lambda: _x((1, 1))),
        ("log_softmax_1", lambda: nn.LogSoftmax(dim=1), lambda: _x((4, 10))),
        ("log_softmax_mid", lambda: nn.LogSoftmax(dim=1), lambda: _x((2, 5, 3))),
        ("log_softmax_none_3d", lambda: nn.LogSoftmax(), lambda: _x((3, 4, 5))),
        ("log_softmax_large", lambda: nn.LogSoftmax(dim=-1), lambda: _x((3, 9), 50.0)),
        ("log_softmax_offset", lambda: nn.LogSoftmax(dim=1), lambda: _x((3, 9), 5.0, 1000.0)),
        ("log_softmax_lanes_offset", lambda: nn.LogSoftmax(dim=0),
         lambda: _x((9, 4), 5.0, 1000.0)),
        ("softmax_wide", lambda: nn.Softmax(dim=-1), lambda: _x((2, 1000), 3.0)),
        # BatchNorm1d: (N, C) and (N, C, L), batch 1, no affine, batch
        # statistics (track_running_stats=False).
        ("bn_2d", lambda: nn.BatchNorm1d(6), lambda: _x((5, 6), 2.0, 0.5)),
        ("bn_3d", lambda: nn.BatchNorm1d(4), lambda: _x((3, 4, 7), 2.0, 0.5)),
        ("bn_b1", lambda: nn.BatchNorm1d(6), lambda: _x((1, 6))),
        ("bn_noaffine", lambda: nn.BatchNorm1d(5, affine=False), lambda: _x((4, 5))),
        ("bn_eps", lambda: nn.BatchNorm1d(3, eps=1e-2, momentum=None), lambda: _x((2, 3, 2))),
        ("bn_nostats_2d", lambda: nn.BatchNorm1d(6, track_running_stats=False),
         lambda: _x((5, 6), 2.0, 3.0)),
        ("bn_nostats_3d", lambda: nn.BatchNorm1d(4, track_running_stats=False),
         lambda: _x((3, 4, 7), 2.0, 3.0)),
        ("bn_nostats_noaffine", lambda: nn.BatchNorm1d(4, affine=False, track_running_stats=False),
         lambda: _x((1, 4, 5))),
        # LayerNorm: one and two normalised dims, no affine, eps, a large
        # mean (cancellation), batch 1 and a 1-d input.
        ("ln_1", lambda: nn.LayerNorm(8), lambda: _x((4, 8))),
        ("ln_2", lambda: nn.LayerNorm([3, 5]), lambda: _x((2, 3, 5))),
        ("ln_noaffine", lambda: nn.LayerNorm(7, elementwise_affine=False), lambda: _x((3, 7))),
        ("ln_eps", lambda: nn.LayerNorm(16, eps=1e-3), lambda: _x((1, 16))),
        ("ln_offset", lambda: nn.LayerNorm(32), lambda: _x((4, 32), 1.0, 100.0)),
        ("ln_1d", lambda: nn.LayerNorm(9), lambda: _x((9,))),
        ("ln_wide", lambda: nn.LayerNorm(301), lambda: _x((3, 301), 2.0, 1.0)),
        # Embedding: int64 and int32 indices, 0-d and 2-d, padding_idx.
        ("emb", lambda: nn.Embedding(10, 4), lambda: idx((3, 5), 10)),
        ("emb_pad", lambda: nn.Embedding(10, 4, padding_idx=2),
         lambda: torch.tensor([[2, 0, 9], [2, 2, 5]], dtype=torch.int64)),
        ("emb_i32", lambda: nn.Embedding(7, 3), lambda: idx((7,), 7).to(torch.int32)),
        ("emb_0d", lambda: nn.Embedding(5, 6), lambda: torch.tensor(4, dtype=torch.int64)),
    ]


def generate(out_dir):
    for i, (name, make, make_x) in enumerate(_cases()):
        torch.manual_seed(100 + i)
        m = make()
        _randomise(m, 100 + i)
        m.eval()
        x = make_x()
        with torch.no_grad():
            y = m(x)
        tensors = OrderedDict()
        for k, v in m.state_dict().items():
            tensors["w." + k] = v
        tensors["x"] = x
        tensors["y"] = y
        save_safetensors(tensors, os.path.join(out_dir, f"layers_{name}.safetensors"))
