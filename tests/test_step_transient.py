"""The optimizer step's FP32 gradient copy (BF16 gradient reduce) is a transient of the step: it
never coexists with stashed activations or the working set (nest.costs.memory.allocated), in
the stage kernel, its inverse (stash capacity), the evaluator's records and a published run."""

import math
from types import SimpleNamespace

import numpy as np
import pytest

from nest.costs.layers import layer_table
from nest.costs.memory import REUSE_KEY, STEP_KEY, allocatable, peak, shard_sizes
from nest.costs.pipeline import held_bytes, stash_capacity
from nest.costs.stage import Options, stage_cost
from nest.graph.layer_graph import Variant
from nest.problem.evaluate import evaluate, make_problem
from nest.problem.plan import place
from nest.spec.precision import precision_from_dict
from nest.spec.settings import TrainingSettings

MODES = ("none", "selective", "full")


def bf16_problem(**prec):
    tr = TrainingSettings(global_batch=16,
                          precision=precision_from_dict({"grad_reduce": "bf16", **prec}, "test"))
    pr = make_problem("tiny_moe", "tiny_cluster", 8, training=tr)
    return pr.with_variants([Variant(tp=2)])


@pytest.mark.parametrize("z", [0, 1, 2, 3])
def test_stage_peak_is_states_plus_the_larger_of_activations_and_the_copy(z):
    """Closed form on two MoE blocks, d = 4 (`shard_sizes`): resident
    S = 2 P(z>=3) + 2 P(z>=2) + 12 P(z>=1), copy c = 4 P(z>=1); allocated = S + max(A + W, c),
    with the stash chosen so that the copy is larger (no stash) and smaller than A + W."""
    pr = bf16_problem()
    v, d = pr.graph.variants[0], 4
    lt = layer_table(pr, v, MODES)
    a, b = 1, 2
    pd, pe = lt.dense_L[a:b + 1].sum(), lt.expert_L[a:b + 1].sum()
    nd, ne = shard_sizes(d, v.ep, v.cp)
    assert pe > 0

    def held(bpp, from_stage):
        return bpp * ((pd / nd + pe / ne) if z >= from_stage else pd + pe)

    resident = held(2, 3) + held(2, 2) + held(12, 1)
    copy = held(4, 1)
    act = lt.act_LR[a:b + 1, 0].sum()
    gathered = 2 * max(lt.dense_L[a:b + 1] + lt.expert_L[a:b + 1]) if z == 3 else 0.0
    ids = place(1, d, v.width, "replica_major")[0]
    big = math.ceil((copy - gathered) / act) + 2  # A + W > c
    hw = pr.cluster.hardware
    seen = set()
    for n in (0, big):
        one = stage_cost(pr, lt, ids, d, Options((z,), ("none",)), n, cell=(a, b), detail=True)
        mem = one.detail["memory_bytes"]
        assert mem[STEP_KEY] == pytest.approx(copy)
        assert mem["gradients"] == pytest.approx(held(2, 2))
        run = n * act + gathered
        seen.add(copy > run)
        alloc = resident + max(run, copy)
        assert mem[REUSE_KEY] == pytest.approx(-min(copy, run))
        assert one.mem[0, 0] == pytest.approx(peak(alloc, hw), rel=1e-12)
        assert sum(mem.values()) == pytest.approx(one.mem[0, 0], rel=1e-9)
        grid = stage_cost(pr, lt, ids, d, Options((z,), MODES), n)  # the solver's grid
        assert grid.mem[b, a, 0, 0] == pytest.approx(one.mem[0, 0], rel=1e-12)
    # both sides of the max exercised (z = 3: one gathered layer already exceeds the copy)
    assert seen == ({True, False} if z < 3 else {False})


def test_default_fp32_reduce_has_no_copy():
    """FP32 reduce (the default): no transient key, so default records are unchanged."""
    pr = make_problem("tiny_moe", "tiny_cluster", 8, training=TrainingSettings(global_batch=16))
    pr = pr.with_variants([Variant(tp=2)])
    v = pr.graph.variants[0]
    lt = layer_table(pr, v, MODES)
    one = stage_cost(pr, lt, place(1, 4, v.width, "replica_major")[0], 4,
                     Options((1,), ("none",)), 0, cell=(1, 2), detail=True)
    assert STEP_KEY not in one.detail["memory_bytes"]
    assert REUSE_KEY not in one.detail["memory_bytes"]


def test_stash_capacity_inverts_held_bytes_with_the_step():
    """max(fixed + s act, step) <= allocatable iff s <= floor((cap - fixed) / act) and
    step <= cap: a step too large leaves no stash at all (-1), however small fixed is."""
    hw = SimpleNamespace(hbm_bytes=100.0, memory_overhead_bytes=10.0, memory_fragmentation=0.0)
    cap = allocatable(hw)
    assert cap == 90.0
    fixed, act = 20.0, 7.0
    for step in (0.0, 50.0, 90.0, 90.5):
        n = stash_capacity(fixed, act, hw, step)
        brute = max((s for s in range(20) if peak(held_bytes(fixed, s, act, step), hw)
                     <= hw.hbm_bytes), default=-1)
        assert n == brute
    assert stash_capacity(fixed, act, hw, 90.5) == -1
    arr = stash_capacity(np.array([20.0, 95.0]), act, hw, np.array([95.0, 0.0]))
    assert list(arr) == [-1, -1]


def test_qwen3_30b_row_fits_with_the_copy_as_a_step_transient():
    """bridge2509_qwen3_30b_a3b_16gpu_fp8_tokendrop (config/validation/published_runs.yaml, BF16
    gradient reduce, distributed optimizer): it ran, so it must fit in 80 GB. Each device
    group's record term by term: BF16 weights and gradient buffer (2 B each, not sharded at
    z = 1), Adam states 12 B and the copy 4 B per parameter over the same shards, the copy
    counted only where it exceeds the activations and working set freed before the step;
    counting the copy alongside the activations (the old model) would not fit."""
    from nest.fidelity.published_runs import load_runs, plan_spec, problem_for
    from nest.problem.plan_spec import expand

    row = next(r for r in load_runs()
               if r["id"] == "bridge2509_qwen3_30b_a3b_16gpu_fp8_tokendrop")
    pr = problem_for(row)
    plan = expand(plan_spec(row, pr.graph.num_layers), pr, "test")
    ev = evaluate(plan, pr)
    hw = pr.cluster.hardware
    assert ev.feasible
    old = []
    for s in ev.stages[:row["pp"]]:  # interleaved: one record per device group
        m = s.memory_bytes
        assert m["gradients"] == pytest.approx(m["weights"])
        assert m[STEP_KEY] == pytest.approx(m["optimizer_states"] * 4 / 12)
        resident = m["weights"] + m["gradients"] + m["optimizer_states"] + m.get("fp8_weights", 0)
        run = m["activations"] + m["working"]
        assert m[REUSE_KEY] == pytest.approx(-min(run, m[STEP_KEY]))
        assert s.peak_memory_bytes == pytest.approx(peak(resident + max(run, m[STEP_KEY]), hw))
        assert s.peak_memory_bytes <= hw.hbm_bytes
        old.append(peak(resident + run + m[STEP_KEY], hw))
    assert max(old) > hw.hbm_bytes  # the over-count this replaces


@pytest.mark.parametrize("model", ["tiny_moe", "tiny_gpt"])
def test_solver_equals_exhaustive_with_the_copy(model):
    """BF16 reduce, no ZeRO, full recomputation (a tiny model's copy, 4 B per parameter, exceeds
    its recomputed activations: the optimizer step sets the peak): NEST's optimum is the
    exhaustive one (the evaluator scores every plan), with HBM set to the optimum's peak, just
    under it, and 10% under it."""
    from exactness import assert_solver_equals_exhaustive
    from nest.planners.registry import run_planner

    tr = TrainingSettings(global_batch=8,
                          precision=precision_from_dict({"grad_reduce": "bf16"}, "test"))
    pr0 = make_problem(model, "tiny_cluster", 4, training=tr).with_hardware(hbm_bytes=4e9)
    space = {"zero_stages": [0], "recompute_modes": ["full"]}
    ex = run_planner("exhaustive", pr0, {"space": space, "max_plans": 400_000})
    stages = ex.evaluation.stages
    assert any(s.memory_bytes[REUSE_KEY] > -s.memory_bytes[STEP_KEY] for s in stages)
    peak0 = max(s.peak_memory_bytes for s in stages)
    for hbm in (peak0, peak0 * (1 - 1e-6), peak0 * 0.9):
        assert_solver_equals_exhaustive(pr0.with_hardware(hbm_bytes=hbm), space)


def test_memory_picture_draws_the_copy_net_of_its_reuse():
    """The stacked bars (nest.reports.plan_views.memory_picture) draw the copy net of the
    freed activations it reuses: every bar non-negative, the stack still the allocated sum."""
    from nest.reports.plan_views import _net_step

    m = {"weights": 1.0, "activations": 3.0, STEP_KEY: 5.0, REUSE_KEY: -3.0}
    net = _net_step(m)
    assert net == {"weights": 1.0, "activations": 3.0, STEP_KEY: 2.0}
    assert sum(net.values()) == sum(m.values())
    assert _net_step({"weights": 1.0}) == {"weights": 1.0}
