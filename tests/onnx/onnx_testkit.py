"""Helpers for the ONNX frontend tests: a small graph builder, runs in ONNX
Runtime (no graph optimizations), the float64 reference, and the checks every
fold must pass."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ref
import onnxruntime as ort
import torch
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper as nh

from bnfold.onnx import fold_onnx

NORM_OPS = ("BatchNormalization",)


class G:
    """Build a model node by node: ``g.init(...)``, ``g.node(...)``, ``g.model(...)``."""

    def __init__(self, seed: int = 0):
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.outputs: list[str] = []
        self.feeds: dict[str, np.ndarray] = {}

    def input(self, name: str, shape, dtype=np.float32, value=None):
        self.inputs.append(h.make_tensor_value_info(name, onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), shape))
        concrete = [d if isinstance(d, int) else 2 for d in shape]
        self.feeds[name] = (self.rng.standard_normal(concrete) if value is None else np.asarray(value)).astype(dtype)
        return name

    def init(self, name: str, value, dtype=np.float32):
        self.inits.append(nh.from_array(np.asarray(value).astype(dtype), name))
        return name

    def randn(self, name: str, *shape, dtype=np.float32, scale=1.0):
        return self.init(name, self.rng.standard_normal(shape) * scale, dtype)

    def bn_stats(self, prefix: str, c: int, dtype=np.float32):
        """Distinct per-channel statistics (a wrong channel mapping shows)."""
        r = self.rng
        return [
            self.init(f"{prefix}_scale", r.uniform(-2, 2, c), dtype),
            self.init(f"{prefix}_bias", r.uniform(-1, 1, c), dtype),
            self.init(f"{prefix}_mean", r.uniform(-1, 1, c), dtype),
            self.init(f"{prefix}_var", r.uniform(0.5, 2, c), dtype),
        ]

    def node(self, op: str, inputs, outputs, name: str | None = None, **attrs):
        outputs = [outputs] if isinstance(outputs, str) else list(outputs)
        name = name or f"{op.lower()}_{len(self.nodes)}"
        self.nodes.append(h.make_node(op, list(inputs), outputs, name=name, **attrs))
        return outputs[0]

    def bn(self, x: str, c: int, name: str, out: str | None = None, dtype=np.float32, **attrs):
        stats = self.bn_stats(name, c, dtype)
        return self.node("BatchNormalization", [x, *stats], out or f"{name}_out", name=name, **attrs)

    def output(self, *names: str):
        self.outputs.extend(names)

    def model(self, opset: int = 17, ir_version: int | None = None, value_info: bool = True) -> onnx.ModelProto:
        outs = [h.make_value_info(n, onnx.TypeProto()) for n in self.outputs]
        graph = h.make_graph(self.nodes, "g", self.inputs, outs, self.inits)
        m = h.make_model(graph, opset_imports=[h.make_opsetid("", opset)])
        if ir_version is not None:
            m.ir_version = ir_version
        m = typed_outputs(m, value_info)
        untyped = [o for o in m.graph.output if not o.type.tensor_type.HasField("shape")]
        if untyped:  # shape inference could not tell: take the shapes of a reference run
            try:
                values = dict(zip(self.outputs, onnx_ref.run(m, self.feeds)))
            except (RuntimeError, KeyError):  # an invalid model, built for a negative test
                return m
            for o in untyped:
                o.type.tensor_type.elem_type = o.type.tensor_type.elem_type or TP.FLOAT
                shape = h.make_tensor_type_proto(1, list(values[o.name].shape)).tensor_type.shape
                o.type.tensor_type.shape.CopyFrom(shape)
        return m


def typed_outputs(m: onnx.ModelProto, value_info: bool = False) -> onnx.ModelProto:
    """Give graph outputs their inferred type and shape (the checker wants them);
    ``value_info`` also keeps the inferred intermediate shapes, as exporters do."""
    inferred = onnx.shape_inference.infer_shapes(m)
    known = {v.name: v for v in list(inferred.graph.value_info) + list(inferred.graph.output)}
    for o in m.graph.output:
        if o.name in known and known[o.name].type.HasField("tensor_type"):
            o.type.CopyFrom(known[o.name].type)
    if value_info:
        outs = {o.name for o in m.graph.output}
        m.graph.value_info.extend(v for v in inferred.graph.value_info if v.name not in outs)
    return m


def ort_run(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def rel_err(out, ref: torch.Tensor) -> float:
    out = torch.as_tensor(np.asarray(out, dtype=np.float64))
    assert tuple(out.shape) == tuple(ref.shape), (out.shape, ref.shape)
    assert torch.isfinite(out).all()
    return (out - ref).abs().max().item() / (ref.abs().max().item() + 1e-30)


def ops(model: onnx.ModelProto) -> list[str]:
    """Every op type in the model, subgraphs included."""
    out = []

    def walk(g):
        for n in g.node:
            out.append(n.op_type)
            for a in n.attribute:
                if a.type == onnx.AttributeProto.GRAPH:
                    walk(a.g)
                for sub in a.graphs:
                    walk(sub)

    walk(model.graph)
    return out


def check_fold(
    model: onnx.ModelProto,
    feeds: dict,
    *,
    rel: float = 2e-5,
    gone=NORM_OPS,
    folded: int | None = None,
    only=None,
    skipped: int | None = 0,
):
    """Fold ``model`` and check it: valid, normalizations gone, same outputs as
    the original in ORT, both against the float64 reference.  Returns the result."""
    before = model.SerializeToString()
    result = fold_onnx(model, only=only)
    assert model.SerializeToString() == before, "fold_onnx mutated its input"
    m = result.model
    onnx.checker.check_model(m, full_check=True)
    left = [op for op in ops(m) if op in gone]
    assert not left, f"still in the folded model: {left}\n{result.report}"
    if folded is not None:
        assert len(result.report.folded) == folded, result.report
    if skipped is not None:
        assert len(result.report.skipped) == skipped, result.report
    compare(model, m, feeds, rel=rel)
    return result


def compare(original: onnx.ModelProto, folded: onnx.ModelProto, feeds: dict, rel: float = 2e-5) -> None:
    refs = onnx_ref.run(original, feeds)
    orig = ort_run(original, feeds)
    new = ort_run(folded, feeds)
    assert len(new) == len(refs)
    for r, o, n in zip(refs, orig, new):
        e_orig, e_new = rel_err(o, r), rel_err(n, r)
        # the original in ORT validates the reference; the folded model must be as close
        assert e_orig <= rel, f"reference and ORT disagree on the original model: {e_orig:.3g}"
        assert e_new <= max(rel, 4 * e_orig), f"folded model error {e_new:.3g} (original {e_orig:.3g})"
