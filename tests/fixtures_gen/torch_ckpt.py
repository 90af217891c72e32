"""Fixtures for check_torch (core/torch_*.c, core/io/pickle.c): checkpoints
written by real torch.save, each beside a safetensors file of the same
tensors (contiguous, by tools/grove_export.py's save_safetensors) that the C
test compares with bit for bit, and files Grove must refuse.

    torch_ckpt.json
      {"read":    {"FILE.pt": {"safetensors": "FILE.safetensors",
                               "shared": [[key, key, ...], ...],
                               "metadata": {prefix: version, ...}}},
       "refused": {"FILE.pt": {"status": "GROVE_E_...", "mentions": [text]}}}

"shared" lists the keys whose tensors Grove must put on one storage:
contiguous views of one torch storage (tied weights, slices).  "mentions"
are substrings the error message must hold (the key, the global).

Besides torch.save's own output (protocol 2 and 4, tied weights, views,
every dtype, nested checkpoints, a state_dict of hundreds of keys, the
legacy format of PyTorch before 1.6, its storage keys renamed from object
addresses to indexes), some
archives are rewritten with Python's zipfile: deflated, ZIP64, big-endian
(storages byte-swapped, "byteorder" = "big").  The deflated and ZIP64 ones
are checked to load in torch here.  torch_os_system.pt is a real exploit:
torch.load without weights_only runs `touch "$GROVE_PWNED_MARKER"`, which
this generator verifies; Grove must refuse it and run nothing.
"""
import collections
import io
import json
import os
import pickle
import tempfile
import zipfile

from grove_export import save_safetensors

_DATE = (1980, 1, 1, 0, 0, 0)
MARKER_CMD = 'touch "${GROVE_PWNED_MARKER:-grove_pwned.marker}"'


class _Any(dict):
    """Whatever a global of the legacy pickle builds, when only its layout
    matters (takes any arguments, items and state)."""

    def __init__(self, *args, **kwargs):
        super().__init__()

    def __setstate__(self, state):
        pass


def _legacy_save(obj, path):
    """torch.save in the legacy format (_use_new_zipfile_serialization=False),
    with its storage keys made deterministic: torch names them by object
    address.  Each key is a decimal string in a BINUNICODE; it is replaced,
    everywhere, by its index in the key list padded to the same length, so
    every length prefix stays right, and torch must read the result back.
    The list (and the storages' bytes) keep torch's order, which follows the
    addresses: a file may still differ from run to run in that order."""
    import torch
    buf = io.BytesIO()
    torch.save(obj, buf, _use_new_zipfile_serialization=False)
    data = buf.getvalue()
    # The key list is the pickle after the saved object.
    f = io.BytesIO(data)
    for _ in range(3):
        pickle.load(f)

    class _Skip(pickle.Unpickler):
        def persistent_load(self, pid):
            return None

        def find_class(self, module, name):
            return _Any

    _Skip(f).load()
    keys = pickle.load(f)
    for i, k in enumerate(keys):
        new = str(i).rjust(len(k), "0")
        old_b = b"X" + len(k).to_bytes(4, "little") + k.encode()
        new_b = b"X" + len(new).to_bytes(4, "little") + new.encode()
        data = data.replace(old_b, new_b)
    with open(path, "wb") as out:
        out.write(data)


def _metadata(sd):
    meta = getattr(sd, "_metadata", None) or {}
    return {k: v["version"] for k, v in meta.items() if isinstance(v, dict) and "version" in v}


def _shared(sd):
    """Groups of keys whose tensors are contiguous views of one storage."""
    groups = collections.OrderedDict()
    for k, v in sd.items():
        if v.is_contiguous() and v.numel() > 0:
            groups.setdefault(v.storage().data_ptr(), []).append(k)
    return [g for g in groups.values() if len(g) > 1]


def _records(path):
    with zipfile.ZipFile(path) as z:
        return [(i.filename, z.read(i.filename)) for i in z.infolist()]


def _rewrite(src, dst, records=None, compression=zipfile.ZIP_STORED, zip64=False):
    """Writes the records of src (or the given ones) into a new archive."""
    if records is None:
        records = _records(src)
    with zipfile.ZipFile(dst, "w", compression=compression) as z:
        for name, data in records:
            info = zipfile.ZipInfo(name, date_time=_DATE)
            info.compress_type = compression
            with z.open(info, "w", force_zip64=zip64) as f:
                f.write(data)


def generate(out_dir):
    import torch
    import torch.nn as nn

    def p(name):
        return os.path.join(out_dir, name)

    g = torch.Generator().manual_seed(20240611)
    expected = {"read": {}, "refused": {}}

    def read_case(name, obj, sd, legacy=False, **save_kw):
        if legacy:
            _legacy_save(obj, p(name + ".pt"))
            back = torch.load(p(name + ".pt"))
            back = back.get("state_dict", back)
            assert list(back) == list(sd) and all(torch.equal(back[k], sd[k]) for k in sd)
        else:
            torch.save(obj, p(name + ".pt"), **save_kw)
        save_safetensors(collections.OrderedDict((k, v.detach()) for k, v in sd.items()),
                         p(name + ".safetensors"))
        expected["read"][name + ".pt"] = {
            "safetensors": name + ".safetensors",
            "shared": _shared(sd),
            "metadata": _metadata(sd),
        }

    def refused(name, status, mentions):
        expected["refused"][name] = {"status": status, "mentions": mentions}

    # Every dtype, a Parameter (_rebuild_parameter), a 0-d and an empty tensor.
    dtypes = collections.OrderedDict()
    dtypes["f32"] = torch.randn(3, 4, generator=g)
    dtypes["f16"] = torch.randn(2, 3, generator=g).half()
    dtypes["bf16"] = torch.randn(5, generator=g).bfloat16()
    dtypes["f64"] = torch.randn(2, 2, generator=g, dtype=torch.float64)
    dtypes["i64"] = torch.tensor([-(2 ** 40), -1, 0, 7, 2 ** 62])
    dtypes["i32"] = torch.tensor([[-5, 6], [2 ** 31 - 1, -(2 ** 31)]], dtype=torch.int32)
    dtypes["i16"] = torch.tensor([-300, 300, 1], dtype=torch.int16)
    dtypes["i8"] = torch.tensor([-128, 0, 127], dtype=torch.int8)
    dtypes["u8"] = torch.tensor([0, 1, 255], dtype=torch.uint8)
    dtypes["mask"] = torch.tensor([[True, False, True], [False, False, True]])
    dtypes["param"] = nn.Parameter(torch.randn(2, 2, generator=g))
    dtypes["scalar"] = torch.tensor(3.5)
    dtypes["empty"] = torch.zeros(0, 3)
    dtypes["emb.\u00f1"] = torch.randn(1, 2, generator=g)
    read_case("torch_dtypes", dtypes, dtypes)

    # The same with pickle protocol 4 (FRAME, MEMOIZE, STACK_GLOBAL, ...).
    read_case("torch_protocol4", dtypes, dtypes, pickle_protocol=4)

    # Views: tied weights of a module, slices, a transpose, a column, an
    # expanded (stride 0) tensor.
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(5, 4)
            self.norm = nn.BatchNorm1d(4)
            self.out = nn.Linear(4, 5, bias=False)
            self.out.weight = self.emb.weight

    torch.manual_seed(7)
    tied = Tied().state_dict()
    read_case("torch_tied", tied, tied)

    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    views = collections.OrderedDict()
    views["base"] = base
    views["transposed"] = base.t()
    views["narrow"] = base[1:3]
    views["column"] = base[:, 2]
    views["tail"] = base.view(-1)[20:]
    views["expanded"] = torch.tensor([1.0, 2.0, 3.0]).expand(2, 3)
    views["half_t"] = torch.randn(3, 2, generator=g).half().t()
    read_case("torch_views", views, views)

    # Nested checkpoints: {"state_dict": ..., "epoch": 3, "optimizer": ...}.
    torch.manual_seed(11)
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.ReLU(), nn.Linear(4, 2))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(torch.randn(5, 3)).sum().backward()
    opt.step()
    sd = model.state_dict()
    ckpt = {"state_dict": sd, "epoch": 3, "optimizer": opt.state_dict(), "best": 0.25,
            "name": "run-1", "history": [1.5, 0.75, None, True], "big": 2 ** 70}
    read_case("torch_nested", ckpt, sd)
    read_case("torch_nested_model", {"model": sd, "step": 10}, sd)

    # A few hundred keys, BatchNorm metadata (version 2) among them.
    torch.manual_seed(13)
    many = nn.Sequential(*[nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)) for _ in range(60)])
    many_sd = many.state_dict()
    assert len(many_sd) >= 400
    read_case("torch_many", many_sd, many_sd)

    # Rewritten archives, compared with torch_dtypes.safetensors.
    def rewritten_case(name, **kw):
        _rewrite(p("torch_dtypes.pt"), p(name + ".pt"), **kw)
        back = torch.load(p(name + ".pt"), weights_only=True)
        assert list(back) == list(dtypes) and all(torch.equal(back[k], dtypes[k]) for k in dtypes)
        expected["read"][name + ".pt"] = dict(expected["read"]["torch_dtypes.pt"])

    rewritten_case("torch_deflated", compression=zipfile.ZIP_DEFLATED)
    rewritten_case("torch_zip64", zip64=True)

    # Big-endian: each storage (one per key here, keys in order) swapped.
    recs = _records(p("torch_dtypes.pt"))
    folder = recs[0][0].split("/")[0]
    swapped = []
    sizes = {str(i): v.element_size() for i, v in enumerate(dtypes.values())}
    for name, data in recs:
        key = name[len(folder) + len("/data/"):] if name.startswith(folder + "/data/") else None
        if key is not None:
            es = sizes[key]
            arr = bytearray(data)
            for i in range(0, len(arr), es):
                arr[i:i + es] = arr[i:i + es][::-1]
            data = bytes(arr)
        swapped.append((name, data))
        if name.endswith("/data.pkl"):
            swapped.append((folder + "/byteorder", b"big"))
    _rewrite(None, p("torch_bigendian.pt"), records=swapped)
    expected["read"]["torch_bigendian.pt"] = dict(expected["read"]["torch_dtypes.pt"])

    # The legacy format (PyTorch before 1.6, _use_new_zipfile_serialization=
    # False): every dtype, the views, tied weights, a nested checkpoint.
    read_case("torch_legacy", dtypes, dtypes, legacy=True)
    read_case("torch_legacy_views", views, views, legacy=True)
    read_case("torch_legacy_tied", tied, tied, legacy=True)
    read_case("torch_legacy_nested", ckpt, sd, legacy=True)

    # ---------------------------------------------------------- refused

    # A module without constants: scripting nn.Linear writes its Final
    # constants in set order, which changes with Python's hash seed.
    class Scale(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.tensor([1.0, 2.0]))

        def forward(self, x):
            return x * self.w

    torch.jit.save(torch.jit.script(Scale()), p("torch_script.pt"))
    refused("torch_script.pt", "GROVE_E_UNSUPPORTED", ["TorchScript", "torch.jit.load"])

    torch.save(nn.Linear(2, 2), p("torch_whole_module.pt"))
    refused("torch_whole_module.pt", "GROVE_E_REFUSED",
            ["torch.nn.modules.linear.Linear", "state_dict()"])

    torch.save({"w": torch.ones(2), "qweight": torch.quantize_per_tensor(
        torch.tensor([0.5, 1.0]), 0.1, 0, torch.qint8)}, p("torch_quantized.pt"))
    refused("torch_quantized.pt", "GROVE_E_UNSUPPORTED", ["'qweight'", "quantized"])

    torch.save({"adj": torch.eye(3).to_sparse()}, p("torch_sparse.pt"))
    refused("torch_sparse.pt", "GROVE_E_UNSUPPORTED", ["'adj'", "sparse"])

    torch.save({"ghost": torch.empty(2, 3, device="meta")}, p("torch_meta.pt"))
    refused("torch_meta.pt", "GROVE_E_UNSUPPORTED", ["'ghost'", "meta"])

    torch.save({"z": torch.ones(2, dtype=torch.complex64)}, p("torch_complex.pt"))
    refused("torch_complex.pt", "GROVE_E_BAD_DTYPE", ["'z'", "ComplexFloatStorage"])

    # The exploit: os.system(MARKER_CMD) as a value of the state_dict.
    class Evil:
        def __reduce__(self):
            return (os.system, (MARKER_CMD,))

    buf = io.BytesIO()
    torch.save(collections.OrderedDict(w=torch.ones(2), x=Evil()), buf)
    recs = _records(io.BytesIO(buf.getvalue()))
    pwn = []
    for name, data in recs:
        name = "weights/" + name.split("/", 1)[1]
        if name.endswith("/data.pkl"):
            mod = os.system.__module__.encode()  # "posix"
            assert b"c" + mod + b"\nsystem\n" in data
            data = data.replace(b"c" + mod + b"\nsystem\n", b"cos\nsystem\n")
        pwn.append((name, data))
    _rewrite(None, p("torch_os_system.pt"), records=pwn)
    with tempfile.TemporaryDirectory() as d:
        marker = os.path.join(d, "marker")
        os.environ["GROVE_PWNED_MARKER"] = marker
        try:
            torch.load(p("torch_os_system.pt"))  # runs the command: the proof
            assert os.path.exists(marker), "the exploit fixture did not run its command"
            try:
                torch.load(p("torch_os_system.pt"), weights_only=True)
                raise AssertionError("torch's weights_only loaded the exploit")
            except pickle.UnpicklingError:
                pass
            except RuntimeError:
                pass
        finally:
            del os.environ["GROVE_PWNED_MARKER"]
    refused("torch_os_system.pt", "GROVE_E_REFUSED", ["'os.system'", "would run code"])

    with open(p("torch_ckpt.json"), "w", encoding="utf-8") as f:
        json.dump(expected, f, indent=1, ensure_ascii=False, sort_keys=True)
        f.write("\n")
