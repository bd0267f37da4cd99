"""The ONNX constant evaluator (``bnfold.onnx.consts``): the arithmetic of a weight computed in the
graph against torch in float64, its metering, and how the index decides what is no constant."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from onnx import helper as h
from onnx_testkit import G, check_fold

from bnfold.io.cost import NODE_FLOPS, Budget, WorkError
from bnfold.io.meter import WorkMeter
from bnfold.onnx.const_eval import ConstantEvaluator
from bnfold.onnx.consts import evaluate, result_bytes
from bnfold.onnx.index import ModelIndex, Tracker
from bnfold.report import Code

RNG = np.random.default_rng(0)


def _node(op, n_inputs, **attrs):
    return h.make_node(op, [f"i{k}" for k in range(n_inputs)], ["y"], name=op.lower(), **attrs)


def _t(a) -> torch.Tensor:
    return torch.from_numpy(np.asarray(a, dtype=np.float64))


def _same(value, expected: torch.Tensor, dtype) -> None:
    """``value`` is the float64 ``expected`` cast once to ``dtype``."""
    assert value is not None and value.dtype == np.dtype(dtype), value
    np.testing.assert_array_equal(value, expected.numpy().astype(dtype))


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div"])
def test_binary_floats_in_float64_with_broadcast(op, dtype):
    a, b = RNG.standard_normal((2, 3, 1)).astype(dtype), RNG.uniform(0.5, 2, (4,)).astype(dtype)
    ref = {"Add": torch.add, "Sub": torch.sub, "Mul": torch.mul, "Div": torch.div}[op](_t(a), _t(b))
    _same(evaluate(_node(op, 2), [a, b]), ref, dtype)


def test_binary_integers_keep_numpy_integer_arithmetic():
    a, b = np.array([7, -7, 3], np.int64), np.array([2, 2, -4], np.int64)
    assert evaluate(_node("Add", 2), [a, b]).tolist() == [9, -5, -1]
    assert evaluate(_node("Sub", 2), [a, b]).tolist() == [5, -9, 7]
    assert evaluate(_node("Mul", 2), [a, b]).dtype == np.int64
    assert evaluate(_node("Mul", 2), [a.astype(np.int32), b.astype(np.int32)]).tolist() == [14, -14, -12]
    assert evaluate(_node("Div", 2), [a, b]) is None  # ONNX truncates, numpy floors: not computed here


def test_binary_refusals():
    f32, f64 = np.ones(3, np.float32), np.ones(3, np.float64)
    assert evaluate(_node("Add", 2), [f32, f64]) is None  # ONNX has one type T for both
    assert evaluate(_node("Add", 2), [np.ones(3, bool), np.ones(3, bool)]) is None
    legacy = _node("Mul", 2, broadcast=1, axis=1)  # opset < 7 broadcasting aligns at ``axis``
    assert evaluate(legacy, [np.ones((2, 3, 4), np.float32), np.ones(3, np.float32)]) is None
    assert evaluate(legacy, [f32, f32]).tolist() == [1.0, 1.0, 1.0]  # same shapes: nothing to align
    with pytest.raises(ValueError):  # the index turns this into "not a constant"
        evaluate(_node("Add", 2), [np.ones(3, np.float32), np.ones(4, np.float32)])


def test_sqrt():
    x = RNG.uniform(0, 4, (3, 5)).astype(np.float32)
    _same(evaluate(_node("Sqrt", 1), [x]), torch.sqrt(_t(x)), np.float32)
    assert evaluate(_node("Sqrt", 1), [np.array([4], np.int64)]) is None


def test_concat():
    pieces = [np.array([1], np.int64), np.array([4], np.int64), np.array([-1], np.int64)]
    assert evaluate(_node("Concat", 3, axis=0), pieces).tolist() == [1, 4, -1]
    a, b = RNG.standard_normal((2, 3)).astype(np.float32), RNG.standard_normal((2, 1)).astype(np.float32)
    np.testing.assert_array_equal(evaluate(_node("Concat", 2, axis=-1), [a, b]), np.concatenate([a, b], 1))
    assert evaluate(_node("Concat", 2, axis=0), [a, a.astype(np.float64)]) is None  # one type T
    assert evaluate(_node("Concat", 2, axis=2), [a, b]) is None  # no axis 2
    assert evaluate(_node("Concat", 2), [a, b]) is None  # axis is required


@pytest.mark.parametrize("keepdims", [0, 1])
@pytest.mark.parametrize("axes", [[0, 2], [-1], [1]])
def test_reduce_mean_axes_as_input_and_attribute(axes, keepdims):
    x = RNG.standard_normal((2, 4, 27)).astype(np.float32)
    ref = torch.mean(_t(x), dim=tuple(axes), keepdim=bool(keepdims))
    as_input = evaluate(_node("ReduceMean", 2, keepdims=keepdims), [x, np.array(axes, np.int64)])  # opset >= 18
    as_attr = evaluate(_node("ReduceMean", 1, keepdims=keepdims, axes=axes), [x])  # opset < 18
    _same(as_input, ref, np.float32)
    _same(as_attr, ref, np.float32)


def test_reduce_mean_without_axes():
    x = RNG.standard_normal((2, 3)).astype(np.float16)
    _same(evaluate(_node("ReduceMean", 1, keepdims=0), [x]), torch.mean(_t(x)), np.float16)  # every axis
    empty = np.array([], np.int64)
    _same(evaluate(_node("ReduceMean", 2), [x, empty]), torch.mean(_t(x), dim=(0, 1), keepdim=True), np.float16)
    np.testing.assert_array_equal(evaluate(_node("ReduceMean", 2, noop_with_empty_axes=1), [x, empty]), x)


def test_reduce_mean_refusals():
    x = np.ones((2, 3), np.float32)
    assert evaluate(_node("ReduceMean", 2), [x, np.array([2], np.int64)]) is None  # out of range
    assert evaluate(_node("ReduceMean", 2), [x, np.array([1, -1], np.int64)]) is None  # twice the same axis
    assert evaluate(_node("ReduceMean", 2), [np.ones((2, 3), np.int64), np.array([1], np.int64)]) is None
    assert evaluate(_node("ReduceMean", 2), [np.ones((2, 0), np.float32), np.array([1], np.int64)]) is None


def _bn_inputs(x_shape=(1, 4, 27), dtype=np.float32):
    c = x_shape[1]
    x = RNG.standard_normal(x_shape).astype(dtype)
    scale, bias, mean = (RNG.standard_normal(c).astype(dtype) for _ in range(3))
    return [x, scale, bias, mean, RNG.uniform(0.5, 2, c).astype(dtype)]


@pytest.mark.parametrize("x_shape", [(1, 4, 27), (2, 3), (2, 3, 4, 5)])
def test_batch_norm_inference(x_shape):
    inputs = _bn_inputs(x_shape)
    x, scale, bias, mean, var = (_t(v) for v in inputs)
    ref = torch.nn.functional.batch_norm(x, mean, var, scale, bias, training=False, eps=1e-3)
    _same(evaluate(_node("BatchNormalization", 5, epsilon=1e-3), inputs), ref, np.float32)


@pytest.mark.parametrize("x_shape", [(1, 4, 27), (3, 4), (2, 4, 3, 5)])
def test_batch_norm_training_mode_uses_the_statistics_of_its_input(x_shape):
    """Weight standardization as the TorchScript exporter writes it: training_mode=1 normalizes with
    the input's own mean and population variance (its mean and var inputs feed only other outputs);
    before opset 7, is_test=0 (the default) means the same."""
    inputs = _bn_inputs(x_shape)
    x, scale, bias, mean, var = (_t(v) for v in inputs)
    ref = torch.nn.functional.batch_norm(x, None, None, scale, bias, training=True, eps=1e-3).numpy()
    for node, opset in (
        (_node("BatchNormalization", 5, epsilon=1e-3, training_mode=1), None),
        (_node("BatchNormalization", 5, epsilon=1e-3), 6),
        (_node("BatchNormalization", 5, epsilon=1e-3, is_test=0), 6),
    ):
        value = evaluate(node, inputs, opset=opset)
        assert value is not None and value.dtype == np.float32
        # float64 statistics in another order than torch's, then one rounding: within 1 ulp of float32
        np.testing.assert_allclose(value, ref, rtol=0, atol=2.0**-23 * np.abs(ref).max())


def test_batch_norm_refusals():
    inputs = _bn_inputs()
    assert evaluate(_node("BatchNormalization", 5, is_test=1), inputs, opset=6) is not None
    assert evaluate(_node("BatchNormalization", 5, spatial=0), inputs, opset=7) is None
    wrong = [inputs[0], inputs[1][:3], *inputs[2:]]  # 3 scales for 4 channels
    assert evaluate(_node("BatchNormalization", 5), wrong) is None
    assert evaluate(_node("BatchNormalization", 5), [np.ones((2, 4), np.int64)] + inputs[1:]) is None


def test_result_bytes_count_the_float64_temporaries():
    a, b = np.ones((64, 1), np.float32), np.ones((1, 32), np.float32)
    # float64 copies of both operands, the float64 result, its float32 cast (float32 is computed in float32, but
    # charged as the float64 arithmetic)
    assert result_bytes(_node("Mul", 2), [a, b]) == 64 * 8 + 32 * 8 + 64 * 32 * (8 + 4)
    a16, b16 = a.astype(np.float16), b.astype(np.float16)
    assert result_bytes(_node("Mul", 2), [a16, b16]) == 64 * 8 + 32 * 8 + 64 * 32 * (8 + 2)
    assert result_bytes(_node("Mul", 2), [a.astype(np.float64), b.astype(np.float64)]) == 64 * 32 * 8
    assert result_bytes(_node("Add", 2), [np.ones(5, np.int32), np.ones(5, np.int32)]) == 5 * 4
    x = np.ones((4, 6, 10), np.float32)
    assert result_bytes(_node("ReduceMean", 2, keepdims=0), [x, np.array([0, 2], np.int64)]) == 6 * (8 + 4)
    assert result_bytes(_node("Concat", 2, axis=0), [x, x]) == 2 * x.nbytes
    stats = [np.ones(6, np.float32)] * 4  # result + its float64 copy + the centred copy of training mode
    assert result_bytes(_node("BatchNormalization", 5), [x, *stats]) == 240 * (12 + 8) + 6 * 6 * 8


def test_the_meter_refuses_before_anything_is_made():
    """A broadcast Mul whose float64 result would take 32 GiB: refused by the meter, naming the node."""
    a, b = np.ones((1 << 16, 1), np.float32), np.ones((1, 1 << 16), np.float32)
    meter = WorkMeter(Budget.for_content(0), "constant evaluation")
    with pytest.raises(WorkError, match="computing the constant Mul 'mul'"):
        evaluate(_node("Mul", 2), [a, b], meter)
    small = WorkMeter(Budget.for_content(0), "constant evaluation")
    evaluate(_node("ReduceMean", 1, keepdims=0), [np.ones((8, 8), np.float32)], small)
    assert (small.bytes, small.flops) == (12, 64 + NODE_FLOPS)  # the float64 mean and its cast; it read 64 elements


# --------------------------------------------------------------------------- what the index takes for a constant


def _index(g: G) -> ModelIndex:
    return ModelIndex(g.model(opset=18), Tracker())


def test_data_path_arithmetic_is_no_constant():
    g = G()
    x = g.input("x", [2, 4])
    c = g.init("c", np.full(4, 2.0))
    scaled = g.node("Mul", [x, c], "scaled")
    shifted = g.node("Add", [scaled, g.node("Sqrt", [c], "root")], "shifted")
    g.output(g.node("Sub", [shifted, c], "out"))
    index = _index(g)
    gi = index.graphs[0]
    for name in ("scaled", "shifted", "out"):
        assert isinstance(index.constant(gi, name, "value"), str), name
    root = index.constant(gi, "root", "value")
    np.testing.assert_array_equal(root.value, np.sqrt(np.full(4, 2.0, np.float32)))


def test_batch_norm_statistics_from_a_graph_input_are_not_constants():
    """A Conv -> BatchNormalization whose scale is ``Mul(input, 2)``: no fold, the scale is not a constant."""
    g = G()
    x, s = g.input("x", [2, 3, 6, 6]), g.input("s", [4])
    y = g.node("Conv", [x, g.randn("W", 4, 3, 3, 3)], "c", name="conv")
    scale = g.node("Mul", [s, g.init("two", np.full(4, 2.0))], "scale")
    stats = g.bn_stats("bn", 4)[1:]
    g.output(g.node("BatchNormalization", [y, scale, *stats], "y", name="bn"))
    result = check_fold(g.model(), g.feeds, gone=(), skipped=1)
    assert [s.code for s in result.report.skipped] == [Code.NOT_CONSTANT], result.report
    assert not result.report.folded


def test_computed_statistics_fold():
    """A BatchNormalization whose scale is ``Sqrt(Div(gamma, 4)) * 2`` and whose mean is a ReduceMean of a
    constant: the statistics evaluate, the BN folds, the computation is removed."""
    g = G()
    x = g.input("x", [2, 3, 6, 6])
    y = g.node("Conv", [x, g.randn("W", 4, 3, 3, 3)], "c", name="conv")
    gamma = g.init("gamma", g.rng.uniform(1, 4, 4))
    scale = g.node(
        "Mul", [g.node("Sqrt", [g.node("Div", [gamma, g.init("four", [4.0])], "q")], "r"), g.init("two", [2.0])], "s"
    )
    table = g.randn("table", 4, 5)
    mean = g.node("ReduceMean", [table, g.init("axes", [1], np.int64)], "m", keepdims=0)
    bias, var = g.init("beta", g.rng.standard_normal(4)), g.init("var", g.rng.uniform(0.5, 2, 4))
    g.output(g.node("BatchNormalization", [y, scale, bias, mean, var], "y", name="bn"))
    result = check_fold(g.model(opset=18), g.feeds, folded=1)
    assert [n.op_type for n in result.model.graph.node] == ["Conv"]


# --------------------------------------------------------------------------- a long data path of constant-typed ops

BLOCKS = 1000


def _residual_chain(n: int = BLOCKS) -> G:
    """``h = 0.5 * (h + bn(conv(h)))``, ``n`` times: every node on the data path but the convs is of an op type
    the evaluator computes (Add, Mul, BatchNormalization), and every value is read by the next block."""
    g = G()
    h = g.input("x", [1, 4, 3, 3])
    half = g.init("half", [0.5])
    for k in range(n):
        c = g.node("Conv", [h, g.randn(f"W{k}", 4, 4, 1, 1, scale=0.3)], f"c{k}", name=f"conv{k}")
        s = g.node("Add", [h, g.bn(c, 4, f"bn{k}")], f"s{k}", name=f"add{k}")
        h = g.node("Mul", [s, half], f"h{k}", name=f"mul{k}")
    g.output(h)
    return g


def test_a_long_residual_chain_folds_in_linear_work(monkeypatch):
    """1,000 residual blocks: each BN and each ``* 0.5`` folds into its conv, the identity branch merges into
    it, and the constant walks look at a value a bounded number of times per block (a walk back or forth
    along the chain on every query would make about ``BLOCKS ** 2 / 2`` look-ups)."""
    calls = {"find": 0}
    find = ConstantEvaluator._find

    def counted(self, *args):
        calls["find"] += 1
        return find(self, *args)

    monkeypatch.setattr(ConstantEvaluator, "_find", counted)
    g = _residual_chain()
    result = check_fold(g.model(), g.feeds, folded=2 * BLOCKS)
    report = result.report
    assert {f.norm for f in report.folded if f.kind == "batch_norm"} == {f"bn{k}" for k in range(BLOCKS)}, report
    assert len(report.merged) == BLOCKS, report
    assert [n.op_type for n in result.model.graph.node] == ["Conv"] * BLOCKS
    assert calls["find"] < 60 * BLOCKS, calls  # about 30 per block


def test_an_omitted_trailing_input_is_absent():
    """``ReduceMean(t, "")`` (opset 18, the axes input left out) is the mean over every axis."""
    g = G()
    t = g.rng.standard_normal((2, 3)).astype(np.float32)
    mean = g.node("ReduceMean", [g.init("t", t), ""], "m", keepdims=0)
    g.output(g.node("Add", [g.input("x", [1]), mean], "y"))
    index = _index(g)
    _same(index.constant(index.graphs[0], "m", "value").value, torch.mean(_t(t)), np.float32)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int64"])
def test_read_only_and_writable_arrays_evaluate_alike_and_quietly(dtype, recwarn):
    """An initializer's array is read-only memory (``np.frombuffer`` over the protobuf's bytes): evaluated as a writable
    copy is, bfloat16 included (ml_dtypes' type, which torch reads through int16), and torch's warning about
    read-only memory does not reach the caller."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    dt = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    writable = np.arange(8).astype(dt)
    read_only = np.frombuffer(writable.tobytes(), dtype=dt)
    node = h.make_node("Reshape", ["a", "s"], ["y"])
    shape = np.array([2, 4], np.int64)
    out = [evaluate(node, [a, shape], None, 17) for a in (writable, read_only)]
    assert [o.dtype for o in out] == [dt, dt] and np.array_equal(out[0], out[1]) and out[0].shape == (2, 4)
    assert np.array_equal(out[1].astype(np.float64).ravel(), np.arange(8))
    assert not [w for w in recwarn if issubclass(w.category, UserWarning)]


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64, np.int64, np.bool_])
@pytest.mark.parametrize(("shape", "perm"), [((37, 53), None), ((4, 5, 6, 7), [2, 0, 3, 1]), ((3, 4), [0, 1])])
def test_transpose_gives_numpy_transposes_bytes(dtype, shape, perm):
    """A weight's Transpose (computed by torch's copy of the permuted view) holds the bytes, layout and dtype of
    numpy's transpose of it, made contiguous; an identity permutation too."""
    a = (RNG.standard_normal(shape) * 10).astype(dtype)
    node = _node("Transpose", 1, **({} if perm is None else {"perm": perm}))
    value = evaluate(node, [a])
    expected = np.ascontiguousarray(np.transpose(a, perm))
    assert value.dtype == expected.dtype and value.shape == expected.shape and value.flags.c_contiguous
    assert value.tobytes() == expected.tobytes()


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div"])
def test_float32_arithmetic_holds_the_bits_of_float64_cast_once(op):
    """Two float32 operands are computed in float32: the bits of the float64 result cast once to float32, on random
    bit patterns (every exponent: subnormals, overflow to inf, exact cancellation, infinities; NaN stays NaN)."""
    bits = RNG.integers(0, 1 << 32, size=(2, 200_000), dtype=np.uint64).astype(np.uint32)
    a, b = bits.view(np.float32)
    with np.errstate(all="ignore"):
        near = a * np.float32(1 + 2**-20)  # operands of one magnitude: cancellation and ties
        a, b = np.concatenate([a, near]), np.concatenate([b, -a if op == "Add" else a])
        got = evaluate(_node(op, 2), [a, b])
        fn = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Div": np.divide}[op]
        expected = fn(a.astype(np.float64), b.astype(np.float64)).astype(np.float32)
    assert got.dtype == np.float32 and np.array_equal(np.isnan(got), np.isnan(expected))
    finite = ~np.isnan(expected)
    assert np.array_equal(got[finite].view(np.uint32), expected[finite].view(np.uint32))
