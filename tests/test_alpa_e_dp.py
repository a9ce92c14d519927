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
    # its caps (the walk's t_max candidates) read the stage counts up to s0 only: every
    # distinct latency of the table, sorted
    assert dp.caps.tobytes() == np.unique(T[np.isfinite(T)]).tobytes()
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


def _random_table(data, L_max=8, U_max=12):
    L = data.draw(st.integers(1, L_max))
    units = data.draw(st.sampled_from([[1], [1, 2], [2, 3], [1, 2, 4], [3], [2, 4, 8]]))
    U = data.draw(st.integers(1, U_max))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**31)))
    T = rng.uniform(0.1, 10.0, size=(len(units), L, L, L))
    if data.draw(st.booleans()):  # ties
        T = rng.integers(1, 4, size=T.shape).astype(float)
    T[rng.random(T.shape) < data.draw(st.sampled_from([0.0, 0.2, 0.5]))] = math.inf
    T[:, np.tril_indices(L, -1)[0], np.tril_indices(L, -1)[1], :] = math.inf
    return T, units, U


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_sum_floor_is_never_above_the_uncapped_sum(data):
    """CapDP.sum_floor (the DP without the unit count) is at most the least sum of stage
    latencies of any plan (the loop's value with no cap), float for float, and inf exactly where
    no stage count can add up to U with a layer per stage."""
    T, units, U = _random_table(data)
    F_inf = _dp(T, units, U, np.inf, np.add)[0]
    floor = CapDP(T, units, U).sum_floor()
    assert floor <= F_inf, (floor, F_inf)
    if math.isfinite(F_inf):
        assert math.isfinite(floor)


@settings(max_examples=80, deadline=None)
@given(st.data())
def test_the_walk_stopping_on_the_floor_is_the_walk_without_it(data):
    """inter_op_dp, whose stop tries sum_floor before pricing F_inf, returns the same T*, t_max
    and stages and spends the same DP passes as the walk that prices F_inf for every stop test
    (sum_floor at -inf), and never prices F_inf more often."""
    import baselines.alpa_e as alpa_e
    from baselines.alpa_e import Budget

    T, units, U = _random_table(data, L_max=7, U_max=10)
    B = data.draw(st.integers(1, 12))
    priced = {"floor": 0, "none": 0}
    real_value = CapDP.value

    def run(tag, floor):
        def counted(self, cap, combine=np.add):
            priced[tag] += cap == np.inf and combine is np.add
            return real_value(self, cap, combine)

        budget = Budget(10**6)
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(CapDP, "value", counted)
            if floor is not None:
                mp.setattr(CapDP, "sum_floor", floor)
            out = alpa_e.inter_op_dp(T, units, U, B, 0.0, budget)
        return out, budget.left

    assert run("floor", None) == run("none", lambda self: -math.inf)
    assert priced["floor"] <= priced["none"]


def test_the_floor_spares_the_uncapped_pass_on_a_layered_table():
    """16 micro-batches on a table whose latencies grow with their layers: the walk without the
    floor prices F_inf (the uncapped pass) for its first stop test, the walk with it decides
    that test on sum_floor (here equal to F_inf) and never prices it; the same result and the
    same DP passes."""
    from baselines.alpa_e import Budget

    L, units, U, B = 16, [1, 2, 4], 8, 16
    T = _layered(L, units, min(L, U), B, seed=0, room=4.0)
    assert CapDP(T, units, U).sum_floor() == _dp(T, units, U, np.inf, np.add)[0]
    real_value, out = CapDP.value, {}
    for tag, floor in (("floor", CapDP.sum_floor), ("none", lambda self: -math.inf)):
        calls, budget = [], Budget(10**6)

        def counted(self, cap, combine=np.add, calls=calls):
            calls.append((cap, combine is np.add))
            return real_value(self, cap, combine)

        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(CapDP, "value", counted)
            mp.setattr(CapDP, "sum_floor", floor)
            out[tag] = (inter_op_dp(T, units, U, B, 0.0, budget), budget.left,
                        (np.inf, True) in calls)
    assert out["floor"][:2] == out["none"][:2]
    assert out["none"][2] and not out["floor"][2]


@pytest.mark.parametrize("units, U", [([1, 2], 14), ([1, 2, 4], 27), ([2, 4, 8], 52)])
def test_cap_dp_windows_leave_every_value_and_backtrack_as_the_loops(units, U):
    """U close to the most units the layers can take (L max(units)): row k of the DP is priced
    only at d >= U - k max(units) (CapDP._window), which leaves most entries of the first rows
    unpriced; the value (both combines), the backtrack and the least cap equal the loop's at
    every cap, stash-like (the sweep from s = 2) and free in s."""
    L = 7
    rng = np.random.default_rng(U)
    for sweep in (True, False):
        T = rng.uniform(0.1, 10.0, size=(len(units), L, L, L))
        T[rng.random(T.shape) < 0.2] = math.inf
        T[:, np.tril_indices(L, -1)[0], np.tril_indices(L, -1)[1], :] = math.inf
        if sweep:
            T[..., 2:] = T[..., 1:2]
        dp = _check_every_cap(T, units, U)
        assert dp._window(1) > 0 and dp._window(L - 3) > 0
        assert dp.n_s == (2 if sweep else L) or dp.fallback
