"""Benchmark: NEST's solve time per point of the current-networks experiment (issue 27, item 5).

    python benchmarks/network_solve.py                      # every point of config/current_clusters.yaml
    python benchmarks/network_solve.py --figure current_nvl72 --models gpt3_175b --sizes 16128
    python benchmarks/network_solve.py --planner nest_flat_network

One line per point: cluster, model, devices, the planner's wall and CPU seconds of the solve
(graph and cost table built before the clock starts, as the pipeline's plan rule receives them),
the joint bounds computed (nest.solver.bounds.joint_bound: the per-candidate bound that prices
every stage position of every placement with the stage kernel), the candidates visited of those
enumerated, and the plan. The issue's target: at most 5 s per point on two cores.
"""

from __future__ import annotations

import argparse
import time

import yaml

import nest.solver as solver
from nest.planners.registry import run_planner
from nest.problem.problem import make_problem
from nest.spec.settings import load_training
from nest.spec.catalog import catalog_names


def one(model: str, cluster: str, n: int, global_batch: int, planner: str) -> None:
    tr = load_training().with_(global_batch=global_batch)
    pr = make_problem(model, cluster, n, 1, training=tr)
    calls = [0]
    inner = solver.joint_bound

    def counted(*a, **k):
        calls[0] += 1
        return inner(*a, **k)

    solver.joint_bound = counted
    try:
        t0, c0 = time.perf_counter(), time.process_time()
        out = run_planner(planner, pr)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    finally:
        solver.joint_bound = inner
    p = out.plan
    what = (f"pp={p.pp} dp={p.dp} tp={p.tp} cp={p.cp} ep={p.ep} {p.placement} "
            f"T={out.evaluation.time_per_batch_s:.4g}s [{p.notes.split(';')[-1].strip()}]"
            if p else f"no plan: {out.reason[:70]}")
    print(f"{cluster:24s} {model:12s} N={n:6d} solve={wall:7.1f}s cpu={cpu:7.1f}s "
          f"joint_bounds={calls[0]:4d}  {what}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="config/current_clusters.yaml")
    ap.add_argument("--figure", action="append", help="figures of the config (default: all)")
    ap.add_argument("--models", nargs="*")
    ap.add_argument("--sizes", nargs="*", type=int)
    ap.add_argument("--planner", default="nest")
    a = ap.parse_args()
    cfg = yaml.safe_load(open(a.config))
    known = set(catalog_names("models"))
    for name in a.figure or cfg["run"]:
        f = cfg["figures"][name]
        for cluster in f["clusters"]:
            for model in a.models or f["models"]:
                if model not in known:
                    print(f"{cluster:24s} {model:12s} skipped: not in config/models")
                    continue
                for n in a.sizes or f["num_devices"]:
                    one(model, cluster, n, f.get("global_batch", 4096), a.planner)


if __name__ == "__main__":
    main()
