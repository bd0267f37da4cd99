"""The work budget: how many bytes live at once and FLOPs in all one model may make bnfold use, and the
``--max-work`` override (shared by the cost model, :mod:`bnfold.io.cost`, and the run-time checks,
:mod:`bnfold.io.run_checks`)."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from dataclasses import dataclass

from ..errors import ModelFileError

MIB = 1 << 20
FLOOR_BYTES = 256 * MIB
CONTENT_MULTIPLE = 16
INPUT_MULTIPLE = 4
FLOPS_PER_BYTE = 256
NODE_FLOPS = 10_000  # the fixed cost of running one node (dispatch), counted as FLOPs
MAX_BATCHES = 10_000
#: The audit's FLOPs on inputs the user chose, per run: one multiply-add per weight per input element (what a
#: model does that applies every weight at every position of its input: a fully convolutional net at the
#: input's resolution; an honest one does less, its later layers on smaller maps).
INPUT_FLOPS_PER_WEIGHT = 2
#: The least byte budget of an audit (what it holds counted as :mod:`bnfold.numerics.audit_memory` counts it): with
#: the ~330 MiB that Python, torch and onnx take, a file whose content justifies less cannot make the audit peak past
#: 1 GiB (issue 44; SECURITY.md, "The audit's own bounds").
AUDIT_FLOOR_BYTES = 512 * MIB
#: The audit's bytes per byte of one batch of inputs the user chose, per unit of the audit's multiple (its values held
#: 8x: 512 bytes per input byte): a fully convolutional model of 32 channels at the input's resolution plans ~450
#: (six 3x3 convs, 128x128 and 512x512), PP-OCRv4 det 88-94 (640x640, 960x960).  A file's own shapes get none.
CHOSEN_INPUT_MULTIPLE = 64
#: The memory loading a ``.pt2`` takes per value of its JSON entries (bnfold's checks' ``json.loads``, then
#: ``torch.export.load``'s dataclasses and graph), as :func:`bnfold.io.limits.json_values` counts them: measured
#: up to 0.7 KiB on exported programs and 0.5-0.8 KiB on crafted ones (BENCHMARKS.md part P); the load then takes
#: 22-33 us per value.  A file's JSON may hold :func:`json_values_allowed` of them.
JSON_VALUE_BYTES = 1024
#: The memory loading a ``.pt2`` takes per byte of its JSON text, whatever the values: a string is held as bytes,
#: then as ``str`` (4 bytes a character once one of them is past U+FFFF) by bnfold's checks and again by
#: ``torch.export.load``: a 200 MiB string in one node's metadata measured 3.3x its bytes of peak memory, 7.2x with
#: one character past U+FFFF (2026-12-06).  A file's JSON text may be ``budget / JSON_TEXT_BYTES`` bytes (32 MiB
#: for a file under 16 MiB; a real program holds 17-21 bytes a value, so its values bind first).
JSON_TEXT_BYTES = 8
MAX_WORK_HINT = "pass --max-work N (bytes, e.g. 4GiB) to allow more if the model really is that big"
#: the units ``--max-work`` / ``--max-bytes`` take (``4GiB``, ``512M``, ``2GB``, ``1e9``); K, M, G, T alone are binary
BYTE_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": MIB, "g": 1 << 30, "t": 1 << 40}
BYTE_UNITS.update({u + "ib": v for u, v in BYTE_UNITS.items() if u not in ("", "b")})
BYTE_UNITS.update({"kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12})


def parse_bytes(text: str) -> int:
    """A byte count as people write it: ``1000000000``, ``1e9``, ``4GiB``, ``4 GiB``, ``512M``, ``2GB``, ``1.5G``
    (K, M, G, T alone and KiB..TiB are powers of 1024, KB..TB of 1000), rounded up to whole bytes.  ValueError
    for anything else, or for less than one byte."""
    import math
    import re

    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*", text)
    unit = m.group(2).lower() if m else ""
    if m is None or unit not in BYTE_UNITS:
        raise ValueError(f"expected a number of bytes such as 1e9, 4GiB or 512MiB, got {text!r}")
    value = float(m.group(1)) * BYTE_UNITS[unit]
    if not math.isfinite(value) or value < 1:
        raise ValueError(f"expected at least one byte, got {text!r}")
    return math.ceil(value)


def max_work_needed(nbytes: int = 0, flops: int = 0, at_least: bool = False, per_byte: int = 1) -> str:
    """The hint of a refusal: the ``--max-work`` value whose budget holds ``nbytes`` at once and ``flops``
    (``per_byte``: :attr:`Budget.per_byte`; ``at_least``: a bound found part-way, more may be needed)."""
    n = max(-(-int(nbytes) // per_byte), -(-int(flops) // FLOPS_PER_BYTE), 1)
    value = _arg(n)
    return f"{'at least ' if at_least else ''}--max-work {value} would allow it (if the model really is that big)"


def _arg(n: int) -> str:
    """``n`` bytes rounded up to a whole number of the largest unit it reaches, as ``--max-work`` reads it."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", MIB), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{-(-n // scale)}{unit}"
    return str(n)


class WorkError(ModelFileError):
    """Running the model would allocate or compute more than its content justifies."""


@dataclass(frozen=True)
class Budget:
    """Bytes live at once and FLOPs in all that one model may make bnfold use."""

    bytes: int
    flops: int
    per_byte: int = 1  #: bytes of this budget per byte of ``--max-work`` (the audit's budget holds its values 8x)

    @classmethod
    def for_content(cls, weights: int, inputs: int = 0, override: int | None = None, flops: int = 0) -> Budget:
        """The budget of a model whose weights hold ``weights`` bytes, run on ``inputs`` bytes of one batch
        (``flops``: the work of inputs the user chose, :func:`input_flops`, beyond the content's)."""
        override = current_override() if override is None else override
        b = (
            override
            if override
            else max(FLOOR_BYTES, CONTENT_MULTIPLE * max(0, int(weights))) + INPUT_MULTIPLE * inputs
        )
        return cls(b, FLOPS_PER_BYTE * b + flops)

    @classmethod
    def for_audit(cls, weights: int, inputs: int, multiple: int, flops: int = 0) -> Budget:
        """The budget of an audit of a model whose weights hold ``weights`` bytes, on ``inputs`` bytes of one batch,
        that holds each value ``multiple`` times over (``per_byte``): ``multiple`` x the content's part, at least
        :data:`AUDIT_FLOOR_BYTES`, plus ``multiple`` x :data:`CHOSEN_INPUT_MULTIPLE` x the inputs when the user chose
        them (:func:`inputs_chosen`: a file's own shapes buy nothing); under ``--max-work N``, ``multiple`` x N.
        FLOPs: the content's, plus ``flops`` (:func:`input_flops`)."""
        content = cls.for_content(weights, inputs)
        override = current_override()
        if override:
            nbytes = override * multiple
        else:
            own = max(AUDIT_FLOOR_BYTES, multiple * CONTENT_MULTIPLE * max(0, int(weights)))
            cap = _CHOSEN_ELEMENTS.get()
            if cap is not None:  # no more than the user chose (8 bytes an element at most): a file's own input
                inputs = min(inputs, cap * 8)  # beside the ones the user shaped buys nothing either
            nbytes = own + (multiple * CHOSEN_INPUT_MULTIPLE * inputs if _CHOSEN.get() else 0)
        return cls(nbytes, content.flops + flops, multiple)

    @classmethod
    def for_inputs(cls, weights: int, override: int | None = None) -> int:
        """The most bytes one batch of inputs may take for a model with ``weights`` bytes of weights."""
        return cls.for_content(weights, 0, override).bytes // INPUT_MULTIPLE


def json_values_allowed(file_size: int) -> int:
    """How many JSON values (:func:`bnfold.io.limits.json_values`) a ``.pt2`` file of ``file_size`` bytes may hold:
    as many as the load's work budget holds at :data:`JSON_VALUE_BYTES` each, the file's size standing for its
    weights (``max(256 MiB, 16 x the file)``, or ``--max-work N``): 262,144 values for a file under 16 MiB."""
    return Budget.for_content(file_size).bytes // JSON_VALUE_BYTES


_OVERRIDE: contextvars.ContextVar[int | None] = contextvars.ContextVar("bnfold_max_work", default=None)
_CHOSEN: contextvars.ContextVar[bool | None] = contextvars.ContextVar("bnfold_inputs_chosen", default=None)
_CHOSEN_ELEMENTS: contextvars.ContextVar[int | None] = contextvars.ContextVar("bnfold_chosen_elements", default=None)


@contextlib.contextmanager
def inputs_chosen(chosen: bool, outer: bool = True, elements: int | None = None) -> Iterator[None]:
    """Within the block, the inputs the audit runs were chosen by the user (tensors passed in, an ``.npz`` file,
    ``--input-shape``), not taken from the file's own shapes: :func:`input_flops` grants their work and
    :meth:`Budget.for_audit` their bytes.  ``outer=False``: unless an enclosing block said otherwise (the fold's
    ``fp16_range`` calibration batches are the user's, unless the audit drew them from the file's shapes).
    ``elements``: the most input elements the user chose (the load's check of a file's own example shapes, before
    the batches exist: :func:`input_flops` grants those shapes' work up to this many elements, never more)."""
    inherit = not outer and _CHOSEN.get() is not None
    token = _CHOSEN.set(_CHOSEN.get() if inherit else bool(chosen))
    cap = _CHOSEN_ELEMENTS.set(_CHOSEN_ELEMENTS.get() if inherit else elements)
    try:
        yield
    finally:
        _CHOSEN_ELEMENTS.reset(cap)
        _CHOSEN.reset(token)


def input_flops(weight_elements: int, input_elements: int, runs: int) -> int:
    """The FLOPs that ``runs`` runs on inputs the user chose justify beyond the content's budget:
    :data:`INPUT_FLOPS_PER_WEIGHT` per weight element per element of one batch of inputs, per run; 0 when
    the inputs' sizes came from the file (a file cannot buy itself work by declaring a large input) or
    under ``--max-work`` (the budget is then what the user set).  The sizes are the plan's, computed from
    the ops: a file whose values outgrow its input (a conv's padding, an upsample's factor) spends them at
    the rate its outputs grow, and meets the byte budget and this one as before."""
    if not _CHOSEN.get() or current_override():
        return 0
    cap = _CHOSEN_ELEMENTS.get()
    if cap is not None:  # a file's own example shapes, checked at load: no more than the user chose
        input_elements = min(input_elements, cap)
    return max(0, runs) * INPUT_FLOPS_PER_WEIGHT * max(0, weight_elements) * max(0, input_elements)


def current_override() -> int | None:
    return _OVERRIDE.get()


@contextlib.contextmanager
def max_work(n: int | None) -> Iterator[None]:
    """Within the block, every budget is ``n`` bytes (and ``256 n`` FLOPs); None keeps the default."""
    token = _OVERRIDE.set(n or None)
    try:
        yield
    finally:
        _OVERRIDE.reset(token)


def size_text(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", MIB), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n} bytes"


def sizes_text(*ns: int) -> tuple[str, ...]:
    """:func:`size_text` of each of ``ns`` (a size and the limit it passed), or each in bytes where two different
    ones would read the same (three digits: 131,073 bytes over 131,072 read "128 KiB, over the 128 KiB")."""
    texts = tuple(size_text(n) for n in ns)
    if len(set(texts)) < len(set(ns)):
        return tuple(f"{n:,} bytes" for n in ns)
    return texts
