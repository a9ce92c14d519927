"""MCMC baseline: its incremental score == the shared evaluator; its moves keep plans valid and
change one decision; with a large budget it reaches the exhaustive optimum; never beats NEST."""

import math
import random
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from baselines.mcmc import (MOVES, Chain, Scorer, State, acceptance, data_parallel_state,
                            manual_state, to_plan)
from nest.common.errors import SpecError
from nest.problem.evaluate import evaluate, make_problem
from nest.planners.registry import run_planner
from nest.spec.settings import TrainingSettings
from nest.problem.space import declare, pp_dp_options

A = {"zero_stages": [0, 1], "recompute_modes": ["none", "full"]}
B = {"zero_stages": [0], "recompute_modes": ["none", "selective", "full"]}


def tiny(model: str, n: int = 4, hbm_scale: float = 1.0, batch: int = 8):
    """A tiny problem; hbm_scale < 1 makes memory bind, so pipelines and memory knobs win."""
    pr = make_problem(model, "tiny_cluster", n, training=TrainingSettings(global_batch=batch))
    if hbm_scale != 1.0:
        pr = pr.with_hardware(hbm_bytes=pr.hardware.hbm_bytes * hbm_scale)
    return pr


def chain_for(pr, space_overrides=None, seed=0):
    space = declare(pr, space_overrides)
    return space, Chain(pr, space, Scorer(pr, space), random.Random(seed), 50.0, 10.0)


def walk(chain, steps, restart_every=5):
    """Random states and their neighbours (a restart every few steps to visit varied shapes)."""
    s = chain.random_state()
    for i in range(steps):
        if i % restart_every == 0:
            s = chain.random_state()
        else:
            s = chain.propose(s) or s
        yield s


# ---------------------------------------------------------------------------------------------
# The score is the evaluator's
# ---------------------------------------------------------------------------------------------


@settings(max_examples=12, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(["tiny_gpt", "tiny_llama", "tiny_moe"]), st.sampled_from([4, 8]),
       st.sampled_from([1.0, 0.15]), st.integers(0, 1000))
def test_score_equals_evaluator_tiny(model, n, hbm_scale, seed):
    pr = tiny(model, n, hbm_scale)
    space, chain = chain_for(pr, seed=seed)
    for s in walk(chain, 25):
        T, excess = chain.scorer.score(s)
        ev = evaluate(to_plan(pr, space, s), pr)
        assert T == pytest.approx(ev.time_per_batch_s, rel=1e-9)
        assert (excess == 0) == ev.feasible
        if not ev.feasible:  # excess = summed relative overflow, from the evaluator's stages
            over = sum(x.peak_memory_bytes / pr.cluster.hardware.hbm_bytes - 1
                       for x in ev.stages if x.peak_memory_bytes > pr.cluster.hardware.hbm_bytes)
            assert excess == pytest.approx(over, rel=1e-9)


@pytest.mark.parametrize("model,n", [("bert_large", 128), ("mixtral_8x7b", 64),
                                     ("llama3_70b", 256)])
def test_score_equals_evaluator_real(model, n):
    pr = make_problem(model, "tpuv4_fattree", n)
    space, chain = chain_for(pr, seed=n)
    for s in walk(chain, 20, restart_every=4):
        T, excess = chain.scorer.score(s)
        ev = evaluate(to_plan(pr, space, s), pr)
        assert T == pytest.approx(ev.time_per_batch_s, rel=1e-9)
        assert (excess == 0) == ev.feasible


# ---------------------------------------------------------------------------------------------
# Moves
# ---------------------------------------------------------------------------------------------


def classify(chain, s: State, t: State) -> str:
    """Which single decision t changes relative to s (a move name), or raise AssertionError."""
    changed = {f for f in ("vi", "p", "d", "pl", "bounds", "zero", "rec")
               if getattr(s, f) != getattr(t, f)}
    w = chain.space.variants
    rescaled = chain.fit_d(t.vi, max(1, min(chain.dmax(t.vi, t.p), s.p * s.d * w[s.vi].width
                                            // (t.p * w[t.vi].width))))
    assert chain.ok_d(t.vi, t.d)  # every state splits the global batch exactly
    if changed == {"bounds"}:
        diff = [(a, b) for a, b in zip(s.bounds, t.bounds) if a != b]
        assert len(diff) == 1 and abs(diff[0][0] - diff[0][1]) == 1
        return "cut"
    if changed in ({"zero"}, {"rec"}):
        f = changed.pop()
        assert sum(a != b for a, b in zip(getattr(s, f), getattr(t, f))) == 1
        return "zero" if f == "zero" else "recompute"
    if changed == {"d"}:
        assert t.d in (s.d - 1, s.d + 1, 2 * s.d, s.d // 2, chain.dmax(s.vi, s.p))
        return "dp"
    if changed == {"pl"}:
        return "placement"
    if "vi" in changed:
        assert changed <= {"vi", "d"} and t.d == rescaled
        return "variant"
    assert "p" in changed and changed <= {"p", "d", "bounds", "zero", "rec"} and t.d == rescaled
    if t.p == s.p + 1:
        assert set(s.bounds) < set(t.bounds)
        return "split"
    assert t.p == s.p - 1 and set(t.bounds) < set(s.bounds)
    return "merge"


@pytest.mark.parametrize("model,cluster,n,space", [
    ("tiny_moe", "tiny_cluster", 8, None),  # 4 variants (ep x cp)
    ("tiny_gpt", "tiny_cluster", 8, A),  # tp / sp variants, a restricted space
    ("gpt3_175b", "tpuv4_fattree", 64, None),  # 98 layers, widths 1, 4, 8
])
def test_moves_keep_plans_valid_and_change_one_decision(model, cluster, n, space):
    training = TrainingSettings(global_batch=8) if model.startswith("tiny") else None
    pr = make_problem(model, cluster, n, training=training)
    sp, chain = chain_for(pr, space, seed=3)
    L = pr.graph.num_layers
    options = {vi: set(pp_dp_options(pr, sp, v)) for vi, v in enumerate(sp.variants)}
    seen = set()
    s = chain.random_state()
    for i in range(1500):
        t = chain.propose(s)
        if t is None:
            continue
        assert (t.p, t.d) in options[t.vi]  # inside the declared space
        assert len(t.bounds) == t.p - 1 and len(t.zero) == len(t.rec) == t.p
        assert list(t.bounds) == sorted(set(t.bounds)) and all(0 < b < L for b in t.bounds)
        assert t.pl in range(len(sp.placements)) and max(t.zero) < len(sp.zero_stages)
        assert max(t.rec) < len(sp.recompute_modes)
        seen.add(classify(chain, s, t))
        if i % 50 == 0:  # the plan is valid under the contract (evaluate checks the structure)
            evaluate(to_plan(pr, sp, t), pr)
        s = t if i % 300 else chain.random_state()
    assert seen == set(MOVES)


def test_split_keeps_knobs_and_devices():
    pr = tiny("tiny_llama", 8)
    sp, chain = chain_for(pr)
    s = State(0, 2, 4, 0, (3,), (0, 1), (0, 2))  # 2 stages x 4 replicas on 8 devices
    for _ in range(200):
        t = chain.propose(s)
        if t is not None and t.p == 3:  # a split: both halves keep the split stage's knobs
            k = [i for i, b in enumerate(t.bounds) if b not in s.bounds][0]
            j = k if t.bounds[k] > s.bounds[0] else 0  # the stage that was split
            assert t.zero == s.zero[:j + 1] + s.zero[j:] and t.rec == s.rec[:j + 1] + s.rec[j:]
            assert t.d == 8 // 3  # the same 8 devices, floor
            return
    raise AssertionError("no split proposed")


def test_split_then_merge_restores_d_when_exact():
    pr = tiny("tiny_gpt", 8)
    sp, chain = chain_for(pr)
    s = State(0, 1, 8, 0, (), (1,), (2,))
    split = replace(s, p=2, d=chain.rescale(s, 0, 2), bounds=(3,), zero=(1, 1), rec=(2, 2))
    assert split.d == 4 and chain.rescale(split, 0, 1) == 8
    assert sp.variants[1].width == 2 and chain.rescale(s, 1, 1) == 4  # tp = 2: half the replicas


def test_acceptance_rule():
    assert acceptance(1.0, 0.5, 50.0) == 1.0 and acceptance(1.0, 1.0, 50.0) == 1.0
    assert acceptance(1.0, 1.01, 50.0) == pytest.approx(math.exp(-0.5))
    # relative: the same 1% step is as likely on a 100 s plan as on a 1 s plan
    assert acceptance(100.0, 101.0, 50.0) == pytest.approx(acceptance(1.0, 1.01, 50.0))


def test_infeasible_plans_are_penalised():
    pr = tiny("tiny_llama", 4, hbm_scale=0.1)
    sp, chain = chain_for(pr, A)
    s = data_parallel_state(chain, sp)
    e, T, excess = chain.energy(s)
    assert excess > 0 and e == pytest.approx(T * (2 + 10.0 * excess))
    assert not evaluate(to_plan(pr, sp, s), pr).feasible


# ---------------------------------------------------------------------------------------------
# Starts
# ---------------------------------------------------------------------------------------------


def test_data_parallel_start():
    pr = tiny("tiny_moe", 8)
    sp, chain = chain_for(pr)
    s = data_parallel_state(chain, sp)
    assert (s.p, s.d, sp.variants[s.vi].width) == (1, 8, 1)


def test_manual_start_is_the_manual_plan():
    pr = make_problem("gpt3_175b", "tpuv4_fattree", 256)
    sp, chain = chain_for(pr)
    mine = to_plan(pr, sp, manual_state(pr, chain, sp))
    ref = run_planner("manual", pr).plan
    assert mine.stages == ref.stages and (mine.pp, mine.dp, mine.tp, mine.sp, mine.ep) == (
        ref.pp, ref.dp, ref.tp, ref.sp, ref.ep)
    # GPT-3's Manual config 32/1/4 needs 128 devices: no Manual start at 64
    small = make_problem("gpt3_175b", "tpuv4_fattree", 64)
    sp64, chain64 = chain_for(small)
    assert manual_state(small, chain64, sp64) is None


# ---------------------------------------------------------------------------------------------
# The search
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("model,hbm_scale,space", [("tiny_llama", 0.1, A), ("tiny_llama", 0.15, B),
                                                   ("tiny_moe", 0.1, A), ("tiny_gpt", 0.1, B)])
def test_large_budget_reaches_the_exhaustive_optimum(model, hbm_scale, space):
    """Memory binds, so the optimum is a pipeline with per-stage knobs; random starts only."""
    pr = tiny(model, 4, hbm_scale)
    ex = run_planner("exhaustive", pr, {"space": space})
    assert ex.plan.pp >= 2
    mc = run_planner("mcmc", pr, {"space": space, "starts": [], "budget": 5000})
    assert mc.evaluation.feasible
    assert mc.evaluation.time_per_batch_s == pytest.approx(ex.evaluation.time_per_batch_s,
                                                           rel=1e-9)
    assert mc.plan.predicted_time_per_batch_s == pytest.approx(mc.evaluation.time_per_batch_s,
                                                               rel=1e-12)


def test_deterministic_and_budgeted():
    pr = tiny("tiny_moe", 8, batch=32)
    a = run_planner("mcmc", pr, {"budget": 300})
    b = run_planner("mcmc", pr, {"budget": 300})
    assert a.plan.with_(solve_time_s=None) == b.plan.with_(solve_time_s=None)
    assert a.plan.notes == b.plan.notes
    used = int(a.plan.notes.split(" proposals")[0].split()[-1])
    assert used <= 10 * 300


def test_budget_exhaustion_is_reported_and_wall_clock_caps_are_refused():
    out = run_planner("mcmc", tiny("tiny_llama", 4), {"budget": 1, "chains": 2})
    assert out.evaluation.feasible and out.plan.extra["budget_exhausted"]
    assert out.plan.extra["proposals"] == 2  # the starts count as one proposal each
    with pytest.raises(SpecError, match="wall-clock caps were removed"):
        run_planner("mcmc", tiny("tiny_llama", 4), {"time_limit_s": 10})


def test_no_plan_names_the_closest():
    out = run_planner("mcmc", tiny("tiny_llama", 4, hbm_scale=0.03), {"budget": 200})
    assert out.plan is None
    assert "no chain found a plan that fits" in out.reason and "out of memory" in out.reason


@pytest.mark.parametrize("model,n", [("llama2_7b", 64), ("gpt3_175b", 64), ("mixtral_8x7b", 64)])
def test_valid_feasible_and_no_better_than_nest(model, n):
    pr = make_problem(model, "tpuv4_fattree", n)
    mc = run_planner("mcmc", pr)
    ne = run_planner("nest", pr)
    assert mc.evaluation.feasible, mc.reason
    assert mc.evaluation.time_per_batch_s >= ne.evaluation.time_per_batch_s * (1 - 1e-9)


@pytest.mark.parametrize("model,cluster,n,overlap", [("tiny_moe", "tiny_cluster", 8, "none"),
                                                     ("mixtral_8x7b", "h100_spineleaf", 96,
                                                      "none"),
                                                     ("mixtral_8x7b", "h100_spineleaf", 96,
                                                      "stage")])
def test_cells_equal_the_kernel_per_cell(model, cluster, n, overlap):
    """The Scorer looks a state's stages' group terms up once per stage and hands each cell its
    stage's, and a cell's position-free terms once per (variant, d, group terms' content,
    knobs, layers), shared by the stages that price alike at other positions: every cell it
    prices equals, bit for bit, stage_cost looking everything up itself (per cell) on a fresh
    problem (with the overlapped sync's tail terms too)."""
    from baselines.mcmc import Cell
    from nest.costs.layers import layer_table
    from nest.costs.pipeline import links, stash
    from nest.costs.stage import Options, stage_cost
    from nest.problem.plan import place

    tr = TrainingSettings(global_batch=64, dp_overlap=overlap)
    pr = make_problem(model, cluster, n, training=tr)
    space, chain = chain_for(pr, seed=3)
    for s in walk(chain, 150, restart_every=6):
        chain.scorer.score(s)
    fresh = make_problem(model, cluster, n, training=tr)
    sc, seen = chain.scorer, set()
    for (vi, p, d, pl, j, a, b, z, r), cell in sc.cells.items():
        v = space.variants[vi]
        ids = place(p, d, v.width, space.placements[pl])
        m = fresh.num_microbatches(d, v.ep)
        c = stage_cost(fresh, layer_table(fresh, v, space.recompute_modes), ids[j], d,
                       Options((space.zero_stages[z],), (space.recompute_modes[r],)),
                       stash(p, j, m), cell=(a, b), **links(ids, j))
        mem = float(c.mem[0, 0])
        want = Cell(float(c.t[0, 0]), float(c.u[0]), mem / sc.hbm - 1.0 if mem > sc.hbm else 0.0,
                    None if c.tail is None else float(c.tail[0, 0]),
                    None if c.drain is None else float(c.drain[0, 0]))
        assert (cell.t, cell.u, cell.excess, cell.e, cell.r) == (want.t, want.u, want.excess,
                                                                  want.e, want.r)
        seen.add(sc.gts[(vi, p, d, pl)][j].content)
    assert len(sc.cells) > 50 and len(seen) > 1  # stages whose group terms differ
    assert len(sc.terms) < len(sc.cells)  # cells sharing their position-free terms
    assert (overlap != "none") == any(c.e is not None for c in sc.cells.values())
