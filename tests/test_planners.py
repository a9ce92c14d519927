"""Search space, exhaustive search and the Manual baseline."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from baselines.manual import uniform_cuts
from nest.problem.evaluate import evaluate, make_problem
from nest.planners.registry import planner_names, run_planner
from nest.problem.space import count_plans, cut_options, declare, enumerate_plans

SMALL_SPACE = {"zero_stages": [0, 3], "recompute_modes": ["none", "full"]}


@pytest.fixture(scope="module")
def tiny_moe_problem():
    from nest.spec.settings import TrainingSettings

    return make_problem("tiny_moe", "tiny_cluster", 4, training=TrainingSettings(global_batch=8))


def test_cut_options_closed_form():
    for n in range(1, 8):
        for p in range(1, n + 1):
            cuts = list(cut_options(n, p))
            assert len(cuts) == math.comb(n - 1, p - 1)
            assert all(c[0][0] == 0 and c[-1][1] == n - 1 for c in cuts)


def test_space_count_equals_enumeration(tiny_moe_problem):
    space = declare(tiny_moe_problem, SMALL_SPACE)
    plans = list(enumerate_plans(tiny_moe_problem, space))
    assert len(plans) == count_plans(tiny_moe_problem, space)
    # 4 variants (ep 1,2 x cp 1,2); every plan fits the devices
    assert {p.variant_key for p in plans} == {"tp1_sp0_ep1_cp1", "tp1_sp0_ep2_cp1",
                                              "tp1_sp0_ep1_cp2", "tp1_sp0_ep2_cp2"}
    assert all(p.pp * p.dp * p.width <= 4 for p in plans)


def test_exhaustive_returns_the_evaluator_optimum(tiny_moe_problem):
    out = run_planner("exhaustive", tiny_moe_problem, {"space": SMALL_SPACE})
    assert out.evaluation.feasible
    space = declare(tiny_moe_problem, SMALL_SPACE)
    times = [evaluate(p, tiny_moe_problem) for p in enumerate_plans(tiny_moe_problem, space)]
    best = min(e.time_per_batch_s for e in times if e.feasible)
    assert out.evaluation.time_per_batch_s == best
    assert out.plan.predicted_time_per_batch_s == best


@settings(max_examples=30, deadline=None)
@given(st.data())
def test_no_random_plan_beats_exhaustive(tiny_moe_problem, data):
    space = declare(tiny_moe_problem, SMALL_SPACE)
    best = run_planner("exhaustive", tiny_moe_problem, {"space": SMALL_SPACE})
    plans = list(enumerate_plans(tiny_moe_problem, space))
    p = plans[data.draw(st.integers(0, len(plans) - 1))]
    ev = evaluate(p, tiny_moe_problem)
    assert not ev.feasible or ev.time_per_batch_s >= best.evaluation.time_per_batch_s


def test_exhaustive_refuses_huge_spaces():
    pr = make_problem("llama2_7b", "tpuv4_fattree", 64)
    out = run_planner("exhaustive", pr)
    assert out.plan is None and "more than max_plans" in out.reason


def test_uniform_cuts():
    assert uniform_cuts(32, 8) == [(0, 4), (5, 8), (9, 12), (13, 16), (17, 20), (21, 24),
                                   (25, 28), (29, 33)]
    assert uniform_cuts(5, 2) == [(0, 3), (4, 6)]


def test_manual_paper_configs():
    out = run_planner("manual", make_problem("gpt3_175b", "tpuv4_fattree", 256))
    p = out.plan
    assert (p.pp, p.dp, p.tp) == (32, 2, 4) and p.placement == "replica_major"
    assert out.evaluation.feasible
    mix = run_planner("manual", make_problem("mixtral_8x7b", "h100_spineleaf", 1024)).plan
    assert (mix.pp, mix.dp, mix.tp, mix.ep) == (16, 16, 1, 4)


def test_manual_needs_enough_devices():
    out = run_planner("manual", make_problem("gpt3_175b", "tpuv4_fattree", 64))
    assert out.plan is None and "needs 128 devices > 64" in out.reason


def test_registry_lists_planners():
    assert {"manual", "exhaustive"} <= set(planner_names())
    assert "exhaustive" not in planner_names(figures_only=True)


def test_space_variant_filters():
    pr = make_problem("mixtral_8x7b", "tpuv4_fattree", 64)
    full = declare(pr)
    only = declare(pr, {"cp": [1], "ep": [1, 4]})
    assert len(full.variants) == 16
    assert [v.key for v in only.variants] == ["tp1_sp0_ep1_cp1", "tp1_sp0_ep4_cp1"]
