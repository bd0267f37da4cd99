"""The help texts of ``bnfold``: the descriptions and epilogs of the commands."""

from __future__ import annotations

from .constants import DEFAULT_RANDOM_BATCHES

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
  bnfold fold big.pt2 -o folded.pt2 --low-memory   # about the weights once in memory, not 1.7x
  bnfold fold big.onnx -o folded.onnx --low-memory # external data streamed: a few tensors in memory
  bnfold fold model.pt2 -o folded.pt2 --exclude 'head.*' --exclude classifier
  bnfold fold model.onnx -o folded.onnx --input-shape x:1,3,224,224   # fix the dims it leaves open

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
  bnfold audit model.pt2 --inputs batches.npz --local --json

--inputs FILE.npz holds one array per program input, named arr_0, arr_1, ... or
by input name, batch axis first: [N, *example_shape] is N batches, and
[N*B, ...] is split into batches of the example batch size B (a dim the program
leaves dynamic may take any size its constraints allow). It is read with
allow_pickle=False. --random N draws N batches shaped like the program's
example inputs (or --input-shape NAME:D0,D1,...) from a fixed seed (--seed). An ONNX model is audited with the
ONNX that `bnfold fold` writes for it, both run node by node (its node names are
the layer names); --input-shape NAME:1,3,48,320 fixes the dims it leaves open,
--inputs arrays have the input's rank (one batch) or one axis more (N batches),
and --runtime torch|onnxruntime also runs that real fp16 runtime.

Agreement with fp32 on the task, beside the SQNR: --class-axis N gives top-1
agreement along axis N of the first output (default: axis 1 of [N, classes]),
--threshold T (0 < T < 1) gives mask_iou, the IoU of the first output's mask
> T with fp32's (probability maps; 1.0 when both masks are empty). With
--inputs the closing "what to do" cites them first.

Per batch norm: kappa and |scale| at the model's eps and at --bn-eps (a runtime
that ignores the model's eps: ExecuTorch's QNN builder uses 1e-9), the fp16
headroom of everything the profile stores (input, x*scale, bias', sum), and a
verdict (safe / degrades by ~N dB / overflows) predicted from the statistics
next to what the emulated run measured. Per layer: SQNR against the reference
run (float64; float32 under the profiles that store fp16), cumulative, with
NaN/inf shown as counts and shares, never as an SQNR. --local also runs each
layer again from its emulated inputs: the error it adds by itself (the local
columns) and the measured loss of a fold, which a verdict then weighs too
(16-35% more time after the fold). It ends with what to do. A
program exported in training mode is refused (exit 2). Progress goes to
stderr: a bar on a terminal, a line every 10 s otherwise.
"""
