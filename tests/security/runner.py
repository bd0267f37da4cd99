"""Run bnfold's command line on crafted files, inside the limits that ``crafted.run_bnfold`` sets.

Argument: JSON ``{"argvs": [[...], ...], "control": [path, ...], "recursion_limit": n}`` (the last
optional: the Python stack bnfold runs with).  Prints one JSON line: per argv ``{"code", "stderr",
"marker", "peak_mib"}`` (``peak_mib``: the process's peak resident memory so far, in MiB: ``VmHWM``, which
starts again at exec, not ``ru_maxrss``, which Linux carries over from the forking process: a pytest worker
of 1.2 GiB), then per control file the markers present after plain ``torch.export.load`` + ``.module()`` of
it (``marker`` lists the ``PWNED*`` files in the working folder).
The working folder is put first on ``sys.path`` (as ``python -m`` does), the
worst case for a payload that imports a module from there.
"""

import contextlib
import io
import json
import os
import sys

MARKER = "PWNED"


def marker() -> list[str]:
    """The marker files (``PWNED*``) in the working folder; a mutated ``Counter`` class leaves ``PWNED``."""
    import collections

    if hasattr(collections.Counter, "bnfold_pwned"):  # a pickle that mutated a class
        open(MARKER, "w").close()
    return sorted(n for n in os.listdir(".") if n.startswith(MARKER))


def peak_mib() -> int:
    """This process's peak resident memory since it was exec'd, in MiB (``VmHWM`` of ``/proc/self/status``)."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) // 1024 for line in f if line.startswith("VmHWM:"))


def main() -> None:
    sys.path.insert(0, os.getcwd())
    job = json.loads(sys.argv[1])
    from bnfold.cli import main as bnfold

    if job.get("recursion_limit"):  # a smaller stack: a chain of hundreds stands for one of thousands
        import torch  # noqa: F401 (imported at the usual depth)

        sys.setrecursionlimit(job["recursion_limit"])
    out = []
    for argv in job["argvs"]:
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = bnfold(argv)
        peak = peak_mib()
        out.append({"code": code, "stderr": err.getvalue(), "marker": marker(), "peak_mib": peak})
    for path in job["control"]:
        import torch

        with contextlib.suppress(Exception), contextlib.redirect_stderr(io.StringIO()):
            torch.export.load(path).module()
        out.append({"control": path, "marker": marker()})
    print(json.dumps(out))


if __name__ == "__main__":
    main()
