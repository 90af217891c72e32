"""Recurrent and bag parity fixtures: RNN (tanh, relu), LSTM (with
proj_size), GRU and EmbeddingBag with torch's own initialisation under a
fixed seed, in eval mode, written as

    rnn_<case>.safetensors   w.<state_dict key>; the inputs in0, in1, ...
                             (x, then h0 [, c0]; EmbeddingBag: input, then
                             offsets, then per_sample_weights); torch's
                             outputs out0, out1, ... flattened in order
                             (output, h_n [, c_n]; EmbeddingBag: one)
    rnn_<case>.json          the module's model.json object (the exporter's)

tests/check_rnn.c builds each module from the JSON, loads w.* strictly (so
the keys and shapes must be torch's) and compares every output with torch
(rtol 1e-4, atol 1e-5).  The shapes cover batch 1, odd lengths and widths
(the gate math's vector and scalar columns), several layers, both
directions, batch_first both ways, proj_size, no bias, unbatched input, and
initial states given or not."""
import json
import os
from collections import OrderedDict

import torch
import torch.nn as nn

from grove_export import _flat, module_spec, save_safetensors


def _x(*shape):
    return torch.randn(shape)


def _ids(n, *shape):
    return torch.randint(0, n, shape, dtype=torch.int64)


def _state(m, batch, unbatched=False):
    """h0 (and c0 for an LSTM) for m at this batch."""
    ld = m.num_layers * (2 if m.bidirectional else 1)
    hout = m.proj_size if getattr(m, "proj_size", 0) else m.hidden_size
    lead = (ld,) if unbatched else (ld, batch)
    h0 = torch.randn(lead + (hout,)) * 0.5
    if isinstance(m, nn.LSTM):
        return [h0, torch.randn(lead + (m.hidden_size,)) * 0.5]
    return [h0]


# (name, module, inputs(module) -> list of tensors)
CASES = [
    ("rnn_tanh", lambda: nn.RNN(5, 7), lambda m: [_x(6, 3, 5)]),
    ("rnn_relu_bf_h0", lambda: nn.RNN(4, 6, num_layers=2, nonlinearity="relu", batch_first=True),
     lambda m: [_x(2, 5, 4)] + _state(m, 2)),
    ("rnn_bi_unbatched_h0", lambda: nn.RNN(3, 5, bidirectional=True),
     lambda m: [_x(4, 3)] + _state(m, 1, unbatched=True)),
    ("lstm_1", lambda: nn.LSTM(5, 8), lambda m: [_x(7, 2, 5)]),
    ("lstm_bi2_bf_h0", lambda: nn.LSTM(6, 9, num_layers=2, bidirectional=True, batch_first=True),
     lambda m: [_x(3, 5, 6)] + _state(m, 3)),
    ("lstm_proj2", lambda: nn.LSTM(5, 10, num_layers=2, proj_size=4), lambda m: [_x(4, 3, 5)]),
    ("lstm_proj_bi_bf_h0", lambda: nn.LSTM(5, 8, proj_size=3, bidirectional=True,
                                           batch_first=True),
     lambda m: [_x(2, 3, 5)] + _state(m, 2)),
    ("lstm_nobias_b1", lambda: nn.LSTM(3, 16, bias=False), lambda m: [_x(9, 1, 3)]),
    ("lstm_unbatched", lambda: nn.LSTM(4, 12), lambda m: [_x(5, 4)]),
    ("lstm_big_bf", lambda: nn.LSTM(32, 64, num_layers=2, batch_first=True),
     lambda m: [_x(4, 11, 32)]),
    ("lstm_bf_b1", lambda: nn.LSTM(7, 13, batch_first=True), lambda m: [_x(1, 6, 7)]),
    ("gru_1", lambda: nn.GRU(5, 7), lambda m: [_x(6, 2, 5)]),
    ("gru_bi3_bf_h0", lambda: nn.GRU(4, 10, num_layers=3, bidirectional=True, batch_first=True),
     lambda m: [_x(2, 7, 4)] + _state(m, 2)),
    ("gru_nobias_b1", lambda: nn.GRU(6, 17, bias=False), lambda m: [_x(5, 1, 6)]),
    ("gru_big", lambda: nn.GRU(16, 48, num_layers=2), lambda m: [_x(13, 4, 16)]),
    # EmbeddingBag: an empty bag, include_last_offset, padding, per-sample weights.
    ("bag_sum_offsets_psw", lambda: nn.EmbeddingBag(20, 6, mode="sum"),
     lambda m: [_ids(20, 10), torch.tensor([0, 3, 3, 7]), torch.rand(10)]),
    ("bag_mean_2d", lambda: nn.EmbeddingBag(15, 5, mode="mean"), lambda m: [_ids(15, 3, 4)]),
    ("bag_max_last", lambda: nn.EmbeddingBag(12, 4, mode="max", include_last_offset=True),
     lambda m: [_ids(12, 9), torch.tensor([0, 2, 2, 5, 9])]),
    ("bag_mean_pad", lambda: nn.EmbeddingBag(10, 3, mode="mean", padding_idx=2),
     lambda m: [torch.tensor([[1, 2, 2, 4], [2, 2, 2, 2], [5, 6, 2, 7]])]),
    ("bag_sum_2d_psw", lambda: nn.EmbeddingBag(9, 8, mode="sum"),
     lambda m: [_ids(9, 2, 3), torch.rand(2, 3)]),
    ("bag_mean_offsets", lambda: nn.EmbeddingBag(30, 7),
     lambda m: [_ids(30, 11), torch.tensor([0, 1, 6, 6, 10])]),
]


def _call(m, xs):
    if isinstance(m, nn.EmbeddingBag):
        if len(xs) == 2 and xs[1].dtype.is_floating_point:
            return m(xs[0], per_sample_weights=xs[1])
        return m(*xs)
    if isinstance(m, nn.LSTM) and len(xs) == 3:
        return m(xs[0], (xs[1], xs[2]))
    return m(*xs)


def generate(out_dir):
    for i, (name, make, make_x) in enumerate(CASES):
        torch.manual_seed(900 + i)
        m = make()
        m.eval()
        xs = make_x(m)
        with torch.no_grad():
            ys = _flat(_call(m, xs))
        tensors = OrderedDict(("w." + k, v) for k, v in m.state_dict().items())
        for k, t in enumerate(xs):
            tensors[f"in{k}"] = t
        for k, t in enumerate(ys):
            tensors[f"out{k}"] = t.contiguous()
        save_safetensors(tensors, os.path.join(out_dir, f"rnn_{name}.safetensors"))
        with open(os.path.join(out_dir, f"rnn_{name}.json"), "w") as f:
            json.dump(module_spec(m), f)
