"""A fold rule as data (onnxscript's rewriter style): a :class:`Rule` has a name, what it folds and the function
that applies it (pattern -> check -> rewrite) to one layer.  The engine runs the rules of
:data:`bnfold.engine.driver.RULES` in order; the name of the rule that made an entry is the report's
``Folded.rule``, read from the rule object, never spelled again.  The rules themselves: ``rules.py`` (output,
input), ``fanout.py``, ``reparam.py`` (merge), ``constant_weight.py`` (constant); ``tests/engine/test_rule_objects.py``
folds, for each, what only that rule folds."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .graph import GraphAdapter, Layer, Outcome


@dataclass(frozen=True)
class Rule:
    """``name``: what the report calls it (``Folded.rule``); ``folds``: what it folds, in a line;
    ``apply(graph, layer, only) -> Outcome``: the rule on one layer (``only``: the layer kinds asked for)."""

    name: str
    folds: str
    apply: Callable[[GraphAdapter, Layer, Any], Outcome]

    def __call__(self, graph: GraphAdapter, layer: Layer, only: Any) -> Outcome:
        return self.apply(graph, layer, only)
