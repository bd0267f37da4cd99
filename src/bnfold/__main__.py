"""``python -m bnfold``: the command line, with the current folder off the import path.

For ``-m``, Python puts the current folder first on ``sys.path``, so a
``torch.py`` (or ``numpy.py``, ``onnx.py``, ...) lying beside a model from a
stranger would be imported in place of the real package.  It is dropped here,
before bnfold imports any third-party package; and where one of the packages
bnfold uses was already imported from it, the run is refused.  The installed
``bnfold`` command never has the current folder on its path.
"""

import os
import sys

#: the third-party packages bnfold imports, which a file in the current folder must not shadow
SHADOWED = ("torch", "onnx", "numpy", "matplotlib", "google", "tqdm", "executorch", "sympy")


def drop_current_folder() -> str | None:
    """Remove the current folder that ``-m`` put first on ``sys.path`` (and any ``''`` / ``'.'`` entry);
    the name of a package in :data:`SHADOWED` already imported from the current folder, if any."""
    cwd = os.path.realpath(os.getcwd())
    if sys.path and sys.path[0] not in ("", ".") and os.path.realpath(sys.path[0]) == cwd:
        del sys.path[0]
    sys.path[:] = [p for p in sys.path if p not in ("", ".")]
    if cwd in (os.path.realpath(p) for p in sys.path):
        return None  # the folder is on the path on purpose (PYTHONPATH): what is there is meant to be used
    for name in SHADOWED:
        where = getattr(sys.modules.get(name), "__file__", None)
        if where:
            real = os.path.realpath(where)
            home = (
                os.path.dirname(real)
                if os.path.basename(real) != "__init__.py"
                else os.path.dirname(os.path.dirname(real))
            )
            if home == cwd:
                return name
    return None


if __name__ == "__main__":
    shadow = drop_current_folder()
    if shadow:
        print(
            f"bnfold: error: {shadow} was imported from the current folder; run the installed `bnfold` command, "
            "or run from another folder",
            file=sys.stderr,
        )
        raise SystemExit(2)
    from .cli import main

    raise SystemExit(main())
