"""Exit statuses, choices and defaults of ``bnfold``, shared by the option table and the commands."""

from __future__ import annotations

from ..kinds import LAYER_KINDS, NORM_KINDS

EXIT_OK = 0
EXIT_SURVIVORS = 1  # `check` found normalizations left
EXIT_ERROR = 2  # bad input: unreadable, wrong-format or unsafe file, bad arguments
EXIT_INTERNAL = 3
EXIT_PIPE = 141  # 128 + SIGPIPE: the reader went away (`bnfold check x.pt2 | head -1`)
EXIT_INTERRUPTED = 130

#: What ``--only`` may name: layer kinds (fold into these only) and normalization kinds (fold these only).
ONLY_KINDS = (*LAYER_KINDS, *NORM_KINDS)
PROFILES = ("fp16", "htp", "fp16-acc", "fp32", "ort-cpu")
DEFAULT_RANDOM_BATCHES = 8  # = bnfold.numerics.batches.RANDOM_BATCHES (this module stays torch-free)
FOLDABLE = "foldable: run bnfold fold"
