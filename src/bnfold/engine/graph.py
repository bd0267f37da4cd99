"""What the engine asks of a graph: the adapter interface and the terms it answers in.

The engine never looks at a graph itself.  Each graph kind (a torch.export or
ExecuTorch edge program, a bare ``GraphModule`` with ``get_attr`` tensors, an
ONNX model) has one adapter that implements :class:`GraphAdapter`.  Nodes and
values are opaque to the engine: an fx ``Node`` is both, an ONNX value is a
name in a graph scope.  An adapter *classifies* (``layer``, ``norm``,
``plain_norm``, ``binary``, ``hop``), *navigates* (``users``, ``producer``), *reads*
(``constant``, ``shape_info``, ``follow_axis``, names) and makes *primitive edits*
(``write_layer``, ``remove_node``, ``strip_affine``, ``drop_unused``, ``add_bias``,
``lower_norm``, and ``bypass`` for a re-parameterization merge; ``conv_geometry``, ``pool`` and
``inputs`` read what a merge needs).  It decides nothing about folding: which nodes a fold removes, what
stands where a chain ended and the shapes of new tensors are the engine's
(``bnfold.engine.edit``).

Handles (nodes and values) must be hashable, compare equal exactly when they
name the same node or value, and stay valid for a whole ``fold_graph`` run.

Adding an op spelling is a row in the adapter's op table; adding a pattern is
engine code.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import torch

from ..fold_math import Affine, Spill
from ..report import Code


@dataclass
class Layer:
    """A conv / transposed conv / linear node whose weight a fold may change.

    ``kind`` is a ``bnfold.kinds.LAYER_KINDS`` entry; ``op`` the readable op
    name used in patterns and reasons (``conv2d``, ``Conv``).  ``input`` is the
    value the layer reads and ``output`` the value carrying its result (an ONNX
    MatMul's bias ``Add`` when it has one).  ``in_axis``/``out_axis`` are the
    channel axes of input and output; a negative axis counts from the end.
    ``weight``/``bias`` are the adapter's handles; ``takes_bias`` is False when
    a new bias cannot go into the layer itself (it is then added after the
    chain); ``extra`` is adapter-private.
    """

    node: Any
    kind: str
    op: str
    input: Any
    output: Any
    weight: Any
    bias: Any = None
    groups: int = 1
    zero_padding: bool = True
    in_axis: int = 1
    out_axis: int = 1
    takes_bias: bool = True
    extra: Any = None


@dataclass
class LayerWeights:
    """A layer's constants in fold-math terms (``bnfold.fold_math`` layouts).

    ``weight`` is in the kind's layout, ``bias`` is 1-D or None.  ``pre`` is an
    affine the layer applies after its bias-free product (ONNX Gemm's
    ``alpha`` and ``beta * C``); the bias is then None.  The dtypes are those
    of the stored tensors, which the folded values are cast back to.  ``deferred``: the adapter writes a
    folded weight given as a ``fold_math.Product`` (made block by block as it is written: a streamed load); a
    function giving a ``fold_math.Spill`` sends the checked product's blocks there as they are made.
    """

    weight: torch.Tensor
    bias: torch.Tensor | None
    weight_dtype: torch.dtype
    bias_dtype: torch.dtype
    pre: Affine | None = None
    deferred: bool | Callable[[int], Spill | None] = False


@dataclass
class Norm:
    """A batch normalization node.

    ``output`` is the value holding the normalized tensor (None when unused);
    ``axis`` the axis it normalizes.  ``problem`` is set when it can never fold
    (training mode, batch statistics, ...), with its :class:`~bnfold.report.Code` in
    ``problem_code``; ``statistics_used`` when its saved
    statistics outputs have users.  ``weight``/``bias``/``mean``/``var`` are
    value handles (None: absent).
    """

    node: Any
    input: Any
    output: Any
    weight: Any
    bias: Any
    mean: Any
    var: Any
    eps: float
    axis: int = 1
    problem: str = ""
    statistics_used: bool = False
    op: str = "batch_norm"
    affine_only: bool = False
    kind: str = "batch_norm"  # a ``bnfold.kinds.NORM_KINDS`` entry, the same in every format
    problem_code: Code = Code.UNSUPPORTED_NORM


@dataclass
class Binary:
    """An elementwise binary node ``op(a, b)``; ``op`` names a row of
    ``bnfold.fold_math.BINARY_AFFINES`` (``mul``, ``div``, ``add``, ``sub``, ``rsub``).
    ``name`` is the format's own spelling of the op (ONNX ``Mul``), used in patterns
    and reasons; empty: the same as ``op``."""

    node: Any
    op: str
    a: Any
    b: Any
    output: Any
    alpha: Any = 1
    name: str = ""


@dataclass
class Hop:
    """A node a per-channel affine moves through unchanged: one that only moves data (its
    ``output`` is its ``input``, reshaped or not), or one that picks, averages or takes the
    maximum along axes other than the channel's (select, mean, max-pool).

    ``monotone``: a maximum (max-pool, amax), which commutes with ``x * s + t`` only where
    ``s >= 0`` on every channel; the engine checks the scale that would cross it.
    ``identity``: the output is the input itself (an eval dropout, a clone): readers of either read one value.
    """

    node: Any
    input: Any
    output: Any
    op: str
    monotone: bool = False
    identity: bool = False


@dataclass
class ShapeInfo:
    """What is known of a value: its rank (None: unknown) and dtype (None: unknown)."""

    rank: int | None
    dtype: Any = None
    shape: tuple | None = None


@dataclass
class ChainStep:
    """One node of an affine chain.  The step reads ``input`` and its result is
    ``output``; ``affine`` is None for a hop.  ``operands`` are the parameter
    values that may become dead when the step is removed.  ``axis`` and
    ``rank`` place the channels in ``output`` (set on the output side).
    ``monotone``: the step is a maximum (``Hop.monotone``)."""

    node: Any
    input: Any
    output: Any
    affine: Affine | None
    op: str
    norm: Norm | None = None
    operands: tuple = ()
    axis: int = 1
    rank: int | None = None
    monotone: bool = False


@dataclass
class Outcome:
    """What one attempt at one layer did: folds made, ``(reason, code)`` keyed by the node that stays, and
    merges made (``bnfold.report.Merged``, by ``bnfold.engine.reparam``)."""

    folded: list = field(default_factory=list)
    reasons: dict = field(default_factory=dict)
    merged: list = field(default_factory=list)


@dataclass
class ConvGeometry:
    """How a conv slides over its input, per spatial axis: ``kernel`` sizes, ``stride``, ``dilation``
    and ``pads`` as ``(begin, end)``; ``groups`` as in the layer."""

    kernel: tuple
    stride: tuple
    dilation: tuple
    pads: tuple
    groups: int = 1


@dataclass
class Pool:
    """An average pool over the spatial axes of ``input`` (channels on axis 1), in ConvGeometry terms.
    ``count_include_pad``: the padded zeros count in the divisor; ``ceil_mode``: a last partial window;
    ``divisor``: a fixed divisor (None: the window size)."""

    node: Any
    input: Any
    output: Any
    op: str
    kernel: tuple
    stride: tuple
    pads: tuple
    count_include_pad: bool = True
    ceil_mode: bool = False
    divisor: int | None = None


@dataclass
class RangeOp:
    """A node as the fp16 range rewrite (``bnfold.engine.range``) reads it: ``fact`` (its op row's ``range``),
    the value holding its result, and its float ``operands`` as ``(slot, value)`` pairs in order (``slot`` is the
    adapter's key of the operand; ``value`` a value handle or a number).  ``degree``: a ``power`` op's exponent;
    ``eps``: an ``invariant`` norm's eps (None when it is not known: nothing rewrites it)."""

    node: Any
    fact: str
    output: Any
    operands: list
    degree: float | None = None
    eps: float | None = None


N = TypeVar("N")  #: the adapter's node handle (an fx ``Node``; an ONNX ``handles.Node``)
V = TypeVar("V")  #: the adapter's value handle (an fx ``Node``; an ONNX ``handles.Value``)


class GraphAdapter(Protocol[N, V]):
    """The questions the engine asks, and the primitive edits it makes.  Every question is cheap
    and has no side effect.  The engine decides every edit (which nodes go, which value stands
    where a chain ended, the shape of new tensors); the adapter only carries it out in its format.

    ``full_rank_constants``: new per-channel tensors are shaped ``[1, C, 1, 1]`` (True) or the
    shortest trailing-aligned ``[C, 1, 1]`` (False) (``bnfold.engine.edit.broadcast_shape``).
    """

    full_rank_constants: bool

    # -- classify
    def layers(self) -> Iterable[Layer]: ...  # the live layer nodes, parsed now
    def norms(self) -> Iterable[Norm]: ...  # the live normalization nodes
    def layer(self, node: N | None) -> Layer | None: ...
    def norm(self, node: N | None) -> Norm | None: ...
    def binary(self, node: N | None) -> Binary | None: ...
    def hop(self, node: N | None) -> Hop | None: ...
    # A normalization with no affine of its own (none, or an identity one) whose saved statistics nobody
    # reads: ``affine_only``, ``weight``/``bias`` None, its ``kind`` set.  The elementwise ops by constants
    # after it are its affine spelled out (``bnfold.engine.spelled``).
    def plain_norm(self, node: N | None) -> Norm | None: ...
    def plain_norms(self) -> Iterable[Norm]: ...  # the live ones

    # -- navigate (a user of None means the value leaves the graph: an output or a subgraph)
    def users(self, value: V) -> list[N | None]: ...
    def producer(self, value: V) -> N | None: ...

    # -- read
    # ``values=False``: the tensor may be a ``meta`` tensor (its shape only) where reading it costs (a streamed load):
    # a rule that needs only the shape to refuse asks so first
    def constant(self, value: V, values: bool = True) -> torch.Tensor | None: ...
    # Whether ``constant(value)`` is not None, answered without making the tensor (a streamed initializer stays on
    # disk: its element type tells)
    def is_constant(self, value: V) -> bool: ...
    # What names the stored bytes of ``value``'s constant where the format left it on disk (a streamed load), else
    # None: a key of the spans the range rewrite's calibration measured as it read them (``Planner``'s ``known``)
    def stored_key(self, value: V) -> Any: ...
    # or why they are not constants; ``values=False``: the weight may be a ``meta`` tensor (its shape and dtype
    # only) where reading it costs (a streamed load): the rules read it only for a chain that folds
    def weights(self, layer: Layer, values: bool = True) -> LayerWeights | str: ...
    def shape_info(self, value: V) -> ShapeInfo: ...
    def follow_axis(self, hop: Hop, axis: int, forward: bool) -> int | str: ...
    def describe(self, value: V) -> str: ...  # "user input 'x'", "'mul_3' (mul)"
    def node_name(self, node: N) -> str: ...  # the node's name in the graph
    def norm_label(self, norm: Norm) -> str: ...  # the name people know: module path when there is one
    def op_label(self, node: N) -> str: ...  # a node's label for reports and reasons (module path or node name)
    def describe_node(self, node: N) -> str: ...  # "'relu_1' (relu)"
    def is_live(self, node: N) -> bool: ...  # still in the graph

    # -- primitive edits
    # write_layer stores a layer's folded weight and bias (private copies of shared tensors are the
    # adapter's business) and returns the bytes those copies added, and the bias it could not put into
    # the layer (``layer.takes_bias`` False), which the engine then adds with add_bias.
    def write_layer(
        self, layer: Layer, weight: torch.Tensor, bias: torch.Tensor | None, label: str
    ) -> tuple[int, torch.Tensor | None]: ...
    # Remove the step's node; its output's users read ``source`` instead.  Returns True when the
    # output value itself lives on (it now holds ``source``'s data), False when it is gone.
    def remove_node(self, step: ChainStep, source: V) -> bool: ...
    def strip_affine(self, norm: Norm) -> None: ...  # a LayerNorm-like node keeps its normalization only
    def drop_unused(self, values: list) -> None: ...  # drop each parameter value nothing reads any more
    # Make every user of ``value`` read ``value + bias``; ``bias`` is already shaped to broadcast.
    def add_bias(self, layer: Layer, value: V, bias: torch.Tensor) -> None: ...
    # Replace a batch norm by ``x * scale + shift``; the constants are in the input's dtype and shaped.
    def lower_norm(self, norm: Norm, scale: torch.Tensor, shift: torch.Tensor) -> None: ...

    # -- re-parameterization (``bnfold.engine.reparam``): read, then one primitive edit
    def conv_geometry(self, layer: Layer) -> ConvGeometry | str: ...  # or why it is not known
    def pool(self, node: N | None) -> Pool | None: ...  # an average pool, or None
    # ``a += b`` / ``a -= b`` (fx ``add_``): a Binary whose output is ``a`` mutated; None in a format
    # without in-place ops.  The engine reads it as a sum only where nothing else reads ``a``.
    def inplace_sum(self, node: N | None) -> Binary | None: ...
    def inputs(self, node: N) -> list[V]: ...  # the values ``node`` reads, in order
    # Remove ``nodes`` (the engine chose them: they compute ``old`` and nothing else reads them once
    # ``old`` is replaced) and make every reader of ``old`` read ``new``; a graph output keeps its name.
    def bypass(self, old: V, new: V, nodes: list[N]) -> None: ...

    # -- fp16 range rewrite (``bnfold.engine.range``): read, then primitive edits
    def range_op(self, node: N | None) -> RangeOp | None: ...  # None: an op with no range fact
    def ordered_nodes(self) -> list[N]: ...  # the live nodes in graph order
    def values(self) -> list[V]: ...  # the graph's inputs and its nodes' outputs (the main graph)
    def value_name(self, value: V) -> str: ...  # the value's name in the numerics program (``numerics.runner``)
    # The operand at ``slot`` of ``node`` (a constant) times ``2 ** exponent`` (``fold_math.scale_pow2``, FoldError
    # where not exact), as ``scale_operand`` writes it: it becomes that for ``node`` alone.
    def scaled_operand(self, node: N, slot: Any, exponent: int) -> Any: ...
    def scale_operand(self, node: N, slot: Any, new: Any) -> None: ...
    def set_eps(self, node: N, eps: float) -> None: ...  # an ``invariant`` norm's eps
    # ``value * factor`` as a new node; ``readers`` (nodes; None among them: the graph output) read it instead of
    # ``value`` (``readers`` None: every reader).  Returns the value holding the product.
    def insert_mul(self, value: V, factor: float, readers: list | None = None) -> V: ...
    # Where the node ``insert_mul`` made stands in ``ordered_nodes()``: ``(True, the node right before it)`` (None:
    # it is first), or ``(False, None)``: not listed there (an ONNX node is placed when the graph is compacted).
    # A question of its neighbours, never a walk over the graph.
    def mul_placed(self, node: N) -> tuple[bool, N | None]: ...
