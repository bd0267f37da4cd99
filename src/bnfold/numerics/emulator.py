"""Run an ExportedProgram node by node under a precision profile, next to a float64 reference.

Both runs walk the same graph in lockstep: the placeholders are fed from the
program's state_dict / constants by its graph signature (rounded to fp16 for
the emulated run, cast to float64 for the reference), every op runs twice,
and each floating-point intermediate is compared with its reference as soon
as it exists; values are dropped after their last use.

Floating dtypes named inside the graph (``_to_copy``, ``full``, ...) become
float32 in the emulated run and float64 in the reference.  Python scalars
(op attributes such as ``eps`` or a ``mul.Scalar`` factor) are used as they
are.

Layers and batch norms are recognized by the torch.export frontend
(``bnfold.torch_export.ops``).  How a runtime computes them (fp16 storage,
fp16 accumulation, an NPU's host-precomputed BatchNorm) is emulated here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch.export.graph_signature import OutputKind
from torch.fx.node import map_arg
from torch.utils._pytree import tree_flatten, tree_map

from ..torch_export.ops import Norm
from . import accumulate
from .errors import TensorError, measure
from .graph import layer_kind, lifted_tensor, lifted_tensors, op_name, running_stats_norm
from .probe import NormProbe
from .profiles import Profile, get_profile, htp_host_scale_shift, round_fp16

# Ops whose output holds only values of their (already fp16) inputs: no rounding needed.
_EXACT_OPS = frozenset(
    "view _unsafe_view reshape permute t transpose expand squeeze unsqueeze flatten clone contiguous alias "
    "detach lift_fresh slice select cat stack split split_with_sizes chunk unbind getitem narrow "
    "index_select max_pool1d max_pool2d max_pool3d max_pool2d_with_indices relu neg abs".split()
)
# Of those, the ones whose error statistics equal their input's (same elements, rearranged).
_SAME_ERROR_OPS = frozenset(
    "view _unsafe_view reshape permute t transpose squeeze unsqueeze flatten clone contiguous alias detach "
    "lift_fresh".split()
)


def _base_name(name: str) -> str:
    """Edge dialect ``view_copy`` etc. behave like ``view``."""
    return name[: -len("_copy")] if name.endswith("_copy") and name != "_to_copy" else name


def _is_float(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.is_floating_point()


def _has_dtype(args: Any) -> bool:
    return any(isinstance(a, torch.dtype) for a in tree_flatten(args)[0])


def _map_dtype(args: Any, dtype: torch.dtype) -> Any:
    return tree_map(lambda a: dtype if isinstance(a, torch.dtype) and a.is_floating_point else a, args)


@dataclass
class BatchResult:
    """One batch: emulated outputs (float32), reference outputs (float64), per-tensor errors by node name."""

    outputs: list
    reference: list
    errors: dict[str, TensorError]
    local: dict[str, TensorError] = field(default_factory=dict)
    probes: dict[str, NormProbe] = field(default_factory=dict)


@dataclass
class EmulationResult:
    """All batches: per-tensor errors merged over batches, outputs kept per batch.

    ``errors`` are cumulative (against the float64 run of the whole program);
    ``local`` holds the error each segment adds by itself (see ``Emulator``);
    ``probes`` the input range of each batch norm; ``not_emulated`` the nodes run in float32 by a
    reference implementation, not under the profile: ``(node, op type, why)``.
    """

    profile: str
    errors: dict[str, TensorError] = field(default_factory=dict)
    outputs: list = field(default_factory=list)
    reference: list = field(default_factory=list)
    local: dict[str, TensorError] = field(default_factory=dict)
    probes: dict[str, NormProbe] = field(default_factory=dict)
    not_emulated: list[tuple[str, str, str]] = field(default_factory=list)

    def add(self, batch: BatchResult, keep_outputs: bool = True) -> None:
        for mine, theirs in ((self.errors, batch.errors), (self.local, batch.local), (self.probes, batch.probes)):
            for name, value in theirs.items():
                if name in mine:
                    mine[name].merge(value)
                else:
                    mine[name] = value
        if keep_outputs:
            self.outputs.append(batch.outputs)
            self.reference.append(batch.reference)


class Emulator:
    """Runs ``ep`` under ``profile`` (see :mod:`bnfold.numerics.profiles`).

    ``bn_eps`` replaces the eps of every standalone BatchNorm in the emulated
    run (the reference keeps the model's eps): a runtime that ignores it.

    ``segments`` (``{node name: segment id}``) asks for local errors: each node
    named there is also computed in float64 from the *emulated* values of its
    inputs outside its segment (constants unrounded), and inside the segment
    from that local float64 run.  The difference to the emulated value is the
    error the segment adds by itself (``BatchResult.local``), as opposed to the
    cumulative error against the float64 run of the whole program.
    """

    def __init__(
        self,
        ep: torch.export.ExportedProgram,
        profile: str | Profile = "fp16",
        bn_eps: float | None = None,
        segments: dict[str, Any] | None = None,
    ):
        self.ep = ep
        self.segments = dict(segments or {})
        self.profile = get_profile(profile)
        self.bn_eps = None if bn_eps is None else float(bn_eps)
        self.lifted, self.user_inputs = lifted_tensors(ep)
        rnd = self.profile.round_const
        self._const_e = {k: rnd(v.detach()) if _is_float(v) else v for k, v in self.lifted.items()}
        self._const_r = {k: v.detach().to(torch.float64) if _is_float(v) else v for k, v in self.lifted.items()}
        self.nodes = list(ep.graph_module.graph.nodes)
        for node in self.nodes:
            if node.op not in ("placeholder", "call_function", "output"):
                raise NotImplementedError(f"node {node.name} ({node.op}) is not supported by the emulator")
        self._names = {n: _base_name(op_name(n.target)) for n in self.nodes if n.op == "call_function"}
        self._dtype_args = {n for n in self._names if _has_dtype((n.args, n.kwargs))}
        self._bn = {n: norm for n in self._names if (norm := running_stats_norm(n)) is not None}
        self._layer_kinds = {n: kind for n in self._names if (kind := layer_kind(n)) is not None}
        self._htp_cache: dict[torch.fx.Node, tuple[torch.Tensor, torch.Tensor]] = {}
        last_use = {}
        for node in self.nodes:
            for inp in node.all_input_nodes:
                last_use[inp] = node
        self._free_after: dict[torch.fx.Node, list] = {}
        for value, user in last_use.items():
            self._free_after.setdefault(user, []).append(value)
        kinds = [spec.kind for spec in ep.graph_signature.output_specs]
        self._user_outputs = [i for i, k in enumerate(kinds) if k == OutputKind.USER_OUTPUT]
        # static input shapes (None for a dynamic dim): a batch of another shape would fail mid-graph
        self._shapes = {}
        for node in self.nodes:
            val = node.meta.get("val") if node.op == "placeholder" else None
            if node.name in self.user_inputs and isinstance(val, torch.Tensor):
                self._shapes[node.name] = [d if isinstance(d, int) else None for d in val.shape]

    def _check_shape(self, name: str, value: Any) -> None:
        want = self._shapes.get(name)
        if want is None or not isinstance(value, torch.Tensor):
            return
        got = list(value.shape)
        if len(got) != len(want) or any(w is not None and w != g for w, g in zip(want, got)):
            shown = ["*" if w is None else w for w in want]
            raise ValueError(
                f"input {name!r} has shape {got} but the program was exported for {shown}; "
                "export with a dynamic batch dimension (torch.export.Dim) to run other batch sizes"
            )

    # -- the two runs --------------------------------------------------------------------------

    def run(self, *args: Any, reference: bool = True, on_node: Callable[[int, int], None] | None = None) -> BatchResult:
        """Run one batch (``args`` as the program's forward takes them).

        With ``reference=False`` only the emulated run happens: the result
        holds the emulated outputs and no reference or errors.  ``on_node(i, n)``
        is called after each of the ``n`` nodes (progress within a long batch).
        """
        flat = tree_flatten(args)[0]
        if len(flat) != len(self.user_inputs):
            raise ValueError(f"the program takes {len(self.user_inputs)} input(s), got {len(flat)}")
        user = dict(zip(self.user_inputs, flat))
        env_e: dict[torch.fx.Node, Any] = {}
        env_r: dict[torch.fx.Node, Any] = {}
        errors: dict[str, TensorError] = {}
        local: dict[str, TensorError] = {}
        probes: dict[str, NormProbe] = {}
        env_l: dict[torch.fx.Node, Any] = {}
        exact_diff = not self.profile.fp16_storage
        outputs: tuple = ([], [])
        n_nodes = len(self.nodes)
        for index, node in enumerate(self.nodes):
            if on_node is not None:
                on_node(index, n_nodes)
            op = node.op
            if op == "call_function":
                name = self._names[node]
                args_e, kwargs_e = map_arg((node.args, node.kwargs), env_e.__getitem__)
                if node in self._dtype_args:
                    args_e, kwargs_e = _map_dtype((args_e, kwargs_e), torch.float32)
                e = env_e[node] = self._call(node, name, args_e, kwargs_e, env_e)
                if reference and node.name in self.segments:
                    lv = env_l[node] = self._local(node, env_e, env_r, env_l)
                    if isinstance(lv, torch.Tensor) and lv.is_floating_point() and _is_float(e):
                        local[node.name] = measure(node.name, name, e, lv, exact_diff)
                bn = self._bn.get(node)
                if reference and bn is not None and _is_float(env_e.get(bn.input)):
                    probes[node.name] = NormProbe.of(node.name, env_e[bn.input], env_r[bn.input], bn.axis)
                if reference:
                    args_r, kwargs_r = map_arg((node.args, node.kwargs), env_r.__getitem__)
                    if node in self._dtype_args:
                        args_r, kwargs_r = _map_dtype((args_r, kwargs_r), torch.float64)
                    r = env_r[node] = node.target(*args_r, **kwargs_r)
                    if isinstance(r, torch.Tensor) and r.is_floating_point() and _is_float(e):
                        src = errors.get(node.args[0].name) if name in _SAME_ERROR_OPS and node.args else None
                        if src is not None:
                            errors[node.name] = replace(src, node=node.name, op=name, shape=tuple(r.shape))
                        else:
                            errors[node.name] = measure(node.name, name, e, r, exact_diff)
            elif op == "placeholder":
                if node.name in self._const_e:
                    env_e[node], env_r[node] = self._const_e[node.name], self._const_r[node.name]
                else:
                    v = user[node.name]
                    self._check_shape(node.name, v)
                    if _is_float(v):
                        env_e[node] = self.profile.round_input(v.detach())
                        if reference:
                            env_r[node] = v.detach().to(torch.float64)
                            errors[node.name] = measure(node.name, "input", env_e[node], env_r[node], exact_diff)
                    else:
                        env_e[node] = env_r[node] = v
            else:  # output
                outs_e = map_arg(node.args[0], env_e.__getitem__)
                outputs[0].extend(outs_e[i] for i in self._user_outputs)
                if reference:
                    outs_r = map_arg(node.args[0], env_r.__getitem__)
                    outputs[1].extend(outs_r[i] for i in self._user_outputs)
            for dead in self._free_after.get(node, ()):
                env_e.pop(dead, None)
                env_r.pop(dead, None)
                env_l.pop(dead, None)
        return BatchResult(outputs[0], outputs[1], errors, local, probes)

    def _local(self, node: torch.fx.Node, env_e: dict, env_r: dict, env_l: dict) -> Any:
        """``node`` in float64 from its segment's local values, the unrounded constants and,
        for any other input, the emulated value."""
        seg = self.segments[node.name]

        def pick(i: torch.fx.Node) -> Any:
            if i in env_l and self.segments.get(i.name) == seg:
                return env_l[i]
            if i.name in self.lifted:
                return env_r[i]
            return tree_map(lambda t: t.to(torch.float64) if _is_float(t) else t, env_e[i])

        args, kwargs = map_arg((node.args, node.kwargs), pick)
        if node in self._dtype_args:
            args, kwargs = _map_dtype((args, kwargs), torch.float64)
        return node.target(*args, **kwargs)

    def _call(self, node: torch.fx.Node, name: str, args: tuple, kwargs: dict, env: dict) -> Any:
        prof = self.profile
        bn = self._bn.get(node)
        if bn is not None and self.bn_eps is not None and not prof.htp_batch_norm:
            args, kwargs = _with_eps(node, args, kwargs, self.bn_eps)
        if not prof.fp16_storage:
            return node.target(*args, **kwargs)
        if bn is not None and prof.htp_batch_norm:
            return self._htp_batch_norm(node, bn, env)
        kind = self._layer_kinds.get(node) if prof.fp16_accumulate else None
        if kind in ("linear", "matmul"):
            out = accumulate.linear(name, _by_name(node, args, kwargs), prof.acc_chunk)
        elif kind in ("conv", "conv_transpose"):
            out = accumulate.conv(node.target, _by_name(node, args, kwargs), prof.acc_chunk, kind == "conv_transpose")
        else:
            out = node.target(*args, **kwargs)
        if name in _EXACT_OPS:
            return out
        if isinstance(out, torch.Tensor):
            return round_fp16(out) if out.is_floating_point() else out
        return tree_map(lambda t: round_fp16(t) if _is_float(t) else t, out)

    def _htp_batch_norm(self, node: torch.fx.Node, bn: Norm, env: dict) -> Any:
        """Emulation of an NPU runtime's BatchNorm: ``round(round(x * scale) + shift)``.

        ``scale`` and ``shift`` are what the runtime's host computes, in float32 from the
        model's (unrounded) parameters, and stores in fp16.  This deliberately models the
        runtime's arithmetic; it is not the fold's (``bnfold.fold_math``, float64).
        """
        x = env[bn.input]
        pair = self._htp_cache.get(node)
        if pair is None:
            pair = self._htp_host_scale_shift(bn, x, env)
            params = (bn.weight, bn.bias, bn.mean, bn.var)
            if all(a is None or lifted_tensor(a, self.lifted) is not None for a in params):  # constants: reuse
                self._htp_cache[node] = pair
        y = round_fp16(round_fp16(x * pair[0]) + pair[1])
        if len(node.target._schema.returns) == 1:  # batch_norm; the native ops return (y, mean, invstd)
            return y
        return (y, x.new_empty(0), x.new_empty(0))

    def _htp_host_scale_shift(self, bn: Norm, x: torch.Tensor, env: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """The runtime host's float32 ``scale``/``shift``, rounded to fp16 and shaped to broadcast over ``x``."""

        def host(arg, fill):
            if arg is None:
                return torch.full((x.shape[1],), fill, dtype=torch.float32)
            t = lifted_tensor(arg, self.lifted)
            return (t if t is not None else env[arg]).to(torch.float32)

        gamma, beta, mean, var = host(bn.weight, 1.0), host(bn.bias, 0.0), host(bn.mean, 0.0), host(bn.var, 1.0)
        eps = bn.eps if self.bn_eps is None else self.bn_eps
        return htp_host_scale_shift(gamma, beta, mean, var, eps, x.dim())


def _by_name(node: torch.fx.Node, args: tuple, kwargs: dict) -> dict:
    schema = node.target._schema
    out = {a.name: a.default_value for a in schema.arguments if a.has_default_value()}
    out.update({a.name: v for a, v in zip(schema.arguments, args)})
    out.update(kwargs)
    return out


def _with_eps(node: torch.fx.Node, args: tuple, kwargs: dict, eps: float) -> tuple[tuple, dict]:
    """``args``/``kwargs`` with the batch norm's ``eps`` argument replaced."""
    i = [a.name for a in node.target._schema.arguments].index("eps")
    if i < len(args):
        return args[:i] + (eps,) + args[i + 1 :], kwargs
    return args, dict(kwargs, eps=eps)


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
