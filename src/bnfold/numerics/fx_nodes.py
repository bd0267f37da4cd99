"""What the numerics tools read from an ExportedProgram beyond the frontend's op tables.

Layers and batch norms are recognized by the torch.export frontend
(:func:`bnfold.torch_export.ops.parse_layer` / ``parse_norm``); this module
adds only what the emulator needs on top:

* ``op_name`` (the frontend's, re-exported): a node's short op name
  (``convolution``), the key of the emulator's own rounding tables;
* ``layer_kind``: the layer kind of a node (the frontend's parse, or the op table's ``Op.layer``:
  a matrix product no fold can change is still a layer to the audit and to fp16 accumulation);
* ``running_stats_norm``: ``parse_norm`` narrowed to eval-mode norms;
* ``reads_layers`` / ``reads_norms``: whether an op's nodes may be either (the others need no parse);
* ``lifted_tensors``: the values behind lifted placeholders.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.export.graph_signature import InputKind

from ..torch_export.ops import LAYERS, NORMS, OPS, Norm, op_key, op_of, parse_layer, parse_norm

_LIFTED_KINDS = (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR, InputKind.CUSTOM_OBJ)


def layer_kind(node: torch.fx.Node) -> str | None:
    """``conv`` / ``conv_transpose`` / ``linear`` for a layer the frontend parses, ``matmul`` for any
    other matrix product (the frontend recognizes an ``mm`` / ``bmm`` as a layer only when its second
    operand is a constant weight it can fold into; ``x @ y`` of two activations is still a reduction
    fp16-acc accumulates in fp16, and a row of the audit), else None."""
    if node.op != "call_function":
        return None
    layer = parse_layer(node)
    if layer is not None:
        return layer.kind
    row = op_of(node)
    return "matmul" if row is not None and row.layer == "matmul" else None


def reads_layers(target: Any) -> bool:
    """Whether a node calling ``target`` may be a layer: :func:`layer_kind` is None for every node of another op."""
    key = op_key(target)
    row = OPS.get(key)
    return key in LAYERS or (row is not None and row.layer == "matmul")


def reads_norms(target: Any) -> bool:
    """Whether a node calling ``target`` may be a batch norm: :func:`running_stats_norm` is None for every node of
    another op."""
    return op_key(target) in NORMS


def running_stats_norm(node: torch.fx.Node) -> Norm | None:
    """The frontend's reading of ``node`` (``parse_norm``) when it is an eval-mode batch norm
    (running statistics); None for any other node.

    A norm the frontend flags with a ``problem`` (training mode, batch statistics) normalizes
    with statistics computed at run time: there is nothing to read ahead of time, and the
    emulator runs the op itself.
    """
    norm = parse_norm(node)
    return norm if norm is not None and not norm.problem else None


def lifted_tensors(ep: torch.export.ExportedProgram) -> tuple[dict[str, Any], list[str]]:
    """``({placeholder name: lifted parameter/buffer/constant}, [user input placeholder names])``,
    read through the program's graph signature."""
    lifted, user = {}, []
    for spec in ep.graph_signature.input_specs:
        name = spec.arg.name
        if spec.kind == InputKind.USER_INPUT:
            user.append(name)
        elif spec.kind in _LIFTED_KINDS:
            if spec.target in ep.state_dict:
                lifted[name] = ep.state_dict[spec.target]
            elif spec.target in ep.constants:
                lifted[name] = ep.constants[spec.target]
            else:
                raise KeyError(f"placeholder {name!r}: {spec.target!r} is in neither state_dict nor constants")
        else:
            raise NotImplementedError(f"placeholder {name!r} of kind {spec.kind.name} is not supported by the emulator")
    return lifted, user
