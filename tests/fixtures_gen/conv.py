"""Convolution and pooling parity fixtures: for each case, a torch.nn layer
(Conv1d, Conv2d, ConvTranspose1d, ConvTranspose2d, BatchNorm2d, MaxPool1d/2d, AvgPool1d/2d, AdaptiveAvgPool1d/2d,
AdaptiveMaxPool1d/2d) with
seeded random weights in eval mode, a seeded random input and torch's output,
written as

    conv_<case>.safetensors   w.<state_dict key>, x (the input), y (torch's output)
    conv_<case>.json          the layer's model.json module object, as
                              tools/grove_export.py writes it

tests/check_conv.c builds each layer twice, with its C constructor (a table
mirroring CASES below) and from the JSON, loads w.* strictly, and compares
both outputs with y (rtol 1e-4, atol 1e-5)."""
import json
import os
from collections import OrderedDict

import torch
import torch.nn as nn

from grove_export import module_spec, save_safetensors


def _randomise(m, seed):
    g = torch.Generator().manual_seed(seed + 1000)
    for mod in m.modules():
        for name, p in mod.named_parameters(recurse=False):
            with torch.no_grad():
                p.copy_(torch.rand(p.shape, generator=g) * 2 - 1)
        for name, b in mod.named_buffers(recurse=False):
            with torch.no_grad():
                if name == "running_var":
                    b.copy_(torch.rand(b.shape, generator=g) * 1.5 + 0.5)
                elif name == "running_mean":
                    b.copy_(torch.rand(b.shape, generator=g) * 2 - 1)
                elif name == "num_batches_tracked":
                    b.fill_(3)


def _x(*shape):
    return torch.randn(shape)


CASES = [
    # Conv2d: batch 1, odd sizes, stride, padding, dilation, groups,
    # depthwise, 1x1 (direct and strided), "same" with an even kernel
    # (asymmetric padding), "valid", unbatched input, chunks of images.
    ("conv2d_basic", lambda: nn.Conv2d(3, 8, 3), lambda: _x(2, 3, 9, 9)),
    ("conv2d_b1_pad", lambda: nn.Conv2d(3, 5, 3, padding=1), lambda: _x(1, 3, 7, 7)),
    ("conv2d_stride", lambda: nn.Conv2d(4, 6, (3, 5), stride=(2, 1), padding=(1, 2)),
     lambda: _x(3, 4, 11, 10)),
    ("conv2d_dil", lambda: nn.Conv2d(2, 4, 3, dilation=2, padding=2), lambda: _x(2, 2, 9, 8)),
    ("conv2d_groups", lambda: nn.Conv2d(6, 9, 3, groups=3, padding=1, bias=False),
     lambda: _x(2, 6, 5, 5)),
    ("conv2d_dw", lambda: nn.Conv2d(4, 4, 3, groups=4, stride=2), lambda: _x(2, 4, 8, 8)),
    ("conv2d_1x1", lambda: nn.Conv2d(8, 5, 1), lambda: _x(3, 8, 4, 6)),
    ("conv2d_1x1_stride", lambda: nn.Conv2d(8, 5, 1, stride=2), lambda: _x(2, 8, 5, 7)),
    ("conv2d_same_even", lambda: nn.Conv2d(3, 4, 4, padding="same"), lambda: _x(2, 3, 7, 6)),
    ("conv2d_same_dil", lambda: nn.Conv2d(3, 4, 3, padding="same", dilation=2),
     lambda: _x(1, 3, 6, 9)),
    ("conv2d_valid", lambda: nn.Conv2d(3, 4, 2, padding="valid"), lambda: _x(2, 3, 5, 5)),
    ("conv2d_unbatched", lambda: nn.Conv2d(2, 3, 3), lambda: _x(2, 6, 6)),
    ("conv2d_many", lambda: nn.Conv2d(16, 12, 3, padding=1), lambda: _x(5, 16, 6, 6)),
    ("conv2d_chunked", lambda: nn.Conv2d(32, 4, 3, padding=1), lambda: _x(3, 32, 36, 36)),
    # Shapes that take the rows path (8+ channels per group) with full 16 x
    # 16 transpose tiles and ragged edges, groups, 1x1, stride.
    ("conv2d_wide", lambda: nn.Conv2d(16, 32, 3, padding=1), lambda: _x(2, 16, 10, 10)),
    ("conv2d_groups_rows", lambda: nn.Conv2d(16, 16, 3, groups=2, padding=1, bias=False),
     lambda: _x(3, 16, 6, 5)),
    ("conv2d_1x1_rows", lambda: nn.Conv2d(16, 32, 1), lambda: _x(2, 16, 5, 7)),
    ("conv2d_stride_rows", lambda: nn.Conv2d(16, 16, 3, stride=2, padding=1),
     lambda: _x(1, 16, 9, 9)),
    ("conv1d_rows", lambda: nn.Conv1d(16, 24, 3, padding=2, dilation=2), lambda: _x(2, 16, 20)),
    # Conv1d.
    ("conv1d_basic", lambda: nn.Conv1d(4, 6, 3), lambda: _x(2, 4, 10)),
    ("conv1d_stride_pad", lambda: nn.Conv1d(3, 5, 5, stride=2, padding=2), lambda: _x(1, 3, 17)),
    ("conv1d_groups_dil", lambda: nn.Conv1d(4, 8, 3, groups=2, dilation=3, padding=3),
     lambda: _x(3, 4, 12)),
    ("conv1d_same", lambda: nn.Conv1d(2, 3, 4, padding="same"), lambda: _x(2, 2, 9)),
    ("conv1d_unbatched", lambda: nn.Conv1d(3, 2, 1), lambda: _x(3, 7)),
    # BatchNorm2d.
    ("bn2d", lambda: nn.BatchNorm2d(5), lambda: _x(3, 5, 4, 4) * 2 + 0.5),
    ("bn2d_b1", lambda: nn.BatchNorm2d(5, eps=1e-3), lambda: _x(1, 5, 3, 2)),
    ("bn2d_noaffine", lambda: nn.BatchNorm2d(3, affine=False), lambda: _x(2, 3, 5, 5)),
    ("bn2d_nostats", lambda: nn.BatchNorm2d(4, track_running_stats=False),
     lambda: _x(2, 4, 3, 3) * 2 + 3),
    # MaxPool2d.
    ("maxpool_2", lambda: nn.MaxPool2d(2), lambda: _x(2, 3, 8, 8)),
    ("maxpool_odd", lambda: nn.MaxPool2d(3, stride=2, padding=1), lambda: _x(1, 2, 7, 9)),
    ("maxpool_ceil", lambda: nn.MaxPool2d(3, stride=2, ceil_mode=True), lambda: _x(2, 2, 8, 8)),
    ("maxpool_dil", lambda: nn.MaxPool2d((2, 3), stride=1, dilation=2), lambda: _x(1, 3, 7, 8)),
    ("maxpool_unbatched", lambda: nn.MaxPool2d(2, 1), lambda: _x(3, 5, 6)),
    # AvgPool2d.
    ("avgpool_2", lambda: nn.AvgPool2d(2), lambda: _x(2, 3, 8, 8)),
    ("avgpool_pad", lambda: nn.AvgPool2d(3, stride=2, padding=1), lambda: _x(1, 2, 7, 9)),
    ("avgpool_pad_excl", lambda: nn.AvgPool2d(3, stride=2, padding=1, count_include_pad=False),
     lambda: _x(1, 2, 7, 9)),
    ("avgpool_ceil", lambda: nn.AvgPool2d(3, stride=2, padding=1, ceil_mode=True),
     lambda: _x(1, 2, 8, 9)),
    ("avgpool_div", lambda: nn.AvgPool2d(2, divisor_override=3), lambda: _x(2, 1, 4, 6)),
    # AdaptiveAvgPool2d.
    ("adapt_1", lambda: nn.AdaptiveAvgPool2d(1), lambda: _x(2, 4, 5, 7)),
    ("adapt_odd", lambda: nn.AdaptiveAvgPool2d((3, 2)), lambda: _x(1, 3, 7, 5)),
    ("adapt_none", lambda: nn.AdaptiveAvgPool2d((None, 3)), lambda: _x(2, 2, 4, 8)),
    ("adapt_up", lambda: nn.AdaptiveAvgPool2d(4), lambda: _x(1, 1, 3, 3)),
    # Depthwise (groups == in == out channels: the depthwise kernel): 3x3
    # and 5x5, stride 1 and 2, dilation, rectangular kernels and strides,
    # channel counts that leave a tail past the last whole vector (8 and 16
    # lanes), batch 1, unbatched; and a channel multiplier (out = 2 * in),
    # which stays on the columns path.
    ("conv2d_dw_s1", lambda: nn.Conv2d(20, 20, 3, padding=1, groups=20), lambda: _x(1, 20, 9, 11)),
    ("conv2d_dw5_s2", lambda: nn.Conv2d(40, 40, 5, stride=2, padding=2, groups=40, bias=False),
     lambda: _x(2, 40, 13, 12)),
    ("conv2d_dw_dil", lambda: nn.Conv2d(24, 24, 3, padding=2, dilation=2, groups=24),
     lambda: _x(2, 24, 7, 8)),
    ("conv2d_dw_rect", lambda: nn.Conv2d(17, 17, (3, 5), stride=(1, 2), padding=(0, 1), groups=17),
     lambda: _x(3, 17, 6, 9)),
    ("conv2d_dw_same", lambda: nn.Conv2d(16, 16, 4, padding="same", groups=16),
     lambda: _x(2, 16, 7, 6)),
    ("conv2d_dw_unbatched", lambda: nn.Conv2d(9, 9, 3, stride=2, padding=1, groups=9),
     lambda: _x(9, 10, 7)),
    ("conv2d_dw_mult", lambda: nn.Conv2d(8, 16, 3, padding=1, groups=8), lambda: _x(2, 8, 6, 6)),
    # Channels in blocks of the AVX-512 kernel (200 at 5x5: 80, 80 and 40, the
    # last with a masked tail of 8), eight interior columns at a time and
    # the edges clipped, at batch 1 as MobileNetV3 and EfficientNet run it.
    ("conv2d_dw_wide", lambda: nn.Conv2d(200, 200, 5, padding=2, groups=200),
     lambda: _x(1, 200, 6, 21)),
    # The 1-d pools, AdaptiveMaxPool2d, and the 2-d options together
    # (ceil_mode with padding, dilation, count_include_pad=False, a divisor).
    ("maxpool1d", lambda: nn.MaxPool1d(3, stride=2, padding=1, dilation=2, ceil_mode=True),
     lambda: _x(2, 3, 17)),
    ("maxpool1d_unbatched", lambda: nn.MaxPool1d(2), lambda: _x(3, 9)),
    ("avgpool1d", lambda: nn.AvgPool1d(4, stride=3, padding=2, ceil_mode=True,
                                       count_include_pad=False), lambda: _x(2, 3, 14)),
    ("avgpool1d_incl", lambda: nn.AvgPool1d(3, padding=1), lambda: _x(1, 2, 10)),
    ("adapt1d_avg", lambda: nn.AdaptiveAvgPool1d(5), lambda: _x(2, 3, 13)),
    ("adapt1d_max", lambda: nn.AdaptiveMaxPool1d(4), lambda: _x(2, 3, 11)),
    ("adaptmax", lambda: nn.AdaptiveMaxPool2d((3, 5)), lambda: _x(2, 3, 7, 12)),
    ("adaptmax_none", lambda: nn.AdaptiveMaxPool2d((None, 2)), lambda: _x(1, 2, 5, 7)),
    ("adaptmax_1", lambda: nn.AdaptiveMaxPool2d(1), lambda: _x(2, 4, 5, 5)),
    ("avgpool_ceil_excl", lambda: nn.AvgPool2d(3, 2, 1, ceil_mode=True, count_include_pad=False),
     lambda: _x(2, 3, 8, 9)),
    ("avgpool_div_ceil", lambda: nn.AvgPool2d(3, 2, 1, ceil_mode=True, divisor_override=5),
     lambda: _x(1, 2, 8, 7)),
    ("maxpool_ceil_pad_dil", lambda: nn.MaxPool2d(3, 2, padding=1, dilation=2, ceil_mode=True),
     lambda: _x(1, 2, 10, 9)),
    # ConvTranspose2d: stride with output_padding, groups with dilation,
    # rectangular kernels and strides, 1x1, unbatched.
    ("convt_basic", lambda: nn.ConvTranspose2d(4, 6, 3), lambda: _x(2, 4, 5, 5)),
    ("convt_stride_opad", lambda: nn.ConvTranspose2d(8, 5, 3, stride=2, padding=1,
                                                     output_padding=1), lambda: _x(1, 8, 6, 7)),
    ("convt_groups_dil", lambda: nn.ConvTranspose2d(6, 9, (3, 2), stride=(2, 1), padding=(2, 0),
                                                    dilation=2, groups=3, bias=False),
     lambda: _x(2, 6, 5, 4)),
    ("convt_rect_opad", lambda: nn.ConvTranspose2d(16, 16, 4, stride=(2, 3), padding=1,
                                                   output_padding=(1, 2)),
     lambda: _x(2, 16, 4, 5)),
    ("convt_1x1", lambda: nn.ConvTranspose2d(5, 7, 1), lambda: _x(2, 5, 3, 3)),
    ("convt_unbatched", lambda: nn.ConvTranspose2d(3, 2, 2, stride=2), lambda: _x(3, 4, 4)),
    # ConvTranspose1d (vocoders' upsamplers): the same cases over one dim.
    ("convt1d_basic", lambda: nn.ConvTranspose1d(4, 6, 3), lambda: _x(2, 4, 9)),
    ("convt1d_stride_opad", lambda: nn.ConvTranspose1d(8, 5, 4, stride=3, padding=1,
                                                       output_padding=2), lambda: _x(1, 8, 7)),
    ("convt1d_groups_dil", lambda: nn.ConvTranspose1d(6, 9, 3, stride=2, padding=2, dilation=2,
                                                      groups=3, bias=False),
     lambda: _x(2, 6, 5)),
    ("convt1d_unbatched", lambda: nn.ConvTranspose1d(3, 2, 2, stride=2), lambda: _x(3, 7)),
]


def generate(out_dir):
    for i, (name, make, make_x) in enumerate(CASES):
        torch.manual_seed(300 + i)
        m = make()
        _randomise(m, 300 + i)
        m.eval()
        x = make_x()
        with torch.no_grad():
            y = m(x)
        tensors = OrderedDict(("w." + k, v) for k, v in m.state_dict().items())
        tensors["x"] = x
        tensors["y"] = y
        save_safetensors(tensors, os.path.join(out_dir, f"conv_{name}.safetensors"))
        with open(os.path.join(out_dir, f"conv_{name}.json"), "w") as f:
            json.dump(module_spec(m), f)
