"""Which path PyTorch's CPU half kernels take on this machine, found by a direct probe.

``Emulator(ep, "fp16")`` computes every op in float32 on fp16-rounded inputs and rounds its output to
fp16 once.  Whether ``model.half()(x.half())`` on CPU gives the same bits depends on the CPU, because
torch picks a different half kernel per CPU (torch 2.13):

* oneDNN has fp16 (``torch.ops.mkldnn._is_mkldnn_fp16_supported()``: AVX-512 FP16 or AMX-FP16, the
  developers' Intel machines): conv and transposed conv run in oneDNN, accumulate in float32 and
  round once.  There the emulation was bit-identical on the six models of ``test_real_runtimes``.
* elsewhere (AMD Zen 5 with AVX-512 but no AVX-512 FP16, the CI machine; AVX2-only AMD, issue 29):
  conv runs ATen's ``thnn_conv2d`` (im2col and a half gemm that accumulates in float32, in another
  order than oneDNN's float32 conv), so a few elements in 10^4 land one fp16 ulp away; transposed
  conv runs ``slow_conv_transpose2d``, which rounds the product to fp16 and then adds the bias in
  fp16 (two roundings), so a quarter to a half of its elements differ.  Linear (``addmm``) rounds
  once in the same order: bit-identical everywhere measured.

:func:`probe` runs each layer kind once in torch half and once in float32 on the same fp16 values
(rounded once) and reports, per kind, how many elements differ and by how many fp16 steps
(:func:`fp16_steps`), and names its path (:attr:`OpPath.path`): ``once rounded``, ``reordered`` or
``rounds twice``.  Tests claim bit-identity only for models whose layer kinds all round once on the
CPU they run on, and what the worse paths allow elsewhere.
``describe`` names the path for failure messages.  ``ATEN_CPU_CAPABILITY`` and ``ONEDNN_MAX_CPU_ISA``
select other ISA paths in a subprocess (``test_half_paths.py``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F

#: The layer kinds probed (each one op on fixed random fp16 inputs, see ``_cases``).
KINDS = ("conv", "depthwise", "conv_transpose", "linear")
#: Past this share of differing elements a kind rounds twice: summing in another order moves an fp16
#: rounding only where the float32 sum lies within ~1e-7 of a rounding boundary (measured on Zen 5: conv
#: 0.16%, depthwise 0.02%, linear 0.07%), an extra rounding moves a quarter of them (conv transpose 30%).
REORDERED_SHARE = 0.01
#: The paths from best to worst.
PATHS = ("once rounded", "reordered", "rounds twice")


@dataclass(frozen=True)
class OpPath:
    """One layer kind on this CPU: torch half against float32 on the same fp16 values, rounded once."""

    kind: str
    elements: int
    differ: int  # elements whose bits differ
    beyond_one_step: int  # elements more than one fp16 step apart

    @property
    def path(self) -> str:
        """``once rounded`` (no element differs: the fp16 profile's arithmetic), ``reordered`` (at most 1%
        differ: the same roundings, float32 sums in another order), or ``rounds twice`` (an intermediate
        is rounded to fp16 as well)."""
        if self.differ == 0:
            return "once rounded"
        return "reordered" if self.differ <= REORDERED_SHARE * self.elements else "rounds twice"


@dataclass(frozen=True)
class HalfPath:
    capability: str  # torch.backends.cpu.get_cpu_capability()
    mkldnn_fp16: bool  # oneDNN runs fp16 on this CPU (AVX-512 FP16 / AMX-FP16)
    ops: dict

    def worst(self, kinds) -> str:
        """The worst path among ``kinds`` on this CPU (``once rounded``: all round as the fp16 profile does)."""
        return max((self.ops[k].path for k in kinds), key=PATHS.index, default="once rounded")

    def describe(self) -> str:
        ops = ", ".join(
            f"{k} {p.path} ({p.differ}/{p.elements} differ, {p.beyond_one_step} by >1 step)"
            for k, p in self.ops.items()
        )
        return f"cpu capability {self.capability}, oneDNN fp16 {self.mkldnn_fp16}: {ops}"


def fp16_steps(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """How many fp16 values apart ``a`` and ``b`` are (both fp16-exact, finite): 0 equal, 1 adjacent."""

    def ordered(t: torch.Tensor) -> torch.Tensor:
        bits = t.to(torch.float16).view(torch.int16).to(torch.int32)
        return torch.where(bits < 0, -(bits & 0x7FFF), bits)  # -0 and +0 both 0; order follows the value

    return (ordered(a) - ordered(b)).abs()


def _cases(g: torch.Generator) -> dict:
    r = lambda *shape, s=1.0: (torch.randn(*shape, generator=g) * s).half()  # noqa: E731
    x = r(2, 32, 16, 16)
    return {
        "conv": (lambda x, w, b: F.conv2d(x, w, b, padding=1), (x, r(32, 32, 3, 3, s=0.1), r(32))),
        "depthwise": (lambda x, w, b: F.conv2d(x, w, b, padding=1, groups=32), (x, r(32, 1, 3, 3, s=0.3), r(32))),
        "conv_transpose": (lambda x, w, b: F.conv_transpose2d(x, w, b, stride=2), (x, r(32, 8, 2, 2, s=0.2), r(8))),
        "linear": (F.linear, (r(64, 256), r(64, 256, s=0.06), r(64))),
    }


@functools.cache
def probe() -> HalfPath:
    """This CPU's half path (run once per process, single-threaded as the numerics tests run)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        ops = {}
        for kind, (fn, args) in _cases(torch.Generator().manual_seed(0)).items():
            with torch.no_grad():
                half = fn(*args).float()
                once = fn(*(a.float() for a in args)).half().float()
            steps = fp16_steps(half, once)
            ops[kind] = OpPath(kind, half.numel(), int((steps > 0).sum()), int((steps > 1).sum()))
    finally:
        torch.set_num_threads(threads)
    return HalfPath(torch.backends.cpu.get_cpu_capability(), bool(torch.ops.mkldnn._is_mkldnn_fp16_supported()), ops)


if __name__ == "__main__":
    print(probe().describe())
