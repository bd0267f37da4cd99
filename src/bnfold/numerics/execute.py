"""The one place where the audit executes a program: a runner over every batch, what it keeps counted against the
budget (shared by :mod:`.audit` and the prescription's runs, :mod:`.prescribe`).  No batch's outputs are kept past
it: each is handed to ``judge`` (the end-to-end sums, :class:`.end_to_end.EndToEndSum`) and dropped."""

from __future__ import annotations

from collections.abc import Callable

from .audit_memory import AuditHold
from .runner import BatchResult, EmulationResult, Runner
from .tensor_error import reference_stats

#: ``judge(which, outputs, reference)``: one batch's outputs of the program ``which`` ("unfolded", "folded") and the
#: float model's reference outputs of that batch
Judge = Callable[[str, list, list], None]


def execute(
    runner: Runner,
    batches: list[tuple],
    result: EmulationResult,
    progress,
    judge: Judge,
    holding: int = 0,
    reference: Callable[[int, int], list] | None = None,
) -> None:
    """Run ``runner`` on every batch into ``result`` (with :func:`execute_pair`, the one place where the audit
    executes a program), handing each batch's outputs to ``judge`` as "unfolded", against the run's own reference
    outputs, or ``reference(i, holding)``'s (the float model's outputs of batch ``i``, computed again: a
    prescription's run of a rewritten model; ``holding``: what this call holds besides the audit's own runners,
    whose constants ``reference`` counts).  ``holding``: what the audit holds besides (the other runners'
    constants); each batch's run counts it against the budget (``Runner.run``'s ``holding``)."""
    on_node = getattr(progress, "node", None)
    for done, batch in enumerate(batches, 1):
        res = runner.run(*batch, on_node=on_node, holding=holding)
        # the reference run counts the audit's runners itself: this runner and its outputs are what it adds
        held = runner.held_constants + AuditHold.kept(res.outputs)
        refs = res.reference if reference is None else reference(done - 1, held)
        judge("unfolded", res.outputs, refs)
        result.add(res)
        del res, refs
        if progress is not None:
            progress(done, len(batches))


def execute_pair(
    runner: Runner,
    frunner: Runner,
    batches: list[tuple],
    results: tuple[EmulationResult, EmulationResult],
    progress,
    names: dict[str, str],
    judge: Judge,
) -> None:
    """Run the unfolded program (``runner``) and the folded one (``frunner``) batch by batch into ``results``
    (unfolded, folded): each batch's unfolded run keeps the reference values the folded run is measured against
    (``names``: ``{folded value: unfolded value}``, :func:`.rows.ref_names`), the folded run reads them, ``judge``
    gets both programs' outputs against the unfolded run's reference outputs, then all of it is dropped: the audit
    holds one batch's references and outputs at a time, counted against the budget at run time as the plan counts
    them (the other runner's constants, the kept references, the unfolded run's outputs).  The numbers are those of
    running every batch unfolded, then every batch folded (each emulation's errors merge in batch order)."""
    unfolded, folded = results
    on_node, keep = getattr(progress, "node", None), frozenset(names.values())
    for done, batch in enumerate(batches, 1):
        res = runner.run(*batch, on_node=on_node, keep_reference=keep, holding=frunner.held_constants)
        stats = {name: s for name in res.kept if (s := reference_stats(res.errors.get(name))) is not None}
        values = {f: res.kept[u] for f, u in names.items() if u in res.kept}
        known = {f: stats[u] for f, u in names.items() if u in stats}
        refs = res.reference
        unfolded.add(BatchResult(res.outputs, refs, res.errors, res.local, res.probes))
        judge("unfolded", res.outputs, refs)
        del res
        holding = runner.held_constants + AuditHold.kept([values, refs])
        fres = frunner.run(
            *batch, reference=False, against=values, against_stats=known, on_node=on_node, holding=holding
        )
        del values, known
        judge("folded", fres.outputs, refs)
        folded.add(fres)
        del fres, refs
        if progress is not None:
            progress(done, len(batches))
