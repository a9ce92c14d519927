"""The NEST solver: JAX kernel == plain-Python recurrence; optimum == exhaustive search; its
predicted time == the shared evaluator's; no worse than Manual; network awareness pays."""

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from exactness import assert_solver_equals_exhaustive
from nest.problem.evaluate import evaluate, make_problem
from nest.network.collectives import flattened
from nest.planners.registry import run_planner
from nest.spec.settings import TrainingSettings
from nest.solver import search
from nest.solver.dp import bottleneck, bottleneck_reference
from nest.problem.space import declare
from nest.planners.ties import with_placement


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 4), st.integers(1, 6), st.integers(1, 3), st.integers(0, 2**31 - 1),
       st.floats(0.2, 2.0))
def test_kernel_matches_reference(J, L, O, seed, cap):
    rng = np.random.default_rng(seed)
    prim = rng.random((J, L, L, O)).round(2)  # rounding makes ties, which must break the same
    sec = rng.random((J, L, L, O)) * 2
    ok = rng.random((J, L, L, O)) < 0.8
    got = bottleneck(prim, sec, ok, cap)
    ref = bottleneck_reference(prim.tolist(), sec.tolist(), ok.tolist(), cap)
    assert got[0] == ref[0] or (math.isinf(got[0]) and math.isinf(ref[0]))
    if math.isfinite(ref[0]):
        assert got[1] == ref[1]


SPACE = {"zero_stages": [0, 1, 3], "recompute_modes": ["none", "full"]}


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow],
          derandomize=True)
@given(st.sampled_from(["tiny_gpt", "tiny_llama", "tiny_moe"]), st.sampled_from([4, 8]),
       st.sampled_from([4, 8, 12, 64]), st.sampled_from(["tiny_accel", "big"]))
def test_solver_equals_exhaustive(model, n, batch, memory):
    pr = make_problem(model, "tiny_cluster", n, training=TrainingSettings(global_batch=batch))
    if memory == "big":  # a roomier accelerator: different plans win when memory does not bind
        pr = pr.with_hardware(hbm_bytes=4e9)
    space = {**SPACE, "max_pp": 2, "zero_stages": [0, 3]} if n == 8 else SPACE
    assert_solver_equals_exhaustive(pr, space)


@pytest.mark.parametrize("model,n", [("llama2_7b", 64), ("gpt3_175b", 256),
                                     ("mixtral_8x7b", 128), ("llama3_70b", 512),
                                     ("bert_large", 1024)])
def test_no_worse_than_manual(model, n):
    pr = make_problem(model, "tpuv4_fattree", n)
    nest = run_planner("nest", pr)
    manual = run_planner("manual", pr)
    assert nest.evaluation.feasible
    assert nest.plan.predicted_time_per_batch_s == pytest.approx(
        nest.evaluation.time_per_batch_s, rel=1e-9)
    if manual.evaluation is not None and manual.evaluation.feasible:
        assert nest.evaluation.time_per_batch_s <= manual.evaluation.time_per_batch_s * (1 + 1e-12)


def test_network_blind_ties_go_to_megatron_order_on_spine_leaf():
    """A network-blind solve (the same DP, one flat NVLink bandwidth) cannot tell the placements
    of its optimum apart (they differ by microseconds there); the tie goes to Megatron-LM's
    default order (nest.planners.ties), which is NEST's own plan here, and the tied range shows what the
    blind planner risks: the other placement is more than 2x slower on the real network."""
    real = make_problem("llama3_70b", "h100_spineleaf", 128)
    blind = real.with_cluster(flattened(real.cluster))
    nest = run_planner("nest", real)
    blind_plan = run_planner("nest", blind).plan
    assert blind_plan.placement == "replica_major"
    assert blind_plan.extra["tied"]["placements"] == ["replica_major", "stage_major"]
    on_real = [evaluate(with_placement(blind_plan, pl).with_(cluster=real.cluster.name),
                        real).time_per_batch_s for pl in ("replica_major", "stage_major")]
    assert on_real[0] == pytest.approx(nest.evaluation.time_per_batch_s, rel=1e-12)
    assert on_real[1] > 2 * nest.evaluation.time_per_batch_s


def test_infeasible_problem_names_the_layer():
    pr = make_problem("gpt3_175b", "tiny_cluster", 8, training=TrainingSettings(global_batch=8))
    out = run_planner("nest", pr)
    assert out.plan is None
    assert "even with ZeRO-3 and full recomputation: layer" in out.reason
    assert "needs at least" in out.reason


def test_infeasible_message_summarises_many_variants():
    """Qwen2-57B-A14B on 8 GPUs listed all 168 variant keys in one 6,000-character line; more than
    8 are now counted, with each dimension's values."""
    from itertools import product

    from nest.graph.layer_graph import Variant
    from nest.solver import _variants_text

    many = [Variant(t, sp and t > 1, e, c) for t, sp, e, c in
            product((1, 2, 4), (False, True), (1, 2, 4, 8, 16, 32, 64), (1, 2, 4, 8))]
    many = list(dict.fromkeys(many))
    assert len(many) == (1 + 2 + 2) * 7 * 4
    text = _variants_text(many)
    assert text == "140 variants (tp 1/2/4, ep 1/2/4/8/16/32/64, cp 1/2/4/8, sp off/on)"
    assert _variants_text(many[:3]) == f"variants {[v.key for v in many[:3]]}"


def test_search_statistics():
    pr = make_problem("llama2_7b", "tpuv4_fattree", 256)
    best_T, best, stats = search(pr, declare(pr))
    assert best is not None and stats["visited"] <= stats["candidates"]


def test_micro_batch_size_search():
    """Asked to search mbs, NEST returns the best over the sizes, each solved exactly."""
    pr = make_problem("tiny_llama", "tiny_cluster", 4, training=TrainingSettings(global_batch=16))
    space = {"zero_stages": [0, 3], "recompute_modes": ["none", "full"]}
    per_mbs = {}
    for mbs in (1, 2, 4):
        sub = make_problem("tiny_llama", "tiny_cluster", 4, mbs,
                           training=TrainingSettings(global_batch=16))
        per_mbs[mbs] = run_planner("nest", sub, {"space": space}).evaluation.time_per_batch_s
    out = run_planner("nest", pr, {"space": space, "mbs_options": [1, 2, 4]})
    assert out.plan.mbs == min(per_mbs, key=per_mbs.get)
    assert out.evaluation.time_per_batch_s == pytest.approx(min(per_mbs.values()), rel=1e-12)
