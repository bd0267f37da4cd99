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
range of the input (:class:`~bnfold.numerics.probe.NormProbe`) in the reference
run and in the emulated run, and the local SQNR loss of the layer row
the batch norm belongs to.  ``verdict`` puts prediction and measurement
together: ``input NaN`` / ``overflows`` / ``degrades`` (by about N dB) / ``safe``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..fold_math import batch_norm_affines
from .probe import NormProbe
from .profiles import FP16_MAX, Profile
from .segments import F64, Segments
from .tensor_error import json_float

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
        return _json({**self.__dict__, "loss_db": self.loss_db, "overflows": self.overflows})


@dataclass
class Measured:
    """The same intermediates measured on the audit's batches, at the eps the emulated run used."""

    reference: dict[str, float]  # max |value| computed from the reference run's input
    emulated: dict[str, float]  # max |value| computed from the emulated input
    headroom_reference: float
    headroom_emulated: float
    output_nonfinite: int = 0  # NaN/inf in the emulated normalized output
    loss_db: float | None = None  # folded minus unfolded local SQNR of the row (None: not measured)
    nan_input: int = 0

    def to_dict(self) -> dict:
        return _json(self.__dict__)


def _json(v):
    """``v`` for JSON: a float through ``json_float``, a dict (of fields, or of floats) value by value."""
    if isinstance(v, dict):
        return {k: _json(x) for k, x in v.items()}
    return json_float(v) if isinstance(v, float) else v


@dataclass
class NormStats:
    """A batch norm's constants as per-channel tensors, in any float dtype (:class:`NormBatch` works in float64;
    ``layer_bias``: the bias of the layer before it, if any).  ``gamma_known`` / ``beta_known`` False: that
    parameter is computed in the graph (the tensor is then None): the numbers that need it are unknown and
    nothing is predicted or measured."""

    mean: torch.Tensor
    var: torch.Tensor
    gamma: torch.Tensor | None
    beta: torch.Tensor | None
    eps: float
    layer_bias: torch.Tensor | None = None
    rounded_input: bool = True  # the input is a layer's output stored in fp16 within the same row
    gamma_known: bool = True
    beta_known: bool = True

    def fits(self) -> tuple[bool, bool, bool, bool]:
        """Per per-channel tensor (var, gamma, beta, layer_bias): absent or of the statistics' channel count."""
        c = self.mean.numel()
        return tuple(t is None or t.numel() == c for t in (self.var, self.gamma, self.beta, self.layer_bias))


@dataclass
class AtEps:
    """What :class:`NormBatch` gives at one eps per member (:meth:`NormBatch.at`)."""

    scale: torch.Tensor  # fold_math.batch_norm_affines' scale and shift, with gamma and beta
    shift: torch.Tensor
    #: per member, whether its statistics define the affine (finite, ``var + eps > 0`` on every channel): with
    #: gamma and beta, bare (gamma 1, beta 0: kappa's) and with gamma (the scale's)
    defined: list[bool]
    bare: list[bool]
    scaled: list[bool]
    #: per member: ``min |scale|``, ``max |scale|``, kappa (``max |shift|`` of the bare affine) and its first channel
    extremes: list[tuple[float, float, float, int]]


class NormBatch:
    """Several batch norms' statistics laid end to end (:class:`~.segments.Segments`): the risk model runs
    over all their channels at once.  Its members are the norms whose statistics and gamma have one channel
    count (``stats[i]`` None, or counts that disagree: no numbers); of those, risks are predicted for the
    ``predictable`` ones (a beta or layer bias of another count counts as absent in the tensors)."""

    def __init__(self, stats: list[NormStats | None]):
        self.stats = stats
        fits = [None if st is None else st.fits() for st in stats]
        self.members = [i for i, f in enumerate(fits) if f is not None and f[0] and f[1]]
        kept = [(stats[i], fits[i]) for i in self.members]
        self.seg = seg = Segments([st.mean.numel() for st, _ in kept])
        columns = [
            [st.mean for st, _ in kept],
            [st.var for st, _ in kept],
            [st.gamma for st, _ in kept],
            [st.beta if f[2] else None for st, f in kept],
            [st.layer_bias if f[3] else None for st, f in kept],
        ]
        self._columns = seg.stack(columns, [0.0, 0.0, 1.0, 0.0, 0.0])
        self.mean, self.var, self.gamma, self.beta, self.layer_bias = self._columns
        self.rounded = seg.spread([float(st.rounded_input) for st, _ in kept])
        self.model_eps = [st.eps for st, _ in kept]
        self.predictable = [st.gamma_known and st.beta_known and all(f) for st, f in kept]
        self.has_layer_bias = any(lb is not None for lb in columns[4])
        self._at: dict[tuple, AtEps] = {}
        #: per member, the largest ``|value|`` of its ``mean``, ``var``, ``gamma`` and ``beta`` (NaN: it holds one),
        #: by statistic (set by :meth:`prepare`)
        self.max_abs: dict[str, list[float]] = {}

    def prepare(self, eps_list: list[list[float]]) -> None:
        """Compute what :meth:`at` gives at each of ``eps_list`` (one eps per member each) not computed yet, all in
        one call of ``fold_math.batch_norm_affines`` and one reduction (which also gives :attr:`max_abs`): each op
        then runs once for every eps."""
        todo = list(dict.fromkeys(e for e in map(tuple, eps_list) if e not in self._at))
        if not todo:
            return
        r, seg = len(todo), self.seg
        # per eps, two affines: with gamma and beta (the runtime's) and bare (kappa's: gamma 1, beta 0)
        a = batch_norm_affines(
            self.mean,
            self.var,
            seg.spread([[e] for e in todo]),
            torch.stack([self.gamma, torch.ones_like(self.gamma)]),
            torch.stack([self.beta, torch.zeros_like(self.beta)]),
        )
        scale, shift, kappa = a.scale[:, 0], a.shift[:, 0], a.shift[:, 1].abs()
        scale_abs = scale.abs()
        # one reduction: per eps max |scale|, kappa and -min |scale|; per statistic its max |value| (inf or NaN:
        # one is not finite) and -min var (var + eps rounds monotonically: > 0 on every channel iff at the min)
        top = seg.max(torch.cat([scale_abs, kappa, -scale_abs, self._columns[:4].abs(), -self.var[None]]))
        channels = seg.argmax(kappa, top[r : 2 * r]).tolist()
        table = top.tolist()
        self.max_abs = dict(zip(("mean", "var", "gamma", "beta"), table[3 * r : 3 * r + 4]))
        finite = [[v < math.inf for v in row] for row in self.max_abs.values()]  # per norm; not NaN either
        min_var = [-v for v in table[3 * r + 4]]
        for k, (e, s, b) in enumerate(zip(todo, scale.unbind(0), shift.unbind(0))):
            # defined (as fold_math.batch_norm_affine checks): bare (kappa's), with gamma (the scale's), with beta
            bare = [m and v and low + eps > 0 for m, v, low, eps in zip(finite[0], finite[1], min_var, e)]
            scaled = [ok and g for ok, g in zip(bare, finite[2])]
            full = [ok and b_ok for ok, b_ok in zip(scaled, finite[3])]
            extremes = list(zip((-v for v in table[2 * r + k]), table[k], table[r + k], channels[k]))
            self._at[e] = AtEps(s, b, full, bare, scaled, extremes)

    def at(self, eps: list[float]) -> AtEps:
        """What the statistics give at one eps per member (computed once per eps: :meth:`prepare`)."""
        self.prepare([eps])
        return self._at[tuple(eps)]

    def out(self, values: list) -> list:
        """Per-member ``values`` placed at their norms' positions (None elsewhere)."""
        at = dict(zip(self.members, values))
        return [at.get(i) for i in range(len(self.stats))]


def _intermediates(profile: Profile, seg: Segments, s, b, bounds) -> dict[str, torch.Tensor]:
    """Per norm, max |value| of what ``profile`` stores for ``s*x + b`` with ``x`` in ``[lo, hi]`` per channel
    (``bounds``: ``lo`` and ``hi`` stacked, each broadcasting to the shape of ``s``: a row of results per row
    of ``s``)."""
    if not profile.fp16_storage:
        return {"output": _affine_max_abs(seg, s, b, bounds)}
    one, zero = torch.ones_like(s), torch.zeros_like(s)
    if profile.htp_batch_norm:
        x, xs, y = _affine_max_abs(seg, torch.stack([one, s, s]), torch.stack([zero, zero, b]), bounds).unbind(0)
        return {"input": x, "x*scale": xs, "bias'": seg.max(b.abs()), "sum": y}
    x, y = _affine_max_abs(seg, torch.stack([one, s]), torch.stack([zero, b]), bounds).unbind(0)
    return {"input": x, "output": y}


def _affine_max_abs(seg: Segments, scale, shift, bounds) -> torch.Tensor:
    """Per norm, ``max |scale_c * x + shift_c|`` over its channels ``c`` and ``x`` in ``[lo_c, hi_c]`` (``bounds``:
    ``lo`` and ``hi`` stacked; inf when a bound is; 0 without channels)."""
    x = bounds.view(2, *(1,) * (scale.dim() - bounds.dim() + 1), *bounds.shape[1:])  # lo, hi against scale's rows
    return seg.max(torch.nan_to_num((scale * x + shift).abs(), nan=torch.inf).amax(0), floor=0.0)


def headroom(profile: Profile, values: dict[str, float]) -> float:
    """The storage's largest finite value over the largest of ``values`` (0 if that is NaN, inf if 0)."""
    top = max(values.values(), default=0.0)
    if math.isnan(top):
        return 0.0
    return (FP16_MAX if profile.fp16_storage else FP32_MAX) / top if top > 0 else math.inf


#: the unfolded error's terms by the cause they add up to: roundings of values near the mean, multiplied by the
#: scale (they grow with kappa^2), the runtime eps (a systematic change of the scale), and plain fp16 rounding
CAUSES = {
    "kappa": ("input rounding x scale", "x*scale rounding", "stored scale", "stored bias'", "stored statistics"),
    "runtime eps": ("runtime eps",),
    "fp16 rounding": ("output rounding", "weights"),
}


def _rounding_noises(values: dict[str, tuple]) -> dict[str, torch.Tensor]:
    """Expected squared error (per channel) of rounding each ``(const, var, mantissa bits)``: values of mean
    ``const`` and variance ``var`` (float64), ``ulp^2 / 12`` where nearly constant, else ``SPREAD u^2`` of their
    mean square.  One computation per mantissa width (the values of one width stacked: its ops run once)."""
    out = {}
    for bits in dict.fromkeys(v[2] for v in values.values()):
        names = [k for k, v in values.items() if v[2] == bits]
        const, var = (torch.stack([values[k][j] for k in names]) for j in (0, 1))
        u = 2.0 ** -(bits + 1)
        spread = SPREAD * u * u * (const * const + var)
        tight = _ulp(const, bits) ** 2 / 12
        out.update(zip(names, torch.where(var.sqrt() * 8 < const.abs(), tight, spread).unbind(0)))
    return out


def _noise_terms(nb: NormBatch, profile: Profile, var, s, b, s_m, b_m) -> tuple[dict, dict, torch.Tensor]:
    """The expected squared errors (per channel) the unfolded and the folded form add, by cause, and
    the output's mean square (the signal), each of the shape of ``s`` (a row per eps; ``var``: the
    variance, negative ones 0).  The terms of a stored input count where it is (``rounded``)."""
    rows = s.shape
    mean, var, beta, layer_bias, rounded = (t.expand(rows) for t in (nb.mean, var, nb.beta, nb.layer_bias, nb.rounded))
    s_m, b_m = s_m.expand(rows), b_m.expand(rows)
    bits = 10 if profile.fp16_storage else 23
    zero = 0 * var
    s2, s_m2_var = s**2, s_m**2 * var
    # every rounding the two forms make, as (value, its variance per channel, mantissa bits)
    roundings = {"output": (beta, s_m2_var, bits), "input": (mean, var, bits)}
    if nb.has_layer_bias:  # else 0 everywhere: its rounding adds nothing
        roundings["layer bias"] = (layer_bias, zero, bits)
    if profile.htp_batch_norm:  # x*s rounded; s stored (a constant relative error per channel); bias' stored
        roundings |= {"x*scale": (s * mean, s2 * var, 10), "scale": (s, zero, 10), "bias'": (b, zero, 10)}
    elif profile.fp16_storage:  # running statistics stored in fp16, computed in float32
        roundings |= {"mean": (mean, zero, 10), "scale": (s, zero, 10)}
    if profile.fp16_storage:  # the folded layer's stored bias
        roundings["folded bias"] = (b_m + s_m * layer_bias, zero, bits)
    noise = _rounding_noises(roundings)
    unf = {"output rounding": noise["output"], "runtime eps": (s - s_m) ** 2 * var}
    fold = {"output rounding": noise["output"]}
    # the stored input (and the layer's stored bias), times the scale: kappa's share
    stored = noise["input"] + noise["layer bias"] if nb.has_layer_bias else noise["input"]
    unf["input rounding x scale"] = rounded * s2 * stored
    # the layer's rounded weights: a relative error of its weighted sum (output less bias), in both programs
    u = 2.0 ** -(bits + 1)
    unf["weights"] = fold["weights"] = rounded * s_m**2 * SPREAD * u * u * ((mean - layer_bias) ** 2 + var)
    if profile.htp_batch_norm:
        unf["x*scale rounding"] = noise["x*scale"]
        unf["stored scale"] = noise["scale"] * (mean**2 + var)
        unf["stored bias'"] = noise["bias'"]
    elif profile.fp16_storage:
        unf["stored statistics"] = s2 * noise["mean"] + noise["scale"] * var
    if profile.fp16_storage:
        fold["stored bias"] = noise["folded bias"]
    return unf, fold, beta**2 + s_m2_var


def predict_at(nb: NormBatch, profile: Profile, eps_values: list[float | None]) -> list[list[EpsRisk | None]]:
    """Per eps of ``eps_values`` (None: each norm's own), per norm of ``nb``, its risk at that eps under
    ``profile``, from its statistics alone (None where they do not define the normalization, or it is not
    ``predictable``); every eps computed together (one row per eps in each tensor op)."""
    seg, n = nb.seg, nb.seg.n
    if n == 0:
        return [nb.out([]) for _ in eps_values]
    rows = [nb.model_eps if e is None else [float(e)] * n for e in eps_values]
    nb.prepare([nb.model_eps, *rows])
    model, at = nb.at(nb.model_eps), [nb.at(e) for e in rows]
    s, b = torch.stack([a.scale for a in at]), torch.stack([a.shift for a in at])
    var = nb.var.clamp_min(0)
    # x in mean +- SIGMAS sd
    inter = _intermediates(profile, seg, s, b, nb.mean + torch.tensor([[-SIGMAS], [SIGMAS]], dtype=F64) * var.sqrt())
    names = list(inter)
    stored = [[]] * n  # the same at every eps
    if profile.fp16_storage and not profile.htp_batch_norm:
        # the fp16 form stores the running statistics themselves (``model.half()``): a var past 65504
        # becomes inf and the scale 0 (PP-OCRv4's detector has var ~1.2e7)
        names += ["stored var", "stored mean"]
        stored = [list(v) for v in zip(nb.max_abs["var"], nb.max_abs["mean"])]
    unf, fold, signal = _noise_terms(nb, profile, var, s, b, model.scale, model.shift)
    sums = seg.sum(torch.stack([*unf.values(), sum(fold.values()), signal])).permute(1, 2, 0).tolist()
    values_at = torch.stack(list(inter.values())).permute(1, 2, 0).tolist()
    k, causes = len(unf), [next(c for c, terms in CAUSES.items() if name in terms) for name in unf]
    out = []
    for eps, a, values_v, sums_v in zip(rows, at, values_at, sums):
        valid = map(all, zip(a.defined, a.bare, model.defined, nb.predictable))
        risks = []
        for good, e, (_, scale_max, kappa, channel), at_i, more, row in zip(
            valid, eps, a.extremes, values_v, stored, sums_v
        ):
            if not good:
                risks.append(None)
                continue
            values, terms, fold_noise, total = dict(zip(names, at_i + more)), row[:k], row[k], row[k + 1]
            risks.append(
                EpsRisk(
                    eps=float(e),
                    scale_max=scale_max,
                    kappa=kappa,
                    kappa_channel=channel,
                    intermediates=values,
                    headroom=headroom(profile, values),
                    unfolded_sqnr_db=_db(total, sum(terms)),
                    folded_sqnr_db=_db(total, fold_noise),
                    cause=_largest(causes, terms),
                )
            )
        out.append(nb.out(risks))
    return out


def _largest(causes: list[str], terms: list[float]) -> str:
    """The cause whose terms (each of ``causes``) add up to the most, the first of equals."""
    totals: dict[str, float] = {}
    for cause, term in zip(causes, terms):
        totals[cause] = totals.get(cause, 0.0) + term
    return max(totals, key=totals.get)


def _db(signal: float, noise: float) -> float:
    if noise <= 0:
        return math.inf
    if signal <= 0:
        return -math.inf
    ratio = signal / noise  # 0 when it underflows, or the noise is inf: no signal left
    return -math.inf if ratio == 0 else 10 * math.log10(ratio)


def measure_intermediates(
    nb: NormBatch, profile: Profile, eps: list[float], probes: list[NormProbe | None]
) -> list[Measured | None]:
    """Per norm, the intermediates at its ``eps`` from the input ranges the emulated run recorded (``probes``,
    one per norm of ``nb``; None: not measured)."""
    seg = nb.seg
    mine = []  # the probes that fit, of the predictable members
    for i, ok, n in zip(nb.members, nb.predictable, seg.sizes):
        p = probes[i] if ok else None
        fit = p is not None and p.lo_ref.numel() == p.hi_ref.numel() == p.lo_emu.numel() == p.hi_emu.numel() == n
        mine.append(p if fit else None)
    if all(p is None for p in mine):
        return nb.out([])
    at = nb.at([eps[i] for i in nb.members])
    # lo and hi, each with a row for the reference and one for the emulated range
    bounds = [[None if p is None else getattr(p, k) for p in mine] for k in ("lo_ref", "lo_emu", "hi_ref", "hi_emu")]
    bounds = seg.stack(bounds, [math.nan] * 4).view(2, 2, seg.total)
    inter = _intermediates(profile, seg, at.scale.expand(2, -1), at.shift.expand(2, -1), bounds)
    names = list(inter)
    table = torch.stack(list(inter.values())).permute(2, 1, 0).tolist()  # per norm: reference, emulated
    out: list[Measured | None] = []
    for p, ok, (ref, emu) in zip(mine, at.defined, table):
        if p is None or not ok:
            out.append(None)
            continue
        r, e = dict(zip(names, ref)), dict(zip(names, emu))
        out.append(Measured(r, e, headroom(profile, r), headroom(profile, e), nan_input=p.nan_emu))
    return nb.out(out)


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

    @property
    def effective(self) -> EpsRisk | None:
        return self.runtime or self.model

    @property
    def loss_db(self) -> float:
        """The local SQNR loss the verdict stands on: the larger of predicted and measured."""
        pred = self.effective.loss_db if self.effective is not None else None
        meas = self.measured.loss_db if self.measured is not None else None
        return max((x for x in (pred, meas) if x is not None and math.isfinite(x)), default=0.0)

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
    pred, meas, what_if = risk.effective, risk.measured, risk.what_if
    risk.risky_at_what_if = what_if is not None and (what_if.overflows or what_if.loss_db >= DEGRADE_DB)
    if meas is not None and meas.nan_input:
        risk.verdict = "input NaN"
        risk.detail = f"its input already holds {meas.nan_input} NaN/inf in the emulated run (an upstream overflow)"
        risk.cause = "NaN/inf upstream"
        return risk
    meas_room = min(meas.headroom_reference, meas.headroom_emulated) if meas is not None else math.inf
    meas_loss = meas.loss_db if meas is not None else None
    over_pred = pred is not None and pred.overflows
    over_meas = meas is not None and (meas_room < 1 or meas.output_nonfinite > 0)
    if over_pred or over_meas:
        risk.verdict = "overflows"
        which = [f"predicted headroom {pred.headroom:.2g}x"] if over_pred else []
        if meas is not None:
            nonfinite = f", {meas.output_nonfinite} NaN/inf in its output" if meas.output_nonfinite else ""
            which.append(f"measured headroom {meas_room:.2g}x{nonfinite}")
        risk.detail = "; ".join(which)
        values = dict(pred.intermediates) if over_pred else {}
        if meas is not None:
            for k, v in [*meas.reference.items(), *meas.emulated.items()]:
                values[k] = max(values.get(k, 0.0), v)
        top = max(values, key=values.get, default="")
        risk.cause = f"{top} overflows" if top and values[top] > FP16_MAX else "NaN/inf in the output"
    elif pred is not None and (pred.loss_db >= DEGRADE_DB or (meas_loss is not None and meas_loss >= DEGRADE_DB)):
        risk.verdict = "degrades"
        measured = meas_loss is not None and meas_loss > pred.loss_db
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
    return risk


VERDICTS = ("input NaN", "overflows", "degrades", "safe")


def norm_severity(n) -> tuple:
    """A sort key for :class:`~bnfold.numerics.audit_report.NormAudit` rows, the worst normalization
    first, that does not move with the host's rounding: the verdict, then the predicted loss (from the
    statistics alone: the same on every CPU), then the measured one.  A measured loss moves by tenths
    of a dB with the inputs and with the CPU's float32 kernels (PP-OCRv6 rec: 1.35 against 1.18 dB on
    two CPUs), so it orders only what the prediction ties; it still decides the verdict where it reaches
    ``degrades``."""
    r = n.risk
    pred = r.effective.loss_db if r is not None and r.effective is not None else math.nan
    meas = r.measured.loss_db if r is not None and r.measured is not None else None
    rank = VERDICTS.index(n.verdict) if n.verdict in VERDICTS else len(VERDICTS)
    last = lambda x: -x if x is not None and math.isfinite(x) else math.inf  # noqa: E731 - unknown last
    return (rank, last(pred), last(meas))
