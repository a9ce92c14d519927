"""One planner on one point: its plan (or no-plan record) and the shared evaluator's verdict, as
the JSON dicts the pipeline stores (`nest.plan/v1` or `nest.no_plan/v1`, `nest.evaluation/v1`).

The stored plan reads back (`Plan.from_dict`) as the very plan the shared evaluator scored, so a
stored plan and its stored evaluation always agree.
Used by the pipeline's plan rule (one point, one planner) and by the decomposition (one point,
every ablation in one process: a process start costs about as much as a small solve).
"""

from __future__ import annotations

import json

from nest.problem.plan import Plan
from nest.planners.registry import run_planner
from nest.problem.problem import Problem
from nest.experiments.results import no_plan_evaluation, no_plan_record


def plan_point(planner: str, problem: Problem, model: str, cluster: str) -> tuple[dict, dict]:
    """(plan dict, evaluation dict) of `planner` on `problem` (model and cluster: their names or
    paths as the pipeline gives them, recorded in a no-plan record). The plan is evaluated once,
    by run_planner (with the simulated time); the dict stored is checked to read back as that
    very plan."""
    out = run_planner(planner, problem, simulated=True)
    if out.plan is None:
        rec = no_plan_record(planner, model, cluster, problem.num_devices, problem.mbs,
                             out.reason, out.solve_time_s, out.status, out.kind)
        return rec, no_plan_evaluation(rec)
    d = json.loads(json.dumps(out.plan.to_dict()))
    if Plan.from_dict(d, f"{planner}'s plan") != out.plan:
        raise AssertionError(f"{planner}'s plan does not survive its JSON round trip")
    return d, json.loads(json.dumps(out.evaluation.to_dict()))
