"""The streamed ONNX fold (``bnfold fold --low-memory`` on a model with external data): the same files as the
plain fold, the input untouched, hostile references refused in one line, and a bounded peak."""

from __future__ import annotations

import errno
import hashlib
import os
import re
import subprocess
import sys

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper
from stream_models import edge_cases, largest_tensor, linear_stack

import bnfold
from bnfold.cli.main import main
from bnfold.errors import ModelFileError


def _stack(n: int = 3, width: int = 64) -> onnx.ModelProto:
    return linear_stack(n, width)


def _external(model: onnx.ModelProto, folder, layout: str) -> str:
    """Save ``model`` in ``folder`` with its weights outside: one data file, one file per tensor, or mixed
    (the small tensors inline, the weights in one file)."""
    path = os.path.join(folder, "m.onnx")
    onnx.save(
        model,
        path,
        save_as_external_data=True,
        all_tensors_to_one_file=layout != "many",
        location="m.data",
        size_threshold=1024 if layout == "mixed" else 0,
    )
    return path


def _files(folder) -> dict[str, str]:
    return {
        f: hashlib.sha256(open(os.path.join(folder, f), "rb").read()).hexdigest() for f in sorted(os.listdir(folder))
    }


@pytest.mark.parametrize("layout", ["one", "many", "mixed"])
def test_streamed_fold_writes_the_plain_folds_files_and_leaves_the_input(tmp_path, layout):
    src = tmp_path / "in"
    src.mkdir()
    path = _external(_stack(width=128), src, layout)
    before = _files(src)
    outs = {}
    for name, extra in (("plain", []), ("stream", ["--low-memory"])):
        (tmp_path / name).mkdir()
        out = str(tmp_path / name / "out.onnx")
        assert main(["fold", path, "-o", out, "-q", *extra]) == 0
        outs[name] = _files(tmp_path / name)
    assert outs["stream"] == outs["plain"]
    assert set(outs["plain"]) == {"out.onnx", "out.onnx.data"}
    assert _files(src) == before  # the input and its data files are untouched
    folded = onnx.load(str(tmp_path / "stream" / "out.onnx"))
    assert not any(n.op_type == "BatchNormalization" for n in folded.graph.node)
    assert sum(n.op_type == "Mul" for n in folded.graph.node) < 3  # the layers' scales were folded


def test_streamed_fold_of_a_model_without_external_data(tmp_path):
    path = str(tmp_path / "m.onnx")
    onnx.save(_stack(), path)
    for name, extra in (("a.onnx", []), ("b.onnx", ["--low-memory"])):
        assert main(["fold", path, "-o", str(tmp_path / name), "-q", *extra]) == 0
    assert (tmp_path / "a.onnx").read_bytes() == (tmp_path / "b.onnx").read_bytes()


@pytest.mark.parametrize(
    ("entries", "says"),
    [
        ({"location": "../evil.bin"}, "escapes the model's folder"),
        ({"location": "/etc/passwd"}, "absolute path"),
        ({"location": "m.data", "offset": "999999999"}, "truncated"),
        ({"location": "m.data", "length": "4"}, "but the tensor needs"),
        ({"location": "m.data", "offset": "-8"}, "negative offset"),
    ],
)
def test_streamed_load_refuses_a_hostile_reference_in_one_line(tmp_path, capsys, entries, says):
    src = tmp_path / "in"
    src.mkdir()
    path = _external(_stack(), src, "one")
    m = onnx.load(path, load_external_data=False)
    t = next(t for t in m.graph.initializer if t.name == "l0.w")
    info = {e.key: e.value for e in t.external_data}
    info.update(entries)
    del t.external_data[:]
    for k, v in info.items():
        e = t.external_data.add()
        e.key, e.value = k, v
    onnx.save(m, path)
    out = tmp_path / "out.onnx"
    assert main(["fold", path, "-o", str(out), "-q", "--low-memory"]) != 0
    err = capsys.readouterr().err.strip()
    assert says in err and "\n" not in err and "Traceback" not in err
    assert not out.exists() and not (tmp_path / "out.onnx.data").exists()


@pytest.mark.parametrize("location", ["\0bnfold-stream:0", "\0bnfold-stream:scratch", "m.data\0x"])
@pytest.mark.parametrize("extra", [[], ["--low-memory"]])
def test_a_location_with_a_nul_byte_is_refused_in_one_line(tmp_path, capsys, location, extra):
    """A location holding a NUL byte (no file has one; the streamed load's own tokens start with one) is a file
    error, plain and streamed: before, the output checks' ``realpath`` raised ValueError (exit 3, internal error)."""
    src = tmp_path / "in"
    src.mkdir()
    path = _external(_stack(), src, "one")
    m = onnx.load(path, load_external_data=False)
    t = next(t for t in m.graph.initializer if t.name == "l0.w")
    next(e for e in t.external_data if e.key == "location").value = location
    (src / "m.onnx").write_bytes(m.SerializeToString())
    out = tmp_path / "out.onnx"
    assert main(["fold", path, "-o", str(out), "-q", *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert "NUL byte in its location" in err and "'l0.w'" in err and "\n" not in err, err
    assert not out.exists() and not (tmp_path / "out.onnx.data").exists()
    with pytest.raises(ModelFileError, match="NUL byte"):
        bnfold.fold(path)  # the API streams an .onnx path


def test_two_tensors_on_the_same_bytes_are_refused(tmp_path, capsys):
    src = tmp_path / "in"
    src.mkdir()
    path = _external(_stack(), src, "one")
    m = onnx.load(path, load_external_data=False)
    a, b = (t for t in m.graph.initializer if t.name in ("l0.w", "l1.w"))
    b.ClearField("external_data")
    b.external_data.extend(a.external_data)
    onnx.save(m, path)
    assert main(["fold", path, "-o", str(tmp_path / "o.onnx"), "-q", "--low-memory"]) != 0
    assert "read the same bytes" in capsys.readouterr().err


_PEAK = """
import sys
from bnfold.cli.main import main
rc = main(sys.argv[1:])
with open("/proc/self/status") as f:
    print(next(int(l.split()[1]) for l in f if l.startswith("VmHWM")) * 1024)
sys.exit(rc)
"""


def _peak(args: list[str]) -> int:
    run = subprocess.run(
        [sys.executable, "-c", _PEAK, *args], capture_output=True, text=True, env=dict(os.environ), timeout=600
    )
    assert run.returncode == 0, run.stderr[-2000:]
    return int(run.stdout.split()[-1])


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads VmHWM from /proc")
def test_streamed_peak_is_bounded_by_the_largest_tensor(tmp_path):
    """24 layers of 4 MB (96 MB of weights), each fold in a fresh process: what the streamed fold's peak rises
    above the same fold of a 2-layer model of 64 KB tensors (the same imports and code) is under the largest
    tensor and 3 MiB (the weight read, a block of its product at a time, the larger graph: 4 MiB + 1.6 MiB
    measured; + 5.6 MiB when the folded copy was made whole, 6.2x the tensor when each weight was read three
    times and copied), not the weights; the plain fold holds them several times over."""
    small, big = tmp_path / "small", tmp_path / "big"
    small.mkdir(), big.mkdir()
    tiny = _external(_stack(n=2, width=128), small, "one")
    model = _stack(n=24, width=1024)
    largest = largest_tensor(model)  # before the save moves the data out
    path = _external(model, big, "one")
    weights = os.path.getsize(big / "m.data")
    base = _peak(["fold", tiny, "-o", str(tmp_path / "t.onnx"), "-q", "--low-memory"])
    stream = _peak(["fold", path, "-o", str(tmp_path / "s.onnx"), "-q", "--low-memory"]) - base
    plain = _peak(["fold", path, "-o", str(tmp_path / "p.onnx"), "-q"]) - base
    assert plain > 2 * weights  # the plain fold holds the input and the folded copy
    assert stream < largest + 3 * 2**20 < weights / 2, (stream - largest, plain, weights)


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads VmHWM from /proc")
def test_a_refused_streamed_fold_peaks_at_the_tensor_too(tmp_path):
    """A 16 MB MatMul weight whose product overflows: the refusal names the problem from float64 blocks, so the
    peak over the small model's stays under the tensor and 3 MiB (1.09x the tensor measured; 14.7x when the
    float64 product was made whole), and the output keeps the weight's bytes."""

    small, big = tmp_path / "small", tmp_path / "big"
    small.mkdir(), big.mkdir()
    tiny = _external(_stack(n=2, width=128), small, "one")
    n = 2048
    w = (np.random.default_rng(0).standard_normal((n, n)) / 64).astype(np.float32)
    w[5, 9] = 1e38
    s = np.ones(n, np.float32)
    s[9] = 8.0
    path = _external(_matmul_mul(w, s), big, "one")
    base = _peak(["fold", tiny, "-o", str(tmp_path / "t.onnx"), "-q", "--low-memory"])
    out = tmp_path / "out.onnx"
    refused = _peak(["fold", path, "-o", str(out), "-q", "--low-memory"]) - base
    assert refused < w.nbytes + 3 * 2**20, refused / w.nbytes
    assert (tmp_path / "out.onnx.data").read_bytes()[: w.nbytes] == w.tobytes()  # the weight as it was


def _matmul_mul(w: np.ndarray, s: np.ndarray) -> onnx.ModelProto:
    """x @ w * s, of ``w``'s element type."""
    kind = helper.np_dtype_to_tensor_dtype(w.dtype)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"], name="mm"), helper.make_node("Mul", ["m", "s"], ["y"])]
    io = [helper.make_tensor_value_info(v, kind, [1, n]) for v, n in (("x", w.shape[0]), ("y", w.shape[1]))]
    graph = helper.make_graph(
        nodes, "g", io[:1], io[1:], [numpy_helper.from_array(w, "w"), numpy_helper.from_array(s, "s")]
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads VmHWM from /proc")
def test_a_float64_weight_folds_streamed_within_the_tensor(tmp_path):
    """A 16 MiB float64 MatMul weight folded with --low-memory: its product is checked and made again a block at a
    time as the float32 ones are (before, made whole in float64 beside the weight and stored: 3.8x the tensor over
    the small model's peak, measured with 32 MiB), so the peak over the small model's is under the tensor and
    3 MiB; the files are the plain fold's."""
    small, big = tmp_path / "small", tmp_path / "big"
    small.mkdir(), big.mkdir()
    tiny = _external(_stack(n=2, width=128), small, "one")
    rng = np.random.default_rng(0)
    w, s = rng.standard_normal((2048, 1024)) / 32, rng.uniform(0.5, 2.0, 1024)
    path = _external(_matmul_mul(w, s), big, "one")
    base = _peak(["fold", tiny, "-o", str(tmp_path / "t.onnx"), "-q", "--low-memory"])
    (tmp_path / "plain").mkdir(), (tmp_path / "stream").mkdir()
    stream = _peak(["fold", path, "-o", str(tmp_path / "stream" / "out.onnx"), "-q", "--low-memory"]) - base
    assert stream < w.nbytes + 3 * 2**20, stream / w.nbytes
    assert main(["fold", path, "-o", str(tmp_path / "plain" / "out.onnx"), "-q"]) == 0
    assert _files(tmp_path / "stream") == _files(tmp_path / "plain")


def _pruned(n: int, dtype, seed: int = 0) -> onnx.ModelProto:
    """x @ w * s with w ``[n, n]`` of ``dtype`` and a pruned channel: s[5] is 0 beside scales <= 1/2, so the
    product's checks in the weight's dtype cannot tell a zeroed weight from a lost one and the fold takes the
    float64 route (the float64 product rounded once)."""
    rng = np.random.default_rng(seed)
    w, s = rng.standard_normal((n, n)) / 32, rng.uniform(0.25, 2.0, n)
    s[5] = 0.0
    return _matmul_mul(w.astype(dtype), s.astype(dtype))


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads VmHWM from /proc")
def test_a_weight_with_a_zero_scale_folds_streamed_within_the_tensor(tmp_path):
    """A 16 MiB float32 MatMul weight times scales with a zero channel (a pruned BatchNorm's gamma 0), folded with
    --low-memory: the float64 route's product is checked a block at a time and made again by that route at the
    save (before, made whole beside the weight: 2.0x the tensor over the small model's peak), so the peak over
    the small model's is under the tensor and 3 MiB; the files are the plain fold's."""
    small, big = tmp_path / "small", tmp_path / "big"
    small.mkdir(), big.mkdir()
    tiny = _external(_stack(n=2, width=128), small, "one")
    path = _external(_pruned(2048, np.float32), big, "one")
    nbytes = 2048 * 2048 * 4
    base = _peak(["fold", tiny, "-o", str(tmp_path / "t.onnx"), "-q", "--low-memory"])
    (tmp_path / "plain").mkdir(), (tmp_path / "stream").mkdir()
    stream = _peak(["fold", path, "-o", str(tmp_path / "stream" / "out.onnx"), "-q", "--low-memory"]) - base
    assert stream < nbytes + 3 * 2**20, stream / nbytes
    assert main(["fold", path, "-o", str(tmp_path / "plain" / "out.onnx"), "-q"]) == 0
    assert _files(tmp_path / "stream") == _files(tmp_path / "plain")


@pytest.mark.parametrize("again", [True, False], ids=["made again", "spilled"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_a_zero_scale_streams_by_the_float64_route_never_whole(tmp_path, dtype, again, monkeypatch):
    """The float64 route's product (a zero channel beside small scales) is deferred too: made again from the
    weight read again where it is saved, or (a weight the source cannot read again) spilled as its checks made it;
    never made whole (before: a tensor made whole beside the weight); the files are the plain fold's, the pruned
    channel's column zero."""
    from bnfold import fold_math
    from bnfold.io import onnx_stream
    from bnfold.onnx import tensors

    src = tmp_path / "in"
    src.mkdir()
    path = _external(_pruned(512, dtype), src, "one")
    if not again:
        _no_reading_again(monkeypatch)
    used, ended = [], []
    real_refer, real_again = onnx_stream.ExternalSource.refer, onnx_stream.ExternalSource.again
    real_done = tensors._TorchSpill.done
    monkeypatch.setattr(tensors._TorchSpill, "done", lambda self, ok: ended.append(ok) or real_done(self, ok))
    monkeypatch.setattr(fold_math.Product, "materialize", lambda self: pytest.fail("a streamed product made whole"))
    monkeypatch.setattr(
        onnx_stream.ExternalSource, "refer", lambda self, t, *a: used.append("refer") or real_refer(self, t, *a)
    )
    monkeypatch.setattr(
        onnx_stream.ExternalSource, "again", lambda self, t, *a: used.append("again") or real_again(self, t, *a)
    )
    outs = _plain_and_streamed(tmp_path, path)
    assert outs["stream"] == outs["plain"]
    assert used == ["again" if again else "refer"]
    # spilled: the in-dtype checks' blocks dropped, the float64 route's kept and referred to (before: [False])
    assert ended == ([] if again else [False, True])
    out = onnx.load(str(tmp_path / "stream" / "out.onnx"))
    assert not any(n.op_type == "Mul" for n in out.graph.node)  # folded
    w = numpy_helper.to_array(next(t for t in out.graph.initializer if t.name == "w"))
    assert not w[:, 5].any() and w[:, 4].any()


def _plain_and_streamed(tmp_path, path: str) -> dict[str, dict[str, str]]:
    outs = {}
    for name, extra in (("plain", []), ("stream", ["--low-memory"])):
        (tmp_path / name).mkdir()
        assert main(["fold", path, "-o", str(tmp_path / name / "out.onnx"), "-q", *extra]) == 0
        outs[name] = _files(tmp_path / name)
    return outs


def test_without_the_kernels_copy_the_save_copies_through_memory(tmp_path, monkeypatch):
    """Where ``copy_file_range`` cannot copy (another file system, an old kernel), the streamed save copies the
    same bytes in chunks."""
    src = tmp_path / "in"
    src.mkdir()
    path = _external(_stack(width=128), src, "one")
    calls = []

    def refuse(*args):
        calls.append(args)
        raise OSError(errno.EXDEV, "cross-device")

    monkeypatch.setattr(os, "copy_file_range", refuse, raising=False)
    outs = _plain_and_streamed(tmp_path, path)
    assert calls and outs["stream"] == outs["plain"]


def test_a_tensor_the_fold_does_not_change_never_enters_user_space(tmp_path, monkeypatch):
    """A streamed weight the fold leaves as it is (the projection behind a Reshape, which the input rule looks
    at; a layer ``--exclude`` skips) is never read into memory: the rules learn its shape from the file's dims
    and read a weight only once a chain reaches it, and the save copies its bytes file to file in the kernel.
    The folded weights are read once each by the fold and once more by the save, which makes their products again
    from them.  Counted, not timed; the files are the plain fold's."""
    from bnfold.io import onnx_stream

    src = tmp_path / "in"
    src.mkdir()
    path = _external(linear_stack(3, 128), src, "mixed")  # proj 128 KiB, each layer's weight 64 KiB: streamed
    reads, copies = [], []
    real_read, real_copy = onnx_stream.ExternalSource._read, onnx_stream._copy_range

    def read(self, t):  # a tensor of the data file (a product made again reads its weight there)
        if self.where(t)[0]:
            reads.append(t.name)
        return real_read(self, t)

    monkeypatch.setattr(onnx_stream.ExternalSource, "_read", read)

    def copy(*args, kernel=True):
        copies.append(kernel)
        return real_copy(*args, kernel=kernel)

    monkeypatch.setattr(onnx_stream, "_copy_range", copy)
    outs = {}
    for name, extra in (("plain", []), ("stream", ["--low-memory"])):
        (tmp_path / name).mkdir()
        out = str(tmp_path / name / "out.onnx")
        assert main(["fold", path, "-o", out, "-q", "--exclude", "l1", *extra]) == 0
        outs[name] = _files(tmp_path / name)
    assert outs["stream"] == outs["plain"]
    assert sorted(reads) == ["l0.w", "l0.w", "l2.w", "l2.w"]  # not proj, not the excluded l1.w
    assert copies and all(copies)  # every streamed tensor the fold left (proj, l1.w) copied by the kernel


def _streamed_reads(tmp_path, monkeypatch, model: onnx.ModelProto) -> tuple[list[str], dict]:
    """``model`` saved with every tensor in ``m.data`` and folded plain and with ``--low-memory``: the names of the
    tensors the streamed route read, in order (the plain route reads none), and the report; the two routes' files
    and reports (but the output's path and the seconds) are the same."""
    import json

    from bnfold.io import onnx_stream

    src = tmp_path / "in"
    src.mkdir()
    path = str(src / "m.onnx")
    onnx.save(model, path, save_as_external_data=True, location="m.data", size_threshold=0)
    reads = []
    real_read = onnx_stream.ExternalSource.read
    monkeypatch.setattr(onnx_stream.ExternalSource, "read", lambda self, t: reads.append(t.name) or real_read(self, t))
    outs, reports = {}, {}
    for name, extra in (("plain", []), ("stream", ["--low-memory"])):
        (tmp_path / name).mkdir()
        report = tmp_path / f"{name}.json"
        assert main(["fold", path, "-o", str(tmp_path / name / "out.onnx"), "-q", "--report", str(report), *extra]) == 0
        outs[name] = _files(tmp_path / name)
        reports[name] = json.loads(report.read_text())
        del reports[name]["output"], reports[name]["summary"]["seconds"]
    assert outs["stream"] == outs["plain"]
    assert reports["stream"] == reports["plain"]
    return reads, reports["stream"]


def _unread_model(case: str) -> onnx.ModelProto:
    """Streamed weights (64x32x3x3 float32, 72 KiB) that nothing folds into: two convs fed by a BatchNorm whose
    variance is a graph input (the fan-out rule looks, its chain has no constant step), a conv whose output
    is added to a graph input (the branch-merge rule looks: no sum of its own branches), a conv whose chain is
    a max-pool and a negative scale (the retry loop drops the scale: a maximum commutes only with a non-negative
    one), or a BatchNorm with a shift feeding one or two padded convs (the fold math refuses the shift, from the
    shift and the padding alone); ``retried``: an Add, then a Mul, into a padded conv (the Add is dropped, the Mul
    folds: W1 is read, once)."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w = [numpy_helper.from_array(rng.standard_normal((64, 32, 3, 3)).astype(np.float32), f"W{i}") for i in (1, 2)]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 32, 8, 8])
    if case == "fanout":
        stats = [
            numpy_helper.from_array(np.full(32, v, np.float32), n) for n, v in (("s", 2.0), ("b", 1.0), ("m", 0.0))
        ]
        nodes = [
            helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["h"], name="bn"),
            helper.make_node("Conv", ["h", "W1"], ["y1"], pads=[1, 1, 1, 1], name="c1"),
            helper.make_node("Conv", ["h", "W2"], ["y2"], pads=[1, 1, 1, 1], name="c2"),
        ]
        inputs, outputs, inits = (
            [x, helper.make_tensor_value_info("v", TensorProto.FLOAT, [32])],
            ["y1", "y2"],
            w + stats,
        )
    elif case.startswith("padded"):
        stats = [numpy_helper.from_array(np.full(32, v, np.float32), n) for n, v in zip("sbmv", (2.0, 1.0, 0.0, 1.0))]
        convs = ("c1", "c2") if case == "padded_fanout" else ("c1",)
        nodes = [helper.make_node("BatchNormalization", ["x", *"sbmv"], ["h"], name="bn")] + [
            helper.make_node("Conv", ["h", f"W{c[1]}"], [f"y{c[1]}"], pads=[1, 1, 1, 1], name=c) for c in convs
        ]
        inputs, outputs, inits = [x], [f"y{c[1]}" for c in convs], w[: len(convs)] + stats
    elif case == "retried":
        k, t = (numpy_helper.from_array(np.full((1, 32, 1, 1), v, np.float32), n) for n, v in (("k", 2.0), ("t", 1.0)))
        nodes = [
            helper.make_node("Add", ["x", "t"], ["a"], name="add"),
            helper.make_node("Mul", ["a", "k"], ["h"], name="mul"),
            helper.make_node("Conv", ["h", "W1"], ["y1"], pads=[1, 1, 1, 1], name="c1"),
        ]
        inputs, outputs, inits = [x], ["y1"], [w[0], k, t]
    elif case == "maxpool":
        scale = numpy_helper.from_array(np.linspace(-1, 1, 64, dtype=np.float32).reshape(1, 64, 1, 1), "k")
        nodes = [
            helper.make_node("Conv", ["x", "W1"], ["c"], pads=[1, 1, 1, 1], name="c1"),
            helper.make_node("MaxPool", ["c"], ["p"], kernel_shape=[2, 2], strides=[2, 2], name="pool"),
            helper.make_node("Mul", ["p", "k"], ["y1"], name="mul"),
        ]
        inputs, outputs, inits = [x], ["y1"], [w[0], scale]
    else:
        nodes = [
            helper.make_node("Conv", ["x", "W1"], ["c"], pads=[1, 1, 1, 1], name="c1"),
            helper.make_node("Add", ["c", "r"], ["y1"], name="add"),
        ]
        inputs, outputs, inits = (
            [x, helper.make_tensor_value_info("r", TensorProto.FLOAT, [1, 64, 8, 8])],
            ["y1"],
            w[:1],
        )
    outs = [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs]
    graph = helper.make_graph(nodes, "g", inputs, outs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize(
    "case, read",
    [(c, []) for c in ("fanout", "residual", "maxpool", "padded_input", "padded_fanout")] + [("retried", ["W1"])],
)
def test_a_weight_the_rules_only_look_at_is_not_read(tmp_path, monkeypatch, case, read):
    """The rules check a streamed weight's shape from its dims and read it only once there are branches to merge
    or a chain the retry loop is about to fold: nothing is read where there is none (before: W1 and W2 read once
    each by the fan-out check, W1 by the merge rule; W1 for the chain the max-pool crossing leaves, W1 (and W2) for
    the shift the padding refuses), and a weight the loop folds after a retry is read once. The files are the plain
    fold's."""
    reads, _ = _streamed_reads(tmp_path, monkeypatch, _unread_model(case))
    assert reads == read


def _large_constant_model(op: str) -> onnx.ModelProto:
    """A streamed 1 MiB constant ``C`` that is no per-channel vector: added to a MatMul's [1, 256, 1024] product
    ("add", C [256, 1024]), or multiplying a conv's [1, 16, 128, 128] output that a BatchNorm reads ("mul",
    C [16, 128, 128])."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)

    def init(name, shape):
        return numpy_helper.from_array((rng.random(shape) + 0.5).astype(np.float32), name)

    if op == "add":
        inits = [init("W", (16, 1024)), init("C", (256, 1024))]
        nodes = [
            helper.make_node("MatMul", ["x", "W"], ["m"], name="mm"),
            helper.make_node("Add", ["m", "C"], ["y"], name="add"),
        ]
        x_dims, y_dims = [1, 256, 16], [1, 256, 1024]
    else:
        inits = [init("W", (16, 8, 3, 3)), init("C", (16, 128, 128))] + [init(n, (16,)) for n in ("s", "b", "mu", "v")]
        nodes = [
            helper.make_node("Conv", ["x", "W"], ["c"], name="conv", pads=[1, 1, 1, 1]),
            helper.make_node("Mul", ["c", "C"], ["p"], name="mul"),
            helper.make_node("BatchNormalization", ["p", "s", "b", "mu", "v"], ["y"], name="bn"),
        ]
        x_dims, y_dims = [1, 8, 128, 128], [1, 16, 128, 128]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, x_dims)
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, y_dims)
    return helper.make_model(
        helper.make_graph(nodes, "g", [x], [y], inits), opset_imports=[helper.make_opsetid("", 17)]
    )


@pytest.mark.parametrize("op", ["add", "mul"])
def test_a_large_constant_that_is_no_per_channel_vector_is_told_from_its_shape(tmp_path, monkeypatch, op):
    """Whether an ``Add`` after a MatMul is its bias (``onnx/ops._bias_add``) and whether the chain rule refuses an
    elementwise op by a constant (``engine/chain.binary_step``) are told from the constant's shape: a streamed 1 MiB
    constant that is no per-channel vector is not read.  Before 1231002 each parse of the MatMul as a layer read it
    (13 reads in one fold); before the chain rule asked for its shape, its refusal read it once.  The files and the
    report are the plain fold's; the op's refusal is reported."""
    reads, report = _streamed_reads(tmp_path, monkeypatch, _large_constant_model(op))
    assert reads.count("C") == 0, reads
    kept = [(k["node"], k["code"]) for k in report["kept_ops"]]
    assert kept == [(op, "not_per_channel")], report


def test_without_preadv_the_fold_reads_with_pread(tmp_path, monkeypatch):
    """Where ``os.preadv`` is missing, a streamed tensor is read with ``pread`` in chunks: the same files."""
    src = tmp_path / "in"
    src.mkdir()
    path = _external(_stack(width=128), src, "one")
    monkeypatch.delattr(os, "preadv", raising=False)
    monkeypatch.setattr("bnfold.io.onnx_stream._CHUNK", 1000)  # several reads per tensor
    outs = _plain_and_streamed(tmp_path, path)
    assert outs["stream"] == outs["plain"]


def test_a_data_file_cut_short_after_the_load_is_refused_in_one_line(tmp_path):
    """The streamed load checked the data file; one that shrinks before the fold reads it is a file error (the
    read finds its end), not a weight of zeros, and nothing is written."""
    from bnfold.io.onnx import load_onnx, save_onnx

    src = tmp_path / "in"
    src.mkdir()
    path = _external(_stack(width=128), src, "one")
    model, layout = load_onnx(path, stream=True)
    os.truncate(src / "m.data", os.path.getsize(src / "m.data") // 2)
    out = tmp_path / "out.onnx"
    with layout.reading(), pytest.raises(ModelFileError, match="changed while it was read") as err:
        save_onnx(bnfold.fold(model).model, out, layout)
    assert "\n" not in str(err.value)
    assert not out.exists() and not (tmp_path / "out.onnx.data").exists()


def test_an_unchanged_tensor_cut_short_after_the_load_is_refused_at_the_save(tmp_path):
    """A tensor the fold leaves is never read, only copied by the kernel at the save: a data file cut short under it
    after the load makes that copy come back short, a one-line file error, and nothing is written."""
    from bnfold.io.onnx import load_onnx, save_onnx

    src = tmp_path / "in"
    src.mkdir()
    path = _external(linear_stack(3, 128), src, "mixed")  # l2.w, the last tensor of m.data, is left by --exclude
    model, layout = load_onnx(path, stream=True)
    os.truncate(src / "m.data", os.path.getsize(src / "m.data") - 1000)
    out = tmp_path / "out.onnx"
    with layout.reading(), pytest.raises(ModelFileError, match="changed while it was read") as err:
        result = bnfold.fold(model, exclude=["l2"])
        assert [e.into for e in result.report.folded][-1] == "l1"  # the fold itself read what it folded: l0.w, l1.w
        save_onnx(result.model, out, layout)
    assert "'m.data' changed" in str(err.value) and "\n" not in str(err.value)
    assert not out.exists() and not (tmp_path / "out.onnx.data").exists()
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".tmp")]


def _rewrite_in_place(data) -> None:
    """Other bytes of the same size written over ``data`` (a new export to the same path, in place)."""
    n = os.path.getsize(data)
    with open(data, "r+b") as f:
        f.write(np.random.default_rng(5).standard_normal(n // 4).astype(np.float32).tobytes())


def _replace_keeping_times(data) -> None:
    """A new file of the same size moved over ``data`` (another inode), given the old one's times."""
    st = os.stat(data)
    new = f"{data}.new"
    with open(new, "wb") as f:
        f.write(np.random.default_rng(5).standard_normal(st.st_size // 4).astype(np.float32).tobytes())
    os.utime(new, ns=(st.st_atime_ns, st.st_mtime_ns))
    os.replace(new, data)


@pytest.mark.parametrize("change", [_rewrite_in_place, _replace_keeping_times])
@pytest.mark.parametrize("when", ["before the fold", "before the save"])
def test_a_data_file_changed_at_its_size_after_the_load_is_refused(tmp_path, change, when):
    """A data file rewritten with other bytes of the same size after the streamed load (in place, or another file
    moved over it with the old times) is refused where the fold reads it or the save copies from it: before, the
    save copied the new bytes of the tensors the fold left (never read) beside weights folded from the old ones, a
    mix of two models. Nothing is written."""
    from bnfold.io.onnx import load_onnx, save_onnx

    src = tmp_path / "in"
    src.mkdir()
    path = _external(linear_stack(3, 128), src, "mixed")
    os.utime(src / "m.data", ns=(0, 0))  # last written long ago: a rewrite now moves its times
    model, layout = load_onnx(path, stream=True)
    out = tmp_path / "out.onnx"
    with layout.reading(), pytest.raises(ModelFileError, match="'m.data' changed while it was read") as err:
        if when == "before the fold":
            change(src / "m.data")
        result = bnfold.fold(model, exclude=["l2"])  # l2.w is left: the save copies it, never read
        change(src / "m.data")
        save_onnx(result.model, out, layout)
    assert "\n" not in str(err.value)
    assert not out.exists() and not (tmp_path / "out.onnx.data").exists()
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".tmp")]


def test_a_data_file_written_while_the_save_copies_it_is_refused(tmp_path, monkeypatch):
    """The data file is checked again when a tensor's copy ends: bytes written into it during the copy are refused."""
    from bnfold.io import onnx_stream
    from bnfold.io.onnx import load_onnx, save_onnx

    src = tmp_path / "in"
    src.mkdir()
    path = _external(linear_stack(3, 128), src, "mixed")
    os.utime(src / "m.data", ns=(0, 0))
    model, layout = load_onnx(path, stream=True)
    copy = onnx_stream._copy_range

    def copy_then_write(*args, **kwargs):
        n = copy(*args, **kwargs)
        _rewrite_in_place(src / "m.data")
        return n

    monkeypatch.setattr(onnx_stream, "_copy_range", copy_then_write)
    out = tmp_path / "out.onnx"
    with layout.reading(), pytest.raises(ModelFileError, match="'m.data' changed while it was read"):
        save_onnx(bnfold.fold(model, exclude=["l2"]).model, out, layout)
    assert not out.exists() and not [f for f in os.listdir(tmp_path) if f.endswith(".tmp")]


def test_the_clis_refusal_at_the_save_names_the_input_once(tmp_path, monkeypatch, capsys):
    """``bnfold fold --low-memory`` whose input data changes before the save: one line, prefixed once, by the
    model whose data changed.  Before: the output's path was put in front of it too ("out.onnx: in/m.onnx: ...")."""
    from bnfold.io import models

    src = tmp_path / "in"
    src.mkdir()
    path = _external(linear_stack(3, 128), src, "mixed")
    os.utime(src / "m.data", ns=(0, 0))
    write = models._write_model

    def change_then_write(*args, **kwargs):
        _rewrite_in_place(src / "m.data")
        return write(*args, **kwargs)

    monkeypatch.setattr(models, "_write_model", change_then_write)
    out = tmp_path / "out.onnx"
    assert main(["fold", path, "-o", str(out), "--low-memory", "--exclude", "l2", "-q"]) == 2
    err = capsys.readouterr().err
    shape = (
        rf"bnfold: error: {re.escape(path)}: external data 'm.data' changed while it was read [^\n]*; load it again\n"
    )
    assert re.fullmatch(shape, err), err
    assert not out.exists() and not [f for f in os.listdir(tmp_path) if f.endswith(".tmp")]


@pytest.mark.parametrize(
    ("layout", "ranged"), [("one", False), ("many", False), ("mixed", False), ("none", False), ("one", True)]
)
def test_the_api_folds_an_onnx_path_streamed_to_the_model_the_plain_load_gives(tmp_path, layout, ranged, monkeypatch):
    """``bnfold.fold(path)`` reads an .onnx file streamed (the weights stay on disk while the fold runs) and
    returns the model, report and bytes that folding the plainly loaded model gives, holding every tensor; with
    ``fp16_range`` too (its rewrite scales weights: new tensors kept in the scratch file, then held)."""
    from bnfold.io import onnx_stream
    from bnfold.io.onnx import load_onnx

    src = tmp_path / "in"
    src.mkdir()
    model = _stack(width=128)
    if layout == "none":
        path = str(src / "m.onnx")
        onnx.save(model, path)
    else:
        path = _external(model, src, layout)
    before = _files(src)
    options = {"exclude": "l1*"}
    if ranged:  # inputs that take h1 past fp16's range: the rewrite scales the projection and what follows
        x = np.random.default_rng(0).standard_normal((2, 1, 3, 8, 8)).astype(np.float32) * 1e4
        options["fp16_range"] = [(torch.from_numpy(b),) for b in x]
    plain = bnfold.fold(load_onnx(path).model, **options)
    reads = []
    real_read = onnx_stream.ExternalSource.read
    monkeypatch.setattr(onnx_stream.ExternalSource, "read", lambda self, t: reads.append(t.name) or real_read(self, t))
    streamed = bnfold.fold(path, **options)
    assert streamed.model.SerializeToString() == plain.model.SerializeToString()
    untimed = lambda r: {**r.to_dict(), "summary": {**r.to_dict()["summary"], "seconds": 0}}  # noqa: E731
    assert untimed(streamed.report) == untimed(plain.report)
    assert not any(t.data_location == onnx.TensorProto.EXTERNAL for t in streamed.model.graph.initializer)
    assert bool(reads) == (layout != "none")  # the weights were read from disk one at a time
    assert any(e.factor != 1.0 for e in streamed.report.rescaled) == ranged
    assert _files(src) == before


def test_the_streamed_fold_with_fp16_range_writes_the_plain_folds_files(tmp_path):
    """``--fp16-range`` with ``--low-memory``: the fold, the rewrite's scaled weights and the save stream (the
    calibration and proof runs read each large weight when its op runs: tests/onnx/test_stream_range.py); the
    files are those of the plain fold."""
    src = tmp_path / "in"
    src.mkdir()
    path = _external(_stack(width=128), src, "one")
    x = np.random.default_rng(0).standard_normal((2, 1, 3, 8, 8)).astype(np.float32) * 1e4
    np.savez(tmp_path / "in.npz", x=x)
    outs = {}
    for name, extra in (("plain", []), ("stream", ["--low-memory"])):
        (tmp_path / name).mkdir()
        out = str(tmp_path / name / "out.onnx")
        assert main(["fold", path, "-o", out, "-q", "--fp16-range", str(tmp_path / "in.npz"), *extra]) == 0
        outs[name] = _files(tmp_path / name)
    assert outs["stream"] == outs["plain"]
    (tmp_path / "unranged").mkdir()
    assert outs["plain"] != _plain_and_streamed(tmp_path / "unranged", path)["plain"]  # the rewrite changed weights


def test_a_streamed_tensor_numpy_cannot_read_as_it_is_reads_as_the_plain_load(tmp_path):
    """A bfloat16 (or int16) tensor left on disk is read through onnx's own conversion, from the bytes the
    source read: the values the plain load gives."""
    from onnx import TensorProto, helper

    from bnfold.io.onnx import load_onnx
    from bnfold.onnx.tensors import to_numpy

    rng = np.random.default_rng(0)
    bits = rng.integers(0, 2**15, 64 * 1024, dtype=np.uint16)  # 128 KiB: left on disk
    tensors = [
        helper.make_tensor("bf", TensorProto.BFLOAT16, [256, 256], bits.tobytes(), raw=True),
        helper.make_tensor("i16", TensorProto.INT16, [256, 256], bits.astype(np.int16).tobytes(), raw=True),
    ]
    nodes = [helper.make_node("Identity", [t.name], [t.name + "_out"]) for t in tensors]
    outs = [helper.make_tensor_value_info(t.name + "_out", t.data_type, [256, 256]) for t in tensors]
    graph = helper.make_graph(nodes, "g", [], outs, tensors)
    path = str(tmp_path / "m.onnx")
    onnx.save(helper.make_model(graph), path, save_as_external_data=True, location="m.data", size_threshold=0)
    plain = {t.name: to_numpy(t) for t in load_onnx(path).model.graph.initializer}
    model, layout = load_onnx(path, stream=True)
    with layout.reading():
        assert all(t.data_location == TensorProto.EXTERNAL for t in model.graph.initializer)
        for t in model.graph.initializer:
            streamed = to_numpy(t)
            assert streamed.dtype == plain[t.name].dtype and streamed.tobytes() == plain[t.name].tobytes()


def _external_lengths(path: str) -> int:
    """Bytes the saved model's tensors refer to in external data (each range once)."""
    m = onnx.load(path, load_external_data=False)
    spans = set()
    for t in m.graph.initializer:
        if t.data_location == onnx.TensorProto.EXTERNAL:
            info = {e.key: e.value for e in t.external_data}
            spans.add((int(info.get("offset", 0)), int(info["length"])))
    return sum(length for _, length in spans)


def _no_reading_again(monkeypatch) -> None:
    """The streamed fold as for a weight the source cannot read again (a product of products five deep, scales as
    large as the weight): its product's checked blocks go to the scratch file."""
    monkeypatch.setattr("bnfold.onnx.tensors._read_again", lambda reader, weight: None)


@pytest.mark.parametrize("again", [True, False], ids=["made again", "spilled"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_every_edge_case_streams_to_the_plain_folds_bytes(tmp_path, dtype, again, monkeypatch):
    """A refusal mid-chain (the chain retried on the same weight), a shared weight, MatMul weights stored
    [in, out], fp16, products that overflow or underflow (nothing folds, the weight's bytes stay) and a fan-out
    whose second layer refuses (neither is written): the streamed fold writes the plain fold's files, folds each
    streamed weight as a deferred product (never whole in memory) and leaves no refused fold's bytes behind: made
    again from the weight read again where it is saved, or (a weight it cannot read again) spilled as checked."""
    from bnfold import fold_math
    from bnfold.io import onnx_stream
    from bnfold.io.onnx import load_onnx

    src = tmp_path / "in"
    src.mkdir()
    path = _external(edge_cases(dtype), src, "one")
    if not again:
        _no_reading_again(monkeypatch)
    made, spilled, remade = [], [], []
    real_stages, real_refer = fold_math.Product.stages, onnx_stream.ExternalSource.refer
    real_again = onnx_stream.ExternalSource.again

    def stages(self, in_place=False):  # a product made in a buffer of its own (in place: over its weight read again)
        if not in_place:
            made.append(self.shape)
        return real_stages(self, in_place)

    monkeypatch.setattr(fold_math.Product, "stages", stages)
    monkeypatch.setattr(fold_math.Product, "materialize", lambda self: pytest.fail("a streamed product made whole"))
    monkeypatch.setattr(
        onnx_stream.ExternalSource,
        "refer",
        lambda self, t, *a: spilled.append(tuple(t.dims)) or real_refer(self, t, *a),
    )
    monkeypatch.setattr(
        onnx_stream.ExternalSource, "again", lambda self, t, *a: remade.append(tuple(t.dims)) or real_again(self, t, *a)
    )
    outs = _plain_and_streamed(tmp_path, path)
    assert outs["stream"] == outs["plain"]
    # chain, shared_a, shared_b (one weight, written twice: a private copy and the original) and the conv: each
    # product made again from its weight where it is saved, or written as its checks made it (the scratch file)
    products = [(128, 32, 3, 3)] + [(512, 512)] * 3
    assert made == [] and sorted(remade if again else spilled) == products and not (spilled if again else remade)
    out = str(tmp_path / "stream" / "out.onnx")
    assert os.path.getsize(out + ".data") == _external_lengths(out)  # no bytes of a refused fold in the data
    before = {t.name: t for t in load_onnx(path).model.graph.initializer}
    after = {t.name: t for t in load_onnx(out).model.graph.initializer}
    for name in ("w.refused", "w.under", "w.fan_a", "w.fan_b"):  # refused: the input's bytes
        assert after[name].raw_data == before[name].raw_data
    for name in ("w.chain", "w.shared"):
        assert after[name].raw_data != before[name].raw_data
    streamed = bnfold.fold(path)  # the API on a path streams too
    plain = bnfold.fold(load_onnx(path).model)
    assert streamed.model.SerializeToString() == plain.model.SerializeToString()
    kept = {e["node"]: e["code"] for e in streamed.report.to_dict()["kept_ops"]}
    assert kept == {n: "cast_range" for n in ("chain.mul2", "refused.mul", "under.mul", "fan.mul")}
    folded = {e["norm"] for e in streamed.report.to_dict()["folded"]}
    assert folded == {"affine chain.mul1", "affine shared_a.mul", "affine shared_b.mul", "bn"}


def test_a_product_cut_short_leaves_no_bytes_in_the_scratch_file(tmp_path):
    """When the blocks of a new parameter stop coming (an error while they are made), the scratch file is cut
    back to where the parameter began: nothing of it is kept, what was stored before is."""
    from onnx import TensorProto

    from bnfold.io.onnx_stream import SPILL_BYTES, ExternalSource

    source = ExternalSource(str(tmp_path / "m.onnx"))
    block = np.arange(SPILL_BYTES, dtype=np.uint8)

    def cut():
        yield block
        raise ValueError("made no further")

    with source.reading():
        first = source.store_blocks(TensorProto(name="a", data_type=TensorProto.UINT8), [block, block], 2 * SPILL_BYTES)
        size = os.fstat(source.scratch.fileno()).st_size
        with pytest.raises(ValueError, match="made no further"):
            source.store_blocks(TensorProto(name="b", data_type=TensorProto.UINT8), cut(), 2 * SPILL_BYTES)
        assert os.fstat(source.scratch.fileno()).st_size == size == 2 * SPILL_BYTES
        assert source.read(first).tobytes() == block.tobytes() * 2


@pytest.mark.parametrize("made_again", [False, True], ids=["scratch file", "product made again"])
@pytest.mark.parametrize("code", [errno.EFBIG, errno.ENOSPC])
def test_a_full_disk_under_the_scratch_file_is_a_one_line_file_error(tmp_path, capsys, monkeypatch, code, made_again):
    """A scratch write the disk refuses (EFBIG, ENOSPC) is a one-line file error naming the scratch file's folder,
    exit 2 as the plain fold's full disk, with no output and nothing left beside the model (the scratch file is
    unnamed and closed). Before: 'internal error: OSError', exit 3.  The save's write of a product made again
    that the disk refuses is the plain save's one-line error."""
    src = tmp_path / "in"
    src.mkdir()
    if made_again:
        path = _one_weight(src)
    else:
        path = _external(_stack(width=256), src, "one")  # 256 KiB weights: their products go to the scratch file
        _no_reading_again(monkeypatch)
    before = _files(src)

    def full(fd, data, offset):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(os, "pwrite", full)
    (tmp_path / "o").mkdir()
    assert main(["fold", path, "-o", str(tmp_path / "o" / "out.onnx"), "-q", "--low-memory"]) == 2
    err = capsys.readouterr().err.strip()
    says = "cannot write the model" if made_again else f"cannot write the streamed fold's scratch file in {src}"
    assert f"{says} ({os.strerror(code)})" in err, err
    assert "\n" not in err and "internal error" not in err
    assert os.listdir(tmp_path / "o") == [] and _files(src) == before


def test_the_read_buffers_go_back_when_closing_the_scratch_file_fails(tmp_path):
    """The outermost ``reading()`` gives back the pages of every read buffer nothing references and forgets the
    scratch file even when closing what it opened raises (the error still comes out)."""
    from onnx import TensorProto

    from bnfold.io.onnx_stream import SPILL_BYTES, ExternalSource

    source = ExternalSource(str(tmp_path / "m.onnx"))
    block = np.arange(SPILL_BYTES, dtype=np.uint8)
    with pytest.raises(OSError, match="close failed"), source.reading():
        stored = source.store(TensorProto(name="a", data_type=TensorProto.UINT8), block)
        source.read(stored)  # a buffer nothing references once the line is done
        pages = [lent.pages for lent in source.lent]
        source.stack.callback(lambda: (_ for _ in ()).throw(OSError("close failed")))
    assert pages and all(p.closed for p in pages)
    assert source.lent == [] and source.scratch is None and source.depth == 0


def test_a_refused_check_cuts_its_spilled_blocks_from_the_scratch_file(tmp_path):
    """The checks of a streamed product write each block to the scratch file as they make it; when a later block
    overflows, what was written of that product is cut back (what was stored before stays), and a product that
    passes names exactly its bytes there, in the stored layout."""
    from onnx import TensorProto

    from bnfold import fold_math
    from bnfold.io.onnx_stream import SPILL_BYTES, ExternalSource
    from bnfold.onnx.tensors import from_torch, spill_to_reader

    source = ExternalSource(str(tmp_path / "m.onnx"))
    block = np.arange(SPILL_BYTES, dtype=np.uint8)
    stored = torch.linspace(-1, 1, 300 * 256).reshape(300, 256)  # [in, out] as a MatMul stores it: several blocks
    scales = fold_math.per_slice(torch.linspace(0.6, 2.0, 256, dtype=torch.float64), "linear", "out", (256, 300))
    with source.reading():
        first = source.store(TensorProto(name="a", data_type=TensorProto.UINT8), block)
        size = os.fstat(source.scratch.fileno()).st_size
        bad = stored.clone()
        bad[-1, 200] = 3e38  # times about 1.7, in the last block: the blocks before it were written
        with pytest.raises(fold_math.FoldError, match="overflows"):
            fold_math.scale_weight(bad.T, scales, torch.float32, "w", deferred=spill_to_reader(TensorProto.FLOAT))
        assert os.fstat(source.scratch.fileno()).st_size == size
        product = fold_math.scale_weight(
            stored.T, scales, torch.float32, "w", deferred=spill_to_reader(TensorProto.FLOAT)
        )
        assert product.spilled is not None
        assert os.fstat(source.scratch.fileno()).st_size == size + stored.numel() * 4
        t = from_torch(product.T, "w", TensorProto.FLOAT)
        assert source.read(t).tobytes() == (stored.T * scales.to(torch.float32)).T.contiguous().numpy().tobytes()
        assert source.read(first).tobytes() == block.tobytes()


def test_a_fold_retried_after_its_bias_refused_gives_the_weights_scratch_room_back(tmp_path, monkeypatch):
    """conv (bias 3e38) -> + 3e38 -> x2 six times: every try of the chain folds the weight (spilled to the
    scratch file as its checks pass) and then refuses the bias; each failed try's product goes back, so the
    scratch file never holds more than one product (it held one per try), and nothing folds."""
    from onnx import TensorProto, helper
    from onnx import numpy_helper as nh

    from bnfold.io import onnx_stream

    c = 128  # a 128 x 128 x 1 x 1 float32 weight: 64 KiB, spilled
    rng = np.random.default_rng(0)
    inits = {
        "w": rng.standard_normal((c, c, 1, 1)).astype(np.float32),
        "b": np.full(c, 3e38, np.float32),
        "big": np.full((1, c, 1, 1), 3e38, np.float32),
        "two": np.full((1, c, 1, 1), 2.0, np.float32),
    }
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["h"]), helper.make_node("Add", ["h", "big"], ["a0"])]
    nodes += [helper.make_node("Mul", [f"a{i}", "two"], [f"a{i + 1}"]) for i in range(6)]
    graph = helper.make_graph(
        nodes,
        "retries",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, 2, 2])],
        [helper.make_tensor_value_info("a6", TensorProto.FLOAT, None)],
        [nh.from_array(v, k) for k, v in inits.items()],
    )
    path = _external(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path, "one")
    _no_reading_again(monkeypatch)
    ends, write = [], onnx_stream.ScratchSpill.write

    def recording(self, block):
        write(self, block)
        ends.append(self.end)

    monkeypatch.setattr(onnx_stream.ScratchSpill, "write", recording)
    result = bnfold.fold(path)
    assert not result.report.folded
    kept = result.report.to_dict()["kept_ops"]
    assert len(kept) == 7 and all(k["code"] == "cast_range" for k in kept), kept  # each try refused its bias
    assert ends and max(ends) <= c * c * 4, (max(ends), len(ends))


def test_a_spilled_product_written_in_another_order_gives_its_spill_back(tmp_path):
    """A product spilled in its weight's memory order but written in another (a transposed weight's, row-major:
    made again from ``stages()``) gives the spilled bytes back first: the scratch file holds one copy of it, not
    two.  Bytes a tensor refers to are never given back (a second write of the same product leaves them)."""
    from onnx import TensorProto

    from bnfold import fold_math
    from bnfold.io.onnx_stream import ExternalSource
    from bnfold.onnx.tensors import from_torch, spill_to_reader

    source = ExternalSource(str(tmp_path / "m.onnx"))
    stored = torch.linspace(-1, 1, 300 * 256).reshape(300, 256)
    scales = fold_math.per_slice(torch.linspace(0.6, 2.0, 256, dtype=torch.float64), "linear", "out", (256, 300))
    nbytes = stored.numel() * 4
    want = (stored.T * scales.to(torch.float32)).contiguous().numpy().tobytes()
    with source.reading():
        product = fold_math.scale_weight(
            stored.T, scales, torch.float32, "w", deferred=spill_to_reader(TensorProto.FLOAT)
        )
        assert product.spilled is not None and os.fstat(source.scratch.fileno()).st_size == nbytes
        t = from_torch(product, "w", TensorProto.FLOAT)  # row-major [256, 300]: not the spilled order
        assert source.read(t).tobytes() == want
        assert os.fstat(source.scratch.fileno()).st_size == nbytes  # before: 2 x nbytes

        again = fold_math.scale_weight(
            stored.T, scales, torch.float32, "w", deferred=spill_to_reader(TensorProto.FLOAT)
        )
        kept = from_torch(again.T, "w2", TensorProto.FLOAT)  # refers to its spilled bytes
        size = os.fstat(source.scratch.fileno()).st_size
        from_torch(again, "w3", TensorProto.FLOAT)  # written again: the referred bytes stay
        assert os.fstat(source.scratch.fileno()).st_size == size + nbytes
        assert source.read(kept).tobytes() == (stored * scales.T.to(torch.float32)).numpy().tobytes()


def _one_weight(folder, n: int = 256, kind: int = onnx.TensorProto.FLOAT) -> str:
    """x @ w * s with ``w`` (n x n of the element type ``kind``, 128-256 KiB) the only tensor the streamed load
    leaves on disk: the fold folds it, so the save reads the data file only to make its product again."""
    from onnx import helper, numpy_helper

    rng = np.random.default_rng(3)
    dtype = helper.tensor_dtype_to_np_dtype(kind)
    inits = [
        numpy_helper.from_array((rng.standard_normal((n, n)) / 16).astype(dtype), "w"),
        numpy_helper.from_array(rng.uniform(0.5, 2.0, n).astype(dtype), "s"),
    ]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"], name="mm"), helper.make_node("Mul", ["m", "s"], ["y"])]
    io = [helper.make_tensor_value_info(v, kind, [1, n]) for v in ("x", "y")]
    graph = helper.make_graph(nodes, "g", io[:1], io[1:], inits)
    return _external(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), folder, "one")


def test_a_streamed_fold_writes_each_folded_byte_once_into_the_output(tmp_path, monkeypatch):
    """The checks of a streamed weight's product write nothing: the save reads the weight again and writes its
    product straight into the output's data file, so the folded bytes are written once (no scratch file between:
    before, every product went to the scratch file at the fold and was copied from it at the save).  The files
    are the plain fold's."""
    from bnfold.io import onnx_stream

    src = tmp_path / "in"
    src.mkdir()
    path = _external(_stack(width=256), src, "one")  # l0.w, l1.w, l2.w: 256 KiB each, folded; proj left
    spilled, written = [], []
    spill, pwrite = onnx_stream.ScratchSpill.write, os.pwrite
    monkeypatch.setattr(onnx_stream.ScratchSpill, "write", lambda self, b: spilled.append(b.nbytes) or spill(self, b))
    monkeypatch.setattr(os, "pwrite", lambda fd, data, at: written.append(pwrite(fd, data, at)) or written[-1])
    outs = _plain_and_streamed(tmp_path, path)
    assert outs["stream"] == outs["plain"]
    assert spilled == [] and sum(written) == 3 * 256 * 256 * 4  # the three products, once each


def test_what_products_made_again_hold_to_the_save_stays_within_the_largest(tmp_path, monkeypatch):
    """Each product made again holds its scales until the save: twelve MatMuls ``[8, 32768]`` (1 MiB) scaled on
    their 32768 outputs (128 KiB of scales each) would hold 1.5 MiB of scales, more than the largest tensor; the
    products past that (the ninth on) are spilled at the fold as before, and the files are still the plain fold's.
    Before, every product held its scales: the peak grew with the number of layers (reviewer: 96 layers of 4 MiB
    weights and 512 KiB scales held 48 MiB)."""
    from bnfold.io import onnx_stream

    rng = np.random.default_rng(0)
    n, inits, nodes, outs = 32768, [], [], []
    for i in range(12):
        inits += [
            numpy_helper.from_array((rng.standard_normal((8, n)) * 0.1).astype(np.float32), f"w{i}"),
            numpy_helper.from_array(rng.uniform(0.5, 2, n).astype(np.float32), f"s{i}"),
        ]
        nodes += [
            helper.make_node("MatMul", ["x", f"w{i}"], [f"m{i}"], name=f"mm{i}"),
            helper.make_node("Mul", [f"m{i}", f"s{i}"], [f"y{i}"], name=f"mul{i}"),
        ]
        outs.append(helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, None))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])], outs, inits)
    src = tmp_path / "in"
    src.mkdir()
    path = _external(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), src, "one")
    sources, again = [], onnx_stream.ExternalSource.again
    monkeypatch.setattr(onnx_stream.ExternalSource, "again", lambda self, *a: sources.append(self) or again(self, *a))
    outs = _plain_and_streamed(tmp_path, path)
    assert outs["stream"] == outs["plain"]
    (source,) = set(sources)
    assert len(source.made) == 8 and source.made_keeps == 8 * n * 4 <= source.made_largest == 8 * n * 4


@pytest.mark.parametrize("when", ["before the save", "while the save reads it"])
def test_a_data_file_rewritten_before_a_product_is_made_again_is_refused(tmp_path, monkeypatch, when):
    """The save reads a folded weight again to make its product: a data file rewritten at its size after the load
    (before the save, or while the save reads it) is refused on that read, as the fold's own read refuses it, in
    one line, and nothing is written.  Before, the save copied the product the fold had spilled and never
    looked at the data file again."""
    from bnfold.io import onnx_stream
    from bnfold.io.onnx import load_onnx, save_onnx

    src = tmp_path / "in"
    src.mkdir()
    path = _one_weight(src)
    os.utime(src / "m.data", ns=(0, 0))  # last written long ago: a rewrite now moves its times
    model, layout = load_onnx(path, stream=True)
    out = tmp_path / "out.onnx"
    with layout.reading(), pytest.raises(ModelFileError, match="'m.data' changed while it was read") as err:
        result = bnfold.fold(model)
        assert [e.into for e in result.report.folded] == ["mm"]
        if when == "before the save":
            _rewrite_in_place(src / "m.data")
        else:
            read = onnx_stream._read_into

            def read_then_write(*args):
                n = read(*args)
                _rewrite_in_place(src / "m.data")
                return n

            monkeypatch.setattr(onnx_stream, "_read_into", read_then_write)
        save_onnx(result.model, out, layout)
    assert "\n" not in str(err.value)
    assert not out.exists() and not (tmp_path / "out.onnx.data").exists()
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".tmp")]


def test_a_spill_given_up_after_another_wrote_leaves_the_others_bytes(tmp_path, monkeypatch):
    """``done(False)`` cuts the scratch file back only where the spill's bytes are its last: a spill given up
    after another wrote leaves the other's bytes (before, it cut the file to where it began, under the other's);
    the bytes a failed write left are still cut."""
    from onnx import TensorProto

    from bnfold.io.onnx_stream import SPILL_BYTES, ExternalSource, ScratchSpill

    source = ExternalSource(str(tmp_path / "m.onnx"))
    a, b = np.full(SPILL_BYTES, 1, np.uint8), np.full(SPILL_BYTES, 2, np.uint8)
    with source.reading():
        first, second = ScratchSpill(source), ScratchSpill(source)
        first.write(a)
        second.write(b)
        assert first.done(False) is None
        t = source.refer(TensorProto(name="b", data_type=TensorProto.UINT8), second.done(True), SPILL_BYTES)
        assert source.read(t).tobytes() == b.tobytes()
        size = os.fstat(source.scratch.fileno()).st_size
        assert size == 2 * SPILL_BYTES

        pwrite = os.pwrite

        def half_then_full(fd, data, at):  # half the block lands, then the disk is full
            if len(data) == SPILL_BYTES:
                return pwrite(fd, data[: SPILL_BYTES // 2], at)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        monkeypatch.setattr(os, "pwrite", half_then_full)
        third = ScratchSpill(source)
        with pytest.raises(ModelFileError, match="cannot write the streamed fold's scratch file"):
            third.write(a)
        assert os.fstat(source.scratch.fileno()).st_size == size + SPILL_BYTES // 2
        third.done(False)
        assert os.fstat(source.scratch.fileno()).st_size == size


def test_the_source_keeps_its_data_files_once(tmp_path):
    """A streamed load's source knows its data files by their identity alone (``files`` was a second list of
    the same paths, kept in step by hand)."""
    import dataclasses

    from bnfold.io.onnx import load_onnx
    from bnfold.io.onnx_stream import ExternalSource

    src = tmp_path / "in"
    src.mkdir()
    path = _external(_stack(width=128), src, "many")
    _, layout = load_onnx(path, stream=True)
    assert "files" not in {f.name for f in dataclasses.fields(ExternalSource)}
    assert layout.source.files == list(layout.source.identity) and len(layout.source.files) > 1


def test_a_product_of_products_is_made_again_from_the_stored_weight(tmp_path):
    """A weight folded again after it was folded (the range rewrite after the fold) is made again from the stored
    weight, each product in turn in the one buffer, up to ``MADE_DEPTH`` deep; one deeper goes to the scratch file.
    The values are the products taken one after another."""
    from onnx import TensorProto

    from bnfold import fold_math
    from bnfold.io.onnx import load_onnx
    from bnfold.io.onnx_stream import MADE_DEPTH
    from bnfold.onnx.tensors import from_torch, to_numpy, to_torch

    src = tmp_path / "in"
    src.mkdir()
    path = _one_weight(src)
    want = to_torch(to_numpy(next(t for t in load_onnx(path).model.graph.initializer if t.name == "w")))
    model, layout = load_onnx(path, stream=True)
    t = next(t for t in model.graph.initializer if t.name == "w")
    rng = np.random.default_rng(4)
    with layout.reading():
        for _ in range(MADE_DEPTH + 1):
            s = torch.from_numpy(rng.uniform(0.5, 2.0, (1, 256)).astype(np.float32))
            t = from_torch(fold_math.Product(to_torch(to_numpy(t)), s), "w", TensorProto.FLOAT)
            want = want * s
        source = layout.source
        assert [m.depth for m in source.made] == list(range(1, MADE_DEPTH + 1))
        assert os.fstat(source.scratch.fileno()).st_size == want.numel() * 4  # the last one
        assert to_numpy(t).tobytes() == want.numpy().tobytes()
        assert source.read(source.made[-1].origin).tobytes() != want.numpy().tobytes()  # one product short


@pytest.mark.parametrize("kind", ["FLOAT", "FLOAT16", "BFLOAT16", "DOUBLE"])
def test_a_folded_weight_of_each_float_type_is_made_again_not_spilled(tmp_path, monkeypatch, kind):
    """A float32, float16, bfloat16 or float64 weight read by the streamed fold is made again at the save from its
    bytes read again (no block of it goes to the scratch file; a bfloat16 one did: ``to_numpy`` copied it through
    onnx's conversion, so its buffer was not the weight's; a float64 one's product was made whole, beside the
    weight, and stored), and the files are the plain fold's."""
    from bnfold.io import onnx_stream

    src = tmp_path / "in"
    src.mkdir()
    path = _one_weight(src, kind=getattr(onnx.TensorProto, kind))
    spilled, spill = [], onnx_stream.ScratchSpill.write
    monkeypatch.setattr(onnx_stream.ScratchSpill, "write", lambda self, b: spilled.append(b.nbytes) or spill(self, b))
    outs = _plain_and_streamed(tmp_path, path)
    assert outs["stream"] == outs["plain"] and spilled == []
    assert (tmp_path / "stream" / "out.onnx.data").read_bytes() != (src / "m.data").read_bytes()  # it folded


def test_the_save_starts_the_writeback_of_each_streamed_tensor_as_it_writes_it(tmp_path, monkeypatch):
    """The streamed save asks the kernel to start writing each tensor it copies or makes to disk as soon as it is
    in the output's data file (``atomic.start_writeback``), so the atomic writer's sync waits for little: every
    large tensor of the output is one such range, in order, and the files are the plain fold's."""
    from bnfold.io import onnx_stream

    src = tmp_path / "in"
    src.mkdir()
    path = _external(_stack(width=256), src, "one")  # proj (copied) and l0.w .. l2.w (made again): 256 KiB each
    started = []
    start = onnx_stream.start_writeback
    monkeypatch.setattr(onnx_stream, "start_writeback", lambda fd, at, n: started.append((at, n)) or start(fd, at, n))
    outs = _plain_and_streamed(tmp_path, path)
    assert outs["stream"] == outs["plain"]
    out = onnx.load(str(tmp_path / "stream" / "out.onnx"), load_external_data=False)
    large = [
        (int(e["offset"]), int(e["length"]))
        for e in ({x.key: x.value for x in t.external_data} for t in out.graph.initializer)
        if int(e["length"]) >= onnx_stream.SPILL_BYTES
    ]
    assert len(large) == 4 and started == sorted(large)


def test_a_data_files_path_is_resolved_once_a_pass_not_once_a_tensor(tmp_path, monkeypatch):
    """The loads check a data file's location (links, folder) once for all its tensors in each pass: a 1 GB
    model of 193 tensors resolved it 386 times in a streamed load (0.1 s).  The number of ``realpath`` calls of
    a load does not grow with the tensors of its one data file, plain or streamed."""
    from bnfold.onnx import load_onnx

    calls = []
    realpath = os.path.realpath
    monkeypatch.setattr(os.path, "realpath", lambda p, **kw: calls.append(p) or realpath(p, **kw))
    counts = {}
    for n in (2, 8):
        folder = tmp_path / str(n)
        folder.mkdir()
        path = _external(_stack(n, width=64), folder, "one")
        for stream in (False, True):
            calls.clear()
            load_onnx(path, stream=stream)
            counts[n, stream] = len(calls)
    assert counts[2, False] == counts[8, False] and counts[2, True] == counts[8, True]


@pytest.mark.parametrize("stream", [False, True])
def test_a_data_file_swapped_for_a_link_out_of_the_folder_after_its_location_was_checked_is_refused(
    tmp_path, monkeypatch, stream
):
    """The location is checked once a pass; whoever opens the file then checks it is the file checked (its device
    and inode): ``data.bin`` replaced by a link to a file outside the model's folder right after it was located is
    refused, plain (between two tensors' reads) and streamed (before the file is opened), never read."""
    from bnfold.io import onnx_external
    from bnfold.onnx import load_onnx

    folder = tmp_path / "model"
    folder.mkdir()
    path = _external(_stack(3, width=256), folder, "one")
    data = next(f for f in os.listdir(folder) if not f.endswith(".onnx"))
    outside = tmp_path / "secret.bin"
    outside.write_bytes(b"\x42" * os.path.getsize(folder / data))
    real_locate, calls, swap_at = onnx_external._data_file, [], []

    def located_then_swapped(*args):
        found = real_locate(*args)
        calls.append(args)
        if len(calls) == (swap_at or [0])[0]:  # the pass that reads: its one location check done, the swap
            os.rename(folder / data, folder / "old.bin")
            os.symlink(outside, folder / data)
        return found

    monkeypatch.setattr(onnx_external, "_data_file", located_then_swapped)
    load_onnx(path, stream=stream)  # each pass checks the location once: the last is the reading pass's
    swap_at.append(len(calls))
    calls.clear()
    with pytest.raises(ModelFileError, match="changed while it was read .not the file its location was checked to be"):
        load_onnx(path, stream=stream)
    assert os.path.islink(folder / data)


@pytest.mark.parametrize("stream", [False, True])
def test_a_folder_of_the_location_made_a_link_out_while_it_is_checked_is_refused(tmp_path, monkeypatch, stream):
    """The location ``sub/m.data``: its folder ``sub`` replaced by a link to a folder outside the model's after the
    location was resolved, before the file's identity is taken (``lstat`` follows the folders of a path): the file
    opened is then the outside one under the identity recorded, and is refused by the path the kernel opened."""
    from bnfold.io import onnx_external
    from bnfold.onnx import load_onnx

    folder = tmp_path / "model"
    (folder / "sub").mkdir(parents=True)
    model = _stack(2, width=64)
    path = str(folder / "m.onnx")
    onnx.save(model, path, save_as_external_data=True, location="sub/m.data", size_threshold=0)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "m.data").write_bytes(b"\x42" * os.path.getsize(folder / "sub" / "m.data"))
    real_lstat, calls, swap_at = os.lstat, [], []

    def lstat(p, *args, **kwargs):
        if str(p).endswith(os.path.join("sub", "m.data")):
            calls.append(p)
            if len(calls) == (swap_at or [0])[0]:  # the reading pass's check: resolved, not yet taken
                os.rename(folder / "sub", folder / "sub_old")
                os.symlink(outside, folder / "sub")
        return real_lstat(p, *args, **kwargs)

    monkeypatch.setattr(onnx_external.os, "lstat", lstat)
    load_onnx(path, stream=stream)
    swap_at.append(len(calls))
    calls.clear()
    with pytest.raises(ModelFileError, match="changed while it was read .not the file its location was checked to be"):
        load_onnx(path, stream=stream)
    assert os.path.islink(folder / "sub")
