"""Alpa-E's vectorised inter-operator DP (baselines.alpa_e_dp.CapDP) against the reference loop
(baselines.alpa_e._dp) and the planner's whole t_max search against Alpa's walk on that loop."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from baselines.alpa_e import (DEFAULTS, _dp, _options, _scan_every, dapple, inter_op_dp,
                              split_tables)
from baselines.alpa_e_dp import CapDP
from baselines.alpa_e_ilp import mesh_view
from nest.problem.evaluate import make_problem
from nest.spec.settings import TrainingSettings


def _same(a, b) -> bool:
    return np.float64(a).tobytes() == np.float64(b).tobytes()


def _check_every_cap(T, units, U, caps=None):
    """CapDP's value equals the loop's, bit for bit, at every cap (both combines), and so does
    its backtrack (the value, the stage count and the stages chosen among ties), and the least
    feasible t_max."""
    dp = CapDP(T, units, U)
    if caps is None:
        fin = np.unique(T[np.isfinite(T)])
        caps = [*fin, np.inf, fin[0] / 2 if fin.size else 1.0]
    for cap in caps:
        for combine in (np.add, np.maximum):
            ref = _dp(T, units, U, cap, combine)[0]
            got = dp.value(cap, combine)
            assert _same(got, ref), (cap, combine.__name__, got, ref)
        if cap == np.inf:  # the least feasible t_max, probed from below
            assert _same(dp.least_cap(), _dp(T, units, U, cap, np.maximum)[0])
        ref_v, ref_s, ref_stages = _dp(T, units, U, cap, np.add, backtrack=True)
        got_v, got_s, got_stages = dp.stages(cap)
        assert _same(got_v, ref_v) and got_s == ref_s and got_stages == ref_stages, cap
    return dp


def _layered(L, units, Smax, B, seed, room=3.0):
    """Stage latencies that grow with their layers and shrink with the submesh; a range fits
    memory (finite) only while its layers x its stash min(s, B) are within room x its units, the
    stash rule of alpa_e.stage_times, so T[..., s - 1] is the same for every s >= B."""
    rng = np.random.default_rng(seed)
    lay = rng.uniform(0.5, 1.5, size=L)
    T = np.full((len(units), L, L, Smax), math.inf)
    for x, u in enumerate(units):
        for k in range(L):
            for i in range(k, L):
                for s in range(1, Smax + 1):
                    if (i - k + 1) * (1 + 0.25 * min(s, B)) <= room * u:
                        T[x, k, i, s - 1] = lay[k: i + 1].sum() / u * (1 + 0.01 * min(s, B))
    return T


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_cap_dp_value_is_the_loops_on_random_tables(data):
    """Random tables: stash-like (the same for s >= s0: the sweep), free in s (no sweep), Smax
    below, at or above the DP's bound on stage counts, inf entries, many ties, and sometimes a
    finite entry with i < k (the loop's fall-back)."""
    L = data.draw(st.integers(1, 8))
    units = data.draw(st.sampled_from([[1], [1, 2], [2, 3], [1, 2, 4], [3], [2, 4, 8]]))
    U = data.draw(st.integers(1, 12))
    bound = max(1, min(L, U // min(units)))
    Smax = data.draw(st.sampled_from([bound, max(1, bound - 1), L, 1]))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**31)))
    T = rng.uniform(0.1, 10.0, size=(len(units), L, L, Smax))
    if data.draw(st.booleans()):  # few distinct latencies: ties among stages, x and s
        T = rng.integers(1, 4, size=T.shape).astype(float)
    if data.draw(st.booleans()):  # Alpa's stash: the same table for every s >= s0
        s0 = data.draw(st.integers(1, Smax))
        T[..., s0:] = T[..., s0 - 1: s0]
    T[rng.random(T.shape) < data.draw(st.sampled_from([0.0, 0.2, 0.5]))] = math.inf
    lower = np.tril(np.ones((L, L), dtype=bool), -1)
    T[:, lower, :] = math.inf
    if L > 1 and data.draw(st.integers(0, 9)) == 0:
        T[0, 1, 0, 0] = 0.5  # i < k: the loop reads it, the band does not
    dp = _check_every_cap(T, units, U)
    assert dp.fallback == bool(np.isfinite(T[:, lower, :]).any())


@pytest.mark.parametrize("units", [[1], [1, 2], [2, 1, 3]])
def test_cap_dp_backtracks_ties_as_the_loop(units):
    """Every stage range costs the same (and a second table two values): optima tie in the
    stage count, the submesh and the last layer of a stage; the loop's first s, first x and
    least i are taken."""
    L, U = 7, 5
    T = np.ones((len(units), L, L, L))
    T[:, np.tril_indices(L, -1)[0], np.tril_indices(L, -1)[1], :] = math.inf
    _check_every_cap(T, units, U)
    T2 = np.where(np.isfinite(T), 1.0 + (np.arange(L)[None, None, :, None] % 2), T)
    _check_every_cap(T2, units, U)


def test_cap_dp_sweeps_a_medium_table():
    """24 layers, submeshes of 1, 2, 4, 8 units, 16 units, B = 4: stage counts s >= 4 are one
    state (the sweep), and the value is the loop's at every 20th cap and the extremes."""
    L, units, U, B = 24, [1, 2, 4, 8], 16, 4
    T = _layered(L, units, min(L, U), B, seed=1)
    fin = np.unique(T[np.isfinite(T)])
    dp = _check_every_cap(T, units, U, [*fin[::20], fin[-1], np.inf])
    assert dp.sweep and dp.n_s == B and dp.J < L


@pytest.mark.parametrize("B", [1, 2, 4, 8])
def test_planner_search_is_alpas_walk_on_the_loop(B):
    """inter_op_dp (CapDP values, the pruned walk) returns what Alpa's own procedure returns on
    the reference loop: the least feasible t_max by the bottleneck loop, every t_max walked in
    order until Alpa's stop, the backtracked stages at the best one; bit for bit."""
    L, units, U = 16, [1, 2, 4], 8
    T = _layered(L, units, min(L, U), B, seed=B, room=4.0)
    lb = _dp(T, units, U, np.inf, np.maximum)[0]
    vals = np.unique(T[np.isfinite(T) & (T >= lb)])
    F_inf = _dp(T, units, U, np.inf, np.add)[0]
    best, c = _scan_every(lambda cap: _dp(T, units, U, cap, np.add)[0], B, vals, F_inf, 0.0,
                          None)
    F, _, stages = _dp(T, units, U, c, np.add, backtrack=True)
    t_max = max(T[x, k, i, s - 1] for k, i, x, s in stages)
    assert _same(best, dapple(F, c, B))
    got = inter_op_dp(T, units, U, B)
    assert got == (float(dapple(F, t_max, B)), float(t_max), stages)


@pytest.mark.parametrize("model", ["tiny_gpt", "tiny_moe"])
def test_cap_dp_value_is_the_loops_on_real_tables(model):
    """The split tables Alpa-E builds on the 8-device tiny mesh, every D: every cap."""
    pr = make_problem(model, "tiny_cluster", 8, training=TrainingSettings(global_batch=8))
    mesh, checked = mesh_view(pr.cluster), 0
    for D in (1, 2, 4, 8):
        opts = _options(pr, mesh, D, pr.graph.variants)
        tables = split_tables(pr, dict(DEFAULTS), mesh, D, opts, False) if opts else None
        if tables is None:
            continue
        T, units, U, _, _ = tables
        _check_every_cap(T, units, U)
        checked += 1
    assert checked >= 2
