"""Each format's model files as its frontend (:mod:`bnfold.frontends`) reads and writes them: ``load`` and
``save`` for ``.pt2`` (the safe loader) and ``.onnx`` (with its external-data layout), with one-line errors."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import BnfoldError, ModelFileError
from .errors import naming, one_line
from .limits import Limits
from .pt2 import load_pt2
from .quiet import quiet

if TYPE_CHECKING:
    from .onnx_external import ExternalLayout


def _onnx():
    """``bnfold.io.onnx``, or a one-line error saying how to install ONNX support."""
    try:
        from . import onnx as io_onnx
    except ImportError as e:
        raise BnfoldError(f"ONNX support is not available ({one_line(e)}); install bnfold[onnx]") from None
    return io_onnx


def load_pt2_file(
    path: str, *, trust: bool = False, debug: bool = False, limits: Limits | None = None, stream: bool = False
):
    """A ``.pt2`` file through the safe loader: ``(program, None)`` (the ``.pt2`` frontend's ``load``; ``stream``
    changes nothing: a ``.pt2`` saves memory by folding in place)."""
    return load_pt2(path, trust=trust, debug=debug, limits=limits), None


def save_onnx_file(model: Any, path: str, layout: ExternalLayout | None = None) -> None:
    """Write an ONNX model with ``layout`` (the ONNX frontend's ``save``)."""
    _onnx().save_onnx(model, path, layout=layout)


def load_onnx_file(
    path: str, *, trust: bool = False, debug: bool = False, limits: Limits | None = None, stream: bool = False
):
    """An ``.onnx`` file and its external-data layout, with one-line errors (the ONNX frontend's ``load``;
    ``trust`` changes nothing: an ONNX file holds no code; ``stream``: its external data stays on disk,
    :mod:`bnfold.io.onnx_stream`)."""
    mod = _onnx()
    try:
        with quiet(not debug):
            model, layout = mod.load_onnx(path, limits, stream=stream)
    except BnfoldError as e:
        raise naming(e, path) from None
    except (MemoryError, RecursionError):
        raise
    except Exception as e:  # onnx raises many kinds for a bad file
        if debug:
            raise
        raise ModelFileError(f"{path}: cannot load the ONNX model ({one_line(e)})") from None
    mod.check_opset(model, path)
    return model, layout
