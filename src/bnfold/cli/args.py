"""Reading the parsed arguments: options absent unless given, and the repeatable comma lists."""

from __future__ import annotations

import argparse
from typing import Any


def opt(args: argparse.Namespace, name: str) -> Any:
    """An option that is absent unless given (``False`` then)."""
    return getattr(args, name, False)


def comma_list(values) -> tuple[str, ...]:
    """A repeatable option of comma-separated items (``--exclude 'a.*,b' --exclude c``) as one tuple."""
    return tuple(p.strip() for value in values or () for p in value.split(",") if p.strip())
