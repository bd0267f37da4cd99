"""README.md's fenced code blocks, and how the README test runs each kind.

A block is skipped only when the line before its fence is ``<!-- readme-test: skip (REASON) -->``.
Kinds: ``python`` (run in one namespace shared by every python block), ``sh`` (each line in bash),
``console`` (``$ command`` lines, each followed by the output it prints; ``# exit N`` at the end
of a command gives its exit status, 0 otherwise), ``yaml`` (a CI snippet or a pre-commit
config: checked by the test), and ``text`` or no language (not code).

A console command's printed lines are compared with the README's by :func:`matches`: words exactly,
whole numbers exactly, a measured value within one unit of its last printed digit, and a value printed
as ``VALUE ± SPREAD`` within the larger of the two printed spreads (see "How printed numbers are
compared" below: a program whose number moves with the CPU prints its spread, and the test uses it).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
SKIP = re.compile(r"^<!-- readme-test: skip \((?P<reason>[^)]+)\) -->$")
EXIT = re.compile(r"\s+#\s*exit (?P<code>\d+)\s*$")
KINDS = {"python", "sh", "console", "yaml", "text", ""}


@dataclass
class Block:
    kind: str
    code: str
    line: int  # 1-based line of the opening fence
    skip: str | None = None  # the reason, when marked


@dataclass
class Command:
    command: str
    exit_code: int = 0
    output: list[str] = field(default_factory=list)


def blocks(text: str | None = None) -> list[Block]:
    """Every fenced block of the README, in order."""
    lines = (README.read_text() if text is None else text).splitlines()
    out, i = [], 0
    while i < len(lines):
        if lines[i].startswith("```"):
            kind, start = lines[i][3:].strip(), i
            end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
            prev = next((lines[k].strip() for k in range(start - 1, -1, -1) if lines[k].strip()), "")
            marker = SKIP.match(prev)
            out.append(Block(kind, "\n".join(lines[start + 1 : end]) + "\n", start + 1, marker and marker["reason"]))
            i = end
        i += 1
    return out


def commands(block: Block) -> list[Command]:
    """The ``$`` commands of a console block, with their expected exit status and output lines."""
    out: list[Command] = []
    for line in block.code.splitlines():
        if line.startswith("$ "):
            command, code = line[2:], 0
            match = EXIT.search(command)
            if match:
                command, code = command[: match.start()], int(match["code"])
            out.append(Command(command.strip(), code))
        elif line.strip():
            out[-1].output.append(line)
    return out


def shell(command: str, cwd: Path) -> subprocess.CompletedProcess:
    """``command`` in bash, in ``cwd``, with this interpreter's ``bnfold`` first on PATH."""
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    return subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


#: Durations ("(13 s)", "in 0.01 s") differ from run to run: compared as "<time> s".
DURATION = re.compile(r"\b\d+(\.\d+)? s\b")


#: A number in a line: not part of a name (``stem.1``, ``relu_1``, ``model.pt2``), maybe signed or in
#: e-notation (``6.97e+03x``, ``1e-09``).
NUMBER = re.compile(r"(?<![A-Za-z_.\d])[-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?(?!\d)")
#: What joins a value to its spread: ``43.4 ± 0.8 dB`` (spaces optional; a unit goes after the spread).
PLUS_MINUS = re.compile(r"\s*±\s*")
#: A module path (``blocks.2.project.0``, ``head.0``); file names (``out/report.json``) are not.
MODULE_PATH = re.compile(r"\b[A-Za-z_]\w*(?:\.\w+)+\b")
FILE_SUFFIXES = (".pt2", ".onnx", ".json", ".png", ".npz", ".pte", ".py", ".bin", ".data")

# How printed numbers are compared (no tolerance is chosen here; each number carries its own):
#
# * A whole number (a count, parameters, epochs, a seed) must be equal.
# * ``VALUE ± SPREAD`` (the program printed the spread it measured, e.g. ``43.4 ± 0.8 dB``: SQNR over
#   several batches, ± their spread): the values may differ by the larger of the two printed spreads
#   (and by at least one unit in the value's last digit).
#   The spread itself is a measurement and is only required to be there.  Print the spread when a
#   value moves with the host's float rounding (another CPU's kernels) by more than its last digit.
# * Any other measured value (a decimal point or an exponent: ``59.5 dB``, ``98.9%``, ``6.97e+03x``)
#   may differ by one unit in its last printed digit (``59.5`` -> 0.1, ``6.97e+03`` -> 10): the digit
#   may round either way on another CPU, the digit before it may not.  A number whose last digit is
#   noise must be printed with fewer digits or with its spread.


@dataclass(frozen=True)
class Value:
    """A number as printed, with the spread printed next to it (``None``: none)."""

    text: str
    spread: str | None = None

    @property
    def measured(self) -> bool:
        return self.spread is not None or _is_measure(self.text)


@dataclass(frozen=True)
class Shape:
    """A line as text with its numbers taken out; ``measured`` says whether it shows a measurement."""

    text: str
    numbers: tuple[Value, ...]
    measured: bool


def _is_measure(number: str) -> bool:
    return "." in number or "e" in number.lower()


def _values(line: str) -> tuple[str, tuple[Value, ...]]:
    """``line`` with each number (or ``value ± spread``) replaced by ``#``, and the numbers."""
    text, values, at = [], [], 0
    found = list(NUMBER.finditer(line))
    i = 0
    while i < len(found):
        m = found[i]
        text.append(line[at : m.start()])
        nxt = found[i + 1] if i + 1 < len(found) else None
        if nxt is not None and PLUS_MINUS.fullmatch(line[m.end() : nxt.start()]):
            values.append(Value(m[0], nxt[0]))
            at, i = nxt.end(), i + 2
        else:
            values.append(Value(m[0]))
            at, i = m.end(), i + 1
        text.append("#")
    text.append(line[at:])
    return "".join(text), tuple(values)


def _shape(line: str, names_free: bool = False) -> Shape:
    text, numbers = _values(DURATION.sub("<time> s", " ".join(line.split())))
    measured = any(n.measured for n in numbers)
    if names_free and measured:  # which layer is worst may change with the CPU; that a layer is named may not
        text = MODULE_PATH.sub(lambda m: m[0] if m[0].endswith(FILE_SUFFIXES) else "<layer>", text)
    return Shape(text, numbers, measured)


def last_digit(number: str) -> float:
    """One unit in the last printed digit of ``number`` (``59.5`` -> 0.1, ``6.97e+03`` -> 10, ``12`` -> 1)."""
    mantissa, _, exponent = number.lower().partition("e")
    decimals = len(mantissa.partition(".")[2])
    return 10.0 ** (int(exponent or 0) - decimals)


def _close(want: Value, got: Value) -> bool:
    if (want.spread is None) != (got.spread is None):
        return False  # a spread went missing, or appeared
    if not want.measured:
        return want.text == got.text
    w, g = float(want.text), float(got.text)
    if want.spread is not None:
        return abs(g - w) <= max(float(want.spread), float(got.spread), last_digit(want.text)) * (1 + 1e-9)
    return abs(g - w) <= max(last_digit(want.text), last_digit(got.text)) * (1 + 1e-9)


def matches(want: str, got: str) -> bool:
    """Whether the printed line ``got`` is the README's line ``want``: the same words (whitespace runs are
    one space, durations are not compared), numbers compared as described above; on a line that shows a
    measurement, module paths may name another layer."""
    a, b = _shape(want), _shape(got)
    if a.text != b.text:
        a, b = _shape(want, names_free=True), _shape(got, names_free=True)
        if not a.measured or a.text != b.text:
            return False
    return len(a.numbers) == len(b.numbers) and all(_close(w, g) for w, g in zip(a.numbers, b.numbers))


def in_order(expected: list[str], actual: list[str]) -> list[str]:
    """The expected lines not found, in order, among the actual lines (see :func:`matches`)."""
    missing, at = [], 0
    for line in expected:
        found = next((i for i in range(at, len(actual)) if matches(line, actual[i])), None)
        if found is None:
            missing.append(line)
        else:
            at = found + 1
    return missing


# ----------------------------------------------------------------------------- running the README


def run_python(block: Block, namespace: dict) -> None:
    """A python block in ``namespace`` (shared by all of them), its prints swallowed."""
    import contextlib
    import io

    with contextlib.redirect_stdout(io.StringIO()):
        exec(compile(block.code, f"README.md:{block.line}", "exec"), namespace)  # noqa: S102 - the README's own code


def run_readme(cwd: Path, on_console, on_yaml=None) -> dict[str, int]:
    """Run the README's blocks in order in ``cwd``: python blocks here, each console command through
    ``on_console(block, command, completed_process)``, each yaml block through ``on_yaml(block)``.
    Returns how many blocks of each kind ran."""
    namespace: dict = {"__name__": "__readme__"}
    ran = {"python": 0, "console": 0, "yaml": 0, "sh": 0}
    for block in blocks():
        if block.skip or block.kind in ("text", ""):
            continue
        if block.kind == "python":
            run_python(block, namespace)
        elif block.kind == "console":
            for cmd in commands(block):
                on_console(block, cmd, shell(cmd.command, cwd))
        elif block.kind == "sh":
            for line in block.code.splitlines():
                if line.strip() and not line.lstrip().startswith("#"):
                    proc = shell(line, cwd)
                    assert proc.returncode == 0, f"README.md:{block.line}: {line}: exit {proc.returncode}"
        elif block.kind == "yaml" and on_yaml is not None:
            on_yaml(block)
        ran[block.kind] += 1
    return ran


def update_readme() -> None:
    """Rewrite the output shown under each console command with what it prints now (stdout, or stderr
    when it prints nothing on stdout).  A command shown without output stays without.  ``make readme`` runs this."""
    import tempfile
    import warnings

    printed: list[tuple[str, list[str]]] = []  # (command, its output lines), in README order

    def record(block: Block, cmd: Command, proc: subprocess.CompletedProcess) -> None:
        if proc.returncode != cmd.exit_code:
            raise SystemExit(f"README.md:{block.line}: $ {cmd.command}: exit {proc.returncode}\n{proc.stderr}")
        text = (proc.stdout or proc.stderr).rstrip()
        printed.append((cmd.command, [ln.rstrip() for ln in text.splitlines()]))

    warnings.simplefilter("ignore")
    here = os.getcwd()
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)
        try:
            run_readme(Path(tmp), record)
        finally:
            os.chdir(here)
    README.write_text(_with_outputs(README.read_text(), printed))


def _with_outputs(text: str, printed: list[tuple[str, list[str]]]) -> str:
    """``text`` with each console command's shown output replaced by the next entry of ``printed``."""
    lines, out, console, queue = text.splitlines(), [], None, list(printed)
    for n, line in enumerate(lines, 1):
        if console is None and line.startswith("```console"):
            console, command = n, None
        elif console is not None and line.startswith("```"):
            console = None
        elif console is not None and line.startswith("$ "):
            command = commands(Block("console", line + "\n", console))[0]
            following = lines[n] if n < len(lines) else "```"
            ran, output = queue.pop(0)
            if ran != command.command:
                raise SystemExit(f"README.md changed while it ran ({ran!r} is not {command.command!r}); run it again")
            out.append(line)
            if not following.startswith(("$ ", "```")):  # a command shown without output stays so
                out.extend(output)
            continue
        elif console is not None:
            continue  # an old output line
        out.append(line)
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    if sys.argv[1:] != ["--update"]:
        raise SystemExit(
            "usage: python tests/readme/readme_blocks.py --update   (rewrites README.md's console outputs)"
        )
    update_readme()
