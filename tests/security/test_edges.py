"""Channel 6: Python keywords are not names, and ``training_info`` tensors are checked like initializers."""

from __future__ import annotations

import crafted as c
import pytest
from onnx import helper, numpy_helper


def _keyword_name(doc):
    graph = doc["graph_module"]["graph"]
    spec = graph["inputs"][0]["as_tensor"]
    old = spec["name"]
    spec["name"] = "lambda"  # isidentifier() is true, but it cannot be a parameter name
    graph["tensor_values"]["lambda"] = graph["tensor_values"].pop(old)


def _training_info(tmp_path):
    m = c.onnx_conv_bn()
    t = numpy_helper.from_array(numpy_helper.to_array(m.graph.initializer[0]), "secret")
    c.set_external(t, "../outside.bin", 0, 432)
    (tmp_path.parent / "outside.bin").write_bytes(bytes(432))
    info = m.training_info.add()
    info.initialization.CopyFrom(helper.make_graph([], "init", [], [], [t]))
    return c.save_onnx(m, tmp_path / "train.onnx")


# case -> (build(programs, folder) -> path, the commands' suffix, the words each refusal names)
CASES = {
    "keyword-name": (
        lambda p, d: c.edit_program(p["conv_bn"], d / "kw.pt2", _keyword_name),
        ("pt2", "check", "audit"),
        ("kw.pt2", "keyword", "'lambda'"),
    ),
    "training-info": (lambda p, d: _training_info(d), ("onnx", "check"), ("train.onnx", "secret", "escapes")),
}


@pytest.fixture(scope="module")
def runs(request, programs, tmp_path_factory):
    """``{case: [results]}`` for the selected cases, in one limited subprocess."""
    tmp_path = tmp_path_factory.mktemp("edges")
    chosen = [k for k in CASES if k in (c.selected(request) or CASES)]
    argvs, owners = [], []
    for case in chosen:
        build, (suffix, *others), _ = CASES[case]
        d = tmp_path / case
        d.mkdir()
        bad = build(programs, d)
        argvs.append(["fold", bad, "-o", d / f"o.{suffix}"])
        argvs += [[cmd, bad, *(["--random", "1"] if cmd == "audit" else [])] for cmd in others]
        owners += [case] * (1 + len(others))
    results: dict[str, list] = {}
    for case, r in zip(owners, c.run_bnfold(tmp_path, *argvs), strict=True):
        results.setdefault(case, []).append(r)
    return results, tmp_path


@pytest.mark.parametrize("case", list(CASES))
def test_keyword_names_and_training_info_are_refused(case, runs):
    results, tmp_path = runs
    for r in results[case]:
        c.assert_refused(r, *CASES[case][2])
    assert not [p.name for p in (tmp_path / case).iterdir() if p.name.startswith("o.")]
