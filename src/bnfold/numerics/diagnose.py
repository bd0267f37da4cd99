"""The audit's conclusion: which program the user would ship, whether it keeps the task (:class:`~.verdict.Floor`),
where its damage starts (:mod:`.cause`) and what fixes it (:mod:`.prescribe`), onto the
:class:`~.audit_report.AuditReport`.
"""

from __future__ import annotations

from .cause import find_cause, op_records
from .prescribe import (
    FOLD,
    REWRITES,
    Prescription,
    Search,
    Verified,
    changed,
    forget_programs,
    island,
    island_shares,
    verify,
)


def diagnose(
    rep, search: Search, fmt, model, programs: dict, results: dict, all_tensors: bool, prescribe: bool
) -> None:
    """Set ``rep.ship``, ``rep.deploy``, ``rep.ops``, ``rep.cause`` and ``rep.prescription``.  ``programs`` /
    ``results``: the audit's programs and runs by "unfolded" / "folded" (the folded ones None when nothing was
    folded).  The folded model is shipped when the fold changed it, unless it fails where the model as given holds.
    ``prescribe``: search what fixes a rejected model (rewrites, then an fp32 island: more emulations)."""
    floor = search.floor
    did_fold = results.get("folded") is not None and changed(rep.fold_report)
    f_ok = did_fold and floor.holds(rep.folded)
    u_ok = floor.holds(rep.unfolded)
    rep.ship = "folded" if did_fold and (f_ok or not u_ok) else "unfolded"
    program, res = programs[rep.ship], results[rep.ship]
    rep.deploy = f_ok or u_ok
    records = op_records(program, res.errors, search.profile)
    if not rep.deploy and not all_tensors:  # the cause reads every value: this run measures them all
        records = search.run(program)[1]
    rep.ops = records
    rep.cause = find_cause(records, damaged=not rep.deploy)
    pres = Prescription(base=rep.ship, nodes=len(program.steps))
    if did_fold:
        pres.tried.append(Verified(FOLD, rep.folded, f_ok))
        if f_ok:
            pres.rewrite = [FOLD.name]
    if not rep.deploy and prescribe:
        for rewrite in REWRITES:
            v = verify(search, fmt, model, rewrite)
            if v is not None:
                pres.tried.append(v)
                if v.holds:
                    pres.rewrite = [rewrite.name]
                    break
        if not pres.rewrite:
            _island(pres, search, program, records, rep.cause)
        forget_programs(pres.tried)
    elif not rep.deploy:
        pres.holds = False
    pres.runs = search.runs
    rep.prescription = pres


def _island(pres: Prescription, search: Search, program, records: list, cause) -> None:
    """The float32 island when no rewrite holds alone.  A rewrite that changed the model but left part of it broken
    (the range rewrite: a residual stream it rescaled, scores at a softmax it cannot) is kept: the island is searched
    on the rewritten model first (each such rewrite in :data:`REWRITES` order), from its own cause, so that it holds
    only what no rewrite fixes; the model as shipped is searched when no such island holds, in runs of its own
    (:func:`island_shares`: the rewritten models' searches cannot spend them).  Each rewritten program is dropped
    once its search is over."""
    partial = [v for v in pres.tried if v.program is not None and not v.holds]  # the fold's own entry has none
    shared, fallback = island_shares(search.max_runs, len(partial))
    start = search.runs
    for v in partial:
        left = shared - (search.runs - start)
        found = island(search, v.program, v.records, find_cause(v.records, damaged=True), left) if left > 0 else None
        if found is not None and found[1]:
            pres.rewrite, pres.base, pres.nodes = [v.rewrite.name], "rewritten", len(v.program.steps)
            _set_island(pres, v.program, *found)
            return
        forget_programs([v])
    left = fallback + max(0, shared - (search.runs - start))
    _set_island(pres, program, *island(search, program, records, cause, left))


def _set_island(pres: Prescription, program, nodes: list, holds: bool, e2e) -> None:
    pres.fp32_nodes, pres.holds, pres.end_to_end = nodes, holds, e2e
    steps = {s.name: s for s in program.steps}
    pres.labels = list(dict.fromkeys(steps[n].label or n for n in nodes))
