"""Folding an ONNX model: a copy of it, folded by the engine through ``OnnxGraph``,
then tidied (removed nodes dropped, new ones placed, dead constants and stale
value_info removed)."""

from __future__ import annotations

import os

import onnx

from ..engine import fold_graph
from ..kinds import check_exclude, check_only
from ..report import Code, FoldReport, FoldResult
from .clean_up import clean_up
from .editor import ModelEditor
from .functions import inline_norm_functions, skipped_in_functions
from .graph import OnnxGraph
from .index import Tracker
from .shapes import Shapes


def fold_onnx(model_or_path, only=None, exclude=(), lower_unfoldable: bool = False) -> FoldResult:
    """Fold BatchNormalization and per-channel affines into Conv / ConvTranspose / Gemm / MatMul.

    ``model_or_path`` is an ``onnx.ModelProto`` (never mutated) or a path to a
    ``.onnx`` file (read with :func:`bnfold.onnx.load_onnx`).  ``only`` limits
    the layer kinds folded into (``"conv"``, ``"conv_transpose"``, ``"linear"``);
    ``exclude`` holds fnmatch patterns on node names left unfolded (both validated:
    ``bnfold.kinds``).
    ``lower_unfoldable``: rewrite every eval BatchNormalization that stays as
    ``Mul`` and ``Add`` by per-channel constants (``report.lowered``).
    A call to a model-local function that holds a normalization is inlined
    first (a note in the report); a normalization left in a function is
    reported as skipped.
    The result's ``model`` is a new ModelProto.  It carries no external-data
    layout: to save it the way a file was laid out, read the file with
    ``load_onnx`` and pass its layout to ``save_onnx``.
    """
    if isinstance(model_or_path, (str, os.PathLike)):
        from ..io.onnx import load_onnx

        original = load_onnx(model_or_path).model
    elif isinstance(model_or_path, onnx.ModelProto):
        original = model_or_path
    else:
        raise TypeError(f"fold_onnx takes an onnx.ModelProto or a path, not {type(model_or_path).__name__}")
    only, exclude = check_only(only), check_exclude(exclude)  # before any work: a bad kind is a ValueError
    source, notes = inline_norm_functions(original)  # a new model, or ``original`` itself
    model = onnx.ModelProto()
    model.CopyFrom(source)
    tracker = Tracker()
    index = ModelEditor(model, tracker)
    shapes = Shapes(source)
    index.inferred_type = shapes.elem_type  # CastLike(constant, x): x's type, where only inference knows it
    index.inferred_dims = shapes.dims  # Shape(x): x's dims, where only inference knows them
    report = fold_graph(OnnxGraph(index, shapes), only, exclude, lower=lower_unfoldable)
    report.notes.extend(notes)
    report.skipped.extend(skipped_in_functions(model))
    index.compact()  # only now: node protos are the engine's handles while it runs
    clean_up(model, tracker, shapes, index)
    return FoldResult(model, report)


def training_norms(model: onnx.ModelProto, report: FoldReport | None = None) -> list[str]:
    """The names of the normalizations of ``model`` in training mode, read from its fold report (``report``,
    else the model is folded to get one)."""
    if report is None:
        report = fold_onnx(model).report
    return [s.norm for s in report.skipped if s.code == Code.TRAINING_MODE]


def range_edit_onnx(original: onnx.ModelProto, edit) -> tuple[onnx.ModelProto, list]:
    """``edit(adapter)`` (the fp16 range rewrite, ``bnfold.engine.range``) on a copy of ``original``: the new
    model (``original`` itself when nothing was rewritten) and the entries ``edit`` returned."""
    model = onnx.ModelProto()
    model.CopyFrom(original)
    tracker = Tracker()
    index = ModelEditor(model, tracker)
    shapes = Shapes(original)
    index.inferred_type, index.inferred_dims = shapes.elem_type, shapes.dims
    entries = edit(OnnxGraph(index, shapes))
    if not any(e.factor != 1.0 for e in entries):
        return original, entries
    index.compact()
    clean_up(model, tracker, shapes, index)
    return model, entries
