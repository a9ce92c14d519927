"""Layer graph x hardware -> per-layer compute times: the cost table.

Each operator of a layer is priced by nest.costs.profiled.price_op: from a measured profile (by
default the one the hardware file names) where it covers the shape, else by the analytical
roofline (nest.costs.roofline.op_times). A layer's forward, backward and recompute times are
sums over its operators; CostTable caches them per (layer cost, hardware) for the evaluator.

Imports: roofline <- profiled <- table.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from nest.costs.profiled import ProfileSet, price_op, profile_for
from nest.graph.layer_graph import RECOMPUTE_MODES, LayerCost, LayerGraph
from nest.specs import HardwareSpec, validate

SCHEMA = "nest.cost_table/v1"
AUTO = "auto"  # CostTable(profile=AUTO): the profile the hardware file names, if any


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
    """Forward, backward and recompute seconds of one layer; from `profile` where it covers,
    else (or with profile None) the roofline."""
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
