"""The one place where the audit executes a program: a runner over every batch, what it keeps counted against the
budget (shared by :mod:`.audit` and the prescription's runs, :mod:`.prescribe`)."""

from __future__ import annotations

from .audit_memory import AuditHold
from .runner import BatchResult, EmulationResult, Runner
from .tensor_error import reference_stats


def execute(runner: Runner, batches: list[tuple], result: EmulationResult, progress, holding: int = 0) -> None:
    """Run ``runner`` on every batch into ``result`` (with :func:`execute_pair`, the one place where the audit
    executes a program).  ``holding``: what the audit holds besides (earlier runs' outputs,
    :meth:`.audit_memory.AuditHold.kept`); each batch's run counts it with what the batches before it left, against
    the budget (``Runner.run``'s ``holding``)."""
    on_node = getattr(progress, "node", None)
    for done, batch in enumerate(batches, 1):
        res = runner.run(*batch, on_node=on_node, holding=holding)
        holding += AuditHold.kept([res.outputs, res.reference])
        result.add(res)
        if progress is not None:
            progress(done, len(batches))


def execute_pair(
    runner: Runner,
    frunner: Runner,
    batches: list[tuple],
    results: tuple[EmulationResult, EmulationResult],
    progress,
    names: dict[str, str],
) -> None:
    """Run the unfolded program (``runner``) and the folded one (``frunner``) batch by batch into ``results``
    (unfolded, folded): each batch's unfolded run keeps the reference values the folded run is measured against
    (``names``: ``{folded value: unfolded value}``, :func:`.rows.ref_names`), the folded run reads them, then they
    are dropped.  What the audit holds no longer grows with the batches but by their outputs (the plan counts one
    batch's references: :meth:`.audit_memory.AuditHold.reference`); the numbers are those of running every batch
    unfolded, then every batch folded (each emulation's errors merge in batch order)."""
    unfolded, folded = results
    on_node, keep, holding = getattr(progress, "node", None), frozenset(names.values()), 0
    for done, batch in enumerate(batches, 1):
        res = runner.run(*batch, on_node=on_node, keep_reference=keep, holding=holding)
        kept = AuditHold.kept(res.kept)
        stats = {name: s for name in res.kept if (s := reference_stats(res.errors.get(name))) is not None}
        values = {f: res.kept[u] for f, u in names.items() if u in res.kept}
        known = {f: stats[u] for f, u in names.items() if u in stats}
        holding += AuditHold.kept([res.outputs, res.reference])
        unfolded.add(BatchResult(res.outputs, res.reference, res.errors, res.local, res.probes))
        del res
        fres = frunner.run(
            *batch, reference=False, against=values, against_stats=known, on_node=on_node, holding=holding + kept
        )
        del values, known
        holding += AuditHold.kept([fres.outputs, fres.reference])
        folded.add(fres)
        if progress is not None:
            progress(done, len(batches))
