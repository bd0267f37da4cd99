"""Real network topologies: the "light" ResNet-50, Inception-v2, ShuffleNet and
DenseNet-121 that ship with the onnx package (IR 3, opset 9; their weights are
ConstantOfShape fills, replaced here by random initializers of the same names)."""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from onnx import numpy_helper as nh
from onnx_testkit import compare, ops, ort_run

from bnfold.onnx import fold_onnx
from bnfold.report import Code

LIGHT = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")


def _light(name: str, seed: int = 0) -> tuple[onnx.ModelProto, dict]:
    path = os.path.join(LIGHT, f"light_{name}.onnx")
    if not os.path.exists(path):
        pytest.skip(f"the onnx package has no {path}")
    m = onnx.load(path)
    rng = np.random.default_rng(seed)
    g = m.graph
    inits = {t.name: t for t in g.initializer}
    kept = []
    for n in g.node:
        if n.op_type != "ConstantOfShape":
            kept.append(n)
            continue
        shape = [int(v) for v in nh.to_array(inits[n.input[0]])]
        if len(shape) > 1:  # a weight
            v = rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))
        else:  # statistics, scales, biases: positive keeps every variance valid
            v = rng.uniform(0.5, 2.0, shape)
        g.initializer.append(nh.from_array(v.astype(np.float32), n.output[0]))
        g.input.append(onnx.helper.make_tensor_value_info(n.output[0], onnx.TensorProto.FLOAT, shape))  # IR 3
    del g.node[:]
    g.node.extend(kept)
    softmax = [n for n in g.node if n.op_type == "Softmax"]
    if softmax:  # compare logits, not saturated probabilities
        out = softmax[0].input[0]
        g.node.remove(softmax[0])
        del g.output[:]
        g.output.append(onnx.helper.make_tensor_value_info(out, onnx.TensorProto.FLOAT, None))
        m = onnx.shape_inference.infer_shapes(m)
        g = m.graph
        typed = {v.name: v for v in g.value_info}
        if out in typed:
            g.output[0].CopyFrom(typed[out])
    init = {t.name for t in g.initializer}
    feeds = {
        i.name: rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]).astype(np.float32)
        for i in g.input
        if i.name not in init
    }
    return m, feeds


@pytest.mark.parametrize("name, n_bn", [("resnet50", 53), ("inception_v2", 69), ("shufflenet", 49)])
def test_light_models_fold_every_bn(name, n_bn):
    m, feeds = _light(name)
    assert ops(m).count("BatchNormalization") == n_bn
    r = fold_onnx(m)
    onnx.checker.check_model(r.model, full_check=True)
    assert "BatchNormalization" not in ops(r.model) and not r.report.skipped, r.report
    if name == "inception_v2":  # its BNs are followed by a Mul/Add scale layer: those fold too
        assert "Mul" not in ops(r.model) and "Add" not in ops(r.model)
    if name == "shufflenet":  # small enough for the float64 reference
        compare(m, r.model, feeds, rel=1e-4)
    else:
        (a,), (b,) = ort_run(m, feeds), ort_run(r.model, feeds)  # too big for the float64 reference
        assert np.abs(a - b).max() <= 1e-4 * np.abs(a).max()


def test_light_densenet_preactivation_bns_stay_with_reasons():
    m, feeds = _light("densenet121")
    r = fold_onnx(m)
    onnx.checker.check_model(r.model, full_check=True)
    left = ops(r.model).count("BatchNormalization")
    # each of the 59 folds takes a BN and the scale Mul and Add after it (one chain, reported by its BN)
    assert left == len(r.report.skipped) == 62 and len(r.report.folded) == 59
    assert {f.pattern for f in r.report.folded} == {"Conv+BatchNormalization+Mul+Add"}
    assert ops(r.model).count("Mul") == ops(r.model).count("Add") == ops(m).count("Mul") - 59
    # BN -> scale Mul -> Add -> Relu -> Conv: the Relu is in the way, nothing to fold into
    assert all(s.code == Code.NO_LAYER for s in r.report.skipped)
    (a,), (b,) = ort_run(m, feeds), ort_run(r.model, feeds)
    assert np.abs(a - b).max() <= 1e-4 * np.abs(a).max()
