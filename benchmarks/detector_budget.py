"""Issue 43, "a budget that scales with what the user asked for": does a VGG16-BN U-Net text detector audit without
``--max-work`` at 3x1024x1024, and how close is the audit's plan to what it holds?

    .venv/bin/python benchmarks/detector_budget.py [--sides 256x512,1024x1024] [--batches 1,3]
        [--run 512x512,1024x1024] [--formats pt2,onnx] [--ppocr 960x960]

The detector of the issue (a trained one from a registry wheel, 83 MB of weights: 20.8M parameters) cannot be
downloaded here; its architecture is built from torchvision's ``vgg16_bn`` class with random weights (the budget
does not read the weights' values): the VGG16-BN trunk cut into four stages, a dilated 3x3 conv to 1024 channels
and a 1x1 conv after the last, four upsampling blocks (concat with a stage's features, 1x1 conv + BN + ReLU, 3x3
conv + BN + ReLU) and a head of five convs to two maps (region and affinity scores, at half the input's side).  Its
batch norms are calibrated on random inputs, then it is exported as a ``.pt2`` program and as ONNX (TorchScript
exporter, opset 17) with a static 1x3xHxW input.

For each side and batch count it prints the audit's plan (``bnfold.numerics.audit_memory``, what ``bnfold audit``
checks before anything runs, counted as its default holds: the fp16 profile's float32 reference, no local runs):
the bytes it plans to hold at once against the byte budget, and the FLOPs of its runs against the FLOPs budget, on
inputs the user chose (``--inputs X.npz``, tensors, ``--input-shape``) and on batches shaped like the file's own
input (``--random``).  ``--run SIDES`` also runs ``bnfold audit FILE --input-shape x:1,3,H,W --random 1 -q`` (one
batch, a fresh process) on the ``.pt2`` exported at that side and on the ONNX exported with open sides
(``--formats``), and prints its exit code, peak RSS and the plan's peak; ``--ppocr SIDE`` the same for rapidocr's
PP-OCRv4 det (ONNX, open sides).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

import torch
from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(os.path.dirname(HERE), "tests")]
from common import load_now, log, table  # noqa: E402
from models import calibrate  # noqa: E402

from library_models import import_torchvision  # noqa: E402


def _block(cin: int, mid: int, cout: int) -> nn.Sequential:
    """An upsampling block: the concatenated features to ``mid`` channels (1x1), then ``cout`` (3x3)."""
    return nn.Sequential(
        nn.Conv2d(cin, mid, 1),
        nn.BatchNorm2d(mid),
        nn.ReLU(),
        nn.Conv2d(mid, cout, 3, padding=1),
        nn.BatchNorm2d(cout),
        nn.ReLU(),
    )


class UNetDetector(nn.Module):
    """A VGG16-BN U-Net text detector (two score maps at half resolution), random weights."""

    def __init__(self):
        super().__init__()
        trunk = import_torchvision().models.vgg16_bn(weights=None).features
        # four stages cut after the batch norm of conv2_2 (128 channels, 1/2 of the input's side), conv3_2 (256,
        # 1/4), conv4_2 (512, 1/8), conv5_2 (512, 1/16): 20.8M parameters with the rest, the 83 MB
        self.stages = nn.ModuleList([trunk[:12], trunk[12:19], trunk[19:29], trunk[29:39]])
        self.deep = nn.Sequential(  # 1/16, no further pooling: a dilated conv widens the view
            nn.MaxPool2d(3, 1, 1),
            nn.Conv2d(512, 1024, 3, padding=6, dilation=6),
            nn.Conv2d(1024, 1024, 1),
        )
        self.up = nn.ModuleList([_block(1024 + 512, 512, 256), _block(512 + 256, 256, 128)])
        self.up += [_block(256 + 128, 128, 64), _block(128 + 64, 64, 32)]
        head = [nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 32, 3, padding=1), nn.ReLU()]
        head += [nn.Conv2d(32, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 1), nn.ReLU(), nn.Conv2d(16, 2, 1)]
        self.head = nn.Sequential(*head)

    def forward(self, x):
        feats = []
        for stage in self.stages:
            x = stage(x)
            feats.append(x)
        y = self.deep(x)
        for block, skip in zip(self.up, reversed(feats)):
            if y.shape[2:] != skip.shape[2:]:
                y = nn.functional.interpolate(y, size=skip.shape[2:], mode="bilinear", align_corners=False)
            y = block(torch.cat([y, skip], 1))
        return self.head(y).permute(0, 2, 3, 1)


def build() -> nn.Module:
    torch.manual_seed(0)
    with torch.no_grad():
        return calibrate(UNetDetector(), (1, 3, 128, 128), batches=2, batch_size=2)


def plans(model: nn.Module, side: tuple[int, int], batches: int, d: str) -> list[list]:
    """The audit's plan of the program and the ONNX model at ``side``, on chosen and on file-shaped inputs."""
    import onnx

    from bnfold.io.budget import WorkError, inputs_chosen, size_text
    from bnfold.io.fx_cost import fx_plan
    from bnfold.numerics.audit_memory import AuditHold, onnx_audit_plan

    hold = AuditHold.of(3, torch.float32, local=False)  # bnfold audit's default: fp16, no --local
    x = torch.rand(1, 3, *side)
    ep = torch.export.export(model, (x,))
    path = os.path.join(d, f"det_{side[0]}x{side[1]}.onnx")
    torch.onnx.export(model, (x,), path, input_names=["x"], opset_version=17, dynamo=False)
    om = onnx.load(path)
    rows = []
    for fmt, plan in (
        (".pt2", lambda b: fx_plan(ep, b, where="det", runs=3, hold=hold)),  # fx_audit_plan's plan
        ("ONNX", lambda b: onnx_audit_plan(om, b, "det", hold)),
    ):
        for chosen in (True, False):
            with inputs_chosen(chosen):
                try:
                    p = plan([(x,)] * batches)
                    got = [size_text(p.peak), size_text(p.budget.bytes), f"{p.flops:.3g}", f"{p.budget.flops:.3g}"]
                    got.append("fits")
                except WorkError as e:
                    got = ["-", "-", "-", "-", str(e).split(";")[0].split(": ", 1)[-1]]
            rows.append([f"{side[0]}x{side[1]}", batches, fmt, "chosen" if chosen else "file's", *got])
    return rows


_PEAK = """
import json, resource, subprocess, sys
p = subprocess.run([sys.executable, "-m", "bnfold", *sys.argv[1:]], capture_output=True, text=True)
peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
print(json.dumps({"rc": p.returncode, "peak": peak, "err": p.stderr.strip().splitlines()[-1:]}))
"""


def export(model: nn.Module, side: tuple[int, int], fmt: str, d: str) -> str:
    """The detector as a ``.pt2`` exported at ``side`` (its input is static: the file declares that size), or as ONNX
    exported at a page's size with its sides left open."""
    from bnfold.io.pt2 import save_pt2

    if fmt == "pt2":
        path = os.path.join(d, f"det_{side[0]}x{side[1]}.pt2")
        save_pt2(torch.export.export(model, (torch.rand(1, 3, *side),)), path)
        return path
    path = os.path.join(d, "det_open.onnx")
    x = torch.rand(1, 3, 256, 512)
    axes = {"x": {2: "h", 3: "w"}}
    torch.onnx.export(model, (x,), path, input_names=["x"], opset_version=17, dynamo=False, dynamic_axes=axes)
    return path


def run_audit(path: str, side: tuple[int, int]) -> dict:
    """``bnfold audit PATH --input-shape x:1,3,H,W --random 1 -q`` in a fresh process: exit code, peak RSS (MiB),
    seconds, and the audit's plan peak (MiB) at that input, as ``bnfold audit`` counts it."""
    from bnfold.io import load_model
    from bnfold.io.budget import inputs_chosen
    from bnfold.numerics.audit_memory import AuditHold, fx_audit_plan, onnx_audit_plan

    t = time.perf_counter()
    argv = ["audit", path, "--input-shape", f"x:1,3,{side[0]},{side[1]}", "--random", "1", "-q"]
    out = subprocess.run([sys.executable, "-c", _PEAK, *argv], capture_output=True)
    got = json.loads(out.stdout)
    got["s"] = round(time.perf_counter() - t, 1)
    got["peak_MiB"] = round(got.pop("peak") / 2**20)
    hold, x = AuditHold.of(3, torch.float32, local=False), torch.rand(1, 3, *side)
    plans = []
    with inputs_chosen(True, elements=x.numel()):
        model = load_model(path).model
        if path.endswith(".pt2"):
            import bnfold.numerics.audit_memory as am

            fx_plan = am.fx_plan
            am.fx_plan = lambda *a, **k: plans.append(fx_plan(*a, **k)) or plans[-1]
            try:
                fx_audit_plan(model, [(x,)], runs=3, hold=hold)
            finally:
                am.fx_plan = fx_plan
        else:
            from bnfold.cli.shapes import fix_input_shapes

            plans.append(onnx_audit_plan(fix_input_shapes(model, {"x": tuple(x.shape)}, path), [(x,)], path, hold))
    got["plan_MiB"] = round(plans[-1].peak / 2**20)
    return got


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sides", default="256x512,1024x1024")
    ap.add_argument("--batches", default="1,3")
    ap.add_argument("--run", default=None, help="also run the audit once at these sides (HxW,...)")
    ap.add_argument("--formats", default="pt2,onnx", help="the formats --run audits")
    ap.add_argument("--ppocr", default=None, help="also run the audit of PP-OCRv4 det at this side (HxW)")
    args = ap.parse_args()
    model = build()
    n = sum(p.numel() for p in model.parameters())
    log(f"detector: {n / 1e6:.1f}M parameters ({n * 4 / 1e6:.0f} MB float32), load {load_now()}")
    parse = lambda text: [tuple(int(v) for v in s.split("x")) for s in text.split(",")] if text else []  # noqa: E731
    rows = []
    with tempfile.TemporaryDirectory() as d:
        for side in parse(args.sides):
            for b in (int(v) for v in args.batches.split(",")):
                rows += plans(model, side, b, d)
        head = ["input", "batches", "format", "inputs", "plan peak", "byte budget", "FLOPs", "FLOPs budget", "plan"]
        if rows:
            print(table(head, rows))
        runs = []
        for side in parse(args.run):
            for fmt in args.formats.split(","):
                got = run_audit(export(model, side, fmt, d), side)
                runs.append([f"{side[0]}x{side[1]}", fmt, got["rc"], got["plan_MiB"], got["peak_MiB"], got["s"]])
                log(f"{fmt} {side}: {got}, load {load_now()}")
        for side in parse(args.ppocr):
            from numerics.paddleocr_models import model_path

            got = run_audit(model_path("v4-det"), side)
            runs.append([f"{side[0]}x{side[1]}", "PP-OCRv4 det", got["rc"], got["plan_MiB"], got["peak_MiB"], got["s"]])
            log(f"PP-OCRv4 det {side}: {got}, load {load_now()}")
        if runs:
            print(table(["input", "format", "exit", "plan peak MiB", "peak RSS MiB", "s"], runs))
    print(f"peak RSS of this process: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")


if __name__ == "__main__":
    main()
