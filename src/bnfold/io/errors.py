"""One-line error text: the single helper every bnfold message goes through."""

from __future__ import annotations

import os

from ..errors import BnfoldError

_LIMIT = 300  # characters kept of a library's message


def one_line(what: BaseException | str) -> str:
    """``what`` as one line of text.

    An exception (usually from a library) gives its first non-empty line, cut
    to 300 characters, or its type name when it has no text.  A string (a
    message bnfold wrote) is kept whole, with line breaks and runs of spaces
    collapsed.
    """
    if isinstance(what, BaseException):
        lines = [ln.strip() for ln in str(what).splitlines() if ln.strip()]
        first = lines[0] if lines and lines[0] != "None" else type(what).__name__
        return first if len(first) <= _LIMIT else first[: _LIMIT - 3] + "..."
    return " ".join(str(what).split()) or "unknown error"


def naming(err: BnfoldError, path: str) -> BnfoldError:
    """The same error as one line, with ``path`` in front when the message does not name the file, nor starts with
    the file at fault (``ModelFileError.names_file``)."""
    msg = one_line(str(err))
    if getattr(err, "names_file", False) or path in msg or os.path.basename(path) in msg:
        return type(err)(msg)
    return type(err)(f"{path}: {msg}")
