"""Reference models for the CNN and transformer benchmarks (bench/cnn_transformer.sh), next to
the MLPs of ../shared/peers/models.py.  Each builder returns an eval-mode torch.nn.Module with
seeded weights and an example input; both have a custom forward, so tools/grove_export.py
exports them with their torch.fx graphs.

    cnn          a small ResNet for 3x32x32 images: a conv stem, four residual blocks (two
                 downsampling, with 1x1 projections) in a ModuleList iterated in forward,
                 global average pooling, Linear(128, 10).  About 72 M multiply-adds a sample.
    transformer  a text classifier: Embedding(1000, 128) plus a learned position table,
                 TransformerEncoder of 2 layers (4 heads, feed-forward 256, batch_first), the
                 mean over tokens, Linear(128, 4).  16 tokens a sample (SEQ), as
                 `grove bench` feeds any free dimension.
    mlp          the reference MLP of ../shared/peers/models.py (Linear(784,1024) ReLU
                 Linear(1024,1024) ReLU Linear(1024,10), the same seed), for bench/run.sh,
                 bench/server_bench.sh and bench/ab.sh where that folder is absent.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

SEQ = 16


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False),
                                      nn.BatchNorm2d(cout))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        identity = x if self.down is None else self.down(x)
        return F.relu(out + identity)


class SmallResNet(nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32),
                                  nn.ReLU())
        self.blocks = nn.ModuleList([BasicBlock(32, 32, 1), BasicBlock(32, 64, 2),
                                     BasicBlock(64, 64, 1), BasicBlock(64, 128, 2)])
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(128, classes)

    def forward(self, x):
        x = self.stem(x)
        for block in self.blocks:
            x = block(x)
        return self.fc(torch.flatten(self.pool(x), 1))


class TextClassifier(nn.Module):
    def __init__(self, vocab=1000, d=128, heads=4, ff=256, layers=2, classes=4, max_len=64):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.randn(1, max_len, d) * 0.02)
        layer = nn.TransformerEncoderLayer(d, heads, ff, dropout=0.1, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d, classes)

    def forward(self, tokens):
        h = self.embed(tokens) + self.pos[:, :tokens.size(1)]
        return self.head(self.encoder(h).mean(dim=1))


def cnn():
    torch.manual_seed(2)
    m = SmallResNet()
    # Real running statistics, as a trained checkpoint has.
    m.train()
    with torch.no_grad():
        for _ in range(5):
            m(torch.randn(32, 3, 32, 32))
    return m.eval(), torch.randn(1, 3, 32, 32)


def transformer():
    torch.manual_seed(3)
    return TextClassifier().eval(), torch.randint(0, 1000, (1, SEQ))


def mlp():
    torch.manual_seed(0)
    m = nn.Sequential(
        nn.Linear(784, 1024), nn.ReLU(),
        nn.Linear(1024, 1024), nn.ReLU(),
        nn.Linear(1024, 10),
    ).eval()
    return m, torch.randn(1, 784)


BUILDERS = {"cnn": cnn, "transformer": transformer}
