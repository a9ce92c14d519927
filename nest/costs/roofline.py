"""Layer graph x hardware -> per-layer compute times (analytical roofline): the cost table.

Per operator (Williams, Waterman & Patterson 2009, "Roofline"):
    time = max(FLOPs / (peak * efficiency), bytes / (HBM bandwidth * memory_efficiency)) + overhead
Matmul efficiency grows with the size of one GEMM and saturates (small GEMMs under-fill the
tensor cores / MXUs): eff(F) = matmul_efficiency * F / (F + F_half), F_half from the hardware file.
Attention runs at `attention_efficiency`; elementwise/norm operators are bandwidth-bound.
A hardware file that names measured profiles (`profile:`, e.g. H100) prices operators from them
instead (nest.costs.profiled), with this roofline as the fallback for shapes not measured.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from nest.graph.layer_graph import RECOMPUTE_MODES, LayerCost, LayerGraph, Op
from nest.specs import HardwareSpec, validate

if TYPE_CHECKING:
    from nest.costs.profiled import ProfileSet

SCHEMA = "nest.cost_table/v1"
AUTO = "auto"  # CostTable(profile=AUTO): the profile the hardware file names, if any


def _compute_time(hw: HardwareSpec, op: Op, flops: float, nbytes: float, kernels: int) -> float:
    if op.kind == "matmul":
        per_gemm = flops / max(kernels, 1)
        eff = hw.matmul_efficiency * per_gemm / (per_gemm + hw.matmul_half_efficiency_flops)
    elif op.kind == "attention":
        eff = hw.attention_efficiency
    else:
        eff = 1.0
    t_flops = flops / (hw.peak_flops_per_s * eff) if flops > 0 else 0.0
    t_bytes = nbytes / (hw.hbm_bytes_per_s * hw.memory_efficiency)
    return max(t_flops, t_bytes) + kernels * hw.kernel_overhead_s


def op_times(hw: HardwareSpec, op: Op) -> tuple[float, float]:
    """(forward, backward) seconds of all `count` instances of one operator."""
    fwd = _compute_time(hw, op, op.fwd_flops, op.fwd_bytes, 1)
    bwd_kernels = 2 if op.kind in ("matmul", "attention") else 1  # dX and dW GEMMs
    bwd = _compute_time(hw, op, op.bwd_flops, op.bwd_bytes, bwd_kernels)
    return fwd * op.count, bwd * op.count


@dataclass(frozen=True)
class LayerTimes:
    fwd_s: float
    bwd_s: float
    recompute_s: dict[str, float]  # mode -> forward time re-run during backward
    source: str = "roofline"  # "profile" when any operator came from a measured profile
    # op name -> "profile" | "roofline" | "mixed" (forward and backward from different sources)
    op_sources: dict[str, str] = field(default_factory=dict)


def layer_times(hw: HardwareSpec, cost: LayerCost,
                profile: ProfileSet | None = None) -> LayerTimes:
    """Forward, backward and recompute seconds of one layer; from `profile` where it covers."""
    if profile is None:
        per_op = {op.name: op_times(hw, op) for op in cost.ops}
        srcs = {op.name: "roofline" for op in cost.ops}
    else:
        from nest.costs.profiled import price_op

        priced = {op.name: price_op(hw, op, profile) for op in cost.ops}
        per_op = {name: (t.fwd_s, t.bwd_s) for name, t in priced.items()}
        srcs = {name: t.fwd_source if t.fwd_source == t.bwd_source else "mixed"
                for name, t in priced.items()}
    fwd = sum(f for f, _ in per_op.values())
    bwd = sum(b for _, b in per_op.values())
    rec = {mode: sum(per_op[name][0] for name in cost.recompute_ops.get(mode, ()))
           for mode in RECOMPUTE_MODES}
    source = "roofline" if all(s == "roofline" for s in srcs.values()) else "profile"
    return LayerTimes(fwd, bwd, rec, source, srcs)


class CostTable:
    """Cached per-(layer cost, hardware) times; identical blocks share one entry.

    profile: AUTO (default) uses the measured profile the hardware file names (`profile:` key;
    H100 SXM has one), None forces the roofline, or an explicit nest.costs.profiled.ProfileSet.
    """

    def __init__(self, graph: LayerGraph, hw: HardwareSpec,
                 profile: ProfileSet | None | str = AUTO):
        self.graph, self.hw = graph, hw
        if isinstance(profile, str):
            if profile != AUTO:
                raise ValueError(f"CostTable: profile must be a ProfileSet, None or {AUTO!r}")
            from nest.costs.profiled import profile_for

            profile = profile_for(hw)
        self.profile = profile
        self._cache: dict[int, LayerTimes] = {}

    def times(self, layer_index: int, variant_key: str) -> LayerTimes:
        cost = self.graph.layers[layer_index].costs[variant_key]
        key = id(cost)
        if key not in self._cache:
            self._cache[key] = layer_times(self.hw, cost, self.profile)
        return self._cache[key]

    def to_dict(self) -> dict:
        rows = []
        for la in self.graph.layers:
            for v in self.graph.variants:
                t = self.times(la.index, v.key)
                rows.append({"layer": la.index, "name": la.name, "variant": v.key,
                             "fwd_s": t.fwd_s, "bwd_s": t.bwd_s, "recompute_s": t.recompute_s,
                             "source": t.source, "op_sources": t.op_sources})
        return {"schema": SCHEMA, "model": self.graph.model, "mbs": self.graph.mbs,
                "hardware": self.hw.name, "rows": rows}

    def write(self, path: str | Path) -> None:
        d = self.to_dict()
        validate(d, "cost_table", str(path))
        Path(path).write_text(json.dumps(d, indent=1, sort_keys=True) + "\n")
