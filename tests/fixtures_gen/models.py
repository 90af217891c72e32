"""Model-directory fixtures for tests/check_spec.c: real torch models
exported with tools/grove_export.py, each with torch's own output on a fixed
input.

For each NAME below, OUT/models_NAME/ is a model directory (model.json +
weights.safetensors, as export() writes it) plus io.safetensors holding
  "x"          the input (float32, or int64 for an Embedding front end)
  "y"          torch's output for x, in eval mode
  "y:PATH"     (models_containers only) the output of the submodule at
               dotted PATH for x, since that tree as a whole has no forward.
tests/check_spec.c opens each directory with grove_model_open, runs x and
compares with y (rtol 1e-4, atol 1e-5), and compares the loaded tree's
state_dict keys with the weights file's (torch's order).
"""
import os
from collections import OrderedDict

import torch
import torch.nn as nn

from grove_export import export, save_safetensors


def _randomize(model, gen):
    """Gives every parameter and buffer non-trivial values: norms' weights
    away from 1 and biases away from 0, BatchNorm running statistics from a
    few training-mode batches, so that a layer that ignored one of them
    would show."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or p.dim() == 1:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5 + (1.0 if name.endswith("weight") else 0.0))
        for m in model.modules():
            if isinstance(m, nn.BatchNorm1d) and m.track_running_stats:
                m.running_mean.copy_(torch.randn(m.num_features, generator=gen) * 0.3)
                m.running_var.copy_(torch.rand(m.num_features, generator=gen) + 0.5)
                m.num_batches_tracked.fill_(7)


def mlp():
    return nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10)), torch.randn(5, 64)


def nested():
    shared = nn.Linear(32, 32)
    model = nn.Sequential(OrderedDict([
        ("stem", nn.Sequential(OrderedDict([("fc", nn.Linear(16, 32)),
                                            ("act", nn.LeakyReLU(0.2))]))),
        ("body", nn.Sequential(shared, nn.Tanh(), nn.Dropout(0.3),
                               nn.Sequential(nn.Identity(), shared, nn.SiLU()), nn.Flatten())),
        ("head", nn.Sequential(OrderedDict([("fc", nn.Linear(32, 8)), ("gate", nn.Sigmoid()),
                                            ("out", nn.Softmax(dim=-1))]))),
    ]))
    return model, torch.randn(6, 16)


def norms():
    model = nn.Sequential(
        nn.Flatten(), nn.Linear(12, 24), nn.BatchNorm1d(24), nn.GELU(), nn.LayerNorm(24),
        nn.Linear(24, 6), nn.GELU(approximate="tanh"), nn.LayerNorm([6], elementwise_affine=False),
        nn.BatchNorm1d(6, affine=False, eps=1e-3), nn.LogSoftmax(dim=1))
    return model, torch.randn(7, 3, 4)


def embed():
    model = nn.Sequential(nn.Embedding(50, 16, padding_idx=-3), nn.LayerNorm(16), nn.Linear(16, 8),
                          nn.ReLU())
    x = torch.randint(0, 50, (4, 7), dtype=torch.int64)
    x[0, 2] = 47  # the padding row
    return model, x


def tied():
    model = nn.Sequential(OrderedDict([
        ("embed", nn.Embedding(30, 12)),
        ("mix", nn.Linear(12, 12)),
        ("act", nn.Tanh()),
        ("decode", nn.Linear(12, 30, bias=False)),
        ("out", nn.LogSoftmax(dim=-1)),
    ]))
    model.decode.weight = model.embed.weight
    return model, torch.randint(0, 30, (3, 5), dtype=torch.int64)


def containers():
    """A tree with ModuleDict and ModuleList inside: it has no forward as a
    whole (torch's Sequential would call the ModuleDict), so the test builds
    and loads it and runs the callable submodules listed in SUBPATHS."""
    model = nn.Sequential(OrderedDict([
        ("enc", nn.Sequential(nn.Linear(8, 8), nn.ReLU())),
        ("heads", nn.ModuleDict(OrderedDict([
            ("cls", nn.Sequential(nn.Linear(8, 3), nn.LogSoftmax(dim=-1))),
            ("reg", nn.Linear(8, 1)),
        ]))),
        ("blocks", nn.ModuleList([nn.Linear(8, 8), nn.LayerNorm(8), nn.ModuleList([nn.Linear(8, 8)])])),
    ]))
    return model, torch.randn(4, 8)


CONTAINER_SUBPATHS = ["enc", "heads.cls", "heads.reg", "blocks.0", "blocks.1", "blocks.2.0"]

MODELS = {"mlp": mlp, "nested": nested, "norms": norms, "embed": embed, "tied": tied,
          "containers": containers}


def _find(model, path):
    m = model
    for part in path.split("."):
        m = m[int(part)] if isinstance(m, (nn.Sequential, nn.ModuleList)) and part.isdigit() \
            else getattr(m, part) if not isinstance(m, nn.ModuleDict) else m[part]
    return m


def generate(out_dir):
    torch.manual_seed(20240611)
    gen = torch.Generator().manual_seed(7)
    for name, build in MODELS.items():
        model, x = build()
        _randomize(model, gen)
        model.eval()
        d = os.path.join(out_dir, f"models_{name}")
        io = OrderedDict([("x", x)])
        with torch.no_grad():
            if name == "containers":
                export(model, d, batching={"max_batch_size": 8}, require_callable=False)
                for sub in CONTAINER_SUBPATHS:
                    io[f"y:{sub}"] = _find(model, sub)(x).contiguous()
            else:
                export(model, d, example_input=x,
                       batching={"max_batch_size": 16, "max_queue_delay_us": 200})
                io["y"] = model(x).contiguous()
        save_safetensors(io, os.path.join(d, "io.safetensors"))
