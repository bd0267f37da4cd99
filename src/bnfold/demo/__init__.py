"""The demo: a small trained EfficientNet-style digits classifier, audited under fp16 and htp, unfolded and folded."""


def run_demo(out_dir=".", quick: bool = False, verbose: bool = True) -> dict:
    """See :func:`bnfold.demo.run.run_demo`."""
    from .run import run_demo as _run

    return _run(out_dir=out_dir, quick=quick, verbose=verbose)


__all__ = ["run_demo"]
