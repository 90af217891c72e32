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


BUILDERS = {name: _builder(name) for name in NAMES}
globals().update(BUILDERS)
