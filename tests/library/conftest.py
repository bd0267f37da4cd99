"""The library zoo imports the ONNX export helper of the re-parameterization tests (tests/reparam/reparam_onnx.py)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "reparam"))
