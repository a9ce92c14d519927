"""The tight pipeline objective sum t + (m - 1) max t + max u (nest.solver.tight) against brute
force over every cut and option of small random instances, ties and infeasible cells included."""

import itertools
import math

import numpy as np
import pytest

from nest.solver.tight import min_sum, solve_fixed_tight


def _brute(t, u, ok, m, t_cap=math.inf, u_cap=math.inf, objective="tight"):
    J, L, _, O = t.shape
    best = math.inf
    for cuts in itertools.combinations(range(1, L), J - 1):
        bounds = [0, *cuts, L]
        cells = [(bounds[j], bounds[j + 1] - 1) for j in range(J)]
        for opts in itertools.product(range(O), repeat=J):
            ts = [t[j, b, a, o] for j, ((a, b), o) in enumerate(zip(cells, opts))]
            us = [u[j, b, a, o] for j, ((a, b), o) in enumerate(zip(cells, opts))]
            if not all(ok[j, b, a, o] for j, ((a, b), o) in enumerate(zip(cells, opts))):
                continue
            if max(ts) > t_cap or max(us) > u_cap:
                continue
            if objective == "sum":
                val = sum(ts)
            elif objective == "paper":
                val = (m + J - 1) * max(ts) + max(us)
            else:
                val = sum(ts) + (m - 1) * max(ts) + max(us)
            best = min(best, val)
    return best


def _instance(rng, J, L, O, ties):
    t = rng.integers(1, 6, size=(J, L, L, O)).astype(float) if ties else rng.random((J, L, L, O))
    u = rng.integers(0, 4, size=(J, L, L, O)).astype(float) if ties else rng.random((J, L, L, O))
    ok = rng.random((J, L, L, O)) > 0.2
    return t, u, ok


@pytest.mark.parametrize("seed", range(40))
def test_tight_solve_equals_brute_force(seed):
    rng = np.random.default_rng(seed)
    J, L, O = int(rng.integers(1, 4)), int(rng.integers(3, 7)), int(rng.integers(1, 3))
    J = min(J, L)
    t, u, ok = _instance(rng, J, L, O, ties=seed % 2 == 0)
    m = int(rng.integers(1, 12))
    want = _brute(t, u, ok, m)
    got = solve_fixed_tight(t, u, ok, m)
    if not math.isfinite(want):
        assert got is None
        return
    T, stages = got
    assert T == pytest.approx(want, rel=1e-12)
    # the returned cut prices to the returned value
    ts = [t[j, b, a, o] for j, (a, b, o) in enumerate(stages)]
    us = [u[j, b, a, o] for j, (a, b, o) in enumerate(stages)]
    assert sum(ts) + (m - 1) * max(ts) + max(us) == pytest.approx(T, rel=1e-12)
    assert stages[0][0] == 0 and stages[-1][1] == L - 1


@pytest.mark.parametrize("seed", range(20))
def test_min_sum_equals_brute_force_under_caps(seed):
    rng = np.random.default_rng(100 + seed)
    J, L, O = int(rng.integers(1, 4)), int(rng.integers(3, 7)), 2
    J = min(J, L)
    t, u, ok = _instance(rng, J, L, O, ties=True)
    t_cap, u_cap = float(rng.integers(2, 6)), float(rng.integers(1, 4))
    S, _ = min_sum(t, u, ok, t_cap, u_cap)
    assert S == _brute(t, u, ok, 1, t_cap, u_cap, objective="sum")


def test_tight_is_never_above_the_papers_form_and_equal_for_equal_stages():
    """(m + p - 1) max t >= sum t + (m - 1) max t, with equality when every stage takes the same
    time: the tight optimum is at most the paper's, and equal on uniform arrays."""
    rng = np.random.default_rng(7)
    for _ in range(10):
        J, L, O = 3, 6, 2
        t, u, ok = _instance(rng, J, L, O, ties=False)
        tight = solve_fixed_tight(t, u, ok, 8)
        assert tight is not None and tight[0] <= _brute(t, u, ok, 8, objective="paper") + 1e-12
    t = np.ones((3, 6, 6, 1))
    u = np.zeros((3, 6, 6, 1))
    ok = np.ones((3, 6, 6, 1), dtype=bool)
    assert solve_fixed_tight(t, u, ok, 8)[0] == _brute(t, u, ok, 8, objective="paper") == 10.0


@pytest.mark.parametrize("model,n,batch", [("tiny_gpt", 4, 8), ("tiny_llama", 8, 12),
                                           ("tiny_moe", 4, 4), ("tiny_gpt", 8, 64)])
def test_solver_equals_exhaustive_and_the_evaluator_under_the_tight_form(model, n, batch):
    """pipeline_time: dapple: the evaluator prices sum t + (m - 1) max t + max u, the solver
    optimises exactly that (the same optimum as scoring every plan of the space), and its
    predicted time is the evaluator's to rounding."""
    from exactness import assert_solver_equals_exhaustive
    from nest.problem.evaluate import make_problem
    from nest.planners.registry import run_planner
    from nest.spec.settings import TrainingSettings

    tr = TrainingSettings(global_batch=batch, pipeline_time="dapple")
    pr = make_problem(model, "tiny_cluster", n, training=tr)
    space = {"zero_stages": [0, 3], "recompute_modes": ["none", "full"], "max_pp": 4}
    nest = assert_solver_equals_exhaustive(pr, space)
    if nest.plan is None:
        return
    paper = run_planner("nest", pr.with_training(pipeline_time="paper"), {"space": space})
    assert nest.evaluation.time_per_batch_s <= paper.evaluation.time_per_batch_s * (1 + 1e-12)
