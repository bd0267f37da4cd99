"""``--json`` output: strict JSON on stdout, non-finite floats as strings."""

from __future__ import annotations

import json
import math
from typing import Any

from .. import __version__


def finite(obj: Any) -> Any:
    """Strict JSON: non-finite floats become "inf" / "-inf" / "nan" (the numerics' convention)."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v) for v in obj]
    return obj


def json_text(payload: Any) -> str:
    return json.dumps(finite(payload), indent=2, default=str, allow_nan=False)


def print_json(payload: Any) -> None:
    print(json_text(payload))


def versioned(**fields: Any) -> dict[str, Any]:
    """A JSON payload's head: the bnfold version, then ``fields``."""
    return {"bnfold_version": __version__, **fields}
