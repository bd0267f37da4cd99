"""Where one ``bnfold.audit`` goes, stage by stage (issue 43: the audit at the cost of two forwards).

    .venv/bin/python benchmarks/audit_stages.py [--audits 10] [--only resnet,cls] [--batches 1] [--base DIR] [--zoo]

Per model (the part-B networks as torch program and ONNX, and the rapidocr models, as ``audit_ratio.py`` builds
them; one torch thread), the audit of ``audit_ratio.py``'s table (``tensors=False, local=False``, the model's fold
done once before and passed in) is run ``--audits`` times; each stage's process CPU time is taken in each audit, and
the least over the audits is printed, in fp32 forwards (the forward timed as ``audit_ratio.py`` times it):

* ``plan``     ``AuditFormat.prepare``: the batches checked and the cost plan (ONNX: shape inference and the plan);
* ``programs`` both programs built (``AuditFormat.program``, unfolded and folded);
* ``set-up``   both ``Runner`` s made (constants rounded, frees, fusion plan);
* ``runs``     ``execute_pair``: every batch's three runs (unfolded emulated and reference, folded emulated) with the
               rows' measurements and the batch-norm probes;
* ``norms``    the normalization rows (:func:`bnfold.numerics.norm_rows.norm_audits`: risk, kappa, headroom);
* ``rest``     the audit less all of those (rows, the report, the diagnosis).

``--zoo``: the library zoo's models instead (``audit_ratio.py --zoo``'s: ``--only tv:vgg11_bn,timm:levit_128s``), as
torch programs and as dynamo ONNX.

``--base DIR``: the same stages of another copy of the package (``DIR/bnfold``, imported as ``bnfold_base``, see
``audit_ratio.py``), its audits alternating with this one's; printed as a second line per model.  With
``--batches N``, every column is per batch (the forward times N).

A benchmark, not a test: nothing asserts on a time.  The stages are wrapped where the audit module looks them up
(its globals, and the format's class methods), for the duration of the script.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from importlib import import_module

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch
from audit_ratio import FORWARDS, _batches, _min_times, forward_of, load_base, markdown, suite, zoo_models

import bnfold

STAGES = ("plan", "programs", "set-up", "runs", "norms")


class _Clock:
    """The CPU time spent in each stage during one audit (``spent``), by wrapping the audit module's names."""

    def __init__(self, package):
        self.spent: dict[str, float] = {}
        self.audit_module = import_module(f"{package.__name__}.numerics.audit")
        for name, stage in (("execute_pair", "runs"), ("Runner", "set-up"), ("norm_audits", "norms")):
            setattr(self.audit_module, name, self._timed(getattr(self.audit_module, name), stage))
        self._wrapped: set = set()

    def _timed(self, fn, stage: str):
        def timed(*args, **kwargs):
            t = time.process_time()
            try:
                return fn(*args, **kwargs)
            finally:
                self.spent[stage] = self.spent.get(stage, 0.0) + time.process_time() - t

        return timed

    def format_of(self, fmt) -> None:
        """Wrap ``prepare`` and ``program`` of the format's class (once)."""
        cls = type(fmt)
        if cls in self._wrapped:
            return
        self._wrapped.add(cls)
        for method, stage in (("prepare", "plan"), ("program", "programs")):
            real = getattr(cls, method)
            timed = self._timed(real, stage)
            setattr(cls, method, lambda self, *a, _timed=timed, **k: _timed(self, *a, **k))


def _audits(runs: list[tuple], model, inputs, n: int) -> list[dict[str, float]]:
    """Per ``(package, clock, fold)`` of ``runs``, the least CPU time of each stage (and ``total``) over ``n`` audits,
    the packages' audits alternating (one of each in turn, the order swapped every other time)."""
    for package, clock, _ in runs:
        clock.format_of(import_module(f"{package.__name__}.frontends").frontend_for(model).numerics())
    best: list[dict[str, float]] = [{} for _ in runs]
    for i in range(n):
        order = list(enumerate(runs))
        for k, (package, clock, fold) in order if i % 2 == 0 else order[::-1]:
            clock.spent = {}
            t = time.process_time()
            package.audit(model, inputs, profile="fp16", tensors=False, local=False, fold=fold)
            found = dict(clock.spent, total=time.process_time() - t)
            found["rest"] = found["total"] - sum(found.get(s, 0.0) for s in STAGES)
            for key, v in found.items():
                best[k][key] = min(best[k].get(key, float("inf")), v)
    return best


def _rows(label: str, model, x, args, base, clocks) -> list[list[str]]:
    inputs = _batches(x, args.batches)
    forward = forward_of(model, x)

    def forwards():
        with torch.no_grad():
            for _ in range(FORWARDS):
                forward()

    (fwd,) = _min_times([forwards], 3)
    fwd /= FORWARDS * args.batches
    packages = [bnfold] + ([base] if base is not None else [])
    runs = [(package, clock, package.fold(model)) for package, clock in zip(packages, clocks)]
    out = []
    for k, best in enumerate(_audits(runs, model, inputs, args.audits)):
        cells = [f"{best.get(s, 0.0) / fwd:.2f}x" for s in (*STAGES, "rest", "total")]
        out.append([label if k == 0 else f"{label} (base)", f"{fwd * 1e3:.2f}", *cells])
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--audits", type=int, default=10)
    p.add_argument("--batches", type=int, default=1, help="audit N batches (stages per batch)")
    p.add_argument("--only", default="", help="comma-separated model keys (resnet, efficientnet, audio, cls, ...)")
    p.add_argument("--base", default="", help="a directory holding another copy of bnfold, timed beside this one")
    p.add_argument("--zoo", action="store_true", help="the library zoo's torchvision/timm classes instead")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    base = load_base(args.base) if args.base else None
    clocks = [_Clock(bnfold)] + ([_Clock(base)] if base is not None else [])
    out = []
    only = set(filter(None, args.only.split(",")))
    models = ((label, model, x) for label, _, model, x in zoo_models(only)) if args.zoo else suite(only)
    for label, model, x in models:
        out += _rows(label, model, x, args, base, clocks)
    head = ["model", "fwd ms", *STAGES, "rest", "total"]
    markdown(head, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
