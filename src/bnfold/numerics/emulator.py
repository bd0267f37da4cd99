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

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.export.graph_signature import OutputKind
from torch.fx.node import map_arg
from torch.utils._pytree import tree_flatten, tree_map

from ..torch_export.ops import module_path, op_name, op_of
from . import accumulate
from .batches import as_batches
from .graph import layer_kind, lifted_tensors, running_stats_norm
from .profiles import Profile
from .runner import AuditFormat, BatchResult, EmulationResult, Program, Runner, Step, StepNorm

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


def _step(node: torch.fx.Node) -> Step:
    """``node`` as a step of the runner."""
    inputs = node.all_input_nodes
    has_dtype = any(isinstance(a, torch.dtype) for a in (*node.args, *node.kwargs.values()))  # aten: top level
    target, name = node.target, op_name(node.target)
    if name.endswith("_copy") and name != "_to_copy":  # edge dialect view_copy etc. behave like view
        name = name[: -len("_copy")]

    index = {n: i for i, n in enumerate(inputs)}

    def slot(a: Any) -> tuple[int, Any]:
        """An argument as a template slot, read once: an input's index, a constant, or (-2) a nest of both."""
        if isinstance(a, torch.fx.Node):
            return index[a], None
        nested = []
        torch.fx.node.map_aggregate(a, lambda v: nested.append(v) if isinstance(v, torch.fx.Node) else None)
        return (-2, a) if nested else (-1, a)

    arg_slots = [slot(a) for a in node.args]
    kw_slots = {k: slot(a) for k, a in node.kwargs.items()}

    def fill(ins: list, i: int, a: Any) -> Any:
        if i >= 0:
            return ins[i]
        if i == -1:
            return a
        env = dict(zip(inputs, ins))
        return map_arg(a, env.__getitem__)

    def call(ins: list, dtype: torch.dtype, eps=None, weight=None, bias=None) -> tuple:
        c = (tuple(fill(ins, i, a) for i, a in arg_slots), {k: fill(ins, i, a) for k, (i, a) in kw_slots.items()})
        if has_dtype:
            c = _map_dtype(c, dtype)
        for arg, value in (("eps", eps), ("weight", weight), ("bias", bias)):
            if value is not None:
                c = _with_arg(node, c, arg, value)
        return c

    def run(ins: list, dtype: torch.dtype, **over) -> list:
        args, kwargs = call(ins, dtype, **over)
        return [target(*args, **kwargs)]

    row, kind = op_of(node), layer_kind(node)
    step = Step(node.name, name, [i.name for i in inputs], [node.name], run, label=module_path(node))
    step.mutates = bool(getattr(getattr(target, "_schema", None), "is_mutable", False))
    if row is not None:
        step.rounding, step.fp16_class = row.rounding or "round", row.fp16
    if kind is not None:
        layer = _by_name(node, node.args, node.kwargs)
        w, b = layer.get("weight"), layer.get("bias")
        step.layer = kind
        step.weight = w.name if isinstance(w, torch.fx.Node) else None
        step.bias = b.name if isinstance(b, torch.fx.Node) else None

        def accumulated(ins: list, chunk: int) -> torch.Tensor:
            kw = _by_name(node, *call(ins, torch.float32))
            if kind in ("linear", "matmul"):
                return accumulate.linear(name, kw, chunk)
            return accumulate.conv(target, kw, chunk, kind == "conv_transpose")

        step.accumulated = accumulated
    bn = running_stats_norm(node)
    if bn is not None:
        params = tuple(p.name if isinstance(p, torch.fx.Node) else None for p in (bn.weight, bn.bias, bn.mean, bn.var))
        returns = len(target._schema.returns)
        output = bn.output.name if bn.output is not None else None
        step.norm = StepNorm(bn.input.name, params, bn.eps, bn.axis, returns, output)
    return step


def fx_program(ep: torch.export.ExportedProgram) -> Program:
    """``ep`` as the runner's :class:`~.runner.Program`."""
    lifted, user = lifted_tensors(ep)
    nodes = list(ep.graph_module.graph.nodes)
    for node in nodes:
        if node.op not in ("placeholder", "call_function", "output"):
            raise NotImplementedError(f"node {node.name} ({node.op}) is not supported by the emulator")
    # floats as stored (the runner casts them once); a parameter detached, so that no op records its gradient
    consts = {k: v.detach() if v.requires_grad else v for k, v in lifted.items()}
    kinds = [spec.kind for spec in ep.graph_signature.output_specs]
    out_node = next(n for n in nodes if n.op == "output")
    outs = [o for o, k in zip(out_node.args[0], kinds) if k == OutputKind.USER_OUTPUT]
    shapes = {}  # static input shapes (None for a dynamic dim): a batch of another shape would fail mid-graph
    for node in nodes:
        val = node.meta.get("val") if node.op == "placeholder" else None
        if node.name in user and isinstance(val, torch.Tensor):
            shapes[node.name] = [d if isinstance(d, int) else None for d in val.shape]

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
        return flat

    steps = [_step(n) for n in nodes if n.op == "call_function"]
    return Program(steps, consts, user, [o.name for o in outs], feed)


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


def _prepare(model, inputs, *, input_shapes=None, name=None, random_inputs=False, runtime=None, fold=True):
    """The audit's checks of a torch program or module and its batches (see ``AuditFormat``)."""
    if inputs is None:
        raise ValueError("audit needs input batches for a torch program or module")
    if runtime is not None:
        raise ValueError("runtime= is available for ONNX models (the torch-half run is the fp16 profile itself)")
    batches = as_batches(inputs)
    if isinstance(model, torch.nn.Module):
        name = name or type(model).__name__
        model = _export(model, batches)
    from ..checks import training_norms

    training = training_norms(model)
    if training:
        raise ValueError(
            f"the program has batch norms in training mode ({', '.join(training[:3])}"
            f"{', ...' if len(training) > 3 else ''}); call model.eval() before torch.export"
        )
    from ..io.cost import audit_plan  # the cost check before anything runs (see bnfold.io.cost)

    audit_plan(model, batches, runs=3 if fold else 2, name=name)
    return model, batches, name, random_inputs


def _output_rank(model) -> int | None:
    """The rank of a program's first output, from its metadata (a module states none: None)."""
    if not isinstance(model, torch.export.ExportedProgram):
        return None
    out = next((n for n in model.graph.nodes if n.op == "output"), None)
    vals = out.args[0] if out is not None and out.args else ()
    first = vals[0] if isinstance(vals, (tuple, list)) and vals else None
    val = getattr(first, "meta", {}).get("val") if first is not None else None
    return val.dim() if isinstance(val, torch.Tensor) else None


FX_AUDIT = AuditFormat(_prepare, fx_program, _output_rank)


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
