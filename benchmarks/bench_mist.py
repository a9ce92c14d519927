"""Benchmark: Mist-style planner search time on the Figure 5 points, its plans scored by the shared
evaluator next to NEST's and Manual's.

    .venv/bin/python benchmarks/bench_mist.py                 # all 25 points (NEST and Manual too)
    .venv/bin/python benchmarks/bench_mist.py --mist-only     # only Mist's search times
    .venv/bin/python benchmarks/bench_mist.py --cluster h100_spineleaf --sizes 128,1024 \
        --models bert_large,llama2_7b,llama3_70b,gpt3_35b      # the paper's Mist comparison (5.3)
Prints one line per point: model, devices, Mist's solve seconds, its time per batch, NEST's and
Manual's time per batch (evaluator), Mist / NEST, and Mist's plan.
"""

from __future__ import annotations

import argparse
import math

from nest.problem.evaluate import make_problem
from nest.planners.registry import run_planner

MODELS = ("bert_large", "llama2_7b", "llama3_70b", "gpt3_175b", "mixtral_8x7b")
SIZES = (64, 128, 256, 512, 1024)


def t_of(out) -> float | None:
    ev = out.evaluation
    return ev.time_per_batch_s if ev is not None and ev.feasible else None


def fmt(x: float | None) -> str:
    return f"{x:9.4g}" if x is not None else "        -"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mist-only", action="store_true")
    ap.add_argument("--cluster", default="tpuv4_fattree")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--sizes", default=",".join(map(str, SIZES)))
    a = ap.parse_args()
    print(f"{'model':14s} {'N':>5s} {'solve_s':>8s} {'mist_T_s':>9s} {'nest_T_s':>9s} "
          f"{'manual_T_s':>10s} {'mist/nest':>9s}  plan", flush=True)
    worst_solve, worst_ratio = 0.0, None
    for model in a.models.split(","):
        for n in map(int, a.sizes.split(",")):
            pr = make_problem(model, a.cluster, n)
            mist = run_planner("mist", pr)
            worst_solve = max(worst_solve, mist.solve_time_s)
            tm = t_of(mist)
            tn = tma = None
            if not a.mist_only:
                tn, tma = t_of(run_planner("nest", pr)), t_of(run_planner("manual", pr))
            p = mist.plan
            desc = (f"p={p.pp} d={p.dp} {p.variant_key} zero={sorted({s.zero_stage for s in p.stages})}"
                    f" rec={sorted({s.recompute for s in p.stages})} [{p.notes}]" if p
                    else mist.reason)
            ratio = f"{tm / tn:9.3f}" if tm and tn else "        -"
            if tm and tn:
                worst_ratio = min(worst_ratio or math.inf, tm / tn)
            print(f"{model:14s} {n:5d} {mist.solve_time_s:8.2f} {fmt(tm)} {fmt(tn)} {fmt(tma):>10s} "
                  f"{ratio}  {desc}", flush=True)
    print(f"slowest Mist solve: {worst_solve:.2f} s")
    if worst_ratio is not None:
        flag = "  <-- Mist beats NEST: a bug" if worst_ratio < 1 - 1e-12 else ""
        print(f"least Mist / NEST time ratio: {worst_ratio!r}{flag}")


if __name__ == "__main__":
    main()
