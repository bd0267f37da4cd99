"""A ``.pt2`` must be exactly the zip archive Python's ``zipfile`` lists before torch's reader sees it (SECURITY.md,
``io/pt2/zipform.py``): bnfold counts sizes, zip bombs and JSON values with ``zipfile``, and torch's reader (miniz)
finds entries its own way.  Each crafted file below shows the two readers, or a third one walking the local headers,
different archives; before the zip form was checked, torch inflated a 768 MiB entry that ``zipfile`` did not list, or
listed as 2 KiB, before the file was refused (as unsafe, or not at all), and a duplicate name reached torch's reader.
Now each is refused (exit 2, one line) before torch's reader opens the file, in a few MiB beyond the import."""

from __future__ import annotations

import crafted as c
import crafted_zip as z
import pytest
import torch

from bnfold.errors import ModelFileError
from bnfold.io.pt2 import check_pt2_bytes

#: the entry torch's reader would inflate in the crafted files, far past the 256 MiB byte budget of a small file
BIG = 768 << 20
#: peak resident memory of ``bnfold`` on the crafted files (torch's import: about 300 MiB; BIG inflated is more)
PEAK_MIB = 1024
FORM = "not laid out as torch.export.save writes a zip archive"
TWICE = "appears twice"


def _torch_only(e, root):
    """Torch's directory (at the offset the end record states) lists a 768 MiB JSON entry; zipfile's does not."""
    ms = [z.member(n, b) for n, b in e.items()]
    return z.two_directories(ms + [z.deflated_zeros(f"{root}/extra.json", BIG)], ms)


def _shadowed(e, root):
    """Both directories list the same names; torch's sample inputs are 768 MiB, zipfile's the real ones."""
    ms = [z.member(n, b) for n, b in e.items()]
    name = f"{root}/data/sample_inputs/model.pt"
    return z.two_directories([z.deflated_zeros(name, BIG) if m.name == name else m for m in ms], ms)


def _duplicate(first: bool):
    def build(e, root):
        ms = [z.member(n, b) for n, b in e.items()]
        extra = z.member(f"{root}/models/model.json", b"{}")
        return z.plain([extra, *ms] if first else [*ms, extra])

    return build


def _case(e, root):
    """Two names that differ in case only: torch's reader finds either for both."""
    return z.plain([z.member(f"{root}/models/MODEL.json", b"{}")] + [z.member(n, b) for n, b in e.items()])


def _appended(e, root):
    """A second archive after the first, its offsets its own: zipfile reads the second, torch's reader neither."""
    return z.plain([z.member(n, b) for n, b in e.items()]) + z.plain([z.member(n, b"{}") for n in e])


def _lying_descriptor(e, root):
    """Sizes only in data descriptors, which state 1 byte packed, 1 GiB unpacked."""
    return z.plain([z.member(n, b, descriptor=(1, 1 << 30)) for n, b in e.items()])


def _unlisted_local(e, root):
    """A 768 MiB entry's local record before the listed ones, no directory listing it (a reader that walks local
    headers, as a streaming unzip does, finds it)."""
    ms = [z.member(n, b) for n, b in e.items()]
    body, _, cd = z.archive(ms, head=z.deflated_zeros(f"{root}/extra.json", BIG).raw)
    return body + cd + z.end(len(ms), len(cd), len(body))


def _trailing(e, root):
    return z.plain([z.member(n, b) for n, b in e.items()]) + b"\0" * 64


def _zip64_astray(e, root):
    """A ZIP64 locator that points at byte 0, not at the ZIP64 end record right before it (which zipfile reads)."""
    data = z.plain([z.member(n, b) for n, b in e.items()], zip64=True)
    at = len(data) - 22 - 20 + 8  # the locator's offset of the record
    return data[:at] + bytes(8) + data[at + 8 :]


def _overlapping(e, root):
    """Two directory records pointing at one local record."""
    ms = [z.member(n, b) for n, b in e.items()]
    body, offsets, cd = z.archive(ms)
    cd += z.central(z.Member(f"{root}/more.json", b"", ms[0].crc, ms[0].csize, ms[0].usize, 0), offsets[0])
    return body + cd + z.end(len(ms) + 1, len(cd), len(body))


#: case -> (builder of the file's bytes from the program's entries and root folder, the words of its refusal)
CASES = {
    "torch-only entry": (_torch_only, FORM),
    "shadowed entry": (_shadowed, FORM),
    "duplicate first": (_duplicate(True), TWICE),
    "duplicate last": (_duplicate(False), TWICE),
    "names differing in case": (_case, TWICE),
    "appended archive": (_appended, FORM),
    "lying data descriptor": (_lying_descriptor, FORM),
    "unlisted local record": (_unlisted_local, FORM),
    "bytes after the end record": (_trailing, FORM),
    "overlapping records": (_overlapping, FORM),
    "ZIP64 record astray": (_zip64_astray, FORM),
}


@pytest.fixture(scope="module")
def files(programs, tmp_path_factory) -> dict[str, object]:
    d = tmp_path_factory.mktemp("zipform")
    entries = c.read_entries(programs["conv_bn"])
    root = c.root_of(entries)
    return {case: z.write(d / f"{i}.pt2", build(entries, root)) for i, (case, (build, _)) in enumerate(CASES.items())}


@pytest.mark.parametrize("case", list(CASES))
def test_a_zip_the_readers_may_see_differently_is_refused_before_torchs_reader_opens_it(case, files, monkeypatch):
    opened = []

    def reader(*args):
        opened.append(args)
        raise AssertionError("torch's reader opened the file")

    monkeypatch.setattr(torch._C, "PyTorchFileReader", reader)
    path = files[case]
    with pytest.raises(ModelFileError) as e:
        check_pt2_bytes(path.read_bytes(), str(path))
    assert CASES[case][1] in str(e.value) and "\n" not in str(e.value), str(e.value)
    assert not opened


def test_torchs_reader_and_zipfile_do_disagree_on_the_crafted_files(files):
    """The crafted files are what they claim: torch's reader lists (or reads) what zipfile does not."""
    import zipfile

    def listed(path):
        with zipfile.ZipFile(path) as zf:
            return sorted(i.filename.split("/", 1)[1] for i in zf.infolist()), sum(i.file_size for i in zf.infolist())

    names, size = listed(files["torch-only entry"])
    assert size < 1 << 20 and "extra.json" not in names
    assert "extra.json" in torch._C.PyTorchFileReader(str(files["torch-only entry"])).get_all_records()
    names, size = listed(files["shadowed entry"])
    assert size < 1 << 20
    stated = torch._C.PyTorchFileReader(str(files["shadowed entry"])).get_record_size("data/sample_inputs/model.pt")
    assert stated == BIG
    reader = torch._C.PyTorchFileReader(str(files["names differing in case"]))
    assert bytes(reader.get_record("models/MODEL.json")) == bytes(reader.get_record("models/model.json"))


def test_the_command_line_refuses_them_in_one_line_and_bounded_memory(files, tmp_path):
    argvs = [argv for path in files.values() for argv in (["check", path], ["fold", path, "-o", tmp_path / "o.pt2"])]
    runs = c.run_bnfold(tmp_path, *argvs)
    words = [CASES[case][1] for case in files for _ in range(2)]
    c.assert_case([(argv, (w,), r) for argv, w, r in zip(argvs, words, runs, strict=True)], PEAK_MIB)
    assert not (tmp_path / "o.pt2").exists()


def test_what_torch_export_save_writes_has_the_form(programs):
    for path in programs.values():
        check_pt2_bytes(path.read_bytes(), str(path))


@pytest.mark.parametrize("zip64", [False, True])
def test_a_zip_of_the_form_built_by_hand_is_accepted_and_loads(programs, tmp_path, zip64):
    """The form is the zip format's own, not one writer's bytes: the program's entries written by hand (no data
    descriptors, sizes in the local headers), the directory stated by a plain or a ZIP64 end record."""
    from bnfold.io.pt2 import load_pt2

    entries = c.read_entries(programs["conv_bn"])
    path = z.write(tmp_path / "m.pt2", z.plain([z.member(n, b) for n, b in entries.items()], zip64=zip64))
    assert check_pt2_bytes(path.read_bytes(), str(path)).safe
    assert isinstance(load_pt2(path), torch.export.ExportedProgram)
