"""One list of small models that every frontend's tests fold: the torch.export suite
(``torch_export/test_real_architectures.py``), the ONNX suite
(``onnx/test_onnx_real_architectures.py``) and the parity suite (``parity/test_parity.py``).

Each ``Case`` builds an ``nn.Module`` with random weights whose BatchNorm statistics are
calibrated by a few train-mode forward passes (``momentum=None``: the running statistics are
the plain average over the passes), then switched to ``.eval()``.  A case also says whether
a dynamic batch dim makes sense, how many normalizations fold and how many are skipped, and
the code every skip must have.

Every case that should fold also carries ``by_hand``: the same function written without any
normalization, its weights folded by hand in float64 (independently of ``bnfold.fold_math``).
``test_by_hand_fold_is_exact`` checks it against the original, so a case that does not fold
is a gap of the fold engine, not an impossible expectation.
"""

from __future__ import annotations

import copy
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from bnfold.report import Code
from bnfold_testutil import require_executorch
from zoo import ConvBn

BATCH = 4  #: the example batch every program is exported with
OTHER_BATCH = 3  #: a second batch size a dynamic program must also run with
_CALIBRATION_PASSES = 3
_CALIBRATION_BATCH = 16


# --------------------------------------------------------------------------- the models


class LinearBn(nn.Module):
    def __init__(self, cin=8, cout=6):
        super().__init__()
        self.fc, self.bn = nn.Linear(cin, cout), nn.BatchNorm1d(cout)

    def forward(self, x):
        return self.bn(self.fc(x))


class BnConv(nn.Module):
    """BatchNorm2d -> unpadded conv: folds into the conv's input channels."""

    def __init__(self):
        super().__init__()
        self.bn, self.conv = nn.BatchNorm2d(4), nn.Conv2d(4, 6, 3)

    def forward(self, x):
        return self.conv(self.bn(x))


class PreActivation(nn.Module):
    """BatchNorm2d -> ReLU -> conv (pre-activation ResNet): the ReLU is in the way."""

    def __init__(self):
        super().__init__()
        self.bn, self.conv = nn.BatchNorm2d(4), nn.Conv2d(4, 6, 3, padding=1)

    def forward(self, x):
        return self.conv(torch.relu(self.bn(x)))


class LinearNorm(nn.Module):
    """LeViT's ``LinearNorm``: a bias-free linear over tokens, BatchNorm1d over the flattened
    tokens, and ``reshape_as`` back (a second user of the linear's output that reads only its shape)."""

    def __init__(self, cin=8, cout=12, transposed_input=False):
        super().__init__()
        self.c, self.bn = nn.Linear(cin, cout, bias=False), nn.BatchNorm1d(cout)
        self.transposed_input = transposed_input

    def forward(self, x):
        if self.transposed_input:  # [B, C, N] -> a non-contiguous [B, N, C]: bmm after decomposition
            x = x.transpose(1, 2)
        x = self.c(x)
        return self.bn(x.flatten(0, 1)).reshape_as(x)


class LinearFlattenBnView(nn.Module):
    """A bias-free linear over [B, 5, C], flatten(0, 1), BatchNorm1d, and a view back to [B, 5, C'].
    Decomposed with a dynamic batch s: mm[5*s, 16] -> view[s, 5, 16] -> view[5*s, 16] -> batch norm."""

    def __init__(self):
        super().__init__()
        self.fc, self.bn = nn.Linear(8, 16, bias=False), nn.BatchNorm1d(16)

    def forward(self, x):
        y = self.bn(self.fc(x).flatten(0, 1))
        return y.view(x.shape[0], 5, 16)


class NormLinearHead(nn.Module):
    """timm's NormLinear classifier head: BatchNorm1d -> Dropout (eval) -> Linear."""

    def __init__(self):
        super().__init__()
        self.norm, self.drop, self.fc = nn.BatchNorm1d(8), nn.Dropout(0.25), nn.Linear(8, 5)

    def forward(self, x):
        return self.fc(self.drop(self.norm(x)))


class DivFlattenLinear(nn.Module):
    """``x / 6`` (hard-swish style), flatten, linear: a scalar scale before the linear."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(36, 5)

    def forward(self, x):
        return self.fc((torch.relu(x) / 6).flatten(1))


class PoolDivViewLinear(nn.Module):
    """Global pool, a per-channel divide by a constant, view to [B, C], linear."""

    def __init__(self):
        super().__init__()
        self.register_buffer("s", torch.linspace(0.5, 2.0, 6).reshape(1, 6, 1, 1))
        self.fc = nn.Linear(6, 5)

    def forward(self, x):
        y = x.mean((2, 3), keepdim=True) / self.s
        return self.fc(y.view(y.shape[0], -1))


class SharedConvTwoBns(nn.Module):
    """One bias-free conv module on two paths, each followed by its own BatchNorm."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, bias=False)
        self.bn1, self.bn2 = nn.BatchNorm2d(4), nn.BatchNorm2d(4)

    def forward(self, x, x2):
        return self.bn1(self.conv(x)) + self.bn2(self.conv(x2))


class SharedHead(nn.Module):
    def __init__(self, levels=3):
        super().__init__()
        self.conv = nn.Conv2d(4, 4, 3, padding=1)
        self.bn = nn.ModuleList(nn.BatchNorm2d(4) for _ in range(levels))


class EfficientDetHead(nn.Module):
    """EfficientDet-style head: one conv shared by every feature level, a BatchNorm per level."""

    def __init__(self):
        super().__init__()
        self.head = SharedHead(3)

    def forward(self, p3, p4, p5):
        return tuple(torch.relu(bn(self.head.conv(p))) for bn, p in zip(self.head.bn, (p3, p4, p5), strict=True))


class LinearFlattenBn(nn.Module):
    """linear over [B, N, C] -> flatten(0, 1) -> BatchNorm1d over [B*N, C]."""

    def __init__(self):
        super().__init__()
        self.fc, self.bn = nn.Linear(8, 6), nn.BatchNorm1d(6)

    def forward(self, x):
        return self.bn(self.fc(x).flatten(0, 1))


class BnUnflattenLinear(nn.Module):
    """[B, N, C] -> flatten(0, 1) -> BatchNorm1d -> unflatten back -> linear over C."""

    def __init__(self):
        super().__init__()
        self.bn, self.fc = nn.BatchNorm1d(6), nn.Linear(6, 4)

    def forward(self, x):
        y = self.bn(x.flatten(0, 1))
        return self.fc(y.unflatten(0, (x.shape[0], x.shape[1])))


class BmmConstWeight(nn.Module):
    """A linear written as bmm with an expanded constant weight, then flatten + BatchNorm1d."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(8, 6) / 8**0.5)
        self.bn = nn.BatchNorm1d(6)

    def forward(self, x):
        y = torch.bmm(x, self.w.expand(x.shape[0], 8, 6))
        return self.bn(y.flatten(0, 1))


class LayerNormQkv(nn.Module):
    """One LayerNorm feeding separate q, k and v projections: its affine folds into all three."""

    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm(8)
        self.q, self.k, self.v = nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 8, bias=False)
        g = torch.Generator().manual_seed(5)
        with torch.no_grad():
            self.ln.weight.copy_(torch.rand(8, generator=g) + 0.5)
            self.ln.bias.copy_(torch.rand(8, generator=g) - 0.5)

    def forward(self, x):
        h = self.ln(x)
        return self.q(h) * self.k(h) + self.v(h)


# --------------------------------------------------------------------------- by-hand folds (float64)


def bn_affine(bn: nn.modules.batchnorm._BatchNorm) -> tuple[torch.Tensor, torch.Tensor]:
    """The eval-mode batch norm as ``x * scale + shift`` (float64)."""
    inv = (bn.running_var.double() + bn.eps).rsqrt()
    gamma = bn.weight.double() if bn.weight is not None else torch.ones_like(inv)
    beta = bn.bias.double() if bn.bias is not None else torch.zeros_like(inv)
    scale = gamma * inv
    return scale, beta - bn.running_mean.double() * scale


def _bias(layer, n: int) -> torch.Tensor:
    return layer.bias.double() if layer.bias is not None else torch.zeros(n, dtype=torch.float64)


def _conv_out(conv: nn.Conv2d, bn) -> tuple[torch.Tensor, torch.Tensor]:
    s, t = bn_affine(bn)
    return conv.weight.double() * s.reshape(-1, 1, 1, 1), _bias(conv, s.numel()) * s + t


def _linear_out(w: torch.Tensor, b: torch.Tensor | None, bn) -> tuple[torch.Tensor, torch.Tensor]:
    """A linear weight [out, in] and bias, then ``bn`` over the outputs."""
    s, t = bn_affine(bn)
    b = torch.zeros(w.shape[0], dtype=torch.float64) if b is None else b.double()
    return w.double() * s[:, None], b * s + t


def _linear_in(fc: nn.Linear, s: torch.Tensor, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``fc(x * s + t)`` as one linear."""
    w = fc.weight.double()
    return w * s[None, :], _bias(fc, w.shape[0]) + w @ t


def _hand_conv_bn(m: ConvBn):
    w, b = _conv_out(m.conv, m.bn)
    c = m.conv
    return lambda x: F.conv2d(x, w, b, c.stride, c.padding, c.dilation, c.groups)


def _hand_conv_transpose_bn(m: ConvBn):
    c, (s, t) = m.conv, bn_affine(m.bn)
    cin, per_group = c.weight.shape[0], c.weight.shape[1]
    out_channel = torch.arange(cin)[:, None] // (cin // c.groups) * per_group + torch.arange(per_group)[None, :]
    w = c.weight.double() * s[out_channel].reshape(cin, per_group, 1, 1)
    b = _bias(c, s.numel()) * s + t
    return lambda x: F.conv_transpose2d(x, w, b, c.stride, c.padding, c.output_padding, c.groups, c.dilation)


def _hand_linear_bn(m: LinearBn):
    w, b = _linear_out(m.fc.weight, m.fc.bias, m.bn)
    return lambda x: F.linear(x, w, b)


def _hand_bn_conv(m: BnConv):
    s, t = bn_affine(m.bn)
    w = m.conv.weight.double()
    b = _bias(m.conv, w.shape[0]) + (w * t.reshape(1, -1, 1, 1)).sum((1, 2, 3))
    return lambda x: F.conv2d(x, w * s.reshape(1, -1, 1, 1), b)


def _hand_linear_norm(m: LinearNorm):
    w, b = _linear_out(m.c.weight, m.c.bias, m.bn)

    def f(x):
        return F.linear(x.transpose(1, 2) if m.transposed_input else x, w, b)

    return f


def _hand_linear_flatten_bn_view(m: LinearFlattenBnView):
    w, b = _linear_out(m.fc.weight, m.fc.bias, m.bn)
    return lambda x: F.linear(x, w, b)


def _hand_norm_linear_head(m: NormLinearHead):
    w, b = _linear_in(m.fc, *bn_affine(m.norm))
    return lambda x: F.linear(x, w, b)


def _hand_div_flatten_linear(m: DivFlattenLinear):
    w, b = m.fc.weight.double() / 6, _bias(m.fc, 5)
    return lambda x: F.linear(torch.relu(x).flatten(1), w, b)


def _hand_pool_div_view_linear(m: PoolDivViewLinear):
    w, b = _linear_in(m.fc, 1 / m.s.double().reshape(-1), torch.zeros(6, dtype=torch.float64))
    return lambda x: F.linear(x.mean((2, 3)), w, b)


def _hand_shared_conv_two_bns(m: SharedConvTwoBns):
    (w1, b1), (w2, b2) = _conv_out(m.conv, m.bn1), _conv_out(m.conv, m.bn2)
    return lambda x, x2: F.conv2d(x, w1, b1) + F.conv2d(x2, w2, b2)


def _hand_efficientdet_head(m: EfficientDetHead):
    folded = [_conv_out(m.head.conv, bn) for bn in m.head.bn]
    return lambda *ps: tuple(torch.relu(F.conv2d(p, w, b, padding=1)) for (w, b), p in zip(folded, ps, strict=True))


def _hand_linear_flatten_bn(m: LinearFlattenBn):
    w, b = _linear_out(m.fc.weight, m.fc.bias, m.bn)
    return lambda x: F.linear(x, w, b).flatten(0, 1)


def _hand_bn_unflatten_linear(m: BnUnflattenLinear):
    w, b = _linear_in(m.fc, *bn_affine(m.bn))
    return lambda x: F.linear(x, w, b)


def _hand_bmm_const_weight(m: BmmConstWeight):
    w, b = _linear_out(m.w.T, None, m.bn)
    return lambda x: F.linear(x, w, b).flatten(0, 1)


# --------------------------------------------------------------------------- the case list


@dataclass(frozen=True)
class Case:
    """A model to fold.  ``shapes`` are the example input shapes with the batch first."""

    name: str
    make: Callable[[], nn.Module]
    shapes: tuple[tuple[int, ...], ...]
    folded: int
    skipped: int = 0
    dynamic: bool = True  #: a dynamic batch dim (dim 0 of every input) makes sense
    real: bool = False  #: a real-architecture pattern
    reason_code: Code | None = None  #: the code every skip must have
    keys: tuple[str, ...] = ()  #: state_dict keys (ONNX: initializer names) the folded model keeps
    affine_op: str = ""  #: an elementwise op (``div``) that folds: none may be left in the folded graph
    by_hand: Callable[[nn.Module], Callable] | None = None
    notes: str = ""
    _cache: dict = field(default_factory=dict, compare=False, repr=False)

    def __str__(self) -> str:
        return self.name

    @property
    def seed(self) -> int:
        return zlib.crc32(self.name.encode())

    def model(self) -> nn.Module:
        """The calibrated eval-mode module (a fresh copy each call)."""
        if "model" not in self._cache:
            self._cache["model"] = _calibrated(self.make, self.shapes, self.seed)
        return copy.deepcopy(self._cache["model"])

    def inputs(self, batch: int = BATCH) -> tuple[torch.Tensor, ...]:
        g = torch.Generator().manual_seed(self.seed + batch)
        return tuple(torch.randn(batch, *shape, generator=g) for shape in self.shapes)

    def dynamic_shapes(self) -> tuple:
        batch = torch.export.Dim("batch", min=2, max=1024)
        return tuple({0: batch} for _ in self.shapes)

    def program(self, ir: str = "default", dynamic: bool = False) -> torch.export.ExportedProgram:
        """The model exported to ``ir`` (``default``, ``decomposed`` or ``edge``), made once per run.

        Callers must not modify it (``bnfold.fold`` never modifies its input)."""
        key = ("program", ir, dynamic)
        if key not in self._cache:
            if ir == "default":
                shapes = self.dynamic_shapes() if dynamic else None
                ep = torch.export.export(self.model(), self.inputs(), dynamic_shapes=shapes)
            elif ir == "decomposed":
                ep = self.program("default", dynamic).run_decompositions()
            elif ir == "edge":
                require_executorch()
                from executorch.exir import to_edge

                ep = to_edge(self.program("default", dynamic)).exported_program()
            else:
                raise ValueError(f"unknown IR {ir!r}")
            self._cache[key] = ep
        return self._cache[key]

    def onnx(self, exporter: str = "dynamo", dynamic: bool = False):
        """The model exported to ONNX with every BatchNorm kept, made once per run.

        ``dynamo``: ``torch.onnx.export(program, dynamo=True, optimize=False)`` of ``self.program()``
        (its optimizer would fuse the BatchNorms); ``torchscript``: ``dynamo=False`` with
        ``training=TrainingMode.PRESERVE``."""
        key = ("onnx", exporter, dynamic)
        if key not in self._cache:
            self._cache[key] = _export_onnx(self, exporter, dynamic)
        return self._cache[key]

    def feeds(self, model, batch: int = BATCH) -> dict:
        """ONNX Runtime feeds for the ONNX ``model``'s graph inputs, in order."""
        inits = {t.name for t in model.graph.initializer}
        names = [i.name for i in model.graph.input if i.name not in inits]
        assert len(names) == len(self.shapes), names
        return {n: x.numpy() for n, x in zip(names, self.inputs(batch), strict=True)}


def _export_onnx(case: Case, exporter: str, dynamic: bool):
    import io
    import warnings

    import onnx

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if exporter == "dynamo":  # from the program exported once (the exporter would export it again)
            program = torch.onnx.export(
                case.program("default", dynamic), case.inputs(), dynamo=True, optimize=False, verbose=False
            )
            return program.model_proto
        if exporter == "torchscript":
            names = [f"input_{i}" for i in range(len(case.shapes))]
            f = io.BytesIO()
            torch.onnx.export(
                case.model(),
                case.inputs(),
                f,
                dynamo=False,
                input_names=names,
                training=torch.onnx.TrainingMode.PRESERVE,
                dynamic_axes={n: {0: "batch"} for n in names} if dynamic else None,
            )
            return onnx.load_from_string(f.getvalue())
    raise ValueError(f"unknown exporter {exporter!r}")


def _calibrated(make: Callable[[], nn.Module], shapes, seed: int) -> nn.Module:
    torch.manual_seed(seed)
    model = make()
    bns = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    for bn in bns:
        bn.momentum = None  # the running statistics average the calibration passes
        bn.reset_running_stats()
    g = torch.Generator().manual_seed(seed + 1)
    model.train()
    with torch.no_grad():
        for _ in range(_CALIBRATION_PASSES):  # inputs with per-channel offsets: statistics differ per channel
            model(
                *(
                    torch.randn(_CALIBRATION_BATCH, *s, generator=g) * 1.5
                    + torch.rand(s[0], generator=g).reshape(-1, *([1] * (len(s) - 1)))
                    for s in shapes
                )
            )
        for bn in bns:  # distinct non-trivial gammas and betas: a wrong channel mapping shows
            bn.weight.copy_(torch.rand(bn.num_features, generator=g) * 3 - 1.5)
            bn.bias.copy_(torch.rand(bn.num_features, generator=g) * 2 - 1)
    return model.eval()


CASES: list[Case] = [
    # ------------------------------------------------------------------ the basic pairs
    Case(
        "conv2d_bn",
        lambda: ConvBn(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8)),
        ((3, 8, 8),),
        folded=1,
        by_hand=_hand_conv_bn,
    ),
    Case(
        "depthwise_conv_bn",
        lambda: ConvBn(nn.Conv2d(8, 8, 3, padding=1, groups=8, bias=False), nn.BatchNorm2d(8)),
        ((8, 6, 6),),
        folded=1,
        by_hand=_hand_conv_bn,
    ),
    Case(
        "grouped_conv_transpose_bn",
        lambda: ConvBn(nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1, groups=2), nn.BatchNorm2d(6)),
        ((4, 5, 5),),
        folded=1,
        by_hand=_hand_conv_transpose_bn,
    ),
    Case("linear_bn1d", LinearBn, ((8,),), folded=1, by_hand=_hand_linear_bn),
    Case("bn_before_unpadded_conv", BnConv, ((4, 7, 7),), folded=1, by_hand=_hand_bn_conv),
    Case(
        "layer_norm_qkv",
        LayerNormQkv,
        ((5, 8),),
        folded=1,
        notes="fan-out: one LayerNorm's affine into the q, k and v projections",
    ),
    Case(
        "preactivation_bn_relu_conv",
        PreActivation,
        ((4, 6, 6),),
        folded=0,
        skipped=1,
        reason_code=Code.NO_LAYER,
        notes="the ReLU between the BN and the conv: nothing to fold into",
    ),
    # ------------------------------------------------------------------ real architectures
    Case(
        "levit_linear_norm",
        LinearNorm,
        ((5, 8),),
        folded=1,
        real=True,
        by_hand=_hand_linear_norm,
        notes="LeViT LinearNorm: the linear's output also feeds reshape_as (ONNX: Shape), which reads its shape only",
    ),
    Case(
        "levit_linear_norm_transposed_input",
        lambda: LinearNorm(transposed_input=True),
        ((8, 5),),
        folded=1,
        real=True,
        by_hand=_hand_linear_norm,
        notes="the linear reads x.transpose(1, 2): expand + view + bmm after run_decompositions()",
    ),
    Case(
        "linear_flatten_bn_view",
        LinearFlattenBnView,
        ((5, 8),),
        folded=1,
        real=True,
        by_hand=_hand_linear_flatten_bn_view,
        notes="dynamic + decomposed: mm[5*s] -> view[s, 5, 16] -> view[5*s, 16] -> batch norm",
    ),
    Case(
        "norm_linear_head",
        NormLinearHead,
        ((8,),),
        folded=1,
        real=True,
        by_hand=_hand_norm_linear_head,
        notes="timm NormLinear head: BatchNorm1d -> Dropout (eval) -> Linear, input side",
    ),
    Case(
        "div_flatten_linear",
        DivFlattenLinear,
        ((4, 3, 3),),
        folded=1,
        real=True,
        affine_op="div",
        by_hand=_hand_div_flatten_linear,
        notes="x / 6 -> flatten -> linear (addmm after decomposition)",
    ),
    Case(
        "pool_div_view_linear",
        PoolDivViewLinear,
        ((6, 3, 3),),
        folded=1,
        real=True,
        affine_op="div",
        by_hand=_hand_pool_div_view_linear,
        notes="a per-channel divide -> view -> linear",
    ),
    Case(
        "shared_conv_two_bns",
        SharedConvTwoBns,
        ((3, 6, 6), (3, 6, 6)),
        folded=2,
        real=True,
        keys=("conv.weight",),
        by_hand=_hand_shared_conv_two_bns,
        notes="one bias-free conv on two paths: each path folds into a private copy",
    ),
    Case(
        "efficientdet_shared_head",
        EfficientDetHead,
        ((4, 8, 8), (4, 4, 4), (4, 2, 2)),
        folded=3,
        real=True,
        keys=("head.conv.weight", "head.conv.bias"),
        by_hand=_hand_efficientdet_head,
        notes="one conv at three feature levels, a BN per level: the original names survive on one level",
    ),
    Case(
        "linear_flatten_bn1d",
        LinearFlattenBn,
        ((5, 8),),
        folded=1,
        real=True,
        by_hand=_hand_linear_flatten_bn,
        notes="output side: flatten(0, 1) keeps the channel axis last",
    ),
    Case(
        "bn1d_unflatten_linear",
        BnUnflattenLinear,
        ((5, 6),),
        folded=1,
        real=True,
        by_hand=_hand_bn_unflatten_linear,
        notes="input side: unflatten keeps the channel axis last",
    ),
    Case(
        "bmm_const_weight",
        BmmConstWeight,
        ((5, 8),),
        folded=1,
        real=True,
        by_hand=_hand_bmm_const_weight,
        notes="bmm with an expanded constant weight is a linear layer",
    ),
]

REAL_CASES = [c for c in CASES if c.real]
BY_NAME = {c.name: c for c in CASES}


def summary(case: Case, report) -> str:
    """One line for an assertion message: the expected counts, the report's, its skip reasons, the case's notes."""
    reasons = "; ".join(f"{s.norm}: {s.reason}" for s in report.skipped) or "no skip"
    return (
        f"expected {case.folded} folded / {case.skipped} skipped, got {len(report.folded)} / "
        f"{len(report.skipped)} ({reasons}) [{case.notes}]"
    )


def n_batch_norms(model: nn.Module) -> int:
    return sum(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())


def variants(cases: list[Case]) -> list:
    """``(case, dynamic)`` pairs for pytest.mark.parametrize: static, and dynamic where it applies."""
    import pytest

    return [
        pytest.param(c, dyn, id=f"{c.name}-{'dynamic' if dyn else 'static'}")
        for c in cases
        for dyn in ((False, True) if c.dynamic else (False,))
    ]
