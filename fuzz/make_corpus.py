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

Hostile seeds (issue 15), in zip/ (as archives) and pickle/ (their
data.pkl): views whose last index is exactly 2^64 - 1 (shape [3], offset 1,
stride 2^63 - 1; a bias of shape [5], offset 3, stride 2^62 - 1), eight
zeros(1).expand(2**24) as torch.save writes them, and an archive whose two
records overlap; in safetensors/, zero-size tensors and a file that is not
safetensors at all.  fuzz/*.dict are the dictionaries mk/fuzz.mk passes
(-dict=): opcodes and integers near 2^31, 2^62, 2^63 and 2^64.
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


def pk_int(v):
    """A pickle int: BININT1 / BININT (fits 32 bits signed) or LONG1 (8 or 9
    bytes little-endian two's complement, as pickle writes 2^63 and up)."""
    if 0 <= v < 256:
        return b"K" + bytes([v])
    if -2 ** 31 <= v < 2 ** 31:
        return b"J" + v.to_bytes(4, "little", signed=True)
    n = (v.bit_length() + 8) // 8
    return b"\x8a" + bytes([n]) + v.to_bytes(n, "little", signed=True)


def pk_str(s):
    b = s.encode()
    return b"X" + len(b).to_bytes(4, "little") + b


def pk_tuple(vals):
    return b"(" + b"".join(pk_int(v) for v in vals) + b"t"


def pk_view(key, storage, numel, offset, shape, stride):
    """key: _rebuild_tensor_v2(('storage', FloatStorage, storage, 'cpu',
    numel), offset, shape, stride, False, OrderedDict()), as torch.save."""
    return (pk_str(key) + b"ctorch._utils\n_rebuild_tensor_v2\n((" + pk_str("storage") +
            b"ctorch\nFloatStorage\n" + pk_str(storage) + pk_str("cpu") + pk_int(numel) +
            b"tQ" + pk_int(offset) + pk_tuple(shape) + pk_tuple(stride) +
            b"\x89ccollections\nOrderedDict\n)RtR")


def pk_state_dict(items):
    return (b"\x80\x02ccollections\nOrderedDict\n)R(" + b"".join(items) + b"u.")


def archive(pkl, storages):
    """A torch.save-like archive (stored records) of data.pkl and storages."""
    b = io.BytesIO()
    with zipfile.ZipFile(b, "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", pkl)
        for i, data in enumerate(storages):
            z.writestr("archive/data/%d" % i, data)
        z.writestr("archive/version", "3\n")
    return b.getvalue()


def hostile_seeds():
    """Views that wrap the bounds check, expanded views, overlapping records
    (issue 15).  Storages are 256 bytes (64 floats), as fuzz_pickle.c's."""
    st = bytes(range(256))
    wrap = pk_state_dict([pk_view("w", "0", 64, 1, [3], [2 ** 63 - 1])])
    bias = pk_state_dict([pk_view("bias", "0", 64, 3, [5], [2 ** 62 - 1])])
    wrap2 = pk_state_dict([pk_view("w", "0", 64, 0, [3, 2], [2 ** 63 - 1, 1])])
    expanded = collections.OrderedDict(
        ("e%d" % i, torch.zeros(1).expand(2 ** 24)) for i in range(8))
    zips, pkls = {}, {}
    for name, pkl in (("view_wrap", wrap), ("view_bias_wrap", bias), ("view_wrap_2d", wrap2)):
        pkls[name + ".pkl"] = pkl
        zips[name + ".pt"] = archive(pkl, [st])
    b = io.BytesIO()
    torch.save(expanded, b)
    zips["expanded_views.pt"] = b.getvalue()
    with zipfile.ZipFile(io.BytesIO(b.getvalue())) as z:
        pkls["expanded_views.pkl"] = z.read("archive/data.pkl")
    # Two records where the first one's data is the second one, header and
    # all: what zip bombs of overlapping entries do.
    inner = io.BytesIO()
    with zipfile.ZipFile(inner, "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data/0", st)
    inner_bytes = inner.getvalue()
    local_b = inner_bytes[:inner_bytes.index(b"PK\x01\x02")]
    zips["overlapping_records.pt"] = overlapping_zip(wrap, local_b)
    return zips, pkls


def overlapping_zip(pkl, inner_record):
    """data.pkl stored, then a record 'archive/data/0' nested inside the data
    of a record 'archive/outer' (its local header and data counted twice)."""
    import struct
    import zlib
    out = bytearray()
    cds = []

    def local(name, data):
        off = len(out)
        out.extend(struct.pack("<IHHHHHIIIHH", 0x04034b50, 20, 0, 0, 0, 0,
                               zlib.crc32(data), len(data), len(data), len(name), 0))
        out.extend(name)
        out.extend(data)
        return off

    def central(name, data, off):
        cds.append(struct.pack("<IHHHHHHIIIHHHHHII", 0x02014b50, 20, 20, 0, 0, 0, 0,
                               zlib.crc32(data), len(data), len(data), len(name), 0, 0, 0, 0,
                               0, off) + name)

    central(b"archive/data.pkl", pkl, local(b"archive/data.pkl", pkl))
    outer_off = local(b"archive/outer", inner_record)
    central(b"archive/outer", inner_record, outer_off)
    inner_off = outer_off + 30 + len(b"archive/outer")
    st = inner_record[30 + len(b"archive/data/0"):]
    central(b"archive/data/0", st, inner_off)
    central(b"archive/version", b"3\n", local(b"archive/version", b"3\n"))
    cd_off = len(out)
    for c in cds:
        out.extend(c)
    out.extend(struct.pack("<IHHHHIIH", 0x06054b50, 0, 0, len(cds), len(cds),
                           len(out) - cd_off, cd_off, 0))
    return bytes(out)


def safetensors_seeds():
    """Zero-size tensors (the shape of the million-tensor file, small) and a
    file that is not safetensors (text whose first 8 bytes are a huge
    header length)."""
    hdr = {"t%d" % i: {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]}
           for i in range(64)}
    hdr["__metadata__"] = {"format": "pt"}
    h = json.dumps(hdr, separators=(",", ":")).encode()
    return {"zero_size_tensors.safetensors": len(h).to_bytes(8, "little") + h,
            "not_safetensors.safetensors": b"TOKEN=hunter2-not-a-checkpoint\n"}


def dict_line(name, data):
    esc = "".join(chr(c) if 32 <= c < 127 and chr(c) not in '"\\' else "\\x%02x" % c
                  for c in data)
    return '%s="%s"' % (name, esc)


# Integers a hostile offset, size or stride is made of: around 2^31 (BININT
# is signed 32-bit), 2^32, 2^40, 2^62, 2^63 and 2^64 - 1 (LONG1 of 8 and 9
# bytes), and small negatives.
HOSTILE_INTS = sorted({v for b in (31, 32, 40, 48, 61, 62, 63, 64)
                       for v in (2 ** b - 1, 2 ** b, 2 ** b + 1)} |
                      {-1, -2, -2 ** 31, -2 ** 63, 0, 1, 255, 256, 65535})


def pickle_dict_lines():
    lines = ["# pickle opcodes and values torch.save writes (fuzz/make_corpus.py)"]
    for v in HOSTILE_INTS:
        lines.append(dict_line("int_%s" % str(v).replace("-", "m"), pk_int(v)))
        if -2 ** 63 <= v < 2 ** 64:  # also as a raw LONG1 of 8 bytes, wrapping
            lines.append(dict_line("long8_%s" % str(v).replace("-", "m"),
                                   b"\x8a\x08" + (v % 2 ** 64).to_bytes(8, "little")))
    for name, tok in (("proto2", b"\x80\x02"), ("proto4", b"\x80\x04"),
                      ("rebuild_v2", b"ctorch._utils\n_rebuild_tensor_v2\n"),
                      ("rebuild_param", b"ctorch._utils\n_rebuild_parameter\n"),
                      ("float_storage", b"ctorch\nFloatStorage\n"),
                      ("untyped_storage", b"ctorch\nUntypedStorage\n"),
                      ("ordered_dict", b"ccollections\nOrderedDict\n"),
                      ("storage", pk_str("storage")), ("cpu", pk_str("cpu")),
                      ("key0", pk_str("0")), ("persid", b"Q"), ("reduce", b"R"),
                      ("newfalse", b"\x89"), ("mark", b"("), ("tuple", b"t"),
                      ("tuple1", b"\x85"), ("tuple2", b"\x86"), ("setitems", b"u"),
                      ("empty_dict", b"}"), ("build", b"b"), ("stop", b".")):
        lines.append(dict_line(name, tok))
    return lines


def write_dicts():
    """fuzz/pickle.dict, fuzz/zip.dict (zip structure, plus the pickle's:
    the zip target reads data.pkl too) and fuzz/safetensors.dict."""
    pk = pickle_dict_lines()
    zp = ["# zip records (fuzz/make_corpus.py)"]
    for name, tok in (("local", b"PK\x03\x04"), ("central", b"PK\x01\x02"),
                      ("eocd", b"PK\x05\x06"), ("eocd64", b"PK\x06\x06"),
                      ("loc64", b"PK\x06\x07"), ("zip64_extra", b"\x01\x00"),
                      ("u16_max", b"\xff\xff"), ("u32_max", b"\xff\xff\xff\xff"),
                      ("u32_2_31", b"\x00\x00\x00\x80"), ("u64_max", b"\xff" * 8),
                      ("u64_2_63", b"\x00" * 7 + b"\x80"),
                      ("u64_2_62", b"\x00" * 7 + b"\x40"),
                      ("data_pkl", b"archive/data.pkl"), ("data_0", b"archive/data/0"),
                      ("version", b"archive/version"), ("deflated", b"\x08\x00")):
        zp.append(dict_line(name, tok))
    sf = ["# safetensors headers (fuzz/make_corpus.py)"]
    for tok in ('"dtype"', '"shape"', '"data_offsets"', '"__metadata__"', '"F32"', '"BF16"',
                '"I64"', '[0,0]', '{"dtype":"F32","shape":[0],"data_offsets":[0,0]}'):
        sf.append('"%s"' % tok.replace("\\", "\\\\").replace('"', '\\"'))
    for v in HOSTILE_INTS:
        if v >= 0:
            sf.append('"%d"' % v)
    for name, lines in (("pickle", pk), ("zip", zp + pk[1:]), ("safetensors", sf)):
        with open(os.path.join(HERE, name + ".dict"), "w") as f:
            f.write("\n".join(lines) + "\n")


def main():
    write_dicts()
    torch.manual_seed(0)
    d = out("safetensors")
    for f in ("safetensors_dtypes.safetensors", "torch_views.safetensors",
              "torch_tied.safetensors", "torch_nested.safetensors"):
        shutil.copy(os.path.join(FIX, f), d)

    d = out("zip")
    for f in ("torch_tied.pt", "torch_views.pt", "torch_deflated.pt", "torch_zip64.pt",
              "torch_bigendian.pt", "torch_protocol4.pt", "torch_nested_model.pt",
              "torch_os_system.pt", "torch_legacy.pt", "torch_legacy_views.pt", "torch_meta.pt",
              "torch_quantized.pt"):
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

    zips, pkls = hostile_seeds()
    for name, data in zips.items():
        with open(os.path.join(out("zip"), name), "wb") as f:
            f.write(data)
    for name, data in pkls.items():
        with open(os.path.join(out("pickle"), name), "wb") as f:
            f.write(data)
    for name, data in safetensors_seeds().items():
        with open(os.path.join(out("safetensors"), name), "wb") as f:
            f.write(data)

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
        "lstm": (nn.LSTM(4, 6, num_layers=2, bidirectional=True, proj_size=3, batch_first=True),
                 torch.randn(1, 5, 4)),
        "gru": (nn.GRU(3, 5, num_layers=2), torch.randn(4, 1, 3)),
        "rnn": (nn.RNN(3, 4, nonlinearity="relu", bias=False, batch_first=True),
                torch.randn(1, 4, 3)),
        "embedding_bag": (nn.Sequential(nn.EmbeddingBag(10, 4, mode="max", padding_idx=1),
                                        nn.Linear(4, 2)), torch.zeros(1, 3, dtype=torch.int64)),
    }
    for name, (m, x) in small.items():
        with open(os.path.join(d, name + ".json"), "w") as f:
            json.dump(build_spec(m.eval(), x), f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
