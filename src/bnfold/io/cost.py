"""The cost model: what running a graph will allocate and compute, added up before it runs.

Every tensor the audit (or a constant evaluator) creates has a shape computed
beforehand from its op and arguments, never read from the file: the program's
ops run on meta kernels over its real weights (:mod:`bnfold.io.fx_shapes`; a
file whose ``meta["val"]`` disagrees is refused), ONNX shape inference without
the file's stated shapes; what only running tells is checked just before the op
runs (:mod:`bnfold.io.run_checks`).
:func:`bnfold.io.fx_cost.fx_plan` / :func:`bnfold.io.onnx_cost.onnx_plan` add up, in graph order, the bytes live at
once (a value is freed after its last reader) and the FLOPs of the plan, and
refuse with one line naming the op and its size (:class:`WorkError`, exit 2)
when they exceed the :class:`Budget`:

* bytes: ``max(256 MiB, 16 x the weights) + 4 x one batch of inputs`` (an
  activation of a real model is of that order: a layer's output is its
  input's size times a few channels, or the weights' size times a few); one
  batch of inputs may itself take at most a quarter of the weights' part; the audit's, counting its copies of each
  value: :meth:`Budget.for_audit`;
* FLOPs: ``256 x`` the byte budget, for all the runs the audit makes;
* at most :data:`MAX_BATCHES` batches.

``--max-work N`` (:func:`max_work`, a context, or ``load_model(max_work=)``)
sets the byte budget to N (and the FLOPs to 256 N) for a model that is really
that big.  This module holds what both plans share: :class:`PlanStep`, :func:`check_plan` and the
checks of inputs and batches.  The constant evaluators' running check is :mod:`bnfold.io.meter`; what
the audit holds of each value is the numerics' memory model (:mod:`bnfold.numerics.audit_memory`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from .budget import (  # noqa: F401 (re-exported: bnfold.io.cost is where callers find them)
    CONTENT_MULTIPLE,
    FLOOR_BYTES,
    FLOPS_PER_BYTE,
    INPUT_MULTIPLE,
    MAX_BATCHES,
    MAX_WORK_HINT,
    MIB,
    NODE_FLOPS,
    Budget,
    WorkError,
    current_override,
    max_work,
    max_work_needed,
    size_text,
    sizes_text,
)
from .sizes import MAX_ELEMENTS, elements  # noqa: F401 (elements: bnfold.io.cost.elements callers)

#: The convolution ops of a torch program by their short name (``convolution`` of ``convolution.default``), and
#: of an ONNX graph: their FLOPs are inner products, their float64 reference holds an im2col buffer.
FX_CONV_OPS = ("convolution", "conv1d", "conv2d", "conv3d", "_convolution")
ONNX_CONV_OPS = ("Conv", "ConvTranspose", "ConvInteger", "QLinearConv")
ONNX_FLOAT_CONV_OPS = ONNX_CONV_OPS[:2]  # the float ones


def is_fx_conv(name: str) -> bool:
    """Whether the op of short name ``name`` is a convolution with an im2col buffer (transposed ones included; not
    ``conv_tbc``, a time-batch-channel 1-d convolution that adds one matrix product per kernel tap into its output:
    it allocates its output only)."""
    return name in FX_CONV_OPS or name.startswith("conv_transpose")


class Conv(NamedTuple):
    """A convolution op's facts that decide its im2col buffer (``numerics.audit_memory.conv_columns``): transposed,
    dilated (a dilation over 1 on any side)."""

    transposed: bool = False
    dilated: bool = False


def fx_conv(name: str, args: Sequence) -> Conv | None:
    """The :class:`Conv` of a torch op of short name ``name`` and arguments ``args``, None for another op:
    ``convolution(x, w, b, stride, padding, dilation, transposed, ...)``, ``conv2d(x, w, b, stride, padding,
    dilation, groups)``, ``conv_transpose2d(x, w, b, stride, padding, output_padding, groups, dilation)``."""
    if not is_fx_conv(name):
        return None
    spelled = name.startswith("conv_transpose")
    transposed = spelled or (name in ("convolution", "_convolution") and bool(_arg(args, 6, False)))
    dilation = _arg(args, 7 if spelled else 5, 1)
    dilations = dilation if isinstance(dilation, (list, tuple)) else [dilation]
    return Conv(transposed, any(type(d) is int and d != 1 for d in dilations))  # unknown: not dilated, the larger


def onnx_conv(node: Any, op: str) -> Conv | None:
    """The :class:`Conv` of an ONNX node of type ``op``, None for another than ``Conv`` / ``ConvTranspose``."""
    if op not in ONNX_FLOAT_CONV_OPS:
        return None
    dilations = next((list(a.ints) for a in node.attribute if a.name == "dilations"), [])
    return Conv(op == "ConvTranspose", any(d != 1 for d in dilations))


def _arg(args: Sequence, i: int, default: Any) -> Any:
    return args[i] if len(args) > i else default


# ----------------------------------------------------------------------------- plans


@dataclass(slots=True)
class PlanStep:
    """One op of a plan: what it creates and computes, and the values it reads."""

    op: str
    out: list[str]
    reads: list[str]
    nbytes: int
    flops: int
    temp: int = 0  # bytes the op holds only while it runs (a convolution's im2col buffer)


@dataclass(frozen=True)
class Plan:
    """A plan that fits: the most bytes alive at once, its FLOPs in all, and the budget it fits; ``sized``: the
    values whose sizes the plan read from sizes the same meta kernels give (a torch program's load-checked
    metadata) and their bytes, whose run-time check need not run them again (:func:`bnfold.io.run_checks.before_op`);
    ``fixed``: the bytes live before the first step that are not a batch's inputs (the weights, what the audit
    holds of them), the part of ``peak`` that does not grow with the batches run at once."""

    peak: int
    flops: int
    budget: Budget
    sized: dict = field(default_factory=dict)
    fixed: int = 0

    def batches_at_once(self, n: int, within: int | None = None) -> int:
        """How many of ``n`` batches a run may hold at once (each its inputs and live values; their steps run one
        batch at a time, so one op's temporaries at a time) within the budget: one batch's part of the peak is
        ``peak - fixed``, and each batch more adds at most that.  ``within``: bytes the batches' parts together may
        also not pass, unless one alone does (a streamed model's largest tensor: ``--low-memory`` keeps its promise
        of a peak near that tensor, the batches held at once no larger than it).  At least 1, at most ``n``."""
        one = self.peak - self.fixed
        if one <= 0:
            return max(1, n)
        k = min(n, 1 + (self.budget.bytes - self.peak) // one)
        if within is not None:
            k = min(k, within // one)
        return max(1, k)


def check_plan(
    steps: list[PlanStep], budget: Budget, where: str, *, live: dict[str, int], runs: int = 1, inputs: Iterable = ()
) -> Plan:
    """Refuse the plan when one value, the bytes live at once, or the FLOPs of ``runs`` runs exceed ``budget``;
    else return it (:class:`Plan`).

    ``live`` holds the values present before the first step (weights, inputs) and their bytes; ``inputs``: which
    of them are a batch's inputs (the rest is the plan's ``fixed`` part).
    """
    batch = set(inputs)
    fixed = sum(b for name, b in live.items() if name not in batch)
    last = {r: i for i, s in enumerate(steps) for r in s.reads}  # each value's last reader
    live = dict(live)
    held = peak = sum(live.values())
    flops = 0
    refusal = None  # the first step over the budget; the plan is followed to its end for the --max-work it needs
    for i, s in enumerate(steps):
        if s.nbytes > budget.bytes and refusal is None:
            refusal = "{}: {} would create {}, over the budget of {}".format(
                where, s.op, *sizes_text(s.nbytes, budget.bytes)
            )
        for name in s.out:
            live[name] = s.nbytes // len(s.out)
        held += s.nbytes
        alive = held + s.temp
        if alive > peak:
            peak = alive
        if alive > budget.bytes and refusal is None:
            refusal = "{}: at {} the values alive at once would take {}, over the budget of {}".format(
                where, s.op, *sizes_text(alive, budget.bytes)
            )
        flops += runs * (s.flops + NODE_FLOPS)
        if flops > budget.flops and refusal is None:
            refusal = (
                f"{where}: at {s.op} the run would take over {flops:.3g} FLOPs ({runs} run(s)), over "
                f"the budget of {budget.flops:.3g}"
            )
        for r in s.reads:  # a value read twice is freed once: then it is no longer live
            if last[r] == i and r in live:
                held -= live.pop(r)
    if refusal is not None:
        raise WorkError(f"{refusal}; {max_work_needed(peak, flops, per_byte=budget.per_byte)}")
    return Plan(peak, flops, budget, fixed=fixed)


def check_inputs(inputs: dict[str, int], weights: int, where: str) -> None:
    cap = Budget.for_inputs(weights)
    total = sum(inputs.values())
    if total > cap:
        name = max(inputs, key=inputs.__getitem__)
        size, limit, its = sizes_text(total, cap, inputs[name])
        largest = f" (input {name!r}: {its})" if inputs[name] < total else f" (input {name!r})"
        raise WorkError(
            f"{where}: one batch of inputs takes {size}{largest}, over the {limit} that weights of "
            f"{size_text(weights)} justify; "
            f"{max_work_needed(INPUT_MULTIPLE * total, at_least=True)}"
        )


def check_batches(n: int, where: str) -> None:
    """At most :data:`MAX_BATCHES` input batches."""
    if n > MAX_BATCHES:
        raise WorkError(f"{where}: {n} batches, over the limit of {MAX_BATCHES}; pass fewer (or larger) batches")
