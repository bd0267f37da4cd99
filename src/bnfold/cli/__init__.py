"""The ``bnfold`` command line: ``fold``, ``check``, ``audit``, ``demo``.

``main(argv=None) -> int`` returns the exit status: 0 ok, 1 ``check`` found
normalizations left, 2 bad input (unreadable, wrong-format or unsafe file,
bad arguments, no command: the help goes to stderr), 3 an internal error.  Errors are one line on stderr
(``bnfold: error: ...``); ``--debug`` adds the traceback.  torch, onnx and the
numerics are imported inside the commands, so ``--help`` does not load them.

::

    main.py       main(): parse, run, exit statuses and one-line errors
    parser.py     build_parser() from the two tables below
    options.py    OPTIONS: every option, declared once (flags, type, help)
    commands.py   COMMANDS: each command's texts, the options it takes, the function that runs it
    texts.py      the epilogs (examples, exit statuses)
    constants.py  exit statuses, choices, defaults
    types.py      argument types (--only kinds, positive numbers)
    args.py       reading parsed arguments
    fold.py, check.py, audit.py, demo.py   the commands
    shapes.py     --input-shape: parsing, and fixing an ONNX model's open input dims
    verbosity.py  -q / -v
    progress.py   notes on stderr during a long fold
    errors.py     one-line errors and hints; a closed stdout
    jsonout.py    --json output
"""

from __future__ import annotations

from .main import main
from .parser import build_parser

__all__ = ["build_parser", "main"]
