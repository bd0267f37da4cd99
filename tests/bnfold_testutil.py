"""Shared helpers for the test suite: model builders, float64 references, graph checks."""

from __future__ import annotations

import contextlib
import copy

import torch
import torch.nn as nn

BN_TYPES = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)


class Pair(nn.Module):
    """A layer followed by a normalization."""

    def __init__(self, layer, bn):
        super().__init__()
        self.layer, self.bn = layer, bn

    def forward(self, x):
        return self.bn(self.layer(x))


class TwoPaths(nn.Module):
    """One conv module on two paths, each with its own BatchNorm (a shared weight)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.bn1, self.bn2 = nn.BatchNorm2d(4), nn.BatchNorm2d(4)

    def forward(self, x):
        return self.bn1(self.conv(x)), self.bn2(self.conv(x.flip(-1)))


def randomize_bn(module: nn.Module, seed: int = 0, mean=1.0, var=(0.5, 2.0), gamma=2.0, beta=1.0) -> nn.Module:
    """Give every batch norm distinct per-channel statistics, so a wrong channel mapping shows."""
    g = torch.Generator().manual_seed(seed)
    for m in module.modules():
        if isinstance(m, BN_TYPES) and m.running_mean is not None:
            c = m.num_features
            m.running_mean.copy_((torch.rand(c, generator=g) * 2 - 1) * mean)
            m.running_var.copy_(torch.rand(c, generator=g) * (var[1] - var[0]) + var[0])
            if m.affine:
                m.weight.data.copy_((torch.rand(c, generator=g) * 2 - 1) * gamma)
                m.bias.data.copy_((torch.rand(c, generator=g) * 2 - 1) * beta)
    return module


def reference(module: nn.Module, *inputs: torch.Tensor) -> torch.Tensor:
    """The module's output computed in float64."""
    m64 = copy.deepcopy(module).double()
    with torch.no_grad():
        return m64(*(x.double() for x in inputs))


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """max |out - ref| / max |ref|: the error scaled to the output magnitude."""
    scale = ref.abs().max().item()
    return (out.double() - ref).abs().max().item() / max(scale, 1e-30)


def assert_matches(out: torch.Tensor, ref: torch.Tensor, rel: float = 2e-5) -> float:
    """``out`` equals the float64 reference within ``rel`` times the output magnitude."""
    assert out.shape == ref.shape, (out.shape, ref.shape)
    assert torch.isfinite(out).all()
    err = relative_error(out, ref)
    assert err <= rel, f"max error {err:.3g} of the output magnitude exceeds {rel:g}"
    return err


def norm_nodes(ep) -> list:
    """Every batch-norm node of a program's graph (any IR, edge included)."""
    return [n for n in ep.graph.nodes if n.op == "call_function" and "batch_norm" in str(n.target)]


def export(module: nn.Module, inputs: tuple, ir: str = "default", base=None):
    """Export ``module`` to the IR a user meets: ``default``, ``decomposed`` or ``edge``.  ``base``: the module's
    default export, already made on ``inputs``: the other IRs then start from a copy of it, as a user's pipeline
    does (exporting a model again costs seconds)."""
    ep = torch.export.export(module, inputs) if base is None else copy.deepcopy(base)
    if ir == "decomposed":
        return ep.run_decompositions()
    if ir == "edge":
        require_executorch()
        from executorch.exir import to_edge

        return to_edge(ep).exported_program()
    return ep


def run(ep, *inputs: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return ep.module()(*inputs)


#: Measurements tests record for the end-of-run summary (see conftest.py).
STATS: dict[str, float] = {}
#: How each key of :data:`STATS` combines with another worker's (``max`` or ``sum``), for ``pytest -n``.
COMBINE: dict[str, str] = {}


def record_max(key: str, value: float) -> None:
    STATS[key] = max(STATS.get(key, float("-inf")), value)
    COMBINE[key] = "max"


def record_count(key: str, n: int = 1) -> None:
    STATS[key] = STATS.get(key, 0) + n
    COMBINE[key] = "sum"


def merge_stats(stats: dict[str, float], combine: dict[str, str]) -> None:
    """Fold another process's :data:`STATS` (a pytest-xdist worker's) into this one's."""
    for key, value in stats.items():
        mine = STATS.get(key)
        how = COMBINE.setdefault(key, combine.get(key, "max"))
        STATS[key] = value if mine is None else max(mine, value) if how == "max" else mine + value


def onnx_conv_bn(opset: int = 13, seed: int = 0):
    """Conv -> BatchNormalization as an ONNX model, float32 initializers from ``seed``."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    f32 = np.float32
    inits = [
        numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(f32), "W"),
        numpy_helper.from_array(rng.standard_normal(4).astype(f32), "B"),
        numpy_helper.from_array((rng.random(4) + 0.5).astype(f32), "scale"),
        numpy_helper.from_array((rng.random(4) - 0.5).astype(f32), "bias"),
        numpy_helper.from_array((rng.random(4) - 0.5).astype(f32), "mean"),
        numpy_helper.from_array((rng.random(4) + 0.5).astype(f32), "var"),
    ]
    nodes = [
        helper.make_node("Conv", ["X", "W", "B"], ["c"], name="conv"),
        helper.make_node("BatchNormalization", ["c", "scale", "bias", "mean", "var"], ["Y"], name="bn"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, 4, 6, 6])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


@contextlib.contextmanager
def one_torch_thread():
    """torch single-threaded inside (its thread count back after): the tests' tensors are small, and on a shared
    2-core machine torch's thread pool makes their many small ops several times slower."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def has_executorch() -> bool:
    """Whether ExecuTorch is installed (see :func:`require_executorch`)."""
    import importlib.util

    try:
        return importlib.util.find_spec("executorch.exir") is not None
    except ImportError:
        return False


def require_executorch() -> None:
    """Skip the calling test when ExecuTorch is not installed (``bnfold[executorch]`` pins torch 2.13: the core
    suite on torch 2.14 runs without it).  ``executorch.exir``, not ``executorch``: with ``tests`` on the path,
    the folder ``tests/executorch`` imports as a namespace package of that name."""
    import pytest

    pytest.importorskip("executorch.exir")
