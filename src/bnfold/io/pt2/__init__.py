"""``.pt2`` archives (``torch.export.save``): the safe loader, and the inspection of an archive's
bytes before ``torch.export.load`` sees them.

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
   Its bytes must be exactly the archive ``zipfile`` lists (:mod:`.zipform`),
   checked before torch's reader opens it, so that the sizes checked with
   ``zipfile`` are what torch inflates.

8. **Pytree specs.**  ``in_spec`` / ``out_spec`` strings are checked as data
   by :mod:`.treespec` (``treespec_loads`` imports modules named in
   enum / defaultdict contexts, and dict keys reach generated code).
9. **Operators.**  Every graph node target must be on the allowlist of
   :mod:`.ops` (``audit`` executes the graph), or be the in-place / ``out=`` form of an allowed
   operator that writes only values its graph computed (:mod:`.mutation`).
10. **Bounded work.**  Entry sizes within the byte budget and no zip bomb
    (:mod:`bnfold.io.limits`), JSON depth bounded and its values counted against the
    work budget before parsing (:meth:`.archive.Archive.check_json_values`), expressions
    with small integers and exponents, tensor records matching their declared
    views, and pickles that ``torch.load(weights_only=True)`` loads as they
    are (:mod:`.payloads`).

The caller reads the file once and passes the same bytes to the inspection
and to ``torch.export.load`` (see :mod:`.load`), so the file cannot
change in between.  The list above is what torch 2.13's loader does; a newer
torch may add ways to run code that this package does not know about.

::

    load.py        load_pt2 / save_pt2: read once, inspect, load the same bytes; save atomically
    inspection.py  check_pt2_bytes / inspect_pt2_bytes: the whole archive, entry by entry (1, 2, 5, 7)
    layout.py      where things live in a pt2 archive (torch's own constants when it has them)
    archive.py     the zip seen by both of torch's readers; sizes, zip bombs, JSON values; sniff()
    zipform.py     the zip's bytes exactly what Python's zipfile lists, before torch's reader opens it (7, 10)
    pickles.py     torch.save payloads: a static scan of every pickle's globals (2)
    payloads.py    tensor records vs their declared sizes; weights_only=True must load a payload (10)
    program.py     the program JSON: names pasted into code, constant inputs, node targets (6, 9)
    exprs.py       symbolic-shape expressions sympify evaluates (3)
    guards.py      guard code .module() execs (4)
    treespec.py    in_spec / out_spec as data (8)
    ops.py         the operator allowlist, derived from torch's schemas and tags (9)
    mutation.py    in-place / out= nodes that write only intermediates of their graph (9)
    walk.py        walking the program JSON
"""

from __future__ import annotations

from .archive import sniff
from .inspection import TRUST_HINT, Pt2Inspection, check_pt2_bytes, inspect_pt2_bytes
from .layout import ZIP_MAGIC
from .load import load_pt2, save_pt2

__all__ = [
    "TRUST_HINT",
    "ZIP_MAGIC",
    "Pt2Inspection",
    "check_pt2_bytes",
    "inspect_pt2_bytes",
    "load_pt2",
    "save_pt2",
    "sniff",
]
