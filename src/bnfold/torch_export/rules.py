"""The fold rules for torch.export programs: pattern -> check -> rewrite.

* ``fold_after``: conv / transposed conv / linear, then an affine chain
  (batch norms, mul/div/add/sub by per-channel constants, shape-only hops).
* ``fold_before``: an affine chain (batch norms, mul/add...) whose only user
  is a conv / linear, folded into the consumer's input-channel side.

A check that fails raises ``Stop``; the driver turns it into a report entry.
All arithmetic is in ``bnfold.fold_math``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch.fx import Node

from .. import fold_math
from ..fold_math import Affine, FoldError
from ..report import Folded
from .chain import Step, Stop, affine_step, next_step, norm_step, shape_of
from .ops import AFFINE_OPS, Norm, Producer, addmm_like, node_key, parse_norm
from .program import ProgramEditor


@dataclass
class Outcome:
    folded: list[Folded] = field(default_factory=list)
    reasons: dict[str, str] = field(default_factory=dict)  # norm node name -> why it did not fold


def op_name(node: Node) -> str:
    return node_key(node).split("::")[-1].split(".")[0]


def norm_label(editor: ProgramEditor, node: Node, norm: Norm | None = None) -> str:
    """A normalization's readable name: its module path when it has one."""
    if norm is not None and isinstance(norm.mean, Node):
        target = editor.target(norm.mean)
        if target.endswith(".running_mean"):
            return target[: -len(".running_mean")]
    stack = node.meta.get("nn_module_stack")
    if stack:
        path = list(stack.values())[-1][0]
        if path:
            return path
    return node.name


def check_producer(editor: ProgramEditor, p: Producer, only) -> None:
    if only is not None and p.kind not in only:
        raise Stop(p.node, f"folding into {p.kind} layers was not requested (only={','.join(sorted(only))})")
    if editor.tensor(p.weight) is None:
        raise Stop(p.node, f"the {op_name(p.node)} weight is not a constant of the program "
                           f"(it comes from {editor.describe(p.weight)})")
    if p.bias is not None and editor.tensor(p.bias) is None:
        raise Stop(p.node, f"the {op_name(p.node)} bias is not a constant of the program "
                           f"(it comes from {editor.describe(p.bias)})")
    if editor.tensor(p.weight).dim() < 2:
        raise Stop(p.node, f"the {op_name(p.node)} weight has rank {editor.tensor(p.weight).dim()}")


def output_axis(p: Producer) -> int | None:
    if p.channel_axis >= 0:
        return p.channel_axis
    shape = shape_of(p.node)
    return None if shape is None else len(shape) + p.channel_axis


# ------------------------------------------------------------------ after the producer


def fold_after(editor: ProgramEditor, p: Producer, only) -> Outcome:
    out = Outcome()
    axis = output_axis(p)
    if axis is None:
        return out
    try:
        check_producer(editor, p, only)
    except Stop as stop:
        for user in p.node.users:
            if parse_norm(user) is not None:
                out.reasons[user.name] = stop.reason
        return out
    w = editor.tensor(p.weight)
    channels = fold_math.out_channels(p.kind, tuple(w.shape), p.groups)
    steps: list[Step] = []
    x = p.node
    while True:
        try:
            found = next_step(editor, x, axis, channels)
        except Stop as stop:
            if parse_norm(stop.node) is not None:
                out.reasons[stop.node.name] = stop.reason
            break
        if found is None:
            break
        step, axis = found
        steps.append(step)
        x = step.out
    while steps and steps[-1].affine is None:  # trailing hops stay as they are
        steps.pop()
    while steps:
        total = _compose(steps)
        try:
            new_w, new_b = fold_math.fold_output_affine(w, editor.tensor(p.bias), total, p.kind, p.groups)
            new_w, new_b = _cast(editor, p, new_w, new_b)
        except FoldError as err:  # drop the last affine step and try the shorter chain
            last = steps.pop()
            if last.norm is not None:
                out.reasons[last.node.name] = str(err)
            while steps and steps[-1].affine is None:
                steps.pop()
            continue
        extra = _write(editor, p, new_w, new_b, label=_label(editor, steps))
        out.folded = _entries(editor, p, steps, "output", extra)
        _remove_steps(editor, steps)
        break
    return out


# ------------------------------------------------------------------ before the consumer


def fold_before(editor: ProgramEditor, p: Producer, only) -> Outcome:
    out = Outcome()
    axis = output_axis(p)  # conv: channels on dim 1 of the input too; linear: last dim
    in_shape = shape_of(p.input)
    if axis is None or in_shape is None:
        return out
    axis = axis if p.channel_axis >= 0 else len(in_shape) - 1
    steps: list[Step] = []
    x = p.input
    try:
        check_producer(editor, p, only)
        w = editor.tensor(p.weight)
        channels = fold_math.in_channels(p.kind, tuple(w.shape), p.groups)
        while isinstance(x, Node) and len(x.users) == 1:
            step = _step_ending_at(editor, x, axis, channels)
            if step is None:
                break
            steps.insert(0, step)
            x = step.input
    except Stop as stop:
        if parse_norm(stop.node) is not None:
            out.reasons[stop.node.name] = stop.reason
    if not steps:
        return out
    while steps:
        try:
            new_w, new_b = fold_math.fold_input_affine(
                w, editor.tensor(p.bias), _compose(steps), p.kind, p.groups, shift_exact=p.zero_padding)
            if p.bias is None and not bool((new_b != 0).any()):
                new_b = None
            new_w, new_b = _cast(editor, p, new_w, new_b)
        except FoldError as err:  # drop the step farthest from the consumer and retry
            first = steps.pop(0)
            if first.norm is not None:
                out.reasons[first.node.name] = f"before {op_name(p.node)} '{p.name}': {err}"
            continue
        extra = _write(editor, p, new_w, new_b, label=_label(editor, steps))
        out.folded = _entries(editor, p, steps, "input", extra)
        _remove_steps(editor, steps)
        break
    return out


def _step_ending_at(editor: ProgramEditor, value: Node, axis: int, channels: int) -> Step | None:
    """The affine step whose result is ``value``, if any."""
    if node_key(value) == "getitem":
        norm = parse_norm(value.args[0])
        if norm is None or norm.output is not value:
            return None
        return norm_step(editor, norm, axis, channels)
    norm = parse_norm(value)
    if norm is not None:
        return norm_step(editor, norm, axis, channels)
    if node_key(value) in AFFINE_OPS:
        x = next((a for a in value.args[:2] if isinstance(a, Node) and editor.constant_value(a) is None), None)
        if x is None:
            return None
        try:
            return affine_step(editor, value, x, axis, channels)
        except Stop:
            return None
    return None


# ------------------------------------------------------------------ rewriting


def _compose(steps: list[Step]) -> Affine:
    affines = [s.affine for s in steps if s.affine is not None]
    total = affines[0]
    for a in affines[1:]:
        total = total.then(a)
    return total


def _cast(editor: ProgramEditor, p: Producer, new_w, new_b):
    w = editor.tensor(p.weight)
    new_w = fold_math.cast_checked(new_w, w.dtype, f"{op_name(p.node)} weight")
    if new_b is not None:
        b = editor.tensor(p.bias)
        new_b = fold_math.cast_checked(new_b, (b if b is not None else w).dtype, f"{op_name(p.node)} bias")
    return new_w, new_b


def _label(editor: ProgramEditor, steps: list[Step]) -> str:
    first = next(s for s in steps if s.affine is not None)
    return norm_label(editor, first.node, first.norm).replace(".", "_")


def _derived_target(target: str, role: str, label: str | None) -> str:
    """``conv.weight`` -> ``conv.bias`` / ``conv.weight_folded_bn1``; other names get a suffix."""
    module, _, leaf = target.rpartition(".")
    base = (module + "." if module else "") if leaf in ("weight", "bias") else target + "_"
    name = base + role
    return f"{name}_folded_{label}" if label else name


def _write(editor: ProgramEditor, p: Producer, new_w, new_b, label: str) -> int:
    """Store the folded weight/bias for ``p``; returns bytes added by private copies."""
    extra = 0
    weight_target = editor.target(p.weight)
    weight_holder = p.weight_view if p.weight_view is not None else p.weight
    if editor.is_shared(p.weight) or (p.weight_view is not None and len(p.weight_view.users) > 1):
        new_node = editor.add_tensor(p.weight, _derived_target(weight_target, "weight", label), new_w)
        extra += new_w.numel() * new_w.element_size()
        if p.weight_view is not None:
            with editor.graph.inserting_before(p.node):
                view = editor.graph.call_function(p.weight_view.target, (new_node, *p.weight_view.args[1:]),
                                                  dict(p.weight_view.kwargs))
            view.meta = dict(p.weight_view.meta)
        p.node.replace_input_with(weight_holder, view if p.weight_view is not None else new_node)
        if p.weight_view is not None and not p.weight_view.users:
            editor.graph.erase_node(p.weight_view)
        if not p.weight.users:  # the last user of a shared weight: the copy replaces it
            extra -= editor.tensor(p.weight).numel() * editor.tensor(p.weight).element_size()
            editor.drop_if_unused(p.weight)
    else:
        editor.replace_tensor(p.weight, new_w)
    if new_b is None:
        return extra
    if p.bias is not None and not editor.is_shared(p.bias):
        editor.replace_tensor(p.bias, new_b)
        return extra
    if p.bias is not None:
        bias_node = editor.add_tensor(p.bias, _derived_target(editor.target(p.bias), "bias", label), new_b)
        extra += new_b.numel() * new_b.element_size()
        p.node.replace_input_with(p.bias, bias_node)
        if not p.bias.users:
            extra -= editor.tensor(p.bias).numel() * editor.tensor(p.bias).element_size()
            editor.drop_if_unused(p.bias)
        return extra
    shared = editor.is_shared(p.weight)
    bias_node = editor.add_tensor(p.weight, _derived_target(weight_target, "bias", label if shared else None), new_b)
    if shared:
        extra += new_b.numel() * new_b.element_size()
    _set_bias(editor, p, bias_node)
    return extra


def _set_bias(editor: ProgramEditor, p: Producer, bias: Node) -> None:
    node = p.node
    if p.bias_slot is None:  # mm(x, w.T) becomes addmm(bias, x, w.T), keeping the node
        node.target = addmm_like(node.target)
        node.args = (bias, *node.args)
        return
    if "bias" in node.kwargs:
        node.kwargs = {**node.kwargs, "bias": bias}
        return
    args = list(node.args)
    while len(args) <= p.bias_slot:
        args.append(None)
    args[p.bias_slot] = bias
    node.args = tuple(args)


def _remove_steps(editor: ProgramEditor, steps: list[Step]) -> None:
    operands, replaced = [], {}
    for step in steps:
        if step.affine is None:
            continue
        source = step.input
        while source in replaced:  # the step read the output of a step already removed
            source = replaced[source]
        replaced[step.out] = source
        step.out.replace_all_uses_with(source)
        if step.norm is not None:
            for user in list(step.node.users):
                editor.graph.erase_node(user)
            operands.extend(step.operands)
            mean = step.norm.mean
            if isinstance(mean, Node) and editor.target(mean).endswith(".running_mean"):
                tracked = editor.placeholder_for_target(editor.target(mean)[: -len("running_mean")] + "num_batches_tracked")
                if tracked is not None:
                    operands.append(tracked)
        else:
            operands.extend(step.operands)
        editor.graph.erase_node(step.node)
    for node in operands:
        editor.erase_dead(node)


def _entries(editor: ProgramEditor, p: Producer, steps: list[Step], side: str, extra: int) -> list[Folded]:
    names = [s.name for s in steps]
    pattern = "+".join([op_name(p.node)] + names) if side == "output" else "+".join(names + [op_name(p.node)])
    norms = [s for s in steps if s.norm is not None]
    if norms:
        entries = [Folded(norm_label(editor, s.node, s.norm), p.name, pattern, side, 0, s.node.name) for s in norms]
    else:
        affine = [s for s in steps if s.affine is not None]
        names = "+".join(s.node.name for s in affine)
        path = norm_label(editor, affine[0].node)
        label = f"{path} ({names})" if path != affine[0].node.name else f"affine {names}"
        entries = [Folded(label, p.name, pattern, side, 0, affine[0].node.name)]
    entries[0].extra_bytes = extra
    return entries
