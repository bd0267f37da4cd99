"""Where fp16 damage starts: per op, the largest magnitude it produces against the profile's limit, whether its
output turns non-finite there, and how much SQNR it loses against its inputs; the first op that breaks is the cause.

Read from what the runner measured already (no extra pass): an op's peak is the largest finite ``|reference|`` of
its output (:attr:`~.errors.TensorError.max_abs_ref`: the value the op produces before the profile stores it), its
NaN/inf the emulated output's counts, its jump the worst cumulative SQNR of its measured float inputs less its
output's (constants are not measured: they count as exact; the rounding of a weight is then the op's own loss).
The jump needs no local run: a cumulative SQNR that falls from the inputs to the output is the error the op adds
or amplifies (a cancellation amplifies the error it reads; the op is where it shows).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .profiles import FP16_MAX
from .tensor_error import TensorError, json_float

FLOAT32_MAX = 3.4028234663852886e38
#: an op whose output's SQNR falls by at least this much below its inputs' is where the error jumps
JUMP_DB = 10.0


@dataclass
class OpRecord:
    """One float value an op writes (``node``: the step, ``value``: the value's name; ``label``: the module path,
    "" when the graph records none)."""

    node: str
    op: str
    value: str
    label: str
    peak: float  # the largest finite |reference value|
    limit: float  # the largest magnitude the profile stores for this op's output
    nan: int
    inf: int
    elements: int
    sqnr_db: float
    jump_db: float  # its inputs' worst cumulative SQNR less its output's (NaN: undefined)
    starts_nonfinite: bool  # NaN/inf in its output while every float input it reads was finite
    fp32: bool = False  # kept in float32 (a prescription's run)

    @property
    def headroom(self) -> float:
        return self.limit / self.peak if self.peak > 0 else math.inf

    @property
    def overflows(self) -> bool:
        return self.peak > self.limit

    @property
    def title(self) -> str:
        return self.label or self.node

    def to_dict(self) -> dict:
        return {
            "node": self.node,
            "label": self.label,
            "op": self.op,
            "value": self.value,
            "peak": json_float(self.peak),
            "limit": json_float(self.limit),
            "headroom": json_float(self.headroom),
            "nan": self.nan,
            "inf": self.inf,
            "elements": self.elements,
            "sqnr_db": json_float(self.sqnr_db),
            "jump_db": json_float(self.jump_db),
            "starts_nonfinite": self.starts_nonfinite,
            "fp32": self.fp32,
        }


@dataclass
class Cause:
    """The op where the damage starts: ``kind`` ``overflow`` (its value passes the limit), ``non-finite`` (NaN/inf
    from finite inputs within range) or ``precision`` (the largest SQNR drop, at least :data:`JUMP_DB`); ``value``:
    the peak (overflow), the NaN/inf share (non-finite) or the dB lost (precision)."""

    node: str
    op: str
    kind: str
    value: float
    limit: float
    label: str = ""
    record: OpRecord | None = None

    @property
    def title(self) -> str:
        return self.label or self.node

    def line(self) -> str:
        """``/MatMul (MatMul) reaches 1.1e5 > 65504: overflow``."""
        node = f" `{self.node}`" if self.label and self.label != self.node else ""
        who = f"`{self.title}` ({self.op}{node})"
        if self.kind == "overflow":
            return f"{who} reaches {self.value:.3g} > {self.limit:.6g}: overflow"
        if self.kind == "non-finite":
            return f"{who} turns {100 * self.value:.3g}% of its output NaN/inf from finite inputs within range"
        r = self.record
        return f"{who} loses {self.value:.1f} dB (to {r.sqnr_db:.1f} dB): precision" if r else f"{who}: precision"

    def to_dict(self) -> dict:
        return {
            "node": self.node,
            "label": self.label,
            "op": self.op,
            "kind": self.kind,
            "value": json_float(self.value),
            "limit": json_float(self.limit),
        }


def limit(profile, step, fp32: frozenset = frozenset()) -> float:
    """The largest magnitude ``profile`` stores for ``step``'s output: 65504 where it stores fp16, else float32's."""
    if step.name in fp32:
        return FLOAT32_MAX
    if profile.fp16_storage or (step.fp16_class and step.fp16_class in profile.fp16_classes):
        return FP16_MAX
    return FLOAT32_MAX


def _sqnr(e: TensorError | None) -> float:
    return math.nan if e is None else e.sqnr_db


def op_records(program, errors: dict[str, TensorError], profile, fp32: frozenset = frozenset()) -> list[OpRecord]:
    """A record per measured float value of ``program``'s steps, in graph order (``errors``: the run's, by value)."""
    out = []
    for step in program.steps:
        ins = [errors[v] for v in dict.fromkeys(step.ins) if v and errors.get(v) is not None]
        finite_in = all(not e.nonfinite for e in ins)
        in_db = [e.sqnr_db for e in ins if not math.isnan(e.sqnr_db)]
        worst_in = min(in_db) if in_db else math.nan
        cap = limit(profile, step, fp32)
        for v in step.outs:
            e = errors.get(v) if v else None
            if e is None or e.count == 0:
                continue
            jump = worst_in - e.sqnr_db if math.isfinite(e.sqnr_db) and math.isfinite(worst_in) else math.nan
            starts = bool(e.nonfinite > e.ref_nonfinite and finite_in)
            rec = OpRecord(
                step.name,
                step.op,
                v,
                step.label,
                e.max_abs_ref,
                cap,
                e.nan,
                e.inf,
                e.count,
                e.sqnr_db,
                jump,
                starts,
                step.name in fp32,
            )
            out.append(rec)
    return out


def find_cause(records: list[OpRecord], damaged: bool = True, skip: frozenset = frozenset()) -> Cause | None:
    """The first record in graph order that overflows or turns non-finite from finite inputs; else, when the run is
    ``damaged`` (the verdict fails), the largest SQNR jump of at least :data:`JUMP_DB`.  ``skip``: nodes not to name
    (kept in float32 already)."""
    for r in records:
        if r.node in skip:
            continue
        if r.overflows:
            return Cause(r.node, r.op, "overflow", r.peak, r.limit, r.label, r)
        if r.starts_nonfinite:
            return Cause(r.node, r.op, "non-finite", (r.nan + r.inf) / r.elements, r.limit, r.label, r)
    if not damaged:
        return None
    jumps = [r for r in records if r.node not in skip and math.isfinite(r.jump_db) and r.jump_db >= JUMP_DB]
    if not jumps:
        return None
    r = max(jumps, key=lambda r: r.jump_db)
    return Cause(r.node, r.op, "precision", r.jump_db, r.limit, r.label, r)
