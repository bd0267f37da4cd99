"""The audit of a re-parameterized model (issue 21): the conv a merge kept measures the whole sum
of its branches against the unfolded sum; the branch layers the merge removed have no folded twin."""

from __future__ import annotations

import math

import torch
from torch import nn

from bnfold.numerics import audit


class _Rep(nn.Module):
    """A RepVGG block: 3x3 conv + BN, 1x1 conv + BN and an identity BN, summed."""

    def __init__(self, c: int = 8):
        super().__init__()
        self.k3 = nn.Sequential(nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c))
        self.k1 = nn.Sequential(nn.Conv2d(c, c, 1, bias=False), nn.BatchNorm2d(c))
        self.id = nn.BatchNorm2d(c)

    def forward(self, x):
        return torch.relu(self.k3(x) + self.k1(x) + self.id(x))


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.blocks = nn.Sequential(_Rep(), _Rep())
        self.head = nn.Linear(8, 4)

    def forward(self, x):
        return self.head(self.blocks(self.stem(x)).mean((2, 3)))


def test_merged_sum_rows_pair_the_sum_and_removed_branches_have_no_twin():
    torch.manual_seed(0)
    model = _Net().train()
    with torch.no_grad():
        for _ in range(3):  # calibrate the batch-norm statistics
            model(torch.randn(8, 3, 16, 16))
    x = torch.randn(2, 3, 16, 16)
    ep = torch.export.export(model.eval(), (x,))
    rep = audit(ep, [(x,), (torch.randn(2, 3, 16, 16),)])
    assert len(rep.fold_report.merged) == 2
    rows = {r.title: r for r in rep.layers}
    for b in ("blocks.0", "blocks.1"):
        merged = rows[f"{b}.k3.0 (merged sum)"]
        assert merged.folded is not None and math.isfinite(merged.folded.sqnr_db)
        # the same tensor on both sides: the fp16 errors of the unfolded and the merged sum are alike
        assert abs(merged.folded.sqnr_db - merged.unfolded.sqnr_db) < 10, (merged.unfolded, merged.folded)
        assert rows[f"{b}.k1.0"].folded is None  # merged away
    assert rows["head"].folded is not None and math.isfinite(rows["head"].folded.sqnr_db)
