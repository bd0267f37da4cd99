"""A prescription's float32 nodes in what each mixed-precision tool takes (``bnfold audit --block-list FILE
--block-list-format F``), written through the atomic writer.

* ``onnxconverter-common``: ``{"node_block_list": [...]}`` for ``convert_float_to_float16(..., node_block_list=)``.
* ``modelopt``: ``{"nodes_to_exclude": [...]}`` for ModelOpt AutoCast, whose entries are name patterns (regular
  expressions): each name escaped and anchored.
* ``openvino``: ``{"rt_info": "disable_fp16_compression_0", "nodes": [...]}``: the runtime-info key OpenVINO's
  ``DisableFP16Compression`` attribute is stored under, and the nodes (ONNX node names) to mark with it.
* ``tensorrt``: one line of trtexec flags, ``--precisionConstraints=obey --layerPrecisions=name:fp32,...``.
* ``torch``: ``{"module_paths": [...], "nodes": [...]}`` of a torch program.

The JSON formats also hold ``base`` (the model the names are of: "unfolded", "folded" or "rewritten") and
``rewrite`` (the rewrites ``bnfold fold`` applies first when the base is "rewritten", e.g. ``["fp16_range"]``).
"""

from __future__ import annotations

import json
import re

FORMATS = ("onnxconverter-common", "modelopt", "openvino", "tensorrt", "torch")
ONNX_FORMATS = FORMATS[:4]


def render(prescription, fmt: str, onnx: bool) -> str:
    """The text of the block list in ``fmt`` (ValueError: a format for the other kind of model, or a name trtexec
    cannot spell)."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown block-list format {fmt!r}; choose from {', '.join(FORMATS)}")
    if onnx != (fmt in ONNX_FORMATS):
        kind = "an ONNX model" if onnx else "a torch program"
        fits = ", ".join(ONNX_FORMATS) if onnx else "torch"
        raise ValueError(f"block-list format {fmt} is not for {kind}; use {fits}")
    nodes = list(prescription.fp32_nodes)
    if fmt == "tensorrt":
        bad = [n for n in nodes if re.search(r"[,:\s]", n)]
        if bad:
            raise ValueError(
                f"node {bad[0]!r} holds a comma, colon or space: trtexec's --layerPrecisions cannot name it"
            )
        spec = ",".join(f"{n}:fp32" for n in nodes)
        return f"--precisionConstraints=obey --layerPrecisions={spec}\n" if nodes else "\n"
    if fmt == "onnxconverter-common":
        data = {"node_block_list": nodes}
    elif fmt == "modelopt":
        data = {"nodes_to_exclude": [f"^{re.escape(n)}$" for n in nodes]}
    elif fmt == "openvino":
        data = {"rt_info": "disable_fp16_compression_0", "nodes": nodes}
    else:
        data = {"module_paths": list(prescription.labels), "nodes": nodes}
    data["base"] = prescription.base
    data["rewrite"] = list(prescription.rewrite) if prescription.base == "rewritten" else []
    return json.dumps(data, indent=1) + "\n"


def write(path: str, prescription, fmt: str, onnx: bool) -> None:
    """Write the block list to ``path`` (atomically)."""
    from ..io.atomic import write_text

    write_text(path, render(prescription, fmt, onnx))
