"""Models written the way torchvision and timm write them: in-place activations and ``+=`` residuals.

``ResNet18`` and ``MobileNetV2`` follow torchvision's layer structure (``BasicBlock`` with
``nn.ReLU(inplace=True)`` and ``out += identity``; ``ConvBNReLU`` with ``nn.ReLU6(inplace=True)``
and inverted residuals), ``TimmNet`` timm's idioms (``nn.SiLU(inplace=True)``,
``nn.Hardswish(inplace=True)``, ``x += shortcut``, ``x.mul_(gate)`` in squeeze-excite, a
``hard_sigmoid`` as ``relu6_(x + 3).div_(6)``). Widths are small so that export, fold and audit stay fast;
the topology and the op spellings are the real ones. ``calibrate`` gives every BatchNorm real
statistics (a few train-mode batches) before ``eval()``.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        return self.relu(out)


class ResNet18(nn.Module):
    """torchvision's resnet18 layout ([2, 2, 2, 2] BasicBlocks), ``width`` channels in the stem."""

    def __init__(self, width: int = 8, num_classes: int = 10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        layers, cin = [], width
        for i, stride in enumerate((1, 2, 2, 2)):
            cout = width * 2**i
            layers.append(nn.Sequential(BasicBlock(cin, cout, stride), BasicBlock(cout, cout)))
            cin = cout
        self.layer1, self.layer2, self.layer3, self.layer4 = layers
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(cin, num_classes)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


class ConvBNReLU(nn.Sequential):
    def __init__(self, cin: int, cout: int, kernel: int = 3, stride: int = 1, groups: int = 1):
        super().__init__(
            nn.Conv2d(cin, cout, kernel, stride, (kernel - 1) // 2, groups=groups, bias=False),
            nn.BatchNorm2d(cout),
            nn.ReLU6(inplace=True),
        )


class InvertedResidual(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, expand: int):
        super().__init__()
        hidden = cin * expand
        self.use_res_connect = stride == 1 and cin == cout
        layers = [ConvBNReLU(cin, hidden, 1)] if expand != 1 else []
        layers += [
            ConvBNReLU(hidden, hidden, stride=stride, groups=hidden),
            nn.Conv2d(hidden, cout, 1, bias=False),
            nn.BatchNorm2d(cout),
        ]
        self.conv = nn.Sequential(*layers)

    def forward(self, x):
        return x + self.conv(x) if self.use_res_connect else self.conv(x)


class MobileNetV2(nn.Module):
    """torchvision's mobilenet_v2 layout (17 inverted residuals, 52 BatchNorms), channels / ``shrink``."""

    SETTINGS = (
        (1, 16, 1, 1),
        (6, 24, 2, 2),
        (6, 32, 3, 2),
        (6, 64, 4, 2),
        (6, 96, 3, 1),
        (6, 160, 3, 2),
        (6, 320, 1, 1),
    )

    def __init__(self, shrink: int = 8, num_classes: int = 10):
        super().__init__()
        cin = 32 // shrink
        features: list[nn.Module] = [ConvBNReLU(3, cin, stride=2)]
        for t, c, n, s in self.SETTINGS:
            cout = max(c // shrink, 2)
            for i in range(n):
                features.append(InvertedResidual(cin, cout, s if i == 0 else 1, t))
                cin = cout
        features.append(ConvBNReLU(cin, 1280 // shrink, 1))
        self.features = nn.Sequential(*features)
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(1280 // shrink, num_classes))

    def forward(self, x):
        x = F.adaptive_avg_pool2d(self.features(x), (1, 1))
        return self.classifier(torch.flatten(x, 1))


def hard_sigmoid_(x):
    """timm's in-place hard sigmoid."""
    return F.relu6(x.add_(3.0), inplace=True).div_(6.0)


class SqueezeExcite(nn.Module):
    def __init__(self, channels: int, reduced: int):
        super().__init__()
        self.conv_reduce = nn.Conv2d(channels, reduced, 1)
        self.act = nn.SiLU(inplace=True)
        self.conv_expand = nn.Conv2d(reduced, channels, 1)

    def forward(self, x):
        gate = self.conv_expand(self.act(self.conv_reduce(x.mean((2, 3), keepdim=True))))
        return x.mul_(hard_sigmoid_(gate))


class TimmBlock(nn.Module):
    """An inverted-residual block in timm's style: SiLU / Hardswish in place, SE, ``x += shortcut``."""

    def __init__(self, channels: int, act: type[nn.Module]):
        super().__init__()
        self.conv_pw = nn.Conv2d(channels, channels * 3, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels * 3)
        self.act1 = act(inplace=True)
        self.conv_dw = nn.Conv2d(channels * 3, channels * 3, 3, padding=1, groups=channels * 3, bias=False)
        self.bn2 = nn.BatchNorm2d(channels * 3)
        self.act2 = act(inplace=True)
        self.se = SqueezeExcite(channels * 3, max(channels // 2, 2))
        self.conv_pwl = nn.Conv2d(channels * 3, channels, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(channels)

    def forward(self, x):
        shortcut = x
        x = self.act2(self.bn2(self.conv_dw(self.act1(self.bn1(self.conv_pw(x))))))
        x = self.bn3(self.conv_pwl(self.se(x)))
        x += shortcut
        return x


class TimmNet(nn.Module):
    def __init__(self, width: int = 8, num_classes: int = 10):
        super().__init__()
        self.conv_stem = nn.Conv2d(3, width, 3, 2, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.act1 = nn.SiLU(inplace=True)
        self.blocks = nn.Sequential(TimmBlock(width, nn.SiLU), TimmBlock(width, nn.Hardswish))
        self.conv_head = nn.Conv2d(width, width * 4, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(width * 4)
        self.act2 = nn.Hardswish(inplace=True)
        self.classifier = nn.Linear(width * 4, num_classes)

    def forward(self, x):
        x = self.blocks(self.act1(self.bn1(self.conv_stem(x))))
        x = self.act2(self.bn2(self.conv_head(x)))
        return self.classifier(x.mean((2, 3)))


MODELS = {"resnet18": ResNet18, "mobilenet_v2": MobileNetV2, "timm_style": TimmNet}
INPUT_SHAPE = (1, 3, 32, 32)


def calibrate(model: nn.Module, batches: int = 3, seed: int = 0) -> nn.Module:
    """Real BatchNorm statistics: a few train-mode batches of random data, then ``eval()``."""
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.momentum = None  # a cumulative average over the calibration batches
            with torch.no_grad():
                m.weight.uniform_(0.5, 1.5, generator=g)
                m.bias.uniform_(-0.5, 0.5, generator=g)
    model.train()
    with torch.no_grad():
        for _ in range(batches):
            model(torch.randn(8, *INPUT_SHAPE[1:], generator=g))
    return model.eval()


def build(name: str, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return calibrate(MODELS[name](), seed=seed)
