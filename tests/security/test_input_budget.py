"""Issue 43: the audit's work budget grows with the inputs the user chose, and with nothing a file says.

On inputs the user chose (tensors passed to ``bnfold.audit``, an ``.npz`` file, ``--input-shape``) the audit
may do ``INPUT_FLOPS_PER_WEIGHT`` FLOPs per weight element per input element per run beyond the content's
budget: what a fully convolutional model at the input's resolution does.  Batches shaped like the file's own
inputs get no such allowance, ``--max-work`` replaces every budget, and a file whose values outgrow its input
(an upsample's factor, a conv's padding) is refused on the same chosen input.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from bnfold.io.budget import INPUT_FLOPS_PER_WEIGHT, WorkError, input_flops, inputs_chosen, max_work
from bnfold.numerics.audit_memory import fx_audit_plan, onnx_audit_plan

BATCHES = 8  # what bnfold audit runs by default


class FullyConv(nn.Module):
    """Six 3x3 convs at the input's resolution (a detector's backbone without its strides); ``grow``
    upsamples the input first (a file whose values outgrow its input)."""

    def __init__(self, grow: float = 1.0, pad: int = 1):
        super().__init__()
        chans = [3, 32, 32, 32, 32, 32, 1]
        self.convs = nn.ModuleList(nn.Conv2d(a, b, 3, padding=pad) for a, b in zip(chans, chans[1:]))
        self.grow = grow

    def forward(self, x):
        if self.grow != 1.0:
            x = nn.functional.interpolate(x, scale_factor=self.grow)
        for conv in self.convs:
            x = torch.relu(conv(x))
        return x


def _plan(model: nn.Module, side: int, chosen: bool) -> None:
    x = torch.randn(1, 3, side, side)
    ep = torch.export.export(model.eval(), (x,))
    with inputs_chosen(chosen):
        fx_audit_plan(ep, [(x,)] * BATCHES, runs=3, name="net")


def test_the_allowance_is_per_weight_per_input_element_per_run_and_only_for_chosen_inputs():
    assert input_flops(1000, 500, 24) == 0  # the inputs' sizes came from the file
    with inputs_chosen(True):
        assert input_flops(1000, 500, 24) == 24 * INPUT_FLOPS_PER_WEIGHT * 1000 * 500
        with max_work(1 << 30):  # the user's budget replaces every other
            assert input_flops(1000, 500, 24) == 0


def test_a_fully_convolutional_model_on_a_large_chosen_input_fits():
    """512x512 through six convs of 32 channels: ~5e11 FLOPs for 8 batches of 3 runs, over the content's
    budget (~7e10) but within one multiply-add per weight per input element."""
    with pytest.raises(WorkError, match="FLOPs|values alive at once"):
        _plan(FullyConv(), 512, chosen=False)  # the file's own shapes: the content's budget (its bytes refuse first)
    _plan(FullyConv(), 512, chosen=True)


@pytest.mark.parametrize(
    "hostile",
    [
        pytest.param(FullyConv(grow=3.0), id="upsample-x3"),  # every value 9x the input's size
        pytest.param(FullyConv(pad=40), id="conv-padding-40"),  # each conv's output 78 pixels wider than its input
    ],
)
def test_values_that_outgrow_the_chosen_input_are_still_refused(hostile):
    """The same chosen input, the same weights: a file whose values grow past the input's size (an upsample's
    factor, a conv's padding) spends the allowances at the rate they grow, and is refused (on its bytes: 9x and 17x
    the honest model's plan, over the chosen input's allowance)."""
    with pytest.raises(WorkError, match="FLOPs|values alive at once"):
        _plan(hostile, 128, chosen=True)
    _plan(FullyConv(), 128, chosen=True)  # the honest model at that input


def test_ppocr_v4_det_at_960_fits_on_chosen_inputs():
    """The acceptance model: PP-OCRv4 det (rapidocr's, 4.7 MB) at 960x960, 8 batches: 2.7e11 FLOPs, refused
    on the content's budget alone (8e10), within the chosen inputs' allowance."""
    onnx = pytest.importorskip("onnx")
    from numerics.paddleocr_models import model_path

    try:
        path = model_path("v4-det")
    except FileNotFoundError as e:
        pytest.skip(str(e))
    model = onnx.load(path)
    x = np.zeros((1, 3, 960, 960), dtype=np.float32)
    with pytest.raises(WorkError, match="FLOPs|values alive at once"), inputs_chosen(False):
        onnx_audit_plan(model, [(x,)] * BATCHES, "det")
    with inputs_chosen(True):
        plan = onnx_audit_plan(model, [(x,)] * BATCHES, "det")
    assert 2e11 < plan.flops < plan.budget.flops


def test_the_audit_byte_budget_has_a_floor_under_1_gib_and_grows_with_the_content_and_chosen_inputs():
    """Issue 44's bound: an audit's floor (512 MiB as the audit counts what it holds) keeps a file under 100 KB under
    1 GiB; weights justify 8 x 16 bytes each, a chosen input 8 x 64 per byte, a file's own input shapes nothing."""
    from bnfold.io.budget import AUDIT_FLOOR_BYTES, MIB, Budget

    assert AUDIT_FLOOR_BYTES == 512 * MIB
    with inputs_chosen(False):
        assert Budget.for_audit(100_000, 64 * MIB, 8).bytes == AUDIT_FLOOR_BYTES  # a large declared input buys nothing
        assert Budget.for_audit(100 * MIB, 0, 8).bytes == 8 * 16 * 100 * MIB
    with inputs_chosen(True):
        assert Budget.for_audit(100_000, 3 * MIB, 8).bytes == AUDIT_FLOOR_BYTES + 8 * 64 * 3 * MIB
        with max_work(1 << 30):
            assert Budget.for_audit(100_000, 3 * MIB, 8).bytes == 8 << 30


def test_the_chosen_input_bytes_are_no_more_than_the_elements_the_user_chose():
    """``--input-shape`` naming one input of two: the other keeps the file's own (declared) shape, and its bytes
    bought the chosen-input allowance (a two-input program's second input of 4M elements: 512 MiB -> 8.3 GiB).  The
    allowance is now capped by the elements the user chose, at 8 bytes an element."""
    from bnfold.io.budget import AUDIT_FLOOR_BYTES, MIB, Budget

    with inputs_chosen(True, elements=192):  # the user shaped 192 elements; the file declares 16 MiB beside them
        assert Budget.for_audit(100_000, 16 * MIB, 8).bytes == AUDIT_FLOOR_BYTES + 8 * 64 * 192 * 8
    with inputs_chosen(True, elements=4 * MIB):  # what the user chose buys its full bytes
        assert Budget.for_audit(100_000, 3 * MIB, 8).bytes == AUDIT_FLOOR_BYTES + 8 * 64 * 3 * MIB


def test_the_api_shapes_a_programs_random_batches_by_input_shapes():
    """``bnfold.audit(program, input_shapes=...)`` drew its random batches at the program's own example shape and
    granted them the chosen-input allowance; the batches now take the shapes given."""
    import bnfold

    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4)).eval()
    batch = torch.export.Dim("batch", min=1, max=64)
    ep = torch.export.export(model, (torch.randn(4, 3, 16, 16),), dynamic_shapes=({0: batch},))
    rep = bnfold.audit(ep, input_shapes={"input": (1, 3, 16, 16)}, prescribe=False)
    assert rep.samples == rep.batches  # one sample a batch, as given (the example's 4 before)


class Wide(nn.Module):
    """Ten 9x9 convs of 16 channels at the input's resolution: at 1x16x512x512, 1.1e11 FLOPs a run, over the content's
    budget (8.6e10: 256 FLOPs per byte of 256 MiB plus 4x the input) with 0.8 MB of weights."""

    def __init__(self):
        super().__init__()
        self.convs = nn.Sequential(*(nn.Conv2d(16, 16, 9, padding=4) for _ in range(10)))

    def forward(self, x):
        return self.convs(x)


@pytest.fixture(scope="module")
def wide(tmp_path_factory) -> dict:
    """:class:`Wide` saved at 1x16x512x512 as a ``.pt2`` and as ONNX, and an ``.npz`` of one such batch."""
    from bnfold.io.pt2 import save_pt2

    d = tmp_path_factory.mktemp("wide")
    x = torch.randn(1, 16, 512, 512)
    model = Wide().eval()
    save_pt2(torch.export.export(model, (x,)), d / "wide.pt2")
    np.savez(d / "x.npz", x=x.numpy()[None])
    files = {"pt2": d / "wide.pt2", "npz": d / "x.npz", "elements": x.numel()}
    try:
        import onnx  # noqa: F401 - the ONNX exporter needs it
    except ImportError:
        return files
    torch.onnx.export(model, (x,), str(d / "wide.onnx"), input_names=["x"], opset_version=17, dynamo=False)
    files["onnx"] = d / "wide.onnx"
    return files


@pytest.mark.parametrize("fmt", ["pt2", "onnx"])
def test_a_file_checked_at_load_gets_the_work_of_its_own_shapes_up_to_what_the_user_chose(wide, fmt):
    """A file's one run at its own input shapes, checked at load: on the content's budget alone (the file is all
    there is), refused; when the user chose inputs of that size (``--inputs``, ``--input-shape``), their work is
    granted, as the audit's plan grants it; inputs the user chose smaller grant only their own size's work."""
    from bnfold.io import load_model

    if fmt not in wide:
        pytest.skip("onnx is not installed")
    n = wide["elements"]
    with pytest.raises(WorkError, match="FLOPs"):
        load_model(wide[fmt])
    with inputs_chosen(True, elements=n):
        load_model(wide[fmt])
    with pytest.raises(WorkError, match="FLOPs"), inputs_chosen(True, elements=n // 1024):
        load_model(wide[fmt])


def test_the_cli_loads_a_file_at_the_size_the_user_chose_and_refuses_it_alone(wide, capsys):
    """``bnfold audit wide.pt2``: refused at load on the content's budget (a file cannot buy itself work); with
    ``--inputs`` of its shape or ``--input-shape`` its size, loaded (the run stops here at an out-of-range
    ``--class-axis``, checked after the load, the fold and the batches)."""
    from bnfold.cli import main

    def audit(*argv) -> str:
        assert main(["audit", str(wide["pt2"]), *map(str, argv)]) == 2
        return capsys.readouterr().err

    assert "FLOPs" in audit("--random", 1) and "over the budget" in audit("--random", 1)
    for chosen in (("--inputs", wide["npz"]), ("--input-shape", "x:1,16,512,512", "--random", 1)):
        err = audit(*chosen, "--class-axis", 7)
        assert "--class-axis: class axis 7 is out of range" in err and "FLOPs" not in err, err
