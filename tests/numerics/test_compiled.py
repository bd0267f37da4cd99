"""The audit's generated runs (:mod:`bnfold.numerics.compiled`) give the interpreter's report.

Each audit runs twice on the same batches and the same fold: once with the interpreter only
(``runner.COMPILE_AFTER = None``), once with every run generated (``0``); every number of ``to_dict()`` agrees within
1e-9, on the tests' own networks and a torchvision class as torch programs and as ONNX, and on the PaddleOCR angle
classifier, under every profile.  The run-time size check still refuses a hostile op inside generated code, on a
batch whose values (not its shape) make the op too large.
"""

import math

import pytest
import torch
from numerics_helpers import export, mixed, onnx_keeping_batch_norms, small_net

import bnfold
import bnfold.numerics.runner as runner_module
from bnfold.io.budget import Budget, WorkError
from bnfold.io.run_checks import expect, watch
from bnfold.numerics.profiles import PROFILE_NAMES

onnx = pytest.importorskip("onnx")


def _flat(doc, path=""):
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from _flat(v, f"{path}.{k}")
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from _flat(v, f"{path}[{i}]")
    else:
        yield path, doc


def _same(a: dict, b: dict) -> list[str]:
    """The paths where two reports' ``to_dict()`` differ (numbers: by more than 1e-9 of their size)."""
    fa, fb = dict(_flat(a)), dict(_flat(b))
    bad = sorted(set(fa) ^ set(fb))
    for k in fa.keys() & fb.keys():
        x, y = fa[k], fb[k]
        if isinstance(x, float) and isinstance(y, float):
            if not (x == y or (math.isnan(x) and math.isnan(y)) or abs(x - y) <= 1e-9 * max(1.0, abs(x))):
                bad.append(f"{k}: {x} != {y}")
        elif x != y:
            bad.append(f"{k}: {x!r} != {y!r}")
    return bad


@pytest.fixture
def generated(monkeypatch):
    """Counts the generated runs made (``generate`` calls)."""
    made = []
    real = runner_module.generate

    def counting(runner, mode):
        made.append(mode)
        return real(runner, mode)

    monkeypatch.setattr(runner_module, "generate", counting)
    return made


def _both(monkeypatch, generated, model, batches, **kw) -> None:
    fold = bnfold.fold(model)
    docs = {}
    for after in (None, 0):
        monkeypatch.setattr(runner_module, "COMPILE_AFTER", after)
        generated.clear()
        docs[after] = bnfold.audit(model, batches, fold=fold, **kw).to_dict()
        assert bool(generated) == (after is not None)
    assert not _same(docs[None], docs[0])


def _batches(shape, n=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(shape, generator=g) * (1 + k),) for k in range(n)]


@pytest.mark.parametrize("profile", PROFILE_NAMES)
@pytest.mark.parametrize("net", ["small", "mixed"])
@pytest.mark.parametrize("fmt", ["pt2", "onnx"])
def test_generated_audit_is_the_interpreters(monkeypatch, generated, profile, net, fmt):
    module = small_net() if net == "small" else mixed()
    batches = _batches((2, 3, 8, 8))
    x = batches[0][0]
    model = export(module, x) if fmt == "pt2" else onnx_keeping_batch_norms(module, x)
    _both(monkeypatch, generated, model, batches, profile=profile, tensors=fmt == "pt2", local=False)


def test_generated_audit_on_the_paddleocr_classifier(monkeypatch, generated):
    from paddleocr_models import model_path

    model = onnx.load(model_path("cls"))
    for profile in PROFILE_NAMES:
        _both(monkeypatch, generated, model, _batches((1, 3, 48, 96)), profile=profile, local=False)


@pytest.mark.parametrize("fmt", ["pt2", "onnx"])
def test_generated_audit_on_a_torchvision_class(monkeypatch, generated, fmt):
    from library_models import available, build

    if available() is not None:
        pytest.skip(available())
    module, x = build("tv:resnet18")
    model = export(module, x) if fmt == "pt2" else onnx_keeping_batch_norms(module, x)
    for profile, local in (("fp16", False), ("ort-cpu", True)):  # with the local runs: its ReLUs write in place
        _both(monkeypatch, generated, model, [(x,), (x * 2,)], profile=profile, tensors=False, local=local)


@pytest.mark.parametrize("profile", ["fp16", "htp", "ort-cpu"])
@pytest.mark.parametrize("fmt", ["pt2", "onnx"])
def test_generated_local_runs_are_the_interpreters(monkeypatch, generated, profile, fmt):
    batches = _batches((2, 3, 8, 8))
    module = mixed()
    model = export(module, batches[0][0]) if fmt == "pt2" else onnx_keeping_batch_norms(module, batches[0][0])
    _both(monkeypatch, generated, model, batches, profile=profile, tensors=False, local=True)


def test_the_first_run_of_a_mode_is_interpreted(generated):
    model = export(small_net(), torch.randn(2, 3, 8, 8))
    bnfold.audit(model, _batches((2, 3, 8, 8), n=1), local=False)
    assert generated == []  # one batch: compiling would cost more than it saves
    bnfold.audit(model, _batches((2, 3, 8, 8), n=3), local=False)
    assert len(generated) == 2  # the unfolded and the folded program's mode, from their second batch


def _resize_by_values(path):
    """A Resize whose scales grow with the input's values: ``[1, 1, 1 + sum(x), 1 + sum(x)]``."""
    from onnx import TensorProto as T
    from onnx import helper as h

    spec = [
        ("ReduceSum", ["x"], ["s"], {"keepdims": 0}),
        ("Mul", ["s", "mask"], ["z"], {}),
        ("Add", ["one", "z"], ["scales"], {}),
        ("Resize", ["x", "", "scales"], ["y"], {"mode": "nearest"}),
        ("Relu", ["y"], ["out"], {}),
    ]
    nodes = [h.make_node(op, ins, outs, **kw) for op, ins, outs, kw in spec]
    inits = [h.make_tensor("mask", T.FLOAT, [4], [0, 0, 1, 1]), h.make_tensor("one", T.FLOAT, [4], [1, 1, 1, 1])]
    x = h.make_tensor_value_info("x", T.FLOAT, [1, 1, 8, 8])
    g = h.make_graph(nodes, "g", [x], [h.make_tensor_value_info("out", T.FLOAT, None)], inits)
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 13)]), path)


def test_the_size_check_refuses_inside_generated_code(tmp_path, generated):
    """The third batch has the first two's shape; its values, not its shape, make the Resize too large.  Its sizes
    were checked once for the run (from the first batch's), but the scales are a small value computed at run time:
    compared before the Resize runs, they differ, and the batch runs again with each op checked."""
    path = tmp_path / "grow.onnx"
    _resize_by_values(path)
    small = torch.zeros(1, 1, 8, 8)
    large = torch.full((1, 1, 8, 8), 60000.0 / 64)  # scales ~6e4: ~840 GiB of float32 (no allocator would give it)
    with watch(), pytest.raises(WorkError, match=r"Resize .* would create \d+(\.\d+)? GiB"):
        bnfold.audit(str(path), [(small,), (small,), (large,)], local=False)
    assert generated and all(m.checked == "op" for m in generated)  # the later batches ran generated, sized at once


def test_a_watched_audit_checks_sizes_once_per_feed_signature(monkeypatch, generated):
    model = onnx_keeping_batch_norms(small_net(), torch.randn(2, 3, 8, 8))
    batches = _batches((2, 3, 8, 8), n=3)
    fold = bnfold.fold(model)
    docs = {}
    for after in (None, 1):
        monkeypatch.setattr(runner_module, "COMPILE_AFTER", after)
        generated.clear()
        with watch():
            docs[after] = bnfold.audit(model, batches, fold=fold, local=False).to_dict()
    assert generated and all(m.checked == "op" for m in generated)  # sized once for each later batch
    assert not _same(docs[None], docs[1])


@pytest.mark.parametrize("profile", ["fp16", "ort-cpu"])  # ort-cpu: the fused conv + batch norm (emulated by _emulate)
def test_a_runner_and_its_code_go_with_their_last_reference(profile):
    """The generated code holds no reference to its runner: the runner, its rounded constants and its code are freed
    when the audit drops it, without waiting for the garbage collector (a cycle would keep a model's weights)."""
    import gc
    import weakref

    from bnfold.frontends import frontend_for

    module = mixed()
    x = torch.randn(2, 3, 8, 8)
    model = onnx_keeping_batch_norms(module, x)
    runner = runner_module.Runner(frontend_for(model).numerics().program(model), profile, segments=None)
    runner.compile_after = 0
    runner.run(x)
    runner.run(x, reference=False)
    assert len(runner._code) == 2
    gone = weakref.ref(runner)
    enabled = gc.isenabled()
    gc.disable()
    try:
        del runner
        assert gone() is None
    finally:
        if enabled:
            gc.enable()


def test_names_from_the_file_never_enter_the_generated_source(monkeypatch, tmp_path):
    """A model whose value and node names are Python: the generated source holds positions only (SECURITY.md), the
    audit runs as the interpreter's, and nothing the names say is run."""
    import numpy as np
    from onnx import TensorProto as T
    from onnx import helper as h
    from onnx import numpy_helper as nh

    canary = tmp_path / "ran"
    bad = f"x'); open({str(canary)!r}, 'w') #"
    names = {k: f'{bad} {k} """ ]}} \\' for k in ("x", "w", "c", "s", "b", "m", "v", "y", "out")}
    rng = np.random.default_rng(0)
    inits = [
        nh.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), names["w"]),
        nh.from_array(rng.uniform(0.5, 2, 4).astype(np.float32), names["s"]),
        nh.from_array(rng.standard_normal(4).astype(np.float32), names["b"]),
        nh.from_array(rng.standard_normal(4).astype(np.float32), names["m"]),
        nh.from_array(rng.uniform(0.5, 2, 4).astype(np.float32), names["v"]),
    ]
    nodes = [
        h.make_node("Conv", [names["x"], names["w"]], [names["c"]], name=f"{bad} conv", pads=[1, 1, 1, 1]),
        h.make_node(
            "BatchNormalization",
            [names["c"], names["s"], names["b"], names["m"], names["v"]],
            [names["y"]],
            name=f"{bad} bn",
        ),
        h.make_node("Relu", [names["y"]], [names["out"]], name=f"{bad} relu"),
    ]
    graph = h.make_graph(
        nodes,
        "g",
        [h.make_tensor_value_info(names["x"], T.FLOAT, [1, 3, 8, 8])],
        [h.make_tensor_value_info(names["out"], T.FLOAT, [1, 4, 8, 8])],
        inits,
    )
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 13)])
    sources = []
    real = runner_module.generate

    def keeping(runner, mode):
        code = real(runner, mode)
        sources.append(code.source)
        return code

    monkeypatch.setattr(runner_module, "generate", keeping)
    fold = bnfold.fold(model)
    docs = {}
    for after in (None, 0):
        monkeypatch.setattr(runner_module, "COMPILE_AFTER", after)
        docs[after] = bnfold.audit(model, _batches((1, 3, 8, 8), n=3), fold=fold).to_dict()
    assert sources and not _same(docs[None], docs[0])
    for text in sources:
        assert bad not in text and "open(" not in text and "#" not in text.replace("# noqa", "")
    assert not canary.exists()


def _short_program():
    """A step that names two outputs and returns one (the second is never read), then a step on the first."""
    from bnfold.numerics.runner import Program, Step

    def first(ins, dtype, **_):
        return [ins[0] * 2]  # one output of the two the step names

    def second(ins, dtype, **_):
        return [ins[0] + 1]

    steps = [Step("a", "pair", ["x"], ["y", "z"], first), Step("b", "add", ["y"], ["w"], second)]
    return Program(steps, {}, ["x"], ["w"], lambda xs: [torch.as_tensor(x) for x in xs])


def test_an_op_returning_fewer_outputs_runs_as_the_interpreter_does(monkeypatch):
    """The interpreter skips an output an op did not return; the generated code ran past it and failed on the
    unbound one (``UnboundLocalError``).  Now the batch runs through the interpreter, and so does every later one."""
    from bnfold.numerics.runner import Runner

    monkeypatch.setattr(runner_module, "COMPILE_AFTER", None)  # the interpreter only
    x = torch.randn(4, 8)
    expect = Runner(_short_program()).run(x)
    monkeypatch.setattr(runner_module, "COMPILE_AFTER", 0)  # every run generated
    runner = Runner(_short_program())
    for _ in range(2):
        got = runner.run(x)
        assert sorted(got.errors) == sorted(expect.errors) == ["w", "x", "y"]
        assert torch.equal(got.outputs[0], expect.outputs[0])
    assert runner.compile_after is None


def test_the_generated_checked_run_counts_what_it_holds_as_the_interpreter(monkeypatch):
    """Under a watched command each op is checked against what the run holds, the reference values kept for the
    folded run included: the generated run dropped a kept value's bytes at its last reader without adding back its
    kept reference (it counted less than the interpreter before the later ops: an op refused there could pass)."""
    from bnfold.frontends import frontend_for

    x = torch.randn(2, 3, 8, 8)
    model = onnx_keeping_batch_norms(small_net(), x)
    program = frontend_for(model).numerics().program(model)
    keep = frozenset(v for s in program.steps for v in s.outs if v)  # every value kept, as for the folded run
    seen = {}
    for after in (None, 0):
        monkeypatch.setattr(runner_module, "COMPILE_AFTER", after)
        runner = runner_module.Runner(program, "fp16")
        counts = seen[after] = []
        real = runner._check

        def counting(i, step, ins, real=real, runner=runner, counts=counts):
            counts.append(runner._holding)
            return real(i, step, ins)

        runner._check = counting
        with watch():
            expect(Budget(1 << 40, 1 << 50, 8), 0, "test")  # a plan: every op checked against a budget
            runner.run(x, keep_reference=keep)
    assert seen[0] and seen[0] == seen[None]
