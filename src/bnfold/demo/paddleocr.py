"""The demo's second part: trained PaddleOCR models under ``htp`` at QNN's eps (1e-9), unfolded and folded.

The rapidocr wheels (installed by ``make install`` / ``make demo``) ship the trained models; only their
``.onnx`` files are used.  Each model is audited through the ONNX path (the model and the ONNX that
``bnfold fold`` writes, each emulated) under ``fp16`` at the model's eps and under ``htp`` with the
eps ExecuTorch's QNN batch-norm builder applies, on inputs drawn uniformly from [-1, 1] (the range
PaddleOCR normalizes images to).  Every number printed is measured by the run; when nothing breaks
the demo says so and shows the margin.
"""

from __future__ import annotations

import importlib.util
import math
import os

import torch

from ..numerics.errors import json_float
from ..numerics.risk import QNN_EPS
from ..numerics.table import db, sci, sqnr

#: (label, package, file, input shape, quick input shape)
MODELS = (
    ("PP-OCRv6 rec", "rapidocr", "PP-OCRv6_rec_small.onnx", (1, 3, 48, 160), (1, 3, 48, 64)),
    ("PP-OCRv4 det", "rapidocr_onnxruntime", "ch_PP-OCRv4_det_infer.onnx", (1, 3, 160, 160), None),
)
AUDITS = (("fp16", None), ("htp", QNN_EPS))


def model_file(package: str, name: str) -> str | None:
    """The installed model file, or None (found through the package folder; the package is not imported)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = os.path.join(list(spec.submodule_search_locations)[0], "models", name)
    return path if os.path.exists(path) else None


def _label(profile: str, eps) -> str:
    return profile if eps is None else f"{profile} eps={eps:g}"


def _worst_norm(rep):
    """The batch norm the verdict should name: NaN input / overflow first, then the largest loss."""
    order = {"input NaN": 0, "overflows": 1, "degrades": 2, "safe": 3}
    return min(rep.norms, key=lambda n: (order.get(n.verdict, 4), -(n.risk.loss_db if n.risk else 0)), default=None)


def audit_model(label: str, path: str, shape: tuple, seed: int = 0) -> dict:
    import onnx

    from ..numerics import audit

    model = onnx.load(path)
    g = torch.Generator().manual_seed(seed)
    batch = (torch.rand(shape, generator=g) * 2 - 1,)
    out = {"model": label, "file": os.path.basename(path), "shape": list(shape), "audits": {}}
    for profile, eps in AUDITS:
        rep = audit(model, [batch], profile=profile, bn_eps=eps, name=label, random_inputs=True)
        w = _worst_norm(rep)
        out["audits"][_label(profile, eps)] = {
            "report": rep,
            "unfolded": rep.unfolded.output,
            "folded": rep.folded.output,
            "norms": len(rep.norms),
            "verdicts": {v: sum(n.verdict == v for n in rep.norms) for v in ("input NaN", "overflows", "degrades")},
            "worst": w,
            "min_headroom": min((n.headroom for n in rep.norms if not math.isnan(n.headroom)), default=math.inf),
        }
    return out


def _breaks(a: dict) -> bool:
    return bool(a["unfolded"].nonfinite or any(a["verdicts"].values()))


def lines_for(result: dict) -> list[str]:
    out = [f"  {result['model']} ({result['file']}, input {'x'.join(map(str, result['shape']))}, random in [-1, 1])"]
    out.append(f"    {'profile':<16} {'unfolded SQNR':>14} {'folded SQNR':>12}   worst batch norm (unfolded)")
    for key, a in result["audits"].items():
        w = a["worst"]
        worst = "-"
        if w is not None:
            loss = w.risk.loss_db if w.risk is not None else math.nan
            worst = f"{w.name}: {w.verdict}, local loss {db(loss)} dB, headroom {sci(w.headroom)}x"
        out.append(f"    {key:<16} {sqnr(a['unfolded']) + ' dB':>14} {sqnr(a['folded']) + ' dB':>12}   {worst}")
    for key, a in result["audits"].items():
        out.append(f"    -> {key}: {_verdict(a)}")
    return out


#: an end-to-end output SQNR below this is a broken output (the signal is lost in the error)
BROKEN_DB = 10.0


def _verdict(a: dict) -> str:
    """What the audit measured, in words that match its numbers."""
    u, f, w, n = a["unfolded"], a["folded"], a["worst"], a["norms"]
    ends = f"output unfolded {sqnr(u)} dB, folded (the ONNX bnfold writes) {sqnr(f)} dB"
    if u.nonfinite or (math.isfinite(u.sqnr_db) and u.sqnr_db < BROKEN_DB):
        why = f" at {w.name} ({w.verdict}: {w.risk.detail})" if w is not None and w.risk is not None else ""
        return f"the unfolded model breaks{why}; {ends}."
    bad = {v: c for v, c in a["verdicts"].items() if c}
    if bad:
        counts = ", ".join(f"{c} {v}" for v, c in bad.items())
        return f"{counts} of {n} batch norms ({w.name}: {w.risk.detail}); the output survives: {ends}."
    margin = f"smallest overflow headroom {sci(a['min_headroom'])}x"
    return f"nothing breaks: all {n} batch norms safe; margin: {margin}; {ends}."


def run(quick: bool = False) -> tuple[list[str], list[dict]]:
    """Audit the installed PaddleOCR models; the printed lines and the numbers (plain data)."""
    lines = [f"trained PaddleOCR models (rapidocr wheels) under fp16 and under htp at QNN's eps {QNN_EPS:g}:"]
    results = []
    for label, package, name, shape, quick_shape in MODELS:
        if quick and quick_shape is None:
            continue
        path = model_file(package, name)
        if path is None:
            lines.append(f"  {label}: not installed ({package}; `make install` installs it)")
            continue
        r = audit_model(label, path, quick_shape if quick else shape)
        lines += lines_for(r)
        results.append(r)
    return lines, [_plain(r) for r in results]


def _plain(r: dict) -> dict:
    audits = {}
    for key, a in r["audits"].items():
        w = a["worst"]
        audits[key] = {
            "unfolded_sqnr_db": json_float(a["unfolded"].sqnr_db),
            "folded_sqnr_db": json_float(a["folded"].sqnr_db),
            "unfolded_nonfinite": a["unfolded"].nonfinite,
            "folded_nonfinite": a["folded"].nonfinite,
            "norms": a["norms"],
            "verdicts": a["verdicts"],
            "breaks": _breaks(a),
            "min_headroom": json_float(a["min_headroom"]),
            "worst_norm": None if w is None else {"name": w.name, "verdict": w.verdict, "detail": w.risk.detail},
        }
    return {"model": r["model"], "file": r["file"], "shape": r["shape"], "audits": audits}
