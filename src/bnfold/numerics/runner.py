"""The lockstep runner: a graph run node by node under a precision profile, next to a high-precision reference.

One runner for every format.  A format gives it a :class:`Program` (its executor, kept thin:
:func:`~.fx_program.fx_program` for a torch program, :func:`~.onnx_program.onnx_program` for ONNX):
the values in graph order as :class:`Step` s (a node: the value names it reads and writes, how to
run its op in a given float dtype, and its op's facts), the constants, the inputs and outputs.
Everything a profile does happens here, once: fp16 storage, exact and same-error ops, fp16
accumulation, an NPU's host-precomputed BatchNorm, ONNX Runtime's fp16 Conv+BN fusion and fp16 ops;
so do the reference (float64; float32 under a profile that stores fp16, whose error is 8192 times
float32's), the local (per-segment) errors and the batch-norm probes.

Each float value (by name) is compared with its reference as soon as it exists; values are dropped
after their last use.  :meth:`Runner._emulate` is the single place an op runs emulated (a per-op
check belongs there).

:meth:`Runner.run`'s loop is the definition; from a run mode's second run on, the same run executes as Python
generated once for the runner and that mode (:mod:`.compiled`: the loop's decisions taken once, the values in
locals), with the same step callables, emulators and measurements, and the same report.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import torch

from ..io.cost import Plan
from ..io.run_checks import PLANNED, SMALL_REAL, OpSizes, before_op, budget_bytes, meta_signature, watching
from .audit_memory import AuditHold
from .compiled import Compiled, Measures, Mode, ShortOutputs, generate
from .probe import NormProbe
from .profiles import Profile, get_profile, htp_host_scale_shift, round_fp16
from .rounded_constants import round_constants, stored_exactly, written_first
from .tensor_error import ErrorMeter, TensorError


def is_tensor(t: Any) -> bool:
    return isinstance(t, torch.Tensor)


def is_float(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.is_floating_point()


def round_floats(out: Any) -> Any:
    """``out`` (a tensor, or a tuple/list of values) with its float tensors rounded to fp16."""
    if isinstance(out, torch.Tensor):
        return round_fp16(out) if out.is_floating_point() else out
    if isinstance(out, (tuple, list)):
        return type(out)(round_floats(o) for o in out)
    return out


#: what an op's output is rounded to when its op table says nothing: the storage format (``Step.rounding``)
DEFAULT_ROUNDING = "round"


@dataclass
class StepNorm:
    """An eval-mode batch norm step: the value it normalizes, its parameters (value names, None: absent),
    eps, channel axis, how many values its op returns (a native batch norm: the output and two stats) and
    the value holding the normalized tensor (None: unused)."""

    input: str
    params: tuple  # (weight, bias, mean, var)
    eps: float
    axis: int = 1
    returns: int = 1
    output: str | None = None


@dataclass
class Step:
    """One node.  ``run(ins, float_dtype, eps=None, weight=None, bias=None)`` computes its outputs (a
    list, one per name in ``outs``; a value may be a tuple) from ``ins`` (one per name in ``ins``; None for
    an omitted input) in ``float_dtype``, ``eps`` replacing a batch norm's, ``weight``/``bias`` a layer's.
    Facts: ``rounding`` ``exact`` (its output holds its input's values), ``same`` (and the same error
    statistics), ``round`` (rounded to the storage format); ``layer`` the layer kind (conv, conv_transpose,
    linear, matmul) and ``weight``/``bias`` its constant inputs' names; ``fp16_class`` the ops a runtime
    keeps in fp16 (``movement``, ``softmax``); ``accumulated(ins, chunk)`` the layer with fp16 accumulation;
    ``mutates``: the op writes an input in place (the runner runs it so, as the program says); ``shape`` the op
    table's (``same``: the output has the first input's shape; ``broadcast``: the inputs' broadcast shape;
    ``reduced``: at most the first input's elements): it bounds the outputs' size without a meta run
    (:func:`bnfold.io.run_checks.shape_bound`); ``channels`` where its output channels lie."""

    name: str
    op: str
    ins: list
    outs: list
    run: Callable
    rounding: str = DEFAULT_ROUNDING
    layer: str | None = None
    weight: str | None = None
    bias: str | None = None
    norm: StepNorm | None = None
    fp16_class: str = ""
    accumulated: Callable | None = None
    not_emulated: str = ""  # why it has no rounding rule (it runs in float32 through a reference implementation)
    label: str = ""  # the name the report shows (a module path), "" for ``name``
    mutates: bool = False  # its op writes one of its inputs in place (torch's ``relu_``, ``add_``, ``out=``)
    shape: str = ""
    #: ``(weight axis, output axis)`` where a layer's output channels lie, each output channel computed from its
    #: slice of the weight (and of a bias's last axis) alone: a run may compute it a block of channels at a time
    #: (:func:`.ranges.run_plain`); None where the format does not say (a grouped or transposed conv)
    channels: tuple[int, int] | None = None


@dataclass
class Program:
    """A format's executor: ``steps`` in graph order, ``constants`` (floats in the dtype the model stores,
    integers as they are), ``inputs`` / ``outputs`` (value names), ``feed(xs)`` checking and converting one
    batch's inputs; ``stored``: what a format keeps of how the model stores its large constants, by name (for a
    program of a model folded from this one to recognize them: ``AuditFormat.program``'s ``like``)."""

    steps: list[Step]
    constants: dict[str, Any]
    inputs: list[str]
    outputs: list[str]
    feed: Callable[[tuple], list]
    stored: dict[str, Any] = field(default_factory=dict)
    #: the constants a step may write in place, through a view of them too (the format's alias analysis: a torch
    #: program's ``B.t().mul_(x)``); the program holds its own copies of them
    writes: frozenset = frozenset()


class AuditFormat(Protocol):
    """A format's audit hooks (``bnfold.frontends.Frontend.numerics()``)."""

    #: the errors by which the audit says it cannot run a model of this format (an op it cannot compute, inputs
    #: that do not fit it): the command line prints them as one line
    cannot_run: tuple[type[Exception], ...]

    def prepare(
        self,
        model: Any,
        inputs: Any,
        *,
        input_shapes: dict[str, tuple] | None = None,
        name: str | None = None,
        random_inputs: bool = False,
        runtime: str | None = None,
        fold: bool = True,
        hold: AuditHold | None = None,
    ) -> tuple[Any, list[tuple], str | None, bool, Plan]:
        """Check what the audit is given (an nn.Module is exported) and run :meth:`plan`: ``(model, batches,
        name, random_inputs, plan)``."""
        ...

    def plan(self, model: Any, batches: list[tuple], *, runs: int, name: str | None, hold: AuditHold | None) -> Plan:
        """The audit's cost check before anything runs (:mod:`.audit_memory`: ``runs`` runs per batch, each value
        counted as ``hold`` counts it: the audit's profile and options), which arms the run-time checks of the op
        loop; the plan (:class:`bnfold.io.cost.Plan`)."""
        ...

    def program(self, model: Any, like: Program | None = None, lazy: bool = False) -> Program:
        """The model as a :class:`Program` (``like``: the program of the model it was folded from, whose
        unchanged constants it may hold; ``lazy``: large constants the model keeps on disk may be
        :class:`~.lazy.LazyConstant` s, for :func:`~.ranges.run_plain` only)."""
        ...

    def output_rank(self, model: Any) -> int | None:
        """The rank of the model's first output where the model states it (else None)."""
        ...


@dataclass
class BatchResult:
    """One batch: emulated outputs (float32), reference outputs, per-tensor errors by value name;
    ``kept``: the reference values asked for by name (see :meth:`Runner.run`)."""

    outputs: list
    reference: list
    errors: dict[str, TensorError]
    local: dict[str, TensorError] = field(default_factory=dict)
    probes: dict[str, NormProbe] = field(default_factory=dict)
    kept: dict[str, Any] = field(default_factory=dict)


@dataclass
class EmulationResult:
    """All batches: per-tensor errors merged over batches; ``outputs`` / ``reference``: each batch's, when
    :meth:`add` is asked to keep them (``emulate``'s default; the audit keeps none: its end-to-end numbers are summed
    as the batches run, :class:`.end_to_end.EndToEndSum`).

    ``errors`` are cumulative (against the reference run of the whole program, :func:`reference_dtype`); ``local``
    holds the error each segment adds by itself (see :class:`Runner`); ``probes`` the input range of each batch norm;
    ``not_emulated`` the nodes run in float32 by a reference implementation, not under the profile:
    ``(node, op type, why)``.
    """

    profile: str
    errors: dict[str, TensorError] = field(default_factory=dict)
    outputs: list = field(default_factory=list)
    reference: list = field(default_factory=list)
    local: dict[str, TensorError] = field(default_factory=dict)
    probes: dict[str, NormProbe] = field(default_factory=dict)
    not_emulated: list[tuple[str, str, str]] = field(default_factory=list)

    def add(self, batch: BatchResult, keep_outputs: bool = False) -> None:
        for mine, theirs in ((self.errors, batch.errors), (self.local, batch.local), (self.probes, batch.probes)):
            for name, value in theirs.items():
                if name in mine:
                    mine[name].merge(value)
                else:
                    mine[name] = value
        if keep_outputs:
            self.outputs.append(batch.outputs)
            self.reference.append(batch.reference)


#: a run mode's runs by the interpreter before its generated code (:mod:`.compiled`) runs the later ones
COMPILE_AFTER = 1


class _Stale(Exception):
    """A run whose sizes were checked at once reached an op whose small inputs differ from those they came from."""


def _carries_values(x: Any, large: bool = False) -> bool:
    """Whether ``x`` (a value, or a tuple of them) holds a tensor whose elements a meta run reads (a small one);
    ``large``: one whose elements it does not read."""
    if isinstance(x, tuple):
        return any(_carries_values(t, large) for t in x)
    if not isinstance(x, torch.Tensor):
        return large  # no signature: treated as unknown
    return x.numel() > SMALL_REAL if large else 0 < x.numel() <= SMALL_REAL


def _reads(step: Step, values: set) -> frozenset:
    """The positions of ``step``'s inputs that read one of ``values``."""
    return frozenset(k for k, v in enumerate(step.ins) if v in values)


def _copy_aliases(kept: dict, ins: list) -> None:
    """Replace each value in ``kept`` that shares memory with one of ``ins`` by a copy (an in-place op is about to
    write one of them: what was kept is the value as it was made)."""
    memory = {t.untyped_storage().data_ptr() for t in ins if isinstance(t, torch.Tensor)}
    for name, value in kept.items():
        if isinstance(value, torch.Tensor) and value.untyped_storage().data_ptr() in memory:
            kept[name] = value.clone()


class Runner:
    """Runs ``program`` under ``profile`` (see :mod:`bnfold.numerics.profiles`).

    ``bn_eps`` replaces the eps of every batch norm in the emulated run (the reference keeps the
    model's): a runtime that ignores it.  ``segments`` (``{value name: segment id}``) asks for local
    errors: each value named there is also computed from the *emulated* values of its inputs outside its
    segment (constants unrounded, the model's eps) and, inside it, from that local run; the difference to the
    emulated value is the error the segment adds by itself (``BatchResult.local``).  The local run computes in
    the reference's dtype.  ``local_measured``: the values whose local error is measured (default: every value
    of a segment; the audit asks for its rows' outputs, the others are computed only to reach them).
    ``measured``: the values compared with their reference (default: every floating value).  ``planned``:
    ``program`` is the one the audit's cost plan sized (the run-time check then skips the meta run of an op
    whose outputs the plan sized, :func:`bnfold.io.run_checks.before_op`).  ``shared``: a dict given to the runners
    of one audit under the same profile (the unfolded and the folded program): a large constant both programs hold
    (a weight the fold left as it was, the same tensor or the same bytes) is rounded once
    (:mod:`.rounded_constants`).  ``fp32``: the steps (by name) a mixed-precision model keeps
    in float32 (onnxconverter-common's ``node_block_list``): such a step reads its constants unrounded, computes in
    float32 and stores float32; a step under the profile that reads its output reads it cast to the profile's
    storage (the cast the converter inserts: a magnitude past 65504 becomes inf there).
    """

    def __init__(
        self,
        program: Program,
        profile: str | Profile = "fp16",
        bn_eps=None,
        segments: dict | None = None,
        local_measured: set | None = None,
        measured: set | None = None,
        planned: bool = False,
        shared: dict | None = None,
        fp32: frozenset = frozenset(),
    ):
        self.program = program
        self.fp32 = frozenset(fp32)
        self.planned = planned
        self.local_measured = local_measured
        self.measured = measured
        self.profile = prof = get_profile(profile)
        self.bn_eps = None if bn_eps is None else float(bn_eps)
        self.segments = dict(segments or {})
        consts = program.constants
        f32 = {k: v if v.dtype == torch.float32 else v.to(torch.float32) for k, v in consts.items() if is_float(v)}
        self._mutates = any(s.mutates for s in program.steps)
        # a program that writes a value in place holds each constant's rounding as its own (no content shared, no
        # emulated constant the reference's); else a constant a step computes again before any read is held
        # unrounded (its float32 value: the run reads the step's output) and a float16 one is its own rounding
        exact = frozenset() if self._mutates else frozenset(k for k in f32 if stored_exactly(prof, consts[k].dtype))
        exact |= frozenset() if self._mutates else written_first(program, prof.fp16_conv_fusion) & f32.keys()
        rounded = round_constants(prof, f32, shared, exact, by_content=not self._mutates)
        self._const_e = {k: rounded[k] if k in f32 else v for k, v in consts.items()}
        self._ref_dtype = reference_dtype(prof)
        ref32 = self._ref_dtype == torch.float32
        self._const_r = {k: (f32[k] if ref32 else v.to(self._ref_dtype)) if k in f32 else v for k, v in consts.items()}
        readers: dict[str, list[Step]] = {}
        for step in program.steps:
            for v in step.ins:
                if v:
                    readers.setdefault(v, []).append(step)
        self._free_after = free_after(program)
        self._labels = labels(program)  # what before_op records
        self._sizes = OpSizes()  # what the run-time check found of each step (_check)
        #: what the run holds of each value (emulated, reference, local when on), as the audit's plan counts it
        self.audit_hold = AuditHold.of(0, self._ref_dtype, bool(self.segments))
        count = self.audit_hold.held
        held = (count(v.numel(), v.nbytes, v.is_floating_point()) for v in consts.values() if is_tensor(v))
        self._const_held = sum(held)  # the constants, emulated and reference, as the plan counts them
        self._holding = self._const_held  # what a run holds now (:meth:`_held`)
        self._htp: dict[str, tuple] = {}
        self._fused: dict[str, Any] = self._ort_fusion(readers) if prof.fp16_conv_fusion else {}
        #: runs of a mode before its generated code runs them (:meth:`compiled`; None: the interpreter only)
        self.compile_after: int | None = COMPILE_AFTER
        self._code: dict[Mode, Compiled] = {}
        self._code_runs: dict[Mode, int] = {}
        #: per feed signature, the most a run adds to what is held at any op it sizes, and the signatures of the
        #: inputs of the ops that read small run-time values (None: the sizes are not a function of it)
        self._hoisted: dict[tuple, tuple | None] = {}
        self._recording: tuple | None = None
        self._guards: dict[int, tuple] = {}
        self._guarded: Any = None  # the feed signature whose recorded sizes the "op" run uses
        wide = {v for s in program.steps if s.name in self.fp32 for v in s.outs if v}
        #: per step under the profile, which of its inputs a float32 step wrote (cast to the storage format)
        self._casts = {s.name: k for s in program.steps if s.name not in self.fp32 if (k := _reads(s, wide))}

    @property
    def not_emulated(self) -> list[tuple[str, str, str]]:
        """``(node, op type, why)``: the steps with no rounding rule (run in float32 by a reference implementation)."""
        return [(s.name, s.op, s.not_emulated) for s in self.program.steps if s.not_emulated]

    def _ort_fusion(self, readers: dict) -> dict[str, Any]:
        """ONNX Runtime's Conv+BatchNormalization fusion on fp16 weights (:mod:`.ort_fusion`): ``{conv step:
        (weight, bias)}`` and ``{batch norm step: the conv's output}`` for each conv of constant weights whose
        output only an eval-mode batch norm of constant parameters reads."""
        from .ort_fusion import fuse_fp16

        c, out = self._const_e, {}
        for step in self.program.steps:
            if step.layer != "conv" or step.weight not in c or (step.bias is not None and step.bias not in c):
                continue
            value = step.outs[0]
            users = readers.get(value, [])
            norm = users[0].norm if len(users) == 1 else None
            if value in self.program.outputs or norm is None or norm.input != value:
                continue
            if not all(p in c for p in norm.params):
                continue
            eps = norm.eps if self.bn_eps is None else self.bn_eps
            out[step.name] = fuse_fp16(c[step.weight], c.get(step.bias), *(c[p] for p in norm.params), eps)
            out[users[0].name] = value
        return out

    # -- one op -------------------------------------------------------------------------------------

    def _check(self, i: int, step: Step, ins: list) -> None:
        """The run-time check of step ``i`` before it runs emulated on ``ins`` (:class:`bnfold.io.run_checks.OpSizes`:
        the plan's sizes where ``planned``, else the bound of its ``shape`` fact or of a batch norm's per-channel
        parameters, else its meta kernels, once per input signature)."""
        norm, sized = step.norm, step.outs if self.planned else ()
        axis = norm.axis if norm is not None and step.ins[0] == norm.input else None
        nbytes = self._sizes.check(
            i, self._labels[i], step.run, (ins, torch.float32), ins, len(step.outs), sized, step.shape, axis, self._held
        )
        if self._recording is not None:  # what sized it (:meth:`_checks`)
            self._recording[2].append(self._record(step, ins, nbytes))

    def _held(self, nbytes: int) -> int:
        """What the audit holds once this op made outputs of ``nbytes`` (float32 values, as the plan counts them:
        :class:`~.audit_memory.AuditHold`): what the caller keeps, this run's constants and live values, and these."""
        return self._holding + self.audit_hold.held(nbytes // 4, nbytes, True)

    def _emulate(self, step: Step, ins: list, env: dict) -> list:
        """``step`` under the profile, on the emulated values ``ins`` (the one place an op runs emulated)."""
        prof, norm, eps = self.profile, step.norm, self.bn_eps
        if step.name in self.fp32:
            return self._float32(step, ins)
        if step.name in self._casts:
            ins = [prof.round(x) if k in self._casts[step.name] and is_float(x) else x for k, x in enumerate(ins)]
        fused = self._fused.get(step.name)
        if isinstance(fused, str):  # a batch norm fused into the conv before it: already applied there
            y = env[fused]
            return [y if norm.returns == 1 else (y, y.new_empty(0), y.new_empty(0))]
        if norm is not None and prof.htp_batch_norm:
            return [self._htp_batch_norm(step, env[norm.input], env)]
        if fused is not None:
            out = step.run(ins, torch.float32, weight=fused[0], bias=fused[1])
        elif prof.fp16_accumulate and step.accumulated is not None:
            out = [step.accumulated(ins, prof.acc_chunk)]
        else:
            out = step.run(ins, torch.float32, eps=eps if norm is not None else None)
        return [round_floats(o) for o in out] if self._rounds(step) else out

    def _rounds(self, step: Step) -> bool:
        """Whether ``step``'s outputs are rounded to the storage format once its op ran (the profile's rule)."""
        prof = self.profile
        if prof.fp16_storage:
            return step.rounding == DEFAULT_ROUNDING
        return bool(step.fp16_class) and step.fp16_class in prof.fp16_classes

    def emulator(self, step: Step) -> Callable[[list], list]:
        """``ins -> outputs``: :meth:`_emulate` of ``step`` as one callable (the compiled run's,
        :mod:`.compiled`).  A plain step (no float32 island, cast, fusion, host batch norm or fp16 accumulation
        applies to it) is its ``Step.run`` in float32 with the rounding of :meth:`_rounds` fused in, the branches
        decided here once; any other calls :meth:`_emulate` with its inputs as the values it reads."""
        prof, name, norm = self.profile, step.name, step.norm
        special = name in self.fp32 or name in self._casts or name in self._fused
        special = special or (norm is not None and prof.htp_batch_norm)
        special = special or (prof.fp16_accumulate and step.accumulated is not None)
        if special:
            me = weakref.ref(self)  # the runner holds its code, which holds this: no cycle to collect
            return lambda ins: me()._emulate(step, ins, dict(zip(step.ins, ins)))
        run, f32 = step.run, torch.float32
        eps = self.bn_eps if norm is not None else None
        if not self._rounds(step):
            return (lambda ins: run(ins, f32)) if eps is None else (lambda ins: run(ins, f32, eps=eps))
        if eps is None:
            return lambda ins: [round_floats(o) for o in run(ins, f32)]
        return lambda ins: [round_floats(o) for o in run(ins, f32, eps=eps)]

    def _float32(self, step: Step, ins: list) -> list:
        """``step`` kept in float32: its constants unrounded, its output stored in float32."""
        c = self._const_r
        wide = [c[v].to(torch.float32) if v in c and is_float(c[v]) else x for v, x in zip(step.ins, ins)]
        return step.run(wide, torch.float32, eps=self.bn_eps if step.norm is not None else None)

    def _htp_batch_norm(self, step: Step, x: torch.Tensor, env: dict) -> Any:
        """An NPU runtime's BatchNorm: ``round(round(x * scale) + shift)`` with the host's float32
        ``scale``/``shift`` from the unrounded parameters, stored in fp16 (the runtime's arithmetic, not
        the fold's: that is ``bnfold.fold_math``, float64)."""
        norm = step.norm
        pair = self._htp.get(step.name)
        if pair is None:
            fills = (1.0, 0.0, 0.0, 1.0)
            host = [
                torch.full((x.shape[norm.axis],), f) if p is None else (self._const_r.get(p, env.get(p)))
                for p, f in zip(norm.params, fills)
            ]
            pair = htp_host_scale_shift(*host, norm.eps if self.bn_eps is None else self.bn_eps, x.dim())
            if all(p is None or p in self._const_r for p in norm.params):
                self._htp[step.name] = pair
        y = round_fp16(round_fp16(x * pair[0]) + pair[1])
        return y if norm.returns == 1 else (y, x.new_empty(0), x.new_empty(0))

    # -- a batch ------------------------------------------------------------------------------------

    def run(
        self,
        *xs: Any,
        reference: bool = True,
        against: dict[str, torch.Tensor] | None = None,
        against_stats: dict[str, tuple[float, float]] | None = None,
        keep_reference: frozenset = frozenset(),
        on_node: Callable[[int, int], None] | None = None,
        holding: int = 0,
    ) -> BatchResult:
        """Run one batch.  ``reference``: run the reference too (else only the emulated outputs
        come back).  ``against``: measure against these reference values (by name: a run of the unfolded
        model) instead of a reference run here; ``against_stats``: what is known of some of them (``(signal,
        max_abs_ref)`` by name, :func:`.tensor_error.reference_stats`), not measured again.  ``keep_reference``: the
        reference values to return (``BatchResult.kept``).  ``on_node(i, n)`` after each of ``n`` steps.  ``holding``:
        the bytes the caller holds while this runs (the outputs kept of earlier batches and runs): with this run's
        constants and live values, what the run-time check counts against the budget before an op allocates."""
        prog, prof = self.program, self.profile
        meter = ErrorMeter(exact_diff=self._ref_dtype == torch.float64)
        feed = prog.feed(xs)
        mode = Mode(reference, against is not None, keep_reference, on_node is not None, self._checks(feed, holding))
        code = self.compiled(mode)
        if code is not None:
            try:
                res = self._run_compiled(code, feed, meter, against, against_stats or {}, on_node, holding)
            except _Stale:  # a small value that sizes an op differs from the run the sizes came from: op by op
                self._hoisted[self._guarded] = None  # and so for later batches of that signature (no run twice)
                meter = ErrorMeter(exact_diff=self._ref_dtype == torch.float64)
            except ShortOutputs:  # an op returned fewer outputs than named: the interpreter, from now on
                self.compile_after, self._code = None, {}
                meter = ErrorMeter(exact_diff=self._ref_dtype == torch.float64)
            else:
                self._recorded()
                return res
        env_e: dict[str, Any] = dict(self._const_e)
        env_r: dict[str, Any] = dict(self._const_r) if reference else {}
        env_l: dict[str, Any] = {}
        refs = against if against is not None else env_r
        known = against_stats or {}
        measuring = reference or against is not None
        errors: dict[str, TensorError] = {}
        local: dict[str, TensorError] = {}
        probes: dict[str, NormProbe] = {}
        kept: dict[str, Any] = {}
        alive: dict[str, int] = {}  # what the audit holds of each live value (AuditHold, as the plan counts)
        self._holding = holding + self._const_held
        for name, x in zip(prog.inputs, feed):
            self._hold(alive, name, x)
            if is_float(x):
                env_e[name] = prof.round(x.detach().to(torch.float32))
                if reference:
                    env_r[name] = x.detach().to(self._ref_dtype)
                if name in refs:
                    meter.add(errors, name, "input", env_e[name], refs[name], known.get(name))
            else:
                env_e[name] = x
                if reference:
                    env_r[name] = x
        n = len(prog.steps)
        for i, step in enumerate(prog.steps):
            if on_node is not None:
                on_node(i, n)
            if step.mutates:  # an in-place op: what is held of its inputs is read before they change
                meter.flush()
                _copy_aliases(kept, [env_r.get(v) for v in step.ins if v])
            ins = [env_e[v] if v else None for v in step.ins]
            self._check(i, step, ins)  # before it allocates
            outs_e = self._emulate(step, ins, env_e)
            if reference:
                outs_r = step.run([env_r[v] if v else None for v in step.ins], self._ref_dtype)
            norm = step.norm
            if norm is not None and measuring and is_float(refs.get(norm.input)):
                probes[step.name] = NormProbe.of(step.name, env_e[norm.input], refs[norm.input], norm.axis)
            for k, out in enumerate(step.outs):
                if not out or k >= len(outs_e):
                    continue
                e = env_e[out] = outs_e[k]
                self._hold(alive, out, e)
                if reference:
                    env_r[out] = outs_r[k]
                    if out in keep_reference:
                        kept[out] = outs_r[k]
                if not is_float(e):
                    continue
                if out in self.segments:
                    lv = env_l[out] = self._local(step, k, env_e, env_l)
                    if is_float(lv) and (self.local_measured is None or out in self.local_measured):
                        meter.add(local, out, step.op, e, lv)
                r = refs.get(out) if self.measured is None or out in self.measured else None
                if is_float(r):
                    same = step.rounding == "same" and step.ins and step.name not in self._casts
                    src = errors.get(step.ins[0]) if same else None
                    if src is not None and src.count == r.numel():
                        errors[out] = replace(src, node=out, op=step.op, shape=tuple(r.shape))
                    else:
                        meter.add(errors, out, step.op, e, r, known.get(out))
            for dead in self._free_after.get(i, ()):
                self._release(alive, kept, dead)
                env_e.pop(dead, None)
                env_r.pop(dead, None)
                env_l.pop(dead, None)
        meter.flush()
        outputs = [env_e[o] for o in prog.outputs]
        ref_out = [refs.get(o) for o in prog.outputs] if measuring else []
        self._recorded()
        return BatchResult(outputs, ref_out, errors, local, probes, kept)

    # -- the run-time check, once per input signature -------------------------------------------------

    def _checks(self, feed: list, holding: int) -> str:
        """How this run checks its ops (:class:`.compiled.Mode`'s ``checked``): ``""`` outside a watched command
        (the check has nothing to do); ``"op"``: each op recorded and the CPU time bounded, the sizes checked once
        for the run, here; ``"full"``: each op sized before it runs.

        The sizes are checked once where an earlier run on a feed of the same signature (shapes, and the values of
        small inputs) found every op's size a function of that signature (each op sized by its meta kernels or a
        shape fact).  Its ops then make what they made, with what the run holds at each op as then, from what the
        caller holds now: if the largest of those sums is within the budget, every op's own check would pass (the
        same comparisons).  Else each op is checked, and the one over the budget refused before it allocates.  An op
        that reads a small value computed at run time (a shape, scales: :meth:`_value_free`) is sized once too,
        where that value is the recorded one: its inputs' signature is compared before it runs (where it differs,
        :class:`_Stale`: the batch runs again, each op checked)."""
        self._recording, self._guards = None, {}
        if not watching():
            return ""
        budget = budget_bytes()
        if budget is None:
            return "op"  # the check sizes nothing: it records the op and bounds the CPU time
        if self._mutates:
            return "full"  # an in-place op may change a constant (and what a later op reads of it)
        sig = meta_signature(feed)
        if sig is None:
            return "full"
        if sig not in self._hoisted:
            self._recording = (sig, holding + self._const_held, [])
            return "full"
        hoisted = self._hoisted[sig]
        if hoisted is None or holding + self._const_held + hoisted[0] > budget:
            return "full"
        self._guards, self._guarded = hoisted[1], sig
        return "op"

    def _record(self, step: Step, ins: list, nbytes: int | None) -> tuple | None:
        """What a run that records its checks keeps of an op the check sized as ``nbytes`` (:meth:`_checks`):
        ``(nbytes, what the run holds, the signature its inputs must have again or None)``; None where its size
        may change on a feed of the same signature.  An op nothing sized (no meta kernel tells) whose inputs are all
        small (their values in the signature) is kept as one the plan sized: nothing is compared for it, and its
        outputs follow from its inputs' signature."""
        if nbytes is None:
            if not all(x is None or not _carries_values(x, large=True) for x in ins):
                return None
            return (PLANNED, self._holding, meta_signature(ins))
        return (nbytes, self._holding, None if self._value_free(step, ins) else meta_signature(ins))

    def _value_free(self, step: Step, ins: list) -> bool:
        """Whether ``step``'s output sizes follow from its inputs' shapes alone: a shape fact that says so, a layer or
        a batch norm, or no input that is a small value (up to :data:`~bnfold.io.run_checks.SMALL_REAL` elements,
        which a meta run reads) computed at run time."""
        if step.shape in ("same", "broadcast") or step.layer is not None or step.norm is not None:
            return True
        return not any(v not in self._const_e and _carries_values(x) for v, x in zip(step.ins, ins))

    def _recorded(self) -> None:
        """After a run that recorded its checks (:meth:`_checks`): what the feed's signature needs, or None."""
        rec, self._recording = self._recording, None
        if rec is None:
            return
        sig, base, found = rec
        steps = len(self.program.steps)
        if len(found) != steps or any(f is None for f in found):
            self._hoisted[sig] = None
            return
        held = [h - base + self.audit_hold.held(nb // 4, nb, True) for nb, h, _ in found if nb != PLANNED]
        guards = {i: g for i, (_, _, g) in enumerate(found) if g is not None}
        self._hoisted[sig] = (max(held, default=0), guards)

    def compiled(self, mode: Mode) -> Compiled | None:
        """The generated run of ``mode`` (:mod:`.compiled`), or None where the interpreter runs: a mode's first
        :attr:`compile_after` runs (compiling costs about one run: one batch runs interpreted, the second and later
        compiled; None: never)."""
        if self.compile_after is None:
            return None
        code = self._code.get(mode)
        if code is None:
            runs = replace(mode, checked="")  # the runs of a mode, however checked
            seen = self._code_runs[runs] = self._code_runs.get(runs, 0) + 1
            if seen <= self.compile_after:
                return None
            code = self._code[mode] = generate(self, mode)
        return code

    def _run_compiled(self, code: Compiled, feed, meter, against, known, on_node, holding: int) -> BatchResult:
        """One batch through ``code`` (:meth:`run`'s results, the same numbers)."""
        errors: dict[str, TensorError] = {}
        probes: dict[str, NormProbe] = {}
        kept: dict[str, Any] = {}
        alive: dict[str, int] = {}
        self._holding = holding + self._const_held
        steps = self.program.steps

        def free(name: str) -> None:
            self._release(alive, kept, name)

        def hold(name: str, x: Any) -> None:
            self._hold(alive, name, x)

        def chk(i: int, ins: list) -> list:
            self._check(i, steps[i], ins)
            return ins

        def writes(kept: dict, refs: list) -> None:  # as run() before an in-place op
            meter.flush()
            _copy_aliases(kept, refs)

        def op(i: int, ins: list) -> list:  # the sizes were checked for the run (_checks)
            before_op(labels[i])
            guard = guards.get(i)
            if guard is not None and meta_signature(ins) != guard:
                raise _Stale
            return ins

        local: dict[str, TensorError] = {}
        m, labels, guards = Measures(meter, errors, known, probes, local), self._labels, self._guards
        fn = code.fn
        outputs, ref_out = fn(
            feed, against, known, meter, errors, kept, on_node, chk, hold, free, m.M, m.MS, m.PR, writes, op, m.LM
        )
        meter.flush()
        return BatchResult(outputs, ref_out, errors, local, probes, kept)

    @property
    def held_constants(self) -> int:
        """What this runner's constants take, emulated and reference, as the plan counts them."""
        return self._const_held

    def reference_outputs(self, *xs: Any, holding: int = 0) -> list:
        """The reference run alone on one batch: the outputs :meth:`run` returns as ``reference``, the same ops on
        the same values (for a second look at a batch whose outputs were not kept: the prescription's runs and the
        real runtimes are measured against them).  ``holding``: as in :meth:`run`."""
        self._holding = holding + self._const_held
        return run_in(self.program, xs, self._ref_dtype, self._const_r, self._held)

    def _release(self, alive: dict, kept: dict, name: str) -> None:
        """Value ``name`` is dropped after its last reader: what the run holds less it, and plus its kept reference,
        which stays (returned to the caller)."""
        self._holding -= alive.pop(name, 0)
        if name in kept:
            self._holding += AuditHold.kept(kept[name])

    def _hold(self, alive: dict, name: str, x: Any) -> None:
        """Count value ``name`` (``x``) as held while it lives."""
        if isinstance(x, torch.Tensor):
            n = alive[name] = self.audit_hold.held(x.numel(), x.nbytes, x.is_floating_point())
            self._holding += n

    def _local(self, step: Step, k: int, env_e: dict, env_l: dict) -> Any:
        """Output ``k`` of ``step`` from its segment's local values, the unrounded constants and, for
        any other input, the emulated value."""
        seg = self.segments[step.outs[k]]
        ins = []
        for v in step.ins:
            if not v:
                ins.append(None)
            elif v in env_l and self.segments.get(v) == seg:
                ins.append(env_l[v])
            elif v in self._const_r:
                ins.append(self._const_r[v])
            else:
                e = env_e[v]
                if is_float(e):  # a copy where the op would write the emulated value itself
                    e = e.clone() if step.mutates and e.dtype == self._ref_dtype else e.to(self._ref_dtype)
                ins.append(e)
        return step.run(ins, self._ref_dtype)[k]  # the model's eps: a runtime's other eps is its error


def reference_dtype(profile: Profile) -> torch.dtype:
    """The dtype the reference run (and the local runs) compute in under ``profile``.  float32 is accurate to
    ~6e-8 of a value, far below fp16's 5e-4: under a profile that stores fp16 they compute in float32 (their error
    is 1/8192 of the emulated one wherever a cancellation amplifies both); the fp32 profile's own error needs
    float64."""
    return torch.float32 if profile.fp16_storage or profile.fp16_constants else torch.float64


def free_after(program: Program) -> dict[int, list[str]]:
    """Per step index, the values no later step reads (neither a program output nor a constant): a run drops
    them once that step ran."""
    last_use: dict[str, int] = {}
    for i, step in enumerate(program.steps):
        for v in step.ins:
            if v:
                last_use[v] = i
    keep = set(program.outputs) | set(program.constants)
    out: dict[int, list[str]] = {}
    for v, i in last_use.items():
        if v not in keep:
            out.setdefault(i, []).append(v)
    return out


def labels(program: Program) -> list[str]:
    """Each step as the run-time check names it (``op 'node'``)."""
    return [f"{s.op} {s.label or s.name!r}" for s in program.steps]


def run_in(
    program: Program, xs: tuple, dtype: torch.dtype, constants: dict | None = None, held: Callable | None = None
) -> list:
    """``program``'s outputs on the batch ``xs`` with every float input, constant and value in ``dtype``: a real
    runtime's own precision (``torch`` half on CPU), or the reference run alone (``constants``: the program's
    constants already in ``dtype``), no emulation.  The run-time check sizes each op before it runs
    (:class:`bnfold.io.run_checks.OpSizes`; ``held``: what the run holds with an op's outputs, as there), and each
    value is dropped after its last reader, as in :meth:`Runner.run`."""
    if constants is None:
        constants = {k: v.to(dtype) if v.is_floating_point() else v for k, v in program.constants.items()}
    env = dict(constants)
    for name, x in zip(program.inputs, program.feed(xs)):
        env[name] = x.detach().to(dtype) if x.is_floating_point() else x
    sizes, names, dead = OpSizes(), labels(program), free_after(program)
    for i, step in enumerate(program.steps):
        ins = [env[v] if v else None for v in step.ins]
        sizes.check(i, names[i], step.run, (ins, dtype), ins, len(step.outs), (), step.shape, None, held)
        outs = step.run(ins, dtype)
        env.update((o, v) for o, v in zip(step.outs, outs) if o)
        for v in dead.get(i, ()):
            env.pop(v, None)
    return [env[o] for o in program.outputs]
