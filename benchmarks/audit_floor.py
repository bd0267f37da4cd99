"""Where the audit's op loop stands against its floor (issue 43: the audit at the cost of two forwards).

    .venv/bin/python benchmarks/audit_floor.py [--rounds 5] [--only resnet,cls] [--profile fp16]

Per model (the part-B networks as torch program and ONNX, and the rapidocr models, as ``audit_ratio.py`` builds
them; one torch thread; the least process CPU time over ``--rounds`` rounds, the calls interleaved, in ms and as
multiples of the fp32 forward):

* ``fwd``      the fp32 forward (``ep.module()(x)``; ONNX: ``OnnxEmulator(model, "fp32").run(x, reference=False)``);
* ``set-up``   the unfolded program built (``Frontend.numerics().program``) and its ``Runner`` made (constants
               rounded, the frees, the fusion plan): paid once per program, not per batch;
* ``run``      ``Runner.run`` of the unfolded program on one batch, as the audit's table runs it: emulated and
               reference, the values the rows read measured, the run-time size check before each op, by the
               interpreter (``compile_after = None``);
* ``generated`` the same run as the code :mod:`bnfold.numerics.compiled` generates for it (what the audit runs from
               a program's second batch on; compiled before the timing);
* ``straight`` the same step callables run in a plain loop with the profile's storage rounding after each op that
               rounds (``Step.rounding``), values freed at last use, no check and no measurement: the emulated run
               and the reference run (the floor a generated runner over these callables reaches, two forwards at best);
* ``gap``      ``run - straight``: what the interpreter (per-step dispatch, the size checks, the measurements the rows
               read) adds on this program;
* ``unmeasured`` ``Runner.run`` (interpreted) with no value measured (``measured=set()``; the batch-norm probes,
               which the report reads, still run): ``run - unmeasured`` is the rows' measurements;
* ``emulated``   ``Runner.run(x, reference=False)`` (interpreted): the emulated run alone (no reference, no probe,
               no measurement): ``emulated - straight emu`` is the interpreter's own cost on the emulated run;
* ``planned``    the audit's cost plan of the model (``AuditFormat.plan``, three runs of one batch), then ``set-up``:
               the per-model work before the unfolded program's first batch, as the audit does it.

``--base DIR``: ``planned`` and ``run`` also with another copy of the package (``DIR/bnfold``, imported as
``bnfold_base``, see ``audit_ratio.py``), interleaved in the same rounds: columns ``base planned``, ``base run``.

A benchmark, not a test: nothing asserts on a time.  The straight loop is not the profile's semantics (no fp16
accumulation, ORT fusion, float32 islands or host batch norm; under ``fp16`` none of these applies): it is a lower
bound to compare with, never a result.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch
from audit_ratio import _min_times, forward_of, load_base, markdown, suite

import bnfold
from bnfold.numerics.runner import DEFAULT_ROUNDING, Runner, round_floats


def _straight(runner: Runner, xs: tuple, emulated: bool) -> list:
    """``runner``'s program in a plain loop: the emulated run (rounded constants, inputs and outputs) or the
    reference run (see the module docstring)."""
    prog, dead = runner.program, runner._free_after
    dtype = torch.float32 if emulated else runner._ref_dtype
    env = dict(runner._const_e if emulated else runner._const_r)
    for name, x in zip(prog.inputs, prog.feed(xs)):
        env[name] = (runner.profile.round(x.float()) if emulated else x.to(dtype)) if x.is_floating_point() else x
    for i, step in enumerate(prog.steps):
        out = step.run([env[v] if v else None for v in step.ins], dtype)
        if emulated and step.rounding == DEFAULT_ROUNDING and runner.profile.fp16_storage:
            out = [round_floats(o) for o in out]
        env.update((k, o) for k, o in zip(step.outs, out) if k)
        for v in dead.get(i, ()):
            env.pop(v, None)
    return [env[o] for o in prog.outputs]


def _setup(package, model, profile: str, x: torch.Tensor | None = None):
    """``setup()`` of ``package`` (a copy of bnfold): the unfolded program built and its ``Runner`` made (``x``: the
    audit's cost plan of one batch first), as the audit's table measures it."""
    from importlib import import_module

    fe = import_module(f"{package.__name__}.frontends").frontend_for(model)
    numerics = import_module(f"{package.__name__}.numerics.rows")
    runner_of = import_module(f"{package.__name__}.numerics.runner")
    hold = import_module(f"{package.__name__}.numerics.audit_memory").AuditHold

    def setup():
        fmt = fe.numerics()
        if x is not None:
            ref = runner_of.reference_dtype(runner_of.get_profile(profile))
            fmt.plan(model, [(x,)], runs=3, name=None, hold=hold.of(3, ref, False))
        prog = fmt.program(model)
        outs = {r.output for r in numerics.rows(numerics.Graph(prog), None, None)}
        return runner_of.Runner(prog, profile, measured=outs)

    return setup


def _row(label: str, model, x: torch.Tensor, rounds: int, profile: str, base=None) -> list:
    forward = forward_of(model, x)
    setup = _setup(bnfold, model, profile)
    runner = setup()
    runner.compile_after = None
    gen = Runner(runner.program, profile, measured=runner.measured)
    gen.compile_after = 0
    bare = Runner(runner.program, profile, measured=set())
    bare.compile_after = None
    calls = [
        forward,
        setup,
        lambda: runner.run(x),
        lambda: gen.run(x),
        lambda: _straight(runner, (x,), True),
        lambda: _straight(runner, (x,), False),
        lambda: bare.run(x),
        lambda: bare.run(x, reference=False),
        _setup(bnfold, model, profile, x),
    ]
    if base is not None:
        theirs = _setup(base, model, profile)()
        theirs.compile_after = None
        calls += [_setup(base, model, profile, x), lambda: theirs.run(x)]
    with torch.no_grad():
        found = _min_times(calls, rounds)
    fwd, built, run, generated, emu, ref, unmeasured, emulated, planned = found[:9]
    cells = [
        f"{t * 1e3:.2f} ({t / fwd:.1f}x)"
        for t in (built, run, generated, emu, ref, emu + ref, run - emu - ref, unmeasured, emulated, *found[8:])
    ]
    return [label, str(len(runner.program.steps)), f"{fwd * 1e3:.2f}", *cells]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--profile", default="fp16")
    p.add_argument("--only", default="", help="comma-separated model keys (resnet, efficientnet, audio, cls, ...)")
    p.add_argument("--base", default="", help="a directory holding another copy of bnfold, timed beside this one")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    base = load_base(args.base) if args.base else None
    only = set(filter(None, args.only.split(",")))
    out = [_row(label, model, x, args.rounds, args.profile, base) for label, model, x in suite(only)]
    head = [
        "model",
        "steps",
        "fwd ms",
        "set-up",
        "run",
        "generated",
        "straight emu",
        "straight ref",
        "straight",
        "gap",
        "unmeasured",
        "emulated",
        "planned",
    ] + (["base planned", "base run"] if base is not None else [])
    markdown(head, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
