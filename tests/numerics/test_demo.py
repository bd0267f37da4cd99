"""The demo end to end (quick subset), its checkpoint, and the training script."""

import json
import re
import subprocess
import sys
from pathlib import Path

import torch

from bnfold.demo import run_demo
from bnfold.demo.data import load_split
from bnfold.demo.run import CHECKPOINT, FLOAT32_DB, QUICK_SAMPLES, _wrap, load_model

ROOT = Path(__file__).resolve().parents[2]


def test_checkpoint_is_small_and_loads_safely():
    assert CHECKPOINT.stat().st_size < 300 * 1024
    model, meta = load_model()  # torch.load(weights_only=True)
    assert meta["test_samples"] == len(load_split()[3])
    assert sum(p.numel() for p in model.parameters()) < 60_000


def test_demo_quick_end_to_end(tmp_path, capsys):
    result = run_demo(out_dir=tmp_path, quick=True)
    printed = capsys.readouterr().out
    json.dumps(result)  # plain data

    # first the task: the text regions PP-OCRv4 det finds in ONNX Runtime fp16, unfolded and folded
    task = result["ocr_task"]
    runs = task["runs"]
    first = printed.splitlines()[0]
    assert first.startswith("PP-OCRv4 det on a rendered page: ")
    assert f"ORT fp16: {runs['fp16']['text_regions_found']} of 4 text regions" in first
    assert "folded: 4 of 4 text regions, same text as fp32" in first and runs["folded"]["same_text_as_fp32"]
    assert runs["fp32"]["text_regions_found"] == len(runs["fp32"]["regions"]) == 4
    assert runs["folded"]["texts"] == runs["fp32"]["texts"] and runs["folded"]["mask_iou_fp32"] > 0.98
    assert runs["fp16"]["mask_iou_fp32"] < 0.9 and not runs["fp16"]["same_text_as_fp32"]
    assert (
        task["emulated"]["fp16 unfolded"]["regions"] == []
        and task["emulated"]["fp16 folded"]["text_regions_found"] == 4
    )
    for text in runs["fp32"]["texts"]:
        assert f'"{text}"' in printed  # the lines rec reads are printed
    assert Path(task["picture"]).read_bytes()[:4] == b"\x89PNG" and Path(task["picture"]).parent == tmp_path
    rows = {r["model"]: r for r in result["rows"]}
    assert list(rows) == [
        "fp32",
        "fp16 unfolded",
        "fp16 folded",
        "htp unfolded",
        "htp folded",
        "htp eps=1e-09 unfolded",
        "htp eps=1e-09 folded",
    ]

    # the fp32 row is the eager model's accuracy on the same samples, computed here independently
    model, _ = load_model()
    _, _, x, y = load_split()
    with torch.no_grad():
        pred = model(x[:QUICK_SAMPLES]).argmax(1)
    assert rows["fp32"]["accuracy"] == (pred == y[:QUICK_SAMPLES]).double().mean().item()
    assert rows["fp32"]["agreement_with_fp32"] == 1.0
    assert rows["fp32"]["output_sqnr_db"] > 100

    for name, r in rows.items():
        assert 0.0 <= r["accuracy"] <= 1.0 and 0.0 <= r["agreement_with_fp32"] <= 1.0
        assert r["worst_layer"] and r["worst_layer_sqnr_db"] <= r["output_sqnr_db"] + 20
    # the verdict follows the measured rows
    unfolded = [rows["fp16 unfolded"], rows["htp unfolded"], rows["htp eps=1e-09 unfolded"]]
    clean = all(r["agreement_with_fp32"] == 1.0 and r["nan"] == 0 and r["inf"] == 0 for r in unfolded) and all(
        r["accuracy"] >= rows["fp32"]["accuracy"] for r in unfolded
    )
    assert result["problem"] == (not clean)
    assert ("no fp16 problem" in result["verdict"][0]) == all(
        r["agreement_with_fp32"] == 1.0 and r["nan"] == 0 and r["inf"] == 0 for r in unfolded[:2]
    )
    qnn = rows["htp eps=1e-09 unfolded"]
    qnn_breaks = qnn["agreement_with_fp32"] < 1.0 or qnn["nan"] or qnn["inf"]
    assert ("does not break either" in result["verdict"][1]) == (not qnn_breaks)
    assert "never sees a BatchNorm" in result["verdict"][2]
    for r in rows:
        assert r in printed
    # what it prints does not move with the CPU: SQNRs with their spread over batches, float32 noise as >120,
    # no region coordinates
    for name, r in rows.items():
        if r["output_sqnr_db"] > FLOAT32_DB:
            assert r["output_sqnr_cell"] == ">120" and f"{name}" in printed
        else:
            value, spread = r["output_sqnr_cell"].split(" ± ")
            assert float(value) == round(r["output_sqnr_db"], 1)
            assert float(spread) == round(max(r["output_sqnr_spread_db"], 0.1), 1)
        assert r["output_sqnr_cell"] + " dB" in printed
    assert not re.search(r"\[\d+,\d+ \d+x\d+\]", printed)
    gain = r"folding changes the output SQNR by [-+]\d+\.\d ± \d+\.\d dB under fp16"
    assert re.search(gain, " ".join(printed.split()))
    assert "kappa" in printed and "headroom" in printed

    doc = json.loads((tmp_path / "report.json").read_text())
    assert doc["samples"] == QUICK_SAMPLES and set(doc["audits"]) == {"fp32", "fp16", "htp", "htp-qnn"}
    assert doc["audits"]["htp-qnn"]["bn_eps"] == 1e-9
    assert [r["model"] for r in doc["rows"]] == list(rows)
    assert (tmp_path / "report_sqnr.png").read_bytes()[:4] == b"\x89PNG"


def test_wrapped_verdict_lines_never_split_a_value_from_its_spread():
    text = "folding changes the output SQNR by " + ", ".join(f"+{i}.5 ± 0.{i} dB under p{i}" for i in range(1, 9))
    lines = _wrap(text, "  ")
    assert all(len(line) <= 100 for line in lines) and len(lines) > 1
    assert " ".join(" ".join(lines).split()) == text
    assert all(not line.rstrip().endswith("±") and not line.lstrip().startswith("±") for line in lines)
    assert all(re.search(r"\d\.\d ± \d\.\d", line) or "±" not in line for line in lines)


def test_training_script_runs(tmp_path):
    out = tmp_path / "net.pt"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "train_demo.py"), "--epochs", "1", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=600,  # a hang's backstop only: 30 s at load 6 on two cores
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    ckpt = torch.load(out, weights_only=True)
    assert ckpt["meta"]["epochs"] == 1 and 0.0 <= ckpt["meta"]["test_accuracy"] <= 1.0
