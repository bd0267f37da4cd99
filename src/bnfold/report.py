"""The fold report: what was folded, what was skipped and why.  Data, not log lines."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class Folded:
    """One normalization (or affine chain) folded into a neighbouring layer.

    ``norm`` names the normalization (module path where the format has one,
    otherwise the node name); ``into`` names the layer it was folded into the
    same way (``features.3.1.block.0`` for torch programs, the node name for
    ONNX) and ``into_node`` is that layer's graph node; ``pattern`` is e.g.
    ``"conv+batch_norm"``; ``side`` is ``"output"`` when the normalization
    followed the layer and ``"input"`` when it preceded it.  ``extra_bytes``
    counts the bytes added by a private copy of a shared weight; ``node`` is
    the normalization's graph node.
    """

    norm: str
    into: str
    pattern: str
    side: str = "output"
    extra_bytes: int = 0
    node: str = ""
    into_node: str = ""


@dataclass
class Merged:
    """Parallel branches that read one value and were summed, merged into one conv (structural
    re-parameterization).  ``into`` names the conv that now computes the sum (``into_node`` its graph
    node), ``branches`` each branch (a conv, ``identity``, an average pool; a normalization on it in
    brackets), ``pattern`` the sum (``conv3x3+conv1x1+identity``), ``node`` the node whose value the
    conv now holds (the last add) and ``norms`` the normalizations folded on the way."""

    into: str
    branches: list
    pattern: str
    node: str = ""
    into_node: str = ""
    norms: list = field(default_factory=list)


@dataclass
class Skipped:
    """A normalization left in the model, with the reason it was not folded."""

    norm: str
    reason: str
    producer: str = ""
    node: str = ""


@dataclass
class Lowered:
    """A batch norm that could not fold, rewritten as ``x * scale + shift`` with constants computed
    in float64 from the model's own eps (``lower_unfoldable=True``); ``reason`` is why it did not fold."""

    norm: str
    reason: str
    node: str = ""


@dataclass
class FoldStats:
    """Sizes of the model before and after the fold, and the time the fold took (``bnfold.fold`` fills it)."""

    nodes_before: int = 0
    nodes_after: int = 0
    params_before: int = 0
    params_after: int = 0
    bytes_before: int = 0
    bytes_after: int = 0
    seconds: float = 0.0

    @property
    def nodes_removed(self) -> int:
        return self.nodes_before - self.nodes_after

    @property
    def params_saved(self) -> int:
        return self.params_before - self.params_after

    @property
    def bytes_saved(self) -> int:
        return self.bytes_before - self.bytes_after

    def to_dict(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "nodes_removed": self.nodes_removed,
            "params_saved": self.params_saved,
            "bytes_saved": self.bytes_saved,
        }


@dataclass
class FoldReport:
    """``folded`` and ``skipped`` entries, ``notes`` (what the API did on your behalf, e.g. folding an
    eval-mode copy of a module in training mode) and ``stats`` (sizes and time, when measured)."""

    folded: list[Folded] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    lowered: list[Lowered] = field(default_factory=list)
    stats: FoldStats | None = None
    merged: list[Merged] = field(default_factory=list)

    @property
    def extra_bytes(self) -> int:
        return sum(f.extra_bytes for f in self.folded)

    def to_dict(self) -> dict[str, Any]:
        summary: dict[str, Any] = {
            "folded": len(self.folded),
            "skipped": len(self.skipped),
            "lowered": len(self.lowered),
            "merged": len(self.merged),
            "extra_bytes": self.extra_bytes,
        }
        if self.stats is not None:
            summary.update(self.stats.to_dict())
        return {
            "folded": [asdict(f) for f in self.folded],
            "skipped": [asdict(s) for s in self.skipped],
            "lowered": [asdict(x) for x in self.lowered],
            "merged": [asdict(m) for m in self.merged],
            "notes": list(self.notes),
            "summary": summary,
        }

    def summary_line(self) -> str:
        """One line: folded / skipped, then nodes removed, parameters and bytes saved and time when measured."""
        line = f"folded {len(self.folded)}, skipped {len(self.skipped)}"
        if self.lowered:
            line += f", lowered {len(self.lowered)}"
        if self.stats is not None:
            s = self.stats
            line += (
                f"; removed {s.nodes_removed} nodes, saved {s.params_saved} parameters"
                f" ({_bytes(s.bytes_saved)}) in {s.seconds:.2f} s"
            )
        return line

    def table(self) -> str:
        """A short human-readable table."""
        lines = [
            f"folded {len(self.folded)}, skipped {len(self.skipped)}"
            + (f", lowered {len(self.lowered)}" if self.lowered else "")
        ]
        lines += [f"  note: {n}" for n in self.notes]
        width = max([28] + [len(e.norm) for e in (*self.folded, *self.skipped, *self.lowered)])
        into = max([24] + [len(f.into) for f in self.folded])
        for f in self.folded:
            extra = f"  (+{f.extra_bytes} bytes for a private weight copy)" if f.extra_bytes else ""
            lines.append(f"  folded   {f.norm:<{width}} into {f.into:<{into}} {f.pattern} [{f.side}]{extra}")
        for s in self.skipped:
            lines.append(f"  skipped  {s.norm:<{width}} {s.reason}")
        for x in self.lowered:
            lines.append(f"  lowered  {x.norm:<{width}} to mul + add ({x.reason})")
        for m in self.merged:
            lines.append(f"  merged   {' + '.join(m.branches)} into {m.into} ({m.pattern})")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()


def _bytes(n: int) -> str:
    """``n`` bytes in B / KiB / MiB, for the summary line."""
    for unit, size in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


@dataclass
class FoldResult:
    """``model`` is the folded model, of the same kind as the input."""

    model: Any
    report: FoldReport
