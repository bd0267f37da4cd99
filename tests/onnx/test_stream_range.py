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
from onnx import TensorProto, helper, numpy_helper
from stream_models import largest_tensor, linear_stack
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

import bnfold
from bnfold.cli.main import main
from bnfold.io import onnx_stream
from bnfold.io.onnx import load_onnx
from bnfold.numerics import lazy, ranges
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


def _plain_and_streamed(tmp_path, path: str, npz: str, plain_done=lambda: None) -> dict:
    """``path`` folded with ``--fp16-range npz``, plain (then ``plain_done()``) and with ``--low-memory``: the plain
    fold's report; the two folds' files and reports (but paths and seconds) are the same."""
    outs, reports = {}, {}
    for name, extra in (("plain", []), ("stream", ["--low-memory"])):
        out = tmp_path / name
        out.mkdir()
        report = out / "report.json"
        args = ["fold", path, "-o", str(out / "out.onnx"), "-q", "--fp16-range", npz, "--report", str(report)]
        assert main([*args, *extra]) == 0
        outs[name], reports[name] = _files(out), json.loads(report.read_text())
        if name == "plain":
            plain_done()
    assert outs["stream"] == outs["plain"]
    assert _untimed(reports["stream"]) == _untimed(reports["plain"])
    return reports["plain"]


def test_streamed_fp16_range_writes_the_plain_routes_files_and_report(tmp_path, monkeypatch):
    src = tmp_path / "in"
    src.mkdir()
    path, _ = _model(src)
    npz = _inputs(tmp_path)
    runs = []  # [dtype, weights read at use] of each run
    real_run, real_value = ranges.run_plain, lazy.LazyConstant.value
    monkeypatch.setattr(ranges, "run_plain", lambda p, b, dt, *a: runs.append([dt, 0]) or real_run(p, b, dt, *a))

    def value(self):
        runs[-1][1] += 1
        return real_value(self)

    monkeypatch.setattr(lazy.LazyConstant, "value", value)

    def plain_done():
        assert runs and not any(n for _, n in runs)  # the plain load holds every weight: nothing is lazy
        runs.clear()

    report = _plain_and_streamed(tmp_path, path, npz, plain_done)
    assert any(e["factor"] != 1.0 for e in report["rescaled"])  # the rewrite applied
    assert {dtype for dtype, n in runs if n} == {torch.float32, torch.float64}  # calibration and proof read at use


def test_the_streamed_range_rewrite_holds_one_weight_at_a_time(tmp_path, monkeypatch):
    """Every buffer the streamed reader fills and every float64 weight a lazy constant makes whole is followed to
    its release: at no time are more bytes of them alive than one float32 weight, where the model holds 6 such
    weights (the plain route's programs and planner held them all: this count reached the weights' sum; before
    the proof read a layer's weight by blocks of channels, its float64 copy made it 2x one weight)."""
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
    assert 0 < peak[0] <= largest, (peak[0], largest, weights)


class _Largest(TorchDispatchMode):
    """Under it, ``nbytes`` is the size of the largest new tensor of ``dtype`` any torch op made (an output that
    is not a view of one of the op's inputs; a ``meta`` tensor, a shape without data, is none)."""

    def __init__(self, dtype: torch.dtype = torch.float64) -> None:
        super().__init__()
        self.dtype, self.nbytes = dtype, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        given = {t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        for t in tree_leaves(out):
            if not isinstance(t, torch.Tensor) or t.is_meta or t.dtype != self.dtype:
                continue
            if t.untyped_storage().data_ptr() not in given:
                self.nbytes = max(self.nbytes, t.untyped_storage().nbytes())
        return out


@pytest.mark.parametrize("route", [["--low-memory"], []], ids=["streamed", "plain"])
def test_the_proof_makes_no_float64_copy_of_a_large_weight(tmp_path, monkeypatch, route):
    """The proof's float64 runs convert a large layer weight a block of output channels at a time
    (``ranges.BLOCK_BYTES``, 256 KiB): no op in them makes a float64 tensor of more than a quarter of a float32
    weight (4 MiB here), where each layer's whole float64 copy (8 MiB) was made before, in both routes."""
    src = tmp_path / "in"
    src.mkdir()
    path, largest = _model(src, n=3)
    real = ranges.run_plain
    modes = []

    def run(program, batches, dtype, *args):
        if dtype != torch.float64:
            return real(program, batches, dtype, *args)
        modes.append(_Largest())
        with modes[-1]:
            return real(program, batches, dtype, *args)

    monkeypatch.setattr(ranges, "run_plain", run)
    out = tmp_path / "out"
    out.mkdir()
    args = ["fold", path, "-o", str(out / "out.onnx"), "-q", "--fp16-range", _inputs(tmp_path), *route]
    assert main(args) == 0
    assert len(modes) == 2  # the folded model's run and the rewritten one's
    assert all(0 < m.nbytes <= largest // 4 for m in modes), ([m.nbytes for m in modes], largest)


def test_the_streamed_rewrite_writes_a_scaled_weight_a_stage_at_a_time(tmp_path, monkeypatch):
    """A large weight whose scale its span shows exact is written as a deferred product, a stage at a time as it
    goes to the scratch file: no op of the rewrite (plan and edits) makes a float32 tensor of a quarter of a weight,
    where ``fold_math.scale_pow2`` made each scaled weight whole (4 MiB here) before."""
    from bnfold import rescale

    src = tmp_path / "in"
    src.mkdir()
    path, largest = _model(src, n=3)
    real, modes = rescale.rescale_graph, []

    def rewrite(*args):
        modes.append(_Largest(torch.float32))
        with modes[-1]:
            return real(*args)

    monkeypatch.setattr(rescale, "rescale_graph", rewrite)
    out = tmp_path / "out"
    out.mkdir()
    args = ["fold", path, "-o", str(out / "out.onnx"), "-q", "--fp16-range", _inputs(tmp_path), "--low-memory"]
    assert main([*args, "--report", str(out / "r.json")]) == 0
    assert sum(e["factor"] != 1.0 for e in json.loads((out / "r.json").read_text())["rescaled"]) >= 3
    assert len(modes) == 1 and 0 < modes[0].nbytes <= largest // 4, ([m.nbytes for m in modes], largest)


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


def _operands_model(path, ints: bool = False):
    """``z = (x + big) * small`` saved with ``big`` (a 512x512 float32 operand: 1 MiB, 2 MiB in float64) in
    ``m.data``; ``ints``: also ``zi = xi + bigi``, a 512x512 int32 operand there too.  Returns ``big``."""
    from onnx import TensorProto, helper
    from onnx import numpy_helper as nh

    rng = np.random.default_rng(0)
    big, small = rng.standard_normal((512, 512)).astype(np.float32), np.float32([3.0])
    nodes = [helper.make_node("Add", ["x", "big"], ["y"]), helper.make_node("Mul", ["y", "small"], ["z"])]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [512, 512])]
    outputs = [helper.make_tensor_value_info("z", TensorProto.FLOAT, [512, 512])]
    inits = [nh.from_array(big, "big"), nh.from_array(small, "small")]
    if ints:
        nodes.append(helper.make_node("Add", ["xi", "bigi"], ["zi"]))
        inputs.append(helper.make_tensor_value_info("xi", TensorProto.INT32, [512, 512]))
        outputs.append(helper.make_tensor_value_info("zi", TensorProto.INT32, [512, 512]))
        inits.append(nh.from_array(np.arange(512 * 512, dtype=np.int32).reshape(512, 512), "bigi"))
    graph = helper.make_graph(nodes, "g", inputs, outputs, inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    onnx.save(onnx.load(path), path, save_as_external_data=True, location="m.data", size_threshold=1024)
    return big


def test_the_adapter_keeps_no_large_float64_constant(tmp_path):
    """``OnnxGraph.constant`` (what the range planner asks of a constant operand) keeps its float64 copy for the
    next call only under ``fold_math.LARGE_BYTES``: a streamed 1 MiB float32 operand (2 MiB in float64) is read
    again, the same values each time, and a small one is kept (before: both kept until the next edit); a large one
    a plain load holds is kept (a chain's walk asks for it at every step: 33 conversions a step, were it not)."""
    from bnfold import fold_math
    from bnfold.onnx.fold import range_edit_onnx

    path = tmp_path / "m.onnx"
    big = _operands_model(path)
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
    # held in memory (a plain load), the large one is converted once: a chain's walk asks at every step
    seen.clear()
    range_edit_onnx(load_onnx(str(path)).model, edit)
    a, b = seen["big"]
    assert a is b and torch.equal(a, torch.from_numpy(big).double())


def _layer(op: str, w: np.ndarray, x_shape: tuple, extra: dict | None = None, **attrs) -> onnx.ModelProto:
    """One ``op`` reading ``x`` and the initializer ``w`` (and ``extra``'s initializers after it, in order)."""
    inits = [numpy_helper.from_array(w, "w"), *(numpy_helper.from_array(v, k) for k, v in (extra or {}).items())]
    node = helper.make_node(op, ["x", "w", *(extra or {})], ["y"], name="layer", **attrs)
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _cases():
    """(id, model, x, the float64 reference of its output, whether its channels run in blocks); weights of at
    least 1 MiB."""
    rng = np.random.default_rng(1)
    f32 = lambda *shape: rng.standard_normal(shape).astype(np.float32)  # noqa: E731
    t = lambda a: torch.from_numpy(a).double()  # noqa: E731
    out = []
    x, w = f32(2, 5, 512), f32(512, 600)
    out.append(("matmul", _layer("MatMul", w, x.shape), x, t(x) @ t(w), True))
    x, w = f32(2, 4, 512), f32(2, 512, 300)
    out.append(("matmul-batched", _layer("MatMul", w, x.shape), x, t(x) @ t(w), True))
    x, w, c = f32(3, 512), f32(600, 512), f32(600)
    ref = 0.5 * t(x) @ t(w).T + 2.0 * t(c)
    out.append(("gemm-transB", _layer("Gemm", w, x.shape, {"c": c}, transB=1, alpha=0.5, beta=2.0), x, ref, True))
    x, w, c = f32(3, 512), f32(512, 600), f32(3, 600)
    out.append(("gemm-C-MxN", _layer("Gemm", w, x.shape, {"c": c}), x, t(x) @ t(w) + t(c), True))
    x, w, c = f32(3, 512), f32(512, 600), f32(1)
    out.append(("gemm-C-scalar", _layer("Gemm", w, x.shape, {"c": c}), x, t(x) @ t(w) + t(c), True))
    x, w, b = f32(1, 64, 10, 10), f32(64, 64, 8, 8), f32(64)
    ref = torch.nn.functional.conv2d(t(x), t(w), t(b), padding=1)
    out.append(("conv", _layer("Conv", w, x.shape, {"b": b}, pads=[1, 1, 1, 1]), x, ref, True))
    x, w = f32(1, 64, 10, 10), f32(64, 32, 12, 12)
    ref = torch.nn.functional.conv2d(t(x), t(w), groups=2, padding=2)
    out.append(("conv-grouped", _layer("Conv", w, x.shape, group=2, pads=[2, 2, 2, 2]), x, ref, False))
    return out


@pytest.mark.parametrize("case", _cases(), ids=lambda c: c[0])
def test_a_float64_run_computes_a_large_layer_by_blocks_of_output_channels(monkeypatch, case):
    """A held weight of at least 1 MiB in a float64 run (the range rewrite's proof): a MatMul, a Gemm (``transB``,
    ``C`` per channel, per element, a scalar) and an ungrouped Conv convert it a block of output channels at a time
    (blocks of about 1/80 of the channels here, 600 in blocks of 7: the last one shorter): the largest float64
    tensor made is under the weight's float64 copy, and the output is the layer's float64 value (within 1e-12 of
    it: the blocks may sum in another order); a grouped Conv runs whole, as before."""
    _, model, x, ref, blocked = case
    w = next(numpy_helper.to_array(i) for i in model.graph.initializer if i.name == "w")
    monkeypatch.setattr(ranges, "BLOCK_BYTES", w.size * 8 // 80)
    program = onnx_program(model)
    with _Largest() as mode:
        ((y,),) = run_plain(program, [(torch.from_numpy(x),)], torch.float64)
    assert y.dtype == torch.float64 and y.shape == ref.shape
    torch.testing.assert_close(y, ref, rtol=1e-12, atol=1e-12 * float(ref.abs().max()))
    assert (mode.nbytes < w.size * 8) == blocked, (mode.nbytes, w.size * 8)


def test_the_planner_tells_a_streamed_constant_without_reading_it(tmp_path, monkeypatch):
    """The range planner's ``is_const`` (asked of every operand it walks) is the adapter's ``is_constant``: a
    streamed initializer's answer comes from its element type, its data not read (before: ``constant()`` read
    each from the data file, ``big`` twice, and made its float64 copy, 2 MiB, to throw it away).  The answers are
    ``constant(v) is not None`` for every operand: the float32 one, the int32 one (no float constant), the small
    one and the inputs."""
    from bnfold.engine.range_planner import Limits, Planner
    from bnfold.onnx.fold import range_edit_onnx

    path = tmp_path / "m.onnx"
    _operands_model(path, ints=True)
    reads = []
    real_read = onnx_stream.ExternalSource.read
    monkeypatch.setattr(onnx_stream.ExternalSource, "read", lambda self, t: reads.append(t.name) or real_read(self, t))
    answers = {}

    def edit(g):
        planner = Planner(g, {}, Limits(60000.0, 60000.0))
        operands = {g.value_name(v): v for node in g.ordered_nodes() for v in g.inputs(node)}
        answers["planner"] = {name: planner.is_const(v) for name, v in operands.items()}
        answers["reads"] = list(reads)
        answers["constant"] = {name: g.constant(v) is not None for name, v in operands.items()}
        answers["reads by constant()"] = sorted(reads)
        return []

    loaded = load_onnx(str(path), stream=True)
    with loaded.layout.reading():
        range_edit_onnx(loaded.model, edit)
    assert answers["reads"] == []
    assert answers["planner"] == answers["constant"]
    assert answers["planner"] == {"x": False, "big": True, "y": False, "small": True, "xi": False, "bigi": False}
    assert answers["reads by constant()"] == ["big"]  # the count sees reads (an int32 one is no float constant)


def _one_layer(nodes: list, inputs: dict, initializers: dict, output: tuple) -> onnx.ModelProto:
    io = [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(s)) for n, s in inputs.items()]
    out = helper.make_tensor_value_info(output[0], TensorProto.FLOAT, list(output[1]))
    inits = [numpy_helper.from_array(a, n) for n, a in initializers.items()]
    return helper.make_model(
        helper.make_graph(nodes, "g", io, [out], inits), opset_imports=[helper.make_opsetid("", 17)]
    )


@pytest.mark.parametrize("trans_b", [0, 1])
def test_a_gemm_whose_c_is_its_a_runs_by_blocks_in_float64(trans_b):
    """``Gemm(X, W, X)`` (C is A's value: ``[M, K]`` broadcast to ``[M, N]``, K = N) with a 1 MiB ``W`` in a float64
    run: the blocks slice C in its own slot.  Before, the bias was found by its name's first slot, A's, and every
    block failed ("mat1 and mat2 shapes cannot be multiplied"): a fold with ``--fp16-range`` that main made refused."""
    k = 512
    rng = np.random.default_rng(0)
    w = rng.standard_normal((k, k)).astype(np.float32)
    model = _one_layer(
        [helper.make_node("Gemm", ["x", "w", "x"], ["y"], transB=trans_b)], {"x": (3, k)}, {"w": w}, ("y", (3, k))
    )
    x = rng.standard_normal((3, k)).astype(np.float32)
    x64, w64 = torch.from_numpy(x).double(), torch.from_numpy(w).double()
    ref = x64 @ (w64.T if trans_b else w64) + x64
    ((y,),) = run_plain(onnx_program(model), [(torch.from_numpy(x),)], torch.float64)
    torch.testing.assert_close(y, ref, rtol=1e-12, atol=1e-12 * float(ref.abs().max()))


def test_a_large_constant_a_step_writes_is_the_steps_value_in_the_float64_run():
    """A held constant of at least 1 MiB that a step's output also names is read as that step's value, never as the
    constant: a standardized weight (``Div(Sub(w, mean), std)``, whose float32 value the program holds beside its
    steps) is the float64 steps' value, and a value that is both an initializer (zeros) and ``Relu(x)``'s output is
    the Relu's, in float64 as in float32.  Before, both were converted from the held constant at use: the float32
    weight (3e-8 off the float64 one) and the zeros (the float64 run's output 0 where the float32 run's was 755)."""
    k = 512
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((k, k)) * 3 + 1).astype(np.float32)
    mean, std = w.mean(0, keepdims=True), (w.std(0, keepdims=True) * 1.1).astype(np.float32)
    nodes = [helper.make_node("Sub", ["w", "mean"], ["d"]), helper.make_node("Div", ["d", "std"], ["ws"])]
    nodes.append(helper.make_node("MatMul", ["x", "ws"], ["y"]))
    model = _one_layer(nodes, {"x": (4, k)}, {"w": w, "mean": mean, "std": std}, ("y", (4, k)))
    x = torch.from_numpy(rng.standard_normal((4, k)).astype(np.float32))
    t = {n: torch.from_numpy(a).double() for n, a in (("w", w), ("mean", mean), ("std", std))}
    ref = x.double() @ ((t["w"] - t["mean"]) / t["std"])
    ((y,),) = run_plain(onnx_program(model), [(x,)], torch.float64)
    torch.testing.assert_close(y, ref, rtol=1e-12, atol=1e-12 * float(ref.abs().max()))

    nodes = [helper.make_node("Relu", ["x"], ["v"]), helper.make_node("MatMul", ["v", "w"], ["y"])]
    model = _one_layer(nodes, {"x": (k, k)}, {"v": np.zeros((k, k), np.float32), "w": w}, ("y", (k, k)))
    x = torch.from_numpy(rng.standard_normal((k, k)).astype(np.float32))
    ref = x.double().relu() @ t["w"]
    program = onnx_program(model)
    ((y32,),) = run_plain(program, [(x,)], torch.float32)
    ((y64,),) = run_plain(program, [(x,)], torch.float64)
    torch.testing.assert_close(y64, ref, rtol=1e-12, atol=1e-12 * float(ref.abs().max()))
    torch.testing.assert_close(y32.double(), ref, rtol=1e-5, atol=1e-5 * float(ref.abs().max()))


def test_overlapping_block_runs_give_torchs_thread_count_back(monkeypatch):
    """Two float64 runs whose blocks overlap in time (A enters, B enters, A leaves, B leaves: folds in a thread
    pool) leave torch's thread count as they found it, for the calling thread and for a new one.  Before, B saved
    the 1 that A had set and restored it last."""
    import threading

    before = torch.get_num_threads()
    if before < 2:
        torch.set_num_threads(2)
    found = torch.get_num_threads()
    a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()
    waits = {"A": (a_in, b_in), "B": (b_in, a_out)}

    def blocks(step, *_):  # the blocks of run A or B: say it is in, wait for the other's turn
        entered, then = waits[step]
        entered.set()
        then.wait(10)
        return []

    monkeypatch.setattr(ranges, "_blocks", blocks)

    def first():
        ranges._by_channels("A", [], 0, None, torch.float64)
        a_out.set()

    def second():
        a_in.wait(10)
        ranges._by_channels("B", [], 0, None, torch.float64)

    try:
        threads = [threading.Thread(target=first), threading.Thread(target=second)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(20)
        seen = []
        probe = threading.Thread(target=lambda: seen.append(torch.get_num_threads()))
        probe.start()
        probe.join()
        assert a_out.is_set() and torch.get_num_threads() == found and seen == [found], (torch.get_num_threads(), seen)
    finally:
        torch.set_num_threads(before)


def test_the_proof_leaves_torchs_thread_count_as_it_found_it(tmp_path, monkeypatch):
    """A library must not change its caller's global state: the float64 proof runs its blocks on one torch thread
    (:func:`ranges._one_thread`) and gives the count back, through ``bnfold.fold(..., fp16_range=)`` and the
    command line (plain and ``--low-memory``)."""
    src = tmp_path / "in"
    src.mkdir()
    path, _ = _model(src, n=2)
    x = np.load(_inputs(tmp_path))["x"]
    inside, real = [], ranges._blocks
    monkeypatch.setattr(ranges, "_blocks", lambda *a: inside.append(torch.get_num_threads()) or real(*a))
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(3)
        result = bnfold.fold(path, fp16_range=[(torch.from_numpy(b),) for b in x])
        assert any(e.factor != 1.0 for e in result.report.rescaled)  # the rewrite applied, after its proof
        assert inside and set(inside) == {1} and torch.get_num_threads() == 3, (inside, torch.get_num_threads())
        for extra in ([], ["--low-memory"]):
            inside.clear()
            out = tmp_path / f"out{len(extra)}.onnx"
            assert main(["fold", path, "-o", str(out), "-q", "--fp16-range", _inputs(tmp_path), *extra]) == 0
            assert inside and set(inside) == {1} and torch.get_num_threads() == 3, (extra, inside)
    finally:
        torch.set_num_threads(before)


def _rewrite_reads(monkeypatch) -> tuple[dict, list]:
    """Count each tensor's reads from the data or scratch file while the range rewrite (``rescale_graph``) runs:
    ``(reads by tensor name, inside)``, ``inside`` non-empty while it runs (cleared, nothing is counted)."""
    from bnfold import rescale

    return _reads_inside(monkeypatch, rescale, "rescale_graph")


def _reads_inside(monkeypatch, module, name: str) -> tuple[dict, list]:
    """Count each tensor's reads from the data or scratch file while ``module.name`` runs: ``(reads by tensor name,
    inside)``, ``inside`` non-empty while it runs (cleared, nothing is counted)."""
    reads, inside = {}, []
    real_read, real = onnx_stream.ExternalSource.read, getattr(module, name)

    def read(self, t):
        if inside:
            reads[t.name] = reads.get(t.name, 0) + 1
        return real_read(self, t)

    def counted(*args):
        inside.append(True)
        try:
            return real(*args)
        finally:
            inside.clear()

    monkeypatch.setattr(onnx_stream.ExternalSource, "read", read)
    monkeypatch.setattr(module, name, counted)
    return reads, inside


def test_the_rewrite_reads_a_large_weight_once_per_write(tmp_path, monkeypatch):
    """The range rewrite (plan and edits) of a streamed model reads each large weight from the data or scratch file
    once for each time it writes it: its span is the one the calibration measured as it read it (``Planner.known``),
    its span after a write the old one scaled by the power of two; asking whether a node is a layer, and the check of
    a scale its span shows exact, look at its shape.  Before: 10 reads of each of the four middle weights (6 of the
    last) for 2 writes (1), then 3 (2) with one for the span, 2 (1) now."""
    src = tmp_path / "in"
    src.mkdir()
    path, _ = _model(src)
    reads, inside = _rewrite_reads(monkeypatch)
    writes = {}
    real_refer, real_again = onnx_stream.ExternalSource.refer, onnx_stream.ExternalSource.again

    def written(real):  # a weight written: to the scratch file (refer) or to be made again at the save (again)
        def write(self, t, *args):
            out = real(self, t, *args)
            if inside and out is not None:
                writes[t.name] = writes.get(t.name, 0) + 1
            return out

        return write

    monkeypatch.setattr(onnx_stream.ExternalSource, "refer", written(real_refer))
    monkeypatch.setattr(onnx_stream.ExternalSource, "again", written(real_again))
    out = tmp_path / "out"
    out.mkdir()
    args = ["fold", path, "-o", str(out / "out.onnx"), "-q", "--fp16-range", _inputs(tmp_path), "--low-memory"]
    assert main(args) == 0
    large = {"proj", *(f"l{i}.w" for i in range(4))}
    assert set(writes) == large and all(writes.values())  # every large weight rewritten (the count sees writes)
    assert reads == writes, (reads, writes)


def _hot_operand_model(folder) -> tuple[str, str]:
    """``r = relu((x + big) * small)`` with ``big`` a 512x512 float32 operand of magnitudes up to about 1.4e5 (past
    fp16's range: the rewrite scales it and ``small``, 2^-8, back) saved in ``m.data``, and its inputs: (model,
    inputs)."""
    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("Add", ["x", "big"], ["y"], name="add"),
        helper.make_node("Mul", ["y", "small"], ["z"], name="mul"),
        helper.make_node("Relu", ["z"], ["r"], name="relu"),
    ]
    inits = {"big": (rng.standard_normal((512, 512)) * 3e4).astype(np.float32), "small": np.float32([2.0**-8])}
    path, npz = os.path.join(folder, "m.onnx"), os.path.join(folder, "in.npz")
    model = _one_layer(nodes, {"x": (512, 512)}, inits, ("r", (512, 512)))
    onnx.save(model, path, save_as_external_data=True, location="m.data", size_threshold=1024)
    np.savez(npz, x=rng.standard_normal((2, 512, 512)).astype(np.float32))
    return path, npz


def test_a_rescaled_constant_operands_span_is_the_old_one_scaled(tmp_path, monkeypatch):
    """The range rewrite reads a streamed constant operand it rescales once, to write it (its span, the plan's, is the
    one the calibration measured: ``Planner.known``); the written constant's span is the old one times the power of
    two (``Planner.keep_operand_span``: each element exact, or it is not written), equal to the span read from the
    written constant, so ``HotConstants`` does not read it again (before: ``big_range`` read once more, by ``hot``;
    then ``big`` once more for its span).  The files and report are the plain fold's."""
    from bnfold.engine.range_planner import Planner, span

    src = tmp_path / "in"
    src.mkdir()
    path, npz = _hot_operand_model(src)
    reads, inside = _rewrite_reads(monkeypatch)
    kept, real_keep = [], Planner.keep_operand_span

    def keep(self, node, slot, was, exponent):
        before = dict(self._const_spans)
        real_keep(self, node, slot, was, exponent)
        inside.clear()  # the check's reads are not the rewrite's
        kept.extend((v, s, span(self._const(v))) for v, s in self._const_spans.items() if v not in before)
        inside.append(True)

    monkeypatch.setattr(Planner, "keep_operand_span", keep)
    report = _plain_and_streamed(tmp_path, path, npz)
    assert [(e["value"], e["kind"], e["code"]) for e in report["rescaled"]] == [("y", "constant", "rescaled")]
    assert reads == {"big": 1}, reads
    assert sorted(v.name for v, _, _ in kept) == ["big_range"] * 2 + ["small_range"] * 2, kept  # each route's
    assert all(got == want for _, got, want in kept), kept  # as read from the written constant
