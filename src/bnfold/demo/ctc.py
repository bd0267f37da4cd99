"""CTC greedy decoding with a PaddleOCR recognizer's own character table.

The table is the model's ONNX metadata ``character`` (one character a line); PaddleOCR's ``CTCLabelDecode``
puts the CTC blank at index 0 and appends a space (``use_space_char``), so class ``k`` of the output
``[N, T, classes]`` is ``["blank", *table, " "][k]``.  Greedy decoding takes the arg-max class per time
step, merges repeats and drops blanks.
"""

from __future__ import annotations

import numpy as np


def characters(model) -> list[str]:
    """The decoding table of a recognizer (an ``onnx.ModelProto``): blank, the model's characters, space."""
    table = {p.key: p.value for p in model.metadata_props}.get("character")
    if table is None:
        raise ValueError("the model has no 'character' metadata: not a PaddleOCR recognizer exported with its table")
    return ["", *table.splitlines(), " "]


def ctc_greedy(logits: np.ndarray, table: list[str]) -> list[str]:
    """The text of each row of ``logits`` (``[N, T, classes]``, probabilities or scores)."""
    x = np.nan_to_num(np.asarray(logits, dtype=np.float64), nan=-np.inf)
    if x.ndim != 3 or x.shape[2] != len(table):
        raise ValueError(f"expected [N, T, {len(table)}] recognizer outputs, got {list(x.shape)}")
    out = []
    for idx in x.argmax(axis=2):
        keep = np.ones(len(idx), dtype=bool)
        keep[1:] = idx[1:] != idx[:-1]
        out.append("".join(table[i] for i in idx[keep] if i != 0))
    return out
