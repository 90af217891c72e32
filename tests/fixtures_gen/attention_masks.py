"""Parity fixtures for attention masks and the transformer decoders:
MultiheadAttention with attn_mask (bool / float, 2-d / 3-d), key_padding_mask
(bool / float), kdim / vdim, add_bias_kv, add_zero_attn; the encoder layers
and encoders with masks (torch 1.13's fast and nested-tensor paths where it
takes them); TransformerDecoderLayer, TransformerDecoder and nn.Transformer
with their masks.  Seeded random weights, eval mode, written as

    attnm_<case>.safetensors  w.<state_dict key>; the positional inputs x0,
                              x1, x2; the masks m0 .. m5 (the i-th mask
                              argument of the module's forward, absent for
                              None); torch's output y and, when asked, the
                              attention weights a
    attnm_index.json          the case names, in order
    attnm_<case>.json         {"module": the exporter's model.json object,
                              "nmasks": the module's mask slots,
                              "keys": torch's state_dict keys in order,
                              "need_weights": bool, "average": bool}

tests/check_attention.c (test_mask_parity) builds each from the JSON, sets
the masks in the forward's context and compares with torch (rtol 1e-4,
atol 1e-5; NaN where torch gives NaN: rows whose every key is masked)."""
import json
import os
from collections import OrderedDict

import torch
import torch.nn as nn
import torch.nn.functional as F

from grove_export import module_spec, save_safetensors

from attention import _randomise


def _x(*shape):
    return torch.randn(shape)


def _pad(n, s, lengths):
    """Bool key padding mask [n, s]: True after each item's length."""
    return torch.arange(s)[None, :] >= torch.tensor(lengths)[:, None]


def _causal(t):
    return nn.Transformer.generate_square_subsequent_mask(t)


def _tel(*a, **k):
    return nn.TransformerEncoderLayer(*a, **k)


def _tdl(*a, **k):
    return nn.TransformerDecoderLayer(*a, **k)


def _full_row_bool(l, s):
    m = torch.zeros(l, s, dtype=torch.bool)
    m[1] = True  # every key masked: torch gives NaN for this query
    m[0, -1] = True
    return m


MHA = nn.MultiheadAttention
# (name, module, inputs, masks by slot (None for absent), need_weights, average)
CASES = [
    ("mha_kpm_bool_seq", lambda: MHA(8, 2), lambda: [_x(5, 3, 8)],
     lambda: [_pad(3, 5, [5, 3, 1]), None], True, True),
    ("mha_kpm_bool_bf_fast", lambda: MHA(8, 2, batch_first=True), lambda: [_x(3, 6, 8)],
     lambda: [_pad(3, 6, [6, 4, 2]), None], False, True),
    ("mha_kpm_bool_bf_weights", lambda: MHA(8, 4, batch_first=True), lambda: [_x(2, 5, 8)],
     lambda: [_pad(2, 5, [3, 5]), None], True, True),
    ("mha_kpm_full_row", lambda: MHA(8, 2, batch_first=True), lambda: [_x(2, 4, 8)],
     lambda: [_pad(2, 4, [4, 0]), None], True, True),
    ("mha_kpm_float", lambda: MHA(6, 3), lambda: [_x(4, 2, 6)],
     lambda: [torch.randn(2, 4), None], True, True),
    ("mha_am2_bool_causal", lambda: MHA(8, 2), lambda: [_x(5, 2, 8)],
     lambda: [None, torch.triu(torch.ones(5, 5, dtype=torch.bool), 1)], True, True),
    ("mha_am2_bool_full_row", lambda: MHA(8, 2), lambda: [_x(4, 2, 8)],
     lambda: [None, _full_row_bool(4, 4)], True, False),
    ("mha_am2_float_causal", lambda: MHA(12, 3, batch_first=True), lambda: [_x(2, 7, 12)],
     lambda: [None, _causal(7)], True, True),
    ("mha_am2_float_any", lambda: MHA(8, 2), lambda: [_x(3, 2, 8), _x(5, 2, 8), _x(5, 2, 8)],
     lambda: [None, torch.randn(3, 5)], True, False),
    ("mha_am3_float", lambda: MHA(8, 2, batch_first=True), lambda: [_x(3, 4, 8)],
     lambda: [None, torch.randn(6, 4, 4)], True, False),
    ("mha_am3_bool_kpm_bool", lambda: MHA(8, 2), lambda: [_x(4, 2, 8)],
     lambda: [_pad(2, 4, [4, 3]), torch.rand(4, 4, 4) > 0.7], True, True),
    ("mha_amfloat_kpmbool", lambda: MHA(8, 4, batch_first=True),
     lambda: [_x(2, 3, 8), _x(2, 5, 8), _x(2, 5, 8)],
     lambda: [_pad(2, 5, [5, 2]), torch.randn(3, 5)], True, True),
    ("mha_ambool_kpmfloat", lambda: MHA(8, 2), lambda: [_x(4, 3, 8)],
     lambda: [torch.tensor([[0., 1., 0., 0.], [0., 0., 0., -2.], [0., 0., 0., 0.]]),
              torch.triu(torch.ones(4, 4, dtype=torch.bool), 1)], True, True),
    ("mha_kdim_vdim", lambda: MHA(8, 2, kdim=5, vdim=7),
     lambda: [_x(3, 2, 8), _x(4, 2, 5), _x(4, 2, 7)],
     lambda: [_pad(2, 4, [4, 2]), None], True, True),
    ("mha_kdim_vdim_bf_nobias", lambda: MHA(6, 3, kdim=4, vdim=4, bias=False, batch_first=True),
     lambda: [_x(2, 3, 6), _x(2, 5, 4), _x(2, 5, 4)], lambda: [None, None], True, False),
    ("mha_bias_kv", lambda: MHA(8, 2, add_bias_kv=True), lambda: [_x(4, 2, 8)],
     lambda: [_pad(2, 4, [4, 2]), None], True, True),
    ("mha_zero_attn", lambda: MHA(8, 2, add_zero_attn=True, batch_first=True),
     lambda: [_x(2, 3, 8)], lambda: [None, _causal(3)], True, False),
    ("mha_bias_kv_zero_attn", lambda: MHA(8, 4, add_bias_kv=True, add_zero_attn=True),
     lambda: [_x(3, 2, 8), _x(5, 2, 8), _x(5, 2, 8)],
     lambda: [_pad(2, 5, [1, 5]), torch.randn(3, 5)], True, True),
    ("mha_unbatched_masks", lambda: MHA(8, 2), lambda: [_x(5, 8)],
     lambda: [torch.tensor([False, False, False, True, True]), _causal(5)], True, True),
    # Encoder layers: batch-first with a padding mask takes torch 1.13's fast path.
    ("tel_kpm_fast", lambda: _tel(16, 4, 32, batch_first=True), lambda: [_x(3, 5, 16)],
     lambda: [None, _pad(3, 5, [5, 3, 2])], False, True),
    ("tel_mask_seq_normfirst", lambda: _tel(16, 2, 24, norm_first=True, activation="gelu"),
     lambda: [_x(6, 2, 16)], lambda: [_causal(6), _pad(2, 6, [6, 4])], False, True),
    ("tel_odd_heads_kpm", lambda: _tel(12, 3, 20, batch_first=True), lambda: [_x(1, 7, 12)],
     lambda: [None, _pad(1, 7, [5])], False, True),
    # The encoder's nested-tensor path: padded outputs are 0 (before the norm).
    ("te_kpm_nested", lambda: nn.TransformerEncoder(_tel(16, 4, 32, batch_first=True), 2,
                                                    norm=nn.LayerNorm(16)),
     lambda: [_x(3, 6, 16)], lambda: [None, _pad(3, 6, [6, 4, 1])], False, True),
    ("te_kpm_normfirst", lambda: nn.TransformerEncoder(
        _tel(8, 2, 16, batch_first=True, norm_first=True), 2),
     lambda: [_x(2, 5, 8)], lambda: [None, _pad(2, 5, [5, 3])], False, True),
    ("te_mask_and_kpm_seq", lambda: nn.TransformerEncoder(_tel(8, 2, 16, activation="gelu"), 2),
     lambda: [_x(5, 2, 8)], lambda: [_causal(5), _pad(2, 5, [5, 2])], False, True),
    # Decoders.
    ("tdl_causal_seq", lambda: _tdl(16, 4, 32), lambda: [_x(5, 2, 16), _x(7, 2, 16)],
     lambda: [_causal(5), None, None, None], False, True),
    ("tdl_gelu_bf_normfirst", lambda: _tdl(16, 2, 24, activation="gelu", batch_first=True,
                                           norm_first=True),
     lambda: [_x(2, 4, 16), _x(2, 6, 16)],
     lambda: [_causal(4), None, _pad(2, 4, [4, 3]), _pad(2, 6, [6, 5])], False, True),
    ("tdl_callable_act_b1", lambda: _tdl(12, 3, 20, activation=F.gelu, batch_first=True),
     lambda: [_x(1, 3, 12), _x(1, 5, 12)],
     lambda: [None, torch.randn(3, 5), None, None], False, True),
    ("tdl_unbatched", lambda: _tdl(8, 2, 16), lambda: [_x(4, 8), _x(3, 8)],
     lambda: [_causal(4), None, None, None], False, True),
    ("td_2_norm", lambda: nn.TransformerDecoder(_tdl(16, 4, 32, batch_first=True), 2,
                                                norm=nn.LayerNorm(16)),
     lambda: [_x(2, 5, 16), _x(2, 3, 16)],
     lambda: [_causal(5), None, None, _pad(2, 3, [3, 2])], False, True),
    ("td_3_nonorm_seq", lambda: nn.TransformerDecoder(_tdl(8, 2, 16, activation="gelu"), 3),
     lambda: [_x(3, 2, 8), _x(4, 2, 8)], lambda: [None, None, None, None], False, True),
    ("transformer_seq", lambda: nn.Transformer(16, 4, 2, 2, 32),
     lambda: [_x(6, 2, 16), _x(5, 2, 16)],
     lambda: [None, _causal(5), None, _pad(2, 6, [6, 4]), _pad(2, 5, [5, 5]),
              _pad(2, 6, [6, 4])], False, True),
    ("transformer_bf_b1_normfirst", lambda: nn.Transformer(8, 2, 1, 2, 16, batch_first=True,
                                                           norm_first=True, activation="gelu"),
     lambda: [_x(1, 7, 8), _x(1, 3, 8)],
     lambda: [None, _causal(3), None, None, None, None], False, True),
    ("transformer_bf_nested", lambda: nn.Transformer(16, 2, 2, 1, 24, batch_first=True),
     lambda: [_x(3, 5, 16), _x(3, 4, 16)],
     lambda: [None, _causal(4), None, _pad(3, 5, [5, 2, 3]), None, _pad(3, 5, [5, 2, 3])],
     False, True),
    # Long sequences: more than 64 keys, so the heads' score kernels run in
    # several column blocks (64 + a partial one); padding, causal and mixed
    # masks, one item fully padded, weights averaged and per head.
    ("mha_long_kpm_bf", lambda: MHA(64, 2, batch_first=True), lambda: [_x(3, 130, 64)],
     lambda: [_pad(3, 130, [130, 71, 0]), None], False, True),
    ("mha_long_causal_avg", lambda: MHA(32, 4), lambda: [_x(97, 2, 32)],
     lambda: [None, _causal(97)], True, True),
    ("mha_long_am3_kpm", lambda: MHA(48, 3, batch_first=True),
     lambda: [_x(2, 66, 48), _x(2, 150, 48), _x(2, 150, 48)],
     lambda: [_pad(2, 150, [150, 80]), torch.rand(6, 66, 150) > 0.8], True, False),
]

_NMASKS = {nn.MultiheadAttention: 2, nn.TransformerEncoderLayer: 2, nn.TransformerEncoder: 2,
           nn.TransformerDecoderLayer: 4, nn.TransformerDecoder: 4, nn.Transformer: 6}
_SLOTS = {nn.MultiheadAttention: ("key_padding_mask", "attn_mask"),
          nn.TransformerEncoderLayer: ("src_mask", "src_key_padding_mask"),
          nn.TransformerEncoder: ("mask", "src_key_padding_mask"),
          nn.TransformerDecoderLayer: ("tgt_mask", "memory_mask", "tgt_key_padding_mask",
                                       "memory_key_padding_mask"),
          nn.TransformerDecoder: ("tgt_mask", "memory_mask", "tgt_key_padding_mask",
                                  "memory_key_padding_mask"),
          nn.Transformer: ("src_mask", "tgt_mask", "memory_mask", "src_key_padding_mask",
                           "tgt_key_padding_mask", "memory_key_padding_mask")}


def generate(out_dir):
    with open(os.path.join(out_dir, "attnm_index.json"), "w") as f:
        json.dump([c[0] for c in CASES], f)
    for i, (name, make, make_x, make_m, need, avg) in enumerate(CASES):
        torch.manual_seed(900 + i)
        m = make()
        _randomise(m, 900 + i)
        m.eval()
        xs = make_x()
        masks = make_m()
        kw = {k: v for k, v in zip(_SLOTS[type(m)], masks) if v is not None}
        with torch.no_grad():
            if isinstance(m, nn.MultiheadAttention):
                q = xs[0]
                k, v = (xs[1], xs[2]) if len(xs) == 3 else (q, q)
                y, a = m(q, k, v, need_weights=need, average_attn_weights=avg, **kw)
            else:
                y, a = m(*xs, **kw), None
        # torch 1.13's nested-tensor path trims trailing positions padded in
        # every item (Grove keeps the full length, as torch 2 does): no case
        # pads the last position of every item.
        assert y.shape == (xs[0].shape if not isinstance(m, nn.Transformer) else xs[1].shape)
        tensors = OrderedDict(("w." + k_, v_) for k_, v_ in m.state_dict().items())
        for j, t in enumerate(xs):
            tensors[f"x{j}"] = t
        for j, t in enumerate(masks):
            if t is not None:
                tensors[f"m{j}"] = t
        tensors["y"] = y
        if a is not None:
            tensors["a"] = a
        save_safetensors(tensors, os.path.join(out_dir, f"attnm_{name}.safetensors"))
        with open(os.path.join(out_dir, f"attnm_{name}.json"), "w") as f:
            json.dump({"module": module_spec(m), "nmasks": _NMASKS[type(m)],
                       "need_weights": need, "average": avg,
                       "keys": list(m.state_dict().keys())}, f)
