"""Errors bnfold raises for bad input; each message is one line that says what to do."""


class BnfoldError(Exception):
    """Base class; the CLI prints ``str(err)`` and exits with code 2."""


class ModelFileError(BnfoldError):
    """A model file is missing, unreadable, of the wrong format, or unsafe to load."""


class UnsafeModelError(ModelFileError):
    """A model file would run code on load (pickle) and ``trust`` was not given."""


class FoldError(ValueError):
    """A fold that cannot be done exactly; the message is the reason (it ends up in the report)."""
