"""nest.graph.meta_cache.without_dynamo: a layer trace runs without importing torch._dynamo,
leaves torch as it found it, and traces what it traces with the real module loaded."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = r"""
import json, sys
import torch
from nest.graph import build_graph, fx_extract, meta_cache
from nest.spec.catalog import load_model

def graph():
    build_graph.cache_clear()
    fx_extract.clear_caches()
    meta_cache._LAYOUTS.clear()
    return build_graph(load_model(sys.argv[1], seq_len=256), 2, "torch_fx").to_dict()

assert "torch._dynamo" not in sys.modules
seen = []
real_disable = meta_cache._DynamoStandIn.disable
def spy(self, fn=None, *a, **k):
    seen.append(fn)
    return real_disable(self, fn, *a, **k)
meta_cache._DynamoStandIn.disable = spy
without = graph()
out = {"loaded_after_trace": "torch._dynamo" in sys.modules,
       "stood_in_for": len(seen),
       "left_on_kernels": sum("__dynamo_disable" in getattr(f, "__dict__", {}) for f in seen)}
import torch._dynamo  # the real module, as torch.compile would load it
out["real"] = hasattr(torch._dynamo, "optimize") and sys.modules["torch._dynamo"] is torch._dynamo
out["same_graph"] = graph() == without
out["kernels_wrapped_by_real"] = sum("__dynamo_disable" in getattr(f, "__dict__", {})
                                     for f in seen)
print(json.dumps(out))
"""


def test_trace_without_dynamo_equals_trace_with_it():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    res = subprocess.run([sys.executable, "-c", SCRIPT, "tiny_moe"], capture_output=True,
                         text=True, cwd=ROOT, env=env, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["stood_in_for"] > 0  # torch's refs asked for torch._dynamo while tracing
    assert not out["loaded_after_trace"]  # ... and did not get it
    assert out["left_on_kernels"] == 0  # torch's kernels as they were
    assert out["real"]
    assert out["same_graph"]
    # with the real module loaded the trace used torch's own wrapping, not the stand-in's
    assert out["kernels_wrapped_by_real"] > 0


def test_stand_in_defers_to_the_real_module_for_anything_else():
    """An attribute other than `disable` loads torch._dynamo and reads it there."""
    script = r"""
import sys, json
import torch
from nest.graph import meta_cache
with meta_cache.without_dynamo():
    stand_in = sys.modules["torch._dynamo"]
    compiling = stand_in.is_compiling()
    real = sys.modules["torch._dynamo"]
print(json.dumps({"stand_in": isinstance(stand_in, meta_cache._DynamoStandIn),
                  "real": not isinstance(real, meta_cache._DynamoStandIn),
                  "kept": sys.modules.get("torch._dynamo") is real, "compiling": compiling}))
"""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         cwd=ROOT, env=env, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out == {"stand_in": True, "real": True, "kept": True, "compiling": False}
