"""The run-time check: the one function every runner calls just before an op runs, and the watchdog
around a command.

The cost model (:mod:`bnfold.io.cost`) bounds a run before it starts, from sizes recomputed from the
ops.  What it cannot size beforehand (a Resize whose scales the graph computes, a size read from a
tensor, an op with no meta kernel) is checked here, when the op is about to run and its arguments
are real: :func:`before_op` runs the op's own meta kernels (``device="meta"``: shapes, no data, no
memory) on those arguments and refuses an op whose outputs would exceed the budget, *before* it
allocates.  The numerics runner (torch and ONNX programs, through :class:`OpSizes`, which skips the meta
run where a shape fact's bound or an earlier batch of the same signature already answers) and the
constant evaluators (torch and ONNX) call it at one point each.

:func:`watch` wraps a command (the CLI wraps each one):

* it records the op running now, so that an allocator failure inside the audit or a constant
  evaluator (``MemoryError``, torch's ``RuntimeError`` "can't allocate") becomes one line naming
  that op (:class:`~bnfold.io.cost.WorkError`, exit 2), never an internal error;
* when the audit's plan is known (:func:`expect`, called by ``numerics.audit_memory``), it bounds the
  CPU time of the op loop (:data:`CPU_FLOOR_S` plus the plan's FLOPs at :data:`CPU_FLOPS_PER_S`),
  checked before each op, and, with ``address_cap``, caps the process's address space
  (``RLIMIT_AS``) at what it maps now plus twice the byte budget plus :data:`ADDRESS_HEADROOM`
  for torch, where the OS allows it; the previous limit comes back when the command ends.
"""

from __future__ import annotations

import contextlib
import contextvars
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from .budget import MAX_WORK_HINT, Budget, WorkError, sizes_text
from .sizes import elements

CPU_FLOOR_S = 120.0  # seconds of CPU any audit may take, whatever its plan
CPU_FLOPS_PER_S = 1e8  # the plan's FLOPs at this rate (far below any CPU) on top of the floor
ADDRESS_HEADROOM = 1 << 30  # address space left to torch (threads, allocator slack) above the budget
SMALL_REAL = 16  # tensors of at most this many elements stay real in the meta run (shapes, scales)


@dataclass
class Run:
    """One watched command: the op running now, and the bounds :func:`expect` set."""

    address_cap: bool = False
    where: str = ""
    op: str = ""
    budget: Budget | None = None
    cpu_deadline: float | None = None
    sized: Mapping = field(default_factory=dict)  # the values the plan sized with the ops' own meta kernels: bytes
    saved_limit: tuple[int, int] | None = None

    def release(self) -> None:
        if self.saved_limit is not None:
            import resource

            with contextlib.suppress(ValueError, OSError):
                resource.setrlimit(resource.RLIMIT_AS, self.saved_limit)
            self.saved_limit = None


_RUN: contextvars.ContextVar[Run | None] = contextvars.ContextVar("bnfold_run", default=None)


def allocator_failure(e: BaseException) -> bool:
    """Whether ``e`` is the allocator saying no (``MemoryError``, torch's "can't allocate")."""
    if isinstance(e, MemoryError):
        return True
    text = str(e)
    return isinstance(e, RuntimeError) and ("can't allocate" in text or "out of memory" in text.lower())


@contextlib.contextmanager
def watch(address_cap: bool = False) -> Iterator[Run]:
    """Watch one command (see the module docstring); an allocator failure inside becomes a one-line
    :class:`WorkError` naming the op that was running."""
    run = Run(address_cap)
    token = _RUN.set(run)
    try:
        yield run
    except (MemoryError, RuntimeError) as e:
        if not allocator_failure(e):
            raise
        where = f"{run.where}: " if run.where else ""
        at = f"running {run.op}" if run.op else "running the model"
        raise WorkError(f"{where}out of memory while {at}; {MAX_WORK_HINT}") from None
    finally:
        _RUN.reset(token)
        run.release()


def watching() -> bool:
    """Whether a watched command is running (:func:`watch`): without one, :func:`before_op` has nothing to do."""
    return _RUN.get() is not None


def expect(budget: Budget, flops: int, where: str, sized: Mapping | None = None) -> None:
    """The plan of the run about to start (``numerics.audit_memory``): its byte budget bounds each op, its
    FLOPs the CPU time of the op loop, and (with ``address_cap``) the process's address space; ``sized``:
    the values whose sizes it read from what the ops' meta kernels give, and their bytes
    (:attr:`bnfold.io.cost.Plan.sized`)."""
    sized = sized or {}
    run = _RUN.get()
    if run is None:
        return
    run.where, run.budget, run.sized = where, budget, sized
    run.cpu_deadline = time.process_time() + CPU_FLOOR_S + flops / CPU_FLOPS_PER_S
    if run.address_cap and run.saved_limit is None:
        _cap_address_space(run, budget)


def _mapped_bytes() -> int | None:
    try:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[0])
        import resource

        return pages * resource.getpagesize()
    except (OSError, ValueError, IndexError, ImportError):
        return None


def _cap_address_space(run: Run, budget: Budget) -> None:
    """``RLIMIT_AS`` at what is mapped now + 2 x the budget + the headroom (never above the hard limit)."""
    try:
        import resource
    except ImportError:  # not on this OS
        return
    mapped = _mapped_bytes()
    if mapped is None:
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = mapped + 2 * budget.bytes + ADDRESS_HEADROOM
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)
    if soft != resource.RLIM_INFINITY and soft <= cap:
        return  # already tighter
    try:
        resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    except (ValueError, OSError):
        return
    run.saved_limit = (soft, hard)


def before_op(
    label: str,
    fn: Callable[..., Any] | None = None,
    args: Any = (),
    kwargs: dict | None = None,
    *,
    budget: Budget | None = None,
    nbytes: int | None = None,
    values: tuple | list = (),
    held: Callable[[int], int] | None = None,
) -> list[Out] | None:
    """The check just before the op ``label`` runs ``fn(*args, **kwargs)`` on real values.

    Records the op (an allocator failure names it), stops the op loop past its CPU time, and sizes
    the op's outputs: ``nbytes`` when the caller knows them, else ``fn``'s meta kernels on meta
    copies of the arguments, unless the watched run's plan sized every one of the op's output
    ``values`` (names) with those kernels already (:func:`expect`: then its sizes are the plan's).  Outputs over
    ``budget`` (default: the watched run's) are refused (:class:`WorkError`) before anything is allocated;
    ``held(nbytes)``: what the run holds in all once it has made outputs of ``nbytes`` (the values it holds already
    and what it keeps of these, as the plan counts them), checked in their place.  Returns the outputs the meta
    kernels found (:class:`Out`), or None when none was asked for or no meta kernel tells."""
    run = _RUN.get()
    if run is not None:
        run.op = label
        if run.cpu_deadline is not None and time.process_time() > run.cpu_deadline:
            where = f"{run.where}: " if run.where else ""
            raise WorkError(
                f"{where}the run passed its CPU-time bound at {label} (the plan's FLOPs take far less); {MAX_WORK_HINT}"
            )
        if values and run.sized and budget is None and nbytes is None and all(v in run.sized for v in values if v):
            if held is None:
                return None  # the plan counted these outputs within the budget
            nbytes = sum(run.sized[v] for v in values if v)  # the plan's sizes: what the run holds with them is checked
    limit = budget or (run.budget if run is not None else None)
    outs = None
    if nbytes is None and fn is not None and limit is not None:
        outs = meta_outputs(fn, args, kwargs or {})
        nbytes = None if outs is None else sum(o.nbytes for o in outs)
    total = nbytes if held is None or nbytes is None else held(nbytes)
    if limit is not None and total is not None and total > limit.bytes:
        where = f"{run.where}: " if run is not None and run.where else ""
        made, whole, budget_text = sizes_text(nbytes, total, limit.bytes)
        holds = "" if total == nbytes else f" (the run would hold {whole} with what it holds already)"
        raise WorkError(f"{where}{label} would create {made}{holds}, over the budget of {budget_text}; {MAX_WORK_HINT}")
    return outs


class OpSizes:
    """:func:`before_op` for the ops of one program, run batch after batch (the numerics runner's), with the meta
    run only where nothing else sizes an op's outputs: the plan (``values`` it sized), a bound from the op's shape
    fact (:func:`shape_bound`) within the budget, or the meta run of the same op (``key``) on inputs of the same
    signature (:func:`meta_signature`: it would find what it found; the bound too, computed once per signature).  The
    same decisions as :func:`before_op`'s."""

    def __init__(self):
        self._found: dict[Any, tuple] = {}  # key -> (input signature, its outputs' bytes or None: no meta kernel tells)
        self._bounds: dict[
            Any, tuple
        ] = {}  # key -> (input signature, its shape fact's bound: a function of the shapes)

    def check(
        self, key, label: str, fn, args, ins: list, outs: int, values=(), shape="", channel_axis=None, held=None
    ) -> int | None:
        """Check the op ``key`` (``label``) about to run ``fn(*args)`` on the tensors ``ins`` into ``outs`` outputs
        (``held``: see :func:`before_op`).  Returns what sized it, where a function of the inputs' signature alone:
        the bytes it compared (``held`` of them) with the budget (the plan's bytes where the plan sized its outputs),
        else None (no budget, no signature, no meta kernel tells)."""
        run = _RUN.get()
        if run is None or run.budget is None:  # the op is recorded (an allocator failure names it); nothing to size
            before_op(label, values=values)
            return None
        if values and run.sized and all(v in run.sized for v in values if v):  # the plan sized them: their bytes,
            before_op(label, values=values, held=held)  # with what the run holds, whatever the signature
            return sum(run.sized[v] for v in values if v)
        sig = meta_signature(ins)
        found = self._found.get(key)
        if found is not None and found[0] == sig:
            before_op(label, values=values, nbytes=found[1], held=held)
            return found[1]
        known = self._bounds.get(key)
        if known is not None and known[0] == sig:
            bound = known[1]
        else:
            bound = shape_bound(shape, ins, outs, channel_axis)
            if sig is not None:
                self._bounds[key] = (sig, bound)
        if bound is not None and (bound if held is None else held(bound)) <= run.budget.bytes:
            before_op(label, values=values)
            return None if sig is None else bound
        outs = before_op(label, fn, args, values=values, held=held)
        nbytes = None if outs is None else sum(o.nbytes for o in outs)
        if sig is not None:
            self._found[key] = (sig, nbytes)
        return nbytes if sig is not None else None


#: what a run that records its checks keeps of an op nothing sized whose outputs follow from its small inputs
#: (``numerics.runner``): nothing is compared for it at run time
PLANNED = -1


def budget_bytes() -> int | None:
    """The byte budget of the watched command running now (None: none, or no plan yet)."""
    run = _RUN.get()
    return None if run is None or run.budget is None else run.budget.bytes


def shape_bound(shape: str, ins: list, outs: int, channel_axis: int | None = None) -> int | None:
    """An upper bound on the bytes of the ``outs`` outputs of an op on ``ins`` (values; the first its main input) from
    its op table's ``shape`` fact (``bnfold.engine.optable.Op``), at 16 bytes an element (the widest dtype): the
    inputs' broadcast shape (``broadcast``); the first input's elements for a reduction (``reduced``), where every
    other input holds at most one element (``same``), or where each is a vector of one element per channel along
    ``channel_axis`` (a batch norm's parameters); else None (an input could make the outputs larger)."""
    import torch

    tensors = [t for t in ins if isinstance(t, torch.Tensor)]
    x = ins[0] if ins and isinstance(ins[0], torch.Tensor) else None
    others = tensors[1:] if x is not None else ()
    if x is not None and (shape == "reduced" or shape == "same" and all(t.numel() <= 1 for t in others)):
        n = x.numel()  # a reduction's other inputs name its axes: they add no element
    elif x is not None and channel_axis is not None and -x.dim() <= channel_axis < x.dim():
        channels = x.shape[channel_axis]
        if not all(t.dim() == 1 and t.numel() == channels for t in others):
            return None
        n = x.numel()
    elif shape == "broadcast" and tensors:
        try:
            n = elements(torch.broadcast_shapes(*(t.shape for t in tensors)))
        except RuntimeError:  # no broadcast shape: the op fails, as the meta run would say
            return None
    else:
        return None
    return outs * n * 16


@dataclass(frozen=True)
class Out:
    """One tensor output an op will make: its dims and bytes."""

    dims: tuple[int, ...]
    nbytes: int


def meta_outputs(fn: Callable[..., Any], args: Any, kwargs: dict) -> list[Out] | None:
    """The tensor outputs of ``fn(*args, **kwargs)``, computed by meta kernels (no data, no memory):
    first with small tensors (shapes, scales: read as numbers) kept real, then all meta; None when
    no meta kernel tells."""
    for keep in (SMALL_REAL, 0):
        try:
            return _outputs(_on_meta(fn, args, kwargs, keep))
        except Exception:  # noqa: BLE001 - no meta kernel, or a value only the real run has
            continue
    return None


def meta_signature(values: list) -> tuple | None:
    """What a meta run (:func:`meta_outputs`) reads of ``values``, an op's tensor inputs: each one's dtype, shape
    and strides, and the elements of those it keeps real (a tuple of them: theirs); None when a value is neither a
    tensor, such a tuple nor None.  Two
    runs of one op on values of the same signature find the same outputs."""
    import torch

    sig = []
    for v in values:
        if isinstance(v, torch.Tensor):
            small = tuple(v.reshape(-1).tolist()) if v.numel() <= SMALL_REAL else None
            sig.append((v.dtype, tuple(v.shape), v.stride(), small))
        elif v is None:
            sig.append(None)
        elif isinstance(v, tuple) and (inner := meta_signature(list(v))) is not None:  # an op's several outputs
            sig.append(("tuple", inner))
        else:
            return None
    return tuple(sig)


def _on_meta(fn: Callable[..., Any], args: Any, kwargs: dict, keep: int) -> Any:
    import torch
    from torch.utils._pytree import tree_flatten, tree_map

    # the op's first tensor is its data when it is a float tensor of more than one element: never real, whatever
    # its size (a tiny input Resized by computed scales would be allocated for real in the meta run)
    first = next((v for v in tree_flatten(tuple(args))[0] if isinstance(v, torch.Tensor)), None)
    data = first if first is not None and first.is_floating_point() and first.numel() > 1 else None

    def meta(v):
        if isinstance(v, torch.Tensor) and v.device.type != "meta" and (v.numel() > keep or v is data):
            return torch.empty_strided(tuple(v.shape), tuple(v.stride()), dtype=v.dtype, device="meta")
        return v

    m_args, m_kwargs = tree_map(meta, (tuple(args), dict(kwargs)))
    schema = getattr(fn, "_schema", None)
    if schema is not None:  # an ATen op (zeros, arange, full ...): its device argument, not the context, decides
        names = [a.name for a in schema.arguments]
        if "device" in names:
            i = names.index("device")
            if i < len(m_args):
                m_args = (*m_args[:i], torch.device("meta"), *m_args[i + 1 :])
            else:
                m_kwargs["device"] = torch.device("meta")
    with torch.device("meta"):  # tensors a Python op makes from nothing (torch.ones ...) are meta too
        out = fn(*m_args, **m_kwargs)
    if any(isinstance(v, torch.Tensor) and v.device.type != "meta" for v in tree_flatten(out)[0]):
        raise RuntimeError("the op made a real tensor")  # never trust a size that was really allocated
    return out


def _outputs(value: Any) -> list[Out]:
    import torch
    from torch.utils._pytree import tree_flatten

    from .sizes import elements

    out = []
    for v in tree_flatten(value)[0]:
        if isinstance(v, torch.Tensor):
            dims = tuple(int(d) for d in v.shape)
            out.append(Out(dims, elements(dims) * v.element_size()))
    return out
