"""Every option of ``bnfold``, declared once as data.

``OPTIONS`` maps an option's name (its ``args`` attribute) to an :class:`Option`: its flags and what
argparse needs. A command (:mod:`bnfold.cli.commands`) lists the names it takes; the parser
(:mod:`bnfold.cli.parser`) adds exactly those, so a flag is spelled, typed and documented in one place.
An option marked ``anywhere`` is also accepted before the command (``bnfold --json check m.pt2``).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Any

from ..numerics.block_list import FORMATS as BLOCK_LIST_FORMATS
from . import shapes, types
from .constants import DEFAULT_RANDOM_BATCHES, ONLY_KINDS, PROFILES
from .texts import TRUST_HELP

#: The default of an option that is absent unless given: ``args`` has no attribute for it, so an
#: option accepted both before and after the command keeps the value given before it.
ABSENT = argparse.SUPPRESS


@dataclass(frozen=True)
class Option:
    """One command-line option or positional argument: ``flags`` (none for a positional) and the
    keyword arguments of ``argparse.ArgumentParser.add_argument``."""

    flags: tuple[str, ...]
    help: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    group: str | None = None  #: options with the same group exclude each other
    anywhere: bool = False  #: also accepted before the command

    def add_to(self, parser, name: str, hidden: bool = False) -> None:
        kwargs = dict(self.kwargs)
        if self.flags:
            kwargs["dest"] = name
        help_text = argparse.SUPPRESS if hidden else self.help
        parser.add_argument(*(self.flags or (name,)), help=help_text, **kwargs)


def _flag(*flags: str, help: str, anywhere: bool = False, group: str | None = None) -> Option:
    """A switch that is absent unless given."""
    return Option(flags, help, {"action": "store_true", "default": ABSENT}, group=group, anywhere=anywhere)


OPTIONS: dict[str, Option] = {
    # positionals
    "input": Option((), "a .pt2 program (torch.export.save) or an .onnx model", {"metavar": "IN"}),
    "inputs": Option((), "a .pt2 or .onnx model (several are allowed)", {"metavar": "IN", "nargs": "+"}),
    # output and verbosity (every command)
    "json": _flag("--json", help="print machine-readable JSON on stdout", anywhere=True),
    "debug": _flag("--debug", help="show tracebacks and library warnings", anywhere=True),
    "quiet": _flag(
        "-q", "--quiet", help="print the summary only (no per-normalization table)", anywhere=True, group="verbosity"
    ),
    "verbose": _flag(
        "-v",
        "--verbose",
        help="print every entry in full (graph nodes, the fold report)",
        anywhere=True,
        group="verbosity",
    ),
    # loading a model file
    "trust": _flag("--trust", help=TRUST_HELP),
    "max_bytes": Option(
        ("--max-bytes",),
        "most bytes the model file may unpack to (e.g. 2GiB, 1e9; default: 16x its size, at least 256 MiB); "
        "see SECURITY.md",
        {"type": types.byte_size, "metavar": "N", "default": ABSENT},
    ),
    "max_work": Option(
        ("--max-work",),
        "most bytes running the model may hold at once, e.g. 4GiB, 1e9 (FLOPs: 256 N); default from its weights; "
        "see SECURITY.md",
        {"type": types.byte_size, "metavar": "N", "default": ABSENT},
    ),
    "input_shape": Option(
        ("--input-shape",),
        "ONNX: fix the shape of input NAME (dims the model leaves open, e.g. a batch or a side); audit of a .pt2: "
        "the shape of its --random batches, within the program's constraints; repeatable "
        "(onnxsim's --overwrite-input-shape convention)",
        {"metavar": "NAME:D0,D1,...", "type": shapes.input_shape, "action": "append"},
    ),
    # fold
    "output": Option(("-o", "--output"), "where to write the folded model (same format as IN)", {"metavar": "OUT"}),
    "report": Option(("--report",), "also write the fold report as JSON to FILE", {"metavar": "FILE"}),
    "only": Option(
        ("--only",),
        "fold only into these layer kinds and/or only these normalization kinds, comma-separated: "
        + ",".join(ONLY_KINDS)
        + " (a kind the model has none of is an error)",
        {"metavar": "KINDS", "type": types.kinds},
    ),
    "exclude": Option(
        ("--exclude",),
        "leave layers and normalizations whose module path (ONNX: node name) matches these "
        "comma-separated fnmatch patterns, e.g. 'head.*'; repeatable; a pattern that matches nothing is an error",
        {"metavar": "PATTERNS", "action": "append"},
    ),
    "lower_unfoldable": Option(
        ("--lower-unfoldable",),
        "rewrite each batch norm that cannot fold as mul + add by constants computed with the model's eps "
        "(no backend can then apply its own eps)",
        {"action": "store_true"},
    ),
    "fp16_range": Option(
        ("--fp16-range",),
        "after folding, run the model in float32 on these input batches (as audit --inputs reads them) and "
        "rewrite every value too large for fp16 by powers of two, exactly, proved in float64",
        {"metavar": "INPUTS.npz"},
    ),
    "fp16_margin": Option(
        ("--fp16-margin",),
        "with --fp16-range: keep every value under 65504 / M (default: 16)",
        {"type": types.positive_float, "metavar": "M", "default": 16.0},
    ),
    "range_profile": Option(
        ("--profile",),
        "with --fp16-range: the limits of this precision profile only (default: every profile's)",
        {"choices": PROFILES, "default": None},
    ),
    "low_memory": Option(
        ("--low-memory",),
        "fold the .pt2 program in place as it was read: each folded weight replaces its original, so the peak "
        "is the weights once plus the largest tensor being folded, not twice the folded ones; an .onnx model's "
        "external data stays on disk: each tensor is read when the fold needs it and copied to the output "
        "in order (same output files; --fp16-range's calibration runs still hold every weight while they run)",
        {"action": "store_true"},
    ),
    "force": Option(("--force",), "replace OUT if it exists", {"action": "store_true"}),
    "in_place": Option(
        ("--in-place",), "overwrite IN with the folded model (OUT defaults to IN)", {"action": "store_true"}
    ),
    # check
    "strict": Option(("--strict",), "also fail on normalizations bnfold cannot fold", {"action": "store_true"}),
    # audit
    "profile": Option(("--profile",), "precision profile (default: fp16)", {"choices": PROFILES, "default": "fp16"}),
    "bn_eps": Option(
        ("--bn-eps",),
        "use eps E in every batch norm of the emulated runs",
        {"type": types.positive_float, "metavar": "E"},
    ),
    "batches": Option(("--inputs",), "input batches from an .npz file", {"metavar": "FILE.npz"}, group="source"),
    "random": Option(
        ("--random",),
        f"N random batches shaped like the example inputs (default: {DEFAULT_RANDOM_BATCHES})",
        {"type": types.positive_int, "metavar": "N"},
        group="source",
    ),
    "seed": Option(("--seed",), "seed for --random (default: 0)", {"type": int, "default": 0}),
    "runtime": Option(
        ("--runtime",),
        "ONNX: also run this real runtime in fp16 (torch half on CPU; ONNX Runtime on a float16 model)",
        {"choices": ("torch", "onnxruntime")},
    ),
    "class_axis": Option(
        ("--class-axis",),
        "report top-1 agreement with fp32 along axis N of the first output (default: axis 1 of an [N, classes] "
        "output); negative counts from the end",
        {"type": int, "metavar": "N"},
    ),
    "threshold": Option(
        ("--threshold",),
        "report mask_iou: IoU of the first output's mask > T with fp32's (probability maps: detection, "
        "segmentation); T in (0, 1)",
        {"type": float, "metavar": "T"},
    ),
    "plot": Option(
        ("--plot",),
        "write the SQNR chart (whole model and worst layers) to FILE.png",
        {"metavar": "FILE.png"},
    ),
    "local": Option(
        ("--local",),
        "also run each layer's segment again from its emulated inputs: the error each layer adds by itself (the "
        "local columns) and the measured loss of a fold, which the verdicts then weigh beside the predicted one; "
        "16-35%% more time after the fold",
        {"action": "store_true"},
    ),
    "task_output": Option(
        ("--output",),
        "the output (its name or index) that top-1, mask IoU and the verdict's SQNR read (default: the first for the "
        "task, every output together for the SQNR); each output's numbers are in the JSON",
        {"metavar": "NAME|INDEX"},
    ),
    "min_agreement": Option(
        ("--min-agreement",),
        "the verdict's floor for top-1 agreement and mask IoU with fp32 (default: 0.99)",
        {"type": float, "metavar": "A", "default": 0.99},
    ),
    "min_sqnr": Option(
        ("--min-sqnr",),
        "the verdict's floor for the output SQNR in dB (default: 20)",
        {"type": float, "metavar": "DB", "default": 20.0},
    ),
    "block_list": Option(
        ("--block-list",),
        "write the prescription's nodes to keep in float32 to FILE (in --block-list-format)",
        {"metavar": "FILE"},
    ),
    "block_list_format": Option(
        ("--block-list-format",),
        "what --block-list writes: onnxconverter-common (node_block_list), modelopt (AutoCast nodes_to_exclude), "
        "openvino (disable_fp16_compression rt info), tensorrt (trtexec --layerPrecisions), torch (module paths); "
        "default: onnxconverter-common for ONNX, torch for a torch program",
        {"choices": BLOCK_LIST_FORMATS, "metavar": "F"},
    ),
    # demo
    "out": Option(("--out",), "folder for the demo's files (default: .)", {"metavar": "DIR", "default": "."}),
    "quick": Option(("--quick",), "a smaller, faster run", {"action": "store_true"}),
}

#: Option groups commands take together.
COMMON = ("json", "debug", "quiet", "verbose")
LOADING = ("trust", "max_bytes", "max_work")
