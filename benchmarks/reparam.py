"""Structural re-parameterization on the graph (issue 21): bnfold's merge against the model's own.

Models built here (timm is not a dependency), random weights, BN statistics from a few train-mode
batches: a MobileOne-s0-shaped and a RepVGG-A0-shaped network, each exported WITHOUT calling its
own ``reparameterize()``.  Three programs per model:

* ``today``  bnfold without the merge rule (every branch's BN folded, identity BNs, convs, adds left);
* ``bnfold`` bnfold as it is (branches merged on the graph);
* ``own``    the model's own ``reparameterize()`` (written in this file, plain torch), then bnfold.

Printed: node counts (call_function nodes, BN, conv, add) of the default IR, eager latency and
XNNPACK (``to_edge_transform_and_lower`` + ``executorch.runtime``) latency, each timed in
alternation (today / bnfold / own, the order reversed every other round) on one thread; ratios are medians of the
per-round ratios against ``own``.  A benchmark prints a table; it asserts nothing.

    PYTHONPATH=src .venv/bin/python benchmarks/reparam.py [--models mobileone_s0,repvgg_a0] [--rounds 30]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn as nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import paired_ratio, quiet  # noqa: E402

# ------------------------------------------------------------------------------------------ models


def _conv_bn(cin, cout, k, stride, groups):
    return nn.Sequential(nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False), nn.BatchNorm2d(cout))


class RepBlock(nn.Module):
    """``act(Σ conv_bn_k(x) + conv_bn_1x1(x) + bn(x))`` with its own ``reparameterize()``."""

    def __init__(self, cin, cout, k, stride, groups, n_conv, scale_branch, act=True):
        super().__init__()
        self.k, self.stride, self.groups = k, stride, groups
        self.convs = nn.ModuleList(_conv_bn(cin, cout, k, stride, groups) for _ in range(n_conv))
        self.scale = _conv_bn(cin, cout, 1, stride, groups) if scale_branch and k > 1 else None
        self.skip = nn.BatchNorm2d(cin) if cin == cout and stride == 1 else None
        self.act = nn.ReLU() if act else nn.Identity()
        self.deploy = None

    def forward(self, x):
        if self.deploy is not None:
            return self.act(self.deploy(x))
        out = 0
        if self.scale is not None:
            out = self.scale(x)
        if self.skip is not None:
            out = out + self.skip(x)
        for conv in self.convs:
            out = out + conv(x)
        return self.act(out)

    @staticmethod
    def _fuse(kernel, bn):
        std = (bn.running_var + bn.eps).sqrt()
        t = (bn.weight / std).reshape(-1, 1, 1, 1)
        return kernel * t, bn.bias - bn.running_mean * bn.weight / std

    @torch.no_grad()
    def reparameterize(self):
        conv0 = self.convs[0][0]
        kernel = torch.zeros_like(conv0.weight)
        bias = torch.zeros(conv0.out_channels)
        for conv, bn in self.convs:
            k, b = self._fuse(conv.weight, bn)
            kernel, bias = kernel + k, bias + b
        p = self.k // 2
        if self.scale is not None:
            k, b = self._fuse(self.scale[0].weight, self.scale[1])
            kernel, bias = kernel + nn.functional.pad(k, [p, p, p, p]), bias + b
        if self.skip is not None:
            per_group = conv0.in_channels // self.groups
            ident = torch.zeros_like(conv0.weight)
            for o in range(conv0.out_channels):
                ident[o, o % per_group, p, p] = 1.0
            k, b = self._fuse(ident, self.skip)
            kernel, bias = kernel + k, bias + b
        deploy = nn.Conv2d(conv0.in_channels, conv0.out_channels, self.k, self.stride, p, groups=self.groups)
        deploy.weight.copy_(kernel)
        deploy.bias.copy_(bias)
        self.deploy = deploy
        del self.convs, self.scale, self.skip
        self.convs, self.scale, self.skip = nn.ModuleList(), None, None


class Net(nn.Module):
    def __init__(self, blocks, channels, classes=1000):
        super().__init__()
        self.blocks = nn.Sequential(*blocks)
        self.head = nn.Linear(channels, classes)

    def forward(self, x):
        return self.head(self.blocks(x).mean((2, 3)))

    def reparameterize(self):
        for m in list(self.modules()):
            if isinstance(m, (RepBlock, RepVGGDW)):
                m.reparameterize()


def mobileone_s0():
    """MobileOne-s0: widths 48/48/128/256/1024, blocks 2/8/10/1, 4 conv branches, depthwise + pointwise."""
    blocks = [RepBlock(3, 48, 3, 2, 1, 4, True)]
    cin = 48
    for cout, n in ((48, 2), (128, 8), (256, 10), (1024, 1)):
        for i in range(n):
            stride = 2 if i == 0 else 1
            blocks.append(RepBlock(cin, cin, 3, stride, cin, 4, True))
            blocks.append(RepBlock(cin, cout, 1, 1, 1, 4, True))
            cin = cout
    return Net(blocks, cin)


def repvgg_a0():
    """RepVGG-A0: widths 48/48/96/192/1280, blocks 1/2/4/14/1; a 3×3 and a 1×1 branch, identity BN."""
    blocks, cin = [], 3
    for cout, n in ((48, 1), (48, 2), (96, 4), (192, 14), (1280, 1)):
        for i in range(n):
            blocks.append(RepBlock(cin, cout, 3, 2 if i == 0 else 1, 1, 1, True))
            cin = cout
    return Net(blocks, cin)


class RepVGGDW(nn.Module):
    """RepViT's token mixer: ``bn(conv_bn_3x3(x) + conv_1x1(x) + x)``, depthwise, with its own ``fuse``."""

    def __init__(self, c):
        super().__init__()
        self.conv = _conv_bn(c, c, 3, 1, c)
        self.conv1 = nn.Conv2d(c, c, 1, groups=c)
        self.bn = nn.BatchNorm2d(c)
        self.deploy = None

    def forward(self, x):
        if self.deploy is not None:
            return self.deploy(x)
        return self.bn(self.conv(x) + self.conv1(x) + x)

    @torch.no_grad()
    def reparameterize(self):
        k, b = RepBlock._fuse(self.conv[0].weight, self.conv[1])
        k = k + nn.functional.pad(self.conv1.weight, [1, 1, 1, 1])
        b = b + self.conv1.bias
        ident = torch.zeros_like(k)
        ident[:, 0, 1, 1] = 1.0
        k, b = k + ident, b
        k, b2 = RepBlock._fuse(k, self.bn)
        b = b * (self.bn.weight / (self.bn.running_var + self.bn.eps).sqrt()) + b2
        deploy = nn.Conv2d(k.shape[0], k.shape[0], 3, 1, 1, groups=k.shape[0])
        deploy.weight.copy_(k)
        deploy.bias.copy_(b)
        self.deploy = deploy
        del self.conv, self.conv1, self.bn


class RepViTBlock(nn.Module):
    """Token mixer (RepVGGDW, or a stride-2 depthwise conv_bn + pointwise conv_bn), then a residual
    channel mixer ``x + conv_bn(gelu(conv_bn(x)))``."""

    def __init__(self, cin, cout, stride):
        super().__init__()
        if stride == 1:
            self.token = RepVGGDW(cin)
        else:
            self.token = nn.Sequential(_conv_bn(cin, cin, 3, 2, cin), _conv_bn(cin, cout, 1, 1, 1))
        self.mix = nn.Sequential(_conv_bn(cout, 2 * cout, 1, 1, 1), nn.GELU(), _conv_bn(2 * cout, cout, 1, 1, 1))

    def forward(self, x):
        x = self.token(x)
        return x + self.mix(x)


def repvit_m0_9():
    """RepViT-M0.9-shaped: stem to 48, widths 48/96/192/384, blocks 2/2/14/2 (stride 2 at each new stage)."""
    blocks = [_conv_bn(3, 24, 3, 2, 1), nn.GELU(), _conv_bn(24, 48, 3, 2, 1)]
    cin = 48
    for cout, n in ((48, 2), (96, 2), (192, 14), (384, 2)):
        for i in range(n):
            stride = 2 if i == 0 and cout != cin else 1
            blocks.append(RepViTBlock(cin, cout, stride))
            cin = cout
    net = Net(blocks, cin)
    return net


MODELS = {"mobileone_s0": mobileone_s0, "repvgg_a0": repvgg_a0, "repvit_m0_9": repvit_m0_9}


def calibrated(make, size, seed=0):
    torch.manual_seed(seed)
    model = make()
    model.train()
    with torch.no_grad():
        for _ in range(3):
            model(torch.randn(4, 3, size, size))
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.2, 0.2)
    return model.eval()


# ------------------------------------------------------------------------------------------ measure


def counts(ep) -> dict:
    from bnfold.torch_export.ops import op_name

    names = [op_name(n.target) for n in ep.graph.nodes if n.op == "call_function"]
    return {
        "nodes": len(names),
        "bn": sum("batch_norm" in n for n in names),
        "conv": sum(n.startswith("conv") for n in names),
        "add": sum(n == "add" for n in names),
    }


def fold_without_merge(ep):
    import bnfold
    from bnfold.engine import driver
    from bnfold.engine.reparam import merge_branches

    saved = driver.RULES
    driver.RULES = tuple(r for r in saved if r is not merge_branches)
    try:
        return bnfold.fold(ep)
    finally:
        driver.RULES = saved


def xnnpack(ep):
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower
    from executorch.runtime import Runtime

    buffer = to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()]).to_executorch().buffer
    program = Runtime.get().load_program(buffer)
    _KEEP.append((buffer, program))  # a method must not outlive its program and buffer
    return program.load_method("forward"), len(buffer)


_KEEP: list = []


def interleaved(calls: dict, rounds: int, warmup: int = 10) -> dict:
    """Each call once per round, the order reversed every other round (what runs first in a round
    meets the cache the previous one left); ``warmup`` rounds first (XNNPACK packs weights on its
    first runs)."""
    for _ in range(warmup):
        for fn in calls.values():
            fn()
    times = {k: [] for k in calls}
    keys = list(calls)
    for r in range(rounds):
        for k in keys if r % 2 == 0 else keys[::-1]:
            t = time.perf_counter()
            calls[k]()
            times[k].append(time.perf_counter() - t)
    return times


def bench(name: str, size: int, rounds: int, runtimes) -> dict:
    import bnfold

    model = calibrated(MODELS[name], size)
    x = torch.randn(1, 3, size, size)
    ep = torch.export.export(model, (x,))
    own_model = copy.deepcopy(model)
    own_model.reparameterize()
    programs = {
        "today": fold_without_merge(ep).model,
        "bnfold": None,
        "own": bnfold.fold(torch.export.export(own_model, (x,))).model,
    }
    t = time.perf_counter()
    result = bnfold.fold(ep)
    fold_s = time.perf_counter() - t
    programs["bnfold"] = result.model
    with torch.no_grad():
        ref = copy.deepcopy(model).double()(x.double())
    row = {"model": name, "fold_s": fold_s, "merged": len(result.report.merged), "counts": {}, "err": {}}
    row["counts"]["exported"] = counts(ep)
    mods = {k: p.module() for k, p in programs.items()}
    with torch.no_grad():
        for k, m in mods.items():
            row["counts"][k] = counts(programs[k])
            row["err"][k] = ((m(x).double() - ref).abs().max() / ref.abs().max()).item()
        if "eager" in runtimes:
            times = interleaved({k: (lambda m=m: m(x)) for k, m in mods.items()}, rounds)
            row["eager_ms"] = {k: statistics.median(v) * 1e3 for k, v in times.items()}
            row["eager_ratio"] = {k: paired_ratio(times[k], times["own"]) for k in times}
    if "xnnpack" in runtimes:
        methods, sizes = {}, {}
        for k, p in programs.items():
            methods[k], sizes[k] = xnnpack(p)
        times = interleaved({k: (lambda m=m: m.execute([x])) for k, m in methods.items()}, rounds)
        row["xnnpack_ms"] = {k: statistics.median(v) * 1e3 for k, v in times.items()}
        row["xnnpack_ratio"] = {k: paired_ratio(times[k], times["own"]) for k in times}
        row["pte_mb"] = {k: v / 2**20 for k, v in sizes.items()}
    return row


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="mobileone_s0,repvgg_a0")
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--runtimes", default="eager,xnnpack")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    quiet()
    torch.set_num_threads(args.threads)
    runtimes = set(args.runtimes.split(","))
    rows = [bench(m, args.size, args.rounds, runtimes) for m in args.models.split(",")]
    print(
        f"input 1x3x{args.size}x{args.size}, {args.threads} thread(s), {args.rounds} interleaved rounds; "
        f"torch {torch.__version__}"
    )
    head = f"{'model':<14} {'program':<8} {'nodes':>6} {'BN':>4} {'conv':>5} {'add':>4} {'rel.err':>8}"
    head += "".join(f" {r + ' ms':>11} {r + '/own':>11}" for r in ("eager", "xnnpack") if r in runtimes)
    head += f" {'.pte MB':>8}" if "xnnpack" in runtimes else ""
    print(head)
    print("-" * len(head))
    for row in rows:
        c = row["counts"]["exported"]
        print(f"{row['model']:<14} {'exported':<8} {c['nodes']:>6} {c['bn']:>4} {c['conv']:>5} {c['add']:>4}")
        for k in ("today", "bnfold", "own"):
            c = row["counts"][k]
            line = f"{'':<14} {k:<8} {c['nodes']:>6} {c['bn']:>4} {c['conv']:>5} {c['add']:>4} {row['err'][k]:>8.1e}"
            for r in ("eager", "xnnpack"):
                if r in runtimes:
                    line += f" {row[r + '_ms'][k]:>11.3f} {row[r + '_ratio'][k]:>10.3f}x"
            if "xnnpack" in runtimes:
                line += f" {row['pte_mb'][k]:>8.2f}"
            print(line)
        print(f"{'':<14} bnfold merged {row['merged']} sums in {row['fold_s']:.2f} s")


if __name__ == "__main__":
    main()
