"""Parity between the frontends: every case of ``tests/fold_cases.py``, exported to a torch.export
program and to ONNX, folds the same number of normalizations, skips the same number, and gives the
same skip reasons.

A reason is compared after normalizing what legitimately differs between the formats and nothing
else: quoted names (``'conv2d_3'``, ``'/conv/Conv'``) become ``'<name>'``, and op names become one
spelling (``conv2d``/``convolution``/``Conv`` -> ``conv``, ``addmm``/``Gemm``/``MatMul`` -> ``linear``,
``_native_batch_norm_legit_no_training``/``BatchNormalization`` -> ``batch_norm``...).  Every other
word must be the same.  The op table lists each format's spellings, and is applied to the reasons of
both formats, so two identical reasons always normalize to the same text.
"""

from __future__ import annotations

import re

import pytest

import bnfold
from fold_cases import CASES

#: torch.export program IRs compared with the ONNX export (the dynamo exporter, which reads the same program)
IRS = ["default", "decomposed"]

_SAME = {  # canonical spelling -> spellings in either format
    "conv": ["conv1d", "conv2d", "conv3d", "convolution", "Conv"],
    "conv_transpose": ["conv_transpose1d", "conv_transpose2d", "conv_transpose3d", "ConvTranspose"],
    "linear": ["linear", "addmm", "mm", "bmm", "matmul", "Gemm", "MatMul"],
    "batch_norm": [
        "batch_norm",
        "_native_batch_norm_legit_no_training",
        "_native_batch_norm_legit",
        "native_batch_norm",
        "BatchNormalization",
    ],
    "reshape": ["view", "view_copy", "reshape", "_unsafe_view", "flatten", "unflatten", "Reshape", "Flatten"],
    "identity": ["clone", "alias", "alias_copy", "detach", "dropout", "Identity", "Dropout"],
    "transpose": ["transpose", "permute", "permute_copy", "Transpose"],
    "squeeze": ["squeeze", "squeeze_copy", "Squeeze"],
    "unsqueeze": ["unsqueeze", "unsqueeze_copy", "Unsqueeze"],
    "expand": ["expand", "expand_copy", "Expand"],
    "mean": ["mean", "ReduceMean"],
    "relu": ["relu", "Relu"],
    "mul": ["mul", "Mul"],
    "div": ["div", "Div"],
    "add": ["add", "Add"],
    "sub": ["sub", "Sub"],
}
_CANONICAL = {spelling: canonical for canonical, spellings in _SAME.items() for spelling in spellings}
_OP_WORD = re.compile(r"\b(" + "|".join(sorted(map(re.escape, _CANONICAL), key=len, reverse=True)) + r")\b")
#: an ATen / edge overload spelled in a reason: ``relu.default``, ``aten.view_copy.default``, ``flatten.using_ints``
_OVERLOAD = re.compile(r"\b(?:aten\.)?(\w+)\.(?:default|Tensor|Scalar|int|using_ints|dim|dims|input|padding)\b")
_QUOTED = re.compile(r"'[^'\s]+'")  # a quoted name; not the apostrophe of "producer's"


def normalize(reason: str) -> str:
    """``reason`` with its names and op spellings made format-neutral; every other word is kept."""
    text = _QUOTED.sub("'<name>'", reason)
    text = _OVERLOAD.sub(r"\1", text)
    return _OP_WORD.sub(lambda m: _CANONICAL[m.group(1)], text)


def test_normalize_keeps_the_words():
    torch_reason = "before conv2d 'conv2d_3': its input comes from 'relu_1' (relu.default)"
    onnx_reason = "before Conv '/conv/Conv': its input comes from 'Relu_1' (Relu)"
    expected = "before conv '<name>': its input comes from '<name>' (relu)"
    assert normalize(torch_reason) == normalize(onnx_reason) == expected
    assert normalize("'view_2' (aten.view_copy.default)") == normalize("'/Flatten' (Flatten)")
    assert normalize("no conv next to it") != normalize("no layer next to it")
    assert normalize("its output has 2 users") != normalize("its output feeds another node")
    assert normalize("the producer's output 'mm_1' has 2 users") == "the producer's output '<name>' has 2 users"


_REPORTS: dict = {}


def _reports(case, ir: str):
    """The fold reports of the case's ``ir`` program and of its ONNX export (folded once per run)."""
    key = (case.name, ir)
    if key not in _REPORTS:
        _REPORTS[key] = bnfold.fold(case.program(ir)).report, bnfold.fold(case.onnx("dynamo")).report
    return _REPORTS[key]


@pytest.mark.parametrize("ir", IRS)
@pytest.mark.parametrize("case", CASES, ids=str)
def test_same_counts(case, ir):
    program, onnx = _reports(case, ir)
    counts = (len(program.folded), len(program.skipped)), (len(onnx.folded), len(onnx.skipped))
    assert counts[0] == counts[1], (
        f"folded/skipped: torch.export ({ir}) {counts[0][0]}/{counts[0][1]}, "
        f"ONNX {counts[1][0]}/{counts[1][1]}\n{program.table()}\n{onnx.table()}"
    )


@pytest.mark.parametrize("ir", IRS)
@pytest.mark.parametrize("case", CASES, ids=str)
def test_same_skip_reasons(case, ir):
    program, onnx = _reports(case, ir)
    mine = sorted(normalize(s.reason) for s in program.skipped)
    theirs = sorted(normalize(s.reason) for s in onnx.skipped)
    assert mine == theirs, f"torch.export ({ir}): {mine} != ONNX: {theirs}"
