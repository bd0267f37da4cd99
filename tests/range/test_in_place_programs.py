"""A torch program that writes a constant in place through a view of it (``self.B.t().mul_(x)``: torch.export keeps
``aten.t`` then ``aten.mul_``, and its graph signature lists no mutation): the audit and the fp16 range rewrite run
it on their own copies, so the caller's program keeps its tensors, and the rewrite's runs take its batches one at a
time, each after the one before, as the program runs them (a group would share what one batch writes)."""

from __future__ import annotations

import copy

import pytest
import torch

import bnfold
from bnfold.numerics.fx_program import fx_program
from bnfold.numerics.ranges import run_plain


class WritesAView(torch.nn.Module):
    def __init__(self, n: int = 512):
        super().__init__()
        self.l = torch.nn.Linear(n, n)
        self.register_buffer("B", torch.rand(n, n) + 0.5)  # 1 MiB: a float64 run converts it at use

    def forward(self, x):
        v = self.B.t()
        v.mul_(torch.sigmoid(x))
        return self.l(x) * 300.0 + v.sum(0)


def _program(n: int = 512):
    torch.manual_seed(0)
    ep = torch.export.export(WritesAView(n).eval(), (torch.randn(n, n),))
    assert any(node.target == torch.ops.aten.mul_.Tensor for node in ep.graph.nodes)
    assert not ep.graph_signature.buffers_to_mutate  # no mutation the signature would name
    return ep


def _batches(n: int, k: int) -> list[tuple]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(n, n, generator=g) * 100,) for _ in range(k)]


def test_the_audit_and_the_range_rewrite_leave_the_callers_program_as_it_was():
    ep = _program(64)
    before = {k: v.clone() for k, v in ep.state_dict.items()}
    bnfold.audit(ep, _batches(64, 2), profile="fp16")
    bnfold.fold(ep, fp16_range=_batches(64, 2))
    for k, v in before.items():
        assert torch.equal(ep.state_dict[k], v), k


def test_a_run_in_groups_of_a_program_that_writes_a_constant_is_the_run_one_batch_at_a_time():
    ep = _program()
    program = fx_program(ep)
    kept = {k: v.clone() for k, v in program.constants.items()}
    batches = _batches(512, 3)
    for dtype in (torch.float32, torch.float64):
        one = run_plain(program, batches, dtype, None, 1)
        grouped = run_plain(program, batches, dtype, None, 3)
        assert all(torch.equal(a[0], b[0]) for a, b in zip(one, grouped))
        # each run starts from the program's constants: a second run gives the same outputs
        assert all(torch.equal(a[0], b[0]) for a, b in zip(one, run_plain(program, batches, dtype, None, 1)))
    for k, v in kept.items():
        assert torch.equal(program.constants[k], v), k


def test_the_runs_give_what_the_module_gives_on_the_batches_in_order():
    """The write through the view carries from each batch to the next, as in the module run eagerly: in float32 and
    in float64, where the 1 MiB buffer would otherwise be converted afresh at each step that reads it."""
    for dtype in (torch.float32, torch.float64):
        torch.manual_seed(0)
        module = WritesAView().eval()
        ep = torch.export.export(copy.deepcopy(module), (torch.randn(512, 512),))
        batches = _batches(512, 3)
        eager = copy.deepcopy(module).to(dtype)
        with torch.no_grad():
            want = [eager(x.to(dtype)) for (x,) in batches]
        got = run_plain(fx_program(ep), batches, dtype, None, 3)
        for (g,), w in zip(got, want):
            assert torch.allclose(g, w, rtol=1e-5 if dtype == torch.float32 else 1e-12, atol=0), dtype


def test_an_in_place_op_on_a_computed_value_copies_no_constant():
    """``nn.ReLU(inplace=True)`` after a conv exports as ``aten.relu_`` on the conv's output: it writes no constant,
    so the program holds the caller's tensors (no copy of the weights) and a run may group its batches."""
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU(inplace=True)).eval()
    ep = torch.export.export(model, (torch.randn(1, 3, 8, 8),))
    assert any(node.target == torch.ops.aten.relu_.default for node in ep.graph.nodes)
    program = fx_program(ep)
    assert not program.writes
    stored = {v.data_ptr() for v in ep.state_dict.values()}
    assert all(v.data_ptr() in stored for v in program.constants.values() if v.numel())
    assert fx_program(_program(64)).writes == {"b_b"}


_WRITES = {  # a buffer written through memory its schema does not say it shares, or one it makes share
    "unsafe_view": lambda b: torch.ops.aten._unsafe_view(b, [b.numel()]).mul_(3.0),
    "unsafe_split": lambda b: b.unsafe_split(8)[0].mul_(2.0),
    "set_": lambda b: torch.empty(0).set_(b).mul_(2.0),
    "split": lambda b: b.split(8)[1].add_(1.0),
    "copy_into_a_view": lambda b: b.t().copy_(torch.ones_like(b)),
}


@pytest.mark.parametrize("name", list(_WRITES))
def test_a_write_through_memory_no_schema_states_is_found(name):
    """An op whose output shares its input's memory without its schema saying so (``_unsafe_view``,
    ``unsafe_split``), one that makes its ``self`` share its source (``set_``), and the views a schema states: the
    program copies the buffer, and the audit and the range rewrite leave the caller's program as it was."""

    class Writes(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.l = torch.nn.Linear(16, 16)
            self.register_buffer("B", torch.rand(16, 16) + 0.5)

        def forward(self, x):
            _WRITES[name](self.B)
            return self.l(x) + self.B.sum()

    torch.manual_seed(0)
    ep = torch.export.export(Writes().eval(), (torch.randn(16, 16),))
    assert fx_program(ep).writes == {"b_b"}
    before = {k: v.clone() for k, v in ep.state_dict.items()}
    batches = [(torch.randn(16, 16),) for _ in range(2)]
    bnfold.audit(ep, batches, profile="fp16")
    bnfold.fold(ep, fp16_range=batches)
    for k, v in before.items():
        assert torch.equal(ep.state_dict[k], v), k


def test_an_input_the_program_writes_is_fed_as_a_copy():
    """``x.mul_(2.0)`` on the program's input (torch.export keeps it, no input mutation in the signature): the audit
    and the range rewrite feed the program copies of the caller's batches, which stay as they were, and the audit
    measures the model it was given (before, the folded run saw the batches doubled: its SQNR read 0.05 dB)."""

    class WritesItsInput(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.l = torch.nn.Linear(16, 16)

        def forward(self, x):
            x.mul_(2.0)
            return self.l(x)

    torch.manual_seed(0)
    ep = torch.export.export(WritesItsInput().eval(), (torch.randn(4, 16),))
    batches = [(torch.randn(4, 16),) for _ in range(2)]
    kept = [x.clone() for (x,) in batches]
    report = bnfold.audit(ep, batches, profile="fp16").to_dict()
    bnfold.fold(ep, fp16_range=batches)
    assert all(torch.equal(x, k) for (x,), k in zip(batches, kept))
    ends = report["end_to_end"]
    assert abs(ends["folded"]["output_sqnr_db"] - ends["unfolded"]["output_sqnr_db"]) < 10, ends
