"""Benchmark: the MCMC baseline on Figure 5's points (TPUv4-like fat tree, 64-1024 devices).

    python benchmarks/bench_mcmc.py                 # all 25 points, default settings
    python benchmarks/bench_mcmc.py --models gpt3_175b --devices 1024 --set budget=4000
Prints one line per point: MCMC solve seconds (wall and CPU), the shared evaluator's time per
batch of the MCMC, NEST and Manual plans, MCMC's optimality gap against NEST (T_mcmc / T_nest - 1)
and the plans.
"""

from __future__ import annotations

import argparse
import resource
import time

import yaml

from nest.problem.evaluate import make_problem
from nest.planners.registry import run_planner

MODELS = ("bert_large", "llama2_7b", "llama3_70b", "gpt3_175b", "mixtral_8x7b")
DEVICES = (64, 128, 256, 512, 1024)


def describe(out) -> str:
    p = out.plan
    if p is None:
        return "-"
    return (f"p={p.pp} d={p.dp} t={p.tp} sp={int(p.sp)} e={p.ep} c={p.cp} "
            f"{p.placement.split('_')[0]}")


def fmt(x: float | None) -> str:
    return f"{x:10.4f}" if x else f"{'-':>10s}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", nargs="*", default=MODELS)
    ap.add_argument("--devices", nargs="*", type=int, default=DEVICES)
    ap.add_argument("--cluster", default="tpuv4_fattree")
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                    help="MCMC setting overrides (YAML values)")
    a = ap.parse_args()
    overrides = {k: yaml.safe_load(v) for k, v in (s.split("=", 1) for s in a.set)}
    print(f"{'model':13s} {'N':>5s} {'solve_s':>7s} {'cpu_s':>6s} {'T_mcmc_s':>10s} "
          f"{'T_nest_s':>10s} {'T_manual_s':>10s} {'gap':>7s}  mcmc plan | nest plan")
    for model in a.models:
        for n in a.devices:
            pr = make_problem(model, a.cluster, n)
            t0, c0 = time.perf_counter(), time.process_time()
            mc = run_planner("mcmc", pr, overrides)
            dt, cpu = time.perf_counter() - t0, time.process_time() - c0
            ne = run_planner("nest", pr)
            ma = run_planner("manual", pr)

            def T(o):
                return o.evaluation.time_per_batch_s if o.evaluation and o.evaluation.feasible \
                    else None

            tm, tn, tma = T(mc), T(ne), T(ma)
            gap = f"{tm / tn - 1:+.2%}" if tm and tn else "-"
            print(f"{model:13s} {n:5d} {dt:7.1f} {cpu:6.1f} {fmt(tm)} {fmt(tn)} {fmt(tma)} "
                  f"{gap:>7s}  {describe(mc)} | {describe(ne)}"
                  + ("" if mc.plan else f"  [{mc.reason[:100]}]")
                  + ("  BUDGET SPENT" if mc.plan and mc.plan.extra.get("budget_exhausted") else ""), flush=True)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3
    print(f"peak RSS of the whole run (MCMC, NEST and Manual): {rss:.0f} MB")


if __name__ == "__main__":
    main()
