"""``bnfold fold IN -o OUT --fp16-range INPUTS.npz``: the rewrite from the command line, and its refusals in one
line (a hostile .npz, arrays that do not fit, a model over the work budget): non-zero exit, no output written."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from range_cli import cli

import bnfold
import range_models as rm


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("range_cli")
    model = rm.build("attention")
    batches = rm.batches(model, 2)
    torch.export.save(rm.program(model), d / "att.pt2")
    np.savez(d / "att.npz", x=torch.stack([b[0] for b in batches]).numpy())
    (d / "bad.npz").write_bytes(b"PK\x03\x04 not a zip archive")
    np.savez(d / "wrong.npz", y=np.zeros((2, 3), dtype=np.float32))
    return d


def test_cli_rewrites_and_reports(files):
    done = cli("--json", "fold", "att.pt2", "-o", "out.pt2", "--fp16-range", "att.npz", "--force", cwd=files)
    assert done.returncode == 0, done.stderr
    payload = json.loads(done.stdout)
    assert {e["code"] for e in payload["rescaled"]} == {"rescaled", "nonlinear_reader"}
    assert payload["summary"]["rescaled"] == 1
    result = bnfold.fold(str(files / "out.pt2"))  # a valid program; nothing left to rescale in it
    assert result.report.rescaled == []


@pytest.mark.parametrize(
    ("npz", "extra", "says"),
    [
        ("bad.npz", (), "cannot read"),
        ("wrong.npz", (), "expected arrays named"),
        ("att.npz", ("--max-work", "1000"), "--max-work"),
    ],
)
def test_cli_refuses_in_one_line(files, npz, extra, says):
    out = files / f"refused_{npz}.pt2"
    done = cli("fold", "att.pt2", "-o", out.name, "--fp16-range", npz, *extra, cwd=files)
    assert done.returncode != 0
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and says in lines[0] and "Traceback" not in done.stderr
    assert not out.exists()
