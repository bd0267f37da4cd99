"""Beyond the direct pair: affine chains, shape-only hops, normalization before the layer,
BatchNorm variants and chains that fold to a fixed point."""

import pytest
import torch
import torch.nn as nn

import bnfold
from bnfold.report import Code
from bnfold_testutil import assert_matches, export, norm_nodes, randomize_bn, reference, run

IRS = ["default", "decomposed"]


def _affine_nodes(ep):
    return [
        n
        for n in ep.graph.nodes
        if n.op == "call_function"
        and any(k in str(n.target) for k in ("aten.mul", "aten.add", "aten.sub", "aten.div", "aten.rsub"))
    ]


def _check(model, inputs, ir="default", folded=None, skipped=0, kept=0):
    ep = export(model, inputs, ir)
    result = bnfold.fold(ep)
    outs, refs = run(result.model, *inputs), reference(model, *inputs)
    for out, ref in zip(outs if isinstance(outs, tuple) else (outs,), refs if isinstance(refs, tuple) else (refs,)):
        assert_matches(out, ref)
    if folded is not None:
        assert len(result.report.folded) == folded, result.report
    assert len(result.report.skipped) == skipped, result.report
    assert len(result.report.kept_ops) == kept, result.report
    return ep, result


class FrozenBatchNorm2d(nn.Module):
    """torchvision-style frozen BN: buffers only, exported as x * scale + shift."""

    def __init__(self, c, seed=0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.register_buffer("weight", torch.rand(c, generator=g) * 4 - 2)
        self.register_buffer("bias", torch.rand(c, generator=g) * 2 - 1)
        self.register_buffer("running_mean", torch.rand(c, generator=g) - 0.5)
        self.register_buffer("running_var", torch.rand(c, generator=g) + 0.5)

    def forward(self, x):
        scale = self.weight * (self.running_var + 1e-5).rsqrt()
        shift = self.bias - self.running_mean * scale
        return x * scale.reshape(1, -1, 1, 1) + shift.reshape(1, -1, 1, 1)


# ---------------------------------------------------------------- 1. affine chains


@pytest.mark.parametrize("ir", IRS)
def test_frozen_batch_norm_after_conv(ir):
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.frozen = nn.Conv2d(3, 5, 3, bias=False), FrozenBatchNorm2d(5)

        def forward(self, x):
            return self.frozen(self.conv(x))

    ep, result = _check(M().eval(), (torch.randn(2, 3, 8, 8),), ir, folded=1)
    assert _affine_nodes(result.model) == [] and _affine_nodes(ep)
    assert set(result.model.state_dict) == {"conv.weight", "conv.bias"}  # the frozen buffers are gone
    assert result.report.folded[0].norm.startswith("frozen")


@pytest.mark.parametrize("ir", IRS)
def test_hand_written_affine_chain_after_transposed_conv(ir):
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.up = nn.ConvTranspose2d(4, 6, 3, groups=2, stride=2)
            self.register_buffer("s", torch.linspace(-2.5, 2.5, 6).reshape(6, 1, 1))
            self.register_buffer("t", torch.linspace(1, -1, 6).reshape(1, 6, 1, 1))

        def forward(self, x):
            return (0.5 - (self.up(x) / self.s) * 3.0 + self.t) - 2.0

    ep, result = _check(M().eval(), (torch.randn(2, 4, 5, 5),), ir, folded=1)
    assert _affine_nodes(result.model) == []


@pytest.mark.parametrize("ir", IRS)
def test_conv_then_bias_add_then_batch_norm(ir):
    class M(nn.Module):  # how several converters emit a conv bias
        def __init__(self):
            super().__init__()
            self.conv, self.bn = nn.Conv2d(3, 4, 3, bias=False), nn.BatchNorm2d(4)
            self.register_buffer("b", torch.randn(1, 4, 1, 1))

        def forward(self, x):
            return self.bn(self.conv(x) + self.b)

    ep, result = _check(randomize_bn(M()).eval(), (torch.randn(2, 3, 8, 8),), ir, folded=1)
    assert norm_nodes(result.model) == [] and _affine_nodes(result.model) == []
    assert result.report.folded[0].pattern.endswith("add+batch_norm")


def test_linear_affine_over_last_axis_of_rank3():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(6, 5)
            self.register_buffer("s", torch.randn(5))

        def forward(self, x):
            return self.fc(x) * self.s + 1.0

    _, result = _check(M().eval(), (torch.randn(2, 3, 6),), folded=1)
    assert _affine_nodes(result.model) == []


@pytest.mark.parametrize("shape", [(1, 1, 8, 1), (1, 1, 1, 8), (2, 4, 1, 1), (8,)])
def test_non_per_channel_constant_is_left(shape):
    class M(nn.Module):  # each constant varies along rows, columns or the batch, not only along channels
        def __init__(self):
            super().__init__()
            self.conv, self.bn = nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4)
            self.register_buffer("s", torch.rand(*shape) + 0.5)

        def forward(self, x):
            return self.bn(self.conv(x) * self.s)

    _, result = _check(randomize_bn(M()).eval(), (torch.randn(2, 3, 8, 8),), folded=0, skipped=1, kept=1)
    assert len(_affine_nodes(result.model)) == 1 and len(norm_nodes(result.model)) == 1
    # The multiply right after the conv is a kept-op note with its reason (not a skipped normalization).
    (mul,) = [k for k in result.report.kept_ops if k.node.startswith("mul")]
    assert mul.code == Code.NOT_PER_CHANNEL, mul


def test_multiplying_by_a_user_input_is_left():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.bn = nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)

        def forward(self, x, s):
            return self.bn(self.conv(x) * s)

    model = randomize_bn(M()).eval()
    _, result = _check(model, (torch.randn(2, 3, 8, 8), torch.randn(1, 4, 1, 1)), folded=0, skipped=1)
    assert result.report.skipped[0].code == Code.NO_LAYER


# ---------------------------------------------------------------- 2. shape-only hops


@pytest.mark.parametrize("ir", IRS)
def test_conv1d_written_as_conv2d_between_unsqueeze_and_squeeze(ir):
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.bn, self.drop = nn.Conv2d(3, 6, (1, 5), padding=(0, 2)), nn.BatchNorm1d(6), nn.Dropout(0.2)

        def forward(self, x):
            y = self.conv(x.unsqueeze(2)).squeeze(2)
            return self.bn(nn.Identity()(self.drop(y.clone())))

    ep, result = _check(randomize_bn(M()).eval(), (torch.randn(2, 3, 16),), ir, folded=1)
    assert norm_nodes(result.model) == []
    assert "squeeze" in result.report.folded[0].pattern


def test_view_that_keeps_the_channel_axis():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.bn = nn.Conv2d(3, 4, 3), nn.BatchNorm1d(4)

        def forward(self, x):
            y = self.conv(x)
            return self.bn(y.reshape(y.shape[0], 4, -1))

    _, result = _check(randomize_bn(M()).eval(), (torch.randn(2, 3, 6, 6),), folded=1)
    assert norm_nodes(result.model) == []


def test_view_that_merges_the_channel_axis_is_skipped():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.bn = nn.Conv2d(3, 4, 3), nn.BatchNorm1d(8)

        def forward(self, x):
            y = self.conv(x)  # [N, 4, 6, 6] -> [N, 8, 18]: channels mixed with rows
            return self.bn(y.reshape(y.shape[0], 8, -1))

    _, result = _check(randomize_bn(M()).eval(), (torch.randn(2, 3, 8, 8),), folded=0, skipped=1)
    assert result.report.skipped[0].code == Code.AXIS_LOST


# ---------------------------------------------------------------- 3. before the layer


@pytest.mark.parametrize("ir", IRS)
@pytest.mark.parametrize(
    "layer",
    [
        nn.Conv2d(4, 6, 3),
        nn.Conv2d(4, 6, 3, groups=2, stride=2),
        nn.Conv2d(4, 4, 1, groups=4, bias=False),
    ],
)
def test_batch_norm_before_unpadded_conv(layer, ir):
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.bn, self.conv = nn.BatchNorm2d(4), layer

        def forward(self, x):
            return self.conv(self.bn(torch.relu(x)))

    ep, result = _check(randomize_bn(M()).eval(), (torch.randn(2, 4, 7, 7),), ir, folded=1)
    assert result.report.folded[0].side == "input" and norm_nodes(result.model) == []


def test_batch_norm_before_linear():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.bn, self.fc = nn.BatchNorm1d(6), nn.Linear(6, 3)

        def forward(self, x):
            return self.fc(self.bn(torch.tanh(x)))

    _, result = _check(randomize_bn(M()).eval(), (torch.randn(5, 6),), folded=1)
    assert result.report.folded[0].side == "input"


def test_scale_only_before_padded_and_transposed_convs():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("s", torch.linspace(0.5, 2, 4).reshape(1, 4, 1, 1))
            self.conv = nn.Conv2d(4, 4, 3, padding=1)
            self.up = nn.ConvTranspose2d(4, 6, 3, groups=2, stride=2)

        def forward(self, x):
            return self.up(torch.relu(self.conv(torch.relu(x) * self.s)) * self.s)

    _, result = _check(M().eval(), (torch.randn(2, 4, 6, 6),), folded=2)
    assert {f.side for f in result.report.folded} == {"input"}


@pytest.mark.parametrize(
    "consumer,words",
    [
        (nn.Conv2d(4, 4, 3, padding=1), Code.SHIFT_PADDING),
        (nn.ConvTranspose2d(4, 4, 3), Code.SHIFT_TRANSPOSED),
    ],
)
def test_shift_before_padded_or_transposed_conv_is_skipped(consumer, words):
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.bn, self.conv = nn.BatchNorm2d(4), consumer

        def forward(self, x):
            return self.conv(self.bn(torch.relu(x)))

    _, result = _check(randomize_bn(M()).eval(), (torch.randn(2, 4, 6, 6),), folded=0, skipped=1)
    assert result.report.skipped[0].code == words


def test_batch_norm_before_conv_with_another_user_is_skipped():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.bn, self.conv = nn.BatchNorm2d(4), nn.Conv2d(4, 4, 1)

        def forward(self, x):
            y = self.bn(torch.relu(x))
            return self.conv(y) * y  # a product: conv(y) + y would merge into one conv (reparam)

    _, result = _check(randomize_bn(M()).eval(), (torch.randn(2, 4, 6, 6),), folded=0, skipped=1)


# ---------------------------------------------------------------- 5. variants, 6. fixed point


@pytest.mark.parametrize("dims", [1, 2, 3])
@pytest.mark.parametrize("affine", [True, False])
def test_batch_norm_variants(dims, affine):
    conv = {1: nn.Conv1d, 2: nn.Conv2d, 3: nn.Conv3d}[dims](2, 4, 3)
    bn = {1: nn.BatchNorm1d, 2: nn.BatchNorm2d, 3: nn.BatchNorm3d}[dims](4, affine=affine)

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.bn = conv, bn

        def forward(self, x):
            return self.bn(self.conv(x))

    _check(randomize_bn(M()).eval(), (torch.randn(2, 2, *([6] * dims)),), folded=1)


@pytest.mark.parametrize("ir", IRS)
def test_chains_fold_to_a_fixed_point(ir):
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.c1, self.b1a, self.b1b = nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.BatchNorm2d(4)
            self.c2, self.f2, self.b2 = nn.Conv2d(4, 4, 3), FrozenBatchNorm2d(4, seed=3), nn.BatchNorm2d(4)
            self.b3a, self.c3, self.b3b = nn.BatchNorm2d(4), nn.Conv2d(4, 5, 1), nn.BatchNorm2d(5)

        def forward(self, x):
            y = torch.relu(self.b1b(self.b1a(self.c1(x))))  # conv -> BN -> BN
            y = torch.relu(self.b2(self.f2(self.c2(y))))  # conv -> affine -> BN
            return self.b3b(self.c3(self.b3a(y)))  # BN -> conv -> BN

    ep, result = _check(randomize_bn(M()).eval(), (torch.randn(2, 3, 10, 10),), ir, skipped=0)
    assert len(norm_nodes(ep)) == 5 and norm_nodes(result.model) == [] and _affine_nodes(result.model) == []
    assert {f.norm for f in result.report.folded} >= {"b1a", "b1b", "b2", "b3a", "b3b"}


def test_residual_block_reusing_one_batch_norm_module():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.c1, self.c2, self.bn = nn.Conv2d(4, 4, 3, padding=1), nn.Conv2d(4, 4, 3, padding=1), nn.BatchNorm2d(4)

        def forward(self, x):
            return x + self.bn(self.c2(torch.relu(self.bn(self.c1(x)))))

    ep, result = _check(randomize_bn(M()).eval(), (torch.randn(2, 4, 6, 6),), folded=2)
    assert not any(k.startswith("bn.") for k in result.model.state_dict)


def test_random_tensor_computed_from_a_constant_is_not_a_constant():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3)
            self.register_buffer("k", torch.ones(1, 4, 1, 1))

        def forward(self, x):
            return self.conv(x) * torch.randn_like(self.k)

    result = bnfold.fold(export(M().eval(), (torch.randn(1, 3, 5, 5),)))
    assert result.report.folded == [] and len(_affine_nodes(result.model)) == 1


@pytest.mark.parametrize("ir", ["default", "decomposed"])
def test_true_divide_by_a_per_channel_constant(ir):
    class M(nn.Module):  # torch.true_divide stays aten.true_divide in the default IR
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 1)
            self.register_buffer("c", torch.rand(4, 1, 1) + 0.5)

        def forward(self, x):
            return torch.true_divide(self.conv(x), self.c)

    _, result = _check(M().eval(), (torch.randn(2, 3, 5, 5),), ir, folded=1)
    assert not [n for n in result.model.graph.nodes if "div" in str(n.target)], result.model.graph


def test_matmul_by_a_constant_matrix_is_a_linear():
    class M(nn.Module):  # x @ W stays aten.matmul in the default IR
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(8, 6) / 3)
            self.bn = nn.BatchNorm1d(6)

        def forward(self, x):
            return self.bn(x @ self.w)

    _, result = _check(randomize_bn(M()).eval(), (torch.randn(4, 8),), "default", folded=1)
    assert result.report.folded[0].pattern == "matmul+batch_norm"


def test_batch_norm_after_movedim_folds_into_a_channels_last_linear():
    """A pointwise conv written as ``nn.Linear`` over channels-last (ConvNeXt style), moved back to
    channels-first with ``movedim`` (kept as ``aten.movedim.int`` in the default IR), then BatchNorm."""

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc, self.bn = nn.Linear(3, 4), nn.BatchNorm2d(4)

        def forward(self, x):
            return self.bn(self.fc(x.movedim(1, -1)).movedim(-1, 1))

    ep, result = _check(randomize_bn(M()).eval(), (torch.randn(2, 3, 5, 6),), folded=1)
    assert any("movedim" in str(n.target) for n in ep.graph.nodes)
    assert norm_nodes(result.model) == []
    assert "movedim" in result.report.folded[0].pattern


@pytest.mark.parametrize("source,destination", [(1, -1), (-1, 1), ([0, 2], [3, 1]), ([1, 3], [0, 2])])
def test_movedim_axis_rule_matches_torch(source, destination):
    from bnfold.torch_export.axes import follow_axis

    x = torch.empty(2, 3, 4, 5)  # distinct sizes: the axis of each size is known on both sides
    y = x.movedim(source, destination)
    op = torch.ops.aten.movedim.int if isinstance(source, int) else torch.ops.aten.movedim.intlist
    node = torch.fx.Graph().call_function(op, (None, source, destination))
    for axis in range(4):
        after = follow_axis(node, tuple(x.shape), tuple(y.shape), axis, True)
        assert y.shape[after] == x.shape[axis]
        assert follow_axis(node, tuple(x.shape), tuple(y.shape), after, False) == axis


@pytest.mark.parametrize("spelling", ["swapaxes", "swapdims"])
def test_batch_norm_after_swapaxes_folds_into_a_channels_last_linear(spelling):
    """``x.swapaxes(1, -1)`` / ``x.swapdims(1, -1)`` (kept as such in the default IR) are transposes."""

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc, self.bn = nn.Linear(3, 4), nn.BatchNorm2d(4)

        def forward(self, x):
            y = self.fc(getattr(x, spelling)(1, -1))  # [N, 3, H, W] -> [N, W, H, 3] -> [N, W, H, 4]
            return self.bn(getattr(y, spelling)(1, -1))

    ep, result = _check(randomize_bn(M()).eval(), (torch.randn(2, 3, 5, 6),), folded=1)
    assert any(spelling in str(n.target) for n in ep.graph.nodes)
    assert norm_nodes(result.model) == []
