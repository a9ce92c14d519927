"""Ties: placements the planner's own objective cannot tell apart -> the one its user launches.

The rule (every planner of the solver: NEST, each ablation of nest.experiments.decomposition, the co-design's
flat-network planner). Once the search has its optimum candidate (stage variants, p, d), every
placement the space offers for that candidate is solved for its own best cuts and options; the
placements whose objective is within TIE_RTOL of the optimum are tied, and the plan returned is
the tied placement a Megatron-LM user would launch (nest.problem.placement.launch_rank: Megatron-LM's
default rank order tp-cp-ep-dp-pp first). Each tied plan is then scored by the shared evaluator on
the real cluster, and the plan carries the range (plan.extra["tied"]: the placements, min and max
time per batch; the results CSV's tied_candidates, time_per_batch_tied_min_s and _max_s).

Why a tolerance. A flat network has one bandwidth and one latency, yet the flattened view of a
hierarchical cluster (nest.network.collectives.flattened) still prices a ring inside a node and
one across nodes a few microseconds apart (the hierarchical all-reduce's extra steps). On
Llama-3-70B at 128 spine-leaf GPUs the two placements of the flat-network optimum differ by 12
microseconds in 116 s (1.0e-7): the flat planner cannot tell them apart, yet one costs 8x more
on the real network. TIE_RTOL = 1e-6 is above that residue and far below anything a planner
should act on (the cost model's own error, nest validate --published, is about 16%); on the real
network it only ever keeps NEST within a millionth of its optimum.

Baselines that fix one placement (Manual, the paper_* replays, Mist, Phaze, Alpa-E's homogeneous
plans: `replica_major`, Megatron-LM's default order) already launch what their users would.
"""

from __future__ import annotations

import math

TIE_RTOL = 1e-6  # relative: objectives within this of the optimum are tied (docstring)


def tied_candidates(problem, space, cls, lts, best, best_T: float, form: str,
                    even_cuts: bool = False) -> list[tuple[float, tuple]]:
    """[(T, best tuple)] of every placement of `best`'s (stage variants, p, d) whose optimum
    under the search's objective is within TIE_RTOL of best_T, most launchable first
    (nest.problem.placement.launch_rank); best itself is always among them. `cls`: the candidate's
    class of variants and `lts` their layer tables (nest.solver.search)."""
    from nest.problem.placement import launch_rank
    from nest.solver import candidate_arrays, solve_candidate

    _, p, d, placement, _ = best
    limit = best_T * (1 + TIE_RTOL)
    out = [(best_T, best)]
    for pl in space.placements_for(cls[0], p, d):
        if pl == placement:
            continue
        arr = candidate_arrays(problem, space, lts, p, d, pl, even_cuts)
        res = solve_candidate(arr, p, float(math.nextafter(limit, math.inf)), form)
        if res is None or res[0] > limit:
            continue
        O = space.options.size
        vs = [cls[o // O] for _, _, o in res[1]]
        out.append((res[0], (vs, p, d, pl, [(a, b, o % O) for a, b, o in res[1]])))
    return sorted(out, key=lambda tb: (launch_rank(tb[1][3]), tb[0]))


def tie_record(plans_and_times: list[tuple[str, float | None]]) -> dict:
    """plan.extra["tied"] of the tied placements with their time per batch on the real cluster
    (None where the shared evaluator says the plan does not fit): the placements in launch
    order, and min / max over those that fit (None if none does)."""
    times = [t for _, t in plans_and_times if t is not None]
    return {"placements": [p for p, _ in plans_and_times],
            "time_per_batch_min_s": min(times) if times else None,
            "time_per_batch_max_s": max(times) if times else None}


def with_placement(plan, placement: str):
    """`plan` (a regular placement) with its stages' devices laid out by `placement` instead
    (nest.problem.plan.place); cuts, options and variants unchanged."""
    from dataclasses import replace

    from nest.problem.plan import place

    ids = place(plan.pp, plan.dp, plan.width, placement, tp=plan.tp, cp=plan.cp, ep=plan.ep)
    return plan.with_(placement=placement, stages=tuple(
        replace(s, device_ids=tuple(i)) for s, i in zip(plan.stages, ids)))
