"""The sequence models of bench/sequence.sh (issue #19), seeded, in eval mode.

Each builder returns (model, example inputs): the inputs at batch 1 and the
benchmark's sequence length; the benchmark replaces dimension 0 by its batch.

    lstm     Embedding(1000, 128) -> 2-layer LSTM(256) -> Linear on the last
             step, 32 tokens
    bert     Embedding(1000, 256) + positions -> 4-layer TransformerEncoder
             (hidden 256, 4 heads, FF 1024) with src_key_padding_mask = ids
             == 0 -> mean -> Linear, 128 tokens
    decoder  Embedding(1000, 256) -> 2-layer TransformerDecoder (hidden 256,
             4 heads, FF 1024) over its own embeddings as memory, the causal
             tgt_mask made in forward (generate_square_subsequent_mask) ->
             Linear to the vocabulary, 64 tokens
"""
import torch
import torch.nn as nn


class LSTMClassifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(1000, 128)
        self.lstm = nn.LSTM(128, 256, num_layers=2, batch_first=True)
        self.fc = nn.Linear(256, 2)

    def forward(self, ids):
        out, _ = self.lstm(self.emb(ids))
        return self.fc(out[:, -1])


class BertLike(nn.Module):
    def __init__(self, tokens=128):
        super().__init__()
        self.emb = nn.Embedding(1000, 256)
        self.pos = nn.Embedding(tokens, 256)
        layer = nn.TransformerEncoderLayer(256, 4, 1024, batch_first=True, activation="gelu")
        self.enc = nn.TransformerEncoder(layer, 4, enable_nested_tensor=False)
        self.fc = nn.Linear(256, 2)

    def forward(self, ids, positions):
        h = self.emb(ids) + self.pos(positions)
        h = self.enc(h, src_key_padding_mask=ids == 0)
        return self.fc(h.mean(1))


class Decoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(1000, 256)
        layer = nn.TransformerDecoderLayer(256, 4, 1024, batch_first=True)
        self.dec = nn.TransformerDecoder(layer, 2)
        self.out = nn.Linear(256, 1000)

    def forward(self, ids):
        h = self.emb(ids)
        mask = nn.Transformer.generate_square_subsequent_mask(ids.size(1))
        return self.out(self.dec(h, h, tgt_mask=mask))


def _ids(tokens):
    g = torch.Generator().manual_seed(1)
    return torch.randint(1, 1000, (1, tokens), generator=g)


def lstm():
    torch.manual_seed(0)
    return LSTMClassifier().eval(), (_ids(32),)


def bert():
    torch.manual_seed(0)
    ids = _ids(128)
    ids[:, 100:] = 0  # padding
    return BertLike().eval(), (ids, torch.arange(128)[None])


def decoder():
    torch.manual_seed(0)
    return Decoder().eval(), (_ids(64),)


BUILDERS = {"lstm": lstm, "bert": bert, "decoder": decoder}
