#!/usr/bin/env python3
"""grove_export_graph: the walk over a module tree (module_spec) and the
torch.fx graphs of the modules Grove does not run as one type.  Imports
grove_export_types only; grove_export (the API and the command line) imports it."""
import importlib
import json
import operator
import os
import sys

from grove_export_types import (  # noqa: E402
    ExportError,
    _OPS_FILE,
    _dtype_name,
    _join,
    _kind_of,
    _named_flat,
    _rebuild,
    _structured,
    _where,
)


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
    global _RESULTS
    _RESULTS = None  # traced afresh for every export: a module may have changed since
    seen = {}        # id(module) -> dotted path of its first occurrence
    inside = {}      # id(module) -> path, for the submodules of composites
    first_param = {}  # id(parameter) -> dotted path of its first occurrence
    on_stack = set()
    called = set()   # ids of modules a graph or a called Sequential calls
    inlined = set()  # ids of custom modules a graph traced through (_traced_through)

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
            graph = _graph(m, path, inlined)
            for node in graph:
                if node["op"] == "call_module":
                    called.add(id(m.get_submodule(node["target"])))
        elif id(m) in inlined:
            # Its forward is part of its caller's graph: no node calls it, so
            # Grove refuses a forward hook on it (docs/exporter.md).
            spec["inlined"] = True
        params = {}
        for pname, p in m._parameters.items():
            params[pname] = None if p is None else \
                {"shape": list(p.shape), "dtype": _dtype_name(p.dtype)}
        if params:
            spec["parameters"] = params
        non_persistent = getattr(m, "_non_persistent_buffers_set", set())
        bufs = {}
        for bname, b in m._buffers.items():
            bufs[bname] = None if b is None else \
                {"shape": list(b.shape), "dtype": _dtype_name(b.dtype)}
            if b is not None and bname in non_persistent:
                # Not in the state_dict (torch's semantics, kept by Grove);
                # its value goes to buffers.safetensors (extra_buffers).
                bufs[bname]["persistent"] = False
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
        non_persistent = getattr(m, "_non_persistent_buffers_set", set())
        for n, b in m._buffers.items():
            if b is not None and n not in non_persistent:
                keys.append(prefix + n)
        for n, c in m._modules.items():
            if c is not None:
                walk(c, prefix + n + ".")

    walk(model, "")
    return keys


def extra_buffers(model):
    """{dotted path: value} of the non-persistent buffers of the tree (at
    every path a shared module has, as Grove's tree has it there too):
    they are not in the state_dict, so the export writes them to
    buffers.safetensors, where grove_model_open reads them.  Floating point
    values as float32, which Grove computes in."""
    import torch
    out = {}

    def walk(m, prefix, stack):
        if m is None or id(m) in stack:
            return
        for n in getattr(m, "_non_persistent_buffers_set", set()):
            b = m._buffers.get(n)
            if b is not None:
                v = b.detach().float() if b.is_floating_point() else b.detach()
                out[prefix + n] = v.contiguous().clone()
        for n, c in m._modules.items():
            walk(c, prefix + n + ".", stack | {id(m)})

    walk(model, "", frozenset())
    return {k: out[k] for k in sorted(out)} if out else {}


# ---------------------------------------------------------------- graphs (torch.fx)

# Operations a graph may call, read from tools/grove_ops.json: the op table of
# core/nn/ops_*.c written out by tools/grove_ops_json.c (`make ops-json`; `make
# test` fails when it is stale), so that the exporter and Grove never drift.
# Each op lists its canonical name (the node's target), its parameters in
# Grove's order, and every torch spelling, each with the positional
# parameters of that callable ("torch.nn.functional.softmax(input,dim,
# _stacklevel,dtype)"; a "*shape" gathers the rest; a Tensor method's first
# is self).
_TABLE = None
# Arguments that change nothing in eval mode, dropped from the file.
_DROP = {"inplace", "_stacklevel", "memory_format"}
# Calls Grove refuses on purpose, with why (beside the generic "is not
# supported"): a served model answers the same input the same way.
_RANDOM = ("rand", "randn", "randint", "rand_like", "randn_like", "randint_like", "bernoulli",
           "multinomial", "normal", "poisson")
_WHY = {f"torch.{n}": "it draws random numbers, and Grove serves deterministic answers (the same "
        "input gives the same output); pass the noise in as an input instead" for n in _RANDOM}


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
        if os.path.realpath(fname).startswith(torch_dir) or \
                os.path.realpath(fname) in _OWN_FILES:
            continue
        code = lines[i + 1].strip() if i + 1 < len(lines) and \
            not lines[i + 1].lstrip().startswith("File ") else ""
        return f"{os.path.basename(fname)}:{mt.group(2)}: {code}" if code else \
            f"{os.path.basename(fname)}:{mt.group(2)}"
    return None


# The exporter's own files (this one, grove_export.py, grove_export_types.py):
# their frames are never the user's code.
_OWN_FILES = {os.path.realpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), f))
              for f in ("grove_export.py", "grove_export_graph.py", "grove_export_types.py")}


class _Patch:
    """torch 1.13's fx unpacks a traced tuple (`a, b = self.attn(...)`) by
    reading the caller's bytecode at f_lasti // 2, which is wrong from Python
    3.11 on (f_lasti counts bytes and instructions have inline caches).  For
    the duration of a trace, Proxy.__iter__ finds the instruction by its
    offset instead.  And abs() / round() of a Proxy (of a size: abs(n - m),
    round(h * 0.5)), which fx 1.13 does not record, are recorded as
    operator.abs / builtins.round calls."""

    def __enter__(self):
        import builtins
        import dis
        import inspect
        import torch.fx as fx
        self.orig = fx.Proxy.__iter__
        self.had = {k: k in vars(fx.Proxy) for k in ("__abs__", "__round__")}
        if not self.had["__abs__"]:
            fx.Proxy.__abs__ = lambda p: p.tracer.create_proxy("call_function", operator.abs,
                                                               (p,), {})
        if not self.had["__round__"]:
            fx.Proxy.__round__ = lambda p, nd=None: p.tracer.create_proxy(
                "call_function", builtins.round, (p,) if nd is None else (p, nd), {})

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
        for k, had in self.had.items():
            if not had:
                delattr(fx.Proxy, k)
        return False


class _NumberMeta(type):
    """The `int` and `float` a traced forward's module sees while fx traces
    it: int(x) of a traced size (`int(x.shape[-1] ** 0.5)`,
    `int(math.sqrt(n))`, `float(x.size(-1))`) is recorded as a call of
    builtins.int (float), which Grove computes per request (the ops `int`,
    `float`), where Python's would refuse the Proxy.  On anything else it is
    int (float) itself, and isinstance / issubclass against it answer as
    against int (float)."""

    def __instancecheck__(cls, obj):
        return isinstance(obj, cls.real)

    def __subclasscheck__(cls, sub):
        return issubclass(sub, cls.real)

    def __call__(cls, *args, **kwargs):
        import torch.fx as fx
        for a in args:
            if isinstance(a, fx.Proxy):
                return a.tracer.create_proxy("call_function", cls.real, args, kwargs)
        return cls.real(*args, **kwargs)


class _TracedInt(metaclass=_NumberMeta):
    real = int


class _TracedFloat(metaclass=_NumberMeta):
    real = float


class _IntPatch:
    """Puts _TracedInt (_TracedFloat) in place of `int` (`float`) in the
    globals of every module (Python file) that defines one of m's module
    classes and calls int( (float() in its source, for the duration of a
    trace; restores them after."""

    def __init__(self, m):
        import re
        self.globs = []
        seen = set()
        for mod in m.modules():
            g = getattr(type(mod).forward, "__globals__", None)
            if g is None or id(g) in seen or g.get("__name__", "").startswith("torch."):
                continue
            seen.add(id(g))
            try:  # the file, as a module loaded by path may not be in sys.modules
                with open(g["__file__"], encoding="utf-8") as f:
                    src = f.read()
            except (KeyError, OSError, TypeError, UnicodeDecodeError):
                continue
            for name, stand_in in (("int", _TracedInt), ("float", _TracedFloat)):
                if re.search(r"(?<![\w.])" + name + r"\(", src):
                    self.globs.append((g, name, stand_in))

    def __enter__(self):
        self.saved = [(g, name, g.get(name, _IntPatch)) for g, name, _ in self.globs]
        for g, name, stand_in in self.globs:
            g[name] = stand_in
        return self

    def __exit__(self, *exc):
        for g, name, old in self.saved:
            if old is _IntPatch:
                g.pop(name, None)
            else:
                g[name] = old
        return False


def _plain_call(args, kwargs):
    """Whether a module call passes what graph.c passes between modules:
    1 to GROVE_MAX_VALUES (4) traced values, positionally, trailing Nones
    being the callee's defaults."""
    import torch.fx as fx
    if kwargs:
        return False
    args = list(args)
    while args and args[-1] is None:
        args.pop()
    return 0 < len(args) <= 4 and all(isinstance(a, fx.Proxy) for a in args)


_RESULTS = None  # custom module -> (kind, value) of what its forward returns (_result)


def _result(sub, sub_path):
    """What a custom module's forward returns, traced once per module:
    ("plain", None) for what graph.c passes between modules (a value, or a
    tuple/list of 1 to 4), ("dict", keys) for a dict of 1 to 4 (torchvision's
    IntermediateLayerGetter; passed as a tuple in its keys' order), ("other",
    None) for anything else (more than 4 values, a constant in a tuple), or
    ("error", e) when its forward cannot be traced (the caller's own walk
    reports that)."""
    global _RESULTS
    import weakref
    import torch.fx as fx
    if _RESULTS is None:
        _RESULTS = weakref.WeakKeyDictionary()
    if sub not in _RESULTS:
        try:
            out = [n for n in _trace(sub, sub_path).nodes if n.op == "output"]
        except ExportError as e:
            _RESULTS[sub] = ("error", e)
            return _RESULTS[sub]
        res = out[0].args[0] if out else None
        items = list(res.values()) if isinstance(res, dict) else \
            list(res) if isinstance(res, (tuple, list)) else [res]
        plain = 0 < len(items) <= 4 and all(isinstance(x, fx.Node) and not _size_value(x)
                                            for x in items)
        _RESULTS[sub] = ("other", None) if not plain else \
            ("dict", list(res)) if isinstance(res, dict) else ("plain", None)
    return _RESULTS[sub]


def _size_value(node, depth=0):
    """Whether an fx node computes a size rather than a tensor (x.shape[1] * 2,
    x.size(0), x.dim()): a module's graph returns tensors only, so a forward
    returning one is traced through."""
    import builtins
    import torch.fx as fx
    if depth > 32 or not isinstance(node, fx.Node):
        return False
    if node.op == "call_method" and node.target in ("size", "dim", "numel"):
        return True
    if node.op == "call_function" and node.target is builtins.getattr:
        return node.args[1] in ("shape", "ndim", "dtype")  # x.dtype == torch.float16 too
    if node.op == "call_function" and (node.target is operator.getitem or
                                       node.target in (builtins.int, builtins.float,
                                                       builtins.round) or
                                       getattr(node.target, "__module__", None) in
                                       ("_operator", "operator", "math")):
        ins = [a for a in node.args if isinstance(a, fx.Node)]
        return bool(ins) and all(_size_value(a, depth + 1) for a in ins)
    return False


def _dict_keys(sub, sub_path):
    """The keys of the dict a custom module's forward returns, in order, or
    None (a torch.nn layer, or a forward returning anything else)."""
    if _kind_of(sub, sub_path) is not None:
        return None
    kind, val = _result(sub, sub_path)
    if kind == "error":
        _trace(sub, sub_path)  # raises again, naming sub by its path from the model
        raise val
    return val if kind == "dict" else None


def _traced_through(root, mod, qualname, args, kwargs):
    """A custom module (no torch.nn kind) whose call is not plain is inlined
    into its caller's graph (root's); so is one given the dict another custom
    module returned (LRASPP's head indexes the backbone's features["low"]),
    which Grove passes between modules as a tuple the callee could not index
    by key, and one whose forward returns what Grove does not pass back (5
    tensors, a tuple with an int).  A torch.nn layer keeps its node and the
    call is checked (and refused if need be) by _check_module_call."""
    try:
        if _kind_of(mod, qualname) is not None:
            return False
    except ExportError:
        return False  # a torch.nn type Grove lacks: the walk names it by its full path
    if not _plain_call(args, kwargs):
        return True
    for a in args:
        n = getattr(a, "node", None)
        if n is not None and n.op == "call_module":
            sub = root.get_submodule(n.target)
            try:
                custom = _kind_of(sub, n.target) is None
            except ExportError:
                custom = False
            if custom and _result(sub, n.target)[0] == "dict":
                return True
    return _result(mod, qualname)[0] == "other"


_EXAMPLES = {}  # id(module) -> (module, args, kwargs) of its first call on the example


def capture_examples(model, xs):
    """Runs model on the example inputs xs once, remembering what each module
    was first called with, so that a shape check in its forward (`assert
    x.shape[-1] == self.d`, `if x.dim() != 3: raise`) can be decided on the
    example's shapes while tracing (_shape_bool).  A failing run leaves
    nothing; _io reports it.  xs None only forgets the last run."""
    import torch
    _EXAMPLES.clear()
    if xs is None:
        return
    handles = []

    def pre(mod, args, kwargs=None):
        _EXAMPLES.setdefault(id(mod), (mod, args, kwargs or {}))

    for mod in model.modules():
        handles.append(mod.register_forward_pre_hook(pre))
    try:
        with torch.no_grad():
            model(*xs)
    except Exception:
        _EXAMPLES.clear()
    finally:
        for h in handles:
            h.remove()


def _shape_bool(m, proxy):
    """bool() of a traced condition that only reads sizes and dtypes
    (x.shape[-1] == self.d, x.dim() != 3, T <= self.block_size, T5's
    `self.weight.dtype in [torch.float16, torch.bfloat16]`), decided on the
    shapes and dtypes m's inputs, parameters and buffers had in the example
    run; None when it reads tensor values or m was not run.
    fx would refuse such control flow; on the example it takes the branch
    the example takes, which is what model.json's input shapes (fixed where
    the model does not take another size) then guarantee."""
    import builtins
    import inspect
    import torch.fx as fx
    ex = _EXAMPLES.get(id(m))
    if ex is None or ex[0] is not m:
        return None
    try:
        bound = inspect.signature(m.forward).bind(*ex[1], **ex[2])
        bound.apply_defaults()
    except TypeError:
        return None
    memo = {}

    def ev(a, depth=0):
        if isinstance(a, fx.Node):
            if a in memo:
                return memo[a]
            if depth > 64:
                raise ValueError
            if a.op == "placeholder":
                v = bound.arguments[a.target]
            elif a.op == "get_attr":  # a parameter's or buffer's shape and dtype
                # From the modules' own dicts: while fx traces, attribute
                # access on a module gives Proxies.
                *mods, leaf = a.target.split(".")
                owner = m
                for part in mods:
                    owner = owner._modules[part]
                v = owner._parameters.get(leaf)
                v = owner._buffers[leaf] if v is None else v
            elif a.op == "call_function" and a.target is builtins.getattr and \
                    a.args[1] in ("shape", "ndim", "dtype"):
                v = getattr(ev(a.args[0], depth + 1), a.args[1])
            elif a.op == "call_method" and a.target in ("size", "dim"):
                v = getattr(ev(a.args[0], depth + 1), a.target)(
                    *[ev(x, depth + 1) for x in a.args[1:]])
            elif a.op == "call_function" and getattr(a.target, "__module__", None) in \
                    ("_operator", "operator"):
                v = a.target(*[ev(x, depth + 1) for x in a.args])
            else:
                raise ValueError  # a tensor's values, not its shape
            if hasattr(v, "dtype") and hasattr(v, "shape") and a.op not in ("placeholder",
                                                                             "get_attr"):
                raise ValueError
            memo[a] = v
            return v
        if isinstance(a, (tuple, list)):
            return type(a)(ev(x, depth + 1) for x in a)
        return a

    try:
        v = ev(proxy.node)
    except (ValueError, KeyError, TypeError, IndexError, AttributeError):
        return None
    return bool(v) if isinstance(v, (bool, int)) else None


def _defaults_not_passed(m):
    """{name: default} of the forward parameters after those the example run
    passed m (forward(x, mask=None, scale=1.0) called with x alone): traced
    as the constants they are, so `if mask is not None:` takes the branch
    torch takes, instead of being a model input."""
    import inspect
    ex = _EXAMPLES.get(id(m))
    if ex is None or ex[0] is not m or ex[2]:
        return {}
    try:
        params = list(inspect.signature(m.forward).parameters.values())
    except (TypeError, ValueError):
        return {}
    out = {}
    for p in params[len(ex[1]):]:
        if p.kind not in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) or p.default is p.empty:
            return {}
        if p.default is None or isinstance(p.default, (bool, int, float, str)):
            out[p.name] = p.default
        else:
            return {}
    return out


def _trace(m, path, inlined=None):
    """torch.fx graph of m.forward, every submodule call kept as a
    call_module (Grove runs each submodule itself: torch.nn layers, and
    custom modules through their own graphs), except the calls of custom
    modules with lists, dicts, constants or keyword arguments, which are
    traced through (_traced_through); their ids are added to inlined."""
    if inlined is None:
        inlined = set()
    import torch
    import torch.fx as fx

    class Tracer(fx.Tracer):
        def __init__(self):
            super().__init__()
            self.inline_stack = []  # (dotted path, class) of the forwards being traced through
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
            # F.avg_pool1d/2d are C functions that refuse a traced
            # kernel_size (global pooling written by hand,
            # F.avg_pool2d(x, x.size()[2:])); F.max_pool2d is Python and
            # records itself.  Wrapped alike, they are recorded as calls.
            import torch.nn.functional as F
            pools = [getattr(F, n) for n in ("avg_pool1d", "avg_pool2d") if hasattr(F, n)]
            if hasattr(self, "_autowrap_search") and hasattr(self, "_autowrap_function_ids"):
                self._autowrap_function_ids.update(id(f) for f in makers + pools)
                self._autowrap_search.append(torch)
                self._autowrap_search.append(F)

        def create_arg(self, a):
            # A namedtuple, dataclass or ModelOutput a forward returns is
            # recorded as the dict of its fields: fx 1.13 cannot store a
            # dataclass at all, and would call a namedtuple's class as an op.
            s = _structured(a)
            if s is not a:
                return super().create_arg(s)
            return super().create_arg(a)

        def is_leaf_module(self, mod, qualname):
            return True

        def to_bool(self, obj):
            # A shape check (assert, if ...: raise) is decided on the
            # example's shapes; control flow on values is still refused.
            v = _shape_bool(m, obj)
            if v is None:
                return super().to_bool(obj)
            return v

        def call_module(self, mod, forward, args, kwargs):
            # A custom module called with what Grove cannot pass between
            # modules (a list of tensors, a dict, an int, keyword arguments)
            # is traced through: its forward's operations land in this graph,
            # and the modules it calls stay call_module nodes by their dotted
            # paths from m (fx's path_of_module), so state_dict keys are
            # torch's.  Its own spec gets "inlined": true (module_spec).
            qualname = self.path_of_module(mod)
            if _traced_through(self.root, mod, qualname, args, kwargs):
                inlined.add(id(mod))
                self.inline_stack.append((qualname, type(mod).__name__))
                try:
                    return forward(*args, **kwargs)
                finally:
                    self.inline_stack.pop()
            return super().call_module(mod, forward, args, kwargs)

        def create_node(self, *args, **kwargs):
            # A node of a traced-through forward remembers whose, so that a
            # refusal names that module beside the line (_graph's refuse).
            node = super().create_node(*args, **kwargs)
            if self.inline_stack:
                node.meta["grove_inlined"] = self.inline_stack[-1]
            return node

    before = set(vars(m))
    real_finfo = torch.finfo

    def finfo(t=None):
        # torch.finfo(x.dtype) of a traced float tensor: Grove computes in
        # float32, so its limits are float32's (a constant in the graph).
        return real_finfo(torch.float32 if isinstance(t, fx.Proxy) else t) if t is not None \
            else real_finfo()

    graph = None
    try:
        torch.finfo = finfo
        with _Patch(), _IntPatch(m):
            graph = Tracer().trace(m, concrete_args=_defaults_not_passed(m) or None)
        return graph
    except ExportError:
        raise
    except Exception as e:  # fx says what it could not follow (control flow on values, ...)
        msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise ExportError(f"cannot export {_where(path, m)}: torch.fx cannot trace its forward: "
                          f"{type(e).__name__}: {msg}") from e
    finally:
        torch.finfo = real_finfo
        # fx stores tensor constants created in forward on the module
        # (torch.tensor(2.0)); the graph keeps them for _graph, which writes
        # the small ones as torch.tensor calls.
        consts = {}
        for k in set(vars(m)) - before:
            consts[k] = getattr(m, k)
            delattr(m, k)
        if graph is not None:
            graph._grove_constants = consts


def _drop_shape_guards(graph):
    """Removes the torch._assert(cond, msg) calls of a traced forward and
    the nodes that only computed their conditions (h == self.image_size,
    x.dim() == 3).  Traced on the example, such a guard checks the shapes of
    the example; what it guards is what model.json's input shapes fix (a
    dim the model does not take one larger is fixed, _io), and Grove checks
    every request against those, so the guard has nothing left to do."""
    import torch
    import torch.fx._symbolic_trace as st
    is_none = getattr(st, "_assert_is_none", None)
    guards = [n for n in graph.nodes if n.op == "call_function" and
              (n.target is torch._assert or (is_none is not None and n.target is is_none))]
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

    # A condition decided on the example's shapes (_shape_bool: `assert
    # x.shape[-1] == self.d`) or dtypes (T5's `if self.weight.dtype in
    # [...]`) leaves its size arithmetic unused, too, and the parameter
    # whose dtype it read.
    for n in reversed(list(graph.nodes)):
        if not n.users and (n in feeding and n.op in ("call_function", "call_method", "get_attr")
                            or shape_read(n) or _size_value(n) or n.op == "get_attr"):
            graph.erase_node(n)
    # The trailing keyword defaults the example did not pass were traced as
    # constants (_trace's concrete_args); their placeholders are left unused.
    for n in reversed([n for n in graph.nodes if n.op == "placeholder"]):
        if n.users or not n.args:
            break
        graph.erase_node(n)


# Ops whose result may share x's storage (a write through one is seen
# through the others): what _functionalize follows to refuse an in-place
# write it cannot turn into a value.
_VIEW_METHODS = {"view", "reshape", "transpose", "permute", "t", "expand", "squeeze", "unsqueeze",
                 "flatten", "narrow", "select", "unflatten", "view_as", "reshape_as", "expand_as",
                 "contiguous", "detach", "unbind", "chunk", "split", "movedim", "swapaxes",
                 "diagonal", "as_strided", "unfold", "type_as", "to", "type", "float", "long",
                 "bool"}


def _is_view(node):
    """Whether node's result may be a view of its first input."""
    import builtins
    import torch
    import torch.fx as fx
    if node.op == "call_method":
        return node.target in _VIEW_METHODS
    if node.op == "call_function":
        if node.target is operator.getitem or node.target is builtins.getattr:
            return isinstance(node.args[0], fx.Node)
        name = getattr(node.target, "__name__", "")
        return getattr(torch, name, None) is node.target and name in _VIEW_METHODS
    return False


def _inplace_target(m, node, funcs):
    """For an in-place call (x.add_(y), torch.relu_(x), F.relu(x,
    inplace=True), an nn.ReLU(inplace=True) submodule): 'rename', 'value'
    (an out-of-place call already, writing into x too) or None."""
    import torch
    if node.op == "call_method" and node.target.endswith("_") and \
            not node.target.startswith("_"):
        return "rename"
    if node.op == "call_function":
        name = getattr(node.target, "__name__", "")
        if name.endswith("_") and not name.startswith("_") and \
                getattr(torch, name, None) is node.target:
            return "rename"
        if node.kwargs.get("inplace") is True:
            return "value"
        entry = funcs.get(node.target)
        if entry and "inplace" in entry[1]:
            k = entry[1].index("inplace")
            if k < len(node.args) and node.args[k] is True:
                return "value"
    if node.op == "call_module":
        if getattr(m.get_submodule(node.target), "inplace", False) is True:
            return "value"
    return None


def _functionalize(m, graph, refuse):
    """Turns the in-place calls of a traced forward into values: x.add_(y)
    becomes x.add(y) (x.fill_(v) full_like(x, v), x.zero_() zeros_like(x)),
    and every later use of x reads that result, as the mutated x is what
    torch's later operations see; F.relu(h, inplace=True) and
    nn.ReLU(inplace=True) alike.  A write whose effect reaches other names
    (x a view or slice of another tensor still used afterwards, a view of x
    made before and read after the write, a parameter or buffer) is
    refused, naming the call: Grove's graph has values, not storage.
    Tensor.T / Tensor.mT become transpose calls here too."""
    import builtins
    import torch
    import torch.fx as fx
    funcs, methods, _ = _table()
    order = {n: i for i, n in enumerate(graph.nodes)}
    for node in list(graph.nodes):
        if node.op == "call_function" and node.target is builtins.getattr and \
                len(node.args) == 2 and node.args[1] in ("T", "mT"):
            # x.T reverses the dims (torch warns past 2-d; Grove takes 1-d
            # and 2-d, where it is x.t()); x.mT swaps the last two.
            if node.args[1] == "T":
                node.op, node.target, node.args = "call_method", "t", (node.args[0],)
            else:
                node.op, node.target, node.args = "call_method", "transpose", \
                    (node.args[0], -2, -1)
            continue
        kind = _inplace_target(m, node, funcs)
        if kind is None:
            continue
        call = node.target if node.op == "call_method" else \
            (node.target if node.op == "call_module" else _fn_name(node.target))
        x = node.args[0] if node.args else None
        if not isinstance(x, fx.Node):
            refuse(node, f"in-place {call} writes into something that is not a traced tensor")
        if kind == "rename":
            base = node.target if node.op == "call_method" else node.target.__name__
            base = base[:-1]
            if base == "fill":
                node.op, node.target = "call_function", torch.full_like
            elif base == "zero":
                node.op, node.target, node.args = "call_function", torch.zeros_like, (x,)
            elif node.op == "call_method":
                if base not in methods:
                    refuse(node, f"in-place method Tensor.{node.target} is not supported by "
                                 f"Grove (nor Tensor.{base})")
                node.target = base
            else:
                fn = getattr(torch, base, None)
                if fn not in funcs:
                    refuse(node, f"in-place operation {call} is not supported by Grove (nor "
                                 f"torch.{base})")
                node.target = fn
        # What shares x's storage: the chain of views up to the tensor they
        # view, and every view made from it.
        root = x
        while _is_view(root) and isinstance(root.args[0], fx.Node):
            root = root.args[0]
        group, todo = set(), [root]
        while todo:
            a = todo.pop()
            if a in group:
                continue
            group.add(a)
            todo.extend(u for u in a.users if _is_view(u) and u.args and u.args[0] is a)
        if root.op == "get_attr":
            refuse(node, f"in-place {call} writes into the parameter or buffer "
                         f"self.{root.target}, which changes the model between requests; "
                         "write x = x.op(...) instead")
        for a in group - {x}:
            later = [u for u in a.users if u is not node and order[u] > order[node] and
                     not (_is_view(u) and u in group)]
            if later:
                what = "a view or slice of another tensor" if a is root or x is not root else \
                    "a tensor whose view (made before the write) is read after it"
                refuse(node, f"in-place {call} writes into {what}, and Grove cannot follow "
                             "that aliasing; write the out-of-place call (x = x.op(...)) "
                             "instead")
        for u in list(x.users):
            if u is not node and order[u] > order[node]:
                u.replace_input_with(x, node)
    graph.lint()


def _graph(m, path, inlined=None):
    """The "graph" of a custom module: its fx nodes in the format of
    docs/model-spec.md.  Refuses, naming the operation and the line of
    forward, what Grove cannot run.  The ids of the submodules traced
    through (_traced_through) are added to inlined."""
    import math
    import torch
    import torch.fx as fx
    graph = _trace(m, path, inlined)
    _drop_shape_guards(graph)
    ops, methods, canons = _table()
    out = []

    def refuse(node, why):
        src = _source(node)
        where = f"forward line {src}" if src else f"node '{node.name}' of its forward"
        inl = node.meta.get("grove_inlined")
        if inl:  # the line is in a submodule's forward, traced into this graph
            where = f"in '{_join(path, inl[0])}' ({inl[1]}, whose forward is traced into " \
                    f"this one), {where}"
        raise ExportError(f"cannot export {_where(path, m)}: {where}: {why}")

    _functionalize(m, graph, refuse)

    def key_index(node, src, key):
        """features["out"] on what a submodule returned as a dict (torchvision's
        IntermediateLayerGetter): Grove passes that dict as a tuple in the
        order of its keys (the submodule's graph writes its values so), so
        the key becomes its position."""
        keys = None
        if isinstance(src, fx.Node) and src.op == "call_module":
            keys = _dict_keys(m.get_submodule(src.target), _join(path, src.target))
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
        if name == "div" and b.get("rounding_mode") not in (None, "floor", "trunc"):
            refuse(node, f"div with rounding_mode={b['rounding_mode']!r} is not supported")
        if name == "dropout" and b.get("training", True) is not False:
            refuse(node, "F.dropout with training=True drops activations at random even in "
                         "eval mode; pass training=self.training")
        if name == "shifted_window_attention":
            for k in ("attention_dropout", "dropout"):
                if b.get(k, 0.0) != 0:
                    refuse(node, f"torchvision's shifted_window_attention with {k}={b[k]!r} "
                                 "drops at random even in eval mode (it calls F.dropout without "
                                 f"training=); build the model with {k}=0.0")
        if name in ("softmax", "log_softmax", "softmin") and b.get("dtype") is not None:
            # F.softmax(w, dim=-1, dtype=torch.float32) (LLaMA, T5): Grove's
            # softmax computes in float32 and gives float32, which any
            # float dtype means here (_dtype_name).
            dt = b["dtype"]
            if not (isinstance(dt, torch.dtype) and dt.is_floating_point):
                refuse(node, f"{name} with dtype={dt!r} is not supported (a constant float "
                             "dtype is)")
        if name in ("mean", "sum") and b.get("dtype") is not None:
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
        if name in ("int", "float") and node.op == "call_function" and \
                isinstance(b.get("input"), fx.Node) and not _size_value(b["input"]):
            refuse(node, f"{name}() of a tensor's value is not supported ({name}() of a size, "
                         f"{name}(x.shape[-1] ** 0.5), is)")
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
        elif node.op == "get_attr" and _small_constant(graph, node.target) is not None:
            # torch.tensor([0.485, 0.456, 0.406]) in forward: fx made it a
            # constant attribute; Grove makes it again (the "tensor" op).
            data, dtype = _small_constant(graph, node.target)
            spec = {"op": "call_function", "name": node.name, "target": "tensor",
                    "args": [enc(node, data)], "kwargs": {"dtype": dtype}}
        elif node.op == "get_attr":
            target = node.target
            owner_path, _, slot = target.rpartition(".")
            try:
                owner = m.get_submodule(owner_path)
            except AttributeError:
                owner = None
            # A non-persistent buffer of a custom module is exported too, its
            # value in buffers.safetensors; one of a torch.nn layer was
            # refused by the walk (_check_slots).
            declared = owner is not None and (slot in owner._parameters or
                                              slot in owner._buffers)
            if not declared:
                refuse(node, f"self.{target} is not a parameter or buffer, so Grove has no "
                             "value for it (a tensor made in forward, or stored as a plain "
                             "attribute); register it with register_buffer(name, tensor) or "
                             "as an nn.Parameter")
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
            if node.target is getattr and len(node.args) == 2 and \
                    node.args[1] in ("values", "indices") and _pair_result(node.args[0]):
                # torch.max(x, 1).values: the result is a (values, indices)
                # namedtuple, which Grove's graph passes as a tuple.
                node.target = operator.getitem
                node.args = (node.args[0], 0 if node.args[1] == "values" else 1)
            if node.target is operator.getitem and isinstance(node.args[1], str):
                node.args = (node.args[0], key_index(node, node.args[0], node.args[1]))
            if node.target not in ops and _fn_name(node.target) in _WHY:
                refuse(node, f"operation {_fn_name(node.target)} is not supported by Grove: "
                             f"{_WHY[_fn_name(node.target)]}")
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
            # torchvision's segmentation nets' {"out": ..., "aux": ...}, a
            # namedtuple, dataclass or ModelOutput (the tracer made it a dict),
            # nested tuples: the values flattened in order, as _io names them.
            res = node.args[0]
            if isinstance(res, (dict, list, tuple)):
                res = tuple(_named_flat(res)[1])
            items = list(res) if isinstance(res, (list, tuple)) else [res]
            if not items or not all(isinstance(x, fx.Node) for x in items) or len(items) > 4:
                refuse(node, "forward must return 1 to 4 tensors (a tensor, or a tuple, dict, "
                             "namedtuple or dataclass of them)")
            spec = {"op": "output", "name": node.name, "args": [enc(node, res)]}
        else:
            refuse(node, f"fx node kind {node.op!r} is not supported")
        if src and node.op not in ("placeholder", "output"):
            spec["source"] = src
        out.append(spec)
    return out


def _small_constant(graph, target):
    """(data as nested lists, dtype name) of a tensor constant fx made while
    tracing (torch.tensor(...) in forward) that model.json can spell: up to
    64 numbers per dim, 4 dims, float32/int64/bool (other floats as
    float32); None for anything else (refused as before)."""
    import torch
    t = getattr(graph, "_grove_constants", {}).get(target)
    if not isinstance(t, torch.Tensor) or t.dim() > 4 or any(s > 64 for s in t.shape) or \
            t.numel() > 256:
        return None
    if t.dtype.is_floating_point:
        return t.detach().to(torch.float32).tolist(), "float32"
    if t.dtype == torch.bool:
        return t.tolist(), "bool"
    if t.dtype in (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8):
        return t.detach().to(torch.int64).tolist(), "int64"
    return None


def _pair_result(src):
    """Whether an fx node computes a (values, indices) namedtuple: torch's
    max/min/sort/topk/kthvalue/median/mode with a dim, as function or
    method."""
    import torch
    import torch.fx as fx
    names = ("max", "min", "sort", "topk", "kthvalue", "median", "mode", "cummax", "cummin")
    if not isinstance(src, fx.Node):
        return False
    if src.op == "call_method":
        name = src.target
    elif src.op == "call_function" and getattr(torch, getattr(src.target, "__name__", ""),
                                                 None) is src.target:
        name = src.target.__name__
    else:
        return False
    if name not in names:
        return False
    # max(x) and min(x) (no dim) return a tensor, not a pair.
    return name not in ("max", "min") or len(src.args) > 1 or "dim" in src.kwargs


def _module_call_args(node, sub, refuse):
    """(args, kwargs) of a call_module as model.json writes them.  A recurrent
    net's and an EmbeddingBag's keyword arguments become positional (graph.c
    passes module tensors positionally): RNN/GRU (input, hx), LSTM (input,
    (h0, c0)); EmbeddingBag (input, offsets, per_sample_weights), with a None
    offsets left out before per_sample_weights (Grove's EmbeddingBag reads a
    float second tensor as the weights)."""
    import inspect
    import torch.nn as nn
    if not isinstance(sub, (nn.RNNBase, nn.RNNCellBase, nn.EmbeddingBag)):
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
    if isinstance(sub, (nn.RNNBase, nn.LSTMCell)) and len(args) == 2 and \
            isinstance(args[1], (tuple, list)):
        # An LSTM's (h0, c0), an LSTMCell's (h, c): graph.c passes the pair
        # as two more tensors.
        args = args[:1] + list(args[1])
    if len(args) > 4 or not all(isinstance(a, fx.Node) for a in args):
        refuse(node, f"a {type(sub).__name__} called with a constant argument: Grove passes "
                     "only tensors (1 to 4) between modules")
