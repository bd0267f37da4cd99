"""How much slower than a float32 forward is the fp16 emulator?

    .venv/bin/python benchmarks/emulator_speed.py [--threads N] [--repeats N]

For each model and precision profile it times (best of ``--repeats``):

* ``fp32 fwd``    ``ExportedProgram.module()`` on the same batch, float32 (the baseline);
* ``emulated``    ``Emulator.run(..., reference=False)``: the program under the profile;
* ``+ref+errors`` ``Emulator.run(...)``: the emulated run plus the float64 reference run and
                  the error statistics of every intermediate tensor (what ``bnfold.audit`` uses);
* ``f64 fwd``     a float64 copy of the module: the floor under ``+ref+errors``.

Ratios are against ``fp32 fwd``.  Times are CPU time of this process
(``time.process_time``), which other processes on a shared machine disturb far
less than wall time; with ``--threads 1`` (the default) CPU time is the work
done.  The variants of one model are timed round-robin.  Prints a table;
asserts nothing.
"""

from __future__ import annotations

import argparse
import copy
import time

import torch
from torch import nn

from bnfold.demo.model import DigitNet
from bnfold.numerics import Emulator


def resnetish() -> nn.Module:
    def block(cin, cout, stride):
        return [nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU()]

    return nn.Sequential(
        *block(3, 32, 1),
        *block(32, 32, 1),
        *block(32, 64, 2),
        *block(64, 64, 1),
        *block(64, 128, 2),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(128, 10),
    )


def mlp() -> nn.Module:
    return nn.Sequential(
        nn.Linear(256, 1024),
        nn.BatchNorm1d(1024),
        nn.ReLU(),
        nn.Linear(1024, 1024),
        nn.BatchNorm1d(1024),
        nn.ReLU(),
        nn.Linear(1024, 10),
    )


MODELS = {
    "DigitNet b150 1x8x8": (DigitNet, (150, 1, 8, 8)),
    "ResNet-ish b16 3x32x32": (resnetish, (16, 3, 32, 32)),
    "MLP+BN1d b256 256": (mlp, (256, 256)),
}


def best_of(fns: dict, repeats: int) -> dict:
    """Best wall time of each function, timed round-robin."""
    for fn in fns.values():
        fn()  # warm up
    times = {k: float("inf") for k in fns}
    for _ in range(repeats):
        for k, fn in fns.items():
            t = time.process_time()
            fn()
            times[k] = min(times[k], time.process_time() - t)
    return times


def randomize_stats(model: nn.Module, shape) -> nn.Module:
    torch.manual_seed(0)
    model.train()
    with torch.no_grad():
        for _ in range(3):
            model(torch.randn(shape))
    return model.eval()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--profiles", default="fp16,htp,fp16-acc")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} thread(s), best of {args.repeats}; CPU ms, ratio to fp32 fwd")
    head = f"{'model':<24} {'profile':<9} {'fp32 fwd':>9} {'emulated':>15} {'+ref+errors':>15} {'f64 fwd':>15}"
    print(head)
    print("-" * len(head))
    for name, (build, shape) in MODELS.items():
        model = randomize_stats(build(), shape)
        x = torch.randn(shape)
        ep = torch.export.export(model, (x,))
        fwd = ep.module()
        m64 = copy.deepcopy(model).double()
        x64 = x.double()
        profiles = args.profiles.split(",")
        fns = {"fp32": lambda: fwd(x), "f64": lambda: m64(x64)}
        for prof in profiles:
            emu = Emulator(ep, prof)
            fns[prof] = lambda emu=emu: emu.run(x, reference=False)
            fns[prof + "+ref"] = lambda emu=emu: emu.run(x)
        with torch.no_grad():
            t = best_of(fns, args.repeats)
        t32, t64 = t["fp32"], t["f64"]
        for prof in profiles:
            te, tr = t[prof], t[prof + "+ref"]
            print(
                f"{name:<24} {prof:<9} {1e3 * t32:>9.1f} {1e3 * te:>8.1f} ({te / t32:>4.1f}x) "
                f"{1e3 * tr:>8.1f} ({tr / t32:>4.1f}x) {1e3 * t64:>8.1f} ({t64 / t32:>4.1f}x)"
            )


if __name__ == "__main__":
    main()
