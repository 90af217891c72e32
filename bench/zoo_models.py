"""The torchvision classifiers of bench/zoo.sh: each builder returns the model exactly as a
PyTorch user gets it (`torchvision.models.<name>(weights=None)`, seeded, eval mode) and a
1x3x224x224 example input.  Nothing is changed in the model: what Grove cannot run yet is
reported by the exporter's refusal ("not supported: ...").  Random-init weights run at the
same speed as trained ones (no engine here skips zeros or sparsity)."""
import torch
import torchvision

NAMES = ["resnet50", "mobilenet_v2", "mobilenet_v3_large", "efficientnet_b0", "squeezenet1_1",
         "densenet121", "convnext_tiny", "vit_b_16"]


def _builder(name):
    def build():
        torch.manual_seed(18)
        m = getattr(torchvision.models, name)(weights=None).eval()
        return m, torch.randn(1, 3, 224, 224)
    build.__name__ = name
    return build


def mobilenet_v2_relu():
    """Not in the default list: MobileNetV2 with its ReLU6 layers replaced by ReLU, a stand-in
    that measures the depthwise and 1x1 convolution paths while ReLU6 is not in Grove yet (the
    same convolutions and shapes; only the clamp differs).  Named as what it is in every table."""
    m, x = _builder("mobilenet_v2")()
    for mod in m.modules():
        for name, child in mod.named_children():
            if isinstance(child, torch.nn.ReLU6):
                setattr(mod, name, torch.nn.ReLU())
    return m, x


BUILDERS = {name: _builder(name) for name in NAMES}
# Not in the default list, measured by name (bench/zoo.sh GROVE_BIN swin_t): the Swin
# Transformers, unchanged (window 7 for v1, 8 for v2, at 224x224).
for _name in ("swin_t", "swin_s", "swin_b", "swin_v2_t", "swin_v2_s", "swin_v2_b"):
    BUILDERS[_name] = _builder(_name)
BUILDERS["mobilenet_v2_relu"] = mobilenet_v2_relu
globals().update(BUILDERS)
