"""The fold report: what was folded, what was skipped and why.  Data, not log lines."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class Folded:
    """One normalization (or affine chain) folded into a neighbouring layer.

    ``norm`` names the normalization (module path where the format has one,
    otherwise the node name); ``into`` names the layer it was folded into;
    ``pattern`` is e.g. ``"conv+batch_norm"``; ``side`` is ``"output"`` when
    the normalization followed the layer and ``"input"`` when it preceded it.
    ``extra_bytes`` counts the bytes added by a private copy of a shared weight.
    """

    norm: str
    into: str
    pattern: str
    side: str = "output"
    extra_bytes: int = 0
    node: str = ""


@dataclass
class Skipped:
    """A normalization left in the model, with the reason it was not folded."""

    norm: str
    reason: str
    producer: str = ""
    node: str = ""


@dataclass
class FoldReport:
    folded: list[Folded] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)

    @property
    def extra_bytes(self) -> int:
        return sum(f.extra_bytes for f in self.folded)

    def to_dict(self) -> dict[str, Any]:
        return {
            "folded": [asdict(f) for f in self.folded],
            "skipped": [asdict(s) for s in self.skipped],
            "summary": {
                "folded": len(self.folded),
                "skipped": len(self.skipped),
                "extra_bytes": self.extra_bytes,
            },
        }

    def table(self) -> str:
        """A short human-readable table."""
        lines = [f"folded {len(self.folded)}, skipped {len(self.skipped)}"]
        for f in self.folded:
            extra = f"  (+{f.extra_bytes} bytes for a private weight copy)" if f.extra_bytes else ""
            lines.append(f"  folded   {f.norm:<28} into {f.into:<24} {f.pattern} [{f.side}]{extra}")
        for s in self.skipped:
            lines.append(f"  skipped  {s.norm:<28} {s.reason}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()


@dataclass
class FoldResult:
    """``model`` is the folded model, of the same kind as the input."""

    model: Any
    report: FoldReport
