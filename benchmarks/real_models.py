"""Real architectures for the fold-speed benchmark (``fold_real.py``), in plain ``torch.nn``.

torchvision / timm are not used (not importable here); these are re-implementations
that keep each reference model's layer table: the same convs, kernel sizes, strides,
dilations, groups, channel widths, depths and BatchNorms (so the same parameter count,
the same exported graph up to node names), with random weights.  BatchNorm statistics
are calibrated (random gamma/beta around 1/0, then a few train-mode batches of smooth
random inputs with cumulative averaging, then ``eval()``), as ``models.calibrate`` does
for parts B and C.

Models (``REAL_MODELS``):

* ``resnet18``, ``resnet50``: torchvision ResNet v1.5 (7x7/2 stem, maxpool, BasicBlock
  [2,2,2,2] / Bottleneck [3,4,6,3] with the stride on the 3x3, 1x1 conv + BN downsample), 1000 classes.
* ``r3d_18``: torchvision ``video.r3d_18``: Conv3d (3,7,7) stem, 3x3x3 BasicBlocks [2,2,2,2],
  widths 64/128/256/512, BatchNorm3d, 400 classes; input 1x3x8x112x112.
* ``efficientnet_v2_s``: torchvision table: stem 3x3/2 24, FusedMBConv (e1 k3 s1 24x2, e4 s2 48x4,
  e4 s2 64x4), MBConv with SE (e4 s2 128x6, e6 s1 160x9, e6 s2 256x15), 1x1 head to 1280, SiLU,
  BatchNorm eps 1e-3, 1000 classes.
* ``mobilenet_v3_large``: torchvision table (15 inverted residuals, ReLU / hardswish, SE with
  hardsigmoid and ``_make_divisible(exp // 4, 8)`` squeeze), 960 -> 1280 -> 1000 classifier.
* ``fcn_resnet50``: torchvision ``segmentation.fcn_resnet50`` without the aux head: ResNet-50 with
  ``replace_stride_with_dilation=[False, True, True]`` (output stride 8) + FCNHead (3x3 conv
  2048->512, BN, ReLU, dropout, 1x1 conv to 21), bilinear upsample to the input size.
* ``levit_128s``: timm ``levit_128s`` (stem of four 3x3/2 conv+BN with hardswish, three stages
  128/256/384, depths 2/3/4, heads 4/6/8, key_dim 16, attn_ratio 2, mlp_ratio 2, attention
  downsampling between stages, LinearNorm = Linear -> flatten(0, 1) -> BatchNorm1d -> reshape_as,
  NormLinear head BatchNorm1d -> Linear, 1000 classes); input 1x3x224x224.

``build(name)`` returns the calibrated eval model and an example input.  The export
shape is the reference one (224x224 images, 8x112x112 clips: ``torch.export`` traces with
fake tensors, so the size costs nothing); calibration runs at a smaller size
(``CALIB_SHAPES``) to stay cheap on a 2-core machine, except for LeViT whose attention
biases are tied to the token grid.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

# -- ResNet (torchvision resnet18 / resnet50, v1.5) -----------------------------------------------


def _conv_bn(conv: nn.Module, bn: nn.Module, act: nn.Module | None = None) -> nn.Sequential:
    return nn.Sequential(conv, bn, act) if act is not None else nn.Sequential(conv, bn)


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, inplanes, planes, stride=1, downsample=None, dilation=1):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, inplanes, planes, stride=1, downsample=None, dilation=1):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride, padding=dilation, dilation=dilation, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, planes * 4, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * 4)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + identity)


class ResNet(nn.Module):
    def __init__(self, block, layers, num_classes=1000, replace_stride_with_dilation=(False, False, False), head=True):
        super().__init__()
        self.inplanes, self.dilation = 64, 1
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        self.layer1 = self._make_layer(block, 64, layers[0])
        self.layer2 = self._make_layer(block, 128, layers[1], 2, replace_stride_with_dilation[0])
        self.layer3 = self._make_layer(block, 256, layers[2], 2, replace_stride_with_dilation[1])
        self.layer4 = self._make_layer(block, 512, layers[3], 2, replace_stride_with_dilation[2])
        self.head = head
        if head:
            self.fc = nn.Linear(512 * block.expansion, num_classes)

    def _make_layer(self, block, planes, blocks, stride=1, dilate=False):
        previous_dilation = self.dilation
        if dilate:
            self.dilation *= stride
            stride = 1
        downsample = None
        if stride != 1 or self.inplanes != planes * block.expansion:
            downsample = nn.Sequential(
                nn.Conv2d(self.inplanes, planes * block.expansion, 1, stride, bias=False),
                nn.BatchNorm2d(planes * block.expansion),
            )
        layers = [block(self.inplanes, planes, stride, downsample, previous_dilation)]
        self.inplanes = planes * block.expansion
        layers += [block(self.inplanes, planes, dilation=self.dilation) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def features(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        return self.layer4(self.layer3(self.layer2(self.layer1(x))))

    def forward(self, x):
        x = self.features(x)
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1)) if self.head else x


def resnet18() -> nn.Module:
    return ResNet(BasicBlock, [2, 2, 2, 2])


def resnet50() -> nn.Module:
    return ResNet(Bottleneck, [3, 4, 6, 3])


# -- FCN-ResNet50 (torchvision segmentation.fcn_resnet50, no aux head) ----------------------------


class FCN(nn.Module):
    def __init__(self, num_classes=21):
        super().__init__()
        self.backbone = ResNet(Bottleneck, [3, 4, 6, 3], replace_stride_with_dilation=(False, True, True), head=False)
        self.classifier = nn.Sequential(
            nn.Conv2d(2048, 512, 3, padding=1, bias=False),
            nn.BatchNorm2d(512),
            nn.ReLU(),
            nn.Dropout(0.1),
            nn.Conv2d(512, num_classes, 1),
        )

    def forward(self, x):
        size = x.shape[-2:]
        y = self.classifier(self.backbone.features(x))
        return F.interpolate(y, size=size, mode="bilinear", align_corners=False)


def fcn_resnet50() -> nn.Module:
    return FCN()


# -- R3D-18 (torchvision video.r3d_18) ------------------------------------------------------------


class BasicBlock3d(nn.Module):
    def __init__(self, inplanes, planes, stride=1, downsample=None):
        super().__init__()
        self.conv1 = nn.Sequential(
            nn.Conv3d(inplanes, planes, 3, stride, 1, bias=False), nn.BatchNorm3d(planes), nn.ReLU(inplace=True)
        )
        self.conv2 = nn.Sequential(nn.Conv3d(planes, planes, 3, 1, 1, bias=False), nn.BatchNorm3d(planes))
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        return self.relu(self.conv2(self.conv1(x)) + identity)


class VideoResNet(nn.Module):
    def __init__(self, layers=(2, 2, 2, 2), num_classes=400):
        super().__init__()
        self.inplanes = 64
        self.stem = nn.Sequential(
            nn.Conv3d(3, 64, (3, 7, 7), (1, 2, 2), (1, 3, 3), bias=False), nn.BatchNorm3d(64), nn.ReLU(inplace=True)
        )
        self.layer1 = self._make_layer(64, layers[0], 1)
        self.layer2 = self._make_layer(128, layers[1], 2)
        self.layer3 = self._make_layer(256, layers[2], 2)
        self.layer4 = self._make_layer(512, layers[3], 2)
        self.avgpool = nn.AdaptiveAvgPool3d((1, 1, 1))
        self.fc = nn.Linear(512, num_classes)

    def _make_layer(self, planes, blocks, stride):
        downsample = None
        if stride != 1 or self.inplanes != planes:
            downsample = nn.Sequential(nn.Conv3d(self.inplanes, planes, 1, stride, bias=False), nn.BatchNorm3d(planes))
        layers = [BasicBlock3d(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes
        layers += [BasicBlock3d(planes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x):
        x = self.layer4(self.layer3(self.layer2(self.layer1(self.stem(x)))))
        return self.fc(self.avgpool(x).flatten(1))


def r3d_18() -> nn.Module:
    return VideoResNet()


# -- shared: Conv2dNormActivation and squeeze-excitation (torchvision.ops) --------------------------


def _cna(cin, cout, k=3, stride=1, groups=1, act: type | None = nn.SiLU, eps=1e-5, momentum=0.1) -> nn.Sequential:
    layers = [
        nn.Conv2d(cin, cout, k, stride, (k - 1) // 2, groups=groups, bias=False),
        nn.BatchNorm2d(cout, eps=eps, momentum=momentum),
    ]
    if act is not None:
        layers.append(act(inplace=True) if act in (nn.ReLU, nn.SiLU, nn.Hardswish) else act())
    return nn.Sequential(*layers)


class SqueezeExcitation(nn.Module):
    def __init__(self, channels, squeeze, activation=nn.ReLU, scale_activation=nn.Sigmoid):
        super().__init__()
        self.fc1 = nn.Conv2d(channels, squeeze, 1)
        self.fc2 = nn.Conv2d(squeeze, channels, 1)
        self.activation = activation()
        self.scale_activation = scale_activation()

    def forward(self, x):
        s = F.adaptive_avg_pool2d(x, 1)
        return x * self.scale_activation(self.fc2(self.activation(self.fc1(s))))


# -- EfficientNetV2-S (torchvision efficientnet_v2_s) ----------------------------------------------

#: (block, expand_ratio, kernel, stride, in, out, layers): torchvision's _efficientnet_conf("efficientnet_v2_s")
EFFNET_V2_S = (
    ("fused", 1, 3, 1, 24, 24, 2),
    ("fused", 4, 3, 2, 24, 48, 4),
    ("fused", 4, 3, 2, 48, 64, 4),
    ("mb", 4, 3, 2, 64, 128, 6),
    ("mb", 6, 3, 1, 128, 160, 9),
    ("mb", 6, 3, 2, 160, 256, 15),
)
_EFF_EPS = 1e-3


class FusedMBConv(nn.Module):
    def __init__(self, expand, k, stride, cin, cout):
        super().__init__()
        self.use_res = stride == 1 and cin == cout
        mid = cin * expand
        if mid != cin:
            layers = [_cna(cin, mid, k, stride, eps=_EFF_EPS), _cna(mid, cout, 1, act=None, eps=_EFF_EPS)]
        else:
            layers = [_cna(cin, cout, k, stride, eps=_EFF_EPS)]
        self.block = nn.Sequential(*layers)

    def forward(self, x):
        y = self.block(x)
        return y + x if self.use_res else y  # stochastic depth is the identity in eval


class MBConv(nn.Module):
    def __init__(self, expand, k, stride, cin, cout, se_divisor=4, act=nn.SiLU, scale_act=nn.Sigmoid):
        super().__init__()
        self.use_res = stride == 1 and cin == cout
        mid = cin * expand
        layers = []
        if mid != cin:
            layers.append(_cna(cin, mid, 1, eps=_EFF_EPS, act=act))
        layers.append(_cna(mid, mid, k, stride, groups=mid, eps=_EFF_EPS, act=act))
        layers.append(SqueezeExcitation(mid, max(1, cin // se_divisor), activation=nn.SiLU, scale_activation=scale_act))
        layers.append(_cna(mid, cout, 1, act=None, eps=_EFF_EPS))
        self.block = nn.Sequential(*layers)

    def forward(self, x):
        y = self.block(x)
        return y + x if self.use_res else y


class EfficientNetV2(nn.Module):
    def __init__(self, table=EFFNET_V2_S, last=1280, num_classes=1000):
        super().__init__()
        layers = [_cna(3, table[0][4], 3, 2, eps=_EFF_EPS)]
        for kind, e, k, s, cin, cout, n in table:
            cls = FusedMBConv if kind == "fused" else MBConv
            layers.append(
                nn.Sequential(*(cls(e, k, s if i == 0 else 1, cin if i == 0 else cout, cout) for i in range(n)))
            )
        layers.append(_cna(table[-1][5], last, 1, eps=_EFF_EPS))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(last, num_classes))

    def forward(self, x):
        return self.classifier(torch.flatten(F.adaptive_avg_pool2d(self.features(x), 1), 1))


def efficientnet_v2_s() -> nn.Module:
    return EfficientNetV2()


# -- MobileNetV3-Large (torchvision mobilenet_v3_large) ----------------------------------------------


def _make_divisible(v: float, divisor: int = 8) -> int:
    new_v = max(divisor, int(v + divisor / 2) // divisor * divisor)
    return new_v + divisor if new_v < 0.9 * v else new_v


#: (in, kernel, expanded, out, use_se, activation, stride): torchvision _mobilenet_v3_conf("mobilenet_v3_large")
MOBILENET_V3_LARGE = (
    (16, 3, 16, 16, False, "RE", 1),
    (16, 3, 64, 24, False, "RE", 2),
    (24, 3, 72, 24, False, "RE", 1),
    (24, 5, 72, 40, True, "RE", 2),
    (40, 5, 120, 40, True, "RE", 1),
    (40, 5, 120, 40, True, "RE", 1),
    (40, 3, 240, 80, False, "HS", 2),
    (80, 3, 200, 80, False, "HS", 1),
    (80, 3, 184, 80, False, "HS", 1),
    (80, 3, 184, 80, False, "HS", 1),
    (80, 3, 480, 112, True, "HS", 1),
    (112, 3, 672, 112, True, "HS", 1),
    (112, 5, 672, 160, True, "HS", 2),
    (160, 5, 960, 160, True, "HS", 1),
    (160, 5, 960, 160, True, "HS", 1),
)
_MB_BN = {"eps": 1e-3, "momentum": 0.01}


class InvertedResidual(nn.Module):
    def __init__(self, cin, k, exp, cout, use_se, act, stride):
        super().__init__()
        self.use_res = stride == 1 and cin == cout
        act = nn.Hardswish if act == "HS" else nn.ReLU
        layers = []
        if exp != cin:
            layers.append(_cna(cin, exp, 1, act=act, **_MB_BN))
        layers.append(_cna(exp, exp, k, stride, groups=exp, act=act, **_MB_BN))
        if use_se:
            layers.append(SqueezeExcitation(exp, _make_divisible(exp // 4, 8), scale_activation=nn.Hardsigmoid))
        layers.append(_cna(exp, cout, 1, act=None, **_MB_BN))
        self.block = nn.Sequential(*layers)

    def forward(self, x):
        y = self.block(x)
        return y + x if self.use_res else y


class MobileNetV3(nn.Module):
    def __init__(self, table=MOBILENET_V3_LARGE, last_channel=1280, num_classes=1000):
        super().__init__()
        layers = [_cna(3, table[0][0], 3, 2, act=nn.Hardswish, **_MB_BN)]
        layers += [InvertedResidual(*row) for row in table]
        layers.append(_cna(table[-1][3], 6 * table[-1][3], 1, act=nn.Hardswish, **_MB_BN))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(
            nn.Linear(6 * table[-1][3], last_channel),
            nn.Hardswish(inplace=True),
            nn.Dropout(0.2),
            nn.Linear(last_channel, num_classes),
        )

    def forward(self, x):
        return self.classifier(torch.flatten(F.adaptive_avg_pool2d(self.features(x), 1), 1))


def mobilenet_v3_large() -> nn.Module:
    return MobileNetV3()


# -- LeViT-128S (timm levit_128s) -------------------------------------------------------------------


class ConvNorm(nn.Sequential):
    def __init__(self, cin, cout, k=3, stride=2, padding=1):
        super().__init__(nn.Conv2d(cin, cout, k, stride, padding, bias=False), nn.BatchNorm2d(cout))


class LinearNorm(nn.Module):
    """timm's LinearNorm: Linear (no bias) -> BatchNorm1d over the flattened (batch * tokens) axis."""

    def __init__(self, cin, cout):
        super().__init__()
        self.linear = nn.Linear(cin, cout, bias=False)
        self.bn = nn.BatchNorm1d(cout)

    def forward(self, x):
        x = self.linear(x)
        return self.bn(x.flatten(0, 1)).reshape_as(x)


class NormLinear(nn.Module):
    """timm's NormLinear head: BatchNorm1d -> (dropout) -> Linear."""

    def __init__(self, cin, cout):
        super().__init__()
        self.bn = nn.BatchNorm1d(cin)
        self.linear = nn.Linear(cin, cout)

    def forward(self, x):
        return self.linear(self.bn(x))


def _bias_idxs(resolution: int, q_resolution: int | None = None, stride: int = 1) -> torch.Tensor:
    q_res = q_resolution or resolution
    k_pos = torch.stack(torch.meshgrid(torch.arange(resolution), torch.arange(resolution), indexing="ij")).flatten(1)
    q_pos = torch.stack(
        torch.meshgrid(
            torch.arange(0, resolution, stride)[:q_res], torch.arange(0, resolution, stride)[:q_res], indexing="ij"
        )
    ).flatten(1)
    rel = (q_pos[..., :, None] - k_pos[..., None, :]).abs()
    return rel[0] * resolution + rel[1]


class Attention(nn.Module):
    def __init__(self, dim, key_dim, num_heads, attn_ratio, resolution):
        super().__init__()
        self.num_heads, self.key_dim, self.scale = num_heads, key_dim, key_dim**-0.5
        self.val_dim = int(attn_ratio * key_dim)
        self.val_attn_dim = self.val_dim * num_heads
        self.qkv = LinearNorm(dim, self.val_attn_dim + key_dim * num_heads * 2)
        self.proj = nn.Sequential(nn.Hardswish(), LinearNorm(self.val_attn_dim, dim))
        self.attention_biases = nn.Parameter(torch.zeros(num_heads, resolution**2))
        self.register_buffer("attention_bias_idxs", _bias_idxs(resolution), persistent=False)

    def forward(self, x):
        b, n, _ = x.shape
        q, k, v = self.qkv(x).view(b, n, self.num_heads, -1).split([self.key_dim, self.key_dim, self.val_dim], dim=3)
        q, k, v = q.permute(0, 2, 1, 3), k.permute(0, 2, 3, 1), v.permute(0, 2, 1, 3)
        attn = (q @ k * self.scale + self.attention_biases[:, self.attention_bias_idxs]).softmax(dim=-1)
        return self.proj((attn @ v).transpose(1, 2).reshape(b, n, self.val_attn_dim))


class AttentionDownsample(nn.Module):
    def __init__(self, in_dim, out_dim, key_dim, num_heads, attn_ratio, resolution, stride=2):
        super().__init__()
        self.stride, self.resolution = stride, resolution
        self.num_heads, self.key_dim, self.scale = num_heads, key_dim, key_dim**-0.5
        self.val_dim = int(attn_ratio * key_dim)
        self.val_attn_dim = self.val_dim * num_heads
        self.resolution_out = (resolution - 1) // stride + 1
        self.kv = LinearNorm(in_dim, self.val_attn_dim + key_dim * num_heads)
        self.q = LinearNorm(in_dim, key_dim * num_heads)
        self.proj = nn.Sequential(nn.Hardswish(), LinearNorm(self.val_attn_dim, out_dim))
        self.attention_biases = nn.Parameter(torch.zeros(num_heads, resolution**2))
        self.register_buffer(
            "attention_bias_idxs", _bias_idxs(resolution, self.resolution_out, stride), persistent=False
        )

    def forward(self, x):
        b, n, c = x.shape
        k, v = self.kv(x).view(b, n, self.num_heads, -1).split([self.key_dim, self.val_dim], dim=3)
        k, v = k.permute(0, 2, 3, 1), v.permute(0, 2, 1, 3)
        xs = x.view(b, self.resolution, self.resolution, c)[:, :: self.stride, :: self.stride].reshape(b, -1, c)
        q = self.q(xs).view(b, -1, self.num_heads, self.key_dim).permute(0, 2, 1, 3)
        attn = (q @ k * self.scale + self.attention_biases[:, self.attention_bias_idxs]).softmax(dim=-1)
        return self.proj((attn @ v).transpose(1, 2).reshape(b, -1, self.val_attn_dim))


class LevitMlp(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.ln1, self.act, self.ln2 = LinearNorm(dim, hidden), nn.Hardswish(), LinearNorm(hidden, dim)

    def forward(self, x):
        return self.ln2(self.act(self.ln1(x)))


class Residual(nn.Module):
    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, x):
        return x + self.m(x)


class LeViT(nn.Module):
    """timm LeViT (levit_128s config: embed 128/256/384, heads 4/6/8, depth 2/3/4, key_dim 16)."""

    def __init__(
        self,
        img_size=224,
        embed_dim=(128, 256, 384),
        key_dim=16,
        num_heads=(4, 6, 8),
        depth=(2, 3, 4),
        attn_ratio=2.0,
        mlp_ratio=2.0,
        num_classes=1000,
    ):
        super().__init__()
        e0 = embed_dim[0]
        self.stem = nn.Sequential(
            ConvNorm(3, e0 // 8),
            nn.Hardswish(),
            ConvNorm(e0 // 8, e0 // 4),
            nn.Hardswish(),
            ConvNorm(e0 // 4, e0 // 2),
            nn.Hardswish(),
            ConvNorm(e0 // 2, e0),
        )
        res = img_size // 16
        blocks = []
        for i, (dim, heads, d) in enumerate(zip(embed_dim, num_heads, depth)):
            if i > 0:  # LevitDownsample: attention downsample (heads = in_dim // key_dim, attn_ratio 4) + residual MLP
                prev = embed_dim[i - 1]
                blocks.append(AttentionDownsample(prev, dim, key_dim, prev // key_dim, 4.0, res))
                res = (res - 1) // 2 + 1
                blocks.append(Residual(LevitMlp(dim, int(dim * mlp_ratio))))
            for _ in range(d):
                blocks.append(Residual(Attention(dim, key_dim, heads, attn_ratio, res)))
                blocks.append(Residual(LevitMlp(dim, int(dim * mlp_ratio))))
        self.blocks = nn.Sequential(*blocks)
        self.head = NormLinear(embed_dim[-1], num_classes)
        self.head_dist = NormLinear(embed_dim[-1], num_classes)

    def forward(self, x):
        x = self.stem(x).flatten(2).transpose(1, 2)
        x = self.blocks(x).mean(1)
        return (self.head(x) + self.head_dist(x)) / 2  # eval: average of the class and distillation heads


def levit_128s() -> nn.Module:
    return LeViT()


# -- registry, calibration -----------------------------------------------------------------------------

#: name -> (constructor, export input shape, description)
REAL_MODELS = {
    "resnet18": (resnet18, (1, 3, 224, 224), "torchvision resnet18: BasicBlock [2,2,2,2], 1000 classes"),
    "resnet50": (resnet50, (1, 3, 224, 224), "torchvision resnet50 (v1.5): Bottleneck [3,4,6,3], 1000 classes"),
    "r3d_18": (
        r3d_18,
        (1, 3, 8, 112, 112),
        "torchvision video r3d_18: Conv3d 3x3x3 BasicBlock [2,2,2,2], BatchNorm3d, 400 classes",
    ),
    "efficientnet_v2_s": (
        efficientnet_v2_s,
        (1, 3, 224, 224),
        "torchvision efficientnet_v2_s: 3 FusedMBConv + 3 "
        "MBConv(SE) stages, widths 24..256, repeats 2/4/4/6/9/15, SiLU, head 1280",
    ),
    "mobilenet_v3_large": (
        mobilenet_v3_large,
        (1, 3, 224, 224),
        "torchvision mobilenet_v3_large: 15 inverted "
        "residuals, hardswish, SE with hardsigmoid, 960-1280-1000 classifier",
    ),
    "fcn_resnet50": (
        fcn_resnet50,
        (1, 3, 224, 224),
        "torchvision fcn_resnet50 (no aux head): dilated ResNet-50 "
        "(output stride 8) + FCNHead 3x3 conv-BN-ReLU + 1x1 conv, 21 classes, bilinear upsample",
    ),
    "levit_128s": (
        levit_128s,
        (1, 3, 224, 224),
        "timm levit_128s: conv stem, 3 attention stages 128/256/384 "
        "(depth 2/3/4), LinearNorm (Linear -> flatten(0,1) -> BatchNorm1d -> reshape_as), "
        "NormLinear heads",
    ),
}
#: calibration shapes (batch taken from calibrate's batch_size); LeViT's attention biases fix its token grid
CALIB_SHAPES = {"r3d_18": (1, 3, 4, 32, 32), "levit_128s": (1, 3, 224, 224)}
DEFAULT_CALIB_SHAPE = (1, 3, 64, 64)


def smooth_inputs(shape: tuple, batches: int, seed: int = 0) -> list[torch.Tensor]:
    """Smooth low-frequency fields + noise, per-sample gain, positive per-channel offsets (un-normalized-image-like);
    any number of spatial dimensions (1-3)."""
    g = torch.Generator().manual_seed(seed)
    n, c, *spatial = shape
    mode = {1: "linear", 2: "bilinear", 3: "trilinear"}[len(spatial)]
    out = []
    for _ in range(batches):
        base = torch.randn(n, c, *(max(2, s // 8) for s in spatial), generator=g)
        smooth = F.interpolate(base, size=tuple(spatial), mode=mode, align_corners=False)
        noise = 0.3 * torch.randn(n, c, *spatial, generator=g)
        gain = torch.empty(n, *([1] * (len(shape) - 1))).uniform_(0.5, 2.0, generator=g)
        offset = torch.tensor([0.5, 0.4, 0.3][:c] + [0.4] * max(0, c - 3)).view(1, c, *([1] * len(spatial)))
        out.append(offset + 0.25 * gain * (smooth + noise))
    return out


@torch.no_grad()
def calibrate(model: nn.Module, shape: tuple, batches: int = 3, batch_size: int = 8, seed: int = 0) -> nn.Module:
    """Random gamma ~ U(0.5, 1.5), beta ~ U(-0.3, 0.3), then cumulative running statistics over ``batches``
    train-mode passes (momentum None) on smooth random inputs; returns the model in eval (as ``models.calibrate``)."""
    torch.manual_seed(seed)
    norms = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    momenta = [m.momentum for m in norms]
    for m in norms:
        m.weight.uniform_(0.5, 1.5)
        m.bias.uniform_(-0.3, 0.3)
        m.reset_running_stats()
        m.momentum = None
    model.train()
    for x in smooth_inputs((batch_size, *shape[1:]), batches, seed):
        model(x)
    for m, mom in zip(norms, momenta):
        m.momentum = mom
    return model.eval()


def build(name: str, calib_batches: int = 3, calib_batch_size: int = 8, seed: int = 0) -> dict:
    """The calibrated eval model, an example input of the export shape, and a few counts."""
    ctor, shape, desc = REAL_MODELS[name]
    torch.manual_seed(seed)
    model = ctor()
    calib_shape = CALIB_SHAPES.get(name, DEFAULT_CALIB_SHAPE)
    calibrate(model, calib_shape, calib_batches, calib_batch_size, seed)
    example = (smooth_inputs(shape, 1, seed + 1000)[0],)
    return {
        "model": model,
        "example": example,
        "shape": shape,
        "calib_shape": calib_shape,
        "description": desc,
        "batchnorms": sum(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules()),
        "parameters": sum(p.numel() for p in model.parameters()),
    }


if __name__ == "__main__":  # parameter / BatchNorm counts (torchvision: r18 11.69M, r50 25.56M, r3d 33.37M,
    for name in REAL_MODELS:  # effv2s 21.46M, mnv3l 5.48M, fcn_r50 32.96M (no aux); timm levit_128s 7.78M)
        ctor, shape, _ = REAL_MODELS[name]
        m = ctor()
        print(
            f"{name:<20} {sum(p.numel() for p in m.parameters()) / 1e6:7.2f}M params, "
            f"{sum(isinstance(x, nn.modules.batchnorm._BatchNorm) for x in m.modules())} BatchNorms"
        )
