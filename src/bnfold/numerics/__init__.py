"""fp16 numerics: emulate a program under a precision profile and audit its normalizations.

``emulate`` runs an ExportedProgram node by node under ``fp32`` / ``fp16`` /
``htp`` / ``fp16-acc`` / ``ort-cpu`` next to a reference run; ``audit`` puts that
together with the fold report into an :class:`AuditReport`: per normalization
a risk verdict predicted from its statistics (:mod:`.risk`) and confirmed by
the run, per layer cumulative and local SQNR (NaN/inf as counts and shares),
and what to do (:mod:`.advice`).  One lockstep runner (:mod:`.runner`) runs every format through a
thin executor (:mod:`.fx_program` for torch programs, :mod:`.onnx_program` for ONNX); an ONNX model is
audited with the ONNX that ``bnfold.fold`` writes, in the same pipeline; :mod:`.real_runtimes` runs the real
fp16 runtimes the profiles stand for; ``audit``'s ``progress`` callback hears of stages and batches
(:class:`bnfold.cli.progress.Progress` shows them on stderr).
"""

from .audit import AuditReport, audit
from .fx_program import BatchResult, EmulationResult, Emulator, emulate
from .profiles import FP16_MAX, PROFILE_NAMES, Profile, get_profile, round_fp16
from .tensor_error import TensorError

__all__ = [
    "audit",
    "AuditReport",
    "emulate",
    "Emulator",
    "EmulationResult",
    "BatchResult",
    "TensorError",
    "Profile",
    "get_profile",
    "round_fp16",
    "FP16_MAX",
    "PROFILE_NAMES",
]
