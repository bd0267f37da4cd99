"""The demo: the OCR task on a rendered page (trained PaddleOCR det and rec in fp32 and fp16 ONNX Runtime, unfolded
and folded), then a small trained EfficientNet-style digits classifier audited under fp16 and htp, unfolded and
folded.  The OCR task's parts (pages, post-processing, decoding, metrics, runners) serve benchmark part H and the
tests too."""


def run_demo(out_dir=".", quick: bool = False, verbose: bool = True) -> dict:
    """See :func:`bnfold.demo.run.run_demo`."""
    from .run import run_demo as _run

    return _run(out_dir=out_dir, quick=quick, verbose=verbose)


__all__ = ["run_demo"]
