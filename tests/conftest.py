import bnfold_testutil


def pytest_terminal_summary(terminalreporter):
    if bnfold_testutil.STATS:
        terminalreporter.section("bnfold measurements")
        for key, value in sorted(bnfold_testutil.STATS.items()):
            terminalreporter.write_line(f"{key}: {value:.3g}" if isinstance(value, float) else f"{key}: {value}")
