"""Helpers for the CLI tests: tiny models, hostile .pt2 archives, ONNX builders, output checks."""

from __future__ import annotations

import io
import json
import os
import pickle
import shutil
import zipfile
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn as nn

from bnfold_testutil import onnx_conv_bn  # noqa: F401 (re-exported for the CLI tests)

# ----------------------------------------------------------------------------- torch models


class ConvBN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.bn = nn.BatchNorm2d(4)

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x)))


class BNOnly(nn.Module):
    """A batch norm with no layer to fold into: bnfold must skip it."""

    def __init__(self):
        super().__init__()
        self.bn = nn.BatchNorm2d(3)

    def forward(self, x):
        return torch.relu(self.bn(x))


class ConvReLU(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x):
        return torch.relu(self.conv(x))


class Dynamic(nn.Module):
    """Symbolic shapes, a guard, a lifted constant and a non-persistent buffer: all legitimate."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, stride=2)
        self.bn = nn.BatchNorm2d(4)
        self.register_buffer("scale", torch.ones(4), persistent=False)
        self.shift = torch.randn(4)

    def forward(self, x):
        h = self.bn(self.conv(x)) * self.scale.view(1, 4, 1, 1) + self.shift.view(1, 4, 1, 1)
        return h.mean((2, 3))


def randomize_bn(module: nn.Module, seed: int = 0) -> nn.Module:
    g = torch.Generator().manual_seed(seed)
    for m in module.modules():
        if isinstance(m, nn.BatchNorm2d):
            c = m.num_features
            m.running_mean.copy_(torch.rand(c, generator=g) - 0.5)
            m.running_var.copy_(torch.rand(c, generator=g) + 0.5)
            m.weight.data.copy_(torch.rand(c, generator=g) + 0.5)
            m.bias.data.copy_(torch.rand(c, generator=g) - 0.5)
    return module.eval()


EXAMPLE_SHAPE = (2, 3, 8, 8)


def export_to(path: Path, module: nn.Module, x: torch.Tensor | None = None, dynamic_shapes=None) -> Path:
    torch.manual_seed(0)
    x = torch.randn(EXAMPLE_SHAPE) if x is None else x
    ep = torch.export.export(randomize_bn(module), (x,), dynamic_shapes=dynamic_shapes)
    torch.export.save(ep, str(path))
    return path


def norm_count(ep) -> int:
    return sum(1 for n in ep.graph.nodes if n.op == "call_function" and "batch_norm" in str(n.target))


def copy_to(src: Path, folder: Path, name: str | None = None) -> Path:
    dst = folder / (name or src.name)
    shutil.copyfile(src, dst)
    return dst


# ----------------------------------------------------------------------------- hostile archives


class Evil:
    """Unpickling this evaluates ``code`` (a payload that touches a marker file)."""

    def __init__(self, code: str):
        self.code = code

    def __reduce__(self):
        return (eval, (self.code,))


def touch_code(marker: Path, result: str = "None") -> str:
    """A Python expression that creates ``marker`` and evaluates to ``result``."""
    return f"(__import__('pathlib').Path({str(marker)!r}).touch(), {result})[1]"


def torch_saved(obj) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def read_entries(path: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(path) as z:
        return {i.filename: z.read(i.filename) for i in z.infolist()}


def write_entries(path: Path, entries: dict[str, bytes] | list[tuple[str, bytes]]) -> Path:
    items = entries.items() if isinstance(entries, dict) else entries
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        for name, data in items:
            z.writestr(name, data)
    return path


def root_of(entries: dict[str, bytes]) -> str:
    return next(iter(entries)).split("/", 1)[0]


def rewrite(src: Path, dst: Path, edit: Callable[[dict[str, bytes], str], None]) -> Path:
    """Copy a .pt2 archive, letting ``edit(entries, root)`` change its entries."""
    entries = read_entries(src)
    edit(entries, root_of(entries))
    return write_entries(dst, entries)


def _edit_json(entries: dict[str, bytes], name: str, change: Callable[[dict], None]) -> None:
    doc = json.loads(entries[name])
    change(doc)
    entries[name] = json.dumps(doc).encode()


def hostile_sample_inputs(src: Path, dst: Path, marker: Path) -> Path:
    """Sample inputs whose pickle runs code; torch retries it with weights_only=False."""

    def edit(e, root):
        e[f"{root}/data/sample_inputs/model.pt"] = torch_saved(
            Evil(touch_code(marker, f"((__import__('torch').randn{EXAMPLE_SHAPE},), {{}})"))
        )

    return rewrite(src, dst, edit)


def hostile_pickled_weight(src: Path, dst: Path, marker: Path) -> Path:
    """A weight marked use_pickle: torch.load(..., weights_only=False)."""

    def edit(e, root):
        cfg_name = f"{root}/data/weights/model_weights_config.json"
        cfg = json.loads(e[cfg_name])
        fqn, meta = next(iter(cfg["config"].items()))
        meta["use_pickle"] = True
        shape = [s["as_int"] for s in meta["tensor_meta"]["sizes"]]
        e[f"{root}/data/weights/{meta['path_name']}"] = torch_saved(
            Evil(touch_code(marker, f"__import__('torch').nn.Parameter(__import__('torch').randn({shape}))"))
        )
        e[cfg_name] = json.dumps(cfg).encode()

    return rewrite(src, dst, edit)


def hostile_constant(src: Path, dst: Path, marker: Path, prefix: str) -> Path:
    """A constant stored as ``opaque_obj_*`` (pickle.loads) or ``custom_obj_*`` (TorchScript unpickler)."""

    def edit(e, root):
        name = f"{prefix}0"
        _edit_json(
            e,
            f"{root}/data/constants/model_constants_config.json",
            lambda d: d["config"].update(
                {"evil": {"path_name": name, "is_param": False, "use_pickle": True, "tensor_meta": None}}
            ),
        )
        e[f"{root}/data/constants/{name}"] = pickle.dumps(Evil(touch_code(marker)))

    return rewrite(src, dst, edit)


def hostile_sym_expr(src: Path, dst: Path, marker: Path) -> Path:
    """A symbolic size whose expr_str sympy.sympify evaluates as Python on load."""

    def edit(e, root):
        def change(d):
            tv = d["graph_module"]["graph"]["tensor_values"]
            first = next(iter(tv.values()))
            first["sizes"][0] = {"as_expr": {"expr_str": touch_code(marker, "1"), "hint": {"as_int": 1}}}

        _edit_json(e, f"{root}/models/model.json", change)

    return rewrite(src, dst, edit)


def hostile_guard(src: Path, dst: Path, marker: Path) -> Path:
    """guards_code that ExportedProgram.module() execs (and runs on every call)."""

    def edit(e, root):
        _edit_json(e, f"{root}/models/model.json", lambda d: d.update(guards_code=[touch_code(marker, "True")]))

    return rewrite(src, dst, edit)


def hostile_node_target(src: Path, dst: Path) -> Path:
    """A graph node whose target resolves, via getattr on torch, to os.system."""

    def edit(e, root):
        def change(d):
            d["graph_module"]["graph"]["nodes"].insert(
                0,
                {
                    "target": "torch.serialization.os.system",
                    "inputs": [{"name": "", "arg": {"as_string": "true"}, "kind": 1}],
                    "outputs": [],
                    "metadata": {},
                },
            )

        _edit_json(e, f"{root}/models/model.json", change)

    return rewrite(src, dst, edit)


def hostile_aoti(src: Path, dst: Path) -> Path:
    def edit(e, root):
        e[f"{root}/data/aotinductor/model/model.so"] = b"\x7fELF not really"

    return rewrite(src, dst, edit)


def hostile_legacy_pickle(src: Path, dst: Path, marker: Path) -> Path:
    """Sample inputs as a bare (non-zip) pickle: torch.load's legacy path unpickles it."""

    def edit(e, root):
        e[f"{root}/data/sample_inputs/model.pt"] = pickle.dumps(Evil(touch_code(marker)), protocol=2)

    return rewrite(src, dst, edit)


def hostile_duplicate(src: Path, dst: Path) -> Path:
    """Two entries with one name: Python's zipfile and torch's reader pick different ones."""
    entries = read_entries(src)
    root = root_of(entries)
    items = list(entries.items()) + [(f"{root}/models/model.json", b"{}")]
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zipfile warns about the duplicate name
        return write_entries(dst, items)


def legacy_layout(src: Path, dst: Path, marker: Path) -> Path:
    """A pre-2.7 style zip: torch.export.load falls back to it and unpickles with weights_only=False."""
    entries = read_entries(src)
    root = root_of(entries)
    return write_entries(
        dst,
        {
            "version": b"8.20",
            "serialized_exported_program.json": entries[f"{root}/models/model.json"],
            "serialized_state_dict.pt": torch_saved(Evil(touch_code(marker, "{}"))),
            "serialized_constants.pt": torch_saved({}),
            "serialized_example_inputs.pt": entries[f"{root}/data/sample_inputs/model.pt"],
        },
    )


# ----------------------------------------------------------------------------- ONNX models


def save_onnx_external(model, path: Path, location: str) -> Path:
    import onnx

    onnx.save_model(
        model, str(path), save_as_external_data=True, all_tensors_to_one_file=True, location=location, size_threshold=0
    )
    return path


def set_external_location(path: Path, location: str) -> None:
    """Point every external tensor of the model at ``location`` (without touching data files)."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    for t in model.graph.initializer:
        for e in t.external_data:
            if e.key == "location":
                e.value = location
    path.write_bytes(model.SerializeToString())


def run_onnx(path: Path, x):
    import onnxruntime as ort

    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return sess.run(None, {sess.get_inputs()[0].name: x})[0]


# ----------------------------------------------------------------------------- checks


def listing(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir()}


def one_error_line(stderr: str, *must_contain: str) -> str:
    """stderr is exactly one ``bnfold: error:`` line, without a traceback, containing each string."""
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, f"expected one line on stderr, got:\n{stderr}"
    line = lines[0]
    assert line.startswith("bnfold: error: "), line
    assert "Traceback" not in stderr
    for text in must_contain:
        assert text in line, f"{text!r} not in {line!r}"
    return line


def mode_of(path: Path) -> int:
    return os.stat(path).st_mode & 0o777


class StrInput(nn.Module):
    """A program with constant (int, str) user inputs."""

    def forward(self, x, n: int, mode: str):
        return x * n if mode == "mul" else x + n


def export_str_input(path: Path) -> Path:
    ep = torch.export.export(StrInput(), (torch.randn(EXAMPLE_SHAPE), 3, "mul"))
    torch.export.save(ep, str(path))
    return path


def hostile_string_input(src: Path, dst: Path, marker: Path) -> Path:
    """A constant string input that ExportedProgram.module() pastes into guard code: L['mode'] == '<value>'."""

    def edit(e, root):
        def change(d):
            for inp in d["graph_module"]["graph"]["inputs"]:
                if "as_string" in inp:
                    inp["as_string"] = f"' or {touch_code(marker)} or '"

        _edit_json(e, f"{root}/models/model.json", change)

    return rewrite(src, dst, edit)


def hostile_name(src: Path, dst: Path, marker: Path) -> Path:
    """Rename the input ``x`` so that torch.fx's generated ``def forward(..., x=<code>)`` runs code on load."""

    def edit(e, root):
        name = f"{root}/models/model.json"
        e[name] = e[name].replace(b'"x"', json.dumps(f"x={touch_code(marker)}").encode())

    return rewrite(src, dst, edit)


class LongNames(nn.Module):
    """Three conv+BN blocks under a long attribute name: every exported node name is longer than 28
    characters and the names differ only after it (TorchScript: ``/feature_extractor/feature_extractor.2/...``;
    dynamo: ``node__native_batch_norm_legit_no_training_2``...)."""

    def __init__(self):
        super().__init__()
        self.feature_extractor = nn.Sequential(
            *(
                nn.Sequential(nn.Conv2d(4 if i else 3, 4, 3, padding=1, bias=False), nn.BatchNorm2d(4), nn.ReLU())
                for i in range(3)
            )
        )

    def forward(self, x):
        return self.feature_extractor(x)


def export_onnx_to(path: Path, module: nn.Module, x: torch.Tensor, dynamo: bool) -> Path:
    """``module`` (eval mode, BatchNorm statistics randomized) as ONNX with its BatchNormalization nodes kept, by the
    dynamo exporter (``optimize=False``) or the TorchScript one (no constant folding)."""
    module = randomize_bn(module).eval()
    if dynamo:
        torch.onnx.export(module, (x,), str(path), dynamo=True, optimize=False, verbose=False, input_names=["x"])
    else:
        torch.onnx.export(
            module,
            (x,),
            str(path),
            dynamo=False,
            do_constant_folding=False,
            training=torch.onnx.TrainingMode.PRESERVE,
            input_names=["x"],
            opset_version=17,
        )
    return path
