"""Walking a program's JSON: every value of a key, every graph node; a short form of a value for messages."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any


def values_for_key(obj: Any, key: str) -> Iterator[Any]:
    stack = [obj]
    while stack:
        cur = stack.pop()
        if isinstance(cur, dict):
            for k, v in cur.items():
                if k == key:
                    yield v
                elif isinstance(v, (dict, list)):
                    stack.append(v)
        elif isinstance(cur, list):
            stack.extend(v for v in cur if isinstance(v, (dict, list)))


def dicts(obj: Any) -> Iterator[dict[str, Any]]:
    """Every dict in a JSON tree (iteratively: a deep file never reaches the recursion limit)."""
    stack = [obj]
    while stack:
        cur = stack.pop()
        if isinstance(cur, dict):
            yield cur
            stack.extend(v for v in cur.values() if isinstance(v, (dict, list)))
        elif isinstance(cur, list):
            stack.extend(v for v in cur if isinstance(v, (dict, list)))


def nodes(obj: Any) -> Iterator[dict[str, Any]]:
    stack = [obj]
    while stack:
        cur = stack.pop()
        if isinstance(cur, dict):
            if "target" in cur and "inputs" in cur and "outputs" in cur:
                yield cur
            stack.extend(v for v in cur.values() if isinstance(v, (dict, list)))
        elif isinstance(cur, list):
            stack.extend(v for v in cur if isinstance(v, (dict, list)))


def short(value: Any, n: int = 60) -> str:
    text = " ".join(repr(value).split())
    return text if len(text) <= n else text[: n - 3] + "..."
