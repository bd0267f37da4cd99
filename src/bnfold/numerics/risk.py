"""The risk of each batch norm under a precision profile, predicted from its statistics.

Before anything runs, a batch norm's statistics say what a runtime will compute
for it.  Per channel ``c``, with ``s = gamma / sqrt(var + eps)``,
``bias' = beta - mean * s`` and an input ``x`` of mean ``mean`` and variance
``var``:

* **overflow**: the ``htp`` form computes ``x*s``, stores ``bias'`` and adds
  them, all in fp16.  Their largest magnitudes are predicted with ``x`` in
  ``mean +- 4 sqrt(var)``; the headroom is ``65504`` over the largest.
  The ``fp16`` form computes in float32 and stores its input, its output and
  its running statistics (a ``var`` past 65504 is inf there).
* **SQNR**: each fp16 rounding of a value ``v`` adds an error of mean square
  ``ulp(v)^2 / 12`` (``v`` nearly constant) or ``0.18 u^2 E[v^2]`` (``v``
  spread over binades; ``u = 2^-11``).  Unfolded, the rounding of the input,
  of ``x*s``, of the stored ``s`` and ``bias'`` and of the sum all reach the
  output; a runtime eps that differs from the model's adds the systematic
  ``(s_runtime - s)^2 var``.  Folded, the conv computes the normalized value
  and rounds it once (plus its stored bias).  Both carry the rounding of the
  layer's weights (``0.18 u^2`` of its output's mean square).  The predicted local SQNR loss is
  the difference of the two; kappa ``= |mean| / sqrt(var + eps)`` is the factor
  by which the input's rounding error grows.

The emulated run then measures the same intermediates from the per-channel
range of the input (:class:`~bnfold.numerics.probe.NormProbe`) in the float64
reference and in the emulated run, and the local SQNR loss of the layer row
the batch norm belongs to.  ``verdict`` puts prediction and measurement
together: ``input NaN`` / ``overflows`` / ``degrades`` (by about N dB) / ``safe``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from ..fold_math import batch_norm_affines
from .probe import NormProbe
from .profiles import FP16_MAX, Profile
from .segments import Segments

U_FP16 = 2.0**-11
FP32_MAX = float(torch.finfo(torch.float32).max)
#: mean square relative rounding error of fp16 values spread evenly over binades (log-uniform): 0.18 u^2
SPREAD = 0.18
#: a batch norm whose predicted (or measured) local SQNR loss reaches this many dB "degrades": the htp form's
#: own extra roundings cost up to ~7 dB at kappa <= 1, so 10 dB (noise x10) marks what kappa or an eps adds
DEGRADE_DB = 10.0
#: the eps ExecuTorch's QNN batch-norm builder applies whatever the model says
QNN_EPS = 1e-9
#: the x range the prediction assumes around the running mean, in standard deviations
SIGMAS = 4.0


def _ulp(v: torch.Tensor, mant_bits: int) -> torch.Tensor:
    """The spacing of floating-point numbers with ``mant_bits`` fraction bits at ``|v|`` (fp16: 10)."""
    a = v.abs().clamp_min(2.0**-14)
    return torch.exp2(torch.floor(torch.log2(a)) - mant_bits)


def rounding_noise(const: torch.Tensor, var: torch.Tensor, mant_bits: int = 10) -> torch.Tensor:
    """Expected squared error of rounding values of mean ``const`` and variance ``var`` (per channel)."""
    const, var = torch.as_tensor(const, dtype=torch.float64), torch.as_tensor(var, dtype=torch.float64)
    u = 2.0 ** -(mant_bits + 1)
    spread = SPREAD * u * u * (const * const + var)
    tight = _ulp(const, mant_bits) ** 2 / 12
    return torch.where(var.sqrt() * 8 < const.abs(), tight, spread)


@dataclass
class EpsRisk:
    """What the statistics predict at one eps (the model's, or a runtime's)."""

    eps: float
    scale_max: float
    kappa: float
    kappa_channel: int
    intermediates: dict[str, float]  # predicted max |value| of each intermediate the profile stores
    headroom: float  # 65504 / the largest of them (the float32 max for fp32)
    unfolded_sqnr_db: float  # predicted local SQNR of the normalized output, unfolded
    folded_sqnr_db: float  # the same, computed by the folded layer (rounded once)
    cause: str = ""  # the largest term of the unfolded error

    @property
    def loss_db(self) -> float:
        return self.folded_sqnr_db - self.unfolded_sqnr_db

    @property
    def overflows(self) -> bool:
        return self.headroom < 1.0

    def to_dict(self) -> dict:
        from .errors import json_float

        out = {k: json_float(v) if isinstance(v, float) else v for k, v in self.__dict__.items()}
        out["intermediates"] = {k: json_float(v) for k, v in self.intermediates.items()}
        out["loss_db"] = json_float(self.loss_db)
        out["overflows"] = self.overflows
        return out


@dataclass
class Measured:
    """The same intermediates measured on the audit's batches, at the eps the emulated run used."""

    reference: dict[str, float]  # max |value| computed from the float64 reference input
    emulated: dict[str, float]  # max |value| computed from the emulated input
    headroom_reference: float
    headroom_emulated: float
    output_nonfinite: int = 0  # NaN/inf in the emulated normalized output
    loss_db: float | None = None  # folded minus unfolded local SQNR of the row (None: not measured)
    nan_input: int = 0

    def to_dict(self) -> dict:
        from .errors import json_float

        out = {k: json_float(v) if isinstance(v, float) else v for k, v in self.__dict__.items()}
        out["reference"] = {k: json_float(v) for k, v in self.reference.items()}
        out["emulated"] = {k: json_float(v) for k, v in self.emulated.items()}
        return out


@dataclass
class NormStats:
    """A batch norm's constants as per-channel tensors, in any float dtype (:class:`NormBatch` works in float64;
    ``layer_bias``: the bias of the layer before it, if any)."""

    mean: torch.Tensor
    var: torch.Tensor
    gamma: torch.Tensor | None
    beta: torch.Tensor | None
    eps: float
    layer_bias: torch.Tensor | None = None
    rounded_input: bool = True  # the input is a layer's output stored in fp16 within the same row

    def consistent(self) -> bool:
        """Every per-channel tensor has the statistics' channel count."""
        c = self.mean.numel()
        return all(t is None or t.numel() == c for t in (self.var, self.gamma, self.beta, self.layer_bias))


class NormBatch:
    """Several batch norms' statistics laid end to end (:class:`~.segments.Segments`): the risk model runs
    over all their channels at once.  ``stats[i]`` None (or inconsistent channel counts): nothing is
    predicted for norm ``i``."""

    def __init__(self, stats: list[NormStats | None]):
        self.stats = stats
        self.members = [i for i, st in enumerate(stats) if st is not None and st.consistent()]
        kept = [stats[i] for i in self.members]
        self.seg = seg = Segments([st.mean.numel() for st in kept])
        self.mean, self.var = seg.cat([st.mean for st in kept], 0.0), seg.cat([st.var for st in kept], 0.0)
        self.gamma = seg.cat([st.gamma for st in kept], 1.0)
        self.beta = seg.cat([st.beta for st in kept], 0.0)
        self.layer_bias = seg.cat([st.layer_bias for st in kept], 0.0)
        self.rounded = seg.spread([float(st.rounded_input) for st in kept])
        self.model_eps = [st.eps for st in kept]
        self._affines: dict[tuple, tuple] = {}

    def affine(self, eps: list[float], bare: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(scale, shift, defined per norm)`` of ``fold_math.batch_norm_affines`` at one eps per member
        (``bare``: gamma 1, beta 0), computed once per eps."""
        key = (tuple(eps), bare)
        if key not in self._affines:
            weight, bias = (None, None) if bare else (self.gamma, self.beta)
            a, defined = batch_norm_affines(self.mean, self.var, self.seg.spread(eps), weight, bias)
            self._affines[key] = (a.scale, a.shift, self.seg.all(defined))
        return self._affines[key]

    def out(self, values: list) -> list:
        """Per-member ``values`` placed at their norms' positions (None elsewhere)."""
        full = [None] * len(self.stats)
        for i, v in zip(self.members, values):
            full[i] = v
        return full


def _intermediates(profile: Profile, seg: Segments, s, b, lo, hi) -> dict[str, torch.Tensor]:
    """Per norm, max |value| of what ``profile`` stores for ``s*x + b`` with ``x`` in ``[lo, hi]`` per channel."""
    one, zero = torch.ones_like(s), torch.zeros_like(s)
    y = _affine_max_abs(seg, s, b, lo, hi)
    if not profile.fp16_storage:
        return {"output": y}
    x = _affine_max_abs(seg, one, zero, lo, hi)
    if profile.htp_batch_norm:
        return {"input": x, "x*scale": _affine_max_abs(seg, s, zero, lo, hi), "bias'": seg.max(b.abs()), "sum": y}
    return {"input": x, "output": y}


def _affine_max_abs(seg: Segments, scale, shift, lo, hi) -> torch.Tensor:
    """Per norm, ``max |scale_c * x + shift_c|`` over its channels ``c`` and ``x`` in ``[lo_c, hi_c]`` (inf
    when a bound is; 0 without channels)."""
    a = torch.nan_to_num((scale * lo + shift).abs(), nan=torch.inf)
    b = torch.nan_to_num((scale * hi + shift).abs(), nan=torch.inf)
    return seg.max(torch.maximum(a, b), floor=0.0)


def headroom(profile: Profile, values: dict[str, float]) -> float:
    top = max(values.values(), default=0.0)
    limit = FP16_MAX if profile.fp16_storage else FP32_MAX
    if math.isnan(top):
        return 0.0
    return limit / top if top > 0 else math.inf


#: the causes the unfolded error's terms add up to: roundings of values near the mean, multiplied by the scale
#: (they grow with kappa^2), the runtime eps (a systematic change of the scale), and plain fp16 rounding
CAUSES = {
    "input rounding x scale": "kappa",
    "x*scale rounding": "kappa",
    "stored scale": "kappa",
    "stored bias'": "kappa",
    "stored statistics": "kappa",
    "runtime eps": "runtime eps",
    "output rounding": "fp16 rounding",
    "weights": "fp16 rounding",
}


def _noise_terms(nb: NormBatch, profile: Profile, s, b, s_m, b_m) -> tuple[dict, dict, torch.Tensor]:
    """The expected squared errors (per channel) the unfolded and the folded form add, by cause, and
    the output's mean square (the signal).  The terms of a stored input count where it is (``rounded``)."""
    mean, var, beta, layer_bias = nb.mean, nb.var.clamp_min(0), nb.beta, nb.layer_bias
    bits = 10 if profile.fp16_storage else 23
    zero = 0 * var
    out = rounding_noise(beta, s_m**2 * var, bits)
    unf = {"output rounding": out, "runtime eps": (s - s_m) ** 2 * var}
    fold = {"output rounding": out}
    # the stored input (and the layer's stored bias), times the scale: kappa's share
    stored = rounding_noise(mean, var, bits) + rounding_noise(layer_bias, zero, bits)
    unf["input rounding x scale"] = nb.rounded * s**2 * stored
    # the layer's rounded weights: a relative error of its weighted sum (output less bias), in both programs
    u = 2.0 ** -(bits + 1)
    unf["weights"] = fold["weights"] = nb.rounded * s_m**2 * SPREAD * u * u * ((mean - layer_bias) ** 2 + var)
    if profile.htp_batch_norm:  # x*s rounded; s stored (a constant relative error per channel); bias' stored
        unf["x*scale rounding"] = rounding_noise(s * mean, s**2 * var)
        unf["stored scale"] = rounding_noise(s, zero) * (mean**2 + var)
        unf["stored bias'"] = rounding_noise(b, zero)
    elif profile.fp16_storage:  # running statistics stored in fp16, computed in float32
        unf["stored statistics"] = s**2 * rounding_noise(mean, zero) + rounding_noise(s, zero) * var
    if profile.fp16_storage:
        fold["stored bias"] = rounding_noise(b_m + s_m * layer_bias, zero, bits)
    return unf, fold, beta**2 + s_m**2 * var


def predict(nb: NormBatch, profile: Profile, eps: float | None = None) -> list[EpsRisk | None]:
    """Per norm of ``nb``, its risk at ``eps`` (None: each norm's own) under ``profile``, from its statistics
    alone (None where they do not define the normalization)."""
    n = nb.seg.n
    if n == 0:
        return nb.out([])
    eps = nb.model_eps if eps is None else [float(eps)] * n
    s, b, ok = nb.affine(eps)
    s_m, b_m, ok_m = nb.affine(nb.model_eps)
    _, bare_shift, ok_bare = nb.affine(eps, bare=True)
    seg = nb.seg
    sd = nb.var.clamp_min(0).sqrt()
    inter = _intermediates(profile, seg, s, b, nb.mean - SIGMAS * sd, nb.mean + SIGMAS * sd)
    if profile.fp16_storage and not profile.htp_batch_norm:
        # the fp16 form stores the running statistics themselves (``model.half()``): a var past 65504
        # becomes inf and the scale 0 (PP-OCRv4's detector has var ~1.2e7)
        inter["stored var"] = seg.max(nb.var.abs())
        inter["stored mean"] = seg.max(nb.mean.abs())
    kappa = bare_shift.abs()
    unf, fold, signal = _noise_terms(nb, profile, s, b, s_m, b_m)
    names = list(inter)
    table = torch.stack(
        [*(inter[k] for k in names), *(seg.sum(v) for v in unf.values())]
        + [seg.sum(sum(fold.values())), seg.sum(signal), seg.max(s.abs()), seg.max(kappa)]
    ).T.tolist()
    channels = seg.argmax(kappa).tolist()
    valid = (ok & ok_m & ok_bare).tolist()
    risks: list[EpsRisk | None] = []
    for i, row in enumerate(table):
        if not valid[i]:
            risks.append(None)
            continue
        values = dict(zip(names, row))
        sums = dict(zip(unf, row[len(names) : len(names) + len(unf)]))
        fold_noise, total, scale_max, kappa_max = row[len(names) + len(unf) :]
        causes: dict[str, float] = {}
        for k, v in sums.items():
            causes[CAUSES.get(k, k)] = causes.get(CAUSES.get(k, k), 0.0) + v
        risks.append(
            EpsRisk(
                eps=float(eps[i]),
                scale_max=scale_max,
                kappa=kappa_max,
                kappa_channel=channels[i],
                intermediates=values,
                headroom=headroom(profile, values),
                unfolded_sqnr_db=_db(total, sum(sums.values())),
                folded_sqnr_db=_db(total, fold_noise),
                cause=max(causes, key=causes.get),
            )
        )
    return nb.out(risks)


def _db(signal: float, noise: float) -> float:
    if noise <= 0:
        return math.inf
    if signal <= 0:
        return -math.inf
    return 10 * math.log10(signal / noise)


def measure_intermediates(
    nb: NormBatch, profile: Profile, eps: list[float], probes: list[NormProbe | None]
) -> list[Measured | None]:
    """Per norm, the intermediates at its ``eps`` from the input ranges the emulated run recorded (``probes``,
    one per norm of ``nb``; None: not measured)."""
    mine = [probes[i] for i in nb.members]
    mine = [p if p is not None and all(getattr(p, k).numel() == int(n) for k in _PROBE) else None
            for p, n in zip(mine, nb.seg.lengths.tolist())]  # fmt: skip
    if all(p is None for p in mine):
        return nb.out([])
    s, b, ok = nb.affine([eps[i] for i in nb.members])
    seg = nb.seg
    bounds = [seg.cat([getattr(p, k) if p is not None else None for p in mine], math.nan) for k in _PROBE]
    ref = _intermediates(profile, seg, s, b, bounds[0], bounds[1])
    emu = _intermediates(profile, seg, s, b, bounds[2], bounds[3])
    names = list(ref)
    table = torch.stack([*(ref[k] for k in names), *(emu[k] for k in names)]).T.tolist()
    valid = ok.tolist()
    out: list[Measured | None] = []
    for i, row in enumerate(table):
        p = mine[i]
        if p is None or not valid[i]:
            out.append(None)
            continue
        r, e = dict(zip(names, row[: len(names)])), dict(zip(names, row[len(names) :]))
        out.append(Measured(r, e, headroom(profile, r), headroom(profile, e), nan_input=p.nan_emu))
    return nb.out(out)


_PROBE = ("lo_ref", "hi_ref", "lo_emu", "hi_emu")


@dataclass
class Risk:
    """The verdict on one batch norm: predicted at the model's eps, at the runtime eps (``bn_eps``) and,
    when none is given, at the QNN builder's eps as a what-if; measured at the eps the run used."""

    model: EpsRisk | None
    runtime: EpsRisk | None
    what_if: EpsRisk | None
    measured: Measured | None
    verdict: str = "unknown"
    detail: str = ""
    cause: str = ""  # what overflows, or the largest term of the error
    risky_at_what_if: bool = False
    notes: list = field(default_factory=list)

    @property
    def effective(self) -> EpsRisk | None:
        return self.runtime or self.model

    @property
    def loss_db(self) -> float:
        """The local SQNR loss the verdict stands on: the larger of predicted and measured."""
        found = [self.effective.loss_db] if self.effective is not None else []
        if self.measured is not None and self.measured.loss_db is not None:
            found.append(self.measured.loss_db)
        found = [x for x in found if math.isfinite(x)]
        return max(found) if found else 0.0

    def to_dict(self) -> dict:
        return {
            "verdict": self.verdict,
            "detail": self.detail,
            "cause": self.cause,
            "predicted_model_eps": self.model and self.model.to_dict(),
            "predicted_runtime_eps": self.runtime and self.runtime.to_dict(),
            "predicted_qnn_eps_what_if": self.what_if and self.what_if.to_dict(),
            "measured": self.measured and self.measured.to_dict(),
        }


def judge(risk: Risk) -> Risk:
    """Set ``risk.verdict`` (``input NaN`` / ``overflows`` / ``degrades`` / ``safe``) and its one-line ``detail``.

    ``input NaN``: the norm's input already holds NaN/inf in the emulated run (a layer upstream
    overflowed), so nothing about this norm can be measured.  ``degrades`` states the larger of
    the predicted and measured loss, and says which it is.
    """
    pred, meas = risk.effective, risk.measured
    if meas is not None and meas.nan_input:
        risk.verdict = "input NaN"
        risk.detail = f"its input already holds {meas.nan_input} NaN/inf in the emulated run (an upstream overflow)"
        risk.cause = "NaN/inf upstream"
        if risk.what_if is not None:
            risk.risky_at_what_if = risk.what_if.overflows or risk.what_if.loss_db >= DEGRADE_DB
        return risk
    over_pred = pred is not None and pred.overflows
    over_meas = meas is not None and (
        min(meas.headroom_reference, meas.headroom_emulated) < 1 or meas.output_nonfinite > 0
    )
    if over_pred or over_meas:
        risk.verdict = "overflows"
        which = []
        if over_pred:
            which.append(f"predicted headroom {pred.headroom:.2g}x")
        if meas is not None:
            which.append(
                f"measured headroom {min(meas.headroom_reference, meas.headroom_emulated):.2g}x"
                + (f", {meas.output_nonfinite} NaN/inf in its output" if meas.output_nonfinite else "")
            )
        risk.detail = "; ".join(which)
        values = dict(pred.intermediates) if over_pred else {}
        if meas is not None:
            for k, v in list(meas.reference.items()) + list(meas.emulated.items()):
                values[k] = max(values.get(k, 0.0), v)
        top = max(values, key=values.get, default="")
        risk.cause = f"{top} overflows" if top and values[top] > FP16_MAX else "NaN/inf in the output"
    elif pred is not None and (pred.loss_db >= DEGRADE_DB or (meas and meas.loss_db and meas.loss_db >= DEGRADE_DB)):
        risk.verdict = "degrades"
        measured = meas is not None and meas.loss_db is not None and meas.loss_db > pred.loss_db
        if measured and pred.loss_db < DEGRADE_DB:  # the statistics did not predict it: the inputs did it
            risk.detail = (
                f"by ~{risk.loss_db:.0f} dB measured (predicted {pred.loss_db:.0f} dB from the running statistics: "
                "these inputs reach a range the statistics do not describe)"
            )
            risk.cause = "inputs vs statistics"
        else:
            how = "measured" if measured else "predicted"
            risk.detail = f"by ~{risk.loss_db:.0f} dB ({how}), mostly {pred.cause}"
            risk.cause = pred.cause
    elif pred is not None:
        risk.verdict = "safe"
        risk.detail = f"predicted loss {pred.loss_db:.1f} dB"
    if risk.what_if is not None:
        risk.risky_at_what_if = risk.what_if.overflows or risk.what_if.loss_db >= DEGRADE_DB
    return risk


VERDICTS = ("input NaN", "overflows", "degrades", "safe")


def norm_severity(n) -> tuple:
    """A sort key for :class:`~bnfold.numerics.audit_report.NormAudit` rows, the worst normalization
    first, that does not move with the host's rounding: the verdict, then the predicted loss (from the
    statistics alone: the same on every CPU), then the measured one.  A measured loss moves by tenths
    of a dB with the inputs and with the CPU's float32 kernels (PP-OCRv6 rec: 1.35 against 1.18 dB on
    two CPUs), so it orders only what the prediction
    ties; it still decides the verdict where it reaches ``degrades``."""
    r = n.risk
    pred = r.effective.loss_db if r is not None and r.effective is not None else math.nan
    meas = r.measured.loss_db if r is not None and r.measured is not None else None
    rank = VERDICTS.index(n.verdict) if n.verdict in VERDICTS else len(VERDICTS)
    last = lambda x: -x if x is not None and math.isfinite(x) else math.inf  # noqa: E731 - unknown last
    return (rank, last(pred), last(meas))
