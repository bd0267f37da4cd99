"""The layer kinds a normalization folds into and the normalization kinds: the one list of each,
torch-free so that ``import bnfold`` stays light.  ``bnfold.fold_math`` gives each layer kind its
weight layout."""

#: ``conv`` weight ``[out, in/groups, *k]``; ``conv_transpose`` ``[in, out/groups, *k]``; ``linear`` ``[out, in]``.
LAYER_KINDS = ("conv", "conv_transpose", "linear")

#: The normalization kinds bnfold folds; ``only=`` may name these too (then other kinds stay).
NORM_KINDS = ("batch_norm", "layer_norm", "rms_norm", "group_norm")
