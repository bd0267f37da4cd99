"""The library zoo's check: one torchvision / timm model (``library_models``) folded the way a user folds it, in the
default, decomposed and edge IR and in ONNX (dynamo export), each judged against the model's own deploy form.

Per model and IR, :func:`check_model` returns a :class:`Row`:

* the program is exported (``bnfold_testutil.export``; ONNX: ``reparam_onnx.onnx_export``) and saved, then folded
  through the CLI (``bnfold fold IN -o OUT --report R``, in this process, no ``--trust``); the report gives the
  folds, merges and the normalizations left;
* ``left``: the normalizations the fold report skipped (left in the folded file): BatchNorms, and the others
  (weight standardization, LayerNorm / GroupNorm / RMSNorm affines);
* ``keeps``: the BatchNorms the hand-made deploy form keeps: those of the model's own merge (timm's
  ``reparameterize_model``, or the model itself) that no hand-made conv+BN fusion removes
  (``library_models.hand_foldable``); no more BatchNorms may be left;
* ``keeps_other``: the affine normalizations (LayerNorm, GroupNorm, ...) of the same model whose affine no hand can
  fold into the layers that read their output (``affine_baseline.hand_foldable_affines``: e.g. ConvNeXt's stem
  LayerNorm, read by a zero-padded depthwise conv and the residual sum); no more other normalizations may be left;
  weight standardizations (``left_std``, counted in ``left``'s others) may not be left at all: each folds into the
  weight of its own conv;
* for a model with its own merge: the folded program's (conv, add, BatchNorm) counts equal those of its own merge,
  exported to the same IR and folded (``merge`` column); "add" counts every elementwise sum (``add``, ``add_``,
  ``sub``; ONNX ``Add``, ``Sub``);
* ``err``: the saved folded file run on the example input against the model in float64, over the output magnitude;
  it must stay within ``max(REL, 4 x the unfolded float32 model's own error)``;
* every IR folds as many normalizations as the model's other IRs (the report of an IR whose spelling of a
  normalization the fold does not read does not list it as left);
* ``bnfold check OUT`` (with ``--strict`` when the deploy form keeps nothing: ``keeps`` and ``keeps_other`` 0)
  and ``bnfold audit IN --random 1`` exit 0.  The edge program has no file format the CLI reads (``.pte`` is
  lowered code), so the edge IR is folded with ``bnfold.fold`` in memory and has no CLI columns.

Nothing here is specific to a model: the expectations come from the model's own merge and from hooks on its eager
run (both baselines).
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from reparam_onnx import onnx_export, run_onnx

from affine_baseline import hand_foldable_affines
from bnfold_testutil import export, reference, relative_error
from library_models import build, deploy_form, hand_foldable

IRS = ("default", "decomposed", "edge", "onnx")
REL = 1e-4  # float32 folds of deep random nets: the floor of the tolerance (the unfolded model's error can exceed it)


@dataclass
class Row:
    model: str
    ir: str
    folded: int = 0  #: normalizations folded (report entries with a kind)
    merged: int = 0  #: summed branches merged into one conv
    left_bn: int = 0  #: BatchNorms left in the folded program
    left_other: int = 0  #: other normalizations left (skipped entries that are no BatchNorm)
    left_std: int = 0  #: weight standardizations left (counted in left_other too)
    keeps: int = 0  #: BatchNorms the hand-made deploy form keeps
    keeps_other: int = 0  #: affine normalizations (LayerNorm, GroupNorm...) whose affine no hand can fold
    counts: dict = field(default_factory=dict)  #: conv / add / bn of the folded program
    own: dict | None = None  #: the same counts for the model's own merge, folded (None: it has none)
    err: float | None = None
    tol: float | None = None
    check: str = "-"  #: the CLI check's exit status ("-": not run)
    audit: str = "-"
    failures: list = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.failures

    def to_dict(self) -> dict:
        return {**asdict(self), "ok": self.ok}


def cli(*argv) -> tuple[int, str]:
    """``bnfold ARGV`` through ``bnfold.cli.main`` in this process: (exit status, stderr's last line)."""
    from bnfold.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(a) for a in argv])
    lines = [s for s in (err.getvalue() + out.getvalue()).splitlines() if s.strip()]
    return code, (lines[-1] if lines else "")


def fx_counts(program) -> dict:
    from bnfold.torch_export.ops import op_name

    names = [op_name(n.target) for n in program.graph.nodes if n.op == "call_function"]
    return {
        "conv": sum(n.startswith("conv") for n in names),
        "add": sum(n in ("add", "add_", "sub", "sub_") for n in names),
        "bn": sum("batch_norm" in n for n in names),
    }


def onnx_counts(model) -> dict:
    names = [n.op_type for n in model.graph.node]
    return {
        "conv": names.count("Conv"),
        "add": names.count("Add") + names.count("Sub"),
        "bn": names.count("BatchNormalization"),
    }


def _left(report: dict, folded, ir: str) -> tuple[int, int, int]:
    """(BatchNorms, other normalizations, weight standardizations among the others) the fold report skipped: a
    skipped node that is a batch norm op and does not normalize a constant is a BatchNorm; weight standardization
    (``constant_norm``: timm's ScaledStdConv2d computes it with a batch norm op) and LayerNorm / GroupNorm affines
    are the others."""
    from bnfold.torch_export.ops import op_name

    if ir == "onnx":
        ops = {n.name: "batch_norm" if n.op_type == "BatchNormalization" else n.op_type for n in folded.graph.node}
    else:
        ops = {n.name: op_name(n.target) for n in folded.graph.nodes if n.op == "call_function"}
    bn = sum("batch_norm" in ops.get(s["node"], "") and s["code"] != "constant_norm" for s in report["skipped"])
    std = sum(s["code"] == "constant_norm" for s in report["skipped"])
    return bn, len(report["skipped"]) - bn, std


def _program(model, x, ir: str, exported: dict):
    """``model`` in ``ir``; ``exported`` keeps each model's default export: the other IRs start from it."""
    if ir == "onnx":
        return onnx_export(model, x)
    if model not in exported:
        exported[model] = export(model, (x,))
    return export(model, (x,), ir, base=exported[model])


def _counts(program, ir: str) -> dict:
    return onnx_counts(program) if ir == "onnx" else fx_counts(program)


def _run(program, x: torch.Tensor, ir: str) -> torch.Tensor:
    if ir == "onnx":
        return run_onnx(program, x)[0]
    with torch.no_grad():
        return program.module()(x)


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:200] if text else ''}"


def _fold_file(program, ir: str, folder: Path, row: Row):
    """Save ``program``, fold it through the CLI, load the folded file; the report as a dict."""
    import onnx

    suffix = ".onnx" if ir == "onnx" else ".pt2"
    src, out, rep = folder / f"{ir}{suffix}", folder / f"{ir}_folded{suffix}", folder / f"{ir}_report.json"
    if ir == "onnx":
        onnx.save(program, src)
    else:
        torch.export.save(program, str(src))
    code, last = cli("fold", src, "-o", out, "--report", rep, "-q", "--force")
    if code:
        raise RuntimeError(f"bnfold fold exit {code}: {last}")
    folded = onnx.load(str(out)) if ir == "onnx" else torch.export.load(str(out))
    return src, out, folded, json.loads(rep.read_text())


def check_ir(
    name: str,
    model,
    x,
    ref,
    plain_err: float,
    deploy,
    keeps: tuple[int, int],
    ir: str,
    folder: Path,
    cli_checks=True,
    exported: dict | None = None,
):
    """One IR's row; ``keeps``: (BatchNorms, other normalizations) the hand-made deploy form keeps; ``exported``:
    the default exports of ``model`` and ``deploy`` made for an earlier row, by module (filled here)."""
    exported = {} if exported is None else exported
    import bnfold

    row = Row(name, ir, keeps=keeps[0], keeps_other=keeps[1])
    t0 = time.perf_counter()
    try:
        program = _program(model, x, ir, exported)
        if ir == "edge":  # no file format the CLI reads: the API, in memory
            result = bnfold.fold(program)
            folded, report = result.model, result.report.to_dict()
            src = out = None
        else:
            src, out, folded, report = _fold_file(program, ir, folder, row)
        del program
        row.folded = sum(1 for f in report["folded"] if f.get("kind"))
        row.merged = len(report["merged"])
        row.counts = _counts(folded, ir)
        row.left_bn, row.left_other, row.left_std = _left(report, folded, ir)
        row.err = relative_error(_run(folded, x, ir), ref)
        row.tol = max(REL, 4 * plain_err)
        del folded
        if deploy is not None:
            row.own = _counts(bnfold.fold(_program(deploy, x, ir, exported)).model, ir)
        if cli_checks and src is not None:
            strict = ("--strict",) if keeps == (0, 0) else ()
            code, last = cli("check", *strict, out, "-q")
            row.check = f"{code}" + (" strict" if strict else "")
            if code:
                row.failures.append(f"check{' --strict' if strict else ''} exit {code}: {last}")
            code, last = cli("audit", src, "--random", "1", "-q")
            row.audit = str(code)
            if code:
                row.failures.append(f"audit exit {code}: {last}")
    except Exception as e:  # the row says what broke; the zoo goes on
        row.failures.append(_first_line(e))
    row.failures[:0] = judge(row)
    row.seconds = time.perf_counter() - t0
    return row


def judge(row: Row) -> list[str]:
    """What fails the pass criteria of the module docstring (the CLI's failures are added where they ran)."""
    out = []
    if not row.counts:
        return out
    if row.left_bn > row.keeps:
        out.append(f"{row.left_bn} BatchNorms left, the hand-made deploy form keeps {row.keeps}")
    if row.left_std:
        out.append(f"{row.left_std} weight standardizations left")
    if row.left_other - row.left_std > row.keeps_other:
        out.append(
            f"{row.left_other - row.left_std} other normalizations left, the hand-made deploy form keeps "
            f"{row.keeps_other}"
        )
    if row.own is not None and row.counts != row.own:
        diff = ", ".join(f"{k} {row.counts[k]} (own {row.own[k]})" for k in row.counts if row.counts[k] != row.own[k])
        out.append(f"not its own merge: {diff}")
    if row.err is not None and not row.err <= row.tol:
        out.append(f"error {row.err:.2g} over the tolerance {row.tol:.2g}")
    return out


def fewer_folds(folded: dict[str, int]) -> dict[str, str]:
    """IR -> why it fails, for the IRs that fold fewer normalizations than another IR of the same model: a
    normalization the fold does not recognise in one spelling is not in its report (as ONNX's GroupNorm,
    InstanceNormalization + Mul + Add, was not before it became a row), so only the other IRs show that it is
    there."""
    if not folded:
        return {}
    best = max(folded, key=folded.get)
    return {
        ir: f"folds {n} normalizations, {folded[best] - n} fewer than the {best} IR"
        for ir, n in folded.items()
        if n < folded[best]
    }


def check_model(name: str, folder: Path, irs=IRS, cli_checks: bool = True) -> list[Row]:
    """Every row of one model (see the module docstring); ``folder`` holds its files."""
    folder.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    try:
        model, x = build(name)
        ref = reference(model, x)
        with torch.no_grad():
            plain_err = relative_error(model(x), ref)
        deploy = deploy_form(model)
        own = deploy if deploy is not None else copy.deepcopy(model)
        total, fused = hand_foldable(own, x)
        norms, folded = hand_foldable_affines(own, x)
    except Exception as e:
        return [Row(name, ir, failures=[f"build: {_first_line(e)}"], seconds=time.perf_counter() - t0) for ir in irs]
    keeps = (total - fused, norms - folded)
    exported: dict = {}  # each module's default export, which the other IRs start from
    rows = [check_ir(name, model, x, ref, plain_err, deploy, keeps, ir, folder, cli_checks, exported) for ir in irs]
    fewer = fewer_folds({r.ir: r.folded for r in rows if r.counts})
    for r in rows:
        if r.ir in fewer:
            r.failures.append(fewer[r.ir])
    rows[0].seconds += time.perf_counter() - t0 - sum(r.seconds for r in rows)  # the build, charged to the first
    return rows
