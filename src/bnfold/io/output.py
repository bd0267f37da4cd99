"""Where ``bnfold fold`` may write, decided before any work is done: the
``-o`` / ``--force`` / ``--in-place`` rules, and the ONNX data file beside the
output."""

from __future__ import annotations

import os
from dataclasses import dataclass

from ..errors import BnfoldError, ModelFileError
from ..frontends import for_kind
from .files import model_kind, same_file


@dataclass
class OutputPlan:
    """The output file, its kind (``"pt2"`` / ``"onnx"``) and whether it is the input itself."""

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
    """Decide where the output goes: the rules of ``bnfold fold``.

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
    if os.path.realpath(output) in input_files(input_path):
        raise BnfoldError(f"{output}: the input reads this file (external data); write the output elsewhere")
    same = same_file(input_path, output)
    if same and not in_place:
        raise BnfoldError(f"{output}: refusing to overwrite the input; pass --in-place to do that")
    if in_place and not same:
        raise BnfoldError(f"{output}: --in-place writes the input file; do not give a different -o")
    if not same and os.path.lexists(output) and not force:
        raise BnfoldError(f"{output}: already exists; pass --force to replace it")
    if not os.access(parent, os.W_OK):
        raise ModelFileError(f"{output}: cannot write to {parent} (permission denied)")
    if not same:
        for what, beside in for_kind(kind).files.writes_beside(output):
            _check_beside(input_path, beside, what, force)
    return OutputPlan(output, kind, same)


def _check_beside(input_path: str, path: str, what: str, force: bool) -> None:
    """A file the output writes beside itself (OUT.data: its external data) belongs to it: replace it only with
    --force, and never when the input reads it."""
    if not os.path.lexists(path):
        return
    if not force:
        raise BnfoldError(f"{path}: already exists (it would hold the output's {what}); pass --force")
    if os.path.realpath(path) in input_files(input_path):
        raise BnfoldError(f"{path}: holds the input's {what}; write the output elsewhere")


def _written(role: str, path: str) -> list[tuple[str, str]]:
    """The files an output writes: an ONNX model also writes its external data file beside it."""
    found = [(role, path)]
    kind = model_kind_or_none(path) if role == "output" else None
    if kind is not None:
        found += [(f"{role}'s {what} file", beside) for what, beside in for_kind(kind).files.writes_beside(path)]
    return found


def model_kind_or_none(path: str) -> str | None:
    try:
        return model_kind(path)
    except BnfoldError:
        return None


def check_outputs(outputs: dict[str, str | None], inputs: list[str | None]) -> None:
    """No output of a run (model and its data file, report, plot) may be another output of the same run,
    or a file any input reads (an input itself, an ONNX input's external data, an ``--inputs`` file).

    ``outputs`` maps a role ("output", "report", "plot") to a path (None: not written); ``inputs`` are
    the files the run reads.  Checked before any work is done; one-line ``BnfoldError``.
    """
    read: dict[str, str] = {}
    for p in inputs:
        if not p:
            continue
        read.setdefault(os.path.realpath(p), os.fspath(p))
        for extra in input_files(os.fspath(p)):
            read.setdefault(extra, f"the external data of {os.fspath(p)}")
    seen: dict[str, str] = {}
    for role, path in outputs.items():
        if not path:
            continue
        # --in-place: the model replaces its input (and its data file); plan_output allowed that
        in_place = role == "output" and os.path.realpath(path) in read
        for what, p in _written(role, os.fspath(path)):
            real = os.path.realpath(p)
            if real in read and not in_place:
                raise BnfoldError(
                    f"{p}: the {what} would overwrite {read[real]}, which this run reads; write it elsewhere"
                )
            if real in seen:
                raise BnfoldError(
                    f"{p}: the {what} is another output of this run (the {seen[real]}); choose another name"
                )
            seen[real] = what


def check_side_file(path: str, *, not_same_as: list[str], what: str, force: bool | None = None) -> None:
    """Where a report / plot may go: never a model file or a file the input model reads (its
    external data), never an existing file without ``force``, and its folder must exist.

    ``force=None`` is for a command without ``--force``: an existing file is refused.
    """
    for other in not_same_as:
        if other and same_file(path, other):
            raise BnfoldError(f"{path}: the {what} would overwrite a model file; write it elsewhere")
        if other and os.path.realpath(path) in input_files(other):
            raise BnfoldError(f"{path}: the {what} would overwrite the model's external data; write it elsewhere")
    if os.path.isdir(path):
        raise ModelFileError(f"{path}: is a directory; give a file name for the {what}")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise ModelFileError(f"{path}: the folder {parent} does not exist")
    if os.path.lexists(path) and not force:
        hint = "remove it or choose another name" if force is None else "pass --force to replace it"
        raise BnfoldError(f"{path}: already exists; {hint}")


def input_files(path: str) -> set[str]:
    """Real paths of the files a model reads besides itself (its frontend's ``reads_beside``: an ONNX model's
    external data files); empty for a file of no known kind."""
    from ..frontends import for_kind

    try:
        kind = model_kind(path)
    except BnfoldError:
        return set()
    return for_kind(kind).files.reads_beside(path)
