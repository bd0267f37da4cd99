"""Precision profiles: the rounding rules the emulator applies.

* ``fp32``      plain float32.
* ``fp16``      every op computes in float32 from fp16-rounded inputs and its
                output is rounded to fp16 (round to nearest, ties to even;
                magnitudes that round past 65504 become inf, as on hardware).
* ``htp``       ``fp16`` plus a standalone BatchNorm evaluated the way NPU
                runtimes do: the host precomputes ``scale = gamma/sqrt(var+eps)``
                and ``bias' = beta - mean*scale`` and stores both in fp16; the
                device computes ``round(round(x*scale) + bias')``.
* ``fp16-acc``  ``fp16`` plus conv / linear / matmul, sums, means and average
                pools accumulating in fp16 (a GPU delegate's kernels): the
                reduction is summed in float32 over chunks of ``acc_chunk``
                input channels (features, reduced elements), each partial sum
                is rounded to fp16 and the partials are added one by one in
                fp16 (:mod:`.accumulate`; the op tables' ``accumulate`` column).
* ``ort-cpu``   ONNX Runtime's CPU provider running a float16 model (as
                onnxconverter-common's ``convert_float_to_float16`` writes it,
                ``keep_io_types=True``) on x86: only the constants (weights,
                statistics, scalars) are fp16; ORT runs Conv, BatchNorm, MatMul
                and the elementwise ops in float32 behind casts it inserts and
                drops the casts between ops, so activations stay float32; but its
                graph optimizer first fuses Conv+BatchNormalization on the fp16
                weights, each step rounded to fp16 (measured: with optimizations off the extra loss is gone),
                and Softmax and the data-movement ops run in fp16.  The converter
                clamps constants to [1e-7, 1e4] in magnitude first (its
                ``min_positive_val`` / ``max_finite_val``).  A torch program
                audited under ``ort-cpu`` runs as the ONNX it exports to would
                (the same fusion and fp16 ops: one model, one meaning).

Which runtime each matches: ``fp16`` is PyTorch eager in half precision on
CPU (tested bit-identical on the test models); ``ort-cpu`` is ONNX Runtime
1.2x-1.3x CPU on x86 (tested within 1 dB end to end); ``htp`` and
``fp16-acc`` model NPU / GPU kernels that cannot be run here.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

FP16_MAX = 65504.0
#: ONNX ops that ONNX Runtime's CPU provider runs in fp16 in a float16 model (it keeps their fp16 kernels and
#: casts their inputs back to fp16), measured from the optimized graph ORT 1.32 writes
#: (``SessionOptions.optimized_model_filepath``): the ``Cast(to=float16)`` nodes left feed these.
#: They are Softmax and the data-movement ops (Reshape Transpose Slice Squeeze Unsqueeze Concat Flatten Gather
#: Expand): the frontends' op tables mark them (``Op.fp16`` ``softmax`` / ``movement``), in every format.
ORT_CPU_FP16_CLASSES = frozenset({"softmax", "movement"})
PROFILE_NAMES = ("fp32", "fp16", "htp", "fp16-acc", "ort-cpu")


def round_fp16(t: torch.Tensor) -> torch.Tensor:
    """Round a float32/float64 tensor to the nearest fp16 value (ties to even), as float32.

    float64 input is first cast to float32, which can double-round in rare
    ties; the emulator only ever rounds float32 values.
    """
    return t.half().float()  # .to(dtype) twice, through shorter bindings: ~1 us less Python a rounding


#: a float32 constant of at least this many elements is rounded chunk by chunk (:func:`round_fp16_chunked`)
ROUND_IN_CHUNKS = 1 << 22
_CHUNK = 1 << 17  # elements of the fp16 buffer (256 KiB: it stays in cache between its write and its read)


def round_fp16_chunked(t: torch.Tensor) -> torch.Tensor:
    """:func:`round_fp16` of a contiguous float32 tensor through one fp16 buffer of :data:`_CHUNK` elements: the same
    values (the rounding is elementwise; a NaN stays NaN), without allocating and faulting in the whole fp16 copy (one
    thread, a weight of 16.8M elements: 56 -> 41 ms; of 103M, vgg11's first linear layer: 334 -> 224 ms)."""
    out = torch.empty_like(t)
    src, dst = t.view(-1), out.view(-1)
    buf = torch.empty(min(_CHUNK, src.numel()), dtype=torch.float16)
    for i in range(0, src.numel(), _CHUNK):
        part = src[i : i + _CHUNK]
        half = buf[: part.numel()]
        half.copy_(part)
        dst[i : i + _CHUNK].copy_(half)
    return out


def htp_host_scale_shift(gamma, beta, mean, var, eps: float, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """An NPU runtime's BatchNorm constants: ``scale = gamma / sqrt(var + eps)`` and ``shift = beta -
    mean * scale`` computed by the host in float32 from the unrounded parameters, then stored in fp16,
    shaped ``[1, C, 1, ...]`` to broadcast over a rank-``rank`` tensor.  (Emulation of the runtime's own
    arithmetic: the exact fold is ``bnfold.fold_math``.)"""
    f32 = [t.to(torch.float32) for t in (gamma, beta, mean, var)]
    scale = f32[0] / torch.sqrt(f32[3] + eps)
    shift = f32[1] - f32[2] * scale
    shape = (1, -1) + (1,) * (rank - 2)
    return round_fp16(scale).reshape(shape), round_fp16(shift).reshape(shape)


@dataclass(frozen=True)
class Profile:
    """How the emulated run computes.  Use :func:`get_profile` to build one."""

    name: str
    fp16_storage: bool  # inputs, weights and every op output rounded to fp16
    htp_batch_norm: bool  # standalone BatchNorm as host-precomputed fp16 scale/bias
    fp16_accumulate: bool  # conv / linear / matmul accumulate in fp16 over chunks
    acc_chunk: int = 16
    fp16_constants: bool = False  # constants stored in fp16 (implied by fp16_storage)
    fp16_classes: frozenset = frozenset()  # classes of ops (``Op.fp16``) whose output is stored in fp16
    fp16_conv_fusion: bool = False  # the runtime fuses Conv+BatchNormalization on fp16 weights
    #: the converter's clamp of constants before fp16 (onnxconverter-common: 1e-7 and 1e4), or None
    const_clamp: tuple[float, float] | None = None

    def round(self, t: torch.Tensor) -> torch.Tensor:
        """The storage rounding of this profile applied to a float tensor (a model input, an op's output)."""
        return round_fp16(t) if self.fp16_storage else t.to(torch.float32)

    def round_const(self, t: torch.Tensor) -> torch.Tensor:
        """How this profile stores a constant (weight, statistic, scalar)."""
        if self.const_clamp is not None:
            lo, hi = self.const_clamp
            mag = t.abs()
            t = torch.where((mag > 0) & (mag < lo), torch.sign(t) * lo, t)
            t = torch.where(mag > hi, torch.sign(t) * hi, t)
        if not (self.fp16_storage or self.fp16_constants):
            return t.to(torch.float32)
        large = t.dtype == torch.float32 and t.numel() >= ROUND_IN_CHUNKS and t.is_contiguous()
        return round_fp16_chunked(t) if large else round_fp16(t)


def get_profile(profile: str | Profile, acc_chunk: int = 16) -> Profile:
    """The :class:`Profile` called ``profile`` (``fp32``, ``fp16``, ``htp``, ``fp16-acc``, ``ort-cpu``)."""
    if isinstance(profile, Profile):
        return profile
    if acc_chunk < 1:
        raise ValueError(f"acc_chunk must be >= 1, got {acc_chunk}")
    if profile == "fp32":
        return Profile("fp32", False, False, False, acc_chunk)
    if profile == "fp16":
        return Profile("fp16", True, False, False, acc_chunk)
    if profile == "htp":
        return Profile("htp", True, True, False, acc_chunk)
    if profile == "fp16-acc":
        return Profile("fp16-acc", True, False, True, acc_chunk)
    if profile == "ort-cpu":
        return Profile(
            "ort-cpu",
            False,
            False,
            False,
            acc_chunk,
            fp16_constants=True,
            fp16_classes=ORT_CPU_FP16_CLASSES,
            fp16_conv_fusion=True,
            const_clamp=(1e-7, 1e4),
        )
    raise ValueError(f"unknown precision profile {profile!r}; choose from {', '.join(PROFILE_NAMES)}")
