"""Reading and writing the tensors of an fx graph: the part every fx graph kind shares.

Tensors are graph nodes: a ``get_attr`` node (a tensor attribute of the graph
module, how ExecuTorch passes register tensors) or a placeholder that stands
for a parameter, buffer or constant.  ``FxTensors`` handles ``get_attr``
tensors and everything that does not depend on where a placeholder's tensor
lives; ``ProgramEditor`` (a program's signature) and ``GraphModuleEditor``
(a GraphModule edited in place) say that.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.fx import GraphModule, Node

from ..fold_math import LARGE_BYTES
from ..io import cost, fx_cost, meter, run_checks


class FxTensors:
    """Tensor access for ``graph`` (owned by ``gm``)."""

    def __init__(self, gm: GraphModule, graph: torch.fx.Graph):
        self.gm, self.graph = gm, graph
        self._computed: dict[Node, torch.Tensor | None] = {}
        self._released: dict[Node, bool] = {}  # a large value handed out and dropped -> whether it is a constant
        self._work = None  # the constant evaluator's WorkMeter, made on first use
        self._tuples: dict[Node, tuple] = {}  # the values of multi-output ops computed from constants
        self._fake_mode = next(
            (
                n.meta["val"].fake_mode
                for n in graph.nodes
                if n.op == "placeholder" and hasattr(n.meta.get("val"), "fake_mode")
            ),
            None,
        )

    # ------------------------------------------------------------------ per placeholder (subclasses)

    def placeholder_tensor(self, node: Node) -> torch.Tensor | None:
        raise NotImplementedError

    def placeholder_target(self, node: Node) -> str | None:
        raise NotImplementedError

    def is_user_input(self, node: Node) -> bool:
        raise NotImplementedError

    def replace_placeholder(self, node: Node, value: torch.Tensor) -> None:
        raise NotImplementedError

    def add_placeholder(self, like: Node, target: str, value: torch.Tensor) -> Node:
        raise NotImplementedError

    def drop_placeholder(self, node: Node) -> None:
        raise NotImplementedError

    def placeholder_for_target(self, target: str) -> Node | None:
        return None

    # ------------------------------------------------------------------ reading

    def tensor(self, node: Any) -> torch.Tensor | None:
        """The constant tensor behind ``node``, or None if it is not a constant."""
        if not isinstance(node, Node):
            return None
        if node.op == "get_attr":
            value = getattr_path(self.gm, node.target)
            return value if isinstance(value, torch.Tensor) else None
        if node.op == "placeholder":
            return self.placeholder_tensor(node)
        return None

    def constant_value(self, node: Any) -> torch.Tensor | None:
        """Like ``tensor``, but also evaluates (in float64) a pure subgraph computed
        only from constants, e.g. FrozenBatchNorm's ``weight * (var + eps).rsqrt()``.

        Iterative (an explicit stack, so a chain of any length evaluates), and
        metered: each value's bytes and FLOPs, from the op's meta kernels on its
        real arguments (``bnfold.io.run_checks.before_op``), are counted before it is
        computed (``bnfold.io.cost``); past the budget that the program's weights
        justify, ``WorkError``.
        """
        value = self.tensor(node)
        if value is not None or not self._evaluable(node):
            return value
        stack = [node]
        while stack:
            n = stack[-1]
            if n in self._computed:
                stack.pop()
                continue
            inputs = n.all_input_nodes
            if any(self._no_constant(a) for a in inputs):  # nor is ``n``: its other inputs are not computed
                self._computed[n] = None
                stack.pop()
                continue
            todo = next((a for a in inputs if a not in self._computed and self.tensor(a) is None), None)
            if todo is not None:
                stack.append(todo)  # one at a time: an input found to be no constant spares the rest
                continue
            stack.pop()
            self._computed[n] = self._evaluate(n)
        return self._computed[node]

    def _no_constant(self, node: Node) -> bool:
        """Whether ``node`` is known to be no constant: evaluated to none, or neither a tensor nor evaluable."""
        if node in self._computed:
            return self._computed[node] is None and node not in self._tuples
        return self.tensor(node) is None and not self._evaluable(node)

    def is_constant(self, node: Any) -> bool:
        """Whether :meth:`constant_value` gives a tensor for ``node``: a tensor of the graph (nothing copied), or a
        value computed from them (computed once; a large one's answer kept after :meth:`release` dropped it)."""
        if node in self._released:
            return self._released[node]
        value = self.constant_value(node)
        self.release(node)
        return value is not None

    def release(self, node: Any) -> None:
        """The caller took ``node``'s computed value: it is dropped where it holds at least
        :data:`bnfold.fold_math.LARGE_BYTES` (a float64 copy, not held beside the program until the fold ends;
        asked for again, it is computed again and metered again, as a value :meth:`_free_read` dropped)."""
        value = self._computed.get(node) if isinstance(node, Node) else None
        if value is not None and value.numel() * value.element_size() >= LARGE_BYTES:
            self._computed.pop(node)
            self._released[node] = True
            self._meter().free(node)

    def _evaluable(self, node: Any) -> bool:
        """Whether ``node`` is an op constant evaluation may run: pure, deterministic, reading a node
        (a ``getitem`` of such an op: one output of a multi-output op, ``_native_batch_norm_legit.no_stats``
        over a weight). A chain of ``getitem`` is followed in a loop: a file sets its length (one per
        dimension of a weight of thousands)."""
        while isinstance(node, Node) and node.op == "call_function" and node.target is operator.getitem:
            if not isinstance(node.args[1], int):
                return False
            node = node.args[0]
        if not isinstance(node, Node) or node.op != "call_function":
            return False
        schema = getattr(node.target, "_schema", None)
        if schema is None or schema.is_mutable or not any(isinstance(a, Node) for a in node.args):
            return False
        if torch.Tag.nondeterministic_seeded in getattr(node.target, "tags", ()) or "empty" in schema.name:
            return False  # random or uninitialized: not a constant, whatever its inputs
        return True

    @torch.no_grad()  # the inputs may be Parameters: a computed constant records no autograd graph
    def _evaluate(self, node: Node) -> torch.Tensor | None:
        """``node``'s value from its inputs' (already computed or stored), or None when one is not a constant."""
        if node.target is operator.getitem:
            value = self._output(node)
            if value is not None:  # one output of a tuple held until its last getitem is computed
                self._meter().keep(node, 0, value.numel() * value.element_size())
                self._free_read(node)
            return value

        def value(arg):
            if isinstance(arg, Node):
                v = self.tensor(arg)
                if v is None:
                    v = self._computed.get(arg)
                if v is None:
                    raise LookupError
                return v
            return arg

        def resolve(arg):
            if isinstance(arg, Node):
                v = value(arg)
                return v.double() if v.is_floating_point() else v
            return arg

        try:  # every input known before any is copied to float64 (an embedding's table and its ids: no copy)
            torch.fx.node.map_aggregate((node.args, node.kwargs), value)
        except LookupError:
            return None
        args = torch.fx.node.map_aggregate(node.args, resolve)
        kwargs = torch.fx.node.map_aggregate(node.kwargs, resolve)
        label = f"{getattr(node.target, '__name__', node.target)} {node.name!r}"
        cost = self._cost(node, label, args, kwargs)
        if cost is None:
            return None  # a size known only when it runs: not a constant evaluated here
        meter = self._meter()
        meter.charge(label, *cost)
        try:
            value = node.target(*args, **kwargs)
        except Exception as e:  # an op that cannot run eagerly on these tensors: not a constant we can use
            if run_checks.allocator_failure(e):
                raise  # out of memory: the watchdog names the op (bnfold.io.run_checks.watch)
            value = None
        if isinstance(value, (tuple, list)):  # a multi-output op: its getitems read it
            self._tuples[node] = tuple(value)
        elif not isinstance(value, torch.Tensor):
            value = None
        meter.keep(node, cost[0], 0 if value is None else cost[0])
        if value is not None:
            self._free_read(node)
        return None if isinstance(value, (tuple, list)) else value

    def _free_read(self, node: Node) -> None:
        """Drop the computed values ``node`` read whose every reader is computed by now (``node`` is being
        memoized): nothing reads them again unless they are computed anew (and metered anew).  Values
        under ``FREE_MIN_BYTES`` stay (still counted): a chain of small ones is never computed twice."""
        from ..io.meter import FREE_MIN_BYTES

        for a in node.all_input_nodes:
            value = self._computed.get(a)
            held = (value is not None and value.numel() * value.element_size() >= FREE_MIN_BYTES) or a in self._tuples
            if held and all(u is node or u in self._computed for u in a.users):
                self._computed.pop(a)
                self._tuples.pop(a, None)
                self._meter().free(a)

    def _output(self, node: Node) -> torch.Tensor | None:
        """The value of a ``getitem`` of a multi-output op computed from constants, or None."""
        outputs, i = self._tuples.get(node.args[0]), node.args[1]
        value = outputs[i] if outputs is not None and -len(outputs) <= i < len(outputs) else None
        return value if isinstance(value, torch.Tensor) else None

    def _cost(self, node: Node, label: str, args: tuple, kwargs: dict) -> tuple[int, int] | None:
        """Bytes and FLOPs of ``node``'s value, from the op's meta kernels on its real (float64)
        arguments (``bnfold.io.run_checks.before_op``, the run-time check), never from the metadata."""
        outs = run_checks.before_op(label, node.target, args, kwargs, budget=self._meter().budget)
        if not outs:
            return None
        ins = [list(t.shape) for t in _tensors(args)]
        flops = sum(fx_cost.op_flops(node.target, node.args, list(o.dims), ins) for o in outs)
        return sum(o.nbytes for o in outs), flops

    def _meter(self):
        """The evaluator's running check (``bnfold.io.meter.WorkMeter``), its budget from the graph's tensors."""
        if self._work is None:
            held = 0
            for n in self.graph.nodes:
                t = self.tensor(n) if n.op in ("placeholder", "get_attr") else None
                if isinstance(t, torch.Tensor):
                    held += t.numel() * t.element_size()
            self._work = meter.WorkMeter(cost.Budget.for_content(held), "constant evaluation")
        return self._work

    def target(self, node: Node) -> str:
        """The state_dict / constants key of a tensor node (get_attr: its attribute path)."""
        if node.op == "placeholder":
            return self.placeholder_target(node) or node.name
        return str(node.target)

    def describe(self, node: Any) -> str:
        if not isinstance(node, Node):
            return f"the value {node!r}"
        if node.op == "placeholder" and self.is_user_input(node):
            return f"user input '{node.name}'"
        if node.op == "call_function":
            return f"'{node.name}' ({getattr(node.target, '__name__', node.target)})"
        return f"'{node.name}'"

    def is_shared(self, node: Node) -> bool:
        """Whether the tensor behind ``node`` has more than one user now."""
        if node.op == "get_attr":
            return sum(len(n.users) for n in self.graph.nodes if n.op == "get_attr" and n.target == node.target) > 1
        return len(node.users) > 1

    # ------------------------------------------------------------------ writing

    def replace_tensor(self, node: Node, value: torch.Tensor) -> None:
        """Give ``node`` a new value: same name, same kind."""
        if node.op == "get_attr":
            setattr_path(self.gm, node.target, like_param(getattr_path(self.gm, node.target), value))
            self.set_val(node, value)
        else:
            self.replace_placeholder(node, value)

    def add_tensor(self, like: Node, target: str, value: torch.Tensor) -> Node:
        """A new tensor node of the same kind as ``like``, placed right after it."""
        if like.op == "placeholder":
            return self.add_placeholder(like, target, value)
        return self.add_attr(like, target.replace(".", "_"), value)

    def add_attr(self, like: Node, name: str, value: torch.Tensor, parameter: bool = False) -> Node:
        """A new ``get_attr`` tensor registered on the graph module: a parameter if ``like``'s is one,
        or if ``parameter`` (then one that needs no gradient), else a buffer."""
        base, i = name, 0
        while hasattr(self.gm, name):
            i += 1
            name = f"{base}_{i}"
        old = getattr_path(self.gm, like.target) if like.op == "get_attr" else None
        if isinstance(old, torch.nn.Parameter):
            self.gm.register_parameter(name, like_param(old, value))
        elif parameter:
            self.gm.register_parameter(name, torch.nn.Parameter(value, requires_grad=False))
        else:
            self.gm.register_buffer(name, value)
        with self.graph.inserting_after(like):
            node = self.graph.get_attr(name)
        self.set_val(node, value)
        return node

    def drop_if_unused(self, node: Any) -> None:
        """Remove a tensor node that no longer has users, with its state."""
        if not isinstance(node, Node) or node.users or getattr(node, "_erased", False):
            return
        if node.op == "get_attr":
            self.graph.erase_node(node)
        elif node.op == "placeholder":
            self.drop_placeholder(node)

    def erase_dead(self, node: Any) -> None:
        """Erase ``node`` if nothing uses it any more, then its inputs in turn (an explicit stack:
        a dead chain of any length).  Unread ``getitem`` readers of a multi-output op (a loaded program
        names every output of a batch norm, read or not) are dead too and go with it."""
        stack = [node]
        while stack:
            node = stack.pop()
            if not isinstance(node, Node) or getattr(node, "_erased", False):
                continue
            if node.users and all(u.target is operator.getitem and not u.users for u in node.users):
                for user in list(node.users):
                    self.graph.erase_node(user)
            if node.users:
                continue
            if node.op in ("placeholder", "get_attr"):
                self.drop_if_unused(node)
                continue
            schema = getattr(node.target, "_schema", None)
            pure = node.target is operator.getitem or (schema is not None and not schema.is_mutable)
            if node.op != "call_function" or not pure:
                continue
            inputs = list(node.all_input_nodes)
            self.graph.erase_node(node)
            stack.extend(reversed(inputs))

    def set_val(self, node: Node, value: torch.Tensor) -> None:
        old = node.meta.get("val")
        if getattr(old, "shape", None) == value.shape and getattr(old, "dtype", None) == value.dtype:
            return
        if self._fake_mode is not None:  # a fake tensor with the value's metadata, in the program's fake mode
            meta = torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device="meta")
            node.meta["val"] = FakeTensor(self._fake_mode, meta, value.device)
        else:
            node.meta["val"] = value
        node.meta.pop("tensor_meta", None)


def _tensors(args: Any) -> list[torch.Tensor]:
    """The tensors among ``args`` (nested lists and tuples followed)."""
    if isinstance(args, torch.Tensor):
        return [args]
    if isinstance(args, (list, tuple)):
        return [t for a in args for t in _tensors(a)]
    return []


def like_param(old: Any, value: torch.Tensor) -> torch.Tensor:
    if isinstance(old, torch.nn.Parameter):
        return torch.nn.Parameter(value, requires_grad=old.requires_grad)
    return value


def getattr_path(root: Any, path: str) -> Any:
    for part in path.split("."):
        root = getattr(root, part)
    return root


def setattr_path(root: Any, path: str, value: Any) -> None:
    *parents, last = path.split(".")
    for part in parents:
        root = getattr(root, part)
    setattr(root, last, value)
