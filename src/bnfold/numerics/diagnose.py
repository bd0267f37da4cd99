"""The audit's conclusion: which program the user would ship, whether it keeps the task (:class:`~.verdict.Floor`),
where its damage starts (:mod:`.cause`) and what fixes it (:mod:`.prescribe`), onto the
:class:`~.audit_report.AuditReport`.
"""

from __future__ import annotations

from .cause import find_cause, op_records
from .prescribe import FOLD, REWRITES, Prescription, Search, Verified, changed, island, verify


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
            pres.fp32_nodes, pres.holds, pres.end_to_end = island(search, program, records, rep.cause)
            steps = {s.name: s for s in program.steps}
            pres.labels = list(dict.fromkeys(steps[n].label or n for n in pres.fp32_nodes))
    elif not rep.deploy:
        pres.holds = False
    pres.runs = search.runs
    rep.prescription = pres
