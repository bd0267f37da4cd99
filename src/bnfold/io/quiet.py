"""Silencing third-party output while bnfold reads, folds and writes models, so
that the command line's errors stay one line."""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterator

_LOGGERS = ("torch", "onnx", "onnxruntime", "onnx_ir", "bnfold")


@contextlib.contextmanager
def quiet(enabled: bool = True) -> Iterator[None]:
    """Silence warnings and torch/onnx log records below ERROR while the block runs (no-op if not ``enabled``)."""
    if not enabled:
        yield
        return
    loggers = [logging.getLogger(n) for n in _LOGGERS]
    levels = [lg.level for lg in loggers]
    try:
        for lg in loggers:
            lg.setLevel(logging.ERROR)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        for lg, lvl in zip(loggers, levels):
            lg.setLevel(lvl)
