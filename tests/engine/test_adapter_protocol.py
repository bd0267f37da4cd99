"""Every adapter (fx, ONNX, and the tests' fake one) implements every member of ``GraphAdapter``."""

from __future__ import annotations

import pytest
from fake_graph import FakeAdapter

from bnfold.engine import GraphAdapter

MEMBERS = sorted(
    name
    for klass in GraphAdapter.__mro__
    if klass is GraphAdapter
    for name in {*vars(klass), *getattr(klass, "__annotations__", {})}
    if not name.startswith("_")
)


def _adapters():
    out = [FakeAdapter]
    try:
        from bnfold.torch_export.graph import FxGraph

        out.append(FxGraph)
    except ImportError:  # pragma: no cover - torch is a dependency
        pass
    onnx = pytest.importorskip("onnx")
    assert onnx
    from bnfold.onnx.graph import OnnxGraph

    return [*out, OnnxGraph]


def test_members_are_the_engine_questions_and_primitive_edits():
    assert {"remove_node", "strip_affine", "drop_unused", "add_bias", "write_layer", "full_rank_constants"} <= set(
        MEMBERS
    )
    assert "remove_steps" not in MEMBERS  # the chain bookkeeping is the engine's (bnfold.engine.edit)


@pytest.mark.parametrize("adapter", _adapters(), ids=lambda a: a.__name__)
def test_adapter_implements_the_protocol(adapter):
    missing = [name for name in MEMBERS if not hasattr(adapter, name)]
    assert not missing, missing
