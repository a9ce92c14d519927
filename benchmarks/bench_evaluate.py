"""Benchmark: the shared evaluator's cost per plan in each pipeline_time form, and the
discrete-event simulation it records beside the closed form.

    python benchmarks/bench_evaluate.py
Prints one line per plan: model, devices, p, m, milliseconds per evaluation in the paper,
critical_path and simulated forms, and the closed-form gap to the simulation.
"""

from __future__ import annotations

import time
from dataclasses import replace

from baselines.manual import uniform_cuts
from nest.problem.evaluate import evaluate, make_problem
from nest.graph.layer_graph import Variant
from nest.problem.space import make_plan

POINTS = [  # model, cluster, devices, variant, p, d
    ("llama2_7b", "tpuv4_fattree", 64, Variant(), 8, 8),
    ("gpt3_175b", "h100_spineleaf", 128, Variant(4, True), 8, 4),
    ("llama3_70b", "tpuv4_fattree", 1024, Variant(), 80, 12),
    ("gpt3_175b", "dgx_h100_superpod", 1024, Variant(8, True), 32, 4),
]


def timed(plan, pr, reps: int = 3) -> tuple[float, float]:
    best, ev = float("inf"), None
    for _ in range(reps):
        t0 = time.perf_counter()
        ev = evaluate(plan, pr)
        best = min(best, time.perf_counter() - t0)
    return best * 1e3, ev.time_per_batch_s


def main() -> None:
    print("model        cluster            N     p     m   paper_ms  critical_ms  simulated_ms"
          "  paper/sim-1")
    for model, cluster, n, v, p, d in POINTS:
        pr = make_problem(model, cluster, n)
        L = pr.graph.num_layers
        plan = make_plan(pr, "bench", v, p, d, uniform_cuts(L - 2, p), [1] * p,
                         ["selective"] * p, "stage_major")
        res = {}
        for form in ("paper", "critical_path", "simulated"):
            res[form] = timed(plan, replace(pr, training=pr.training.with_(pipeline_time=form)))
        gap = res["paper"][1] / res["simulated"][1] - 1
        print(f"{model:12s} {cluster:18s} {n:5d} {p:5d} {plan.num_microbatches:5d} "
              f"{res['paper'][0]:10.1f} {res['critical_path'][0]:12.1f} "
              f"{res['simulated'][0]:13.1f}  {gap:+.3%}")


if __name__ == "__main__":
    main()
