"""Constants a :class:`~.runner.Program` reads when an op reads them: a streamed model's large weights
(``bnfold fold --low-memory``; at least :data:`bnfold.fold_math.LARGE_BYTES`), left on disk by the load, are read
for the step that reads them and dropped after it, so a run holds the weight in use, not every weight
(:func:`.ranges.run_plain`, the fp16 range rewrite's calibration and proof)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch


@dataclass(frozen=True, eq=False)
class LazyConstant:
    """A constant read each time a step needs it: ``array()`` its stored value (a new buffer each call),
    ``tensor(array)`` that value as an eager program holds it; ``nbytes``: the array's size, from the dims the
    load checked against the stored bytes; ``key``: what names the stored bytes (the format's, e.g.
    :func:`bnfold.onnx.tensors.stored_key`; None: nothing does)."""

    array: Callable[[], np.ndarray]
    tensor: Callable[[np.ndarray], torch.Tensor]
    nbytes: int
    key: Any = None

    def value(self) -> torch.Tensor:
        """The value as stored (as an eager program holds it before a run converts its floats)."""
        return self.tensor(self.array())

    def load(self, dtype: torch.dtype) -> torch.Tensor:
        """The value as a run in ``dtype`` holds it (floats converted, as an eager program's constants are)."""
        t = self.value()
        return t.to(dtype) if t.is_floating_point() else t


def split(constants: dict[str, Any]) -> tuple[dict[str, Any], dict[str, LazyConstant]]:
    """``constants`` as ``(held, lazy)``: those in memory and those read at use."""
    lazy = {k: v for k, v in constants.items() if isinstance(v, LazyConstant)}
    return {k: v for k, v in constants.items() if k not in lazy}, lazy
