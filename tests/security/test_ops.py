"""Channel 2: a graph may call only operators on bnfold's allowlist (derived from torch's schemas).

``bnfold audit`` executes the graph; a node retargeted to ``aten.from_file``
(``shared=True`` writes the file) or to a predispatch / functorch helper, or to
``_operator.setitem``, is refused before torch loads the program.
"""

from __future__ import annotations

import crafted as c
import pytest
import torch

from bnfold.io.pt2 import ops as op_allowlist

FROM_FILE_INPUTS = [
    {"name": "filename", "arg": {"as_string": "PWNED"}, "kind": 1},
    {"name": "shared", "arg": {"as_bool": True}, "kind": 1},
    {"name": "size", "arg": {"as_int": 4}, "kind": 1},
]


def _retarget(target, inputs=None):
    def edit(doc):
        node = next(n for n in doc["graph_module"]["graph"]["nodes"] if "conv" in n["target"])
        node["target"] = target
        if inputs is not None:
            node["inputs"] = inputs

    return edit


CASES = {
    "aten.from_file": _retarget("torch.ops.aten.from_file.default", FROM_FILE_INPUTS),
    "predispatch helper": _retarget("torch._functorch.predispatch._add_batch_dim"),
    "in-place op": _retarget("torch.ops.aten.add_.Tensor"),
    "operator.setitem": _retarget("_operator.setitem"),
}


def test_side_effect_ops_are_refused_and_run_nothing(programs, tmp_path):
    bad = {
        name: c.edit_program(programs["conv_bn"], tmp_path / f"bad{i}.pt2", edit)
        for i, (name, edit) in enumerate(CASES.items())
    }
    argvs = []
    for path in bad.values():
        argvs += [["fold", path, "-o", tmp_path / "out.pt2"], ["check", path], ["audit", path, "--random", "1"]]
    runs = c.run_bnfold(tmp_path, *argvs)
    for r in runs:
        c.assert_refused(r, "refusing to load", "allowlist")
    assert not (tmp_path / "out.pt2").exists()
    assert not (tmp_path / "PWNED").exists()


def test_allowlist_is_side_effect_free_by_construction():
    ops = op_allowlist.allowed_overloads()
    names = {str(op) for op in ops}
    assert len(ops) > 300  # derived from torch's tags and composites, not typed in
    for op in ops:
        schema = op._schema
        assert not schema.is_mutable, op
        assert schema.returns or op_allowlist.is_assertion(op), op
        assert not any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments), op
        paths = [a for a in schema.arguments if a.name in op_allowlist.PATH_ARGUMENTS]
        assert all(str(a.type) in op_allowlist.INT_LISTS for a in paths), op  # einsum's int[]? path only
        assert op.namespace in op_allowlist.OP_NAMESPACES, op
    assert "aten.from_file.default" not in names
    assert not any(n.split(".")[1].endswith("_") and not n.split(".")[1].startswith("_") for n in names)
    assert {"aten.conv2d.default", "aten.batch_norm.default", "aten.linear.default"} <= names
    for name in op_allowlist.HIGHER_ORDER:
        assert hasattr(torch.ops.higher_order, name), name  # the hand-kept part names real operators


@pytest.mark.parametrize(
    "target, allowed",
    [
        ("torch.ops.aten.conv2d.default", True),
        ("torch.ops.aten._native_batch_norm_legit_no_training.default", True),
        ("torch.ops.aten.sym_size.int", True),
        ("_operator.getitem", True),
        ("torch.sym_max", True),
        ("torch.ops.aten.transpose.int", True),  # a view
        ("torch.ops.aten.einsum.default", True),  # its ``int[]? path`` is a contraction order, not a file
        ("executorch.exir.dialects.edge._ops.aten.convolution.default", True),
        ("executorch.exir.dialects.edge._ops.aten.from_file.default", False),
        ("torch.ops.aten.from_file.default", False),
        ("torch.ops.aten.add_.Tensor", False),
        ("torch.ops.aten.add.out", False),
        ("torch.ops.aten._assert_tensor_metadata.default", True),  # returns nothing, but only raises
        ("torch.ops.aten._print.default", False),  # returns nothing
        ("torch.ops.aten._native_batch_norm_legit.default", False),  # writes the running stats
        ("torch.ops.higher_order.with_effects", False),
        ("torch._functorch.predispatch._add_batch_dim", False),
        ("torch._C._set_grad_enabled", False),
        ("torch.ops.load_library", False),
        ("_operator.setitem", False),
        ("#custom.op", False),
    ],
)
def test_allowlist_entries(target, allowed):
    assert op_allowlist.target_is_allowed(target) is allowed


def test_real_programs_use_only_allowed_ops(programs):
    import json
    import zipfile

    for path in programs.values():
        with zipfile.ZipFile(path) as z:
            doc = json.loads(z.read(next(n for n in z.namelist() if n.endswith("models/model.json"))))
        for node in doc["graph_module"]["graph"]["nodes"]:
            assert op_allowlist.target_is_allowed(node["target"]), (path.name, node["target"])
