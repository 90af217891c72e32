"""Model directories for groved's integration tests (tests/check_server.c).

OUT/server_mlp/    Sequential(Linear(16, 32), ReLU, Linear(32, 4)), float32
                   input [-1, 16]; batching max_batch_size 16 (so that 32
                   one-row clients need several batches), a long delay (the
                   tests watch requests batch together) and a queue of 64.
OUT/server_embed/  Sequential(Embedding(20, 8), Linear(8, 3)), int64 input
                   [-1, -1]: requests of different lengths must not be
                   concatenated into one batch.
Each directory also holds io.safetensors: "x" (the input) and "y" (torch's
output for x, eval mode), which the tests split into requests row by row.
"""
import os
from collections import OrderedDict

import torch
import torch.nn as nn

from grove_export import export, save_safetensors


def generate(out_dir):
    torch.manual_seed(20261129)
    mlp = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)).eval()
    x = torch.randn(64, 16)
    d = os.path.join(out_dir, "server_mlp")
    export(mlp, d, example_input=x[:1], name="server_mlp",
           batching={"max_batch_size": 16, "max_queue_delay_us": 20000, "max_queue_size": 64})
    with torch.no_grad():
        save_safetensors(OrderedDict([("x", x), ("y", mlp(x).contiguous())]),
                         os.path.join(d, "io.safetensors"))

    emb = nn.Sequential(nn.Embedding(20, 8), nn.Linear(8, 3)).eval()
    xe = torch.randint(0, 20, (6, 5), dtype=torch.int64)
    d = os.path.join(out_dir, "server_embed")
    export(emb, d, example_input=xe[:1], name="server_embed",
           batching={"max_batch_size": 8, "max_queue_delay_us": 1000, "max_queue_size": 64})
    with torch.no_grad():
        save_safetensors(OrderedDict([("x", xe), ("y", emb(xe).contiguous())]),
                         os.path.join(d, "io.safetensors"))
