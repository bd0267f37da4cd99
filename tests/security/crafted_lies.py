"""Crafted files for issue 28: op arguments that ask for huge sizes while the stored metadata says small.

Each ``.pt2`` is a small program exported honestly (conv -> batch norm, plus ``extra(x)``, a scalar,
added to the output), whose program JSON is then edited: the size-setting argument of one op (a
creation op's size, a pad, a stride, an output size, a repeat count, ...) is patched to a huge
value, and every ``tensor_values`` entry (``meta["val"]``) is left as export wrote it.
"""

from __future__ import annotations

from pathlib import Path

import crafted as c
import crafted_work as w
import numpy as np
import torch
import torch.nn.functional as F
from onnx import TensorProto, helper, numpy_helper
from torch import nn

BIG = 1 << 16  # a [BIG, BIG] float32 tensor is 16 GiB


def _q(x):
    return x[:1, :1, :1, :1].expand(1, 1, 8, 4)


def _mm_chain(x):
    a = torch.ones(2, 2) * x.mean()
    for _ in range(40):
        a = a @ a
    return a.mean()


def _grid(n):
    return {"as_ints": [n, n]}


#: name -> (extra(x), the op whose arguments are patched, {argument: new JSON argument})
LIES = {
    # creation ops: a size
    "full": (lambda x: torch.full((2, 3), 1.5).sum(), "full.default", {"size": _grid(BIG)}),
    "zeros": (lambda x: torch.zeros(2, 3).sum(), "zeros.default", {"size": _grid(BIG)}),
    "ones": (lambda x: torch.ones(2, 3).sum(), "ones.default", {"size": _grid(BIG)}),
    "empty": (lambda x: torch.empty(2, 3).fill_(1.0).sum(), "empty.memory_format", {"size": _grid(BIG)}),
    "empty_strided": (
        lambda x: torch.empty_strided((2, 3), (3, 1)).fill_(1.0).sum(),
        "empty_strided.default",
        {"size": _grid(BIG), "stride": {"as_ints": [BIG, 1]}},
    ),
    "new_zeros": (lambda x: x.new_zeros((2, 3)).sum(), "new_zeros.default", {"size": _grid(BIG)}),
    "new_ones": (lambda x: x.new_ones((2, 3)).sum(), "new_ones.default", {"size": _grid(BIG)}),
    "new_full": (lambda x: x.new_full((2, 3), 2.0).sum(), "new_full.default", {"size": _grid(BIG)}),
    "new_empty": (lambda x: x.new_empty((2, 3)).fill_(1.0).sum(), "new_empty.default", {"size": _grid(BIG)}),
    "arange": (lambda x: torch.arange(6).sum(), "arange.default", {"end": {"as_int": 1 << 36}}),
    "arange-step": (lambda x: torch.arange(1, 7, 2).sum(), "arange.start_step", {"end": {"as_int": 1 << 36}}),
    "linspace": (lambda x: torch.linspace(0, 1, 6).sum(), "linspace.default", {"steps": {"as_int": 1 << 34}}),
    "eye": (lambda x: torch.eye(3).sum(), "eye.default", {"n": {"as_int": BIG * 2}}),
    "tril_indices": (
        lambda x: torch.tril_indices(3, 3).sum(),
        "tril_indices.default",
        {"row": {"as_int": BIG * 2}, "col": {"as_int": BIG * 2}},
    ),
    "one_hot": (lambda x: F.one_hot(torch.arange(3), 4).sum(), "one_hot.default", {"num_classes": {"as_int": 1 << 32}}),
    # views made real, repeats
    "expand-clone": (
        lambda x: x[:1, :1, :1, :1].expand(1, 1, 2, 3).clone().sum(),
        "expand.default",
        {"size": {"as_ints": [1, 1, BIG, BIG]}},
    ),
    "as_strided-clone": (
        lambda x: x.as_strided((2, 3), (1, 1)).clone().sum(),
        "as_strided.default",
        {"size": _grid(BIG), "stride": {"as_ints": [0, 0]}},
    ),
    "repeat": (lambda x: x.repeat(1, 1, 2, 2).sum(), "repeat.default", {"repeats": {"as_ints": [1, 1, 4096, 4096]}}),
    "repeat_interleave": (
        lambda x: x.repeat_interleave(2, dim=3).sum(),
        "repeat_interleave.self_int",
        {"repeats": {"as_int": 1 << 30}},
    ),
    "diag_embed": (
        lambda x: torch.diag_embed(x[0, 0, 0], offset=1).sum(),
        "diag_embed.default",
        {"offset": {"as_int": BIG}},
    ),
    # output sizes
    "upsample-nearest": (
        lambda x: F.interpolate(x, scale_factor=2.0).sum(),
        "upsample_nearest2d.vec",
        {"scale_factors": {"as_floats": [4096.0, 4096.0]}},
    ),
    "upsample-bilinear": (
        lambda x: F.interpolate(x, size=(16, 16), mode="bilinear").sum(),
        "upsample_bilinear2d.vec",
        {"output_size": _grid(BIG)},
    ),
    "adaptive_avg_pool": (
        lambda x: F.adaptive_avg_pool2d(x, (2, 2)).sum(),
        "adaptive_avg_pool2d.default",
        {"output_size": _grid(BIG)},
    ),
    "col2im": (  # cannot make more than its input holds: the patched size is inconsistent with it
        lambda x: F.fold(x.reshape(2, 12, 16), (5, 5), 2).sum(),
        "col2im.default",
        {"output_size": _grid(BIG)},
    ),
    "max_unpool": (
        lambda x: F.max_unpool2d(*F.max_pool2d(x, 2, return_indices=True), 2).sum(),
        "max_unpool2d.default",
        {"output_size": _grid(BIG)},
    ),
    # pads and strides
    "pad-constant": (lambda x: F.pad(x, (1, 1, 1, 1)).sum(), "pad.default", {"pad": {"as_ints": [30000] * 4}}),
    "pad-replicate": (
        lambda x: F.pad(x, (1, 1, 1, 1), mode="replicate").sum(),
        "pad.default",
        {"pad": {"as_ints": [30000] * 4}},
    ),
    "im2col-padding": (lambda x: F.unfold(x, 2).sum(), "im2col.default", {"padding": _grid(30000)}),
    "conv-padding": (None, "conv2d.default", {"padding": _grid(30000)}),
    "conv_transpose-stride": (
        lambda x: F.conv_transpose2d(x, torch.ones(3, 2, 2, 2), stride=2).sum(),
        "conv_transpose2d.input",
        {"stride": _grid(30000)},
    ),
    # random creation ops
    "rand": (lambda x: torch.rand(2, 3).sum() * 0, "rand.default", {"size": _grid(BIG)}),
    "randn": (lambda x: torch.randn(2, 3).sum() * 0, "randn.default", {"size": _grid(BIG)}),
    "randint": (lambda x: torch.randint(0, 5, (2, 3)).sum() * 0, "randint.low", {"size": _grid(BIG)}),
    "randperm": (lambda x: torch.randperm(6).sum() * 0, "randperm.default", {"n": {"as_int": 1 << 34}}),
    "normal": (lambda x: torch.normal(0.0, 1.0, (2, 3)).sum() * 0, "normal.float_float", {"size": _grid(BIG)}),
    "logspace": (lambda x: torch.logspace(0, 1, 6).sum(), "logspace.default", {"steps": {"as_int": 1 << 34}}),
    "triu_indices": (
        lambda x: torch.triu_indices(3, 3).sum(),
        "triu_indices.default",
        {"row": {"as_int": BIG * 2}, "col": {"as_int": BIG * 2}},
    ),
    "new_empty_strided": (
        lambda x: x.new_empty_strided((2, 3), (3, 1)).fill_(1.0).sum(),
        "new_empty_strided.default",
        {"size": _grid(BIG), "stride": {"as_ints": [BIG, 1]}},
    ),
    "empty_permuted": (
        lambda x: torch.empty_permuted((2, 3), (0, 1)).fill_(1.0).sum(),
        "empty_permuted.default",
        {"size": _grid(BIG)},
    ),
    # backward ops that build a tensor of the input's sizes around a small gradient
    "slice_backward": (
        lambda x: torch.ops.aten.slice_backward(x[0, 0], [8, 16], 1, 0, 8, 1).sum(),
        "slice_backward.default",
        {"input_sizes": {"as_ints": [8, 1 << 31]}},
    ),
    "select_backward": (
        lambda x: torch.ops.aten.select_backward(x[0, 0, 0], [3, 8], 0, 0).sum(),
        "select_backward.default",
        {"input_sizes": {"as_ints": [1 << 31, 8]}},
    ),
    "diagonal_backward": (
        lambda x: torch.ops.aten.diagonal_backward(x[0, 0, 0], [8, 8], 0, 0, 1).sum(),
        "diagonal_backward.default",
        {"input_sizes": {"as_ints": [8, 1 << 31]}},
    ),
    "affine_grid": (
        lambda x: F.affine_grid(x[:1, :2, :3, 0], [1, 1, 4, 4], align_corners=False).sum(),
        "affine_grid_generator.default",
        {"size": {"as_ints": [1, 1, BIG, BIG]}},
    ),
    "upsample-bicubic": (
        lambda x: F.interpolate(x, size=(16, 16), mode="bicubic").sum(),
        "upsample_bicubic2d.vec",
        {"output_size": _grid(BIG)},
    ),
    "upsample-antialias": (
        lambda x: F.interpolate(x, size=(4, 4), mode="bilinear", antialias=True).sum(),
        "_upsample_bilinear2d_aa.vec",
        {"output_size": _grid(BIG)},
    ),
    "adaptive_max_pool": (
        lambda x: F.adaptive_max_pool2d(x, (2, 2)).sum(),
        "adaptive_max_pool2d.default",
        {"output_size": _grid(BIG)},
    ),
    "fft-n": (lambda x: torch.fft.rfft(x, n=16).abs().sum(), "fft_rfft.default", {"n": {"as_int": 1 << 34}}),
    # attention: q, k and v of [1, 1, 65536, 64] (the scores alone would be 16 GiB)
    "attention": (
        lambda x: F.scaled_dot_product_attention(_q(x), _q(x), _q(x)).sum(),
        "expand.default",
        {"size": {"as_ints": [1, 1, BIG, 64]}},
    ),
    # 40 matrix products on [3072, 3072]: the operand's size patched, every product's metadata [2, 2]
    "mm-chain": (_mm_chain, "ones.default", {"size": _grid(3072)}),
}


def _patch(target: str, new: dict):
    def change(doc: dict) -> None:
        hit = 0
        for node in doc["graph_module"]["graph"]["nodes"]:
            if node["target"] != f"torch.ops.aten.{target}":
                continue
            for inp in node["inputs"]:
                if inp["name"] in new:
                    inp["arg"] = new[inp["name"]]
                    hit += 1
        assert hit, f"no argument of {target} to patch"

    return change


def honest_program(d: Path, name: str) -> Path:
    extra, _, _ = LIES[name]
    conv = nn.Conv2d(3, 4, 3, padding=1) if name == "conv-padding" else None
    return c.export(d / f"{name}-honest.pt2", w._Extra(extra, conv), (w.X,))


def lying_program(d: Path, name: str) -> Path:
    """The honest program of ``name`` with its op's size argument patched, its metadata kept."""
    _, target, new = LIES[name]
    return c.edit_program(honest_program(d, name), d / f"{name}.pt2", _patch(target, new))


def smaller_lie(d: Path) -> Path:
    """Metadata that states *more* than the op computes: ``zeros`` asked for [1, 3], stated [2, 3]."""
    return c.edit_program(honest_program(d, "zeros"), d / "smaller.pt2", _patch("zeros.default", {"size": _grid(1)}))


# ----------------------------------------------------------------------------- ONNX


def onnx_lie(d: Path, name: str) -> Path:
    """ONNX files whose stated shapes are small while their ops make large values."""
    m = c.onnx_conv_bn()
    g = m.graph
    if name == "value-info":  # a Conv with pads of 30000: value_info and the output say [1, 4, 6, 6]
        g.node[0].attribute.append(helper.make_attribute("pads", [30000] * 4))
        out = g.node[0].output[0]
        g.value_info.append(helper.make_tensor_value_info(out, TensorProto.FLOAT, [1, 4, 6, 6]))
    elif name == "output-shape":  # Resize by 3000 with constant scales; its output stated [1, 3, 8, 8]
        g.initializer.append(numpy_helper.from_array(np.array([1, 1, 3000, 3000], np.float32), "scales"))
        g.node.append(helper.make_node("Resize", ["X", "", "scales"], ["big"], name="grow"))
        g.output.append(helper.make_tensor_value_info("big", TensorProto.FLOAT, [1, 3, 8, 8]))
    elif name == "computed-scales":  # scales computed from the input's data: only the run sizes the Resize
        g.initializer.append(numpy_helper.from_array(np.array([1, 1, 3000, 3000], np.float32), "base"))
        g.initializer.append(numpy_helper.from_array(np.zeros((), np.float32), "zero"))
        g.node.extend(
            [
                helper.make_node("ReduceMean", ["X"], ["level"], name="level", keepdims=0),
                helper.make_node("Mul", ["level", "zero"], ["nothing"], name="nothing"),
                helper.make_node("Add", ["base", "nothing"], ["scales"], name="scales"),
                helper.make_node(
                    "Resize",
                    ["X", "", "scales"],
                    ["big"],
                    name="grow",
                    mode="nearest",
                    coordinate_transformation_mode="asymmetric",
                    nearest_mode="floor",
                ),
            ]
        )
        g.output.append(helper.make_tensor_value_info("big", TensorProto.FLOAT, [1, 3, 8, 8]))
    return c.save_onnx(m, d / f"{name}.onnx")


class ComputedByProducts(nn.Module):
    """Honest metadata: the conv weight computed from a 1x1 parameter through 40 products on [3072, 3072]
    (constant evaluation in fold / check, the audit's own run)."""

    def __init__(self):
        super().__init__()
        self.p = nn.Parameter(torch.ones(1, 1))
        self.bn = nn.BatchNorm2d(4)

    def forward(self, x):
        a = self.p.expand(3072, 3072)
        for _ in range(40):
            a = a @ a
        return self.bn(F.conv2d(x, a[:4, :27].reshape(4, 3, 3, 3)))


def attention_honest(d: Path) -> Path:
    """Honest metadata: attention of q, k, v of [1, 1, 65536, 64] (4 x 65536**2 x 64 FLOPs)."""

    def extra(x):
        q = x[:1, :1, :1, :1].expand(1, 1, BIG, 64)
        return F.scaled_dot_product_attention(q, q, q).sum()

    return c.export(d / "attention-honest.pt2", w._Extra(extra), (w.X,))


def data_sized_lie(d: Path) -> Path:
    """``repeat_interleave`` by a tensor of repeats filled with 2**34 (patched; the fill's metadata keeps
    its shape [3]): a size that only the data tells, and no meta kernel (192 GiB)."""

    def extra(x):
        return x.flatten()[:3].repeat_interleave(torch.full((3,), 2)).sum()

    honest = c.export(d / "data-sized-honest.pt2", w._Extra(extra), (w.X,))
    return c.edit_program(honest, d / "data-sized.pt2", _patch("full.default", {"fill_value": {"as_int": 1 << 34}}))
