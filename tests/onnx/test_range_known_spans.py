"""``--fp16-range --low-memory``: the calibration measures the span of each weight left on disk as it reads it, and
the range planner takes that span (``Planner.known``, keyed by what names the stored bytes:
``GraphAdapter.stored_key``) instead of reading the weight for it."""

from __future__ import annotations

from test_stream_range import _inputs, _model, _plain_and_streamed

from bnfold.engine.range_planner import Planner, span
from bnfold.onnx.tensors import stored_key


def test_the_planner_takes_the_spans_the_calibration_measured(tmp_path, monkeypatch):
    """Each large weight's span comes from the calibration (every one of the five), each equal to the span read from
    the graph at the time the planner asks; the files and report are the plain fold's (whose planner reads them)."""
    src = tmp_path / "in"
    src.mkdir()
    path, _ = _model(src)
    used, real = [], Planner._known

    def known(self, value):
        got = real(self, value)
        if got is not None:
            used.append((self.g.value_name(value), got, span(self.g.constant(value))))
        return got

    monkeypatch.setattr(Planner, "_known", known)
    report = _plain_and_streamed(tmp_path, path, _inputs(tmp_path))
    assert any(e["factor"] != 1.0 for e in report["rescaled"])
    assert {name for name, _, _ in used} == {"proj", "l0.w", "l1.w", "l2.w", "l3.w"}, used
    assert all(got == read for _, got, read in used), used


def test_a_tensor_written_elsewhere_has_another_key():
    """The key names the stored bytes: another offset, length or file, or other dims or element type, is another
    key."""
    from onnx import TensorProto

    def t(offset="0", length="64", location="a", dims=(4, 4), dtype=TensorProto.FLOAT):
        x = TensorProto(name="w", data_type=dtype, dims=dims, data_location=TensorProto.EXTERNAL)
        for k, v in (("location", location), ("offset", offset), ("length", length)):
            x.external_data.add(key=k, value=v)
        return x

    base = stored_key(t())
    assert stored_key(t()) == base
    others = [t(offset="64"), t(length="32"), t(location="b"), t(dims=(16,)), t(dtype=TensorProto.FLOAT16)]
    assert all(stored_key(o) != base for o in others)
