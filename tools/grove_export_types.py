#!/usr/bin/env python3
"""grove_export_types: the torch.nn types Grove runs, their constructor
arguments as model.json writes them, and the names shared by the exporter's
parts (ExportError, _where, dtype names).  The bottom of tools/grove_export*.py:
it imports none of the others."""
import json
import os


# ---------------------------------------------------------------- errors


class ExportError(ValueError):
    """The module cannot be exported; the message names the module's dotted
    path and class and says why."""


def _structured(y):
    """A namedtuple, dataclass or HuggingFace ModelOutput result as the dict
    of its fields (a dataclass's None fields left out, as ModelOutput's
    to_tuple() leaves them out); anything else as it is.  Shared by the
    graph's output node (fx values) and the runs that record the outputs
    (tensors), so that both name the outputs alike."""
    import dataclasses
    if isinstance(y, tuple) and hasattr(y, "_fields"):
        return dict(zip(y._fields, y))
    if dataclasses.is_dataclass(y) and not isinstance(y, type):
        if isinstance(y, dict):  # a ModelOutput is an OrderedDict of its set fields
            return dict(y)
        return {f.name: getattr(y, f.name) for f in dataclasses.fields(y)
                if getattr(y, f.name) is not None}
    return y


def _named_flat(y):
    """(names, values) of a model's result, flattened in order: a dict (or
    namedtuple, dataclass, ModelOutput) gives its keys, a value that is itself
    a tuple under a key k gives k_0, k_1, ...; nested tuples give y0, y1, ...
    in order (names None: the caller numbers them)."""
    y = _structured(y)
    if isinstance(y, dict):
        names, vals = [], []
        for k, v in y.items():
            v = _structured(v)
            if isinstance(v, (tuple, list, dict)):
                sub_names, sub = _named_flat(v)
                sub_names = sub_names or [str(i) for i in range(len(sub))]
                names += [f"{k}_{n}" for n in sub_names]
                vals += sub
            else:
                names.append(str(k))
                vals.append(v)
        return names, vals
    if isinstance(y, (tuple, list)):
        vals = []
        for v in y:
            v = _structured(v)
            if isinstance(v, dict):
                return None, [t for v2 in y for t in _named_flat(v2)[1]]
            vals += _named_flat(v)[1] if isinstance(v, (tuple, list)) else [v]
        return None, vals
    return None, [y]


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


def _cell_args(m, path):
    """RNNCell / LSTMCell / GRUCell (torch.nn.RNNCellBase): the constructor's
    arguments."""
    a = {"input_size": m.input_size, "hidden_size": m.hidden_size, "bias": bool(m.bias)}
    if hasattr(m, "nonlinearity"):  # RNNCell
        a["nonlinearity"] = m.nonlinearity
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
        _Kind(nn.Bilinear, lambda m, path: {
            "in1_features": m.in1_features, "in2_features": m.in2_features,
            "out_features": m.out_features, "bias": m.bias is not None},
            params=("weight", "bias")),
        _Kind(nn.RNNCell, _cell_args, params=("weight_ih", "weight_hh", "bias_ih", "bias_hh")),
        _Kind(nn.LSTMCell, _cell_args, params=("weight_ih", "weight_hh", "bias_ih", "bias_hh")),
        _Kind(nn.GRUCell, _cell_args, params=("weight_ih", "weight_hh", "bias_ih", "bias_hh")),
        _Kind(nn.Conv1d, _conv_args, params=("weight", "bias")),
        _Kind(nn.Conv2d, _conv_args, params=("weight", "bias")),
        _Kind(nn.ConvTranspose2d, _conv_transpose_args, params=("weight", "bias")),
        _Kind(nn.ConvTranspose1d, _conv_transpose_args, params=("weight", "bias")),
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
    # The parameter-free modules of the op table (ReLU6, Hardswish, Upsample,
    # ConstantPad2d, ..., tools/grove_ops.json; an op may have several
    # classes, "more_modules"): their constructor arguments are the table's,
    # read off the instance by their torch attribute name ("key" where it is
    # not the op parameter's: ConstantPad2d's padding is pad's pad).
    with open(_OPS_FILE) as f:
        doc = json.load(f)
    for op in doc["ops"]:
        for mod in ([op["module"]] if op.get("module") else []) + op.get("more_modules", []):
            cls = getattr(nn, mod["class"], None)
            if cls is None or cls in kinds:
                continue
            names = [a.get("key", a["name"]) for a in mod["args"]]
            # An argument the class keeps no attribute for is fixed by the
            # class (ReflectionPad2d's mode): the table's default holds.
            kinds[cls] = _Kind(cls, (lambda names: lambda m, path: {
                n: _plain(getattr(m, n)) for n in names if hasattr(m, n)})(names),
                shape_preserving=op["name"] in
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




# The op table the exporter reads (see grove_export_graph._table).
_OPS_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "grove_ops.json")


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
