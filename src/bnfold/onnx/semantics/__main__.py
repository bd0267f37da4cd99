"""``python -m bnfold.onnx.semantics``: the ONNX op types the audit emulates, as README lists them."""

import textwrap

from . import supported

ops = supported()
print(f"{len(ops)} ONNX op types:")
print(textwrap.fill(" ".join(ops), width=100))
