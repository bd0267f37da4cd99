"""End-to-end numbers of an audited run: output SQNR and NaN/inf against the reference run, and
agreement with the float model on the task (:class:`Task`): top-1 agreement along a class axis,
the IoU of the above-threshold mask of a probability map, a metric of the user's, and accuracy
against labels (classifiers).

The reference of the agreement numbers is the float model's output: the unfolded model's reference run
(float64, or float32 under the profiles that store fp16: what float32 gives, up to float32 rounding), handed
over as float32 tensors.  Top-1 and
the mask read the model's first output.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from .audit_report import EndToEnd
from .runner import EmulationResult
from .tensor_error import TensorError, measure


@dataclass(frozen=True)
class Task:
    """What end-to-end agreement to report beside the SQNR (``audit(class_axis=, threshold=, metric=)``).

    * ``class_axis``: top-1 agreement = the share of positions (every index of the first output but
      the class axis) whose argmax along ``class_axis`` matches the float model's.  ``None``: a first
      output shaped ``[N, classes]`` is read along axis 1, any other has no top-1.
    * ``threshold``: ``mask_iou`` = |A and B| / |A or B| of the masks ``output > threshold`` (A) and
      ``reference > threshold`` (B) of the first output, pooled over all batches (NaN counts as below).
      When both masks are empty it is 1.0: the two agree that nothing is there.
    * ``metric``: ``fn(output, reference) -> float``, called once per batch (a tensor each when the
      model has one output, else a tuple); the value reported is the mean over batches weighted by
      their sample count (the first output's leading dim), so a per-sample mean comes out exact
      however the samples are batched.
    """

    class_axis: int | None = None
    threshold: float | None = None
    metric: Callable | None = None
    #: the output the task numbers and the verdict's SQNR read (an index; None: the first for the task, every float
    #: output together for the SQNR)
    output: int | None = None

    @property
    def at(self) -> int:
        """The index of the output the task reads."""
        return self.output or 0

    @property
    def metric_name(self) -> str | None:
        if self.metric is None:
            return None
        return getattr(self.metric, "__name__", None) or type(self.metric).__name__


class TaskError(ValueError):
    """A task option that does not fit (one line); ``option`` names it (``threshold``, ``class_axis``, ``output``)."""

    def __init__(self, option: str, message: str):
        super().__init__(message)
        self.option = option


def task(class_axis=None, threshold=None, metric=None) -> Task:
    """A checked :class:`Task` (:class:`TaskError` / TypeError with a one-line message)."""
    if class_axis is not None and (isinstance(class_axis, bool) or not isinstance(class_axis, int)):
        raise TypeError(f"class_axis must be an int, got {class_axis!r}")
    if threshold is not None:
        try:
            t = float(threshold)
        except (TypeError, ValueError):
            raise TypeError(f"threshold must be a number, got {threshold!r}") from None
        if not 0.0 < t < 1.0:
            raise TaskError("threshold", f"threshold must lie in (0, 1) (a probability map's cut), got {threshold!r}")
        threshold = t
    if metric is not None and not callable(metric):
        raise TypeError(f"metric must be a function fn(output, reference) -> float, got {type(metric).__name__}")
    return Task(class_axis, threshold, metric)


def output_index(output, names: list[str]) -> int | None:
    """``output`` (an index, a name among ``names``, or None) as an index into the program's outputs
    (:class:`TaskError`: none such)."""
    if output is None:
        return None
    if isinstance(output, str) and not output.isdigit():
        if output not in names:
            raise TaskError("output", f"the model has no output named {output!r} (its outputs: {', '.join(names)})")
        return names.index(output)
    try:
        k = int(output)
    except (TypeError, ValueError):
        raise TaskError("output", f"output must be an output's index or name, got {output!r}") from None
    if isinstance(output, bool) or not 0 <= k < len(names):
        raise TaskError("output", f"output {output!r} is out of range: the model has {len(names)} output(s)")
    return k


def check_class_axis(axis: int | None, rank: int | None) -> None:
    """``axis`` is an axis of a first output of ``rank`` dims (not checked when the rank is unknown;
    :class:`TaskError` else)."""
    if axis is None or rank is None:
        return
    if rank == 0:
        raise TaskError("class_axis", f"class axis {axis}: the model's first output is a scalar (no class axis)")
    if not -rank <= axis < rank:
        raise TaskError("class_axis", f"class axis {axis} is out of range for the model's first output ({rank} dims)")


class _Agreement:
    """The task numbers of one program, accumulated batch by batch."""

    def __init__(self, spec: Task):
        self.spec = spec
        self.preds: list[torch.Tensor] = []
        self.agree = 0
        self.positions = 0
        self.inter = 0
        self.union = 0
        self.metric_sum = 0.0
        self.metric_weight = 0

    def add(self, outs: list, refs: list) -> None:
        spec = self.spec
        k = spec.at
        first, ref = (outs[k], refs[k]) if len(outs) > k and len(refs) > k else (None, None)
        tensors = isinstance(first, torch.Tensor) and isinstance(ref, torch.Tensor)
        if spec.class_axis is not None and tensors:
            check_class_axis(spec.class_axis, first.dim())
            p = first.argmax(spec.class_axis)
            self.preds.append(p)
            self.agree += int((p == ref.to(torch.float32).argmax(spec.class_axis)).sum())
            self.positions += p.numel()
        if spec.threshold is not None and tensors:
            a = first > spec.threshold
            b = ref.to(torch.float32) > spec.threshold
            self.inter += int((a & b).sum())
            self.union += int((a | b).sum())
        if spec.metric is not None:
            out = outs[0] if len(outs) == 1 else tuple(outs)
            r = [x.to(torch.float32) if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in refs]
            value = spec.metric(out, r[0] if len(r) == 1 else tuple(r))
            try:
                value = float(value)
            except (TypeError, ValueError):
                raise TypeError(
                    f"metric {spec.metric_name} must return a float, it returned {type(value).__name__}"
                ) from None
            n = first.shape[0] if isinstance(first, torch.Tensor) and first.dim() else 1
            self.metric_sum += value * n
            self.metric_weight += n

    def into(self, e2e: EndToEnd) -> None:
        spec = self.spec
        if spec.class_axis is not None and self.positions:
            e2e.class_axis = spec.class_axis
            e2e.top1_agreement = self.agree / self.positions
            e2e.predictions = torch.cat([p.flatten() for p in self.preds])
        if spec.threshold is not None:
            e2e.threshold = spec.threshold
            e2e.mask_iou = self.inter / self.union if self.union else 1.0
        if spec.metric is not None:
            e2e.metric_name = spec.metric_name
            e2e.metric = self.metric_sum / self.metric_weight if self.metric_weight else math.nan


def end_to_end_of(
    res: EmulationResult, ref_outputs: list, fp32_top1: list, labels: list | None, spec: Task | None = None
) -> EndToEnd:
    spec = spec or Task()
    per_batch = []  # each batch's output error: the output named, else its float outputs together
    each: dict[int, list[TensorError]] = {}  # per output, its error in each batch
    agreement = _Agreement(spec)
    for outs, refs in zip(res.outputs, ref_outputs):
        errs = {
            i: measure(f"output {i}", "output", o, r, exact_diff=True)
            for i, (o, r) in enumerate(zip(outs, refs))
            if isinstance(r, torch.Tensor) and r.is_floating_point()
        }
        for i, e in errs.items():
            each.setdefault(i, []).append(e)
        judged = [errs[spec.output]] if spec.output is not None and spec.output in errs else list(errs.values())
        if judged:
            per_batch.append(_total(judged))
        agreement.add(outs, refs)
    e2e = EndToEnd(
        _total(per_batch) if per_batch else TensorError("output", "output", ()),
        batch_sqnr_db=[b.sqnr_db for b in per_batch],
        outputs={i: _total(v) for i, v in each.items()},
        output_index=spec.output,
    )
    preds = top1_of(res.outputs, spec.at) if spec.class_axis is None else []
    if preds and len(preds) == len(fp32_top1):
        e2e.predictions = torch.cat(preds)
        e2e.class_axis = 1
        e2e.top1_agreement = float((e2e.predictions == torch.cat(fp32_top1)).double().mean())
    agreement.into(e2e)
    e2e.accuracy = _accuracy(e2e.predictions, labels)
    return e2e


def _total(errs: list[TensorError]) -> TensorError:
    """A new error over all of ``errs`` (merged in order)."""
    total = replace(errs[0])
    for e in errs[1:]:
        total.merge(e)
    return total


def top1_of(outputs: list, k: int = 0) -> list:
    """Per batch, the top-1 of a classifier's outputs (output ``k`` of shape [N, classes]); [] unless every
    batch has one."""
    out = []
    for outs in outputs:
        first = outs[k] if len(outs) > k else None
        if isinstance(first, torch.Tensor) and first.dim() == 2 and first.shape[1] > 1:
            out.append(first.argmax(1))
    return out if len(out) == len(outputs) else []


def _accuracy(preds: torch.Tensor | None, labels: list | None) -> float | None:
    """The share of ``preds`` equal to ``labels``; None without either or when their shapes differ."""
    if preds is None or labels is None:
        return None
    lab = torch.cat([torch.as_tensor(t).flatten() for t in labels])
    return float((preds == lab).double().mean()) if preds.shape == lab.shape else None


def fp32_accuracy(ref_outputs: list, fp32_top1: list, labels: list | None, spec: Task | None) -> float | None:
    """The float model's accuracy against ``labels`` (see :func:`_accuracy`): its argmax along
    ``spec.class_axis`` (of the first reference output), else the float32 top-1 of an ``[N, classes]`` output."""
    if labels is None:
        return None
    if spec is not None and spec.class_axis is not None:
        k = spec.at
        preds = [refs[k].to(torch.float32).argmax(spec.class_axis).flatten() for refs in ref_outputs if len(refs) > k]
    else:
        preds = fp32_top1
    return _accuracy(torch.cat(preds) if preds else None, labels)


def split_labels(labels, batches: list[tuple]) -> list[torch.Tensor] | None:
    if labels is None:
        return None
    if isinstance(labels, torch.Tensor):
        return list(torch.as_tensor(labels).split([b[0].shape[0] for b in batches]))
    return [torch.as_tensor(t) for t in labels]
