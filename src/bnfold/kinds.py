"""The layer kinds a normalization folds into: the one list, torch-free so that
``import bnfold`` stays light.  ``bnfold.fold_math`` gives each its weight layout."""

#: ``conv`` weight ``[out, in/groups, *k]``; ``conv_transpose`` ``[in, out/groups, *k]``; ``linear`` ``[out, in]``.
LAYER_KINDS = ("conv", "conv_transpose", "linear")
