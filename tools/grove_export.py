#!/usr/bin/env python3
"""grove_export: turn a live torch.nn.Module into a Grove model directory.

    from grove_export import export
    export(model, "models/digits", example_input=torch.randn(1, 64))

writes models/digits/model.json (architecture with torch.nn names and
constructor arguments, inputs/outputs, batching) and weights.safetensors
(or weights.pt with weights="pt").  Command line: see `--help`.  The format is
described in docs/model-spec.md, the exporter in docs/exporter.md.

Needs torch (Debian: python3-torch, under /usr/bin/python3).  The safetensors
writer is tools/grove_safetensors.py (self-contained: Debian packages no
safetensors module).
"""
import argparse
import importlib.util
import json
import os
import shutil
import sys
import tempfile

FORMAT = "grove.model/1"
# The weights names grove_model_open looks for, in its order.  A re-export
# into an existing directory removes all of them, so that a stale weights.pt
# can never shadow (or be mistaken for) the new export.
WEIGHT_NAMES = ("weights.safetensors", "weights.pt", "weights.pth", "weights.bin")
# The values of the non-persistent buffers (not in the state_dict), read by
# grove_model_open; replaced (or removed) by every re-export like the weights.
BUFFERS_NAME = "buffers.safetensors"
BATCHING_KEYS = ("max_batch_size", "max_queue_delay_us", "max_queue_size")

# The safetensors writer (self-contained: Debian packages no safetensors
# module) lives beside this file; exported from here for the callers that
# have always imported it from grove_export.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from grove_safetensors import save_safetensors  # noqa: E402,F401

from grove_export_types import (  # noqa: E402,F401
    ExportError,
    _dtype_name,
    _kind_of,
    _named_flat,
    _where,
)
from grove_export_graph import (  # noqa: E402
    _check_cycles,
    _expected_keys,
    capture_examples,
    extra_buffers,
    module_spec,
)

# ---------------------------------------------------------------- io specs



def _infer_input(model):
    """The input spec Grove can read off the first layer that fixes it, in
    call order, skipping layers that keep the shape: Linear -> float32
    [-1, in_features]; Embedding -> int64 [-1, -1].  None when the first
    such layer is something else (then the caller needs example_input)."""
    import torch

    def first(m):
        kind = _kind_of(m, "")
        if kind is None:
            return None
        if kind.name == "Linear":
            return {"dtype": torch.float32, "shape": [-1, m.in_features]}
        if kind.name == "Embedding":
            return {"dtype": torch.int64, "shape": [-1, -1]}
        if kind.name in ("RNN", "LSTM", "GRU"):
            return {"dtype": torch.float32, "shape": [-1, -1, m.input_size]}
        if kind.name == "EmbeddingBag":
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


def _input_names(model, n):
    """The forward's parameter names for a custom root, else x (x0, x1, ...)."""
    import inspect
    if _kind_of(model, "") is None:
        try:
            params = [p for p in inspect.signature(model.forward).parameters.values()
                      if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
            if len(params) >= n:
                return [p.name for p in params[:n]]
        except (TypeError, ValueError):
            pass
    return ["x"] if n == 1 else [f"x{i}" for i in range(n)]


def _flat(y):
    """A model's result as a flat list: torch's nested tuples (an LSTM's
    (output, (h_n, c_n))) in order, as Grove returns them."""
    if isinstance(y, (tuple, list)):
        return [t for v in y for t in _flat(v)]
    return [y]


def _outputs(y, what):
    import torch
    # A dict, namedtuple, dataclass or ModelOutput gives named outputs in its
    # fields' order; nested tuples are flattened in order (_named_flat).
    _, ys = _named_flat(y)
    if not ys or len(ys) > 4 or not all(isinstance(t, torch.Tensor) for t in ys):
        got = type(y).__name__ if not isinstance(y, (tuple, list)) else \
            f"a {type(y).__name__} of {[type(t).__name__ for t in ys]}"
        raise ExportError(f"the model returned {got} on {what}; Grove serves models that "
                          "return 1 to 4 tensors (a tensor, or a tuple, dict, namedtuple or "
                          "dataclass of them)")
    return ys


def _example_shapes(example_shape, xs):
    """example_shape (a shape, or a list of one per input, None for "probe
    it") checked against the example tensors xs: dim 0 the batch (-1), each
    other dim -1 (free) or the example's size.  A list of shapes or Nones."""
    if example_shape is None:
        return [None] * len(xs)
    one = isinstance(example_shape, (list, tuple)) and \
        all(isinstance(d, int) and not isinstance(d, bool) for d in example_shape)
    shapes = [list(example_shape)] if one else list(example_shape)
    if len(shapes) != len(xs):
        raise ExportError(f"example_shape has {len(shapes)} shapes for {len(xs)} inputs")
    out = []
    for i, (sh, x) in enumerate(zip(shapes, xs)):
        if sh is None:
            out.append(None)
            continue
        sh = list(sh)
        if len(sh) != x.dim() or not all(isinstance(d, int) and not isinstance(d, bool)
                                         for d in sh):
            raise ExportError(f"example_shape[{i}] {sh}: expected {x.dim()} integers, as "
                              f"example_input[{i}] {list(x.shape)} has")
        for d, (want, got) in enumerate(zip(sh, x.shape)):
            if d == 0 and want not in (-1, got):
                raise ExportError(f"example_shape[{i}][0] is {want}: dimension 0 is the batch "
                                  "(-1)")
            if d > 0 and want != -1 and want != got:
                raise ExportError(f"example_shape[{i}][{d}] is {want} but example_input[{i}] "
                                  f"has {got} there (-1 for a free dimension)")
        out.append([-1] + sh[1:])
    return out


def _io(model, example_input, example_shape=None):
    """(inputs, outputs) for model.json.  The inputs come from example_input
    (dtype, shape with dim 0 = -1) or from the first layer; dims the first
    layer leaves free (an Embedding's sequence length) are -1 either way, and
    so is every dim of an integer input (token ids) the model also runs with
    at another size.  Outputs come from running the model; a dim is -1 when it
    changes with the inputs' free dims (two runs with different sizes tell)."""
    import torch
    custom = _kind_of(model, "") is None
    inferred = _infer_input(model)
    if example_input is not None:
        xs = list(example_input) if isinstance(example_input, (tuple, list)) else [example_input]
        # (the attention and transformer layers take several: query, key,
        # value; src, tgt; tgt, memory)
        if not custom and len(xs) != 1 and not _kind_of(model, "").composite:
            raise ExportError(f"example_input has {len(xs)} tensors; the torch.nn containers "
                              "Grove runs take exactly one input")
        if not 1 <= len(xs) <= 4:
            raise ExportError(f"example_input has {len(xs)} tensors; Grove takes 1 to 4 inputs")
        for x in xs:
            if not isinstance(x, torch.Tensor):
                raise ExportError(f"example_input must be a torch.Tensor, not {type(x).__name__}")
            if x.dim() < 1:
                raise ExportError("example_input must have a batch dimension (dim 0)")
        shapes = [[-1] + list(x.shape[1:]) for x in xs]
        if inferred and len(xs) == 1 and len(inferred["shape"]) == len(shapes[0]):
            shapes[0] = [-1 if d == -1 else s for d, s in zip(inferred["shape"], shapes[0])]
        given = _example_shapes(example_shape, xs)
        for i, sh in enumerate(given):
            if sh is not None:
                shapes[i] = sh
        dtypes = [x.dtype for x in xs]
        x1 = xs
    elif example_shape is not None:
        raise ExportError("example_shape needs example_input")
    elif inferred is None:
        raise ExportError(
            f"cannot tell the input of {_where('', model)} from its first layer (only a "
            "leading Linear or Embedding says it); pass example_input")
    else:
        dtypes, shapes = [inferred["dtype"]], [inferred["shape"]]
        x1 = [_zeros(dtypes[0], [2] + [3 if d == -1 else d for d in shapes[0][1:]])]
        given = [None]

    def run(xs, what):
        with torch.no_grad():
            try:
                return model(*xs)
            except Exception as e:  # torch's own message says what did not fit
                raise ExportError(f"running the model on {what} failed: "
                                  f"{type(e).__name__}: {e}") from e

    what = "example_input" if example_input is not None else \
        f"an input of the inferred shape {shapes[0]} ({dtypes[0]})"
    first = run(x1, what)
    y1 = _outputs(first, what)
    # An integer input (token ids) whose other dims the model also takes at
    # another size gets those dims free.  An input example_shape gives is
    # not probed: its dims are what the caller says.
    if custom:
        for i, x in enumerate(x1):
            if x.dtype.is_floating_point or given[i] is not None:
                continue
            for d in range(1, x.dim()):
                if shapes[i][d] == -1:
                    continue
                # The other inputs with the same size there (a mask beside
                # the token ids) grow with it: a sequence length is shared.
                along = [j for j, z in enumerate(x1)
                         if z.dim() > d and z.shape[d] == x.shape[d] and shapes[j][d] != -1]
                probe = list(x1)
                for j in along:
                    sh = list(x1[j].shape)
                    sh[d] += 1
                    probe[j] = _zeros(x1[j].dtype, sh)
                try:
                    with torch.no_grad():
                        _outputs(model(*probe), "a probe")
                    for j in along:
                        shapes[j][d] = -1
                except Exception:
                    pass
        # Still fixed: integer inputs whose dims of one size must change
        # together although they stand at different dims (ids [N, S] and a
        # mask [N, 1, S]): all of them one larger at once.
        groups = {}
        for i, x in enumerate(x1):
            if not x.dtype.is_floating_point and given[i] is None:
                for d in range(1, x.dim()):
                    if shapes[i][d] != -1:
                        groups.setdefault(x.shape[d], []).append((i, d))
        for size, dims in groups.items():
            if len({i for i, _ in dims}) < 2:
                continue
            probe = list(x1)
            for i in {i for i, _ in dims}:
                sh = [s + 1 if (i, d) in dims else s for d, s in enumerate(x1[i].shape)]
                probe[i] = _zeros(x1[i].dtype, sh)
            try:
                with torch.no_grad():
                    _outputs(model(*probe), "a probe")
                for i, d in dims:
                    shapes[i][d] = -1
            except Exception:
                pass

    # A float input's dim (a sequence of features [N, T, d]) is free when
    # the outputs follow it: one larger changes an output's shape, and the
    # model runs with it at 1 and 2 too (grove_model_open's trial forwards
    # run free dims there).  An image's H and W stay fixed under a
    # classifier (its outputs do not follow them).  Inputs of the same size
    # at that dim grow with it (a float mask beside the sequence).
    freed = []  # (input, dim) freed here, fixed again if they do not fit together
    if custom:
        for i, x in enumerate(x1):
            if not x.dtype.is_floating_point or given[i] is not None:
                continue
            for d in range(1, x.dim()):
                if shapes[i][d] == -1:
                    continue
                along = [j for j, z in enumerate(x1)
                         if given[j] is None and z.dim() > d and z.shape[d] == x.shape[d]
                         and shapes[j][d] != -1]

                def at(size):
                    probe = list(x1)
                    for j in along:
                        sh = list(x1[j].shape)
                        sh[d] = size
                        probe[j] = _zeros(x1[j].dtype, sh)
                    return probe
                try:
                    with torch.no_grad():
                        ya = _outputs(model(*at(x.shape[d] + 1)), "a probe")
                        follows = len(ya) == len(y1) and any(
                            a.dim() == b.dim() and a.shape != b.shape for a, b in zip(y1, ya))
                        if follows:
                            _outputs(model(*at(1)), "a probe")
                            _outputs(model(*at(2)), "a probe")
                except Exception:
                    continue
                if follows:
                    for j in along:
                        shapes[j][d] = -1
                        freed.append((j, d))

    def larger(batch):
        """x1 with the batch one larger (when batch) and every free dim too."""
        return [_zeros(x.dtype, [x.shape[0] + int(batch)] +
                       [x.shape[k] + 1 if shapes[i][k] == -1 else x.shape[k]
                        for k in range(1, x.dim())])
                for i, x in enumerate(x1)]

    def fits(xs):
        try:
            with torch.no_grad():
                _outputs(model(*xs), "a probe")
            return True
        except Exception:
            return False

    if freed and not fits(larger(True)):
        # Each alone, not together (x.view(-1, 6) of [N, 2, 3]): the float
        # dims stay the example's, as before they were probed.
        for j, d in freed:
            shapes[j][d] = x1[j].shape[d]
    x2 = larger(True)
    if not fits(x2):
        # A dim the first layer leaves free may still be fixed by the model
        # (an Embedding -> Flatten -> Linear over 6 tokens takes 6 tokens
        # only): each free dim that does not survive one larger alone is
        # fixed at the example's size, not a reason to refuse.  The batch dim
        # stays free; a model that cannot take another batch is refused below.
        for i, x in enumerate(x1):
            for d in range(1, x.dim()):
                if shapes[i][d] != -1:
                    continue
                probe = list(x1)
                sh = list(x.shape)
                sh[d] += 1
                probe[i] = _zeros(x.dtype, sh)
                if not fits(probe):
                    shapes[i][d] = x.shape[d]
        x2 = larger(True)
    y2 = _outputs(run(x2, what + " (with the batch and every free dimension one larger)"), what)
    outputs = []
    names = ["y"] if len(y1) == 1 else [f"y{i}" for i in range(len(y1))]
    keys = _named_flat(first)[0]
    if keys and all(isinstance(k, str) and k for k in keys) and len(set(keys)) == len(keys):
        names = keys  # a dict's keys, a namedtuple's fields name the outputs ("out", "aux")
    # An output may follow a free dim in steps (F.pad up to a multiple of 4:
    # 6 and 7 both give 8): a third run, every free dim 4 larger, tells.
    y3 = None
    if any(d == -1 for sh in shapes for d in sh[1:]):
        x3 = [_zeros(x.dtype, [x.shape[0]] + [x.shape[k] + 4 if shapes[i][k] == -1 else x.shape[k]
                                              for k in range(1, x.dim())])
              for i, x in enumerate(x1)]
        try:
            with torch.no_grad():
                y3 = _outputs(model(*x3), "a probe")
        except Exception:
            y3 = None
    for k, (name, a, b) in enumerate(zip(names, y1, y2)):
        oshape = list(a.shape)
        if b.dim() == a.dim():
            oshape = [-1 if p != q else p for p, q in zip(a.shape, b.shape)]
        if y3 is not None and k < len(y3) and y3[k].dim() == a.dim():
            oshape = [-1 if p != q else o for o, p, q in zip(oshape, a.shape, y3[k].shape)]
        if oshape and a.shape[0] == x1[0].shape[0]:
            oshape[0] = -1
        outputs.append({"name": name, "dtype": _dtype_name(a.dtype), "shape": oshape})
    inputs = [{"name": n, "dtype": _dtype_name(dt), "shape": sh}
              for n, dt, sh in zip(_input_names(model, len(x1)), dtypes, shapes)]
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
        # max_batch_size 0: unbatched, as Triton's (docs/model-spec.md).
        low = 0 if k in ("max_queue_delay_us", "max_batch_size") else 1
        if v < low:
            raise ExportError(f"batching.{k}: must be >= {low}, got {v}")
        out[k] = v
    return {k: out[k] for k in BATCHING_KEYS if k in out}


def build_spec(model, example_input=None, name=None, batching=None, weights_name=None,
               require_callable=True, example_shape=None):
    """The whole model.json document (a dict) for model, which must already
    be in eval mode.  Raises ExportError."""
    xs = None if example_input is None else list(example_input) \
        if isinstance(example_input, (tuple, list)) else [example_input]
    capture_examples(model, xs)
    try:
        module = module_spec(model, require_callable=require_callable)
    finally:
        capture_examples(model, None)  # holds the example's tensors; not needed past the walk
    doc = {"format": FORMAT}
    if name is not None:
        if not isinstance(name, str) or not name:
            raise ExportError("name must be a non-empty string")
        doc["name"] = name
    if require_callable or example_input is not None:
        doc["inputs"], doc["outputs"] = _io(model, example_input, example_shape)
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
            ours = set(files) | {"model.json", BUFFERS_NAME} | set(WEIGHT_NAMES)
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
           *, require_callable=True, example_shape=None):
    """Writes model as a Grove model directory at out_dir: model.json and
    weights.safetensors (weights="safetensors") or weights.pt (weights="pt",
    torch.save(model.state_dict())).

    example_input: a tensor with a batch dimension first (or a tuple of 1
    to 4 of them for a custom forward that takes several); it fixes the
    inputs' dtypes and shapes (dim 0 becomes -1, "any").  example_shape (a
    shape, or one per input, None for "probe it") says which dims are free
    (-1) and which fixed at the example's size, instead of probing them.  Without it the input
    is read off the first layer (Linear -> float32 [-1, in_features],
    Embedding -> int64 [-1, -1]); a module with a custom forward needs it.
    The model is run (on example_input, or zeros) to record the outputs'
    shapes.

    A module whose forward is not a torch.nn layer's or a plain Sequential
    chain is traced with torch.fx and written with its graph (docs/
    model-spec.md, "Graphs"); an operation Grove does not run is refused,
    naming it and the line of forward it came from.

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
    # Refuse a module that contains itself before touching the model: torch's
    # own eval() would recurse forever.
    _check_cycles(model)
    flags = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        doc = build_spec(model, example_input, name=name, batching=batching, weights_name=wname,
                         require_callable=require_callable, example_shape=example_shape)
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

        files = {wname: write_weights, "model.json": write_json}
        extra = extra_buffers(model)
        if extra:
            files[BUFFERS_NAME] = lambda p: save_safetensors(extra, p)
        _write_dir(out_dir, files)
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
