"""``--fp16-range`` with ``--low-memory`` on a model whose weights are external and large (each at least
``fold_math.LARGE_BYTES``): the calibration and proof runs read each weight when its op runs and drop it after,
the planner holds no large weight, and the files and report are those of the plain route."""

from __future__ import annotations

import json
import os
import weakref

import numpy as np
import onnx
import pytest
import torch
from stream_models import largest_tensor, linear_stack

from bnfold.cli.main import main
from bnfold.io import onnx_stream
from bnfold.io.onnx import load_onnx
from bnfold.numerics import lazy
from bnfold.numerics.onnx_program import onnx_program
from bnfold.numerics.ranges import run_plain

_WIDTH = 1024  # 4 MiB weights: past fold_math.LARGE_BYTES


def _model(folder, n: int = 4) -> tuple[str, int]:
    """``n`` MatMul layers of ``_WIDTH``² float32 saved with their data in ``m.data``; (path, largest tensor)."""
    model = linear_stack(n, _WIDTH, channels=4, size=8)
    largest = largest_tensor(model)
    path = os.path.join(folder, "m.onnx")
    onnx.save(model, path, save_as_external_data=True, location="m.data", size_threshold=1024)
    return path, largest


def _inputs(folder) -> str:
    """Two batches that take the projection past fp16's range: the rewrite scales layers."""
    path = os.path.join(folder, "in.npz")
    np.savez(path, x=np.random.default_rng(0).standard_normal((2, 1, 3, 8, 8)).astype(np.float32) * 1e4)
    return path


def _files(folder) -> dict[str, bytes]:
    return {f: open(os.path.join(folder, f), "rb").read() for f in sorted(os.listdir(folder)) if f != "report.json"}


def _untimed(report: dict) -> dict:
    report = dict(report, input=None, output=None)
    report["summary"] = dict(report["summary"], seconds=0)
    return report


def test_streamed_fp16_range_writes_the_plain_routes_files_and_report(tmp_path, monkeypatch):
    src = tmp_path / "in"
    src.mkdir()
    path, _ = _model(src)
    npz = _inputs(tmp_path)
    loads = []
    real_load = lazy.LazyConstant.load
    monkeypatch.setattr(lazy.LazyConstant, "load", lambda self, dtype: loads.append(dtype) or real_load(self, dtype))
    outs, reports = {}, {}
    for name, extra in (("plain", []), ("stream", ["--low-memory"])):
        out = tmp_path / name
        out.mkdir()
        report = out / "report.json"
        args = ["fold", path, "-o", str(out / "out.onnx"), "-q", "--fp16-range", npz, "--report", str(report)]
        assert main([*args, *extra]) == 0
        outs[name], reports[name] = _files(out), json.loads(report.read_text())
        if name == "plain":
            assert not loads  # the plain load holds every weight: nothing is lazy
    assert outs["stream"] == outs["plain"]
    assert _untimed(reports["stream"]) == _untimed(reports["plain"])
    assert any(e["factor"] != 1.0 for e in reports["plain"]["rescaled"])  # the rewrite applied
    assert {torch.float32, torch.float64} <= set(loads)  # calibration and proof read the weights at use


def test_the_streamed_range_rewrite_holds_one_weight_at_a_time(tmp_path, monkeypatch):
    """Every buffer the streamed reader fills and every weight a lazy constant makes (its float64 copy in the
    proof) is followed to its release: at no time are more bytes of them alive than one weight's float32 and
    float64 copies, where the model holds 6 such weights (the plain route's programs and planner held them all:
    this count reached the weights' sum)."""
    src = tmp_path / "in"
    src.mkdir()
    path, largest = _model(src, n=5)
    weights = os.path.getsize(src / "m.data")
    alive, peak = [0], [0]

    def track(x, nbytes: int):
        alive[0] += nbytes
        peak[0] = max(peak[0], alive[0])
        weakref.finalize(x, lambda: alive.__setitem__(0, alive[0] - nbytes))
        return x

    real_read, real_load = onnx_stream.ExternalSource.read, lazy.LazyConstant.load
    monkeypatch.setattr(
        onnx_stream.ExternalSource, "read", lambda self, t: (lambda b: track(b, b.nbytes))(real_read(self, t))
    )
    monkeypatch.setattr(
        lazy.LazyConstant,
        "load",
        lambda self, dtype: (lambda t: track(t, t.nbytes) if t.dtype == torch.float64 else t)(real_load(self, dtype)),
    )
    out = tmp_path / "out"
    out.mkdir()
    args = ["fold", path, "-o", str(out / "out.onnx"), "-q", "--fp16-range", _inputs(tmp_path), "--low-memory"]
    assert main(args) == 0
    assert weights > 5 * largest
    assert 0 < peak[0] <= 3 * largest, (peak[0], largest, weights)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_lazy_program_runs_as_the_eager_one(tmp_path, dtype):
    """``onnx_program(model, lazy=True)`` of a streamed load: its large weights are lazy constants, the small ones
    held; ``run_plain`` gives the eager program's outputs and peaks, bit for bit."""
    path, _ = _model(tmp_path, n=2)
    x = [(torch.randn(1, 3, 8, 8, generator=torch.Generator().manual_seed(i)) * 100,) for i in range(2)]
    eager = onnx_program(load_onnx(path).model)
    model, layout = load_onnx(path, stream=True)
    with layout.reading():
        program = onnx_program(model, lazy=True)
        held, deferred = lazy.split(program.constants)
        assert set(deferred) == {"proj", "l0.w", "l1.w"} and "bn.scale" in held
        assert not any(k in program.stored for k in deferred)
        peaks_e, peaks_l = {}, {}
        outs_e, outs_l = run_plain(eager, x, dtype, peaks_e), run_plain(program, x, dtype, peaks_l)
    assert peaks_l == peaks_e
    assert all(torch.equal(a, b) for be, bl in zip(outs_e, outs_l, strict=True) for a, b in zip(be, bl, strict=True))


def test_a_data_file_cut_short_before_the_calibration_reads_it_is_refused_in_one_line(tmp_path, capsys, monkeypatch):
    """The weights a lazy program reads are read through the streamed load's checked source, at the offsets and
    lengths it checked: a data file that shrinks after the fold read it and before the calibration does is a
    one-line file error and no file is written, not a weight of zeros (the folded layers' weights are in the fold's
    scratch file by then: the projection, which nothing folds, is still read from the input's data file)."""
    from bnfold.numerics import ranges

    src = tmp_path / "in"
    src.mkdir()
    path, _ = _model(src, n=2)
    real = ranges.run_plain

    def cut_then_run(*args, **kwargs):  # the projection (first in the file, 1 MiB, not folded) is cut
        os.truncate(src / "m.data", 1024)
        return real(*args, **kwargs)

    monkeypatch.setattr(ranges, "run_plain", cut_then_run)
    out = tmp_path / "out"
    out.mkdir()
    args = ["fold", path, "-o", str(out / "out.onnx"), "-q", "--fp16-range", _inputs(tmp_path), "--low-memory"]
    assert main(args) != 0
    err = capsys.readouterr().err.strip()
    assert "changed while it was read" in err and "\n" not in err and "Traceback" not in err
    assert not os.listdir(out)


def test_the_adapter_keeps_no_large_float64_constant(tmp_path):
    """``OnnxGraph.constant`` (what the range planner asks of a constant operand) keeps its float64 copy for the
    next call only under ``fold_math.LARGE_BYTES``: a streamed 1 MiB float32 operand (2 MiB in float64) is read
    again, the same values each time, and a small one is kept (before: both kept until the next edit)."""
    from onnx import TensorProto, helper
    from onnx import numpy_helper as nh

    from bnfold import fold_math
    from bnfold.onnx.fold import range_edit_onnx

    rng = np.random.default_rng(0)
    big, small = rng.standard_normal((512, 512)).astype(np.float32), np.float32([3.0])
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "big"], ["y"]), helper.make_node("Mul", ["y", "small"], ["z"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [512, 512])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [512, 512])],
        [nh.from_array(big, "big"), nh.from_array(small, "small")],
    )
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    onnx.save(onnx.load(path), path, save_as_external_data=True, location="m.data", size_threshold=1024)
    seen = {}

    def edit(g):
        for node in g.ordered_nodes():
            for v in g.inputs(node):
                name = g.value_name(v)
                if name in ("big", "small"):
                    seen[name] = (g.constant(v), g.constant(v))
        seen["kept"] = [t.nbytes for t in g._tensors.values() if t is not None]
        return []

    loaded = load_onnx(str(path), stream=True)
    with loaded.layout.reading():
        range_edit_onnx(loaded.model, edit)
    a, b = seen["big"]
    assert a is not b and torch.equal(a, b) and torch.equal(a, torch.from_numpy(big).double())
    a, b = seen["small"]
    assert a is b and a.tolist() == [3.0]
    assert seen["kept"] and max(seen["kept"]) < fold_math.LARGE_BYTES, seen["kept"]
