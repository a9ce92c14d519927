"""Closed-form pipeline schedules (nest.costs.pipeline) against the discrete-event simulation."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nest.costs.pipeline import (bubble_fraction, stage_time_s, stashes, time_1f1b_s,
                                 time_gpipe_s, time_interleaved_s)
from nest.costs.pipeline import dp_sync_exposed_s, dp_sync_tail_s
from nest.costs.simulate import plot_timeline, simulate


@pytest.mark.parametrize("p, m", [(1, 1), (1, 5), (3, 1), (4, 4), (4, 16), (8, 32), (5, 7)])
def test_equal_stages_des_equals_every_closed_form(p, m):
    F, B = [1.5] * p, [3.0] * p
    r = simulate("1f1b", F, B, m)
    assert r.makespan_s == pytest.approx((m + p - 1) * 4.5, rel=1e-12)
    for form in ("paper", "dapple", "critical_path"):
        assert time_1f1b_s(F, B, m, form=form) == pytest.approx(r.makespan_s, rel=1e-12)
    g = simulate("gpipe", F, B, m)
    assert g.makespan_s == pytest.approx(time_gpipe_s(F, B, m), rel=1e-12)
    assert g.makespan_s == pytest.approx(r.makespan_s, rel=1e-12)
    # GPipe's bubble share is (p - 1) / (m + p - 1)
    assert g.bubble_fraction() == pytest.approx((p - 1) / (m + p - 1), abs=1e-12)
    assert bubble_fraction("gpipe", p, m) == pytest.approx((p - 1) / (m + p - 1))


@pytest.mark.parametrize("p, m, v", [(2, 4, 2), (4, 4, 2), (4, 8, 2), (4, 16, 4), (8, 16, 2),
                                     (4, 8, 3)])
@pytest.mark.parametrize("F, B", [(1.0, 2.0), (1.0, 1.0)])
def test_interleaved_reduces_the_bubble_by_v(p, m, v, F, B):
    r = simulate("interleaved", [F] * p, [B] * p, m, num_chunks=v)
    # Narayanan et al. 2021b: bubble (p - 1)(F + B) / v instead of (p - 1)(F + B)
    assert r.makespan_s == pytest.approx(m * (F + B) + (p - 1) * (F + B) / v, rel=1e-12)
    assert r.makespan_s == pytest.approx(time_interleaved_s([F] * p, [B] * p, m, v), rel=1e-12)
    plain = simulate("1f1b", [F] * p, [B] * p, m)
    assert (plain.makespan_s - m * (F + B)) == pytest.approx(v * (r.makespan_s - m * (F + B)))
    assert r.bubble_fraction() == pytest.approx(bubble_fraction("interleaved", p, m, v))


@pytest.mark.parametrize("schedule, p, m, v", [("1f1b", 4, 3, 1), ("1f1b", 4, 10, 1),
                                               ("gpipe", 3, 6, 1), ("interleaved", 4, 8, 2),
                                               ("interleaved", 4, 4, 2), ("interleaved", 3, 9, 3)])
def test_stash_matches_the_simulation(schedule, p, m, v):
    r = simulate(schedule, [1.0] * p, [2.0] * p, m, num_chunks=v)
    assert r.stash_microbatches() == pytest.approx(stashes(schedule, p, m, v))
    if schedule == "1f1b":
        assert r.peak_in_flight == [min(p - j, m) for j in range(p)]  # the evaluator's stash
    if schedule == "interleaved" and m > p:  # first stage: p + (p - 1) / v (Korthikanti 2022)
        assert r.stash_microbatches()[0] == pytest.approx(p + (p - 1) / v)


@st.composite
def plans(draw, max_p=10):
    p = draw(st.integers(1, max_p))
    m = draw(st.integers(4 * p, 8 * p))
    spread = draw(st.sampled_from([0.1, 0.5, 1.0, 2.0]))
    unit = st.floats(0.0, 1.0)
    F = np.array([1 + spread * draw(unit) for _ in range(p)])
    B = F * np.array([1.5 + 2 * draw(unit) for _ in range(p)])
    sends = draw(st.booleans())
    sf = np.array([0.3 * draw(unit) * sends for _ in range(p)])
    sb = np.array([0.3 * draw(unit) * sends for _ in range(p)])
    return p, m, F, B, sf, sb


@settings(max_examples=150, deadline=None)
@given(plans())
def test_1f1b_closed_forms_bracket_the_simulation(plan):
    p, m, F, B, sf, sb = plan
    des = simulate("1f1b", F, B, m, send_fwd_s=sf, send_bwd_s=sb).makespan_s
    tight = time_1f1b_s(F, B, m, sf, sb, form="critical_path")
    assert des * (1 - 0.01) <= tight <= des * (1 + 1e-9)  # within 1%, never above
    for form in ("dapple", "paper"):  # upper bounds (up to ~6% / ~18% above)
        assert time_1f1b_s(F, B, m, sf, sb, form=form) >= des * (1 - 1e-9)
    t = stage_time_s(F, B, sf, sb)
    assert time_1f1b_s(F, B, m, sf, sb) == pytest.approx((m + p - 1) * t.max())


@settings(max_examples=60, deadline=None)
@given(plans())
def test_gpipe_closed_form_is_exact(plan):
    p, m, F, B, sf, sb = plan
    des = simulate("gpipe", F, B, m, send_fwd_s=sf, send_bwd_s=sb).makespan_s
    assert time_gpipe_s(F, B, m, sf, sb) == pytest.approx(des, rel=1e-9)


def test_dp_sync_exposed_by_hand():
    # k = 4 buckets of 1 s, window 8 s: the network keeps up, only the last bucket is exposed
    assert dp_sync_exposed_s(4.0, 8.0, 4) == pytest.approx(1.0)
    # window 2 s: buckets go out back to back from 0.5 s: 0.5 + 4 - 2 = 2.5 s after the window
    assert dp_sync_exposed_s(4.0, 2.0, 4) == pytest.approx(4 - 2 * 3 / 4)
    assert dp_sync_exposed_s(4.0, 8.0, 1) == 4.0  # one bucket: nothing overlaps


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
@pytest.mark.parametrize("overlap", ["none", "stage", "bucketed"])
def test_dp_sync_tail_matches_the_simulation(schedule, overlap):
    p, m = 4, 16
    kw = dict(num_buckets=4, recompute_s=[0.5] * p)
    # equal stages: exact
    F, B, s = [1.0] * p, [2.0] * p, [0.1] * p
    S = [9.0, 1.0, 5.0, 7.0]
    r = simulate(schedule, F, B, m, send_fwd_s=s, send_bwd_s=s, sync_s=S, overlap=overlap, **kw)
    tail = dp_sync_tail_s(S, F, B, s, s, overlap=overlap, schedule=schedule,
                          num_microbatches=m, **kw)
    assert r.makespan_s - r.pipeline_s == pytest.approx(tail, abs=1e-12)
    # unequal stages: an upper bound for 1F1B, exact for GPipe
    rng = np.random.default_rng(7)
    for _ in range(20):
        F = rng.uniform(1, 2, p)
        B = 2 * F * rng.uniform(0.5, 1.5, p)
        S = rng.uniform(0, 3 * B.max(), p)
        r = simulate(schedule, F, B, m, send_fwd_s=s, send_bwd_s=s, sync_s=S, overlap=overlap,
                     **kw)
        tail = dp_sync_tail_s(S, F, B, s, s, overlap=overlap, schedule=schedule,
                              num_microbatches=m, **kw)
        des = r.makespan_s - r.pipeline_s
        if schedule == "gpipe" or overlap == "none":
            assert tail == pytest.approx(des, abs=1e-9)
        else:
            assert tail >= des - 1e-9


def test_timeline_is_consistent_and_plots(tmp_path):
    p, m = 4, 8
    r = simulate("1f1b", [1, 1.2, 0.9, 1.1], [2, 2.1, 1.9, 2.5], m, send_fwd_s=0.1,
                 send_bwd_s=0.1, sync_s=[1.0] * p, overlap="bucketed", num_buckets=2)
    assert len([op for op in r.timeline if op.kind in "FB"]) == 2 * p * m
    for d in range(p):  # one op at a time per device
        ops = sorted((op for op in r.timeline if op.stage == d and op.kind != "sync"),
                     key=lambda op: op.start_s)
        assert all(a.end_s <= b.start_s + 1e-12 for a, b in zip(ops, ops[1:]))
    # forward of micro-batch i on stage j starts after it left stage j - 1
    end = {(op.kind, op.stage, op.microbatch): op.end_s for op in r.timeline}
    for op in r.timeline:
        if op.kind == "F" and op.stage > 0:
            assert op.start_s >= end[("F", op.stage - 1, op.microbatch)] - 1e-12
    fig = plot_timeline(r, tmp_path / "timeline.png")
    assert (tmp_path / "timeline.png").stat().st_size > 0 and (tmp_path / "timeline.pdf").exists()
    fig.clf()
    ri = simulate("interleaved", [1.0] * 2, [2.0] * 2, 4, num_chunks=2)
    plot_timeline(ri, tmp_path / "interleaved.png").clf()


def test_bad_input_is_a_value_error():
    with pytest.raises(ValueError, match="multiple"):
        simulate("interleaved", [1.0] * 4, [2.0] * 4, 6, num_chunks=2)
    with pytest.raises(ValueError, match="schedule"):
        simulate("zb", [1.0], [2.0], 4)
    with pytest.raises(ValueError, match="form"):
        time_1f1b_s([1.0], [2.0], 4, form="nope")
