"""Ties (nest.planners.ties): placements a planner's own objective cannot tell apart go to Megatron-LM's
default rank order, and the plan carries the range of the tied placements' times on the real
cluster. Checked against brute force: every plan of the space scored on the flattened network
(where the planner optimises) and the tied ones on the real network, by the shared evaluator."""

import math

import pytest

from nest.problem.evaluate import evaluate, make_problem
from nest.network.collectives import flattened
from nest.problem.placement import launch_rank
from nest.planners.registry import run_planner
from nest.experiments.results import collect_records
from nest.spec.settings import TrainingSettings
from nest.problem.space import declare, enumerate_plans
from nest.planners.ties import TIE_RTOL, with_placement

# a space small enough to enumerate: one variant, no ZeRO, no recomputation
SPACE = {"tp": [1], "sp": [False], "cp": [1], "ep": [1], "zero_stages": [0],
         "recompute_modes": ["none"]}
FLAT = {"network": "flat", "space": SPACE}


def problem(hbm: float):
    """tiny_gpt on 8 tiny_cluster devices; at 0.03 GB the flat optimum is pp=4 x dp=2, where
    replica_major and stage_major put the stages on different devices."""
    pr = make_problem("tiny_gpt", "tiny_cluster", 8, training=TrainingSettings(global_batch=16))
    return pr.with_hardware(hbm_bytes=hbm)


def brute_force_ties(pr):
    """Every plan of SPACE on the flattened network: the optimum, and per placement the plans
    within TIE_RTOL of it."""
    blind = pr.with_cluster(flattened(pr.cluster))
    scored = [(evaluate(q, blind), q) for q in enumerate_plans(blind, declare(blind, SPACE))]
    best = min(e.time_per_batch_s for e, _ in scored if e.feasible)
    tied: dict[str, list] = {}
    for e, q in scored:
        if e.feasible and e.time_per_batch_s <= best * (1 + TIE_RTOL):
            tied.setdefault(q.placement, []).append(q)
    return best, tied


def test_flat_tie_goes_to_megatron_order_with_the_brute_force_range():
    pr = problem(0.03e9)
    out = run_planner("nest_flat_network", pr, overrides=FLAT)
    best, tied = brute_force_ties(pr)
    assert set(tied) == {"replica_major", "stage_major"}  # the flat network cannot tell them apart
    plan = out.plan
    assert plan.placement == "replica_major"  # Megatron-LM's default tp-cp-ep-dp-pp
    assert plan.predicted_time_per_batch_s == pytest.approx(best, rel=TIE_RTOL)
    assert plan.extra["tied"]["placements"] == ["replica_major", "stage_major"]
    # the range: the real evaluator's min and max over the tied plans, by brute force
    real = [evaluate(q, pr).time_per_batch_s for qs in tied.values() for q in qs]
    assert plan.extra["tied"]["time_per_batch_min_s"] == pytest.approx(min(real), rel=1e-12)
    assert plan.extra["tied"]["time_per_batch_max_s"] == pytest.approx(max(real), rel=1e-12)
    assert max(real) > min(real) * 1.01  # the tie-break matters on the real network
    assert out.evaluation.time_per_batch_s == pytest.approx(min(real), rel=1e-12)
    # the results row carries the range
    row = collect_records([(out.evaluation.to_dict(), out.plan.to_dict())]).iloc[0]
    assert row.tied_candidates == 2
    assert row.time_per_batch_tied_min_s == pytest.approx(min(real), rel=1e-12)
    assert row.time_per_batch_tied_max_s == pytest.approx(max(real), rel=1e-12)


def test_no_tie_where_the_objective_tells_placements_apart():
    """At 0.05 GB the flat optimum is pp=2 x dp=4, whose placements the flattened network still
    prices apart (a ring across nodes leaves through several NICs): no tie, and the plan is the
    brute-force optimum with its own time as the range."""
    pr = problem(0.05e9)
    out = run_planner("nest_flat_network", pr, overrides=FLAT)
    best, tied = brute_force_ties(pr)
    assert len(tied) == 1 and "tied" not in out.plan.extra
    assert out.plan.placement in tied
    assert out.plan.predicted_time_per_batch_s == pytest.approx(best, rel=1e-12)
    row = collect_records([(out.evaluation.to_dict(), out.plan.to_dict())]).iloc[0]
    assert row.tied_candidates == 1
    assert row.time_per_batch_tied_min_s == row.time_per_batch_tied_max_s == (
        row.time_per_batch_s)


def test_network_aware_planner_and_fixed_placement_keep_their_plans():
    """On the real network NEST's objective separates the placements (no tie) and keeps the
    faster one; the fixed-placement ablation has one placement to choose from."""
    pr = problem(0.03e9)
    nest = run_planner("nest", pr, overrides={"space": SPACE})
    fixed = run_planner("nest", pr, overrides={"space": dict(SPACE,
                                                              placements=["replica_major"])})
    times = {pl: evaluate(with_placement(nest.plan, pl), pr).time_per_batch_s
             for pl in ("replica_major", "stage_major")}
    assert "tied" not in nest.plan.extra and "tied" not in fixed.plan.extra
    assert nest.evaluation.time_per_batch_s == pytest.approx(min(times.values()), rel=1e-12)
    assert fixed.plan.placement == "replica_major"


def test_launch_rank_orders_what_megatron_users_launch():
    assert launch_rank("replica_major") == launch_rank("tp-cp-ep-dp-pp") == (0, 0)
    assert launch_rank("stage_major") == (1, 0)  # --use-tp-pp-dp-mapping
    ranks = sorted(["dp-tp-cp-ep-pp", "stage_major", "custom", "tp-cp-dp-ep-pp",
                    "replica_major"], key=launch_rank)
    assert ranks == ["replica_major", "stage_major", "tp-cp-dp-ep-pp", "dp-tp-cp-ep-pp",
                     "custom"]
    assert math.isfinite(sum(launch_rank("tp-cp-ep-dp-pp")))
