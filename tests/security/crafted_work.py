"""Crafted files for issue 20 (bounded execution): each small, each asking bnfold for work or memory far
beyond its content, or malformed in a way that used to end in exit 3.

Every builder takes a folder and returns the path it wrote.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import crafted as c
import numpy as np
import torch
from onnx import TensorProto, helper, numpy_helper
from torch import nn

X = torch.randn(2, 3, 8, 8)


class _Extra(nn.Module):
    """Conv -> BN, plus ``extra(x)`` added to the output (a scalar, so shapes stay)."""

    def __init__(self, extra, conv: nn.Module | None = None):
        super().__init__()
        self.conv = conv or nn.Conv2d(3, 4, 3)
        self.bn = nn.BatchNorm2d(4)
        self.extra = extra

    def forward(self, x):
        y = self.bn(self.conv(x))
        return y + self.extra(x) if self.extra is not None else y


def _matmuls(x):
    a = torch.ones(2048, 2048) * x.mean()
    for _ in range(40):
        a = a @ a
    return a.mean()


#: channel 1: the audit's ops take their sizes from the file (each export is a few KB)
AUDIT_EXTRAS = {
    "full": lambda x: torch.zeros(1 << 16, 1 << 16).sum(),
    "expand-clone": lambda x: x[:1, :1, :1, :1].expand(1, 1, 1 << 16, 1 << 16).clone().sum(),
    "repeat": lambda x: x.repeat(1, 1, 4096, 4096).sum(),
    "upsample": lambda x: nn.functional.interpolate(x, scale_factor=4096.0).sum(),
    "matmul-chain": _matmuls,
}


def audit_program(d: Path, name: str) -> Path:
    if name == "conv-padding":
        module = _Extra(None, nn.Conv2d(3, 4, 3, padding=30000))
    else:
        module = _Extra(AUDIT_EXTRAS[name])
    return c.export(d / f"{name}.pt2", module, (X,))


class ComputedWeight(nn.Module):
    """The conv weight computed from a 1-element parameter: 5 float64 constants of 72 MB each, alive at
    once (each is read again at the end, so none is freed before the last is made)."""

    def __init__(self):
        super().__init__()
        self.p = nn.Parameter(torch.ones(1, 1))
        self.bn = nn.BatchNorm2d(4)

    def forward(self, x):
        a = self.p.expand(3000, 3000)
        values = [a]
        for _ in range(4):
            a = a * 1.0001
            values.append(a)
        w = sum(v[:4, :27] for v in values).reshape(4, 3, 3, 3)
        return self.bn(nn.functional.conv2d(x, w))


class WhileLoop(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.bn = nn.BatchNorm2d(4)

    def forward(self, x):
        from torch._higher_order_ops.while_loop import while_loop

        y = self.bn(self.conv(x))
        _, y = while_loop(lambda i, v: i < 3, lambda i, v: (i + 1, v * 0.5), (torch.zeros((), dtype=torch.int64), y))
        return y


class Embed(nn.Module):
    """Integer inputs: an embedding table of 10 rows, then Linear -> BatchNorm1d."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 4)
        self.fc = nn.Linear(4, 4)
        self.bn = nn.BatchNorm1d(4)

    def forward(self, idx):
        return self.bn(self.fc(self.emb(idx)))


# ----------------------------------------------------------------------------- ONNX


def _onnx(d: Path, name: str, m) -> Path:
    return c.save_onnx(m, d / f"{name}.onnx")


def _i64(values, name):
    return numpy_helper.from_array(np.array(values, np.int64), name)


def _side_output(m, node, out="big"):
    m.graph.node.append(node)
    m.graph.output.append(helper.make_tensor_value_info(out, TensorProto.FLOAT, None))
    return m


def onnx_budget(d: Path, name: str) -> Path:
    """Channel 3: sizes that only the broadcast result, a computed shape or a declared dim shows."""
    m = c.onnx_conv_bn()
    g = m.graph
    if name == "expand-broadcast":  # [65536, 1] expanded by the shape [1, 65536]: the shape's product is small
        g.initializer.extend([_i64([1 << 16, 1], "s1"), _i64([1, 1 << 16], "s2")])
        g.node.append(helper.make_node("ConstantOfShape", ["s1"], ["col"], name="col"))
        _side_output(m, helper.make_node("Expand", ["col", "s2"], ["big"], name="grow"))
    elif name == "expand-computed-shape":  # the shape [2**20] * 3 is itself made by an Expand
        g.initializer.extend([_i64([1 << 20], "side"), _i64([3], "three")])
        g.node.append(helper.make_node("Expand", ["side", "three"], ["shape"], name="make_shape"))
        _side_output(m, helper.make_node("ConstantOfShape", ["shape"], ["big"], name="fill"))
    elif name == "broadcast-add":
        for i, shape in enumerate(((4096, 1, 1), (1, 4096, 1), (1, 1, 4096))):
            g.initializer.append(numpy_helper.from_array(np.zeros(shape, np.float32), f"a{i}"))
        g.node.append(helper.make_node("Add", ["a0", "a1"], ["a01"], name="add1"))
        _side_output(m, helper.make_node("Add", ["a01", "a2"], ["big"], name="add2"))
    elif name == "huge-input-dims":
        g.input[0].CopyFrom(helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, 3, 1 << 20, 1 << 20]))
    elif name == "sparse-huge-dims":
        values = numpy_helper.from_array(np.ones(1, np.float32), "sp")
        g.sparse_initializer.append(helper.make_sparse_tensor(values, _i64([0], "sp_idx"), [1 << 20, 1 << 20, 1024]))
    elif name == "resize-open-dims":  # open H/W: only the shapes the audit runs with show the 7 GB Resize
        g.input[0].CopyFrom(helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, 3, "H", "W"]))
        g.output[0].CopyFrom(helper.make_tensor_value_info("Y", TensorProto.FLOAT, None))
        g.initializer.append(numpy_helper.from_array(np.array([1, 1, 3000, 3000], np.float32), "scales"))
        _side_output(m, helper.make_node("Resize", ["X", "", "scales"], ["big"], name="grow"))
    elif name == "const-chain":  # a conv weight computed from a 40 MiB fill: each value passes the load check,
        # the float64 arithmetic of the Mul (400 MiB) does not
        g.initializer.extend([_i64([2560, 4096], "fill_shape"), _i64([4, 3, 3, 3], "w_shape")])
        one = numpy_helper.from_array(np.ones(1, np.float32))
        chain = [
            helper.make_node("ConstantOfShape", ["fill_shape"], ["fill"], name="fill", value=one),
            helper.make_node("Concat", ["fill", "fill"], ["tall"], name="stack", axis=0),
            helper.make_node("ReduceMean", ["tall"], ["row_mean"], name="row_mean", axes=[1]),
            helper.make_node("Mul", ["tall", "row_mean"], ["scaled"], name="scale"),
            helper.make_node("ReduceMean", ["scaled"], ["level"], name="level", keepdims=0),
            helper.make_node("Expand", ["level", "w_shape"], ["W_computed"], name="weight"),
        ]
        for i, node in enumerate(chain):
            g.node.insert(i, node)
        g.node[len(chain)].input[1] = "W_computed"
        del g.initializer[0]  # W
    elif name == "conv-pads":  # a Conv whose pads make a 50 GB output: only the audit runs it
        g.node[0].attribute.append(helper.make_attribute("pads", [30000] * 4))
        g.output[0].type.tensor_type.ClearField("shape")
    return _onnx(d, name, m)


def onnx_malformed(d: Path, name: str) -> Path:
    """Channel 4: tensors whose data does not match their dims or type."""
    m = c.onnx_conv_bn()
    w = m.graph.initializer[0]
    if name == "raw-data-short":
        w.raw_data = w.raw_data[:100]
    elif name == "raw-and-typed":
        w.float_data.extend([0.0] * 108)
    elif name == "string-initializer":
        m.graph.initializer.append(helper.make_tensor("names", TensorProto.STRING, [2], [b"a", b"b"]))
    elif name == "int-mul":  # not malformed: a shape computed by a Mul of integer initializers (the audit failed)
        m.graph.initializer.extend([_i64([1, 4], "i1"), _i64([1, 36], "i2")])
        m.graph.node.append(helper.make_node("Mul", ["i1", "i2"], ["prod"], name="imul"))
        m.graph.node.append(helper.make_node("Reshape", ["Y", "prod"], ["flat"], name="flatten"))
        m.graph.output.append(helper.make_tensor_value_info("flat", TensorProto.FLOAT, [1, 144]))
    return _onnx(d, name, m)


def identity_chain(d: Path, n: int = 2000) -> Path:
    """Channel 2: the conv weight reaches the Conv through ``n`` Identity nodes (legitimate, but deep)."""
    m = c.onnx_conv_bn()
    nodes = [helper.make_node("Identity", ["W" if i == 0 else f"w{i - 1}"], [f"w{i}"], name=f"id{i}") for i in range(n)]
    m.graph.node[0].input[1] = f"w{n - 1}"
    for i, node in enumerate(nodes):
        m.graph.node.insert(i, node)
    return _onnx(d, "identity-chain", m)


# ----------------------------------------------------------------------------- .npz


def npz(d: Path, name: str, arrays: dict) -> Path:
    path = d / f"{name}.npz"
    np.savez(path, **arrays)
    return path


def npz_bomb(d: Path) -> Path:
    """One 64 MiB entry of zeros, deflated to about 64 KB (1000-fold)."""
    path = d / "inflated.npz"
    buf = Path(d / "arr_0.npy")
    np.save(buf, np.zeros((1 << 24, 1), np.float32))
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        z.write(buf, "arr_0.npy")
    buf.unlink()
    return path


def computed_resize(d: Path, scale: float) -> Path:
    """A few hundred bytes of ONNX: ``Resize(x, scales = [1, 1, s, s] + 0 * sum(x))``, scales the graph computes from
    a ``[1, 1, 4, 4]`` input at run time (no plan can size the result: ``[1, 1, 4 s, 4 s]``), then a Relu."""
    import onnx

    nodes = [
        helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
        helper.make_node("Mul", ["s", "zero"], ["z"]),
        helper.make_node("Add", ["base", "z"], ["scales"]),
        helper.make_node("Resize", ["x", "", "scales"], ["y"], mode="nearest"),
        helper.make_node("Relu", ["y"], ["out"]),
    ]
    inits = [
        helper.make_tensor("zero", TensorProto.FLOAT, [], [0.0]),
        helper.make_tensor("base", TensorProto.FLOAT, [4], [1, 1, scale, scale]),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 4, 4])
    out = helper.make_tensor_value_info("out", TensorProto.FLOAT, None)
    g = helper.make_graph(nodes, "g", [x], [out], inits)
    path = d / f"resize_{scale:g}.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), path)
    return path


def getitem_chain(d: Path, n: int) -> Path:
    """The conv weight, ``n + 4`` dimensions (``n`` of size 1), reaches the conv through ``n`` ``getitem(w, 0)``
    nodes: honest metadata, a chain whose length the file sets (its metadata grows as ``n ** 2``)."""
    entries = c.read_entries(c.export(d / "conv-bn.pt2", c.ConvBN(), (X,)))
    model, weights = (
        f"{c.root_of(entries)}/{p}" for p in ("models/model.json", "data/weights/model_weights_config.json")
    )
    doc, config = json.loads(entries[model]), json.loads(entries[weights])
    graph = doc["graph_module"]["graph"]
    meta = graph["tensor_values"]["p_conv_weight"]

    def ones(k: int) -> dict:  # the weight's metadata with k leading dimensions of size 1
        return {
            **meta,
            "sizes": [{"as_int": 1}] * k + meta["sizes"],
            "strides": [{"as_int": 108}] * k + meta["strides"],
        }

    graph["tensor_values"]["p_conv_weight"] = config["config"]["conv.weight"]["tensor_meta"] = ones(n)
    chain, prev = [], "p_conv_weight"
    for i in range(n):
        args = [{"as_tensor": {"name": prev}}, {"as_int": 0}]
        prev = f"item_{i}"
        outputs = [{"as_tensor": {"name": prev}}]
        chain.append({"target": "_operator.getitem", "inputs": [{"name": "", "arg": a, "kind": 1} for a in args]})
        chain[-1].update(outputs=outputs, metadata={})
        graph["tensor_values"][prev] = ones(n - 1 - i)
    conv = next(node for node in graph["nodes"] if "conv" in node["target"])
    conv["inputs"][1]["arg"]["as_tensor"]["name"] = prev
    graph["nodes"][:0] = chain
    entries[model], entries[weights] = json.dumps(doc).encode(), json.dumps(config).encode()
    return c.write_entries(d / f"getitem-chain-{n}.pt2", entries)
