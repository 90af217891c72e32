"""Module-core parity fixtures: what torch.nn.Module does with a tree that has
nested containers, a shared module, a tied parameter, a None parameter,
non-persistent buffers and a None child.  Written as JSON (module_tree.json)
that tests/check_module.c rebuilds with generic modules and compares:
state_dict keys and order, named_* traversals, apply order, load_state_dict
reports and messages, registration errors and hook order."""
import json
import os
from collections import OrderedDict

import torch
import torch.nn as nn


class Block(nn.Module):
    def __init__(self, shared):
        super().__init__()
        self.fc = nn.Linear(3, 4)
        self.norm = nn.BatchNorm1d(4)
        self.shared = shared
        self.register_buffer("scratch", torch.zeros(2), persistent=False)
        self.register_parameter("gate", None)
        self.register_buffer("absent", None)
        self.register_module("empty", None)

    def forward(self, x):
        return x


def build():
    torch.manual_seed(0)
    shared = nn.Linear(4, 4)
    root = nn.Sequential(OrderedDict([
        ("embed", nn.Embedding(5, 3)),
        ("blocks", nn.ModuleList([Block(shared), Block(shared)])),
        ("heads", nn.ModuleDict({"a": nn.Linear(4, 2), "b": shared})),
        ("out", nn.Linear(3, 5, bias=False)),
    ]))
    root.out.weight = root.embed.weight  # tied: [5, 3]
    return root


def describe(root):
    """Each module once (by id) with its members; children refer to ids."""
    ids, mods = {}, []
    tensor_ids = {}

    def tid(t):
        return tensor_ids.setdefault(id(t), len(tensor_ids))

    def visit(m):
        if id(m) in ids:
            return ids[id(m)]
        ids[id(m)] = len(mods)
        entry = {"type": type(m).__name__, "params": [], "buffers": [], "children": []}
        mods.append(entry)
        for k, v in m._parameters.items():
            entry["params"].append({"name": k, "shape": None if v is None else list(v.shape),
                                    "tensor": None if v is None else tid(v)})
        for k, v in m._buffers.items():
            entry["buffers"].append({"name": k, "shape": None if v is None else list(v.shape),
                                     "dtype": None if v is None else str(v.dtype).replace("torch.", ""),
                                     "tensor": None if v is None else tid(v),
                                     "persistent": k not in m._non_persistent_buffers_set})
        for k, c in m._modules.items():
            entry["children"].append({"name": k, "module": None if c is None else visit(c)})
        return ids[id(m)]

    visit(root)
    return mods


def load_case(root, edit, strict):
    sd = root.state_dict()
    edit(sd)
    try:
        res = root.load_state_dict(sd, strict=strict)
        return {"ok": True, "missing": list(res.missing_keys), "unexpected": list(res.unexpected_keys)}
    except RuntimeError as e:
        return {"ok": False, "message": str(e)}


def generate(out_dir):
    root = build()
    d = {"modules": describe(root)}
    d["state_dict_keys"] = list(root.state_dict().keys())
    d["state_dict_metadata"] = {k: v["version"] for k, v in root.state_dict()._metadata.items()}
    d["named_parameters"] = [n for n, _ in root.named_parameters()]
    # torch 1.13 has no named_parameters(remove_duplicate=False); this is what
    # torch 2.x's _named_members does with it: no memo at either level.
    d["named_parameters_all"] = [
        (mp + "." if mp else "") + k
        for mp, mod in root.named_modules(remove_duplicate=False)
        for k, v in mod._parameters.items() if v is not None]
    d["named_buffers"] = [n for n, _ in root.named_buffers()]
    d["named_modules"] = [n for n, _ in root.named_modules()]
    d["named_modules_all"] = [n for n, _ in root.named_modules(remove_duplicate=False)]
    d["children"] = [n for n, _ in root.named_children()]
    d["blocks0_named_parameters_norecurse"] = [
        n for n, _ in root.blocks[0].named_parameters(prefix="blocks.0", recurse=False)]
    order = []
    root.apply(lambda m: order.append(type(m).__name__))
    d["apply_types"] = order
    d["param_count"] = sum(p.numel() for p in root.parameters())

    def drop(*keys):
        def f(sd):
            for k in keys:
                del sd[k]
        return f

    def add(**kv):
        def f(sd):
            for k, shape in kv.items():
                sd[k.replace("__", ".")] = torch.zeros(shape)
        return f

    def reshape(key, shape):
        def f(sd):
            sd[key] = torch.zeros(shape)
        return f

    def combo(*fs):
        def f(sd):
            for g in fs:
                g(sd)
        return f

    cases = OrderedDict([
        ("exact", lambda sd: None),
        ("missing", drop("blocks.1.fc.bias", "heads.a.weight")),
        ("unexpected", add(foo__bar=[1], blocks__0__extra=[2], heads__c__weight=[1])),
        ("size_mismatch", reshape("heads.a.bias", [3])),
        ("all_three", combo(drop("embed.weight"), add(zzz=[1]), reshape("out.weight", [5, 4]))),
        ("no_num_batches_tracked", drop("blocks.0.norm.num_batches_tracked")),
    ])
    d["load_cases"] = OrderedDict()
    for name, edit in cases.items():
        d["load_cases"][name] = {"strict": load_case(build(), edit, True),
                                 "non_strict": load_case(build(), edit, False)}

    # Registration errors, torch's KeyError texts.
    errs = OrderedDict()
    probes = [
        ("param_dot", lambda m: m.register_parameter("a.b", None)),
        ("param_empty", lambda m: m.register_parameter("", None)),
        ("param_taken_by_buffer", lambda m: m.register_parameter("running_mean", None)),
        ("param_training", lambda m: m.register_parameter("training", None)),
        ("buffer_dot", lambda m: m.register_buffer("a.b", None)),
        ("buffer_empty", lambda m: m.register_buffer("", None)),
        ("buffer_taken_by_param", lambda m: m.register_buffer("weight", None)),
        ("module_dot", lambda m: m.add_module("a.b", None)),
        ("module_empty", lambda m: m.add_module("", None)),
        ("module_taken_by_param", lambda m: m.add_module("bias", None)),
    ]
    for name, f in probes:
        try:
            f(nn.BatchNorm1d(2))
            errs[name] = None
        except KeyError as e:
            errs[name] = e.args[0]
    d["registration_errors"] = errs

    # Hook order: module pre A, pre B, global pre G, hook C, hook D, global
    # hook H.  torch 1.13 (Debian's) has no prepend=; where the installed torch
    # has it, B and D are prepended and the fixture says so.
    import inspect
    has_prepend = "prepend" in inspect.signature(nn.Module.register_forward_hook).parameters
    kw = {"prepend": True} if has_prepend else {}
    calls = []
    m = nn.Identity()
    hs = [
        m.register_forward_pre_hook(lambda mod, a: calls.append("A")),
        m.register_forward_pre_hook(lambda mod, a: calls.append("B"), **kw),
        nn.modules.module.register_module_forward_pre_hook(lambda mod, a: calls.append("G")),
        m.register_forward_hook(lambda mod, a, o: calls.append("C")),
        m.register_forward_hook(lambda mod, a, o: calls.append("D"), **kw),
        nn.modules.module.register_module_forward_hook(lambda mod, a, o: calls.append("H")),
    ]
    m(torch.zeros(1))
    d["hook_prepend"] = has_prepend
    d["hook_order"] = calls[:]
    hs[0].remove()
    hs[4].remove()
    calls.clear()
    m(torch.zeros(1))
    d["hook_order_after_remove"] = calls[:]
    for h in hs:
        h.remove()

    with open(os.path.join(out_dir, "module_tree.json"), "w") as f:
        json.dump(d, f, indent=1)
