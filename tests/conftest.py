import os

import pytest
from hypothesis import settings

import bnfold_testutil

# CI runs the property tests on a fixed sequence of examples, so a submission's result does not
# depend on the draw; locally every run explores new examples.
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")

#: ``make test`` runs the suite in pytest-xdist workers (``-n 2``): each worker is one process of its own.
WORKER = os.environ.get("PYTEST_XDIST_WORKER")


def pytest_configure(config):
    if WORKER:
        # one torch thread per worker: the workers already fill the cores, and torch's thread pool on a busy core
        # makes the tests' many small ops several times slower (``bnfold_testutil.one_torch_thread``)
        import torch

        torch.set_num_threads(1)


def pytest_sessionfinish(session):
    if WORKER and hasattr(session.config, "workeroutput"):  # the worker's measurements go to the controller
        session.config.workeroutput["bnfold_stats"] = (bnfold_testutil.STATS, bnfold_testutil.COMBINE)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    stats = getattr(node, "workeroutput", {}).get("bnfold_stats")
    if stats:
        bnfold_testutil.merge_stats(*stats)


def pytest_terminal_summary(terminalreporter):
    if bnfold_testutil.STATS:
        terminalreporter.section("bnfold measurements")
        for key, value in sorted(bnfold_testutil.STATS.items()):
            terminalreporter.write_line(f"{key}: {value:.3g}" if isinstance(value, float) else f"{key}: {value}")
