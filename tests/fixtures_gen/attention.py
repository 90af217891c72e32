"""Attention parity fixtures: MultiheadAttention, TransformerEncoderLayer and
TransformerEncoder with seeded random weights in eval mode, written as

    attn_<case>.safetensors   w.<state_dict key>; the inputs q, k, v (self-
                              attention cases have q only); torch's outputs y
                              and, when the case asks for them, the attention
                              weights a
    attn_<case>.json          the module's model.json object (the exporter's)

tests/check_attention.c builds each module with its C constructor (a table
mirroring CASES) and from the JSON, loads w.* strictly and compares with
torch (rtol 1e-4, atol 1e-5).  torch 1.13 takes its eval fast path
(_transformer_encoder_layer_fwd, _native_multi_head_attention) where it can,
so some cases compare against that math and some against the slow path."""
import json
import os
from collections import OrderedDict

import torch
import torch.nn as nn

from grove_export import module_spec, save_safetensors


def _randomise(m, seed):
    """Matrices uniform in +-2/sqrt(fan_in), as trained layers are scaled, so
    that attention logits stay O(1) (large random logits make softmax so
    sensitive that float32 rounding alone exceeds the tolerance); biases in
    +-0.2, norms' weights around 1."""
    g = torch.Generator().manual_seed(seed + 2000)
    for name, p in m.named_parameters():
        with torch.no_grad():
            u = torch.rand(p.shape, generator=g) * 2 - 1
            if "norm" in name and name.endswith("weight"):
                p.copy_(u * 0.5 + 1)
            elif p.dim() == 2:
                p.copy_(u * 2 / p.shape[1] ** 0.5)
            else:
                p.copy_(u * 0.2)


def _x(*shape):
    return torch.randn(shape)


def _tel(*a, **k):
    return nn.TransformerEncoderLayer(*a, **k)


# (name, module, inputs (q[, k, v]), call kwargs)
CASES = [
    ("mha_self_seq", lambda: nn.MultiheadAttention(8, 2), lambda: [_x(5, 3, 8)], {}),
    ("mha_self_bf", lambda: nn.MultiheadAttention(8, 4, batch_first=True),
     lambda: [_x(3, 5, 8)], {"need_weights": False}),
    ("mha_cross_bf", lambda: nn.MultiheadAttention(12, 3, batch_first=True),
     lambda: [_x(2, 4, 12), _x(2, 6, 12), _x(2, 6, 12)], {"average_attn_weights": False}),
    ("mha_cross_seq", lambda: nn.MultiheadAttention(6, 2),
     lambda: [_x(3, 2, 6), _x(5, 2, 6), _x(5, 2, 6)], {}),
    ("mha_b1", lambda: nn.MultiheadAttention(6, 1), lambda: [_x(7, 1, 6)], {}),
    ("mha_nobias", lambda: nn.MultiheadAttention(8, 2, bias=False), lambda: [_x(4, 2, 8)], {}),
    ("mha_unbatched", lambda: nn.MultiheadAttention(8, 2), lambda: [_x(5, 8)], {}),
    ("mha_big", lambda: nn.MultiheadAttention(128, 2, batch_first=True),
     lambda: [_x(2, 40, 128)], {}),
    ("tel_relu_bf", lambda: _tel(16, 4, 32, batch_first=True), lambda: [_x(3, 5, 16)], {}),
    ("tel_gelu_normfirst", lambda: _tel(16, 2, 24, activation="gelu", norm_first=True),
     lambda: [_x(6, 2, 16)], {}),
    ("tel_odd_b1", lambda: _tel(12, 3, 20, batch_first=True, layer_norm_eps=1e-3),
     lambda: [_x(1, 7, 12)], {}),
    ("tel_unbatched", lambda: _tel(8, 2, 16), lambda: [_x(5, 8)], {}),
    ("te_2_norm", lambda: nn.TransformerEncoder(_tel(16, 4, 32, batch_first=True), 2,
                                                norm=nn.LayerNorm(16)),
     lambda: [_x(2, 6, 16)], {}),
    ("te_3_gelu", lambda: nn.TransformerEncoder(_tel(8, 2, 16, activation="gelu"), 3),
     lambda: [_x(4, 3, 8)], {}),
]


def generate(out_dir):
    for i, (name, make, make_x, kwargs) in enumerate(CASES):
        torch.manual_seed(500 + i)
        m = make()
        _randomise(m, 500 + i)
        m.eval()
        xs = make_x()
        with torch.no_grad():
            if isinstance(m, nn.MultiheadAttention):
                q = xs[0]
                k, v = (xs[1], xs[2]) if len(xs) == 3 else (q, q)
                y, a = m(q, k, v, **kwargs)
            else:
                y, a = m(xs[0]), None
        tensors = OrderedDict(("w." + k_, v_) for k_, v_ in m.state_dict().items())
        for key, t in zip("qkv", xs):
            tensors[key] = t
        tensors["y"] = y
        if a is not None:
            tensors["a"] = a
        save_safetensors(tensors, os.path.join(out_dir, f"attn_{name}.safetensors"))
        with open(os.path.join(out_dir, f"attn_{name}.json"), "w") as f:
            json.dump(module_spec(m), f)
