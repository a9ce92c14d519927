"""Mist-style baseline: MILP == brute force over its own variables; layer counts cover every cut;
on a flat network its prediction is the evaluator's time and equals NEST's restricted optimum;
plans are valid, feasible, deterministic and never better than NEST."""

import itertools
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from baselines import mist
from nest.problem.evaluate import evaluate, make_problem
from nest.graph.layer_graph import Variant
from nest.network.collectives import flattened
from nest.planners.registry import run_planner
from nest.spec.settings import TrainingSettings
from nest.costs.layers import layer_table
from nest.problem.space import cut_options, declare

SMALL = {"zero_stages": [0, 3], "recompute_modes": ["none", "full"]}


def tiny(model="tiny_gpt", n=4, batch=8, flat=False):
    pr = make_problem(model, "tiny_cluster", n, training=TrainingSettings(global_batch=batch))
    if flat:
        pr = pr.with_cluster(flattened(pr.cluster))
    return pr


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.integers(1, 3), st.integers(1, 4), st.integers(1, 3), st.integers(0, 2**31 - 1),
       st.integers(1, 40))
def test_milp_equals_brute_force_on_random_tables(p, nb, O, seed, C):
    """HiGHS's optimum == plain enumeration, on random times, syncs and memory (ties included)."""
    rng = np.random.default_rng(seed)
    tab = mist.StageTable([], [], [], [], [], nb, C, 1.0)
    for j in range(p):
        ns = np.array(mist.count_range(j, p, nb))
        k = len(ns) * O
        tab.n.append(np.repeat(ns, O))
        tab.o.append(np.tile(np.arange(O), len(ns)))
        tab.t.append(rng.random(k).round(2) + 0.01 * tab.n[-1])
        tab.u.append(rng.random(k).round(1))
        tab.mem.append(rng.random(k) * 1.3)
    got, ref = mist.solve_milp(tab), mist.brute_force(tab)
    assert (got is None) == (ref is None)
    if ref is not None:
        assert got[0] == pytest.approx(ref[0], rel=1e-12)
        assert mist.objective(tab, got[1]) == got[0]


@pytest.mark.parametrize("p,L", [(1, 3), (2, 4), (3, 6), (4, 6), (6, 6)])
def test_layer_counts_cover_every_cut(p, L):
    """Per-stage block counts (count_range, summing to the blocks) <-> contiguous cuts of the
    layer graph (nest.problem.space.cut_options): the same set, so the MILP misses no cut."""
    nb = L - 2
    counts = {c for c in itertools.product(*[mist.count_range(j, p, nb) for j in range(p)])
              if sum(c) == nb}
    cuts = {tuple(sum(1 for i in range(a, b + 1) if 1 <= i <= nb) for a, b in cut)
            for cut in cut_options(L, p)}
    assert counts == cuts


@pytest.mark.parametrize("model,n,batch", [("tiny_gpt", 4, 8), ("tiny_moe", 8, 16),
                                           ("tiny_llama", 8, 64)])
def test_milp_equals_brute_force_on_tiny_problems(model, n, batch):
    """On the flat network, every (variant, p, d) candidate: MILP == brute force of its table."""
    pr = tiny(model, n, batch, flat=True)
    space = declare(pr, {**SMALL, "max_pp": 3}).with_(placements=(mist.PLACEMENT,))
    checked = 0
    for v in space.variants[:2]:
        la = layer_table(pr, v, space.recompute_modes)
        for p in range(1, 4):
            for d in range(1, n // (p * v.width) + 1):
                tab = mist.stage_table(pr, space, la, v, p, d)
                got, ref = mist.solve_milp(tab), mist.brute_force(tab)
                assert (got is None) == (ref is None)
                if ref is not None:
                    assert got[0] == pytest.approx(ref[0], rel=1e-12)
                    checked += 1
    assert checked > 5


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow],
          derandomize=True)
@given(st.sampled_from(["tiny_gpt", "tiny_llama", "tiny_moe"]), st.sampled_from([4, 8]),
       st.sampled_from([4, 8, 64]), st.sampled_from([0.25e9, 4e9]))
def test_equals_nest_on_a_flat_network(model, n, batch, hbm):
    """A flat real network and the same space (every d, replica-major placement): Mist's plan is
    NEST's optimum, and its MILP prediction is the evaluator's time."""

    pr = tiny(model, n, batch, flat=True)
    pr = pr.with_hardware(hbm_bytes=hbm)
    out = run_planner("mist", pr, {"full_device_use": False})
    nest = run_planner("nest", pr, {"space": {"placements": ["replica_major"]}})
    assert (out.plan is None) == (nest.plan is None)
    if out.plan is None:
        return
    assert out.evaluation.feasible
    assert out.evaluation.time_per_batch_s == pytest.approx(nest.evaluation.time_per_batch_s,
                                                            rel=1e-9)
    assert out.plan.predicted_time_per_batch_s == pytest.approx(out.evaluation.time_per_batch_s,
                                                                rel=1e-9)


@pytest.mark.parametrize("model,n", [("tiny_gpt", 8), ("tiny_moe", 8), ("tiny_llama", 4)])
def test_plan_valid_feasible_and_no_better_than_nest_on_real_network(model, n):
    pr = tiny(model, n)
    out = run_planner("mist", pr)
    assert out.plan is not None and out.evaluation.feasible, out.reason
    assert out.plan.placement == "replica_major"
    assert out.plan.pp * out.plan.dp * out.plan.width == n  # Mist's stages use every device
    blind = evaluate(out.plan, tiny(model, n, flat=True))  # the prediction is network-blind
    assert out.plan.predicted_time_per_batch_s == pytest.approx(blind.time_per_batch_s, rel=1e-9)
    nest = run_planner("nest", pr)
    assert out.evaluation.time_per_batch_s >= nest.evaluation.time_per_batch_s * (1 - 1e-12)


def test_deterministic():
    pr = tiny("tiny_moe", 8, 16)
    a, b = mist.plan(pr, {}), mist.plan(tiny("tiny_moe", 8, 16), {})
    assert a.with_(solve_time_s=None) == b.with_(solve_time_s=None)


def test_no_plan_names_the_reason():
    pr = make_problem("gpt3_175b", "tiny_cluster", 8, training=TrainingSettings(global_batch=8))
    out = run_planner("mist", pr)
    assert out.plan is None and "no feasible plan: Mist-style MILP" in out.reason
    assert "HBM" in out.reason


def test_spent_budget_is_reported():
    out = run_planner("mist", tiny(), {"max_candidates": 0})
    assert out.plan is None and "spent its budget" in out.reason
    full = run_planner("mist", tiny())
    assert full.plan is not None and not full.plan.extra["budget_exhausted"]
    assert full.plan.extra["milps"] >= 1


def test_pareto_pruning_keeps_the_optimum():
    pr = tiny("tiny_gpt", 8, 16, flat=True)
    space = declare(pr).with_(placements=(mist.PLACEMENT,))
    v = Variant(2, True)
    tab = mist.stage_table(pr, space, layer_table(pr, v, space.recompute_modes), v, 2, 2)
    sub = mist.prune(tab)
    assert sum(map(len, sub.n)) < sum(map(len, tab.n))
    for j in range(sub.p):  # every kept candidate fits and is not dominated within its count
        assert (sub.mem[j] <= tab.hbm).all()
        for k in range(len(sub.n[j])):
            same = sub.n[j] == sub.n[j][k]
            dom = same & (sub.t[j] <= sub.t[j][k]) & (sub.u[j] <= sub.u[j][k])
            assert dom.sum() == 1
    assert mist.solve_milp(tab)[0] == mist.brute_force(tab)[0]


@pytest.mark.parametrize("model,n", [("llama2_7b", 64), ("mixtral_8x7b", 128),
                                     ("bert_large", 256)])
def test_no_better_than_nest_on_figure5_points(model, n):
    pr = make_problem(model, "tpuv4_fattree", n)
    out, nest = run_planner("mist", pr), run_planner("nest", pr)
    assert out.evaluation.feasible and math.isfinite(out.evaluation.time_per_batch_s)
    assert out.evaluation.time_per_batch_s >= nest.evaluation.time_per_batch_s * (1 - 1e-12)


def test_figure7_mixtral_128_choice_is_the_flat_optimum_not_a_search_miss():
    """Figure 7, Mixtral-8x7B on 128 H100s (spine-leaf): Mist picks pp 1, ep 8, cp 2, 1.5x slower
    than NEST on the real network. NEST's plan lies in Mist's space (every device, one variant,
    replica-major), and Mist's own (flat-network) objective scores it no better: the gap is the
    network-blind cost model (ep 8 x cp 2 spreads each all-to-all over two nodes), not a pruned
    or mis-ranked candidate (docs/baselines.md, "Mist-style")."""
    pr = make_problem("mixtral_8x7b", "h100_spineleaf", 128)
    out, nest = run_planner("mist", pr), run_planner("nest", pr)
    plan = nest.plan
    assert plan.placement == mist.PLACEMENT and plan.pp * plan.dp * plan.width == 128
    assert len({(s.tp, s.sp, s.ep, s.cp) for s in plan.stages}) == 1
    flat = mist.flat_problem(pr)
    assert out.plan.predicted_time_per_batch_s == pytest.approx(
        evaluate(out.plan, flat).time_per_batch_s, rel=1e-9)
    assert out.plan.predicted_time_per_batch_s <= evaluate(plan, flat).time_per_batch_s
    assert out.evaluation.time_per_batch_s >= nest.evaluation.time_per_batch_s
    # the exact optimum of the same objective: NEST on the flat network, every d (brute force
    # over Mist's whole space, as test_equals_nest_on_a_flat_network on tiny problems)
    every_d = run_planner("mist", pr, {"full_device_use": False})
    blind = run_planner("nest", flat, {"space": {"placements": [mist.PLACEMENT]}})
    assert every_d.plan.predicted_time_per_batch_s == pytest.approx(
        blind.evaluation.time_per_batch_s, rel=1e-9)


def _stage_table_from_arrays(flat, space, la, v, p, d):
    """The former stage_table: every cell of every stage position priced
    (nest.solver.arrays.stage_arrays), the canonical ranges read from it."""
    from nest.costs.memory import peak
    from nest.costs.pipeline import bottleneck_weight, held_bytes, solver_form, stash
    from nest.costs.stage import Options, fixed_and_step_bytes
    from nest.solver.arrays import stage_arrays

    hw = flat.cluster.hardware
    L = flat.graph.num_layers
    nb = L - 2
    R = len(space.recompute_modes)
    arr = stage_arrays(flat, space, la, v, p, d, mist.PLACEMENT)
    m = arr.num_microbatches
    fixed_LLO, step_LLZ = fixed_and_step_bytes(flat, la, d, Options(space.zero_stages, la.modes))
    fixed_LLO = fixed_LLO.reshape(L, L, -1)
    step_LLO = np.repeat(step_LLZ[..., 0], len(la.modes), axis=-1)
    act_LLO = np.tile(la.act_LLR, (1, 1, len(space.zero_stages)))
    O = fixed_LLO.shape[-1]
    zi_O = np.arange(O) // R
    form = solver_form(flat.training)
    out = mist.StageTable([], [], [], [], [], nb, bottleneck_weight(form, m, p), hw.hbm_bytes,
                          form=form)
    if arr.tail_JLLO is not None and form == "paper":
        out.e, out.r = [], []
    for j in range(p):
        ns = np.array(mist.count_range(j, p, nb))
        ab = np.array([mist.canonical_range(j, p, n, nb) for n in ns])
        a, b = ab[:, 0], ab[:, 1]
        mem = peak(held_bytes(fixed_LLO[b, a], stash(p, j, m), act_LLO[b, a], step_LLO[b, a]),
                   hw)
        out.n.append(np.repeat(ns, O))
        out.o.append(np.tile(np.arange(O), len(ns)))
        out.t.append(arr.t_JLLO[j, b, a].reshape(-1))
        out.u.append(arr.u_JLLZ[j, b, a][:, zi_O].reshape(-1))
        out.mem.append(mem.reshape(-1))
        if out.e is not None:
            out.e.append(arr.tail_JLLO[j, b, a].reshape(-1))
            out.r.append(arr.drain_JLLO[j, b, a].reshape(-1))
    return out


@pytest.mark.parametrize("model,n,batch,overlap", [("tiny_gpt", 8, 16, "none"),
                                                   ("tiny_moe", 8, 16, "none"),
                                                   ("tiny_llama", 8, 64, "stage"),
                                                   ("tiny_moe", 8, 16, "bucketed")])
def test_stage_table_at_its_cells_equals_the_whole_grid(model, n, batch, overlap):
    """stage_table prices only the cells Mist reads (stage_cost from_grid at canonical_range's
    cells): every array equals, byte for byte, the one read from every cell of the grid
    (stage_arrays), for every (variant, p, d) with p up to 4, with the overlapped tail too, on
    the flat network Mist prices and on the real one (sends between levels)."""
    from dataclasses import replace

    checked = 0
    for flat in (True, False):
        pr = tiny(model, n, batch, flat=flat)
        pr = pr.with_training(replace(pr.training, dp_overlap=overlap))
        space = declare(pr, {"max_pp": 4}).with_(placements=(mist.PLACEMENT,))
        for v in space.variants:
            la = layer_table(pr, v, space.recompute_modes)
            for p in range(1, 5):
                for d in range(1, n // (p * v.width) + 1):
                    got = mist.stage_table(pr, space, la, v, p, d)
                    ref = _stage_table_from_arrays(pr, space, la, v, p, d)
                    assert (got.e is None) == (ref.e is None)
                    assert (got.C, got.form, got.num_blocks) == (ref.C, ref.form, ref.num_blocks)
                    for name in ("n", "o", "t", "u", "mem", "e", "r"):
                        x, y = getattr(got, name), getattr(ref, name)
                        if y is None:
                            continue
                        assert len(x) == len(y) == p, name
                        for xj, yj in zip(x, y):
                            assert xj.shape == yj.shape and xj.tobytes() == yj.tobytes(), name
                    checked += 1
    assert checked > 20
