"""An ONNX graph for the lockstep runner (:mod:`.runner`): its nodes as steps, its initializers as constants.

No conversion to a torch program: each node runs eagerly with the op's torch implementation from
:mod:`bnfold.onnx.semantics` (``bind``: an op with no implementation runs through ``onnx.reference`` in
float32, marked not emulated).  Values computed from shapes (``Shape`` -> ``Slice`` -> ``Concat`` ->
``Reshape``) are plain integer tensors here: an input of any concrete shape runs, dynamic H/W included.
Errors are keyed by ONNX value name; a BatchNormalization whose statistics are constants (initializers or
``Constant`` outputs) is what the risk model and the ``htp`` form read.  What an op is to the numerics
(exact, layer kind, fp16 class) is read from the frontend's op table (``bnfold.onnx.ops.OPS``).

``against`` (see :meth:`~.runner.Runner.run`): the folded model is measured against the unfolded model's
reference values by name: a value the fold kept under its name holds the same tensor (``bnfold.fold`` writes
a folded chain's result under the chain's output name).
"""

from __future__ import annotations

import math
import warnings
from collections import Counter
from functools import partial

import numpy as np
import onnx
import torch

from .. import fold_math
from ..io.cost import Plan
from ..io.run_checks import allocator_failure
from ..onnx.const_eval import graph_constants, node_fields
from ..onnx.nodes import graph_inputs
from ..onnx.ops import op_of
from ..onnx.semantics import IMPLS, attrs, bind, opset_of
from ..onnx.semantics.reference import REFERENCE_OPS
from ..onnx.semantics.values import array
from ..onnx.tensors import stored_key, streamed
from . import accumulate
from .audit_memory import onnx_audit_plan
from .batches import RANDOM_BATCHES, as_batches
from .lazy import LazyConstant
from .profiles import Profile
from .rounded_constants import ROUNDED_TOGETHER
from .runner import DEFAULT_ROUNDING, Program, Runner, Step, StepNorm, round_fp16

_SUBGRAPH_OPS = ("If", "Loop", "Scan")
#: the element types a lazy program leaves on disk (weights)
_FLOATS = (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE, onnx.TensorProto.BFLOAT16)


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


def _tensor(arr: np.ndarray) -> torch.Tensor:
    """A constant as the runner holds it: floats as stored (the runner casts them once; bfloat16 and float8, numpy
    dtypes of ml_dtypes torch does not read, as float32, which holds their values), booleans bool, integers int64.
    A float array over the bytes protobuf gave for an initializer's ``raw_data`` (read-only, a copy nothing else
    holds) is held as it is, not copied again: nothing writes a program's constants (runners share them)."""
    if arr.dtype.kind == "f" and arr.dtype.isnative and arr.size and arr.flags.c_contiguous and _over_bytes(arr):
        with warnings.catch_warnings():  # torch's note that it cannot mark the tensor read-only
            warnings.simplefilter("ignore", UserWarning)
            return torch.from_numpy(arr)
    custom = arr.dtype.kind not in "fbiu" and arr.dtype.name.startswith(("bfloat", "float"))
    return torch.from_numpy(
        arr.astype(np.float32) if custom else np.array(arr, dtype=None if arr.dtype.kind in "fb" else np.int64)
    )


def _over_bytes(arr: np.ndarray) -> bool:
    """Whether ``arr``'s memory is a ``bytes`` object's (immutable: ``np.frombuffer(t.raw_data)``)."""
    base = arr.base
    while isinstance(base, np.ndarray):
        base = base.base
    return type(base) is bytes


def norms_of(nodes: list[tuple], consts: dict[str, np.ndarray]) -> dict[str, float]:
    """``{node name: eps}`` of every eval-mode BatchNormalization whose scale, bias, mean and var are constants,
    over the node fields :func:`~bnfold.onnx.const_eval.node_fields` read and the constants
    :func:`~bnfold.onnx.const_eval.graph_constants` found."""
    out = {}
    for node, op, ins, _, name in nodes:
        if op != "BatchNormalization" or len(ins) < 5:
            continue
        a = attrs(node)
        if a.get("training_mode", 0) or not all(i in consts for i in ins[1:5]):
            continue
        out[name] = float(a.get("epsilon", 1e-5))
    return out


def _step(
    node: onnx.NodeProto, fields: tuple, name: str, opset: int | None, norm_eps: float | None, consts: dict
) -> Step:
    """``node`` as a step of the runner (``fields``: its op type, inputs and outputs,
    :func:`~bnfold.onnx.const_eval.node_fields`; ``norm_eps``: the eps of a batch norm :func:`norms_of` found, else
    None)."""
    op, ins, outs = fields
    if node.domain not in ("", "ai.onnx"):
        raise UnsupportedOp(f"{node.domain}.{node.op_type}", name, "custom domain")
    if op in _SUBGRAPH_OPS:
        raise UnsupportedOp(op, name, "subgraphs")
    a, bound = attrs(node), bind(node, opset)
    if not bound.emulated and op not in IMPLS and op not in REFERENCE_OPS:
        raise UnsupportedOp(op, name, "no implementation, and not an op the reference evaluator may run")

    def run(ins: list, dtype: torch.dtype, eps=None, weight=None, bias=None) -> list:
        if weight is not None:
            ins = [ins[0], weight, bias]
        try:
            return bound(ins, a if eps is None else dict(a, epsilon=eps), dtype)
        except NotImplementedError as e:
            raise UnsupportedOp(op, name, str(e)) from None
        except (RuntimeError, ValueError, IndexError, TypeError) as e:
            if allocator_failure(e):  # the memory ran out, not the shapes: the command's watch says so
                raise
            raise OpFailed(op, name, ins, e) from None

    row = op_of(node)
    step = Step(name, op, ins, outs, run, not_emulated="" if bound.emulated else bound.why)
    if row is not None:
        step.rounding, step.fp16_class, step.layer = row.rounding or DEFAULT_ROUNDING, row.fp16, row.layer or None
        step.shape = row.shape
    mode = a.get("mode", "nearest")
    if op == "Resize" and (mode.decode() if isinstance(mode, bytes) else mode) != "nearest":
        step.rounding = DEFAULT_ROUNDING  # only nearest picks input values
    if step.layer is not None:
        step.weight = ins[1] if len(ins) > 1 and ins[1] in consts else None
        step.bias = ins[2] if len(ins) > 2 and ins[2] else None
        step.channels = _channels(op, a) if step.weight is not None else None
    if step.layer is not None or (row is not None and row.accumulate):
        step.accumulated = lambda ins, chunk: _accumulated(node, a, run, ins, chunk)
    if norm_eps is not None:
        step.norm = StepNorm(ins[0], tuple(ins[1:5]), norm_eps, output=outs[0])
    return step


def _channels(op: str, a: dict) -> tuple[int, int] | None:
    """Where a layer's output channels lie (:attr:`~.runner.Step.channels`): a MatMul's weight ``[..., K, N]``, a
    Gemm's ``B`` (``[N, K]`` under ``transB``) with ``C`` broadcast along ``N``, an ungrouped Conv's ``[O, ...]``."""
    if op == "MatMul":
        return (-1, -1)
    if op == "Gemm":
        return (0 if a.get("transB", 0) else 1, 1)
    if op == "Conv" and a.get("group", 1) == 1:
        return (0, 1)
    return None


def _accumulated(node: onnx.NodeProto, a: dict, run, ins: list, chunk: int) -> torch.Tensor:
    """A conv / Gemm / MatMul, a sum, mean or average pool with fp16 accumulation (:mod:`.accumulate`)."""
    op = node.op_type
    x = ins[0]
    if op in ("ReduceSum", "ReduceMean"):
        axes = [int(v) for v in ins[1].reshape(-1).tolist()] if len(ins) > 1 and ins[1] is not None else a.get("axes")
        if not axes and a.get("noop_with_empty_axes", 0):
            return x
        return accumulate.reduction(x, axes, bool(a.get("keepdims", 1)), op == "ReduceMean", chunk)
    if op == "GlobalAveragePool":
        return accumulate.reduction(x, range(2, x.dim()), True, True, chunk)
    if op == "AveragePool":
        return accumulate.pool(run(ins, torch.float32)[0], math.prod(a["kernel_shape"]))
    if op == "MatMul":
        return accumulate.linear("matmul", {"self": ins[0], "other": ins[1]}, chunk)
    if op == "Gemm" and not a.get("transA", 0) and a.get("alpha", 1.0) == 1.0:
        w = ins[1].t() if a.get("transB", 0) else ins[1]
        bias = ins[2] if len(ins) > 2 and a.get("beta", 1.0) == 1.0 else None
        if len(ins) <= 2 or bias is not None:
            return accumulate.linear("linear", {"input": ins[0], "weight": w.t(), "bias": bias}, chunk)
    if op in ("Conv", "ConvTranspose"):
        bias = ins[2] if len(ins) > 2 else None
        conv = lambda input, weight, bias, groups: run([input, weight], torch.float32)[0]  # noqa: E731
        kw = {"input": ins[0], "weight": ins[1], "bias": bias, "groups": a.get("group", 1)}
        return accumulate.conv(conv, kw, chunk, op == "ConvTranspose")
    return round_fp16(run(ins, torch.float32)[0])


def onnx_program(model: onnx.ModelProto, like: Program | None = None, lazy: bool = False) -> Program:
    """``model`` as the runner's :class:`~.runner.Program` (``stored``: its large initializers' protos and tensors).
    ``like``: the program of the model this one was folded from: an initializer equal to one it stored (protobuf
    fields compared in C, not read into Python) is that tensor, held once and rounded once by runners that share.
    ``lazy``: an initializer a streamed load left on disk (``load_onnx(path, stream=True)``) of at least
    :data:`bnfold.fold_math.LARGE_BYTES` is a :class:`~.lazy.LazyConstant`, read when a step reads it (for
    :func:`~.ranges.run_plain`; a value constant ops compute from one is read and held)."""
    nodes = node_fields(model)
    mine, before = _large_initializers(model, nodes), like.stored if like is not None else {}
    reused = {k: before[k][1] for k, t in mine.items() if k in before and before[k][0] == t}
    read: dict = {k: v.numpy() for k, v in reused.items()}
    unread = _unread(model, nodes) if lazy else {}
    read.update(unread)
    consts = graph_constants(model, nodes, read)
    norms = norms_of(nodes, consts)
    opset = opset_of(model)
    steps = [
        _step(node, (op, ins, outs), name, opset, norms.get(name), consts)
        for node, op, ins, outs, name in nodes
        if op != "Constant"
    ]
    inputs = [i.name for i in graph_inputs(model)]

    def feed(xs: tuple) -> list:
        if len(xs) != len(inputs):
            raise ValueError(f"the model takes {len(inputs)} input(s), got {len(xs)}")
        return [torch.as_tensor(x) for x in xs]

    floats = {k: _held(v, reused.get(k), read.get(k)) for k, v in consts.items()}
    stored = {k: (t, floats[k]) for k, t in mine.items() if k in floats and k not in unread}
    return Program(steps, floats, inputs, [o.name for o in model.graph.output], feed, stored)


def _held(v, reused: torch.Tensor | None, read) -> torch.Tensor | LazyConstant:
    """A constant of :func:`graph_constants` as the program holds it: the tensor it reused, a lazy one as it is."""
    if isinstance(v, LazyConstant):
        return v
    return reused if reused is not None and v is read else _tensor(v)


def _unread(model: onnx.ModelProto, nodes: list[tuple]) -> dict[str, LazyConstant]:
    """The initializers left on disk by a streamed load of at least :data:`bnfold.fold_math.LARGE_BYTES` (their size
    from the dims the load checked against the stored bytes), which no node writes and no caller can override,
    unread."""
    inputs = {i.name for i in model.graph.input}
    names = Counter([t.name for t in model.graph.initializer] + [o for *_, outs, _ in nodes for o in outs])
    out = {}
    for t in model.graph.initializer:
        if names[t.name] != 1 or t.name in inputs or t.data_type not in _FLOATS or not streamed(t):
            continue
        nbytes = math.prod(t.dims) * onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
        if nbytes >= fold_math.LARGE_BYTES:
            out[t.name] = LazyConstant(partial(array, t), _owned, nbytes, stored_key(t))
    return out


def _owned(arr: np.ndarray) -> torch.Tensor:
    """:func:`_tensor` of an array read into a buffer of its own: a float array as it is (no copy)."""
    if arr.dtype.kind == "f" and arr.dtype.isnative and arr.flags.writeable and arr.flags.c_contiguous:
        return torch.from_numpy(arr)
    return _tensor(arr)


def _large_initializers(model: onnx.ModelProto, nodes: list[tuple]) -> dict[str, onnx.TensorProto]:
    """The initializers larger than the constants the runner rounds together whose name nothing else writes."""
    names = Counter([t.name for t in model.graph.initializer] + [o for *_, outs, _ in nodes for o in outs])
    return {t.name: t for t in model.graph.initializer if names[t.name] == 1 and math.prod(t.dims) > ROUNDED_TOGETHER}


class OnnxEmulator(Runner):
    """Runs the ONNX ``model`` under ``profile`` (see :class:`~.runner.Runner`); segments and errors are
    keyed by ONNX value name."""

    def __init__(self, model: onnx.ModelProto, profile: str | Profile = "fp16", bn_eps=None, segments=None):
        self.model = model
        super().__init__(onnx_program(model), profile, bn_eps, segments)


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


def random_batches(model: onnx.ModelProto, input_shapes: dict | None, n: int = 1, seed: int = 0) -> list[tuple]:
    """``n`` batches of standard-normal inputs shaped by :func:`input_shapes_of` (an open batch dim is 1)."""
    shapes = input_shapes_of(model, input_shapes)
    for name, dims in shapes.items():
        if any(d is None for d in dims[1:]):
            shown = ",".join("?" if d is None else str(d) for d in dims)
            raise ValueError(
                f"input {name!r} has open dims [{shown}]; give its shape (input_shapes={{{name!r}: (1, ...)}}, "
                f"--input-shape {name}:1,...) or --inputs"
            )
    g = torch.Generator().manual_seed(seed)
    return [
        tuple(torch.randn([1 if d is None else d for d in dims], generator=g) for dims in shapes.values())
        for _ in range(n)
    ]


def check_batches(model: onnx.ModelProto, batches: list[tuple], input_shapes: dict | None) -> None:
    """Each batch fits the model's inputs (their fixed dims and ``input_shapes``)."""
    shapes = input_shapes_of(model, input_shapes)
    for b in batches:
        if len(b) != len(shapes):
            raise ValueError(f"the model takes {len(shapes)} input(s) ({', '.join(shapes)}), a batch holds {len(b)}")
        for (name, dims), x in zip(shapes.items(), b):
            got = list(torch.as_tensor(x).shape)
            if len(got) != len(dims) or any(d is not None and d != g for d, g in zip(dims, got)):
                shown = ["?" if d is None else d for d in dims]
                raise ValueError(f"input {name!r} takes shape {shown}; a batch holds {got}")


class OnnxAudit:
    """The audit hooks of an ONNX model (:class:`~.runner.AuditFormat`).  The cost plan reads each node's fields once
    (:func:`~bnfold.onnx.const_eval.node_fields`); a program reads the model as it is then (a cache of the plan's read
    across the two calls would need a check that the nodes were not edited in between, and the cheapest, a digest of
    their bytes, cost 10x the read it saved: 16 ms against 1.5 ms on PP-OCRv4 rec, its ``Constant`` nodes' data)."""

    #: an op the audit cannot run (:class:`UnsupportedOp`), inputs that do not fit the model, an op that fails
    cannot_run: tuple[type[Exception], ...] = (NotImplementedError, ValueError)

    def prepare(
        self, model, inputs, *, input_shapes=None, name=None, random_inputs=False, runtime=None, fold=True, hold=None
    ):
        """Random batches shaped by ``input_shapes`` when ``inputs`` is None."""
        if inputs is None:
            batches = random_batches(model, input_shapes, RANDOM_BATCHES)
        else:
            batches = as_batches(inputs)
            check_batches(model, batches, input_shapes)
        plan = self.plan(model, batches, runs=3, name=name, hold=hold)
        return model, batches, name or model.graph.name or "model", random_inputs or inputs is None, plan

    def plan(self, model, batches: list[tuple], *, runs: int, name: str | None, hold=None) -> Plan:
        # counts three runs, whatever ``runs`` says
        return onnx_audit_plan(model, batches, name or "the model", hold, node_fields(model))

    def program(self, model, like: Program | None = None, lazy: bool = False) -> Program:
        """The program of ``model`` (see :func:`onnx_program`), its nodes read now."""
        return onnx_program(model, like, lazy)

    def output_rank(self, model) -> int | None:
        """The rank the graph declares for its first output (None: not declared)."""
        outs = model.graph.output
        if not outs or not outs[0].type.tensor_type.HasField("shape"):
            return None
        return len(outs[0].type.tensor_type.shape.dim)
