"""Every command and snippet in README.md runs as written, in order, in one folder.

Python blocks share one namespace (later snippets use the model the first one defines); console
blocks run each ``$`` command in bash and compare its exit status and the output the README shows;
the CI snippet's ``bnfold`` steps run on the files the snippets wrote; the pre-commit snippet names
the hook this repository ships.  See ``readme_blocks`` for the markers.
"""

from __future__ import annotations

import re

import pytest
import yaml
from readme_blocks import KINDS, ROOT, Block, blocks, commands, in_order, last_digit, matches, run_readme, shell

#: At most this many blocks may be skipped (each says why, in its marker).
MAX_SKIPPED = 3


def test_every_block_has_a_known_kind_and_skips_are_few_and_explained():
    found = blocks()
    assert len(found) > 10
    assert {b.kind for b in found} <= KINDS, {b.kind for b in found}
    skipped = [b for b in found if b.skip]
    assert len(skipped) <= MAX_SKIPPED, [(b.line, b.skip) for b in skipped]
    assert all(len(b.skip) > 20 for b in skipped)
    assert any("Qualcomm" in b.skip for b in skipped), "the QNN lowering block says it needs the SDK"


def test_the_parser_reads_markers_exit_codes_and_outputs():
    text = (
        "x\n<!-- readme-test: skip (needs a thing we lack here) -->\n```sh\nrm -rf /\n```\n\n"
        "```console\n$ bnfold check a.pt2   # exit 1\na.pt2: 1 left\n  bn  foldable\n$ true\n```\n"
    )
    skipped, console = blocks(text)
    assert (skipped.kind, skipped.skip) == ("sh", "needs a thing we lack here")
    assert console.skip is None
    first, second = commands(console)
    assert (first.command, first.exit_code, first.output) == (
        "bnfold check a.pt2",
        1,
        ["a.pt2: 1 left", "  bn  foldable"],
    )
    assert (second.command, second.exit_code, second.output) == ("true", 0, [])
    assert in_order(["a", "c"], ["a", "b", "c"]) == [] and in_order(["c", "a"], ["a", "c"]) == ["a"]
    assert in_order(["wrote x (13 s)", "done in 0.01 s"], ["wrote x (9 s)", "done in 1.25 s"]) == []
    assert in_order(["wrote x (13 s)"], ["wrote y (13 s)"]) == ["wrote x (13 s)"]


@pytest.mark.parametrize(
    "want, got, same",
    [
        (
            "  fp32   98.9%   100.0%   133.2 dB   0/0   blocks.2.project.0 (129.2)",
            "  fp32 98.9% 100.0% 133.1 dB 0/0 blocks.2.project.0 (129.3)",
            True,
        ),  # the last digit rounds the other way
        ("  fp32   98.9%   100.0%   133.2 dB", "  fp32   98.9%   100.0%   132.2 dB", False),  # beyond the last digit
        ("  fp16   98.9%", "  fp16   98.7%", False),  # one held-out prediction more or less is a change
        ("  fp16 folded  59.5 dB  head.0 (57.4)", "  fp16 folded  59.4 dB  blocks.1.se.reduce (57.5)", True),
        ("  fp16 folded  59.5 dB  head.0 (57.4)", "  fp16 folded  59.5 dB", False),  # a value went missing
        ("  fp16 folded  59.5 dB", "  fp16 folded  nan dB", False),
        ("13 BatchNorms folded, 0 skipped", "12 BatchNorms folded, 1 skipped", False),  # counts are exact
        (
            "  folded   stem.1  into stem.0  conv2d+batch_norm [output]",
            "  folded   block.1  into block.0  conv2d+batch_norm [output]",
            False,
        ),
        ("headroom 6.97e+03x (at head.1, over its input", "headroom 6.96e+03x (at stem.1, over its input", True),
        ("headroom 6.97e+03x (at head.1, over its input", "headroom 7.1e+03x (at head.1, over its input", False),
        # a value with its spread: within the larger printed spread, whatever the spreads are
        ("  det fp16  36.9 ± 1.2 dB  (8 batches)", "  det fp16  32.9 ± 4.1 dB  (8 batches)", True),
        ("  det fp16  36.9 ± 1.2 dB  (8 batches)", "  det fp16  35.9±1.0 dB  (8 batches)", True),
        ("  det fp16  36.9 ± 1.2 dB  (8 batches)", "  det fp16  32.9 ± 1.0 dB  (8 batches)", False),
        ("  det fp16  36.9 ± 1.2 dB  (8 batches)", "  det fp16  36.9 ± 1.2 dB  (9 batches)", False),
        ("  det fp16  36.9 ± 1.2 dB", "  det fp16  36.9 dB", False),  # the spread went missing
        ("  det fp16  36.9 dB", "  det fp16  36.9 ± 0.3 dB", False),
    ],
)
def test_printed_numbers_are_compared_within_their_own_precision_or_spread(want, got, same):
    assert matches(want, got) is same


@pytest.mark.parametrize(
    "number, unit", [("59.5", 0.1), ("132", 1), ("6.97e+03", 10), ("1e-09", 1e-9), ("0.000669", 1e-6), ("-3.25", 0.01)]
)
def test_last_digit(number, unit):
    assert last_digit(number) == pytest.approx(unit)


def _check_console(block: Block, cmd, proc) -> None:
    where = f"README.md:{block.line}: $ {cmd.command}"  # lines compared by readme_blocks.matches
    assert proc.returncode == cmd.exit_code, f"{where}: exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    actual = (proc.stdout + proc.stderr).splitlines()
    missing = in_order(cmd.output, actual)
    assert not missing, (
        f"{where}: the README shows lines the command did not print (if the change is right, run "
        "`make readme`):\n" + "\n".join(missing) + "\n--- it printed:\n" + "\n".join(actual)
    )
    assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr, proc.stderr


def _run_yaml(block: Block, cwd) -> None:
    doc = yaml.safe_load(block.code)
    if isinstance(doc, dict) and "repos" in doc:  # the pre-commit config
        shipped = {hook["id"] for hook in yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())}
        used = {hook["id"] for repo in doc["repos"] for hook in repo["hooks"]}
        assert used and used <= shipped, (used, shipped)
        return
    steps = [step["run"] for step in doc]  # a CI snippet: install steps, then bnfold steps
    for run in steps:
        if run.startswith("pip install"):
            assert "bnfold" in run
            continue
        assert run.startswith("bnfold "), run
        proc = shell(run, cwd)
        assert proc.returncode == 0, (
            f"README.md:{block.line}: {run}: exit {proc.returncode}\n{proc.stdout}{proc.stderr}"
        )


@pytest.mark.filterwarnings("ignore")
def test_the_readme_runs_as_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    ran = run_readme(tmp_path, _check_console, lambda block: _run_yaml(block, tmp_path))
    assert ran["python"] >= 6 and ran["console"] >= 4 and ran["yaml"] == 2, ran
    assert (tmp_path / "model.pte").stat().st_size > 0 and (tmp_path / "model_folded.onnx").is_file()


def test_update_rewrites_console_outputs_only():
    from readme_blocks import _with_outputs

    text = "a\n```console\n$ one\nold\nlines\n$ two\n```\n```python\n$ x\n```\n"
    new = _with_outputs(text, [("one", ["new"]), ("two", ["unused"])])
    assert new == "a\n```console\n$ one\nnew\n$ two\n```\n```python\n$ x\n```\n"


def test_no_placeholder_is_left():
    assert not re.search(r"@[A-Z_]+@", (ROOT / "README.md").read_text())
