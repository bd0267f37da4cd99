"""The emulator: op-level rounding on hand-made graphs, htp BatchNorm, fp16 accumulation, references."""

import math

import numpy as np
import pytest
import torch
from numerics_helpers import Fn, batch_norm_with, export, float64_forward, small_net
from torch import nn

from bnfold.numerics import Emulator, emulate, round_fp16


def run(ep, profile, *args, **kw):
    return Emulator(ep, profile, **kw).run(*args)


def test_each_op_output_is_rounded_to_fp16():
    args = torch.tensor([2048.0, 1.0]), torch.tensor([1.0, 2**-11])
    ep = export(Fn(lambda x, y: x + y), *args)
    assert run(ep, "fp32", *args).outputs[0].tolist() == [2049.0, 1 + 2**-11]
    # computed in float32 (2049, 1+2^-11), then rounded: both are ties, both go to even
    assert run(ep, "fp16", *args).outputs[0].tolist() == [2048.0, 1.0]


def test_inputs_are_rounded_before_the_op():
    ep = export(Fn(lambda x: x * 1.0), torch.tensor([1.0]))
    emu = Emulator(ep, "fp16")
    res = emu.run(torch.tensor([1 + 2**-12]))  # rounds to 1 on the way in
    assert res.outputs[0].item() == 1.0
    (name,) = emu.user_inputs
    assert res.errors[name].noise == pytest.approx(2**-24)  # the input's own rounding error is reported


def test_overflow_becomes_inf_and_is_counted():
    x = torch.tensor([40000.0, 1.0, -40000.0])
    ep = export(Fn(lambda x: x * 2), x)
    emu = Emulator(ep, "fp16")
    r16 = emu.run(x)
    assert r16.outputs[0].tolist() == [math.inf, 2.0, -math.inf]
    (err,) = [e for name, e in r16.errors.items() if name not in emu.user_inputs]
    assert err.inf == 2 and err.nan == 0
    assert err.noise == 0.0 and err.signal == 4.0  # statistics over the finite elements only
    r32 = run(ep, "fp32", x)
    assert r32.outputs[0].tolist() == [80000.0, 2.0, -80000.0]
    assert all(e.nonfinite == 0 for e in r32.errors.values())


def test_every_float_intermediate_is_measured():
    net = small_net()
    x = torch.randn(4, 3, 8, 8)
    ep = export(net, x)
    res = run(ep, "fp16", x)
    wanted = {n.name for n in ep.graph.nodes if n.op == "call_function" and n.meta["val"].dtype.is_floating_point}
    assert wanted <= set(res.errors)
    assert all(math.isfinite(res.errors[n].sqnr_db) for n in wanted)


@pytest.mark.parametrize("ir", ["default", "decomposed"])
def test_fp32_and_fp16_runs_against_float64(ir):
    net = small_net()
    x = torch.randn(6, 3, 8, 8)
    ep = export(net, x, ir=ir)
    ref = float64_forward(net, x)
    scale = ref.abs().max().item()
    r32 = run(ep, "fp32", x)
    # the emulator's own float64 reference is the float64 model
    assert (r32.reference[0] - ref).abs().max().item() <= 1e-12 * scale
    assert (r32.outputs[0].double() - ref).abs().max().item() <= 1e-5 * scale
    with torch.no_grad():
        assert torch.allclose(r32.outputs[0], net(x), rtol=0, atol=1e-6 * scale)
    r16 = run(ep, "fp16", x)
    err16 = (r16.outputs[0].double() - ref).abs().max().item()
    assert 1e-6 * scale < err16 <= 2**-7 * scale  # fp16-sized: far above float32's, within a few ulps of fp16


def test_reference_false_gives_the_same_emulated_outputs():
    net = small_net()
    x = torch.randn(3, 3, 8, 8)
    emu = Emulator(export(net, x), "htp")
    with_ref, without = emu.run(x), emu.run(x, reference=False)
    assert torch.equal(with_ref.outputs[0], without.outputs[0])
    assert without.errors == {} and without.reference == []


def _bn_known_answer():
    # scale = 1.5 and shift = -1536 are exact in fp16; x = 1025 is exact in fp16.
    # fused (fp16 profile): (1025 - 1024) * 1.5 = 1.5 exactly.
    # htp: round(1025 * 1.5 = 1537.5) = 1538 (tie to even), 1538 - 1536 = 2.
    bn = batch_norm_with(1, mean=[1024.0], var=[1.0], weight=[1.5], bias=[0.0], eps=0.0)
    return nn.Sequential(bn), torch.full((1, 1, 1, 2), 1025.0)


@pytest.mark.parametrize("ir", ["default", "decomposed", "edge"])
def test_htp_batch_norm_known_answer_in_every_ir(ir):
    model, x = _bn_known_answer()
    ep = export(model, x, ir=ir)
    assert run(ep, "fp32", x).outputs[0].flatten().tolist() == [1.5, 1.5]
    assert run(ep, "fp16", x).outputs[0].flatten().tolist() == [1.5, 1.5]
    htp = run(ep, "htp", x)
    assert htp.outputs[0].flatten().tolist() == [2.0, 2.0]
    assert htp.reference[0].flatten().tolist() == [1.5, 1.5]


def test_bn_eps_override_overflows_the_scale():
    # var = 0: the model's eps = 1e-3 gives scale 31.6; a runtime eps of 1e-10 gives 1e5 > 65504 -> inf.
    bn = batch_norm_with(2, mean=[0.0, 0.0], var=[0.0, 1.0], eps=1e-3)
    x = torch.tensor([0.5, 1.0]).reshape(1, 1, 1, 2).expand(1, 2, 1, 2).contiguous()
    ep = export(nn.Sequential(bn), x)
    plain = run(ep, "htp", x)
    assert all(e.nonfinite == 0 for e in plain.errors.values())
    override = run(ep, "htp", x, bn_eps=1e-10)
    out = override.outputs[0]
    assert torch.isinf(out[0, 0]).all() and torch.isfinite(out[0, 1]).all()
    # the reference keeps the model's eps
    assert torch.allclose(override.reference[0][0, 0].double(), x[0, 0].double() / math.sqrt(1e-3))
    # the fp16 profile honours the override too: 0.5 / sqrt(1e-10) ~ 50000 stays finite, 1.0 * 1e5 overflows
    fp16 = run(ep, "fp16", x, bn_eps=1e-10).outputs[0][0, 0, 0]
    assert abs(fp16[0].item() - 50000) <= 32 and fp16[1].item() == math.inf


def _np_fp16_accumulate(partials):
    acc = None
    for p in partials:
        p = np.float16(p)
        acc = p if acc is None else np.float16(np.float32(acc) + np.float32(p))
    return float(acc)


def test_fp16_accumulation_linear_against_numpy():
    k, chunk = 65536, 16
    x = torch.full((1, k), 0.5)
    lin = nn.Linear(k, 1, bias=False)
    with torch.no_grad():
        lin.weight.fill_(1.0)
    ep = export(lin, x)
    # each chunk sums to 8; once the fp16 sum reaches 16384 (spacing 16), +8 is a tie that rounds back down
    expected = _np_fp16_accumulate([np.float32(chunk * 0.5)] * (k // chunk))
    got = run(ep, "fp16-acc", x).outputs[0].item()
    assert got == expected == 16384.0
    assert run(ep, "fp16", x).outputs[0].item() == 32768.0  # float32 accumulation, rounded once


def _oracle_matmul(a, b, chunk):
    """fp16 accumulation over chunks of the last dim of ``a`` (float64 partials of small integers are exact)."""
    k = a.shape[-1]
    acc = None
    for s in range(0, k, chunk):
        p = round_fp16(torch.matmul(a[..., s : s + chunk].double(), b[..., s : s + chunk, :].double()).float())
        acc = p if acc is None else round_fp16(acc + p)
    return acc


@pytest.mark.parametrize("kind", ["linear3d", "bmm", "addmm"])
def test_fp16_accumulation_matmuls_against_a_loop(kind):
    torch.manual_seed(2)
    k = 37  # not a multiple of the chunk
    ints = lambda *shape: torch.randint(-40, 40, shape).float()  # noqa: E731
    if kind == "linear3d":
        a, w, bias = ints(2, 3, k), ints(5, k), ints(5) / 8
        fn, args, expected = (lambda a: torch.nn.functional.linear(a, w, bias)), (a,), None
        expected = round_fp16(_oracle_matmul(a, w.t(), 16) + bias)
    elif kind == "bmm":
        a, b = ints(2, 3, k), ints(2, k, 4)
        fn, args = torch.bmm, (a, b)
        expected = _oracle_matmul(a, b, 16)
    else:
        bias, a, b = ints(4) / 8, ints(3, k), ints(k, 4)
        fn, args = (lambda a, b: torch.addmm(bias, a, b)), (a, b)
        expected = round_fp16(_oracle_matmul(a, b, 16) + bias)
    ep = export(Fn(fn), *args, ir="decomposed" if kind == "addmm" else "default")
    assert torch.equal(run(ep, "fp16-acc", *args).outputs[0], expected)


@pytest.mark.parametrize("transposed", [False, True])
def test_fp16_accumulation_grouped_1x1_conv_against_a_loop(transposed):
    torch.manual_seed(1)
    groups, cin_g, cout_g, chunk = 2, 8, 3, 4
    cls = nn.ConvTranspose2d if transposed else nn.Conv2d
    conv = cls(groups * cin_g, groups * cout_g, 1, groups=groups, bias=True)
    with torch.no_grad():  # small integers: every partial sum is exact, so the oracle is exact too
        conv.weight.copy_(torch.randint(-3, 4, conv.weight.shape).float())
        conv.bias.copy_(torch.randint(-3, 4, conv.bias.shape).float() / 4)
    x = torch.randint(-200, 200, (2, groups * cin_g, 2, 2)).float()
    ep = export(conv, x)
    got = run(ep, "fp16-acc", x).outputs[0]
    w = conv.weight.detach().double()
    out = torch.empty(2, groups * cout_g, 2, 2)
    for g in range(groups):
        xg = x[:, g * cin_g : (g + 1) * cin_g].double()
        if transposed:  # weight [in, out/g, 1, 1]
            wg = w[g * cin_g : (g + 1) * cin_g, :, 0, 0].t()
        else:  # weight [out, in/g, 1, 1]
            wg = w[g * cout_g : (g + 1) * cout_g, :, 0, 0]
        for o in range(cout_g):
            parts = [
                torch.einsum("nchw,c->nhw", xg[:, s : s + chunk], wg[o, s : s + chunk]) for s in range(0, cin_g, chunk)
            ]
            acc = None
            for p in parts:
                p = round_fp16(p.float())
                acc = p if acc is None else round_fp16(acc + p)
            out[:, g * cout_g + o] = round_fp16(acc + conv.bias[g * cout_g + o].detach())
    assert torch.equal(got, out)


def test_emulate_merges_batches():
    net = small_net()
    xs = [(torch.randn(2, 3, 8, 8),), (torch.randn(5, 3, 8, 8),)]
    ep = torch.export.export(net, xs[0], dynamic_shapes=({0: torch.export.Dim("batch")},))
    calls = []
    res = emulate(ep, xs, "fp16", progress=lambda d, t: calls.append((d, t)))
    assert calls == [(1, 2), (2, 2)]
    assert [o[0].shape[0] for o in res.outputs] == [2, 5]
    one = Emulator(ep, "fp16")
    a, b = one.run(*xs[0]), one.run(*xs[1])
    name = next(iter(a.errors))
    assert res.errors[name].noise == pytest.approx(a.errors[name].noise + b.errors[name].noise)
    assert res.errors[name].count == a.errors[name].count + b.errors[name].count


def test_a_batch_of_another_shape_is_refused_clearly():
    net = small_net()
    ep = export(net, torch.randn(4, 3, 8, 8))
    with pytest.raises(ValueError, match="exported for \\[4, 3, 8, 8\\].*dynamic batch"):
        Emulator(ep, "fp16").run(torch.randn(3, 3, 8, 8))


def test_bnfold_exposes_audit():
    import bnfold
    import bnfold.numerics

    assert bnfold.audit is bnfold.numerics.audit
