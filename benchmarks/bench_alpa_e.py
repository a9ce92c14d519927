"""Benchmark: Alpa-E search time on Figure 5's points, and its plans against NEST and Manual.

    python benchmarks/bench_alpa_e.py               # the 25 points (5 models x 64..1024 devices)
    python benchmarks/bench_alpa_e.py --no-compare  # Alpa-E only (no NEST / Manual runs)
Prints one line per point: search seconds, the evaluator's time per batch of the Alpa-E plan,
NEST's and Manual's, Alpa-E / NEST, the plan and whether the search was capped.
"""

from __future__ import annotations

import argparse
import time

from nest.problem.evaluate import make_problem
from nest.planners.registry import run_planner

MODELS = ("bert_large", "llama2_7b", "llama3_70b", "gpt3_175b", "mixtral_8x7b")
SIZES = (64, 128, 256, 512, 1024)


def fmt(out) -> str:
    ev = out.evaluation
    return f"{ev.time_per_batch_s:10.4g}" if ev and ev.feasible else f"{'-':>10s}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--no-compare", action="store_true")
    ap.add_argument("--cluster", default="tpuv4_fattree")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--sizes", default=",".join(map(str, SIZES)))
    a = ap.parse_args()
    print(f"{'model':14s} {'N':>5s} {'search_s':>8s} {'alpa_e':>10s} {'nest':>10s} "
          f"{'manual':>10s} {'ratio':>6s}  plan", flush=True)
    worst = 0.0
    for model in a.models.split(","):
        for n in map(int, a.sizes.split(",")):
            pr = make_problem(model, a.cluster, n)
            t0 = time.perf_counter()
            out = run_planner("alpa_e", pr)
            dt = time.perf_counter() - t0
            worst = max(worst, dt)
            nest = manual = None
            if not a.no_compare:
                nest = run_planner("nest", make_problem(model, a.cluster, n))
                manual = run_planner("manual", make_problem(model, a.cluster, n))
            p = out.plan
            ratio = (f"{out.evaluation.time_per_batch_s / nest.evaluation.time_per_batch_s:6.3f}"
                     if nest and p and nest.plan else f"{'-':>6s}")
            desc = (f"p={p.pp} d={p.dp} t={p.tp} sp={int(p.sp)} e={p.ep} c={p.cp} "
                    f"z={sorted({s.zero_stage for s in p.stages})} "
                    f"r={sorted({s.recompute for s in p.stages})}"
                    f"{' BUDGET SPENT' if p.extra.get('budget_exhausted') else ''}"
                    if p else out.reason[:90])
            print(f"{model:14s} {n:5d} {dt:8.2f} {fmt(out)} "
                  f"{fmt(nest) if nest else '-':>10s} {fmt(manual) if manual else '-':>10s} "
                  f"{ratio}  {desc}", flush=True)
    print(f"slowest search: {worst:.1f} s")


if __name__ == "__main__":
    main()
