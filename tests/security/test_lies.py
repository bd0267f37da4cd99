"""Issue 28: never trust what a file says about itself.

Each ``.pt2`` here asks, through one op's arguments, for a huge size while its stored metadata
(``meta["val"]``) states the small one export wrote (``crafted_lies.LIES``: every op class of the
allowlist whose arguments set a size).  ``fold``, ``check`` and ``audit`` must each refuse it with
exit 2 and one line naming the node (the recomputed shapes disagree with the metadata), within
1 GiB.  All cases run in ONE subprocess under an address-space and CPU limit
(``crafted.run_bnfold``); ``-k`` runs a subset.
"""

from __future__ import annotations

import crafted as c
import crafted_lies as lies
import pytest

PEAK_MIB = 1024
OUT = "out"
MISMATCH = "does not match its ops"


def _all3(path, *words):
    return [
        (["fold", path, "-o", f"{OUT}/{path.stem}{path.suffix}"], words),
        (["check", path], words),
        (["audit", path, "--random", "1"], words),
    ]


def _lie(name):
    _, target, _ = lies.LIES[name]
    words = ("fails on its inputs", "inconsistent") if name == "col2im" else (MISMATCH,)
    return lambda d: _all3(lies.lying_program(d, name), *words, f"({target})")


CASES = {
    **{f"lie-{name}": _lie(name) for name in lies.LIES},
    # metadata stating more than the op computes is refused all the same (the decision is "agree or refuse")
    "lie-smaller": lambda d: [(["check", lies.smaller_lie(d)], (MISMATCH, "[1, 1]", "[2, 3]"))],
    # honest metadata, sizes from the ops: the cost rules refuse them before anything runs
    "honest-mm-chain-constant": lambda d: _all3(
        c.export(d / "products.pt2", lies.ComputedByProducts(), (lies.w.X,)), "FLOPs", "--max-work"
    ),
    "honest-attention": lambda d: _all3(
        lies.attention_honest(d), "scaled_dot_product_attention", "FLOPs", "--max-work"
    ),
    # a size only the data tells: fold and check never run it; in the audit, the allocator fails under the
    # address-space cap and the watchdog names the op
    "runtime-data-sized": lambda d: [
        (["fold", lies.data_sized_lie(d), "-o", f"{OUT}/b.pt2"], 0),
        (["check", d / "data-sized.pt2"], 1),
        (["audit", d / "data-sized.pt2", "--random", "1"], ("repeat_interleave", "out of memory")),
    ],
    # ONNX: stated value_info / output shapes are not believed
    "onnx-value-info": lambda d: _all3(lies.onnx_lie(d, "value-info"), "Conv 'conv'", "over the budget"),
    "onnx-output-shape": lambda d: _all3(lies.onnx_lie(d, "output-shape"), "Resize 'grow'", "over the budget"),
    # a Resize whose scales the graph computes from the data: sized when it runs, before it allocates
    "onnx-computed-scales": lambda d: [
        (["fold", lies.onnx_lie(d, "computed-scales"), "-o", f"{OUT}/s.onnx"], 0),
        (["check", d / "computed-scales.onnx"], 1),
        (["audit", d / "computed-scales.onnx", "--random", "1"], ("Resize 'grow'", "would create", "--max-work")),
    ],
}
LEGIT_OUTPUTS = {"b.pt2", "s.onnx", "s.onnx.data"}


@pytest.fixture(scope="module")
def results(request, tmp_path_factory):
    """``{case: [(argv, expected, result), ...]}`` for the selected cases, run in one subprocess."""
    root = tmp_path_factory.mktemp("lies")
    (root / OUT).mkdir()
    plan, argvs = [], []
    for case in c.selected(request) or list(CASES):
        d = root / case
        d.mkdir()
        for argv, expected in CASES[case](d):
            plan.append((case, argv, expected))
            argvs.append(argv)
    out: dict[str, list] = {}
    for (case, argv, expected), r in zip(plan, c.run_bnfold(root, *argvs), strict=True):
        out.setdefault(case, []).append((argv, expected, r))
    return out, root


@pytest.mark.parametrize("case", list(CASES))
def test_lie_is_refused(case, results):
    by_case, root = results
    c.assert_case(by_case[case], PEAK_MIB)
    assert not {p.name for p in (root / OUT).iterdir()} - LEGIT_OUTPUTS
