"""``fold(model, fp16_range=batches)``: calibrate, rewrite exactly by powers of two, prove, report.

1. Calibrate: the folded model runs in float32 on the batches (the numerics' :class:`~.numerics.runner.Program`
   of its format, within the audit's work budget); each value's peak magnitude is kept, the intermediate values
   of a spelled-out op included (a decomposed norm's ``x ** 2``).
2. Rewrite: every value whose peak passes the target (fp16's 65504 over the margin; constants inside the profile's
   limits) is scaled by a power of two with every writer and reader compensating (``bnfold.engine.range``, through
   the frontend's graph adapter).
3. Prove: the rewritten model and the folded one run in float64 on the calibration batches and on fresh inputs
   drawn like them; the outputs agree to a relative error of at most 1e-6, or the rewrite is not made
   (``Code.INEXACT``).  The peaks after come from that run: ``report.rescaled`` holds the margin reached.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from .engine.range import Limits, rescale_graph
from .numerics.profiles import FP16_MAX
from .report import Code, FoldResult

#: the largest output difference a rewrite may make, relative to the output's magnitude, in float64
TOLERANCE = 1e-6
#: onnxconverter-common's clamp of constants (``ort-cpu`` profile): magnitudes below and above move
CONVERTER_CLAMP = (1e-7, 1e4)


@dataclass(frozen=True)
class RangeRequest:
    """What ``fold(..., fp16_range=batches, fp16_margin=16.0, profile=None)`` asks for."""

    batches: Any
    margin: float = 16.0
    profile: str | None = None

    def limits(self) -> Limits:
        """Values under 65504 / margin; constants inside the named profile's limits, or, when no profile is named,
        under the smaller of fp16's largest and onnxconverter-common's clamp (1e4).  The clamp's lower end (1e-7)
        bounds only where ``ort-cpu`` is named: a scaled-down eps of a spelled-out norm passes it, and the value
        it is added to is then many orders of magnitude larger."""
        if not self.margin >= 1.0:
            raise ValueError(f"fp16_margin must be at least 1, got {self.margin}")
        value = FP16_MAX / self.margin
        if self.profile is None:
            return Limits(value, CONVERTER_CLAMP[1], 0.0)
        from .numerics.profiles import get_profile

        prof = get_profile(self.profile)
        if prof.const_clamp is not None:
            return Limits(value, prof.const_clamp[1], prof.const_clamp[0])
        return Limits(value, FP16_MAX, 0.0)


def rescale_result(result: FoldResult, request: RangeRequest, fmt: Any, range_edit: Callable) -> FoldResult:
    """``result`` (a fold's) with its model rewritten for fp16 range and ``report.rescaled`` filled in; the
    model is returned as it is when nothing passes the target.  ``fmt`` (the model's ``AuditFormat``) and
    ``range_edit`` are its frontend's hooks (``bnfold.frontends.Frontend``)."""
    from .engine.range_planner import span
    from .io.budget import inputs_chosen
    from .numerics.batches import as_batches
    from .numerics.lazy import split
    from .numerics.ranges import fresh_batches, relative_error, run_plain

    limits = request.limits()
    batches = as_batches(request.batches)
    fresh = fresh_batches(batches)
    # the audit's checks and work budget, on the calibration batches and the fresh ones: each runs at most three
    # times (float32 here; float64 in the proof, the model as folded and as rewritten)
    with inputs_chosen(True, outer=False):  # the caller's batches: their sizes buy work (bnfold.io.budget)
        model, both, _, _, plan = fmt.prepare(result.model, batches + fresh, fold=True)
    batches, check = both[: len(batches)], both
    program = fmt.program(model, lazy=True)  # a weight left on disk is read when its op runs
    # the batches that run together, layer by layer, so that a weight is read once per group: as many as the plan
    # fits in its budget, each counted as the audit holds one batch (more than a plain run holds of it); with weights
    # left on disk, no more than the largest of them holds (the streamed fold's peak is about that tensor)
    streamed = [c.nbytes for c in split(program.constants)[1].values()]
    group = plan.batches_at_once(len(check), max(streamed) if streamed else None)
    peaks: dict[str, float] = {}
    spans: dict = {}  # the span of each constant left on disk, by its stored bytes, measured as the run reads it

    def seen(constant, value: torch.Tensor) -> None:
        if constant.key is not None and constant.key not in spans:
            spans[constant.key] = span(value)

    with torch.no_grad():
        run_plain(program, batches, torch.float32, peaks, group, seen)
        new_model, entries = range_edit(model, lambda graph: rescale_graph(graph, peaks, limits, FP16_MAX, spans))
        applied = [e for e in entries if e.factor != 1.0]
        if not applied:
            result.report.rescaled.extend(entries)
            return FoldResult(model, result.report)
        reference = run_plain(program, check, torch.float64, None, group)
        after: dict[str, float] = {}
        rewritten = fmt.program(new_model, lazy=True)
        error = relative_error(reference, run_plain(rewritten, check, torch.float64, after, group))
        if error > TOLERANCE:
            for e in applied:
                e.reason = (
                    f"the rewritten model differs from the folded one by {error:.3g} (relative, float64) "
                    f"on the calibration and fresh inputs; nothing was rewritten ({e.reason})"
                )
                e.code, e.factor, e.peak_after, e.margin = Code.INEXACT, 1.0, e.peak, e.limit / e.peak
            new_model = model
        else:
            for e in applied:
                if e.value in after:
                    e.peak_after = after[e.value]
                    e.margin = e.limit / e.peak_after if e.peak_after > 0 else float("inf")
    result.report.rescaled.extend(entries)
    return FoldResult(new_model, result.report)
