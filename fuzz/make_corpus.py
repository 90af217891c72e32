#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets into fuzz/corpus/NAME/ from
real PyTorch output (run with a python3 that has torch; the seeds are
committed, so `make fuzz` needs no torch).

    /usr/bin/python3 fuzz/make_corpus.py

  safetensors/  small safetensors files (the test fixtures)
  zip/          small torch.save archives (the test fixtures: stored,
                deflated, ZIP64, big-endian, protocol 4, refused kinds)
  pickle/       data.pkl of torch.save'd state_dicts whose storages are all
                256 bytes, the size of the storages fuzz_pickle.c supplies,
                plus the data.pkl of the fixtures
  spec/         model.json texts: the fixtures' (graphs, containers,
                norms, embeddings) and small models of every other layer
                kind exported here (convolutions, pools, attention,
                transformers), all with sizes under fuzz_spec.c's cap
"""
import collections
import glob
import io
import json
import os
import shutil
import sys
import zipfile

import torch
import torch.nn as nn

HERE = os.path.dirname(os.path.abspath(__file__))
FIX = os.path.join(HERE, "..", "tests", "fixtures")
sys.path.insert(0, os.path.join(HERE, "..", "tools"))


def out(name):
    d = os.path.join(HERE, "corpus", name)
    os.makedirs(d, exist_ok=True)
    return d


def data_pkl(obj, protocol=2):
    b = io.BytesIO()
    torch.save(obj, b, pickle_protocol=protocol)
    with zipfile.ZipFile(io.BytesIO(b.getvalue())) as z:
        return z.read("archive/data.pkl")


def main():
    torch.manual_seed(0)
    d = out("safetensors")
    for f in ("safetensors_dtypes.safetensors", "torch_views.safetensors",
              "torch_tied.safetensors", "torch_nested.safetensors"):
        shutil.copy(os.path.join(FIX, f), d)

    d = out("zip")
    for f in ("torch_tied.pt", "torch_views.pt", "torch_deflated.pt", "torch_zip64.pt",
              "torch_bigendian.pt", "torch_protocol4.pt", "torch_nested_model.pt",
              "torch_os_system.pt", "torch_legacy.pt", "torch_meta.pt", "torch_quantized.pt"):
        shutil.copy(os.path.join(FIX, f), d)

    d = out("pickle")
    # Every storage 256 bytes: the key order is the order of first use.
    base = torch.arange(64, dtype=torch.float32).reshape(8, 8)
    views = collections.OrderedDict(
        w=base, t=base.t(), row=base[2], col=base[:, 3], tail=base.view(-1)[60:])
    dtypes = collections.OrderedDict(
        f16=torch.randn(128).half(), bf16=torch.randn(128).bfloat16(),
        f64=torch.randn(32, dtype=torch.float64), i64=torch.arange(32),
        i32=torch.arange(64, dtype=torch.int32), u8=torch.arange(256).to(torch.uint8),
        b=torch.ones(256, dtype=torch.bool), p=torch.nn.Parameter(torch.randn(4, 16)))
    lin = torch.nn.Linear(8, 8, bias=False)
    bn = torch.nn.BatchNorm1d(64)
    tied = torch.nn.ModuleDict({"a": lin, "b": torch.nn.Linear(8, 8, bias=False)})
    tied["b"].weight = lin.weight
    bn_sd = bn.state_dict()  # keeps _metadata; its 256-byte buffers only
    del bn_sd["num_batches_tracked"]
    seeds = {
        "views.pkl": data_pkl(views),
        "dtypes.pkl": data_pkl(dtypes),
        "dtypes_p4.pkl": data_pkl(dtypes, protocol=4),
        "tied.pkl": data_pkl(tied.state_dict()),
        "nested.pkl": data_pkl({"state_dict": views, "epoch": 3, "lr": 0.5, "tags": {1, 2},
                                "blob": b"\x00\xff", "big": 2 ** 70, "none": None}),
        "model.pkl": data_pkl({"model": {"w": base}}),
        "module.pkl": data_pkl({"module": {"w": base, "n": "text"}}),
        "metadata.pkl": data_pkl(bn_sd),
        "empty.pkl": data_pkl(collections.OrderedDict()),
    }
    for name, data in seeds.items():
        with open(os.path.join(d, name), "wb") as f:
            f.write(data)
    for f in ("torch_dtypes.pt", "torch_os_system.pt", "torch_whole_module.pt",
              "torch_sparse.pt", "torch_complex.pt"):
        with zipfile.ZipFile(os.path.join(FIX, f)) as z:
            pkl = [n for n in z.namelist() if n.endswith("/data.pkl")][0]
            with open(os.path.join(d, f[:-3] + ".pkl"), "wb") as o:
                o.write(z.read(pkl))

    d = out("spec")
    for f in sorted(glob.glob(os.path.join(FIX, "graph_*.json")) +
                    glob.glob(os.path.join(FIX, "*", "model.json"))):
        name = os.path.relpath(f, FIX).replace(os.sep, "_")
        shutil.copy(f, os.path.join(d, name))
    from grove_export import build_spec
    small = {
        "conv": (nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
                               nn.MaxPool2d(2), nn.Conv2d(4, 4, 3, groups=2, dilation=2),
                               nn.AvgPool2d(2, ceil_mode=True), nn.AdaptiveAvgPool2d(1),
                               nn.Flatten(), nn.Linear(4, 2)), torch.randn(1, 3, 12, 12)),
        "conv1d": (nn.Sequential(nn.Conv1d(2, 3, 3, stride=2, padding=1), nn.GELU(),
                                 nn.Flatten(), nn.LayerNorm(27)), torch.randn(1, 2, 17)),
        "attention": (nn.TransformerEncoder(
            nn.TransformerEncoderLayer(8, 2, 16, dropout=0.1, batch_first=True, norm_first=True),
            2, enable_nested_tensor=False), torch.randn(1, 5, 8)),
        "encoder_layer": (nn.TransformerEncoderLayer(8, 2, 16, activation="gelu"),
                          torch.randn(5, 1, 8)),
    }
    for name, (m, x) in small.items():
        with open(os.path.join(d, name + ".json"), "w") as f:
            json.dump(build_spec(m.eval(), x), f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
