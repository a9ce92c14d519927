"""Heterogeneous stages: each pipeline stage with its own sub-graph variant. The solver's optimum
equals exhaustive search over the same space; the evaluator prices a stage by its own variant
(a stage of a mixed plan costs what it costs in the uniform plan of its variant)."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nest.problem.evaluate import evaluate, make_problem
from nest.graph.layer_graph import Variant
from nest.planners.registry import run_planner
from nest.spec.settings import TrainingSettings
from nest.solver import search
from nest.problem.space import count_plans, declare, make_plan

SMALL = {"zero_stages": [0, 3], "recompute_modes": ["none", "full"], "max_pp": 3,
         "heterogeneous_stages": True}


def problem(model: str, n: int, batch: int, hbm: float | None = None):
    pr = make_problem(model, "tiny_cluster", n, training=TrainingSettings(global_batch=batch))
    if model == "tiny_moe":  # a class {tp2, cp2}: same width and ep, other splits
        pr = pr.with_variants([Variant(tp=2), Variant(tp=2, sp=True)])
    return pr.with_hardware(hbm_bytes=hbm) if hbm else pr


def test_classes_group_same_width_and_ep():
    sp = declare(problem("tiny_moe", 8, 8), SMALL)
    for cls in sp.classes:
        assert len({(v.width, v.ep) for v in cls}) == 1
    assert max(len(c) for c in sp.classes) == 3  # tp2, tp2+sp, cp2 share a class
    assert sorted(v.key for c in sp.classes for v in c) == sorted(v.key for v in sp.variants)


@settings(max_examples=8, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(["tiny_gpt", "tiny_moe"]), st.sampled_from([4, 8]),
       st.sampled_from([4, 16]), st.sampled_from([None, 6e8]))
def test_solver_equals_exhaustive_with_heterogeneous_stages(model, n, batch, hbm):
    pr = problem(model, n, batch, hbm)
    space = {**SMALL, "max_pp": 2} if n == 8 else SMALL
    assert count_plans(pr, declare(pr, space)) < 60_000
    nest = run_planner("nest", pr, {"space": space})
    ex = run_planner("exhaustive", pr, {"space": space, "max_plans": 60_000})
    assert (nest.plan is None) == (ex.plan is None)
    if ex.plan is not None:
        assert nest.evaluation.time_per_batch_s == pytest.approx(ex.evaluation.time_per_batch_s,
                                                                 rel=1e-9)
        assert nest.plan.predicted_time_per_batch_s == pytest.approx(
            nest.evaluation.time_per_batch_s, rel=1e-9)


def test_heterogeneous_space_is_never_worse():
    """The homogeneous space is a subset: its optimum is never better."""
    pr = problem("tiny_moe", 8, 16, 6e8)
    het, _, _ = search(pr, declare(pr, SMALL))
    hom, _, _ = search(pr, declare(pr, {**SMALL, "heterogeneous_stages": False}))
    assert het <= hom * (1 + 1e-12)


def test_a_stage_costs_what_it_costs_in_its_own_uniform_plan():
    pr = problem("tiny_moe", 8, 8)
    cuts, z, r = [(0, 1), (2, 3)], [0, 0], ["none", "full"]
    tp, cp = Variant(tp=2), Variant(cp=2)
    mixed = make_plan(pr, "hand", tp, 2, 2, cuts, z, r, "replica_major", [tp, cp])
    assert mixed.heterogeneous and mixed.stage_variant(1) == cp
    ev = evaluate(mixed, pr)
    ev_tp = evaluate(make_plan(pr, "hand", tp, 2, 2, cuts, z, r, "replica_major"), pr)
    ev_cp = evaluate(make_plan(pr, "hand", cp, 2, 2, cuts, z, r, "replica_major"), pr)
    assert ev.stages[0].time_per_microbatch_s == ev_tp.stages[0].time_per_microbatch_s
    assert ev.stages[1].time_per_microbatch_s == ev_cp.stages[1].time_per_microbatch_s
    assert ev.stages[1].peak_memory_bytes == ev_cp.stages[1].peak_memory_bytes
    assert ev.stages[0].breakdown_s != ev.stages[1].breakdown_s


def test_plan_json_round_trip_keeps_stage_variants(tmp_path):
    from nest.problem.plan import Plan

    pr = problem("tiny_moe", 8, 8)
    tp, cp = Variant(tp=2), Variant(cp=2)
    mixed = make_plan(pr, "hand", tp, 2, 2, [(0, 1), (2, 3)], [0, 0], ["none"] * 2,
                      "replica_major", [tp, cp])
    mixed.write(tmp_path / "p.json")
    back = Plan.read(tmp_path / "p.json")
    assert back == mixed and back.stage_variant(1) == cp


@pytest.mark.parametrize("model,n,batch", [("tiny_moe", 8, 16), ("tiny_gpt", 8, 8)])
def test_solver_equals_exhaustive_over_every_launcher_order(model, n, batch):
    """placements: [orders] searches every rank order megatron-core accepts (nest.problem.placement);
    the solver's optimum equals exhaustive search over the same orders, and is never worse than
    over the two CLI orders alone."""
    pr = problem(model, n, batch, 6e8)
    space = {**SMALL, "max_pp": 2, "placements": ["orders"], "heterogeneous_stages": False}
    assert count_plans(pr, declare(pr, space)) < 60_000
    nest = run_planner("nest", pr, {"space": space})
    ex = run_planner("exhaustive", pr, {"space": space, "max_plans": 60_000})
    assert nest.evaluation.time_per_batch_s == pytest.approx(ex.evaluation.time_per_batch_s,
                                                             rel=1e-9)
    two, _, _ = search(pr, declare(pr, {**space, "placements": ["replica_major",
                                                                "stage_major"]}))
    assert nest.evaluation.time_per_batch_s <= two * (1 + 1e-12)
