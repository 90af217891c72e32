#!/usr/bin/env python3
"""grove_export: turn a live torch.nn.Module into a Grove model directory.

    from grove_export import export
    export(model, "models/digits", example_input=torch.randn(1, 64))

writes models/digits/model.json (architecture with torch.nn names and
constructor arguments, inputs/outputs, batching) and weights.safetensors
(or weights.pt with weights="pt").  Command line: see `--help`.  The format is
described in docs/model-spec.md, the exporter in docs/exporter.md.

Needs torch (Debian: python3-torch, under /usr/bin/python3).  The safetensors
writer below is self-contained (Debian packages no safetensors module).
"""
import argparse
import importlib.util
import json
import os
import shutil
import struct
import sys
import tempfile

FORMAT = "grove.model/1"
# The weights names grove_model_open looks for, in its order.  A re-export
# into an existing directory removes all of them, so that a stale weights.pt
# can never shadow (or be mistaken for) the new export.
WEIGHT_NAMES = ("weights.safetensors", "weights.pt", "weights.pth", "weights.bin")
BATCHING_KEYS = ("max_batch_size", "max_queue_delay_us", "max_queue_size")

_ST_DTYPES = None


def _st_dtypes():
    global _ST_DTYPES
    if _ST_DTYPES is None:
        import torch
        _ST_DTYPES = {
            torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
            torch.float64: "F64", torch.int64: "I64", torch.int32: "I32",
            torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8", torch.bool: "BOOL",
        }
    return _ST_DTYPES


def save_safetensors(tensors, path, metadata=None):
    """Writes an ordered mapping name -> torch.Tensor as a safetensors file:
    8-byte little-endian header length, JSON header (padded with spaces to a
    multiple of 8), then the tensors' little-endian bytes.  The header keeps
    the mapping's order; the data is laid out by decreasing element size (as
    the reference writer does), so every tensor is aligned to its element
    size and Grove maps every float32 tensor without copying it."""
    import torch
    dtypes = _st_dtypes()
    header = {}
    if metadata is None:
        metadata = {"format": "pt"}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    entries = []
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: not a tensor ({type(t).__name__})")
        if t.dtype not in dtypes:
            raise TypeError(f"{name}: dtype {t.dtype} has no safetensors name")
        t = t.detach().cpu().contiguous()
        if t.dtype == torch.bfloat16:
            data = t.view(torch.int16).numpy().astype("<i2").tobytes()
        else:
            data = t.numpy().astype(t.numpy().dtype.newbyteorder("<")).tobytes()
        header[name] = {"dtype": dtypes[t.dtype], "shape": list(t.shape)}
        entries.append((name, t.element_size(), data))
    offset = 0
    blobs = []
    for name, _, data in sorted(entries, key=lambda e: -e[1]):  # stable: key order within a size
        header[name]["data_offsets"] = [offset, offset + len(data)]
        blobs.append(data)
        offset += len(data)
    hjson = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hjson += b" " * ((8 - len(hjson) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hjson)))
        f.write(hjson)
        for b in blobs:
            f.write(b)


# ---------------------------------------------------------------- errors


class ExportError(ValueError):
    """The module cannot be exported; the message names the module's dotted
    path and class and says why."""


def _where(path, m):
    return f"'{path}' ({type(m).__name__})" if path else f"the root module ({type(m).__name__})"


# ---------------------------------------------------------------- the types


class _Kind:
    """What the exporter knows about one supported torch.nn class: the JSON
    type name, how to read its constructor arguments back from a live
    instance, and which parameter and buffer slots torch gives it (a module
    with other slots was changed after construction, e.g. by weight_norm, and
    Grove would not run it the way torch does)."""

    def __init__(self, cls, args, params=(), buffers=(), container=False, callable_=True,
                 shape_preserving=False):
        self.cls = cls
        self.name = cls.__name__
        self.args = args
        self.params = tuple(params)
        self.buffers = tuple(buffers)
        self.container = container
        self.callable = callable_
        self.shape_preserving = shape_preserving


def _embedding_args(m, path):
    if m.max_norm is not None:
        raise ExportError(
            f"cannot export {_where(path, m)}: max_norm={m.max_norm} renormalises the "
            "embedding rows in place on every forward; Grove serves immutable weights. "
            "Renormalise the weights once (torch.renorm) and export with max_norm=None")
    # torch stores a negative padding_idx already normalised
    # (padding_idx + num_embeddings), so this is always None or >= 0.
    return {"num_embeddings": m.num_embeddings, "embedding_dim": m.embedding_dim,
            "padding_idx": m.padding_idx, "max_norm": None,
            "scale_grad_by_freq": bool(m.scale_grad_by_freq), "sparse": bool(m.sparse)}


def _layer_norm_args(m, path):
    args = {"normalized_shape": [int(d) for d in m.normalized_shape], "eps": float(m.eps),
            "elementwise_affine": bool(m.elementwise_affine)}
    # torch >= 2.1: LayerNorm(bias=False) keeps the weight and drops the bias.
    if m.elementwise_affine and getattr(m, "bias", True) is None:
        args["bias"] = False
    return args


def _kinds():
    import torch.nn as nn
    none = lambda m, path: {}  # noqa: E731
    inplace = lambda m, path: {"inplace": bool(m.inplace)}  # noqa: E731
    ks = [
        _Kind(nn.Linear, lambda m, path: {"in_features": m.in_features,
                                          "out_features": m.out_features,
                                          "bias": m.bias is not None},
              params=("weight", "bias")),
        _Kind(nn.Identity, none, shape_preserving=True),
        _Kind(nn.Flatten, lambda m, path: {"start_dim": m.start_dim, "end_dim": m.end_dim}),
        _Kind(nn.Dropout, lambda m, path: {"p": float(m.p), "inplace": bool(m.inplace)},
              shape_preserving=True),
        _Kind(nn.ReLU, inplace, shape_preserving=True),
        _Kind(nn.LeakyReLU, lambda m, path: {"negative_slope": float(m.negative_slope),
                                             "inplace": bool(m.inplace)},
              shape_preserving=True),
        _Kind(nn.GELU, lambda m, path: {"approximate": getattr(m, "approximate", "none")},
              shape_preserving=True),
        _Kind(nn.SiLU, inplace, shape_preserving=True),
        _Kind(nn.Sigmoid, none, shape_preserving=True),
        _Kind(nn.Tanh, none, shape_preserving=True),
        _Kind(nn.Softmax, lambda m, path: {"dim": m.dim}, shape_preserving=True),
        _Kind(nn.LogSoftmax, lambda m, path: {"dim": m.dim}, shape_preserving=True),
        _Kind(nn.BatchNorm1d, lambda m, path: {
            "num_features": m.num_features, "eps": float(m.eps),
            "momentum": None if m.momentum is None else float(m.momentum),
            "affine": bool(m.affine), "track_running_stats": bool(m.track_running_stats)},
              params=("weight", "bias"),
              buffers=("running_mean", "running_var", "num_batches_tracked"),
              shape_preserving=True),
        _Kind(nn.LayerNorm, _layer_norm_args,
              params=("weight", "bias"), shape_preserving=True),
        _Kind(nn.Embedding, _embedding_args, params=("weight",)),
        _Kind(nn.Sequential, none, container=True),
        _Kind(nn.ModuleList, none, container=True, callable_=False),
        _Kind(nn.ModuleDict, none, container=True, callable_=False),
    ]
    return {k.cls: k for k in ks}


_KINDS = None


def _kind_of(m, path):
    """The _Kind of m, or ExportError.  An exact supported class is accepted;
    so is a subclass that keeps the base class's forward (the common
    `class MLP(nn.Sequential)` that only has an __init__), since it computes
    exactly what the base class does.  A subclass with its own forward, or any
    other class, needs a graph (issue #4)."""
    global _KINDS
    if _KINDS is None:
        _KINDS = _kinds()
    cls = type(m)
    if cls in _KINDS:
        return _KINDS[cls]
    for base in cls.__mro__[1:]:
        if base in _KINDS:
            if cls.forward is base.forward:
                return _KINDS[base]
            raise ExportError(
                f"cannot export {_where(path, m)}: it subclasses torch.nn.{base.__name__} "
                "but overrides forward(); Grove runs only the forward of the torch.nn "
                "classes it knows (custom forwards, as torch.fx graphs, are issue #4)")
    supported = ", ".join(sorted(k.name for k in _KINDS.values()))
    raise ExportError(
        f"cannot export {_where(path, m)}: {cls.__module__}.{cls.__qualname__} is not a "
        f"torch.nn type Grove runs, and custom modules with their own forward need a "
        f"graph (torch.fx, issue #4). Supported: {supported}")


def _join(prefix, name):
    return f"{prefix}.{name}" if prefix else name


# ---------------------------------------------------------------- the walk


def _check_slots(m, path, kind):
    got_p = list(m._parameters.keys())
    got_b = list(m._buffers.keys())
    extra = [n for n in got_p if n not in kind.params] + [n for n in got_b if n not in kind.buffers]
    missing = [n for n in kind.params if n not in m._parameters] + \
              [n for n in kind.buffers if n not in m._buffers]
    if extra or missing:
        what = []
        if extra:
            what.append("extra parameter/buffer slot(s) " + ", ".join(repr(n) for n in extra))
        if missing:
            what.append("no slot(s) " + ", ".join(repr(n) for n in missing))
        raise ExportError(
            f"cannot export {_where(path, m)}: it has {' and '.join(what)} that torch.nn."
            f"{kind.name} does not (was it changed after construction, e.g. by "
            "torch.nn.utils.weight_norm or spectral_norm? remove_weight_norm first)")
    non_persistent = getattr(m, "_non_persistent_buffers_set", set())
    if non_persistent:
        raise ExportError(f"cannot export {_where(path, m)}: non-persistent buffer(s) "
                          f"{sorted(non_persistent)} are not part of torch.nn.{kind.name}")
    if not kind.container and len(m._modules) > 0:
        names = ", ".join(repr(n) for n in m._modules)
        raise ExportError(f"cannot export {_where(path, m)}: it has child module(s) {names}, "
                          f"which torch.nn.{kind.name} does not have and would not call")
    if m._forward_hooks or m._forward_pre_hooks:
        raise ExportError(
            f"cannot export {_where(path, m)}: it has forward hooks or pre-hooks, which "
            "change what it computes and are not part of the model directory; remove them "
            "(handle.remove()) before exporting")


def module_spec(model, require_callable=True):
    """The "module" value of model.json for model: a dict as described in
    docs/model-spec.md.  Raises ExportError naming the dotted path and class
    of the first module Grove cannot run.  With require_callable (the
    default), a tree whose forward torch itself could not run (a ModuleList
    or ModuleDict as the root or as a Sequential's child) is refused too."""
    seen = {}        # id(module) -> dotted path of its first occurrence
    first_param = {}  # id(parameter) -> dotted path of its first occurrence
    on_stack = set()

    def walk(m, path, parent_kind):
        if m is None:
            return None
        if id(m) in on_stack:
            raise ExportError(f"cannot export {_where(path, m)}: the module contains itself "
                              f"(it is also '{seen[id(m)]}', an ancestor)")
        if id(m) in seen:
            kind = _kind_of(m, path)
            if require_callable and parent_kind is not None and parent_kind.callable \
                    and not kind.callable:
                raise _not_callable(m, path, parent_kind)
            return {"ref": seen[id(m)]}
        kind = _kind_of(m, path)
        _check_slots(m, path, kind)
        if require_callable:
            if parent_kind is None and not kind.callable:
                raise ExportError(f"cannot export {_where(path, m)}: torch.nn.{kind.name} has "
                                  "no forward, so there is nothing to serve")
            if parent_kind is not None and parent_kind.callable and not kind.callable:
                raise _not_callable(m, path, parent_kind)
        seen[id(m)] = path
        spec = {"type": kind.name}
        spec.update(kind.args(m, path))
        tied = {}
        for pname, p in m._parameters.items():
            if p is None:
                continue
            if id(p) in first_param:
                tied[pname] = first_param[id(p)]
            else:
                first_param[id(p)] = _join(path, pname)
        if tied:
            spec["tied"] = tied
        if kind.container:
            on_stack.add(id(m))
            names = list(m._modules.keys())
            kids = [walk(c, _join(path, n), kind) for n, c in m._modules.items()]
            on_stack.discard(id(m))
            positional = names == [str(i) for i in range(len(names))]
            if kind.name == "ModuleDict" or not positional:
                spec["children"] = dict(zip(names, kids))
            else:
                spec["children"] = kids
        return spec

    return walk(model, "", None)


def _not_callable(m, path, parent_kind):
    return ExportError(
        f"cannot export {_where(path, m)}: it is a child of a {parent_kind.name}, which "
        f"calls every child, but torch.nn.{type(m).__name__} has no forward (torch itself "
        "would raise NotImplementedError)")


def _expected_keys(model):
    """state_dict keys as torch orders them, from the module tree alone:
    each module's parameters, its persistent buffers, then its children
    (shared modules and tied tensors repeated, as torch does)."""
    keys = []

    def walk(m, prefix):
        for n, p in m._parameters.items():
            if p is not None:
                keys.append(prefix + n)
        for n, b in m._buffers.items():
            if b is not None:
                keys.append(prefix + n)
        for n, c in m._modules.items():
            if c is not None:
                walk(c, prefix + n + ".")

    walk(model, "")
    return keys


# ---------------------------------------------------------------- io specs


def _dtype_name(dt):
    import torch
    if dt.is_floating_point:
        # Grove computes in float32 whatever the checkpoint's precision (it
        # converts f16/bf16/f64 weights on load), so float inputs and outputs
        # travel as float32.
        return "float32"
    names = {torch.int64: "int64", torch.int32: "int32", torch.int16: "int16",
             torch.int8: "int8", torch.uint8: "uint8", torch.bool: "bool"}
    if dt not in names:
        raise ExportError(f"tensor dtype {dt} has no Grove name")
    return names[dt]


def _infer_input(model):
    """The input spec Grove can read off the first layer that fixes it, in
    call order, skipping layers that keep the shape: Linear -> float32
    [-1, in_features]; Embedding -> int64 [-1, -1].  None when the first
    such layer is something else (then the caller needs example_input)."""
    import torch

    def first(m):
        kind = _kind_of(m, "")
        if kind.name == "Linear":
            return {"dtype": torch.float32, "shape": [-1, m.in_features]}
        if kind.name == "Embedding":
            return {"dtype": torch.int64, "shape": [-1, -1]}
        if kind.name == "Sequential":
            for c in m._modules.values():
                if c is None:
                    return None
                r = first(c)
                if r is not False:
                    return r
            return False
        if kind.shape_preserving:
            return False  # look further
        return None

    r = first(model)
    return r if r else None


def _zeros(dtype, shape):
    import torch
    return torch.zeros(shape, dtype=dtype)


def _io(model, example_input):
    """(inputs, outputs) for model.json.  The input comes from example_input
    (dtype, shape with dim 0 = -1) or from the first layer; dims the first
    layer leaves free (an Embedding's sequence length) are -1 either way.
    Outputs come from running the model; a dim is -1 when it changes with the
    input's free dims (two runs with different sizes tell)."""
    import torch
    inferred = _infer_input(model)
    if example_input is not None:
        if isinstance(example_input, (tuple, list)):
            if len(example_input) != 1:
                raise ExportError(f"example_input has {len(example_input)} tensors; the "
                                  "torch.nn containers Grove runs take exactly one input")
            example_input = example_input[0]
        if not isinstance(example_input, torch.Tensor):
            raise ExportError(f"example_input must be a torch.Tensor, not "
                              f"{type(example_input).__name__}")
        if example_input.dim() < 1:
            raise ExportError("example_input must have a batch dimension (dim 0)")
        dtype = example_input.dtype
        shape = [-1] + list(example_input.shape[1:])
        if inferred and len(inferred["shape"]) == len(shape):
            shape = [-1 if d == -1 else s for d, s in zip(inferred["shape"], shape)]
        x1 = example_input
    elif inferred is None:
        raise ExportError(
            f"cannot tell the input of {_where('', model)} from its first layer (only a "
            "leading Linear or Embedding says it); pass example_input")
    else:
        dtype, shape = inferred["dtype"], inferred["shape"]
        x1 = _zeros(dtype, [2] + [3 if d == -1 else d for d in shape[1:]])
    x2 = _zeros(x1.dtype, [x1.shape[0] + 1] + [x1.shape[i] + 1 if shape[i] == -1 else shape[i]
                                               for i in range(1, len(shape))])
    with torch.no_grad():
        try:
            y1 = model(x1)
            y2 = model(x2)
        except Exception as e:  # torch's own message says what did not fit
            what = "example_input" if example_input is not None else \
                f"an input of the inferred shape {shape} ({dtype})"
            raise ExportError(f"running the model on {what} failed: "
                              f"{type(e).__name__}: {e}") from e
    if not isinstance(y1, torch.Tensor):
        raise ExportError(f"the model returned {type(y1).__name__}, not a tensor")
    oshape = list(y1.shape)
    if y2.dim() == y1.dim():
        oshape = [-1 if a != b else a for a, b in zip(y1.shape, y2.shape)]
    if oshape and y1.shape[0] == x1.shape[0]:
        oshape[0] = -1
    inputs = [{"name": "x", "dtype": _dtype_name(dtype), "shape": shape}]
    outputs = [{"name": "y", "dtype": _dtype_name(y1.dtype), "shape": oshape}]
    return inputs, outputs


def _batching(batching):
    if batching is None:
        return None
    if not isinstance(batching, dict):
        raise ExportError("batching must be a dict with keys " + ", ".join(BATCHING_KEYS))
    out = {}
    for k, v in batching.items():
        if k not in BATCHING_KEYS:
            raise ExportError(f"batching: unknown key {k!r} (known: {', '.join(BATCHING_KEYS)})")
        if isinstance(v, bool) or not isinstance(v, int):
            raise ExportError(f"batching.{k}: expected an integer, got {v!r}")
        low = 0 if k == "max_queue_delay_us" else 1
        if v < low:
            raise ExportError(f"batching.{k}: must be >= {low}, got {v}")
        out[k] = v
    return {k: out[k] for k in BATCHING_KEYS if k in out}


def build_spec(model, example_input=None, name=None, batching=None, weights_name=None,
               require_callable=True):
    """The whole model.json document (a dict) for model, which must already
    be in eval mode.  Raises ExportError."""
    module = module_spec(model, require_callable=require_callable)
    doc = {"format": FORMAT}
    if name is not None:
        if not isinstance(name, str) or not name:
            raise ExportError("name must be a non-empty string")
        doc["name"] = name
    if require_callable or example_input is not None:
        doc["inputs"], doc["outputs"] = _io(model, example_input)
    else:
        inferred = _infer_input(model)
        if inferred:
            doc["inputs"] = [{"name": "x", "dtype": _dtype_name(inferred["dtype"]),
                              "shape": inferred["shape"]}]
    b = _batching(batching)
    if b:
        doc["batching"] = b
    if weights_name:
        doc["weights"] = weights_name
    doc["module"] = module
    return doc


# ---------------------------------------------------------------- writing


def _dumps(obj, indent=0, width=96):
    """JSON with short arrays and objects on one line (shapes, arguments of
    small layers), so that model.json reads like the module tree."""
    flat = json.dumps(obj, ensure_ascii=False)
    if len(flat) + indent <= width or not isinstance(obj, (dict, list)) or not obj:
        return flat
    if isinstance(obj, dict) and "children" not in obj and \
            not any(isinstance(v, (dict, list)) and len(json.dumps(v)) > width // 2
                    for v in obj.values()):
        return flat  # one leaf module (or io entry) per line, however long
    pad = " " * (indent + 2)
    if isinstance(obj, list):
        items = [pad + _dumps(v, indent + 2, width) for v in obj]
        return "[\n" + ",\n".join(items) + "\n" + " " * indent + "]"
    items = [pad + json.dumps(k, ensure_ascii=False) + ": " + _dumps(v, indent + 2, width)
             for k, v in obj.items()]
    return "{\n" + ",\n".join(items) + "\n" + " " * indent + "}"


def _fsync(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_dir(out_dir, files):
    """Writes the directory atomically: everything goes into a temporary
    sibling, which then takes out_dir's place.  files maps a file name to a
    function that writes it at a given path.  Files of an existing out_dir
    that are not model.json or a weights file (samples, a README) are carried
    over; a failure leaves out_dir as it was."""
    out_dir = os.path.abspath(out_dir)
    parent, base = os.path.split(out_dir)
    os.makedirs(parent, exist_ok=True)
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise ExportError(f"{out_dir} exists and is not a directory")
    tmp = tempfile.mkdtemp(prefix=f".{base}.tmp-", dir=parent)
    old = None
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o777 & ~umask)
        for fname, write in files.items():
            write(os.path.join(tmp, fname))
            _fsync(os.path.join(tmp, fname))
        if os.path.isdir(out_dir):
            ours = set(files) | {"model.json"} | set(WEIGHT_NAMES)
            for entry in os.listdir(out_dir):
                if entry in ours:
                    continue
                src, dst = os.path.join(out_dir, entry), os.path.join(tmp, entry)
                if os.path.isdir(src) and not os.path.islink(src):
                    shutil.copytree(src, dst, symlinks=True)
                else:
                    try:
                        os.link(src, dst, follow_symlinks=False)
                    except OSError:
                        shutil.copy2(src, dst, follow_symlinks=False)
            old = tempfile.mkdtemp(prefix=f".{base}.old-", dir=parent)
            os.rmdir(old)
            os.rename(out_dir, old)
            try:
                os.rename(tmp, out_dir)
            except OSError:
                os.rename(old, out_dir)
                old = None
                raise
        else:
            os.rename(tmp, out_dir)
        tmp = None
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    return out_dir


def export(model, out_dir, example_input=None, weights="safetensors", name=None, batching=None,
           *, require_callable=True):
    """Writes model as a Grove model directory at out_dir: model.json and
    weights.safetensors (weights="safetensors") or weights.pt (weights="pt",
    torch.save(model.state_dict())).

    example_input: a tensor with a batch dimension first (or a 1-tuple of
    one); it fixes the input's dtype and shape (dim 0 becomes -1, "any").
    Without it the input is read off the first layer (Linear -> float32
    [-1, in_features], Embedding -> int64 [-1, -1]).  The model is run (on
    example_input, or zeros) to record the output's shape.

    name: model.json "name" (default: Grove uses the directory's name).
    batching: dict with any of max_batch_size, max_queue_delay_us,
    max_queue_size (Grove's defaults: 64, 500, 1024).
    require_callable=False exports a tree that has no forward (a bag of
    ModuleList/ModuleDict); Grove can build and load it but not serve it.

    The model is put in eval mode for the export; every module's training
    flag is restored afterwards.  The directory is written into a temporary
    sibling and renamed into place; files other than model.json and weights
    files already in out_dir are kept.  Raises ExportError (a ValueError)
    naming the dotted path and class of a module Grove cannot run.  Returns
    the model.json document (a dict)."""
    import torch
    if not isinstance(model, torch.nn.Module):
        raise ExportError(f"model must be a torch.nn.Module, not {type(model).__name__}")
    if weights not in ("safetensors", "pt"):
        raise ExportError(f"weights must be 'safetensors' or 'pt', not {weights!r}")
    wname = "weights.safetensors" if weights == "safetensors" else "weights.pt"
    # Refuse what cannot be exported before touching the model: torch's own
    # eval() would recurse forever on a module that contains itself.
    module_spec(model, require_callable=require_callable)
    flags = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        doc = build_spec(model, example_input, name=name, batching=batching, weights_name=wname,
                         require_callable=require_callable)
        sd = model.state_dict()
        expected = _expected_keys(model)
        if list(sd.keys()) != expected:
            extra = [k for k in sd if k not in expected]
            missing = [k for k in expected if k not in sd]
            raise ExportError(
                "model.state_dict() does not list the module tree's parameters and buffers "
                f"in torch's order (state_dict hooks?): extra {extra}, missing {missing}")
        if weights == "safetensors":
            write_weights = lambda p: save_safetensors(sd, p)  # noqa: E731
        else:
            write_weights = lambda p: torch.save(sd, p)  # noqa: E731

        def write_json(p):
            with open(p, "w", encoding="utf-8") as f:
                f.write(_dumps(doc) + "\n")

        _write_dir(out_dir, {wname: write_weights, "model.json": write_json})
        return doc
    finally:
        for m, t in flags:
            m.training = t


# ---------------------------------------------------------------- command line


def _load_builder(spec):
    path, sep, func = spec.rpartition(":")
    if not sep or not path or not func:
        raise ExportError(f"--builder wants FILE.py:FUNCTION, got {spec!r}")
    if not os.path.isfile(path):
        raise ExportError(f"--builder: {path}: no such file")
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    mspec = importlib.util.spec_from_file_location(
        os.path.splitext(os.path.basename(path))[0], path)
    mod = importlib.util.module_from_spec(mspec)
    mspec.loader.exec_module(mod)
    fn = getattr(mod, func, None)
    if not callable(fn):
        raise ExportError(f"--builder: {path} has no function {func!r}")
    return fn


def main(argv=None):
    p = argparse.ArgumentParser(
        prog="grove_export.py",
        description="Export a PyTorch module as a Grove model directory (model.json + "
                    "weights). FUNCTION in FILE.py is called with no arguments and returns "
                    "the module, or a (module, example_input) tuple.",
        epilog="Exit status: 0 written, 1 the module cannot be exported (the message names "
               "its path and class), 2 usage. See docs/exporter.md.")
    p.add_argument("--builder", required=True, metavar="FILE.py:FUNCTION",
                   help="Python file and function that builds the module")
    p.add_argument("out_dir", metavar="OUT_DIR", help="model directory to write")
    p.add_argument("--weights", choices=("safetensors", "pt"), default="safetensors",
                   help="weights file format (default: safetensors)")
    p.add_argument("--name", help="model name in model.json (default: the directory's name)")
    p.add_argument("--max-batch-size", type=int, metavar="N")
    p.add_argument("--max-queue-delay-us", type=int, metavar="N")
    p.add_argument("--max-queue-size", type=int, metavar="N")
    a = p.parse_args(argv)
    batching = {k: getattr(a, k) for k in BATCHING_KEYS if getattr(a, k) is not None}
    try:
        built = _load_builder(a.builder)()
        example = None
        if isinstance(built, tuple):
            if len(built) != 2:
                raise ExportError("the builder must return a module or (module, example_input)")
            built, example = built
        doc = export(built, a.out_dir, example_input=example, weights=a.weights, name=a.name,
                     batching=batching or None)
    except ExportError as e:
        print(f"grove_export: {e}", file=sys.stderr)
        return 1
    n = sum(p.numel() for p in built.parameters())
    ins = ", ".join(f"{i['name']} {i['dtype']} {i['shape']}" for i in doc["inputs"])
    print(f"wrote {a.out_dir}: model.json + {doc['weights']} ({n} parameters; input {ins})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
