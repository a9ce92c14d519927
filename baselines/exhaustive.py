"""Exhaustive search: every plan of the declared search space (nest.problem.space), scored by the shared
evaluator; the feasible plan with the least time per batch wins (first in enumeration order on
ties). The ground truth for the NEST solver on small problems; refuses spaces above max_plans."""

from __future__ import annotations

from nest.problem.evaluate import Problem, evaluate
from nest.planners.registry import NoPlan
from nest.problem.space import count_plans, declare, enumerate_plans


def plan(problem: Problem, settings: dict):
    space = declare(problem, settings.get("space"))
    n = count_plans(problem, space)
    limit = int(settings.get("max_plans", 200_000))
    if n > limit:
        raise NoPlan(f"the search space holds {n} plans, more than max_plans={limit}; exhaustive "
                     f"search is for small problems", kind="none_found")  # not a fit: more
        # devices only make the space larger (so `nest plan` searches no larger device count)
    best, best_t, why = None, float("inf"), "every plan exceeds memory"
    for candidate in enumerate_plans(problem, space):
        ev = evaluate(candidate, problem)
        if ev.feasible and ev.time_per_batch_s < best_t:
            best, best_t = candidate, ev.time_per_batch_s
        elif not ev.feasible and best is None:
            why = f"every plan exceeds memory (e.g. {ev.reason})"
    if best is None:
        raise NoPlan(why)
    return best.with_(predicted_time_per_batch_s=best_t, notes=f"searched {n} plans")
