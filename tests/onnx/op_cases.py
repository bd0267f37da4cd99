"""Generated cases for every op of ``bnfold.onnx.semantics.IMPLS``: attributes, broadcasting and opset
versions, each a one-node model with its inputs (``test_onnx_semantics.py`` runs them).

A case's inputs: a shape tuple (random floats), ``POS(shape)`` (positive floats), ``SEQ(shapes)`` (a
sequence of random floats), or a numpy array (a fixed value: shapes, axes, indices).  ``oracles`` names
what it is checked against: ONNX Runtime (``ort``) and ``onnx.reference`` (``ref``), both unless a case
says otherwise (and why)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import numpy as np
from onnx import TensorProto, helper


@dataclass
class POS:
    shape: tuple


@dataclass
class SEQ:
    """A sequence input: one random float tensor per shape."""

    shapes: list


@dataclass
class Case:
    op: str
    inputs: list
    attrs: dict = field(default_factory=dict)
    opset: int = 21
    outs: int = 1
    oracles: tuple = ("ort", "ref")
    id: str = ""

    def name(self) -> str:
        extra = self.id or ",".join(f"{k}={v}" for k, v in self.attrs.items())
        return f"{self.op}-op{self.opset}-{extra}"[:90]


def i64(*v):
    return np.array(v, dtype=np.int64)


def f32(*v):
    return np.array(v, dtype=np.float32)


def _elementwise() -> list[Case]:
    out = []
    unary = "Neg Abs Sign Exp Floor Ceil Round Erf Sin Cos Tan Atan Sinh Cosh Relu Sigmoid Tanh Softplus Softsign"
    for op in unary.split():
        out.append(Case(op, [(2, 3, 4)]))
    for op in "Sqrt Log Reciprocal".split():
        out.append(Case(op, [POS((2, 3, 4))]))
    for op in "Asin Acos".split():
        out.append(Case(op, [np.linspace(-0.9, 0.9, 12, dtype=np.float32).reshape(3, 4)]))
    out += [Case("Mish", [(2, 5)], opset=18), Case("HardSwish", [(2, 5)]), Case("HardSigmoid", [(2, 5)])]
    out += [Case("HardSigmoid", [(2, 5)], {"alpha": 0.3, "beta": 0.4})]
    out += [Case("LeakyRelu", [(2, 5)], {"alpha": 0.2}), Case("ThresholdedRelu", [(2, 5)], {"alpha": 0.5})]
    out += [Case("Selu", [(2, 5)]), Case("Selu", [(2, 5)], {"alpha": 1.5, "gamma": 2.0})]
    out += [Case("Elu", [(2, 5)], {"alpha": 0.7}), Case("Celu", [(2, 5)], {"alpha": 1.3})]
    out += [Case("PRelu", [(2, 3, 4), (3, 1)]), Case("PRelu", [(2, 3, 4), (4,)])]
    out += [Case("Gelu", [(2, 5)], {"approximate": m}, opset=20) for m in ("none", "tanh")]
    for op in "Add Sub Mul Div".split():
        out += [Case(op, [(2, 3, 4), (3, 1)]), Case(op, [(1, 4), (3, 1)])]
    out += [Case("Div", [i64(7, -7, 9), i64(2, 2, -4)], id="int")]
    out += [Case("Pow", [POS((2, 3)), (3,)]), Case("Pow", [(2, 3), i64(2)], id="int-exponent")]
    out += [Case("Mod", [i64(5, -5, 7), i64(3, 3, -2)], id="int"), Case("Mod", [(2, 3), POS((3,))], {"fmod": 1})]
    for op in "Sum Mean Max Min".split():
        out += [Case(op, [(2, 3)]), Case(op, [(2, 3), (3,), (1, 1)])]
    out += [Case("Clip", [(2, 5), f32(-0.5), f32(0.5)]), Case("Clip", [(2, 5), np.array([], np.float32), f32(0.3)])]
    out += [Case("Clip", [(2, 5)], {"min": -0.4, "max": 0.6}, opset=6), Case("Clip", [(2, 5)], {"max": 0.1}, opset=6)]
    out += [Case("Clip", [(2, 5)], id="no-bounds")]
    for op in "Equal Less LessOrEqual Greater GreaterOrEqual".split():
        out.append(Case(op, [i64(1, 2, 3, 4).reshape(2, 2), i64(2, 2).reshape(1, 2)]))
        out.append(Case(op, [(2, 3), (3,)], id="float"))
    out.append(Case("Not", [np.array([True, False, True])]))
    for op in "And Or Xor".split():
        out.append(Case(op, [np.array([[True, False], [False, True]]), np.array([True, False])]))
    out.append(Case("Where", [np.array([[True, False, True]]), (2, 3), (2, 1)]))
    out.append(Case("IsNaN", [f32(1, np.nan, -np.inf)]))
    out += [Case("IsInf", [f32(1, np.nan, -np.inf, np.inf)], {"detect_positive": p}) for p in (0, 1)]
    out += [Case("Cast", [(2, 3)], {"to": TensorProto.INT64}), Case("Cast", [i64(1, 0, 3)], {"to": TensorProto.FLOAT})]
    out += [Case("Cast", [i64(1, 0, 3)], {"to": TensorProto.BOOL})]
    out += [Case("CastLike", [i64(1, 2), f32(0)]), Case("CastLike", [(3,), i64(0)])]
    return out


def _shapes() -> list[Case]:
    out = [Case("Identity", [(2, 3)]), Case("Dropout", [(2, 3)]), Case("Dropout", [(2, 3)], outs=2)]
    out += [Case("Reshape", [(2, 3, 4), i64(4, 0, -1)]), Case("Reshape", [(2, 3, 4), i64(-1)])]
    out += [Case("Unsqueeze", [(2, 3), i64(0, -1)]), Case("Unsqueeze", [(2, 3)], {"axes": [1]}, opset=11)]
    out += [
        Case("Squeeze", [(1, 3, 1), i64(-1)]),
        Case("Squeeze", [(1, 3, 1)]),
        Case("Squeeze", [(1, 3, 1)], {"axes": [0]}, opset=11),
    ]
    out += [Case("Flatten", [(2, 3, 4)], {"axis": ax}) for ax in (0, 2, -1)]
    out += [Case("Transpose", [(2, 3, 4)], {"perm": [2, 0, 1]}), Case("Transpose", [(2, 3, 4)])]
    out += [
        Case("Slice", [(5, 6), i64(1, -4), i64(4, 100)]),
        Case("Slice", [(5, 6), i64(-1), i64(-100), i64(1), i64(-2)], id="negative-step"),
        Case("Slice", [(5, 6), i64(4, 0), i64(0, 6), i64(0, 1), i64(-1, 2)], id="mixed-steps"),
        Case("Slice", [(5, 6)], {"starts": [1], "ends": [3], "axes": [1]}, opset=9),
    ]
    out += [Case("Concat", [(2, 3), (2, 1)], {"axis": -1}), Case("Concat", [(2, 3), (1, 3), (3, 3)], {"axis": 0})]
    out += [
        Case("Split", [(6, 4)], {"axis": 0}, opset=11, outs=3, id="equal-attr"),
        Case("Split", [(6, 4)], {"axis": 1, "split": [1, 3]}, opset=11, outs=2),
        Case("Split", [(6, 4), i64(2, 4)], {"axis": 0}, opset=13, outs=2, id="input"),
        Case("Split", [(6, 4)], {"axis": 0}, opset=13, outs=2, id="equal"),
        Case("Split", [(7, 4)], {"axis": 0, "num_outputs": 3}, opset=18, outs=3),
        Case("Split", [(2, 6)], {"axis": -1, "num_outputs": 2}, opset=18, outs=2),
    ]
    out += [Case("Gather", [(4, 3), i64(0, -1, 2)], {"axis": 0}), Case("Gather", [(4, 3), i64(1)[0]], {"axis": 1})]
    out += [Case("Gather", [(4, 3, 2), i64(0, 2, 1, 1).reshape(2, 2)], {"axis": 1})]
    out += [Case("GatherElements", [(3, 4), i64(0, 2, -1, 1, 3, 0).reshape(3, 2)], {"axis": 1})]
    out += [Case("GatherND", [(3, 4, 2), i64(0, 1, 2, -1).reshape(2, 2)])]
    out += [Case("GatherND", [(2, 3, 4), i64(1, 0, 2, 1).reshape(2, 2, 1)], {"batch_dims": 1})]
    out += [Case("ScatterND", [(4, 3), i64(1, 3).reshape(2, 1), (2, 3)])]
    out += [Case("ScatterND", [(4, 3), i64(1, 1).reshape(2, 1), (2, 3)], {"reduction": "add"}, opset=16)]
    out += [Case("ScatterND", [(4, 3), i64(0, 2).reshape(2, 1), (2, 3)], {"reduction": "max"}, opset=18)]
    out += [Case("ScatterElements", [(3, 4), i64(0, 2, 1, 3).reshape(2, 2), (2, 2)], {"axis": 1})]
    out += [Case("Expand", [(3, 1), i64(2, 3, 4)]), Case("Expand", [(3, 4), i64(1, 1)])]
    out += [Case("Tile", [(2, 3), i64(2, 1)]), Case("Tile", [(2, 3), i64(1, 3)])]
    for mode in ("constant", "reflect", "edge", "wrap"):
        out.append(Case("Pad", [(3, 4), i64(1, 2, 2, 1)], {"mode": mode}, opset=19))
        out.append(
            Case(
                "Pad", [(2, 3, 4), i64(1, 2, 0, 1), np.array([], np.float32), i64(-1, 1)], {"mode": mode}, 19, id="axes"
            )
        )
    out += [
        Case("Pad", [(3, 4), i64(0, 1, 0, 2), f32(1.5)]),
        Case("Pad", [(3, 5), i64(-1, 1, 0, -2)], id="crop", oracles=("ort",)),
    ]
    out += [
        Case("Pad", [(3, 4)], {"pads": [1, 0, 0, 2], "mode": m, "value": 0.5}, opset=2)
        for m in ("constant", "edge", "reflect")
    ]
    out += [Case("Shape", [(2, 3, 4)]), Case("Shape", [(2, 3, 4)], {"start": 1, "end": -1}, opset=15)]
    out += [Case("Size", [(2, 3, 4)]), Case("ConstantOfShape", [i64(2, 3)])]
    out += [Case("ConstantOfShape", [i64(2, 3)], {"value": helper.make_tensor("v", TensorProto.FLOAT, [1], [0.25])})]
    out += [Case("ConstantOfShape", [i64(3)], {"value": helper.make_tensor("v", TensorProto.INT64, [1], [7])})]
    out += [Case("Range", [i64(1)[0], i64(10)[0], i64(3)[0]]), Case("Range", [f32(0.5)[0], f32(-2)[0], f32(-0.75)[0]])]
    out += [Case("Trilu", [(3, 4)]), Case("Trilu", [(2, 3, 4), i64(-1)[0]], {"upper": 0})]
    out += [Case("DepthToSpace", [(1, 8, 2, 3)], {"blocksize": 2, "mode": m}) for m in ("DCR", "CRD")]
    out += [Case("SpaceToDepth", [(1, 2, 4, 6)], {"blocksize": 2})]
    return out


def _layers() -> list[Case]:
    out = [
        Case("Conv", [(1, 2, 6, 7), (4, 2, 3, 3), (4,)], {"pads": [1, 1, 1, 1]}),
        Case("Conv", [(1, 4, 7, 7), (4, 2, 3, 3)], {"group": 2, "strides": [2, 2], "pads": [0, 1, 2, 0]}),
        Case("Conv", [(1, 2, 9), (3, 2, 3)], {"dilations": [2]}),
    ]
    for mode in ("SAME_UPPER", "SAME_LOWER", "VALID"):
        out.append(Case("Conv", [(1, 2, 7, 8), (3, 2, 4, 3)], {"auto_pad": mode, "strides": [2, 3]}))
    out += [
        Case("ConvTranspose", [(1, 2, 4, 5), (2, 3, 3, 3), (3,)], {"strides": [2, 2], "pads": [1, 1, 1, 1]}),
        Case(  # onnx.reference mishandles a grouped ConvTranspose
            "ConvTranspose",
            [(1, 4, 4, 4), (4, 1, 3, 3)],
            {"group": 2, "strides": [2, 2], "output_padding": [1, 0]},
            oracles=("ort",),
        ),
        Case("ConvTranspose", [(1, 2, 4, 4), (2, 2, 3, 3)], {"strides": [2, 2], "pads": [0, 1, 2, 0]}),
        Case("ConvTranspose", [(1, 2, 5), (2, 2, 3)], {"strides": [2], "output_shape": [10]}, oracles=("ort",)),
        Case("ConvTranspose", [(1, 2, 4, 4), (2, 2, 3, 3)], {"strides": [2, 2], "dilations": [2, 1]}),
    ]
    for mode in ("SAME_UPPER", "SAME_LOWER"):
        out.append(Case("ConvTranspose", [(1, 2, 5, 4), (2, 3, 4, 3)], {"auto_pad": mode, "strides": [2, 2]}))
    for ta, tb in itertools.product((0, 1), repeat=2):
        out.append(
            Case(
                "Gemm", [(3, 4) if not ta else (4, 3), (4, 5) if not tb else (5, 4), (5,)], {"transA": ta, "transB": tb}
            )
        )
    out += [
        Case("Gemm", [(3, 4), (4, 5), (3, 1)], {"alpha": 0.5, "beta": 2.0}),
        Case("Gemm", [(3, 4), (5, 4)], {"transB": 1}),
    ]
    out += [
        Case("MatMul", [(2, 1, 3, 4), (5, 4, 2)]),
        Case("MatMul", [(4,), (3, 4, 2)]),
        Case("MatMul", [(2, 3, 4), (4,)]),
    ]
    out += [
        Case("Einsum", [(2, 3, 4), (2, 4, 5)], {"equation": "bij,bjk->bik"}),
        Case("Einsum", [(3, 3)], {"equation": "ii->i"}),
    ]
    out += [Case("Einsum", [(2, 3), (3,)], {"equation": "ij, j"})]
    return out


def _pools() -> list[Case]:
    out = []
    for op in ("MaxPool", "AveragePool", "LpPool"):
        op_set = 19 if op != "LpPool" else 18
        for auto_pad, ceil in itertools.product(("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"), (0, 1)):
            a = {"kernel_shape": [3, 2], "strides": [2, 2], "auto_pad": auto_pad}
            if auto_pad == "NOTSET":
                a.update(pads=[1, 0, 1, 1], ceil_mode=ceil)
            elif ceil:
                continue
            # onnx.reference pads a MaxPool SAME_LOWER to one row too many
            refs = ("ort",) if (op, auto_pad) == ("MaxPool", "SAME_LOWER") else ("ort", "ref")
            out.append(Case(op, [(1, 2, 7, 6)], a, opset=op_set, oracles=refs))
        out.append(
            Case(op, [(1, 2, 8, 7)], {"kernel_shape": [3, 3], "dilations": [2, 1], "strides": [1, 2]}, opset=op_set)
        )
        out.append(
            Case(op, [(1, 2, 9)], {"kernel_shape": [3], "strides": [2], "pads": [1, 1], "ceil_mode": 1}, opset=op_set)
        )
    for include in (0, 1):
        for ceil in (0, 1):
            a = {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "count_include_pad": include}
            out.append(Case("AveragePool", [(1, 2, 6, 6)], dict(a, ceil_mode=ceil), opset=19))
        out.append(
            Case(
                "AveragePool",
                [(1, 1, 6, 5)],
                {"kernel_shape": [2, 2], "pads": [1, 0, 0, 1], "count_include_pad": include},
            )
        )
    out += [Case("LpPool", [(1, 2, 6, 6)], {"kernel_shape": [2, 2], "p": 3}, opset=18)]
    out += [Case(op, [(2, 3, 4, 5)]) for op in ("GlobalAveragePool", "GlobalMaxPool")]
    out += [Case("GlobalLpPool", [(2, 3, 4, 5)], oracles=("ort",))]  # not in onnx.reference
    return out


def _norms() -> list[Case]:
    out = [Case("BatchNormalization", [(2, 3, 4), (3,), (3,), (3,), POS((3,))], {"epsilon": 1e-3})]
    out += [
        Case(
            "BatchNormalization",
            [(4, 3, 2), (3,), (3,), (3,), POS((3,))],
            {"training_mode": 1},
            oracles=("ref",),
            id="training",
        )
    ]  # ORT's CPU kernel runs training mode only in training builds
    out += [
        Case("LayerNormalization", [(2, 3, 4), (4,), (4,)]),
        Case("LayerNormalization", [(2, 3, 4), (3, 4)], {"axis": 1}),
    ]
    out += [Case("LayerNormalization", [(2, 3, 4), (4,), (4,)], outs=3, oracles=("ref",), id="three-outputs")]
    out += [Case("RMSNormalization", [(2, 3, 4), (4,)], opset=23, oracles=("ref",), id="opset23")]
    out += [Case("GroupNormalization", [(2, 4, 3), (4,), (4,)], {"num_groups": 2}, opset=21)]
    out += [Case("GroupNormalization", [(2, 4, 3), (2,), (2,)], {"num_groups": 2}, opset=18, oracles=("ref",))]
    out += [Case("InstanceNormalization", [(2, 3, 4, 5), (3,), (3,)], {"epsilon": 1e-4})]
    # onnx.reference's LRN walks the batch axis for the channel one (right when both have one size);
    # ONNX Runtime takes odd sizes only
    lrn = {"alpha": 0.01, "beta": 0.75, "bias": 2.0}
    out += [Case("LRN", [(1, 5, 3, 3)], dict(lrn, size=3), oracles=("ort",))]
    out += [Case("LRN", [(5, 5, 2, 2)], dict(lrn, size=n), oracles=("ref",)) for n in (3, 4)]
    for op in ("Softmax", "LogSoftmax", "Hardmax"):
        for op_set, ax in itertools.product((11, 13), (None, 1, -1)):
            # onnx.reference computes opset < 13 with opset 13's single axis; ORT coerces to 2-D
            refs = ("ort",) if op_set < 13 else ("ort", "ref")
            out.append(Case(op, [(2, 3, 4)], {} if ax is None else {"axis": ax}, opset=op_set, oracles=refs))
    return out


def _reductions() -> list[Case]:
    out = []
    ops = (
        "ReduceSum ReduceMean ReduceMax ReduceMin ReduceProd ReduceL1 ReduceL2 ReduceLogSumExp ReduceSumSquare".split()
    )
    for op in ops:
        out += [Case(op, [(2, 3, 4), i64(1, -1)], opset=18), Case(op, [(2, 3, 4), i64(0)], {"keepdims": 0}, opset=18)]
        out += [Case(op, [(2, 3, 4)], {"axes": [1]}, opset=11), Case(op, [(2, 3, 4)], opset=18, id="all")]
    out += [Case("ReduceLogSum", [POS((2, 3)), i64(1)], opset=18)]
    out += [
        Case("ReduceSum", [(2, 3), i64(1)], opset=13),
        Case("ReduceSum", [(2, 3)], {"noop_with_empty_axes": 1}, opset=13),
    ]
    for op in ("ArgMax", "ArgMin"):
        x = np.array([[1, 3, 3, 0], [2, 2, 1, 1]], np.float32)
        out += [Case(op, [x], {"axis": 1, "select_last_index": s}) for s in (0, 1)]
        out += [Case(op, [(2, 3, 4)], {"axis": 0, "keepdims": 0})]
    out += [Case("TopK", [(3, 5), i64(2)], outs=2), Case("TopK", [(3, 5), i64(3)], {"axis": 0, "largest": 0}, outs=2)]
    out += [Case("TopK", [(3, 5)], {"k": 2}, opset=9, outs=2)]
    out += [Case("CumSum", [(2, 4), i64(1)[0]], {"exclusive": e, "reverse": r}) for e in (0, 1) for r in (0, 1)]
    return out


def _resize() -> list[Case]:
    out = []
    coords = ("half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric", "half_pixel_symmetric")
    empty = np.array([], np.float32)
    for c in coords:
        for nm in ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil"):
            a = {"mode": "nearest", "coordinate_transformation_mode": c, "nearest_mode": nm}
            # onnx.reference rounds align_corners' coordinates in float32: floor(2.9999998) for 3
            refs = ("ort",) if (c, nm) == ("align_corners", "floor") else ("ort", "ref")
            out.append(Case("Resize", [(1, 1, 3, 4), empty, f32(1, 1, 2.5, 0.75)], a, opset=19, oracles=refs))
        for mode in ("linear", "cubic"):
            a = {"mode": mode, "coordinate_transformation_mode": c}
            out.append(Case("Resize", [(1, 2, 4, 3), empty, empty, i64(1, 2, 7, 5)], a, opset=19))
            out.append(Case("Resize", [(1, 2, 6, 5), empty, f32(1, 1, 0.5, 0.6)], a, opset=19, id=f"{mode}-{c}-down"))
    out += [
        Case(
            "Resize",
            [(1, 1, 4, 4), empty, empty, i64(6, 3)],
            {"mode": "cubic", "exclude_outside": 1, "cubic_coeff_a": -0.5, "axes": [2, 3]},
            opset=19,
        )
    ]
    out += [
        Case(
            "Resize", [(1, 1, 4, 6), empty, empty, i64(3, 3)], {"axes": [2, 3], "keep_aspect_ratio_policy": p}, opset=19
        )
        for p in ("not_larger", "not_smaller")
    ]
    out += [
        Case(
            "Resize",
            [(1, 1, 4, 4), f32(0, 0, 0.2, 0.1, 1, 1, 0.9, 0.8), empty, i64(1, 1, 3, 5)],
            {"mode": "linear", "coordinate_transformation_mode": "tf_crop_and_resize", "extrapolation_value": -1.0},
            opset=19,
        )
    ]
    # onnx.reference runs neither Resize-10 nor a linear Upsample over four axes
    for op, scales in (("Resize", f32(1, 1, 2.5, 0.6)), ("Upsample", f32(1, 1, 2, 3))):
        op_set = 10 if op == "Resize" else 9
        out += [
            Case(op, [(1, 2, 5, 5), scales], {"mode": m}, opset=op_set, oracles=("ort",)) for m in ("nearest", "linear")
        ]
    return out


def _sequences() -> list[Case]:
    """torch.split / chunk in dynamo exports: SplitToSequence then SequenceAt (a sequence output is
    compared part by part)."""
    parts = SEQ([(2, 3), (2, 1), (2, 2)])
    return [
        Case("SplitToSequence", [(6, 4), i64(2, 1, 3)], {"axis": 0}, id="sizes"),
        Case("SplitToSequence", [(2, 7), i64(3)[0]], {"axis": -1}, id="scalar-last-smaller"),
        Case("SplitToSequence", [(3, 4)], {"axis": 1}, id="ones"),
        Case("SplitToSequence", [(3, 4)], {"axis": 0, "keepdims": 0}, id="ones-squeezed"),
        Case("SequenceAt", [parts, i64(1)[0]], id="position"),
        Case("SequenceAt", [parts, i64(-1)[0]], id="negative"),
        Case("ConcatFromSequence", [parts], {"axis": -1}),
        Case("ConcatFromSequence", [SEQ([(2, 3), (2, 3)])], {"axis": 1, "new_axis": 1}),
        Case("SequenceConstruct", [(2, 3), (4,)]),
        Case("SequenceLength", [parts]),
    ]


CASES: list[Case] = (
    _elementwise() + _shapes() + _layers() + _pools() + _norms() + _reductions() + _resize() + _sequences()
)
