"""YOLOv10n's blocks (written here, no ultralytics): the torch program and its dynamo ONNX export fold the same set.

Issue 41 reported that YOLOv10n's dynamo ONNX export keeps 18 constant affines (per-channel Mul/Add by constants)
that its torch IRs fold. Measured on integ (da16f9b) with ultralytics 8.4.190's own ``yolov10n.yaml`` (random
weights, ``torch.onnx.export(program, dynamo=True, optimize=False)``): in its default forward, 95 BatchNorms fold
in the program and in the ONNX export, none skipped. With the head in export mode (``export=True``), the program
folds 95 and the ONNX export 77, none skipped, no BatchNormalization left: the 18 are the other head's
(``one2one_cv2`` / ``one2one_cv3``), computed and dropped, which torch.export keeps and the ONNX exporter removes
(``test_dead_head_is_the_difference``). Nothing is left unfolded in the ONNX model.

This test holds the two formats to the same folds on the blocks
that model is made of: Conv (conv + BN + SiLU), SCDown (a strided depthwise conv + BN, no activation), C2f's
chunk/split and concat, CIB with RepVGGDW (a 7x7 and a 3x3 depthwise conv + BN summed), PSA's attention (qkv conv
+ BN, ``(q^T k) * scale``, softmax, a positional depthwise conv + BN on v, a projection conv + BN, residual adds) and
v10Detect's two-branch head with its strides Mul (here right after a conv, so it folds)."""

from __future__ import annotations

import warnings

import onnx
import pytest
import torch
from onnx_testkit import ops, ort_run, rel_err
from torch import nn

import bnfold
from bnfold_testutil import randomize_bn, reference

pytest.importorskip("onnxscript", reason="the dynamo exporter needs onnxscript")

REL = 1e-5


class ConvBn(nn.Module):
    def __init__(self, cin, cout, k=1, s=1, g=1, act=True):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, k, s, k // 2, groups=g, bias=False)
        self.bn = nn.BatchNorm2d(cout)
        self.act = nn.SiLU() if act else nn.Identity()

    def forward(self, x):
        return self.act(self.bn(self.conv(x)))


class RepVGGDW(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.conv = ConvBn(c, c, 7, g=c, act=False)
        self.conv1 = ConvBn(c, c, 3, g=c, act=False)

    def forward(self, x):
        return nn.functional.silu(self.conv(x) + self.conv1(x))


class C2fCIB(nn.Module):
    def __init__(self, c):
        super().__init__()
        h = c // 2
        self.cv1 = ConvBn(c, 2 * h)
        self.cib = nn.Sequential(
            ConvBn(h, h, 3, g=h), ConvBn(h, 2 * h), RepVGGDW(2 * h), ConvBn(2 * h, h), ConvBn(h, h, 3, g=h)
        )
        self.cv2 = ConvBn(3 * h, c)

    def forward(self, x):
        y = list(self.cv1(x).chunk(2, 1))
        y.append(y[-1] + self.cib(y[-1]))
        return self.cv2(torch.cat(y, 1))


class PSA(nn.Module):
    def __init__(self, c, heads=2):
        super().__init__()
        self.h, self.kd, self.hd = heads, c // heads // 2, c // heads
        self.scale = self.kd**-0.5
        self.cv1 = ConvBn(2 * c, 2 * c)
        self.qkv = ConvBn(c, c + 2 * self.kd * heads, act=False)
        self.pe = ConvBn(c, c, 3, g=c, act=False)
        self.proj = ConvBn(c, c, act=False)
        self.ffn = nn.Sequential(ConvBn(c, 2 * c), ConvBn(2 * c, c, act=False))
        self.cv2 = ConvBn(2 * c, 2 * c)

    def forward(self, x):
        a, b = self.cv1(x).split((x.shape[1] // 2, x.shape[1] // 2), dim=1)
        n, c, hh, ww = b.shape
        q, k, v = self.qkv(b).view(n, self.h, self.kd * 2 + self.hd, hh * ww).split([self.kd, self.kd, self.hd], dim=2)
        attn = ((q.transpose(-2, -1) @ k) * self.scale).softmax(dim=-1)
        y = (v @ attn.transpose(-2, -1)).view(n, c, hh, ww) + self.pe(v.reshape(n, c, hh, ww))
        b = b + self.proj(y)
        b = b + self.ffn(b)
        return self.cv2(torch.cat((a, b), 1))


class Yolov10Blocks(nn.Module):
    def __init__(self, c=16):
        super().__init__()
        self.stem = ConvBn(3, c, 3, 2)
        self.scdown = nn.Sequential(ConvBn(c, 2 * c), ConvBn(2 * c, 2 * c, 3, 2, g=2 * c, act=False))
        self.c2fcib = C2fCIB(2 * c)
        self.psa = PSA(c)
        self.box = nn.Sequential(ConvBn(2 * c, c, 3), nn.Conv2d(c, 8, 1))
        self.cls = nn.Sequential(ConvBn(2 * c, 2 * c, 3, g=2 * c), ConvBn(2 * c, c), nn.Conv2d(c, 4, 1))
        self.register_buffer("strides", torch.full((1, 8, 1, 1), 8.0))

    def forward(self, x):
        x = self.psa(self.c2fcib(self.scdown(self.stem(x))))
        return torch.cat((self.box(x) * self.strides, self.cls(x).sigmoid()), 1)


def _n_norms(model: nn.Module) -> int:
    return sum(isinstance(m, nn.BatchNorm2d) for m in model.modules())


def _constant_affines(model: onnx.ModelProto) -> int:
    """Mul / Add / Sub / Div nodes with a constant operand (an initializer or a Constant node's output)."""
    g = model.graph
    consts = {t.name for t in g.initializer} | {o for n in g.node if n.op_type == "Constant" for o in n.output}
    return sum(n.op_type in ("Mul", "Add", "Sub", "Div") and any(i in consts for i in n.input) for n in g.node)


def _program_constant_affines(ep) -> int:
    """The same count in a torch program: elementwise mul/add/sub/div with a parameter, buffer, constant or number."""
    sig = ep.graph_signature
    consts = set(sig.inputs_to_parameters) | set(sig.inputs_to_buffers) | set(sig.inputs_to_lifted_tensor_constants)
    ew = ("aten.mul.Tensor", "aten.add.Tensor", "aten.sub.Tensor", "aten.div.Tensor")
    return sum(
        n.op == "call_function"
        and str(n.target) in ew
        and any(not isinstance(a, torch.fx.Node) or a.name in consts for a in n.args[:2])
        for n in ep.graph.nodes
    )


def _exports(cls):
    """The model (random BN statistics), its input, its program and the program's dynamo ONNX export."""
    torch.manual_seed(0)
    model = randomize_bn(cls()).eval()
    x = torch.randn(2, 3, 32, 32)
    ep = torch.export.export(model, (x,))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        original = torch.onnx.export(ep, (x,), dynamo=True, optimize=False, verbose=False).model_proto
    return model, x, ep, original


def test_program_and_dynamo_onnx_fold_the_same_set():
    model, x, ep, original = _exports(Yolov10Blocks)
    norms = _n_norms(model)
    assert ops(original).count("BatchNormalization") == norms, "the export fused a BN"

    prog = bnfold.fold(ep)
    onx = bnfold.fold(original)
    assert not prog.report.skipped and not onx.report.skipped, (prog.report.skipped, onx.report.skipped)
    # every BatchNorm, and the strides Mul into the box branch's last conv, in both formats
    assert len(prog.report.folded) == len(onx.report.folded) == norms + 1
    assert not [n for n in prog.model.graph.nodes if "batch_norm" in str(n.target)]
    assert "BatchNormalization" not in ops(onx.model)
    assert sorted(f.kind for f in prog.report.folded) == sorted(f.kind for f in onx.report.folded)
    assert len(prog.report.merged) == len(onx.report.merged)  # RepVGGDW's two depthwise convs
    assert [f.steps[0].op.lower() for f in prog.report.folded if f.kind != "batch_norm"] == ["mul"]
    assert [f.steps[0].op.lower() for f in onx.report.folded if f.kind != "batch_norm"] == ["mul"]
    # the one constant affine left in both formats: the attention's scale (after a MatMul, no layer to take it)
    assert _program_constant_affines(ep) == _constant_affines(original) == 2
    assert _constant_affines(onx.model) == _program_constant_affines(prog.model) == 1

    ref = reference(model, x)
    with torch.no_grad():
        out_prog = prog.model.module()(x)
    scale = ref.abs().max().item()
    assert (out_prog.double() - ref).abs().max().item() <= REL * scale
    name = onx.model.graph.input[0].name
    (out_onnx,) = ort_run(onx.model, {name: x.numpy()})
    assert rel_err(out_onnx, ref) <= REL


class DeadHead(Yolov10Blocks):
    """v10Detect in export mode: the other head runs on a detached input and its result is dropped, so the
    program keeps its conv + BatchNorm nodes (torch.export leaves them) and the ONNX exporter removes them."""

    def __init__(self, c=16):
        super().__init__(c)
        self.one2many = nn.Sequential(ConvBn(2 * c, c, 3), nn.Conv2d(c, 8, 1))

    def forward(self, x):
        x = self.psa(self.c2fcib(self.scdown(self.stem(x))))
        self.one2many(x.detach())  # computed, never returned
        return torch.cat((self.box(x) * self.strides, self.cls(x).sigmoid()), 1)


def _live(ep) -> set:
    out = next(n for n in ep.graph.nodes if n.op == "output")
    live, todo = set(), [out]
    while todo:
        n = todo.pop()
        if n not in live:
            live.add(n)
            todo.extend(n.all_input_nodes)
    return {n.name for n in live}


def test_dead_head_is_the_difference():
    """The counts differ by the BatchNorms on no path to an output, and nothing is left unfolded in ONNX
    (YOLOv10n with its head in export mode: 95 folded in the program, 77 in the dynamo export, 18 dead)."""
    model, x, ep, original = _exports(DeadHead)
    live = _live(ep)
    norms = [n.name for n in ep.graph.nodes if "batch_norm" in str(n.target)]
    dead = [n for n in norms if n not in live]
    assert len(norms) == _n_norms(model) and len(dead) == 1
    assert ops(original).count("BatchNormalization") == len(norms) - len(dead)

    prog, onx = bnfold.fold(ep), bnfold.fold(original)
    assert not prog.report.skipped and not onx.report.skipped
    assert "BatchNormalization" not in ops(onx.model)
    assert len(prog.report.folded) - len(onx.report.folded) == len(dead)
    assert len([f for f in prog.report.folded if f.node not in dead]) == len(onx.report.folded)
    (out_onnx,) = ort_run(onx.model, {onx.model.graph.input[0].name: x.numpy()})
    assert rel_err(out_onnx, reference(model, x)) <= REL
