"""Channel 4: no crafted file makes bnfold hang, or use memory out of proportion to its content.

Each file below is built here and fed to ``fold`` / ``check`` / ``audit`` in one
subprocess limited to 2.5 GiB of address space and 90 s of CPU (see
``crafted.run_bnfold``): a regression fails the test instead of taking the
machine down.  Each must be refused with exit 2 and one line that names the
bound it broke (so a MemoryError caught by luck does not pass for a check).
"""

from __future__ import annotations

import json
import os

import crafted as c
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

MIB = 1 << 20


def _guard(doc):
    doc["guards_code"] = ["L['x'].size()[0] ** 10**10**10 == 1"]


def _sym_expr(doc):
    for node in doc["graph_module"]["graph"]["tensor_values"].values():
        for size in node["sizes"]:
            if "as_expr" in size:
                size["as_expr"]["expr_str"] = "Pow(Integer(10), Pow(Integer(10), Integer(10)))"
                return
    raise AssertionError("no symbolic size")


def pt2_cases(programs, d) -> dict:
    """name -> (path, extra argv, words the refusal names)."""
    cases = {
        "guard 10**10**10": (c.edit_program(programs["dynamic"], d / "guard.pt2", _guard), [], "guard"),
        "sympy 10**10**10": (c.edit_program(programs["dynamic"], d / "sym.pt2", _sym_expr), [], "symbolic shape"),
    }
    entries = c.read_entries(programs["conv_bn"])
    root = c.root_of(entries)
    cfg_name = f"{root}/data/weights/model_weights_config.json"
    cfg = json.loads(entries[cfg_name])
    fqn, meta = next(iter(cfg["config"].items()))
    meta["tensor_meta"]["sizes"] = [{"as_int": 1 << 16}, {"as_int": 1 << 16}]
    meta["tensor_meta"]["strides"] = [{"as_int": 1 << 16}, {"as_int": 1}]
    empty = dict(entries, **{cfg_name: json.dumps(cfg).encode(), f"{root}/data/weights/{meta['path_name']}": b""})
    cases["empty record of 16 GiB"] = (c.write_entries(d / "empty.pt2", empty), [], "is empty")

    bomb = dict(entries, **{f"{root}/data/weights/{meta['path_name']}": bytes(64 * MIB)})
    path = c.write_entries(d / "bomb.pt2", bomb, deflate=(f"{root}/data/weights/{meta['path_name']}",))
    assert path.stat().st_size < MIB
    cases["zip bomb"] = (path, [], "-fold (at most 200-fold for entries over 1 MiB); refused as a zip bomb")
    cases["--max-bytes"] = (programs["conv_bn"], ["--max-bytes", "1000"], "--max-bytes")

    deep = dict(entries, **{f"{root}/models/model.json": b"[" * 200_000 + b"]" * 200_000})
    cases["JSON 200k deep"] = (c.write_entries(d / "deep.pt2", deep), [], "nests 200000 levels")
    fifo = d / "fifo.pt2"
    os.mkfifo(fifo)
    cases["FIFO model"] = (fifo, [], "not a regular file")
    return cases


def onnx_cases(d) -> dict:
    cases = {}
    # hundreds of initializers reading the same MiB of one data file
    m = c.onnx_conv_bn()
    (d / "shared.bin").write_bytes(bytes(MIB))
    for i in range(300):
        t = numpy_helper.from_array(np.zeros(MIB // 4, np.float32), f"dup{i}")
        c.set_external(t, "shared.bin", 0, MIB)
        m.graph.initializer.append(t)
    cases["one byte range, 300 tensors"] = (c.save_onnx(m, d / "shared.onnx"), "back one tensor only")

    m = c.onnx_conv_bn()
    m.graph.initializer.append(numpy_helper.from_array(np.array([1 << 20, 1 << 20, 1 << 10], np.int64), "shape"))
    m.graph.node.append(helper.make_node("ConstantOfShape", ["shape"], ["big"], name="fill"))
    m.graph.output.append(helper.make_tensor_value_info("big", TensorProto.FLOAT, None))
    cases["ConstantOfShape 2**50"] = (c.save_onnx(m, d / "fill.onnx"), "ConstantOfShape")

    m = c.onnx_conv_bn()  # Expand of a scalar to 2**50 elements, the shape through an Identity
    m.graph.initializer.append(numpy_helper.from_array(np.array([1 << 20, 1 << 20, 1 << 10], np.int64), "shape"))
    m.graph.initializer.append(numpy_helper.from_array(np.zeros(1, np.float32), "one"))
    m.graph.node.append(helper.make_node("Identity", ["shape"], ["shape2"], name="alias"))
    m.graph.node.append(helper.make_node("Expand", ["one", "shape2"], ["big"], name="grow"))
    m.graph.output.append(helper.make_tensor_value_info("big", TensorProto.FLOAT, None))
    cases["Expand 2**50"] = (c.save_onnx(m, d / "expand.onnx"), "Expand 'grow'")

    m = c.onnx_conv_bn()
    t = TensorProto(name="huge", data_type=TensorProto.FLOAT, dims=[1 << 32, 1 << 32, 16])  # 2**68 wraps to 0
    c.set_external(t, "shared.bin", 0, 0)
    m.graph.initializer.append(t)
    cases["dims overflow int64"] = (c.save_onnx(m, d / "overflow.onnx"), "overflow")

    m = c.onnx_conv_bn()
    m.graph.node[1].input[0] = "loop"
    m.graph.node.insert(1, helper.make_node("Identity", ["loop2"], ["loop"], name="id1"))
    m.graph.node.insert(2, helper.make_node("Identity", ["loop"], ["loop2"], name="id2"))
    cases["Identity cycle"] = (c.save_onnx(m, d / "cycle.onnx"), "cycle")

    m = c.onnx_conv_bn()
    c.set_external(m.graph.initializer[0], "pipe.bin", 0, 432)
    os.mkfifo(d / "pipe.bin")
    cases["FIFO external data"] = (c.save_onnx(m, d / "pipe.onnx"), "not a regular file")
    return cases


PT2_CASES = [
    "guard 10**10**10", "sympy 10**10**10", "empty record of 16 GiB", "zip bomb", "--max-bytes", "JSON 200k deep",
    "FIFO model",
]  # fmt: skip
ONNX_CASES = [
    "one byte range, 300 tensors", "ConstantOfShape 2**50", "Expand 2**50", "dims overflow int64", "Identity cycle",
    "FIFO external data",
]  # fmt: skip


@pytest.fixture(scope="module")
def runs(request, programs, tmp_path_factory):
    """``{case: [result, ...]}`` for the selected cases (all run in one limited subprocess), the words each
    refusal must name, and the output folder."""
    tmp_path = tmp_path_factory.mktemp("bounded")
    d = tmp_path / "in"
    d.mkdir()
    out = tmp_path / "out"
    out.mkdir()
    chosen = set(c.selected(request) or [*PT2_CASES, *ONNX_CASES, "FIFO --inputs"])
    names, argvs, words = [], [], {"FIFO --inputs": "not a regular file"}
    for name, (path, extra, word) in pt2_cases(programs, d).items():
        words[name] = word
        if name in chosen:
            argvs += [["fold", path, "-o", out / "o.pt2", *extra], ["check", path, *extra]]
            argvs += [["audit", path, "--random", "1", *extra]]
            names += [name] * 3
    for name, (path, word) in onnx_cases(d).items():
        words[name] = word
        if name in chosen:
            argvs += [["fold", path, "-o", out / "o.onnx"], ["check", path]]
            names += [name] * 2
    if "FIFO --inputs" in chosen:
        fifo = d / "inputs.npz"
        os.mkfifo(fifo)
        argvs.append(["audit", programs["conv_bn"], "--inputs", fifo])
        names.append("FIFO --inputs")
    results: dict[str, list] = {}
    for name, r in zip(names, c.run_bnfold(tmp_path, *argvs), strict=True):
        results.setdefault(name, []).append(r)
    return results, words, out


@pytest.mark.parametrize("case", [*PT2_CASES, *ONNX_CASES, "FIFO --inputs"])
def test_crafted_file_is_refused_within_bounds(case, runs):
    results, words, out = runs
    for r in results[case]:
        try:
            c.assert_refused(r, words[case])
        except AssertionError as e:
            raise AssertionError(f"{case}: {e}") from None
    assert c.listing(out) == set()
