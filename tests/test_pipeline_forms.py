"""The evaluator's closed-form schedule times against the discrete-event simulation, on random
plans of catalog models (random variant, p, d, cuts, ZeRO stages, recomputation, placement).

Facts checked (nest.problem.evaluate.pipeline_time_s / sync_tail_s, nest.costs.pipeline critical_path_1f1b, nest.costs.simulate):
  * `critical_path` is within 1% of the simulated time per batch and never above it;
  * `paper`, (m + p - 1) max_j t_j, is never below the simulation and equals it when every stage
    takes the same time;
  * with gradient-sync overlap (`stage`, `bucketed`) the closed-form tail never undercuts the
    simulated one, and overlap never makes a batch slower than no overlap.
"""

import numpy as np
import pytest

from nest.problem.evaluate import evaluate, make_problem
from nest.spec.settings import load_training
from nest.problem.space import declare, make_plan, pp_dp_options

# (model, cluster, devices, global batch): the paper's batch gives m >> p; a batch of 64 (as in
# Korthikanti et al. 2022) gives m ~ p, where fill and drain weigh most
CASES = [("llama2_7b", "tpuv4_fattree", 64, 4096), ("gpt3_175b", "h100_spineleaf", 128, 4096),
         ("mixtral_8x7b", "dgx_h100_superpod", 128, 4096), ("bert_large", "dgx_a100", 64, 4096),
         ("llama3_70b", "tpuv4_fattree", 256, 4096), ("gpt3_175b", "dgx_a100", 64, 64),
         ("llama2_7b", "h100_spineleaf", 128, 128)]


def _random_plans(model, cluster, n, count, seed, global_batch=4096):
    tr = load_training().with_(global_batch=global_batch)
    pr = make_problem(model, cluster, n, training=tr)
    space = declare(pr)
    rng = np.random.default_rng(seed)
    L = pr.graph.num_layers
    out = []
    while len(out) < count:
        v = space.variants[rng.integers(len(space.variants))]
        opts = [(p, d) for p, d in pp_dp_options(pr, space, v) if p <= min(L, 16)]
        p, d = opts[rng.integers(len(opts))]
        cuts_at = np.sort(rng.choice(np.arange(1, L), size=p - 1, replace=False))
        bounds = [0, *cuts_at.tolist(), L]
        cuts = [(bounds[i], bounds[i + 1] - 1) for i in range(p)]
        zero = [int(rng.choice(space.zero_stages)) for _ in range(p)]
        rec = [str(rng.choice(space.recompute_modes)) for _ in range(p)]
        placement = str(rng.choice(space.placements))
        out.append(make_plan(pr, "random", v, p, d, cuts, zero, rec, placement))
    return pr, out


def _with(pr, **kw):
    return pr.with_training(**kw)


@pytest.mark.parametrize("case", range(len(CASES)))
def test_closed_forms_against_the_simulation_on_random_plans(case):
    model, cluster, n, gb = CASES[case]
    pr, plans = _random_plans(model, cluster, n, 6, seed=case, global_batch=gb)
    for plan in plans:
        sim = evaluate(plan, _with(pr, pipeline_time="simulated"))
        cp = evaluate(plan, _with(pr, pipeline_time="critical_path"), simulated=True)
        paper = evaluate(plan, _with(pr, pipeline_time="paper"))
        des = sim.time_per_batch_s
        assert cp.time_per_batch_simulated_s == pytest.approx(des, rel=1e-12)
        assert des * (1 - 0.01) <= cp.time_per_batch_s <= des * (1 + 1e-9), plan.stages
        assert paper.time_per_batch_s >= des * (1 - 1e-9)
        for ev in (sim, cp, paper):  # the breakdown adds up to the total in every form
            assert sum(ev.breakdown_s.values()) == pytest.approx(ev.time_per_batch_s, rel=1e-9)


@pytest.mark.parametrize("overlap", ["stage", "bucketed"])
def test_sync_overlap_against_the_simulation_on_random_plans(overlap):
    for case, (model, cluster, n, gb) in enumerate(CASES[:3] + CASES[-1:]):
        pr, plans = _random_plans(model, cluster, n, 4, seed=10 + case, global_batch=gb)
        for plan in plans:
            none = evaluate(plan, _with(pr, pipeline_time="simulated"))
            sim = evaluate(plan, _with(pr, pipeline_time="simulated", dp_overlap=overlap))
            closed = evaluate(plan, _with(pr, pipeline_time="critical_path",
                                          dp_overlap=overlap), simulated=True)
            assert closed.time_per_batch_simulated_s == pytest.approx(sim.time_per_batch_s,
                                                                      rel=1e-12)
            pipe = closed.time_per_batch_s - closed.breakdown_s[
                "dp_sync_and_optimizer.exposed"]
            sim_pipe = sim.time_per_batch_s - sim.breakdown_s["dp_sync_and_optimizer.exposed"]
            # the closed tail is an upper bound on the simulated one
            assert closed.time_per_batch_s - pipe >= sim.time_per_batch_s - sim_pipe - 1e-9
            assert sim.time_per_batch_s <= none.time_per_batch_s * (1 + 1e-12)


def test_every_form_agrees_without_a_pipeline():
    """One stage (p = 1): no fill or drain, so every form is m t + sync + step, the simulation
    included (the wiring of evaluate -> nest.costs.simulate, sync and optimizer step after the last
    backward)."""
    from nest.graph.layer_graph import Variant

    pr = _with(make_problem("tiny_gpt", "tiny_cluster", 4), global_batch=16)
    L = pr.graph.num_layers
    plan = make_plan(pr, "h", Variant(), 1, 4, [(0, L - 1)], [0], ["none"], "replica_major")
    ev = evaluate(plan, pr, simulated=True)
    s = ev.stages[0]
    by_hand = plan.num_microbatches * s.time_per_microbatch_s + s.sync_s + s.optimizer_s
    assert ev.time_per_batch_s == pytest.approx(by_hand, rel=1e-12)
    assert ev.time_per_batch_simulated_s == pytest.approx(by_hand, rel=1e-12)


def test_stage_overlap_by_hand(small_batch):
    """dp_overlap: stage. Stage j syncs after its own last backward while the last micro-batch's
    gradient still drains through stages j-1..0 (at least D_j = sum_{k<j} b_k), so the tail is
    max_j max(0, S_j + O_j - D_j) (nest.costs.pipeline.dp_sync_tail_s); none: max_j (S_j + O_j)."""
    from nest.graph.layer_graph import Variant

    pr = make_problem("tiny_gpt", "tiny_cluster", 4, training=small_batch)
    plan = make_plan(pr, "h", Variant(), 2, 2, [(0, 2), (3, 5)], [0, 0], ["none", "none"],
                     "replica_major")
    none = evaluate(plan, pr)
    st = none.stages
    b0 = st[0].bwd_s  # stage 0 sends nothing backward
    pipe = none.time_per_batch_s - max(s.sync_s + s.optimizer_s for s in st)
    staged = evaluate(plan, _with(pr, dp_overlap="stage"))
    tail = max(st[0].sync_s + st[0].optimizer_s, st[1].sync_s + st[1].optimizer_s - b0, 0.0)
    assert staged.time_per_batch_s == pytest.approx(pipe + tail, rel=1e-12)
    assert staged.time_per_batch_s <= none.time_per_batch_s
