"""overlap_p2p_comm: the interleaved schedule's pipeline sends under compute (Megatron-Core's
forward_backward_pipelining_with_interleaving; nest.costs.pipeline.interleaved_busy).

Facts checked, each computed another way:
  * the sends a device group still waits for, counted by hand on two tiny schedules from
    Megatron-Core's warm-up count 2 (p - d - 1) + (v - 1) p (its warm-up forwards' and cool-down
    backwards' sends; chunk 0 of group 0 sends no gradient, the last chunk of the last group no
    activation);
  * the simulation: each group's operations are busy for m x compute + those sends exactly; the
    batch is never longer than with blocking sends, never below the floor, and equal to the
    blocking one without sends; a steady send longer than two operations holds the third;
  * the evaluator's paper form on a tiny interleaved plan equals (m + (p - 1) / v) max_d
    (compute_d + hand-counted sends / m) + the sync tail;
  * the interleaved search with the setting on equals scoring every plan (paper and
    critical_path forms); device_time_bounds and the placement floors stay below the evaluator;
  * the setting is off by default, a flag of plan / compare / evaluate, and the export states
    the priced behaviour to Megatron-LM (whose default overlaps).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import numpy as np
import pytest

from nest.costs.pipeline import (exposed_sends, interleaved_chunk_sends, interleaved_floor,
                                 interleaved_order)
from nest.costs.simulate import simulate


def _sums(a, b, p, v):
    """Each group's sums of per-operation sends a (activation) and b (gradient), as the stage
    kernel prices them: the last group's last chunk sends no activation, group 0's chunk 0 no
    gradient."""
    SF, SB = np.full(p, v * a), np.full(p, v * b)
    SF[-1] -= a
    SB[0] -= b
    return SF, SB


def test_exposed_sends_counted_by_hand():
    a, b = 0.3, 0.07  # unequal, so a swap of directions shows
    # p 2, v 2, m 4 (8 forwards per group). Group 0: 4 warm-up forwards (chunks 0 0 1 1) send
    # 4 a; cool-down backwards k = 4..7 run chunks 1 1 0 0, chunk 0 sends nothing: 2 b.
    # Group 1: 2 warm-up forwards (chunk 0): 2 a; cool-down k = 6, 7 (chunk 0): 2 b.
    np.testing.assert_allclose(exposed_sends(*_sums(a, b, 2, 2), 4, 2),
                               [4 * a + 2 * b, 2 * a + 2 * b], rtol=1e-12)
    # p 3, v 2, m 6 (12 per group), warm-up 7 / 5 / 3. Group 0: forwards k = 0..6 all send (7 a);
    # cool-down k = 5..11 run chunks 0 1 1 1 0 0 0: 3 b. Group 1: 5 a + 5 b. Group 2: forwards
    # k = 0..2 are chunk 0 (3 a), backwards k = 9..11 chunk 0 (3 b).
    np.testing.assert_allclose(exposed_sends(*_sums(a, b, 3, 2), 6, 2),
                               [7 * a + 3 * b, 5 * a + 5 * b, 3 * a + 3 * b], rtol=1e-12)
    # every forward a warm-up one (m v <= the warm-up): nothing overlaps, every send is waited
    SF, SB = _sums(a, b, 2, 2)
    np.testing.assert_allclose(exposed_sends(SF, SB, 2, 2)[0], 2 * (SF[0] + SB[0]))


def _case(rng):
    p, v = int(rng.integers(2, 5)), int(rng.integers(2, 5))
    m = p * int(rng.integers(1, 5))
    F, B = rng.random(p) + 0.1, 2 * rng.random(p) + 0.2
    SF = rng.random(p) * 0.3 * v
    SB = rng.random(p) * 0.3 * v
    SF[-1] *= (v - 1) / v
    SB[0] *= (v - 1) / v
    return p, v, m, F, B, SF, SB


def _sim(p, v, m, F, B, SF, SB, overlap):
    sf, sb = interleaved_chunk_sends(SF, SB, v)
    return simulate("interleaved", F, B, m, num_chunks=v, send_fwd_s=sf, send_bwd_s=sb,
                    overlap_p2p=overlap)


def test_simulation_busy_is_compute_plus_the_exposed_sends_and_between_the_bounds():
    rng = np.random.default_rng(1)
    for _ in range(150):
        p, v, m, F, B, SF, SB = _case(rng)
        on, off = _sim(p, v, m, F, B, SF, SB, True), _sim(p, v, m, F, B, SF, SB, False)
        busy = np.zeros(p)
        for op in on.timeline:
            busy[op.stage % p] += op.end_s - op.start_s
        np.testing.assert_allclose(busy, m * (F + B) + exposed_sends(SF, SB, m, v), rtol=1e-12)
        assert on.pipeline_s <= off.pipeline_s * (1 + 1e-12)
        t = F + B + SF + SB
        assert float(interleaved_floor(t, SF, SB, m, v, True)) <= on.pipeline_s * (1 + 1e-12)
        zero = _sim(p, v, m, F, B, 0 * SF, 0 * SB, True).pipeline_s
        assert zero == _sim(p, v, m, F, B, 0 * SF, 0 * SB, False).pipeline_s


def test_a_steady_send_longer_than_two_operations_holds_the_third():
    """Megatron-Core waits for a steady operation's send after the compute of the next one of
    its kind (two operations later), so the third one after it starts no earlier than the
    send's end; on random chunk sends that wait binds somewhere (the device idle before it)."""
    rng = np.random.default_rng(0)
    binds = 0
    for _ in range(30):
        p, v = int(rng.integers(2, 5)), int(rng.integers(2, 4))
        m = p * int(rng.integers(2, 6))
        F, B = rng.random(p) + 0.05, 2 * rng.random(p) + 0.05
        sf = rng.random((v, p)) * rng.choice([0.1, 1.0, 5.0])
        sb = rng.random((v, p)) * rng.choice([0.1, 1.0, 5.0])
        sf[v - 1, p - 1] = sb[0, 0] = 0.0  # the silent ends
        sim = simulate("interleaved", F, B, m, num_chunks=v, send_fwd_s=sf, send_bwd_s=sb,
                       overlap_p2p=True)
        for d in range(p):
            ops = sorted((op for op in sim.timeline if op.stage % p == d),
                         key=lambda op: op.start_s)
            order = [(k, c * p + d, i) for k, c, i in interleaved_order(p, m, v, d)]
            assert [(op.kind, op.stage, op.microbatch) for op in ops] == order
            w = min(2 * (p - d - 1) + (v - 1) * p, m * v)
            for i in range(w, 2 * m * v - w - 2):
                op = ops[i]
                s = (sf if op.kind == "F" else sb)[op.stage // p, d]
                assert ops[i + 3].start_s >= op.end_s + s - 1e-12
                binds += (abs(ops[i + 3].start_s - (op.end_s + s)) < 1e-12
                          and ops[i + 3].start_s > ops[i + 2].end_s + 1e-9)
    assert binds > 0


# ---- the evaluator, the floors and the search on tiny problems -------------------------------


def _problem(tmp_path, blocks, n, batch, form="paper", hbm=None, **kw):
    from nest.problem.evaluate import make_problem
    from nest.spec.settings import TrainingSettings
    from tests.test_launchable import tiny8

    pr = make_problem(tiny8(tmp_path, blocks), "tiny_cluster", n,
                      training=TrainingSettings(global_batch=batch, pipeline_time=form,
                                                overlap_p2p_comm=True, **kw))
    return pr.with_hardware(hbm_bytes=hbm) if hbm else pr


def test_paper_form_of_a_tiny_plan_by_hand(tmp_path):
    """p 2, v 2, m 4, equal blocks: the evaluator's time with the setting on is (m + (p - 1) /
    v) max_d (compute_d + X_d / m) + the sync tail, X_0 = 4 a + 2 b, X_1 = 2 a + 2 b (the first
    hand count above), a and b one chunk's sends; off: the blocking form."""
    from nest.problem.evaluate import evaluate
    from nest.problem.space import declare
    from nest.solver.launchable import interleaved_plan

    pr = _problem(tmp_path, 8, 2, 4)
    space = declare(pr, {"zero_stages": [0], "recompute_modes": ["none"]})
    plan = interleaved_plan(pr, space.variants[0], 2, 1, 2, "replica_major", 0, "none")
    assert (plan.pp, plan.virtual_stages, plan.num_microbatches) == (2, 2, 4)
    on = evaluate(plan, pr)
    off = evaluate(plan, pr.with_training(overlap_p2p_comm=False))
    s = on.stages[:2]
    a, b = s[0].send_fwd_s / 2, s[1].send_bwd_s / 2  # each group's sends: 2 a + b, a + 2 b
    assert a > 0 and b > 0
    assert s[1].send_fwd_s == pytest.approx(a) and s[0].send_bwd_s == pytest.approx(b)
    X = [4 * a + 2 * b, 2 * a + 2 * b]
    busy = [x.time_per_microbatch_s - x.send_fwd_s - x.send_bwd_s + X[d] / 4
            for d, x in enumerate(s)]
    tail = max(x.sync_s + x.optimizer_s for x in s)
    assert on.time_per_batch_s == pytest.approx((4 + 1 / 2) * max(busy) + tail, rel=1e-12)
    blocking = (4 + 1 / 2) * max(x.time_per_microbatch_s for x in s) + tail
    assert off.time_per_batch_s == pytest.approx(blocking, rel=1e-12)
    assert on.time_per_batch_s < off.time_per_batch_s
    assert sum(on.breakdown_s.values()) == pytest.approx(on.time_per_batch_s, rel=1e-12)
    assert on.breakdown_s["pipeline_bubble"] >= 0


@pytest.mark.parametrize("form", ["paper", "critical_path"])
def test_floors_stay_below_the_evaluator(tmp_path, form):
    """device_time_bounds <= the evaluator for every interleaved plan and knob (equal to it up to
    the 1e-12 slack under the paper's form), and the placement floor <= device_time_bounds."""
    from nest.problem.evaluate import evaluate
    from nest.problem.space import declare
    from nest.solver.interleaved_screen import placement_floors
    from nest.solver.launchable import device_time_bounds
    from tests.test_speed_exact import interleaved_plans

    pr = _problem(tmp_path, 16, 8, 32, form)
    space = declare(pr, {"zero_stages": [0, 3], "recompute_modes": ["none", "full"],
                         "max_pp": 4, "heterogeneous_stages": False})
    n = equal = 0
    floors = {}
    for var, p, d, v, z, r, cuts, plan in interleaved_plans(pr, space, True):
        if (z, r) != (0, "none"):
            continue
        key = (var, p, d, v, tuple(cuts))
        if key not in floors:
            floors[key] = dict(placement_floors(pr, space, var, p, d, v, cuts))
        lb = device_time_bounds(pr, space, plan)
        assert np.all(floors[key][plan.placement] <= lb)
        for (zi, z2), (ri, r2) in itertools.product(enumerate(space.zero_stages),
                                                    enumerate(space.recompute_modes)):
            q = plan.with_(stages=tuple(replace(s, zero_stage=z2, recompute=r2)
                                        for s in plan.stages))
            T = evaluate(q, pr).time_per_batch_s
            assert lb[zi, ri] <= T
            equal += lb[zi, ri] >= T * (1 - 2e-12)
            n += 1
    assert n > 300
    assert form != "paper" or equal == n


@pytest.mark.parametrize("form", ["paper", "critical_path"])
@pytest.mark.parametrize("blocks,n,batch,hbm", [(8, 4, 8, None), (8, 4, 16, 4e9),
                                                (8, 8, 32, None), (16, 4, 4, 4e9)])
def test_interleaved_search_equals_brute_force(tmp_path, form, blocks, n, batch, hbm):
    from nest.problem.space import declare
    from nest.solver.launchable import launchable_space, search_interleaved
    from tests.test_critical_path_floor import _brute_force_interleaved
    from tests.test_launchable import SPACE

    pr = _problem(tmp_path, blocks, n, batch, form, hbm)
    base = launchable_space(declare(pr, {**SPACE, "heterogeneous_stages": False}), pr)
    T, plan, _ = search_interleaved(pr, base, math.inf)
    bf = _brute_force_interleaved(pr, base)
    assert plan is not None and T == pytest.approx(bf, rel=1e-12)


# ---- the setting's plumbing ---------------------------------------------------------------


def test_setting_is_off_by_default_and_a_flag():
    import argparse

    from nest.interfaces.cli_run import add_training_flags, overrides
    from nest.spec.settings import load_training, training_overrides

    tr = load_training()
    assert tr.overlap_p2p_comm is False
    ap = argparse.ArgumentParser()
    add_training_flags(ap)
    kw = overrides(ap.parse_args(["--overlap-p2p-comm"]))
    assert kw == {"overlap_p2p_comm": True}
    assert training_overrides(tr, kw, "cli").overlap_p2p_comm is True
    assert overrides(ap.parse_args([])) == {}


def test_export_states_the_priced_p2p_behaviour(tmp_path):
    """Megatron-LM overlaps the interleaved sends unless told not to
    (--no-overlap-p2p-communication is store_false on overlap_p2p_comm): an interleaved plan
    priced without the setting exports that flag, with it nothing; 1F1B never. (pp 4: at pp 2
    Megatron-LM interleaves only with overlapped sends, tests/test_export.py)"""
    from nest.interfaces.export import to_megatron
    from nest.problem.space import declare
    from nest.solver.launchable import interleaved_plan

    pr = _problem(tmp_path, 8, 4, 4)
    var = declare(pr, {"zero_stages": [0], "recompute_modes": ["none"]}).variants[0]
    plan = interleaved_plan(pr, var, 4, 1, 2, "replica_major", 0, "none")
    off = pr.with_training(overlap_p2p_comm=False)
    assert "--no-overlap-p2p-communication" not in to_megatron(plan, pr).args
    assert "--no-overlap-p2p-communication" in to_megatron(plan, off).args
    from nest.problem.plan_spec import block_cuts
    from nest.problem.space import make_plan

    flat = make_plan(off, "h", var, 2, 1, block_cuts(8, 2), [0] * 2, ["none"] * 2,
                     "replica_major")
    assert "--no-overlap-p2p-communication" not in to_megatron(flat, off).args
