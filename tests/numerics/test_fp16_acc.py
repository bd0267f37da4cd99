"""The ``fp16-acc`` profile sums reductions, pools and matmuls in fp16, as GPU delegates do (LiteRT GPU, ORT WebGPU).
The field case (LiteRT #9249): EfficientNet on a GPU delegate, 1000 of 1000 outputs NaN, from a squeeze-excitation
mean whose sum over the map passes 65504 while the mean itself is small.  Here an SE block over a 56x56 map of
activations near 30 (sum ~9.4e4): finite under ``fp16``, all NaN/inf under ``fp16-acc``, the mean named as the cause."""

import warnings

import pytest
import torch
from torch import nn

import bnfold
from bnfold.numerics import accumulate
from bnfold.numerics.fx_program import fx_program
from bnfold.numerics.onnx_program import onnx_program

onnx = pytest.importorskip("onnx")


class SqueezeExcite(nn.Module):
    def __init__(self, c: int = 8, pool: bool = False):
        super().__init__()
        self.conv = nn.Conv2d(3, c, 1)
        self.pool = nn.AdaptiveAvgPool2d(1) if pool else None
        self.reduce, self.expand, self.head = nn.Conv2d(c, 4, 1), nn.Conv2d(4, c, 1), nn.Linear(c, 10)
        with torch.no_grad():
            self.conv.weight.mul_(0.1)
            self.conv.bias.fill_(30.0)

    def forward(self, x):
        f = self.conv(x).relu()
        m = self.pool(f) if self.pool is not None else f.mean((2, 3), keepdim=True)
        s = self.expand(self.reduce(m).relu()).sigmoid()
        return self.head((f * s).amax((2, 3)))


def _onnx(net, x):
    import io

    f = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(net, x, f, dynamo=False, opset_version=14, input_names=["x"])
    return onnx.load_from_string(f.getvalue())


@pytest.mark.parametrize("pool", [False, True])
@pytest.mark.parametrize("fmt", ["pt2", "onnx"])
def test_an_se_mean_overflows_only_when_the_runtime_sums_in_fp16(fmt, pool):
    torch.manual_seed(0)
    net = SqueezeExcite(pool=pool).eval()
    g = torch.Generator().manual_seed(1)
    xs = [(torch.randn(2, 3, 56, 56, generator=g),) for _ in range(2)]
    model = torch.export.export(net, xs[0]) if fmt == "pt2" else _onnx(net, xs[0][0])
    plain = bnfold.audit(model, xs, profile="fp16")
    assert plain.deploy and not plain.unfolded.output.nonfinite
    acc = bnfold.audit(model, xs, profile="fp16-acc")
    assert not acc.deploy and acc.shipped.output.nonfinite_share == 1.0
    cause = acc.to_dict()["cause"]
    ops = {"pt2": ("mean", "adaptive_avg_pool2d"), "onnx": ("ReduceMean", "GlobalAveragePool")}[fmt]
    assert cause["kind"] == "non-finite" and cause["op"] in ops
    assert "from finite inputs within range" in acc.advice()[0]


def test_fp16_acc_covers_reductions_pools_and_matmuls():
    """Every conv, linear, average pool, mean, sum and matmul (of weights or of two activations) has an
    fp16-accumulated form, in both executors."""
    net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.AvgPool2d(2), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 2))

    class Scores(nn.Module):
        def forward(self, q):
            return (q @ q.transpose(-2, -1)).sum(-1)

    cases = (
        (net.eval(), torch.randn(1, 3, 8, 8), {"conv2d", "avg_pool2d", "adaptive_avg_pool2d", "linear"}),
        (net.eval(), torch.randn(1, 3, 8, 8), {"Conv", "AveragePool", "GlobalAveragePool", "Gemm"}),
        (Scores(), torch.randn(2, 4, 8), {"matmul", "sum"}),
        (Scores(), torch.randn(2, 4, 8), {"MatMul", "ReduceSum"}),
    )
    for model, x, want in cases:
        onnx_ops = next(iter(want))[0].isupper()
        prog = onnx_program(_onnx(model, x)) if onnx_ops else fx_program(torch.export.export(model, (x,)))
        assert {s.op for s in prog.steps if s.accumulated is not None} == want
    # a mean of small values whose fp16 partial sums pass 65504: inf
    assert accumulate.reduction(torch.full((1, 4096), 20.0), [1], False, True, 16).isinf().all()
    assert torch.equal(accumulate.reduction(torch.ones(2, 3, 5), [1, 2], True, False, 4), torch.full((2, 1, 1), 15.0))
