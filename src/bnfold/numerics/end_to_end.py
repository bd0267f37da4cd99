"""End-to-end numbers of an audited run: output SQNR and NaN/inf against the float64 reference, top-1
agreement with the float32 model and accuracy against labels (classifiers)."""

from __future__ import annotations

import torch

from .audit_report import EndToEnd
from .errors import TensorError, measure
from .runner import EmulationResult


def _end_to_end(res: EmulationResult, ref_outputs: list, fp32_top1: list, labels: list | None) -> EndToEnd:
    total = None
    preds = []
    for outs, refs in zip(res.outputs, ref_outputs):
        for o, r in zip(outs, refs):
            if isinstance(r, torch.Tensor) and r.is_floating_point():
                m = measure("output", "output", o, r, exact_diff=True)
                if total is None:
                    total = m
                else:
                    total.merge(m)
        first = outs[0] if outs else None
        if isinstance(first, torch.Tensor) and first.dim() == 2 and first.shape[1] > 1:
            preds.append(first.argmax(1))
    e2e = EndToEnd(total or TensorError("output", "output", ()))
    if preds and len(preds) == len(fp32_top1):
        p = torch.cat(preds)
        e2e.predictions = p
        e2e.top1_agreement = float((p == torch.cat(fp32_top1)).double().mean())
        if labels is not None:
            e2e.accuracy = float((p == torch.cat(labels)).double().mean())
    return e2e


def _split_labels(labels, batches: list[tuple]) -> list[torch.Tensor] | None:
    if labels is None:
        return None
    if isinstance(labels, torch.Tensor):
        sizes = [b[0].shape[0] for b in batches]
        return list(torch.as_tensor(labels).split(sizes))
    return [torch.as_tensor(t) for t in labels]
