"""A torch program for the lockstep runner (:mod:`.runner`): its nodes as steps, its lifted tensors as constants.

Each ``call_function`` node is a step writing one value under its node name (a tuple for an op that
returns several; ``getitem`` nodes pick from it).  The placeholders are fed from the program's
state_dict / constants by its graph signature.  Floating dtypes named inside the graph (``_to_copy``,
``full``, ...) become the run's float dtype (float32 emulated, the reference's dtype); Python scalars (op
attributes such as ``eps`` or a ``mul.Scalar`` factor) are used as they are.  What an op is to the
numerics (exact, layer kind, fp16 class) is read from the frontend's op table
(``bnfold.torch_export.ops.OPS``); layers and batch norms are parsed by the frontend.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch
from torch.export.graph_signature import OutputKind
from torch.fx.node import map_arg
from torch.utils._pytree import tree_flatten, tree_map

from ..errors import TrainingModeError
from ..io.cost import Plan
from ..torch_export.fold import training_norms
from ..torch_export.ops import module_path, op_name, op_of
from . import accumulate
from .audit_memory import fx_audit_plan
from .batches import RANDOM_BATCHES, as_batches
from .fx_nodes import layer_kind, lifted_tensors, reads_layers, reads_norms, running_stats_norm
from .profiles import Profile
from .runner import DEFAULT_ROUNDING, BatchResult, EmulationResult, Program, Runner, Step, StepNorm

__all__ = ["BatchResult", "EmulationResult", "Emulator", "emulate", "fx_program"]


def _map_dtype(args: Any, dtype: torch.dtype) -> Any:
    return tree_map(lambda a: dtype if isinstance(a, torch.dtype) and a.is_floating_point else a, args)


def _by_name(node: torch.fx.Node, args: tuple, kwargs: dict) -> dict:
    names, defaults = _schema_of(node.target)
    out = {name: list(v) if isinstance(v, list) else v for name, v in defaults}  # a default list: the call's own
    out.update(zip(names, args))
    out.update(kwargs)
    return out


#: op target -> its schema's argument names and ``(name, default)`` pairs (reading a schema is slow)
_SCHEMAS: dict[Any, tuple[list[str], list[tuple[str, Any]]]] = {}


def _schema_of(target: Any) -> tuple[list[str], list[tuple[str, Any]]]:
    """``target``'s argument names and the defaults of those that have one, read once per target."""
    try:
        return _SCHEMAS[target]
    except (KeyError, TypeError):
        pass
    arguments = target._schema.arguments
    got = [a.name for a in arguments], [(a.name, a.default_value) for a in arguments if a.has_default_value()]
    try:
        _SCHEMAS[target] = got
    except TypeError:  # an unhashable target
        pass
    return got


def _with_arg(node: torch.fx.Node, call: tuple[tuple, dict], name: str, value: Any) -> tuple[tuple, dict]:
    """``call`` (``(args, kwargs)``) with the argument called ``name`` in ``node``'s schema set to ``value``."""
    args, kwargs = call
    i = _schema_of(node.target)[0].index(name)
    if i < len(args):
        return args[:i] + (value,) + args[i + 1 :], kwargs
    return args, dict(kwargs, **{name: value})


class _Call:
    """``node``'s op called on the values of its ``inputs`` (one per node in ``inputs``) in a float dtype: the
    step's ``run`` (see :class:`~.runner.Step`).  One object per step, not closures: a program has hundreds."""

    __slots__ = ("node", "target", "inputs", "args", "kwargs", "has_dtype")

    def __init__(self, node: torch.fx.Node, inputs: list[torch.fx.Node]):
        self.node, self.target, self.inputs = node, node.target, inputs
        self.args, self.kwargs = node.args, node.kwargs
        # a dtype among the arguments (aten: at the top level; the type has no subclasses)
        self.has_dtype = torch.dtype in map(type, node.args) or torch.dtype in map(type, node.kwargs.values())

    def arguments(self, ins: list, dtype: torch.dtype, eps=None, weight=None, bias=None) -> tuple[tuple, dict]:
        """The call's ``(args, kwargs)`` on ``ins`` in ``dtype``, ``eps`` / ``weight`` / ``bias`` replacing the
        node's where given."""
        args, kwargs = map_arg((self.args, self.kwargs), dict(zip(self.inputs, ins)).__getitem__)  # inputs: values
        c = (args, dict(kwargs))
        if self.has_dtype:
            c = _map_dtype(c, dtype)
        for name, value in (("eps", eps), ("weight", weight), ("bias", bias)):
            if value is not None:
                c = _with_arg(self.node, c, name, value)
        return c

    def __call__(self, ins: list, dtype: torch.dtype, eps=None, weight=None, bias=None) -> list:
        args, kwargs = self.arguments(ins, dtype, eps, weight, bias)
        return [self.target(*args, **kwargs)]


class _LayerCall(_Call):
    """A layer's :class:`_Call`, which also runs with fp16 accumulation (the step's ``accumulated``)."""

    __slots__ = ("kind", "name")

    def __init__(self, node: torch.fx.Node, inputs: list[torch.fx.Node], kind: str, name: str):
        super().__init__(node, inputs)
        self.kind, self.name = kind, name

    def accumulated(self, ins: list, chunk: int) -> torch.Tensor:
        kw = _by_name(self.node, *self.arguments(ins, torch.float32))
        if self.kind in ("linear", "matmul"):
            return accumulate.linear(self.name, kw, chunk)
        return accumulate.conv(self.target, kw, chunk, self.kind == "conv_transpose")


class _ReduceCall(_Call):
    """A sum, mean or average pool's :class:`_Call`, which also runs with fp16 accumulation (``Op.accumulate``)."""

    __slots__ = ("kind",)

    def __init__(self, node: torch.fx.Node, inputs: list[torch.fx.Node], kind: str):
        super().__init__(node, inputs)
        self.kind = kind

    def accumulated(self, ins: list, chunk: int) -> torch.Tensor:
        args = self.arguments(ins, torch.float32)
        kw = _by_name(self.node, *args)
        x = kw.get("self", kw.get("input"))
        if self.kind == "pool":
            window = kw.get("divisor_override") or math.prod(kw["kernel_size"])
            return accumulate.pool(self(ins, torch.float32)[0], int(window))
        if "output_size" in kw:  # an adaptive average pool: a mean over its spatial axes when it pools to one
            size = list(kw["output_size"])
            if any(int(d) != 1 for d in size):
                return self(ins, torch.float32)[0]
            return accumulate.reduction(x, range(-len(size), 0), True, True, chunk)
        return accumulate.reduction(x, kw.get("dim"), bool(kw.get("keepdim", False)), self.kind == "mean", chunk)


def _named(node: torch.fx.Node, name: str) -> Any:
    """The argument ``name`` of ``node``'s call as given (by keyword, else by position), else None."""
    if name in node.kwargs:
        return node.kwargs[name]
    names = _schema_of(node.target)[0]
    i = names.index(name) if name in names else len(node.args)
    return node.args[i] if i < len(node.args) else None


class _Target(NamedTuple):
    """What the steps of one op target share, read once per target of a program: the step's op name and facts
    (from the op table's row; an op without one keeps :class:`~.runner.Step`'s defaults), and whether its nodes
    may be layers and batch norms (``layer_kind`` / ``running_stats_norm`` are None for every node of another
    target)."""

    name: str
    facts: dict[str, Any]
    layers: bool
    norms: bool
    accumulate: str = ""  # the op table's ``accumulate``: a reduction summed in fp16 under ``fp16-acc``

    @classmethod
    def of(cls, node: torch.fx.Node) -> _Target:
        target, name = node.target, op_name(node.target)
        if name.endswith("_copy") and name != "_to_copy":  # edge dialect view_copy etc. behave like view
            name = name[: -len("_copy")]
        facts = {"mutates": bool(getattr(getattr(target, "_schema", None), "is_mutable", False))}
        row = op_of(node)
        if row is not None:
            facts.update(rounding=row.rounding or DEFAULT_ROUNDING, fp16_class=row.fp16, shape=row.shape)
        return cls(name, facts, reads_layers(target), reads_norms(target), row.accumulate if row is not None else "")


def _step(node: torch.fx.Node, op: _Target) -> Step:
    """``node`` as a step of the runner (``op``: what it shares with the other nodes of its target)."""
    inputs = node.all_input_nodes
    kind = layer_kind(node) if op.layers else None
    if kind is not None:
        run = _LayerCall(node, inputs, kind, op.name)
    else:
        run = _ReduceCall(node, inputs, op.accumulate) if op.accumulate else _Call(node, inputs)
    step = Step(node.name, op.name, [i.name for i in inputs], [node.name], run, label=module_path(node), **op.facts)
    if op.accumulate and kind is None:
        step.accumulated = run.accumulated
    if kind is not None:
        w, b = _named(node, "weight"), _named(node, "bias")
        step.layer, step.accumulated = kind, run.accumulated
        step.weight = w.name if isinstance(w, torch.fx.Node) else None
        step.bias = b.name if isinstance(b, torch.fx.Node) else None
    bn = running_stats_norm(node) if op.norms else None
    if bn is not None:
        params = tuple(p.name if isinstance(p, torch.fx.Node) else None for p in (bn.weight, bn.bias, bn.mean, bn.var))
        returns = len(node.target._schema.returns)
        output = bn.output.name if bn.output is not None else None
        step.norm = StepNorm(bn.input.name, params, bn.eps, bn.axis, returns, output)
    return step


def fx_program(ep: torch.export.ExportedProgram, like: Program | None = None) -> Program:
    """``ep`` as the runner's :class:`~.runner.Program` (``like``, the program of the model this one was folded from,
    is not needed: a folded program holds the tensors the fold left as they were)."""
    lifted, user = lifted_tensors(ep)
    nodes = ep.graph_module.graph.nodes
    for node in nodes:
        if node.op not in ("placeholder", "call_function", "output"):
            raise NotImplementedError(f"node {node.name} ({node.op}) is not supported by the emulator")
    kinds = [spec.kind for spec in ep.graph_signature.output_specs]
    out_node = next(n for n in nodes if n.op == "output")
    outs = [o for o, k in zip(out_node.args[0], kinds) if k == OutputKind.USER_OUTPUT]
    shapes = {}  # static input shapes (None for a dynamic dim): a batch of another shape would fail mid-graph
    steps = []
    targets: dict[Any, _Target] = {}  # what the nodes of each op target share, read at its first node
    for node in nodes:
        if node.op == "call_function":
            try:
                op = targets.get(node.target)
                if op is None:
                    op = targets[node.target] = _Target.of(node)
            except TypeError:  # an unhashable target: read at each node
                op = _Target.of(node)
            steps.append(_step(node, op))
        elif node.op == "placeholder":
            val = node.meta.get("val")
            if node.name in user and isinstance(val, torch.Tensor):
                shapes[node.name] = [d if isinstance(d, int) else None for d in val.shape]
    # floats as stored (the runner casts them once); a parameter detached, so that no op records its gradient; a
    # constant an op may write in place (through a view of it too, ``B.t().mul_(x)``, which no graph signature lists
    # as a mutation) held as the program's own copy: the caller's program keeps its tensors; so are its batches
    written = _writes_constants(nodes, [*lifted, *user])
    writes = frozenset(written & lifted.keys())
    own = {i for i, name in enumerate(user) if name in written}  # inputs a step may write: fed as copies
    consts = {k: v.detach().clone() if k in writes else v.detach() if v.requires_grad else v for k, v in lifted.items()}

    def feed(xs: tuple) -> list:
        flat = tree_flatten(xs)[0]
        if len(flat) != len(user):
            raise ValueError(f"the program takes {len(user)} input(s), got {len(flat)}")
        for name, value in zip(user, flat):
            want = shapes.get(name)
            if want is None or not isinstance(value, torch.Tensor):
                continue
            got = list(value.shape)
            if len(got) != len(want) or any(w is not None and w != g for w, g in zip(want, got)):
                shown = ["*" if w is None else w for w in want]
                raise ValueError(
                    f"input {name!r} has shape {got} but the program was exported for {shown}; "
                    "export with a dynamic batch dimension (torch.export.Dim) to run other batch sizes"
                )
        return [x.clone() if i in own and isinstance(x, torch.Tensor) else x for i, x in enumerate(flat)]

    return Program(steps, consts, user, [o.name for o in outs], feed, writes=writes)


def _writes_constants(nodes: Any, constants: Any) -> frozenset[str]:
    """The placeholders (``constants``: their names; a program's lifted tensors, and its inputs, which the caller's
    batches fill) that an op of the program may write in place: an argument its schema marks written
    (``Tensor(a!)``) that is one of them or may alias one.  What may alias one: an
    op's output that its schema gives an alias set (a view, ``t(Tensor(a) self) -> Tensor(a)``) aliases the
    arguments of that set; an output with none is new memory only where the op is of the core ATen opset
    (``torch.Tag.core``) or a layer or normalization of the op table (``aten.linear``, ``aten.batch_norm``), else
    it may alias every tensor the op reads (views no schema states: ``_unsafe_view``, ``unsafe_split``; ``getitem``,
    no schema); what an op writes may share every tensor it reads unless the op is pointwise (``set_`` makes
    ``self`` share its source; ``mul_`` writes values).  An in-place op on a value the graph computed (``relu_``
    after a conv) writes no constant."""
    may: dict[str, frozenset] = {c: frozenset([c]) for c in constants}
    written: set[str] = set()

    def roots(value: Any) -> frozenset:
        found: list = []
        map_arg(value, lambda n: found.append(may.get(n.name, frozenset())))
        return frozenset().union(*found)

    for node in nodes:
        if node.op != "call_function" or not any(i.name in may for i in node.all_input_nodes):
            continue
        reads = roots((node.args, node.kwargs))
        schema = getattr(node.target, "_schema", None)
        if schema is None:
            may[node.name] = reads
            continue
        args = [
            (arg, node.args[i] if i < len(node.args) and not arg.kwarg_only else node.kwargs.get(arg.name))
            for i, arg in enumerate(schema.arguments)
        ]
        if any(r.alias_info is not None for r in schema.returns):
            may[node.name] = frozenset().union(*(roots(v) for a, v in args if a.alias_info is not None))
        elif not _new_memory(node):
            may[node.name] = reads
        shares = torch.Tag.pointwise not in getattr(node.target, "tags", ())
        for arg, value in args:
            if arg.alias_info is None or not arg.alias_info.is_write:
                continue
            written |= roots(value)
            if shares:  # what it writes (and returns: itself) may now share what it read
                found: list = [node]
                map_arg(value, found.append)
                for n in found:
                    may[n.name] = may.get(n.name, frozenset()) | reads
    return frozenset(written)


def _new_memory(node: torch.fx.Node) -> bool:
    """Whether the outputs of ``node`` (whose schema gives them no alias set) are known to be new memory."""
    if torch.Tag.core in getattr(node.target, "tags", ()):
        return True
    row = op_of(node)
    return row is not None and row.role in ("layer", "norm")


def _export(module: torch.nn.Module, batches: list[tuple]) -> torch.export.ExportedProgram:
    """Export ``module`` in eval mode; the batch dimension is dynamic when batch sizes differ."""
    sizes = {b[0].shape[0] for b in batches if b and isinstance(b[0], torch.Tensor)}
    dynamic = None
    if len(sizes) > 1:
        dim = torch.export.Dim("batch")
        dynamic = tuple({0: dim} if isinstance(a, torch.Tensor) else None for a in batches[0])
    was_training = module.training
    module.eval()
    try:
        return torch.export.export(module, batches[0], dynamic_shapes=dynamic)
    finally:
        module.train(was_training)


class ProgramAudit:
    """The audit hooks of a torch program (:class:`~.runner.AuditFormat`)."""

    cannot_run: tuple[type[Exception], ...] = ()  # a program's errors come as they are

    def prepare(
        self, model, inputs, *, input_shapes=None, name=None, random_inputs=False, runtime=None, fold=True, hold=None
    ):
        """Random batches shaped like the program's example inputs when ``inputs`` is None (flagged as such);
        a program in training mode is a :class:`~bnfold.errors.TrainingModeError`."""
        if runtime is not None:
            raise ValueError("runtime= is available for ONNX models (the torch-half run is the fp16 profile itself)")
        if inputs is None:
            inputs, random_inputs = self._random(model, input_shapes), True
        batches = as_batches(inputs)
        model, name = self._exported(model, batches, name)
        training = training_norms(model)
        if training:  # its numbers would change from run to run
            raise TrainingModeError.naming(name or "the program", training)
        plan = self.plan(model, batches, runs=3 if fold else 2, name=name, hold=hold)
        return model, batches, name, random_inputs, plan

    def _random(self, model, input_shapes: dict | None = None) -> list[tuple]:
        from ..io.batches import random_batches

        return random_batches(model, RANDOM_BATCHES, shapes=input_shapes)

    def _exported(self, model, batches: list[tuple], name: str | None) -> tuple[torch.export.ExportedProgram, Any]:
        """The program to audit and its name."""
        return model, name

    def plan(self, model, batches: list[tuple], *, runs: int, name: str | None, hold=None) -> Plan:
        return fx_audit_plan(model, batches, runs=runs, name=name, hold=hold)

    def program(self, model, like: Program | None = None, lazy: bool = False) -> Program:
        return fx_program(model, like)  # a program's constants are in memory: none is lazy

    def output_rank(self, model) -> int | None:
        """The rank of a program's first output, from its metadata."""
        out = next((n for n in model.graph.nodes if n.op == "output"), None)
        vals = out.args[0] if out is not None and out.args else ()
        first = vals[0] if isinstance(vals, (tuple, list)) and vals else None
        val = getattr(first, "meta", {}).get("val") if first is not None else None
        return val.dim() if isinstance(val, torch.Tensor) else None


class ModuleAudit(ProgramAudit):
    """The audit hooks of an ``nn.Module``: exported in eval mode on the first batch, then audited as a program."""

    def _exported(self, model, batches: list[tuple], name: str | None) -> tuple[torch.export.ExportedProgram, Any]:
        return _export(model, batches), name or type(model).__name__

    def _random(self, model, input_shapes: dict | None = None) -> list[tuple]:
        raise TypeError("audit(module, inputs): an nn.Module needs input batches (a program carries examples)")

    def output_rank(self, model) -> int | None:
        return None  # a module states none


PROGRAM_AUDIT = ProgramAudit()
MODULE_AUDIT = ModuleAudit()


class Emulator(Runner):
    """Runs the torch program ``ep`` under ``profile`` (see :class:`~.runner.Runner`); segments and errors
    are keyed by node name."""

    def __init__(self, ep: torch.export.ExportedProgram, profile: str | Profile = "fp16", bn_eps=None, segments=None):
        self.ep = ep
        super().__init__(fx_program(ep), profile, bn_eps, segments)

    @property
    def user_inputs(self) -> list[str]:
        return self.program.inputs


def emulate(
    ep: torch.export.ExportedProgram,
    inputs: Sequence[tuple],
    profile: str | Profile = "fp16",
    bn_eps: float | None = None,
    progress: Callable[[int, int], None] | None = None,
    keep_outputs: bool = True,
) -> EmulationResult:
    """Run every batch in ``inputs`` (a list of argument tuples) under ``profile``."""
    emu = Emulator(ep, profile, bn_eps)
    result = EmulationResult(emu.profile.name)
    for i, batch in enumerate(inputs):
        result.add(emu.run(*batch), keep_outputs)
        if progress is not None:
            progress(i + 1, len(inputs))
    return result
