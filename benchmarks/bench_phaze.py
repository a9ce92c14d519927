"""Benchmark: Phaze search time on Figure 5's points, and its plans against NEST's and Manual's
under the shared evaluator.

    python benchmarks/bench_phaze.py                 # 25 points on tpuv4_fattree, with NEST, Manual
    python benchmarks/bench_phaze.py --phaze-only    # search times only
    python benchmarks/bench_phaze.py --cluster h100_spineleaf --devices 128 1024
Prints one line per point: Phaze's solve seconds, its plan, its flat-network prediction, the
evaluator's time per batch for Phaze / NEST / Manual, and Phaze's time over NEST's. `aware_T` is
the network-aware optimum of Phaze's own space (NEST's solver on the real network, Phaze's space):
phaze_T / aware_T is what network blindness alone costs, aware_T / nest_T what the smaller space
(no ZeRO, SP, CP, selective recomputation, placement choice) costs.
"""

from __future__ import annotations

import argparse
import time

from baselines.phaze import phaze_space
from nest.problem.evaluate import make_problem
from nest.planners.registry import run_planner
from nest.solver import search

MODELS = ("bert_large", "llama2_7b", "llama3_70b", "gpt3_175b", "mixtral_8x7b")


def fmt(out) -> str:
    return f"{out.evaluation.time_per_batch_s:10.4g}" if out.plan else f"{'-':>10s}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cluster", default="tpuv4_fattree")
    ap.add_argument("--devices", type=int, nargs="+", default=[64, 128, 256, 512, 1024])
    ap.add_argument("--models", nargs="+", default=list(MODELS))
    ap.add_argument("--phaze-only", action="store_true")
    a = ap.parse_args()
    print(f"{'model':14s} {'N':>5s} {'solve_s':>8s} {'plan (p/d/variant/recompute)':44s} "
          f"{'flat_T':>10s} {'phaze_T':>10s} {'aware_T':>10s} {'nest_T':>10s} {'manual_T':>10s} "
          f"{'ph/nest':>8s}")
    worst = 0.0
    for model in a.models:
        for n in a.devices:
            pr = make_problem(model, a.cluster, n)
            t0 = time.perf_counter()
            ph = run_planner("phaze", pr)
            dt = time.perf_counter() - t0
            worst = max(worst, dt)
            if ph.plan:
                p = ph.plan
                rec = "".join("n" if s.recompute == "none" else "f" for s in p.stages)
                desc = f"{p.pp}/{p.dp}/{p.variant_key}/{rec[:12]}{'..' if len(rec) > 12 else ''}"
                flat = f"{p.predicted_time_per_batch_s:10.4g}"
                if not ph.evaluation.feasible:
                    desc += " INFEASIBLE"
            else:
                desc, flat = ph.reason[:44], f"{'-':>10s}"
            line = f"{model:14s} {n:5d} {dt:8.2f} {desc:44s} {flat} {fmt(ph)}"
            if not a.phaze_only:
                aware_T = search(pr, phaze_space(pr))[0]
                ne = run_planner("nest", pr)
                ma = run_planner("manual", pr)
                ratio = (ph.evaluation.time_per_batch_s / ne.evaluation.time_per_batch_s
                         if ph.plan and ne.plan else float("nan"))
                line += f" {aware_T:10.4g} {fmt(ne)} {fmt(ma)} {ratio:8.4f}"
            print(line, flush=True)
    print(f"slowest Phaze solve: {worst:.2f} s")


if __name__ == "__main__":
    main()
