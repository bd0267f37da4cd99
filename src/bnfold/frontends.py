"""The registry of frontends: one entry per model kind bnfold folds, instead of ``isinstance`` dispatch.

A :class:`Frontend` names a model kind and says how to recognise one (``matches``), fold it
(``fold``), measure it (``measure``) and, for file formats, load and save it.  ``bnfold.fold``,
``bnfold.check`` and ``bnfold.measure`` find the frontend with :func:`frontend_for`; a new model
kind is one :func:`register` call.  ``matches`` never imports torch or onnx: a model object of
those kinds exists only once its library is imported.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .measure import Sizes, fx_sizes, onnx_sizes, timed
from .report import FoldResult


@dataclass(frozen=True)
class Frontend:
    """One model kind.  ``fold(model, example_inputs, only, exclude, lower_unfoldable)`` returns a
    :class:`FoldResult` with ``report.stats`` filled in; ``load(path, trust)`` / ``save(model, path)``
    are None for a kind that has no file of its own (an ``nn.Module``)."""

    name: str
    matches: Callable[[Any], bool]
    fold: Callable[..., FoldResult]
    measure: Callable[[Any], Sizes]
    load: Callable[..., Any] | None = None
    save: Callable[[Any, str], None] | None = None
    needs_inputs: bool = False  #: ``fold`` needs example inputs (it exports the model)
    #: the audit's hooks for this kind (``bnfold.numerics.runner.AuditFormat``), imported when called
    numerics: Callable[[], Any] | None = None


FRONTENDS: list[Frontend] = []


def register(frontend: Frontend) -> Frontend:
    """Add ``frontend`` (tried after those already registered)."""
    FRONTENDS.append(frontend)
    return frontend


def frontend_for(model: Any) -> Frontend | None:
    """The first registered frontend that matches ``model``, or None."""
    return next((f for f in FRONTENDS if f.matches(model)), None)


def by_name(name: str) -> Frontend:
    found = next((f for f in FRONTENDS if f.name == name), None)
    if found is None:
        raise KeyError(f"no frontend named {name!r}; known: {', '.join(f.name for f in FRONTENDS)}")
    return found


# ----------------------------------------------------------------------------- the built-in frontends


def _is_onnx(model: Any) -> bool:
    return "onnx" in sys.modules and isinstance(model, sys.modules["onnx"].ModelProto)


def _is_program(model: Any) -> bool:
    return "torch" in sys.modules and isinstance(model, sys.modules["torch"].export.ExportedProgram)


def _is_module(model: Any) -> bool:
    return "torch" in sys.modules and isinstance(model, sys.modules["torch"].nn.Module)


def _fold_onnx(model, example_inputs, only, exclude, lower_unfoldable) -> FoldResult:
    from .onnx import fold_onnx

    run = lambda: fold_onnx(model, only=only, exclude=exclude, lower_unfoldable=lower_unfoldable)  # noqa: E731
    return timed(model, run, onnx_sizes)


def _fold_program(model, example_inputs, only, exclude, lower_unfoldable) -> FoldResult:
    from .torch_export import fold_program

    run = lambda: fold_program(model, only=only, exclude=exclude, lower_unfoldable=lower_unfoldable)  # noqa: E731
    return timed(model, run, fx_sizes)


def _fold_module(model, example_inputs, only, exclude, lower_unfoldable) -> FoldResult:
    from .module import fold_module

    return fold_module(model, example_inputs, only=only, exclude=exclude, lower_unfoldable=lower_unfoldable)


def _load_onnx(path: str, trust: bool = False) -> Any:
    from .io.onnx import load_onnx

    return load_onnx(path).model


def _save_onnx(model: Any, path: str) -> None:
    from .io.onnx import save_onnx

    save_onnx(model, path)


def _load_pt2(path: str, trust: bool = False) -> Any:
    from .io.pt2 import load_pt2

    return load_pt2(path, trust=trust)


def _save_pt2(model: Any, path: str) -> None:
    from .io.pt2 import save_pt2

    save_pt2(model, path)


def _onnx_numerics() -> Any:
    from .numerics.onnx_program import ONNX_AUDIT

    return ONNX_AUDIT


def _fx_numerics() -> Any:
    from .numerics.fx_program import FX_AUDIT

    return FX_AUDIT


ONNX = register(Frontend("onnx", _is_onnx, _fold_onnx, onnx_sizes, _load_onnx, _save_onnx, numerics=_onnx_numerics))
PROGRAM = register(
    Frontend("exported_program", _is_program, _fold_program, fx_sizes, _load_pt2, _save_pt2, numerics=_fx_numerics)
)
MODULE = register(Frontend("nn_module", _is_module, _fold_module, fx_sizes, needs_inputs=True, numerics=_fx_numerics))
