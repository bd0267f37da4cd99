"""E. Norm affines folded out of transformer blocks: node count and latency, unfolded vs folded.

    .venv/bin/python benchmarks/transformer_block.py [--rounds 30] [--quick] [--out DIR]

Two blocks, random weights with LayerNorm affines that are not identity:
``vit``: pre-norm attention with separate q/k/v projections and a GELU MLP
(the LayerNorm feeds three linears: the fan-out fold); ``encoder``:
``nn.TransformerEncoderLayer(norm_first=True)``.  For each, measured side by
side in one process (interleaved rounds, median), unfolded and folded:

* graph nodes (``call_function``) of the ATen program and the ExecuTorch edge program;
* eager latency of ``ExportedProgram.module()``;
* ExecuTorch + XNNPACK latency of the lowered ``.pte`` (and the ops left outside the delegate).

Prints a table and writes ``transformer_block.{json,md}`` under ``--out`` (default
``benchmarks/results/local``, not tracked).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import RESULTS, log, median, paired_ratio, quiet, table, write_json, write_text  # noqa: E402
from inference_speed import _calls_per_sample, _rel_err, interleaved, lower_xnnpack  # noqa: E402

import bnfold  # noqa: E402


class VitBlock(nn.Module):
    def __init__(self, d: int = 192, heads: int = 3):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.q, self.k, self.v, self.proj = (nn.Linear(d, d) for _ in range(4))
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        b, n, d = x.shape
        h = self.norm1(x)
        q, k, v = (t.view(b, n, self.heads, d // self.heads).transpose(1, 2) for t in (self.q(h), self.k(h), self.v(h)))
        att = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, n, d)
        x = x + self.proj(att)
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


def _blocks() -> dict[str, nn.Module]:
    torch.manual_seed(0)
    blocks = {
        "vit": VitBlock(),
        "encoder": nn.TransformerEncoderLayer(192, 3, 768, dropout=0.0, norm_first=True, batch_first=True),
    }
    for m in blocks.values():
        for norm in (mod for mod in m.modules() if isinstance(mod, nn.LayerNorm)):
            with torch.no_grad():
                norm.weight.uniform_(0.5, 1.5)
                norm.bias.uniform_(-0.5, 0.5)
    return {k: m.eval() for k, m in blocks.items()}


def _nodes(ep) -> int:
    return sum(1 for n in ep.graph.nodes if n.op == "call_function")


def bench(name: str, model: nn.Module, x: torch.Tensor, rounds: int) -> dict:
    from executorch.exir import to_edge
    from executorch.runtime import Runtime

    ep = torch.export.export(model, (x,))
    result = bnfold.fold(ep)
    eps = {"unfolded": ep, "folded": result.model}
    ref = model(x)
    row = {
        "model": name,
        "folded_norms": [f.norm for f in result.report.folded],
        "aten_nodes": {v: _nodes(e) for v, e in eps.items()},
        "edge_nodes": {v: _nodes(to_edge(e).exported_program()) for v, e in eps.items()},
    }
    mods = {v: e.module() for v, e in eps.items()}
    eager = {v: (lambda m=m: m(x)) for v, m in mods.items()}
    k, _ = _calls_per_sample(eager["unfolded"])
    times = interleaved(eager, rounds, k)
    row["eager_ms"] = {v: 1e3 * median(t) for v, t in times.items()}
    row["eager_speedup"] = paired_ratio(times["unfolded"], times["folded"])
    row["eager_rel_err"] = {v: _rel_err(m(x), ref) for v, m in mods.items()}
    rt, keep, methods, lowered = Runtime.get(), [], {}, {}
    for v, e in eps.items():
        buf, lowered[v] = lower_xnnpack(e)
        program = rt.load_program(buf)
        keep += [buf, program]  # the runtime reads the bytes in place
        methods[v] = program.load_method("forward")
    calls = {v: (lambda m=m: m.execute([x])) for v, m in methods.items()}
    k, _ = _calls_per_sample(calls["unfolded"])
    times = interleaved(calls, rounds, k)
    row["xnnpack_ms"] = {v: 1e3 * median(t) for v, t in times.items()}
    row["xnnpack_speedup"] = paired_ratio(times["unfolded"], times["folded"])
    row["xnnpack_outside_delegate"] = {v: info["ops_outside_delegate"] for v, info in lowered.items()}
    row["xnnpack_rel_err"] = {v: _rel_err(m.execute([x]), ref) for v, m in methods.items()}
    return row


def render(rows: list[dict]) -> str:
    head = [
        "block",
        "norms folded",
        "ATen nodes",
        "edge nodes",
        "eager ms",
        "eager speed-up",
        "XNNPACK ms",
        "XNNPACK speed-up",
        "ops outside delegate",
        "max rel err",
    ]
    body = []
    for r in rows:
        pair = lambda d, f="{}": f"{f.format(d['unfolded'])} -> {f.format(d['folded'])}"  # noqa: E731
        err = max(max(r["eager_rel_err"].values()), max(r["xnnpack_rel_err"].values()))
        body.append(
            [
                r["model"],
                len(r["folded_norms"]),
                pair(r["aten_nodes"]),
                pair(r["edge_nodes"]),
                pair(r["eager_ms"], "{:.3f}"),
                f"{r['eager_speedup']:.3f}x",
                pair(r["xnnpack_ms"], "{:.3f}"),
                f"{r['xnnpack_speedup']:.3f}x",
                pair(r["xnnpack_outside_delegate"]),
                f"{err:.1e}",
            ]
        )
    return table(head, body)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--quick", action="store_true", help="3 rounds, a short sequence")
    ap.add_argument("--out", default=str(RESULTS / "local"))
    args = ap.parse_args(argv)
    quiet()
    torch.set_num_threads(1)
    rounds, tokens = (3, 16) if args.quick else (args.rounds, 197)
    t0 = time.perf_counter()
    rows = []
    for name, model in _blocks().items():
        log(f"  {name} ...")
        rows.append(bench(name, model, torch.randn(1, tokens, 192), rounds))
    text = f"### E. Transformer blocks: LayerNorm affines folded ({rounds} rounds, 1 thread, {tokens} tokens)\n\n"
    text += render(rows) + "\n"
    print(text)
    out = os.path.abspath(args.out)
    write_json("transformer_block", {"rows": rows, "seconds": time.perf_counter() - t0}, out_dir=out)
    write_text("transformer_block.md", text, out_dir=out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
