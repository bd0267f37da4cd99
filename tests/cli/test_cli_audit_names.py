"""bnfold audit's name columns: ONNX node names longer than the column keep what tells them apart (the end), and
``-v`` prints them in full.  Before, every name was cut to its first 27 characters: the TorchScript export's rows
all read ``/feature_extractor/feature_~``, the dynamo export's ``node__native_batch_norm_leg~``."""

from __future__ import annotations

import pytest

pytest.importorskip("onnx")


def _section(out: str, header: str) -> list[str]:
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"  {header} "))
    rows = []
    for line in lines[start + 1 :]:
        if not line.strip():
            break
        rows.append(line.split()[0])
    return rows


@pytest.mark.parametrize("fmt", ["onnx_ts", "onnx_dynamo"])
def test_long_onnx_names_stay_distinct(run, long_names, fmt):
    code, out, err = run("audit", long_names[fmt], "--random", "1")
    assert code == 0, err
    norms, layers = _section(out, "norm"), _section(out, "layer")
    assert len(norms) == 3 and len(set(norms)) == 3, norms
    assert len(layers) == 3 and len(set(layers)) == 3, layers


@pytest.mark.parametrize("fmt", ["onnx_ts", "onnx_dynamo"])
def test_verbose_prints_names_in_full(run, long_names, fmt):
    import onnx

    model = onnx.load(str(long_names[fmt]), load_external_data=False)
    names = {n.name for n in model.graph.node if n.op_type == "BatchNormalization"}
    assert len(names) == 3 and all(len(n) > 28 for n in names)
    code, out, err = run("audit", long_names[fmt], "--random", "1", "-v")
    assert code == 0, err
    assert set(_section(out, "norm")) == names


def test_short_names_are_as_they_were(run, long_names):
    code, out, _ = run("audit", long_names["pt2"], "--random", "1")
    assert code == 0
    assert _section(out, "norm") == [f"feature_extractor.{i}.1" for i in range(3)]
    assert f"  {'norm':<28} {'ch':>4} " in out  # the column's width: 28 as before
