"""Attention masks and the transformer decoders through exported graphs, end
to end (tools/grove_export.py traces, `$GROVE_BIN predict --local` runs, the
outputs must be torch's, rtol 1e-4 / atol 1e-5, NaN where torch gives NaN):
masks passed as model inputs (bool padding masks, float causal masks) and
read from registered buffers, nn.TransformerDecoder / nn.Transformer called
with every mask, MultiheadAttention with kdim/vdim, add_bias_kv,
add_zero_attn and per-head weights, each at several shapes (batch 1, odd
lengths, padding).

Run by tests/run_py_tests.py under a python3 with torch and numpy.
"""
import os
import sys
import tempfile

import numpy as np
import torch
import torch.nn as nn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from test_graph_export import compare, predict  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tools"))
from grove_export import export  # noqa: E402


def _randomise(m, seed):
    """Weights scaled as trained ones are (attention logits O(1))."""
    g = torch.Generator().manual_seed(seed)
    for name, p in m.named_parameters():
        with torch.no_grad():
            u = torch.rand(p.shape, generator=g) * 2 - 1
            if "norm" in name and name.endswith("weight"):
                p.copy_(u * 0.5 + 1)
            elif p.dim() >= 2:
                p.copy_(u * 2 / p.shape[-1] ** 0.5)
            else:
                p.copy_(u * 0.2)
    return m.eval()


def _pad(lengths, s):
    return (np.arange(s)[None, :] >= np.array(lengths)[:, None])


def _causal(t):
    return nn.Transformer.generate_square_subsequent_mask(t).numpy()


def check(name, m, example, cases):
    """Exports m once, then runs every input tuple of cases through grove
    and torch."""
    with tempfile.TemporaryDirectory() as tmp:
        d = os.path.join(tmp, name)
        doc = export(m, d, example_input=example)
        for xs in cases:
            code, err, got = predict(d, tmp, xs)
            assert code == 0, (name, [x.shape for x in xs], err)
            compare(name, m, xs, got, equal_nan=True)
        return doc


def _f(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


# ---------------------------------------------------------------- the models


def _ids(n, t, seed=0, vocab=50):
    return np.random.default_rng(seed).integers(1, vocab, (n, t)).astype(np.int64)


class PaddedEncoder(nn.Module):
    """An encoder classifier over token ids whose padding mask is a second
    input (bool [N, S]: both sequence dims free)."""

    def __init__(self, batch_first=True, norm_first=False):
        super().__init__()
        self.batch_first = batch_first
        self.emb = nn.Embedding(50, 16)
        layer = nn.TransformerEncoderLayer(16, 4, 32, batch_first=batch_first,
                                           norm_first=norm_first)
        self.enc = nn.TransformerEncoder(layer, 2, norm=nn.LayerNorm(16))
        self.head = nn.Linear(16, 3)

    def forward(self, ids, pad):
        h = self.emb(ids)
        if not self.batch_first:
            h = h.transpose(0, 1)
        h = self.enc(h, src_key_padding_mask=pad)
        return self.head(h[:, 0] if self.batch_first else h[0])


class BufferMask(nn.Module):
    """attn_mask from a registered (bool) buffer, weights per head."""

    def __init__(self):
        super().__init__()
        self.attn = nn.MultiheadAttention(8, 2, batch_first=True)
        self.register_buffer("mask", torch.triu(torch.ones(4, 4, dtype=torch.bool), 1))

    def forward(self, x):
        out, w = self.attn(x, x, x, attn_mask=self.mask, average_attn_weights=False)
        return out, w


class CrossAttention(nn.Module):
    """kdim/vdim, add_bias_kv and add_zero_attn with a padding-mask input."""

    def __init__(self):
        super().__init__()
        self.attn = nn.MultiheadAttention(8, 2, kdim=6, vdim=5, add_bias_kv=True,
                                          add_zero_attn=True, batch_first=True)

    def forward(self, q, k, v, pad):
        return self.attn(q, k, v, key_padding_mask=pad)


class Translator(nn.Module):
    """nn.Transformer over token ids: the causal mask a float buffer sliced
    by the target's length, the source padding mask an input."""

    def __init__(self):
        super().__init__()
        self.src_emb = nn.Embedding(40, 16)
        self.tgt_emb = nn.Embedding(30, 16)
        self.tf = nn.Transformer(16, 4, 2, 2, 32, batch_first=True)
        self.out = nn.Linear(16, 30)
        self.register_buffer("causal", nn.Transformer.generate_square_subsequent_mask(32))

    def forward(self, src, tgt, src_pad):
        t = tgt.size(1)
        h = self.tf(self.src_emb(src), self.tgt_emb(tgt), tgt_mask=self.causal[:t, :t],
                    src_key_padding_mask=src_pad, memory_key_padding_mask=src_pad)
        return self.out(h)


class Decoder(nn.Module):
    """nn.TransformerDecoder (seq-first, norm_first, gelu) with a memory mask
    from a buffer; the model's inputs are batch-first."""

    def __init__(self):
        super().__init__()
        layer = nn.TransformerDecoderLayer(8, 2, 16, activation="gelu", norm_first=True)
        self.dec = nn.TransformerDecoder(layer, 2)
        mm = torch.where(torch.rand(8, 8, generator=torch.Generator().manual_seed(3)) > 0.7,
                         float("-inf"), 0.0)
        mm[1] = float("-inf")  # a query that sees no memory: NaN, as torch gives it
        self.register_buffer("mm", mm)
        self.register_buffer("causal", torch.triu(torch.ones(8, 8, dtype=torch.bool), 1))

    def forward(self, tgt, memory):
        t, s = tgt.size(1), memory.size(1)
        y = self.dec(tgt.transpose(0, 1), memory.transpose(0, 1), tgt_mask=self.causal[:t, :t],
                     memory_mask=self.mm[:t, :s])
        return y.transpose(0, 1)


# ---------------------------------------------------------------- tests


def _t(xs):
    return tuple(torch.from_numpy(x) for x in xs)


def test_padding_mask_input():
    torch.manual_seed(1)
    m = _randomise(PaddedEncoder(), 2)
    cases = [(_ids(3, 6, 3), _pad([6, 4, 1], 6)), (_ids(1, 5, 4), _pad([3], 5)),
             (_ids(2, 7, 5), _pad([7, 7], 7))]
    doc = check("padded", m, _t(cases[0]), cases)
    assert doc["inputs"][1]["dtype"] == "bool", doc["inputs"]
    assert doc["inputs"][0]["shape"] == [-1, -1] and doc["inputs"][1]["shape"] == [-1, -1], \
        doc["inputs"]
    m = _randomise(PaddedEncoder(batch_first=False, norm_first=True), 6)
    cases = [(_ids(3, 6, 7), _pad([6, 2, 5], 6)), (_ids(1, 5, 8), _pad([5], 5))]
    check("padded_seq", m, _t(cases[0]), cases)


def test_buffer_mask_and_weights():
    torch.manual_seed(3)
    m = _randomise(BufferMask(), 4)
    check("buffer_mask", m, torch.zeros(2, 4, 8), [(_f(3, 4, 8, seed=1),), (_f(1, 4, 8, seed=2),)])


def test_cross_attention_kdim_bias_kv_zero_attn():
    torch.manual_seed(5)
    m = _randomise(CrossAttention(), 6)
    for xs in [(_f(2, 3, 8, seed=1), _f(2, 5, 6, seed=2), _f(2, 5, 5, seed=3), _pad([5, 2], 5)),
               (_f(1, 4, 8, seed=4), _f(1, 7, 6, seed=5), _f(1, 7, 5, seed=6), _pad([3], 7)),
               # every key padded: the zero-attention key keeps the rows finite
               (_f(2, 2, 8, seed=7), _f(2, 3, 6, seed=8), _f(2, 3, 5, seed=9), _pad([0, 3], 3))]:
        check("cross", m, _t(xs), [xs])


def test_transformer_translator():
    torch.manual_seed(7)
    m = _randomise(Translator(), 8)
    cases = [(_ids(2, 6, 1, 40), _ids(2, 5, 2, 30), _pad([6, 3], 6)),
             # (batch 1 unpadded: torch 1.13's nested encoder path would trim a
             # padded tail off memory and then refuse memory_key_padding_mask)
             (_ids(1, 3, 3, 40), _ids(1, 7, 4, 30), _pad([3], 3)),
             (_ids(3, 5, 5, 40), _ids(3, 1, 6, 30), _pad([5, 5, 1], 5))]
    doc = check("translator", m, _t(cases[0]), cases)
    assert [i["shape"] for i in doc["inputs"]] == [[-1, -1]] * 3, doc["inputs"]


def test_decoder_masks():
    torch.manual_seed(9)
    m = _randomise(Decoder(), 10)
    for xs in [(_f(2, 4, 8, seed=1), _f(2, 6, 8, seed=2)), (_f(1, 3, 8, seed=3), _f(1, 5, 8, seed=4))]:
        check("decoder", m, _t(xs), [xs])


def test_top_level_transformer_and_decoder():
    """nn.Transformer and nn.TransformerDecoder exported as the model itself
    (two inputs, batch-first), without masks."""
    torch.manual_seed(11)
    m = _randomise(nn.Transformer(16, 4, 1, 2, 32, batch_first=True), 12)
    for xs in [(_f(2, 5, 16, seed=1), _f(2, 3, 16, seed=2)), (_f(1, 2, 16, seed=3), _f(1, 6, 16, seed=4))]:
        check("tf", m, _t(xs), [xs])
    layer = nn.TransformerDecoderLayer(8, 2, 16, batch_first=True, norm_first=True)
    m = _randomise(nn.TransformerDecoder(layer, 2, norm=nn.LayerNorm(8)), 13)
    xs = (_f(3, 4, 8, seed=5), _f(3, 7, 8, seed=6))
    check("td", m, _t(xs), [xs])
