"""Reading and writing model files: every file bnfold reads or writes goes through here.

::

    atomic.py         the one atomic writer (temporary file, fsync, os.replace, cleanup on error)
    errors.py         one_line(): every error message as one line
    files.py          model kind from the file name, reading a model file once, an ONNX file's external data
    model_files.py    each format's load and save (the frontends' hooks)
    batches.py        the audit's input batches: random ones, or arrays from an .npz
    quiet.py          silencing torch / onnx warnings and logs
    pt2/              load_pt2 / save_pt2: the safe .pt2 loader (the archive's bytes inspected before
                      torch.export.load sees them: pickles, expressions, guards, treespecs, the
                      operator allowlist) and the atomic saver; see its __init__ for the modules
    limits.py         Limits (--max-bytes), regular files only, JSON with bounded depth
    onnx.py           load_onnx / save_onnx and the OnnxModel they pass around (needs onnx)
    onnx_external.py  ExternalLayout, reading external data safely, writing it out (needs onnx)
    onnx_graph.py     ONNX graph checks before any walk: order, cycles, depth, tensor sizes (needs onnx)
    output.py         plan_output: where ``bnfold fold`` may write (-o, --force, --in-place), side files
    models.py         load_model / save_model by file name, for the command line
    npz.py            read_npz: input arrays for ``bnfold audit``

This package imports neither torch nor onnx: the ONNX entry points live in
:mod:`bnfold.io.onnx` (re-exported by :mod:`bnfold.onnx`), and torch is
imported inside the functions that need it.
"""

from .atomic import atomic_path, atomic_paths, file_mode, write_bytes, write_text
from .errors import one_line
from .files import (
    ONNX,
    PT2,
    model_kind,
    onnx_data_path,
    read_model_bytes,
    same_file,
)
from .models import LoadedModel, load_model, save_model
from .npz import read_npz
from .output import OutputPlan, check_side_file, plan_output
from .pt2 import load_pt2, save_pt2
from .quiet import quiet

__all__ = [
    "ONNX",
    "PT2",
    "LoadedModel",
    "OutputPlan",
    "atomic_path",
    "atomic_paths",
    "check_side_file",
    "file_mode",
    "load_model",
    "load_pt2",
    "model_kind",
    "one_line",
    "onnx_data_path",
    "plan_output",
    "quiet",
    "read_model_bytes",
    "read_npz",
    "same_file",
    "save_model",
    "save_pt2",
    "write_bytes",
    "write_text",
]
