"""The folded edge program is verified where the fold changed it, and carries the full verifiers on."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("executorch.exir")

from et_models import build

import bnfold
from bnfold.torch_export.program import ProgramEditor
from bnfold_testutil import export


@pytest.fixture(scope="module")
def edge():
    model, x = build("linear_bn1d")
    return export(model, x, "edge")


def test_folded_edge_program_keeps_its_verifiers_and_verifies_in_full(edge):
    from torch._export.verifier import _VerifierMeta

    registered = _VerifierMeta._registry.get("EDGE")
    result = bnfold.fold(edge)
    assert result.report.folded
    assert result.model.verifiers == edge.verifiers
    assert _VerifierMeta._registry.get("EDGE") is registered
    result.model.validate()  # the whole program, with ExecuTorch's own verifier


def test_a_new_node_with_mismatched_dtypes_is_still_caught(edge):
    from executorch.exir.dialects._ops import ops as exir_ops
    from torch._export.verifier import SpecViolationError

    editor = ProgramEditor(edge)
    out = next(n for n in editor.graph.nodes if n.op == "output")
    value = out.args[0][0]
    with editor.graph.inserting_before(out):
        bad = editor.graph.call_function(exir_ops.edge.aten.add.Tensor, (value, value))
    bad.meta["val"] = torch.empty(value.meta["val"].shape, dtype=torch.float16, device="meta")
    out.replace_input_with(value, bad)
    with pytest.raises(SpecViolationError, match="mismatched dtypes"):
        editor.build()
