"""The audit's verdict: whether a program keeps the task under the profile (:class:`Floor`: no NaN/inf, agreement
with the float model at least ``min_agreement``, output SQNR at least ``min_sqnr_db``)."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Floor:
    """What a program must keep to be deployed: no NaN/inf in the output judged, top-1 agreement and mask IoU with
    the float model at least ``min_agreement`` (where the audit computes them), output SQNR at least
    ``min_sqnr_db``.  A user's metric is reported, not judged (its direction is the user's)."""

    min_agreement: float = 0.99
    min_sqnr_db: float = 20.0

    def __post_init__(self):
        if not 0.0 <= self.min_agreement <= 1.0:
            raise ValueError(f"min_agreement must lie in [0, 1], got {self.min_agreement!r}")
        if math.isnan(self.min_sqnr_db):
            raise ValueError("min_sqnr_db must be a number")

    def failures(self, e2e) -> list[str]:
        """What ``e2e`` (an :class:`~.audit_report.EndToEnd`) misses of this floor, as short phrases ([]: it holds)."""
        out, miss = e2e.output, []
        if out.nonfinite:
            miss.append(f"{100 * out.nonfinite_share:.3g}% NaN/inf in the output")
        for what, x in (("top-1 agreement", e2e.top1_agreement), ("mask IoU", e2e.mask_iou)):
            if x is not None and not x >= self.min_agreement:
                miss.append(f"{what} {100 * x:.1f}% < {100 * self.min_agreement:g}%")
        db = out.sqnr_db if not out.nonfinite else math.nan
        if out.count and not out.nonfinite and not db >= self.min_sqnr_db:  # no float output: no SQNR to judge
            miss.append(f"output SQNR {db:.1f} dB < {self.min_sqnr_db:g} dB")
        return miss

    def holds(self, e2e) -> bool:
        return e2e is not None and not self.failures(e2e)

    def met(self, e2e) -> str:
        """What ``e2e`` keeps, for a verdict that holds."""
        parts = ["no NaN/inf"]
        for what, x in (("top-1 agreement", e2e.top1_agreement), ("mask IoU", e2e.mask_iou)):
            if x is not None:
                parts.append(f"{what} {100 * x:.1f}% >= {100 * self.min_agreement:g}%")
        db = e2e.output.sqnr_db
        if e2e.output.count:
            shown = "output exact" if db == math.inf else f"output SQNR {db:.1f} dB"
            parts.append(f"{shown} >= {self.min_sqnr_db:g} dB")
        return ", ".join(parts)

    def to_dict(self) -> dict:
        return {"min_agreement": self.min_agreement, "min_sqnr_db": self.min_sqnr_db}
