"""A chain whose length the file sets is walked on a loop, not on Python's stack.

``getitem(w, 0)`` of a weight with ``n + 4`` dimensions, ``n`` times, reaches a conv: the constant
evaluator's ``_evaluable`` and the fp16 range rewrite's ``range_op`` followed each ``getitem`` one call
deeper (main: ``RecursionError``, exit 3, at about 1000 of them).  Such a file's metadata grows as
``n ** 2`` (1100 of them: 20 MB, over a minute for torch to load; 400: 340,000 JSON values, which take
``--max-work`` to load), so the command-line test runs bnfold on a 350-frame stack with a chain of 400
instead (main needs some 250 frames to load it, and 400 more for the chain); the API test uses a chain of
3000 built in memory.
"""

from __future__ import annotations

import operator

import crafted as c
import crafted_work as w
import numpy as np
import torch

import bnfold

CHAIN, STACK = 400, 350


def test_a_long_getitem_chain_is_one_line_or_a_skip_never_exit_3(tmp_path):
    path = w.getitem_chain(tmp_path, CHAIN)
    np.savez(tmp_path / "inputs.npz", x=w.X.numpy())
    out = tmp_path / "out"
    out.mkdir()
    more = ["--max-work", "1GiB"]  # its metadata (340,000 JSON values) is over a small file's JSON budget
    check, audit, fold, fold_range = c.run_bnfold(
        tmp_path,
        ["check", path, *more],
        ["audit", path, "--random", "1", *more],
        ["fold", path, "-o", out / "folded.pt2", *more],
        ["fold", path, "-o", out / "range.pt2", "--fp16-range", tmp_path / "inputs.npz", *more],
        recursion_limit=STACK,
    )
    assert check["code"] == 0 and not c.beyond_progress(check["stderr"]), check  # the norm stays: no constant weight
    assert audit["code"] == 0 and not c.beyond_progress(audit["stderr"]), audit
    for r in (fold, fold_range):  # torch cannot save a getitem of a tensor: refused, one line, nothing written
        c.assert_refused(r, "cannot write the model")
    assert not list(out.iterdir())


def _chained(n: int) -> torch.export.ExportedProgram:
    """ConvBN whose conv reads its weight through ``n`` getitems (their metadata the weight's)."""
    ep = torch.export.export(c.ConvBN().eval(), (w.X,))
    graph = ep.graph
    weight = next(n for n in graph.nodes if n.name == "p_conv_weight")
    conv = next(n for n in graph.nodes if n.op == "call_function" and "conv" in str(n.target))
    prev = weight
    with graph.inserting_before(conv):
        for _ in range(n):
            prev = graph.call_function(operator.getitem, (prev, 0))
            prev.meta["val"] = weight.meta["val"]
    conv.replace_input_with(weight, prev)
    return ep


def test_fold_and_check_skip_a_weight_behind_3000_getitems_with_a_reason():
    ep = _chained(3000)
    result = bnfold.fold(ep)
    assert not result.report.folded
    (skip,) = result.report.skipped
    assert skip.code.value == "layer_weights" and "not a constant" in skip.reason, skip
    check = bnfold.check(ep)
    assert [s.code.value for s in check.unfoldable] == ["layer_weights"] and not check.foldable
