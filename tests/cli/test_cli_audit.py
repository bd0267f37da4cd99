"""bnfold audit: input batches (--random, --inputs .npz), JSON, the plot, progress."""

from __future__ import annotations

import io
import json
import re
import zipfile

import numpy as np
import pytest
import torch

import cli_helpers as h
from bnfold.cli.progress import Progress
from bnfold.io import batches as cli_inputs


@pytest.fixture(scope="module")
def ep(models):
    return torch.export.load(str(models["conv_bn"]))


def test_random_batches_follow_the_example_inputs_and_the_seed(ep):
    a = cli_inputs.random_batches(ep, 3, seed=0)
    b = cli_inputs.random_batches(ep, 3, seed=0)
    c = cli_inputs.random_batches(ep, 3, seed=1)
    assert len(a) == 3 and all(len(batch) == 1 for batch in a)
    assert all(batch[0].shape == h.EXAMPLE_SHAPE and batch[0].dtype == torch.float32 for batch in a)
    assert all(torch.equal(x[0], y[0]) for x, y in zip(a, b))
    assert not torch.equal(a[0][0], c[0][0])
    assert not torch.equal(a[0][0], a[1][0])


def test_npz_batches_by_position_and_by_name(ep, tmp_path):
    stacked = np.random.default_rng(0).standard_normal((3, *h.EXAMPLE_SHAPE)).astype(np.float64)
    np.savez(tmp_path / "pos.npz", stacked)  # arr_0, [N, *example_shape] -> N batches
    batches = cli_inputs.npz_batches(ep, str(tmp_path / "pos.npz"))
    assert len(batches) == 3
    assert batches[1][0].dtype == torch.float32
    np.testing.assert_allclose(batches[1][0].numpy(), stacked[1].astype(np.float32))

    name = cli_inputs.user_input_names(ep)[0]
    rows = stacked.reshape(-1, *h.EXAMPLE_SHAPE[1:])  # [N*B, ...] -> batches of the example batch size
    np.savez(tmp_path / "named.npz", **{name: rows})
    batches = cli_inputs.npz_batches(ep, str(tmp_path / "named.npz"))
    assert len(batches) == 3 and batches[0][0].shape == h.EXAMPLE_SHAPE


@pytest.mark.parametrize(
    "arrays, problem",
    [
        ({"arr_0": np.zeros((3, 3, 3))}, "has shape"),
        ({"arr_0": np.zeros((5, 3, 8, 8))}, "not a multiple of input x's batch size 2"),
        ({"images": np.zeros((2, 3, 8, 8))}, "expected arrays named"),
        ({"arr_0": np.array([object(), object()], dtype=object)}, "has dtype object; inputs must be numeric"),
    ],
)
def test_bad_npz_is_one_line_exit_2(run, models, tmp_path, arrays, problem):
    path = tmp_path / "inputs.npz"
    np.savez(path, **arrays)
    code, _, err = run("audit", models["conv_bn"], "--inputs", path)
    assert code == 2
    h.one_error_line(err, "inputs.npz", problem)


def test_an_npz_of_inputs_is_read_and_inflated_once(run, models, tmp_path, monkeypatch):
    """The audit reads its ``--inputs`` file once: the elements that grant the model file work at load and the
    batches come from the same read.  Before: each member was opened and inflated twice (the allowance's count,
    then the batches)."""
    rng = np.random.default_rng(0)
    np.savez_compressed(tmp_path / "in.npz", x=rng.standard_normal((2, *h.EXAMPLE_SHAPE)).astype(np.float32))
    opened, real = [], zipfile.ZipFile.open

    def counting(self, name, *args, **kwargs):
        opened.append(getattr(name, "filename", name))
        return real(self, name, *args, **kwargs)

    monkeypatch.setattr(zipfile.ZipFile, "open", counting)
    code, _, err = run("audit", models["conv_bn"], "--inputs", tmp_path / "in.npz", "-q")
    assert code == 0, err
    assert opened.count("x.npy") == 1, opened


def test_the_npz_arrays_are_let_go_once_the_batches_are_made(run, models, tmp_path, monkeypatch):
    """The arrays read from ``--inputs`` are not held beside the batches made of them while the audit runs (float64
    arrays: the batches are float32 copies).  Before: ``run`` kept the file's arrays to the end, the file's size more
    at the audit's peak."""
    import weakref

    import bnfold.io.npz as npz
    import bnfold.numerics as numerics

    rng = np.random.default_rng(0)
    np.savez(tmp_path / "in.npz", x=rng.standard_normal((2, *h.EXAMPLE_SHAPE)))  # float64
    refs, alive, real_read, real_audit = [], [], npz.read_npz, numerics.audit

    def reading(*args, **kwargs):
        arrays = real_read(*args, **kwargs)
        refs.extend(weakref.ref(a) for a in arrays.values())
        return arrays

    def auditing(*args, **kwargs):
        alive.append(sum(r() is not None for r in refs))
        return real_audit(*args, **kwargs)

    monkeypatch.setattr(npz, "read_npz", reading)
    monkeypatch.setattr(numerics, "audit", auditing)
    code, _, err = run("audit", models["conv_bn"], "--inputs", tmp_path / "in.npz", "-q")
    assert code == 0, err
    assert refs and alive == [0]


def test_progress_with_stderr_closed_prints_nothing(monkeypatch):
    """Python started with stderr closed (``2>&-``) has ``sys.stderr`` None: a note is skipped, as a write to a
    closed stream is, not an internal error once the audit runs long enough to print one."""
    monkeypatch.setattr("sys.stderr", None)
    p = Progress(every=0.0)
    p.stage("load")
    p.node(0, 2)
    p(1, 1)
    p.tick()
    p.close()


def test_random_and_inputs_are_exclusive(run, models, tmp_path):
    code, _, err = run("audit", models["conv_bn"], "--random", "2", "--inputs", tmp_path / "x.npz")
    assert code == 2 and "not allowed with" in err


def test_audit_json_and_plot(run, models, tmp_path):
    pytest.importorskip("matplotlib")
    plot = tmp_path / "sqnr.png"
    code, stdout, err = run("audit", models["conv_bn"], "--random", "2", "--profile", "htp", "--json", "--plot", plot)
    assert code == 0, err
    data = json.loads(stdout)
    assert data["profile"] == "htp" and data["batches"] == 2 and data["plot"] == str(plot)
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert h.listing(tmp_path) == {"sqnr.png"}


def test_audit_table_with_npz_and_bn_eps(run, models, tmp_path):
    np.savez(tmp_path / "in.npz", np.random.default_rng(0).standard_normal((2, *h.EXAMPLE_SHAPE)).astype(np.float32))
    code, stdout, err = run("audit", models["conv_bn"], "--inputs", tmp_path / "in.npz", "--bn-eps", "1e-3")
    assert code == 0, err
    assert stdout.strip()
    code, _, err = run("audit", models["conv_bn"], "--bn-eps", "-1")
    assert code == 2 and "positive" in err


def test_audit_table_labels_and_advice(run, models):
    code, stdout, err = run("audit", models["conv_bn"], "--random", "2", "--profile", "htp")
    assert code == 0, err
    assert "cumulative" in stdout and "local" in stdout and "what to do:" in stdout
    assert "random inputs" in stdout.splitlines()[0]
    assert "conv_bn.pt2" in stdout.splitlines()[0]


def test_audit_runs_the_local_runs_only_when_asked(run, models, tmp_path):
    """Without ``--local`` the table's local columns are empty ('-'), its header says they did not run, and the plot's
    worst layers are those of the lowest cumulative SQNR; with ``--local`` every row has both local SQNRs."""
    pytest.importorskip("matplotlib")
    code, stdout, err = run("audit", models["conv_bn"], "--random", "2", "--plot", tmp_path / "s.png")
    assert code == 0, err
    about, header, *rows = stdout.split("\n\n")[3].splitlines()
    assert header.split()[6:10] == ["local", "unf", "local", "fold"] and rows
    assert all(row.split()[4:6] == ["-", "-"] for row in rows) and "(not run: --local)" in about
    assert (tmp_path / "s.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    code, stdout, err = run("audit", models["conv_bn"], "--random", "2", "--local")
    assert code == 0, err
    about, header, *rows = stdout.split("\n\n")[3].splitlines()
    assert rows and all(cell != "-" for row in rows for cell in row.split()[4:6]) and "(not run" not in about


def test_the_audit_freezes_what_is_loaded_and_leaves_the_collector_as_it_was(run, models, monkeypatch):
    """``bnfold audit`` freezes the objects loaded before it emulates (a full collection need not walk torch and the
    model again) and unfreezes them when it ends; a caller's own frozen objects are left as they are."""
    import gc

    from bnfold.cli import audit as cli_audit

    seen = []
    real = cli_audit._audit
    monkeypatch.setattr(cli_audit, "_audit", lambda *a, **k: seen.append(gc.get_freeze_count()) or real(*a, **k))
    assert run("audit", models["conv_bn"], "--random", "1")[0] == 0
    assert seen[0] > 0 and gc.get_freeze_count() == 0
    gc.freeze()  # a caller that froze its own objects
    try:
        mine = gc.get_freeze_count()  # (frozen objects still go when nothing refers to them: it may only shrink)
        assert run("audit", models["conv_bn"], "--random", "1")[0] == 0
        assert 0 < seen[1] <= mine and 0 < gc.get_freeze_count() <= mine
    finally:
        gc.unfreeze()


def test_audit_refuses_a_training_mode_program(run, tmp_path):
    path = tmp_path / "train.pt2"
    ep = torch.export.export(h.randomize_bn(h.ConvBN()).train(), (torch.randn(h.EXAMPLE_SHAPE),))
    torch.export.save(ep, str(path))
    code, stdout, err = run("audit", path, "--trust", "--random", "1")
    assert code == 2 and stdout == ""
    h.one_error_line(err, "train.pt2", "in training mode", "call model.eval() before export")


class _Stream(io.StringIO):
    def __init__(self, tty):
        super().__init__()
        self.tty = tty

    def isatty(self):
        return self.tty


def test_progress_on_a_terminal_and_in_a_log():
    tty = _Stream(True)
    p = Progress(stream=tty)
    p.stage("load")
    for done in range(1, 5):
        p(done, 4)
    p.close()
    assert "load" in tty.getvalue() and "4/4" in tty.getvalue() and "\r" in tty.getvalue()

    log = _Stream(False)
    p = Progress(stream=log, every=0.0)  # periodic lines, every call due
    p.stage("fold")
    p(1, 2)
    p(2, 2)
    lines = log.getvalue().splitlines()
    assert lines[0].startswith("bnfold: audit: fold ...") and "2/2" in lines[-1] and "\r" not in log.getvalue()
    assert all(re.fullmatch(r"bnfold: audit: .+ \[\d+ s\]", line) for line in lines), lines  # the fold's format too

    quiet_log = _Stream(False)
    p = Progress(stream=quiet_log, every=3600.0)  # a short run in a log prints nothing
    p.stage("load")
    p(1, 1)
    p.close()
    assert quiet_log.getvalue() == ""
    off = _Stream(True)
    p = Progress(enabled=False, stream=off)
    p.stage("load")
    p(1, 1)
    assert off.getvalue() == ""


def test_audit_an_onnx_model(run, tmp_path):
    onnx = pytest.importorskip("onnx")
    path = tmp_path / "model.onnx"
    onnx.save(h.onnx_conv_bn(), str(path))
    plot = tmp_path / "onnx.png"
    code, stdout, err = run(
        "audit", path, "--random", "2", "--profile", "htp", "--bn-eps", "1e-9", "--json", "--plot", plot
    )
    assert code == 0, err
    data = json.loads(stdout)
    assert data["profile"] == "htp" and data["model"] == "model.onnx"
    (norm,) = data["normalizations"]
    assert norm["name"] == "bn" and norm["folded"] and norm["risk"]["verdict"] in ("safe", "degrades", "overflows")
    assert [layer["name"] for layer in data["layers"]] and data["layers"][0]["label"] == "conv"
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_progress_shows_nodes_within_a_long_batch():
    log = _Stream(False)
    p = Progress(stream=log, every=0.0)
    p.stage("emulate unfolded")
    p.node(9, 200)
    assert "node 10/200" in log.getvalue().splitlines()[-1]
    quiet_log = _Stream(False)
    p = Progress(stream=quiet_log, every=3600.0)
    p.node(9, 200)
    assert quiet_log.getvalue() == ""


@pytest.mark.parametrize("kind", ["pt2", "onnx"])
def test_an_audit_folds_once(run, models, tmp_path, monkeypatch, kind):
    """``bnfold audit`` folds a model once, in either format: the fold's report also tells the training-mode
    norms (an ONNX model's training-mode refusal folded it once more before), and the task options are checked
    once (a bad ``--class-axis`` still names the option)."""
    import importlib

    if kind == "onnx":
        onnx = pytest.importorskip("onnx")
        path = tmp_path / "model.onnx"
        onnx.save(h.onnx_conv_bn(), str(path))
    else:
        path = models["conv_bn"]
    calls = []
    for name in ("bnfold.onnx.fold", "bnfold.torch_export.fold"):  # where the engine's fold_graph is called
        module = importlib.import_module(name)
        real = module.fold_graph
        monkeypatch.setattr(module, "fold_graph", lambda *a, real=real, **k: calls.append(1) or real(*a, **k))
    code, _, err = run("audit", path, "--random", "1", "--json")
    assert code == 0, err
    assert len(calls) == 1
    code, _, err = run("audit", path, "--random", "1", "--class-axis", "5")
    assert code == 2 and "--class-axis: class axis 5 is out of range" in err
