"""The hand-made baseline for normalization affines (``tests/affine_baseline.py``) on small hand-built modules: one
per rule of its docstring, each with the count a hand reaches."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from affine_baseline import hand_foldable_affines, is_affine_norm


class LayerNorm2d(nn.LayerNorm):
    """LayerNorm over the channels of an NCHW tensor, as timm and torchvision write it (permute, norm, permute)."""

    def forward(self, x):
        return super().forward(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class GroupNormRelu(nn.GroupNorm):
    """A normalization with an activation after its affine (timm's ``GroupNormAct``)."""

    def forward(self, x):
        return torch.relu(super().forward(x))


class Stem(nn.Module):
    """ConvNeXt's stem and first block: the stem norm feeds a padded depthwise conv and the residual sum; the block's
    norm feeds a Linear (channels last)."""

    def __init__(self, bias=True):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 2, stride=2)
        self.norm = LayerNorm2d(8, bias=bias)
        self.dw = nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.block_norm = nn.LayerNorm(8)
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        x = self.norm(self.conv(x))
        y = self.fc(self.block_norm(self.dw(x).permute(0, 2, 3, 1))).permute(0, 3, 1, 2)
        return x + y


class Head(nn.Module):
    """A norm read through views by a Linear: flatten and eval-mode dropout."""

    def __init__(self):
        super().__init__()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.norm = LayerNorm2d(3)
        self.drop = nn.Dropout(0.5)
        self.fc = nn.Linear(3, 4)

    def forward(self, x):
        return self.fc(self.drop(self.norm(self.pool(x)).flatten(1)))


class TokenMixer(nn.Module):
    """A GroupNorm whose output a Linear reads along the spatial axis: its affine is per row, not per feature."""

    def __init__(self):
        super().__init__()
        self.norm = nn.GroupNorm(1, 3)
        self.fc = nn.Linear(64, 64)

    def forward(self, x):
        return self.fc(self.norm(x).flatten(2))


class Into(nn.Module):
    """``norm`` then ``between`` then ``layer``."""

    def __init__(self, norm, layer, between=None):
        super().__init__()
        self.norm, self.layer, self.between = norm, layer, between

    def forward(self, x):
        y = self.norm(x)
        return self.layer(self.between(y) if self.between else y)


class Attention(nn.Module):
    """A pre-norm self-attention block (torchvision's ViT): the norm feeds the attention's input projection."""

    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(3)
        self.attn = nn.MultiheadAttention(3, 1, batch_first=True)

    def forward(self, x):
        x = x.flatten(2).transpose(1, 2)
        y = self.norm(x)
        return x + self.attn(y, y, y, need_weights=False)[0]


CASES = {
    "padded conv and residual: kept; Linear: folded": (Stem(), (2, 1)),
    "no shift, padded conv: folded": (Stem(bias=False), (2, 2)),
    "flatten and eval dropout into a Linear: folded": (Head(), (1, 1)),
    "affine per row of the Linear: kept": (TokenMixer(), (1, 0)),
    "activation after the affine: kept": (Into(GroupNormRelu(1, 3), nn.Conv2d(3, 4, 1)), (1, 0)),
    "changed in place before the conv: kept": (Into(nn.GroupNorm(1, 3), nn.Conv2d(3, 4, 1), nn.ReLU(True)), (1, 0)),
    "reflect padding: folded": (Into(nn.GroupNorm(1, 3), nn.Conv2d(3, 4, 3, 1, 1, padding_mode="reflect")), (1, 1)),
    "padding 'same', 1-wide kernel: folded": (Into(nn.GroupNorm(1, 3), nn.Conv2d(3, 4, 1, padding="same")), (1, 1)),
    "padding 'same', 3-wide kernel: kept": (Into(nn.GroupNorm(1, 3), nn.Conv2d(3, 4, 3, padding="same")), (1, 0)),
    "transposed conv 2x2 stride 2: kept": (Into(nn.GroupNorm(1, 3), nn.ConvTranspose2d(3, 4, 2, stride=2)), (1, 0)),
    "transposed conv 1x1: folded": (Into(nn.GroupNorm(1, 3), nn.ConvTranspose2d(3, 4, 1)), (1, 1)),
    "self-attention: folded": (Attention(), (1, 1)),
    "read by no layer: kept": (Into(nn.GroupNorm(1, 3), nn.AvgPool2d(3, 1, 1)), (1, 0)),
}


@pytest.mark.parametrize("case", CASES)
def test_a_hand_folds_an_affine_only_into_layers_that_take_it_exactly(case):
    model, expected = CASES[case]
    torch.manual_seed(0)
    with torch.no_grad():
        for m in model.modules():
            if is_affine_norm(m):
                m.weight.uniform_(0.5, 1.5)
                if m.bias is not None:
                    m.bias.uniform_(-0.3, 0.3)
    x = torch.randn(2, 3, 8, 8)
    assert hand_foldable_affines(model.eval(), x) == expected


def test_affine_norms_are_told_from_batchnorms_and_norms_without_an_affine():
    found = [is_affine_norm(m) for m in (nn.LayerNorm(4), nn.GroupNorm(2, 4), LayerNorm2d(4, bias=False))]
    assert found == [True, True, True]
    absent = (nn.BatchNorm2d(4), nn.LayerNorm(4, elementwise_affine=False), nn.InstanceNorm2d(4), nn.Conv2d(4, 4, 1))
    assert not any(is_affine_norm(m) for m in absent)
