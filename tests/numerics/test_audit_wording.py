"""The audit's closing lines as a newcomer reads them: the verdict deploys "the model as is" when nothing was folded,
and an ``overflows`` verdict comes with a line saying what overflows (a predicted overflow beside 0 NaN/inf in
the run read as a contradiction)."""

import torch
from torch import nn

import bnfold


def _program(net):
    return torch.export.export(net.eval(), (torch.randn(1, 3, 8, 8),))


def test_nothing_folded_is_no_advice_to_deploy_the_folded_model():
    torch.manual_seed(0)
    rep = bnfold.audit(_program(nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU())), local=False)
    assert not any("the folded model" in line for line in rep.advice())
    assert rep.advice()[0].startswith("verdict: deploy the model as is under fp16:")
    torch.manual_seed(0)
    folded = bnfold.audit(_program(nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU())), local=False)
    assert folded.advice()[0].startswith("verdict: deploy the folded model under fp16:")


def test_an_overflow_verdict_says_what_overflows():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU())
    with torch.no_grad():  # statistics whose mean + spread put the norm's input past fp16's 65504
        net[1].running_var[0], net[1].running_mean[0] = 1e8, 3e4
    rep = bnfold.audit(_program(net), profile="htp", local=False)
    [norm] = rep.norms
    assert norm.verdict == "overflows" and rep.unfolded.output.nonfinite == 0
    [line] = [a for a in rep.advice() if a.startswith("what overflows in 1:")]
    assert "its input reaches" in line and "65504" in line and "predicted from its statistics" in line
    assert "stay within fp16's range" in line  # random inputs do not reach what the statistics describe
