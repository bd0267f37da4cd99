"""Channel 1: pytree specs in the program JSON are data, never imports or code.

``in_spec`` / ``out_spec`` are JSON strings that torch's ``treespec_loads``
turns into Python: an ``__enum__`` context or a ``defaultdict`` imports a module
named by the file, and dict keys are pasted into the source of
``ExportedProgram.module()``.  Without ``--trust`` each is refused.
"""

from __future__ import annotations

import json

import crafted as c
import pytest

# evil_<case>.py in the working folder: importing it leaves PWNED_<case>
EVIL_MODULE = (
    "import pathlib\nimport enum\npathlib.Path('PWNED_' + __name__[5:]).touch()\n"
    "class E(enum.Enum):\n    A = 1\nf = dict\n"
)
INJECTED_KEY = "k=__import__('pathlib').Path('PWNED_key').touch()):#\n"


def _enum_context(doc):
    spec = json.loads(c.signature(doc)["in_spec"])
    spec[1]["context"] = json.dumps({"__enum__": True, "fqn": "evil_enum:E", "name": "A"})
    c.signature(doc)["in_spec"] = json.dumps(spec)


def _defaultdict(doc):
    spec = json.loads(c.signature(doc)["out_spec"])
    keys = json.loads(spec[1]["context"])
    spec[1]["type"] = "collections.defaultdict"
    # torch hands this context to its deserializer as it is (a dict, not a JSON string)
    spec[1]["context"] = {"default_factory_module": "evil_dd", "default_factory_name": "f", "dict_context": keys}
    c.signature(doc)["out_spec"] = json.dumps(spec)


def _injected_key(doc):
    spec = json.loads(c.signature(doc)["in_spec"])
    kwargs = spec[1]["children_spec"][1]
    kwargs["context"] = json.dumps([INJECTED_KEY if k == "k" else k for k in json.loads(kwargs["context"])])
    c.signature(doc)["in_spec"] = json.dumps(spec)


# case -> (builder, the marker plain torch leaves at load (the control), or None)
CASES = {
    "enum": (_enum_context, "PWNED_enum"),
    "dd": (_defaultdict, "PWNED_dd"),
    "key": (_injected_key, None),  # torch pastes it into forward()'s source
}


@pytest.fixture(scope="module")
def runs(request, programs, tmp_path_factory):
    """``{case: (the three refusals, the control)}`` for the selected cases, and the real program's runs;
    all in one limited subprocess."""
    tmp_path = tmp_path_factory.mktemp("treespec")
    chosen = [k for k in CASES if k in (c.selected(request) or CASES)]
    argvs, controls = [], []
    for case in chosen:
        build = CASES[case][0]
        (tmp_path / f"evil_{case}.py").write_text(EVIL_MODULE)
        bad = c.edit_program(programs["dict_io"], tmp_path / f"bad_{case}.pt2", build)
        argvs += [["fold", bad, "-o", tmp_path / "out.pt2"], ["check", bad], ["audit", bad, "--random", "1"]]
        controls.append(str(bad))
    # dict and keyword inputs, dict / list / tuple outputs: what torch.export.save writes is accepted
    real_out = tmp_path / "real.pt2"
    argvs += [["check", programs["dict_io"]], ["fold", programs["dict_io"], "-o", real_out]]
    out = c.run_bnfold(tmp_path, *argvs, control=controls)
    n = 3 * len(chosen)
    by_case = {case: (out[3 * i : 3 * i + 3], out[n + 2 + i]) for i, case in enumerate(chosen)}
    return by_case, out[n : n + 2], tmp_path


@pytest.mark.parametrize("case", list(CASES))
def test_crafted_treespec_is_refused(case, runs):
    by_case, _, tmp_path = runs
    refusals, control = by_case[case]
    for r in refusals:
        c.assert_refused(r, f"bad_{case}.pt2", "refusing to load", "spec")
    assert not (tmp_path / "out.pt2").exists()
    marker = CASES[case][1]
    if marker:
        assert marker in control["marker"], f"control: plain torch did not run the {case} payload"


def test_real_treespecs_pass(runs):
    _, real, tmp_path = runs
    assert [r["code"] for r in real] == [1, 0], real
    assert (tmp_path / "real.pt2").exists()
