"""The registry of frontends: one entry per model kind bnfold folds, and the one place that tells formats apart.

A :class:`Frontend` names a model kind and says how to recognise one (``matches``), fold it
(``fold``), measure it (``measure``), name it in a message (``what``), find its normalizations in
training mode (``training_norms``) and audit it (``numerics``: the :class:`~bnfold.numerics.runner.AuditFormat`);
a file format also says how to load, cost-check and save its files, which other files a model file reads
or writes beside itself, and how to make input batches (random ones, or arrays from an ``.npz``) for the
audit.  ``bnfold.fold``, ``bnfold.check``, ``bnfold.measure``, ``bnfold.audit``, the CLI and ``bnfold.io``
find the frontend with :func:`frontend_for` (a model) or :func:`for_kind` (a file kind, ``bnfold.io.files``);
a new model kind is one :func:`register` call.  ``matches`` never imports torch or onnx: a model object
of those kinds exists only once its library is imported.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .measure import Sizes, fx_sizes, onnx_sizes, timed
from .report import FoldResult


def _no_files(path: str) -> set[str]:
    return set()


def _no_training_norms(model: Any, report: Any = None) -> list[str]:
    return []


def _nothing_beside(path: str) -> list[tuple[str, str]]:
    return []


@dataclass(frozen=True)
class FileFormat:
    """How a model kind is stored: ``kind`` is ``bnfold.io.files``' name for it; ``load(path, *, trust, debug,
    limits) -> (model, layout)``; ``check_cost(model, path)``: one run on its own shapes within the budget its
    content justifies, before anything runs; ``save(model, path, layout)``; ``reads_beside(path)``: the real
    paths of the files a model file reads besides itself (external data); ``writes_beside(path)``: the ``(what,
    path)`` of the files saving it writes beside it."""

    kind: str
    load: Callable[..., tuple[Any, Any]]
    check_cost: Callable[[Any, str], None]
    save: Callable[..., None]
    reads_beside: Callable[[str], set[str]] = _no_files
    writes_beside: Callable[[str], list[tuple[str, str]]] = _nothing_beside


@dataclass(frozen=True)
class Frontend:
    """One model kind.

    * ``fold(model, example_inputs, only, exclude, lower_unfoldable, fp16_range=None, inplace=False)`` returns a
      :class:`FoldResult` with ``report.stats`` filled in (``fp16_range``: a ``bnfold.rescale.RangeRequest``);
      ``needs_inputs``: it needs example inputs (it exports the model); ``folds_in_place``: it also takes
      ``inplace=True`` (the model is consumed, no second copy of its weights is made).
    * ``range_edit(model, edit) -> (model, entries)``: ``edit(graph adapter)`` (the fp16 range rewrite,
      ``bnfold.engine.range``) on a copy of the model, and the copy rebuilt (the model itself when nothing changed).
    * ``training_norms(model, report=None)``: the names of its normalizations in training mode (``report``:
      the model's fold report, when the kind reads them from it).
    * ``numerics()``: its audit hooks (:class:`bnfold.numerics.runner.AuditFormat`), imported when called;
      ``batches(model, npz, n, seed, input_shapes, arrays=None)`` the audit's input batches: the arrays of the
      ``.npz`` file ``npz`` (``arrays``: the ones :func:`bnfold.io.npz.read_npz` read from it already), else ``n``
      random ones from ``seed``; ``open_dims``: its inputs may leave dims open, which
      ``input_shapes`` (``--input-shape``) fixes; ``runtimes``: the real runtimes the audit can run it on.
    * ``files``: its :class:`FileFormat` (None for a kind without a file of its own: an ``nn.Module``).
    """

    name: str
    matches: Callable[[Any], bool]
    fold: Callable[..., FoldResult]
    measure: Callable[[Any], Sizes]
    noun: str  #: the model kind in a message ("ONNX model")
    training_norms: Callable[..., list[str]] = _no_training_norms
    numerics: Callable[[], Any] | None = None
    batches: Callable[..., list[tuple]] | None = None
    files: FileFormat | None = None
    needs_inputs: bool = False
    open_dims: bool = False
    runtimes: tuple[str, ...] = ()
    range_edit: Callable[[Any, Callable], tuple] | None = None
    folds_in_place: bool = False

    @property
    def what(self) -> str:
        """The model kind with its article ("an ONNX model")."""
        return f"an {self.noun}"


FRONTENDS: list[Frontend] = []


def register(frontend: Frontend) -> Frontend:
    """Add ``frontend`` (tried after those already registered)."""
    FRONTENDS.append(frontend)
    return frontend


def frontend_for(model: Any) -> Frontend | None:
    """The first registered frontend that matches ``model``, or None."""
    return next((f for f in FRONTENDS if f.matches(model)), None)


def for_kind(kind: str) -> Frontend:
    """The frontend of the file kind ``kind`` (``bnfold.io.files.model_kind``'s answer)."""
    return next(f for f in FRONTENDS if f.files is not None and f.files.kind == kind)


# ----------------------------------------------------------------------------- the built-in frontends


def _is_onnx(model: Any) -> bool:
    return "onnx" in sys.modules and isinstance(model, sys.modules["onnx"].ModelProto)


def _is_program(model: Any) -> bool:
    return "torch" in sys.modules and isinstance(model, sys.modules["torch"].export.ExportedProgram)


def _is_module(model: Any) -> bool:
    return "torch" in sys.modules and isinstance(model, sys.modules["torch"].nn.Module)


def _rescaled(result: FoldResult, fp16_range) -> FoldResult:
    """``result`` rewritten for fp16 range (``bnfold.rescale``) when ``fp16_range`` asks for it."""
    if fp16_range is None:
        return result
    from .rescale import rescale_result

    fe = frontend_for(result.model)
    if fe is None or fe.numerics is None or fe.range_edit is None:
        raise TypeError(f"fp16_range: cannot rewrite a {type(result.model).__name__}")
    return rescale_result(result, fp16_range, fe.numerics(), fe.range_edit)


def _fold_onnx(model, example_inputs, only, exclude, lower_unfoldable, fp16_range=None) -> FoldResult:
    from .onnx import fold_onnx

    run = lambda: fold_onnx(model, only=only, exclude=exclude, lower_unfoldable=lower_unfoldable)  # noqa: E731
    return _rescaled(timed(model, run, onnx_sizes), fp16_range)


def _fold_program(
    model, example_inputs, only, exclude, lower_unfoldable, fp16_range=None, inplace: bool = False
) -> FoldResult:
    from .torch_export import fold_program

    def run() -> FoldResult:
        return fold_program(model, only=only, exclude=exclude, lower_unfoldable=lower_unfoldable, inplace=inplace)

    return _rescaled(timed(model, run, fx_sizes), fp16_range)


def _fold_module(model, example_inputs, only, exclude, lower_unfoldable, fp16_range=None) -> FoldResult:
    from .module import fold_module

    rescale = None if fp16_range is None else (lambda result: _rescaled(result, fp16_range))  # noqa: E731
    return fold_module(
        model, example_inputs, only=only, exclude=exclude, lower_unfoldable=lower_unfoldable, rescale=rescale
    )


def _program_range_edit(model: Any, edit: Callable) -> tuple:
    from .torch_export.fold import range_edit_program

    return range_edit_program(model, edit)


def _onnx_range_edit(model: Any, edit: Callable) -> tuple:
    from .onnx.fold import range_edit_onnx

    return range_edit_onnx(model, edit)


def _onnx_training_norms(model: Any, report: Any = None) -> list[str]:
    from .onnx.fold import training_norms

    return training_norms(model, report)


def _program_training_norms(ep: Any, report: Any = None) -> list[str]:
    from .torch_export.fold import training_norms

    return training_norms(ep, report)


def _files() -> Any:
    from .io import model_files

    return model_files


def _load_onnx(path: str, **options: Any) -> tuple[Any, Any]:
    return _files().load_onnx_file(path, **options)


def _load_pt2(path: str, **options: Any) -> tuple[Any, Any]:
    return _files().load_pt2_file(path, **options)


def _check_onnx_cost(model: Any, path: str) -> None:
    from .io.onnx_cost import onnx_plan

    onnx_plan(model, path)


def _check_pt2_cost(model: Any, path: str) -> None:
    from .io.fx_cost import fx_plan
    from .io.fx_shapes import from_file

    from_file(model)  # its metadata is believed only where the plan's recomputation checked it
    fx_plan(model, where=path)


def _save_onnx(model: Any, path: str, layout: Any = None) -> None:
    _files().save_onnx_file(model, path, layout)


def _save_pt2(model: Any, path: str, layout: Any = None) -> None:
    from .io.pt2 import save_pt2

    save_pt2(model, path)


def _onnx_reads_beside(path: str) -> set[str]:
    from .io.files import onnx_external_files

    return onnx_external_files(path)


def _onnx_writes_beside(path: str) -> list[tuple[str, str]]:
    from .io.files import onnx_data_path

    return [("external data", onnx_data_path(path))]


def _onnx_batches(
    model: Any, npz: str | None, n: int, seed: int, input_shapes: dict | None, arrays: dict | None = None
) -> list[tuple]:
    if npz:
        from .io.batches import onnx_npz_batches

        return onnx_npz_batches(model, npz, input_shapes, arrays)
    from .numerics.onnx_program import random_batches

    return random_batches(model, input_shapes, n, seed=seed)


def _program_batches(
    model: Any, npz: str | None, n: int, seed: int, input_shapes: dict | None, arrays: dict | None = None
) -> list[tuple]:
    from .errors import BnfoldError
    from .io import batches

    if npz and input_shapes:
        raise BnfoldError("--input-shape shapes the --random batches of a .pt2 program; an --inputs file has its own")
    return batches.npz_batches(model, npz, arrays) if npz else batches.random_batches(model, n, seed, input_shapes)


def _onnx_numerics() -> Any:
    from .numerics.onnx_program import OnnxAudit

    return OnnxAudit()


def _program_numerics() -> Any:
    from .numerics.fx_program import PROGRAM_AUDIT

    return PROGRAM_AUDIT


def _module_numerics() -> Any:
    from .numerics.fx_program import MODULE_AUDIT

    return MODULE_AUDIT


ONNX_FILES = FileFormat("onnx", _load_onnx, _check_onnx_cost, _save_onnx, _onnx_reads_beside, _onnx_writes_beside)
PT2_FILES = FileFormat("pt2", _load_pt2, _check_pt2_cost, _save_pt2)
_ONNX_HOOKS = (_onnx_training_norms, _onnx_numerics, _onnx_batches, ONNX_FILES)
_PROGRAM_HOOKS = (_program_training_norms, _program_numerics, _program_batches, PT2_FILES)

ONNX = register(
    Frontend(
        "onnx",
        _is_onnx,
        _fold_onnx,
        onnx_sizes,
        "ONNX model",
        *_ONNX_HOOKS,
        open_dims=True,
        runtimes=("torch", "onnxruntime"),
        range_edit=_onnx_range_edit,
    )
)
PROGRAM = register(
    Frontend(
        "exported_program",
        _is_program,
        _fold_program,
        fx_sizes,
        "ExportedProgram",
        *_PROGRAM_HOOKS,
        range_edit=_program_range_edit,
        folds_in_place=True,
    )
)
MODULE = register(
    Frontend("nn_module", _is_module, _fold_module, fx_sizes, "nn.Module", numerics=_module_numerics, needs_inputs=True)
)
