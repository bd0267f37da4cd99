"""ONNX: the affines of LayerNormalization / GroupNormalization / RMSNormalization fold into the layers
they feed (the normalization stays), a chain feeding several layers folds into all of them or none,
scalars fold through shape ops that lose the channel axis, ``lower_unfoldable`` rewrites the batch
norms that stay, and normalizations inside model-local functions are inlined and folded.

Every fold is checked against the float64 reference interpreter (``onnx_ref``) and ONNX Runtime."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.inliner
import onnx_ref
import pytest
import torch
from onnx import helper as h
from onnx import numpy_helper as nh
from onnx_testkit import G, compare, ops, ort_run, rel_err

from bnfold.onnx import fold_onnx
from bnfold.report import Code

AFFINE_NORMS = ("LayerNormalization", "GroupNormalization", "RMSNormalization")


def fold_checked(model: onnx.ModelProto, feeds: dict, rel: float = 2e-5, check: bool = True, **kw):
    """Fold, check the model is valid and computes what the original does (float64 reference and ORT).
    ``check``: run the ONNX checker (it rejects GroupNormalization-18, which ORT still runs)."""
    before = model.SerializeToString()
    result = fold_onnx(model, **kw)
    assert model.SerializeToString() == before, "fold_onnx mutated its input"
    if check:
        onnx.checker.check_model(result.model, full_check=True)
    compare(model, result.model, feeds, rel=rel)
    return result


def inits(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {t.name: nh.to_array(t) for t in model.graph.initializer}


def affines_left(model: onnx.ModelProto) -> list[str]:
    """The normalization nodes that still apply an affine (a scale not all ones, a bias present and not zero)."""
    values, left = inits(model), []
    for node in model.graph.node:
        if node.op_type not in AFFINE_NORMS:
            continue
        scale = values[node.input[1]]
        bias = values[node.input[2]] if len(node.input) > 2 and node.input[2] else None
        if not (scale == 1).all() or (bias is not None and (node.op_type == "LayerNormalization" or (bias != 0).any())):
            left.append(node.name)
    return left


def ln(g: G, x: str, c: int, name: str, bias: bool = True, **attrs) -> str:
    ins = [x, g.init(f"{name}_w", g.rng.uniform(0.5, 2, c))] + ([g.randn(f"{name}_b", c)] if bias else [])
    return g.node("LayerNormalization", ins, f"{name}_out", name=name, **attrs)


# --------------------------------------------------------------------------- LayerNormalization


@pytest.mark.parametrize("bias", [True, False])
def test_layer_norm_into_gemm(bias):
    g = G()
    x = g.input("x", [3, 8])
    y = ln(g, x, 8, "ln", bias=bias)
    g.output(g.node("Gemm", [y, g.randn("W", 6, 8), g.randn("C", 6)], "out", name="fc", transB=1))
    m = g.model()
    r = fold_checked(m, g.feeds)
    assert [f.pattern for f in r.report.folded] == ["LayerNormalization+Gemm"]
    assert not affines_left(r.model) and not r.report.skipped
    (node,) = [n for n in r.model.graph.node if n.op_type == "LayerNormalization"]
    assert len(node.input) == 2, "B is dropped"
    assert "ln_w" not in inits(r.model) and "ln_b" not in inits(r.model)


def test_layer_norm_fans_out_to_q_k_v_matmuls():
    """ViT-style: one LayerNorm, three projections with their bias Add; the affine goes into all three."""
    g = G()
    x = g.input("x", [2, 5, 8])
    y = ln(g, x, 8, "ln")
    outs = []
    for n in "qkv":
        mm = g.node("MatMul", [y, g.randn(f"W{n}", 8, 8)], f"mm_{n}", name=f"mm_{n}")
        outs.append(g.node("Add", [mm, g.randn(f"b{n}", 8)], n, name=f"add_{n}"))
    g.output(*outs)
    r = fold_checked(g.model(), g.feeds)
    (f,) = r.report.folded
    assert f.into == "mm_q, mm_k, mm_v" and f.side == "input"
    assert not affines_left(r.model) and not r.report.skipped
    assert ops(r.model).count("Add") == 3, "the biases stay in the projections' own Adds"


def test_layer_norm_fans_out_through_reshapes():
    """Each consumer reads the shared value through its own shape-only hop."""
    g = G()
    x = g.input("x", [2, 5, 8])
    y = ln(g, x, 8, "ln")
    outs = []
    for i in range(2):
        flat = g.node("Reshape", [y, g.init(f"shape{i}", [10, 8], np.int64)], f"flat{i}", name=f"reshape{i}")
        outs.append(g.node("Gemm", [flat, g.randn(f"W{i}", 4, 8)], f"out{i}", name=f"fc{i}", transB=1))
    g.output(*outs)
    r = fold_checked(g.model(), g.feeds)
    assert len(r.report.folded) == 1 and not affines_left(r.model)


def test_layer_norm_with_a_user_that_is_no_layer_changes_nothing():
    g = G()
    x = g.input("x", [2, 5, 8])
    y = ln(g, x, 8, "ln")
    g.output(g.node("MatMul", [y, g.randn("W", 8, 4)], "a", name="mm"), g.node("Relu", [y], "b", name="relu"))
    m = g.model()
    r = fold_checked(m, g.feeds)
    assert not r.report.folded
    (s,) = r.report.skipped
    assert s.norm == "ln" and s.code == Code.FANOUT_NOT_ALL_LAYERS, s
    assert inits(r.model).keys() == inits(m).keys()


def test_layer_norm_over_several_axes_is_not_per_channel():
    g = G()
    x = g.input("x", [2, 4, 8])
    y = g.node("LayerNormalization", [x, g.randn("w", 4, 8), g.randn("b", 4, 8)], "y", name="ln", axis=1)
    g.output(g.node("MatMul", [y, g.randn("W", 8, 3)], "out", name="mm"))
    r = fold_checked(g.model(), g.feeds)
    assert not r.report.folded
    (s,) = r.report.skipped
    assert s.code == Code.NOT_PER_CHANNEL, s


def test_layer_norm_whose_statistics_are_used_stays():
    g = G()
    x = g.input("x", [3, 8])
    y = g.node("LayerNormalization", [x, g.randn("w", 8), g.randn("b", 8)], ["y", "mean"], name="ln")
    g.output(g.node("Gemm", [y, g.randn("W", 4, 8)], "out", name="fc", transB=1), "mean")
    r = fold_checked(g.model(), g.feeds)
    assert not r.report.folded
    assert r.report.skipped[0].code == Code.STATISTICS_USED


def test_layer_norm_after_a_layer_is_not_folded_backwards():
    """A LayerNorm's affine acts after its normalization: it never goes into the layer before it."""
    g = G()
    x = g.input("x", [3, 8])
    y = g.node("Gemm", [x, g.randn("W0", 8, 8)], "h", name="fc0", transB=1)
    g.output(ln(g, y, 8, "ln"))
    r = fold_checked(g.model(), g.feeds)
    assert not r.report.folded and affines_left(r.model) == ["ln"]
    assert len(r.report.skipped) == 1 and r.report.skipped[0].norm == "ln"


def test_decomposed_layer_norm_folds_its_mul_add_into_both_users():
    """What exporters emit without LayerNormalization: ReduceMean/Sub/Pow/Sqrt/Div, then Mul and Add by
    constants, which are binary steps; fan-out folds them into both layers."""
    g = G()
    x = g.input("x", [2, 5, 8])
    mean = g.node("ReduceMean", [x], "mean", name="mean", axes=[-1])
    d = g.node("Sub", [x, mean], "d", name="sub")
    var = g.node("ReduceMean", [g.node("Pow", [d, g.init("two", 2.0)], "sq", name="pow")], "var", name="var", axes=[-1])
    std = g.node("Sqrt", [g.node("Add", [var, g.init("eps", 1e-5)], "ve", name="add_eps")], "std", name="sqrt")
    n = g.node("Div", [d, std], "n", name="div")
    a = g.node(
        "Add",
        [g.node("Mul", [n, g.randn("gamma", 8)], "scaled", name="mul_gamma"), g.randn("beta", 8)],
        "ln",
        name="add_beta",
    )
    g.output(
        g.node("MatMul", [a, g.randn("W1", 8, 4)], "o1", name="mm1"),
        g.node("MatMul", [a, g.randn("W2", 8, 6)], "o2", name="mm2"),
    )
    r = fold_checked(g.model(), g.feeds)
    (f,) = r.report.folded
    assert f.into == "mm1, mm2" and f.pattern == "Mul+Add+MatMul"
    assert "mul_gamma" not in [n.name for n in r.model.graph.node]
    assert "gamma" not in inits(r.model) and "beta" not in inits(r.model)


# --------------------------------------------------------------------------- GroupNormalization, RMSNormalization


def group_norm(g: G, x: str, c: int, groups: int, per: int) -> str:
    return g.node(
        "GroupNormalization",
        [x, g.init("gn_s", g.rng.uniform(0.5, 2, per)), g.randn("gn_b", per)],
        "gn_out",
        name="gn",
        num_groups=groups,
    )


def test_group_norm_into_pointwise_conv():
    g = G()
    x = g.input("x", [2, 8, 5, 5])
    y = group_norm(g, x, 8, 4, 8)
    g.output(g.node("Conv", [y, g.randn("W", 6, 8, 1, 1), g.randn("B", 6)], "out", name="conv"))
    r = fold_checked(g.model(opset=21), g.feeds)
    assert [f.pattern for f in r.report.folded] == ["GroupNormalization+Conv"]
    assert not affines_left(r.model) and not r.report.skipped
    (node,) = [n for n in r.model.graph.node if n.op_type == "GroupNormalization"]
    assert len(node.input) == 3 and (inits(r.model)[node.input[2]] == 0).all(), "its required bias is zeros"


def test_group_norm_shift_meets_a_padded_conv():
    g = G()
    x = g.input("x", [2, 8, 5, 5])
    y = group_norm(g, x, 8, 4, 8)
    g.output(g.node("Conv", [y, g.randn("W", 6, 8, 3, 3)], "out", name="conv", pads=[1, 1, 1, 1]))
    m = g.model(opset=21)
    r = fold_checked(m, g.feeds)
    assert not r.report.folded and affines_left(r.model) == ["gn"]
    (s,) = r.report.skipped
    assert s.code == Code.SHIFT_PADDING, s


def test_group_norm_18_per_group_affine_is_not_per_channel():
    g = G()
    x = g.input("x", [2, 8, 5, 5])
    y = group_norm(g, x, 8, 4, 4)
    g.output(g.node("Conv", [y, g.randn("W", 6, 8, 1, 1)], "out", name="conv"))
    r = fold_checked(g.model(opset=18), g.feeds, check=False)
    assert not r.report.folded
    (s,) = r.report.skipped
    assert s.code == Code.NOT_PER_CHANNEL, s


def test_group_norm_18_with_one_channel_per_group_folds():
    g = G()
    x = g.input("x", [2, 4, 5, 5])
    y = group_norm(g, x, 4, 4, 4)
    g.output(g.node("Conv", [y, g.randn("W", 6, 4, 1, 1)], "out", name="conv"))
    r = fold_checked(g.model(opset=18), g.feeds, check=False)
    assert len(r.report.folded) == 1 and not affines_left(r.model)


@pytest.mark.skipif(
    "RMSNormalization" not in {s.name for s in onnx.defs.get_all_schemas()}, reason="this onnx has no RMSNormalization"
)
def test_rms_norm_into_matmul():
    g = G()
    x = g.input("x", [2, 5, 8])
    y = g.node("RMSNormalization", [x, g.init("rms_w", g.rng.uniform(0.5, 2, 8))], "y", name="rms")
    g.output(g.node("MatMul", [y, g.randn("W", 8, 4)], "out", name="mm"))
    r = fold_checked(g.model(opset=23), g.feeds)
    assert [f.pattern for f in r.report.folded] == ["RMSNormalization+MatMul"]
    assert not affines_left(r.model)


# --------------------------------------------------------------------------- fan-out of a batch norm, scalars


def test_bn_into_two_convs_one_padded_changes_nothing():
    g = G()
    x = g.input("x", [2, 4, 6, 6])
    y = g.bn(x, 4, "bn")
    g.output(
        g.node("Conv", [y, g.randn("W1", 6, 4, 1, 1)], "a", name="conv1"),
        g.node("Conv", [y, g.randn("W2", 6, 4, 3, 3)], "b", name="conv2", pads=[1, 1, 1, 1]),
    )
    m = g.model()
    r = fold_checked(m, g.feeds)
    assert not r.report.folded and ops(r.model).count("BatchNormalization") == 1
    (s,) = r.report.skipped
    assert s.code == Code.SHIFT_PADDING, s
    assert inits(r.model).keys() == inits(m).keys()


def test_bn_into_two_unpadded_convs_folds_into_both():
    g = G()
    x = g.input("x", [2, 4, 6, 6])
    y = g.bn(x, 4, "bn")
    g.output(
        g.node("Conv", [y, g.randn("W1", 6, 4, 1, 1)], "a", name="conv1"),
        g.node("Conv", [y, g.randn("W2", 6, 4, 3, 3)], "b", name="conv2"),
    )
    r = fold_checked(g.model(), g.feeds)
    assert r.report.folded[0].into == "conv1, conv2" and "BatchNormalization" not in ops(r.model)


def test_scalar_folds_through_a_flattening_reshape():
    g = G()
    x = g.input("x", [2, 3, 4])
    y = g.node("Mul", [x, g.init("half", 0.5)], "y", name="mul")
    flat = g.node("Reshape", [y, g.init("shape", [2, 12], np.int64)], "flat", name="reshape")
    g.output(g.node("Gemm", [flat, g.randn("W", 5, 12), g.randn("C", 5)], "out", name="fc", transB=1))
    r = fold_checked(g.model(), g.feeds)
    assert [f.pattern for f in r.report.folded] == ["Mul+Reshape+Gemm"]
    assert "Mul" not in ops(r.model)


def test_per_channel_constant_through_a_flattening_reshape_stays():
    """Only a scalar passes a hop that loses the channel axis (the engine ends the chain there, unreported)."""
    g = G()
    x = g.input("x", [2, 3, 4])
    y = g.node("Mul", [x, g.randn("s", 4)], "y", name="mul")
    flat = g.node("Reshape", [y, g.init("shape", [2, 12], np.int64)], "flat", name="reshape")
    g.output(g.node("Gemm", [flat, g.randn("W", 5, 12)], "out", name="fc", transB=1))
    m = g.model()
    r = fold_checked(m, g.feeds)
    assert not r.report.folded and ops(r.model) == ops(m) and inits(r.model).keys() == inits(m).keys()


# --------------------------------------------------------------------------- lowering


def test_lower_unfoldable_densenet_bn_relu_conv():
    g = G()
    x = g.input("x", [2, 4, 6, 6])
    y = g.node("Relu", [g.bn(x, 4, "bn")], "r", name="relu")
    g.output(g.node("Conv", [y, g.randn("W", 6, 4, 3, 3)], "out", name="conv", pads=[1, 1, 1, 1]))
    m = g.model()
    plain = fold_onnx(m)
    assert "BatchNormalization" in ops(plain.model) and not plain.report.lowered
    r = fold_checked(m, g.feeds, lower_unfoldable=True)
    assert "BatchNormalization" not in ops(r.model)
    assert ops(r.model)[:3] == ["Mul", "Add", "Relu"]
    (low,) = r.report.lowered
    assert low.norm == "bn" and low.reason and low.code == Code.NO_LAYER
    assert r.report.skipped == [] or all(s.norm != "bn" for s in r.report.skipped)


def test_lowered_bn_keeps_a_graph_output_name():
    g = G()
    x = g.input("x", [2, 4, 6, 6])
    y = g.bn(x, 4, "bn", out="y")
    g.output(y)
    r = fold_checked(g.model(), g.feeds, lower_unfoldable=True)
    assert [o.name for o in r.model.graph.output] == ["y"] and ops(r.model) == ["Mul", "Add"]


# --------------------------------------------------------------------------- model-local functions


def _with_function(opset: int = 18) -> tuple[onnx.ModelProto, dict]:
    """main: x -> Block(x) -> Relu, where the local function Block is Conv -> BatchNormalization."""
    g = G()
    rng = g.rng
    w = nh.from_array(rng.standard_normal((4, 3, 1, 1)).astype(np.float32))
    stats = [rng.uniform(-1, 1, 4).astype(np.float32) for _ in range(3)] + [rng.uniform(0.5, 2, 4).astype(np.float32)]
    consts = [h.make_node("Constant", [], ["w"], value=w)]
    consts += [h.make_node("Constant", [], [f"s{i}"], value=nh.from_array(v)) for i, v in enumerate(stats)]
    body = consts + [
        h.make_node("Conv", ["x", "w"], ["c"], name="conv"),
        h.make_node("BatchNormalization", ["c", "s0", "s1", "s2", "s3"], ["y"], name="bn"),
    ]
    fn = h.make_function("local", "Block", ["x"], ["y"], body, [h.make_opsetid("", opset)])
    x = g.input("x", [2, 3, 5, 5])
    g.nodes.append(h.make_node("Block", [x], ["b"], name="block", domain="local"))
    g.output(g.node("Relu", ["b"], "out", name="relu"))
    out = h.make_tensor_value_info("out", onnx.TensorProto.FLOAT, [2, 4, 5, 5])
    graph = h.make_graph(g.nodes, "g", g.inputs, [out])
    m = h.make_model(graph, opset_imports=[h.make_opsetid("", opset), h.make_opsetid("local", 1)], functions=[fn])
    return m, g.feeds


def test_local_function_is_inlined_and_folded():
    m, feeds = _with_function()
    r = fold_onnx(m)
    onnx.checker.check_model(r.model, full_check=True)
    assert r.report.notes == [
        "inlined the model-local function local::Block to fold inside it (called by "
        "'block'; its nodes are renamed by the inliner)"
    ]
    assert [f.pattern for f in r.report.folded] == ["Conv+BatchNormalization"] and not r.report.skipped
    assert "BatchNormalization" not in ops(r.model) and "Block" not in ops(r.model)
    ref = ort_run(m, feeds)[0]
    inlined = onnx.inliner.inline_local_functions(m)  # the float64 reference reads plain graphs
    expected = onnx_ref.run(inlined, feeds)[0]
    new = ort_run(r.model, feeds)[0]
    assert rel_err(ref, expected) < 2e-6 and rel_err(new, expected) < 2e-6


def test_uncalled_local_function_is_reported():
    m, feeds = _with_function()
    del m.graph.node[:]
    m.graph.node.append(h.make_node("Relu", ["x"], ["out"], name="relu"))
    r = fold_onnx(m)
    assert not r.report.notes and not r.report.folded
    (s,) = r.report.skipped
    assert s.norm == "bn" and s.code == Code.IN_FUNCTION


# --------------------------------------------------------------------------- exported transformer blocks


class _Block(torch.nn.Module):
    """A ``TransformerEncoderLayer`` called with ``is_causal=False`` (the TorchScript exporter otherwise
    traces ``is_causal`` as a tensor and fails)."""

    def __init__(self, layer: torch.nn.Module):
        super().__init__()
        self.layer = layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x, is_causal=False)


def _encoder_layer() -> torch.nn.Module:
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(16, 2, dim_feedforward=32, dropout=0.0, batch_first=True, norm_first=True)
    with torch.no_grad():  # affines far from the identity, so a fold that drops one shows
        for norm in (layer.norm1, layer.norm2):
            norm.weight.uniform_(0.5, 2)
            norm.bias.uniform_(-1, 1)
    return _Block(layer).eval()


@pytest.mark.parametrize("dynamo", [False, True])
def test_exported_pre_norm_transformer_block(tmp_path, dynamo):
    layer = _encoder_layer()
    x = torch.randn(2, 7, 16)
    path = tmp_path / "block.onnx"
    kwargs = {"dynamo": True, "optimize": False} if dynamo else {"dynamo": False}
    torch.onnx.export(layer, (x,), str(path), input_names=["x"], output_names=["y"], opset_version=18, **kwargs)
    m = onnx.load(str(path))
    r = fold_onnx(m)
    onnx.checker.check_model(r.model, full_check=True)
    assert not affines_left(r.model), r.report.table()
    assert len(r.report.folded) == 2, r.report.table()
    with torch.no_grad():
        expected = layer.double()(x.double()).numpy()
    feeds = {"x": x.numpy()}
    before, after = ort_run(m, feeds)[0], ort_run(r.model, feeds)[0]
    ref = torch.from_numpy(expected)
    assert rel_err(before, ref) < 1e-5 and rel_err(after, ref) < 1e-5


class _VitAttention(torch.nn.Module):
    """A ViT-style pre-norm attention block: one LayerNorm feeding separate q, k and v projections."""

    def __init__(self, dim: int = 16, heads: int = 2):
        super().__init__()
        self.heads = heads
        self.norm = torch.nn.LayerNorm(dim)
        self.q, self.k, self.v = (torch.nn.Linear(dim, dim) for _ in range(3))
        self.proj = torch.nn.Linear(dim, dim)
        with torch.no_grad():
            self.norm.weight.uniform_(0.5, 2)
            self.norm.bias.uniform_(-1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        y = self.norm(x)
        q, k, v = (p(y).reshape(b, n, self.heads, d // self.heads).transpose(1, 2) for p in (self.q, self.k, self.v))
        att = torch.softmax(q @ k.transpose(-1, -2) / (d // self.heads) ** 0.5, dim=-1)
        return x + self.proj((att @ v).transpose(1, 2).reshape(b, n, d))


@pytest.mark.parametrize("dynamo", [False, True])
def test_exported_vit_attention_folds_its_layer_norm_into_q_k_v(tmp_path, dynamo):
    torch.manual_seed(0)
    block = _VitAttention().eval()
    x = torch.randn(2, 7, 16)
    path = tmp_path / "vit.onnx"
    kwargs = {"dynamo": True, "optimize": False} if dynamo else {"dynamo": False}
    torch.onnx.export(block, (x,), str(path), input_names=["x"], output_names=["y"], opset_version=18, **kwargs)
    m = onnx.load(str(path))
    r = fold_onnx(m)
    onnx.checker.check_model(r.model, full_check=True)
    (f,) = r.report.folded
    assert len(f.into.split(", ")) == 3 and not affines_left(r.model) and not r.report.skipped
    with torch.no_grad():
        ref = block.double()(x.double())
    feeds = {"x": x.numpy()}
    assert rel_err(ort_run(m, feeds)[0], ref) < 1e-5 and rel_err(ort_run(r.model, feeds)[0], ref) < 1e-5


def test_lowering_before_opset_7_broadcasts_explicitly():
    """Mul and Add broadcast only with ``broadcast=1`` before opset 7 (the checker insists; ORT runs
    neither BatchNormalization-6 nor Mul-6, so only the reference compares the numbers)."""
    g = G()
    x = g.input("x", [2, 4, 3, 3])
    g.output(g.node("Relu", [g.bn(x, 4, "bn", is_test=1)], "r", name="relu"))
    m = g.model(opset=6)
    r = fold_onnx(m, lower_unfoldable=True)
    onnx.checker.check_model(r.model, full_check=True)
    assert ops(r.model) == ["Mul", "Add", "Relu"] and len(r.report.lowered) == 1
    assert all(a.name == "broadcast" and a.i == 1 for n in r.model.graph.node[:2] for a in n.attribute)
    run = onnx_ref.run
    assert rel_err(run(r.model, g.feeds)[0], run(m, g.feeds)[0]) < 1e-6


def test_layer_norm_then_scalar_mul_folds_both():
    g = G()
    x = g.input("x", [2, 5, 8])
    y = g.node("Mul", [ln(g, x, 8, "ln"), g.init("s", 0.3)], "z", name="mul")
    g.output(g.node("MatMul", [y, g.randn("W", 8, 4)], "o", name="mm"))
    r = fold_checked(g.model(), g.feeds)
    assert [f.pattern for f in r.report.folded] == ["LayerNormalization+Mul+MatMul"]
    assert ops(r.model) == ["LayerNormalization", "MatMul", "Add"] and not affines_left(r.model)


def test_float16_layer_norm_gets_float16_ones():
    g = G()
    x = g.input("x", [2, 5, 8], dtype=np.float16)
    y = g.node(
        "LayerNormalization",
        [x, g.init("w", g.rng.uniform(0.5, 2, 8), np.float16), g.randn("b", 8, dtype=np.float16)],
        "y",
        name="ln",
    )
    g.output(g.node("MatMul", [y, g.randn("W", 8, 4, dtype=np.float16)], "o", name="mm"))
    r = fold_checked(g.model(), g.feeds, rel=2e-3)
    assert len(r.report.folded) == 1 and not affines_left(r.model)
    assert {t.data_type for t in r.model.graph.initializer} == {onnx.TensorProto.FLOAT16}
