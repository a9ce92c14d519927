"""The exactness check shared by the solver tests: NEST's optimum equals scoring every plan of the
space with the shared evaluator (the exhaustive planner), and NEST's predicted time is the
evaluator's time of its plan."""

from __future__ import annotations

import pytest

from nest.planners.registry import run_planner


def assert_solver_equals_exhaustive(problem, space: dict):
    """Returns NEST's planner output (None plan when nothing fits, as the exhaustive one)."""
    nest = run_planner("nest", problem, {"space": space})
    ex = run_planner("exhaustive", problem, {"space": space, "max_plans": 400_000})
    assert (nest.plan is None) == (ex.plan is None)
    if ex.plan is None:
        return nest
    assert nest.evaluation.time_per_batch_s == pytest.approx(ex.evaluation.time_per_batch_s,
                                                             rel=1e-9)
    assert nest.plan.predicted_time_per_batch_s == pytest.approx(
        nest.evaluation.time_per_batch_s, rel=1e-9)
    return nest
