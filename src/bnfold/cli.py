"""The ``bnfold`` command line: ``fold``, ``check``, ``audit``, ``demo``.

``main(argv=None) -> int`` returns the exit status: 0 ok, 1 ``check`` found
normalizations left, 2 bad input (unreadable, wrong-format or unsafe file,
bad arguments), 3 an internal error.  Errors are one line on stderr
(``bnfold: error: ...``); ``--debug`` adds the traceback.  torch, onnx and the
numerics are imported inside the commands, so ``--help`` does not load them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

from . import __version__
from .checks import check_model_path, refuse_training
from .errors import BnfoldError
from .io import files, models, one_line, quiet
from .kinds import LAYER_KINDS, NORM_KINDS

#: What ``--only`` may name: layer kinds (fold into these only) and normalization kinds (fold these only).
ONLY_KINDS = (*LAYER_KINDS, *NORM_KINDS)
EXIT_OK = 0
EXIT_SURVIVORS = 1
EXIT_ERROR = 2
EXIT_INTERNAL = 3
EXIT_PIPE = 141  # 128 + SIGPIPE: the reader went away (`bnfold check x.pt2 | head -1`)

#: Progress for long folds (on stderr): the first note after PROGRESS_DELAY seconds, then one every
#: PROGRESS_EVERY seconds (a line each when stderr is not a terminal, one updated line when it is).
PROGRESS_DELAY = 3.0
PROGRESS_EVERY = 10.0

PROFILES = ("fp16", "htp", "fp16-acc", "fp32")
DEFAULT_RANDOM_BATCHES = 8
FOLDABLE = "foldable: run bnfold fold"

TRUST_HELP = (
    "load a .pt2 even when the inspection finds pickled data, compiled code or "
    "expressions torch would evaluate. RISK: torch.export.load then unpickles "
    "with weights_only=False and evaluates strings from the file, so a crafted "
    "file runs arbitrary code as you. Only for files whose author you trust."
)

MAIN_EPILOG = """\
examples:
  bnfold fold model.pt2 -o model_folded.pt2 --report report.json
  bnfold fold model.onnx -o model_folded.onnx --only conv,linear
  bnfold check model_folded.pt2 other.onnx   # CI gate: exit 1 while something foldable is left
  bnfold check --strict model.pt2      # also fail on normalizations bnfold cannot fold
  bnfold audit model.pt2 --profile htp --random 16 --plot sqnr.png
  bnfold audit model.pt2 --inputs batches.npz --json > audit.json
  bnfold demo --out out

exit status: 0 ok, 1 `check` found normalizations left, 2 bad input (missing,
corrupted, wrong-format or unsafe file; a program exported in training mode;
bad arguments), 3 internal error.

untrusted .pt2 files: torch.export.load can run code hidden in a .pt2 (pickled
weights or sample inputs, symbolic-shape strings it evaluates, guard code,
names pasted into generated source, AOTInductor libraries). bnfold inspects
the archive first and refuses such files; --trust skips that inspection
(see `bnfold fold --help`).
"""

FOLD_EPILOG = """\
examples:
  bnfold fold model.pt2 -o folded.pt2
  bnfold fold model.onnx -o folded.onnx --report report.json --only conv
  bnfold fold model.pt2 --in-place --json
  bnfold fold model.pt2 -o folded.pt2 --exclude 'head.*' --exclude classifier

The output is written to a temporary file next to OUT and renamed over it, so
an error never leaves a partial file. The input is never overwritten without
--in-place, and an existing OUT is replaced only with --force. ONNX models
with external data are written with external data. A model whose
normalizations cannot be folded is written unchanged, with the reasons listed
and one line saying that nothing was folded. A program exported in training
mode is refused (exit 2): call model.eval() before torch.export.export. The
closing summary (folded, skipped, nodes removed, parameters and bytes saved,
time) goes to stderr.
"""

CHECK_EPILOG = """\
examples:
  bnfold check model.pt2 model.onnx     # exit 1 while something foldable is left
  bnfold check --strict model.pt2       # also exit 1 on normalizations bnfold cannot fold

Each normalization left is listed with why it is still there: "foldable: run
bnfold fold", or the reason bnfold cannot fold it.

exit status (the worst over all files): 0 when nothing foldable is left (and,
with --strict, no normalization at all), 1 when something is, 2 when a file
cannot be read or was exported in training mode.
"""

AUDIT_EPILOG = f"""\
examples:
  bnfold audit model.pt2                      # {DEFAULT_RANDOM_BATCHES} random batches, fp16 profile
  bnfold audit model.pt2 --profile htp --bn-eps 1e-9 --random 32 --plot sqnr.png
  bnfold audit model.pt2 --inputs batches.npz --json

--inputs FILE.npz holds one array per program input, named arr_0, arr_1, ... or
by input name, batch axis first: [N, *example_shape] is N batches, and
[N*B, ...] is split into batches of the example batch size B. It is read with
allow_pickle=False. --random N draws N batches shaped like the program's
example inputs from a fixed seed (--seed). An ONNX model is audited as the
same graph traced into a torch.export program (static shapes; a symbolic batch
dimension becomes 1), with its node names as layer names.

Per batch norm: kappa and |scale| at the model's eps and at --bn-eps (a runtime
that ignores the model's eps: ExecuTorch's QNN builder uses 1e-9), the fp16
headroom of everything the profile stores (input, x*scale, bias', sum), and a
verdict (safe / degrades by ~N dB / overflows) predicted from the statistics
next to what the emulated run measured. Per layer: SQNR against float64,
cumulative and local (the error the layer adds by itself), with NaN/inf shown
as counts and shares, never as an SQNR. It ends with what to do. A program
exported in training mode is refused (exit 2). Progress goes to stderr: a bar
on a terminal, a line every 10 s otherwise.
"""


# ----------------------------------------------------------------------------- parser


def _kinds(text: str) -> tuple[str, ...]:
    kinds = tuple(k.strip() for k in text.split(",") if k.strip())
    unknown = [k for k in kinds if k not in ONLY_KINDS]
    if unknown or not kinds:
        raise argparse.ArgumentTypeError(
            f"unknown kind(s) {', '.join(unknown) or repr(text)}; choose from {','.join(ONLY_KINDS)}"
        )
    return kinds


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a number >= 1, got {value}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive finite number, got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    raw = argparse.RawDescriptionHelpFormatter
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--json", action="store_true", default=argparse.SUPPRESS, help="print machine-readable JSON on stdout"
    )
    common.add_argument(
        "--debug", action="store_true", default=argparse.SUPPRESS, help="show tracebacks and library warnings"
    )
    loading = argparse.ArgumentParser(add_help=False)
    loading.add_argument("--trust", action="store_true", default=argparse.SUPPRESS, help=TRUST_HELP)
    loading.add_argument(
        "--max-bytes",
        type=_positive_int,
        metavar="N",
        default=argparse.SUPPRESS,
        help="most bytes the model file may unpack to (default: 16x its size, at least 256 MiB); see SECURITY.md",
    )
    loading.add_argument(
        "--max-work",
        type=_positive_int,
        metavar="N",
        default=argparse.SUPPRESS,
        help="most bytes running the model may hold at once (FLOPs: 256 N); default from its weights; see SECURITY.md",
    )

    parser = argparse.ArgumentParser(
        prog="bnfold",
        description="Fold BatchNorm into the conv / transposed conv / linear next to it in\n"
        "torch.export programs (.pt2) and ONNX models, and check the numerics.",
        epilog=MAIN_EPILOG,
        formatter_class=raw,
    )
    parser.add_argument("--version", action="version", version=f"bnfold {__version__}")
    parser.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    parser.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = sub.add_parser(
        "fold",
        parents=[common, loading],
        help="fold normalizations and write the folded model",
        description="Fold the normalizations of IN into their conv / transposed conv / linear and\n"
        "write OUT (.pt2 -> .pt2, .onnx -> .onnx); prints what was folded and skipped.",
        epilog=FOLD_EPILOG,
        formatter_class=raw,
    )
    p.add_argument("input", metavar="IN", help="a .pt2 (torch.export.save) or .onnx model")
    p.add_argument("-o", "--output", metavar="OUT", help="where to write the folded model (same format as IN)")
    p.add_argument("--report", metavar="FILE", help="also write the fold report as JSON to FILE")
    p.add_argument(
        "--only",
        metavar="KINDS",
        type=_kinds,
        help=f"fold only into these layer kinds and/or only these normalization kinds, comma-separated: "
        f"{','.join(ONLY_KINDS)}",
    )
    p.add_argument(
        "--exclude",
        metavar="PATTERNS",
        action="append",
        help="leave layers and normalizations whose module path (ONNX: node name) matches these "
        "comma-separated fnmatch patterns, e.g. 'head.*'; repeatable",
    )
    p.add_argument(
        "--lower-unfoldable",
        action="store_true",
        help="rewrite each batch norm that cannot fold as mul + add by constants computed with the model's eps "
        "(no backend can then apply its own eps)",
    )
    p.add_argument("--force", action="store_true", help="replace OUT if it exists")
    p.add_argument("--in-place", action="store_true", help="overwrite IN with the folded model (OUT defaults to IN)")
    p.set_defaults(func=cmd_fold)

    p = sub.add_parser(
        "check",
        parents=[common, loading],
        help="CI gate: fail while something foldable is left",
        description="List the normalizations left in each IN and why; exit 1 when one could be folded.",
        epilog=CHECK_EPILOG,
        formatter_class=raw,
    )
    p.add_argument("inputs", metavar="IN", nargs="+", help="a .pt2 or .onnx model (several are allowed)")
    p.add_argument("--strict", action="store_true", help="also fail on normalizations bnfold cannot fold")
    p.set_defaults(func=cmd_check)

    p = sub.add_parser(
        "audit",
        parents=[common, loading],
        help="measure the fp16 / HTP numerics of a program before and after folding",
        description="Run IN under a precision profile next to a float64 reference, unfolded and\n"
        "folded, and summarize the error per layer.",
        epilog=AUDIT_EPILOG,
        formatter_class=raw,
    )
    p.add_argument("input", metavar="IN", help="a .pt2 program or an .onnx model")
    p.add_argument("--profile", choices=PROFILES, default="fp16", help="precision profile (default: fp16)")
    p.add_argument(
        "--bn-eps", type=_positive_float, metavar="E", help="use eps E in every batch norm of the emulated runs"
    )
    src = p.add_mutually_exclusive_group()
    src.add_argument("--inputs", metavar="FILE.npz", help="input batches from an .npz file")
    src.add_argument(
        "--random",
        type=_positive_int,
        metavar="N",
        help=f"N random batches shaped like the example inputs (default: {DEFAULT_RANDOM_BATCHES})",
    )
    p.add_argument("--seed", type=int, default=0, help="seed for --random (default: 0)")
    p.add_argument("--plot", metavar="FILE.png", help="write the SQNR chart (whole model and worst layers) to FILE.png")
    p.set_defaults(func=cmd_audit)

    p = sub.add_parser(
        "demo",
        parents=[common],
        help="fold and audit the bundled demo network",
        description="Fold the bundled demo network, audit it under fp16 and write the results to DIR.",
        formatter_class=raw,
    )
    p.add_argument("--out", metavar="DIR", default=".", help="folder for the demo's files (default: .)")
    p.add_argument("--quick", action="store_true", help="a smaller, faster run")
    p.set_defaults(func=cmd_demo)
    return parser


# ----------------------------------------------------------------------------- commands


def _opt(args: argparse.Namespace, name: str) -> Any:
    return getattr(args, name, False)


def _finite(obj: Any) -> Any:
    """Strict JSON: non-finite floats become "inf" / "-inf" / "nan" (the numerics' convention)."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def _json_text(payload: Any) -> str:
    return json.dumps(_finite(payload), indent=2, default=str, allow_nan=False)


def _print_json(payload: Any) -> None:
    print(_json_text(payload))


def _fold(model: Any, only, debug: bool, exclude=None, label: str = "", lower_unfoldable: bool = False):
    from . import fold

    with quiet(not debug), _Heartbeat(f"folding {label}" if label else "folding"):
        return fold(model, only=only, exclude=exclude, lower_unfoldable=lower_unfoldable)


def _exclude(args: argparse.Namespace) -> tuple[str, ...]:
    """``--exclude`` values (repeatable, comma-separated) as one tuple of patterns."""
    return tuple(p.strip() for value in getattr(args, "exclude", None) or () for p in value.split(",") if p.strip())


class _Heartbeat:
    """Notes on stderr while a long step runs: nothing for ``PROGRESS_DELAY`` seconds, then the elapsed
    time every ``PROGRESS_EVERY`` seconds (one updated line on a terminal, a line each otherwise)."""

    def __init__(self, what: str):
        self.what = what
        self.stream = sys.stderr
        self.tty = _isatty(self.stream)
        self.done = threading.Event()
        self.wrote = False
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> _Heartbeat:
        self.start = time.monotonic()
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.done.set()
        self.thread.join()
        if self.wrote and self.tty:
            with contextlib.suppress(OSError, ValueError):
                self.stream.write("\n")
                self.stream.flush()

    def _run(self) -> None:
        wait = PROGRESS_DELAY
        while not self.done.wait(wait):
            elapsed = time.monotonic() - self.start
            text = f"bnfold: {self.what}... {elapsed:.0f} s"
            with contextlib.suppress(OSError, ValueError):
                self.stream.write(f"\r{text}" if self.tty else f"{text}\n")
                self.stream.flush()
            self.wrote = True
            wait = 1.0 if self.tty else PROGRESS_EVERY


def _isatty(stream: Any) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def _report_payload(input_path: str, output: str | None, report) -> dict[str, Any]:
    payload: dict[str, Any] = {"bnfold_version": __version__, "input": input_path}
    if output is not None:
        payload["output"] = output
    payload.update(report.to_dict())
    return payload


def cmd_fold(args: argparse.Namespace) -> int:
    from .io.output import check_outputs, plan_output

    debug = _opt(args, "debug")
    check_model_path(args.input)
    plan = plan_output(args.input, args.output, force=args.force, in_place=args.in_place)
    check_outputs({"output": plan.path, "report": args.report}, inputs=[args.input])
    if args.report:
        files.check_side_file(args.report, not_same_as=[args.input, plan.path], what="report", force=args.force)
    loaded = models.load_model(args.input, trust=_opt(args, "trust"), debug=debug, max_bytes=_opt(args, "max_bytes"))
    result = _fold(loaded.model, args.only, debug, _exclude(args), args.input, args.lower_unfoldable)
    refuse_training(loaded.model, args.input, result.report)
    payload = _report_payload(args.input, plan.path, result.report)
    texts = {args.report: _json_text(payload) + "\n"} if args.report else None
    models.save_model(result.model, plan, layout=loaded.layout, texts=texts, debug=debug)
    if _opt(args, "json"):
        _print_json(payload)
    else:
        print(result.report.table())
        if not result.report.folded and not result.report.lowered:
            print(f"nothing to fold in {args.input}: no normalization could be folded; wrote an unchanged copy")
        extra = f" (report: {args.report})" if args.report else ""
        print(f"wrote {plan.path}{extra}")
    sys.stdout.flush()
    print(f"bnfold: {result.report.summary_line()}", file=sys.stderr)
    return EXIT_OK


def survivors(report) -> list[dict[str, Any]]:
    """Normalizations still in a model, from a fold report of it: foldable ones and skipped ones."""
    out: list[dict[str, Any]] = []
    for f in report.folded:
        out.append(
            {
                "norm": f.norm,
                "node": f.node,
                "status": "foldable",
                "reason": FOLDABLE,
                "into": f.into,
                "into_node": f.into_node,
                "pattern": f.pattern,
            }
        )
    for s in report.skipped:
        out.append({"norm": s.norm, "node": s.node, "status": "skipped", "reason": s.reason, "producer": s.producer})
    return out


def _check_one(path: str, args: argparse.Namespace) -> dict[str, Any]:
    """One file's check: its survivors and its exit status (1 when it fails the gate)."""
    debug = _opt(args, "debug")
    check_model_path(path)
    loaded = models.load_model(path, trust=_opt(args, "trust"), debug=debug, max_bytes=_opt(args, "max_bytes"))
    report = _fold(loaded.model, None, debug, label=path).report
    refuse_training(loaded.model, path, report)
    left = survivors(report)
    foldable = sum(s["status"] == "foldable" for s in left)
    failed = foldable > 0 or (args.strict and bool(left))
    return {
        "input": path,
        "ok": not failed,
        "foldable": foldable,
        "unfoldable": len(left) - foldable,
        "survivors": left,
        "exit_code": EXIT_SURVIVORS if failed else EXIT_OK,
    }


def _check_lines(result: dict[str, Any], strict: bool) -> list[str]:
    """The text ``check`` prints for one file: a headline, then one line per normalization left."""
    path, left = result["input"], result["survivors"]
    if not left:
        return [f"{path}: ok, no normalization left"]
    n, foldable, unfoldable = len(left), result["foldable"], result["unfoldable"]
    plural = "s" if n != 1 else ""
    if foldable:
        head = f"{path}: {n} normalization{plural} left, {foldable} foldable"
    elif strict:
        head = f"{path}: {n} normalization{plural} left that bnfold cannot fold (failing: --strict)"
    else:
        head = f"{path}: ok, {unfoldable} normalization{plural} left that bnfold cannot fold"
    width = max(len(s["norm"]) for s in left)
    return [head] + [f"  {s['norm']:<{width}}  {s['reason']}" for s in left]


def cmd_check(args: argparse.Namespace) -> int:
    results = []
    for path in args.inputs:
        try:
            results.append(_check_one(path, args))
        except BnfoldError as e:
            if _opt(args, "debug"):
                import traceback

                traceback.print_exc()
            message = one_line(str(e))
            print(f"bnfold: error: {message}", file=sys.stderr)
            _print_hint(e)
            results.append({"input": path, "ok": False, "error": message, "exit_code": EXIT_ERROR})
            continue
        if not _opt(args, "json"):
            print("\n".join(_check_lines(results[-1], args.strict)), flush=True)
    code = max(r["exit_code"] for r in results)
    if _opt(args, "json"):
        _print_json({"bnfold_version": __version__, "ok": code == EXIT_OK, "strict": args.strict, "files": results})
    return code


class _Progress:
    """``progress(done, total)`` for ``bnfold.audit``: a tqdm bar on stderr (or a plain counter)."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.bar = None
        self.plain = False

    def __call__(self, done: int, total: int) -> None:
        if not self.enabled:
            return
        if self.bar is None and not self.plain:
            try:
                from tqdm import tqdm

                self.bar = tqdm(total=total, desc="audit", unit="batch", file=sys.stderr, leave=True)
            except ImportError:
                self.plain = True
        if self.bar is not None:
            self.bar.total = total
            self.bar.update(done - self.bar.n)
        else:
            end = "\n" if done >= total else ""
            print(f"\raudit: {done}/{total} batches", end=end, file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def cmd_audit(args: argparse.Namespace) -> int:
    from . import cli_inputs
    from .numerics.progress import Progress

    debug = _opt(args, "debug")
    from .io.output import check_outputs

    check_outputs({"plot": args.plot}, inputs=[args.input, args.inputs])
    if args.plot:
        files.check_side_file(args.plot, not_same_as=[args.input], what="plot")
    progress = Progress(enabled=True)
    try:
        progress.stage("load")
        ep = models.load_model(
            args.input, trust=_opt(args, "trust"), debug=debug, max_bytes=_opt(args, "max_bytes")
        ).model
        refuse_training(ep, args.input)
        if files.model_kind(args.input) == files.ONNX:
            from .numerics.onnx_program import onnx_program

            progress.stage("convert")
            try:
                with quiet(not debug):
                    ep = onnx_program(ep)
            except NotImplementedError as e:
                raise BnfoldError(f"{args.input}: cannot audit this ONNX model: {e}") from None
        if args.inputs:
            batches = cli_inputs.npz_batches(ep, args.inputs)
        else:
            batches = cli_inputs.random_batches(ep, args.random or DEFAULT_RANDOM_BATCHES, seed=args.seed)

        from .numerics import audit

        with quiet(not debug):
            report = audit(
                ep,
                batches,
                profile=args.profile,
                bn_eps=args.bn_eps,
                progress=progress,
                name=os.path.basename(args.input),
                random_inputs=not args.inputs,
            )
        if args.plot:
            progress.stage("plot")
            with quiet(not debug):
                report.plot(args.plot)  # written atomically
    finally:
        progress.close()
    if _opt(args, "json"):
        payload = {"bnfold_version": __version__, "input": args.input}
        if args.plot:
            payload["plot"] = args.plot
        payload.update(report.to_dict())
        _print_json(payload)
    else:
        print(report.table())
        if args.plot:
            print(f"wrote {args.plot}")
    return EXIT_OK


def cmd_demo(args: argparse.Namespace) -> int:
    try:
        from .demo import run_demo
    except ImportError as e:
        raise BnfoldError(f"the demo is not available in this installation ({e})") from None
    if os.path.exists(args.out) and not os.path.isdir(args.out):
        raise BnfoldError(f"{args.out}: not a folder; give a folder for the demo's files")
    with quiet(not _opt(args, "debug")):  # library warnings only with --debug, as for the other commands
        if _opt(args, "json"):
            with contextlib.redirect_stdout(sys.stderr):
                result = run_demo(out_dir=args.out, quick=args.quick)
            _print_json({"bnfold_version": __version__, **(result or {})})
        else:
            run_demo(out_dir=args.out, quick=args.quick)
    return EXIT_OK


# ----------------------------------------------------------------------------- entry point


def _fail(message: str, args: argparse.Namespace | None, code: int) -> int:
    message = one_line(message)
    if args is not None and _opt(args, "json"):
        _print_json({"error": message, "exit_code": code})
    print(f"bnfold: error: {message}", file=sys.stderr)
    return code


def _print_hint(err: BaseException) -> None:
    """The lines an error carries to show what to run (the export recipe for a .pth), indented, on stderr."""
    for line in getattr(err, "hint", ()):
        print(f"    {line}", file=sys.stderr)


def _stdout_gone() -> int:
    """The reader of stdout went away (``| head -1``): end quietly, and let nothing be flushed at exit."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    return EXIT_PIPE


def _run(args: argparse.Namespace) -> int:
    """The command, its output flushed (so that a closed pipe shows up here, not at exit)."""
    from .io.cost import max_work

    with max_work(getattr(args, "max_work", None)):
        code = args.func(args)
    sys.stdout.flush()
    return code


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help, --version, usage errors
        return e.code if isinstance(e.code, int) else (0 if e.code is None else EXIT_ERROR)
    debug = _opt(args, "debug")
    try:
        with quiet(not debug):  # library warnings only with --debug
            return _run(args)
    except BrokenPipeError:
        return _stdout_gone()
    except BnfoldError as e:
        if debug:
            import traceback

            traceback.print_exc()
        code = _fail(str(e), args, EXIT_ERROR)
        _print_hint(e)
        return code
    except KeyboardInterrupt:
        print("bnfold: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - any other failure is a bug: report it as one line, exit 3
        if debug:
            import traceback

            traceback.print_exc()
        detail = f": {one_line(e)}" if str(e).strip() else ""
        return _fail(
            f"internal error: {type(e).__name__}{detail} (rerun with --debug for the traceback)",
            args,
            EXIT_INTERNAL,
        )
