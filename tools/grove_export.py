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
import operator
import os
import shutil
import sys
import tempfile

FORMAT = "grove.model/1"
# The weights names grove_model_open looks for, in its order.  A re-export
# into an existing directory removes all of them, so that a stale weights.pt
# can never shadow (or be mistaken for) the new export.
WEIGHT_NAMES = ("weights.safetensors", "weights.pt", "weights.pth", "weights.bin")
BATCHING_KEYS = ("max_batch_size", "max_queue_delay_us", "max_queue_size")

# The safetensors writer (self-contained: Debian packages no safetensors
# module) lives beside this file; exported from here for the callers that
# have always imported it from grove_export.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from grove_safetensors import save_safetensors  # noqa: E402,F401

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
    Grove would not run it the way torch does).  A composite (attention and
    transformer layers) is built by Grove's constructor with its submodules:
    they are not written, and the exporter checks instead that torch's own
    constructor, given the same arguments, makes the same state_dict."""

    def __init__(self, cls, args, params=(), buffers=(), container=False, callable_=True,
                 shape_preserving=False, composite=False, optional=()):
        self.cls = cls
        self.name = cls.__name__
        self.args = args
        # A tuple of slot names, or (recurrent nets, whose slots depend on
        # num_layers and bidirectional) a function of the module giving them.
        self.params = params if callable(params) else tuple(params)
        self.optional = tuple(optional)  # slots torch registers only for some arguments
        self.buffers = tuple(buffers)
        self.container = container
        self.callable = callable_
        self.shape_preserving = shape_preserving
        self.composite = composite


def _refuse_max_norm(m, path):
    """Embedding and EmbeddingBag: max_norm writes to the weight in forward."""
    if m.max_norm is not None:
        raise ExportError(
            f"cannot export {_where(path, m)}: max_norm={m.max_norm} renormalises the "
            "embedding rows in place on every forward; Grove serves immutable weights. "
            "Renormalise the weights once (torch.renorm) and export with max_norm=None")


def _embedding_args(m, path):
    _refuse_max_norm(m, path)
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


def _ints(v):
    """torch's `int or tuple` as written: an int stays, a tuple becomes a list."""
    return [None if x is None else int(x) for x in v] if isinstance(v, (tuple, list)) else v


def _bn_args(m, path):
    return {"num_features": m.num_features, "eps": float(m.eps),
            "momentum": None if m.momentum is None else float(m.momentum),
            "affine": bool(m.affine), "track_running_stats": bool(m.track_running_stats)}


def _instance_norm_args(m, path):
    return {"num_features": m.num_features, "eps": float(m.eps),
            "momentum": None if m.momentum is None else float(m.momentum),
            "affine": bool(m.affine), "track_running_stats": bool(m.track_running_stats)}


def _conv_args(m, path):
    if m.padding_mode != "zeros":
        raise ExportError(f"cannot export {_where(path, m)}: padding_mode={m.padding_mode!r}; "
                          "Grove pads with zeros only")
    return {"in_channels": m.in_channels, "out_channels": m.out_channels,
            "kernel_size": _ints(m.kernel_size), "stride": _ints(m.stride),
            "padding": m.padding if isinstance(m.padding, str) else _ints(m.padding),
            "dilation": _ints(m.dilation), "groups": m.groups, "bias": m.bias is not None,
            "padding_mode": "zeros"}


def _conv_transpose_args(m, path):
    if m.padding_mode != "zeros":  # torch refuses the others itself
        raise ExportError(f"cannot export {_where(path, m)}: padding_mode={m.padding_mode!r}; "
                          "Grove pads with zeros only")
    return {"in_channels": m.in_channels, "out_channels": m.out_channels,
            "kernel_size": _ints(m.kernel_size), "stride": _ints(m.stride),
            "padding": _ints(m.padding), "output_padding": _ints(m.output_padding),
            "groups": m.groups, "bias": m.bias is not None, "dilation": _ints(m.dilation),
            "padding_mode": "zeros"}


def _max_pool_args(m, path):
    if m.return_indices:
        raise ExportError(f"cannot export {_where(path, m)}: return_indices=True returns "
                          "(values, indices); Grove serves the values only")
    return {"kernel_size": _ints(m.kernel_size), "stride": _ints(m.stride),
            "padding": _ints(m.padding), "dilation": _ints(m.dilation),
            "return_indices": False, "ceil_mode": bool(m.ceil_mode)}


def _avg_pool_args(m, path):
    args = {"kernel_size": _ints(m.kernel_size), "stride": _ints(m.stride),
            "padding": _ints(m.padding), "ceil_mode": bool(m.ceil_mode),
            "count_include_pad": bool(m.count_include_pad)}
    if hasattr(m, "divisor_override"):  # torch's AvgPool1d has none
        args["divisor_override"] = m.divisor_override
    return args


def _adaptive_max_args(m, path):
    if m.return_indices:
        raise ExportError(f"cannot export {_where(path, m)}: return_indices=True returns "
                          "(values, indices); Grove serves the values only")
    return {"output_size": _ints(m.output_size), "return_indices": False}


def _rnn_args(m, path):
    """RNN / LSTM / GRU (torch.nn.RNNBase): the constructor's arguments."""
    a = {"input_size": m.input_size, "hidden_size": m.hidden_size,
         "num_layers": m.num_layers, "bias": bool(m.bias), "batch_first": bool(m.batch_first),
         "dropout": float(m.dropout), "bidirectional": bool(m.bidirectional)}
    if m.mode in ("RNN_TANH", "RNN_RELU"):
        a["nonlinearity"] = "tanh" if m.mode == "RNN_TANH" else "relu"
    if m.mode == "LSTM":
        a["proj_size"] = int(getattr(m, "proj_size", 0))
    return a


def _rnn_slots(m):
    """torch's flat weight names for this configuration (weight_ih_l0, ...,
    weight_hr_l1_reverse), in its order."""
    return tuple(getattr(m, "_flat_weights_names", ()))


def _embedding_bag_args(m, path):
    _refuse_max_norm(m, path)
    return {"num_embeddings": m.num_embeddings, "embedding_dim": m.embedding_dim,
            "max_norm": None, "norm_type": float(m.norm_type),
            "scale_grad_by_freq": bool(m.scale_grad_by_freq), "mode": m.mode,
            "sparse": bool(m.sparse), "include_last_offset": bool(m.include_last_offset),
            "padding_idx": m.padding_idx}


def _mha_args(m, path):
    return {"embed_dim": m.embed_dim, "num_heads": m.num_heads, "dropout": float(m.dropout),
            "bias": m.in_proj_bias is not None, "add_bias_kv": m.bias_k is not None,
            "add_zero_attn": bool(m.add_zero_attn), "kdim": m.kdim, "vdim": m.vdim,
            "batch_first": bool(m.batch_first)}


def _activation_name(act):
    import torch.nn as nn
    import torch.nn.functional as F
    if act is F.relu or type(act) is nn.ReLU:
        return "relu"
    if act is F.gelu or (type(act) is nn.GELU and getattr(act, "approximate", "none") == "none"):
        return "gelu"
    return None


def _tel_args(m, path):
    """An encoder or decoder layer's arguments (torch spells them alike)."""
    act = _activation_name(m.activation)
    if act is None:
        raise ExportError(f"cannot export {_where(path, m)}: activation {m.activation!r} is not "
                          "supported (Grove runs relu and gelu)")
    norms = [n for n in ("norm1", "norm2", "norm3") if hasattr(m, n)]
    if len({getattr(m, n).eps for n in norms}) != 1:
        raise ExportError(f"cannot export {_where(path, m)}: {', '.join(norms)} have different "
                          "eps")
    return {"d_model": m.self_attn.embed_dim, "nhead": m.self_attn.num_heads,
            "dim_feedforward": m.linear1.out_features, "dropout": float(m.dropout.p),
            "activation": act, "layer_norm_eps": float(m.norm1.eps),
            "batch_first": bool(m.self_attn.batch_first), "norm_first": bool(m.norm_first)}


def _te_args(m, path, decoder=False):
    import torch.nn as nn
    layer_cls = nn.TransformerDecoderLayer if decoder else nn.TransformerEncoderLayer
    layers = list(m.layers)
    if not layers:
        raise ExportError(f"cannot export {_where(path, m)}: it has no layers")
    for i, layer in enumerate(layers):
        if type(layer) is not layer_cls:
            raise ExportError(f"cannot export {_where(_join(path, f'layers.{i}'), layer)}: Grove "
                              f"runs {'de' if decoder else 'en'}coders of torch.nn."
                              f"{layer_cls.__name__} only")
    first = _tel_args(layers[0], _join(path, "layers.0"))
    for i, layer in enumerate(layers[1:], 1):
        if _tel_args(layer, _join(path, f"layers.{i}")) != first:
            raise ExportError(f"cannot export {_where(path, m)}: layer {i} is configured "
                              "differently from layer 0 (Grove builds num_layers copies of one)")
    norm = getattr(m, "norm", None)
    if norm is not None and type(norm) is not nn.LayerNorm:
        raise ExportError(f"cannot export {_where(path, m)}: its norm is a "
                          f"{type(norm).__name__}; Grove runs a LayerNorm or none")
    out = {("decoder_layer" if decoder else "encoder_layer"):
           dict({"type": layer_cls.__name__}, **first),
           "num_layers": len(layers),
           "norm": None if norm is None else dict({"type": "LayerNorm"},
                                                  **_layer_norm_args(norm, _join(path, "norm")))}
    if not decoder:
        out["enable_nested_tensor"] = bool(getattr(m, "enable_nested_tensor", True))
        out["mask_check"] = bool(getattr(m, "mask_check", True))
    return out


def _transformer_args(m, path):
    """nn.Transformer's own arguments, read back from its encoder and decoder
    (which must be torch's, with one configuration for every layer)."""
    import torch.nn as nn
    if type(m.encoder) is not nn.TransformerEncoder or type(m.decoder) is not nn.TransformerDecoder:
        raise ExportError(f"cannot export {_where(path, m)}: a custom encoder or decoder is not "
                          "supported (export the model that calls them instead)")
    enc = _te_args(m.encoder, _join(path, "encoder"))
    dec = _te_args(m.decoder, _join(path, "decoder"), decoder=True)
    el = {k: v for k, v in enc["encoder_layer"].items() if k != "type"}
    dl = {k: v for k, v in dec["decoder_layer"].items() if k != "type"}
    if el != dl:
        raise ExportError(f"cannot export {_where(path, m)}: its encoder and decoder layers are "
                          "configured differently")
    for part, a in (("encoder", enc), ("decoder", dec)):
        norm = a["norm"]
        if norm is None or norm["eps"] != el["layer_norm_eps"] or \
                list(norm["normalized_shape"]) != [el["d_model"]] or \
                not norm["elementwise_affine"]:
            raise ExportError(f"cannot export {_where(path, m)}: its {part}.norm is not the "
                              "LayerNorm(d_model, layer_norm_eps) torch.nn.Transformer makes")
    return dict(el, num_encoder_layers=enc["num_layers"], num_decoder_layers=dec["num_layers"])


def _rebuild(kind, args):
    """torch's own module for a composite's arguments, to compare layouts."""
    import torch.nn as nn
    a = {k: v for k, v in args.items()}
    if kind.cls in (nn.TransformerEncoder, nn.TransformerDecoder):
        dec = kind.cls is nn.TransformerDecoder
        layer_cls = nn.TransformerDecoderLayer if dec else nn.TransformerEncoderLayer
        layer = layer_cls(**{k: v for k, v in a["decoder_layer" if dec else "encoder_layer"].items()
                             if k != "type"})
        norm = a["norm"]
        norm = None if norm is None else nn.LayerNorm(norm["normalized_shape"], eps=norm["eps"],
                                                      elementwise_affine=norm["elementwise_affine"])
        extra = {} if dec else {"enable_nested_tensor": False}
        return kind.cls(layer, a["num_layers"], norm=norm, **extra)
    return kind.cls(**a)


def _kinds():
    import torch.nn as nn
    none = lambda m, path: {}  # noqa: E731
    inplace = lambda m, path: {"inplace": bool(m.inplace)}  # noqa: E731
    bn_slots = dict(params=("weight", "bias"),
                    buffers=("running_mean", "running_var", "num_batches_tracked"),
                    shape_preserving=True)
    in_slots = dict(params=("weight", "bias"),
                    buffers=("running_mean", "running_var", "num_batches_tracked"),
                    shape_preserving=True)
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
        _Kind(nn.BatchNorm1d, _bn_args, **bn_slots),
        _Kind(nn.LayerNorm, _layer_norm_args,
              params=("weight", "bias"), shape_preserving=True),
        _Kind(nn.Embedding, _embedding_args, params=("weight",)),
        _Kind(nn.EmbeddingBag, _embedding_bag_args, params=("weight",)),
        _Kind(nn.RNN, _rnn_args, params=_rnn_slots),
        _Kind(nn.LSTM, _rnn_args, params=_rnn_slots),
        _Kind(nn.GRU, _rnn_args, params=_rnn_slots),
        _Kind(nn.Conv1d, _conv_args, params=("weight", "bias")),
        _Kind(nn.Conv2d, _conv_args, params=("weight", "bias")),
        _Kind(nn.ConvTranspose2d, _conv_transpose_args, params=("weight", "bias")),
        _Kind(nn.BatchNorm2d, _bn_args, **bn_slots),
        _Kind(nn.MaxPool1d, _max_pool_args),
        _Kind(nn.MaxPool2d, _max_pool_args),
        _Kind(nn.AvgPool1d, _avg_pool_args),
        _Kind(nn.AvgPool2d, _avg_pool_args),
        _Kind(nn.AdaptiveAvgPool1d, lambda m, path: {"output_size": _ints(m.output_size)}),
        _Kind(nn.AdaptiveAvgPool2d, lambda m, path: {"output_size": _ints(m.output_size)}),
        _Kind(nn.GroupNorm, lambda m, path: {"num_groups": m.num_groups,
                                             "num_channels": m.num_channels, "eps": float(m.eps),
                                             "affine": bool(m.affine)},
              params=("weight", "bias"), shape_preserving=True),
        _Kind(nn.InstanceNorm1d, _instance_norm_args, **in_slots),
        _Kind(nn.InstanceNorm2d, _instance_norm_args, **in_slots),
        # PReLU's init only fills the weight, which the state_dict replaces.
        _Kind(nn.PReLU, lambda m, path: {"num_parameters": m.num_parameters},
              params=("weight",), shape_preserving=True),
        _Kind(nn.AdaptiveMaxPool1d, _adaptive_max_args),
        _Kind(nn.AdaptiveMaxPool2d, _adaptive_max_args),
        _Kind(nn.MultiheadAttention, _mha_args,
              params=("in_proj_weight", "q_proj_weight", "k_proj_weight", "v_proj_weight",
                      "in_proj_bias", "bias_k", "bias_v"), optional=("bias_k", "bias_v"),
              composite=True),
        _Kind(nn.TransformerEncoderLayer, _tel_args, composite=True),
        _Kind(nn.TransformerEncoder, _te_args, composite=True),
        _Kind(nn.TransformerDecoderLayer, _tel_args, composite=True),
        _Kind(nn.TransformerDecoder, lambda m, path: _te_args(m, path, decoder=True),
              composite=True),
        _Kind(nn.Transformer, _transformer_args, composite=True),
        _Kind(nn.Sequential, none, container=True),
        _Kind(nn.ModuleList, none, container=True, callable_=False),
        _Kind(nn.ModuleDict, none, container=True, callable_=False),
    ]
    kinds = {k.cls: k for k in ks}
    # The parameter-free modules of the op table (ReLU6, Hardswish, ...,
    # tools/grove_ops.json): their constructor arguments are the table's,
    # read off the instance by name.
    with open(_OPS_FILE) as f:
        doc = json.load(f)
    for op in doc["ops"]:
        mod = op.get("module")
        cls = getattr(nn, mod["class"], None) if mod else None
        if cls is None or cls in kinds:
            continue
        names = [a["name"] for a in mod["args"]]
        kinds[cls] = _Kind(cls, (lambda names: lambda m, path: {
            n: _plain(getattr(m, n)) for n in names})(names), shape_preserving=op["name"] in
            _SHAPE_KEEPING)
    return kinds


# Op-table modules that keep their input's shape (input inference looks
# through them).
_SHAPE_KEEPING = {"relu6", "hardswish", "hardsigmoid", "hardtanh", "elu", "selu", "celu",
                  "softplus", "mish"}


def _plain(v):
    """A module attribute as model.json writes it (a tuple becomes a list)."""
    if isinstance(v, bool) or v is None or isinstance(v, (int, str)):
        return v
    if isinstance(v, float):
        return float(v)
    if isinstance(v, (tuple, list)):
        return [_plain(x) for x in v]
    return v


_KINDS = None


def _supported_names():
    return ", ".join(sorted(k.name for k in _KINDS.values()))


def _kind_of(m, path):
    """The _Kind of m; None for a custom module (its forward is exported as a
    torch.fx graph); ExportError for a torch.nn type Grove does not run.  An
    exact supported class is a kind, and so is a subclass that keeps the base
    class's forward (the common `class MLP(nn.Sequential)` with only an
    __init__); a subclass with its own forward is custom."""
    global _KINDS
    if _KINDS is None:
        _KINDS = _kinds()
    import torch.fx
    cls = type(m)
    if cls in _KINDS:
        return _KINDS[cls]
    if isinstance(m, torch.fx.GraphModule):
        return None
    for base in cls.__mro__[1:]:
        if base in _KINDS:
            return _KINDS[base] if cls.forward is base.forward else None
    if cls.__module__.split(".")[0] == "torch":
        raise ExportError(
            f"cannot export {_where(path, m)}: torch.nn.{cls.__name__} is not a type Grove "
            f"runs. Supported: {_supported_names()}")
    return None


def _join(prefix, name):
    return f"{prefix}.{name}" if prefix else name


# ---------------------------------------------------------------- the walk


def _check_hooks(m, path):
    if m._forward_hooks or m._forward_pre_hooks:
        raise ExportError(
            f"cannot export {_where(path, m)}: it has forward hooks or pre-hooks, which "
            "change what it computes and are not part of the model directory; remove them "
            "(handle.remove()) before exporting")


def _check_slots(m, path, kind):
    got_p = list(m._parameters.keys())
    got_b = list(m._buffers.keys())
    want_p = kind.params(m) if callable(kind.params) else kind.params
    extra = [n for n in got_p if n not in want_p] + [n for n in got_b if n not in kind.buffers]
    missing = [n for n in want_p if n not in m._parameters and n not in kind.optional] + \
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
    if not kind.container and not kind.composite and len(m._modules) > 0:
        names = ", ".join(repr(n) for n in m._modules)
        raise ExportError(f"cannot export {_where(path, m)}: it has child module(s) {names}, "
                          f"which torch.nn.{kind.name} does not have and would not call")
    _check_hooks(m, path)


def _check_composite(m, path, kind, args):
    """A composite's submodules are Grove's own: torch's constructor with the
    same arguments must give the same state_dict keys and shapes, and nothing
    inside may carry hooks."""
    for sub_path, sub in m.named_modules(prefix=path):
        if sub is not m:
            _check_hooks(sub, sub_path)
    got = [(k, tuple(v.shape)) for k, v in m.state_dict().items()]
    want = [(k, tuple(v.shape)) for k, v in _rebuild(kind, args).state_dict().items()]
    if got != want:
        diff = [g for g in got if g not in want] + [w for w in want if w not in got]
        raise ExportError(
            f"cannot export {_where(path, m)}: its parameters differ from those torch.nn."
            f"{kind.name} makes for the same arguments ({diff[:4]}); it was changed after "
            "construction")


class _CustomParent:
    """The parent kind of a custom module's children: it calls what its
    graph calls, so a ModuleList child is fine."""
    name = "a custom module"
    callable = False
    composite = False


_CUSTOM_PARENT = _CustomParent()


def module_spec(model, require_callable=True):
    """The "module" value of model.json for model: a dict as described in
    docs/model-spec.md.  torch.nn modules Grove runs are written with their
    constructor arguments; a module with its own forward is written with its
    torch.fx graph (see _graph), its own parameters and buffers, and its
    children.  Raises ExportError naming the dotted path and class of the first
    module Grove cannot run (and, for a graph, the operation and the line of
    forward).  With require_callable (the default), a tree whose forward torch
    itself could not run (a ModuleList or ModuleDict as the root or as a
    Sequential's child) is refused too."""
    seen = {}        # id(module) -> dotted path of its first occurrence
    inside = {}      # id(module) -> path, for the submodules of composites
    first_param = {}  # id(parameter) -> dotted path of its first occurrence
    on_stack = set()
    called = set()   # ids of modules a graph or a called Sequential calls

    def params_and_ties(m, path, spec):
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

    def walk(m, path, parent_kind, is_called):
        if m is None:
            return None
        if id(m) in on_stack:
            raise ExportError(f"cannot export {_where(path, m)}: the module contains itself "
                              f"(it is also '{seen[id(m)]}', an ancestor)")
        if id(m) in inside:
            raise ExportError(f"cannot export {_where(path, m)}: it is also '{inside[id(m)]}', "
                              "inside a layer Grove builds itself; share it the other way round")
        if id(m) in seen:
            kind = _kind_of(m, path)
            if require_callable and parent_kind is not None and parent_kind.callable \
                    and kind is not None and not kind.callable:
                raise _not_callable(m, path, parent_kind)
            return {"ref": seen[id(m)]}
        kind = _kind_of(m, path)
        if kind is None:
            return walk_custom(m, path, is_called)
        args = kind.args(m, path)
        _check_slots(m, path, kind)
        if kind.composite:
            _check_composite(m, path, kind, args)
        if require_callable:
            if parent_kind is None and not kind.callable:
                raise ExportError(f"cannot export {_where(path, m)}: torch.nn.{kind.name} has "
                                  "no forward, so there is nothing to serve")
            if parent_kind is not None and parent_kind.callable and not kind.callable:
                raise _not_callable(m, path, parent_kind)
        seen[id(m)] = path
        spec = {"type": kind.name}
        spec.update(args)
        params_and_ties(m, path, spec)
        if kind.composite:
            for sub_path, sub in m.named_modules(prefix=path):
                if sub is not m:
                    inside[id(sub)] = sub_path
            for sub_path, p in m.named_parameters(prefix=path):
                first_param.setdefault(id(p), sub_path)
        if kind.container:
            on_stack.add(id(m))
            names = list(m._modules.keys())
            kids_called = is_called and kind.name == "Sequential"
            kids = [walk(c, _join(path, n), kind, kids_called or id(c) in called)
                    for n, c in m._modules.items()]
            on_stack.discard(id(m))
            positional = names == [str(i) for i in range(len(names))]
            if kind.name == "ModuleDict" or not positional:
                spec["children"] = dict(zip(names, kids))
            else:
                spec["children"] = kids
        return spec

    def walk_custom(m, path, is_called):
        _check_hooks(m, path)
        seen[id(m)] = path
        spec = {"type": type(m).__name__}
        graph = None
        if is_called:
            graph = _graph(m, path)
            for node in graph:
                if node["op"] == "call_module":
                    called.add(id(m.get_submodule(node["target"])))
        params = {}
        for pname, p in m._parameters.items():
            params[pname] = None if p is None else \
                {"shape": list(p.shape), "dtype": _dtype_name(p.dtype)}
        if params:
            spec["parameters"] = params
        non_persistent = getattr(m, "_non_persistent_buffers_set", set())
        bufs = {}
        for bname, b in m._buffers.items():
            if bname in non_persistent:
                continue  # not in the state_dict; a graph that reads one was refused
            bufs[bname] = None if b is None else \
                {"shape": list(b.shape), "dtype": _dtype_name(b.dtype)}
        if bufs:
            spec["buffers"] = bufs
        params_and_ties(m, path, spec)
        on_stack.add(id(m))
        kids = {n: walk(c, _join(path, n), _CUSTOM_PARENT, id(c) in called)
                for n, c in m._modules.items()}
        on_stack.discard(id(m))
        if kids:
            spec["children"] = kids
        spec["graph"] = graph
        return spec

    return walk(model, "", None, True)


def _check_cycles(model):
    on_stack, first = set(), {}

    def walk(m, path):
        if m is None:
            return
        if id(m) in on_stack:
            raise ExportError(f"cannot export {_where(path, m)}: the module contains itself "
                              f"(it is also '{first[id(m)]}', an ancestor)")
        first.setdefault(id(m), path)
        on_stack.add(id(m))
        for n, c in m._modules.items():
            walk(c, _join(path, n))
        on_stack.discard(id(m))

    walk(model, "")


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


# ---------------------------------------------------------------- graphs (torch.fx)

# Operations a graph may call, read from tools/grove_ops.json: the op table of
# core/nn/ops_*.c written out by tools/grove_ops_json.c (`make ops-json`; `make
# test` fails when it is stale), so that the exporter and Grove never drift.
# Each op lists its canonical name (the node's target), its parameters in
# Grove's order, and every torch spelling, each with the positional
# parameters of that callable ("torch.nn.functional.softmax(input,dim,
# _stacklevel,dtype)"; a "*shape" gathers the rest; a Tensor method's first
# is self).
_OPS_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "grove_ops.json")
_TABLE = None
# Arguments that change nothing in eval mode, dropped from the file.
_DROP = {"inplace", "_stacklevel", "memory_format"}


# The canonical name -> the index of its *args parameter (-1: none): the
# parameters after it can only be passed by keyword.
_VARARGS = {}


def _table():
    """(functions, methods, canon): the callable fx records -> (canonical
    name, its positional parameters); Tensor method name -> the same; the
    canonical name -> Grove's parameter order.  Spellings this torch lacks
    (torch.concat before 1.10) are skipped."""
    global _TABLE
    if _TABLE is None:
        import builtins
        import operator
        import torch
        with open(_OPS_FILE) as f:
            doc = json.load(f)
        roots = {"torch": torch, "operator": operator, "builtins": builtins}
        funcs, methods, canon = {}, {}, {}
        for op in doc["ops"]:
            if op.get("module_only"):
                continue
            name = op["name"]
            canon[name] = tuple(p["name"] for p in op["params"])
            va = op.get("varargs")  # the parameter's name, or null
            _VARARGS[name] = canon[name].index(va) if va in canon[name] else -1
            for spelling in op["torch"]:
                path, _, plist = spelling.partition("(")
                params = tuple(plist.rstrip(")").split(",")) if plist else canon[name]
                head, _, attr = path.rpartition(".")
                if head == "Tensor":
                    methods[attr] = (name, params)
                    continue
                parts = head.split(".")
                if parts[0] not in roots:
                    # Another package's function (torchvision.ops.stochastic_depth):
                    # resolved when that package is installed, skipped otherwise.
                    try:
                        roots[parts[0]] = importlib.import_module(parts[0])
                    except ImportError:
                        roots[parts[0]] = None
                obj = roots.get(parts[0])
                for part in parts[1:]:
                    obj = getattr(obj, part, None)
                fn = getattr(obj, attr, None) if obj is not None else None
                if fn is not None:
                    funcs[fn] = (name, params)
        _TABLE = (funcs, methods, canon)
    return _TABLE


def _fn_name(fn):
    """A readable name for a callable fx recorded: torch.sin, operator.neg,
    torch.nn.functional.linear; another package's function by the shortest
    module path that exports it (torchvision.ops.stochastic_depth, not
    torch.stochastic_depth)."""
    mod = getattr(fn, "__module__", None) or ""
    top = mod.split(".")[0]  # a package name, not a prefix: torchvision is not torch
    name = getattr(fn, "__name__", repr(fn))
    if mod in ("_operator", "operator"):
        mod = "operator"
    elif mod.startswith("torch._C._nn") or mod.startswith("torch.nn.functional"):
        mod = "torch.nn.functional"
    elif top == "torch":
        mod = "torch"
    elif mod:
        parts = mod.split(".")
        for k in range(1, len(parts) + 1):
            owner = sys.modules.get(".".join(parts[:k]))
            if owner is not None and getattr(owner, name, None) is fn:
                mod = ".".join(parts[:k])
                break
    return f"{mod}.{name}" if mod else name


def _source(node):
    """'file.py:42: code' for the line of forward a node came from (the first
    frame of its recorded stack outside torch's own package), or None.  The
    test is on directories, not on a string prefix: torchvision (installed
    beside torch, /usr/lib/python3/dist-packages/torchvision) is the model's
    code, and its frames are the ones to quote."""
    import os
    import re
    import torch
    trace = node.stack_trace or ""
    torch_dir = os.path.join(os.path.realpath(os.path.dirname(torch.__file__)), "")
    lines = trace.splitlines()
    for i, line in enumerate(lines):
        mt = re.match(r'\s*File "(.*)", line (\d+), in (.*)', line)
        if not mt:
            continue
        fname = mt.group(1)
        if os.path.realpath(fname).startswith(torch_dir) or fname == __file__:
            continue
        code = lines[i + 1].strip() if i + 1 < len(lines) and \
            not lines[i + 1].lstrip().startswith("File ") else ""
        return f"{os.path.basename(fname)}:{mt.group(2)}: {code}" if code else \
            f"{os.path.basename(fname)}:{mt.group(2)}"
    return None


class _Patch:
    """torch 1.13's fx unpacks a traced tuple (`a, b = self.attn(...)`) by
    reading the caller's bytecode at f_lasti // 2, which is wrong from Python
    3.11 on (f_lasti counts bytes and instructions have inline caches).  For
    the duration of a trace, Proxy.__iter__ finds the instruction by its
    offset instead."""

    def __enter__(self):
        import dis
        import inspect
        import torch.fx as fx
        self.orig = fx.Proxy.__iter__

        def proxy_iter(proxy):
            frame = inspect.currentframe().f_back
            for inst in dis.get_instructions(frame.f_code):
                if inst.offset == frame.f_lasti:
                    if inst.opname == "UNPACK_SEQUENCE":
                        return (proxy[i] for i in range(inst.argval))
                    break
            return proxy.tracer.iter(proxy)

        fx.Proxy.__iter__ = proxy_iter
        return self

    def __exit__(self, *exc):
        import torch.fx as fx
        fx.Proxy.__iter__ = self.orig
        return False


def _trace(m, path):
    """torch.fx graph of m.forward, every submodule call kept as a
    call_module (Grove runs each submodule itself: torch.nn layers, and
    custom modules through their own graphs)."""
    import torch
    import torch.fx as fx

    class Tracer(fx.Tracer):
        def __init__(self):
            super().__init__()
            self.record_stack_traces = True
            # Buffers as get_attr nodes, as parameters are: real sequence
            # code slices them by a traced length (self.position_ids[:, :t],
            # a causal mask[:t, :t]), which fx 1.13 (off by default) would
            # try on the tensor itself with a Proxy index.
            self.proxy_buffer_attributes = True
            # torch.full((t, t), ...), torch.arange(0, t), torch.zeros(x.size())
            # with a traced size: their arguments are no tensors, so
            # __torch_function__ never sees the Proxy and torch raises.  fx
            # wraps these (as fx.wrap would) while it traces.
            makers = [getattr(torch, n) for n in ("full", "zeros", "ones", "arange", "empty")
                      if hasattr(torch, n)]
            if hasattr(self, "_autowrap_search") and hasattr(self, "_autowrap_function_ids"):
                self._autowrap_function_ids.update(id(f) for f in makers)
                self._autowrap_search.append(torch)

        def is_leaf_module(self, mod, qualname):
            return True

    before = set(vars(m))
    real_finfo = torch.finfo

    def finfo(t=None):
        # torch.finfo(x.dtype) of a traced float tensor: Grove computes in
        # float32, so its limits are float32's (a constant in the graph).
        return real_finfo(torch.float32 if isinstance(t, fx.Proxy) else t) if t is not None \
            else real_finfo()

    try:
        torch.finfo = finfo
        with _Patch():
            return Tracer().trace(m)
    except ExportError:
        raise
    except Exception as e:  # fx says what it could not follow (control flow on values, ...)
        msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise ExportError(f"cannot export {_where(path, m)}: torch.fx cannot trace its forward: "
                          f"{type(e).__name__}: {msg}") from e
    finally:
        torch.finfo = real_finfo
        # fx stores tensor constants created in forward on the module.
        for k in set(vars(m)) - before:
            delattr(m, k)


def _drop_shape_guards(graph):
    """Removes the torch._assert(cond, msg) calls of a traced forward and
    the nodes that only computed their conditions (h == self.image_size,
    x.dim() == 3).  Traced on the example, such a guard checks the shapes of
    the example; what it guards is what model.json's input shapes fix (a
    dim the model does not take one larger is fixed, _io), and Grove checks
    every request against those, so the guard has nothing left to do."""
    import torch
    guards = [n for n in graph.nodes if n.op == "call_function" and n.target is torch._assert]
    if not guards:
        return
    feeding = set()
    todo = list(guards)
    while todo:
        n = todo.pop()
        for a in n.all_input_nodes:
            if a not in feeding:
                feeding.add(a)
                todo.append(a)
    import builtins
    import operator
    for n in guards:
        graph.erase_node(n)

    def shape_read(n):  # `n, c, h, w = x.shape` leaves the unused n behind
        return (n.op == "call_function" and n.target in (builtins.getattr, operator.getitem)) or \
            (n.op == "call_method" and n.target in ("size", "dim"))

    for n in reversed(list(graph.nodes)):
        if not n.users and (n in feeding and n.op in ("call_function", "call_method", "get_attr")
                            or shape_read(n)):
            graph.erase_node(n)


def _graph(m, path):
    """The "graph" of a custom module: its fx nodes in the format of
    docs/model-spec.md.  Refuses, naming the operation and the line of
    forward, what Grove cannot run."""
    import math
    import torch
    import torch.fx as fx
    graph = _trace(m, path)
    _drop_shape_guards(graph)
    ops, methods, canons = _table()
    out = []

    def refuse(node, why):
        src = _source(node)
        where = f"forward line {src}" if src else f"node '{node.name}' of its forward"
        raise ExportError(f"cannot export {_where(path, m)}: {where}: {why}")

    dict_keys = {}  # id(submodule) -> the keys of the dict its forward returns

    def key_index(node, src, key):
        """features["out"] on what a submodule returned as a dict (torchvision's
        IntermediateLayerGetter): Grove passes that dict as a tuple in the
        order of its keys (the submodule's graph writes its values so), so
        the key becomes its position."""
        keys = None
        if isinstance(src, fx.Node) and src.op == "call_module":
            sub = m.get_submodule(src.target)
            if _kind_of(sub, _join(path, src.target)) is None:
                if id(sub) not in dict_keys:
                    out = [n for n in _trace(sub, _join(path, src.target)).nodes
                           if n.op == "output"]
                    res = out[0].args[0] if out else None
                    dict_keys[id(sub)] = list(res) if isinstance(res, dict) else None
                keys = dict_keys[id(sub)]
        if keys is None or key not in keys:
            refuse(node, f"indexing by the key {key!r} is supported only on the dict a submodule "
                         "returns")
        return keys.index(key)

    def enc(node, a):
        if isinstance(a, fx.Node):
            return {"node": a.name}
        if a is None or isinstance(a, (bool, int, str)):
            return a
        if isinstance(a, float):
            if not math.isfinite(a):  # JSON has no infinities (masks fill with -inf)
                return {"float": "nan" if math.isnan(a) else ("inf" if a > 0 else "-inf")}
            return a
        if isinstance(a, torch.dtype):
            return _dtype_name(a)
        if isinstance(a, (list, tuple)):
            return [enc(node, x) for x in a]
        if isinstance(a, slice):
            return {"slice": [enc(node, a.start), enc(node, a.stop), enc(node, a.step)]}
        if isinstance(a, torch.dtype):  # x.to(torch.float32): model.json's dtype names
            return str(a).replace("torch.", "")
        if isinstance(a, torch.device):  # x.to(device): Grove serves on the CPU
            return str(a)
        if a is Ellipsis:
            return {"ellipsis": True}
        if isinstance(a, torch.Tensor):
            refuse(node, "a tensor constant in an argument is not supported (register it as a "
                         "buffer)")
        refuse(node, f"an argument of type {type(a).__name__} ({a!r}) is not supported")

    def bind(node, name, params, args, kwargs):
        """names -> values for the callable's parameters."""
        star = [i for i, p in enumerate(params) if p.startswith("*")]
        if star:  # view(*shape), reshape(*shape), permute(*dims)
            k = star[0]
            bound = dict(zip(params[:k], args[:k]))
            rest = list(args[k:])
            if len(rest) == 1:
                rest = rest[0]
            bound[params[k][1:]] = rest
            bound.update(kwargs)
            return bound
        if len(args) > len(params):
            refuse(node, f"{name} called with {len(args)} positional arguments")
        bound = dict(zip(params, args))
        bound.update(kwargs)
        return bound

    def check(node, name, b):
        const = lambda v: not isinstance(v, fx.Node)  # noqa: E731
        if name == "div" and b.get("rounding_mode") is not None:
            refuse(node, f"div with rounding_mode={b['rounding_mode']!r} is not supported")
        if name == "dropout" and b.get("training", True) is not False:
            refuse(node, "F.dropout with training=True drops activations at random even in "
                         "eval mode; pass training=self.training")
        if name in ("softmax", "log_softmax", "mean", "sum") and b.get("dtype") is not None:
            refuse(node, f"{name} with a dtype is not supported")
        if name in ("softmax", "log_softmax") and not (b.get("dim") is None or
                                                      (const(b["dim"]) and
                                                       isinstance(b["dim"], int))):
            refuse(node, f"{name} needs a constant integer dim")
        if name == "gelu" and b.get("approximate", "none") not in ("none", "tanh"):
            refuse(node, f"gelu approximate={b['approximate']!r} is not supported")
        if name == "flatten" and not all(isinstance(b.get(k, 0), int) and const(b.get(k, 0))
                                         for k in ("start_dim", "end_dim")):
            refuse(node, "flatten needs constant integer dims")
        if name == "getattr" and b.get("name") not in ("shape", "ndim", "device", "dtype"):
            refuse(node, f"getattr of {b.get('name')!r} is not supported (only .shape, .ndim, "
                         ".device, .dtype)")
        if name in ("mean", "sum") and not isinstance(b.get("keepdim", False), bool):
            refuse(node, f"{name} needs a constant keepdim")

    def emit_call(node, name, b):
        check(node, name, b)
        canon = canons[name]
        b = {k: v for k, v in b.items() if k not in _DROP and not (k == "dtype" and v is None)}
        args, kwargs = [], {}
        va = _VARARGS.get(name, -1)
        for p in canon:
            if va >= 0 and canon.index(p) > va:
                break  # after zeros(*size): dtype=... by keyword
            if p in b and len(args) == canon.index(p):
                args.append(enc(node, b.pop(p)))
        for k, v in b.items():
            if k not in canon:
                refuse(node, f"{name} has no argument {k!r} Grove knows")
            kwargs[k] = enc(node, v)
        spec = {"op": node.op, "name": node.name, "target": name, "args": args}
        if kwargs:
            spec["kwargs"] = kwargs
        return spec

    for node in graph.nodes:
        src = _source(node)
        if node.op == "placeholder":
            if str(node.target).startswith("*"):
                refuse(node, "a forward with *args or **kwargs is not supported")
            spec = {"op": "placeholder", "name": node.name}
            if node.args:
                spec["default"] = enc(node, node.args[0])
                if isinstance(spec["default"], (list, dict)):
                    refuse(node, f"the default of '{node.target}' is not a number or None")
        elif node.op == "get_attr":
            target = node.target
            owner_path, _, slot = target.rpartition(".")
            try:
                owner = m.get_submodule(owner_path)
            except AttributeError:
                owner = None
            persistent = owner is not None and (
                slot in owner._parameters or
                (slot in owner._buffers and
                 slot not in getattr(owner, "_non_persistent_buffers_set", set())))
            if not persistent:
                refuse(node, f"self.{target} is not a parameter or persistent buffer, so its "
                             "value is not in the state_dict (a tensor made in forward, or "
                             "stored as a plain attribute); register it with "
                             "register_buffer(name, tensor) or as an nn.Parameter")
            spec = {"op": "get_attr", "name": node.name, "target": target}
        elif node.op == "call_module":
            sub = m.get_submodule(node.target)
            call_args, call_kwargs = _module_call_args(node, sub, refuse)
            spec = {"op": "call_module", "name": node.name, "target": node.target,
                    "args": [enc(node, a) for a in call_args]}
            if call_kwargs:
                spec["kwargs"] = {k: enc(node, v) for k, v in call_kwargs.items()}
            _check_module_call(node, sub, call_args, call_kwargs, refuse)
        elif node.op == "call_function":
            if node.target is operator.getitem and isinstance(node.args[1], str):
                node.args = (node.args[0], key_index(node, node.args[0], node.args[1]))
            if node.target not in ops:
                refuse(node, f"operation {_fn_name(node.target)} is not supported by Grove "
                             f"(supported: {', '.join(sorted(set(n for n, _ in ops.values())))})")
            name, params = ops[node.target]
            spec = emit_call(node, name, bind(node, name, params, node.args, dict(node.kwargs)))
        elif node.op == "call_method":
            if node.target not in methods:
                refuse(node, f"method Tensor.{node.target} is not supported by Grove "
                             f"(supported: {', '.join(sorted(methods))})")
            name, params = methods[node.target]
            spec = emit_call(node, name, bind(node, name, params, node.args,
                                              dict(node.kwargs)))
        elif node.op == "output":
            res = node.args[0]
            if isinstance(res, dict):  # torchvision's segmentation nets: {"out": ..., "aux": ...}
                res = tuple(res.values())
            items = list(res) if isinstance(res, (list, tuple)) else [res]
            if not items or not all(isinstance(x, fx.Node) for x in items) or len(items) > 4:
                refuse(node, "forward must return a tensor or a tuple of 1 to 4 tensors")
            spec = {"op": "output", "name": node.name, "args": [enc(node, res)]}
        else:
            refuse(node, f"fx node kind {node.op!r} is not supported")
        if src and node.op not in ("placeholder", "output"):
            spec["source"] = src
        out.append(spec)
    return out


def _module_call_args(node, sub, refuse):
    """(args, kwargs) of a call_module as model.json writes them.  A recurrent
    net's and an EmbeddingBag's keyword arguments become positional (graph.c
    passes module tensors positionally): RNN/GRU (input, hx), LSTM (input,
    (h0, c0)); EmbeddingBag (input, offsets, per_sample_weights), with a None
    offsets left out before per_sample_weights (Grove's EmbeddingBag reads a
    float second tensor as the weights)."""
    import inspect
    import torch.nn as nn
    if not isinstance(sub, (nn.RNNBase, nn.EmbeddingBag)):
        return list(node.args), dict(node.kwargs)
    try:
        b = inspect.signature(type(sub).forward).bind(sub, *node.args, **node.kwargs)
    except TypeError as e:
        refuse(node, f"{type(sub).__name__} call: {e}")
    b.apply_defaults()
    vals = list(b.arguments.values())[1:]
    if isinstance(sub, nn.EmbeddingBag) and len(vals) == 3 and vals[1] is None \
            and vals[2] is not None:
        vals = [vals[0], vals[2]]
    while vals and vals[-1] is None:
        vals.pop()
    return vals, {}


def _check_module_call(node, sub, call_args, call_kwargs, refuse):
    """What graph.c accepts for a call_module: tensors in; the attention and
    transformer modules also take masks (tensors or None) and constant
    need_weights / average_attn_weights."""
    import inspect
    import torch.fx as fx
    import torch.nn as nn
    mask_types = (nn.MultiheadAttention, nn.TransformerEncoderLayer, nn.TransformerEncoder,
                  nn.TransformerDecoderLayer, nn.TransformerDecoder, nn.Transformer)
    if type(sub) in mask_types:
        try:
            b = inspect.signature(type(sub).forward).bind(sub, *node.args, **node.kwargs)
        except TypeError as e:
            refuse(node, f"{type(sub).__name__} call: {e}")
        for k, v in list(b.arguments.items())[1:]:
            if "mask" in k and not (v is None or isinstance(v, fx.Node)):
                refuse(node, f"argument {k} of {type(sub).__name__} must be a tensor or None")
            if "is_causal" in k and v:
                refuse(node, f"{k}=True is not supported (pass the causal mask itself)")
            if k in ("need_weights", "average_attn_weights") and not isinstance(v, bool):
                refuse(node, f"argument {k} must be a constant True or False")
        return
    if call_kwargs:
        refuse(node, f"keyword arguments to a {type(sub).__name__} are not supported (Grove "
                     "passes tensors positionally)")
    args = list(call_args)
    while args and args[-1] is None:
        args.pop()
    if isinstance(sub, nn.RNNBase) and len(args) == 2 and isinstance(args[1], (tuple, list)):
        # An LSTM's (h0, c0): graph.c passes the pair as two more tensors.
        args = args[:1] + list(args[1])
    if len(args) > 4 or not all(isinstance(a, fx.Node) for a in args):
        refuse(node, f"a {type(sub).__name__} called with a constant argument: Grove passes "
                     "only tensors (1 to 4) between modules")


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
    if isinstance(y, dict):  # named outputs, in the dict's order (_output_names)
        y = tuple(y.values())
    ys = _flat(y) if isinstance(y, (tuple, list)) else [y]
    if not ys or len(ys) > 4 or not all(isinstance(t, torch.Tensor) for t in ys):
        got = type(y).__name__ if not isinstance(y, (tuple, list)) else \
            f"a {type(y).__name__} of {[type(t).__name__ for t in ys]}"
        raise ExportError(f"the model returned {got} on {what}; Grove serves models that "
                          "return a tensor or a tuple of 1 to 4 tensors")
    return ys


def _io(model, example_input):
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
        dtypes = [x.dtype for x in xs]
        x1 = xs
    elif inferred is None:
        raise ExportError(
            f"cannot tell the input of {_where('', model)} from its first layer (only a "
            "leading Linear or Embedding says it); pass example_input")
    else:
        dtypes, shapes = [inferred["dtype"]], [inferred["shape"]]
        x1 = [_zeros(dtypes[0], [2] + [3 if d == -1 else d for d in shapes[0][1:]])]

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
    # another size gets those dims free.
    if custom:
        for i, x in enumerate(x1):
            if x.dtype.is_floating_point:
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
            if not x.dtype.is_floating_point:
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
    if isinstance(first, dict) and all(isinstance(k, str) and k for k in first):
        names = list(first)  # a dict's keys name the outputs ("out", "aux")
    for name, a, b in zip(names, y1, y2):
        oshape = list(a.shape)
        if b.dim() == a.dim():
            oshape = [-1 if p != q else p for p, q in zip(a.shape, b.shape)]
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

    example_input: a tensor with a batch dimension first (or a tuple of 1
    to 4 of them for a custom forward that takes several); it fixes the
    inputs' dtypes and shapes (dim 0 becomes -1, "any").  Without it the input
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
