"""A ``.pt2``'s JSON is counted before anything parses it (SECURITY.md, "Bounded work"): loading costs about 25 us and
up to 1 KiB per JSON value (BENCHMARKS.md part P), and a few bytes of file can state a value, so the values the
archive's JSON entries hold (``limits.json_values``, on their bytes) must fit the load's work budget
(``budget.json_values_allowed``) before bnfold's checks or ``torch.export.load`` parse them.  The command line's
refusal (exit 2, one line, bounded memory) is ``test_work.py``'s case ``pt2-json-values``."""

from __future__ import annotations

import json
import zipfile

import crafted as c
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import range_models
from bnfold.io.budget import (
    JSON_TEXT_BYTES,
    JSON_VALUE_BYTES,
    WorkError,
    json_values_allowed,
    max_work,
    max_work_needed,
    size_text,
    sizes_text,
)
from bnfold.io.limits import json_values
from bnfold.io.pt2 import inspection, load_pt2

#: the dims of the crafted program: 4 JSON values each, past the 262,144 values of a small file's budget
DIMS = 70_000
#: how far under its budget a real program's JSON must be
MARGIN = 8


def _held(path) -> int:
    with zipfile.ZipFile(path) as z:
        return sum(json_values(z.read(n)) for n in z.namelist() if n.endswith(".json"))


def _values(doc) -> int:
    """The values of a parsed JSON document (itself included)."""
    count, stack = 0, [doc]
    while stack:
        cur = stack.pop()
        count += 1
        stack.extend(cur.values() if isinstance(cur, dict) else cur if isinstance(cur, list) else ())
    return count


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner),
    max_leaves=40,
)


@given(_JSON, st.booleans())
def test_json_values_bounds_the_values_a_parser_makes(doc, compact):
    raw = json.dumps(doc, separators=(",", ":") if compact else None).encode()
    assert _values(json.loads(raw)) <= json_values(raw) + 1


@pytest.fixture(scope="module")
def many_dims(programs, tmp_path_factory):
    path = c.with_stated_dims(programs["conv_bn"], tmp_path_factory.mktemp("json") / "dims.pt2", DIMS)
    held = _held(path)
    assert held > json_values_allowed(path.stat().st_size) == 262_144, held
    return path, held


def _refusal_before_any_parse(path, monkeypatch) -> str:
    """``load_pt2(path)``'s ``WorkError``, every JSON parser (bnfold's checks', torch's) patched to fail: none ran."""
    parsed = []

    def parse(*args, **kwargs):
        parsed.append(args[:1])
        raise AssertionError("parsed")

    with monkeypatch.context() as m:
        for owner, name in ((json, "loads"), (inspection, "loads_json"), (torch.export, "load")):
            m.setattr(owner, name, parse)
        with pytest.raises(WorkError) as e:
            load_pt2(path)
    assert not parsed
    return str(e.value)


def test_a_program_whose_json_holds_more_values_than_its_budget_is_refused_before_any_parse(many_dims, monkeypatch):
    path, held = many_dims
    assert _refusal_before_any_parse(path, monkeypatch) == (
        f"{path}: its JSON holds {held:,} values, over the 262,144 that the work budget of 256 MiB allows loading at "
        f"1 KiB each; {max_work_needed(held * JSON_VALUE_BYTES)}"
    )


def test_max_work_allows_more_json_values(many_dims):
    path, held = many_dims
    with max_work(held * JSON_VALUE_BYTES):
        assert json_values_allowed(path.stat().st_size) == held
        assert inspection.inspect_pt2_bytes(path.read_bytes(), str(path)).safe
    with max_work(held * JSON_VALUE_BYTES - 1), pytest.raises(WorkError, match="--max-work"):
        inspection.inspect_pt2_bytes(path.read_bytes(), str(path))


@pytest.fixture(scope="module")
def stream(tmp_path_factory):
    """A deep program with small weights (24 blocks of RMSNorm and a 32x32 linear): many nodes per byte of file, the
    kind whose JSON comes nearest its budget (the library's programs: BENCHMARKS.md part P)."""
    model = range_models.ResidualStream(blocks=24).eval()
    x = torch.randn(*range_models.ResidualStream.shapes[0])
    return c.export(tmp_path_factory.mktemp("stream") / "stream.pt2", model, (x,))


@pytest.mark.parametrize("name", ["conv_bn", "dynamic", "dict_io", "stream"])
def test_a_real_programs_json_is_well_under_its_budget_and_loads(name, programs, stream):
    path = stream if name == "stream" else programs[name]
    held = _held(path)
    assert MARGIN * held <= json_values_allowed(path.stat().st_size), held
    assert isinstance(load_pt2(path), torch.export.ExportedProgram)


def test_the_count_reads_a_mib_of_json_at_a_time(programs, tmp_path):
    """An entry's values are counted as it inflates: the count never holds a whole entry (here 9 MB of JSON)."""
    import tracemalloc

    path = c.with_stated_dims(programs["conv_bn"], tmp_path / "long.pt2", 300_000)
    data = path.read_bytes()
    tracemalloc.start()
    try:
        with pytest.raises(WorkError):
            inspection.inspect_pt2_bytes(data, str(path))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(data) > 8 << 20 and peak < 3 << 20, (len(data), peak)


def test_each_json_entry_is_parsed_once(programs, monkeypatch):
    """The payload configs (weights, constants) are parsed once, not once for their records and once for pickles."""
    parsed = []
    real = inspection.loads_json

    def count(raw, where, *args, **kwargs):
        parsed.append(where)
        return real(raw, where, *args, **kwargs)

    monkeypatch.setattr(inspection, "loads_json", count)
    path = programs["conv_bn"]
    inspection.inspect_pt2_bytes(path.read_bytes(), str(path))
    assert any("weights_config" in w for w in parsed) and any("constants_config" in w for w in parsed), parsed
    assert len(parsed) == len(set(parsed)), parsed


def test_a_long_json_string_is_counted_by_its_bytes(programs, tmp_path, monkeypatch):
    """Few values, one long string (a node's ``stack_trace``): its text is charged :data:`JSON_TEXT_BYTES` a byte
    against the budget, before any parse (a 200 MiB string in a 4.3 MB file held 1.7 GiB at its load, counted as
    602 values).  Here a 1 MiB budget allows 128 KiB of text, and the string is 256 KiB."""
    entries = c.read_entries(programs["conv_bn"])
    name = f"{c.root_of(entries)}/models/model.json"
    doc = json.loads(entries[name])
    doc["graph_module"]["graph"]["nodes"][0].setdefault("metadata", {})["stack_trace"] = "a" * (256 << 10)
    entries[name] = json.dumps(doc).encode()
    path = c.write_entries(tmp_path / "long_string.pt2", entries)
    text = sum(len(v) for k, v in entries.items() if k.endswith(".json"))
    with max_work(1 << 20):
        assert _held(path) * JSON_VALUE_BYTES < 1 << 20  # its values alone fit
        assert _refusal_before_any_parse(path, monkeypatch) == (
            f"{path}: its JSON is {size_text(text)} of text, over the 128 KiB that the work budget of 1 MiB allows "
            f"loading at 8 bytes a byte; {max_work_needed(text * JSON_TEXT_BYTES)}"
        )
    with max_work(text * JSON_TEXT_BYTES):
        assert isinstance(load_pt2(path), torch.export.ExportedProgram)


def test_a_json_text_just_over_its_limit_says_each_number_once(programs, tmp_path, monkeypatch):
    """One byte over the 128 KiB of text a 1 MiB budget allows: both read "128 KiB" at three digits (the message said
    "its JSON is 128 KiB of text, over the 128 KiB ..."); where they would read the same they are said in bytes."""
    entries = c.read_entries(programs["conv_bn"])
    name = f"{c.root_of(entries)}/models/model.json"
    doc = json.loads(entries[name])
    allowed = (1 << 20) // JSON_TEXT_BYTES

    def text(trace: str) -> int:
        doc["graph_module"]["graph"]["nodes"][0].setdefault("metadata", {})["stack_trace"] = trace
        entries[name] = json.dumps(doc).encode()
        return sum(len(v) for k, v in entries.items() if k.endswith(".json"))

    text("a" * (allowed + 1 - text("")))  # one byte over
    path = c.write_entries(tmp_path / "just_over.pt2", entries)
    assert sum(len(v) for k, v in entries.items() if k.endswith(".json")) == allowed + 1
    with max_work(1 << 20):
        assert _refusal_before_any_parse(path, monkeypatch) == (
            f"{path}: its JSON is 131,073 bytes of text, over the 131,072 bytes that the work budget of 1 MiB allows "
            f"loading at 8 bytes a byte; {max_work_needed((allowed + 1) * JSON_TEXT_BYTES)}"
        )
    assert sizes_text(200 << 10, 128 << 10) == ("200 KiB", "128 KiB")  # apart at three digits: as before


def test_the_text_of_extra_files_is_counted_too(programs, tmp_path, monkeypatch):
    """``torch.export.load`` reads every ``extra/`` entry as a string: its bytes count with the JSON text (a 200 MiB
    ``extra/notes.txt`` in a 2.26 MB file loaded at 1.3 GB before, reviewer's run)."""
    entries = c.read_entries(programs["conv_bn"])
    entries[f"{c.root_of(entries)}/extra/notes.txt"] = b"b" * (256 << 10)
    path = c.write_entries(tmp_path / "extra.pt2", entries)
    with max_work(1 << 20):
        assert _refusal_before_any_parse(path, monkeypatch).startswith(f"{path}: its JSON is ")


def test_an_archive_version_entry_of_many_bytes_is_refused_unread(programs, tmp_path, monkeypatch):
    """``archive_version`` holds "0": one stating 1 MiB is refused from its stated size, never read (a 200 MiB one
    was read and decoded whole before its refusal: 1.3 GB of peak memory, reviewer's run)."""
    from bnfold.errors import ModelFileError
    from bnfold.io.pt2 import archive

    entries = c.read_entries(programs["conv_bn"])
    entries[f"{c.root_of(entries)}/archive_version"] = b"0" * (1 << 20)
    path = c.write_entries(tmp_path / "version.pt2", entries)
    read, real = [], archive.Archive.get
    monkeypatch.setattr(archive.Archive, "get", lambda self, name: read.append(name) or real(self, name))
    with pytest.raises(ModelFileError, match=r"pt2 archive version '<1,048,576 bytes>' is not supported"):
        load_pt2(path)
    assert "archive_version" not in read, read
