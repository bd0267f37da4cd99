"""End-to-end numbers of an audited run: output SQNR and NaN/inf against the reference run, and
agreement with the float model on the task (:class:`Task`): top-1 agreement along a class axis,
the IoU of the above-threshold mask of a probability map, a metric of the user's, and accuracy
against labels (classifiers).

The reference of the agreement numbers is the float model's output: the unfolded model's reference run
(float64, or float32 under the profiles that store fp16: what float32 gives, up to float32 rounding), handed
over as float32 tensors.  Top-1 and
the mask read the model's first output.  The numbers are accumulated batch by batch (:class:`EndToEndSum`): the
audit holds one batch's outputs at a time.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from .audit_report import EndToEnd
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


class EndToEndSum:
    """The end-to-end numbers of one program (:class:`EndToEnd`), accumulated batch by batch (:meth:`add`) so that
    the audit holds one batch's outputs at a time: per-batch errors merged in batch order (the numbers of measuring
    every batch, then merging), per output, the task's agreement as integer counts and weighted sums
    (:class:`_Agreement`), and the top-1 of an ``[N, classes]`` output against the float model's (``top1``; a real
    runtime's run has none).  ``labels``: per batch, for the accuracy (:meth:`result`)."""

    def __init__(self, spec: Task | None = None, labels: list | None = None, top1: bool = True):
        self.spec = spec or Task()
        self.labels = labels
        self.top1 = top1
        self.total: TensorError | None = None  # the output error (the output named, else the float outputs together)
        self.batch_sqnr_db: list[float] = []
        self.each: dict[int, TensorError] = {}  # per output, its error over the batches so far
        self.agreement = _Agreement(self.spec)
        self.preds: list[torch.Tensor] = []  # per batch, the top-1 of an [N, classes] output
        self.agree = self.positions = 0
        self.every = True  # every batch so far had a top-1, emulated and float

    def add(self, outs: list, refs: list) -> None:
        """One batch: the program's outputs ``outs`` against the float model's ``refs``."""
        spec = self.spec
        errs = {
            i: measure(f"output {i}", "output", o, r, exact_diff=True)
            for i, (o, r) in enumerate(zip(outs, refs))
            if isinstance(r, torch.Tensor) and r.is_floating_point()
        }
        for i, e in errs.items():
            _merge_into(self.each, i, e)
        judged = [errs[spec.output]] if spec.output is not None and spec.output in errs else list(errs.values())
        if judged:
            batch = _total(judged)
            self.batch_sqnr_db.append(batch.sqnr_db)
            self.total = replace(batch) if self.total is None else _merged(self.total, batch)
        self.agreement.add(outs, refs)
        if self.top1 and spec.class_axis is None and self.every:
            p, r = top1(outs, spec.at), top1(refs, spec.at)
            if p is None or r is None:
                self.every, self.preds = False, []
            else:
                self.preds.append(p)
                self.agree += int((p == r).sum())
                self.positions += p.numel()

    def result(self) -> EndToEnd:
        spec = self.spec
        e2e = EndToEnd(
            self.total if self.total is not None else TensorError("output", "output", ()),
            batch_sqnr_db=list(self.batch_sqnr_db),
            outputs=dict(self.each),
            output_index=spec.output,
        )
        if self.preds and self.every:
            e2e.predictions = torch.cat(self.preds)
            e2e.class_axis = 1
            e2e.top1_agreement = self.agree / self.positions if self.positions else math.nan
        self.agreement.into(e2e)
        e2e.accuracy = _accuracy(e2e.predictions, self.labels)
        return e2e


class FloatAccuracy:
    """The float model's accuracy against ``labels`` (see :func:`_accuracy`), from its outputs batch by batch: its
    argmax along ``spec.class_axis`` of the output the task reads, else the top-1 of an ``[N, classes]`` output."""

    def __init__(self, spec: Task | None, labels: list | None):
        self.spec, self.labels = spec, labels
        self.preds: list[torch.Tensor] = []
        self.every = True

    def add(self, refs: list) -> None:
        if self.labels is None:
            return
        spec = self.spec
        if spec is not None and spec.class_axis is not None:
            if len(refs) > spec.at:
                self.preds.append(refs[spec.at].to(torch.float32).argmax(spec.class_axis).flatten())
        elif (p := top1(refs, spec.at if spec is not None else 0)) is not None and self.every:
            self.preds.append(p)
        else:
            self.every, self.preds = False, []

    def result(self) -> float | None:
        if self.labels is None:
            return None
        return _accuracy(torch.cat(self.preds) if self.preds else None, self.labels)


def _merge_into(totals: dict, key, e: TensorError) -> None:
    """Merge ``e`` into ``totals[key]`` (a copy of ``e`` when there is none yet)."""
    totals[key] = replace(e) if key not in totals else _merged(totals[key], e)


def _merged(total: TensorError, e: TensorError) -> TensorError:
    total.merge(e)
    return total


def _total(errs: list[TensorError]) -> TensorError:
    """A new error over all of ``errs`` (merged in order)."""
    total = replace(errs[0])
    for e in errs[1:]:
        total.merge(e)
    return total


def top1(outs: list, k: int = 0) -> torch.Tensor | None:
    """The top-1 of one batch of a classifier's outputs (output ``k`` of shape [N, classes]); None when it has none."""
    first = outs[k] if len(outs) > k else None
    if isinstance(first, torch.Tensor) and first.dim() == 2 and first.shape[1] > 1:
        return first.argmax(1)
    return None


def _accuracy(preds: torch.Tensor | None, labels: list | None) -> float | None:
    """The share of ``preds`` equal to ``labels``; None without either or when their shapes differ."""
    if preds is None or labels is None:
        return None
    lab = torch.cat([torch.as_tensor(t).flatten() for t in labels])
    return float((preds == lab).double().mean()) if preds.shape == lab.shape else None


def split_labels(labels, batches: list[tuple]) -> list[torch.Tensor] | None:
    if labels is None:
        return None
    if isinstance(labels, torch.Tensor):
        return list(torch.as_tensor(labels).split([b[0].shape[0] for b in batches]))
    return [torch.as_tensor(t) for t in labels]
