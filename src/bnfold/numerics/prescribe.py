"""What fixes a model the verdict rejects, found by measurement: a rewrite of ``bnfold.fold`` (:data:`REWRITES`), each
verified by emulating the rewritten model, else the smallest set of nodes to keep in float32 that it finds (grown
from the first damaged op, each set verified by a run with those nodes in float32, :class:`~.runner.Runner`'s
``fp32``; at most ``max_runs`` runs, :func:`island_shares`).  Names are the format's own: ONNX node names, torch
program node names (and their module paths, ``labels``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from .cause import Cause, OpRecord, find_cause, op_records
from .execute import execute
from .profiles import FP16_MAX
from .runner import EmulationResult, Runner


@dataclass(frozen=True)
class Rewrite:
    """A fold option a prescription tries: ``name`` (the report's), ``flag`` (how ``bnfold fold`` asks for it),
    ``options(batches)`` (the keyword arguments of ``bnfold.fold`` it adds, from the audit's batches) and
    ``applies(fold_report)`` (whether it changed anything: a rewrite that changed nothing is not tried further)."""

    name: str
    flag: str
    options: Callable[[list], dict]
    applies: Callable[[object], bool] = lambda report: True


#: the rewrites after the default fold, tried in order, each alone on top of it: the exact range rewrite first (it
#: calibrates on the audit's batches; it applies when it scaled a value), then lowering the norms that cannot fold.
REWRITES: list[Rewrite] = [
    Rewrite(
        "fp16_range",
        "--fp16-range INPUTS.npz",
        lambda b: {"fp16_range": b},
        lambda r: any(x.factor != 1.0 for x in r.rescaled),
    ),
    Rewrite("lower_unfoldable", "--lower-unfoldable", lambda b: {"lower_unfoldable": True}, lambda r: bool(r.lowered)),
]
#: the default fold itself, verified by the audit's folded run
FOLD = Rewrite("fold", "bnfold fold", lambda b: {})


def changed(report) -> bool:
    """Whether a fold report changed the model (something folded, merged or lowered)."""
    return report is not None and bool(report.folded or getattr(report, "merged", ()) or report.lowered)


@dataclass
class Verified:
    """A rewrite and the end-to-end numbers of the rewritten model's emulation (``program``, ``records``: the
    rewritten model's program and per-op records, for an island search on top of a rewrite that does not hold
    alone; dropped once the search is over, :func:`forget_programs`)."""

    rewrite: Rewrite
    end_to_end: object
    holds: bool
    program: object = field(default=None, repr=False, compare=False)
    records: list = field(default_factory=list, repr=False, compare=False)

    def to_dict(self) -> dict:
        e = self.end_to_end.to_dict()
        keep = ("output_sqnr_db", "nonfinite_share", "top1_agreement", "mask_iou")
        return {"name": self.rewrite.name, "flag": self.rewrite.flag, "holds": self.holds, **{k: e[k] for k in keep}}


@dataclass
class Prescription:
    """``rewrite``: the verified rewrites that make the verdict hold (each alone), or, with ``fp32_nodes``, the one
    rewrite the island is found on top of; ``fp32_nodes``: the nodes of the ``base`` program ("folded": the model
    ``bnfold fold`` writes; "unfolded": the model as given; "rewritten": the model ``bnfold fold`` writes with the
    ``rewrite``'s flag) to keep in float32 when no rewrite holds alone, ``labels`` their module paths (torch
    programs); ``holds``: the verdict holds with them; ``tried``: every rewrite verified; ``runs``: the emulations
    the search made; ``nodes``: the base's node count."""

    rewrite: list[str] = field(default_factory=list)
    fp32_nodes: list[str] = field(default_factory=list)
    labels: list[str] = field(default_factory=list)
    base: str = "unfolded"
    holds: bool = True
    tried: list[Verified] = field(default_factory=list)
    runs: int = 0
    nodes: int = 0
    end_to_end: object = None  # the base with fp32_nodes in float32

    def line(self) -> str:
        flags = " + ".join(v.rewrite.flag for v in self.tried if v.rewrite.name in self.rewrite)
        if self.rewrite and not self.fp32_nodes:
            return f"prescription: {flags} (verified by emulating the rewritten model)."
        if not self.fp32_nodes:
            return "prescription: none found (no rewrite holds, no op to keep in float32 was located)."
        shown = ", ".join(f"`{n}`" for n in self.fp32_nodes[:6]) + (" ..." if len(self.fp32_nodes) > 6 else "")
        base = {
            "folded": "of the folded model (bnfold fold first) ",
            "rewritten": f"of the model `bnfold fold {flags}` writes ",
        }.get(self.base, "")
        if self.holds:
            ok = "the verdict then holds"
        elif self.end_to_end is None:  # the island's starting set, never emulated
            ok = "not verified: max_runs left no run"
        else:
            ok = f"the verdict still fails after {self.runs} runs"
        return (
            f"prescription: keep {len(self.fp32_nodes)} of {self.nodes} nodes {base}in float32: {shown}; {ok} "
            "(--block-list FILE writes them for a converter)."
        )

    def to_dict(self) -> dict:
        return {
            "rewrite": list(self.rewrite),
            "fp32_nodes": list(self.fp32_nodes),
            "labels": list(self.labels),
            "base": self.base,
            "holds": self.holds,
            "nodes": self.nodes,
            "runs": self.runs,
            "tried": [v.to_dict() for v in self.tried],
        }


@dataclass
class Search:
    """What the search needs of the audit: the profile, eps, batches, how to judge an emulation against ``floor``
    (``judge()``: a fresh :class:`.end_to_end.EndToEndSum` whose ``result()`` is the run's end-to-end numbers) and
    the float model's outputs of batch ``i`` (``reference(i, holding)``, computed again: no batch's outputs are kept
    past its run); ``program``: the audit's unfolded program, whose own reference run gives them."""

    profile: object
    bn_eps: float | None
    batches: list
    judge: Callable
    floor: object
    reference: Callable
    program: object = None
    shared: dict = field(default_factory=dict)
    max_runs: int = 8
    runs: int = 0
    holding: int = 0  # what the audit holds while the search runs (its runners' constants)

    def run(self, program, fp32: frozenset = frozenset()) -> tuple[object, list[OpRecord]]:
        """An emulation of ``program`` (every float value measured against its own reference run) with ``fp32`` kept
        in float32: its end-to-end numbers and per-op records."""
        self.runs += 1
        runner = Runner(program, self.profile, self.bn_eps, fp32=fp32, shared=self.shared)
        res = EmulationResult(runner.profile.name, not_emulated=runner.not_emulated)
        judged = self.judge()
        same = program is self.program  # its own reference run is the float model's
        execute(
            runner,
            self.batches,
            res,
            None,
            lambda _, outs, refs: judged.add(outs, refs),
            self.holding,
            None if same else self.reference,
        )
        return judged.result(), op_records(program, res.errors, self.profile, fp32)


def verify(search: Search, fmt, model, rewrite: Rewrite):
    """``rewrite`` on ``model`` (folded with its options), emulated: a :class:`Verified`, or None when it changed
    nothing."""
    from ..api import fold as bnfold_fold

    result = bnfold_fold(model, **rewrite.options(search.batches))
    if not rewrite.applies(result.report):
        return None
    program = fmt.program(result.model)
    e2e, records = search.run(program)
    return Verified(rewrite, e2e, search.floor.holds(e2e), program, records)


def island(
    search: Search, program, records: list[OpRecord], cause: Cause | None, runs: int | None = None
) -> tuple[list[str], bool, object]:
    """The nodes of ``program`` to keep in float32: every op whose value passes the profile's limit (no fp16 value
    holds it) and the cause, then, run by run, the next op where damage starts, until the verdict holds or ``runs``
    runs (default ``search.max_runs``) were made.  Returns the nodes in graph order, whether the verdict holds, and
    the last run's end-to-end numbers."""
    order = {s.name: i for i, s in enumerate(program.steps)}
    keep = {r.node for r in records if r.overflows}
    if cause is not None:
        keep.add(cause.node)
    keep = _cast_closure(program, records, keep)
    e2e, holds = None, False
    stop = search.runs + (search.max_runs if runs is None else runs)
    while keep and search.runs < stop:
        e2e, recs = search.run(program, frozenset(keep))
        holds = search.floor.holds(e2e)
        if holds:
            break
        nxt = find_cause(recs, damaged=True, skip=frozenset(keep))
        if nxt is None:
            break
        keep |= {r.node for r in recs if r.overflows and r.node not in keep} | {nxt.node}
        keep = _cast_closure(program, records, keep)
    return sorted(keep, key=order.__getitem__), holds, e2e


def _cast_closure(program, records: list[OpRecord], keep: set) -> set:
    """``keep`` and every step that reads a value a kept step writes past the fp16 limit (the cast to fp16 in front of
    it would overflow), until none is left: the peaks are the reference's, the same whatever runs in float32."""
    over = {r.value for r in records if r.peak > FP16_MAX}
    keep, grown = set(keep), True
    while grown:
        wide = {v for s in program.steps if s.name in keep for v in s.outs if v in over}
        more = {s.name for s in program.steps if s.name not in keep and any(v in wide for v in s.ins)}
        keep |= more
        grown = bool(more)
    return keep


def island_shares(max_runs: int, partial: int) -> tuple[int, int]:
    """The island runs of ``max_runs``: ``(for the searches on the ``partial`` rewritten models together, for the
    fallback's on the model as shipped)``.  The fallback has its own share, at least half (and at least one run),
    plus what the rewritten models' searches leave; without a rewritten model, all of them; ``max_runs`` 0: none."""
    fallback = max(1, max_runs // 2) if partial and max_runs > 0 else max_runs
    return max(0, max_runs - fallback), fallback


def forget_programs(tried: list[Verified]) -> None:
    """Drop the rewritten programs and per-op records of ``tried`` once scored (the report keeps the numbers it
    prints: name, flag, holds, end-to-end)."""
    for v in tried:
        v.program, v.records = None, []
