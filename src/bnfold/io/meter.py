"""The running check of the constant evaluators (torch and ONNX): :class:`WorkMeter` counts the bytes of the
values an evaluator holds (each freed when it drops it) and the FLOPs of all it computed; past the budget
(:class:`~bnfold.io.budget.Budget`) it stops with one line (:class:`~bnfold.io.budget.WorkError`)."""

from __future__ import annotations

from typing import Any

from .budget import MAX_WORK_HINT, NODE_FLOPS, Budget, WorkError, max_work_needed, sizes_text

#: A constant evaluator drops a computed value this big or bigger once its last reader is computed; a
#: smaller one stays (counted) so that a long chain of small values is never computed again per node.
FREE_MIN_BYTES = 64 << 10


# ----------------------------------------------------------------------------- running check


class WorkMeter:
    """The running check of a constant evaluator: the bytes of the values it holds now and the FLOPs of
    all it computed.

    :meth:`charge` counts what an op is about to create (its result and temporaries) on top of what is
    alive and refuses past the budget; :meth:`keep` then says how much of that the kept value holds (the
    temporaries are gone), and :meth:`free` / :meth:`free_all` drop the values the evaluator no longer
    holds (a value is freed once its last constant reader is computed; all of them when the graph is
    edited).  FLOPs are never freed: recomputing a dropped value costs again.
    """

    def __init__(self, budget: Budget, where: str = ""):
        self.budget, self.where = budget, where
        self.bytes = self.flops = self.peak = 0
        self._held: dict[Any, int] = {}

    def charge(self, op: str, nbytes: int, flops: int = 0) -> None:
        """Count what ``op`` is about to create and compute; :class:`WorkError` past the budget."""
        self.bytes += nbytes
        self.peak = max(self.peak, self.bytes)
        self.flops += flops + NODE_FLOPS
        prefix = f"{self.where}: " if self.where else ""
        if nbytes > self.budget.bytes or self.bytes > self.budget.bytes:
            size, alive, limit = sizes_text(nbytes, self.bytes, self.budget.bytes)
            raise WorkError(
                f"{prefix}computing the constant {op} would create {size} (constants alive with it: {alive}), over "
                f"the budget of {limit}; {MAX_WORK_HINT}"
            )
        if self.flops > self.budget.flops:
            raise WorkError(
                f"{prefix}computing the constant {op} takes the constants over {self.flops:.3g} FLOPs, over the "
                f"budget of {self.budget.flops:.3g}; {max_work_needed(self.peak, self.flops, at_least=True)}"
            )

    def keep(self, key: Any, charged: int, nbytes: int) -> None:
        """Of the ``charged`` bytes just charged, the value kept under ``key`` holds ``nbytes``; the rest is freed."""
        self.bytes += nbytes - charged
        self._held[key] = self._held.get(key, 0) + nbytes

    def free(self, key: Any) -> None:
        """The value kept under ``key`` is dropped."""
        self.bytes -= self._held.pop(key, 0)

    def free_all(self) -> None:
        """Every value kept is dropped."""
        self.bytes -= sum(self._held.values())
        self._held.clear()
