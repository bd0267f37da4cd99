"""Argument types of ``bnfold``'s options: each parses one command-line string or raises
``argparse.ArgumentTypeError`` with the message argparse shows."""

from __future__ import annotations

import argparse

from .constants import ONLY_KINDS


def kinds(text: str) -> tuple[str, ...]:
    """``--only conv,batch_norm``: layer and normalization kinds."""
    found = tuple(k.strip() for k in text.split(",") if k.strip())
    unknown = [k for k in found if k not in ONLY_KINDS]
    if unknown or not found:
        raise argparse.ArgumentTypeError(
            f"unknown kind(s) {', '.join(unknown) or repr(text)}; choose from {','.join(ONLY_KINDS)}"
        )
    return found


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a number >= 1, got {value}")
    return value


def byte_size(text: str) -> int:
    """``--max-work`` / ``--max-bytes``: bytes as people write them (``1e9``, ``4GiB``, ``512M``, a whole number)."""
    from ..io.budget import parse_bytes

    try:
        return parse_bytes(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive finite number, got {text}")
    return value
