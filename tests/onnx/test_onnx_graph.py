"""What a fold keeps and what it removes: Constant-node parameters, shared
weights, subgraphs, names, metadata, opsets and leftover constants."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto
from onnx import helper as h
from onnx_testkit import G, check_fold, compare, ops

from bnfold.onnx import fold_onnx


def _const(g: G, name: str, value=None, kind: str = "value", dtype=np.float32):
    if kind == "value":
        return g.node(
            "Constant",
            [],
            name,
            name=f"{name}_const",
            value=onnx.numpy_helper.from_array(np.asarray(value, dtype=dtype), name),
        )
    if kind == "value_floats":
        return g.node("Constant", [], name, name=f"{name}_const", value_floats=[float(v) for v in value])
    return g.node("Constant", [], name, name=f"{name}_const", value_float=float(value))


@pytest.mark.parametrize("kind", ["value", "value_floats"])
def test_constant_node_parameters(kind):
    g = G(seed=1)
    x = g.input("x", [2, 3, 5, 5])
    w = _const(g, "W", g.rng.standard_normal((4, 3, 3, 3)))
    y = g.node("Conv", [x, w], "c", name="conv")
    r = g.rng
    stats = [
        _const(g, f"bn_{n}", v, kind)
        for n, v in (
            ("s", r.uniform(-2, 2, 4)),
            ("b", r.uniform(-1, 1, 4)),
            ("m", r.uniform(-1, 1, 4)),
            ("v", r.uniform(0.5, 2, 4)),
        )
    ]
    g.output(g.node("BatchNormalization", [y, *stats], "y", name="bn"))
    res = check_fold(g.model(), g.feeds, folded=1)
    m = res.model
    assert ops(m) == ["Conv"]  # every Constant node left without users is gone
    inits = {t.name: t for t in m.graph.initializer}
    assert set(inits) == {"W", "conv_bias"} and {t.data_type for t in inits.values()} == {TensorProto.FLOAT}
    assert list(m.graph.node[0].input) == ["x", "W", "conv_bias"]


def test_value_float_scalar_affine_and_gemm_c():
    g = G(seed=2)
    x = g.input("x", [3, 5])
    y = g.node("Gemm", [x, g.randn("B", 5, 4), _const(g, "C", 0.25, "value_float")], "gm", name="gemm", beta=2.0)
    y = g.node("Mul", [y, _const(g, "k", 1.5, "value_float")], "m", name="mul")
    g.output(g.bn(y, 4, "bn", out="y"))
    res = check_fold(g.model(), g.feeds, folded=1, gone=("BatchNormalization", "Mul", "Constant"))
    assert res.report.folded[0].pattern == "Gemm+Mul+BatchNormalization"  # one chain, reported by the BN
    c = next(t for t in res.model.graph.initializer if t.name == "C")
    assert list(c.dims) == [4]  # the scalar C became a per-channel bias under its own name


def test_shared_weight_gets_private_copies():
    g = G()
    x = g.input("x", [2, 3, 5, 5])
    w = g.randn("W", 4, 3, 3, 3)
    a = g.bn(g.node("Conv", [x, w], "a", name="conv_a"), 4, "bn_a")
    b = g.bn(g.node("Conv", [x, w], "b", name="conv_b"), 4, "bn_b")
    c = g.node("Conv", [x, w], "c", name="conv_c")  # no BN: keeps the original weight
    g.output(a, b, c)
    res = check_fold(g.model(), g.feeds, folded=2)
    f_a, f_b = res.report.folded
    assert f_a.extra_bytes == 4 * 3 * 3 * 3 * 4 and f_b.extra_bytes == 4 * 3 * 3 * 3 * 4
    assert res.report.extra_bytes == 2 * 432
    weights = {n.name: n.input[1] for n in res.model.graph.node}
    assert weights == {"conv_a": "W_folded_conv_a", "conv_b": "W_folded_conv_b", "conv_c": "W"}


def test_shared_weight_last_user_reuses_the_original():
    g = G()
    x = g.input("x", [2, 3, 5, 5])
    w = g.randn("W", 4, 3, 3, 3)
    a = g.bn(g.node("Conv", [x, w], "a", name="conv_a"), 4, "bn_a")
    b = g.bn(g.node("Conv", [x, w], "b", name="conv_b"), 4, "bn_b")
    g.output(a, b)
    res = check_fold(g.model(), g.feeds, folded=2)
    assert [f.extra_bytes for f in res.report.folded] == [432, 0]
    weights = {n.name: n.input[1] for n in res.model.graph.node}
    assert weights == {"conv_a": "W_folded_conv_a", "conv_b": "W"}
    assert sorted(t.name for t in res.model.graph.initializer) == ["W", "W_folded_conv_a", "conv_a_bias", "conv_b_bias"]


def test_exporter_aliases_of_one_constant():
    """TorchScript exports alias equal tensors with Identity nodes: the Conv's bias and
    the BN's mean share one zeros initializer.  The fold keeps no dead alias and
    reports no private copy."""
    g = G()
    x = g.input("x", [2, 3, 5, 5])
    zeros = g.init("zeros", np.zeros(4))
    y = g.node("Conv", [x, g.randn("W", 4, 3, 3, 3), zeros], "c", name="conv")
    mean = g.node("Identity", [zeros], "bn.running_mean", name="alias")
    s, b, v = (g.init(n, g.rng.uniform(0.5, 2, 4)) for n in ("bn_scale", "bn_bias", "bn_var"))
    g.output(g.node("BatchNormalization", [y, s, b, mean, v], "y", name="bn"))
    res = check_fold(g.model(), g.feeds, folded=1)
    assert res.report.folded[0].extra_bytes == 0
    assert ops(res.model) == ["Conv"] and list(res.model.graph.node[0].input) == ["x", "W", "zeros"]
    assert sorted(t.name for t in res.model.graph.initializer) == ["W", "zeros"]


def test_weights_computed_from_constants():
    """Exporters compute some parameters: a transposed Linear weight, a zero bias from
    Shape/Expand/CastLike (dynamo, optimize=False), a ConstantOfShape fill.  They fold,
    and the nodes that computed them go."""
    g = G(seed=4)
    x = g.input("x", [3, 5])
    wt = g.node("Transpose", [g.randn("fc.weight", 6, 5)], "wt", name="wt", perm=[1, 0])
    y = g.node("MatMul", [x, wt], "mm", name="fc")
    shape = g.node("Shape", ["fc.weight"], "shp", name="shape", start=0, end=1)
    zero = g.node("CastLike", [_const(g, "zero", 0.0, "value_float"), x], "zero_t", name="castlike")
    bias = g.node("Expand", [zero, shape], "bias", name="expand")
    y = g.node("Add", [y, bias], "fc_out", name="fc_bias")
    filled = g.node(
        "ConstantOfShape",
        [g.init("c6", np.array([6]), np.int64)],
        "gamma",
        name="fill",
        value=onnx.numpy_helper.from_array(np.array([1.5], np.float32)),
    )
    s, v = g.init("bn_s", g.rng.uniform(-2, 2, 6)), g.init("bn_v", g.rng.uniform(0.5, 2, 6))
    y = g.node("Mul", [y, filled], "scaled", name="mul")
    g.output(g.node("BatchNormalization", [y, s, g.randn("bn_b", 6), g.randn("bn_m", 6), v], "y", name="bn"))
    res = check_fold(g.model(), g.feeds, folded=1, gone=("BatchNormalization", "Mul"))
    assert res.report.folded[0].pattern == "MatMul+Mul+BatchNormalization"  # one chain, reported by the BN
    assert ops(res.model) == ["MatMul", "Add"]
    assert sorted(t.name for t in res.model.graph.initializer) == ["bias", "wt"]


def _branch(name: str, c: int, seed: int, outer_w: str | None = None):
    """A subgraph Conv -> BN reading the outer ``x`` (and maybe an outer weight)."""
    g = G(seed=seed)
    w = outer_w or g.randn(f"{name}_W", c, 3, 3, 3)
    y = g.node("Conv", ["x", w], f"{name}_c", name=f"{name}_conv")
    y = g.bn(y, c, f"{name}_bn", out=f"{name}_y")
    return h.make_graph(g.nodes, name, [], [h.make_tensor_value_info(y, TensorProto.FLOAT, [2, c, 3, 3])], g.inits)


@pytest.mark.parametrize("cond", [True, False])
def test_fold_inside_if_branches(cond):
    g = G()
    g.input("x", [2, 3, 5, 5])
    flag = g.input("cond", [], dtype=np.bool_, value=cond)
    w_outer = g.randn("W_outer", 4, 3, 3, 3)
    then_b = _branch("then", 4, 1)
    else_b = _branch("else", 4, 2, outer_w=w_outer)
    g.output(g.node("If", [flag], "y", name="if", then_branch=then_b, else_branch=else_b))
    res = check_fold(g.model(), g.feeds, folded=2)
    assert {f.norm for f in res.report.folded} == {"then_bn", "else_bn"}
    if_node = res.model.graph.node[0]
    branches = {a.name: a.g for a in if_node.attribute}
    assert [n.op_type for n in branches["then_branch"].node] == ["Conv"]
    assert branches["else_branch"].node[0].input[1] == "W_outer_folded_else_conv"  # private copy in the branch
    assert [t.name for t in res.model.graph.initializer] == []  # the outer weight has no user left


def test_fold_inside_loop_body():
    g = G()
    x = g.input("x", [2, 4])
    body = G(seed=3)
    y = body.node("Gemm", ["v_in", body.randn("Wl", 4, 4)], "gm", name="gemm", transB=1)
    y = body.bn(y, 4, "loop_bn", out="v_out")
    body.node("Identity", ["cond_in"], "cond_out", name="cond_id")
    graph = h.make_graph(
        body.nodes,
        "body",
        [
            h.make_tensor_value_info("i", TensorProto.INT64, []),
            h.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            h.make_tensor_value_info("v_in", TensorProto.FLOAT, [2, 4]),
        ],
        [
            h.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            h.make_tensor_value_info("v_out", TensorProto.FLOAT, [2, 4]),
        ],
        body.inits,
    )
    trips = g.init("trips", np.array(3), np.int64)
    g.output(g.node("Loop", [trips, "", x], "y", name="loop", body=graph))
    res = check_fold(g.model(), g.feeds, folded=1)
    assert res.report.folded[0].into == "gemm"


def test_names_metadata_opsets_and_io_kept():
    g = G()
    x = g.input("x", ["N", 3, 5, 5])
    y = g.node("Conv", [x, g.randn("W", 4, 3, 3, 3)], "c", name="conv")
    y = g.node("Relu", [g.bn(y, 4, "bn")], "r", name="relu")
    y = g.node("Conv", [y, g.randn("W2", 4, 4, 1, 1)], "c2", name="conv2")
    g.output(g.node("Sigmoid", [g.bn(y, 4, "bn2")], "y", name="sig"), "r")
    g.init("unrelated", np.ones(3))  # unused before the fold: not the fold's to remove
    m = g.model(opset=17)
    m.opset_import.append(h.make_opsetid("com.example", 1))
    m.producer_name, m.producer_version, m.doc_string, m.model_version = "tests", "9.9", "a doc", 7
    h.set_model_props(m, {"author": "bnfold tests", "license": "none"})
    m.graph.doc_string = "graph doc"
    m.graph.node[0].doc_string = "conv doc"
    res = check_fold(m, g.feeds, folded=2)
    f = res.model
    assert [(o.domain, o.version) for o in f.opset_import] == [("", 17), ("com.example", 1)]
    assert (f.producer_name, f.producer_version, f.doc_string, f.model_version) == ("tests", "9.9", "a doc", 7)
    assert {p.key: p.value for p in f.metadata_props} == {"author": "bnfold tests", "license": "none"}
    assert f.graph.doc_string == "graph doc" and f.graph.node[0].doc_string == "conv doc"
    assert f.graph.input == m.graph.input and f.graph.output == m.graph.output
    assert [(n.name, list(n.output)) for n in f.graph.node] == [
        ("conv", ["bn_out"]),
        ("relu", ["r"]),
        ("conv2", ["bn2_out"]),
        ("sig", ["y"]),
    ]
    assert sorted(t.name for t in f.graph.initializer) == ["W", "W2", "conv2_bias", "conv_bias", "unrelated"]
    defined = {o for n in f.graph.node for o in n.output} | {i.name for i in f.graph.input}
    assert {v.name for v in f.graph.value_info} <= defined  # no value_info of values that are gone
    assert {v.name for v in f.graph.value_info} == {"bn_out", "bn2_out"}


def test_ir_version_3_initializers_as_inputs():
    g = G()
    x = g.input("x", [2, 3, 5, 5])
    y = g.node("Conv", [x, g.randn("W", 4, 3, 3, 3)], "c", name="conv")
    g.output(g.bn(y, 4, "bn", out="y"))
    m = g.model(opset=8, ir_version=3)
    for t in m.graph.initializer:
        m.graph.input.append(h.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    res = fold_onnx(m)
    assert len(res.report.folded) == 1
    onnx.checker.check_model(res.model, full_check=True)
    inputs = {i.name for i in res.model.graph.input}
    assert {t.name for t in res.model.graph.initializer} <= inputs  # IR 3: every initializer is an input
    compare(m, res.model, g.feeds)


def test_no_norms_model_is_returned_unchanged():
    g = G()
    x = g.input("x", [2, 3, 5, 5])
    g.output(g.node("Relu", [g.node("Conv", [x, g.randn("W", 4, 3, 3, 3)], "c", name="conv")], "y", name="relu"))
    m = g.model()
    res = fold_onnx(m)
    assert res.model is not m and res.model.SerializeToString() == m.SerializeToString()
    assert res.report.to_dict()["summary"] == {"folded": 0, "skipped": 0, "lowered": 0, "merged": 0, "extra_bytes": 0}


def test_fold_via_bnfold_fold():
    import bnfold

    g = G()
    x = g.input("x", [2, 3, 5, 5])
    g.output(g.bn(g.node("Conv", [x, g.randn("W", 4, 3, 3, 3)], "c", name="conv"), 4, "bn", out="y"))
    res = bnfold.fold(g.model())
    assert isinstance(res.model, onnx.ModelProto) and len(res.report.folded) == 1
    assert not bnfold.fold(g.model(), only={"linear"}).report.folded


def test_shape_reader_of_a_folded_value_follows_its_name():
    """The conv's output is also read by a Shape node; the BN's output is a graph output.  The conv
    takes the BN's output name and the Shape reads it (same shape)."""
    g = G()
    x = g.input("x", [2, 3, 5, 5])
    c = g.node("Conv", [x, g.randn("W", 4, 3, 3, 3)], "c", name="conv")
    g.output(g.bn(c, 4, "bn", out="y"), g.node("Shape", [c], "shape", name="shape"))
    res = check_fold(g.model(), g.feeds, folded=1)
    assert [(n.name, list(n.output)) for n in res.model.graph.node] == [("conv", ["y"]), ("shape", ["shape"])]
    assert list(res.model.graph.node[1].input) == ["y"]


def test_matmul_weight_broadcast_by_a_shared_expand():
    """Two MatMuls read one Expand of a 2-D weight (a linear over a batch, as bmm exports); a scale folds
    into the first through a private Expand of a private weight, the second keeps the originals."""
    g = G()
    x = g.input("x", [2, 3, 5])
    w = g.node("Expand", [g.randn("W", 5, 6), g.init("shape", np.array([2, 5, 6]), np.int64)], "we", name="expand")
    a = g.node("MatMul", [x, w], "a", name="mm_a")
    g.output(g.node("Mul", [a, g.randn("s", 6)], "ya", name="mul"), g.node("MatMul", [x, w], "yb", name="mm_b"))
    res = check_fold(g.model(), g.feeds, folded=1, gone=("Mul",))
    assert res.report.folded[0].extra_bytes == 5 * 6 * 4
    expands = {n.output[0]: list(n.input) for n in res.model.graph.node if n.op_type == "Expand"}
    reads = {n.name: n.input[1] for n in res.model.graph.node if n.op_type == "MatMul"}
    assert reads["mm_b"] == "we" and expands["we"][0] == "W"
    assert expands[reads["mm_a"]][0] == "W_folded_mm_a"
