"""The fold report: what was folded, what was skipped and why.  Data, not log lines.

Every skip, every lowering and every kept elementwise op carries a :class:`Code` next to
its English ``reason``: tools (``check``, the audit, the CLI) and tests read the code,
people read the reason.  Every :class:`Folded` entry carries the edit it made: the
``rule`` that made it, the chain's ``steps`` (each node with what happened to it) and the
``layers`` written.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from enum import Enum
from typing import Any


class Code(str, Enum):
    """Why something was not folded (str-valued: ``to_dict()`` stays JSON)."""

    # a normalization that can never fold
    TRAINING_MODE = "training_mode"  #: runs in training mode (torch training=True, ONNX is_test=0 / training_mode=1)
    BATCH_STATISTICS = "batch_statistics"  #: no running statistics (track_running_stats=False)
    UNSUPPORTED_NORM = "unsupported_norm"  #: a normalization node bnfold does not read (wrong inputs)
    NOT_PER_CHANNEL = "not_per_channel"  #: its affine / the op's constant is not one value per channel
    STATISTICS_USED = "statistics_used"  #: its saved-statistics outputs have users
    OUTPUT_UNUSED = "output_unused"  #: its normalized output has no user
    IN_FUNCTION = "in_function"  #: inside an ONNX model-local function that was not inlined
    CONSTANT_NORM = "constant_norm"  #: it normalizes a constant with batch statistics (weight standardization)
    # where it sits
    NO_LAYER = "no_layer"  #: no conv / transposed conv / linear next to it
    SHARED_VALUE = "shared_value"  #: the value between it and the layer has other users
    FANOUT_NOT_ALL_LAYERS = "fanout_not_all_layers"  #: its output also feeds something that is not a layer
    FANOUT_CHANNELS = "fanout_channels"  #: the layers it feeds read it with different channels
    NOT_ITS_INPUT = "not_its_input"  #: it reads the layer's value as a parameter, not as its data input
    RANK_UNKNOWN = "rank_unknown"  #: the rank of the tensor is unknown
    AXIS_MISMATCH = "axis_mismatch"  #: it acts on another axis than the layer's channels
    AXIS_LOST = "axis_lost"  #: a reshape between it and the layer moves or merges the channel axis
    BROADCAST = "broadcast"  #: its constant broadcasts the tensor to another rank or dtype
    NOT_CONSTANT = "not_constant"  #: a parameter of it is computed at run time
    CHANNEL_MISMATCH = "channel_mismatch"  #: its channel count differs from the layer's
    # the layer
    LAYER_WEIGHTS = "layer_weights"  #: the layer's weight or bias is not a usable constant
    LAYER_SHAPE = "layer_shape"  #: the layer's weight shape / groups do not describe its channels
    # the fold arithmetic (bnfold.fold_math)
    CAST_RANGE = "cast_range"  #: a folded value overflows or underflows the parameter dtype
    SHIFT_PADDING = "shift_padding"  #: a shift before a padded conv does not fold exactly (padding sees it)
    SHIFT_TRANSPOSED = "shift_transposed"  #: a shift before a transposed conv does not fold exactly
    NOT_FINITE = "not_finite"  #: a parameter holds NaN or inf
    UNDEFINED = "undefined"  #: running_var + eps <= 0
    DTYPE = "dtype"  #: a parameter that is not floating point
    NOT_AFFINE = "not_affine"  #: the op is not an affine map of the tensor (``c - x`` is, ``c / x`` is not)
    NEGATIVE_SCALE = "negative_scale"  #: a scale that would move through a max (max-pool) is negative somewhere
    FOLD_MATH = "fold_math"  #: any other fold-math refusal
    # structural re-parameterization (``bnfold.engine.reparam``): summed branches that stay apart
    # (a ``kept_ops`` note on the sum's last add)
    MERGE_ACTIVATION = "merge_activation"  #: an op that is not affine (an activation) inside a branch
    MERGE_SHARED = "merge_shared"  #: a branch's value has a reader outside the sum (or an in-place add writes into one)
    MERGE_INPUTS = "merge_inputs"  #: the branches read different values
    MERGE_GEOMETRY = "merge_geometry"  #: different strides / dilations / groups / shapes, or no covering kernel
    MERGE_PADDING = "merge_padding"  #: the branches' paddings do not align (they see different windows)
    MERGE_POOL = "merge_pool"  #: an average pool that is no conv kernel (count_include_pad=False, ceil_mode, ...)
    # the fp16 range rewrite (``fold(..., fp16_range=batches)``, ``bnfold.engine.range``)
    RESCALED = "rescaled"  #: a value scaled by a power of two, exactly, with its margin met
    MARGIN_NOT_MET = "margin_not_met"  #: rescaled (its peak lowered, exactly), but not to the target with its margin
    NO_ABSORBER = "no_absorber"  #: the op that makes the value overflows itself: nothing before it takes a scale
    NONLINEAR_READER = "nonlinear_reader"  #: a reader with no exact scale rule (softmax, exp) reads it too large
    SCALE_CONFLICT = "scale_conflict"  #: the value's readers and writers ask for different scales of one value
    LIMIT_BOUND = "limit_bound"  #: every scale that lowers the peak pushes another value or constant past a limit
    REGION_LIMIT = "region_limit"  #: its region passes the planner's bounds (values, steps, the graph's work budget)
    INEXACT = "inexact"  #: the float64 proof found the rewritten model differs (relative error > 1e-6): not applied
    # requests
    EXCLUDED = "excluded"  #: excluded by ``exclude`` (``--exclude``)
    NOT_REQUESTED = "not_requested"  #: its kind, or its layer's kind, is not in ``only``


#: The reason of a :attr:`Code.CONSTANT_NORM` skip, in every IR (the torch and the ONNX adapters).
CONSTANT_NORM_REASON = (
    "it normalizes a constant (weight standardization): its result is a constant, computed once into "
    "the layer it feeds, and here it feeds no layer alone"
)


@dataclass
class FoldStep:
    """One node of a folded chain: ``node`` (its graph node name), ``op`` and ``action``:
    ``"removed"`` (taken out of the graph), ``"affine_removed"`` (a LayerNorm-like node that
    stays and lost its weight and bias) or ``"kept"`` (a shape-only hop the chain went through)."""

    node: str
    op: str
    action: str = "removed"


@dataclass
class Folded:
    """One normalization (or affine chain) folded into a neighbouring layer.

    ``norm`` names the normalization (module path where the format has one,
    otherwise the node name); ``into`` names the layer it was folded into the
    same way (``features.3.1.block.0`` for torch programs, the node name for
    ONNX) and ``into_node`` is that layer's graph node; ``pattern`` is e.g.
    ``"conv+batch_norm"``; ``side`` is ``"output"`` when the normalization
    followed the layer, ``"input"`` when it preceded it and ``"weight"`` when it
    normalized the layer's weight (weight standardization, rule ``"constant"``).  ``extra_bytes``
    counts the bytes added by a private copy of a shared weight; ``node`` is
    the normalization's graph node.

    The edit itself: ``rule`` is the engine rule that made it (``"output"``,
    ``"input"``, ``"fanout"``, ``"merge"``, ``"constant"``); ``steps`` every node of the folded chain in graph
    order with what happened to it (:class:`FoldStep`; the same list object on every entry of one chain, not a
    copy: :meth:`FoldReport.to_dict` writes it once per chain); ``layers`` the graph node names of the layers whose
    weight and bias were written (several for ``"fanout"``); ``bias_added`` is True when the layer could not hold
    the bias and an add node was inserted.
    ``kind`` is the normalization's kind (``bnfold.kinds.NORM_KINDS``), or ``""`` for a chain of
    elementwise ops alone (``norm`` is then ``"affine mul+add"`` or the ops' module path).
    """

    norm: str
    into: str
    pattern: str
    side: str = "output"
    extra_bytes: int = 0
    node: str = ""
    into_node: str = ""
    rule: str = ""
    steps: list[FoldStep] = field(default_factory=list)
    layers: list[str] = field(default_factory=list)
    bias_added: bool = False
    kind: str = ""

    @property
    def removed(self) -> list[str]:
        """The graph node names this fold took out of the graph."""
        return [s.node for s in self.steps if s.action == "removed"]


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
    """A normalization left in the model, with the reason it was not folded and its :class:`Code`."""

    norm: str
    reason: str
    producer: str = ""
    node: str = ""
    code: Code = Code.FOLD_MATH


@dataclass
class Lowered:
    """A batch norm that could not fold, rewritten as ``x * scale + shift`` with constants computed
    in float64 from the model's own eps (``lower_unfoldable=True``); ``reason`` (and ``code``) is why
    it did not fold."""

    norm: str
    reason: str
    node: str = ""
    code: Code = Code.FOLD_MATH


@dataclass
class KeptOp:
    """An elementwise affine op that is not a normalization (a residual add, a hardswish ``/6``) that a
    rule tried to fold and that stays: a note, never a skipped normalization (``check --strict`` ignores it)."""

    op: str
    reason: str
    node: str = ""
    code: Code = Code.FOLD_MATH


@dataclass
class Rescaled:
    """A value found too large for fp16 on the calibration batches (``fold(..., fp16_range=batches)``) and what
    was done: scaled by ``factor`` (a power of two; 1.0 when refused) with every writer and reader of the scaled
    values compensating exactly (``kind``: ``linear_map``, ``cross_layer``, ``norm``, ``residual``,
    ``reduction``, ``constant``), or why not (``reason``, ``code``).  ``nodes``: the nodes edited; ``peak`` /
    ``peak_after``: its largest magnitude in float32 before and after; ``limit``: the limit it is measured
    against; ``margin``: ``limit / peak_after``, the margin reached; ``muls``: multiplies inserted where no
    layer or constant could take the factor."""

    value: str
    nodes: list = field(default_factory=list)
    factor: float = 1.0
    kind: str = ""
    reason: str = ""
    code: Code = Code.RESCALED
    peak: float = 0.0
    peak_after: float = 0.0
    limit: float = 65504.0
    margin: float = 0.0
    muls: int = 0


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
    """``folded`` and ``skipped`` entries (``skipped``: normalizations only), ``notes`` (what the API did
    on your behalf, e.g. folding an eval-mode copy of a module in training mode), ``kept_ops``
    (elementwise affine ops that are not normalizations and stay, with the reason: a sum whose branches
    do not merge is one, with a ``MERGE_*`` code), ``merged`` (summed branches merged into one conv,
    :class:`Merged`), ``unmatched`` (each ``exclude`` pattern that matched nothing and each ``only`` kind the model
    has none of, a sentence each: ``bnfold fold`` refuses them) and ``stats`` (sizes and time, when measured)."""

    folded: list[Folded] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    lowered: list[Lowered] = field(default_factory=list)
    stats: FoldStats | None = None
    kept_ops: list[KeptOp] = field(default_factory=list)
    merged: list[Merged] = field(default_factory=list)
    rescaled: list[Rescaled] = field(default_factory=list)
    unmatched: list[str] = field(default_factory=list)

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
        if self.rescaled:  # a fold with fp16_range that found values too large: how many it rescaled
            summary["rescaled"] = sum(r.factor != 1.0 for r in self.rescaled)
        if self.stats is not None:
            summary.update(self.stats.to_dict())
        return {
            "folded": folded_dicts(self.folded),
            "skipped": [entry_dict(s) for s in self.skipped],
            "lowered": [entry_dict(x) for x in self.lowered],
            "kept_ops": [entry_dict(k) for k in self.kept_ops],
            "merged": [entry_dict(m) for m in self.merged],
            "rescaled": [entry_dict(r) for r in self.rescaled],
            "notes": list(self.notes),
            "unmatched": list(self.unmatched),
            "summary": summary,
        }

    def summary_line(self) -> str:
        """One line: folded / skipped, then nodes removed, parameters and bytes saved and time when measured."""
        line = f"folded {len(self.folded)}, skipped {len(self.skipped)}"
        if self.lowered:
            line += f", lowered {len(self.lowered)}"
        if self.merged:
            line += f", merged {len(self.merged)}"
        if self.rescaled:
            line += f", rescaled {sum(r.factor != 1.0 for r in self.rescaled)} of {len(self.rescaled)} too large"
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
            + (f", merged {len(self.merged)}" if self.merged else "")
        ]
        lines += [f"  note: {n}" for n in self.notes]
        lines += [f"  unmatched: {u}" for u in self.unmatched]
        width = max([28] + [len(e.norm) for e in (*self.folded, *self.skipped, *self.lowered)])
        into = max([24] + [len(f.into) for f in self.folded])
        for f, j in zip(self.folded, chain_heads(self.folded)):  # a chain's pattern once: the others name its first
            extra = f"  (+{f.extra_bytes} bytes for a private weight copy)" if f.extra_bytes else ""
            head = self.folded[j]
            pattern = f.pattern if head is f or f.pattern != head.pattern else f"(the chain of {head.norm})"
            lines.append(f"  folded   {f.norm:<{width}} into {f.into:<{into}} {pattern} [{f.side}]{extra}")
        for s in self.skipped:
            lines.append(f"  skipped  {s.norm:<{width}} {s.reason}")
        for x in self.lowered:
            lines.append(f"  lowered  {x.norm:<{width}} to mul + add ({x.reason})")
        for k in self.kept_ops:
            lines.append(f"  kept     {k.op:<{width}} {k.reason}")
        for m in self.merged:
            lines.append(f"  merged   {' + '.join(m.branches)} into {m.into} ({m.pattern})")
        for r in self.rescaled:
            done = f"x{r.factor:g} ({r.kind}), peak {r.peak:.4g} -> {r.peak_after:.4g}" if r.factor != 1.0 else "kept"
            lines.append(f"  rescaled {r.value:<{width}} {done}, margin {r.margin:.3g}x [{r.code.value}] {r.reason}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()


def entry_dict(entry: Any, omit: tuple[str, ...] = ()) -> dict[str, Any]:
    """A report entry as plain JSON data (a :class:`Code` becomes its string value), without the fields ``omit``
    (not read either)."""
    out = asdict(replace(entry, **dict.fromkeys(omit)) if omit else entry)
    for key in omit:
        del out[key]
    for key, value in out.items():
        if isinstance(value, Enum):
            out[key] = value.value
    return out


def folded_dicts(entries: list[Folded]) -> list[dict[str, Any]]:
    """:class:`Folded` entries as JSON data, each chain written once: the first entry of a chain has its ``steps``
    and ``pattern``; an entry whose ``steps`` are those of an earlier one (the same list: one chain, several
    normalizations) has ``chain_of``, that entry's index in ``entries``, in place of its ``steps``, and in place of
    its ``pattern`` where it is that entry's too.  A chain of n normalizations is n entries of constant size plus
    the chain once, not n copies of it."""
    out = []
    for i, (f, j) in enumerate(zip(entries, chain_heads(entries))):
        if j == i:
            out.append(entry_dict(f))
        else:
            omit = ("steps", "pattern") if f.pattern == entries[j].pattern else ("steps",)
            out.append({**entry_dict(f, omit), "chain_of": j})
    return out


def chain_heads(entries: list[Folded]) -> list[int]:
    """For each entry, the index of the first entry of its chain (the first whose ``steps`` are the same list; its
    own index for the first, or for an entry without steps)."""
    first: dict[int, int] = {}  # id of a chain's steps -> the index of its first entry
    return [first.setdefault(id(f.steps), i) if f.steps else i for i, f in enumerate(entries)]


def _bytes(n: int) -> str:
    """``n`` bytes in B / KiB / MiB, for the summary line."""
    for unit, size in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


@dataclass
class FoldResult:
    """``model`` is the folded model: of the same kind as the input (an ExportedProgram, an ONNX
    ModelProto), except for an ``nn.Module`` input, whose folded model is the ``torch.fx.GraphModule``
    that ``ExportedProgram.module()`` returns for the folded program (same parameter names, same
    function on inputs shaped like the example inputs).  ``report`` is the :class:`FoldReport`."""

    model: Any
    report: FoldReport


@dataclass
class CheckResult:
    """The normalizations left in a model (``bnfold.check``).

    ``foldable``: the normalizations ``bnfold.fold`` would fold (:class:`Folded` entries);
    ``unfoldable``: the normalizations that stay, with the reason and code (:class:`Skipped`).
    Notes only, never failing a check: ``foldable_ops`` (chains of elementwise ops alone that
    ``fold`` would fold, e.g. a ``/ 6`` into the next conv) and ``kept_ops`` (elementwise affine
    ops that stay).  ``unmatched``: each ``exclude`` pattern that matched nothing and each ``only`` kind the model
    lacks (as in :class:`FoldReport`).  ``ok`` is true when no foldable normalization is left; ``strict_ok`` when no
    normalization is left at all.
    """

    foldable: list[Folded] = field(default_factory=list)
    unfoldable: list[Skipped] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    kept_ops: list[KeptOp] = field(default_factory=list)
    foldable_ops: list[Folded] = field(default_factory=list)
    unmatched: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.foldable

    @property
    def strict_ok(self) -> bool:
        return not self.foldable and not self.unfoldable

    @classmethod
    def from_report(cls, report: FoldReport) -> CheckResult:
        norms = [f for f in report.folded if f.kind]
        ops = [f for f in report.folded if not f.kind]
        return cls(norms, list(report.skipped), list(report.notes), list(report.kept_ops), ops, list(report.unmatched))

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "strict_ok": self.strict_ok,
            "foldable": folded_dicts(self.foldable),
            "unfoldable": [entry_dict(s) for s in self.unfoldable],
            "foldable_ops": folded_dicts(self.foldable_ops),
            "kept_ops": [entry_dict(k) for k in self.kept_ops],
            "notes": list(self.notes),
            "unmatched": list(self.unmatched),
        }
