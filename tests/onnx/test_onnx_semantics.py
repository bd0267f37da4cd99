"""Every op of ``bnfold.onnx.semantics.IMPLS`` against ``onnx.reference.ReferenceEvaluator`` and ONNX
Runtime in float32, on the generated cases of ``op_cases.py``: ours runs in float64 on the same
float32 inputs, and agrees with each oracle within a tolerance scaled to the output's magnitude.
Also: every op of the table has a case, and an op with no row runs through the reference evaluator,
marked not emulated."""

from __future__ import annotations

import zlib

import numpy as np
import onnx
import pytest
import torch
from onnx import helper
from op_cases import CASES, POS, SEQ, Case

from bnfold.onnx.semantics import IMPLS, attrs, bind

ort = pytest.importorskip("onnxruntime")

REL = 2e-5  # of the output's magnitude: float32 rounding of the oracles' results, with room for sums


def _inputs(case: Case, rng: np.random.Generator) -> list[np.ndarray]:
    out = []
    for spec in case.inputs:
        if isinstance(spec, POS):
            out.append((rng.uniform(0.5, 2.0, spec.shape)).astype(np.float32))
        elif isinstance(spec, SEQ):
            out.append([rng.standard_normal(shape).astype(np.float32) for shape in spec.shapes])
        elif isinstance(spec, tuple):
            out.append(rng.standard_normal(spec).astype(np.float32))
        else:
            out.append(np.asarray(spec))
    return out


def _model(case: Case, xs: list[np.ndarray]) -> onnx.ModelProto:
    names = [
        f"x{i}" if isinstance(v, list) or v.size or v.dtype != np.float32 or i == 0 else "" for i, v in enumerate(xs)
    ]
    outs = [f"y{i}" for i in range(case.outs)]
    node = helper.make_node(case.op, names, outs, **case.attrs)
    inputs = [
        helper.make_tensor_sequence_value_info(n, onnx.TensorProto.FLOAT, None)
        if isinstance(v, list)
        else helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype), list(v.shape))
        for n, v in zip(names, xs)
        if n
    ]
    graph = helper.make_graph([node], "case", inputs, [helper.make_value_info(o, onnx.TypeProto()) for o in outs])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", case.opset)])
    model.ir_version = min(model.ir_version, 10)
    return onnx.shape_inference.infer_shapes(model)


def _ours(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    node = model.graph.node[0]
    ins = [None if not n else _torch(feeds[n]) for n in node.input]
    op = bind(node, model.opset_import[0].version)
    assert op.emulated, f"{node.op_type} fell back to the reference evaluator: {op.why}"
    return [[p.numpy() for p in o] if isinstance(o, list) else o.numpy() for o in op(ins, attrs(node), torch.float64)]


def _torch(v: np.ndarray | list) -> torch.Tensor | list:
    if isinstance(v, list):  # a sequence
        return [_torch(p) for p in v]
    if v.dtype.kind == "f":
        return torch.from_numpy(v.astype(np.float64))
    return torch.from_numpy(v.copy() if v.dtype == np.bool_ else v.astype(np.int64))


def _oracle(which: str, model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    if which == "ref":
        from onnx.reference import ReferenceEvaluator

        return ReferenceEvaluator(model).run(None, feeds)
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.intra_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def _compare(ours: np.ndarray | list, want, which: str) -> None:
    if isinstance(ours, list):  # a sequence: part by part
        assert isinstance(want, list) and len(ours) == len(want), f"{which}: {len(ours)} parts, want {want!r:.200}"
        for k, (o, w) in enumerate(zip(ours, want)):
            _compare(o, w, f"{which} part {k}")
        return
    want = np.asarray(want)
    assert ours.shape == want.shape, f"{which}: shape {ours.shape} != {want.shape}"
    if want.dtype.kind not in "fc":
        assert np.array_equal(ours.astype(want.dtype), want), f"{which}: {ours} != {want}"
        return
    want = want.astype(np.float64)
    assert np.array_equal(np.isnan(ours), np.isnan(want)), f"{which}: NaNs differ"
    finite = np.isfinite(want)
    assert np.array_equal(ours[~finite & ~np.isnan(want)], want[~finite & ~np.isnan(want)]), f"{which}: infs differ"
    if finite.any():
        scale = max(1.0, float(np.abs(want[finite]).max()))
        err = float(np.abs(ours[finite] - want[finite]).max())
        assert err <= REL * scale, f"{which}: error {err:.3g} at magnitude {scale:.3g}"


@pytest.mark.parametrize("case", CASES, ids=Case.name)
def test_op_matches_reference_and_onnxruntime(case: Case):
    rng = np.random.default_rng(zlib.crc32(case.name().encode()))
    xs = _inputs(case, rng)
    model = _model(case, xs)
    feeds = {n: v for n, v in zip(model.graph.node[0].input, xs) if n}
    ours = _ours(model, feeds)
    assert len(ours) == case.outs
    for which in case.oracles:
        wants = _oracle(which, model, feeds)
        for k, (o, w) in enumerate(zip(ours, wants, strict=True)):
            _compare(o, w, f"{which} output {k}")


def test_every_op_has_a_case():
    assert set(IMPLS) - {c.op for c in CASES} == set()


def test_op_without_a_row_runs_through_the_reference_evaluator():
    node = helper.make_node("Det", ["x"], ["y"])
    op = bind(node, 21)
    assert not op.emulated and op.why == "no implementation"
    x = torch.tensor([[2.0, 1.0], [1.0, 3.0]], dtype=torch.float64)
    (y,) = op([x], attrs(node), torch.float64)
    assert y.dtype == torch.float64 and abs(float(y) - 5.0) < 1e-5


def test_a_form_a_row_refuses_runs_through_the_reference_evaluator():
    node = helper.make_node("MaxPool", ["x"], ["y", "i"], kernel_shape=[2])
    op = bind(node, 21)
    assert not op.emulated and "Indices" in op.why
    y, i = op([torch.tensor([[[1.0, 3.0, 2.0, 0.0]]])], attrs(node), torch.float32)
    assert y.tolist() == [[[3.0, 3.0, 2.0]]] and i.tolist() == [[[1, 1, 2]]]
