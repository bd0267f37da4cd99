"""``--exclude`` patterns that match nothing and ``--only`` kinds the model lacks: ``bnfold fold`` refuses them
(exit 2, one line, nothing written); the API reports them in ``report.unmatched``.  Before, a typo
(``feature_extractr.*``) folded every normalization and exited 0."""

from __future__ import annotations

import pytest

import bnfold
import cli_helpers as h


@pytest.mark.parametrize("fmt", ["pt2", "onnx_ts", "onnx_dynamo"])
def test_an_exclude_pattern_that_matches_nothing_is_refused(run, long_names, tmp_path, fmt):
    if fmt != "pt2":
        pytest.importorskip("onnx")
    out = tmp_path / ("out" + long_names[fmt].suffix)
    code, stdout, err = run("fold", long_names[fmt], "-o", out, "--exclude", "feature_extractr.*")
    assert code == 2 and not out.exists()
    line = h.one_error_line(err, "--exclude 'feature_extractr.*' matches no layer or normalization")
    if fmt == "onnx_dynamo":
        assert "ONNX node names (a dynamo export's node names hold no module path)" in line
        assert "node__native_batch_norm_legit_no_training" in line  # names as they are in the file
    elif fmt == "pt2":
        assert "module paths" in line and "'feature_extractor.0.1'" in line


@pytest.mark.parametrize("fmt", ["pt2", "onnx_dynamo"])
def test_a_module_path_pattern_on_the_pt2_and_on_the_onnx(run, long_names, tmp_path, fmt):
    """The same pattern folds the .pt2 as asked and is refused on the dynamo ONNX, whose names hold no path."""
    if fmt != "pt2":
        pytest.importorskip("onnx")
    out = tmp_path / ("out" + long_names[fmt].suffix)
    code, _, err = run("fold", long_names[fmt], "-o", out, "--exclude", "feature_extractor.1.*")
    assert (code, out.exists()) == ((0, True) if fmt == "pt2" else (2, False)), err


def test_an_only_kind_the_model_lacks_is_refused(run, long_names, tmp_path):
    out = tmp_path / "out.pt2"
    code, _, err = run("fold", long_names["pt2"], "-o", out, "--only", "conv,linear")
    assert code == 2 and not out.exists()
    h.one_error_line(err, "--only linear: the model has no linear layer (its layer kinds: conv)")
    code, _, err = run("fold", long_names["pt2"], "-o", out, "--only", "conv,batch_norm")
    assert code == 0 and out.exists(), err


def test_the_api_reports_what_matched_nothing(long_names):
    result = bnfold.fold(str(long_names["pt2"]), exclude=["feature_extractor.0.*", "nope"], only="conv,layer_norm")
    assert len(result.report.unmatched) == 2
    assert result.report.unmatched[0].startswith("--exclude 'nope' matches no layer")
    assert result.report.unmatched[1].startswith("--only layer_norm: the model has no layer_norm normalization")
    assert result.report.to_dict()["unmatched"] == result.report.unmatched
    assert bnfold.fold(str(long_names["pt2"]), exclude="feature_extractor.0.*").report.unmatched == []


def test_check_takes_the_same_selection_as_fold(run, long_names):
    """``check --exclude`` / ``--only`` gate what ``fold`` with the same options would fold: what they keep is left
    (code ``excluded``) and does not fail the gate unless ``--strict``; a pattern that matches nothing is refused."""
    path = long_names["pt2"]
    code, out, err = run("check", path)
    assert code == 1, (out, err)  # every normalization of it is foldable
    code, out, err = run("check", path, "--exclude", "feature_extractor.*", "--json")
    assert code == 0, err
    import json

    (file,) = json.loads(out)["files"]
    assert file["foldable"] == 0 and file["unfoldable"] > 0
    assert {s["code"] for s in file["survivors"]} == {"excluded"}
    code, _, err = run("check", path, "--exclude", "feature_extractor.*", "--strict")
    assert code == 1, err
    code, _, err = run("check", path, "--exclude", "feature_extractr.*")
    assert code == 2
    line = h.one_error_line(err, "--exclude 'feature_extractr.*' matches no layer or normalization")
    assert line.endswith("nothing was checked")


def test_check_result_carries_what_matched_nothing(long_names):
    result = bnfold.check(str(long_names["pt2"]), exclude=["nope"])
    assert result.unmatched and result.unmatched[0].startswith("--exclude 'nope' matches no layer")
    assert result.to_dict()["unmatched"] == result.unmatched


def test_an_unknown_option_after_a_command_points_at_that_command_help(run):
    code, _, err = run("fold", "in.onnx", "--bogus")
    assert code == 2
    h.one_error_line(err, "unrecognized arguments: --bogus; see 'bnfold fold --help'")
    code, _, err = run("--bogus")
    assert code == 2
    h.one_error_line(err, "unrecognized arguments: --bogus; see 'bnfold --help'")
