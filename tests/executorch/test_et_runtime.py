"""Folded programs lowered (XNNPACK and portable-only), serialized and run with ``executorch.runtime``."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("executorch.runtime")

from et_models import build, count_delegates, run_pte
from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
from executorch.exir import to_edge, to_edge_transform_and_lower
from executorch.exir.pass_base import ExportedProgramPassBase, ExportedProgramPassResult

from bnfold.executorch import FoldBatchNormPass
from bnfold_testutil import assert_matches, norm_nodes, record_max, reference, relative_error

MODELS = {  # name -> batch norms folded
    "conv1d": 1,
    "conv2d_depthwise": 1,
    "conv3d": 1,
    "conv_transpose2d_grouped": 1,
    "linear_bn1d": 1,
    "mbconv": 3,
}


#: ExecuTorch 1.5.1 cannot run a 3-D convolution at all: XNNPACK does not partition it and the portable
#: ``aten::convolution.out`` kernel accepts 3-D / 4-D inputs only (see test_conv3d_has_no_runtime_kernel).
#: Those programs are checked by running the lowered program's graph instead of the ``.pte``.
NO_RUNTIME_KERNEL = {"conv3d"}


def _check_output(name, edge, et, x, model, key):
    ref = reference(model, *x)
    if name in NO_RUNTIME_KERNEL:
        with torch.no_grad():
            out = edge.exported_program().module()(*x)
    else:
        out = run_pte(et.buffer, x)
    assert_matches(out, ref)
    record_max(key, relative_error(out, ref))


class GraphBeforePartitioning(ExportedProgramPassBase):
    """Runs after the fold in ``transform_passes``, i.e. before any partitioner, and keeps what it saw."""

    def call(self, ep):
        self.norms = len(norm_nodes(ep))
        self.ops = [str(n.target) for n in ep.graph.nodes if n.op == "call_function"]
        return ExportedProgramPassResult(ep, False)


@pytest.mark.parametrize("name", list(MODELS))
def test_xnnpack(name):
    model, x = build(name)
    ep = torch.export.export(model, x)
    assert len(norm_nodes(ep)) == MODELS[name]
    fold, seen = FoldBatchNormPass(), GraphBeforePartitioning()

    edge = to_edge_transform_and_lower(ep, transform_passes=[fold, seen], partitioner=[XnnpackPartitioner()])

    assert len(fold.report.folded) == MODELS[name] and not fold.report.skipped
    assert seen.norms == 0, seen.ops
    if name != "conv3d":  # XNNPACK has no 3-D convolution; that one runs on portable kernels
        assert count_delegates(edge.exported_program()) >= 1
    _check_output(name, edge, edge.to_executorch(), x, model, "executorch xnnpack .pte max relative error")


@pytest.mark.parametrize("name", list(MODELS))
def test_portable(name):
    model, x = build(name)
    fold = FoldBatchNormPass()

    edge = to_edge(torch.export.export(model, x)).transform([fold])

    assert len(fold.report.folded) == MODELS[name] and not fold.report.skipped
    assert norm_nodes(edge.exported_program()) == []
    et = edge.to_executorch()
    assert count_delegates(et.exported_program()) == 0
    _check_output(name, edge, et, x, model, "executorch portable .pte max relative error")


def test_conv3d_has_no_runtime_kernel(capfd):
    """Why conv3d is not run as a .pte: the unfolded program fails the same way, so it is not the fold."""
    model, x = build("conv3d")
    et = to_edge(torch.export.export(model, x)).to_executorch()
    with pytest.raises(RuntimeError):
        run_pte(et.buffer, x)
    assert "Expect input tensor to be 3-D or 4-D" in capfd.readouterr().err
