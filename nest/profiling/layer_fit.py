"""Published per-layer times -> the memory-bound operators' HBM efficiency (a disclosed calibration).

A component table (one layer's forward and backward time; Korthikanti et al. 2022, Table 4, for
the 22B layer on A100: profiles/a100_sxm/published_layer_times.csv) is priced term by term as the
stage kernel prices a layer: nest.costs.table.layer_times (operators, recomputed forward) plus the
layer's tensor-parallel collectives (nest.costs.groups.group_terms) on one node. `fit_elementwise`
finds the one share of the HBM bandwidth the memory-bound operators reach (hardware file
`elementwise_efficiency`) that minimises the squared log error over every forward and backward
time of the table, on a 0.01 grid; GEMMs keep their curve fitted to published GEMM benchmarks and
nothing else moves. The end-to-end rows of config/validation/published_runs.yaml stay out of
sample. What the fitted share absorbs besides bandwidth: the kernels 2022 Megatron-LM ran that
the layer graph does not list (bias adds and bias-gradient reductions of the linear layers, the
attention permute / contiguous copies, dropout's random-number generation).
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, replace

import numpy as np

from nest.spec.catalog import HardwareSpec, config_dir

GRID = np.round(np.arange(0.30, 1.0001, 0.01), 2)


@dataclass(frozen=True)
class LayerRow:
    experiment: str
    model: str
    tp: int
    mbs: int
    sp: bool
    recompute: str
    fwd_s: float
    bwd_s: float
    source: str


def published_layer_times(hardware: str = "a100_sxm") -> list[LayerRow]:
    path = config_dir().parent / "profiles" / hardware / "published_layer_times.csv"
    with open(path) as f:
        rows = list(csv.DictReader(line for line in f if not line.startswith("#")))
    return [LayerRow(r["experiment"], r["model"], int(r["tp"]), int(r["mbs"]),
                     r["sp"] == "true", r["recompute"], float(r["fwd_ms"]) / 1e3,
                     float(r["bwd_ms"]) / 1e3, r["source"]) for r in rows]


def layer_problem(row: LayerRow, cluster: str):
    """One node of `cluster` running the row's model with tensor parallelism tp, both sp
    variants in the graph."""
    from nest.graph.layer_graph import Variant
    from nest.problem.problem import make_problem
    from nest.spec.settings import load_training

    tr = load_training().with_(global_batch=row.mbs, attention="unfused")
    pr = make_problem(row.model, cluster, row.tp, row.mbs, tr)
    return pr.with_variants([Variant(row.tp, False), Variant(row.tp, True)])


def layer_time_s(problem, row: LayerRow, hw: HardwareSpec | None = None,
                 block: int = 1) -> tuple[float, float]:
    """(forward, backward) seconds of one transformer block as the stage kernel prices it:
    operators (nest.costs.table.layer_times on `hw`, default the cluster's) plus the phase's
    tensor-parallel collectives; the backward adds the recomputed forward (full: with its
    collectives)."""
    from nest.costs.groups import group_terms
    from nest.costs.layers import layer_table
    from nest.costs.table import layer_times
    from nest.graph.layer_graph import Variant

    v = Variant(row.tp, row.sp)
    lt = layer_table(problem, v, ("none", "selective", "full"))
    gt = group_terms(problem, lt, list(range(row.tp)), 1)
    x = gt.cum_LK[block + 1] - gt.cum_LK[block]
    comm_f, comm_b = float(x[gt.fwd_K].sum()), float(x[~gt.fwd_K].sum())
    cost = problem.graph.layers[block].costs[v.key]
    t = layer_times(hw or problem.cluster.hardware, cost)
    fwd = t.fwd_s + comm_f
    bwd = t.bwd_s + comm_b + t.recompute_s[row.recompute] + (
        comm_f if row.recompute == "full" else 0.0)
    return fwd, bwd


def fit_elementwise(rows: list[LayerRow], cluster: str = "dgx_a100") -> tuple[float, float]:
    """(efficiency, rms log error) over every forward and backward time of `rows`."""
    problems = {(r.model, r.tp, r.mbs): layer_problem(r, cluster) for r in rows}
    hw0 = next(iter(problems.values())).cluster.hardware
    best = (math.inf, None)
    for e in GRID:
        hw = replace(hw0, elementwise_efficiency=float(e))
        err = []
        for r in rows:
            f, b = layer_time_s(problems[(r.model, r.tp, r.mbs)], r, hw)
            err += [math.log(f / r.fwd_s), math.log(b / r.bwd_s)]
        sse = float(np.sum(np.square(err)))
        if sse < best[0] - 1e-15:
            best = (sse, float(e), math.sqrt(sse / len(err)))
    return best[1], best[2]
