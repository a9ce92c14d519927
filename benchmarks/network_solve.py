"""Benchmark: NEST's solve time per point of the current-networks experiment (issue 27, item 5).

    python benchmarks/network_solve.py                      # every point of config/current_clusters.yaml
    python benchmarks/network_solve.py --figure current_nvl72 --models gpt3_175b --sizes 16128
    python benchmarks/network_solve.py --planner nest_flat_network
    python benchmarks/network_solve.py --point dragonfly_h100_graph:gpt3_175b:288   # any point
    python benchmarks/network_solve.py --dump before.jsonl  # then, on other code:
    python benchmarks/network_solve.py --compare before.jsonl   # exit 1 unless every plan is identical

One line per point: cluster, model, devices, the planner's wall and CPU seconds of the solve
(graph and cost table built before the clock starts, as the pipeline's plan rule receives them),
the joint bounds computed (nest.solver.bounds.joint_bound: the per-candidate bound that prices
every stage position of every placement with the stage kernel), the candidates visited of those
enumerated, and the plan. The issue's target: at most 5 s per point on two cores. --dump writes
each point's plan (every field but its solve time, notes included) and its evaluation as
digests; --compare checks them against a dump made by other code (the script needs only the
planner registry, so it runs against an older tree with PYTHONPATH pointing there).

Measured on 2026-11-27 (seventh session; CPU seconds of the solve, time.process_time, one run
each, run one after the other on the shared 2-core machine at a load of 3.5-4; before: main
3cbbd2e, hnet: this code, + hsolve: this code with the NumPy bottleneck DP of branch hsolve,
bc1c8f9, applied; every plan, evaluation and note identical before and after, --compare,
24 of 24):

    cluster                 model         devices  before  hnet  + hsolve  joint bounds
    dgx_h100_rail_superpod  llama3_405b      1024     1.9   1.4     0.8        9
    dgx_h100_rail_superpod  llama3_405b      4096     1.6   1.2     1.0        8
    dgx_h100_rail_superpod  llama3_405b     16384     2.6   1.8     1.6        9
    dgx_h100_rail_superpod  deepseek_v3      1024     1.2   0.8     0.5        8
    dgx_h100_rail_superpod  deepseek_v3      4096     1.4   0.8     1.0       24
    dgx_h100_rail_superpod  deepseek_v3     16384     1.5   0.7     0.7       33
    dgx_h100_rail_superpod  gpt3_175b        1024     1.3   0.8     0.5        4
    dgx_h100_rail_superpod  gpt3_175b        4096     1.2   0.9     0.8        9
    dgx_h100_rail_superpod  gpt3_175b       16384     3.0   1.6     1.9       18
    gb200_nvl72             llama3_405b      1152     0.7   0.4     0.5        2
    gb200_nvl72             llama3_405b      4608     1.2   0.7     1.0        5
    gb200_nvl72             llama3_405b     16128     1.4   0.7     0.9        3
    gb200_nvl72             deepseek_v3      1152     2.4   0.9     0.9       53
    gb200_nvl72             deepseek_v3      4608     4.6   1.8     2.3       92
    gb200_nvl72             deepseek_v3     16128    11.4   4.2     4.7      189
    gb200_nvl72             gpt3_175b        1152     0.9   0.7     0.7        6
    gb200_nvl72             gpt3_175b        4608     5.1   3.8     4.1       16
    gb200_nvl72             gpt3_175b       16128     5.2   5.0     5.1       42
    tpuv4_torus             llama3_405b      1024     1.0   0.9     1.1        5
    tpuv4_torus             llama3_405b      4096     1.1   1.1     1.2        6
    tpuv4_torus             deepseek_v3      1024     0.9   0.8     0.7       24
    tpuv4_torus             deepseek_v3      4096     0.3   0.2     0.2        6
    tpuv4_torus             gpt3_175b        1024     0.6   0.6     0.6        5
    tpuv4_torus             gpt3_175b        4096     0.7   0.7     0.7        8

The merged code of that session (the lead kept the JAX bottleneck kernel: "+ hsolve" without
its NumPy DP, with hsolve's other changes), all 24 points, one run, the machine otherwise idle,
CPU s: every point at most 4.5 (GB200 NVL72 GPT-3 4,608 4.5, 16,128 4.2; DeepSeek-V3 16,128
3.6, 4,608 1.6; the H100 rail SuperPOD 0.5-1.5; the TPU v4 torus 0.1-1.0). Under the load
above: the 5 s target is not met with margin: GPT-3 on 16,128 NVL72 GPUs is at 5.0-5.1 s and GPT-3 on
4,608 at 3.8-4.1 s; run to run the same code varies by up to 1.5x on this machine (an
interleaved run at a load of 4.5-7.5 gave DeepSeek-V3 16,128 8.0 and 11.9 s before, 4.5-6.5 s
after). Where GPT-3 16,128 goes now (+ hsolve, CPU timers): joint bound 2.0 s (42 bounds: cell
pricing 0.75, priced_alike keys 0.34, new grids 0.32), the exact solves of the 6 visited
candidates 1.4 s plus their stage arrays 0.85 s, the memory-aware bound 0.7 s. What changed
(docs/networks.md, "Solve time per point"), all exact: collective lines priced per batch of
groups (nest.network.collectives.coefficients_rows; tests/test_lines_rows.py against the
one-group code), priced_alike keys as bytes, each position's cells gathered from its own grids,
stash capacities from per-mode uint8 rows, a later placement priced only below the best so far,
the exact solves' stage arrays written in place.

Earlier figures (main 0043b6b -> the fifth session's code, a load of 7-9; GPT-3 on 16,128 NVL72
GPUs 13.2 -> 4.2 s in one run, 6.5-7.5 s when re-measured, DeepSeek-V3 8.5 s) are in the
history of this file and of docs/networks.md.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time

import yaml

import nest.solver as solver
from nest.planners.registry import run_planner
from nest.problem.problem import make_problem
from nest.spec.settings import load_training
from nest.spec.catalog import catalog_names


def record(out) -> dict:
    """The point's plan (every field but solve_time_s) and evaluation, as digests of their JSON."""
    def digest(d) -> str:
        return hashlib.sha256(json.dumps(d, sort_keys=True, default=repr).encode()).hexdigest()

    if out.plan is None:
        return {"plan": None, "reason": out.reason}
    plan = {k: v for k, v in out.plan.to_dict().items() if k != "solve_time_s"}
    return {"plan": digest(plan), "evaluation": digest(out.evaluation.to_dict()),
            "time_per_batch_s": repr(out.evaluation.time_per_batch_s),
            "notes": out.plan.notes}


def one(model: str, cluster: str, n: int, global_batch: int, planner: str) -> dict:
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
    return {"point": f"{cluster}:{model}:{n}", "planner": planner, **record(out)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="config/current_clusters.yaml")
    ap.add_argument("--figure", action="append", help="figures of the config (default: all)")
    ap.add_argument("--models", nargs="*")
    ap.add_argument("--sizes", nargs="*", type=int)
    ap.add_argument("--planner", default="nest")
    ap.add_argument("--point", action="append", default=[],
                    help="CLUSTER:MODEL:DEVICES, run instead of the config's figures")
    ap.add_argument("--global-batch", type=int, default=4096, help="for --point")
    ap.add_argument("--dump", help="write each point's plan record here (JSON lines)")
    ap.add_argument("--compare", help="a --dump file: exit 1 unless every plan is identical")
    a = ap.parse_args()
    points = [(c, m, int(n), a.global_batch) for c, m, n in (x.split(":") for x in a.point)]
    if not points:
        cfg = yaml.safe_load(open(a.config))
        known = set(catalog_names("models"))
        for name in a.figure or cfg["run"]:
            f = cfg["figures"][name]
            for cluster in f["clusters"]:
                for model in a.models or f["models"]:
                    if model not in known:
                        print(f"{cluster:24s} {model:12s} skipped: not in config/models")
                        continue
                    points += [(cluster, model, n, f.get("global_batch", 4096))
                               for n in a.sizes or f["num_devices"]]
    records = [one(model, cluster, n, gb, a.planner) for cluster, model, n, gb in points]
    if a.dump:
        with open(a.dump, "w") as fh:
            fh.writelines(json.dumps(r, sort_keys=True) + "\n" for r in records)
    if a.compare:
        before = {(r["point"], r["planner"]): r for r in map(json.loads, open(a.compare))}
        differ = [r["point"] for r in records if before.get((r["point"], r["planner"])) != r]
        print(f"compared with {a.compare}: {len(records) - len(differ)} of {len(records)} "
              f"plans identical" + (f"; differ: {', '.join(differ)}" if differ else ""))
        raise SystemExit(1 if differ else 0)


if __name__ == "__main__":
    main()
