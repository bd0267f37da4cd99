"""The one place where the audit executes a program: a runner over every batch, what it keeps counted against the
budget (shared by :mod:`.audit` and the prescription's runs, :mod:`.prescribe`)."""

from __future__ import annotations

from .audit_memory import AuditHold
from .runner import EmulationResult, Runner
from .tensor_error import reference_stats


def execute(
    runner: Runner, batches: list[tuple], result: EmulationResult, progress, against=None, keep=(), holding: int = 0
) -> list:
    """Run ``runner`` on every batch into ``result`` (the one place where the audit executes a program);
    ``against``: per batch, the reference values to measure against (no reference run) and what is known of
    them (``Runner.run``'s ``against_stats``).  Returns, per batch, the reference values named in ``keep`` and
    what their measurement found of them (:func:`.tensor_error.reference_stats`).  ``holding``: what the audit holds
    besides (earlier runs' outputs and kept values, :meth:`.audit_memory.AuditHold.kept`); each batch's run counts it
    with what the batches before it left, against the budget (``Runner.run``'s ``holding``)."""
    on_node = getattr(progress, "node", None)
    kept = []
    for done, batch in enumerate(batches, 1):
        if against is None:
            res = runner.run(*batch, on_node=on_node, keep_reference=frozenset(keep), holding=holding)
        else:
            values, stats = against[done - 1]
            res = runner.run(
                *batch, reference=False, against=values, against_stats=stats, on_node=on_node, holding=holding
            )
        holding += AuditHold.kept([res.outputs, res.reference, res.kept])
        stats = {name: s for name in res.kept if (s := reference_stats(res.errors.get(name))) is not None}
        kept.append((res.kept, stats))  # before result.add: it merges the next batches into these errors
        result.add(res)
        if progress is not None:
            progress(done, len(batches))
    return kept
