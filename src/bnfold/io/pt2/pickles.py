"""``torch.save`` payloads torch may unpickle with ``weights_only=False``: a static scan of every
pickle's globals against torch's own ``weights_only`` allowlist (nothing is unpickled)."""

from __future__ import annotations

import io
import pickletools
from typing import Any

from ..errors import one_line
from .layout import ZIP_MAGIC
from .payloads import weights_only_problem


def allowed_pickle_globals() -> frozenset[str]:
    """torch's own ``weights_only`` allowlist (without user-added safe globals)."""
    try:
        from torch._weights_only_unpickler import _get_allowed_globals

        return frozenset(_get_allowed_globals())
    except Exception:  # noqa: BLE001  # pragma: no cover - torch moved it; fall back to the tensor essentials
        import torch

        names = {
            "collections.OrderedDict",
            "torch._utils._rebuild_tensor_v2",
            "torch._utils._rebuild_parameter",
            "torch.Size",
            "torch.device",
        }
        names.update(f"torch.{t.__name__}" for t in torch._storage_classes)
        names.update(str(t) for t in torch.storage._dtype_to_storage_type_map())
        return frozenset(names)


def check_torch_save_payload(blob: bytes, entry: str) -> list[str]:
    """Problems with a ``torch.save`` payload that torch may unpickle with ``weights_only=False``."""
    if len(blob) == 0:
        return []  # torch treats an empty payload as {}
    if blob[:4] != ZIP_MAGIC:
        return [f"{entry} is a legacy (non-zip) pickle that torch would unpickle"]
    try:
        import torch

        inner = torch._C.PyTorchFileReader(io.BytesIO(blob))
        names = list(inner.get_all_records())
    except Exception:  # noqa: BLE001
        return [f"{entry} is not a readable torch.save payload"]
    if "constants.pkl" in names or any(n.startswith("code/") for n in names):
        return [f"{entry} is a TorchScript archive, which torch.load hands to torch.jit.load"]
    pickles = [n for n in names if n.endswith(".pkl")]
    if "data.pkl" not in pickles:
        return [f"{entry} has no data.pkl"]
    allowed = allowed_pickle_globals()
    problems = []
    for name in pickles:
        try:
            found = pickle_globals(bytes(inner.get_record(name)))
        except Unresolvable as e:
            problems.append(f"{entry} has a pickle that cannot be checked ({e})")
            continue
        bad = sorted({g for g in found if g not in allowed})
        if bad:
            problems.append(f"{entry} is a pickle that would import {', '.join(bad[:3])}")
    if not problems:
        problem = weights_only_problem(blob, entry)
        if problem:
            problems.append(problem)
    return problems


class Unresolvable(Exception):
    pass


_STRING_OPS = {
    "STRING",
    "BINSTRING",
    "SHORT_BINSTRING",
    "UNICODE",
    "BINUNICODE",
    "SHORT_BINUNICODE",
    "BINUNICODE8",
}
_GET_OPS = {"GET", "BINGET", "LONG_BINGET"}
_PUT_OPS = {"PUT", "BINPUT", "LONG_BINPUT"}
_MARK = object()


def pickle_globals(data: bytes) -> list[str]:
    """Every global (``module.name``) a pickle would import, found without unpickling it.

    Simulates the unpickler's stack so that ``STACK_GLOBAL`` operands pushed
    directly or fetched from the memo are resolved; anything it cannot resolve
    (``EXT*`` codes, computed names, a malformed stream) raises ``Unresolvable``.
    """
    stack: list[Any] = []
    memo: dict[Any, Any] = {}
    found: list[str] = []

    def pop(n: int = 1) -> list[Any]:
        if len(stack) < n:
            raise Unresolvable("stack underflow")
        out = stack[len(stack) - n :]
        del stack[len(stack) - n :]
        return out

    try:
        for op, arg, _pos in pickletools.genops(data):
            name = op.name
            if name in ("GLOBAL", "INST"):
                module, _, qual = str(arg).partition(" ")
                found.append(f"{module}.{qual}")
            elif name == "STACK_GLOBAL":
                module, qual = pop(2)
                if not isinstance(module, str) or not isinstance(qual, str):
                    raise Unresolvable("a global whose name is computed")
                found.append(f"{module}.{qual}")
                stack.append(None)
                continue
            elif name in ("EXT1", "EXT2", "EXT4"):
                raise Unresolvable("an extension-registry global")
            if name == "MARK":
                stack.append(_MARK)
                continue
            if name in _PUT_OPS:
                if not stack:
                    raise Unresolvable("stack underflow")
                memo[arg] = stack[-1]
                continue
            if name == "MEMOIZE":
                if not stack:
                    raise Unresolvable("stack underflow")
                memo[len(memo)] = stack[-1]
                continue
            if name in _GET_OPS:
                stack.append(memo.get(arg))
                continue
            before = op.stack_before
            if pickletools.markobject in before:
                while stack and stack[-1] is not _MARK:
                    stack.pop()
                if not stack:
                    raise Unresolvable("no mark")
                stack.pop()
                pop(before.index(pickletools.markobject))
            else:
                pop(len(before))
            if name in _STRING_OPS:
                stack.append(arg if isinstance(arg, str) else None)
            else:
                stack.extend([None] * len(op.stack_after))
    except Unresolvable:
        raise
    except Exception as e:  # noqa: BLE001 - a malformed pickle stream
        raise Unresolvable(one_line(e)) from None
    return found
