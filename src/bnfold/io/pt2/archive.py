"""One pt2 zip seen through both zip readers ``torch.export.load`` may use: its form (exactly what Python's zipfile
lists, :mod:`.zipform`) and entry names checked before torch's reader opens it, sizes (the byte budget, zip bombs),
the values its JSON entries hold (the work budget) and records; ``sniff`` for files that are not zip archives."""

from __future__ import annotations

import io
import zipfile
from collections import Counter

from ...errors import ModelFileError
from ..budget import (
    JSON_TEXT_BYTES,
    JSON_VALUE_BYTES,
    Budget,
    WorkError,
    json_values_allowed,
    max_work_needed,
    size_text,
    sizes_text,
)
from ..errors import one_line
from ..limits import MAX_BYTES_HINT, MIB, Limits, json_values
from .layout import ZIP_MAGIC, layout
from .zipform import check_zip_form


class Archive:
    """One pt2 zip seen through both zip readers torch.export.load may use."""

    def __init__(self, data: bytes, source: str, result, limits: Limits | None = None):
        self.source = source
        self.limits = limits or Limits()
        self.file_size = len(data)
        self._data = data
        self.sizes: dict[str, int] = {}
        self._infos: dict[str, zipfile.ZipInfo] = {}
        if len(data) == 0:
            raise ModelFileError(f"{source}: the file is empty")
        if data[:4] != ZIP_MAGIC:
            raise ModelFileError(f"{source}: not a .pt2 archive (not a zip file; {sniff(data)})")
        try:
            with zipfile.ZipFile(io.BytesIO(data)) as zf:
                infos, start_dir = zf.infolist(), zf.start_dir
        except (zipfile.BadZipFile, EOFError, ValueError, OSError) as e:
            raise ModelFileError(f"{source}: truncated or corrupted zip archive ({one_line(e)})") from None
        names = [i.filename for i in infos if not i.filename.endswith("/")]
        if not names:
            raise ModelFileError(f"{source}: the zip archive is empty")
        self.names, self.reader, self._foreign_top = [], None, []
        counts = Counter(n.lower() for n in names)  # torch's reader finds a name ignoring its case
        dup = next((n for n in names if counts[n.lower()] > 1), None)
        if dup is not None:  # nothing is read through torch's reader: it may read the other one
            spelled = "" if counts[dup] == names.count(dup) else " (in names that differ only in case)"
            result.unsafe.append(f"entry {dup} appears twice{spelled}, and zip readers disagree about which one counts")
            return
        check_zip_form(data, infos, start_dir, source)
        _check_sizes(infos, len(data), source, self.limits)
        roots = {n.split("/", 1)[0] if "/" in n else None for n in names}
        if None in roots or len(roots) != 1:
            # torch's reader needs one root folder; without it torch.export.load
            # falls back to its legacy zip reader, which unpickles unsafely.
            top = sorted(n for n in names if "/" not in n)[:3]
            self._foreign_top = top
            raise ModelFileError(f"{source}: {self.describe_foreign()}")
        root = roots.pop()
        ours = {n[len(root) + 1 :] for n in names}
        try:
            import torch

            self.reader = torch._C.PyTorchFileReader(io.BytesIO(data))
            torch_names = list(self.reader.get_all_records())
        except Exception as e:  # noqa: BLE001
            self.names, self._foreign_top = sorted(ours), []
            if layout()["ARCHIVE_FORMAT_PATH"] not in ours:
                raise ModelFileError(f"{source}: {self.describe_foreign()}") from None
            raise ModelFileError(f"{source}: not a readable torch archive ({one_line(e)})") from None
        if set(torch_names) != ours or len(torch_names) != len(ours):  # nothing is read through torch's reader
            result.unsafe.append("Python's zip reader and torch's disagree about the entries in the archive")
            self.reader = None
            return
        self.names = sorted(torch_names)
        self._infos = {i.filename[len(root) + 1 :]: i for i in infos}
        self.sizes = {name: i.file_size for name, i in self._infos.items()}

    def has(self, name: str) -> bool:
        return name in self.names

    def get(self, name: str) -> bytes | None:
        if name not in self.names:
            return None
        try:
            return bytes(self.reader.get_record(name))
        except Exception as e:  # noqa: BLE001
            raise ModelFileError(f"{self.source}: entry {name} is corrupted ({one_line(e)})") from None

    def get_small(self, name: str, limit: int = 64) -> bytes | None:
        """:meth:`get` of an entry ``torch.export.save`` writes a few bytes into (``archive_format``,
        ``archive_version``); one stating more than ``limit`` bytes is not read (readers inflate no more than an
        entry states) and reads as ``b"<N bytes>"``, which no expected value equals."""
        size = self.sizes.get(name, 0) if name in self.names else 0
        return f"<{size:,} bytes>".encode() if size > limit else self.get(name)

    def need(self, name: str) -> bytes:
        data = self.get(name)
        if data is None:
            raise ModelFileError(f"{self.source}: the archive lacks {name}")
        return data

    def check_json_values(self) -> None:
        """Refuse an archive whose JSON entries (the programs and payload configs ``torch.export.load`` parses
        into dataclasses, every ``.json``) hold more values than the load's work budget allows
        (:func:`bnfold.io.budget.json_values_allowed`), or whose text (those entries and the ``extra/`` ones, which
        it reads as strings) is more than the budget at :data:`bnfold.io.budget.JSON_TEXT_BYTES` a byte; both
        counted on the bytes before anything parses them, as they inflate (a MiB at a time: no entry is whole in
        memory)."""
        held = text = 0
        extra = layout()["EXTRA_DIR"]  # torch.export.load reads these as strings too
        for name in self.names:
            if name.endswith(".json") or name.startswith(extra):
                values, size = self._text_counts(name)
                held, text = held + (values if name.endswith(".json") else 0), text + size
        allowed, budget = json_values_allowed(self.file_size), Budget.for_content(self.file_size).bytes
        if held > allowed:
            raise WorkError(
                f"{self.source}: its JSON holds {held:,} values, over the {allowed:,} that the work budget of "
                f"{size_text(allowed * JSON_VALUE_BYTES)} allows loading at {size_text(JSON_VALUE_BYTES)} each; "
                f"{max_work_needed(held * JSON_VALUE_BYTES)}"
            )
        if text * JSON_TEXT_BYTES > budget:  # few values, long strings
            size, limit = sizes_text(text, budget // JSON_TEXT_BYTES)
            raise WorkError(
                f"{self.source}: its JSON is {size} of text, over the {limit} that the work budget of "
                f"{size_text(budget)} allows loading at {JSON_TEXT_BYTES} bytes a byte; "
                f"{max_work_needed(text * JSON_TEXT_BYTES)}"
            )

    def _text_counts(self, name: str) -> tuple[int, int]:
        """:func:`bnfold.io.limits.json_values` of entry ``name`` and its bytes as they inflate, read a MiB at a
        time (what the entry states of its size is not taken)."""
        values = size = 0
        try:
            with zipfile.ZipFile(io.BytesIO(self._data)) as zf, zf.open(self._infos[name]) as f:
                for chunk in iter(lambda: f.read(MIB), b""):
                    values, size = values + json_values(chunk), size + len(chunk)
        except (zipfile.BadZipFile, EOFError, ValueError, OSError, NotImplementedError) as e:
            raise ModelFileError(f"{self.source}: entry {name} is corrupted ({one_line(e)})") from None
        return values, size

    def describe_foreign(self) -> str:
        names = set(self.names)
        top = set(self._foreign_top)
        if "data.pkl" in names:
            return "a torch.save checkpoint, not a torch.export program (save one with torch.export.save)"
        if "constants.pkl" in names or any(n.startswith("code/") for n in names):
            return "a TorchScript archive, not a torch.export program (save one with torch.export.save)"
        if "version" in top or "serialized_exported_program.json" in top:
            return "a pre-2.7 torch.export archive or a foreign zip layout; re-save it with torch.export.save"
        return "not a torch.export .pt2 archive (no archive_format 'pt2' entry)"


def _check_sizes(infos: list[zipfile.ZipInfo], file_size: int, source: str, limits: Limits) -> None:
    """Refuse an archive whose entries unpack to more than the byte budget, or that inflate like a zip bomb."""
    budget = limits.byte_budget(file_size)
    total = sum(i.file_size for i in infos)
    if total > budget:
        raise ModelFileError(
            f"{source}: the archive unpacks to {total} bytes, over the limit of {budget}; {MAX_BYTES_HINT}"
        )
    for i in infos:
        limits.check_inflation(f"{source}: entry {i.filename!r}", i.file_size, i.compress_size)


def sniff(data: bytes) -> str:
    """What the first bytes of a file that is not a zip archive look like, for an error message."""
    head = data[:64]
    if head.startswith(b"\x80") and len(head) > 1 and head[1] <= 5:
        return "looks like a raw pickle"
    if head.startswith(b"\x08") or head[:1] in (b"\x0a", b"\x12", b"\x1a", b"\x3a", b"\x42"):
        return "looks like a protobuf (an .onnx model?)"
    try:
        head.decode("utf-8")
        return "looks like a text file"
    except UnicodeDecodeError:
        return "unrecognized binary data"
