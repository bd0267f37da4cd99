"""bnfold fold / check / --json / --help / --version on .pt2 programs, in-process."""

from __future__ import annotations

import json

import pytest
import torch

import bnfold
import cli_helpers as h


def test_version(run):
    code, out, _ = run("--version")
    assert code == 0
    assert out.strip() == f"bnfold {bnfold.__version__}"


def test_help_has_examples_and_documents_trust(run):
    code, out, _ = run("--help")
    assert code == 0
    for cmd in ("fold", "check", "audit", "demo"):
        assert cmd in out
    assert "examples:" in out and "bnfold fold model.pt2 -o" in out
    code, out, _ = run("fold", "--help")
    assert code == 0
    assert "--trust" in out and "RISK" in out and "arbitrary code" in out
    assert "--in-place" in out and "--force" in out and "--only" in out


def test_no_command_is_a_usage_error(run):
    code, _, err = run()
    assert code == 2
    assert "COMMAND" in err


def test_fold_writes_an_equivalent_program_without_batch_norm(run, models, tmp_path):
    src = h.copy_to(models["conv_bn"], tmp_path)
    out = tmp_path / "folded.pt2"
    report = tmp_path / "report.json"
    code, stdout, err = run("fold", src, "-o", out, "--report", report)
    assert code == 0, err
    assert "folded 1, skipped 0" in stdout
    assert f"wrote {out}" in stdout

    before, after = torch.export.load(str(src)), torch.export.load(str(out))
    assert h.norm_count(before) == 1 and h.norm_count(after) == 0
    x = torch.randn(h.EXAMPLE_SHAPE)
    torch.testing.assert_close(after.module()(x), before.module()(x), rtol=1e-5, atol=1e-5)

    data = json.loads(report.read_text())
    summary = data["summary"]
    assert (summary["folded"], summary["skipped"], summary["extra_bytes"]) == (1, 0, 0)
    assert summary["nodes_removed"] > 0 and summary["params_saved"] == 4 * 4 + 1  # BN's 4 x 4 tensors + counter
    assert summary["bytes_saved"] > 0 and summary["seconds"] >= 0
    assert data["input"] == str(src) and data["output"] == str(out)
    assert data["folded"][0]["norm"] == "bn"
    assert h.listing(tmp_path) == {src.name, out.name, report.name}  # no temporary files left


def test_fold_json(run, models, tmp_path):
    src = h.copy_to(models["conv_bn"], tmp_path)
    code, stdout, _ = run("fold", src, "-o", tmp_path / "f.pt2", "--json")
    assert code == 0
    data = json.loads(stdout)
    assert data["summary"]["folded"] == 1
    assert data["folded"][0]["pattern"].endswith("batch_norm")


def test_fold_only_restricts_the_layer_kinds(run, models, tmp_path):
    """``--only linear`` on a model without a linear layer is refused (a kind it lacks); the API folds nothing."""
    src = h.copy_to(models["conv_bn"], tmp_path)
    out = tmp_path / "f.pt2"
    code, _, err = run("fold", src, "-o", out, "--only", "linear", "--json")
    assert code == 2 and not out.exists()
    h.one_error_line(err, "--only linear: the model has no linear layer")
    report = bnfold.fold(str(src), only="linear").report
    assert len(report.folded) == 0 and len(report.skipped) == 1 and report.unmatched


@pytest.mark.parametrize("only", ["conv,attention", "", "Conv"])
def test_fold_only_rejects_unknown_kinds(run, models, tmp_path, only):
    src = h.copy_to(models["conv_bn"], tmp_path)
    code, _, err = run("fold", src, "-o", tmp_path / "f.pt2", "--only", only)
    assert code == 2
    assert "conv,conv_transpose,linear" in err
    assert not (tmp_path / "f.pt2").exists()


def test_fold_writes_an_unfoldable_model_unchanged_with_the_reason(run, models, tmp_path):
    src = h.copy_to(models["bn_only"], tmp_path)
    out = tmp_path / "f.pt2"
    code, stdout, _ = run("fold", src, "-o", out)
    assert code == 0
    assert "folded 0, skipped 1" in stdout
    assert f"nothing to fold in {src}" in stdout
    reason = bnfold.fold(torch.export.load(str(src))).report.skipped[0].reason
    assert reason in stdout
    assert h.norm_count(torch.export.load(str(out))) == 1


def test_check_lists_a_foldable_norm_and_fails(run, models):
    code, stdout, _ = run("check", models["conv_bn"])
    assert code == 1
    assert "1 normalization left" in stdout
    assert "bn" in stdout and "foldable: run bnfold fold" in stdout


def test_check_passes_after_fold(run, models, tmp_path):
    out = tmp_path / "f.pt2"
    assert run("fold", models["conv_bn"], "-o", out)[0] == 0
    code, stdout, _ = run("check", out)
    assert code == 0
    assert "ok" in stdout


def test_check_passes_a_model_without_norms(run, models):
    code, stdout, _ = run("check", models["conv"])
    assert code == 0, stdout


def test_check_lists_an_unfoldable_norm_and_passes_unless_strict(run, models):
    reason = bnfold.fold(torch.export.load(str(models["bn_only"]))).report.skipped[0].reason
    code, stdout, _ = run("check", models["bn_only"], "--json")
    assert code == 0
    data = json.loads(stdout)
    assert data["ok"] is True and data["strict"] is False
    [file] = data["files"]
    [survivor] = file["survivors"]
    assert (survivor["norm"], survivor["status"], survivor["reason"]) == ("bn", "skipped", reason)
    code, stdout, _ = run("check", models["bn_only"])
    assert code == 0 and "ok, 1 normalization left that bnfold cannot fold" in stdout and reason in stdout
    code, stdout, _ = run("check", "--strict", models["bn_only"])
    assert code == 1 and "(failing: --strict)" in stdout and reason in stdout


def test_check_json_foldable(run, models):
    code, stdout, _ = run("check", models["conv_bn"], "--json")
    assert code == 1
    [file] = json.loads(stdout)["files"]
    assert [s["status"] for s in file["survivors"]] == ["foldable"]
    assert file["survivors"][0]["reason"] == "foldable: run bnfold fold"
    assert (file["foldable"], file["unfoldable"], file["exit_code"]) == (1, 0, 1)


def test_check_several_files_exits_with_the_worst_status(run, models, tmp_path):
    missing = tmp_path / "missing.pt2"
    code, stdout, err = run("check", models["conv"], models["bn_only"])
    assert code == 0 and stdout.count(": ok") == 2
    code, stdout, err = run("check", models["conv"], models["conv_bn"], models["bn_only"])
    assert code == 1 and "foldable: run bnfold fold" in stdout
    code, stdout, err = run("check", models["conv_bn"], missing, models["conv"])
    assert code == 2
    assert f"{models['conv']}: ok" in stdout  # the files after the bad one are still checked
    h.one_error_line(err, "missing.pt2", "no such file")
    code, stdout, _ = run("check", models["conv"], missing, "--json")
    data = json.loads(stdout)
    assert code == 2 and [f["exit_code"] for f in data["files"]] == [0, 2] and data["ok"] is False


def test_dynamic_shapes_and_guards_are_not_mistaken_for_code(run, models, tmp_path):
    """A legitimate program with symbolic sizes, guards and lifted constants passes the inspection."""
    import zipfile

    with zipfile.ZipFile(models["dynamic"]) as z:
        doc = json.loads(next(z.read(n) for n in z.namelist() if n.endswith("models/model.json")))
    assert doc["guards_code"], "the fixture should carry a guard"
    assert "Symbol(" in json.dumps(doc)
    out = tmp_path / "f.pt2"
    code, stdout, err = run("fold", models["dynamic"], "-o", out, "--json")
    assert code == 0, err
    assert json.loads(stdout)["summary"]["folded"] == 1
    ep = torch.export.load(str(out))
    x = torch.randn(3, 3, 20, 20)
    torch.testing.assert_close(ep.module()(x), torch.export.load(str(models["dynamic"])).module()(x))


def test_json_error_is_machine_readable(run, tmp_path):
    code, stdout, err = run("fold", tmp_path / "missing.pt2", "-o", tmp_path / "out.pt2", "--json")
    assert code == 2
    data = json.loads(stdout)
    assert data["exit_code"] == 2 and data["error"].startswith(f"{tmp_path / 'missing.pt2'}: no such file")
    h.one_error_line(err, "missing.pt2")


def test_debug_shows_the_traceback(run, tmp_path):
    bad = tmp_path / "bad.pt2"
    bad.write_text("hello")
    code, _, err = run("check", bad, "--debug")
    assert code == 2
    assert "Traceback" in err and "bnfold: error:" in err


def test_demo_wiring(run, tmp_path, monkeypatch):
    """--out and --quick reach run_demo; with --json its printed table goes to stderr, JSON to stdout."""
    import bnfold.demo

    calls = []

    def fake_run_demo(out_dir=".", quick=False, **kw):
        calls.append((out_dir, quick))
        print("demo table")
        return {"folded": 3, "sqnr_db": 41.5}

    monkeypatch.setattr(bnfold.demo, "run_demo", fake_run_demo)
    out_dir = tmp_path / "demo_out"
    code, stdout, err = run("demo", "--out", out_dir, "--quick", "--json")
    assert code == 0
    assert calls == [(str(out_dir), True)]
    data = json.loads(stdout)
    assert data["folded"] == 3 and data["sqnr_db"] == 41.5
    assert "demo table" in err
    code, stdout, _ = run("demo", "--out", out_dir)
    assert code == 0 and "demo table" in stdout and calls[-1] == (str(out_dir), False)


def test_json_output_is_strict_json():
    from bnfold.cli.jsonout import json_text

    text = json_text({"sqnr": float("inf"), "err": [float("nan"), 1.5], "pair": (1, 2)})
    assert json.loads(text) == {"sqnr": "inf", "err": ["nan", 1.5], "pair": [1, 2]}
    assert "NaN" not in text and "Infinity" not in text


def test_fold_lower_unfoldable(run, tmp_path):
    """``--lower-unfoldable``: the pre-activation BN that cannot fold becomes mul + add; nothing is left."""
    from torch import nn

    class PreAct(nn.Module):
        def __init__(self):
            super().__init__()
            self.bn, self.conv = nn.BatchNorm2d(3), nn.Conv2d(3, 4, 3, padding=1)

        def forward(self, x):
            return self.conv(torch.relu(self.bn(x)))

    model = h.randomize_bn(PreAct()).eval()
    x = torch.randn(2, 3, 6, 6)
    src, out = tmp_path / "pre.pt2", tmp_path / "out.pt2"
    torch.export.save(torch.export.export(model, (x,)), str(src))
    code, stdout, err = run("fold", src, "-o", out, "--lower-unfoldable", "--json")
    assert code == 0, err
    data = json.loads(stdout)
    assert data["summary"]["lowered"] == 1 and [e["norm"] for e in data["lowered"]] == ["bn"]
    folded = torch.export.load(str(out))
    assert not [n for n in folded.graph.nodes if "batch_norm" in str(n.target)]
    torch.testing.assert_close(folded.module()(x), model(x), rtol=1e-5, atol=1e-5)


def test_training_mode_export_says_eval_without_trust(run, tmp_path):
    """A program exported in training mode is refused by the allowlist (its in-place statistics update);
    the one line still says what to do: call model.eval() before export."""
    from torch import nn

    src = tmp_path / "train.pt2"
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4))  # training mode
    torch.export.save(torch.export.export(model, (torch.randn(2, 3, 8, 8),)), str(src))
    code, _, err = run("fold", src, "-o", tmp_path / "out.pt2")
    assert code == 2
    line = h.one_error_line(err, "training mode")
    assert "model.eval()" in line and not (tmp_path / "out.pt2").exists()
