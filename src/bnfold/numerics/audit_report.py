"""The audit's report: per normalization (:class:`NormAudit`), per layer (:class:`LayerAudit`), end to end
(:class:`EndToEnd`), and the whole :class:`AuditReport` (data: ``to_dict()``; ``table()`` renders it)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from .risk import VERDICTS, Risk, norm_severity  # noqa: F401 (norm_severity: re-exported)
from .tensor_error import TensorError, json_float


@dataclass
class NormAudit:
    """One batch normalization of the unfolded program (``node`` is its graph node name)."""

    node: str
    name: str
    channels: int
    eps: float
    scale_min: float
    scale_max: float
    kappa: float
    kappa_channel: int
    input_max_abs: float
    headroom: float  # the smallest fp16 headroom of any intermediate, measured (ref and emulated) or predicted
    folded: bool
    fold: str  # "folded into <layer> (<pattern>)" or the reason it was skipped
    runtime_scale_max: float | None = None  # max |scale| with the bn_eps override
    runtime_kappa: float | None = None  # kappa with the bn_eps override
    risk: Risk | None = None
    row: str | None = None  # the layer row that measures it (table name)

    @property
    def verdict(self) -> str:
        return self.risk.verdict if self.risk is not None else "unknown"

    def to_dict(self) -> dict:
        out = {k: json_float(v) if isinstance(v, float) else v for k, v in self.__dict__.items() if k != "risk"}
        out["risk"] = _dict(self.risk)
        return out


@dataclass
class LayerAudit:
    """One layer's output: a conv / linear / matmul (after the batch norm, or the chain folded into
    it, that follows), or a standalone batch norm.  ``norm`` is the node name of that batch norm
    (or of the chain's first step).  ``folded`` measures the same tensor in the folded program,
    found by node identity; None when the folded program no longer holds it."""

    name: str
    kind: str
    norm: str | None
    unfolded: TensorError
    folded: TensorError | None
    label: str = ""  # module path, when the graph records one
    local_unfolded: TensorError | None = None  # the error this row adds by itself (inputs as emulated)
    local_folded: TensorError | None = None
    norms: tuple = ()  # node names of the batch norms this row measures through

    @property
    def title(self) -> str:
        """The row's name in the table and the plot."""
        return self.label or self.name

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "label": self.label,
            "kind": self.kind,
            "norm": self.norm,
            "norms": list(self.norms),
            "cumulative": {"unfolded": self.unfolded.to_dict(), "folded": _dict(self.folded)},
            "local": {"unfolded": _dict(self.local_unfolded), "folded": _dict(self.local_folded)},
        }


@dataclass
class EndToEnd:
    """The program's outputs over all batches, against the unfolded model's reference outputs, and their
    agreement with the float model on the task (see :class:`bnfold.numerics.end_to_end.Task`)."""

    output: TensorError
    top1_agreement: float | None = None  # share of positions whose argmax along class_axis matches the float model
    accuracy: float | None = None  # fraction matching ``labels``, when given
    predictions: torch.Tensor | None = None
    class_axis: int | None = None  # the axis top-1 reads
    threshold: float | None = None  # the cut of mask_iou
    mask_iou: float | None = None  # IoU of the masks output > threshold and float model > threshold (1.0: both empty)
    metric: float | None = None  # the user's metric(output, reference), batches weighted by their sample count
    metric_name: str | None = None
    batch_sqnr_db: list[float] = field(default_factory=list)  # the output SQNR of each batch by itself
    outputs: dict = field(default_factory=dict)  # per float output (by index), its error over all batches
    output_index: int | None = None  # the output ``output`` measures (None: every float output together)

    @property
    def sqnr_spread_db(self) -> float:
        """How much the output SQNR moves from batch to batch: the standard deviation of the per-batch
        SQNRs (dB).  NaN with fewer than two batches or when a batch has no SQNR (NaN/inf, no error).
        The SQNR over all batches moves by less than this with the inputs, or with another CPU's
        float32 rounding (a different fp16 rounding noise on the same inputs)."""
        v = self.batch_sqnr_db
        if len(v) < 2 or not all(math.isfinite(x) for x in v):
            return math.nan
        mean = sum(v) / len(v)
        return math.sqrt(sum((x - mean) ** 2 for x in v) / (len(v) - 1))

    def to_dict(self) -> dict:
        return {
            "output_sqnr_db": json_float(self.output.sqnr_db),
            "output_sqnr_spread_db": json_float(self.sqnr_spread_db),
            "batch_output_sqnr_db": [json_float(x) for x in self.batch_sqnr_db],
            "output_finite_sqnr_db": json_float(self.output.finite_sqnr_db),
            "output_max_abs_err": json_float(self.output.max_abs_err),
            "elements": self.output.count,
            "nan": self.output.nan,
            "inf": self.output.inf,
            "nonfinite_share": self.output.nonfinite_share,
            "top1_agreement": self.top1_agreement,
            "class_axis": self.class_axis,
            "mask_iou": self.mask_iou,
            "threshold": self.threshold,
            "metric": json_float(self.metric) if self.metric is not None else None,
            "metric_name": self.metric_name,
            "accuracy": self.accuracy,
            "output": self.output_index,
            "outputs": [
                {"index": i, **{k: v for k, v in e.to_dict().items() if k not in ("node", "op")}}
                for i, e in sorted(self.outputs.items())
            ],
        }


@dataclass
class AuditReport:
    profile: str
    bn_eps: float | None
    samples: int
    batches: int
    norms: list[NormAudit]
    layers: list[LayerAudit]
    unfolded: EndToEnd
    folded: EndToEnd | None
    fp32_accuracy: float | None = None
    fold_report: Any = None
    errors: dict[str, dict[str, TensorError]] = field(default_factory=dict)  # the tensors measured, per program
    all_tensors: bool = True  # ``errors`` holds every floating value (else those the rows read)
    local_runs: bool = True  # the layers' local errors were measured (``audit(local=True)``, ``bnfold audit --local``)
    name: str = "model"
    random_inputs: bool = False  # the batches were random: top-1 agreement says little
    runtime: RuntimeRun | None = None  # a real runtime run next to the emulation (``runtime=``)
    reference: str = "float64"  # the dtype the reference run computed in (``runner.reference_dtype``)
    floor: Any = None  # what the verdict asks (:class:`~.verdict.Floor`)
    ship: str = "unfolded"  # the program the verdict judges: "folded" (the fold changed the model) or "unfolded"
    deploy: bool | None = None  # the verdict: the shipped program keeps the task under the profile
    ops: list = field(default_factory=list)  # per op of the shipped program (:class:`~.cause.OpRecord`)
    cause: Any = None  # where its damage starts (:class:`~.cause.Cause`), None when nothing breaks
    prescription: Any = None  # what fixes it (:class:`~.prescribe.Prescription`)

    @property
    def shipped(self) -> EndToEnd:
        """The end-to-end numbers of the program the verdict judges."""
        return self.folded if self.ship == "folded" and self.folded is not None else self.unfolded

    notes: list[str] = field(default_factory=list)  # what the audit did on the caller's behalf (an eval-mode copy)

    def worst_layers(self, n: int = 3, which: str = "unfolded", local: bool = False) -> list[LayerAudit]:
        """The ``n`` layers with the lowest SQNR in the ``which`` program (NaN/inf first); ``local``: by the
        error each layer adds by itself instead of the cumulative one."""
        attr = ("local_" if local else "") + which

        def key(row):
            e = getattr(row, attr)
            return -e.nonfinite, -1e9 if math.isnan(e.sqnr_db) else e.sqnr_db

        return sorted((r for r in self.layers if getattr(r, attr) is not None), key=key)[:n]

    def worst_norms(self, n: int = 3) -> list[NormAudit]:
        """The ``n`` normalizations in order of :func:`norm_severity`, the worst first."""
        return sorted(self.norms, key=norm_severity)[:n]

    def advice(self) -> list[str]:
        """The closing "what to do" lines (see :func:`bnfold.numerics.advice.advice`)."""
        from .advice import advice

        return advice(self)

    def to_dict(self) -> dict:
        return {
            "model": self.name,
            "profile": self.profile,
            "bn_eps": self.bn_eps,
            "random_inputs": self.random_inputs,
            "notes": list(self.notes),
            "what_to_do": self.advice(),
            "verdict": self.verdict_dict(),
            "cause": _dict(self.cause),
            "prescription": _dict(self.prescription),
            "samples": self.samples,
            "batches": self.batches,
            "fp32_accuracy": self.fp32_accuracy,
            "end_to_end": {"unfolded": self.unfolded.to_dict(), "folded": _dict(self.folded)},
            "normalizations": [n.to_dict() for n in self.norms],
            "layers": [r.to_dict() for r in self.layers],
            "fold_report": _dict(self.fold_report),
            "runtime": _dict(self.runtime),
            "tensors": {prog: [e.to_dict() for e in errs.values()] for prog, errs in self.errors.items()},
            "all_tensors": self.all_tensors,
            "local_runs": self.local_runs,
            "ops": [r.to_dict() for r in self.ops],
        }

    def verdict_dict(self) -> dict | None:
        if self.deploy is None:
            return None
        misses = [] if self.floor is None else self.floor.failures(self.shipped)
        return {
            "deploy": self.deploy,
            "model": self.ship,
            "failures": misses,
            "floor": _dict(self.floor),
            "weak_evidence": self.random_inputs,
        }

    def table(self, full: bool = False) -> str:
        """The text table; ``full``: names and folds in full (long names otherwise keep their head and end)."""
        from .table import audit_table

        return audit_table(self, full)

    def plot(self, path, worst: int = 25) -> None:
        """Write the SQNR chart (see :func:`bnfold.numerics.plot.plot_reports`)."""
        from .plot import plot_reports

        plot_reports([self], path, worst=worst)

    def __str__(self) -> str:
        return self.table()


@dataclass
class RuntimeRun:
    """A real runtime run next to the emulation (``audit(..., runtime=...)``): its end-to-end numbers
    against the same reference run, unfolded and folded, and the profile it is compared with."""

    runtime: str  # "torch" (eager, half precision, CPU) or "onnxruntime" (a float16 model, CPU)
    matches_profile: str  # the profile that emulates this runtime
    unfolded: EndToEnd
    folded: EndToEnd | None = None

    def to_dict(self) -> dict:
        return {k: v if isinstance(v, str) else _dict(v) for k, v in self.__dict__.items()}


def _dict(x) -> dict | None:
    return None if x is None else x.to_dict()
