"""Models by file name, for the command line: load a ``.pt2`` or ``.onnx``
file, and write the folded model (with any side file) to an :class:`OutputPlan`.

The ONNX external-data layout read by :func:`load_model` travels in
``LoadedModel.layout``; the caller hands it to :func:`save_model`.  Every
failure is a one-line ``BnfoldError`` that names the file.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import BnfoldError, ModelFileError
from . import cost
from .atomic import atomic_path
from .errors import naming, one_line
from .files import model_kind
from .limits import MAX_BYTES_HINT, Limits
from .output import OutputPlan
from .quiet import quiet

if TYPE_CHECKING:
    from .onnx_external import ExternalLayout


@dataclass
class LoadedModel:
    """A model read from ``path``: ``kind`` is ``"pt2"`` or ``"onnx"``; ``layout`` is an ONNX
    file's external-data layout (None for ``.pt2`` and for ONNX without external data)."""

    path: str
    kind: str
    model: Any
    layout: ExternalLayout | None = None


def load_model(
    path: str | os.PathLike,
    *,
    trust: bool = False,
    debug: bool = False,
    max_bytes: int | None = None,
    max_work: int | None = None,
    stream: bool = False,
) -> LoadedModel:
    """Read a ``.pt2`` (safely, unless ``trust``) or ``.onnx`` file, chosen by its extension.

    ``max_bytes`` bounds what the file may unpack to (default: see
    :class:`bnfold.io.limits.Limits`); running out of memory is a one-line error.
    Then the cost of running the model once (:mod:`bnfold.io.cost`) must fit the
    budget its weights justify, or ``max_work`` bytes (also ``--trust``: it
    is about work, not code); a ``.pt2``'s JSON must fit that budget before it is
    parsed (:meth:`bnfold.io.pt2.archive.Archive.check_json_values`; not with
    ``--trust``).  ``stream``: an ONNX file's external data stays on disk; fold and
    save the model inside :func:`reading` (``--low-memory``).
    """
    from ..frontends import for_kind

    path = os.fspath(path)
    kind = model_kind(path)
    limits = Limits(max_bytes=max_bytes or None)
    try:
        files = for_kind(kind).files
        with cost.max_work(max_work or cost.current_override()):  # the load's own checks use the budget too
            loaded = LoadedModel(path, kind, *files.load(path, trust=trust, debug=debug, limits=limits, stream=stream))
            with reading(loaded):
                check_cost(loaded)
    except MemoryError:
        raise ModelFileError(f"{path}: out of memory while loading the model; {MAX_BYTES_HINT}") from None
    except RecursionError:
        raise ModelFileError(f"{path}: the model nests too deeply to be read; refused") from None
    return loaded


def reading(loaded: LoadedModel) -> contextlib.AbstractContextManager:
    """The block within which a streamed model's tensors can be read (its layout's ``reading()``); a no-op
    for a model held in memory."""
    opened = getattr(loaded.layout, "reading", None)
    return opened() if opened is not None else contextlib.nullcontext()


def hold(loaded: LoadedModel, model: Any) -> None:
    """Inside :func:`reading`: ``model`` (the folded ``loaded.model``) holds every tensor in memory, as
    after a plain load (a streamed layout's ``hold``); a no-op for a model held in memory."""
    held = getattr(loaded.layout, "hold", None)
    if held is not None:
        held(model)


def check_cost(loaded: LoadedModel) -> None:
    """Refuse a model whose one run (its own example shapes) costs more than its content justifies
    (its frontend's ``check_cost``)."""
    from ..frontends import for_kind

    for_kind(loaded.kind).files.check_cost(loaded.model, loaded.path)


def save_model(
    model: Any,
    plan: OutputPlan,
    *,
    layout: ExternalLayout | None = None,
    texts: Mapping[str, str] | None = None,
    debug: bool = False,
) -> None:
    """Write ``model`` to ``plan.path`` atomically, with ``layout`` for an ONNX model.

    ``texts`` maps side files (a report) to their contents: they are staged
    before the model is written and put in place only when it was, so a failed
    save leaves no file behind.
    """
    with contextlib.ExitStack() as staged:
        for path, text in (texts or {}).items():
            _stage_text(staged, path, text)
        _write_model(model, plan, layout, debug)


def _stage_text(staged: contextlib.ExitStack, path: str, text: str) -> None:
    """Write ``text`` to a temporary file that replaces ``path`` when ``staged`` closes without error."""
    try:
        tmp = staged.enter_context(atomic_path(path))
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as e:
        raise ModelFileError(f"{path}: cannot write the file ({e.strerror or e})") from None


def _write_model(model: Any, plan: OutputPlan, layout: ExternalLayout | None, debug: bool) -> None:
    from ..frontends import for_kind

    try:
        with quiet(not debug):
            for_kind(plan.kind).files.save(model, plan.path, layout)
    except BnfoldError as e:
        raise naming(e, plan.path) from None
    except Exception as e:  # torch and onnx raise many kinds; each is a failed write
        if debug:
            raise
        raise ModelFileError(f"{plan.path}: cannot write the model ({one_line(e)})") from None
