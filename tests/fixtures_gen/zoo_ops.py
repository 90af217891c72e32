"""Graph parity fixtures of the torchvision zoo's operations (#18): small
modules with a custom forward using each operation of ops_pointwise.c,
ops_split.c, ops_select.c and ops_resample.c, in their module, functional
and method spellings, written as graphs.py writes its cases
(graph_zoo_<case>.json / .safetensors: three input sets, the example's
batch, batch 1 and batch 7) and checked by tests/check_graph.c (rtol 1e-4,
atol 1e-5).

Each case feeds the operations several layouts: a plain input, a strided
view of it (a transpose, a stepped slice) and, where a convolution comes
first, the channels-last tensor a convolution hands on.  Bool and int64
results (comparisons, argmax) come back through .float(), so that every
output is a float32 tensor checked against torch's."""
import torch
import torch.nn as nn
import torch.nn.functional as F
import torchvision

from graphs import write_cases


class Acts(nn.Module):
    """Every new activation, as a module and as a function, on x and on its
    transpose (a strided view)."""

    def __init__(self):
        super().__init__()
        self.mods = nn.ModuleList([nn.ReLU6(), nn.Hardswish(), nn.Hardsigmoid(),
                                   nn.Hardtanh(-2.0, 1.5), nn.ELU(0.5), nn.SELU(), nn.CELU(1.5),
                                   nn.Softplus(2.0, 3.0), nn.Mish()])

    def forward(self, x):
        t = x.transpose(1, 2)
        a = torch.cat([mod(x) for mod in self.mods], dim=1)
        b = torch.cat([F.relu6(t), F.hardswish(t), F.hardsigmoid(t), F.hardtanh(t, -0.5, 0.5),
                       F.elu(t, 2.0), F.selu(t), F.celu(t, 0.7), F.softplus(t, 1.0, 20.0),
                       F.mish(t)], dim=1)
        return a, b


class ConvActs(nn.Module):
    """Activations between convolutions: channels-last inputs."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.act = nn.Hardswish()
        self.c2 = nn.Conv2d(8, 8, 3, padding=1, groups=1)

    def forward(self, x):
        h = self.act(self.bn(self.c1(x)))
        g = F.relu6(self.c2(h))
        return g * F.hardsigmoid(h), F.pixel_shuffle(h, 2), F.interpolate(
            h, scale_factor=2.0, mode="nearest")


class Math(nn.Module):
    def forward(self, x, y):
        a = x.abs()
        return (torch.cat([x.clamp(-0.5, 0.7), torch.clamp(x, min=0.1), x.clip(max=-0.2),
                           torch.exp(x), torch.log(a + 1), a.sqrt(), torch.rsqrt(a + 0.5),
                           -x, x.abs() * 2, x ** 2, torch.pow(x, 3), a ** 0.5], dim=1),
                torch.pow(a + 0.5, y))


class Compare(nn.Module):
    def forward(self, x, y):
        m = x > 0
        return (torch.cat([m.float(), (x == y).float(), (x != y).float(), (x < y).float(),
                           (x <= 0.25).float(), torch.ge(x, y).float(), (0.5 < x).float()], dim=1),
                torch.where(m, x, y), torch.where(x < y, x, 0.0),
                x.masked_fill(y < 0, -1.5))


class Shapes(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("ids", torch.tensor([3, 0, 1, 2]))

    def forward(self, x):  # x [N, 4, 6]
        a, b, c = x.chunk(3, dim=2)
        p, q = torch.split(x, [1, 3], dim=1)
        u = x.unbind(dim=1)
        s = torch.stack([a, c, b], dim=1)  # [N, 3, 4, 2]
        r = x[:, None].expand(-1, 2, -1, -1).repeat(1, 1, 2, 1)  # [N, 2, 8, 6]
        n = x.narrow(2, 1, 3).unsqueeze(1).squeeze(1)
        o = torch.roll(x, shifts=(1, -2), dims=(1, 2)) + x.roll(3, 2)
        i = x.index_select(1, self.ids) + torch.index_select(x, 2, self.ids).sum(2, keepdim=True)
        return (s.flatten(1) + r[:, :, :6, :2].flatten(1),
                torch.cat([p, q.sum(1, keepdim=True), u[2][:, None]], dim=1) * n.sum(),
                o, i + x[:, ::2].mean())


class TensorIndex(nn.Module):
    """x[ids] and x[:, ids] with int64 index tensors (negative ids count from
    the end), as Swin's relative position table is read."""

    def __init__(self):
        super().__init__()
        self.register_buffer("rows", torch.tensor([[2, -1], [0, 1], [3, 3]]))
        self.register_buffer("cols", torch.tensor([3, 0, -2]))
        self.register_buffer("two", torch.tensor([[1], [-4]]))
        self.table = nn.Parameter(torch.randn(5, 3))

    def forward(self, x):  # x [N, 4, 5]
        return (x[:, self.cols], self.table[self.rows].sum(-1) + x[:, ::2, self.cols].mean(),
                x.transpose(1, 2)[:, self.two])


class Picks(nn.Module):
    def forward(self, x):  # x [N, 5, 7]
        v, idx = x.max(dim=1)
        w, _ = torch.min(x, 2, keepdim=True)
        return (torch.cat([torch.amax(x, dim=(1, 2)).unsqueeze(1), x.amin(dim=-1)], dim=1),
                v + idx.float(), w.squeeze(2) + x.argmax(dim=2).float(),
                torch.argmin(x.transpose(1, 2), dim=1).float())


class Resample(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x):  # x [N, 3, 7, 9]
        h = self.conv(x)  # channels last
        return (F.interpolate(h, size=(11, 5), mode="bilinear", align_corners=False),
                F.interpolate(x, size=(13, 17), mode="bilinear", align_corners=True),
                F.interpolate(x[:, :, ::2], scale_factor=1.5, mode="nearest") +
                F.interpolate(x[:, :, ::2], scale_factor=1.5, mode="nearest-exact"),
                F.interpolate(x[:, 0], size=12, mode="linear", align_corners=False))


class PadShuffle(nn.Module):
    def __init__(self):
        super().__init__()
        self.shuffle = nn.PixelShuffle(2)

    def forward(self, x):  # x [N, 8, 5, 6]
        return (F.pad(x, (1, 2, 0, 1), value=0.5), F.pad(x, (-1, 1, 2, -2)),
                self.shuffle(x), F.pad(x.transpose(2, 3), (1, 1)))


class ResampleModules(nn.Module):
    """nn.Upsample (size and scale_factor as numbers and as tuples, nearest
    and bilinear with align_corners both ways) and its subclasses
    UpsamplingNearest2d / UpsamplingBilinear2d, beside F.interpolate with
    the same arguments: one op entry behind both spellings."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.up_bl = nn.Upsample(scale_factor=(2, 1.5), mode="bilinear", align_corners=False)
        self.up_ac = nn.Upsample(size=(11, 13), mode="bilinear", align_corners=True)
        self.up_ac2 = nn.UpsamplingBilinear2d(size=(11, 13))
        self.up_near = nn.Upsample(scale_factor=2)
        self.up_near2 = nn.UpsamplingNearest2d(scale_factor=(2, 3))
        self.up_1d = nn.Upsample(size=16, mode="linear")

    def forward(self, x):  # x [N, 3, 7, 9]
        h = self.conv(x)  # channels last
        s = x[:, :, ::2]  # a stepped slice
        return (self.up_bl(h) + 0.5 * F.interpolate(h, scale_factor=(2.0, 1.5), mode="bilinear"),
                self.up_ac(x) - 0.25 * self.up_ac2(x.transpose(2, 3).transpose(2, 3)),
                self.up_near(s) + F.interpolate(s, scale_factor=(2, 2)),
                torch.cat([self.up_near2(s).flatten(2), self.up_1d(x[:, 0]).flatten(1).unsqueeze(1)
                           .expand(-1, 3, -1)], dim=2))


class PadModules(nn.Module):
    """ZeroPad2d and ConstantPad1d/2d/3d (negative pads crop, as in torch)
    beside F.pad with the same arguments; torch.swapaxes / swapdims
    (MaxViT's spelling of transpose) feed them strided views."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(4, 4, 3, padding=1)
        self.zero = nn.ZeroPad2d((1, 2, 0, 3))
        self.zero1 = nn.ZeroPad2d(1)
        self.pad1 = nn.ConstantPad1d(2, -1.0)
        self.pad2 = nn.ConstantPad2d((2, -1, 1, 1), 0.5)
        self.pad3 = nn.ConstantPad3d((1, 1, 0, 2, 1, 0), 0.25)

    def forward(self, x):  # x [N, 4, 5, 6]
        h = self.conv(x)  # channels last
        return (self.zero(h) + F.pad(h, (1, 2, 0, 3)),
                self.pad2(x) - F.pad(x, (2, -1, 1, 1), value=0.5) * 0.5,
                self.pad1(torch.swapaxes(x, 2, 3)) + x.swapdims(2, 3).mean(),
                torch.cat([self.pad3(x), self.zero1(x)], dim=1))


class EdgePads(nn.Module):
    """F.pad's reflect, replicate and circular modes and their modules
    (ReflectionPad1d/2d/3d, ReplicationPad1d/2d/3d: CycleGAN's and style
    transfer's generators, super-resolution nets, audio front ends), on the
    channels-last tensor a convolution hands on, on a transposed view and on
    a plain input; negative amounts crop, as in torch."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(4, 4, 3, padding=1)
        self.refl2 = nn.ReflectionPad2d((2, 1, 1, 3))
        self.refl1 = nn.ReflectionPad1d(3)
        self.refl3 = nn.ReflectionPad3d(1)
        self.rep2 = nn.ReplicationPad2d(2)
        self.rep1 = nn.ReplicationPad1d((0, 4))
        self.rep3 = nn.ReplicationPad3d((1, 0, 0, 2, 1, 1))

    def forward(self, x):  # x [N, 4, 5, 6]
        h = self.conv(x)  # channels last
        t = x.transpose(2, 3)  # strided
        return (self.refl2(h) + F.pad(h, (2, 1, 1, 3), mode="reflect"),
                self.rep2(t) * F.pad(t, [2, 2, 2, 2], "replicate"),
                torch.cat([F.pad(x, (1, 2, 5, 0), mode="circular").flatten(1),
                           F.pad(h, (-1, 2, 1, -2), "reflect").flatten(1),
                           F.pad(x, (-2, 3, 2, -1), mode="replicate").flatten(1),
                           F.pad(x[:, 0], (2, 2), "circular").flatten(1)], dim=1),
                torch.cat([self.refl1(x[:, :, 0]).flatten(1), self.rep1(x[:, 1, :, 1:]).flatten(1),
                           self.refl3(x.unsqueeze(1)).flatten(1),
                           self.rep3(x[:, :3]).flatten(1)], dim=1))


class Unshuffle(nn.Module):
    """nn.Unflatten and Tensor.unflatten (with a -1), nn.PixelUnshuffle and
    F.pixel_unshuffle (space-to-depth, as super-resolution and YOLO-style
    necks use it) on a channels-last conv output and a transposed view, and
    pixel_shuffle undoing it."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 1)
        self.un = nn.Unflatten(1, (3, 4))
        self.pu = nn.PixelUnshuffle(2)

    def forward(self, x, y):  # x [N, 12], y [N, 3, 4, 6]
        return (self.un(x).softmax(-1), x.unflatten(1, (2, -1)) * 2, self.pu(self.conv(y)),
                F.pixel_shuffle(F.pixel_unshuffle(y.transpose(2, 3), 2), 2))


class Dropouts(nn.Module):
    """Dropout1d/2d/3d, AlphaDropout, FeatureAlphaDropout and their
    functions with training=self.training: the identity in eval mode."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.d1, self.d2, self.d3 = nn.Dropout1d(0.2), nn.Dropout2d(0.3), nn.Dropout3d()
        self.a, self.fa = nn.AlphaDropout(0.1), nn.FeatureAlphaDropout(0.2)

    def forward(self, x):  # x [N, 3, 6, 6]
        h = F.dropout2d(self.d2(F.relu(self.conv(x))), 0.5, self.training)
        v = F.alpha_dropout(self.a(h.mean((2, 3))), 0.2, training=self.training)
        return (self.fa(self.d1(v.unsqueeze(-1))).squeeze(-1) * 2,
                self.d3(F.dropout3d(h.unsqueeze(2), 0.1, self.training)))


class Bicubic(nn.Module):
    """Bicubic upsampling (super-resolution nets, position-embedding resizes):
    nn.Upsample with a scale_factor and with a size and align_corners, and
    F.interpolate with per-dim scales (one below 1) and on a transposed view;
    torch's A = -0.75 and clamped borders."""

    def __init__(self):
        super().__init__()
        self.up = nn.Upsample(scale_factor=2, mode="bicubic", align_corners=False)
        self.up2 = nn.Upsample(size=(7, 11), mode="bicubic", align_corners=True)
        self.conv = nn.Conv2d(3, 3, 1)

    def forward(self, x):  # x [N, 3, 5, 6]
        return (self.up(x), self.up2(self.conv(x)),
                F.interpolate(x, scale_factor=(1.5, 0.7), mode="bicubic"),
                F.interpolate(x.transpose(2, 3), size=(3, 2), mode="bicubic", align_corners=False))


class Bilinears(nn.Module):
    """nn.Bilinear with and without bias, on 2-d rows and on [N, T, F]
    sequences, fed by a Linear and by a strided view."""

    def __init__(self):
        super().__init__()
        self.b = nn.Bilinear(3, 4, 5)
        self.b2 = nn.Bilinear(5, 5, 2, bias=False)
        self.lin = nn.Linear(3, 5)

    def forward(self, x, y):  # x [N, 6, 3], y [N, 4, 6]
        h = self.b(x, y.transpose(1, 2))
        return self.b2(h, torch.tanh(self.lin(x))), self.b(x[:, 0], y[:, :, 1])


class Norms(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.rand(6) + 0.5)
        self.b = nn.Parameter(torch.randn(6) * 0.1)
        self.lw = nn.Parameter(torch.rand(5, 4) + 0.5)
        self.lrn = nn.LocalResponseNorm(3, alpha=0.01, beta=0.5, k=2.0)

    def forward(self, x):  # x [N, 6, 5, 4]
        return (F.group_norm(x, 3, self.w, self.b, 1e-5) + F.group_norm(x, 2),
                F.instance_norm(x, weight=self.w, bias=self.b) + F.instance_norm(x * 2),
                F.layer_norm(x, (5, 4), self.lw, None, 1e-6) +
                F.layer_norm(x.permute(0, 2, 3, 1), (6,)).permute(0, 3, 1, 2),
                self.lrn(x) + F.local_response_norm(x, 2))


class ParamNorms(nn.Module):
    """The modules with parameters (GroupNorm, InstanceNorm1d/2d, PReLU),
    after a convolution (channels-last input) and on a plain one."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 6, 3, padding=1)
        self.gn = nn.GroupNorm(3, 6)
        self.inorm = nn.InstanceNorm2d(6, affine=True)
        self.irun = nn.InstanceNorm2d(6, track_running_stats=True)
        self.i1 = nn.InstanceNorm1d(3)
        self.prelu = nn.PReLU(6)
        self.prelu1 = nn.PReLU()
        self.slope = nn.Parameter(torch.full((3,), 0.1))
        with torch.no_grad():
            for mod in (self.gn, self.inorm, self.prelu):
                mod.weight.uniform_(0.5, 1.5)
            self.gn.bias.normal_(0, 0.2)
            self.inorm.bias.normal_(0, 0.2)
            self.irun.running_mean.normal_(0, 0.3)
            self.irun.running_var.uniform_(0.5, 1.5)

    def forward(self, x):  # x [N, 3, 5, 4]
        h = self.conv(x)
        return (self.gn(h) + self.prelu(h), self.inorm(h) + self.irun(h),
                self.i1(x.flatten(2)) + self.prelu1(x.flatten(2)),
                F.prelu(x, self.slope))


class Convert(nn.Module):
    """Tensor.to / type / type_as / float / long / bool between float32,
    int64 and bool (float -> int64 truncates toward zero)."""

    def forward(self, x):  # x [N, 3]
        m = (x > 0.3).to(torch.float32) + (x < 0).type(torch.float32)
        t = (x * 3).to(torch.int64).to(torch.float) + (x * 2).long().float()
        return (m + x.to("cpu"), t + x.bool().float(),
                (x * 4).long().type_as(x) * x + (x * 5).to(dtype=torch.int64).to(torch.float32))


class Depth(nn.Module):
    """torchvision's StochasticDepth (identity in eval) and size arithmetic
    with dim() and numel()."""

    def __init__(self):
        super().__init__()
        self.sd = torchvision.ops.StochasticDepth(0.3, "row")
        self.fc = nn.Linear(6, 6)

    def forward(self, x):  # x [N, 3, 6]
        h = self.sd(self.fc(x)) + x
        return h.reshape(h.shape[0], h.numel() // h.shape[0]) * h.dim()


CASES = [
    ("zoo_acts", Acts, lambda: (torch.randn(2, 3, 4) * 3,), lambda: (torch.randn(3, 3, 4) * 3,)),
    ("zoo_conv_acts", ConvActs, lambda: (torch.randn(1, 3, 6, 7),),
     lambda: (torch.randn(2, 3, 6, 7),)),
    ("zoo_math", Math, lambda: (torch.randn(2, 3), torch.randn(2, 3)),
     lambda: (torch.randn(4, 3), torch.randn(4, 3))),
    ("zoo_compare", Compare, lambda: (torch.randn(2, 5), torch.randn(2, 5)),
     lambda: (torch.randn(3, 5), torch.randn(3, 5))),
    ("zoo_shapes", Shapes, lambda: (torch.randn(2, 4, 6),), lambda: (torch.randn(3, 4, 6),)),
    ("zoo_tensor_index", TensorIndex, lambda: (torch.randn(2, 4, 5),),
     lambda: (torch.randn(3, 4, 5),)),
    ("zoo_picks", Picks, lambda: (torch.randn(2, 5, 7),), lambda: (torch.randn(3, 5, 7),)),
    ("zoo_resample", Resample, lambda: (torch.randn(1, 3, 7, 9),),
     lambda: (torch.randn(2, 3, 7, 9),)),
    ("zoo_pad_shuffle", PadShuffle, lambda: (torch.randn(2, 8, 5, 6),),
     lambda: (torch.randn(3, 8, 5, 6),)),
    ("zoo_norms", Norms, lambda: (torch.randn(2, 6, 5, 4),), lambda: (torch.randn(3, 6, 5, 4),)),
    ("zoo_param_norms", ParamNorms, lambda: (torch.randn(2, 3, 5, 4),),
     lambda: (torch.randn(3, 3, 5, 4),)),
    ("zoo_convert", Convert, lambda: (torch.randn(2, 3),), lambda: (torch.randn(4, 3),)),
    ("zoo_depth", Depth, lambda: (torch.randn(2, 3, 6),), lambda: (torch.randn(5, 3, 6),)),
    ("zoo_resample_modules", ResampleModules, lambda: (torch.randn(1, 3, 7, 9),),
     lambda: (torch.randn(2, 3, 7, 9),)),
    ("zoo_pad_modules", PadModules, lambda: (torch.randn(2, 4, 5, 6),),
     lambda: (torch.randn(3, 4, 5, 6),)),
    ("zoo_edge_pads", EdgePads, lambda: (torch.randn(2, 4, 5, 6),),
     lambda: (torch.randn(3, 4, 5, 6),)),
    ("zoo_bilinear", Bilinears, lambda: (torch.randn(2, 6, 3), torch.randn(2, 4, 6)),
     lambda: (torch.randn(3, 6, 3), torch.randn(3, 4, 6))),
    ("zoo_bicubic", Bicubic, lambda: (torch.randn(2, 3, 5, 6),),
     lambda: (torch.randn(3, 3, 5, 6),)),
    ("zoo_dropouts", Dropouts, lambda: (torch.randn(2, 3, 6, 6),),
     lambda: (torch.randn(3, 3, 6, 6),)),
    ("zoo_unshuffle", Unshuffle, lambda: (torch.randn(2, 12), torch.randn(2, 3, 4, 6)),
     lambda: (torch.randn(3, 12), torch.randn(3, 3, 4, 6))),
]


def generate(out_dir):
    write_cases(out_dir, CASES, 1700)
