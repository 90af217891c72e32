"""Fixtures of forward-hook telemetry (tests/check_telemetry.c).

OUT/telemetry_net/      Sequential(
                          0 Linear(12, 24), 1 BatchNorm1d(24), 2 ReLU,
                          3 Sequential(0 Linear(24, 16), 1 Tanh,
                                       2 Sequential(0 Linear(16, 16), 1 ReLU),
                                       3 GELU),
                          4 Linear(16, 6), 5 Sigmoid)
                        eval mode, BatchNorm with non-trivial running
                        statistics; "3.2" is a Linear followed by a ReLU,
                        which Grove fuses unless something watches them.
    io.safetensors      "x" [16, 12], the input of one predict (one batch)
    stats.json          what torch forward hooks and forward pre-hooks see on
                        every module for x (root "" included): count, mean,
                        std (unbiased), min, max, abs_mean, zero_fraction,
                        nan/inf counts, a 10-bin histogram over [-2, 2) with
                        the values below and above, and per-column mean and
                        std of 2-D tensors
OUT/telemetry_net_v2/   the same names except that module 3 is
                        Sequential(0 Linear(24, 16), 1 Tanh): what a hot
                        reload to another architecture serves ("3.2.0" no
                        longer exists, "3.*" matches fewer modules)
Statistics are computed in float64 from the float32 tensors torch hands the
hooks, as Grove's server computes them from its own.
"""
import json
import os
from collections import OrderedDict

import torch
import torch.nn as nn

from grove_export import export, save_safetensors

HIST_BINS, HIST_MIN, HIST_MAX = 10, -2.0, 2.0


def stats_of(t):
    x = t.detach().to(torch.float64).reshape(-1)
    finite = x[torch.isfinite(x)]
    n = finite.numel()
    out = {
        "count": x.numel(),
        "mean": finite.mean().item() if n else 0.0,
        "std": finite.std().item() if n > 1 else 0.0,
        "min": finite.min().item() if n else 0.0,
        "max": finite.max().item() if n else 0.0,
        "abs_mean": finite.abs().mean().item() if n else 0.0,
        "zero_fraction": (x == 0).sum().item() / max(x.numel(), 1),
        "nan_count": torch.isnan(x).sum().item(),
        "inf_count": torch.isinf(x).sum().item(),
        "shape": list(t.shape),
    }
    nn_ = x[~torch.isnan(x)]
    below = int((nn_ < HIST_MIN).sum().item())
    above = int((nn_ >= HIST_MAX).sum().item())
    inside = nn_[(nn_ >= HIST_MIN) & (nn_ < HIST_MAX)]
    idx = ((inside - HIST_MIN) * (HIST_BINS / (HIST_MAX - HIST_MIN))).floor().long()
    idx = idx.clamp(0, HIST_BINS - 1)
    out["histogram"] = torch.bincount(idx, minlength=HIST_BINS).tolist()
    out["histogram_below"] = below
    out["histogram_above"] = above
    if t.dim() == 2:
        f = t.detach().to(torch.float64)
        out["feature_mean"] = f.mean(dim=0).tolist()
        out["feature_std"] = f.std(dim=0).tolist() if f.shape[0] > 1 else [0.0] * f.shape[1]
    return out


def net(v2=False):
    inner = [nn.Linear(24, 16), nn.Tanh()]
    if not v2:
        inner += [nn.Sequential(nn.Linear(16, 16), nn.ReLU()), nn.GELU()]
    m = nn.Sequential(nn.Linear(12, 24), nn.BatchNorm1d(24), nn.ReLU(), nn.Sequential(*inner),
                      nn.Linear(16, 6), nn.Sigmoid())
    with torch.no_grad():
        bn = m[1]
        bn.running_mean.copy_(torch.randn(24) * 0.5)
        bn.running_var.copy_(torch.rand(24) + 0.5)
        bn.weight.copy_(torch.randn(24) * 0.3 + 1.0)
        bn.bias.copy_(torch.randn(24) * 0.2)
    return m.eval()


def generate(out_dir):
    torch.manual_seed(7007)
    m = net()
    x = torch.randn(16, 12) * 1.5
    seen = OrderedDict()

    def fwd_hook(name):
        def h(mod, inp, out):
            seen.setdefault(name, {})["forward"] = stats_of(out)
        return h

    def pre_hook(name):
        def h(mod, inp):
            seen.setdefault(name, {})["forward_pre"] = stats_of(inp[0])
        return h

    handles = []
    for name, mod in m.named_modules():
        handles.append(mod.register_forward_hook(fwd_hook(name)))
        handles.append(mod.register_forward_pre_hook(pre_hook(name)))
    with torch.no_grad():
        m(x)
    for h in handles:
        h.remove()

    d = os.path.join(out_dir, "telemetry_net")
    export(m, d, example_input=x[:1], name="telemetry_net",
           batching={"max_batch_size": 64, "max_queue_delay_us": 100, "max_queue_size": 4096})
    save_safetensors(OrderedDict([("x", x.contiguous())]), os.path.join(d, "io.safetensors"))
    with open(os.path.join(d, "stats.json"), "w") as f:
        json.dump({"histogram_bins": HIST_BINS, "histogram_min": HIST_MIN,
                   "histogram_max": HIST_MAX, "modules": seen}, f, indent=1)

    torch.manual_seed(7008)
    export(net(v2=True), os.path.join(out_dir, "telemetry_net_v2"), example_input=x[:1],
           name="telemetry_net",
           batching={"max_batch_size": 64, "max_queue_delay_us": 100, "max_queue_size": 4096})
