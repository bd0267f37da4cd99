import os

from hypothesis import settings

import bnfold_testutil

# CI runs the property tests on a fixed sequence of examples, so a submission's result does not
# depend on the draw; locally every run explores new examples.
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")


def pytest_terminal_summary(terminalreporter):
    if bnfold_testutil.STATS:
        terminalreporter.section("bnfold measurements")
        for key, value in sorted(bnfold_testutil.STATS.items()):
            terminalreporter.write_line(f"{key}: {value:.3g}" if isinstance(value, float) else f"{key}: {value}")
