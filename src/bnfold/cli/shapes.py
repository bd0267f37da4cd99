"""``--input-shape NAME:1,3,48,320`` (onnxsim's ``--overwrite-input-shape`` convention): fixed shapes for
the inputs of an ONNX model whose dims are left open (``batch``, ``height`` ...)."""

from __future__ import annotations

import argparse

from ..errors import BnfoldError


def input_shape(text: str) -> tuple[str, tuple[int, ...]]:
    """One ``--input-shape`` value: ``NAME:D0,D1,...`` with positive integers (the last ``:`` splits,
    so an ONNX input name may hold one)."""
    name, sep, dims = text.rpartition(":")
    try:
        shape = tuple(int(d) for d in dims.split(","))
    except ValueError:
        shape = ()
    if not sep or not name or not shape or any(d < 1 for d in shape):
        raise argparse.ArgumentTypeError(f"expected NAME:D0,D1,... with positive whole numbers, got {text!r}")
    return name, shape


def input_shapes(values) -> dict[str, tuple[int, ...]]:
    """The repeated ``--input-shape`` values as ``{NAME: (D0, D1, ...)}``; a name given twice is an error."""
    out: dict[str, tuple[int, ...]] = {}
    for name, shape in values or ():
        if name in out and out[name] != shape:
            raise BnfoldError(f"--input-shape gives input {name!r} two shapes: {out[name]} and {shape}")
        out[name] = shape
    return out


def fix_input_shapes(model, shapes: dict[str, tuple[int, ...]], path: str):
    """``model`` (an ``onnx.ModelProto``, changed in place) with the dims of its inputs set to ``shapes``.

    Every name must be a graph input (not an initializer), the rank must match, and a dim the model
    already fixes must agree; otherwise a one-line error names the input.
    """
    if not shapes:
        return model
    init = {t.name for t in model.graph.initializer}
    inputs = {i.name: i for i in model.graph.input if i.name not in init}
    unknown = [n for n in shapes if n not in inputs]
    if unknown:
        raise BnfoldError(
            f"{path}: --input-shape names {', '.join(map(repr, unknown))}, which is not an input of the model "
            f"(its inputs: {', '.join(map(repr, inputs)) or 'none'})"
        )
    for name, shape in shapes.items():
        dims = inputs[name].type.tensor_type.shape.dim
        if len(dims) != len(shape):
            raise BnfoldError(
                f"{path}: --input-shape {name}: gives {len(shape)} dims, the model's input has {len(dims)}"
            )
        for k, (d, size) in enumerate(zip(dims, shape)):
            if d.HasField("dim_value") and d.dim_value >= 0 and d.dim_value != size:  # paddle2onnx: -1 is open
                raise BnfoldError(
                    f"{path}: --input-shape {name}: dim {k} is {size}, but the model fixes it to {d.dim_value}"
                )
        for d, size in zip(dims, shape):
            d.dim_value = size  # clears dim_param (a oneof)
    return model


def apply(loaded, args: argparse.Namespace, batches_only: bool = False):
    """The loaded model with ``--input-shape`` applied (ONNX only; an error for a .pt2, unless ``batches_only``:
    the audit shapes a program's random batches with it, within the program's own constraints)."""
    shapes = input_shapes(getattr(args, "input_shape", None))
    if not shapes:
        return loaded.model
    from ..frontends import FRONTENDS, for_kind

    if not for_kind(loaded.kind).open_dims:
        if batches_only:
            return loaded.model
        nouns = " and ".join(f"{f.noun}s" for f in FRONTENDS if f.open_dims)
        raise BnfoldError(f"{loaded.path}: --input-shape is for {nouns} (a .pt2 program has its shapes)")
    return fix_input_shapes(loaded.model, shapes, loaded.path)
