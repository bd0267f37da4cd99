"""The row type of every format's op table (``onnx.ops.OPS``, ``torch_export.ops.OPS``).

One row says what an op is to the engine; the adapters, their axis rules, the
numerics tools and the benchmarks read the same rows, so a new spelling of an
op is one row in its format's table.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Op:
    """What an op is to the engine and what it implies about shapes.

    ``role``: ``layer`` / ``norm`` / ``plain_norm`` (a normalization read only when its own scale and
    bias are the identity: the start of an affine spelled out after it, ``bnfold.engine.spelled``) /
    ``binary`` (an elementwise binary op) / ``hop`` (a per-channel affine
    moves through it: shape-only, or a pick / mean / max along other axes) /
    ``metadata`` (reads only its input's shape: a user through it is no user for a fold) /
    ``pool`` (an average pool: re-parameterization reads it as a conv kernel) /
    ``elementwise`` (computes, but keeps the shape).  ``kind``: for a layer its
    ``bnfold.kinds.LAYER_KINDS`` kind ("" when only parsing tells), for a norm (or a ``plain_norm``)
    its ``NORM_KINDS`` kind, for a binary op the name of its row in ``fold_math.BINARY_AFFINES``, for a
    hop the name of its axis rule (the format's ``axes.AXIS_RULES``).  ``shape``: ``same`` (the output
    has the first input's shape), ``broadcast`` (the largest rank of the inputs), ``permuted`` (the
    first input's rank), ``reduced`` (a reduction: at most the first input's elements), "" (op-specific).
    ``affine``: for a norm whose elementwise affine alone folds (ONNX), or a ``plain_norm``, its axis and
    the input slots of its scale and bias (None: no bias input).  ``type_only``: input slots whose dtype
    alone is read (ONNX ``CastLike``'s second): a reader there is no user.
    ``monotone``: a hop that takes a maximum (max-pool): a per-channel affine crosses it only
    with a scale ``>= 0`` (``bnfold.engine.graph.Hop.monotone``).

    What the numerics (``bnfold.numerics``) read; a row with role ``numeric`` is read by them alone.
    ``rounding``: ``exact`` (the output holds only values of the inputs: an fp16 runtime computes it
    exactly), ``same`` (exact, and the output's error statistics are its first input's: the same
    elements rearranged), "" (the output is rounded to the storage format).  ``layer``: the layer kind
    the audit reports it as and how fp16 accumulation runs it (``conv`` / ``conv_transpose``: summed
    over input channels per group; ``linear`` / ``matmul``: over the last axis), "" for no layer.
    ``fp16``: the class of ops a runtime keeps in fp16 in a float16 model whose other ops compute in
    float32 (``movement``: data movement, ``softmax``; ``profiles.ORT_CPU_FP16_CLASSES``).
    ``accumulate``: a reduction a GPU sums in fp16 under the ``fp16-acc`` profile (``sum``, ``mean``: over its
    axes; ``pool``: an average pool, over its window), "" for none (``bnfold.numerics.accumulate``).

    What the fp16 range rewrite (``bnfold.engine.range``) reads: how the op treats its float inputs scaled
    by a positive power of two ``s``.  ``range``: ``homogeneous`` (``f(s x, p) = s f(x, p)`` in its first
    operand, the others parameters: ReLU, max / average pool, resize, zero pad, a reshape, a sum over axes),
    ``sum`` (every float operand carries the same scale, and so does the output: add, sub, concat),
    ``product`` (the output's scale is the product of its operands': mul, matmul), ``quotient`` (the first
    operand's over the second's: div), ``power`` (the output carries ``s ** degree``: pow, sqrt, rsqrt,
    reciprocal; ``degree`` None: the op's constant exponent), ``invariant`` (the output does not change when
    its first operand is scaled and its eps by ``s ** 2``: LayerNorm, RMSNorm, GroupNorm, InstanceNorm), ""
    (none of these: the scale has to be undone before it, or it stops the rewrite).
    """

    role: str
    kind: str = ""
    shape: str = ""
    affine: tuple[int, int, int | None] | None = None
    type_only: tuple[int, ...] = ()
    monotone: bool = False
    rounding: str = ""
    layer: str = ""
    fp16: str = ""
    accumulate: str = ""
    range: str = ""
    degree: float | None = None
