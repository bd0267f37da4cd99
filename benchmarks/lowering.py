"""F. Lowering the BatchNorms that cannot fold, measured under the htp profile at QNN's eps.

    .venv/bin/python benchmarks/lowering.py [--batches 4] [--quick] [--out DIR]

A DenseNet-121-shaped network (growth 32, blocks 6/12/24/16, bn_size 4,
pre-activation BN -> ReLU -> conv everywhere; random weights, BatchNorm
statistics calibrated with train-mode batches of structured inputs, then eval)
is run by ``bnfold.numerics.emulate`` next to a float64 reference:

* ``unfolded``            the exported program as it is;
* ``folded``              ``bnfold.fold``: the BNs after a conv fold, the pre-activation ones stay;
* ``folded + lowered``    ``lower_unfoldable=True``: the ones that stay become mul + add constants.

each under ``fp16`` and under ``htp`` with the batch-norm eps QNN's builder uses (1e-9).
Prints output SQNR and NaN/inf counts, and writes ``lowering.{json,md}`` under
``--out`` (default ``benchmarks/results/local``, not tracked).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import RESULTS, batch_norm_nodes, log, quiet, table, write_json, write_text  # noqa: E402
from models import calibrate, structured_inputs  # noqa: E402

from bnfold.numerics import emulate  # noqa: E402
from bnfold.torch_export import fold_program  # noqa: E402

QNN_EPS = 1e-9


class DenseLayer(nn.Module):
    def __init__(self, cin: int, growth: int = 32, bn_size: int = 4):
        super().__init__()
        self.norm1, self.conv1 = nn.BatchNorm2d(cin), nn.Conv2d(cin, bn_size * growth, 1, bias=False)
        self.norm2 = nn.BatchNorm2d(bn_size * growth)
        self.conv2 = nn.Conv2d(bn_size * growth, growth, 3, padding=1, bias=False)

    def forward(self, x):
        y = self.conv1(torch.relu(self.norm1(x)))
        return torch.cat([x, self.conv2(torch.relu(self.norm2(y)))], 1)


class DenseNet(nn.Module):
    """DenseNet-121's layout: stem, 4 dense blocks with transitions, final BN, classifier."""

    def __init__(self, blocks=(6, 12, 24, 16), growth: int = 32, classes: int = 1000):
        super().__init__()
        c = 2 * growth
        layers: list[nn.Module] = [
            nn.Conv2d(3, c, 7, 2, 3, bias=False),
            nn.BatchNorm2d(c),
            nn.ReLU(),
            nn.MaxPool2d(3, 2, 1),
        ]
        for i, n in enumerate(blocks):
            for _ in range(n):
                layers.append(DenseLayer(c, growth))
                c += growth
            if i < len(blocks) - 1:
                layers += [nn.BatchNorm2d(c), nn.ReLU(), nn.Conv2d(c, c // 2, 1, bias=False), nn.AvgPool2d(2)]
                c //= 2
        layers += [nn.BatchNorm2d(c), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten()]
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(c, classes)

    def forward(self, x):
        return self.classifier(self.features(x))


def _sqnr(result) -> tuple[float | None, int]:
    """Output SQNR in dB over all batches (None if any output is not finite), and the non-finite count."""
    signal = noise = 0.0
    bad = 0
    for out, ref in zip(result.outputs, result.reference):
        out, ref = (o[0] if isinstance(o, (list, tuple)) else o for o in (out, ref))
        finite = torch.isfinite(out)
        bad += int((~finite).sum())
        signal += float((ref.double() ** 2).sum())
        noise += float(((out.double() - ref.double()) ** 2).sum())
    if bad:
        return None, bad
    return (math.inf if noise == 0 else 10 * math.log10(signal / noise)), 0


def run(blocks, size: int, batches: int) -> dict:
    torch.manual_seed(0)
    model = calibrate(DenseNet(blocks).eval(), (1, 3, size, size))
    inputs = [(x,) for x in structured_inputs((4, 3, size, size), batches, seed=1)]
    ep = torch.export.export(model, inputs[0])
    folded = fold_program(ep)
    lowered = fold_program(ep, lower_unfoldable=True)
    variants = {"unfolded": ep, "folded": folded.model, "folded + lowered": lowered.model}
    counts = {
        "batch_norms": batch_norm_nodes(ep),
        "folded": len(folded.report.folded),
        "skipped": len(folded.report.skipped),
        "lowered": len(lowered.report.lowered),
    }
    rows = {}
    for name, prog in variants.items():
        rows[name] = {}
        for profile, eps in (("fp16", None), ("htp", QNN_EPS)):
            t = time.perf_counter()
            sqnr, bad = _sqnr(emulate(prog, inputs, profile, bn_eps=eps))
            rows[name][f"{profile}{'' if eps is None else f'@{eps:g}'}"] = {
                "sqnr_db": sqnr,
                "non_finite": bad,
                "seconds": time.perf_counter() - t,
            }
            log(f"    {name:<17} {profile:<4} SQNR {sqnr if sqnr is None else round(sqnr, 1)} dB, non-finite {bad}")
    return {"counts": counts, "rows": rows}


def _cell(r: dict) -> str:
    sqnr = "NaN/inf" if r["sqnr_db"] is None else f"{r['sqnr_db']:.1f}"
    return f"{sqnr} ({r['non_finite']})"


def render(doc: dict) -> str:
    cols = list(next(iter(doc["rows"].values())))
    head = ["model"] + [f"{c} SQNR dB (non-finite)" for c in cols]
    body = []
    for name, row in doc["rows"].items():
        body.append([name] + [_cell(row[c]) for c in cols])
    return table(head, body)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", type=int, default=4)
    ap.add_argument("--quick", action="store_true", help="a DenseNet with blocks 2/2/2/2 at 32x32")
    ap.add_argument("--out", default=str(RESULTS / "local"))
    args = ap.parse_args(argv)
    quiet()
    torch.set_num_threads(1)
    blocks, size = ((2, 2, 2, 2), 32) if args.quick else ((6, 12, 24, 16), 64)
    log(f"  DenseNet blocks {blocks} at {size}x{size}, {args.batches} batches")
    doc = run(blocks, size, args.batches)
    c = doc["counts"]
    text = (
        f"### F. Lowering what cannot fold: DenseNet{'-121' if not args.quick else ' (small)'}-shaped, "
        f"{c['batch_norms']} BNs: {c['folded']} fold, {c['skipped']} stay; lowered: {c['lowered']}\n\n"
    )
    text += render(doc) + "\n"
    print(text)
    out = os.path.abspath(args.out)
    write_json("lowering", doc, out_dir=out)
    write_text("lowering.md", text, out_dir=out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
