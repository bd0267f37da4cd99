"""Channel 3: a pickle is loaded only if ``torch.load(..., weights_only=True)`` loads it as it is.

The payload below uses only globals on torch's ``weights_only`` allowlist
(``collections.Counter``), so scanning globals passes it; but it is not a valid
weights-only pickle (a BUILD on a class), so torch's loader would retry with
``weights_only=False``, which sets an attribute on the ``Counter`` class (the
issue's payload did the same to a torch class).
bnfold tries ``weights_only=True`` itself first and refuses the file.
"""

from __future__ import annotations

import io
import zipfile

import crafted as c

# GLOBAL collections.Counter; BUILD (None, {"bnfold_pwned": 1}): setattr on the class
MUTATING_PICKLE = b"\x80\x02ccollections\nCounter\nq\x00N}q\x01X\x0c\x00\x00\x00bnfold_pwnedq\x02K\x01s\x86q\x03b."


def _with_pickle(blob: bytes, pickle: bytes) -> bytes:
    """A torch.save archive with its data.pkl replaced."""
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(blob)) as zin, zipfile.ZipFile(out, "w") as zout:
        for info in zin.infolist():
            data = pickle if info.filename.endswith("/data.pkl") else zin.read(info)
            zout.writestr(info, data)
    return out.getvalue()


def test_pickle_of_allowed_globals_that_needs_the_unsafe_fallback_is_refused(programs, tmp_path):
    entries = c.read_entries(programs["conv_bn"])
    name = f"{c.root_of(entries)}/data/sample_inputs/model.pt"
    entries[name] = _with_pickle(entries[name], MUTATING_PICKLE)
    bad = c.write_entries(tmp_path / "bad.pt2", entries)
    runs = c.run_bnfold(
        tmp_path,
        ["fold", bad, "-o", tmp_path / "out.pt2"],
        ["check", bad],
        ["audit", bad, "--random", "1"],
        control=[str(bad)],
    )
    for r in runs[:3]:
        c.assert_refused(r, "bad.pt2", "refusing to load", "weights_only=True")
    assert not (tmp_path / "out.pt2").exists()
    assert runs[3]["marker"], "control: plain torch.export.load did not fall back and mutate the class"
