"""Precision facts about ONNX ops, for the ONNX emulator (:mod:`bnfold.numerics.onnx_emulator`).

What each op computes is written once, in :mod:`bnfold.onnx.semantics`; this module says only how an
fp16 runtime rounds some of them.
"""

from __future__ import annotations

#: ops whose output holds only values of their inputs, rearranged or selected: an fp16 runtime computes
#: them exactly (no rounding of their output)
EXACT_OPS = frozenset(
    "Reshape Transpose Squeeze Unsqueeze Flatten Identity Dropout Slice Concat Gather Expand MaxPool Relu Neg Abs "
    "Max Min Resize Shape".split()
)
#: of those, the ones whose error statistics equal their input's (the same elements, rearranged)
SAME_ERROR_OPS = frozenset("Reshape Transpose Squeeze Unsqueeze Flatten Identity Dropout".split())
#: ONNX layer ops and their kind
LAYER_OPS = {"Conv": "conv", "ConvTranspose": "conv_transpose", "Gemm": "linear", "MatMul": "matmul"}
