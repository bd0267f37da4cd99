"""Issue 43: the user chooses the size of a ``.pt2`` program's inputs where the program leaves it open.  An
``--inputs`` file's batches and ``--input-shape`` may take any shape the program's own constraints allow (its static
dims, its dynamic dims within their ranges, a symbol one value wherever it appears), not only its example's; what
the constraints refuse is a one-line error naming the dim.  The program is a stranger's file: what it allows is
only a bound, the sizes are still planned from its ops against the budget (tests/security/test_input_budget.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import cli_helpers as h

# the ``dynamic`` program: [batch in 1..64, 3, side in 8..256, side], exported at [4, 3, 16, 16]


def _npz(path, shape):
    np.savez(path, x=np.random.default_rng(0).standard_normal(shape).astype(np.float32))
    return path


@pytest.mark.parametrize(
    ("shape", "samples", "batches"),
    [((1, 4, 3, 32, 32), 4, 1), ((2, 1, 3, 64, 64), 2, 2), ((8, 3, 40, 40), 8, 2)],
    ids=["a batch at 32x32", "two batches of one at 64x64", "eight samples at 40x40, four at a time"],
)
def test_an_npz_of_any_size_the_program_allows_audits(run, models, tmp_path, shape, samples, batches):
    code, out, err = run("audit", models["dynamic"], "--inputs", _npz(tmp_path / "in.npz", shape), "-q")
    assert code == 0, err
    assert out.splitlines()[0].endswith(f"{samples} samples in {batches} batch(es)")


@pytest.mark.parametrize(
    ("shape", "words"),
    [
        ((1, 4, 3, 512, 512), "dim 2 is 512, but the program allows s"),  # over the side's range, 8..256
        ((1, 4, 3, 32, 64), "dim 3 is 64, but s"),  # the side is one symbol: height and width alike
        ((1, 65, 3, 32, 32), "dim 0 is 65, but the program allows"),  # over the batch's range, 1..64
        ((1, 4, 4, 32, 32), "dim 1 is 4, but the program fixes it to 3"),
    ],
)
def test_an_npz_outside_the_programs_constraints_is_one_line(run, models, tmp_path, shape, words):
    code, _, err = run("audit", models["dynamic"], "--inputs", _npz(tmp_path / "in.npz", shape))
    assert code == 2
    h.one_error_line(err, "in.npz: array x has shape", words)


def test_a_static_program_still_takes_its_own_shapes(run, models, tmp_path):
    code, _, err = run("audit", models["conv_bn"], "--inputs", _npz(tmp_path / "in.npz", (1, 2, 3, 16, 16)))
    assert code == 2
    h.one_error_line(err, "needs [N, *[2, 3, 8, 8]] or [N*2, *[3, 8, 8]]", "dim 2 is 16, but the program fixes it to 8")


def test_input_shape_shapes_a_programs_random_batches(run, models):
    code, out, err = run("audit", models["dynamic"], "--input-shape", "x:2,3,48,48", "--random", "3", "-q")
    assert code == 0, err
    assert out.splitlines()[0].endswith("6 samples in 3 batch(es), random inputs")


@pytest.mark.parametrize(
    ("model", "spec", "words"),
    [
        ("dynamic", "x:2,3,48,300", "--input-shape x: dim 3 is 300"),
        ("dynamic", "x:2,3,48", "--input-shape x: it has 3 dims, the program's input has 4"),
        ("dynamic", "y:2,3,48,48", "--input-shape names 'y', which is not a tensor input of the program"),
        ("conv_bn", "x:2,3,9,8", "--input-shape x: dim 2 is 9, but the program fixes it to 8"),
    ],
)
def test_input_shape_outside_the_programs_constraints_is_one_line(run, models, model, spec, words):
    code, _, err = run("audit", models[model], "--input-shape", spec)
    assert code == 2
    h.one_error_line(err, words)


def test_input_shape_and_an_npz_do_not_mix_for_a_program(run, models, tmp_path):
    npz = _npz(tmp_path / "in.npz", (1, 4, 3, 32, 32))
    code, _, err = run("audit", models["dynamic"], "--inputs", npz, "--input-shape", "x:4,3,32,32")
    assert code == 2
    h.one_error_line(err, "--input-shape shapes the --random batches of a .pt2 program")


@pytest.mark.parametrize("batch", [10**20, 10**8], ids=["past int64", "a few GB"])
def test_a_huge_input_shape_on_an_open_dim_is_one_line_before_anything_is_drawn(run, tmp_path, batch):
    """A dynamic dim with no upper bound lets any size through the program's constraints: one batch's bytes are
    checked against what the weights justify before the batches are drawn (before: an internal TypeError from
    ``randn`` past int64, or the batches allocated before the plan refused them)."""
    import torch

    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.BatchNorm2d(4)).eval()
    dim = torch.export.Dim("batch", min=1)
    ep = torch.export.export(model, (torch.randn(2, 3, 8, 8),), dynamic_shapes=({0: dim},))
    path = tmp_path / "open.pt2"
    torch.export.save(ep, str(path))
    code, _, err = run("audit", str(path), "--input-shape", f"input:{batch},3,8,8", "-q")
    assert code == 2
    h.one_error_line(err, "--input-shape", "one batch of inputs takes")


class _Wide(torch.nn.Module):
    """conv+bn on x, which is ``s + 10`` wide (a derived dim); ``Shifted``: its output past column 10 plus y, ``s``
    wide (export then guards s against 0 and 1, which the slice was traced without)."""

    def __init__(self):
        super().__init__()
        self.conv, self.bn = torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.BatchNorm2d(4)

    def forward(self, x):
        return self.bn(self.conv(x))


class _Shifted(_Wide):
    def forward(self, x, y):
        return super().forward(x)[..., 10:] + y


def _derived(path, low: int, shifted: bool):
    s = torch.export.Dim("s", min=low, max=100)
    args, dyn = (torch.randn(1, 3, 8, 30),), ({3: s + 10},)
    if shifted:
        args, dyn = (*args, torch.randn(1, 4, 8, 20)), (*dyn, {3: s})
    ep = torch.export.export(h.randomize_bn((_Shifted if shifted else _Wide)()).eval(), args, dynamic_shapes=dyn)
    torch.export.save(ep, str(path))
    return ep, path


def _sizes(width: int, shifted: bool) -> dict:
    return {"x": (1, 3, 8, width), **({"y": (1, 4, 8, width - 10)} if shifted else {})}


@pytest.mark.parametrize(("low", "shifted"), [(0, False), (1, False), (0, True)], ids=["min 0", "min 1", "guarded"])
def test_a_derived_dim_takes_the_sizes_torchs_own_module_takes(low, shifted, tmp_path):
    """``Dim("s", min=low)`` and x ``s + 10`` wide: bnfold allows the sizes that ``ExportedProgram.module()``
    runs (its range_constraints, 0 and 1 let through below a lowest bound of 2, and its guards).  Before, x 10 wide
    at min 0 was refused (sympy's ``Eq(s + 10, 10)`` is False for torch's positive symbols) and 11 wide passed the
    guarded program, whose guards refuse s = 1."""
    from bnfold.io.input_dims import shape_error

    ep, _ = _derived(tmp_path / "d.pt2", low, shifted)
    for width in (9, 10, 11, 12, 110, 111):
        try:
            ep.module()(*(torch.randn(s) for s in _sizes(width, shifted).values()))
            runs = True
        except (AssertionError, RuntimeError):
            runs = False
        assert (shape_error(ep, _sizes(width, shifted)) is None) == runs, (
            width,
            shape_error(ep, _sizes(width, shifted)),
        )


@pytest.mark.parametrize(
    ("low", "shifted", "width", "words"),
    [
        (0, False, 10, None),  # s = 0 in 0..100: audits
        (1, False, 10, " + 10 only in 11..110"),
        (0, True, 11, "break the program's guard ((-10) + L['x'].size()[3]) != 1"),
    ],
    ids=["s is 0 at min 0", "s is 0 at min 1", "s is 1, guarded"],
)
def test_a_derived_dims_size_audits_or_is_one_line_naming_the_bound(run, tmp_path, low, shifted, width, words):
    _, path = _derived(tmp_path / "d.pt2", low, shifted)
    given = [
        a
        for name, dims in _sizes(width, shifted).items()
        for a in ("--input-shape", f"{name}:{','.join(map(str, dims))}")
    ]
    code, out, err = run("audit", path, *given, "-q")
    if words is None:
        assert code == 0, err
        assert out.splitlines()[0].endswith("8 samples in 8 batch(es), random inputs")
    else:
        assert code == 2
        h.one_error_line(
            err, f"--input-shape x: dim 3 is {width}" if "only in" in words else "--input-shape x: its dims", words
        )


def test_a_guard_is_read_never_run():
    """``input_guards.failed_guard`` evaluates comparisons of input sizes itself; a guard of anything else (a call,
    an attribute, an input not given, a text too long to parse) is never executed, and refuses the sizes: bnfold
    cannot tell whether the program's ops were traced for them."""
    from types import SimpleNamespace

    from bnfold.io.input_guards import failed_guard

    guards = [
        "__import__('os').system('false')",
        "math.floor(L['x'].size()[0]) > 100",
        "L['y'].size()[0] > 100",
        "abs(1, 2) == 1 and min(1) == 1",
        "(-10) + L['x'].size()[1] != 1 and max(1, L['x'].size()[0]) >= 3",
    ]
    for k, guard in enumerate(guards[:4]):
        assert failed_guard(SimpleNamespace(_guards_code=[guards[4], guard]), {"x": (3, 12)}) == (guard, False), k
    assert failed_guard(SimpleNamespace(_guards_code=["1 == 1 and " * 1000 + "True"]), {"x": (3, 12)})[1] is False
    ep = SimpleNamespace(_guards_code=guards[4:])
    assert failed_guard(ep, {"x": (2, 20)}) == (guards[4], True)
    assert failed_guard(ep, {"x": (3, 11)}) == (guards[4], True)
    assert failed_guard(ep, {"x": (3, 12)}) is None
