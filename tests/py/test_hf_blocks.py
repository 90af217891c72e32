"""Blocks written the way HuggingFace's modeling files write them (GPT-2,
BERT, LLaMA, T5), at random init, traced by tools/grove_export.py, run by
`$GROVE_BIN predict --local` and compared with torch in eval mode (rtol
1e-4, atol 1e-5) at several shapes (batch 1, odd lengths).  Each spelling
below is the one transformers uses; test_seq_hf.py holds whole small
models, this file the idioms those models are made of:

- GPT-2: a persistent=False tril(ones) bias buffer viewed [1, 1, n, n] and
  sliced [:, :, k - q : k, :k] (float, not bool: where casts it), the mask
  value as torch.finfo(w.dtype).min in torch.full([], ..., dtype, device),
  Conv1D's torch.addmm, split(split_size, dim=2), _split_heads with view /
  permute, gelu_new written out with tanh and torch.pow(x, 3.0);
- BERT: the extended attention mask mask[:, None, None, :] .to(dtype=...)
  and (1.0 - mask) * torch.finfo(dtype).min, token_type_ids and
  position_ids buffers (torch.zeros(dtype=torch.long), torch.arange(n)
  .expand((1, -1))) sliced by the sequence length;
- RoBERTa: create_position_ids_from_input_ids (ne(pad).int(), cumsum,
  type_as, .long());
- LLaMA: RMSNorm in float32, rotary embeddings from an inv_freq buffer
  (einsum "i,j->ij" and torch.outer), rotate_half, SwiGLU, repeat_kv,
  F.softmax(dtype=torch.float32).to(q.dtype);
- T5: the relative position bucket (abs, log of a float ratio, .to(long),
  torch.min against full_like, where), its nn.Embedding permuted
  [2, 0, 1] and unsqueezed, T5's LayerNorm (RMS without a mean, and its
  `if self.weight.dtype in [torch.float16, torch.bfloat16]`);
- int() of sizes: int(n ** 0.5), int(math.sqrt(c)) per request.

Run by tests/run_py_tests.py under a python3 with torch and numpy.
"""
import math
import os
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from test_seq_hf import Conv1D  # noqa: E402  (HF's addmm Conv1D)
from test_seq_masks import _ids, _randomise, _t, check  # noqa: E402


def _f(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


# ---------------------------------------------------------------- GPT-2


def gelu_new(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 *
                                                                  torch.pow(x, 3.0))))


class GPT2Attention(nn.Module):
    def __init__(self, embed_dim=32, num_heads=4, max_positions=16):
        super().__init__()
        self.register_buffer(
            "bias",
            torch.tril(torch.ones((max_positions, max_positions), dtype=torch.bool)).view(
                1, 1, max_positions, max_positions),
            persistent=False,
        )
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads
        self.split_size = embed_dim
        self.c_attn = Conv1D(3 * self.embed_dim, self.embed_dim)
        self.c_proj = Conv1D(self.embed_dim, self.embed_dim)

    def _split_heads(self, tensor, num_heads, attn_head_size):
        new_shape = tensor.size()[:-1] + (num_heads, attn_head_size)
        tensor = tensor.view(new_shape)
        return tensor.permute(0, 2, 1, 3)

    def _merge_heads(self, tensor, num_heads, attn_head_size):
        tensor = tensor.permute(0, 2, 1, 3).contiguous()
        new_shape = tensor.size()[:-2] + (num_heads * attn_head_size,)
        return tensor.view(new_shape)

    def _attn(self, query, key, value):
        attn_weights = torch.matmul(query, key.transpose(-1, -2))
        attn_weights = attn_weights / torch.full(
            [], value.size(-1) ** 0.5, dtype=attn_weights.dtype, device=attn_weights.device)
        query_length, key_length = query.size(-2), key.size(-2)
        causal_mask = self.bias[:, :, key_length - query_length: key_length, :key_length]
        mask_value = torch.finfo(attn_weights.dtype).min
        mask_value = torch.full([], mask_value, dtype=attn_weights.dtype,
                                device=attn_weights.device)
        attn_weights = torch.where(causal_mask, attn_weights.to(attn_weights.dtype), mask_value)
        attn_weights = nn.functional.softmax(attn_weights, dim=-1)
        attn_weights = attn_weights.type(value.dtype)
        return torch.matmul(attn_weights, value)

    def forward(self, hidden_states):
        query, key, value = self.c_attn(hidden_states).split(self.split_size, dim=2)
        query = self._split_heads(query, self.num_heads, self.head_dim)
        key = self._split_heads(key, self.num_heads, self.head_dim)
        value = self._split_heads(value, self.num_heads, self.head_dim)
        attn_output = self._attn(query, key, value)
        attn_output = self._merge_heads(attn_output, self.num_heads, self.head_dim)
        return self.c_proj(attn_output)


class GPT2Block(nn.Module):
    def __init__(self, hidden=32):
        super().__init__()
        self.ln_1 = nn.LayerNorm(hidden, eps=1e-5)
        self.attn = GPT2Attention(hidden)
        self.ln_2 = nn.LayerNorm(hidden, eps=1e-5)
        self.c_fc = Conv1D(4 * hidden, hidden)
        self.c_proj = Conv1D(hidden, 4 * hidden)

    def forward(self, hidden_states):
        residual = hidden_states
        hidden_states = self.attn(self.ln_1(hidden_states)) + residual
        residual = hidden_states
        h = self.c_proj(gelu_new(self.c_fc(self.ln_2(hidden_states))))
        return residual + h


def test_gpt2_block():
    torch.manual_seed(1)
    m = _randomise(GPT2Block(), 2)
    cases = [(_f(2, 7, 32, seed=1),), (_f(1, 1, 32, seed=2),), (_f(3, 16, 32, seed=3),)]
    doc = check("gpt2_block", m, _t(cases[0]), cases)
    assert doc["inputs"][0]["shape"][1] == -1, doc["inputs"]


# ---------------------------------------------------------------- BERT


class BertEmbeddings(nn.Module):
    def __init__(self, vocab=40, hidden=16, max_pos=20, types=2):
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab, hidden, padding_idx=0)
        self.position_embeddings = nn.Embedding(max_pos, hidden)
        self.token_type_embeddings = nn.Embedding(types, hidden)
        self.LayerNorm = nn.LayerNorm(hidden, eps=1e-12)
        self.register_buffer("position_ids", torch.arange(max_pos).expand((1, -1)),
                             persistent=False)
        self.register_buffer("token_type_ids",
                             torch.zeros(self.position_ids.size(), dtype=torch.long),
                             persistent=False)

    def forward(self, input_ids):
        input_shape = input_ids.size()
        seq_length = input_shape[1]
        position_ids = self.position_ids[:, 0: seq_length + 0]
        buffered = self.token_type_ids[:, :seq_length]
        token_type_ids = buffered.expand(input_shape[0], seq_length)
        emb = self.word_embeddings(input_ids) + self.token_type_embeddings(token_type_ids)
        emb = emb + self.position_embeddings(position_ids)
        return self.LayerNorm(emb)


class BertMasked(nn.Module):
    """The embeddings, then one attention score matrix with the extended
    mask added, as get_extended_attention_mask makes it."""

    def __init__(self, hidden=16):
        super().__init__()
        self.embeddings = BertEmbeddings(hidden=hidden)
        self.query = nn.Linear(hidden, hidden)
        self.key = nn.Linear(hidden, hidden)

    def forward(self, input_ids, attention_mask):
        h = self.embeddings(input_ids)
        dtype = h.dtype
        extended = attention_mask[:, None, None, :]
        extended = extended.to(dtype=dtype)
        extended = (1.0 - extended) * torch.finfo(dtype).min
        scores = torch.matmul(self.query(h)[:, None], self.key(h)[:, None].transpose(-1, -2))
        scores = scores / math.sqrt(h.size(-1)) + extended
        return F.softmax(scores, dim=-1)


def test_bert_extended_mask_and_buffers():
    torch.manual_seed(3)
    m = _randomise(BertMasked(), 4)

    def mask(n, t, seed):
        a = np.ones((n, t), np.int64)
        a[:, t - 1 - seed % 2:] = 0
        return a

    cases = [(_ids(2, 7, 1, 40), mask(2, 7, 1)), (_ids(1, 3, 2, 40), mask(1, 3, 2)),
             (_ids(3, 20, 3, 40), mask(3, 20, 3))]
    check("bert_mask", m, _t(cases[0]), cases)


# ---------------------------------------------------------------- RoBERTa


def create_position_ids_from_input_ids(input_ids, padding_idx, past_key_values_length=0):
    mask = input_ids.ne(padding_idx).int()
    incremental_indices = (torch.cumsum(mask, dim=1).type_as(mask) + past_key_values_length) * mask
    return incremental_indices.long() + padding_idx


class RobertaEmbeddings(nn.Module):
    def __init__(self, vocab=40, hidden=16, max_pos=24, pad=1):
        super().__init__()
        self.padding_idx = pad
        self.word_embeddings = nn.Embedding(vocab, hidden, padding_idx=pad)
        self.position_embeddings = nn.Embedding(max_pos, hidden, padding_idx=pad)
        self.LayerNorm = nn.LayerNorm(hidden, eps=1e-5)

    def forward(self, input_ids):
        position_ids = create_position_ids_from_input_ids(input_ids, self.padding_idx)
        emb = self.word_embeddings(input_ids) + self.position_embeddings(position_ids)
        return self.LayerNorm(emb)


def test_roberta_position_ids():
    torch.manual_seed(11)
    m = _randomise(RobertaEmbeddings(), 12)

    def ids(n, t, seed):
        a = _ids(n, t, seed, 40)
        a[a == 1] = 2
        a[:, t - 1 - seed % 3:] = 1  # right padding
        return a

    cases = [(ids(2, 7, 1),), (ids(1, 3, 2),), (ids(3, 20, 3),)]
    check("roberta_pos", m, _t(cases[0]), cases)


# ---------------------------------------------------------------- LLaMA


class LlamaRMSNorm(nn.Module):
    def __init__(self, hidden_size, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states):
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)


class LlamaRotaryEmbedding(nn.Module):
    def __init__(self, dim, max_position_embeddings=32, base=10000, outer=False):
        super().__init__()
        self.outer = outer
        inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2).float() / dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, x, seq_len):
        t = torch.arange(seq_len, device=x.device, dtype=self.inv_freq.dtype)
        if self.outer:
            freqs = torch.outer(t, self.inv_freq)
        else:
            freqs = torch.einsum("i,j->ij", t, self.inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        return (emb.cos()[None, None, :, :].to(dtype=x.dtype),
                emb.sin()[None, None, :, :].to(dtype=x.dtype))


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary_pos_emb(q, k, cos, sin):
    q_embed = (q * cos) + (rotate_half(q) * sin)
    k_embed = (k * cos) + (rotate_half(k) * sin)
    return q_embed, k_embed


def repeat_kv(hidden_states, n_rep):
    batch, num_key_value_heads, slen, head_dim = hidden_states.shape
    if n_rep == 1:
        return hidden_states
    hidden_states = hidden_states[:, :, None, :, :].expand(batch, num_key_value_heads, n_rep,
                                                           slen, head_dim)
    return hidden_states.reshape(batch, num_key_value_heads * n_rep, slen, head_dim)


class LlamaMLP(nn.Module):
    def __init__(self, hidden, inter):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inter, bias=False)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaAttention(nn.Module):
    def __init__(self, hidden=32, heads=4, kv_heads=2, outer=False):
        super().__init__()
        self.num_heads = heads
        self.head_dim = hidden // heads
        self.num_key_value_heads = kv_heads
        self.num_key_value_groups = heads // kv_heads
        self.q_proj = nn.Linear(hidden, heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(hidden, kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(hidden, kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(heads * self.head_dim, hidden, bias=False)
        self.rotary_emb = LlamaRotaryEmbedding(self.head_dim, outer=outer)

    def forward(self, hidden_states):
        bsz, q_len, _ = hidden_states.size()
        q = self.q_proj(hidden_states).view(bsz, q_len, self.num_heads, self.head_dim)
        q = q.transpose(1, 2)
        k = self.k_proj(hidden_states).view(bsz, q_len, self.num_key_value_heads, self.head_dim)
        k = k.transpose(1, 2)
        v = self.v_proj(hidden_states).view(bsz, q_len, self.num_key_value_heads, self.head_dim)
        v = v.transpose(1, 2)
        cos, sin = self.rotary_emb(v, seq_len=q_len)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        k = repeat_kv(k, self.num_key_value_groups)
        v = repeat_kv(v, self.num_key_value_groups)
        attn_weights = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(self.head_dim)
        mask = torch.full((q_len, q_len), torch.finfo(q.dtype).min, device=q.device)
        mask = torch.triu(mask, diagonal=1)
        attn_weights = attn_weights + mask[None, None, :, :]
        attn_weights = F.softmax(attn_weights, dim=-1, dtype=torch.float32).to(q.dtype)
        attn_output = torch.matmul(attn_weights, v)
        attn_output = attn_output.transpose(1, 2).contiguous()
        attn_output = attn_output.reshape(bsz, q_len, self.num_heads * self.head_dim)
        return self.o_proj(attn_output)


class LlamaDecoderLayer(nn.Module):
    def __init__(self, hidden=32, outer=False):
        super().__init__()
        self.self_attn = LlamaAttention(hidden, outer=outer)
        self.mlp = LlamaMLP(hidden, 48)
        self.input_layernorm = LlamaRMSNorm(hidden)
        self.post_attention_layernorm = LlamaRMSNorm(hidden)

    def forward(self, hidden_states):
        residual = hidden_states
        hidden_states = self.self_attn(self.input_layernorm(hidden_states))
        hidden_states = residual + hidden_states
        residual = hidden_states
        hidden_states = self.mlp(self.post_attention_layernorm(hidden_states))
        return residual + hidden_states


def test_llama_decoder_layer():
    for outer in (False, True):
        torch.manual_seed(5)
        m = _randomise(LlamaDecoderLayer(outer=outer), 6)
        cases = [(_f(2, 7, 32, seed=1),), (_f(1, 1, 32, seed=2),), (_f(3, 12, 32, seed=3),)]
        doc = check(f"llama_outer{int(outer)}", m, _t(cases[0]), cases)
        assert doc["inputs"][0]["shape"][1] == -1, doc["inputs"]


# ---------------------------------------------------------------- T5


class T5LayerNorm(nn.Module):
    def __init__(self, hidden_size, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states):
        variance = hidden_states.to(torch.float32).pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        if self.weight.dtype in [torch.float16, torch.bfloat16]:
            hidden_states = hidden_states.to(self.weight.dtype)
        return self.weight * hidden_states


class T5Bias(nn.Module):
    """T5Attention.compute_bias for a sequence as long as the input's, then
    the scores with that bias added (bidirectional, as an encoder)."""

    def __init__(self, hidden=16, heads=2, num_buckets=32, max_distance=128,
                 bidirectional=True):
        super().__init__()
        self.n_heads = heads
        self.relative_attention_num_buckets = num_buckets
        self.relative_attention_max_distance = max_distance
        self.bidirectional = bidirectional
        self.relative_attention_bias = nn.Embedding(num_buckets, heads)
        self.layer_norm = T5LayerNorm(hidden)
        self.q = nn.Linear(hidden, hidden, bias=False)
        self.k = nn.Linear(hidden, hidden, bias=False)

    @staticmethod
    def _relative_position_bucket(relative_position, bidirectional=True, num_buckets=32,
                                  max_distance=128):
        relative_buckets = 0
        if bidirectional:
            num_buckets //= 2
            relative_buckets += (relative_position > 0).to(torch.long) * num_buckets
            relative_position = torch.abs(relative_position)
        else:
            relative_position = -torch.min(relative_position,
                                           torch.zeros_like(relative_position))
        max_exact = num_buckets // 2
        is_small = relative_position < max_exact
        relative_position_if_large = max_exact + (
            torch.log(relative_position.float() / max_exact)
            / math.log(max_distance / max_exact)
            * (num_buckets - max_exact)
        ).to(torch.long)
        relative_position_if_large = torch.min(
            relative_position_if_large, torch.full_like(relative_position_if_large,
                                                        num_buckets - 1))
        relative_buckets += torch.where(is_small, relative_position, relative_position_if_large)
        return relative_buckets

    def compute_bias(self, query_length, key_length, device=None):
        context_position = torch.arange(query_length, dtype=torch.long, device=device)[:, None]
        memory_position = torch.arange(key_length, dtype=torch.long, device=device)[None, :]
        relative_position = memory_position - context_position
        relative_position_bucket = self._relative_position_bucket(
            relative_position,
            bidirectional=self.bidirectional,
            num_buckets=self.relative_attention_num_buckets,
            max_distance=self.relative_attention_max_distance,
        )
        values = self.relative_attention_bias(relative_position_bucket)
        values = values.permute([2, 0, 1]).unsqueeze(0)
        return values

    def forward(self, hidden_states):
        b, n, d = hidden_states.shape
        h = self.layer_norm(hidden_states)
        q = self.q(h).view(b, n, self.n_heads, -1).transpose(1, 2)
        k = self.k(h).view(b, n, self.n_heads, -1).transpose(1, 2)
        scores = torch.matmul(q, k.transpose(3, 2))
        position_bias = self.compute_bias(n, n, device=scores.device)
        scores = scores + position_bias
        return F.softmax(scores.float(), dim=-1).type_as(scores)


def test_t5_relative_bias_and_layer_norm():
    for bidirectional in (True, False):
        torch.manual_seed(7)
        m = _randomise(T5Bias(bidirectional=bidirectional, num_buckets=8, max_distance=20), 8)
        # Lengths past max_exact and past max_distance reach every branch.
        cases = [(_f(2, 7, 16, seed=1),), (_f(1, 1, 16, seed=2),), (_f(2, 30, 16, seed=3),)]
        check(f"t5_bias_{int(bidirectional)}", m, _t(cases[0]), cases)


# ---------------------------------------------------------------- int() of sizes


class SizeScaled(nn.Module):
    """Numbers computed from the request's sizes with int(): a scale
    int(n ** 0.5) of the sequence length n, and int(math.sqrt(c)) features
    summed; both follow each request's own length."""

    def __init__(self, dim=8):
        super().__init__()
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        b, n, c = x.shape
        side = int(n ** 0.5)
        return self.proj(x) * side + x[:, :, : int(math.sqrt(c))].sum(-1, keepdim=True) / side


def test_int_of_sequence_length():
    torch.manual_seed(9)
    m = _randomise(SizeScaled(), 10)
    cases = [(_f(2, 16, 8, seed=1),), (_f(1, 10, 8, seed=2),), (_f(3, 30, 8, seed=3),),
             (_f(1, 1, 8, seed=4),)]
    doc = check("size_scaled", m, _t(cases[0]), cases)
    assert doc["inputs"][0]["shape"][1] == -1, doc["inputs"]
