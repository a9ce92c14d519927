"""Benchmark: NEST solver time and peak memory, one solve per point, full search space.

    python benchmarks/bench_solver.py            # the slowest points + scaling
    python benchmarks/bench_solver.py --figures  # every point of Figures 5 and 7
Each solve runs in its own process (quiet, cold caches). Prints one line per point: model,
devices, layers, solve seconds, peak RSS of that process, plan, T.
"""

from __future__ import annotations

import argparse
import resource
import time
from dataclasses import replace

from nest.problem.evaluate import make_problem
from nest.planners.registry import run_planner


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3


def big_superpod(n: int):
    """dgx_h100_superpod with its spine level widened to n devices (for scaling runs)."""
    from nest.spec.catalog import cluster_from_dict, config_dir, read_yaml

    path = config_dir() / "clusters" / "dgx_h100_superpod.yaml"
    d = read_yaml(path)
    d["levels"][-1]["devices_per_group"] = max(n, d["levels"][-1]["devices_per_group"])
    return cluster_from_dict(d, str(path), n)


def one(model: str, cluster: str, n: int, layers: int | None = None,
        space: dict | None = None) -> None:
    if cluster == "big_superpod":
        pr = make_problem(model, "dgx_h100_superpod", 64).with_cluster(big_superpod(n))
    else:
        pr = make_problem(model, cluster, n)
    if layers:  # a deeper model of the same block: scaling in the number of layers
        from nest.graph.closed_form import build_layer_graph

        model_l = replace(pr.model, num_layers=layers, name=f"{model}_{layers}l")
        pr = pr.with_graph(build_layer_graph(model_l, pr.mbs), model_l)
    if n > pr.cluster.max_devices:
        raise SystemExit(f"{cluster} holds at most {pr.cluster.max_devices}")
    t0, c0 = time.perf_counter(), time.process_time()
    out = run_planner("nest", pr, {"space": space} if space else None)
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    p = out.plan
    desc = (f"p={p.pp} d={p.dp} t={p.tp} sp={int(p.sp)} e={p.ep} c={p.cp} {p.placement} "
            f"T={out.evaluation.time_per_batch_s:.4g}s MFU={out.evaluation.mfu:.1%} "
            f"predicted={p.predicted_time_per_batch_s!r}"
            if p else out.reason[:80])
    print(f"{pr.model.name:16s} N={n:6d} layers={pr.graph.num_layers:4d} solve={dt:7.2f}s cpu={cpu:6.2f}s "
          f"rss={rss_mb():7.0f}MB  {desc}  [{p.notes if p else ''}]", flush=True)


FIGURE_POINTS = [(m, c, n) for c, sizes in (("tpuv4_fattree", (64, 128, 256, 512, 1024)),
                                             ("h100_spineleaf", (128, 1024)))
                 for m in ("bert_large", "llama2_7b", "llama3_70b", "gpt3_175b", "mixtral_8x7b")
                 for n in sizes]


SPACE: dict = {}  # search-space overrides of this run (--heterogeneous, --orders)


def isolated(model: str, cluster: str, n: int, layers: int | None = None) -> None:
    """One solve in a fresh, quiet process (its own peak RSS, no warm caches)."""
    import subprocess
    import sys

    code = (f"import benchmarks.bench_solver as b; b.one({model!r}, {cluster!r}, {n}, "
            f"{layers!r}, {SPACE or None!r})")
    subprocess.run([sys.executable, "-c", code], check=False)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="only the two slowest points")
    ap.add_argument("--figures", action="store_true", help="every point of Figures 5 and 7")
    ap.add_argument("--heterogeneous", action="store_true", help="heterogeneous-stage space")
    ap.add_argument("--orders", action="store_true", help="every launcher rank order")
    a = ap.parse_args()
    if a.heterogeneous:
        SPACE["heterogeneous_stages"] = True
    if a.orders:
        SPACE["placements"] = ["orders"]
    if a.quick:
        isolated("llama3_70b", "h100_spineleaf", 1024)
        isolated("gpt3_175b", "tpuv4_fattree", 1024)
        return
    if a.figures:
        for m, c, n in FIGURE_POINTS:
            isolated(m, c, n)
        return
    isolated("llama3_70b", "h100_spineleaf", 1024)
    isolated("gpt3_175b", "tpuv4_fattree", 1024)
    isolated("llama2_7b", "big_superpod", 16384)  # target: <= 20 s
    isolated("llama2_7b", "tpuv4_fattree", 1024, layers=198)  # a 200-layer model


if __name__ == "__main__":
    main()
