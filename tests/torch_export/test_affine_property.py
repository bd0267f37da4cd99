"""Property: random affine chains (length 1-4, mul/div/add/sub, per-channel or scalar) after
random conv configurations fold exactly, or are left with a reason."""

import torch
import torch.nn as nn
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import bnfold
from bnfold_testutil import assert_matches, export, record_count, record_max, reference, run


class Chain(nn.Module):
    def __init__(self, conv, ops, consts):
        super().__init__()
        self.conv, self.ops = conv, ops
        for i, c in enumerate(consts):
            if isinstance(c, torch.Tensor):
                self.register_buffer(f"k{i}", c)
        self.scalars = {i: c for i, c in enumerate(consts) if not isinstance(c, torch.Tensor)}

    def forward(self, x):
        y = self.conv(x)
        for i, op in enumerate(self.ops):
            k = self.scalars.get(i, getattr(self, f"k{i}", None))
            y = {
                "mul": lambda: y * k,
                "div": lambda: y / k,
                "add": lambda: y + k,
                "sub": lambda: y - k,
                "rsub": lambda: k - y,
            }[op]()
        return y


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    dims=st.integers(1, 2),
    groups=st.integers(1, 2),
    per_group=st.integers(1, 3),
    k=st.integers(1, 3),
    transposed=st.booleans(),
    bias=st.booleans(),
    ops=st.lists(st.sampled_from(["mul", "div", "add", "sub", "rsub"]), min_size=1, max_size=4),
    per_channel=st.lists(st.booleans(), min_size=4, max_size=4),
    seed=st.integers(0, 999),
)
def test_random_affine_chain_after_conv(dims, groups, per_group, k, transposed, bias, ops, per_channel, seed):
    g = torch.Generator().manual_seed(seed)
    cin, cout = groups * 2, groups * per_group
    cls = {(1, False): nn.Conv1d, (2, False): nn.Conv2d, (1, True): nn.ConvTranspose1d, (2, True): nn.ConvTranspose2d}
    conv = cls[(dims, transposed)](cin, cout, k, groups=groups, bias=bias)
    consts = []
    for i, op in enumerate(ops):
        value = torch.rand(cout, generator=g) + 0.5  # away from zero, so div is well defined
        value = value * torch.where(torch.rand(cout, generator=g) > 0.5, 1.0, -1.0)
        consts.append(value.reshape(cout, *([1] * dims)) if per_channel[i] else float(value[0]))
    model = Chain(conv, ops, consts).eval()
    x = torch.randn(2, cin, *([5] * dims), generator=g)
    result = bnfold.fold(export(model, (x,)))
    assert len(result.report.folded) == 1, result.report
    assert not any(
        str(n.target).split(".")[-2] in ("mul", "div", "add", "sub", "rsub")
        for n in result.model.graph.nodes
        if n.op == "call_function"
    )
    err = assert_matches(run(result.model, x), reference(model, x))
    record_max("affine chains: largest error / output magnitude", err)
    record_count("affine chains: examples folded and compared")
