"""Run an ONNX graph node by node under a precision profile, next to a float64 reference.

The ONNX twin of :class:`bnfold.numerics.emulator.Emulator`, with no conversion to a torch
program: each node runs eagerly with the torch functions of :mod:`bnfold.numerics.onnx_ops`,
once on the emulated values and once in float64.  Values computed from shapes (``Shape`` ->
``Slice`` -> ``Concat`` -> ``Reshape``) are plain integer tensors here: an input of any
concrete shape runs, dynamic H/W included.

Per float tensor (by ONNX value name) it measures the error against the float64 run; per
BatchNormalization the per-channel range of its input (:class:`~.probe.NormProbe`).  A
BatchNormalization whose statistics are constants (initializers or ``Constant`` outputs) is
what the risk model and the ``htp`` form read.

``reference``: the float64 values of another run of the same model (the unfolded one) by value
name.  The folded model is measured against the unfolded model's float64 run this way: a value
the fold kept under its name holds the same tensor (``bnfold.fold`` writes a folded chain's
result under the chain's output name).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import onnx
import torch
from onnx import numpy_helper

from .emulator import BatchResult
from .errors import TensorError, measure
from .onnx_ops import EXACT_OPS, LAYER_OPS, OPS, SAME_ERROR_OPS, attrs, constant
from .probe import NormProbe
from .profiles import Profile, get_profile, htp_host_scale_shift, round_fp16

_FLOAT_TYPES = (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16)
_SUBGRAPH_OPS = ("If", "Loop", "Scan")


class UnsupportedOp(NotImplementedError):
    """An op the ONNX emulator cannot run (``op`` names it)."""

    def __init__(self, op: str, node: str, why: str = ""):
        self.op, self.node = op, node
        super().__init__(f"ONNX op {op} (node {node!r}) is not supported by the audit{': ' + why if why else ''}")


class OpFailed(ValueError):
    """An op that failed on the values it was given (most often: inputs of a shape the model does not take)."""

    def __init__(self, op: str, node: str, ins: list, err: BaseException):
        self.op, self.node = op, node
        shapes = ", ".join(
            "-" if v is None else str(list(v.shape)) for v in ins if isinstance(v, torch.Tensor) or v is None
        )
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        super().__init__(
            f"ONNX op {op} (node {node!r}) failed on inputs shaped {shapes}: {first}; "
            "check the input shapes (--input-shape NAME:1,3,H,W) the model takes"
        )


def _is_float(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.is_floating_point()


def _tensor(arr: np.ndarray, float_dtype: torch.dtype) -> torch.Tensor:
    if arr.dtype.kind == "f":
        return torch.from_numpy(np.array(arr, dtype=np.float64)).to(float_dtype)
    if arr.dtype == np.bool_:
        return torch.from_numpy(np.array(arr))
    return torch.from_numpy(np.array(arr, dtype=np.int64))


@dataclass
class OnnxNorm:
    """A BatchNormalization whose scale, bias, mean and var are constants (float64, per channel)."""

    node: str
    input: str
    output: str
    eps: float
    gamma: torch.Tensor
    beta: torch.Tensor
    mean: torch.Tensor
    var: torch.Tensor


def constants(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """The graph's initializers and ``Constant`` outputs (and ``Identity`` copies of them), by value name."""
    out = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant" and node.output:
            out[node.output[0]] = constant(attrs(node))
        elif node.op_type == "Identity" and node.input and node.input[0] in out:
            out[node.output[0]] = out[node.input[0]]
    return out


def graph_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    init = {t.name for t in model.graph.initializer}
    return [i for i in model.graph.input if i.name not in init]


def norms_of(model: onnx.ModelProto, consts: dict[str, np.ndarray] | None = None) -> dict[str, OnnxNorm]:
    """``{node name: OnnxNorm}`` for every eval-mode BatchNormalization with constant statistics."""
    consts = constants(model) if consts is None else consts
    out = {}
    for node in model.graph.node:
        if node.op_type != "BatchNormalization" or len(node.input) < 5:
            continue
        a = attrs(node)
        if a.get("training_mode", 0) or not all(i in consts for i in node.input[1:5]):
            continue
        g, b, m, v = (torch.from_numpy(np.array(consts[i], dtype=np.float64)).flatten() for i in node.input[1:5])
        out[node.name] = OnnxNorm(node.name, node.input[0], node.output[0], float(a.get("epsilon", 1e-5)), g, b, m, v)
    return out


def node_names(model: onnx.ModelProto) -> list[str]:
    """Each node's name (``op_type_index`` for an unnamed one), in graph order."""
    return [n.name or f"{n.op_type}_{i}" for i, n in enumerate(model.graph.node)]


class OnnxEmulator:
    """Runs ``model`` under ``profile``; ``bn_eps`` replaces every BatchNormalization's eps in the
    emulated run.  ``segments`` (``{value name: segment id}``) asks for local errors, as in
    :class:`~bnfold.numerics.emulator.Emulator`: the values named there are also computed from the
    emulated values of their inputs outside their segment (constants unrounded), in float32 for an fp16
    profile (its error is ~1e-7, far below fp16's) and float64 otherwise."""

    def __init__(
        self,
        model: onnx.ModelProto,
        profile: str | Profile = "fp16",
        bn_eps: float | None = None,
        segments: dict[str, Any] | None = None,
    ):
        self.model = model
        self.profile = get_profile(profile)
        self.bn_eps = None if bn_eps is None else float(bn_eps)
        self.segments = dict(segments or {})
        g = model.graph
        consts = constants(model)
        self.norms = norms_of(model, consts)
        self._by_out = {n.output[0]: n for n in self.norms.values()}
        self.inputs = [i.name for i in graph_inputs(model)]
        self.outputs = [o.name for o in g.output]
        rnd = self.profile.round_const
        self._const_r = {k: _tensor(v, torch.float64) for k, v in consts.items()}
        self._const_e = {k: rnd(v.to(torch.float32)) if _is_float(v) else v for k, v in self._const_r.items()}
        self._local_dtype = torch.float32 if self.profile.fp16_storage else torch.float64
        self._const_l = {k: v.to(self._local_dtype) if _is_float(v) else v for k, v in self._const_r.items()}
        self.plan: list[tuple[onnx.NodeProto, str, dict]] = []
        for node, name in zip(g.node, node_names(model)):
            if node.op_type == "Constant":
                continue
            if node.domain not in ("", "ai.onnx"):
                raise UnsupportedOp(f"{node.domain}.{node.op_type}", name, "custom domain")
            if node.op_type in _SUBGRAPH_OPS:
                raise UnsupportedOp(node.op_type, name, "subgraphs")
            if node.op_type not in OPS and node.op_type not in ("Cast", "CastLike"):
                raise UnsupportedOp(node.op_type, name)
            self.plan.append((node, name, attrs(node)))
        last_use: dict[str, int] = {}
        for i, (node, _, _) in enumerate(self.plan):
            for v in node.input:
                last_use[v] = i
        keep = set(self.outputs) | set(consts)
        self._free_after: dict[int, list[str]] = {}
        for v, i in last_use.items():
            if v not in keep:
                self._free_after.setdefault(i, []).append(v)
        self._htp: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        self._fused: dict[str, tuple] = {}
        self._absorbed: dict[str, str] = {}
        if self.profile.fp16_conv_fusion:
            from .ort_fusion import fused_convs

            floats = {k: v for k, v in self._const_e.items() if _is_float(v)}
            self._fused = fused_convs(model, node_names(model), floats, set(self.outputs))
            self._absorbed = {a: v for _, _, absorbed in self._fused.values() for a, v in absorbed}

    # -- one op, three ways ------------------------------------------------------------------------

    def _op(self, node: onnx.NodeProto, name: str, a: dict, ins: list, float_dtype: torch.dtype) -> list:
        """``node`` on ``ins`` computing floats in ``float_dtype`` (no profile rounding)."""
        if node.op_type == "CastLike":  # the dynamo exporter's cast of a constant to the input's type
            x, like = ins[0], ins[1]
            return [x.to(float_dtype) if _is_float(like) else x.to(like.dtype)]
        if node.op_type == "Cast":
            to = a["to"]
            x = ins[0]
            if to in _FLOAT_TYPES:
                return [x.to(float_dtype)]
            if to == onnx.TensorProto.BOOL:
                return [x.to(torch.bool)]
            return [x.to(torch.int64) if not x.is_floating_point() else x.to(torch.int64)]
        try:
            out = OPS[node.op_type](ins, a)
        except NotImplementedError as e:
            raise UnsupportedOp(node.op_type, name, str(e)) from None
        except (RuntimeError, ValueError, IndexError, TypeError) as e:
            raise OpFailed(node.op_type, name, ins, e) from None
        return list(out) if isinstance(out, (list, tuple)) else [out]

    def _emulated(self, node, name, a, ins) -> list:
        prof = self.profile
        if name in self._absorbed:  # fused into the conv before it (ort-cpu): already applied there
            return [ins[list(node.input).index(self._absorbed[name])]]
        if name in self._fused:
            w, b, _ = self._fused[name]
            ins = [ins[0], w, b]
        norm = self.norms.get(name)
        if norm is not None and prof.htp_batch_norm:
            return [self._htp_batch_norm(norm, ins[0])]
        if norm is not None and self.bn_eps is not None:
            a = dict(a, epsilon=self.bn_eps)
        if prof.fp16_accumulate and node.op_type in LAYER_OPS:
            return [self._accumulated(node, name, a, ins)]
        outs = self._op(node, name, a, ins, torch.float32)
        if node.op_type in prof.fp16_ops:
            return [round_fp16(o) if _is_float(o) else o for o in outs]
        if not prof.fp16_storage or node.op_type in EXACT_OPS and _exact(node, a):
            return outs
        return [round_fp16(o) if _is_float(o) else o for o in outs]

    def _accumulated(self, node, name, a, ins) -> torch.Tensor:
        """A conv / Gemm / MatMul with fp16 accumulation (:mod:`bnfold.numerics.accumulate`)."""
        from . import accumulate

        chunk = self.profile.acc_chunk
        if node.op_type == "MatMul":
            return accumulate.linear("matmul", {"self": ins[0], "other": ins[1]}, chunk)
        if node.op_type == "Gemm" and not a.get("transA", 0) and a.get("alpha", 1.0) == 1.0:
            w = ins[1].t() if a.get("transB", 0) else ins[1]
            bias = ins[2] if len(ins) > 2 and a.get("beta", 1.0) == 1.0 else None
            if len(ins) <= 2 or bias is not None:
                return accumulate.linear("linear", {"input": ins[0], "weight": w.t(), "bias": bias}, chunk)
        if node.op_type in ("Conv", "ConvTranspose"):
            bias = ins[2] if len(ins) > 2 else None
            op = lambda input, weight, bias: self._op(node, name, a, [input, weight], torch.float32)[0]  # noqa: E731
            kw = {"input": ins[0], "weight": ins[1], "bias": bias, "groups": a.get("group", 1)}
            return accumulate.conv(op, kw, chunk, node.op_type == "ConvTranspose")
        return round_fp16(self._op(node, name, a, ins, torch.float32)[0])

    def _htp_batch_norm(self, norm: OnnxNorm, x: torch.Tensor) -> torch.Tensor:
        """An NPU runtime's BatchNorm: ``round(round(x * scale) + shift)`` with the host's float32
        ``scale``/``shift`` from the unrounded parameters, stored in fp16 (see ``Emulator``)."""
        pair = self._htp.get(norm.node)
        if pair is None:
            eps = norm.eps if self.bn_eps is None else self.bn_eps
            pair = htp_host_scale_shift(norm.gamma, norm.beta, norm.mean, norm.var, eps, x.dim())
            self._htp[norm.node] = pair
        return round_fp16(round_fp16(x * pair[0]) + pair[1])

    # -- a batch -----------------------------------------------------------------------------------

    def run(
        self,
        *xs: torch.Tensor,
        reference: bool = True,
        against: dict[str, torch.Tensor] | None = None,
        keep_reference: frozenset = frozenset(),
        on_node: Callable[[int, int], None] | None = None,
    ) -> tuple[BatchResult, dict[str, torch.Tensor]]:
        """Run one batch.  ``reference``: run the float64 reference too.  ``against``: measure against
        these float64 values (by name) instead (a run of the unfolded model; no reference run here).
        Returns the batch result and the reference values named in ``keep_reference``."""
        if len(xs) != len(self.inputs):
            raise ValueError(f"the model takes {len(self.inputs)} input(s), got {len(xs)}")
        prof = self.profile
        exact = not prof.fp16_storage
        env_e: dict[str, Any] = dict(self._const_e)
        env_r: dict[str, Any] = dict(self._const_r) if reference else {}
        env_l: dict[str, Any] = {}
        errors: dict[str, TensorError] = {}
        local: dict[str, TensorError] = {}
        probes: dict[str, NormProbe] = {}
        kept: dict[str, torch.Tensor] = {}
        refs = against if against is not None else env_r
        self._env_e, self._env_l = env_e, env_l
        for name, x in zip(self.inputs, xs):
            x = torch.as_tensor(x)
            if _is_float(x):
                env_e[name] = prof.round_input(x.detach().to(torch.float32))
                if reference:
                    env_r[name] = x.detach().to(torch.float64)
                if name in refs:
                    errors[name] = measure(name, "input", env_e[name], refs[name], exact)
            else:
                env_e[name] = x
                if reference:
                    env_r[name] = x
        n = len(self.plan)
        for i, (node, name, a) in enumerate(self.plan):
            if on_node is not None:
                on_node(i, n)
            ins_e = [env_e[v] if v else None for v in node.input]
            outs_e = self._emulated(node, name, a, ins_e)
            if reference:
                ins_r = [env_r[v] if v else None for v in node.input]
                outs_r = self._op(node, name, a, ins_r, torch.float64)
            norm = self.norms.get(name)
            if norm is not None and (reference or against is not None) and norm.input in refs:
                probes[name] = NormProbe.of(name, env_e[norm.input], refs[norm.input], 1)
            for k, out in enumerate(node.output):
                if not out or k >= len(outs_e):
                    continue
                e = env_e[out] = outs_e[k]
                if reference:
                    env_r[out] = outs_r[k]
                    if out in keep_reference:  # float32 is enough to measure an fp16 run against
                        kept[out] = outs_r[k].to(torch.float32) if not exact and _is_float(outs_r[k]) else outs_r[k]
                if not _is_float(e):
                    continue
                if out in self.segments:
                    lv = env_l[out] = self._local(node, name, a, k)
                    if _is_float(lv):
                        local[out] = measure(out, node.op_type, e, lv, exact)
                r = refs.get(out)
                if _is_float(r):
                    src = errors.get(node.input[0]) if node.op_type in SAME_ERROR_OPS and node.input else None
                    if src is not None and tuple(r.shape) == tuple(e.shape):
                        errors[out] = replace(src, node=out, op=node.op_type, shape=tuple(r.shape))
                    else:
                        errors[out] = measure(out, node.op_type, e, r, exact)
            for dead in self._free_after.get(i, ()):
                env_e.pop(dead, None)
                env_r.pop(dead, None)
                env_l.pop(dead, None)
        outputs = [env_e[o] for o in self.outputs]
        ref_out = [refs.get(o) for o in self.outputs] if (reference or against is not None) else []
        return BatchResult(outputs, ref_out, errors, local, probes), kept

    def _local(self, node, name, a, k) -> Any:
        """Output ``k`` of ``node`` from its segment's local values, the unrounded constants and,
        for any other input, the emulated value (see ``Emulator._local``)."""
        seg = self.segments[node.output[k]]
        env_e, env_l = self._env_e, self._env_l
        ins = []
        for v in node.input:
            if not v:
                ins.append(None)
            elif v in env_l and self.segments.get(v) == seg:
                ins.append(env_l[v])
            elif v in self._const_l:
                ins.append(self._const_l[v])
            else:
                e = env_e[v]
                ins.append(e.to(self._local_dtype) if _is_float(e) else e)
        if self.bn_eps is not None and name in self.norms:
            a = dict(a, epsilon=self.bn_eps)
        return self._op(node, name, a, ins, self._local_dtype)[k]


def _exact(node: onnx.NodeProto, a: dict) -> bool:
    """An :data:`EXACT_OPS` op computes exactly (a Resize only in ``nearest`` mode)."""
    if node.op_type == "Resize":
        mode = a.get("mode", b"nearest")
        return (mode.decode() if isinstance(mode, bytes) else mode) == "nearest"
    return True


def input_shapes_of(model: onnx.ModelProto, input_shapes: dict[str, tuple] | None = None) -> dict[str, list]:
    """Each graph input's shape: ``input_shapes[name]`` where given (checked against the model's fixed
    dims), else its fixed dims; a dim the model leaves open and nobody fixed is ``None``."""
    input_shapes = dict(input_shapes or {})
    out = {}
    for i in graph_inputs(model):
        dims = [
            d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None for d in i.type.tensor_type.shape.dim
        ]
        given = input_shapes.pop(i.name, None)
        if given is not None:
            given = [int(d) for d in given]
            if len(given) != len(dims) or any(d is not None and d != g for d, g in zip(dims, given)):
                shown = ["?" if d is None else d for d in dims]
                raise ValueError(f"input {i.name!r} has shape {shown} in the model; {given} does not fit it")
            dims = given
        out[i.name] = dims
    if input_shapes:
        raise ValueError(f"the model has no input named {', '.join(map(repr, input_shapes))}")
    return out
