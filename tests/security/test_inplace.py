"""In-place ops: accepted on intermediates of the graph, refused on state the run does not own.

The loader accepts ``aten.relu_`` / ``aten.add_`` / ``x.view(...).mul_`` ... when the written argument is
a value the graph computed (followed back through views with torch's alias annotations).  A file
that writes a graph input, a parameter, a buffer, a constant, or a view / eval-mode dropout of one,
an ``out=`` into a parameter, or an op that re-points a tensor's memory (``inplace_view``) is
refused without ``--trust``, by fold, check and audit alike.
"""

from __future__ import annotations

import crafted as c
import pytest
import torch
from torch import nn

from bnfold.io.pt2 import inspection, mutation


class InPlace(nn.Module):
    """In-place ops on intermediates only: relu_, a view written through, += of a buffer and a constant."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.bn = nn.BatchNorm2d(4)
        self.register_buffer("scale", torch.ones(4))
        self.shift = torch.randn(4)  # a lifted tensor constant

    def forward(self, x):
        y = self.bn(self.conv(x)).relu_()
        y.view(-1).mul_(2.0)
        y += self.scale.view(1, 4, 1, 1)
        y.add_(self.shift.view(1, 4, 1, 1))
        return y


class WritesInput(nn.Module):
    def forward(self, x):
        x.relu_()
        return x * 2


class WritesInputView(nn.Module):
    def forward(self, x):
        x.view(-1)[:2].mul_(2.0)
        return x * 2


class WritesBuffer(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("count", torch.zeros(4))

    def forward(self, x):
        self.count.add_(1)
        return x + self.count


def _graph(doc):
    return doc["graph_module"]["graph"]


def _node(doc, prefix):
    return next(n for n in _graph(doc)["nodes"] if n["target"].startswith(prefix))


def _input_name(doc, kind):
    """The placeholder name of the first graph input of ``kind`` (parameter, buffer, tensor_constant)."""
    for spec in doc["graph_module"]["signature"]["input_specs"]:
        if kind in spec:
            arg = spec[kind]["arg"]
            return arg["as_tensor"]["name"] if "as_tensor" in arg else arg["name"]
    raise AssertionError(kind)


def _set_arg(node, arg_name, value_name):
    for item in node["inputs"]:
        if item["name"] == arg_name:
            item["arg"] = {"as_tensor": {"name": value_name}}
            return
    raise AssertionError(arg_name)


def _write(kind):
    """relu_ writes the first graph input of ``kind`` instead of the batch norm's output."""

    def edit(doc):
        _set_arg(_node(doc, "torch.ops.aten.relu_"), "self", _input_name(doc, kind))

    return edit


def _view_of(kind):
    """The view that mul_ writes through is a view of a graph input of ``kind``."""

    def edit(doc):
        _set_arg(_node(doc, "torch.ops.aten.view"), "self", _input_name(doc, kind))

    return edit


def _dropout_of_parameter(doc):
    """mul_ writes an eval-mode dropout of a parameter (dropout returns its input then)."""
    view = _node(doc, "torch.ops.aten.view")
    view["target"] = "torch.ops.aten.dropout.default"
    view["inputs"] = [
        {"name": "input", "arg": {"as_tensor": {"name": _input_name(doc, "parameter")}}, "kind": 1},
        {"name": "p", "arg": {"as_float": 0.0}, "kind": 1},
        {"name": "train", "arg": {"as_bool": False}, "kind": 1},
    ]


def _out_into_parameter(doc):
    """The += becomes add.out with out= a parameter."""
    add = _node(doc, "torch.ops.aten.add_")
    add["target"] = "torch.ops.aten.add.out"
    add["inputs"].append({"name": "out", "arg": {"as_tensor": {"name": _input_name(doc, "parameter")}}, "kind": 2})


def _inplace_view(doc):
    """relu_ on the intermediate becomes t_, which re-points the tensor's view (tag inplace_view)."""
    _node(doc, "torch.ops.aten.relu_")["target"] = "torch.ops.aten.t_.default"


CRAFTED = {
    "a parameter": (_write("parameter"), "in place on parameter"),
    "a buffer": (_write("buffer"), "in place on buffer"),
    "a constant": (_write("tensor_constant"), "in place on constant"),
    "a graph input": (_write("user_input"), "in place on graph input"),
    "a view of a parameter": (_view_of("parameter"), "in place on parameter"),
    "a view of a buffer": (_view_of("buffer"), "in place on buffer"),
    "eval-mode dropout of a parameter": (_dropout_of_parameter, "in place on parameter"),
    "out= into a parameter": (_out_into_parameter, "in place on parameter"),
    "an inplace_view op": (_inplace_view, "not on bnfold's operator allowlist"),
}
EXPORTED = {"input": WritesInput, "view of an input": WritesInputView, "buffer": WritesBuffer}


@pytest.fixture(scope="module")
def inplace(tmp_path_factory):
    d = tmp_path_factory.mktemp("inplace")
    x = torch.randn(2, 3, 8, 8)
    files = {"ok": c.export(d / "ok.pt2", InPlace(), (x,))}
    for name, cls in EXPORTED.items():
        files[name] = c.export(d / f"{name.replace(' ', '_')}.pt2", cls(), (torch.randn(3, 4),))
    return files


def test_in_place_ops_on_intermediates_are_accepted(inplace):
    ep = torch.export.load(str(inplace["ok"]))
    targets = {str(n.target) for n in ep.graph.nodes}
    assert {"aten.relu_.default", "aten.mul_.Tensor", "aten.add_.Tensor"} <= targets
    assert inspection.check_pt2_bytes(inplace["ok"].read_bytes(), "ok").safe


def test_exported_programs_that_write_their_inputs_or_buffers_are_refused(inplace):
    for name in EXPORTED:
        result = inspection.inspect_pt2_bytes(inplace[name].read_bytes(), name)
        assert len(result.unsafe) == 1, (name, result)
        assert "in place on" in result.unsafe[0], (name, result.unsafe)


def test_crafted_writes_to_state_are_refused_by_every_command(inplace, tmp_path):
    bad = {
        name: c.edit_program(inplace["ok"], tmp_path / f"bad{i}.pt2", edit)
        for i, (name, (edit, _)) in enumerate(CRAFTED.items())
    }
    for name, path in bad.items():  # each edit is refused for the reason it was made for
        problems = inspection.inspect_pt2_bytes(path.read_bytes(), name).unsafe
        assert len(problems) == 1 and CRAFTED[name][1] in problems[0], (name, problems)
    argvs = [["fold", inplace["ok"], "-o", tmp_path / "ok_folded.pt2"]]
    for path in bad.values():
        argvs += [["fold", path, "-o", tmp_path / "out.pt2"], ["check", path], ["audit", path, "--random", "1"]]
    runs = c.run_bnfold(tmp_path, *argvs)
    assert runs[0]["code"] == 0, runs[0]  # the unedited file loads and folds
    for r in runs[1:]:
        c.assert_refused(r, "refusing to load", "allowlist")
    assert not (tmp_path / "out.pt2").exists()


@pytest.mark.parametrize(
    "target, functional",
    [
        ("torch.ops.aten.relu_.default", "torch.ops.aten.relu.default"),
        ("torch.ops.aten.add_.Tensor", "torch.ops.aten.add.Tensor"),
        ("torch.ops.aten.add.out", "torch.ops.aten.add.Tensor"),
        ("torch.ops.aten.hardtanh_.default", "torch.ops.aten.hardtanh.default"),
        ("torch.ops.aten.hardswish_.default", "torch.ops.aten.hardswish.default"),
        ("torch.ops.aten.silu_.default", "torch.ops.aten.silu.default"),
        ("torch.ops.aten.dropout_.default", "torch.ops.aten.dropout.default"),  # self vs input: names differ
        ("torch.ops.aten.t_.default", None),  # inplace_view
        ("torch.ops.aten.set_.source_Tensor", None),  # inplace_view
        ("torch.ops.aten._native_batch_norm_legit.default", None),  # mutable, not in-place
        ("torch.ops.aten.relu.default", None),  # already functional
        ("torch.ops.aten.from_file.default", None),
        ("_operator.setitem", None),
    ],
)
def test_functional_forms_come_from_the_schemas(target, functional):
    assert mutation.functional_form(target) == functional


def _chain(n: int, base: str) -> dict:
    """A serialized graph: ``base`` (a graph input, or a conv of it) then ``n`` chained relu_ nodes."""
    nodes = [
        {
            "target": "torch.ops.aten.conv2d.default",
            "inputs": [{"name": "input", "arg": {"as_tensor": {"name": "x"}}, "kind": 1}],
            "outputs": [{"as_tensor": {"name": "conv"}}],
        }
    ]
    prev = base
    for i in range(n):
        nodes.append(
            {
                "target": "torch.ops.aten.relu_.default",
                "inputs": [{"name": "self", "arg": {"as_tensor": {"name": prev}}, "kind": 1}],
                "outputs": [{"as_tensor": {"name": f"r{i}"}}],
            }
        )
        prev = f"r{i}"
    return {"nodes": nodes, "inputs": [{"as_tensor": {"name": "x"}}], "outputs": []}


def test_aliasing_is_followed_once_per_value_even_through_long_chains_and_cycles():
    n = 20_000  # deeper than Python's recursion limit; every node asks about its whole chain
    intermediate = mutation.Graph(_chain(n, "conv"), {"x": "graph input 'x'"})
    assert all(intermediate.outside_value(f"r{i}") is None for i in range(n - 1, -1, -1))
    on_input = mutation.Graph(_chain(n, "x"), {"x": "graph input 'x'"})
    assert on_input.outside_value(f"r{n - 1}") == "graph input 'x'"
    cycle = _chain(2, "r1")  # r0 = relu_(r1), r1 = relu_(r0)
    looped = mutation.Graph(cycle, {"x": "graph input 'x'"})
    assert "depends on itself" in looped.outside_value("r0")
    assert looped.outside_value("r1") is not None
