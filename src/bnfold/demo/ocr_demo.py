"""The demo's first part: the failure on the task.  A rendered page (four lines of text), PP-OCRv4 det and rec
(the trained models of the rapidocr wheel) in fp32 ONNX Runtime and in ONNX Runtime on the float16 model
ONNX Runtime users convert to, unfolded and folded; the regions each run finds and the text it reads in
each, side by side, and a picture of the page with the regions in three panels.

Each column runs the whole pipeline in its runtime (det, then rec on the regions det found).  Only counts and
text are printed, and the text-mask IoU with two digits (the regions' coordinates are in the JSON and the
picture): they do not move with the host's float32 kernels.  bnfold's emulator profiles are run on the same
page to show that they predict these runs: ``ort-cpu`` (ONNX Runtime's float16 model) and ``fp16`` (PyTorch
half on CPU), unfolded and folded.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

from .ctc import characters
from .ocr_runners import folded_model, runner
from .ocr_task import MODELS, Detection, detect, load_model, read_regions
from .pages import render_page

PAGE_SEED = 0
#: (key, title, how, folded)
RUNS = (
    ("fp32", "fp32 ONNX Runtime", "fp32", False),
    ("fp16", "ORT fp16", "ort-fp16", False),
    ("folded", "ORT fp16 folded", "ort-fp16", True),
)
#: the emulator profiles shown next to the runs they stand for
PROFILES = (("ort-cpu", "ORT fp16"), ("fp16", "PyTorch half"))
TEXT_WIDTH = 30


def _count(d: Detection) -> str:
    """``k of n text regions`` (matched at IoU >= 0.5), and the other regions found."""
    extra = len(d.regions) - d.truth.matched
    return f"{d.truth.matched} of {d.truth.truth} text regions" + (f" (+{extra} other)" if extra else "")


def _same_text(runs: dict, key: str) -> bool:
    """Exactly fp32's regions (one to one at IoU >= 0.5, nothing else), each read as fp32 reads it."""
    d, ref = runs[key]["det"], runs["fp32"]["det"]
    m = d.fp32
    if m is None or not ref.regions or m.matched != m.truth or m.found != m.truth:
        return False
    return all(runs[key]["text"][j] == runs["fp32"]["text"][i] for i, j, _ in m.pairs)


def headline(runs: dict) -> str:
    """The task number: how many text regions the fp16 runtime finds, unfolded and folded."""
    parts = []
    for key, label in (("fp16", "ORT fp16"), ("folded", "folded")):
        text = f"{label}: {_count(runs[key]['det'])}"
        parts.append(text + (", same text as fp32" if _same_text(runs, key) else ""))
    return f"PP-OCRv4 det on a rendered page: {'; '.join(parts)} (fp32: {_count(runs['fp32']['det'])})."


def _cell(texts: list[str], j: int | None) -> str:
    """What a run reads in its region ``j`` (quoted), or that it found no region there.  No coordinates: a
    region's edge moves by a pixel with the host's float32 kernels where the map is near the threshold."""
    if j is None:
        return "(not found)"
    t = texts[j]
    return '"' + (t if len(t) <= TEXT_WIDTH - 2 else t[: TEXT_WIDTH - 5] + "...") + '"'


def side_by_side(page, runs: dict) -> list[str]:
    """One row per text line (what each run reads in the region matched to it), then the other regions
    (matched to no text line at IoU >= 0.5) and what each reads."""
    keys = [k for k, _, _, _ in RUNS]
    titles = {k: t for k, t, _, _ in RUNS}
    w = TEXT_WIDTH + 2
    out = [f"    {'text line (rendered)':<26}" + "".join(f"{titles[k]:<{w}}" for k in keys)]
    for i, truth in enumerate(page.texts):
        cells = [_cell(runs[k]["text"], runs[k]["det"].truth.partner(i)) for k in keys]
        t = truth if len(truth) <= 24 else truth[:21] + "..."
        out.append(f"    {t:<26}" + "".join(f"{c:<{w}}" for c in cells))
    for k in keys:
        d = runs[k]["det"]
        matched = {j for _, j, _ in d.truth.pairs}
        for j in range(len(d.regions)):
            if j not in matched:
                out.append(f"    {titles[k] + ', other region':<26}reads {_cell(runs[k]['text'], j)}")
    return [line.rstrip() for line in out]


def run(out_dir: Path) -> tuple[list[str], dict]:
    """Run the OCR task demo; the printed lines and the numbers (plain data).  Writes ``ocr_regions.png``."""
    page = render_page(PAGE_SEED)
    det_model, rec_model = load_model("v4-det"), load_model("v4-rec")
    det_folded, rec_folded = folded_model(det_model), folded_model(rec_model)
    table = characters(rec_model)
    runs: dict = {}
    for key, _, how, fold in RUNS:
        det = detect(
            runner(det_folded if fold else det_model, how),
            page,
            None if key == "fp32" else runs["fp32"]["det"].regions,
        )
        text = read_regions(runner(rec_folded if fold else rec_model, how), table, page, det.regions)
        runs[key] = {"det": det, "text": text}
    emulated = {}
    for profile, _ in PROFILES:
        for fold in (False, True):
            d = detect(runner(det_folded if fold else det_model, profile), page, runs["fp32"]["det"].regions)
            emulated[(profile, fold)] = d
    png = Path(out_dir) / "ocr_regions.png"
    from .ocr_picture import draw_panels

    draw_panels(page, [(t, runs[k]["det"]) for k, t, _, _ in RUNS], png)
    h, w = page.image.shape[:2]
    about = (
        f"the page: {len(page.texts)} lines of DejaVu Sans rendered at {w}x{h} (seed {PAGE_SEED}); det "
        f"{MODELS['v4-det'][2]}, rec {MODELS['v4-rec'][2]}; ORT fp16 is ONNX Runtime on the model "
        "onnxconverter-common's convert_float_to_float16(keep_io_types=True) writes; folded: the ONNX "
        "`bnfold fold` writes, converted the same way. Regions match at IoU >= 0.5."
    )
    lines = [
        headline(runs),
        *textwrap.wrap(about, 100, initial_indent="  ", subsequent_indent="    "),
        "",
        *side_by_side(page, runs),
        "",
        "  text mask (probability > 0.3) IoU with fp32: "
        + ", ".join(f"{t} {runs[k]['det'].mask_iou(runs['fp32']['det']):.2f}" for k, t, _, _ in RUNS[1:]),
    ]
    for profile, stands in PROFILES:
        u, f = emulated[(profile, False)], emulated[(profile, True)]
        lines.append(
            f"  bnfold's {profile} profile (emulates {stands}) on this page: unfolded {_count(u)}, folded {_count(f)}"
        )
    lines.append(f"  wrote {png}")
    return lines, _plain(page, runs, emulated, png)


def _det_plain(d: Detection) -> dict:
    return {
        "regions": [[round(float(v), 1) for v in r.box] for r in d.regions],
        "text_regions_found": d.truth.matched,
        "text_regions": d.truth.truth,
        "fp32_regions_found": None if d.fp32 is None else d.fp32.matched,
    }


def _plain(page, runs: dict, emulated: dict, png: Path) -> dict:
    out = {
        "page": {"seed": PAGE_SEED, "texts": page.texts, "boxes": page.boxes.tolist()},
        "runs": {},
        "emulated": {},
        "picture": str(png),
    }
    for key, _, _, _ in RUNS:
        d = runs[key]["det"]
        out["runs"][key] = dict(
            _det_plain(d),
            texts=runs[key]["text"],
            same_text_as_fp32=_same_text(runs, key) if key != "fp32" else True,
            mask_iou_fp32=d.mask_iou(runs["fp32"]["det"]),
        )
    for (profile, fold), d in emulated.items():
        out["emulated"][f"{profile} {'folded' if fold else 'unfolded'}"] = _det_plain(d)
    return out
