"""A float64 interpreter of ONNX graphs for the tests: each node computed by the library's one copy
of ONNX op semantics (``bnfold.onnx.semantics``) in float64, with ``If`` and ``Loop`` here.

ONNX Runtime has no float64 Conv/ConvTranspose and onnx's own reference evaluator mishandles
grouped ConvTranspose, so the tests compute references this way.  Every test also checks that ORT
running the original model agrees with this interpreter, and ``test_onnx_semantics.py`` checks every
op against ORT and ``onnx.reference``, so a mistake here cannot pass silently.
"""

from __future__ import annotations

import numpy as np
import onnx
import torch
from onnx import numpy_helper

from bnfold.onnx.semantics import attrs, bind, constant, opset_of


def _t(a) -> torch.Tensor:
    a = np.asarray(a)
    if a.dtype.kind == "f" or a.dtype.name == "bfloat16":
        return torch.from_numpy(a.astype(np.float64))
    if a.dtype == np.bool_:
        return torch.from_numpy(a.copy())
    return torch.from_numpy(a.astype(np.int64))


def run(model: onnx.ModelProto, feeds: dict) -> list[torch.Tensor]:
    """The model's outputs computed in float64 (integers stay int64)."""
    return _graph(model.graph, {}, {k: _t(v) for k, v in feeds.items()}, opset_of(model))


def _graph(g: onnx.GraphProto, outer: dict, feeds: dict, opset: int | None) -> list[torch.Tensor]:
    env = dict(outer)
    for t in g.initializer:
        env[t.name] = _t(numpy_helper.to_array(t))
    for i in g.input:
        if i.name in feeds:
            env[i.name] = feeds[i.name]
    for node in g.node:
        ins = [env[n] if n else None for n in node.input]
        outs = _node(node, ins, env, opset)
        for name, v in zip(node.output, outs):
            if name:
                env[name] = v
    return [env[o.name] for o in g.output]


def _node(node: onnx.NodeProto, ins: list, env: dict, opset: int | None) -> list[torch.Tensor]:
    a = attrs(node)
    if node.op_type == "Constant":
        return [_t(constant(a))]
    if node.op_type == "If":
        return _graph(a["then_branch"] if bool(ins[0].reshape(-1)[0]) else a["else_branch"], env, {}, opset)
    if node.op_type == "Loop":
        return _loop(ins, a, env, opset)
    op = bind(node, opset)
    assert op.emulated, f"no float64 implementation of {node.op_type}: {op.why}"
    return op(ins, a, torch.float64)


def _loop(ins: list, a: dict, env: dict, opset: int | None) -> list[torch.Tensor]:
    """Loop with loop-carried values only (no scan outputs)."""
    body = a["body"]
    trips = int(ins[0].reshape(-1)[0]) if ins[0] is not None else 2**31
    cond = bool(ins[1].reshape(-1)[0]) if len(ins) > 1 and ins[1] is not None else True
    state = list(ins[2:])
    i = 0
    while i < trips and cond:
        feeds = {body.input[0].name: torch.tensor(i), body.input[1].name: torch.tensor(cond)}
        feeds.update({v.name: s for v, s in zip(body.input[2:], state)})
        out = _graph(body, env, feeds, opset)
        cond, state = bool(out[0]), out[1:]
        i += 1
    return state
