"""Hostile .pt2 archives: bnfold refuses them before torch.export.load runs code from them."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
import textwrap

import pytest
import torch

import cli_helpers as h
from bnfold.io.pt2 import exprs, guards, inspection, pickles, program

# name -> (builder, needs a marker, words the refusal names)
HOSTILE = {
    "pickled sample inputs": (h.hostile_sample_inputs, True, "data/sample_inputs/model.pt"),
    "pickled weight": (h.hostile_pickled_weight, True, "weights_only=False"),
    "opaque constant": (lambda s, d, m: h.hostile_constant(s, d, m, "opaque_obj_"), True, "pickle.loads"),
    "TorchScript constant": (lambda s, d, m: h.hostile_constant(s, d, m, "custom_obj_"), True, "TorchScript"),
    "symbolic shape code": (h.hostile_sym_expr, True, "symbolic shape"),
    "guard code": (h.hostile_guard, True, "guard"),
    "node calling os.system": (lambda s, d, m: h.hostile_node_target(s, d), False, "os.system"),
    "AOTInductor library": (lambda s, d, m: h.hostile_aoti(s, d), False, "AOTInductor"),
    "bare pickle sample inputs": (h.hostile_legacy_pickle, True, "non-zip"),
    "duplicate entry": (lambda s, d, m: h.hostile_duplicate(s, d), False, "twice"),
    "name pasted into code": (h.hostile_name, True, "not an identifier"),
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_hostile_archive_is_refused_and_runs_nothing(run, models, tmp_path, case):
    build, _, words = HOSTILE[case]
    marker = tmp_path / "PWNED"
    bad = build(models["conv_bn"], tmp_path / "bad.pt2", marker)
    out = tmp_path / "out.pt2"
    for argv in (["fold", bad, "-o", out], ["check", bad], ["audit", bad, "--random", "1"]):
        code, stdout, err = run(*argv)
        assert code == 2, (argv, stdout, err)
        line = h.one_error_line(err, "bad.pt2", "refusing to load", "--trust", words)
        assert "could run code" in line
    assert not marker.exists()
    assert not out.exists()


def test_string_input_pasted_into_guards_is_refused(run, models, tmp_path):
    marker = tmp_path / "PWNED"
    bad = h.hostile_string_input(models["str_input"], tmp_path / "bad.pt2", marker)
    code, _, err = run("check", bad)
    assert code == 2
    h.one_error_line(err, "bad.pt2", "refusing to load", "constant input")
    assert not marker.exists()
    assert run("check", models["str_input"])[0] == 0  # the untampered program is fine


def test_legacy_layout_is_refused(run, models, tmp_path):
    marker = tmp_path / "PWNED"
    bad = h.legacy_layout(models["conv_bn"], tmp_path / "old.pt2", marker)
    code, _, err = run("check", bad)
    assert code == 2
    h.one_error_line(err, "old.pt2", "pre-2.7")
    assert not marker.exists()


def test_the_crafted_archives_do_run_code_in_plain_torch(models, tmp_path):
    """Control: without bnfold's inspection, torch 2.13 runs each payload (so the tests above mean something)."""
    cases = {
        "sample": h.hostile_sample_inputs,
        "weight": h.hostile_pickled_weight,
        "opaque": lambda s, d, m: h.hostile_constant(s, d, m, "opaque_obj_"),
        "sym": h.hostile_sym_expr,
        "guard": h.hostile_guard,
        "legacy": h.legacy_layout,
        "name": h.hostile_name,
        "string input": h.hostile_string_input,
    }
    files = {}
    for name, build in cases.items():
        marker = tmp_path / f"marker_{name}"
        src = models["str_input" if name == "string input" else "conv_bn"]
        files[name] = (str(build(src, tmp_path / f"{name}.pt2", marker)), str(marker))
    script = textwrap.dedent(
        """
        import json, os, sys, torch
        files = json.loads(sys.argv[1])
        hit = {}
        for name, (path, marker) in files.items():
            try:
                ep = torch.export.load(path)
                ep.module()(*ep.example_inputs[0])
            except Exception:
                pass
            hit[name] = os.path.exists(marker)
        print(json.dumps(hit))
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script, json.dumps(files)], capture_output=True, text=True, timeout=300, cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    hit = json.loads(proc.stdout.strip().splitlines()[-1])
    assert hit == {name: True for name in cases}


def test_trust_loads_and_runs_the_payload(run, models, tmp_path):
    """--trust skips the inspection: the file loads, and its pickled sample inputs do run (here: a marker in tmp)."""
    marker = tmp_path / "PWNED"
    bad = h.hostile_sample_inputs(models["conv_bn"], tmp_path / "bad.pt2", marker)
    code, stdout, err = run("fold", bad, "-o", tmp_path / "out.pt2", "--trust")
    assert code == 0, err
    assert marker.exists()
    assert "folded 1" in stdout


def test_trust_does_not_skip_file_errors(run, tmp_path):
    bad = tmp_path / "text.pt2"
    bad.write_text("not a zip")
    code, _, err = run("check", bad, "--trust")
    assert code == 2
    h.one_error_line(err, "text.pt2", "not a zip")


# ----------------------------------------------------------------------------- the pieces


def test_real_archives_pass(models):
    for name in ("conv_bn", "bn_only", "conv", "dynamic", "str_input"):
        result = inspection.check_pt2_bytes(models[name].read_bytes(), name)
        assert result.safe and result.models == ["model"]


def test_pickle_globals_follows_the_memo():
    # protocol 4 writes STACK_GLOBAL with the names pushed (and memoized) just before
    import os

    assert pickles.pickle_globals(pickle.dumps(os.system, protocol=4)) == [f"{os.system.__module__}.system"]
    # names fetched back from the memo after other work
    crafted = (
        b"\x80\x04"
        b"\x8c\x02os\x94"  # 'os', MEMOIZE -> 0
        b"\x8c\x06system\x94"  # 'system', MEMOIZE -> 1
        b"00"  # POP POP
        b"h\x00h\x01"  # BINGET 0, BINGET 1
        b"\x93"  # STACK_GLOBAL
        b"."
    )
    assert pickles.pickle_globals(crafted) == ["os.system"]
    # a name that is computed, not pushed, cannot be checked
    computed = b"\x80\x04\x8c\x02os\x94K\x01\x93."  # 'os', BININT1 1, STACK_GLOBAL
    with pytest.raises(pickles.Unresolvable):
        pickles.pickle_globals(computed)


def test_torch_save_payload_check():
    assert pickles.check_torch_save_payload(h.torch_saved(((torch.randn(2, 3),), {})), "x") == []
    assert pickles.check_torch_save_payload(b"", "x") == []
    problems = pickles.check_torch_save_payload(h.torch_saved(h.Evil("1")), "x")
    assert problems and "eval" in problems[0]
    problems = pickles.check_torch_save_payload(h.torch_saved({"f": print}), "x")
    assert problems and "print" in problems[0]


@pytest.mark.parametrize(
    "expr, safe",
    [
        ("Add(Symbol('s0', positive=True, integer=True), Integer(1))", True),
        ("FloorDiv(Add(Symbol('s0', positive=True, integer=True), Integer(-3)), Integer(2))", True),
        ("Float('1.5', precision=53)", True),
        ("-int_oo", True),
        ("s0 + 2*s1", True),
        ("__import__('os').system('x')", False),
        ("Symbol('s0').__class__", False),
        ("Symbol('a; b')", False),
        ("eval('1')", False),
        ("(lambda: 1)()", False),
        ("Symbol(sympify('x'))", False),
        ("Pow(Symbol('s0', integer=True), Integer(2))", True),
        ("Pow(Integer(10), Pow(Integer(10), Integer(10)))", False),  # 10**10**10: hangs sympy
        ("s0**100", False),
        ("Integer(1" + "0" * 30 + ")", False),
        ("Float('1e999999999')", False),
    ],
)
def test_sym_expr_check(expr, safe):
    assert exprs.sym_expr_is_safe(expr) is safe


@pytest.mark.parametrize(
    "guard, safe",
    [
        ("L['x'].size()[3] == L['x'].size()[2]", True),
        ("(L['x'].size()[0] % 2) == 0", True),
        ("torch.sym_max(L['x'].size()[0], 2) > 1", True),
        ("math.isnan(L['y'])", True),
        ("torch.serialization.os.system('x')", False),
        ("__import__('os')", False),
        ("L['x'].__class__", False),
        ("open('x')", False),
        ("L['x\"'] == 1", False),
        ("1 == 1\nimport os", False),
        ("L['x'].size()[0] ** 10**10**10 == 1", False),
        ("L['x'].size()[0] ** 2 == 4", True),
        ("('a',) * 2**62 == 1", False),
        ("'ab' * 10 == L['x']", False),
    ],
)
def test_guard_check(guard, safe):
    assert guards.guard_is_safe(guard) is safe


@pytest.mark.parametrize(
    "target, safe",
    [
        ("torch.ops.aten.conv2d.default", True),
        ("torch.ops.higher_order.cond", True),
        ("_operator.getitem", True),
        ("torch.sym_max", True),
        ("torch.ops.load_library", False),
        ("torch.ops.import_module", False),
        ("torch.serialization.os.system", False),
        ("torch.ops.aten.add.Tensor.__call__", False),
        ("builtins.eval", False),
    ],
)
def test_node_target_check(target, safe):
    assert program.node_target_is_safe(target) is safe
