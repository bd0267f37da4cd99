"""The audit's memory model: what an audit holds of each value of a program while it runs (:class:`AuditHold`),
and the checks it makes before anything runs (:func:`fx_audit_plan`, :func:`onnx_audit_plan`): the cost plan
(:mod:`bnfold.io.fx_cost`, :mod:`bnfold.io.onnx_cost`) counted with what the audit holds, then the run-time
checks armed (:func:`bnfold.io.run_checks.expect`)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from ..errors import ModelFileError
from ..io.cost import Conv, Plan
from ..io.fx_cost import check_indices, fx_plan, higher_order_ops
from ..io.onnx_cost import onnx_plan
from ..io.run_checks import expect
from ..io.sizes import elements

#: What the audit holds per element of a floating value while it runs (``numerics.runner``): the emulated value
#: (float32), the reference, and with local runs (``--local``) the local run of a layer's segment, both in the
#: reference dtype (``runner.reference_dtype``: float32 under the profiles that store fp16, else float64).  Without
#: a profile (:class:`AuditHold`'s defaults): a float64 reference and local runs, the most any audit holds.
AUDIT_EMULATED_BYTES = 4
#: ... of an integer / bool value: the emulated and the reference runs compute it each.
AUDIT_OTHER_COPIES = 2
#: ... per element of an op's output while it is measured (float64 differences, a norm's probe).
AUDIT_TEMP_BYTES = 24
#: What the items above leave out (the float32 forward pass, the allocator's slack, the phases of the
#: audit), as a factor: measured peaks were 1.4-1.7x the itemized count (three conv nets, 1-4 batches;
#: see SECURITY.md, "The cost model").
AUDIT_SLACK = (3, 2)


#: The audit's byte budget is this multiple of the content's: it holds every value two or three times (the
#: float32 run, the reference, the local run: 8 to 20 bytes per float32 element, 2-5x) plus a float64 convolution's
#: im2col buffer, each an overhead of bnfold's, proportional to the content; at least
#: :data:`bnfold.io.budget.AUDIT_FLOOR_BYTES` (``Budget.for_audit``: a file under 100 KB cannot make the audit peak
#: past 1 GiB).
AUDIT_BUDGET_MULTIPLE = 8


def _slack(n: int) -> int:
    return n * AUDIT_SLACK[0] // AUDIT_SLACK[1]


@dataclass(frozen=True)
class AuditHold:
    """What an audit of ``runs`` runs per batch keeps besides the values of the graph: each emulator
    (unfolded and folded) holds its constants in float32 and in the reference dtype, the folded program its own
    weights, and one batch's outputs stay until the end-to-end numbers read them (emulated float32 and reference,
    per emulator; :func:`bnfold.numerics.execute.execute_pair`).  The reference values the folded run is
    measured against are counted at run time (``Runner.run``), where which ones are kept is known.

    ``reference_bytes``: the reference run's bytes per element (4 under the profiles that store fp16, 8 else:
    ``runner.reference_dtype``); ``local``: the local runs are on (``--local``).  The defaults count the most any
    audit holds; the audit counts its own profile's and options' (:meth:`of`), the plan as the run-time check."""

    runs: int
    #: the audit's byte budget is this multiple of the content's (:data:`AUDIT_BUDGET_MULTIPLE`)
    budget_multiple: int = AUDIT_BUDGET_MULTIPLE
    reference_bytes: int = 8
    local: bool = True

    @classmethod
    def of(cls, runs: int, reference_dtype: Any, local: bool) -> AuditHold:
        """What an audit whose reference runs in ``reference_dtype`` holds, with or without ``local`` runs."""
        return cls(runs, reference_bytes=reference_dtype.itemsize, local=bool(local))

    def with_runs(self, runs: int) -> AuditHold:
        return replace(self, runs=runs)

    @property
    def float_bytes(self) -> int:
        """Bytes per element of a floating value while it lives: emulated, reference and local (when on)."""
        return AUDIT_EMULATED_BYTES + self.reference_bytes * (2 if self.local else 1)

    def value(self, s: Any) -> int:
        """What the audit holds of a value of spec ``s`` (its ``dims``, ``nbytes``, ``is_float``)."""
        return self.held(elements(s.dims), s.nbytes, s.is_float)

    def held(self, n: int, nbytes: int, is_float: bool) -> int:
        """What the audit holds of a value of ``n`` elements in ``nbytes`` bytes."""
        if is_float:
            return _slack(n * self.float_bytes)
        return _slack(nbytes * AUDIT_OTHER_COPIES)

    @staticmethod
    def kept(values: Any) -> int:
        """What the audit holds of the tensors in ``values`` (nested lists, tuples and dicts) it keeps across runs."""
        if isinstance(values, dict):
            values = list(values.values())
        if isinstance(values, (list, tuple)):
            return sum(AuditHold.kept(v) for v in values)
        return _slack(values.nbytes) if hasattr(values, "nbytes") and hasattr(values, "numel") else 0

    def constants(self, weights: int, float_elements: int) -> int:
        emulators = 2 if self.runs > 2 else 1
        return _slack(weights * emulators + emulators * float_elements * (AUDIT_EMULATED_BYTES + self.reference_bytes))

    def outputs(self, out_elements: int) -> int:
        """One batch's outputs of ``out_elements`` elements, kept until the end-to-end numbers read them."""
        emulators = 2 if self.runs > 2 else 1
        return _slack(emulators * out_elements * (AUDIT_EMULATED_BYTES + self.reference_bytes))

    def temp(
        self, conv: Conv | None, out_dims: list[int], in_dims: list[list[int] | None], out: int | None = None
    ) -> int:
        """What one op holds while it runs (``conv``: the op is a convolution, which; ``out``: ``out_dims``' element
        count, when the caller has it)."""
        return _slack(self._temp(conv, out_dims, in_dims, elements(out_dims) if out is None else out))

    def _temp(self, conv: Conv | None, out_dims: list[int], in_dims: list[list[int] | None], out: int) -> int:
        """What one op holds while it runs: the float64 temporaries of the error measurement (measured 18 MiB for an
        8 MiB float32 value) and of a batch norm's input probe, or a convolution's im2col buffer where torch's CPU
        convolution makes one (:func:`conv_columns`), in the reference run or the float32 emulated one, whichever
        is larger.  An input's dims may be None (unknown: none counted)."""
        measured = out * AUDIT_TEMP_BYTES
        if conv is None:
            return measured
        return max(
            measured,
            conv_columns(conv, out_dims, in_dims, 4),
            conv_columns(conv, out_dims, in_dims, self.reference_bytes),
        )


#: A float32 convolution of one sample of at most this many input elements, not grouped, with a kernel of 3 or
#: less on a side, runs in torch's native kernel (``slow_conv2d``, with an im2col buffer), not in oneDNN.
SMALL_FLOAT32_INPUT = 20480


def conv_columns(conv: Conv, out_dims: list[int], in_dims: list[list[int] | None], itemsize: int) -> int:
    """The bytes of the im2col buffer torch 2.13's CPU convolution allocates for one run in a dtype of ``itemsize``
    bytes (measured as the peak RSS of single convolutions, BENCHMARKS.md part N).  float64 runs in torch's native
    kernels: a ``[N, C_in/g * k, out positions]`` buffer for the whole batch (a transposed one's
    ``[N, C_out/g * k, input positions]``), one sample's for a dilated one, none for a 1x1 kernel at stride 1 without
    padding; a grouped one runs group by group, each with its input's slice and its output's.  float32 runs in
    oneDNN, which makes none (its own temporaries stay under the error measurement's 24 bytes per output element),
    but for :data:`SMALL_FLOAT32_INPUT`.  0 where an input's dims are unknown."""
    x, w = (in_dims + [None, None])[:2]
    if not x or not w or len(x) < 3 or len(w) != len(x) or len(out_dims) != len(x) or not w[1]:
        return 0
    n, k = x[0], elements(w[2:])
    groups = (out_dims[1] if conv.transposed else x[1]) // w[1]
    if itemsize == 4 and (
        conv.transposed or groups != 1 or n > 1 or elements(x) > SMALL_FLOAT32_INPUT or (len(w) == 4 and min(w[2:]) > 3)
    ):
        return 0  # oneDNN
    if conv.transposed:
        columns = n * elements(x[2:]) * w[1] * k
    elif k == 1 and list(out_dims[2:]) == list(x[2:]):
        columns = 0  # 1x1, stride 1, no padding: the input is the matrix
    else:
        columns = (1 if conv.dilated else n) * elements(out_dims[2:]) * w[1] * k
    if groups > 1:  # one group at a time: its columns, its input's slice and its output's
        columns += elements(x) // groups + elements(out_dims) // groups
    return columns * itemsize


def onnx_audit_plan(
    model: Any, batches: list, where: str, hold: AuditHold | None = None, fields: list | None = None
) -> Plan:
    """:func:`onnx_plan` with the graph inputs shaped like the largest of ``batches`` (the ONNX audit's
    check before it runs: dims the file leaves open are then those of the real inputs), counting what
    the audit holds (``hold``, three runs a batch; default: the most any audit holds); then the run-time checks of the
    op loop are armed (:func:`bnfold.io.run_checks.expect`).  ``fields``: the nodes' fields
    (:func:`bnfold.onnx.const_eval.node_fields`), read once for the plan (the program reads them again)."""

    init = {t.name for t in model.graph.initializer}
    inputs = [v for v in model.graph.input if v.name not in init]
    largest: dict[str, tuple] = {}
    for batch in batches:
        for v, x in zip(inputs, batch):
            shape = tuple(int(d) for d in getattr(x, "shape", ()))
            if elements(shape) >= elements(largest.get(v.name, ())):
                largest[v.name] = shape
    hold = (hold or AuditHold(3)).with_runs(3)
    plan = onnx_plan(model, where, hold=hold, batches=max(len(batches), 1), input_dims=largest, fields=fields)
    expect(plan.budget, plan.flops, where)
    return plan


def fx_audit_plan(
    model: Any, batches: list, *, runs: int = 3, name: str | None = None, hold: AuditHold | None = None
) -> Plan:
    """The check the audit makes before it runs a torch program (``model``, an ExportedProgram; an ONNX
    model's is :func:`onnx_audit_plan`): no higher-order op (the audit cannot run one), indices inside their
    tables, and the plan of ``runs`` runs per batch within the budget, counting what the audit holds (``hold``;
    default: the most any audit holds); the plan is returned."""
    where = name or "the model"
    hops = higher_order_ops(model)
    if hops:
        op, node = hops[0]
        raise ModelFileError(
            f"{where}: the audit cannot run the higher-order op {op} (node {node!r}); "
            "fold and check handle it, audit a program without it"
        )
    check_indices(model, batches)
    plan = fx_plan(model, batches, where=where, runs=runs, hold=(hold or AuditHold(runs)).with_runs(runs))

    expect(plan.budget, plan.flops, where, sized=plan.sized)  # the run-time checks of the op loop (io.run_checks)
    return plan
