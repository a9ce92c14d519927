"""Eager PyTorch's host time per operator: the floor under a host-bound layer's time.

A layer whose kernels are shorter than the host's time to issue them runs at the host's pace: the
GPU waits for each launch. This measures that pace on the machine it runs on, independently of
any model: chains of N tiny modules (Linear, LayerNorm, GELU, a residual add: 4 module calls and
4 kernels each, on 8 x 64 bf16 tensors, far too small to keep the GPU busy) are timed forward
(with autograd recording, as in training) and forward + backward with CUDA synchronisation only at the ends, for two chain lengths; the
slope (seconds per operator) is the host's time per module call, forward, and per autograd node,
backward (the constant part, synchronisation and the first launch, cancels in the difference).

`python -m nest.profiling.host --out host.json` (no project dependency besides torch).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch
from torch import nn

OPS_PER_UNIT = 4  # Linear, LayerNorm, GELU, residual add


class _Unit(nn.Module):
    def __init__(self, h: int):
        super().__init__()
        self.lin, self.norm, self.act = nn.Linear(h, h), nn.LayerNorm(h), nn.GELU()

    def forward(self, x):
        return x + self.act(self.norm(self.lin(x)))


def _time(fn, device: str, reps: int) -> float:
    """Median wall seconds of fn(), synchronised at both ends."""
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    out = []
    for _ in range(reps):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def measure(device: str | None = None, units=(16, 64), reps: int = 30, h: int = 64) -> dict:
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16
    res = {"device": device, "device_name": torch.cuda.get_device_name(0) if device == "cuda"
           else "cpu", "torch": torch.__version__, "ops_per_unit": OPS_PER_UNIT,
           "shape": [8, h], "dtype": "bfloat16", "units": list(units), "reps": reps}
    fwd, step = {}, {}
    for n in units:
        model = nn.Sequential(*[_Unit(h) for _ in range(n)]).to(device, dtype)
        x = torch.randn(8, h, device=device, dtype=dtype, requires_grad=True)

        def f(model=model, x=x):  # a training forward: autograd records the graph
            model(x)

        def fb(model=model, x=x):
            model(x).sum().backward()

        for _ in range(3):  # warm-up
            f()
            fb()
        fwd[n], step[n] = _time(f, device, reps), _time(fb, device, reps)
    a, b = units[0], units[-1]
    ops = (b - a) * OPS_PER_UNIT
    res["fwd_s"] = {str(k): v for k, v in fwd.items()}
    res["fwd_bwd_s"] = {str(k): v for k, v in step.items()}
    res["host_s_per_op_fwd"] = (fwd[b] - fwd[a]) / ops
    res["host_s_per_op_fwd_bwd"] = (step[b] - step[a]) / ops
    res["host_s_per_op_bwd"] = res["host_s_per_op_fwd_bwd"] - res["host_s_per_op_fwd"]
    return res


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m nest.profiling.host", description=__doc__.split(
        "\n")[0])
    p.add_argument("--out", help="write the result as JSON here")
    a = p.parse_args(argv)
    r = measure()
    print(json.dumps(r, indent=1))
    if a.out:
        with open(a.out, "w") as fh:
            json.dump(r, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
