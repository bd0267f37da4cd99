"""An ``.npz`` of inputs is a stranger's file (SECURITY.md): what it states (a member's ``.npy`` header shape, the zip's
sizes) sizes nothing.  A member's data must be exactly its header's elements times the itemsize, read in bounded
chunks and counted as it comes (a deflated one never past that size, nor past 200-fold the file's bytes); only
then do its elements count towards the work a model file is granted at load (``npz_elements`` of the arrays read;
a file refused grants nothing: the audit stops on it before the model is loaded)."""

from __future__ import annotations

import struct
import tracemalloc
import zipfile

import numpy as np
import pytest

from bnfold.errors import ModelFileError
from bnfold.io.limits import Limits
from bnfold.io.npz import npz_elements, read_npz


def _npy(shape: tuple, data: bytes, dtype: str = "<f4") -> bytes:
    """An ``.npy`` member: a version 1.0 header stating ``shape`` and ``dtype``, then ``data`` as given."""
    header = repr({"descr": dtype, "fortran_order": False, "shape": shape}).encode()
    header += b" " * (-(10 + len(header) + 1) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header + data


def _zip(path, members: dict, compression=zipfile.ZIP_STORED):
    with zipfile.ZipFile(path, "w", compression) as z:
        for name, raw in members.items():
            z.writestr(f"{name}.npy", raw)
    return path


@pytest.mark.parametrize(
    ("shape", "data", "words"),
    [
        ((1, 16, 512, 512), b"\0" * 4, "states 4194304 elements of float32 (16777216 bytes), its data holds 4"),
        ((2,), b"\0" * 400, "states 2 elements of float32 (8 bytes), its data holds more"),
        ((1 << 40,), b"\0" * 4, "states 4398046511104 bytes, over the limit of"),
        ((-2, -3), b"\0" * 24, "states the shape (-2, -3)"),
    ],
    ids=["header claims more", "header claims fewer", "header claims past the budget", "negative dims"],
)
@pytest.mark.parametrize("compression", [zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED], ids=["stored", "deflated"])
def test_a_header_that_is_not_its_data_grants_nothing_and_is_refused_in_one_line(
    tmp_path, shape, data, words, compression
):
    """Before: ``npz_elements`` counted the header's 4194304 elements (a model file then got their work at load),
    ``np.load`` sized its array from the header before the data was there, and ignored data past it."""
    path = _zip(tmp_path / "lie.npz", {"x": _npy(shape, data)}, compression)
    tracemalloc.start()
    try:
        with pytest.raises(ModelFileError) as e:
            read_npz(str(path))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert words in str(e.value) and "\n" not in str(e.value)
    assert peak < 4 << 20, peak  # nothing sized from the header (16 MiB, 4 TiB)


def test_an_honest_file_counts_and_reads_its_arrays(tmp_path):
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    y = np.asfortranarray(np.arange(6, dtype=np.int64).reshape(2, 3))
    for save in (np.savez, np.savez_compressed):
        save(tmp_path / "ok.npz", x=x, y=y, empty=np.zeros((0, 3), np.float16))
        arrays = read_npz(str(tmp_path / "ok.npz"))
        assert npz_elements(arrays) == 30
        assert set(arrays) == {"x", "y", "empty"}
        np.testing.assert_array_equal(arrays["x"], x)
        np.testing.assert_array_equal(arrays["y"], y)
        assert arrays["empty"].shape == (0, 3) and arrays["empty"].dtype == np.float16


def test_a_deflated_member_is_read_no_further_than_its_header_states(tmp_path):
    """A header stating 4 MiB over 96 MiB of zeros deflated into about 100 KB, stated as 1 MiB compressed (96-fold,
    under the 200-fold bound; a 1 MiB member after it gives zipfile the bytes): before, ``np.load`` read the
    header's 4 MiB and took the array, the 92 MiB after it unread and unseen.  Now the read stops one byte past
    the 4 MiB and refuses the file."""
    n = 24 << 20
    pad = np.random.default_rng(0).integers(0, 255, 1 << 20, np.uint8)
    bomb = _npy((1 << 20,), bytes(4 * n))
    path = tmp_path / "bomb.npz"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("x.npy", bomb, zipfile.ZIP_DEFLATED)
        z.writestr("pad.npy", _npy((1 << 20,), pad.tobytes(), "|u1"))
    raw = bytearray(path.read_bytes())
    at = raw.index(b"PK\x01\x02")  # x's entry in the central directory: its compressed size at +20
    raw[at + 20 : at + 24] = struct.pack("<I", 1 << 20)
    path.write_bytes(bytes(raw))
    with zipfile.ZipFile(path) as z:
        info = z.getinfo("x.npy")
        assert info.file_size // info.compress_size == 96 and len(raw) < (1 << 20) + 200_000
    tracemalloc.start()
    try:
        with pytest.raises(ModelFileError, match="'x' states 1048576 elements of float32 .* its data holds more"):
            read_npz(str(path))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20, peak


#: the one wording of the inflation bound, for an .npz as for a .pt2 (tests/security/test_bounded.py's zip bomb)
RATIO = r"entry 'x.npy' inflates [0-9]+-fold \(at most 200-fold for entries over 1 MiB\); refused as a zip bomb$"


def test_the_bound_counted_on_the_inflated_bytes_says_so_in_the_same_words():
    """zipfile stops a member at its stated size, so the count as the bytes come (``_member``) backs the stated
    check up; its refusal is the same line, the fold a lower bound ("over")."""
    with pytest.raises(ModelFileError, match=RATIO.replace("inflates ", "inflates over ")):
        Limits().check_inflation("in.npz: entry 'x.npy'", (1 << 20) + 1, 1000, counted=True)
    Limits().check_inflation("in.npz: entry 'x.npy'", 1 << 20, 1, counted=True)  # 1 MiB inflates freely


def test_a_zip_bomb_stating_its_ratio_is_refused_before_it_inflates(tmp_path):
    n = 24 << 20
    path = _zip(tmp_path / "bomb.npz", {"x": _npy((n,), bytes(4 * n))}, zipfile.ZIP_DEFLATED)
    with pytest.raises(ModelFileError, match=RATIO):
        read_npz(str(path))


@pytest.mark.parametrize(
    ("members", "words"),
    [
        ({"notes.txt": b"hi"}, "member 'notes.txt' is not an .npy array"),
        ({"x.npy": _npy((1,), b"\0" * 8, "|O")}, "dtype object"),
    ],
    ids=["not an array", "objects"],
)
def test_a_member_that_is_no_numeric_array_is_refused(tmp_path, members, words):
    path = tmp_path / "odd.npz"
    with zipfile.ZipFile(path, "w") as z:
        for name, raw in members.items():
            z.writestr(name, raw)
    with pytest.raises(ModelFileError, match=words):
        read_npz(str(path))


def test_a_header_stating_a_huge_length_is_refused_before_it_is_read(tmp_path):
    """A version 2.0 header may state a length of up to 4 GiB; numpy's reader reads (and inflates) all of it
    before it refuses one over its limit.  bnfold reads the length itself and refuses it first (here a length
    just over the limit: numpy's own refusal, after the read, words it otherwise)."""
    n = 20000
    raw = b"\x93NUMPY\x02\x00" + struct.pack("<I", n) + b" " * n
    path = _zip(tmp_path / "header.npz", {"x": raw})
    with pytest.raises(ModelFileError, match=f"array 'x' has a header of {n} bytes"):
        read_npz(str(path))


def test_a_member_stating_more_compressed_bytes_than_the_file_has_is_refused_by_its_ratio(tmp_path):
    """The ratio a member states is counted against the file's real size when its stated compressed size is
    larger: 24 MiB of zeros deflated to a few KiB, whose central directory claims 4 MiB compressed."""
    n = 24 << 20
    path = _zip(tmp_path / "lie.npz", {"x": _npy((n // 4,), bytes(n))}, zipfile.ZIP_DEFLATED)
    data = bytearray(path.read_bytes())
    at = data.rindex(b"PK\x01\x02")  # the one member's central directory record
    data[at + 20 : at + 24] = struct.pack("<I", 4 << 20)
    path.write_bytes(bytes(data))
    with pytest.raises(ModelFileError, match=RATIO):
        read_npz(str(path))
