"""The fp16 range rewrite gives the same report and the same model in every process: an entry's ``nodes`` come in
graph order (not in the order of a set of nodes hashed by object id), and so do the edits."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import bnfold

#: a residual stream of 6 blocks: one entry whose region holds 7 linears and 7 norms' eps adds (14 nodes, whose
#: order changed from run to run before), as a torch program (default IR) and as ONNX.
SCRIPT = """
import hashlib, json, warnings
warnings.simplefilter("ignore")
import bnfold, range_models as rm
out = {}
for name, kwargs in (("residual", {"blocks": 6}),):
    model = rm.build(name, **kwargs)
    calibration = rm.batches(model, 1)
    fx = bnfold.fold(rm.program(model), fp16_range=calibration)
    onnx = bnfold.fold(rm.onnx_model(model), fp16_range=[tuple(x.numpy() for x in b) for b in calibration])
    out[name] = {
        "fx": fx.report.to_dict()["rescaled"],
        "fx_table": fx.report.table(),
        "fx_code": fx.model.graph_module.code,
        "fx_order": [n.name for n in fx.model.graph.nodes],
        "onnx": onnx.report.to_dict()["rescaled"],
        "onnx_table": onnx.report.table(),
        "onnx_bytes": hashlib.sha256(onnx.model.SerializeToString()).hexdigest(),
        "onnx_order": [n.name for n in onnx.model.graph.node],
    }
print(json.dumps(out))
"""


def _start(seed: int) -> subprocess.Popen:
    tests = Path(__file__).parent.parent
    src = str(Path(bnfold.__file__).parent.parent)
    env = {"PYTHONPATH": os.pathsep.join([src, str(tests)]), "PATH": "/usr/bin:/bin", "PYTHONHASHSEED": str(seed)}
    return subprocess.Popen([sys.executable, "-c", SCRIPT], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)


def _result(proc: subprocess.Popen) -> dict:
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err.decode()[-2000:]
    return json.loads(out.decode().splitlines()[-1])


def test_reports_and_models_are_the_same_in_two_processes_and_nodes_come_in_graph_order():
    procs = [_start(0), _start(1)]  # two fresh processes side by side
    first, second = map(_result, procs)
    assert first == second
    for name, got in first.items():
        for fmt in ("fx", "onnx"):
            done = [e for e in got[fmt] if e["factor"] != 1.0]
            assert done, (name, fmt, got[fmt])
            order = {n: i for i, n in enumerate(got[f"{fmt}_order"])}
            for entry in done:
                assert len(entry["nodes"]) >= 3 and set(entry["nodes"]) <= set(order), entry
                assert entry["nodes"] == sorted(entry["nodes"], key=order.__getitem__), entry
