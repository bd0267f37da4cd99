""":meth:`.runner.Runner.run` as generated Python: one function per runner and run mode, compiled once.

The runner's loop looks up each value by name in dicts, and decides per step and per output what to run, round,
keep and measure.  All of that is fixed by the program, the profile and the run's mode, so :func:`generate` writes it
out once as straight-line Python: each value a local variable (``v<j>`` emulated, ``w<j>`` reference, ``j`` the
value's position in :attr:`Compiled.names`), each step a call of its emulator (:meth:`.runner.Runner.emulator`: the
interpreter's :meth:`~.runner.Runner._emulate`, with the profile's rounding fused in for a plain step) and of its
``Step.run`` in the reference dtype, the measurements only for the values the runner measures, a value set to
``None`` after its last reader.

Security (SECURITY.md: nothing from a model file is pasted into generated source): the source holds only
positions, fixed identifiers and Python keywords; names, op types and tensors reach the code through the tables it
indexes (``N``, ``OP``, ``SN``, ``E``, ``R``, ``AX``), never as text.

The run-time size check keeps its semantics.  Where a watched command is running (:func:`bnfold.io.run_checks.watch`),
the ``full`` variant calls :meth:`~.runner.Runner._check` before each step's emulated op, with the live values counted
as the interpreter counts them; the ``op`` variant, for a run whose sizes :meth:`~.runner.Runner._checks` checked at
once (a feed of a signature seen before, whose ops' sizes follow from it), only records each op (an allocator failure
names it) and bounds the CPU time.  Without a watched command the check has nothing to do (``before_op`` returns at
once), and the code leaves it out.

The interpreter runs each mode's first run (:meth:`.runner.Runner.compiled`): compiling costs about as much as one
run, so the code pays from the second batch on.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import torch

from .probe import NormProbe
from .tensor_error import ErrorMeter

if TYPE_CHECKING:
    from .runner import Runner


@dataclass(frozen=True)
class Mode:
    """What one run does: ``reference`` run too, measured ``against`` given references, the reference values
    ``keep`` returned by name, ``on_node`` called, ``checked``: the run-time check before each op (``"full"``), the
    op recorded and the CPU time bounded only (``"op"``: the sizes were checked for the whole run, see
    :meth:`.runner.Runner._checks`), or nothing (``""``: no watched command)."""

    reference: bool
    against: bool
    keep: frozenset
    on_node: bool
    checked: str


@dataclass
class Compiled:
    """A runner's run in one :class:`Mode` as a Python function: ``fn(feed, refs, known, meter, errors, kept,
    on_node, chk, hold, free, M, MS, PR, W, T, LM) -> (outputs, reference outputs)`` (``M``, ``MS``, ``PR``,
    ``LM``: a run's :class:`Measures`; ``W(kept, refs)`` before an in-place op; ``T(i, ins)``: op ``i`` recorded);
    ``source``: the text."""

    fn: Callable
    source: str


class _Writer:
    """The generated function's lines, and where each value name lives now (a local, a constant, nothing)."""

    def __init__(self, runner: Runner, mode: Mode):
        self.runner, self.mode = runner, mode
        self.lines: list[str] = []
        self.index: dict[str, int] = {}
        self.names: list[str] = []
        self.consts: dict[str, Any] = {}
        self.emu: dict[str, str] = {}  # value name -> the expression of its emulated value now
        self.ref: dict[str, str] = {}  # value name -> the expression of its reference value now (reference runs)
        self.loc: dict[str, str] = {}  # value name -> its local run's value (:meth:`.runner.Runner._local`)

    def j(self, name: str) -> int:
        if name not in self.index:
            self.index[name] = len(self.names)
            self.names.append(name)
        return self.index[name]

    def put(self, depth: int, line: str) -> None:
        self.lines.append("    " * depth + line)

    def read(self, name: str, reference: bool) -> str:
        """The expression of value ``name`` (``None`` for an omitted input)."""
        if not name:
            return "None"
        bound = (self.ref if reference else self.emu).get(name)
        if bound is not None:
            return bound
        r = self.runner
        table = r._const_r if reference else r._const_e
        if name in table:  # a constant: a global of the function
            g = f"{'q' if reference else 'c'}{self.j(name)}"
            self.consts[g] = table[name]
            return g
        return f"MISSING[N[{self.j(name)}]]"  # a KeyError, as the interpreter's dict lookup raises

    def refs_of(self, name: str) -> str:
        """The expression of the reference ``name`` is measured against (None: none)."""
        if self.mode.against:
            return f"refs.get(N[{self.j(name)}])"
        if self.mode.reference:
            bound = self.ref.get(name)
            return bound if bound is not None else self.read(name, True) if name in self.runner._const_r else "None"
        return "None"


def generate(runner: Runner, mode: Mode) -> Compiled:
    """The function of ``runner``'s run in ``mode`` (see the module docstring)."""
    prog, w = runner.program, _Writer(runner, mode)
    measuring = mode.reference or mode.against
    w.put(0, "def run(feed, refs, known, meter, errors, kept, on_node, chk, hold, free, M, MS, PR, W, T, LM):")
    w.put(1, "pass")
    for k, name in enumerate(prog.inputs):
        j = w.j(name)
        w.put(1, f"x = feed[{k}]")
        if mode.checked == "full":
            w.put(1, f"hold(N[{j}], x)")
        w.put(1, "if is_float(x):")
        w.put(2, f"v{j} = ROUND(x.detach().to(F32))")
        if mode.reference:
            w.put(2, f"w{j} = x.detach().to(RD)")
        if mode.against:
            w.put(2, f"if N[{j}] in refs:")
            w.put(3, f'meter.add(errors, N[{j}], "input", v{j}, refs[N[{j}]], known.get(N[{j}]))')
        elif mode.reference:
            w.put(2, f'meter.add(errors, N[{j}], "input", v{j}, w{j}, known.get(N[{j}]))')
        w.put(1, "else:")
        w.put(2, f"v{j} = x")
        if mode.reference:
            w.put(2, f"w{j} = x")
        w.emu[name] = f"v{j}"
        if mode.reference:
            w.ref[name] = f"w{j}"
    n = len(prog.steps)
    for i, step in enumerate(prog.steps):
        _step(w, runner, i, step, n, measuring)
    outs = ", ".join(w.read(o, False) for o in prog.outputs)
    refs = ", ".join(w.refs_of(o) for o in prog.outputs)
    w.put(1, f"return [{outs}], [{refs}]" if measuring else f"return [{outs}], []")
    source = "\n".join(w.lines) + "\n"
    rd = runner._ref_dtype  # the code holds no reference to the runner (which holds the code): no cycle to collect
    space: dict[str, Any] = {
        "N": w.names,
        "OP": [s.op for s in prog.steps],
        "SN": [s.name for s in prog.steps],
        "E": [runner.emulator(s) for s in prog.steps],
        "R": [s.run for s in prog.steps],
        "AX": [s.norm.axis if s.norm is not None else None for s in prog.steps],
        "ROUND": runner.profile.round,
        "F32": torch.float32,
        "RD": runner._ref_dtype,
        "MISSING": {},
        "SHORT": _short,
        "is_float": _is_float,
        "TR": lambda e, rd=rd: e.to(rd) if _is_float(e) else e,
        "TRC": lambda e, rd=rd: (e.clone() if e.dtype == rd else e.to(rd)) if _is_float(e) else e,
        **w.consts,
    }
    exec(compile(source, "<bnfold.numerics.compiled>", "exec"), space)  # noqa: S102 - our own text: positions only
    return Compiled(space["run"], source)


class ShortOutputs(Exception):
    """An op returned fewer outputs than its step names: the runner runs the batch again through the interpreter,
    which skips the missing ones, and stops generating code for itself."""


def _short() -> None:
    raise ShortOutputs


def _is_float(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.is_floating_point()


class Measures:
    """What one run measures, as the interpreter does: :meth:`M` a value against its reference, :meth:`MS` a value
    of a ``same`` step (its input's statistics, where they cover it), :meth:`LM` a value against its local run,
    :meth:`PR` a batch norm's probe."""

    def __init__(self, meter: ErrorMeter, errors: dict, known: dict, probes: dict, local: dict):
        self.meter, self.errors, self.known, self.probes, self.local = meter, errors, known, probes, local

    def M(self, name: str, op: str, e: Any, r: Any) -> None:  # noqa: N802 - the generated code's short name
        if _is_float(e) and _is_float(r):
            self.meter.add(self.errors, name, op, e, r, self.known.get(name))

    def MS(self, name: str, op: str, e: Any, r: Any, src: str) -> None:  # noqa: N802
        if _is_float(e) and _is_float(r):
            s = self.errors.get(src)
            if s is not None and s.count == r.numel():
                self.errors[name] = replace(s, node=name, op=op, shape=tuple(r.shape))
            else:
                self.meter.add(self.errors, name, op, e, r, self.known.get(name))

    def LM(self, name: str, op: str, e: Any, lv: Any) -> None:  # noqa: N802
        if _is_float(e) and _is_float(lv):
            self.meter.add(self.local, name, op, e, lv)

    def PR(self, node: str, e: Any, r: Any, axis: int) -> None:  # noqa: N802
        if _is_float(r):
            self.probes[node] = NormProbe.of(node, e, r, axis)


def _outs(w: _Writer, step, call: str, prefix: str, depth: int = 1) -> list[tuple[int, str, str]]:
    """The lines binding ``step``'s named outputs from ``call`` (its op's list of outputs), one line for a step of
    one output; ``[(k, value name, variable)]``."""
    named = [(k, out, f"{prefix}{w.j(out)}") for k, out in enumerate(step.outs) if out]
    if not named:
        w.put(depth, call)
        return named
    w.put(depth, f"o = {call}")
    # an op that returns fewer outputs than the step names: the interpreter skips those, this code runs no further
    w.put(depth, f"if len(o) < {named[-1][0] + 1}: SHORT()")
    w.put(depth, "; ".join(f"{var} = o[{k}]" for k, _, var in named) + "; o = None")
    return named


def _step(w: _Writer, runner: Runner, i: int, step, n: int, measuring: bool) -> None:
    """The lines of step ``i``: as :meth:`.runner.Runner.run`'s loop body, with what is fixed decided here."""
    mode, put = w.mode, w.put
    if mode.on_node:
        put(1, f"on_node({i}, {n})")
    if step.mutates:  # an in-place op: what is held of its inputs is read before they change
        refs = ", ".join(w.read(v, True) for v in step.ins if v) if mode.reference else ""
        put(1, f"W(kept, [{refs}])")
    ins = "[" + ", ".join(w.read(v, False) for v in step.ins) + "]"
    norm = step.norm
    probe = norm is not None and measuring
    if probe:  # the emulated value of the norm's input as the step reads it (before its outputs are bound)
        e_in, r_in = w.read(norm.input, False), w.refs_of(norm.input)
    full = mode.checked == "full"
    check = "chk" if full else "T" if mode.checked == "op" else ""
    named = _outs(w, step, f"E[{i}]({check}({i}, {ins}))" if check else f"E[{i}]({ins})", "v")
    if mode.reference:
        _outs(w, step, f"R[{i}]([{', '.join(w.read(v, True) for v in step.ins)}], RD)", "w")
    if probe:
        put(1, f"PR(SN[{i}], {e_in}, {r_in}, AX[{i}])")
    same = step.rounding == "same" and bool(step.ins) and bool(step.ins[0]) and step.name not in runner._casts
    for k, out, var in named:
        j = w.j(out)
        if full:
            put(1, f"hold(N[{j}], {var})")
        if mode.reference and out in mode.keep:
            put(1, f"kept[N[{j}]] = w{j}")
        w.emu[out] = var
        if mode.reference:
            w.ref[out] = f"w{j}"
        if out in runner.segments:
            _local(w, runner, i, step, k, out, var)
        if measuring and (runner.measured is None or out in runner.measured):
            r = w.refs_of(out)
            if same:
                put(1, f"MS(N[{j}], OP[{i}], {var}, {r}, N[{w.j(step.ins[0])}])")
            else:
                put(1, f"M(N[{j}], OP[{i}], {var}, {r})")
    freed = []
    for dead in runner._free_after.get(i, ()):
        j = w.j(dead)
        if full:
            put(1, f"free(N[{j}])")
        bound = (w.emu.pop(dead, None), w.ref.pop(dead, None), w.loc.pop(dead, None))
        freed += [v for v in bound if v is not None and v[0] in "vwl"]
    if freed:
        put(1, " = ".join(freed) + " = None")


def _local(w: _Writer, runner: Runner, i: int, step, k: int, out: str, var: str) -> None:
    """The line of output ``k`` of step ``i`` (value ``out``, emulated ``var``) from its segment's local values
    (:meth:`.runner.Runner._local`, decided here): in the reference dtype from the segment's own values before it, the
    unrounded constants and, for any other input, the emulated value; the emulated value itself where it is not a
    float (the interpreter keeps no local value then, and its readers read the emulated one)."""
    seg, ins = runner.segments[out], []
    for v in step.ins:
        if not v:
            ins.append("None")
        elif v in w.loc and runner.segments.get(v) == seg:
            ins.append(w.loc[v])
        elif v in runner._const_r:
            g = f"q{w.j(v)}"
            w.consts[g] = runner._const_r[v]
            ins.append(g)
        else:  # a copy where the op would write the emulated value itself
            ins.append(f"{'TRC' if step.mutates else 'TR'}({w.read(v, False)})")
    j = w.j(out)
    w.put(1, f"l{j} = R[{i}]([{', '.join(ins)}], RD)[{k}] if is_float({var}) else {var}")
    w.loc[out] = f"l{j}"
    if runner.local_measured is None or out in runner.local_measured:
        w.put(1, f"LM(N[{j}], OP[{i}], {var}, l{j})")
