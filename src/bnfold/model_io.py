"""Model files for the command line: reading ``.pt2`` / ``.onnx`` safely, writing them atomically.

* ``load_model(path, trust=False)`` reads a ``.pt2`` once into memory, checks the
  bytes with ``bnfold.pt2_safety`` (unless ``trust``) and hands the *same* bytes
  to ``torch.export.load``; ``.onnx`` goes through ``bnfold.onnx.load_onnx``.
  Every failure is a one-line ``ModelFileError`` that names the file.
* ``plan_output(...)`` decides, before any work is done, whether an output path
  may be written (``--force`` / ``--in-place`` rules).
* ``save_model(...)`` and ``atomic_write_*`` write a temporary file in the
  destination folder and ``os.replace`` it, so that no partial file is left.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import tempfile
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from .errors import BnfoldError, ModelFileError
from .files import file_mode, read_model_bytes

PT2 = "pt2"
ONNX = "onnx"
EXTENSIONS = {".pt2": PT2, ".onnx": ONNX}


@dataclass
class LoadedModel:
    """A model read from ``path``; ``kind`` is ``"pt2"`` or ``"onnx"``."""

    path: str
    kind: str
    model: Any


def model_kind(path: str | os.PathLike) -> str:
    """``"pt2"`` or ``"onnx"`` from the file name; anything else is an error."""
    ext = os.path.splitext(os.fspath(path))[1].lower()
    kind = EXTENSIONS.get(ext)
    if kind is None:
        shown = f"extension {ext!r}" if ext else "no extension"
        raise ModelFileError(f"{os.fspath(path)}: unsupported model file ({shown}); use a .pt2 or .onnx file")
    return kind


# ----------------------------------------------------------------------------- quiet third-party output


@contextlib.contextmanager
def quiet(enabled: bool = True) -> Iterator[None]:
    """Silence warnings and torch/onnx log records below ERROR (the CLI's one-line errors stay one line)."""
    if not enabled:
        yield
        return
    names = ("torch", "onnx", "onnxruntime", "onnx_ir", "bnfold")
    loggers = [logging.getLogger(n) for n in names]
    levels = [lg.level for lg in loggers]
    try:
        for lg in loggers:
            lg.setLevel(logging.ERROR)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        for lg, lvl in zip(loggers, levels):
            lg.setLevel(lvl)


# ----------------------------------------------------------------------------- reading


def check_input_file(path: str) -> None:
    """Existence checks only (for formats whose loader reads the file itself)."""
    if not os.path.lexists(path):
        raise ModelFileError(f"{path}: no such file")
    if os.path.isdir(path):
        raise ModelFileError(f"{path}: is a directory, not a model file")
    if not os.access(path, os.R_OK):
        raise ModelFileError(f"{path}: cannot read (permission denied)")
    if os.path.getsize(path) == 0:
        raise ModelFileError(f"{path}: the file is empty")


def load_model(path: str | os.PathLike, *, trust: bool = False, debug: bool = False) -> LoadedModel:
    path = os.fspath(path)
    kind = model_kind(path)
    if kind == PT2:
        return LoadedModel(path, kind, load_pt2(path, trust=trust, debug=debug))
    return LoadedModel(path, kind, load_onnx_file(path, debug=debug))


def load_pt2(path: str, *, trust: bool = False, debug: bool = False):
    """Load a ``torch.export.save`` archive, refusing ones that would run code unless ``trust``."""
    from . import pt2_safety

    data = read_model_bytes(path)
    if trust:
        if data[:4] != pt2_safety.ZIP_MAGIC:
            raise ModelFileError(f"{path}: not a .pt2 archive (not a zip file; {pt2_safety._sniff(data)})")
    else:
        pt2_safety.check_pt2_bytes(data, path)

    import torch

    try:
        with quiet(not debug):
            ep = torch.export.load(io.BytesIO(data))
    except BnfoldError:
        raise
    except Exception as e:
        if debug:
            raise
        raise ModelFileError(f"{path}: cannot load the exported program ({_one_line(e)})") from None
    if not isinstance(ep, torch.export.ExportedProgram):
        raise ModelFileError(f"{path}: the archive does not hold an exported program")
    return ep


def _onnx_module():
    try:
        from . import onnx as bnfold_onnx

        bnfold_onnx.load_onnx  # noqa: B018 - check the API is there
        bnfold_onnx.save_onnx  # noqa: B018
    except (ImportError, AttributeError) as e:
        raise BnfoldError(f"ONNX support is not available ({_one_line(e)}); install bnfold[onnx]") from None
    return bnfold_onnx


def load_onnx_file(path: str, *, debug: bool = False):
    """``bnfold.onnx.load_onnx`` with one-line errors that name the file."""
    check_input_file(path)
    mod = _onnx_module()
    try:
        with quiet(not debug):
            model = mod.load_onnx(path)
    except BnfoldError as e:
        raise _naming(e, path) from None
    except Exception as e:
        if debug:
            raise
        raise ModelFileError(f"{path}: cannot load the ONNX model ({_one_line(e)})") from None
    check_onnx_opset(model, path)
    return model


def check_onnx_opset(model: Any, path: str) -> None:
    """Refuse a default-domain opset this onnx does not know: its operators' meaning is unknown."""
    import onnx

    newest = onnx.defs.onnx_opset_version()
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx") and not 1 <= imp.version <= newest:
            raise ModelFileError(
                f"{path}: uses ONNX opset {imp.version}, which is not supported "
                f"(onnx {onnx.__version__} knows opsets 1 to {newest})"
            )


# ----------------------------------------------------------------------------- writing


@dataclass
class OutputPlan:
    path: str
    kind: str
    replaces_input: bool


def plan_output(
    input_path: str,
    output: str | None,
    *,
    force: bool = False,
    in_place: bool = False,
) -> OutputPlan:
    """Decide where the output goes, before any work: the rules of ``bnfold fold``.

    The input is overwritten only with ``in_place``; an existing other file only
    with ``force``; the output has the input's format.
    """
    kind = model_kind(input_path)
    if output is None:
        if not in_place:
            raise BnfoldError("no output file: give -o OUT, or --in-place to overwrite the input")
        output = input_path
    output = os.fspath(output)
    out_kind = model_kind(output)
    if out_kind != kind:
        raise BnfoldError(
            f"{output}: the output must be a .{kind} file like the input (bnfold does not convert formats)"
        )
    if os.path.isdir(output):
        raise ModelFileError(f"{output}: is a directory")
    parent = os.path.dirname(os.path.abspath(output))
    if not os.path.isdir(parent):
        raise ModelFileError(f"{output}: the folder {parent} does not exist")
    same = same_file(input_path, output)
    if same and not in_place:
        raise BnfoldError(f"{output}: refusing to overwrite the input; pass --in-place to do that")
    if in_place and not same:
        raise BnfoldError(f"{output}: --in-place writes the input file; do not give a different -o")
    if not same and os.path.lexists(output) and not force:
        raise BnfoldError(f"{output}: already exists; pass --force to replace it")
    if not os.access(parent, os.W_OK):
        raise ModelFileError(f"{output}: cannot write to {parent} (permission denied)")
    if kind == ONNX and not same:
        _check_onnx_data_file(input_path, output, force)
    return OutputPlan(output, kind, same)


def onnx_data_path(output: str) -> str:
    """Where ``bnfold.onnx.save_onnx`` puts the external data of ``output``."""
    return output + ".data"


def _check_onnx_data_file(input_path: str, output: str, force: bool) -> None:
    """OUT.data belongs to OUT: replace it only with --force, and never when the input reads it."""
    data = onnx_data_path(output)
    if not os.path.lexists(data):
        return
    if not force:
        raise BnfoldError(f"{data}: already exists (it would hold the output's external data); pass --force")
    if os.path.realpath(data) in _onnx_external_files(input_path):
        raise BnfoldError(f"{data}: holds the input's external data; write the output elsewhere")


def _onnx_external_files(path: str) -> set[str]:
    """Real paths of the external data files an ONNX model refers to (empty if it cannot be read)."""
    try:
        import onnx

        model = onnx.load(path, load_external_data=False)
    except Exception:
        return set()
    base = os.path.dirname(os.path.abspath(path))
    found = set()
    for t in _onnx_tensors(model):
        if t.data_location == 1:  # TensorProto.EXTERNAL
            loc = {e.key: e.value for e in t.external_data}.get("location")
            if loc:
                found.add(os.path.realpath(os.path.join(base, loc)))
    return found


def _onnx_tensors(model: Any) -> Iterator[Any]:
    graphs = [model.graph]
    while graphs:
        g = graphs.pop()
        yield from g.initializer
        for node in g.node:
            for a in node.attribute:
                if a.HasField("t"):
                    yield a.t
                yield from a.tensors
                if a.HasField("g"):
                    graphs.append(a.g)
                graphs.extend(a.graphs)


def same_file(a: str, b: str) -> bool:
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def check_side_file(path: str, *, not_same_as: list[str], what: str) -> None:
    """A report / plot path must not be one of the model files and its folder must exist."""
    for other in not_same_as:
        if other and same_file(path, other):
            raise BnfoldError(f"{path}: the {what} would overwrite a model file")
    if os.path.isdir(path):
        raise ModelFileError(f"{path}: is a directory")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise ModelFileError(f"{path}: the folder {parent} does not exist")


@contextlib.contextmanager
def atomic_path(path: str, suffix: str = ".tmp") -> Iterator[str]:
    """Yield a temporary path in ``path``'s folder; on success it replaces ``path``, on error it is removed."""
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=suffix, dir=folder)
    os.close(fd)
    try:
        yield tmp
        os.chmod(tmp, file_mode(path))
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(folder)


def atomic_write_bytes(path: str, write: Callable[[io.BufferedWriter], None]) -> None:
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())


def atomic_write_text(path: str, text: str) -> None:
    atomic_write_bytes(path, lambda f: f.write(text.encode("utf-8")))


def _fsync_dir(folder: str) -> None:
    with contextlib.suppress(OSError, AttributeError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def save_model(model: Any, plan: OutputPlan, *, debug: bool = False) -> None:
    """Write ``model`` to ``plan.path`` atomically; raises ``ModelFileError`` naming the file."""
    try:
        if plan.kind == PT2:
            import torch

            with quiet(not debug):
                atomic_write_bytes(plan.path, lambda f: torch.export.save(model, f))
        else:
            mod = _onnx_module()
            with quiet(not debug):
                mod.save_onnx(model, plan.path)
    except BnfoldError as e:
        raise _naming(e, plan.path) from None
    except Exception as e:
        if debug:
            raise
        raise ModelFileError(f"{plan.path}: cannot write the model ({_one_line(e)})") from None


# ----------------------------------------------------------------------------- helpers


def _naming(err: BnfoldError, path: str) -> BnfoldError:
    """The same error, with the file name in front when the message lacks it."""
    msg = _one_line(err)
    if path in msg or os.path.basename(path) in msg:
        return type(err)(msg)
    return type(err)(f"{path}: {msg}")


def _one_line(e: BaseException) -> str:
    lines = [ln.strip() for ln in str(e).strip().splitlines() if ln.strip()]
    first = lines[0] if lines else type(e).__name__
    if not lines or first in ("", "None"):
        first = type(e).__name__
    return first if len(first) <= 300 else first[:297] + "..."
