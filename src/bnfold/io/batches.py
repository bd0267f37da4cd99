"""Input batches for ``bnfold audit``: random ones shaped like the program's example inputs, or
arrays from an ``.npz`` file (read by :func:`bnfold.io.npz.read_npz`) split into batches."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import BnfoldError, ModelFileError
from .npz import read_npz


@dataclass
class InputSpec:
    """One positional user input: its name and an example value (a tensor, or a Python scalar)."""

    name: str
    example: Any


def user_input_names(ep) -> list[str]:
    from torch.export.graph_signature import InputKind

    return [s.arg.name for s in ep.graph_signature.input_specs if s.kind == InputKind.USER_INPUT]


def input_specs(ep) -> list[InputSpec]:
    """The program's positional inputs with an example of each (``ep.example_inputs``, else placeholder metadata)."""
    import torch

    names = user_input_names(ep)
    example = getattr(ep, "example_inputs", None)
    if example:
        args, kwargs = example
        if kwargs:
            raise BnfoldError(
                f"the program takes keyword inputs ({', '.join(kwargs)}); bnfold audit feeds positional inputs only"
            )
        flat = list(args)
        if any(isinstance(a, (list, tuple, dict)) for a in flat):
            raise BnfoldError(
                "the program takes nested inputs (lists/tuples/dicts); bnfold audit feeds flat tensors only"
            )
        if len(names) != len(flat):
            names = [f"arg{i}" for i in range(len(flat))]
        return [InputSpec(n, a) for n, a in zip(names, flat)]
    placeholders = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
    specs = []
    for name in names:
        val = placeholders[name].meta.get("val") if name in placeholders else None
        if not isinstance(val, torch.Tensor):
            raise BnfoldError(f"the program has no example for input {name}; pass --inputs FILE.npz")
        try:
            shape = tuple(int(s) for s in val.shape)
        except Exception:  # noqa: BLE001 - torch raises several kinds for a symbolic size
            raise BnfoldError(f"input {name} has a symbolic shape and no example; pass --inputs FILE.npz") from None
        specs.append(InputSpec(name, torch.zeros(shape, dtype=val.dtype)))
    return specs


def random_batches(ep, n: int, seed: int = 0, shapes: dict[str, tuple[int, ...]] | None = None) -> list[tuple]:
    """``n`` batches shaped like the program's example inputs, from a fixed seed; ``shapes`` (``--input-shape``:
    input name -> dims) shapes those inputs instead, within the program's own constraints
    (:func:`bnfold.io.input_dims.shape_error`)."""
    import torch

    if n < 1:
        raise BnfoldError("--random needs at least 1 batch")
    specs = input_specs(ep)
    dims = _chosen_dims(ep, specs, shapes or {})
    g = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(n):
        batch = []
        for spec in specs:
            x = spec.example
            if not isinstance(x, torch.Tensor):
                batch.append(x)
                continue
            shape = dims.get(spec.name, x.shape)
            if x.dtype.is_complex:
                batch.append(torch.randn(shape, generator=g, dtype=x.dtype))
            elif x.dtype.is_floating_point:
                batch.append(torch.randn(shape, generator=g, dtype=torch.float32).to(x.dtype))
            elif x.dtype == torch.bool:
                batch.append(torch.randint(0, 2, shape, generator=g).bool())
            else:
                lo, hi = (int(x.min()), int(x.max())) if x.numel() else (0, 0)
                batch.append(torch.randint(lo, hi + 1, shape, generator=g, dtype=torch.int64).to(x.dtype))
        batches.append(tuple(batch))
    return batches


def _chosen_dims(ep, specs: list[InputSpec], shapes: dict[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    """``--input-shape``'s ``shapes``, each naming a tensor input of the program, within its constraints."""
    import torch

    from .cost import check_inputs
    from .input_dims import dims_text, shape_error, user_placeholders
    from .sizes import elements

    tensors = [s.name for s in specs if isinstance(s.example, torch.Tensor)]
    unknown = [name for name in shapes if name not in tensors]
    if unknown:
        raise BnfoldError(
            f"--input-shape names {', '.join(map(repr, unknown))}, which is not a tensor input of the program "
            f"(its inputs: {', '.join(map(repr, tensors)) or 'none'})"
        )
    bad = shape_error(ep, shapes)
    if bad is not None:
        name, why = bad
        val = next(n.meta.get("val") for n in user_placeholders(ep) if n.name == name)
        raise BnfoldError(f"--input-shape {name}: {why} (the program's input: [{', '.join(dims_text(ep, val))}])")
    # one batch's bytes against what the weights justify before any is drawn (the plan checks them again, too late
    # for a shape of 1e20 elements on a dynamic dim with no upper bound)
    sizes = {
        s.name: elements(shapes.get(s.name, s.example.shape)) * s.example.element_size()
        for s in specs
        if s.name in tensors
    }
    weights = sum(
        t.numel() * t.element_size()
        for t in (*ep.state_dict.values(), *ep.constants.values())
        if isinstance(t, torch.Tensor)
    )
    check_inputs(sizes, weights, "--input-shape")
    return dict(shapes)


def npz_batches(ep, path: str, arrays: dict | None = None) -> list[tuple]:
    """Batches from an ``.npz``: one array per input, named ``arr_0``.. or by input name, batch axis first
    (``arrays``: the file's, when :func:`read_npz` has read it already; else it is read here).

    An array with one axis more than the input is N batches; one of the input's rank holds samples along the batch
    axis, taken the example's batch size at a time.  Each batch's shapes must be the program's example shapes or,
    where the program leaves dims dynamic, within its own constraints (:func:`bnfold.io.input_dims.shape_error`).
    """
    import numpy as np
    import torch

    from .input_dims import dims_text, shape_error, user_placeholders

    arrays = read_npz(path) if arrays is None else arrays
    specs = input_specs(ep)
    by_name = [s.name for s in specs]
    by_pos = [f"arr_{i}" for i in range(len(specs))]
    if set(arrays) == set(by_name):
        keys = by_name
    elif set(arrays) == set(by_pos):
        keys = by_pos
    else:
        raise ModelFileError(
            f"{path}: expected arrays named {', '.join(by_name)} (or {', '.join(by_pos)}), "
            f"found {', '.join(sorted(arrays))}"
        )
    stated = {n.name: n.meta.get("val") for n in user_placeholders(ep)}
    columns = []
    for key, spec in zip(keys, specs):
        arr = arrays[key]
        ex = spec.example
        if not isinstance(ex, torch.Tensor):
            raise BnfoldError(f"input {spec.name} is not a tensor; it cannot come from an .npz file")
        t = torch.from_numpy(np.ascontiguousarray(arr)).to(ex.dtype)
        shape = tuple(ex.shape)
        val = stated.get(spec.name)
        need = dims_text(ep, val) if isinstance(val, torch.Tensor) else [str(d) for d in shape]
        if t.dim() == len(shape) + 1:
            column = list(t.unbind(0))
        elif t.dim() == len(shape) and len(shape) > 0:
            column = _samples(t, shape[0], path, key, spec.name)
        else:
            column = None
        bad = shape_error(ep, {spec.name: tuple(column[0].shape)}) if column else None
        if column is None or bad is not None:
            why = f" ({bad[1]})" if bad is not None else ""
            raise ModelFileError(
                f"{path}: array {key} has shape {tuple(arr.shape)}; input {spec.name} needs [N, *[{', '.join(need)}]] "
                f"or [N*{shape[0] if shape else 1}, *[{', '.join(need[1:])}]]{why}"
            )
        columns.append(column)
    counts = {len(c) for c in columns}
    if len(counts) != 1:
        raise ModelFileError(f"{path}: the arrays hold different numbers of batches ({sorted(counts)})")
    if counts == {0}:
        raise ModelFileError(f"{path}: the arrays hold no batches")
    bad = shape_error(ep, {s.name: tuple(c[0].shape) for s, c in zip(specs, columns)})  # a symbol shared by inputs
    if bad is not None:
        raise ModelFileError(f"{path}: input {bad[0]}: {bad[1]}")
    return [tuple(col[i] for col in columns) for i in range(counts.pop())]


def _samples(t, batch: int | None, path: str, key: str, name: str) -> list:
    """An array of the input's rank: samples stacked along the batch axis, taken ``batch`` at a time (the
    model's fixed batch size; None, an open batch dim: all of them as one batch)."""
    if batch is None:
        return [t]
    if batch == 0 or t.shape[0] % batch:
        raise ModelFileError(
            f"{path}: array {key} holds {t.shape[0]} samples along the batch axis, not a multiple of input {name}'s "
            f"batch size {batch}; stack the samples as [N*{batch}, ...] or the batches as [N, {batch}, ...]"
        )
    return list(t.split(batch, 0))


def onnx_npz_batches(model, path: str, input_shapes: dict | None = None, arrays: dict | None = None) -> list[tuple]:
    """Batches for an ONNX model from an ``.npz``: one array per graph input (by name, or ``arr_0``..);
    an array with one axis more than the input is that many batches; one of the input's rank holds samples
    along the batch axis, taken the model's batch size at a time (all at once when the batch dim is open),
    as for a torch program (:func:`npz_batches`, and ``arrays`` as there)."""
    import numpy as np
    import torch

    from ..onnx.nodes import graph_inputs

    arrays = read_npz(path) if arrays is None else arrays
    inputs = graph_inputs(model)
    batch = {  # each input's batch dim: --input-shape's, else the model's fixed one, else None (open)
        i.name: next((d.dim_value for d in i.type.tensor_type.shape.dim[:1] if d.dim_value > 0), None) for i in inputs
    }
    batch.update((name, int(dims[0])) for name, dims in (input_shapes or {}).items() if name in batch and dims)
    by_name = [i.name for i in inputs]
    by_pos = [f"arr_{i}" for i in range(len(inputs))]
    keys = by_name if set(arrays) == set(by_name) else by_pos if set(arrays) == set(by_pos) else None
    if keys is None:
        raise ModelFileError(
            f"{path}: expected arrays named {', '.join(by_name)} (or {', '.join(by_pos)}), "
            f"found {', '.join(sorted(arrays))}"
        )
    columns = []
    for key, inp in zip(keys, inputs):
        t = torch.from_numpy(np.ascontiguousarray(arrays[key]))
        t = t.to(torch.float32) if t.is_floating_point() else t
        rank = len(inp.type.tensor_type.shape.dim)
        if t.dim() == rank + 1:
            columns.append(list(t.unbind(0)))
        elif t.dim() == rank:
            columns.append(_samples(t, batch[inp.name] if rank else None, path, key, inp.name))
        else:
            raise ModelFileError(
                f"{path}: array {key} has {t.dim()} axes; input {inp.name} has {rank} (or {rank + 1}: N batches)"
            )
    counts = {len(c) for c in columns}
    if len(counts) != 1 or counts == {0}:
        raise ModelFileError(f"{path}: the arrays hold different numbers of batches, or none ({sorted(counts)})")
    return [tuple(col[i] for col in columns) for i in range(counts.pop())]
