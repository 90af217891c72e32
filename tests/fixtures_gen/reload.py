"""Model directories and checkpoints for hot reload and export
(tests/check_reload.c, tests/check_export.c).

OUT/reload_mlp/       Sequential(Linear(8, 16), ReLU, Linear(16, 4)) with
                      weights set A; batching max_batch_size 8, a short
                      delay, a queue of 512.  Every weight, bias and input is
                      a small integer, so every output is an integer computed
                      exactly whatever the batch, the kernel or the order of
                      the sums: a reply can be compared bit for bit with the
                      version it names.
    io.safetensors    "x" [32, 8] inputs, "ya" and "yb": torch's outputs for
                      weights A and B
OUT/reload_ckpt/      checkpoints for reload_mlp:
    a.safetensors, b.safetensors, a.pt, b.pt    sets A and B
    b_f16.safetensors  set B as float16 (exact: small integers)
    missing.safetensors     B without "2.bias"
    unexpected.safetensors  B plus "3.weight"
    shape.safetensors       B with "0.weight" of shape [16, 9]
    garbage.safetensors     bytes that are no checkpoint
    truncated.pt            b.pt cut in half
    hostile.pt              a torch.save zip whose pickle calls os.system
OUT/reload_other/     another architecture under the same input, for a reload
                      with a new model directory: Sequential(Linear(8, 3)),
                      io.safetensors "x", "y"
OUT/export_bn/        Sequential(Linear(6, 5), BatchNorm1d(5), ReLU,
                      Linear(5, 2)) trained a little (running stats and
                      num_batches_tracked int64 non-trivial), weights.pt
"""
import io
import os
import zipfile
from collections import OrderedDict

import torch
import torch.nn as nn

from grove_export import export, save_safetensors


def _int_mlp(seed):
    g = torch.Generator().manual_seed(seed)
    m = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).eval()
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randint(-2, 3, p.shape, generator=g).float())
    return m


def generate(out_dir):
    torch.manual_seed(20261130)
    a, b = _int_mlp(1), _int_mlp(2)
    x = torch.randint(-3, 4, (32, 8)).float()
    d = os.path.join(out_dir, "reload_mlp")
    export(a, d, example_input=x[:1], name="reload_mlp",
           batching={"max_batch_size": 8, "max_queue_delay_us": 2000, "max_queue_size": 512})
    with torch.no_grad():
        save_safetensors(OrderedDict([("x", x), ("ya", a(x).contiguous()),
                                      ("yb", b(x).contiguous())]),
                         os.path.join(d, "io.safetensors"))

    c = os.path.join(out_dir, "reload_ckpt")
    os.makedirs(c, exist_ok=True)
    sa, sb = a.state_dict(), b.state_dict()
    save_safetensors(sa, os.path.join(c, "a.safetensors"))
    save_safetensors(sb, os.path.join(c, "b.safetensors"))
    torch.save(sa, os.path.join(c, "a.pt"))
    torch.save(sb, os.path.join(c, "b.pt"))
    save_safetensors(OrderedDict((k, v.half()) for k, v in sb.items()),
                     os.path.join(c, "b_f16.safetensors"))
    miss = OrderedDict(sb)
    del miss["2.bias"]
    save_safetensors(miss, os.path.join(c, "missing.safetensors"))
    extra = OrderedDict(sb)
    extra["3.weight"] = torch.ones(2, 2)
    save_safetensors(extra, os.path.join(c, "unexpected.safetensors"))
    shape = OrderedDict(sb)
    shape["0.weight"] = torch.zeros(16, 9)
    save_safetensors(shape, os.path.join(c, "shape.safetensors"))
    with open(os.path.join(c, "garbage.safetensors"), "wb") as f:
        f.write(b"\xff" * 8 + b"this is not a checkpoint" * 4)
    with open(os.path.join(c, "b.pt"), "rb") as f:
        data = f.read()
    with open(os.path.join(c, "truncated.pt"), "wb") as f:
        f.write(data[: len(data) // 2])
    # A torch.save archive whose data.pkl would run os.system under pickle.
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
        for name, data in (("hostile/data.pkl", b"\x80\x02cos\nsystem\nX\x04\x00\x00\x00true\x85R."),
                           ("hostile/version", b"3\n")):
            z.writestr(zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0)), data)
    with open(os.path.join(c, "hostile.pt"), "wb") as f:
        f.write(buf.getvalue())

    o = nn.Sequential(nn.Linear(8, 3)).eval()
    with torch.no_grad():
        for p in o.parameters():
            p.copy_(torch.randint(-2, 3, p.shape).float())
    d = os.path.join(out_dir, "reload_other")
    export(o, d, example_input=x[:1], name="reload_other",
           batching={"max_batch_size": 8, "max_queue_delay_us": 2000, "max_queue_size": 512})
    with torch.no_grad():
        save_safetensors(OrderedDict([("x", x), ("y", o(x).contiguous())]),
                         os.path.join(d, "io.safetensors"))

    bn = nn.Sequential(nn.Linear(6, 5), nn.BatchNorm1d(5), nn.ReLU(), nn.Linear(5, 2))
    bn.train()
    with torch.no_grad():
        for _ in range(3):
            bn(torch.randn(16, 6))
    bn.eval()
    export(bn, os.path.join(out_dir, "export_bn"), example_input=torch.randn(1, 6),
           weights="pt", name="export_bn")
