"""Inspect a ``.pt2`` archive before ``torch.export.load`` sees it.

``torch.export.load`` (torch 2.13) runs code from the file in these places; each
is checked here, on the archive's bytes, before any of them is unpickled:

1. **Pickled weights and constants.**  ``data/weights/<m>_weights_config.json``
   and ``data/constants/<m>_constants_config.json`` mark an entry with
   ``"use_pickle": true``; ``_load_state_dict`` / ``_load_constants`` then call
   ``torch.load(..., weights_only=False)`` on it.  Constants named
   ``custom_obj_*`` go through ``torch._C._pickle_load_obj`` (TorchScript /
   torchbind unpickler) and ``opaque_obj_*`` through plain ``pickle.loads``.
   All three are refused.
2. **Sample inputs and legacy weight files.**  ``data/sample_inputs/<m>.pt``
   (and the legacy ``data/weights/<m>.pt`` / ``data/constants/<m>.pt``) go
   through ``deserialize_torch_artifact``, which tries ``weights_only=True``
   and on *any* error retries with ``weights_only=False``.  These payloads are
   accepted only when a static scan of every pickle in them finds nothing but
   globals on torch's own ``weights_only`` allowlist, so that even the
   fallback can only rebuild tensors and containers.  TorchScript archives
   (``torch.load`` hands those to ``torch.jit.load``) and pre-1.6 non-zip
   ``torch.save`` pickles are refused.
3. **Symbolic shapes.**  Every ``expr_str`` in ``models/<m>.json`` is passed to
   ``sympy.sympify``, which is ``eval``; each must be a plain arithmetic
   expression over shape symbols and known sympy/torch functions.
4. **Guards.**  ``guards_code`` strings in ``models/<m>.json`` are ``exec``-ed
   by ``ExportedProgram.module()``; each must be a shape comparison (checked
   on its Python AST against an allowlist of names and attributes).
5. **AOTInductor.**  Entries under ``data/aotinductor/`` make
   ``torch.export.load`` load a compiled shared library; refused.
6. **Generated code.**  torch.fx writes the graph module's Python source from
   names in ``models/<m>.json`` and execs it during the load: a placeholder
   named ``x=__import__('os').system(...)`` becomes a default argument.  Node,
   value and keyword names must be identifiers, parameter / buffer / module
   paths dotted names.  Constant user inputs (``as_string`` ...) are pasted
   into guard source by ``.module()``; strings with quotes, backslashes or
   newlines and ints / bools of the wrong type are refused.
7. **The legacy fallback.**  When ``load_pt2`` raises ``RuntimeError``,
   ``torch.export.load`` re-reads the file as a pre-2.7 zip
   (``version``, ``serialized_state_dict.pt`` ...) and unpickles with the
   same ``weights_only=False`` fallback.  Only a well-formed pt2 archive (one
   root folder, no duplicate names, Python's ``zipfile`` and torch's reader
   agreeing on the entries) is accepted, so that path never finds its files.

8. **Pytree specs.**  ``in_spec`` / ``out_spec`` strings are checked as data
   by :mod:`bnfold.io.treespec` (``treespec_loads`` imports modules named in
   enum / defaultdict contexts, and dict keys reach generated code).
9. **Operators.**  Every graph node target must be on the allowlist of
   :mod:`bnfold.io.op_allowlist` (``audit`` executes the graph).
10. **Bounded work.**  Entry sizes within the byte budget and no zip bomb
    (:mod:`bnfold.io.limits`), JSON depth bounded before parsing, expressions
    with small integers and exponents, tensor records matching their declared
    views, and pickles that ``torch.load(weights_only=True)`` loads as they
    are (:mod:`bnfold.io.pt2_payloads`).

The caller reads the file once and passes the same bytes to the inspection
and to ``torch.export.load`` (see ``bnfold.io.pt2``), so the file cannot
change in between.  The list above is what torch 2.13's loader does; a newer
torch may add ways to run code that this module does not know about.
"""

from __future__ import annotations

import ast
import io
import json
import pickletools
import re
import zipfile
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ..errors import ModelFileError, UnsafeModelError
from .errors import one_line
from .limits import MAX_BYTES_HINT, RATIO_FREE_BYTES, Limits, json_depth, loads_json
from .op_allowlist import target_is_allowed
from .pt2_payloads import check_records, weights_only_problem
from .treespec import check_namedtuple_fields, is_plain_name, treespec_problem

ZIP_MAGIC = b"PK\x03\x04"

# torch/export/pt2_archive/constants.py (torch 2.13); read from torch at run time
# when available so that a renamed layout is noticed rather than silently missed.
_LAYOUT_DEFAULTS = {
    "AOTINDUCTOR_DIR": "data/aotinductor/",
    "ARCHIVE_FORMAT_PATH": "archive_format",
    "ARCHIVE_FORMAT_VALUE": "pt2",
    "ARCHIVE_VERSION_PATH": "archive_version",
    "ARCHIVE_VERSION_VALUE": "0",
    "CONSTANTS_CONFIG_FILENAME_FORMAT": "data/constants/{}_constants_config.json",
    "CONSTANTS_DIR": "data/constants/",
    "CUSTOM_OBJ_FILENAME_PREFIX": "custom_obj_",
    "MODELS_DIR": "models/",
    "MODELS_FILENAME_FORMAT": "models/{}.json",
    "OPAQUE_OBJ_FILENAME_PREFIX": "opaque_obj_",
    "SAMPLE_INPUTS_FILENAME_FORMAT": "data/sample_inputs/{}.pt",
    "TENSOR_CONSTANT_FILENAME_PREFIX": "tensor_",
    "WEIGHTS_CONFIG_FILENAME_FORMAT": "data/weights/{}_weights_config.json",
    "WEIGHTS_DIR": "data/weights/",
}


def _layout() -> dict[str, str]:
    try:
        from torch.export.pt2_archive import constants as c
    except Exception:  # noqa: BLE001  # pragma: no cover - older or newer torch without the module
        return dict(_LAYOUT_DEFAULTS)
    return {k: getattr(c, k, v) for k, v in _LAYOUT_DEFAULTS.items()}


# ----------------------------------------------------------------------------- result


@dataclass
class Pt2Inspection:
    """What the inspection found.  ``unsafe`` lists one line per risky entry."""

    models: list[str] = field(default_factory=list)
    unsafe: list[str] = field(default_factory=list)

    @property
    def safe(self) -> bool:
        return not self.unsafe


TRUST_HINT = "pass --trust only if you trust whoever made this file"


def check_pt2_bytes(data: bytes, source: str, limits: Limits | None = None) -> Pt2Inspection:
    """Raise ``ModelFileError`` for a malformed archive, ``UnsafeModelError`` for a risky one."""
    result = inspect_pt2_bytes(data, source, limits)
    if result.unsafe:
        more = f" (and {len(result.unsafe) - 1} more)" if len(result.unsafe) > 1 else ""
        err = UnsafeModelError(
            f"{source}: refusing to load: {result.unsafe[0]}{more}; "
            f"loading it could run code from the file; {TRUST_HINT}"
        )
        err.findings = list(result.unsafe)  # type: ignore[attr-defined]
        raise err
    return result


def inspect_pt2_bytes(data: bytes, source: str, limits: Limits | None = None) -> Pt2Inspection:
    """Inspect an archive's bytes; raises ``ModelFileError`` if it is not a loadable pt2 archive."""
    L = _layout()
    result = Pt2Inspection()
    records = _Archive(data, source, result, limits)

    fmt = records.get(L["ARCHIVE_FORMAT_PATH"])
    if fmt is None or fmt.strip() != L["ARCHIVE_FORMAT_VALUE"].encode():
        raise ModelFileError(f"{source}: {records.describe_foreign()}")
    version = records.get(L["ARCHIVE_VERSION_PATH"])
    if version is None or version.decode("utf-8", "replace") != L["ARCHIVE_VERSION_VALUE"]:
        shown = "missing" if version is None else repr(version.decode("utf-8", "replace")[:20])
        raise ModelFileError(
            f"{source}: pt2 archive version {shown} is not supported by this torch "
            f"(expects {L['ARCHIVE_VERSION_VALUE']!r})"
        )

    for name in records.names:
        if name.startswith(L["AOTINDUCTOR_DIR"]):
            result.unsafe.append(
                f"{name} is AOTInductor compiled code, which torch.export.load loads as a native library"
            )
            break

    models_dir = L["MODELS_DIR"]
    model_files = [n for n in records.names if n.startswith(models_dir)]
    if not model_files:
        raise ModelFileError(f"{source}: the archive holds no exported program (no {models_dir}*.json entry)")
    for entry in model_files:
        if not entry.endswith(".json"):
            raise ModelFileError(f"{source}: unexpected entry {entry} in {models_dir}")
        model = entry[len(models_dir) : -len(".json")]
        result.models.append(model)
        _check_model(records, model, entry, L, result)
    if "model" not in result.models:
        raise ModelFileError(f"{source}: the archive holds no program named 'model' (found {', '.join(result.models)})")
    return result


# ----------------------------------------------------------------------------- archive views


class _Archive:
    """One pt2 zip seen through both zip readers torch.export.load may use."""

    def __init__(self, data: bytes, source: str, result: Pt2Inspection, limits: Limits | None = None):
        self.source = source
        self.limits = limits or Limits()
        self.sizes: dict[str, int] = {}
        if len(data) == 0:
            raise ModelFileError(f"{source}: the file is empty")
        if data[:4] != ZIP_MAGIC:
            raise ModelFileError(f"{source}: not a .pt2 archive (not a zip file; {sniff(data)})")
        try:
            with zipfile.ZipFile(io.BytesIO(data)) as zf:
                infos = zf.infolist()
        except (zipfile.BadZipFile, EOFError, ValueError, OSError) as e:
            raise ModelFileError(f"{source}: truncated or corrupted zip archive ({one_line(e)})") from None
        names = [i.filename for i in infos if not i.filename.endswith("/")]
        if not names:
            raise ModelFileError(f"{source}: the zip archive is empty")
        _check_sizes(infos, len(data), source, self.limits)
        counts = Counter(names)
        dup = next((n for n, c in counts.items() if c > 1), None)
        if dup is not None:
            result.unsafe.append(f"entry {dup} appears twice, and zip readers disagree about which one counts")
        roots = {n.split("/", 1)[0] if "/" in n else None for n in names}
        if None in roots or len(roots) != 1:
            # torch's reader needs one root folder; without it torch.export.load
            # falls back to its legacy zip reader, which unpickles unsafely.
            top = sorted(n for n in names if "/" not in n)[:3]
            self.names = []
            self.reader = None
            self._foreign_top = top
            raise ModelFileError(f"{source}: {self.describe_foreign()}")
        root = roots.pop()
        ours = {n[len(root) + 1 :] for n in names}
        try:
            import torch

            self.reader = torch._C.PyTorchFileReader(io.BytesIO(data))
            torch_names = list(self.reader.get_all_records())
        except Exception as e:  # noqa: BLE001
            self.names, self._foreign_top = sorted(ours), []
            if _layout()["ARCHIVE_FORMAT_PATH"] not in ours:
                raise ModelFileError(f"{source}: {self.describe_foreign()}") from None
            raise ModelFileError(f"{source}: not a readable torch archive ({one_line(e)})") from None
        if set(torch_names) != ours:
            result.unsafe.append("Python's zip reader and torch's disagree about the entries in the archive")
        self.names = sorted(set(torch_names))
        self.sizes = {i.filename[len(root) + 1 :]: i.file_size for i in infos}
        self._foreign_top = []

    def has(self, name: str) -> bool:
        return name in self.names

    def get(self, name: str) -> bytes | None:
        if name not in self.names:
            return None
        try:
            return bytes(self.reader.get_record(name))
        except Exception as e:  # noqa: BLE001
            raise ModelFileError(f"{self.source}: entry {name} is corrupted ({one_line(e)})") from None

    def need(self, name: str) -> bytes:
        data = self.get(name)
        if data is None:
            raise ModelFileError(f"{self.source}: the archive lacks {name}")
        return data

    def describe_foreign(self) -> str:
        names = set(self.names)
        top = set(self._foreign_top)
        if "data.pkl" in names:
            return "a torch.save checkpoint, not a torch.export program (save one with torch.export.save)"
        if "constants.pkl" in names or any(n.startswith("code/") for n in names):
            return "a TorchScript archive, not a torch.export program (save one with torch.export.save)"
        if "version" in top or "serialized_exported_program.json" in top:
            return "a pre-2.7 torch.export archive or a foreign zip layout; re-save it with torch.export.save"
        return "not a torch.export .pt2 archive (no archive_format 'pt2' entry)"


def _check_sizes(infos: list[zipfile.ZipInfo], file_size: int, source: str, limits: Limits) -> None:
    """Refuse an archive whose entries unpack to more than the byte budget, or that inflate like a zip bomb."""
    budget = limits.byte_budget(file_size)
    total = sum(i.file_size for i in infos)
    if total > budget:
        raise ModelFileError(
            f"{source}: the archive unpacks to {total} bytes, over the limit of {budget}; {MAX_BYTES_HINT}"
        )
    for i in infos:
        if i.file_size > RATIO_FREE_BYTES and i.file_size > limits.zip_ratio * max(i.compress_size, 1):
            raise ModelFileError(
                f"{source}: entry {i.filename} inflates {i.file_size // max(i.compress_size, 1)}-fold "
                f"(at most {limits.zip_ratio} is accepted); refused as a zip bomb"
            )


def _check_model(records: _Archive, model: str, entry: str, L: dict[str, str], result: Pt2Inspection) -> None:
    src = records.source
    doc = loads_json(records.need(entry), f"{src}: {entry}", records.limits)
    if not isinstance(doc, dict):
        raise ModelFileError(f"{src}: {entry} is not a serialized exported program")
    result.unsafe.extend(check_program_json(doc, entry, records.limits))

    sample = L["SAMPLE_INPUTS_FILENAME_FORMAT"].format(model)
    result.unsafe.extend(check_torch_save_payload(records.need(sample), sample))
    for kind in ("WEIGHTS", "CONSTANTS"):
        cfg_name = L[f"{kind}_CONFIG_FILENAME_FORMAT"].format(model)
        if records.has(cfg_name):
            check_records(records, _payload_config(records, cfg_name), L[f"{kind}_DIR"], cfg_name)

    legacy_weights = f"{L['WEIGHTS_DIR']}{model}.pt"
    if records.has(legacy_weights):
        result.unsafe.extend(check_torch_save_payload(records.need(legacy_weights), legacy_weights))
    else:
        cfg_name = L["WEIGHTS_CONFIG_FILENAME_FORMAT"].format(model)
        for fqn, meta in _payload_config(records, cfg_name).items():
            if meta.get("use_pickle", False):
                path = L["WEIGHTS_DIR"] + str(meta.get("path_name", "?"))
                result.unsafe.append(f"weight {fqn} ({path}) is pickled and would be loaded with weights_only=False")

    legacy_constants = f"{L['CONSTANTS_DIR']}{model}.pt"
    if records.has(legacy_constants):
        result.unsafe.extend(check_torch_save_payload(records.need(legacy_constants), legacy_constants))
    else:
        cfg_name = L["CONSTANTS_CONFIG_FILENAME_FORMAT"].format(model)
        for fqn, meta in _payload_config(records, cfg_name).items():
            path_name = meta.get("path_name")
            if not isinstance(path_name, str):
                raise ModelFileError(f"{src}: {cfg_name}: constant {fqn} has no path_name")
            path = L["CONSTANTS_DIR"] + path_name
            if path_name.startswith(L["TENSOR_CONSTANT_FILENAME_PREFIX"]):
                if meta.get("use_pickle", False):
                    result.unsafe.append(
                        f"constant {fqn} ({path}) is pickled and would be loaded with weights_only=False"
                    )
            elif path_name.startswith(L["CUSTOM_OBJ_FILENAME_PREFIX"]):
                result.unsafe.append(f"constant {fqn} ({path}) is a TorchScript object that would be unpickled")
            elif path_name.startswith(L["OPAQUE_OBJ_FILENAME_PREFIX"]):
                result.unsafe.append(f"constant {fqn} ({path}) is an opaque object loaded with pickle.loads")
            else:
                raise ModelFileError(f"{src}: {cfg_name}: constant {fqn} has an unknown kind ({path_name})")


def _payload_config(records: _Archive, name: str) -> dict[str, dict[str, Any]]:
    doc = loads_json(records.need(name), f"{records.source}: {name}", records.limits)
    config = doc.get("config") if isinstance(doc, dict) else None
    if not isinstance(config, dict) or not all(isinstance(v, dict) for v in config.values()):
        raise ModelFileError(f"{records.source}: {name} is not a payload config")
    return config


# ----------------------------------------------------------------------------- torch.save payloads


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
        except _Unresolvable as e:
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


class _Unresolvable(Exception):
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
    (``EXT*`` codes, computed names, a malformed stream) raises ``_Unresolvable``.
    """
    stack: list[Any] = []
    memo: dict[Any, Any] = {}
    found: list[str] = []

    def pop(n: int = 1) -> list[Any]:
        if len(stack) < n:
            raise _Unresolvable("stack underflow")
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
                    raise _Unresolvable("a global whose name is computed")
                found.append(f"{module}.{qual}")
                stack.append(None)
                continue
            elif name in ("EXT1", "EXT2", "EXT4"):
                raise _Unresolvable("an extension-registry global")
            if name == "MARK":
                stack.append(_MARK)
                continue
            if name in _PUT_OPS:
                if not stack:
                    raise _Unresolvable("stack underflow")
                memo[arg] = stack[-1]
                continue
            if name == "MEMOIZE":
                if not stack:
                    raise _Unresolvable("stack underflow")
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
                    raise _Unresolvable("no mark")
                stack.pop()
                pop(before.index(pickletools.markobject))
            else:
                pop(len(before))
            if name in _STRING_OPS:
                stack.append(arg if isinstance(arg, str) else None)
            else:
                stack.extend([None] * len(op.stack_after))
    except _Unresolvable:
        raise
    except Exception as e:  # noqa: BLE001 - a malformed pickle stream
        raise _Unresolvable(one_line(e)) from None
    return found


# ----------------------------------------------------------------------------- program JSON


# Names sympify may meet in an exported program's shape expressions (torch 2.13
# writes them with sympy's srepr: ``Add(Symbol('s0', positive=True, integer=True), Integer(1))``).
_SYMPY_FUNCTIONS = frozenset(
    """
    Symbol Dummy Integer Rational Float Add Mul Pow Abs floor ceiling sqrt exp log sign
    Equality Unequality StrictLessThan LessThan StrictGreaterThan GreaterThan Eq Ne Lt Le Gt Ge
    And Or Not Xor Piecewise ExprCondPair ITE Tuple
    FloorDiv ModularIndexing Where PythonMod Mod CleanDiv CeilToInt FloorToInt CeilDiv
    LShift RShift Max Min PowByNatural FloatPow FloatTrueDiv IntTrueDiv IsNonOverlappingAndDenseIndicator
    TruncToFloat TruncToInt RoundToInt RoundDecimal ToFloat Identity
    OpaqueUnaryFn_sqrt OpaqueUnaryFn_cos OpaqueUnaryFn_cosh OpaqueUnaryFn_sin OpaqueUnaryFn_sinh
    OpaqueUnaryFn_tan OpaqueUnaryFn_tanh OpaqueUnaryFn_asin OpaqueUnaryFn_acos OpaqueUnaryFn_atan
    OpaqueUnaryFn_exp OpaqueUnaryFn_log OpaqueUnaryFn_asinh OpaqueUnaryFn_log2
    BitwiseFn_bitwise_and BitwiseFn_bitwise_or BitwiseFn_bitwise_xor
    """.split()  # noqa: SIM905
)
_SYMPY_CONSTANTS = frozenset("true false True False oo zoo nan int_oo pi E".split())  # noqa: SIM905
_SYMBOL_NAME = re.compile(r"[a-z]{1,6}[0-9]+\Z")
_PLAIN_STR = re.compile(r"(?:[A-Za-z_][A-Za-z0-9_]*|[-+]?[0-9]{0,40}\.?[0-9]{1,40}(?:[eE][-+]?[0-9]{1,3})?)\Z")
_MAX_EXPR = 20_000
_EXPR_NODES = (
    ast.Expression,
    ast.BinOp,
    ast.UnaryOp,
    ast.BoolOp,
    ast.Compare,
    ast.Tuple,
    ast.Load,
    ast.operator,
    ast.unaryop,
    ast.cmpop,
    ast.boolop,
)


MAX_INT = 1 << 64  # the largest integer literal an expression may hold
MAX_EXPONENT = 64  # the largest exponent of a power
MAX_POW_NESTING = 2  # powers of powers of powers are refused (10**10**10)
_POW_FUNCTIONS = frozenset({"Pow", "PowByNatural", "FloatPow"})
_NUMBER_WRAPPERS = frozenset({"Integer", "Rational", "Float"})


def _small_exponent(node: ast.AST) -> bool:
    """A literal integer exponent of at most MAX_EXPONENT, bare or as ``Integer(n)`` / ``Rational(p, q)``."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        node = node.operand
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _NUMBER_WRAPPERS:
        return bool(node.args) and all(_small_exponent(a) for a in node.args) and not node.keywords
    if isinstance(node, ast.Constant):
        v = node.value
        if isinstance(v, str):
            try:
                v = float(v)
            except ValueError:
                return False
        return isinstance(v, (int, float)) and not isinstance(v, bool) and abs(v) <= MAX_EXPONENT
    return False


def expr_is_bounded(tree: ast.AST) -> bool:
    """Integers of at most 64 bits, powers with small literal exponents, nested at most twice."""
    depth: dict[int, int] = {}
    for node in ast.walk(tree):  # parents come before children
        level = depth.get(id(node), 0)
        exponent = None
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
            exponent = node.right
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _POW_FUNCTIONS:
            if len(node.args) != 2:
                return False
            exponent = node.args[1]
        if exponent is not None:
            level += 1
            if level > MAX_POW_NESTING or not _small_exponent(exponent):
                return False
        elif isinstance(node, ast.Constant) and type(node.value) is int and abs(node.value) > MAX_INT:
            return False
        for child in ast.iter_child_nodes(node):
            depth[id(child)] = level
    return True


def sym_expr_is_safe(expr: Any) -> bool:
    """True when ``expr`` only builds a sympy expression: known functions, symbols, numbers.

    ``sympy.sympify`` evaluates the string as Python, so anything else (attribute
    access, builtins such as ``__import__`` or ``eval``, subscripts, lambdas,
    strings with quotes or backslashes) is refused.
    """
    if not isinstance(expr, str) or len(expr) > _MAX_EXPR or "\\" in expr:
        return False
    try:
        tree = ast.parse(expr.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    if not expr_is_bounded(tree):
        return False
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            if not (isinstance(node.func, ast.Name) and node.func.id in _SYMPY_FUNCTIONS):
                return False
            for kw in node.keywords:
                if kw.arg is None or not re.match(r"[a-z_]+\Z", kw.arg):
                    return False
        elif isinstance(node, ast.keyword):
            if not isinstance(node.value, ast.Constant):
                return False
        elif isinstance(node, ast.Name):
            ok = node.id in _SYMPY_FUNCTIONS or node.id in _SYMPY_CONSTANTS or _SYMBOL_NAME.match(node.id)
            if not ok:
                return False
        elif isinstance(node, ast.Constant):
            v = node.value
            if isinstance(v, str):
                if not _PLAIN_STR.match(v):
                    return False
            elif not isinstance(v, (int, float, bool, type(None))):
                return False
        elif not isinstance(node, _EXPR_NODES):
            return False
    return True


_GUARD_NAMES = frozenset(
    {
        "L",
        "args",
        "inf",
        "int",
        "float",
        "bool",
        "abs",
        "min",
        "max",
        "round",
        "IsNonOverlappingAndDenseIndicator",
        "cast_symbool_to_symint_guardless",
    }
)
_GUARD_MODULE_ATTRS = {
    "math": frozenset(
        {
            "floor",
            "ceil",
            "trunc",
            "isnan",
            "isinf",
            "isfinite",
            "sqrt",
            "inf",
            "nan",
            "pi",
            "e",
            "log",
            "log2",
            "exp",
            "pow",
            "fabs",
            "copysign",
            "gcd",
            "cos",
            "sin",
            "tan",
            "cosh",
            "sinh",
            "tanh",
            "acos",
            "asin",
            "atan",
        }
    ),
    "torch": frozenset({"sym_max", "sym_min", "sym_sqrt", "sym_int", "sym_float", "sym_not", "sym_ite", "sym_sum"}),
}
_GUARD_VALUE_ATTRS = frozenset({"size", "stride", "storage_offset", "dim", "numel", "shape"})
_GUARD_STR = re.compile(r"[A-Za-z0-9_.]*\Z")
_GUARD_NODES = (
    ast.Expression,
    ast.BoolOp,
    ast.BinOp,
    ast.UnaryOp,
    ast.Compare,
    ast.Subscript,
    ast.Slice,
    ast.Tuple,
    ast.Load,
    ast.boolop,
    ast.operator,
    ast.unaryop,
    ast.cmpop,
    ast.IfExp,
)


def guard_is_safe(code: Any) -> bool:
    """True when a ``guards_code`` entry is a shape comparison ``ExportedProgram.module()`` may exec."""
    if not isinstance(code, str) or len(code) > _MAX_EXPR or "\n" in code or "\r" in code or "\\" in code:
        return False
    try:
        tree = ast.parse(code, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    if not expr_is_bounded(tree):
        return False
    keys = {id(n.slice) for n in ast.walk(tree) if isinstance(n, ast.Subscript)}
    module_names: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            if node.attr.startswith("_"):
                return False
            base = node.value
            if isinstance(base, ast.Name) and base.id in _GUARD_MODULE_ATTRS:
                if node.attr not in _GUARD_MODULE_ATTRS[base.id]:
                    return False
                module_names.add(id(base))
            elif node.attr not in _GUARD_VALUE_ATTRS:
                return False
        elif isinstance(node, ast.Name):
            if node.id in _GUARD_MODULE_ATTRS:
                if id(node) not in module_names:
                    return False
            elif node.id not in _GUARD_NAMES:
                return False
        elif isinstance(node, ast.Call):
            if node.keywords or not isinstance(node.func, (ast.Name, ast.Attribute)):
                return False
        elif isinstance(node, ast.BinOp):
            # no sequence arithmetic: ('x',) * 2**62 would allocate without bound
            for o in (node.left, node.right):
                if isinstance(o, ast.Tuple) or (isinstance(o, ast.Constant) and isinstance(o.value, str)):
                    return False
        elif isinstance(node, ast.Constant):
            if isinstance(node.value, str):
                if not _GUARD_STR.match(node.value) or id(node) not in keys:
                    return False
            elif not isinstance(node.value, (int, float, bool, type(None))):
                return False
        elif not isinstance(node, _GUARD_NODES):
            return False
    return True


def node_target_is_safe(target: Any) -> bool:
    """True for a target on the operator allowlist (:mod:`bnfold.io.op_allowlist`)."""
    return target_is_allowed(target)


def check_program_json(doc: dict[str, Any], entry: str, limits: Limits | None = None) -> list[str]:
    """Problems in a serialized program that ``torch.export.load`` or ``.module()`` would eval."""
    problems: list[str] = []
    problems.extend(_treespec_problems(doc, entry, limits))
    problems.extend(_nested_json_problems(doc, entry, limits))
    for expr in _values_for_key(doc, "expr_str"):
        if not sym_expr_is_safe(expr):
            problems.append(f"{entry} has a symbolic shape that is not a plain expression: {_short(expr)}")
            break
    guards = doc.get("guards_code") or []
    if not isinstance(guards, list):
        problems.append(f"{entry} has a malformed guards_code field")
    else:
        for g in guards:
            if not guard_is_safe(g):
                problems.append(f"{entry} has a guard that is not a shape check: {_short(g)}")
                break
    for node in _nodes(doc):
        target = node.get("target")
        if not node_target_is_safe(target):
            if _training_export(node, target):
                problems.append(
                    f"{entry} updates num_batches_tracked in place ({_short(target)}, not on bnfold's operator "
                    "allowlist): the model was exported in training mode; call model.eval() before torch.export "
                    "and export again"
                )
                break
            problems.append(
                f"{entry} has a graph node calling {_short(target)}, which is not on bnfold's operator allowlist"
            )
            break
        if target == "_operator.pow" and not _small_pow(node):
            problems.append(f"{entry} raises a number to a power over {MAX_EXPONENT}")
            break
    bad_name = _bad_name(doc)
    if bad_name is not None:
        problems.append(
            f"{entry} has a name that is not an identifier (or is a keyword), "
            f"which torch.fx would paste into code: {bad_name}"
        )
    bad_input = _bad_constant_input(doc)
    if bad_input is not None:
        problems.append(f"{entry} has a constant input that torch would paste into guard code: {bad_input}")
    return problems


def _training_export(node: dict[str, Any], target: Any) -> bool:
    """Whether a refused node is the in-place ``num_batches_tracked += 1`` of a program exported in
    training mode (the file is refused all the same; the message then says what to do)."""
    if not isinstance(target, str) or not target.endswith("add_.Tensor"):
        return False
    return "num_batches_tracked" in json.dumps(node.get("inputs"), default=str)


_DOTTED = re.compile(r"(?:[A-Za-z0-9_]+(?:\.[A-Za-z0-9_]+)*)?\Z")
_VALUE_TABLES = ("tensor_values", "sym_int_values", "sym_bool_values", "sym_float_values", "custom_obj_values")
_PLAIN_CONSTANT = re.compile(r"[^'\"\\\n\r]*\Z")


def _treespec_problems(doc: dict[str, Any], entry: str, limits: Limits | None) -> list[str]:
    """Every ``in_spec`` / ``out_spec`` string must be a plain treespec (see :mod:`bnfold.io.treespec`)."""
    gm = doc.get("graph_module")
    fields = gm.get("treespec_namedtuple_fields") if isinstance(gm, dict) else None
    problem = check_namedtuple_fields(fields, entry)
    if problem:
        return [problem]
    for key in ("in_spec", "out_spec"):
        for spec in _values_for_key(doc, key):
            problem = treespec_problem(spec, fields or {}, f"{entry} {key}", limits)
            if problem:
                return [f"{problem}; torch would import or paste it into code"]
    return []


_JSON_STRINGS = ("custom", "from_node")  # metadata strings torch.export.load parses with json.loads


def _nested_json_problems(doc: dict[str, Any], entry: str, limits: Limits | None) -> list[str]:
    """Metadata strings that torch parses as JSON must be JSON of bounded depth."""
    depth_limit = (limits or Limits()).json_depth
    for key in _JSON_STRINGS:
        for value in _values_for_key(doc, key):
            if isinstance(value, str) and json_depth(value.encode("utf-8", "surrogatepass")) > depth_limit:
                return [f"{entry} has {key} metadata nested over {depth_limit} levels deep"]
    return []


def _small_pow(node: dict[str, Any]) -> bool:
    """``_operator.pow(a, b)`` with literal arguments: the exponent is small."""
    inputs = node.get("inputs")
    if not isinstance(inputs, list) or len(inputs) != 2:
        return False
    arg = inputs[1].get("arg") if isinstance(inputs[1], dict) else None
    if not isinstance(arg, dict):
        return False
    for kind in ("as_int", "as_float"):
        if kind in arg:
            v = arg[kind]
            return isinstance(v, (int, float)) and not isinstance(v, bool) and abs(v) <= MAX_EXPONENT
    return True  # a symbolic exponent: bounded by the shapes it comes from


def _bad_name(doc: dict[str, Any]) -> str | None:
    """torch.fx generates Python source from node, argument and attribute names; each must be a plain name.

    ``name`` fields (nodes, values, keyword arguments) must be identifiers,
    ``*_name`` / ``fqn`` fields (parameter, buffer, module paths) dotted names,
    and ``forward_arg_names`` identifiers.
    """
    stack: list[Any] = [doc]
    while stack:
        cur = stack.pop()
        if isinstance(cur, list):
            stack.extend(v for v in cur if isinstance(v, (dict, list)))
            continue
        if not isinstance(cur, dict):
            continue
        for key, value in cur.items():
            if key == "name" and isinstance(value, str):
                if value and not is_plain_name(value):
                    return _short(value)
            elif (key.endswith("_name") or key == "fqn") and isinstance(value, str):
                if not _DOTTED.match(value):
                    return _short(value)
            elif key == "forward_arg_names" and isinstance(value, list):
                for v in value:
                    if not is_plain_name(v):
                        return _short(v)
            elif key in _VALUE_TABLES and isinstance(value, dict):
                for k in value:
                    if not is_plain_name(k):
                        return _short(k)
            if isinstance(value, (dict, list)):
                stack.append(value)
    return None


def _bad_constant_input(doc: dict[str, Any]) -> str | None:
    """Constant user inputs become guards like ``L['mode'] == '<value>'`` that ``.module()`` execs."""
    graph = doc.get("graph_module", {}).get("graph", {}) if isinstance(doc.get("graph_module"), dict) else {}
    for inp in graph.get("inputs", []) if isinstance(graph, dict) else []:
        if not isinstance(inp, dict):
            continue
        for kind, value in inp.items():
            if kind == "as_string" and not (isinstance(value, str) and _PLAIN_CONSTANT.match(value)):
                return _short(value)
            if kind == "as_int" and (type(value) is not int):
                return _short(value)
            if kind == "as_bool" and type(value) is not bool:
                return _short(value)
    return None


def _values_for_key(obj: Any, key: str) -> Iterator[Any]:
    stack = [obj]
    while stack:
        cur = stack.pop()
        if isinstance(cur, dict):
            for k, v in cur.items():
                if k == key:
                    yield v
                elif isinstance(v, (dict, list)):
                    stack.append(v)
        elif isinstance(cur, list):
            stack.extend(v for v in cur if isinstance(v, (dict, list)))


def _nodes(obj: Any) -> Iterator[dict[str, Any]]:
    stack = [obj]
    while stack:
        cur = stack.pop()
        if isinstance(cur, dict):
            if "target" in cur and "inputs" in cur and "outputs" in cur:
                yield cur
            stack.extend(v for v in cur.values() if isinstance(v, (dict, list)))
        elif isinstance(cur, list):
            stack.extend(v for v in cur if isinstance(v, (dict, list)))


# ----------------------------------------------------------------------------- helpers


def _short(value: Any, n: int = 60) -> str:
    text = " ".join(repr(value).split())
    return text if len(text) <= n else text[: n - 3] + "..."


def sniff(data: bytes) -> str:
    """What the first bytes of a file that is not a zip archive look like, for an error message."""
    head = data[:64]
    if head.startswith(b"\x80") and len(head) > 1 and head[1] <= 5:
        return "looks like a raw pickle"
    if head.startswith(b"\x08") or head[:1] in (b"\x0a", b"\x12", b"\x1a", b"\x3a", b"\x42"):
        return "looks like a protobuf (an .onnx model?)"
    try:
        head.decode("utf-8")
        return "looks like a text file"
    except UnicodeDecodeError:
        return "unrecognized binary data"
