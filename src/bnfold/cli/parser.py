"""``build_parser()``: the argparse parser of ``bnfold``, built from the option and command tables."""

from __future__ import annotations

import argparse

from .. import __version__
from .commands import COMMANDS
from .options import OPTIONS
from .texts import MAIN_EPILOG

RAW = argparse.RawDescriptionHelpFormatter


def _add_options(parser: argparse.ArgumentParser, names) -> None:
    groups: dict[str, argparse._MutuallyExclusiveGroup] = {}
    for name in names:
        option = OPTIONS[name]
        target = parser
        if option.group is not None:
            if option.group not in groups:
                groups[option.group] = parser.add_mutually_exclusive_group()
            target = groups[option.group]
        option.add_to(target, name)


class Parser(argparse.ArgumentParser):
    """argparse's parser whose errors are one line, as bnfold's own (exit 2), with the ``--help`` to read
    instead of the whole usage block."""

    commands: dict[str, argparse.ArgumentParser]  #: each command's own parser, by name

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"bnfold: error: {message}; see '{self.prog} --help'\n")

    def parse_args(self, args=None, namespace=None):  # type: ignore[override]
        """argparse's, except that an unknown option after a command is that command's error: it points at
        ``bnfold COMMAND --help``, where the options it takes are listed."""
        parsed, extra = self.parse_known_args(args, namespace)
        if extra:
            where = getattr(self, "commands", {}).get(getattr(parsed, "command", None), self)
            where.error(f"unrecognized arguments: {' '.join(extra)}")
        return parsed


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="bnfold",
        description="Fold BatchNorm into the conv / transposed conv / linear next to it in\n"
        "torch.export programs (.pt2) and ONNX models, and check the numerics.",
        epilog=MAIN_EPILOG,
        formatter_class=RAW,
    )
    parser.add_argument("--version", action="version", version=f"bnfold {__version__}")
    for name, option in OPTIONS.items():
        if option.anywhere:
            option.add_to(parser, name, hidden=True)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    parser.commands = {}
    for command in COMMANDS:
        p = sub.add_parser(
            command.name,
            help=command.help,
            description=command.description,
            epilog=command.epilog,
            formatter_class=RAW,
        )
        _add_options(p, command.options)
        p.set_defaults(func=command.run)
        parser.commands[command.name] = p
    return parser
