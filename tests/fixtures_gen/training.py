"""Training fixtures: train-mode forwards and autograd gradients of every
layer Grove trains, losses with their gradients, optimizer steps and
state_dicts, and whole training runs, all from real PyTorch.

Backward cases (tests/check_backward.c), for each NAME in GRAD_CASES and
graph_NAME for graphs.py's models with a custom forward:
    train_grad_NAME.json          the model.json document (tools/grove_export.py)
    train_grad_NAME.safetensors   w.KEY     the state_dict before the forward
                                  x.I       the inputs (float32, or int64 indices)
                                  y.J       torch's train-mode outputs
                                  g.J       the upstream gradients dL/dy_J
                                  dx.I      dL/dx (float inputs)
                                  grad.NAME each parameter's .grad (named_parameters)
                                  after.KEY the state_dict after the forward
                                            (BatchNorm's running statistics)

Loss cases (check_backward.c), for each NAME in LOSS_CASES:
    train_loss_NAME.json          {"kind", "reduction", "ignore_index",
                                   "label_smoothing", "pos_weight": bool}
    train_loss_NAME.safetensors   x, target, loss (0-d), grad, [pos_weight]

Optimizer cases (tests/check_optim.c), for each NAME in OPTIM_CASES:
    train_optim_NAME.json         {"kind", "nparams", "steps", "groups": [{hparams,
                                   "params": [indices]}], "skip": [[step, index]]}
    train_optim_NAME.safetensors  p.I (initial), g.S.I (gradient at step S;
                                  absent = None), p.S.I (after step S)
    train_optim_NAME.pt           torch.save(opt.state_dict()) after the
                                  next-to-last step (check_optim loads it and
                                  takes the last step)
    train_optim_NAME_final.pt     the same after the last step

Training runs (check_optim.c), for each NAME in RUNS:
    train_run_NAME.json           model.json
    train_run_NAME.safetensors    w.KEY (initial), x.S, t.S (batch S),
                                  loss.S (0-d), final.KEY (state_dict after
                                  the last step)
    train_run_NAME_optim.pt       the optimizer's state_dict after the last step
All use fixed seeds; dropout in these models is p=0 (torch's generator is
not Grove's)."""
import json
import os
from collections import OrderedDict

import torch
import torch.nn as nn
import torch.nn.functional as F

from grove_export import build_spec, export, module_spec, save_safetensors


def _randomise(m, seed):
    g = torch.Generator().manual_seed(seed + 1000)
    for mod in m.modules():
        for name, p in mod.named_parameters(recurse=False):
            with torch.no_grad():
                if isinstance(mod, nn.Embedding):
                    p.copy_(torch.randn(p.shape, generator=g))
                else:
                    p.copy_(torch.rand(p.shape, generator=g) * 2 - 1)
        for name, b in mod.named_buffers(recurse=False):
            with torch.no_grad():
                if name == "running_var":
                    b.copy_(torch.rand(b.shape, generator=g) * 1.5 + 0.5)
                elif name == "running_mean":
                    b.copy_(torch.rand(b.shape, generator=g) * 2 - 1)
                elif name == "num_batches_tracked":
                    b.fill_(5)


def _spec(m, x):
    """The model.json document.  Several inputs (MultiheadAttention's query,
    key and value) are declared by hand: the exporter's io inference takes
    one input for a torch.nn container."""
    m.eval()
    if not isinstance(x, tuple):
        return json.dumps(build_spec(m, example_input=x))
    doc = {"format": "grove.model/1",
           "inputs": [{"name": f"x{i}", "dtype": str(t.dtype).replace("torch.", ""),
                       "shape": [-1] + list(t.shape[1:])} for i, t in enumerate(x)],
           "module": module_spec(m)}
    return json.dumps(doc)


def _x(*shape, scale=1.0):
    return torch.randn(shape) * scale


def _idx(n, *shape):
    return torch.randint(0, n, shape, dtype=torch.int64)


def _tied():
    emb = nn.Embedding(10, 4)
    dec = nn.Linear(4, 10, bias=False)
    dec.weight = emb.weight
    return nn.Sequential(emb, nn.Tanh(), dec)


GRAD_CASES = [
    ("linear", lambda: nn.Linear(7, 5), lambda: _x(4, 7)),
    ("linear_3d", lambda: nn.Linear(6, 3), lambda: _x(2, 3, 6)),
    ("linear_nobias", lambda: nn.Linear(5, 4, bias=False), lambda: _x(3, 5)),
    ("relu", lambda: nn.ReLU(), lambda: _x(4, 9, scale=2.0)),
    ("leaky_relu", lambda: nn.LeakyReLU(0.2), lambda: _x(4, 9, scale=2.0)),
    ("gelu", lambda: nn.GELU(), lambda: _x(4, 9, scale=2.0)),
    ("gelu_tanh", lambda: nn.GELU(approximate="tanh"), lambda: _x(4, 9, scale=2.0)),
    ("silu", lambda: nn.SiLU(), lambda: _x(4, 9, scale=2.0)),
    ("sigmoid", lambda: nn.Sigmoid(), lambda: _x(4, 9, scale=2.0)),
    ("tanh", lambda: nn.Tanh(), lambda: _x(4, 9, scale=2.0)),
    ("softmax", lambda: nn.Softmax(dim=1), lambda: _x(4, 6, scale=2.0)),
    ("softmax_mid", lambda: nn.Softmax(dim=1), lambda: _x(2, 5, 3)),
    ("log_softmax", lambda: nn.LogSoftmax(dim=-1), lambda: _x(3, 7, scale=3.0)),
    ("log_softmax_mid", lambda: nn.LogSoftmax(dim=1), lambda: _x(2, 4, 3)),
    ("identity_flatten", lambda: nn.Sequential(nn.Identity(), nn.Flatten(), nn.Linear(12, 3)),
     lambda: _x(2, 3, 4)),
    ("dropout_p0", lambda: nn.Sequential(nn.Linear(6, 6), nn.Dropout(0.0)), lambda: _x(3, 6)),
    ("dropout_p1", lambda: nn.Sequential(nn.Linear(6, 6), nn.Dropout(1.0)), lambda: _x(3, 6)),
    ("bn1d", lambda: nn.BatchNorm1d(5), lambda: _x(6, 5, scale=2.0) + 0.5),
    ("bn1d_3d", lambda: nn.BatchNorm1d(4), lambda: _x(3, 4, 5, scale=2.0)),
    ("bn1d_noaffine", lambda: nn.BatchNorm1d(4, affine=False), lambda: _x(5, 4)),
    ("bn1d_cumulative", lambda: nn.BatchNorm1d(3, momentum=None, eps=1e-3), lambda: _x(4, 3)),
    ("bn1d_nostats", lambda: nn.BatchNorm1d(4, track_running_stats=False), lambda: _x(5, 4)),
    ("bn2d", lambda: nn.BatchNorm2d(3), lambda: _x(2, 3, 4, 5) + 1.0),
    ("ln", lambda: nn.LayerNorm(8), lambda: _x(4, 8, scale=2.0)),
    ("ln_2", lambda: nn.LayerNorm([3, 5]), lambda: _x(2, 3, 5)),
    ("ln_noaffine", lambda: nn.LayerNorm(6, elementwise_affine=False), lambda: _x(3, 6)),
    ("embedding", lambda: nn.Embedding(10, 4), lambda: _idx(10, 3, 5)),
    ("embedding_pad", lambda: nn.Embedding(10, 4, padding_idx=2),
     lambda: torch.tensor([[2, 0, 9, 2], [2, 5, 5, 1]])),
    ("embedding_freq", lambda: nn.Embedding(8, 3, scale_grad_by_freq=True),
     lambda: torch.tensor([[1, 1, 3], [1, 7, 3]])),
    ("tied", _tied, lambda: _idx(10, 2, 3)),
    ("mlp", lambda: nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 8),
                                  nn.LeakyReLU(0.1), nn.LayerNorm(8), nn.Linear(8, 3)),
     lambda: _x(6, 8)),
    # Convolutions and pools.
    ("conv2d", lambda: nn.Conv2d(3, 4, 3), lambda: _x(2, 3, 6, 6)),
    ("conv2d_pad_stride", lambda: nn.Conv2d(2, 3, (3, 2), stride=(2, 1), padding=(1, 1)),
     lambda: _x(2, 2, 7, 6)),
    ("conv2d_dil_groups", lambda: nn.Conv2d(4, 6, 3, dilation=2, padding=2, groups=2),
     lambda: _x(1, 4, 6, 7)),
    ("conv2d_same", lambda: nn.Conv2d(2, 3, 4, padding="same", bias=False), lambda: _x(2, 2, 5, 5)),
    ("conv1d", lambda: nn.Conv1d(3, 5, 3, stride=2, padding=1), lambda: _x(2, 3, 9)),
    ("conv1d_groups", lambda: nn.Conv1d(4, 4, 3, groups=4, padding="same"), lambda: _x(2, 4, 8)),
    ("maxpool", lambda: nn.MaxPool2d(2), lambda: _x(2, 3, 6, 6)),
    ("maxpool_pad", lambda: nn.MaxPool2d(3, stride=2, padding=1, ceil_mode=True),
     lambda: _x(1, 2, 7, 8)),
    ("maxpool_dil", lambda: nn.MaxPool2d((2, 3), stride=1, dilation=2), lambda: _x(1, 2, 6, 8)),
    ("avgpool", lambda: nn.AvgPool2d(2), lambda: _x(2, 3, 6, 6)),
    ("avgpool_pad", lambda: nn.AvgPool2d(3, stride=2, padding=1, ceil_mode=True,
                                         count_include_pad=False), lambda: _x(1, 2, 7, 8)),
    ("avgpool_div", lambda: nn.AvgPool2d(2, divisor_override=3), lambda: _x(1, 2, 4, 6)),
    ("adaptive", lambda: nn.AdaptiveAvgPool2d((3, 2)), lambda: _x(2, 2, 7, 5)),
    ("cnn", lambda: nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
                                  nn.MaxPool2d(2), nn.Conv2d(4, 4, 3), nn.AdaptiveAvgPool2d(1),
                                  nn.Flatten(), nn.Linear(4, 3)),
     lambda: _x(3, 2, 8, 8)),
    # Attention (dropout 0: torch's generator is not Grove's).
    ("mha", lambda: nn.MultiheadAttention(8, 2), lambda: (_x(5, 2, 8), _x(5, 2, 8), _x(5, 2, 8))),
    ("mha_bf", lambda: nn.MultiheadAttention(6, 3, batch_first=True, bias=False),
     lambda: (_x(2, 4, 6), _x(2, 3, 6), _x(2, 3, 6))),
    ("tel", lambda: nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, dropout=0.0),
     lambda: _x(5, 2, 8)),
    ("tel_gelu_nf", lambda: nn.TransformerEncoderLayer(8, 4, dim_feedforward=12, dropout=0.0,
                                                       activation="gelu", norm_first=True,
                                                       batch_first=True),
     lambda: _x(2, 3, 8)),
    ("te", lambda: nn.TransformerEncoder(
        nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, dropout=0.0), 2,
        norm=nn.LayerNorm(8), enable_nested_tensor=False),
     lambda: _x(4, 3, 8)),
]


def _graph_cases():
    """graphs.py's models with a custom forward (fx graphs), trained: every
    case but dropout_flatten, whose F.dropout(x, p, self.training) fx traced
    as training=False (the export runs in eval), so torch in train mode would
    drop where the graph does not."""
    import graphs
    out = []
    for name, make, _ex, make_x in graphs.CASES:
        if name == "dropout_flatten":
            continue
        out.append(("graph_" + name, make, (lambda mx: lambda: tuple(mx()))(make_x), _ex))
    return out


def _gen_grad(out_dir):
    cases = [(n, mk, mx, None) for n, mk, mx in GRAD_CASES] + _graph_cases()
    for i, (name, make, make_x, make_ex) in enumerate(cases):
        torch.manual_seed(500 + i)
        m = make()
        _randomise(m, 500 + i)
        xs = make_x()
        xs = list(xs) if isinstance(xs, tuple) else [xs]
        if make_ex is not None:  # a graph: the exporter's own io inference
            m.eval()
            spec = json.dumps(build_spec(m, make_ex()))
        else:
            spec = _spec(m, tuple(xs) if len(xs) > 1 else xs[0])
        sd0 = OrderedDict((k, v.clone()) for k, v in m.state_dict().items())
        m.train()
        xx = [x.clone().requires_grad_(x.is_floating_point()) for x in xs]
        ys = m(*xx)
        ys = [y for y in (ys if isinstance(ys, tuple) else (ys,)) if y is not None]
        gs = [torch.randn(y.shape) for y in ys]
        torch.autograd.backward([y for y in ys if y.requires_grad],
                                [g for y, g in zip(ys, gs) if y.requires_grad])
        t = OrderedDict(("w." + k, v) for k, v in sd0.items())
        for j, x in enumerate(xs):
            t[f"x.{j}"] = x
        for j, (y, g) in enumerate(zip(ys, gs)):
            t[f"y.{j}"] = y.detach().contiguous()
            t[f"g.{j}"] = g
        for j, x in enumerate(xx):
            if x.is_floating_point() and x.grad is not None:
                t[f"dx.{j}"] = x.grad
        for pn, p in m.named_parameters():
            if p.grad is not None:
                t["grad." + pn] = p.grad
        for k, v in m.state_dict().items():
            t["after." + k] = v.clone()
        save_safetensors(t, os.path.join(out_dir, f"train_grad_{name}.safetensors"))
        with open(os.path.join(out_dir, f"train_grad_{name}.json"), "w") as f:
            f.write(spec)


# ---------------------------------------------------------------- losses

LOSS_CASES = [
    ("mse", dict(kind="MSELoss"), lambda: (_x(4, 5), _x(4, 5))),
    ("mse_sum", dict(kind="MSELoss", reduction="sum"), lambda: (_x(3, 2, 2), _x(3, 2, 2))),
    ("ce", dict(kind="CrossEntropyLoss"), lambda: (_x(6, 5, scale=2.0), _idx(5, 6))),
    ("ce_sum", dict(kind="CrossEntropyLoss", reduction="sum"),
     lambda: (_x(4, 3), _idx(3, 4))),
    ("ce_ignore", dict(kind="CrossEntropyLoss", ignore_index=1),
     lambda: (_x(6, 4), torch.tensor([1, 0, 3, 1, 2, 1]))),
    ("ce_smooth", dict(kind="CrossEntropyLoss", label_smoothing=0.2, ignore_index=-100),
     lambda: (_x(5, 4), torch.tensor([1, -100, 3, 0, -100]))),
    ("ce_smooth_sum", dict(kind="CrossEntropyLoss", label_smoothing=0.1, reduction="sum"),
     lambda: (_x(4, 6), _idx(6, 4))),
    ("ce_spatial", dict(kind="CrossEntropyLoss", label_smoothing=0.05),
     lambda: (_x(2, 3, 4, 2), _idx(3, 2, 4, 2))),
    ("ce_unbatched", dict(kind="CrossEntropyLoss"), lambda: (_x(5), torch.tensor(3))),
    ("bce", dict(kind="BCEWithLogitsLoss"), lambda: (_x(4, 3, scale=3.0), torch.rand(4, 3))),
    ("bce_sum", dict(kind="BCEWithLogitsLoss", reduction="sum"),
     lambda: (_x(5, scale=3.0), (torch.rand(5) > 0.5).float())),
    ("bce_pos_weight", dict(kind="BCEWithLogitsLoss", pos_weight=True),
     lambda: (_x(4, 3, scale=3.0), (torch.rand(4, 3) > 0.5).float())),
]


def _make_loss(cfg, pos_weight):
    red = cfg.get("reduction", "mean")
    if cfg["kind"] == "MSELoss":
        return nn.MSELoss(reduction=red)
    if cfg["kind"] == "CrossEntropyLoss":
        return nn.CrossEntropyLoss(reduction=red, ignore_index=cfg.get("ignore_index", -100),
                                   label_smoothing=cfg.get("label_smoothing", 0.0))
    return nn.BCEWithLogitsLoss(reduction=red, pos_weight=pos_weight)


def _gen_loss(out_dir):
    for i, (name, cfg, make) in enumerate(LOSS_CASES):
        torch.manual_seed(700 + i)
        x, target = make()
        pw = torch.rand(x.shape[-1]) * 3 + 0.2 if cfg.get("pos_weight") else None
        loss_fn = _make_loss(cfg, pw)
        xx = x.clone().requires_grad_(True)
        loss = loss_fn(xx, target)
        loss.backward()
        t = OrderedDict([("x", x), ("target", target), ("loss", loss.detach()), ("grad", xx.grad)])
        if pw is not None:
            t["pos_weight"] = pw
        save_safetensors(t, os.path.join(out_dir, f"train_loss_{name}.safetensors"))
        full = {"kind": cfg["kind"], "reduction": cfg.get("reduction", "mean"),
                "ignore_index": cfg.get("ignore_index", -100),
                "label_smoothing": cfg.get("label_smoothing", 0.0),
                "pos_weight": bool(cfg.get("pos_weight"))}
        with open(os.path.join(out_dir, f"train_loss_{name}.json"), "w") as f:
            json.dump(full, f)


# ---------------------------------------------------------------- optimizers

# (name, kind, shapes of the parameters, groups [(hparams, [indices])],
#  steps, skipped (step, index) pairs: no gradient there)
OPTIM_CASES = [
    ("sgd", "SGD", [(3, 4), (4,)], [(dict(lr=0.1), [0, 1])], 3, []),
    ("sgd_momentum", "SGD", [(3, 4), (4,)],
     [(dict(lr=0.05, momentum=0.9, dampening=0.1, weight_decay=1e-2), [0, 1])], 4, [(1, 1)]),
    ("sgd_nesterov", "SGD", [(5,), (2, 3)],
     [(dict(lr=0.05, momentum=0.8, nesterov=True, weight_decay=1e-3), [0, 1])], 3, []),
    ("sgd_maximize", "SGD", [(4,)], [(dict(lr=0.1, momentum=0.5, maximize=True), [0])], 3, []),
    ("adam", "Adam", [(3, 4), (4,)], [(dict(lr=1e-2), [0, 1])], 4, [(2, 0)]),
    ("adam_wd_amsgrad", "Adam", [(6,), (2, 2)],
     [(dict(lr=5e-3, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.1, amsgrad=True), [0, 1])], 4,
     []),
    ("adamw", "AdamW", [(3, 4), (4,)], [(dict(lr=1e-2, weight_decay=0.05), [0, 1])], 3, []),
    ("adamw_groups", "AdamW", [(3, 4), (4,), (2, 3), (3,)],
     [(dict(lr=1e-2, weight_decay=0.1), [2, 0]), (dict(lr=3e-3, weight_decay=0.0,
                                                      betas=(0.85, 0.98)), [3, 1])], 3, [(0, 3)]),
    ("adamw_maximize", "AdamW", [(5,)], [(dict(lr=1e-2, maximize=True, amsgrad=True), [0])], 3, []),
]

_OPT = {"SGD": torch.optim.SGD, "Adam": torch.optim.Adam, "AdamW": torch.optim.AdamW}


def _hp_json(kind, hp):
    d = dict(hp)
    if "betas" in d:
        d["betas"] = list(d["betas"])
    return d


def _gen_optim(out_dir):
    for ci, (name, kind, shapes, groups, steps, skip) in enumerate(OPTIM_CASES):
        g = torch.Generator().manual_seed(900 + ci)
        params = [nn.Parameter(torch.randn(s, generator=g)) for s in shapes]
        t = OrderedDict()
        for i, p in enumerate(params):
            t[f"p.{i}"] = p.detach().clone()
        opt = _OPT[kind]([dict(params=[params[i] for i in idx], **hp) for hp, idx in groups])
        for s in range(steps):
            opt.zero_grad(set_to_none=True)
            for i, p in enumerate(params):
                if (s, i) in skip:
                    continue
                p.grad = torch.randn(p.shape, generator=g)
                t[f"g.{s}.{i}"] = p.grad.clone()
            if s == steps - 1:
                torch.save(opt.state_dict(), os.path.join(out_dir, f"train_optim_{name}.pt"))
            opt.step()
            for i, p in enumerate(params):
                t[f"p.{s}.{i}"] = p.detach().clone()
        torch.save(opt.state_dict(), os.path.join(out_dir, f"train_optim_{name}_final.pt"))
        save_safetensors(t, os.path.join(out_dir, f"train_optim_{name}.safetensors"))
        cfg = {"kind": kind, "nparams": len(shapes), "steps": steps,
               "groups": [dict(_hp_json(kind, hp), params=idx) for hp, idx in groups],
               "skip": [list(p) for p in skip]}
        with open(os.path.join(out_dir, f"train_optim_{name}.json"), "w") as f:
            json.dump(cfg, f)


# ---------------------------------------------------------------- training runs


def _mlp():
    """No bias before a BatchNorm (its true gradient is zero, and Adam would
    amplify float32 noise in it into steps of size lr)."""
    return nn.Sequential(nn.Linear(20, 32, bias=False), nn.BatchNorm1d(32), nn.ReLU(),
                         nn.Dropout(0.0), nn.Linear(32, 16, bias=False),
                         nn.BatchNorm1d(16, momentum=None), nn.GELU(), nn.Linear(16, 5))


def _cnn():
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
                         nn.MaxPool2d(2), nn.Conv2d(4, 8, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                         nn.Flatten(), nn.Linear(8, 3))


def _two_groups(model):
    """Weights (2-d and up) in one group, biases and norms in the other:
    check_optim.c splits the replica's parameters by the same rule."""
    w = [p for p in model.parameters() if p.dim() > 1]
    o = [p for p in model.parameters() if p.dim() <= 1]
    return [dict(params=w, lr=3e-3, weight_decay=0.05), dict(params=o, lr=1e-2, weight_decay=0.0)]


RUNS = [
    ("sgd_mlp", _mlp, lambda: _x(16, 20), 5, lambda m: torch.optim.SGD(
        m.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-3), "CrossEntropyLoss"),
    ("adamw_mlp", _mlp, lambda: _x(16, 20), 5, lambda m: torch.optim.AdamW(
        _two_groups(m), betas=(0.9, 0.99)), "CrossEntropyLoss"),
    ("sgd_cnn", _cnn, lambda: _x(8, 1, 8, 8), 4, lambda m: torch.optim.SGD(
        m.parameters(), lr=0.05, momentum=0.9), "CrossEntropyLoss"),
]


def _gen_runs(out_dir):
    for ri, (name, make, make_x, steps, make_opt, loss_name) in enumerate(RUNS):
        torch.manual_seed(1100 + ri)
        m = make()
        x0 = make_x()
        spec = _spec(m, x0)
        t = OrderedDict(("w." + k, v.clone()) for k, v in m.state_dict().items())
        m.train()
        opt = make_opt(m)
        loss_fn = nn.CrossEntropyLoss()
        nclass = 5 if "mlp" in name else 3
        for s in range(steps):
            x = make_x()
            target = torch.randint(0, nclass, (x.shape[0],))
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(m(x), target)
            loss.backward()
            opt.step()
            t[f"x.{s}"] = x
            t[f"t.{s}"] = target
            t[f"loss.{s}"] = loss.detach()
        for k, v in m.state_dict().items():
            t["final." + k] = v.clone()
        save_safetensors(t, os.path.join(out_dir, f"train_run_{name}.safetensors"))
        torch.save(opt.state_dict(), os.path.join(out_dir, f"train_run_{name}_optim.pt"))
        with open(os.path.join(out_dir, f"train_run_{name}.json"), "w") as f:
            f.write(spec)


def _gen_server(out_dir):
    """train_server_mlp/: a model directory groved serves (the exporter's),
    and train_server_ref.safetensors: x.S, t.S (three batches) and torch's
    loss.S for SGD (lr 0.05, momentum 0.9) with CrossEntropyLoss; xe, an
    input, with torch's eval-mode outputs on it before (eval.before) and
    after (eval.after) the three steps; final.KEY the state_dict after them.
    tests/check_train_server.c trains, evaluates and promotes through
    groved and compares."""
    import shutil
    torch.manual_seed(1300)
    m = nn.Sequential(nn.Linear(12, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Dropout(0.0),
                      nn.Linear(16, 4))
    _randomise(m, 1300)
    d = os.path.join(out_dir, "train_server_mlp")
    if os.path.isdir(d):
        shutil.rmtree(d)
    xe = _x(5, 12)
    export(m, d, example_input=xe, batching={"max_batch_size": 16, "max_queue_delay_us": 0})
    t = OrderedDict()
    t["xe"] = xe
    m.eval()
    with torch.no_grad():
        t["eval.before"] = m(xe)
    m.train()
    opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    for s in range(3):
        x = _x(8, 12)
        target = torch.randint(0, 4, (8,))
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(m(x), target)
        loss.backward()
        opt.step()
        t[f"x.{s}"] = x
        t[f"t.{s}"] = target
        t[f"loss.{s}"] = loss.detach()
    m.eval()
    with torch.no_grad():
        t["eval.after"] = m(xe)
    for k, v in m.state_dict().items():
        t["final." + k] = v.clone()
    save_safetensors(t, os.path.join(out_dir, "train_server_ref.safetensors"))


def generate(out_dir):
    torch.use_deterministic_algorithms(False)
    _gen_grad(out_dir)
    _gen_loss(out_dir)
    _gen_optim(out_dir)
    _gen_runs(out_dir)
    _gen_server(out_dir)
