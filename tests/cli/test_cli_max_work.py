"""``--max-work`` (and ``--max-bytes``) take bytes as people write them, and a refusal names the ``--max-work``
value that allows the run.  Before, ``1e9`` was "expected a whole number" and the refusals said "N"."""

from __future__ import annotations

import re

import pytest

import cli_helpers as h
from bnfold.io import cost
from bnfold.io.budget import parse_bytes


@pytest.mark.parametrize(
    "text, value",
    [
        ("1000000000", 10**9),
        ("1e9", 10**9),
        ("4GiB", 4 << 30),
        ("4 GiB", 4 << 30),
        ("4g", 4 << 30),
        ("512M", 512 << 20),
        ("2GB", 2 * 10**9),
        ("1.5KiB", 1536),
        ("1.0001KiB", 1025),  # rounded up to whole bytes
    ],
)
def test_byte_counts_as_people_write_them(text, value):
    assert parse_bytes(text) == value


@pytest.mark.parametrize("text", ["", "GiB", "4 XB", "-1", "0", "0.5", "1e400", "nan", "4GiB5"])
def test_anything_else_is_refused(text):
    with pytest.raises(ValueError, match="expected"):
        parse_bytes(text)


def test_the_cli_takes_them_and_refuses_the_rest_in_one_line(run, models):
    for value in ("1e9", "4GiB"):
        code, _, err = run("check", models["conv_bn"], "--max-work", value)
        assert code == 1, err  # its batch norm is foldable: the check ran
    code, _, err = run("check", models["conv_bn"], "--max-work", "4 zillion")
    assert code == 2
    h.one_error_line(err, "--max-work", "expected a number of bytes such as 1e9, 4GiB or 512MiB")


@pytest.mark.parametrize("per_byte", [1, 8])
def test_a_flops_refusal_names_the_max_work_that_allows_the_plan(per_byte):
    steps = [cost.PlanStep(f"op{i}", [f"v{i}"], [f"v{i - 1}"] if i else [], 1 << 10, 3 * 10**9) for i in range(40)]
    small = cost.Budget(1 << 20, cost.FLOPS_PER_BYTE << 20, per_byte)
    with pytest.raises(cost.WorkError, match="FLOPs") as err:
        cost.check_plan(steps, small, "m.pt2", live={})
    found = re.search(r"--max-work (\S+) would allow it", str(err.value))
    assert found, str(err.value)
    n = parse_bytes(found.group(1))
    enough = cost.Budget(n * per_byte, cost.FLOPS_PER_BYTE * n, per_byte)
    plan = cost.check_plan(steps, enough, "m.pt2", live={})  # the value named is enough
    assert plan.flops > small.flops


def test_an_audit_refused_names_a_max_work_that_runs_it(run, models):
    """Each refusal names a larger ``--max-work``; following them, the audit runs (an ``at least`` value is a bound
    found before the rest of the run was sized)."""
    value, seen = "2KiB", []
    for _ in range(4):
        code, _, err = run("audit", models["conv_bn"], "--random", "1", "--max-work", value)
        if code == 0:
            break
        line = h.one_error_line(err)
        found = re.search(r"--max-work (\S+) would allow it", line)
        assert code == 2 and found, line
        seen.append(parse_bytes(found.group(1)))
        value = found.group(1)
    assert code == 0 and seen and seen == sorted(set(seen)), (err, seen)


def test_a_refusal_says_each_size_once():
    """A size just over its limit read as the limit at three digits ("would create 1 MiB, over the budget of 1 MiB"):
    such pairs are said in bytes; one input is not named with the batch's size again."""
    budget = cost.Budget(1 << 20, cost.FLOPS_PER_BYTE << 20)
    one = [cost.PlanStep("op", ["v"], [], (1 << 20) + 8, 0)]
    with pytest.raises(cost.WorkError, match=r"^m.pt2: op would create 1,048,584 bytes, over the budget of 1,048,576 "):
        cost.check_plan(one, budget, "m.pt2", live={})
    two = [cost.PlanStep(f"op{i}", [f"v{i}"], [], 600 << 10, 0) for i in range(2)]
    with pytest.raises(cost.WorkError, match=r"^m.pt2: at op1 the values alive at once would take 1.17 MiB, over the "):
        cost.check_plan(two, budget, "m.pt2", live={})
    weights = 1 << 20
    cap = cost.Budget.for_inputs(weights)
    with pytest.raises(cost.WorkError, match=r"^m.pt2: one batch of inputs takes \S+ \S+ \(input 'x'\), over the "):
        cost.check_inputs({"x": cap + 1}, weights, "m.pt2")


def test_the_run_time_check_says_each_size_once():
    """The run-time check before an op (``run_checks.before_op``): an op just over the budget, alone or with what the
    run holds, says the sizes that read alike in bytes."""
    from bnfold.io.run_checks import before_op

    budget = cost.Budget(1 << 20, cost.FLOPS_PER_BYTE << 20)
    with pytest.raises(cost.WorkError, match=r"^op would create 1,048,584 bytes, over the budget of 1,048,576 bytes"):
        before_op("op", None, budget=budget, nbytes=(1 << 20) + 8)
    with pytest.raises(cost.WorkError, match=r"hold 1,048,584 bytes with what it holds already\), over the budget of "):
        before_op("op", None, budget=budget, nbytes=600 << 10, held=lambda n: (1 << 20) + 8)
